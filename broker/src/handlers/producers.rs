//! InitProducerId for idempotent producers: each gets a producer id no other producer of the cluster ever
//! had, at epoch 0. Ids come from the quorum in blocks ([`Command::AllocateProducerIds`]), so that brokers
//! hand them out without asking each other; a block a broker did not finish is simply never used.
//!
//! Transactions are not served: a request with a `transactional.id` gets
//! TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which clients treat as fatal rather than retry.

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};

use super::*;
use crate::metadata::link::QuorumHandle;
use crate::quorum::state::{Command, Event};
use crate::quorum::wire::WireWriteResult;

/// Producer ids a broker takes from the quorum at a time (Kafka's block size).
pub const PRODUCER_ID_BLOCK: u32 = 1000;
/// How long InitProducerId waits for a block before it answers COORDINATOR_LOAD_IN_PROGRESS.
const QUORUM_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

/// The block of producer ids this broker hands out: `next..end`. Shared by every shard.
#[derive(Debug, Default)]
pub struct ProducerIds {
    block: async_lock::Mutex<(i64, i64)>,
}

impl ProducerIds {
    /// The next unused id, taking a new block from the quorum when this one is used up; `None` when the
    /// quorum could not be reached.
    pub async fn next(&self, quorum: &QuorumHandle, broker: NodeId) -> Option<i64> {
        let mut block = self.block.lock().await;
        if block.0 >= block.1 {
            // Bounded, so that a quorum without a leader does not hold every shard's InitProducerId (the
            // client asks again); a block granted after the wait ended is simply not used.
            let write = quorum.write(Command::AllocateProducerIds { broker, count: PRODUCER_ID_BLOCK });
            let timeout = async {
                glommio::timer::sleep(QUORUM_WAIT).await;
                WireWriteResult::Failed("no answer from the quorum in time".into())
            };
            let outcome = futures_lite::future::or(write, timeout).await;
            let WireWriteResult::Applied { outcome: Ok(events), .. } = outcome else {
                tracing::debug!(?outcome, "no block of producer ids from the quorum");
                return None;
            };
            let (first, count) = events.iter().find_map(|e| match e {
                Event::ProducerIdsAllocated { first, count, .. } => Some((*first, *count)),
                _ => None,
            })?;
            *block = (first, first + i64::from(count));
        }
        let id = block.0;
        block.0 += 1;
        Some(id)
    }
}

pub(super) async fn init_producer_id(ctx: &Arc<BrokerContext>, req: InitProducerIdRequest) -> InitProducerIdResponse {
    let refused = |error: ResponseError| {
        InitProducerIdResponse::default()
            .with_error_code(error.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
    };
    if req.transactional_id.as_ref().is_some_and(|id| !id.0.is_empty()) {
        tracing::debug!(transactional_id = ?req.transactional_id, "InitProducerId refused: transactions are not supported");
        return refused(ResponseError::TransactionalIdAuthorizationFailed);
    }
    // Without a transactional id a producer always gets a new id at epoch 0, also when it names the id and
    // epoch it had (KIP-360): its epoch bumps after a sequence error are its own business.
    match ctx.producer_ids.next(&ctx.quorum, NodeId(ctx.config.node_id)).await {
        Some(id) => InitProducerIdResponse::default().with_producer_id(ProducerId(id)).with_producer_epoch(0),
        // Retriable: clients ask again.
        None => refused(ResponseError::CoordinatorLoadInProgress),
    }
}
