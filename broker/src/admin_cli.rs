//! `shardlog topic ...`: topic administration over the Kafka protocol, so it works against any
//! Kafka-compatible broker or cluster, through [`KafkaClient`] (any broker for the cluster's view, each
//! partition's leader for its offsets).

use anyhow::{Context, Result};

use crate::client::{KafkaClient, check};

/// `topic list`: one name per line, sorted.
pub fn list(client: &mut KafkaClient) -> Result<String> {
    let metadata = client.metadata(None)?;
    let mut names: Vec<String> =
        metadata.topics.iter().filter_map(|t| t.name.as_ref().map(|n| n.0.as_str().to_string())).collect();
    names.sort();
    Ok(names.iter().map(|n| format!("{n}\n")).collect())
}

/// `topic describe`: partitions with leader, replicas, ISR and offsets, then the configs.
pub fn describe(client: &mut KafkaClient, topic: &str) -> Result<String> {
    let metadata = client.metadata(Some(&[topic]))?;
    let t = metadata.topics.first().context("empty Metadata response")?;
    check(t.error_code, &format!("topic {topic}"))?;
    let mut partitions: Vec<_> = t.partitions.iter().collect();
    partitions.sort_by_key(|p| p.partition_index);
    let offsets = client.offsets(topic, partitions.len() as i32)?;
    let id = if t.topic_id.is_nil() { "-".to_string() } else { t.topic_id.to_string() };
    let mut out = format!("Topic: {topic}\tTopicId: {id}\tPartitionCount: {}\n", partitions.len());
    let ids =
        |v: &[kafka_protocol::messages::BrokerId]| v.iter().map(|b| b.0.to_string()).collect::<Vec<_>>().join(",");
    for (p, (start, end)) in partitions.iter().zip(&offsets) {
        out.push_str(&format!(
            "\tPartition: {}\tLeader: {}\tEpoch: {}\tReplicas: {}\tIsr: {}\tLogStartOffset: {start}\tLogEndOffset: {end}\n",
            p.partition_index,
            p.leader_id.0,
            p.leader_epoch,
            ids(&p.replica_nodes),
            ids(&p.isr_nodes),
        ));
    }
    out.push_str("Configs:\n");
    for (key, value, set) in client.configs(topic)? {
        out.push_str(&format!("\t{key}={value}{}\n", if set { "" } else { " (default)" }));
    }
    Ok(out)
}
