//! ElectLeaders: a preferred election moves a partition's leadership back to its first replica, if that
//! one is live and in sync; an unclean one gives a partition without a leader the first live in-sync
//! replica, or failing that any live replica (logged by the quorum as possible data loss).

use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::{ElectLeadersRequest, ElectLeadersResponse, TopicName};
use kafka_protocol::protocol::StrBytes;

use super::admin::commit;
use crate::context::BrokerContext;
use crate::quorum::state::Command;

/// Kafka's `ElectionType`: 0 preferred, 1 unclean.
const UNCLEAN: i8 = 1;

pub(super) async fn elect_leaders(ctx: &Arc<BrokerContext>, req: ElectLeadersRequest) -> ElectLeadersResponse {
    if req.election_type != 0 && req.election_type != UNCLEAN {
        return ElectLeadersResponse::default().with_error_code(ResponseError::InvalidRequest.code());
    }
    let unclean = req.election_type == UNCLEAN;
    let image = ctx.image();
    // Every partition asked for; without a list, every partition whose election would change something.
    let asked: Vec<(TopicName, Vec<i32>)> = match &req.topic_partitions {
        Some(topics) => topics.iter().map(|t| (t.topic.clone(), t.partitions.clone())).collect(),
        None => image
            .state
            .topics
            .iter()
            .map(|(name, topic)| {
                let wanted = topic.partitions.iter().enumerate().filter(|(_, p)| {
                    if unclean { p.leader.is_none() } else { p.leader != p.replicas.first().copied() }
                });
                (TopicName(StrBytes::from_string(name.clone())), wanted.map(|(i, _)| i as i32).collect::<Vec<_>>())
            })
            .filter(|(_, partitions)| !partitions.is_empty())
            .collect(),
    };
    let mut results = Vec::with_capacity(asked.len());
    for (topic, partitions) in asked {
        let mut partition_result = Vec::with_capacity(partitions.len());
        for partition in partitions {
            let name = topic.0.as_str().to_string();
            let outcome = match u32::try_from(partition) {
                Err(_) => Err((ResponseError::UnknownTopicOrPartition.code(), format!("partition {partition}"))),
                Ok(partition) if unclean => commit(ctx, Command::ElectUncleanLeader { topic: name, partition }).await,
                Ok(partition) => commit(ctx, Command::ElectPreferredLeader { topic: name, partition }).await,
            };
            let (code, message) = match outcome {
                Ok(()) => (0, None),
                Err((code, message)) => (code, Some(StrBytes::from_string(message))),
            };
            partition_result.push(
                PartitionResult::default()
                    .with_partition_id(partition)
                    .with_error_code(code)
                    .with_error_message(message),
            );
        }
        results.push(ReplicaElectionResult::default().with_topic(topic).with_partition_result(partition_result));
    }
    ElectLeadersResponse::default().with_replica_election_results(results)
}
