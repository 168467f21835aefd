//! Calls between brokers for transactions, over the peer protocol: markers to a partition's leader, and
//! a partition leader's verification with a transaction coordinator (KIP-890 part 1).

use std::sync::Arc;

use kafka_protocol::ResponseError;

use crate::context::BrokerContext;
use crate::handlers::txn_markers::MarkerWrite;
use crate::quorum::state::NodeId;

/// Writes markers through `leader`; the error of each, in order.
pub(crate) async fn write_markers(
    ctx: &Arc<BrokerContext>,
    leader: NodeId,
    writes: &[MarkerWrite],
) -> Vec<Option<ResponseError>> {
    let _ = (ctx, leader);
    vec![Some(ResponseError::NotLeaderOrFollower); writes.len()]
}
