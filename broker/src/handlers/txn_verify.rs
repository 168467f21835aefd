//! KIP-890 part 1 at a partition leader: before a transactional batch is appended, the transactional id's
//! coordinator is asked whether the partition is in the producer's ongoing transaction; a partition it is
//! not in is refused (INVALID_TXN_STATE, or the coordinator's own error), and nothing of it is written.
//! So data can only land in a partition the transaction will send a marker to.
//!
//! One produce request is verified with one call per producer in it (normally one): to this broker's
//! coordinator ([`verify_here`]) when it leads the id's `__transaction_state` partition, over the peer
//! protocol otherwise. Only partitions led here are asked about (the others are refused by the dispatch
//! anyway). For now every transactional batch is verified; a partition that already holds the producer's
//! open transaction will not need to be.
//!
//! The coordinator's answers that mean "ask again" (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
//! COORDINATOR_LOAD_IN_PROGRESS, CONCURRENT_TRANSACTIONS) are not produce errors a client retries: they are
//! answered NOT_ENOUGH_REPLICAS, which it does, as Kafka answers them.

use std::collections::{HashMap, HashSet};

use super::transactions::verify_here;
use super::*;
use crate::txn::batches::transactional_producer;
use crate::txn::{ProducerIdAndEpoch, TRANSACTION_STATE_TOPIC, transaction_partition};

/// The longest a produce request waits for its verification, over and above a peer call's own bound.
const VERIFY_TIMEOUT: Duration = Duration::from_secs(15);

/// The partitions of a produce request verified, and those refused by verification, with why.
#[derive(Debug, Default)]
pub struct TxnVerdicts {
    refused: HashMap<(String, i32), ResponseError>,
    verified: HashSet<(String, i32)>,
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
        (transactional && !self.verified.contains(&key)).then_some(ResponseError::NotLeaderOrFollower)
    }
}

/// Asks the coordinator about every transactional batch of `req` for a partition led here; the partitions
/// refused. Requests without a transactional batch are answered at once, with nothing asked.
pub async fn verify_transactional(ctx: &Arc<BrokerContext>, req: &ProduceRequest) -> TxnVerdicts {
    let image = ctx.image();
    let mut by_producer: BTreeMap<ProducerIdAndEpoch, Vec<TopicPartition>> = BTreeMap::new();
    for topic in &req.topic_data {
        let name = topic.name.0.as_str();
        if crate::topics::is_internal(name) {
            continue;
        }
        for partition in &topic.partition_data {
            let Some(producer) = partition.records.as_deref().and_then(transactional_producer) else { continue };
            if ctx.leader_in(&image, name, partition.index).is_ok() {
                by_producer.entry(producer).or_default().push(TopicPartition::new(name, partition.index as u32));
            }
        }
    }
    let mut verdicts = TxnVerdicts::default();
    if by_producer.is_empty() {
        return verdicts;
    }
    let transactional_id = req.transactional_id.as_ref().map(|id| id.0.as_str()).unwrap_or_default();
    for (producer, partitions) in by_producer {
        let answers = match within(VERIFY_TIMEOUT, ask(ctx, transactional_id, producer, partitions.clone())).await {
            Some(answers) => answers,
            None => vec![Err(ResponseError::CoordinatorNotAvailable); partitions.len()],
        };
        for (tp, answer) in partitions.into_iter().zip(answers) {
            let key = (tp.topic.to_string(), tp.partition as i32);
            match answer {
                Ok(()) => {
                    verdicts.verified.insert(key);
                }
                Err(error) => {
                    tracing::debug!(partition = %tp, transactional_id, ?producer, ?error, "transactional batch refused");
                    verdicts.refused.insert(key, produce_error(error));
                }
            }
        }
    }
    verdicts
}

/// The coordinator's answer for each of `partitions`, in order.
async fn ask(
    ctx: &Arc<BrokerContext>,
    transactional_id: &str,
    producer: ProducerIdAndEpoch,
    partitions: Vec<TopicPartition>,
) -> Vec<Result<(), ResponseError>> {
    // A transactional batch without a transactional id (or before Produce v3) has no transaction to be in.
    if transactional_id.is_empty() {
        return vec![Err(ResponseError::InvalidTxnState); partitions.len()];
    }
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

/// A coordinator's refusal as a produce answer: what a client retries stays retriable, and a fenced
/// producer is told INVALID_PRODUCER_EPOCH, which producers handle on produce by aborting (as Kafka's
/// partition leaders answer it; PRODUCER_FENCED would be fatal to them, and older clients do not know it).
fn produce_error(error: ResponseError) -> ResponseError {
    match error {
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
        for retry in [
            ResponseError::NotCoordinator,
            ResponseError::CoordinatorNotAvailable,
            ResponseError::CoordinatorLoadInProgress,
            ResponseError::ConcurrentTransactions,
        ] {
            assert_eq!(produce_error(retry), ResponseError::NotEnoughReplicas, "{retry:?}");
        }
        for given in [ResponseError::InvalidTxnState, ResponseError::InvalidProducerEpoch] {
            assert_eq!(produce_error(given), given);
        }
        assert_eq!(produce_error(ResponseError::ProducerFenced), ResponseError::InvalidProducerEpoch);
    }
}
