//! Topics on the storage engine through the real binary: CreateTopics, Produce (acks 0, 1, all), Fetch,
//! ListOffsets, refusals with Kafka's error codes, and restarts after SIGKILL and SIGTERM.

mod common;

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::path::Path;

use bytes::Bytes;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, ListOffsetsRequest, ResponseKind};
use kafka_protocol::protocol::StrBytes;
use shardlog_storage::batch::build_batch;

use common::requests::{batch, create, fetch_request, name, produce_request, stored};
use common::{Broker, receive, send};

/// Produces one batch, returns (error code, base offset); `None` for acks=0.
fn produce(
    s: &mut TcpStream,
    topic: &str,
    partition: i32,
    batch: &[u8],
    acks: i16,
    correlation_id: i32,
) -> Option<(i16, i64)> {
    produce_at(s, topic, partition, batch, acks, correlation_id, 9)
}

fn produce_at(
    s: &mut TcpStream,
    topic: &str,
    partition: i32,
    batch: &[u8],
    acks: i16,
    correlation_id: i32,
    version: i16,
) -> Option<(i16, i64)> {
    send(s, ApiKey::Produce, version, correlation_id, &produce_request(topic, partition, batch, acks));
    if acks == 0 {
        return None;
    }
    let (cid, body) = receive(s, ApiKey::Produce, version);
    assert_eq!(cid, correlation_id);
    let ResponseKind::Produce(r) = body else { panic!("wrong response") };
    let p = &r.responses[0].partition_responses[0];
    Some((p.error_code, p.base_offset))
}

/// Fetches from `offset`: (error code, high watermark, records).
fn fetch(s: &mut TcpStream, topic: &str, partition: i32, offset: i64, max_wait_ms: i32) -> (i16, i64, Bytes) {
    fetch_at(s, topic, partition, offset, max_wait_ms, 11)
}

fn fetch_at(
    s: &mut TcpStream,
    topic: &str,
    partition: i32,
    offset: i64,
    max_wait_ms: i32,
    version: i16,
) -> (i16, i64, Bytes) {
    send(s, ApiKey::Fetch, version, 3, &fetch_request(topic, partition, offset, max_wait_ms));
    let (_, body) = receive(s, ApiKey::Fetch, version);
    let ResponseKind::Fetch(r) = body else { panic!("wrong response") };
    let p = &r.responses[0].partitions[0];
    (p.error_code, p.high_watermark, p.records.clone().unwrap_or_default())
}

fn list_offset(s: &mut TcpStream, topic: &str, partition: i32, timestamp: i64) -> (i16, i64) {
    list_offset_at(s, topic, partition, timestamp, 6)
}

fn list_offset_at(s: &mut TcpStream, topic: &str, partition: i32, timestamp: i64, version: i16) -> (i16, i64) {
    let req = ListOffsetsRequest::default().with_topics(vec![
        ListOffsetsTopic::default().with_name(name(topic)).with_partitions(vec![
            ListOffsetsPartition::default().with_partition_index(partition).with_timestamp(timestamp),
        ]),
    ]);
    send(s, ApiKey::ListOffsets, version, 4, &req);
    let (_, body) = receive(s, ApiKey::ListOffsets, version);
    let ResponseKind::ListOffsets(r) = body else { panic!("wrong response") };
    let p = &r.topics[0].partitions[0];
    (p.error_code, p.offset)
}

#[test]
fn create_produce_fetch_list_offsets_across_shards() {
    let broker = Broker::start(3);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "orders", 6, 1, &[("retention.ms", "3600000")]), 0);
    assert_eq!(create(&mut s, "orders", 6, 1, &[]), 36, "TOPIC_ALREADY_EXISTS");
    assert_eq!(create(&mut s, "bad name", 1, 1, &[]), 17, "INVALID_TOPIC_EXCEPTION");
    assert_eq!(create(&mut s, "replicated", 1, 3, &[]), 38, "INVALID_REPLICATION_FACTOR");
    assert_eq!(create(&mut s, "typo", 1, 1, &[("retention.hours", "1")]), 40, "INVALID_CONFIG");
    assert_eq!(create(&mut s, "none", 0, 1, &[]), 37, "INVALID_PARTITIONS");

    let mut expected = vec![Vec::new(); 6];
    for round in 0..4u8 {
        for p in 0..6 {
            let b = batch(round * 10 + p as u8, 3, 1_700_000_000_000 + round as i64);
            let (err, base) = produce(&mut s, "orders", p, &b, -1, 100 + p).unwrap();
            assert_eq!((err, base), (0, round as i64 * 3), "partition {p} round {round}");
            expected[p as usize].extend_from_slice(&stored(&b, base));
        }
    }
    for p in 0..6 {
        let (err, hw, records) = fetch(&mut s, "orders", p, 0, 0);
        assert_eq!((err, hw), (0, 12));
        assert_eq!(records.as_ref(), expected[p as usize].as_slice(), "partition {p} reads back byte for byte");
        // A fetch from inside a batch starts with that whole batch.
        let (_, _, from_middle) = fetch(&mut s, "orders", p, 4, 0);
        assert_eq!(from_middle.as_ref(), &expected[p as usize][expected[p as usize].len() / 4..]);
        assert_eq!(list_offset(&mut s, "orders", p, -2), (0, 0));
        assert_eq!(list_offset(&mut s, "orders", p, -1), (0, 12));
        assert_eq!(list_offset(&mut s, "orders", p, 1_700_000_000_002), (0, 6));
        // Every supported version encodes (the leader epoch only exists from v4 on).
        for version in 1..=6 {
            assert_eq!(list_offset_at(&mut s, "orders", p, -1, version), (0, 12), "ListOffsets v{version}");
        }
    }
    // Refusals with Kafka's codes, and nothing stored by them.
    let mut corrupt = batch(1, 1, 0);
    *corrupt.last_mut().unwrap() ^= 1;
    assert_eq!(produce(&mut s, "orders", 0, &corrupt, -1, 7), Some((2, -1)), "CORRUPT_MESSAGE");
    assert_eq!(produce(&mut s, "orders", 99, &batch(1, 1, 0), -1, 8), Some((3, -1)), "UNKNOWN_TOPIC_OR_PARTITION");
    assert_eq!(produce(&mut s, "orders", 0, &batch(1, 1, 0), 2, 9), Some((21, -1)), "INVALID_REQUIRED_ACKS");
    assert_eq!(fetch(&mut s, "orders", 0, 13, 0).0, 1, "OFFSET_OUT_OF_RANGE");
    // A negative offset is out of range too, answered with the partition's offsets as Kafka does.
    assert_eq!(fetch(&mut s, "orders", 0, -5, 0).0, 1, "OFFSET_OUT_OF_RANGE");
    assert_eq!(fetch(&mut s, "orders", 0, -5, 0).1, 12, "with the high watermark");
    assert_eq!(fetch(&mut s, "nope", 0, 0, 0).0, 3);
    assert_eq!(list_offset(&mut s, "orders", 0, -1), (0, 12));

    // acks=0 gets no answer; the next request's answer comes next, and the data is there.
    assert_eq!(produce(&mut s, "orders", 0, &batch(50, 2, 0), 0, 10), None);
    assert_eq!(produce(&mut s, "orders", 0, &batch(51, 2, 0), 1, 11), Some((0, 14)));
    // acks=0 alone: the broker syncs it in the background, so consumers see it without another produce.
    assert_eq!(produce(&mut s, "orders", 5, &batch(52, 2, 0), 0, 12), None);
    let (err, hw, _) = fetch(&mut s, "orders", 5, 12, 5_000);
    assert_eq!((err, hw), (0, 14), "acks=0 records reach the high watermark");
}

/// One produce request for many partitions of both shards, one of them twice, one unknown, and a second
/// topic between them: each partition's answer is its own (its base offset, its error), in the order
/// asked, and every batch reads back where its answer says.
#[test]
fn a_request_for_many_partitions_answers_each_with_its_own_outcome() {
    let broker = Broker::start(2);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "multi", 6, 1, &[]), 0);
    assert_eq!(create(&mut s, "other", 2, 1, &[]), 0);
    // Partition p starts with p records, so every partition's next base offset differs.
    for p in 1..6 {
        for i in 0..p {
            assert_eq!(produce(&mut s, "multi", p, &batch(i as u8, 1, 0), -1, i).unwrap(), (0, i as i64));
        }
    }
    // In the order asked: the partition, and the error and base offset it must be answered with.
    let asked: [(&str, i32, i16, i64); 8] = [
        ("multi", 5, 0, 5),
        ("multi", 0, 0, 0),
        ("multi", 3, 0, 3),
        ("other", 1, 0, 0),
        ("multi", 1, 0, 1),
        ("multi", 9, 3, -1),
        ("multi", 0, 0, 2),
        ("multi", 4, 0, 4),
    ];
    let batches: Vec<Vec<u8>> = (0..asked.len()).map(|i| batch(100 + i as u8, 2, 0)).collect();
    let mut request = produce_request("multi", 0, &[], -1);
    request.topic_data.clear();
    for ((topic, partition, ..), b) in asked.iter().zip(&batches) {
        let one = produce_request(topic, *partition, b, -1).topic_data.remove(0);
        match request.topic_data.iter_mut().find(|t| t.name == one.name) {
            Some(t) => t.partition_data.extend(one.partition_data),
            None => request.topic_data.push(one),
        }
    }
    send(&mut s, ApiKey::Produce, 9, 77, &request);
    let (cid, body) = receive(&mut s, ApiKey::Produce, 9);
    assert_eq!(cid, 77);
    let ResponseKind::Produce(answer) = body else { panic!("wrong response") };
    let answered: Vec<(String, i32, i16, i64)> = answer
        .responses
        .iter()
        .flat_map(|t| {
            t.partition_responses.iter().map(|p| (t.name.0.to_string(), p.index, p.error_code, p.base_offset))
        })
        .collect();
    // Kafka answers by topic, each topic's partitions in the order asked.
    let by_topic = asked.iter().filter(|a| a.0 == "multi").chain(asked.iter().filter(|a| a.0 == "other"));
    let expected: Vec<(String, i32, i16, i64)> = by_topic.map(|&(t, p, e, b)| (t.to_string(), p, e, b)).collect();
    assert_eq!(answered, expected);
    for (&(topic, partition, error, base), b) in asked.iter().zip(&batches) {
        if error == 0 {
            let (err, _, records) = fetch(&mut s, topic, partition, base, 0);
            assert_eq!(err, 0);
            assert!(records.starts_with(&stored(b, base)), "{topic}-{partition} holds its batch at {base}");
        }
    }
}

#[test]
fn long_poll_returns_when_data_arrives() {
    let broker = Broker::start(2);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "events", 1, 1, &[]), 0);
    let port = broker.port;
    let producer = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        let mut p = TcpStream::connect(("127.0.0.1", port)).unwrap();
        produce(&mut p, "events", 0, &batch(9, 1, 0), -1, 1).unwrap()
    });
    let (err, hw, records) = fetch(&mut s, "events", 0, 0, 10_000);
    assert_eq!((err, hw), (0, 1), "the long poll returned with the new record");
    assert!(!records.is_empty());
    assert_eq!(producer.join().unwrap(), (0, 0));
}

/// Produces 50 acknowledged batches of two records to partition 1 of a new topic "audit" with these
/// settings, kills the broker with SIGKILL, and returns the stored bytes the records were acknowledged as.
fn produce_then_sigkill(data: &Path, acks: i16, configs: &[(&str, &str)]) -> Vec<u8> {
    let mut expected = Vec::new();
    let broker = Broker::start_in(data, 2, &[]);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "audit", 2, 1, configs), 0);
    for i in 0..50u8 {
        let b = batch(i, 2, 0);
        let (err, base) = produce(&mut s, "audit", 1, &b, acks, i as i32).unwrap();
        assert_eq!(err, 0);
        expected.extend_from_slice(&stored(&b, base));
    }
    broker.kill();
    expected
}

#[test]
fn records_acknowledged_under_the_interval_policy_survive_sigkill_as_in_kafkas_page_cache() {
    // Never synced by the policy: the acknowledgement put the records into the page cache, which the
    // kernel keeps when the process dies.
    let data = tempfile::tempdir().unwrap();
    let never = i64::MAX.to_string();
    let expected = produce_then_sigkill(data.path(), 1, &[("flush.messages", &never), ("flush.ms", &never)]);
    let broker = Broker::start_in(data.path(), 2, &[]);
    let mut s = broker.connect();
    let (err, hw, records) = fetch(&mut s, "audit", 1, 0, 0);
    assert_eq!((err, hw), (0, 100), "every acknowledged record is back after kill -9");
    assert_eq!(records.as_ref(), expected.as_slice(), "at the offsets it was acknowledged with");
}

#[test]
fn acknowledged_records_survive_sigkill_and_a_clean_restart() {
    let data = tempfile::tempdir().unwrap();
    let expected = produce_then_sigkill(data.path(), -1, &[]);
    {
        let broker = Broker::start_in(data.path(), 2, &[]);
        let mut s = broker.connect();
        let (err, hw, records) = fetch(&mut s, "audit", 1, 0, 0);
        assert_eq!((err, hw), (0, 100), "every acknowledged record is back after kill -9");
        assert_eq!(records.as_ref(), expected.as_slice(), "at the offsets it was acknowledged with");
        assert_eq!(create(&mut s, "audit", 2, 1, &[]), 36, "the topic record survived too");
        assert!(broker.log().contains("recovered partition"), "after kill -9 the logs are scanned");
        assert!(
            !broker.log().contains("another process is registered"),
            "the process restarted on the same data takes over its own registration at once"
        );
        assert!(broker.terminate().success());
    }
    assert!(data.path().join(".shardlog-clean-shutdown.shard-0").exists(), "a clean stop leaves the marker");
    let broker = Broker::start_in(data.path(), 2, &[]);
    let mut s = broker.connect();
    assert_eq!(fetch(&mut s, "audit", 1, 0, 0).2.as_ref(), expected.as_slice());
    assert!(!broker.log().contains("recovered partition"), "after SIGTERM nothing is scanned: {}", broker.log());
}

/// The bytes the restarted broker validated, by its "recovered partition" lines.
fn scanned_bytes(log: &str) -> u64 {
    log.lines()
        .filter(|l| l.contains("recovered partition"))
        .filter_map(|l| {
            l.split("scanned_bytes: ").nth(1)?.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok()
        })
        .sum()
}

#[test]
fn a_restart_after_sigkill_validates_only_what_came_after_the_last_checkpoint() {
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in(data.path(), 2, &[]);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "steady", 2, 1, &[]), 0);
    // About 4 MB per partition, all in the active segment (segment.bytes is 1 GiB).
    let mut stored_bytes = 0u64;
    for i in 0..200u8 {
        for p in 0..2 {
            let b = batch(i, 100, 0);
            stored_bytes += b.len() as u64;
            assert_eq!(produce(&mut s, "steady", p, &b, -1, 1).unwrap().0, 0);
        }
    }
    // The checkpoints (the active segments' index files, then the recovery point) follow within a
    // second or so: wait until the recovery points cover everything.
    let checkpointed = |p: i32| {
        let line = format!("steady {p} 20000");
        (0..2).any(|shard| {
            let file = data.path().join(format!("recovery-point-offset-checkpoint.shard-{shard}"));
            std::fs::read_to_string(file).is_ok_and(|text| text.lines().any(|l| l == line))
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !(checkpointed(0) && checkpointed(1)) {
        assert!(std::time::Instant::now() < deadline, "no checkpoint within 60 s");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    broker.kill();
    let broker = Broker::start_in(data.path(), 2, &[]);
    let mut s = broker.connect();
    for p in 0..2 {
        assert_eq!(list_offset(&mut s, "steady", p, -1), (0, 20_000), "every record is back");
    }
    let scanned = scanned_bytes(&broker.log());
    // At most an index interval (4096 bytes) and a batch per partition, of the 8 MB stored.
    assert!(scanned <= 2 * (4096 + 10_000), "validated {scanned} of {stored_bytes} bytes:\n{}", broker.log());
}

#[test]
fn every_advertised_version_is_answered() {
    use kafka_protocol::messages::MetadataRequest;
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    let broker = Broker::start(2);
    let mut s = broker.connect();
    for version in 2..=7 {
        let topic = format!("v{version}");
        let t = CreatableTopic::default().with_name(name(&topic)).with_num_partitions(1).with_replication_factor(1);
        send(&mut s, ApiKey::CreateTopics, version, 1, &CreateTopicsRequest::default().with_topics(vec![t]));
        let (_, body) = receive(&mut s, ApiKey::CreateTopics, version);
        let ResponseKind::CreateTopics(r) = body else { panic!() };
        assert_eq!(r.topics[0].error_code, 0, "CreateTopics v{version}");
    }
    let mut next = 0;
    for version in 3..=11 {
        let (err, base) = produce_at(&mut s, "v2", 0, &batch(version as u8, 1, 0), -1, 1, version).unwrap();
        assert_eq!((err, base), (0, next), "Produce v{version}");
        next += 1;
    }
    for version in 4..=12 {
        let (err, hw, records) = fetch_at(&mut s, "v2", 0, 0, 0, version);
        assert_eq!((err, hw), (0, next), "Fetch v{version}");
        assert!(!records.is_empty());
    }
    for version in 0..=12 {
        let topics = Some(vec![MetadataRequestTopic::default().with_name(Some(name("v2")))]);
        send(&mut s, ApiKey::Metadata, version, 1, &MetadataRequest::default().with_topics(topics));
        let (_, body) = receive(&mut s, ApiKey::Metadata, version);
        let ResponseKind::Metadata(m) = body else { panic!() };
        assert_eq!(m.topics[0].partitions.len(), 1, "Metadata v{version}");
    }
}

#[test]
fn topic_admin_describe_configs_delete_records_add_partitions_delete_topics() {
    use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
    use kafka_protocol::messages::delete_records_request::{DeleteRecordsPartition, DeleteRecordsTopic};
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    use kafka_protocol::messages::{
        CreatePartitionsRequest, DeleteRecordsRequest, DeleteTopicsRequest, DescribeConfigsRequest,
    };
    let broker = Broker::start(2);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "admin", 2, 1, &[("retention.ms", "60000"), ("segment.bytes", "1048576")]), 0);

    let describe = DescribeConfigsRequest::default().with_resources(vec![
        DescribeConfigsResource::default().with_resource_type(2).with_resource_name(StrBytes::from_static_str("admin")),
        DescribeConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_static_str("missing")),
    ]);
    send(&mut s, ApiKey::DescribeConfigs, 4, 1, &describe);
    let (_, body) = receive(&mut s, ApiKey::DescribeConfigs, 4);
    let ResponseKind::DescribeConfigs(r) = body else { panic!() };
    let configs: Vec<(String, String, i8)> = r.results[0]
        .configs
        .iter()
        .map(|c| (c.name.as_str().to_string(), c.value.as_ref().unwrap().as_str().to_string(), c.config_source))
        .collect();
    assert!(configs.contains(&("retention.ms".into(), "60000".into(), 1)), "{configs:?}");
    assert!(configs.contains(&("segment.bytes".into(), "1048576".into(), 1)));
    assert!(configs.contains(&("max.message.bytes".into(), "1048588".into(), 5)));
    assert_eq!(r.results[1].error_code, 3);

    for i in 0..10u8 {
        produce(&mut s, "admin", 0, &batch(i, 1, 0), -1, 1).unwrap();
    }
    let delete = DeleteRecordsRequest::default().with_topics(vec![
        DeleteRecordsTopic::default().with_name(name("admin")).with_partitions(vec![
            DeleteRecordsPartition::default().with_partition_index(0).with_offset(4),
            DeleteRecordsPartition::default().with_partition_index(1).with_offset(5),
        ]),
    ]);
    send(&mut s, ApiKey::DeleteRecords, 2, 1, &delete);
    let (_, body) = receive(&mut s, ApiKey::DeleteRecords, 2);
    let ResponseKind::DeleteRecords(r) = body else { panic!() };
    let results: Vec<(i16, i64)> = r.topics[0].partitions.iter().map(|p| (p.error_code, p.low_watermark)).collect();
    assert_eq!(results, vec![(0, 4), (1, 0)], "partition 1 is empty: offset 5 is out of range");
    assert_eq!(list_offset(&mut s, "admin", 0, -2), (0, 4));
    assert_eq!(fetch(&mut s, "admin", 0, 2, 0).0, 1, "below the new log start");

    // No assignment is a null list, as clients send it (an empty list assigns nothing and is refused).
    let grow = CreatePartitionsRequest::default().with_topics(vec![
        CreatePartitionsTopic::default().with_name(name("admin")).with_count(5).with_assignments(None),
    ]);
    send(&mut s, ApiKey::CreatePartitions, 3, 1, &grow);
    let (_, body) = receive(&mut s, ApiKey::CreatePartitions, 3);
    let ResponseKind::CreatePartitions(r) = body else { panic!() };
    assert_eq!(r.results[0].error_code, 0);
    assert_eq!(produce(&mut s, "admin", 4, &batch(1, 1, 0), -1, 1), Some((0, 0)), "a new partition takes records");
    send(&mut s, ApiKey::CreatePartitions, 3, 1, &grow);
    let (_, body) = receive(&mut s, ApiKey::CreatePartitions, 3);
    let ResponseKind::CreatePartitions(r) = body else { panic!() };
    assert_eq!(r.results[0].error_code, 37, "INVALID_PARTITIONS: the count only grows");

    let delete_topics = DeleteTopicsRequest::default().with_topic_names(vec![name("admin"), name("missing")]);
    send(&mut s, ApiKey::DeleteTopics, 5, 1, &delete_topics);
    let (_, body) = receive(&mut s, ApiKey::DeleteTopics, 5);
    let ResponseKind::DeleteTopics(r) = body else { panic!() };
    let codes: Vec<i16> = r.responses.iter().map(|t| t.error_code).collect();
    assert_eq!(codes, vec![0, 3]);
    assert_eq!(produce(&mut s, "admin", 0, &batch(1, 1, 0), -1, 1), Some((3, -1)), "gone");
    assert_eq!(create(&mut s, "admin", 1, 1, &[]), 0, "the name can be reused");
    assert_eq!(produce(&mut s, "admin", 0, &batch(1, 1, 0), -1, 1), Some((0, 0)), "and starts empty");
}

#[test]
fn offset_for_leader_epoch_and_describe_cluster() {
    use kafka_protocol::messages::offset_for_leader_epoch_request::{OffsetForLeaderPartition, OffsetForLeaderTopic};
    use kafka_protocol::messages::{DescribeClusterRequest, OffsetForLeaderEpochRequest};
    let broker = Broker::start(2);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "epochs", 1, 1, &[]), 0);
    for i in 0..3u8 {
        produce(&mut s, "epochs", 0, &batch(i, 2, 0), -1, 1).unwrap();
    }
    let ask = |s: &mut TcpStream, current: i32, epoch: i32| {
        let req = OffsetForLeaderEpochRequest::default().with_topics(vec![
            OffsetForLeaderTopic::default().with_topic(name("epochs")).with_partitions(vec![
                OffsetForLeaderPartition::default()
                    .with_partition(0)
                    .with_current_leader_epoch(current)
                    .with_leader_epoch(epoch),
            ]),
        ]);
        send(s, ApiKey::OffsetForLeaderEpoch, 4, 1, &req);
        let (_, body) = receive(s, ApiKey::OffsetForLeaderEpoch, 4);
        let ResponseKind::OffsetForLeaderEpoch(r) = body else { panic!() };
        let p = &r.topics[0].partitions[0];
        (p.error_code, p.leader_epoch, p.end_offset)
    };
    assert_eq!(ask(&mut s, 0, 0), (0, 0, 6), "the current epoch ends at the log end");
    assert_eq!(ask(&mut s, -1, 0), (0, 0, 6), "a client without an epoch is answered too");
    assert_eq!(ask(&mut s, 3, 0), (75, -1, -1), "UNKNOWN_LEADER_EPOCH (75): the client is ahead of us");

    send(&mut s, ApiKey::DescribeCluster, 1, 1, &DescribeClusterRequest::default());
    let (_, body) = receive(&mut s, ApiKey::DescribeCluster, 1);
    let ResponseKind::DescribeCluster(r) = body else { panic!() };
    assert_eq!(r.brokers.len(), 1);
    assert_eq!((r.brokers[0].broker_id.0, r.brokers[0].port), (1, broker.port as i32));
    assert_eq!(r.controller_id.0, 1);
}

#[test]
fn alter_configs_and_incremental_alter_configs_apply_to_live_logs() {
    use kafka_protocol::messages::alter_configs_request::{AlterConfigsResource, AlterableConfig};
    use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
    use kafka_protocol::messages::incremental_alter_configs_request as inc;
    use kafka_protocol::messages::{AlterConfigsRequest, DescribeConfigsRequest, IncrementalAlterConfigsRequest};
    let broker = Broker::start(2);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "tuned", 2, 1, &[("segment.bytes", "1048576")]), 0);
    let describe = |s: &mut TcpStream| -> BTreeMap<String, (String, i8)> {
        let req = DescribeConfigsRequest::default().with_resources(vec![
            DescribeConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(StrBytes::from_static_str("tuned")),
        ]);
        send(s, ApiKey::DescribeConfigs, 4, 1, &req);
        let (_, body) = receive(s, ApiKey::DescribeConfigs, 4);
        let ResponseKind::DescribeConfigs(r) = body else { panic!() };
        r.results[0]
            .configs
            .iter()
            .map(|c| (c.name.as_str().to_string(), (c.value.as_ref().unwrap().as_str().to_string(), c.config_source)))
            .collect()
    };
    let incremental = |s: &mut TcpStream, topic: &str, edits: &[(&str, i8, Option<&str>)]| -> i16 {
        let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
            inc::AlterConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(StrBytes::from_string(topic.to_string()))
                .with_configs(
                    edits
                        .iter()
                        .map(|(k, op, v)| {
                            inc::AlterableConfig::default()
                                .with_name(StrBytes::from_string(k.to_string()))
                                .with_config_operation(*op)
                                .with_value(v.map(|v| StrBytes::from_string(v.to_string())))
                        })
                        .collect(),
                ),
        ]);
        send(s, ApiKey::IncrementalAlterConfigs, 1, 1, &req);
        let (_, body) = receive(s, ApiKey::IncrementalAlterConfigs, 1);
        let ResponseKind::IncrementalAlterConfigs(r) = body else { panic!() };
        r.responses[0].error_code
    };
    // SET one, DELETE another: the deleted one is back to its default.
    assert_eq!(incremental(&mut s, "tuned", &[("max.message.bytes", 0, Some("2000")), ("segment.bytes", 1, None)]), 0);
    let configs = describe(&mut s);
    assert_eq!(configs["max.message.bytes"], ("2000".to_string(), 1));
    assert_eq!(configs["segment.bytes"], ("1073741824".to_string(), 5));
    // The live logs use it at once: a batch over 2000 bytes is refused.
    let big = build_batch(0, &[&[7u8; 3000]]);
    assert_eq!(produce(&mut s, "tuned", 1, &big, -1, 1), Some((10, -1)), "MESSAGE_TOO_LARGE");
    assert_eq!(produce(&mut s, "tuned", 1, &batch(1, 1, 0), -1, 1), Some((0, 0)));
    assert_eq!(incremental(&mut s, "tuned", &[("retention.hours", 0, Some("1"))]), 40, "INVALID_CONFIG");
    assert_eq!(incremental(&mut s, "missing", &[("retention.ms", 0, Some("1"))]), 3);

    // cleanup.policy is a list: APPEND to the default `delete`, SUBTRACT back; not for other settings.
    assert_eq!(incremental(&mut s, "tuned", &[("cleanup.policy", 2, Some("compact"))]), 0);
    assert_eq!(describe(&mut s)["cleanup.policy"], ("compact,delete".to_string(), 1));
    assert_eq!(incremental(&mut s, "tuned", &[("cleanup.policy", 2, Some("compact"))]), 0, "present already");
    assert_eq!(describe(&mut s)["cleanup.policy"].0, "compact,delete");
    // Compacted now: a record without a key is refused.
    assert_eq!(produce(&mut s, "tuned", 1, &batch(1, 1, 0), -1, 1), Some((87, -1)), "INVALID_RECORD");
    assert_eq!(incremental(&mut s, "tuned", &[("cleanup.policy", 3, Some("delete"))]), 0);
    assert_eq!(describe(&mut s)["cleanup.policy"].0, "compact");
    assert_eq!(
        incremental(&mut s, "tuned", &[("cleanup.policy", 3, Some("compact"))]),
        40,
        "an empty list is no policy"
    );
    assert_eq!(incremental(&mut s, "tuned", &[("retention.ms", 2, Some("1"))]), 40, "not a list");
    assert_eq!(incremental(&mut s, "tuned", &[("cleanup.policy", 1, None)]), 0);
    assert_eq!(describe(&mut s)["cleanup.policy"], ("delete".to_string(), 5));

    // AlterConfigs replaces the whole set.
    let req = AlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(2)
            .with_resource_name(StrBytes::from_static_str("tuned"))
            .with_configs(vec![
                AlterableConfig::default()
                    .with_name(StrBytes::from_static_str("retention.ms"))
                    .with_value(Some(StrBytes::from_static_str("5000"))),
            ]),
    ]);
    send(&mut s, ApiKey::AlterConfigs, 2, 1, &req);
    let (_, body) = receive(&mut s, ApiKey::AlterConfigs, 2);
    let ResponseKind::AlterConfigs(r) = body else { panic!() };
    assert_eq!(r.responses[0].error_code, 0);
    let configs = describe(&mut s);
    assert_eq!(configs["retention.ms"], ("5000".to_string(), 1));
    assert_eq!(configs["max.message.bytes"].1, 5, "no longer set: back to the default");
    assert_eq!(produce(&mut s, "tuned", 1, &big, -1, 1), Some((0, 1)), "the default limit admits it again");
}
