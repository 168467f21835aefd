//! The transaction coordinator's APIs (KIP-98, `transaction.version` 1): InitProducerId with a
//! `transactional.id`, AddPartitionsToTxn v0-3, AddOffsetsToTxn, EndTxn, DescribeTransactions and
//! ListTransactions, turned into calls to the coordinator of the id on the shard that leads the id's
//! `__transaction_state` partition ([`crate::coordinator::transactions`]).
//!
//! Older clients do not know PRODUCER_FENCED: as Kafka does, they are told INVALID_PRODUCER_EPOCH
//! instead (InitProducerId before v4, AddPartitionsToTxn, AddOffsetsToTxn and EndTxn before v2).

use std::collections::BTreeMap;

use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::describe_transactions_response::{TopicData, TransactionState};
use kafka_protocol::messages::list_transactions_response::TransactionState as ListedTransaction;
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse,
    DescribeTransactionsRequest, DescribeTransactionsResponse, EndTxnRequest, EndTxnResponse, InitProducerIdRequest,
    InitProducerIdResponse, ListTransactionsRequest, ListTransactionsResponse, ProducerId, TransactionalId,
};

use super::groups::str_bytes;
use super::*;
use crate::group::{OFFSETS_TOPIC, offsets_partition};
use crate::txn::call::{TxnOp, TxnRequest};
use crate::txn::{
    InitProducerId, ProducerIdAndEpoch, Reply, TRANSACTION_STATE_TOPIC, TxnResult, TxnState, transaction_partition,
};

/// Asks the coordinator of `transactional_id` on this broker; NOT_COORDINATOR when another broker (or
/// none) leads the id's `__transaction_state` partition.
async fn ask<T>(
    ctx: &BrokerContext,
    transactional_id: &str,
    make: impl FnOnce(flume::Sender<T>) -> TxnOp,
) -> Result<T, ResponseError> {
    let image = ctx.image();
    let topic = image.topic(TRANSACTION_STATE_TOPIC).ok_or(ResponseError::NotCoordinator)?;
    let partition = transaction_partition(transactional_id, topic.partitions.len() as u32);
    let led = ctx.leader_in(&image, TRANSACTION_STATE_TOPIC, partition).map_err(|_| ResponseError::NotCoordinator)?;
    let (tx, rx) = flume::bounded(1);
    let call = TxnRequest::Call { partition, epoch: led.epoch, op: make(tx) };
    ctx.txns[led.shard].send_async(call).await.map_err(|_| ResponseError::CoordinatorNotAvailable)?;
    rx.recv_async().await.map_err(|_| ResponseError::CoordinatorNotAvailable)
}

/// PRODUCER_FENCED as a client of `version` understands it.
fn fenced_for(error: ResponseError, version: i16, since: i16) -> ResponseError {
    if error == ResponseError::ProducerFenced && version < since { ResponseError::InvalidProducerEpoch } else { error }
}

fn producer(producer_id: ProducerId, epoch: i16) -> ProducerIdAndEpoch {
    ProducerIdAndEpoch { producer_id: producer_id.0, epoch }
}

/// InitProducerId with a non-empty `transactional.id` (the idempotent case is `producers`).
pub(super) async fn init_transactional_producer(
    ctx: &Arc<BrokerContext>,
    req: &InitProducerIdRequest,
    transactional_id: &str,
    version: i16,
) -> InitProducerIdResponse {
    let refused = |error: ResponseError| {
        InitProducerIdResponse::default()
            .with_error_code(fenced_for(error, version, 4).code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
    };
    let expected = (req.producer_id.0 >= 0)
        .then_some(ProducerIdAndEpoch { producer_id: req.producer_id.0, epoch: req.producer_epoch });
    let init = InitProducerId {
        transactional_id: transactional_id.to_string(),
        txn_timeout_ms: req.transaction_timeout_ms,
        expected,
    };
    // Taken before the call, in case the coordinator needs a new producer id: the coordinator decides
    // without waiting, and an id it does not use is simply never handed out.
    let fresh_producer_id = ctx.producer_ids.next(&ctx.quorum, NodeId(ctx.config.node_id)).await;
    let answer =
        ask(ctx, transactional_id, |reply| TxnOp::InitProducerId { req: init, fresh_producer_id, reply }).await;
    match answer.and_then(|reply| reply) {
        Ok(Reply::ProducerId(p)) => {
            InitProducerIdResponse::default().with_producer_id(ProducerId(p.producer_id)).with_producer_epoch(p.epoch)
        }
        Ok(Reply::Done) => refused(ResponseError::UnknownServerError),
        Err(e) => refused(e),
    }
}

pub(super) async fn add_partitions_to_txn(
    ctx: &Arc<BrokerContext>,
    req: AddPartitionsToTxnRequest,
    version: i16,
) -> AddPartitionsToTxnResponse {
    let transactional_id = req.v3_and_below_transactional_id.0.as_str();
    let wanted: Vec<(String, i32)> = req
        .v3_and_below_topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| (t.name.0.to_string(), *p)))
        .collect();
    let image = ctx.image();
    // Kafka's rule: a partition that does not exist fails the request before the coordinator is asked;
    // the others are answered OPERATION_NOT_ATTEMPTED.
    let unknown: Vec<bool> = wanted
        .iter()
        .map(|(topic, p)| crate::topics::is_internal(topic) || image.partition(topic, *p).is_none())
        .collect();
    let errors: Vec<Option<ResponseError>> = if unknown.iter().any(|u| *u) {
        unknown
            .iter()
            .map(|u| {
                Some(if *u { ResponseError::UnknownTopicOrPartition } else { ResponseError::OperationNotAttempted })
            })
            .collect()
    } else {
        let partitions = wanted.iter().map(|(t, p)| TopicPartition::new(t.clone(), *p as u32)).collect();
        let who = producer(req.v3_and_below_producer_id, req.v3_and_below_producer_epoch);
        let answer = ask(ctx, transactional_id, |reply| TxnOp::AddPartitions {
            transactional_id: transactional_id.to_string(),
            producer: who,
            partitions,
            reply,
        })
        .await;
        // The coordinator adds all of them or none.
        let error = answer.and_then(|reply| reply).err().map(|e| fenced_for(e, version, 2));
        vec![error; wanted.len()]
    };
    let mut topics: BTreeMap<String, Vec<AddPartitionsToTxnPartitionResult>> = BTreeMap::new();
    for ((topic, partition), error) in wanted.into_iter().zip(errors) {
        topics.entry(topic).or_default().push(
            AddPartitionsToTxnPartitionResult::default()
                .with_partition_index(partition)
                .with_partition_error_code(error.map_or(0, |e| e.code())),
        );
    }
    let results = topics
        .into_iter()
        .map(|(name, partitions)| {
            AddPartitionsToTxnTopicResult::default()
                .with_name(TopicName(str_bytes(name)))
                .with_results_by_partition(partitions)
        })
        .collect();
    AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results)
}

pub(super) async fn add_offsets_to_txn(
    ctx: &Arc<BrokerContext>,
    req: AddOffsetsToTxnRequest,
    version: i16,
) -> AddOffsetsToTxnResponse {
    let transactional_id = req.transactional_id.0.as_str();
    let image = ctx.image();
    // The group's offsets partition, as the group coordinator places it; the topic exists once any group
    // has asked for its coordinator, as a consumer whose offsets are sent has.
    let Some(offsets) = image.topic(OFFSETS_TOPIC) else {
        return AddOffsetsToTxnResponse::default().with_error_code(ResponseError::CoordinatorNotAvailable.code());
    };
    let offsets_partition = offsets_partition(req.group_id.0.as_str(), offsets.partitions.len() as u32) as u32;
    let who = producer(req.producer_id, req.producer_epoch);
    let answer = ask(ctx, transactional_id, |reply| TxnOp::AddOffsets {
        transactional_id: transactional_id.to_string(),
        producer: who,
        offsets_partition,
        reply,
    })
    .await;
    let error = answer.and_then(|reply| reply).err().map(|e| fenced_for(e, version, 2));
    AddOffsetsToTxnResponse::default().with_error_code(error.map_or(0, |e| e.code()))
}

pub(super) async fn end_txn(ctx: &Arc<BrokerContext>, req: EndTxnRequest, version: i16) -> EndTxnResponse {
    let transactional_id = req.transactional_id.0.as_str();
    let result = if req.committed { TxnResult::Commit } else { TxnResult::Abort };
    let who = producer(req.producer_id, req.producer_epoch);
    let answer = ask(ctx, transactional_id, |reply| TxnOp::EndTxn {
        transactional_id: transactional_id.to_string(),
        producer: who,
        result,
        reply,
    })
    .await;
    let error = answer.and_then(|reply| reply).err().map(|e| fenced_for(e, version, 2));
    EndTxnResponse::default().with_error_code(error.map_or(0, |e| e.code()))
}

pub(super) async fn describe_transactions(
    ctx: &Arc<BrokerContext>,
    req: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let mut states = Vec::with_capacity(req.transactional_ids.len());
    for id in req.transactional_ids {
        let base = TransactionState::default().with_transactional_id(id.clone()).with_producer_id(ProducerId(-1));
        let transactional_id = id.0.to_string();
        let answer =
            ask(ctx, &transactional_id, |reply| TxnOp::Describe { transactional_id: transactional_id.clone(), reply })
                .await
                .and_then(|described| described);
        let state = match answer {
            Ok(Some(meta)) => {
                let mut topics: BTreeMap<String, Vec<i32>> = BTreeMap::new();
                for tp in &meta.current.partitions {
                    topics.entry(tp.topic.to_string()).or_default().push(tp.partition as i32);
                }
                base.with_transaction_state(StrBytes::from_static_str(meta.state().name()))
                    .with_transaction_timeout_ms(meta.current.txn_timeout_ms)
                    .with_transaction_start_time_ms(meta.current.txn_start_ms)
                    .with_producer_id(ProducerId(meta.current.producer_id))
                    .with_producer_epoch(meta.current.producer_epoch)
                    .with_topics(
                        topics
                            .into_iter()
                            .map(|(topic, partitions)| {
                                TopicData::default().with_topic(TopicName(str_bytes(topic))).with_partitions(partitions)
                            })
                            .collect(),
                    )
            }
            Ok(None) => base.with_error_code(ResponseError::TransactionalIdNotFound.code()),
            Err(e) => base.with_error_code(e.code()),
        };
        states.push(state);
    }
    DescribeTransactionsResponse::default().with_transaction_states(states)
}

pub(super) async fn list_transactions(
    ctx: &Arc<BrokerContext>,
    req: ListTransactionsRequest,
) -> ListTransactionsResponse {
    let mut unknown_states = Vec::new();
    let mut states = Vec::new();
    for name in &req.state_filters {
        match TxnState::from_name(name.as_str()) {
            Some(state) => states.push(state),
            None => unknown_states.push(name.clone()),
        }
    }
    let mut listed = Vec::new();
    for shard in &ctx.txns {
        let (tx, rx) = flume::bounded(1);
        let answer = match shard.send_async(TxnRequest::List { reply: tx }).await {
            Ok(()) => rx.recv_async().await.unwrap_or(Err(ResponseError::CoordinatorNotAvailable)),
            Err(_) => Err(ResponseError::CoordinatorNotAvailable),
        };
        match answer {
            Ok(txns) => listed.extend(txns),
            Err(e) => return ListTransactionsResponse::default().with_error_code(e.code()),
        }
    }
    let now = crate::coordinator::now_ms() as i64;
    let transactions = listed
        .into_iter()
        // An expired id being forgotten is not listed, as in Kafka.
        .filter(|t| t.state != TxnState::Dead)
        .filter(|t| req.state_filters.is_empty() || states.contains(&t.state))
        .filter(|t| req.producer_id_filters.is_empty() || req.producer_id_filters.contains(&ProducerId(t.producer_id)))
        // v1 (KIP-994): only transactions open longer than this (an id with no open transaction has
        // none running).
        .filter(|t| req.duration_filter < 0 || (t.txn_start_ms >= 0 && now - t.txn_start_ms > req.duration_filter))
        .map(|t| {
            ListedTransaction::default()
                .with_transactional_id(TransactionalId(str_bytes(t.transactional_id)))
                .with_producer_id(ProducerId(t.producer_id))
                .with_transaction_state(StrBytes::from_static_str(t.state.name()))
        })
        .collect();
    ListTransactionsResponse::default().with_unknown_state_filters(unknown_states).with_transaction_states(transactions)
}

/// KIP-890 part 1, at the coordinator: whether each partition is in the ongoing transaction of
/// `producer` under `transactional_id`, asked of this broker's coordinator of the id (NOT_COORDINATOR
/// for each when this broker is not it).
pub(crate) async fn verify_here(
    ctx: &BrokerContext,
    transactional_id: &str,
    producer: ProducerIdAndEpoch,
    partitions: Vec<TopicPartition>,
) -> Vec<Result<(), ResponseError>> {
    let count = partitions.len();
    let answer = ask(ctx, transactional_id, |reply| TxnOp::Verify {
        transactional_id: transactional_id.to_string(),
        producer,
        partitions,
        reply,
    })
    .await;
    answer.unwrap_or_else(|e| vec![Err(e); count])
}
