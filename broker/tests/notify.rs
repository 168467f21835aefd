//! systemd's notifications from the real binary, read from a notification socket the test owns (as
//! systemd's would be): STATUS= lines while it starts, READY=1 only once Kafka requests are answered,
//! WATCHDOG=1 every half watchdog interval, STOPPING=1 on SIGTERM; with a shard stalled on purpose
//! (`test.stall.shard`) the watchdog pings stop.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixDatagram;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kafka_protocol::messages::{ApiKey, ApiVersionsRequest};

/// Starts the broker with `NOTIFY_SOCKET` at a socket of the test's and a 1 s watchdog.
fn start(dir: &std::path::Path, extra: &[&str]) -> (Child, UnixDatagram, u16) {
    let socket_path = dir.join("notify.sock");
    let socket = UnixDatagram::bind(&socket_path).unwrap();
    socket.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["start", "--listen", &format!("127.0.0.1:{port}"), "--metrics-listen", "127.0.0.1:0"])
        .args(["--shards", "2", "--data-dir"])
        .arg(dir.join("data"))
        .args(extra)
        .env("NOTIFY_SOCKET", &socket_path)
        .env("WATCHDOG_USEC", "1000000")
        .env_remove("WATCHDOG_PID")
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (child, socket, port)
}

/// The next notification (one datagram, possibly several lines), if one comes within 200 ms.
fn next(socket: &UnixDatagram) -> Option<String> {
    let mut buf = [0u8; 4096];
    let n = socket.recv(&mut buf).ok()?;
    Some(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Whether the broker answers an ApiVersions request within a second.
fn answers(port: u16) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else { return false };
    s.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
    let frame =
        shardlog_net::kafka::encode_request(ApiKey::ApiVersions, 3, 1, "t", &ApiVersionsRequest::default()).unwrap();
    if s.write_all(&frame).is_err() {
        return false;
    }
    let mut size = [0u8; 4];
    s.read_exact(&mut size).is_ok()
}

/// Reads notifications until one contains `want` (within `limit`); returns every one read.
fn until(socket: &UnixDatagram, want: &str, limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        if let Some(m) = next(socket) {
            let done = m.lines().any(|l| l == want);
            seen.push(m);
            if done {
                return seen;
            }
        }
    }
    panic!("no {want} within {limit:?}; got {seen:?}");
}

#[test]
fn ready_comes_once_kafka_is_answered_then_watchdog_pings_then_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, socket, port) = start(dir.path(), &[]);
    let before = until(&socket, "READY=1", Duration::from_secs(60));
    assert!(
        before.iter().any(|m| m.starts_with("STATUS=recovering") || m.contains("STATUS=waiting for the metadata")),
        "STATUS lines while it starts: {before:?}"
    );
    assert!(answers(port), "READY=1 comes once Kafka requests are answered");
    assert!(before.last().unwrap().contains("STATUS=serving Kafka on 127.0.0.1"), "{before:?}");

    // WATCHDOG=1 every half second (half the 1 s interval).
    let started = Instant::now();
    let mut pings = 0;
    while started.elapsed() < Duration::from_secs(3) {
        if next(&socket).is_some_and(|m| m.lines().any(|l| l == "WATCHDOG=1")) {
            pings += 1;
        }
    }
    assert!((4..=8).contains(&pings), "{pings} watchdog pings in 3 s");

    // SIGTERM: STOPPING=1, then a clean exit.
    // SAFETY: kill(2) on the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    until(&socket, "STOPPING=1", Duration::from_secs(30));
    let status = child.wait().unwrap();
    assert!(status.success(), "{status}");
}

#[test]
fn a_stalled_shard_stops_the_watchdog_pings() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, socket, port) = start(dir.path(), &["--set", "test.stall.shard=1"]);
    until(&socket, "READY=1", Duration::from_secs(60));
    assert!(answers(port));
    // Shard 1 blocks a second after it serves; within half a watchdog interval more the pings stop.
    std::thread::sleep(Duration::from_secs(2));
    while next(&socket).is_some() {}
    let started = Instant::now();
    let mut pings = 0;
    while started.elapsed() < Duration::from_secs(3) {
        if next(&socket).is_some_and(|m| m.lines().any(|l| l == "WATCHDOG=1")) {
            pings += 1;
        }
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(pings, 0, "no watchdog ping while a shard is stalled");
}
