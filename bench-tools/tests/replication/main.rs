//! Replication between real `shardlog` processes, driven by real Kafka clients (librdkafka through the
//! `rdkafka` crate):
//!
//! - [`failover`]: an idempotent acks=all producer through the SIGKILL and restart of a leader, and
//!   through a leader paused with SIGSTOP (it leaves every ISR and rejoins);
//! - [`faults`]: followers leaving the ISR by `replica.lag.time.max.ms`, NOT_ENOUGH_REPLICAS with one
//!   live replica of three, unclean election refused by default and allowed by the topic;
//! - [`assignment`]: explicit replica assignment in CreateTopics and CreatePartitions;
//! - [`elect`]: ElectLeaders, preferred and unclean, and `auto.leader.rebalance.enable`;
//! - [`reassign`]: AlterPartitionReassignments and ListPartitionReassignments, through the CLI too;
//! - [`groups`]: a consumer group keeps its offsets when its coordinator's broker is killed;
//! - [`damage`]: a damaged replica leaves the ISR and leadership and rebuilds itself from the leader;
//! - [`compaction`]: every replica of a compacted topic compacts its own copy; a new leader serves it;
//! - [`peer`]: bytes that are not the peer protocol close only their own connection.

mod assignment;
mod common;
mod compaction;
mod damage;
mod elect;
mod failover;
mod faults;
mod groups;
mod peer;
mod reassign;
