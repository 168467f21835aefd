//! Compaction's storage half: a cleaned segment replaces a run of closed segments (batches removed, some
//! emptied, offsets kept with gaps), reads and indexes follow the gaps, a clean restart and a crash keep
//! the result, a swap a crash interrupted is finished at open and an uncommitted one dropped, a follower
//! copies the compacted log byte for byte, and a swap whose segments changed meanwhile is refused.

mod common;

use std::path::Path;

use futures_lite::future::block_on;
use shardlog_storage::batch::{self, BatchHeader, HEADER_BYTES, LOG_OVERHEAD};
use shardlog_storage::fs::sim::{SimFs, SimRng};
use shardlog_storage::{ClosedSegment, LeaderEpoch, LogDir, Offset, PartitionLog, TopicPartition};

use common::{ManualClock, make_batch, small_config, split_batches};

const DATA: &str = "/data";

fn open_dir(fs: &SimFs) -> LogDir<SimFs> {
    block_on(LogDir::open(fs.clone(), ManualClock::new(1_700_000_000_000), Path::new(DATA), |_| small_config()))
        .unwrap()
        .0
}

fn everything(log: &PartitionLog<SimFs>) -> Vec<u8> {
    block_on(log.read(log.log_start_offset(), usize::MAX)).unwrap().bytes.to_vec()
}

/// The batch with its records removed: same offsets, producer fields and timestamps, record count 0.
fn emptied(stored: &[u8]) -> Vec<u8> {
    let mut b = stored[..HEADER_BYTES].to_vec();
    b[8..12].copy_from_slice(&((HEADER_BYTES - LOG_OVERHEAD) as i32).to_be_bytes());
    b[57..61].copy_from_slice(&0i32.to_be_bytes());
    let crc = batch::compute_crc(&b);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

/// A log of 150 batches over several small segments, all below the high watermark.
fn filled(dir: &LogDir<SimFs>, tp: &TopicPartition) -> std::rc::Rc<PartitionLog<SimFs>> {
    let log = block_on(dir.get_or_create(tp, small_config())).unwrap();
    for i in 0..150u64 {
        block_on(log.append(&make_batch(i, 1 + (i % 3) as usize, 120, 1_700_000_000_000), LeaderEpoch(1))).unwrap();
    }
    block_on(log.flush()).unwrap();
    log.set_high_watermark(log.log_end_offset());
    log
}

/// Cleans the first `n` closed segments into one: every third batch removed, every third emptied, the
/// last one always kept. Returns the batches the log should now hold in their place.
fn clean_first(log: &PartitionLog<SimFs>, n: usize) -> (Vec<ClosedSegment>, Vec<Vec<u8>>) {
    let group: Vec<ClosedSegment> = log.closed_segments().into_iter().take(n).collect();
    assert_eq!(group.len(), n, "enough closed segments");
    let mut cleaned = block_on(log.start_cleaned(group[0].base)).unwrap();
    let mut kept = Vec::new();
    let mut stored = Vec::new();
    for seg in &group {
        let mut pos = 0;
        loop {
            let chunk = block_on(log.read_closed_segment(seg.base, pos, 1000)).unwrap().expect("still there");
            if chunk.is_empty() {
                break;
            }
            pos += chunk.len() as u64;
            stored.extend(split_batches(&chunk).into_iter().map(|(_, _, b)| b));
        }
    }
    let last = stored.len() - 1;
    for (i, b) in stored.into_iter().enumerate() {
        let keep = match i % 3 {
            _ if i == last => b,
            0 => continue,
            1 => emptied(&b),
            _ => b,
        };
        block_on(cleaned.push(&keep)).unwrap();
        kept.push(keep);
    }
    let upto = group.last().unwrap().next_offset;
    assert!(block_on(log.swap_in_cleaned(cleaned, &group, upto, log.end_cuts())).unwrap(), "swapped in");
    block_on(log.checkpoint_cleaned()).unwrap();
    (group, kept)
}

#[test]
fn a_cleaned_segment_replaces_a_run_of_segments_and_survives_restart_and_crash() {
    let fs = SimFs::new();
    let tp = TopicPartition::new("t", 0);
    let dir = open_dir(&fs);
    let log = filled(&dir, &tp);
    let before = everything(&log);
    let (end, segments) = (log.log_end_offset(), log.segment_count());
    let (group, kept) = clean_first(&log, 3);
    assert_eq!(log.segment_count(), segments - 2, "three segments became one");
    assert_eq!(log.log_end_offset(), end, "offsets are never reused");
    assert_eq!(log.cleaned_upto(), group[2].next_offset);
    // Producer-state snapshots are kept at segment bases: none is left at the bases that went.
    let names = shardlog_storage::fs::Fs::list_dir(&fs, &Path::new(DATA).join("t-0")).unwrap();
    for gone in &group[1..] {
        assert!(!names.contains(&format!("{:020}.snapshot", gone.base.0)), "{names:?}");
    }
    assert!(names.contains(&format!("{:020}.snapshot", group[2].next_offset.0)), "{names:?}");

    // The log is the cleaned batches, then the untouched rest.
    let cut = split_batches(&before).iter().position(|(base, _, _)| *base >= group[2].next_offset.0).unwrap();
    let rest: Vec<u8> = split_batches(&before)[cut..].iter().flat_map(|(_, _, b)| b.clone()).collect();
    let expected = [kept.concat(), rest].concat();
    assert_eq!(everything(&log), expected);
    block_on(log.verify_indexes()).unwrap();
    // A read from inside a removed batch starts at the next batch there is.
    let removed = BatchHeader::parse(&split_batches(&before)[3].2).unwrap();
    let read = block_on(log.read(Offset(removed.base_offset as u64), 1)).unwrap();
    let first = BatchHeader::parse(&read.bytes).unwrap();
    assert!(first.base_offset > removed.base_offset + removed.last_offset_delta as i64, "{first:?}");

    // A clean restart, then a crash: the same log each time.
    block_on(dir.checkpoint()).unwrap();
    block_on(dir.close()).unwrap();
    drop((log, dir));
    let dir = open_dir(&fs);
    let log = dir.get(&tp).unwrap();
    assert_eq!(everything(&log), expected);
    assert_eq!(log.cleaned_upto(), group[2].next_offset, "the cleaner's checkpoint is kept");
    drop((log, dir));
    let crashed = fs.crash(&mut SimRng::new(7));
    let dir = open_dir(&crashed);
    let log = dir.get(&tp).unwrap();
    assert_eq!(everything(&log), expected);
    assert_eq!(log.log_end_offset(), end);
    block_on(log.verify_indexes()).unwrap();
}

#[test]
fn an_interrupted_swap_is_finished_at_open_and_an_uncommitted_one_dropped() {
    let fs = SimFs::new();
    let tp = TopicPartition::new("t", 0);
    let dir = open_dir(&fs);
    let log = filled(&dir, &tp);
    let before = everything(&log);
    let group: Vec<ClosedSegment> = log.closed_segments().into_iter().take(2).collect();
    block_on(dir.checkpoint()).unwrap();
    block_on(dir.close()).unwrap();
    drop((log, dir));

    // A crash after the commit point: the swap file is there, the first segment's index files are gone,
    // the second segment is still there.
    let seg_dir = Path::new(DATA).join("t-0");
    let name = |base: Offset, suffix: &str| seg_dir.join(format!("{:020}{suffix}", base.0));
    let old: Vec<Vec<u8>> = group.iter().map(|s| fs.contents(&name(s.base, ".log")).unwrap()).collect();
    let batches: Vec<Vec<u8>> = old.iter().flat_map(|b| split_batches(b)).map(|(_, _, b)| b).collect();
    let swap: Vec<u8> = [batches[1].clone(), emptied(batches.last().unwrap())].concat();
    let put = |path: &Path, bytes: Vec<u8>| {
        block_on(shardlog_storage::fs::Fs::open(&fs, path, true)).unwrap();
        fs.set_contents(path, bytes);
    };
    put(&name(group[0].base, ".swap"), swap.clone());
    block_on(shardlog_storage::fs::Fs::remove(&fs, &name(group[0].base, ".index"))).unwrap();
    // And an uncommitted cleaning of the next segment.
    put(&name(group[1].next_offset, ".cleaned"), b"whatever".to_vec());

    let dir = open_dir(&fs);
    let log = dir.get(&tp).unwrap();
    assert_eq!(log.segment_bases()[..2], [group[0].base, group[1].next_offset], "the swap replaced both");
    assert_eq!(fs.contents(&name(group[0].base, ".log")).unwrap(), swap);
    assert!(fs.contents(&name(group[1].base, ".log")).is_none());
    assert!(fs.contents(&name(group[0].base, ".swap")).is_none());
    assert!(fs.contents(&name(group[1].next_offset, ".cleaned")).is_none(), "uncommitted work is dropped");
    let all = everything(&log);
    assert_eq!(all[..swap.len()], swap[..]);
    assert_eq!(all.len(), before.len() - old.iter().map(Vec::len).sum::<usize>() + swap.len());
    block_on(log.verify_indexes()).unwrap();
}

#[test]
fn a_follower_copies_a_compacted_log_byte_for_byte_gaps_and_empty_batches_included() {
    let fs = SimFs::new();
    let dir = open_dir(&fs);
    let leader = filled(&dir, &TopicPartition::new("leader", 0));
    clean_first(&leader, 4);
    let compacted = everything(&leader);
    let follower = block_on(dir.get_or_create(&TopicPartition::new("follower", 0), small_config())).unwrap();
    // In pieces, as fetches bring them.
    let mut at = 0;
    while at < compacted.len() {
        let piece = block_on(leader.read(follower.log_end_offset(), 700)).unwrap().bytes;
        block_on(follower.append_replicated(&piece)).unwrap();
        at += piece.len();
    }
    block_on(follower.flush()).unwrap();
    assert_eq!(everything(&follower), compacted);
    assert_eq!(follower.log_end_offset(), leader.log_end_offset());
    block_on(dir.checkpoint()).unwrap();
    drop((leader, follower, dir));
    // Recovery scans the follower's segments, gaps and all.
    let crashed = fs.crash(&mut SimRng::new(3));
    let dir = open_dir(&crashed);
    let follower = dir.get(&TopicPartition::new("follower", 0)).unwrap();
    assert_eq!(everything(&follower), compacted);
    block_on(follower.verify_indexes()).unwrap();
}

#[test]
fn a_swap_whose_segments_changed_meanwhile_is_refused_and_leaves_nothing_behind() {
    let fs = SimFs::new();
    let tp = TopicPartition::new("t", 0);
    let dir = open_dir(&fs);
    let log = filled(&dir, &tp);
    let group: Vec<ClosedSegment> = log.closed_segments().into_iter().take(2).collect();
    let mut cleaned = block_on(log.start_cleaned(group[0].base)).unwrap();
    let mut pos = 0;
    loop {
        let chunk = block_on(log.read_closed_segment(group[0].base, pos, 1 << 20)).unwrap().unwrap();
        if chunk.is_empty() {
            break;
        }
        pos += chunk.len() as u64;
        for (_, _, b) in split_batches(&chunk) {
            block_on(cleaned.push(&b)).unwrap();
        }
    }
    // DeleteRecords removes the first segment while the cleaning was under way.
    block_on(log.delete_records(group[0].next_offset)).unwrap();
    assert_eq!(block_on(log.read_closed_segment(group[0].base, 0, 100)).unwrap(), None, "gone");
    let before = everything(&log);
    assert!(!block_on(log.swap_in_cleaned(cleaned, &group[..1], group[0].next_offset, log.end_cuts())).unwrap());
    assert_eq!(everything(&log), before);
    let left = shardlog_storage::fs::Fs::list_dir(&fs, &Path::new(DATA).join("t-0")).unwrap();
    assert!(!left.iter().any(|n| n.ends_with(".cleaned") || n.ends_with(".swap")), "{left:?}");
}

#[test]
fn a_truncation_into_a_gap_ends_the_log_where_the_batch_before_it_ends() {
    let fs = SimFs::new();
    let dir = open_dir(&fs);
    let follower = block_on(dir.get_or_create(&TopicPartition::new("f", 0), small_config())).unwrap();
    // A leader's compacted log: offsets 0..=9, then a gap, then 20..=29.
    let at = |base: u64| {
        let mut b = make_batch(base, 10, 50, 1_700_000_000_000);
        batch::stamp(&mut b, Offset(base), LeaderEpoch(1));
        block_on(follower.append_replicated(&b)).unwrap();
    };
    at(0);
    at(20);
    assert_eq!(follower.log_end_offset(), Offset(30));
    assert_eq!(block_on(follower.truncate_to(Offset(25))).unwrap(), Offset(10), "the batch holding 25 goes");
    // The log goes on from there: a roll, then the leader's batches again.
    block_on(follower.roll()).unwrap();
    let mut b = make_batch(20, 10, 50, 1_700_000_000_000);
    batch::stamp(&mut b, Offset(20), LeaderEpoch(2));
    block_on(follower.append_replicated(&b)).unwrap();
    block_on(follower.flush()).unwrap();
    let before = everything(&follower);
    block_on(dir.checkpoint()).unwrap();
    drop((follower, dir));
    let dir = open_dir(&fs.crash(&mut SimRng::new(11)));
    let follower = dir.get(&TopicPartition::new("f", 0)).expect("open, not offline");
    assert_eq!(everything(&follower), before);
    assert_eq!(follower.log_end_offset(), Offset(30));
}

#[test]
fn a_log_deleted_while_it_is_cleaned_leaves_the_cleaner_nothing_to_do() {
    let fs = SimFs::new();
    let tp = TopicPartition::new("t", 0);
    let dir = open_dir(&fs);
    let log = filled(&dir, &tp);
    let group: Vec<ClosedSegment> = log.closed_segments().into_iter().take(1).collect();
    let end_cuts = log.end_cuts();
    let mut cleaned = block_on(log.start_cleaned(group[0].base)).unwrap();
    let chunk = block_on(log.read_closed_segment(group[0].base, 0, 1 << 20)).unwrap().unwrap();
    for (_, _, b) in split_batches(&chunk) {
        block_on(cleaned.push(&b)).unwrap();
    }
    block_on(dir.delete(&tp)).unwrap();
    assert!(block_on(log.read_closed_segment(group[0].base, 0, 100)).is_err(), "closed");
    assert!(!block_on(log.swap_in_cleaned(cleaned, &group, group[0].next_offset, end_cuts)).unwrap());
    assert!(!shardlog_storage::fs::Fs::exists(&fs, &Path::new(DATA).join("t-0")));
}
