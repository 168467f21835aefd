//! Model test: random sequences of appends, reads, truncations, rolls, retention, DeleteRecords and
//! close/reopen against an in-memory model of the log. Every read must return exactly what the model says.

mod common;

use std::path::Path;
use std::rc::Rc;

use futures_lite::future::block_on;
use proptest::prelude::*;
use shardlog_storage::epoch_cache::LeaderEpochCache;
use shardlog_storage::fs::sim::SimFs;
use shardlog_storage::log::OpenHints;
use shardlog_storage::{LeaderEpoch, LogConfig, Offset, PartitionLog, Recovery};

use common::{ManualClock, make_batch, small_config, split_batches};

#[derive(Debug, Clone)]
enum Op {
    Append {
        records: usize,
        value_len: usize,
        epoch_bump: bool,
    },
    Read {
        from_pct: u8,
        max_bytes: usize,
    },
    /// Reads on from where the last read ended, as a consumer does.
    ReadOn {
        max_bytes: usize,
    },
    ReadUntil {
        from_pct: u8,
        end_pct: u8,
    },
    TimeLookup {
        ts_pct: u8,
    },
    Truncate {
        to_pct: u8,
    },
    Roll,
    RetainBytes {
        keep: u64,
    },
    DeleteRecords {
        to_pct: u8,
    },
    Flush,
    ReleaseCache,
    Reopen {
        clean: bool,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        8 => (1usize..6, 1usize..400, prop::bool::weighted(0.1))
            .prop_map(|(records, value_len, epoch_bump)| Op::Append { records, value_len, epoch_bump }),
        4 => (any::<u8>(), 1usize..5000).prop_map(|(from_pct, max_bytes)| Op::Read { from_pct, max_bytes }),
        3 => (1usize..5000).prop_map(|max_bytes| Op::ReadOn { max_bytes }),
        1 => (any::<u8>(), any::<u8>()).prop_map(|(from_pct, end_pct)| Op::ReadUntil { from_pct, end_pct }),
        1 => any::<u8>().prop_map(|ts_pct| Op::TimeLookup { ts_pct }),
        1 => any::<u8>().prop_map(|to_pct| Op::Truncate { to_pct }),
        1 => Just(Op::Roll),
        1 => (2_000u64..30_000).prop_map(|keep| Op::RetainBytes { keep }),
        1 => any::<u8>().prop_map(|to_pct| Op::DeleteRecords { to_pct }),
        1 => Just(Op::Flush),
        1 => Just(Op::ReleaseCache),
        1 => any::<bool>().prop_map(|clean| Op::Reopen { clean }),
    ]
}

/// One batch as the model remembers it: offsets, epoch, timestamp and the bytes the log must return.
#[derive(Debug, Clone)]
struct ModelBatch {
    base: u64,
    last: u64,
    epoch: i32,
    max_ts: i64,
    bytes: Vec<u8>,
}

#[derive(Debug, Default)]
struct Model {
    batches: Vec<ModelBatch>,
    log_start: u64,
    epoch: i32,
}

impl Model {
    fn log_end(&self) -> u64 {
        self.batches.last().map_or(self.log_start, |b| b.last + 1)
    }

    fn log_end_of_batches(&self) -> u64 {
        self.batches.last().map_or(0, |b| b.last + 1)
    }

    fn pick(&self, pct: u8) -> u64 {
        let span = self.log_end() - self.log_start;
        self.log_start + span * pct as u64 / 255
    }

    /// The batches a read from `from` must return: the one holding `from` and as many after it as fit.
    fn expected_read(&self, from: u64, max_bytes: usize, end: u64) -> Vec<&ModelBatch> {
        let mut out = Vec::new();
        let mut total = 0;
        for b in self.batches.iter().filter(|b| b.last >= from) {
            if b.last >= end || (!out.is_empty() && total + b.bytes.len() > max_bytes) {
                break;
            }
            total += b.bytes.len();
            out.push(b);
        }
        out
    }

    fn epochs(&self) -> LeaderEpochCache {
        let mut cache = LeaderEpochCache::default();
        for b in &self.batches {
            cache.assign(LeaderEpoch(b.epoch), Offset(b.base));
        }
        cache.clamp(Offset(self.log_start), Offset(self.log_end()));
        cache
    }
}

fn open_log(fs: &SimFs, clock: &Rc<ManualClock>, config: LogConfig, hints: OpenHints) -> PartitionLog<SimFs> {
    let (log, report) =
        block_on(PartitionLog::open(fs.clone(), clock.clone(), Path::new("/data/t-0"), config, hints)).expect("open");
    assert_eq!(report.damage, None, "a log that never crashed has no damage");
    log
}

fn check_read(
    log: &PartitionLog<SimFs>,
    model: &Model,
    from: u64,
    max_bytes: usize,
    end: u64,
) -> Result<u64, TestCaseError> {
    let read = block_on(log.read_until(Offset(from), max_bytes, Offset(end))).expect("read in range");
    let got = split_batches(&read.bytes);
    let want = model.expected_read(from, max_bytes, end);
    prop_assert_eq!(got.len(), want.len(), "batch count reading from {} max {}", from, max_bytes);
    for ((base, last, bytes), w) in got.iter().zip(&want) {
        prop_assert_eq!((*base, *last), (w.base, w.last));
        prop_assert!(bytes == &w.bytes, "bytes of batch {} differ", base);
    }
    let next = want.last().map_or(from, |b| b.last + 1);
    prop_assert_eq!(read.next_offset, Offset(next));
    Ok(next)
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let config = small_config();
    let mut log = open_log(&fs, &clock, config.clone(), OpenHints::default());
    let mut model = Model::default();
    let mut seed = 0u64;
    // Where the last read ended.
    let mut read_next = 0u64;
    for op in ops {
        clock.advance(7);
        match op {
            Op::Append { records, value_len, epoch_bump } => {
                if epoch_bump {
                    model.epoch += 1;
                }
                seed += 1;
                let ts = clock.0.get();
                let batch = make_batch(seed, records, value_len, ts);
                let info = block_on(log.append(&batch, LeaderEpoch(model.epoch))).expect("append");
                prop_assert_eq!(info.base_offset, Offset(model.log_end()));
                let mut stored = batch.clone();
                shardlog_storage::batch::stamp(&mut stored, info.base_offset, LeaderEpoch(model.epoch));
                model.batches.push(ModelBatch {
                    base: info.base_offset.0,
                    last: info.last_offset.0,
                    epoch: model.epoch,
                    max_ts: ts,
                    bytes: stored,
                });
            }
            Op::Read { from_pct, max_bytes } => {
                let from = model.pick(from_pct);
                read_next = check_read(&log, &model, from, max_bytes, u64::MAX)?;
            }
            Op::ReadOn { max_bytes } => {
                // (From the start again once the log no longer holds that offset.)
                let from =
                    if (model.log_start..=model.log_end()).contains(&read_next) { read_next } else { model.log_start };
                read_next = check_read(&log, &model, from, max_bytes, u64::MAX)?;
            }
            Op::ReadUntil { from_pct, end_pct } => {
                let from = model.pick(from_pct);
                let end = model.pick(end_pct).max(from);
                read_next = check_read(&log, &model, from, 1 << 20, end)?;
            }
            Op::TimeLookup { ts_pct } => {
                let (lo, hi) = (model.batches.first().map_or(0, |b| b.max_ts), clock.0.get());
                let ts = lo + (hi - lo) * ts_pct as i64 / 255;
                let want = model
                    .batches
                    .iter()
                    .filter(|b| b.last >= model.log_start)
                    .find(|b| b.max_ts >= ts)
                    .map(|b| (Offset(b.base.max(model.log_start)), b.max_ts));
                prop_assert_eq!(block_on(log.offset_for_timestamp(ts)).expect("lookup"), want);
            }
            Op::Truncate { to_pct } => {
                let to = model.pick(to_pct);
                let new_end = block_on(log.truncate_to(Offset(to))).expect("truncate");
                model.batches.retain(|b| b.last < to);
                model.log_start = model.log_start.min(model.log_end_of_batches());
                prop_assert_eq!(new_end, Offset(model.log_end()));
            }
            Op::Roll => block_on(log.roll()).expect("roll"),
            Op::RetainBytes { keep } => {
                log.set_config(LogConfig { retention_bytes: Some(keep), ..config.clone() }).expect("config");
                log.set_high_watermark(log.log_end_offset());
                block_on(log.apply_retention()).expect("retention");
                log.set_config(config.clone()).expect("config");
                let start = log.log_start_offset().0;
                prop_assert!(start >= model.log_start);
                prop_assert!(log.segment_bases().contains(&Offset(start)) || start == model.log_start);
                if log.segment_count() > 1 {
                    let first = log.segment_bases()[1].0 - log.segment_bases()[0].0;
                    prop_assert!(first > 0);
                }
                model.log_start = start;
            }
            Op::DeleteRecords { to_pct } => {
                let to = model.pick(to_pct);
                let start = block_on(log.delete_records(Offset(to))).expect("delete records");
                model.log_start = model.log_start.max(to);
                prop_assert_eq!(start, Offset(model.log_start));
            }
            Op::ReleaseCache => {
                block_on(log.release_cache()).expect("release");
                prop_assert!(log.cached_bytes() <= 4096);
            }
            Op::Flush => {
                block_on(log.flush()).expect("flush");
                prop_assert_eq!(log.durable_offset(), Offset(model.log_end()));
            }
            Op::Reopen { clean } => {
                let hints = OpenHints {
                    recovery: if clean { Recovery::Clean } else { Recovery::FromRecoveryPoint(log.recovery_point()) },
                    log_start: log.log_start_offset(),
                    high_watermark: Offset::ZERO,
                    ..OpenHints::default()
                };
                if clean {
                    block_on(log.close()).expect("close");
                } else {
                    // A process crash: what was written to the file survives, what was only in memory does not.
                    block_on(log.write_out()).expect("write out");
                }
                drop(log);
                log = open_log(&fs, &clock, config.clone(), hints);
            }
        }
        prop_assert_eq!(log.log_end_offset(), Offset(model.log_end()));
        prop_assert_eq!(log.log_start_offset(), Offset(model.log_start));
        prop_assert_eq!(log.leader_epochs(), model.epochs());
    }
    // Every batch the model holds reads back, one at a time and all at once.
    for b in model.batches.iter().filter(|b| b.last >= model.log_start) {
        check_read(&log, &model, b.base.max(model.log_start), 1, u64::MAX)?;
    }
    check_read(&log, &model, model.log_start, usize::MAX, u64::MAX)?;
    prop_assert_eq!(block_on(log.verify_indexes()), Ok(()));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn log_matches_model_under_random_operations(ops in prop::collection::vec(op(), 1..120)) {
        run(ops)?;
    }
}
