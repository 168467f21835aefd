//! Leader election and replica placement, as pure functions over a partition's record and the set of live
//! brokers. No I/O and no clock: [`super::state::ClusterState::apply`] calls these, and tests call them
//! directly for every case.

use super::state::{NodeId, PartitionRecord};

/// The leader a partition should get now, and whether choosing it is an unclean election.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Choice {
    /// A live member of the ISR: it has every committed record.
    Clean(NodeId),
    /// A live replica outside the ISR, allowed only by `unclean.leader.election.enable`: records committed
    /// while it was out of sync may be lost.
    Unclean(NodeId),
    /// The last ISR member, live but offline (its log is damaged): nobody else may lead, so it does, to
    /// serve what is intact below the damage, taking no writes until it is repaired.
    ReadOnly(NodeId),
    /// Nobody may lead: the partition stays offline until an ISR member comes back.
    None,
}

/// Picks a leader: the first replica (in assignment order) that is live, online and in the ISR; failing
/// that, when `unclean` is allowed, the first live online replica (one being added by a reassignment
/// last); failing that, the ISR's last member if it is live but offline, to lead read-only; otherwise
/// none. `excluded` (a broker going away) is never chosen, and an offline replica (a damaged log) only
/// read-only.
pub fn choose_leader(
    partition: &PartitionRecord,
    is_live: impl Fn(NodeId) -> bool,
    unclean: bool,
    excluded: Option<NodeId>,
) -> Choice {
    let eligible = |id: &&NodeId| is_live(**id) && Some(**id) != excluded && !partition.offline_replicas.contains(*id);
    if let Some(&id) = partition.replicas.iter().filter(|id| partition.isr.contains(id)).find(eligible) {
        return Choice::Clean(id);
    }
    // Out of sync, a replica the partition had before a reassignment (holding most of its records) comes
    // before one a reassignment is adding (which may have next to nothing).
    let (original, adding): (Vec<&NodeId>, Vec<&NodeId>) =
        partition.replicas.iter().partition(|id| !partition.adding_replicas.contains(id));
    if unclean && let Some(&id) = original.into_iter().chain(adding).find(eligible) {
        return Choice::Unclean(id);
    }
    match partition.isr.as_slice() {
        [last] if partition.offline_replicas.contains(last) && is_live(*last) && Some(*last) != excluded => {
            Choice::ReadOnly(*last)
        }
        _ => Choice::None,
    }
}

/// Replica lists for `count` new partitions with `replication_factor` replicas over `brokers` (sorted,
/// live), starting from `first_index`. Partition `i`'s preferred leader is broker `first_index + i`
/// (round robin, so leaders are balanced), its followers the next brokers after it, shifted by one for
/// every round over the brokers so follower sets differ too (Kafka's rack-unaware placement, without
/// its randomness: the state machine must be deterministic).
pub fn assign_replicas(
    brokers: &[NodeId],
    count: u32,
    replication_factor: usize,
    first_index: usize,
) -> Vec<Vec<NodeId>> {
    let n = brokers.len();
    assert!(replication_factor >= 1 && replication_factor <= n, "{replication_factor} replicas over {n} brokers");
    (0..count as usize)
        .map(|i| {
            let leader = (first_index + i) % n;
            // The follower shift stays within 1..n so a follower never lands on the leader.
            let shift = if n > 1 { 1 + ((first_index + i) / n) % (n - 1) } else { 0 };
            let mut replicas = vec![brokers[leader]];
            for j in 1..replication_factor {
                let at = (leader + shift + (j - 1)) % n;
                let candidate = brokers[at];
                // With a shift, consecutive followers could wrap onto the leader: take the next free one.
                let free = (0..n).map(|k| brokers[(at + k) % n]).find(|b| !replicas.contains(b));
                replicas.push(if replicas.contains(&candidate) { free.expect("enough brokers") } else { candidate });
            }
            replicas
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quorum::state::PartitionEpoch;
    use shardlog_storage::LeaderEpoch;

    fn partition(replicas: &[u32], isr: &[u32], leader: Option<u32>) -> PartitionRecord {
        PartitionRecord {
            replicas: replicas.iter().map(|&i| NodeId(i)).collect(),
            isr: isr.iter().map(|&i| NodeId(i)).collect(),
            leader: leader.map(NodeId),
            leader_epoch: LeaderEpoch(3),
            partition_epoch: PartitionEpoch(7),
            adding_replicas: Vec::new(),
            removing_replicas: Vec::new(),
            offline_replicas: Vec::new(),
        }
    }

    fn live(ids: &'static [u32]) -> impl Fn(NodeId) -> bool {
        move |id| ids.contains(&id.0)
    }

    #[test]
    fn the_first_live_isr_member_in_assignment_order_leads() {
        let p = partition(&[1, 2, 3], &[3, 2], Some(1));
        assert_eq!(choose_leader(&p, live(&[2, 3]), false, None), Choice::Clean(NodeId(2)), "assignment order");
        assert_eq!(choose_leader(&p, live(&[1, 3]), false, None), Choice::Clean(NodeId(3)), "1 is not in the ISR");
        assert_eq!(choose_leader(&p, live(&[1, 2, 3]), false, Some(NodeId(2))), Choice::Clean(NodeId(3)));
    }

    #[test]
    fn without_a_live_isr_member_the_partition_stays_leaderless_unless_unclean_election_is_on() {
        let p = partition(&[1, 2, 3], &[1], Some(1));
        assert_eq!(choose_leader(&p, live(&[2, 3]), false, None), Choice::None);
        assert_eq!(choose_leader(&p, live(&[2, 3]), true, None), Choice::Unclean(NodeId(2)));
        assert_eq!(choose_leader(&p, live(&[3]), true, None), Choice::Unclean(NodeId(3)));
        assert_eq!(choose_leader(&p, live(&[]), true, None), Choice::None, "nobody live");
        // A live ISR member is always preferred over an unclean choice.
        assert_eq!(choose_leader(&p, live(&[1, 2]), true, None), Choice::Clean(NodeId(1)));
        // A broker going away is not chosen, even uncleanly.
        assert_eq!(choose_leader(&p, live(&[1, 2]), true, Some(NodeId(1))), Choice::Unclean(NodeId(2)));
    }

    #[test]
    fn an_unclean_choice_takes_a_replica_from_before_a_reassignment_over_one_being_added() {
        // Moving from [3, 4] to [1, 2]: the target comes first in the replicas, but 1 and 2 may hold nothing.
        let mut p = partition(&[1, 2, 3, 4], &[3], None);
        p.adding_replicas = vec![NodeId(1), NodeId(2)];
        p.removing_replicas = vec![NodeId(3), NodeId(4)];
        assert_eq!(choose_leader(&p, live(&[1, 2, 4]), true, None), Choice::Unclean(NodeId(4)));
        assert_eq!(choose_leader(&p, live(&[1, 2]), true, None), Choice::Unclean(NodeId(1)), "only added ones live");
    }

    #[test]
    fn replicas_spread_over_brokers_with_balanced_leaders_and_distinct_members() {
        let brokers: Vec<NodeId> = (1..=3).map(NodeId).collect();
        for rf in 1..=3 {
            for first in 0..3 {
                let assigned = assign_replicas(&brokers, 6, rf, first);
                assert_eq!(assigned.len(), 6);
                let mut leaders = [0; 3];
                let mut members = [0; 3];
                for replicas in &assigned {
                    assert_eq!(replicas.len(), rf);
                    let mut distinct = replicas.clone();
                    distinct.sort();
                    distinct.dedup();
                    assert_eq!(distinct.len(), rf, "a broker twice in {replicas:?}");
                    leaders[(replicas[0].0 - 1) as usize] += 1;
                    for r in replicas {
                        members[(r.0 - 1) as usize] += 1;
                    }
                }
                assert_eq!(leaders, [2, 2, 2], "rf {rf} first {first}: {assigned:?}");
                assert_eq!(members, [2 * rf, 2 * rf, 2 * rf], "rf {rf} first {first}: {assigned:?}");
            }
        }
        assert_eq!(assign_replicas(&brokers[..1], 4, 1, 5), vec![vec![NodeId(1)]; 4]);
    }
}
