//! The cleaner against a model: random keyed records (tombstones, several codecs, an idempotent
//! producer) over many small segments; after a pass, below the cleaned offset exactly the latest record
//! of each key is left (tombstones too, until `delete.retention.ms` has passed), everything above is
//! untouched, offsets only go up and the log end stays; a crash keeps the result.

use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;

use bytes::{Bytes, BytesMut};
use futures_lite::future::block_on;
use kafka_protocol::records::{
    Compression, NO_PARTITION_LEADER_EPOCH, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions,
    TimestampType,
};
use shardlog_storage::batch::BatchHeader;
use shardlog_storage::fs::sim::{SimFs, SimRng};
use shardlog_storage::{Clock, CompactionConfig, LeaderEpoch, LogConfig, LogDir, Offset, PartitionLog, TopicPartition};

use super::*;
use crate::topics::records::keyless_records;

const T0: i64 = 1_700_000_000_000;

struct FixedClock;
impl Clock for FixedClock {
    fn now_ms(&self) -> i64 {
        T0
    }
}

fn config() -> LogConfig {
    LogConfig {
        segment_bytes: 2048,
        index_interval_bytes: 256,
        tail_cache_bytes: 0,
        retention_ms: None,
        compaction: Some(CompactionConfig {
            delete_retention_ms: 1000,
            min_cleanable_dirty_ratio_ppm: 0,
            min_compaction_lag_ms: 0,
        }),
        ..LogConfig::default()
    }
}

fn open(fs: &SimFs) -> (LogDir<SimFs>, Rc<PartitionLog<SimFs>>) {
    let (dir, _) = block_on(LogDir::open(fs.clone(), Rc::new(FixedClock), Path::new("/data"), |_| config())).unwrap();
    let log = block_on(dir.get_or_create(&TopicPartition::new("c", 0), config())).unwrap();
    (dir, log)
}

type Key = Option<Vec<u8>>;
type Value = Option<Vec<u8>>;

/// A batch of `records` in `codec`, from producer `producer` (id, first sequence) if given.
fn batch(records: &[(Key, Value)], codec: Compression, producer: Option<(i64, i32)>) -> Vec<u8> {
    let records: Vec<Record> = records
        .iter()
        .enumerate()
        .map(|(i, (key, value))| Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
            producer_id: producer.map_or(-1, |p| p.0),
            producer_epoch: if producer.is_some() { 0 } else { -1 },
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // Offsets and sequences move together (the encoder splits batches where they do not); base -1 without a producer.
            sequence: producer.map_or(-1, |p| p.1) + i as i32,
            timestamp: T0 + i as i64,
            key: key.clone().map(Bytes::from),
            value: value.clone().map(Bytes::from),
            headers: Default::default(),
        })
        .collect();
    let mut out = BytesMut::new();
    RecordBatchEncoder::encode(&mut out, &records, &RecordEncodeOptions { version: 2, compression: codec }).unwrap();
    out.to_vec()
}

/// Every record in the log from its start: (offset, key, value).
fn records(log: &PartitionLog<SimFs>) -> Vec<(u64, Key, Value)> {
    let read = block_on(log.read(log.log_start_offset(), usize::MAX)).unwrap();
    let mut bytes = read.bytes.clone();
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let set = RecordBatchDecoder::decode(&mut bytes).unwrap();
        for r in set.records {
            out.push((r.offset as u64, r.key.map(|k| k.to_vec()), r.value.map(|v| v.to_vec())));
        }
    }
    out
}

/// Stored batch headers, in log order.
fn headers(log: &PartitionLog<SimFs>) -> Vec<BatchHeader> {
    let read = block_on(log.read(log.log_start_offset(), usize::MAX)).unwrap();
    let mut out = Vec::new();
    let mut at = 0;
    while at < read.bytes.len() {
        let h = BatchHeader::parse(&read.bytes[at..]).unwrap();
        at += h.total_bytes();
        out.push(h);
    }
    out
}

fn below(rng: &mut SimRng, n: u64) -> u64 {
    rng.next_u64() % n
}

/// Appends a random history; returns every record written and the last offset of the producer's latest batch.
fn write_history(log: &PartitionLog<SimFs>, seed: u64, keys: u64) -> (Vec<(u64, Key, Value)>, Offset) {
    let mut rng = SimRng::new(seed);
    let mut written = Vec::new();
    let mut sequence = 0;
    let mut producer_last = Offset(0);
    for _ in 0..160 {
        let n = 1 + below(&mut rng, 4) as usize;
        let recs: Vec<(Key, Value)> = (0..n)
            .map(|_| {
                let key = format!("key-{}", below(&mut rng, keys)).into_bytes();
                let value = (below(&mut rng, 100) >= 15)
                    .then(|| vec![b'a' + below(&mut rng, 26) as u8; 10 + below(&mut rng, 60) as usize]);
                (Some(key), value)
            })
            .collect();
        let codec = [Compression::None, Compression::Gzip, Compression::Lz4][below(&mut rng, 3) as usize];
        let producer = (below(&mut rng, 4) == 0).then_some((9, sequence));
        let info = block_on(log.append(&batch(&recs, codec, producer), LeaderEpoch(1))).unwrap();
        if producer.is_some() {
            sequence += n as i32;
            producer_last = info.last_offset;
        }
        for (i, (k, v)) in recs.into_iter().enumerate() {
            written.push((info.base_offset.0 + i as u64, k, v));
        }
    }
    block_on(log.flush()).unwrap();
    log.set_high_watermark(log.log_end_offset());
    (written, producer_last)
}

/// What a pass up to `upto` leaves: below it the latest record of each key (without tombstones when
/// they expired), everything from it on.
fn expected(written: &[(u64, Key, Value)], upto: u64, tombstones_expired: bool) -> Vec<(u64, Key, Value)> {
    let mut latest: HashMap<&Key, u64> = HashMap::new();
    for (offset, key, _) in written.iter().filter(|(o, _, _)| *o < upto) {
        latest.insert(key, *offset);
    }
    written
        .iter()
        .filter(|(offset, key, value)| {
            *offset >= upto || (latest[key] == *offset && !(value.is_none() && tombstones_expired))
        })
        .cloned()
        .collect()
}

#[test]
fn a_pass_leaves_the_latest_record_of_each_key_and_tombstones_until_they_expire() {
    for seed in 0..20 {
        let fs = SimFs::new();
        let (dir, log) = open(&fs);
        let mut horizons = Horizons::default();
        let (written, producer_last) = write_history(&log, seed, 15);
        let end = log.log_end_offset();
        let segments = log.segment_count();

        let stats = block_on(clean(&log, config().compaction.unwrap(), T0, 1 << 30, &mut horizons, || false))
            .unwrap()
            .expect("cleaned");
        let upto = log.cleaned_upto();
        assert_eq!(upto, stats.cleaned_upto);
        assert!(upto.0 > 0 && upto <= end, "seed {seed}: {stats:?}");
        assert_eq!(records(&log), expected(&written, upto.0, false), "seed {seed}");
        assert_eq!(log.log_end_offset(), end, "seed {seed}: offsets are never reused");
        let hs = headers(&log);
        assert!(hs.windows(2).all(|w| w[1].base_offset > w[0].base_offset + w[0].last_offset_delta as i64));
        assert!(
            hs.iter()
                .any(|h| h.producer_id == 9 && h.base_offset + h.last_offset_delta as i64 == producer_last.0 as i64),
            "seed {seed}: the producer's latest batch is kept"
        );
        block_on(log.verify_indexes()).unwrap();

        // Past delete.retention.ms the tombstones go too.
        let again = block_on(clean(&log, config().compaction.unwrap(), T0 + 5_000, 1 << 30, &mut horizons, || false))
            .unwrap()
            .expect("cleaned");
        // The first pass shrank the segments; the second merges them.
        assert!(again.segments_after < segments / 2, "seed {seed}: segments merged: {stats:?} then {again:?}");
        let after = records(&log);
        assert_eq!(after, expected(&written, upto.0, true), "seed {seed}");

        // A crash keeps what the passes did.
        block_on(dir.checkpoint()).unwrap();
        drop((log, dir));
        let (_dir, log) = open(&fs.crash(&mut SimRng::new(seed)));
        assert_eq!(records(&log), after, "seed {seed}");
        assert_eq!(log.log_end_offset(), end);
    }
}

#[test]
fn a_small_key_map_cleans_a_prefix_and_the_rest_waits() {
    let fs = SimFs::new();
    let (_dir, log) = open(&fs);
    let mut horizons = Horizons::default();
    let (written, _) = write_history(&log, 99, 1000);
    let closed = log.closed_segments();
    // Room for the keys of a few segments only (a key takes its ~7 bytes and 48 more).
    let stats = block_on(clean(&log, config().compaction.unwrap(), T0, 6_000, &mut horizons, || false))
        .unwrap()
        .expect("cleaned");
    assert!(stats.cleaned_upto > Offset(0) && stats.cleaned_upto < closed.last().unwrap().next_offset, "{stats:?}");
    assert_eq!(records(&log), expected(&written, stats.cleaned_upto.0, false));
    assert!(matches!(
        block_on(clean(&log, config().compaction.unwrap(), T0, 10, &mut horizons, || false)),
        Err(CleanError::MapFull(10))
    ));
}

#[test]
fn a_log_not_dirty_enough_is_left_alone() {
    let fs = SimFs::new();
    let (_dir, log) = open(&fs);
    let mut horizons = Horizons::default();
    write_history(&log, 5, 15);
    let half = CompactionConfig { min_cleanable_dirty_ratio_ppm: 500_000, ..config().compaction.unwrap() };
    block_on(clean(&log, half, T0, 1 << 30, &mut horizons, || false)).unwrap().expect("all dirty at first");
    let before = records(&log);
    assert_eq!(block_on(clean(&log, half, T0, 1 << 30, &mut horizons, || false)).unwrap(), None, "nothing new since");
    assert_eq!(records(&log), before);
    // min.compaction.lag.ms longer than the records' age: nothing is cleanable.
    let lagging = CompactionConfig { min_compaction_lag_ms: 60_000, ..config().compaction.unwrap() };
    assert_eq!(block_on(clean(&log, lagging, T0 + 1_000, 1 << 30, &mut horizons, || false)).unwrap(), None);
}

#[test]
fn the_keyless_records_of_a_batch_are_named_by_their_index() {
    let keyed = batch(&[(Some(b"k".to_vec()), Some(b"v".to_vec()))], Compression::Gzip, None);
    let mixed: Vec<(Key, Value)> = (0..5).map(|i| ((i % 2 == 1).then(|| b"k".to_vec()), Some(b"v".to_vec()))).collect();
    assert_eq!(keyless_records(&keyed).unwrap(), Vec::<i32>::new());
    assert_eq!(keyless_records(&batch(&mixed, Compression::None, None)).unwrap(), vec![0, 2, 4]);
    assert_eq!(keyless_records(&batch(&mixed, Compression::Lz4, None)).unwrap(), vec![0, 2, 4], "inside a codec too");
}

#[test]
fn a_tombstone_stays_delete_retention_ms_from_its_first_cleaning_whatever_its_timestamp() {
    let fs = SimFs::new();
    let (_dir, log) = open(&fs);
    let mut horizons = Horizons::default();
    let (written, _) = write_history(&log, 3, 15);
    let compaction = config().compaction.unwrap();
    // The records' timestamps are 10 s old, ten times delete.retention.ms: the first pass keeps the
    // tombstones all the same, and so does one within delete.retention.ms of it.
    let first = T0 + 10_000;
    let stats = block_on(clean(&log, compaction, first, 1 << 30, &mut horizons, || false)).unwrap().unwrap();
    let upto = stats.cleaned_upto.0;
    let with_tombstones = expected(&written, upto, false);
    assert!(with_tombstones.iter().any(|(o, _, v)| *o < upto && v.is_none()), "the history has tombstones");
    assert_eq!(records(&log), with_tombstones);
    block_on(clean(&log, compaction, first + 900, 1 << 30, &mut horizons, || false)).unwrap();
    assert_eq!(records(&log), with_tombstones);
    block_on(clean(&log, compaction, first + 1_100, 1 << 30, &mut horizons, || false)).unwrap();
    assert_eq!(records(&log), expected(&written, upto, true));
}

#[test]
fn passes_with_a_small_key_map_get_through_the_whole_log() {
    let fs = SimFs::new();
    let (_dir, log) = open(&fs);
    let mut horizons = Horizons::default();
    let (written, _) = write_history(&log, 42, 1000);
    let end = log.closed_segments().last().unwrap().next_offset;
    // Each pass maps only what the last one left dirty, so a map too small for the whole log still gets
    // through it, a few segments a pass.
    let mut passes = 0;
    while log.cleaned_upto() < end {
        passes += 1;
        assert!(passes < 50, "no progress: cleaned up to {}", log.cleaned_upto());
        block_on(clean(&log, config().compaction.unwrap(), T0, 6_000, &mut horizons, || false)).unwrap();
    }
    assert!(passes > 2, "{passes} passes");
    assert_eq!(records(&log), expected(&written, end.0, false));
}

#[test]
fn a_record_whose_offset_delta_lies_outside_its_batch_is_refused() {
    let mut b = batch(&[(Some(b"k".to_vec()), Some(b"v".to_vec()))], Compression::None, None);
    // The record after the 61-byte header: length, attributes, timestamp delta 0, offset delta 0.
    assert_eq!(&b[63..65], &[0, 0]);
    b[64] = 1; // zigzag -1
    let crc = shardlog_storage::batch::compute_crc(&b);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    assert!(keyless_records(&b).is_err());
}

/// `n` batches of one record each over seven keys `<tag>-<i>`.
fn filler(log: &PartitionLog<SimFs>, n: usize, tag: &str) {
    let epoch = log.latest_epoch().unwrap_or(LeaderEpoch(1));
    for i in 0..n {
        let record = [(Some(format!("{tag}-{}", i % 7).into_bytes()), Some(vec![b'x'; 60]))];
        block_on(log.append(&batch(&record, Compression::None, None), epoch)).unwrap();
    }
}

fn key_records(log: &PartitionLog<SimFs>, key: &[u8]) -> Vec<(u64, Key, Value)> {
    records(log).into_iter().filter(|(_, k, _)| k.as_deref() == Some(key)).collect()
}

/// A cleaned log truncated well below where it was cleaned (a follower after an unclean election), then
/// written again: key K gets a value and its tombstone there. Returns the offset it was cleaned up to.
fn truncated_below_the_cleaning(log: &PartitionLog<SimFs>, horizons: &mut Horizons) -> Offset {
    filler(log, 200, "f");
    block_on(log.flush()).unwrap();
    log.set_high_watermark(log.log_end_offset());
    block_on(clean(log, config().compaction.unwrap(), T0, 1 << 30, horizons, || false)).unwrap().unwrap();
    let cleaned = log.cleaned_upto();
    block_on(log.truncate_to(Offset(cleaned.0 / 3))).unwrap();
    let k = |value: Option<&[u8]>| batch(&[(Some(b"K".to_vec()), value.map(<[u8]>::to_vec))], Compression::None, None);
    block_on(log.append(&k(Some(b"old")), LeaderEpoch(2))).unwrap();
    let tombstone = block_on(log.append(&k(None), LeaderEpoch(2))).unwrap();
    assert!(tombstone.base_offset < cleaned, "written again below the old cleaning");
    filler(log, 300, "g");
    block_on(log.flush()).unwrap();
    log.set_high_watermark(log.log_end_offset());
    cleaned
}

#[test]
fn what_a_truncation_wrote_again_below_the_cleaning_counts_as_not_cleaned_across_a_restart() {
    let fs = SimFs::new();
    let (dir, log) = open(&fs);
    truncated_below_the_cleaning(&log, &mut Horizons::default());
    block_on(dir.close()).unwrap();
    drop((log, dir));
    let (_dir, log) = open(&fs);
    let mut horizons = Horizons::default();
    let compaction = config().compaction.unwrap();
    block_on(clean(&log, compaction, T0 + 10_000, 1 << 30, &mut horizons, || false)).unwrap();
    block_on(clean(&log, compaction, T0 + 20_000, 1 << 30, &mut horizons, || false)).unwrap();
    let k = key_records(&log, b"K");
    assert!(k.is_empty(), "the value is gone with its tombstone, not brought back: {k:?}");
}

#[test]
fn a_tombstone_written_again_after_a_truncation_is_not_taken_for_one_cleaned_before_it() {
    let fs = SimFs::new();
    let (_dir, log) = open(&fs);
    let mut horizons = Horizons::default();
    truncated_below_the_cleaning(&log, &mut horizons);
    // The first pass to reach the tombstone, 5 s after the pass before the truncation: it stays.
    block_on(clean(&log, config().compaction.unwrap(), T0 + 5_000, 1 << 30, &mut horizons, || false)).unwrap();
    let k = key_records(&log, b"K");
    assert_eq!(k.len(), 1, "{k:?}");
    assert_eq!(k[0].2, None, "the tombstone, the value before it gone");
}

/// Producer `id`'s transactional batch of `records` at sequence `seq`.
fn txn_batch(records: &[(Key, Value)], id: i64, seq: i32) -> Vec<u8> {
    let mut b = batch(records, Compression::None, Some((id, seq)));
    let attributes = i16::from_be_bytes([b[21], b[22]]) | TRANSACTIONAL_BIT;
    b[21..23].copy_from_slice(&attributes.to_be_bytes());
    let crc = shardlog_storage::batch::compute_crc(&b);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

#[test]
fn aborted_records_go_at_once_and_their_marker_once_no_batch_of_them_is_left_and_its_horizon_passed() {
    use shardlog_storage::txn::{MarkerKind, TxnMarker};
    let fs = SimFs::new();
    let (_dir, log) = open(&fs);
    let mut horizons = Horizons::default();
    let epoch = LeaderEpoch(1);
    let kv = |k: &str, v: &str| (Some(k.as_bytes().to_vec()), Some(v.as_bytes().to_vec()));
    let marker = |kind, producer_id| TxnMarker { kind, producer_id, producer_epoch: 0, coordinator_epoch: 0 };
    filler(&log, 20, "f");
    block_on(log.append(&txn_batch(&[kv("a", "aborted"), kv("b", "aborted")], 7, 0), epoch)).unwrap();
    block_on(log.append(&txn_batch(&[kv("c", "committed")], 8, 0), epoch)).unwrap();
    let abort = block_on(log.append_marker(marker(MarkerKind::Abort, 7), epoch)).unwrap().base_offset;
    let commit = block_on(log.append_marker(marker(MarkerKind::Commit, 8), epoch)).unwrap().base_offset;
    // Producer 7 goes on: its aborted batch is not its latest, which the cleaner would keep (empty) for
    // its sequence state, and with it the marker, as Kafka's does.
    block_on(log.append(&txn_batch(&[kv("d", "recommitted")], 7, 2), epoch)).unwrap();
    block_on(log.append_marker(marker(MarkerKind::Commit, 7), epoch)).unwrap();
    filler(&log, 200, "g");
    block_on(log.flush()).unwrap();
    log.set_high_watermark(log.log_end_offset());
    assert_eq!(log.aborted_index().len(), 1);
    let compaction = config().compaction.unwrap();
    let values = |log: &PartitionLog<SimFs>| {
        records(log).into_iter().filter_map(|(_, _, v)| v).filter(|v| v.ends_with(b"ted")).collect::<Vec<_>>()
    };
    let has_batch_at =
        |log: &PartitionLog<SimFs>, at: Offset| headers(log).iter().any(|h| h.base_offset as u64 == at.0);

    block_on(clean(&log, compaction, T0, 1 << 30, &mut horizons, || false)).unwrap().unwrap();
    assert_eq!(
        values(&log),
        [b"committed".to_vec(), b"recommitted".to_vec()],
        "the aborted records went, the committed stayed"
    );
    assert!(has_batch_at(&log, abort) && has_batch_at(&log, commit), "the pass met their batches: kept");
    // The next pass meets no batch of the aborted transaction, but its marker was first cleaned less than
    // delete.retention.ms ago.
    block_on(clean(&log, compaction, T0 + 900, 1 << 30, &mut horizons, || false)).unwrap();
    assert!(has_batch_at(&log, abort));
    block_on(clean(&log, compaction, T0 + 1_100, 1 << 30, &mut horizons, || false)).unwrap();
    assert!(!has_batch_at(&log, abort), "the ABORT marker went");
    assert!(has_batch_at(&log, commit), "the COMMIT marker stays while its transaction's batch does");
    assert!(log.aborted_index().is_empty(), "and its .txnindex entry with it");
    assert_eq!(values(&log), [b"committed".to_vec(), b"recommitted".to_vec()]);
}
