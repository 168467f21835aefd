//! The consumer protocol's own requests (KIP-848): ConsumerGroupHeartbeat and ConsumerGroupDescribe,
//! checked and turned into calls to the group's coordinator like the classic protocol's
//! ([`super::groups`]).

use kafka_protocol::messages::{
    ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse, ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse, consumer_group_describe_response, consumer_group_heartbeat_request,
    consumer_group_heartbeat_response,
};

use super::groups::{MAX_GROUP_ID_BYTES, ask, str_bytes, text};
use super::*;
use crate::group::call::GroupOp;
use crate::group::consumer::{Assignment, Heartbeat, Refusal};

/// The partitions of a heartbeat's TopicPartitions as an assignment.
fn owned_partitions(topics: &[consumer_group_heartbeat_request::TopicPartitions]) -> Assignment {
    let mut owned = Assignment::new();
    for t in topics {
        owned.entry(t.topic_id).or_default().extend(t.partitions.iter().copied());
    }
    owned
}

/// ConsumerGroupHeartbeat (KIP-848): checked, then decided by the group's coordinator.
pub(super) async fn consumer_group_heartbeat(
    ctx: &Arc<BrokerContext>,
    req: ConsumerGroupHeartbeatRequest,
    version: i16,
    client_id: &str,
    client_host: &str,
) -> ConsumerGroupHeartbeatResponse {
    let group = text(&req.group_id.0);
    let refused = |error: ResponseError, message: String| {
        ConsumerGroupHeartbeatResponse::default()
            .with_error_code(error.code())
            .with_error_message(Some(str_bytes(message)))
            .with_member_epoch(-1)
    };
    if group.trim().is_empty() {
        return refused(ResponseError::InvalidRequest, "GroupId can't be empty.".into());
    }
    if group.len() > MAX_GROUP_ID_BYTES {
        return refused(ResponseError::InvalidRequest, format!("GroupId is longer than {MAX_GROUP_ID_BYTES} bytes."));
    }
    let mut member_id = text(&req.member_id);
    if version == 0 && member_id.is_empty() && req.member_epoch == 0 {
        // Version 0 leaves the member id to the coordinator; from version 1 the client makes it.
        member_id = uuid::Uuid::new_v4().simple().to_string();
    }
    let heartbeat = Box::new(Heartbeat {
        member_id,
        member_epoch: req.member_epoch,
        instance_id: req.instance_id.as_ref().map(text),
        rack_id: req.rack_id.as_ref().map(text),
        rebalance_timeout_ms: req.rebalance_timeout_ms,
        subscribed_topic_names: req
            .subscribed_topic_names
            .as_ref()
            .map(|names| names.iter().map(|n| text(&n.0)).collect()),
        subscribed_topic_regex: req.subscribed_topic_regex.as_ref().map(text),
        server_assignor: req.server_assignor.as_ref().map(text),
        owned: req.topic_partitions.as_deref().map(owned_partitions),
        client_id: client_id.to_string(),
        client_host: client_host.to_string(),
    });
    match ask(ctx, &group, |reply| GroupOp::ConsumerHeartbeat { heartbeat, reply }).await {
        Err(error) => refused(error, String::new()),
        Ok(Err(Refusal { error, message })) => refused(error, message),
        Ok(Ok(answer)) => ConsumerGroupHeartbeatResponse::default()
            .with_member_id(Some(str_bytes(answer.member_id)))
            .with_member_epoch(answer.member_epoch)
            .with_heartbeat_interval_ms(answer.heartbeat_interval_ms)
            .with_assignment(answer.assignment.map(|assignment| {
                consumer_group_heartbeat_response::Assignment::default().with_topic_partitions(
                    assignment
                        .into_iter()
                        .map(|(topic_id, partitions)| {
                            consumer_group_heartbeat_response::TopicPartitions::default()
                                .with_topic_id(topic_id)
                                .with_partitions(partitions.into_iter().collect())
                        })
                        .collect(),
                )
            })),
    }
}

/// An assignment as ConsumerGroupDescribe shows it, with topic names; topics no longer in the metadata
/// are left out.
fn described_assignment(image: &MetadataImage, assignment: Assignment) -> consumer_group_describe_response::Assignment {
    let names: BTreeMap<uuid::Uuid, &str> = image.state.topics.iter().map(|(name, t)| (t.id, name.as_str())).collect();
    consumer_group_describe_response::Assignment::default().with_topic_partitions(
        assignment
            .into_iter()
            .filter_map(|(id, partitions)| {
                let name = names.get(&id)?;
                Some(
                    consumer_group_describe_response::TopicPartitions::default()
                        .with_topic_id(id)
                        .with_topic_name(TopicName(str_bytes(*name)))
                        .with_partitions(partitions.into_iter().collect()),
                )
            })
            .collect(),
    )
}

/// ConsumerGroupDescribe (KIP-848).
pub(super) async fn consumer_group_describe(
    ctx: &Arc<BrokerContext>,
    req: ConsumerGroupDescribeRequest,
) -> ConsumerGroupDescribeResponse {
    let mut groups = Vec::new();
    for id in req.group_ids {
        let group = text(&id.0);
        let base = consumer_group_describe_response::DescribedGroup::default()
            .with_group_id(id)
            .with_authorized_operations(i32::MIN);
        let described = if group.is_empty() {
            Err(ResponseError::InvalidGroupId)
        } else {
            ask(ctx, &group, |reply| GroupOp::ConsumerDescribe { reply }).await.and_then(|r| r)
        };
        let image = ctx.image();
        groups.push(match described {
            Ok(Some(d)) => base
                .with_group_state(StrBytes::from_static_str(d.state))
                .with_group_epoch(d.epoch)
                .with_assignment_epoch(d.assignment_epoch)
                .with_assignor_name(StrBytes::from_static_str(d.assignor))
                .with_members(
                    d.members
                        .into_iter()
                        .map(|m| {
                            consumer_group_describe_response::Member::default()
                                .with_member_id(str_bytes(m.member_id))
                                .with_instance_id(m.instance_id.map(str_bytes))
                                .with_rack_id(m.rack_id.map(str_bytes))
                                .with_member_epoch(m.member_epoch)
                                .with_client_id(str_bytes(m.client_id))
                                .with_client_host(str_bytes(m.client_host))
                                .with_subscribed_topic_names(
                                    m.subscribed_topic_names.into_iter().map(|n| TopicName(str_bytes(n))).collect(),
                                )
                                .with_subscribed_topic_regex(m.subscribed_topic_regex.map(str_bytes))
                                .with_assignment(described_assignment(&image, m.assignment))
                                .with_target_assignment(described_assignment(&image, m.target))
                                .with_member_type(1)
                        })
                        .collect(),
                ),
            Ok(None) => base
                .with_group_state(StrBytes::from_static_str("Dead"))
                .with_error_code(ResponseError::GroupIdNotFound.code())
                .with_error_message(Some(str_bytes(format!("group {group} is not a consumer group")))),
            Err(e) => base.with_group_state(StrBytes::from_static_str("")).with_error_code(e.code()),
        });
    }
    ConsumerGroupDescribeResponse::default().with_groups(groups)
}
