//! The sparse offset index (`.index`) and time index (`.timeindex`) of one segment, held in memory and
//! written whole when the segment is rolled or the log is closed; the active segment's files are also
//! kept up to date for its durable batches (`log::index_files`).
//!
//! Following Kafka, an entry is added before a batch once more than `index.interval.bytes` were appended
//! since the previous entry; the offset entry pairs the batch's last offset with the batch's position, and
//! the time entry pairs the largest timestamp seen so far with the last offset of the batch that carried it.
//!
//! `.index` entry (8 bytes): relative offset u32 BE, position u32 BE.
//! `.timeindex` entry (12 bytes): timestamp i64 BE, relative offset u32 BE.

use crate::types::Offset;

pub const OFFSET_ENTRY_BYTES: usize = 8;
pub const TIME_ENTRY_BYTES: usize = 12;

/// What the indexes need to know about one appended batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchMeta {
    pub position: u64,
    pub size: u64,
    pub base_offset: Offset,
    pub last_offset: Offset,
    pub max_timestamp: i64,
    pub epoch: i32,
}

/// Both indexes of a segment with `base` as base offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentIndex {
    base: Offset,
    /// (relative last offset, position), both strictly increasing.
    offsets: Vec<(u32, u32)>,
    /// (max timestamp so far, relative offset), both strictly increasing.
    times: Vec<(i64, u32)>,
    bytes_since_entry: u64,
    /// Largest timestamp in the segment and the last offset of the batch that holds it.
    max_timestamp: i64,
    offset_of_max_timestamp: Offset,
}

impl SegmentIndex {
    pub fn new(base: Offset) -> Self {
        SegmentIndex {
            base,
            offsets: Vec::new(),
            times: Vec::new(),
            bytes_since_entry: 0,
            max_timestamp: -1,
            offset_of_max_timestamp: base,
        }
    }

    fn relative(&self, offset: Offset) -> u32 {
        let rel = offset.0.checked_sub(self.base.0).expect("offset below segment base");
        u32::try_from(rel).expect("relative offset beyond u32")
    }

    /// Accounts for a batch appended at `meta.position`.
    pub fn on_batch(&mut self, meta: &BatchMeta, interval_bytes: u64) {
        if meta.max_timestamp > self.max_timestamp {
            self.max_timestamp = meta.max_timestamp;
            self.offset_of_max_timestamp = meta.last_offset;
        }
        if self.bytes_since_entry > interval_bytes {
            let rel = self.relative(meta.last_offset);
            let pos = u32::try_from(meta.position).expect("segment position beyond u32");
            if self.offsets.last().is_none_or(|&(r, p)| rel > r && pos > p) {
                self.offsets.push((rel, pos));
            }
            let time_rel = self.relative(self.offset_of_max_timestamp);
            if self.times.last().is_none_or(|&(t, r)| self.max_timestamp > t && time_rel >= r) {
                self.times.push((self.max_timestamp, time_rel));
            }
            self.bytes_since_entry = 0;
        }
        self.bytes_since_entry += meta.size;
    }

    /// Adds a final time entry for the segment's largest timestamp if it is not indexed yet, so a rolled
    /// segment's time index alone tells its newest record (as Kafka does when a segment becomes inactive).
    pub fn seal(&mut self) {
        if self.max_timestamp < 0 {
            return;
        }
        let rel = self.relative(self.offset_of_max_timestamp);
        if self.times.last().is_none_or(|&(t, r)| self.max_timestamp > t && rel >= r) {
            self.times.push((self.max_timestamp, rel));
        }
    }

    /// A file position at or before the batch holding `target`: the position of the last indexed batch
    /// whose last offset is not above `target`.
    pub fn position_for(&self, target: Offset) -> u64 {
        if target < self.base {
            return 0;
        }
        let rel = (target.0 - self.base.0).min(u32::MAX as u64) as u32;
        let n = self.offsets.partition_point(|&(r, _)| r <= rel);
        if n == 0 { 0 } else { self.offsets[n - 1].1 as u64 }
    }

    /// An offset at or before the first batch whose max timestamp is at least `timestamp`.
    pub fn offset_for_timestamp(&self, timestamp: i64) -> Offset {
        let n = self.times.partition_point(|&(t, _)| t < timestamp);
        if n == 0 { self.base } else { Offset(self.base.0 + self.times[n - 1].1 as u64) }
    }

    /// Raises the segment's largest timestamp if this batch's is larger (after a truncation dropped the
    /// batches that held the old one).
    pub fn note_batch_timestamp(&mut self, max_timestamp: i64, last_offset: Offset) {
        if max_timestamp > self.max_timestamp {
            self.max_timestamp = max_timestamp;
            self.offset_of_max_timestamp = last_offset;
        }
    }

    /// The offset of the last time index entry, where a search for the largest timestamp must start.
    pub fn last_time_entry_offset(&self) -> Offset {
        self.times.last().map_or(self.base, |&(_, r)| Offset(self.base.0 + r as u64))
    }

    pub fn max_timestamp(&self) -> i64 {
        self.max_timestamp
    }

    pub fn entry_count(&self) -> (usize, usize) {
        (self.offsets.len(), self.times.len())
    }

    /// Every (last offset, position) entry, for checks against the log.
    pub fn offset_entries(&self) -> impl Iterator<Item = (Offset, u64)> + '_ {
        self.offsets.iter().map(|&(r, p)| (Offset(self.base.0 + r as u64), p as u64))
    }

    /// Every (timestamp, offset) entry, for checks against the log.
    pub fn time_entries(&self) -> impl Iterator<Item = (i64, Offset)> + '_ {
        self.times.iter().map(|&(t, r)| (t, Offset(self.base.0 + r as u64)))
    }

    /// Drops entries for batches at or after `position` / offsets at or after `offset`.
    pub fn truncate(&mut self, position: u64, offset: Offset) {
        self.offsets.retain(|&(_, p)| (p as u64) < position);
        let rel_limit = offset.0.saturating_sub(self.base.0);
        self.times.retain(|&(_, r)| (r as u64) < rel_limit);
        match self.times.last() {
            Some(&(t, r)) => {
                self.max_timestamp = t;
                self.offset_of_max_timestamp = Offset(self.base.0 + r as u64);
            }
            None => {
                self.max_timestamp = -1;
                self.offset_of_max_timestamp = self.base;
            }
        }
        // Index the next batch only after another full interval, as after a fresh start.
        self.bytes_since_entry = 0;
    }

    /// The whole `.index` file.
    pub fn encode_offsets(&self) -> Vec<u8> {
        self.offset_bytes(0, self.offsets.len())
    }

    /// The whole `.timeindex` file.
    pub fn encode_times(&self) -> Vec<u8> {
        self.time_bytes(0, self.times.len())
    }

    /// How many leading entries of each index (offset, time) describe batches wholly below `durable`:
    /// those whose bytes are on disk.
    pub fn durable_entries(&self, durable: Offset) -> (usize, usize) {
        let rel = durable.0.saturating_sub(self.base.0);
        (
            self.offsets.partition_point(|&(r, _)| (r as u64) < rel),
            self.times.partition_point(|&(_, r)| (r as u64) < rel),
        )
    }

    /// The `.index` file's bytes from byte `from` to the end of entry `upto` (exclusive).
    pub fn offset_bytes(&self, from: usize, upto: usize) -> Vec<u8> {
        let first = from / OFFSET_ENTRY_BYTES;
        let mut out = Vec::with_capacity((upto.saturating_sub(first)) * OFFSET_ENTRY_BYTES);
        for &(r, p) in &self.offsets[first.min(upto)..upto] {
            out.extend_from_slice(&r.to_be_bytes());
            out.extend_from_slice(&p.to_be_bytes());
        }
        out.split_off(from - first * OFFSET_ENTRY_BYTES)
    }

    /// The `.timeindex` file's bytes from byte `from` to the end of entry `upto` (exclusive).
    pub fn time_bytes(&self, from: usize, upto: usize) -> Vec<u8> {
        let first = from / TIME_ENTRY_BYTES;
        let mut out = Vec::with_capacity((upto.saturating_sub(first)) * TIME_ENTRY_BYTES);
        for &(t, r) in &self.times[first.min(upto)..upto] {
            out.extend_from_slice(&t.to_be_bytes());
            out.extend_from_slice(&r.to_be_bytes());
        }
        out.split_off(from - first * TIME_ENTRY_BYTES)
    }

    /// Rebuilds an index from its files, checking that entries increase, stay inside a segment of
    /// `segment_bytes` bytes and below `next_offset`. `None` means the files cannot be trusted.
    pub fn decode(
        base: Offset,
        offsets: &[u8],
        times: &[u8],
        segment_bytes: u64,
        next_offset: Offset,
    ) -> Option<SegmentIndex> {
        if !offsets.len().is_multiple_of(OFFSET_ENTRY_BYTES) || !times.len().is_multiple_of(TIME_ENTRY_BYTES) {
            return None;
        }
        let rel_limit = next_offset.0.checked_sub(base.0)?;
        let mut index = SegmentIndex::new(base);
        for e in offsets.chunks_exact(OFFSET_ENTRY_BYTES) {
            let r = u32::from_be_bytes(e[0..4].try_into().ok()?);
            let p = u32::from_be_bytes(e[4..8].try_into().ok()?);
            let increasing = index.offsets.last().is_none_or(|&(lr, lp)| r > lr && p > lp);
            if !increasing || r as u64 >= rel_limit || p as u64 >= segment_bytes {
                return None;
            }
            index.offsets.push((r, p));
        }
        for e in times.chunks_exact(TIME_ENTRY_BYTES) {
            let t = i64::from_be_bytes(e[0..8].try_into().ok()?);
            let r = u32::from_be_bytes(e[8..12].try_into().ok()?);
            let increasing = index.times.last().is_none_or(|&(lt, lr)| t > lt && r >= lr);
            if !increasing || r as u64 >= rel_limit {
                return None;
            }
            index.times.push((t, r));
        }
        if let Some(&(t, r)) = index.times.last() {
            index.max_timestamp = t;
            index.offset_of_max_timestamp = Offset(base.0 + r as u64);
        }
        Some(index)
    }

    /// Restores the running state after loading from files: the batch at `position` (the last indexed
    /// one) starts a new interval.
    pub fn resume_at(&mut self, position: u64) {
        let last_entry_pos = self.offsets.last().map_or(0, |&(_, p)| p as u64);
        debug_assert!(position >= last_entry_pos);
        self.bytes_since_entry = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(position: u64, size: u64, base: u64, last: u64, ts: i64) -> BatchMeta {
        BatchMeta { position, size, base_offset: Offset(base), last_offset: Offset(last), max_timestamp: ts, epoch: 0 }
    }

    #[test]
    fn sparse_entries_every_interval_and_lookups() {
        let mut idx = SegmentIndex::new(Offset(100));
        let mut pos = 0;
        for i in 0..10u64 {
            idx.on_batch(&meta(pos, 1000, 100 + i * 5, 104 + i * 5, 1000 + i as i64), 1500);
            pos += 1000;
        }
        // Entries are added before batches 2, 4, 6, 8 (after more than 1500 bytes each time).
        assert_eq!(idx.entry_count(), (4, 4));
        assert_eq!(idx.position_for(Offset(99)), 0);
        assert_eq!(idx.position_for(Offset(114)), 2000);
        assert_eq!(idx.position_for(Offset(113)), 0);
        assert_eq!(idx.position_for(Offset(150)), 8000);
        assert_eq!(idx.offset_for_timestamp(1004), Offset(114));
        assert_eq!(idx.offset_for_timestamp(0), Offset(100));
        let decoded =
            SegmentIndex::decode(Offset(100), &idx.encode_offsets(), &idx.encode_times(), 10_000, Offset(150));
        assert_eq!(decoded.as_ref().map(|d| d.entry_count()), Some((4, 4)));
        assert!(SegmentIndex::decode(Offset(100), &idx.encode_offsets(), &[], 5_000, Offset(150)).is_none());
        assert!(SegmentIndex::decode(Offset(100), &idx.encode_offsets()[..7], &[], 10_000, Offset(150)).is_none());
        // Entries for batches below a durable offset, and file bytes from any position.
        assert_eq!(idx.durable_entries(Offset(100)), (0, 0));
        assert_eq!(idx.durable_entries(Offset(120)), (1, 1), "the indexed batch ending at 114");
        assert_eq!(idx.durable_entries(Offset(125)), (2, 2), "and the one ending at 124");
        assert_eq!(idx.durable_entries(Offset(1000)), (4, 4));
        assert_eq!(idx.offset_bytes(0, 4), idx.encode_offsets());
        assert_eq!(idx.offset_bytes(13, 3), idx.encode_offsets()[13..24].to_vec());
        assert_eq!(idx.time_bytes(0, 4), idx.encode_times());
        assert_eq!(idx.time_bytes(17, 4), idx.encode_times()[17..].to_vec());
        idx.truncate(4000, Offset(120));
        assert_eq!(idx.entry_count(), (1, 1));
        assert_eq!(idx.max_timestamp(), 1002);
    }
}
