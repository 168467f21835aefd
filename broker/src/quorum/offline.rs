//! Offline replicas as rules of the quorum's state machine: a broker reports its replica of a partition
//! offline (its log is damaged) or back. No I/O; [`ClusterState::apply`] calls this for
//! `SetReplicaOffline`, and [`election::choose_leader`] never picks an offline replica but read-only.

use super::election::{self, Choice};
use super::state::{ClusterState, CommandError, Event, NodeId, TopicRecord, elect};

impl ClusterState {
    /// Marks `id`'s replica of a partition offline or back (see [`Command::SetReplicaOffline`]).
    pub(super) fn set_replica_offline(
        &mut self,
        id: NodeId,
        topic: &str,
        partition: u32,
        offline: bool,
        events: &mut Vec<Event>,
    ) -> Result<(), CommandError> {
        let live = self.live();
        let unclean = self.topics.get(topic).is_some_and(TopicRecord::unclean_election);
        let p = self.partition_mut(topic, partition)?;
        if !p.replicas.contains(&id) {
            return Err(CommandError::NotAReplica { id, topic: topic.to_string(), partition });
        }
        if p.offline_replicas.contains(&id) == offline {
            return Ok(());
        }
        if offline {
            p.offline_replicas.push(id);
            p.partition_epoch.0 += 1;
            if p.leader == Some(id) {
                match election::choose_leader(p, |r| live.contains(&r), unclean, None) {
                    // The last ISR member keeps leading, read-only: what is intact below the damage stays
                    // readable, and nothing committed is given up.
                    Choice::ReadOnly(_) => {}
                    // Another replica leads, at a new epoch.
                    _ => elect(topic, partition, p, &live, unclean, events),
                }
            } else if p.isr.contains(&id) && p.isr.len() > 1 {
                p.isr.retain(|r| *r != id);
            }
        } else {
            p.offline_replicas.retain(|r| *r != id);
            p.partition_epoch.0 += 1;
            if p.leader.is_none()
                && !matches!(election::choose_leader(p, |r| live.contains(&r), unclean, None), Choice::None)
            {
                elect(topic, partition, p, &live, unclean, events);
            }
        }
        Ok(())
    }
}
