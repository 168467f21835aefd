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
