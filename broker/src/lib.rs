//! The `shardlog` broker: configuration, shard runtime, request handlers, replication and the quorum
//! service. Being built: settings, the shard runtime and the Kafka handlers listed in
//! [`handlers::supported_apis`] are here; storage-backed topics come next.

pub mod admin_cli;
pub mod config;
pub mod handlers;
pub mod quorum;
pub mod runtime;
pub mod shard;
pub mod topics;
