//! Cluster mTLS on replication connections (`docs/peer-protocol.md` §4).
//!
//! The follower starts TLS as soon as it connects, offering the ALPN protocol that names the leader
//! shard it is for (`shardlog-peer/<shard>`) and presenting its node certificate; it accepts only a
//! leader certificate that names the leader it dialled. The shard that accepted the connection looks at
//! the ClientHello without consuming it (MSG_PEEK), reads the ALPN from a copy, and hands the socket,
//! untouched, to that shard, which runs the handshake, learns the follower's node id from its
//! certificate, and only then reads a frame: the Hello, inside TLS, which must speak for that node.
//!
//! Why the shard is chosen before the handshake: a TLS session lives in the memory of the thread that
//! ran it and cannot move to another shard with the descriptor; a socket nobody has read from can.

use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use futures_rustls::{TlsAcceptor, TlsConnector, client, server};
use glommio::net::TcpStream;
use shardlog_net::peer::calls::CALLS_ALPN;
use shardlog_net::peer::replication::shard_of_alpn;

use super::{PEER_TIMEOUT, within};
use crate::quorum::state::NodeId;
use crate::security::cluster_tls::{ClusterTls, server_name};

/// A TLS record's header: content type, version, length.
const RECORD_HEADER_BYTES: usize = 5;
/// The largest TLS record: 2^14 bytes of content plus what encryption may add.
const RECORD_MAX_BYTES: usize = RECORD_HEADER_BYTES + (1 << 14) + 2048;
/// The content type of a handshake record, a ClientHello's.
const HANDSHAKE_RECORD: u8 = 0x16;
/// How long the accepting shard waits for the whole first record.
const CLIENT_HELLO_WAIT: Duration = Duration::from_secs(2);

/// Whether a connection's first bytes may be a TLS handshake record.
pub(in crate::runtime) fn is_tls_record(first: &[u8]) -> bool {
    first.first() == Some(&HANDSHAKE_RECORD)
}

/// The peer service a TLS ClientHello's ALPN asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::runtime) enum PeerService {
    /// A follower's replication connection, for this leader shard.
    Replication { shard: u16 },
    /// Peer calls (`docs/peer-protocol.md` §2.3), served by the shard that accepted the connection.
    Calls,
}

/// The peer service a ClientHello asks for, looked at on the socket without consuming it. `None` for a
/// ClientHello that is not a peer's (a Kafka client on a TLS listener), one that does not arrive whole
/// within [`CLIENT_HELLO_WAIT`], or a record that is not a ClientHello: the connection then goes on as it
/// came, its bytes unread.
pub(in crate::runtime) async fn peek_peer_service(fd: RawFd) -> Option<PeerService> {
    let mut buf = vec![0u8; RECORD_MAX_BYTES];
    let deadline = Instant::now() + CLIENT_HELLO_WAIT;
    loop {
        // SAFETY: `fd` is the open socket of the stream the caller holds; MSG_PEEK leaves the bytes queued
        // and the buffer is `buf.len()` bytes long.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_PEEK | libc::MSG_DONTWAIT) };
        if n == 0 {
            return None;
        }
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::WouldBlock {
            return None;
        }
        if n >= RECORD_HEADER_BYTES as isize {
            let record = RECORD_HEADER_BYTES + u16::from_be_bytes([buf[3], buf[4]]) as usize;
            if record > RECORD_MAX_BYTES {
                return None;
            }
            if n as usize >= record {
                return service_of_client_hello(&buf[..record]);
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        glommio::timer::sleep(Duration::from_millis(2)).await;
    }
}

/// The peer service named by the ALPN of the ClientHello in `record` (a copy: nothing is consumed).
fn service_of_client_hello(record: &[u8]) -> Option<PeerService> {
    let mut acceptor = rustls::server::Acceptor::default();
    acceptor.read_tls(&mut &record[..]).ok()?;
    let accepted = acceptor.accept().ok()??;
    let hello = accepted.client_hello();
    hello.alpn()?.find_map(|protocol| match protocol {
        CALLS_ALPN => Some(PeerService::Calls),
        other => shard_of_alpn(other).map(|shard| PeerService::Replication { shard }),
    })
}

/// The dialler's side: TLS to broker `node`, which must prove it is `node`, offering `alpn`.
pub(in crate::runtime) async fn connect(
    tls: &ClusterTls,
    stream: TcpStream,
    node: NodeId,
    alpn: Vec<u8>,
) -> std::io::Result<client::TlsStream<TcpStream>> {
    let connector = TlsConnector::from(tls.client_config(Some(alpn)));
    connector.connect(server_name(node.0 as u64), stream).await
}

/// The acceptor's side of a `service`'s connection ("replication", "calls"): the handshake, and the node
/// the caller's certificate names. A caller without a certificate of the cluster's authority, or one that
/// names no node, is refused and logged.
pub(in crate::runtime) async fn accept(
    tls: &ClusterTls,
    stream: TcpStream,
    peer: &str,
    service: &'static str,
) -> Option<(server::TlsStream<TcpStream>, NodeId)> {
    let acceptor = TlsAcceptor::from(tls.server_config());
    let stream = match within(PEER_TIMEOUT, acceptor.accept(stream)).await {
        Some(Ok(stream)) => stream,
        Some(Err(error)) if !ClusterTls::is_refusal(&error) => {
            tracing::debug!(%peer, %error, "{service} connection lost in the TLS handshake");
            return None;
        }
        Some(Err(error)) => {
            crate::metrics::peer_refused(service, "handshake");
            tracing::warn!(%peer, %error, "refused a {service} connection: no valid node certificate");
            return None;
        }
        None => {
            crate::metrics::peer_refused(service, "handshake");
            tracing::warn!(%peer, "refused a {service} connection: no TLS handshake in time");
            return None;
        }
    };
    match ClusterTls::peer_node(stream.get_ref().1.peer_certificates()) {
        Ok(node) => Some((stream, NodeId(node))),
        Err(error) => {
            crate::metrics::peer_refused(service, "certificate");
            tracing::warn!(%peer, %error, "refused a {service} connection: its certificate names no node");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use shardlog_net::peer::replication::peer_alpn;

    use super::*;

    /// The first record a client with these ALPN protocols sends.
    fn client_hello(alpn: &[&[u8]]) -> Vec<u8> {
        let provider = crate::security::tls::provider();
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(rustls::RootCertStore::empty())
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let mut connection = rustls::ClientConnection::new(Arc::new(config), server_name(2)).unwrap();
        let mut bytes = Vec::new();
        connection.write_tls(&mut bytes).unwrap();
        bytes
    }

    #[test]
    fn a_followers_client_hello_names_the_leader_shard_a_callers_the_calls_and_a_kafka_clients_nothing() {
        let replication = |shard| Some(PeerService::Replication { shard });
        assert_eq!(service_of_client_hello(&client_hello(&[&peer_alpn(3)])), replication(3));
        assert_eq!(service_of_client_hello(&client_hello(&[b"h2", &peer_alpn(0)])), replication(0));
        assert_eq!(service_of_client_hello(&client_hello(&[CALLS_ALPN])), Some(PeerService::Calls));
        assert_eq!(service_of_client_hello(&client_hello(&[b"shardlog-calls/2"])), None, "another calls version");
        assert_eq!(service_of_client_hello(&client_hello(&[])), None, "no ALPN: a Kafka client");
        assert_eq!(service_of_client_hello(&client_hello(&[b"h2"])), None);
        let hello = client_hello(&[&peer_alpn(1)]);
        assert!(is_tls_record(&hello));
        assert_eq!(service_of_client_hello(&hello[..hello.len() - 1]), None, "a record cut short");
        assert_eq!(service_of_client_hello(b"\x16\x03\x01\x00\x04abcd"), None, "not a ClientHello");
    }
}
