//! Opening a partition log: finding its segments, validating what cannot be trusted, truncating a torn or
//! damaged tail, and rebuilding missing or inconsistent indexes.
//!
//! Segments wholly below the recovery point were synced before the point was checkpointed, so they are
//! trusted: only their index files are checked. Every later segment is scanned batch by batch (length
//! bounded by the file before anything is read, then magic, CRC32C and offset contiguity). A torn write
//! can only be at the end of the last segment, past the recovery point: there the log is cut at the first
//! invalid batch. An invalid batch anywhere else is damage the disk did to durable data: nothing is cut
//! or removed, and the open fails with [`StorageError::Damaged`] naming the file and position (the data
//! dir then keeps the partition offline until it is repaired). After a clean close nothing is scanned but
//! the last index interval of the active segment, which is needed to find the log end.

use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

use async_lock::Mutex;

use crate::batch::{BatchHeader, HEADER_BYTES};
use crate::durable::{self, read_failure};
use crate::epoch_cache::LeaderEpochCache;
use crate::error::{Result, StorageError};
use crate::fatal;
use crate::fs::open_files::{DEFAULT_MAX_OPEN_FILES, OpenFiles};
use crate::fs::{Fs, SegmentFile, align_down};
use crate::producer_state::{ProducerBudget, ProducerStates};
use crate::segment::index::{BatchMeta, OFFSET_ENTRY_BYTES, SegmentIndex, TIME_ENTRY_BYTES};
use crate::segment::{self, ScanStop, Segment};
use crate::space::SpaceFloor;
use crate::types::{Clock, LeaderEpoch, Offset};

use super::compaction;
use super::maintenance::{create_segment, write_index_files};
use super::{Inner, LEADER_EPOCH_FILE, LogConfig, LogStats, PartitionLog, Tail};

/// How much of the log must be validated on open.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// The log was closed cleanly (the data dir's clean-shutdown marker was present).
    Clean,
    /// Segments wholly below this offset are trusted; the rest are scanned.
    FromRecoveryPoint(Offset),
}

/// What the log found on the disk it opened, and what it did about it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenReport {
    pub segments: usize,
    /// Segments validated batch by batch.
    pub scanned_segments: usize,
    pub scanned_bytes: u64,
    /// Bytes cut from the end of the log (torn or invalid batches, and zero padding).
    pub truncated_bytes: u64,
    /// Segments removed because they followed a damaged one.
    pub removed_segments: usize,
    /// Segments whose index files were missing or inconsistent and were rebuilt.
    pub rebuilt_indexes: usize,
    /// Why the log was cut, when it was cut at something other than zero padding.
    pub damage: Option<String>,
    /// The producer-state snapshot the idempotent producers' state was rebuilt from, if any.
    pub producer_snapshot: Option<Offset>,
    /// Batch bytes read after it to bring that state to the log end.
    pub producer_replayed_bytes: u64,
}

/// What the data dir's checkpoints say about a log, and what to do with damage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenHints {
    pub recovery: Recovery,
    pub log_start: Offset,
    pub high_watermark: Offset,
    pub on_damage: OnDamage,
}

impl Default for OpenHints {
    fn default() -> Self {
        OpenHints {
            recovery: Recovery::FromRecoveryPoint(Offset::ZERO),
            log_start: Offset::ZERO,
            high_watermark: Offset::ZERO,
            on_damage: OnDamage::Fail,
        }
    }
}

/// What an open does with damage (anything a crash cannot explain).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnDamage {
    /// The open fails with [`StorageError::Damaged`].
    #[default]
    Fail,
    /// The log opens damaged ([`PartitionLog::damage`]): what lies before the damage is read, nothing is
    /// appended, and nothing is cut, removed or rewritten (but index files rebuilt from a scan).
    KeepReadable,
    /// As `KeepReadable`, for a log already known damaged (its [`super::DAMAGED_FILE`] is there): every
    /// segment is scanned to find the damage again, and since nothing was appended after it, any early
    /// stop but zero padding at the very end is damage, never a torn tail.
    Known,
}

impl<F: Fs> PartitionLog<F> {
    /// Opens (or creates) the log in `dir`. See the module documentation for what is validated.
    pub async fn open(
        fs: F,
        clock: Rc<dyn Clock>,
        dir: &Path,
        config: LogConfig,
        hints: OpenHints,
    ) -> Result<(PartitionLog<F>, OpenReport)> {
        let files = OpenFiles::new(fs, DEFAULT_MAX_OPEN_FILES);
        let budget = Rc::new(ProducerBudget::unlimited());
        Self::open_with_files(files, budget, SpaceFloor::new(0), clock, dir, config, hints).await
    }

    /// Like [`PartitionLog::open`], with segment files opened through `files`, which the owner's other
    /// logs share (so the bound on open files holds for all of them), producer ids counted in their
    /// shared `producer_budget`, and reservations kept above the filesystem's free-space floor `space`.
    pub async fn open_with_files(
        files: Rc<OpenFiles<F>>,
        producer_budget: Rc<ProducerBudget>,
        space: Arc<SpaceFloor>,
        clock: Rc<dyn Clock>,
        dir: &Path,
        config: LogConfig,
        hints: OpenHints,
    ) -> Result<(PartitionLog<F>, OpenReport)> {
        let fs = files.fs().clone();
        config.validate()?;
        if !fs.exists(dir) {
            fs.create_dir_all(dir).await.map_err(|e| StorageError::io("create directory", dir, e))?;
            durable::sync_parent(&fs, dir).await;
        }
        // A cleaned segment swapped in part-way is swapped in whole; one not yet committed is dropped.
        for name in fs.list_dir(dir).map_err(|e| StorageError::io("list", dir, e))? {
            if let Some(base) = segment::parse_file_name(&name, compaction::SWAP_SUFFIX) {
                compaction::finish_swap(&fs, dir, base).await?;
            }
        }
        let names = fs.list_dir(dir).map_err(|e| StorageError::io("list", dir, e))?;
        let mut bases: Vec<Offset> =
            names.iter().filter_map(|n| segment::parse_file_name(n, segment::LOG_SUFFIX)).collect();
        bases.sort();
        let mut removed_strays = false;
        for name in &names {
            let orphan_index = [segment::INDEX_SUFFIX, segment::TIME_INDEX_SUFFIX, segment::TXN_INDEX_SUFFIX]
                .iter()
                .any(|suffix| segment::parse_file_name(name, suffix).is_some_and(|b| !bases.contains(&b)));
            if name.ends_with(".tmp") || name.ends_with(compaction::CLEANED_SUFFIX) || orphan_index {
                let path = dir.join(name);
                if let Err(e) = fs.remove(&path).await {
                    fatal::disk_failure("remove", &path, &e);
                }
                removed_strays = true;
            }
        }
        // An empty segment holds nothing, and only a roll cut short leaves one anywhere but at the end,
        // where it would make the segment before it look damaged: keep the newest empty one only when
        // every segment is empty.
        let mut sizes = Vec::with_capacity(bases.len());
        for &base in &bases {
            let path = dir.join(segment::file_name(base, segment::LOG_SUFFIX));
            let file = fs.open(&path, false).await.map_err(|e| StorageError::io("open segment", &path, e))?;
            sizes.push(file.size().await.map_err(|e| StorageError::io("stat", &path, e))?);
        }
        let all_empty = sizes.iter().all(|&s| s == 0);
        let gaps = read_gaps(&fs, dir).await?;
        let mut kept = Vec::with_capacity(bases.len());
        for (i, (&base, &size)) in bases.iter().zip(&sizes).enumerate() {
            let last = i + 1 == bases.len();
            // The empty segment a repair made to continue after a gap is the log's end, not a stray.
            let continues_gap = last && gaps.iter().any(|&(_, to)| to == base);
            if size == 0 && !(all_empty && last) && !continues_gap {
                for suffix in
                    [segment::INDEX_SUFFIX, segment::TIME_INDEX_SUFFIX, segment::TXN_INDEX_SUFFIX, segment::LOG_SUFFIX]
                {
                    let path = dir.join(segment::file_name(base, suffix));
                    if fs.exists(&path)
                        && let Err(e) = fs.remove(&path).await
                    {
                        fatal::disk_failure("remove", &path, &e);
                    }
                }
                removed_strays = true;
            } else {
                kept.push(base);
            }
        }
        let bases = kept;
        let epoch_path = dir.join(LEADER_EPOCH_FILE);
        let mut epochs = match durable::read_file(&fs, &epoch_path, 1 << 20).await? {
            Some(bytes) => {
                let text = std::str::from_utf8(&bytes)
                    .map_err(|e| StorageError::CorruptFile { path: epoch_path.clone(), detail: e.to_string() })?;
                LeaderEpochCache::decode(&epoch_path, text)?
            }
            None => LeaderEpochCache::default(),
        };

        let mut report = OpenReport::default();
        let mut segments: Vec<Segment<F>> = Vec::new();
        let known_damaged = hints.on_damage == OnDamage::Known;
        // The damage found, with its segment's base and byte position, when the log opens damaged.
        let mut found: Option<(StorageError, Offset, u64)> = None;
        let mut epoch_starts: Vec<(LeaderEpoch, Offset)> = Vec::new();
        let now = clock.now_ms();
        let first_scanned = match hints.recovery {
            Recovery::Clean => bases.len(),
            Recovery::FromRecoveryPoint(rp) => bases.partition_point(|b| *b <= rp).saturating_sub(1),
        };
        let crashed = !matches!(hints.recovery, Recovery::Clean);
        // Below this, everything was durable: the recovery point, unless a truncation since went lower.
        let truncated_to = match durable::read_file(&fs, &dir.join(super::TRUNCATED_TO_FILE), 64).await? {
            Some(bytes) => Some(
                std::str::from_utf8(&bytes).ok().and_then(|t| t.trim().parse::<u64>().ok()).map(Offset).ok_or_else(
                    || StorageError::CorruptFile {
                        path: dir.join(super::TRUNCATED_TO_FILE),
                        detail: "not an offset".into(),
                    },
                )?,
            ),
            None => None,
        };
        // `None` after a clean close (nothing was left unsynced).
        let durable_below = match hints.recovery {
            Recovery::Clean => None,
            Recovery::FromRecoveryPoint(rp) => Some(truncated_to.map_or(rp, |t| rp.min(t))),
        };
        for (i, &base) in bases.iter().enumerate() {
            let next_base = bases.get(i + 1).copied();
            // The segment holding the recovery point is trusted up to what its index files describe: they
            // hold entries only for synced batches (see `index_files`); the batches after them are validated.
            let trust = match (i.cmp(&first_scanned), next_base) {
                _ if known_damaged => Trust::Nothing,
                (std::cmp::Ordering::Less, _) => Trust::Whole,
                (std::cmp::Ordering::Equal, None) if crashed => Trust::UpToIndex,
                (std::cmp::Ordering::Equal, Some(_)) => Trust::Whole,
                _ => Trust::Nothing,
            };
            // Where this segment must end: where the next begins, or where a repair's gap before it begins.
            let expected_end = next_base.map(|nb| gaps.iter().find(|&&(_, to)| to == nb).map_or(nb, |&(from, _)| from));
            let loaded =
                load_segment(&fs, &files, dir, base, expected_end, trust, &config, now, &mut epoch_starts, &mut report)
                    .await?;
            let damaged =
                loaded.size < loaded.file_size || expected_end.is_some_and(|end| loaded.segment.next_offset != end);
            let torn = if known_damaged {
                next_base.is_none() && loaded.stop == ScanStop::ZeroPadding
            } else {
                torn_write_possible(&loaded, next_base, durable_below)
            };
            if damaged && !torn {
                // Nothing is cut or removed: the data after the damage is intact and may be recovered.
                let reason = loaded.stop.reason().unwrap_or_else(|| {
                    format!(
                        "the segment ends at offset {} but the next one starts at {}",
                        loaded.segment.next_offset,
                        next_base.expect("a gap needs a next segment")
                    )
                });
                let damage = StorageError::Damaged {
                    path: loaded.segment.log_path(),
                    position: loaded.size,
                    offset: loaded.segment.next_offset,
                    reason,
                };
                if hints.on_damage == OnDamage::Fail {
                    return Err(damage);
                }
                // Served read-only up to the damage: the segment keeps its bytes, the later ones stay.
                found = Some((damage, loaded.segment.base, loaded.size));
                segments.push(loaded.segment);
                break;
            }
            let mut loaded = loaded;
            if loaded.size < loaded.file_size {
                loaded.segment.allocated = loaded.size;
                let path = loaded.segment.log_path();
                let file = files.get(&loaded.segment.file).await.map_err(|e| StorageError::io("open", &path, e))?;
                if let Err(e) = file.truncate(loaded.size).await {
                    fatal::disk_failure("truncate", &path, &e);
                }
                if let Err(e) = file.fdatasync().await {
                    fatal::disk_failure("fdatasync", &path, &e);
                }
                report.truncated_bytes += loaded.file_size - loaded.size;
            }
            segments.push(loaded.segment);
            if damaged {
                for &later in &bases[i + 1..] {
                    for suffix in [
                        segment::INDEX_SUFFIX,
                        segment::TIME_INDEX_SUFFIX,
                        segment::TXN_INDEX_SUFFIX,
                        segment::LOG_SUFFIX,
                    ] {
                        let path = dir.join(segment::file_name(later, suffix));
                        if fs.exists(&path)
                            && let Err(e) = fs.remove(&path).await
                        {
                            fatal::disk_failure("remove", &path, &e);
                        }
                    }
                    report.removed_segments += 1;
                }
                removed_strays = true;
                break;
            }
        }
        if segments.is_empty() {
            segments.push(create_segment(&fs, &files, dir, hints.log_start, now).await?);
        }
        if removed_strays {
            durable::sync_dir(&fs, dir).await;
        }
        report.segments = segments.len();

        let log_end = segments.last().expect("at least one segment").next_offset;
        // Everything below the recovery point was synced: a log that ends before it lost durable data,
        // even when what is left looks whole (a file cut at a batch boundary, a segment gone).
        if let Some(rp) = durable_below
            && log_end < rp
            && rp > hints.log_start
            && found.is_none()
        {
            let last = segments.last().expect("at least one segment");
            let damage = StorageError::Damaged {
                path: last.log_path(),
                position: last.size,
                offset: log_end,
                reason: format!("the log ends at offset {log_end}, below its recovery point {rp}"),
            };
            if hints.on_damage == OnDamage::Fail {
                return Err(damage);
            }
            found = Some((damage, last.base, last.size));
        }
        let mut epochs_dirty = epochs.truncate_from_end(log_end);
        for (epoch, start) in epoch_starts {
            // The epoch field is outside the CRC: an entry out of order is damage, not a new epoch.
            if epochs.latest().is_none_or(|l| epoch > l.epoch && start >= l.start_offset) && start < log_end {
                epochs.assign(epoch, start);
                epochs_dirty = true;
            }
        }
        let log_start = hints.log_start.max(segments[0].base).min(log_end);
        epochs_dirty |= epochs.clamp(log_start, log_end);

        let active = segments.last().expect("at least one segment");
        let tail_start = align_down(active.size);
        let tail_bytes = files
            .get(&active.file)
            .await
            .map_err(|e| StorageError::io("open", active.log_path(), e))?
            .read_at(tail_start, (active.size - tail_start) as usize)
            .await
            .map_err(|e| read_failure("read", &active.log_path(), e))?;
        if tail_bytes.len() as u64 != active.size - tail_start {
            return Err(StorageError::CorruptFile {
                path: active.log_path(),
                detail: "shorter than its batches".into(),
            });
        }
        let tail = Tail::from_disk(tail_start, &tail_bytes, active.size, |len| fs.alloc_kept(len));
        let cleaner_path = dir.join(compaction::CLEANER_CHECKPOINT_FILE);
        // Only the cleaner's dirty ratio depends on it: unreadable, the whole log counts as dirty.
        let cleaned_upto = durable::read_file(&fs, &cleaner_path, 64)
            .await?
            .and_then(|b| std::str::from_utf8(&b).ok().and_then(|t| t.trim().parse::<u64>().ok()))
            .map_or(log_start, Offset)
            .min(log_end);
        if found.is_some() {
            // The caller takes the partition offline and says so.
        } else if report.damage.is_some() || report.removed_segments > 0 {
            tracing::warn!(dir = %dir.display(), ?report, "recovered a damaged log");
        } else if report.scanned_bytes > 0 {
            tracing::info!(dir = %dir.display(), scanned_bytes = report.scanned_bytes, truncated = report.truncated_bytes, "recovered log");
        }

        let inner = Inner {
            config,
            segments,
            tail,
            log_start,
            durable: log_end,
            syncs_in_flight: 0,
            sync_covering: log_end,
            high_watermark: hints.high_watermark.min(log_end),
            epochs,
            producers: ProducerStates::default(),
            producers_stale: true,
            producers_counted: 0,
            completed_txns: Vec::new(),
            // A damaged log's files stay as found: its epochs are truncated in memory only.
            epochs_version: u64::from(epochs_dirty && found.is_none()),
            epochs_persisted: 0,
            appends_paused: false,
            last_sync_ms: now,
            last_used_ms: now,
            generation: 0,
            end_cuts: 0,
            cleaned_upto,
            read_hint: None,
            closed: false,
            damaged: found.as_ref().map(|(damage, segment, position)| super::Damage {
                what: damage.to_string(),
                readable_below: log_end,
                segment: *segment,
                position: *position,
            }),
            stats: LogStats::default(),
            appends_written: 0,
            appends_at_sync: 0,
            writes_needing_file_sync: 0,
            writes_file_synced: 0,
        };
        let log = PartitionLog {
            fs,
            files,
            dir: dir.to_path_buf(),
            clock,
            inner: RefCell::new(inner),
            io: Mutex::new(()),
            maintenance: Mutex::new(()),
            progress: event_listener::Event::new(),
            news: Default::default(),
            producer_budget,
            space,
        };
        if found.is_some() {
            // Takes no appends: its producers are never needed, and no snapshot of them is written.
            return Ok((log, report));
        }
        {
            let _io = log.io.lock().await;
            log.persist_epochs_locked().await?;
            let bad_txn_index = log.load_txn_indexes().await?;
            let rebuilt = log.rebuild_producers_locked(hints.recovery == Recovery::Clean, bad_txn_index).await?;
            if bad_txn_index.is_some() {
                log.rewrite_txn_indexes_locked(rebuilt.from).await?;
            }
            report.producer_snapshot = rebuilt.snapshot;
            report.producer_replayed_bytes = rebuilt.replayed_bytes;
        }
        log.expire_producers();
        Ok((log, report))
    }
}

struct Loaded<F: Fs> {
    segment: Segment<F>,
    /// The file's size as found.
    file_size: u64,
    /// The size the segment keeps: whole valid batches.
    size: u64,
    /// Where the validation stopped.
    stop: ScanStop,
}

/// Whether a segment that ends early (or short of the next one) can be the work of a crash. Only the
/// end of the last segment can be torn: a roll seals a segment (synced) before the next one is made, a
/// truncation removes later segments durably before it cuts, and nothing below the recovery point was
/// unsynced. Zero padding after the last batch of the last segment (a block's padding, or preallocated
/// space) is its end, not damage, where it begins at or past the recovery point (or after a clean
/// close). Anything else is damage the disk did to durable data.
fn torn_write_possible<F: Fs>(loaded: &Loaded<F>, next_base: Option<Offset>, durable_below: Option<Offset>) -> bool {
    if next_base.is_some() {
        return false;
    }
    match durable_below {
        // After a clean close the file was cut to its batches; zeros after them are still only its end.
        None => loaded.stop == ScanStop::ZeroPadding,
        // Zeros or a torn batch past the recovery point (where the preallocated or unsynced part begins);
        // below it, even zeros are durable data lost.
        Some(rp) => loaded.segment.next_offset >= rp,
    }
}

/// How far a segment's files are taken as they are when it is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Trust {
    /// Before the recovery point (or after a clean close): its index files and batches are trusted; only
    /// the batches after its last index entry are checked, and they must end where the next segment
    /// begins.
    Whole,
    /// The last segment after a crash, holding the recovery point: trusted up to its last index entry;
    /// the batches after it are validated and a torn or damaged end is cut off.
    UpToIndex,
    /// Validated batch by batch.
    Nothing,
}

/// Loads one segment: trusted ones through their index files (rebuilt by a scan when missing or
/// inconsistent), the others by a full scan. `must_end`: the offset it must end at (where the next
/// segment, or a repair's gap before it, begins); `None` for the last segment.
#[allow(clippy::too_many_arguments)]
async fn load_segment<F: Fs>(
    fs: &F,
    files: &OpenFiles<F>,
    dir: &Path,
    base: Offset,
    must_end: Option<Offset>,
    trust: Trust,
    config: &LogConfig,
    now: i64,
    epoch_starts: &mut Vec<(LeaderEpoch, Offset)>,
    report: &mut OpenReport,
) -> Result<Loaded<F>> {
    let log_path = dir.join(segment::file_name(base, segment::LOG_SUFFIX));
    let index_path = dir.join(segment::file_name(base, segment::INDEX_SUFFIX));
    let time_index_path = dir.join(segment::file_name(base, segment::TIME_INDEX_SUFFIX));
    let file = fs.open(&log_path, false).await.map_err(|e| StorageError::io("open segment", &log_path, e))?;
    let file_size = file.size().await.map_err(|e| StorageError::io("stat", &log_path, e))?;
    let interval = config.index_interval_bytes;

    let trusted = trust != Trust::Nothing;
    let mut loaded_index = None;
    if trusted {
        // Bound index reads by what a segment of this size could need.
        let max_entries = file_size / HEADER_BYTES as u64 + 1;
        let offsets = durable::read_file(fs, &index_path, max_entries * OFFSET_ENTRY_BYTES as u64).await.ok().flatten();
        let times =
            durable::read_file(fs, &time_index_path, max_entries * TIME_ENTRY_BYTES as u64).await.ok().flatten();
        let bound = must_end.unwrap_or(Offset(u64::MAX));
        if let (Some(offsets), Some(times)) = (offsets, times) {
            loaded_index = SegmentIndex::decode(base, &offsets, &times, file_size.max(1), bound);
        }
    }

    let mut push_epoch = |meta: &BatchMeta| {
        let epoch = LeaderEpoch(meta.epoch);
        if epoch.0 >= 0 && epoch_starts.last().is_none_or(|(e, _)| epoch > *e) {
            epoch_starts.push((epoch, meta.base_offset));
        }
    };

    // A trusted segment with index files: validate its last index interval (the batch the last entry points
    // at must carry that entry's offset, the batches after it must be valid and end where the next segment
    // begins). That also finds the log end in the last segment. Anything unexpected means the index or the
    // segment cannot be trusted, and the segment is rescanned whole.
    let mut quick = None;
    let mut persisted_index = None;
    let mut stop = ScanStop::Clean;
    if let Some(mut index) = loaded_index {
        let on_disk = index.entry_count();
        let last_entry = index.offset_entries().last();
        let start = last_entry.map_or(0, |(_, position)| position);
        let start_offset = match last_entry {
            None => Some(base),
            Some((entry_offset, _)) => {
                let header = file.read_at(start, HEADER_BYTES).await.map_err(|e| read_failure("read", &log_path, e))?;
                BatchHeader::parse(&header).ok().and_then(|h| {
                    let batch_base = Offset(u64::try_from(h.base_offset).ok()?);
                    let last = batch_base.0.checked_add(u64::try_from(h.last_offset_delta).ok()?)?;
                    (last == entry_offset.0 && batch_base >= base).then_some(batch_base)
                })
            }
        };
        if let Some(start_offset) = start_offset {
            index.resume_at(start);
            let mut starts = Vec::new();
            let scan = segment::scan(&file, &log_path, start, start_offset, file_size, |m| {
                index.on_batch(m, interval);
                starts.push(*m);
            })
            .await?;
            let ends_where_it_must = must_end.is_none_or(|next| scan.next_offset == next);
            if trust == Trust::UpToIndex {
                // What follows the last durable entry is what a crash may have torn: validated, and cut
                // at the first bad batch, as a full scan would.
                report.scanned_bytes += scan.valid_bytes - start;
                note_damage(&scan.stop, report);
                starts.iter().for_each(&mut push_epoch);
                stop = scan.stop.clone();
                quick = Some((index, scan.valid_bytes, scan.next_offset));
                persisted_index = Some(on_disk);
            } else if scan.stop == ScanStop::Clean && ends_where_it_must {
                starts.iter().for_each(&mut push_epoch);
                quick = Some((index, scan.valid_bytes, scan.next_offset));
                persisted_index = Some(on_disk);
            }
        }
    }

    let (index, size, next_offset, scanned) = match quick {
        Some((index, size, next)) => (index, size, next, false),
        None => {
            let mut index = SegmentIndex::new(base);
            let scan = segment::scan(&file, &log_path, 0, base, file_size, |m| {
                index.on_batch(m, interval);
                push_epoch(m);
            })
            .await?;
            report.scanned_segments += 1;
            report.scanned_bytes += scan.valid_bytes;
            note_damage(&scan.stop, report);
            stop = scan.stop.clone();
            if trusted {
                // Missing, inconsistent, or pointing past damage: rebuilt from the scan.
                report.rebuilt_indexes += 1;
            }
            (index, scan.valid_bytes, scan.next_offset, true)
        }
    };
    let mut index = index;
    if scanned || trust == Trust::UpToIndex {
        // Whatever the device had cached from before the crash is made durable before it is relied upon.
        if let Err(e) = file.fdatasync().await {
            fatal::disk_failure("fdatasync", &log_path, &e);
        }
        if scanned && must_end.is_some() {
            index.seal();
            write_index_files(fs, &index, &index_path, &time_index_path).await?;
            persisted_index = Some(index.entry_count());
        } else if scanned {
            // The last segment's index files, if any, may describe batches the scan did not keep: the
            // next checkpoint writes them again from the rebuilt index.
            super::index_files::remove_files(fs, &[index_path.clone(), time_index_path.clone()], dir).await;
        }
    }
    let segment = Segment {
        base,
        dir: dir.to_path_buf(),
        file: files.adopt(log_path, file),
        size,
        allocated: file_size,
        zeroed: 0,
        durable_written: 0,
        next_offset,
        index,
        persisted_index,
        created_ms: now,
        aborted: Vec::new(),
    };
    Ok(Loaded { segment, file_size, size, stop })
}

fn note_damage(stop: &ScanStop, report: &mut OpenReport) {
    if let ScanStop::Invalid(reason) = stop
        && report.damage.is_none()
    {
        report.damage = Some(reason.clone());
    }
}

/// The jumps between segments a repair left on purpose ([`super::OFFSET_GAPS_FILE`]): `(from, to)`.
async fn read_gaps<F: Fs>(fs: &F, dir: &Path) -> Result<Vec<(Offset, Offset)>> {
    let path = dir.join(super::OFFSET_GAPS_FILE);
    let Some(bytes) = durable::read_file(fs, &path, 1 << 20).await? else { return Ok(Vec::new()) };
    let corrupt = |detail: String| StorageError::CorruptFile { path: path.clone(), detail };
    let text = std::str::from_utf8(&bytes).map_err(|e| corrupt(e.to_string()))?;
    text.lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let parsed = line.split_once(' ').and_then(|(from, to)| Some((from.parse().ok()?, to.parse().ok()?)));
            match parsed {
                Some((from, to)) if from < to => Ok((Offset(from), Offset(to))),
                _ => Err(corrupt(format!("bad gap {line:?}"))),
            }
        })
        .collect()
}
