//! Transaction requests as a transactional producer, a read_committed consumer and a coordinator send
//! them, one raw request each (kafka-protocol's client side), for the tests that check the broker's answers
//! and what lands in the partitions.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::write_txn_markers_request::{WritableTxnMarker, WritableTxnMarkerTopic};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, ApiKey, BrokerId, DescribeTransactionsRequest, EndTxnRequest, FindCoordinatorRequest,
    InitProducerIdRequest, ListOffsetsRequest, ProducerId, ResponseKind, TransactionalId, WriteTxnMarkersRequest,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{
    Compression, NO_PARTITION_LEADER_EPOCH, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions,
    TimestampType,
};

use super::requests::{fetch_request, name, produce_request};
use super::{receive, send};

/// A producer id and epoch.
pub type Producer = (i64, i16);

pub fn txn_id(id: &str) -> TransactionalId {
    TransactionalId(StrBytes::from_string(id.to_string()))
}

/// Asks `ask` again while it answers an error a client retries while a coordinator is created, loaded or
/// moved, or busy with the id (CONCURRENT_TRANSACTIONS), for up to 30 s; returns the last answer.
pub fn until_settled<T>(mut ask: impl FnMut() -> (i16, T)) -> (i16, T) {
    let retriable = [
        ResponseError::CoordinatorNotAvailable,
        ResponseError::CoordinatorLoadInProgress,
        ResponseError::NotCoordinator,
        ResponseError::ConcurrentTransactions,
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, answer) = ask();
        if !retriable.iter().any(|e| e.code() == code) || Instant::now() > deadline {
            return (code, answer);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// FindCoordinator for `id` until it has one, then InitProducerId v4 with `timeout_ms`: the producer.
pub fn init(stream: &mut TcpStream, id: &str, timeout_ms: i32) -> Producer {
    let (code, ()) = until_settled(|| {
        let req = FindCoordinatorRequest::default().with_key_type(1).with_key(txn_id(id).0);
        send(stream, ApiKey::FindCoordinator, 3, 1, &req);
        let ResponseKind::FindCoordinator(r) = receive(stream, ApiKey::FindCoordinator, 3).1 else { panic!() };
        (r.error_code, ())
    });
    assert_eq!(code, 0, "{id} has a coordinator");
    let (code, producer) = until_settled(|| {
        let req = InitProducerIdRequest::default()
            .with_transactional_id(Some(txn_id(id)))
            .with_transaction_timeout_ms(timeout_ms)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1);
        send(stream, ApiKey::InitProducerId, 4, 2, &req);
        let ResponseKind::InitProducerId(r) = receive(stream, ApiKey::InitProducerId, 4).1 else { panic!() };
        (r.error_code, (r.producer_id.0, r.producer_epoch))
    });
    assert_eq!(code, 0, "InitProducerId for {id}");
    producer
}

/// AddPartitionsToTxn v3 of one partition, asked again while the coordinator is busy: its error code.
pub fn add_partition(stream: &mut TcpStream, id: &str, producer: Producer, topic: &str, partition: i32) -> i16 {
    let req = AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(txn_id(id))
        .with_v3_and_below_producer_id(ProducerId(producer.0))
        .with_v3_and_below_producer_epoch(producer.1)
        .with_v3_and_below_topics(vec![
            AddPartitionsToTxnTopic::default().with_name(name(topic)).with_partitions(vec![partition]),
        ]);
    until_settled(|| {
        send(stream, ApiKey::AddPartitionsToTxn, 3, 3, &req);
        let ResponseKind::AddPartitionsToTxn(r) = receive(stream, ApiKey::AddPartitionsToTxn, 3).1 else { panic!() };
        (r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code, ())
    })
    .0
}

/// EndTxn at `version` (PRODUCER_FENCED is known to clients from v2 on): its error code.
pub fn end_txn(stream: &mut TcpStream, version: i16, id: &str, producer: Producer, commit: bool) -> i16 {
    let req = EndTxnRequest::default()
        .with_transactional_id(txn_id(id))
        .with_producer_id(ProducerId(producer.0))
        .with_producer_epoch(producer.1)
        .with_committed(commit);
    send(stream, ApiKey::EndTxn, version, 4, &req);
    let ResponseKind::EndTxn(r) = receive(stream, ApiKey::EndTxn, version).1 else { panic!() };
    r.error_code
}

/// A transactional v2 batch of `records` records from `producer`, sequences from `first_seq`.
pub fn transactional_batch(producer: Producer, first_seq: i32, records: i64) -> Vec<u8> {
    let records: Vec<Record> = (0..records)
        .map(|i| Record {
            transactional: true,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
            producer_id: producer.0,
            producer_epoch: producer.1,
            timestamp_type: TimestampType::Creation,
            offset: i,
            sequence: first_seq + i as i32,
            timestamp: 1_700_000_000_000 + i,
            key: None,
            value: Some(Bytes::from(format!("in transaction {i}"))),
            headers: Default::default(),
        })
        .collect();
    let mut out = BytesMut::new();
    RecordBatchEncoder::encode(&mut out, &records, &RecordEncodeOptions { version: 2, compression: Compression::None })
        .unwrap();
    out.to_vec()
}

/// Produce v9 of `batch` to partition 0 of `topic` under transactional id `id`: (error, base offset).
pub fn produce_transactional(stream: &mut TcpStream, id: &str, topic: &str, batch: &[u8]) -> (i16, i64) {
    let req = produce_request(topic, 0, batch, -1).with_transactional_id(Some(txn_id(id)));
    send(stream, ApiKey::Produce, 9, 5, &req);
    let ResponseKind::Produce(r) = receive(stream, ApiKey::Produce, 9).1 else { panic!() };
    let p = &r.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

/// ListOffsets v5 "latest" of `topic`-`partition` at `isolation` (0: the high watermark, 1: the last stable
/// offset).
pub fn latest(stream: &mut TcpStream, topic: &str, partition: i32, isolation: i8) -> i64 {
    let req =
        ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_isolation_level(isolation).with_topics(vec![
            ListOffsetsTopic::default().with_name(name(topic)).with_partitions(vec![
                ListOffsetsPartition::default().with_partition_index(partition).with_timestamp(-1),
            ]),
        ]);
    send(stream, ApiKey::ListOffsets, 5, 6, &req);
    let ResponseKind::ListOffsets(r) = receive(stream, ApiKey::ListOffsets, 5).1 else { panic!() };
    let p = &r.topics[0].partitions[0];
    assert_eq!(p.error_code, 0, "ListOffsets of {topic}-{partition}");
    p.offset
}

/// What a read_committed Fetch v11 of a partition from offset 0 answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedFetch {
    pub high_watermark: i64,
    pub last_stable_offset: i64,
    /// The aborted transactions the returned batches overlap: (producer id, first offset).
    pub aborted: Vec<(i64, i64)>,
    /// The records' bytes, as stored.
    pub records: Bytes,
}

pub fn fetch_committed(stream: &mut TcpStream, topic: &str, partition: i32) -> CommittedFetch {
    send(stream, ApiKey::Fetch, 11, 7, &fetch_request(topic, partition, 0, 0).with_isolation_level(1));
    let ResponseKind::Fetch(r) = receive(stream, ApiKey::Fetch, 11).1 else { panic!() };
    let p = &r.responses[0].partitions[0];
    assert_eq!(p.error_code, 0, "read_committed Fetch of {topic}-{partition}");
    CommittedFetch {
        high_watermark: p.high_watermark,
        last_stable_offset: p.last_stable_offset,
        aborted: p.aborted_transactions.iter().flatten().map(|a| (a.producer_id.0, a.first_offset)).collect(),
        records: p.records.clone().unwrap_or_default(),
    }
}

impl CommittedFetch {
    /// The offsets of the records a read_committed consumer keeps, as Kafka's consumer picks them: control
    /// records dropped, and a producer's transactional records dropped from the first offset of each of
    /// its aborted transactions up to its next ABORT marker.
    pub fn visible_offsets(&self) -> Vec<i64> {
        let mut batches = self.records.clone();
        let records: Vec<Record> =
            RecordBatchDecoder::decode_all(&mut batches).unwrap().into_iter().flat_map(|set| set.records).collect();
        let mut aborted = self.aborted.clone();
        aborted.sort_by_key(|&(_, first)| first);
        let mut aborted = aborted.into_iter().peekable();
        let mut skipping = std::collections::BTreeSet::new();
        let mut kept = Vec::new();
        for record in records {
            while let Some((producer_id, _)) = aborted.next_if(|&(_, first)| first <= record.offset) {
                skipping.insert(producer_id);
            }
            if record.control {
                // The key of a control record: version (i16), then its type (0: ABORT, 1: COMMIT).
                let key = record.key.as_deref().expect("a control record has a key");
                if key.len() >= 4 && i16::from_be_bytes([key[2], key[3]]) == 0 {
                    skipping.remove(&record.producer_id);
                }
            } else if !(record.transactional && skipping.contains(&record.producer_id)) {
                kept.push(record.offset);
            }
        }
        kept
    }
}

/// The producer a partition's leader remembers (DescribeProducers v0): (epoch, coordinator epoch, first
/// offset of its open transaction or -1), or `None` if it knows no such producer.
pub fn partition_producer(
    stream: &mut TcpStream,
    topic: &str,
    partition: i32,
    producer_id: i64,
) -> Option<(i32, i32, i64)> {
    use kafka_protocol::messages::DescribeProducersRequest;
    use kafka_protocol::messages::describe_producers_request::TopicRequest;
    let req = DescribeProducersRequest::default()
        .with_topics(vec![TopicRequest::default().with_name(name(topic)).with_partition_indexes(vec![partition])]);
    send(stream, ApiKey::DescribeProducers, 0, 10, &req);
    let ResponseKind::DescribeProducers(r) = receive(stream, ApiKey::DescribeProducers, 0).1 else { panic!() };
    let p = &r.topics[0].partitions[0];
    assert_eq!(p.error_code, 0, "DescribeProducers of {topic}-{partition}");
    (p.active_producers.iter())
        .find(|a| a.producer_id.0 == producer_id)
        .map(|a| (a.producer_epoch, a.coordinator_epoch, a.current_txn_start_offset))
}

/// What DescribeTransactions v0 says of one id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    pub error: i16,
    pub state: String,
    pub producer: Producer,
    pub partitions: Vec<(String, i32)>,
}

pub fn describe(stream: &mut TcpStream, id: &str) -> Described {
    let req = DescribeTransactionsRequest::default().with_transactional_ids(vec![txn_id(id)]);
    send(stream, ApiKey::DescribeTransactions, 0, 8, &req);
    let ResponseKind::DescribeTransactions(r) = receive(stream, ApiKey::DescribeTransactions, 0).1 else { panic!() };
    let t = &r.transaction_states[0];
    Described {
        error: t.error_code,
        state: t.transaction_state.to_string(),
        producer: (t.producer_id.0, t.producer_epoch),
        partitions: t.topics.iter().flat_map(|d| d.partitions.iter().map(|p| (d.topic.0.to_string(), *p))).collect(),
    }
}

/// One marker of a WriteTxnMarkers request, as a coordinator (or `kafka-transactions.sh abort`) sends it.
#[derive(Debug, Clone, Copy)]
pub struct Marker<'a> {
    pub producer: Producer,
    pub commit: bool,
    pub coordinator_epoch: i32,
    pub partitions: &'a [(&'a str, i32)],
}

/// WriteTxnMarkers v1: per marker, (topic, partition, error code) in the answer's order.
pub fn write_markers(stream: &mut TcpStream, markers: &[Marker]) -> Vec<Vec<(String, i32, i16)>> {
    let markers = markers
        .iter()
        .map(|m| {
            let topics = m
                .partitions
                .iter()
                .map(|(topic, p)| {
                    WritableTxnMarkerTopic::default().with_name(name(topic)).with_partition_indexes(vec![*p])
                })
                .collect();
            WritableTxnMarker::default()
                .with_producer_id(ProducerId(m.producer.0))
                .with_producer_epoch(m.producer.1)
                .with_transaction_result(m.commit)
                .with_coordinator_epoch(m.coordinator_epoch)
                .with_topics(topics)
        })
        .collect();
    send(stream, ApiKey::WriteTxnMarkers, 1, 9, &WriteTxnMarkersRequest::default().with_markers(markers));
    let ResponseKind::WriteTxnMarkers(r) = receive(stream, ApiKey::WriteTxnMarkers, 1).1 else { panic!() };
    r.markers
        .iter()
        .map(|m| {
            (m.topics.iter())
                .flat_map(|t| t.partitions.iter().map(|p| (t.name.0.to_string(), p.partition_index, p.error_code)))
                .collect()
        })
        .collect()
}

/// Asks `ask` until it answers `Some`, for up to `limit`; panics with `what` if it never does.
pub fn wait_for<T>(what: &str, limit: Duration, mut ask: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(answer) = ask() {
            return answer;
        }
        assert!(Instant::now() < deadline, "{what} did not happen within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}
