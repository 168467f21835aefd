//! The transaction coordinator's state machine (KIP-98): what it decides for each `transactional.id`,
//! without I/O and without a clock.
//!
//! A [`TxnCoordinator`] owns the ids of one partition of `__transaction_state` while this broker leads that
//! partition. It is driven from outside (a coordinator runtime in the broker, a seeded simulator in the
//! tests): it is handed the records of its partition to rebuild from, the clients' requests, the outcome
//! of each write it asked for, the partition leaders' acknowledgement of markers, and the time in
//! milliseconds. It answers with [`Effect`]s: records to write, answers to release, markers to send.
//!
//! The rules (Kafka's, `transaction.version` 1):
//! - Every change to an id is two-phase. The coordinator prepares the transition (see
//!   [`metadata::TxnMetadata::prepare`]), asks for it to be written ([`Effect::Write`]), and applies it
//!   only when [`TxnCoordinator::write_committed`] reports the record committed; a failed write reverts
//!   it. One transition per id is in flight; anything else on that id meanwhile is answered
//!   CONCURRENT_TRANSACTIONS. A request whose answer depends on a write is answered after the write
//!   commits, never before: EndTxn's answer means "the outcome is durable".
//! - InitProducerId gives a new id a producer id from the [`ProducerIdSource`] and epoch 0; a known id
//!   keeps its producer id and gets the next epoch, which fences every older instance (their requests are
//!   answered PRODUCER_FENCED). If the old instance left a transaction open, it is aborted first under the
//!   bumped epoch (PrepareEpochFence, then PrepareAbort) and the new instance is told
//!   CONCURRENT_TRANSACTIONS until the abort is complete. A request that names the producer id and epoch it
//!   expects (KIP-360) bumps only if they are current; a retry of a bump that already happened gets the
//!   same answer. An epoch at [`metadata::EXHAUSTED_EPOCH`] cannot be bumped: the id gets a new producer
//!   id at epoch 0.
//! - AddPartitionsToTxn (and AddOffsetsToTxn, which adds the group's `__consumer_offsets` partition)
//!   moves an idle id to Ongoing and starts its timer; partitions already in an Ongoing transaction are
//!   accepted without a write. Before it accepts transactional data, a partition leader asks
//!   [`TxnCoordinator::verify_partition`] (KIP-890, part one), so no data lands in a partition the
//!   transaction will not send a marker to.
//! - EndTxn writes PrepareCommit or PrepareAbort; once it is durable the client is answered and markers are
//!   requested for exactly the transaction's partitions. When every marker is written
//!   ([`TxnCoordinator::markers_written`]), CompleteCommit or CompleteAbort is written and the id is ready
//!   for its next transaction. EndTxn repeated with the same outcome is answered CONCURRENT_TRANSACTIONS
//!   while the markers are being written and success after; the other outcome is INVALID_TXN_STATE.
//! - [`TxnCoordinator::tick`]: a transaction open longer than its timeout is aborted by the coordinator
//!   under a bumped epoch (the producer is fenced, as in Kafka); an idle id not used for
//!   `transactional.id.expiration.ms` is expired with a tombstone; a Complete record whose write failed is
//!   written again.
//! - On becoming coordinator ([`TxnCoordinator::finish_loading`]) the state is the last record of each id;
//!   transactions found in PrepareCommit/PrepareAbort get their markers sent again and are completed;
//!   Ongoing ones keep their start time, so their timeout still runs.
//!
//! What it must never do: answer EndTxn before its Prepare record committed, send a marker to a partition
//! that is not in the transaction, or let an older epoch of a producer change a transaction.

pub mod batches;
pub mod call;
pub mod metadata;
pub mod partition;
pub mod record;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::ResponseError;
use shardlog_storage::TopicPartition;

pub use metadata::{NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TxnMetadata, TxnSnapshot, TxnState};
pub use partition::transaction_partition;
pub use record::{RecordError, TxnLogRecord};

/// The internal topic the coordinator keeps its records in.
pub const TRANSACTION_STATE_TOPIC: &str = "__transaction_state";
/// The topic whose partitions AddOffsetsToTxn adds.
pub const CONSUMER_OFFSETS_TOPIC: &str = "__consumer_offsets";

/// The settings of the transaction coordinator, with Kafka's names and defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnSettings {
    /// `transaction.max.timeout.ms`: the longest `transaction.timeout.ms` a producer may ask for.
    pub transaction_max_timeout_ms: i32,
    /// `transactional.id.expiration.ms`: how long an idle id is kept.
    pub transactional_id_expiration_ms: i64,
}

impl Default for TxnSettings {
    fn default() -> Self {
        TxnSettings { transaction_max_timeout_ms: 900_000, transactional_id_expiration_ms: 7 * 24 * 3_600_000 }
    }
}

/// Where new producer ids come from (the quorum's blocks, in the broker).
pub trait ProducerIdSource {
    /// An id no producer ever had; `None` when none can be had now (the client is told to retry).
    fn next_producer_id(&mut self) -> Option<i64>;
}

/// The caller's name for a request, handed back with its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RequestToken(pub u64);

/// The coordinator's name for a write it asked for; the caller reports its outcome under this name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct WriteId(pub u64);

/// A producer as a request names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProducerIdAndEpoch {
    pub producer_id: i64,
    pub epoch: i16,
}

/// How a transaction ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TxnResult {
    Commit,
    Abort,
}

impl TxnResult {
    fn prepare_state(self) -> TxnState {
        match self {
            TxnResult::Commit => TxnState::PrepareCommit,
            TxnResult::Abort => TxnState::PrepareAbort,
        }
    }
    fn complete_state(self) -> TxnState {
        match self {
            TxnResult::Commit => TxnState::CompleteCommit,
            TxnResult::Abort => TxnState::CompleteAbort,
        }
    }
}

/// InitProducerId with a transactional id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitProducerId {
    pub transactional_id: String,
    /// The producer's `transaction.timeout.ms`.
    pub txn_timeout_ms: i32,
    /// KIP-360: the producer id and epoch the producer has, when it asks for a bump after an error.
    pub expected: Option<ProducerIdAndEpoch>,
}

/// A successful answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reply {
    Done,
    ProducerId(ProducerIdAndEpoch),
}

/// The markers of a decided transaction, for the leaders of its partitions (WriteTxnMarkers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnMarkers {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub result: TxnResult,
    pub partitions: Vec<TopicPartition>,
    /// The epoch of this coordinator's leadership of its `__transaction_state` partition.
    pub coordinator_epoch: i32,
}

/// What the caller must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Append `record` to the coordinator's `__transaction_state` partition and report the outcome with
    /// [`TxnCoordinator::write_committed`] or [`TxnCoordinator::write_failed`].
    Write { write: WriteId, record: TxnLogRecord },
    /// Answer the request.
    Answer { request: RequestToken, reply: Result<Reply, ResponseError> },
    /// Write these markers (retrying until each leader has it), then report
    /// [`TxnCoordinator::markers_written`].
    SendMarkers(TxnMarkers),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Loading,
    Active,
    Resigned,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ReplyKind {
    Done,
    ProducerId,
}

#[derive(Debug)]
struct InFlight {
    transactional_id: String,
    answer: Option<(RequestToken, ReplyKind)>,
}

/// A write's error as a transactional request answers it (Kafka's mapping of append errors).
pub fn write_error(e: ResponseError) -> ResponseError {
    match e {
        ResponseError::UnknownTopicOrPartition
        | ResponseError::NotEnoughReplicas
        | ResponseError::NotEnoughReplicasAfterAppend
        | ResponseError::RequestTimedOut => ResponseError::CoordinatorNotAvailable,
        // A deposed leader's write (the coordinator appends at its leader epoch).
        ResponseError::NotLeaderOrFollower | ResponseError::FencedLeaderEpoch | ResponseError::KafkaStorageError => {
            ResponseError::NotCoordinator
        }
        ResponseError::MessageTooLarge | ResponseError::RecordListTooLarge => ResponseError::UnknownServerError,
        other => other,
    }
}

/// The coordinator of the transactional ids of one `__transaction_state` partition.
#[derive(Debug)]
pub struct TxnCoordinator {
    settings: TxnSettings,
    coordinator_epoch: i32,
    status: Status,
    txns: BTreeMap<String, TxnMetadata>,
    in_flight: BTreeMap<WriteId, InFlight>,
    next_write: u64,
}

fn answer(request: RequestToken, reply: Result<Reply, ResponseError>) -> Vec<Effect> {
    vec![Effect::Answer { request, reply }]
}

impl TxnCoordinator {
    /// A coordinator that has just become leader of its partition (at `coordinator_epoch`) and is reading
    /// it: requests are answered COORDINATOR_LOAD_IN_PROGRESS until [`TxnCoordinator::finish_loading`].
    pub fn loading(settings: TxnSettings, coordinator_epoch: i32) -> Self {
        TxnCoordinator {
            settings,
            coordinator_epoch,
            status: Status::Loading,
            txns: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            next_write: 0,
        }
    }

    /// One record of the partition, in log order: the last record of an id wins, a tombstone forgets it.
    pub fn replay(&mut self, record: TxnLogRecord) {
        assert_eq!(self.status, Status::Loading, "records are replayed only while loading");
        match record.value {
            Some(snapshot) if snapshot.state != TxnState::Dead => {
                let id = record.transactional_id.clone();
                self.txns.insert(id, TxnMetadata::from_snapshot(record.transactional_id, snapshot));
            }
            _ => {
                self.txns.remove(&record.transactional_id);
            }
        }
    }

    /// The partition is read: the coordinator serves requests, and sends again the markers of every
    /// transaction whose outcome was decided but not completed.
    pub fn finish_loading(&mut self) -> Vec<Effect> {
        assert_eq!(self.status, Status::Loading);
        self.status = Status::Active;
        let prepared: Vec<String> =
            self.txns.values().filter(|m| m.state().is_prepare()).map(|m| m.transactional_id.clone()).collect();
        prepared.iter().map(|id| Effect::SendMarkers(self.markers(id))).collect()
    }

    /// This broker no longer leads the partition: every request waiting on a write is answered
    /// NOT_COORDINATOR, and all state is dropped (the next leader rebuilds it from the log).
    pub fn resign(&mut self) -> Vec<Effect> {
        self.status = Status::Resigned;
        self.txns.clear();
        std::mem::take(&mut self.in_flight)
            .into_values()
            .filter_map(|f| f.answer)
            .map(|(request, _)| Effect::Answer { request, reply: Err(ResponseError::NotCoordinator) })
            .collect()
    }

    pub fn coordinator_epoch(&self) -> i32 {
        self.coordinator_epoch
    }

    pub fn settings(&self) -> &TxnSettings {
        &self.settings
    }

    pub fn metadata(&self, transactional_id: &str) -> Option<&TxnMetadata> {
        self.txns.get(transactional_id)
    }

    pub fn transactions(&self) -> impl Iterator<Item = &TxnMetadata> {
        self.txns.values()
    }

    fn check_active(&self) -> Result<(), ResponseError> {
        match self.status {
            Status::Loading => Err(ResponseError::CoordinatorLoadInProgress),
            Status::Active => Ok(()),
            Status::Resigned => Err(ResponseError::NotCoordinator),
        }
    }

    /// InitProducerId for a transactional id (see the module's rules).
    pub fn init_producer_id(
        &mut self,
        request: RequestToken,
        req: &InitProducerId,
        now_ms: i64,
        ids: &mut dyn ProducerIdSource,
    ) -> Vec<Effect> {
        if let Err(e) = self.check_active() {
            return answer(request, Err(e));
        }
        if req.txn_timeout_ms <= 0 || req.txn_timeout_ms > self.settings.transaction_max_timeout_ms {
            return answer(request, Err(ResponseError::InvalidTransactionTimeout));
        }
        if !self.txns.contains_key(&req.transactional_id) {
            let Some(producer_id) = ids.next_producer_id() else {
                return answer(request, Err(ResponseError::CoordinatorLoadInProgress));
            };
            let meta = TxnMetadata::new(req.transactional_id.clone(), producer_id, req.txn_timeout_ms, now_ms);
            self.txns.insert(req.transactional_id.clone(), meta);
        }
        let meta = self.txns.get_mut(&req.transactional_id).expect("known or just added");
        if meta.pending.is_some() {
            return answer(request, Err(ResponseError::ConcurrentTransactions));
        }
        if req.expected.is_some_and(|expected| !expected_is_valid(&meta.current, expected)) {
            return answer(request, Err(ResponseError::ProducerFenced));
        }
        let current = &meta.current;
        let target = match current.state {
            TxnState::Ongoing => {
                // The previous instance left a transaction open: abort it under a bumped epoch, which fences
                // that instance; this producer retries until the abort is complete.
                let target = fence_abort(current, now_ms);
                meta.prepare_fence(target);
                let write = self.write(&req.transactional_id, None);
                return vec![write, Effect::Answer { request, reply: Err(ResponseError::ConcurrentTransactions) }];
            }
            state if state.is_idle() => {
                if metadata::epoch_exhausted(current.producer_epoch) {
                    let Some(producer_id) = ids.next_producer_id() else {
                        return answer(request, Err(ResponseError::CoordinatorLoadInProgress));
                    };
                    TxnSnapshot {
                        producer_id,
                        last_producer_id: current.producer_id,
                        producer_epoch: 0,
                        last_producer_epoch: if req.expected.is_some() {
                            current.producer_epoch
                        } else {
                            NO_PRODUCER_EPOCH
                        },
                        ..idle_target(current, req.txn_timeout_ms, now_ms)
                    }
                } else {
                    let Some((epoch, last_epoch)) = bumped_epoch(current, req.expected.map(|e| e.epoch)) else {
                        return answer(request, Err(ResponseError::ProducerFenced));
                    };
                    TxnSnapshot {
                        producer_epoch: epoch,
                        last_producer_epoch: last_epoch,
                        ..idle_target(current, req.txn_timeout_ms, now_ms)
                    }
                }
            }
            // PrepareCommit/PrepareAbort: the markers are being written; PrepareEpochFence and Dead only exist
            // while a write is pending (answered above).
            _ => return answer(request, Err(ResponseError::ConcurrentTransactions)),
        };
        meta.prepare(target);
        vec![self.write(&req.transactional_id, Some((request, ReplyKind::ProducerId)))]
    }

    /// The metadata of `transactional_id`, if this coordinator is active and `producer` is the id's current
    /// producer id and epoch.
    fn producer_txn(
        &mut self,
        transactional_id: &str,
        producer: ProducerIdAndEpoch,
    ) -> Result<&mut TxnMetadata, ResponseError> {
        self.check_active()?;
        let meta = self.txns.get_mut(transactional_id).ok_or(ResponseError::InvalidProducerIdMapping)?;
        check_producer(meta, producer)?;
        Ok(meta)
    }

    /// AddPartitionsToTxn v0-3: adds `partitions` to the producer's transaction, starting one if none is
    /// open.
    pub fn add_partitions(
        &mut self,
        request: RequestToken,
        transactional_id: &str,
        producer: ProducerIdAndEpoch,
        partitions: &[TopicPartition],
        now_ms: i64,
    ) -> Vec<Effect> {
        let meta = match self.producer_txn(transactional_id, producer) {
            Ok(meta) => meta,
            Err(e) => return answer(request, Err(e)),
        };
        if meta.pending.is_some() || meta.state().is_prepare() {
            return answer(request, Err(ResponseError::ConcurrentTransactions));
        }
        let current = &meta.current;
        let state = current.state;
        if state == TxnState::Ongoing && partitions.iter().all(|tp| current.partitions.contains(tp)) {
            return answer(request, Ok(Reply::Done));
        }
        assert!(state == TxnState::Ongoing || state.is_idle(), "{transactional_id}: unexpected {state:?}");
        let mut target = current.clone();
        target.state = TxnState::Ongoing;
        target.partitions.extend(partitions.iter().cloned());
        if state != TxnState::Ongoing {
            target.txn_start_ms = now_ms;
        }
        target.txn_last_update_ms = now_ms;
        meta.prepare(target);
        vec![self.write(transactional_id, Some((request, ReplyKind::Done)))]
    }

    /// AddOffsetsToTxn: adds partition `offsets_partition` of `__consumer_offsets` (the group's, which the
    /// caller computes) to the transaction.
    pub fn add_offsets(
        &mut self,
        request: RequestToken,
        transactional_id: &str,
        producer: ProducerIdAndEpoch,
        offsets_partition: u32,
        now_ms: i64,
    ) -> Vec<Effect> {
        let tp = TopicPartition::new(CONSUMER_OFFSETS_TOPIC, offsets_partition);
        self.add_partitions(request, transactional_id, producer, &[tp], now_ms)
    }

    /// KIP-890 part 1, the partition leader's check before it takes transactional data: is `partition` in
    /// the open transaction of this producer id and epoch? Answers from durable state only.
    pub fn verify_partition(
        &self,
        transactional_id: &str,
        producer: ProducerIdAndEpoch,
        partition: &TopicPartition,
    ) -> Result<(), ResponseError> {
        self.check_active()?;
        let meta = self.txns.get(transactional_id).ok_or(ResponseError::InvalidProducerIdMapping)?;
        check_producer(meta, producer)?;
        let decided =
            matches!(meta.pending_state(), Some(TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::Dead));
        if meta.state() != TxnState::Ongoing || decided || !meta.current.partitions.contains(partition) {
            return Err(ResponseError::InvalidTxnState);
        }
        Ok(())
    }

    /// EndTxn from the producer: commit or abort its transaction.
    pub fn end_txn(
        &mut self,
        request: RequestToken,
        transactional_id: &str,
        producer: ProducerIdAndEpoch,
        result: TxnResult,
        now_ms: i64,
    ) -> Vec<Effect> {
        let meta = match self.producer_txn(transactional_id, producer) {
            Ok(meta) => meta,
            Err(e) => return answer(request, Err(e)),
        };
        if meta.pending.is_some() {
            return answer(request, Err(ResponseError::ConcurrentTransactions));
        }
        let reply = match (meta.state(), result) {
            (TxnState::Ongoing, _) => {
                let mut target = meta.current.clone();
                target.state = result.prepare_state();
                target.txn_last_update_ms = now_ms;
                meta.prepare(target);
                return vec![self.write(transactional_id, Some((request, ReplyKind::Done)))];
            }
            (TxnState::CompleteCommit, TxnResult::Commit) | (TxnState::CompleteAbort, TxnResult::Abort) => {
                Ok(Reply::Done)
            }
            (TxnState::PrepareCommit, TxnResult::Commit) | (TxnState::PrepareAbort, TxnResult::Abort) => {
                Err(ResponseError::ConcurrentTransactions)
            }
            _ => Err(ResponseError::InvalidTxnState),
        };
        answer(request, reply)
    }

    /// Every marker of the transaction's decided outcome is written: write its Complete record. A report
    /// that does not match the transaction now prepared (a late one, from before a fence) is ignored.
    pub fn markers_written(
        &mut self,
        transactional_id: &str,
        producer: ProducerIdAndEpoch,
        result: TxnResult,
        now_ms: i64,
    ) -> Vec<Effect> {
        if self.status != Status::Active {
            return Vec::new();
        }
        let Some(meta) = self.txns.get_mut(transactional_id) else { return Vec::new() };
        let current = &meta.current;
        if current.state != result.prepare_state()
            || current.producer_id != producer.producer_id
            || current.producer_epoch != producer.epoch
        {
            return Vec::new();
        }
        meta.markers_done = true;
        if meta.pending.is_some() {
            return Vec::new();
        }
        vec![self.complete(transactional_id, now_ms)]
    }

    /// The write `write` committed: apply its transition, release its answer, and request the markers of
    /// a transaction that has just been decided.
    pub fn write_committed(&mut self, write: WriteId, _now_ms: i64) -> Vec<Effect> {
        let Some(flight) = self.in_flight.remove(&write) else { return Vec::new() };
        let meta = self.txns.get_mut(&flight.transactional_id).expect("an id with a write in flight is known");
        meta.apply_pending();
        let mut effects = Vec::new();
        if let Some((request, kind)) = flight.answer {
            let reply = match kind {
                ReplyKind::Done => Reply::Done,
                ReplyKind::ProducerId => Reply::ProducerId(ProducerIdAndEpoch {
                    producer_id: meta.current.producer_id,
                    epoch: meta.current.producer_epoch,
                }),
            };
            effects.push(Effect::Answer { request, reply: Ok(reply) });
        }
        match meta.state() {
            TxnState::Dead => {
                self.txns.remove(&flight.transactional_id);
            }
            state if state.is_prepare() => effects.push(Effect::SendMarkers(self.markers(&flight.transactional_id))),
            _ => {}
        }
        effects
    }

    /// The write `write` failed with `error`: its transition is forgotten, and its request (if any) is
    /// answered with the error a client should see.
    pub fn write_failed(&mut self, write: WriteId, error: ResponseError) -> Vec<Effect> {
        let Some(flight) = self.in_flight.remove(&write) else { return Vec::new() };
        let meta = self.txns.get_mut(&flight.transactional_id).expect("an id with a write in flight is known");
        meta.revert_pending();
        flight
            .answer
            .map(|(request, _)| Effect::Answer { request, reply: Err(write_error(error)) })
            .into_iter()
            .collect()
    }

    /// The coordinator's timers at `now_ms`: aborts timed-out transactions, expires idle ids, and writes
    /// again a Complete record whose earlier write failed.
    pub fn tick(&mut self, now_ms: i64) -> Vec<Effect> {
        if self.status != Status::Active {
            return Vec::new();
        }
        let expiration_ms = self.settings.transactional_id_expiration_ms;
        let mut effects = Vec::new();
        let ids: Vec<String> = self.txns.keys().cloned().collect();
        for id in ids {
            let meta = self.txns.get_mut(&id).expect("listed");
            if meta.pending.is_some() {
                continue;
            }
            let current = &meta.current;
            if current.state == TxnState::Ongoing
                && current.txn_start_ms.saturating_add(i64::from(current.txn_timeout_ms)) < now_ms
            {
                let target = fence_abort(current, now_ms);
                meta.prepare_fence(target);
                effects.push(self.write(&id, None));
            } else if current.state.is_prepare() && meta.markers_done {
                effects.push(self.complete(&id, now_ms));
            } else if current.state.is_idle() && current.txn_last_update_ms.saturating_add(expiration_ms) <= now_ms {
                let mut target = current.clone();
                target.state = TxnState::Dead;
                target.txn_last_update_ms = now_ms;
                meta.prepare(target);
                effects.push(self.write(&id, None));
            }
        }
        effects
    }

    fn complete(&mut self, transactional_id: &str, now_ms: i64) -> Effect {
        let meta = self.txns.get_mut(transactional_id).expect("known");
        let result = if meta.state() == TxnState::PrepareCommit { TxnResult::Commit } else { TxnResult::Abort };
        let mut target = meta.current.clone();
        target.state = result.complete_state();
        target.partitions.clear();
        target.txn_last_update_ms = now_ms;
        meta.prepare(target);
        self.write(transactional_id, None)
    }

    fn markers(&self, transactional_id: &str) -> TxnMarkers {
        let meta = &self.txns[transactional_id];
        let result = match meta.state() {
            TxnState::PrepareCommit => TxnResult::Commit,
            TxnState::PrepareAbort => TxnResult::Abort,
            other => panic!("{transactional_id}: markers asked for in {other:?}"),
        };
        TxnMarkers {
            transactional_id: transactional_id.to_string(),
            producer_id: meta.current.producer_id,
            producer_epoch: meta.current.producer_epoch,
            result,
            partitions: meta.current.partitions.iter().cloned().collect(),
            coordinator_epoch: self.coordinator_epoch,
        }
    }

    /// The write of `transactional_id`'s pending transition.
    fn write(&mut self, transactional_id: &str, answer: Option<(RequestToken, ReplyKind)>) -> Effect {
        let pending = self.txns[transactional_id].pending.clone().expect("a write has a pending transition");
        let write = WriteId(self.next_write);
        self.next_write += 1;
        self.in_flight.insert(write, InFlight { transactional_id: transactional_id.to_string(), answer });
        let value = (pending.state != TxnState::Dead).then_some(pending);
        Effect::Write { write, record: TxnLogRecord { transactional_id: transactional_id.to_string(), value } }
    }
}

/// The producer id and epoch a request names, against the id's: a producer id that is not the id's is
/// INVALID_PRODUCER_ID_MAPPING; an epoch that is not the current one (the one being fenced in, during a
/// PrepareEpochFence) is PRODUCER_FENCED.
fn check_producer(meta: &TxnMetadata, producer: ProducerIdAndEpoch) -> Result<(), ResponseError> {
    if meta.current.producer_id != producer.producer_id {
        return Err(ResponseError::InvalidProducerIdMapping);
    }
    let epoch = match (&meta.pending, meta.state()) {
        (Some(pending), TxnState::PrepareEpochFence) => pending.producer_epoch,
        _ => meta.current.producer_epoch,
    };
    if epoch != producer.epoch {
        return Err(ResponseError::ProducerFenced);
    }
    Ok(())
}

/// KIP-360: whether a producer that names `expected` may bump the id's epoch. It may if the id has no epoch
/// yet, if it names the current producer id (its epoch is checked by the bump), or if it names the
/// producer id before a rotation with the exhausted epoch that caused it (a retry of that rotation).
fn expected_is_valid(current: &TxnSnapshot, expected: ProducerIdAndEpoch) -> bool {
    current.producer_epoch == NO_PRODUCER_EPOCH
        || expected.producer_id == current.producer_id
        || (expected.producer_id == current.last_producer_id && metadata::epoch_exhausted(expected.epoch))
}

/// The epoch (and last epoch) an idle id moves to for a new producer session, or `None` if the producer
/// is fenced. Without an expected epoch, the epoch is simply bumped. With one, it is bumped if it names the
/// current epoch; if it names the epoch before the last bump, that bump is being retried and its result
/// is returned again.
fn bumped_epoch(current: &TxnSnapshot, expected_epoch: Option<i16>) -> Option<(i16, i16)> {
    let bumped = current.producer_epoch + 1;
    match expected_epoch {
        None => Some((bumped, NO_PRODUCER_EPOCH)),
        Some(e) if current.producer_epoch == NO_PRODUCER_EPOCH || e == current.producer_epoch => {
            Some((bumped, current.producer_epoch))
        }
        Some(e) if e == current.last_producer_epoch => Some((current.producer_epoch, current.last_producer_epoch)),
        Some(_) => None,
    }
}

/// An idle id's state for a new producer session: Empty, no partitions, no transaction start.
fn idle_target(current: &TxnSnapshot, txn_timeout_ms: i32, now_ms: i64) -> TxnSnapshot {
    TxnSnapshot {
        txn_timeout_ms,
        state: TxnState::Empty,
        partitions: BTreeSet::new(),
        txn_start_ms: -1,
        txn_last_update_ms: now_ms,
        ..current.clone()
    }
}

/// The coordinator's abort of an Ongoing transaction under the next epoch (the producer's, or a timeout's).
fn fence_abort(current: &TxnSnapshot, now_ms: i64) -> TxnSnapshot {
    assert!(current.producer_epoch < i16::MAX, "an Ongoing transaction never has the last epoch");
    TxnSnapshot {
        producer_epoch: current.producer_epoch + 1,
        last_producer_epoch: NO_PRODUCER_EPOCH,
        state: TxnState::PrepareAbort,
        txn_last_update_ms: now_ms,
        ..current.clone()
    }
}
