//! The `shardlog` broker: configuration, the shard runtime, the Kafka request handlers listed in
//! [`handlers::supported_apis`], the quorum service that holds the cluster metadata, and the broker's
//! side of it ([`metadata`]).
//!
//! Layers, each using only those below it: [`handlers`], [`runtime`] and [`metadata::follow`] on top;
//! [`context`] (what they share) below them; then [`shard`] (a shard's partitions), [`metadata::image`]
//! and the quorum service; [`shutdown`], [`config`] and [`topics`] at the bottom, with [`host_check`] (what
//! the host must offer, probed before the broker runs) just above [`config`].
//!
//! [`txn`] is the transaction coordinator's I/O-free state machine (issue 39), which nothing serves yet: a
//! coordinator runtime will drive it. FindCoordinator already finds a transactional id's coordinator, the
//! leader of the id's partition of `__transaction_state` (created at the first ask).

/// The package version (the workspace's).
pub const PACKAGE_VERSION: &str = env!("CARGO_PKG_VERSION");
/// The git commit the binary was built from (12 hex digits), or `unknown` for a build outside a git checkout.
pub const GIT_COMMIT: &str = env!("SHARDLOG_GIT_COMMIT");

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
pub mod compaction;
pub mod config;
pub mod context;
pub mod coordinator;
pub mod disk_space;
pub mod exit;
pub mod group;
pub mod handlers;
pub mod host_check;
pub mod logging;
pub mod metadata;
pub mod metrics;
pub mod notify;
pub mod quorum;
pub mod replication;
pub mod runtime;
pub mod security;
pub mod shard;
pub mod shutdown;
pub mod topics;
pub mod txn;
