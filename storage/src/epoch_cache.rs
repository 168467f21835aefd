//! The leader-epoch cache: which leader epoch wrote which range of offsets.
//!
//! An entry `(epoch, start offset)` says that epoch's leader wrote from that offset on, until the next
//! entry's start. Followers ask the leader for "the end offset of epoch E" (Kafka's OffsetForLeaderEpoch)
//! and truncate to it, instead of to their high watermark, which is what fixes the data loss and replica
//! divergence KIP-101 and KIP-279 describe. This module is pure bookkeeping; the log persists it.

use std::path::Path;

use crate::checkpoint;
use crate::error::{Result, StorageError};
use crate::types::{LeaderEpoch, Offset};

/// One epoch's first offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EpochEntry {
    pub epoch: LeaderEpoch,
    pub start_offset: Offset,
}

/// Epochs in increasing order with increasing start offsets.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaderEpochCache {
    entries: Vec<EpochEntry>,
}

impl LeaderEpochCache {
    pub fn entries(&self) -> &[EpochEntry] {
        &self.entries
    }

    pub fn latest(&self) -> Option<EpochEntry> {
        self.entries.last().copied()
    }

    /// Records that `epoch` starts writing at `start_offset`. Returns whether the cache changed.
    ///
    /// An epoch equal to the latest is already recorded; an older epoch is a caller bug (the log refuses
    /// stale epochs before calling this).
    pub fn assign(&mut self, epoch: LeaderEpoch, start_offset: Offset) -> bool {
        assert!(epoch.0 >= 0, "cannot record undefined epoch");
        if let Some(last) = self.entries.last() {
            if epoch == last.epoch {
                return false;
            }
            assert!(epoch > last.epoch, "epoch {epoch} older than latest {}", last.epoch);
            assert!(start_offset >= last.start_offset, "epoch {epoch} starts before the previous epoch");
            if start_offset == last.start_offset {
                // The previous epoch wrote nothing; the new one supersedes it.
                self.entries.pop();
            }
        }
        self.entries.push(EpochEntry { epoch, start_offset });
        true
    }

    /// Kafka's `endOffsetFor`: the largest epoch not above `requested` and the offset where it ended
    /// (the next epoch's start, or `log_end` for the latest epoch). `None` means undefined.
    pub fn end_offset_for(&self, requested: LeaderEpoch, log_end: Offset) -> Option<(LeaderEpoch, Offset)> {
        if requested.0 < 0 {
            return None;
        }
        let latest = self.latest()?;
        if requested == latest.epoch {
            return Some((latest.epoch, log_end));
        }
        let higher = self.entries.iter().position(|e| e.epoch > requested)?;
        let end = self.entries[higher].start_offset;
        match higher.checked_sub(1) {
            Some(floor) => Some((self.entries[floor].epoch, end)),
            // Every recorded epoch is newer: the requested one ended where the oldest known begins.
            None => Some((requested, end)),
        }
    }

    /// Drops every entry starting at or after `offset` (the log was truncated to `offset`).
    pub fn truncate_from_end(&mut self, offset: Offset) -> bool {
        let before = self.entries.len();
        self.entries.retain(|e| e.start_offset < offset);
        before != self.entries.len()
    }

    /// The log now starts at `offset`: entries wholly before it go, and the one covering it starts there.
    pub fn truncate_from_start(&mut self, offset: Offset) -> bool {
        let covering = self.entries.iter().rposition(|e| e.start_offset <= offset);
        let Some(keep_from) = covering else { return false };
        let changed = keep_from > 0 || self.entries[keep_from].start_offset != offset;
        self.entries.drain(..keep_from);
        self.entries[0].start_offset = offset;
        changed
    }

    /// Keeps only what describes offsets in `[log_start, log_end)`: an epoch that wrote nothing still in the
    /// log is not recorded. Returns whether the cache changed.
    pub fn clamp(&mut self, log_start: Offset, log_end: Offset) -> bool {
        let a = self.truncate_from_start(log_start);
        let b = self.truncate_from_end(log_end);
        a || b
    }

    /// The file body (`leader-epoch-checkpoint`).
    pub fn encode(&self) -> String {
        checkpoint::format_lines(self.entries.iter().map(|e| format!("{} {}", e.epoch.0, e.start_offset.0)))
    }

    /// Parses a file body, refusing entries that are out of order.
    pub fn decode(path: &Path, text: &str) -> Result<LeaderEpochCache> {
        let corrupt = |detail: String| StorageError::CorruptFile { path: path.into(), detail };
        let mut cache = LeaderEpochCache::default();
        for line in checkpoint::parse_lines(path, text)? {
            let (epoch, offset) = line.split_once(' ').ok_or_else(|| corrupt(format!("bad entry {line:?}")))?;
            let epoch: i32 = epoch.parse().map_err(|_| corrupt(format!("bad epoch in {line:?}")))?;
            let offset: u64 = offset.parse().map_err(|_| corrupt(format!("bad offset in {line:?}")))?;
            if let Some(last) = cache.latest()
                && (epoch <= last.epoch.0 || offset < last.start_offset.0)
            {
                return Err(corrupt(format!("entry {line:?} is not after {last:?}")));
            }
            if epoch < 0 {
                return Err(corrupt(format!("negative epoch in {line:?}")));
            }
            cache.entries.push(EpochEntry { epoch: LeaderEpoch(epoch), start_offset: Offset(offset) });
        }
        Ok(cache)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cache(entries: &[(i32, u64)]) -> LeaderEpochCache {
        let mut c = LeaderEpochCache::default();
        for &(e, o) in entries {
            c.assign(LeaderEpoch(e), Offset(o));
        }
        c
    }

    #[test]
    fn end_offset_for_follows_kafka_rules() {
        let c = cache(&[(1, 0), (3, 10), (4, 25)]);
        let leo = Offset(40);
        assert_eq!(c.end_offset_for(LeaderEpoch(4), leo), Some((LeaderEpoch(4), leo)));
        assert_eq!(c.end_offset_for(LeaderEpoch(3), leo), Some((LeaderEpoch(3), Offset(25))));
        // Epoch 2 never wrote: the answer is the floor epoch 1 ending where 3 began.
        assert_eq!(c.end_offset_for(LeaderEpoch(2), leo), Some((LeaderEpoch(1), Offset(10))));
        assert_eq!(c.end_offset_for(LeaderEpoch(0), leo), Some((LeaderEpoch(0), Offset(0))));
        assert_eq!(c.end_offset_for(LeaderEpoch(9), leo), None);
        assert_eq!(c.end_offset_for(LeaderEpoch::UNDEFINED, leo), None);
        assert_eq!(LeaderEpochCache::default().end_offset_for(LeaderEpoch(0), leo), None);
    }

    #[test]
    fn truncation_from_both_ends() {
        let mut c = cache(&[(1, 0), (3, 10), (4, 25)]);
        assert!(c.truncate_from_end(Offset(25)));
        assert_eq!(c.latest(), Some(EpochEntry { epoch: LeaderEpoch(3), start_offset: Offset(10) }));
        assert!(c.truncate_from_start(Offset(12)));
        assert_eq!(c.entries(), &[EpochEntry { epoch: LeaderEpoch(3), start_offset: Offset(12) }]);
        assert!(!c.truncate_from_start(Offset(12)));
    }

    #[test]
    fn empty_epoch_is_superseded_and_file_round_trips() {
        let c = cache(&[(1, 0), (2, 5), (3, 5)]);
        assert_eq!(c.entries().len(), 2);
        let p = Path::new("/leader-epoch-checkpoint");
        assert_eq!(LeaderEpochCache::decode(p, &c.encode()).unwrap(), c);
        assert!(LeaderEpochCache::decode(p, "0\n2\n3 5\n1 0\n").is_err());
    }
}
