//! Consumer groups with real clients against the real binary: confluent-kafka and kafka-python
//! (`scripts/client-tests/groups.py`, whose checks are in the script) and librdkafka through the `rdkafka`
//! crate: sharing partitions, a member killed with SIGKILL, rejoining at the committed offsets, the
//! cooperative-sticky assignor, and resuming after the broker itself is killed and restarted.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

use common::Broker;

/// Groups form without the 3 s wait for more members, to keep the tests short.
const SETTINGS: [&str; 2] = ["--set", "group.initial.rebalance.delay.ms=0"];

fn scenario(broker: &Broker, name: &str, extra: &[&str]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/client-tests/groups.py");
    let out = Command::new("python3")
        .arg(&script)
        .args([name, &format!("127.0.0.1:{}", broker.port)])
        .args(extra)
        .output()
        .expect("python3 runs (.ci/run installs the clients)");
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{name} failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains(&format!("{name}: passed")), "{stdout}");
    stdout
}

#[test]
fn three_confluent_consumers_share_twelve_partitions_and_take_over_a_killed_members_partitions() {
    let broker = Broker::start_with(2, &SETTINGS);
    scenario(&broker, "three-consumers", &[]);
}

#[test]
fn a_kafka_python_group_rejoins_at_its_committed_offsets() {
    let broker = Broker::start_with(2, &SETTINGS);
    scenario(&broker, "kafka-python", &[]);
}

#[test]
fn librdkafka_cooperative_sticky_moves_only_the_partitions_a_new_member_takes() {
    let broker = Broker::start_with(2, &SETTINGS);
    scenario(&broker, "cooperative", &[]);
}

#[test]
fn a_group_resumes_at_its_committed_offsets_after_the_broker_is_killed_and_restarted() {
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in(data.path(), 2, &SETTINGS);
    let port = broker.port;
    let out = scenario(&broker, "resume-commit", &[]);
    let committed = out.lines().find_map(|l| l.strip_prefix("resume-commit: passed ")).expect("the committed offsets");
    broker.kill();
    let broker = Broker::start_at(data.path(), port, 2, &SETTINGS, None);
    scenario(&broker, "resume-check", &[committed.trim()]);
}

fn rdkafka_consumer(bootstrap: &str, group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .create()
        .expect("consumer")
}

/// Polls until `count` records arrived; returns the first offset seen per partition and every
/// (partition, offset).
fn consume(consumer: &BaseConsumer, count: usize) -> (BTreeMap<i32, i64>, Vec<(i32, i64)>) {
    let (mut firsts, mut seen) = (BTreeMap::new(), Vec::new());
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < count {
        assert!(Instant::now() < deadline, "consumed {} of {count} in time", seen.len());
        let Some(message) = consumer.poll(Duration::from_millis(200)) else { continue };
        let m = message.expect("no consume error");
        firsts.entry(m.partition()).or_insert(m.offset());
        seen.push((m.partition(), m.offset()));
    }
    (firsts, seen)
}

#[test]
fn an_rdkafka_group_consumes_commits_and_a_new_member_resumes_at_the_commits() {
    let broker = Broker::start_with(2, &SETTINGS);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    let status = Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["topic", "create", "rd-group", "--partitions", "4", "--replication-factor", "1"])
        .args(["--bootstrap", &bootstrap])
        .status()
        .unwrap();
    assert!(status.success());
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", &bootstrap).create().unwrap();
    for i in 0..400 {
        let value = i.to_string();
        producer.send(BaseRecord::<(), _>::to("rd-group").payload(&value).partition(i % 4)).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();

    let first = rdkafka_consumer(&bootstrap, "rd-group-g");
    first.subscribe(&["rd-group"]).unwrap();
    let (_, seen) = consume(&first, 250);
    first.commit_consumer_state(CommitMode::Sync).expect("commit");
    let committed: BTreeMap<i32, i64> = first
        .committed(Duration::from_secs(10))
        .unwrap()
        .elements()
        .iter()
        // A partition it consumed nothing from has no commit (librdkafka's invalid offset).
        .filter_map(|e| e.offset().to_raw().filter(|o| *o >= 0).map(|o| (e.partition(), o)))
        .collect();
    assert_eq!(committed.values().sum::<i64>(), 250, "{committed:?}");
    drop(first); // closes: leaves the group

    let second = rdkafka_consumer(&bootstrap, "rd-group-g");
    second.subscribe(&["rd-group"]).unwrap();
    let (firsts, rest) = consume(&second, 150);
    for (p, offset) in &firsts {
        let start = committed.get(p).copied().unwrap_or(0);
        assert_eq!(*offset, start, "partition {p} resumed at the committed offset (the start without one)");
    }
    let mut all: Vec<(i32, i64)> = seen.into_iter().chain(rest).collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 400, "every record once");
}
