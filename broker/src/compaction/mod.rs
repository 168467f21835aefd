//! Log compaction (`cleanup.policy=compact`): the cleaner that keeps the latest record of every key.
//!
//! Each shard runs one cleaner over its own logs, leader and follower replicas alike (replicas compact on
//! their own; they hold the same records, not the same bytes). Every `log.cleaner.backoff.ms` it looks at
//! each compacted log and cleans it when it is dirty enough. A pass:
//! 1. takes the closed segments wholly below the high watermark, up to the first one with a record
//!    younger than `min.compaction.lag.ms`: the cleanable part. It is cleaned only when the bytes
//!    written since the last pass (at or above the cleaner's checkpoint) are at least
//!    `min.cleanable.dirty.ratio` of it;
//! 2. maps every key written since the last pass (at or above the cleaner's checkpoint: below it each key
//!    has one record left) to the offset of its latest record, segment by segment, while the map stays
//!    within `log.cleaner.dedupe.buffer.size` (what does not fit waits for the next pass);
//! 3. rewrites the mapped segments, in groups that fit `segment.bytes`, keeping a record when it is the
//!    latest of its key, unless it is a tombstone first cleaned more than `delete.retention.ms` ago
//!    (see [`Horizons`]). Records without a
//!    key are dropped (they can only predate the topic's compaction). A batch keeps its offsets and
//!    producer fields; one left without records is dropped, unless it is the last batch of its group
//!    (the group then ends where the next segment begins) or the latest batch of an idempotent producer
//!    the log remembers (its state is rebuilt from that batch): those stay, empty. Batches whose
//!    records do not decode stay whole. Transactions (aborted ones' records removed, markers kept until
//!    their transaction's batches are gone and then for `delete.retention.ms`, committed ones' records
//!    kept whole) follow [`txn`]; the storage engine offers nothing at or past the first unstable offset.
//!
//! The pass reads and writes on the shard's thread, yielding every few batches, so appends and reads of
//! the same log go on meanwhile; only the swap of a finished group holds the log's I/O lock.

use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::{Rc, Weak};
use std::time::Duration;

use futures_lite::future;
use shardlog_storage::batch::BatchHeader;
use shardlog_storage::fs::Fs;
use shardlog_storage::log::compaction::MAX_CLEANED_SPAN;
use shardlog_storage::txn::TxnMarker;
use shardlog_storage::{
    CleanedSegment, Clock, ClosedSegment, CompactionConfig, LogDir, Offset, PartitionLog, StorageError, SystemClock,
};

use crate::shutdown::Shutdown;
use crate::topics::records::{CONTROL_BIT, OpenBatch, RecordView, TRANSACTIONAL_BIT};

mod txn;

use txn::TxnCleaning;

/// Bytes read from a segment at a time.
const READ_CHUNK_BYTES: usize = 1 << 20;
/// Batches, or bytes of them, handled between yields to the shard's other tasks.
const BATCHES_PER_YIELD: u32 = 64;
const BYTES_PER_YIELD: usize = 1 << 20;
/// What one key costs in the map besides its bytes (the offset, the hash table's share).
const KEY_OVERHEAD_BYTES: usize = 48;

/// The cleaner's broker settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanerSettings {
    /// `log.cleaner.backoff.ms`: the pause between looks at the shard's compacted logs.
    pub backoff_ms: u64,
    /// `log.cleaner.dedupe.buffer.size`: the most memory one pass's key map takes (per shard).
    pub dedupe_buffer_bytes: usize,
}

/// What a pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CleanStats {
    pub segments_before: usize,
    pub segments_after: usize,
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub records_removed: u64,
    /// The offset below which the log is now cleaned.
    pub cleaned_upto: Offset,
}

/// Why a pass stopped.
#[derive(Debug, thiserror::Error)]
pub enum CleanError {
    #[error(transparent)]
    Storage(#[from] StorageError),
    #[error("a stored batch does not decode: {0}")]
    Records(#[from] crate::topics::recompress::RecompressError),
    #[error(
        "the keys of one segment need more than log.cleaner.dedupe.buffer.size ({0} bytes): raise it to compact this log"
    )]
    MapFull(usize),
}

/// When the cleaner first cleaned each part of one log: marks (cleaned up to, at), in offset order. A
/// tombstone stays `delete.retention.ms` from the first pass that cleaned it (Kafka's delete horizon,
/// KIP-534), not from its timestamp, which a client sets: a consumer that read the key's old value has
/// that long to read its deletion. The marks live in memory: after a restart, what was cleaned before
/// counts as first cleaned by the first pass after it (tombstones then stay longer, never less long).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Horizons {
    marks: Vec<(Offset, i64)>,
    /// The log's count of end cuts when the marks were last brought up to date.
    end_cuts: Option<u64>,
}

impl Horizons {
    /// After a cut of the log's end (a truncation), what was written again above the cleaner's
    /// checkpoint has not been cleaned: the marks stop at it.
    fn follow_cuts(&mut self, end_cuts: u64, cleaned_upto: Offset) {
        if self.end_cuts.is_some_and(|seen| seen != end_cuts)
            && let Some(i) = self.marks.iter().position(|(upto, _)| *upto > cleaned_upto)
        {
            let at = self.marks[i].1;
            let below = i.checked_sub(1).map_or(Offset::ZERO, |p| self.marks[p].0);
            self.marks.truncate(i);
            if below < cleaned_upto {
                self.marks.push((cleaned_upto, at));
            }
        }
        self.end_cuts = Some(end_cuts);
    }

    /// When the record at `offset` was first cleaned, if it was.
    fn first_cleaned(&self, offset: Offset) -> Option<i64> {
        let i = self.marks.partition_point(|(upto, _)| *upto <= offset);
        self.marks.get(i).map(|(_, at)| *at)
    }

    /// Records that the log is cleaned below `upto` at `now_ms`; marks older than `retention_ms` are
    /// merged into the newest of them (every tombstone below it may go already).
    fn note(&mut self, upto: Offset, now_ms: i64, retention_ms: i64) {
        if self.marks.last().is_none_or(|(u, _)| upto > *u) {
            self.marks.push((upto, now_ms));
        }
        let expired = self.marks.partition_point(|(_, at)| now_ms.saturating_sub(*at) > retention_ms);
        if expired > 1 {
            self.marks.drain(..expired - 1);
        }
    }
}

/// Runs the shard's cleaner until shutdown.
pub async fn run<F: Fs>(logs: Rc<LogDir<F>>, settings: CleanerSettings, shutdown: Shutdown) {
    // Per log, keyed by its directory and kept only for the same log (a topic deleted and created again
    // gets a new one).
    let mut horizons: HashMap<PathBuf, (Weak<PartitionLog<F>>, Horizons)> = HashMap::new();
    loop {
        if shutdown.sleep(Duration::from_millis(settings.backoff_ms)).await {
            return;
        }
        let logs = logs.logs();
        horizons.retain(|_, (log, _)| log.strong_count() > 0);
        for log in logs {
            let Some(config) = log.config().compaction else { continue };
            // A damaged log is kept as found, for its rebuild or repair.
            if log.damage().is_some() {
                continue;
            }
            let stop = || shutdown.is_triggered();
            let this = Rc::downgrade(&log);
            let entry = horizons.entry(log.dir().to_path_buf()).or_insert_with(|| (this.clone(), Horizons::default()));
            if !entry.0.ptr_eq(&this) {
                *entry = (this, Horizons::default());
            }
            let marks = &mut entry.1;
            match clean(&log, config, SystemClock.now_ms(), settings.dedupe_buffer_bytes, marks, stop).await {
                Ok(Some(stats)) => tracing::debug!(log = %log.dir().display(), ?stats, "compacted"),
                Ok(None) => {}
                // Closed or deleted meanwhile: nothing to say.
                Err(CleanError::Storage(StorageError::Closed(_))) => {}
                Err(e) => tracing::warn!(log = %log.dir().display(), error = %e, "compaction pass failed"),
            }
            if shutdown.is_triggered() {
                return;
            }
        }
    }
}

/// One pass over `log` (see the module documentation). `None` when it was not dirty enough or had
/// nothing cleanable. A pass that finds `stop()` true between two batches gives up (a swap under way is
/// finished first).
pub async fn clean<F: Fs>(
    log: &PartitionLog<F>,
    config: CompactionConfig,
    now_ms: i64,
    dedupe_buffer_bytes: usize,
    horizons: &mut Horizons,
    stop: impl Fn() -> bool,
) -> Result<Option<CleanStats>, CleanError> {
    let lag = config.min_compaction_lag_ms;
    let cleanable: Vec<ClosedSegment> = log
        .closed_segments()
        .into_iter()
        .take_while(|s| lag <= 0 || s.max_timestamp < 0 || now_ms.saturating_sub(s.max_timestamp) >= lag)
        .collect();
    let total: u64 = cleanable.iter().map(|s| s.size).sum();
    let cleaned_upto = log.cleaned_upto();
    let dirty: Vec<ClosedSegment> = cleanable.iter().filter(|s| s.next_offset > cleaned_upto).copied().collect();
    let dirty_bytes: u64 = dirty.iter().map(|s| s.size).sum();
    let ratio = config.min_cleanable_dirty_ratio_ppm as u128;
    if total == 0 || (dirty_bytes as u128) * 1_000_000 < ratio * (total as u128) {
        return Ok(None);
    }
    horizons.follow_cuts(log.end_cuts(), cleaned_upto);
    if horizons.marks.is_empty() && cleaned_upto > log.log_start_offset() {
        // Cleaned before this process began, at a time not known: from now, then.
        horizons.note(cleaned_upto, now_ms, config.delete_retention_ms);
    }
    let end_cuts = log.end_cuts();
    let mut pacer = Pacer::default();
    // Only the part written since the last pass is mapped: below it every key has one record left (the
    // latest as of that pass), which a later record of the same key in the map replaces.
    let Some((map, mapped)) = map_keys(log, &dirty, dedupe_buffer_bytes, &mut pacer, &stop).await? else {
        return Ok(None);
    };
    if !dirty.is_empty() && mapped == 0 {
        return Err(CleanError::MapFull(dedupe_buffer_bytes));
    }
    let mapped_end = dirty[..mapped].last().map_or(cleaned_upto, |s| s.next_offset);
    let to_clean: Vec<ClosedSegment> = cleanable.iter().filter(|s| s.next_offset <= mapped_end).copied().collect();
    if to_clean.is_empty() {
        return Ok(None);
    }
    let producers = log.producer_last_offsets();
    let mut txns = TxnCleaning::new(log.aborted_txns(to_clean[0].base, to_clean[to_clean.len() - 1].next_offset));
    let segment_bytes = log.config().segment_bytes;
    let mut stats = CleanStats { segments_before: log.segment_count(), ..CleanStats::default() };
    let rules =
        Rules { map: &map, producers: &producers, horizons, now_ms, delete_retention_ms: config.delete_retention_ms };
    for group in groups(&to_clean, segment_bytes) {
        let first = group[0];
        let last = *group.last().expect("a group is never empty");
        let mut cleaned = log.start_cleaned(first.base).await?;
        let outcome = clean_group(log, group, &rules, &mut txns, &mut cleaned, &mut pacer, &stop).await;
        let removed = match outcome {
            Ok(Some(removed)) => removed,
            // Stopped, or the segments changed under the pass (retention, a cut): the next pass starts afresh.
            Ok(None) => {
                log.abandon_cleaned(cleaned).await;
                return Ok(Some(finish(log, stats)));
            }
            Err(e) => {
                log.abandon_cleaned(cleaned).await;
                return Err(e);
            }
        };
        let (before, after) = (group.iter().map(|s| s.size).sum::<u64>(), cleaned.size());
        if !log.swap_in_cleaned(cleaned, group, last.next_offset, end_cuts).await? {
            break;
        }
        stats.bytes_before += before;
        stats.bytes_after += after;
        stats.records_removed += removed;
        stats.cleaned_upto = last.next_offset;
    }
    if stats.cleaned_upto == mapped_end {
        horizons.note(mapped_end, now_ms, config.delete_retention_ms);
    }
    if stats.cleaned_upto > Offset::ZERO {
        log.checkpoint_cleaned().await?;
    }
    Ok(Some(finish(log, stats)))
}

/// Writes the cleaned form of `group`'s batches into `cleaned`. `None` when stopped or when a segment
/// changed meanwhile; otherwise how many records were removed.
async fn clean_group<F: Fs>(
    log: &PartitionLog<F>,
    group: &[ClosedSegment],
    rules: &Rules<'_>,
    txns: &mut TxnCleaning,
    cleaned: &mut CleanedSegment<F>,
    pacer: &mut Pacer,
    stop: &impl Fn() -> bool,
) -> Result<Option<u64>, CleanError> {
    let group_end = group.last().expect("a group is never empty").next_offset;
    let mut removed = 0u64;
    for seg in group {
        let mut pos = 0u64;
        loop {
            let Some(chunk) = log.read_closed_segment(seg.base, pos, READ_CHUNK_BYTES).await? else {
                return Ok(None);
            };
            if chunk.is_empty() {
                break;
            }
            pos += chunk.len() as u64;
            for stored in batches(&chunk) {
                let (kept, dropped) = rules.filter(stored, group_end, txns)?;
                removed += dropped;
                if let Some(kept) = kept {
                    cleaned.push(&kept).await?;
                }
                pacer.step(stored.len()).await;
                if stop() {
                    return Ok(None);
                }
            }
        }
    }
    Ok(Some(removed))
}

/// The whole batches of a chunk `read_closed_segment` returned (it checked their lengths and CRCs).
fn batches(chunk: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut at = 0usize;
    std::iter::from_fn(move || {
        let header = BatchHeader::parse(chunk.get(at..)?).ok()?;
        let stored = chunk.get(at..at + header.total_bytes())?;
        at += stored.len();
        Some(stored)
    })
}

/// A data batch's records, or `None` for a batch the cleaner leaves whole: control and transactional
/// batches, and one whose records do not decode (stored before the topic was compacted, say: its keys
/// are not known, so it is kept as it is).
fn open_records(stored: &[u8]) -> Option<(OpenBatch, Vec<RecordView>)> {
    let open = OpenBatch::open(stored).ok()?;
    if open.header.attributes & (CONTROL_BIT | TRANSACTIONAL_BIT) != 0 {
        return None;
    }
    let records = match open.records() {
        Ok(records) => records,
        Err(e) => {
            tracing::debug!(base_offset = open.header.base_offset, error = %e, "batch kept whole: its records do not decode");
            return None;
        }
    };
    Some((open, records))
}

fn finish<F: Fs>(log: &PartitionLog<F>, mut stats: CleanStats) -> CleanStats {
    stats.segments_after = log.segment_count();
    stats
}

/// Yields to the shard's other tasks every few batches or bytes.
#[derive(Default)]
struct Pacer {
    batches: u32,
    bytes: usize,
}

impl Pacer {
    async fn step(&mut self, bytes: usize) {
        self.batches += 1;
        self.bytes += bytes;
        if self.batches >= BATCHES_PER_YIELD || self.bytes >= BYTES_PER_YIELD {
            *self = Pacer::default();
            future::yield_now().await;
        }
    }
}

/// Maps each key to the offset of its latest record, over as many whole segments of `dirty` as fit
/// `budget` bytes. Returns the map and how many segments it covers; `None` when stopped.
async fn map_keys<F: Fs>(
    log: &PartitionLog<F>,
    dirty: &[ClosedSegment],
    budget: usize,
    pacer: &mut Pacer,
    stop: &impl Fn() -> bool,
) -> Result<Option<(HashMap<Vec<u8>, u64>, usize)>, CleanError> {
    let mut map: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut used = 0usize;
    for (i, seg) in dirty.iter().enumerate() {
        // A segment's keys are gathered apart and taken in whole, or not at all.
        let mut latest: HashMap<Vec<u8>, u64> = HashMap::new();
        let mut added = 0usize;
        let mut pos = 0u64;
        loop {
            let Some(chunk) = log.read_closed_segment(seg.base, pos, READ_CHUNK_BYTES).await? else {
                return Ok(Some((map, i)));
            };
            if chunk.is_empty() {
                break;
            }
            pos += chunk.len() as u64;
            for stored in batches(&chunk) {
                pacer.step(stored.len()).await;
                if stop() {
                    return Ok(None);
                }
                let Some((open, records)) = open_records(stored) else { continue };
                for record in &records {
                    let Some(key) = record.key.clone() else { continue };
                    let key = &open.records[key];
                    let offset = open.offset_of(record);
                    if let Some(at) = latest.get_mut(key) {
                        *at = offset;
                        continue;
                    }
                    if !map.contains_key(key) {
                        added += key.len() + KEY_OVERHEAD_BYTES;
                    }
                    latest.insert(key.to_vec(), offset);
                }
                if used + added > budget {
                    return Ok(Some((map, i)));
                }
            }
        }
        used += added;
        map.extend(latest);
    }
    Ok(Some((map, dirty.len())))
}

/// Consecutive segments rewritten into one: together no larger than `segment_bytes` (what they hold
/// can only shrink) and spanning fewer offsets than a segment's index can hold.
fn groups(segments: &[ClosedSegment], segment_bytes: u64) -> Vec<&[ClosedSegment]> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < segments.len() {
        let mut end = start + 1;
        let mut size = segments[start].size;
        while end < segments.len()
            && size + segments[end].size <= segment_bytes
            && segments[end].next_offset.0 - segments[start].base.0 < MAX_CLEANED_SPAN
        {
            size += segments[end].size;
            end += 1;
        }
        out.push(&segments[start..end]);
        start = end;
    }
    out
}

/// A batch as the cleaned segment holds it (`None`: left out) and how many records it lost.
type Filtered = (Option<Vec<u8>>, u64);

/// What a pass keeps.
struct Rules<'a> {
    /// The latest offset of each key written since the last pass.
    map: &'a HashMap<Vec<u8>, u64>,
    producers: &'a HashMap<i64, Offset>,
    horizons: &'a Horizons,
    now_ms: i64,
    delete_retention_ms: i64,
}

impl Rules<'_> {
    /// The batch as the cleaned segment holds it (`None`: left out) and how many records it lost.
    /// `group_end`: where the group being cleaned ends; `txns`: the pass's transactions so far.
    fn filter(&self, stored: &[u8], group_end: Offset, txns: &mut TxnCleaning) -> Result<Filtered, CleanError> {
        if let Some(outcome) = self.filter_transactional(stored, group_end, txns)? {
            return Ok(outcome);
        }
        let Some((open, records)) = open_records(stored) else { return Ok((Some(stored.to_vec()), 0)) };
        let h = &open.header;
        let last = Offset(h.base_offset as u64 + h.last_offset_delta as u64);
        let kept: Vec<RecordView> = records
            .iter()
            .filter(|r| {
                let Some(key) = &r.key else { return false };
                let offset = open.offset_of(r);
                // Not in the map: the key's one record from before the last pass, still its latest.
                let latest = self.map.get(&open.records[key.clone()]).is_none_or(|l| *l == offset);
                latest && !(r.tombstone && self.tombstone_expired(Offset(offset)))
            })
            .cloned()
            .collect();
        let dropped = (records.len() - kept.len()) as u64;
        if dropped == 0 {
            return Ok((Some(stored.to_vec()), 0));
        }
        let needed =
            last.plus(1) == group_end || (h.producer_id >= 0 && self.producers.get(&h.producer_id) == Some(&last));
        if kept.is_empty() && !needed {
            return Ok((None, dropped));
        }
        Ok((Some(open.rebuild(stored, &kept)?), dropped))
    }

    /// [`Self::filter`] for a control or transactional batch (see [`txn`]); `None` for any other.
    fn filter_transactional(
        &self,
        stored: &[u8],
        group_end: Offset,
        txns: &mut TxnCleaning,
    ) -> Result<Option<Filtered>, CleanError> {
        let Ok(h) = BatchHeader::parse(stored) else { return Ok(None) };
        let (control, transactional) = (h.attributes & CONTROL_BIT != 0, h.attributes & TRANSACTIONAL_BIT != 0);
        if !control && !transactional {
            return Ok(None);
        }
        let base = Offset(h.base_offset as u64);
        let last = base.plus(h.last_offset_delta as u64);
        let needed =
            last.plus(1) == group_end || (h.producer_id >= 0 && self.producers.get(&h.producer_id) == Some(&last));
        let kept_whole = Some((Some(stored.to_vec()), 0));
        let records = h.record_count.max(0) as u64;
        if control {
            let kind = TxnMarker::decode(stored).map(|m| m.kind);
            let unneeded = txns.on_marker(h.producer_id, last, kind) && !needed;
            return Ok(if unneeded && self.tombstone_expired(base) { Some((None, records)) } else { kept_whole });
        }
        if !txns.on_data(h.producer_id, last) {
            return Ok(kept_whole);
        }
        if !needed {
            return Ok(Some((None, records)));
        }
        if records == 0 {
            return Ok(kept_whole);
        }
        let open = OpenBatch::open(stored)?;
        Ok(Some((Some(open.rebuild(stored, &[])?), records)))
    }

    /// A tombstone goes once `delete.retention.ms` have passed since a pass first cleaned it.
    fn tombstone_expired(&self, offset: Offset) -> bool {
        self.horizons.first_cleaned(offset).is_some_and(|at| self.now_ms.saturating_sub(at) > self.delete_retention_ms)
    }
}

#[cfg(test)]
mod tests;
