//! Group coordinators moving between brokers: three brokers of the real binary over standalone voters
//! ([`common::cluster`]), `__consumer_offsets` and the test topics replicated three ways with
//! `min.insync.replicas=2`, and the broker coordinating a group killed with SIGKILL at a chosen moment.
//! The leader of the group's offsets partition moves to another in-sync replica, whose coordinator
//! rebuilds the group from that partition's log; the tests check what it rebuilt:
//! - committed offsets, from outside the group and from a member: every commit acknowledged before the
//!   kill is still there, no offset that was never sent is, a member keeps its place in the group, and
//!   a consumer of the group then starts at the last acknowledged commit;
//! - the classic protocol: a group caught between its members' JoinGroups reforms on the new coordinator,
//!   its two members together assigned every partition once;
//! - the consumer protocol (KIP-848): a group caught while a member has partitions to revoke settles on
//!   the new coordinator the same way.
//!
//! No test asserts how long anything takes: each waits, with a deadline, for the outcome it then checks.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use shardlog_broker::client::{DescribedGroup, KafkaClient};
use shardlog_broker::group::{OFFSETS_TOPIC, offsets_partition};

use common::cluster::Cluster;

/// Groups form without waiting for more members; few offsets partitions; an acknowledged write is on
/// two replicas at least, so it survives the loss of any one broker; consumer-protocol sessions outlast
/// a failover (a fenced broker's session, then the load) with room to spare.
const SETTINGS: [&str; 10] = [
    "--set",
    "group.initial.rebalance.delay.ms=0",
    "--set",
    "offsets.topic.num.partitions=4",
    "--set",
    "min.insync.replicas=2",
    "--set",
    "group.consumer.session.timeout.ms=15000",
    "--set",
    "group.consumer.heartbeat.interval.ms=500",
];

/// Partitions of each test topic.
const PARTITIONS: i32 = 6;

fn create_topic(client: &mut KafkaClient, topic: &str) {
    client.create_topic(topic, PARTITIONS, 3, &[]).expect("topic created");
}

/// `records` records in each partition of `topic`, acknowledged by every in-sync replica.
fn produce(bootstrap: &str, topic: &str, records: i32) {
    let producer: BaseProducer =
        ClientConfig::new().set("bootstrap.servers", bootstrap).set("acks", "all").create().unwrap();
    for partition in 0..PARTITIONS {
        for i in 0..records {
            let value = i.to_string();
            let mut record = BaseRecord::<(), _>::to(topic).payload(&value).partition(partition);
            // The local queue may fill up: poll it empty and send again.
            while let Err((_, back)) = producer.send(record) {
                producer.poll(Duration::from_millis(100));
                record = back;
            }
        }
    }
    producer.flush(Duration::from_secs(60)).expect("every record acknowledged");
}

/// The index of `group`'s coordinator, once FindCoordinator names one and every replica of the group's
/// offsets partition is in sync (so the kill that follows leaves the partition two in-sync replicas).
fn coordinator_in_sync(cluster: &Cluster, client: &mut KafkaClient, group: &str) -> usize {
    let coordinator = cluster.wait_for("FindCoordinator to name a broker", || client.coordinator(group).ok());
    cluster.wait_for("all three replicas of the group's offsets partition in sync", || {
        let metadata = client.metadata(Some(&[OFFSETS_TOPIC])).ok()?;
        let topic = metadata.topics.first()?;
        let partition = offsets_partition(group, topic.partitions.len() as u32);
        let p = topic.partitions.iter().find(|p| p.partition_index == partition)?;
        assert_eq!(p.replica_nodes.len(), 3, "the offsets partition has three replicas: {p:?}");
        (p.isr_nodes.len() == 3).then_some(())
    });
    cluster.index_of(&coordinator)
}

/// The index of the broker FindCoordinator names for `group` once it names another than `killed`; it
/// is a live broker, and answers.
fn new_coordinator(cluster: &Cluster, client: &mut KafkaClient, group: &str, killed: usize) -> usize {
    let moved_to = cluster.wait_for("FindCoordinator to name another broker than the killed one", || {
        client.coordinator(group).ok().map(|addr| cluster.index_of(&addr)).filter(|i| *i != killed)
    });
    assert!(!cluster.is_killed(moved_to), "FindCoordinator names a live broker");
    moved_to
}

/// The committer's progress, shared with the test's thread: the highest offset it has sent a commit of
/// and the highest one acknowledged (it commits 1, 2, 3, ... for every partition, one request each).
#[derive(Default)]
struct Progress {
    attempted: AtomicI64,
    acked: AtomicI64,
    stop: AtomicBool,
}

/// Commits `k` for every partition of `topic`, for k = 1, 2, ... below `bound`, until told to stop; stops
/// after an acknowledged commit (or at `bound`). Returns the errors of the commits that were not
/// acknowledged.
fn commit_until_stopped(bootstrap: &str, group: &str, topic: &str, bound: i64, progress: &Progress) -> Vec<String> {
    let mut client = KafkaClient::connect(bootstrap).expect("a broker answers");
    let mut errors = Vec::new();
    for k in 1..bound {
        progress.attempted.store(k, Ordering::SeqCst);
        let offsets: BTreeMap<i32, i64> = (0..PARTITIONS).map(|p| (p, k)).collect();
        match client.commit_offsets(group, topic, &offsets) {
            Ok(()) => {
                progress.acked.store(k, Ordering::SeqCst);
                if progress.stop.load(Ordering::SeqCst) {
                    break;
                }
            }
            Err(e) => errors.push(format!("commit of {k}: {e:#}")),
        }
    }
    errors
}

/// Every partition's committed offset in `topic`, as the group's coordinator answers OffsetFetch.
fn committed(client: &mut KafkaClient, group: &str, topic: &str) -> BTreeMap<i32, i64> {
    let all = client.committed_offsets(group).expect("OffsetFetch answered");
    all.into_iter().filter(|((t, _), _)| t == topic).map(|((_, p), o)| (p, o)).collect()
}

fn classic_consumer(bootstrap: &str, group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("max.poll.interval.ms", "30000")
        .create()
        .expect("consumer")
}

fn consumer_protocol_consumer(bootstrap: &str, group: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("group.protocol", "consumer")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .expect("consumer")
}

/// The partitions `consumer` holds now.
fn assignment(consumer: &BaseConsumer) -> Vec<i32> {
    let mut partitions: Vec<i32> = consumer.assignment().unwrap().elements().iter().map(|e| e.partition()).collect();
    partitions.sort();
    partitions
}

/// Each member's assigned partitions of `topic`, sorted, the members in sorted order.
fn assignments(group: &DescribedGroup, topic: &str) -> Vec<Vec<i32>> {
    let mut out: Vec<Vec<i32>> = group
        .members
        .iter()
        .map(|m| {
            assert!(m.assigned.iter().all(|(t, _)| t == topic), "only {topic} is assigned: {group:?}");
            let mut partitions: Vec<i32> = m.assigned.iter().map(|(_, p)| *p).collect();
            partitions.sort();
            partitions
        })
        .collect();
    out.sort();
    out
}

/// Asserts that both members are assigned partitions, and that together they are assigned every
/// partition exactly once.
fn assert_split_between_two(split: &[Vec<i32>], group: &DescribedGroup) {
    assert_eq!(split.len(), 2, "two members: {group:?}");
    assert!(split.iter().all(|s| !s.is_empty()), "both members are assigned partitions: {group:?}");
    let mut all: Vec<i32> = split.concat();
    all.sort();
    assert_eq!(all, (0..PARTITIONS).collect::<Vec<_>>(), "every partition assigned exactly once: {group:?}");
}

/// Polls both consumers until each holds what the group says one of its members is assigned.
fn wait_until_consumers_hold(cluster: &Cluster, consumers: [&BaseConsumer; 2], split: &[Vec<i32>]) {
    cluster.wait_for("both consumers to hold the assignments the coordinator describes", || {
        for consumer in consumers {
            consumer.poll(Duration::from_millis(50));
        }
        let mut held: Vec<Vec<i32>> = consumers.iter().map(|c| assignment(c)).collect();
        held.sort();
        (held == split).then_some(())
    });
}

/// `consumer`'s next message, skipping refused connections, which librdkafka may report as consume
/// errors (to the killed broker, if an answer it read still named it); no other error is expected.
fn next_message(consumer: &BaseConsumer) -> Option<(i32, i64)> {
    match consumer.poll(Duration::from_millis(100))? {
        Err(KafkaError::MessageConsumption(RDKafkaErrorCode::BrokerTransportFailure)) => None,
        other => {
            let m = other.expect("no consume error");
            Some((m.partition(), m.offset()))
        }
    }
}

#[test]
fn commits_acknowledged_before_the_coordinators_broker_is_killed_survive_it_and_a_consumer_resumes_at_them() {
    const TOPIC: &str = "commits";
    const GROUP: &str = "failover-commits";
    const RECORDS: i32 = 2000;
    let mut cluster = Cluster::start(&SETTINGS);
    let bootstrap = cluster.bootstrap();
    let mut admin = cluster.client();
    create_topic(&mut admin, TOPIC);
    produce(&bootstrap, TOPIC, RECORDS);
    let coordinator = coordinator_in_sync(&cluster, &mut admin, GROUP);

    let progress = Arc::new(Progress::default());
    let committer = {
        let (bootstrap, progress) = (bootstrap.clone(), progress.clone());
        std::thread::spawn(move || commit_until_stopped(&bootstrap, GROUP, TOPIC, RECORDS.into(), &progress))
    };
    cluster.wait_for("50 acknowledged commits", || (progress.acked.load(Ordering::SeqCst) >= 50).then_some(()));
    // Commits go on while the broker dies; at least this one was acknowledged before it did.
    let acked_before_kill = progress.acked.load(Ordering::SeqCst);
    cluster.kill(coordinator);
    new_coordinator(&cluster, &mut admin, GROUP, coordinator);

    let after_kill = committed(&mut admin, GROUP, TOPIC);
    // Sampled after the answer: no commit the answer reflects was sent later than this one.
    let attempted = progress.attempted.load(Ordering::SeqCst);
    assert_eq!(after_kill.len(), PARTITIONS as usize, "an offset for every partition: {after_kill:?}");
    for (partition, offset) in &after_kill {
        assert!(
            (acked_before_kill..=attempted).contains(offset),
            "partition {partition}: the new coordinator answers {offset}; commits up to {acked_before_kill} were \
             acknowledged before the kill, and none above {attempted} was sent"
        );
    }

    // The new coordinator takes commits too: let 20 more be acknowledged, then stop after the next.
    let more = progress.attempted.load(Ordering::SeqCst) + 20;
    cluster.wait_for("20 commits acknowledged by the new coordinator", || {
        (progress.acked.load(Ordering::SeqCst) >= more).then_some(())
    });
    progress.stop.store(true, Ordering::SeqCst);
    let errors = committer.join().expect("the committer ends");
    let last = progress.acked.load(Ordering::SeqCst);
    assert_eq!(last, progress.attempted.load(Ordering::SeqCst), "the committer stopped after an acknowledged commit");
    assert!(last < RECORDS.into(), "records are left above the last commit ({last}); errors: {errors:?}");
    let final_offsets = committed(&mut admin, GROUP, TOPIC);
    let expected: BTreeMap<i32, i64> = (0..PARTITIONS).map(|p| (p, last)).collect();
    assert_eq!(final_offsets, expected, "the last acknowledged commit is the committed offset of every partition");

    // A consumer of the group starts every partition at the committed offset: nothing below it is read
    // (no commit was made after `last`, so there is nothing to redeliver either).
    let consumer = classic_consumer(&cluster.live_bootstrap(), GROUP);
    consumer.subscribe(&[TOPIC]).unwrap();
    let mut firsts: BTreeMap<i32, i64> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while firsts.len() < PARTITIONS as usize {
        assert!(
            Instant::now() < deadline,
            "a record from every partition within 60 s; the first offsets read: {firsts:?}; the assignment: {:?}; \
             (earliest, latest) offsets: {:?}",
            assignment(&consumer),
            admin.offsets(TOPIC, PARTITIONS)
        );
        let Some((partition, offset)) = next_message(&consumer) else { continue };
        assert!(offset >= last, "partition {partition} read offset {offset}, below the commit {last}");
        firsts.entry(partition).or_insert(offset);
    }
    assert_eq!(firsts, expected, "every partition's first record is the one at the committed offset");
}

#[test]
fn a_members_commits_acknowledged_before_its_coordinators_broker_is_killed_survive_it_and_it_stays_in_the_group() {
    const TOPIC: &str = "member-commits";
    const GROUP: &str = "failover-member-commits";
    const RECORDS: i32 = 2000;
    /// A commit after every this many records read.
    const BATCH: usize = 20;
    let mut cluster = Cluster::start(&SETTINGS);
    let bootstrap = cluster.bootstrap();
    let mut admin = cluster.client();
    create_topic(&mut admin, TOPIC);
    produce(&bootstrap, TOPIC, RECORDS);
    let coordinator = coordinator_in_sync(&cluster, &mut admin, GROUP);

    let member = classic_consumer(&bootstrap, GROUP);
    member.subscribe(&[TOPIC]).unwrap();
    cluster.wait_for("the member to hold every partition", || {
        member.poll(Duration::from_millis(100));
        (assignment(&member).len() == PARTITIONS as usize).then_some(())
    });
    let described = |admin: &mut KafkaClient| admin.describe_group(GROUP).expect("DescribeGroups answered");
    let before = described(&mut admin).expect("the group exists");
    assert_eq!((before.state.as_str(), before.members.len()), ("Stable", 1), "{before:?}");

    // The member reads, and commits what it read (the next offset of each partition) after every
    // BATCH records, synchronously; its fifth acknowledged commit is followed by the kill, and it goes
    // on until five more are acknowledged.
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    let mut acked: Option<BTreeMap<i32, i64>> = None;
    let (mut acked_count, mut acked_before_kill, mut errors) = (0, None, Vec::new());
    let mut read = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while acked_before_kill.is_none() || acked_count < 10 {
        assert!(Instant::now() < deadline, "ten acknowledged commits within 120 s; errors: {errors:?}");
        let Some((partition, offset)) = next_message(&member) else { continue };
        next.insert(partition, offset + 1);
        read += 1;
        if read % BATCH != 0 {
            continue;
        }
        let mut offsets = TopicPartitionList::new();
        for (p, o) in &next {
            offsets.add_partition_offset(TOPIC, *p, Offset::Offset(*o)).unwrap();
        }
        match member.commit(&offsets, CommitMode::Sync) {
            Ok(()) => {
                acked = Some(next.clone());
                acked_count += 1;
            }
            Err(e) => errors.push(format!("commit of {next:?}: {e}")),
        }
        if acked_count == 5 && acked_before_kill.is_none() {
            acked_before_kill = acked.clone();
            cluster.kill(coordinator);
        }
    }
    let (acked_before_kill, last) = (acked_before_kill.unwrap(), acked.unwrap());
    let moved_to = new_coordinator(&cluster, &mut admin, GROUP, coordinator);

    // Every partition's committed offset is the last acknowledged commit's (the member read on, in
    // order, so no earlier commit of it is higher), which is at least the one acknowledged before the
    // kill.
    let committed_now = committed(&mut admin, GROUP, TOPIC);
    assert_eq!(committed_now, last, "the last acknowledged commit is what OffsetFetch answers; errors: {errors:?}");
    for (partition, offset) in &acked_before_kill {
        assert!(committed_now[partition] >= *offset, "partition {partition} went back below {offset}");
    }
    // The group the new coordinator rebuilt holds the same member, which never left it.
    let after = described(&mut admin).expect("the group exists");
    assert_eq!(cluster.index_of(&admin.coordinator(GROUP).unwrap()), moved_to);
    assert_eq!(after.state, "Stable", "{after:?}");
    let ids = |g: &DescribedGroup| g.members.iter().map(|m| m.member_id.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&after), ids(&before), "the member kept its place in the group across the failover");
    drop(member);

    // A new member starts every partition at the last acknowledged commit, or the log start where none
    // was made: nothing below it is read.
    let resumed = classic_consumer(&cluster.live_bootstrap(), GROUP);
    resumed.subscribe(&[TOPIC]).unwrap();
    let mut firsts: BTreeMap<i32, i64> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while firsts.len() < PARTITIONS as usize {
        assert!(Instant::now() < deadline, "a record from every partition within 60 s; the first read: {firsts:?}");
        let Some((partition, offset)) = next_message(&resumed) else { continue };
        let start = last.get(&partition).copied().unwrap_or(0);
        assert!(offset >= start, "partition {partition} read offset {offset}, below its commit {start}");
        firsts.entry(partition).or_insert(offset);
    }
    let expected: BTreeMap<i32, i64> = (0..PARTITIONS).map(|p| (p, last.get(&p).copied().unwrap_or(0))).collect();
    assert_eq!(firsts, expected, "every partition's first record is the one at its committed offset");
}

#[test]
fn a_classic_group_caught_mid_rebalance_by_its_coordinators_death_reforms_on_the_new_coordinator() {
    const TOPIC: &str = "rebalance";
    const GROUP: &str = "failover-rebalance";
    let mut cluster = Cluster::start(&SETTINGS);
    let bootstrap = cluster.bootstrap();
    let mut admin = cluster.client();
    create_topic(&mut admin, TOPIC);
    let coordinator = coordinator_in_sync(&cluster, &mut admin, GROUP);

    let first = classic_consumer(&bootstrap, GROUP);
    first.subscribe(&[TOPIC]).unwrap();
    cluster.wait_for("the first member to hold every partition", || {
        first.poll(Duration::from_millis(100));
        (assignment(&first).len() == PARTITIONS as usize).then_some(())
    });

    // The second member's JoinGroup starts a rebalance. The first, not polled, cannot give up its
    // partitions and so does not join again: the group waits for it, between JoinGroups.
    let second = classic_consumer(&bootstrap, GROUP);
    second.subscribe(&[TOPIC]).unwrap();
    let before = cluster.wait_until("the group to be rebalancing", || {
        second.poll(Duration::from_millis(100));
        match admin.describe_group(GROUP) {
            Ok(Some(g)) if g.state == "PreparingRebalance" => Ok(g),
            other => Err(format!("{other:?}")),
        }
    });
    assert_eq!(assignment(&second), Vec::<i32>::new(), "the second member holds nothing yet: {before:?}");
    cluster.kill(coordinator);
    let moved_to = new_coordinator(&cluster, &mut admin, GROUP, coordinator);

    // Both members go on polling: they find the new coordinator and the group reforms there.
    let group = cluster.wait_until("the group Stable with two members on the new coordinator", || {
        first.poll(Duration::from_millis(50));
        second.poll(Duration::from_millis(50));
        match admin.describe_group(GROUP) {
            Ok(Some(g)) if g.state == "Stable" && g.members.len() == 2 => Ok(g),
            other => Err(format!("{other:?}")),
        }
    });
    assert_eq!(
        cluster.index_of(&admin.coordinator(GROUP).unwrap()),
        moved_to,
        "the group reformed on the new coordinator"
    );
    let split = assignments(&group, TOPIC);
    assert_split_between_two(&split, &group);
    wait_until_consumers_hold(&cluster, [&first, &second], &split);
}

#[test]
fn a_consumer_protocol_group_caught_mid_reconciliation_by_its_coordinators_death_settles_on_the_new_coordinator() {
    const TOPIC: &str = "reconcile";
    const GROUP: &str = "failover-reconcile";
    let mut cluster = Cluster::start(&SETTINGS);
    let bootstrap = cluster.bootstrap();
    let mut admin = cluster.client();
    create_topic(&mut admin, TOPIC);
    let coordinator = coordinator_in_sync(&cluster, &mut admin, GROUP);

    let first = consumer_protocol_consumer(&bootstrap, GROUP);
    first.subscribe(&[TOPIC]).unwrap();
    cluster.wait_for("the first member to hold every partition", || {
        first.poll(Duration::from_millis(100));
        (assignment(&first).len() == PARTITIONS as usize).then_some(())
    });

    // The second member joins; the new target assignment takes partitions from the first, which, not
    // polled, does not revoke them: the group is caught reconciling.
    let second = consumer_protocol_consumer(&bootstrap, GROUP);
    second.subscribe(&[TOPIC]).unwrap();
    let before = cluster.wait_until("a member with partitions to revoke", || {
        second.poll(Duration::from_millis(100));
        let reconciling = |g: &DescribedGroup| {
            g.members.len() == 2
                && g.members.iter().any(|m| m.target.as_ref().is_some_and(|t| t.len() < m.assigned.len()))
        };
        match admin.describe_group(GROUP) {
            Ok(Some(g)) if reconciling(&g) => Ok(g),
            other => Err(format!("{other:?}")),
        }
    });
    cluster.kill(coordinator);
    let moved_to = new_coordinator(&cluster, &mut admin, GROUP, coordinator);

    let group = cluster.wait_until("the group reconciled, two members, on the new coordinator", || {
        first.poll(Duration::from_millis(50));
        second.poll(Duration::from_millis(50));
        let settled = |g: &DescribedGroup| {
            let Some((group_epoch, assignment_epoch)) = g.epochs else { return false };
            g.members.len() == 2
                && assignment_epoch == group_epoch
                && g.members
                    .iter()
                    .all(|m| m.member_epoch == Some(group_epoch) && m.target.as_ref() == Some(&m.assigned))
        };
        match admin.describe_group(GROUP) {
            Ok(Some(g)) if settled(&g) => Ok(g),
            other => Err(format!("{other:?}")),
        }
    });
    assert_eq!(
        cluster.index_of(&admin.coordinator(GROUP).unwrap()),
        moved_to,
        "the group settled on the new coordinator"
    );
    let (epoch_before, _) = before.epochs.expect("a consumer-protocol group has epochs");
    let (epoch_after, _) = group.epochs.unwrap();
    assert!(epoch_after >= epoch_before, "the group epoch never goes back: {before:?} then {group:?}");
    let split = assignments(&group, TOPIC);
    assert_split_between_two(&split, &group);
    wait_until_consumers_hold(&cluster, [&first, &second], &split);
}
