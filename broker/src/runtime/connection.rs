//! One client connection: frames in, responses out, in request order.
//!
//! Bad input closes the connection with one log line; nothing a client sends can panic the shard.

use std::sync::Arc;

use futures_lite::{AsyncReadExt, AsyncWriteExt, future};
use glommio::net::TcpStream;
use shardlog_net::kafka::{FrameReader, RequestError, decode_request, encode_response};

use super::Shutdown;
use crate::handlers::{self, BrokerContext};

const READ_CHUNK_BYTES: usize = 64 << 10;

/// What to do after a frame.
enum Next {
    Continue,
    Close,
}

pub(super) async fn serve(mut stream: TcpStream, ctx: Arc<BrokerContext>, shutdown: Shutdown) {
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "unknown".into());
    let mut reader = FrameReader::new(ctx.config.socket_request_max_bytes);
    let mut buf = vec![0u8; READ_CHUNK_BYTES];
    loop {
        loop {
            let frame = match reader.next_frame() {
                Ok(Some(frame)) => frame,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(%peer, error = %e, "closing connection: bad frame");
                    return;
                }
            };
            let (reply, next) = answer(&ctx, frame, &peer).await;
            if let Some(bytes) = reply {
                // A client that stops reading must not hold the broker's shutdown hostage.
                let written = future::or(async { Some(stream.write_all(&bytes).await) }, async {
                    shutdown.wait().await;
                    None
                })
                .await;
                match written {
                    Some(Ok(())) => {}
                    Some(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "connection lost while writing");
                        return;
                    }
                    None => return,
                }
            }
            if let Next::Close = next {
                return;
            }
        }
        if shutdown.is_triggered() {
            return;
        }
        let read = future::or(async { Some(stream.read(&mut buf).await) }, async {
            shutdown.wait().await;
            None
        })
        .await;
        match read {
            None | Some(Ok(0)) => return,
            Some(Ok(n)) => reader.extend(&buf[..n]),
            Some(Err(e)) => {
                tracing::debug!(%peer, error = %e, "connection lost while reading");
                return;
            }
        }
    }
}

/// The response frame for one request frame, and whether the connection stays open.
async fn answer(ctx: &Arc<BrokerContext>, frame: bytes::Bytes, peer: &str) -> (Option<bytes::BytesMut>, Next) {
    match decode_request(frame, &ctx.apis) {
        Ok(request) => {
            let (api_key, version, correlation_id) = (request.api_key, request.version, request.header.correlation_id);
            let Some(body) = handlers::handle(ctx, request).await else {
                return (None, Next::Continue); // produce with acks=0: Kafka sends nothing back
            };
            match encode_response(correlation_id, api_key, version, &body) {
                Ok(bytes) => (Some(bytes), Next::Continue),
                Err(e) => {
                    tracing::error!(%peer, error = %e, "cannot encode a response; closing connection");
                    (None, Next::Close)
                }
            }
        }
        // KIP-511: the client learns our versions from this answer and asks again on this connection.
        Err(e @ RequestError::UnsupportedVersion { .. }) if e.response(&ctx.apis).is_some() => {
            tracing::info!(%peer, error = %e, "answered with the supported versions");
            (e.response(&ctx.apis), Next::Continue)
        }
        Err(e) => {
            tracing::warn!(%peer, error = %e, "closing connection: bad request");
            (None, Next::Close)
        }
    }
}
