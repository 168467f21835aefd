//! Idempotent producers: what a partition remembers of each producer id, the rules a batch from one must
//! pass before it gets offsets, and the snapshot file that saves rebuilding it from the whole log.
//!
//! Kafka's rules (KIP-98, with KIP-360's epoch bumps and the "unknown producer" leniency of Kafka 2.5):
//! - A batch with producer id -1 is not idempotent and passes unchecked.
//! - For each producer id the partition keeps its epoch and the sequence ranges and offsets of its last
//!   [`BATCHES_KEPT`] batches (a producer keeps at most five requests in flight per partition).
//! - A batch that repeats one of them (same epoch, same first and last sequence) is a retry: it is answered
//!   with the offsets the first copy got and is not appended again.
//! - Otherwise, at the same epoch, its first sequence must follow the last one kept (wrapping after
//!   `i32::MAX`): a gap or an older sequence is OUT_OF_ORDER_SEQUENCE_NUMBER.
//! - An older epoch is INVALID_PRODUCER_EPOCH. A newer epoch (the client bumped it after a fatal sequence
//!   error) must start at sequence 0, and replaces what was kept for the old one.
//! - A producer id the partition knows nothing of (never seen, expired, or evicted) is accepted at any
//!   sequence.
//!
//! Everything here is derived from the batch headers in the log, which carry producer id, epoch and
//! sequences: replaying the log from any snapshot rebuilds the same state. This module does no I/O; the
//! log writes and reads the snapshots (`docs/storage-format.md` §9).

use std::cell::Cell;
use std::collections::{BTreeMap, VecDeque};

use crate::batch::BatchHeader;
use crate::types::Offset;

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

/// Attribute bits of a v2 batch.
const TRANSACTIONAL_BIT: i16 = 0x10;
const CONTROL_BIT: i16 = 0x20;

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
    /// Oldest first, at most [`BATCHES_KEPT`], never empty.
    pub batches: VecDeque<ProducerBatch>,
    /// The broker's clock when its last batch was appended, or when the state was rebuilt from batches
    /// replayed from the log (whose append times the log does not keep): what expiration measures from.
    /// Kafka measures from the batch's own timestamp instead, which expires at once a producer that
    /// writes records with old timestamps, and with it the protection against its retries.
    pub last_append_ms: i64,
}

/// How a batch that passed the rules goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Append it.
    Append,
    /// A retry of a batch already in the log: answer with these offsets, append nothing.
    Duplicate(ProducerBatch),
}

/// Why a batch was refused. Each maps to a Kafka error code at the broker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProducerError {
    #[error("producer {producer_id} epoch {epoch}: sequence {first_seq} does not follow {last_seq}")]
    OutOfOrderSequence { producer_id: i64, epoch: i16, first_seq: i32, last_seq: i32 },
    #[error("producer {producer_id}: epoch {epoch} is older than the current {current}")]
    StaleEpoch { producer_id: i64, epoch: i16, current: i16 },
    #[error("invalid idempotent batch: {0}")]
    InvalidBatch(String),
    #[error("transactional batches are not supported (no transaction coordinator)")]
    Transactional,
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
}

impl ProducerStates {
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

    /// Judges a batch a client sent, before it gets offsets. Changes nothing.
    pub fn check(&self, header: &BatchHeader) -> Result<Verdict, ProducerError> {
        if header.attributes & CONTROL_BIT != 0 {
            return Err(ProducerError::InvalidBatch("clients may not write control batches".into()));
        }
        if header.attributes & TRANSACTIONAL_BIT != 0 {
            return Err(ProducerError::Transactional);
        }
        let id = header.producer_id;
        if id < 0 {
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
        let last_kept = entry.batches.back().map_or(-1, |b| b.last_seq);
        let out_of_order = ProducerError::OutOfOrderSequence { producer_id: id, epoch, first_seq, last_seq: last_kept };
        if epoch > entry.epoch {
            return if first_seq == 0 { Ok(Verdict::Append) } else { Err(out_of_order) };
        }
        let last_seq = last_sequence(first_seq, header.last_offset_delta);
        if let Some(original) = entry.batches.iter().find(|b| b.first_seq == first_seq && b.last_seq == last_seq) {
            return Ok(Verdict::Duplicate(*original));
        }
        match entry.batches.back() {
            Some(last) if !follows(last.last_seq, first_seq) => Err(out_of_order),
            _ => Ok(Verdict::Append),
        }
    }

    /// Records a batch that is in the log at `base_offset` (just appended, or met replaying the log), at
    /// `now_ms` on the broker's clock. Batches without a producer id are ignored, and so is the first batch
    /// of a producer id when `remember_new` is false (the owner's [`ProducerBudget`] is used up).
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
        let entry = self.producers.entry(id).or_insert_with(|| ProducerEntry {
            epoch: header.producer_epoch,
            batches: VecDeque::with_capacity(BATCHES_KEPT),
            last_append_ms: now_ms,
        });
        if entry.epoch != header.producer_epoch {
            entry.epoch = header.producer_epoch;
            entry.batches.clear();
        }
        if entry.batches.len() == BATCHES_KEPT {
            entry.batches.pop_front();
        }
        entry.batches.push_back(batch);
        entry.last_append_ms = now_ms;
        if self.producers.len() > MAX_PRODUCERS_PER_PARTITION {
            self.evict_oldest();
        }
    }

    /// Forgets the producers whose last batch is oldest, a hundredth of the bound at a time so the cost
    /// is shared by many appends.
    fn evict_oldest(&mut self) {
        let mut by_age: Vec<(Offset, i64)> = self
            .producers
            .iter()
            .map(|(id, e)| (e.batches.back().map_or(Offset::ZERO, |b| b.last_offset), *id))
            .collect();
        let excess = self.producers.len() - MAX_PRODUCERS_PER_PARTITION + MAX_PRODUCERS_PER_PARTITION / 100;
        by_age.select_nth_unstable(excess - 1);
        for (_, id) in &by_age[..excess] {
            self.producers.remove(id);
        }
    }

    /// Forgets producers whose last batch was appended `expiration_ms` or more before `now_ms` (Kafka's
    /// `producer.id.expiration.ms`). Returns how many were forgotten.
    pub fn expire(&mut self, now_ms: i64, expiration_ms: i64) -> usize {
        let before = self.producers.len();
        self.producers.retain(|_, e| now_ms.saturating_sub(e.last_append_ms) < expiration_ms);
        before - self.producers.len()
    }

    /// Each producer's epoch and kept batches, without the times: what the log alone determines.
    pub fn sequences(&self) -> BTreeMap<i64, (i16, Vec<ProducerBatch>)> {
        self.producers.iter().map(|(id, e)| (*id, (e.epoch, e.batches.iter().copied().collect()))).collect()
    }

    /// The snapshot file's bytes for this state, taken at log end offset `offset`
    /// (`docs/storage-format.md` §9).
    pub fn encode(&self, offset: Offset) -> Vec<u8> {
        let mut body = Vec::with_capacity(12 + self.producers.len() * 64);
        body.extend_from_slice(&offset.0.to_be_bytes());
        body.extend_from_slice(&(self.producers.len() as u32).to_be_bytes());
        for (id, e) in &self.producers {
            body.extend_from_slice(&id.to_be_bytes());
            body.extend_from_slice(&e.epoch.to_be_bytes());
            body.extend_from_slice(&e.last_append_ms.to_be_bytes());
            body.push(e.batches.len() as u8);
            for b in &e.batches {
                body.extend_from_slice(&b.first_seq.to_be_bytes());
                body.extend_from_slice(&b.last_seq.to_be_bytes());
                body.extend_from_slice(&b.base_offset.0.to_be_bytes());
                body.extend_from_slice(&b.last_offset.0.to_be_bytes());
            }
        }
        let mut out = Vec::with_capacity(SNAPSHOT_HEADER_BYTES + body.len());
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&SNAPSHOT_VERSION.to_be_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Reads a snapshot file: the offset it was taken at and the state. Every length is bounded by the
    /// bytes present before anything is allocated; the CRC32C is checked before the body is parsed.
    pub fn decode(bytes: &[u8]) -> Result<(Offset, ProducerStates), String> {
        if bytes.len() < SNAPSHOT_HEADER_BYTES + 12 {
            return Err(format!("{} bytes, shorter than a snapshot header", bytes.len()));
        }
        if &bytes[..4] != SNAPSHOT_MAGIC {
            return Err("not a producer-state snapshot (bad magic)".into());
        }
        let version = u16::from_be_bytes([bytes[4], bytes[5]]);
        if version != SNAPSHOT_VERSION {
            return Err(format!("unknown snapshot version {version}"));
        }
        let crc = u32::from_be_bytes(bytes[6..10].try_into().expect("4 bytes"));
        let body = &bytes[SNAPSHOT_HEADER_BYTES..];
        if crc32c::crc32c(body) != crc {
            return Err("CRC32C mismatch".into());
        }
        let mut r = Reader { bytes: body, at: 0 };
        let offset = Offset(r.u64()?);
        let count = r.u32()? as usize;
        if count > body.len() / PRODUCER_MIN_BYTES {
            return Err(format!("{count} producers cannot fit in {} bytes", body.len()));
        }
        let mut producers = BTreeMap::new();
        for _ in 0..count {
            let id = r.u64()? as i64;
            let epoch = r.u16()? as i16;
            let last_append_ms = r.u64()? as i64;
            let n = r.u8()? as usize;
            if n == 0 || n > BATCHES_KEPT || id < 0 || epoch < 0 {
                return Err(format!("producer {id}: epoch {epoch}, {n} batches"));
            }
            let mut batches = VecDeque::with_capacity(n);
            for _ in 0..n {
                let first_seq = r.u32()? as i32;
                let last_seq = r.u32()? as i32;
                let base_offset = Offset(r.u64()?);
                let last_offset = Offset(r.u64()?);
                if last_offset < base_offset || last_offset >= offset {
                    return Err(format!("producer {id}: batch {base_offset}..{last_offset} beyond {offset}"));
                }
                batches.push_back(ProducerBatch { first_seq, last_seq, base_offset, last_offset });
            }
            if producers.insert(id, ProducerEntry { epoch, batches, last_append_ms }).is_some() {
                return Err(format!("producer {id} appears twice"));
            }
        }
        if r.at != body.len() {
            return Err(format!("{} bytes after the last producer", body.len() - r.at));
        }
        Ok((offset, ProducerStates { producers }))
    }
}

/// The first bytes of a snapshot file.
pub const SNAPSHOT_MAGIC: &[u8; 4] = b"SLPS";
pub const SNAPSHOT_VERSION: u16 = 1;
/// Magic, version, CRC32C.
const SNAPSHOT_HEADER_BYTES: usize = 10;
/// A producer's bytes with one batch: id, epoch, timestamp, count, and the batch.
const PRODUCER_MIN_BYTES: usize = 8 + 2 + 8 + 1 + 24;
/// The suffix of a snapshot file; its name is the offset it was taken at, 20 digits, as segments are named.
pub const SNAPSHOT_SUFFIX: &str = ".snapshot";

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let end = self.at + N;
        let slice = self.bytes.get(self.at..end).ok_or("the snapshot ends inside a producer")?;
        self.at = end;
        Ok(slice.try_into().expect("N bytes"))
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_be_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_be_bytes(self.take()?))
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
    fn bad_idempotent_fields_and_transactional_batches_are_refused() {
        let s = ProducerStates::default();
        assert!(matches!(s.check(&header(1, 0, -1, 1)), Err(ProducerError::InvalidBatch(_))));
        assert!(matches!(s.check(&header(1, -1, 0, 1)), Err(ProducerError::InvalidBatch(_))));
        let mut txn = header(1, 0, 0, 1);
        txn.attributes = TRANSACTIONAL_BIT;
        assert_eq!(s.check(&txn), Err(ProducerError::Transactional));
        let mut control = header(1, 0, 0, 1);
        control.attributes = CONTROL_BIT | TRANSACTIONAL_BIT;
        assert!(matches!(s.check(&control), Err(ProducerError::InvalidBatch(_))));
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
