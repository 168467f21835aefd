//! The gate of a SASL listener's connections: every frame passes here before it is served. The SASL
//! exchange itself ([`SaslSession`]) is answered here, in order with the requests before it; a request
//! other than ApiVersions before authentication, or after the session ended without re-authentication,
//! closes the connection.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use shardlog_net::kafka::{DecodedRequest, FrameReader, ResponseFrame};

use super::connection::{Answer, Next, decode, encode};
use crate::context::BrokerContext;
use crate::security::authenticate::{Outcome, Reply, SaslSession, authenticate_response};
use crate::security::session::ClientInfo;

/// Passes one frame of a SASL listener's connection through its session: a request to serve as usual,
/// or the answer given here (or the connection closing).
pub(super) async fn gate(
    session: &mut SaslSession,
    ctx: &Arc<BrokerContext>,
    frame: Bytes,
    client: &mut ClientInfo,
    reader: &mut FrameReader,
) -> Result<DecodedRequest, Answer> {
    let peer = client.peer.clone();
    let ip = peer.parse::<std::net::SocketAddr>().map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |a| a.ip());
    if session.expects_raw_token() {
        // After a v0 handshake: a bare token, answered with a bare token.
        let image = ctx.image();
        let outcome = session.authenticate(&frame, &*image, ip).await;
        // A v0 client learns of a failure only by the connection closing: an empty token would mean success.
        let token = |reply: &Reply| reply.error.is_none().then(|| ResponseFrame::raw(&reply.bytes));
        return Err(finish(outcome, client, reader, ctx, token).await);
    }
    let request = match decode(ctx, frame, &peer) {
        Ok(request) => request,
        Err(answer) => return Err(answer),
    };
    let (api_key, version, correlation_id) = (request.api_key, request.version, request.header.correlation_id);
    match request.body {
        RequestKind::SaslHandshake(handshake) => {
            let (response, next) = match session.handshake(&handshake, version) {
                Outcome::Continue(response) | Outcome::Authenticated(response, _) => (response, Next::Continue),
                Outcome::Failed(response, delay) => {
                    tracing::info!(
                        %peer,
                        listener = %client.listener,
                        mechanism = %handshake.mechanism.as_str().chars().take(64).collect::<String>(),
                        "closing connection: SASL mechanism not enabled on this listener"
                    );
                    glommio::timer::sleep(delay).await;
                    (response, Next::Close)
                }
            };
            let (frame, _) =
                encode(Some(ResponseKind::SaslHandshake(response)), correlation_id, api_key, version, &peer);
            Err((frame, next))
        }
        RequestKind::SaslAuthenticate(authenticate) => {
            let image = ctx.image();
            let outcome = session.authenticate(&authenticate.auth_bytes, &*image, ip).await;
            let answer = finish(outcome, client, reader, ctx, |reply| {
                let body = ResponseKind::SaslAuthenticate(authenticate_response(reply));
                encode(Some(body), correlation_id, api_key, version, &peer).0
            })
            .await;
            Err(answer)
        }
        _ if api_key == ApiKey::ApiVersions => Ok(request),
        _ if session.principal().is_none() => {
            tracing::info!(%peer, listener = %client.listener, api = ?api_key, "closing connection: a request before SASL authentication");
            Err((None, Next::Close))
        }
        _ if session.expired(Instant::now()) => {
            tracing::info!(
                %peer,
                principal = %client.principal,
                "closing connection: its session ended (connections.max.reauth.ms) without re-authentication"
            );
            Err((None, Next::Close))
        }
        _ => Ok(request),
    }
}

/// The answer to a step of the exchange: on success the connection speaks for the principal and takes
/// frames up to `socket.request.max.bytes`; a failure is logged, answered after the delay, and closes.
async fn finish(
    outcome: Outcome<Reply>,
    client: &mut ClientInfo,
    reader: &mut FrameReader,
    ctx: &BrokerContext,
    frame: impl Fn(&Reply) -> Option<ResponseFrame>,
) -> Answer {
    match outcome {
        Outcome::Continue(reply) => (frame(&reply), Next::Continue),
        Outcome::Authenticated(reply, principal) => {
            tracing::debug!(peer = %client.peer, listener = %client.listener, %principal, "authenticated");
            client.principal = principal;
            reader.set_limit(ctx.config.socket_request_max_bytes, "socket.request.max.bytes");
            (frame(&reply), Next::Continue)
        }
        Outcome::Failed(reply, delay) => {
            let reason = reply.error.as_ref().map_or("", |(_, reason)| reason.as_str());
            tracing::info!(peer = %client.peer, listener = %client.listener, reason, "closing connection: SASL authentication failed");
            glommio::timer::sleep(delay).await;
            (frame(&reply), Next::Close)
        }
    }
}
