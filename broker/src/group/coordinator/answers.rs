//! How the coordinator's outcomes become answers: Kafka's mapping of write errors, the offsets and
//! descriptions handed back, and refusals of a call as a whole.

use std::collections::BTreeSet;

use bytes::Bytes;
use kafka_protocol::ResponseError;

use super::state::Entry;
use crate::group::call::{DescribedMember, FetchedOffset, GroupDescription, GroupOp};
use crate::group::classic::{Group, GroupState, JoinAnswer, SyncAnswer};

/// A write's error as a group request answers it (Kafka's mapping).
pub(super) fn coordinator_error(e: ResponseError) -> ResponseError {
    match e {
        ResponseError::UnknownTopicOrPartition
        | ResponseError::NotEnoughReplicas
        | ResponseError::NotEnoughReplicasAfterAppend
        | ResponseError::RequestTimedOut => ResponseError::CoordinatorNotAvailable,
        ResponseError::NotLeaderOrFollower | ResponseError::KafkaStorageError | ResponseError::FencedLeaderEpoch => {
            ResponseError::NotCoordinator
        }
        ResponseError::MessageTooLarge | ResponseError::RecordListTooLarge => ResponseError::UnknownServerError,
        other => other,
    }
}

/// A write's error as an offset commit answers it.
pub(super) fn commit_error(e: ResponseError) -> ResponseError {
    match e {
        ResponseError::MessageTooLarge | ResponseError::RecordListTooLarge => ResponseError::InvalidCommitOffsetSize,
        other => coordinator_error(other),
    }
}

pub(super) fn fetch_offsets(entry: Option<&Entry>, partitions: Option<Vec<(String, i32)>>) -> Vec<FetchedOffset> {
    match partitions {
        Some(wanted) => wanted
            .into_iter()
            .map(|(topic, partition)| {
                let committed = entry.and_then(|e| e.offsets.get(&(topic.clone(), partition))).map(|s| s.value.clone());
                FetchedOffset { topic, partition, committed }
            })
            .collect(),
        None => entry
            .map(|e| {
                e.offsets
                    .iter()
                    .map(|((topic, partition), s)| FetchedOffset {
                        topic: topic.clone(),
                        partition: *partition,
                        committed: Some(s.value.clone()),
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

pub(super) fn describe(entry: &Entry) -> GroupDescription {
    let group = &entry.group;
    let protocol = group.protocol.clone().unwrap_or_default();
    let stable = group.state == GroupState::Stable;
    GroupDescription {
        state: group.state.name(),
        protocol_type: group.protocol_type.clone().unwrap_or_default(),
        protocol: protocol.clone(),
        members: group
            .members
            .values()
            .map(|m| DescribedMember {
                member_id: m.member_id.clone(),
                instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                metadata: m.metadata(&protocol),
                // Kafka shows assignments only once the generation is stable.
                assignment: if stable { m.assignment.clone() } else { Bytes::new() },
            })
            .collect(),
    }
}

/// The topics a consumer group's members subscribe to (from their `consumer` protocol metadata).
pub(super) fn subscribed_topics(group: &Group) -> BTreeSet<String> {
    use kafka_protocol::messages::ConsumerProtocolSubscription;
    use kafka_protocol::protocol::Decodable;
    let mut topics = BTreeSet::new();
    if group.protocol_type.as_deref() != Some("consumer") || group.state == GroupState::Empty {
        return topics;
    }
    let protocol = group.protocol.clone().unwrap_or_default();
    for member in group.members.values() {
        let mut metadata = member.metadata(&protocol);
        if metadata.len() < 2 {
            continue;
        }
        let version = i16::from_be_bytes([metadata[0], metadata[1]]);
        bytes::Buf::advance(&mut metadata, 2);
        // Kafka's newest subscription version is 3; a newer one is read as 3 (fields are only added).
        if let Ok(sub) = ConsumerProtocolSubscription::decode(&mut metadata, version.clamp(0, 3)) {
            topics.extend(sub.topics.iter().map(|t| t.to_string()));
        }
    }
    topics
}

/// Answers a group call with `error`.
pub(super) fn refuse(op: GroupOp, error: ResponseError) {
    match op {
        GroupOp::Join { args, reply } => {
            let _ = reply.send(JoinAnswer::refused(error, &args.member_id));
        }
        GroupOp::Sync { reply, .. } => {
            let _ = reply.send(SyncAnswer::refused(error));
        }
        GroupOp::Heartbeat { reply, .. } => {
            let _ = reply.send(Some(error));
        }
        GroupOp::Leave { reply, .. } | GroupOp::Commit { reply, .. } | GroupOp::DeleteOffsets { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        GroupOp::FetchOffsets { reply, .. } => {
            let _ = reply.send(Err(error));
        }
        GroupOp::Describe { reply } => {
            let _ = reply.send(Err(error));
        }
        GroupOp::Delete { reply } => {
            let _ = reply.send(Some(error));
        }
    }
}
