//! `shardlog repair`: the way out for a partition taken offline because its log is damaged. Run with
//! the broker stopped; plain blocking file I/O (it is a command-line tool, not a shard).
//!
//! `truncate_at` cuts the log before the batch holding an offset (or before damage met on the way to
//! it, whichever comes first) and moves everything it cuts into a directory beside the partition's,
//! `<topic>-<partition>.cut.<n>`, which the broker never opens: the bytes of the cut segment from the cut
//! on (`<base>.log.from-<position>`) and every later segment's files, as they were. Nothing is deleted,
//! so data after the damage can still be read out by hand. The cut segment's index files are removed
//! (the broker rebuilds them), and every change is synced before the tool reports success.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::batch::{self, BatchHeader, HEADER_BYTES};
use crate::producer_state::SNAPSHOT_SUFFIX;
use crate::segment::{self, INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX};
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
    let mut bases: Vec<Offset> = fs::read_dir(partition_dir)
        .map_err(io(partition_dir))?
        .filter_map(|e| e.ok())
        .filter_map(|e| segment::parse_file_name(&e.file_name().to_string_lossy(), LOG_SUFFIX))
        .collect();
    bases.sort();
    let Some(&first) = bases.first() else { return Err(RepairError::NoSegments(partition_dir.to_path_buf())) };
    if offset < first {
        return Err(RepairError::BelowLog { offset, first });
    }
    let holding = bases.partition_point(|b| *b <= offset) - 1;
    let base = bases[holding];
    let log_path = partition_dir.join(segment::file_name(base, LOG_SUFFIX));
    let (cut_position, log_end, cut_reason) = find_cut(&log_path, base, offset)?;
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
        for suffix in [LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
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
    for suffix in [INDEX_SUFFIX, TIME_INDEX_SUFFIX] {
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
    })
}

/// Walks the segment's batches to the one holding `offset` or to the first that does not check:
/// (position of the cut, the offset the log then ends at, why there).
fn find_cut(log_path: &Path, base: Offset, offset: Offset) -> Result<(u64, Offset, String), RepairError> {
    let mut file = File::open(log_path).map_err(io(log_path))?;
    let size = file.metadata().map_err(io(log_path))?.len();
    let mut pos = 0u64;
    let mut next = base;
    let mut header_bytes = [0u8; HEADER_BYTES];
    loop {
        if pos == size {
            return Ok((pos, next, format!("the segment ends below offset {offset}")));
        }
        let damage = |what: String| Ok((pos, next, format!("damage below offset {offset}: {what}")));
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
        if batch_base != next.0 {
            return damage(format!("batch starts at offset {batch_base}, expected {next}"));
        }
        if last >= offset.0 {
            return Ok((pos, next, format!("the batch holding offset {offset} starts at {next}")));
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
}
