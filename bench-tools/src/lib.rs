//! What other programs use of `shardlog-bench`: the local cluster launcher (tests start, kill and restart
//! brokers through it). The commands themselves live in the binary.

pub mod cluster;
