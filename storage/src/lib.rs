//! shardlog's storage engine: partition logs of Kafka v2 record batches in segment files written with
//! direct I/O, made durable by group-commit fdatasync, indexed sparsely by offset and time, recovered by
//! validating every batch the last checkpoint does not vouch for, and trimmed by retention.
//!
//! This crate knows nothing of the network. Its file access goes through [`fs::Fs`], with a glommio
//! implementation for real disks and a simulated one that can lose unsynced writes, for crash tests.
//! The on-disk format is described in `docs/storage-format.md`.

pub mod batch;
pub mod checkpoint;
pub mod durable;
pub mod epoch_cache;
pub mod error;
pub mod fatal;
pub mod fs;
pub mod log;
pub mod log_dir;
pub mod metrics;
pub mod producer_state;
pub mod repair;
pub mod segment;
pub mod space;
pub mod txn;
pub mod types;

pub use error::{Result, StorageError};
pub use log::{
    AppendInfo, CleanedSegment, ClosedSegment, CommittedRead, CompactionConfig, FlushPolicy, Isolation, LogConfig,
    LogNews, LogRead, OpenReport, PartitionLog, Recovery,
};
pub use log_dir::{LogDir, LogDirScope};
pub use space::SpaceFloor;
pub use types::{Clock, LeaderEpoch, Offset, SystemClock, TopicPartition};
