//! The seam between the log and the disk.
//!
//! Every byte the log reads or writes goes through [`Fs`] and [`SegmentFile`]. [`dma::DmaFs`] is the real
//! implementation (glommio DMA files: O_DIRECT through io_uring); [`sim::SimFs`] keeps files in memory, tracks
//! what is written apart from what is durable, and can simulate a crash that loses unsynced writes and
//! tears the last one. The traits use `async fn` without `Send` bounds on purpose: everything runs on one
//! shard's thread.
//!
//! Writes are direct I/O: positions and lengths are multiples of [`ALIGN`], except [`SegmentFile::write_cached`],
//! which goes through the kernel's page cache (Kafka's acknowledgement point, for logs under the interval
//! flush policy). Reads may be unaligned.

#![allow(async_fn_in_trait)]

use std::io;
use std::path::Path;
use std::rc::Rc;

pub mod device_flush;
pub mod dma;
mod mounts;
pub mod open_files;
pub mod shared_read;
pub mod sim;

/// Alignment of every write's position and length.
pub const ALIGN: u64 = 4096;

/// Rounds `v` down to a multiple of [`ALIGN`].
pub fn align_down(v: u64) -> u64 {
    v & !(ALIGN - 1)
}

/// Rounds `v` up to a multiple of [`ALIGN`].
pub fn align_up(v: u64) -> u64 {
    v.checked_add(ALIGN - 1).expect("alignment overflow") & !(ALIGN - 1)
}

/// A buffer suitable for a direct write: aligned in memory, of an aligned length.
pub trait DirectBuf: AsRef<[u8]> + AsMut<[u8]> + std::fmt::Debug + 'static {
    /// Shortens the buffer to its first `len` bytes (a multiple of [`ALIGN`]): a write of it writes those.
    fn truncate(&mut self, len: usize);
}

impl DirectBuf for Vec<u8> {
    fn truncate(&mut self, len: usize) {
        Vec::truncate(self, len);
    }
}

/// What a direct write writes: a buffer of its own, or one the log's in-memory tail goes on reading from
/// while the write is under way (so the tail's bytes go to the disk without a copy).
#[derive(Debug)]
pub enum WriteBuf<B> {
    Owned(B),
    Shared(Rc<B>),
}

impl<B: AsRef<[u8]>> AsRef<[u8]> for WriteBuf<B> {
    fn as_ref(&self) -> &[u8] {
        match self {
            WriteBuf::Owned(b) => b.as_ref(),
            WriteBuf::Shared(b) => b.as_ref().as_ref(),
        }
    }
}

/// A file opened for direct I/O.
pub trait SegmentFile: std::fmt::Debug + 'static {
    /// A buffer suitable for a direct write: aligned in memory, of an aligned length.
    type Buf: DirectBuf;

    /// Allocates a write buffer of `len` bytes (a multiple of [`ALIGN`]). Its contents are unspecified.
    fn alloc(&self, len: usize) -> Self::Buf;

    /// Writes the whole buffer at `pos` (a multiple of [`ALIGN`]).
    async fn write_at(&self, buf: Self::Buf, pos: u64) -> io::Result<()>;

    /// Writes the whole of a buffer that others keep reading meanwhile, at `pos` (a multiple of [`ALIGN`]).
    async fn write_shared(&self, buf: Rc<Self::Buf>, pos: u64) -> io::Result<()>;

    /// Writes several buffers, each at its (aligned) position. Implementations may run them concurrently;
    /// it returns once all are complete.
    async fn write_many(&self, writes: Vec<(WriteBuf<Self::Buf>, u64)>) -> io::Result<()> {
        for (buf, pos) in writes {
            match buf {
                WriteBuf::Owned(buf) => self.write_at(buf, pos).await?,
                WriteBuf::Shared(buf) => self.write_shared(buf, pos).await?,
            }
        }
        Ok(())
    }

    /// Writes `bytes` at `pos` (any alignment) into the kernel's page cache, synchronously: once it returns
    /// the bytes outlive the process, but not a power loss until the next `fdatasync`. For small writes
    /// this costs a memory copy, where a direct write waits for the device.
    fn write_cached(&self, pos: u64, bytes: &[u8]) -> io::Result<()>;

    /// Reads up to `len` bytes at `pos`; fewer only at the end of the file.
    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>>;

    /// [`SegmentFile::read_at`] as `Bytes` that may share the buffer the read landed in (no copy out of
    /// it), for reads served to consumers. The bytes are the file's as read: later writes, truncations or
    /// removals of the file do not change them.
    async fn read_shared(&self, pos: u64, len: usize) -> io::Result<bytes::Bytes> {
        self.read_at(pos, len).await.map(bytes::Bytes::from)
    }

    /// Makes every completed write durable (data and the size needed to read it).
    async fn fdatasync(&self) -> io::Result<()>;

    /// Sets the file's size.
    async fn truncate(&self, len: u64) -> io::Result<()>;

    /// Makes the file at least `size` bytes long with its blocks reserved (fallocate); the new bytes
    /// read as zeros. Fails with ENOSPC when the filesystem cannot hold them (the size is then unchanged).
    async fn allocate(&self, size: u64) -> io::Result<()>;

    /// The file's current size.
    async fn size(&self) -> io::Result<u64>;
}

/// The directory operations the log needs.
pub trait Fs: Clone + std::fmt::Debug + 'static {
    type File: SegmentFile;

    /// Opens `path` for reading and writing, creating it (empty) when `create` is set and it does not exist.
    async fn open(&self, path: &Path, create: bool) -> io::Result<Self::File>;

    /// Removes a file.
    async fn remove(&self, path: &Path) -> io::Result<()>;

    /// Renames a file (replacing any file at `to`) or a directory.
    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;

    /// Makes the directory's entries (creations, renames, removals) durable.
    async fn sync_dir(&self, path: &Path) -> io::Result<()>;

    /// Creates a directory and its parents.
    async fn create_dir_all(&self, path: &Path) -> io::Result<()>;

    /// Removes an empty directory.
    async fn remove_dir(&self, path: &Path) -> io::Result<()>;

    /// Names of the entries in a directory, sorted.
    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>>;

    /// Whether a file or directory exists at `path`.
    fn exists(&self, path: &Path) -> bool;

    /// Whether `path` is a directory.
    fn is_dir(&self, path: &Path) -> bool;

    /// Bytes still free for files on the filesystem holding `path` (what a reservation may take).
    fn free_bytes(&self, path: &Path) -> io::Result<u64>;

    /// Whether the filesystem holding `dir` is one where an `fdatasync` of a file whose metadata has
    /// nothing to commit is a flush of the device's write cache, and so makes durable every direct write
    /// completed before it to any file of that filesystem whose blocks were written and made durable
    /// before (see [`device_flush`]). `Err` says why it is not known to be.
    fn device_flush_check(&self, dir: &Path) -> Result<(), String>;

    /// A direct-write buffer of `len` bytes (a multiple of [`ALIGN`]) kept for long: a block of a log's
    /// in-memory tail. Its contents are unspecified.
    fn alloc_kept(&self, len: usize) -> <Self::File as SegmentFile>::Buf;
}
