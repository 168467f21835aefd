//! The producer ids a broker hands out: each idempotent producer gets one no other producer of the cluster
//! ever had. Ids come from the quorum in blocks ([`Command::AllocateProducerIds`]), so that brokers hand
//! them out without asking each other; a block a broker did not finish is simply never used.

use crate::metadata::link::QuorumHandle;
use crate::quorum::state::{Command, Event, NodeId};
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
