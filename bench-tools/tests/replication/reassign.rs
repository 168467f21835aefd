//! AlterPartitionReassignments and ListPartitionReassignments against real brokers: a partition moves
//! to two other brokers while an idempotent acks=all producer keeps writing (the new replicas catch up, join the
//! ISR, leadership moves into the target and the old replicas drop their logs), every acknowledged
//! record is read back at its offset and the new replicas hold the same bytes; a move that cannot finish
//! (its new broker is down) shows as in progress in `topic describe` and ListPartitionReassignments, and
//! is cancelled back to the replicas from before; a broker down while a partition moved away from it
//! deletes its copy when it comes back.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kafka_protocol::messages::alter_partition_reassignments_request::{ReassignablePartition, ReassignableTopic};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, ApiKey, BrokerId, ListPartitionReassignmentsRequest, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use shardlog_broker::client::KafkaClient;

use crate::common::{Reports, cluster, log_bytes, partitions, wait_for};

const TOPIC: &str = "moving";

/// Runs the `shardlog` CLI against `bootstrap`: (succeeded, stdout, stderr).
fn shardlog(bootstrap: &str, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new(shardlog_bench::cluster::shardlog_binary(None))
        .args(args)
        .args(["--bootstrap", bootstrap])
        .output()
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// The partition line of `topic describe` for partition 0.
fn described(bootstrap: &str) -> String {
    let (ok, out, err) = shardlog(bootstrap, &["topic", "describe", TOPIC]);
    assert!(ok, "{err}");
    out.lines().find(|l| l.contains("Partition: 0\t")).unwrap_or_else(|| panic!("partition 0 in {out}")).to_string()
}

#[test]
fn a_partition_moves_to_other_brokers_under_load_and_a_stuck_move_is_listed_and_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = cluster(dir.path(), 4, 1, &[]);
    let bootstrap = cluster.bootstrap.clone();
    let (ok, _, err) = shardlog(&bootstrap, &["topic", "create", TOPIC, "--replica-assignment", "1:2"]);
    assert!(ok, "{err}");
    wait_for("the partition on brokers 1 and 2, both in sync", Duration::from_secs(30), || {
        partitions(cluster.addr(3), TOPIC).get(&0).is_some_and(|p| p.leader == 1 && p.isr.len() == 2)
    });

    let reports = Reports::default();
    let producer: BaseProducer<Reports> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "90000")
        .set("topic.metadata.refresh.interval.ms", "500")
        .create_with_context(reports.clone())
        .expect("producer");
    let total = 3000;
    let moved = |cluster: &shardlog_bench::cluster::Cluster| {
        partitions(cluster.addr(1), TOPIC)
            .get(&0)
            .is_some_and(|p| p.replicas == [3, 4] && p.leader == 3 && p.isr.len() == 2)
    };
    for i in 0..total {
        let value = format!("v{i:05}");
        producer.send(BaseRecord::<(), str>::to(TOPIC).partition(0).payload(&value)).expect("queued");
        producer.poll(Duration::from_millis(1));
        if i == total / 3 {
            // The whole partition moves while records keep coming: to brokers 3 and 4, 3 preferred.
            let (ok, out, err) = shardlog(&bootstrap, &["topic", "reassign", TOPIC, "--replica-assignment", "3:4"]);
            assert!(ok && out.contains("Reassigning 1 partition(s)"), "{out}{err}");
        }
        if i == 2 * total / 3 {
            // The last third goes to the new leader, after the old one gave the partition up.
            wait_for("the partition on brokers 3 and 4 only, led by 3", Duration::from_secs(60), || {
                producer.poll(Duration::from_millis(50));
                moved(&cluster)
            });
        }
    }
    producer.flush(Duration::from_secs(120)).expect("every record delivered or failed");
    let reports = reports.0.lock().unwrap().clone();
    assert_eq!(reports.len(), total, "a delivery report for every record");
    let failed: Vec<_> = reports.iter().filter(|r| !r.3).collect();
    assert!(failed.is_empty(), "every record acknowledged; failed: {:?}", &failed[..failed.len().min(5)]);

    assert!(moved(&cluster));
    let mut client = KafkaClient::connect(&bootstrap).unwrap();
    wait_for("nothing in progress once done, on every broker", Duration::from_secs(30), || {
        (1..=4).all(|b| {
            KafkaClient::connect(cluster.addr(b)).unwrap().reassignments(TOPIC, &[0]).unwrap() == BTreeMap::new()
        })
    });
    // The replicas left out drop their logs.
    wait_for("brokers 1 and 2 without the partition's log", Duration::from_secs(30), || {
        (1..=2).all(|b| !dir.path().join(format!("broker-{b}/{TOPIC}-0")).exists())
    });

    // Every acknowledged record is read back at its acknowledged offset from the new leader, once: the new
    // leader deduplicates the retries of what the old one appended but could not acknowledge.
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "reassign-test")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(TOPIC, 0, Offset::Beginning).unwrap();
    consumer.assign(&assignment).unwrap();
    let mut read: BTreeMap<i64, String> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while read.len() < total {
        assert!(Instant::now() < deadline, "read {} of {total} records", read.len());
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            read.insert(m.offset(), String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
        }
    }
    for (_, offset, value, _) in &reports {
        assert_eq!(read.get(offset), Some(value), "acknowledged record at offset {offset}");
    }
    let expected: Vec<String> = (0..total).map(|i| format!("v{i:05}")).collect();
    assert!(read.values().eq(expected.iter()), "every record once, in order, from offset 0");
    // Both new replicas hold the same bytes, and `topic describe` shows each one's log end at the HW.
    let end = total as i64;
    wait_for("both replicas at the log end", Duration::from_secs(30), || {
        described(&bootstrap).contains(&format!("HighWatermark: {end}\tReplicaLogEnds: 3:{end},4:{end}"))
    });
    let leader_bytes = log_bytes(dir.path(), 3, TOPIC, 0, end);
    assert!(!leader_bytes.is_empty());
    assert!(log_bytes(dir.path(), 4, TOPIC, 0, end) == leader_bytes, "broker 4's log differs from broker 3's");

    // A move that cannot finish: broker 2 is down, so it never catches up. The move is listed, shown by
    // `topic describe`, and cancelled back to brokers 3 and 4.
    cluster.kill(2).unwrap();
    assert_eq!(client.reassign(TOPIC, &[(0, Some(vec![3, 2]))]).unwrap(), []);
    let ongoing = (vec![3, 2, 4], vec![2], vec![4]);
    assert_eq!(client.reassignments(TOPIC, &[0]).unwrap(), BTreeMap::from([(0, ongoing)]));
    let line = described(&bootstrap);
    assert!(line.contains("Replicas: 3,2,4\t") && line.contains("AddingReplicas: 2\tRemovingReplicas: 4"), "{line}");
    assert!(line.contains("ReplicaLogEnds: 3:3000,2:-,4:3000"), "broker 2 is down: {line}");
    let (ok, out, err) = shardlog(&bootstrap, &["topic", "reassign", TOPIC, "--cancel"]);
    assert!(ok && out.contains("Cancelled the reassignment of 1 partition(s)"), "{out}{err}");
    assert_eq!(client.reassignments(TOPIC, &[0]).unwrap(), BTreeMap::new());
    wait_for("the partition back on brokers 3 and 4", Duration::from_secs(30), || {
        partitions(cluster.addr(1), TOPIC).get(&0).is_some_and(|p| p.replicas == [3, 4] && p.isr.len() == 2)
    });
    let (ok, out, _) = shardlog(&bootstrap, &["topic", "reassign", TOPIC, "--cancel"]);
    assert!(ok && out.contains("No reassignment of topic moving is in progress"), "{out}");

    // A replica moved away while its broker is down drops its log when that broker comes back: the
    // partition lives on elsewhere, so there is nothing to keep aside.
    cluster.kill(4).unwrap();
    assert_eq!(client.reassign(TOPIC, &[(0, Some(vec![3, 1]))]).unwrap(), []);
    wait_for("the partition on brokers 3 and 1", Duration::from_secs(60), || {
        partitions(cluster.addr(1), TOPIC).get(&0).is_some_and(|p| p.replicas == [3, 1] && p.isr.len() == 2)
    });
    let on_four = dir.path().join(format!("broker-4/{TOPIC}-0"));
    assert!(on_four.exists(), "broker 4 was down when the move completed");
    cluster.restart(4, 3).unwrap();
    assert!(!on_four.exists(), "broker 4 deleted the log of the partition moved away");
    let strays: Vec<String> = (std::fs::read_dir(dir.path().join("broker-4")).unwrap())
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(".stray"))
        .collect();
    assert_eq!(strays, Vec::<String>::new());

    // Refusals, with Kafka's errors: nothing to cancel, a broker twice, an unknown broker, a topic
    // that does not exist.
    let refused = |client: &mut KafkaClient, topic: &str, target: Option<Vec<i32>>| {
        client.reassign(topic, &[(0, target)]).unwrap().iter().map(|r| r.code).collect::<Vec<_>>()
    };
    assert_eq!(refused(&mut client, TOPIC, None), [85], "NO_REASSIGNMENT_IN_PROGRESS");
    assert_eq!(refused(&mut client, TOPIC, Some(vec![3, 3])), [39], "INVALID_REPLICA_ASSIGNMENT");
    assert_eq!(refused(&mut client, TOPIC, Some(vec![3, 9])), [39], "INVALID_REPLICA_ASSIGNMENT");
    assert_eq!(refused(&mut client, "nowhere", Some(vec![3])), [3], "UNKNOWN_TOPIC_OR_PARTITION");
    // v1 with allow_replication_factor_change=false refuses a target of another size; v0 allows it (above).
    let grow =
        AlterPartitionReassignmentsRequest::default().with_allow_replication_factor_change(false).with_topics(vec![
            ReassignableTopic::default().with_name(TopicName(StrBytes::from_static_str(TOPIC))).with_partitions(vec![
                ReassignablePartition::default().with_partition_index(0).with_replicas(Some(vec![
                    BrokerId(1),
                    BrokerId(3),
                    BrokerId(4),
                ])),
            ]),
        ]);
    let ResponseKind::AlterPartitionReassignments(r) =
        client.call_any(ApiKey::AlterPartitionReassignments, 1, &grow).unwrap()
    else {
        panic!("an AlterPartitionReassignments answer")
    };
    assert_eq!(r.responses[0].partitions[0].error_code, 38, "INVALID_REPLICATION_FACTOR");
    // Without topics, ListPartitionReassignments lists every partition being moved: none now.
    let all = ListPartitionReassignmentsRequest::default().with_topics(None);
    let ResponseKind::ListPartitionReassignments(r) =
        client.call_any(ApiKey::ListPartitionReassignments, 0, &all).unwrap()
    else {
        panic!("a ListPartitionReassignments answer")
    };
    assert_eq!((r.error_code, r.topics.len()), (0, 0));

    // A move is routine: the brokers say what happened at INFO and raise no alarm.
    for b in [1usize, 3, 4] {
        let log = crate::common::broker_log(dir.path(), b);
        assert!(!log.iter().any(|l| l.contains("stray")), "broker {b} set nothing aside");
        let alarm =
            |l: &&String| l.contains(" ERROR ") || (l.contains(" WARN ") && l.to_lowercase().contains("reassign"));
        let alarms: Vec<&String> = log.iter().filter(alarm).collect();
        assert!(alarms.is_empty(), "broker {b}: {alarms:?}");
    }
    let all: Vec<String> = (1..=4).flat_map(|b| crate::common::broker_log(dir.path(), b)).collect();
    assert!(all.iter().any(|l| l.contains("INFO") && l.contains("partition reassignment completed")));
}
