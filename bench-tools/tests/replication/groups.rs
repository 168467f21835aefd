//! A consumer group on three brokers: `__consumer_offsets` is replicated like any topic, so when the
//! broker coordinating the group (the leader of its offsets partition) is killed with SIGKILL, the group
//! moves to the partition's new leader, which rebuilds it from its replica: the committed offsets are
//! still there, the member goes on consuming and committing, and a new member resumes at the commits.
//! A consumer-protocol (KIP-848) group moves the same way, with its members, epochs and assignments:
//! rebuilt from its records, not rebalanced.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use shardlog_bench::cluster::Cluster;
use shardlog_broker::client::KafkaClient;
use shardlog_broker::group::{OFFSETS_TOPIC, offsets_partition};

use crate::common::{all_led_with_isr, cluster, partitions, wait_for};

const TOPIC: &str = "grouped";
const GROUP: &str = "failover-group";
const OFFSETS_PARTITIONS: u32 = 6;

fn consumer(bootstrap: &str) -> BaseConsumer {
    consumer_of(bootstrap, GROUP, "classic")
}

/// A member of `group` speaking `protocol` (`group.protocol`: classic or consumer).
fn consumer_of(bootstrap: &str, group: &str, protocol: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("group.protocol", protocol)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        // session.timeout.ms stays at the client's default (45 s). The member's session has to outlast
        // the failover: the brokers' own session timeout (6 s here) before the dead broker is fenced,
        // the election, the new coordinator loading the group, and the heartbeat interval (3 s) before
        // it. With 10 s the member's session expired on a loaded machine; librdkafka then counts the
        // assignment as lost and refuses every commit until the application rejoins. The consumer
        // protocol's session is the broker's `group.consumer.session.timeout.ms`, 45 s by default too.
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
    committed_of(bootstrap, GROUP)
}

fn committed_of(bootstrap: &str, group: &str) -> BTreeMap<i32, i64> {
    let reader = consumer_of(bootstrap, group, "classic");
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

/// Three brokers with [`TOPIC`] (4 partitions, each on all three) holding 600 records.
fn three_brokers_with_records(dir: &std::path::Path) -> Cluster {
    let partitions_setting = format!("offsets.topic.num.partitions={OFFSETS_PARTITIONS}");
    let cluster = cluster(dir, 3, 2, &[&partitions_setting, "group.initial.rebalance.delay.ms=0"]);
    let mut admin = KafkaClient::connect(&cluster.bootstrap).unwrap();
    admin.create_topic(TOPIC, 4, 3, &[]).unwrap();
    wait_for("every partition led with a full ISR", Duration::from_secs(30), || {
        all_led_with_isr(cluster.addr(1), TOPIC, 4, 3)
    });
    let producer: BaseProducer =
        ClientConfig::new().set("bootstrap.servers", &cluster.bootstrap).set("acks", "all").create().unwrap();
    for i in 0..600 {
        let value = i.to_string();
        producer.send(BaseRecord::<(), _>::to(TOPIC).payload(&value).partition(i % 4)).unwrap();
    }
    producer.flush(Duration::from_secs(30)).unwrap();
    cluster
}

/// Kills the broker coordinating `group` (the leader of its offsets partition, once that is replicated
/// on all three) and waits for another to lead the partition; returns the killed broker's id and the
/// survivors' addresses as a bootstrap list.
fn kill_coordinator(cluster: &mut Cluster, group: &str) -> (usize, String) {
    let offsets_partition = offsets_partition(group, OFFSETS_PARTITIONS);
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
    (coordinator, survivors.join(","))
}

/// Commits `member`'s positions, retried while its group's coordinator moves.
fn commit_while_moving(member: &BaseConsumer) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Err(e) = member.commit_consumer_state(CommitMode::Sync) {
        assert!(Instant::now() < deadline, "commit through the new coordinator: {e}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_group_moves_with_its_offsets_partition_when_the_coordinators_broker_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = three_brokers_with_records(dir.path());
    let bootstrap = cluster.bootstrap.clone();

    let member = consumer(&bootstrap);
    member.subscribe(&[TOPIC]).unwrap();
    let mut seen = consume(&member, 200, Duration::from_secs(60));
    member.commit_consumer_state(CommitMode::Sync).expect("commit");
    let before = committed(&bootstrap);
    assert_eq!(before.values().sum::<i64>(), 200, "{before:?}");

    let (coordinator, survivors) = kill_coordinator(&mut cluster, GROUP);
    assert_eq!(committed(&survivors), before, "the new coordinator rebuilt the group's offsets");

    // The member carries on with the new coordinator: consumes the rest and commits.
    seen.extend(consume(&member, 400, Duration::from_secs(90)));
    commit_while_moving(&member);
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

/// Polls every member once, adding what each consumed to `seen` as (partition, offset).
fn poll_all(members: &[BaseConsumer], seen: &mut BTreeSet<(i32, i64)>) {
    for member in members {
        if let Some(Ok(m)) = member.poll(Duration::from_millis(50)) {
            seen.insert((m.partition(), m.offset()));
        }
    }
}

/// Polls the members until `seen` holds `total` distinct records.
fn consume_by_all(members: &[BaseConsumer], seen: &mut BTreeSet<(i32, i64)>, total: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    while seen.len() < total {
        assert!(Instant::now() < deadline, "consumed {} of {total} in time", seen.len());
        poll_all(members, seen);
    }
}

/// A consumer-protocol group whose members have all reached its target.
#[derive(Debug, PartialEq, Eq)]
struct Settled {
    group_epoch: i32,
    assignment_epoch: i32,
    /// Member id -> (member epoch, its partitions, sorted).
    members: BTreeMap<String, (i32, Vec<i32>)>,
}

/// The group as ConsumerGroupDescribe shows it, once every member has reached the group's target;
/// `None` while the group is moving or reconciling.
fn settled_group(bootstrap: &str, group: &str) -> Option<Settled> {
    let mut client = KafkaClient::connect(bootstrap).ok()?;
    let described = client.describe_group(group).ok()??;
    let (group_epoch, assignment_epoch) = described.epochs?;
    let mut members = BTreeMap::new();
    for m in &described.members {
        let mut assigned: Vec<i32> = m.assigned.iter().map(|(_, p)| *p).collect();
        let mut target: Vec<i32> = m.target.as_ref()?.iter().map(|(_, p)| *p).collect();
        assigned.sort();
        target.sort();
        let epoch = m.member_epoch?;
        if epoch != group_epoch || assigned != target {
            return None;
        }
        members.insert(m.member_id.clone(), (epoch, assigned));
    }
    Some(Settled { group_epoch, assignment_epoch, members })
}

#[test]
fn a_consumer_protocol_group_moves_with_its_offsets_partition_and_keeps_its_members_and_epochs() {
    const GROUP_848: &str = "failover-848";
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = three_brokers_with_records(dir.path());
    let bootstrap = cluster.bootstrap.clone();
    let members = [consumer_of(&bootstrap, GROUP_848, "consumer"), consumer_of(&bootstrap, GROUP_848, "consumer")];
    for member in &members {
        member.subscribe(&[TOPIC]).unwrap();
    }
    // Two members, two partitions each, once both have reconciled.
    let mut seen = BTreeSet::new();
    consume_by_all(&members, &mut seen, 100, Duration::from_secs(60));
    let mut before = None;
    wait_for("the two members settle on two partitions each", Duration::from_secs(60), || {
        poll_all(&members, &mut seen);
        before = settled_group(&bootstrap, GROUP_848)
            .filter(|g| g.members.len() == 2 && g.members.values().all(|(_, parts)| parts.len() == 2));
        before.is_some()
    });
    let before = before.unwrap();
    for member in &members {
        member.commit_consumer_state(CommitMode::Sync).expect("commit");
    }
    let committed_before = committed_of(&bootstrap, GROUP_848);
    assert!(!committed_before.is_empty());

    let (_, survivors) = kill_coordinator(&mut cluster, GROUP_848);
    assert_eq!(committed_of(&survivors, GROUP_848), committed_before, "the new coordinator has the offsets");

    // The members go on with the new coordinator: everything consumed and committed.
    consume_by_all(&members, &mut seen, 600, Duration::from_secs(90));
    for member in &members {
        commit_while_moving(member);
    }
    assert_eq!(committed_of(&survivors, GROUP_848).values().sum::<i64>(), 600);
    // Rebuilt, not rebalanced: the same members at the same epochs with the same partitions.
    let mut after = None;
    wait_for("the moved group described", Duration::from_secs(30), || {
        after = settled_group(&survivors, GROUP_848);
        after.is_some()
    });
    assert_eq!(after.unwrap(), before, "the group as it was before its coordinator was killed");
    drop(members);
}
