//! Replication between real `shardlog` processes, driven by real Kafka clients (librdkafka through the
//! `rdkafka` crate):
//!
//! - [`failover`]: an idempotent acks=all producer through the SIGKILL and restart of a leader;
//! - [`faults`]: a leader paused with SIGSTOP past `replica.lag.time.max.ms` (the ISR shrinks and grows
//!   back), NOT_ENOUGH_REPLICAS with one live replica of three, unclean election refused and allowed;
//! - [`peer`]: bytes that are not the peer protocol close only their own connection.

mod common;
mod failover;
mod faults;
mod peer;
