//! The idempotent producers' state of a log on disk: snapshot files, written at every roll (at the new
//! segment's base offset) and at close (at the log end, when there are producers), and the replay of batch headers after the newest
//! snapshot that rebuilds the state at open and after a truncation.
//!
//! A snapshot `<offset>.snapshot` describes the batches below `offset`. It is written only where every
//! batch below `offset` is durable (a roll seals the segment first; close syncs), so a crash never leaves
//! a snapshot ahead of the log; one that a truncation would leave ahead of the log is removed before the
//! cut. Snapshots are a cache of what the log says: one that does not decode is set aside and the state is
//! rebuilt from an older one, or from the log itself.

use std::path::{Path, PathBuf};

use crate::batch::{BatchHeader, HEADER_BYTES};
use crate::durable;
use crate::error::{Result, StorageError};
use crate::fatal;
use crate::fs::Fs;
use crate::producer_state::{BATCHES_KEPT, MAX_PRODUCERS_PER_PARTITION, ProducerStates, SNAPSHOT_SUFFIX};
use crate::segment;
use crate::txn::TxnMarker;
use crate::txn::marker::CONTROL_BIT;
use crate::types::Offset;

use super::PartitionLog;

/// Bytes read at a time when replaying batch headers.
const REPLAY_CHUNK_BYTES: u64 = 1 << 20;
/// The largest snapshot a log can write (every producer with every batch kept), with room to spare.
const MAX_SNAPSHOT_BYTES: u64 = 64 + MAX_PRODUCERS_PER_PARTITION as u64 * (31 + BATCHES_KEPT as u64 * 24) * 2;

/// The path of the snapshot taken at `offset`.
pub fn snapshot_path(dir: &Path, offset: Offset) -> PathBuf {
    dir.join(segment::file_name(offset, SNAPSHOT_SUFFIX))
}

/// The offsets of the snapshots in `dir`, oldest first.
pub fn list_snapshots<F: Fs>(fs: &F, dir: &Path) -> Result<Vec<Offset>> {
    let names = fs.list_dir(dir).map_err(|e| StorageError::io("list", dir, e))?;
    let mut offsets: Vec<Offset> = names.iter().filter_map(|n| segment::parse_file_name(n, SNAPSHOT_SUFFIX)).collect();
    offsets.sort();
    Ok(offsets)
}

async fn remove<F: Fs>(fs: &F, path: &Path) {
    // Gone already is fine: a roll and compaction's swap may prune the same snapshot at once.
    if fs.exists(path)
        && let Err(e) = fs.remove(path).await
        && e.kind() != std::io::ErrorKind::NotFound
    {
        fatal::disk_failure("remove", path, &e);
    }
}

/// What rebuilding the state read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Rebuilt {
    /// The snapshot it started from, if any.
    pub snapshot: Option<Offset>,
    /// Batch bytes read after it.
    pub replayed_bytes: u64,
    /// Where the replay started.
    pub from: Offset,
}

impl<F: Fs> PartitionLog<F> {
    /// The producer ids this partition remembers, with what it keeps of each (for tests and tools).
    pub fn producer_states(&self) -> ProducerStates {
        self.inner.borrow().producers.clone()
    }

    /// Forgets producers idle for `producer.id.expiration.ms`. Returns how many.
    pub fn expire_producers(&self) -> usize {
        let now = self.clock.now_ms();
        let mut inner = self.inner.borrow_mut();
        let expiration = inner.config.producer_id_expiration_ms;
        let expired = inner.producers.expire(now, expiration);
        self.count_producers(&mut inner);
        expired
    }

    /// Writes the state as of the log end into a snapshot at the log end offset, then removes the
    /// snapshots no longer useful. Called with the `io` lock held while appends are paused, with every
    /// batch durable.
    pub(super) async fn write_producer_snapshot_locked(&self) -> Result<()> {
        self.fresh_producers_locked().await?;
        let (offset, bytes) = {
            let inner = self.inner.borrow();
            assert!(inner.durable >= inner.log_end(), "a producer snapshot covers only durable batches");
            (inner.log_end(), inner.producers.encode(inner.log_end()))
        };
        durable::replace_file(&self.fs, &snapshot_path(&self.dir, offset), &bytes).await?;
        self.prune_producer_snapshots_locked().await
    }

    /// Keeps the newest snapshot and those at the base of a segment still in the log (a truncation into
    /// that segment rebuilds from there); removes the rest.
    pub(super) async fn prune_producer_snapshots_locked(&self) -> Result<()> {
        let offsets = list_snapshots(&self.fs, &self.dir)?;
        let Some(&newest) = offsets.last() else { return Ok(()) };
        let bases: Vec<Offset> = self.inner.borrow().segments.iter().map(|s| s.base).collect();
        let mut removed = false;
        for offset in offsets {
            if offset != newest && !bases.contains(&offset) {
                remove(&self.fs, &snapshot_path(&self.dir, offset)).await;
                removed = true;
            }
        }
        if removed {
            durable::sync_dir(&self.fs, &self.dir).await;
        }
        Ok(())
    }

    /// Rebuilds the state if a truncation left it stale (see `Inner::producers_stale`). With the `io` lock.
    pub(super) async fn fresh_producers_locked(&self) -> Result<()> {
        if self.inner.borrow().producers_stale {
            self.rebuild_producers_locked(false, None).await?;
        }
        Ok(())
    }

    /// Removes, durably, every snapshot whose offset `keep` refuses (the log is about to be cut).
    pub(super) async fn remove_producer_snapshots_locked(&self, keep: impl Fn(Offset) -> bool) -> Result<()> {
        let mut removed = false;
        for at in list_snapshots(&self.fs, &self.dir)? {
            if !keep(at) {
                remove(&self.fs, &snapshot_path(&self.dir, at)).await;
                removed = true;
            }
        }
        if removed {
            durable::sync_dir(&self.fs, &self.dir).await;
        }
        Ok(())
    }

    /// Rebuilds the state at the log end: from the newest snapshot not above it that decodes (or from
    /// nothing), replaying the headers of the batches after it. Snapshots above the log end describe
    /// batches the log no longer holds and are removed; one that does not decode is renamed
    /// `<name>.bad` and an older one is tried.
    ///
    /// After a clean close (`clean`) the state is the snapshot at the log end, or empty if there is none:
    /// close writes one whenever there are producers.
    ///
    /// The replay also rebuilds the transaction state (see `super::txn`): the aborted-transactions entries
    /// of the markers it meets replace the segments' entries from where it starts, and the transactions
    /// it sees ended join those still holding the last stable offset. With `replay_from_below`, it starts
    /// at or below that offset (a segment whose `.txnindex` did not check).
    pub(super) async fn rebuild_producers_locked(
        &self,
        clean: bool,
        replay_from_below: Option<Offset>,
    ) -> Result<Rebuilt> {
        let log_end = self.log_end_offset();
        self.remove_producer_snapshots_locked(|at| at <= log_end).await?;
        if clean && replay_from_below.is_none() && !list_snapshots(&self.fs, &self.dir)?.contains(&log_end) {
            let mut inner = self.inner.borrow_mut();
            inner.producers = ProducerStates::default();
            inner.producers_stale = false;
            self.count_producers(&mut inner);
            return Ok(Rebuilt { from: log_end, ..Rebuilt::default() });
        }
        let mut start = None;
        let newest_usable = replay_from_below.map_or(log_end, |below| below.min(log_end));
        for at in list_snapshots(&self.fs, &self.dir)?.into_iter().rev() {
            if at > newest_usable {
                continue;
            }
            let path = snapshot_path(&self.dir, at);
            let decoded = match durable::read_file(&self.fs, &path, MAX_SNAPSHOT_BYTES).await {
                Ok(Some(bytes)) => ProducerStates::decode(&bytes),
                Ok(None) => continue,
                Err(e) => Err(e.to_string()),
            };
            match decoded {
                Ok((offset, states)) if offset == at => {
                    start = Some((at, states));
                    break;
                }
                other => {
                    let reason = other.err().unwrap_or_else(|| "its offset is not its name's".into());
                    tracing::warn!(path = %path.display(), %reason, "producer-state snapshot unreadable; set aside as .bad and rebuilt from the log");
                    let mut bad = path.clone().into_os_string();
                    bad.push(".bad");
                    if let Err(e) = self.fs.rename(&path, Path::new(&bad)).await {
                        fatal::disk_failure("rename", &path, &e);
                    }
                    durable::sync_dir(&self.fs, &self.dir).await;
                }
            }
        }
        let first_base = self.inner.borrow().segments[0].base;
        let snapshot = start.as_ref().map(|(at, _)| *at);
        let (from, mut states) = match start {
            Some((at, states)) => (at.max(first_base), states),
            None => (first_base, ProducerStates::default()),
        };
        // The log keeps no append times: replayed producers count as active from now.
        let now = self.clock.now_ms();
        let mut completed = Vec::new();
        let replayed_bytes = self
            .walk_headers(from, log_end, |h, batch| {
                let at = Offset(h.base_offset as u64);
                if h.attributes & CONTROL_BIT == 0 {
                    states.record(h, at, now, true);
                } else if let Some(marker) = batch.and_then(TxnMarker::decode)
                    && let Some(done) = states.record_marker(&marker, at, now, true)
                {
                    completed.push(done);
                }
            })
            .await?;
        let mut inner = self.inner.borrow_mut();
        inner.producers = states;
        inner.producers_stale = false;
        self.count_producers(&mut inner);
        inner.completed_txns.retain(|t| t.last_offset < from);
        for segment in inner.segments.iter_mut().filter(|s| s.next_offset > from) {
            segment.aborted.retain(|e| e.last_offset < from);
        }
        for done in completed {
            inner.note_completed(done);
        }
        Ok(Rebuilt { snapshot, replayed_bytes, from })
    }

    /// Calls `visit` with the header of every batch holding an offset in `[from, to)`, in log order, reading
    /// the segments a chunk at a time, and for a control batch its whole bytes too (`None` only for one
    /// larger than a chunk, which no marker is). Returns the bytes read. The batches were validated when
    /// the log was opened or appended to; a length that does not fit is reported as a corrupt file all the
    /// same.
    async fn walk_headers(
        &self,
        from: Offset,
        to: Offset,
        mut visit: impl FnMut(&BatchHeader, Option<&[u8]>),
    ) -> Result<u64> {
        let mut read = 0u64;
        if from >= to {
            return Ok(0);
        }
        let first = self.inner.borrow().segment_for(from);
        let count = self.segment_count();
        for seg_idx in first..count {
            let (base, size, mut pos) = {
                let inner = self.inner.borrow();
                let seg = &inner.segments[seg_idx];
                (seg.base, seg.size, seg.index.position_for(from))
            };
            if base >= to {
                break;
            }
            while pos < size {
                let chunk = self.read_segment_range(seg_idx, pos, REPLAY_CHUNK_BYTES.min(size - pos)).await?;
                read += chunk.len() as u64;
                if chunk.len() < HEADER_BYTES {
                    return Err(StorageError::CorruptFile {
                        path: self.segment_path(seg_idx),
                        detail: format!("{} bytes at {pos}, less than a batch header", chunk.len()),
                    });
                }
                let mut at = 0usize;
                while at + HEADER_BYTES <= chunk.len() {
                    let header = BatchHeader::parse(&chunk[at..]).expect("a whole header");
                    let total = header.total_bytes() as u64;
                    let base_offset = header.base_offset;
                    if total < HEADER_BYTES as u64 || pos + total > size || base_offset < 0 {
                        return Err(StorageError::CorruptFile {
                            path: self.segment_path(seg_idx),
                            detail: format!("batch header at {pos} does not fit the segment"),
                        });
                    }
                    if Offset(base_offset as u64) >= to {
                        return Ok(read);
                    }
                    let control = header.attributes & CONTROL_BIT != 0;
                    let whole = at + total as usize <= chunk.len();
                    if control && !whole && at > 0 {
                        // Read again from this batch, so that its record is in the chunk.
                        break;
                    }
                    if Offset(base_offset as u64).plus(header.last_offset_delta.max(0) as u64) >= from {
                        visit(&header, (control && whole).then(|| &chunk[at..at + total as usize]));
                    }
                    pos += total;
                    at += total as usize;
                }
            }
        }
        Ok(read)
    }
}
