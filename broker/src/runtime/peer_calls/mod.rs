//! Calls between brokers for transactions, over the peer protocol (`docs/peer-protocol.md` §2.3):
//! markers to a partition's leader, and a partition leader's verification with a transaction
//! coordinator (KIP-890 part 1).
//!
//! - [`write_markers`] and [`verify`], the caller's side ([`client`]): each sends one request per
//!   [`MAX_CALL_ITEMS`] items to the callee's inter-broker listener, over a connection this shard keeps
//!   for that callee, and turns the answer's codes back into errors.
//! - [`serve`], the callee's side: the inter-broker listener hands it a connection whose first frame is
//!   a calls Hello (or, under cluster mTLS, whose ClientHello offers the calls ALPN); it answers each
//!   request with this broker's own handlers.
//!
//! The rules: a call waits at most [`SETUP_TIMEOUT`] for a connection and then, once its request is sent,
//! a bound of its kind for the answer; a callee that cannot be reached or answers badly (or not in time) is
//! answered for, item by item, with a retriable error (NOT_LEADER_OR_FOLLOWER for a marker,
//! COORDINATOR_NOT_AVAILABLE for a verification), so the coordinator tries its markers again and the
//! producer its batch. The wait for markers outlasts the callee's own bound on answering them
//! ([`MARKERS_ANSWER_WAIT`]), so markers are sent again only after the callee has given up on the first
//! ones. Nothing here decides anything about transactions: the callee's handlers do.

mod client;
mod serve;
#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::ResponseError;
use shardlog_net::peer::calls::{
    CallPartition, MAX_CALL_ITEMS, MAX_TRANSACTIONAL_ID_BYTES, VerifyTxn, WireMarker, WriteMarkers, kind,
};
use shardlog_net::peer::encode_message;
use shardlog_storage::TopicPartition;

pub(super) use serve::{accept_plain, accept_tls, starts_with_calls_hello};

use crate::context::BrokerContext;
use crate::handlers::txn_markers::{MARKERS_ANSWER_BOUND, MarkerWrite};
use crate::quorum::state::NodeId;
use crate::txn::ProducerIdAndEpoch;
use client::{Call, CallError, next_correlation};

/// How long a call may take to get a connection before it sends anything (a free slot in the pool, or a
/// new connection: its connect, TLS handshake and Hello). Giving up here costs nothing: the callee has
/// seen no request.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// The part of it a TCP connect, or a TLS handshake, may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// How long either side waits for the other's Hello or its answer.
const HELLO_WAIT: Duration = Duration::from_secs(5);
/// How long a verification's answer may take once it is sent. The callee only looks at its coordinator's
/// state, and a verification asked again changes nothing.
const VERIFY_ANSWER_WAIT: Duration = Duration::from_secs(10);
/// How long a caller waits for the answer to markers it sent: longer than the callee takes at most
/// ([`MARKERS_ANSWER_BOUND`], counted from when its handler gets them), by a margin for the request's
/// way there and the answer's way back. Were the caller to give up first, it would send the markers again
/// while the callee may still be writing the first ones: each would be appended twice. That is harmless (a
/// marker for a transaction already ended ends nothing), but only this order makes a retry mean that the
/// callee has answered or is gone.
const MARKERS_ANSWER_WAIT: Duration = MARKERS_ANSWER_BOUND.saturating_add(Duration::from_secs(5));
const _: () = assert!(MARKERS_ANSWER_WAIT.as_millis() > MARKERS_ANSWER_BOUND.as_millis());

/// Writes markers through `leader`; the error of each, in order.
pub(crate) async fn write_markers(
    ctx: &Arc<BrokerContext>,
    leader: NodeId,
    writes: &[MarkerWrite],
) -> Vec<Option<ResponseError>> {
    let mut errors = Vec::with_capacity(writes.len());
    for chunk in writes.chunks(MAX_CALL_ITEMS) {
        let call = markers_call(chunk);
        let refused = ResponseError::NotLeaderOrFollower;
        match Box::pin(client::call(ctx, leader, &call, MARKERS_ANSWER_WAIT)).await {
            Ok(codes) => errors.extend(codes.into_iter().map(|code| error_of(code, refused))),
            Err(e) => {
                failed(leader, "markers", &e);
                errors.extend(std::iter::repeat_n(Some(refused), chunk.len()));
            }
        }
    }
    errors
}

/// Asks `coordinator`, the coordinator of `transactional_id`, whether each partition is in `producer`'s
/// ongoing transaction (KIP-890 part 1); the answer for each, in order.
pub(crate) async fn verify(
    ctx: &Arc<BrokerContext>,
    coordinator: NodeId,
    transactional_id: &str,
    producer: ProducerIdAndEpoch,
    partitions: Vec<TopicPartition>,
) -> Vec<Result<(), ResponseError>> {
    // No coordinator has such an id: nothing could have added a partition under it.
    if transactional_id.is_empty() || transactional_id.len() > MAX_TRANSACTIONAL_ID_BYTES {
        return vec![Err(ResponseError::InvalidTxnState); partitions.len()];
    }
    let mut verdicts = Vec::with_capacity(partitions.len());
    for chunk in partitions.chunks(MAX_CALL_ITEMS) {
        let call = verify_call(transactional_id, producer, chunk);
        let unavailable = ResponseError::CoordinatorNotAvailable;
        match Box::pin(client::call(ctx, coordinator, &call, VERIFY_ANSWER_WAIT)).await {
            Ok(codes) => verdicts.extend(codes.into_iter().map(|code| error_of(code, unavailable).map_or(Ok(()), Err))),
            Err(e) => {
                failed(coordinator, "verification", &e);
                verdicts.extend(std::iter::repeat_n(Err(unavailable), chunk.len()));
            }
        }
    }
    verdicts
}

/// A WriteMarkers request for `writes` (at most [`MAX_CALL_ITEMS`]).
fn markers_call(writes: &[MarkerWrite]) -> Call {
    let correlation = next_correlation();
    let markers = writes
        .iter()
        .map(|w| WireMarker {
            partition: CallPartition { topic: w.tp.topic.clone(), partition: w.tp.partition },
            producer_id: w.producer_id,
            producer_epoch: w.producer_epoch,
            coordinator_epoch: w.coordinator_epoch,
            commit: w.commit,
        })
        .collect();
    let body = encode_message(&WriteMarkers { correlation, markers });
    Call { kind: kind::WRITE_MARKERS, body, answer_kind: kind::WRITE_MARKERS_ANSWER, correlation, items: writes.len() }
}

/// A VerifyTxn request for `partitions` (at most [`MAX_CALL_ITEMS`]).
fn verify_call(transactional_id: &str, producer: ProducerIdAndEpoch, partitions: &[TopicPartition]) -> Call {
    let correlation = next_correlation();
    let request = VerifyTxn {
        correlation,
        transactional_id: transactional_id.to_string(),
        producer_id: producer.producer_id,
        producer_epoch: producer.epoch,
        partitions: partitions
            .iter()
            .map(|tp| CallPartition { topic: tp.topic.clone(), partition: tp.partition })
            .collect(),
    };
    let body = encode_message(&request);
    Call { kind: kind::VERIFY_TXN, body, answer_kind: kind::VERIFY_TXN_ANSWER, correlation, items: partitions.len() }
}

/// The error a code names; `None` for 0, `unknown` for a code this build does not know.
fn error_of(code: i16, unknown: ResponseError) -> Option<ResponseError> {
    (code != 0).then(|| match ResponseError::try_from_code(code) {
        Some(ResponseError::Unknown(_)) | None => unknown,
        Some(error) => error,
    })
}

/// The one log line of a call that got no answer: a callee that is down is expected while brokers
/// restart; one that answers outside the protocol is not.
fn failed(callee: NodeId, what: &str, error: &CallError) {
    match error {
        CallError::Unreachable(_) => tracing::debug!(?callee, %error, "peer call for {what} failed"),
        CallError::Bad(_) => tracing::warn!(?callee, %error, "peer call for {what} failed"),
    }
}
