//! One device flush for the direct writes of many files: group commit across a shard's partitions.
//!
//! A partition's durability point is normally an `fdatasync` of its segment file. On Linux's ext4 and XFS
//! (not POSIX: an assumption about one kernel's behaviour, checked at start by
//! [`super::Fs::device_flush_check`]), an `fdatasync` of a file whose metadata has nothing to commit
//! does one thing: it flushes the whole device's write cache. That flush makes durable every direct
//! write completed before it was submitted, to any file of the filesystem, whose blocks need no metadata
//! to be read back. So one flush may acknowledge appends to many partitions, but only appends for
//! which all of these hold (the log checks the last three, see `log::durability`):
//!
//! 1. the O_DIRECT write completed before the flush was submitted ([`DeviceFlush::flush`] is called
//!    after the write returns, and waits for a flush submitted after the call);
//! 2. it overwrote blocks already allocated and written, within the file's size;
//! 3. those blocks' written state, the file's size and its directory entry were made durable by an
//!    earlier, completed `fdatasync` of that same file (and a sync of its directory);
//! 4. the file is on the filesystem the flushed file is on: the flush's anchor file sits in the data
//!    dir, and the partitions' directories below it (a data dir is one filesystem);
//! 5. the filesystem is ext4 (not `data=journal`) or XFS, mounted without `nobarrier`: its `fdatasync`
//!    is a real device cache flush (on a device without a volatile cache there is nothing to flush, and
//!    a completed write is already durable).
//!
//! Anything else (a new segment, a write into reserved but unwritten blocks, a size change) is synced
//! per file, as before. The flush is an `fdatasync` of a file of its own (the anchor), whose metadata
//! never changes after it is created, so it never waits for the journal.
//!
//! There is no timer: a flush starts as soon as one is asked for and none is under way; while one runs,
//! the appends that ask meanwhile wait and go together with the next, which starts the moment it ends.
//! A failed flush stops the process (see [`crate::fatal`]): every append it would have covered fails
//! with it, unacknowledged.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::error::{Result, StorageError};
use crate::fatal;

use super::{Fs, SegmentFile};

/// A deliberately wrong rule for when a device flush may cover an append, for the crash tests to show
/// that they catch it. Set only by tests, on their own thread.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BrokenRule {
    #[default]
    None,
    /// The flush is submitted before the write-out it is to cover.
    FlushBeforeWrite,
    /// A write into blocks reserved but never written (or past the durable size) is covered too.
    CoverUnwrittenBlocks,
}

thread_local! {
    static BROKEN_RULE: std::cell::Cell<BrokenRule> = const { std::cell::Cell::new(BrokenRule::None) };
}

/// Makes this thread's logs follow `rule` (see [`BrokenRule`]). For tests only.
#[doc(hidden)]
pub fn break_rule_for_tests(rule: BrokenRule) {
    BROKEN_RULE.with(|r| r.set(rule));
}

pub(crate) fn broken_rule() -> BrokenRule {
    BROKEN_RULE.with(|r| r.get())
}

/// Rounds of the shard's ready tasks a flush waits for callers before it is submitted, at most.
const MAX_GATHER_ROUNDS: u32 = 4;

/// The name of the flush's anchor file in the data dir (with the owner's suffix).
pub const ANCHOR_FILE: &str = "device-flush";

#[derive(Debug, Default)]
struct FlushState {
    /// Flushes submitted so far; the latest completed one's number.
    submitted: u64,
    completed: u64,
    running: bool,
    /// Callers so far (to tell whether any asked during a round of the ready tasks).
    asked: u64,
    /// Batches the next flush makes durable (the callers since the last one was submitted).
    batches_next: u64,
}

/// A shard's device flush. See the module documentation.
#[derive(Debug)]
pub struct DeviceFlush<F: Fs> {
    anchor: F::File,
    path: PathBuf,
    state: RefCell<FlushState>,
    /// Notified when a flush ends (or its future is dropped).
    done: event_listener::Event,
}

/// Ends a flush turn, also when its future is dropped: a dropped flush completes nothing, and a
/// waiter starts the next.
struct Turn<'a, F: Fs> {
    flush: &'a DeviceFlush<F>,
    number: u64,
    completed: bool,
}

impl<F: Fs> Drop for Turn<'_, F> {
    fn drop(&mut self) {
        let mut state = self.flush.state.borrow_mut();
        state.running = false;
        if self.completed {
            state.completed = state.completed.max(self.number);
        }
        drop(state);
        self.flush.done.notify(usize::MAX);
    }
}

impl<F: Fs> DeviceFlush<F> {
    /// The device flush for the logs in `dir`, with its anchor file `<dir>/device-flush<suffix>`, when the
    /// filesystem holding `dir` is known to flush the device at every `fdatasync`; `None` (said at INFO)
    /// when it is not: each log then syncs its own file.
    pub async fn open(fs: &F, dir: &Path, suffix: &str) -> Result<Option<Rc<Self>>> {
        if let Err(why) = fs.device_flush_check(dir) {
            tracing::info!(dir = %dir.display(), %why, "each partition syncs its own files: one device flush for many cannot be relied on here");
            return Ok(None);
        }
        let path = dir.join(format!("{ANCHOR_FILE}{suffix}"));
        let anchor = fs.open(&path, true).await.map_err(|e| StorageError::io("create", &path, e))?;
        // Its size and directory entry durable once, so that its every later fdatasync has no metadata
        // to commit and is only the device's flush.
        if let Err(e) = anchor.fdatasync().await {
            fatal::disk_failure("fdatasync", &path, &e);
        }
        crate::durable::sync_dir(fs, dir).await;
        Ok(Some(Rc::new(DeviceFlush { anchor, path, state: RefCell::default(), done: event_listener::Event::new() })))
    }

    /// Returns once a device flush submitted after this call has completed (a flush is numbered when it
    /// is submitted, so a caller who asks while the next is about to be submitted is covered by it):
    /// every direct write completed before the call is then on the media (see the module documentation for which of them that makes
    /// durable). `batches` is how many batches the caller's writes hold, for
    /// `shardlog_log_batches_per_fdatasync`. A failed flush stops the process.
    pub async fn flush(&self, batches: u64) -> Result<()> {
        let wanted = {
            let mut state = self.state.borrow_mut();
            state.batches_next += batches;
            state.asked += 1;
            state.submitted + 1
        };
        loop {
            let lead = {
                let mut state = self.state.borrow_mut();
                if state.completed >= wanted {
                    return Ok(());
                }
                !std::mem::replace(&mut state.running, true)
            };
            if !lead {
                // On this future's own memory: nothing can notify between the check above and this.
                event_listener::listener!(self.done => done);
                done.await;
                continue;
            }
            let mut turn = Turn { flush: self, number: 0, completed: false };
            // Round the shard's ready tasks before submitting, again while a round brought callers (at
            // most a few rounds; not a timer): the other logs whose write-outs completed with this one's
            // are ready now, and ask in time to be covered by it.
            for _ in 0..MAX_GATHER_ROUNDS {
                let asked = self.state.borrow().asked;
                futures_lite::future::yield_now().await;
                if self.state.borrow().asked == asked {
                    break;
                }
            }
            let batches = {
                let mut state = self.state.borrow_mut();
                state.submitted += 1;
                turn.number = state.submitted;
                std::mem::take(&mut state.batches_next)
            };
            let started = std::time::Instant::now();
            if let Err(e) = self.anchor.fdatasync().await {
                fatal::disk_failure("fdatasync (device flush)", &self.path, &e);
            }
            crate::metrics::synced(crate::metrics::Sync::Device, started.elapsed(), batches);
            turn.completed = true;
        }
    }

    /// Device flushes completed so far: the number of the latest (flushes are numbered from 1 as they are
    /// submitted; one whose caller went away before it ended counts too).
    pub fn flushes(&self) -> u64 {
        self.state.borrow().completed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fs::sim::SimFs;
    use futures_lite::future::block_on;

    async fn open(fs: &SimFs) -> Rc<DeviceFlush<SimFs>> {
        fs.create_dir_all(Path::new("/data")).await.unwrap();
        DeviceFlush::open(fs, Path::new("/data"), ".0").await.unwrap().expect("the simulated disk flushes")
    }

    #[test]
    fn callers_that_arrive_while_a_flush_runs_share_the_next_one() {
        let fs = SimFs::new();
        fs.set_sync_polls(3);
        block_on(async {
            let flush = open(&fs).await;
            let before = fs.fsync_count();
            // The first starts a flush at once; the four that ask while it runs must not take it for
            // theirs (their writes may have completed after it was submitted): they share the next.
            let first = async {
                flush.flush(1).await.unwrap();
                flush.flushes()
            };
            let later = || async {
                futures_lite::future::yield_now().await;
                flush.flush(2).await.unwrap();
                flush.flushes()
            };
            let others = async {
                let ((a, b), (c, d)) = futures_lite::future::zip(
                    futures_lite::future::zip(later(), later()),
                    futures_lite::future::zip(later(), later()),
                )
                .await;
                [a, b, c, d]
            };
            let (first, others) = futures_lite::future::zip(first, others).await;
            assert_eq!(first, 1);
            assert!(others.iter().all(|&n| n >= 2), "a caller took a flush submitted before it asked: {others:?}");
            assert_eq!(flush.flushes(), 2, "the four share one flush");
            assert_eq!(fs.fsync_count() - before, 2);
        });
    }

    #[test]
    fn a_filesystem_not_known_to_flush_the_device_gets_none() {
        let fs = SimFs::new();
        fs.set_device_flush(Some("tmpfs".into()));
        block_on(async {
            fs.create_dir_all(Path::new("/data")).await.unwrap();
            assert!(DeviceFlush::open(&fs, Path::new("/data"), "").await.unwrap().is_none());
        });
    }
}
