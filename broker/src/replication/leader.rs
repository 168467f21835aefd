//! A leader's bookkeeping: each follower's progress, the ISR it has and the one it proposed, the acks=all
//! waits. See the rules in [`super`].

use std::collections::BTreeMap;

use shardlog_storage::{LeaderEpoch, Offset};

use super::{AckOutcome, FetchPosition, FetchReply, LogView, ProposalOutcome, ReplicaError, ReplicaSettings};
use crate::quorum::state::{NodeId, PartitionEpoch, PartitionRecord};

/// An ISR change for the quorum's AlterPartition, fenced by both epochs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IsrProposal {
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
    pub isr: Vec<NodeId>,
}

/// What the leader knows of one follower.
#[derive(Debug, Clone, Copy)]
struct Progress {
    /// The follower's stable offset from its last fetch that passed the divergence check; `None` until one
    /// has, in this leader epoch.
    credited: Option<Offset>,
    /// When the follower last had everything the leader had (Kafka's `lastCaughtUpTimeMs`).
    caught_up_ms: i64,
    last_fetch_ms: i64,
    /// The leader's log end at the follower's previous fetch.
    leader_end_at_last_fetch: Offset,
}

#[derive(Debug)]
pub(super) struct Leader {
    me: NodeId,
    pub(super) epoch: LeaderEpoch,
    /// The leader's log end when it took over: its own epoch starts here.
    pub(super) epoch_start: Offset,
    partition_epoch: PartitionEpoch,
    replicas: Vec<NodeId>,
    /// The ISR as the quorum committed it.
    pub(super) isr: Vec<NodeId>,
    /// The ISR proposed and not yet seen committed or refused.
    proposed: Option<IsrProposal>,
    /// Every member of every proposal made at the current partition epoch. The quorum applies at most one
    /// of them, but which, if any, is known only from the next record: a copy of a proposal the quorum once
    /// refused can still arrive late and be applied. Until the partition epoch moves they all count.
    proposed_members: Vec<NodeId>,
    /// When the proposal may be sent (again).
    propose_at_ms: i64,
    /// The quorum refused a proposal at the current partition epoch: until the epoch moves, proposals only
    /// remove members, so that a refused addition (a fenced broker's) cannot hold up a needed removal.
    refused_at_epoch: bool,
    followers: BTreeMap<NodeId, Progress>,
    /// acks=all waits: (offset the HW must reach, token).
    pub(super) waits: Vec<(Offset, u64)>,
}

impl Leader {
    pub(super) fn new(me: NodeId, record: &PartitionRecord, now_ms: i64, log_end: Offset) -> Leader {
        let mut leader = Leader {
            me,
            epoch: record.leader_epoch,
            epoch_start: log_end,
            partition_epoch: record.partition_epoch,
            replicas: Vec::new(),
            isr: Vec::new(),
            proposed: None,
            proposed_members: Vec::new(),
            propose_at_ms: now_ms,
            refused_at_epoch: false,
            followers: BTreeMap::new(),
            waits: Vec::new(),
        };
        leader.update(record, now_ms);
        leader
    }

    /// A newer record of the same leader epoch: a committed ISR (or replica) change.
    pub(super) fn update(&mut self, record: &PartitionRecord, now_ms: i64) {
        if record.partition_epoch < self.partition_epoch {
            return;
        }
        if self.proposed.as_ref().is_some_and(|p| record.partition_epoch > p.partition_epoch) {
            // The quorum moved past the epoch the proposal was made at: whether or not it applied, the
            // record says what the ISR is now.
            self.proposed = None;
            self.propose_at_ms = self.propose_at_ms.min(now_ms);
        }
        if record.partition_epoch > self.partition_epoch {
            self.proposed_members.clear();
            self.refused_at_epoch = false;
        }
        // Records were missed (a broker applies only the newest of the images waiting): a replica outside
        // the ISR may have been removed and added back in between, its log deleted and started over, so
        // what it fetched before counts for nothing until it fetches again. (Members of the ISR joined by
        // this leader's own proposals, which it made from fetches it saw.)
        let missed = record.partition_epoch.0 > self.partition_epoch.0.saturating_add(1);
        if missed {
            self.followers.retain(|id, _| record.isr.contains(id));
        }
        self.partition_epoch = record.partition_epoch;
        self.replicas = record.replicas.clone();
        self.isr = record.isr.clone();
        // A replica whose log is offline fetches nothing and may not join the ISR until it is back.
        let followers =
            self.replicas.iter().copied().filter(|id| *id != self.me && !record.offline_replicas.contains(id));
        let mut kept = BTreeMap::new();
        for id in followers {
            // A follower starts counted as caught up now: it gets a full lag time to show it is.
            let progress = self.followers.get(&id).copied().unwrap_or(Progress {
                credited: None,
                caught_up_ms: now_ms,
                last_fetch_ms: now_ms,
                leader_end_at_last_fetch: self.epoch_start,
            });
            kept.insert(id, progress);
        }
        self.followers = kept;
    }

    /// Committed members plus those proposed at the current partition epoch: every one of them counts,
    /// also one the replica list no longer names (a member without progress holds the HW, the safe side).
    pub(super) fn maximal_isr(&self) -> Vec<NodeId> {
        let mut members = self.isr.clone();
        members.extend(self.proposed_members.iter().filter(|id| !self.isr.contains(id)));
        members
    }

    pub(super) fn on_fetch(&mut self, now_ms: i64, fetch: &FetchPosition, log: &impl LogView) -> FetchReply {
        if fetch.leader_epoch < self.epoch {
            return FetchReply::Refused(ReplicaError::FencedLeaderEpoch);
        }
        if fetch.leader_epoch > self.epoch {
            return FetchReply::Refused(ReplicaError::UnknownLeaderEpoch);
        }
        let Some(progress) = self.followers.get_mut(&fetch.replica) else {
            return FetchReply::Refused(ReplicaError::NotLeaderOrFollower);
        };
        if fetch.offset < log.log_start() {
            return FetchReply::OutOfRange { log_start: log.log_start() };
        }
        if let Some(last_epoch) = fetch.last_epoch
            && log.first_epoch().is_some_and(|first| last_epoch < first)
        {
            // The follower's last epoch is older than any this log still holds: what it has cannot be
            // checked against anything here, so it starts over at this log's start.
            return FetchReply::OutOfRange { log_start: log.log_start() };
        }
        if let Some(last_epoch) = fetch.last_epoch {
            // KIP-320: the follower's last epoch must end here no earlier than its log does.
            let (epoch, end_offset) = match (log.epoch_end(last_epoch), log.last_epoch()) {
                (Some(found), _) => found,
                // The follower's epoch is newer than any batch here: the epochs after this log's last
                // batch (this leader's own among them) wrote nothing here, so its last epoch is the answer,
                // ending at the log end. (Kafka records a leader's epoch as it takes over, to the same end.)
                (None, Some(latest)) => (latest, log.log_end()),
                (None, None) => (last_epoch, log.log_end()),
            };
            if epoch != last_epoch || end_offset < fetch.offset {
                return FetchReply::Diverging { epoch, end_offset };
            }
        } else if fetch.offset > log.log_end() {
            return FetchReply::Diverging { epoch: LeaderEpoch(0), end_offset: log.log_end() };
        }
        let credited = fetch.stable_end.min(fetch.offset);
        let leader_end = log.log_end();
        // Kafka's rule: caught up now if it has the leader's whole log; caught up as of its previous fetch if
        // it has what the leader had then.
        if credited >= leader_end {
            progress.caught_up_ms = progress.caught_up_ms.max(now_ms);
        } else if credited >= progress.leader_end_at_last_fetch {
            progress.caught_up_ms = progress.caught_up_ms.max(progress.last_fetch_ms);
        }
        progress.leader_end_at_last_fetch = leader_end;
        progress.last_fetch_ms = now_ms;
        progress.credited = Some(credited);
        // The HW is filled in by the caller once this fetch has moved it.
        FetchReply::Records { from: fetch.offset, high_watermark: Offset::ZERO }
    }

    /// The least credited offset over the maximal ISR, the leader's own stable offset included; `None`
    /// while a member has not been credited in this epoch.
    pub(super) fn hw_candidate(&self, log: &impl LogView) -> Option<Offset> {
        let mut least = log.stable_end();
        for id in self.maximal_isr() {
            if id == self.me {
                continue;
            }
            least = least.min(self.followers.get(&id)?.credited?);
        }
        Some(least)
    }

    pub(super) fn end_waits(&mut self, hw: Offset, min_isr: usize, finished: &mut Vec<AckOutcome>) {
        let enough = self.isr.len() >= min_isr;
        self.waits.retain(|&(end, token)| {
            if end > hw {
                return true;
            }
            finished.push((token, if enough { Ok(()) } else { Err(ReplicaError::NotEnoughReplicasAfterAppend) }));
            false
        });
    }

    pub(super) fn fail_waits(&mut self, error: ReplicaError, finished: &mut Vec<AckOutcome>) {
        finished.extend(self.waits.drain(..).map(|(_, token)| (token, Err(error))));
    }

    pub(super) fn poll_isr_change(
        &mut self,
        now_ms: i64,
        hw: Offset,
        settings: &ReplicaSettings,
    ) -> Option<IsrProposal> {
        if now_ms < self.propose_at_ms {
            return None;
        }
        if let Some(proposal) = &self.proposed {
            // Unanswered: the same proposal again (the quorum refuses a copy as stale if one applied).
            self.propose_at_ms = now_ms + settings.isr_retry_ms;
            return Some(proposal.clone());
        }
        let lagging = |id: &NodeId| {
            self.followers.get(id).is_some_and(|p| now_ms - p.caught_up_ms > settings.replica_lag_time_max_ms)
        };
        // A replica joins once it has the HW (and this leader's epoch start), and only while it is fetching:
        // a proposed member that went quiet must drop out of the next proposal, or its stale credit would
        // hold the HW for as long as the quorum refuses to add it.
        let joining = |id: &NodeId| {
            !self.refused_at_epoch
                && self.followers.get(id).is_some_and(|p| {
                    now_ms - p.last_fetch_ms <= settings.replica_lag_time_max_ms
                        && p.credited.is_some_and(|c| c >= hw && c >= self.epoch_start)
                })
        };
        let isr: Vec<NodeId> = self
            .replicas
            .iter()
            .copied()
            .filter(|id| {
                *id == self.me || (self.isr.contains(id) && !lagging(id)) || (!self.isr.contains(id) && joining(id))
            })
            .collect();
        // Nothing to change, unless a member of an earlier proposal at this partition epoch is not wanted:
        // then the ISR is proposed as it is, so that the epoch moves past that proposal.
        if isr == self.isr && self.proposed_members.iter().all(|id| isr.contains(id)) {
            return None;
        }
        for id in &isr {
            if !self.proposed_members.contains(id) {
                self.proposed_members.push(*id);
            }
        }
        let proposal = IsrProposal { leader_epoch: self.epoch, partition_epoch: self.partition_epoch, isr };
        self.proposed = Some(proposal.clone());
        self.propose_at_ms = now_ms + settings.isr_retry_ms;
        Some(proposal)
    }

    pub(super) fn answered(
        &mut self,
        now_ms: i64,
        proposal: &IsrProposal,
        outcome: ProposalOutcome,
        settings: &ReplicaSettings,
    ) {
        if self.proposed.as_ref() != Some(proposal) {
            return;
        }
        match outcome {
            // The record that follows ends the proposal (see `update`).
            ProposalOutcome::Applied => {}
            ProposalOutcome::Refused => {
                self.proposed = None;
                self.refused_at_epoch = true;
                self.propose_at_ms = now_ms + settings.isr_retry_ms;
            }
            // Wait for the newer record.
            ProposalOutcome::Stale => self.propose_at_ms = i64::MAX,
            ProposalOutcome::Unknown => self.propose_at_ms = self.propose_at_ms.min(now_ms + settings.isr_retry_ms),
        }
    }
}
