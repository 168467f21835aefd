//! The shard's side of replication: one [`Replica`] state machine per partition the shard hosts, driven by
//! the partition's record from the metadata, the log's progress and the broker's quorum session. Produce
//! asks it whether this shard may append and waits on it for acks=all; fetch and ListOffsets ask it for the
//! high watermark, which it also records in the log for the checkpoint.
//!
//! All of it runs on the shard's thread, between awaits: the state machine is never held across one.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;

use kafka_protocol::ResponseError;
use shardlog_storage::fs::dma::DmaFs;
use shardlog_storage::{Clock, FlushPolicy, LeaderEpoch, Offset, PartitionLog, SystemClock, TopicPartition};

use crate::quorum::state::{NodeId, PartitionRecord};
use crate::replication::{LogView, Replica, ReplicaError, ReplicaSettings};

/// A partition log as the replica state machine reads it.
struct View<'a>(&'a PartitionLog<DmaFs>);

impl LogView for View<'_> {
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
    fn epoch_end(&self, epoch: LeaderEpoch) -> Option<(LeaderEpoch, Offset)> {
        self.0.end_offset_for_epoch(epoch)
    }
}

/// What this replica counts as its copy: what is on disk, or, under Kafka's interval flush, what is written.
pub fn stable_end(log: &PartitionLog<DmaFs>) -> Offset {
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
    replica: Replica,
    /// acks=all waits by token.
    waiters: HashMap<u64, flume::Sender<Result<(), ReplicaError>>>,
}

/// The replicas of one shard's partitions.
pub struct ShardReplicas {
    me: NodeId,
    in_session: Box<dyn Fn() -> bool>,
    parts: RefCell<HashMap<TopicPartition, Part>>,
    next_token: Cell<u64>,
}

impl std::fmt::Debug for ShardReplicas {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardReplicas").field("me", &self.me).finish_non_exhaustive()
    }
}

impl ShardReplicas {
    /// `in_session`: whether the broker's quorum session is alive right now.
    pub fn new(me: NodeId, in_session: impl Fn() -> bool + 'static) -> ShardReplicas {
        ShardReplicas {
            me,
            in_session: Box::new(in_session),
            parts: RefCell::new(HashMap::new()),
            next_token: Cell::new(0),
        }
    }

    /// The partition's record as the metadata now has it, and the topic's `min.insync.replicas`.
    pub fn apply_record(
        &self,
        tp: &TopicPartition,
        topic_id: uuid::Uuid,
        record: &PartitionRecord,
        min_insync_replicas: u16,
        log: &PartitionLog<DmaFs>,
    ) {
        if self.parts.borrow().get(tp).is_some_and(|part| part.topic_id != topic_id) {
            self.remove(tp);
        }
        let mut parts = self.parts.borrow_mut();
        let view = View(log);
        let settings =
            ReplicaSettings { min_insync_replicas: min_insync_replicas as usize, ..ReplicaSettings::default() };
        let part = parts.entry(tp.clone()).or_insert_with(|| Part {
            topic_id,
            replica: Replica::new(self.me, settings, log.high_watermark().min(log.log_end_offset())),
            waiters: HashMap::new(),
        });
        if part.replica.settings() != settings {
            part.replica.set_settings(settings, &view);
        }
        let was = (part.replica.leading(), part.replica.following());
        part.replica.apply_record(record, SystemClock.now_ms(), &view);
        let now = (part.replica.leading(), part.replica.following());
        if was != now {
            match now {
                (Some(epoch), _) => tracing::info!(partition = %tp, %epoch, isr = ?record.isr, "leading partition"),
                (_, Some((leader, epoch))) => tracing::info!(partition = %tp, %epoch, ?leader, "following partition"),
                _ => tracing::debug!(partition = %tp, "neither leading nor following"),
            }
        }
        Self::settle(part, log);
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
    pub fn await_ack(&self, tp: &TopicPartition, end: Offset, log: &PartitionLog<DmaFs>) -> AckWait {
        let (tx, rx) = flume::bounded(1);
        let token = self.next_token.get();
        self.next_token.set(token + 1);
        let mut parts = self.parts.borrow_mut();
        match parts.get_mut(tp) {
            Some(part) => {
                part.waiters.insert(token, tx);
                part.replica.await_ack(token, end, &View(log));
                Self::settle(part, log);
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
    pub fn log_moved(&self, tp: &TopicPartition, log: &PartitionLog<DmaFs>) {
        let mut parts = self.parts.borrow_mut();
        if let Some(part) = parts.get_mut(tp) {
            part.replica.set_session((self.in_session)());
            part.replica.stable_end_moved(&View(log));
            Self::settle(part, log);
        }
    }

    /// The offset consumers may read up to: the replica's high watermark, brought up to date first. A
    /// partition without a record yet (the metadata has not reached this shard) shows its checkpointed HW.
    pub fn high_watermark(&self, tp: &TopicPartition, log: &PartitionLog<DmaFs>) -> Offset {
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

    /// Hands out the verdicts of finished waits and records the HW in the log for the checkpoint.
    fn settle(part: &mut Part, log: &PartitionLog<DmaFs>) {
        for (token, outcome) in part.replica.take_acks() {
            if let Some(waiter) = part.waiters.remove(&token) {
                let _ = waiter.send(outcome);
            }
        }
        let hw = part.replica.high_watermark().min(log.log_end_offset());
        if hw != log.high_watermark() {
            log.set_high_watermark(hw);
        }
    }
}
