//! systemd's service notifications (`sd_notify`), for a unit of `Type=notify`: STATUS= lines while the
//! broker starts (recovering its logs, then waiting for the metadata quorum), READY=1 once every shard
//! accepts Kafka connections, WATCHDOG=1 every half watchdog interval while every shard answers, and
//! STOPPING=1 when it begins to stop. Without `NOTIFY_SOCKET` nothing is sent.
//!
//! A shard answers by running: each shard's executor notes the time every [`BEAT_INTERVAL`] from a task
//! of its own, so a shard whose thread is stuck (a blocking call, a loop that never yields) stops noting
//! it, and the watchdog pings stop with it until it does again; systemd then restarts the service.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sd_notify::NotifyState;
use shardlog_storage::{Clock, SystemClock};

use crate::context::BrokerContext;

/// How often a shard notes that it runs.
pub const BEAT_INTERVAL: Duration = Duration::from_millis(100);
/// How often the notifier looks at the broker's progress.
const LOOK_INTERVAL: Duration = Duration::from_millis(50);

/// What the shards tell the notifier.
#[derive(Debug)]
pub struct Liveness {
    /// Per shard, when it last ran its beat task (ms since the epoch; 0: not yet).
    beats: Vec<AtomicI64>,
    /// Shards whose logs are open.
    recovered: AtomicUsize,
    /// Shards accepting connections.
    accepting: AtomicUsize,
}

impl Liveness {
    pub fn new(shards: usize) -> Liveness {
        Liveness {
            beats: (0..shards).map(|_| AtomicI64::new(0)).collect(),
            recovered: AtomicUsize::new(0),
            accepting: AtomicUsize::new(0),
        }
    }

    pub fn beat(&self, shard: usize) {
        self.beats[shard].store(SystemClock.now_ms(), Ordering::Relaxed);
    }

    pub fn recovered(&self) {
        self.recovered.fetch_add(1, Ordering::SeqCst);
    }

    pub fn accepting(&self) {
        self.accepting.fetch_add(1, Ordering::SeqCst);
    }

    /// Whether every shard has noted at least once that it runs.
    fn all_beating_once(&self) -> bool {
        self.beats.iter().all(|b| b.load(Ordering::Relaxed) > 0)
    }

    /// The first shard that has not run within `limit`, if any.
    fn stalled(&self, limit: Duration) -> Option<(usize, i64)> {
        let now = SystemClock.now_ms();
        self.beats.iter().enumerate().find_map(|(shard, beat)| {
            let age = now - beat.load(Ordering::Relaxed);
            (age > limit.as_millis() as i64).then_some((shard, age))
        })
    }
}

/// What the broker still waits for before it serves, or `None` once every shard accepts connections.
fn starting(ctx: &BrokerContext) -> Option<String> {
    let shards = ctx.liveness.beats.len();
    let recovered = ctx.liveness.recovered.load(Ordering::SeqCst);
    if recovered < shards {
        Some(format!("recovering partition logs ({recovered} of {shards} shards done)"))
    } else if !ctx.ready.load(Ordering::SeqCst) {
        Some("waiting for the metadata quorum (the other voters of a new cluster, or the controller)".to_string())
    } else if ctx.liveness.accepting.load(Ordering::SeqCst) < shards {
        Some("caught up with the metadata; starting the Kafka listener".to_string())
    } else {
        None
    }
}

/// Why the broker does not serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReady {
    /// Starting (what it waits for) or stopping: as it should be.
    Waiting(String),
    /// A shard has not run for the limit asked about: something is wrong.
    Stalled(String),
}

/// Whether the broker serves now, or why not (the `/health` and `/ready` answers of the metrics
/// endpoint).
pub fn readiness(ctx: &BrokerContext, stall_limit: Duration) -> Result<(), NotReady> {
    // A stopping broker's shards stop noting that they run.
    if ctx.shutdown.is_triggered() {
        return Err(NotReady::Waiting("stopping: finishing connections, closing logs".to_string()));
    }
    if let Some((shard, age)) = ctx.liveness.stalled(stall_limit).filter(|_| ctx.liveness.all_beating_once()) {
        return Err(NotReady::Stalled(format!("shard {shard} has not run for {age} ms")));
    }
    match starting(ctx) {
        Some(waiting) => Err(NotReady::Waiting(waiting)),
        None => Ok(()),
    }
}

/// Notes that `shard` runs, every [`BEAT_INTERVAL`], until shutdown.
pub async fn beat(ctx: Arc<BrokerContext>, shard: usize) {
    while !ctx.shutdown.is_triggered() {
        ctx.liveness.beat(shard);
        glommio::timer::sleep(BEAT_INTERVAL).await;
    }
}

/// Sends the notifications until the broker stops (on a thread of its own: it must see the shards,
/// not be one of them). Returns at once when there is no `NOTIFY_SOCKET`.
pub fn spawn(ctx: Arc<BrokerContext>) -> Option<std::thread::JoinHandle<()>> {
    std::env::var_os("NOTIFY_SOCKET")?;
    let thread = std::thread::Builder::new().name("sd-notify".into()).spawn(move || notify(&ctx));
    match thread {
        Ok(handle) => Some(handle),
        Err(e) => {
            tracing::warn!(error = %e, "no thread for systemd's notifications; the unit will time out starting");
            None
        }
    }
}

fn send(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

fn notify(ctx: &BrokerContext) {
    let watchdog = sd_notify::watchdog_enabled();
    let mut status = String::new();
    let mut ready = false;
    let mut last_ping = Instant::now();
    let mut told_stall = false;
    loop {
        if ctx.shutdown.is_triggered() {
            send(&[NotifyState::Stopping, NotifyState::Status("stopping: finishing connections, closing logs")]);
            return;
        }
        if !ready {
            match starting(ctx) {
                Some(now) if now != status => {
                    send(&[NotifyState::Status(&now)]);
                    status = now;
                }
                Some(_) => {}
                None => {
                    ready = true;
                    let serving = format!("serving Kafka on {}", ctx.config.listener);
                    send(&[NotifyState::Ready, NotifyState::Status(&serving)]);
                }
            }
        }
        if let Some(interval) = watchdog.filter(|_| ready)
            && last_ping.elapsed() >= interval / 2
        {
            match ctx.liveness.stalled(interval / 2) {
                None => {
                    send(&[NotifyState::Watchdog]);
                    last_ping = Instant::now();
                    told_stall = false;
                }
                Some((shard, age)) if !std::mem::replace(&mut told_stall, true) => {
                    tracing::error!(
                        shard,
                        stalled_ms = age,
                        "a shard has not run for longer than half the watchdog interval: watchdog pings withheld"
                    );
                }
                Some(_) => {}
            }
        }
        std::thread::sleep(LOOK_INTERVAL);
    }
}
