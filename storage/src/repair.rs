//! `shardlog repair`: the way out for a partition taken offline because its log is damaged. Run with
//! the broker stopped; plain blocking file I/O (it is a command-line tool, not a shard).
//!
//! `truncate_at` cuts the log before the batch holding an offset (or before damage met on the way to
//! it, whichever comes first); `truncate_at_damage` cuts it before its first batch that does not check,
//! wherever that is (a broker rebuilding a damaged replica keeps what is intact) and moves everything it cuts into a directory beside the partition's,
//! `<topic>-<partition>.cut.<n>`, which the broker never opens: the bytes of the cut segment from the cut
//! on (`<base>.log.from-<position>`) and every later segment's files, as they were. Nothing is deleted,
//! so data after the damage can still be read out by hand. The cut segment's index files are removed
//! (the broker rebuilds them), and every change is synced before the tool reports success.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::batch::{self, BatchHeader, HEADER_BYTES};
use crate::producer_state::SNAPSHOT_SUFFIX;
use crate::segment::{self, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX};
use crate::types::Offset;

/// What a repair did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepairReport {
    /// The log's end after the cut: the first offset no longer in the log.
    pub log_end: Offset,
    /// Why the cut is where it is.
    pub cut_reason: String,
    /// The segment that was cut and the byte position of the cut.
    pub cut_segment: PathBuf,
    pub cut_position: u64,
    /// Bytes taken from the end of the cut segment.
    pub cut_bytes: u64,
    /// Later segments moved aside whole.
    pub moved_segments: usize,
    /// Where everything cut went.
    pub aside: PathBuf,
    /// The offset the next record gets. After [`truncate_at`], past every offset the log ever held: an
    /// offset never names two records, so the offsets from `log_end` up to here stay unused (a gap, as
    /// compaction leaves). After a rebuild's cut, `log_end`: the leader's copies of the same records fill
    /// it again.
    pub continues_at: Offset,
}

/// Why a repair could not be done; nothing was changed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RepairError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} holds no segment files")]
    NoSegments(PathBuf),
    #[error("offset {offset} is below the log's first segment (base {first})")]
    BelowLog { offset: Offset, first: Offset },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> RepairError + '_ {
    move |source| RepairError::Io { path: path.to_path_buf(), source }
}

/// Cuts the log in `partition_dir` so that it ends before `offset` (see the module documentation).
pub fn truncate_at(partition_dir: &Path, offset: Offset) -> Result<RepairReport, RepairError> {
    let bases = segment_bases(partition_dir)?;
    let Some(&first) = bases.first() else { return Err(RepairError::NoSegments(partition_dir.to_path_buf())) };
    if offset < first {
        return Err(RepairError::BelowLog { offset, first });
    }
    let holding = bases.partition_point(|b| *b <= offset) - 1;
    let log_path = partition_dir.join(segment::file_name(bases[holding], LOG_SUFFIX));
    let walk = walk_to(&log_path, bases[holding], offset)?;
    let mut report = cut(partition_dir, &bases, holding, walk.position, walk.next, walk.reason)?;
    let highest = highest_offset_held(partition_dir, &report)?;
    if highest > report.log_end {
        continue_after_gap(partition_dir, report.log_end, highest)?;
        report.continues_at = highest;
    }
    Ok(report)
}

/// The offset after the highest one the log in `partition_dir` ever held, as far as anything left says:
/// the batches `report` moved aside, the recovery point and high watermark the data dir's checkpoints
/// recorded, and the start of the latest epoch in its leader-epoch file.
fn highest_offset_held(partition_dir: &Path, report: &RepairReport) -> Result<Offset, RepairError> {
    let mut highest = report.log_end;
    for entry in fs::read_dir(&report.aside).map_err(io(&report.aside))?.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        let base = if let Some(base) = segment::parse_file_name(&name, LOG_SUFFIX) {
            base
        } else if name.contains(&format!("{LOG_SUFFIX}.from-")) {
            // The cut segment's bytes from the cut on: they began at the new log end.
            report.log_end
        } else {
            continue;
        };
        // As far as the batches there still check (the damage that was cut may stop the walk at once).
        highest = highest.max(base).max(walk_to(&entry.path(), base, Offset(u64::MAX))?.next);
    }
    let Some(data_dir) = partition_dir.parent() else { return Ok(highest) };
    let dir_name = partition_dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let checkpoints = [crate::log_dir::RECOVERY_POINT_FILE, crate::log_dir::HIGH_WATERMARK_FILE];
    for entry in fs::read_dir(data_dir).map_err(io(data_dir))?.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !checkpoints.iter().any(|c| name.starts_with(c)) || name.ends_with(".tmp") {
            continue;
        }
        let text = fs::read_to_string(entry.path()).map_err(io(&entry.path()))?;
        for line in crate::checkpoint::parse_lines(&entry.path(), &text).unwrap_or_default() {
            let mut parts = line.split(' ');
            let (Some(topic), Some(partition), Some(offset)) = (parts.next(), parts.next(), parts.next()) else {
                continue;
            };
            if format!("{topic}-{partition}") == dir_name
                && let Ok(offset) = offset.parse::<u64>()
            {
                highest = highest.max(Offset(offset));
            }
        }
    }
    let epochs = partition_dir.join(crate::log::LEADER_EPOCH_FILE);
    if let Ok(text) = fs::read_to_string(&epochs)
        && let Ok(cache) = crate::epoch_cache::LeaderEpochCache::decode(&epochs, &text)
        && let Some(latest) = cache.latest()
    {
        // An epoch's entry is made with its first batch: that offset was held.
        highest = highest.max(latest.start_offset.plus(1));
    }
    Ok(highest)
}

/// Makes the log in `partition_dir`, which now ends at `from`, continue at `to`: the gap is recorded in
/// [`crate::log::OFFSET_GAPS_FILE`] (so recovery takes the jump between segments for what it is, not for
/// a lost segment), then an empty segment based at `to` is created, each durable before the next.
fn continue_after_gap(partition_dir: &Path, from: Offset, to: Offset) -> Result<(), RepairError> {
    let gaps = partition_dir.join(crate::log::OFFSET_GAPS_FILE);
    let mut text = match fs::read_to_string(&gaps) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
        Err(e) => return Err(RepairError::Io { path: gaps, source: e }),
    };
    text.push_str(&format!("{} {}\n", from.0, to.0));
    let tmp = partition_dir.join(format!("{}.tmp", crate::log::OFFSET_GAPS_FILE));
    let mut file = File::create(&tmp).map_err(io(&tmp))?;
    std::io::Write::write_all(&mut file, text.as_bytes()).map_err(io(&tmp))?;
    file.sync_all().map_err(io(&tmp))?;
    fs::rename(&tmp, &gaps).map_err(io(&gaps))?;
    sync_dir(partition_dir)?;
    let segment = partition_dir.join(segment::file_name(to, LOG_SUFFIX));
    File::create(&segment).and_then(|f| f.sync_all()).map_err(io(&segment))?;
    sync_dir(partition_dir)
}

/// Cuts the log in `partition_dir` before its first batch that does not check (its length, offsets or
/// CRC32C), found by reading every segment from the first: the way a broker rebuilds a damaged replica,
/// keeping what is intact and moving the rest aside. `None` (nothing changed) when every batch checks.
pub fn truncate_at_damage(partition_dir: &Path) -> Result<Option<RepairReport>, RepairError> {
    let bases = segment_bases(partition_dir)?;
    let gaps = recorded_gaps(partition_dir)?;
    for (i, &base) in bases.iter().enumerate() {
        let next_base = bases.get(i + 1).copied();
        let log_path = partition_dir.join(segment::file_name(base, LOG_SUFFIX));
        let walk = walk_to(&log_path, base, next_base.unwrap_or(Offset(u64::MAX)))?;
        // Where the segment must end: where the next begins, or where a repair's gap before it begins.
        let must_end = next_base.map(|nb| gaps.iter().find(|&&(_, to)| to == nb).map_or(nb, |&(from, _)| from));
        let whole = walk.stop == Stop::End && must_end.is_none_or(|end| walk.next == end);
        if !whole {
            let reason = match walk.stop {
                Stop::End => format!("the segment ends at offset {} but the next one starts later", walk.next),
                _ => walk.reason,
            };
            return cut(partition_dir, &bases, i, walk.position, walk.next, reason).map(Some);
        }
    }
    Ok(None)
}

/// Moves every segment of the log in `partition_dir` aside, with its leader-epoch file, as a cut at the
/// start of its first segment: the log starts again empty at that segment's base offset. For a replica
/// whose damage is in no batch (a segment missing at the end, an unreadable leader-epoch file) and that
/// is rebuilt from its leader.
pub fn move_aside_whole(partition_dir: &Path) -> Result<RepairReport, RepairError> {
    let bases = segment_bases(partition_dir)?;
    let Some(&first) = bases.first() else { return Err(RepairError::NoSegments(partition_dir.to_path_buf())) };
    let reason = "no batch is damaged: the whole log is moved aside".to_string();
    let report = cut(partition_dir, &bases, 0, 0, first, reason)?;
    let epochs = partition_dir.join(crate::log::LEADER_EPOCH_FILE);
    if epochs.exists() {
        let to = report.aside.join(crate::log::LEADER_EPOCH_FILE);
        fs::rename(&epochs, &to).map_err(io(&epochs))?;
        sync_dir(&report.aside)?;
        sync_dir(partition_dir)?;
    }
    Ok(report)
}

/// The gaps earlier repairs left between segments ([`crate::log::OFFSET_GAPS_FILE`]); lines that do not
/// parse are ignored here (recovery refuses them).
fn recorded_gaps(partition_dir: &Path) -> Result<Vec<(Offset, Offset)>, RepairError> {
    let path = partition_dir.join(crate::log::OFFSET_GAPS_FILE);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(RepairError::Io { path, source: e }),
    };
    Ok(text
        .lines()
        .filter_map(|line| line.split_once(' '))
        .filter_map(|(from, to)| Some((Offset(from.trim().parse().ok()?), Offset(to.trim().parse().ok()?))))
        .collect())
}

/// The base offsets of the log's segments, in order.
fn segment_bases(partition_dir: &Path) -> Result<Vec<Offset>, RepairError> {
    let mut bases: Vec<Offset> = fs::read_dir(partition_dir)
        .map_err(io(partition_dir))?
        .filter_map(|e| e.ok())
        .filter_map(|e| segment::parse_file_name(&e.file_name().to_string_lossy(), LOG_SUFFIX))
        .collect();
    bases.sort();
    Ok(bases)
}

/// Cuts segment `holding` (of `bases`) at byte `cut_position`, where the log then ends at `log_end`, and
/// moves the cut bytes and every later segment aside.
fn cut(
    partition_dir: &Path,
    bases: &[Offset],
    holding: usize,
    cut_position: u64,
    log_end: Offset,
    cut_reason: String,
) -> Result<RepairReport, RepairError> {
    let base = bases[holding];
    let log_path = partition_dir.join(segment::file_name(base, LOG_SUFFIX));
    let file_size = fs::metadata(&log_path).map_err(io(&log_path))?.len();

    let aside = aside_dir(partition_dir);
    fs::create_dir(&aside).map_err(io(&aside))?;
    // The new directory's entry is durable before anything is moved into it.
    if let Some(parent) = partition_dir.parent() {
        sync_dir(parent)?;
    }
    // The cut bytes first, synced, then the later segments, then the cut itself: a crash part way leaves
    // copies, never a loss.
    if cut_position < file_size {
        let copy = aside.join(format!("{}.from-{cut_position}", segment::file_name(base, LOG_SUFFIX)));
        let mut from = File::open(&log_path).map_err(io(&log_path))?;
        from.seek(SeekFrom::Start(cut_position)).map_err(io(&log_path))?;
        let mut to = File::create(&copy).map_err(io(&copy))?;
        std::io::copy(&mut from, &mut to).map_err(io(&copy))?;
        to.sync_all().map_err(io(&copy))?;
    }
    let later = &bases[holding + 1..];
    for &later_base in later {
        for suffix in [LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX] {
            let name = segment::file_name(later_base, suffix);
            let from = partition_dir.join(&name);
            if from.exists() {
                fs::rename(&from, aside.join(&name)).map_err(io(&from))?;
            }
        }
    }
    // Producer-state snapshots taken above the new end describe batches that are cut: moved aside too.
    for entry in fs::read_dir(partition_dir).map_err(io(partition_dir))?.filter_map(|e| e.ok()) {
        let name = entry.file_name().to_string_lossy().into_owned();
        if segment::parse_file_name(&name, SNAPSHOT_SUFFIX).is_some_and(|at| at > log_end) {
            fs::rename(entry.path(), aside.join(&name)).map_err(io(&entry.path()))?;
        }
    }
    sync_dir(&aside)?;
    sync_dir(partition_dir)?;
    // Durably before the cut, as the log's own truncation does: the checkpointed recovery point may be
    // above the new end, and the next open must not take the cut for lost data.
    let truncated_to = partition_dir.join(crate::log::TRUNCATED_TO_FILE);
    let tmp = partition_dir.join(format!("{}.tmp", crate::log::TRUNCATED_TO_FILE));
    let mut marker = File::create(&tmp).map_err(io(&tmp))?;
    std::io::Write::write_all(&mut marker, log_end.0.to_string().as_bytes()).map_err(io(&tmp))?;
    marker.sync_all().map_err(io(&tmp))?;
    fs::rename(&tmp, &truncated_to).map_err(io(&truncated_to))?;
    sync_dir(partition_dir)?;
    let file = OpenOptions::new().write(true).open(&log_path).map_err(io(&log_path))?;
    file.set_len(cut_position).map_err(io(&log_path))?;
    file.sync_all().map_err(io(&log_path))?;
    for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX] {
        let path = partition_dir.join(segment::file_name(base, suffix));
        if path.exists() {
            fs::remove_file(&path).map_err(io(&path))?;
        }
    }
    // Compaction's checkpoint may lie above the cut: without it the whole log counts as not yet cleaned.
    let cleaned = partition_dir.join(crate::log::compaction::CLEANER_CHECKPOINT_FILE);
    if cleaned.exists() {
        fs::remove_file(&cleaned).map_err(io(&cleaned))?;
    }
    // Repaired: the broker serves the partition again.
    let marker = partition_dir.join(crate::log::DAMAGED_FILE);
    if marker.exists() {
        fs::remove_file(&marker).map_err(io(&marker))?;
    }
    // The data dir's clean-shutdown markers vouch for the logs as the broker closed them, this one no
    // longer: the next start recovers as after a crash, and rebuilds this log's producers from the log.
    if let Some(data_dir) = partition_dir.parent() {
        for entry in fs::read_dir(data_dir).map_err(io(data_dir))?.filter_map(|e| e.ok()) {
            if entry.file_name().to_string_lossy().starts_with(crate::log_dir::CLEAN_SHUTDOWN_FILE) {
                fs::remove_file(entry.path()).map_err(io(&entry.path()))?;
            }
        }
    }
    sync_dir(partition_dir)?;
    if let Some(parent) = partition_dir.parent() {
        sync_dir(parent)?;
    }
    Ok(RepairReport {
        log_end,
        cut_reason,
        cut_segment: log_path,
        cut_position,
        cut_bytes: file_size - cut_position,
        moved_segments: later.len(),
        aside,
        continues_at: log_end,
    })
}

/// Where a walk over a segment's batches stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    /// At the end of the file, every batch checked.
    End,
    /// At the batch holding the offset asked for.
    Holding,
    /// At a batch that does not check.
    Damage,
}

/// A walk's end: the byte position, the offset the segment would end at if cut there, and why there.
#[derive(Debug)]
struct Walk {
    position: u64,
    next: Offset,
    stop: Stop,
    reason: String,
}

/// Walks the segment's batches to the one holding `offset` or to the first that does not check.
fn walk_to(log_path: &Path, base: Offset, offset: Offset) -> Result<Walk, RepairError> {
    let mut file = File::open(log_path).map_err(io(log_path))?;
    let size = file.metadata().map_err(io(log_path))?.len();
    let mut pos = 0u64;
    let mut next = base;
    let mut header_bytes = [0u8; HEADER_BYTES];
    loop {
        if pos == size {
            let reason = format!("the segment ends below offset {offset}");
            return Ok(Walk { position: pos, next, stop: Stop::End, reason });
        }
        let damage = |what: String| {
            let reason = format!("damage below offset {offset}: {what}");
            Ok(Walk { position: pos, next, stop: Stop::Damage, reason })
        };
        if size - pos < HEADER_BYTES as u64 {
            return damage(format!("{} trailing bytes", size - pos));
        }
        file.seek(SeekFrom::Start(pos)).map_err(io(log_path))?;
        file.read_exact(&mut header_bytes).map_err(io(log_path))?;
        let Ok(header) = BatchHeader::parse(&header_bytes) else { return damage("unreadable batch header".into()) };
        let total = header.total_bytes() as u64;
        if total < HEADER_BYTES as u64 || pos + total > size {
            return damage(format!("batch length {total} out of bounds"));
        }
        let last = header.base_offset.checked_add(header.last_offset_delta as i64);
        let (Ok(batch_base), Some(Ok(last))) = (u64::try_from(header.base_offset), last.map(u64::try_from)) else {
            return damage("negative offsets".into());
        };
        // Offsets may skip ahead (compaction removes whole batches), never go back.
        if batch_base < next.0 {
            return damage(format!("batch starts at offset {batch_base}, below {next}"));
        }
        if last >= offset.0 {
            let reason = format!("the batch holding offset {offset} starts at {next}");
            return Ok(Walk { position: pos, next, stop: Stop::Holding, reason });
        }
        // The whole batch, bounded by the file above, for its CRC.
        let mut bytes = vec![0u8; total as usize];
        file.seek(SeekFrom::Start(pos)).map_err(io(log_path))?;
        file.read_exact(&mut bytes).map_err(io(log_path))?;
        if batch::compute_crc(&bytes) != header.crc {
            return damage("CRC32C does not match".into());
        }
        pos += total;
        next = Offset(last + 1);
    }
}

/// `<partition dir>.cut.<n>`, the first that does not exist (not a partition name: what follows its last
/// `-` is not a number).
fn aside_dir(partition_dir: &Path) -> PathBuf {
    (1..)
        .map(|n| PathBuf::from(format!("{}.cut.{n}", partition_dir.display())))
        .find(|p| !p.exists())
        .expect("some name is free")
}

fn sync_dir(dir: &Path) -> Result<(), RepairError> {
    File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn write_segment(dir: &Path, base: u64, batches: &[Vec<u8>]) {
        let mut f = File::create(dir.join(segment::file_name(Offset(base), LOG_SUFFIX))).unwrap();
        for b in batches {
            f.write_all(b).unwrap();
        }
    }

    /// A stored batch of `records` records at `base`.
    fn stored(base: u64, records: usize) -> Vec<u8> {
        let values: Vec<Vec<u8>> = (0..records).map(|i| vec![i as u8; 20]).collect();
        let refs: Vec<&[u8]> = values.iter().map(|v| v.as_slice()).collect();
        let mut b = batch::build_batch(0, &refs);
        batch::stamp(&mut b, Offset(base), crate::types::LeaderEpoch(0));
        b
    }

    #[test]
    fn a_cut_keeps_whole_batches_below_the_offset_and_moves_the_rest_aside() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t-0");
        fs::create_dir(&dir).unwrap();
        write_segment(&dir, 0, &[stored(0, 2), stored(2, 2), stored(4, 2)]);
        write_segment(&dir, 6, &[stored(6, 2)]);
        let report = truncate_at(&dir, Offset(3)).unwrap();
        assert_eq!(report.log_end, Offset(2), "offset 3 is in the batch starting at 2: the cut is before it");
        assert_eq!(report.moved_segments, 1);
        let kept = fs::read(dir.join(segment::file_name(Offset(0), LOG_SUFFIX))).unwrap();
        assert_eq!(kept, stored(0, 2));
        let aside: Vec<String> =
            fs::read_dir(&report.aside).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into()).collect();
        assert!(aside.contains(&segment::file_name(Offset(6), LOG_SUFFIX)), "{aside:?}");
        let cut =
            fs::read(report.aside.join(format!("{}.from-{}", segment::file_name(Offset(0), LOG_SUFFIX), kept.len())))
                .unwrap();
        assert_eq!(cut, [stored(2, 2), stored(4, 2)].concat(), "the cut bytes are kept as they were");
    }

    #[test]
    fn damage_below_the_offset_moves_the_cut_down_to_it() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t-0");
        fs::create_dir(&dir).unwrap();
        let mut second = stored(2, 2);
        let last = second.len() - 1;
        second[last] ^= 0xff;
        write_segment(&dir, 0, &[stored(0, 2), second, stored(4, 2)]);
        let report = truncate_at(&dir, Offset(100)).unwrap();
        assert_eq!(report.log_end, Offset(2));
        assert!(report.cut_reason.contains("CRC32C"), "{}", report.cut_reason);
        assert!(matches!(truncate_at(&dir, Offset(0)), Ok(r) if r.log_end == Offset(0)));
    }

    #[test]
    fn a_cut_at_the_damage_keeps_every_intact_segment_before_it_and_moves_the_rest_aside() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t-0");
        fs::create_dir(&dir).unwrap();
        write_segment(&dir, 0, &[stored(0, 2), stored(2, 2)]);
        let mut damaged = stored(6, 2);
        damaged[HEADER_BYTES + 3] ^= 0x01;
        write_segment(&dir, 4, &[stored(4, 2), damaged, stored(8, 2)]);
        write_segment(&dir, 10, &[stored(10, 2)]);
        assert!(truncate_at_damage(&dir.join("nothing")).is_err(), "no such directory");

        let report = truncate_at_damage(&dir).unwrap().expect("damage found");
        assert_eq!(report.log_end, Offset(6), "cut before the batch that does not check");
        assert!(report.cut_reason.contains("CRC32C"), "{}", report.cut_reason);
        assert_eq!(report.moved_segments, 1);
        assert_eq!(
            fs::read(dir.join(segment::file_name(Offset(0), LOG_SUFFIX))).unwrap(),
            [stored(0, 2), stored(2, 2)].concat()
        );
        assert_eq!(fs::read(dir.join(segment::file_name(Offset(4), LOG_SUFFIX))).unwrap(), stored(4, 2));
        assert!(report.aside.join(segment::file_name(Offset(10), LOG_SUFFIX)).exists());
        // What is left checks whole: a second pass changes nothing.
        assert_eq!(truncate_at_damage(&dir).unwrap(), None);
    }

    #[test]
    fn a_missing_segment_between_two_is_damage_at_the_end_of_the_first() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t-0");
        fs::create_dir(&dir).unwrap();
        write_segment(&dir, 0, &[stored(0, 2)]);
        write_segment(&dir, 5, &[stored(5, 2)]);
        let report = truncate_at_damage(&dir).unwrap().expect("a gap is damage");
        assert_eq!((report.log_end, report.cut_bytes, report.moved_segments), (Offset(2), 0, 1));
    }

    #[test]
    fn a_cut_continues_after_the_highest_offset_the_log_ever_held_and_records_the_gap() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t-0");
        fs::create_dir(&dir).unwrap();
        write_segment(&dir, 0, &[stored(0, 2), stored(2, 2), stored(4, 2)]);
        write_segment(&dir, 6, &[stored(6, 2)]);
        // The checkpoints vouch for more than the files hold now (a segment lost at the end).
        fs::write(tmp.path().join("recovery-point-offset-checkpoint.shard-0"), "0\n2\nt 0 11\nu 0 99\n").unwrap();
        fs::write(tmp.path().join("replication-offset-checkpoint.shard-0"), "0\n1\nt 0 9\n").unwrap();
        let report = truncate_at(&dir, Offset(3)).unwrap();
        assert_eq!(
            (report.log_end, report.continues_at),
            (Offset(2), Offset(11)),
            "past the recovery point, not u-0's"
        );
        assert_eq!(fs::read_to_string(dir.join(crate::log::OFFSET_GAPS_FILE)).unwrap(), "2 11\n");
        assert_eq!(fs::metadata(dir.join(segment::file_name(Offset(11), LOG_SUFFIX))).unwrap().len(), 0);

        // A second repair appends its gap; the moved segments and the epoch file count as well.
        let dir2 = tmp.path().join("v-0");
        fs::create_dir(&dir2).unwrap();
        write_segment(&dir2, 0, &[stored(0, 2), stored(2, 2)]);
        write_segment(&dir2, 4, &[stored(4, 3)]);
        fs::write(dir2.join(crate::log::LEADER_EPOCH_FILE), "0\n2\n0 0\n3 5\n").unwrap();
        let report = truncate_at(&dir2, Offset(1)).unwrap();
        assert_eq!((report.log_end, report.continues_at), (Offset(0), Offset(7)), "the moved segment ends at 7");
        fs::write(dir2.join(crate::log::LEADER_EPOCH_FILE), "0\n2\n0 0\n9 20\n").unwrap();
        let report = truncate_at(&dir2, Offset(0)).unwrap();
        assert_eq!(report.continues_at, Offset(21), "an epoch began at 20: that offset was held");
        assert_eq!(fs::read_to_string(dir2.join(crate::log::OFFSET_GAPS_FILE)).unwrap(), "0 7\n0 21\n");

        // Cutting nothing off the end leaves no gap.
        let dir3 = tmp.path().join("w-0");
        fs::create_dir(&dir3).unwrap();
        write_segment(&dir3, 0, &[stored(0, 2)]);
        let report = truncate_at(&dir3, Offset(5)).unwrap();
        assert_eq!((report.log_end, report.continues_at), (Offset(2), Offset(2)));
        assert!(!dir3.join(crate::log::OFFSET_GAPS_FILE).exists());
    }

    #[test]
    fn a_cut_at_the_damage_cut_short_by_a_crash_is_finished_by_the_next_one() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t-0");
        fs::create_dir(&dir).unwrap();
        let mut damaged = stored(2, 2);
        damaged[HEADER_BYTES + 1] ^= 0x40;
        write_segment(&dir, 0, &[stored(0, 2), damaged.clone(), stored(4, 2)]);
        fs::write(dir.join(crate::log::DAMAGED_FILE), "damaged log: ...").unwrap();
        // A first attempt moved the later segment aside, then the process died: the damaged segment is
        // whole and the marker still there, so the broker opens the partition damaged and cuts again.
        fs::create_dir(tmp.path().join("t-0.cut.1")).unwrap();
        write_segment(&tmp.path().join("t-0.cut.1"), 6, &[stored(6, 2)]);
        let report = truncate_at_damage(&dir).unwrap().expect("the damage is still there");
        assert_eq!((report.log_end, report.aside.clone()), (Offset(2), tmp.path().join("t-0.cut.2")));
        assert!(!dir.join(crate::log::DAMAGED_FILE).exists(), "removed last, once the cut is durable");
        assert!(tmp.path().join("t-0.cut.1").join(segment::file_name(Offset(6), LOG_SUFFIX)).exists(), "kept");
        assert_eq!(
            fs::read(report.aside.join(format!(
                "{}.from-{}",
                segment::file_name(Offset(0), LOG_SUFFIX),
                stored(0, 2).len()
            )))
            .unwrap(),
            [damaged, stored(4, 2)].concat()
        );
    }

    #[test]
    fn compaction_gaps_and_a_repairs_gap_are_not_damage() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("t-0");
        fs::create_dir(&dir).unwrap();
        // Offsets 2..4 compacted away inside the first segment; a repair's gap from 6 to 20 after it.
        write_segment(&dir, 0, &[stored(0, 2), stored(4, 2)]);
        write_segment(&dir, 20, &[stored(20, 2)]);
        fs::write(dir.join(crate::log::OFFSET_GAPS_FILE), "6 20\n").unwrap();
        assert_eq!(truncate_at_damage(&dir).unwrap(), None);
        let mut damaged = stored(22, 1);
        damaged[HEADER_BYTES + 2] ^= 0x08;
        write_segment(&dir, 20, &[stored(20, 2), damaged]);
        assert_eq!(truncate_at_damage(&dir).unwrap().map(|r| r.log_end), Some(Offset(22)));
    }
}
