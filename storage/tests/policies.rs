//! Time- and size-driven behaviour: `segment.ms` rolls, `retention.ms` and `retention.bytes` deletion, the
//! interval flush policy, and the tail cache serving recent reads from memory.

mod common;

use std::path::Path;

use futures_lite::future::block_on;
use shardlog_storage::fs::Fs;
use shardlog_storage::fs::sim::SimFs;
use shardlog_storage::log::OpenHints;
use shardlog_storage::{FlushPolicy, LeaderEpoch, LogConfig, Offset, PartitionLog};

use common::{ManualClock, make_batch, small_config};

const HOUR_MS: i64 = 3600 * 1000;

fn open(fs: &SimFs, clock: &std::rc::Rc<ManualClock>, config: LogConfig) -> PartitionLog<SimFs> {
    block_on(PartitionLog::open(fs.clone(), clock.clone(), Path::new("/data/t-0"), config, OpenHints::default()))
        .unwrap()
        .0
}

#[test]
fn segment_ms_rolls_an_old_segment_on_the_next_append() {
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let config = LogConfig { segment_ms: HOUR_MS, segment_bytes: 1 << 30, ..small_config() };
    let log = open(&fs, &clock, config);
    block_on(log.append(&make_batch(1, 1, 10, clock.0.get()), LeaderEpoch(0))).unwrap();
    clock.advance(HOUR_MS - 1);
    block_on(log.append(&make_batch(2, 1, 10, clock.0.get()), LeaderEpoch(0))).unwrap();
    assert_eq!(log.segment_count(), 1, "younger than segment.ms: no roll");
    clock.advance(1);
    block_on(log.append(&make_batch(3, 1, 10, clock.0.get()), LeaderEpoch(0))).unwrap();
    assert_eq!(log.segment_bases(), vec![Offset(0), Offset(2)], "the append at segment.ms starts a new segment");
}

#[test]
fn retention_ms_deletes_segments_whose_newest_record_is_older() {
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let config = LogConfig { retention_ms: Some(24 * HOUR_MS), ..small_config() };
    let log = open(&fs, &clock, config);
    // Three segments written an hour apart, then a fourth (active) one.
    for seg in 0..4u64 {
        block_on(log.append(&make_batch(seg, 2, 10, clock.0.get()), LeaderEpoch(0))).unwrap();
        if seg < 3 {
            block_on(log.roll()).unwrap();
        }
        clock.advance(HOUR_MS);
    }
    assert_eq!(log.segment_count(), 4);
    // 24 hours after the second segment's record: the first two are past retention.
    clock.advance(24 * HOUR_MS - 3 * HOUR_MS + 1);
    // Nothing goes while the records are above the high watermark (not yet on every in-sync replica).
    assert_eq!(block_on(log.apply_retention()).unwrap(), 0);
    log.set_high_watermark(Offset(2));
    assert_eq!(block_on(log.apply_retention()).unwrap(), 1, "only the segment below the HW goes");
    log.set_high_watermark(log.log_end_offset());
    assert_eq!(block_on(log.apply_retention()).unwrap(), 1);
    assert_eq!(log.log_start_offset(), Offset(4));
    assert!(!fs.exists(Path::new("/data/t-0/00000000000000000000.log")), "deleted segment file is gone");
    // Much later, everything but the active segment goes; the active segment is never deleted.
    clock.advance(1000 * HOUR_MS);
    assert_eq!(block_on(log.apply_retention()).unwrap(), 1);
    assert_eq!(log.segment_bases(), vec![Offset(6)]);
    assert_eq!(block_on(log.apply_retention()).unwrap(), 0);
    assert_eq!(log.log_end_offset(), Offset(8));
}

#[test]
fn retention_bytes_keeps_the_newest_segments_within_the_limit() {
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let log = open(&fs, &clock, small_config());
    for i in 0..6 {
        block_on(log.append(&make_batch(i, 1, 900, 0), LeaderEpoch(0))).unwrap();
        block_on(log.roll()).unwrap();
    }
    block_on(log.append(&make_batch(9, 1, 900, 0), LeaderEpoch(0))).unwrap();
    let segment = log.size_bytes() / 7;
    log.set_config(LogConfig { retention_bytes: Some(3 * segment), ..small_config() }).unwrap();
    log.set_high_watermark(log.log_end_offset());
    assert_eq!(block_on(log.apply_retention()).unwrap(), 4);
    assert_eq!(log.segment_count(), 3);
    assert!(log.size_bytes() <= 3 * segment);
    assert_eq!(log.log_start_offset(), Offset(4));
}

#[test]
fn interval_flush_syncs_after_flush_messages_or_flush_ms() {
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let config = LogConfig { flush: FlushPolicy::Interval { messages: 10, ms: 1000 }, ..small_config() };
    let log = open(&fs, &clock, config);
    // Four records per batch: after 8 records nothing is due, after 12 it is.
    for i in 0..2 {
        block_on(log.append(&make_batch(i, 4, 10, 0), LeaderEpoch(0))).unwrap();
        assert!(!block_on(log.flush_if_due()).unwrap());
    }
    assert_eq!(log.durable_offset(), Offset(0), "appended, not yet synced");
    let written = fs.contents(Path::new("/data/t-0/00000000000000000000.log")).unwrap();
    assert!(
        written.len() as u64 >= log.size_bytes(),
        "but already written to the file, as Kafka writes to the page cache"
    );
    block_on(log.append(&make_batch(2, 4, 10, 0), LeaderEpoch(0))).unwrap();
    assert!(block_on(log.flush_if_due()).unwrap(), "flush.messages reached");
    assert_eq!(log.durable_offset(), Offset(12));
    block_on(log.append(&make_batch(3, 1, 10, 0), LeaderEpoch(0))).unwrap();
    clock.advance(999);
    assert!(!block_on(log.flush_if_due()).unwrap());
    clock.advance(1);
    assert!(block_on(log.flush_if_due()).unwrap(), "flush.ms passed");
    assert_eq!(log.durable_offset(), Offset(13));
    clock.advance(5000);
    assert!(!block_on(log.flush_if_due()).unwrap(), "nothing unsynced, nothing to do");
}

/// `flush.messages` or `flush.ms` alone: the other one is "never" (unset), however it is spelled, and a
/// sync comes only when the one that is set says so.
#[test]
fn interval_flush_with_one_setting_alone_syncs_only_by_that_setting() {
    // One segment: a roll syncs too.
    let config = |messages, ms| LogConfig {
        flush: FlushPolicy::Interval { messages, ms },
        segment_bytes: 1 << 30,
        ..small_config()
    };
    for never in [u64::MAX, i64::MAX as u64] {
        let fs = SimFs::new();
        let clock = ManualClock::new(1_700_000_000_000);
        let log = open(&fs, &clock, config(1000, never));
        let mut synced = 0;
        for i in 0..2000 {
            block_on(log.append(&make_batch(i, 1, 10, 0), LeaderEpoch(0))).unwrap();
            clock.advance(1);
            synced += block_on(log.flush_if_due()).unwrap() as u64;
        }
        assert_eq!(synced, 2, "flush.messages=1000 alone (flush.ms {never}): a sync per 1000 records");
        assert_eq!(log.stats().fsyncs, 2);
        assert_eq!(log.durable_offset(), Offset(2000));

        let fs = SimFs::new();
        let log = open(&fs, &clock, config(never, 1000));
        let mut synced = 0;
        for i in 0..2000 {
            block_on(log.append(&make_batch(i, 1, 10, 0), LeaderEpoch(0))).unwrap();
            clock.advance(1);
            synced += block_on(log.flush_if_due()).unwrap() as u64;
        }
        assert_eq!(synced, 2, "flush.ms=1000 alone (flush.messages {never}): a sync per second");
    }
}

#[test]
fn recent_reads_come_from_the_tail_cache_and_old_ones_from_disk() {
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let config = LogConfig { tail_cache_bytes: 1 << 20, segment_bytes: 64 << 10, ..small_config() };
    let log = open(&fs, &clock, config);
    for i in 0..20 {
        block_on(log.append(&make_batch(i, 1, 1000, 0), LeaderEpoch(0))).unwrap();
    }
    block_on(log.flush()).unwrap();
    let reads = fs.read_count();
    let recent = block_on(log.read(Offset(15), 1 << 20)).unwrap();
    assert_eq!(recent.next_offset, Offset(20));
    assert_eq!(fs.read_count(), reads, "the active segment's recent bytes are served from memory");
    block_on(log.roll()).unwrap();
    let old = block_on(log.read(Offset(15), 1 << 20)).unwrap();
    assert_eq!(old, recent, "the same bytes from disk");
    assert!(fs.read_count() > reads, "a rolled segment is read from disk");
}

#[test]
fn a_consumer_reading_on_with_a_byte_budget_reads_little_more_than_it_gets() {
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let interval = 4096u64;
    let config = LogConfig { segment_bytes: 1 << 30, index_interval_bytes: interval, ..small_config() };
    let log = open(&fs, &clock, config);
    // Batches of ~20 KB, larger than two index intervals: the index finds the batch before a consumer's
    // position (entries are keyed by last offsets, as in Kafka), and a budget's end then falls in a batch
    // that runs past the first chunk read.
    for i in 0..200 {
        block_on(log.append(&make_batch(i, 2, 10_000, 0), LeaderEpoch(0))).unwrap();
    }
    block_on(log.roll()).unwrap();
    let batch = log.size_bytes() / 200;
    let stored = log.size_bytes();
    let budget = 64 << 10;
    let before = fs.read_bytes();
    let (mut at, mut fetched, mut reads) = (Offset(0), 0u64, 0u64);
    while at < log.log_end_offset() {
        let read = block_on(log.read_until_at_most(at, budget, Offset(u64::MAX))).unwrap();
        assert!(!read.bytes.is_empty() && read.bytes.len() <= budget);
        fetched += read.bytes.len() as u64;
        at = read.next_offset;
        reads += 1;
    }
    assert_eq!(fetched, stored, "the consumer got every stored byte");
    let read = fs.read_bytes() - before;
    // Per read: the budget, the index's two intervals of slack, the batch before the position and the one
    // that runs past the budget; not a second budget's worth.
    let bound = reads * (budget as u64 + 2 * interval + 2 * batch);
    assert!(read <= bound, "read {read} bytes from the disk to serve {stored} in {reads} reads (bound {bound})");
}

#[test]
fn an_idle_log_releases_its_cache_and_files_and_reads_come_from_disk() {
    use shardlog_storage::{LogDir, LogDirScope, TopicPartition};
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    // A large tail cache, and interval flushing so appended data also waits in memory.
    let config = LogConfig {
        tail_cache_bytes: 1 << 20,
        segment_bytes: 64 << 10,
        flush: FlushPolicy::Interval { messages: 1 << 40, ms: 1 << 40 },
        ..small_config()
    };
    let scope = LogDirScope {
        name: "s".into(),
        owns: Box::new(|_| true),
        max_open_files: 3,
        max_producer_ids: usize::MAX,
        space_floor: None,
    };
    let config_for = |_: &shardlog_storage::TopicPartition| config.clone();
    let (dir, _) =
        block_on(LogDir::open_scoped(fs.clone(), clock.clone(), Path::new("/data"), Some(scope), config_for)).unwrap();
    let mut appended = vec![Vec::new(); 2];
    for p in 0..2u32 {
        let log = block_on(dir.get_or_create(&TopicPartition::new("t", p), config.clone())).unwrap();
        for i in 0..300u64 {
            block_on(log.append(&make_batch(i, 2, 500, clock.0.get()), LeaderEpoch(0))).unwrap();
        }
        appended[p as usize] = block_on(log.read(Offset(0), usize::MAX)).unwrap().bytes.to_vec();
        assert!(log.segment_count() > 3, "several segments, more than the files allowed open");
    }
    assert!(dir.open_files() <= 3, "{} segment files open", dir.open_files());

    let log = dir.get(&TopicPartition::new("t", 0)).unwrap();
    let writes_before = log.stats().writes;
    assert!(log.cached_bytes() > 16 << 10, "recent data is cached: {} bytes", log.cached_bytes());
    block_on(log.release_cache()).unwrap();
    assert!(log.cached_bytes() <= 4096, "only the partial last block stays: {} bytes", log.cached_bytes());
    assert!(log.stats().writes > writes_before, "data waiting in memory was written out first");

    for p in 0..2u32 {
        let log = dir.get(&TopicPartition::new("t", p)).unwrap();
        let read = block_on(log.read(Offset(0), usize::MAX)).unwrap().bytes;
        assert_eq!(read, appended[p as usize], "partition {p} reads back the same after release");
        // And appends go on after the release.
        let info = block_on(log.append(&make_batch(999, 1, 10, clock.0.get()), LeaderEpoch(0))).unwrap();
        assert_eq!(info.base_offset, Offset(600));
    }
    assert!(dir.open_files() <= 3, "{} segment files open", dir.open_files());
}

#[test]
fn read_at_most_never_goes_over_its_limit_even_for_the_first_batch() {
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let log = open(&fs, &clock, small_config());
    let batches: Vec<Vec<u8>> = (0..3).map(|i| make_batch(i, 1, 400, clock.0.get())).collect();
    for b in &batches {
        block_on(log.append(b, LeaderEpoch(0))).unwrap();
    }
    let one = batches[0].len();
    let end = Offset(u64::MAX);
    // Below one batch: the ordinary read still returns the first batch whole; the bounded one nothing.
    assert_eq!(block_on(log.read_until(Offset(0), one - 1, end)).unwrap().bytes.len(), one);
    let bounded = block_on(log.read_until_at_most(Offset(0), one - 1, end)).unwrap();
    assert!(bounded.bytes.is_empty());
    assert_eq!(bounded.next_offset, Offset(0), "nothing read: the next read starts at the same place");
    // Room for two and a half batches: two.
    let two = block_on(log.read_until_at_most(Offset(0), one * 5 / 2, end)).unwrap();
    assert_eq!(two.bytes.len(), 2 * one);
    assert_eq!(two.next_offset, Offset(2));
}

#[test]
fn a_read_split_to_a_smaller_limit_gives_what_a_read_with_that_limit_gives_and_keeps_the_rest() {
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let log = open(&fs, &clock, small_config());
    // Batches of different sizes, several records each, so that batch boundaries and offsets differ.
    for i in 0..12u64 {
        block_on(log.append(&make_batch(i, 3, 100 + 150 * (i as usize % 4), clock.0.get()), LeaderEpoch(0))).unwrap();
    }
    let end = log.log_end_offset();
    let from = Offset(4); // inside the second batch: the read starts at that batch
    let whole = block_on(log.read_until_at_most(from, 1 << 20, end)).unwrap();
    for limit in [0, 1, 200, 700, 1500, 3000, whole.bytes.len() - 1, whole.bytes.len(), 1 << 20] {
        let mut rest = whole.clone();
        let direct = block_on(log.read_until_at_most(from, limit, end)).unwrap();
        match rest.split_to_at_most(limit) {
            None => {
                assert!(direct.bytes.is_empty(), "limit {limit}: the read with the limit got a batch");
                assert_eq!(rest, whole, "limit {limit}: nothing taken, nothing changed");
            }
            Some(head) => {
                assert_eq!(head, direct, "limit {limit}");
                let mut joined = head.bytes.to_vec();
                joined.extend_from_slice(&rest.bytes);
                assert_eq!(joined, whole.bytes.to_vec(), "limit {limit}: the rest is the batches after");
                assert_eq!(rest.next_offset, whole.next_offset);
                if rest.bytes.is_empty() {
                    assert_eq!(rest.first_offset, None);
                } else {
                    assert_eq!(
                        rest.first_offset,
                        Some(head.next_offset),
                        "limit {limit}: the rest begins where the head ends"
                    );
                    let on = block_on(log.read_until_at_most(head.next_offset, rest.bytes.len(), end)).unwrap();
                    assert_eq!(on, rest, "limit {limit}: the rest is what reading on from the head's end gives");
                }
            }
        }
    }
}

#[test]
fn a_read_with_no_room_for_the_batch_a_read_stopped_before_returns_nothing_without_the_disk() {
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let log = open(&fs, &clock, LogConfig { tail_cache_bytes: 0, ..small_config() });
    let batches: Vec<Vec<u8>> = (0..3).map(|i| make_batch(i, 1, 900, clock.0.get())).collect();
    for b in &batches {
        block_on(log.append(b, LeaderEpoch(0))).unwrap();
    }
    block_on(log.flush()).unwrap();
    let (one, end) = (batches[0].len(), Offset(u64::MAX));
    let first = block_on(log.read_until_at_most(Offset(0), one * 3 / 2, end)).unwrap();
    assert_eq!(first.next_offset, Offset(1), "one batch fits, the second does not");

    let reads = fs.read_count();
    let none = block_on(log.read_until_at_most(Offset(1), one - 1, end)).unwrap();
    assert!(none.bytes.is_empty());
    assert_eq!(none.next_offset, Offset(1));
    assert_eq!(fs.read_count(), reads, "the size of the batch at offset 1 was known");
    // With room for it, the batch is read; the first partition of a fetch gets it whole in any case.
    assert_eq!(block_on(log.read_until_at_most(Offset(1), one, end)).unwrap().bytes.len(), one);
    let first = block_on(log.read_until_at_most(Offset(0), one * 3 / 2, end)).unwrap();
    assert_eq!(block_on(log.read_until(first.next_offset, 1, end)).unwrap().bytes.len(), one);
}
