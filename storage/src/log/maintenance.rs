//! Operations that change which bytes and files make up the log: rolling, truncation, retention,
//! DeleteRecords and close. Each holds the `io` lock for its whole duration.

use std::path::Path;

use crate::batch::{BatchHeader, HEADER_BYTES};
use crate::durable;
use crate::error::{Result, StorageError};
use crate::fatal;
use crate::fs::open_files::OpenFiles;
use crate::fs::{Fs, SegmentFile, align_down};
use crate::segment::index::SegmentIndex;
use crate::segment::{self, Segment};
use crate::types::Offset;

use super::producer_snapshots::list_snapshots;
use super::{AppendPause, PartitionLog, Tail};
use crate::producer_state::ProducerStates;

/// Creates an empty segment file at `base` (replacing a stray one) and makes its directory entry durable.
pub(super) async fn create_segment<F: Fs>(
    fs: &F,
    files: &OpenFiles<F>,
    dir: &Path,
    base: Offset,
    now_ms: i64,
) -> Result<Segment<F>> {
    let path = dir.join(segment::file_name(base, segment::LOG_SUFFIX));
    let file = fs.open(&path, true).await.map_err(|e| StorageError::io("create segment", &path, e))?;
    if let Err(e) = file.truncate(0).await {
        fatal::disk_failure("truncate", &path, &e);
    }
    durable::sync_parent(fs, &path).await;
    Ok(Segment {
        base,
        dir: dir.to_path_buf(),
        file: files.adopt(path, file),
        size: 0,
        allocated: 0,
        zeroed: 0,
        durable_written: 0,
        next_offset: base,
        index: SegmentIndex::new(base),
        persisted_index: None,
        created_ms: now_ms,
        aborted: Vec::new(),
    })
}

/// Writes a segment's `.index` and `.timeindex` files whole.
pub(crate) async fn write_index_files<F: Fs>(
    fs: &F,
    index: &SegmentIndex,
    index_path: &Path,
    time_index_path: &Path,
) -> Result<()> {
    durable::replace_file(fs, index_path, &index.encode_offsets()).await?;
    durable::replace_file(fs, time_index_path, &index.encode_times()).await
}

/// Removes a segment's files (index files first, so a crash leaves no index without its log).
pub(super) async fn remove_segment_files<F: Fs>(fs: &F, dir: &Path, base: Offset) -> Result<()> {
    for suffix in [segment::INDEX_SUFFIX, segment::TIME_INDEX_SUFFIX, segment::TXN_INDEX_SUFFIX, segment::LOG_SUFFIX] {
        let path = dir.join(segment::file_name(base, suffix));
        if fs.exists(&path)
            && let Err(e) = fs.remove(&path).await
        {
            fatal::disk_failure("remove", &path, &e);
        }
    }
    Ok(())
}

impl<F: Fs> PartitionLog<F> {
    /// Memory the log holds for its data now: the in-memory tail of the active segment.
    pub fn cached_bytes(&self) -> usize {
        self.inner.borrow().tail.held_bytes()
    }

    /// Whether any of the log's segment files is open now.
    pub fn holds_open_files(&self) -> bool {
        self.inner.borrow().segments.iter().any(|s| s.file.is_open())
    }

    /// When the log was last appended to or read (by its clock).
    pub fn last_used_ms(&self) -> i64 {
        self.inner.borrow().last_used_ms
    }

    /// Lets go of what the log holds while it is not being used: appended data still in memory is written
    /// out (not synced; the flush policy decides that), the cached tail is cut to the block the next
    /// write-out rewrites, and segment files no operation is using are closed. Reads of the released
    /// data go to the disk; the next use opens files again.
    pub async fn release_cache(&self) -> Result<()> {
        let _io = self.io.lock().await;
        self.check_open()?;
        self.write_out_locked().await?;
        let mut inner = self.inner.borrow_mut();
        inner.tail.release(|len| self.fs.alloc_kept(len));
        for segment in &inner.segments {
            segment.file.close_if_unused();
        }
        Ok(())
    }

    /// Rolls the active segment if a `batch_len`-byte append still needs a new one.
    pub(super) async fn roll_if_needed(&self, batch_len: u64, batch_last: Offset) -> Result<()> {
        // A roll may rebuild the producers' state, which walks the segments: `maintenance` first.
        let _maintenance = self.maintenance.lock().await;
        let _io = self.io.lock().await;
        self.check_open()?;
        let now = self.clock.now_ms();
        if self.inner.borrow().needs_roll(batch_len, batch_last, now) {
            let _pause = AppendPause::new(self);
            self.roll_locked(now).await?;
        }
        Ok(())
    }

    /// Rolls now (for tests and tools), unless the active segment is empty.
    pub async fn roll(&self) -> Result<()> {
        let _maintenance = self.maintenance.lock().await;
        let _io = self.io.lock().await;
        self.check_open()?;
        if !self.inner.borrow().active().is_empty() {
            let _pause = AppendPause::new(self);
            self.roll_locked(self.clock.now_ms()).await?;
        }
        Ok(())
    }

    /// The old segment is written out, cut to its logical size, synced, and its indexes written; then a new
    /// empty segment starts at the log end offset.
    async fn roll_locked(&self, now: i64) -> Result<()> {
        self.seal_active_locked().await?;
        let base = self.inner.borrow().log_end();
        let segment = create_segment(&self.fs, &self.files, &self.dir, base, now).await?;
        {
            // The new segment is the active one as soon as its file exists (nothing was appended since the
            // seal: appends are paused), so a cancellation past this point leaves no stray file.
            let mut inner = self.inner.borrow_mut();
            assert_eq!(inner.log_end(), base, "appended during a roll");
            inner.segments.push(segment);
            inner.tail = Tail::default();
            inner.durable = inner.durable.max(base);
        }
        // Recovery replays producers' batches from here rather than from the start of the log.
        self.write_producer_snapshot_locked().await?;
        tracing::debug!(dir = %self.dir.display(), %base, "rolled segment");
        Ok(())
    }

    /// Makes the active segment complete on disk: written out, cut to its logical size, synced, indexes
    /// sealed and written. It stays the active segment.
    async fn seal_active_locked(&self) -> Result<()> {
        self.write_out_locked().await?;
        let (file, path, size, index, index_path, time_index_path, covered, batches) = {
            let mut inner = self.inner.borrow_mut();
            let covered = inner.log_end();
            let batches = inner.take_unsynced_batches();
            let active = inner.active_mut();
            active.index.seal();
            (
                active.file.clone(),
                active.log_path(),
                active.size,
                active.index.clone(),
                active.index_path(),
                active.time_index_path(),
                covered,
                batches,
            )
        };
        let file = self.open_file(&file).await?;
        if let Err(e) = file.truncate(size).await {
            fatal::disk_failure("truncate", &path, &e);
        }
        // The reservation is gone with the cut. The segment may stay active (a roll whose new segment could
        // not be made, a close that failed): its next appends reserve again, and no zeros go past the cut.
        self.inner.borrow_mut().active_mut().cut_reservation(size);
        let started = std::time::Instant::now();
        if let Err(e) = file.fdatasync().await {
            fatal::disk_failure("fdatasync", &path, &e);
        }
        crate::metrics::synced(crate::metrics::Sync::File, started.elapsed(), batches);
        write_index_files(&self.fs, &index, &index_path, &time_index_path).await?;
        let active_idx = self.segment_count() - 1;
        self.persist_txn_index_locked(active_idx).await?;
        // The epochs of synced data are on disk before the durable offset (and so the recovery point) covers it.
        self.persist_epochs_locked().await?;
        let mut inner = self.inner.borrow_mut();
        inner.stats.fsyncs += 1;
        inner.durable = inner.durable.max(covered);
        inner.active_mut().persisted_index = Some(index.entry_count());
        Ok(())
    }

    /// Records, durably and before anything is cut, that the log goes back to `offset` (see
    /// [`super::TRUNCATED_TO_FILE`]).
    async fn record_truncation_locked(&self, offset: Offset) -> Result<()> {
        durable::replace_file(&self.fs, &self.dir.join(super::TRUNCATED_TO_FILE), offset.0.to_string().as_bytes()).await
    }

    /// Lowers compaction's checkpoint to `offset`, durably and before anything is cut: what is written
    /// again above it must count as not cleaned, after a restart too.
    async fn lower_cleaned_upto_locked(&self, offset: Offset) -> Result<()> {
        if self.inner.borrow().cleaned_upto <= offset {
            return Ok(());
        }
        self.inner.borrow_mut().cleaned_upto = offset;
        let path = self.dir.join(super::compaction::CLEANER_CHECKPOINT_FILE);
        durable::replace_file(&self.fs, &path, offset.0.to_string().as_bytes()).await
    }

    /// Removes every batch from `offset` on, durably. A batch holding `offset` is removed whole, so the
    /// new log end offset is that batch's base offset. Returns the new log end offset.
    pub async fn truncate_to(&self, offset: Offset) -> Result<Offset> {
        let _maintenance = self.maintenance.lock().await;
        let _io = self.io.lock().await;
        self.check_open()?;
        // A damaged log is kept as found, for its rebuild or repair.
        self.check_intact()?;
        let (log_start, log_end) = {
            let inner = self.inner.borrow();
            (inner.log_start, inner.log_end())
        };
        if offset >= log_end {
            return Ok(log_end);
        }
        if offset < log_start {
            return Err(StorageError::OffsetOutOfRange { requested: offset, log_start, log_end });
        }
        let _pause = AppendPause::new(self);
        // The cut lands in the segment holding `offset`: its base is a bound below the new end.
        let keep = self.inner.borrow().segment_for(offset);
        let keep_base = self.inner.borrow().segments[keep].base;
        self.record_truncation_locked(keep_base).await?;
        self.lower_cleaned_upto_locked(keep_base).await?;
        // Everything below the cut must be in the file before the file is cut.
        self.write_out_locked().await?;
        let doomed: Vec<Offset> = self.inner.borrow().segments[keep + 1..].iter().map(|s| s.base).collect();
        {
            let mut inner = self.inner.borrow_mut();
            inner.generation += 1;
            inner.end_cuts += 1;
            // Until rebuilt for the new end (below, or by the next append if this is cut short).
            inner.producers = ProducerStates::default();
            inner.producers_stale = true;
            self.count_producers(&mut inner);
            if keep + 1 < inner.segments.len() {
                inner.segments.truncate(keep + 1);
                // The kept segment was rolled: all its bytes are on disk, none in memory. (The tail is
                // rebuilt block-aligned below, once the cut is known.)
                let size = inner.active().size;
                inner.tail = Tail::from_disk(size, &[], size, |len| self.fs.alloc_kept(len));
            }
        }
        // Newest first, and durably before the kept segment is cut: after a crash at any point the
        // segments left are still contiguous, and none follows a segment that ends early.
        for base in doomed.iter().rev() {
            remove_segment_files(&self.fs, &self.dir, *base).await?;
        }
        if !doomed.is_empty() {
            durable::sync_dir(&self.fs, &self.dir).await;
        }
        // Find the batch holding `offset` in the segment that stays.
        let (seg_base, seg_size) = {
            let inner = self.inner.borrow();
            (inner.active().base, inner.active().size)
        };
        let (cut_pos, cut_offset) = self.find_batch_start_locked(offset, seg_base, seg_size).await?;
        // A snapshot must never describe batches the log does not hold: gone before the cut.
        self.remove_producer_snapshots_locked(|at| at <= cut_offset).await?;
        // Index files describing batches about to go must not outlive the cut (recovery trusts them).
        self.remove_active_index_files_locked().await?;
        // The aborted transactions whose markers go are forgotten, on disk first.
        self.inner.borrow_mut().active_mut().aborted.retain(|e| e.last_offset < cut_offset);
        let active_idx = self.segment_count() - 1;
        self.persist_txn_index_locked(active_idx).await?;
        let (file, path) = {
            let inner = self.inner.borrow();
            (inner.active().file.clone(), inner.active().log_path())
        };
        let file = self.open_file(&file).await?;
        if let Err(e) = file.truncate(cut_pos).await {
            fatal::disk_failure("truncate", &path, &e);
        }
        if let Err(e) = file.fdatasync().await {
            fatal::disk_failure("fdatasync", &path, &e);
        }
        let tail_start = align_down(cut_pos);
        let tail_bytes = file
            .read_at(tail_start, (cut_pos - tail_start) as usize)
            .await
            .map_err(|e| durable::read_failure("read", &path, e))?;
        assert_eq!(tail_bytes.len() as u64, cut_pos - tail_start, "segment shorter than the batches it held");
        {
            let mut inner = self.inner.borrow_mut();
            let active = inner.active_mut();
            active.index.truncate(cut_pos, cut_offset);
            active.size = cut_pos;
            active.cut_reservation(cut_pos);
            active.next_offset = cut_offset;
            inner.tail = Tail::from_disk(tail_start, &tail_bytes, cut_pos, |len| self.fs.alloc_kept(len));
            inner.durable = inner.durable.min(cut_offset);
            inner.sync_covering = inner.sync_covering.min(cut_offset);
            inner.high_watermark = inner.high_watermark.min(cut_offset);
            inner.cleaned_upto = inner.cleaned_upto.min(cut_offset);
            inner.log_start = inner.log_start.min(cut_offset);
            if inner.epochs.truncate_from_end(cut_offset) {
                inner.epochs_version += 1;
            }
            inner.stats.fsyncs += 1;
            // The batches cut were never made durable and never will be.
            inner.appends_written = inner.stats.appends;
            inner.appends_at_sync = inner.stats.appends;
            // Reads that started while the cut was under way saw an old size: make them read again.
            inner.generation += 1;
        }
        self.news.bump();
        self.recompute_max_timestamp_locked(cut_pos).await?;
        self.persist_epochs_locked().await?;
        self.rebuild_producers_locked(false, None).await?;
        tracing::info!(dir = %self.dir.display(), requested = %offset, log_end = %cut_offset, "truncated log");
        Ok(cut_offset)
    }

    /// The position of the batch holding `offset` in the active segment (or the segment's end when
    /// `offset` is at it), and the log end offset once it is cut there: the end of the batch before it,
    /// which is the batch's base offset unless compaction left a gap between them.
    async fn find_batch_start_locked(&self, offset: Offset, seg_base: Offset, seg_size: u64) -> Result<(u64, Offset)> {
        // Start at an indexed batch wholly below `offset`, so the batch before the one holding it is seen.
        let from = match offset.0.checked_sub(1) {
            Some(below) if offset > seg_base => self.inner.borrow().active().index.position_for(Offset(below)),
            _ => 0,
        };
        let mut found = None;
        let mut end_before = seg_base;
        let end = self
            .scan_active_headers_locked(from, seg_size, |pos, h| {
                let base = Offset(h.base_offset as u64);
                let last = base.plus(h.last_offset_delta as u64);
                if last >= offset {
                    found = Some((pos, end_before));
                    return false;
                }
                end_before = last.plus(1);
                true
            })
            .await?;
        Ok(found.unwrap_or((seg_size, end.unwrap_or(seg_base))))
    }

    /// After a cut, the time index no longer knows the segment's largest timestamp exactly: look at the
    /// batches after its last entry.
    async fn recompute_max_timestamp_locked(&self, cut_pos: u64) -> Result<()> {
        let from = {
            let inner = self.inner.borrow();
            let index = &inner.active().index;
            index.position_for(index.last_time_entry_offset())
        };
        let mut seen = Vec::new();
        self.scan_active_headers_locked(from, cut_pos, |_, h| {
            seen.push((h.max_timestamp, Offset(h.base_offset as u64 + h.last_offset_delta as u64)));
            true
        })
        .await?;
        let mut inner = self.inner.borrow_mut();
        for (ts, last) in seen {
            inner.active_mut().index.note_batch_timestamp(ts, last);
        }
        Ok(())
    }

    /// Calls `visit(position, header)` for each batch of the active segment in `[from, to)` until it returns
    /// false. Returns the offset after the last visited batch.
    async fn scan_active_headers_locked(
        &self,
        from: u64,
        to: u64,
        mut visit: impl FnMut(u64, &BatchHeader) -> bool,
    ) -> Result<Option<Offset>> {
        let active_idx = self.segment_count() - 1;
        let mut pos = from;
        let mut next = None;
        while pos < to {
            let header = self.read_segment_range(active_idx, pos, HEADER_BYTES as u64).await?;
            let h = BatchHeader::parse(&header).map_err(|e| StorageError::CorruptFile {
                path: self.dir.clone(),
                detail: format!("batch header at {pos}: {e}"),
            })?;
            if !visit(pos, &h) {
                break;
            }
            next = Some(Offset(h.base_offset as u64 + h.last_offset_delta as u64 + 1));
            pos += h.total_bytes() as u64;
        }
        Ok(next)
    }

    /// Removes every segment and starts the log empty at `offset` (a follower whose log is entirely
    /// behind the leader's log start).
    pub async fn truncate_fully_and_start_at(&self, offset: Offset) -> Result<()> {
        let _maintenance = self.maintenance.lock().await;
        let _io = self.io.lock().await;
        self.check_open()?;
        self.check_intact()?;
        let _pause = AppendPause::new(self);
        let log_start = self.inner.borrow().log_start;
        self.record_truncation_locked(offset.min(log_start)).await?;
        self.lower_cleaned_upto_locked(offset.min(log_start)).await?;
        let doomed: Vec<Offset> = self.inner.borrow().segments.iter().map(|s| s.base).collect();
        {
            let mut inner = self.inner.borrow_mut();
            inner.generation += 1;
            inner.end_cuts += 1;
            inner.producers = ProducerStates::default();
            self.count_producers(&mut inner);
        }
        // No snapshot of the history being discarded may outlive it.
        self.remove_producer_snapshots_locked(|_| false).await?;
        for base in doomed.iter().rev() {
            remove_segment_files(&self.fs, &self.dir, *base).await?;
        }
        let segment = create_segment(&self.fs, &self.files, &self.dir, offset, self.clock.now_ms()).await?;
        {
            let mut inner = self.inner.borrow_mut();
            inner.segments = vec![segment];
            // Again now that the old segments are gone: a read that began during the awaits above (after
            // the first bump) must not pass for one of the new log.
            inner.generation += 1;
            inner.tail = Tail::default();
            inner.log_start = offset;
            inner.cleaned_upto = offset;
            inner.durable = offset;
            inner.sync_covering = offset;
            inner.high_watermark = offset;
            inner.epochs = Default::default();
            inner.producers = ProducerStates::default();
            inner.completed_txns.clear();
            self.count_producers(&mut inner);
            inner.epochs_version += 1;
        }
        self.news.bump();
        self.persist_epochs_locked().await
    }

    /// Deletes old segments by `retention.ms` and `retention.bytes` (only those wholly below the high
    /// watermark), and segments wholly below the log start offset. The active segment is never deleted. Returns how many segments were deleted.
    pub async fn apply_retention(&self) -> Result<usize> {
        let _maintenance = self.maintenance.lock().await;
        let _io = self.io.lock().await;
        self.check_open()?;
        if self.inner.borrow().damaged.is_some() {
            // Kept as found, for its rebuild or repair: retention resumes once it is whole again.
            return Ok(0);
        }
        let now = self.clock.now_ms();
        let count = {
            let inner = self.inner.borrow();
            let mut total: u64 = inner.segments.iter().map(|s| s.size).sum();
            let mut count = 0;
            for seg in &inner.segments[..inner.segments.len() - 1] {
                let newest = if seg.index.max_timestamp() >= 0 { seg.index.max_timestamp() } else { seg.created_ms };
                // Time and size never delete past the high watermark: a record above it may not be on
                // every in-sync replica yet, and the log start must not overtake what followers still need.
                let below_hw = seg.next_offset <= inner.high_watermark;
                let by_time = below_hw && inner.config.retention_ms.is_some_and(|ms| now.saturating_sub(newest) > ms);
                let by_size = below_hw && inner.config.retention_bytes.is_some_and(|max| total - seg.size >= max);
                let by_start = seg.next_offset <= inner.log_start;
                if !(by_time || by_size || by_start) {
                    break;
                }
                total -= seg.size;
                count += 1;
            }
            count
        };
        self.delete_oldest_segments_locked(count).await?;
        Ok(count)
    }

    /// Kafka's DeleteRecords: moves the log start offset up to `offset` (at most the log end offset) and
    /// deletes the segments wholly below it. Returns the new log start offset.
    pub async fn delete_records(&self, offset: Offset) -> Result<Offset> {
        let _maintenance = self.maintenance.lock().await;
        let _io = self.io.lock().await;
        self.check_open()?;
        self.check_intact()?;
        let count = {
            let mut inner = self.inner.borrow_mut();
            let log_end = inner.log_end();
            if offset > log_end {
                return Err(StorageError::OffsetOutOfRange { requested: offset, log_start: inner.log_start, log_end });
            }
            if offset > inner.log_start {
                inner.log_start = offset;
                // Records below it are gone, even where their segment stays: a read made before must not
                // be served after (see `PartitionLog::generation`).
                inner.generation += 1;
                if inner.epochs.clamp(offset, log_end) {
                    inner.epochs_version += 1;
                }
                // A fetch held below the new start is now out of range.
                self.news.bump();
            }
            let n = inner.segments.len();
            inner.segments[..n - 1].iter().take_while(|s| s.next_offset <= inner.log_start).count()
        };
        // The epoch file is rewritten with the next sync, after the data dir has checkpointed the new log
        // start: an epoch file ahead of the log start checkpoint would leave offsets without an epoch.
        self.delete_oldest_segments_locked(count).await?;
        Ok(self.log_start_offset())
    }

    async fn delete_oldest_segments_locked(&self, count: usize) -> Result<()> {
        if count == 0 {
            return Ok(());
        }
        let doomed: Vec<Offset> = {
            let mut inner = self.inner.borrow_mut();
            assert!(count < inner.segments.len(), "the active segment is never deleted");
            let doomed = inner.segments.drain(..count).map(|s| s.base).collect();
            let first = inner.segments[0].base;
            inner.log_start = inner.log_start.max(first);
            let (start, end) = (inner.log_start, inner.log_end());
            if inner.epochs.clamp(start, end) {
                inner.epochs_version += 1;
            }
            inner.generation += 1;
            doomed
        };
        self.news.bump();
        for base in &doomed {
            remove_segment_files(&self.fs, &self.dir, *base).await?;
        }
        durable::sync_dir(&self.fs, &self.dir).await;
        self.prune_producer_snapshots_locked().await?;
        tracing::info!(dir = %self.dir.display(), deleted = doomed.len(), log_start = %self.log_start_offset(), "deleted segments");
        Ok(())
    }

    /// Writes everything out, seals the active segment (cut to size, synced, indexes written) and refuses
    /// further operations. After `close` the directory needs no recovery scan.
    pub async fn close(&self) -> Result<()> {
        let _maintenance = self.maintenance.lock().await;
        let _io = self.io.lock().await;
        if self.inner.borrow().closed {
            return Ok(());
        }
        let damaged_active = {
            let inner = self.inner.borrow();
            inner.damaged.as_ref().is_some_and(|d| d.segment == inner.active().base)
        };
        if damaged_active {
            // Sealing would cut the damaged segment to what is readable of it: its files stay as found.
            self.inner.borrow_mut().closed = true;
            self.news.bump();
            return Ok(());
        }
        let _pause = AppendPause::new(self);
        self.seal_active_locked().await?;
        self.persist_epochs_locked().await?;
        // A clean restart then reads no batch to know its producers. Without producers nothing is written
        // (a clean open without a snapshot at the log end knows the state was empty), which spares
        // thousands of partitions that never see an idempotent producer two syncs each at every stop;
        // unless a roll left a snapshot at the log end, of producers since expired: it is replaced.
        self.fresh_producers_locked().await?;
        let end = self.inner.borrow().log_end();
        let empty = self.inner.borrow().producers.is_empty();
        if !empty || list_snapshots(&self.fs, &self.dir)?.contains(&end) {
            self.write_producer_snapshot_locked().await?;
        }
        self.inner.borrow_mut().closed = true;
        self.news.bump();
        Ok(())
    }

    /// Closes the log and removes its directory. The directory is first renamed to `<name>.deleted` (and
    /// the rename made durable), so a crash part-way never leaves a partial partition that looks live;
    /// opening the data dir finishes the removal.
    pub async fn delete(&self) -> Result<()> {
        let _maintenance = self.maintenance.lock().await;
        let _io = self.io.lock().await;
        {
            let mut inner = self.inner.borrow_mut();
            inner.closed = true;
            inner.generation += 1;
            inner.end_cuts += 1;
        }
        // Durability waiters learn the log is gone.
        self.progress.notify(usize::MAX);
        self.news.bump();
        let mut doomed = self.dir.clone().into_os_string();
        doomed.push(DELETED_SUFFIX);
        let doomed = std::path::PathBuf::from(doomed);
        if let Err(e) = self.fs.rename(&self.dir, &doomed).await {
            fatal::disk_failure("rename", &self.dir, &e);
        }
        durable::sync_parent(&self.fs, &self.dir).await;
        remove_dir_contents(&self.fs, &doomed).await
    }
}

impl<F: Fs> PartitionLog<F> {
    /// Refuses every further operation without writing anything: a log taken out of service for damage
    /// keeps its files as they were found (unlike [`PartitionLog::close`], which seals them).
    pub async fn shut(&self) {
        let _maintenance = self.maintenance.lock().await;
        let _io = self.io.lock().await;
        {
            let mut inner = self.inner.borrow_mut();
            inner.closed = true;
            inner.generation += 1;
        }
        // Durability waiters and held fetches learn the log is gone.
        self.progress.notify(usize::MAX);
        self.news.bump();
    }

    /// Closes the log and renames its directory to `to`, durably, keeping every file: for a log the
    /// broker no longer serves but will not destroy (an operator decides). `to` must not be a name the
    /// data dir would open as a partition.
    pub async fn set_aside(&self, to: &Path) -> Result<()> {
        let _maintenance = self.maintenance.lock().await;
        let _io = self.io.lock().await;
        {
            let mut inner = self.inner.borrow_mut();
            inner.closed = true;
            inner.generation += 1;
            inner.end_cuts += 1;
        }
        // Durability waiters learn the log is gone.
        self.progress.notify(usize::MAX);
        self.news.bump();
        if let Err(e) = self.fs.rename(&self.dir, to).await {
            fatal::disk_failure("rename", &self.dir, &e);
        }
        durable::sync_parent(&self.fs, &self.dir).await;
        Ok(())
    }
}

/// Suffix of a partition directory whose removal has begun.
pub const DELETED_SUFFIX: &str = ".deleted";

/// Removes a partition directory's files and then the directory itself, durably.
pub async fn remove_dir_contents<F: Fs>(fs: &F, dir: &Path) -> Result<()> {
    for name in fs.list_dir(dir).map_err(|e| StorageError::io("list", dir, e))? {
        let path = dir.join(name);
        if let Err(e) = fs.remove(&path).await {
            fatal::disk_failure("remove", &path, &e);
        }
    }
    fs.remove_dir(dir).await.map_err(|e| StorageError::io("remove directory", dir, e))?;
    durable::sync_parent(fs, dir).await;
    Ok(())
}
