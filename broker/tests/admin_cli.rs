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
    assert!(!ok && err.contains("already exists"), "{err}");
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
        assert!(!ok && err.contains("InvalidReplicaAssignment (error code 39)"), "{bad}: {err}");
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
