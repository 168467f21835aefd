//! AlterPartitionReassignments and ListPartitionReassignments (KIP-455): moving a partition to other
//! brokers while it keeps serving. The quorum records the target; the new replicas catch up from the
//! leader and join the ISR like any follower, and the quorum drops the leaving replicas once every target
//! replica is in sync (see [`Command::AlterReassignment`]).

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::list_partition_reassignments_response::{
    OngoingPartitionReassignment, OngoingTopicReassignment,
};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, BrokerId,
    ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::admin::commit;
use super::topic_name;
use crate::context::BrokerContext;
use crate::quorum::state::{Command, NodeId, PartitionRecord};

type Refusal = (i16, String);

pub(super) async fn alter_partition_reassignments(
    ctx: &Arc<BrokerContext>,
    req: AlterPartitionReassignmentsRequest,
) -> AlterPartitionReassignmentsResponse {
    let mut responses = Vec::with_capacity(req.topics.len());
    for topic in req.topics {
        let name = topic.name.0.as_str().to_string();
        let mut partitions = Vec::with_capacity(topic.partitions.len());
        for p in topic.partitions {
            let outcome = match target(ctx, &name, p.partition_index, p.replicas, req.allow_replication_factor_change) {
                Ok((partition, target)) => {
                    let what = match &target {
                        Some(t) => t.iter().map(|id| id.to_string()).collect::<Vec<_>>().join(","),
                        None => "cancelled".to_string(),
                    };
                    let command = Command::AlterReassignment { topic: name.clone(), partition, target };
                    let outcome = commit(ctx, command).await;
                    if outcome.is_ok() {
                        tracing::info!(partition = %format!("{name}-{partition}"), target = %what, "partition reassignment");
                    }
                    outcome
                }
                Err(refusal) => Err(refusal),
            };
            let (code, message) = match outcome {
                Ok(()) => (0, None),
                Err((code, message)) => (code, Some(StrBytes::from_string(message))),
            };
            partitions.push(
                ReassignablePartitionResponse::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(code)
                    .with_error_message(message),
            );
        }
        responses.push(ReassignableTopicResponse::default().with_name(topic.name).with_partitions(partitions));
    }
    AlterPartitionReassignmentsResponse::default()
        .with_allow_replication_factor_change(req.allow_replication_factor_change)
        .with_responses(responses)
}

/// The partition index and target of one asked reassignment (`None`: cancel), checked against what
/// the quorum would refuse less clearly.
fn target(
    ctx: &Arc<BrokerContext>,
    topic: &str,
    partition: i32,
    replicas: Option<Vec<BrokerId>>,
    allow_factor_change: bool,
) -> Result<(u32, Option<Vec<NodeId>>), Refusal> {
    let unknown = || (ResponseError::UnknownTopicOrPartition.code(), format!("{topic}-{partition} does not exist"));
    let index = u32::try_from(partition).map_err(|_| unknown())?;
    let Some(replicas) = replicas else { return Ok((index, None)) };
    let mut target = Vec::with_capacity(replicas.len());
    for id in replicas {
        let id = u32::try_from(id.0).map_err(|_| {
            (ResponseError::InvalidReplicaAssignment.code(), format!("broker id {} is not valid", id.0))
        })?;
        target.push(NodeId(id));
    }
    let image = ctx.image();
    let current = image.partition(topic, partition).ok_or_else(unknown)?;
    let factor = current.original_replicas().len();
    if !allow_factor_change && target.len() != factor {
        return Err((
            ResponseError::InvalidReplicationFactor.code(),
            format!("the replication factor would change from {factor} to {}", target.len()),
        ));
    }
    Ok((index, Some(target)))
}

pub(super) fn list_partition_reassignments(
    ctx: &Arc<BrokerContext>,
    req: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    let image = ctx.image();
    let ongoing = |index: usize, p: &PartitionRecord| {
        let ids = |list: &[NodeId]| list.iter().map(|id| BrokerId(id.0 as i32)).collect::<Vec<_>>();
        OngoingPartitionReassignment::default()
            .with_partition_index(index as i32)
            .with_replicas(ids(&p.replicas))
            .with_adding_replicas(ids(&p.adding_replicas))
            .with_removing_replicas(ids(&p.removing_replicas))
    };
    let mut topics = Vec::new();
    match req.topics {
        None => {
            for (name, topic) in &image.state.topics {
                let partitions: Vec<_> = (topic.partitions.iter().enumerate())
                    .filter(|(_, p)| p.reassigning())
                    .map(|(index, p)| ongoing(index, p))
                    .collect();
                if !partitions.is_empty() {
                    topics.push(
                        OngoingTopicReassignment::default().with_name(topic_name(name)).with_partitions(partitions),
                    );
                }
            }
        }
        Some(asked) => {
            for topic in asked {
                // As in Kafka, a topic that does not exist has nothing in progress.
                let Some(record) = image.topic(topic.name.0.as_str()) else { continue };
                let partitions: Vec<_> = (topic.partition_indexes.iter())
                    .filter_map(|&index| {
                        let p = record.partitions.get(usize::try_from(index).ok()?)?;
                        p.reassigning().then(|| ongoing(index as usize, p))
                    })
                    .collect();
                if !partitions.is_empty() {
                    topics.push(OngoingTopicReassignment::default().with_name(topic.name).with_partitions(partitions));
                }
            }
        }
    }
    ListPartitionReassignmentsResponse::default().with_topics(topics)
}
