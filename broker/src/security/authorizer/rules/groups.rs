//! Rules for consumer groups and coordinators: FindCoordinator, the classic group protocol, KIP-848's
//! heartbeat and describe, committed offsets, and group listing, description and deletion.

use std::collections::{HashMap, HashSet};

use kafka_protocol::ResponseError;
use kafka_protocol::messages::consumer_group_describe_response::DescribedGroup as ConsumerDescribedGroup;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::DescribedGroup;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
use kafka_protocol::messages::offset_delete_response::{OffsetDeleteResponsePartition, OffsetDeleteResponseTopic};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions, OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
};
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, ConsumerGroupDescribeRequest, ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse,
    DeleteGroupsRequest, DescribeGroupsRequest, FindCoordinatorRequest, FindCoordinatorResponse, GroupId,
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse,
    ListGroupsRequest, OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest, OffsetDeleteResponse,
    OffsetFetchRequest, OffsetFetchResponse, RequestKind, ResponseKind, SyncGroupRequest, SyncGroupResponse, TopicName,
    TxnOffsetCommitRequest, TxnOffsetCommitResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::{Check, GROUP_DENIED, Gate, Merge, TOPIC_DENIED, TXN_DENIED, answer_if_empty, code};
use crate::security::authorizer::Resource;
use crate::security::authorizer::acl::{AclOperation, ResourceType};

/// FindCoordinator's key types.
const KEY_GROUP: i8 = 0;
const KEY_TRANSACTION: i8 = 1;

/// The error for a FindCoordinator key the principal may not DESCRIBE, if it may not.
fn coordinator_denial(check: &Check<'_>, key_type: i8, key: &str) -> Option<ResponseError> {
    match key_type {
        KEY_GROUP => (!check.allowed(AclOperation::Describe, Resource::group(key))).then_some(GROUP_DENIED),
        KEY_TRANSACTION => {
            (!check.allowed(AclOperation::Describe, Resource::transactional_id(key))).then_some(TXN_DENIED)
        }
        // Other key types are the handler's to refuse.
        _ => None,
    }
}

/// FindCoordinator: DESCRIBE on the group or the transactional id of each key.
pub(super) fn find_coordinator(check: &Check<'_>, mut req: FindCoordinatorRequest, version: i16) -> Gate {
    if version < 4 {
        return match coordinator_denial(check, req.key_type, req.key.as_str()) {
            None => super::pass(RequestKind::FindCoordinator(req)),
            Some(error) => Gate::Answer(ResponseKind::FindCoordinator(
                FindCoordinatorResponse::default()
                    .with_error_code(code(error))
                    .with_node_id(BrokerId(-1))
                    .with_port(-1),
            )),
        };
    }
    let mut denied = Vec::new();
    let key_type = req.key_type;
    req.coordinator_keys.retain(|key| match coordinator_denial(check, key_type, key.as_str()) {
        None => true,
        Some(error) => {
            denied.push((key.clone(), error));
            false
        }
    });
    if denied.is_empty() {
        return super::pass(RequestKind::FindCoordinator(req));
    }
    let nothing_left = req.coordinator_keys.is_empty();
    let merge = Merge::with(true, move |response| match response {
        ResponseKind::FindCoordinator(mut r) => {
            r.coordinators.extend(denied.into_iter().map(|(key, error)| {
                Coordinator::default()
                    .with_key(key)
                    .with_node_id(BrokerId(-1))
                    .with_port(-1)
                    .with_error_code(code(error))
            }));
            ResponseKind::FindCoordinator(r)
        }
        other => other,
    });
    let empty = ResponseKind::FindCoordinator(FindCoordinatorResponse::default());
    answer_if_empty(RequestKind::FindCoordinator(req), nothing_left, merge, empty)
}

fn read_group(check: &Check<'_>, group: &GroupId) -> bool {
    check.allowed(AclOperation::Read, Resource::group(group.0.as_str()))
}

/// JoinGroup: READ on the group.
pub(super) fn join_group(check: &Check<'_>, req: JoinGroupRequest, version: i16) -> Gate {
    if read_group(check, &req.group_id) {
        return super::pass(RequestKind::JoinGroup(req));
    }
    // Kafka's error answer: no generation, no member, and from v7 a null protocol name.
    let protocol_name = if version >= 7 { None } else { Some(StrBytes::default()) };
    Gate::Answer(ResponseKind::JoinGroup(
        JoinGroupResponse::default()
            .with_error_code(code(GROUP_DENIED))
            .with_generation_id(-1)
            .with_protocol_name(protocol_name),
    ))
}

/// SyncGroup: READ on the group.
pub(super) fn sync_group(check: &Check<'_>, req: SyncGroupRequest) -> Gate {
    if read_group(check, &req.group_id) {
        return super::pass(RequestKind::SyncGroup(req));
    }
    Gate::Answer(ResponseKind::SyncGroup(SyncGroupResponse::default().with_error_code(code(GROUP_DENIED))))
}

/// Heartbeat: READ on the group.
pub(super) fn heartbeat(check: &Check<'_>, req: HeartbeatRequest) -> Gate {
    if read_group(check, &req.group_id) {
        return super::pass(RequestKind::Heartbeat(req));
    }
    Gate::Answer(ResponseKind::Heartbeat(HeartbeatResponse::default().with_error_code(code(GROUP_DENIED))))
}

/// LeaveGroup: READ on the group.
pub(super) fn leave_group(check: &Check<'_>, req: LeaveGroupRequest) -> Gate {
    if read_group(check, &req.group_id) {
        return super::pass(RequestKind::LeaveGroup(req));
    }
    Gate::Answer(ResponseKind::LeaveGroup(LeaveGroupResponse::default().with_error_code(code(GROUP_DENIED))))
}

/// ConsumerGroupHeartbeat (KIP-848): READ on the group (else GROUP_AUTHORIZATION_FAILED), then, as
/// Kafka 4 does, DESCRIBE on every subscribed topic name (else TOPIC_AUTHORIZATION_FAILED for the
/// heartbeat: a member may not subscribe to topics it may not see).
pub(super) fn consumer_group_heartbeat(check: &Check<'_>, req: ConsumerGroupHeartbeatRequest) -> Gate {
    let refused = if !read_group(check, &req.group_id) {
        Some(GROUP_DENIED)
    } else {
        let names = req.subscribed_topic_names.iter().flatten().map(|n| n.0.as_str());
        let denied = check.denied_names(AclOperation::Describe, ResourceType::Topic, names, true);
        (!denied.is_empty()).then_some(TOPIC_DENIED)
    };
    match refused {
        None => super::pass(RequestKind::ConsumerGroupHeartbeat(req)),
        Some(error) => Gate::Answer(ResponseKind::ConsumerGroupHeartbeat(
            ConsumerGroupHeartbeatResponse::default().with_error_code(code(error)),
        )),
    }
}

fn offset_commit_errors(topics: Vec<(TopicName, Vec<i32>)>, error: i16) -> Vec<OffsetCommitResponseTopic> {
    topics
        .into_iter()
        .map(|(name, partitions)| {
            let partitions = partitions
                .into_iter()
                .map(|p| OffsetCommitResponsePartition::default().with_partition_index(p).with_error_code(error))
                .collect();
            OffsetCommitResponseTopic::default().with_name(name).with_partitions(partitions)
        })
        .collect()
}

/// OffsetCommit: READ on the group (else GROUP_AUTHORIZATION_FAILED for every partition), then READ on
/// each topic (else TOPIC_AUTHORIZATION_FAILED for its partitions).
pub(super) fn offset_commit(check: &Check<'_>, mut req: OffsetCommitRequest) -> Gate {
    let partitions_of = |t: &kafka_protocol::messages::offset_commit_request::OffsetCommitRequestTopic| {
        (t.name.clone(), t.partitions.iter().map(|p| p.partition_index).collect::<Vec<_>>())
    };
    if !read_group(check, &req.group_id) {
        let all = req.topics.iter().map(partitions_of).collect();
        return Gate::Answer(ResponseKind::OffsetCommit(
            OffsetCommitResponse::default().with_topics(offset_commit_errors(all, code(GROUP_DENIED))),
        ));
    }
    let names = req.topics.iter().map(|t| t.name.0.as_str());
    let denied = check.denied_names(AclOperation::Read, ResourceType::Topic, names, true);
    if denied.is_empty() {
        return super::pass(RequestKind::OffsetCommit(req));
    }
    let mut taken = Vec::new();
    req.topics.retain(|t| {
        let keep = !denied.contains(t.name.0.as_str());
        if !keep {
            taken.push(partitions_of(t));
        }
        keep
    });
    let nothing_left = req.topics.is_empty();
    let merge = Merge::with(true, move |response| match response {
        ResponseKind::OffsetCommit(mut r) => {
            r.topics.extend(offset_commit_errors(taken, code(TOPIC_DENIED)));
            ResponseKind::OffsetCommit(r)
        }
        other => other,
    });
    answer_if_empty(RequestKind::OffsetCommit(req), nothing_left, merge, ResponseKind::OffsetCommit(Default::default()))
}

fn txn_offset_commit_errors(topics: Vec<(TopicName, Vec<i32>)>, error: i16) -> Vec<TxnOffsetCommitResponseTopic> {
    topics
        .into_iter()
        .map(|(name, partitions)| {
            let partitions = partitions
                .into_iter()
                .map(|p| TxnOffsetCommitResponsePartition::default().with_partition_index(p).with_error_code(error))
                .collect();
            TxnOffsetCommitResponseTopic::default().with_name(name).with_partitions(partitions)
        })
        .collect()
}

/// TxnOffsetCommit: WRITE on the transactional id (else TRANSACTIONAL_ID_AUTHORIZATION_FAILED for every
/// partition; it implies the producer id's), then READ on the group (else GROUP_AUTHORIZATION_FAILED for
/// every partition), then READ on each topic (else TOPIC_AUTHORIZATION_FAILED for its partitions), as
/// Kafka's `handleTxnOffsetCommitRequest`.
pub(super) fn txn_offset_commit(check: &Check<'_>, mut req: TxnOffsetCommitRequest) -> Gate {
    let partitions_of = |t: &kafka_protocol::messages::txn_offset_commit_request::TxnOffsetCommitRequestTopic| {
        (t.name.clone(), t.partitions.iter().map(|p| p.partition_index).collect::<Vec<_>>())
    };
    let refused = if !check.allowed(AclOperation::Write, Resource::transactional_id(req.transactional_id.0.as_str())) {
        Some(TXN_DENIED)
    } else if !read_group(check, &req.group_id) {
        Some(GROUP_DENIED)
    } else {
        None
    };
    if let Some(error) = refused {
        let all = req.topics.iter().map(partitions_of).collect();
        return Gate::Answer(ResponseKind::TxnOffsetCommit(
            TxnOffsetCommitResponse::default().with_topics(txn_offset_commit_errors(all, code(error))),
        ));
    }
    let names = req.topics.iter().map(|t| t.name.0.as_str());
    let denied = check.denied_names(AclOperation::Read, ResourceType::Topic, names, true);
    if denied.is_empty() {
        return super::pass(RequestKind::TxnOffsetCommit(req));
    }
    let mut taken = Vec::new();
    req.topics.retain(|t| {
        let keep = !denied.contains(t.name.0.as_str());
        if !keep {
            taken.push(partitions_of(t));
        }
        keep
    });
    let nothing_left = req.topics.is_empty();
    let merge = Merge::with(true, move |response| match response {
        ResponseKind::TxnOffsetCommit(mut r) => {
            r.topics.extend(txn_offset_commit_errors(taken, code(TOPIC_DENIED)));
            ResponseKind::TxnOffsetCommit(r)
        }
        other => other,
    });
    let empty = ResponseKind::TxnOffsetCommit(Default::default());
    answer_if_empty(RequestKind::TxnOffsetCommit(req), nothing_left, merge, empty)
}

/// OffsetFetch: DESCRIBE on each group (else GROUP_AUTHORIZATION_FAILED), then DESCRIBE on each topic
/// asked for (else TOPIC_AUTHORIZATION_FAILED for its partitions); when all of a group's offsets are
/// asked for, the topics the principal may not DESCRIBE are left out, quietly.
pub(super) fn offset_fetch(check: &Check<'_>, req: OffsetFetchRequest, version: i16) -> Gate {
    if version < 8 { offset_fetch_single(check, req, version) } else { offset_fetch_groups(check, req) }
}

fn offset_fetch_single(check: &Check<'_>, mut req: OffsetFetchRequest, version: i16) -> Gate {
    if !check.allowed(AclOperation::Describe, Resource::group(req.group_id.0.as_str())) {
        // Before v2 there is no top-level error: each partition asked for carries it.
        let mut response = OffsetFetchResponse::default();
        if version < 2 {
            response.topics = req
                .topics
                .unwrap_or_default()
                .into_iter()
                .map(|t| {
                    let partitions = t
                        .partition_indexes
                        .into_iter()
                        .map(|p| {
                            OffsetFetchResponsePartition::default()
                                .with_partition_index(p)
                                .with_committed_offset(-1)
                                .with_error_code(code(GROUP_DENIED))
                        })
                        .collect();
                    OffsetFetchResponseTopic::default().with_name(t.name).with_partitions(partitions)
                })
                .collect();
        } else {
            response.error_code = code(GROUP_DENIED);
        }
        return Gate::Answer(ResponseKind::OffsetFetch(response));
    }
    let filter = check.filter();
    let Some(topics) = req.topics.as_mut() else {
        // All of the group's offsets: leave out what may not be described.
        let merge = Merge::with(false, move |response| match response {
            ResponseKind::OffsetFetch(mut r) => {
                r.topics.retain(|t| filter.allowed(AclOperation::Describe, Resource::topic(t.name.0.as_str())));
                ResponseKind::OffsetFetch(r)
            }
            other => other,
        });
        return Gate::Handle { request: RequestKind::OffsetFetch(req), merge };
    };
    let denied =
        check.denied_names(AclOperation::Describe, ResourceType::Topic, topics.iter().map(|t| t.name.0.as_str()), true);
    if denied.is_empty() {
        return super::pass(RequestKind::OffsetFetch(req));
    }
    let mut taken = Vec::new();
    topics.retain(|t| {
        let keep = !denied.contains(t.name.0.as_str());
        if !keep {
            taken.push((t.name.clone(), t.partition_indexes.clone()));
        }
        keep
    });
    let merge = Merge::with(true, move |response| match response {
        ResponseKind::OffsetFetch(mut r) => {
            r.topics.extend(taken.into_iter().map(|(name, partitions)| {
                let partitions = partitions
                    .into_iter()
                    .map(|p| {
                        OffsetFetchResponsePartition::default()
                            .with_partition_index(p)
                            .with_committed_offset(-1)
                            .with_error_code(code(TOPIC_DENIED))
                    })
                    .collect();
                OffsetFetchResponseTopic::default().with_name(name).with_partitions(partitions)
            }));
            ResponseKind::OffsetFetch(r)
        }
        other => other,
    });
    Gate::Handle { request: RequestKind::OffsetFetch(req), merge }
}

fn offset_fetch_groups(check: &Check<'_>, mut req: OffsetFetchRequest) -> Gate {
    let mut denied_groups = Vec::new();
    let mut denied_topics: HashMap<GroupId, Vec<(TopicName, Vec<i32>)>> = HashMap::new();
    let mut all_topics_groups = HashSet::new();
    req.groups.retain_mut(|group| {
        if !check.allowed(AclOperation::Describe, Resource::group(group.group_id.0.as_str())) {
            denied_groups.push(group.group_id.clone());
            return false;
        }
        match group.topics.as_mut() {
            None => {
                all_topics_groups.insert(group.group_id.clone());
            }
            Some(topics) => {
                let names = topics.iter().map(|t| t.name.0.as_str());
                let denied = check.denied_names(AclOperation::Describe, ResourceType::Topic, names, true);
                topics.retain(|t| {
                    let keep = !denied.contains(t.name.0.as_str());
                    if !keep {
                        let entry = denied_topics.entry(group.group_id.clone()).or_default();
                        entry.push((t.name.clone(), t.partition_indexes.clone()));
                    }
                    keep
                });
            }
        }
        true
    });
    if denied_groups.is_empty() && denied_topics.is_empty() && all_topics_groups.is_empty() {
        return super::pass(RequestKind::OffsetFetch(req));
    }
    let nothing_left = req.groups.is_empty();
    let has_denials = !denied_groups.is_empty() || !denied_topics.is_empty();
    let filter = check.filter();
    let merge = Merge::with(has_denials, move |response| match response {
        ResponseKind::OffsetFetch(mut r) => {
            for group in &mut r.groups {
                if all_topics_groups.contains(&group.group_id) {
                    group.topics.retain(|t| filter.allowed(AclOperation::Describe, Resource::topic(t.name.0.as_str())));
                }
                if let Some(taken) = denied_topics.remove(&group.group_id) {
                    group.topics.extend(taken.into_iter().map(|(name, partitions)| {
                        let partitions = partitions
                            .into_iter()
                            .map(|p| {
                                OffsetFetchResponsePartitions::default()
                                    .with_partition_index(p)
                                    .with_committed_offset(-1)
                                    .with_error_code(code(TOPIC_DENIED))
                            })
                            .collect();
                        OffsetFetchResponseTopics::default().with_name(name).with_partitions(partitions)
                    }));
                }
            }
            r.groups.extend(
                denied_groups
                    .into_iter()
                    .map(|g| OffsetFetchResponseGroup::default().with_group_id(g).with_error_code(code(GROUP_DENIED))),
            );
            ResponseKind::OffsetFetch(r)
        }
        other => other,
    });
    answer_if_empty(RequestKind::OffsetFetch(req), nothing_left, merge, ResponseKind::OffsetFetch(Default::default()))
}

/// ListGroups: with DESCRIBE on the CLUSTER (asked quietly) every group; else only the groups the
/// principal may DESCRIBE, the others left out quietly.
pub(super) fn list_groups(check: &Check<'_>, req: ListGroupsRequest) -> Gate {
    if check.allowed_quietly(AclOperation::Describe, Resource::cluster()) {
        return super::pass(RequestKind::ListGroups(req));
    }
    let filter = check.filter();
    let merge = Merge::with(false, move |response| match response {
        ResponseKind::ListGroups(mut r) => {
            r.groups.retain(|g| filter.allowed(AclOperation::Describe, Resource::group(g.group_id.0.as_str())));
            ResponseKind::ListGroups(r)
        }
        other => other,
    });
    Gate::Handle { request: RequestKind::ListGroups(req), merge }
}

/// Takes the groups the principal may not DESCRIBE out of `groups`.
fn take_undescribable(check: &Check<'_>, groups: &mut Vec<GroupId>) -> Vec<GroupId> {
    let mut taken = Vec::new();
    groups.retain(|g| {
        let keep = check.allowed(AclOperation::Describe, Resource::group(g.0.as_str()));
        if !keep {
            taken.push(g.clone());
        }
        keep
    });
    taken
}

/// DescribeGroups: DESCRIBE on each group (else GROUP_AUTHORIZATION_FAILED); the asked-for authorized
/// operations (v3+) are filled in.
pub(super) fn describe_groups(check: &Check<'_>, mut req: DescribeGroupsRequest, version: i16) -> Gate {
    let taken = take_undescribable(check, &mut req.groups);
    let operations = version >= 3 && req.include_authorized_operations;
    if taken.is_empty() && !operations {
        return super::pass(RequestKind::DescribeGroups(req));
    }
    let nothing_left = req.groups.is_empty();
    let filter = check.filter();
    let merge = Merge::with(!taken.is_empty(), move |response| match response {
        ResponseKind::DescribeGroups(mut r) => {
            if operations {
                for g in r.groups.iter_mut().filter(|g| g.error_code == 0) {
                    g.authorized_operations = filter.authorized_operations(Resource::group(g.group_id.0.as_str()));
                }
            }
            r.groups.extend(
                taken
                    .into_iter()
                    .map(|g| DescribedGroup::default().with_group_id(g).with_error_code(code(GROUP_DENIED))),
            );
            ResponseKind::DescribeGroups(r)
        }
        other => other,
    });
    answer_if_empty(
        RequestKind::DescribeGroups(req),
        nothing_left,
        merge,
        ResponseKind::DescribeGroups(Default::default()),
    )
}

/// ConsumerGroupDescribe (KIP-848): DESCRIBE on each group, as DescribeGroups.
pub(super) fn consumer_group_describe(check: &Check<'_>, mut req: ConsumerGroupDescribeRequest) -> Gate {
    let taken = take_undescribable(check, &mut req.group_ids);
    let operations = req.include_authorized_operations;
    if taken.is_empty() && !operations {
        return super::pass(RequestKind::ConsumerGroupDescribe(req));
    }
    let nothing_left = req.group_ids.is_empty();
    let filter = check.filter();
    let merge = Merge::with(!taken.is_empty(), move |response| match response {
        ResponseKind::ConsumerGroupDescribe(mut r) => {
            if operations {
                for g in r.groups.iter_mut().filter(|g| g.error_code == 0) {
                    g.authorized_operations = filter.authorized_operations(Resource::group(g.group_id.0.as_str()));
                }
            }
            r.groups.extend(
                taken
                    .into_iter()
                    .map(|g| ConsumerDescribedGroup::default().with_group_id(g).with_error_code(code(GROUP_DENIED))),
            );
            ResponseKind::ConsumerGroupDescribe(r)
        }
        other => other,
    });
    let empty = ResponseKind::ConsumerGroupDescribe(Default::default());
    answer_if_empty(RequestKind::ConsumerGroupDescribe(req), nothing_left, merge, empty)
}

/// DeleteGroups: DELETE on each group.
pub(super) fn delete_groups(check: &Check<'_>, mut req: DeleteGroupsRequest) -> Gate {
    let mut taken = Vec::new();
    req.groups_names.retain(|g| {
        let keep = check.allowed(AclOperation::Delete, Resource::group(g.0.as_str()));
        if !keep {
            taken.push(g.clone());
        }
        keep
    });
    if taken.is_empty() {
        return super::pass(RequestKind::DeleteGroups(req));
    }
    let nothing_left = req.groups_names.is_empty();
    let merge = Merge::with(true, move |response| match response {
        ResponseKind::DeleteGroups(mut r) => {
            r.results.extend(
                taken
                    .into_iter()
                    .map(|g| DeletableGroupResult::default().with_group_id(g).with_error_code(code(GROUP_DENIED))),
            );
            ResponseKind::DeleteGroups(r)
        }
        other => other,
    });
    answer_if_empty(RequestKind::DeleteGroups(req), nothing_left, merge, ResponseKind::DeleteGroups(Default::default()))
}

/// OffsetDelete: DELETE on the group (else GROUP_AUTHORIZATION_FAILED for the request), then READ on each
/// topic (else TOPIC_AUTHORIZATION_FAILED for its partitions).
pub(super) fn offset_delete(check: &Check<'_>, mut req: OffsetDeleteRequest) -> Gate {
    if !check.allowed(AclOperation::Delete, Resource::group(req.group_id.0.as_str())) {
        return Gate::Answer(ResponseKind::OffsetDelete(
            OffsetDeleteResponse::default().with_error_code(code(GROUP_DENIED)),
        ));
    }
    let denied =
        check.denied_names(AclOperation::Read, ResourceType::Topic, req.topics.iter().map(|t| t.name.0.as_str()), true);
    if denied.is_empty() {
        return super::pass(RequestKind::OffsetDelete(req));
    }
    let mut taken = Vec::new();
    req.topics.retain(|t| {
        let keep = !denied.contains(t.name.0.as_str());
        if !keep {
            taken.push((t.name.clone(), t.partitions.iter().map(|p| p.partition_index).collect::<Vec<_>>()));
        }
        keep
    });
    let nothing_left = req.topics.is_empty();
    let merge = Merge::with(true, move |response| match response {
        ResponseKind::OffsetDelete(mut r) => {
            r.topics.extend(taken.into_iter().map(|(name, partitions)| {
                let partitions = partitions
                    .into_iter()
                    .map(|p| {
                        OffsetDeleteResponsePartition::default()
                            .with_partition_index(p)
                            .with_error_code(code(TOPIC_DENIED))
                    })
                    .collect();
                OffsetDeleteResponseTopic::default().with_name(name).with_partitions(partitions)
            }));
            ResponseKind::OffsetDelete(r)
        }
        other => other,
    });
    answer_if_empty(RequestKind::OffsetDelete(req), nothing_left, merge, ResponseKind::OffsetDelete(Default::default()))
}
