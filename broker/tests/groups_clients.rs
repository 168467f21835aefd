//! Consumer groups with real clients against the real binary: confluent-kafka and kafka-python
//! (`scripts/client-tests/groups.py`, whose checks are in the script) and librdkafka through the `rdkafka`
//! crate: sharing partitions, a member killed with SIGKILL, rejoining at the committed offsets, the
//! cooperative-sticky assignor, and resuming after the broker itself is killed and restarted; the same
//! with the consumer protocol of KIP-848 (`group.protocol=consumer`), its subscriptions by regular
//! expression following new topics and partitions, and a group of each protocol side by side on one topic.

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

/// The consumer protocol (KIP-848) decides sessions on the broker: short ones for the tests.
const CONSUMER_PROTOCOL: [&str; 6] = [
    "--set",
    "group.initial.rebalance.delay.ms=0",
    "--set",
    "group.consumer.session.timeout.ms=6000",
    "--set",
    "group.consumer.heartbeat.interval.ms=1000",
];

fn scenario(broker: &Broker, name: &str, extra: &[&str]) -> String {
    scenario_with(broker, name, extra, "classic")
}

/// Runs a scenario of `groups.py` with its confluent-kafka consumers on `protocol` (classic or consumer).
fn scenario_with(broker: &Broker, name: &str, extra: &[&str], protocol: &str) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/client-tests/groups.py");
    let out = Command::new("python3")
        .env("GROUP_PROTOCOL", protocol)
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

#[test]
fn three_consumer_protocol_members_share_twelve_partitions_and_a_killed_ones_move_while_the_others_consume() {
    let broker = Broker::start_with(2, &CONSUMER_PROTOCOL);
    let out = scenario_with(&broker, "three-consumers", &[], "consumer");
    assert!(out.contains("survivors consumed their new records"), "the consumer protocol's checks ran: {out}");
}

#[test]
fn a_consumer_protocol_group_resumes_at_its_commits_after_the_broker_is_killed_and_restarted() {
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in(data.path(), 2, &CONSUMER_PROTOCOL);
    let port = broker.port;
    let out = scenario_with(&broker, "resume-commit", &[], "consumer");
    let committed = out.lines().find_map(|l| l.strip_prefix("resume-commit: passed ")).expect("the committed offsets");
    broker.kill();
    let broker = Broker::start_at(data.path(), port, 2, &CONSUMER_PROTOCOL, None);
    scenario_with(&broker, "resume-check", &[committed.trim()], "consumer");
}

#[test]
fn a_consumer_protocol_member_subscribed_by_regex_gets_new_matching_topics_and_partitions() {
    let broker = Broker::start_with(2, &CONSUMER_PROTOCOL);
    scenario_with(&broker, "regex-and-grow", &[], "consumer");
}

#[test]
fn a_classic_and_a_consumer_protocol_group_consume_one_topic_side_by_side() {
    let broker = Broker::start_with(2, &CONSUMER_PROTOCOL);
    scenario(&broker, "side-by-side", &[]);
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

fn shardlog(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shardlog")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// The rows of `group describe`'s partition table: (topic, partition) -> (current, log end, lag, member).
fn partition_rows(describe: &str) -> BTreeMap<(String, i32), [String; 4]> {
    describe
        .lines()
        .skip_while(|l| !l.starts_with("TOPIC\t"))
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            ((f[0].to_string(), f[1].parse().unwrap()), [f[2], f[3], f[4], f[5]].map(String::from))
        })
        .collect()
}

#[test]
fn group_cli_lists_describes_with_lag_resets_offsets_and_deletes() {
    let broker = Broker::start_with(2, &SETTINGS);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    let b = bootstrap.as_str();
    assert!(
        shardlog(&["topic", "create", "cli-t", "--partitions", "2", "--replication-factor", "1", "--bootstrap", b]).0
    );
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", b).create().unwrap();
    for i in 0..100 {
        let value = i.to_string();
        producer.send(BaseRecord::<(), _>::to("cli-t").payload(&value).partition(i % 2)).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();

    // A member consumes 60 of the 100 records and commits.
    let member = rdkafka_consumer(b, "cli-group");
    member.subscribe(&["cli-t"]).unwrap();
    let (_, seen) = consume(&member, 60);
    member.commit_consumer_state(CommitMode::Sync).expect("commit");
    let mut committed: BTreeMap<i32, i64> = BTreeMap::new();
    for (p, o) in &seen {
        committed.insert(*p, (*committed.get(p).unwrap_or(&0)).max(o + 1));
    }

    let (ok, out, err) = shardlog(&["group", "list", "--bootstrap", b]);
    assert!(ok, "{err}");
    assert_eq!(out, "cli-group\tStable\n");
    let (ok, out, err) = shardlog(&["group", "describe", "cli-group", "--bootstrap", b]);
    assert!(ok, "{err}");
    assert!(
        out.starts_with("Group: cli-group\tState: Stable\tProtocolType: consumer\tProtocol: range\tMembers: 1\n"),
        "{out}"
    );
    let member_id = member.client().fetch_group_list(Some("cli-group"), Duration::from_secs(5)).unwrap().groups()[0]
        .members()[0]
        .id()
        .to_string();
    let rows = partition_rows(&out);
    assert_eq!(rows.len(), 2, "{out}");
    for p in 0..2 {
        let current = committed.get(&p).copied().unwrap_or(0);
        let row = &rows[&("cli-t".to_string(), p)];
        assert_eq!(row[1], "50", "log end of partition {p}: {out}");
        if committed.contains_key(&p) {
            assert_eq!((row[0].as_str(), row[2].clone()), (current.to_string().as_str(), (50 - current).to_string()));
        }
        assert_eq!(row[3], member_id, "partition {p} is consumed by the one member");
    }

    // Offsets are reset only while no member could overwrite them.
    let (ok, _, err) =
        shardlog(&["group", "reset-offsets", "cli-group", "--topic", "cli-t", "--to-earliest", "--bootstrap", b]);
    assert!(!ok && err.contains("member"), "{err}");
    let (ok, _, err) = shardlog(&["group", "delete", "cli-group", "--bootstrap", b]);
    assert!(!ok && err.contains("NonEmptyGroup"), "{err}");
    drop(member);

    let (ok, out, err) =
        shardlog(&["group", "reset-offsets", "cli-group", "--topic", "cli-t", "--to-offset", "7", "--bootstrap", b]);
    assert!(ok, "{err}");
    assert_eq!(out, "TOPIC\tPARTITION\tNEW-OFFSET\ncli-t\t0\t7\ncli-t\t1\t7\n");
    let (_, out, _) = shardlog(&["group", "describe", "cli-group", "--bootstrap", b]);
    assert!(out.starts_with("Group: cli-group\tState: Empty"), "{out}");
    let rows = partition_rows(&out);
    assert!(rows.values().all(|r| r[0] == "7" && r[2] == "43" && r[3] == "-"), "{out}");
    let (ok, out, _) =
        shardlog(&["group", "reset-offsets", "cli-group", "--topic", "cli-t", "--to-latest", "--bootstrap", b]);
    assert!(ok);
    assert_eq!(out, "TOPIC\tPARTITION\tNEW-OFFSET\ncli-t\t0\t50\ncli-t\t1\t50\n");

    // A consumer of the group starts where the reset put it: the first record it gets is one produced now.
    producer.send(BaseRecord::<(), _>::to("cli-t").payload("after").partition(0)).unwrap();
    producer.flush(Duration::from_secs(30)).unwrap();
    let resumed = rdkafka_consumer(b, "cli-group");
    resumed.subscribe(&["cli-t"]).unwrap();
    let (firsts, _) = consume(&resumed, 1);
    assert_eq!(firsts, BTreeMap::from([(0, 50)]));
    drop(resumed);

    let (ok, out, err) = shardlog(&["group", "delete", "cli-group", "--bootstrap", b]);
    assert!(ok, "{err}");
    assert_eq!(out, "Deleted group cli-group.\n");
    assert_eq!(shardlog(&["group", "list", "--bootstrap", b]).1, "");
    let (ok, _, err) = shardlog(&["group", "describe", "cli-group", "--bootstrap", b]);
    assert!(!ok && err.contains("does not exist"), "{err}");
}

#[test]
fn group_cli_describes_a_consumer_protocol_group_with_its_epochs_and_assignments() {
    let broker = Broker::start_with(2, &CONSUMER_PROTOCOL);
    let b = &format!("127.0.0.1:{}", broker.port);
    let (ok, _, err) =
        shardlog(&["topic", "create", "cli-848", "--partitions", "4", "--replication-factor", "1", "--bootstrap", b]);
    assert!(ok, "{err}");
    let _consumer = consumer_protocol_member(b, "cli-848-group", None);

    let (ok, out, err) = shardlog(&["group", "describe", "cli-848-group", "--bootstrap", b]);
    assert!(ok, "{err}");
    let header = out.lines().next().unwrap();
    for field in ["State: Stable", "GroupProtocol: consumer", "Assignor: uniform", "Members: 1"] {
        assert!(header.contains(field), "{field} in {out}");
    }
    let epoch = |name: &str| -> i32 {
        let at = header.find(&format!("{name}: ")).unwrap_or_else(|| panic!("{name} in {header}"));
        header[at + name.len() + 2..].split('\t').next().unwrap().parse().unwrap()
    };
    assert!(epoch("GroupEpoch") >= 1 && epoch("AssignmentEpoch") == epoch("GroupEpoch"), "{header}");
    let member = out.lines().find(|l| l.contains("Member: ")).expect("the member's line");
    assert!(member.contains(&format!("Epoch: {}", epoch("AssignmentEpoch"))), "{member}");
    assert!(member.contains("Assigned: cli-848:0,1,2,3\tTarget: cli-848:0,1,2,3"), "{member}");

    let (ok, list, err) = shardlog(&["group", "list", "--bootstrap", b]);
    assert!(ok, "{err}");
    assert!(list.contains("cli-848-group\tStable"), "{list}");

    // A member asking for the range assignor (`group.remote.assignor`) gets it.
    let _ranged = consumer_protocol_member(b, "cli-848-range", Some("range"));
    let (ok, out, err) = shardlog(&["group", "describe", "cli-848-range", "--bootstrap", b]);
    assert!(ok, "{err}");
    assert!(out.lines().next().unwrap().contains("Assignor: range"), "{out}");
}

/// A librdkafka member of `group` speaking the consumer protocol, subscribed to `cli-848` (4 partitions),
/// once it has every partition.
fn consumer_protocol_member(bootstrap: &str, group: &str, assignor: Option<&str>) -> BaseConsumer {
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("group.protocol", "consumer")
        .set("auto.offset.reset", "earliest");
    if let Some(assignor) = assignor {
        config.set("group.remote.assignor", assignor);
    }
    let consumer: BaseConsumer = config.create().expect("consumer");
    consumer.subscribe(&["cli-848"]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while consumer.assignment().unwrap().count() < 4 {
        assert!(Instant::now() < deadline, "the only member gets every partition in time");
        consumer.poll(Duration::from_millis(100));
    }
    consumer
}
