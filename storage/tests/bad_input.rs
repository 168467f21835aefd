//! Bad batches are refused with their own error and leave the log exactly as it was; a failing disk stops
//! the process instead of being retried.

mod common;

use std::path::Path;

use futures_lite::future::block_on;
use shardlog_storage::batch::{self, BatchError};
use shardlog_storage::fs::sim::SimFs;
use shardlog_storage::log::OpenHints;
use shardlog_storage::{LeaderEpoch, LogConfig, Offset, PartitionLog, StorageError};

use common::{ManualClock, make_batch, small_config};

fn open(fs: &SimFs, config: LogConfig) -> PartitionLog<SimFs> {
    let clock = ManualClock::new(1_700_000_000_000);
    block_on(PartitionLog::open(fs.clone(), clock, Path::new("/data/t-0"), config, OpenHints::default())).unwrap().0
}

/// Everything observable about the log and its files.
fn snapshot(fs: &SimFs, log: &PartitionLog<SimFs>) -> (Offset, u64, Vec<u8>, Vec<Offset>, u64) {
    let seg = fs.contents(Path::new("/data/t-0/00000000000000000000.log")).unwrap();
    let all = block_on(log.read(Offset(0), usize::MAX)).unwrap().bytes.to_vec();
    (log.log_end_offset(), log.size_bytes(), all, log.segment_bases(), seg.len() as u64 + fs.write_count())
}

fn refused(log: &PartitionLog<SimFs>, bytes: &[u8]) -> BatchError {
    match block_on(log.append(bytes, LeaderEpoch(1))) {
        Err(StorageError::InvalidBatch(e)) => e,
        other => panic!("bad batch was not refused: {other:?}"),
    }
}

#[test]
fn each_bad_batch_is_refused_with_its_own_error_and_changes_nothing() {
    let fs = SimFs::new();
    let config = LogConfig { max_message_bytes: 4096, ..small_config() };
    let log = open(&fs, config);
    for i in 0..5 {
        block_on(log.append(&make_batch(i, 2, 50, 1), LeaderEpoch(1))).unwrap();
    }
    block_on(log.flush()).unwrap();
    let before = snapshot(&fs, &log);
    let good = make_batch(9, 3, 100, 1);

    let mut crc = good.clone();
    let last = crc.len() - 1;
    crc[last] ^= 1;
    assert!(matches!(refused(&log, &crc), BatchError::BadCrc { .. }));

    let mut magic = good.clone();
    magic[16] = 1;
    assert_eq!(refused(&log, &magic), BatchError::BadMagic { magic: 1 });

    let mut length = good.clone();
    length[8..12].copy_from_slice(&0xFFFF_FFFFu32.to_be_bytes());
    assert!(matches!(refused(&log, &length), BatchError::LengthMismatch { field: -1, .. }));

    let big = make_batch(10, 1, 5000, 1);
    assert!(matches!(refused(&log, &big), BatchError::TooLarge { max: 4096, .. }));

    assert!(matches!(refused(&log, &good[..40]), BatchError::TooShort { len: 40 }));

    // Two batches glued together are not one batch.
    let mut two = good.clone();
    two.extend_from_slice(&good);
    assert!(matches!(refused(&log, &two), BatchError::LengthMismatch { .. }));

    let mut count = good.clone();
    count[57..61].copy_from_slice(&7i32.to_be_bytes());
    let crc = batch::compute_crc(&count);
    count[17..21].copy_from_slice(&crc.to_be_bytes());
    assert!(matches!(refused(&log, &count), BatchError::BadRecordCount { count: 7, .. }));

    assert_eq!(snapshot(&fs, &log), before, "a refused batch changed the log");

    // A stale leader epoch is refused too.
    block_on(log.append(&make_batch(11, 1, 10, 1), LeaderEpoch(5))).unwrap();
    block_on(log.flush()).unwrap();
    let before_stale = snapshot(&fs, &log);
    assert!(matches!(
        block_on(log.append(&good, LeaderEpoch(4))),
        Err(StorageError::StaleEpoch { epoch: 4, latest: 5 })
    ));
    assert_eq!(snapshot(&fs, &log), before_stale, "a stale-epoch append changed the log");
}

#[test]
fn reads_outside_the_log_are_out_of_range() {
    let fs = SimFs::new();
    let log = open(&fs, small_config());
    block_on(log.append(&make_batch(1, 4, 10, 1), LeaderEpoch(0))).unwrap();
    block_on(log.delete_records(Offset(2))).unwrap();
    for bad in [Offset(1), Offset(5)] {
        assert!(matches!(block_on(log.read(bad, 100)), Err(StorageError::OffsetOutOfRange { .. })));
    }
    assert!(block_on(log.read(Offset(4), 100)).unwrap().bytes.is_empty(), "reading at the log end is empty");
    assert!(matches!(block_on(log.truncate_to(Offset(1))), Err(StorageError::OffsetOutOfRange { .. })));
    assert!(matches!(block_on(log.delete_records(Offset(9))), Err(StorageError::OffsetOutOfRange { .. })));
}

#[test]
fn invalid_configuration_is_refused_by_name() {
    let fs = SimFs::new();
    let clock = ManualClock::new(0);
    let bad = LogConfig { segment_bytes: 10, ..LogConfig::default() };
    let err = block_on(PartitionLog::open(fs, clock, Path::new("/data/t-0"), bad, OpenHints::default())).unwrap_err();
    assert!(err.to_string().contains("segment.bytes"), "{err}");
}

/// Runs the test `name` again as a child process with `child_env` set (the child then does what fails),
/// and checks that the child aborted saying `says` on stderr.
fn assert_child_aborts(name: &str, child_env: &str, says: &str) {
    let exe = std::env::current_exe().unwrap();
    let out =
        std::process::Command::new(exe).args(["--exact", name, "--nocapture"]).env(child_env, "1").output().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(6), "the child must abort (SIGABRT), got {:?}", out.status);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(says), "stderr: {stderr}");
}

/// A failed fdatasync must stop the process: the kernel may have dropped the dirty pages, so neither a
/// retry nor carrying on is safe. The test runs itself as a child process that hits the failure.
#[test]
fn failed_fdatasync_aborts_the_process() {
    const CHILD: &str = "SHARDLOG_FATAL_FSYNC_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let fs = SimFs::new();
        let log = open(&fs, small_config());
        block_on(log.append(&make_batch(1, 1, 10, 1), LeaderEpoch(0))).unwrap();
        fs.fail_fsyncs();
        let _ = block_on(log.flush());
        // Reaching this line means the failure was swallowed.
        std::process::exit(0);
    }
    assert_child_aborts("failed_fdatasync_aborts_the_process", CHILD, "fatal disk failure: fdatasync");
}

/// The same for a device flush shared by a directory's logs: it fails every append it would have covered,
/// by stopping the process before any of them is acknowledged.
#[test]
fn failed_device_flush_aborts_the_process() {
    const CHILD: &str = "SHARDLOG_FATAL_DEVICE_FLUSH_CHILD";
    if std::env::var_os(CHILD).is_some() {
        let fs = SimFs::new();
        let config = LogConfig { preallocate_with_zeros: true, ..small_config() };
        let clock = ManualClock::new(0);
        let (dir, _) =
            block_on(shardlog_storage::LogDir::open(fs.clone(), clock, Path::new("/data"), |_| config.clone()))
                .unwrap();
        let log = block_on(dir.get_or_create(&shardlog_storage::TopicPartition::new("t", 0), config.clone())).unwrap();
        // The first sync is the file's own (its zeroed blocks made durable); the next is a device flush.
        block_on(log.append(&make_batch(1, 1, 10, 1), LeaderEpoch(0))).unwrap();
        block_on(log.flush()).unwrap();
        block_on(log.append(&make_batch(2, 1, 10, 1), LeaderEpoch(0))).unwrap();
        fs.fail_fsyncs();
        let _ = block_on(log.flush());
        std::process::exit(0);
    }
    assert_child_aborts(
        "failed_device_flush_aborts_the_process",
        CHILD,
        "fatal disk failure: fdatasync (device flush)",
    );
}

#[test]
fn waiting_for_truncated_data_fails_instead_of_hanging() {
    let fs = SimFs::new();
    let log = open(&fs, small_config());
    let info = block_on(log.append(&make_batch(1, 4, 10, 1), LeaderEpoch(0))).unwrap();
    block_on(log.truncate_to(Offset(0))).unwrap();
    assert!(matches!(
        block_on(log.wait_durable(info.next_offset())),
        Err(StorageError::Truncated { offset: Offset(4), log_end: Offset(0) })
    ));
    // New appends at the same offsets become durable as usual.
    let again = block_on(log.append(&make_batch(2, 4, 10, 1), LeaderEpoch(0))).unwrap();
    block_on(log.wait_durable(again.next_offset())).unwrap();
    assert_eq!(log.durable_offset(), Offset(4));
}
