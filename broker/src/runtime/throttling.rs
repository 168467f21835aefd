//! A connection's side of client quotas (KIP-219): which quotas a request counts against, the throttle
//! it earns, the mute that holds the connection for that long, and the `throttle_time_ms` its answer
//! carries. Every Kafka response that has the field carries the throttle, so that the client holds back
//! as long as the broker mutes its connection; a version that does not encode it leaves the value out.

use std::cell::Cell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::{RequestKind, ResponseKind};
use shardlog_net::kafka::DecodedRequest;

use crate::context::BrokerContext;
use crate::security::quotas::{Applied, QuotaKind};
use crate::security::session::ClientInfo;

/// Until when a connection is muted for a quota (KIP-219): shared by its reader, which reads no request
/// before then, and the handlers that throttle it.
pub(super) type Mute = Rc<Cell<Option<Instant>>>;

/// Mutes the connection for `throttle` from now (a longer mute already set stands), and counts it.
pub(super) fn throttle_connection(mute: &Mute, kind: QuotaKind, throttle: Duration) {
    if throttle.is_zero() {
        return;
    }
    crate::metrics::quota_throttled(kind.label(), throttle);
    let until = Instant::now() + throttle;
    if mute.get().is_none_or(|current| current < until) {
        mute.set(Some(until));
    }
}

/// The byte rate quota that applies to `request` (if it is a Produce or a Fetch) and its
/// request_percentage quota, where the client has them.
pub(super) fn quotas_of(
    ctx: &BrokerContext,
    request: &DecodedRequest,
    client: &ClientInfo,
) -> (Option<Applied>, Option<Applied>) {
    if !ctx.quotas.any() {
        return (None, None);
    }
    let image = ctx.image();
    let client_id = request.header.client_id.as_deref().unwrap_or("");
    let user = &client.principal.name;
    let bytes = match &request.body {
        RequestKind::Produce(_) => ctx.quotas.applied(&image, QuotaKind::Produce, user, client_id),
        RequestKind::Fetch(_) => ctx.quotas.applied(&image, QuotaKind::Fetch, user, client_id),
        _ => None,
    };
    (bytes, ctx.quotas.applied(&image, QuotaKind::Request, user, client_id))
}

/// Counts a request's handler time against its request_percentage quota, if it has one; returns the
/// throttle time, with the connection muted for it.
pub(super) fn throttle_request_time(
    ctx: &BrokerContext,
    quota: Option<&Applied>,
    spent: Duration,
    mute: &Mute,
) -> Duration {
    let Some(applied) = quota else { return Duration::ZERO };
    // Percent of a thread's second, as Kafka records it.
    let throttle = ctx.quotas.record(applied, spent.as_secs_f64() * 100.0);
    throttle_connection(mute, QuotaKind::Request, throttle);
    throttle
}

/// Counts a Fetch answer against its quota: an answer that takes the client above it is not counted and
/// is replaced by an empty one, which carries the throttle time (as Kafka answers a throttled fetch).
pub(super) fn throttle_fetch(ctx: &BrokerContext, applied: &Applied, body: &mut ResponseKind, mute: &Mute) {
    let ResponseKind::Fetch(response) = body else { return };
    let bytes: usize =
        response.responses.iter().flat_map(|t| &t.partitions).map(|p| p.records.as_ref().map_or(0, |r| r.len())).sum();
    let throttle = ctx.quotas.record(applied, bytes as f64);
    if throttle.is_zero() {
        return;
    }
    ctx.quotas.unrecord(applied, bytes as f64);
    response.responses.clear();
    set(body, throttle);
    throttle_connection(mute, QuotaKind::Fetch, throttle);
}

macro_rules! throttle_time_fields {
    ($($kind:ident),* $(,)?) => {
        /// Sets the answer's `throttle_time_ms` (nothing for a response without the field).
        pub(super) fn set(body: &mut ResponseKind, throttle: Duration) {
            let ms = throttle.as_millis().min(i32::MAX as u128) as i32;
            match body {
                $(ResponseKind::$kind(r) => r.throttle_time_ms = ms,)*
                _ => {}
            }
        }

        /// The `throttle_time_ms` the answer carries already (zero for a response without the field).
        pub(super) fn of(body: &ResponseKind) -> Duration {
            let ms = match body {
                $(ResponseKind::$kind(r) => r.throttle_time_ms,)*
                _ => 0,
            };
            Duration::from_millis(ms.max(0) as u64)
        }
    };
}

throttle_time_fields!(
    AddOffsetsToTxn,
    AddPartitionsToTxn,
    AddRaftVoter,
    AllocateProducerIds,
    AlterClientQuotas,
    AlterConfigs,
    AlterPartitionReassignments,
    AlterPartition,
    AlterReplicaLogDirs,
    AlterShareGroupOffsets,
    AlterUserScramCredentials,
    ApiVersions,
    AssignReplicasToDirs,
    BrokerHeartbeat,
    BrokerRegistration,
    ConsumerGroupDescribe,
    ConsumerGroupHeartbeat,
    ControllerRegistration,
    CreateAcls,
    CreateDelegationToken,
    CreatePartitions,
    CreateTopics,
    DeleteAcls,
    DeleteGroups,
    DeleteRecords,
    DeleteShareGroupOffsets,
    DeleteTopics,
    DescribeAcls,
    DescribeClientQuotas,
    DescribeCluster,
    DescribeConfigs,
    DescribeDelegationToken,
    DescribeGroups,
    DescribeLogDirs,
    DescribeProducers,
    DescribeShareGroupOffsets,
    DescribeTopicPartitions,
    DescribeTransactions,
    DescribeUserScramCredentials,
    ElectLeaders,
    EndTxn,
    ExpireDelegationToken,
    Fetch,
    FetchSnapshot,
    FindCoordinator,
    GetTelemetrySubscriptions,
    Heartbeat,
    IncrementalAlterConfigs,
    InitProducerId,
    JoinGroup,
    LeaveGroup,
    ListConfigResources,
    ListGroups,
    ListOffsets,
    ListPartitionReassignments,
    ListTransactions,
    Metadata,
    OffsetCommit,
    OffsetDelete,
    OffsetFetch,
    OffsetForLeaderEpoch,
    Produce,
    PushTelemetry,
    RemoveRaftVoter,
    RenewDelegationToken,
    ShareAcknowledge,
    ShareFetch,
    ShareGroupDescribe,
    ShareGroupHeartbeat,
    SyncGroup,
    TxnOffsetCommit,
    UnregisterBroker,
    UpdateFeatures,
    UpdateRaftVoter
);

#[cfg(test)]
mod tests {
    use kafka_protocol::messages::{MetadataResponse, OffsetCommitResponse, SaslHandshakeResponse};

    use super::*;

    #[test]
    fn every_answer_with_the_field_carries_the_throttle_and_others_are_left_alone() {
        for mut body in [
            ResponseKind::Metadata(MetadataResponse::default()),
            ResponseKind::OffsetCommit(OffsetCommitResponse::default()),
        ] {
            set(&mut body, Duration::from_millis(1500));
            assert_eq!(of(&body), Duration::from_millis(1500));
        }
        // SaslHandshake has no throttle_time_ms.
        let mut body = ResponseKind::SaslHandshake(SaslHandshakeResponse::default());
        set(&mut body, Duration::from_millis(1500));
        assert_eq!(of(&body), Duration::ZERO);
    }
}
