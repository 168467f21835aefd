//! The quorum service: the replicated controller that holds the cluster metadata (brokers, topics,
//! assignments, leaders, ISR) and elects partition leaders.
//!
//! - [`state`] is the state machine and [`election`] its rules (`reassignment` those of moving
//!   partitions), all without I/O, so they are tested exhaustively (and can be driven by a simulator);
//!   [`fencing`] says when the leader may fence brokers whose sessions expired; [`security`] holds the
//!   SCRAM credentials, ACLs and client quotas and their rules.
//! - [`wire`] declares the openraft configuration and the rkyv forms of its messages and entries.
//! - [`log_store`] and [`state_machine`] are the voter's durable Raft log, vote and snapshots; `legacy`
//!   reads the snapshot layouts of older versions; `event_log` logs what the commands applied did.
//! - [`network`] is the quorum port: Raft RPCs and command writes as peer-protocol frames over TCP.
//! - [`service`] runs a voter: openraft on its own thread with a current-thread tokio runtime, reached
//!   from other threads through flume channels.
//!
//! [`bootstrap`] adds the first SCRAM users when a voter forms the cluster (`--add-scram`).
//!
//! Voters run standalone (`shardlog quorum`) or inside brokers; brokers reach them through
//! [`crate::metadata::link`].

pub mod bootstrap;
pub mod client;
mod command_error;
pub mod election;
mod event_log;
pub mod fencing;
mod legacy;
pub mod log_store;
pub mod network;
mod offline;
mod reassignment;
pub mod security;
pub mod service;
pub mod state;
pub mod state_machine;
pub mod wire;
