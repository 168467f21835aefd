//! The `shardlog` broker: configuration, the shard runtime, the Kafka request handlers listed in
//! [`handlers::supported_apis`], the quorum service that holds the cluster metadata, and the broker's
//! side of it ([`metadata`]). Replication comes next.

/// What `--version` prints: the package version, the git commit it was built from, the build profile.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("SHARDLOG_GIT_COMMIT"),
    ", ",
    env!("SHARDLOG_BUILD_PROFILE"),
    " build)"
);

/// The log filter for `RUST_LOG` (unset: `info`). openraft narrates every election and replication step
/// (at debug, hundreds of lines a second); its warnings and errors are what operators need, so it stays
/// at `warn` unless `RUST_LOG` names it.
pub fn log_filter(rust_log: Option<&str>) -> String {
    let base = rust_log.map(str::trim).filter(|s| !s.is_empty()).unwrap_or("info");
    if base.contains("openraft") { base.to_string() } else { format!("{base},openraft=warn") }
}

pub mod admin_cli;
pub mod config;
pub mod handlers;
pub mod metadata;
pub mod quorum;
pub mod runtime;
pub mod shard;
pub mod topics;
