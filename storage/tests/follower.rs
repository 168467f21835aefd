//! A follower's append: the leader's batches stored byte for byte at the leader's offsets, with the
//! leader's epochs in the epoch cache and its producers' state, refused whole when a batch does not
//! check or starts below the log end; a truncation takes epochs and producer state back.

mod common;

use std::path::Path;

use futures_lite::future::block_on;
use shardlog_storage::fs::sim::SimFs;
use shardlog_storage::{LeaderEpoch, LogDir, Offset, PartitionLog, StorageError, TopicPartition};

use common::{ManualClock, make_batch, set_producer, small_config};

fn open_log(fs: &SimFs, topic: &str) -> (LogDir<SimFs>, std::rc::Rc<PartitionLog<SimFs>>) {
    let clock = ManualClock::new(1_700_000_000_000);
    let (dir, _) = block_on(LogDir::open(fs.clone(), clock, Path::new("/data"), |_| small_config())).unwrap();
    let log = block_on(dir.get_or_create(&TopicPartition::new(topic, 0), small_config())).unwrap();
    (dir, log)
}

/// A leader log with plain and idempotent batches over three leader epochs and a few segments.
fn leader(fs: &SimFs) -> (LogDir<SimFs>, std::rc::Rc<PartitionLog<SimFs>>) {
    let (dir, log) = open_log(fs, "leader");
    let mut next_sequence = [0i32; 2];
    for i in 0..30u64 {
        let records = 1 + (i % 3) as usize;
        let mut batch = make_batch(i, records, 150, 1_700_000_000_000);
        if i % 2 == 0 {
            let producer = ((i / 2) % 2) as usize;
            set_producer(&mut batch, 1 + producer as i64, 0, next_sequence[producer]);
            next_sequence[producer] += records as i32;
        }
        let epoch = LeaderEpoch(if i < 10 {
            0
        } else if i < 20 {
            2
        } else {
            5
        });
        block_on(log.append(&batch, epoch)).unwrap();
    }
    block_on(log.flush()).unwrap();
    (dir, log)
}

fn everything(log: &PartitionLog<SimFs>) -> Vec<u8> {
    block_on(log.read(log.log_start_offset(), usize::MAX)).unwrap().bytes.to_vec()
}

#[test]
fn a_follower_stores_the_leaders_batches_at_the_leaders_offsets_with_its_epochs_and_producers() {
    let fs = SimFs::new();
    let (_l, leader) = leader(&fs);
    let (_f, follower) = open_log(&fs, "follower");
    let bytes = everything(&leader);
    // In two pieces, as two fetches would bring them, split at a batch boundary.
    let split = block_on(leader.read(Offset(0), 4000)).unwrap().bytes.len();
    let first = block_on(follower.append_replicated(&bytes[..split])).unwrap().unwrap();
    assert_eq!(first.base_offset, Offset(0));
    let second = block_on(follower.append_replicated(&bytes[split..])).unwrap().unwrap();
    assert_eq!(second.base_offset, first.next_offset());
    assert_eq!(second.next_offset(), leader.log_end_offset());
    assert_eq!(block_on(follower.append_replicated(&[])).unwrap(), None);

    assert_eq!(everything(&follower), bytes, "byte for byte");
    assert_eq!(follower.leader_epochs(), leader.leader_epochs());
    assert_eq!(follower.producer_states().sequences(), leader.producer_states().sequences());
    assert!(follower.segment_count() > 1, "the follower rolled as it went");
}

#[test]
fn a_replicated_batch_that_does_not_check_or_goes_back_is_refused_and_nothing_is_appended() {
    let fs = SimFs::new();
    let (_l, leader) = leader(&fs);
    let (_f, follower) = open_log(&fs, "follower");
    let bytes = everything(&leader);
    let one = block_on(leader.read(Offset(0), 1)).unwrap().bytes.len();

    let mut flipped = bytes.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 1;
    assert!(matches!(block_on(follower.append_replicated(&flipped)), Err(StorageError::InvalidBatch(_))));
    assert_eq!(follower.log_end_offset(), Offset(0), "the good batches before the bad one were not appended");

    // Offsets may skip ahead (a compacted leader log has gaps) but never go back: the second batch
    // followed by the first is refused whole.
    let batches = common::split_batches(&bytes);
    let backwards = [batches[1].2.clone(), batches[0].2.clone()].concat();
    let refused = block_on(follower.append_replicated(&backwards));
    assert!(matches!(refused, Err(StorageError::NotAtLogEnd { .. })), "{refused:?}");
    let cut = block_on(follower.append_replicated(&bytes[..bytes.len() - 3]));
    assert!(cut.is_err(), "a batch cut short is refused");
    assert_eq!(follower.log_end_offset(), Offset(0));

    block_on(follower.append_replicated(&bytes[..one])).unwrap();
    let again = block_on(follower.append_replicated(&bytes[..one]));
    assert!(matches!(again, Err(StorageError::NotAtLogEnd { .. })), "the same batch twice: {again:?}");
}

#[test]
fn a_follower_truncated_back_loses_the_epochs_and_producer_batches_of_what_was_cut() {
    let fs = SimFs::new();
    let (_l, leader) = leader(&fs);
    let (_f, follower) = open_log(&fs, "follower");
    let (_p, partial) = open_log(&fs, "partial");
    let bytes = everything(&leader);
    block_on(follower.append_replicated(&bytes)).unwrap();
    // Everything written in epoch 5 goes; a log that only ever had the rest is what remains.
    let epoch5 = leader.leader_epochs().end_offset_for(LeaderEpoch(2), leader.log_end_offset()).unwrap().1;
    block_on(follower.truncate_to(epoch5)).unwrap();
    let kept = block_on(leader.read_until(Offset(0), usize::MAX, epoch5)).unwrap().bytes;
    block_on(partial.append_replicated(&kept)).unwrap();
    assert_eq!(follower.log_end_offset(), epoch5);
    assert_eq!(follower.leader_epochs(), partial.leader_epochs());
    assert_eq!(follower.producer_states().sequences(), partial.producer_states().sequences());
    assert_ne!(follower.producer_states().sequences(), leader.producer_states().sequences());
}
