//! The leader side: a follower shard's connection arrives on whichever shard accepted it, which checks
//! the Hello, answers with this broker's shard count and hands the socket to the shard the Hello names;
//! that shard answers the connection's fetches from its own logs. Under cluster mTLS the accepting shard
//! reads nothing: it hands the socket to the shard the ClientHello names ([`handshake`]), which runs the
//! handshake and checks the Hello.

use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_lite::future;
use futures_lite::{AsyncRead, AsyncWrite, AsyncWriteExt};
use glommio::net::TcpStream;
use kafka_protocol::ResponseError;
use shardlog_net::peer::replication::{
    FetchPartition, FetchedPartition, NO_EPOCH, ReplicaFetch, ReplicaFetchResult, ReplicaHello, ReplicaHelloAnswer,
    fetch_result_frame_pieces, kind,
};
use shardlog_net::peer::{PeerFrameError, PeerFrameReader, decode_message, encode_frame, encode_message};
use shardlog_storage::fs::dma::DmaFs;
use shardlog_storage::{LeaderEpoch, LogDir, Offset, TopicPartition};

use super::{MAX_FRAME_BYTES, PEER_TIMEOUT, ReadError, handshake, next_frame, within};
use crate::context::{BrokerContext, PeerHandoff, PeerStart};
use crate::quorum::state::NodeId;
use crate::replication::{FetchPosition, FetchReply, ReplicaError};
use crate::shard::{ShardReplicas, replica_error};
use crate::shutdown::Shutdown;

/// How long a leader may hold a fetch with nothing new (the follower's ask is capped to this).
pub(super) const MAX_HOLD: Duration = Duration::from_millis(500);
/// Kafka's `replica.fetch.max.bytes` and `replica.fetch.response.max.bytes` defaults.
const PARTITION_MAX_BYTES: usize = 1 << 20;
pub(super) const RESPONSE_MAX_BYTES: usize = 10 << 20;

/// Takes a follower's connection on the shard that accepted it: checks its Hello, answers it, and hands
/// the connection to the shard it is for (or serves it here). Anything wrong closes it with one log line;
/// the follower connects again. `slot` is the connection's place in the connection limits. Under cluster
/// mTLS a plain peer frame is refused before it is read.
pub(in crate::runtime) async fn accept_peer(
    mut stream: TcpStream,
    ctx: Arc<BrokerContext>,
    peer: String,
    slot: Box<dyn Send>,
) {
    if ctx.cluster_tls.is_some() {
        crate::metrics::peer_refused("replication", "plaintext");
        return tracing::warn!(%peer, "refused a replication connection: plain TCP, and cluster mTLS is required");
    }
    let mut frames = PeerFrameReader::new(MAX_FRAME_BYTES);
    let mut buf = vec![0u8; 4096];
    let Some(hello) = read_hello(&mut stream, &mut frames, &mut buf, &peer).await else { return };
    if let Err(reason) = check_hello(&ctx, &hello) {
        return tracing::warn!(%peer, broker = hello.broker, cluster = %hello.cluster_id, "closing replication connection: {reason}");
    }
    if frames.buffered() > 0 {
        let e = ReadError::Bad("a fetch before the Hello was answered".into());
        return closing(&peer, Some(hello.broker), &e, "bad frame");
    }
    let answer = ReplicaHelloAnswer { shards: ctx.shards.len() as u16 };
    if let Err(e) = stream.write_all(&encode_frame(kind::HELLO_ANSWER, &encode_message(&answer))).await {
        return tracing::debug!(%peer, error = %e, "replication connection lost");
    }
    let to = hello.to_shard as usize;
    if to >= ctx.shards.len() {
        // The follower learns the shard count from the answer and connects again where it should.
        return tracing::debug!(%peer, to, "replication connection for a shard this broker does not have");
    }
    tracing::debug!(%peer, broker = hello.broker, from = hello.from_shard, to, "replication connection from a follower");
    let follower = NodeId(hello.broker);
    hand_off(&ctx, stream, to, peer, PeerStart::Answered { follower }, slot);
}

/// Takes a follower's connection under cluster mTLS, on the shard that accepted it, before anything is
/// read: hands it to the shard its ClientHello names (shard 0 for one this broker does not have, which
/// answers the Hello with the shard count and closes, as for plain connections).
pub(in crate::runtime) fn accept_peer_tls(
    stream: TcpStream,
    ctx: Arc<BrokerContext>,
    peer: String,
    slot: Box<dyn Send>,
    to: u16,
) {
    let to = if (to as usize) < ctx.shards.len() { to as usize } else { 0 };
    hand_off(&ctx, stream, to, peer, PeerStart::Tls, slot);
}

/// Moves the socket, as a descriptor, to shard `to` (this one, or another): a duplicate is handed over
/// and this task's copy closed.
fn hand_off(ctx: &BrokerContext, stream: TcpStream, to: usize, peer: String, start: PeerStart, slot: Box<dyn Send>) {
    // SAFETY: dup(2) of a descriptor this stream owns and keeps open until after the call.
    let dup = unsafe { libc::dup(stream.as_raw_fd()) };
    if dup < 0 {
        let error = std::io::Error::last_os_error();
        return tracing::warn!(%peer, %error, "cannot hand a replication connection to its shard");
    }
    drop(stream);
    // SAFETY: `dup` is a descriptor just returned by dup(2), owned by nothing else.
    let fd = unsafe { OwnedFd::from_raw_fd(dup) };
    let _ = ctx.peer_handoffs[to].0.send(PeerHandoff { fd, peer, start, slot });
}

/// The first frame of a connection, which must be a Hello; anything else is logged and `None`.
async fn read_hello<S: AsyncRead + Unpin>(
    stream: &mut S,
    frames: &mut PeerFrameReader,
    buf: &mut [u8],
    peer: &str,
) -> Option<ReplicaHello> {
    let hello = match within(PEER_TIMEOUT, next_frame(stream, frames, buf)).await {
        Some(Ok(Some(frame))) if frame.kind == kind::HELLO => {
            decode_message::<ReplicaHello>(&frame.body).map_err(|e| ReadError::Bad(e.to_string()))
        }
        Some(Ok(Some(frame))) => Err(ReadError::Bad(PeerFrameError::UnexpectedType(frame.kind).to_string())),
        Some(Ok(None)) => return None,
        Some(Err(e)) => Err(e),
        None => Err(ReadError::Bad("no hello in time".into())),
    };
    hello.map_err(|e| closing(peer, None, &e, "bad first frame")).ok()
}

/// Why a Hello is refused: another cluster's, or not from a registered broker other than this one.
fn check_hello(ctx: &BrokerContext, hello: &ReplicaHello) -> Result<(), &'static str> {
    let follower = NodeId(hello.broker);
    let known = ctx.image().state.brokers.contains_key(&follower);
    if hello.cluster_id != ctx.cluster_id || !known || follower == NodeId(ctx.config.node_id) {
        return Err("not a broker of this cluster");
    }
    Ok(())
}

/// Serves a follower's connection on the shard that owns its partitions (`shard`) until it ends, fails a
/// check, or the broker stops. Under cluster mTLS, the handshake and the Hello first.
pub(super) async fn serve_fetches(
    handoff: PeerHandoff,
    ctx: Arc<BrokerContext>,
    shard: usize,
    logs: Rc<LogDir<DmaFs>>,
    replicas: Rc<ShardReplicas>,
    shutdown: Shutdown,
) {
    let PeerHandoff { fd, peer, start, slot: _slot } = handoff;
    // SAFETY: the hand-off owned the descriptor; the stream takes it over.
    let stream = unsafe { TcpStream::from_raw_fd(fd.into_raw_fd()) };
    match start {
        PeerStart::Answered { follower } => serve_stream(stream, &peer, follower, &logs, &replicas, &shutdown).await,
        PeerStart::Tls => {
            let Some((stream, follower)) = accept_tls_follower(&ctx, shard, stream, &peer).await else { return };
            serve_stream(stream, &peer, follower, &logs, &replicas, &shutdown).await
        }
    }
}

/// A follower's connection under cluster mTLS, on the shard its ClientHello named: the handshake, then
/// its Hello, which must speak for the node its certificate names and be for this shard. Answered, the
/// connection is ready for fetches; anything wrong closes it with one log line.
async fn accept_tls_follower(
    ctx: &BrokerContext,
    shard: usize,
    stream: TcpStream,
    peer: &str,
) -> Option<(futures_rustls::server::TlsStream<TcpStream>, NodeId)> {
    let tls = ctx.cluster_tls.as_deref()?;
    let (mut stream, node) = handshake::accept(tls, stream, peer, "replication").await?;
    let mut frames = PeerFrameReader::new(MAX_FRAME_BYTES);
    let mut buf = vec![0u8; 4096];
    let hello = read_hello(&mut stream, &mut frames, &mut buf, peer).await?;
    if hello.broker != node.0 {
        crate::metrics::peer_refused("replication", "forbidden");
        let broker = hello.broker;
        tracing::warn!(%peer, node = node.0, broker, "refused a replication connection: its Hello speaks for another broker than its certificate names");
        return None;
    }
    if let Err(reason) = check_hello(ctx, &hello) {
        crate::metrics::peer_refused("replication", "forbidden");
        tracing::warn!(%peer, node = node.0, cluster = %hello.cluster_id, "refused a replication connection: {reason}");
        return None;
    }
    if frames.buffered() > 0 {
        let e = ReadError::Bad("a fetch before the Hello was answered".into());
        closing(peer, Some(hello.broker), &e, "bad frame");
        return None;
    }
    let answer =
        encode_frame(kind::HELLO_ANSWER, &encode_message(&ReplicaHelloAnswer { shards: ctx.shards.len() as u16 }));
    let answered = async {
        stream.write_all(&answer).await?;
        stream.flush().await
    };
    if let Err(e) = answered.await {
        tracing::debug!(%peer, error = %e, "replication connection lost");
        return None;
    }
    if hello.to_shard as usize != shard {
        // Its ClientHello named a shard this broker does not have (or not this one): the follower learns
        // the shard count from the answer and connects again where it should.
        tracing::debug!(%peer, to = hello.to_shard, "replication connection for another shard");
        return None;
    }
    tracing::debug!(%peer, broker = hello.broker, from = hello.from_shard, to = shard, "replication connection from a follower, over mTLS");
    Some((stream, node))
}

/// Answers a follower's fetches on `stream` (plain or TLS) until it ends, fails a check, or the broker
/// stops.
async fn serve_stream<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    peer: &str,
    follower: NodeId,
    logs: &LogDir<DmaFs>,
    replicas: &ShardReplicas,
    shutdown: &Shutdown,
) {
    let peer = peer.to_string();
    let mut frames = PeerFrameReader::new(MAX_FRAME_BYTES);
    let mut buf = vec![0u8; 64 * 1024];
    let mut served = Served { peer: &peer, broker: follower.0, answers: 0, bytes: 0 };
    loop {
        let frame = future::or(async { Some(next_frame(&mut stream, &mut frames, &mut buf).await) }, async {
            shutdown.wait().await;
            None
        })
        .await;
        let fetch = match frame {
            None | Some(Ok(None)) => return,
            Some(Ok(Some(frame))) if frame.kind == kind::FETCH => {
                decode_message::<ReplicaFetch>(&frame.body).map_err(|e| ReadError::Bad(e.to_string()))
            }
            Some(Ok(Some(frame))) => Err(ReadError::Bad(PeerFrameError::UnexpectedType(frame.kind).to_string())),
            Some(Err(e)) => Err(e),
        };
        let fetch = match fetch {
            Ok(fetch) => fetch,
            Err(e) => return closing(&peer, Some(follower.0), &e, "bad frame"),
        };
        // A stopping broker drops its followers' connections rather than read logs that are closing.
        let answered =
            future::or(async { Some(answer_fetch(logs, replicas, follower, fetch, shutdown).await) }, async {
                shutdown.wait().await;
                None
            });
        let Some(pieces) = answered.await else { return };
        // Written piece by piece: the record sets go from where the log read put them.
        for piece in &pieces {
            if let Err(e) = stream.write_all(piece).await {
                tracing::debug!(%peer, error = %e, "replication connection lost");
                return;
            }
        }
        // A TLS stream holds the last piece's records until flushed.
        if let Err(e) = stream.flush().await {
            tracing::debug!(%peer, error = %e, "replication connection lost");
            return;
        }
        let bytes = pieces.iter().map(|p| p.len()).sum::<usize>();
        served.answers += 1;
        served.bytes += bytes as u64;
        tracing::trace!(%peer, bytes, "answered a fetch");
    }
}

/// The one log line of a replication connection the leader closes: a warning for bytes that are not
/// the protocol (an operator should know who sends them), debug for a peer that went away.
fn closing(peer: &str, broker: Option<u32>, error: &ReadError, what: &str) {
    match error {
        ReadError::Bad(_) => tracing::warn!(%peer, ?broker, %error, "closing replication connection: {what}"),
        ReadError::Lost(_) => tracing::debug!(%peer, ?broker, %error, "replication connection lost"),
    }
}

/// What a leader sent over one replication connection, logged when it ends.
struct Served<'a> {
    peer: &'a str,
    broker: u32,
    answers: u64,
    bytes: u64,
}

impl Drop for Served<'_> {
    fn drop(&mut self) {
        if let Some(per_answer) = self.bytes.checked_div(self.answers) {
            let (peer, broker, answers, bytes) = (self.peer, self.broker, self.answers, self.bytes);
            tracing::info!(%peer, broker, answers, bytes, per_answer, "replication connection ended");
        }
    }
}

/// One partition's part of an answer.
struct Answered {
    reply: FetchReply,
    records: bytes::Bytes,
    high_watermark: Offset,
    log_start: Offset,
}

/// One fetch's answer: at once if a partition has news for the follower, else when one gets some or the
/// hold ends. Every partition is this shard's: one that is not (or not hosted, or of another topic id)
/// is answered NOT_LEADER_OR_FOLLOWER.
async fn answer_fetch(
    logs: &LogDir<DmaFs>,
    replicas: &ShardReplicas,
    follower: NodeId,
    fetch: ReplicaFetch,
    shutdown: &Shutdown,
) -> Vec<bytes::Bytes> {
    let hold = Duration::from_millis(fetch.max_wait_ms as u64).min(MAX_HOLD);
    let deadline = Instant::now() + hold;
    let limit = (fetch.max_bytes as usize).min(RESPONSE_MAX_BYTES);
    let per_partition = (limit / fetch.partitions.len().max(1)).clamp(64 * 1024, PARTITION_MAX_BYTES);
    loop {
        // Listening before looking: news that lands in between still wakes this fetch.
        let news = replicas.progress().listen();
        let mut answers = Vec::with_capacity(fetch.partitions.len());
        for p in &fetch.partitions {
            answers.push(answer_partition(logs, replicas, follower, p, per_partition).await);
        }
        let has_news = answers.iter().zip(&fetch.partitions).any(|(a, p)| {
            !a.records.is_empty()
                || !matches!(a.reply, FetchReply::Records { .. })
                || a.high_watermark.0 != p.high_watermark
        });
        let now = Instant::now();
        if has_news || now >= deadline || shutdown.is_triggered() {
            return fetch_result(fetch.correlation, &fetch.partitions, &answers);
        }
        future::or(news, glommio::timer::sleep(deadline - now)).await;
    }
}

async fn answer_partition(
    logs: &LogDir<DmaFs>,
    replicas: &ShardReplicas,
    follower: NodeId,
    p: &FetchPartition,
    max_bytes: usize,
) -> Answered {
    let tp = TopicPartition::new(p.topic.clone(), p.partition);
    let refused = Answered {
        reply: FetchReply::Refused(ReplicaError::NotLeaderOrFollower),
        records: bytes::Bytes::new(),
        high_watermark: Offset::ZERO,
        log_start: Offset::ZERO,
    };
    let Some(log) = logs.get(&tp) else { return refused };
    if replicas.topic_id(&tp) != Some(uuid::Uuid::from_bytes(p.topic_id)) {
        return refused;
    }
    let position = FetchPosition {
        replica: follower,
        leader_epoch: LeaderEpoch(p.leader_epoch),
        offset: Offset(p.offset),
        last_epoch: (p.last_epoch != NO_EPOCH).then_some(LeaderEpoch(p.last_epoch)),
        stable_end: Offset(p.stable_end),
    };
    let (reply, records) = replicas.serve_fetch(&tp, &position, max_bytes, &log).await;
    Answered { reply, records, high_watermark: replicas.high_watermark(&tp, &log), log_start: log.log_start_offset() }
}

/// The answer's frame, as pieces to write in order.
fn fetch_result(correlation: u64, asked: &[FetchPartition], answers: &[Answered]) -> Vec<bytes::Bytes> {
    let partitions = asked
        .iter()
        .zip(answers)
        .map(|(p, a)| {
            let (error, diverging_epoch, diverging_end) = match a.reply {
                FetchReply::Records { .. } => (0, NO_EPOCH, 0),
                FetchReply::Diverging { epoch, end_offset } => (0, epoch.0, end_offset.0),
                FetchReply::OutOfRange { .. } => (ResponseError::OffsetOutOfRange.code(), NO_EPOCH, 0),
                FetchReply::Refused(e) => (replica_error(e).code(), NO_EPOCH, 0),
            };
            let log_start = match a.reply {
                FetchReply::OutOfRange { log_start } => log_start.0,
                _ => a.log_start.0,
            };
            FetchedPartition {
                topic: p.topic.clone(),
                partition: p.partition,
                error,
                high_watermark: a.high_watermark.0,
                log_start,
                diverging_epoch,
                diverging_end,
                records_len: a.records.len() as u32,
            }
        })
        .collect();
    let records: Vec<bytes::Bytes> = answers.iter().map(|a| a.records.clone()).collect();
    fetch_result_frame_pieces(&ReplicaFetchResult { correlation, partitions }, &records)
}
