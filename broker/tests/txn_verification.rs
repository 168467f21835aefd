//! KIP-890 part 1 across brokers, against the real binary: three brokers ([`common::cluster`]), a
//! transactional id whose coordinator is one broker and a partition led by another. A transactional batch
//! sent to that partition's leader is verified with the coordinator over the peer protocol before
//! anything is appended: a partition not added to the transaction is refused INVALID_TXN_STATE, a batch of
//! a producer id the coordinator does not know for the id INVALID_PRODUCER_ID_MAPPING (which only the
//! coordinator can say), and in both cases the partition's log end does not move. Once AddPartitionsToTxn
//! has added the partition, the same batch is accepted and appended. Only a transaction's first batch in a
//! partition is asked about: the next ones go on with the transaction open there, until its marker.

mod common;

use std::collections::BTreeMap;
use std::net::TcpStream;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, ApiKey, EndTxnRequest, FindCoordinatorRequest, InitProducerIdRequest,
    ListOffsetsRequest, MetadataRequest, ProduceRequest, ProducerId, ResponseKind, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use shardlog_storage::batch::compute_crc;

use common::cluster::Cluster;
use common::requests::{batch, create, name};
use common::{receive, send};

const TOPIC: &str = "verified";
const TXN_ID: &str = "verify-across-brokers";
/// A transactional id the coordinators know nothing of.
const STRANGER_ID: &str = "verify-a-stranger";

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

/// Each broker's port, and each partition of `topic` with its leader (once every partition has one).
fn layout(stream: &mut TcpStream, topic: &str) -> Option<(BTreeMap<i32, u16>, BTreeMap<i32, i32>)> {
    let req = MetadataRequest::default().with_topics(Some(vec![
        kafka_protocol::messages::metadata_request::MetadataRequestTopic::default().with_name(Some(name(topic))),
    ]));
    send(stream, ApiKey::Metadata, 12, 1, &req);
    let ResponseKind::Metadata(r) = receive(stream, ApiKey::Metadata, 12).1 else { panic!("wrong response") };
    let ports = r.brokers.iter().map(|b| (b.node_id.0, b.port as u16)).collect();
    let t = r.topics.first()?;
    let leaders: BTreeMap<i32, i32> = t.partitions.iter().map(|p| (p.partition_index, p.leader_id.0)).collect();
    (t.error_code == 0 && !leaders.is_empty() && leaders.values().all(|l| *l >= 0)).then_some((ports, leaders))
}

/// The node coordinating `id`, once there is one.
fn coordinator(stream: &mut TcpStream, id: &str) -> Option<i32> {
    let req = FindCoordinatorRequest::default().with_key_type(1).with_coordinator_keys(vec![s(id)]);
    send(stream, ApiKey::FindCoordinator, 4, 1, &req);
    let ResponseKind::FindCoordinator(r) = receive(stream, ApiKey::FindCoordinator, 4).1 else {
        panic!("wrong response")
    };
    let c = &r.coordinators[0];
    (c.error_code == 0).then_some(c.node_id.0)
}

/// InitProducerId (v4) for `id`: (error code, producer id, epoch).
fn init_producer_id(stream: &mut TcpStream, id: &str) -> (i16, i64, i16) {
    let req = InitProducerIdRequest::default()
        .with_transactional_id(Some(TransactionalId(s(id))))
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    send(stream, ApiKey::InitProducerId, 4, 1, &req);
    let ResponseKind::InitProducerId(r) = receive(stream, ApiKey::InitProducerId, 4).1 else {
        panic!("wrong response")
    };
    (r.error_code, r.producer_id.0, r.producer_epoch)
}

/// A transactional batch of three records of producer `id` at `epoch`, sequence 0.
fn transactional(id: i64, epoch: i16) -> Vec<u8> {
    transactional_at(id, epoch, 0)
}

/// A transactional batch of three records of producer `id` at `epoch`, from sequence `seq`.
fn transactional_at(id: i64, epoch: i16, seq: i32) -> Vec<u8> {
    let mut b = batch(7, 3, 1_700_000_000_000);
    b[22] |= 0x10;
    b[43..51].copy_from_slice(&id.to_be_bytes());
    b[51..53].copy_from_slice(&epoch.to_be_bytes());
    b[53..57].copy_from_slice(&seq.to_be_bytes());
    let crc = compute_crc(&b);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

/// Produce (v9, acks=all) of `records` to one partition under `TXN_ID`: the partition's error code.
fn produce(stream: &mut TcpStream, partition: i32, records: &[u8]) -> i16 {
    produce_as(stream, TXN_ID, partition, records)
}

/// Produce (v9, acks=all) of `records` to one partition under `transactional_id`: the partition's error
/// code.
fn produce_as(stream: &mut TcpStream, transactional_id: &str, partition: i32, records: &[u8]) -> i16 {
    produce_at(stream, 9, transactional_id, partition, records)
}

/// [`produce_as`] at Produce `version`.
fn produce_at(stream: &mut TcpStream, version: i16, transactional_id: &str, partition: i32, records: &[u8]) -> i16 {
    let req = ProduceRequest::default()
        .with_transactional_id(Some(TransactionalId(s(transactional_id))))
        .with_acks(-1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![TopicProduceData::default().with_name(name(TOPIC)).with_partition_data(vec![
            PartitionProduceData::default().with_index(partition).with_records(Some(Bytes::copy_from_slice(records))),
        ])]);
    send(stream, ApiKey::Produce, version, 1, &req);
    let ResponseKind::Produce(r) = receive(stream, ApiKey::Produce, version).1 else { panic!("wrong response") };
    r.responses[0].partition_responses[0].error_code
}

/// The partition's log end (ListOffsets v6, latest).
fn log_end(stream: &mut TcpStream, partition: i32) -> i64 {
    let req = ListOffsetsRequest::default().with_topics(vec![
        ListOffsetsTopic::default()
            .with_name(name(TOPIC))
            .with_partitions(vec![ListOffsetsPartition::default().with_partition_index(partition).with_timestamp(-1)]),
    ]);
    send(stream, ApiKey::ListOffsets, 6, 1, &req);
    let ResponseKind::ListOffsets(r) = receive(stream, ApiKey::ListOffsets, 6).1 else { panic!("wrong response") };
    let p = &r.topics[0].partitions[0];
    assert_eq!(p.error_code, 0, "ListOffsets of partition {partition}");
    p.offset
}

/// AddPartitionsToTxn (v3) of one partition of [`TOPIC`] to the transaction of [`TXN_ID`]: its error code.
fn add_partition(stream: &mut TcpStream, (id, epoch): (i64, i16), partition: i32) -> i16 {
    let req = AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(TransactionalId(s(TXN_ID)))
        .with_v3_and_below_producer_id(ProducerId(id))
        .with_v3_and_below_producer_epoch(epoch)
        .with_v3_and_below_topics(vec![
            AddPartitionsToTxnTopic::default().with_name(name(TOPIC)).with_partitions(vec![partition]),
        ]);
    send(stream, ApiKey::AddPartitionsToTxn, 3, 1, &req);
    let ResponseKind::AddPartitionsToTxn(r) = receive(stream, ApiKey::AddPartitionsToTxn, 3).1 else {
        panic!("wrong response")
    };
    r.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code
}

/// EndTxn (v3) of the transaction of [`TXN_ID`]: its error code.
fn end_txn(stream: &mut TcpStream, (id, epoch): (i64, i16), commit: bool) -> i16 {
    let req = EndTxnRequest::default()
        .with_transactional_id(TransactionalId(s(TXN_ID)))
        .with_producer_id(ProducerId(id))
        .with_producer_epoch(epoch)
        .with_committed(commit);
    send(stream, ApiKey::EndTxn, 3, 1, &req);
    let ResponseKind::EndTxn(r) = receive(stream, ApiKey::EndTxn, 3).1 else { panic!("wrong response") };
    r.error_code
}

fn connect(port: u16) -> TcpStream {
    TcpStream::connect(("127.0.0.1", port)).expect("the broker answers")
}

/// The cluster, the coordinator of [`TXN_ID`] and a partition of [`TOPIC`] led by another broker, each
/// with a connection to it, and the producer [`TXN_ID`] was given.
struct Setup {
    _cluster: Cluster,
    /// For the transaction's own requests (AddPartitionsToTxn).
    to_coordinator: TcpStream,
    to_leader: TcpStream,
    partition: i32,
    producer: (i64, i16),
}

fn setup() -> Setup {
    let cluster = Cluster::start(&[]);
    let mut any = connect(cluster.bootstrap().split(',').next().unwrap().rsplit(':').next().unwrap().parse().unwrap());
    assert_eq!(create(&mut any, TOPIC, 6, 1, &[]), 0);
    let node = cluster.wait_for("a coordinator for the transactional id", || coordinator(&mut any, TXN_ID));
    let (ports, leaders) = cluster.wait_for("every partition to have a leader", || layout(&mut any, TOPIC));
    let (&partition, &leader) =
        leaders.iter().find(|(_, l)| **l != node).expect("six partitions are not all on one of three brokers");
    let mut to_coordinator = connect(ports[&node]);
    let retriable = [
        ResponseError::CoordinatorLoadInProgress.code(),
        ResponseError::CoordinatorNotAvailable.code(),
        ResponseError::NotCoordinator.code(),
        ResponseError::ConcurrentTransactions.code(),
    ];
    let producer = cluster.wait_until("InitProducerId at the coordinator", || {
        match init_producer_id(&mut to_coordinator, TXN_ID) {
            (0, id, epoch) => Ok((id, epoch)),
            (code, ..) if retriable.contains(&code) => Err(format!("error {code}")),
            (code, ..) => panic!("InitProducerId refused with {code}"),
        }
    });
    Setup { _cluster: cluster, to_coordinator, to_leader: connect(ports[&leader]), partition, producer }
}

#[test]
fn a_transactional_batch_for_a_partition_not_in_the_transaction_is_refused_by_the_remote_coordinator() {
    let Setup { _cluster: _kept, mut to_leader, partition, producer: (id, epoch), .. } = setup();
    let before = log_end(&mut to_leader, partition);
    let code = produce(&mut to_leader, partition, &transactional(id, epoch));
    assert_eq!(code, ResponseError::InvalidTxnState.code(), "the partition was never added to the transaction");
    // Produce v11's clients know TRANSACTION_ABORTABLE (KIP-890), and are told it instead.
    let code = produce_at(&mut to_leader, 11, TXN_ID, partition, &transactional(id, epoch));
    assert_eq!(code, ResponseError::TransactionAbortable.code(), "the same, to a v11 client");
    // Only the coordinator knows which producer id the transactional id has: this answer is its own.
    let code = produce(&mut to_leader, partition, &transactional(id + 1000, epoch));
    assert_eq!(code, ResponseError::InvalidProducerIdMapping.code(), "another producer id than the id's");
    assert_eq!(log_end(&mut to_leader, partition), before, "nothing was appended");
    // A batch that is not transactional is not asked about, and is appended.
    let code = produce(&mut to_leader, partition, &batch(1, 2, 1_700_000_000_000));
    assert_eq!(code, 0);
    assert_eq!(log_end(&mut to_leader, partition), before + 2);
}

#[test]
fn a_transactional_batch_for_a_partition_added_to_the_transaction_is_appended_after_the_remote_coordinator_says_so() {
    let Setup { _cluster: _kept, mut to_coordinator, mut to_leader, partition, producer } = setup();
    let before = log_end(&mut to_leader, partition);
    assert_eq!(
        produce(&mut to_leader, partition, &transactional(producer.0, producer.1)),
        ResponseError::InvalidTxnState.code()
    );
    assert_eq!(add_partition(&mut to_coordinator, producer, partition), 0);
    assert_eq!(produce(&mut to_leader, partition, &transactional(producer.0, producer.1)), 0, "now in the transaction");
    assert_eq!(log_end(&mut to_leader, partition), before + 3, "the batch's three records");
    // An epoch other than the id's is the coordinator's to refuse, even for a partition in the transaction;
    // on produce it is INVALID_PRODUCER_EPOCH, which producers handle (as Kafka's leaders answer it).
    let code = produce(&mut to_leader, partition, &transactional(producer.0, producer.1 + 1));
    assert_eq!(code, ResponseError::InvalidProducerEpoch.code());
    assert_eq!(log_end(&mut to_leader, partition), before + 3);
}

/// The coordinator is asked about a transaction's first batch in a partition only. To see that it is not
/// asked about the next ones, they name a transactional id the coordinators do not know the producer by:
/// asked, a coordinator would refuse them (INVALID_PRODUCER_ID_MAPPING, as above).
#[test]
fn only_the_first_batch_of_a_transaction_in_a_partition_is_asked_about_until_its_marker() {
    let Setup { _cluster: cluster, mut to_coordinator, mut to_leader, partition, producer } = setup();
    let (id, epoch) = producer;
    assert_eq!(add_partition(&mut to_coordinator, producer, partition), 0);
    assert_eq!(produce(&mut to_leader, partition, &transactional_at(id, epoch, 0)), 0, "the first batch, asked about");
    let open = log_end(&mut to_leader, partition);
    let code = produce_as(&mut to_leader, STRANGER_ID, partition, &transactional_at(id, epoch, 3));
    assert_eq!(code, 0, "its transaction is open in the partition: the coordinator is not asked");
    assert_eq!(log_end(&mut to_leader, partition), open + 3);
    // The transaction ends: its ABORT marker (one offset) closes it in the partition. The producer's next
    // batch there would open a transaction, and is asked about again.
    assert_eq!(end_txn(&mut to_coordinator, producer, false), 0);
    let aborted = open + 3 + 1;
    cluster.wait_until("the ABORT marker in the partition", || match log_end(&mut to_leader, partition) {
        end if end == aborted => Ok(()),
        end => Err(format!("log end {end}")),
    });
    let not_yet = [ResponseError::NotEnoughReplicas.code(), ResponseError::NotLeaderOrFollower.code()];
    let code = cluster.wait_until("a coordinator's answer", || {
        match produce_as(&mut to_leader, STRANGER_ID, partition, &transactional_at(id, epoch, 6)) {
            code if not_yet.contains(&code) => Err(format!("error {code}")),
            code => Ok(code),
        }
    });
    assert_eq!(code, ResponseError::InvalidProducerIdMapping.code(), "asked, and refused by the coordinator");
    assert_eq!(log_end(&mut to_leader, partition), aborted, "nothing was appended");
}
