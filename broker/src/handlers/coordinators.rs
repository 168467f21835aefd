//! FindCoordinator: which broker coordinates a consumer group (key type 0) or a transactional id (key
//! type 1). The coordinator of a key is the leader of one partition of the coordinator's internal topic
//! (`__consumer_offsets`, `__transaction_state`), chosen from the key by the coordinator's own function
//! ([`crate::group::offsets_partition`], [`crate::txn::transaction_partition`]). Until that topic exists
//! the first ask creates it ([`super::internal_topics`]) and every ask is answered
//! COORDINATOR_NOT_AVAILABLE, as it is while the partition has no live leader; clients retry both.
//!
//! Authorization (DESCRIBE on the group or the transactional id) is the dispatcher's
//! (`crate::security::authorizer::rules::groups`): keys that reach this handler are allowed.

use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::{FindCoordinatorRequest, FindCoordinatorResponse};

use super::internal_topics::{ensure_internal_topic, offsets_topic_spec, transaction_state_spec};
use super::*;
use crate::topics::internal::InternalTopicSpec;

/// A coordinator FindCoordinator can find: its topic, how a key picks a partition of it, and what a
/// partition without a leader is called in the answer.
struct CoordinatorKind {
    topic: InternalTopicSpec,
    partition_of: fn(&str, u32) -> i32,
    leaderless: &'static str,
}

/// The coordinator of FindCoordinator's `key_type`; `None` for one this broker does not serve.
fn coordinator_kind(ctx: &BrokerContext, key_type: i8) -> Option<CoordinatorKind> {
    match key_type {
        0 => Some(CoordinatorKind {
            topic: offsets_topic_spec(ctx),
            partition_of: crate::group::offsets_partition,
            leaderless: "the group's offsets partition has no leader",
        }),
        1 => Some(CoordinatorKind {
            topic: transaction_state_spec(ctx),
            partition_of: crate::txn::transaction_partition,
            leaderless: "the transactional id's __transaction_state partition has no leader",
        }),
        _ => None,
    }
}

pub(super) async fn find_coordinator(
    ctx: &Arc<BrokerContext>,
    req: FindCoordinatorRequest,
    version: i16,
    listener: &str,
) -> FindCoordinatorResponse {
    let keys = if version >= 4 { req.coordinator_keys.clone() } else { vec![req.key.clone()] };
    let image = ctx.image();
    let kind = coordinator_kind(ctx, req.key_type);
    if let Some(kind) = &kind
        && image.topic(kind.topic.name).is_none()
    {
        ensure_internal_topic(ctx, kind.topic);
    }
    let brokers = &image.state.brokers;
    let coordinators: Vec<Coordinator> = keys
        .into_iter()
        .map(|key| {
            let refused = |error: ResponseError, message: &str| {
                Coordinator::default()
                    .with_key(key.clone())
                    .with_node_id(BrokerId(-1))
                    .with_host(StrBytes::from_static_str(""))
                    .with_port(-1)
                    .with_error_code(error.code())
                    .with_error_message(Some(StrBytes::from_string(message.to_string())))
            };
            let Some(kind) = &kind else {
                return refused(
                    ResponseError::InvalidRequest,
                    "only group (key type 0) and transaction (key type 1) coordinators are served",
                );
            };
            let Some(topic) = image.topic(kind.topic.name) else {
                return refused(
                    ResponseError::CoordinatorNotAvailable,
                    &format!("{} is being created", kind.topic.name),
                );
            };
            let partition = (kind.partition_of)(key.as_str(), topic.partitions.len() as u32);
            let leader = image.partition(kind.topic.name, partition).and_then(|p| p.leader);
            let live = leader.filter(|id| brokers.get(id).is_some_and(|b| !b.fenced));
            match live.and_then(|id| Some((id, ctx.broker_address(&image, id, listener)?))) {
                Some((id, (host, port))) => Coordinator::default()
                    .with_key(key.clone())
                    .with_node_id(BrokerId(id.0 as i32))
                    .with_host(StrBytes::from_string(host))
                    .with_port(port as i32),
                None => refused(ResponseError::CoordinatorNotAvailable, kind.leaderless),
            }
        })
        .collect();
    if version >= 4 {
        return FindCoordinatorResponse::default().with_coordinators(coordinators);
    }
    let one = coordinators.into_iter().next().unwrap_or_default();
    FindCoordinatorResponse::default()
        .with_error_code(one.error_code)
        .with_error_message(one.error_message)
        .with_node_id(one.node_id)
        .with_host(one.host)
        .with_port(one.port)
}
