//! What a partition remembers of its producers, as Kafka's DescribeProducers shows it (the operator
//! tools' view of open transactions: `shardlog transactions describe-producers`, `find-hanging`,
//! `abort`). Only read here; never changes the producer state.
//!
//! One difference from Kafka: Kafka's `last_timestamp` is the max timestamp of the producer's last
//! batch (the client's clock). We keep the broker's clock at the last append instead
//! (`ProducerEntry::last_append_ms`, what expiration measures from), so that is what is shown; after a
//! restart it is the time the state was rebuilt, for producers replayed from the log.

use kafka_protocol::ResponseError;
use shardlog_storage::LogDir;
use shardlog_storage::TopicPartition;
use shardlog_storage::fs::dma::DmaFs;

use super::missing;

/// One producer as a partition remembers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerView {
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// The last sequence of its latest batch kept; -1 when none is kept.
    pub last_sequence: i32,
    /// The broker's clock at its last append (see the module doc).
    pub last_timestamp_ms: i64,
    /// The coordinator epoch of the last marker written for it; -1 when none.
    pub coordinator_epoch: i32,
    /// The first offset of its open transaction; -1 when it has none.
    pub current_txn_start_offset: i64,
}

/// The producers of `tp`, by producer id, or why there are none to show (the partition is not here).
/// The handler sends this to the leader's shard only, as it does ListOffsets.
pub(super) fn describe(logs: &LogDir<DmaFs>, tp: &TopicPartition) -> Result<Vec<ProducerView>, ResponseError> {
    let Some(log) = logs.get(tp) else { return Err(missing(logs, tp)) };
    Ok(log.with_producer_states(|states| {
        states
            .iter()
            .map(|(producer_id, entry)| ProducerView {
                producer_id,
                producer_epoch: entry.epoch,
                last_sequence: entry.last_sequence(),
                last_timestamp_ms: entry.last_append_ms,
                coordinator_epoch: entry.coordinator_epoch,
                current_txn_start_offset: entry.txn_first_offset.map_or(-1, |o| o.as_i64()),
            })
            .collect()
    }))
}
