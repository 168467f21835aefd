//! Fault campaigns: a cluster under a producer and consumer workload while a seeded nemesis kills,
//! pauses, partitions and starves its brokers, then a check that every acknowledged record survived.
//! [`plan`] draws the nemesis's schedule from a seed; [`tear`] damages a killed broker's active segment;
//! [`replica`] reads each replica's copy from a stopped broker's data directory; [`check`] judges a
//! recorded history against the cluster's final logs.

pub mod check;
pub mod plan;
pub mod replica;
pub mod tear;
