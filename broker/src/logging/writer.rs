//! Where log lines go: stderr, without ever making the thread that logs wait for it.
//!
//! A line is written straight to stderr when nothing is queued, no other thread is writing (one writes
//! at a time, the writer thread below included: a thread that finds another writing does not wait) and
//! stderr can take it now (poll(2) says it is writable and the line fits in what that guarantees: a
//! pipe's page), so in the usual case lines come out at once and in order. When stderr is slow (a full pipe, a reader that stalls), a line
//! goes to a bounded queue that a writer thread of its own empties, and the lines after it follow it
//! there while anything is queued; when the queue is full the line is dropped and counted
//! ([`dropped_lines`], the metric `shardlog_log_lines_dropped_total`). So no thread, a shard least of
//! all, waits for a slow pipe or socket (journald, a container's log collector). A regular file or a
//! terminal always polls writable: lines go straight to it, as a write to the page cache does not wait
//! for the disk. The process waits for the queue before it ends ([`flush`]); the one path that ends it at
//! once, a failed disk, writes its own line to stderr directly before it aborts.

use std::io::Write;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use tracing_subscriber::fmt::MakeWriter;

/// Lines the queue holds before lines are dropped.
const QUEUE_LINES_MAX: usize = 16 * 1024;
/// The longest line written directly: a pipe that polls writable has at least a page free, so a
/// line up to that size goes in without waiting.
const DIRECT_LINE_BYTES_MAX: usize = 4096;

struct Queue {
    lines: flume::Sender<Vec<u8>>,
    direct_only: bool,
    /// Lines queued and not yet written.
    pending: AtomicUsize,
    dropped: AtomicU64,
}

static QUEUE: OnceLock<Queue> = OnceLock::new();

/// Held by whoever writes to stderr: a direct writer only if it gets it at once, the writer thread
/// while it writes a queued line.
static WRITING: Mutex<()> = Mutex::new(());

fn queue() -> &'static Queue {
    QUEUE.get_or_init(|| {
        let (lines, queued) = flume::bounded::<Vec<u8>>(QUEUE_LINES_MAX);
        let spawned = std::thread::Builder::new().name("log-writer".into()).spawn(move || {
            let mut stderr = std::io::stderr();
            for line in queued.iter() {
                let writing = WRITING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
                let _ = stderr.write_all(&line);
                drop(writing);
                QUEUE.get().expect("set before any line is queued").pending.fetch_sub(1, Ordering::SeqCst);
            }
        });
        // Without the thread nothing queued would be written: every line then goes straight out.
        let direct_only = spawned.is_err();
        Queue { lines, direct_only, pending: AtomicUsize::new(0), dropped: AtomicU64::new(0) }
    })
}

/// Lines dropped so far because stderr was slow and the queue full.
pub fn dropped_lines() -> u64 {
    QUEUE.get().map_or(0, |q| q.dropped.load(Ordering::Relaxed))
}

/// Waits (at most `limit`) for the queued lines to be written: before the process ends.
pub fn flush(limit: Duration) {
    let Some(queue) = QUEUE.get() else { return };
    let deadline = Instant::now() + limit;
    while queue.pending.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Whether stderr takes more bytes now without blocking.
fn stderr_writable() -> bool {
    let mut fd = libc::pollfd { fd: libc::STDERR_FILENO, events: libc::POLLOUT, revents: 0 };
    // SAFETY: poll(2) on one pollfd that lives for the call, without waiting.
    let ready = unsafe { libc::poll(&mut fd, 1, 0) };
    ready > 0 && fd.revents & libc::POLLOUT != 0 && fd.revents & (libc::POLLERR | libc::POLLHUP) == 0
}

/// The [`MakeWriter`] the log layer writes through.
#[derive(Debug, Clone, Copy, Default)]
pub struct StderrWithoutWaiting;

/// One event's writer: the formatted line arrives in one `write` (the fmt layer formats a whole event
/// before it writes).
#[derive(Debug)]
pub struct LineWriter;

impl<'a> MakeWriter<'a> for StderrWithoutWaiting {
    type Writer = LineWriter;

    fn make_writer(&'a self) -> LineWriter {
        LineWriter
    }
}

impl Write for LineWriter {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let queue = queue();
        if queue.direct_only {
            std::io::stderr().write_all(line)?;
            return Ok(line.len());
        }
        if queue.pending.load(Ordering::SeqCst) == 0
            && line.len() <= DIRECT_LINE_BYTES_MAX
            && let Ok(_writing) = WRITING.try_lock()
            && queue.pending.load(Ordering::SeqCst) == 0
            && stderr_writable()
        {
            std::io::stderr().write_all(line)?;
            return Ok(line.len());
        }
        queue.pending.fetch_add(1, Ordering::SeqCst);
        if queue.lines.try_send(line.to_vec()).is_err() {
            queue.pending.fetch_sub(1, Ordering::SeqCst);
            queue.dropped.fetch_add(1, Ordering::Relaxed);
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
