//! The process's log: `RUST_LOG`-style filtering (default `info`), colour only at a terminal, openraft
//! kept to what an operator can act on, and lines written without making the logging thread wait
//! ([`writer`]).
//!
//! openraft reports every failed attempt to reach a peer voter (each vote request, each replication
//! retry, twice a second per peer) at ERROR or WARN, and the races of an election or of its own
//! shutdown too, and each snapshot it fails to send to a voter that is away (twice a second). A voter
//! going away is normal when a cluster is restarted or stopped, and a voter that stays away is reported
//! once by the quorum network instead, after a while, and once more when it is back, with how long it
//! was away and how many calls failed ([`crate::quorum::network`]). Those openraft events are dropped;
//! every other openraft warning and error is kept, and openraft's chatter below `warn` is off unless
//! `RUST_LOG` names openraft.

mod episode;
mod partition_set;
mod writer;

pub use episode::Episode;
pub use partition_set::PartitionSet;
pub use writer::{dropped_lines, flush};

use std::collections::HashMap;
use std::fmt::Write as _;
use std::io::IsTerminal;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// The filter for `RUST_LOG` (unset: `info`), with openraft at `warn` unless it is named.
pub fn filter_directives(rust_log: Option<&str>) -> String {
    let base = rust_log.map(str::trim).filter(|s| !s.is_empty()).unwrap_or("info");
    if base.contains("openraft") { base.to_string() } else { format!("{base},openraft=warn") }
}

/// How log lines are written (`--log-format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// One line per event for a person to read.
    #[default]
    Human,
    /// One JSON object per line (timestamp, level, target, fields, span), for log collectors.
    Json,
}

/// Installs the log on stderr for the whole process.
pub fn init(format: LogFormat) -> anyhow::Result<()> {
    let directives = filter_directives(std::env::var("RUST_LOG").ok().as_deref());
    let filter = tracing_subscriber::EnvFilter::try_new(&directives)
        .map_err(|e| anyhow::anyhow!("RUST_LOG {directives:?}: {e}"))?;
    let layer = tracing_subscriber::fmt::layer().with_writer(writer::StderrWithoutWaiting);
    let format: Box<dyn Layer<_> + Send + Sync> = match format {
        // Colour codes only for a person at a terminal, not in journald or a log file.
        LogFormat::Human => Box::new(layer.with_ansi(std::io::stderr().is_terminal())),
        LogFormat::Json => Box::new(layer.json().with_current_span(true).with_span_list(false)),
    };
    let repeats = RepeatLimit::default();
    tracing_subscriber::registry()
        .with(filter)
        .with(repeats.clone())
        .with(QuietOpenraft)
        .with(GlommioBuffers::default())
        .with(format)
        .try_init()?;
    std::thread::Builder::new().name("log-repeats".into()).spawn(move || {
        loop {
            std::thread::sleep(Duration::from_secs(1));
            repeats.report_dropped();
        }
    })?;
    Ok(())
}

/// Lines of one WARN or ERROR call site let through per [`REPEAT_WINDOW`]; the rest are counted.
pub const REPEAT_BURST: u32 = 10;
/// See [`REPEAT_BURST`].
pub const REPEAT_WINDOW: Duration = Duration::from_secs(5);

/// Keeps a flood of one warning (a client sending garbage from a thousand connections, a failing accept)
/// from burying everything else: each WARN or ERROR call site gets [`REPEAT_BURST`] lines per
/// [`REPEAT_WINDOW`]; beyond that its lines are counted, and the count is logged once the window is
/// over (by [`RepeatLimit::report_dropped`], which [`init`] calls every second from a thread of its own,
/// or before the site's next line, whichever comes first).
#[derive(Debug, Clone, Default)]
pub struct RepeatLimit {
    sites: Arc<Mutex<HashMap<tracing::callsite::Identifier, Window>>>,
}

#[derive(Debug)]
struct Window {
    start: Instant,
    passed: u32,
    dropped: u64,
    site: &'static tracing::Metadata<'static>,
}

impl RepeatLimit {
    /// Whether a line of `site` at `now` is written; the second value is how many lines of the site
    /// were dropped before it and not yet reported (to be reported first).
    fn admit(&self, site: &'static tracing::Metadata<'static>, now: Instant) -> (bool, u64) {
        let mut sites = self.sites.lock().expect("repeat limit lock");
        let window = sites.entry(site.callsite()).or_insert(Window { start: now, passed: 0, dropped: 0, site });
        if now.duration_since(window.start) >= REPEAT_WINDOW {
            let dropped = window.dropped;
            *window = Window { start: now, passed: 1, dropped: 0, site };
            return (true, dropped);
        }
        if window.passed < REPEAT_BURST {
            window.passed += 1;
            return (true, 0);
        }
        window.dropped += 1;
        (false, 0)
    }

    /// Takes the counts of windows that are over, with their sites.
    fn take_dropped(&self, now: Instant) -> Vec<(&'static tracing::Metadata<'static>, u64)> {
        let mut sites = self.sites.lock().expect("repeat limit lock");
        let mut out = Vec::new();
        for window in sites.values_mut() {
            if window.dropped > 0 && now.duration_since(window.start) >= REPEAT_WINDOW {
                out.push((window.site, std::mem::take(&mut window.dropped)));
            }
        }
        out
    }

    /// Logs how many lines each site dropped in its windows that are over.
    pub fn report_dropped(&self) {
        for (site, dropped) in self.take_dropped(Instant::now()) {
            report(site, dropped);
        }
    }
}

/// One line saying `dropped` lines of `site` were not logged.
fn report(site: &tracing::Metadata<'_>, dropped: u64) {
    let at = format!("{}:{}", site.file().unwrap_or("?"), site.line().unwrap_or(0));
    let seconds = REPEAT_WINDOW.as_secs();
    if *site.level() == Level::ERROR {
        tracing::error!(dropped, site = %at, "{dropped} more lines from the same place were not logged (at most {REPEAT_BURST} per {seconds} s)");
    } else {
        tracing::warn!(dropped, site = %at, "{dropped} more lines from the same place were not logged (at most {REPEAT_BURST} per {seconds} s)");
    }
}

impl<S: Subscriber> Layer<S> for RepeatLimit {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if *meta.level() > Level::WARN {
            return true;
        }
        let (write, dropped) = self.admit(meta, Instant::now());
        if dropped > 0 {
            report(meta, dropped);
        }
        write
    }
}

/// Drops openraft's per-attempt reports of unreachable peers and its election and shutdown races.
#[derive(Debug, Clone, Copy)]
pub struct QuietOpenraft;

impl<S: Subscriber> Layer<S> for QuietOpenraft {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        let meta = event.metadata();
        if !meta.target().starts_with("openraft") || *meta.level() > Level::WARN {
            return true;
        }
        let mut text = FieldText(String::new());
        event.record(&mut text);
        !is_openraft_noise(&text.0)
    }
}

/// Replaces glommio's report of I/O memory it could not register (no room under the locked-memory limit;
/// a multi-line WARN for each ring of each executor) with one line, once per process, saying what
/// `shardlog check` says of it: the limit, and how to raise it.
#[derive(Debug, Clone, Default)]
pub struct GlommioBuffers {
    explained: Arc<std::sync::atomic::AtomicBool>,
}

impl<S: Subscriber> Layer<S> for GlommioBuffers {
    fn event_enabled(&self, event: &Event<'_>, _ctx: Context<'_, S>) -> bool {
        let meta = event.metadata();
        // glommio logs through the `log` crate: its lines arrive with the target `log`, and their own
        // target as the field `log.target`.
        let bridged = meta.target() == "log" || meta.target().starts_with("glommio");
        if !bridged || *meta.level() > Level::WARN {
            return true;
        }
        let mut text = FieldText(String::new());
        event.record(&mut text);
        let from_glommio = meta.target().starts_with("glommio") || text.0.contains("log.target=glommio");
        if !from_glommio || !text.0.contains("registering buffers") {
            return true;
        }
        if !self.explained.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let row = crate::host_check::system::buffers_not_registered();
            tracing::warn!(
                found = %row.found,
                fix = row.fix.as_deref().unwrap_or_default(),
                "locked memory too low: io_uring buffers not registered (as `shardlog check` says)"
            );
        }
        false
    }
}

/// Whether an openraft warning or error, its fields written out as `name=value ...`, is one of the
/// reports [`QuietOpenraft`] drops.
pub fn is_openraft_noise(fields: &str) -> bool {
    const PEER_UNREACHABLE: &[&str] = &[
        "message=while requesting vote",
        "message=timeout ",
        "message=error replication to target",
        "message=RPCError",
        "backoff mode",
        "message=update progress error",
        "message=heartbeat error",
    ];
    const RACES: &[&str] = &[
        // A vote answer that arrives after this voter moved on to another term.
        "message=A message will be ignored because vote changed",
        "message=failure receiving rx from RaftCore",
    ];
    // Sending a snapshot to a voter that is away: each attempt is reported twice (the RPC, then the
    // send), twice a second for as long as it stays away. Only network failures are dropped: a snapshot
    // that cannot be read here, or one the peer refuses, is still reported.
    const SNAPSHOT_SEND: &[&str] = &[
        "message=error sending InstallSnapshot RPC",
        "message=failed to send snapshot",
        "message=InstallSnapshot RPC timed out",
    ];
    const NETWORK_FAILURE: &[&str] = &["Unreachable node", "NetworkError", "timeout after", "timed out"];
    let snapshot_to_absent_peer =
        SNAPSHOT_SEND.iter().any(|m| fields.contains(m)) && NETWORK_FAILURE.iter().any(|m| fields.contains(m));
    // A call that reached Raft after it stopped (shutdown): openraft reports it in several ways.
    let stopped = fields.contains("Stopped")
        && ["message=core_call fatal error", "message=error when", "message=failure sending RaftMsg"]
            .iter()
            .any(|m| fields.contains(m));
    stopped || snapshot_to_absent_peer || PEER_UNREACHABLE.iter().chain(RACES).any(|m| fields.contains(m))
}

struct FieldText(String);

impl Visit for FieldText {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, "{}={:?} ", field.name(), value);
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        let _ = write!(self.0, "{}={} ", field.name(), value);
    }
}

/// Lets a repeated event be logged at most once per interval, counting the ones in between.
#[derive(Debug)]
pub struct Throttle {
    interval: Duration,
    last: Option<Instant>,
    skipped: u64,
}

impl Throttle {
    pub fn new(interval: Duration) -> Self {
        Throttle { interval, last: None, skipped: 0 }
    }

    /// For an event at `now`: `Some(n)` when it should be logged, with the `n` events not logged since
    /// the last one that was; `None` when it is only counted.
    pub fn event(&mut self, now: Instant) -> Option<u64> {
        if self.last.is_some_and(|last| now.duration_since(last) < self.interval) {
            self.skipped += 1;
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.skipped))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openraft_stays_at_warn_unless_rust_log_names_it() {
        assert_eq!(filter_directives(None), "info,openraft=warn");
        assert_eq!(filter_directives(Some("debug")), "debug,openraft=warn");
        assert_eq!(filter_directives(Some("debug,openraft=debug")), "debug,openraft=debug");
    }

    #[test]
    fn peer_failures_and_races_are_noise_but_other_openraft_errors_are_not() {
        assert!(is_openraft_noise("message=while requesting vote error=Unreachable node target=2 "));
        assert!(is_openraft_noise("message=RPCError err=Unreachable node "));
        assert!(is_openraft_noise("message=core_call fatal error error=Stopped "));
        assert!(!is_openraft_noise("message=core_call fatal error error=StorageError "));
        assert!(!is_openraft_noise("message=RaftCore stopped with fatal error=StorageError "));
        // openraft's two lines for each snapshot sent to a voter that is away.
        assert!(is_openraft_noise(
            "message=error sending InstallSnapshot RPC error=NetworkError: connect or transfer: Connection refused "
        ));
        assert!(is_openraft_noise(
            "message=failed to send snapshot error=NetworkError: connect or transfer: Connection refused "
        ));
        assert!(is_openraft_noise("message=error sending InstallSnapshot RPC error=Unreachable node: timeout "));
        assert!(!is_openraft_noise("message=failed to send snapshot error=StorageError: read snapshot "));
    }

    #[test]
    fn a_throttle_lets_one_event_per_interval_through_and_counts_the_rest() {
        let mut t = Throttle::new(Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(t.event(t0), Some(0));
        assert_eq!(t.event(t0 + Duration::from_millis(10)), None);
        assert_eq!(t.event(t0 + Duration::from_millis(900)), None);
        assert_eq!(t.event(t0 + Duration::from_millis(1000)), Some(2));
        assert_eq!(t.event(t0 + Duration::from_millis(1001)), None);
    }

    #[test]
    fn a_call_site_gets_a_burst_per_window_and_the_rest_are_counted_for_the_next_line() {
        static SITE_A: tracing::callsite::DefaultCallsite = tracing::callsite::DefaultCallsite::new(&META_A);
        static META_A: tracing::Metadata<'static> = tracing::metadata! {
            name: "a", target: "test", level: Level::WARN, fields: &[], callsite: &SITE_A, kind: tracing::metadata::Kind::EVENT
        };
        static SITE_B: tracing::callsite::DefaultCallsite = tracing::callsite::DefaultCallsite::new(&META_B);
        static META_B: tracing::Metadata<'static> = tracing::metadata! {
            name: "b", target: "test", level: Level::WARN, fields: &[], callsite: &SITE_B, kind: tracing::metadata::Kind::EVENT
        };
        let limit = RepeatLimit::default();
        let t0 = Instant::now();
        for i in 0..REPEAT_BURST {
            assert_eq!(limit.admit(&META_A, t0), (true, 0), "line {i} of the burst");
        }
        for _ in 0..25 {
            assert_eq!(limit.admit(&META_A, t0 + Duration::from_secs(1)), (false, 0));
        }
        assert_eq!(limit.admit(&META_B, t0 + Duration::from_secs(1)), (true, 0), "another site is not held back");
        assert!(limit.take_dropped(t0 + Duration::from_secs(1)).is_empty(), "counts wait for the window's end");
        assert_eq!(limit.admit(&META_A, t0 + REPEAT_WINDOW), (true, 25), "the next window's first line reports them");
        assert_eq!(limit.admit(&META_A, t0 + REPEAT_WINDOW), (true, 0));
        // Reported by the timer instead when no line comes.
        for _ in 0..REPEAT_BURST + 3 {
            limit.admit(&META_B, t0 + REPEAT_WINDOW);
        }
        let dropped = limit.take_dropped(t0 + REPEAT_WINDOW + REPEAT_WINDOW);
        assert_eq!(dropped.len(), 1);
        assert_eq!(
            (dropped[0].0.name(), dropped[0].1),
            ("b", 4),
            "B's window began with its first line: 4 of these 13 are past the burst"
        );
        assert!(limit.take_dropped(t0 + REPEAT_WINDOW * 3).is_empty(), "reported once");
    }
}
