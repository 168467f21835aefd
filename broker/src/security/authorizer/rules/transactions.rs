//! The transaction coordinator's APIs, as Kafka's `KafkaApis` checks them: WRITE on the TRANSACTIONAL_ID for
//! every change to a transaction (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED), and besides it WRITE on each
//! topic added to a transaction (AddPartitionsToTxn) or READ on the group whose offsets are sent
//! (AddOffsetsToTxn); DESCRIBE on the id to see it (DescribeTransactions, ListTransactions). WriteTxnMarkers,
//! a coordinator's call to partition leaders, needs CLUSTER_ACTION on the CLUSTER. DescribeProducers, a
//! partition leader's view of its producers, needs READ on each topic.

use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::describe_producers_response::{PartitionResponse, TopicResponse};
use kafka_protocol::messages::describe_transactions_response::TransactionState;
use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::{
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, AddPartitionsToTxnRequest, AddPartitionsToTxnResponse,
    DescribeProducersRequest, DescribeProducersResponse, DescribeTransactionsRequest, DescribeTransactionsResponse,
    EndTxnRequest, EndTxnResponse, ListTransactionsRequest, ProducerId, RequestKind, ResponseKind,
    WriteTxnMarkersRequest, WriteTxnMarkersResponse,
};

use super::super::acl::{AclOperation, ResourceType};
use super::data::take_denied;
use super::{CLUSTER_DENIED, Check, GROUP_DENIED, Gate, Merge, TOPIC_DENIED, TXN_DENIED, code};
use crate::security::authorizer::Resource;

fn may_write(check: &Check<'_>, transactional_id: &str) -> bool {
    check.allowed(AclOperation::Write, Resource::transactional_id(transactional_id))
}

/// AddPartitionsToTxn v0-3: without WRITE on the id every partition is TRANSACTIONAL_ID_AUTHORIZATION_FAILED;
/// with it, partitions of topics the principal may not WRITE are TOPIC_AUTHORIZATION_FAILED and the others
/// OPERATION_NOT_ATTEMPTED (nothing is added).
pub(super) fn add_partitions_to_txn(check: &Check<'_>, req: AddPartitionsToTxnRequest) -> Gate {
    let names = req.v3_and_below_topics.iter().map(|t| t.name.0.as_str());
    let denied_topics = if may_write(check, req.v3_and_below_transactional_id.0.as_str()) {
        let denied = check.denied_names(AclOperation::Write, ResourceType::Topic, names, true);
        if denied.is_empty() {
            return super::pass(RequestKind::AddPartitionsToTxn(req));
        }
        Some(denied)
    } else {
        None
    };
    let results = req
        .v3_and_below_topics
        .iter()
        .map(|t| {
            let error = match &denied_topics {
                None => TXN_DENIED,
                Some(denied) if denied.contains(t.name.0.as_str()) => TOPIC_DENIED,
                Some(_) => kafka_protocol::ResponseError::OperationNotAttempted,
            };
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    AddPartitionsToTxnPartitionResult::default()
                        .with_partition_index(*p)
                        .with_partition_error_code(code(error))
                })
                .collect();
            AddPartitionsToTxnTopicResult::default().with_name(t.name.clone()).with_results_by_partition(partitions)
        })
        .collect();
    Gate::Answer(ResponseKind::AddPartitionsToTxn(
        AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results),
    ))
}

/// AddOffsetsToTxn: WRITE on the id, then READ on the group.
pub(super) fn add_offsets_to_txn(check: &Check<'_>, req: AddOffsetsToTxnRequest) -> Gate {
    let error = if !may_write(check, req.transactional_id.0.as_str()) {
        TXN_DENIED
    } else if !check.allowed(AclOperation::Read, Resource::group(req.group_id.0.as_str())) {
        GROUP_DENIED
    } else {
        return super::pass(RequestKind::AddOffsetsToTxn(req));
    };
    Gate::Answer(ResponseKind::AddOffsetsToTxn(AddOffsetsToTxnResponse::default().with_error_code(code(error))))
}

/// EndTxn: WRITE on the id.
pub(super) fn end_txn(check: &Check<'_>, req: EndTxnRequest) -> Gate {
    if may_write(check, req.transactional_id.0.as_str()) {
        return super::pass(RequestKind::EndTxn(req));
    }
    Gate::Answer(ResponseKind::EndTxn(
        EndTxnResponse::default()
            .with_error_code(code(TXN_DENIED))
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1),
    ))
}

/// DescribeTransactions: DESCRIBE on each id (else that id is TRANSACTIONAL_ID_AUTHORIZATION_FAILED); the
/// partitions of topics the principal may not DESCRIBE are left out of the answer, as Kafka does.
pub(super) fn describe_transactions(check: &Check<'_>, mut req: DescribeTransactionsRequest) -> Gate {
    let mut denied = Vec::new();
    req.transactional_ids.retain(|id| {
        let keep = check.allowed(AclOperation::Describe, Resource::transactional_id(id.0.as_str()));
        if !keep {
            denied.push(id.clone());
        }
        keep
    });
    let nothing_left = req.transactional_ids.is_empty();
    let filter = check.filter();
    let merge = Merge::with(!denied.is_empty(), move |response| match response {
        ResponseKind::DescribeTransactions(mut r) => {
            for state in &mut r.transaction_states {
                state.topics.retain(|t| filter.allowed(AclOperation::Describe, Resource::topic(t.topic.0.as_str())));
            }
            r.transaction_states.extend(denied.into_iter().map(|id| {
                TransactionState::default()
                    .with_transactional_id(id)
                    .with_error_code(code(TXN_DENIED))
                    .with_producer_id(ProducerId(-1))
            }));
            ResponseKind::DescribeTransactions(r)
        }
        other => other,
    });
    let empty = ResponseKind::DescribeTransactions(DescribeTransactionsResponse::default());
    super::answer_if_empty(RequestKind::DescribeTransactions(req), nothing_left, merge, empty)
}

/// ListTransactions: the ids the principal may not DESCRIBE are left out.
pub(super) fn list_transactions(check: &Check<'_>, req: ListTransactionsRequest) -> Gate {
    let filter = check.filter();
    let merge = Merge::with(false, move |response| match response {
        ResponseKind::ListTransactions(mut r) => {
            r.transaction_states.retain(|t| {
                filter.allowed(AclOperation::Describe, Resource::transactional_id(t.transactional_id.0.as_str()))
            });
            ResponseKind::ListTransactions(r)
        }
        other => other,
    });
    Gate::Handle { request: RequestKind::ListTransactions(req), merge }
}

/// WriteTxnMarkers: CLUSTER_ACTION on the CLUSTER, else every partition is CLUSTER_AUTHORIZATION_FAILED.
pub(super) fn write_txn_markers(check: &Check<'_>, req: WriteTxnMarkersRequest) -> Gate {
    if check.cluster(AclOperation::ClusterAction) {
        return super::pass(RequestKind::WriteTxnMarkers(req));
    }
    let markers = req
        .markers
        .iter()
        .map(|m| {
            let topics = m
                .topics
                .iter()
                .map(|t| {
                    let partitions = t
                        .partition_indexes
                        .iter()
                        .map(|p| {
                            WritableTxnMarkerPartitionResult::default()
                                .with_partition_index(*p)
                                .with_error_code(code(CLUSTER_DENIED))
                        })
                        .collect();
                    WritableTxnMarkerTopicResult::default().with_name(t.name.clone()).with_partitions(partitions)
                })
                .collect();
            WritableTxnMarkerResult::default().with_producer_id(m.producer_id).with_topics(topics)
        })
        .collect();
    Gate::Answer(ResponseKind::WriteTxnMarkers(WriteTxnMarkersResponse::default().with_markers(markers)))
}

/// DescribeProducers: READ on each topic, else each of its partitions is TOPIC_AUTHORIZATION_FAILED (as
/// Kafka's `handleDescribeProducersRequest`).
pub(super) fn describe_producers(check: &Check<'_>, mut req: DescribeProducersRequest) -> Gate {
    let names = req.topics.iter().map(|t| t.name.0.as_str());
    let denied = check.denied_names(AclOperation::Read, ResourceType::Topic, names, true);
    if denied.is_empty() {
        return super::pass(RequestKind::DescribeProducers(req));
    }
    let taken = take_denied(&mut req.topics, &denied, |t| &t.name, |t| t.partition_indexes.clone());
    let nothing_left = req.topics.is_empty();
    let merge = Merge::with(true, move |response| match response {
        ResponseKind::DescribeProducers(mut r) => {
            r.topics.extend(taken.into_iter().map(|(name, partitions)| {
                let partitions = partitions
                    .into_iter()
                    .map(|p| PartitionResponse::default().with_partition_index(p).with_error_code(code(TOPIC_DENIED)))
                    .collect();
                TopicResponse::default().with_name(name).with_partitions(partitions)
            }));
            ResponseKind::DescribeProducers(r)
        }
        other => other,
    });
    let empty = ResponseKind::DescribeProducers(DescribeProducersResponse::default());
    super::answer_if_empty(RequestKind::DescribeProducers(req), nothing_left, merge, empty)
}
