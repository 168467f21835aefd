//! The `shardlog` broker: configuration, shard runtime, request handlers, replication and the quorum
//! service. The runtime and handlers are being built; [`config`] is the settings model they read.

pub mod config;
