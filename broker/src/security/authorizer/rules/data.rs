//! Rules for the data path: Produce, Fetch, ListOffsets, OffsetForLeaderEpoch, DeleteRecords and
//! InitProducerId.

use std::collections::HashSet;

use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    DeleteRecordsRequest, DeleteRecordsResponse, FetchRequest, FetchResponse, InitProducerIdRequest,
    InitProducerIdResponse, ListOffsetsRequest, ListOffsetsResponse, OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse, ProduceRequest, ProduceResponse, ProducerId, RequestKind, ResponseKind, TopicName,
};

use super::{CLUSTER_DENIED, Check, Gate, Merge, TOPIC_DENIED, TXN_DENIED, answer_if_empty, code};
use crate::security::authorizer::Resource;
use crate::security::authorizer::acl::{AclOperation, ResourceType};
use crate::txn::batches::has_transactional_batch;

/// Topics denied whole, with the partitions the request named for each.
pub(super) type DeniedPartitions = Vec<(TopicName, Vec<i32>)>;

/// Takes the entries of `topics` whose name is in `denied` out, returning them as (name, partitions).
pub(super) fn take_denied<T>(
    topics: &mut Vec<T>,
    denied: &HashSet<String>,
    name: impl Fn(&T) -> &TopicName,
    partitions: impl Fn(&T) -> Vec<i32>,
) -> DeniedPartitions {
    let mut taken = Vec::new();
    topics.retain(|t| {
        if denied.contains(name(t).0.as_str()) {
            taken.push((name(t).clone(), partitions(t)));
            false
        } else {
            true
        }
    });
    taken
}

fn produce_partition_error(index: i32, error: i16) -> PartitionProduceResponse {
    // Kafka's answer for a partition it did not append to: no offsets, no timestamp.
    PartitionProduceResponse::default()
        .with_index(index)
        .with_error_code(error)
        .with_base_offset(-1)
        .with_log_append_time_ms(-1)
        .with_log_start_offset(-1)
}

fn produce_errors(denied: DeniedPartitions, error: i16) -> Vec<TopicProduceResponse> {
    denied
        .into_iter()
        .map(|(name, partitions)| {
            TopicProduceResponse::default()
                .with_name(name)
                .with_partition_responses(partitions.into_iter().map(|p| produce_partition_error(p, error)).collect())
        })
        .collect()
}

/// Produce: a transactional batch needs WRITE on the TRANSACTIONAL_ID (else the whole request fails
/// with TRANSACTIONAL_ID_AUTHORIZATION_FAILED); each topic needs WRITE (else TOPIC_AUTHORIZATION_FAILED
/// for its partitions).
pub(super) fn produce(check: &Check<'_>, mut req: ProduceRequest) -> Gate {
    let transactional = req
        .topic_data
        .iter()
        .flat_map(|t| &t.partition_data)
        .any(|p| p.records.as_deref().is_some_and(has_transactional_batch));
    if transactional {
        let allowed = req
            .transactional_id
            .as_ref()
            .is_some_and(|id| check.allowed(AclOperation::Write, Resource::transactional_id(id.0.as_str())));
        if !allowed {
            if req.acks == 0 {
                return Gate::Close;
            }
            let all = req
                .topic_data
                .iter()
                .map(|t| (t.name.clone(), t.partition_data.iter().map(|p| p.index).collect()))
                .collect();
            let response = ProduceResponse::default().with_responses(produce_errors(all, code(TXN_DENIED)));
            return Gate::Answer(ResponseKind::Produce(response));
        }
    }
    let denied = check.denied_names(
        AclOperation::Write,
        ResourceType::Topic,
        req.topic_data.iter().map(|t| t.name.0.as_str()),
        true,
    );
    if denied.is_empty() {
        return super::pass(RequestKind::Produce(req));
    }
    let taken =
        take_denied(&mut req.topic_data, &denied, |t| &t.name, |t| t.partition_data.iter().map(|p| p.index).collect());
    if req.acks == 0 {
        // Kafka closes the connection of an acks=0 producer whose request had a failed partition.
        return Gate::Close;
    }
    let nothing_left = req.topic_data.is_empty();
    let merge = Merge::with(true, move |response| match response {
        ResponseKind::Produce(mut r) => {
            r.responses.extend(produce_errors(taken, code(TOPIC_DENIED)));
            ResponseKind::Produce(r)
        }
        other => other,
    });
    answer_if_empty(RequestKind::Produce(req), nothing_left, merge, ResponseKind::Produce(ProduceResponse::default()))
}

fn fetch_errors(denied: DeniedPartitions) -> Vec<FetchableTopicResponse> {
    denied
        .into_iter()
        .map(|(topic, partitions)| {
            let partitions = partitions
                .into_iter()
                .map(|p| {
                    PartitionData::default()
                        .with_partition_index(p)
                        .with_error_code(code(TOPIC_DENIED))
                        .with_high_watermark(-1)
                        .with_last_stable_offset(-1)
                        .with_log_start_offset(-1)
                })
                .collect();
            FetchableTopicResponse::default().with_topic(topic).with_partitions(partitions)
        })
        .collect()
}

/// Fetch: a follower's fetch (replica id 0 or more) needs CLUSTER_ACTION on the CLUSTER, else every
/// partition fails; a consumer's needs READ on each topic. Denied partitions get TOPIC_AUTHORIZATION_FAILED.
pub(super) fn fetch(check: &Check<'_>, mut req: FetchRequest) -> Gate {
    let from_follower = req.replica_id.0 >= 0 || req.replica_state.replica_id.0 >= 0;
    let denied: HashSet<String> = if from_follower {
        if check.cluster(AclOperation::ClusterAction) {
            HashSet::new()
        } else {
            req.topics.iter().map(|t| t.topic.0.as_str().to_string()).collect()
        }
    } else {
        check.denied_names(AclOperation::Read, ResourceType::Topic, req.topics.iter().map(|t| t.topic.0.as_str()), true)
    };
    if denied.is_empty() {
        return super::pass(RequestKind::Fetch(req));
    }
    let taken =
        take_denied(&mut req.topics, &denied, |t| &t.topic, |t| t.partitions.iter().map(|p| p.partition).collect());
    let nothing_left = req.topics.is_empty();
    let merge = Merge::with(true, move |response| match response {
        ResponseKind::Fetch(mut r) => {
            r.responses.extend(fetch_errors(taken));
            ResponseKind::Fetch(r)
        }
        other => other,
    });
    answer_if_empty(RequestKind::Fetch(req), nothing_left, merge, ResponseKind::Fetch(FetchResponse::default()))
}

/// ListOffsets: DESCRIBE on each topic.
pub(super) fn list_offsets(check: &Check<'_>, mut req: ListOffsetsRequest) -> Gate {
    let names = req.topics.iter().map(|t| t.name.0.as_str());
    let denied = check.denied_names(AclOperation::Describe, ResourceType::Topic, names, true);
    if denied.is_empty() {
        return super::pass(RequestKind::ListOffsets(req));
    }
    let taken = take_denied(
        &mut req.topics,
        &denied,
        |t| &t.name,
        |t| t.partitions.iter().map(|p| p.partition_index).collect(),
    );
    let nothing_left = req.topics.is_empty();
    let merge = Merge::with(true, move |response| match response {
        ResponseKind::ListOffsets(mut r) => {
            r.topics.extend(taken.into_iter().map(|(name, partitions)| {
                let partitions = partitions
                    .into_iter()
                    .map(|p| {
                        ListOffsetsPartitionResponse::default()
                            .with_partition_index(p)
                            .with_error_code(code(TOPIC_DENIED))
                            .with_timestamp(-1)
                            .with_offset(-1)
                            .with_leader_epoch(-1)
                    })
                    .collect();
                ListOffsetsTopicResponse::default().with_name(name).with_partitions(partitions)
            }));
            ResponseKind::ListOffsets(r)
        }
        other => other,
    });
    answer_if_empty(
        RequestKind::ListOffsets(req),
        nothing_left,
        merge,
        ResponseKind::ListOffsets(ListOffsetsResponse::default()),
    )
}

/// OffsetForLeaderEpoch: CLUSTER_ACTION on the CLUSTER (asked quietly) allows all; else DESCRIBE on
/// each topic.
pub(super) fn offset_for_leader_epoch(check: &Check<'_>, mut req: OffsetForLeaderEpochRequest) -> Gate {
    if check.allowed_quietly(AclOperation::ClusterAction, Resource::cluster()) {
        return super::pass(RequestKind::OffsetForLeaderEpoch(req));
    }
    let names = req.topics.iter().map(|t| t.topic.0.as_str());
    let denied = check.denied_names(AclOperation::Describe, ResourceType::Topic, names, true);
    if denied.is_empty() {
        return super::pass(RequestKind::OffsetForLeaderEpoch(req));
    }
    let taken =
        take_denied(&mut req.topics, &denied, |t| &t.topic, |t| t.partitions.iter().map(|p| p.partition).collect());
    let nothing_left = req.topics.is_empty();
    let merge = Merge::with(true, move |response| match response {
        ResponseKind::OffsetForLeaderEpoch(mut r) => {
            r.topics.extend(taken.into_iter().map(|(topic, partitions)| {
                let partitions = partitions
                    .into_iter()
                    .map(|p| {
                        EpochEndOffset::default()
                            .with_partition(p)
                            .with_error_code(code(TOPIC_DENIED))
                            .with_leader_epoch(-1)
                            .with_end_offset(-1)
                    })
                    .collect();
                OffsetForLeaderTopicResult::default().with_topic(topic).with_partitions(partitions)
            }));
            ResponseKind::OffsetForLeaderEpoch(r)
        }
        other => other,
    });
    let empty = ResponseKind::OffsetForLeaderEpoch(OffsetForLeaderEpochResponse::default());
    answer_if_empty(RequestKind::OffsetForLeaderEpoch(req), nothing_left, merge, empty)
}

/// DeleteRecords: DELETE on each topic.
pub(super) fn delete_records(check: &Check<'_>, mut req: DeleteRecordsRequest) -> Gate {
    let names = req.topics.iter().map(|t| t.name.0.as_str());
    let denied = check.denied_names(AclOperation::Delete, ResourceType::Topic, names, true);
    if denied.is_empty() {
        return super::pass(RequestKind::DeleteRecords(req));
    }
    let taken = take_denied(
        &mut req.topics,
        &denied,
        |t| &t.name,
        |t| t.partitions.iter().map(|p| p.partition_index).collect(),
    );
    let nothing_left = req.topics.is_empty();
    let merge = Merge::with(true, move |response| match response {
        ResponseKind::DeleteRecords(mut r) => {
            r.topics.extend(taken.into_iter().map(|(name, partitions)| {
                let partitions = partitions
                    .into_iter()
                    .map(|p| {
                        DeleteRecordsPartitionResult::default()
                            .with_partition_index(p)
                            .with_low_watermark(-1)
                            .with_error_code(code(TOPIC_DENIED))
                    })
                    .collect();
                DeleteRecordsTopicResult::default().with_name(name).with_partitions(partitions)
            }));
            ResponseKind::DeleteRecords(r)
        }
        other => other,
    });
    let empty = ResponseKind::DeleteRecords(DeleteRecordsResponse::default());
    answer_if_empty(RequestKind::DeleteRecords(req), nothing_left, merge, empty)
}

/// InitProducerId: with a transactional id, WRITE on it (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED);
/// without one, IDEMPOTENT_WRITE on the CLUSTER or WRITE on any topic (KIP-679), else
/// CLUSTER_AUTHORIZATION_FAILED.
pub(super) fn init_producer_id(check: &Check<'_>, req: InitProducerIdRequest) -> Gate {
    let refused = match &req.transactional_id {
        Some(id) => {
            (!check.allowed(AclOperation::Write, Resource::transactional_id(id.0.as_str()))).then_some(TXN_DENIED)
        }
        None => {
            let idempotent = check.allowed_quietly(AclOperation::IdempotentWrite, Resource::cluster());
            let any_topic = idempotent
                || check.authorizer.authorize_any(check.ctx, AclOperation::Write, ResourceType::Topic).is_allowed();
            if !any_topic {
                // Kafka logs neither question; one line for the refusal is what an operator needs.
                check.denial(AclOperation::IdempotentWrite, ResourceType::Cluster, &Resource::cluster());
            }
            (!any_topic).then_some(CLUSTER_DENIED)
        }
    };
    match refused {
        None => super::pass(RequestKind::InitProducerId(req)),
        Some(error) => Gate::Answer(ResponseKind::InitProducerId(
            InitProducerIdResponse::default()
                .with_error_code(code(error))
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1),
        )),
    }
}
