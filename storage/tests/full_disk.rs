//! A disk that fills up under the small files (index files and checkpoints): writing them is refused
//! with `NoSpace`, the process goes on, and once space is back they are written and nothing is lost.
//! And a disk that fills up to the free-space floor: the segments' reservations leave it free.

mod common;

use std::path::Path;

use futures_lite::future::block_on;
use shardlog_storage::fs::Fs;
use shardlog_storage::fs::sim::SimFs;
use shardlog_storage::{LeaderEpoch, LogConfig, LogDir, LogDirScope, Offset, SpaceFloor, StorageError, TopicPartition};

use common::{ManualClock, make_batch};

#[test]
fn index_and_checkpoint_writes_on_a_full_disk_are_refused_and_written_once_space_is_back() {
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let config =
        LogConfig { index_interval_bytes: 300, tail_cache_bytes: 0, retention_ms: None, ..LogConfig::default() };
    let tp = TopicPartition::new("t", 0);
    let (dir, _) = block_on(LogDir::open(fs.clone(), clock.clone(), Path::new("/data"), |_| config.clone())).unwrap();
    let log = block_on(dir.get_or_create(&tp, config.clone())).unwrap();
    for i in 0..20 {
        block_on(log.append(&make_batch(i, 4, 200, 0), LeaderEpoch(0))).unwrap();
    }
    block_on(log.flush()).unwrap();
    log.set_high_watermark(log.log_end_offset());

    // The records are on disk; their index file and the checkpoints are not written yet.
    fs.set_full(true);
    let err = block_on(dir.checkpoint_if_moved()).unwrap_err();
    assert!(matches!(err, StorageError::NoSpace { .. }), "{err}");
    let index = Path::new("/data/t-0/00000000000000000000.index");
    assert!(fs.contents(index).is_none_or(|c| c.is_empty()), "no index entry written");
    assert!(!block_on(log.read(Offset(0), usize::MAX)).unwrap().bytes.is_empty(), "reads go on");

    fs.set_full(false);
    assert!(block_on(dir.checkpoint_if_moved()).unwrap() > 0, "the checkpoints are written now");
    assert!(fs.contents(index).is_some_and(|c| !c.is_empty()), "the index entries are written");
    block_on(dir.close()).unwrap();
    drop((log, dir));

    let (dir, _) = block_on(LogDir::open(fs.clone(), clock, Path::new("/data"), |_| config.clone())).unwrap();
    let log = dir.get(&tp).unwrap();
    assert_eq!(log.log_end_offset(), Offset(80), "every record");
    assert_eq!(log.high_watermark(), Offset(80));
}

/// A roll that fails on a full disk after its seal cut the active segment's file leaves that segment
/// active: a later small append that fits in it reserves its blocks again and is refused with `NoSpace`,
/// rather than being written (or preceded by zeros) past the cut, where the full disk would fail the
/// write itself. Once space is back, appends go on and nothing acknowledged is lost.
#[test]
fn after_a_roll_fails_on_a_full_disk_an_append_into_the_cut_segment_is_refused_not_written_past_it() {
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let config = LogConfig {
        segment_bytes: 16 << 10,
        index_interval_bytes: 300,
        tail_cache_bytes: 0,
        retention_ms: None,
        ..LogConfig::default()
    };
    let tp = TopicPartition::new("t", 0);
    let (dir, _) = block_on(LogDir::open(fs.clone(), clock.clone(), Path::new("/data"), |_| config.clone())).unwrap();
    let log = block_on(dir.get_or_create(&tp, config.clone())).unwrap();
    let mut acknowledged = 0;
    // 16 batches of about 900 bytes: the segment is 14 KiB full.
    while acknowledged < 16 {
        let info = block_on(log.append(&make_batch(acknowledged, 2, 400, 0), LeaderEpoch(0))).unwrap();
        block_on(log.wait_durable(info.next_offset())).unwrap();
        acknowledged += 1;
    }

    fs.set_full(true);
    let err = block_on(log.append(&make_batch(100, 8, 400, 0), LeaderEpoch(0))).unwrap_err();
    assert!(matches!(err, StorageError::NoSpace { .. }), "the roll's index files: {err}");
    assert_eq!(log.segment_count(), 1, "the cut segment is still the active one");
    let err = block_on(log.append(&make_batch(101, 1, 100, 0), LeaderEpoch(0))).unwrap_err();
    assert!(matches!(err, StorageError::NoSpace { .. }), "the small append: {err}");

    fs.set_full(false);
    for i in 0..4 {
        let info = block_on(log.append(&make_batch(200 + i, 2, 400, 0), LeaderEpoch(0))).unwrap();
        block_on(log.wait_durable(info.next_offset())).unwrap();
        acknowledged += 1;
    }
    block_on(dir.close()).unwrap();
    drop((log, dir));
    let (dir, _) = block_on(LogDir::open(fs, clock, Path::new("/data"), |_| config.clone())).unwrap();
    assert_eq!(dir.get(&tp).unwrap().log_end_offset(), Offset(acknowledged * 2), "every acknowledged record");
}

/// Reservations keep to the free-space floor: three partitions appending until refused leave the floor
/// free on the disk (a reservation never takes it, whatever it would like ahead), use the room above it
/// (they reserve less near it rather than stop), and are refused with `BelowFloor` at it. Once space is
/// freed, appends go on.
#[test]
fn reservations_leave_the_floor_free_and_refuse_appends_at_it() {
    const MIB: u64 = 1 << 20;
    let fs = SimFs::new();
    fs.set_capacity(Some(24 * MIB));
    let floor = 8 * MIB;
    let clock = ManualClock::new(1_700_000_000_000);
    let config = LogConfig { tail_cache_bytes: 0, retention_ms: None, ..LogConfig::default() };
    let scope = LogDirScope {
        name: "s".into(),
        owns: Box::new(|_| true),
        max_open_files: 16,
        max_producer_ids: usize::MAX,
        space_floor: Some(SpaceFloor::new(floor)),
    };
    let data = Path::new("/data");
    let (dir, _) = block_on(LogDir::open_scoped(fs.clone(), clock, data, Some(scope), |_| config.clone())).unwrap();
    let logs: Vec<_> =
        (0..3).map(|p| block_on(dir.get_or_create(&TopicPartition::new("t", p), config.clone())).unwrap()).collect();
    let mut refused = [false; 3];
    let mut seed = 0;
    while refused.contains(&false) {
        for (p, log) in logs.iter().enumerate() {
            if refused[p] {
                continue;
            }
            seed += 1;
            match block_on(log.append(&make_batch(seed, 16, 1000, 0), LeaderEpoch(0))) {
                Ok(info) => block_on(log.wait_durable(info.next_offset())).unwrap(),
                Err(StorageError::BelowFloor { free_bytes, floor_bytes, .. }) => {
                    assert_eq!(floor_bytes, floor);
                    assert!(free_bytes >= floor, "{free_bytes} bytes free");
                    refused[p] = true;
                }
                Err(e) => panic!("partition {p}: {e}"),
            }
            let free = fs.free_bytes(data).unwrap();
            assert!(free >= floor, "a reservation took the floor: {free} bytes free of the {floor} it must leave");
        }
    }
    let free = fs.free_bytes(data).unwrap();
    assert!(free < floor + MIB, "near the floor reservations get less, not nothing: {free} bytes free");
    let appended: u64 = logs.iter().map(|l| l.log_end_offset().0).sum();
    assert!(appended > 0);

    // Space freed (the disk grows): the refused partitions take appends again.
    fs.set_capacity(Some(48 * MIB));
    for log in &logs {
        let info = block_on(log.append(&make_batch(9999, 16, 1000, 0), LeaderEpoch(0))).unwrap();
        block_on(log.wait_durable(info.next_offset())).unwrap();
    }
    block_on(dir.close()).unwrap();
}
