//! kafkajs, the Node client (pinned in `scripts/client-tests/package.json`; `.ci/run` installs it with
//! `npm ci`), against the real binary at its default settings: a topic created through its admin API,
//! records produced (its default is acks=-1), a group of two members consuming every record once and
//! committing, described while stable and once empty, and resuming at its commits after the broker
//! restarts. The checks are in the script.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{Broker, run_across_restart};

#[test]
fn kafkajs_produces_and_a_group_of_two_resumes_at_its_commits_after_a_broker_restart() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/client-tests");
    assert!(
        dir.join("node_modules/kafkajs").is_dir(),
        "kafkajs is not installed: run `npm ci` in scripts/client-tests (.ci/run does)"
    );
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in(data.path(), 2, &[]);
    let mut command = Command::new("node");
    command.arg(dir.join("kafkajs_clients.js")).arg(format!("127.0.0.1:{}", broker.port));
    let (out, broker) = run_across_restart(command, broker, data.path(), 2, &[], Duration::from_secs(300));
    assert!(out.contains("kafkajs: all checks passed"), "{out}");
    assert!(broker.terminate().success());
}
