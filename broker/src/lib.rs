//! The `shardlog` broker: configuration, the shard runtime, the Kafka request handlers listed in
//! [`handlers::supported_apis`], the quorum service that holds the cluster metadata, and the broker's
//! side of it ([`metadata`]). Replication comes next.

pub mod admin_cli;
pub mod config;
pub mod handlers;
pub mod metadata;
pub mod quorum;
pub mod runtime;
pub mod shard;
pub mod topics;
