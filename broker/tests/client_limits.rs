//! What clients can make the broker hold: request bytes (`queued.max.request.bytes`), slow and idle
//! connections (`socket.request.timeout.ms`, `connections.max.idle.ms`) and connections
//! (`max.connections`, `max.connections.per.ip`), probed against the real binary the way an attacker
//! would, with an ordinary client served throughout.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use common::requests::{batch, create, fetch_all, produce_one, produce_request};
use common::{Broker, receive, send};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ResponseKind};

const MIB: usize = 1 << 20;

/// The broker's resident memory, in bytes.
fn rss(broker: &Broker) -> usize {
    let status = std::fs::read_to_string(format!("/proc/{}/status", broker.pid())).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS in /proc/PID/status");
    let kib: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib * 1024
}

/// Waits until the broker closes `stream` (end of stream or reset); false if it is still open at
/// `deadline`.
fn closed_by(stream: &mut TcpStream, deadline: Instant) -> bool {
    stream.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            Err(_) => return true,
        }
    }
    false
}

/// An ordinary client's round: ApiVersions, then a produce and a fetch of what it produced.
fn ordinary_client_round(broker: &Broker, topic: &str, seed: u8) {
    let mut s = broker.connect();
    send(&mut s, ApiKey::ApiVersions, 3, 1, &ApiVersionsRequest::default());
    let (_, answer) = receive(&mut s, ApiKey::ApiVersions, 3);
    let ResponseKind::ApiVersions(answer) = answer else { panic!("an ApiVersions answer") };
    assert_eq!(answer.error_code, 0);
    let (error, _) = produce_one(&mut s, topic, 0, &batch(seed, 3, 1_700_000_000_000));
    assert_eq!(error, 0, "an ordinary produce is served");
    let (error, records) = fetch_all(&mut s, topic, 0);
    assert_eq!(error, 0);
    assert!(!records.is_empty());
}

/// Opens a connection and sends `sent` bytes of a frame announcing `announced` bytes, giving up on the
/// write once the broker stops reading (it does, for a frame that does not fit the budget).
fn partial_frame(addr: SocketAddr, announced: usize, sent: usize) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(1))).unwrap();
    let mut bytes = (announced as u32).to_be_bytes().to_vec();
    bytes.resize(4 + sent, 0x5a);
    let mut written = 0;
    while written < bytes.len() {
        match s.write(&bytes[written..]) {
            Ok(n) => written += n,
            Err(_) => break,
        }
    }
    s
}

#[test]
fn partial_frames_hold_no_more_than_the_request_budget_and_are_closed_when_late() {
    let broker = Broker::start_with(
        2,
        &[
            "--set",
            "socket.request.max.bytes=16777216",
            "--set",
            "queued.max.request.bytes=41943040",
            "--set",
            "socket.request.timeout.ms=3000",
        ],
    );
    let addr: SocketAddr = format!("127.0.0.1:{}", broker.port).parse().unwrap();
    let mut admin = broker.connect();
    assert_eq!(create(&mut admin, "ordinary", 1, 1, &[]), 0);
    ordinary_client_round(&broker, "ordinary", 1);
    let before = rss(&broker);
    // Six connections each send 15 MiB of a 16 MiB frame and hold it. Unbounded, that is 90 MiB
    // held; the budget of 40 MiB lets two frames in at a time.
    let probes: Vec<std::thread::JoinHandle<TcpStream>> =
        (0..6).map(|_| std::thread::spawn(move || partial_frame(addr, 16 * MIB, 15 * MIB))).collect();
    let mut peak = 0;
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        peak = peak.max(rss(&broker));
        std::thread::sleep(Duration::from_millis(50));
    }
    // An ordinary client is served while the probes hold what they can.
    ordinary_client_round(&broker, "ordinary", 2);
    let mut probes: Vec<TcpStream> = probes.into_iter().map(|p| p.join().unwrap()).collect();
    peak = peak.max(rss(&broker));
    // The budget, plus what the ordinary client's requests and the connections' read buffers take.
    let overhead = 16 * MIB;
    assert!(
        peak <= before + 40 * MIB + overhead,
        "RSS rose from {} MiB to {} MiB: more than the 40 MiB budget plus {} MiB",
        before / MIB,
        peak / MIB,
        overhead / MIB
    );
    // Each frame is given 3 s once it may be read; all six are closed, two at a time.
    let deadline = Instant::now() + Duration::from_secs(60);
    for (i, probe) in probes.iter_mut().enumerate() {
        assert!(closed_by(probe, deadline), "probe {i} is still open a minute later");
    }
    assert!(
        broker.log().matches("did not arrive whole within socket.request.timeout.ms").count() >= 6,
        "each late frame is logged:\n{}",
        broker.log()
    );
    ordinary_client_round(&broker, "ordinary", 3);
    assert_eq!(broker.terminate(), std::process::ExitStatus::default());
}

#[test]
fn large_requests_give_their_memory_back_once_answered() {
    let broker = Broker::start(1);
    let mut s = broker.connect();
    let before = rss(&broker);
    // Three 40 MiB produce requests for a topic that does not exist: read whole, decoded, refused,
    // nothing stored, so only the request buffers take memory.
    let records = vec![0x33u8; 40 * MIB];
    for i in 0..3 {
        let request = produce_request("nowhere", 0, &records, 1);
        send(&mut s, ApiKey::Produce, 9, i, &request);
        let (_, answer) = receive(&mut s, ApiKey::Produce, 9);
        let ResponseKind::Produce(answer) = answer else { panic!("a Produce answer") };
        assert_ne!(answer.responses[0].partition_responses[0].error_code, 0, "no such topic");
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut after = rss(&broker);
    while after > before + 16 * MIB && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
        after = rss(&broker);
    }
    assert!(
        after <= before + 16 * MIB,
        "RSS was {} MiB before three 40 MiB requests and still {} MiB 30 s after them",
        before / MIB,
        after / MIB
    );
    drop(s);
    assert_eq!(broker.terminate(), std::process::ExitStatus::default());
}

#[test]
fn slow_senders_and_idle_connections_are_closed_but_busy_and_long_polling_ones_are_not() {
    let broker =
        Broker::start_with(1, &["--set", "socket.request.timeout.ms=2000", "--set", "connections.max.idle.ms=3000"]);
    let mut admin = broker.connect();
    assert_eq!(create(&mut admin, "t", 1, 1, &[]), 0);
    drop(admin);
    let addr: SocketAddr = format!("127.0.0.1:{}", broker.port).parse().unwrap();

    // Slowloris: a 100-byte frame sent a byte every 200 ms would take 20 s.
    let mut slow = TcpStream::connect(addr).unwrap();
    let mut sent = 0;
    let mut frame = 100u32.to_be_bytes().to_vec();
    frame.resize(104, 1);
    let started = Instant::now();
    let closed = loop {
        if slow.write_all(&frame[sent..sent + 1]).is_err() {
            break true;
        }
        sent += 1;
        std::thread::sleep(Duration::from_millis(200));
        if sent == frame.len() || started.elapsed() > Duration::from_secs(30) {
            break false;
        }
    };
    let closed = closed || closed_by(&mut slow, Instant::now() + Duration::from_secs(5));
    assert!(closed, "a frame trickling in past socket.request.timeout.ms closes the connection");
    assert!(sent < frame.len(), "closed before the frame was whole ({sent} bytes sent)");

    // A connection that sends nothing is closed once idle; one that keeps sending requests is not,
    // and neither is one whose long-polling fetch (5 s, longer than the idle limit) is in hand.
    let mut idle = TcpStream::connect(addr).unwrap();
    let mut busy = broker.connect();
    let mut polling = broker.connect();
    let fetch = common::requests::fetch_request("t", 0, 0, 5000);
    send(&mut polling, ApiKey::Fetch, 12, 7, &fetch);
    for i in 0..7 {
        send(&mut busy, ApiKey::ApiVersions, 3, i, &ApiVersionsRequest::default());
        receive(&mut busy, ApiKey::ApiVersions, 3);
        std::thread::sleep(Duration::from_millis(1000));
    }
    let (correlation, answer) = receive(&mut polling, ApiKey::Fetch, 12);
    assert_eq!(correlation, 7);
    assert!(matches!(answer, ResponseKind::Fetch(_)), "the long poll got its answer");
    assert!(closed_by(&mut idle, Instant::now() + Duration::from_secs(10)), "the idle connection is closed");
    send(&mut busy, ApiKey::ApiVersions, 3, 99, &ApiVersionsRequest::default());
    let (correlation, _) = receive(&mut busy, ApiKey::ApiVersions, 3);
    assert_eq!(correlation, 99, "the busy connection stayed open");
    assert_eq!(broker.terminate(), std::process::ExitStatus::default());
}

/// A connection from `from` (an address of 127/8) to the broker, and whether the broker serves it.
fn served_from(broker: &Broker, from: &str) -> (bool, socket2::Socket) {
    use socket2::{Domain, SockAddr, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    socket.bind(&SockAddr::from(format!("{from}:0").parse::<SocketAddr>().unwrap())).unwrap();
    let to: SocketAddr = format!("127.0.0.1:{}", broker.port).parse().unwrap();
    socket.connect(&to.into()).unwrap();
    let mut stream: TcpStream = socket.try_clone().unwrap().into();
    stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let request =
        shardlog_net::kafka::encode_request(ApiKey::ApiVersions, 3, 1, "limits", &ApiVersionsRequest::default())
            .unwrap();
    let served = stream.write_all(&request).is_ok() && {
        let mut size = [0u8; 4];
        stream.read_exact(&mut size).is_ok()
    };
    (served, socket)
}

/// A connection from `from` that the broker serves, trying again until `limit` passes (a slot given back
/// is counted free a moment after its connection closes).
fn served_within(broker: &Broker, from: &str, limit: Duration) -> Option<socket2::Socket> {
    let deadline = Instant::now() + limit;
    loop {
        let (served, socket) = served_from(broker, from);
        if served {
            return Some(socket);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn connections_beyond_max_connections_and_per_address_are_closed_at_once_and_counted() {
    let broker = Broker::start_with(2, &["--set", "max.connections=8", "--set", "max.connections.per.ip=5"]);
    let mut held = Vec::new();
    for i in 0..5 {
        // (The readiness probe's connection may still be counted for a moment.)
        let socket = served_within(&broker, "127.0.0.1", Duration::from_secs(10));
        assert!(socket.is_some(), "connection {i} from 127.0.0.1 is within both limits");
        held.extend(socket);
    }
    let (served, _refused) = served_from(&broker, "127.0.0.1");
    assert!(!served, "a sixth connection from 127.0.0.1 is over max.connections.per.ip");
    for i in 0..3 {
        let (served, socket) = served_from(&broker, "127.0.0.2");
        assert!(served, "connection {i} from 127.0.0.2 is within both limits");
        held.push(socket);
    }
    let (served, _refused) = served_from(&broker, "127.0.0.3");
    assert!(!served, "a ninth connection is over max.connections");
    // Many refusals in a burst are each closed, and logged at most once a second per shard.
    let started = Instant::now();
    for _ in 0..200 {
        assert!(!served_from(&broker, "127.0.0.4").0);
    }
    let seconds = started.elapsed().as_secs() as usize + 1;
    // A freed slot is given to the next connection.
    drop(held.pop());
    let socket = served_within(&broker, "127.0.0.3", Duration::from_secs(10));
    assert!(socket.is_some(), "a slot given back is reused");
    held.extend(socket);
    let log = broker.log();
    let lines = log.lines().filter(|l| l.contains("refused a client connection")).count();
    assert!(lines >= 1, "refusals are logged:\n{log}");
    assert!(lines <= 2 * (seconds + 1), "{lines} refusal lines in {seconds} s on two shards:\n{log}");
    assert!(log.contains("refused_since_start="), "the log line carries the count:\n{log}");
    drop(held);
    assert_eq!(broker.terminate(), std::process::ExitStatus::default());
}
