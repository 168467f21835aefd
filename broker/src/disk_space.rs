//! The data dir's free space, kept above `log.dir.min.free.bytes` so that a full disk is a refusal, not
//! a crash: a write that met ENOSPC half way would be treated like any failed write (the process
//! stops), so the broker stops taking data well before the filesystem is full.
//!
//! A thread measures the filesystem (statvfs) every [`MEASURE_INTERVAL`]. Below the floor, produce
//! requests are refused with KAFKA_STORAGE_ERROR (retriable: clients retry, and succeed once space is
//! freed) and a WARN says so once a minute; fetches, admin requests, topic deletion and retention go on,
//! so deleting a topic or lowering retention brings produce back without a restart. The floor leaves
//! room for what is already in flight (at most `queued.max.request.bytes` of requests) and for the
//! quorum's own writes, which stop later, at [`quorum_reserve_bytes`].
//!
//! The measure is a tenth of a second old at worst, and a partition reserves up to 32 MiB ahead of its
//! writes at once: the logs' reservations therefore keep to the floor themselves, through the one
//! [`SpaceFloor`] every shard shares (see `shardlog_storage::space`). An append whose reservation would
//! cross the floor is refused with the same KAFKA_STORAGE_ERROR, and from then on produce is refused as
//! below the floor, until a measure finds room for that append again.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use shardlog_storage::SpaceFloor;

/// How often the free space is measured.
pub const MEASURE_INTERVAL: Duration = Duration::from_millis(100);
/// How often the WARN repeats while the disk stays below the floor.
const WARN_INTERVAL: Duration = Duration::from_secs(60);

/// Bytes an unprivileged writer may still use on the filesystem holding `path` (statvfs `f_bavail`).
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    shardlog_storage::fs::dma::free_bytes(path)
}

/// The words a voter's refusal on a nearly full disk starts with (the broker answers it with
/// KAFKA_STORAGE_ERROR).
pub const QUORUM_DISK_FULL: &str = "the quorum's disk is nearly full";

/// The free space the quorum keeps for itself below the floor: commands that change topics are refused
/// beneath it (brokers' registrations and heartbeats, a few bytes each, may still use it).
pub fn quorum_reserve_bytes(floor: u64) -> u64 {
    (floor / 2).min(32 << 20)
}

/// The data dir's free space as last measured, against the floor.
#[derive(Debug)]
pub struct DiskSpace {
    path: PathBuf,
    floor: u64,
    free: AtomicU64,
    /// The floor the logs' reservations keep to, on every shard.
    reservations: Arc<SpaceFloor>,
}

impl DiskSpace {
    /// Measures now, then keeps measuring on a thread of its own for as long as the process runs.
    pub fn watch(path: &Path, floor: u64) -> std::io::Result<Arc<DiskSpace>> {
        let space = Arc::new(DiskSpace {
            path: path.to_path_buf(),
            floor,
            free: AtomicU64::new(free_bytes(path)?),
            reservations: SpaceFloor::new(floor),
        });
        let watched = space.clone();
        std::thread::Builder::new().name("disk-space".into()).spawn(move || watched.run())?;
        Ok(space)
    }

    /// Free bytes as last measured.
    pub fn free(&self) -> u64 {
        self.free.load(Ordering::Relaxed)
    }

    /// The floor the logs' reservations keep to (one for every shard's logs).
    pub fn reservations(&self) -> Arc<SpaceFloor> {
        self.reservations.clone()
    }

    /// Whether produce must be refused: the disk is below the floor, or a partition's reservation was
    /// refused at it and no room has been freed since.
    pub fn below_floor(&self) -> bool {
        self.free() < self.floor || self.reservations.refusing()
    }

    fn run(&self) {
        let mut warned: Option<Instant> = None;
        loop {
            std::thread::sleep(MEASURE_INTERVAL);
            let free = match free_bytes(&self.path) {
                Ok(free) => free,
                // Measured again next time; the last figure stands meanwhile.
                Err(_) => continue,
            };
            self.free.store(free, Ordering::Relaxed);
            self.reservations.measured(free);
            if self.below_floor() {
                if warned.is_none_or(|at| at.elapsed() >= WARN_INTERVAL) {
                    tracing::warn!(
                        data_dir = %self.path.display(),
                        free_bytes = free,
                        floor = self.floor,
                        "the data dir's disk is below log.dir.min.free.bytes: produce is refused \
                         (KAFKA_STORAGE_ERROR) until space is freed (delete topics or records, lower retention)"
                    );
                    warned = Some(Instant::now());
                }
            } else if warned.take().is_some() {
                tracing::info!(
                    free_bytes = free,
                    floor = self.floor,
                    "the data dir's disk has room again: produce resumes"
                );
            }
        }
    }
}
