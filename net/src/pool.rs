//! Buffers for large request frames, mapped from the kernel and kept in a capped pool, so that memory
//! taken for a burst of large requests goes back to the system once the burst is over.
//!
//! Why not the heap: the processes keep up to 256 MiB of free heap per arena so that ordinary request
//! buffers do not fault their pages in again on every request ([`crate::alloc`]); a 49 MiB request
//! taken from that heap stays resident long after it is answered. A frame of [`LARGE_FRAME_BYTES`] or
//! more is read into a buffer of its own instead: an anonymous mapping that takes memory only where
//! the frame's bytes are written. When its last reader is done the buffer returns to the pool (so the
//! next large frame finds its pages already faulted in) while the pool holds less than
//! [`POOL_CAP_BYTES`]; beyond that, or once it has lain unused for [`POOL_IDLE`] ([`trim_idle`]), it is
//! unmapped and its memory is the system's again.
//!
//! What it must never do: hand a buffer to two frames at once, or let a frame read bytes another frame
//! wrote (a reused buffer is written before it is read: [`LargeBuf`] exposes only its filled length).

use std::ptr::NonNull;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Frames of this size or more are read into pooled buffers; smaller ones share the connection's buffer.
pub const LARGE_FRAME_BYTES: usize = 1 << 20;
/// The most bytes of free buffers the pool keeps for reuse (the whole process).
pub const POOL_CAP_BYTES: usize = 64 << 20;
/// A free buffer unused for this long is unmapped by [`trim_idle`].
pub const POOL_IDLE: Duration = Duration::from_secs(5);
/// Buffers are mapped in multiples of this (so a buffer fits frames of nearby sizes).
const GRANULE_BYTES: usize = 1 << 20;

/// A buffer mapped for one frame: capacity fixed at mapping, filled from the start.
#[derive(Debug)]
pub struct LargeBuf {
    ptr: NonNull<u8>,
    capacity: usize,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone (no aliasing pointers escape except through `&self`
// and `&mut self` borrows), so it may move to and be read from any thread.
unsafe impl Send for LargeBuf {}
// SAFETY: shared access only reads the filled prefix.
unsafe impl Sync for LargeBuf {}

impl LargeBuf {
    /// Maps `capacity` bytes (rounded up to whole granules). Pages are committed only when written.
    fn map(capacity: usize) -> std::io::Result<Self> {
        let capacity = capacity.max(1).div_ceil(GRANULE_BYTES) * GRANULE_BYTES;
        // SAFETY: an anonymous private mapping with no address hint touches no existing memory.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                capacity,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast()).expect("mmap does not return null on success");
        Ok(LargeBuf { ptr, capacity, len: 0 })
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `bytes`; the caller keeps within the capacity.
    pub fn extend_from_slice(&mut self, bytes: &[u8]) {
        assert!(bytes.len() <= self.capacity - self.len, "a large frame buffer overflows its frame");
        // SAFETY: the destination range lies inside the mapping (checked above) and cannot overlap
        // `bytes`, which the caller holds while this buffer is borrowed mutably.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.as_ptr().add(self.len), bytes.len()) };
        self.len += bytes.len();
    }

    /// The mapping past the filled bytes, to be written in place (a socket read straight into the
    /// frame); [`Self::fill`] then counts what was written. Every byte of a mapping is initialized
    /// (zeros when mapped, an earlier frame's bytes when reused).
    pub fn spare_mut(&mut self) -> &mut [u8] {
        // SAFETY: `[len, capacity)` lies inside the mapping, holds initialized bytes, and is borrowed
        // mutably with `self`; shared readers (`as_ref`) see only `[0, len)`, which `&mut self` excludes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr().add(self.len), self.capacity - self.len) }
    }

    /// Counts the first `n` bytes of [`Self::spare_mut`] as filled.
    pub fn fill(&mut self, n: usize) {
        assert!(n <= self.capacity - self.len, "a large frame buffer overflows its frame");
        self.len += n;
    }
}

impl AsRef<[u8]> for LargeBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `len` bytes of the mapping were written by `extend_from_slice`.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for LargeBuf {
    fn drop(&mut self) {
        // SAFETY: the mapping of `capacity` bytes made by `map`, unmapped once.
        let unmapped = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.capacity) };
        assert_eq!(unmapped, 0, "munmap of a frame buffer failed: {}", std::io::Error::last_os_error());
    }
}

/// A buffer on loan from the pool: it goes back there when dropped (as the owner of a frame's
/// `Bytes`, when the last slice of the frame is dropped, on whichever thread that is).
#[derive(Debug)]
pub struct PooledBuf(Option<LargeBuf>);

impl PooledBuf {
    /// A buffer with room for `size` bytes, reused from the pool when one fits.
    pub fn take(size: usize) -> std::io::Result<Self> {
        let reused = POOL.lock().expect("pool lock").take(size);
        let mut buf = match reused {
            Some(buf) => buf,
            None => LargeBuf::map(size)?,
        };
        buf.len = 0;
        Ok(PooledBuf(Some(buf)))
    }

    pub fn buf(&self) -> &LargeBuf {
        self.0.as_ref().expect("present until dropped")
    }

    pub fn buf_mut(&mut self) -> &mut LargeBuf {
        self.0.as_mut().expect("present until dropped")
    }
}

impl AsRef<[u8]> for PooledBuf {
    fn as_ref(&self) -> &[u8] {
        self.buf().as_ref()
    }
}

impl Drop for PooledBuf {
    fn drop(&mut self) {
        if let Some(buf) = self.0.take() {
            // Unmapped outside the lock when the pool is full.
            let refused = POOL.lock().expect("pool lock").put(buf, Instant::now());
            drop(refused);
        }
    }
}

/// Unmaps free buffers unused for [`POOL_IDLE`]; returns how many bytes went back to the system.
pub fn trim_idle() -> usize {
    let idle = POOL.lock().expect("pool lock").take_idle(Instant::now(), POOL_IDLE);
    idle.iter().map(LargeBuf::capacity).sum()
}

/// Bytes of free buffers the pool holds.
pub fn pooled_bytes() -> usize {
    POOL.lock().expect("pool lock").free_bytes
}

static POOL: Mutex<Pool> = Mutex::new(Pool { free: Vec::new(), free_bytes: 0 });

/// Free buffers, each with the time it was returned.
#[derive(Debug)]
struct Pool {
    free: Vec<(LargeBuf, Instant)>,
    free_bytes: usize,
}

impl Pool {
    /// The smallest free buffer that holds `size` bytes and is at most twice as large (a small frame
    /// does not tie up a buffer whose pages a large one faulted in).
    fn take(&mut self, size: usize) -> Option<LargeBuf> {
        let (i, _) = self
            .free
            .iter()
            .enumerate()
            .filter(|(_, (b, _))| b.capacity >= size && b.capacity <= size.max(GRANULE_BYTES) * 2)
            .min_by_key(|(_, (b, _))| b.capacity)?;
        let (buf, _) = self.free.swap_remove(i);
        self.free_bytes -= buf.capacity;
        Some(buf)
    }

    /// Keeps `buf` if it fits under the cap; otherwise hands it back to be unmapped.
    fn put(&mut self, buf: LargeBuf, now: Instant) -> Option<LargeBuf> {
        if self.free_bytes + buf.capacity > POOL_CAP_BYTES {
            return Some(buf);
        }
        self.free_bytes += buf.capacity;
        self.free.push((buf, now));
        None
    }

    fn take_idle(&mut self, now: Instant, idle: Duration) -> Vec<LargeBuf> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.free.len() {
            if now.duration_since(self.free[i].1) >= idle {
                let (buf, _) = self.free.swap_remove(i);
                self.free_bytes -= buf.capacity;
                out.push(buf);
            } else {
                i += 1;
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> Pool {
        Pool { free: Vec::new(), free_bytes: 0 }
    }

    #[test]
    fn a_buffer_holds_what_was_written_and_its_capacity_is_whole_granules() {
        let mut buf = LargeBuf::map(GRANULE_BYTES + 1).unwrap();
        assert_eq!(buf.capacity(), 2 * GRANULE_BYTES);
        buf.extend_from_slice(b"abc");
        buf.extend_from_slice(b"de");
        assert_eq!(buf.as_ref(), b"abcde");
    }

    #[test]
    fn the_pool_reuses_a_fitting_buffer_keeps_no_more_than_its_cap_and_lets_idle_ones_go() {
        let mut pool = pool();
        let t0 = Instant::now();
        // Fill the pool to its cap with 16 MiB buffers; the next one is refused (to be unmapped).
        for _ in 0..POOL_CAP_BYTES / (16 << 20) {
            assert!(pool.put(LargeBuf::map(16 << 20).unwrap(), t0).is_none());
        }
        assert!(pool.put(LargeBuf::map(16 << 20).unwrap(), t0).is_some(), "over the cap");
        assert_eq!(pool.free_bytes, POOL_CAP_BYTES);
        // A 1 MiB frame does not take a 16 MiB buffer; a 10 MiB one does.
        assert!(pool.take(1 << 20).is_none());
        let reused = pool.take(10 << 20).expect("a 16 MiB buffer fits a 10 MiB frame");
        assert_eq!(reused.capacity(), 16 << 20);
        assert_eq!(pool.free_bytes, POOL_CAP_BYTES - (16 << 20));
        // One returned later stays when the others have idled out.
        assert!(pool.put(reused, t0 + POOL_IDLE).is_none());
        let gone = pool.take_idle(t0 + POOL_IDLE, POOL_IDLE);
        assert_eq!(gone.len(), POOL_CAP_BYTES / (16 << 20) - 1);
        assert_eq!(pool.free_bytes, 16 << 20);
    }

    #[test]
    fn a_taken_buffer_starts_empty_even_when_reused() {
        let mut first = PooledBuf::take(3 << 20).unwrap();
        first.buf_mut().extend_from_slice(&[7; 100]);
        drop(first);
        let second = PooledBuf::take(3 << 20).unwrap();
        assert!(second.buf().is_empty());
    }
}
