//! The log's side of transactions (see [`crate::txn`] for the rules): appending the coordinator's
//! markers, the last stable offset, the aborted-transactions index of each segment, and read_committed
//! reads.
//!
//! Where the state lives:
//! - Open transactions and coordinator epochs: in the producer state ([`crate::producer_state`]), at the
//!   log end; in its snapshots; rebuilt with it (a replay meets markers and ends transactions as an append
//!   does).
//! - Transactions ended but whose marker is not yet below the high watermark (`Inner::completed_txns`):
//!   they hold the LSO back until the high watermark passes the marker, as Kafka's "unreplicated"
//!   transactions do, so that a read_committed consumer never reads a transaction's records before its
//!   marker is on every in-sync replica. Not in snapshots: after an open, those ended before the snapshot
//!   the state was rebuilt from are not known (the LSO may then pass their first offset up to the high
//!   watermark; their outcome is decided and their marker is in the log, so only that wait is lost).
//! - Aborted transactions: in the segment holding the marker (`Segment::aborted`), mirrored in its
//!   `.txnindex` file. A sealed segment's file is written whole when it is sealed (after its `.log` is
//!   synced, like the other index files, by atomic replacement), so it only describes durable batches;
//!   the active segment's entries are in memory until its seal. At open every file is read and checked
//!   ([`crate::txn::index::decode`]); the replay of the producer state from its snapshot rebuilds the
//!   entries of every marker it meets, replacing what the files said from the replay's start on; a file
//!   that does not check makes the replay start at or below its segment, and is then written again.
//!
//! - Verification guards (KIP-890, [`crate::producer_state::verification`]): in the producer state, in
//!   memory only. [`PartitionLog::begin_verification`] hands one out before the coordinator is asked;
//!   [`PartitionLog::append_guarded`] judges the guard in the same borrow that assigns the offsets, so no
//!   marker can land between the judgement and the append.
//!
//! The LSO changes only when the high watermark, the log start, or the end of the log (a truncation)
//! does: a marker at the log end ends a transaction that still holds the LSO (its marker is at or above
//! the high watermark), and a new transaction starts at or above the high watermark. Each of those bumps
//! [`LogNews`](super::LogNews), so fetches held for news see the LSO move too.

use crate::durable;
use crate::error::Result;
use crate::fs::Fs;
use crate::producer_state::{CompletedTxn, VerificationGuard};
use crate::txn::index::{self, AbortedRange, AbortedTxn};
use crate::txn::{MarkerKind, TxnMarker};
use crate::types::{LeaderEpoch, Offset};

use super::index_files::remove_files;
use super::{AppendInfo, Inner, LogRead, PartitionLog};

/// Which records a reader may see (Kafka's `isolation.level`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Isolation {
    /// Everything below the high watermark.
    #[default]
    ReadUncommitted,
    /// Everything below the last stable offset, with the aborted transactions to drop.
    ReadCommitted,
}

/// A read_committed read: the batches below the last stable offset, byte for byte as stored (aborted
/// records included), and the aborted transactions that overlap them, which the consumer drops.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CommittedRead {
    pub read: LogRead,
    pub aborted: Vec<AbortedRange>,
}

/// The most bytes a `.txnindex` file can take: one entry per marker, and no marker is smaller than 64
/// bytes.
fn max_txn_index_bytes(segment_bytes: u64) -> u64 {
    (segment_bytes / 64 + 1) * index::ENTRY_BYTES as u64
}

impl<F: Fs> Inner<F> {
    /// The first offset of the earliest transaction not yet decided below the high watermark.
    pub(super) fn first_unstable(&self) -> Option<Offset> {
        let hw = self.high_watermark;
        let completed = self.completed_txns.iter().filter(|t| t.last_offset >= hw).map(|t| t.first_offset).min();
        let first = match (self.producers.first_open_txn(), completed) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        first.map(|f| f.max(self.log_start))
    }

    pub(super) fn last_stable(&self) -> Offset {
        let hw = self.high_watermark;
        self.first_unstable().map_or(hw, |f| f.min(hw)).max(self.log_start)
    }

    /// Takes note of a transaction a marker at the log end (appended, or met by a replay) ended.
    pub(super) fn note_completed(&mut self, done: CompletedTxn) {
        if done.kind == MarkerKind::Abort {
            let at = self.segment_for(done.last_offset);
            let segment = &mut self.segments[at];
            assert!(
                segment.aborted.last().is_none_or(|e| e.last_offset < done.last_offset),
                "aborted transactions out of order in segment {}",
                segment.base
            );
            segment.aborted.push(AbortedTxn {
                producer_id: done.producer_id,
                first_offset: done.first_offset,
                last_offset: done.last_offset,
                last_stable_offset: done.last_stable_offset,
            });
        }
        if done.last_offset >= self.high_watermark {
            self.completed_txns.push(done);
        }
    }
}

impl<F: Fs> PartitionLog<F> {
    /// Appends a transaction marker as the leader at `epoch`: the control batch Kafka writes for
    /// WriteTxnMarkers (see [`crate::txn::marker`]). Refused with [`crate::producer_state::ProducerError`]
    /// `StaleMarkerEpoch` (INVALID_PRODUCER_EPOCH, as Kafka's leaders answer) for an epoch older than the producer's, and
    /// `CoordinatorFenced` (TRANSACTION_COORDINATOR_FENCED) for a coordinator epoch older than the last
    /// one seen for the producer. A marker for a producer without an open transaction is appended all
    /// the same.
    pub async fn append_marker(&self, marker: TxnMarker, epoch: LeaderEpoch) -> Result<AppendInfo> {
        let bytes = marker.encode(self.clock.now_ms());
        let header = crate::batch::validate(&bytes, usize::MAX).expect("a marker is a valid batch");
        self.append_validated(&bytes, &header, Some(epoch), super::Writer::Marker(marker)).await
    }

    /// Starts KIP-890's verification of a transactional batch of `producer_id` at `producer_epoch`, to be
    /// called before its coordinator is asked: `None` when the producer's transaction is open here at that
    /// epoch (the coordinator need not be asked), otherwise the guard to append it with
    /// ([`Self::append_guarded`]).
    pub fn begin_verification(&self, producer_id: i64, producer_epoch: i16) -> Option<VerificationGuard> {
        let now = self.clock.now_ms();
        self.inner.borrow_mut().producers.begin_verification(producer_id, producer_epoch, now)
    }

    /// Forgets every verification guard (the partition stopped being led here, or is led at a new epoch):
    /// the appends they were for are refused by their leader epoch anyway.
    pub fn drop_verification_guards(&self) {
        self.inner.borrow_mut().producers.drop_verification_guards();
    }

    /// Appends a client's batch as [`Self::append`] does, holding it to KIP-890's rule: a transactional
    /// batch that would open a transaction here (its producer has none open at its epoch) must present
    /// `guard`, the one [`Self::begin_verification`] gave before its coordinator was asked, still held by
    /// the producer; a marker for the producer since takes it away. Otherwise it is refused with
    /// [`crate::producer_state::ProducerError::Unverified`], and the log is unchanged. A batch going on
    /// with its producer's open transaction needs no guard.
    pub async fn append_guarded(
        &self,
        batch: &[u8],
        epoch: LeaderEpoch,
        guard: Option<VerificationGuard>,
    ) -> Result<AppendInfo> {
        self.append_from_client(batch, epoch, super::Writer::Guarded(guard)).await
    }

    /// Kafka's last stable offset: the high watermark, held back by the first offset of every open
    /// transaction and of every transaction whose marker is not yet below the high watermark; never
    /// below the log start. Where read_committed reads stop.
    pub fn last_stable_offset(&self) -> Offset {
        self.inner.borrow().last_stable()
    }

    /// The first offset of the earliest transaction open or not yet decided below the high watermark
    /// (at least the log start); `None` when there is none.
    pub fn first_unstable_offset(&self) -> Option<Offset> {
        self.inner.borrow().first_unstable()
    }

    /// ListOffsets' "latest" for a reader at `isolation`: the high watermark, or the last stable offset.
    pub fn latest_offset(&self, isolation: Isolation) -> Offset {
        match isolation {
            Isolation::ReadUncommitted => self.high_watermark(),
            Isolation::ReadCommitted => self.last_stable_offset(),
        }
    }

    /// A read_committed read from `from`: like [`PartitionLog::read_until`] the last stable offset, with
    /// the aborted transactions overlapping what it returns (Kafka's `collectAbortedTransactions`). The
    /// bytes are not filtered: the consumer drops the aborted records, as Kafka's do.
    pub async fn read_committed(&self, from: Offset, max_bytes: usize) -> Result<CommittedRead> {
        let lso = self.last_stable_offset();
        let read = self.read_until(from, max_bytes, lso).await?;
        let aborted = if read.bytes.is_empty() { Vec::new() } else { self.aborted_txns(from, read.next_offset) };
        Ok(CommittedRead { read, aborted })
    }

    /// The aborted transactions with records in `[from, upto)`, by marker offset: from the `.txnindex`
    /// entries of the segment holding `from` and those after it (the active segment's too), as far as
    /// needed.
    pub fn aborted_txns(&self, from: Offset, upto: Offset) -> Vec<AbortedRange> {
        let inner = self.inner.borrow();
        let mut out = Vec::new();
        for segment in &inner.segments[inner.segment_for(from)..] {
            if index::collect_overlapping(&segment.aborted, from, upto, &mut out) {
                break;
            }
        }
        out
    }

    /// Every aborted transaction the log's segments hold, oldest first (for tests and tools).
    pub fn aborted_index(&self) -> Vec<AbortedTxn> {
        self.inner.borrow().segments.iter().flat_map(|s| s.aborted.iter().copied()).collect()
    }

    /// Writes the `.txnindex` file of segment `seg_idx` whole from its entries, or removes it when it has
    /// none; durably. With the `io` lock, after the batches it describes are synced.
    pub(super) async fn persist_txn_index_locked(&self, seg_idx: usize) -> Result<()> {
        let (path, bytes) = {
            let inner = self.inner.borrow();
            let segment = &inner.segments[seg_idx];
            (segment.txn_index_path(), index::encode(&segment.aborted))
        };
        if bytes.is_empty() {
            remove_files(&self.fs, &[path], &self.dir).await;
            Ok(())
        } else {
            durable::replace_file(&self.fs, &path, &bytes).await
        }
    }

    /// Reads every segment's `.txnindex` file (at open). Returns the base of the first segment whose file
    /// does not check, whose entries the producer state's replay must rebuild.
    pub(super) async fn load_txn_indexes(&self) -> Result<Option<Offset>> {
        let count = self.segment_count();
        let mut first_bad = None;
        for seg_idx in 0..count {
            let (path, base, end, bound) = {
                let inner = self.inner.borrow();
                let s = &inner.segments[seg_idx];
                (s.txn_index_path(), s.base, s.next_offset, max_txn_index_bytes(s.size))
            };
            let loaded = match durable::read_file(&self.fs, &path, bound).await {
                Ok(None) => Ok(Vec::new()),
                Ok(Some(bytes)) => index::decode(&bytes, base, end),
                Err(e) => Err(e.to_string()),
            };
            match loaded {
                Ok(entries) => self.inner.borrow_mut().segments[seg_idx].aborted = entries,
                Err(reason) => {
                    tracing::warn!(path = %path.display(), %reason, "aborted-transactions index unreadable; rebuilt from the log");
                    first_bad.get_or_insert(base);
                }
            }
        }
        Ok(first_bad)
    }

    /// After a replay rebuilt the entries from `from` on (at open, for files that did not check): writes
    /// the files of the sealed segments it touched.
    pub(super) async fn rewrite_txn_indexes_locked(&self, from: Offset) -> Result<()> {
        let count = self.segment_count();
        for seg_idx in 0..count - 1 {
            if self.inner.borrow().segments[seg_idx].next_offset > from {
                self.persist_txn_index_locked(seg_idx).await?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_segment_of_the_smallest_markers_fits_the_bound() {
        let smallest = TxnMarker { kind: MarkerKind::Abort, producer_id: 0, producer_epoch: 0, coordinator_epoch: 0 }
            .encode(0)
            .len() as u64;
        assert!(smallest >= 64);
        let segment_bytes = 1 << 30;
        assert!(max_txn_index_bytes(segment_bytes) >= segment_bytes / smallest * index::ENTRY_BYTES as u64);
    }
}
