//! A data directory: the partition logs in it, its checkpoints, and its clean-shutdown marker.
//!
//! | file                               | contents                                                  |
//! |------------------------------------|-----------------------------------------------------------|
//! | `recovery-point-offset-checkpoint` | per partition, the offset below which everything was synced |
//! | `log-start-offset-checkpoint`      | per partition, the log start offset (retention, DeleteRecords) |
//! | `replication-offset-checkpoint`    | per partition, the high watermark                         |
//! | `.shardlog-clean-shutdown`         | present only between a clean close and the next open      |
//! | `log-dir-offline`                  | present while the whole dir is offline (a failing disk)    |
//!
//! Checkpoints are replaced whole and atomically. The marker is removed (durably) when the directory is
//! opened, so a crash at any later moment makes the next open scan past each log's recovery point.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

use async_lock::Mutex;

use crate::checkpoint::{self, OffsetCheckpoint};
use crate::durable;
use crate::error::{Result, StorageError};
use crate::fatal;
use crate::fs::Fs;
use crate::fs::device_flush::DeviceFlush;
use crate::fs::open_files::{DEFAULT_MAX_OPEN_FILES, OpenFiles};
use crate::log::maintenance::{DELETED_SUFFIX, remove_dir_contents};
use crate::log::{DAMAGED_FILE, LogConfig, OnDamage, OpenHints, OpenReport, PartitionLog, Recovery, take_offline};
use crate::producer_state::ProducerBudget;
use crate::space::SpaceFloor;
use crate::types::{Clock, Offset, TopicPartition};

pub const RECOVERY_POINT_FILE: &str = "recovery-point-offset-checkpoint";
pub const LOG_START_FILE: &str = "log-start-offset-checkpoint";
pub const HIGH_WATERMARK_FILE: &str = "replication-offset-checkpoint";
pub const CLEAN_SHUTDOWN_FILE: &str = ".shardlog-clean-shutdown";
/// Present while the whole data dir is offline (its disk looks failing: damage found again soon after a
/// replica was rebuilt); holds why. No log is opened or created while it is there; an operator removes
/// it (after replacing the disk) to bring the dir back.
pub const LOG_DIR_OFFLINE_FILE: &str = "log-dir-offline";

/// Logs closed, or whose index files are written, at once ([`LogDir::close`], [`LogDir::checkpoint`]).
pub const LOGS_IN_FLIGHT: usize = 64;

/// The partition logs of one data directory.
pub struct LogDir<F: Fs> {
    fs: F,
    /// Segment files of every log here, opened on demand under one bound.
    files: Rc<OpenFiles<F>>,
    /// Producer ids every log here remembers, under one bound.
    producer_budget: Rc<ProducerBudget>,
    /// The free-space floor every log here reserves against.
    space: Arc<SpaceFloor>,
    clock: Rc<dyn Clock>,
    path: PathBuf,
    logs: RefCell<BTreeMap<TopicPartition, Rc<PartitionLog<F>>>>,
    /// Partitions whose logs are damaged (found so at open): not served, every file kept.
    offline: RefCell<BTreeMap<TopicPartition, Offline>>,
    /// Why the whole dir is offline, while it is ([`LOG_DIR_OFFLINE_FILE`]): every partition is then in
    /// `offline`.
    dir_offline: RefCell<Option<String>>,
    /// What the checkpoints said of the logs opened damaged (served read-only up to their damage): written
    /// back unchanged, for their rebuild or repair.
    damaged_hints: RefCell<BTreeMap<TopicPartition, OpenHints>>,
    checkpoint_lock: Mutex<()>,
    /// What the checkpoint files hold, as last written (recovery points, log starts, high watermarks):
    /// [`LogDir::checkpoint_if_moved`] writes only the files whose offsets have moved since.
    written: RefCell<[OffsetCheckpoint; 3]>,
    create_lock: Mutex<()>,
    /// `.<scope name>` for a scoped dir, empty otherwise: part of the checkpoint and marker names.
    suffix: String,
}

impl<F: Fs> std::fmt::Debug for LogDir<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogDir").field("path", &self.path).field("logs", &self.logs.borrow().len()).finish()
    }
}

/// A partition kept offline: why, and what the checkpoints said of it (written back unchanged).
#[derive(Debug, Clone)]
struct Offline {
    damage: String,
    hints: OpenHints,
}

/// Which partitions of a shared data dir one owner (a shard) opens, and the suffix that keeps its
/// checkpoint files and clean-shutdown marker apart from the other owners'.
pub struct LogDirScope {
    /// Appended to the checkpoint and marker file names as `.<name>`.
    pub name: String,
    /// Whether a partition belongs to this owner.
    pub owns: Box<dyn Fn(&TopicPartition) -> bool>,
    /// The most segment files this owner keeps open at once.
    pub max_open_files: usize,
    /// The most producer ids this owner's logs remember together (see [`ProducerBudget`]).
    pub max_producer_ids: usize,
    /// The free space the logs' reservations leave on the disk, shared with the other owners of the
    /// data dir (see [`SpaceFloor`]); `None`: reservations stop only at a full disk.
    pub space_floor: Option<Arc<SpaceFloor>>,
}

impl std::fmt::Debug for LogDirScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogDirScope").field("name", &self.name).finish()
    }
}

impl<F: Fs> LogDir<F> {
    /// Opens every partition log in `path` (creating the directory if needed). `config_for` gives each
    /// partition's settings. Returns what recovery found per partition.
    pub async fn open(
        fs: F,
        clock: Rc<dyn Clock>,
        path: &Path,
        config_for: impl Fn(&TopicPartition) -> LogConfig,
    ) -> Result<(LogDir<F>, Vec<(TopicPartition, OpenReport)>)> {
        Self::open_scoped(fs, clock, path, None, config_for).await
    }

    /// Like [`LogDir::open`], for one of several owners sharing the data dir: only the partitions the
    /// scope owns are opened, and the checkpoints and marker carry the scope's name. Leftovers of other
    /// owners (their temporaries, their half-deleted partitions) are left to them.
    pub async fn open_scoped(
        fs: F,
        clock: Rc<dyn Clock>,
        path: &Path,
        scope: Option<LogDirScope>,
        config_for: impl Fn(&TopicPartition) -> LogConfig,
    ) -> Result<(LogDir<F>, Vec<(TopicPartition, OpenReport)>)> {
        if !fs.exists(path) {
            fs.create_dir_all(path).await.map_err(|e| StorageError::io("create data dir", path, e))?;
            durable::sync_parent(&fs, path).await;
        }
        let suffix = scope.as_ref().map_or(String::new(), |s| format!(".{}", s.name));
        let owns = |tp: &TopicPartition| scope.as_ref().is_none_or(|s| (s.owns)(tp));
        let device = DeviceFlush::open(&fs, path, &suffix).await?;
        let files = OpenFiles::with_device_flush(
            fs.clone(),
            scope.as_ref().map_or(DEFAULT_MAX_OPEN_FILES, |s| s.max_open_files),
            device,
        );
        let producer_budget =
            Rc::new(scope.as_ref().map_or_else(ProducerBudget::unlimited, |s| ProducerBudget::new(s.max_producer_ids)));
        let space = scope.as_ref().and_then(|s| s.space_floor.clone()).unwrap_or_else(|| SpaceFloor::new(0));
        let marker = path.join(format!("{CLEAN_SHUTDOWN_FILE}{suffix}"));
        let clean = fs.exists(&marker);
        let recovery_points =
            checkpoint::read_offsets(&fs, &path.join(format!("{RECOVERY_POINT_FILE}{suffix}"))).await?;
        let log_starts = checkpoint::read_offsets(&fs, &path.join(format!("{LOG_START_FILE}{suffix}"))).await?;
        let hws = checkpoint::read_offsets(&fs, &path.join(format!("{HIGH_WATERMARK_FILE}{suffix}"))).await?;
        let own_files: Vec<String> = [RECOVERY_POINT_FILE, LOG_START_FILE, HIGH_WATERMARK_FILE, CLEAN_SHUTDOWN_FILE]
            .iter()
            .map(|f| format!("{f}{suffix}.tmp"))
            .collect();
        let mut logs = BTreeMap::new();
        let mut offline = BTreeMap::new();
        let mut damaged_hints = BTreeMap::new();
        let mut reports = Vec::new();
        let dir_offline = durable::read_file(&fs, &path.join(LOG_DIR_OFFLINE_FILE), 64 << 10)
            .await?
            .map(|reason| String::from_utf8_lossy(&reason).into_owned());
        if let Some(reason) = &dir_offline {
            tracing::error!(dir = %path.display(), %reason, "the data dir is offline: no partition log is opened \
                until {LOG_DIR_OFFLINE_FILE} is removed (after the disk is replaced)");
        }
        for name in fs.list_dir(path).map_err(|e| StorageError::io("list", path, e))? {
            let entry = path.join(&name);
            if own_files.contains(&name) && !fs.is_dir(&entry) {
                // One of this owner's atomic replacements that did not finish.
                if let Err(e) = fs.remove(&entry).await {
                    fatal::disk_failure("remove", &entry, &e);
                }
                continue;
            }
            if let Some(partition) = name.strip_suffix(DELETED_SUFFIX)
                && fs.is_dir(&entry)
                && TopicPartition::parse_dir_name(partition).is_some_and(|tp| owns(&tp))
            {
                remove_dir_contents(&fs, &entry).await?;
                continue;
            }
            if !fs.is_dir(&entry) {
                continue;
            }
            let Some(tp) = TopicPartition::parse_dir_name(&name) else { continue };
            if !owns(&tp) {
                continue;
            }
            let hints = OpenHints {
                recovery: if clean {
                    Recovery::Clean
                } else {
                    Recovery::FromRecoveryPoint(recovery_points.get(&tp).copied().unwrap_or(Offset::ZERO))
                },
                log_start: log_starts.get(&tp).copied().unwrap_or(Offset::ZERO),
                high_watermark: hws.get(&tp).copied().unwrap_or(Offset::ZERO),
                on_damage: OnDamage::KeepReadable,
            };
            if let Some(reason) = &dir_offline {
                offline.insert(tp, Offline { damage: reason.clone(), hints });
                continue;
            }
            let marker = path.join(&name).join(DAMAGED_FILE);
            let known =
                durable::read_file(&fs, &marker, 64 << 10).await?.map(|f| String::from_utf8_lossy(&f).into_owned());
            if let Some(damage) = &known {
                tracing::error!(partition = %tp, %damage, "partition offline: its log was found damaged before (until \
                    `shardlog repair` or its rebuild from a replica); what lies before the damage is still read");
            }
            let open_hints =
                OpenHints { on_damage: if known.is_some() { OnDamage::Known } else { hints.on_damage }, ..hints };
            match PartitionLog::open_with_files(
                files.clone(),
                producer_budget.clone(),
                space.clone(),
                clock.clone(),
                &path.join(&name),
                config_for(&tp),
                open_hints,
            )
            .await
            {
                Ok((log, report)) => {
                    // Damaged: offline, served read-only up to the damage, its checkpoints kept as found.
                    match (&known, log.damage()) {
                        (Some(damage), None) => log.keep_offline(damage.clone()),
                        (None, Some(damage)) => take_offline(&fs, &path.join(&name), &damage).await?,
                        _ => {}
                    }
                    if log.damage().is_some() {
                        damaged_hints.insert(tp.clone(), hints);
                    }
                    logs.insert(tp.clone(), Rc::new(log));
                    reports.push((tp, report));
                }
                // Damage in the log, or in a file of the partition's own (its leader-epoch checkpoint):
                // that partition goes offline, the others are opened.
                Err(damage @ (StorageError::Damaged { .. } | StorageError::CorruptFile { .. })) => {
                    take_offline(&fs, &path.join(&name), &damage).await?;
                    offline.insert(tp, Offline { damage: damage.to_string(), hints });
                }
                Err(e) => return Err(e),
            }
        }
        if clean {
            if let Err(e) = fs.remove(&marker).await {
                fatal::disk_failure("remove", &marker, &e);
            }
            durable::sync_dir(&fs, path).await;
        }
        let dir = LogDir {
            fs,
            files,
            producer_budget,
            space,
            clock,
            suffix,
            path: path.to_path_buf(),
            logs: RefCell::new(logs),
            offline: RefCell::new(offline),
            dir_offline: RefCell::new(dir_offline),
            damaged_hints: RefCell::new(damaged_hints),
            checkpoint_lock: Mutex::new(()),
            written: RefCell::new(Default::default()),
            create_lock: Mutex::new(()),
        };
        Ok((dir, reports))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Device flushes made for the logs here, each covering the syncs of any number of them (see
    /// [`crate::fs::device_flush`]); `None` when the filesystem is not one where a flush may do that.
    pub fn device_flushes(&self) -> Option<u64> {
        self.files.device_flush().map(|d| d.flushes())
    }

    /// Segment files open now, across every log here.
    pub fn open_files(&self) -> usize {
        self.files.open_count()
    }

    /// Brings the segment files open back within the bound, closing the least recently used that no
    /// operation holds (see [`OpenFiles::trim`]).
    pub fn trim_open_files(&self) {
        self.files.trim();
    }

    /// The log of a partition, if this directory holds it.
    pub fn get(&self, tp: &TopicPartition) -> Option<Rc<PartitionLog<F>>> {
        self.logs.borrow().get(tp).cloned()
    }

    /// Every partition this directory holds, served or offline.
    pub fn partitions(&self) -> Vec<TopicPartition> {
        let mut all: Vec<TopicPartition> = self.logs.borrow().keys().cloned().collect();
        all.extend(self.offline.borrow().keys().cloned());
        all
    }

    /// Why a partition is offline (its log is damaged), if it is: damage found at open, or met since by
    /// a read of its log.
    pub fn offline(&self, tp: &TopicPartition) -> Option<String> {
        if let Some(offline) = self.offline.borrow().get(tp) {
            return Some(offline.damage.clone());
        }
        self.get(tp).and_then(|log| log.damage())
    }

    /// Every log this directory holds (for passes over all of them, without a lookup per partition).
    pub fn logs(&self) -> Vec<Rc<PartitionLog<F>>> {
        self.logs.borrow().values().cloned().collect()
    }

    /// Every log this directory holds, with its partition.
    pub fn entries(&self) -> Vec<(TopicPartition, Rc<PartitionLog<F>>)> {
        self.logs.borrow().iter().map(|(tp, log)| (tp.clone(), log.clone())).collect()
    }

    /// Creates an empty log for `tp`, or returns the existing one.
    pub async fn get_or_create(&self, tp: &TopicPartition, config: LogConfig) -> Result<Rc<PartitionLog<F>>> {
        if let Some(log) = self.get(tp) {
            return Ok(log);
        }
        if let Some(offline) = self.offline.borrow().get(tp) {
            return Err(StorageError::Offline(offline.damage.clone()));
        }
        if let Some(reason) = self.dir_offline() {
            return Err(StorageError::Offline(reason));
        }
        // One creation at a time: two opens of one directory would undo each other's files.
        let _creating = self.create_lock.lock().await;
        if let Some(log) = self.get(tp) {
            return Ok(log);
        }
        let dir = self.path.join(tp.dir_name());
        let (log, _) = PartitionLog::open_with_files(
            self.files.clone(),
            self.producer_budget.clone(),
            self.space.clone(),
            self.clock.clone(),
            &dir,
            config,
            OpenHints::default(),
        )
        .await?;
        let log = Rc::new(log);
        self.logs.borrow_mut().insert(tp.clone(), log.clone());
        Ok(log)
    }

    /// Why the whole dir is offline, if it is (see [`LOG_DIR_OFFLINE_FILE`]).
    pub fn dir_offline(&self) -> Option<String> {
        self.dir_offline.borrow().clone()
    }

    /// Whether [`LOG_DIR_OFFLINE_FILE`] is there (another owner of the dir may have written it since this
    /// one opened).
    pub fn dir_offline_marked(&self) -> bool {
        self.fs.exists(&self.path.join(LOG_DIR_OFFLINE_FILE))
    }

    /// Takes the whole dir offline for `reason`: the marker is written (durably, if no other owner has
    /// yet), every log is closed (a damaged one shut, nothing more written to it), and every partition is
    /// kept offline, now and at every open until the marker is removed.
    pub async fn take_dir_offline(&self, reason: &str) -> Result<()> {
        if self.dir_offline.borrow().is_some() {
            return Ok(());
        }
        let marker = self.path.join(LOG_DIR_OFFLINE_FILE);
        // Another owner of the dir may have taken it offline first: its reason stands.
        let reason = match durable::read_file(&self.fs, &marker, 64 << 10).await? {
            Some(found) => String::from_utf8_lossy(&found).into_owned(),
            None => {
                durable::replace_file(&self.fs, &marker, reason.as_bytes()).await?;
                reason.to_string()
            }
        };
        let reason = reason.as_str();
        *self.dir_offline.borrow_mut() = Some(reason.to_string());
        let logs = std::mem::take(&mut *self.logs.borrow_mut());
        for (tp, log) in logs {
            let hints = self.damaged_hints.borrow_mut().remove(&tp).unwrap_or(OpenHints {
                recovery: Recovery::FromRecoveryPoint(log.recovery_point()),
                log_start: log.log_start_offset(),
                high_watermark: log.high_watermark(),
                on_damage: OnDamage::KeepReadable,
            });
            if log.damage().is_some() {
                log.shut().await;
            } else if let Err(e) = log.close().await {
                tracing::error!(partition = %tp, error = %e, "closing a log of the offline data dir failed");
                log.shut().await;
            }
            self.offline.borrow_mut().insert(tp, Offline { damage: reason.to_string(), hints });
        }
        self.checkpoint().await
    }

    /// Holds a partition offline because the whole dir is (a partition this broker was given while its
    /// dir is offline); no log is created. False if the dir is not offline.
    pub fn hold_offline(&self, tp: &TopicPartition) -> bool {
        let Some(reason) = self.dir_offline() else { return false };
        self.offline
            .borrow_mut()
            .entry(tp.clone())
            .or_insert_with(|| Offline { damage: reason, hints: OpenHints::default() });
        true
    }

    /// Takes a partition whose open log met damage out of service: the log is shut without writing
    /// anything (its files stay as found, the [`DAMAGED_FILE`] already records the damage) and the
    /// partition is kept offline as if the damage had been found at open. Returns whether it did.
    pub async fn shut_damaged(&self, tp: &TopicPartition) -> bool {
        let Some(log) = self.get(tp) else { return false };
        let Some(damage) = log.damage() else { return false };
        let hints = self.damaged_hints.borrow_mut().remove(tp).unwrap_or(OpenHints {
            recovery: Recovery::FromRecoveryPoint(log.recovery_point()),
            log_start: log.log_start_offset(),
            high_watermark: log.high_watermark(),
            on_damage: OnDamage::KeepReadable,
        });
        self.logs.borrow_mut().remove(tp);
        log.shut().await;
        self.offline.borrow_mut().insert(tp.clone(), Offline { damage, hints });
        true
    }

    /// Opens an offline partition's log again once it is no longer damaged (cut before the damage and its
    /// [`DAMAGED_FILE`] removed): it is served again. Everything past the recovery point the checkpoints
    /// recorded for it is validated. Damage found again keeps it offline and is returned.
    pub async fn reopen(&self, tp: &TopicPartition, config: LogConfig) -> Result<Rc<PartitionLog<F>>> {
        let _creating = self.create_lock.lock().await;
        if let Some(log) = self.get(tp) {
            return Ok(log);
        }
        let dir = self.path.join(tp.dir_name());
        let Some(offline) = self.offline.borrow().get(tp).cloned() else {
            return Err(StorageError::Closed(dir));
        };
        if self.fs.exists(&dir.join(DAMAGED_FILE)) || self.dir_offline().is_some() {
            return Err(StorageError::Offline(offline.damage));
        }
        let recovery = match offline.hints.recovery {
            // Found offline after a clean close: nothing says how much of it was checked since.
            Recovery::Clean => Recovery::FromRecoveryPoint(Offset::ZERO),
            from => from,
        };
        let hints = OpenHints { recovery, on_damage: OnDamage::Fail, ..offline.hints };
        let opened = PartitionLog::open_with_files(
            self.files.clone(),
            self.producer_budget.clone(),
            self.space.clone(),
            self.clock.clone(),
            &dir,
            config,
            hints,
        )
        .await;
        match opened {
            Ok((log, _)) => {
                let log = Rc::new(log);
                self.offline.borrow_mut().remove(tp);
                self.logs.borrow_mut().insert(tp.clone(), log.clone());
                Ok(log)
            }
            Err(damage @ (StorageError::Damaged { .. } | StorageError::CorruptFile { .. })) => {
                take_offline(&self.fs, &dir, &damage).await?;
                self.offline.borrow_mut().insert(tp.clone(), Offline { damage: damage.to_string(), hints });
                Err(damage)
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes a partition's log and its directory.
    pub async fn delete(&self, tp: &TopicPartition) -> Result<()> {
        self.damaged_hints.borrow_mut().remove(tp);
        if self.offline.borrow_mut().remove(tp).is_some() {
            // Its topic is gone: the damaged files go with it, the way a deleted log's do.
            let dir = self.path.join(tp.dir_name());
            let doomed = self.path.join(format!("{}{DELETED_SUFFIX}", tp.dir_name()));
            if let Err(e) = self.fs.rename(&dir, &doomed).await {
                fatal::disk_failure("rename", &dir, &e);
            }
            durable::sync_dir(&self.fs, &self.path).await;
            remove_dir_contents(&self.fs, &doomed).await?;
            return self.checkpoint().await;
        }
        let Some(log) = self.logs.borrow_mut().remove(tp) else { return Ok(()) };
        log.delete().await?;
        // The checkpoints must forget it before a new log of the same partition can be created: its
        // log start offset and high watermark would otherwise be applied to that log after a crash.
        self.checkpoint().await
    }

    /// Closes a partition's log and keeps its directory under a name the data dir never opens,
    /// `<topic>-<partition>.stray` (`.stray.2`, ... if taken); returns that path.
    pub async fn set_aside(&self, tp: &TopicPartition) -> Result<Option<PathBuf>> {
        self.damaged_hints.borrow_mut().remove(tp);
        let log = self.logs.borrow_mut().remove(tp);
        let offline = self.offline.borrow_mut().remove(tp);
        if log.is_none() && offline.is_none() {
            return Ok(None);
        }
        let base = self.path.join(format!("{}.stray", tp.dir_name()));
        let mut to = base.clone();
        let mut n = 1;
        while self.fs.exists(&to) {
            n += 1;
            to = PathBuf::from(format!("{}.{n}", base.display()));
        }
        match log {
            Some(log) => log.set_aside(&to).await?,
            None => {
                let dir = self.path.join(tp.dir_name());
                if let Err(e) = self.fs.rename(&dir, &to).await {
                    fatal::disk_failure("rename", &dir, &e);
                }
                durable::sync_dir(&self.fs, &self.path).await;
            }
        }
        self.checkpoint().await?;
        Ok(Some(to))
    }

    /// Moves a partition's log start offset (Kafka's DeleteRecords) and checkpoints it.
    pub async fn delete_records(&self, tp: &TopicPartition, offset: Offset) -> Result<Offset> {
        let log = self.get(tp).ok_or_else(|| StorageError::Closed(self.path.join(tp.dir_name())))?;
        let start = log.delete_records(offset).await?;
        self.checkpoint().await?;
        Ok(start)
    }

    /// Writes the recovery-point, log-start and high-watermark checkpoints of every log.
    pub async fn checkpoint(&self) -> Result<()> {
        self.write_checkpoints(true).await.map(|_| ())
    }

    /// Writes the checkpoint files whose offsets moved since they were last written (and the active
    /// segments' index entries for durable batches); returns how many checkpoint files it wrote. Called
    /// often (every second), it keeps the recovery point close to the durable offset, so that opening the
    /// logs after a crash validates only the last moments of data.
    pub async fn checkpoint_if_moved(&self) -> Result<usize> {
        self.write_checkpoints(false).await
    }

    async fn write_checkpoints(&self, all: bool) -> Result<usize> {
        let _guard = self.checkpoint_lock.lock().await;
        let logs: Vec<_> = self.logs.borrow().iter().map(|(tp, l)| (tp.clone(), l.clone())).collect();
        // The active segments' index files, for the batches durable now (several logs at a time: each
        // write that has something to add waits for a sync).
        let handles: Vec<_> = logs.iter().map(|(_, log)| log.clone()).collect();
        for_each_log(&handles, |log| async move { log.persist_active_index().await.map(|_| ()) }).await?;
        let mut now: [OffsetCheckpoint; 3] = Default::default();
        for (tp, log) in logs {
            if let Some(hints) = self.damaged_hints.borrow().get(&tp) {
                if let Recovery::FromRecoveryPoint(rp) = hints.recovery {
                    now[0].insert(tp.clone(), rp);
                }
                now[1].insert(tp.clone(), hints.log_start);
                now[2].insert(tp, hints.high_watermark);
                continue;
            }
            now[0].insert(tp.clone(), log.recovery_point());
            now[1].insert(tp.clone(), log.log_start_offset());
            now[2].insert(tp, log.high_watermark());
        }
        // Offline partitions keep what the checkpoints said of them, for when they are repaired.
        for (tp, offline) in self.offline.borrow().iter() {
            if let Recovery::FromRecoveryPoint(rp) = offline.hints.recovery {
                now[0].insert(tp.clone(), rp);
            }
            now[1].insert(tp.clone(), offline.hints.log_start);
            now[2].insert(tp.clone(), offline.hints.high_watermark);
        }
        let mut written = 0;
        for (i, name) in [RECOVERY_POINT_FILE, LOG_START_FILE, HIGH_WATERMARK_FILE].into_iter().enumerate() {
            if !all && self.written.borrow()[i] == now[i] {
                continue;
            }
            let path = self.path.join(format!("{name}{}", self.suffix));
            checkpoint::write_offsets(&self.fs, &path, &now[i]).await?;
            self.written.borrow_mut()[i] = std::mem::take(&mut now[i]);
            written += 1;
        }
        Ok(written)
    }

    /// Deletes old segments of every log by its retention settings, then checkpoints log start offsets.
    pub async fn apply_retention(&self) -> Result<usize> {
        let logs: Vec<_> = self.logs.borrow().values().cloned().collect();
        let mut deleted = 0;
        for log in logs {
            deleted += log.apply_retention().await?;
        }
        if deleted > 0 {
            self.checkpoint().await?;
        }
        Ok(deleted)
    }

    /// Flushes and closes every log, writes the checkpoints, then the clean-shutdown marker. Logs are
    /// closed [`LOGS_IN_FLIGHT`] at a time: each seal waits for a few syncs, and with thousands of
    /// partitions one after another would make a clean stop take minutes.
    pub async fn close(&self) -> Result<()> {
        let logs: Vec<_> = self.logs.borrow().values().cloned().collect();
        for_each_log(&logs, |log| log.close()).await?;
        self.checkpoint().await?;
        durable::replace_file(&self.fs, &self.path.join(format!("{CLEAN_SHUTDOWN_FILE}{}", self.suffix)), b"").await?;
        Ok(())
    }
}

/// Runs `op` on every log, [`LOGS_IN_FLIGHT`] at a time, on this thread; returns the first error (the
/// operations still in progress are then dropped).
async fn for_each_log<'a, F: Fs, Fut>(
    logs: &'a [Rc<PartitionLog<F>>],
    op: impl Fn(&'a PartitionLog<F>) -> Fut,
) -> Result<()>
where
    Fut: std::future::Future<Output = Result<()>> + 'a,
{
    let mut pending = logs.iter().map(|log| op(log));
    let mut running: Vec<std::pin::Pin<Box<Fut>>> = Vec::new();
    loop {
        while running.len() < LOGS_IN_FLIGHT
            && let Some(next) = pending.next()
        {
            running.push(Box::pin(next));
        }
        if running.is_empty() {
            return Ok(());
        }
        // The first operation to finish, and its outcome; the others keep their progress.
        let (i, result) = futures_lite::future::poll_fn(|cx| {
            for (i, op) in running.iter_mut().enumerate() {
                if let std::task::Poll::Ready(result) = op.as_mut().poll(cx) {
                    return std::task::Poll::Ready((i, result));
                }
            }
            std::task::Poll::Pending
        })
        .await;
        drop(running.swap_remove(i));
        result?;
    }
}
