//! The log lines for what a command did (its [`Event`]s), as every voter applies it: one line per
//! command and kind of event, with counts, so that a broker's shutdown that leaves 62 partitions
//! without a leader is one line, not 62; and the topics, partitions and brokers as fields of their own,
//! never a debug string, so `--log-format json` carries them as values.

use super::state::{Command, Event};
use crate::logging::PartitionSet;

/// Logs the events `command` caused.
pub fn log_events(command: &Command, events: &[Event]) {
    let mut offline = PartitionSet::default();
    for event in events {
        match event {
            Event::Offline { topic, partition } => offline.add(topic, *partition),
            Event::UncleanElection { topic, partition, leader } => tracing::warn!(
                topic = %topic,
                partition,
                leader = leader.0,
                "quorum: unclean leader election, possible data loss: records acknowledged while the new leader \
                 was out of the ISR may be gone"
            ),
            Event::ProducerIdsAllocated { broker, first, count } => {
                tracing::debug!(broker = broker.0, first, count, "quorum: producer ids")
            }
            Event::AclsDeleted { removed } => {
                tracing::debug!(bindings = removed.iter().map(Vec::len).sum::<usize>(), "quorum: ACL bindings deleted")
            }
            Event::ReassignmentCompleted { topic, partition, replicas } => tracing::info!(
                topic = %topic,
                partition,
                replicas = %replicas.iter().map(|r| r.to_string()).collect::<Vec<_>>().join(","),
                "quorum: partition reassignment completed"
            ),
        }
    }
    if offline.is_empty() {
        return;
    }
    let (partitions, topics) = (offline.count(), offline.to_string());
    match command {
        // Expected: the broker asked to leave, and nothing else could lead these.
        Command::ControlledShutdown { id, .. } => tracing::info!(
            broker = id.0,
            partitions,
            %topics,
            "quorum: partitions offline while their broker is shut down"
        ),
        // For an operator: a broker went silent (or was fenced) and no other in-sync replica is live.
        Command::FenceBroker { id, .. } => tracing::warn!(
            broker = id.0,
            partitions,
            %topics,
            "quorum: partitions offline: their leader's session expired and no other in-sync replica is live"
        ),
        _ => tracing::warn!(partitions, %topics, "quorum: partitions offline: no in-sync replica is live"),
    }
}
