//! Idempotent producers' state across restarts: snapshots at roll and close spare the replay of the log,
//! an unreadable snapshot costs only a longer replay, truncation takes batches back out of the state, and
//! idle producers expire. (Power loss at random points is in `crash.rs`.)

mod common;

use std::path::Path;
use std::rc::Rc;

use futures_lite::future::block_on;
use shardlog_storage::fs::sim::{SimFs, SimRng};
use shardlog_storage::log::{list_snapshots, snapshot_path};
use shardlog_storage::producer_state::ProducerError;
use shardlog_storage::{LeaderEpoch, LogConfig, LogDir, OpenReport, PartitionLog, StorageError, TopicPartition};

use common::{ManualClock, make_batch, set_producer, small_config};

const DATA: &str = "/data";
const PART: &str = "/data/t-0";

fn tp() -> TopicPartition {
    TopicPartition::new("t", 0)
}

fn open(fs: &SimFs, clock: &Rc<ManualClock>, config: &LogConfig) -> (LogDir<SimFs>, OpenReport) {
    let (dir, reports) =
        block_on(LogDir::open(fs.clone(), clock.clone(), Path::new(DATA), |_| config.clone())).unwrap();
    let report = reports.into_iter().find(|(t, _)| *t == tp()).map(|(_, r)| r).unwrap_or_default();
    (dir, report)
}

/// Producer `id`'s batch of `count` records at sequence `seq`, stamped with the clock's time.
fn batch(id: i64, epoch: i16, seq: i32, count: usize, clock: &ManualClock) -> Vec<u8> {
    let mut b = make_batch(id as u64 * 1000 + seq as u64, count, 200, clock.0.get());
    set_producer(&mut b, id, epoch, seq);
    b
}

/// Three producers, each writing batches of 3 records in turn, rounds `rounds`: several segments.
fn write_rounds(log: &PartitionLog<SimFs>, clock: &ManualClock, rounds: std::ops::Range<i32>) {
    for round in rounds {
        for id in 1..=3 {
            let info = block_on(log.append(&batch(id, 0, round * 3, 3, clock), LeaderEpoch(0))).unwrap();
            assert!(!info.duplicate);
        }
    }
    block_on(log.flush()).unwrap();
}

type Started = (SimFs, Rc<ManualClock>, LogConfig, LogDir<SimFs>, Rc<PartitionLog<SimFs>>);

/// A new partition with twenty rounds of three producers written, over several segments.
fn twenty_rounds() -> Started {
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let config = small_config();
    let (dir, _) = open(&fs, &clock, &config);
    let log = block_on(dir.get_or_create(&tp(), config.clone())).unwrap();
    write_rounds(&log, &clock, 0..20);
    (fs, clock, config, dir, log)
}

#[test]
fn clean_restart_reads_the_snapshot_taken_at_close_and_no_batch() {
    let (fs, clock, config, dir, log) = twenty_rounds();
    assert!(log.segment_count() > 2, "the test needs rolls");
    let before = log.producer_states();
    let end = log.log_end_offset();
    block_on(dir.close()).unwrap();
    drop((log, dir));

    let (dir, report) = open(&fs, &clock, &config);
    assert_eq!(report.producer_snapshot, Some(end));
    assert_eq!(report.producer_replayed_bytes, 0);
    let log = dir.get(&tp()).unwrap();
    assert_eq!(log.producer_states(), before);
    // Kept: the newest snapshot and those at segment bases; nothing else.
    let bases = log.segment_bases();
    for at in list_snapshots(&fs, Path::new(PART)).unwrap() {
        assert!(at == end || bases.contains(&at), "stale snapshot at {at}");
    }
}

#[test]
fn restart_after_a_crash_replays_only_the_batches_after_the_last_roll() {
    let (fs, clock, config, dir, log) = twenty_rounds();
    block_on(log.roll()).unwrap();
    let last_base = *log.segment_bases().last().unwrap();
    let sealed_bytes = log.size_bytes();
    // One more round in the new active segment, then power loss.
    write_rounds(&log, &clock, 20..21);
    let active_bytes = log.size_bytes() - sealed_bytes;
    let before = log.producer_states();
    let crashed = fs.crash(&mut SimRng::new(7));
    drop((log, dir));

    let (dir, report) = open(&crashed, &clock, &config);
    let log = dir.get(&tp()).unwrap();
    assert_eq!(report.producer_snapshot, Some(last_base), "recovery starts from the snapshot of the last roll");
    assert_eq!(report.producer_replayed_bytes, active_bytes, "only the active segment is read");
    assert_eq!(log.producer_states().sequences(), before.sequences());
}

#[test]
fn an_unreadable_snapshot_is_set_aside_and_the_state_rebuilt_from_the_log() {
    let (fs, clock, config, dir, log) = twenty_rounds();
    let before = log.producer_states();
    let end = log.log_end_offset();
    block_on(dir.close()).unwrap();
    drop((log, dir));
    let newest = snapshot_path(Path::new(PART), end);
    let mut bytes = fs.contents(&newest).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    fs.set_contents(&newest, bytes);

    let (dir, report) = open(&fs, &clock, &config);
    assert!(report.producer_snapshot.is_some_and(|at| at < end), "an older snapshot is used");
    assert!(report.producer_replayed_bytes > 0);
    assert_eq!(dir.get(&tp()).unwrap().producer_states().sequences(), before.sequences());
    assert!(fs.contents(Path::new(&format!("{}.bad", newest.display()))).is_some(), "kept for a look");
}

#[test]
fn truncation_takes_the_cut_batches_out_of_the_producer_state() {
    let (fs, clock, _config, _dir, log) = twenty_rounds();
    let kept_end = log.log_end_offset();
    let state_at_cut = log.producer_states();
    block_on(log.roll()).unwrap();
    // Producer 1 goes on past a roll (a snapshot above the cut); then the log is cut back.
    let extra = batch(1, 0, 60, 3, &clock);
    let first = block_on(log.append(&extra, LeaderEpoch(0))).unwrap();
    block_on(log.roll()).unwrap();
    block_on(log.append(&batch(1, 0, 63, 3, &clock), LeaderEpoch(0))).unwrap();
    block_on(log.flush()).unwrap();
    assert_eq!(block_on(log.truncate_to(kept_end)).unwrap(), kept_end);
    assert_eq!(log.producer_states().sequences(), state_at_cut.sequences());
    assert!(list_snapshots(&fs, Path::new(PART)).unwrap().iter().all(|at| *at <= kept_end));
    // The cut batch is new again, not a duplicate; the one after it is a gap.
    let gap = block_on(log.append(&batch(1, 0, 63, 3, &clock), LeaderEpoch(0)));
    assert!(matches!(gap, Err(StorageError::Producer(ProducerError::OutOfOrderSequence { .. }))), "{gap:?}");
    let again = block_on(log.append(&extra, LeaderEpoch(0))).unwrap();
    assert!(!again.duplicate);
    assert_eq!(again.base_offset, kept_end);
    assert_eq!(first.base_offset, kept_end);
}

#[test]
fn a_producer_idle_for_the_expiration_time_is_forgotten() {
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let config = LogConfig { producer_id_expiration_ms: 60_000, ..small_config() };
    let (dir, _) = open(&fs, &clock, &config);
    let log = block_on(dir.get_or_create(&tp(), config.clone())).unwrap();
    block_on(log.append(&batch(5, 0, 0, 1, &clock), LeaderEpoch(0))).unwrap();
    clock.advance(59_999);
    assert_eq!(log.expire_producers(), 0);
    let gap = block_on(log.append(&batch(5, 0, 9, 1, &clock), LeaderEpoch(0)));
    assert!(matches!(gap, Err(StorageError::Producer(ProducerError::OutOfOrderSequence { .. }))));
    clock.advance(1);
    assert_eq!(log.expire_producers(), 1);
    // Unknown again: any sequence is taken.
    assert!(!block_on(log.append(&batch(5, 0, 9, 1, &clock), LeaderEpoch(0))).unwrap().duplicate);
}

#[test]
fn a_log_without_idempotent_producers_reads_nothing_at_a_clean_restart_and_its_active_segment_after_a_crash() {
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let config = small_config();
    let (dir, _) = open(&fs, &clock, &config);
    let log = block_on(dir.get_or_create(&tp(), config.clone())).unwrap();
    for i in 0..60 {
        block_on(log.append(&make_batch(i, 3, 200, clock.0.get()), LeaderEpoch(0))).unwrap();
    }
    block_on(log.flush()).unwrap();
    assert!(log.segment_count() > 2);
    let end = log.log_end_offset();
    block_on(dir.close()).unwrap();
    drop((log, dir));
    assert!(!list_snapshots(&fs, Path::new(PART)).unwrap().contains(&end), "close writes no empty snapshot");

    let (dir, report) = open(&fs, &clock, &config);
    assert_eq!((report.producer_snapshot, report.producer_replayed_bytes), (None, 0));
    let log = dir.get(&tp()).unwrap();
    assert!(log.producer_states().is_empty());
    // A crash: the newest roll's (empty) snapshot bounds the replay to the active segment.
    for i in 60..70 {
        block_on(log.append(&make_batch(i, 3, 200, clock.0.get()), LeaderEpoch(0))).unwrap();
    }
    block_on(log.flush()).unwrap();
    let active = *log.segment_bases().last().unwrap();
    let crashed = fs.crash(&mut SimRng::new(3));
    drop((log, dir));
    let (dir, report) = open(&crashed, &clock, &config);
    assert_eq!(report.producer_snapshot, Some(active));
    assert!(dir.get(&tp()).unwrap().producer_states().is_empty());
    assert!(report.producer_replayed_bytes <= 6 * 1024, "more than the active segment was read");
}

#[test]
fn past_the_owners_producer_budget_a_new_producer_is_stored_but_not_remembered() {
    use shardlog_storage::LogDirScope;
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let config = small_config();
    let scope = LogDirScope {
        name: "s".into(),
        owns: Box::new(|_| true),
        max_open_files: 8,
        max_producer_ids: 2,
        space_floor: None,
    };
    let (dir, _) =
        block_on(LogDir::open_scoped(fs.clone(), clock.clone(), Path::new(DATA), Some(scope), |_| config.clone()))
            .unwrap();
    let one = block_on(dir.get_or_create(&TopicPartition::new("a", 0), config.clone())).unwrap();
    let two = block_on(dir.get_or_create(&TopicPartition::new("b", 0), config.clone())).unwrap();
    block_on(one.append(&batch(1, 0, 0, 1, &clock), LeaderEpoch(0))).unwrap();
    block_on(two.append(&batch(2, 0, 0, 1, &clock), LeaderEpoch(0))).unwrap();
    // The budget (2, for both logs together) is used up: producer 3 is stored twice, as without idempotence.
    let third = batch(3, 0, 0, 1, &clock);
    assert!(!block_on(one.append(&third, LeaderEpoch(0))).unwrap().duplicate);
    assert!(!block_on(one.append(&third, LeaderEpoch(0))).unwrap().duplicate);
    assert!(one.producer_states().get(3).is_none());
    // Known producers go on being deduplicated.
    let again = batch(2, 0, 1, 1, &clock);
    block_on(two.append(&again, LeaderEpoch(0))).unwrap();
    assert!(block_on(two.append(&again, LeaderEpoch(0))).unwrap().duplicate);
    // Deleting a log gives its producers' room back.
    block_on(dir.delete(&TopicPartition::new("b", 0))).unwrap();
    drop(two);
    let fourth = batch(4, 0, 0, 1, &clock);
    block_on(one.append(&fourth, LeaderEpoch(0))).unwrap();
    assert!(block_on(one.append(&fourth, LeaderEpoch(0))).unwrap().duplicate);
}

#[test]
fn producers_expired_since_the_last_roll_do_not_come_back_after_a_clean_restart() {
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let short = LogConfig { producer_id_expiration_ms: 1_000, ..small_config() };
    let (dir, _) = open(&fs, &clock, &short);
    let log = block_on(dir.get_or_create(&tp(), short.clone())).unwrap();
    block_on(log.append(&batch(1, 0, 0, 1, &clock), LeaderEpoch(0))).unwrap();
    block_on(log.roll()).unwrap();
    let end = log.log_end_offset();
    assert!(list_snapshots(&fs, Path::new(PART)).unwrap().contains(&end), "the roll's snapshot is at the log end");
    clock.advance(1_000);
    assert_eq!(log.expire_producers(), 1);
    block_on(dir.close()).unwrap();
    drop((log, dir));
    // Reopened with a longer expiration: the roll's snapshot must not bring producer 1 back.
    let (dir, report) = open(&fs, &clock, &small_config());
    assert_eq!(report.producer_snapshot, Some(end));
    assert!(dir.get(&tp()).unwrap().producer_states().is_empty());
}
