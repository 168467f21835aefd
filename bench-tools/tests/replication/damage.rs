//! A damaged replica on three real brokers: bytes flipped in the middle of one of its older segments.
//! The broker reports the replica offline, the quorum keeps it out of the ISR and away from leadership,
//! and the broker rebuilds it by itself from the leader: the damaged part moved aside (kept), the intact
//! part kept, the rest fetched again. It rejoins the ISR through the normal catch-up, and once made
//! preferred leader again with ElectLeaders it serves every acknowledged record as it was.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures_lite::future::block_on;
use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
use kafka_protocol::messages::{ApiKey, ElectLeadersRequest, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use shardlog_broker::client::KafkaClient;

use crate::common::{Reports, broker_log, cluster, partitions, wait_for};

const TOPIC: &str = "damaged";

/// Sends `count` records `{tag}-{i}` to partition 0, acks=all; (offset, value) of each, all acknowledged.
fn produce(bootstrap: &str, tag: &str, count: usize) -> BTreeMap<i64, String> {
    let reports = Reports::default();
    let producer: BaseProducer<Reports> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("linger.ms", "5")
        // Batches of about 20 records, so the 16 KiB segments roll often.
        .set("batch.size", "2048")
        .set("message.timeout.ms", "60000")
        .create_with_context(reports.clone())
        .expect("producer");
    for i in 0..count {
        let value = format!("{tag}-{i:06}-{}", "x".repeat(80));
        producer.send(BaseRecord::<(), str>::to(TOPIC).partition(0).payload(&value)).expect("queued");
        producer.poll(Duration::ZERO);
    }
    producer.flush(Duration::from_secs(90)).expect("flushed");
    let reports = reports.0.lock().unwrap().clone();
    assert_eq!(reports.len(), count);
    assert!(reports.iter().all(|r| r.3), "every record acknowledged");
    reports.into_iter().map(|(_, offset, value, _)| (offset, value)).collect()
}

/// Every record of partition 0 as broker `addr` serves them as its leader.
fn consume_from(addr: &str, expected: usize) -> BTreeMap<i64, String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", addr)
        .set("group.id", "damage-test")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(TOPIC, 0, Offset::Beginning).unwrap();
    consumer.assign(&assignment).unwrap();
    let mut read = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while read.len() < expected {
        assert!(Instant::now() < deadline, "read {} of {expected} records", read.len());
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            read.insert(m.offset(), String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
        }
    }
    read
}

fn elect_preferred(addr: &str) -> i16 {
    let asked = vec![
        TopicPartitions::default().with_topic(TopicName(StrBytes::from_static_str(TOPIC))).with_partitions(vec![0]),
    ];
    let req =
        ElectLeadersRequest::default().with_election_type(0).with_topic_partitions(Some(asked)).with_timeout_ms(30_000);
    let answer = KafkaClient::connect(addr).unwrap().call_any(ApiKey::ElectLeaders, 2, &req).unwrap();
    let ResponseKind::ElectLeaders(r) = answer else { panic!("an ElectLeaders answer") };
    r.replica_election_results[0].partition_result[0].error_code
}

/// Flips 16 bytes in the middle of `segment` (returns its new contents) and removes the recovery-point
/// checkpoints of the stopped broker's `data` dir, so that its next start validates every segment but
/// the first.
fn flip_and_forget_the_recovery_point(segment: &Path, data: &Path) -> Vec<u8> {
    let mut bytes = std::fs::read(segment).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle..middle + 16].iter_mut().for_each(|b| *b ^= 0xff);
    std::fs::write(segment, &bytes).unwrap();
    for entry in std::fs::read_dir(data).unwrap() {
        let path = entry.unwrap().path();
        if path.file_name().unwrap().to_string_lossy().starts_with("recovery-point-offset-checkpoint") {
            std::fs::remove_file(path).unwrap();
        }
    }
    bytes
}

fn segments(partition_dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(partition_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    out.sort();
    out
}

#[test]
fn a_damaged_replica_leaves_the_isr_and_leadership_rebuilds_itself_from_the_leader_and_serves_again() {
    let dir = tempfile::tempdir().unwrap();
    let settings = ["replica.lag.time.max.ms=3000", "auto.leader.rebalance.enable=false"];
    let mut cluster = cluster(dir.path(), 3, 1, &settings);
    let bootstrap = cluster.bootstrap.clone();
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &bootstrap).create().expect("admin client");
    let replicas: &[i32] = &[1, 2, 3];
    let lists = [replicas];
    let new = NewTopic::new(TOPIC, 1, TopicReplication::Variable(&lists))
        .set("min.insync.replicas", "2")
        .set("segment.bytes", "16384");
    let created = block_on(admin.create_topics([&new], &AdminOptions::new())).expect("CreateTopics");
    assert!(created.iter().all(Result::is_ok), "{created:?}");
    wait_for("broker 1 leading with three in sync", Duration::from_secs(30), || {
        (1..=3).all(|b| partitions(cluster.addr(b), TOPIC).get(&0).is_some_and(|p| p.leader == 1 && p.isr.len() == 3))
    });
    let mut acknowledged = produce(&bootstrap, "before", 2_000);

    // Broker 1 dies; 16 bytes in the middle of one of its older segments flip while it is down. Without
    // its recovery-point checkpoint, the next start validates every segment and finds the damage.
    cluster.kill(1).unwrap();
    let broker_dir = dir.path().join("broker-1");
    let partition_dir = broker_dir.join(format!("{TOPIC}-0"));
    let files = segments(&partition_dir);
    assert!(files.len() >= 4, "several segments: {files:?}");
    let victim = &files[1];
    let bytes = flip_and_forget_the_recovery_point(victim, &broker_dir);
    cluster.restart(1, 3).unwrap();

    // The damage is reported, the replica rebuilt from the leader, and it rejoins the ISR by catching up.
    wait_for("broker 1 back in the ISR", Duration::from_secs(60), || {
        partitions(cluster.addr(2), TOPIC).get(&0).is_some_and(|p| p.isr.len() == 3 && p.offline.is_empty())
    });
    let log = broker_log(dir.path(), 1);
    let position =
        |what: &str| log.iter().position(|l| l.contains(what)).unwrap_or_else(|| panic!("{what}:\n{log:#?}"));
    let reported = position("told the quorum this replica is offline");
    let rebuilt = position("damaged replica cut before its damage");
    let back = position("told the quorum this replica is back");
    assert!(reported < rebuilt && rebuilt < back, "reported, then rebuilt, then back:\n{log:#?}");
    assert!(
        log[position("partition offline: its log is damaged")].contains(victim.to_str().unwrap()),
        "the ERROR names the file"
    );
    // Never led while offline: the leader moved when it died, and nothing gave it back before it was whole.
    let leader = partitions(cluster.addr(2), TOPIC)[&0].leader;
    assert_ne!(leader, 1);

    // What was cut is kept aside, as it was: the damaged segment's bytes from the damaged batch on.
    let aside = dir.path().join("broker-1").join(format!("{TOPIC}-0.cut.1"));
    let kept: Vec<String> =
        std::fs::read_dir(&aside).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    let victim_name = victim.file_name().unwrap().to_string_lossy().into_owned();
    assert!(kept.iter().any(|n| n.starts_with(&format!("{victim_name}.from-"))), "{kept:?}");
    let cut_copy = kept.iter().find(|n| n.starts_with(&format!("{victim_name}.from-"))).unwrap();
    let from: usize = cut_copy.rsplit("from-").next().unwrap().parse().unwrap();
    assert_eq!(std::fs::read(aside.join(cut_copy)).unwrap(), bytes[from..], "the damaged bytes are kept as found");

    // The partition takes writes all along; made preferred leader again, broker 1 serves every record.
    acknowledged.extend(produce(&bootstrap, "after", 200));
    assert_eq!(elect_preferred(cluster.addr(2)), 0);
    wait_for("broker 1 leading again", Duration::from_secs(30), || {
        (1..=3).all(|b| partitions(cluster.addr(b), TOPIC).get(&0).is_some_and(|p| p.leader == 1))
    });
    let read = consume_from(cluster.addr(1), acknowledged.len());
    assert_eq!(read, acknowledged, "every acknowledged record, at its offset, as it was");

    // Damage again within the hour on the same broker: a failing disk. The whole data dir goes offline
    // instead of a second rebuild, and stays so across a restart, while the other replicas serve.
    cluster.kill(1).unwrap();
    let files = segments(&partition_dir);
    // Not the first segment: with no recovery point, the open validates every segment after it.
    let victim = &files[2];
    flip_and_forget_the_recovery_point(victim, &broker_dir);
    cluster.restart(1, 3).unwrap();
    let marker = broker_dir.join("log-dir-offline");
    wait_for("broker 1's data dir offline", Duration::from_secs(60), || marker.exists());
    wait_for("broker 1 reported offline, another broker leading", Duration::from_secs(60), || {
        partitions(cluster.addr(2), TOPIC)
            .get(&0)
            .is_some_and(|p| p.offline == [1] && p.leader != 1 && p.isr.len() == 2)
    });
    assert!(
        broker_log(dir.path(), 1)
            .iter()
            .any(|l| l.contains("ERROR") && l.contains("taking the whole data dir offline"))
    );
    assert!(!dir.path().join("broker-1").join(format!("{TOPIC}-0.cut.2")).exists(), "no second rebuild");
    // While its replica is offline, it is never made leader again, however it is asked.
    const PREFERRED_LEADER_NOT_AVAILABLE: i16 = 80;
    assert_eq!(elect_preferred(cluster.addr(2)), PREFERRED_LEADER_NOT_AVAILABLE);
    acknowledged.extend(produce(&bootstrap, "later", 100));
    cluster.kill(1).unwrap();
    cluster.restart(1, 3).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let log = broker_log(dir.path(), 1);
    assert!(log.iter().any(|l| l.contains("the data dir is offline")), "still offline after a restart");
    let p = &partitions(cluster.addr(2), TOPIC)[&0];
    assert!(p.offline == [1] && p.leader != 1, "{p:?}");
    let read = consume_from(&bootstrap, acknowledged.len());
    assert_eq!(read, acknowledged, "the other replicas serve every record");
    cluster.stop().unwrap();
}
