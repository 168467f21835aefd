//! The data dir's filesystem: whether it takes direct I/O (the broker cannot run without it), whether it
//! is in memory (acknowledged data would not survive a restart), and its free space.
//!
//! Every probe file is named `.shardlog-check.<pid>.<n>.tmp` (data dirs remove `.tmp` files when opened)
//! and removed when its [`ProbeFile`] is dropped, whether the probe succeeded or not.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::Row;
use shardlog_storage::fs::ALIGN;

/// The row name of the direct I/O probe.
pub const DIRECT_IO: &str = "O_DIRECT";

/// Filesystem magic numbers (statfs(2), linux/magic.h) of filesystems that keep files in memory.
const IN_MEMORY: &[(i64, &str)] = &[(0x0102_1994, "tmpfs"), (0x8584_58f6, "ramfs")];

/// Names of other filesystems a data dir is commonly on, for the report.
const NAMED: &[(i64, &str)] = &[
    (0xef53, "ext2/ext3/ext4"),
    (0x5846_5342, "xfs"),
    (0x9123_683e, "btrfs"),
    (0xf2f5_2010, "f2fs"),
    (0x2fc1_2fc1, "zfs"),
    (0x794c_7630, "overlayfs"),
    (0x6969, "nfs"),
    (0x6573_5546, "fuse"),
];

/// A buffer whose start is aligned for direct I/O, carved out of a larger zeroed vector (so no unsafe
/// allocation is needed).
#[derive(Debug)]
pub struct AlignedBuf {
    bytes: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    /// `len` zero bytes; `len` must be a multiple of [`ALIGN`].
    pub fn zeroed(len: usize) -> AlignedBuf {
        let align = ALIGN as usize;
        assert!(len.is_multiple_of(align), "direct I/O length {len} is not aligned");
        let bytes = vec![0u8; len + align];
        let start = (align - bytes.as_ptr().addr() % align) % align;
        AlignedBuf { bytes, start, len }
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[self.start..self.start + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.bytes[self.start..self.start + self.len]
    }
}

/// A file opened with O_DIRECT in the directory under check, removed when dropped.
#[derive(Debug)]
pub struct ProbeFile {
    pub file: File,
    path: PathBuf,
}

impl ProbeFile {
    /// Creates a new probe file in `dir`.
    pub fn create(dir: &Path) -> io::Result<ProbeFile> {
        static PROBES: AtomicU64 = AtomicU64::new(0);
        let n = PROBES.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(".shardlog-check.{}.{n}.tmp", std::process::id()));
        let opened = std::fs::OpenOptions::new().write(true).create_new(true).custom_flags(libc::O_DIRECT).open(&path);
        match opened {
            Ok(file) => Ok(ProbeFile { file, path }),
            Err(e) => {
                // A filesystem that refuses O_DIRECT (ramfs) does so after it has created the file.
                if e.kind() != io::ErrorKind::AlreadyExists {
                    let _ = std::fs::remove_file(&path);
                }
                Err(e)
            }
        }
    }
}

impl Drop for ProbeFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Why a data dir cannot hold a broker's logs.
#[derive(Debug, thiserror::Error)]
#[error("{step} {path}: {error}. {explanation}")]
pub struct DirectIoRefused {
    step: &'static str,
    path: PathBuf,
    error: io::Error,
    explanation: &'static str,
}

impl DirectIoRefused {
    /// Whether the filesystem itself refused direct I/O (rather than the directory being unwritable).
    fn refused_by_filesystem(&self) -> bool {
        matches!(self.error.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP))
    }
}

/// Creates a file in `dir` with O_DIRECT, writes one aligned block, fdatasyncs it and removes it.
pub fn require_direct_io(dir: &Path) -> Result<(), DirectIoRefused> {
    let refused = |step, path: &Path, error: io::Error| {
        let explanation = if matches!(error.raw_os_error(), Some(libc::EINVAL | libc::EOPNOTSUPP)) {
            "The data dir's filesystem does not support O_DIRECT: shardlog writes every log with direct I/O and \
             cannot keep data there (ramfs and some FUSE and network filesystems refuse it); set log.dirs to a \
             directory on ext4 or xfs"
        } else {
            "shardlog cannot write its logs in the data dir; check its owner and permissions, or set log.dirs \
             to another directory"
        };
        DirectIoRefused { step, path: path.to_path_buf(), error, explanation }
    };
    let probe = ProbeFile::create(dir).map_err(|e| refused("create a file with O_DIRECT in", dir, e))?;
    let block = AlignedBuf::zeroed(ALIGN as usize);
    let written = probe.file.write_at(block.as_slice(), 0).map_err(|e| refused("write a block to", &probe.path, e))?;
    if written != block.as_slice().len() {
        let short = io::Error::new(io::ErrorKind::WriteZero, format!("wrote {written} of {} bytes", ALIGN));
        return Err(refused("write a block to", &probe.path, short));
    }
    probe.file.sync_data().map_err(|e| refused("fdatasync", &probe.path, e))?;
    Ok(())
}

/// The O_DIRECT row.
pub fn direct_io(dir: &Path) -> Row {
    match require_direct_io(dir) {
        Ok(()) => Row::pass(DIRECT_IO, "a 4096-byte block was written with O_DIRECT and fdatasync'ed"),
        Err(e) => {
            let fix = if e.refused_by_filesystem() {
                "set log.dirs (--data-dir) to a directory on ext4 or xfs"
            } else {
                "make the data dir writable by the broker's user, or set log.dirs (--data-dir) elsewhere"
            };
            Row::fail(DIRECT_IO, e.to_string(), fix)
        }
    }
}

/// The statfs(2) filesystem type of `dir`.
fn filesystem_magic(dir: &Path) -> io::Result<i64> {
    let path = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    // SAFETY: statfs is a plain C struct of integers, for which all zeros is a valid value.
    let mut fs: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs(2) with a NUL-terminated path and a pointer to a live statfs it may fill.
    if unsafe { libc::statfs(path.as_ptr(), &mut fs) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)] // f_type is i64 on some targets, i32 or u32 on others.
    let magic = fs.f_type as i64;
    Ok(magic)
}

/// The name of the in-memory filesystem (tmpfs, ramfs) `dir` is on, if it is on one: there O_DIRECT and
/// fdatasync may succeed, so every acknowledgement looks durable, but the data is gone when the host
/// restarts or loses power.
pub fn in_memory_filesystem(dir: &Path) -> Option<&'static str> {
    let magic = filesystem_magic(dir).ok()?;
    IN_MEMORY.iter().find(|(m, _)| *m == magic).map(|(_, name)| *name)
}

/// The filesystem row: an in-memory filesystem fails.
pub fn filesystem(dir: &Path) -> Row {
    let magic = match filesystem_magic(dir) {
        Ok(magic) => magic,
        Err(e) => return Row::warn("filesystem", format!("statfs {}: {e}", dir.display()), "check the data dir"),
    };
    if let Some((_, name)) = IN_MEMORY.iter().find(|(m, _)| *m == magic) {
        return Row::fail(
            "filesystem",
            format!("{name}: acknowledged data would live in memory and be lost when the host restarts or loses power"),
            "set log.dirs (--data-dir) to a directory on a disk (ext4 or xfs)",
        );
    }
    match NAMED.iter().find(|(m, _)| *m == magic) {
        Some((_, name)) => Row::pass("filesystem", *name),
        None => Row::pass("filesystem", format!("statfs type {magic:#x}")),
    }
}

const GIB: u64 = 1 << 30;

/// The free-space row: below `log.dir.min.free.bytes` produce would be refused from the start; below
/// four times that (at least 4 GiB) the disk fills soon. Returns the free bytes too.
pub fn free_space(dir: &Path, floor: u64) -> (Row, Option<u64>) {
    let free = match crate::disk_space::free_bytes(dir) {
        Ok(free) => free,
        Err(e) => {
            return (Row::warn("free space", format!("statvfs {}: {e}", dir.display()), "check the data dir"), None);
        }
    };
    let gib = |b: u64| format!("{:.1} GiB", b as f64 / GIB as f64);
    let row = if free < floor {
        Row::fail(
            "free space",
            format!("{} free, below log.dir.min.free.bytes ({}): produce would be refused", gib(free), gib(floor)),
            "free space on the data dir's disk, or set log.dirs (--data-dir) to a larger one",
        )
    } else if free < (4 * floor).max(4 * GIB) {
        Row::warn(
            "free space",
            format!("{} free; produce is refused below {} (log.dir.min.free.bytes)", gib(free), gib(floor)),
            "a larger disk for log.dirs, or short retention (log.retention.bytes, log.retention.ms)",
        )
    } else {
        Row::pass("free space", format!("{} free", gib(free)))
    };
    (row, Some(free))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_buf_starts_on_an_aligned_address() {
        for len in [4096, 8192, 1 << 20] {
            let mut buf = AlignedBuf::zeroed(len);
            assert_eq!(buf.as_slice().as_ptr().addr() % ALIGN as usize, 0);
            assert_eq!(buf.as_mut_slice().len(), len);
            assert!(buf.as_slice().iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn a_probe_file_is_removed_when_dropped_even_unwritten() {
        let dir = tempfile::tempdir().unwrap();
        // O_DIRECT may be refused where the test runs (tmpfs on old kernels): nothing to check then.
        if let Ok(probe) = ProbeFile::create(dir.path()) {
            drop(probe);
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
