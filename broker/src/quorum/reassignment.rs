//! Partition reassignment (Kafka's KIP-455) as rules of the quorum's state machine: starting, replacing
//! and cancelling a move, and completing it once its target is in sync. No I/O; [`ClusterState::apply`]
//! calls these for `AlterReassignment`, after ISR changes and after liveness changes.

use std::collections::BTreeSet;

use super::election::{self, Choice};
use super::state::{ClusterState, CommandError, Event, NodeId, PartitionEpoch, PartitionRecord, set_leader};

impl ClusterState {
    /// Starts, replaces or (with `target` = `None`) cancels the reassignment of one partition.
    pub(super) fn alter_reassignment(
        &mut self,
        topic: &str,
        partition: u32,
        target: Option<&[NodeId]>,
        events: &mut Vec<Event>,
    ) -> Result<(), CommandError> {
        if let Some(target) = target {
            self.check_replica_list(target)?;
        }
        let live = self.live();
        let p = self.partition_mut(topic, partition)?;
        let original = p.original_replicas();
        let (replicas, adding, removing) = match target {
            None if !p.reassigning() => return Err(CommandError::NoReassignmentInProgress),
            None => (original, Vec::new(), Vec::new()),
            Some(target) => {
                // A new target replaces one in progress: it is measured against the replicas from before.
                let leaving: Vec<NodeId> = original.iter().copied().filter(|id| !target.contains(id)).collect();
                let adding: Vec<NodeId> = target.iter().copied().filter(|id| !original.contains(id)).collect();
                let replicas = target.iter().copied().chain(leaving.iter().copied()).collect();
                (replicas, adding, leaving)
            }
        };
        // Replicas an earlier target was adding and this change drops leave the ISR with the replicas.
        let isr: Vec<NodeId> = p.isr.iter().copied().filter(|id| replicas.contains(id)).collect();
        if isr.is_empty() {
            return Err(CommandError::InvalidReplicaAssignment(
                "it would leave the partition without an in-sync replica".to_string(),
            ));
        }
        let offline_replicas = p.offline_replicas.iter().copied().filter(|id| replicas.contains(id)).collect();
        let mut next = PartitionRecord {
            replicas,
            isr,
            adding_replicas: adding,
            removing_replicas: removing,
            offline_replicas,
            partition_epoch: PartitionEpoch(p.partition_epoch.0 + 1),
            ..p.clone()
        };
        if next.leader.is_some_and(|leader| !next.replicas.contains(&leader)) {
            // The leader was a replica being added, and the cancel (or new target) drops it.
            match election::choose_leader(&next, |id| live.contains(&id), false, None) {
                Choice::Clean(leader) => set_leader(&mut next, Some(leader)),
                Choice::Unclean(_) | Choice::ReadOnly(_) | Choice::None => {
                    set_leader(&mut next, None);
                    events.push(Event::Offline { topic: topic.to_string(), partition });
                }
            }
        }
        *p = next;
        complete_reassignment(topic, partition, p, &live, events);
        Ok(())
    }

    /// Completes every reassignment whose target replicas are all in sync (after liveness changed).
    pub(super) fn complete_reassignments(&mut self, events: &mut Vec<Event>) {
        let live = self.live();
        for (name, topic) in &mut self.topics {
            for (index, p) in topic.partitions.iter_mut().enumerate() {
                if p.reassigning() {
                    complete_reassignment(name, index as u32, p, &live, events);
                }
            }
        }
    }
}

/// Ends `p`'s reassignment if every target replica is in sync and the target has a live leader: the
/// leaving replicas go, and leadership moves to the first live in-sync target replica if the leader was
/// leaving. Otherwise the reassignment waits for the next ISR or liveness change.
pub(super) fn complete_reassignment(
    topic: &str,
    index: u32,
    p: &mut PartitionRecord,
    live: &BTreeSet<NodeId>,
    events: &mut Vec<Event>,
) {
    let target = p.target_replicas();
    if !p.reassigning() || target.iter().any(|id| !p.isr.contains(id)) {
        return;
    }
    let mut next = PartitionRecord {
        isr: p.isr.iter().copied().filter(|id| target.contains(id)).collect(),
        offline_replicas: p.offline_replicas.iter().copied().filter(|id| target.contains(id)).collect(),
        replicas: target,
        adding_replicas: Vec::new(),
        removing_replicas: Vec::new(),
        partition_epoch: PartitionEpoch(p.partition_epoch.0 + 1),
        ..p.clone()
    };
    match next.leader {
        Some(leader) if next.replicas.contains(&leader) => {}
        _ => match election::choose_leader(&next, |id| live.contains(&id), false, None) {
            Choice::Clean(leader) => set_leader(&mut next, Some(leader)),
            Choice::Unclean(_) | Choice::ReadOnly(_) | Choice::None => return,
        },
    }
    events.push(Event::ReassignmentCompleted {
        topic: topic.to_string(),
        partition: index,
        replicas: next.replicas.clone(),
    });
    *p = next;
}
