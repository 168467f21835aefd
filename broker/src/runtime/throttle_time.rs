//! The `throttle_time_ms` of an answer (KIP-219): every Kafka response that has the field carries the
//! throttle of the quota its request went over, so that the client holds back as long as the broker
//! mutes its connection. Kafka's schemas give these responses the field; a version that does not encode
//! it leaves the value out.

use std::time::Duration;

use kafka_protocol::messages::ResponseKind;

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
