//! Partition reassignment (KIP-455) for the admin CLI: start or cancel moves, and list the ones in
//! progress. Any broker answers (a Kafka broker forwards to its controller).

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Result, bail};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::alter_partition_reassignments_request::{ReassignablePartition, ReassignableTopic};
use kafka_protocol::messages::list_partition_reassignments_request::ListPartitionReassignmentsTopics;
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, ApiKey, BrokerId, ListPartitionReassignmentsRequest, ResponseKind,
};
use kafka_protocol::protocol::StrBytes;

use super::{KafkaClient, RETRY_PAUSE, check, topic_name};

const ALTER_REASSIGNMENTS_V: i16 = 0;
const LIST_REASSIGNMENTS_V: i16 = 0;

/// A reassignment in progress: (replicas, adding, removing) broker ids.
pub type Ongoing = (Vec<i32>, Vec<i32>, Vec<i32>);

/// A partition whose reassignment (or cancel) was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    pub partition: i32,
    /// Kafka's error code.
    pub code: i16,
    pub message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let error = kafka_protocol::ResponseError::try_from_code(self.code).map(|e| e.to_string());
        write!(
            f,
            "partition {}: {} (error code {}): {}",
            self.partition,
            error.unwrap_or_default(),
            self.code,
            self.message
        )
    }
}

impl KafkaClient {
    /// Moves each listed partition to its replicas (`None`: cancels its reassignment in progress). The
    /// partitions refused, with Kafka's error code and the broker's message; an error if the request
    /// as a whole failed. Partitions refused because the quorum is electing its leader (NOT_CONTROLLER)
    /// are asked for again, as Kafka's admin client does, for up to [`Self::retry_for`].
    pub fn reassign(&mut self, topic: &str, targets: &[(i32, Option<Vec<i32>>)]) -> Result<Vec<Refused>> {
        let deadline = Instant::now() + self.retry_for;
        let mut targets = targets.to_vec();
        let mut refused = Vec::new();
        loop {
            let (again, settled): (Vec<Refused>, Vec<Refused>) = self
                .reassign_once(topic, &targets)?
                .into_iter()
                .partition(|r| r.code == ResponseError::NotController.code());
            refused.extend(settled);
            if again.is_empty() || Instant::now() >= deadline {
                refused.extend(again);
                refused.sort_by_key(|r| r.partition);
                return Ok(refused);
            }
            targets.retain(|(partition, _)| again.iter().any(|r| r.partition == *partition));
            std::thread::sleep(RETRY_PAUSE);
        }
    }

    fn reassign_once(&mut self, topic: &str, targets: &[(i32, Option<Vec<i32>>)]) -> Result<Vec<Refused>> {
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
        let detail = |m: &Option<StrBytes>| m.as_ref().map_or("", |m| m.as_str()).to_string();
        check(r.error_code, &format!("reassign {topic}: {}", detail(&r.error_message)))?;
        let partitions = r.responses.iter().flat_map(|t| &t.partitions);
        Ok(partitions
            .filter(|p| p.error_code != 0)
            .map(|p| Refused { partition: p.partition_index, code: p.error_code, message: detail(&p.error_message) })
            .collect())
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
