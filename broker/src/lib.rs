//! The `shardlog` broker: configuration, shard runtime, request handlers, replication and the quorum
//! service.
//!
//! Empty until the broker issue lands; it builds on `shardlog-storage`.
