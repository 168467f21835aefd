//! `shardlog topic ...`: topic administration over the Kafka protocol, so it works against any
//! Kafka-compatible broker or cluster, through [`KafkaClient`] (any broker for the cluster's view, each
//! partition's leader for its offsets, each replica's broker for that replica's log end).

mod durability;
pub mod groups;
pub mod security;
pub mod transactions;

use std::collections::BTreeMap;

use anyhow::{Context, Result};

use crate::client::{KafkaClient, Leaderless, check};

/// `topic list`: one name per line, sorted.
pub fn list(client: &mut KafkaClient) -> Result<String> {
    let metadata = client.metadata(None)?;
    let mut names: Vec<String> =
        metadata.topics.iter().filter_map(|t| t.name.as_ref().map(|n| n.0.as_str().to_string())).collect();
    names.sort();
    Ok(names.iter().map(|n| format!("{n}\n")).collect())
}

/// `topic describe`: partitions with leader, replicas, ISR, offsets (the leader's log start and HW, each
/// replica's log end), any reassignment in progress and, for a partition with transactions not yet
/// decided, its last stable offset and open transactions; then the configs.
pub fn describe(client: &mut KafkaClient, topic: &str) -> Result<String> {
    let metadata = client.metadata(Some(&[topic]))?;
    let t = metadata.topics.first().context("empty Metadata response")?;
    check(t.error_code, &format!("topic {topic}"))?;
    let mut partitions: Vec<_> = t.partitions.iter().collect();
    partitions.sort_by_key(|p| p.partition_index);
    // Offsets come from each partition's leader; a partition without one (its broker is down) shows none.
    let led: Vec<i32> = partitions.iter().filter(|p| p.leader_id.0 >= 0).map(|p| p.partition_index).collect();
    let offsets = client.offsets_of(topic, &led, Leaderless::Skip)?;
    // Each replica's own log end, from the broker holding it; reassignments in progress (a broker that
    // does not list them, or a cluster that cannot answer now, shows none).
    let mut held: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for p in &partitions {
        for broker in &p.replica_nodes {
            held.entry(broker.0).or_default().push(p.partition_index);
        }
    }
    let replica_ends = client.replica_log_ends(topic, &held);
    let all: Vec<i32> = partitions.iter().map(|p| p.partition_index).collect();
    let reassigning = client.reassignments(topic, &all).unwrap_or_default();
    let unstable = transactions::unstable(client, topic, &led);
    let shown = |v: Option<i64>| v.map_or("-".to_string(), |o| o.to_string());
    let id = if t.topic_id.is_nil() { "-".to_string() } else { t.topic_id.to_string() };
    let mut out = format!("Topic: {topic}\tTopicId: {id}\tPartitionCount: {}\n", partitions.len());
    let ids =
        |v: &[kafka_protocol::messages::BrokerId]| v.iter().map(|b| b.0.to_string()).collect::<Vec<_>>().join(",");
    for p in &partitions {
        let bounds = offsets.get(&p.partition_index);
        out.push_str(&format!(
            "\tPartition: {}\tLeader: {}\tEpoch: {}\tReplicas: {}\tIsr: {}\tLogStartOffset: {}\tHighWatermark: {}",
            p.partition_index,
            p.leader_id.0,
            p.leader_epoch,
            ids(&p.replica_nodes),
            ids(&p.isr_nodes),
            shown(bounds.map(|b| b.0)),
            shown(bounds.map(|b| b.1)),
        ));
        let ends: Vec<String> = (p.replica_nodes.iter())
            .map(|b| format!("{}:{}", b.0, shown(replica_ends.get(&(p.partition_index, b.0)).copied())))
            .collect();
        out.push_str(&format!("\tReplicaLogEnds: {}", ends.join(",")));
        // Replicas whose broker is down or whose log there is offline (damaged).
        if !p.offline_replicas.is_empty() {
            out.push_str(&format!("\tOffline: {}", ids(&p.offline_replicas)));
        }
        if let Some(txns) =
            unstable.get(&p.partition_index).filter(|t| Some(t.lso) != bounds.map(|b| b.1) || t.open > 0)
        {
            out.push_str(&format!("\tLastStableOffset: {}\tOpenTransactions: {}", txns.lso, txns.open));
        }
        if let Some((_, adding, removing)) = reassigning.get(&p.partition_index) {
            let list = |v: &[i32]| v.iter().map(|b| b.to_string()).collect::<Vec<_>>().join(",");
            out.push_str(&format!("\tAddingReplicas: {}\tRemovingReplicas: {}", list(adding), list(removing)));
        }
        out.push('\n');
    }
    out.push_str("Configs:\n");
    for (key, value, set) in client.configs(topic)? {
        out.push_str(&format!("\t{key}={value}{}\n", if set { "" } else { " (default)" }));
    }
    // Beside Kafka's flush values, what they mean here (a broker that does not say shows none).
    let sources = client.config_synonyms(topic, &durability::FLUSH_KEYS).ok();
    if let Some(durability) = sources.as_ref().and_then(durability::Durability::from_synonyms) {
        out.push_str(&format!("Durability: {durability}\n"));
    }
    Ok(out)
}
