//! The quorum service: the replicated controller that holds the cluster metadata (brokers, topics,
//! assignments, leaders, ISR) and elects partition leaders.
//!
//! [`state`] is the state machine, and [`election`] its rules, both without I/O so they can be tested
//! exhaustively and driven by a simulator. The Raft replication around them (openraft on its own thread,
//! bridged to the shards with flume) and the voters' wire protocol build on these.

pub mod election;
pub mod state;
