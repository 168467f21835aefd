//! The crate's error type. Expected operating errors only: a failing disk never comes back as an error
//! value, it stops the process (see [`crate::fatal`]).

use std::io;
use std::path::PathBuf;

use crate::batch::BatchError;
use crate::producer_state::ProducerError;
use crate::types::Offset;

/// Everything a storage operation can refuse or fail with.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The batch was refused before anything was written.
    #[error("invalid record batch: {0}")]
    InvalidBatch(#[from] BatchError),

    /// An I/O operation failed in a way that does not threaten durability (open, list, read of a missing
    /// file, ...). The operation and path say what was being done.
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// An idempotent producer's batch broke the sequence rules; nothing was written.
    #[error("{0}")]
    Producer(#[from] ProducerError),

    /// A replicated batch does not start where the log ends (or where the batch before it ended).
    #[error("replicated batch starts at offset {got}, where {expected} was expected")]
    NotAtLogEnd { expected: Offset, got: i64 },

    /// A read or truncation asked for an offset the log does not hold.
    #[error("offset {requested} is out of range: log holds [{log_start}, {log_end})")]
    OffsetOutOfRange { requested: Offset, log_start: Offset, log_end: Offset },

    /// A durability wait was for data a truncation removed (the log end moved below it).
    #[error("offset {offset} was truncated away: the log now ends at {log_end}")]
    Truncated { offset: Offset, log_end: Offset },

    /// A metadata file (checkpoint, leader-epoch file) could not be parsed.
    #[error("corrupt {path}: {detail}")]
    CorruptFile { path: PathBuf, detail: String },

    /// A configuration value is out of its allowed range.
    #[error("invalid log configuration: {0}")]
    InvalidConfig(String),

    /// An append carried a leader epoch older than one the log already holds.
    #[error("leader epoch {epoch} is older than the log's latest epoch {latest}")]
    StaleEpoch { epoch: i32, latest: i32 },

    /// The log holds damage no crash can explain (a bad length or CRC where the bytes were durable): the
    /// disk lost data. The partition is taken offline with every file kept, until an operator repairs it
    /// (`shardlog repair`).
    #[error("damaged log: {path} at byte {position} (offset {offset}): {reason}")]
    Damaged { path: PathBuf, position: u64, offset: Offset, reason: String },

    /// The disk has no room for the active segment to grow: nothing was written; the data waits in
    /// memory and the write-out is tried again by the next append or sync.
    #[error("no space left on the disk for {path}")]
    NoSpace { path: PathBuf },

    /// Reserving room for the append would leave less than the free-space floor on the disk
    /// (`log.dir.min.free.bytes`, see [`crate::space`]): nothing was appended.
    #[error(
        "the disk of {path} has {free_bytes} bytes free: reserving more would leave less than \
         log.dir.min.free.bytes ({floor_bytes})"
    )]
    BelowFloor { path: PathBuf, free_bytes: u64, floor_bytes: u64 },

    /// The partition is offline: its log was found damaged (the text says where).
    #[error("partition offline: {0}")]
    Offline(String),

    /// The log has been closed or deleted.
    #[error("log {0} is closed")]
    Closed(PathBuf),
}

impl StorageError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        StorageError::Io { op, path: path.into(), source }
    }
}

/// Shorthand for storage results.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;
