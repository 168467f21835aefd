//! What other programs use of `shardlog-bench`: the local cluster launcher and the quorum voter processes
//! (tests start, kill, pause and restart brokers and voters through them), and the fault campaign's
//! checker. The commands themselves live in the binary.

pub mod cluster;
pub mod faults;
pub mod voters;
