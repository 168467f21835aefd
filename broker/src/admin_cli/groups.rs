//! `shardlog group ...`: consumer groups over the Kafka protocol (so it works against any
//! Kafka-compatible broker or cluster): list them, describe one (members, assignments, committed offset,
//! log end offset and lag per partition), delete one, reset its offsets.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::{Result, bail};

use crate::client::KafkaClient;

/// Where `reset-offsets` moves a group's offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTo {
    Earliest,
    Latest,
    /// Clamped to the partition's earliest and latest offsets, as Kafka's tool does.
    Offset(i64),
}

/// `group list`: `NAME<TAB>STATE` per group, sorted by name.
pub fn list(client: &mut KafkaClient) -> Result<String> {
    Ok(client.list_groups()?.iter().map(|g| format!("{}\t{}\n", g.name, g.state)).collect())
}

/// `group describe`: the group's state and members, then per partition it has an offset in or is
/// assigned: the committed offset, the log end offset (the high watermark, what consumers can reach)
/// and the lag between them, and the member consuming it.
pub fn describe(client: &mut KafkaClient, group: &str) -> Result<String> {
    let Some(described) = client.describe_group(group)? else { bail!("group {group} does not exist") };
    let committed = client.committed_offsets(group)?;
    let mut out = match described.epochs {
        // The consumer protocol (KIP-848): the broker's assignor, and the epochs reconciliation follows.
        Some((group_epoch, assignment_epoch)) => format!(
            "Group: {group}\tState: {}\tGroupProtocol: consumer\tAssignor: {}\tGroupEpoch: {group_epoch}\t\
             AssignmentEpoch: {assignment_epoch}\tMembers: {}\n",
            described.state,
            dash(&described.protocol),
            described.members.len()
        ),
        None => format!(
            "Group: {group}\tState: {}\tProtocolType: {}\tProtocol: {}\tMembers: {}\n",
            described.state,
            dash(&described.protocol_type),
            dash(&described.protocol),
            described.members.len()
        ),
    };
    let mut owner: BTreeMap<(String, i32), String> = BTreeMap::new();
    for m in &described.members {
        out.push_str(&format!(
            "\tMember: {}\tClientId: {}\tHost: {}\tInstanceId: {}\tPartitions: {}",
            m.member_id,
            dash(&m.client_id),
            dash(&m.client_host),
            m.instance_id.as_deref().unwrap_or("-"),
            m.assigned.len()
        ));
        if let (Some(epoch), Some(target)) = (m.member_epoch, &m.target) {
            out.push_str(&format!(
                "\tEpoch: {epoch}\tAssigned: {}\tTarget: {}",
                partition_list(&m.assigned),
                partition_list(target)
            ));
        }
        out.push('\n');
        for tp in &m.assigned {
            owner.insert(tp.clone(), m.member_id.clone());
        }
    }
    let partitions: BTreeSet<(String, i32)> = committed.keys().chain(owner.keys()).cloned().collect();
    let mut ends: BTreeMap<(String, i32), i64> = BTreeMap::new();
    let topics: BTreeSet<&String> = partitions.iter().map(|(t, _)| t).collect();
    for topic in topics {
        let wanted: Vec<i32> = partitions.iter().filter(|(t, _)| t == topic).map(|(_, p)| *p).collect();
        // A deleted topic, or a partition without a leader now, shows no log end.
        if let Ok(bounds) = client.offsets_of(topic, &wanted, crate::client::Leaderless::Skip) {
            ends.extend(bounds.into_iter().map(|(p, (_, latest))| ((topic.clone(), p), latest)));
        }
    }
    out.push_str("TOPIC\tPARTITION\tCURRENT-OFFSET\tLOG-END-OFFSET\tLAG\tMEMBER\n");
    for tp in &partitions {
        let current = committed.get(tp);
        let end = ends.get(tp);
        let lag = match (current, end) {
            (Some(c), Some(e)) => (e - c).max(0).to_string(),
            (None, Some(e)) => format!("{e} (nothing committed)"),
            _ => "-".to_string(),
        };
        out.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\t{}\n",
            tp.0,
            tp.1,
            current.map_or("-".to_string(), |c| c.to_string()),
            end.map_or("-".to_string(), |e| e.to_string()),
            lag,
            owner.get(tp).map_or("-", String::as_str)
        ));
    }
    Ok(out)
}

/// Partitions as `topic:0,1,2 other:3`, by topic.
fn partition_list(partitions: &[(String, i32)]) -> String {
    let mut by_topic: BTreeMap<&str, BTreeSet<i32>> = BTreeMap::new();
    for (topic, p) in partitions {
        by_topic.entry(topic).or_default().insert(*p);
    }
    if by_topic.is_empty() {
        return "-".to_string();
    }
    let topics: Vec<String> = by_topic
        .iter()
        .map(|(t, ps)| format!("{t}:{}", ps.iter().map(i32::to_string).collect::<Vec<_>>().join(",")))
        .collect();
    topics.join(" ")
}

fn dash(s: &str) -> &str {
    if s.is_empty() { "-" } else { s }
}

/// `group reset-offsets`: commits new offsets for every partition of `topic`; only while the group has
/// no members (a running member would overwrite them with its next commit). Returns what was set.
pub fn reset_offsets(client: &mut KafkaClient, group: &str, topic: &str, to: ResetTo) -> Result<String> {
    if let Some(described) = client.describe_group(group)?
        && !described.members.is_empty()
    {
        bail!(
            "group {group} has {} member(s) (state {}): stop its consumers before resetting its offsets",
            described.members.len(),
            described.state
        );
    }
    let count = client.layout(topic)?.partitions;
    let bounds = client.offsets(topic, count)?;
    let offsets: BTreeMap<i32, i64> = bounds
        .iter()
        .enumerate()
        .map(|(p, (earliest, latest))| {
            let target = match to {
                ResetTo::Earliest => *earliest,
                ResetTo::Latest => *latest,
                ResetTo::Offset(o) => o.clamp(*earliest, *latest),
            };
            (p as i32, target)
        })
        .collect();
    client.commit_offsets(group, topic, &offsets)?;
    let mut out = String::from("TOPIC\tPARTITION\tNEW-OFFSET\n");
    for (p, o) in &offsets {
        out.push_str(&format!("{topic}\t{p}\t{o}\n"));
    }
    Ok(out)
}
