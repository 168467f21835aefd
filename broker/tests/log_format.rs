//! The broker's log: `--log-format json` writes one JSON object per line; RUST_LOG sets levels per module.

mod common;

use common::Broker;

#[test]
fn json_lines_carry_level_target_and_fields() {
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in_env(data.path(), 2, &["--log-format", "json"], None);
    let (status, log) = broker.terminate_with_log();
    assert!(status.success());
    let lines: Vec<serde_json::Value> =
        log.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}"))).collect();
    assert!(lines.len() > 3, "{log}");
    for line in &lines {
        assert!(line["timestamp"].is_string() && line["level"].is_string() && line["target"].is_string(), "{line}");
        assert!(line["fields"]["message"].is_string(), "{line}");
    }
    let accepting = lines.iter().filter(|l| l["fields"]["message"] == "accepting connections").count();
    assert_eq!(accepting, 2, "one per shard, with the shard as a field:\n{log}");
    assert!(lines.iter().any(|l| l["fields"]["message"] == "accepting connections" && l["fields"]["shard"] == 1));
}

#[test]
fn what_the_quorum_reports_carries_topics_partitions_and_brokers_as_fields() {
    use common::requests::create;
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in_env(data.path(), 1, &["--log-format", "json"], None);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "greetings", 3, 1, &[]), 0);
    drop(s);
    // The controlled shutdown leaves the three partitions without a leader.
    let (status, log) = broker.terminate_with_log();
    assert!(status.success());
    let lines: Vec<serde_json::Value> = log.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    for line in &lines {
        assert!(line["fields"].get("event").is_none(), "a debug string for a field: {line}");
    }
    let offline = lines
        .iter()
        .find(|l| l["fields"]["message"] == "quorum: partitions offline while their broker is shut down")
        .unwrap_or_else(|| panic!("no line for the partitions left offline:\n{log}"));
    let f = &offline["fields"];
    assert_eq!((f["broker"].as_u64(), f["partitions"].as_u64()), (Some(1), Some(3)), "{f}");
    assert_eq!(f["topics"], "greetings:0-2", "{f}");
}

#[test]
fn rust_log_sets_the_level_of_each_module() {
    let data = tempfile::tempdir().unwrap();
    let filter = "warn,shardlog_broker::runtime=info";
    let broker = Broker::start_in_env(data.path(), 1, &["--log-format", "json"], Some(filter));
    let (status, log) = broker.terminate_with_log();
    assert!(status.success());
    let lines: Vec<serde_json::Value> = log.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(lines.iter().any(|l| l["fields"]["message"] == "accepting connections"), "{log}");
    for line in &lines {
        let target = line["target"].as_str().unwrap();
        assert!(target.starts_with("shardlog_broker::runtime") || line["level"] != "INFO", "{line}");
    }
}

#[test]
fn a_slow_request_is_logged_with_its_api_partitions_and_where_the_time_went() {
    use common::requests::{batch, create, produce_one};
    let data = tempfile::tempdir().unwrap();
    // 0: every request counts as slow.
    let extra = ["--log-format", "json", "--set", "log.slow.request.ms=0"];
    let broker = Broker::start_in_env(data.path(), 1, &extra, None);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "slow", 2, 1, &[]), 0);
    assert_eq!(produce_one(&mut s, "slow", 1, &batch(1, 2, 0)).0, 0);
    let (status, log) = broker.terminate_with_log();
    assert!(status.success());
    let lines: Vec<serde_json::Value> = log.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let produce = lines
        .iter()
        .find(|l| l["fields"]["message"] == "slow request" && l["fields"]["api"] == "Produce")
        .unwrap_or_else(|| panic!("no slow-request line for the produce:\n{log}"));
    let f = &produce["fields"];
    assert_eq!(f["partitions"], 1);
    let (total, queued, handled) =
        (f["total_us"].as_u64().unwrap(), f["queued_us"].as_u64().unwrap(), f["handled_us"].as_u64().unwrap());
    assert!(queued + handled <= total && handled > 0, "{f}");
    assert!(lines.iter().any(|l| l["fields"]["api"] == "CreateTopics"), "{log}");

    // The default threshold (5 s) logs none of these.
    let broker = Broker::start_in_env(data.path(), 1, &["--log-format", "json"], None);
    let mut s = broker.connect();
    assert_eq!(produce_one(&mut s, "slow", 0, &batch(2, 2, 0)).0, 0);
    let (_, log) = broker.terminate_with_log();
    assert!(!log.contains("slow request"), "{log}");
}

/// A broker whose stderr nobody reads (a full pipe) keeps answering: a line that would block is queued,
/// and dropped and counted once the queue is full; once stderr is read again the log goes on.
#[test]
fn a_stderr_nobody_reads_never_stops_the_broker() {
    use std::io::Read;
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    use kafka_protocol::messages::{ApiKey, ApiVersionsRequest};

    let free_port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (port, metrics_port) = (free_port(), free_port());
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["start", "--listen", &format!("127.0.0.1:{port}"), "--shards", "1"])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics_port}")])
        // Every request is logged: a line of some 200 bytes each.
        .args(["--set", "log.slow.request.ms=0", "--data-dir"])
        .arg(data.path())
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut stream = loop {
        if let Ok(s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            break s;
        }
        assert!(Instant::now() < deadline, "the broker did not listen");
        std::thread::sleep(Duration::from_millis(20));
    };
    // Some 4 MB of log lines into a 64 KiB pipe nobody reads: every request is still answered.
    const REQUESTS: i32 = 20_000;
    for id in 0..REQUESTS {
        common::send(&mut stream, ApiKey::ApiVersions, 3, id, &ApiVersionsRequest::default());
        let (correlation, _) = common::receive(&mut stream, ApiKey::ApiVersions, 3);
        assert_eq!(correlation, id);
    }
    let metrics = {
        use std::io::Write;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", metrics_port)).unwrap();
        write!(s, "GET /metrics HTTP/1.1\r\n\r\n").unwrap();
        let mut answer = String::new();
        s.read_to_string(&mut answer).unwrap();
        answer
    };
    let dropped: f64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("shardlog_log_lines_dropped_total "))
        .unwrap_or_else(|| panic!("no dropped-lines counter: {metrics}"))
        .parse()
        .unwrap();
    assert!(dropped > 0.0, "a full pipe made the log drop lines: {dropped}");

    // Read again, the log goes on: once what was queued has come out, the broker's last line comes out
    // as it stops.
    let (progress, read) = std::sync::mpsc::channel::<usize>();
    let reader = std::thread::spawn(move || {
        let mut log = Vec::new();
        let mut chunk = [0u8; 64 << 10];
        loop {
            match stderr.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    log.extend_from_slice(&chunk[..n]);
                    let _ = progress.send(n);
                }
            }
        }
        String::from_utf8_lossy(&log).into_owned()
    });
    // The queue has drained when nothing more arrives for a while.
    let deadline = Instant::now() + Duration::from_secs(60);
    while read.recv_timeout(Duration::from_millis(500)).is_ok() {
        assert!(Instant::now() < deadline, "the queued lines never stopped coming");
    }
    // SAFETY: kill(2) with the pid of the child spawned above.
    assert_eq!(unsafe { libc_kill(child.id() as i32, 15) }, 0);
    assert!(child.wait().unwrap().success());
    let log = reader.join().unwrap();
    assert!(log.contains("slow request"), "the lines before the pipe filled");
    assert!(log.trim_end().ends_with("INFO shardlog: stopped"), "{}", &log[log.len().saturating_sub(2000)..]);
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
