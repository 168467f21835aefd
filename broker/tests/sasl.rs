//! SASL against the real binary: librdkafka (the rdkafka crate and kcat) and confluent-kafka over
//! SASL_SSL with SCRAM-SHA-512, librdkafka over SASL_PLAINTEXT with SCRAM-SHA-256, PLAIN and OAUTHBEARER
//! (a token the test signs), kafka-python with PLAIN and SCRAM-SHA-256; the first users made by
//! `--add-scram`; and bad input — a wrong password, an unknown mechanism, a request before
//! authentication, garbage during the exchange, an oversized frame, thousands of failed logins —
//! each answered with an error or a closed connection, without harm to other clients.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, MetadataRequest, ResponseKind, SaslAuthenticateRequest, SaslHandshakeRequest,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::ClientContext;
use rdkafka::client::OAuthToken;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};

use common::pki::Pki;
use common::{Broker, assert_closed, receive, send};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// A broker with the harness's PLAINTEXT listener, a SASL_PLAINTEXT one offering every mechanism, and a
/// SASL_SSL one offering SCRAM-SHA-512; alice's credentials made at formation by `--add-scram`.
struct SaslBroker {
    broker: Broker,
    sasl_plain: u16,
    sasl_ssl: u16,
    ca: PathBuf,
    signer: Signer,
    _dir: tempfile::TempDir,
}

const ALICE: &str = "alice";
const ALICE_PASSWORD: &str = "alice-secret";

fn start(extra: &[&str]) -> SaslBroker {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "cluster");
    let server = pki.server("broker", "broker-1");
    let signer = Signer::new(dir.path());
    let (plain, sasl_plain, sasl_ssl) = (free_port(), free_port(), free_port());
    let listeners = format!(
        "listeners=PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl_plain},SASL_SSL://127.0.0.1:{sasl_ssl}"
    );
    let keystore = format!("ssl.keystore.location={}", server.keystore.display());
    let jwks = format!("sasl.oauthbearer.jwks.endpoint.url=file://{}", signer.jwks.display());
    let scram256 = format!("SCRAM-SHA-256=[name={ALICE},password={ALICE_PASSWORD}]");
    let scram512 = format!("SCRAM-SHA-512=[name={ALICE},password={ALICE_PASSWORD}]");
    let mut args = vec![
        "--set",
        &listeners,
        "--set",
        &keystore,
        "--set",
        "listener.name.sasl_plaintext.sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER",
        "--set",
        "listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512",
        "--set",
        &jwks,
        "--set",
        "sasl.oauthbearer.expected.audience=shardlog",
        "--add-scram",
        &scram256,
        "--add-scram",
        &scram512,
    ];
    args.extend_from_slice(extra);
    let broker = Broker::start_at(dir.path().join("data").as_path(), plain, 1, &args, None);
    SaslBroker { broker, sasl_plain, sasl_ssl, ca: pki.ca.clone(), signer, _dir: dir }
}

/// Signs OAUTHBEARER tokens with an EC key whose public half is in a JWKS file.
struct Signer {
    key: EncodingKey,
    jwks: PathBuf,
}

impl Signer {
    fn new(dir: &Path) -> Signer {
        let key = EncodingKey::from_ec_der(&rcgen::KeyPair::generate().unwrap().serialize_der());
        let mut jwk = Jwk::from_encoding_key(&key, Algorithm::ES256).unwrap();
        jwk.common.key_id = Some("test-key".into());
        let jwks = dir.join("jwks.json");
        std::fs::write(&jwks, serde_json::to_vec(&JwkSet { keys: vec![jwk] }).unwrap()).unwrap();
        Signer { key, jwks }
    }

    /// A token for `sub`, valid for `seconds` (negative: expired that long ago).
    fn token(&self, sub: &str, audience: &str, seconds: i64) -> (String, u64) {
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
        // Past the broker's clock skew allowance (30 s) when negative.
        let seconds = seconds as u64;
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some("test-key".into());
        let expires = now.wrapping_add(seconds);
        let claims = serde_json::json!({"sub": sub, "aud": audience, "iat": now.min(expires), "exp": expires});
        (jsonwebtoken::encode(&header, &claims, &self.key).unwrap(), expires)
    }
}

fn sasl_config(port: u16, protocol: &str, mechanism: &str, ca: Option<&Path>) -> ClientConfig {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", format!("127.0.0.1:{port}"))
        .set("security.protocol", protocol)
        .set("sasl.mechanism", mechanism)
        .set("sasl.username", ALICE)
        .set("sasl.password", ALICE_PASSWORD)
        .set("message.timeout.ms", "20000");
    if let Some(ca) = ca {
        config.set("ssl.ca.location", ca.to_str().unwrap());
    }
    config
}

/// Produces `count` records with acks=all and consumes them back, both with `config` and `context`.
fn round_trip<C>(config: &ClientConfig, context: C, topic: &str, count: usize)
where
    C: ProducerContext<DeliveryOpaque = ()> + ConsumerContext + Clone + 'static,
{
    let producer: ThreadedProducer<C> = config.clone().set("acks", "all").create_with_context(context.clone()).unwrap();
    for i in 0..count {
        let value = format!("record-{i}");
        producer.send(BaseRecord::<(), str>::to(topic).payload(&value)).map_err(|(e, _)| e).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    let consumer: BaseConsumer<C> = config
        .clone()
        .set("group.id", format!("{topic}-readers"))
        .set("auto.offset.reset", "earliest")
        .create_with_context(context)
        .unwrap();
    consumer.subscribe(&[topic]).unwrap();
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < count && Instant::now() < deadline {
        if let Some(message) = consumer.poll(Duration::from_millis(500)) {
            seen.push(String::from_utf8(message.unwrap().payload().unwrap().to_vec()).unwrap());
        }
    }
    seen.sort_by_key(|r| r.trim_start_matches("record-").parse::<usize>().unwrap());
    assert_eq!(seen, (0..count).map(|i| format!("record-{i}")).collect::<Vec<_>>(), "{topic}");
}

/// librdkafka's default context, cloneable for the round trip.
#[derive(Clone)]
struct Plain;
impl ClientContext for Plain {}
impl ProducerContext for Plain {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}
impl ConsumerContext for Plain {}

/// A context that hands librdkafka OAUTHBEARER tokens signed by the test.
#[derive(Clone)]
struct Bearer {
    token: String,
    expires_s: u64,
}
impl ClientContext for Bearer {
    const ENABLE_REFRESH_OAUTH_TOKEN: bool = true;
    fn generate_oauth_token(&self, _: Option<&str>) -> Result<OAuthToken, Box<dyn std::error::Error>> {
        Ok(OAuthToken {
            token: self.token.clone(),
            principal_name: "app".into(),
            lifetime_ms: self.expires_s as i64 * 1000,
        })
    }
}
impl ProducerContext for Bearer {
    type DeliveryOpaque = ();
    fn delivery(&self, _: &rdkafka::message::DeliveryResult<'_>, _: ()) {}
}
impl ConsumerContext for Bearer {}

#[test]
fn librdkafka_authenticates_with_scram_plain_and_oauthbearer() {
    let b = start(&[]);
    round_trip(&sasl_config(b.sasl_ssl, "sasl_ssl", "SCRAM-SHA-512", Some(&b.ca)), Plain, "scram-512-tls", 10);
    round_trip(&sasl_config(b.sasl_plain, "sasl_plaintext", "SCRAM-SHA-256", None), Plain, "scram-256", 10);
    round_trip(&sasl_config(b.sasl_plain, "sasl_plaintext", "PLAIN", None), Plain, "plain", 10);
    let (token, expires_s) = b.signer.token("app", "shardlog", 600);
    let mut bearer = ClientConfig::new();
    bearer
        .set("bootstrap.servers", format!("127.0.0.1:{}", b.sasl_plain))
        .set("security.protocol", "sasl_plaintext")
        .set("sasl.mechanism", "OAUTHBEARER")
        .set("message.timeout.ms", "20000");
    round_trip(&bearer, Bearer { token, expires_s }, "oauth", 10);
}

#[test]
fn kcat_and_the_python_clients_authenticate() {
    let b = start(&[]);
    // kcat (librdkafka from Debian) over SASL_SSL with SCRAM-SHA-512.
    let kcat = |args: &[&str], input: Option<&str>| {
        let mut command = Command::new("kcat");
        command
            .args(["-b", &format!("127.0.0.1:{}", b.sasl_ssl), "-X", "security.protocol=sasl_ssl"])
            .args(["-X", "sasl.mechanisms=SCRAM-SHA-512", "-X", &format!("sasl.username={ALICE}")])
            .args(["-X", &format!("sasl.password={ALICE_PASSWORD}"), "-X"])
            .arg(format!("ssl.ca.location={}", b.ca.display()))
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = command.spawn().expect("kcat is installed (.ci/run)");
        child.stdin.take().unwrap().write_all(input.unwrap_or("").as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "kcat {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    kcat(&["-P", "-t", "kcat-topic", "-p", "0"], Some("one\ntwo\n"));
    assert_eq!(kcat(&["-C", "-t", "kcat-topic", "-p", "0", "-o", "beginning", "-e", "-q"], None), "one\ntwo\n");

    let script = r#"
import sys
from kafka import KafkaProducer, KafkaConsumer
import confluent_kafka
port_plain, port_ssl, ca, user, password = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
for mechanism in ["PLAIN", "SCRAM-SHA-256"]:
    topic = "kafka-python-" + mechanism.lower()
    common = dict(bootstrap_servers="127.0.0.1:" + port_plain, security_protocol="SASL_PLAINTEXT",
                  sasl_mechanism=mechanism, sasl_plain_username=user, sasl_plain_password=password)
    producer = KafkaProducer(acks="all", **common)
    for i in range(5):
        producer.send(topic, ("v%d" % i).encode()).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(topic, auto_offset_reset="earliest", consumer_timeout_ms=20000, **common)
    values = sorted(m.value.decode() for _, m in zip(range(5), consumer))
    consumer.close()
    assert values == ["v%d" % i for i in range(5)], (mechanism, values)
conf = {"bootstrap.servers": "127.0.0.1:" + port_ssl, "security.protocol": "SASL_SSL",
        "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user, "sasl.password": password,
        "ssl.ca.location": ca}
producer = confluent_kafka.Producer(conf)
for i in range(5):
    producer.produce("confluent-scram", value=("c%d" % i).encode())
assert producer.flush(30) == 0
consumer = confluent_kafka.Consumer(dict(conf, **{"group.id": "confluent-readers", "auto.offset.reset": "earliest"}))
consumer.subscribe(["confluent-scram"])
seen = []
while len(seen) < 5:
    m = consumer.poll(20)
    assert m is not None, seen
    assert m.error() is None, m.error()
    seen.append(m.value().decode())
consumer.close()
assert sorted(seen) == ["c%d" % i for i in range(5)], seen
print("ok")
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .args([&b.sasl_plain.to_string(), &b.sasl_ssl.to_string(), b.ca.to_str().unwrap(), ALICE, ALICE_PASSWORD])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}

fn connect(port: u16) -> TcpStream {
    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s
}

fn handshake(stream: &mut TcpStream, mechanism: &str, version: i16) -> i16 {
    let request = SaslHandshakeRequest::default().with_mechanism(StrBytes::from_string(mechanism.into()));
    send(stream, ApiKey::SaslHandshake, version, 1, &request);
    let (_, ResponseKind::SaslHandshake(response)) = receive(stream, ApiKey::SaslHandshake, version) else {
        panic!("not a SaslHandshake answer")
    };
    response.error_code
}

fn authenticate(stream: &mut TcpStream, bytes: &[u8]) -> (i16, Vec<u8>) {
    let request = SaslAuthenticateRequest::default().with_auth_bytes(bytes::Bytes::copy_from_slice(bytes));
    send(stream, ApiKey::SaslAuthenticate, 2, 2, &request);
    let (_, ResponseKind::SaslAuthenticate(response)) = receive(stream, ApiKey::SaslAuthenticate, 2) else {
        panic!("not a SaslAuthenticate answer")
    };
    (response.error_code, response.auth_bytes.to_vec())
}

fn plain_token(user: &str, password: &str) -> Vec<u8> {
    format!("\0{user}\0{password}").into_bytes()
}

/// Kafka's error codes the tests expect.
const SASL_AUTHENTICATION_FAILED: i16 = 58;
const UNSUPPORTED_SASL_MECHANISM: i16 = 33;

#[test]
fn bad_logins_and_requests_before_authentication_close_the_connection() {
    let b = start(&[]);
    let mut steady = connect(b.sasl_plain);
    assert_eq!(handshake(&mut steady, "PLAIN", 1), 0);
    assert_eq!(authenticate(&mut steady, &plain_token(ALICE, ALICE_PASSWORD)).0, 0);

    // A wrong password, an unknown user: the same error, then the connection closes.
    for (user, password) in [(ALICE, "wrong"), ("mallory", "anything")] {
        let mut s = connect(b.sasl_plain);
        assert_eq!(handshake(&mut s, "PLAIN", 1), 0);
        assert_eq!(authenticate(&mut s, &plain_token(user, password)).0, SASL_AUTHENTICATION_FAILED);
        assert_closed(&mut s);
    }
    // A mechanism this listener does not offer.
    let mut s = connect(b.sasl_plain);
    assert_eq!(handshake(&mut s, "GSSAPI", 1), UNSUPPORTED_SASL_MECHANISM);
    assert_closed(&mut s);
    // Any request but ApiVersions before authentication.
    let mut s = connect(b.sasl_plain);
    send(&mut s, ApiKey::ApiVersions, 0, 1, &ApiVersionsRequest::default());
    receive(&mut s, ApiKey::ApiVersions, 0);
    send(&mut s, ApiKey::Metadata, 12, 2, &MetadataRequest::default());
    assert_closed(&mut s);
    // SaslAuthenticate before SaslHandshake.
    let mut s = connect(b.sasl_plain);
    assert_ne!(authenticate(&mut s, &plain_token(ALICE, ALICE_PASSWORD)).0, 0);
    assert_closed(&mut s);
    // Garbage inside the exchange: SCRAM's first message, and a truncated frame.
    let mut s = connect(b.sasl_plain);
    assert_eq!(handshake(&mut s, "SCRAM-SHA-256", 1), 0);
    assert_eq!(authenticate(&mut s, b"\xff\xfe garbage").0, SASL_AUTHENTICATION_FAILED);
    assert_closed(&mut s);
    let mut s = connect(b.sasl_plain);
    assert_eq!(handshake(&mut s, "PLAIN", 1), 0);
    s.write_all(&[0, 0, 0, 40, 0, 36, 0, 2]).unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert_closed(&mut s);
    // A frame larger than sasl.server.max.receive.size before authentication.
    let mut s = connect(b.sasl_plain);
    s.write_all(&(1i32 << 20).to_be_bytes()).unwrap();
    assert_closed(&mut s);
    // The client that authenticated is still served.
    send(&mut steady, ApiKey::Metadata, 12, 3, &MetadataRequest::default());
    let (_, ResponseKind::Metadata(_)) = receive(&mut steady, ApiKey::Metadata, 12) else { panic!() };
}

#[test]
fn a_handshake_v0_client_sends_raw_tokens() {
    let b = start(&[]);
    let mut s = connect(b.sasl_plain);
    assert_eq!(handshake(&mut s, "PLAIN", 0), 0);
    let token = plain_token(ALICE, ALICE_PASSWORD);
    s.write_all(&(token.len() as i32).to_be_bytes()).unwrap();
    s.write_all(&token).unwrap();
    let mut size = [0u8; 4];
    s.read_exact(&mut size).unwrap();
    assert_eq!(i32::from_be_bytes(size), 0, "an empty token: authenticated");
    send(&mut s, ApiKey::Metadata, 12, 2, &MetadataRequest::default());
    let (_, ResponseKind::Metadata(_)) = receive(&mut s, ApiKey::Metadata, 12) else { panic!() };
    // A wrong password over v0: the connection closes without a token.
    let mut s = connect(b.sasl_plain);
    assert_eq!(handshake(&mut s, "PLAIN", 0), 0);
    let token = plain_token(ALICE, "wrong");
    s.write_all(&(token.len() as i32).to_be_bytes()).unwrap();
    s.write_all(&token).unwrap();
    assert_closed(&mut s);
}

fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn ten_thousand_failed_logins_leave_memory_flat_and_other_clients_served() {
    let b = start(&["--set", "connection.failed.authentication.delay.ms=0"]);
    let fail = |count: usize| {
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let port = b.sasl_plain;
                std::thread::spawn(move || {
                    for _ in 0..count / 8 {
                        let mut s = connect(port);
                        assert_eq!(handshake(&mut s, "SCRAM-SHA-256", 1), 0);
                        let first = b"n,,n=mallory,r=abcdefghijklmnop";
                        let (code, _) = authenticate(&mut s, first);
                        assert_eq!(code, 0, "an unknown user looks like any other until the proof");
                        let last = b"c=biws,r=abcdefghijklmnop,p=AAAA";
                        assert_eq!(authenticate(&mut s, last).0, SASL_AUTHENTICATION_FAILED);
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
    };
    fail(2_000);
    let warm = resident_kib(b.broker.pid());
    fail(10_000);
    let after = resident_kib(b.broker.pid());
    assert!(after < warm + 32 * 1024, "resident memory grew from {warm} KiB to {after} KiB");
    round_trip(&sasl_config(b.sasl_plain, "sasl_plaintext", "SCRAM-SHA-256", None), Plain, "after-failures", 5);
}

#[test]
fn a_session_past_connections_max_reauth_ms_must_authenticate_again() {
    let b = start(&["--set", "connections.max.reauth.ms=2000"]);
    // librdkafka re-authenticates by itself (KIP-368) and keeps producing.
    let producer: ThreadedProducer<Plain> =
        sasl_config(b.sasl_plain, "sasl_plaintext", "SCRAM-SHA-512", None).create_with_context(Plain).unwrap();
    for i in 0..6 {
        producer.send(BaseRecord::<(), str>::to("reauth").payload(&format!("v{i}"))).map_err(|(e, _)| e).unwrap();
        producer.flush(Duration::from_secs(30)).unwrap();
        std::thread::sleep(Duration::from_millis(1000));
    }
    // A client that does not is closed at its first request after the session ended.
    let mut s = connect(b.sasl_plain);
    assert_eq!(handshake(&mut s, "PLAIN", 1), 0);
    let request = SaslAuthenticateRequest::default()
        .with_auth_bytes(bytes::Bytes::copy_from_slice(&plain_token(ALICE, ALICE_PASSWORD)));
    send(&mut s, ApiKey::SaslAuthenticate, 1, 2, &request);
    let (_, ResponseKind::SaslAuthenticate(response)) = receive(&mut s, ApiKey::SaslAuthenticate, 1) else { panic!() };
    assert_eq!(response.error_code, 0);
    assert!(response.session_lifetime_ms > 0 && response.session_lifetime_ms <= 2000, "{response:?}");
    std::thread::sleep(Duration::from_millis(2500));
    send(&mut s, ApiKey::Metadata, 12, 3, &MetadataRequest::default());
    assert_closed(&mut s);
}

#[test]
fn an_oauthbearer_token_for_another_audience_or_expired_is_refused() {
    let b = start(&[]);
    for (token, _) in [b.signer.token("app", "elsewhere", 600), b.signer.token("app", "shardlog", -120)] {
        let mut s = connect(b.sasl_plain);
        assert_eq!(handshake(&mut s, "OAUTHBEARER", 1), 0);
        let first = format!("n,,\x01auth=Bearer {token}\x01\x01");
        let (code, reply) = authenticate(&mut s, first.as_bytes());
        assert_eq!(code, 0, "the refusal comes as RFC 7628's error reply");
        assert!(String::from_utf8_lossy(&reply).contains("invalid_token"), "{reply:?}");
        assert_eq!(authenticate(&mut s, b"\x01").0, SASL_AUTHENTICATION_FAILED);
        assert_closed(&mut s);
    }
}
