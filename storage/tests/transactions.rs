//! The partition side of transactions: transactional batches open a transaction, markers end it, the last
//! stable offset waits for both and for the high watermark to pass the marker, ABORT markers fill the
//! segments' `.txnindex` files and read_committed reads return them; and all of it is rebuilt the same
//! after a crash, a truncation, from a snapshot or from the whole log, and on a follower.

mod common;

use std::path::Path;
use std::rc::Rc;

use futures_lite::future::block_on;
use proptest::prelude::*;
use shardlog_storage::fs::Fs;
use shardlog_storage::fs::sim::{SimFs, SimRng};
use shardlog_storage::log::{Isolation, list_snapshots};
use shardlog_storage::producer_state::ProducerError;
use shardlog_storage::segment::{TXN_INDEX_SUFFIX, file_name};
use shardlog_storage::txn::index::decode as decode_txn_index;
use shardlog_storage::txn::{AbortedRange, MarkerKind, TxnMarker};
use shardlog_storage::{LeaderEpoch, LogConfig, LogDir, Offset, PartitionLog, StorageError, TopicPartition};

use common::{ManualClock, make_batch, set_producer, small_config};

const DATA: &str = "/data";
const PART: &str = "/data/t-0";
const E0: LeaderEpoch = LeaderEpoch(0);
const E1: LeaderEpoch = LeaderEpoch(1);

fn tp() -> TopicPartition {
    TopicPartition::new("t", 0)
}

fn open(fs: &SimFs, clock: &Rc<ManualClock>, config: &LogConfig) -> (LogDir<SimFs>, Rc<PartitionLog<SimFs>>) {
    let (dir, _) = block_on(LogDir::open(fs.clone(), clock.clone(), Path::new(DATA), |_| config.clone())).unwrap();
    let log = block_on(dir.get_or_create(&tp(), config.clone())).unwrap();
    (dir, log)
}

/// Producer `id`'s batch of `count` records at `seq`; transactional if `txn`.
fn batch(id: i64, epoch: i16, seq: i32, count: usize, txn: bool) -> Vec<u8> {
    let mut b = make_batch(id as u64 * 1000 + seq as u64, count, 300, 1_700_000_000_000);
    if txn {
        b[21..23].copy_from_slice(&0x10i16.to_be_bytes());
    }
    set_producer(&mut b, id, epoch, seq);
    b
}

fn marker(kind: MarkerKind, id: i64, epoch: i16, coordinator_epoch: i32) -> TxnMarker {
    TxnMarker { kind, producer_id: id, producer_epoch: epoch, coordinator_epoch }
}

/// Appends as the leader at epoch 0 and returns the base offset.
fn append(log: &PartitionLog<SimFs>, bytes: &[u8]) -> u64 {
    block_on(log.append(bytes, E0)).unwrap().base_offset.0
}

fn end_txn(log: &PartitionLog<SimFs>, kind: MarkerKind, id: i64) -> u64 {
    block_on(log.append_marker(marker(kind, id, 0, 0), E0)).unwrap().base_offset.0
}

fn to_end(log: &PartitionLog<SimFs>) {
    log.set_high_watermark(log.log_end_offset());
}

fn range(producer_id: i64, first: u64) -> AbortedRange {
    AbortedRange { producer_id, first_offset: Offset(first) }
}

#[test]
fn lso_waits_for_open_transactions_and_for_the_hw_to_pass_their_markers() {
    let fs = SimFs::new();
    let (_dir, log) = open(&fs, &ManualClock::new(0), &LogConfig::default());
    append(&log, &batch(9, 0, 0, 2, false));
    let t1 = append(&log, &batch(1, 0, 0, 2, true));
    let t2 = append(&log, &batch(2, 0, 0, 1, true));
    append(&log, &batch(1, 0, 2, 1, true));
    to_end(&log);
    assert_eq!(log.last_stable_offset(), Offset(t1));
    assert_eq!(log.first_unstable_offset(), Some(Offset(t1)));
    assert_eq!(log.latest_offset(Isolation::ReadCommitted), Offset(t1));
    assert_eq!(log.latest_offset(Isolation::ReadUncommitted), log.high_watermark());
    let commit = end_txn(&log, MarkerKind::Commit, 1);
    assert_eq!(log.last_stable_offset(), Offset(t1), "the marker is not below the high watermark yet");
    log.set_high_watermark(Offset(commit));
    assert_eq!(log.last_stable_offset(), Offset(t1), "the high watermark is at the marker, not past it");
    log.set_high_watermark(Offset(commit + 1));
    assert_eq!(log.last_stable_offset(), Offset(t2), "producer 2's transaction is still open");
    end_txn(&log, MarkerKind::Abort, 2);
    assert_eq!(log.last_stable_offset(), Offset(t2));
    let news = log.news().version();
    to_end(&log);
    assert!(log.news().version() > news, "a held read_committed fetch hears of the move");
    assert_eq!(log.last_stable_offset(), log.log_end_offset());
    assert_eq!(log.first_unstable_offset(), None);
}

#[test]
fn refused_batches_and_markers_leave_the_log_unchanged() {
    let fs = SimFs::new();
    let (_dir, log) = open(&fs, &ManualClock::new(0), &LogConfig::default());
    append(&log, &batch(1, 3, 0, 1, true));
    block_on(log.append_marker(marker(MarkerKind::Commit, 1, 3, 5), E0)).unwrap();
    append(&log, &batch(1, 3, 1, 1, true));
    let end = log.log_end_offset();
    let refused = |r: Result<_, StorageError>| match r {
        Err(StorageError::Producer(e)) => e,
        other => panic!("expected a producer refusal, got {other:?}"),
    };
    assert!(matches!(
        refused(block_on(log.append(&batch(1, 3, 2, 1, false), E0))),
        ProducerError::NotTransactional { producer_id: 1, .. }
    ));
    assert!(matches!(
        refused(block_on(log.append(&batch(1, 2, 2, 1, true), E0))),
        ProducerError::StaleEpoch { epoch: 2, current: 3, .. }
    ));
    assert!(matches!(
        refused(block_on(log.append_marker(marker(MarkerKind::Abort, 1, 2, 5), E0))),
        ProducerError::StaleMarkerEpoch { epoch: 2, current: 3, .. }
    ));
    assert!(matches!(
        refused(block_on(log.append_marker(marker(MarkerKind::Abort, 1, 3, 4), E0))),
        ProducerError::CoordinatorFenced { coordinator_epoch: 4, current: 5, .. }
    ));
    let client_marker = marker(MarkerKind::Commit, 1, 3, 5).encode(0);
    assert!(matches!(refused(block_on(log.append(&client_marker, E0))), ProducerError::InvalidBatch(_)));
    assert_eq!(log.log_end_offset(), end);
    assert_eq!(log.producer_states().get(1).unwrap().txn_first_offset, Some(Offset(2)));
    // A marker for a producer the partition does not know is written and opens nothing.
    let info = block_on(log.append_marker(marker(MarkerKind::Abort, 77, 0, 0), E0)).unwrap();
    assert_eq!(info.base_offset, end);
    assert!(log.aborted_index().is_empty());
    assert_eq!(log.producer_states().transactions().get(&77), Some(&(None, 0)));
}

#[test]
fn a_marker_repeated_after_its_transaction_ended_ends_nothing() {
    let fs = SimFs::new();
    let (_dir, log) = open(&fs, &ManualClock::new(0), &LogConfig::default());
    let first = append(&log, &batch(1, 2, 0, 2, true));
    let commit = marker(MarkerKind::Commit, 1, 2, 7);
    block_on(log.append_marker(commit, E0)).unwrap();
    let open_after = append(&log, &batch(3, 0, 0, 1, true));
    to_end(&log);
    assert_eq!(log.last_stable_offset(), Offset(open_after), "producer 3's transaction holds it");
    let producer_before = log.producer_states().get(1).cloned();

    // The coordinator's retry of the COMMIT, then an ABORT for the same epoch: both appended (as Kafka
    // appends them), neither ends or aborts anything.
    let end = log.log_end_offset();
    let again = block_on(log.append_marker(commit, E0)).unwrap().base_offset;
    let abort = block_on(log.append_marker(marker(MarkerKind::Abort, 1, 2, 7), E0)).unwrap().base_offset;
    assert_eq!((again, abort), (end, end.plus(1)));
    to_end(&log);
    assert_eq!(log.last_stable_offset(), Offset(open_after), "still producer 3's open transaction, nothing else");
    assert_eq!(log.first_unstable_offset(), Some(Offset(open_after)));
    assert!(log.aborted_index().is_empty(), "the committed transaction was not aborted after the fact");
    assert_eq!(log.producer_states().get(1).cloned(), producer_before, "the clock stood still: all alike");
    let read = block_on(log.read_committed(Offset(first), 1 << 20)).unwrap();
    assert!(read.aborted.is_empty());
    end_txn(&log, MarkerKind::Commit, 3);
    to_end(&log);
    assert_eq!(log.last_stable_offset(), log.log_end_offset());
}

/// The producer-state refusal of `appended`, which must be one.
fn refusal(appended: Result<shardlog_storage::AppendInfo, StorageError>) -> ProducerError {
    match appended {
        Err(StorageError::Producer(e)) => e,
        other => panic!("expected a producer refusal, got {other:?}"),
    }
}

/// KIP-890's race, in the order that hangs a transaction without the guard: the leader begins the
/// verification of producer 1's first batch, the coordinator says yes, the transaction ends (its ABORT
/// marker lands here first), and only then does the batch come to be appended.
#[test]
fn a_batch_verified_before_its_transactions_marker_is_refused_after_it_and_opens_nothing() {
    let fs = SimFs::new();
    let (_dir, log) = open(&fs, &ManualClock::new(0), &LogConfig::default());
    let guard = log.begin_verification(1, 0).expect("no transaction open: verification needs a guard");
    end_txn(&log, MarkerKind::Abort, 1);
    to_end(&log);
    let end = log.log_end_offset();
    let late = block_on(log.append_guarded(&batch(1, 0, 0, 2, true), E0, Some(guard)));
    assert_eq!(refusal(late), ProducerError::Unverified { producer_id: 1, epoch: 0 });
    assert_eq!(log.log_end_offset(), end, "nothing written");
    assert_eq!(log.first_unstable_offset(), None, "no transaction opened");
    assert_eq!(log.last_stable_offset(), end);
    // The retry is verified afresh (for the producer's next transaction) and appended with the new guard;
    // the stale one still does not pass.
    let fresh = log.begin_verification(1, 0).unwrap();
    assert_ne!(fresh, guard);
    let stale = block_on(log.append_guarded(&batch(1, 0, 0, 2, true), E0, Some(guard)));
    assert!(matches!(refusal(stale), ProducerError::Unverified { .. }));
    let first = block_on(log.append_guarded(&batch(1, 0, 0, 2, true), E0, Some(fresh))).unwrap();
    assert_eq!(first.base_offset, end);
    assert_eq!(log.first_unstable_offset(), Some(end), "its transaction is open");
    assert_eq!(log.producer_states().verification_guard(1), None, "the first batch spent the guard");
}

/// The batches after a transaction's first one in a partition need no verification, and no guard: but
/// one told its transaction was open, that finds it ended when it is appended, opens nothing either.
#[test]
fn a_transactions_later_batches_need_no_guard_unless_it_ended_before_they_are_appended() {
    let fs = SimFs::new();
    let (_dir, log) = open(&fs, &ManualClock::new(0), &LogConfig::default());
    // Not verified at all: refused, even the first batch of a producer the partition never saw.
    let unverified = block_on(log.append_guarded(&batch(1, 0, 0, 1, true), E0, None));
    assert_eq!(refusal(unverified), ProducerError::Unverified { producer_id: 1, epoch: 0 });
    let guard = log.begin_verification(1, 0).unwrap();
    block_on(log.append_guarded(&batch(1, 0, 0, 1, true), E0, Some(guard))).unwrap();
    assert_eq!(log.begin_verification(1, 0), None, "its transaction is open here: nothing to ask");
    block_on(log.append_guarded(&batch(1, 0, 1, 1, true), E0, None)).unwrap();
    // Another batch was told the same; the transaction ends before it is appended.
    assert_eq!(log.begin_verification(1, 0), None);
    end_txn(&log, MarkerKind::Commit, 1);
    let end = log.log_end_offset();
    let after = block_on(log.append_guarded(&batch(1, 0, 2, 1, true), E0, None));
    assert!(matches!(refusal(after), ProducerError::Unverified { .. }));
    assert_eq!(log.log_end_offset(), end);
    to_end(&log);
    assert_eq!(log.last_stable_offset(), end, "nothing holds the LSO");
    // Batches that are not transactional, and retries of batches already in the log, need no guard.
    block_on(log.append_guarded(&batch(2, 0, 0, 1, false), E0, None)).unwrap();
    let retry = block_on(log.append_guarded(&batch(1, 0, 1, 1, true), E0, None)).unwrap();
    assert!(retry.duplicate);
}

/// A guard is the leader's memory only: dropped with leadership, and gone when the producer state is
/// rebuilt (a truncation), the appends it was for are refused (and retried), never let through.
#[test]
fn guards_dropped_with_leadership_or_a_rebuilt_state_let_no_batch_through() {
    let fs = SimFs::new();
    let (_dir, log) = open(&fs, &ManualClock::new(0), &LogConfig::default());
    append(&log, &batch(9, 0, 0, 1, false));
    append(&log, &batch(9, 0, 1, 1, false));
    let guard = log.begin_verification(1, 0).unwrap();
    log.drop_verification_guards();
    assert!(matches!(
        refusal(block_on(log.append_guarded(&batch(1, 0, 0, 1, true), E0, Some(guard)))),
        ProducerError::Unverified { .. }
    ));
    let guard = log.begin_verification(1, 0).unwrap();
    block_on(log.truncate_to(Offset(1))).unwrap();
    assert!(matches!(
        refusal(block_on(log.append_guarded(&batch(1, 0, 0, 1, true), E0, Some(guard)))),
        ProducerError::Unverified { .. }
    ));
    assert_eq!(log.log_end_offset(), Offset(1));
    // A follower's copy of a marker takes a guard away as the leader's own append does.
    let guard = log.begin_verification(1, 0).unwrap();
    let other_fs = SimFs::new();
    let (_other_dir, other) = open(&other_fs, &ManualClock::new(0), &LogConfig::default());
    append(&other, &batch(9, 0, 0, 1, false));
    end_txn(&other, MarkerKind::Abort, 1);
    let marker_batch = block_on(other.read(Offset(1), usize::MAX)).unwrap().bytes;
    block_on(log.append_replicated(&marker_batch)).unwrap();
    assert_eq!(log.producer_states().verification_guard(1), None);
    assert!(matches!(
        refusal(block_on(log.append_guarded(&batch(1, 0, 0, 1, true), E1, Some(guard)))),
        ProducerError::Unverified { .. }
    ));
}

/// Three producers running transactions over several segments: producer `round % 3` aborts, the others
/// commit. Returns the aborted transactions as (producer, first offset, marker offset).
fn transactions_over_segments(log: &PartitionLog<SimFs>, rounds: i32) -> Vec<(i64, u64, u64)> {
    let mut aborted = Vec::new();
    for round in 0..rounds {
        let mut firsts = [0u64; 3];
        for (i, id) in (1..=3i64).enumerate() {
            firsts[i] = append(log, &batch(id, 0, round * 2, 1, true));
            append(log, &batch(100 + id, 0, round, 1, false));
        }
        for (i, id) in (1..=3i64).enumerate() {
            append(log, &batch(id, 0, round * 2 + 1, 1, true));
            let kind = if (round as i64 % 3) + 1 == id { MarkerKind::Abort } else { MarkerKind::Commit };
            let at = end_txn(log, kind, id);
            if kind == MarkerKind::Abort {
                aborted.push((id, firsts[i], at));
            }
        }
    }
    aborted
}

#[test]
fn aborted_transactions_are_indexed_per_segment_and_read_committed_returns_those_it_overlaps() {
    let fs = SimFs::new();
    let config = small_config();
    let (dir, log) = open(&fs, &ManualClock::new(0), &config);
    let aborted = transactions_over_segments(&log, 8);
    assert!(log.segment_count() > 3, "the test needs rolls");
    to_end(&log);
    let index: Vec<(i64, u64, u64)> =
        log.aborted_index().iter().map(|e| (e.producer_id, e.first_offset.0, e.last_offset.0)).collect();
    assert_eq!(index, aborted);
    // Each sealed segment's file holds the aborts whose marker it holds.
    let bases = log.segment_bases();
    for pair in bases.windows(2) {
        let path = Path::new(PART).join(file_name(pair[0], TXN_INDEX_SUFFIX));
        let on_disk = fs.contents(&path).map(|b| decode_txn_index(&b, pair[0], pair[1]).unwrap()).unwrap_or_default();
        let want: Vec<_> = aborted.iter().filter(|a| a.2 >= pair[0].0 && a.2 < pair[1].0).collect();
        assert_eq!(on_disk.len(), want.len(), "segment {}", pair[0]);
    }
    // Whole log: every aborted transaction. From the middle with a small budget: those overlapping only.
    let all = block_on(log.read_committed(Offset(0), usize::MAX)).unwrap();
    assert_eq!(all.read.next_offset, log.log_end_offset());
    let want: Vec<AbortedRange> = aborted.iter().map(|a| range(a.0, a.1)).collect();
    assert_eq!(all.aborted, want);
    let from = Offset(aborted[3].1 + 1);
    let part = block_on(log.read_committed(from, 2_000)).unwrap();
    let upto = part.read.next_offset.0;
    let want: Vec<AbortedRange> =
        aborted.iter().filter(|a| a.2 >= from.0 && a.1 < upto).map(|a| range(a.0, a.1)).collect();
    assert!(!want.is_empty());
    assert_eq!(part.aborted, want);
    // A read stops at the last stable offset.
    let open_first = append(&log, &batch(1, 0, 16, 1, true));
    append(&log, &batch(104, 0, 0, 1, false));
    to_end(&log);
    let tail = block_on(log.read_committed(Offset(open_first), usize::MAX)).unwrap();
    assert!(tail.read.bytes.is_empty(), "nothing is stable from the open transaction on");
    drop(dir);
}

/// The transaction state a log shows, for comparing two ways of getting to it.
fn txn_state(log: &PartitionLog<SimFs>) -> (impl PartialEq + std::fmt::Debug + use<>, Offset) {
    let aborted = log.aborted_index();
    ((log.producer_states().transactions(), aborted, log.producer_states().sequences()), log.last_stable_offset())
}

#[test]
fn recovery_from_a_snapshot_and_the_tail_rebuilds_what_replaying_the_whole_log_does() {
    let fs = SimFs::new();
    let clock = ManualClock::new(0);
    let config = small_config();
    let (dir, log) = open(&fs, &clock, &config);
    transactions_over_segments(&log, 6);
    append(&log, &batch(2, 0, 12, 1, true));
    append(&log, &batch(3, 0, 12, 1, true));
    end_txn(&log, MarkerKind::Abort, 3);
    to_end(&log);
    let before = txn_state(&log);
    block_on(log.flush()).unwrap();
    block_on(dir.checkpoint()).unwrap();
    assert!(!list_snapshots(&fs, Path::new(PART)).unwrap().is_empty());
    for seed in 0..4 {
        let crashed = fs.crash(&mut SimRng::new(seed));
        let (_d, from_snapshot) = open(&crashed, &clock, &config);
        assert_eq!(txn_state(&from_snapshot), before, "seed {seed}: snapshot and tail");
        // The same disk with every snapshot and .txnindex gone: the whole log is replayed.
        let bare = fs.crash(&mut SimRng::new(seed));
        for name in bare.list_dir(Path::new(PART)).unwrap() {
            if name.ends_with(".snapshot") || name.ends_with(TXN_INDEX_SUFFIX) {
                block_on(bare.remove(&Path::new(PART).join(name))).unwrap();
            }
        }
        let (_d, replayed) = open(&bare, &clock, &config);
        assert_eq!(txn_state(&replayed), before, "seed {seed}: whole log");
    }
    // A clean close and open reads the snapshot at the log end and the files: the same again.
    block_on(dir.close()).unwrap();
    let (_d, reopened) = open(&fs, &clock, &config);
    assert_eq!(txn_state(&reopened), before);
}

#[test]
fn a_damaged_txn_index_is_rebuilt_from_the_log() {
    let fs = SimFs::new();
    let clock = ManualClock::new(0);
    let config = small_config();
    let (dir, log) = open(&fs, &clock, &config);
    let aborted = transactions_over_segments(&log, 6);
    to_end(&log);
    let before = txn_state(&log);
    block_on(dir.close()).unwrap();
    let first = aborted[0].2;
    let bases = log.segment_bases();
    let base = bases[bases.partition_point(|b| b.0 <= first) - 1];
    let path = Path::new(PART).join(file_name(base, TXN_INDEX_SUFFIX));
    let mut torn = fs.contents(&path).expect("the segment's .txnindex");
    torn.truncate(torn.len() - 5);
    fs.set_contents(&path, torn);
    drop(log);
    let (dir, reopened) = open(&fs, &clock, &config);
    assert_eq!(txn_state(&reopened), before);
    let rewritten = fs.contents(&path).expect("written again");
    assert_eq!(rewritten.len() % 34, 0);
    drop(dir);
}

#[test]
fn truncation_forgets_markers_past_the_cut_and_reopens_their_transactions() {
    let fs = SimFs::new();
    let clock = ManualClock::new(0);
    let config = small_config();
    let (dir, log) = open(&fs, &clock, &config);
    transactions_over_segments(&log, 3);
    let first = append(&log, &batch(1, 0, 6, 1, true));
    append(&log, &batch(1, 0, 7, 1, true));
    let abort = end_txn(&log, MarkerKind::Abort, 1);
    let kept = log.aborted_index().len() - 1;
    to_end(&log);
    assert_eq!(log.last_stable_offset(), log.log_end_offset());
    block_on(log.truncate_to(Offset(abort))).unwrap();
    assert_eq!(log.aborted_index().len(), kept);
    assert_eq!(log.producer_states().get(1).unwrap().txn_first_offset, Some(Offset(first)));
    log.set_high_watermark(log.log_end_offset());
    assert_eq!(log.last_stable_offset(), Offset(first));
    // The follower takes the leader's marker again, at another coordinator's epoch.
    let mut stamped = marker(MarkerKind::Commit, 1, 0, 1).encode(0);
    stamped[0..8].copy_from_slice(&(abort as i64).to_be_bytes());
    stamped[12..16].copy_from_slice(&0i32.to_be_bytes());
    block_on(log.append_replicated(&stamped)).unwrap();
    to_end(&log);
    assert_eq!(log.aborted_index().len(), kept, "a commit adds nothing to the index");
    assert_eq!(log.last_stable_offset(), log.log_end_offset());
    // And after a restart the cut segment's file does not bring the forgotten abort back.
    block_on(dir.close()).unwrap();
    let (_d, reopened) = open(&fs, &clock, &config);
    assert_eq!(reopened.aborted_index().len(), kept);
}

#[test]
fn a_follower_applies_the_leaders_markers_and_has_the_same_transactions() {
    let fs = SimFs::new();
    let clock = ManualClock::new(0);
    let config = small_config();
    let (_dir, leader) = open(&fs, &clock, &config);
    transactions_over_segments(&leader, 5);
    append(&leader, &batch(2, 0, 10, 1, true));
    to_end(&leader);
    let follower_fs = SimFs::new();
    let (_fdir, follower) = open(&follower_fs, &clock, &config);
    let mut at = Offset(0);
    while at < leader.log_end_offset() {
        let read = block_on(leader.read(at, 3_000)).unwrap();
        block_on(follower.append_replicated(&read.bytes)).unwrap();
        at = read.next_offset;
    }
    to_end(&follower);
    assert_eq!(txn_state(&follower), txn_state(&leader));
    // As the new leader it fences the old coordinator as the old leader would have.
    let stale = block_on(follower.append_marker(marker(MarkerKind::Abort, 2, 0, -1), LeaderEpoch(1)));
    assert!(matches!(stale, Err(StorageError::Producer(ProducerError::CoordinatorFenced { .. }))));
}

#[test]
fn retention_past_an_open_transactions_first_batch_keeps_it_open_and_the_lso_at_the_log_start() {
    let fs = SimFs::new();
    let clock = ManualClock::new(0);
    let config = small_config();
    let (_dir, log) = open(&fs, &clock, &config);
    let first = append(&log, &batch(1, 0, 0, 1, true));
    for i in 0..40 {
        append(&log, &batch(50, 0, i, 1, false));
    }
    to_end(&log);
    assert_eq!(log.last_stable_offset(), Offset(first));
    let start = block_on(log.delete_records(Offset(10))).unwrap();
    assert_eq!(log.last_stable_offset(), start, "never below the log start");
    assert_eq!(log.first_unstable_offset(), Some(start));
    end_txn(&log, MarkerKind::Commit, 1);
    to_end(&log);
    assert_eq!(log.last_stable_offset(), log.log_end_offset());
}

#[derive(Debug, Clone)]
enum Op {
    Data {
        producer: i64,
        txn: bool,
    },
    Marker {
        producer: i64,
        commit: bool,
    },
    /// Moves the high watermark this share of the way to the log end.
    Hw(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3i64, any::<bool>()).prop_map(|(producer, txn)| Op::Data { producer, txn }),
        (0..3i64, any::<bool>()).prop_map(|(producer, commit)| Op::Marker { producer, commit }),
        (0..=4u8).prop_map(Op::Hw),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The LSO never moves back while the high watermark does not, never passes it, never goes below the
    /// log start, and a restart (snapshot and replay) finds the same.
    #[test]
    fn the_lso_never_moves_back_while_the_hw_does_not(ops in proptest::collection::vec(op(), 1..60)) {
        let fs = SimFs::new();
        let clock = ManualClock::new(0);
        let config = small_config();
        let (dir, log) = open(&fs, &clock, &config);
        let mut seqs = [0i32; 3];
        let mut lso = log.last_stable_offset();
        for op in ops {
            match op {
                Op::Data { producer, txn } => {
                    let b = batch(producer, 0, seqs[producer as usize], 1, txn);
                    match block_on(log.append(&b, E0)) {
                        Ok(_) => seqs[producer as usize] += 1,
                        Err(StorageError::Producer(ProducerError::NotTransactional { .. })) => {}
                        Err(e) => panic!("{e}"),
                    }
                }
                Op::Marker { producer, commit } => {
                    let kind = if commit { MarkerKind::Commit } else { MarkerKind::Abort };
                    block_on(log.append_marker(marker(kind, producer, 0, 0), E0)).unwrap();
                }
                Op::Hw(share) => {
                    let (hw, end) = (log.high_watermark().0, log.log_end_offset().0);
                    log.set_high_watermark(Offset(hw + (end - hw) * share as u64 / 4));
                }
            }
            let now = log.last_stable_offset();
            prop_assert!(now >= lso, "LSO moved back from {} to {}", lso, now);
            prop_assert!(now <= log.high_watermark() && now >= log.log_start_offset());
            lso = now;
        }
        to_end(&log);
        let before = txn_state(&log);
        block_on(log.flush()).unwrap();
        block_on(dir.checkpoint()).unwrap();
        let crashed = fs.crash(&mut SimRng::new(1));
        let (_d, reopened) = open(&crashed, &clock, &config);
        prop_assert_eq!(txn_state(&reopened), before);
    }
}

#[test]
fn compaction_cleans_below_the_lso_only_and_keeps_the_entries_of_the_abort_markers_it_keeps() {
    let fs = SimFs::new();
    let clock = ManualClock::new(0);
    let config = small_config();
    let (dir, log) = open(&fs, &clock, &config);
    let aborted = transactions_over_segments(&log, 8);
    // An open transaction holds the cleaner back: only segments wholly below its first offset are offered.
    let open_first = append(&log, &batch(1, 0, 16, 1, true));
    for i in 0..30 {
        append(&log, &batch(200, 0, i, 1, false));
    }
    to_end(&log);
    assert!(log.closed_segments().iter().all(|s| s.next_offset.0 <= open_first));
    assert!(log.segment_bases().last().unwrap().0 > open_first, "segments beyond it were closed");
    // Clean the first three closed segments, leaving out the first ABORT marker among them.
    let group: Vec<_> = log.closed_segments().into_iter().take(3).collect();
    let upto = group.last().unwrap().next_offset;
    let dropped = aborted.iter().find(|a| a.2 < upto.0 - 1).expect("an abort in the group").2;
    let mut cleaned = block_on(log.start_cleaned(group[0].base)).unwrap();
    for seg in &group {
        let mut pos = 0;
        while let Some(chunk) = block_on(log.read_closed_segment(seg.base, pos, 4096)).unwrap() {
            if chunk.is_empty() {
                break;
            }
            pos += chunk.len() as u64;
            for (base, _, bytes) in common::split_batches(&chunk) {
                if base != dropped {
                    block_on(cleaned.push(&bytes)).unwrap();
                }
            }
        }
    }
    assert!(block_on(log.swap_in_cleaned(cleaned, &group, upto, log.end_cuts())).unwrap());
    let expected: Vec<u64> = aborted.iter().filter(|a| a.2 != dropped).map(|a| a.2).collect();
    let markers = |log: &PartitionLog<SimFs>| log.aborted_index().iter().map(|e| e.last_offset.0).collect::<Vec<_>>();
    assert_eq!(markers(&log), expected);
    block_on(log.flush()).unwrap();
    block_on(dir.checkpoint()).unwrap();
    let crashed = fs.crash(&mut SimRng::new(3));
    let (_d, recovered) = open(&crashed, &clock, &config);
    assert_eq!(markers(&recovered), expected, "after a crash");
    block_on(dir.close()).unwrap();
    let (_d, reopened) = open(&fs, &clock, &config);
    assert_eq!(markers(&reopened), expected, "after a clean restart");
}

#[test]
fn a_swap_a_crash_interrupted_takes_the_cleaned_txn_index_whether_or_not_it_was_renamed() {
    for renamed in [false, true] {
        let fs = SimFs::new();
        let clock = ManualClock::new(0);
        let config = small_config();
        let (dir, log) = open(&fs, &clock, &config);
        let aborted = transactions_over_segments(&log, 8);
        to_end(&log);
        let group: Vec<_> = log.closed_segments().into_iter().take(2).collect();
        let upto = group[1].next_offset;
        let in_group: Vec<u64> = aborted.iter().filter(|a| a.2 < upto.0).map(|a| a.2).collect();
        assert!(in_group.len() >= 2, "the test needs aborts in both segments");
        block_on(dir.close()).unwrap();
        drop((log, dir));
        // A crash after the commit point of a swap that dropped the group's first ABORT marker.
        let name = |base: Offset, suffix: &str| Path::new(PART).join(file_name(base, suffix));
        let mut swap = Vec::new();
        let mut kept = Vec::new();
        for seg in &group {
            let segment = fs.contents(&name(seg.base, ".log")).unwrap();
            let entries = decode_txn_index(
                &fs.contents(&name(seg.base, TXN_INDEX_SUFFIX)).unwrap_or_default(),
                seg.base,
                seg.next_offset,
            )
            .unwrap();
            kept.extend(entries.into_iter().filter(|e| e.last_offset.0 != in_group[0]));
            for (base, _, bytes) in common::split_batches(&segment) {
                if base != in_group[0] {
                    swap.extend_from_slice(&bytes);
                }
            }
        }
        let put = |path: &Path, bytes: Vec<u8>| {
            block_on(fs.open(path, true)).unwrap();
            fs.set_contents(path, bytes);
        };
        put(&name(group[0].base, ".swap"), swap);
        let cleaned_index = shardlog_storage::txn::index::encode(&kept);
        if renamed {
            put(&name(group[0].base, TXN_INDEX_SUFFIX), cleaned_index.clone());
        } else {
            put(&name(group[0].base, ".txnindex.cleaned"), cleaned_index.clone());
        }
        let (_dir, reopened) = open(&fs, &clock, &config);
        let markers: Vec<u64> = reopened.aborted_index().iter().map(|e| e.last_offset.0).collect();
        let want: Vec<u64> = aborted.iter().map(|a| a.2).filter(|&m| m != in_group[0]).collect();
        assert_eq!(markers, want, "renamed before the crash: {renamed}");
        assert_eq!(fs.contents(&name(group[0].base, TXN_INDEX_SUFFIX)), Some(cleaned_index));
        assert!(fs.contents(&name(group[1].base, TXN_INDEX_SUFFIX)).is_none());
        assert!(fs.contents(&name(group[0].base, ".txnindex.cleaned")).is_none());
    }
}
