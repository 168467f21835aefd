//! The callee's side: a peer-calls connection on the inter-broker listener, served on the shard that
//! accepted it. The Hello is checked (this cluster, a registered broker other than this one; under
//! cluster mTLS the broker the certificate names), then each request is answered in order by calling
//! this broker's own handlers: [`write_markers_here`] for markers, [`verify_here`] for verifications.
//! Anything that is not the protocol closes the connection with one log line; nothing a peer sends panics.

use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_lite::future;
use futures_lite::{AsyncRead, AsyncWrite, AsyncWriteExt};
use glommio::net::TcpStream;
use kafka_protocol::ResponseError;
use shardlog_net::peer::calls::{
    CallAnswer, CallRequest, CallsHello, CallsHelloAnswer, MAX_CALL_FRAME_BYTES, VerifyTxn, WriteMarkers,
    decode_request, kind,
};
use shardlog_net::peer::{MAGIC, PeerFrameError, PeerFrameReader, decode_message, encode_frame, encode_message};
use shardlog_storage::TopicPartition;

use super::super::replication::{ReadError, accept_tls as tls_handshake, next_frame, within};
use super::HELLO_WAIT;
use crate::context::BrokerContext;
use crate::handlers::transactions::verify_here;
use crate::handlers::txn_markers::{MarkerWrite, write_markers_here};
use crate::quorum::state::NodeId;
use crate::txn::ProducerIdAndEpoch;

/// How long the accepting shard waits for a plain peer connection's first 8 bytes (its frame type).
const FIRST_HEADER_WAIT: Duration = Duration::from_secs(1);
/// A connection with no request for this long is closed (the caller opens another when it needs one).
const IDLE_LIMIT: Duration = Duration::from_secs(300);

/// Whether a plain peer connection (its first bytes are `SLP1`) starts with a peer-calls Hello: the
/// type field of its first frame header, looked at without consuming anything.
pub(in crate::runtime) async fn starts_with_calls_hello(fd: RawFd) -> bool {
    let mut first = [0u8; 8];
    let deadline = Instant::now() + FIRST_HEADER_WAIT;
    loop {
        // SAFETY: `fd` is the open socket of the stream the caller holds; MSG_PEEK leaves the bytes queued
        // and the buffer is `first.len()` bytes long.
        let n = unsafe { libc::recv(fd, first.as_mut_ptr().cast(), first.len(), libc::MSG_PEEK | libc::MSG_DONTWAIT) };
        if n == first.len() as isize {
            let magic = u32::from_be_bytes([first[0], first[1], first[2], first[3]]);
            return magic == MAGIC && u16::from_be_bytes([first[6], first[7]]) == kind::HELLO;
        }
        if n == 0 || Instant::now() >= deadline {
            return false;
        }
        glommio::timer::sleep(Duration::from_millis(2)).await;
    }
}

/// A plain peer-calls connection, on the shard that accepted it. Under cluster mTLS it is refused before
/// anything is read. `slot` is its place in the connection limits.
pub(in crate::runtime) async fn accept_plain(
    stream: TcpStream,
    ctx: Arc<BrokerContext>,
    peer: String,
    slot: Box<dyn Send>,
) {
    let _slot = slot;
    if ctx.cluster_tls.is_some() {
        crate::metrics::peer_refused("peer-calls", "plaintext");
        return tracing::warn!(%peer, "refused a peer-calls connection: plain TCP, and cluster mTLS is required");
    }
    let _ = stream.set_nodelay(true);
    serve(stream, &ctx, &peer, None).await;
}

/// A peer-calls connection under cluster mTLS (its ClientHello offered the calls ALPN): the handshake on
/// this shard, then the Hello, which must speak for the node the certificate names.
pub(in crate::runtime) async fn accept_tls(
    stream: TcpStream,
    ctx: Arc<BrokerContext>,
    peer: String,
    slot: Box<dyn Send>,
) {
    let _slot = slot;
    let Some(tls) = ctx.cluster_tls.clone() else { return };
    let _ = stream.set_nodelay(true);
    let Some((stream, node)) = tls_handshake(&tls, stream, &peer, "peer-calls").await else { return };
    serve(stream, &ctx, &peer, Some(node)).await;
}

/// Serves a connection (plain or TLS) until it ends, fails a check, stays idle too long, or the broker
/// stops. `proven` is the node a certificate proved the caller to be.
async fn serve<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    ctx: &Arc<BrokerContext>,
    peer: &str,
    proven: Option<NodeId>,
) {
    let callee = Callee { peer, me: ctx.config.node_id, proven };
    let check = |hello: &CallsHello| check_hello(ctx, hello, proven);
    callee.serve(stream, check, || ctx.shutdown.wait(), |request| answer_request(ctx, request)).await
}

/// The callee's side of one connection, apart from what answers its requests.
pub(super) struct Callee<'a> {
    /// The caller's address, for logs.
    pub peer: &'a str,
    /// This broker's id, told in the Hello's answer.
    pub me: u32,
    /// The node a certificate proved the caller to be.
    pub proven: Option<NodeId>,
}

impl Callee<'_> {
    /// Reads the Hello and judges it by `check`, answers it, then answers each request with `answer` in
    /// order, until the connection ends, fails a check, stays idle for [`IDLE_LIMIT`], or `stopping` ends.
    pub(super) async fn serve<S, C, W, WF, A, AF>(&self, mut stream: S, check: C, stopping: W, answer: A)
    where
        S: AsyncRead + AsyncWrite + Unpin,
        C: FnOnce(&CallsHello) -> Result<(), &'static str>,
        W: Fn() -> WF,
        WF: Future<Output = ()>,
        A: Fn(CallRequest) -> AF,
        AF: Future<Output = Vec<i16>>,
    {
        let peer = self.peer;
        let mut frames = PeerFrameReader::new(MAX_CALL_FRAME_BYTES);
        let mut buf = vec![0u8; 16 * 1024];
        let hello = match within(HELLO_WAIT, next_frame(&mut stream, &mut frames, &mut buf)).await {
            Some(Ok(Some(frame))) if frame.kind == kind::HELLO => {
                decode_message::<CallsHello>(&frame.body).map_err(|e| ReadError::Bad(e.to_string()))
            }
            Some(Ok(Some(frame))) => Err(ReadError::Bad(PeerFrameError::UnexpectedType(frame.kind).to_string())),
            Some(Ok(None)) => return,
            Some(Err(e)) => Err(e),
            None => Err(ReadError::Bad("no hello in time".into())),
        };
        let hello = match hello {
            Ok(hello) => hello,
            Err(e) => return closing(peer, None, &e),
        };
        if let Err(reason) = check(&hello) {
            if self.proven.is_some() {
                crate::metrics::peer_refused("peer-calls", "forbidden");
            }
            let (broker, cluster, proven) = (hello.broker, &hello.cluster_id, self.proven);
            return tracing::warn!(%peer, broker, %cluster, ?proven, "closing peer-calls connection: {reason}");
        }
        let caller = hello.broker;
        if frames.buffered() > 0 {
            return closing(peer, Some(caller), &ReadError::Bad("a request before the Hello was answered".into()));
        }
        let hello_answer = CallsHelloAnswer { broker: self.me };
        if let Err(e) = write_frame(&mut stream, kind::HELLO_ANSWER, &encode_message(&hello_answer)).await {
            return tracing::debug!(%peer, error = %e, "peer-calls connection lost");
        }
        tracing::debug!(%peer, broker = caller, "peer-calls connection from a broker");
        loop {
            let frame =
                future::or(async { within(IDLE_LIMIT, next_frame(&mut stream, &mut frames, &mut buf)).await }, async {
                    stopping().await;
                    Some(Ok(None))
                })
                .await;
            let request = match frame {
                None => return tracing::debug!(%peer, broker = caller, "closing an idle peer-calls connection"),
                Some(Ok(None)) => return,
                Some(Ok(Some(frame))) => decode_request(&frame).map_err(|e| ReadError::Bad(e.to_string())),
                Some(Err(e)) => Err(e),
            };
            let request = match request {
                Ok(request) => request,
                Err(e) => return closing(peer, Some(caller), &e),
            };
            let (correlation, answer_kind) = (request.correlation(), request.answer_kind());
            let errors = answer(request).await;
            let body = encode_message(&CallAnswer { correlation, errors });
            if let Err(e) = write_frame(&mut stream, answer_kind, &body).await {
                return tracing::debug!(%peer, error = %e, "peer-calls connection lost");
            }
        }
    }
}

/// Why a Hello is refused: another cluster's, not from a registered broker other than this one, or (under
/// cluster mTLS) speaking for another broker than the certificate names.
fn check_hello(ctx: &BrokerContext, hello: &CallsHello, proven: Option<NodeId>) -> Result<(), &'static str> {
    let caller = NodeId(hello.broker);
    if proven.is_some_and(|node| node != caller) {
        return Err("its Hello speaks for another broker than its certificate names");
    }
    let known = ctx.image().state.brokers.contains_key(&caller);
    if hello.cluster_id != ctx.cluster_id || !known || caller == NodeId(ctx.config.node_id) {
        return Err("not a broker of this cluster");
    }
    Ok(())
}

/// One request's error codes, in order, from this broker's own handlers.
async fn answer_request(ctx: &Arc<BrokerContext>, request: CallRequest) -> Vec<i16> {
    match request {
        CallRequest::WriteMarkers(WriteMarkers { markers, .. }) => {
            let writes: Vec<MarkerWrite> = markers
                .into_iter()
                .map(|m| MarkerWrite {
                    tp: TopicPartition::new(m.partition.topic, m.partition.partition),
                    producer_id: m.producer_id,
                    producer_epoch: m.producer_epoch,
                    coordinator_epoch: m.coordinator_epoch,
                    commit: m.commit,
                })
                .collect();
            let count = writes.len();
            let mut errors: Vec<i16> = write_markers_here(ctx, &writes).await.into_iter().map(code_of).collect();
            // The handler answers every marker; should it not, the rest are refused rather than left out.
            errors.resize(count, ResponseError::NotLeaderOrFollower.code());
            errors
        }
        CallRequest::VerifyTxn(VerifyTxn { transactional_id, producer_id, producer_epoch, partitions, .. }) => {
            let count = partitions.len();
            let partitions = partitions.into_iter().map(|p| TopicPartition::new(p.topic, p.partition)).collect();
            let producer = ProducerIdAndEpoch { producer_id, epoch: producer_epoch };
            let verdicts = verify_here(ctx, &transactional_id, producer, partitions).await;
            let mut errors: Vec<i16> = verdicts.into_iter().map(|v| code_of(v.err())).collect();
            errors.resize(count, ResponseError::CoordinatorNotAvailable.code());
            errors
        }
    }
}

fn code_of(error: Option<ResponseError>) -> i16 {
    error.map_or(0, |e| e.code())
}

async fn write_frame<S: AsyncWrite + Unpin>(stream: &mut S, kind: u16, body: &[u8]) -> std::io::Result<()> {
    stream.write_all(&encode_frame(kind, body)).await?;
    stream.flush().await
}

/// The one log line of a connection the callee closes: a warning for bytes that are not the protocol,
/// debug for a caller that went away.
fn closing(peer: &str, broker: Option<u32>, error: &ReadError) {
    match error {
        ReadError::Bad(_) => tracing::warn!(%peer, ?broker, %error, "closing peer-calls connection: bad frame"),
        ReadError::Lost(_) => tracing::debug!(%peer, ?broker, %error, "peer-calls connection lost"),
    }
}
