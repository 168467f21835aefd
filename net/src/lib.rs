//! shardlog's wire formats. [`kafka`] frames, decodes and encodes the Kafka protocol through the
//! `kafka-protocol` crate; [`peer`] frames the inter-broker protocol (quorum voters, replication).
//!
//! Nothing here does I/O: callers hand in bytes read from a socket and get back decoded requests or the
//! bytes to write, so every malformed input can be tested without a network.

pub mod alloc;
pub mod kafka;
pub mod peer;
pub mod pool;
