//! How the coordinator's outcomes become answers: Kafka's mapping of write errors, the offsets and
//! descriptions handed back, and refusals of a call as a whole.

use std::collections::BTreeSet;

use bytes::Bytes;
use kafka_protocol::ResponseError;

use super::state::Entry;
use crate::group::call::{
    ConsumerGroupDescription, ConsumerMemberDescription, DescribedMember, FetchedOffset, GroupDescription, GroupOp,
};
use crate::group::classic::{Group, GroupState, JoinAnswer, SyncAnswer};
use crate::group::consumer::{ConsumerGroup, ConsumerGroupSettings, Refusal};

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

/// The committed offsets of the partitions asked for (`None`: every one the group has). With
/// `require_stable`, a partition with a transaction's offset waiting for its marker answers
/// UNSTABLE_OFFSET_COMMIT instead, as Kafka's do (a read_committed consumer retries).
pub(super) fn fetch_offsets(
    entry: Option<&Entry>,
    partitions: Option<Vec<(String, i32)>>,
    require_stable: bool,
) -> Vec<FetchedOffset> {
    let answer = |topic: String, partition: i32| {
        let key = (topic, partition);
        if require_stable && entry.is_some_and(|e| e.txn_offsets.has(&key)) {
            let error = Some(ResponseError::UnstableOffsetCommit);
            return FetchedOffset { topic: key.0, partition, committed: None, error };
        }
        let committed = entry.and_then(|e| e.offsets.get(&key)).map(|s| s.value.clone());
        FetchedOffset { topic: key.0, partition, committed, error: None }
    };
    match partitions {
        Some(wanted) => wanted.into_iter().map(|(topic, partition)| answer(topic, partition)).collect(),
        None => entry
            .map(|e| e.offsets.keys().map(|(topic, partition)| answer(topic.clone(), *partition)).collect())
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
    let mut topics = BTreeSet::new();
    if group.protocol_type.as_deref() != Some("consumer") || group.state == GroupState::Empty {
        return topics;
    }
    let protocol = group.protocol.clone().unwrap_or_default();
    for member in group.members.values() {
        topics.extend(subscription_topics(&member.metadata(&protocol)));
    }
    topics
}

/// The topic list at the start of a `consumer` protocol subscription (every version begins with it):
/// version (int16), count (int32), then each name (int16 length, UTF-8). Read here with every length
/// checked against what is left, since the bytes come from a client; what does not read gives none.
fn subscription_topics(metadata: &[u8]) -> Vec<String> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        if b.len() < n {
            return None;
        }
        let (head, rest) = b.split_at(n);
        *b = rest;
        Some(head)
    }
    let read = |mut b: &[u8]| -> Option<Vec<String>> {
        take(&mut b, 2)?;
        let count = i32::from_be_bytes(take(&mut b, 4)?.try_into().ok()?);
        // Each name takes at least its two length bytes.
        if count < 0 || count as usize > b.len() / 2 {
            return None;
        }
        let mut names = Vec::with_capacity(count as usize);
        for _ in 0..count {
            let len = i16::from_be_bytes(take(&mut b, 2)?.try_into().ok()?);
            let name = take(&mut b, usize::try_from(len).ok()?)?;
            names.push(String::from_utf8(name.to_vec()).ok()?);
        }
        Some(names)
    };
    read(metadata).unwrap_or_default()
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
        GroupOp::Leave { reply, .. }
        | GroupOp::Commit { reply, .. }
        | GroupOp::TxnCommit { reply, .. }
        | GroupOp::DeleteOffsets { reply, .. } => {
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
        GroupOp::ConsumerHeartbeat { reply, .. } => {
            let _ = reply.send(Err(Refusal { error, message: String::new() }));
        }
        GroupOp::ConsumerDescribe { reply } => {
            let _ = reply.send(Err(error));
        }
    }
}

/// A consumer-protocol group as ConsumerGroupDescribe shows it.
pub(super) fn describe_consumer(group: &ConsumerGroup, settings: &ConsumerGroupSettings) -> ConsumerGroupDescription {
    ConsumerGroupDescription {
        state: group.state().name(),
        epoch: group.epoch,
        assignment_epoch: group.assignment_epoch,
        assignor: group.assignor(settings).name(),
        members: group
            .members
            .values()
            .map(|m| ConsumerMemberDescription {
                member_id: m.member_id.clone(),
                instance_id: m.metadata.instance_id.clone(),
                rack_id: m.metadata.rack_id.clone(),
                member_epoch: m.current.epoch,
                client_id: m.metadata.client_id.clone(),
                client_host: m.metadata.client_host.clone(),
                subscribed_topic_names: m.metadata.subscribed_topic_names.iter().cloned().collect(),
                subscribed_topic_regex: m.metadata.subscribed_topic_regex.clone(),
                assignment: m.current.assigned.clone(),
                target: group.target.get(&m.member_id).cloned().unwrap_or_default(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscribed_topics_are_read_with_every_length_bounded() {
        use kafka_protocol::messages::ConsumerProtocolSubscription;
        use kafka_protocol::protocol::{Encodable, StrBytes};
        let sub = ConsumerProtocolSubscription::default()
            .with_topics(vec![StrBytes::from_static_str("orders"), StrBytes::from_static_str("payments")]);
        for version in 0..=3 {
            let mut bytes = bytes::BytesMut::new();
            bytes::BufMut::put_i16(&mut bytes, version);
            sub.encode(&mut bytes, version).unwrap();
            assert_eq!(subscription_topics(&bytes), vec!["orders".to_string(), "payments".to_string()]);
            for cut in 0..8 + 6 {
                assert!(subscription_topics(&bytes[..cut]).len() < 2, "cut at {cut}");
            }
        }
        // A count claiming billions of names allocates nothing.
        assert!(subscription_topics(&[0, 0, 0x7f, 0xff, 0xff, 0xff, 0, 1, b'a']).is_empty());
    }
}
