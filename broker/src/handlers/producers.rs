//! InitProducerId for idempotent producers: each gets a producer id no other producer of the cluster ever
//! had, at epoch 0, from the broker's block ([`crate::context::ProducerIds`]).
//!
//! Transactions are not served: a request with a `transactional.id` gets
//! TRANSACTIONAL_ID_AUTHORIZATION_FAILED, which clients treat as fatal rather than retry.

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};

use super::*;

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
