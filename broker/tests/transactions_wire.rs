//! The transaction coordinator's APIs against the real binary, request by request (KIP-98,
//! `transaction.version` 1): a transactional id keeps its producer id across sessions and restarts, every
//! InitProducerId bumps the epoch and fences the older instance, and bad input gets Kafka's errors with
//! nothing changed.

mod common;

use std::net::TcpStream;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, ApiKey, DescribeTransactionsRequest, FindCoordinatorRequest, InitProducerIdRequest,
    ListTransactionsRequest, ProducerId, ResponseKind,
};
use kafka_protocol::protocol::StrBytes;

use common::requests::{create, name};
use common::txn::{end_txn, txn_id, until_settled};
use common::{Broker, receive, send};

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

fn wait_for_coordinator(stream: &mut TcpStream, id: &str) {
    let (code, ()) = until_settled(|| {
        let req = FindCoordinatorRequest::default().with_key_type(1).with_key(s(id));
        send(stream, ApiKey::FindCoordinator, 3, 1, &req);
        let ResponseKind::FindCoordinator(r) = receive(stream, ApiKey::FindCoordinator, 3).1 else {
            panic!("wrong response")
        };
        (r.error_code, ())
    });
    assert_eq!(code, 0, "the id has a coordinator");
}

/// InitProducerId v4 for `id`, naming the producer it had (KIP-360) when `had` is given; (error, id, epoch).
fn init(stream: &mut TcpStream, id: &str, timeout_ms: i32, had: Option<(i64, i16)>) -> (i16, i64, i16) {
    let (code, (producer_id, epoch)) = until_settled(|| {
        let (pid, epoch) = had.unwrap_or((-1, -1));
        let req = InitProducerIdRequest::default()
            .with_transactional_id(Some(txn_id(id)))
            .with_transaction_timeout_ms(timeout_ms)
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch);
        send(stream, ApiKey::InitProducerId, 4, 2, &req);
        let ResponseKind::InitProducerId(r) = receive(stream, ApiKey::InitProducerId, 4).1 else {
            panic!("wrong response")
        };
        (r.error_code, (r.producer_id.0, r.producer_epoch))
    });
    (code, producer_id, epoch)
}

/// AddPartitionsToTxn v3: per (topic, partition), its error code.
fn add_partitions(
    stream: &mut TcpStream,
    id: &str,
    producer: (i64, i16),
    partitions: &[(&str, i32)],
) -> Vec<(String, i32, i16)> {
    let topics = partitions
        .iter()
        .map(|(topic, p)| AddPartitionsToTxnTopic::default().with_name(name(topic)).with_partitions(vec![*p]))
        .collect();
    let req = AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(txn_id(id))
        .with_v3_and_below_producer_id(ProducerId(producer.0))
        .with_v3_and_below_producer_epoch(producer.1)
        .with_v3_and_below_topics(topics);
    send(stream, ApiKey::AddPartitionsToTxn, 3, 4, &req);
    let ResponseKind::AddPartitionsToTxn(r) = receive(stream, ApiKey::AddPartitionsToTxn, 3).1 else {
        panic!("wrong response")
    };
    let mut out: Vec<(String, i32, i16)> = r
        .results_by_topic_v3_and_below
        .iter()
        .flat_map(|t| {
            t.results_by_partition.iter().map(|p| (t.name.0.to_string(), p.partition_index, p.partition_error_code))
        })
        .collect();
    out.sort();
    out
}

/// DescribeTransactions of one id: (error, state, producer id, epoch, partitions).
fn describe(stream: &mut TcpStream, id: &str) -> (i16, String, i64, i16, Vec<(String, i32)>) {
    let req = DescribeTransactionsRequest::default().with_transactional_ids(vec![txn_id(id)]);
    send(stream, ApiKey::DescribeTransactions, 0, 5, &req);
    let ResponseKind::DescribeTransactions(r) = receive(stream, ApiKey::DescribeTransactions, 0).1 else {
        panic!("wrong response")
    };
    let t = &r.transaction_states[0];
    let partitions = t.topics.iter().flat_map(|d| d.partitions.iter().map(|p| (d.topic.0.to_string(), *p))).collect();
    (t.error_code, t.transaction_state.to_string(), t.producer_id.0, t.producer_epoch, partitions)
}

/// ListTransactions v1 with state filters: (error, unknown filters, (id, state)).
fn list(stream: &mut TcpStream, states: &[&str]) -> (i16, Vec<String>, Vec<(String, String)>) {
    let req = ListTransactionsRequest::default().with_state_filters(states.iter().map(|st| s(st)).collect());
    send(stream, ApiKey::ListTransactions, 1, 6, &req);
    let ResponseKind::ListTransactions(r) = receive(stream, ApiKey::ListTransactions, 1).1 else {
        panic!("wrong response")
    };
    let unknown = r.unknown_state_filters.iter().map(|f| f.to_string()).collect();
    let mut listed: Vec<(String, String)> = r
        .transaction_states
        .iter()
        .map(|t| (t.transactional_id.0.to_string(), t.transaction_state.to_string()))
        .collect();
    listed.sort();
    (r.error_code, unknown, listed)
}

#[test]
fn a_transactional_id_keeps_its_producer_id_across_a_restart_and_each_init_fences_the_last() {
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in(data.path(), 2, &[]);
    let mut stream = broker.connect();
    wait_for_coordinator(&mut stream, "tx-a");
    let (code, producer_id, epoch) = init(&mut stream, "tx-a", 60_000, None);
    assert_eq!((code, epoch), (0, 0), "a new id starts at epoch 0");
    assert!(producer_id >= 0);
    let (code, again, epoch) = init(&mut stream, "tx-a", 60_000, None);
    assert_eq!((code, again, epoch), (0, producer_id, 1), "a second session keeps the id and bumps the epoch");

    // The first session is fenced: PRODUCER_FENCED for clients that know it, INVALID_PRODUCER_EPOCH before.
    assert_eq!(end_txn(&mut stream, 2, "tx-a", (producer_id, 0), true), ResponseError::ProducerFenced.code());
    assert_eq!(end_txn(&mut stream, 1, "tx-a", (producer_id, 0), true), ResponseError::InvalidProducerEpoch.code());
    // KIP-360: a bump that names an older epoch than the id has is refused too.
    let (code, _, _) = init(&mut stream, "tx-a", 60_000, Some((producer_id, 0)));
    assert_eq!(code, ResponseError::ProducerFenced.code());
    // A timeout past transaction.max.timeout.ms (15 min by default) is refused, nothing bumped.
    let (code, _, _) = init(&mut stream, "tx-a", 15 * 60_000 + 1, None);
    assert_eq!(code, ResponseError::InvalidTransactionTimeout.code());
    let (code, state, pid, epoch_now, partitions) = describe(&mut stream, "tx-a");
    assert_eq!((code, state.as_str(), pid, epoch_now, partitions), (0, "Empty", producer_id, 1, vec![]));
    // Its `__transaction_state` partition may still be loading (another than tx-a's).
    let (code, _) = until_settled(|| (describe(&mut stream, "never-seen").0, ()));
    assert_eq!(code, ResponseError::TransactionalIdNotFound.code());

    drop(stream);
    broker.terminate();
    let broker = Broker::start_in(data.path(), 2, &[]);
    let mut stream = broker.connect();
    wait_for_coordinator(&mut stream, "tx-a");
    let (code, after_restart, epoch) = init(&mut stream, "tx-a", 60_000, None);
    assert_eq!((code, after_restart, epoch), (0, producer_id, 2), "the id's producer id and epoch were on disk");
    let (code, unknown, listed) = list(&mut stream, &[]);
    assert_eq!((code, unknown, listed), (0, vec![], vec![("tx-a".to_string(), "Empty".to_string())]));
    broker.terminate();
}

#[test]
fn bad_transaction_requests_get_kafkas_errors_and_change_nothing() {
    let broker = Broker::start(1);
    let mut stream = broker.connect();
    assert_eq!(create(&mut stream, "t", 2, 1, &[]), 0);
    wait_for_coordinator(&mut stream, "tx-b");
    let (code, pid, epoch) = init(&mut stream, "tx-b", 60_000, None);
    assert_eq!(code, 0);
    let me = (pid, epoch);

    // EndTxn without a transaction open.
    assert_eq!(end_txn(&mut stream, 3, "tx-b", me, true), ResponseError::InvalidTxnState.code());
    // A producer id the id never had.
    assert_eq!(end_txn(&mut stream, 3, "tx-b", (pid + 1000, 0), false), ResponseError::InvalidProducerIdMapping.code());
    // An id the coordinator never saw (its partition may still be loading at first).
    let (code, ()) = until_settled(|| (end_txn(&mut stream, 3, "tx-unknown", me, true), ()));
    assert_eq!(code, ResponseError::InvalidProducerIdMapping.code());
    // A topic that does not exist fails the whole AddPartitionsToTxn; nothing is added.
    let answered = add_partitions(&mut stream, "tx-b", me, &[("t", 0), ("nope", 0)]);
    assert_eq!(
        answered,
        vec![
            ("nope".to_string(), 0, ResponseError::UnknownTopicOrPartition.code()),
            ("t".to_string(), 0, ResponseError::OperationNotAttempted.code()),
        ]
    );
    // So is an internal topic.
    let answered = add_partitions(&mut stream, "tx-b", me, &[("__transaction_state", 0)]);
    assert_eq!(answered, vec![("__transaction_state".to_string(), 0, ResponseError::UnknownTopicOrPartition.code())]);
    // So is a partition the topic does not have.
    let answered = add_partitions(&mut stream, "tx-b", me, &[("t", 2), ("t", -1)]);
    let unknown = ResponseError::UnknownTopicOrPartition.code();
    assert_eq!(answered, vec![("t".to_string(), -1, unknown), ("t".to_string(), 2, unknown)]);
    // An epoch other than the id's, older or newer (TV1 asks for the very epoch).
    for other in [epoch - 1, epoch + 1] {
        let answered = add_partitions(&mut stream, "tx-b", (pid, other), &[("t", 0)]);
        assert_eq!(answered, vec![("t".to_string(), 0, ResponseError::ProducerFenced.code())], "epoch {other}");
        assert_eq!(end_txn(&mut stream, 3, "tx-b", (pid, other), false), ResponseError::ProducerFenced.code());
    }
    let (code, state, _, _, partitions) = describe(&mut stream, "tx-b");
    assert_eq!((code, state.as_str(), partitions), (0, "Empty", vec![]), "nothing was started");

    // A partition added for real starts the transaction.
    assert_eq!(add_partitions(&mut stream, "tx-b", me, &[("t", 1)]), vec![("t".to_string(), 1, 0)]);
    let (code, state, _, _, partitions) = describe(&mut stream, "tx-b");
    assert_eq!((code, state.as_str(), partitions), (0, "Ongoing", vec![("t".to_string(), 1)]));
    let (_, unknown, listed) = list(&mut stream, &["Ongoing", "NoSuchState"]);
    assert_eq!(unknown, vec!["NoSuchState".to_string()]);
    assert_eq!(listed, vec![("tx-b".to_string(), "Ongoing".to_string())]);
    let (_, _, listed) = list(&mut stream, &["CompleteCommit"]);
    assert!(listed.is_empty(), "{listed:?}");
    broker.terminate();
}
