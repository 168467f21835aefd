//! The broker's link to the quorum, on a thread of its own with a current-thread tokio runtime:
//!
//! - runs this node's voter when it is one (the default single node is its own one-voter quorum), or
//!   talks to the voters over their quorum ports;
//! - registers the broker (a new incarnation per process, the previous one named from the data dir),
//!   heartbeats every `broker.heartbeat.interval.ms`, and at shutdown asks for a controlled shutdown;
//! - follows the metadata: fetches what was applied after its image's index and hands every new image to
//!   the shards ([`super::follow`]);
//! - commits the commands shards send it (topic changes from Kafka admin requests).
//!
//! Shards reach it through [`QuorumHandle`], whose calls are plain flume messages usable from glommio.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use shardlog_net::peer::{decode_message, encode_message};

use super::image::MetadataImage;
use crate::quorum::network::{CallError, PeerConnection, WireWrite};
use crate::quorum::service::{StartError, Voter, VoterSettings};
use crate::quorum::state::{BrokerEndpoint, Command, CommandError, NodeId};
use crate::quorum::wire::{WireFetch, WireFetchResult, WireWriteResult, kind};
use crate::runtime::Shutdown;

/// The file in the data dir naming the incarnation of the process that last started on it.
pub const INCARNATION_FILE: &str = "broker-incarnation";
/// The embedded voter's directory inside the data dir (not a `<topic>-<partition>` name, so the storage
/// engine leaves it alone).
pub const QUORUM_DIR: &str = "quorum";
/// How long one metadata fetch waits for something new.
const FETCH_WAIT: Duration = Duration::from_secs(1);
/// How long a call to a remote voter may take beyond its own wait.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause before retrying when no voter answered or there is no leader.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// How long a stopping broker tries to get its controlled shutdown committed.
const CONTROLLED_SHUTDOWN_LIMIT: Duration = Duration::from_secs(5);

/// How the broker reaches the quorum.
#[derive(Debug, Clone)]
pub struct LinkSettings {
    pub node: NodeId,
    /// The Kafka endpoint the broker registers (its advertised listener).
    pub endpoint: BrokerEndpoint,
    pub data_dir: PathBuf,
    /// Every voter, `(id, HOST:PORT)`; empty: this node is the whole quorum, without a quorum port.
    pub voters: Vec<(u64, String)>,
    pub heartbeat_interval: Duration,
    /// Stamped into registrations by the voters this node runs.
    pub session_timeout_ms: u64,
}

/// Why the link could not start.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("voter {0}: {1}")]
    Voter(String, #[source] StartError),
    #[error("start the quorum link thread: {0}")]
    Thread(std::io::Error),
}

struct WriteRequest {
    command: Command,
    reply: flume::Sender<WireWriteResult>,
}

/// What shards hold to commit commands and to learn whether the broker is registered.
#[derive(Clone)]
pub struct QuorumHandle {
    writes: flume::Sender<WriteRequest>,
    /// The log index of this process's registration; `u64::MAX` until registered.
    registered_at: Arc<AtomicU64>,
}

impl std::fmt::Debug for QuorumHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuorumHandle").field("registered_at", &self.registered_at()).finish_non_exhaustive()
    }
}

impl QuorumHandle {
    /// Commits a command through the quorum and returns how it applied.
    pub async fn write(&self, command: Command) -> WireWriteResult {
        let (reply, answer) = flume::bounded(1);
        if self.writes.send_async(WriteRequest { command, reply }).await.is_err() {
            return WireWriteResult::Failed("the broker is stopping".into());
        }
        answer.recv_async().await.unwrap_or_else(|_| WireWriteResult::Failed("the broker is stopping".into()))
    }

    /// The log index at which this process registered, once it has.
    pub fn registered_at(&self) -> Option<u64> {
        let index = self.registered_at.load(Ordering::SeqCst);
        (index != u64::MAX).then_some(index)
    }
}

/// The running link. [`QuorumLink::stop`] waits for its thread (and the voter it runs).
pub struct QuorumLink {
    handle: QuorumHandle,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for QuorumLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuorumLink").field("handle", &self.handle).finish_non_exhaustive()
    }
}

/// The voters, as this broker reaches them.
#[derive(Clone)]
enum Quorum {
    /// This process runs a voter (it forwards writes to the leader itself).
    Embedded(Arc<Voter>),
    /// Voters elsewhere, tried in turn.
    Remote(Arc<Vec<String>>),
}

impl QuorumLink {
    /// Starts the voter this node runs (if any) and the link thread. Every new metadata image goes to
    /// `images`; once `shutdown` is triggered the link asks for a controlled shutdown and ends.
    pub fn start(
        settings: LinkSettings,
        images: flume::Sender<Arc<MetadataImage>>,
        shutdown: Shutdown,
    ) -> Result<QuorumLink, LinkError> {
        let quorum_dir = settings.data_dir.join(QUORUM_DIR);
        let quorum = if settings.voters.is_empty() {
            let mut voter = VoterSettings::alone(settings.node.0 as u64, quorum_dir);
            voter.session_timeout_ms = settings.session_timeout_ms as i64;
            let voter = Voter::start(voter).map_err(|e| LinkError::Voter(settings.node.to_string(), e))?;
            Quorum::Embedded(Arc::new(voter))
        } else if let Some((_, addr)) = settings.voters.iter().find(|(id, _)| *id == settings.node.0 as u64) {
            let listen = resolve(addr).map_err(|e| LinkError::Voter(addr.clone(), e))?;
            let mut voter = VoterSettings::new(settings.node.0 as u64, quorum_dir, listen, settings.voters.clone());
            voter.session_timeout_ms = settings.session_timeout_ms as i64;
            let voter = Voter::start(voter).map_err(|e| LinkError::Voter(addr.clone(), e))?;
            Quorum::Embedded(Arc::new(voter))
        } else {
            Quorum::Remote(Arc::new(settings.voters.iter().map(|(_, addr)| addr.clone()).collect()))
        };
        let (writes, write_requests) = flume::unbounded();
        let handle = QuorumHandle { writes, registered_at: Arc::new(AtomicU64::new(u64::MAX)) };
        let registered_at = handle.registered_at.clone();
        let thread = std::thread::Builder::new()
            .name("quorum-link".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a current-thread tokio runtime builds");
                runtime.block_on(run(settings, quorum, images, write_requests, registered_at, shutdown));
            })
            .map_err(LinkError::Thread)?;
        Ok(QuorumLink { handle, thread: Some(thread) })
    }

    pub fn handle(&self) -> QuorumHandle {
        self.handle.clone()
    }

    /// Waits for the link to end (it ends once shutdown is triggered and the controlled shutdown is
    /// done or given up), which also stops the voter it runs.
    pub fn stop(mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn resolve(addr: &str) -> Result<std::net::SocketAddr, StartError> {
    use std::net::ToSocketAddrs;
    let unresolved = |source| StartError::Listen { addr: std::net::SocketAddr::from(([0, 0, 0, 0], 0)), source };
    addr.to_socket_addrs().map_err(unresolved)?.next().ok_or_else(|| {
        unresolved(std::io::Error::new(std::io::ErrorKind::NotFound, format!("{addr} does not resolve")))
    })
}

async fn run(
    settings: LinkSettings,
    quorum: Quorum,
    images: flume::Sender<Arc<MetadataImage>>,
    write_requests: flume::Receiver<WriteRequest>,
    registered_at: Arc<AtomicU64>,
    shutdown: Shutdown,
) {
    let writer = {
        let quorum = quorum.clone();
        tokio::spawn(async move {
            while let Ok(request) = write_requests.recv_async().await {
                let quorum = quorum.clone();
                tokio::spawn(async move {
                    let _ = request.reply.send(quorum.write(request.command).await);
                });
            }
        })
    };
    let follower = tokio::spawn(follow(quorum.clone(), images));
    lifecycle(&settings, &quorum, &registered_at, &shutdown).await;
    follower.abort();
    writer.abort();
}

/// Register, heartbeat until shutdown, then ask for a controlled shutdown.
async fn lifecycle(settings: &LinkSettings, quorum: &Quorum, registered_at: &AtomicU64, shutdown: &Shutdown) {
    let previous_incarnation = read_incarnation(&settings.data_dir);
    let incarnation = uuid::Uuid::new_v4().as_u64_pair().0;
    // Recorded before registering: if this process dies, the next one on this data takes over from it.
    crate::quorum::log_store::replace_file(
        &settings.data_dir.join(INCARNATION_FILE),
        incarnation.to_string().as_bytes(),
    );
    let register = Command::RegisterBroker {
        id: settings.node,
        endpoint: settings.endpoint.clone(),
        incarnation,
        previous_incarnation,
        // Stamped by the voter that proposes it.
        now_ms: 0,
        session_timeout_ms: 0,
    };
    let mut registered = false;
    while !shutdown.is_triggered() {
        let command = if registered {
            Command::BrokerHeartbeat { id: settings.node, incarnation, now_ms: 0 }
        } else {
            register.clone()
        };
        let pause = match quorum.write(command).await {
            WireWriteResult::Applied { index, outcome: Ok(_) } => {
                if !registered {
                    registered = true;
                    registered_at.store(index, Ordering::SeqCst);
                    tracing::info!(node = %settings.node, incarnation, index, "registered with the quorum");
                }
                settings.heartbeat_interval
            }
            WireWriteResult::Applied { outcome: Err(e), .. } => {
                match e {
                    CommandError::DuplicateBrokerRegistration(_) => tracing::warn!(
                        node = %settings.node,
                        "another process is registered with this node id; retrying until its session expires"
                    ),
                    e => {
                        // Our registration was replaced (another process with this id took over after our
                        // session expired): register again.
                        tracing::error!(node = %settings.node, error = %e, "heartbeat refused; registering again");
                        registered = false;
                    }
                }
                settings.heartbeat_interval
            }
            WireWriteResult::NoLeader => RETRY_PAUSE,
            WireWriteResult::Failed(reason) => {
                tracing::debug!(%reason, "quorum write failed");
                RETRY_PAUSE
            }
        };
        sleep_unless_stopping(pause, shutdown).await;
    }
    if registered {
        controlled_shutdown(settings.node, incarnation, quorum).await;
    }
}

async fn sleep_unless_stopping(pause: Duration, shutdown: &Shutdown) {
    let deadline = tokio::time::Instant::now() + pause;
    while !shutdown.is_triggered() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20).min(pause)).await;
    }
}

async fn controlled_shutdown(node: NodeId, incarnation: u64, quorum: &Quorum) {
    let attempt = async {
        loop {
            match quorum.write(Command::ControlledShutdown { id: node, incarnation }).await {
                WireWriteResult::Applied { outcome, .. } => return outcome.map(|_| ()),
                _ => tokio::time::sleep(RETRY_PAUSE).await,
            }
        }
    };
    match tokio::time::timeout(CONTROLLED_SHUTDOWN_LIMIT, attempt).await {
        Ok(Ok(())) => tracing::info!(node = %node, "controlled shutdown: leaderships moved, broker fenced"),
        Ok(Err(e)) => tracing::warn!(node = %node, error = %e, "controlled shutdown refused"),
        Err(_) => tracing::warn!(node = %node, "controlled shutdown not committed in time (no quorum?)"),
    }
}

fn read_incarnation(data_dir: &Path) -> Option<u64> {
    let path = data_dir.join(INCARNATION_FILE);
    let text = std::fs::read_to_string(&path).ok()?;
    let parsed = text.trim().parse().ok();
    if parsed.is_none() {
        tracing::warn!(path = %path.display(), "unreadable incarnation record; registering as a new process");
    }
    parsed
}

/// Fetches what the quorum applied after the image's index, forever, sending every new image on.
async fn follow(quorum: Quorum, images: flume::Sender<Arc<MetadataImage>>) {
    let mut image = MetadataImage::default();
    loop {
        let Some(fetched) = quorum.fetch(image.applied, FETCH_WAIT).await else {
            tokio::time::sleep(RETRY_PAUSE).await;
            continue;
        };
        let controller = fetched.leader.map(|id| NodeId(id as u32));
        let moved = image.apply(fetched.delta);
        if moved || controller != image.controller {
            image.controller = controller;
            if images.send_async(Arc::new(image.clone())).await.is_err() {
                return;
            }
        }
    }
}

impl Quorum {
    async fn write(&self, command: Command) -> WireWriteResult {
        match self {
            Quorum::Embedded(voter) => voter.write_async(command).await,
            Quorum::Remote(addrs) => {
                let body = encode_message(&WireWrite { command, forwarded: false });
                let mut last = WireWriteResult::NoLeader;
                for addr in addrs.iter() {
                    match call(addr, kind::WRITE, &body, kind::WRITE_RESULT, CALL_TIMEOUT).await {
                        Ok(result) => match result {
                            WireWriteResult::NoLeader => continue,
                            other => return other,
                        },
                        // Not reached: the command was not proposed through this voter; try the next.
                        Err(CallError::Io(e)) => tracing::debug!(%addr, error = %e, "voter unreachable"),
                        Err(e) => {
                            // Sent but unanswered: it may have been committed; the caller decides.
                            last = WireWriteResult::Failed(format!("voter {addr}: {e}"));
                            break;
                        }
                    }
                }
                last
            }
        }
    }

    async fn fetch(&self, after: Option<u64>, wait: Duration) -> Option<WireFetchResult> {
        match self {
            Quorum::Embedded(voter) => voter.fetch_async(after, wait).await,
            Quorum::Remote(addrs) => {
                let body = encode_message(&WireFetch { after, wait_ms: wait.as_millis() as u32 });
                for addr in addrs.iter() {
                    match call(addr, kind::FETCH, &body, kind::FETCH_RESULT, wait + CALL_TIMEOUT).await {
                        Ok(result) => return Some(result),
                        Err(e) => tracing::debug!(%addr, error = %e, "metadata fetch failed"),
                    }
                }
                None
            }
        }
    }
}

/// One request to a remote voter over a fresh connection.
async fn call<T>(addr: &str, request: u16, body: &[u8], answer: u16, timeout: Duration) -> Result<T, CallError>
where
    T: rkyv::Archive,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>>
        + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rkyv::rancor::Error>>,
{
    let mut conn = tokio::time::timeout(timeout, PeerConnection::connect(addr))
        .await
        .map_err(|_| CallError::Io(std::io::Error::new(std::io::ErrorKind::TimedOut, "connect timed out")))??;
    let frame = conn.call(request, body, timeout).await?;
    if frame.kind != answer {
        return Err(CallError::Frame(shardlog_net::peer::PeerFrameError::UnexpectedType(frame.kind)));
    }
    Ok(decode_message(&frame.body)?)
}
