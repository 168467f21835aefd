//! The partition log: appends. Group commit (write-out, fdatasync, space reservation) is in [`durability`],
//! reads in [`read`], recovery in [`open`], rolling, truncation, retention and close in [`maintenance`],
//! and transactions (markers, the last stable offset, aborted-transactions indexes) in [`txn`].
//!
//! One `PartitionLog` belongs to one shard and is used from that shard's thread only. Its state lives in a
//! `RefCell` that is never borrowed across an `.await`; every operation that writes to the disk (write-out,
//! fdatasync, roll, truncation, retention, close) holds the `io` lock, so the file is only ever written by
//! one task at a time, while appends and reads go on in memory.
//!
//! Group commit: `append` copies the batch into the active segment's in-memory tail and returns its offsets
//! at once. `wait_durable(offset)` returns once an fdatasync covering `offset` has completed: the first
//! waiter becomes the sync leader and syncs everything appended so far; waiters that arrive meanwhile wait
//! for its wake-up, and the leader's next sync covers all of them.
//!
//! The active segment's bytes from the block-aligned position `tail.start` on are kept in memory, in
//! direct-write buffers ([`tail`]). A write-out writes them from the file block holding the first
//! unwritten byte to the end, zero-padded to a whole block (large write-outs from the tail's own buffers,
//! small ones copied); the partial last block is rewritten with more bytes by the next write-out. Under
//! the interval flush policy a write-out instead puts exactly the unwritten bytes into the page cache.

pub mod compaction;
pub mod config;
mod durability;
mod index_files;
pub mod maintenance;
mod open;
mod producer_snapshots;
mod read;
mod replicated;
mod tail;
mod txn;

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_lock::Mutex;

use crate::batch::{self, BatchHeader, HEADER_BYTES};
use crate::durable::{self, read_failure};
use crate::epoch_cache::LeaderEpochCache;
use crate::error::{Result, StorageError};
use crate::fs::open_files::OpenFiles;
use crate::fs::{Fs, SegmentFile, align_up};
use crate::producer_state::{CompletedTxn, ProducerBudget, ProducerStates, Verdict, VerificationGuard};
use crate::segment::Segment;
use crate::segment::index::BatchMeta;
use crate::space::SpaceFloor;
use crate::txn::TxnMarker;
use crate::txn::marker::CONTROL_BIT;
use crate::types::{Clock, LeaderEpoch, Offset};

use tail::Tail;

pub use compaction::{CleanedSegment, ClosedSegment};
pub use config::{CompactionConfig, FlushPolicy, LogConfig};
pub use open::{OnDamage, OpenHints, OpenReport, Recovery};
pub use producer_snapshots::{list_snapshots, snapshot_path};
pub use txn::{CommittedRead, Isolation};

/// Name of the leader-epoch file in a partition directory.
pub const LEADER_EPOCH_FILE: &str = "leader-epoch-checkpoint";
/// Present in a partition directory while its log is offline for damage; holds what was found. The data
/// dir does not open such a log; `shardlog repair` removes it.
pub const DAMAGED_FILE: &str = "damaged";
/// The offset a truncation cut the log back to, written durably before the cut: the checkpointed
/// recovery point may still be above it, and recovery must not take the end of what was appended after
/// the truncation (torn by a crash) for damage to durable data.
pub const TRUNCATED_TO_FILE: &str = "truncated-to";
/// The offset ranges `shardlog repair` left unused, a line `<from> <to>` each: the log was cut to end at
/// `from` and continues at `to`, past every offset it ever held, so that no offset names two records.
/// Recovery takes that jump between two segments for what it is rather than for a lost segment.
pub const OFFSET_GAPS_FILE: &str = "offset-gaps";

/// Takes the partition in `dir` offline for `damage` (found at open, or met by a read): one ERROR saying
/// what to do, and the [`DAMAGED_FILE`] that keeps it offline across restarts (a later crash must not
/// take the damage for a torn tail and cut it away).
pub(crate) async fn take_offline<F: Fs>(fs: &F, dir: &Path, damage: &impl std::fmt::Display) -> Result<()> {
    tracing::error!(
        dir = %dir.display(),
        error = %damage,
        "partition offline: its log is damaged where the data was durable; every file is kept. Stop the broker \
         and run `shardlog repair --data-dir <data dir> --partition <topic>-<partition> --truncate-at OFFSET` \
         (what it cuts is moved aside), or restore the partition from a replica"
    );
    durable::replace_file(fs, &dir.join(DAMAGED_FILE), damage.to_string().as_bytes()).await
}

/// Where a damaged log stops being readable, and why.
#[derive(Debug, Clone)]
struct Damage {
    what: String,
    /// The offset the damaged batch should start at: reads from it on are refused.
    readable_below: Offset,
    /// The damaged segment (by base offset) and the byte position of the damage in it: reads stop there.
    segment: Offset,
    position: u64,
}

/// Offsets assigned to an appended batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendInfo {
    pub base_offset: Offset,
    pub last_offset: Offset,
    pub max_timestamp: i64,
    /// The batch repeated one an idempotent producer had already written: these are that batch's offsets,
    /// and nothing was appended.
    pub duplicate: bool,
}

impl AppendInfo {
    /// The log end offset right after this append.
    pub fn next_offset(&self) -> Offset {
        self.last_offset.plus(1)
    }
}

/// Whole batches read from the log.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogRead {
    /// Stored batch bytes, exactly as on disk (a slice of what was read, not a copy).
    pub bytes: bytes::Bytes,
    /// Base offset of the first batch (may be below the requested offset: a read can start inside a batch).
    pub first_offset: Option<Offset>,
    /// The offset after the last returned batch; where the next read continues.
    pub next_offset: Offset,
}

impl LogRead {
    /// The size of the first batch, if there is one.
    pub fn first_batch_bytes(&self) -> Option<usize> {
        BatchHeader::parse(&self.bytes).ok().map(|header| header.total_bytes())
    }

    /// Splits off the leading whole batches that fit in `max_bytes`, as a read of at most `max_bytes`
    /// from the same offset would have returned them, and leaves the batches after them in `self`. `None`
    /// (and `self` unchanged) when not even the first batch fits.
    pub fn split_to_at_most(&mut self, max_bytes: usize) -> Option<LogRead> {
        if !self.bytes.is_empty() && self.bytes.len() <= max_bytes {
            // All of it fits (the usual case): no batch to look at.
            let next_offset = self.next_offset;
            return Some(LogRead {
                bytes: std::mem::take(&mut self.bytes),
                first_offset: self.first_offset.take(),
                next_offset,
            });
        }
        let mut at = 0;
        let mut next_offset = None;
        let mut rest_first = None;
        while at < self.bytes.len() {
            // The bytes were checked batch by batch when they were read.
            let header = BatchHeader::parse(&self.bytes[at..]).ok()?;
            let end = at + header.total_bytes();
            if end > self.bytes.len() {
                return None;
            }
            if end > max_bytes {
                rest_first = Some(Offset(header.base_offset as u64));
                break;
            }
            at = end;
            next_offset = Some(Offset(header.base_offset as u64 + header.offset_count()));
        }
        let next_offset = next_offset?;
        let head = LogRead { bytes: self.bytes.split_to(at), first_offset: self.first_offset, next_offset };
        self.first_offset = rest_first;
        Some(head)
    }
}

/// News of a log for fetches held until there is some (Kafka's delayed fetch), watched from any shard:
/// bumped when the high watermark moves or the log closes, and when the owner says so (a change of
/// leader). A fetch notes the version when its read begins, listens, and reads again only when the version
/// moved since, so a bump between the read and the listening is not missed and nothing spins.
#[derive(Debug, Default)]
pub struct LogNews {
    version: AtomicU64,
    event: event_listener::Event,
}

impl LogNews {
    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// A listener woken by the next bump.
    pub fn listen(&self) -> event_listener::EventListener {
        self.event.listen()
    }

    /// Wakes every fetch held for this log.
    pub fn bump(&self) {
        self.version.fetch_add(1, Ordering::AcqRel);
        self.event.notify(usize::MAX);
    }
}

/// Counters for tests and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogStats {
    pub appends: u64,
    pub writes: u64,
    pub bytes_written: u64,
    /// Bytes written with zeros ahead of small write-outs (not counted in `bytes_written`).
    pub bytes_zeroed: u64,
    /// Of `bytes_written`, those written from the in-memory tail's own blocks (not copied first).
    pub bytes_written_from_tail: u64,
    pub fsyncs: u64,
    /// Syncs made by a device flush shared with the owner's other logs rather than an fdatasync of
    /// this log's file (see [`crate::fs::device_flush`]).
    pub device_flushes: u64,
}

#[derive(Debug)]
struct Inner<F: Fs> {
    config: LogConfig,
    /// Ordered by base offset, contiguous; the last one is active. Never empty.
    segments: Vec<Segment<F>>,
    tail: Tail<<F::File as SegmentFile>::Buf>,
    log_start: Offset,
    /// Every offset below this is covered by a completed fdatasync.
    durable: Offset,
    /// Syncs under way (see `wait_durable`), and the largest offset the latest of them covers.
    syncs_in_flight: u32,
    sync_covering: Offset,
    /// `stats.appends` as of the last write-out (the batches it covers), and as of the last write-out an
    /// fdatasync made durable: the batches the next fdatasync makes durable are those in between.
    appends_written: u64,
    appends_at_sync: u64,
    /// Write-outs that a device flush alone cannot make durable (into blocks not known to be written,
    /// with zeros, or through the page cache), counted; and how many of them a completed fdatasync of the
    /// file covers. A sync may use the device flush only while the two are equal.
    writes_needing_file_sync: u64,
    writes_file_synced: u64,
    high_watermark: Offset,
    epochs: LeaderEpochCache,
    /// Idempotent producers' state as of the log end (see [`crate::producer_state`]).
    producers: ProducerStates,
    /// Set when the end of the log is cut, until `producers` is rebuilt for the new end: a truncation cut
    /// short (cancelled, or failed after the cut) leaves it set, and the next append, roll or close
    /// rebuilds first, so no batch is ever judged against batches that are gone.
    producers_stale: bool,
    /// `producers.len()` as last counted in the owner's [`ProducerBudget`].
    producers_counted: usize,
    /// Transactions a marker ended whose marker may not be below the high watermark yet: they hold the
    /// last stable offset back until it is (see [`txn`]). Pruned when the high watermark moves.
    completed_txns: Vec<CompletedTxn>,
    /// Bumped on every change of the epoch cache; `epochs_persisted` is the version last written to disk.
    /// A sync writes the file before its durable offset is published.
    epochs_version: u64,
    epochs_persisted: u64,
    /// Roll, truncation and close are rewriting the active segment: appends wait.
    appends_paused: bool,
    last_sync_ms: i64,
    /// When the log was last appended to or read, for releasing what an idle log holds.
    last_used_ms: i64,
    /// Bumped whenever bytes already in the log are removed, so a read that awaited can tell.
    generation: u64,
    /// Bumped when the end of the log is cut, so a sync under way does not claim the cut offsets.
    end_cuts: u64,
    /// Compaction last cleaned the log below this offset (see `compaction`).
    cleaned_upto: Offset,
    /// Where the last read ended, so the next read from there (a consumer reading on) starts at its batch
    /// rather than at the index entry before it (see `read`).
    read_hint: Option<read::ReadHint>,
    closed: bool,
    /// Set when the log is damaged in durable data (found at open, or met by a read): it is offline, and
    /// takes no appends; only what lies before the damage is read.
    damaged: Option<Damage>,
    stats: LogStats,
}

/// Holds appends back while the active segment is rewritten (roll, truncation, close), also when the
/// operation's future is dropped.
pub(super) struct AppendPause<'a, F: Fs>(&'a PartitionLog<F>);

impl<'a, F: Fs> AppendPause<'a, F> {
    pub(super) fn new(log: &'a PartitionLog<F>) -> Self {
        log.inner.borrow_mut().appends_paused = true;
        AppendPause(log)
    }
}

impl<F: Fs> Drop for AppendPause<'_, F> {
    fn drop(&mut self) {
        self.0.inner.borrow_mut().appends_paused = false;
        self.0.progress.notify(usize::MAX);
    }
}

/// A partition's log. See the module documentation.
pub struct PartitionLog<F: Fs> {
    fs: F,
    /// The owner's segment files, opened on demand (shared by every log of a shard).
    files: Rc<OpenFiles<F>>,
    dir: PathBuf,
    clock: Rc<dyn Clock>,
    inner: RefCell<Inner<F>>,
    io: Mutex<()>,
    /// Held by whatever removes or replaces segments (retention, truncation, DeleteRecords, compaction's
    /// swap, close, deletion), before `io` when both are taken: a swap, which needs only this one, never
    /// holds appends' syncs back.
    maintenance: Mutex<()>,
    /// Notified when what durability waiters and paused appends wait on may have changed: a sync ends,
    /// appends resume, the log is closed. A write-out alone changes nothing they wait for.
    progress: event_listener::Event,
    /// For fetches held for news of this log, on any shard.
    news: Arc<LogNews>,
    /// How many producer ids the owner's logs remember together (see [`ProducerBudget`]).
    producer_budget: Rc<ProducerBudget>,
    /// The free space the active segment's reservations leave on the disk (see [`crate::space`]).
    space: Arc<SpaceFloor>,
}

impl<F: Fs> Drop for PartitionLog<F> {
    fn drop(&mut self) {
        let counted = self.inner.borrow().producers_counted;
        self.producer_budget.adjust(counted, 0);
    }
}

impl<F: Fs> std::fmt::Debug for PartitionLog<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = self.inner.borrow();
        f.debug_struct("PartitionLog")
            .field("dir", &self.dir)
            .field("log_start", &inner.log_start)
            .field("log_end", &inner.active().next_offset)
            .field("durable", &inner.durable)
            .field("segments", &inner.segments.len())
            .finish()
    }
}

impl<F: Fs> Inner<F> {
    /// The batches an fdatasync starting now makes durable (those the last write-out covered and no
    /// earlier fdatasync did), counted as synced.
    fn take_unsynced_batches(&mut self) -> u64 {
        let batches = self.appends_written.saturating_sub(self.appends_at_sync);
        self.appends_at_sync = self.appends_written;
        batches
    }

    fn active(&self) -> &Segment<F> {
        self.segments.last().expect("a log always has an active segment")
    }

    fn active_mut(&mut self) -> &mut Segment<F> {
        self.segments.last_mut().expect("a log always has an active segment")
    }

    fn log_end(&self) -> Offset {
        self.active().next_offset
    }

    fn unwritten_bytes(&self) -> u64 {
        self.active().size - self.tail.written
    }

    /// Whether a batch of `batch_len` bytes runs past the active segment's reserved blocks.
    fn needs_reserve(&self, batch_len: u64) -> bool {
        let active = self.active();
        self.config.preallocate_bytes > 0 && align_up(active.size + batch_len) > active.allocated
    }

    /// Whether the active segment must be rolled before a `batch_len`-byte batch ending at `batch_last`
    /// (the log end for a leader's append, where the batch gets its offsets) is appended.
    fn needs_roll(&self, batch_len: u64, batch_last: Offset, now_ms: i64) -> bool {
        let active = self.active();
        if active.is_empty() {
            return false;
        }
        let too_big = active.size + batch_len > self.config.segment_bytes;
        let too_old = now_ms.saturating_sub(active.created_ms) >= self.config.segment_ms;
        // Relative offsets in the index are u32. (A follower's batch may start past a compaction gap; no
        // gap in a leader's log spans more than half the range, see `compaction`.)
        let offsets_full = active.next_offset.max(batch_last).0 - active.base.0 >= u32::MAX as u64 / 2;
        too_big || too_old || offsets_full
    }

    /// Drops cached tail bytes beyond the cache size that are already on disk.
    fn trim_tail(&mut self, fs: &F) {
        let keep = self.config.tail_cache_bytes as u64;
        self.tail.trim(keep, |len| fs.alloc_kept(len));
    }

    /// The index of the segment holding `offset` (the last one whose base is not above it).
    fn segment_for(&self, offset: Offset) -> usize {
        self.segments.partition_point(|s| s.base <= offset).saturating_sub(1)
    }
}

impl<F: Fs> PartitionLog<F> {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The offset the next append gets (LEO).
    pub fn log_end_offset(&self) -> Offset {
        self.inner.borrow().log_end()
    }

    /// The first offset still in the log.
    pub fn log_start_offset(&self) -> Offset {
        self.inner.borrow().log_start
    }

    /// Every offset below this is on disk, covered by a completed fdatasync.
    pub fn durable_offset(&self) -> Offset {
        self.inner.borrow().durable
    }

    /// The recovery point to checkpoint: a restart need not scan below it.
    pub fn recovery_point(&self) -> Offset {
        self.inner.borrow().durable
    }

    pub fn high_watermark(&self) -> Offset {
        self.inner.borrow().high_watermark
    }

    /// Records the high watermark: kept for the checkpoint, and retention by time or size never deletes
    /// a segment that reaches above it.
    pub fn set_high_watermark(&self, hw: Offset) {
        let mut inner = self.inner.borrow_mut();
        assert!(hw <= inner.log_end(), "high watermark {hw} beyond log end {}", inner.log_end());
        if inner.high_watermark != hw {
            inner.high_watermark = hw;
            // The last stable offset moves with it (see `txn`).
            inner.completed_txns.retain(|t| t.last_offset >= hw);
            self.news.bump();
        }
    }

    /// What fetches held for news of this log watch (see [`LogNews`]).
    pub fn news(&self) -> &Arc<LogNews> {
        &self.news
    }

    /// Bumped whenever bytes already in the log are removed (truncation, retention, compaction's swap,
    /// deletion): what was read at one generation is still in the log at the same generation.
    pub fn generation(&self) -> u64 {
        self.inner.borrow().generation
    }

    pub fn config(&self) -> LogConfig {
        self.inner.borrow().config.clone()
    }

    /// Replaces the settings; they apply from the next append or retention pass.
    pub fn set_config(&self, config: LogConfig) -> Result<()> {
        config.validate()?;
        self.inner.borrow_mut().config = config;
        Ok(())
    }

    pub fn stats(&self) -> LogStats {
        self.inner.borrow().stats
    }

    pub fn segment_count(&self) -> usize {
        self.inner.borrow().segments.len()
    }

    /// Base offsets of the segments, oldest first.
    pub fn segment_bases(&self) -> Vec<Offset> {
        self.inner.borrow().segments.iter().map(|s| s.base).collect()
    }

    /// Total logical bytes of all segments.
    pub fn size_bytes(&self) -> u64 {
        self.inner.borrow().segments.iter().map(|s| s.size).sum()
    }

    pub fn leader_epochs(&self) -> LeaderEpochCache {
        self.inner.borrow().epochs.clone()
    }

    /// The leader epoch of the last batch with one recorded.
    pub fn latest_epoch(&self) -> Option<LeaderEpoch> {
        self.inner.borrow().epochs.latest().map(|e| e.epoch)
    }

    /// The oldest leader epoch the log still holds records of.
    pub fn earliest_epoch(&self) -> Option<LeaderEpoch> {
        self.inner.borrow().epochs.entries().first().map(|e| e.epoch)
    }

    /// Kafka's OffsetForLeaderEpoch answer: the largest epoch not above `epoch` and where it ended.
    pub fn end_offset_for_epoch(&self, epoch: LeaderEpoch) -> Option<(LeaderEpoch, Offset)> {
        let inner = self.inner.borrow();
        inner.epochs.end_offset_for(epoch, inner.log_end())
    }

    /// Brings the owner's producer budget up to date with this log's count (after every change of it).
    fn count_producers(&self, inner: &mut Inner<F>) {
        let now = inner.producers.len();
        self.producer_budget.adjust(inner.producers_counted, now);
        inner.producers_counted = now;
    }

    fn check_open(&self) -> Result<()> {
        if self.inner.borrow().closed { Err(StorageError::Closed(self.dir.clone())) } else { Ok(()) }
    }

    fn check_intact(&self) -> Result<()> {
        match &self.inner.borrow().damaged {
            Some(damage) => Err(StorageError::Offline(damage.what.clone())),
            None => Ok(()),
        }
    }

    /// Why the log is offline, if it is damaged (found so at open, or met by a read).
    pub fn damage(&self) -> Option<String> {
        self.inner.borrow().damaged.as_ref().map(|d| d.what.clone())
    }

    /// The offset from which a damaged log refuses reads (everything before its damage is still read).
    pub fn readable_below(&self) -> Option<Offset> {
        self.inner.borrow().damaged.as_ref().map(|d| d.readable_below)
    }

    /// Keeps the log offline for `what` (its partition was found damaged before, and no repair has been
    /// made since), though no damage was met now: appends are refused, every batch is read.
    pub fn keep_offline(&self, what: String) {
        let mut inner = self.inner.borrow_mut();
        if inner.damaged.is_none() {
            let (readable_below, segment, position) = {
                let active = inner.active();
                (active.next_offset, active.base, u64::MAX)
            };
            inner.damaged = Some(Damage { what, readable_below, segment, position });
        }
    }

    /// Takes the log offline for damage a read met at `position` of `path` (the batch that should start
    /// at `offset` does not check), once (see [`take_offline`]); returns the error every later append and
    /// read gets.
    pub(super) async fn damaged_at(
        &self,
        path: PathBuf,
        position: u64,
        offset: Offset,
        reason: String,
    ) -> StorageError {
        let segment = path
            .file_name()
            .and_then(|name| crate::segment::parse_file_name(&name.to_string_lossy(), crate::segment::LOG_SUFFIX))
            .unwrap_or(Offset::ZERO);
        let damage = StorageError::Damaged { path, position, offset, reason };
        if self.inner.borrow().damaged.is_none() {
            let _io = self.io.lock().await;
            if let Err(e) = take_offline(&self.fs, &self.dir, &damage).await {
                tracing::error!(dir = %self.dir.display(), error = %e, "cannot record the damage on disk");
            }
            self.inner.borrow_mut().damaged =
                Some(Damage { what: damage.to_string(), readable_below: offset, segment, position });
        }
        damage
    }

    /// Validates `batch`, assigns it the next offsets, stamps them and `epoch` into it, and queues it for
    /// the disk. Returns as soon as the batch is in memory; see [`PartitionLog::wait_durable`].
    ///
    /// A batch that fails validation, or an epoch older than the latest recorded, leaves the log unchanged.
    ///
    /// Transactional batches are not held to KIP-890's verification here (tests and tools write them
    /// freely); the broker appends clients' batches with [`Self::append_guarded`], which holds them to it.
    pub async fn append(&self, batch: &[u8], epoch: LeaderEpoch) -> Result<AppendInfo> {
        self.append_from_client(batch, epoch, Writer::Client).await
    }

    /// [`Self::append`] for a client's batch, judged as `writer` says.
    pub(super) async fn append_from_client(
        &self,
        batch: &[u8],
        epoch: LeaderEpoch,
        writer: Writer,
    ) -> Result<AppendInfo> {
        let started = std::time::Instant::now();
        let max = self.inner.borrow().config.max_message_bytes;
        let header = batch::validate(batch, max)?;
        let appended = self.append_validated(batch, &header, Some(epoch), writer).await;
        crate::metrics::appended(started.elapsed());
        appended
    }

    /// Appends, as the leader at `epoch`, a batch a coordinator writes: its own records (no producer id), or
    /// a producer's transactional data (the group coordinator's record of a TxnOffsetCommit), with the
    /// producer's id and epoch and no sequence (-1), as Kafka's coordinators write them. Only the producer's
    /// epoch is checked (the coordinator does not know its sequences); the batch opens the producer's
    /// transaction here as a client's would. Never for clients' batches: their sequences are what
    /// idempotence rests on.
    pub async fn append_for_coordinator(&self, batch: &[u8], epoch: LeaderEpoch) -> Result<AppendInfo> {
        let max = self.inner.borrow().config.max_message_bytes;
        let header = batch::validate(batch, max)?;
        self.append_validated(batch, &header, Some(epoch), Writer::Coordinator).await
    }

    /// Appends a validated batch: as the leader at `leader_epoch` (the producer's sequence is checked,
    /// offsets assigned and stamped), or, with `None`, as a follower (see [`Self::append_replicated`]).
    /// `writer` says who wrote it, and so how the leader judges it; a transaction marker (a control batch)
    /// is checked against the producer's epochs when the leader writes it (see [`txn`]).
    pub(super) async fn append_validated(
        &self,
        batch: &[u8],
        header: &BatchHeader,
        leader_epoch: Option<LeaderEpoch>,
        writer: Writer,
    ) -> Result<AppendInfo> {
        let header = *header;
        let marker = match writer {
            Writer::Marker(marker) => Some(marker),
            Writer::Client | Writer::Guarded(_) | Writer::Coordinator => None,
        };
        let epoch = leader_epoch.unwrap_or(LeaderEpoch(header.partition_leader_epoch));
        if epoch.0 < 0 {
            return Err(StorageError::StaleEpoch { epoch: epoch.0, latest: 0 });
        }
        loop {
            self.check_open()?;
            self.check_intact()?;
            let now = self.clock.now_ms();
            let paused = self.inner.borrow().appends_paused.then(|| self.progress.listen());
            if let Some(listener) = paused {
                // Re-checked after registering, so the end of the pause cannot be missed.
                if self.inner.borrow().appends_paused {
                    listener.await;
                }
                continue;
            }
            if self.inner.borrow().producers_stale {
                // Rebuilding walks the segments: nothing may replace them meanwhile.
                let _maintenance = self.maintenance.lock().await;
                let _io = self.io.lock().await;
                self.fresh_producers_locked().await?;
                continue;
            }
            let (roll, write, reserve, batch_last) = {
                let mut inner = self.inner.borrow_mut();
                if let Some(latest) = inner.epochs.latest()
                    && epoch < latest.epoch
                {
                    return Err(StorageError::StaleEpoch { epoch: epoch.0, latest: latest.epoch.0 });
                }
                let batch_last = match leader_epoch {
                    Some(_) => inner.log_end(),
                    None => Offset(header.base_offset as u64).plus(header.last_offset_delta as u64),
                };
                let roll = inner.needs_roll(batch.len() as u64, batch_last, now);
                let write = inner.unwritten_bytes() >= inner.config.max_unwritten_bytes as u64;
                let reserve = inner.needs_reserve(batch.len() as u64);
                if leader_epoch.is_none() && header.base_offset < inner.log_end().as_i64() {
                    return Err(StorageError::NotAtLogEnd { expected: inner.log_end(), got: header.base_offset });
                }
                // The producer's sequence is judged in the same borrow that assigns the offsets: nothing can
                // come between them. (A follower keeps what the leader judged.)
                let verdict = match (leader_epoch, &writer) {
                    (None, _) => Verdict::Append,
                    (Some(_), Writer::Marker(marker)) => {
                        inner.producers.check_marker(marker)?;
                        Verdict::Append
                    }
                    (Some(_), Writer::Coordinator) => inner.producers.check_coordinator_write(&header)?,
                    (Some(_), Writer::Client) => inner.producers.check(&header)?,
                    (Some(_), Writer::Guarded(guard)) => inner.producers.check_guarded(&header, *guard)?,
                };
                if let Verdict::Duplicate(original) = verdict {
                    inner.last_used_ms = now;
                    return Ok(AppendInfo {
                        base_offset: original.base_offset,
                        last_offset: original.last_offset,
                        max_timestamp: header.max_timestamp,
                        duplicate: true,
                    });
                }
                if !roll && !write && !reserve {
                    inner.last_used_ms = now;
                    // A follower keeps the leader's offsets, gaps from compaction included.
                    let base = match leader_epoch {
                        Some(_) => inner.log_end(),
                        None => Offset(header.base_offset as u64),
                    };
                    return Ok(self.append_in_memory(&mut inner, batch, &header, base, epoch, marker.as_ref()));
                }
                (roll, write, reserve, batch_last)
            };
            if roll {
                self.roll_if_needed(batch.len() as u64, batch_last).await?;
            } else if reserve {
                // The batch goes only where blocks are reserved for it: a full disk refuses it here, before
                // it has offsets, rather than failing its write later.
                let _io = self.io.lock().await;
                if self.inner.borrow().needs_reserve(batch.len() as u64) {
                    self.reserve_locked(batch.len() as u64).await?;
                }
            } else if write {
                // Too much waits in memory: write it out. Appenders queued here find, once they hold the
                // lock, that the first one's write made room, and do not write again.
                let _io = self.io.lock().await;
                let still_full = {
                    let inner = self.inner.borrow();
                    inner.unwritten_bytes() >= inner.config.max_unwritten_bytes as u64
                };
                if still_full {
                    self.write_out_locked().await?;
                }
            }
        }
    }
}

/// Who wrote a batch the log appends.
#[derive(Debug, Clone, Copy)]
pub(super) enum Writer {
    /// A producer (or a follower's copy of the leader's batches).
    Client,
    /// A producer, whose batch opening a transaction must present its verification guard (see
    /// [`PartitionLog::append_guarded`]).
    Guarded(Option<VerificationGuard>),
    /// A coordinator, for a producer's transaction: see [`PartitionLog::append_for_coordinator`].
    Coordinator,
    /// The transaction coordinator's marker (a control batch).
    Marker(TxnMarker),
}

impl<F: Fs> PartitionLog<F> {
    fn append_in_memory(
        &self,
        inner: &mut Inner<F>,
        batch: &[u8],
        header: &BatchHeader,
        base: Offset,
        epoch: LeaderEpoch,
        marker: Option<&TxnMarker>,
    ) -> AppendInfo {
        let info = AppendInfo {
            base_offset: base,
            last_offset: base.plus(header.last_offset_delta as u64),
            max_timestamp: header.max_timestamp,
            duplicate: false,
        };
        let room = self.producer_budget.has_room();
        if !room && header.producer_id >= 0 && inner.producers.get(header.producer_id).is_none() {
            tracing::warn!(
                dir = %self.dir.display(),
                producer_id = header.producer_id,
                remembered = self.producer_budget.used(),
                "shard.producer.ids.max reached: this producer's batches are stored but not deduplicated; \
                 raise the setting, or look for clients making up producer ids"
            );
        }
        if inner.epochs.assign(epoch, base) {
            inner.epochs_version += 1;
        }
        if header.attributes & CONTROL_BIT == 0 {
            inner.producers.record(header, base, self.clock.now_ms(), room);
        } else if let Some(marker) = marker
            && let Some(done) = inner.producers.record_marker(marker, base, self.clock.now_ms(), room)
        {
            inner.note_completed(done);
        }
        self.count_producers(inner);
        let interval = inner.config.index_interval_bytes;
        let position = inner.active().size;
        inner.tail.push_stamped(batch, base, epoch, |len| self.fs.alloc_kept(len));
        let meta = BatchMeta {
            position,
            size: batch.len() as u64,
            base_offset: base,
            last_offset: info.last_offset,
            max_timestamp: header.max_timestamp,
            epoch: epoch.0,
        };
        let active = inner.active_mut();
        active.index.on_batch(&meta, interval);
        active.size += batch.len() as u64;
        active.next_offset = info.next_offset();
        debug_assert_eq!(inner.tail.end(), inner.active().size);
        inner.stats.appends += 1;
        inner.trim_tail(&self.fs);
        info
    }
}
