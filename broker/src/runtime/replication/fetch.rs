//! The follower side: each shard keeps one connection per leader shard it follows partitions of,
//! appends what the leader sends, and fdatasyncs before it asks again, so the stable offset it reports is
//! on disk.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;

use futures_lite::{AsyncRead, AsyncWrite, AsyncWriteExt};
use glommio::net::TcpStream;
use kafka_protocol::ResponseError;
use shardlog_net::peer::replication::{
    FetchPartition, FetchedPartition, NO_EPOCH, ReplicaFetch, ReplicaHello, ReplicaHelloAnswer, decode_fetch_result,
    kind, peer_alpn,
};
use shardlog_net::peer::{PeerFrameReader, decode_message, encode_frame, encode_message};
use shardlog_storage::fs::dma::DmaFs;
use shardlog_storage::{FlushPolicy, LeaderEpoch, LogDir, Offset, TopicPartition};

use super::serve::{MAX_HOLD, RESPONSE_MAX_BYTES};
use super::{MAX_FRAME_BYTES, PEER_TIMEOUT, RECONNECT_PAUSE, handshake, next_frame, next_unchecked_frame, within};
use crate::context::BrokerContext;
use crate::quorum::state::NodeId;
use crate::replication::{FetchReply, ReplicaError};
use crate::security::cluster_tls::ClusterTls;
use crate::shard::ShardReplicas;
use crate::shutdown::Shutdown;

/// Each leader broker's shard count, as its Hello answers said.
pub(super) type ShardCounts = Rc<RefCell<HashMap<NodeId, u16>>>;

/// The shard of `leader` that owns `tp`; shard 0 while its shard count is not known (the first connection
/// learns it).
pub(super) fn leader_shard(counts: &ShardCounts, leader: NodeId, tp: &TopicPartition) -> u16 {
    counts.borrow().get(&leader).map_or(0, |&n| crate::topics::assign_shard(&tp.topic, tp.partition, n as usize) as u16)
}

/// The partitions this shard follows on shard `leader_shard` of broker `leader`.
fn followed_on(replicas: &ShardReplicas, counts: &ShardCounts, leader: NodeId, on: u16) -> Vec<TopicPartition> {
    let followed = replicas.followed().into_iter();
    followed.filter(|(tp, l)| *l == leader && leader_shard(counts, *l, tp) == on).map(|(tp, _)| tp).collect()
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

/// Fetches, from one shard of a leader broker, every partition this shard follows there, over one
/// connection at a time; ends when the shard follows nothing there any more.
#[allow(clippy::too_many_arguments)]
pub(super) async fn fetch_from(
    ctx: Arc<BrokerContext>,
    shard: usize,
    leader: NodeId,
    leader_shard: u16,
    logs: Rc<LogDir<DmaFs>>,
    replicas: Rc<ShardReplicas>,
    counts: ShardCounts,
    shutdown: Shutdown,
) {
    let mut announced_failure = false;
    while !shutdown.is_triggered() {
        if followed_on(&replicas, &counts, leader, leader_shard).is_empty() {
            return;
        }
        let endpoint = ctx.image().state.brokers.get(&leader).map(|b| b.endpoint.clone());
        let Some(endpoint) = endpoint else {
            glommio::timer::sleep(RECONNECT_PAUSE).await;
            continue;
        };
        let address = format!("{}:{}", endpoint.host, endpoint.port);
        let at = Fetcher { ctx: &ctx, shard, leader, leader_shard, logs: &logs, replicas: &replicas, counts: &counts };
        let outcome = match within(PEER_TIMEOUT, TcpStream::connect(address.as_str())).await {
            Some(Ok(stream)) => {
                let _ = stream.set_nodelay(true);
                match ctx.cluster_tls.as_deref() {
                    None => fetch_over(stream, at, &shutdown).await,
                    Some(tls) => {
                        match within(PEER_TIMEOUT, handshake::connect(tls, stream, leader, peer_alpn(leader_shard)))
                            .await
                        {
                            Some(Ok(stream)) => fetch_over(stream, at, &shutdown).await,
                            Some(Err(e)) if ClusterTls::is_refusal(&e) => {
                                // The leader's certificate is not the leader's, or it refused ours: an
                                // operator must know (once for each run of failures).
                                if !announced_failure {
                                    tracing::warn!(?leader, %address, error = %e, "replication: TLS handshake with the leader refused");
                                }
                                Err(format!("TLS handshake: {e}"))
                            }
                            Some(Err(e)) => Err(format!("TLS handshake: {e}")),
                            None => Err("TLS handshake timed out".into()),
                        }
                    }
                }
            }
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

/// Where a fetcher fetches from, and what it fetches into.
#[derive(Clone, Copy)]
struct Fetcher<'a> {
    ctx: &'a Arc<BrokerContext>,
    shard: usize,
    leader: NodeId,
    leader_shard: u16,
    logs: &'a LogDir<DmaFs>,
    replicas: &'a ShardReplicas,
    counts: &'a ShardCounts,
}

/// Fetches over one connection, plain or TLS.
async fn fetch_over<S: AsyncRead + AsyncWrite + Unpin>(
    mut stream: S,
    at: Fetcher<'_>,
    shutdown: &Shutdown,
) -> Result<(), String> {
    let Fetcher { ctx, shard, leader, leader_shard, logs, replicas, counts } = at;
    let hello = ReplicaHello {
        cluster_id: ctx.cluster_id.clone(),
        broker: ctx.config.node_id,
        from_shard: shard as u16,
        to_shard: leader_shard,
    };
    stream.write_all(&encode_frame(kind::HELLO, &encode_message(&hello))).await.map_err(|e| e.to_string())?;
    stream.flush().await.map_err(|e| e.to_string())?;
    // The leader's answers are received into buffers of their own, so their record bytes are not copied
    // out of a shared read buffer on their way to the log.
    let mut frames = PeerFrameReader::with_frame_buffers(MAX_FRAME_BYTES);
    let mut buf = vec![0u8; 256 * 1024];
    let answer = match within(PEER_TIMEOUT, next_frame(&mut stream, &mut frames, &mut buf)).await {
        Some(Ok(Some(frame))) if frame.kind == kind::HELLO_ANSWER => {
            decode_message::<ReplicaHelloAnswer>(&frame.body).map_err(|e| e.to_string())?
        }
        Some(Ok(Some(frame))) => return Err(format!("unexpected frame type {}", frame.kind)),
        Some(Ok(None)) => return Err("closed by the leader".into()),
        Some(Err(e)) => return Err(e.to_string()),
        None => return Err("no answer to the hello in time".into()),
    };
    if answer.shards == 0 {
        return Err("the leader says it has no shards".into());
    }
    // A leader that restarted with another shard count regroups the partitions: those that moved go to
    // the fetchers of their new shards.
    counts.borrow_mut().insert(leader, answer.shards);
    let mut correlation = 0u64;
    while !shutdown.is_triggered() {
        let mut asked = Vec::new();
        let mut partitions = Vec::new();
        for tp in followed_on(replicas, counts, leader, leader_shard) {
            let (Some(log), Some(topic_id)) = (logs.get(&tp), replicas.topic_id(&tp)) else { continue };
            // A damaged log takes nothing (it is reported offline and rebuilt, see `runtime::offline`).
            if log.damage().is_some() {
                continue;
            }
            let Some((to, position)) = replicas.fetch_position(&tp, &log) else { continue };
            if to != leader {
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
        stream.flush().await.map_err(|e| e.to_string())?;
        let answer = next_unchecked_frame(&mut stream, &mut frames, &mut buf);
        let frame = match within(MAX_HOLD + PEER_TIMEOUT, answer).await {
            Some(Ok(Some(frame))) if frame.kind == kind::FETCH_RESULT => frame,
            Some(Ok(Some(frame))) => return Err(format!("unexpected frame type {}", frame.kind)),
            Some(Ok(None)) => return Err("closed by the leader".into()),
            Some(Err(e)) => return Err(e.to_string()),
            None => return Err("no answer in time".into()),
        };
        // The frame's CRC takes each record batch at its own CRC's word: `apply_answer` uses a partition's
        // bytes only through `append_replicated`, which checks every batch's CRC32C before it appends any.
        let (result, records) = decode_fetch_result(&frame).map_err(|e| e.to_string())?;
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
        // Group commit: what this answer brought is on disk before the next fetch reports it, the
        // partitions' fdatasyncs running side by side.
        let flushes: Vec<_> = appended
            .into_iter()
            .filter(|log| matches!(log.config().flush, FlushPolicy::Always))
            .map(|log| {
                glommio::spawn_local(async move {
                    if let Err(e) = log.flush().await {
                        tracing::warn!(log = %log.dir().display(), error = %e, "flush of replicated records failed");
                    }
                })
            })
            .collect();
        for flush in flushes {
            flush.await;
        }
        // The leader's log start moved (DeleteRecords, retention): the follower's follows, up to its own HW,
        // so that a replica elected later does not serve records the leader had deleted. One checkpoint
        // records them all before any epoch file is rewritten.
        let mut moved = false;
        for (tp, leader_start) in leader_starts {
            let Some(log) = logs.get(tp) else { continue };
            let start = leader_start.min(log.high_watermark());
            if start > log.log_start_offset() {
                match log.delete_records(start).await {
                    Ok(_) => moved = true,
                    Err(e) => {
                        tracing::warn!(partition = %tp, error = %e, "moving the log start to the leader's failed")
                    }
                }
            }
        }
        if moved && let Err(e) = logs.checkpoint().await {
            tracing::warn!(error = %e, "checkpoint of moved log starts failed");
        }
    }
    Ok(())
}
