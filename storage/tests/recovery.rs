//! Recovery from specific damage a crash or a bad disk can leave: a trusted segment that ends short or
//! holds a wrong offset (damage: the partition goes offline, every file kept), a partition deletion cut
//! off half way, leftovers of unfinished atomic writes.

mod common;

use std::path::Path;

use futures_lite::future::block_on;
use shardlog_storage::fs::Fs;
use shardlog_storage::fs::sim::SimFs;
use shardlog_storage::{LeaderEpoch, LogDir, Offset, StorageError, TopicPartition};

use common::{ManualClock, make_batch, small_config, split_batches};

const DATA: &str = "/data";

fn open_dir(fs: &SimFs) -> LogDir<SimFs> {
    block_on(LogDir::open(fs.clone(), ManualClock::new(1_700_000_000_000), Path::new(DATA), |_| small_config()))
        .unwrap()
        .0
}

/// Three segments of 10 offsets each plus an active one, synced and checkpointed.
fn three_segments(fs: &SimFs, tp: &TopicPartition) {
    let dir = open_dir(fs);
    let log = block_on(dir.get_or_create(tp, small_config())).unwrap();
    for seg in 0..4u64 {
        for i in 0..5 {
            block_on(log.append(&make_batch(seg * 10 + i, 2, 100, 0), LeaderEpoch(seg as i32))).unwrap();
        }
        if seg < 3 {
            block_on(log.roll()).unwrap();
        }
    }
    block_on(log.flush()).unwrap();
    block_on(dir.checkpoint()).unwrap();
    assert_eq!(log.segment_bases(), vec![Offset(0), Offset(10), Offset(20), Offset(30)]);
}

#[test]
fn a_trusted_segment_that_ends_short_takes_the_partition_offline_and_keeps_the_later_segments() {
    let fs = SimFs::new();
    let tp = TopicPartition::new("t", 0);
    three_segments(&fs, &tp);
    // The first segment loses its last batch. The recovery point (40) vouches for all of it, and a roll
    // seals a segment before the next one starts: no crash can do this, the disk lost durable data.
    let first = Path::new("/data/t-0/00000000000000000000.log");
    let bytes = fs.contents(first).unwrap();
    let batches = split_batches(&bytes);
    let keep: usize = batches[..4].iter().map(|b| b.2.len()).sum();
    fs.set_contents(first, bytes[..keep].to_vec());
    let later: Vec<Vec<u8>> = [10, 20, 30]
        .iter()
        .map(|b| fs.contents(&Path::new("/data/t-0").join(format!("{b:020}.log"))).unwrap())
        .collect();

    let dir = open_dir(&fs);
    let damage = dir.offline(&tp).expect("offline");
    assert!(damage.contains("00000000000000000000.log") && damage.contains("offset 8"), "{damage}");
    // Held read-only: the intact batches before the damage are read, the reads that need it refused.
    let log = dir.get(&tp).expect("held");
    assert_eq!(log.readable_below(), Some(Offset(8)));
    let read = block_on(log.read(Offset(0), usize::MAX)).unwrap();
    let batches = split_batches(&read.bytes);
    assert_eq!((batches.first().map(|b| b.0), batches.last().map(|b| b.1)), (Some(0), Some(7)), "offsets 0..8");
    assert_eq!(read.next_offset, Offset(8));
    assert!(matches!(block_on(log.read(Offset(8), usize::MAX)), Err(StorageError::Offline(_))));
    assert!(matches!(block_on(log.read(Offset(12), usize::MAX)), Err(StorageError::Offline(_))));
    let append = block_on(log.append(&make_batch(9, 1, 10, 0), LeaderEpoch(9)));
    assert!(matches!(append, Err(StorageError::Offline(_))), "{append:?}");
    assert_eq!(fs.contents(first).unwrap(), bytes[..keep], "the short segment is kept as found");
    for (b, contents) in [10, 20, 30].iter().zip(&later) {
        let path = Path::new("/data/t-0").join(format!("{b:020}.log"));
        assert_eq!(&fs.contents(&path).unwrap(), contents, "segment {b} after the damage is kept whole");
    }
    // The checkpoints keep what they said of it (for after a repair), and the partition stays offline
    // across opens.
    block_on(dir.checkpoint()).unwrap();
    block_on(dir.close()).unwrap();
    drop((log, dir));
    assert_eq!(fs.contents(first).unwrap(), bytes[..keep], "a close changes nothing of it");
    let dir = open_dir(&fs);
    assert!(dir.offline(&tp).is_some());
    let again = block_on(dir.get_or_create(&tp, small_config())).unwrap();
    assert!(again.damage().is_some(), "no empty log replaces a damaged one");
    assert_eq!(again.readable_below(), Some(Offset(8)), "found again where it was, though the close was clean");
}

#[test]
fn a_batch_with_a_wrong_base_offset_in_a_trusted_segment_takes_the_partition_offline() {
    let fs = SimFs::new();
    let tp = TopicPartition::new("t", 0);
    three_segments(&fs, &tp);
    // Corrupt the base offset of the first segment's last indexed batch: outside the CRC, so only the
    // comparison with the index entry can notice.
    let dir = open_dir(&fs);
    let log = dir.get(&tp).unwrap();
    block_on(dir.close()).unwrap();
    drop((log, dir));
    let first = Path::new("/data/t-0/00000000000000000000.log");
    let index = fs.contents(Path::new("/data/t-0/00000000000000000000.index")).unwrap();
    assert!(index.len() >= 8, "small segments still get index entries");
    let pos = u32::from_be_bytes(index[index.len() - 4..].try_into().unwrap()) as usize;
    let mut bytes = fs.contents(first).unwrap();
    bytes[pos..pos + 8].copy_from_slice(&99i64.to_be_bytes());
    fs.set_contents(first, bytes.clone());

    let (dir, _) =
        block_on(LogDir::open(fs.clone(), ManualClock::new(0), Path::new(DATA), |_| small_config())).unwrap();
    let damage = dir.offline(&tp).expect("offline");
    // Offsets may skip ahead (compaction's gaps), so the batch is taken at 99, and the segment then runs
    // past the next one's base: damage all the same.
    assert!(damage.contains("ends at offset 101 but the next one starts at 10"), "{damage}");
    assert_eq!(fs.contents(first).unwrap(), bytes, "kept as found");
}

#[test]
fn deleting_a_partition_survives_a_crash_part_way() {
    let fs = SimFs::new();
    let tp = TopicPartition::new("t", 0);
    three_segments(&fs, &tp);
    // The first step of a deletion (the durable rename) happened, the removal of its files did not.
    block_on(fs.rename(Path::new("/data/t-0"), Path::new("/data/t-0.deleted"))).unwrap();
    let dir = open_dir(&fs);
    assert!(dir.partitions().is_empty(), "a partition being deleted is not loaded");
    assert!(!fs.exists(Path::new("/data/t-0.deleted")), "opening finishes the deletion");

    // A whole deletion through the data dir.
    let tp1 = TopicPartition::new("t", 1);
    let log = block_on(dir.get_or_create(&tp1, small_config())).unwrap();
    block_on(log.append(&make_batch(1, 1, 10, 0), LeaderEpoch(0))).unwrap();
    block_on(dir.delete(&tp1)).unwrap();
    assert!(!fs.exists(Path::new("/data/t-1")) && !fs.exists(Path::new("/data/t-1.deleted")));
    assert!(open_dir(&fs).partitions().is_empty());
}

#[test]
fn leftover_temporary_files_are_removed_on_open() {
    let fs = SimFs::new();
    let tp = TopicPartition::new("t", 0);
    three_segments(&fs, &tp);
    let ours = ["/data/recovery-point-offset-checkpoint.tmp", "/data/t-0/00000000000000000010.index.tmp"];
    let probe = "/data/.shardlog-iopoll-probe.77.0.tmp";
    for path in ours.iter().chain([&probe]) {
        block_on(fs.open(Path::new(path), true)).unwrap();
    }
    let dir = open_dir(&fs);
    assert_eq!(dir.partitions(), vec![tp], "a stray file is not a partition");
    for path in ours {
        assert!(!fs.exists(Path::new(path)), "{path} left behind");
    }
}

#[test]
fn scoped_owners_share_a_data_dir_without_touching_each_other() {
    use shardlog_storage::LogDirScope;
    let fs = SimFs::new();
    let scope = |shard: u32| LogDirScope {
        name: format!("shard-{shard}"),
        owns: Box::new(move |tp: &TopicPartition| tp.partition % 2 == shard),
        // One open file per owner: every segment access goes through the file cache.
        max_open_files: 1,
        max_producer_ids: usize::MAX,
        space_floor: None,
    };
    let open = |shard: u32| {
        block_on(LogDir::open_scoped(fs.clone(), ManualClock::new(0), Path::new(DATA), Some(scope(shard)), |_| {
            small_config()
        }))
        .unwrap()
        .0
    };
    let (a, b) = (open(0), open(1));
    for p in 0..4u32 {
        let dir = if p % 2 == 0 { &a } else { &b };
        let log = block_on(dir.get_or_create(&TopicPartition::new("t", p), small_config())).unwrap();
        block_on(log.append(&make_batch(p as u64, 1 + p as usize, 10, 0), LeaderEpoch(0))).unwrap();
        block_on(log.flush()).unwrap();
    }
    block_on(a.close()).unwrap();
    block_on(b.checkpoint()).unwrap();
    drop((a, b));
    for name in [
        ".shardlog-clean-shutdown.shard-0",
        "recovery-point-offset-checkpoint.shard-0",
        "recovery-point-offset-checkpoint.shard-1",
    ] {
        assert!(fs.exists(&Path::new(DATA).join(name)), "{name} missing");
    }
    let (a, b) = (open(0), open(1));
    assert_eq!(a.partitions(), vec![TopicPartition::new("t", 0), TopicPartition::new("t", 2)]);
    assert_eq!(b.partitions(), vec![TopicPartition::new("t", 1), TopicPartition::new("t", 3)]);
    assert_eq!(b.get(&TopicPartition::new("t", 3)).unwrap().log_end_offset(), Offset(4));
    assert!(
        !fs.exists(&Path::new(DATA).join(".shardlog-clean-shutdown.shard-0")),
        "the marker is consumed by its owner"
    );
}

#[test]
fn batches_larger_than_a_scan_chunk_are_checked_piece_by_piece() {
    use shardlog_storage::LogConfig;
    let config = LogConfig { max_message_bytes: 8 << 20, segment_bytes: 64 << 20, ..small_config() };
    let fs = SimFs::new();
    let tp = TopicPartition::new("t", 0);
    let open = |fs: &SimFs| {
        let c = config.clone();
        block_on(LogDir::open(fs.clone(), ManualClock::new(0), Path::new(DATA), move |_| c.clone())).unwrap()
    };
    {
        let (dir, _) = open(&fs);
        let log = block_on(dir.get_or_create(&tp, config.clone())).unwrap();
        block_on(log.append(&make_batch(1, 1, 100, 0), LeaderEpoch(0))).unwrap();
        block_on(log.append(&make_batch(2, 3, 1 << 20, 0), LeaderEpoch(0))).unwrap();
        block_on(log.flush()).unwrap();
    }
    // Not closed, no checkpoint: both batches are scanned, the 3 MiB one in pieces.
    let (dir, reports) = open(&fs);
    assert_eq!(reports[0].1.damage, None);
    assert_eq!(dir.get(&tp).unwrap().log_end_offset(), Offset(4));
    drop(dir);
    // One flipped byte deep inside the large batch is found.
    let seg = Path::new("/data/t-0/00000000000000000000.log");
    let mut bytes = fs.contents(seg).unwrap();
    bytes[2 << 20] ^= 1;
    fs.set_contents(seg, bytes);
    let (dir, reports) = open(&fs);
    assert!(reports[0].1.damage.as_deref().is_some_and(|d| d.contains("CRC")), "{:?}", reports[0].1);
    assert_eq!(dir.get(&tp).unwrap().log_end_offset(), Offset(1));
}

#[test]
fn a_log_set_aside_keeps_its_files_under_a_name_never_opened_again() {
    let fs = SimFs::new();
    let open =
        || block_on(LogDir::open(fs.clone(), ManualClock::new(0), Path::new(DATA), |_| small_config())).unwrap().0;
    let dir = open();
    let tp = TopicPartition::new("t-1", 0);
    for round in 0..2u64 {
        let log = block_on(dir.get_or_create(&tp, small_config())).unwrap();
        block_on(log.append(&make_batch(round, 3, 10, 0), LeaderEpoch(0))).unwrap();
        block_on(log.flush()).unwrap();
        let aside = block_on(dir.set_aside(&tp)).unwrap().expect("the log was open");
        let expected = if round == 0 { "t-1-0.stray" } else { "t-1-0.stray.2" };
        assert_eq!(aside, Path::new(DATA).join(expected), "a taken name is not reused");
        assert!(fs.list_dir(&aside).unwrap().iter().any(|n| n.ends_with(".log")), "its segments are kept");
        assert!(dir.get(&tp).is_none(), "no longer served");
    }
    assert_eq!(block_on(dir.set_aside(&tp)).unwrap(), None, "nothing open to set aside");
    block_on(dir.close()).unwrap();
    drop(dir);
    assert!(open().partitions().is_empty(), "a set-aside directory is not opened as a partition");
}

#[test]
fn a_partition_deleted_and_created_again_does_not_inherit_the_old_logs_checkpointed_offsets() {
    use shardlog_storage::fs::sim::SimRng;
    let fs = SimFs::new();
    let open = |fs: &SimFs| {
        block_on(LogDir::open(fs.clone(), ManualClock::new(0), Path::new(DATA), |_| small_config())).unwrap().0
    };
    let dir = open(&fs);
    let tp = TopicPartition::new("t", 0);
    for set_aside in [false, true] {
        // The old log: ten records, the first five deleted, checkpointed.
        let log = block_on(dir.get_or_create(&tp, small_config())).unwrap();
        block_on(log.append(&make_batch(0, 10, 10, 0), LeaderEpoch(0))).unwrap();
        block_on(log.flush()).unwrap();
        block_on(dir.delete_records(&tp, Offset(5))).unwrap();
        block_on(dir.checkpoint()).unwrap();
        if set_aside {
            block_on(dir.set_aside(&tp)).unwrap();
        } else {
            block_on(dir.delete(&tp)).unwrap();
        }
        // A new log of the same partition takes three records, acknowledged once durable; then power loss
        // before any periodic checkpoint.
        let log = block_on(dir.get_or_create(&tp, small_config())).unwrap();
        block_on(log.append(&make_batch(0, 3, 10, 0), LeaderEpoch(0))).unwrap();
        block_on(log.flush()).unwrap();
        let crashed = fs.crash(&mut SimRng::new(3));
        let reopened = open(&crashed);
        let log = reopened.get(&tp).unwrap();
        assert_eq!(log.log_start_offset(), Offset(0), "set aside: {set_aside}: the old log start does not apply");
        assert_eq!(log.log_end_offset(), Offset(3));
        block_on(dir.delete(&tp)).unwrap();
    }
}

#[test]
fn a_truncation_below_the_checkpointed_recovery_point_is_not_taken_for_damage_after_a_crash() {
    let fs = SimFs::new();
    let tp = TopicPartition::new("t", 0);
    three_segments(&fs, &tp);
    let dir = open_dir(&fs);
    let log = dir.get(&tp).unwrap();
    block_on(dir.checkpoint()).unwrap();
    assert_eq!(block_on(log.truncate_to(Offset(35))).unwrap(), Offset(34));
    // A crash before the next checkpoint: the file still says the recovery point is 40.
    let crashed = fs.crash(&mut shardlog_storage::fs::sim::SimRng::new(7));
    drop((log, dir));
    let dir = open_dir(&crashed);
    let log = dir.get(&tp).expect("a truncated log is not damaged");
    assert_eq!(log.log_end_offset(), Offset(34));
}

#[test]
fn a_last_segment_that_lost_whole_batches_or_holds_zeros_below_the_recovery_point_is_damage() {
    // Whole batches gone at a batch boundary (a disk that dropped a flush): nothing looks torn, but the
    // log ends below its recovery point.
    let fs = SimFs::new();
    let tp = TopicPartition::new("t", 0);
    three_segments(&fs, &tp);
    let last = Path::new("/data/t-0/00000000000000000030.log");
    // Every batch here has the same size; the active segment's file ends in padding and preallocation.
    let batch_len = split_batches(&fs.contents(Path::new("/data/t-0/00000000000000000000.log")).unwrap())[0].2.len();
    let bytes = fs.contents(last).unwrap();
    let keep = 3 * batch_len;
    fs.set_contents(last, bytes[..keep].to_vec());
    let damage = open_dir(&fs).offline(&tp).expect("offline");
    assert!(damage.contains("below its recovery point 40"), "{damage}");
    assert_eq!(fs.contents(last).unwrap().len(), keep, "kept as found");

    // The same batches zeroed instead (zeros read as the end of the log, but below the recovery point).
    let fs = SimFs::new();
    three_segments(&fs, &tp);
    let mut zeroed = bytes.clone();
    zeroed[keep..5 * batch_len].fill(0);
    fs.set_contents(last, zeroed.clone());
    let damage = open_dir(&fs).offline(&tp).expect("offline");
    assert!(damage.contains("zero padding"), "{damage}");
    assert_eq!(fs.contents(last).unwrap(), zeroed, "kept as found");
}

#[test]
fn a_garbled_leader_epoch_file_takes_only_its_partition_offline() {
    let fs = SimFs::new();
    let (a, b) = (TopicPartition::new("t", 0), TopicPartition::new("t", 1));
    three_segments(&fs, &a);
    {
        let dir = open_dir(&fs);
        let log = block_on(dir.get_or_create(&b, small_config())).unwrap();
        block_on(log.append(&make_batch(1, 2, 100, 0), LeaderEpoch(0))).unwrap();
        block_on(log.flush()).unwrap();
        block_on(dir.close()).unwrap();
    }
    let epochs = Path::new("/data/t-0/leader-epoch-checkpoint");
    fs.set_contents(epochs, b"0\n2\nnot an epoch\n".to_vec());
    let dir = open_dir(&fs);
    assert!(dir.offline(&a).is_some_and(|d| d.contains("leader-epoch-checkpoint")), "{:?}", dir.offline(&a));
    assert_eq!(dir.get(&b).expect("the other partition opens").log_end_offset(), Offset(2));
}
