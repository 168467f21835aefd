//! The process's log: `RUST_LOG`-style filtering (default `info`), colour only at a terminal, and
//! openraft kept to what an operator can act on.
//!
//! openraft reports every failed attempt to reach a peer voter (each vote request, each replication
//! retry, twice a second per peer) at ERROR or WARN, and the races of an election or of its own
//! shutdown too. A voter going away is normal when a cluster is restarted or stopped, and a voter that
//! stays away is reported once by the quorum network instead, after a while
//! ([`crate::quorum::network`]). Those openraft events are dropped; every other openraft warning and
//! error is kept, and openraft's chatter below `warn` is off unless `RUST_LOG` names openraft.

use std::fmt::Write as _;
use std::io::IsTerminal;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// The filter for `RUST_LOG` (unset: `info`), with openraft at `warn` unless it is named.
pub fn filter_directives(rust_log: Option<&str>) -> String {
    let base = rust_log.map(str::trim).filter(|s| !s.is_empty()).unwrap_or("info");
    if base.contains("openraft") { base.to_string() } else { format!("{base},openraft=warn") }
}

/// Installs the log on stderr for the whole process.
pub fn init() -> anyhow::Result<()> {
    let directives = filter_directives(std::env::var("RUST_LOG").ok().as_deref());
    let filter = tracing_subscriber::EnvFilter::try_new(&directives)
        .map_err(|e| anyhow::anyhow!("RUST_LOG {directives:?}: {e}"))?;
    let format = tracing_subscriber::fmt::layer()
        // Colour codes only for a person at a terminal, not in journald or a log file.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    tracing_subscriber::registry().with(filter).with(QuietOpenraft).with(format).try_init()?;
    Ok(())
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
    // A call that reached Raft after it stopped (shutdown): openraft reports it in several ways.
    let stopped = fields.contains("Stopped")
        && ["message=core_call fatal error", "message=error when", "message=failure sending RaftMsg"]
            .iter()
            .any(|m| fields.contains(m));
    stopped || PEER_UNREACHABLE.iter().chain(RACES).any(|m| fields.contains(m))
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
    }
}
