//! kafka-python and confluent-kafka (installed by `.ci/run`) against the real binary: topics created
//! through their admin APIs, configs described, records produced by idempotent producers (kafka-python with its defaults), consumed from the
//! earliest offset and from a timestamp, offsets listed. aiokafka, the asyncio client, at its defaults:
//! a topic created, records produced, a group of two members consuming and committing, described, and
//! resuming at its commits after the broker restarts. The checks are in the scripts.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{Broker, run_across_restart};

#[test]
fn kafka_python_and_confluent_kafka_round_trips() {
    // More shards than the machine's two cores: the same client checks must hold.
    let broker = Broker::start(4);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/client-tests/python_clients.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(format!("127.0.0.1:{}", broker.port))
        .output()
        .expect("python3 runs (.ci/run installs the clients)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python clients failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("python clients: all checks passed"), "{stdout}");
}

#[test]
fn aiokafka_produces_and_a_group_of_two_resumes_at_its_commits_after_a_broker_restart() {
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in(data.path(), 2, &[]);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/client-tests/aiokafka_clients.py");
    let mut command = Command::new("python3");
    command.arg(&script).arg(format!("127.0.0.1:{}", broker.port));
    let (out, broker) = run_across_restart(command, broker, data.path(), 2, &[], Duration::from_secs(300));
    assert!(out.contains("aiokafka: all checks passed"), "{out}");
    assert!(broker.terminate().success());
}
