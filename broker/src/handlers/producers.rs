//! InitProducerId for idempotent producers: each gets a producer id no other producer of the cluster ever
//! had, at epoch 0, from the broker's block ([`crate::context::ProducerIds`]). A request with a
//! `transactional.id` goes to the id's transaction coordinator (`transactions`).

use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};

use super::*;

pub(super) async fn init_producer_id(
    ctx: &Arc<BrokerContext>,
    req: InitProducerIdRequest,
    version: i16,
) -> InitProducerIdResponse {
    let refused = |error: ResponseError| {
        InitProducerIdResponse::default()
            .with_error_code(error.code())
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
    };
    match req.transactional_id.as_ref().map(|id| id.0.as_str()) {
        // Kafka's rule: an empty transactional id is a malformed request, not an idempotent producer.
        Some("") => return refused(ResponseError::InvalidRequest),
        Some(id) => return super::transactions::init_transactional_producer(ctx, &req, id, version).await,
        None => {}
    }
    // Without a transactional id a producer always gets a new id at epoch 0, also when it names the id and
    // epoch it had (KIP-360): its epoch bumps after a sequence error are its own business.
    match ctx.producer_ids.next(&ctx.quorum, NodeId(ctx.config.node_id)).await {
        Some(id) => InitProducerIdResponse::default().with_producer_id(ProducerId(id)).with_producer_epoch(0),
        // Retriable: clients ask again.
        None => refused(ResponseError::CoordinatorLoadInProgress),
    }
}
