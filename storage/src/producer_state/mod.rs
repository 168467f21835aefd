//! Idempotent and transactional producers: what a partition remembers of each producer id, the rules a
//! batch or transaction marker from one must pass before it gets offsets, and (in [`snapshot`]) the file
//! that saves rebuilding it from the whole log.
//!
//! Kafka's rules (KIP-98, with KIP-360's epoch bumps and the "unknown producer" leniency of Kafka 2.5):
//! - A batch with producer id -1 is not idempotent and passes unchecked (unless it claims to be
//!   transactional, which needs a producer id).
//! - For each producer id the partition keeps its epoch and the sequence ranges and offsets of its last
//!   [`BATCHES_KEPT`] batches (a producer keeps at most five requests in flight per partition).
//! - A batch that repeats one of them (same epoch, same first and last sequence) is a retry: it is answered
//!   with the offsets the first copy got and is not appended again.
//! - Otherwise, at the same epoch, its first sequence must follow the last one kept (wrapping after
//!   `i32::MAX`; 0 when none is kept, after a marker bumped the epoch): a gap or an older sequence is
//!   OUT_OF_ORDER_SEQUENCE_NUMBER.
//! - An older epoch is INVALID_PRODUCER_EPOCH. A newer epoch (the client bumped it after a fatal sequence
//!   error) must start at sequence 0, and replaces what was kept for the old one.
//! - A producer id the partition knows nothing of (never seen, expired, or evicted) is accepted at any
//!   sequence.
//!
//! Transactions (the partition's side; see [`crate::txn`]):
//! - A transactional batch (attribute 0x10) passes the same rules; the first one after no open
//!   transaction opens one at its base offset. A non-transactional batch from a producer with an open
//!   transaction is INVALID_TXN_STATE.
//! - A COMMIT or ABORT marker (written by the log for the coordinator, never by a client) ends the open
//!   transaction, if there is one; a marker for a producer with none is still appended and changes
//!   nothing but the epochs below. A marker at an epoch older than the producer's is PRODUCER_FENCED; from
//!   a coordinator epoch older than the last one seen for that producer, TRANSACTION_COORDINATOR_FENCED. A
//!   marker at a newer epoch bumps the producer's epoch (the coordinator fenced it) and forgets its
//!   batches, so its next batch starts at sequence 0.
//! - A producer with an open transaction is never expired or evicted: forgetting it would let the last
//!   stable offset pass records whose fate is undecided.
//! - A client's transactional batch that would open a transaction is appended only under the
//!   verification guard its leader took before asking the coordinator, which any marker for the producer
//!   takes away ([`verification`], KIP-890).
//!
//! Everything here but the verification guards is derived from the batch headers in the log (and the
//! marker records), which carry producer id, epoch and sequences: replaying the log from any snapshot
//! rebuilds the same state. The guards are the leader's memory of verifications under way, never saved.
//! This module does no I/O; the log writes and reads the snapshots (`docs/storage-format.md` §9).

pub mod snapshot;
pub mod verification;

use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};

use crate::batch::BatchHeader;
use crate::txn::MarkerKind;
use crate::txn::marker::{CONTROL_BIT, TRANSACTIONAL_BIT};
use crate::types::Offset;

pub use crate::txn::TxnMarker;
pub use snapshot::{SNAPSHOT_MAGIC, SNAPSHOT_SUFFIX, SNAPSHOT_VERSION};
pub use verification::{MAX_GUARDS_PER_PARTITION, VerificationGuard};

/// Batches remembered per producer id (Kafka's `max.in.flight.requests.per.connection` limit for
/// idempotence).
pub const BATCHES_KEPT: usize = 5;
/// Producer ids one partition remembers at most. A client can write batches under any producer id it makes
/// up; past this many, those whose last batch is oldest are forgotten (a forgotten producer is accepted at
/// any sequence, as an expired one is).
pub const MAX_PRODUCERS_PER_PARTITION: usize = 100_000;
/// How many producer ids all the partitions of one owner (a shard) remember together, and how many they
/// may. Past the bound, a batch from a producer id its partition does not know is still appended, but not
/// remembered (as if it had expired): memory stays bounded however many producer ids clients make up.
#[derive(Debug)]
pub struct ProducerBudget {
    used: Cell<usize>,
    max: usize,
}

impl ProducerBudget {
    pub fn new(max: usize) -> ProducerBudget {
        ProducerBudget { used: Cell::new(0), max }
    }

    pub fn unlimited() -> ProducerBudget {
        ProducerBudget::new(usize::MAX)
    }

    pub fn used(&self) -> usize {
        self.used.get()
    }

    pub fn has_room(&self) -> bool {
        self.used.get() < self.max
    }

    /// Accounts a change of one partition's count from `before` to `after`.
    pub fn adjust(&self, before: usize, after: usize) {
        self.used.set((self.used.get() + after).saturating_sub(before));
    }
}

/// Kafka's default `producer.id.expiration.ms`: one day.
pub const DEFAULT_PRODUCER_ID_EXPIRATION_MS: i64 = 86_400_000;

/// The coordinator epoch of a producer no marker was seen for.
pub const NO_COORDINATOR_EPOCH: i32 = -1;

/// A batch a producer wrote: its sequence range and the offsets it got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerBatch {
    pub first_seq: i32,
    pub last_seq: i32,
    pub base_offset: Offset,
    pub last_offset: Offset,
}

/// What a partition knows of one producer id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerEntry {
    pub epoch: i16,
    /// Oldest first, at most [`BATCHES_KEPT`]; empty only when the producer is known by markers alone (or
    /// a marker bumped its epoch since its last batch).
    pub batches: VecDeque<ProducerBatch>,
    /// The broker's clock when its last batch was appended, or when the state was rebuilt from batches
    /// replayed from the log (whose append times the log does not keep): what expiration measures from.
    /// Kafka measures from the batch's own timestamp instead, which expires at once a producer that
    /// writes records with old timestamps, and with it the protection against its retries.
    pub last_append_ms: i64,
    /// The first offset of its open transaction, if it has one.
    pub txn_first_offset: Option<Offset>,
    /// The coordinator epoch of the last marker written for it ([`NO_COORDINATOR_EPOCH`] if none).
    pub coordinator_epoch: i32,
}

impl ProducerEntry {
    /// The last sequence of its latest batch; -1 when none is kept (known by markers alone).
    pub fn last_sequence(&self) -> i32 {
        self.batches.back().map_or(-1, |b| b.last_seq)
    }
}

/// How a batch that passed the rules goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Append it.
    Append,
    /// A retry of a batch already in the log: answer with these offsets, append nothing.
    Duplicate(ProducerBatch),
}

/// A transaction a marker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletedTxn {
    pub producer_id: i64,
    pub kind: MarkerKind,
    pub first_offset: Offset,
    /// The marker's offset.
    pub last_offset: Offset,
    /// The first offset of the earliest transaction still open after this one ended, or the marker's
    /// offset + 1 if none is (what the aborted-transactions index records).
    pub last_stable_offset: Offset,
}

/// Why a batch or marker was refused. Each maps to a Kafka error code at the broker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProducerError {
    /// Kafka's OUT_OF_ORDER_SEQUENCE_NUMBER.
    #[error("producer {producer_id} epoch {epoch}: sequence {first_seq} does not follow {last_seq}")]
    OutOfOrderSequence { producer_id: i64, epoch: i16, first_seq: i32, last_seq: i32 },
    /// Kafka's INVALID_PRODUCER_EPOCH: a batch (transactional or not) at an epoch older than the
    /// producer's current one.
    #[error("producer {producer_id}: epoch {epoch} is older than the current {current}")]
    StaleEpoch { producer_id: i64, epoch: i16, current: i16 },
    /// Kafka's CORRUPT_MESSAGE / INVALID_RECORD: producer fields no producer sends, or a client's control
    /// batch.
    #[error("invalid idempotent batch: {0}")]
    InvalidBatch(String),
    /// Kafka's INVALID_TXN_STATE: a non-transactional batch from a producer whose transaction is open.
    #[error("producer {producer_id}: non-transactional batch while its transaction from {txn_first_offset} is open")]
    NotTransactional { producer_id: i64, txn_first_offset: Offset },
    /// Kafka's INVALID_PRODUCER_EPOCH (what its leaders answer WriteTxnMarkers since KIP-588): a
    /// transaction marker at an epoch older than the producer's current one.
    #[error("marker for producer {producer_id}: epoch {epoch} is older than the current {current}")]
    StaleMarkerEpoch { producer_id: i64, epoch: i16, current: i16 },
    /// Kafka's TRANSACTION_COORDINATOR_FENCED: a marker from a coordinator epoch older than the last one
    /// this partition saw for the producer.
    #[error("marker for producer {producer_id}: coordinator epoch {coordinator_epoch} is older than {current}")]
    CoordinatorFenced { producer_id: i64, coordinator_epoch: i32, current: i32 },
    /// A transactional batch that would open a transaction without the verification guard its producer
    /// holds here (see [`verification`]): never verified, or verified before a marker for the producer
    /// came. Retriable: the retry is verified afresh.
    #[error("producer {producer_id} epoch {epoch}: transactional batch not verified since the producer's last marker")]
    Unverified { producer_id: i64, epoch: i16 },
}

/// The last sequence of a batch starting at `first` with `last_offset_delta`, wrapping after `i32::MAX`
/// as producers do.
pub fn last_sequence(first: i32, last_offset_delta: i32) -> i32 {
    let last = first as i64 + last_offset_delta as i64;
    if last > i32::MAX as i64 { (last - i32::MAX as i64 - 1) as i32 } else { last as i32 }
}

fn follows(last_seq: i32, next_seq: i32) -> bool {
    next_seq as i64 == last_seq as i64 + 1 || (next_seq == 0 && last_seq == i32::MAX)
}

/// Every producer id a partition remembers. See the module documentation.
#[derive(Debug, Clone, Default)]
pub struct ProducerStates {
    producers: BTreeMap<i64, ProducerEntry>,
    /// The open transactions by first offset: the producer id of each (derived from `producers`).
    open_txns: BTreeMap<Offset, i64>,
    /// The verification guards of transactional batches being verified (see [`verification`]).
    guards: verification::Guards,
}

/// Two states are equal when they hold the same producers: what the log determines. The verification
/// guards, a leader's memory of verifications under way, are not compared.
impl PartialEq for ProducerStates {
    fn eq(&self, other: &Self) -> bool {
        self.producers == other.producers && self.open_txns == other.open_txns
    }
}

impl Eq for ProducerStates {}

impl ProducerStates {
    /// The state holding `producers`, its index of open transactions derived from them.
    fn from_producers(producers: BTreeMap<i64, ProducerEntry>) -> ProducerStates {
        let open_txns = producers.iter().filter_map(|(id, e)| e.txn_first_offset.map(|first| (first, *id))).collect();
        ProducerStates { producers, open_txns, guards: Default::default() }
    }

    pub fn len(&self) -> usize {
        self.producers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.producers.is_empty()
    }

    /// Each remembered producer's id and the last offset of its latest batch (the batch compaction keeps,
    /// so that the state can be rebuilt from the log).
    pub fn last_batches(&self) -> impl Iterator<Item = (i64, Offset)> + '_ {
        self.producers.iter().filter_map(|(id, e)| e.batches.back().map(|b| (*id, b.last_offset)))
    }

    pub fn get(&self, producer_id: i64) -> Option<&ProducerEntry> {
        self.producers.get(&producer_id)
    }

    /// Every remembered producer, by id.
    pub fn iter(&self) -> impl Iterator<Item = (i64, &ProducerEntry)> + '_ {
        self.producers.iter().map(|(id, e)| (*id, e))
    }

    /// The open transactions: each one's first offset and producer id, by first offset.
    pub fn open_txns(&self) -> impl Iterator<Item = (Offset, i64)> + '_ {
        self.open_txns.iter().map(|(first, id)| (*first, *id))
    }

    /// The first offset of the earliest open transaction.
    pub fn first_open_txn(&self) -> Option<Offset> {
        self.open_txns.keys().next().copied()
    }

    /// Judges a batch a client sent, before it gets offsets. Changes nothing.
    pub fn check(&self, header: &BatchHeader) -> Result<Verdict, ProducerError> {
        if header.attributes & CONTROL_BIT != 0 {
            return Err(ProducerError::InvalidBatch("clients may not write control batches".into()));
        }
        let transactional = header.attributes & TRANSACTIONAL_BIT != 0;
        let id = header.producer_id;
        if id < 0 {
            if transactional {
                return Err(ProducerError::InvalidBatch("a transactional batch without a producer id".into()));
            }
            return Ok(Verdict::Append);
        }
        if header.producer_epoch < 0 || header.base_sequence < 0 {
            return Err(ProducerError::InvalidBatch(format!(
                "producer {id} with epoch {} and base sequence {}",
                header.producer_epoch, header.base_sequence
            )));
        }
        let Some(entry) = self.producers.get(&id) else { return Ok(Verdict::Append) };
        let (epoch, first_seq) = (header.producer_epoch, header.base_sequence);
        if epoch < entry.epoch {
            return Err(ProducerError::StaleEpoch { producer_id: id, epoch, current: entry.epoch });
        }
        let last_seq = last_sequence(first_seq, header.last_offset_delta);
        if epoch == entry.epoch
            && let Some(original) = entry.batches.iter().find(|b| b.first_seq == first_seq && b.last_seq == last_seq)
        {
            return Ok(Verdict::Duplicate(*original));
        }
        if let Some(txn_first_offset) = entry.txn_first_offset
            && !transactional
        {
            return Err(ProducerError::NotTransactional { producer_id: id, txn_first_offset });
        }
        let last_kept = entry.batches.back().map_or(-1, |b| b.last_seq);
        let out_of_order = ProducerError::OutOfOrderSequence { producer_id: id, epoch, first_seq, last_seq: last_kept };
        let in_order = if epoch > entry.epoch { first_seq == 0 } else { follows(last_kept, first_seq) };
        if in_order { Ok(Verdict::Append) } else { Err(out_of_order) }
    }

    /// Judges a batch a coordinator writes (see `PartitionLog::append_for_coordinator`): its own records
    /// without a producer id, or a producer's transactional data with the producer's id and epoch and no
    /// sequence, of which only the epoch is checked. Changes nothing.
    pub fn check_coordinator_write(&self, header: &BatchHeader) -> Result<Verdict, ProducerError> {
        let id = header.producer_id;
        if id < 0 && header.attributes & (CONTROL_BIT | TRANSACTIONAL_BIT) == 0 {
            return Ok(Verdict::Append);
        }
        if header.attributes & CONTROL_BIT != 0
            || header.attributes & TRANSACTIONAL_BIT == 0
            || id < 0
            || header.producer_epoch < 0
            || header.base_sequence != -1
        {
            return Err(ProducerError::InvalidBatch(format!(
                "a coordinator's write for producer {id} must be transactional data at an epoch, without a sequence"
            )));
        }
        match self.producers.get(&id) {
            Some(entry) if header.producer_epoch < entry.epoch => {
                Err(ProducerError::StaleEpoch { producer_id: id, epoch: header.producer_epoch, current: entry.epoch })
            }
            _ => Ok(Verdict::Append),
        }
    }

    /// Judges a transaction marker the coordinator asks the leader to write. Changes nothing.
    pub fn check_marker(&self, marker: &TxnMarker) -> Result<(), ProducerError> {
        let id = marker.producer_id;
        if id < 0 || marker.producer_epoch < 0 {
            return Err(ProducerError::InvalidBatch(format!(
                "marker for producer {id} at epoch {}",
                marker.producer_epoch
            )));
        }
        let Some(entry) = self.producers.get(&id) else { return Ok(()) };
        if marker.producer_epoch < entry.epoch {
            return Err(ProducerError::StaleMarkerEpoch {
                producer_id: id,
                epoch: marker.producer_epoch,
                current: entry.epoch,
            });
        }
        if marker.coordinator_epoch < entry.coordinator_epoch {
            return Err(ProducerError::CoordinatorFenced {
                producer_id: id,
                coordinator_epoch: marker.coordinator_epoch,
                current: entry.coordinator_epoch,
            });
        }
        Ok(())
    }

    /// Records a batch that is in the log at `base_offset` (just appended, or met replaying the log), at
    /// `now_ms` on the broker's clock. Batches without a producer id and control batches are ignored (see
    /// [`Self::record_marker`]), and so is the first batch of a producer id when `remember_new` is false
    /// (the owner's [`ProducerBudget`] is used up).
    pub fn record(&mut self, header: &BatchHeader, base_offset: Offset, now_ms: i64, remember_new: bool) {
        let id = header.producer_id;
        if header.attributes & TRANSACTIONAL_BIT != 0 {
            // Its transaction is open here now (or, past the budget, untracked): the guard is spent.
            self.guards.clear(id);
        }
        if id < 0 || header.attributes & CONTROL_BIT != 0 || (!remember_new && !self.producers.contains_key(&id)) {
            return;
        }
        let batch = ProducerBatch {
            first_seq: header.base_sequence,
            last_seq: last_sequence(header.base_sequence, header.last_offset_delta),
            base_offset,
            last_offset: base_offset.plus(header.last_offset_delta.max(0) as u64),
        };
        let entry = self.producers.entry(id).or_insert_with(|| new_entry(header.producer_epoch, now_ms));
        if entry.epoch != header.producer_epoch {
            entry.epoch = header.producer_epoch;
            entry.batches.clear();
        }
        // A coordinator's write for the producer's transaction has no sequence: nothing to remember of it
        // for deduplication.
        if header.base_sequence >= 0 {
            if entry.batches.len() == BATCHES_KEPT {
                entry.batches.pop_front();
            }
            entry.batches.push_back(batch);
        }
        entry.last_append_ms = now_ms;
        if header.attributes & TRANSACTIONAL_BIT != 0 && entry.txn_first_offset.is_none() {
            entry.txn_first_offset = Some(base_offset);
            self.open_txns.insert(base_offset, id);
        }
        if self.producers.len() > MAX_PRODUCERS_PER_PARTITION {
            self.evict_oldest();
        }
    }

    /// Records a marker that is in the log at `offset` (just appended, or met replaying the log): its
    /// producer's open transaction, if any, ends, and is returned. The producer's epoch and coordinator
    /// epoch become the marker's where they are newer. A producer id not known yet is remembered only if
    /// `remember_new`.
    pub fn record_marker(
        &mut self,
        marker: &TxnMarker,
        offset: Offset,
        now_ms: i64,
        remember_new: bool,
    ) -> Option<CompletedTxn> {
        let id = marker.producer_id;
        // A verification that began before this marker must not open a transaction after it.
        self.guards.clear(id);
        if id < 0 || (!remember_new && !self.producers.contains_key(&id)) {
            return None;
        }
        let entry = self.producers.entry(id).or_insert_with(|| new_entry(marker.producer_epoch, now_ms));
        if marker.producer_epoch > entry.epoch {
            entry.epoch = marker.producer_epoch;
            entry.batches.clear();
        }
        entry.coordinator_epoch = entry.coordinator_epoch.max(marker.coordinator_epoch);
        entry.last_append_ms = now_ms;
        let first_offset = entry.txn_first_offset.take()?;
        let removed = self.open_txns.remove(&first_offset);
        assert_eq!(removed, Some(id), "the open-transaction index disagrees with producer {id}");
        let last_stable_offset = self.first_open_txn().unwrap_or(offset.plus(1));
        Some(CompletedTxn { producer_id: id, kind: marker.kind, first_offset, last_offset: offset, last_stable_offset })
    }

    /// Forgets the producers whose last batch is oldest, a hundredth of the bound at a time so the cost
    /// is shared by many appends. Those with an open transaction are kept.
    fn evict_oldest(&mut self) {
        let mut by_age: Vec<(Offset, i64)> = self
            .producers
            .iter()
            .filter(|(_, e)| e.txn_first_offset.is_none())
            .map(|(id, e)| (e.batches.back().map_or(Offset::ZERO, |b| b.last_offset), *id))
            .collect();
        let excess =
            (self.producers.len() - MAX_PRODUCERS_PER_PARTITION + MAX_PRODUCERS_PER_PARTITION / 100).min(by_age.len());
        if excess == 0 {
            return;
        }
        by_age.select_nth_unstable(excess - 1);
        for (_, id) in &by_age[..excess] {
            self.producers.remove(id);
        }
    }

    /// Forgets producers whose last batch was appended `expiration_ms` or more before `now_ms` (Kafka's
    /// `producer.id.expiration.ms`), but not those with an open transaction. Returns how many were
    /// forgotten. Verification guards made as long ago go too (their appends never came).
    pub fn expire(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        self.guards.expire(now_ms, expiration_ms);
        let before = self.producers.len();
        self.producers
            .retain(|_, e| e.txn_first_offset.is_some() || now_ms.saturating_sub(e.last_append_ms) < expiration_ms);
        before - self.producers.len()
    }

    /// Each producer's epoch and kept batches, without the times: what the log alone determines.
    pub fn sequences(&self) -> BTreeMap<i64, (i16, Vec<ProducerBatch>)> {
        self.producers.iter().map(|(id, e)| (*id, (e.epoch, e.batches.iter().copied().collect()))).collect()
    }

    /// Each producer's open transaction and last coordinator epoch: the transaction state the log alone
    /// determines.
    pub fn transactions(&self) -> BTreeMap<i64, (Option<Offset>, i32)> {
        self.producers.iter().map(|(id, e)| (*id, (e.txn_first_offset, e.coordinator_epoch))).collect()
    }
}

fn new_entry(epoch: i16, now_ms: i64) -> ProducerEntry {
    ProducerEntry {
        epoch,
        batches: VecDeque::with_capacity(BATCHES_KEPT),
        last_append_ms: now_ms,
        txn_first_offset: None,
        coordinator_epoch: NO_COORDINATOR_EPOCH,
    }
}

#[cfg(test)]
mod tests;
