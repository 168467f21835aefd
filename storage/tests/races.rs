//! Races between an operation waiting for the disk and the operations that run meanwhile: each of these
//! once lost data, hung or panicked.
//!
//! `GateFs` wraps `SimFs` so a test can stop one file operation part-way (the future returns `Pending`
//! until released) and interleave other operations with it, as glommio would while the I/O is in flight.
//! Futures are polled by hand with a no-op waker.

mod common;

use std::cell::Cell;
use std::future::Future;
use std::io;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use futures_lite::future::block_on;
use shardlog_storage::epoch_cache::LeaderEpochCache;
use shardlog_storage::fs::sim::{SimFile, SimFs, SimRng};
use shardlog_storage::fs::{Fs, SegmentFile};
use shardlog_storage::log::{LEADER_EPOCH_FILE, OpenHints};
use shardlog_storage::{AppendInfo, LeaderEpoch, LogConfig, Offset, PartitionLog, Recovery, StorageError};

use common::{ManualClock, make_batch, split_batches};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Gate {
    /// The next read (its data is fetched first, then the caller is held: a read that completed before
    /// whatever runs while it is held).
    Read,
    /// The next fdatasync of any file.
    Fdatasync,
    /// The next `truncate(0)` of a `.log` file (what `create_segment` does to a new segment).
    TruncateNewSegment,
    /// The next `open` of the leader-epoch temporary file.
    OpenEpochTmp,
    /// The next direct write (held before it lands).
    Write,
}

#[derive(Debug, Default)]
struct GateState {
    armed: Cell<Option<Gate>>,
    held: Cell<bool>,
    released: Cell<bool>,
    bytes_read: Cell<u64>,
}

impl GateState {
    async fn pass(&self, gate: Gate) {
        if self.armed.get() != Some(gate) {
            return;
        }
        self.armed.set(None);
        self.held.set(true);
        while !self.released.get() {
            futures_lite::future::yield_now().await;
        }
        self.held.set(false);
        self.released.set(false);
    }
}

#[derive(Debug, Clone)]
struct GateFs {
    sim: SimFs,
    gate: Rc<GateState>,
}

#[derive(Debug)]
struct GateFile {
    file: SimFile,
    path: PathBuf,
    gate: Rc<GateState>,
}

impl SegmentFile for GateFile {
    type Buf = Vec<u8>;
    fn alloc(&self, len: usize) -> Vec<u8> {
        self.file.alloc(len)
    }
    async fn write_at(&self, buf: Vec<u8>, pos: u64) -> io::Result<()> {
        self.gate.pass(Gate::Write).await;
        self.file.write_at(buf, pos).await
    }
    async fn write_shared(&self, buf: Rc<Vec<u8>>, pos: u64) -> io::Result<()> {
        self.gate.pass(Gate::Write).await;
        self.file.write_shared(buf, pos).await
    }
    fn write_cached(&self, pos: u64, bytes: &[u8]) -> io::Result<()> {
        self.file.write_cached(pos, bytes)
    }
    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        let r = self.file.read_at(pos, len).await;
        if let Ok(b) = &r {
            self.gate.bytes_read.set(self.gate.bytes_read.get() + b.len() as u64);
        }
        self.gate.pass(Gate::Read).await;
        r
    }
    async fn fdatasync(&self) -> io::Result<()> {
        self.gate.pass(Gate::Fdatasync).await;
        self.file.fdatasync().await
    }
    async fn truncate(&self, len: u64) -> io::Result<()> {
        if len == 0 && self.path.extension().is_some_and(|e| e == "log") {
            self.gate.pass(Gate::TruncateNewSegment).await;
        }
        self.file.truncate(len).await
    }
    async fn size(&self) -> io::Result<u64> {
        self.file.size().await
    }

    async fn allocate(&self, size: u64) -> io::Result<()> {
        self.file.allocate(size).await
    }
}

impl Fs for GateFs {
    type File = GateFile;
    async fn open(&self, path: &Path, create: bool) -> io::Result<GateFile> {
        if path.to_string_lossy().ends_with("leader-epoch-checkpoint.tmp") {
            self.gate.pass(Gate::OpenEpochTmp).await;
        }
        let file = self.sim.open(path, create).await?;
        Ok(GateFile { file, path: path.to_path_buf(), gate: self.gate.clone() })
    }
    async fn remove(&self, path: &Path) -> io::Result<()> {
        self.sim.remove(path).await
    }
    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.sim.rename(from, to).await
    }
    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        self.sim.sync_dir(path).await
    }
    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        self.sim.create_dir_all(path).await
    }
    async fn remove_dir(&self, path: &Path) -> io::Result<()> {
        self.sim.remove_dir(path).await
    }
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        self.sim.list_dir(path)
    }
    fn exists(&self, path: &Path) -> bool {
        self.sim.exists(path)
    }
    fn is_dir(&self, path: &Path) -> bool {
        self.sim.is_dir(path)
    }
    fn free_bytes(&self, path: &Path) -> io::Result<u64> {
        self.sim.free_bytes(path)
    }
    fn device_flush_check(&self, dir: &Path) -> Result<(), String> {
        self.sim.device_flush_check(dir)
    }
    fn alloc_kept(&self, len: usize) -> Vec<u8> {
        self.sim.alloc_kept(len)
    }
}

const DIR: &str = "/data/t-0";

fn poll<F: Future + ?Sized>(f: Pin<&mut F>) -> Poll<F::Output> {
    f.poll(&mut Context::from_waker(Waker::noop()))
}

/// Polls until the gate holds the future (asserting it does).
fn poll_until_held<F: Future + ?Sized>(mut f: Pin<&mut F>, gate: &GateState) {
    for _ in 0..1000 {
        assert!(poll(f.as_mut()).is_pending(), "the operation finished without reaching the gate");
        if gate.held.get() {
            return;
        }
    }
    panic!("the gate was never reached");
}

fn finish<F: Future + ?Sized>(mut f: Pin<&mut F>) -> F::Output {
    for _ in 0..100_000 {
        if let Poll::Ready(v) = poll(f.as_mut()) {
            return v;
        }
    }
    panic!("operation never finished");
}

fn open(fs: GateFs, config: LogConfig, clock: Rc<ManualClock>) -> PartitionLog<GateFs> {
    block_on(PartitionLog::open(fs, clock, Path::new(DIR), config, OpenHints::default())).unwrap().0
}

fn new_fs() -> GateFs {
    GateFs { sim: SimFs::new(), gate: Rc::new(GateState::default()) }
}

fn cfg() -> LogConfig {
    LogConfig { retention_ms: None, tail_cache_bytes: 0, ..LogConfig::default() }
}

/// A log holding one durable batch and one appended since, with the gate armed for the next fdatasync:
/// waiting for the second batch's durability stops at the gate. The leader-epoch file is written (and
/// synced) by the first sync, out of the way before the gate.
fn log_with_an_append_before_an_armed_fdatasync() -> (GateFs, PartitionLog<GateFs>, AppendInfo) {
    let fs = new_fs();
    let log = open(fs.clone(), cfg(), ManualClock::new(1_700_000_000_000));
    block_on(log.append(&make_batch(0, 2, 100, 1), LeaderEpoch(0))).unwrap();
    block_on(log.flush()).unwrap();
    let appended = block_on(log.append(&make_batch(1, 2, 100, 1), LeaderEpoch(0))).unwrap();
    fs.gate.armed.set(Some(Gate::Fdatasync));
    (fs, log, appended)
}

/// An append made while a roll seals the active segment must wait for the new segment: landing in the
/// old one after its seal recorded the size would have it reported durable without ever being written.
#[test]
fn append_during_roll_waits_and_what_is_reported_durable_survives() {
    let fs = new_fs();
    let clock = ManualClock::new(1_700_000_000_000);
    let log = open(fs.clone(), cfg(), clock.clone());
    block_on(log.append(&make_batch(1, 2, 100, 1), LeaderEpoch(0))).unwrap();
    block_on(log.flush()).unwrap();

    fs.gate.armed.set(Some(Gate::Fdatasync));
    let mut roll = Box::pin(log.roll());
    poll_until_held(roll.as_mut(), &fs.gate);
    // A producer's append while the seal's fdatasync is under way waits for the roll to finish.
    let second = make_batch(2, 2, 100, 1);
    let mut append = Box::pin(log.append(&second, LeaderEpoch(0)));
    assert!(poll(append.as_mut()).is_pending(), "an append must not land in a segment being sealed");
    fs.gate.released.set(true);
    finish(roll.as_mut()).unwrap();
    drop(roll);
    let b = finish(append.as_mut()).unwrap();
    assert_eq!(b.base_offset, Offset(2));
    assert_eq!(log.segment_bases(), vec![Offset(0), Offset(2)], "the waiting append went to the new segment");

    block_on(log.wait_durable(b.next_offset())).expect("wait_durable");
    let durable = log.durable_offset();
    assert!(durable >= b.next_offset());

    // Power loss now: everything reported durable must survive.
    let crashed = fs.sim.crash(&mut SimRng::new(7));
    let hints = OpenHints { recovery: Recovery::FromRecoveryPoint(durable), ..OpenHints::default() };
    let (reopened, report) =
        block_on(PartitionLog::open(crashed, clock, Path::new(DIR), cfg(), hints)).expect("reopen");
    assert!(
        reopened.log_end_offset() >= durable,
        "durable offset {durable} was reported, log end after the crash is {} ({report:?})",
        reopened.log_end_offset()
    );
}

/// Cancelling an append while it rolls (a client disconnect) must not leave an empty segment file whose
/// base lies inside the active segment: on the next open it would make every later segment look like
/// it follows damage.
#[test]
fn cancelled_roll_leaves_no_stray_segment_that_costs_data_on_reopen() {
    let fs = new_fs();
    let clock = ManualClock::new(1_700_000_000_000);
    let config = LogConfig { segment_bytes: 8192, index_interval_bytes: 1 << 20, ..cfg() };
    let log = open(fs.clone(), config.clone(), clock.clone());
    while log.size_bytes() < 7000 {
        block_on(log.append(&make_batch(1, 1, 1000, 1), LeaderEpoch(0))).unwrap();
    }
    fs.gate.armed.set(Some(Gate::TruncateNewSegment));
    let big = make_batch(2, 1, 1000, 1);
    let mut append = Box::pin(log.append(&big, LeaderEpoch(0)));
    poll_until_held(append.as_mut(), &fs.gate);
    drop(append); // cancelled inside create_segment
    fs.gate.released.set(false);

    // A small batch still fits the old segment; then a big one rolls for real.
    block_on(log.append(&make_batch(3, 1, 100, 1), LeaderEpoch(0))).unwrap();
    block_on(log.append(&make_batch(4, 1, 1000, 1), LeaderEpoch(0))).unwrap();
    block_on(log.flush()).unwrap();
    let end = log.log_end_offset();
    assert_eq!(log.segment_count(), 2);
    block_on(log.close()).unwrap();
    drop(log);

    let hints = OpenHints { recovery: Recovery::Clean, ..OpenHints::default() };
    let (reopened, report) =
        block_on(PartitionLog::open(fs.sim.clone(), clock, Path::new(DIR), config, hints)).expect("reopen");
    assert_eq!(reopened.log_end_offset(), end, "data lost after a clean close: {report:?}");
}

/// The epoch file counts as written only once it is: a sync whose future was dropped while writing it
/// must not let a later durable offset cover data whose epoch is not on disk.
#[test]
fn cancelled_sync_does_not_leave_the_epoch_file_behind_the_durable_offset() {
    let fs = new_fs();
    let clock = ManualClock::new(1_700_000_000_000);
    let log = open(fs.clone(), cfg(), clock);
    block_on(log.append(&make_batch(1, 1, 100, 1), LeaderEpoch(0))).unwrap();
    block_on(log.flush()).unwrap();
    let b = block_on(log.append(&make_batch(2, 1, 100, 1), LeaderEpoch(1))).unwrap();

    fs.gate.armed.set(Some(Gate::OpenEpochTmp));
    let mut wait = Box::pin(log.wait_durable(b.next_offset()));
    poll_until_held(wait.as_mut(), &fs.gate);
    drop(wait); // the produce request went away
    fs.gate.released.set(false);

    block_on(log.flush()).unwrap();
    assert!(log.durable_offset() >= b.next_offset());
    let path = Path::new(DIR).join(LEADER_EPOCH_FILE);
    let text = String::from_utf8(fs.sim.contents(&path).unwrap()).unwrap();
    let on_disk = LeaderEpochCache::decode(&path, &text).unwrap();
    assert_eq!(on_disk, log.leader_epochs(), "durable data's epoch is not in the epoch file");
}

/// A read waiting for the disk while `truncate_to` cuts the segment under it reads again (or reports an
/// error), never panics the shard.
#[test]
fn read_racing_truncation_retries_instead_of_panicking() {
    let fs = new_fs();
    let clock = ManualClock::new(1_700_000_000_000);
    let config = LogConfig { index_interval_bytes: 300, ..cfg() };
    let log = open(fs.clone(), config, clock);
    block_on(log.append(&make_batch(1, 1, 5000, 1), LeaderEpoch(0))).unwrap();
    block_on(log.flush()).unwrap();

    fs.gate.armed.set(Some(Gate::Read));
    let mut read = Box::pin(log.read(Offset(0), 1));
    poll_until_held(read.as_mut(), &fs.gate);
    assert_eq!(block_on(log.truncate_to(Offset(0))).unwrap(), Offset(0));
    fs.gate.released.set(true);
    let outcome = catch_unwind(AssertUnwindSafe(|| finish(read.as_mut())));
    let result = outcome.expect("a read racing truncate_to panicked");
    assert!(
        matches!(result, Ok(_) | Err(StorageError::OffsetOutOfRange { .. })),
        "a read racing truncation should retry, got {result:?}"
    );
}

/// A small fetch of old data in a large active segment reads only around what it returns.
#[test]
fn small_read_of_old_data_in_active_segment_reads_only_what_it_needs() {
    let fs = new_fs();
    let clock = ManualClock::new(1_700_000_000_000);
    let config = LogConfig { tail_cache_bytes: 64 << 10, ..cfg() };
    let log = open(fs.clone(), config, clock);
    for i in 0..2000 {
        block_on(log.append(&make_batch(i, 1, 1000, 1), LeaderEpoch(0))).unwrap();
    }
    block_on(log.flush()).unwrap();
    fs.gate.bytes_read.set(0);
    let read = block_on(log.read(Offset(0), 1000)).unwrap();
    assert!(!read.bytes.is_empty());
    let bytes = fs.gate.bytes_read.get();
    assert!(bytes <= 64 << 10, "a 1000-byte fetch read {bytes} bytes from disk");
}

/// Appends waiting while a close runs (paused, or held back by the unwritten-bytes bound) fail with
/// `Closed` once it is done.
#[test]
fn appends_waiting_on_a_close_fail_with_closed() {
    let (second, third) = (make_batch(2, 1, 100, 1), make_batch(3, 1, 100, 1));
    let fs = new_fs();
    let clock = ManualClock::new(1_700_000_000_000);
    let config = LogConfig { max_unwritten_bytes: 1, ..cfg() };
    let log = open(fs.clone(), config, clock);
    block_on(log.append(&make_batch(1, 1, 100, 1), LeaderEpoch(0))).unwrap();

    fs.gate.armed.set(Some(Gate::Fdatasync));
    let mut close = Box::pin(log.close());
    poll_until_held(close.as_mut(), &fs.gate);
    // Appends during the close wait (one paused by the close, one also over the unwritten bound)...
    let mut paused = Box::pin(log.append(&second, LeaderEpoch(0)));
    assert!(poll(paused.as_mut()).is_pending());
    let mut blocked = Box::pin(log.append(&third, LeaderEpoch(0)));
    assert!(poll(blocked.as_mut()).is_pending());
    fs.gate.released.set(true);
    finish(close.as_mut()).unwrap();
    // ...and fail with Closed once it is done, instead of hanging.
    for mut append in [paused, blocked] {
        let mut outcome = Poll::Pending;
        for _ in 0..100 {
            outcome = poll(append.as_mut());
            if outcome.is_ready() {
                break;
            }
        }
        assert!(
            matches!(outcome, Poll::Ready(Err(StorageError::Closed(_)))),
            "append waiting on a close is still pending after it: {outcome:?}"
        );
    }
}

/// Producer 7's batch of 3 records at sequence `seq`.
fn producer_batch(seq: i32, seed: u64) -> Vec<u8> {
    let mut b = make_batch(seed, 3, 100, 1);
    common::set_producer(&mut b, 7, 0, seq);
    b
}

#[test]
fn a_truncation_cut_short_after_the_cut_leaves_no_producer_state_of_the_cut_batches() {
    let fs = new_fs();
    let clock = ManualClock::new(1_700_000_000_000);
    let log = open(fs.clone(), cfg(), clock);
    block_on(log.append(&producer_batch(0, 1), LeaderEpoch(0))).unwrap();
    let cut = block_on(log.append(&producer_batch(3, 2), LeaderEpoch(1))).unwrap();
    block_on(log.flush()).unwrap();
    // Held after the file is cut (at the epoch file's rewrite), then dropped.
    fs.gate.armed.set(Some(Gate::OpenEpochTmp));
    let mut truncation = Box::pin(log.truncate_to(cut.base_offset));
    poll_until_held(truncation.as_mut(), &fs.gate);
    drop(truncation);
    fs.gate.released.set(false);
    assert_eq!(log.log_end_offset(), cut.base_offset);
    // The retry of the cut batch is a new batch, appended at the new end, not a duplicate of offsets the
    // log no longer holds.
    let again = block_on(log.append(&producer_batch(3, 2), LeaderEpoch(1))).unwrap();
    assert!(!again.duplicate);
    assert_eq!(again.base_offset, cut.base_offset);
    assert_eq!(log.producer_states().get(7).unwrap().batches.len(), 2);
}

/// While an fdatasync is under way, a small append's durability wait starts no second one: it waits and
/// goes with the next, so appends arriving one by one share fdatasyncs. A write-out big enough to be
/// worth overlapping with the sync under way starts its own at once.
#[test]
fn a_small_append_waits_for_the_sync_under_way_and_a_big_one_overlaps_it() {
    let (fs, log, first) = log_with_an_append_before_an_armed_fdatasync();
    let mut first_sync = Box::pin(log.wait_durable(first.next_offset()));
    poll_until_held(first_sync.as_mut(), &fs.gate);

    let writes = fs.sim.write_count();
    let small = block_on(log.append(&make_batch(2, 2, 100, 1), LeaderEpoch(0))).unwrap();
    let mut small_sync = Box::pin(log.wait_durable(small.next_offset()));
    for _ in 0..100 {
        assert!(poll(small_sync.as_mut()).is_pending(), "a small append waits for the sync under way");
    }
    assert_eq!(fs.sim.write_count(), writes, "no second sync (its write-out) for a small append");

    let big = block_on(log.append(&make_batch(3, 40, 4000, 1), LeaderEpoch(0))).unwrap();
    finish(Box::pin(log.wait_durable(big.next_offset())).as_mut()).unwrap();
    assert!(fs.gate.held.get(), "the big append's sync ran beside the one still under way");
    assert!(fs.sim.write_count() > writes);

    fs.gate.released.set(true);
    finish(first_sync.as_mut()).unwrap();
    finish(small_sync.as_mut()).unwrap();
    assert_eq!(log.durable_offset(), big.next_offset());
}

/// A batch appended while `release_cache` writes out what waited in memory stays in the log: the release
/// keeps what came during its write.
#[test]
fn an_append_during_a_cache_release_is_kept() {
    let fs = new_fs();
    let clock = ManualClock::new(1_700_000_000_000);
    let log = open(fs.clone(), cfg(), clock);
    block_on(log.append(&make_batch(0, 1, 5000, 1), LeaderEpoch(0))).unwrap();
    fs.gate.armed.set(Some(Gate::Write));
    let mut release = Box::pin(log.release_cache());
    poll_until_held(release.as_mut(), &fs.gate);
    let during = block_on(log.append(&make_batch(1, 1, 5000, 1), LeaderEpoch(0))).unwrap();
    fs.gate.released.set(true);
    finish(release.as_mut()).expect("released");
    block_on(log.flush()).unwrap();
    let read = block_on(log.read(Offset(0), usize::MAX)).unwrap();
    let batches = split_batches(&read.bytes);
    assert_eq!(batches.len(), 2, "both batches are in the log");
    assert_eq!(batches[1].0, during.base_offset.0);
}

/// A waker that counts how often it is woken.
#[derive(Default)]
struct CountingWaker(std::sync::atomic::AtomicUsize);

impl std::task::Wake for CountingWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Appends waiting for the sync under way are woken when it ends, not by write-outs meanwhile: with
/// hundreds of appends in flight on one partition, each write-out waking every waiter to look again cost
/// more than the appends themselves.
#[test]
fn waiters_for_a_sync_are_woken_when_it_ends_and_not_by_write_outs() {
    let (fs, log, first) = log_with_an_append_before_an_armed_fdatasync();
    let mut first_sync = Box::pin(log.wait_durable(first.next_offset()));
    poll_until_held(first_sync.as_mut(), &fs.gate);

    let wakes = std::sync::Arc::new(CountingWaker::default());
    let waker = Waker::from(wakes.clone());
    let mut waiters = Vec::new();
    for seq in 2..12 {
        let appended = block_on(log.append(&make_batch(seq, 2, 100, 1), LeaderEpoch(0))).unwrap();
        let mut waiter = Box::pin(log.wait_durable(appended.next_offset()));
        assert!(waiter.as_mut().poll(&mut Context::from_waker(&waker)).is_pending());
        waiters.push(waiter);
    }
    // Write-outs move nothing a waiter waits for.
    for seq in 12..15 {
        block_on(log.append(&make_batch(seq, 2, 100, 1), LeaderEpoch(0))).unwrap();
        block_on(log.write_out()).unwrap();
    }
    assert_eq!(wakes.0.load(std::sync::atomic::Ordering::Relaxed), 0, "no waiter woken by a write-out");

    fs.gate.released.set(true);
    finish(first_sync.as_mut()).unwrap();
    assert_eq!(wakes.0.load(std::sync::atomic::Ordering::Relaxed), 10, "every waiter woken when the sync ended");
    for mut waiter in waiters {
        finish(waiter.as_mut()).unwrap();
    }
    assert_eq!(log.durable_offset(), log.log_end_offset());
}

/// An append waiting for durability on a log that is deleted fails with Closed at once, rather than
/// waiting for a sync that may never come.
#[test]
fn a_durability_waiter_of_a_deleted_log_fails_with_closed() {
    let (fs, log, first) = log_with_an_append_before_an_armed_fdatasync();
    let mut first_sync = Box::pin(log.wait_durable(first.next_offset()));
    poll_until_held(first_sync.as_mut(), &fs.gate);
    let second = block_on(log.append(&make_batch(2, 2, 100, 1), LeaderEpoch(0))).unwrap();
    let mut waiter = Box::pin(log.wait_durable(second.next_offset()));
    assert!(poll(waiter.as_mut()).is_pending(), "waits for the sync under way");

    block_on(log.delete()).unwrap();
    // The first sync is still held at its fdatasync.
    assert!(fs.gate.held.get());
    assert!(
        matches!(poll(waiter.as_mut()), Poll::Ready(Err(StorageError::Closed(_)))),
        "the waiter learns the log is gone while the sync under way is still held"
    );
    fs.gate.released.set(true);
    let _ = finish(first_sync.as_mut());
}
