//! Replication between brokers over the peer protocol (`docs/peer-protocol.md` §2.2).
//!
//! - Leader side: a follower's connection arrives on the Kafka listener, told apart by the peer frame's
//!   magic in its first bytes, and is served by [`serve_peer`]: each fetch goes to the shards owning its
//!   partitions, and is held (up to its wait) until one of them has records or a new high watermark.
//! - Follower side: every shard runs [`replicate`], which keeps one fetcher per leader broker its
//!   partitions follow, appends what the leader sends through the shard's replicas, and fdatasyncs before
//!   it asks again, so the stable offset it reports is on disk. The same task proposes its leaders' ISR
//!   changes to the quorum.

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_lite::future;
use futures_lite::{AsyncReadExt, AsyncWriteExt};
use glommio::net::TcpStream;
use kafka_protocol::ResponseError;
use shardlog_net::peer::replication::{
    FetchPartition, FetchedPartition, NO_EPOCH, ReplicaFetch, ReplicaFetchResult, ReplicaHello, decode_fetch_result,
    encode_fetch_result, kind,
};
use shardlog_net::peer::{
    MAGIC, PeerFrame, PeerFrameError, PeerFrameReader, decode_message, encode_frame, encode_message,
};
use shardlog_storage::fs::dma::DmaFs;
use shardlog_storage::{FlushPolicy, LeaderEpoch, LogDir, Offset, TopicPartition};

use crate::context::BrokerContext;
use crate::quorum::state::{Command, CommandError, NodeId};
use crate::quorum::wire::WireWriteResult;
use crate::replication::{FetchPosition, FetchReply, ProposalOutcome, ReplicaError};
use crate::shard::{PartitionRequest, ReplicaAnswer, ShardReplicas, replica_error};
use crate::shutdown::Shutdown;

/// The largest peer frame either side reads.
const MAX_FRAME_BYTES: u32 = 64 << 20;
/// How long a leader may hold a fetch with nothing new (the follower's ask is capped to this).
const MAX_HOLD: Duration = Duration::from_millis(500);
/// Kafka's `replica.fetch.max.bytes` and `replica.fetch.response.max.bytes` defaults.
const PARTITION_MAX_BYTES: usize = 1 << 20;
const RESPONSE_MAX_BYTES: usize = 10 << 20;
/// How long a Hello, or a fetch's answer beyond its hold, may take before the connection is dropped.
const PEER_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a shard looks for partitions to follow and ISR changes to propose.
const TICK: Duration = Duration::from_millis(100);
/// A fetcher's pause before it reconnects.
const RECONNECT_PAUSE: Duration = Duration::from_millis(300);
/// How long an ISR proposal waits for the quorum before its outcome counts as unknown.
const QUORUM_WAIT: Duration = Duration::from_secs(5);

/// Whether the first bytes of a connection are a peer frame's (a Kafka request starts with its size, whose
/// first byte is 0 for any request the broker accepts).
pub(super) fn is_peer(first: &[u8]) -> bool {
    let magic = MAGIC.to_be_bytes();
    !first.is_empty() && first.iter().zip(magic.iter()).all(|(a, b)| a == b)
}

/// Why a peer connection stopped yielding frames.
#[derive(Debug)]
enum ReadError {
    /// The connection failed (reset, timed out): the peer went away; nothing to tell an operator.
    Lost(std::io::Error),
    /// The bytes are not a peer frame, a frame's CRC does not check, or the stream ended inside a frame.
    Bad(String),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Lost(e) => write!(f, "connection lost: {e}"),
            ReadError::Bad(e) => f.write_str(e),
        }
    }
}

/// Reads the next frame, `Ok(None)` at end of stream.
async fn next_frame(
    stream: &mut TcpStream,
    frames: &mut PeerFrameReader,
    buf: &mut [u8],
) -> Result<Option<PeerFrame>, ReadError> {
    loop {
        if let Some(frame) = frames.next_frame().map_err(|e| ReadError::Bad(e.to_string()))? {
            return Ok(Some(frame));
        }
        let n = stream.read(buf).await.map_err(ReadError::Lost)?;
        if n == 0 && frames.buffered() > 0 {
            let got = frames.buffered();
            return Err(ReadError::Bad(format!("connection closed inside a frame ({got} bytes of it came)")));
        }
        if n == 0 {
            return Ok(None);
        }
        frames.extend(&buf[..n]);
    }
}

async fn within<T>(limit: Duration, work: impl Future<Output = T>) -> Option<T> {
    future::or(async { Some(work.await) }, async {
        glommio::timer::sleep(limit).await;
        None
    })
    .await
}

/// Serves a follower broker's replication connection until it ends, fails a check, or the broker stops.
/// Anything wrong closes the connection with one log line; the follower connects again.
pub(super) async fn serve_peer(mut stream: TcpStream, ctx: Arc<BrokerContext>, shutdown: Shutdown, peer: String) {
    let mut frames = PeerFrameReader::new(MAX_FRAME_BYTES);
    let mut buf = vec![0u8; 64 * 1024];
    let hello = match within(PEER_TIMEOUT, next_frame(&mut stream, &mut frames, &mut buf)).await {
        Some(Ok(Some(frame))) if frame.kind == kind::HELLO => {
            decode_message::<ReplicaHello>(&frame.body).map_err(|e| ReadError::Bad(e.to_string()))
        }
        Some(Ok(Some(frame))) => Err(ReadError::Bad(PeerFrameError::UnexpectedType(frame.kind).to_string())),
        Some(Ok(None)) => return,
        Some(Err(e)) => Err(e),
        None => Err(ReadError::Bad("no hello in time".into())),
    };
    let hello = match hello {
        Ok(hello) => hello,
        Err(e) => return closing(&peer, None, &e, "bad first frame"),
    };
    let follower = NodeId(hello.broker);
    let known = ctx.image().state.brokers.contains_key(&follower);
    if hello.cluster_id != ctx.cluster_id || !known || follower == NodeId(ctx.config.node_id) {
        tracing::warn!(%peer, broker = hello.broker, cluster = %hello.cluster_id, "closing replication connection: not a broker of this cluster");
        return;
    }
    tracing::debug!(%peer, broker = hello.broker, "replication connection from a follower");
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
            Err(e) => return closing(&peer, Some(hello.broker), &e, "bad frame"),
        };
        let body = answer_fetch(&ctx, follower, fetch, &shutdown).await;
        if let Err(e) = stream.write_all(&encode_frame(kind::FETCH_RESULT, &body)).await {
            tracing::debug!(%peer, error = %e, "replication connection lost");
            return;
        }
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

/// One fetch's answer: at once if a partition has news for the follower, else when one gets some or the
/// hold ends.
async fn answer_fetch(ctx: &Arc<BrokerContext>, follower: NodeId, fetch: ReplicaFetch, shutdown: &Shutdown) -> Vec<u8> {
    let hold = Duration::from_millis(fetch.max_wait_ms as u64).min(MAX_HOLD);
    let deadline = Instant::now() + hold;
    let limit = (fetch.max_bytes as usize).min(RESPONSE_MAX_BYTES);
    let per_partition = (limit / fetch.partitions.len().max(1)).clamp(64 * 1024, PARTITION_MAX_BYTES);
    loop {
        // Listening before looking: news that lands in between still wakes this fetch.
        let news = ctx.replica_progress.listen();
        let mut pending = Vec::with_capacity(fetch.partitions.len());
        for p in &fetch.partitions {
            let tp = TopicPartition::new(p.topic.clone(), p.partition);
            let position = FetchPosition {
                replica: follower,
                leader_epoch: LeaderEpoch(p.leader_epoch),
                offset: Offset(p.offset),
                last_epoch: (p.last_epoch != NO_EPOCH).then_some(LeaderEpoch(p.last_epoch)),
                stable_end: Offset(p.stable_end),
            };
            let (reply, answer) = flume::bounded(1);
            let request = PartitionRequest::ReplicaFetch {
                tp: tp.clone(),
                topic_id: uuid::Uuid::from_bytes(p.topic_id),
                position,
                max_bytes: per_partition,
                reply,
            };
            let sent = ctx.shards[ctx.shard_of(&tp)].send_async(request).await.is_ok();
            pending.push(sent.then_some(answer));
        }
        let mut answers = Vec::with_capacity(pending.len());
        for answer in pending {
            let answer = match answer {
                Some(rx) => rx.recv_async().await.ok(),
                None => None,
            };
            answers.push(answer.unwrap_or(ReplicaAnswer {
                reply: FetchReply::Refused(ReplicaError::NotLeaderOrFollower),
                records: bytes::Bytes::new(),
                high_watermark: Offset::ZERO,
                log_start: Offset::ZERO,
            }));
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

fn fetch_result(correlation: u64, asked: &[FetchPartition], answers: &[ReplicaAnswer]) -> Vec<u8> {
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
    let records: Vec<&[u8]> = answers.iter().map(|a| a.records.as_ref()).collect();
    encode_fetch_result(&ReplicaFetchResult { correlation, partitions }, &records)
}

/// The state machine's view of one partition of a leader's answer.
fn reply_of(p: &FetchedPartition) -> FetchReply {
    if p.error == ResponseError::OffsetOutOfRange.code() {
        return FetchReply::OutOfRange { log_start: Offset(p.log_start) };
    }
    if p.error != 0 {
        let error = match ResponseError::try_from_code(p.error) {
            Some(ResponseError::FencedLeaderEpoch) => ReplicaError::FencedLeaderEpoch,
            Some(ResponseError::UnknownLeaderEpoch) => ReplicaError::UnknownLeaderEpoch,
            _ => ReplicaError::NotLeaderOrFollower,
        };
        return FetchReply::Refused(error);
    }
    if p.diverging_epoch != NO_EPOCH {
        return FetchReply::Diverging { epoch: LeaderEpoch(p.diverging_epoch), end_offset: Offset(p.diverging_end) };
    }
    FetchReply::Records { from: Offset::ZERO, high_watermark: Offset(p.high_watermark) }
}

/// A shard's replication work: a fetcher per leader its partitions follow, and its leaders' ISR changes.
pub(super) async fn replicate(
    ctx: Arc<BrokerContext>,
    shard: usize,
    logs: Rc<LogDir<DmaFs>>,
    replicas: Rc<ShardReplicas>,
    shutdown: Shutdown,
) {
    // The leaders a fetcher runs for; each fetcher clears its flag when it ends.
    let mut fetchers: HashMap<NodeId, Rc<Cell<bool>>> = HashMap::new();
    while !shutdown.is_triggered() {
        let leaders: std::collections::BTreeSet<NodeId> = replicas.followed().into_iter().map(|(_, l)| l).collect();
        fetchers.retain(|_, running| running.get());
        for leader in leaders {
            if let std::collections::hash_map::Entry::Vacant(slot) = fetchers.entry(leader) {
                let running = Rc::new(Cell::new(true));
                let fetcher = fetch_from(ctx.clone(), shard, leader, logs.clone(), replicas.clone(), shutdown.clone());
                let flag = running.clone();
                glommio::spawn_local(async move {
                    fetcher.await;
                    flag.set(false);
                })
                .detach();
                slot.insert(running);
            }
        }
        for (tp, proposal) in replicas.poll_isr_changes() {
            let (ctx, logs, replicas) = (ctx.clone(), logs.clone(), replicas.clone());
            glommio::spawn_local(async move {
                let command = Command::AlterPartition {
                    topic: tp.topic.clone(),
                    partition: tp.partition,
                    leader: NodeId(ctx.config.node_id),
                    leader_epoch: proposal.leader_epoch,
                    partition_epoch: proposal.partition_epoch,
                    isr: proposal.isr.clone(),
                };
                tracing::debug!(partition = %tp, isr = ?proposal.isr, "proposing an ISR change");
                let outcome = match within(QUORUM_WAIT, ctx.quorum.write(command)).await {
                    Some(WireWriteResult::Applied { outcome: Ok(_), .. }) => ProposalOutcome::Applied,
                    Some(WireWriteResult::Applied {
                        outcome: Err(CommandError::FencedLeaderEpoch { .. } | CommandError::InvalidUpdateVersion { .. }),
                        ..
                    }) => ProposalOutcome::Stale,
                    Some(WireWriteResult::Applied { outcome: Err(e), .. }) => {
                        tracing::debug!(partition = %tp, error = %e, "ISR change refused");
                        ProposalOutcome::Refused
                    }
                    _ => ProposalOutcome::Unknown,
                };
                if let Some(log) = logs.get(&tp) {
                    replicas.isr_change_answered(&tp, &proposal, outcome, &log);
                }
            })
            .detach();
        }
        glommio::timer::sleep(TICK).await;
    }
}

/// Fetches, from one leader broker, every partition this shard follows there, over one connection at a
/// time; ends when the shard follows nothing there any more.
async fn fetch_from(
    ctx: Arc<BrokerContext>,
    shard: usize,
    leader: NodeId,
    logs: Rc<LogDir<DmaFs>>,
    replicas: Rc<ShardReplicas>,
    shutdown: Shutdown,
) {
    let mut announced_failure = false;
    while !shutdown.is_triggered() {
        if !replicas.followed().iter().any(|(_, l)| *l == leader) {
            return;
        }
        let endpoint = ctx.image().state.brokers.get(&leader).map(|b| b.endpoint.clone());
        let Some(endpoint) = endpoint else {
            glommio::timer::sleep(RECONNECT_PAUSE).await;
            continue;
        };
        let address = format!("{}:{}", endpoint.host, endpoint.port);
        let outcome = match within(PEER_TIMEOUT, TcpStream::connect(address.as_str())).await {
            Some(Ok(stream)) => fetch_over(stream, &ctx, shard, leader, &logs, &replicas, &shutdown).await,
            Some(Err(e)) => Err(e.to_string()),
            None => Err("connect timed out".into()),
        };
        if let Err(e) = outcome {
            // A leader that is down is expected while the quorum moves its partitions: said once, at debug.
            if !announced_failure {
                tracing::debug!(?leader, %address, error = %e, "replication connection ended; reconnecting");
            }
            announced_failure = true;
        } else {
            announced_failure = false;
        }
        glommio::timer::sleep(RECONNECT_PAUSE).await;
    }
}

async fn fetch_over(
    mut stream: TcpStream,
    ctx: &Arc<BrokerContext>,
    shard: usize,
    leader: NodeId,
    logs: &LogDir<DmaFs>,
    replicas: &ShardReplicas,
    shutdown: &Shutdown,
) -> Result<(), String> {
    let _ = stream.set_nodelay(true);
    let hello =
        ReplicaHello { cluster_id: ctx.cluster_id.clone(), broker: ctx.config.node_id, from_shard: shard as u16 };
    stream.write_all(&encode_frame(kind::HELLO, &encode_message(&hello))).await.map_err(|e| e.to_string())?;
    let mut frames = PeerFrameReader::new(MAX_FRAME_BYTES);
    let mut buf = vec![0u8; 256 * 1024];
    let mut correlation = 0u64;
    while !shutdown.is_triggered() {
        let mut asked = Vec::new();
        let mut partitions = Vec::new();
        for (tp, l) in replicas.followed() {
            let (Some(log), Some(topic_id)) = (logs.get(&tp), replicas.topic_id(&tp)) else { continue };
            let Some((to, position)) = replicas.fetch_position(&tp, &log) else { continue };
            if l != leader || to != leader {
                continue;
            }
            partitions.push(FetchPartition {
                topic: tp.topic.clone(),
                topic_id: *topic_id.as_bytes(),
                partition: tp.partition,
                leader_epoch: position.leader_epoch.0,
                offset: position.offset.0,
                last_epoch: position.last_epoch.map_or(NO_EPOCH, |e| e.0),
                stable_end: position.stable_end.0,
                high_watermark: replicas.high_watermark(&tp, &log).0,
            });
            asked.push((tp, position));
        }
        if asked.is_empty() {
            return Ok(());
        }
        correlation += 1;
        let fetch = ReplicaFetch {
            correlation,
            max_wait_ms: MAX_HOLD.as_millis() as u32,
            max_bytes: RESPONSE_MAX_BYTES as u32,
            partitions,
        };
        stream.write_all(&encode_frame(kind::FETCH, &encode_message(&fetch))).await.map_err(|e| e.to_string())?;
        let frame = match within(MAX_HOLD + PEER_TIMEOUT, next_frame(&mut stream, &mut frames, &mut buf)).await {
            Some(Ok(Some(frame))) if frame.kind == kind::FETCH_RESULT => frame,
            Some(Ok(Some(frame))) => return Err(format!("unexpected frame type {}", frame.kind)),
            Some(Ok(None)) => return Err("closed by the leader".into()),
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err("no answer in time".into()),
        };
        let (result, records) = decode_fetch_result(&frame.body).map_err(|e| e.to_string())?;
        if result.correlation != correlation || result.partitions.len() != asked.len() {
            return Err("an answer to another fetch".into());
        }
        let mut appended = Vec::new();
        let mut leader_starts = Vec::new();
        for (((tp, position), fetched), bytes) in asked.iter().zip(&result.partitions).zip(records) {
            let Some(log) = logs.get(tp) else { continue };
            let mut reply = reply_of(fetched);
            if let FetchReply::Records { from, .. } = &mut reply {
                *from = position.offset;
                leader_starts.push((tp, Offset(fetched.log_start)));
            }
            match replicas.apply_answer(tp, position, &reply, bytes, &log).await {
                Ok(_) if !bytes.is_empty() => appended.push(log),
                Ok(_) => {}
                Err(e) => {
                    // A damaged copy: nothing of it was appended. The connection is dropped so the next one
                    // starts clean.
                    tracing::warn!(partition = %tp, ?leader, error = %e, "refused records from the leader");
                    return Err(e.to_string());
                }
            }
        }
        // Group commit: what this answer brought is on disk before the next fetch reports it.
        for log in appended {
            if matches!(log.config().flush, FlushPolicy::Always)
                && let Err(e) = log.flush().await
            {
                tracing::warn!(log = %log.dir().display(), error = %e, "flush of replicated records failed");
            }
        }
        // The leader's log start moved (DeleteRecords, retention): the follower's follows, up to its own HW,
        // so that a replica elected later does not serve records the leader had deleted.
        for (tp, leader_start) in leader_starts {
            let Some(log) = logs.get(tp) else { continue };
            let start = leader_start.min(log.high_watermark());
            if start > log.log_start_offset()
                && let Err(e) = logs.delete_records(tp, start).await
            {
                tracing::warn!(partition = %tp, error = %e, "moving the log start to the leader's failed");
            }
        }
    }
    Ok(())
}
