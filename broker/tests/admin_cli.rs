//! `shardlog topic ...` against the real broker, as a user runs it.

mod common;

use std::process::Command;

use common::Broker;

fn shardlog(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shardlog")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn topic_create_list_describe_delete() {
    let broker = Broker::start(2);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    let b = bootstrap.as_str();

    let (ok, out, err) = shardlog(&[
        "topic",
        "create",
        "orders",
        "--partitions",
        "3",
        "--replication-factor",
        "1",
        "--config",
        "retention.ms=1000",
        "--bootstrap",
        b,
    ]);
    assert!(ok, "{err}");
    assert_eq!(out, "Created topic orders.\n");
    assert!(
        shardlog(&["topic", "create", "events", "--partitions", "1", "--replication-factor", "1", "--bootstrap", b]).0
    );

    let (ok, out, _) = shardlog(&["topic", "list", "--bootstrap", b]);
    assert!(ok);
    assert_eq!(out, "events\norders\n");

    let (ok, out, err) = shardlog(&["topic", "describe", "orders", "--bootstrap", b]);
    assert!(ok, "{err}");
    assert!(out.contains("PartitionCount: 3"), "{out}");
    // Metadata was negotiated up to a version with topic ids.
    let id = out.split("TopicId: ").nth(1).and_then(|rest| rest.split('\t').next()).unwrap_or("");
    assert!(uuid::Uuid::parse_str(id).is_ok_and(|id| !id.is_nil()), "a topic id: {out}");
    for p in 0..3 {
        assert!(
            out.contains(&format!(
                "Partition: {p}\tLeader: 1\tEpoch: 0\tReplicas: 1\tIsr: 1\tLogStartOffset: 0\tHighWatermark: 0\tReplicaLogEnds: 1:0\n"
            )),
            "{out}"
        );
    }
    assert!(out.contains("\tretention.ms=1000\n"), "set on the topic: {out}");
    assert!(out.contains("\tsegment.bytes=1073741824 (default)\n"), "{out}");

    let (ok, _, err) =
        shardlog(&["topic", "create", "orders", "--partitions", "3", "--replication-factor", "1", "--bootstrap", b]);
    // The broker's words and the code, the topic named once.
    assert!(!ok, "{err}");
    assert_eq!(
        err,
        "Error: create topic orders: a topic of this name already exists (TopicAlreadyExists, error code 36)\n"
    );
    let (ok, _, err) =
        shardlog(&["topic", "create", "r3", "--partitions", "1", "--replication-factor", "3", "--bootstrap", b]);
    assert!(!ok && err.contains("replication factor"), "{err}");

    let (ok, out, _) = shardlog(&["topic", "delete", "orders", "--bootstrap", b]);
    assert!(ok);
    assert_eq!(out, "Deleted topic orders.\n");
    assert_eq!(shardlog(&["topic", "list", "--bootstrap", b]).1, "events\n");
    let (ok, _, err) = shardlog(&["topic", "describe", "orders", "--bootstrap", b]);
    assert!(!ok && err.contains("topic orders"), "{err}");
}

#[test]
fn topic_create_takes_a_replica_assignment_as_kafka_topics_does() {
    let broker = Broker::start(1);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    let b = bootstrap.as_str();
    let (ok, out, err) = shardlog(&["topic", "create", "placed", "--replica-assignment", "1,1", "--bootstrap", b]);
    assert!(ok, "{err}");
    assert_eq!(out, "Created topic placed.\n");
    let (ok, out, err) = shardlog(&["topic", "describe", "placed", "--bootstrap", b]);
    assert!(ok, "{err}");
    assert!(out.contains("PartitionCount: 2"), "{out}");
    assert_eq!(out.matches("Leader: 1\t").count(), 2, "{out}");
    // Refused by the broker: a broker twice, or one that does not exist.
    for bad in ["1:1", "1:7"] {
        let (ok, _, err) = shardlog(&["topic", "create", "bad", "--replica-assignment", bad, "--bootstrap", b]);
        assert!(!ok && err.contains("(InvalidReplicaAssignment, error code 39)"), "{bad}: {err}");
    }
    // Refused before asking: not broker ids, or beside --partitions.
    let (ok, _, err) = shardlog(&["topic", "create", "bad", "--replica-assignment", "1:x", "--bootstrap", b]);
    assert!(!ok && err.contains("\"x\" is not a broker id"), "{err}");
    let (ok, _, err) =
        shardlog(&["topic", "create", "bad", "--replica-assignment", "1", "--partitions", "1", "--bootstrap", b]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
}

/// `topic describe` says beside Kafka's flush values what they mean: a topic that syncs every batch and
/// one that never syncs both read `flush.messages=9223372036854775807`, but not the same durability.
#[test]
fn topic_describe_shows_the_effective_durability_beside_the_flush_values() {
    let broker = Broker::start(1);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    let b = bootstrap.as_str();
    let never = i64::MAX.to_string();
    let topics: [(&str, Vec<String>, &str); 4] = [
        ("synced", vec![], "Durability: always (each acknowledged batch is fdatasync'ed before the answer)\n"),
        (
            "unsynced",
            vec![format!("flush.messages={never}"), format!("flush.ms={never}")],
            "Durability: interval (acknowledged once written; never fdatasync'ed by the interval)\n",
        ),
        (
            "by-count",
            vec!["flush.messages=1000".into()],
            "Durability: interval (acknowledged once written; fdatasync'ed every 1000 messages)\n",
        ),
        (
            "by-time",
            vec!["flush.ms=500".into()],
            "Durability: interval (acknowledged once written; fdatasync'ed every 500 ms)\n",
        ),
    ];
    for (topic, configs, durability) in &topics {
        let mut args =
            vec!["topic", "create", topic, "--partitions", "1", "--replication-factor", "1", "--bootstrap", b];
        for c in configs {
            args.extend(["--config", c.as_str()]);
        }
        let (ok, _, err) = shardlog(&args);
        assert!(ok, "{err}");
        let (ok, out, err) = shardlog(&["topic", "describe", topic, "--bootstrap", b]);
        assert!(ok, "{err}");
        assert!(out.contains(durability), "{topic}: {out}");
        assert!(out.contains("\tflush.messages="), "Kafka's values are still there: {out}");
    }
}

#[test]
fn topic_create_without_counts_takes_the_clusters_defaults() {
    let broker = Broker::start_with(1, &["--set", "num.partitions=4", "--set", "default.replication.factor=1"]);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    let b = bootstrap.as_str();
    let partitions = |topic: &str| {
        let (ok, out, err) = shardlog(&["topic", "describe", topic, "--bootstrap", b]);
        assert!(ok, "{err}");
        assert!(out.lines().filter(|l| l.contains("Partition: ")).all(|l| l.contains("Replicas: 1\t")), "{out}");
        out.lines().filter(|l| l.contains("Partition: ")).count()
    };
    // Neither count given: -1 for both (KIP-464), the broker's num.partitions and default.replication.factor.
    let (ok, out, err) = shardlog(&["topic", "create", "defaults", "--bootstrap", b]);
    assert!(ok, "{err}");
    assert_eq!(out, "Created topic defaults.\n");
    assert_eq!(partitions("defaults"), 4);
    // One given, the other the default.
    assert!(shardlog(&["topic", "create", "two", "--partitions", "2", "--bootstrap", b]).0);
    assert_eq!(partitions("two"), 2);
    assert!(shardlog(&["topic", "create", "one-replica", "--replication-factor", "1", "--bootstrap", b]).0);
    assert_eq!(partitions("one-replica"), 4);
    // The help says what they default to.
    let (ok, help, _) = shardlog(&["topic", "create", "--help"]);
    assert!(ok);
    for (flag, default) in [("--partitions", "num.partitions"), ("--replication-factor", "default.replication.factor")]
    {
        let line = help.lines().skip_while(|l| !l.contains(flag)).take(3).collect::<Vec<_>>().join(" ");
        assert!(line.contains(default), "{flag}'s help names {default}: {help}");
    }
}

#[test]
fn group_delete_of_a_group_with_members_says_what_to_do() {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let broker = Broker::start_with(1, &["--set", "group.initial.rebalance.delay.ms=0"]);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    let b = bootstrap.as_str();
    assert!(
        shardlog(&["topic", "create", "busy", "--partitions", "1", "--replication-factor", "1", "--bootstrap", b]).0
    );
    let consumer: BaseConsumer =
        ClientConfig::new().set("bootstrap.servers", b).set("group.id", "live").create().expect("consumer");
    consumer.subscribe(&["busy"]).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while consumer.assignment().unwrap().count() == 0 {
        assert!(std::time::Instant::now() < deadline, "the consumer never joined its group");
        consumer.poll(std::time::Duration::from_millis(100));
    }
    let (ok, _, err) = shardlog(&["group", "delete", "live", "--bootstrap", b]);
    assert!(!ok, "deleted a group with a member");
    assert!(err.contains("(NonEmptyGroup, error code 68)") && err.contains("stop its consumers first"), "{err}");
    drop(consumer);
}

/// With `RUST_BACKTRACE=1`, as many Rust users have it set: the error's message, and no backtrace.
#[test]
fn expected_errors_print_their_message_only_even_with_rust_backtrace_set() {
    let broker = Broker::start(1);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port().to_string();
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().to_str().unwrap();
    let cases: [(&[&str], &str); 6] = [
        (
            &["topic", "describe", "nosuch", "--bootstrap", &bootstrap],
            "topic nosuch: UnknownTopicOrPartition (error code 3)",
        ),
        (&["topic", "list", "--bootstrap", &format!("127.0.0.1:{free}")], "no bootstrap broker answered"),
        (&["start", "--set", "no.such.setting=1", "--data-dir", data_dir], "no.such.setting"),
        (
            &[
                "start",
                "--listen",
                &format!("127.0.0.1:{free}"),
                "--metrics-listen",
                &format!("127.0.0.1:{taken_port}"),
                "--data-dir",
                data_dir,
            ],
            "Address already in use",
        ),
        (&["repair", "--data-dir", data_dir, "--partition", "nodash", "--truncate-at", "0"], "is not TOPIC-PARTITION"),
        (
            &[
                "quorum",
                "--node-id",
                "9",
                "--data-dir",
                data_dir,
                "--listen",
                "127.0.0.1:1",
                "--voters",
                "1@127.0.0.1:1",
            ],
            "not one of the voters",
        ),
    ];
    for (args, says) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_shardlog"))
            .args(args)
            .env("RUST_BACKTRACE", "1")
            .env_remove("RUST_LIB_BACKTRACE")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} succeeded: {err}");
        let message: Vec<&str> = err.lines().skip_while(|l| !l.starts_with("Error: ")).collect();
        assert!(!message.is_empty() && message.join("\n").contains(says), "{args:?}: no {says:?} in {err}");
        assert!(!err.to_lowercase().contains("backtrace"), "{args:?} printed a backtrace: {err}");
        assert!(message.len() <= 6, "{args:?}: the message only: {err}");
    }
    drop(taken);
}
