//! Direct reads handed out as `Bytes` without copying them out of the buffer the disk wrote them into.
//!
//! glommio reads a direct-I/O file into a buffer of its own (a [`ReadResult`]); a consumer's record bytes
//! are then served from there, as a piece of the Fetch answer, and travel to the shard that owns the
//! consumer's connection. A `ReadResult` may not leave its thread, though: it counts its users with an
//! `Rc`, and its memory may be one of the executor's registered I/O buffers, which only that executor may
//! give back. So the buffer is wrapped in a [`HomeBound`] that other shards may read and drop, but whose
//! `ReadResult` is only ever cloned or freed on the thread that read it: a wrapper dropped elsewhere sends
//! it home over a channel, and a task of the home shard frees it there.
//!
//! What this must never do: touch the `ReadResult`'s counts (clone it, drop it) on another thread. If the
//! home shard is gone (its executor ended), a buffer dropped elsewhere is leaked rather than freed there.

use std::cell::{Cell, RefCell};
use std::io;
use std::mem::ManuallyDrop;
use std::thread::ThreadId;

use bytes::Bytes;
use glommio::io::{DmaFile, ReadResult};

use super::{ALIGN, align_down, align_up};

/// A read's buffer on its way home to be freed.
struct Returned(ReadResult);

// SAFETY: a `Returned` is only moved through the channel and dropped by the home shard's task, on the
// thread that made the `ReadResult`; nothing on the way clones it or reads its counts.
unsafe impl Send for Returned {}

/// A read's buffer, as the owner of the `Bytes` handed out: readable anywhere, freed at home.
struct HomeBound {
    read: ManuallyDrop<ReadResult>,
    home: ThreadId,
    back: flume::Sender<Returned>,
}

// SAFETY: off its home thread a `HomeBound` is only moved and dropped, and its drop sends the `ReadResult`
// home without touching it (or leaks it); the bytes themselves are plain memory that nothing writes once
// the read is done, kept alive by the `ReadResult` until it is freed at home.
unsafe impl Send for HomeBound {}

impl AsRef<[u8]> for HomeBound {
    fn as_ref(&self) -> &[u8] {
        // (Called by `Bytes::from_owner` once, on the home thread, to learn where the bytes are.)
        &self.read
    }
}

impl Drop for HomeBound {
    fn drop(&mut self) {
        // SAFETY: `read` is taken once, here, and not used again.
        let read = unsafe { ManuallyDrop::take(&mut self.read) };
        if std::thread::current().id() == self.home {
            drop(read);
            return;
        }
        if let Err(flume::SendError(Returned(read))) = self.back.send(Returned(read)) {
            // Its shard has ended: freeing it here would touch its counts off its thread.
            std::mem::forget(read);
        }
    }
}

thread_local! {
    /// Where buffers read on this thread and dropped on others come back to.
    static RETURNS: RefCell<Option<flume::Sender<Returned>>> = const { RefCell::new(None) };
    /// How many came back and were freed.
    static FREED_AT_HOME: Cell<u64> = const { Cell::new(0) };
}

/// Buffers read on this thread, dropped on another and freed back here since the thread began.
pub fn buffers_freed_at_home() -> u64 {
    FREED_AT_HOME.with(Cell::get)
}

/// This thread's way home for its buffers, with the task that frees them started on first use (and again
/// on a later executor of the same thread, if the first ended).
fn way_home() -> flume::Sender<Returned> {
    RETURNS.with(|returns| {
        let mut returns = returns.borrow_mut();
        if let Some(back) = returns.as_ref().filter(|back| !back.is_disconnected()) {
            return back.clone();
        }
        let (back, arrivals) = flume::unbounded::<Returned>();
        glommio::spawn_local(async move {
            while let Ok(returned) = arrivals.recv_async().await {
                drop(returned);
                FREED_AT_HOME.with(|freed| freed.set(freed.get() + 1));
            }
        })
        .detach();
        returns.insert(back).clone()
    })
}

/// Reads `len` bytes at `pos` (fewer at the end of the file) as `Bytes` that share the read's buffer.
/// `None` when the device returned less than asked short of the end of the file (the caller reads again
/// another way).
pub(super) async fn read(file: &DmaFile, pos: u64, len: usize) -> io::Result<Option<Bytes>> {
    // Aligned reads only: read the covering blocks and slice, so the result never depends on how the
    // runtime rounds unaligned requests.
    let start = align_down(pos);
    let asked = (align_up(pos + len as u64) - start) as usize;
    let got = file.read_at_aligned(start, asked).await.map_err(io::Error::from)?;
    let at_end = !(got.len() as u64).is_multiple_of(ALIGN) || got.is_empty();
    if got.len() < asked && !at_end {
        return Ok(None);
    }
    let skip = ((pos - start) as usize).min(got.len());
    let take = (got.len() - skip).min(len);
    if take == 0 {
        return Ok(Some(Bytes::new()));
    }
    let part = ReadResult::slice(&got, skip, take).expect("a slice within the read");
    let owner = HomeBound { read: ManuallyDrop::new(part), home: std::thread::current().id(), back: way_home() };
    Ok(Some(Bytes::from_owner(owner)))
}
