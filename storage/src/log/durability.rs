//! Group commit: writing the in-memory tail of the active segment out to its file and fdatasyncing it,
//! with the space reservation ahead of the segment's end and the leader-epoch file that must be durable
//! with the records it describes. See the parent module for how appends and syncs share the log.

use std::rc::Rc;

use super::{FlushPolicy, LEADER_EPOCH_FILE, PartitionLog};
use crate::durable;
use crate::error::{Result, StorageError};
use crate::fatal;
use crate::fs::device_flush::{BrokenRule, broken_rule};
use crate::fs::open_files::FileHandle;
use crate::fs::{Fs, SegmentFile, WriteBuf, align_down, align_up};
use crate::types::Offset;

/// Syncs of one log that may be under way at once: while one fdatasync runs, the next group is already
/// written, so its fdatasync can start without waiting for a full round (for a group of at least
/// `SMALL_WRITE_OUT_BYTES`; a smaller one waits and grows).
const MAX_SYNCS_IN_FLIGHT: u32 = 2;

/// The largest direct write of copied bytes; larger write-outs are split and submitted together. (A
/// block of the tail written as it is can be larger: it holds at least one whole batch.)
const WRITE_CHUNK_BYTES: u64 = 1 << 20;
/// The least an active segment is reserved ahead of its end (see `reserve_locked`).
const MIN_RESERVE_BYTES: u64 = 64 << 10;

/// A write-out smaller than this is small: the fdatasync after it costs more than the write. Zeros are
/// written ahead of it (see `zero_ahead`), it starts no second sync beside one under way, and its bytes
/// are copied into write buffers rather than written from the tail's own (see `tail`).
pub(super) const SMALL_WRITE_OUT_BYTES: u64 = 128 << 10;
/// How far ahead of a small write-out's end the zeros go, written together with it once the data comes
/// within half of this of the zeroed blocks' end.
const ZERO_AHEAD_BYTES: u64 = 1 << 20;

/// The blocks `[from, to)` to write with zeros beside a write-out of `len` bytes that ends the active
/// segment's data at `end`, if any.
///
/// Reserved blocks are allocated (fallocate) but unwritten: after a write into them, ext4 must record in
/// its journal that they now hold data, so the fdatasync that follows waits for a journal commit, and jbd2
/// commits one transaction at a time for every file on the filesystem. After a write into blocks already
/// written, an fdatasync is only a flush of the device's cache (0.19 against 0.39 ms at the median with 12
/// files, `docs/performance.md`). A partition that syncs small write-outs, one per fdatasync, therefore has
/// the next megabyte of its reservation written with zeros, one conversion for many syncs; big write-outs
/// are left alone, as their sync is cheap beside them and zeros would double their bytes on the disk. Only
/// reserved blocks past the data are zeroed: never a byte of data, and never a block that is not allocated
/// (a full disk is met when reserving, not here).
fn zero_ahead(end: u64, len: u64, zeroed: u64, allocated: u64) -> Option<(u64, u64)> {
    // A segment under a megabyte gets none: most partitions of a broker with thousands are quiet, and
    // zeros for each would cost more than the few syncs they save. A busy one is past it in moments.
    if len >= SMALL_WRITE_OUT_BYTES || end < ZERO_AHEAD_BYTES || allocated == u64::MAX {
        return None;
    }
    let data_end = align_up(end);
    let from = zeroed.max(data_end);
    if from >= data_end + ZERO_AHEAD_BYTES / 2 {
        return None;
    }
    let to = (from + ZERO_AHEAD_BYTES).min(align_down(allocated));
    (to > from).then_some((from, to))
}

/// Direct writes of zeros over the (aligned) file range `[from, to)`, in chunks of at most
/// `WRITE_CHUNK_BYTES`.
fn zero_writes<Fi: SegmentFile>(file: &Fi, from: u64, to: u64) -> Vec<(WriteBuf<Fi::Buf>, u64)> {
    let mut writes = Vec::new();
    let mut pos = from;
    while pos < to {
        let len = (to - pos).min(WRITE_CHUNK_BYTES);
        let mut buf = file.alloc(len as usize);
        buf.as_mut().fill(0);
        writes.push((WriteBuf::Owned(buf), pos));
        pos += len;
    }
    writes
}

/// Ends a sync turn, also when its future is dropped, and wakes the waiters.
struct SyncTurn<'a, F: Fs>(&'a PartitionLog<F>);

impl<F: Fs> Drop for SyncTurn<'_, F> {
    fn drop(&mut self) {
        let mut inner = self.0.inner.borrow_mut();
        inner.syncs_in_flight -= 1;
        if inner.syncs_in_flight == 0 {
            inner.sync_covering = inner.durable;
        }
        drop(inner);
        self.0.progress.notify(usize::MAX);
    }
}

impl<F: Fs> PartitionLog<F> {
    /// Returns once every offset below `offset` is durable.
    ///
    /// A waiter whose offset no sync under way covers starts one (at most `MAX_SYNCS_IN_FLIGHT` at a time):
    /// it writes out everything appended so far, then fdatasyncs. Every other waiter waits for a sync to
    /// finish and looks again, so one fdatasync covers every append written before it.
    pub async fn wait_durable(&self, offset: Offset) -> Result<()> {
        loop {
            let wait = {
                let mut inner = self.inner.borrow_mut();
                if inner.durable >= offset {
                    return Ok(());
                }
                if inner.closed {
                    return Err(StorageError::Closed(self.dir.clone()));
                }
                if offset > inner.log_end() {
                    return Err(StorageError::Truncated { offset, log_end: inner.log_end() });
                }
                let covered_by_one_under_way = inner.syncs_in_flight > 0 && inner.sync_covering >= offset;
                // A second sync overlaps the first only for a big write-out: small appends wait for the
                // sync under way and then go together, one fdatasync for all that came meanwhile.
                let little_for_another = inner.syncs_in_flight > 0 && inner.unwritten_bytes() < SMALL_WRITE_OUT_BYTES;
                if covered_by_one_under_way || little_for_another || inner.syncs_in_flight >= MAX_SYNCS_IN_FLIGHT {
                    true
                } else {
                    inner.syncs_in_flight += 1;
                    false
                }
            };
            if wait {
                // On this future's own memory, not the heap: nothing can notify between the check above and
                // this (no await comes between them).
                event_listener::listener!(self.progress => progress);
                progress.await;
            } else {
                let _turn = SyncTurn(self);
                self.sync_turn().await?;
            }
        }
    }

    /// One sync: write out under the `io` lock, then make it durable outside it so the next sync's write
    /// can overlap: by the shard's device flush when every write-out not yet synced by an fdatasync of
    /// the file went into blocks known to be written and durable (see [`crate::fs::device_flush`]),
    /// otherwise by an fdatasync of the file.
    pub(super) async fn sync_turn(&self) -> Result<()> {
        let device = self.files.device_flush().filter(|_| self.inner.borrow().config.flush == FlushPolicy::Always);
        let flushed_early = match device {
            Some(device) if broken_rule() == BrokenRule::FlushBeforeWrite => {
                device.flush(0).await?;
                true
            }
            _ => false,
        };
        let (file, path, covered, end_cuts, batches, by_device, file_sync) = {
            let _io = self.io.lock().await;
            let covered = self.write_out_locked().await?;
            // The epochs of the data are on disk before the durable offset covers it.
            self.persist_epochs_locked().await?;
            let mut inner = self.inner.borrow_mut();
            inner.sync_covering = inner.sync_covering.max(covered);
            let batches = inner.take_unsynced_batches();
            let by_device = device.filter(|_| inner.writes_needing_file_sync == inner.writes_file_synced).cloned();
            // What a completed fdatasync of the file will have made durable: the write-outs counted so
            // far, and every block written below the end of the written data or the zeros ahead of it,
            // as far as the file's size holds whole blocks (a cut leaves it inside a block).
            let active = inner.active();
            let written = active.zeroed.max(align_up(inner.tail.written)).min(align_down(active.allocated));
            let file_sync = (inner.writes_needing_file_sync, written);
            (active.file.clone(), active.log_path(), covered, inner.end_cuts, batches, by_device, file_sync)
        };
        if let Some(device) = by_device {
            if !flushed_early {
                device.flush(batches).await?;
            }
            self.inner.borrow_mut().stats.device_flushes += 1;
        } else {
            let open = self.open_file(&file).await?;
            let started = std::time::Instant::now();
            if let Err(e) = open.fdatasync().await {
                fatal::disk_failure("fdatasync", &path, &e);
            }
            crate::metrics::synced(crate::metrics::Sync::File, started.elapsed(), batches);
            let mut inner = self.inner.borrow_mut();
            inner.stats.fsyncs += 1;
            let (writes, written) = file_sync;
            inner.writes_file_synced = inner.writes_file_synced.max(writes);
            // Unless the file was cut or replaced as the active segment meanwhile (a cut starts over).
            if inner.end_cuts == end_cuts && inner.active().file.same(&file) {
                let active = inner.active_mut();
                active.durable_written = active.durable_written.max(written);
            }
        }
        let mut inner = self.inner.borrow_mut();
        inner.last_sync_ms = self.clock.now_ms();
        // A sync covers every write completed before it started, whatever order syncs finish in. If
        // bytes were removed meanwhile (truncation), the truncation set the durable offset itself.
        if inner.end_cuts == end_cuts && covered > inner.durable {
            inner.durable = covered;
        }
        Ok(())
    }

    /// Makes everything appended so far durable.
    pub async fn flush(&self) -> Result<()> {
        let end = self.log_end_offset();
        self.wait_durable(end).await
    }

    /// Writes appended data to the file without syncing it (Kafka's page-cache acknowledgement point).
    pub async fn write_out(&self) -> Result<()> {
        self.check_open()?;
        let _io = self.io.lock().await;
        self.write_out_locked().await.map(|_| ())
    }

    /// Under the interval flush policy (Kafka's acknowledgement point): writes appended data to the file,
    /// and syncs when `flush.messages` records are unsynced or `flush.ms` passed since the last sync. Returns
    /// whether it synced. Under `Always` it does nothing: durability waiters sync.
    pub async fn flush_if_due(&self) -> Result<bool> {
        let (due, unwritten) = {
            let inner = self.inner.borrow();
            let unwritten = inner.unwritten_bytes() > 0;
            match inner.config.flush {
                FlushPolicy::Always => (false, false),
                FlushPolicy::Interval { messages, ms } => {
                    let unsynced = inner.log_end().0 - inner.durable.0;
                    // Compared unsigned: `ms` is `u64::MAX` for a `flush.ms` left unset (never), which as
                    // an i64 would be -1, always passed.
                    let elapsed = self.clock.now_ms().saturating_sub(inner.last_sync_ms).max(0) as u64;
                    (unsynced >= messages || (unsynced > 0 && elapsed >= ms), unwritten)
                }
            }
        };
        if due {
            self.flush().await?;
        } else if unwritten {
            self.write_out().await?;
        }
        Ok(due)
    }

    /// A segment's file, opened again if the shard's file cache closed it.
    pub(super) async fn open_file(&self, handle: &FileHandle<F>) -> Result<Rc<F::File>> {
        self.files.get(handle).await.map_err(|e| StorageError::io("open segment", handle.path(), e))
    }

    /// Writes the active segment's unwritten bytes, in chunks of at most `WRITE_CHUNK_BYTES` submitted
    /// together. Returns the log end offset the write covers.
    pub(super) async fn write_out_locked(&self) -> Result<Offset> {
        let handle = {
            let mut inner = self.inner.borrow_mut();
            if inner.tail.written == inner.active().size {
                inner.appends_written = inner.stats.appends;
                return Ok(inner.log_end());
            }
            inner.active().file.clone()
        };
        // The io lock is held: the active segment stays the same while its file is opened.
        let file = self.open_file(&handle).await?;
        if matches!(self.inner.borrow().config.flush, FlushPolicy::Interval { .. }) {
            // In the page cache: only the file's own fdatasync writes it to the device.
            self.inner.borrow_mut().writes_needing_file_sync += 1;
            return Ok(self.write_cached_locked(&file));
        }
        let (path, mut writes, end, covered, zeros) = {
            let mut inner = self.inner.borrow_mut();
            let end = inner.active().size;
            let covered = inner.log_end();
            inner.appends_written = inner.stats.appends;
            let first = align_down(inner.tail.written);
            let writes = inner.tail.writes(WRITE_CHUNK_BYTES as usize, |len| file.alloc(len));
            let active = inner.active();
            let zeros = zero_ahead(end, end - first, active.zeroed, active.allocated);
            (active.log_path(), writes, end, covered, zeros)
        };
        let len: u64 = writes.iter().map(|(b, _)| b.as_ref().len() as u64).sum();
        let from_tail: u64 =
            writes.iter().filter(|(b, _)| matches!(b, WriteBuf::Shared(_))).map(|(b, _)| b.as_ref().len() as u64).sum();
        let count = writes.len() as u64;
        if let Some((from, to)) = zeros {
            writes.extend(zero_writes(&*file, from, to));
        }
        if let Err(e) = file.write_many(writes).await {
            fatal::disk_failure("write", &path, &e);
        }
        crate::metrics::written(from_tail, len - from_tail);
        let mut inner = self.inner.borrow_mut();
        assert!(inner.active().file.same(&handle), "active segment changed during a locked write");
        // Into blocks whose written state and size a completed fdatasync of the file made durable, and
        // nothing else (zeros ahead go into unwritten blocks): a device flush after this makes it durable.
        let active = inner.active();
        let known_written = match broken_rule() {
            BrokenRule::CoverUnwrittenBlocks => active.allocated,
            _ => active.durable_written,
        };
        if zeros.is_some() || align_up(end) > known_written {
            inner.writes_needing_file_sync += 1;
        }
        // The file is at least as long as its written blocks (`allocated` is its size, but for a
        // filesystem without fallocate).
        let active = inner.active_mut();
        if active.allocated != u64::MAX {
            active.allocated = active.allocated.max(align_up(end));
        }
        inner.tail.written = end;
        inner.stats.writes += count;
        inner.stats.bytes_written += len;
        inner.stats.bytes_written_from_tail += from_tail;
        if let Some((from, to)) = zeros {
            inner.active_mut().zeroed = to;
            inner.stats.bytes_zeroed += to - from;
        }
        inner.trim_tail(&self.fs);
        Ok(covered)
    }

    /// Allocates the active segment's file for `more` bytes past its end and ahead of that by as much as
    /// the segment holds (at least 64 KiB, at most `preallocate_bytes`, never past `segment.bytes`), so
    /// that the write-outs land in reserved blocks: a full disk is met here, before the batch is taken,
    /// and refused with [`StorageError::NoSpace`]. The reservation leaves the free-space floor free
    /// (see [`crate::space`]): near it, it reserves less ahead; at it, the batch is refused with
    /// [`StorageError::BelowFloor`].
    pub(super) async fn reserve_locked(&self, more: u64) -> Result<()> {
        let (end, allocated, step, cap, path, handle, zeros) = {
            let inner = self.inner.borrow();
            let active = inner.active();
            (
                align_up(active.size + more),
                active.allocated,
                inner.config.preallocate_bytes,
                align_up(inner.config.segment_bytes),
                active.log_path(),
                active.file.clone(),
                inner.config.preallocate_with_zeros,
            )
        };
        if step == 0 || end <= allocated {
            return Ok(());
        }
        let file = self.open_file(&handle).await?;
        // Ahead by as much as the segment holds, between 64 KiB and the step: a quiet partition reserves
        // little (ten thousand of them must not take the disk), a busy one a whole step at a time.
        let ahead = end.clamp(MIN_RESERVE_BYTES, step.max(MIN_RESERVE_BYTES));
        let want = align_up(end + ahead).min(cap).max(end);
        // Held until the blocks are allocated, so that reservations under way on other partitions (and
        // shards) do not count the same free bytes.
        let grant = match self.space.grant(end - allocated, want - allocated, || self.fs.free_bytes(&self.dir)) {
            Ok(grant) => grant,
            Err(_) if self.space.floor_bytes() == 0 => return Err(StorageError::NoSpace { path }),
            Err(free_bytes) => {
                return Err(StorageError::BelowFloor { path, free_bytes, floor_bytes: self.space.floor_bytes() });
            }
        };
        // `end` is aligned, so this is at least `end`.
        let want = align_down(allocated + grant.bytes()).clamp(end, want);
        let reserved = if zeros {
            // From the end of what is written (never over data: the tail block is rewritten by the
            // write-outs, and everything past `align_up(size)` is unwritten).
            let from = align_up(self.inner.borrow().active().size).max(allocated);
            file.write_many(zero_writes(&*file, from, want)).await
        } else {
            file.allocate(want).await
        };
        match reserved {
            Ok(()) => {
                let mut inner = self.inner.borrow_mut();
                let active = inner.active_mut();
                active.allocated = want;
                if zeros {
                    active.zeroed = want;
                }
                Ok(())
            }
            // (glommio keeps the error's kind, not always its number.)
            Err(e) if e.raw_os_error() == Some(libc::ENOSPC) || e.kind() == std::io::ErrorKind::StorageFull => {
                Err(StorageError::NoSpace { path })
            }
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) || e.kind() == std::io::ErrorKind::Unsupported => {
                // A filesystem without fallocate: the file grows with its writes.
                self.inner.borrow_mut().active_mut().allocated = u64::MAX;
                Ok(())
            }
            Err(e) => fatal::disk_failure("fallocate", &path, &e),
        }
    }

    /// Under the interval policy a write-out goes through the page cache: exactly the unwritten bytes, in one
    /// synchronous write, so an acknowledgement costs a copy rather than a device round trip (Kafka's
    /// acknowledgement point: the data outlives the process, and reaches the disk at the next flush).
    pub(super) fn write_cached_locked(&self, file: &F::File) -> Offset {
        let mut inner = self.inner.borrow_mut();
        let (end, covered) = (inner.active().size, inner.log_end());
        inner.appends_written = inner.stats.appends;
        let from = inner.tail.written;
        let mut written = Ok(());
        for (at, part) in inner.tail.slices_from(from) {
            if written.is_ok() && !part.is_empty() {
                written = file.write_cached(at, part);
            }
        }
        if let Err(e) = written {
            fatal::disk_failure("write", &inner.active().log_path(), &e);
        }
        inner.tail.written = end;
        inner.stats.writes += 1;
        inner.stats.bytes_written += end - from;
        inner.trim_tail(&self.fs);
        covered
    }

    /// Writes the leader-epoch file if it changed. The change counts as persisted only once the file is
    /// replaced, so a cancelled or failed write is retried by the next sync.
    pub(super) async fn persist_epochs_locked(&self) -> Result<()> {
        let (version, body) = {
            let inner = self.inner.borrow();
            if inner.epochs_persisted == inner.epochs_version {
                return Ok(());
            }
            (inner.epochs_version, inner.epochs.encode())
        };
        durable::replace_file(&self.fs, &self.dir.join(LEADER_EPOCH_FILE), body.as_bytes()).await?;
        let mut inner = self.inner.borrow_mut();
        inner.epochs_persisted = inner.epochs_persisted.max(version);
        Ok(())
    }
}
