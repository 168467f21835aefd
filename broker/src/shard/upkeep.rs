//! A shard's background upkeep: interval flushes, the caches idle partitions release, retention,
//! producer expiry and checkpoints, on timers, until shutdown. Never in a request's way: each pass takes
//! the same locks an append would, one log at a time.

use std::rc::Rc;
use std::time::Duration;

use shardlog_storage::fs::dma::DmaFs;
use shardlog_storage::{Clock, FlushPolicy, LogDir, SystemClock};

use crate::config::ShardLimits;
use crate::shutdown::Shutdown;

use super::{ReadAhead, ShardReplicas};

/// How often interval-policy logs are checked for a due flush.
const FLUSH_CHECK_INTERVAL: Duration = Duration::from_millis(100);
/// How often retention runs (Kafka's `log.retention.check.interval.ms` default).
const RETENTION_CHECK_INTERVAL: Duration = Duration::from_secs(300);
/// What a released cache may still hold: the partial last block, rewritten by the next write-out.
const RELEASED_CACHE_BYTES: usize = 4096;
/// How often the checkpoints are written when their offsets moved. Kafka writes its recovery point every
/// 60 s (`log.flush.offset.checkpoint.interval.ms`), so a restart after a crash validates up to a minute
/// of data; every second keeps that to the last second's, for a few small atomic writes a second.
const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(1);

/// Background upkeep: interval flushes, releasing what idle partitions hold and reads made ahead nobody
/// took, retention, checkpoints;
/// stops at shutdown.
pub async fn upkeep(
    logs: Rc<LogDir<DmaFs>>,
    replicas: Rc<ShardReplicas>,
    readahead: Rc<ReadAhead<DmaFs>>,
    limits: ShardLimits,
    shutdown: Shutdown,
) {
    let mut since_retention = Duration::ZERO;
    let mut since_checkpoint = Duration::ZERO;
    // A checkpoint that fails (a full disk) is retried every second: told once until it succeeds again.
    let mut checkpoints_failing = crate::logging::Episode::default();
    loop {
        if shutdown.sleep(FLUSH_CHECK_INTERVAL).await {
            return;
        }
        since_retention += FLUSH_CHECK_INTERVAL;
        since_checkpoint += FLUSH_CHECK_INTERVAL;
        // Files a burst held open past shard.open.files.max are closed once its operations let them go.
        logs.trim_open_files();
        let mut synced = std::collections::HashSet::new();
        for log in logs.logs() {
            // Under the default policy only acknowledged produces sync; acks=0 data would otherwise stay
            // above the high watermark until the next one.
            let result = match log.config().flush {
                FlushPolicy::Always if log.durable_offset() < log.log_end_offset() => log.flush().await.map(|_| true),
                FlushPolicy::Always => Ok(false),
                FlushPolicy::Interval { .. } => log.flush_if_due().await,
            };
            match result {
                Ok(true) => {
                    synced.insert(Rc::as_ptr(&log));
                }
                Ok(false) => {}
                Err(e) => tracing::warn!(log = %log.dir().display(), error = %e, "background flush failed"),
            }
        }
        if !synced.is_empty() {
            // The HW follows at once, so consumers held for news of these partitions hear of it.
            for (tp, log) in logs.entries() {
                if synced.contains(&Rc::as_ptr(&log)) {
                    replicas.log_moved(&tp, &log);
                }
            }
        }
        release_caches(&logs, &limits).await;
        readahead.expire(std::time::Instant::now());
        if since_retention >= RETENTION_CHECK_INTERVAL || since_checkpoint >= CHECKPOINT_INTERVAL {
            replicas.settle_all(&logs);
        }
        if since_retention >= RETENTION_CHECK_INTERVAL {
            since_retention = Duration::ZERO;
            if let Err(e) = logs.apply_retention().await {
                tracing::warn!(error = %e, "retention pass failed");
            }
            for log in logs.logs() {
                log.expire_producers();
            }
        }
        if since_checkpoint >= CHECKPOINT_INTERVAL {
            since_checkpoint = Duration::ZERO;
            let now = std::time::Instant::now();
            match logs.checkpoint_if_moved().await {
                Err(e) if checkpoints_failing.failed(now) => tracing::warn!(
                    error = %e,
                    "checkpoint failed; retried every second, and said again only once it succeeds"
                ),
                Err(_) => {}
                Ok(_) => {
                    if let Some((failures, lasted)) = checkpoints_failing.succeeded(now) {
                        tracing::info!(failures, lasted_s = lasted.as_secs(), "checkpoints written again");
                    }
                }
            }
        }
    }
}

/// Keeps the shard within its limits: partitions unused for `cache_idle_ms` release their cached data and
/// close their files; while the shard's caches together hold more than `cache_max_bytes`, the least
/// recently used partitions release theirs too.
async fn release_caches(logs: &LogDir<DmaFs>, limits: &ShardLimits) {
    let now = SystemClock.now_ms();
    let mut total = 0usize;
    let mut candidates = Vec::new();
    for log in logs.logs() {
        let cached = log.cached_bytes();
        total += cached;
        let idle = now.saturating_sub(log.last_used_ms()) >= limits.cache_idle_ms;
        let holds_something = cached > RELEASED_CACHE_BYTES || log.holds_open_files();
        if holds_something {
            candidates.push((!idle, log.last_used_ms(), log));
        }
    }
    // Idle partitions first, then the least recently used, until the shard is within its budget.
    candidates.sort_by_key(|(busy, last_used, _)| (*busy, *last_used));
    for (busy, _, log) in candidates {
        if busy && total <= limits.cache_max_bytes {
            break;
        }
        let before = log.cached_bytes();
        if let Err(e) = log.release_cache().await {
            tracing::warn!(error = %e, "releasing a partition's cache failed");
        }
        total = total.saturating_sub(before.saturating_sub(log.cached_bytes()));
    }
}
