//! Reconciliation: how one member's current assignment moves towards its target. A partition in the
//! target is given to the member only once no other member holds it (in its assignment or as pending
//! revocation); a partition the member must give up is kept as pending revocation, with the member's
//! epoch held back, until the member's heartbeat shows it no longer owns it. The member's epoch reaches
//! the target's once nothing is left to revoke. Pure: no I/O, no clock.

use std::collections::BTreeSet;

use super::{Assignment, TopicId};

/// Where a member stands against its target assignment (Kafka's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MemberState {
    /// It has its whole target at the target's epoch.
    Stable,
    /// It must first give up partitions (its pending revocation); its epoch stays where it was.
    UnrevokedPartitions,
    /// It is at the target's epoch but waits for partitions other members still hold.
    UnreleasedPartitions,
}

impl MemberState {
    /// The name ConsumerGroupDescribe and `shardlog group describe` give.
    pub fn name(self) -> &'static str {
        match self {
            MemberState::Stable => "stable",
            MemberState::UnrevokedPartitions => "unrevoked_partitions",
            MemberState::UnreleasedPartitions => "unreleased_partitions",
        }
    }

    /// The number Kafka's CurrentMemberAssignment record stores.
    pub fn code(self) -> i8 {
        match self {
            MemberState::Stable => 0,
            MemberState::UnrevokedPartitions => 1,
            MemberState::UnreleasedPartitions => 2,
        }
    }

    pub fn from_code(code: i8) -> Option<MemberState> {
        match code {
            0 => Some(MemberState::Stable),
            1 => Some(MemberState::UnrevokedPartitions),
            2 => Some(MemberState::UnreleasedPartitions),
            _ => None,
        }
    }
}

/// A member's current assignment as the coordinator keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Current {
    pub state: MemberState,
    pub epoch: i32,
    /// The epoch it had before the last bump (a heartbeat at it is still accepted if the member only
    /// missed the answer that moved it on).
    pub previous_epoch: i32,
    /// What it owns, or may own, and is told in heartbeat answers.
    pub assigned: Assignment,
    /// What it must give up before it gets anything new.
    pub pending_revocation: Assignment,
}

impl Current {
    /// A member that has just joined: nothing yet, epoch 0.
    pub fn joined() -> Current {
        Current {
            state: MemberState::Stable,
            epoch: 0,
            previous_epoch: 0,
            assigned: Assignment::new(),
            pending_revocation: Assignment::new(),
        }
    }

    /// Moves towards `target` (at `target_epoch`). `owned` is what the member's heartbeat says it owns
    /// (None: the heartbeat did not say); `held_by_other` tells whether a partition is held by another
    /// member, in its assignment or pending revocation.
    pub fn reconcile(
        &self,
        target_epoch: i32,
        target: &Assignment,
        owned: Option<&Assignment>,
        held_by_other: impl Fn(TopicId, i32) -> bool,
    ) -> Current {
        match self.state {
            MemberState::Stable if self.epoch == target_epoch => self.clone(),
            MemberState::Stable | MemberState::UnreleasedPartitions => {
                self.next(self.epoch, target_epoch, target, owned, &held_by_other)
            }
            MemberState::UnrevokedPartitions if owns_any(owned, &self.pending_revocation) => self.clone(),
            MemberState::UnrevokedPartitions => self.next(self.epoch, target_epoch, target, owned, &held_by_other),
        }
    }

    fn next(
        &self,
        epoch: i32,
        target_epoch: i32,
        target: &Assignment,
        owned: Option<&Assignment>,
        held_by_other: &impl Fn(TopicId, i32) -> bool,
    ) -> Current {
        let mut kept = Assignment::new();
        let mut gained = Assignment::new();
        let mut revoke = Assignment::new();
        let mut unreleased = false;
        let empty = BTreeSet::new();
        let topics: BTreeSet<&TopicId> = target.keys().chain(self.assigned.keys()).collect();
        for topic in topics {
            let want = target.get(topic).unwrap_or(&empty);
            let have = self.assigned.get(topic).unwrap_or(&empty);
            insert_nonempty(&mut kept, *topic, want.intersection(have).copied().collect());
            insert_nonempty(&mut revoke, *topic, have.difference(want).copied().collect());
            let mut free = BTreeSet::new();
            for &p in want.difference(have) {
                if held_by_other(*topic, p) {
                    unreleased = true;
                } else {
                    free.insert(p);
                }
            }
            insert_nonempty(&mut gained, *topic, free);
        }
        let bumped = |state, assigned| Current {
            state,
            epoch: target_epoch,
            previous_epoch: epoch,
            assigned,
            pending_revocation: Assignment::new(),
        };
        if owns_any(owned, &revoke) {
            // Nothing new until the member has let go: a partition it gains could be one another member
            // is waiting for it to release. (What the member says it no longer owns needs no wait.)
            Current {
                state: MemberState::UnrevokedPartitions,
                epoch,
                previous_epoch: self.previous_epoch,
                assigned: kept,
                pending_revocation: revoke,
            }
        } else {
            let mut assigned = kept;
            for (topic, ps) in gained {
                assigned.entry(topic).or_default().extend(ps);
            }
            let state = if unreleased { MemberState::UnreleasedPartitions } else { MemberState::Stable };
            let mut next = bumped(state, assigned);
            if epoch == target_epoch {
                next.previous_epoch = self.previous_epoch;
            }
            next
        }
    }

    /// Every partition it holds: assigned or pending revocation.
    pub fn held(&self) -> impl Iterator<Item = (TopicId, i32)> + '_ {
        partitions(&self.assigned).chain(partitions(&self.pending_revocation))
    }
}

fn insert_nonempty(into: &mut Assignment, topic: TopicId, ps: BTreeSet<i32>) {
    if !ps.is_empty() {
        into.insert(topic, ps);
    }
}

/// Whether the member may still own any partition of `of`: it does if its heartbeat did not say what it
/// owns.
fn owns_any(owned: Option<&Assignment>, of: &Assignment) -> bool {
    !of.is_empty() && owned.is_none_or(|owned| intersects(owned, of))
}

/// Whether two assignments share a partition.
pub fn intersects(a: &Assignment, b: &Assignment) -> bool {
    a.iter().any(|(t, ps)| b.get(t).is_some_and(|other| !ps.is_disjoint(other)))
}

/// Whether every partition of `a` is in `b`.
pub fn is_subset(a: &Assignment, b: &Assignment) -> bool {
    a.iter().all(|(t, ps)| ps.is_empty() || b.get(t).is_some_and(|other| ps.is_subset(other)))
}

/// The partitions of an assignment, one by one.
pub fn partitions(a: &Assignment) -> impl Iterator<Item = (TopicId, i32)> + '_ {
    a.iter().flat_map(|(t, ps)| ps.iter().map(move |p| (*t, *p)))
}

#[cfg(test)]
mod tests {
    use uuid::Uuid;

    use super::*;

    fn t() -> TopicId {
        Uuid::from_u128(7)
    }

    fn a(ps: &[i32]) -> Assignment {
        if ps.is_empty() { Assignment::new() } else { Assignment::from([(t(), ps.iter().copied().collect())]) }
    }

    fn stable(epoch: i32, ps: &[i32]) -> Current {
        Current {
            state: MemberState::Stable,
            epoch,
            previous_epoch: epoch - 1,
            assigned: a(ps),
            pending_revocation: Assignment::new(),
        }
    }

    #[test]
    fn a_free_partition_is_given_at_the_target_epoch() {
        let next = stable(1, &[0]).reconcile(2, &a(&[0, 1]), None, |_, _| false);
        assert_eq!(next, Current { previous_epoch: 1, ..stable(2, &[0, 1]) });
    }

    #[test]
    fn a_partition_held_by_another_waits_and_comes_once_released() {
        let next = stable(1, &[0]).reconcile(2, &a(&[0, 1]), None, |_, p| p == 1);
        assert_eq!(next.state, MemberState::UnreleasedPartitions);
        assert_eq!((next.epoch, &next.assigned), (2, &a(&[0])));
        let again = next.reconcile(2, &a(&[0, 1]), None, |_, p| p == 1);
        assert_eq!(again, next, "still held: nothing changes");
        let released = next.reconcile(2, &a(&[0, 1]), None, |_, _| false);
        assert_eq!((released.state, released.epoch, &released.assigned), (MemberState::Stable, 2, &a(&[0, 1])));
    }

    #[test]
    fn revocation_holds_the_epoch_and_everything_new_until_the_member_lets_go() {
        let next = stable(1, &[0, 1]).reconcile(2, &a(&[0, 2]), None, |_, _| false);
        assert_eq!(next.state, MemberState::UnrevokedPartitions);
        assert_eq!((next.epoch, &next.assigned, &next.pending_revocation), (1, &a(&[0]), &a(&[1])));
        // Its heartbeat says nothing, or still shows partition 1: it waits.
        assert_eq!(next.reconcile(2, &a(&[0, 2]), None, |_, _| false), next);
        assert_eq!(next.reconcile(2, &a(&[0, 2]), Some(&a(&[0, 1])), |_, _| false), next);
        // It let go of 1: it gets 2 and the target's epoch.
        let done = next.reconcile(2, &a(&[0, 2]), Some(&a(&[0])), |_, _| false);
        assert_eq!(
            (done.state, done.epoch, done.previous_epoch, &done.assigned),
            (MemberState::Stable, 2, 1, &a(&[0, 2]))
        );
        assert!(done.pending_revocation.is_empty());
    }

    #[test]
    fn the_state_codes_round_trip() {
        for s in [MemberState::Stable, MemberState::UnrevokedPartitions, MemberState::UnreleasedPartitions] {
            assert_eq!(MemberState::from_code(s.code()), Some(s));
        }
        assert_eq!(MemberState::from_code(9), None);
    }
}
