//! Log compaction (`cleanup.policy=compact`): the cleaner that keeps the latest record of every key.
//!
//! Each shard runs one cleaner over its own logs, leader and follower replicas alike (replicas compact on
//! their own; they hold the same records, not the same bytes). Every `log.cleaner.backoff.ms` it looks at
//! each compacted log and cleans it when it is dirty enough. A pass:
//! 1. takes the closed segments wholly below the high watermark, up to the first one with a record
//!    younger than `min.compaction.lag.ms`: the cleanable part. It is cleaned only when the bytes
//!    written since the last pass (at or above the cleaner's checkpoint) are at least
//!    `min.cleanable.dirty.ratio` of it;
//! 2. maps every key in it to the offset of its latest record, segment by segment, while the map stays
//!    within `log.cleaner.dedupe.buffer.size` (what does not fit waits for the next pass);
//! 3. rewrites the mapped segments, in groups that fit `segment.bytes`, keeping a record when it is the
//!    latest of its key, unless it is a tombstone older than `delete.retention.ms`. Records without a
//!    key are dropped (they can only predate the topic's compaction). A batch keeps its offsets and
//!    producer fields; one left without records is dropped, unless it is the last batch of its group
//!    (the group then ends where the next segment begins) or the latest batch of an idempotent producer
//!    the log remembers (its state is rebuilt from that batch): those stay, empty. Control batches and
//!    transactional batches stay whole.
//!
//! The pass reads and writes on the shard's thread, yielding every few batches, so appends and reads of
//! the same log go on meanwhile; only the swap of a finished group holds the log's I/O lock.

use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

use futures_lite::future;
use shardlog_storage::fs::Fs;
use shardlog_storage::log::compaction::MAX_CLEANED_SPAN;
use shardlog_storage::{
    Clock, ClosedSegment, CompactionConfig, LogDir, Offset, PartitionLog, StorageError, SystemClock,
};

use crate::shutdown::Shutdown;
use crate::topics::records::{CONTROL_BIT, OpenBatch, RecordView, TRANSACTIONAL_BIT};

/// Bytes read from a segment at a time.
const READ_CHUNK_BYTES: usize = 1 << 20;
/// Batches handled between yields to the shard's other tasks.
const BATCHES_PER_YIELD: u32 = 64;
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

/// Runs the shard's cleaner until shutdown.
pub async fn run<F: Fs>(logs: Rc<LogDir<F>>, settings: CleanerSettings, shutdown: Shutdown) {
    loop {
        let stop = future::or(
            async {
                glommio::timer::sleep(Duration::from_millis(settings.backoff_ms)).await;
                false
            },
            async {
                shutdown.wait().await;
                true
            },
        )
        .await;
        if stop {
            return;
        }
        for log in logs.logs() {
            let Some(config) = log.config().compaction else { continue };
            let stop = || shutdown.is_triggered();
            match clean(&log, config, SystemClock.now_ms(), settings.dedupe_buffer_bytes, stop).await {
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
/// nothing cleanable. A pass that finds `stop()` true between two batches gives up the group it is
/// cleaning (a swap under way is finished first).
pub async fn clean<F: Fs>(
    log: &PartitionLog<F>,
    config: CompactionConfig,
    now_ms: i64,
    dedupe_buffer_bytes: usize,
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
    let dirty: u64 = cleanable.iter().filter(|s| s.next_offset > cleaned_upto).map(|s| s.size).sum();
    if total == 0 || (dirty as u128) * 1_000_000 < (config.min_cleanable_dirty_ratio_ppm as u128) * (total as u128) {
        return Ok(None);
    }
    let mut pacer = Pacer::default();
    let (map, mapped) = map_keys(log, &cleanable, dedupe_buffer_bytes, &mut pacer).await?;
    if mapped == 0 {
        return Err(CleanError::MapFull(dedupe_buffer_bytes));
    }
    let producers = log.producer_last_offsets();
    let segment_bytes = log.config().segment_bytes;
    let mut stats = CleanStats { segments_before: log.segment_count(), ..CleanStats::default() };
    let rules = Rules { map: &map, producers: &producers, now_ms, delete_retention_ms: config.delete_retention_ms };
    for group in groups(&cleanable[..mapped], segment_bytes) {
        let first = group[0];
        let last = *group.last().expect("a group is never empty");
        let mut cleaned = log.start_cleaned(first.base).await?;
        let mut removed = 0u64;
        for seg in group {
            let mut pos = 0u64;
            loop {
                let Some(chunk) = log.read_closed_segment(seg.base, pos, READ_CHUNK_BYTES).await? else {
                    // Changed under the pass (retention, a cut): the next pass starts afresh.
                    log.abandon_cleaned(cleaned).await;
                    return Ok(Some(finish(log, stats)));
                };
                if chunk.is_empty() {
                    break;
                }
                pos += chunk.len() as u64;
                let mut at = 0usize;
                while at < chunk.len() {
                    let total = shardlog_storage::batch::BatchHeader::parse(&chunk[at..])
                        .map_err(|e| CleanError::Records(e.into()))?
                        .total_bytes();
                    let stored = &chunk[at..at + total];
                    at += total;
                    let (kept, dropped) = rules.filter(stored, last.next_offset)?;
                    removed += dropped;
                    if let Some(kept) = kept {
                        cleaned.push(&kept).await?;
                    }
                    pacer.step().await;
                    if stop() {
                        log.abandon_cleaned(cleaned).await;
                        return Ok(Some(finish(log, stats)));
                    }
                }
            }
        }
        stats.bytes_before += group.iter().map(|s| s.size).sum::<u64>();
        stats.bytes_after += cleaned.size();
        if !log.swap_in_cleaned(cleaned, group, last.next_offset).await? {
            break;
        }
        stats.records_removed += removed;
        stats.cleaned_upto = last.next_offset;
    }
    Ok(Some(finish(log, stats)))
}

fn finish<F: Fs>(log: &PartitionLog<F>, mut stats: CleanStats) -> CleanStats {
    stats.segments_after = log.segment_count();
    stats
}

/// Yields to the shard's other tasks every few batches.
#[derive(Default)]
struct Pacer(u32);

impl Pacer {
    async fn step(&mut self) {
        self.0 += 1;
        if self.0.is_multiple_of(BATCHES_PER_YIELD) {
            future::yield_now().await;
        }
    }
}

/// Maps each key to the offset of its latest record, over as many whole segments of `cleanable` as fit
/// `budget` bytes. Returns the map and how many segments it covers.
async fn map_keys<F: Fs>(
    log: &PartitionLog<F>,
    cleanable: &[ClosedSegment],
    budget: usize,
    pacer: &mut Pacer,
) -> Result<(HashMap<Vec<u8>, u64>, usize), CleanError> {
    let mut map: HashMap<Vec<u8>, u64> = HashMap::new();
    let mut used = 0usize;
    for (i, seg) in cleanable.iter().enumerate() {
        // A segment's keys are gathered apart and taken in whole, or not at all.
        let mut latest: HashMap<Vec<u8>, u64> = HashMap::new();
        let mut added = 0usize;
        let mut pos = 0u64;
        loop {
            let Some(chunk) = log.read_closed_segment(seg.base, pos, READ_CHUNK_BYTES).await? else {
                return Ok((map, i));
            };
            if chunk.is_empty() {
                break;
            }
            pos += chunk.len() as u64;
            let mut at = 0usize;
            while at < chunk.len() {
                let total = shardlog_storage::batch::BatchHeader::parse(&chunk[at..])
                    .map_err(|e| CleanError::Records(e.into()))?
                    .total_bytes();
                let open = OpenBatch::open(&chunk[at..at + total])?;
                at += total;
                pacer.step().await;
                if open.header.attributes & (CONTROL_BIT | TRANSACTIONAL_BIT) != 0 {
                    continue;
                }
                let base = open.header.base_offset as u64;
                for record in open.records()? {
                    let Some(key) = record.key.clone() else { continue };
                    let key = &open.records[key];
                    let offset = base + record.offset_delta.max(0) as u64;
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
                    return Ok((map, i));
                }
            }
        }
        used += added;
        map.extend(latest);
    }
    Ok((map, cleanable.len()))
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

/// What a pass keeps.
struct Rules<'a> {
    map: &'a HashMap<Vec<u8>, u64>,
    producers: &'a HashMap<i64, Offset>,
    now_ms: i64,
    delete_retention_ms: i64,
}

impl Rules<'_> {
    /// The batch as the cleaned segment holds it (`None`: left out) and how many records it lost.
    /// `group_end`: where the group being cleaned ends.
    fn filter(&self, stored: &[u8], group_end: Offset) -> Result<(Option<Vec<u8>>, u64), CleanError> {
        let open = OpenBatch::open(stored)?;
        let h = &open.header;
        if h.attributes & (CONTROL_BIT | TRANSACTIONAL_BIT) != 0 {
            return Ok((Some(stored.to_vec()), 0));
        }
        let base = h.base_offset as u64;
        let last = Offset(base + h.last_offset_delta as u64);
        let tombstones_expire = self.now_ms.saturating_sub(h.max_timestamp) > self.delete_retention_ms;
        let records = open.records()?;
        let kept: Vec<RecordView> = records
            .iter()
            .filter(|r| {
                let Some(key) = &r.key else { return false };
                let latest =
                    self.map.get(&open.records[key.clone()]).is_none_or(|l| *l == base + r.offset_delta as u64);
                latest && !(r.tombstone && tombstones_expire)
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
}

#[cfg(test)]
mod tests;
