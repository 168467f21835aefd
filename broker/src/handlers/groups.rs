//! Consumer groups: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit, TxnOffsetCommit,
//! OffsetFetch, ListGroups, DescribeGroups, DeleteGroups and OffsetDelete (the consumer protocol's own
//! requests are in [`super::consumer_groups`]). Each request is checked and
//! turned into calls to the group coordinator ([`crate::group::coordinator`]) on the shard that owns the
//! group's `__consumer_offsets` partition, when this broker leads it (NOT_COORDINATOR otherwise), and
//! the answers are put back into Kafka's response for the request's version.

use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
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
    DeleteGroupsRequest, DeleteGroupsResponse, DescribeGroupsRequest, DescribeGroupsResponse, GroupId,
    HeartbeatRequest, HeartbeatResponse, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest, LeaveGroupResponse,
    ListGroupsRequest, ListGroupsResponse, OffsetCommitRequest, OffsetCommitResponse, OffsetDeleteRequest,
    OffsetDeleteResponse, OffsetFetchRequest, OffsetFetchResponse, SyncGroupRequest, SyncGroupResponse,
    TxnOffsetCommitRequest, TxnOffsetCommitResponse,
};

use super::*;
use crate::group::call::{
    CoordinatorRequest, FetchedOffset, FetchingMember, GroupCall, GroupOp, OffsetToCommit, PerItem, TxnProducer,
};
use crate::group::classic::{JoinAnswer, JoinArgs, MemberRef, SyncAnswer};
use crate::group::{OFFSETS_TOPIC, offsets_partition};

/// The longest group id: the offsets topic's records count string lengths in an int16.
pub(super) const MAX_GROUP_ID_BYTES: usize = i16::MAX as usize;

pub(super) fn text(s: &StrBytes) -> String {
    s.as_str().to_string()
}

pub(super) fn str_bytes(s: impl Into<String>) -> StrBytes {
    StrBytes::from_string(s.into())
}

fn group_id(s: impl Into<String>) -> GroupId {
    GroupId(str_bytes(s))
}

/// Kafka's check of a group id: JoinGroup, SyncGroup, Heartbeat and LeaveGroup need a non-empty one.
fn check_group_id(group: &str, non_empty: bool) -> Result<(), ResponseError> {
    if (non_empty && group.is_empty()) || group.len() > MAX_GROUP_ID_BYTES {
        return Err(ResponseError::InvalidGroupId);
    }
    Ok(())
}

/// Asks the coordinator of `group` on this broker; NOT_COORDINATOR when another broker (or none) leads
/// the group's offsets partition.
pub(super) async fn ask<T>(
    ctx: &BrokerContext,
    group: &str,
    make: impl FnOnce(flume::Sender<T>) -> GroupOp,
) -> Result<T, ResponseError> {
    let image = ctx.image();
    let topic = image.topic(OFFSETS_TOPIC).ok_or(ResponseError::NotCoordinator)?;
    let partition = offsets_partition(group, topic.partitions.len() as u32);
    let led = ctx.leader_in(&image, OFFSETS_TOPIC, partition).map_err(|_| ResponseError::NotCoordinator)?;
    let (tx, rx) = flume::bounded(1);
    let call = GroupCall { partition, epoch: led.epoch, group: group.to_string(), op: make(tx) };
    ctx.groups[led.shard]
        .send_async(CoordinatorRequest::Group(call))
        .await
        .map_err(|_| ResponseError::CoordinatorNotAvailable)?;
    rx.recv_async().await.map_err(|_| ResponseError::CoordinatorNotAvailable)
}

pub(super) async fn join_group(
    ctx: &Arc<BrokerContext>,
    req: JoinGroupRequest,
    version: i16,
    client_id: &str,
    client_host: &str,
) -> JoinGroupResponse {
    let group = text(&req.group_id.0);
    let answer = match check_join(&req, version, &group) {
        Err(error) => JoinAnswer::refused(error, req.member_id.as_str()),
        Ok(()) => {
            let args = JoinArgs {
                member_id: text(&req.member_id),
                instance_id: req.group_instance_id.as_ref().map(text),
                client_id: client_id.to_string(),
                client_host: client_host.to_string(),
                session_timeout_ms: req.session_timeout_ms,
                rebalance_timeout_ms: if version >= 1 { req.rebalance_timeout_ms } else { req.session_timeout_ms },
                protocol_type: text(&req.protocol_type),
                protocols: req.protocols.iter().map(|p| (text(&p.name), p.metadata.clone())).collect(),
                require_known_member_id: version >= 4,
                supports_skip_assignment: version >= 9,
            };
            let member_id = args.member_id.clone();
            ask(ctx, &group, |reply| GroupOp::Join { args, reply })
                .await
                .unwrap_or_else(|e| JoinAnswer::refused(e, &member_id))
        }
    };
    JoinGroupResponse::default()
        .with_error_code(code(answer.error))
        .with_generation_id(answer.generation)
        .with_protocol_type(answer.protocol_type.map(str_bytes))
        // Nullable only from v7: an answer without a protocol says "" before that.
        .with_protocol_name(match answer.protocol_name {
            None if version < 7 => Some(StrBytes::from_static_str("")),
            name => name.map(str_bytes),
        })
        .with_leader(str_bytes(answer.leader))
        .with_skip_assignment(answer.skip_assignment)
        .with_member_id(str_bytes(answer.member_id))
        .with_members(
            answer
                .members
                .into_iter()
                .map(|m| {
                    JoinGroupResponseMember::default()
                        .with_member_id(str_bytes(m.member_id))
                        .with_group_instance_id(m.instance_id.map(str_bytes))
                        .with_metadata(m.metadata)
                })
                .collect(),
        )
}

/// A JoinGroup that cannot be right whatever the group's state: INVALID_GROUP_ID, INVALID_REQUEST.
fn check_join(req: &JoinGroupRequest, version: i16, group: &str) -> Result<(), ResponseError> {
    check_group_id(group, true)?;
    // Kafka's rules for group.instance.id are its rules for topic names.
    if req.group_instance_id.as_ref().is_some_and(|i| crate::topics::validate_topic_name(i.as_str()).is_err()) {
        return Err(ResponseError::InvalidRequest);
    }
    if version >= 1 && req.rebalance_timeout_ms < 0 {
        return Err(ResponseError::InvalidRequest);
    }
    let mut names = BTreeSet::new();
    if !req.protocols.iter().all(|p| names.insert(p.name.as_str())) {
        // The same protocol twice: which metadata would count?
        return Err(ResponseError::InvalidRequest);
    }
    Ok(())
}

pub(super) async fn sync_group(ctx: &Arc<BrokerContext>, req: SyncGroupRequest) -> SyncGroupResponse {
    let group = text(&req.group_id.0);
    let answer = match check_group_id(&group, true) {
        Err(e) => SyncAnswer::refused(e),
        Ok(()) => {
            let member =
                MemberRef { member_id: text(&req.member_id), instance_id: req.group_instance_id.as_ref().map(text) };
            let assignments = req.assignments.iter().map(|a| (text(&a.member_id), a.assignment.clone())).collect();
            let (protocol_type, protocol_name) =
                (req.protocol_type.as_ref().map(text), req.protocol_name.as_ref().map(text));
            ask(ctx, &group, |reply| GroupOp::Sync {
                member,
                generation: req.generation_id,
                protocol_type,
                protocol_name,
                assignments,
                reply,
            })
            .await
            .unwrap_or_else(SyncAnswer::refused)
        }
    };
    SyncGroupResponse::default()
        .with_error_code(code(answer.error))
        .with_protocol_type(answer.protocol_type.map(str_bytes))
        .with_protocol_name(answer.protocol_name.map(str_bytes))
        .with_assignment(answer.assignment)
}

pub(super) async fn heartbeat(ctx: &Arc<BrokerContext>, req: HeartbeatRequest) -> HeartbeatResponse {
    let group = text(&req.group_id.0);
    let error = match check_group_id(&group, true) {
        Err(e) => Some(e),
        Ok(()) => {
            let member =
                MemberRef { member_id: text(&req.member_id), instance_id: req.group_instance_id.as_ref().map(text) };
            ask(ctx, &group, |reply| GroupOp::Heartbeat { member, generation: req.generation_id, reply })
                .await
                .unwrap_or_else(Some)
        }
    };
    HeartbeatResponse::default().with_error_code(code(error))
}

pub(super) async fn leave_group(ctx: &Arc<BrokerContext>, req: LeaveGroupRequest, version: i16) -> LeaveGroupResponse {
    let group = text(&req.group_id.0);
    let members: Vec<MemberRef> = if version >= 3 {
        req.members
            .iter()
            .map(|m| MemberRef { member_id: text(&m.member_id), instance_id: m.group_instance_id.as_ref().map(text) })
            .collect()
    } else {
        vec![MemberRef { member_id: text(&req.member_id), instance_id: None }]
    };
    let outcome: PerItem = match check_group_id(&group, true) {
        Err(e) => Err(e),
        Ok(()) if members.is_empty() => Err(ResponseError::InvalidRequest),
        Ok(()) => {
            let leaving = members.clone();
            ask(ctx, &group, |reply| GroupOp::Leave { members: leaving, reply }).await.and_then(|r| r)
        }
    };
    match outcome {
        Err(e) => LeaveGroupResponse::default().with_error_code(e.code()),
        Ok(errors) if version < 3 => LeaveGroupResponse::default().with_error_code(code(errors[0])),
        Ok(errors) => LeaveGroupResponse::default().with_members(
            members
                .into_iter()
                .zip(errors)
                .map(|(m, e)| {
                    MemberResponse::default()
                        .with_member_id(str_bytes(m.member_id))
                        .with_group_instance_id(m.instance_id.map(str_bytes))
                        .with_error_code(code(e))
                })
                .collect(),
        ),
    }
}

/// Each partition of a commit, in request order: refused here (no such partition, an internal topic,
/// metadata too long), or to be sent to the coordinator.
type CheckedOffsets = (Vec<(String, i32, Option<ResponseError>)>, Vec<OffsetToCommit>);

/// Checks the offsets of an OffsetCommit or TxnOffsetCommit (each given with its topic's name).
fn check_offsets(ctx: &BrokerContext, offsets: impl Iterator<Item = OffsetToCommit>) -> CheckedOffsets {
    let image = ctx.image();
    let max_metadata = ctx.config.groups.offset_metadata_max_bytes;
    let mut checked = Vec::new();
    let mut sent = Vec::new();
    for o in offsets {
        let error = if image.partition(&o.topic, o.partition).is_none() || crate::topics::is_internal(&o.topic) {
            Some(ResponseError::UnknownTopicOrPartition)
        } else if o.metadata.len() > max_metadata {
            Some(ResponseError::OffsetMetadataTooLarge)
        } else {
            None
        };
        checked.push((o.topic.clone(), o.partition, error));
        if error.is_none() {
            sent.push(o);
        }
    }
    (checked, sent)
}

pub(super) async fn offset_commit(ctx: &Arc<BrokerContext>, req: OffsetCommitRequest) -> OffsetCommitResponse {
    let group = text(&req.group_id.0);
    let (checked, offsets) = check_offsets(
        ctx,
        req.topics.iter().flat_map(|t| {
            t.partitions.iter().map(|p| OffsetToCommit {
                topic: text(&t.name.0),
                partition: p.partition_index,
                offset: p.committed_offset,
                leader_epoch: p.committed_leader_epoch,
                metadata: p.committed_metadata.as_ref().map(text).unwrap_or_default(),
            })
        }),
    );
    let sent = offsets.len();
    let outcome: PerItem = match check_group_id(&group, false) {
        Err(e) => Err(e),
        Ok(()) => {
            let member =
                MemberRef { member_id: text(&req.member_id), instance_id: req.group_instance_id.as_ref().map(text) };
            let generation = req.generation_id_or_member_epoch;
            ask(ctx, &group, |reply| GroupOp::Commit { member, generation, offsets, reply }).await.and_then(|r| r)
        }
    };
    let results = match outcome {
        Ok(errors) => errors,
        Err(e) => vec![Some(e); sent],
    };
    let topics = by_topic_outcome(checked, results)
        .into_iter()
        .map(|(name, partitions)| {
            OffsetCommitResponseTopic::default().with_name(topic_name(&name)).with_partitions(
                partitions
                    .into_iter()
                    .map(|(p, e)| {
                        OffsetCommitResponsePartition::default().with_partition_index(p).with_error_code(code(e))
                    })
                    .collect(),
            )
        })
        .collect();
    OffsetCommitResponse::default().with_topics(topics)
}

/// TxnOffsetCommit v0-4 (KIP-98; v3+ carries the group metadata of KIP-447): the offsets are written for
/// the transaction of the producer, checked against the group as an OffsetCommit's (fencing by
/// generation and member), and become visible when the transaction commits.
pub(super) async fn txn_offset_commit(
    ctx: &Arc<BrokerContext>,
    req: TxnOffsetCommitRequest,
) -> TxnOffsetCommitResponse {
    let group = text(&req.group_id.0);
    let (checked, offsets) = check_offsets(
        ctx,
        req.topics.iter().flat_map(|t| {
            t.partitions.iter().map(|p| OffsetToCommit {
                topic: text(&t.name.0),
                partition: p.partition_index,
                offset: p.committed_offset,
                // Absent before v2: -1.
                leader_epoch: p.committed_leader_epoch,
                metadata: p.committed_metadata.as_ref().map(text).unwrap_or_default(),
            })
        }),
    );
    let sent = offsets.len();
    let producer = TxnProducer { id: req.producer_id.0, epoch: req.producer_epoch };
    let outcome: PerItem = if let Err(e) = check_group_id(&group, true) {
        Err(e)
    } else if producer.id < 0 || producer.epoch < 0 {
        // A transactional batch needs a producer id and epoch (InitProducerId gives them).
        Err(ResponseError::InvalidRequest)
    } else {
        // Absent before v3: generation -1, no member, no instance (the group is then not checked).
        let member =
            MemberRef { member_id: text(&req.member_id), instance_id: req.group_instance_id.as_ref().map(text) };
        let transactional_id = text(&req.transactional_id.0);
        let generation = req.generation_id;
        ask(ctx, &group, |reply| GroupOp::TxnCommit { transactional_id, producer, member, generation, offsets, reply })
            .await
            .and_then(|r| r)
    };
    let results = match outcome {
        Ok(errors) => errors,
        Err(e) => vec![Some(e); sent],
    };
    let topics = by_topic_outcome(checked, results)
        .into_iter()
        .map(|(name, partitions)| {
            TxnOffsetCommitResponseTopic::default().with_name(topic_name(&name)).with_partitions(
                partitions
                    .into_iter()
                    .map(|(p, e)| {
                        TxnOffsetCommitResponsePartition::default().with_partition_index(p).with_error_code(code(e))
                    })
                    .collect(),
            )
        })
        .collect();
    TxnOffsetCommitResponse::default().with_topics(topics)
}

/// A topic's partitions with their outcomes.
type TopicOutcome = (String, Vec<(i32, Option<ResponseError>)>);

/// Each partition's outcome, grouped by topic in request order: refused here (`checked`'s own error),
/// or the next of the coordinator's `results` (one per partition sent to it, in order).
fn by_topic_outcome(
    checked: Vec<(String, i32, Option<ResponseError>)>,
    results: Vec<Option<ResponseError>>,
) -> Vec<TopicOutcome> {
    let mut results = results.into_iter();
    let mut topics: Vec<TopicOutcome> = Vec::new();
    for (name, partition, refused) in checked {
        let error = refused.or_else(|| results.next().flatten());
        match topics.last_mut().filter(|(t, _)| *t == name) {
            Some((_, partitions)) => partitions.push((partition, error)),
            None => topics.push((name, vec![(partition, error)])),
        }
    }
    topics
}

/// The committed offsets of one group: the partitions asked for (`None`: all it has). With
/// `require_stable` (v7+), a partition whose offset waits for a transaction's marker carries
/// UNSTABLE_OFFSET_COMMIT.
async fn fetch_group(
    ctx: &BrokerContext,
    group: &str,
    partitions: Option<Vec<(String, i32)>>,
    member: FetchingMember,
    require_stable: bool,
) -> Result<Vec<FetchedOffset>, ResponseError> {
    check_group_id(group, false)?;
    ask(ctx, group, |reply| GroupOp::FetchOffsets { partitions, member, require_stable, reply }).await.and_then(|r| r)
}

/// The offsets by topic, in the order they came.
fn by_topic(fetched: Vec<FetchedOffset>) -> Vec<(String, Vec<FetchedOffset>)> {
    let mut out: Vec<(String, Vec<FetchedOffset>)> = Vec::new();
    for f in fetched {
        match out.iter_mut().find(|(t, _)| *t == f.topic) {
            Some((_, list)) => list.push(f),
            None => out.push((f.topic.clone(), vec![f])),
        }
    }
    out
}

fn fetched_fields(f: &FetchedOffset) -> (i64, i32, Option<StrBytes>) {
    match &f.committed {
        Some(c) => (c.offset, c.leader_epoch, Some(str_bytes(c.metadata.clone()))),
        None => (-1, -1, Some(StrBytes::from_static_str(""))),
    }
}

pub(super) async fn offset_fetch(
    ctx: &Arc<BrokerContext>,
    req: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
    if version >= 8 {
        let mut groups = Vec::new();
        for g in &req.groups {
            let group = text(&g.group_id.0);
            let wanted = g.topics.as_ref().map(|topics| {
                topics.iter().flat_map(|t| t.partition_indexes.iter().map(|p| (text(&t.name.0), *p))).collect()
            });
            // Before v9 the fields are absent and read as no member and epoch -1.
            let member = FetchingMember { member_id: g.member_id.as_ref().map(text), member_epoch: g.member_epoch };
            let answer = match fetch_group(ctx, &group, wanted, member, req.require_stable).await {
                Ok(fetched) => OffsetFetchResponseGroup::default().with_group_id(g.group_id.clone()).with_topics(
                    by_topic(fetched)
                        .into_iter()
                        .map(|(topic, list)| {
                            OffsetFetchResponseTopics::default().with_name(topic_name(&topic)).with_partitions(
                                list.iter()
                                    .map(|f| {
                                        let (offset, epoch, metadata) = fetched_fields(f);
                                        OffsetFetchResponsePartitions::default()
                                            .with_partition_index(f.partition)
                                            .with_committed_offset(offset)
                                            .with_committed_leader_epoch(epoch)
                                            .with_metadata(metadata)
                                            .with_error_code(code(f.error))
                                    })
                                    .collect(),
                            )
                        })
                        .collect(),
                ),
                Err(e) => {
                    OffsetFetchResponseGroup::default().with_group_id(g.group_id.clone()).with_error_code(e.code())
                }
            };
            groups.push(answer);
        }
        return OffsetFetchResponse::default().with_groups(groups);
    }
    let group = text(&req.group_id.0);
    let wanted: Option<Vec<(String, i32)>> = req
        .topics
        .as_ref()
        .map(|topics| topics.iter().flat_map(|t| t.partition_indexes.iter().map(|p| (text(&t.name.0), *p))).collect());
    // Absent before v7: false.
    let outcome = fetch_group(ctx, &group, wanted.clone(), FetchingMember::outsider(), req.require_stable).await;
    let (fetched, error) = match outcome {
        Ok(fetched) => (fetched, None),
        // Before v2 there is no group-level error: each partition carries it.
        Err(e) => {
            let each = wanted.unwrap_or_default();
            (
                each.into_iter()
                    .map(|(topic, partition)| FetchedOffset { topic, partition, committed: None, error: None })
                    .collect(),
                Some(e),
            )
        }
    };
    let partition_error = if version < 2 { error } else { None };
    let topics = by_topic(fetched)
        .into_iter()
        .map(|(topic, list)| {
            OffsetFetchResponseTopic::default().with_name(topic_name(&topic)).with_partitions(
                list.iter()
                    .map(|f| {
                        let (offset, epoch, metadata) = fetched_fields(f);
                        OffsetFetchResponsePartition::default()
                            .with_partition_index(f.partition)
                            .with_committed_offset(offset)
                            .with_committed_leader_epoch(epoch)
                            .with_metadata(metadata)
                            .with_error_code(code(partition_error.or(f.error)))
                    })
                    .collect(),
            )
        })
        .collect();
    let topics = if version >= 2 && error.is_some() { Vec::new() } else { topics };
    OffsetFetchResponse::default().with_topics(topics).with_error_code(if version >= 2 { code(error) } else { 0 })
}

pub(super) async fn list_groups(ctx: &Arc<BrokerContext>, req: ListGroupsRequest) -> ListGroupsResponse {
    let states: Vec<String> = req.states_filter.iter().map(|s| s.as_str().to_ascii_lowercase()).collect();
    let types: Vec<String> = req.types_filter.iter().map(|s| s.as_str().to_ascii_lowercase()).collect();
    let mut listed = Vec::new();
    for shard in &ctx.groups {
        let (tx, rx) = flume::bounded(1);
        let answer = match shard.send_async(CoordinatorRequest::List { reply: tx }).await {
            Ok(()) => rx.recv_async().await.unwrap_or(Err(ResponseError::CoordinatorNotAvailable)),
            Err(_) => Err(ResponseError::CoordinatorNotAvailable),
        };
        match answer {
            Ok(groups) => listed.extend(groups),
            Err(e) => return ListGroupsResponse::default().with_error_code(e.code()),
        }
    }
    let groups = listed
        .into_iter()
        .filter(|g| states.is_empty() || states.contains(&g.state.to_ascii_lowercase()))
        .filter(|g| types.is_empty() || types.iter().any(|t| t == g.group_type))
        .map(|g| {
            ListedGroup::default()
                .with_group_id(group_id(g.group))
                .with_protocol_type(str_bytes(g.protocol_type))
                .with_group_state(StrBytes::from_static_str(g.state))
                .with_group_type(StrBytes::from_static_str(g.group_type))
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}

pub(super) async fn describe_groups(
    ctx: &Arc<BrokerContext>,
    req: DescribeGroupsRequest,
    version: i16,
) -> DescribeGroupsResponse {
    let mut groups = Vec::new();
    for id in req.groups {
        let group = text(&id.0);
        let described = match check_group_id(&group, false) {
            Err(e) => Err(e),
            Ok(()) => ask(ctx, &group, |reply| GroupOp::Describe { reply }).await.and_then(|r| r),
        };
        let base = DescribedGroup::default().with_group_id(id).with_authorized_operations(i32::MIN);
        groups.push(match described {
            Ok(Some(d)) => base
                .with_group_state(StrBytes::from_static_str(d.state))
                .with_protocol_type(str_bytes(d.protocol_type))
                .with_protocol_data(str_bytes(d.protocol))
                .with_members(
                    d.members
                        .into_iter()
                        .map(|m| {
                            DescribedGroupMember::default()
                                .with_member_id(str_bytes(m.member_id))
                                .with_group_instance_id(m.instance_id.map(str_bytes))
                                .with_client_id(str_bytes(m.client_id))
                                .with_client_host(str_bytes(m.client_host))
                                .with_member_metadata(m.metadata)
                                .with_member_assignment(m.assignment)
                        })
                        .collect(),
                ),
            // Before v6 an unknown group is described as dead, without an error.
            Ok(None) if version < 6 => base.with_group_state(StrBytes::from_static_str("Dead")),
            Ok(None) => base
                .with_group_state(StrBytes::from_static_str("Dead"))
                .with_error_code(ResponseError::GroupIdNotFound.code())
                .with_error_message(Some(str_bytes(format!("group {group} not found")))),
            Err(e) => base.with_group_state(StrBytes::from_static_str("")).with_error_code(e.code()),
        });
    }
    DescribeGroupsResponse::default().with_groups(groups)
}

pub(super) async fn delete_groups(ctx: &Arc<BrokerContext>, req: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let mut results = Vec::new();
    for id in req.groups_names {
        let group = text(&id.0);
        let error = match check_group_id(&group, false) {
            Err(e) => Some(e),
            Ok(()) => ask(ctx, &group, |reply| GroupOp::Delete { reply }).await.unwrap_or_else(Some),
        };
        results.push(DeletableGroupResult::default().with_group_id(id).with_error_code(code(error)));
    }
    DeleteGroupsResponse::default().with_results(results)
}

pub(super) async fn offset_delete(ctx: &Arc<BrokerContext>, req: OffsetDeleteRequest) -> OffsetDeleteResponse {
    let group = text(&req.group_id.0);
    let image = ctx.image();
    let mut checked: Vec<(String, i32, Option<ResponseError>)> = Vec::new();
    let mut partitions = Vec::new();
    for topic in &req.topics {
        let name = text(&topic.name.0);
        for p in &topic.partitions {
            let error =
                image.partition(&name, p.partition_index).is_none().then_some(ResponseError::UnknownTopicOrPartition);
            if error.is_none() {
                partitions.push((name.clone(), p.partition_index));
            }
            checked.push((name.clone(), p.partition_index, error));
        }
    }
    let outcome: PerItem = match check_group_id(&group, false) {
        Err(e) => Err(e),
        Ok(()) => ask(ctx, &group, |reply| GroupOp::DeleteOffsets { partitions, reply }).await.and_then(|r| r),
    };
    let results = match outcome {
        Ok(errors) => errors,
        Err(e) => return OffsetDeleteResponse::default().with_error_code(e.code()),
    };
    let topics = by_topic_outcome(checked, results)
        .into_iter()
        .map(|(name, partitions)| {
            OffsetDeleteResponseTopic::default().with_name(topic_name(&name)).with_partitions(
                partitions
                    .into_iter()
                    .map(|(p, e)| {
                        OffsetDeleteResponsePartition::default().with_partition_index(p).with_error_code(code(e))
                    })
                    .collect(),
            )
        })
        .collect();
    OffsetDeleteResponse::default().with_topics(topics)
}
