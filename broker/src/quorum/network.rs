//! The quorum port: Raft RPCs between voters and command writes from brokers, as peer-protocol frames
//! (see `docs/peer-protocol.md`) over TCP, on the quorum thread's tokio runtime.
//!
//! One request at a time per connection: a request frame, then its answer frame. A frame that fails its
//! checks (magic, version, length, CRC, archive validation) or has an unexpected type closes the
//! connection with one log line naming the peer and the reason.
//!
//! With cluster mTLS (`crate::security::cluster_tls`) every connection is TLS, both ends proving their
//! node id before a frame is read; the dialler names the voter it calls. Then [`Caller`] says who may ask
//! what: Raft RPCs only from the voter they claim to come from, command writes that name a broker only
//! from that broker (or forwarded by a voter), anything else from any node of the cluster. A refused
//! request is logged (WARN: peer, node, reason), the connection closed, and nothing applied.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::error::{NetworkError, RPCError, RaftError, Unreachable};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse, VoteRequest,
    VoteResponse,
};
use openraft::{BasicNode, Raft};
use shardlog_net::peer::{PeerFrame, PeerFrameError, PeerFrameReader, decode_message, encode_frame, encode_message};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::log_store::LogStore;
use super::state::Command;
use super::state_machine::StateMachineStore;
use super::wire::{
    MetadataDelta, QuorumConfig, WireAppend, WireAppendResult, WireFetch, WireFetchResult, WireSnapshotChunk,
    WireStatus, WireVote, WireVoteRequest, WireVoteResult, WireWriteResult, kind,
};
use crate::logging::Throttle;
use crate::security::cluster_tls::{ClusterTls, server_name};

/// The largest frame a voter accepts (snapshot chunks and entry batches are far smaller).
pub const MAX_FRAME_BYTES: u32 = 64 << 20;
/// How long a forwarded write waits for the leader.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);

/// A command sent to a voter, and whether it was already forwarded once (it is not forwarded twice).
#[derive(Debug, Clone, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireWrite {
    pub command: Command,
    pub forwarded: bool,
}

/// Why a call to a peer failed.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("connect or transfer: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Frame(#[from] PeerFrameError),
    #[error("the peer refused: {0}")]
    Refused(String),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    #[error("the peer closed the connection")]
    Closed,
}

/// A quorum connection's bytes: plain TCP, or TLS over it (cluster mTLS).
pub trait Io: AsyncRead + AsyncWrite + Unpin + Send + Sync {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + Sync> Io for T {}

/// One connection to a peer's quorum port.
pub struct PeerConnection {
    stream: Box<dyn Io>,
    reader: PeerFrameReader,
    buf: Vec<u8>,
}

impl std::fmt::Debug for PeerConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerConnection").finish_non_exhaustive()
    }
}

impl PeerConnection {
    /// Connects to voter `node` at `addr`; under cluster mTLS (`tls`) the voter must prove it is `node`.
    pub async fn connect(addr: &str, node: u64, tls: Option<&ClusterTls>) -> std::io::Result<PeerConnection> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        let stream: Box<dyn Io> = match tls {
            None => Box::new(stream),
            Some(tls) => {
                let connector = tokio_rustls::TlsConnector::from(tls.client_config(None));
                Box::new(connector.connect(server_name(node), stream).await?)
            }
        };
        Ok(PeerConnection { stream, reader: PeerFrameReader::new(MAX_FRAME_BYTES), buf: Vec::new() })
    }

    /// Sends one request and reads its answer. A [`kind::FAILED`] answer is an error.
    pub async fn call(&mut self, request_kind: u16, body: &[u8], timeout: Duration) -> Result<PeerFrame, CallError> {
        let exchange = async {
            self.stream.write_all(&encode_frame(request_kind, body)).await?;
            // A TLS stream may hold the end of the request until flushed.
            self.stream.flush().await?;
            read_frame(&mut self.stream, &mut self.reader, &mut self.buf).await?.ok_or(CallError::Closed)
        };
        let frame = tokio::time::timeout(timeout, exchange).await.map_err(|_| CallError::Timeout(timeout))??;
        if frame.kind == kind::FAILED {
            let reason: String = decode_message(&frame.body)?;
            return Err(CallError::Refused(reason));
        }
        Ok(frame)
    }
}

/// Bytes read from a socket at a time.
const READ_CHUNK_BYTES: usize = 64 << 10;

/// Reads the next frame; `None` at a clean end of stream. `buf` is scratch space, kept by the caller.
async fn read_frame(
    stream: &mut (impl AsyncRead + Unpin),
    reader: &mut PeerFrameReader,
    buf: &mut Vec<u8>,
) -> Result<Option<PeerFrame>, CallError> {
    buf.resize(READ_CHUNK_BYTES, 0);
    loop {
        if let Some(frame) = reader.next_frame()? {
            return Ok(Some(frame));
        }
        let n = stream.read(buf).await?;
        if n == 0 {
            return if reader.buffered() == 0 { Ok(None) } else { Err(CallError::Closed) };
        }
        reader.extend(&buf[..n]);
    }
}

/// A peer voter that cannot be reached for this long is reported (once, at WARN; once again at INFO when
/// it answers, with how long it was away and how many calls to it failed). openraft's own report of every
/// failed attempt (replication, votes, snapshots) is filtered out ([`crate::logging`]): a voter away for
/// the seconds of a restart or of a cluster's stop is no news.
pub const UNREACHABLE_REPORT_AFTER: Duration = Duration::from_secs(15);

/// Makes openraft's clients to the other voters, and keeps each peer's reachability across them
/// (openraft makes a client per election and per replication stream).
#[derive(Debug, Clone, Default)]
pub struct Network {
    health: Arc<Mutex<HashMap<u64, PeerHealth>>>,
    /// Cluster mTLS, when on.
    tls: Option<Arc<ClusterTls>>,
}

impl Network {
    pub fn new(tls: Option<Arc<ClusterTls>>) -> Network {
        Network { health: Arc::default(), tls }
    }
}

/// Since when a peer has failed every call, how many calls failed since, and whether that was reported.
#[derive(Debug, Default)]
struct PeerHealth {
    failing_since: Option<Instant>,
    failures: u64,
    reported: bool,
}

/// openraft's client to one voter: a connection opened on first use and after any failure.
#[derive(Debug)]
pub struct PeerClient {
    target: u64,
    addr: String,
    conn: Option<PeerConnection>,
    health: Arc<Mutex<HashMap<u64, PeerHealth>>>,
    tls: Option<Arc<ClusterTls>>,
}

impl RaftNetworkFactory<QuorumConfig> for Network {
    type Network = PeerClient;

    async fn new_client(&mut self, target: u64, node: &BasicNode) -> PeerClient {
        PeerClient { target, addr: node.addr.clone(), conn: None, health: self.health.clone(), tls: self.tls.clone() }
    }
}

impl PeerClient {
    /// Notes the outcome of a call for this peer's reachability report.
    fn note(&self, failure: Option<&dyn std::fmt::Display>) {
        let mut health = self.health.lock().expect("peer health lock");
        let peer = health.entry(self.target).or_default();
        match failure {
            Some(error) => {
                let since = *peer.failing_since.get_or_insert_with(Instant::now);
                peer.failures += 1;
                if !peer.reported && since.elapsed() >= UNREACHABLE_REPORT_AFTER {
                    peer.reported = true;
                    tracing::warn!(
                        voter = self.target,
                        addr = %self.addr,
                        seconds = since.elapsed().as_secs(),
                        failed_calls = peer.failures,
                        %error,
                        "quorum: a voter has been unreachable; the quorum needs a majority of voters"
                    );
                }
            }
            None => {
                if std::mem::take(&mut peer.reported) {
                    let seconds = peer.failing_since.map_or(0, |since| since.elapsed().as_secs());
                    tracing::info!(
                        voter = self.target,
                        addr = %self.addr,
                        seconds,
                        failed_calls = peer.failures,
                        "quorum: the voter answers again after an outage"
                    );
                }
                peer.failing_since = None;
                peer.failures = 0;
            }
        }
    }

    async fn call<E: std::error::Error>(
        &mut self,
        request_kind: u16,
        body: Vec<u8>,
        answer_kind: u16,
        option: &RPCOption,
    ) -> Result<bytes::Bytes, RPCError<u64, BasicNode, RaftError<u64, E>>> {
        // The connection is taken out for the call and put back only after a whole exchange: openraft may
        // drop this future mid-call (its own timeout), and a connection with an answer still unread must
        // never serve the next request.
        let mut conn = match self.conn.take() {
            Some(conn) => conn,
            None => {
                let connect = PeerConnection::connect(&self.addr, self.target, self.tls.as_deref());
                let error = match tokio::time::timeout(option.hard_ttl(), connect).await {
                    Ok(Ok(conn)) => Ok(conn),
                    Ok(Err(e)) => Err(CallError::Io(e)),
                    Err(_) => Err(CallError::Timeout(option.hard_ttl())),
                };
                match error {
                    Ok(conn) => conn,
                    Err(e) => {
                        self.note(Some(&e));
                        return Err(RPCError::Unreachable(Unreachable::new(&e)));
                    }
                }
            }
        };
        match conn.call(request_kind, &body, option.hard_ttl()).await {
            Ok(frame) if frame.kind == answer_kind => {
                self.conn = Some(conn);
                self.note(None);
                Ok(frame.body)
            }
            Ok(frame) => {
                let e = CallError::Frame(PeerFrameError::UnexpectedType(frame.kind));
                self.note(Some(&e));
                Err(RPCError::Network(NetworkError::new(&e)))
            }
            Err(e) => {
                tracing::debug!(target = self.target, addr = %self.addr, error = %e, "quorum call failed");
                self.note(Some(&e));
                Err(RPCError::Network(NetworkError::new(&e)))
            }
        }
    }
}

fn malformed<E: std::error::Error>(e: PeerFrameError) -> RPCError<u64, BasicNode, RaftError<u64, E>> {
    RPCError::Network(NetworkError::new(&CallError::Frame(e)))
}

impl RaftNetwork<QuorumConfig> for PeerClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<QuorumConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let body = encode_message(&WireAppend::from(&rpc));
        let answer = self.call(kind::APPEND, body, kind::APPEND_RESULT, &option).await?;
        let result: WireAppendResult = decode_message(&answer).map_err(malformed)?;
        Ok(result.into())
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<QuorumConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<u64>,
        RPCError<u64, BasicNode, RaftError<u64, openraft::error::InstallSnapshotError>>,
    > {
        let body = encode_message(&WireSnapshotChunk::from(&rpc));
        let answer = self.call(kind::SNAPSHOT, body, kind::SNAPSHOT_RESULT, &option).await?;
        let vote: WireVote = decode_message(&answer).map_err(malformed)?;
        Ok(InstallSnapshotResponse { vote: vote.into() })
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<u64>,
        option: RPCOption,
    ) -> Result<VoteResponse<u64>, RPCError<u64, BasicNode, RaftError<u64>>> {
        let body = encode_message(&WireVoteRequest::from(&rpc));
        let answer = self.call(kind::VOTE, body, kind::VOTE_RESULT, &option).await?;
        let result: WireVoteResult = decode_message(&answer).map_err(malformed)?;
        Ok(result.into())
    }
}

/// What the quorum port serves from.
#[derive(Clone)]
pub struct Served {
    pub node: u64,
    /// `broker.session.timeout.ms`: stamped into broker registrations this voter proposes.
    pub session_timeout_ms: i64,
    /// The voter's files, and the free space kept on their disk (commands that change topics are
    /// refused below it).
    pub dir: std::path::PathBuf,
    pub reserve_bytes: u64,
    pub raft: Raft<QuorumConfig>,
    pub log: LogStore,
    pub state: StateMachineStore,
    /// Every voter's id.
    pub voters: Arc<Vec<u64>>,
    /// Cluster mTLS, when on: who calls is known, and checked ([`Caller`]).
    pub tls: Option<Arc<ClusterTls>>,
}

impl std::fmt::Debug for Served {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Served").field("node", &self.node).finish_non_exhaustive()
    }
}

/// Connections the quorum port keeps open at once (voters and brokers hold a few each); more are
/// closed as they are accepted. The quorum port does not share the clients' limits, so a flood of
/// Kafka clients cannot lock the cluster's own members out.
pub const MAX_PEER_CONNECTIONS: usize = 512;
/// Bytes of request frames the quorum port holds at once, all connections together.
pub const PEER_BUDGET_BYTES: usize = 256 << 20;
/// A request frame must arrive whole within this long of its first byte.
pub const PEER_FRAME_LIMIT: Duration = Duration::from_secs(30);
/// A connection with no request for this long is closed (members poll far more often).
pub const PEER_IDLE_LIMIT: Duration = Duration::from_secs(600);

/// Accepts connections on the quorum port until the task is dropped, which ends its connections too
/// (so no peer's request reaches Raft once it is shut down).
pub async fn serve(listener: TcpListener, served: Served) {
    let mut connections = tokio::task::JoinSet::new();
    let budget = Arc::new(tokio::sync::Semaphore::new(PEER_BUDGET_BYTES));
    let (mut refusals, mut failures) = (Throttle::new(Duration::from_secs(1)), Throttle::new(Duration::from_secs(1)));
    loop {
        while connections.try_join_next().is_some() {}
        match listener.accept().await {
            Ok((stream, peer)) if connections.len() >= MAX_PEER_CONNECTIONS => {
                drop(stream);
                if let Some(skipped) = refusals.event(Instant::now()) {
                    tracing::warn!(%peer, open = connections.len(), refused_unlogged = skipped, "quorum port: refused a connection: too many open");
                }
            }
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                connections.spawn(accept_connection(stream, peer.to_string(), served.clone(), budget.clone()));
            }
            Err(e) => {
                if let Some(skipped) = failures.event(Instant::now()) {
                    tracing::warn!(error = %e, failed_unlogged = skipped, "quorum port: accept failed");
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// How long a dialler has to complete the TLS handshake.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);

/// Who is calling on a connection of the quorum port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// Cluster mTLS is off: anyone who reaches the port (the network is trusted).
    Unproven,
    /// The node id the caller's certificate names.
    Node(u32),
}

/// A request the caller may not make: why.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Forbidden(String);

impl Caller {
    /// A Raft RPC: only from a voter, the one the RPC says it comes from (the leader or candidate).
    fn raft(self, rpc: &str, from: u64, voters: &[u64]) -> Result<(), Forbidden> {
        let Caller::Node(node) = self else { return Ok(()) };
        if !voters.contains(&(node as u64)) {
            return Err(Forbidden(format!("{rpc} from node {node}, which is not a voter")));
        }
        if from != node as u64 {
            return Err(Forbidden(format!("{rpc} in the name of voter {from} from node {node}")));
        }
        Ok(())
    }

    /// A command write: one forwarded by a voter, or one whose command names no node other than the
    /// caller's.
    fn write(self, command: &Command, forwarded: bool, voters: &[u64]) -> Result<(), Forbidden> {
        let Caller::Node(node) = self else { return Ok(()) };
        let voter = voters.contains(&(node as u64));
        if forwarded {
            return match voter {
                true => Ok(()),
                false => Err(Forbidden(format!("a forwarded write from node {node}, which is not a voter"))),
            };
        }
        match command {
            // The controller's own decision: a voter's.
            Command::FenceBroker { .. } if !voter => {
                Err(Forbidden(format!("FenceBroker from node {node}, which is not a voter")))
            }
            Command::RegisterBroker { id, .. }
            | Command::RegisterBrokerListeners { id, .. }
            | Command::BrokerHeartbeat { id, .. }
            | Command::ControlledShutdown { id, .. }
            | Command::SetReplicaOffline { id, .. }
            | Command::AllocateProducerIds { broker: id, .. }
            | Command::AlterPartition { leader: id, .. }
                if id.0 != node =>
            {
                Err(Forbidden(format!("a command in the name of broker {} from node {node}", id.0)))
            }
            _ => Ok(()),
        }
    }
}

/// Takes a connection: under cluster mTLS, its handshake first (the caller must present a certificate of
/// the cluster's authority naming a node), then its requests.
async fn accept_connection(stream: TcpStream, peer: String, served: Served, budget: Arc<tokio::sync::Semaphore>) {
    let Some(tls) = served.tls.clone() else {
        return serve_connection(Box::new(stream), Caller::Unproven, peer, served, budget).await;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config());
    let stream = match tokio::time::timeout(HANDSHAKE_LIMIT, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) if ClusterTls::is_refusal(&error) => {
            crate::metrics::peer_refused("quorum", "handshake");
            return tracing::warn!(%peer, %error, "quorum port: refused a connection: no valid node certificate");
        }
        Ok(Err(error)) => return tracing::debug!(%peer, %error, "quorum port: connection lost in the TLS handshake"),
        Err(_) => {
            crate::metrics::peer_refused("quorum", "handshake");
            return tracing::warn!(%peer, "quorum port: refused a connection: no TLS handshake in time");
        }
    };
    let node = match ClusterTls::peer_node(stream.get_ref().1.peer_certificates()) {
        Ok(node) => node,
        Err(error) => {
            crate::metrics::peer_refused("quorum", "certificate");
            return tracing::warn!(%peer, %error, "quorum port: refused a connection: its certificate names no node");
        }
    };
    serve_connection(Box::new(stream), Caller::Node(node), peer, served, budget).await
}

async fn serve_connection(
    mut stream: Box<dyn Io>,
    caller: Caller,
    peer: String,
    served: Served,
    budget: Arc<tokio::sync::Semaphore>,
) {
    let mut reader = PeerFrameReader::new(MAX_FRAME_BYTES);
    let mut buf = vec![0u8; READ_CHUNK_BYTES];
    loop {
        let (frame, _held) = match read_request(&mut stream, &mut reader, &mut buf, &budget).await {
            Ok(Some(frame)) => frame,
            Ok(None) => return,
            // The peer went away (a voter or broker stopping): nothing wrong here.
            Err(CallError::Io(e)) => {
                tracing::debug!(%peer, error = %e, "quorum port: connection lost");
                return;
            }
            Err(e) => {
                tracing::warn!(%peer, error = %e, "quorum port: closing connection");
                return;
            }
        };
        let answer = match answer(&served, caller, frame).await {
            Ok(answer) => answer,
            Err(Refusal::Frame(e)) => {
                tracing::warn!(%peer, error = %e, "quorum port: closing connection");
                return;
            }
            Err(Refusal::Forbidden(reason)) => {
                crate::metrics::peer_refused("quorum", "forbidden");
                let Caller::Node(node) = caller else { unreachable!("only a proven caller is refused") };
                tracing::warn!(%peer, node, %reason, "quorum port: refused a request, closing connection");
                return;
            }
        };
        if let Err(e) = async {
            stream.write_all(&answer).await?;
            stream.flush().await
        }
        .await
        {
            tracing::debug!(%peer, error = %e, "quorum port: connection lost");
            return;
        }
    }
}

/// Reads a peer's next request within the quorum port's limits: nothing for [`PEER_IDLE_LIMIT`] ends
/// the connection quietly (`None`); a frame's body is read only once it fits in the port's budget
/// (whose share comes back with the frame, to be held until it is answered), and must be whole within
/// [`PEER_FRAME_LIMIT`] of that.
async fn read_request(
    stream: &mut (impl AsyncRead + Unpin),
    reader: &mut PeerFrameReader,
    buf: &mut [u8],
    budget: &Arc<tokio::sync::Semaphore>,
) -> Result<Option<(PeerFrame, Option<tokio::sync::OwnedSemaphorePermit>)>, CallError> {
    let mut held = None;
    let mut due: Option<tokio::time::Instant> = None;
    loop {
        if let Some(frame) = reader.next_frame()? {
            return Ok(Some((frame, held)));
        }
        if held.is_none()
            && let Some(len) = reader.announced()
        {
            let permits = u32::try_from(len).expect("bounded by MAX_FRAME_BYTES");
            let share = tokio::time::timeout(PEER_FRAME_LIMIT, budget.clone().acquire_many_owned(permits))
                .await
                .map_err(|_| CallError::Timeout(PEER_FRAME_LIMIT))?;
            held = Some(share.expect("the budget is never closed"));
            due = Some(tokio::time::Instant::now() + PEER_FRAME_LIMIT);
        }
        let limit = due.unwrap_or_else(|| tokio::time::Instant::now() + PEER_IDLE_LIMIT);
        let n = match tokio::time::timeout_at(limit, stream.read(buf)).await {
            Ok(read) => read?,
            Err(_) if reader.buffered() == 0 => return Ok(None),
            Err(_) => return Err(CallError::Timeout(PEER_FRAME_LIMIT)),
        };
        if n == 0 {
            return if reader.buffered() == 0 { Ok(None) } else { Err(CallError::Closed) };
        }
        if due.is_none() {
            due = Some(tokio::time::Instant::now() + PEER_FRAME_LIMIT);
        }
        reader.extend(&buf[..n]);
    }
}

/// Why a request is not answered: the connection is closed.
#[derive(Debug, thiserror::Error)]
enum Refusal {
    #[error(transparent)]
    Frame(#[from] PeerFrameError),
    #[error(transparent)]
    Forbidden(#[from] Forbidden),
}

/// The answer frame to one request frame from `caller`; an error closes the connection.
async fn answer(served: &Served, caller: Caller, frame: PeerFrame) -> Result<Vec<u8>, Refusal> {
    let raft = &served.raft;
    let voters = &served.voters;
    let refused = |e: &dyn std::fmt::Display| encode_frame(kind::FAILED, &encode_message(&e.to_string()));
    Ok(match frame.kind {
        kind::APPEND => {
            let request: WireAppend = decode_message(&frame.body)?;
            caller.raft("AppendEntries", request.vote.node, voters)?;
            match raft.append_entries(request.into()).await {
                Ok(r) => encode_frame(kind::APPEND_RESULT, &encode_message(&WireAppendResult::from(&r))),
                Err(e) => refused(&e),
            }
        }
        kind::VOTE => {
            let request: WireVoteRequest = decode_message(&frame.body)?;
            caller.raft("Vote", request.vote.node, voters)?;
            match raft.vote(request.into()).await {
                Ok(r) => encode_frame(kind::VOTE_RESULT, &encode_message(&WireVoteResult::from(&r))),
                Err(e) => refused(&e),
            }
        }
        kind::SNAPSHOT => {
            let request: WireSnapshotChunk = decode_message(&frame.body)?;
            caller.raft("InstallSnapshot", request.vote.node, voters)?;
            match raft.install_snapshot(request.into()).await {
                Ok(r) => encode_frame(kind::SNAPSHOT_RESULT, &encode_message(&WireVote::from(&r.vote))),
                Err(e) => refused(&e),
            }
        }
        kind::WRITE => {
            let request: WireWrite = decode_message(&frame.body)?;
            caller.write(&request.command, request.forwarded, voters)?;
            let result = write(served, request.command, request.forwarded).await;
            encode_frame(kind::WRITE_RESULT, &encode_message(&result))
        }
        kind::STATUS => encode_frame(kind::STATUS_RESULT, &encode_message(&status(served).await)),
        kind::FETCH => {
            let request: WireFetch = decode_message(&frame.body)?;
            let wait = Duration::from_millis(request.wait_ms.min(MAX_FETCH_WAIT_MS) as u64);
            encode_frame(kind::FETCH_RESULT, &encode_message(&fetch(served, request.after, wait).await))
        }
        other => return Err(PeerFrameError::UnexpectedType(other).into()),
    })
}

/// The longest a metadata fetch waits for something new.
pub const MAX_FETCH_WAIT_MS: u32 = 10_000;

/// What was applied after `after`: the commands from this voter's log, or its whole state when the log
/// no longer holds them. Waits up to `wait` for something to be applied after `after`.
pub async fn fetch(served: &Served, after: Option<u64>, wait: Duration) -> WireFetchResult {
    use openraft::RaftLogReader;
    let mut applied = served.state.subscribe_applied();
    let newer = |index: &Option<u64>| *index > after;
    let waited = tokio::time::timeout(wait, async { applied.wait_for(newer).await.map(|index| *index) }).await;
    let delta = match waited {
        Ok(Ok(index)) => {
            let upto = index.expect("newer than something");
            let from = after.map_or(0, |a| a + 1);
            let mut log = served.log.clone();
            let entries = log.try_get_log_entries(from..=upto).await.unwrap_or_default();
            let whole = entries.first().is_some_and(|e| e.log_id.index == from)
                && entries.last().is_some_and(|e| e.log_id.index == upto)
                && entries.len() as u64 == upto - from + 1;
            if whole {
                MetadataDelta::Entries { commands: commands_of(entries), applied: upto }
            } else {
                let (state, applied) = served.state.state();
                MetadataDelta::Snapshot { state, applied: applied.map(|l| l.index) }
            }
        }
        // Timed out, or the state machine is gone (the voter is stopping).
        _ => MetadataDelta::Unchanged,
    };
    WireFetchResult { leader: served.raft.current_leader().await, delta }
}

/// This voter's view: leader, applied index, state, and the commands its log holds up to what it applied.
pub async fn status(served: &Served) -> WireStatus {
    use openraft::RaftLogReader;
    let (state, applied) = served.state.state();
    let applied = applied.map(|l| l.index);
    let mut log = served.log.clone();
    let entries = match applied {
        Some(upto) => log.try_get_log_entries(..=upto).await.unwrap_or_default(),
        None => Vec::new(),
    };
    let commands = commands_of(entries);
    WireStatus { node: served.node, leader: served.raft.current_leader().await, applied, state, commands }
}

/// The commands among log entries, with their indexes (membership and blank entries carry none).
fn commands_of(entries: Vec<openraft::Entry<QuorumConfig>>) -> Vec<(u64, Command)> {
    entries
        .into_iter()
        .filter_map(|e| match e.payload {
            openraft::EntryPayload::Normal(command) => Some((e.log_id.index, command)),
            _ => None,
        })
        .collect()
}

/// Commits a command through this voter: proposed here when it leads, otherwise forwarded once to the
/// leader it knows of. The voter that proposes stamps broker registrations and heartbeats with its clock
/// and session timeout: liveness is judged by the controller's clock alone, never a broker's.
pub async fn write(served: &Served, mut command: Command, forwarded: bool) -> WireWriteResult {
    use openraft::error::ClientWriteError;
    let raft = &served.raft;
    let now = now_ms();
    match &mut command {
        Command::RegisterBroker { now_ms, session_timeout_ms, .. }
        | Command::RegisterBrokerListeners { now_ms, session_timeout_ms, .. } => {
            *now_ms = now;
            *session_timeout_ms = served.session_timeout_ms;
        }
        Command::BrokerHeartbeat { now_ms, .. } => *now_ms = now,
        // Commands that add topics, partitions or settings are refused on a nearly full disk, before the
        // log is written; the others (a few bytes each, and deletions, which free space) may use the
        // reserve.
        Command::CreateTopic { .. }
        | Command::CreatePartitions { .. }
        | Command::CreatePartitionsAssigned { .. }
        | Command::AlterConfigs { .. }
        | Command::EditConfigs { .. }
        | Command::AlterScramCredentials { .. }
        | Command::CreateAcls { .. }
        | Command::AlterClientQuotas { .. } => {
            let free = crate::disk_space::free_bytes(&served.dir).unwrap_or(u64::MAX);
            if free < served.reserve_bytes {
                return WireWriteResult::Failed(format!(
                    "{} ({free} bytes free, {} kept in reserve): free space first",
                    crate::disk_space::QUORUM_DISK_FULL,
                    served.reserve_bytes
                ));
            }
        }
        _ => {}
    }
    match raft.client_write(command.clone()).await {
        Ok(r) => WireWriteResult::Applied { index: r.log_id.index, outcome: r.data },
        Err(RaftError::APIError(ClientWriteError::ForwardToLeader(to))) => {
            let (Some(id), Some(leader)) = (to.leader_id, to.leader_node.filter(|_| !forwarded)) else {
                return WireWriteResult::NoLeader;
            };
            forward(&leader.addr, id, served.tls.as_deref(), command).await
        }
        Err(e) => WireWriteResult::Failed(e.to_string()),
    }
}

/// The local clock in milliseconds since the epoch.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

async fn forward(addr: &str, leader: u64, tls: Option<&ClusterTls>, command: Command) -> WireWriteResult {
    // A leader that cannot be reached was not asked: the writer may safely send the command again.
    let connect = tokio::time::timeout(FORWARD_TIMEOUT, PeerConnection::connect(addr, leader, tls)).await;
    let Ok(Ok(mut conn)) = connect else { return WireWriteResult::NoLeader };
    let call = async {
        let body = encode_message(&WireWrite { command, forwarded: true });
        let frame = conn.call(kind::WRITE, &body, FORWARD_TIMEOUT).await?;
        if frame.kind != kind::WRITE_RESULT {
            return Err(CallError::Frame(PeerFrameError::UnexpectedType(frame.kind)));
        }
        Ok::<_, CallError>(decode_message::<WireWriteResult>(&frame.body)?)
    };
    call.await.unwrap_or_else(|e| WireWriteResult::Failed(format!("forward to the leader at {addr}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quorum::state::NodeId;

    const VOTERS: [u64; 3] = [1, 2, 3];

    #[test]
    fn raft_requests_come_only_from_the_voter_they_name() {
        assert!(Caller::Node(2).raft("Vote", 2, &VOTERS).is_ok());
        let as_another = Caller::Node(2).raft("AppendEntries", 3, &VOTERS).unwrap_err();
        assert!(as_another.to_string().contains("in the name of voter 3 from node 2"), "{as_another}");
        let not_a_voter = Caller::Node(4).raft("Vote", 4, &VOTERS).unwrap_err();
        assert!(not_a_voter.to_string().contains("not a voter"), "{not_a_voter}");
        assert!(Caller::Unproven.raft("Vote", 9, &VOTERS).is_ok(), "without cluster mTLS nothing is known");
    }

    #[test]
    fn a_write_that_names_a_broker_comes_only_from_that_broker_or_a_forwarding_voter() {
        let heartbeat = |id| Command::BrokerHeartbeat { id: NodeId(id), incarnation: 1, now_ms: 0 };
        assert!(Caller::Node(5).write(&heartbeat(5), false, &VOTERS).is_ok());
        let error = Caller::Node(5).write(&heartbeat(6), false, &VOTERS).unwrap_err();
        assert!(error.to_string().contains("in the name of broker 6 from node 5"), "{error}");
        assert!(Caller::Node(2).write(&heartbeat(6), true, &VOTERS).is_ok(), "a voter forwards what it took");
        assert!(Caller::Node(5).write(&heartbeat(5), true, &VOTERS).is_err(), "only voters forward");
        let isr = Command::AlterPartition {
            topic: "t".into(),
            partition: 0,
            leader: NodeId(6),
            leader_epoch: Default::default(),
            partition_epoch: Default::default(),
            isr: vec![NodeId(6)],
        };
        assert!(Caller::Node(5).write(&isr, false, &VOTERS).is_err(), "an ISR change only from its leader");
        let fence = Command::FenceBroker { id: NodeId(5), incarnation: 1, last_heartbeat_ms: 0 };
        assert!(Caller::Node(5).write(&fence, false, &VOTERS).is_err(), "fencing is the controller's");
        assert!(Caller::Node(1).write(&fence, false, &VOTERS).is_ok());
        let topic = Command::DeleteTopic { name: "t".into() };
        assert!(Caller::Node(5).write(&topic, false, &VOTERS).is_ok(), "a broker serving an admin client");
    }
}
