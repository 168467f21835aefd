//! KIP-890 part 1 at a partition leader: a transactional batch is appended only into a transaction its
//! coordinator knows to include the partition, so that a marker will follow it. A partition it is not in
//! is refused (INVALID_TXN_STATE, or the coordinator's own error), and nothing of it is written.
//!
//! For each transactional batch of a produce request, for a partition led here:
//! 1. The partition's owner (its shard) is asked first ([`PartitionRequest::BeginVerification`]). If the
//!    producer's transaction is already open in the partition at the batch's epoch, the coordinator is
//!    not asked: it was asked for the transaction's first batch there, and the transaction cannot have
//!    ended without a marker closing it in the partition. Otherwise the owner hands out the partition's
//!    verification guard for the producer.
//! 2. The coordinator is asked about the partitions that got a guard: one call per producer in the
//!    request (normally one), to this broker's coordinator ([`verify_here`]) when it leads the id's
//!    `__transaction_state` partition, over the peer protocol otherwise.
//! 3. The batch goes to its shard with its guard (`ProduceBatch::guard`), and the log judges it in the
//!    step that appends it: a batch that would open a transaction needs the guard still held. Any marker
//!    for the producer takes the guard away, so a transaction that ended between the coordinator's answer
//!    and the append (its marker landing first) is not opened again by a late batch, which would hang:
//!    that batch is refused NOT_ENOUGH_REPLICAS, retried, and verified afresh. A batch that was told its
//!    transaction is open, and finds it ended when it appends, is refused the same way.
//!
//! The rules of the guard are in `shardlog_storage::producer_state::verification`; the owner's half is
//! `shard::txn_guards`.
//!
//! The coordinator's answers that mean "ask again" (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
//! COORDINATOR_LOAD_IN_PROGRESS, CONCURRENT_TRANSACTIONS) are not produce errors a client retries: they are
//! answered NOT_ENOUGH_REPLICAS, which it does, as Kafka answers them.

use std::collections::HashMap;

use shardlog_storage::producer_state::VerificationGuard;

use super::transactions::verify_here;
use super::*;
use crate::shard::{VerificationBegun, VerificationStart};
use crate::txn::batches::transactional_producer;
use crate::txn::{ProducerIdAndEpoch, TRANSACTION_STATE_TOPIC, transaction_partition};

/// The first Produce version whose clients know TRANSACTION_ABORTABLE.
const TRANSACTION_ABORTABLE_FROM: i16 = 11;

/// The longest a produce request waits for its verification, over and above a peer call's own bound.
const VERIFY_TIMEOUT: Duration = Duration::from_secs(15);

/// The partitions of a produce request verified, each with the guard its append presents (`None`: its
/// transaction was open there), and those refused by verification, with why.
#[derive(Debug, Default)]
pub struct TxnVerdicts {
    refused: HashMap<(String, i32), ResponseError>,
    verified: HashMap<(String, i32), Option<VerificationGuard>>,
}

impl TxnVerdicts {
    /// Why the batch `records` for `partition` of `topic` may not be appended, if it may not. A
    /// transactional batch nobody verified (its partition came to be led here after the verification
    /// looked) is refused NOT_LEADER_OR_FOLLOWER, which the client retries: it is never appended unchecked.
    pub(super) fn refusal(&self, topic: &str, partition: i32, records: Option<&[u8]>) -> Option<ResponseError> {
        let key = (topic.to_string(), partition);
        if let Some(refused) = self.refused.get(&key) {
            return Some(*refused);
        }
        let transactional = records.and_then(transactional_producer).is_some();
        (transactional && !self.verified.contains_key(&key)).then_some(ResponseError::NotLeaderOrFollower)
    }

    /// The verification guard the batch for `partition` of `topic` is appended with, if it got one.
    pub(super) fn guard(&self, topic: &str, partition: i32) -> Option<VerificationGuard> {
        self.verified.get(&(topic.to_string(), partition)).copied().flatten()
    }
}

/// Verifies every transactional batch of `req` for a partition led here (see the module documentation);
/// the partitions verified and refused. Requests without a transactional batch are answered at once, with
/// nothing asked.
pub async fn verify_transactional(ctx: &Arc<BrokerContext>, req: &ProduceRequest, version: i16) -> TxnVerdicts {
    let image = ctx.image();
    let mut found: Vec<(ProducerIdAndEpoch, usize, VerificationStart)> = Vec::new();
    for topic in &req.topic_data {
        let name = topic.name.0.as_str();
        if crate::topics::is_internal(name) {
            continue;
        }
        for partition in &topic.partition_data {
            let Some(producer) = partition.records.as_deref().and_then(transactional_producer) else { continue };
            if let Ok(led) = ctx.leader_in(&image, name, partition.index) {
                let start = VerificationStart {
                    tp: TopicPartition::new(name, partition.index as u32),
                    epoch: led.epoch,
                    producer_id: producer.producer_id,
                    producer_epoch: producer.epoch,
                };
                found.push((producer, led.shard, start));
            }
        }
    }
    drop(image);
    let mut verdicts = TxnVerdicts::default();
    if found.is_empty() {
        return verdicts;
    }
    let key = |tp: &TopicPartition| (tp.topic.to_string(), tp.partition as i32);
    let transactional_id = req.transactional_id.as_ref().map(|id| id.0.as_str()).unwrap_or_default();
    // A transactional batch without a transactional id (or before Produce v3) has no transaction to be in.
    if transactional_id.is_empty() {
        for (_, _, start) in found {
            verdicts.refused.insert(key(&start.tp), ResponseError::InvalidTxnState);
        }
        return verdicts;
    }
    // Each partition's guard is handed out before the coordinator is asked: a marker landing after the
    // coordinator looked takes it away.
    let begun = begin_verifications(ctx, &found).await;
    let mut by_producer: BTreeMap<ProducerIdAndEpoch, Vec<(TopicPartition, VerificationGuard)>> = BTreeMap::new();
    for ((producer, _, start), begun) in found.into_iter().zip(begun) {
        match begun {
            Ok(Some(guard)) => by_producer.entry(producer).or_default().push((start.tp, guard)),
            Ok(None) => {
                verdicts.verified.insert(key(&start.tp), None);
            }
            Err(error) => {
                verdicts.refused.insert(key(&start.tp), error);
            }
        }
    }
    for (producer, guarded) in by_producer {
        let partitions: Vec<TopicPartition> = guarded.iter().map(|(tp, _)| tp.clone()).collect();
        let answers = match within(VERIFY_TIMEOUT, ask(ctx, transactional_id, producer, partitions)).await {
            Some(answers) => answers,
            None => vec![Err(ResponseError::CoordinatorNotAvailable); guarded.len()],
        };
        for ((tp, guard), answer) in guarded.into_iter().zip(answers) {
            match answer {
                Ok(()) => {
                    verdicts.verified.insert(key(&tp), Some(guard));
                }
                Err(error) => {
                    tracing::debug!(partition = %tp, transactional_id, ?producer, ?error, "transactional batch refused");
                    verdicts.refused.insert(key(&tp), produce_error(error, version));
                }
            }
        }
    }
    verdicts
}

/// Asks the owner of each partition of `found` (by shard) to begin its verification; the answers in the
/// order of `found`. A shard that cannot be reached answers KAFKA_STORAGE_ERROR, as it does for produce.
async fn begin_verifications(
    ctx: &Arc<BrokerContext>,
    found: &[(ProducerIdAndEpoch, usize, VerificationStart)],
) -> Vec<VerificationBegun> {
    let mut by_shard: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, (_, shard, _)) in found.iter().enumerate() {
        by_shard.entry(*shard).or_default().push(i);
    }
    let mut begun: Vec<VerificationBegun> = vec![Err(ResponseError::KafkaStorageError); found.len()];
    for (shard, indexes) in by_shard {
        let starts = indexes.iter().map(|&i| found[i].2.clone()).collect();
        let answers = ask_shard(ctx, shard, |reply| PartitionRequest::BeginVerification { starts, reply })
            .await
            .unwrap_or_default();
        for (i, answer) in indexes.into_iter().zip(answers) {
            begun[i] = answer;
        }
    }
    begun
}

/// The coordinator's answer for each of `partitions`, in order.
async fn ask(
    ctx: &Arc<BrokerContext>,
    transactional_id: &str,
    producer: ProducerIdAndEpoch,
    partitions: Vec<TopicPartition>,
) -> Vec<Result<(), ResponseError>> {
    let image = ctx.image();
    let coordinator = image.topic(TRANSACTION_STATE_TOPIC).filter(|t| !t.partitions.is_empty()).and_then(|topic| {
        let partition = transaction_partition(transactional_id, topic.partitions.len() as u32);
        image.partition(TRANSACTION_STATE_TOPIC, partition)?.leader
    });
    drop(image);
    match coordinator {
        None => vec![Err(ResponseError::CoordinatorNotAvailable); partitions.len()],
        Some(node) if node == NodeId(ctx.config.node_id) => {
            verify_here(ctx, transactional_id, producer, partitions).await
        }
        Some(node) => crate::runtime::peer_calls::verify(ctx, node, transactional_id, producer, partitions).await,
    }
}

/// A coordinator's refusal as an answer to a Produce request of `version`: what a client retries stays
/// retriable, and a fenced producer is told INVALID_PRODUCER_EPOCH, which producers handle on produce by
/// aborting (as Kafka's partition leaders answer it; PRODUCER_FENCED would be fatal to them, and older
/// clients do not know it). A partition not in the producer's transaction is TRANSACTION_ABORTABLE to
/// clients that know that error (Produce v11 and later, KIP-890), INVALID_TXN_STATE to the others, as
/// Kafka's leaders answer.
fn produce_error(error: ResponseError, version: i16) -> ResponseError {
    match error {
        ResponseError::InvalidTxnState if version >= TRANSACTION_ABORTABLE_FROM => ResponseError::TransactionAbortable,
        ResponseError::NotCoordinator
        | ResponseError::CoordinatorNotAvailable
        | ResponseError::CoordinatorLoadInProgress
        | ResponseError::ConcurrentTransactions => ResponseError::NotEnoughReplicas,
        ResponseError::ProducerFenced => ResponseError::InvalidProducerEpoch,
        other => other,
    }
}

async fn within<T>(limit: Duration, work: impl Future<Output = T>) -> Option<T> {
    futures_lite::future::or(async { Some(work.await) }, async {
        glommio::timer::sleep(limit).await;
        None
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinator_errors_become_errors_a_producer_retries() {
        for version in [3, 10, 11] {
            for retry in [
                ResponseError::NotCoordinator,
                ResponseError::CoordinatorNotAvailable,
                ResponseError::CoordinatorLoadInProgress,
                ResponseError::ConcurrentTransactions,
            ] {
                assert_eq!(produce_error(retry, version), ResponseError::NotEnoughReplicas, "{retry:?}");
            }
            assert_eq!(
                produce_error(ResponseError::InvalidProducerEpoch, version),
                ResponseError::InvalidProducerEpoch
            );
            assert_eq!(produce_error(ResponseError::ProducerFenced, version), ResponseError::InvalidProducerEpoch);
        }
        // A partition not in the transaction: TRANSACTION_ABORTABLE only to clients that know it.
        assert_eq!(produce_error(ResponseError::InvalidTxnState, 10), ResponseError::InvalidTxnState);
        assert_eq!(produce_error(ResponseError::InvalidTxnState, 11), ResponseError::TransactionAbortable);
    }
}
