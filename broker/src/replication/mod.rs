//! Replication of one partition: what its leader and its followers decide, without I/O and without a clock.
//!
//! A [`Replica`] is driven from outside: by the shard's adapter in the broker, and by a seeded simulator
//! in the tests. It is told about the partition's record in the quorum (leader, leader epoch, replicas,
//! ISR), the broker's quorum session, followers' fetches and leaders' answers, and it reads its own log
//! through [`LogView`]. It answers with decisions: what to send a follower, where to truncate, which
//! acks=all waits are over, which ISR change to propose.
//!
//! The rules (Kafka's model, with KIP-101/279/320 truncation and KIP-497's maximal ISR):
//! - A follower fetches with its log end offset, the epoch of its last batch and the offset below which its
//!   log is stable (fdatasync'ed; or written, for topics on Kafka's interval flush). The leader first checks
//!   that the follower's last epoch ends, in the leader's log, no earlier than the follower's log end;
//!   otherwise it answers with where that epoch ends, and the follower truncates there (never to its HW).
//! - Only a fetch that passed that check credits the follower with its stable offset. The HW is the least
//!   credited offset over the maximal ISR (the committed ISR plus members the leader has proposed to add),
//!   the leader's own stable offset included, and never moves back. A member proposed for removal keeps
//!   counting until the quorum commits the removal, so the quorum can never elect a replica that lacks an
//!   acknowledged record.
//! - A member that has not caught up with the leader's log end within `replica.lag.time.max.ms` is proposed
//!   out of the ISR, and a replica whose stable offset reached the HW (and the start of the leader's epoch)
//!   is proposed in. One proposal is in flight at a time; it is dropped only when the quorum refused it for
//!   certain or a newer partition record arrived.
//! - acks=all waits until the HW passes the batch. An append is refused with NOT_ENOUGH_REPLICAS while the
//!   ISR is smaller than `min.insync.replicas`; a wait that ends with a smaller ISR is answered
//!   NOT_ENOUGH_REPLICAS_AFTER_APPEND. A leader whose quorum session has lapsed accepts nothing and
//!   acknowledges nothing: its waits end with NOT_LEADER_OR_FOLLOWER.

mod leader;

use shardlog_storage::{LeaderEpoch, Offset};

pub use leader::IsrProposal;
use leader::Leader;

use crate::quorum::state::{NodeId, PartitionRecord};

/// What the state machine reads of its replica's log.
pub trait LogView {
    fn log_start(&self) -> Offset;
    fn log_end(&self) -> Offset;
    /// The end of what counts as this replica's copy: fdatasync'ed, or written under Kafka's interval flush.
    fn stable_end(&self) -> Offset;
    /// The leader epoch of the last batch, if the log has any epoch recorded.
    fn last_epoch(&self) -> Option<LeaderEpoch>;
    /// The oldest leader epoch the log still holds records of.
    fn first_epoch(&self) -> Option<LeaderEpoch>;
    /// Kafka's OffsetForLeaderEpoch on this log: the largest epoch not above `epoch`, and where it ends.
    fn epoch_end(&self, epoch: LeaderEpoch) -> Option<(LeaderEpoch, Offset)>;
}

/// The settings that shape replication of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaSettings {
    /// Kafka's `replica.lag.time.max.ms`.
    pub replica_lag_time_max_ms: i64,
    /// The topic's `min.insync.replicas`.
    pub min_insync_replicas: usize,
    /// How long a leader waits before it proposes an ISR change again after one went unanswered or was
    /// refused.
    pub isr_retry_ms: i64,
}

impl Default for ReplicaSettings {
    fn default() -> Self {
        ReplicaSettings { replica_lag_time_max_ms: 30_000, min_insync_replicas: 1, isr_retry_ms: 500 }
    }
}

/// Why a replica refuses, with the Kafka error each maps to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplicaError {
    NotLeaderOrFollower,
    /// The asker's leader epoch is older than this leader's.
    FencedLeaderEpoch,
    /// The asker's leader epoch is newer than this replica knows.
    UnknownLeaderEpoch,
    NotEnoughReplicas,
    NotEnoughReplicasAfterAppend,
}

/// A follower's fetch, as the leader's state machine sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FetchPosition {
    pub replica: NodeId,
    /// The leader epoch the follower believes current.
    pub leader_epoch: LeaderEpoch,
    /// The follower's log end offset: where the records it asks for start.
    pub offset: Offset,
    /// The epoch of the follower's last batch (`None` for an empty log).
    pub last_epoch: Option<LeaderEpoch>,
    /// The follower's stable offset (see [`LogView::stable_end`]).
    pub stable_end: Offset,
}

/// The leader's answer to a fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FetchReply {
    /// Records from `from` on (the leader's log from there up to its end, within the request's limits).
    Records {
        from: Offset,
        high_watermark: Offset,
    },
    /// The follower's log diverges: its last epoch ends at `end_offset` here (`epoch` is the largest epoch
    /// of the leader's log not above the follower's).
    Diverging {
        epoch: LeaderEpoch,
        end_offset: Offset,
    },
    /// The follower's offset is below the leader's log start, or its last epoch is older than any the
    /// leader still holds: it must empty its log and start over at the leader's log start.
    OutOfRange {
        log_start: Offset,
    },
    Refused(ReplicaError),
}

/// What a follower does with a leader's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FollowerStep {
    /// Append the answer's records (they start at the log end), then call [`Replica::appended`].
    Append { high_watermark: Offset },
    /// Truncate the log to this offset (removing it and everything after), then fetch again.
    Truncate(Offset),
    /// Empty the log and start it at this offset, then fetch again.
    StartAt(Offset),
    /// A stale, duplicated or refused answer: nothing to do but fetch again (after fresh metadata, if it
    /// was refused).
    Ignore,
}

/// An acks=all wait that ended: the caller's token and its outcome.
pub type AckOutcome = (u64, Result<(), ReplicaError>);

#[derive(Debug)]
enum Role {
    /// Not a replica, or not yet told the partition's record.
    None,
    Leader(Leader),
    Follower {
        leader: Option<NodeId>,
        leader_epoch: LeaderEpoch,
    },
}

/// One replica of one partition on one broker.
#[derive(Debug)]
pub struct Replica {
    me: NodeId,
    settings: ReplicaSettings,
    role: Role,
    /// The high watermark this replica knows: a leader's own, a follower's as learned from its leader.
    high_watermark: Offset,
    /// Whether this broker's quorum session is alive.
    in_session: bool,
    /// The newest leader epoch of a record applied: an older record is never applied after it.
    newest_epoch: Option<LeaderEpoch>,
    /// acks=all waits that have ended, for [`Replica::take_acks`].
    finished: Vec<AckOutcome>,
}

impl Replica {
    /// A replica whose log was left with this high watermark (from the checkpoint, at most the log end).
    ///
    /// It starts out of session: a restarted broker may apply a record from before its new registration
    /// that still names it leader, and must not act on it until its session is confirmed.
    pub fn new(me: NodeId, settings: ReplicaSettings, high_watermark: Offset) -> Replica {
        Replica {
            me,
            settings,
            role: Role::None,
            high_watermark,
            in_session: false,
            newest_epoch: None,
            finished: Vec::new(),
        }
    }

    pub fn settings(&self) -> ReplicaSettings {
        self.settings
    }

    /// A topic's settings changed.
    pub fn set_settings(&mut self, settings: ReplicaSettings, log: &impl LogView) {
        self.settings = settings;
        self.advance(log);
    }

    pub fn high_watermark(&self) -> Offset {
        self.high_watermark
    }

    /// The leader epoch this replica leads at, if it leads.
    pub fn leading(&self) -> Option<LeaderEpoch> {
        match &self.role {
            Role::Leader(leader) => Some(leader.epoch),
            _ => None,
        }
    }

    /// The leader this replica follows and its epoch, if it follows one.
    pub fn following(&self) -> Option<(NodeId, LeaderEpoch)> {
        match self.role {
            Role::Follower { leader: Some(leader), leader_epoch } => Some((leader, leader_epoch)),
            _ => None,
        }
    }

    /// The ISR as the leader counts it for the HW: committed members plus proposed ones.
    pub fn maximal_isr(&self) -> Vec<NodeId> {
        match &self.role {
            Role::Leader(leader) => leader.maximal_isr(),
            _ => Vec::new(),
        }
    }

    /// KIP-207: whether the latest offset may be shown to consumers. A new leader's HW can be below what the
    /// previous leader showed until it reaches the start of the new leader's epoch.
    pub fn offsets_available(&self) -> bool {
        match &self.role {
            Role::Leader(leader) => self.high_watermark >= leader.epoch_start,
            _ => true,
        }
    }

    /// The partition's record in the quorum, as this broker last applied it. Becoming leader starts a new
    /// leader state at the log end; losing leadership ends every acks=all wait with NOT_LEADER_OR_FOLLOWER.
    pub fn apply_record(&mut self, record: &PartitionRecord, now_ms: i64, log: &impl LogView) {
        self.high_watermark = self.high_watermark.min(log.log_end());
        if self.newest_epoch.is_some_and(|epoch| record.leader_epoch < epoch) {
            return; // an older record than one applied: the quorum has moved on since
        }
        self.newest_epoch = Some(record.leader_epoch);
        if !record.replicas.contains(&self.me) {
            self.step_down();
            self.role = Role::None;
            return;
        }
        if record.leader == Some(self.me) {
            match &mut self.role {
                Role::Leader(leader) if leader.epoch == record.leader_epoch => leader.update(record, now_ms),
                _ => {
                    self.step_down();
                    self.role = Role::Leader(Leader::new(self.me, record, now_ms, log.log_end()));
                }
            }
            self.advance(log);
        } else {
            self.step_down();
            self.role = Role::Follower { leader: record.leader, leader_epoch: record.leader_epoch };
        }
    }

    /// This broker's quorum session lapsed or came back. While it is lapsed a leader accepts and
    /// acknowledges nothing.
    pub fn set_session(&mut self, alive: bool) {
        self.in_session = alive;
        if !alive && let Role::Leader(leader) = &mut self.role {
            leader.fail_waits(ReplicaError::NotLeaderOrFollower, &mut self.finished);
        }
    }

    /// Whether an append with acks=all (or any acks, when `acks_all` is false) may go ahead now; the leader
    /// epoch to stamp on the batch.
    pub fn check_append(&self, acks_all: bool) -> Result<LeaderEpoch, ReplicaError> {
        let Role::Leader(leader) = &self.role else { return Err(ReplicaError::NotLeaderOrFollower) };
        if !self.in_session {
            return Err(ReplicaError::NotLeaderOrFollower);
        }
        if acks_all && leader.isr.len() < self.settings.min_insync_replicas {
            return Err(ReplicaError::NotEnoughReplicas);
        }
        Ok(leader.epoch)
    }

    /// Waits until the HW reaches `end` (the offset after an appended batch); the outcome comes out of
    /// [`Replica::take_acks`] with `token`.
    pub fn await_ack(&mut self, token: u64, end: Offset, log: &impl LogView) {
        match &mut self.role {
            Role::Leader(leader) if self.in_session => leader.waits.push((end, token)),
            _ => self.finished.push((token, Err(ReplicaError::NotLeaderOrFollower))),
        }
        self.advance(log);
    }

    /// Forgets a wait whose request gave up (its timeout passed).
    pub fn forget_ack(&mut self, token: u64) {
        if let Role::Leader(leader) = &mut self.role {
            leader.waits.retain(|(_, t)| *t != token);
        }
        self.finished.retain(|(t, _)| *t != token);
    }

    /// The acks=all waits that ended since the last call.
    pub fn take_acks(&mut self) -> Vec<AckOutcome> {
        std::mem::take(&mut self.finished)
    }

    /// The local log's stable offset moved (a flush finished): a leader's HW may advance.
    pub fn stable_end_moved(&mut self, log: &impl LogView) {
        self.advance(log);
    }

    /// A follower's fetch arrived at this (would-be) leader.
    pub fn on_fetch(&mut self, now_ms: i64, fetch: &FetchPosition, log: &impl LogView) -> FetchReply {
        let mut reply = match &mut self.role {
            Role::Leader(leader) => leader.on_fetch(now_ms, fetch, log),
            Role::Follower { leader_epoch, .. } if fetch.leader_epoch > *leader_epoch => {
                FetchReply::Refused(ReplicaError::UnknownLeaderEpoch)
            }
            _ => FetchReply::Refused(ReplicaError::NotLeaderOrFollower),
        };
        self.advance(log);
        if let FetchReply::Records { high_watermark, .. } = &mut reply {
            *high_watermark = self.high_watermark;
        }
        reply
    }

    /// What a follower asks its leader for now: `None` when it follows no live leader.
    pub fn fetch_position(&self, log: &impl LogView) -> Option<(NodeId, FetchPosition)> {
        let (leader, leader_epoch) = self.following()?;
        let position = FetchPosition {
            replica: self.me,
            leader_epoch,
            offset: log.log_end(),
            last_epoch: log.last_epoch(),
            stable_end: log.stable_end(),
        };
        Some((leader, position))
    }

    /// A leader's answer to `asked` (the position the follower sent) arrived.
    pub fn on_reply(&mut self, asked: &FetchPosition, reply: &FetchReply, log: &impl LogView) -> FollowerStep {
        let Some((_, leader_epoch)) = self.following() else { return FollowerStep::Ignore };
        // An answer to a question asked under another epoch, or from another log end (a duplicate, or
        // one overtaken by a later answer), says nothing about the log as it is now.
        if asked.leader_epoch != leader_epoch || asked.offset != log.log_end() || asked.last_epoch != log.last_epoch() {
            return FollowerStep::Ignore;
        }
        match *reply {
            FetchReply::Records { from, high_watermark } if from == log.log_end() => {
                FollowerStep::Append { high_watermark }
            }
            FetchReply::Records { .. } | FetchReply::Refused(_) => FollowerStep::Ignore,
            FetchReply::Diverging { epoch, end_offset } => {
                // KIP-279: go back to where both logs agree the epoch ended; the next fetch checks the epoch
                // before it, until the logs agree.
                let own_end = log.epoch_end(epoch).map_or(log.log_start(), |(_, end)| end);
                let to = end_offset.min(own_end).min(log.log_end());
                if to >= log.log_end() {
                    return FollowerStep::Ignore;
                }
                if to < log.log_start() {
                    // Nothing this log holds agrees: it starts over where the leader's epoch ended.
                    self.high_watermark = self.high_watermark.min(end_offset);
                    return FollowerStep::StartAt(end_offset);
                }
                self.high_watermark = self.high_watermark.min(to);
                FollowerStep::Truncate(to)
            }
            FetchReply::OutOfRange { log_start } if log.log_start() == log_start && log.log_end() == log_start => {
                FollowerStep::Ignore
            }
            FetchReply::OutOfRange { log_start } => {
                self.high_watermark = self.high_watermark.min(log_start);
                FollowerStep::StartAt(log_start)
            }
        }
    }

    /// A follower appended the records of an answer; `leader_hw` is the answer's HW.
    pub fn appended(&mut self, leader_hw: Offset, log: &impl LogView) {
        if self.following().is_some() {
            self.high_watermark = leader_hw.min(log.log_end());
        }
    }

    /// The ISR change this leader should propose now, if any (at most one is in flight).
    pub fn poll_isr_change(&mut self, now_ms: i64) -> Option<IsrProposal> {
        match &mut self.role {
            Role::Leader(leader) if self.in_session => {
                leader.poll_isr_change(now_ms, self.high_watermark, &self.settings)
            }
            _ => None,
        }
    }

    /// How the quorum answered `proposal`. An answer to anything but the proposal in flight is ignored.
    pub fn isr_change_answered(
        &mut self,
        now_ms: i64,
        proposal: &IsrProposal,
        outcome: ProposalOutcome,
        log: &impl LogView,
    ) {
        if let Role::Leader(leader) = &mut self.role {
            leader.answered(now_ms, proposal, outcome, &self.settings);
        }
        self.advance(log);
    }

    /// Moves a leader's HW up to what its maximal ISR has, and ends the waits it passed.
    fn advance(&mut self, log: &impl LogView) {
        let Role::Leader(leader) = &mut self.role else { return };
        if let Some(candidate) = leader.hw_candidate(log) {
            self.high_watermark = self.high_watermark.max(candidate.min(log.log_end()));
        }
        if self.in_session {
            leader.end_waits(self.high_watermark, self.settings.min_insync_replicas, &mut self.finished);
        }
    }

    fn step_down(&mut self) {
        if let Role::Leader(leader) = &mut self.role {
            leader.fail_waits(ReplicaError::NotLeaderOrFollower, &mut self.finished);
        }
    }
}

/// How the quorum answered an ISR proposal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProposalOutcome {
    /// Applied: the new record follows through the metadata.
    Applied,
    /// Refused for what it proposed (for example a fenced broker joining): certainly not applied.
    Refused,
    /// Refused as stale (another leader epoch or partition epoch): an earlier copy may have applied, so the
    /// proposal stands until a newer record arrives.
    Stale,
    /// No answer: it may or may not have applied. Sent again after the retry interval.
    Unknown,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quorum::state::PartitionEpoch;

    /// A log with one epoch: `end` records of epoch 0, `stable` of them on disk.
    struct Log {
        end: u64,
        stable: u64,
    }

    impl LogView for Log {
        fn log_start(&self) -> Offset {
            Offset::ZERO
        }
        fn log_end(&self) -> Offset {
            Offset(self.end)
        }
        fn stable_end(&self) -> Offset {
            Offset(self.stable)
        }
        fn last_epoch(&self) -> Option<LeaderEpoch> {
            (self.end > 0).then_some(LeaderEpoch(0))
        }
        fn first_epoch(&self) -> Option<LeaderEpoch> {
            self.last_epoch()
        }
        fn epoch_end(&self, epoch: LeaderEpoch) -> Option<(LeaderEpoch, Offset)> {
            (epoch.0 >= 0 && self.end > 0).then_some((LeaderEpoch(0), Offset(self.end)))
        }
    }

    fn record(isr: &[u32], partition_epoch: i32) -> PartitionRecord {
        PartitionRecord {
            replicas: vec![NodeId(1), NodeId(2), NodeId(3)],
            isr: isr.iter().map(|&i| NodeId(i)).collect(),
            leader: Some(NodeId(1)),
            leader_epoch: LeaderEpoch(0),
            partition_epoch: PartitionEpoch(partition_epoch),
            adding_replicas: Vec::new(),
            removing_replicas: Vec::new(),
            offline_replicas: Vec::new(),
        }
    }

    fn leader(isr: &[u32], log: &Log) -> Replica {
        let settings = ReplicaSettings { min_insync_replicas: 2, ..ReplicaSettings::default() };
        let mut replica = Replica::new(NodeId(1), settings, Offset::ZERO);
        replica.set_session(true);
        replica.apply_record(&record(isr, 0), 0, log);
        replica
    }

    fn fetch(replica: u32, offset: u64, stable: u64) -> FetchPosition {
        FetchPosition {
            replica: NodeId(replica),
            leader_epoch: LeaderEpoch(0),
            offset: Offset(offset),
            last_epoch: (offset > 0).then_some(LeaderEpoch(0)),
            stable_end: Offset(stable),
        }
    }

    #[test]
    fn the_hw_is_the_least_stable_offset_over_the_isr_and_acks_wait_for_it() {
        let log = Log { end: 10, stable: 10 };
        let mut replica = leader(&[1, 2, 3], &log);
        replica.await_ack(7, Offset(10), &log);
        replica.on_fetch(1, &fetch(2, 10, 10), &log);
        assert_eq!(replica.high_watermark(), Offset::ZERO, "follower 3 has not fetched yet");
        // Follower 3 has written everything but fdatasync'ed only 6: only that counts.
        let reply = replica.on_fetch(2, &fetch(3, 10, 6), &log);
        assert_eq!(reply, FetchReply::Records { from: Offset(10), high_watermark: Offset(6) });
        assert!(replica.take_acks().is_empty());
        replica.on_fetch(3, &fetch(3, 10, 10), &log);
        assert_eq!(replica.high_watermark(), Offset(10));
        assert_eq!(replica.take_acks(), vec![(7, Ok(()))]);
    }

    #[test]
    fn a_small_isr_refuses_acks_all_before_and_after_the_append() {
        let log = Log { end: 4, stable: 4 };
        let replica = leader(&[1], &log);
        assert_eq!(replica.check_append(true), Err(ReplicaError::NotEnoughReplicas));
        assert_eq!(replica.check_append(false), Ok(LeaderEpoch(0)));

        let mut replica = leader(&[1, 2], &log);
        assert_eq!(replica.check_append(true), Ok(LeaderEpoch(0)));
        replica.await_ack(1, Offset(4), &log);
        // The ISR shrinks to the leader alone while the batch waits: the HW passes it with too few copies.
        replica.apply_record(&record(&[1], 1), 5, &log);
        assert_eq!(replica.take_acks(), vec![(1, Err(ReplicaError::NotEnoughReplicasAfterAppend))]);
    }

    #[test]
    fn a_lapsed_session_ends_waits_and_refuses_appends() {
        let log = Log { end: 4, stable: 4 };
        let mut replica = leader(&[1, 2], &log);
        replica.await_ack(1, Offset(4), &log);
        replica.set_session(false);
        assert_eq!(replica.take_acks(), vec![(1, Err(ReplicaError::NotLeaderOrFollower))]);
        assert_eq!(replica.check_append(false), Err(ReplicaError::NotLeaderOrFollower));
        replica.on_fetch(1, &fetch(2, 4, 4), &log);
        replica.await_ack(2, Offset(4), &log);
        assert_eq!(replica.take_acks(), vec![(2, Err(ReplicaError::NotLeaderOrFollower))]);
    }

    #[test]
    fn a_replica_removed_and_added_back_in_records_the_leader_missed_must_fetch_again_to_join() {
        let log = Log { end: 4, stable: 4 };
        let mut replica = leader(&[1, 2], &log);
        replica.on_fetch(10, &fetch(3, 4, 4), &log);
        // Replica 3 left and came back (its log deleted and started over) in records this leader did not
        // see: its old fetch must not put it in the ISR.
        replica.apply_record(&record(&[1, 2], 2), 20, &log);
        assert_eq!(replica.poll_isr_change(30), None);
        replica.on_fetch(40, &fetch(3, 4, 4), &log);
        let proposal = replica.poll_isr_change(50).expect("replica 3 fetched again, caught up");
        assert_eq!(proposal.isr, vec![NodeId(1), NodeId(2), NodeId(3)]);
    }

    #[test]
    fn a_lagging_member_is_proposed_out_and_a_caught_up_one_back_in() {
        let log = Log { end: 4, stable: 4 };
        let mut replica = leader(&[1, 2, 3], &log);
        replica.on_fetch(10, &fetch(2, 4, 4), &log);
        assert_eq!(replica.poll_isr_change(20), None);
        let late = 31_000;
        replica.on_fetch(late, &fetch(2, 4, 4), &log);
        let proposal = replica.poll_isr_change(late).expect("member 3 lagged past replica.lag.time.max.ms");
        assert_eq!(proposal.isr, vec![NodeId(1), NodeId(2)]);
        // Until the removal is committed, member 3 still counts for the HW.
        assert_eq!(replica.maximal_isr(), vec![NodeId(1), NodeId(2), NodeId(3)]);
        replica.apply_record(&record(&[1, 2], 1), late, &log);
        assert_eq!(replica.maximal_isr(), vec![NodeId(1), NodeId(2)]);
        replica.on_fetch(late + 1, &fetch(3, 4, 4), &log);
        let proposal = replica.poll_isr_change(late + 1000).expect("member 3 caught up");
        assert_eq!(proposal.isr, vec![NodeId(1), NodeId(2), NodeId(3)]);
        // From the proposal on, member 3 counts again.
        assert_eq!(replica.maximal_isr(), vec![NodeId(1), NodeId(2), NodeId(3)]);
    }

    #[test]
    fn a_new_leader_hides_its_latest_offset_until_its_hw_reaches_its_epoch_start() {
        let log = Log { end: 8, stable: 8 };
        let settings = ReplicaSettings { min_insync_replicas: 1, ..ReplicaSettings::default() };
        let mut replica = Replica::new(NodeId(1), settings, Offset(5));
        replica.set_session(true);
        replica.apply_record(&record(&[1, 2], 0), 0, &log);
        assert!(!replica.offsets_available(), "HW 5 is below the epoch's start, 8");
        replica.on_fetch(1, &fetch(2, 8, 8), &log);
        assert!(replica.offsets_available());
    }

    #[test]
    fn a_diverging_follower_truncates_to_where_the_leaders_epoch_ended() {
        let log = Log { end: 10, stable: 10 };
        let settings = ReplicaSettings::default();
        let mut follower = Replica::new(NodeId(2), settings, Offset(3));
        let mut as_follower = record(&[1, 2], 0);
        as_follower.leader_epoch = LeaderEpoch(1);
        follower.apply_record(&as_follower, 0, &log);
        let (to, asked) = follower.fetch_position(&log).expect("follows broker 1");
        assert_eq!(to, NodeId(1));
        let reply = FetchReply::Diverging { epoch: LeaderEpoch(0), end_offset: Offset(7) };
        assert_eq!(follower.on_reply(&asked, &reply, &log), FollowerStep::Truncate(Offset(7)));
        // A reply to a question asked from another log end is stale.
        let stale = FetchPosition { offset: Offset(9), ..asked };
        assert_eq!(follower.on_reply(&stale, &reply, &log), FollowerStep::Ignore);
    }

    #[test]
    fn a_refused_joiner_that_goes_quiet_stops_holding_the_hw() {
        let mut log = Log { end: 10, stable: 10 };
        let mut replica = leader(&[1, 2], &log);
        replica.on_fetch(1, &fetch(2, 10, 10), &log);
        replica.on_fetch(1, &fetch(3, 10, 10), &log);
        let joining = replica.poll_isr_change(1).expect("3 caught up");
        assert_eq!(joining.isr, vec![NodeId(1), NodeId(2), NodeId(3)]);
        // The quorum refuses (3 was fenced); a late copy could still apply, so 3 keeps counting.
        replica.isr_change_answered(2, &joining, ProposalOutcome::Refused, &log);
        assert_eq!(replica.maximal_isr(), vec![NodeId(1), NodeId(2), NodeId(3)]);
        // 3 goes quiet; the log grows and 2 keeps up.
        let mut now = 2;
        let mut moved_on = None;
        while now < 40_000 && moved_on.is_none() {
            now += 100;
            log.end += 1;
            log.stable = log.end;
            replica.on_fetch(now, &fetch(2, log.end, log.end), &log);
            if let Some(proposal) = replica.poll_isr_change(now) {
                assert!(!proposal.isr.contains(&NodeId(3)), "a refused joiner that stopped fetching: {proposal:?}");
                moved_on = Some(proposal);
            }
        }
        let proposal = moved_on.expect("the ISR is proposed again without 3, to move the partition epoch");
        assert_eq!(proposal.isr, vec![NodeId(1), NodeId(2)]);
        assert_eq!(replica.high_watermark(), Offset(10), "3 held the HW until then");
        replica.apply_record(&record(&[1, 2], 1), now, &log);
        assert_eq!(replica.maximal_isr(), vec![NodeId(1), NodeId(2)]);
        replica.on_fetch(now + 1, &fetch(2, log.end, log.end), &log);
        assert_eq!(replica.high_watermark(), Offset(log.end));
    }
}
