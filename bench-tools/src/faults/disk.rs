//! Data directories that can fill up: each broker's data directory on its own small ext4 filesystem (an
//! image file, loop-mounted), which a disk-full fault fills to the last block with a reserved file and
//! heals by deleting it. Made by [`Disks::create`], unmounted by [`Disks::remove`], which the owner calls
//! however the campaign ends.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

use super::run;

/// The file that takes a full disk's space.
const FILLER: &str = "disk-full-filler";

/// One filesystem per broker (index = id - 1): its image and where it is mounted.
#[derive(Debug)]
pub struct Disks {
    mounts: Vec<(PathBuf, PathBuf)>,
}

/// Why this machine cannot loop-mount filesystems, or `None` when it can.
pub fn unavailable() -> Option<String> {
    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("a loop mount needs root".into());
    }
    let found = Command::new("mkfs.ext4").arg("-V").stdout(Stdio::null()).stderr(Stdio::null()).status();
    if found.is_err() {
        return Some("`mkfs.ext4` is not installed (Debian package e2fsprogs)".into());
    }
    None
}

/// Unmounts every filesystem mounted below `dir` (lazily: whatever still holds one keeps it until done).
pub fn unmount_below(dir: &Path) {
    let (Ok(dir), Ok(mounts)) = (std::fs::canonicalize(dir), std::fs::read_to_string("/proc/mounts")) else { return };
    for point in mounts.lines().filter_map(|l| l.split(' ').nth(1)) {
        // /proc/mounts escapes spaces and such as octal; a path with them is not one this tool made.
        if Path::new(point).starts_with(&dir) {
            let _ = Command::new("umount").arg("-l").arg(point).stdout(Stdio::null()).stderr(Stdio::null()).status();
        }
    }
}

impl Disks {
    /// Makes a sparse image of `bytes` per broker beside its data directory `<data>/broker-<id>` and mounts
    /// it there (ext4 without blocks reserved for root: the broker runs as root and must meet a full disk).
    pub fn create(data: &Path, brokers: usize, bytes: u64) -> Result<Disks> {
        if let Some(why) = unavailable() {
            bail!("{why}");
        }
        let mut disks = Disks { mounts: Vec::new() };
        for id in 1..=brokers {
            let image = data.join(format!("broker-{id}.img"));
            let dir = data.join(format!("broker-{id}"));
            let made = (|| -> Result<()> {
                std::fs::File::create(&image)?.set_len(bytes)?;
                run(Command::new("mkfs.ext4").args(["-q", "-F", "-m", "0"]).arg(&image))?;
                std::fs::create_dir_all(&dir)?;
                run(Command::new("mount").args(["-o", "loop"]).arg(&image).arg(&dir))
            })();
            if let Err(e) = made {
                disks.remove();
                return Err(e.context(format!("a filesystem for broker {id} at {}", dir.display())));
            }
            disks.mounts.push((image, dir));
        }
        Ok(disks)
    }

    /// Broker `id`'s data directory filled: a file reserved over every free block. Returns its size.
    pub fn fill(&self, id: usize) -> Result<u64> {
        let path = self.mounts[id - 1].1.join(FILLER);
        let file = std::fs::OpenOptions::new().create(true).write(true).truncate(false).open(&path)?;
        let fd = std::os::fd::AsRawFd::as_raw_fd(&file);
        let mut size = file.metadata()?.len();
        // Ask for all the free space, then for ever smaller pieces of what is left (metadata takes some).
        let mut want = shardlog_broker::disk_space::free_bytes(&path)?.max(4096);
        while want >= 4096 {
            // SAFETY: fallocate(2) on an open file descriptor, mode 0 (allocate and grow the file).
            if unsafe { libc::fallocate(fd, 0, size as i64, want as i64) } == 0 {
                size += want;
            } else {
                let error = std::io::Error::last_os_error();
                if error.raw_os_error() != Some(libc::ENOSPC) {
                    return Err(error).with_context(|| format!("fallocate {}", path.display()));
                }
                want /= 2;
            }
        }
        Ok(size)
    }

    /// Broker `id`'s space given back.
    pub fn free_up(&self, id: usize) -> Result<()> {
        let path = self.mounts[id - 1].1.join(FILLER);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(e).with_context(|| format!("remove {}", path.display()))
            }
            _ => Ok(()),
        }
    }

    /// Unmounts every filesystem (lazily if a broker still holds it), keeping the images: they hold the
    /// brokers' data and logs for a look after a failure (`mount -o loop IMAGE DIR`). Safe to call again.
    pub fn remove(&self) {
        for (_, dir) in &self.mounts {
            let quiet = |args: &[&str]| {
                Command::new("umount").args(args).arg(dir).stdout(Stdio::null()).stderr(Stdio::null()).status()
            };
            if !quiet(&[]).is_ok_and(|s| s.success()) {
                let _ = quiet(&["-l"]);
            }
        }
    }

    /// Deletes the images (after [`Disks::remove`]), when nothing in them is wanted.
    pub fn discard(&self) {
        for (image, _) in &self.mounts {
            let _ = std::fs::remove_file(image);
        }
    }
}
