//! Crash tests through the simulated disk (`SimFs`: a device cache that loses any subset of the unflushed
//! writes, sector by sector, in any order, and metadata that hides what was written where it was not
//! committed). Two partitions share the device flush of their directory, so one flush may make both
//! durable; with reservations written with zeros most syncs are such flushes. After reopening:
//! (a) every append whose durability was reported is there with the same offset and bytes,
//! (b) the log is a prefix of what was appended (from its log start on),
//! (c) the indexes agree with the log, and the leader-epoch cache with the batches' epochs,
//! (d) the idempotent producers' state equals the one every batch still in the log (and those retention
//!     deleted, which a snapshot remembers) gives, and a retry of a producer's last batch is a duplicate.

mod common;

use std::path::Path;
use std::rc::Rc;

use futures_lite::future::block_on;
use proptest::prelude::*;
use shardlog_storage::epoch_cache::LeaderEpochCache;
use shardlog_storage::fs::Fs;
use shardlog_storage::fs::device_flush::{BrokenRule, break_rule_for_tests};
use shardlog_storage::fs::sim::{SimFs, SimRng};
use shardlog_storage::{FlushPolicy, LeaderEpoch, LogConfig, LogDir, LogDirScope, Offset, TopicPartition};

use common::{ManualClock, make_batch, set_producer, small_config, split_batches};
use shardlog_storage::batch::BatchHeader;
use shardlog_storage::producer_state::ProducerStates;

#[derive(Debug, Clone)]
enum Op {
    /// `producer` 0: a batch without a producer id; 1..=3: that idempotent producer's next batch.
    Append {
        partition: u32,
        records: usize,
        value_len: usize,
        epoch_bump: bool,
        producer: i64,
    },
    Flush {
        partition: u32,
    },
    /// Both partitions' syncs at once: one device flush may cover both.
    FlushBoth,
    WriteOut {
        partition: u32,
    },
    ReleaseCache {
        partition: u32,
    },
    Roll {
        partition: u32,
    },
    Truncate {
        partition: u32,
        back: u64,
    },
    Retention {
        keep: u64,
    },
    Checkpoint,
    CheckpointIfMoved,
}

fn op() -> impl Strategy<Value = Op> {
    let p = 0u32..2;
    prop_oneof![
        10 => (p.clone(), 1usize..5, 1usize..700, prop::bool::weighted(0.1), 0i64..4)
            .prop_map(|(partition, records, value_len, epoch_bump, producer)| {
                Op::Append { partition, records, value_len, epoch_bump, producer }
            }),
        3 => p.clone().prop_map(|partition| Op::Flush { partition }),
        2 => Just(Op::FlushBoth),
        2 => p.clone().prop_map(|partition| Op::WriteOut { partition }),
        1 => p.clone().prop_map(|partition| Op::ReleaseCache { partition }),
        1 => p.clone().prop_map(|partition| Op::Roll { partition }),
        1 => (p.clone(), 1u64..20).prop_map(|(partition, back)| Op::Truncate { partition, back }),
        1 => (4_000u64..40_000).prop_map(|keep| Op::Retention { keep }),
        2 => Just(Op::Checkpoint),
        2 => Just(Op::CheckpointIfMoved),
    ]
}

#[derive(Debug, Clone)]
struct Appended {
    base: u64,
    last: u64,
    bytes: Vec<u8>,
}

/// How the logs sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// An fdatasync or device flush before each acknowledgement; reservations allocated (unwritten).
    Always,
    /// The same with reservations written with zeros: writes land in written blocks, and once the file's
    /// fdatasync made them durable, most syncs are device flushes.
    AlwaysZeros,
    /// Kafka's interval flush (page cache writes).
    Interval,
}

fn config_for(mode: Mode) -> LogConfig {
    match mode {
        Mode::Always => LogConfig { flush: FlushPolicy::Always, ..small_config() },
        Mode::AlwaysZeros => LogConfig { flush: FlushPolicy::Always, preallocate_with_zeros: true, ..small_config() },
        Mode::Interval => LogConfig { flush: FlushPolicy::Interval { messages: 5, ms: 1_000 }, ..small_config() },
    }
}

/// Runs `ops` on a fresh directory, crashes, reopens and checks; returns how many syncs were device
/// flushes.
fn run(ops: Vec<Op>, crash_seed: u64, mode: Mode) -> Result<u64, TestCaseError> {
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let data = Path::new("/data");
    let config = config_for(mode);
    // One segment file open at a time for both logs: every access may go through a reopen.
    let scope = LogDirScope {
        name: "s".into(),
        owns: Box::new(|_| true),
        max_open_files: 1,
        max_producer_ids: usize::MAX,
        space_floor: None,
    };
    let (dir, _) =
        block_on(LogDir::open_scoped(fs.clone(), clock.clone(), data, Some(scope), |_| config.clone())).expect("open");
    let tps = [TopicPartition::new("t", 0), TopicPartition::new("t", 1)];
    let mut appended: [Vec<Appended>; 2] = [Vec::new(), Vec::new()];
    let mut epochs = [0i32; 2];
    for tp in &tps {
        block_on(dir.get_or_create(tp, config.clone())).expect("create");
    }
    let mut seed = 0;
    let mut sequences = [[0i32; 4]; 2];
    for op in ops {
        clock.advance(3);
        match op {
            Op::Append { partition, records, value_len, epoch_bump, producer } => {
                let p = partition as usize;
                epochs[p] += epoch_bump as i32;
                seed += 1;
                let log = dir.get(&tps[p]).expect("log");
                let mut batch = make_batch(seed, records, value_len, clock.0.get());
                if producer > 0 {
                    // The next sequence the partition expects (a truncation may have taken some back).
                    let next = &mut sequences[p][producer as usize];
                    if let Some(entry) = log.producer_states().get(producer) {
                        *next = entry.batches.back().unwrap().last_seq + 1;
                    }
                    set_producer(&mut batch, producer, 0, *next);
                    *next += records as i32;
                }
                let info = block_on(log.append(&batch, LeaderEpoch(epochs[p]))).expect("append");
                shardlog_storage::batch::stamp(&mut batch, info.base_offset, LeaderEpoch(epochs[p]));
                appended[p].push(Appended { base: info.base_offset.0, last: info.last_offset.0, bytes: batch });
                block_on(log.flush_if_due()).expect("interval flush");
            }
            Op::Flush { partition } => block_on(dir.get(&tps[partition as usize]).unwrap().flush()).expect("flush"),
            Op::FlushBoth => {
                let (a, b) = (dir.get(&tps[0]).unwrap(), dir.get(&tps[1]).unwrap());
                let (a, b) = block_on(futures_lite::future::zip(a.flush(), b.flush()));
                a.and(b).expect("flush both");
            }
            Op::WriteOut { partition } => {
                block_on(dir.get(&tps[partition as usize]).unwrap().write_out()).expect("write")
            }
            Op::ReleaseCache { partition } => {
                block_on(dir.get(&tps[partition as usize]).unwrap().release_cache()).expect("release")
            }
            Op::Roll { partition } => block_on(dir.get(&tps[partition as usize]).unwrap().roll()).expect("roll"),
            Op::Truncate { partition, back } => {
                let p = partition as usize;
                let log = dir.get(&tps[p]).unwrap();
                let to = log.log_end_offset().0.saturating_sub(back).max(log.log_start_offset().0);
                let end = block_on(log.truncate_to(Offset(to))).expect("truncate");
                appended[p].retain(|a| a.last < end.0);
            }
            Op::Retention { keep } => {
                for tp in &tps {
                    let log = dir.get(tp).unwrap();
                    log.set_config(LogConfig { retention_bytes: Some(keep), ..config.clone() }).unwrap();
                    log.set_high_watermark(log.log_end_offset());
                }
                block_on(dir.apply_retention()).expect("retention");
                for tp in &tps {
                    dir.get(tp).unwrap().set_config(config.clone()).unwrap();
                }
            }
            Op::Checkpoint => block_on(dir.checkpoint()).expect("checkpoint"),
            Op::CheckpointIfMoved => {
                block_on(dir.checkpoint_if_moved()).expect("checkpoint");
            }
        }
    }
    let device_flushes: u64 = tps.iter().map(|tp| dir.get(tp).unwrap().stats().device_flushes).sum();
    let before: Vec<(Offset, Offset)> = tps
        .iter()
        .map(|tp| {
            let log = dir.get(tp).unwrap();
            (log.durable_offset(), log.log_start_offset())
        })
        .collect();

    // Power loss.
    let crashed = fs.crash(&mut SimRng::new(crash_seed));
    drop(dir);
    let (dir, reports) = block_on(LogDir::open(crashed, clock.clone(), data, |_| config.clone())).expect("reopen");
    prop_assert_eq!(reports.len(), 2);
    for (p, tp) in tps.iter().enumerate() {
        let log = dir.get(tp).expect("partition survives");
        let (durable, start_before) = before[p];
        let start = log.log_start_offset();
        let end = log.log_end_offset();
        prop_assert!(start <= start_before.max(Offset(0)), "log start moved forward across the crash");
        prop_assert!(
            end >= durable,
            "{}: log end {} below durable offset {} reported before the crash",
            tp,
            end,
            durable
        );
        // (a) and (b): the log from its start is exactly the appended batches, up to its end.
        let read = block_on(log.read(start, usize::MAX)).expect("read all");
        let got = split_batches(&read.bytes);
        let want: Vec<&Appended> = appended[p].iter().filter(|a| a.last >= start.0 && a.base < end.0).collect();
        prop_assert_eq!(got.len(), want.len(), "{}: batch count after recovery", tp);
        for ((base, last, bytes), w) in got.iter().zip(want) {
            prop_assert_eq!((*base, *last), (w.base, w.last));
            prop_assert!(bytes == &w.bytes, "{}: batch at {} changed across the crash", tp, base);
        }
        if let Some((_, last, _)) = got.last() {
            prop_assert_eq!(end, Offset(last + 1));
        }
        // (c) indexes, and the epoch cache against the epochs stamped in the batches.
        prop_assert_eq!(block_on(log.verify_indexes()), Ok(()));
        let mut expected = LeaderEpochCache::default();
        for (base, _, bytes) in &got {
            let h = shardlog_storage::batch::BatchHeader::parse(bytes).unwrap();
            expected.assign(LeaderEpoch(h.partition_leader_epoch), Offset(*base));
        }
        expected.clamp(start, end);
        prop_assert_eq!(log.leader_epochs(), expected, "{}: epoch cache disagrees with the log", tp);
        // (d) the producers' state, against every batch below the log end in append order.
        let mut producers = ProducerStates::default();
        for a in appended[p].iter().filter(|a| a.base < end.0) {
            producers.record(&BatchHeader::parse(&a.bytes).unwrap(), Offset(a.base), 0, true);
        }
        prop_assert_eq!(
            log.producer_states().sequences(),
            producers.sequences(),
            "{}: producer state disagrees with the log",
            tp
        );
        let retry = appended[p].iter().rev().find(|a| {
            let h = BatchHeader::parse(&a.bytes).unwrap();
            a.base < end.0 && h.producer_id > 0
        });
        if let Some(retry) = retry {
            let info = block_on(log.append(&retry.bytes, LeaderEpoch(100))).expect("retry after recovery");
            prop_assert!(info.duplicate, "{}: retry of the batch at {} appended again", tp, retry.base);
            prop_assert_eq!((info.base_offset.0, info.last_offset.0), (retry.base, retry.last));
        }
        // The recovered log keeps working.
        let batch = make_batch(999, 2, 10, clock.0.get());
        let info = block_on(log.append(&batch, LeaderEpoch(100))).expect("append after recovery");
        prop_assert_eq!(info.base_offset, end);
        block_on(log.flush()).expect("flush after recovery");
    }
    Ok(device_flushes)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    #[test]
    fn acknowledged_appends_survive_power_loss_with_flush_always(
        ops in prop::collection::vec(op(), 1..80),
        crash_seed in any::<u64>(),
    ) {
        run(ops, crash_seed, Mode::Always)?;
    }

    #[test]
    fn acknowledged_appends_survive_power_loss_with_most_syncs_device_flushes(
        ops in prop::collection::vec(op(), 1..80),
        crash_seed in any::<u64>(),
    ) {
        run(ops, crash_seed, Mode::AlwaysZeros)?;
    }

    #[test]
    fn synced_appends_survive_power_loss_with_interval_flush(
        ops in prop::collection::vec(op(), 1..80),
        crash_seed in any::<u64>(),
    ) {
        run(ops, crash_seed, Mode::Interval)?;
    }
}

/// The same check after a clean close followed by a crash of the reopened directory: the clean-shutdown
/// marker must not outlive the open that consumed it.
#[test]
fn crash_after_clean_reopen_still_recovers() {
    for seed in 0..50u64 {
        let fs = SimFs::new();
        let clock: Rc<ManualClock> = ManualClock::new(1_700_000_000_000);
        let data = Path::new("/data");
        let tp = TopicPartition::new("t", 0);
        let (dir, _) = block_on(LogDir::open(fs.clone(), clock.clone(), data, |_| small_config())).unwrap();
        let log = block_on(dir.get_or_create(&tp, small_config())).unwrap();
        for i in 0..20 {
            block_on(log.append(&make_batch(i, 3, 200, 1), LeaderEpoch(0))).unwrap();
        }
        block_on(dir.close()).unwrap();
        drop((log, dir));
        let (dir, _) = block_on(LogDir::open(fs.clone(), clock.clone(), data, |_| small_config())).unwrap();
        let log = dir.get(&tp).unwrap();
        for i in 0..10 {
            block_on(log.append(&make_batch(100 + i, 1, 300, 2), LeaderEpoch(1))).unwrap();
        }
        let durable = log.durable_offset();
        let crashed = fs.crash(&mut SimRng::new(seed));
        assert!(
            !crashed.exists(&data.join(shardlog_storage::log_dir::CLEAN_SHUTDOWN_FILE)),
            "seed {seed}: the clean-shutdown marker outlived the open that consumed it"
        );
        let (dir, reports) = block_on(LogDir::open(crashed, clock.clone(), data, |_| small_config())).unwrap();
        let log = dir.get(&tp).unwrap();
        assert!(log.log_end_offset() >= durable, "seed {seed}: lost data below the durable offset");
        assert!(log.log_end_offset() >= Offset(60), "seed {seed}: lost data closed cleanly");
        // Not opened as after a clean close: what follows the last index entry is validated again.
        // (A crash right after a roll may leave a last segment of preallocated zeros only: scanned
        // whole, holding no batch.)
        let report = &reports[0].1;
        assert!(
            report.scanned_bytes > 0 || report.scanned_segments > 0,
            "seed {seed}: recovery after a crash must validate: {report:?}"
        );
        assert_eq!(block_on(log.verify_indexes()), Ok(()));
    }
}

/// Checkpoints written whenever offsets moved keep the recovery point at the durable offset and the active
/// segment's index files on disk: a crash then validates only what follows the last durable index entry,
/// and a pass with nothing moved writes nothing.
#[test]
fn checkpoints_of_moved_offsets_leave_nothing_to_scan_after_a_crash() {
    let fs = SimFs::new();
    let clock: Rc<ManualClock> = ManualClock::new(1_700_000_000_000);
    let data = Path::new("/data");
    let tp = TopicPartition::new("t", 0);
    let (dir, _) = block_on(LogDir::open(fs.clone(), clock.clone(), data, |_| small_config())).unwrap();
    let log = block_on(dir.get_or_create(&tp, small_config())).unwrap();
    assert_eq!(block_on(dir.checkpoint_if_moved()).unwrap(), 3, "the first pass writes every file");
    assert_eq!(block_on(dir.checkpoint_if_moved()).unwrap(), 0, "nothing moved, nothing written");
    for i in 0..30 {
        block_on(log.append(&make_batch(i, 2, 250, 1), LeaderEpoch(0))).unwrap();
    }
    block_on(log.flush()).unwrap();
    assert!(block_on(dir.checkpoint_if_moved()).unwrap() >= 1, "the recovery point moved");
    assert_eq!(block_on(dir.checkpoint_if_moved()).unwrap(), 0);
    let end = log.log_end_offset();
    let crashed = fs.crash(&mut SimRng::new(7));
    let (dir, reports) = block_on(LogDir::open(crashed, clock.clone(), data, |_| small_config())).unwrap();
    assert_eq!(dir.get(&tp).unwrap().log_end_offset(), end);
    let (_, report) = &reports[0];
    // Only the batches after the active segment's last index entry are validated: at most an index
    // interval and a batch, where a full scan would read the whole segment.
    assert_eq!(report.scanned_segments, 0, "{report:?}");
    assert!(report.scanned_bytes <= small_config().index_interval_bytes + 600, "{report:?}");
}

/// Runs `cases` generated op sequences under `mode` and returns the failures (and the device flushes
/// used in all).
fn failures_of(mode: Mode, cases: u32) -> (Vec<String>, u64) {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let ops = prop::collection::vec(op(), 20..80);
    let mut failures = Vec::new();
    let mut flushes = 0;
    for case in 0..cases {
        let ops = ops.new_tree(&mut runner).expect("ops").current();
        match run(ops, case as u64, mode) {
            Ok(n) => flushes += n,
            Err(e) => failures.push(e.to_string()),
        }
    }
    (failures, flushes)
}

/// The sound rule, on the same cases the broken rules below fail: nothing acknowledged lost, and
/// device flushes did the syncing.
#[test]
fn the_cases_the_broken_rules_fail_pass_with_the_rule() {
    let (failures, flushes) = failures_of(Mode::AlwaysZeros, 40);
    assert_eq!(failures, Vec::<String>::new());
    assert!(flushes > 100, "only {flushes} syncs were device flushes");
}

/// The failures of `failures_of(mode, 40)` with the logs following the broken `rule` (the sound rule
/// again afterwards, also if it panics).
fn failures_under(rule: BrokenRule, mode: Mode) -> Vec<String> {
    struct Restore;
    impl Drop for Restore {
        fn drop(&mut self) {
            break_rule_for_tests(BrokenRule::None);
        }
    }
    let _restore = Restore;
    break_rule_for_tests(rule);
    let (failures, _) = failures_of(mode, 40);
    eprintln!("{} of 40 cases failed; the first: {:?}", failures.len(), failures.first());
    failures
}

/// A device flush submitted before the write-out it is to cover loses acknowledged appends.
#[test]
fn a_device_flush_before_the_write_completes_is_caught() {
    let failures = failures_under(BrokenRule::FlushBeforeWrite, Mode::AlwaysZeros);
    assert!(!failures.is_empty(), "no case lost an acknowledged append");
    assert!(failures.iter().any(|f| f.contains("below durable offset") || f.contains("batch")), "{failures:?}");
}

/// A device flush taken to cover a write into blocks reserved but never written (their written state
/// and the size not committed) loses acknowledged appends.
#[test]
fn a_device_flush_covering_a_write_into_unwritten_blocks_is_caught() {
    let failures = failures_under(BrokenRule::CoverUnwrittenBlocks, Mode::Always);
    assert!(!failures.is_empty(), "no case lost an acknowledged append");
}
