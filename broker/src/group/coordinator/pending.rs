//! A group's transactional offsets that are written but not yet committed (KIP-98, KIP-447): what a
//! TxnOffsetCommit wrote as part of a transaction whose COMMIT or ABORT marker has not reached the
//! offsets partition yet.
//!
//! Rules (Kafka's `OffsetMetadataManager`):
//! - Offsets written with a producer id wait here, per producer id, and are not shown by OffsetFetch;
//!   with `require_stable`, a partition with some waiting here answers UNSTABLE_OFFSET_COMMIT.
//! - A COMMIT marker of the producer at log offset `m` moves its offsets written before `m` into the
//!   committed ones, each only if no commit written after it is there already (log offsets decide, so
//!   the outcome is the same whether it is decided live or replayed, and after compaction). An ABORT
//!   drops them. Offsets the producer wrote after `m` (its next transaction) stay.
//! - A tombstone for a partition (OffsetDelete, DeleteGroups, expiry) drops the offsets waiting for it
//!   that were written before the tombstone.
//! - A group with offsets waiting here is not idle (it is not dropped), and their partitions do not
//!   expire.
//!
//! No I/O: both the coordinator and the replay of the partition use it.

use std::collections::BTreeMap;

use super::state::Stored;

/// A partition of a topic, as offsets are keyed.
pub(super) type OffsetKey = (String, i32);

/// The offsets waiting for their transaction's outcome, by producer id. See the module documentation.
#[derive(Debug, Default, Clone)]
pub(super) struct PendingTxns {
    by_producer: BTreeMap<i64, BTreeMap<OffsetKey, Stored>>,
}

impl PendingTxns {
    pub(super) fn is_empty(&self) -> bool {
        self.by_producer.is_empty()
    }

    /// An offset `producer` wrote in a transaction (a later write of it replaces an earlier one).
    pub(super) fn stage(&mut self, producer_id: i64, key: OffsetKey, stored: Stored) {
        assert!(producer_id >= 0, "transactional offsets carry a producer id");
        let offsets = self.by_producer.entry(producer_id).or_default();
        match offsets.get(&key) {
            Some(earlier) if earlier.at > stored.at => {}
            _ => {
                offsets.insert(key, stored);
            }
        }
    }

    /// Whether some producer has an offset waiting for the partition.
    pub(super) fn has(&self, key: &OffsetKey) -> bool {
        self.by_producer.values().any(|offsets| offsets.contains_key(key))
    }

    /// Every partition with an offset waiting, once each.
    pub(super) fn keys(&self) -> impl Iterator<Item = &OffsetKey> {
        let mut keys: Vec<&OffsetKey> = self.by_producer.values().flat_map(|offsets| offsets.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
    }

    /// A tombstone for `key` at log offset `at`: drops what was written for it before.
    pub(super) fn forget(&mut self, key: &OffsetKey, at: i64) {
        for offsets in self.by_producer.values_mut() {
            if offsets.get(key).is_some_and(|s| s.at < at) {
                offsets.remove(key);
            }
        }
        self.by_producer.retain(|_, offsets| !offsets.is_empty());
    }

    /// A marker of `producer_id` at log offset `marker_at`: takes out (to be committed or dropped) what
    /// the producer wrote before it.
    pub(super) fn end(&mut self, producer_id: i64, marker_at: i64) -> Vec<(OffsetKey, Stored)> {
        let Some(offsets) = self.by_producer.remove(&producer_id) else { return Vec::new() };
        let (ended, later): (Vec<_>, Vec<_>) = offsets.into_iter().partition(|(_, s)| s.at < marker_at);
        if !later.is_empty() {
            self.by_producer.insert(producer_id, later.into_iter().collect());
        }
        ended
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::records::CommittedOffset;

    fn stored(offset: i64, at: i64) -> Stored {
        let value = CommittedOffset { offset, leader_epoch: -1, metadata: String::new(), commit_timestamp_ms: 0 };
        Stored { value, at }
    }

    fn key(p: i32) -> OffsetKey {
        ("t".to_string(), p)
    }

    #[test]
    fn a_marker_ends_only_what_its_producer_wrote_before_it() {
        let mut pending = PendingTxns::default();
        pending.stage(7, key(0), stored(10, 3));
        pending.stage(7, key(0), stored(11, 5));
        pending.stage(7, key(1), stored(20, 9));
        pending.stage(8, key(0), stored(30, 4));
        assert!(pending.has(&key(0)) && pending.has(&key(1)));
        assert_eq!(pending.keys().cloned().collect::<Vec<_>>(), vec![key(0), key(1)]);

        let ended = pending.end(7, 6);
        assert_eq!(ended.len(), 1, "the write at 9 is of the producer's next transaction");
        assert_eq!((ended[0].0.clone(), ended[0].1.value.offset, ended[0].1.at), (key(0), 11, 5));
        assert!(pending.has(&key(1)), "still waiting");
        assert!(pending.has(&key(0)), "producer 8's offset is not ended by 7's marker");
        assert!(pending.end(9, 100).is_empty(), "a producer with nothing waiting");
        assert_eq!(pending.end(7, 10).len(), 1);
        assert_eq!(pending.end(8, 10).len(), 1);
        assert!(pending.is_empty());
    }

    #[test]
    fn a_tombstone_drops_only_the_offsets_written_before_it() {
        let mut pending = PendingTxns::default();
        pending.stage(7, key(0), stored(10, 3));
        pending.stage(8, key(0), stored(11, 8));
        pending.forget(&key(0), 5);
        assert!(pending.end(7, 100).is_empty(), "written before the tombstone");
        assert_eq!(pending.end(8, 100).len(), 1, "written after it");
        assert!(pending.is_empty());
    }
}
