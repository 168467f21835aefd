//! Per-partition log settings, with Kafka's topic config names and defaults.

use crate::batch::HEADER_BYTES;
use crate::error::{Result, StorageError};

/// When appended data is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushPolicy {
    /// Every acknowledged append is fdatasync'ed first (group commit keeps this cheap). shardlog's default.
    Always,
    /// Kafka's policy: sync once `messages` records are unflushed or `ms` milliseconds have passed since the
    /// last sync (`flush.messages`, `flush.ms`). `PartitionLog::flush_if_due` writes appended data to the
    /// file and syncs when due; the caller calls it after appends and on a timer. A bound of `u64::MAX`
    /// (one of the two settings left unset) or Kafka's `i64::MAX` is never reached.
    Interval { messages: u64, ms: u64 },
}

/// Settings of one partition log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// `segment.bytes`: a segment is rolled before it would grow past this. Default 1 GiB.
    pub segment_bytes: u64,
    /// `segment.ms`: a non-empty segment older than this is rolled on the next append. Default 7 days.
    pub segment_ms: i64,
    /// `index.interval.bytes`: bytes between sparse index entries. Default 4096.
    pub index_interval_bytes: u64,
    /// `max.message.bytes`: the largest batch accepted. Default 1048588 (Kafka's).
    pub max_message_bytes: usize,
    /// `retention.ms`: segments whose newest record is older are deleted; `None` keeps them (-1). Default 7 days.
    pub retention_ms: Option<i64>,
    /// `retention.bytes`: oldest segments are deleted while the log exceeds this; `None` means no limit (-1).
    pub retention_bytes: Option<u64>,
    /// `flush.messages` / `flush.ms`, or shardlog's `Always`.
    pub flush: FlushPolicy,
    /// Memory that keeps the active segment's recent bytes to serve reads of recent data (the buffers it
    /// holds, whole; see `tail`). Default 4 MiB.
    pub tail_cache_bytes: usize,
    /// Appended bytes that may wait in memory for a write before appends wait for one. Default 16 MiB.
    pub max_unwritten_bytes: usize,
    /// The active segment's file is allocated (fallocate) ahead of its writes, by as much as it holds
    /// but at most this many bytes (and at least 64 KiB), so that writes land in reserved blocks and a
    /// full disk is met by the allocation, as a refusal, never in the middle of a write. 0: the file
    /// grows with its writes. Default 32 MiB.
    pub preallocate_bytes: u64,
    /// Reserve by writing zeros (the blocks are then written, not just allocated) rather than with
    /// fallocate. Default false (see `docs/performance.md` for the two measured side by side).
    pub preallocate_with_zeros: bool,
    /// `producer.id.expiration.ms`: an idempotent producer whose last batch is this old is forgotten by
    /// the partition. Default 1 day (Kafka's).
    pub producer_id_expiration_ms: i64,
    /// `cleanup.policy` holds `compact`: the settings the broker's cleaner compacts the log by. The log
    /// itself only keeps what compaction rewrites consistent (see `log::compaction`).
    pub compaction: Option<CompactionConfig>,
}

/// How a compacted log is cleaned (Kafka's topic settings of the same names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompactionConfig {
    /// `delete.retention.ms`: how long a tombstone (a record with a key and no value) is kept once it is
    /// the latest record of its key. Default 1 day.
    pub delete_retention_ms: i64,
    /// `min.cleanable.dirty.ratio`, in millionths: the log is cleaned once the bytes written since the last
    /// cleaning are at least this share of the cleanable bytes. Default 0.5.
    pub min_cleanable_dirty_ratio_ppm: u32,
    /// `min.compaction.lag.ms`: a record stays uncompacted at least this long. Default 0.
    pub min_compaction_lag_ms: i64,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        CompactionConfig {
            delete_retention_ms: 86_400_000,
            min_cleanable_dirty_ratio_ppm: 500_000,
            min_compaction_lag_ms: 0,
        }
    }
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            segment_bytes: 1 << 30,
            segment_ms: 7 * 24 * 3600 * 1000,
            index_interval_bytes: 4096,
            max_message_bytes: 1_048_588,
            retention_ms: Some(7 * 24 * 3600 * 1000),
            retention_bytes: None,
            flush: FlushPolicy::Always,
            tail_cache_bytes: 4 << 20,
            max_unwritten_bytes: 16 << 20,
            preallocate_bytes: 32 << 20,
            preallocate_with_zeros: false,
            producer_id_expiration_ms: crate::producer_state::DEFAULT_PRODUCER_ID_EXPIRATION_MS,
            compaction: None,
        }
    }
}

impl LogConfig {
    /// Checks every value's range; the log only ever runs with a validated config.
    pub fn validate(&self) -> Result<()> {
        let bad = |msg: String| Err(StorageError::InvalidConfig(msg));
        if self.segment_bytes < HEADER_BYTES as u64 || self.segment_bytes > i32::MAX as u64 {
            return bad(format!("segment.bytes {} must be in [{HEADER_BYTES}, {}]", self.segment_bytes, i32::MAX));
        }
        if self.segment_ms <= 0 {
            return bad(format!("segment.ms {} must be positive", self.segment_ms));
        }
        if self.index_interval_bytes == 0 {
            return bad("index.interval.bytes must be positive".into());
        }
        if self.max_message_bytes < HEADER_BYTES || self.max_message_bytes > i32::MAX as usize {
            return bad(format!(
                "max.message.bytes {} must be in [{HEADER_BYTES}, {}]",
                self.max_message_bytes,
                i32::MAX
            ));
        }
        if let Some(ms) = self.retention_ms
            && ms < 0
        {
            return bad(format!("retention.ms {ms} must be -1 or non-negative"));
        }
        if let FlushPolicy::Interval { messages, ms } = self.flush
            && (messages == 0 || ms == 0)
        {
            return bad("flush.messages and flush.ms must be positive".into());
        }
        if self.producer_id_expiration_ms <= 0 {
            return bad(format!("producer.id.expiration.ms {} must be positive", self.producer_id_expiration_ms));
        }
        if self.max_unwritten_bytes == 0 {
            return bad("max unwritten bytes must be positive".into());
        }
        Ok(())
    }
}
