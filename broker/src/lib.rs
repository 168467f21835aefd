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

pub mod admin_cli;
pub mod client;
pub mod config;
pub mod disk_space;
pub mod handlers;
pub mod logging;
pub mod metadata;
pub mod quorum;
pub mod runtime;
pub mod shard;
pub mod topics;
