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
//!
//! Everything here is derived from the batch headers in the log (and the marker records), which carry
//! producer id, epoch and sequences: replaying the log from any snapshot rebuilds the same state. This
//! module does no I/O; the log writes and reads the snapshots (`docs/storage-format.md` §9).

pub mod snapshot;

use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};

use crate::batch::BatchHeader;
use crate::txn::MarkerKind;
use crate::txn::marker::{CONTROL_BIT, TRANSACTIONAL_BIT};
use crate::types::Offset;

pub use crate::txn::TxnMarker;
pub use snapshot::{SNAPSHOT_MAGIC, SNAPSHOT_SUFFIX, SNAPSHOT_VERSION};

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
    /// Kafka's PRODUCER_FENCED (INVALID_PRODUCER_EPOCH to clients older than KIP-588): a transaction
    /// marker at an epoch older than the producer's current one.
    #[error("marker for producer {producer_id}: epoch {epoch} is older than the current {current}")]
    StaleMarkerEpoch { producer_id: i64, epoch: i16, current: i16 },
    /// Kafka's TRANSACTION_COORDINATOR_FENCED: a marker from a coordinator epoch older than the last one
    /// this partition saw for the producer.
    #[error("marker for producer {producer_id}: coordinator epoch {coordinator_epoch} is older than {current}")]
    CoordinatorFenced { producer_id: i64, coordinator_epoch: i32, current: i32 },
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProducerStates {
    producers: BTreeMap<i64, ProducerEntry>,
    /// The open transactions by first offset: the producer id of each (derived from `producers`).
    open_txns: BTreeMap<Offset, i64>,
}

impl ProducerStates {
    /// The state holding `producers`, its index of open transactions derived from them.
    fn from_producers(producers: BTreeMap<i64, ProducerEntry>) -> ProducerStates {
        let open_txns = producers.iter().filter_map(|(id, e)| e.txn_first_offset.map(|first| (first, *id))).collect();
        ProducerStates { producers, open_txns }
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
        if entry.batches.len() == BATCHES_KEPT {
            entry.batches.pop_front();
        }
        entry.batches.push_back(batch);
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
    /// forgotten.
    pub fn expire(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
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
mod tests {
    use super::*;

    fn header(id: i64, epoch: i16, seq: i32, count: i32) -> BatchHeader {
        BatchHeader {
            base_offset: 0,
            batch_length: 0,
            partition_leader_epoch: 0,
            magic: 2,
            crc: 0,
            attributes: 0,
            last_offset_delta: count - 1,
            base_timestamp: 1_000,
            max_timestamp: 1_000,
            producer_id: id,
            producer_epoch: epoch,
            base_sequence: seq,
            record_count: count,
        }
    }

    /// Checks and, when it is to be appended, records the batch at `*end`, as the log does.
    fn offer(states: &mut ProducerStates, h: BatchHeader, end: &mut u64) -> Result<Verdict, ProducerError> {
        let verdict = states.check(&h)?;
        if verdict == Verdict::Append {
            states.record(&h, Offset(*end), 1_000, true);
            *end += h.record_count as u64;
        }
        Ok(verdict)
    }

    #[test]
    fn retry_of_any_of_the_last_five_batches_is_answered_with_its_offsets() {
        let mut s = ProducerStates::default();
        let mut end = 0;
        for i in 0..6 {
            assert_eq!(offer(&mut s, header(7, 0, i * 2, 2), &mut end), Ok(Verdict::Append));
        }
        // Batches 1..=5 (sequences 2..=11) are kept; batch 0 (sequences 0..=1) is not.
        let dup = offer(&mut s, header(7, 0, 4, 2), &mut end).unwrap();
        let original = ProducerBatch { first_seq: 4, last_seq: 5, base_offset: Offset(4), last_offset: Offset(5) };
        assert_eq!(dup, Verdict::Duplicate(original));
        assert_eq!(end, 12, "a duplicate gets no offsets");
        assert!(matches!(
            offer(&mut s, header(7, 0, 0, 2), &mut end),
            Err(ProducerError::OutOfOrderSequence { first_seq: 0, last_seq: 11, .. })
        ));
    }

    #[test]
    fn gap_is_out_of_order_and_next_sequence_appends() {
        let mut s = ProducerStates::default();
        let mut end = 0;
        offer(&mut s, header(1, 0, 0, 3), &mut end).unwrap();
        assert!(matches!(offer(&mut s, header(1, 0, 4, 1), &mut end), Err(ProducerError::OutOfOrderSequence { .. })));
        assert_eq!(offer(&mut s, header(1, 0, 3, 1), &mut end), Ok(Verdict::Append));
        // A range overlapping a kept one without matching it is not a duplicate.
        assert!(matches!(offer(&mut s, header(1, 0, 1, 2), &mut end), Err(ProducerError::OutOfOrderSequence { .. })));
    }

    #[test]
    fn older_epoch_is_fenced_and_newer_epoch_must_start_at_zero() {
        let mut s = ProducerStates::default();
        let mut end = 0;
        offer(&mut s, header(1, 3, 0, 1), &mut end).unwrap();
        assert!(matches!(
            offer(&mut s, header(1, 2, 1, 1), &mut end),
            Err(ProducerError::StaleEpoch { epoch: 2, current: 3, .. })
        ));
        assert!(matches!(offer(&mut s, header(1, 4, 5, 1), &mut end), Err(ProducerError::OutOfOrderSequence { .. })));
        assert_eq!(offer(&mut s, header(1, 4, 0, 1), &mut end), Ok(Verdict::Append));
        let entry = s.get(1).unwrap();
        assert_eq!((entry.epoch, entry.batches.len()), (4, 1), "the bump replaced the old epoch's batches");
        // The old epoch is fenced from now on, even a retry of its batch.
        assert!(matches!(offer(&mut s, header(1, 3, 0, 1), &mut end), Err(ProducerError::StaleEpoch { .. })));
    }

    #[test]
    fn unknown_producer_is_accepted_at_any_sequence() {
        let mut s = ProducerStates::default();
        let mut end = 0;
        assert_eq!(offer(&mut s, header(9, 2, 12345, 1), &mut end), Ok(Verdict::Append));
        assert_eq!(offer(&mut s, header(9, 2, 12346, 1), &mut end), Ok(Verdict::Append));
        assert_eq!(offer(&mut s, header(-1, -1, -1, 1), &mut end), Ok(Verdict::Append), "not idempotent");
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn sequences_wrap_after_i32_max() {
        assert_eq!(last_sequence(i32::MAX - 1, 3), 1);
        let mut s = ProducerStates::default();
        let mut end = 0;
        offer(&mut s, header(1, 0, i32::MAX - 1, 2), &mut end).unwrap();
        assert_eq!(offer(&mut s, header(1, 0, 0, 1), &mut end), Ok(Verdict::Append));
    }

    #[test]
    fn bad_idempotent_fields_and_client_control_batches_are_refused() {
        let s = ProducerStates::default();
        assert!(matches!(s.check(&header(1, 0, -1, 1)), Err(ProducerError::InvalidBatch(_))));
        assert!(matches!(s.check(&header(1, -1, 0, 1)), Err(ProducerError::InvalidBatch(_))));
        let mut control = header(1, 0, 0, 1);
        control.attributes = CONTROL_BIT | TRANSACTIONAL_BIT;
        assert!(matches!(s.check(&control), Err(ProducerError::InvalidBatch(_))));
        assert!(matches!(s.check(&txn_header(-1, -1, -1, 1)), Err(ProducerError::InvalidBatch(_))));
    }

    fn txn_header(id: i64, epoch: i16, seq: i32, count: i32) -> BatchHeader {
        BatchHeader { attributes: TRANSACTIONAL_BIT, ..header(id, epoch, seq, count) }
    }

    fn marker(kind: MarkerKind, id: i64, epoch: i16, coordinator_epoch: i32) -> TxnMarker {
        TxnMarker { kind, producer_id: id, producer_epoch: epoch, coordinator_epoch }
    }

    #[test]
    fn the_first_transactional_batch_opens_a_transaction_and_its_marker_ends_it() {
        let mut s = ProducerStates::default();
        let mut end = 0;
        offer(&mut s, header(2, 0, 0, 2), &mut end).unwrap();
        offer(&mut s, txn_header(1, 0, 0, 3), &mut end).unwrap();
        offer(&mut s, txn_header(3, 0, 0, 1), &mut end).unwrap();
        offer(&mut s, txn_header(1, 0, 3, 2), &mut end).unwrap();
        assert_eq!(s.get(1).unwrap().txn_first_offset, Some(Offset(2)), "set by the first batch only");
        assert_eq!(s.open_txns().collect::<Vec<_>>(), [(Offset(2), 1), (Offset(5), 3)]);
        assert_eq!(s.first_open_txn(), Some(Offset(2)));
        let m = marker(MarkerKind::Abort, 1, 0, 4);
        s.check_marker(&m).unwrap();
        let done = s.record_marker(&m, Offset(end), 1_000, true).expect("an open transaction ended");
        end += 1;
        assert_eq!(
            done,
            CompletedTxn {
                producer_id: 1,
                kind: MarkerKind::Abort,
                first_offset: Offset(2),
                last_offset: Offset(8),
                last_stable_offset: Offset(5),
            },
            "producer 3's transaction is still open from 5"
        );
        assert_eq!(s.get(1).unwrap().coordinator_epoch, 4);
        assert_eq!(s.first_open_txn(), Some(Offset(5)));
        // The batches of the ended transaction are still its sequence history.
        assert_eq!(offer(&mut s, txn_header(1, 0, 5, 1), &mut end), Ok(Verdict::Append));
        assert_eq!(s.get(1).unwrap().txn_first_offset, Some(Offset(9)), "the next transaction opens");
    }

    #[test]
    fn a_non_transactional_batch_during_an_open_transaction_is_invalid_txn_state() {
        let mut s = ProducerStates::default();
        let mut end = 0;
        offer(&mut s, txn_header(1, 0, 0, 1), &mut end).unwrap();
        assert_eq!(
            offer(&mut s, header(1, 0, 1, 1), &mut end),
            Err(ProducerError::NotTransactional { producer_id: 1, txn_first_offset: Offset(0) })
        );
        assert!(
            matches!(offer(&mut s, txn_header(1, 0, 1, 1), &mut end), Ok(Verdict::Append)),
            "the transaction goes on"
        );
        // A retry of the transactional batch is still a duplicate, not a refusal.
        assert!(matches!(s.check(&txn_header(1, 0, 0, 1)), Ok(Verdict::Duplicate(_))));
        assert!(matches!(offer(&mut s, txn_header(1, 0, 2, 1), &mut end), Ok(Verdict::Append)));
        assert!(
            matches!(s.check(&txn_header(1, 0, 7, 1)), Err(ProducerError::OutOfOrderSequence { .. })),
            "sequences are checked as ever"
        );
    }

    #[test]
    fn stale_epochs_and_stale_coordinators_are_fenced() {
        let mut s = ProducerStates::default();
        let mut end = 0;
        offer(&mut s, txn_header(1, 5, 0, 1), &mut end).unwrap();
        assert!(matches!(
            s.check(&txn_header(1, 4, 1, 1)),
            Err(ProducerError::StaleEpoch { epoch: 4, current: 5, .. })
        ));
        assert_eq!(
            s.check_marker(&marker(MarkerKind::Commit, 1, 4, 0)),
            Err(ProducerError::StaleMarkerEpoch { producer_id: 1, epoch: 4, current: 5 })
        );
        s.record_marker(&marker(MarkerKind::Commit, 1, 5, 3), Offset(end), 1_000, true).unwrap();
        end += 1;
        assert_eq!(
            s.check_marker(&marker(MarkerKind::Abort, 1, 5, 2)),
            Err(ProducerError::CoordinatorFenced { producer_id: 1, coordinator_epoch: 2, current: 3 })
        );
        assert_eq!(s.check_marker(&marker(MarkerKind::Abort, 1, 5, 3)), Ok(()), "the same coordinator epoch");
        assert!(matches!(s.check_marker(&marker(MarkerKind::Abort, -1, 0, 0)), Err(ProducerError::InvalidBatch(_))));
        // A marker at a newer epoch (the coordinator fenced the producer) bumps it: its batches are forgotten
        // and the next must start at sequence 0.
        assert_eq!(s.record_marker(&marker(MarkerKind::Abort, 1, 6, 3), Offset(end), 1_000, true), None);
        let entry = s.get(1).unwrap();
        assert_eq!((entry.epoch, entry.batches.len(), entry.txn_first_offset), (6, 0, None));
        assert!(matches!(s.check(&txn_header(1, 6, 1, 1)), Err(ProducerError::OutOfOrderSequence { .. })));
        assert_eq!(s.check(&txn_header(1, 6, 0, 1)), Ok(Verdict::Append));
        assert!(matches!(s.check(&txn_header(1, 5, 1, 1)), Err(ProducerError::StaleEpoch { .. })));
    }

    #[test]
    fn a_marker_for_a_producer_without_an_open_transaction_changes_only_its_epochs() {
        let mut s = ProducerStates::default();
        assert_eq!(s.record_marker(&marker(MarkerKind::Commit, 9, 2, 7), Offset(0), 1_000, true), None);
        assert_eq!(s.transactions().get(&9), Some(&(None, 7)));
        assert_eq!(s.first_open_txn(), None);
        assert_eq!(s.record_marker(&marker(MarkerKind::Commit, 10, 2, 7), Offset(1), 1_000, false), None);
        assert!(s.get(10).is_none(), "past the budget, not remembered");
    }

    #[test]
    fn a_producer_with_an_open_transaction_does_not_expire() {
        let mut s = ProducerStates::default();
        s.record(&txn_header(1, 0, 0, 1), Offset(0), 0, true);
        s.record(&header(2, 0, 0, 1), Offset(1), 0, true);
        assert_eq!(s.expire(DEFAULT_PRODUCER_ID_EXPIRATION_MS * 2, DEFAULT_PRODUCER_ID_EXPIRATION_MS), 1);
        assert_eq!(s.first_open_txn(), Some(Offset(0)));
    }

    #[test]
    fn a_snapshot_keeps_open_transactions_and_coordinator_epochs() {
        let mut s = ProducerStates::default();
        let mut end = 0;
        offer(&mut s, txn_header(1, 0, 0, 2), &mut end).unwrap();
        offer(&mut s, txn_header(2, 3, 0, 2), &mut end).unwrap();
        s.record_marker(&marker(MarkerKind::Commit, 2, 3, 11), Offset(end), 1_000, true).unwrap();
        end += 1;
        s.record_marker(&marker(MarkerKind::Abort, 3, 1, 4), Offset(end), 1_000, true);
        end += 1;
        let bytes = s.encode(Offset(end));
        let (at, back) = ProducerStates::decode(&bytes).unwrap();
        assert_eq!((at, &back), (Offset(end), &s));
        assert_eq!(back.first_open_txn(), Some(Offset(0)));
        assert_eq!(back.get(3).unwrap().batches.len(), 0, "known by its marker alone");
    }

    #[test]
    fn a_version_1_snapshot_reads_as_no_open_transactions() {
        // Producer 4 at epoch 1, one batch (sequences 0..=1 at offsets 0..=1), in the version 1 layout.
        let mut body = Vec::new();
        body.extend_from_slice(&2u64.to_be_bytes());
        body.extend_from_slice(&1u32.to_be_bytes());
        body.extend_from_slice(&4i64.to_be_bytes());
        body.extend_from_slice(&1i16.to_be_bytes());
        body.extend_from_slice(&500i64.to_be_bytes());
        body.push(1);
        for field in [0i32, 1] {
            body.extend_from_slice(&field.to_be_bytes());
        }
        body.extend_from_slice(&0u64.to_be_bytes());
        body.extend_from_slice(&1u64.to_be_bytes());
        let mut file = SNAPSHOT_MAGIC.to_vec();
        file.extend_from_slice(&1u16.to_be_bytes());
        file.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
        file.extend_from_slice(&body);
        let (at, s) = ProducerStates::decode(&file).unwrap();
        assert_eq!(at, Offset(2));
        let entry = s.get(4).unwrap();
        assert_eq!((entry.epoch, entry.batches.len(), entry.last_append_ms), (1, 1, 500));
        assert_eq!((entry.txn_first_offset, entry.coordinator_epoch), (None, NO_COORDINATOR_EPOCH));
        // A version 1 producer without batches was never written, and is refused.
        let mut empty = body.clone();
        empty[30] = 0;
        empty.truncate(31);
        let mut file = SNAPSHOT_MAGIC.to_vec();
        file.extend_from_slice(&1u16.to_be_bytes());
        file.extend_from_slice(&crc32c::crc32c(&empty).to_be_bytes());
        file.extend_from_slice(&empty);
        assert!(ProducerStates::decode(&file).is_err());
    }

    #[test]
    fn producers_expire_when_idle_by_the_brokers_clock_not_by_their_record_timestamps() {
        let mut s = ProducerStates::default();
        let mut old = header(1, 0, 0, 1);
        old.max_timestamp = 0;
        s.record(&old, Offset(0), 5_000, true);
        s.record(&header(2, 0, 0, 1), Offset(1), 9_000, true);
        let day = DEFAULT_PRODUCER_ID_EXPIRATION_MS;
        assert_eq!(s.expire(5_000 + day - 1, day), 0, "an old record timestamp does not expire its producer");
        assert_eq!(s.expire(5_000 + day, day), 1);
        assert!(s.get(1).is_none() && s.get(2).is_some());
    }

    #[test]
    fn snapshot_round_trips_and_refuses_damage() {
        let mut s = ProducerStates::default();
        let mut end = 0;
        for id in 0..20 {
            for k in 0..(id % 7) + 1 {
                offer(&mut s, header(id, (id % 3) as i16, k as i32 * 3, 3), &mut end).unwrap();
            }
        }
        let bytes = s.encode(Offset(end));
        assert_eq!(ProducerStates::decode(&bytes), Ok((Offset(end), s.clone())));
        for at in [0, 5, 7, 12, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[at] ^= 0x40;
            assert!(ProducerStates::decode(&bad).is_err(), "flipped byte {at} accepted");
        }
        assert!(ProducerStates::decode(&bytes[..bytes.len() - 3]).is_err());
        // A body that claims more producers than it holds is refused before anything is allocated.
        let mut huge = ProducerStates::default().encode(Offset(5));
        huge[18..22].copy_from_slice(&u32::MAX.to_be_bytes());
        let crc = crc32c::crc32c(&huge[10..]);
        huge[6..10].copy_from_slice(&crc.to_be_bytes());
        assert!(ProducerStates::decode(&huge).unwrap_err().contains("cannot fit"));
    }

    #[test]
    fn a_producer_id_past_the_budget_is_appended_but_not_remembered() {
        let mut s = ProducerStates::default();
        s.record(&header(1, 0, 0, 1), Offset(0), 0, true);
        s.record(&header(2, 0, 0, 1), Offset(1), 0, false);
        assert!(s.get(2).is_none(), "a new id past the budget is not remembered");
        s.record(&header(1, 0, 1, 1), Offset(2), 0, false);
        assert_eq!(s.get(1).unwrap().batches.len(), 2, "a known id goes on being tracked");
        let budget = ProducerBudget::new(2);
        budget.adjust(0, 2);
        assert!(!budget.has_room());
        budget.adjust(2, 1);
        assert_eq!(budget.used(), 1);
    }
}
