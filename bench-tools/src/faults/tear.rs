//! The nemesis's disk damage between a kill and the restart: the end of a partition's active segment cut
//! at a random byte, or overwritten with garbage, as a crash in the middle of a write can leave it. The
//! broker's recovery must find the end of its whole batches and fetch the rest from the leader again.
//!
//! By default nothing the broker wrote is changed: the torn write lands after its whole batches. Beyond
//! what the topic promises (`deep`), whole batches past the checkpointed recovery point are damaged too.
//!
//! [`rot`] damages what the broker fdatasync'ed and said so, below the recovery point: bytes flipped in
//! the last such batch of a segment, a disk that lost written data. The broker must find it at open (the
//! last index interval of every segment is validated), report the replica offline, and rebuild it from
//! an in-sync replica by itself.

use std::collections::BTreeMap;
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use super::plan::Rng;
use super::replica::{batch_ends, segments};

/// How a segment was damaged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Damage {
    /// The first `len` bytes of a copy of the last batch follow the whole batches, from `at`.
    TornBatch { len: u64 },
    /// `len` bytes from `at` hold garbage.
    Garbage { len: u64 },
    /// The file ends at `at`, inside its whole batches.
    Cut,
    /// `len` bytes from `at`, inside a batch below the recovery point, have their bits flipped.
    Flipped { len: u64 },
}

/// What [`tear`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Torn {
    pub segment: PathBuf,
    pub damage: Damage,
    /// The first damaged byte.
    pub at: u64,
}

/// The partition directories of a broker's data directory: `<topic>-<partition>`, not set aside.
fn partition_dirs(data: &Path) -> Result<Vec<PathBuf>> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(data)
        .with_context(|| format!("list {}", data.display()))?
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.path().is_dir())
        .filter(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            name.rsplit_once('-')
                .is_some_and(|(topic, p)| !topic.is_empty() && !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(|entry| entry.path())
        .collect();
    dirs.sort();
    Ok(dirs)
}

/// The recovery points the broker checkpointed in `data` (its `recovery-point-offset-checkpoint` files, one
/// per shard), by partition directory name.
fn recovery_points(data: &Path) -> Result<BTreeMap<String, u64>> {
    let mut points = BTreeMap::new();
    for entry in std::fs::read_dir(data).with_context(|| format!("list {}", data.display()))? {
        let path = entry?.path();
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if !name.starts_with("recovery-point-offset-checkpoint") || name.ends_with(".tmp") {
            continue;
        }
        let text = std::fs::read_to_string(&path).with_context(|| format!("read {}", path.display()))?;
        // A version line and a count line, then `<topic> <partition> <offset>`.
        for line in text.lines().skip(2) {
            let mut fields = line.rsplitn(3, ' ');
            if let (Some(offset), Some(partition), Some(topic)) = (fields.next(), fields.next(), fields.next())
                && let Ok(offset) = offset.parse()
            {
                points.insert(format!("{topic}-{partition}"), offset);
            }
        }
    }
    Ok(points)
}

/// Where the first batch of `segment` that holds an offset at or past `recovery_point` starts, among the
/// batches ending at `ends`.
fn first_unsynced(segment: &[u8], ends: &[usize], recovery_point: u64) -> Option<usize> {
    let mut start = 0;
    for &end in ends {
        let base = i64::from_be_bytes(segment[start..start + 8].try_into().expect("eight bytes"));
        let last_delta = i32::from_be_bytes(segment[start + 23..start + 27].try_into().expect("four bytes"));
        if base + i64::from(last_delta) >= recovery_point as i64 {
            return Some(start);
        }
        start = end;
    }
    None
}

/// Tears the active segment of one partition of `data` (a stopped broker's data directory) that holds
/// records, as a kill in the middle of a write leaves it: after its whole batches comes a copy of its last
/// batch cut short, or a run of garbage (at most `window` bytes), where the reserved space held zeros.
/// Nothing the broker wrote is changed, so nothing it acknowledged is lost.
///
/// With `deep` (campaigns beyond what the topic promises), the damage reaches into the whole batches past
/// the checkpointed recovery point instead: the file is cut, or overwritten with garbage, within the last
/// `window` bytes of them. That destroys records the broker may have fdatasync'ed and acknowledged since
/// its last checkpoint: a disk that lost written data.
///
/// `None` when no partition has a record to tear after (or, `deep`, past its recovery point).
pub fn tear(data: &Path, rng: &mut Rng, window: u64, deep: bool) -> Result<Option<Torn>> {
    let points = recovery_points(data)?;
    let mut candidates = Vec::new();
    for dir in partition_dirs(data)? {
        let Some((_, active)) = segments(&dir)?.pop() else { continue };
        let bytes = std::fs::read(&active).with_context(|| format!("read {}", active.display()))?;
        let ends = batch_ends(&bytes);
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let recovery_point = points.get(&name).copied().unwrap_or(0);
        let floor = if deep { first_unsynced(&bytes, &ends, recovery_point) } else { ends.last().copied() };
        if let (Some(&end), Some(floor)) = (ends.last(), floor) {
            let last_start = ends.len().checked_sub(2).map_or(0, |i| ends[i]);
            candidates.push((active, floor as u64, end as u64, bytes[last_start..end].to_vec()));
        }
    }
    if candidates.is_empty() {
        return Ok(None);
    }
    let (segment, floor, end, last) = candidates.swap_remove(rng.between(0, candidates.len() as u64 - 1) as usize);
    let garbage = |rng: &mut Rng, len: u64| -> Vec<u8> { (0..len).map(|_| rng.next_u64() as u8).collect() };
    let (at, damage) = match (deep, rng.between(0, 1)) {
        (false, 0) => {
            let len = rng.between(1, last.len() as u64 - 1);
            overwrite(&segment, end, &last[..len as usize])?;
            (end, Damage::TornBatch { len })
        }
        (false, _) => {
            let len = rng.between(1, window.max(1));
            overwrite(&segment, end, &garbage(rng, len))?;
            (end, Damage::Garbage { len })
        }
        (true, cut) => {
            let at = end - rng.between(1, window.clamp(1, end - floor));
            if cut == 0 {
                let file = std::fs::OpenOptions::new().write(true).open(&segment)?;
                file.set_len(at).with_context(|| format!("cut {}", segment.display()))?;
                file.sync_all()?;
                (at, Damage::Cut)
            } else {
                let len = rng.between(1, end - at);
                overwrite(&segment, at, &garbage(rng, len))?;
                (at, Damage::Garbage { len })
            }
        }
    };
    Ok(Some(Torn { segment, damage, at }))
}

/// Flips up to 16 bytes in the middle of the last batch of a segment of one partition of `data` (a
/// stopped broker's data directory) that lies wholly below that partition's checkpointed recovery point:
/// durable data a disk lost. `None` when no partition has such a batch.
pub fn rot(data: &Path, rng: &mut Rng) -> Result<Option<Torn>> {
    let points = recovery_points(data)?;
    let mut candidates = Vec::new();
    for dir in partition_dirs(data)? {
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let Some(&recovery_point) = points.get(&name) else { continue };
        for (_, segment) in segments(&dir)? {
            let bytes = std::fs::read(&segment).with_context(|| format!("read {}", segment.display()))?;
            let ends = batch_ends(&bytes);
            // The batches wholly below the recovery point, and the last of them.
            let below = first_unsynced(&bytes, &ends, recovery_point)
                .map_or(ends.len(), |start| ends.iter().position(|&end| end > start).unwrap_or(ends.len()));
            if below == 0 {
                continue;
            }
            let start = if below >= 2 { ends[below - 2] } else { 0 };
            candidates.push((segment, start as u64, ends[below - 1] as u64));
        }
    }
    if candidates.is_empty() {
        return Ok(None);
    }
    let (segment, start, end) = candidates.swap_remove(rng.between(0, candidates.len() as u64 - 1) as usize);
    // In the middle of the batch, past its length field, so the damage is to bytes its CRC32C covers.
    let len = 16.min((end - start) / 4);
    let at = start + (end - start) / 2;
    let mut bytes = std::fs::read(&segment)?;
    for b in &mut bytes[at as usize..(at + len) as usize] {
        *b ^= 0xff;
    }
    overwrite(&segment, at, &bytes[at as usize..(at + len) as usize])?;
    Ok(Some(Torn { segment, damage: Damage::Flipped { len }, at }))
}

/// Writes `bytes` at byte `at` of the file, durably.
fn overwrite(path: &Path, at: u64, bytes: &[u8]) -> Result<()> {
    let mut file = std::fs::OpenOptions::new().write(true).open(path)?;
    file.seek(SeekFrom::Start(at))?;
    file.write_all(bytes).with_context(|| format!("write {}", path.display()))?;
    file.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::faults::replica::read_replica;
    use crate::faults::replica::tests::batch;

    /// A data directory with partition `t-0` of two segments (three batches in the active one, then its
    /// reserved zeros) and an empty `t-1`, a set-aside log and the quorum's directory.
    fn data() -> (tempfile::TempDir, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("t-0");
        std::fs::create_dir(&log).unwrap();
        std::fs::write(log.join("00000000000000000000.log"), batch(0, &["a", "b"])).unwrap();
        let mut active = batch(2, &["c"]);
        active.extend_from_slice(&batch(3, &["d", "e"]));
        active.extend_from_slice(&batch(5, &["f"]));
        let data_len = active.len();
        active.extend_from_slice(&[0u8; 512]);
        std::fs::write(log.join("00000000000000000002.log"), &active).unwrap();
        std::fs::create_dir(dir.path().join("t-1")).unwrap();
        for other in ["t-0.stray", "quorum"] {
            std::fs::create_dir(dir.path().join(other)).unwrap();
            std::fs::write(dir.path().join(other).join("00000000000000000000.log"), batch(0, &["x"])).unwrap();
        }
        (dir, active[..data_len].to_vec())
    }

    #[test]
    fn a_torn_write_lands_after_the_whole_batches_and_changes_none_of_them() {
        let mut kinds = std::collections::BTreeSet::new();
        for seed in 0..40 {
            let (dir, before) = data();
            let torn = tear(dir.path(), &mut Rng::new(seed), 100, false).unwrap().expect("a partition with records");
            assert!(torn.segment.ends_with("t-0/00000000000000000002.log"), "{torn:?}");
            assert_eq!(torn.at, before.len() as u64, "seed {seed}: right after the whole batches");
            let after = std::fs::read(&torn.segment).unwrap();
            assert_eq!(after[..before.len()], before[..], "seed {seed}: every whole batch untouched");
            let last = batch(5, &["f"]);
            match torn.damage {
                Damage::TornBatch { len } => {
                    assert!(len >= 1 && (len as usize) < last.len(), "seed {seed}: {len}");
                    assert_eq!(after[before.len()..before.len() + len as usize], last[..len as usize]);
                }
                Damage::Garbage { len } => assert!((1..=100).contains(&len), "seed {seed}: {len}"),
                Damage::Cut | Damage::Flipped { .. } => panic!("seed {seed}: whole batches damaged without deep"),
            }
            kinds.insert(matches!(torn.damage, Damage::TornBatch { .. }));
        }
        assert_eq!(kinds.len(), 2, "both torn batches and garbage");
    }

    #[test]
    fn deep_damage_cuts_or_overwrites_whole_batches_and_nothing_before_it() {
        let mut kinds = std::collections::BTreeSet::new();
        for seed in 0..40 {
            let (dir, before) = data();
            let torn = tear(dir.path(), &mut Rng::new(seed), 100, true).unwrap().expect("a partition with records");
            assert!(torn.segment.ends_with("t-0/00000000000000000002.log"), "{torn:?}");
            assert!(torn.at < before.len() as u64 && torn.at >= before.len() as u64 - 100, "{torn:?}");
            let after = std::fs::read(&torn.segment).unwrap();
            let at = torn.at as usize;
            assert_eq!(after[..at], before[..at], "seed {seed}: the bytes before the damage are untouched");
            match torn.damage {
                Damage::Cut => assert_eq!(after.len(), at),
                Damage::Garbage { len } => {
                    assert!(len >= 1 && at + len as usize <= before.len());
                    assert_ne!(after[at..at + len as usize], before[at..at + len as usize]);
                }
                Damage::TornBatch { .. } | Damage::Flipped { .. } => {
                    panic!("seed {seed}: deep damage cuts or overwrites the whole batches past the point")
                }
            }
            kinds.insert(matches!(torn.damage, Damage::Cut));
            // The first segment is whole; what is left of the active one reads as a prefix or fails its CRC.
            if let Ok(records) = read_replica(dir.path(), "t", 0).map(|r| r.expect("a log")) {
                assert!(records.len() < 6 && records.len() >= 2, "seed {seed}: {records:?}");
            }
        }
        assert_eq!(kinds.len(), 2, "both cuts and garbage");
    }

    #[test]
    fn deep_damage_spares_what_is_below_the_recovery_point() {
        // t-0's active segment holds offsets 2, 3..4 and 5; synced below 4, so the batch of 3..4 and the
        // one after it may be damaged.
        let (dir, before) = data();
        let checkpoint = "0\n2\nt 0 4\nt 1 0\n";
        std::fs::write(dir.path().join("recovery-point-offset-checkpoint.shard-1"), checkpoint).unwrap();
        let floor = batch(2, &["c"]).len() as u64;
        for seed in 0..40 {
            let (dir, _) = data();
            std::fs::write(dir.path().join("recovery-point-offset-checkpoint.shard-1"), checkpoint).unwrap();
            let torn = tear(dir.path(), &mut Rng::new(seed), 1 << 20, true).unwrap().expect("records past the point");
            assert!(torn.at >= floor && torn.at < before.len() as u64, "seed {seed}: {torn:?}");
        }
        // Everything synced: nothing to tear.
        std::fs::write(dir.path().join("recovery-point-offset-checkpoint.shard-0"), "0\n1\nt 0 6\n").unwrap();
        std::fs::remove_file(dir.path().join("recovery-point-offset-checkpoint.shard-1")).unwrap();
        assert_eq!(tear(dir.path(), &mut Rng::new(1), 1 << 20, true).unwrap(), None);
    }

    #[test]
    fn a_broker_without_records_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("t-0")).unwrap();
        assert_eq!(tear(dir.path(), &mut Rng::new(1), 100, false).unwrap(), None);
    }

    #[test]
    fn rot_flips_bytes_inside_the_last_batch_below_the_recovery_point() {
        let (dir, active) = data();
        // The recovery point is 5: batches 0-1 (first segment) and 2, 3-4 (active one) are below it.
        std::fs::write(dir.path().join("recovery-point-offset-checkpoint.shard-0"), "0\n1\nt 0 5\n").unwrap();
        let mut seen = std::collections::BTreeSet::new();
        for seed in 0..20 {
            let (dir2, _) = data();
            std::fs::copy(
                dir.path().join("recovery-point-offset-checkpoint.shard-0"),
                dir2.path().join("recovery-point-offset-checkpoint.shard-0"),
            )
            .unwrap();
            let torn = rot(dir2.path(), &mut Rng::new(seed)).unwrap().expect("a batch below the point");
            let Damage::Flipped { len } = torn.damage else { panic!("{torn:?}") };
            assert!(len > 0);
            let name = torn.segment.file_name().unwrap().to_string_lossy().into_owned();
            let after = std::fs::read(&torn.segment).unwrap();
            if name == "00000000000000000002.log" {
                // The batch holding 3-4 (the last below 5), not the one holding 5.
                let ends = batch_ends(&active);
                assert!(torn.at >= ends[0] as u64 && torn.at + len <= ends[1] as u64, "{torn:?}");
                assert_eq!(after[ends[1]..active.len()], active[ends[1]..], "the batch at the point is untouched");
            }
            seen.insert(name);
        }
        assert_eq!(seen.len(), 2, "either segment: {seen:?}");
        // Without a recovery point nothing is below it.
        let (bare, _) = data();
        assert_eq!(rot(bare.path(), &mut Rng::new(1)).unwrap(), None);
    }
}
