//! What happens when the disk fails: the process stops.
//!
//! After a failed write or fdatasync the kernel may have dropped the dirty data and cleared the error, so a
//! retry could report success for bytes that are gone (the "fsyncgate" problem). The only safe answer is to
//! stop and let recovery, which trusts nothing it cannot verify, start from what is really on the disk.

use std::io::{self, Write as _};
use std::path::Path;

/// Stops the process after a write, truncate or sync failure, or an EIO on read. Never returns.
#[cold]
pub fn disk_failure(op: &'static str, path: &Path, err: &io::Error) -> ! {
    tracing::error!(op, path = %path.display(), error = %err, "disk failure; stopping the process");
    // Not eprintln!, which panics when stderr cannot be written (a log file on the same full disk): the
    // process must reach the abort, not unwind with the failure half handled.
    let _ = writeln!(io::stderr(), "shardlog: fatal disk failure: {op} {}: {err}", path.display());
    std::process::abort();
}

/// True when a read error means the medium itself is failing.
pub fn is_media_error(err: &io::Error) -> bool {
    err.raw_os_error() == Some(5) // EIO
}
