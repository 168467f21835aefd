//! A compacted topic on three brokers: every replica compacts its own copy (their segment files shrink
//! on each broker, though they are not the same bytes: each cleans on its own schedule, so no
//! byte-for-byte comparison applies here), and after the leader is killed with SIGKILL a consumer reads
//! the latest record of every key from the new leader, offsets only going up.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use shardlog_broker::client::KafkaClient;

use crate::common::{all_led_with_isr, cluster, partitions, wait_for};

const TOPIC: &str = "compacted";
const KEYS: usize = 40;
const RECORDS: usize = 10_000;
const DELETED: usize = 4;

fn model() -> BTreeMap<String, Option<String>> {
    let mut last = BTreeMap::new();
    for i in 0..RECORDS {
        last.insert(format!("key-{}", i % KEYS), Some(format!("value-{i}")));
    }
    for k in 0..DELETED {
        last.insert(format!("key-{k}"), None);
    }
    last
}

/// Bytes of the partition's segment files on one broker.
fn replica_bytes(dir: &Path, broker: usize) -> u64 {
    let partition_dir = dir.join(format!("broker-{broker}")).join(format!("{TOPIC}-0"));
    std::fs::read_dir(&partition_dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
                .map(|e| e.metadata().map_or(0, |m| m.len()))
                .sum()
        })
        .unwrap_or(u64::MAX)
}

/// Reads the partition from its start to `end` through `bootstrap`: the last record of each key, and
/// how many records there were. Offsets must only go up.
fn read_latest(bootstrap: &str, end: i64) -> (BTreeMap<String, Option<String>>, usize) {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "compaction-replicas")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(TOPIC, 0, Offset::Beginning).unwrap();
    consumer.assign(&assignment).unwrap();
    let (mut latest, mut count, mut last) = (BTreeMap::new(), 0, -1);
    let deadline = Instant::now() + Duration::from_secs(120);
    while last + 1 < end {
        assert!(Instant::now() < deadline, "read to offset {end} in time (at {last})");
        let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) else { continue };
        assert!(m.offset() > last, "offset {} after {last}", m.offset());
        last = m.offset();
        count += 1;
        let key = String::from_utf8(m.key().unwrap().to_vec()).unwrap();
        latest.insert(key, m.payload().map(|v| String::from_utf8(v.to_vec()).unwrap()));
    }
    (latest, count)
}

#[test]
fn every_replica_compacts_its_own_copy_and_a_new_leader_serves_the_latest_records() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = cluster(dir.path(), 3, 1, &["log.cleaner.backoff.ms=200"]);
    let bootstrap = cluster.bootstrap.clone();
    let mut admin = KafkaClient::connect(&bootstrap).unwrap();
    let configs: Vec<(String, String)> =
        [("cleanup.policy", "compact"), ("segment.bytes", "16384"), ("min.cleanable.dirty.ratio", "0.01")]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    admin.create_topic(TOPIC, 1, 3, &configs).unwrap();
    wait_for("the partition led with a full ISR", Duration::from_secs(30), || {
        all_led_with_isr(cluster.addr(1), TOPIC, 1, 3)
    });

    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("acks", "all")
        .set("linger.ms", "2")
        // Batches of at most 8 KiB: the cleaner never touches the active segment, and a last batch of
        // thousands of records (librdkafka's default batch.size is 1 MB, reached when acknowledgements
        // lag on a loaded machine) would stay there whole, above what the check below allows.
        .set("batch.size", "8192")
        .create()
        .unwrap();
    let send = |record: BaseRecord<'_, String, String>| {
        let mut record = record;
        loop {
            match producer.send(record) {
                Ok(()) => return,
                Err((_, r)) => {
                    record = r;
                    producer.poll(Duration::from_millis(5));
                }
            }
        }
    };
    for i in 0..RECORDS {
        let (key, value) = (format!("key-{}", i % KEYS), format!("value-{i}"));
        send(BaseRecord::to(TOPIC).key(&key).payload(&value));
    }
    for k in 0..DELETED {
        let key = format!("key-{k}");
        send(BaseRecord::to(TOPIC).key(&key));
    }
    producer.flush(Duration::from_secs(60)).expect("every record acknowledged");
    let end = (RECORDS + DELETED) as i64;

    // Uncompacted the partition holds well over 100 KB on each replica; each brings its own copy down.
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let sizes: Vec<u64> = (1..=3).map(|b| replica_bytes(dir.path(), b)).collect();
        if sizes.iter().all(|s| *s < 100_000) {
            break;
        }
        assert!(Instant::now() < deadline, "every replica compacted in time: {sizes:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    let (latest, count) = read_latest(&bootstrap, end);
    assert_eq!(latest, model());
    assert!(count < RECORDS / 4, "{count} records left");

    // The leader is killed: the new leader serves its own compacted copy.
    let leader = partitions(cluster.addr(1), TOPIC)[&0].leader as usize;
    cluster.kill(leader).unwrap();
    let survivor = if leader == 1 { 2 } else { 1 };
    wait_for("a new leader", Duration::from_secs(60), || {
        partitions(cluster.addr(survivor), TOPIC).get(&0).is_some_and(|p| p.leader > 0 && p.leader as usize != leader)
    });
    let survivors: Vec<&str> = (1..=3).filter(|id| *id != leader).map(|id| cluster.addr(id)).collect();
    let (latest, _) = read_latest(&survivors.join(","), end);
    assert_eq!(latest, model(), "the new leader's copy holds the latest record of every key");

    // The old leader comes back and catches up from the new one.
    cluster.restart(leader, 3).unwrap();
    wait_for("the ISR whole again", Duration::from_secs(60), || all_led_with_isr(cluster.addr(1), TOPIC, 1, 3));
}
