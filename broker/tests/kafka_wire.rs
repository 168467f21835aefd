//! The real `shardlog` binary, started as a process, spoken to over TCP with requests encoded by the
//! `kafka-protocol` crate's client side: what is served, what is refused, and shutdown.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
use kafka_protocol::messages::metadata_request::{MetadataRequest, MetadataRequestTopic};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader, ResponseKind, TopicName};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

struct Broker {
    child: Child,
    port: u16,
    _data: tempfile::TempDir,
}

impl Broker {
    fn start(shards: usize) -> Broker {
        let data = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new(env!("CARGO_BIN_EXE_shardlog"))
            .args(["start", "--listen", &format!("127.0.0.1:{port}"), "--shards", &shards.to_string()])
            .arg("--data-dir")
            .arg(data.path())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start shardlog");
        let broker = Broker { child, port, _data: data };
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "broker did not listen within 30 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        broker
    }

    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    /// Sends SIGTERM and returns the exit status.
    fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id() as i32;
        // SAFETY: kill(2) with a pid we spawned and a valid signal number.
        assert_eq!(unsafe { libc_kill(pid, 15) }, 0);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "broker did not stop within 20 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn send<T: Encodable>(stream: &mut TcpStream, api_key: ApiKey, version: i16, correlation_id: i32, body: &T) {
    let header = RequestHeader::default()
        .with_request_api_key(api_key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("wire-test")));
    let mut out = BytesMut::new();
    out.put_i32(0);
    header.encode(&mut out, api_key.request_header_version(version)).unwrap();
    body.encode(&mut out, version).unwrap();
    let size = (out.len() - 4) as i32;
    out[..4].copy_from_slice(&size.to_be_bytes());
    stream.write_all(&out).unwrap();
}

fn receive(stream: &mut TcpStream, api_key: ApiKey, version: i16) -> (i32, ResponseKind) {
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).expect("a response");
    let mut frame = vec![0u8; i32::from_be_bytes(size) as usize];
    stream.read_exact(&mut frame).unwrap();
    let mut frame = Bytes::from(frame);
    let header = ResponseHeader::decode(&mut frame, api_key.response_header_version(version)).unwrap();
    let body = ResponseKind::decode(api_key, &mut frame, version).unwrap();
    assert_eq!(frame.remaining(), 0);
    (header.correlation_id, body)
}

fn assert_closed(stream: &mut TcpStream) {
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("connection should be closed, read gave {other:?}"),
    }
}

fn api_versions_v3() -> ApiVersionsRequest {
    ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("wire-test"))
        .with_client_software_version(StrBytes::from_static_str("1"))
}

#[test]
fn api_versions_lists_exactly_what_is_served() {
    let broker = Broker::start(1);
    let mut s = broker.connect();
    send(&mut s, ApiKey::ApiVersions, 3, 11, &api_versions_v3());
    let (correlation_id, body) = receive(&mut s, ApiKey::ApiVersions, 3);
    assert_eq!(correlation_id, 11);
    let ResponseKind::ApiVersions(r) = body else { panic!("wrong response kind") };
    assert_eq!(r.error_code, 0);
    let listed: Vec<_> = r.api_keys.iter().map(|a| (a.api_key, a.min_version, a.max_version)).collect();
    assert_eq!(listed, vec![(3, 0, 12), (18, 0, 4)]);
}

#[test]
fn metadata_names_this_broker_and_refuses_unknown_topics() {
    let broker = Broker::start(1);
    let mut s = broker.connect();
    let req = MetadataRequest::default().with_topics(Some(vec![
        MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_static_str("orders")))),
    ]));
    for (i, version) in [1i16, 9, 12].into_iter().enumerate() {
        send(&mut s, ApiKey::Metadata, version, i as i32, &req);
        let (correlation_id, body) = receive(&mut s, ApiKey::Metadata, version);
        assert_eq!(correlation_id, i as i32, "responses come back in request order");
        let ResponseKind::Metadata(m) = body else { panic!("wrong response kind") };
        assert_eq!(m.brokers.len(), 1);
        assert_eq!(
            (m.brokers[0].node_id.0, m.brokers[0].host.as_str(), m.brokers[0].port),
            (1, "127.0.0.1", broker.port as i32)
        );
        assert_eq!(m.topics.len(), 1);
        assert_eq!(m.topics[0].error_code, 3, "UNKNOWN_TOPIC_OR_PARTITION");
    }
}

#[test]
fn unknown_api_versions_version_is_answered_then_the_client_retries() {
    let broker = Broker::start(1);
    let mut s = broker.connect();
    let mut frame = BytesMut::new();
    frame.put_i32(8);
    frame.put_i16(ApiKey::ApiVersions as i16);
    frame.put_i16(42);
    frame.put_i32(5);
    s.write_all(&frame).unwrap();
    let (correlation_id, body) = receive(&mut s, ApiKey::ApiVersions, 0);
    assert_eq!(correlation_id, 5);
    let ResponseKind::ApiVersions(r) = body else { panic!() };
    assert_eq!(r.error_code, 35, "UNSUPPORTED_VERSION");
    // Same connection, a version from the list.
    send(&mut s, ApiKey::ApiVersions, 3, 6, &api_versions_v3());
    assert_eq!(receive(&mut s, ApiKey::ApiVersions, 3).0, 6);
}

#[test]
fn bad_input_closes_only_that_connection() {
    let broker = Broker::start(2);
    let bad: [&[u8]; 5] = [
        b"\x00\x00\x00\x0cGARBAGE!GARB",                             // unknown API key
        b"\xff\xff\xff\xff",                                         // negative length
        b"\x7f\xff\xff\xff",                                         // 2 GiB frame
        b"\x00\x00\x00\x02\x00\x12",                                 // too short for a header
        b"\x00\x00\x00\x0a\x00\x00\x00\x09\x00\x00\x00\x01\x00\x00", // Produce, not served
    ];
    for bytes in bad {
        let mut s = broker.connect();
        s.write_all(bytes).unwrap();
        assert_closed(&mut s);
        // The broker is still there for everyone else.
        let mut ok = broker.connect();
        send(&mut ok, ApiKey::ApiVersions, 3, 1, &api_versions_v3());
        assert_eq!(receive(&mut ok, ApiKey::ApiVersions, 3).0, 1);
    }
}

#[test]
fn more_shards_than_cores_serve_many_connections() {
    let broker = Broker::start(4);
    let mut streams: Vec<TcpStream> = (0..32).map(|_| broker.connect()).collect();
    for (i, s) in streams.iter_mut().enumerate() {
        send(s, ApiKey::ApiVersions, 3, i as i32, &api_versions_v3());
    }
    for (i, s) in streams.iter_mut().enumerate() {
        assert_eq!(receive(s, ApiKey::ApiVersions, 3).0, i as i32);
    }
}

#[test]
fn sigterm_stops_the_broker_with_exit_code_zero() {
    let broker = Broker::start(2);
    let mut idle = broker.connect();
    send(&mut idle, ApiKey::ApiVersions, 3, 1, &api_versions_v3());
    receive(&mut idle, ApiKey::ApiVersions, 3);
    let status = broker.terminate();
    assert!(status.success(), "exit status {status:?}");
}
