//! kafka-python and confluent-kafka (installed by `.ci/run`) against the real binary: topics created
//! through their admin APIs, configs described, records produced by idempotent producers (kafka-python with its defaults), consumed from the
//! earliest offset and from a timestamp, offsets listed. The checks are in the script.

mod common;

use std::path::Path;
use std::process::Command;

use common::Broker;

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
