//! Replication between brokers over the peer protocol (`docs/peer-protocol.md` §2.2).
//!
//! Each follower shard keeps one connection per leader shard it follows partitions of, carrying all of
//! them:
//! - [`serve`], the leader side: the connection arrives on the inter-broker listener, told apart by the
//!   peer frame's magic in its first bytes (under cluster mTLS, by the ALPN of its TLS ClientHello, see
//!   [`handshake`]), on whichever shard accepted it; after the Hello it moves to the shard that owns its
//!   partitions, which answers each fetch from its own logs, holding it (up to its
//!   wait) until one of them has records or a new high watermark.
//! - [`fetch`], the follower side: every shard runs [`replicate`], which keeps the fetchers, appends what
//!   the leaders send through the shard's replicas, and fdatasyncs before it asks again, so the stable
//!   offset it reports is on disk. The same task proposes its leaders' ISR changes to the quorum and
//!   takes over the connections other shards hand it.

mod fetch;
mod handshake;
mod serve;

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_lite::future;
use futures_lite::{AsyncRead, AsyncReadExt};
use shardlog_net::peer::{MAGIC, PeerFrame, PeerFrameReader, UncheckedFrame};
use shardlog_storage::LogDir;
use shardlog_storage::fs::dma::DmaFs;

use crate::context::BrokerContext;
use crate::quorum::state::{Command, CommandError, NodeId};
use crate::quorum::wire::WireWriteResult;
use crate::replication::ProposalOutcome;
use crate::shard::ShardReplicas;
use crate::shutdown::Shutdown;

pub(super) use handshake::{
    PeerService, accept as accept_tls, connect as connect_tls, is_tls_record, peek_peer_service,
};
pub(super) use serve::{accept_peer, accept_peer_tls};

/// The largest peer frame either side reads.
const MAX_FRAME_BYTES: u32 = 64 << 20;
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
pub(super) enum ReadError {
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
pub(super) async fn next_frame<S: AsyncRead + Unpin>(
    stream: &mut S,
    frames: &mut PeerFrameReader,
    buf: &mut [u8],
) -> Result<Option<PeerFrame>, ReadError> {
    match next_unchecked_frame(stream, frames, buf).await? {
        Some(frame) => frame.check().map(Some).map_err(|e| ReadError::Bad(e.to_string())),
        None => Ok(None),
    }
}

/// Reads the next frame without checking its CRC (see [`UncheckedFrame`]), `Ok(None)` at end of stream.
/// The rest of a body received in place ([`PeerFrameReader::with_frame_buffers`]) is read straight into
/// its buffer, at most `buf.len()` bytes at a time, like everything else.
pub(super) async fn next_unchecked_frame<S: AsyncRead + Unpin>(
    stream: &mut S,
    frames: &mut PeerFrameReader,
    buf: &mut [u8],
) -> Result<Option<UncheckedFrame>, ReadError> {
    loop {
        if let Some(frame) = frames.next_unchecked().map_err(|e| ReadError::Bad(e.to_string()))? {
            return Ok(Some(frame));
        }
        let chunk = buf.len();
        let (n, in_place) = match frames.frame_space() {
            Some(space) => {
                let len = space.len().min(chunk);
                (stream.read(&mut space[..len]).await.map_err(ReadError::Lost)?, true)
            }
            None => (stream.read(buf).await.map_err(ReadError::Lost)?, false),
        };
        if n == 0 && frames.buffered() > 0 {
            let got = frames.buffered();
            return Err(ReadError::Bad(format!("connection closed inside a frame ({got} bytes of it came)")));
        }
        if n == 0 {
            return Ok(None);
        }
        match in_place {
            true => frames.frame_filled(n),
            false => frames.extend(&buf[..n]),
        }
    }
}

pub(super) async fn within<T>(limit: Duration, work: impl Future<Output = T>) -> Option<T> {
    future::or(async { Some(work.await) }, async {
        glommio::timer::sleep(limit).await;
        None
    })
    .await
}

/// A shard's replication work: a fetcher per leader shard its partitions follow, its leaders' ISR
/// changes, and the followers' connections handed to it.
pub(super) async fn replicate(
    ctx: Arc<BrokerContext>,
    shard: usize,
    logs: Rc<LogDir<DmaFs>>,
    replicas: Rc<ShardReplicas>,
    shutdown: Shutdown,
) {
    let handoffs = ctx.peer_handoffs[shard].1.clone();
    let (serving_logs, serving_replicas, serving_shutdown) = (logs.clone(), replicas.clone(), shutdown.clone());
    let serving_ctx = ctx.clone();
    glommio::spawn_local(async move {
        while let Ok(Some(handoff)) = future::or(async { Some(handoffs.recv_async().await) }, async {
            serving_shutdown.wait().await;
            None
        })
        .await
        .transpose()
        {
            let (logs, replicas, shutdown) = (serving_logs.clone(), serving_replicas.clone(), serving_shutdown.clone());
            let ctx = serving_ctx.clone();
            glommio::spawn_local(serve::serve_fetches(handoff, ctx, shard, logs, replicas, shutdown)).detach();
        }
    })
    .detach();
    let counts = fetch::ShardCounts::default();
    // The leader shards a fetcher runs for; each fetcher clears its flag when it ends.
    let mut fetchers: HashMap<(NodeId, u16), Rc<Cell<bool>>> = HashMap::new();
    while !shutdown.is_triggered() {
        let sources: std::collections::BTreeSet<(NodeId, u16)> = replicas
            .followed()
            .into_iter()
            .map(|(tp, leader)| (leader, fetch::leader_shard(&counts, leader, &tp)))
            .collect();
        fetchers.retain(|_, running| running.get());
        for (leader, leader_shard) in sources {
            if let std::collections::hash_map::Entry::Vacant(slot) = fetchers.entry((leader, leader_shard)) {
                let running = Rc::new(Cell::new(true));
                let (logs, replicas) = (logs.clone(), replicas.clone());
                let fetcher = fetch::fetch_from(
                    ctx.clone(),
                    shard,
                    leader,
                    leader_shard,
                    logs,
                    replicas,
                    counts.clone(),
                    shutdown.clone(),
                );
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
