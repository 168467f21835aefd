//! Offline replicas: each shard tells the quorum which of its partitions' logs are offline (damaged,
//! found so at open or met by a read since) and which are back, and rebuilds a damaged replica from the
//! partition's leader when another replica was in sync.
//!
//! Reporting is a reconciliation: every [`TICK`] the shard compares its log dir with what the metadata
//! says of its replicas and proposes `SetReplicaOffline` for each difference, one proposal at a time per
//! partition. A report that is lost is made again at the next look; one the quorum already has changes
//! nothing. The quorum then moves leadership to another in-sync replica at a new epoch and takes the
//! damaged one out of the ISR; as the ISR's last member it keeps it, leading read-only.
//!
//! Rebuilding, in this order (each step is safe to repeat after a restart part way):
//! 1. wait until the metadata has this replica offline and out of the ISR, with another broker leading:
//!    everything committed is then on the ISR, and nothing here needs keeping but what is intact. (As the
//!    ISR's last member the replica is never rebuilt: the partition waits for `shardlog repair` or an
//!    unclean election.)
//! 2. a log that met damage while open is shut, without writing anything more to it;
//! 3. the log is cut before its first batch that does not check, what is cut moved aside into
//!    `<topic>-<partition>.cut.<n>` (kept for inspection, never deleted, counted against
//!    `log.dir.min.free.bytes` like any file), and the damage marker removed last
//!    ([`repair::truncate_at_damage`], on a thread of its own: it reads the whole log). A restart before
//!    the marker is gone starts again from here;
//! 4. the log is opened again and follows the leader as any follower: OffsetForLeaderEpoch truncates it
//!    where the leader's history differs (the high-watermark checkpoint is not trusted for that), every
//!    fetched batch's CRC32C is checked before it is appended, and the report that the replica is back
//!    lets the leader add it to the ISR once it has caught up.
//!
//! Damage again within [`FAILING_DISK_WINDOW_MS`] of a rebuild on this broker (`replica-rebuilds` in the
//! data dir remembers them across restarts) means a failing disk rather than a stray bit: instead of a
//! second rebuild, the whole data dir goes offline ([`LogDir::take_dir_offline`]; every shard sees its
//! marker and follows), every replica is reported offline, and nothing is rebuilt until an operator
//! removes the marker.

use std::cell::RefCell;
use std::collections::HashSet;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_lite::future;
use shardlog_storage::fs::dma::DmaFs;
use shardlog_storage::log_dir::LOG_DIR_OFFLINE_FILE;
use shardlog_storage::repair::{self, RepairError, RepairReport};
use shardlog_storage::{Clock, LogDir, SystemClock, TopicPartition};

use crate::context::BrokerContext;
use crate::quorum::state::{Command, NodeId, PartitionRecord};
use crate::quorum::wire::WireWriteResult;
use crate::shard::ShardReplicas;
use crate::shutdown::Shutdown;
use crate::topics::configs::TopicConfig;

/// How often a shard compares its offline logs with the metadata.
const TICK: Duration = Duration::from_millis(200);
/// How long a report waits for the quorum, and then for the metadata to show it, before the next look
/// may make it again.
const REPORT_WAIT: Duration = Duration::from_secs(5);
/// A rebuild this soon after the last one takes the data dir offline instead (Kafka's answer to a disk
/// error: the log dir goes offline).
const FAILING_DISK_WINDOW_MS: i64 = 3_600_000;
/// The data dir file of the times (ms since the epoch) of this broker's last rebuilds, a line each.
pub const REBUILDS_FILE: &str = "replica-rebuilds";
/// How many rebuild times the file keeps.
const REBUILDS_KEPT: usize = 16;
/// Shards rebuild on threads of their own: one at a time reads and writes [`REBUILDS_FILE`].
static REBUILDS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// A shard's offline replicas: reported, and rebuilt where they may be (see the module documentation).
pub(super) async fn run(
    ctx: Arc<BrokerContext>,
    logs: Rc<LogDir<DmaFs>>,
    replicas: Rc<ShardReplicas>,
    shutdown: Shutdown,
) {
    let me = NodeId(ctx.config.node_id);
    // Partitions with a report or a rebuild under way, and those whose rebuild failed (left offline for
    // an operator; the ERROR said why).
    let busy: Rc<RefCell<HashSet<TopicPartition>>> = Rc::default();
    let given_up: Rc<RefCell<HashSet<TopicPartition>>> = Rc::default();
    loop {
        let stopped = future::or(
            async {
                shutdown.wait().await;
                true
            },
            async {
                glommio::timer::sleep(TICK).await;
                false
            },
        )
        .await;
        if stopped {
            return;
        }
        if logs.dir_offline().is_none() && logs.dir_offline_marked() {
            take_dir_offline(&logs, &replicas, "another shard took the data dir offline").await;
        }
        let Some(registered_at) = ctx.quorum.registered_at() else { continue };
        let image = ctx.image();
        if image.applied < Some(registered_at) {
            continue;
        }
        for tp in logs.partitions() {
            if busy.borrow().contains(&tp) {
                continue;
            }
            let Some(record) = image.partition(&tp.topic, tp.partition as i32) else { continue };
            if !record.replicas.contains(&me) {
                continue;
            }
            let offline_here = logs.offline(&tp).is_some();
            let offline_there = record.offline_replicas.contains(&me);
            let work = if offline_here != offline_there {
                Some(Work::Report(offline_here))
            } else if offline_here
                && logs.dir_offline().is_none()
                && !given_up.borrow().contains(&tp)
                && may_rebuild(record, me)
            {
                Some(Work::Rebuild)
            } else {
                None
            };
            let Some(work) = work else { continue };
            busy.borrow_mut().insert(tp.clone());
            let (ctx, logs, replicas, busy, given_up) =
                (ctx.clone(), logs.clone(), replicas.clone(), busy.clone(), given_up.clone());
            glommio::spawn_local(async move {
                match work {
                    Work::Report(offline) => report(&ctx, &tp, offline).await,
                    Work::Rebuild => {
                        if !rebuild(&ctx, &logs, &replicas, &tp).await {
                            given_up.borrow_mut().insert(tp.clone());
                        }
                    }
                }
                busy.borrow_mut().remove(&tp);
            })
            .detach();
        }
    }
}

enum Work {
    /// Tell the quorum the replica is offline (`true`) or back.
    Report(bool),
    Rebuild,
}

/// Whether the quorum has this replica offline, out of the ISR, with another broker leading: the ISR
/// holds everything committed without it.
fn may_rebuild(record: &PartitionRecord, me: NodeId) -> bool {
    record.offline_replicas.contains(&me) && !record.isr.contains(&me) && record.leader.is_some_and(|l| l != me)
}

/// Proposes the replica's state, then waits (a bounded time) for the metadata to show it, so that the
/// next look does not propose it again meanwhile.
async fn report(ctx: &Arc<BrokerContext>, tp: &TopicPartition, offline: bool) {
    let me = NodeId(ctx.config.node_id);
    let command = Command::SetReplicaOffline {
        id: me,
        incarnation: ctx.quorum.incarnation(),
        topic: tp.topic.clone(),
        partition: tp.partition,
        offline,
    };
    let deadline = std::time::Instant::now() + REPORT_WAIT;
    let written = future::or(async { Some(ctx.quorum.write(command).await) }, async {
        glommio::timer::sleep(REPORT_WAIT).await;
        None
    })
    .await;
    match written {
        Some(WireWriteResult::Applied { outcome: Ok(_), .. }) if offline => {
            tracing::info!(partition = %tp, "told the quorum this replica is offline")
        }
        Some(WireWriteResult::Applied { outcome: Ok(_), .. }) => {
            tracing::info!(partition = %tp, "told the quorum this replica is back")
        }
        Some(WireWriteResult::Applied { outcome: Err(e), .. }) => {
            tracing::debug!(partition = %tp, error = %e, "offline report refused")
        }
        other => tracing::debug!(partition = %tp, outcome = ?other, "offline report not committed"),
    }
    while std::time::Instant::now() < deadline {
        let shown = ctx
            .image()
            .partition(&tp.topic, tp.partition as i32)
            .is_none_or(|record| record.offline_replicas.contains(&me) == offline);
        if shown {
            return;
        }
        glommio::timer::sleep(Duration::from_millis(50)).await;
    }
}

/// Rebuilds a damaged replica (steps 2 to 4 of the module documentation). Returns false if it could not,
/// and the replica stays offline for an operator.
async fn rebuild(
    ctx: &Arc<BrokerContext>,
    logs: &LogDir<DmaFs>,
    replicas: &ShardReplicas,
    tp: &TopicPartition,
) -> bool {
    if logs.shut_damaged(tp).await {
        replicas.remove(tp);
    }
    let dir = logs.path().join(tp.dir_name());
    match cut_before_damage(dir.clone()).await {
        Ok(Cut::FailingDisk { previous_ms }) => {
            let reason = format!(
                "damage in {tp} {} s after this broker last rebuilt a damaged replica: the disk looks failing",
                (SystemClock.now_ms() - previous_ms) / 1000
            );
            tracing::error!(
                partition = %tp,
                %reason,
                "taking the whole data dir offline: every replica here is reported offline and none is rebuilt; \
                 replace the disk, then remove {}",
                logs.path().join(LOG_DIR_OFFLINE_FILE).display()
            );
            take_dir_offline(logs, replicas, &reason).await;
            return true;
        }
        Ok(Cut::Done(report)) => tracing::warn!(
            partition = %tp,
            log_end = %report.log_end,
            reason = %report.cut_reason,
            aside = %report.aside.display(),
            "damaged replica cut before its damage and rebuilt from the leader; what was cut is kept aside for \
             inspection (remove it when done)"
        ),
        Err(e) => {
            tracing::error!(partition = %tp, error = %e, "cannot cut the damaged replica; it stays offline");
            return false;
        }
    }
    let image = ctx.image();
    let Some(topic) = image.topic(&tp.topic) else { return true };
    let defaults = ctx.topic_defaults();
    let (config, min_insync_replicas) = TopicConfig::resolve(&defaults, &topic.configs)
        .map_or_else(|_| (defaults.log.clone(), defaults.min_insync_replicas), |c| (c.log, c.min_insync_replicas));
    match logs.reopen(tp, config).await {
        Ok(log) => {
            if let Some(record) = topic.partitions.get(tp.partition as usize) {
                replicas.apply_record(tp, topic.id, record, min_insync_replicas, &log);
            }
            // Recorded once done, so that a restart part way resumes it rather than count it twice.
            let rebuilt = logs.path().join(REBUILDS_FILE);
            on_thread(move || record_rebuild(&rebuilt, SystemClock.now_ms())).await;
            true
        }
        Err(e) => {
            tracing::error!(partition = %tp, error = %e, "the cut replica does not open; it stays offline");
            false
        }
    }
}

/// What a rebuild's cut did.
enum Cut {
    Done(RepairReport),
    /// Nothing: this broker rebuilt a replica at `previous_ms`, within [`FAILING_DISK_WINDOW_MS`].
    FailingDisk {
        previous_ms: i64,
    },
}

/// Takes the data dir offline (see the module documentation): this shard's logs close, and its replicas
/// stop leading or following.
async fn take_dir_offline(logs: &LogDir<DmaFs>, replicas: &ShardReplicas, reason: &str) {
    if let Err(e) = logs.take_dir_offline(reason).await {
        tracing::error!(error = %e, "taking the data dir offline failed");
    }
    for tp in logs.partitions() {
        replicas.remove(&tp);
    }
}

/// Unless this broker completed a rebuild within [`FAILING_DISK_WINDOW_MS`], cuts the log in `dir` before
/// its first batch that does not check; if every batch
/// checks (the damage was elsewhere: a segment missing at the end, an unreadable leader-epoch file), the
/// whole log is moved aside and the replica starts empty. Runs on a thread of its own.
async fn cut_before_damage(dir: PathBuf) -> Result<Cut, RepairError> {
    let cut = on_thread(move || {
        let data_dir = dir.parent().map(PathBuf::from).unwrap_or_default();
        if let Some(previous_ms) = last_rebuild_within_window(&data_dir.join(REBUILDS_FILE), SystemClock.now_ms()) {
            return Ok(Cut::FailingDisk { previous_ms });
        }
        let cut = repair::truncate_at_damage(&dir).and_then(|cut| match cut {
            Some(report) => Ok(report),
            None => repair::move_aside_whole(&dir),
        });
        cut.map(Cut::Done)
    })
    .await;
    cut.unwrap_or_else(|| {
        let source = std::io::Error::other("no thread could be started for it");
        Err(RepairError::Io { path: PathBuf::from("replica-rebuild thread"), source })
    })
}

/// Runs `work` on a thread of its own and waits for what it returns (file work that must not hold up the
/// shard); `None` if no thread could be started.
async fn on_thread<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (done, finished) = flume::bounded(1);
    std::thread::Builder::new()
        .name("replica-rebuild".into())
        .spawn(move || {
            let _ = done.send(work());
        })
        .ok()?;
    finished.recv_async().await.ok()
}

/// The times of the rebuilds recorded in `path`.
fn rebuilds(path: &std::path::Path) -> Vec<i64> {
    std::fs::read_to_string(path).unwrap_or_default().lines().filter_map(|line| line.trim().parse().ok()).collect()
}

/// The last rebuild completed, as recorded in `path`, if it was within [`FAILING_DISK_WINDOW_MS`] of
/// `now_ms` (a clock that went back counts as within). One cut short by a restart was not recorded: it
/// is resumed, not taken for a second damage.
fn last_rebuild_within_window(path: &std::path::Path, now_ms: i64) -> Option<i64> {
    let _one_at_a_time = REBUILDS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    rebuilds(path).into_iter().max().filter(|&last| now_ms.saturating_sub(last) < FAILING_DISK_WINDOW_MS)
}

/// Records a completed rebuild at `now_ms` in `path`, durably.
fn record_rebuild(path: &std::path::Path, now_ms: i64) {
    let _one_at_a_time = REBUILDS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut times = rebuilds(path);
    times.push(now_ms);
    let keep_from = times.len().saturating_sub(REBUILDS_KEPT);
    let text: String = times[keep_from..].iter().map(|t| format!("{t}\n")).collect();
    crate::quorum::log_store::replace_file(path, text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rebuild_within_the_hour_of_a_completed_one_is_refused_and_one_cut_short_is_not_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(REBUILDS_FILE);
        assert_eq!(last_rebuild_within_window(&path, 1_000), None, "the first rebuild");
        // Cut short by a restart (never recorded): resumed at once.
        assert_eq!(last_rebuild_within_window(&path, 2_000), None);
        record_rebuild(&path, 2_500);
        let within = 2_500 + FAILING_DISK_WINDOW_MS - 1;
        assert_eq!(last_rebuild_within_window(&path, within), Some(2_500), "within the hour");
        assert_eq!(last_rebuild_within_window(&path, 2_000), Some(2_500), "a clock that went back");
        assert_eq!(last_rebuild_within_window(&path, 2_500 + FAILING_DISK_WINDOW_MS), None, "an hour later");
        record_rebuild(&path, 9_000_000);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "2500\n9000000\n");
    }
}
