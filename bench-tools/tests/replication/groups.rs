//! A consumer group on three brokers: `__consumer_offsets` is replicated like any topic, so when the
//! broker coordinating the group (the leader of its offsets partition) is killed with SIGKILL, the group
//! moves to the partition's new leader, which rebuilds it from its replica: the committed offsets are
//! still there, the member goes on consuming and committing, and a new member resumes at the commits.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use shardlog_broker::client::KafkaClient;
use shardlog_broker::group::{OFFSETS_TOPIC, offsets_partition};

use crate::common::{all_led_with_isr, cluster, partitions, wait_for};

const TOPIC: &str = "grouped";
const GROUP: &str = "failover-group";
const OFFSETS_PARTITIONS: u32 = 6;

fn consumer(bootstrap: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", GROUP)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        // session.timeout.ms stays at the client's default (45 s). The member's session has to outlast
        // the failover: the brokers' own session timeout (6 s here) before the dead broker is fenced,
        // the election, the new coordinator loading the group, and the heartbeat interval (3 s) before
        // it. With 10 s the member's session expired on a loaded machine; librdkafka then counts the
        // assignment as lost and refuses every commit until the application rejoins.
        .create()
        .expect("consumer")
}

/// Polls until `count` more records arrived; returns them as (partition, offset).
fn consume(consumer: &BaseConsumer, count: usize, limit: Duration) -> Vec<(i32, i64)> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + limit;
    while seen.len() < count {
        assert!(Instant::now() < deadline, "consumed {} of {count} in time", seen.len());
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            seen.push((m.partition(), m.offset()));
        }
    }
    seen
}

/// The group's committed offsets as a consumer outside it reads them (OffsetFetch), retried while the
/// group is moving.
fn committed(bootstrap: &str) -> BTreeMap<i32, i64> {
    let reader = consumer(bootstrap);
    let mut wanted = TopicPartitionList::new();
    for p in 0..4 {
        wanted.add_partition(TOPIC, p);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match reader.committed_offsets(wanted.clone(), Duration::from_secs(10)) {
            Ok(list) => {
                return list
                    .elements()
                    .iter()
                    .filter_map(|e| match e.offset() {
                        Offset::Offset(o) => Some((e.partition(), o)),
                        _ => None,
                    })
                    .collect();
            }
            Err(e) => assert!(Instant::now() < deadline, "OffsetFetch kept failing: {e}"),
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_group_moves_with_its_offsets_partition_when_the_coordinators_broker_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let partitions_setting = format!("offsets.topic.num.partitions={OFFSETS_PARTITIONS}");
    let mut cluster = cluster(dir.path(), 3, 2, &[&partitions_setting, "group.initial.rebalance.delay.ms=0"]);
    let bootstrap = cluster.bootstrap.clone();
    let mut admin = KafkaClient::connect(&bootstrap).unwrap();
    admin.create_topic(TOPIC, 4, 3, &[]).unwrap();
    wait_for("every partition led with a full ISR", Duration::from_secs(30), || {
        all_led_with_isr(cluster.addr(1), TOPIC, 4, 3)
    });
    let producer: BaseProducer =
        ClientConfig::new().set("bootstrap.servers", &bootstrap).set("acks", "all").create().unwrap();
    for i in 0..600 {
        let value = i.to_string();
        producer.send(BaseRecord::<(), _>::to(TOPIC).payload(&value).partition(i % 4)).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();

    let member = consumer(&bootstrap);
    member.subscribe(&[TOPIC]).unwrap();
    let mut seen = consume(&member, 200, Duration::from_secs(60));
    member.commit_consumer_state(CommitMode::Sync).expect("commit");
    let before = committed(&bootstrap);
    assert_eq!(before.values().sum::<i64>(), 200, "{before:?}");

    // The coordinator: the leader of the group's offsets partition, replicated on all three brokers.
    let offsets_partition = offsets_partition(GROUP, OFFSETS_PARTITIONS);
    wait_for("the offsets partition has three in-sync replicas", Duration::from_secs(30), || {
        partitions(cluster.addr(1), OFFSETS_TOPIC).get(&offsets_partition).is_some_and(|p| p.isr.len() == 3)
    });
    let coordinator = partitions(cluster.addr(1), OFFSETS_TOPIC)[&offsets_partition].leader as usize;
    cluster.kill(coordinator).unwrap();
    let survivor = if coordinator == 1 { 2 } else { 1 };
    wait_for("the offsets partition has a new leader", Duration::from_secs(60), || {
        partitions(cluster.addr(survivor), OFFSETS_TOPIC)
            .get(&offsets_partition)
            .is_some_and(|p| p.leader > 0 && p.leader as usize != coordinator)
    });
    let survivors: Vec<&str> = (1..=3).filter(|id| *id != coordinator).map(|id| cluster.addr(id)).collect();
    let survivors = survivors.join(",");
    assert_eq!(committed(&survivors), before, "the new coordinator rebuilt the group's offsets");

    // The member carries on with the new coordinator: consumes the rest and commits.
    seen.extend(consume(&member, 400, Duration::from_secs(90)));
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(e) = member.commit_consumer_state(CommitMode::Sync) {
        assert!(Instant::now() < deadline, "commit through the new coordinator: {e}");
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(member);
    let after = committed(&survivors);
    assert_eq!(after.values().sum::<i64>(), 600, "{after:?}");
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 600, "every record consumed");

    // The killed broker comes back; the group's offsets are the same from every broker.
    cluster.restart(coordinator, 3).unwrap();
    assert_eq!(committed(&bootstrap), after);
}
