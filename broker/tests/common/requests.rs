//! Requests the wire tests build again and again, and the batches they produce.

use std::net::TcpStream;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, CreateTopicsRequest, FetchRequest, ProduceRequest, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, NO_PARTITION_LEADER_EPOCH, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use shardlog_storage::batch::{build_batch, stamp};
use shardlog_storage::{LeaderEpoch, Offset};

use super::{receive, send};

pub fn name(n: &str) -> TopicName {
    TopicName(StrBytes::from_string(n.to_string()))
}

/// Creates a topic with CreateTopics v7; returns its error code.
pub fn create(s: &mut TcpStream, topic: &str, partitions: i32, replication: i16, configs: &[(&str, &str)]) -> i16 {
    let t = CreatableTopic::default()
        .with_name(name(topic))
        .with_num_partitions(partitions)
        .with_replication_factor(replication)
        .with_configs(
            configs
                .iter()
                .map(|(k, v)| {
                    CreatableTopicConfig::default()
                        .with_name(StrBytes::from_string(k.to_string()))
                        .with_value(Some(StrBytes::from_string(v.to_string())))
                })
                .collect(),
        );
    send(s, ApiKey::CreateTopics, 7, 1, &CreateTopicsRequest::default().with_topics(vec![t]).with_timeout_ms(5000));
    let (_, body) = receive(s, ApiKey::CreateTopics, 7);
    let ResponseKind::CreateTopics(r) = body else { panic!("wrong response") };
    r.topics[0].error_code
}

/// A Produce request carrying one batch for one partition.
pub fn produce_request(topic: &str, partition: i32, batch: &[u8], acks: i16) -> ProduceRequest {
    ProduceRequest::default().with_acks(acks).with_timeout_ms(5000).with_topic_data(vec![
        TopicProduceData::default().with_name(name(topic)).with_partition_data(vec![
            PartitionProduceData::default().with_index(partition).with_records(Some(Bytes::copy_from_slice(batch))),
        ]),
    ])
}

/// A Fetch request for one partition from `offset`, answered once one byte is there or `max_wait_ms` passed.
pub fn fetch_request(topic: &str, partition: i32, offset: i64, max_wait_ms: i32) -> FetchRequest {
    FetchRequest::default().with_max_wait_ms(max_wait_ms).with_min_bytes(1).with_max_bytes(50 << 20).with_topics(vec![
        FetchTopic::default().with_topic(name(topic)).with_partitions(vec![
            FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(10 << 20),
        ]),
    ])
}

/// A batch of `records` records of 100 bytes each, all with timestamp `ts`.
pub fn batch(seed: u8, records: usize, ts: i64) -> Vec<u8> {
    let values: Vec<Vec<u8>> = (0..records).map(|i| vec![seed.wrapping_add(i as u8); 100]).collect();
    let refs: Vec<&[u8]> = values.iter().map(|v| v.as_slice()).collect();
    build_batch(ts, &refs)
}

/// A batch with one record per key in `keys` (`None`: a record without a key), each with a small value.
pub fn keyed_batch(keys: &[Option<String>]) -> Vec<u8> {
    let records: Vec<Record> = (0..)
        .zip(keys)
        .map(|(i, key)| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset: i,
            // The encoder starts a new batch where offsets and sequences do not move together.
            sequence: i as i32 - 1,
            timestamp: 1_700_000_000_000 + i,
            key: key.as_ref().map(|k| Bytes::copy_from_slice(k.as_bytes())),
            value: Some(Bytes::from(format!("value {i}"))),
            headers: Default::default(),
        })
        .collect();
    let mut out = BytesMut::new();
    RecordBatchEncoder::encode(&mut out, &records, &RecordEncodeOptions { version: 2, compression: Compression::None })
        .unwrap();
    out.to_vec()
}

/// The bytes the log stores for `b` at `base`.
pub fn stored(b: &[u8], base: i64) -> Vec<u8> {
    let mut s = b.to_vec();
    stamp(&mut s, Offset(base as u64), LeaderEpoch(0));
    s
}

/// Produces one batch with acks=all (Produce v9); returns (error code, base offset).
pub fn produce_one(s: &mut TcpStream, topic: &str, partition: i32, batch: &[u8]) -> (i16, i64) {
    send(s, ApiKey::Produce, 9, 1, &produce_request(topic, partition, batch, -1));
    let (_, body) = receive(s, ApiKey::Produce, 9);
    let ResponseKind::Produce(r) = body else { panic!("wrong response") };
    let p = &r.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

/// Fetches a partition from offset 0 without waiting (Fetch v11); returns (error code, records).
pub fn fetch_all(s: &mut TcpStream, topic: &str, partition: i32) -> (i16, Bytes) {
    send(s, ApiKey::Fetch, 11, 2, &fetch_request(topic, partition, 0, 0));
    let (_, body) = receive(s, ApiKey::Fetch, 11);
    let ResponseKind::Fetch(r) = body else { panic!("wrong response") };
    let p = &r.responses[0].partitions[0];
    (p.error_code, p.records.clone().unwrap_or_default())
}

/// FindCoordinator v3 for `group`, asked again while the coordinator is being created or loaded (the
/// first ask creates the offsets topic) for up to 30 s; returns the last answer's error code.
pub fn find_coordinator(s: &mut TcpStream, group: &str) -> i16 {
    use kafka_protocol::ResponseError;
    use kafka_protocol::messages::FindCoordinatorRequest;
    let retriable = [
        ResponseError::CoordinatorNotAvailable.code(),
        ResponseError::CoordinatorLoadInProgress.code(),
        ResponseError::NotCoordinator.code(),
    ];
    let find = FindCoordinatorRequest::default().with_key(StrBytes::from_string(group.to_string()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        send(s, ApiKey::FindCoordinator, 3, 9, &find);
        let ResponseKind::FindCoordinator(r) = receive(s, ApiKey::FindCoordinator, 3).1 else {
            panic!("wrong response")
        };
        if !retriable.contains(&r.error_code) || std::time::Instant::now() > deadline {
            return r.error_code;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}
