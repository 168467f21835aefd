//! Real-disk tests: glommio DMA files (O_DIRECT) on the data disk, not tmpfs. Files are damaged with
//! ordinary file operations between runs, as a crash or a bad disk would leave them.
//!
//! The directory is `$SHARDLOG_TEST_DIR` (CI points it at the repository's target dir on the data disk),
//! or `target/disk-tests` by default.

mod common;

use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::{LocalExecutorBuilder, Placement};
use shardlog_storage::fs::dma::DmaFs;
use shardlog_storage::segment::{self, LOG_SUFFIX};
use shardlog_storage::{LeaderEpoch, LogConfig, LogDir, Offset, PartitionLog, SystemClock, TopicPartition};

use common::{make_batch, split_batches};

fn test_root() -> PathBuf {
    let root = std::env::var_os("SHARDLOG_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/disk-tests"));
    std::fs::create_dir_all(&root).expect("create test root");
    root
}

fn run<T>(f: impl AsyncFnOnce() -> T) -> T {
    let ex = LocalExecutorBuilder::new(Placement::Unbound).make().expect("glommio executor");
    ex.run(f())
}

fn config() -> LogConfig {
    LogConfig { segment_bytes: 64 * 1024, retention_ms: None, tail_cache_bytes: 8 * 1024, ..LogConfig::default() }
}

const TP: &str = "orders";

/// Appends `n` batches of ~1 KiB (several segment rolls), flushes, and returns the stored batches.
async fn fill(dir: &Path, n: u64) -> Vec<(u64, u64, Vec<u8>)> {
    let (logs, _) = LogDir::open(DmaFs, Rc::new(SystemClock), dir, |_| config()).await.expect("open");
    let log = logs.get_or_create(&TopicPartition::new(TP, 0), config()).await.expect("create");
    for i in 0..n {
        let info =
            log.append(&make_batch(i, 4, 240, 1_700_000_000_000 + i as i64), LeaderEpoch(3)).await.expect("append");
        assert_eq!(info.base_offset, Offset(i * 4));
    }
    log.flush().await.expect("flush");
    logs.checkpoint().await.expect("checkpoint");
    assert!(log.segment_count() >= 4, "expected several segment rolls, got {}", log.segment_count());
    let read = log.read(Offset(0), usize::MAX).await.expect("read");
    split_batches(&read.bytes)
}

fn partition_dir(dir: &Path) -> PathBuf {
    dir.join(format!("{TP}-0"))
}

fn last_segment(dir: &Path) -> PathBuf {
    last_segment_of(&partition_dir(dir))
}

fn last_segment_of(partition_dir: &Path) -> PathBuf {
    let mut logs: Vec<PathBuf> = std::fs::read_dir(partition_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_str().unwrap().ends_with(LOG_SUFFIX))
        .collect();
    logs.sort();
    logs.pop().expect("a segment")
}

async fn reopen(dir: &Path) -> (LogDir<DmaFs>, Rc<PartitionLog<DmaFs>>, shardlog_storage::OpenReport) {
    let (logs, mut reports) = LogDir::open(DmaFs, Rc::new(SystemClock), dir, |_| config()).await.expect("reopen");
    let log = logs.get(&TopicPartition::new(TP, 0)).expect("partition");
    (logs, log, reports.pop().unwrap().1)
}

async fn assert_prefix(log: &PartitionLog<DmaFs>, before: &[(u64, u64, Vec<u8>)], keep: usize) {
    let read = log.read(Offset(0), usize::MAX).await.expect("read");
    let after = split_batches(&read.bytes);
    assert_eq!(after.len(), keep, "batches kept");
    assert!(after.iter().zip(before).all(|(a, b)| a == b), "a batch before the damage changed");
    assert_eq!(log.log_end_offset(), Offset(before[keep].0), "log end is the damaged batch's base offset");
    assert_eq!(log.verify_indexes().await, Ok(()));
}

/// Cuts `path` to `len` bytes.
fn cut(path: &Path, len: u64) {
    std::fs::OpenOptions::new().write(true).open(path).unwrap().set_len(len).unwrap();
}

fn sizes(dir: &Path) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = std::fs::read_dir(partition_dir(dir))
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(LOG_SUFFIX))
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.metadata().unwrap().len()))
        .collect();
    out.sort();
    out
}

/// [`fill`] with 300 batches, then a clean close (the clean-shutdown marker written).
async fn fill_and_close(dir: &Path) {
    fill(dir, 300).await;
    let (logs, log, _) = reopen(dir).await;
    logs.close().await.unwrap();
    drop((log, logs));
}

/// Flips the bits of `mask` in the byte at `at` of `path`; returns the file's new contents.
fn flip(path: &Path, at: usize, mask: u8) -> Vec<u8> {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at] ^= mask;
    std::fs::write(path, &bytes).unwrap();
    bytes
}

async fn reopen_offline(dir: &Path) -> String {
    let (logs, _) = LogDir::open(DmaFs, Rc::new(SystemClock), dir, |_| config()).await.expect("reopen");
    let tp = TopicPartition::new(TP, 0);
    // Held read-only: what lies before the damage is read, nothing is appended.
    let log = logs.get(&tp).expect("a damaged log is held");
    let below = log.readable_below().expect("damaged");
    assert!(log.read(below, usize::MAX).await.is_err(), "the damaged batch is not read");
    let append = log.append(&make_batch(1, 1, 10, 0), LeaderEpoch(9)).await;
    assert!(matches!(append, Err(shardlog_storage::StorageError::Offline(_))), "{append:?}");
    assert_eq!(logs.partitions(), vec![tp.clone()], "and still held");
    logs.offline(&tp).expect("offline")
}

#[test]
fn recovers_prefix_after_a_torn_tail_past_the_recovery_point() {
    let tmp = tempfile::tempdir_in(test_root()).unwrap();
    let dir = tmp.path().to_path_buf();
    run(async || {
        fill(&dir, 300).await;
        // Ten more batches after the checkpoint: on disk, but past the recovery point, as when the
        // broker is killed within a second of an append. The log is not closed: as after kill -9, the
        // last segment's file still ends in zero padding to a whole block.
        let before = {
            let (logs, log, _) = reopen(&dir).await;
            for i in 300..310 {
                log.append(&make_batch(i, 4, 240, 1_700_000_000_000), LeaderEpoch(3)).await.unwrap();
            }
            log.flush().await.unwrap();
            let before = split_batches(&log.read(Offset(0), usize::MAX).await.unwrap().bytes);
            drop((log, logs));
            before
        };
        // Cut the last segment 5 bytes short of its last batch's end: a torn write.
        let last = last_segment(&dir);
        let last_base = segment::parse_file_name(last.file_name().unwrap().to_str().unwrap(), LOG_SUFFIX).unwrap();
        let logical: usize = before.iter().filter(|b| b.0 >= last_base.0).map(|b| b.2.len()).sum();
        assert!(std::fs::metadata(&last).unwrap().len() >= logical as u64);
        cut(&last, logical as u64 - 5);
        let (_logs, log, report) = reopen(&dir).await;
        assert!(report.damage.is_some(), "the cut batch is reported: {report:?}");
        assert_prefix(&log, &before, before.len() - 1).await;
        // The log goes on from the cut.
        let info = log.append(&make_batch(7, 1, 10, 0), LeaderEpoch(3)).await.unwrap();
        assert_eq!(info.base_offset, Offset(before.last().unwrap().0));
        log.flush().await.unwrap();
    });
}

#[test]
fn a_last_segment_cut_below_the_recovery_point_takes_the_partition_offline_and_keeps_its_files() {
    let tmp = tempfile::tempdir_in(test_root()).unwrap();
    let dir = tmp.path().to_path_buf();
    run(async || {
        let before = fill(&dir, 300).await;
        // Every batch was synced and checkpointed: losing the end of one is the disk's doing, not a
        // crash's.
        let last = last_segment(&dir);
        let last_base = segment::parse_file_name(last.file_name().unwrap().to_str().unwrap(), LOG_SUFFIX).unwrap();
        let logical: usize = before.iter().filter(|b| b.0 >= last_base.0).map(|b| b.2.len()).sum();
        cut(&last, logical as u64 - 5);
        let files = sizes(&dir);
        let damage = reopen_offline(&dir).await;
        let damaged_base = before.last().unwrap().0;
        assert!(damage.contains(last.to_str().unwrap()), "the file is named: {damage}");
        assert!(damage.contains(&format!("offset {damaged_base}")), "the offset is named: {damage}");
        assert_eq!(sizes(&dir), files, "nothing was cut or removed");
    });
}

#[test]
fn a_segment_cut_short_before_later_segments_keeps_them_all_and_takes_the_partition_offline() {
    let tmp = tempfile::tempdir_in(test_root()).unwrap();
    let dir = tmp.path().to_path_buf();
    run(async || {
        fill(&dir, 300).await;
        // 7 bytes cut from the second segment, after a crash (no clean-shutdown marker): the segments
        // after it hold intact, acknowledged records.
        let files = sizes(&dir);
        assert!(files.len() >= 4);
        let second = partition_dir(&dir).join(&files[1].0);
        cut(&second, files[1].1 - 7);
        let damage = reopen_offline(&dir).await;
        assert!(damage.contains(second.to_str().unwrap()), "the file is named: {damage}");
        let mut expected = files.clone();
        expected[1].1 -= 7;
        assert_eq!(sizes(&dir), expected, "every later segment is kept whole");
    });
}

#[test]
fn a_flipped_byte_after_a_clean_close_takes_the_partition_offline() {
    let tmp = tempfile::tempdir_in(test_root()).unwrap();
    let dir = tmp.path().to_path_buf();
    run(async || {
        fill_and_close(&dir).await;
        // Flip one byte inside the last batch's records (after a clean close: the marker is there too).
        let last = last_segment(&dir);
        let bytes = flip(&last, std::fs::metadata(&last).unwrap().len() as usize - 20, 0x40);
        let damage = reopen_offline(&dir).await;
        assert!(damage.contains("CRC"), "CRC damage reported: {damage}");
        assert_eq!(std::fs::read(&last).unwrap(), bytes, "the file is kept as found");
    });
}

#[test]
fn a_read_meeting_a_bad_crc_below_the_recovery_point_takes_the_log_offline() {
    let tmp = tempfile::tempdir_in(test_root()).unwrap();
    let dir = tmp.path().to_path_buf();
    run(async || {
        fill_and_close(&dir).await;
        // A flipped byte in the first batch of the first segment: trusted at open (only the last index
        // interval of a trusted segment is read), met by the first read of it.
        let files = sizes(&dir);
        let first = partition_dir(&dir).join(&files[0].0);
        let bytes = flip(&first, 100, 0x01);
        let (logs, log, _) = reopen(&dir).await;
        let tp = TopicPartition::new(TP, 0);
        assert_eq!(logs.offline(&tp), None, "not found at open");
        let read = log.read(Offset(0), usize::MAX).await;
        assert!(matches!(read, Err(shardlog_storage::StorageError::Damaged { position: 0, .. })), "{read:?}");
        assert!(logs.offline(&tp).is_some_and(|d| d.contains("CRC")), "the partition is offline");
        let append = log.append(&make_batch(1, 1, 10, 0), LeaderEpoch(3)).await;
        assert!(matches!(append, Err(shardlog_storage::StorageError::Offline(_))), "{append:?}");
        assert!(log.read(Offset(40), usize::MAX).await.is_err(), "every read is refused");
        logs.close().await.expect("an offline log still closes");
        assert_eq!(std::fs::read(&first).unwrap(), bytes, "the file is kept as found");
    });
}

#[test]
fn a_batch_the_tail_read_back_from_the_disk_at_open_is_still_checked_when_read() {
    // The tail of the active segment, read back at open, holds batches from the disk; reads skip the CRC
    // only for batches appended since. With an index entry per batch, a clean open checks only the last
    // batch, so a flipped byte in one before it, inside the tail's block, is met first by a read.
    let tmp = tempfile::tempdir_in(test_root()).unwrap();
    let dir = tmp.path().to_path_buf();
    let config = || LogConfig { index_interval_bytes: 256, ..config() };
    let tp = TopicPartition::new(TP, 0);
    run(async || {
        let (logs, _) = LogDir::open(DmaFs, Rc::new(SystemClock), &dir, |_| config()).await.expect("open");
        let log = logs.get_or_create(&tp, config()).await.expect("create");
        for i in 0..80 {
            log.append(&make_batch(i, 4, 240, 1_700_000_000_000), LeaderEpoch(3)).await.expect("append");
        }
        logs.close().await.expect("clean close");
    });
    let last = last_segment(&dir);
    let stored = std::fs::read(&last).unwrap();
    let (mut starts, mut at) = (Vec::new(), 0);
    while at < stored.len() {
        starts.push(at);
        at += shardlog_storage::batch::BatchHeader::parse(&stored[at..]).unwrap().total_bytes();
    }
    let tail_start = stored.len() / 4096 * 4096;
    let victim = starts[..starts.len() - 1].iter().copied().find(|s| *s >= tail_start);
    let victim = victim.expect("a batch before the last one begins in the tail's block");
    flip(&last, victim + 100, 0x01);
    run(async || {
        let (logs, _) = LogDir::open(DmaFs, Rc::new(SystemClock), &dir, |_| config()).await.expect("reopen");
        let log = logs.get(&tp).expect("not found at open: the partition is served");
        let read = log.read(Offset(0), usize::MAX).await;
        assert!(
            matches!(read, Err(shardlog_storage::StorageError::Damaged { position, .. }) if position == victim as u64),
            "{read:?}"
        );
        assert!(logs.offline(&tp).is_some_and(|d| d.contains("CRC")), "the partition is offline");
        logs.close().await.expect("an offline log still closes");
    });
}

#[test]
fn rebuilds_deleted_index_files() {
    let tmp = tempfile::tempdir_in(test_root()).unwrap();
    let dir = tmp.path().to_path_buf();
    run(async || {
        let before = fill(&dir, 300).await;
        let (logs, log, _) = reopen(&dir).await;
        let segments = log.segment_count();
        logs.close().await.unwrap();
        drop((log, logs));
        let pdir = partition_dir(&dir);
        let mut removed = 0;
        for entry in std::fs::read_dir(&pdir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "index") {
                std::fs::remove_file(&path).unwrap();
                removed += 1;
            }
        }
        assert_eq!(removed, segments);
        let (logs, log, report) = reopen(&dir).await;
        assert_eq!(report.rebuilt_indexes, segments, "every segment's index is rebuilt: {report:?}");
        assert_eq!(report.damage, None);
        // Rolled segments get their index files back at once; the active one when it is closed.
        logs.close().await.unwrap();
        for base in log.segment_bases() {
            assert!(pdir.join(segment::file_name(base, ".index")).exists(), "index of {base} rebuilt on disk");
        }
        drop((log, logs));
        let (_logs, log, report) = reopen(&dir).await;
        assert_eq!(report.rebuilt_indexes, 0);
        assert_eq!(report.scanned_segments, 0, "a clean close needs no scan");
        assert_eq!(log.verify_indexes().await, Ok(()));
        // Reads through the rebuilt indexes find every batch from any offset inside it.
        for (base, last, bytes) in before.iter().step_by(7) {
            for from in [*base, *last] {
                let read = log.read(Offset(from), 1).await.unwrap();
                assert_eq!(&read.bytes, bytes, "read from {from}");
            }
        }
    });
}

#[test]
fn group_commit_covers_a_thousand_concurrent_appends_with_few_fsyncs() {
    let tmp = tempfile::tempdir_in(test_root()).unwrap();
    let dir = tmp.path().to_path_buf();
    run(async || {
        let (logs, _) = LogDir::open(DmaFs, Rc::new(SystemClock), &dir, |_| LogConfig::default()).await.unwrap();
        let log = logs.get_or_create(&TopicPartition::new(TP, 0), LogConfig::default()).await.unwrap();
        let tasks: Vec<_> = (0..1000u64)
            .map(|i| {
                let log = log.clone();
                glommio::spawn_local(async move {
                    let info = log.append(&make_batch(i, 1, 100, 0), LeaderEpoch(0)).await.unwrap();
                    log.wait_durable(info.next_offset()).await.unwrap();
                    info.base_offset
                })
            })
            .collect();
        let mut offsets = Vec::new();
        for t in tasks {
            offsets.push(t.await);
        }
        offsets.sort();
        assert_eq!(offsets, (0..1000).map(Offset).collect::<Vec<_>>(), "each append got its own offset");
        assert_eq!(log.durable_offset(), Offset(1000));
        let fsyncs = log.stats().fsyncs;
        assert!(fsyncs <= 10, "1000 concurrent durable appends took {fsyncs} fdatasyncs");
        assert!(fsyncs >= 1);
    });
}

/// Twelve partitions taking small synced appends at once, into blocks written with zeros ahead: once each
/// file's fdatasync has made its blocks' written state durable, one device flush makes many partitions'
/// appends durable together, and every batch reads back after a restart.
#[test]
fn one_device_flush_makes_many_partitions_appends_durable() {
    let tmp = tempfile::tempdir_in(test_root()).unwrap();
    let dir = tmp.path().to_path_buf();
    let config = || LogConfig { retention_ms: None, preallocate_with_zeros: true, ..LogConfig::default() };
    const PARTITIONS: u32 = 12;
    const ROUNDS: u64 = 40;
    run(async || {
        let (logs, _) = LogDir::open(DmaFs, Rc::new(SystemClock), &dir, |_| config()).await.unwrap();
        let Some(flushes_before) = logs.device_flushes() else {
            // Not ext4 or XFS with barriers (the CI's and this machine's data disk are ext4): nothing to show.
            eprintln!("the test dir's filesystem is not one where one device flush covers many files");
            return;
        };
        let mut parts = Vec::new();
        for p in 0..PARTITIONS {
            parts.push(logs.get_or_create(&TopicPartition::new(TP, p), config()).await.unwrap());
        }
        let tasks: Vec<_> = parts
            .iter()
            .enumerate()
            .map(|(p, log)| {
                let log = log.clone();
                glommio::spawn_local(async move {
                    for i in 0..ROUNDS {
                        let batch = make_batch(p as u64 * 1000 + i, 4, 1000, 1_700_000_000_000);
                        let info = log.append(&batch, LeaderEpoch(1)).await.unwrap();
                        log.wait_durable(info.next_offset()).await.unwrap();
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await;
        }
        let file_syncs: u64 = parts.iter().map(|l| l.stats().fsyncs).sum();
        let joined: u64 = parts.iter().map(|l| l.stats().device_flushes).sum();
        let flushes = logs.device_flushes().unwrap() - flushes_before;
        let batches = u64::from(PARTITIONS) * ROUNDS;
        eprintln!("{batches} durable batches: {flushes} device flushes ({joined} syncs), {file_syncs} fdatasyncs");
        assert!(parts.iter().all(|l| l.stats().device_flushes > 0), "every partition's syncs used the device flush");
        assert!(flushes > 0 && joined > flushes, "{joined} syncs were {flushes} device flushes");
        // Each partition has one append in flight at a time, so a flush covers those whose write-outs
        // completed while the one before it ran: a few, not all twelve.
        assert!(
            flushes + file_syncs < batches * 3 / 4,
            "{batches} durable batches took {flushes} device flushes and {file_syncs} fdatasyncs"
        );
        assert!(dir.join("device-flush").exists(), "the flush's anchor file is in the data dir");
    });
    run(async || {
        let (logs, _) = LogDir::open(DmaFs, Rc::new(SystemClock), &dir, |_| config()).await.unwrap();
        for p in 0..PARTITIONS {
            let log = logs.get(&TopicPartition::new(TP, p)).unwrap();
            assert_eq!(log.log_end_offset(), Offset(ROUNDS * 4));
            let read = log.read(Offset(0), usize::MAX).await.unwrap();
            assert_eq!(split_batches(&read.bytes).len() as u64, ROUNDS);
        }
    });
}

/// The file's extents as (start, end, unwritten), from the filesystem (FIEMAP).
fn extents(path: &Path) -> Vec<(u64, u64, bool)> {
    use std::os::fd::AsRawFd;
    const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
    const FIEMAP_FLAG_SYNC: u32 = 1;
    const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;
    const SLOTS: usize = 512;
    // struct fiemap (32 bytes) followed by SLOTS struct fiemap_extent (56 bytes each), in u64 words.
    let mut words = vec![0u64; 4 + SLOTS * 7];
    words[1] = u64::MAX; // fm_length
    words[2] = u64::from(FIEMAP_FLAG_SYNC); // fm_flags (fm_mapped_extents above it, written back)
    words[3] = SLOTS as u64; // fm_extent_count (fm_reserved above it is 0)
    let file = std::fs::File::open(path).unwrap();
    // SAFETY: FS_IOC_FIEMAP reads the header and writes at most fm_extent_count extents after it, all
    // inside `words`.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), FS_IOC_FIEMAP, words.as_mut_ptr()) };
    assert_eq!(rc, 0, "FIEMAP on {}: {}", path.display(), std::io::Error::last_os_error());
    let mapped = (words[2] >> 32) as usize;
    assert!(mapped < SLOTS, "more extents than asked for");
    (0..mapped)
        .map(|i| {
            let e = &words[4 + i * 7..4 + (i + 1) * 7];
            let flags = e[5] as u32;
            (e[0], e[0] + e[2], flags & FIEMAP_EXTENT_UNWRITTEN != 0)
        })
        .collect()
}

/// Whether every byte of `[from, to)` is in an extent that holds written blocks.
fn written(extents: &[(u64, u64, bool)], from: u64, to: u64) -> bool {
    let mut at = from;
    for &(start, end, unwritten) in extents {
        if at >= to {
            break;
        }
        if start <= at && at < end {
            if unwritten {
                return false;
            }
            at = end;
        }
    }
    at >= to
}

#[test]
fn small_synced_appends_land_in_blocks_already_written_and_big_ones_write_no_zeros() {
    let tmp = tempfile::tempdir_in(test_root()).unwrap();
    let dir = tmp.path().to_path_buf();
    let config = || LogConfig { retention_ms: None, ..LogConfig::default() };
    let (data_end, count) = run(async || {
        let (logs, _) = LogDir::open(DmaFs, Rc::new(SystemClock), &dir, |_| config()).await.unwrap();
        let small = logs.get_or_create(&TopicPartition::new(TP, 0), config()).await.unwrap();
        let big = logs.get_or_create(&TopicPartition::new(TP, 1), config()).await.unwrap();
        // Small synced appends until the segment's reservation runs 2 MiB past them (it grows by as much
        // as the segment holds, so this comes right after one of its steps).
        let path = last_segment(&dir);
        let mut sent = Vec::new();
        let mut data_end = 0u64;
        while std::fs::metadata(&path).map_or(0, |m| m.len()) < data_end.next_multiple_of(4096) + (2 << 20) {
            assert!(sent.len() < 5000, "the reservation never ran 2 MiB ahead");
            let batch = make_batch(sent.len() as u64, 4, 900, 1_700_000_000_000);
            let info = small.append(&batch, LeaderEpoch(1)).await.unwrap();
            small.wait_durable(info.next_offset()).await.unwrap();
            data_end += batch.len() as u64;
            sent.push(batch);
        }
        for i in 0..12u64 {
            let info = big.append(&make_batch(i, 64, 4000, 1_700_000_000_000), LeaderEpoch(1)).await.unwrap();
            big.wait_durable(info.next_offset()).await.unwrap();
        }

        let file_len = std::fs::metadata(&path).unwrap().len();
        let map = extents(&path);
        // The data and the next half megabyte of the reservation are in written blocks, so the next
        // appends' fdatasyncs have no extent to convert.
        let data_blocks = data_end.next_multiple_of(4096);
        assert!(
            written(&map, 0, data_blocks + (512 << 10)),
            "blocks up to {data_blocks} + 512 KiB written ({file_len}): {map:?}"
        );
        // The zeros go at most 1.5 MiB ahead (a megabyte from where the last ones ended, once the data is
        // within half a megabyte of that): the rest of the reservation is still only allocated.
        assert!(!written(&map, data_blocks + (3 << 19), file_len), "the far reservation is not written: {map:?}");
        let zeroed = small.stats().bytes_zeroed;
        assert!(zeroed > 0 && zeroed <= data_blocks + (3 << 19), "{zeroed} bytes of zeros for {data_end} of data");
        assert_eq!(big.stats().bytes_zeroed, 0, "write-outs of 256 KiB and more get no zeros");
        let big_path = last_segment_of(&dir.join(format!("{TP}-1")));
        let big_end = big.read(Offset(0), usize::MAX).await.unwrap().bytes.len() as u64;
        let big_len = std::fs::metadata(&big_path).unwrap().len();
        assert!(big_len > big_end.next_multiple_of(4096), "reserved ahead: {big_len} for {big_end}");
        assert!(!written(&extents(&big_path), big_end.next_multiple_of(4096), big_len), "only allocated past the data");

        let read = small.read(Offset(0), usize::MAX).await.unwrap();
        assert_eq!(read.bytes.len() as u64, data_end);
        let batches = split_batches(&read.bytes);
        assert_eq!(batches.len(), sent.len());
        (data_end, sent.len() as u64)
    });
    // After a restart without a clean close (the file still ends in zeros and reservation), every batch
    // is read back: the zeros never covered data.
    run(async || {
        let (_logs, log, _) = reopen(&dir).await;
        let read = log.read(Offset(0), usize::MAX).await.unwrap();
        assert_eq!(log.log_end_offset(), Offset(count * 4));
        assert_eq!(split_batches(&read.bytes).len() as u64, count);
        assert_eq!(read.bytes.len() as u64, data_end);
    });
}

/// A write-out whose caller goes away part-way (its future dropped after the writes were submitted)
/// still completes, and the file's next write waits for it: the late zeros never land over the newer
/// data written to the same blocks.
#[test]
fn writes_left_by_a_dropped_caller_finish_before_the_next_write_to_the_file() {
    use shardlog_storage::fs::{Fs, SegmentFile, WriteBuf};
    let tmp = tempfile::tempdir_in(test_root()).unwrap();
    let path = tmp.path().join("00000000000000000000.log");
    run(async || {
        let file = DmaFs.open(&path, true).await.unwrap();
        for round in 0..60u8 {
            let at = u64::from(round) * (1 << 20);
            let zeros: Vec<_> = (0..4u64)
                .map(|i| {
                    let mut buf = file.alloc(256 << 10);
                    buf.as_mut().fill(0);
                    (WriteBuf::Owned(buf), at + i * (256 << 10))
                })
                .collect();
            let mut abandoned = Box::pin(file.write_many(zeros));
            assert!(futures_lite::future::poll_once(abandoned.as_mut()).await.is_none(), "the writes are under way");
            // The writes' tasks run and submit their requests; then the caller goes away, in some rounds
            // before they finish (writes that were cancelled instead failed this test in one run of three).
            glommio::timer::sleep(std::time::Duration::from_micros(20)).await;
            drop(abandoned);
            let mut data = file.alloc(4096);
            data.as_mut().fill(round + 1);
            file.write_many(vec![(WriteBuf::Owned(data), at + (512 << 10))]).await.unwrap();
            file.fdatasync().await.unwrap();
            let read = file.read_at(at + (512 << 10), 4096).await.unwrap();
            assert!(read.iter().all(|&b| b == round + 1), "round {round}: the newer data was overwritten");
        }
    });
}

/// Synced appends of large batches go to the disk from the in-memory tail's own buffers, not copied into
/// write buffers first, and the file then holds exactly the batches appended, also across a restart.
#[test]
fn large_synced_appends_are_written_from_the_tail_as_they_are() {
    let tmp = tempfile::tempdir_in(test_root()).unwrap();
    let dir = tmp.path().to_path_buf();
    let config = || LogConfig { retention_ms: None, segment_bytes: 64 << 20, ..LogConfig::default() };
    let appended = run(async || {
        let (logs, _) = LogDir::open(DmaFs, Rc::new(SystemClock), &dir, |_| config()).await.unwrap();
        let log = logs.get_or_create(&TopicPartition::new(TP, 0), config()).await.unwrap();
        let mut offset = 0;
        for round in 0..40u64 {
            // One to three batches of 100-300 KiB per sync, of sizes that leave the last block partial.
            let mut last = None;
            for k in 0..=(round % 3) {
                let value_len = 1000 + ((round * 7 + k * 13) % 50) as usize * 41;
                let batch = make_batch(offset, 200, value_len, 1_700_000_000_000);
                let info = log.append(&batch, LeaderEpoch(1)).await.unwrap();
                offset = info.next_offset().0;
                last = Some(info.next_offset());
            }
            log.wait_durable(last.unwrap()).await.unwrap();
        }
        let stats = log.stats();
        assert!(
            stats.bytes_written_from_tail * 10 >= stats.bytes_written * 9,
            "{} of {} bytes written from the tail's buffers",
            stats.bytes_written_from_tail,
            stats.bytes_written
        );
        log.read(Offset(0), usize::MAX).await.unwrap().bytes.to_vec()
    });
    assert_eq!(split_batches(&appended).len(), (0..40).map(|r| r % 3 + 1).sum::<usize>());
    let file = std::fs::read(last_segment(&dir)).unwrap();
    assert_eq!(&file[..appended.len()], &appended[..], "the file holds the batches as appended");
    run(async || {
        let (logs, _) = LogDir::open(DmaFs, Rc::new(SystemClock), &dir, |_| config()).await.unwrap();
        let log = logs.get(&TopicPartition::new(TP, 0)).unwrap();
        let read = log.read(Offset(0), usize::MAX).await.unwrap();
        assert_eq!(read.bytes[..], appended[..], "read back after a restart");
    });
}

#[test]
fn records_served_from_the_read_buffer_keep_their_bytes_when_the_log_is_cut_rewritten_or_deleted_under_them() {
    // Reads from the disk hand out the buffer the read landed in, without a copy: what a consumer (or a
    // read-ahead) holds must stay what the log held when it was read, whatever is done to the files after,
    // and may be read and dropped by another shard's thread.
    let tmp = tempfile::tempdir_in(test_root()).unwrap();
    let dir = tmp.path().to_path_buf();
    run(async || {
        fill(&dir, 200).await;
        let (logs, log, _) = reopen(&dir).await;
        let served = log.read(Offset(0), 16 << 10).await.expect("read").bytes;
        let kept = served.to_vec();
        assert!(split_batches(&kept).len() > 4, "several batches served");
        assert_eq!(served.as_ptr() as usize % 4096, 0, "served from the read's own (aligned) buffer, not a copy");
        let later = log.read(Offset(400), 16 << 10).await.expect("read").bytes;
        let later_kept = later.to_vec();

        // A follower truncating to its new leader's log: the segment is cut inside the range served and
        // other records are written over its place.
        log.truncate_to(Offset(8)).await.expect("truncate");
        for i in 0..40 {
            log.append(&make_batch(1_000 + i, 4, 240, 1_700_000_000_000), LeaderEpoch(4)).await.expect("append");
        }
        log.flush().await.expect("flush");
        let now = log.read(Offset(0), 16 << 10).await.expect("read again").bytes;
        assert_ne!(now.as_ref(), kept.as_slice(), "the log holds other records there now");
        assert_eq!(served.as_ref(), kept.as_slice(), "what was served is what was read");
        assert_eq!(later.as_ref(), later_kept.as_slice(), "a removed segment's bytes as read");

        // DeleteRecords past the whole first segment, then the bytes read and dropped by another thread:
        // the buffer comes back to this one to be freed.
        log.delete_records(Offset(40 * 4)).await.expect("delete records");
        drop(now);
        let freed_before = shardlog_storage::fs::shared_read::buffers_freed_at_home();
        let elsewhere = std::thread::spawn(move || {
            let seen = served.to_vec();
            drop(served);
            seen
        });
        assert_eq!(elsewhere.join().unwrap(), kept, "read on another thread");
        for _ in 0..100 {
            if shardlog_storage::fs::shared_read::buffers_freed_at_home() > freed_before {
                break;
            }
            glommio::timer::sleep(std::time::Duration::from_millis(10)).await;
        }
        assert_eq!(
            shardlog_storage::fs::shared_read::buffers_freed_at_home(),
            freed_before + 1,
            "the buffer dropped on another thread was freed back on the one that read it"
        );
        logs.close().await.expect("close");
    });
}
