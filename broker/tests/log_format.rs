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
