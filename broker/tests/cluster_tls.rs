//! Cluster mTLS against the real binary (`docs/peer-protocol.md` §4): a broker whose replication and
//! quorum ports require node certificates refuses a plain peer frame, a TLS peer without a certificate,
//! one with a certificate of another authority, and one whose valid certificate is another node's and
//! asks in someone else's name. Each is refused with a WARN line that says why, nothing it sent is
//! applied, and the broker goes on serving. A certified node may read the quorum's status.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ResponseKind};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{ClientConfig, ClientConnection, DigitallySignedStruct, SignatureScheme, StreamOwned};
use shardlog_broker::config::ClusterTlsSettings;
use shardlog_broker::quorum::network::WireWrite;
use shardlog_broker::quorum::state::{Command, NodeId};
use shardlog_broker::quorum::wire::{WireStatus, WireVote, WireVoteRequest, kind as quorum_kind};
use shardlog_broker::security::cluster_tls::{ClusterTls, server_name};
use shardlog_net::peer::calls::{CALLS_ALPN, CallsHello};
use shardlog_net::peer::replication::{ReplicaHello, kind, peer_alpn};
use shardlog_net::peer::{PeerFrame, PeerFrameReader, decode_message, encode_frame, encode_message};

use common::Broker;
use common::pki::{Issued, Pki};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Broker 1, its own one-voter quorum with a quorum port, cluster mTLS on; the cluster's authority.
struct Secured {
    broker: Broker,
    quorum: u16,
    /// The metrics endpoint's port.
    metrics: u16,
    cluster: Pki,
    dir: tempfile::TempDir,
}

fn start_secured() -> Secured {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Pki::new(dir.path(), "cluster");
    let node = cluster.node("node-1", 1);
    let (quorum, metrics) = (free_port(), free_port());
    let voters = format!("1@127.0.0.1:{quorum}");
    let metrics_listen = format!("metrics.listen=\"127.0.0.1:{metrics}\"");
    let keystore = format!("cluster.ssl.keystore.location={}", node.keystore.display());
    let truststore = format!("cluster.ssl.truststore.location={}", cluster.ca.display());
    let args = [
        "--node-id",
        "1",
        "--quorum-voters",
        &voters,
        "--set",
        &keystore,
        "--set",
        &truststore,
        "--set",
        &metrics_listen,
    ];
    let broker = Broker::start_with(1, &args);
    Secured { broker, quorum, metrics, cluster, dir }
}

/// How a test process dials the broker as node `node`, with `issued` (of any authority), trusting the
/// cluster's authority.
fn as_node(secured: &Secured, issued: &Issued, node: u32) -> ClusterTls {
    let settings =
        ClusterTlsSettings { keystore: Some(issued.keystore.clone()), truststore: Some(secured.cluster.ca.clone()) };
    Arc::into_inner(ClusterTls::load(&settings, node).unwrap().unwrap()).unwrap()
}

/// A TLS connection to 127.0.0.1:`port` as broker 1's dialler would open it.
fn dial(config: Arc<ClientConfig>, port: u16) -> StreamOwned<ClientConnection, TcpStream> {
    let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    StreamOwned::new(ClientConnection::new(config, server_name(1)).unwrap(), tcp)
}

/// Sends `bytes` and returns the frame that answers it, or `None` once the broker has closed the
/// connection (or failed the handshake) instead.
fn exchange(
    stream: &mut impl Read,
    bytes: &[u8],
    write: impl FnOnce(&[u8]) -> std::io::Result<()>,
) -> Option<PeerFrame> {
    if write(bytes).is_err() {
        return None;
    }
    let mut reader = PeerFrameReader::new(64 << 20);
    let mut buf = [0u8; 4096];
    loop {
        if let Some(frame) = reader.next_frame().expect("a well-formed frame") {
            return Some(frame);
        }
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return None,
            Ok(n) => reader.extend(&buf[..n]),
        }
    }
}

fn tls_exchange(stream: &mut StreamOwned<ClientConnection, TcpStream>, bytes: &[u8]) -> Option<PeerFrame> {
    let sent = stream.write_all(bytes).and_then(|_| stream.flush());
    if sent.is_err() {
        return None;
    }
    exchange(stream, &[], |_| Ok(()))
}

fn plain_exchange(port: u16, bytes: &[u8]) -> Option<PeerFrame> {
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut writer = tcp.try_clone().unwrap();
    exchange(&mut tcp, bytes, |b| writer.write_all(b))
}

/// Waits (up to 20 s) until the broker has logged `count` WARN lines that contain `text`.
fn wait_for_warnings(broker: &Broker, text: &str, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let log = broker.log();
        let seen = log.lines().filter(|l| l.contains("WARN") && l.contains(text)).count();
        if seen >= count {
            assert_eq!(seen, count, "one line per refusal of {text:?}:\n{log}");
            return;
        }
        assert!(Instant::now() < deadline, "no WARN line {text:?} (wanted {count}):\n{log}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `shardlog_peer_refused_total{service, reason}` as the metrics endpoint on `port` shows it (0 if absent).
fn refused_total(port: u16, service: &str, reason: &str) -> f64 {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (service, reason) = (format!("service=\"{service}\""), format!("reason=\"{reason}\""));
    answer
        .lines()
        .filter(|l| l.starts_with("shardlog_peer_refused_total{") && l.contains(&service) && l.contains(&reason))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum()
}

fn hello(broker: u32) -> Vec<u8> {
    let hello = ReplicaHello { cluster_id: "shardlog-1".into(), broker, from_shard: 0, to_shard: 0 };
    encode_frame(kind::HELLO, &encode_message(&hello))
}

/// A dialler that checks nothing and shows no certificate: a process without a node certificate.
#[derive(Debug)]
struct Anything;

impl ServerCertVerifier for Anything {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &CertificateDer<'_>,
        _: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        #[allow(deprecated)]
        rustls::crypto::ring::default_provider().signature_verification_algorithms.supported_schemes()
    }
}

fn without_certificate(alpn: Option<Vec<u8>>) -> Arc<ClientConfig> {
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(Anything))
        .with_no_client_auth();
    config.alpn_protocols = alpn.into_iter().collect();
    Arc::new(config)
}

/// The broker still serves Kafka clients.
fn answers_kafka(broker: &Broker) {
    let mut client = broker.connect();
    common::send(&mut client, ApiKey::ApiVersions, 0, 7, &ApiVersionsRequest::default());
    let (correlation, answer) = common::receive(&mut client, ApiKey::ApiVersions, 0);
    assert_eq!(correlation, 7);
    assert!(matches!(answer, ResponseKind::ApiVersions(a) if a.error_code == 0));
}

#[test]
fn the_replication_port_refuses_peers_without_a_node_certificate_or_speaking_for_another_broker() {
    let secured = start_secured();
    let port = secured.broker.port;
    let stranger = Pki::new(secured.dir.path(), "stranger");

    // A process without any certificate, speaking the plain peer protocol.
    assert!(plain_exchange(port, &hello(2)).is_none(), "a plain Hello is not answered");
    wait_for_warnings(&secured.broker, "refused a replication connection: plain TCP", 1);

    // TLS, as a follower's, but without a certificate.
    let mut anonymous = dial(without_certificate(Some(peer_alpn(0))), port);
    assert!(tls_exchange(&mut anonymous, &hello(2)).is_none(), "no certificate: no answer");
    wait_for_warnings(&secured.broker, "refused a replication connection: no valid node certificate", 1);

    // A certificate that names node 2, of another authority.
    let forged = as_node(&secured, &stranger.node("forged-2", 2), 2);
    let mut stream = dial(forged.client_config(Some(peer_alpn(0))), port);
    assert!(tls_exchange(&mut stream, &hello(2)).is_none(), "another authority's certificate: no answer");
    wait_for_warnings(&secured.broker, "refused a replication connection: no valid node certificate", 2);

    // Node 2's valid certificate, with a Hello in broker 1's name.
    let node_2 = as_node(&secured, &secured.cluster.node("node-2", 2), 2);
    let mut stream = dial(node_2.client_config(Some(peer_alpn(0))), port);
    assert!(tls_exchange(&mut stream, &hello(1)).is_none(), "a Hello in another's name: no answer");
    wait_for_warnings(&secured.broker, "its Hello speaks for another broker than its certificate names", 1);

    // Node 2's valid certificate in its own name, but node 2 is no registered broker.
    let mut stream = dial(node_2.client_config(Some(peer_alpn(0))), port);
    assert!(tls_exchange(&mut stream, &hello(2)).is_none(), "an unknown broker: no answer");
    wait_for_warnings(&secured.broker, "refused a replication connection: not a broker of this cluster", 1);

    let counted = |reason| refused_total(secured.metrics, "replication", reason);
    assert_eq!((counted("plaintext"), counted("handshake"), counted("forbidden")), (1.0, 2.0, 2.0));
    answers_kafka(&secured.broker);
    let (status, log) = secured.broker.terminate_with_log();
    assert!(status.success(), "{log}");
}

fn calls_hello(broker: u32) -> Vec<u8> {
    let hello = CallsHello { cluster_id: "shardlog-1".into(), broker };
    encode_frame(shardlog_net::peer::calls::kind::HELLO, &encode_message(&hello))
}

/// Peer calls (`docs/peer-protocol.md` §2.3) reach the same listener, told apart by their ALPN under
/// cluster mTLS, and are checked as replication is: a plain Hello, a caller without a certificate, a Hello
/// in another node's name and one from a broker that is not registered are refused, logged and counted.
#[test]
fn peer_calls_are_told_apart_by_their_alpn_and_refused_like_replication_without_a_proven_broker() {
    let secured = start_secured();
    let port = secured.broker.port;
    assert!(plain_exchange(port, &calls_hello(2)).is_none(), "a plain Hello is not answered");
    wait_for_warnings(&secured.broker, "refused a peer-calls connection: plain TCP", 1);

    let mut anonymous = dial(without_certificate(Some(CALLS_ALPN.to_vec())), port);
    assert!(tls_exchange(&mut anonymous, &calls_hello(2)).is_none(), "no certificate: no answer");
    wait_for_warnings(&secured.broker, "refused a peer-calls connection: no valid node certificate", 1);

    let node_2 = as_node(&secured, &secured.cluster.node("node-2", 2), 2);
    let mut stream = dial(node_2.client_config(Some(CALLS_ALPN.to_vec())), port);
    assert!(tls_exchange(&mut stream, &calls_hello(1)).is_none(), "a Hello in another's name: no answer");
    wait_for_warnings(&secured.broker, "closing peer-calls connection: its Hello speaks for another broker", 1);

    let mut stream = dial(node_2.client_config(Some(CALLS_ALPN.to_vec())), port);
    assert!(tls_exchange(&mut stream, &calls_hello(2)).is_none(), "an unknown broker: no answer");
    wait_for_warnings(&secured.broker, "closing peer-calls connection: not a broker of this cluster", 1);

    let counted = |reason| refused_total(secured.metrics, "peer-calls", reason);
    assert_eq!((counted("plaintext"), counted("handshake"), counted("forbidden")), (1.0, 1.0, 2.0));
    assert_eq!(refused_total(secured.metrics, "replication", "plaintext"), 0.0, "not taken for replication");
    answers_kafka(&secured.broker);
    let (status, log) = secured.broker.terminate_with_log();
    assert!(status.success(), "{log}");
}

/// A stranger knocking again and again is refused and counted every time, but the log's repeat limit
/// holds its WARN lines to a burst of ten per five seconds and says how many it left out: a stranger
/// cannot fill the log.
#[test]
fn a_stranger_knocking_again_and_again_is_counted_every_time_but_cannot_flood_the_log() {
    use shardlog_broker::logging::{REPEAT_BURST, REPEAT_WINDOW};
    let secured = start_secured();
    let began = Instant::now();
    for _ in 0..40 {
        assert!(plain_exchange(secured.broker.port, &hello(2)).is_none(), "a plain Hello is not answered");
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while refused_total(secured.metrics, "replication", "plaintext") < 40.0 {
        assert!(Instant::now() < deadline, "every refusal is counted");
        std::thread::sleep(Duration::from_millis(50));
    }
    let windows = began.elapsed().as_secs() / REPEAT_WINDOW.as_secs() + 1;
    let log = secured.broker.log();
    let lines = log.lines().filter(|l| l.contains("refused a replication connection: plain TCP")).count() as u64;
    assert!(lines >= u64::from(REPEAT_BURST), "the first ten are all logged:\n{log}");
    assert!(lines <= u64::from(REPEAT_BURST) * windows, "{lines} lines in {windows} windows:\n{log}");
    if lines < 40 {
        // What was left out is said, once its window is over.
        let deadline = Instant::now() + REPEAT_WINDOW + Duration::from_secs(5);
        while !secured.broker.log().contains("more lines from the same place were not logged") {
            assert!(Instant::now() < deadline, "the lines left out are reported:\n{}", secured.broker.log());
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    answers_kafka(&secured.broker);
}

/// Node certificates are renewed without a restart: after the broker's truststore gains a new authority and
/// its keystore a certificate of it, a node certified by the new authority gets past the handshake (it
/// was refused before), and the broker shows its renewed certificate. A changed keystore that names
/// another node is refused with a WARN line, and the renewed certificate stays in force.
#[test]
fn a_renewed_node_certificate_and_a_new_authority_are_taken_without_a_restart() {
    let secured = start_secured();
    let port = secured.broker.port;
    let renewed = Pki::new(secured.dir.path(), "renewed");
    let both = secured.dir.path().join("both-authorities.pem");
    let old_authority = std::fs::read_to_string(&secured.cluster.ca).unwrap();
    std::fs::write(&both, old_authority + &std::fs::read_to_string(&renewed.ca).unwrap()).unwrap();
    let node_2 = renewed.node("node-2-renewed", 2);
    let settings = ClusterTlsSettings { keystore: Some(node_2.keystore.clone()), truststore: Some(both.clone()) };
    let node_2 = Arc::into_inner(ClusterTls::load(&settings, 2).unwrap().unwrap()).unwrap();

    let mut stream = dial(node_2.client_config(Some(peer_alpn(0))), port);
    assert!(tls_exchange(&mut stream, &hello(2)).is_none(), "the new authority is not trusted yet");
    wait_for_warnings(&secured.broker, "refused a replication connection: no valid node certificate", 1);

    // The operator's rotation: the truststore gets both authorities, the keystore node 1's renewed one.
    let node_1 = renewed.node("node-1-renewed", 1);
    let keystore = secured.dir.path().join("node-1.pem");
    std::fs::copy(&both, &secured.cluster.ca).unwrap();
    std::fs::copy(&node_1.keystore, &keystore).unwrap();
    wait_for_log(&secured.broker, "cluster mTLS files read again");

    let mut stream = dial(node_2.client_config(Some(peer_alpn(0))), port);
    assert!(tls_exchange(&mut stream, &hello(2)).is_none(), "node 2 is no broker of this cluster");
    // Past the handshake now: refused for what its Hello says, not for its certificate.
    wait_for_warnings(&secured.broker, "refused a replication connection: not a broker of this cluster", 1);
    let shown =
        |stream: &StreamOwned<ClientConnection, TcpStream>| stream.conn.peer_certificates().unwrap()[0].to_vec();
    assert_eq!(shown(&stream), node_1.der, "the broker shows its renewed certificate");

    // A keystore of another node is not taken.
    std::fs::copy(&renewed.node("node-3", 3).keystore, &keystore).unwrap();
    wait_for_warnings(&secured.broker, "changed cluster mTLS files cannot be used", 1);
    let mut stream = dial(node_2.client_config(Some(peer_alpn(0))), port);
    assert!(tls_exchange(&mut stream, &hello(2)).is_none());
    assert_eq!(shown(&stream), node_1.der, "the renewed certificate stays in force");
    answers_kafka(&secured.broker);
}

/// Waits (up to 20 s) until the broker has logged a line that contains `text`.
fn wait_for_log(broker: &Broker, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !broker.log().contains(text) {
        assert!(Instant::now() < deadline, "no line {text:?}:\n{}", broker.log());
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn status_request() -> Vec<u8> {
    encode_frame(quorum_kind::STATUS, &[])
}

#[test]
fn the_quorum_port_refuses_strangers_and_requests_in_another_nodes_name_and_answers_a_certified_node() {
    let secured = start_secured();
    let port = secured.quorum;

    // Plain TCP: the bytes are no TLS handshake.
    assert!(plain_exchange(port, &status_request()).is_none(), "a plain request is not answered");
    wait_for_warnings(&secured.broker, "quorum port: refused a connection: no valid node certificate", 1);

    // TLS without a certificate.
    let mut anonymous = dial(without_certificate(None), port);
    assert!(tls_exchange(&mut anonymous, &status_request()).is_none(), "no certificate: no answer");
    wait_for_warnings(&secured.broker, "quorum port: refused a connection: no valid node certificate", 2);

    // Node 2, which is not a voter, asking for votes; then writing a heartbeat in broker 1's name.
    let node_2 = as_node(&secured, &secured.cluster.node("node-2", 2), 2);
    let vote = WireVoteRequest { vote: WireVote { term: 1_000, node: 2, committed: false }, last_log_id: None };
    let mut stream = dial(node_2.client_config(None), port);
    let answer = tls_exchange(&mut stream, &encode_frame(quorum_kind::VOTE, &encode_message(&vote)));
    assert!(answer.is_none(), "a vote from a node that is not a voter: no answer");
    wait_for_warnings(&secured.broker, "Vote from node 2, which is not a voter", 1);
    let heartbeat = Command::BrokerHeartbeat { id: NodeId(1), incarnation: 1, now_ms: 0 };
    let write = WireWrite { command: heartbeat, forwarded: false };
    let mut stream = dial(node_2.client_config(None), port);
    let answer = tls_exchange(&mut stream, &encode_frame(quorum_kind::WRITE, &encode_message(&write)));
    assert!(answer.is_none(), "a heartbeat in broker 1's name: no answer");
    wait_for_warnings(&secured.broker, "a command in the name of broker 1 from node 2", 1);

    // Node 2 may read what the voter holds.
    let mut stream = dial(node_2.client_config(None), port);
    let answer = tls_exchange(&mut stream, &status_request()).expect("a certified node's Status is answered");
    assert_eq!(answer.kind, quorum_kind::STATUS_RESULT);
    let status: WireStatus = decode_message(&answer.body).unwrap();
    assert_eq!(status.leader, Some(1), "voter 1 still leads");
    let counted = |reason| refused_total(secured.metrics, "quorum", reason);
    assert_eq!((counted("handshake"), counted("forbidden")), (2.0, 2.0));

    answers_kafka(&secured.broker);
    let (status, log) = secured.broker.terminate_with_log();
    assert!(status.success(), "{log}");
}

#[test]
fn a_broker_with_cluster_mtls_starts_and_stops_without_a_warning() {
    let secured = start_secured();
    answers_kafka(&secured.broker);
    let (status, log) = secured.broker.terminate_with_log();
    assert!(status.success(), "{log}");
    let loud: Vec<&str> = log.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
    assert!(loud.is_empty(), "no WARN or ERROR line: {loud:#?}");
}

/// A Kafka client's TLS connection to 127.0.0.1:`port`, trusting `ca`.
fn kafka_tls_client(port: u16, ca: &std::path::Path) -> StreamOwned<ClientConnection, TcpStream> {
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connection = ClientConnection::new(Arc::new(config), ServerName::try_from("127.0.0.1").unwrap()).unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", port)).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    StreamOwned::new(connection, tcp)
}

#[test]
fn on_a_tls_inter_broker_listener_kafka_clients_are_served_and_followers_are_told_apart_by_their_client_hello() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Pki::new(dir.path(), "cluster");
    let clients = Pki::new(dir.path(), "clients");
    let listener = clients.server("listener", "broker-1");
    let node = cluster.node("node-1", 1);
    let (plain, ssl) = (free_port(), free_port());
    // The SSL listener comes first: it is the inter-broker listener, which followers dial.
    let listeners = format!("listeners=SSL://127.0.0.1:{ssl},PLAINTEXT://127.0.0.1:{plain}");
    let ssl_keystore = format!("ssl.keystore.location={}", listener.keystore.display());
    let keystore = format!("cluster.ssl.keystore.location={}", node.keystore.display());
    let truststore = format!("cluster.ssl.truststore.location={}", cluster.ca.display());
    let args =
        ["--node-id", "1", "--set", &listeners, "--set", &ssl_keystore, "--set", &keystore, "--set", &truststore];
    let broker = Broker::start_at(dir.path().join("data").as_path(), plain, 1, &args, None);

    // A Kafka client over TLS on the inter-broker listener: its ClientHello names no peer protocol.
    let mut client = kafka_tls_client(ssl, &clients.ca);
    let request = shardlog_net::kafka::encode_request(
        ApiKey::ApiVersions,
        0,
        7,
        "cluster-tls-test",
        &ApiVersionsRequest::default(),
    )
    .unwrap();
    client.write_all(&request).unwrap();
    client.flush().unwrap();
    let mut size = [0u8; 4];
    client.read_exact(&mut size).expect("the Kafka client is answered over TLS");
    let mut frame = vec![0u8; u32::from_be_bytes(size) as usize];
    client.read_exact(&mut frame).unwrap();
    let (correlation, answer) =
        shardlog_net::kafka::decode_response(bytes::Bytes::from(frame), ApiKey::ApiVersions, 0).unwrap();
    assert_eq!(correlation, 7);
    assert!(matches!(answer, ResponseKind::ApiVersions(a) if a.error_code == 0));

    // A follower's ClientHello on the same port goes the replication way: node 2 proves itself, and is
    // refused as no broker of this cluster (the Kafka way, the listener's certificate, would not name node 1).
    let dialler = Secured { broker, quorum: 0, metrics: 0, cluster, dir };
    let node_2 = as_node(&dialler, &dialler.cluster.node("node-2", 2), 2);
    let mut stream = dial(node_2.client_config(Some(peer_alpn(0))), ssl);
    assert!(tls_exchange(&mut stream, &hello(2)).is_none(), "an unknown broker: no answer");
    wait_for_warnings(&dialler.broker, "refused a replication connection: not a broker of this cluster", 1);

    let (status, log) = dialler.broker.terminate_with_log();
    assert!(status.success(), "{log}");
}

/// Standalone voters (`shardlog quorum` with the cluster mTLS flags) elect a leader among themselves over
/// mTLS, and a broker that is no voter registers through them as a remote client of the quorum port;
/// nobody is refused.
#[test]
fn standalone_voters_over_cluster_mtls_elect_a_leader_and_a_certified_broker_registers_through_them() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Pki::new(dir.path(), "cluster");
    for id in 1..=4 {
        cluster.node(&format!("node-{id}"), id);
    }
    let keystore = dir.path().join("node-{id}.pem").display().to_string();
    let ca = cluster.ca.display().to_string();
    let flags = ["--cluster-ssl-keystore-location", &keystore, "--cluster-ssl-truststore-location", &ca];
    let voters = common::voters::Voters::start(3, &flags);
    let list: Vec<String> = voters.addrs.iter().enumerate().map(|(i, a)| format!("{}@{a}", i + 1)).collect();
    let list = list.join(",");
    let node_4 = format!("cluster.ssl.keystore.location={}", dir.path().join("node-4.pem").display());
    let truststore = format!("cluster.ssl.truststore.location={ca}");
    let args = ["--node-id", "4", "--quorum-voters", &list, "--set", &node_4, "--set", &truststore];
    let broker = Broker::start_with(1, &args);

    // A topic is created: the broker registered (through a voter over mTLS, forwarded to the leader) and
    // its CreateTopics was committed the same way; Metadata then shows broker 4 leading the partition.
    let addr = format!("127.0.0.1:{}", broker.port);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let created = shardlog_broker::client::KafkaClient::connect(&addr)
            .and_then(|mut client| client.create_topic("over-mtls", 1, 1, &[]).map(|_| client))
            .and_then(|mut client| client.metadata(Some(&["over-mtls"])));
        let leader = created.as_ref().ok().and_then(|m| m.topics.first()?.partitions.first().map(|p| p.leader_id.0));
        if leader == Some(4) {
            break;
        }
        assert!(Instant::now() < deadline, "no topic led by broker 4: {created:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (status, log) = broker.terminate_with_log();
    assert!(status.success(), "{log}");
    let loud: Vec<&str> = log.lines().filter(|l| l.contains("WARN") || l.contains("ERROR")).collect();
    assert!(loud.is_empty(), "broker 4: no WARN or ERROR line: {loud:#?}");
    for id in 1..=3 {
        let log = voters.log(id);
        let refused: Vec<&str> = log.lines().filter(|l| l.contains("refused")).collect();
        assert!(refused.is_empty(), "voter {id} refused nobody: {refused:#?}");
    }
}

/// Runs `shardlog` with `args` until it exits (within 30 s): its status and what it logged.
fn run_shardlog(args: &[&str]) -> (std::process::ExitStatus, String) {
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("shardlog {args:?} kept running");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let output = child.wait_with_output().unwrap();
    (output.status, String::from_utf8_lossy(&output.stderr).into_owned())
}

#[test]
fn a_node_with_half_the_cluster_mtls_files_or_another_nodes_certificate_does_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Pki::new(dir.path(), "cluster");
    let node_2 = cluster.node("node-2", 2);
    let data = dir.path().join("data").display().to_string();
    let port = format!("127.0.0.1:{}", free_port());
    let keystore = format!("cluster.ssl.keystore.location={}", node_2.keystore.display());
    let truststore = format!("cluster.ssl.truststore.location={}", cluster.ca.display());
    let start = ["start", "--node-id", "2", "--data-dir", &data, "--listen", &port, "--metrics-listen", "127.0.0.1:0"];

    let (status, log) = run_shardlog(&[&start[..], &["--set", &keystore]].concat());
    assert!(!status.success());
    assert!(log.contains("only cluster.ssl.keystore.location is set"), "{log}");

    let another =
        ["start", "--node-id", "3", "--data-dir", &data, "--listen", &port, "--metrics-listen", "127.0.0.1:0"];
    let (status, log) = run_shardlog(&[&another[..], &["--set", &keystore, "--set", &truststore]].concat());
    assert!(!status.success());
    assert!(log.contains("node 2's, not node 3's"), "{log}");

    let keystore_flag = node_2.keystore.display().to_string();
    let ca = cluster.ca.display().to_string();
    let quorum = ["quorum", "--node-id", "1", "--data-dir", &data, "--listen", &port];
    let flags = ["--cluster-ssl-keystore-location", &keystore_flag, "--cluster-ssl-truststore-location", &ca];
    let (status, log) = run_shardlog(&[&quorum[..], &flags[..]].concat());
    assert!(!status.success());
    assert!(log.contains("node 2's, not node 1's"), "shardlog quorum checks its certificate too: {log}");
}

/// Three registered brokers: broker 3's valid certificate cannot fetch as broker 2, while broker 2's own
/// certificate gets its Hello answered.
#[test]
fn a_registered_brokers_certificate_replicates_as_that_broker_and_never_as_another() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Pki::new(dir.path(), "cluster");
    let quorum = free_port();
    let voters = format!("1@127.0.0.1:{quorum}");
    let truststore = format!("cluster.ssl.truststore.location={}", cluster.ca.display());
    let brokers: Vec<Broker> = (1..=3)
        .map(|id| {
            let node = cluster.node(&format!("node-{id}"), id);
            let keystore = format!("cluster.ssl.keystore.location={}", node.keystore.display());
            let id = id.to_string();
            Broker::start_with(
                1,
                &["--node-id", &id, "--quorum-voters", &voters, "--set", &keystore, "--set", &truststore],
            )
        })
        .collect();
    let addr = format!("127.0.0.1:{}", brokers[0].port);
    let deadline = Instant::now() + Duration::from_secs(60);
    while shardlog_broker::client::KafkaClient::connect(&addr)
        .and_then(|mut c| c.metadata(None))
        .map_or(0, |m| m.brokers.len())
        < 3
    {
        assert!(Instant::now() < deadline, "three brokers registered");
        std::thread::sleep(Duration::from_millis(100));
    }
    let secured = Secured { broker: brokers.into_iter().next().unwrap(), quorum, metrics: 0, cluster, dir };
    let certificate = |id| as_node(&secured, &secured.cluster.node(&format!("again-{id}"), id), id);

    let mut stream = dial(certificate(3).client_config(Some(peer_alpn(0))), secured.broker.port);
    assert!(tls_exchange(&mut stream, &hello(2)).is_none(), "broker 3 as broker 2: no answer");
    wait_for_warnings(&secured.broker, "its Hello speaks for another broker than its certificate names", 1);

    let mut stream = dial(certificate(2).client_config(Some(peer_alpn(0))), secured.broker.port);
    let answer = tls_exchange(&mut stream, &hello(2)).expect("broker 2 as itself is answered");
    assert_eq!(answer.kind, kind::HELLO_ANSWER);
}
