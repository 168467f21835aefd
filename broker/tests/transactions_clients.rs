//! Transactions with real clients against the real binary (`scripts/client-tests/transactions.py`):
//! confluent-kafka (librdkafka) and kafka-python transactional producers commit and abort, a zombie is
//! fenced by a new instance of its transactional id, and read_committed consumers see exactly the
//! committed records while read_uncommitted ones see everything.

mod common;

use common::Broker;

/// Runs the client script against `bootstrap`, creating `topic` with `replication` replicas; panics with its
/// output unless it ends with "ok".
fn run_script(bootstrap: &str, topic: &str, replication: u16) {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/client-tests/transactions.py");
    let out = std::process::Command::new("python3")
        .arg(&script)
        .args([bootstrap, topic, &replication.to_string()])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.trim_end().ends_with("ok"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn librdkafka_and_kafka_python_transactions_on_one_broker() {
    let broker = Broker::start(2);
    run_script(&format!("127.0.0.1:{}", broker.port), "txn-clients", 1);
    let (_, log) = broker.terminate_with_log();
    for line in log.lines() {
        assert!(!line.contains(" WARN ") && !line.contains(" ERROR "), "transactions logged: {line}");
    }
}
