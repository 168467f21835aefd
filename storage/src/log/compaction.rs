//! Log compaction's storage half: the log hands its closed segments to a cleaner (the broker's, which
//! knows records and keys), takes back a cleaned segment that replaces a run of them, and swaps it in so
//! that a crash at any moment leaves either the old segments or the new one.
//!
//! What a cleaned segment must be (the cleaner's side of the bargain, checked here):
//! - its batches are stored batches of the segments it replaces, in order, each keeping its base offset,
//!   last offset delta, producer fields and leader epoch (records may be removed from inside a batch, and
//!   whole batches left out: offsets are never reused, the log has gaps instead);
//! - its last batch is the last batch of the last segment it replaces (possibly emptied of records), so the
//!   cleaned segment ends exactly where the next segment begins and recovery's checks between segments
//!   stay as strict as before;
//! - it spans less than half the u32 range of offsets (the index stores offsets relative to the base).
//!
//! The swap, under the `io` lock: the cleaned segment's aborted transactions (the run's whose ABORT
//! marker it kept) are written to `<base>.txnindex.cleaned`, `<base>.cleaned` (written and synced outside
//! the lock) is renamed `<base>.swap` (the commit point), the replaced segments' files are removed (but
//! the first one's log file), the index files take their names, and the swap file is renamed over
//! `<base>.log`. Segments are offered only below the last stable offset (`super::txn`). Opening a
//! directory with a `.swap` file finishes the swap (see [`finish_swap`]); a `.cleaned` file is removed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;

use crate::batch::{self, BatchHeader, HEADER_BYTES};
use crate::durable;
use crate::error::{Result, StorageError};
use crate::fatal;
use crate::fs::{Fs, SegmentFile, align_down};
use crate::segment::index::{BatchMeta, SegmentIndex};
use crate::segment::{self, Segment};
use crate::types::Offset;

use super::PartitionLog;
use super::maintenance::write_index_files;

/// A cleaned segment being written.
pub const CLEANED_SUFFIX: &str = ".cleaned";
/// A cleaned segment that replaces the segments from its base to its end (see the module docs).
pub const SWAP_SUFFIX: &str = ".swap";
/// The offset below which the log was last cleaned (for the dirty ratio), in the partition directory.
pub const CLEANER_CHECKPOINT_FILE: &str = "cleaner-offset-checkpoint";
/// Bytes a cleaned segment gathers in memory before they are written.
const WRITE_CHUNK_BYTES: usize = 1 << 20;
/// The most offsets a cleaned segment may span (the index's relative offsets are u32).
pub const MAX_CLEANED_SPAN: u64 = u32::MAX as u64 / 2;

/// A closed segment as the cleaner sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClosedSegment {
    pub base: Offset,
    /// The offset after the segment (the next segment's base).
    pub next_offset: Offset,
    pub size: u64,
    /// The largest record timestamp in it (-1 when unknown).
    pub max_timestamp: i64,
}

/// A cleaned segment being written (see [`PartitionLog::start_cleaned`]).
#[derive(Debug)]
pub struct CleanedSegment<F: Fs> {
    path: PathBuf,
    file: F::File,
    base: Offset,
    index: SegmentIndex,
    interval: u64,
    /// Bytes not yet written; they start at file position `flushed` (a multiple of [`ALIGN`]).
    pending: Vec<u8>,
    flushed: u64,
    size: u64,
    next_offset: Option<Offset>,
    /// The offsets of the control batches pushed, in order: the markers the cleaned segment keeps.
    markers: Vec<Offset>,
}

impl<F: Fs> CleanedSegment<F> {
    /// Adds a stored batch (see the module docs for what it must be).
    pub async fn push(&mut self, bytes: &[u8]) -> Result<()> {
        let header = batch::validate_stored(bytes, i32::MAX as usize)?;
        let base = Offset(u64::try_from(header.base_offset).map_err(|_| self.misfit("a negative base offset"))?);
        if base < self.next_offset.unwrap_or(self.base) {
            return Err(self.misfit("batches out of offset order"));
        }
        let last = base.plus(header.last_offset_delta as u64);
        if last.0 - self.base.0 >= MAX_CLEANED_SPAN {
            return Err(self.misfit("more offsets than a segment can index"));
        }
        let meta = BatchMeta {
            position: self.size,
            size: bytes.len() as u64,
            base_offset: base,
            last_offset: last,
            max_timestamp: header.max_timestamp,
            epoch: header.partition_leader_epoch,
        };
        self.index.on_batch(&meta, self.interval);
        if header.attributes & crate::txn::marker::CONTROL_BIT != 0 {
            self.markers.push(base);
        }
        self.pending.extend_from_slice(bytes);
        self.size += bytes.len() as u64;
        self.next_offset = Some(last.plus(1));
        if self.pending.len() >= WRITE_CHUNK_BYTES {
            let whole = align_down(self.pending.len() as u64) as usize;
            durable::write_blocks(&self.file, &self.path, self.flushed, &self.pending[..whole]).await?;
            self.pending.drain(..whole);
            self.flushed += whole as u64;
        }
        Ok(())
    }

    /// Bytes of batches pushed so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn misfit(&self, what: &str) -> StorageError {
        StorageError::CorruptFile { path: self.path.clone(), detail: format!("cleaned segment: {what}") }
    }

    /// Writes what is pending, cuts the file to its batches and syncs it, and writes its index files
    /// beside it (`<base>.index.cleaned`, `<base>.timeindex.cleaned`), so the swap only renames them.
    async fn finish(&mut self, fs: &F) -> Result<()> {
        durable::write_blocks(&self.file, &self.path, self.flushed, &self.pending).await?;
        self.flushed += self.pending.len() as u64;
        self.pending = Vec::new();
        if let Err(e) = self.file.truncate(self.size).await {
            fatal::disk_failure("truncate", &self.path, &e);
        }
        if let Err(e) = self.file.fdatasync().await {
            fatal::disk_failure("fdatasync", &self.path, &e);
        }
        self.index.seal();
        let [offsets, times] = self.index_paths();
        write_index_files(fs, &self.index, &offsets, &times).await
    }

    /// Where the swap writes the cleaned segment's `.txnindex` before it commits.
    fn txn_index_path(&self) -> PathBuf {
        cleaned_txn_index_path(&self.path, self.base)
    }

    /// Where [`Self::finish`] writes the index files.
    fn index_paths(&self) -> [PathBuf; 2] {
        [segment::INDEX_SUFFIX, segment::TIME_INDEX_SUFFIX].map(|suffix| {
            self.path.with_file_name(format!("{}{CLEANED_SUFFIX}", segment::file_name(self.base, suffix)))
        })
    }

    /// Gives up on the cleaned segment: its file is removed. Already gone is fine: the log was deleted
    /// or set aside meanwhile, its directory with it.
    async fn abandon(self, fs: &F) {
        let paths = self.index_paths();
        let txn_index = self.txn_index_path();
        drop(self.file);
        for path in [self.path, txn_index].iter().chain(&paths) {
            if let Err(e) = fs.remove(path).await
                && e.kind() != std::io::ErrorKind::NotFound
            {
                fatal::disk_failure("remove", path, &e);
            }
        }
    }
}

impl<F: Fs> PartitionLog<F> {
    /// The segments a cleaner may rewrite, oldest first: every one but the active segment, as far as they
    /// lie wholly below the last stable offset (what is above the high watermark may still be cut by a
    /// new leader, and a transaction not yet decided must not be cleaned: Kafka never cleans at or past
    /// the first unstable offset).
    pub fn closed_segments(&self) -> Vec<ClosedSegment> {
        let inner = self.inner.borrow();
        let n = inner.segments.len();
        let stable = inner.last_stable();
        inner.segments[..n - 1]
            .iter()
            .take_while(|s| s.next_offset <= stable)
            .map(|s| ClosedSegment {
                base: s.base,
                next_offset: s.next_offset,
                size: s.size,
                max_timestamp: s.index.max_timestamp(),
            })
            .collect()
    }

    /// How many times the end of the log was cut (truncations, deletion): a cleaning pass that began
    /// before a cut must not swap in what it made of the bytes that were there.
    pub fn end_cuts(&self) -> u64 {
        self.inner.borrow().end_cuts
    }

    /// The offset below which the log was last cleaned (its log start if it never was).
    pub fn cleaned_upto(&self) -> Offset {
        let inner = self.inner.borrow();
        inner.cleaned_upto.max(inner.log_start)
    }

    /// Each idempotent producer the log remembers, with the last offset of its latest batch: compaction
    /// keeps that batch (emptied if need be), since the producer's state is rebuilt from it.
    pub fn producer_last_offsets(&self) -> HashMap<i64, Offset> {
        self.inner.borrow().producers.last_batches().collect()
    }

    /// Writes the offset the log is cleaned up to into [`CLEANER_CHECKPOINT_FILE`] (after a pass: it
    /// only spares the next process a pass that finds the whole log dirty).
    pub async fn checkpoint_cleaned(&self) -> Result<()> {
        let _maintenance = self.maintenance.lock().await;
        self.check_open()?;
        let upto = self.inner.borrow().cleaned_upto;
        durable::replace_file(&self.fs, &self.dir.join(CLEANER_CHECKPOINT_FILE), upto.0.to_string().as_bytes()).await
    }

    /// Whole stored batches of the closed segment starting at `base`, from byte `pos` on, about
    /// `max_bytes` of them (at least one batch), each checked against its CRC32C. Empty at the segment's
    /// end; `None` when the segment is no longer the log's (retention or a cut removed it, or another
    /// cleaning replaced it).
    pub async fn read_closed_segment(&self, base: Offset, pos: u64, max_bytes: usize) -> Result<Option<Bytes>> {
        self.check_open()?;
        let generation = self.inner.borrow().generation;
        let Some((seg_idx, size)) = self.closed_segment_index(base) else { return Ok(None) };
        if pos >= size {
            return Ok(Some(Bytes::new()));
        }
        let want = (max_bytes.max(HEADER_BYTES) as u64).min(size - pos);
        let read = self.read_closed_chunk(seg_idx, pos, want, size).await;
        if self.inner.borrow().generation != generation {
            // Bytes were removed (or segments swapped) while this read waited: what it got, or failed on,
            // may be stale.
            return Ok(None);
        }
        match read {
            Err(StorageError::Damaged { path, position, offset, reason }) => {
                Err(self.damaged_at(path, position, offset, reason).await)
            }
            other => other.map(Some),
        }
    }

    /// Whole batches of segment `seg_idx` (`size` bytes) from `pos`, about `want` bytes, CRC-checked.
    async fn read_closed_chunk(&self, seg_idx: usize, pos: u64, want: u64, size: u64) -> Result<Bytes> {
        let mut chunk = self.read_segment_range(seg_idx, pos, want).await?;
        let mut taken = 0usize;
        loop {
            if chunk.len() - taken < HEADER_BYTES {
                break;
            }
            let header = BatchHeader::parse(&chunk[taken..]).expect("a whole header");
            let total = header.total_bytes();
            if total < HEADER_BYTES || pos + (taken + total) as u64 > size {
                return Err(StorageError::Damaged {
                    path: self.segment_path(seg_idx),
                    position: pos + taken as u64,
                    offset: Offset(header.base_offset.max(0) as u64),
                    reason: format!("stored batch claims {total} bytes"),
                });
            }
            if chunk.len() - taken < total {
                if taken > 0 {
                    break;
                }
                // A first batch larger than asked for: read it whole.
                chunk = self.read_segment_range(seg_idx, pos, total as u64).await?;
                continue;
            }
            if batch::compute_crc(&chunk[taken..taken + total]) != header.crc {
                return Err(StorageError::Damaged {
                    path: self.segment_path(seg_idx),
                    position: pos + taken as u64,
                    offset: Offset(header.base_offset.max(0) as u64),
                    reason: "CRC32C does not match the batch".into(),
                });
            }
            taken += total;
        }
        Ok(chunk.slice(..taken))
    }

    /// The index and size of the closed segment at `base`, if it is one.
    fn closed_segment_index(&self, base: Offset) -> Option<(usize, u64)> {
        let inner = self.inner.borrow();
        let n = inner.segments.len();
        inner.segments[..n - 1].iter().position(|s| s.base == base).map(|i| (i, inner.segments[i].size))
    }

    /// Gives up on a cleaned segment: its file is removed.
    pub async fn abandon_cleaned(&self, cleaned: CleanedSegment<F>) {
        cleaned.abandon(&self.fs).await
    }

    /// Starts a cleaned segment with base offset `base` (the base of the first segment it replaces).
    pub async fn start_cleaned(&self, base: Offset) -> Result<CleanedSegment<F>> {
        self.check_open()?;
        let path = self.dir.join(segment::file_name(base, CLEANED_SUFFIX));
        let file = self.fs.open(&path, true).await.map_err(|e| StorageError::io("create", &path, e))?;
        if let Err(e) = file.truncate(0).await {
            fatal::disk_failure("truncate", &path, &e);
        }
        let interval = self.inner.borrow().config.index_interval_bytes;
        Ok(CleanedSegment {
            path,
            file,
            base,
            index: SegmentIndex::new(base),
            interval,
            pending: Vec::new(),
            flushed: 0,
            size: 0,
            next_offset: None,
            markers: Vec::new(),
        })
    }

    /// Replaces the closed segments `replaced` (consecutive, as [`Self::closed_segments`] gave them, the
    /// first at the cleaned segment's base) with `cleaned`, durably, and records (in memory: see
    /// [`Self::checkpoint_cleaned`]) that the log is cleaned up to `cleaned_upto`. `end_cuts`: [`Self::end_cuts`] when the pass began. Returns false, and
    /// removes the cleaned file, when the segments changed meanwhile (retention, a cut, or another
    /// cleaning got to them first).
    pub async fn swap_in_cleaned(
        &self,
        mut cleaned: CleanedSegment<F>,
        replaced: &[ClosedSegment],
        cleaned_upto: Offset,
        end_cuts: u64,
    ) -> Result<bool> {
        let (Some(first), Some(last)) = (replaced.first(), replaced.last()) else {
            cleaned.abandon(&self.fs).await;
            return Ok(false);
        };
        if first.base != cleaned.base || cleaned.next_offset != Some(last.next_offset) {
            let detail = format!(
                "cleaned segment at {} ending at {:?} does not replace segments {}..{}",
                cleaned.base, cleaned.next_offset, first.base, last.next_offset
            );
            cleaned.abandon(&self.fs).await;
            return Err(StorageError::CorruptFile { path: self.dir.clone(), detail });
        }
        if let Err(e) = cleaned.finish(&self.fs).await {
            cleaned.abandon(&self.fs).await;
            // Deleted or set aside meanwhile: its directory went with what was written.
            return if self.inner.borrow().closed { Ok(false) } else { Err(e) };
        }
        // The `maintenance` lock, not `io`: the swap touches closed segments only, so appends' write-outs
        // and syncs (which take `io`) go on while it renames and syncs the directory; every operation that
        // removes segments or files (retention, truncation, DeleteRecords, close, deletion) waits.
        let _maintenance = self.maintenance.lock().await;
        let start = {
            let inner = self.inner.borrow();
            let n = inner.segments.len();
            let start = inner.segments.iter().position(|s| s.base == first.base);
            start.filter(|&i| {
                !inner.closed
                    && inner.end_cuts == end_cuts
                    && i + replaced.len() < n
                    && replaced
                        .iter()
                        .zip(&inner.segments[i..])
                        .all(|(r, s)| r.base == s.base && r.size == s.size && r.next_offset == s.next_offset)
            })
        };
        let Some(start) = start else {
            cleaned.abandon(&self.fs).await;
            return Ok(false);
        };
        // The cleaned segment's aborted transactions are the run's whose ABORT marker the cleaner kept (an
        // entry whose records it removed filters nothing; one whose marker it removed must go, or a
        // read_committed consumer would drop that producer's later records waiting for the marker, as
        // Kafka's cleaner drops it). Written beside, always (empty too), before the commit, and renamed
        // with the index files: an open that finishes the swap finds it there or already renamed.
        let aborted: Vec<_> = {
            let inner = self.inner.borrow();
            inner.segments[start..start + replaced.len()]
                .iter()
                .flat_map(|s| s.aborted.iter().copied())
                .filter(|e| cleaned.markers.binary_search(&e.last_offset).is_ok())
                .collect()
        };
        let txn_index_cleaned = cleaned.txn_index_path();
        durable::replace_file(&self.fs, &txn_index_cleaned, &crate::txn::index::encode(&aborted)).await?;
        let swap = self.dir.join(segment::file_name(first.base, SWAP_SUFFIX));
        if let Err(e) = self.fs.rename(&cleaned.path, &swap).await {
            fatal::disk_failure("rename", &cleaned.path, &e);
        }
        durable::sync_dir(&self.fs, &self.dir).await;
        // Committed: from here a crash finishes the swap at the next open. The log serves the cleaned
        // segment at once, before any old file goes: reads do not take the `io` lock, and one that finds
        // an old segment's file gone, or (reopening it by name) the new file where the old one was, must
        // already see the generation changed, and read again, rather than take that for damage. The new
        // file stays open (pinned) until it has its final name, so it is never reopened by name before.
        let log_path = self.dir.join(segment::file_name(first.base, segment::LOG_SUFFIX));
        let index = cleaned.index.clone();
        let index_files = cleaned.index_paths();
        let (handle, pinned) = self.files.adopt_pinned(log_path.clone(), cleaned.file);
        let segment = Segment {
            base: first.base,
            dir: self.dir.clone(),
            file: handle,
            size: cleaned.size,
            allocated: cleaned.size,
            zeroed: 0,
            durable_written: 0,
            next_offset: last.next_offset,
            persisted_index: None,
            created_ms: self.inner.borrow().segments[start].created_ms,
            index: index.clone(),
            aborted,
        };
        {
            let mut inner = self.inner.borrow_mut();
            inner.segments.splice(start..start + replaced.len(), [segment]);
            inner.generation += 1;
        }
        for (i, r) in replaced.iter().enumerate() {
            for suffix in
                [segment::INDEX_SUFFIX, segment::TIME_INDEX_SUFFIX, segment::TXN_INDEX_SUFFIX, segment::LOG_SUFFIX]
            {
                if i == 0 && suffix == segment::LOG_SUFFIX {
                    continue;
                }
                let path = self.dir.join(segment::file_name(r.base, suffix));
                if self.fs.exists(&path)
                    && let Err(e) = self.fs.remove(&path).await
                {
                    fatal::disk_failure("remove", &path, &e);
                }
            }
        }
        let renamed = index_files.iter().chain([&txn_index_cleaned]);
        for (from, suffix) in
            renamed.zip([segment::INDEX_SUFFIX, segment::TIME_INDEX_SUFFIX, segment::TXN_INDEX_SUFFIX])
        {
            let to = self.dir.join(segment::file_name(first.base, suffix));
            if let Err(e) = self.fs.rename(from, &to).await {
                fatal::disk_failure("rename", from, &e);
            }
        }
        // The old files are gone and the index files in place (an open that finds the swap file still
        // there removes them again and rebuilds the index) before the new log file takes its name.
        durable::sync_dir(&self.fs, &self.dir).await;
        if let Err(e) = self.fs.rename(&swap, &log_path).await {
            fatal::disk_failure("rename", &swap, &e);
        }
        durable::sync_dir(&self.fs, &self.dir).await;
        drop(pinned);
        self.inner.borrow_mut().segments[start].persisted_index = Some(index.entry_count());
        // Snapshots are kept at segment bases; those of the replaced segments go (as with retention).
        self.prune_producer_snapshots_locked().await?;
        self.inner.borrow_mut().cleaned_upto = cleaned_upto.min(last.next_offset);
        tracing::debug!(dir = %self.dir.display(), base = %first.base, replaced = replaced.len(), bytes = cleaned.size, "swapped in a cleaned segment");
        Ok(true)
    }
}

/// `<base>.txnindex.cleaned` beside `sibling`: the cleaned segment's aborted transactions, written
/// before the swap commits and renamed to `<base>.txnindex` with the index files.
fn cleaned_txn_index_path(sibling: &Path, base: Offset) -> PathBuf {
    sibling.with_file_name(format!("{}{CLEANED_SUFFIX}", segment::file_name(base, segment::TXN_INDEX_SUFFIX)))
}

/// Completes a swap a crash interrupted (see the module docs): the `.swap` file at `base` replaces every
/// segment from `base` up to where its batches end.
pub(super) async fn finish_swap<F: Fs>(fs: &F, dir: &Path, base: Offset) -> Result<()> {
    let swap = dir.join(segment::file_name(base, SWAP_SUFFIX));
    let file = fs.open(&swap, false).await.map_err(|e| StorageError::io("open", &swap, e))?;
    let size = file.size().await.map_err(|e| StorageError::io("stat", &swap, e))?;
    let scan = segment::scan(&file, &swap, 0, base, size, |_| {}).await?;
    if scan.stop != segment::ScanStop::Clean {
        // It was synced before it was renamed: anything else is damage, and the old segments are intact.
        return Err(StorageError::CorruptFile {
            path: swap,
            detail: format!("cleaned segment does not scan: {}", scan.stop.reason().unwrap_or_default()),
        });
    }
    drop(file);
    let txn_index_cleaned = cleaned_txn_index_path(&swap, base);
    let names = fs.list_dir(dir).map_err(|e| StorageError::io("list", dir, e))?;
    for name in &names {
        for suffix in
            [segment::INDEX_SUFFIX, segment::TIME_INDEX_SUFFIX, segment::TXN_INDEX_SUFFIX, segment::LOG_SUFFIX]
        {
            // The first segment's `.log` becomes the swap's; its `.txnindex` is the swap's already unless
            // the cleaned one still waits beside it (renamed over it below).
            let kept = suffix == segment::LOG_SUFFIX
                || (suffix == segment::TXN_INDEX_SUFFIX && !fs.exists(&txn_index_cleaned));
            let replaced = segment::parse_file_name(name, suffix)
                .is_some_and(|b| b >= base && b < scan.next_offset && !(b == base && kept));
            if replaced {
                let path = dir.join(name);
                if let Err(e) = fs.remove(&path).await {
                    fatal::disk_failure("remove", &path, &e);
                }
            }
        }
    }
    if fs.exists(&txn_index_cleaned) {
        let to = dir.join(segment::file_name(base, segment::TXN_INDEX_SUFFIX));
        if let Err(e) = fs.rename(&txn_index_cleaned, &to).await {
            fatal::disk_failure("rename", &txn_index_cleaned, &e);
        }
    }
    durable::sync_dir(fs, dir).await;
    let log = dir.join(segment::file_name(base, segment::LOG_SUFFIX));
    if let Err(e) = fs.rename(&swap, &log).await {
        fatal::disk_failure("rename", &swap, &e);
    }
    durable::sync_dir(fs, dir).await;
    tracing::info!(dir = %dir.display(), %base, end = %scan.next_offset, "finished swapping in a cleaned segment");
    Ok(())
}
