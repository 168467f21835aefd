//! The shard's side of replication: one [`Replica`] state machine per partition the shard hosts, driven by
//! the partition's record from the metadata, the log's progress and the broker's quorum session. Produce
//! asks it whether this shard may append and waits on it for acks=all; fetch and ListOffsets ask it for the
//! high watermark, which it also records in the log for the checkpoint.
//!
//! All of it runs on the shard's thread, between awaits: the state machine is never held across one.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::ResponseError;
use shardlog_storage::fs::Fs;
use shardlog_storage::{
    Clock, FlushPolicy, LeaderEpoch, LogDir, Offset, PartitionLog, StorageError, SystemClock, TopicPartition,
};

use crate::quorum::state::{NodeId, PartitionRecord};
use crate::replication::{
    FetchPosition, FetchReply, FollowerStep, IsrProposal, LogView, ProposalOutcome, Replica, ReplicaError,
    ReplicaSettings,
};

/// A partition log as the replica state machine reads it.
struct View<'a, F: Fs>(&'a PartitionLog<F>);

impl<F: Fs> LogView for View<'_, F> {
    fn log_start(&self) -> Offset {
        self.0.log_start_offset()
    }
    fn log_end(&self) -> Offset {
        self.0.log_end_offset()
    }
    fn stable_end(&self) -> Offset {
        stable_end(self.0)
    }
    fn last_epoch(&self) -> Option<LeaderEpoch> {
        self.0.latest_epoch()
    }
    fn first_epoch(&self) -> Option<LeaderEpoch> {
        self.0.earliest_epoch()
    }
    fn epoch_end(&self, epoch: LeaderEpoch) -> Option<(LeaderEpoch, Offset)> {
        self.0.end_offset_for_epoch(epoch)
    }
}

/// What this replica counts as its copy: what is on disk, or, under Kafka's interval flush, what is written.
pub fn stable_end<F: Fs>(log: &PartitionLog<F>) -> Offset {
    match log.config().flush {
        FlushPolicy::Always => log.durable_offset(),
        FlushPolicy::Interval { .. } => log.log_end_offset(),
    }
}

/// The Kafka error for a replica's refusal.
pub fn replica_error(e: ReplicaError) -> ResponseError {
    match e {
        ReplicaError::NotLeaderOrFollower => ResponseError::NotLeaderOrFollower,
        ReplicaError::FencedLeaderEpoch => ResponseError::FencedLeaderEpoch,
        ReplicaError::UnknownLeaderEpoch => ResponseError::UnknownLeaderEpoch,
        ReplicaError::NotEnoughReplicas => ResponseError::NotEnoughReplicas,
        ReplicaError::NotEnoughReplicasAfterAppend => ResponseError::NotEnoughReplicasAfterAppend,
    }
}

/// An acks=all wait: its verdict arrives on `verdict`.
#[derive(Debug)]
pub struct AckWait {
    token: u64,
    pub verdict: flume::Receiver<Result<(), ReplicaError>>,
}

struct Part {
    /// The topic the replica belongs to: a topic created again under the same name starts afresh.
    topic_id: uuid::Uuid,
    /// How many other replicas the partition has.
    followers: usize,
    /// The ISR of the record last applied, for the log line when it changes.
    isr: Vec<NodeId>,
    replica: Replica,
    /// acks=all waits by token.
    waiters: HashMap<u64, flume::Sender<Result<(), ReplicaError>>>,
}

/// What a partition became on this broker when its record changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoleChange {
    Leading,
    Following(NodeId),
    /// Neither: the partition has no leader, or this broker is not among its replicas any more.
    Neither,
}

/// The replicas of one shard's partitions.
pub struct ShardReplicas {
    me: NodeId,
    lag_time_ms: u64,
    in_session: Box<dyn Fn() -> bool>,
    /// Notified when a partition led here gets records or a new HW: held follower fetches (on any shard)
    /// look again.
    progress: Arc<event_listener::Event>,
    parts: RefCell<HashMap<TopicPartition, Part>>,
    next_token: Cell<u64>,
    /// `test.acks.all.before.replication`: acks=all answered without the followers (broken on purpose).
    acks_all_unreplicated: Cell<bool>,
}

impl std::fmt::Debug for ShardReplicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardReplicas").field("me", &self.me).finish_non_exhaustive()
    }
}

impl ShardReplicas {
    /// `in_session`: whether the broker's quorum session is alive right now; `lag_time_ms` is
    /// `replica.lag.time.max.ms`.
    pub fn new(
        me: NodeId,
        lag_time_ms: u64,
        in_session: impl Fn() -> bool + 'static,
        progress: Arc<event_listener::Event>,
    ) -> ShardReplicas {
        ShardReplicas {
            me,
            lag_time_ms,
            in_session: Box::new(in_session),
            progress,
            parts: RefCell::new(HashMap::new()),
            next_token: Cell::new(0),
            acks_all_unreplicated: Cell::new(false),
        }
    }

    /// `test.acks.all.before.replication`: from now on acks=all does not wait for the followers. Only
    /// for checking that fault campaigns catch the writes this loses.
    pub fn break_acks_all_for_tests(&self) {
        self.acks_all_unreplicated.set(true);
    }

    /// Whether an acks=all produce waits for the in-sync followers (always, unless broken for tests).
    pub fn acks_all_waits_for_followers(&self) -> bool {
        !self.acks_all_unreplicated.get()
    }

    /// The partition's record as the metadata now has it, and the topic's `min.insync.replicas`. Returns
    /// the partition's new role here when it changed: the caller logs it, together with the others of the
    /// same metadata image (a topic of 50 partitions created is one line, not 50).
    pub fn apply_record<F: Fs>(
        &self,
        tp: &TopicPartition,
        topic_id: uuid::Uuid,
        record: &PartitionRecord,
        min_insync_replicas: u16,
        log: &PartitionLog<F>,
    ) -> Option<RoleChange> {
        if self.parts.borrow().get(tp).is_some_and(|part| part.topic_id != topic_id) {
            self.remove(tp);
        }
        let mut parts = self.parts.borrow_mut();
        let view = View(log);
        let settings = ReplicaSettings {
            min_insync_replicas: min_insync_replicas as usize,
            replica_lag_time_max_ms: self.lag_time_ms as i64,
            ..ReplicaSettings::default()
        };
        let part = parts.entry(tp.clone()).or_insert_with(|| Part {
            topic_id,
            followers: 0,
            isr: record.isr.clone(),
            replica: Replica::new(self.me, settings, log.high_watermark().min(log.log_end_offset())),
            waiters: HashMap::new(),
        });
        if part.replica.settings() != settings {
            part.replica.set_settings(settings, &view);
        }
        part.followers = record.replicas.iter().filter(|id| **id != self.me).count();
        part.replica.set_session((self.in_session)());
        let was = (part.replica.leading(), part.replica.following());
        part.replica.apply_record(record, SystemClock.now_ms(), &view);
        let now = (part.replica.leading(), part.replica.following());
        if now.0 != was.0 {
            // No longer led here, or led at a new epoch: the appends the verification guards were handed
            // out for are refused by their epoch, and a verification at the new epoch starts afresh.
            log.drop_verification_guards();
        }
        let mut change = None;
        if was != now {
            // Fetches held here for news read again and find out (NOT_LEADER_OR_FOLLOWER, or a new HW).
            log.news().bump();
            change = Some(match now {
                (Some(epoch), _) => {
                    tracing::debug!(partition = %tp, %epoch, isr = ?record.isr, "leading partition");
                    RoleChange::Leading
                }
                (_, Some((leader, epoch))) => {
                    tracing::debug!(partition = %tp, %epoch, leader = leader.0, "following partition");
                    RoleChange::Following(leader)
                }
                _ => {
                    tracing::debug!(partition = %tp, "neither leading nor following");
                    RoleChange::Neither
                }
            });
        } else if now.0.is_some() && part.isr != record.isr {
            // Kafka's under-replicated partitions, as the leader sees them change.
            let (replicas, isr, was) = (record.replicas.len(), &record.isr, &part.isr);
            if isr.len() < was.len() {
                tracing::info!(partition = %tp, ?was, ?isr, replicas, "ISR shrank: under-replicated");
            } else if isr.len() == was.len() {
                tracing::info!(partition = %tp, ?was, ?isr, replicas, "ISR changed");
            } else if isr.len() < replicas {
                tracing::info!(partition = %tp, ?was, ?isr, replicas, "ISR grew: still under-replicated");
            } else {
                tracing::info!(partition = %tp, ?was, ?isr, "ISR grew: fully replicated");
            }
        }
        part.isr = record.isr.clone();
        Self::settle(part, log, &self.progress);
        change
    }

    /// Forgets a partition whose log is gone; its waits end with NOT_LEADER_OR_FOLLOWER.
    pub fn remove(&self, tp: &TopicPartition) {
        if let Some(part) = self.parts.borrow_mut().remove(tp) {
            for (_, waiter) in part.waiters {
                let _ = waiter.send(Err(ReplicaError::NotLeaderOrFollower));
            }
        }
    }

    /// Whether a produce may append now; the leader epoch to stamp on its batch. `asked` is the epoch the
    /// request handler routed by: if the shard's record moved on since, the client must look again.
    pub fn check_append(
        &self,
        tp: &TopicPartition,
        asked: LeaderEpoch,
        acks_all: bool,
    ) -> Result<LeaderEpoch, ResponseError> {
        let mut parts = self.parts.borrow_mut();
        let part = parts.get_mut(tp).ok_or(ResponseError::NotLeaderOrFollower)?;
        part.replica.set_session((self.in_session)());
        let epoch = part.replica.check_append(acks_all).map_err(replica_error)?;
        if epoch != asked {
            return Err(ResponseError::NotLeaderOrFollower);
        }
        Ok(epoch)
    }

    /// Starts an acks=all wait for the high watermark to reach `end`: the receiver gets its verdict.
    pub fn await_ack<F: Fs>(&self, tp: &TopicPartition, end: Offset, log: &PartitionLog<F>) -> AckWait {
        let (tx, rx) = flume::bounded(1);
        let token = self.next_token.get();
        self.next_token.set(token + 1);
        let mut parts = self.parts.borrow_mut();
        match parts.get_mut(tp) {
            Some(part) => {
                part.waiters.insert(token, tx);
                part.replica.set_session((self.in_session)());
                part.replica.await_ack(token, end, &View(log));
                Self::settle(part, log, &self.progress);
            }
            None => {
                let _ = tx.send(Err(ReplicaError::NotLeaderOrFollower));
            }
        }
        AckWait { token, verdict: rx }
    }

    /// Forgets an acks=all wait whose request gave up.
    pub fn forget_ack(&self, tp: &TopicPartition, wait: &AckWait) {
        if let Some(part) = self.parts.borrow_mut().get_mut(tp) {
            part.waiters.remove(&wait.token);
            part.replica.forget_ack(wait.token);
        }
    }

    /// The log's stable offset may have moved (a flush finished): the HW follows, and waits it passed end.
    pub fn log_moved<F: Fs>(&self, tp: &TopicPartition, log: &PartitionLog<F>) {
        let mut parts = self.parts.borrow_mut();
        if let Some(part) = parts.get_mut(tp) {
            part.replica.set_session((self.in_session)());
            part.replica.stable_end_moved(&View(log));
            Self::settle(part, log, &self.progress);
        }
    }

    /// [`Self::log_moved`] for every partition: the HWs (and the HW checkpoint, and retention, which
    /// stops at them) catch up with flushes nothing else reported.
    pub fn settle_all<F: Fs>(&self, logs: &LogDir<F>) {
        let in_session = (self.in_session)();
        for (tp, part) in self.parts.borrow_mut().iter_mut() {
            if let Some(log) = logs.get(tp) {
                part.replica.set_session(in_session);
                part.replica.stable_end_moved(&View(&log));
                Self::settle(part, &log, &self.progress);
            }
        }
    }

    /// The offset consumers may read up to: the replica's high watermark, brought up to date first. A
    /// partition without a record yet (the metadata has not reached this shard) shows its checkpointed HW.
    pub fn high_watermark<F: Fs>(&self, tp: &TopicPartition, log: &PartitionLog<F>) -> Offset {
        self.log_moved(tp, log);
        self.parts
            .borrow()
            .get(tp)
            .map_or(log.high_watermark(), |part| part.replica.high_watermark())
            .min(log.log_end_offset())
    }

    /// KIP-207: whether this leader may show its latest offset yet.
    pub fn offsets_available(&self, tp: &TopicPartition) -> bool {
        self.parts.borrow().get(tp).is_none_or(|part| part.replica.offsets_available())
    }

    /// A follower's fetch of a partition this shard leads: the state machine's answer, with the records
    /// from the follower's offset up to this log's end (at most `max_bytes`, but at least one batch).
    pub async fn serve_fetch<F: Fs>(
        &self,
        tp: &TopicPartition,
        position: &FetchPosition,
        max_bytes: usize,
        log: &PartitionLog<F>,
    ) -> (FetchReply, Bytes) {
        if log.damage().is_some() {
            // A damaged log's end and epochs stop at its damage: answering from them (diverging, out of
            // range) would make followers cut committed records. It serves followers nothing.
            return (FetchReply::Refused(ReplicaError::NotLeaderOrFollower), Bytes::new());
        }
        let reply = {
            let mut parts = self.parts.borrow_mut();
            let Some(part) = parts.get_mut(tp) else {
                return (FetchReply::Refused(ReplicaError::NotLeaderOrFollower), Bytes::new());
            };
            part.replica.set_session((self.in_session)());
            let reply = part.replica.on_fetch(SystemClock.now_ms(), position, &View(log));
            Self::settle(part, log, &self.progress);
            reply
        };
        let FetchReply::Records { from, .. } = reply else { return (reply, Bytes::new()) };
        let end = log.log_end_offset();
        if from >= end {
            return (reply, Bytes::new());
        }
        match log.read_until(from, max_bytes, end).await {
            Ok(read) => (reply, read.bytes),
            // Retention removed the range since the check: the follower starts over at the new start.
            Err(StorageError::OffsetOutOfRange { .. }) => {
                (FetchReply::OutOfRange { log_start: log.log_start_offset() }, Bytes::new())
            }
            // A log closing with its shard, or deleted with its topic: nothing for an operator.
            Err(e @ StorageError::Closed(_)) => {
                tracing::debug!(partition = %tp, error = %e, "cannot read records for a follower");
                (FetchReply::Refused(ReplicaError::NotLeaderOrFollower), Bytes::new())
            }
            Err(e) => {
                tracing::warn!(partition = %tp, error = %e, "cannot read records for a follower");
                (FetchReply::Refused(ReplicaError::NotLeaderOrFollower), Bytes::new())
            }
        }
    }

    /// What this shard, following `tp`, asks its leader for now: the leader and the position.
    pub fn fetch_position<F: Fs>(&self, tp: &TopicPartition, log: &PartitionLog<F>) -> Option<(NodeId, FetchPosition)> {
        self.parts.borrow().get(tp)?.replica.fetch_position(&View(log))
    }

    /// The leader's answer to `asked` for a partition this shard follows: appends its records, truncates,
    /// or starts the log over, as the state machine decides. A storage refusal (a batch that does not
    /// check, say) appends nothing and is returned; the next fetch asks again from the same place.
    pub async fn apply_answer<F: Fs>(
        &self,
        tp: &TopicPartition,
        asked: &FetchPosition,
        reply: &FetchReply,
        records: &[u8],
        log: &PartitionLog<F>,
    ) -> Result<FollowerStep, StorageError> {
        let step = match self.parts.borrow_mut().get_mut(tp) {
            Some(part) => part.replica.on_reply(asked, reply, &View(log)),
            None => FollowerStep::Ignore,
        };
        match step {
            FollowerStep::Append { high_watermark } => {
                log.append_replicated(records).await?;
                if let Some(part) = self.parts.borrow_mut().get_mut(tp) {
                    part.replica.appended(high_watermark, &View(log));
                    Self::settle(part, log, &self.progress);
                }
            }
            FollowerStep::Truncate(to) => {
                let end = log.truncate_to(to).await?;
                tracing::info!(partition = %tp, %end, ?reply, "truncated to where the leader's log agrees");
                if let Some(part) = self.parts.borrow_mut().get_mut(tp) {
                    Self::settle(part, log, &self.progress);
                }
            }
            FollowerStep::StartAt(offset) => {
                log.truncate_fully_and_start_at(offset).await?;
                tracing::info!(partition = %tp, %offset, "log started over at the leader's log start");
            }
            FollowerStep::Ignore => {}
        }
        Ok(step)
    }

    /// Notified when a partition led here gets records or a new high watermark: follower fetches held
    /// for news listen to it.
    pub fn progress(&self) -> &event_listener::Event {
        &self.progress
    }

    /// A leader appended: followers waiting for records look again.
    pub fn appended_as_leader(&self, tp: &TopicPartition) {
        if self.parts.borrow().get(tp).is_some_and(|part| part.followers > 0) {
            self.progress.notify(usize::MAX);
        }
    }

    /// The partitions this shard follows, with their leaders.
    pub fn followed(&self) -> Vec<(TopicPartition, NodeId)> {
        let parts = self.parts.borrow();
        parts.iter().filter_map(|(tp, part)| Some((tp.clone(), part.replica.following()?.0))).collect()
    }

    /// The topic id of a partition hosted here.
    pub fn topic_id(&self, tp: &TopicPartition) -> Option<uuid::Uuid> {
        self.parts.borrow().get(tp).map(|part| part.topic_id)
    }

    /// The ISR changes this shard's leaders should propose now.
    pub fn poll_isr_changes(&self) -> Vec<(TopicPartition, IsrProposal)> {
        let now = SystemClock.now_ms();
        let in_session = (self.in_session)();
        let mut parts = self.parts.borrow_mut();
        let mut out = Vec::new();
        for (tp, part) in parts.iter_mut() {
            part.replica.set_session(in_session);
            if let Some(proposal) = part.replica.poll_isr_change(now) {
                out.push((tp.clone(), proposal));
            }
        }
        out
    }

    /// How the quorum answered an ISR proposal.
    pub fn isr_change_answered<F: Fs>(
        &self,
        tp: &TopicPartition,
        proposal: &IsrProposal,
        outcome: ProposalOutcome,
        log: &PartitionLog<F>,
    ) {
        if let Some(part) = self.parts.borrow_mut().get_mut(tp) {
            part.replica.isr_change_answered(SystemClock.now_ms(), proposal, outcome, &View(log));
            Self::settle(part, log, &self.progress);
        }
    }

    /// Hands out the verdicts of finished waits and records the HW in the log for the checkpoint; a new HW
    /// is news for held follower fetches.
    fn settle<F: Fs>(part: &mut Part, log: &PartitionLog<F>, progress: &event_listener::Event) {
        for (token, outcome) in part.replica.take_acks() {
            if let Some(waiter) = part.waiters.remove(&token) {
                let _ = waiter.send(outcome);
            }
        }
        let hw = part.replica.high_watermark().min(log.log_end_offset());
        if hw != log.high_watermark() {
            log.set_high_watermark(hw);
            if part.followers > 0 {
                progress.notify(usize::MAX);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::rc::Rc;

    use futures_lite::future::block_on;
    use shardlog_storage::batch::build_batch;
    use shardlog_storage::fs::sim::SimFs;
    use shardlog_storage::{LogConfig, LogDir};

    use super::*;
    use crate::quorum::state::PartitionEpoch;

    fn open(fs: &SimFs, dir: &str) -> (LogDir<SimFs>, Rc<PartitionLog<SimFs>>) {
        let config = LogConfig { segment_bytes: 4096, tail_cache_bytes: 0, ..LogConfig::default() };
        let (logs, _) = block_on(LogDir::open(fs.clone(), Rc::new(SystemClock), Path::new(dir), |_| config.clone()))
            .expect("log dir");
        let log = block_on(logs.get_or_create(&TopicPartition::new("t", 0), config)).expect("log");
        (logs, log)
    }

    fn everything(log: &PartitionLog<SimFs>) -> Vec<u8> {
        block_on(log.read(log.log_start_offset(), usize::MAX)).expect("read").bytes.to_vec()
    }

    #[test]
    fn a_diverged_follower_truncates_catches_up_byte_for_byte_and_lets_acks_all_complete() {
        let fs = SimFs::new();
        let tp = TopicPartition::new("t", 0);
        let (_l, leader_log) = open(&fs, "/leader");
        let (_f, follower_log) = open(&fs, "/follower");
        let value = |i: u8| vec![i; 300];
        // Epoch 0 wrote six batches, which the follower copied up to the fourth; as leader of epoch 1 the
        // follower then took two batches no one else has; epoch 2's leader wrote six more.
        for i in 0..6u8 {
            block_on(leader_log.append(&build_batch(1_000, &[&value(i)]), LeaderEpoch(0))).unwrap();
        }
        let shared = block_on(leader_log.read(Offset(0), usize::MAX)).unwrap().bytes;
        let four = block_on(leader_log.read_until(Offset(0), usize::MAX, Offset(4))).unwrap().bytes;
        block_on(follower_log.append_replicated(&four)).unwrap();
        assert!(shared.len() > four.len());
        for i in 100..102u8 {
            block_on(follower_log.append(&build_batch(1_000, &[&value(i)]), LeaderEpoch(1))).unwrap();
        }
        for i in 6..12u8 {
            block_on(leader_log.append(&build_batch(1_000, &[&value(i)]), LeaderEpoch(2))).unwrap();
        }
        block_on(leader_log.flush()).unwrap();
        block_on(follower_log.flush()).unwrap();

        let record = PartitionRecord {
            replicas: vec![NodeId(1), NodeId(2)],
            isr: vec![NodeId(1), NodeId(2)],
            leader: Some(NodeId(1)),
            leader_epoch: LeaderEpoch(2),
            partition_epoch: PartitionEpoch(4),
            adding_replicas: Vec::new(),
            removing_replicas: Vec::new(),
            offline_replicas: Vec::new(),
        };
        let topic_id = uuid::Uuid::from_u128(7);
        let progress = Arc::new(event_listener::Event::new());
        let leader = ShardReplicas::new(NodeId(1), 30_000, || true, progress.clone());
        let follower = ShardReplicas::new(NodeId(2), 30_000, || true, progress);
        leader.apply_record(&tp, topic_id, &record, 2, &leader_log);
        follower.apply_record(&tp, topic_id, &record, 2, &follower_log);
        let end = leader_log.log_end_offset();
        let acked = leader.await_ack(&tp, end, &leader_log);
        assert!(acked.verdict.try_recv().is_err(), "the follower has nothing yet");

        let mut steps = Vec::new();
        for _ in 0..20 {
            let (to, position) = follower.fetch_position(&tp, &follower_log).expect("follows broker 1");
            assert_eq!(to, NodeId(1));
            // A small limit: the follower catches up over several fetches.
            let (reply, records) = block_on(leader.serve_fetch(&tp, &position, 700, &leader_log));
            if !records.is_empty() {
                // A damaged copy is refused whole and changes nothing.
                let mut damaged = records.to_vec();
                *damaged.last_mut().unwrap() ^= 1;
                let before = follower_log.log_end_offset();
                let refused = block_on(follower.apply_answer(&tp, &position, &reply, &damaged, &follower_log));
                assert!(matches!(refused, Err(StorageError::InvalidBatch(_))), "{refused:?}");
                assert_eq!(follower_log.log_end_offset(), before);
            }
            steps.push(block_on(follower.apply_answer(&tp, &position, &reply, &records, &follower_log)).unwrap());
            block_on(follower_log.flush()).unwrap();
            if follower.high_watermark(&tp, &follower_log) == end {
                break;
            }
        }
        assert_eq!(steps.iter().filter(|s| matches!(s, FollowerStep::Truncate(_))).count(), 1, "{steps:?}");
        assert!(steps.contains(&FollowerStep::Truncate(Offset(4))), "{steps:?}");
        assert_eq!(everything(&follower_log), everything(&leader_log));
        assert_eq!(follower_log.leader_epochs(), leader_log.leader_epochs());
        assert_eq!(leader.high_watermark(&tp, &leader_log), end);
        assert_eq!(follower.high_watermark(&tp, &follower_log), end);
        assert_eq!(acked.verdict.try_recv(), Ok(Ok(())));
    }

    #[test]
    fn a_follower_of_an_older_epoch_is_fenced_and_a_stranger_refused() {
        let fs = SimFs::new();
        let tp = TopicPartition::new("t", 0);
        let (_l, log) = open(&fs, "/leader");
        let record = PartitionRecord {
            replicas: vec![NodeId(1), NodeId(2)],
            isr: vec![NodeId(1), NodeId(2)],
            leader: Some(NodeId(1)),
            leader_epoch: LeaderEpoch(3),
            partition_epoch: PartitionEpoch(0),
            adding_replicas: Vec::new(),
            removing_replicas: Vec::new(),
            offline_replicas: Vec::new(),
        };
        let leader = ShardReplicas::new(NodeId(1), 30_000, || true, Arc::default());
        leader.apply_record(&tp, uuid::Uuid::from_u128(1), &record, 1, &log);
        let position = |replica, epoch| FetchPosition {
            replica: NodeId(replica),
            leader_epoch: LeaderEpoch(epoch),
            offset: Offset::ZERO,
            last_epoch: None,
            stable_end: Offset::ZERO,
        };
        let fetch = |p| block_on(leader.serve_fetch(&tp, &p, 1024, &log)).0;
        assert_eq!(fetch(position(2, 2)), FetchReply::Refused(ReplicaError::FencedLeaderEpoch));
        assert_eq!(fetch(position(2, 4)), FetchReply::Refused(ReplicaError::UnknownLeaderEpoch));
        assert_eq!(fetch(position(9, 3)), FetchReply::Refused(ReplicaError::NotLeaderOrFollower));
        assert!(matches!(fetch(position(2, 3)), FetchReply::Records { .. }));
    }

    #[test]
    fn verification_guards_go_when_leadership_moves_and_stay_while_it_does_not() {
        let fs = SimFs::new();
        let tp = TopicPartition::new("t", 0);
        let (_l, log) = open(&fs, "/leader");
        let record = |leader: u32, epoch: i32, partition_epoch: i32, isr: Vec<NodeId>| PartitionRecord {
            replicas: vec![NodeId(1), NodeId(2)],
            isr,
            leader: Some(NodeId(leader)),
            leader_epoch: LeaderEpoch(epoch),
            partition_epoch: PartitionEpoch(partition_epoch),
            adding_replicas: Vec::new(),
            removing_replicas: Vec::new(),
            offline_replicas: Vec::new(),
        };
        let replicas = ShardReplicas::new(NodeId(1), 30_000, || true, Arc::default());
        replicas.apply_record(&tp, uuid::Uuid::from_u128(1), &record(1, 3, 0, vec![NodeId(1), NodeId(2)]), 1, &log);
        let guard = log.begin_verification(7, 0).expect("no transaction open");
        // The ISR shrinks: still led here at the same epoch, the guard stays.
        replicas.apply_record(&tp, uuid::Uuid::from_u128(1), &record(1, 3, 1, vec![NodeId(1)]), 1, &log);
        assert_eq!(replicas.parts.borrow()[&tp].isr, vec![NodeId(1)], "the record was applied");
        assert_eq!(log.producer_states().verification_guard(7), Some(guard));
        // Broker 2 leads now: the guard goes, and its append could not present it.
        replicas.apply_record(&tp, uuid::Uuid::from_u128(1), &record(2, 4, 2, vec![NodeId(1), NodeId(2)]), 1, &log);
        assert_eq!(log.producer_states().verification_guard(7), None);
        // Led here again, at a new epoch: a guard handed out at the old one is gone too.
        let stale = log.begin_verification(7, 0).unwrap();
        replicas.apply_record(&tp, uuid::Uuid::from_u128(1), &record(1, 5, 3, vec![NodeId(1), NodeId(2)]), 1, &log);
        assert_eq!(log.producer_states().verification_guard(7), None);
        assert_ne!(log.begin_verification(7, 0), Some(stale));
    }
}
