//! The partition owner's half of KIP-890's verification (the request handler's half is
//! `handlers::txn_verify`): before a leader asks a transaction coordinator about a producer's
//! transactional batch, the owner of the partition hands out the verification guard the append will have
//! to present, or says that the producer's transaction is open here already and nothing need be asked.
//!
//! The owner is the only thread that touches the log, and the log judges the guard in the same step that
//! appends (`PartitionLog::append_guarded`): a marker that lands between the coordinator's answer and the
//! append takes the guard away, and the batch is refused rather than opening a transaction nobody would
//! close. The rules are in `shardlog_storage::producer_state::verification`.

use kafka_protocol::ResponseError;
use shardlog_storage::fs::dma::DmaFs;
use shardlog_storage::producer_state::VerificationGuard;
use shardlog_storage::{LeaderEpoch, LogDir, TopicPartition};

use super::{ShardReplicas, missing};

/// A verification to begin for one partition's transactional batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerificationStart {
    pub tp: TopicPartition,
    /// The leader epoch the handler routed by: only the leader at that epoch hands out guards.
    pub epoch: LeaderEpoch,
    pub producer_id: i64,
    pub producer_epoch: i16,
}

/// The owner's answer for one partition: the guard to append with, `None` when the producer's
/// transaction is open there (the coordinator need not be asked), or why the partition cannot take the
/// batch (not led here at that epoch, no log).
pub type VerificationBegun = Result<Option<VerificationGuard>, ResponseError>;

/// Begins each verification of `starts`, answers in the same order.
pub(super) fn begin(
    logs: &LogDir<DmaFs>,
    replicas: &ShardReplicas,
    starts: &[VerificationStart],
) -> Vec<VerificationBegun> {
    starts
        .iter()
        .map(|start| {
            let Some(log) = logs.get(&start.tp) else { return Err(missing(logs, &start.tp)) };
            // A guard is for an append as leader at this epoch, which is checked the same way.
            replicas.check_append(&start.tp, start.epoch, false)?;
            Ok(log.begin_verification(start.producer_id, start.producer_epoch))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use shardlog_storage::StorageError;
    use shardlog_storage::producer_state::ProducerError;

    use super::super::kafka_error;
    use super::*;

    /// A batch refused for its guard was never written, and its transaction may well be going on (the
    /// guard also goes when leadership moves): producers must retry it, and do on NOT_ENOUGH_REPLICAS,
    /// without refreshing their metadata. INVALID_TXN_STATE would make them abort the transaction.
    #[test]
    fn a_batch_refused_for_its_guard_is_answered_with_an_error_producers_retry() {
        let refused = StorageError::Producer(ProducerError::Unverified { producer_id: 4, epoch: 1 });
        assert_eq!(kafka_error(&refused), ResponseError::NotEnoughReplicas);
    }
}
