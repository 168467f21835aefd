//! Partition reassignment (KIP-455) for the admin CLI: start or cancel moves, and list the ones in
//! progress. Any broker answers (a Kafka broker forwards to its controller).

use std::collections::BTreeMap;

use anyhow::{Result, bail};
use kafka_protocol::messages::alter_partition_reassignments_request::{ReassignablePartition, ReassignableTopic};
use kafka_protocol::messages::list_partition_reassignments_request::ListPartitionReassignmentsTopics;
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, ApiKey, BrokerId, ListPartitionReassignmentsRequest, ResponseKind,
};

use super::{KafkaClient, check, topic_name};

const ALTER_REASSIGNMENTS_V: i16 = 0;
const LIST_REASSIGNMENTS_V: i16 = 0;

/// A reassignment in progress: (replicas, adding, removing) broker ids.
pub type Ongoing = (Vec<i32>, Vec<i32>, Vec<i32>);

impl KafkaClient {
    /// Moves each listed partition to its replicas (`None`: cancels its reassignment in progress). Fails
    /// with every partition's refusal, after the others were sent.
    pub fn reassign(&mut self, topic: &str, targets: &[(i32, Option<Vec<i32>>)]) -> Result<()> {
        let partitions = targets
            .iter()
            .map(|(index, replicas)| {
                ReassignablePartition::default()
                    .with_partition_index(*index)
                    .with_replicas(replicas.as_ref().map(|r| r.iter().map(|&b| BrokerId(b)).collect()))
            })
            .collect();
        let req = AlterPartitionReassignmentsRequest::default()
            .with_timeout_ms(30_000)
            .with_topics(vec![ReassignableTopic::default().with_name(topic_name(topic)).with_partitions(partitions)]);
        let answer = self.call_any(ApiKey::AlterPartitionReassignments, ALTER_REASSIGNMENTS_V, &req)?;
        let ResponseKind::AlterPartitionReassignments(r) = answer else {
            bail!("wrong answer to AlterPartitionReassignments")
        };
        let detail = |m: &Option<kafka_protocol::protocol::StrBytes>| m.as_ref().map_or("", |m| m.as_str()).to_string();
        check(r.error_code, &format!("reassign {topic}: {}", detail(&r.error_message)))?;
        let mut refused = Vec::new();
        for p in r.responses.iter().flat_map(|t| &t.partitions) {
            if let Err(e) = check(p.error_code, &format!("{topic}-{}: {}", p.partition_index, detail(&p.error_message)))
            {
                refused.push(format!("{e:#}"));
            }
        }
        if !refused.is_empty() {
            bail!("{}", refused.join("; "));
        }
        Ok(())
    }

    /// The reassignments in progress of `topic`'s partitions, by partition.
    pub fn reassignments(&mut self, topic: &str, partitions: &[i32]) -> Result<BTreeMap<i32, Ongoing>> {
        let req = ListPartitionReassignmentsRequest::default().with_timeout_ms(30_000).with_topics(Some(vec![
            ListPartitionReassignmentsTopics::default()
                .with_name(topic_name(topic))
                .with_partition_indexes(partitions.to_vec()),
        ]));
        let answer = self.call_any(ApiKey::ListPartitionReassignments, LIST_REASSIGNMENTS_V, &req)?;
        let ResponseKind::ListPartitionReassignments(r) = answer else {
            bail!("wrong answer to ListPartitionReassignments")
        };
        check(r.error_code, &format!("list reassignments of {topic}"))?;
        let ids = |v: &[BrokerId]| v.iter().map(|b| b.0).collect::<Vec<_>>();
        let found = r.topics.iter().filter(|t| t.name.0.as_str() == topic).flat_map(|t| &t.partitions);
        Ok(found
            .map(|p| (p.partition_index, (ids(&p.replicas), ids(&p.adding_replicas), ids(&p.removing_replicas))))
            .collect())
    }
}
