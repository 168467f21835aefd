//! DescribeProducers (KIP-664), served by each partition's leader: the producers the partition
//! remembers and the transaction each has open there, what `shardlog transactions describe-producers`,
//! `find-hanging` and `abort` read. A partition not led here is NOT_LEADER_OR_FOLLOWER, one that does not
//! exist UNKNOWN_TOPIC_OR_PARTITION (authorization, READ on the topic, is checked before this).

use kafka_protocol::messages::describe_producers_response::{PartitionResponse, ProducerState, TopicResponse};
use kafka_protocol::messages::{DescribeProducersRequest, DescribeProducersResponse, ProducerId};

use super::*;

pub(super) async fn describe_producers(
    ctx: &Arc<BrokerContext>,
    req: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let mut topics = Vec::with_capacity(req.topics.len());
    for topic in &req.topics {
        let name = topic.name.0.as_str();
        let mut partitions = Vec::with_capacity(topic.partition_indexes.len());
        for &partition in &topic.partition_indexes {
            let described = match u32::try_from(partition) {
                Err(_) => Err(ResponseError::UnknownTopicOrPartition),
                Ok(index) => match ctx.leader_here(name, partition) {
                    Ok(led) => {
                        let tp = TopicPartition::new(name.to_string(), index);
                        ask_shard(ctx, led.shard, |reply| PartitionRequest::DescribeProducers { tp, reply })
                            .await
                            .unwrap_or(Err(ResponseError::KafkaStorageError))
                    }
                    Err(e) => Err(e),
                },
            };
            let answer = PartitionResponse::default().with_partition_index(partition);
            partitions.push(match described {
                Ok(producers) => answer.with_active_producers(
                    producers
                        .into_iter()
                        .map(|p| {
                            ProducerState::default()
                                .with_producer_id(ProducerId(p.producer_id))
                                .with_producer_epoch(p.producer_epoch.into())
                                .with_last_sequence(p.last_sequence)
                                .with_last_timestamp(p.last_timestamp_ms)
                                .with_coordinator_epoch(p.coordinator_epoch)
                                .with_current_txn_start_offset(p.current_txn_start_offset)
                        })
                        .collect(),
                ),
                Err(error) => answer.with_error_code(error.code()),
            });
        }
        topics.push(TopicResponse::default().with_name(topic.name.clone()).with_partitions(partitions));
    }
    DescribeProducersResponse::default().with_topics(topics)
}
