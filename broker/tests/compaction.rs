//! Log compaction against the real binary with real clients: a compacted topic written by librdkafka
//! ends up holding the latest record of every key (tombstones included) while a consumer reading all
//! along never sees an offset go back, also after a SIGKILL and restart; a record without a key is
//! refused with INVALID_RECORD; `__consumer_offsets` stays small after 100,000 offset commits and still
//! answers the last commit, before and after a SIGKILL.

mod common;

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::requests::{batch, create, name, produce_one};
use common::{Broker, receive, send};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::offset_fetch_request::{OffsetFetchRequestGroup, OffsetFetchRequestTopics};
use kafka_protocol::messages::{
    ApiKey, FindCoordinatorRequest, GroupId, OffsetCommitRequest, OffsetFetchRequest, ResponseKind,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

const TOPIC: &str = "latest";
const PARTITIONS: i32 = 2;
const KEYS: usize = 50;
const RECORDS: usize = 20_000;
/// Keys whose last record is a tombstone.
const DELETED: usize = 5;

type Key = String;
/// What a consumer read: per partition, (offset, key, value) in the order read.
type Read = BTreeMap<i32, Vec<(i64, Key, Option<String>)>>;

fn partition_of(key: usize) -> i32 {
    (key % PARTITIONS as usize) as i32
}

/// The last record of every key: a value, or `None` for a tombstone.
fn model() -> BTreeMap<Key, Option<String>> {
    let mut last = BTreeMap::new();
    for i in 0..RECORDS {
        last.insert(format!("key-{}", i % KEYS), Some(format!("value-{i}")));
    }
    for k in 0..DELETED {
        last.insert(format!("key-{k}"), None);
    }
    last
}

fn produce_history(bootstrap: &str) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("linger.ms", "2")
        // Batches of at most 8 KiB: the cleaner never touches the active segment, and a last batch of
        // thousands of records (librdkafka's default batch.size is 1 MB, reached when acknowledgements
        // lag on a loaded machine) would stay there whole, above what the check below allows.
        .set("batch.size", "8192")
        .set("message.timeout.ms", "60000")
        .create()
        .expect("producer");
    let send = |record: BaseRecord<'_, String, String>| {
        let mut record = record;
        loop {
            match producer.send(record) {
                Ok(()) => return,
                Err((_, r)) => {
                    record = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    };
    for i in 0..RECORDS {
        let key = format!("key-{}", i % KEYS);
        let value = format!("value-{i}");
        send(BaseRecord::to(TOPIC).key(&key).payload(&value).partition(partition_of(i % KEYS)));
    }
    for k in 0..DELETED {
        let key = format!("key-{k}");
        send(BaseRecord::to(TOPIC).key(&key).partition(partition_of(k)));
    }
    producer.flush(Duration::from_secs(120)).expect("every record acknowledged");
}

/// Reads every partition from its start until `done` says the read is complete (or `stop` is set).
fn read(bootstrap: &str, done: impl Fn(&Read) -> bool, stop: &AtomicBool) -> Read {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "compaction-reader")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        assignment.add_partition_offset(TOPIC, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut out: Read = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(180);
    while !done(&out) && !stop.load(Ordering::SeqCst) {
        assert!(Instant::now() < deadline, "read everything in time");
        let Some(message) = consumer.poll(Duration::from_millis(200)) else { continue };
        let m = message.expect("no consume error");
        let key = String::from_utf8(m.key().expect("every record has a key").to_vec()).unwrap();
        let value = m.payload().map(|v| String::from_utf8(v.to_vec()).unwrap());
        let seen = out.entry(m.partition()).or_default();
        if let Some((last, _, _)) = seen.last() {
            assert!(m.offset() > *last, "partition {}: offset {} after {last}", m.partition(), m.offset());
        }
        seen.push((m.offset(), key, value));
    }
    out
}

/// Whether `read` reached `ends` (each partition's log end offset).
fn reached(read: &Read, ends: &BTreeMap<i32, i64>) -> bool {
    ends.iter().all(|(p, end)| read.get(p).and_then(|r| r.last()).is_some_and(|(o, _, _)| *o + 1 >= *end))
}

fn log_ends(bootstrap: &str) -> BTreeMap<i32, i64> {
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap).create().unwrap();
    (0..PARTITIONS).map(|p| (p, consumer.fetch_watermarks(TOPIC, p, Duration::from_secs(10)).unwrap().1)).collect()
}

/// The last record of each key in what was read.
fn latest(read: &Read) -> BTreeMap<Key, Option<String>> {
    read.values().flatten().map(|(_, k, v)| (k.clone(), v.clone())).collect()
}

fn records_in(read: &Read) -> usize {
    read.values().map(Vec::len).sum()
}

#[test]
fn a_compacted_topic_keeps_the_latest_record_of_each_key_and_readers_never_go_back() {
    let data = tempfile::tempdir().unwrap();
    let extra = ["--set", "log.cleaner.backoff.ms=200"];
    let broker = Broker::start_in(data.path(), 2, &extra);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["topic", "create", TOPIC, "--partitions", &PARTITIONS.to_string(), "--replication-factor", "1"])
        .args(["--config", "cleanup.policy=compact", "--config", "segment.bytes=16384"])
        .args(["--config", "min.cleanable.dirty.ratio=0.01", "--bootstrap", &bootstrap])
        .status()
        .unwrap();
    assert!(status.success());

    // A record without a key has no place in a compacted topic.
    let mut s = broker.connect();
    let (code, _) = produce_one(&mut s, TOPIC, 0, &batch(1, 3, 1_700_000_000_000));
    assert_eq!(code, ResponseError::InvalidRecord.code(), "a keyless record is refused");

    // A reader from the start runs while the history is written and compacted.
    let stop = Arc::new(AtomicBool::new(false));
    let along = {
        let (bootstrap, stop) = (bootstrap.clone(), stop.clone());
        let want = model();
        std::thread::spawn(move || read(&bootstrap, |r| latest(r) == want, &stop))
    };
    produce_history(&bootstrap);
    let ends = log_ends(&bootstrap);
    assert_eq!(ends.values().sum::<i64>(), (RECORDS + DELETED) as i64, "offsets count every record written");
    let read_along = along.join().expect("the reader along the way saw offsets only go up");
    assert_eq!(latest(&read_along), model(), "the reader along the way ends at the latest record of each key");

    // The cleaner shrinks the topic to about a record per key (plus the active segments' tail).
    let never = AtomicBool::new(false);
    let deadline = Instant::now() + Duration::from_secs(90);
    let compacted = loop {
        let all = read(&bootstrap, |r| reached(r, &ends), &never);
        if records_in(&all) < RECORDS / 4 {
            break all;
        }
        assert!(Instant::now() < deadline, "compacted in time: still {} records", records_in(&all));
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(latest(&compacted), model(), "the latest record of every key, tombstones included");
    for (p, records) in &compacted {
        let keys: std::collections::BTreeSet<&Key> = records.iter().map(|(_, k, _)| k).collect();
        assert!(keys.iter().all(|k| partition_of(k[4..].parse().unwrap()) == *p), "keys stay in their partition");
    }

    // A SIGKILL and restart keep the compacted log as it was.
    let port = broker.port;
    broker.kill();
    let broker = Broker::start_at(data.path(), port, 2, &extra, None);
    let again = read(&bootstrap, |r| reached(r, &ends), &never);
    assert_eq!(latest(&again), model());
    assert!(records_in(&again) <= records_in(&compacted), "nothing came back");
    assert_eq!(log_ends(&bootstrap), ends, "offsets are never reused");
    let (status, log) = broker.terminate_with_log();
    assert!(status.success());
    assert!(!log.contains("WARN") && !log.contains("ERROR"), "{log}");
    stop.store(true, Ordering::SeqCst);
}

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

/// Bytes of the segment files of `__consumer_offsets-0`.
fn offsets_topic_bytes(data: &Path) -> u64 {
    let dir = data.join("__consumer_offsets-0");
    std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

fn committed(stream: &mut TcpStream) -> i64 {
    let request = OffsetFetchRequest::default().with_groups(vec![
        OffsetFetchRequestGroup::default().with_group_id(GroupId(s("g"))).with_topics(Some(vec![
            OffsetFetchRequestTopics::default().with_name(name("orders")).with_partition_indexes(vec![0]),
        ])),
    ]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        send(stream, ApiKey::OffsetFetch, 8, 1, &request);
        let (_, ResponseKind::OffsetFetch(r)) = receive(stream, ApiKey::OffsetFetch, 8) else { panic!() };
        let group = &r.groups[0];
        if group.error_code == 0 {
            return group.topics[0].partitions[0].committed_offset;
        }
        assert!(Instant::now() < deadline, "the coordinator answers: {}", group.error_code);
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_offsets_topic_stays_small_after_100000_commits() {
    const COMMITS: i64 = 100_000;
    const IN_FLIGHT: i64 = 100;
    let data = tempfile::tempdir().unwrap();
    let extra = [
        "--set",
        "offsets.topic.num.partitions=1",
        "--set",
        "offsets.topic.segment.bytes=65536",
        "--set",
        "log.cleaner.backoff.ms=200",
    ];
    let broker = Broker::start_in(data.path(), 1, &extra);
    let mut stream = broker.connect();
    assert_eq!(create(&mut stream, "orders", 1, 1, &[]), 0);
    let find = FindCoordinatorRequest::default().with_key(s("g"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        send(&mut stream, ApiKey::FindCoordinator, 3, 1, &find);
        let (_, ResponseKind::FindCoordinator(r)) = receive(&mut stream, ApiKey::FindCoordinator, 3) else { panic!() };
        if r.error_code == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "a coordinator in time");
        std::thread::sleep(Duration::from_millis(100));
    }
    committed(&mut stream);

    // Commits from a consumer that assigns itself the partition (no generation), pipelined.
    let commit = |offset: i64| {
        OffsetCommitRequest::default()
            .with_group_id(GroupId(s("g")))
            .with_generation_id_or_member_epoch(-1)
            .with_member_id(s(""))
            .with_topics(vec![OffsetCommitRequestTopic::default().with_name(name("orders")).with_partitions(vec![
                OffsetCommitRequestPartition::default().with_partition_index(0).with_committed_offset(offset),
            ])])
    };
    let mut next = 0;
    while next < COMMITS {
        let window = IN_FLIGHT.min(COMMITS - next);
        for i in 0..window {
            send(&mut stream, ApiKey::OffsetCommit, 8, i as i32, &commit(next + i));
        }
        for _ in 0..window {
            let (_, ResponseKind::OffsetCommit(r)) = receive(&mut stream, ApiKey::OffsetCommit, 8) else { panic!() };
            assert_eq!(r.topics[0].partitions[0].error_code, 0, "commit accepted");
        }
        next += window;
    }
    assert_eq!(committed(&mut stream), COMMITS - 1);

    // Each commit wrote a record of some 80 bytes: 8 MB uncompacted. The cleaner keeps the latest.
    let deadline = Instant::now() + Duration::from_secs(90);
    while offsets_topic_bytes(data.path()) > 256 << 10 {
        assert!(Instant::now() < deadline, "compacted in time: {} bytes", offsets_topic_bytes(data.path()));
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(committed(&mut stream), COMMITS - 1, "the latest commit is what is kept");

    let port = broker.port;
    broker.kill();
    let broker = Broker::start_at(data.path(), port, 1, &extra, None);
    let mut stream = broker.connect();
    assert_eq!(committed(&mut stream), COMMITS - 1, "and it is what a restarted coordinator loads");
    assert!(offsets_topic_bytes(data.path()) <= 256 << 10);
    let (status, log) = broker.terminate_with_log();
    assert!(status.success());
    assert!(!log.contains("WARN") && !log.contains("ERROR"), "{log}");
}
