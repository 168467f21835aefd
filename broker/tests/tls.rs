//! TLS listeners against the real binary: librdkafka (the rdkafka crate) producing and consuming over
//! SSL and over mutual TLS, Metadata answering with the addresses of the listener a client came
//! through, bad handshakes answered by a closed connection without harm to other clients, and
//! certificates replaced while clients stay connected.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, MetadataRequest, ResponseKind};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls_pki_types::pem::PemObject;
use shardlog_net::kafka::{decode_response, encode_request};
use shardlog_net::peer::replication::{ReplicaHello, kind};
use shardlog_net::peer::{encode_frame, encode_message};

use common::Broker;
use common::pki::{Issued, Pki};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A broker with a PLAINTEXT listener (the test harness's), an SSL listener and a mutual-TLS one.
struct Secured {
    broker: Broker,
    ssl: u16,
    mtls: u16,
    pki: Pki,
    server: Issued,
    dir: tempfile::TempDir,
}

fn start_secured(extra: &[&str]) -> Secured {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "clients");
    let server = pki.server("broker", "broker-1");
    let (plain, ssl, mtls) = (free_port(), free_port(), free_port());
    let listeners = format!("listeners=PLAINTEXT://127.0.0.1:{plain},SSL://127.0.0.1:{ssl},MTLS://127.0.0.1:{mtls}");
    let keystore = format!("ssl.keystore.location={}", server.keystore.display());
    let truststore = format!("listener.name.mtls.ssl.truststore.location={}", pki.ca.display());
    let mut args = vec![
        "--set",
        &listeners,
        "--set",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL",
        "--set",
        &keystore,
        "--set",
        "listener.name.mtls.ssl.client.auth=required",
        "--set",
        &truststore,
        "--set",
        "ssl.principal.mapping.rules=RULE:^CN=([^,]*),O=Apps$/$1/L",
    ];
    args.extend_from_slice(extra);
    let broker = Broker::start_at(dir.path().join("data").as_path(), plain, 1, &args, None);
    Secured { broker, ssl, mtls, pki, server, dir }
}

fn rdkafka_ssl(port: u16, ca: &std::path::Path) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", format!("127.0.0.1:{port}"))
        .set("security.protocol", "ssl")
        .set("ssl.ca.location", ca.to_str().unwrap())
        .set("message.timeout.ms", "20000");
    config
}

/// Produces `count` records to `topic` with acks=all and consumes them back, both over `config`.
fn produce_and_consume(config: &ClientConfig, topic: &str, count: usize) {
    let producer: ThreadedProducer<DefaultProducerContext> =
        config.clone().set("acks", "all").set("enable.idempotence", "true").create().unwrap();
    for i in 0..count {
        let value = format!("record-{i}");
        producer.send(BaseRecord::<(), str>::to(topic).payload(&value)).map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    let consumer: BaseConsumer = config
        .clone()
        .set("group.id", format!("{topic}-readers"))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < count && Instant::now() < deadline {
        if let Some(message) = consumer.poll(Duration::from_millis(500)) {
            let message = message.unwrap();
            seen.push(String::from_utf8(message.payload().unwrap().to_vec()).unwrap());
        }
    }
    // The topic has several partitions: every record comes back, in order within its partition.
    seen.sort_by_key(|r| r.trim_start_matches("record-").parse::<usize>().unwrap());
    assert_eq!(seen, (0..count).map(|i| format!("record-{i}")).collect::<Vec<_>>());
}

/// A TLS client of our own, to look at what the broker presents and to send raw requests.
fn tls_client(
    port: u16,
    ca: &std::path::Path,
    identity: Option<&Issued>,
) -> std::io::Result<rustls::StreamOwned<rustls::ClientConnection, TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match identity {
        Some(id) => {
            let chain = CertificateDer::pem_file_iter(&id.certificate).unwrap().map(Result::unwrap).collect();
            builder.with_client_auth_cert(chain, PrivateKeyDer::from_pem_file(&id.key).unwrap()).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    let connection =
        rustls::ClientConnection::new(Arc::new(config), ServerName::try_from("127.0.0.1").unwrap()).unwrap();
    let tcp = TcpStream::connect(("127.0.0.1", port))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut stream = rustls::StreamOwned::new(connection, tcp);
    // Drives the handshake to its end (TLS 1.3 reports a refused client certificate only on the first read).
    while stream.conn.is_handshaking() {
        stream.conn.complete_io(&mut stream.sock)?;
    }
    Ok(stream)
}

/// Sends ApiVersions v0 over `stream` and reads the answer.
fn api_versions(stream: &mut impl ReadWrite) -> std::io::Result<()> {
    let request = encode_request(ApiKey::ApiVersions, 0, 1, "tls-test", &ApiVersionsRequest::default()).unwrap();
    stream.write_all(&request)?;
    stream.flush()?;
    let mut size = [0u8; 4];
    stream.read_exact(&mut size)?;
    let mut frame = vec![0u8; i32::from_be_bytes(size) as usize];
    stream.read_exact(&mut frame)?;
    decode_response(bytes::Bytes::from(frame), ApiKey::ApiVersions, 0).unwrap();
    Ok(())
}

trait ReadWrite: Read + Write {}
impl<T: Read + Write> ReadWrite for T {}

/// The broker port numbers Metadata gives over `stream`.
fn metadata_ports(stream: &mut impl ReadWrite) -> Vec<i32> {
    let request = encode_request(ApiKey::Metadata, 12, 2, "tls-test", &MetadataRequest::default()).unwrap();
    stream.write_all(&request).unwrap();
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).unwrap();
    let mut frame = vec![0u8; i32::from_be_bytes(size) as usize];
    stream.read_exact(&mut frame).unwrap();
    let (_, ResponseKind::Metadata(metadata)) =
        decode_response(bytes::Bytes::from(frame), ApiKey::Metadata, 12).unwrap()
    else {
        panic!("not a Metadata answer")
    };
    metadata.brokers.iter().map(|b| b.port).collect()
}

#[test]
fn librdkafka_produces_and_consumes_over_ssl_and_mutual_tls() {
    let s = start_secured(&[]);
    produce_and_consume(&rdkafka_ssl(s.ssl, &s.pki.ca), "over-ssl", 20);
    let app = s.pki.client("app", "Billing", "Apps");
    let mut mutual = rdkafka_ssl(s.mtls, &s.pki.ca);
    mutual
        .set("ssl.certificate.location", app.certificate.to_str().unwrap())
        .set("ssl.key.location", app.key.to_str().unwrap());
    produce_and_consume(&mutual, "over-mtls", 20);
}

#[test]
fn metadata_answers_with_the_addresses_of_the_listener_the_client_came_through() {
    let s = start_secured(&[]);
    let mut plain = s.broker.connect();
    assert_eq!(metadata_ports(&mut plain), [s.broker.port as i32]);
    let mut tls = tls_client(s.ssl, &s.pki.ca, None).unwrap();
    assert_eq!(metadata_ports(&mut tls), [s.ssl as i32]);
    let app = s.pki.client("app", "billing", "Apps");
    let mut mutual = tls_client(s.mtls, &s.pki.ca, Some(&app)).unwrap();
    assert_eq!(metadata_ports(&mut mutual), [s.mtls as i32]);
}

#[test]
fn a_client_without_a_trusted_valid_certificate_is_refused_where_one_is_required() {
    let s = start_secured(&[]);
    let refused = |identity: Option<&Issued>| match tls_client(s.mtls, &s.pki.ca, identity) {
        Err(_) => true,
        Ok(mut stream) => api_versions(&mut stream).is_err(),
    };
    assert!(refused(None), "no certificate");
    let stranger = Pki::new(s.dir.path(), "strangers").client("stranger", "billing", "Apps");
    assert!(refused(Some(&stranger)), "a certificate of another authority");
    let expired = s.pki.client_valid_until("expired", "billing", "Apps", Some(()));
    assert!(refused(Some(&expired)), "an expired certificate");
    // A trusted certificate whose subject no ssl.principal.mapping.rules rule maps has no principal.
    let unmapped = s.pki.client("unmapped", "billing", "Elsewhere");
    assert!(refused(Some(&unmapped)), "a subject without a principal");
    let app = s.pki.client("app", "billing", "Apps");
    let mut ok = tls_client(s.mtls, &s.pki.ca, Some(&app)).unwrap();
    api_versions(&mut ok).unwrap();
    // The plain SSL listener asks for no certificate.
    api_versions(&mut tls_client(s.ssl, &s.pki.ca, None).unwrap()).unwrap();
}

#[test]
fn bad_handshakes_close_the_connection_and_other_clients_go_on() {
    let s = start_secured(&["--set", "socket.request.timeout.ms=2000"]);
    let mut steady = tls_client(s.ssl, &s.pki.ca, None).unwrap();
    api_versions(&mut steady).unwrap();
    // A plaintext Kafka client on the TLS port.
    let mut plain = TcpStream::connect(("127.0.0.1", s.ssl)).unwrap();
    plain.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = api_versions(&mut plain);
    common::assert_closed(&mut plain);
    // A TLS client on the plaintext port.
    assert!(tls_client(s.broker.port, &s.pki.ca, None).and_then(|mut t| api_versions(&mut t)).is_err());
    // Garbage, and a handshake cut short that then says nothing.
    let mut garbage = TcpStream::connect(("127.0.0.1", s.ssl)).unwrap();
    garbage.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    garbage.write_all(&[0x16, 0x03, 0x01, 0x00, 0x05, 0xde, 0xad, 0xbe, 0xef, 0x00]).unwrap();
    common::assert_closed(&mut garbage);
    let mut truncated = TcpStream::connect(("127.0.0.1", s.ssl)).unwrap();
    truncated.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    truncated.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00]).unwrap();
    common::assert_closed(&mut truncated);
    // The client that behaved is still served, and so are new ones.
    api_versions(&mut steady).unwrap();
    api_versions(&mut tls_client(s.ssl, &s.pki.ca, None).unwrap()).unwrap();
}

/// The leaf certificate the broker presents on `port`.
fn presented(port: u16, ca: &std::path::Path) -> Vec<u8> {
    let stream = tls_client(port, ca, None).unwrap();
    stream.conn.peer_certificates().unwrap()[0].to_vec()
}

#[test]
fn certificates_replaced_on_disk_are_served_to_new_connections_while_open_ones_go_on() {
    let s = start_secured(&[]);
    assert_eq!(presented(s.ssl, &s.pki.ca), s.server.der);
    let mut open = tls_client(s.ssl, &s.pki.ca, None).unwrap();
    api_versions(&mut open).unwrap();
    let producer: ThreadedProducer<DefaultProducerContext> = rdkafka_ssl(s.ssl, &s.pki.ca).create().unwrap();
    producer.send(BaseRecord::<(), str>::to("rotation").payload("before")).map_err(|(e, _)| e).unwrap();
    producer.flush(Duration::from_secs(30)).unwrap();

    // A new certificate written over the keystore is picked up by the file watch.
    let renewed = s.pki.server("renewed", "broker-1-renewed");
    std::fs::copy(&renewed.keystore, &s.server.keystore).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while presented(s.ssl, &s.pki.ca) != renewed.der {
        assert!(Instant::now() < deadline, "the new certificate was not served:\n{}", s.broker.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    api_versions(&mut open).unwrap();
    producer.send(BaseRecord::<(), str>::to("rotation").payload("after")).map_err(|(e, _)| e).unwrap();
    producer.flush(Duration::from_secs(30)).unwrap();

    // A broken file leaves the listener with what it had; SIGHUP reads the files again.
    std::fs::write(&s.server.keystore, "not a pem file").unwrap();
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(presented(s.ssl, &s.pki.ca), renewed.der);
    let third = s.pki.server("third", "broker-1-third");
    std::fs::copy(&third.keystore, &s.server.keystore).unwrap();
    s.broker.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(20);
    while presented(s.ssl, &s.pki.ca) != third.der {
        assert!(Instant::now() < deadline, "the third certificate was not served:\n{}", s.broker.log());
        std::thread::sleep(Duration::from_millis(200));
    }
    api_versions(&mut open).unwrap();
}

#[test]
fn a_listener_whose_files_cannot_be_used_stops_the_start_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let missing = format!("ssl.keystore.location={}", dir.path().join("missing.pem").display());
    let port = free_port();
    let listeners = format!("listeners=SSL://127.0.0.1:{port}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["start", "--metrics-listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--set", &listeners, "--set", &missing])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("missing.pem") && stderr.contains("listener SSL"), "{stderr}");
    // ssl.* settings without a TLS listener would do nothing.
    let unused = std::process::Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["start", "--metrics-listen", "127.0.0.1:0", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--set", "ssl.client.auth=required"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&unused.stderr);
    assert!(!unused.status.success());
    assert!(stderr.contains("ssl.client.auth is set, but no listener speaks SSL"), "{stderr}");
}

#[test]
fn replication_frames_are_taken_only_on_the_inter_broker_listener() {
    let s = start_secured(&[]);
    let hello = ReplicaHello { cluster_id: "another-cluster".into(), broker: 7, from_shard: 0, to_shard: 0 };
    let frame = encode_frame(kind::HELLO, &encode_message(&hello));
    let refused = "closing replication connection: not a broker of this cluster";
    // The SSL listener takes Kafka clients only: a peer frame is not a TLS handshake, and is never seen as
    // replication.
    let mut stranger = TcpStream::connect(("127.0.0.1", s.ssl)).unwrap();
    stranger.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    stranger.write_all(&frame).unwrap();
    // What comes back is at most a TLS alert, then the end: no Hello answer.
    let mut answer = Vec::new();
    stranger.read_to_end(&mut answer).expect("the connection closes");
    assert!(!answer.starts_with(b"SLP1"), "a peer answer on the SSL listener: {answer:?}");
    // The inter-broker listener (the first, PLAINTEXT, here) reads it as a Hello, and refuses its cluster.
    let mut peer = TcpStream::connect(("127.0.0.1", s.broker.port)).unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    peer.write_all(&frame).unwrap();
    common::assert_closed(&mut peer);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !s.broker.log().contains(refused) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        s.broker.log().matches(refused).count(),
        1,
        "only the inter-broker listener's Hello is read:\n{}",
        s.broker.log()
    );
}
