//! Durable whole-file replacement: the one helper every checkpoint and index file goes through.
//!
//! A file is replaced by writing `<name>.tmp`, fdatasync-ing it, renaming it over `<name>`, and syncing the
//! directory. After a crash the file holds either the old or the new contents, never a mix.

use std::path::{Path, PathBuf};

use crate::error::{Result, StorageError};
use crate::fatal;
use crate::fs::{Fs, SegmentFile, align_up};

fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().expect("file path has a name").to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

/// Atomically replaces `path` with `contents`.
pub async fn replace_file<F: Fs>(fs: &F, path: &Path, contents: &[u8]) -> Result<()> {
    let tmp = tmp_path(path);
    let file = fs.open(&tmp, true).await.map_err(|e| StorageError::io("create", &tmp, e))?;
    if let Err(e) = write_whole(&file, &tmp, contents).await {
        // A full disk: the file keeps its old contents; the leftover is removed (or by the next open).
        drop(file);
        let _ = fs.remove(&tmp).await;
        return Err(e);
    }
    if let Err(e) = fs.rename(&tmp, path).await {
        fatal::disk_failure("rename", path, &e);
    }
    sync_parent(fs, path).await;
    Ok(())
}

/// Writes `contents` as the whole of `file` (direct I/O, padded then cut to size) and syncs it. A full
/// disk is [`StorageError::NoSpace`]; any other failure stops the process.
pub(crate) async fn write_whole<F: SegmentFile>(file: &F, path: &Path, contents: &[u8]) -> Result<()> {
    write_blocks(file, path, 0, contents).await?;
    if let Err(e) = file.truncate(contents.len() as u64).await {
        fatal::disk_failure("truncate", path, &e);
    }
    if let Err(e) = file.fdatasync().await {
        fatal::disk_failure("fdatasync", path, &e);
    }
    Ok(())
}

/// Writes `bytes` at `at` (a multiple of the block size), zero-padded to whole blocks. A full disk is
/// [`StorageError::NoSpace`], and the file is as before or holds a prefix of the new blocks (the caller
/// writes them again: a direct write leaves no dirty page behind, so unlike a failed buffered write it
/// can be retried); any other failure stops the process.
pub(crate) async fn write_blocks<F: SegmentFile>(file: &F, path: &Path, at: u64, bytes: &[u8]) -> Result<()> {
    let padded = align_up(bytes.len() as u64) as usize;
    if padded == 0 {
        return Ok(());
    }
    let mut buf = file.alloc(padded);
    buf.as_mut()[..bytes.len()].copy_from_slice(bytes);
    buf.as_mut()[bytes.len()..].fill(0);
    match file.write_at(buf, at).await {
        Ok(()) => Ok(()),
        // (glommio keeps the error's kind, not always its number.)
        // A direct write that stops short on a filling disk says so with WriteZero.
        Err(e)
            if e.raw_os_error() == Some(libc::ENOSPC)
                || matches!(e.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::WriteZero) =>
        {
            Err(StorageError::NoSpace { path: path.to_path_buf() })
        }
        Err(e) => fatal::disk_failure("write", path, &e),
    }
}

/// Syncs the directory holding `path`, so a creation, rename or removal in it survives a crash.
pub async fn sync_parent<F: Fs>(fs: &F, path: &Path) {
    sync_dir(fs, path.parent().expect("file path has a parent")).await
}

/// Syncs a directory's entries. A failure stops the process like a failed fdatasync.
pub async fn sync_dir<F: Fs>(fs: &F, dir: &Path) {
    if let Err(e) = fs.sync_dir(dir).await {
        fatal::disk_failure("sync directory", dir, &e);
    }
}

/// Reads a whole small file, or `None` when it does not exist. `max_bytes` bounds what is read.
pub async fn read_file<F: Fs>(fs: &F, path: &Path, max_bytes: u64) -> Result<Option<Vec<u8>>> {
    if !fs.exists(path) {
        return Ok(None);
    }
    let file = fs.open(path, false).await.map_err(|e| StorageError::io("open", path, e))?;
    let size = file.size().await.map_err(|e| StorageError::io("stat", path, e))?;
    if size > max_bytes {
        return Err(StorageError::CorruptFile {
            path: path.into(),
            detail: format!("{size} bytes exceeds the {max_bytes}-byte bound"),
        });
    }
    let bytes = file.read_at(0, size as usize).await.map_err(|e| read_failure("read", path, e))?;
    Ok(Some(bytes))
}

/// Maps a read error: EIO stops the process, anything else becomes a typed error.
pub(crate) fn read_failure(op: &'static str, path: &Path, e: std::io::Error) -> StorageError {
    if fatal::is_media_error(&e) {
        fatal::disk_failure(op, path, &e);
    }
    StorageError::io(op, path, e)
}
