//! The real file layer: glommio DMA files (O_DIRECT, io_uring). Must be used inside a glommio executor.

use std::cell::{Cell, RefCell};
use std::collections::HashSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::io::{DmaBuffer, DmaFile, OpenOptions};

thread_local! {
    /// Devices whose io_uring poll support glommio has already probed on this thread.
    static PROBED_DEVICES: RefCell<HashSet<u64>> = RefCell::new(HashSet::new());
}

/// Makes glommio probe a device's poll-mode support with a file that has data.
///
/// glommio 0.9 decides, once per device and thread, whether reads go to its poll ring, by reading the first
/// block of the first direct-I/O file opened there. When that file is empty the read returns 0 at once and
/// the device is wrongly taken to support polled I/O; every later read on it then fails with EOPNOTSUPP (seen
/// on ext4 over virtio). Opening a one-block probe file first makes the probe read real data.
///
/// Call it before opening glommio DMA files directly on a device (the log's own opens call it).
pub async fn probe_device(dir: &Path) -> io::Result<()> {
    let dev = std::fs::metadata(dir)?.dev();
    if PROBED_DEVICES.with(|p| p.borrow().contains(&dev)) {
        return Ok(());
    }
    // Named so that nothing mistakes a leftover for a partition or a segment; data dirs remove `.tmp` files.
    static PROBES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = PROBES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let probe = dir.join(format!(".shardlog-iopoll-probe.{}.{n}.tmp", std::process::id()));
    std::fs::write(&probe, [0u8; ALIGN as usize])?;
    let opened = DmaFile::open(&probe).await.map_err(io::Error::from);
    std::fs::remove_file(&probe)?;
    opened?.close().await.map_err(io::Error::from)?;
    PROBED_DEVICES.with(|p| p.borrow_mut().insert(dev));
    Ok(())
}

use super::{ALIGN, DirectBuf, Fs, SegmentFile, WriteBuf};

/// Bytes an unprivileged writer may still use on the filesystem holding `path` (statvfs `f_bavail`).
pub fn free_bytes(path: &Path) -> io::Result<u64> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statvfs is a plain C struct of integers, for which all zeros is a valid value.
    let mut fs: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: statvfs(3) with a NUL-terminated path and a pointer to a live statvfs it may fill.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut fs) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fs.f_bavail as u64 * fs.f_frsize as u64)
}

impl DirectBuf for DmaBuffer {
    fn truncate(&mut self, len: usize) {
        self.trim_to_size(len);
    }
}

/// Files on a real disk through glommio's direct I/O.
#[derive(Debug, Default, Clone, Copy)]
pub struct DmaFs;

/// A segment, index or checkpoint file opened with O_DIRECT.
#[derive(Debug)]
pub struct DmaSegmentFile {
    file: Rc<DmaFile>,
    path: PathBuf,
    /// A second descriptor without O_DIRECT, opened on the first write through the page cache (the file
    /// status flag is shared by duplicated descriptors, so it must be its own open).
    cached: RefCell<Option<std::fs::File>>,
    /// Writes submitted by `write_many` that have not completed yet.
    writes: Rc<WritesInFlight>,
}

/// Direct writes under way on one file. They run in a task of their own, so a caller that goes away
/// (its future dropped) leaves them to finish rather than cancelling them part-way; the io_uring requests
/// already submitted would land anyway. The file's next write, truncation or sync waits for them, so a
/// late write can never land over newer bytes. (The count is the open file's: a file the shard's cache
/// closed meanwhile and opened again starts a new one.)
#[derive(Debug, Default)]
struct WritesInFlight {
    count: Cell<usize>,
    done: event_listener::Event,
}

impl WritesInFlight {
    async fn settled(&self) {
        while self.count.get() > 0 {
            let listener = self.done.listen();
            if self.count.get() > 0 {
                listener.await;
            }
        }
    }
}

async fn write_whole(file: &DmaFile, buf: WriteBuf<DmaBuffer>, pos: u64) -> io::Result<()> {
    assert!(pos.is_multiple_of(ALIGN), "direct write position {pos} is not aligned");
    let len = buf.as_ref().len();
    let written = match buf {
        WriteBuf::Owned(buf) => file.write_at(buf, pos).await,
        WriteBuf::Shared(buf) => file.write_rc_at(buf, pos).await,
    }
    .map_err(io::Error::from)?;
    if written != len {
        // A short direct write means the device is out of space or failing; the caller treats any write
        // error as fatal, so report it rather than retrying a partial block.
        return Err(io::Error::new(io::ErrorKind::WriteZero, format!("short write: {written} of {len} bytes")));
    }
    Ok(())
}

impl SegmentFile for DmaSegmentFile {
    type Buf = DmaBuffer;

    fn alloc(&self, len: usize) -> DmaBuffer {
        assert!((len as u64).is_multiple_of(ALIGN), "direct write length {len} is not aligned");
        self.file.alloc_dma_buffer(len)
    }

    async fn write_at(&self, buf: DmaBuffer, pos: u64) -> io::Result<()> {
        self.writes.settled().await;
        write_whole(&self.file, WriteBuf::Owned(buf), pos).await
    }

    async fn write_shared(&self, buf: Rc<DmaBuffer>, pos: u64) -> io::Result<()> {
        self.writes.settled().await;
        write_whole(&self.file, WriteBuf::Shared(buf), pos).await
    }

    async fn write_many(&self, writes: Vec<(WriteBuf<DmaBuffer>, u64)>) -> io::Result<()> {
        self.writes.settled().await;
        let in_flight = self.writes.clone();
        in_flight.count.set(in_flight.count.get() + 1);
        let file = self.file.clone();
        let all = glommio::spawn_local(async move {
            // Submit every write at once: the device sees them queued together, like a sequential writer
            // with several requests in flight.
            let tasks: Vec<_> = writes
                .into_iter()
                .map(|(buf, pos)| {
                    let file = file.clone();
                    glommio::spawn_local(async move { write_whole(&file, buf, pos).await })
                })
                .collect();
            let mut result = Ok(());
            for task in tasks {
                let r = task.await;
                if result.is_ok() {
                    result = r;
                }
            }
            in_flight.count.set(in_flight.count.get() - 1);
            in_flight.done.notify(usize::MAX);
            result
        })
        .detach();
        all.await.unwrap_or_else(|| Err(io::Error::other("direct writes cancelled")))
    }

    fn write_cached(&self, pos: u64, bytes: &[u8]) -> io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut cached = self.cached.borrow_mut();
        let file = match &mut *cached {
            Some(file) => file,
            empty => empty.insert(std::fs::OpenOptions::new().write(true).open(&self.path)?),
        };
        // The kernel keeps page-cache and direct I/O on one file coherent: a direct read or write of these
        // bytes first writes the cached pages back.
        file.write_all_at(bytes, pos)
    }

    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        // Aligned reads only: read the covering blocks and slice, so the result never depends on how the
        // runtime rounds unaligned requests.
        let start = super::align_down(pos);
        let end = super::align_up(pos + len as u64);
        let skip = (pos - start) as usize;
        let mut out = Vec::with_capacity(len);
        let mut at = start;
        while at < end {
            let got = self.file.read_at_aligned(at, (end - at) as usize).await.map_err(io::Error::from)?;
            if got.is_empty() {
                break;
            }
            let from = skip.saturating_sub((at - start) as usize).min(got.len());
            let room = len - out.len();
            let take = (got.len() - from).min(room);
            out.extend_from_slice(&got[from..from + take]);
            at += got.len() as u64;
            if !(got.len() as u64).is_multiple_of(ALIGN) {
                break; // end of file
            }
        }
        Ok(out)
    }

    async fn read_shared(&self, pos: u64, len: usize) -> io::Result<bytes::Bytes> {
        match super::shared_read::read(&self.file, pos, len).await? {
            Some(bytes) => Ok(bytes),
            // The device returned less than asked short of the end: read the rest and join them.
            None => self.read_at(pos, len).await.map(bytes::Bytes::from),
        }
    }

    async fn fdatasync(&self) -> io::Result<()> {
        self.writes.settled().await;
        self.file.fdatasync().await.map_err(io::Error::from)
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        self.writes.settled().await;
        self.file.truncate(len).await.map_err(io::Error::from)
    }

    async fn size(&self) -> io::Result<u64> {
        self.file.file_size().await.map_err(io::Error::from)
    }

    async fn allocate(&self, size: u64) -> io::Result<()> {
        self.file.pre_allocate(size, false).await.map_err(io::Error::from)
    }
}

impl Fs for DmaFs {
    type File = DmaSegmentFile;

    async fn open(&self, path: &Path, create: bool) -> io::Result<DmaSegmentFile> {
        probe_device(path.parent().unwrap_or(Path::new("."))).await?;
        let file =
            OpenOptions::new().read(true).write(true).create(create).dma_open(path).await.map_err(io::Error::from)?;
        Ok(DmaSegmentFile {
            file: Rc::new(file),
            path: path.to_path_buf(),
            cached: RefCell::new(None),
            writes: Rc::default(),
        })
    }

    async fn remove(&self, path: &Path) -> io::Result<()> {
        glommio::io::remove(path).await.map_err(io::Error::from)
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        glommio::io::rename(from, to).await.map_err(io::Error::from)
    }

    async fn sync_dir(&self, path: &Path) -> io::Result<()> {
        // glommio opens directories relative to no descriptor: a relative path fails with EBADF.
        let dir = glommio::io::Directory::open(std::path::absolute(path)?).await.map_err(io::Error::from)?;
        dir.sync().await.map_err(io::Error::from)?;
        dir.close().await.map_err(io::Error::from)
    }

    async fn create_dir_all(&self, path: &Path) -> io::Result<()> {
        std::fs::create_dir_all(path)
    }

    async fn remove_dir(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_dir(path)
    }

    fn list_dir(&self, path: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(path)? {
            if let Some(name) = entry?.file_name().to_str() {
                names.push(name.to_string());
            }
        }
        names.sort();
        Ok(names)
    }

    fn exists(&self, path: &Path) -> bool {
        path.exists()
    }

    fn is_dir(&self, path: &Path) -> bool {
        path.is_dir()
    }

    fn free_bytes(&self, path: &Path) -> io::Result<u64> {
        free_bytes(path)
    }

    fn device_flush_check(&self, dir: &Path) -> Result<(), String> {
        super::mounts::check_dir(dir)
    }

    fn alloc_kept(&self, len: usize) -> DmaBuffer {
        assert!((len as u64).is_multiple_of(ALIGN), "direct write length {len} is not aligned");
        // From the heap rather than the ring's registered memory, which is for buffers of one request.
        glommio::allocate_dma_buffer_global(len)
    }
}
