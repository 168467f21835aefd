//! One client connection: frames in, responses out, in request order, with pipelined requests served
//! at once.
//!
//! Two halves run side by side. The reader decodes each frame, starts its handler as a task of its own,
//! and queues the task; the writer takes tasks off the queue in order and writes each answer when it is
//! ready. So a client that pipelines produce requests gets them appended in order and made durable by
//! shared fdatasyncs, and a slow request (a long-polling fetch) does not stop later ones from starting.
//! The queue is bounded in requests and in bytes, so one connection cannot hold unbounded memory.
//!
//! Produce requests are dispatched to the owning shards by the reader itself, before the next frame is
//! decoded: that is what keeps a connection's appends to one partition in request order.
//!
//! Bad input closes the connection with one log line; nothing a client sends can panic the shard.

use std::rc::Rc;
use std::sync::Arc;

use bytes::BytesMut;
use futures_lite::{AsyncReadExt, AsyncWriteExt, future};
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use glommio::net::TcpStream;
use glommio::sync::{Semaphore, StaticPermit};
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};
use shardlog_net::kafka::{FrameReader, RequestError, decode_request, encode_response};

use super::Shutdown;
use crate::handlers::{self, BrokerContext};

const READ_CHUNK_BYTES: usize = 64 << 10;
/// The most requests one connection has started and not yet answered.
const MAX_IN_FLIGHT_REQUESTS: usize = 32;
/// The most request bytes one connection holds in flight (a larger single request is still admitted
/// alone).
const MAX_IN_FLIGHT_BYTES: u64 = 64 << 20;

/// What to do after a frame's answer is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    Continue,
    Close,
}

/// An answer on its way: the response frame (none for acks=0 produce) and what comes after it.
type Answer = (Option<BytesMut>, Next);

/// A request in the queue, in arrival order.
enum Pending {
    /// A handler running as its own task; the permit holds the request's share of the byte budget.
    Running(glommio::Task<Answer>, StaticPermit),
    /// Known without running anything (a refusal).
    Ready(Answer),
}

pub(super) async fn serve(stream: TcpStream, ctx: Arc<BrokerContext>, shutdown: Shutdown) {
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "unknown".into());
    let (reader, writer) = futures_lite::io::split(stream);
    let (queue, answers) = local_channel::new_bounded(MAX_IN_FLIGHT_REQUESTS);
    // The reader ends at end of stream, a bad frame or shutdown, dropping its end of the queue; the writer
    // then writes what is queued and ends. A writer that ends first (a lost peer) ends the reader too.
    let reading = async {
        read_requests(reader, queue, &ctx, &shutdown, &peer).await;
        future::pending::<()>().await
    };
    future::or(write_answers(writer, answers, &shutdown, &peer), reading).await;
}

async fn read_requests(
    mut stream: futures_lite::io::ReadHalf<TcpStream>,
    queue: LocalSender<Pending>,
    ctx: &Arc<BrokerContext>,
    shutdown: &Shutdown,
    peer: &str,
) {
    let budget = Rc::new(Semaphore::new(MAX_IN_FLIGHT_BYTES));
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
            let units = (frame.len() as u64).clamp(1, MAX_IN_FLIGHT_BYTES);
            let Ok(permit) = budget.clone().acquire_static_permit(units).await else { return };
            let pending = start(ctx, frame, peer, permit);
            let last = matches!(pending, Pending::Ready((_, Next::Close)));
            if queue.send(pending).await.is_err() || last {
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
            None => return,
            Some(Ok(0)) => {
                if reader.buffered() > 0 {
                    tracing::warn!(%peer, bytes = reader.buffered(), "closing connection: it ended inside a frame");
                }
                return;
            }
            Some(Ok(n)) => reader.extend(&buf[..n]),
            Some(Err(e)) => {
                tracing::debug!(%peer, error = %e, "connection lost while reading");
                return;
            }
        }
    }
}

async fn write_answers(
    mut stream: futures_lite::io::WriteHalf<TcpStream>,
    answers: LocalReceiver<Pending>,
    shutdown: &Shutdown,
    peer: &str,
) {
    while let Some(pending) = answers.recv().await {
        let (reply, next) = match pending {
            Pending::Running(task, permit) => {
                let answer = task.await;
                drop(permit);
                answer
            }
            Pending::Ready(answer) => answer,
        };
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
        if next == Next::Close {
            return;
        }
    }
}

/// Decodes a frame and starts answering it.
fn start(ctx: &Arc<BrokerContext>, frame: bytes::Bytes, peer: &str, permit: StaticPermit) -> Pending {
    let request = match decode_request(frame, &ctx.apis) {
        Ok(request) => request,
        // KIP-511: the client learns our versions from this answer and asks again on this connection.
        Err(e @ RequestError::UnsupportedVersion { .. }) if e.response(&ctx.apis).is_some() => {
            tracing::info!(%peer, error = %e, "answered with the supported versions");
            return Pending::Ready((e.response(&ctx.apis), Next::Continue));
        }
        Err(e) => {
            tracing::warn!(%peer, error = %e, "closing connection: bad request");
            return Pending::Ready((None, Next::Close));
        }
    };
    let (api_key, version, correlation_id) = (request.api_key, request.version, request.header.correlation_id);
    let (ctx, peer) = (ctx.clone(), peer.to_string());
    let task = match request.body {
        // Dispatched here, before the next frame is read, so appends keep the connection's order.
        RequestKind::Produce(req) => {
            let produce = handlers::dispatch_produce(&ctx, req);
            glommio::spawn_local(async move {
                let body = produce.answer().await.map(ResponseKind::Produce);
                encode(body, correlation_id, api_key, version, &peer)
            })
        }
        _ => glommio::spawn_local(async move {
            let body = handlers::handle(&ctx, request).await;
            encode(body, correlation_id, api_key, version, &peer)
        }),
    };
    Pending::Running(task, permit)
}

fn encode(body: Option<ResponseKind>, correlation_id: i32, api_key: ApiKey, version: i16, peer: &str) -> Answer {
    // Produce with acks=0: Kafka sends nothing back.
    let Some(body) = body else { return (None, Next::Continue) };
    match encode_response(correlation_id, api_key, version, &body) {
        Ok(bytes) => (Some(bytes), Next::Continue),
        Err(e) => {
            tracing::error!(%peer, error = %e, "cannot encode a response; closing connection");
            (None, Next::Close)
        }
    }
}
