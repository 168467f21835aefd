//! The active segment's index files on disk.
//!
//! A sealed segment's `.index` and `.timeindex` are written whole when it is sealed, after its data is
//! synced. The active segment's are kept on disk too, for the batches already durable: each checkpoint
//! (every second while data arrives) writes the entries added since the last one whose batches are
//! fdatasync'ed. Recovery after a crash then trusts the active segment up to its last index entry and
//! validates only the batches after it, rather than the whole segment (up to `segment.bytes`).
//!
//! The files only ever receive entries for durable batches, in the order of the in-memory index, so
//! whatever a crash leaves of a write to them is either a prefix of correct entries (fewer entries: more
//! to validate) or something the checks on load refuse (a partial entry, zeros, disorder), after which
//! the segment is scanned whole. Each write is synced (two small fdatasyncs a second for a partition
//! taking data, beside the one per acknowledged produce), so that a power loss, not only a killed
//! process, finds them. What must not happen is a file describing batches that are no longer there: a
//! truncation of the active segment removes its index files durably before it cuts the log, and so does
//! a load that had to scan the segment whole. Without files, the next checkpoint creates them. A
//! partition without index entries (less than `index.interval.bytes` in its segment) writes nothing.

use std::path::Path;

use crate::durable;
use crate::error::{Result, StorageError};
use crate::fatal;
use crate::fs::{Fs, SegmentFile, align_down};
use crate::segment::index::{OFFSET_ENTRY_BYTES, TIME_ENTRY_BYTES};

use super::PartitionLog;

impl<F: Fs> PartitionLog<F> {
    /// Brings the active segment's index files up to the batches that are durable now. Returns whether
    /// it wrote anything. It holds the log's I/O lock while it writes (a truncation or seal must not run
    /// meanwhile), so a write-out waits for it: about two small synced writes, once a second at most.
    pub async fn persist_active_index(&self) -> Result<bool> {
        let _io = self.io.lock().await;
        // Each file's new bytes, from the block holding its first new entry: (path, start, bytes).
        let writes = {
            let inner = self.inner.borrow();
            if inner.closed {
                return Ok(false);
            }
            let active = inner.active();
            let counts = active.index.durable_entries(inner.durable);
            let from = active.persisted_index.unwrap_or((0, 0));
            if counts == from || counts.0 < from.0 || counts.1 < from.1 {
                return Ok(false);
            }
            let offsets_from = align_down((from.0 * OFFSET_ENTRY_BYTES) as u64) as usize;
            let times_from = align_down((from.1 * TIME_ENTRY_BYTES) as u64) as usize;
            // Without files yet, both are created (recovery needs the pair).
            let fresh = active.persisted_index.is_none();
            let offsets = (fresh || counts.0 > from.0)
                .then(|| (active.index_path(), offsets_from, active.index.offset_bytes(offsets_from, counts.0)));
            let times = (fresh || counts.1 > from.1)
                .then(|| (active.time_index_path(), times_from, active.index.time_bytes(times_from, counts.1)));
            (counts, [offsets, times])
        };
        let (counts, files) = writes;
        for (path, from, bytes) in files.into_iter().flatten() {
            write_tail(&self.fs, &path, from, &bytes).await?;
        }
        self.inner.borrow_mut().active_mut().persisted_index = Some(counts);
        Ok(true)
    }

    /// Removes the active segment's index files, durably (before a truncation cuts what they describe).
    pub(super) async fn remove_active_index_files_locked(&self) -> Result<()> {
        let paths = {
            let mut inner = self.inner.borrow_mut();
            let active = inner.active_mut();
            active.persisted_index = None;
            [active.index_path(), active.time_index_path()]
        };
        remove_files(&self.fs, &paths, &self.dir).await;
        Ok(())
    }
}

/// Removes whichever of `paths` exist, and syncs `dir` if it removed any.
pub(super) async fn remove_files<F: Fs>(fs: &F, paths: &[std::path::PathBuf], dir: &Path) {
    let mut removed = false;
    for path in paths {
        if fs.exists(path) {
            if let Err(e) = fs.remove(path).await {
                fatal::disk_failure("remove", path, &e);
            }
            removed = true;
        }
    }
    if removed {
        durable::sync_dir(fs, dir).await;
    }
}

/// Makes `path` (created if missing) hold its bytes up to `from` (a multiple of the block size, written
/// before) followed by `tail`, durably.
async fn write_tail<F: Fs>(fs: &F, path: &Path, from: usize, tail: &[u8]) -> Result<()> {
    let created = !fs.exists(path);
    let file = fs.open(path, true).await.map_err(|e| StorageError::io("open", path, e))?;
    // A full disk leaves the entries unwritten: the next checkpoint writes them again, and until one
    // succeeds the recovery point stays where it was, so a crash rebuilds them from the log.
    durable::write_blocks(&file, path, from as u64, tail).await?;
    if let Err(e) = file.truncate((from + tail.len()) as u64).await {
        fatal::disk_failure("truncate", path, &e);
    }
    if let Err(e) = file.fdatasync().await {
        fatal::disk_failure("fdatasync", path, &e);
    }
    if created {
        durable::sync_parent(fs, path).await;
    }
    Ok(())
}
