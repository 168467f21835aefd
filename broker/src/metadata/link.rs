//! The broker's link to the quorum, on a thread of its own with a current-thread tokio runtime:
//!
//! - runs this node's voter when it is one (the default single node is its own one-voter quorum), or
//!   talks to the voters over their quorum ports;
//! - registers the broker (a new incarnation per process, the previous one named from the data dir),
//!   heartbeats every `broker.heartbeat.interval.ms`, and at shutdown, once the shards have answered the
//!   requests in hand, asks for a controlled shutdown;
//! - follows the metadata: fetches what was applied after its image's index and hands every new image to
//!   the shards ([`super::follow`]);
//! - commits the commands shards send it (topic changes from Kafka admin requests).
//!
//! Every call to the quorum has a deadline, and none outlives shutdown: a quorum that cannot commit
//! (a lost majority) delays a stop by at most the controlled-shutdown limit. If this broker's
//! registration is taken over by another process with its id, or the follower stops, the broker stops.
//!
//! Shards reach it through [`QuorumHandle`], whose calls are plain flume messages usable from glommio.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use shardlog_net::peer::{decode_message, encode_message};
use shardlog_storage::LogNews;

use super::image::MetadataImage;
use crate::quorum::network::{CallError, PeerConnection, WireWrite};
use crate::quorum::service::{StartError, Voter, VoterSettings};
use crate::quorum::state::{BrokerEndpoint, Command, CommandError, ListenerEndpoint, NodeId};
use crate::quorum::wire::{MetadataDelta, WireFetch, WireFetchResult, WireWriteResult, kind};
use crate::security::cluster_tls::ClusterTls;
use crate::shutdown::Shutdown;

/// The file in the data dir naming the node id and incarnation of the process that last started on it
/// (`<node id> <incarnation>`).
pub const INCARNATION_FILE: &str = "broker-incarnation";
/// The embedded voter's directory inside the data dir (not a `<topic>-<partition>` name, so the storage
/// engine leaves it alone).
pub const QUORUM_DIR: &str = "quorum";
/// How long one metadata fetch waits for something new.
const FETCH_WAIT: Duration = Duration::from_secs(1);
/// How long connecting to a remote voter may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a topic change from a client may wait for its commit (then REQUEST_TIMED_OUT).
const ADMIN_WRITE_LIMIT: Duration = Duration::from_secs(30);
/// How long [`QuorumLink::stop`] waits for the link thread.
const STOP_LIMIT: Duration = Duration::from_secs(15);
/// Pause before retrying when no voter answered or there is no leader.
const RETRY_PAUSE: Duration = Duration::from_millis(200);
/// How long a stopping broker waits for its shards to answer the requests in hand before its
/// controlled shutdown (the shards' own limit is 10 s).
const CLIENTS_DONE_LIMIT: Duration = Duration::from_secs(11);
/// How long a stopping broker tries to get its controlled shutdown committed.
const CONTROLLED_SHUTDOWN_LIMIT: Duration = Duration::from_secs(5);

/// How the broker reaches the quorum.
#[derive(Debug, Clone)]
pub struct LinkSettings {
    pub node: NodeId,
    /// The address the broker registers for its peers (today also its advertised Kafka listener).
    pub endpoint: BrokerEndpoint,
    /// The broker's named Kafka listeners, as clients reach them (Kafka's `advertised.listeners`).
    pub listeners: Vec<ListenerEndpoint>,
    pub data_dir: PathBuf,
    /// Every voter, `(id, HOST:PORT)`; empty: this node is the whole quorum, without a quorum port.
    pub voters: Vec<(u64, String)>,
    pub heartbeat_interval: Duration,
    /// Stamped into registrations by the voters this node runs.
    pub session_timeout_ms: u64,
    /// Free space the voter this node runs keeps on its disk (see `VoterSettings::reserve_bytes`).
    pub quorum_reserve_bytes: u64,
    /// `auto.leader.rebalance.enable` of the voter this node runs.
    pub leader_rebalance: Option<crate::quorum::service::LeaderRebalance>,
    /// `--add-scram`: credentials the voter this node runs adds if it forms the cluster.
    pub bootstrap_scram: Vec<crate::quorum::security::ScramUpsertion>,
    /// Cluster mTLS to the remote voters and on the quorum port of the voter this node runs.
    pub cluster_tls: Option<Arc<ClusterTls>>,
}

/// Why the link could not start.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("voter {0}: {1}")]
    Voter(String, StartError),
    #[error("{path}: this data dir belongs to node {recorded}, not node {configured}")]
    OtherNode { path: PathBuf, recorded: u32, configured: u32 },
    #[error("start the quorum link thread: {0}")]
    Thread(std::io::Error),
    #[error(
        "--add-scram adds users when the quorum forms, and node {0} runs no quorum voter: give it to a node in \
         controller.quorum.voters"
    )]
    AddScramWithoutVoter(NodeId),
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
    /// False from the moment no heartbeat has been acknowledged for a whole session: the quorum will
    /// have fenced this broker and moved its leaderships, so it must not act as leader any more.
    in_session: Arc<AtomicBool>,
    /// Set when a topic record from before the quorum could not be wholly imported (see `import`).
    import_incomplete: Arc<AtomicBool>,
    /// Moves when what this broker leads may have changed: its session was lost or regained, or an image
    /// that changed the topics was published (see `follow`). Held fetches read again and find out.
    leadership_news: Arc<LogNews>,
    /// This process's incarnation, which its registration and every report about it carry.
    incarnation: u64,
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

    /// Whether this broker's session is alive as far as it knows (a heartbeat was acknowledged within
    /// the session timeout). A broker out of session leads nothing.
    pub fn in_session(&self) -> bool {
        self.in_session.load(Ordering::SeqCst)
    }

    /// What held fetches listen to for changes of what this broker leads.
    pub fn leadership_news(&self) -> &Arc<LogNews> {
        &self.leadership_news
    }

    /// Whether logs the metadata does not give to this broker may be set aside as strays: not while some
    /// topics of a record from before the quorum could not be imported (their logs would look like strays).
    pub fn strays_known(&self) -> bool {
        !self.import_incomplete.load(Ordering::SeqCst)
    }

    /// This process's incarnation (registered once [`QuorumHandle::registered_at`] says so).
    pub fn incarnation(&self) -> u64 {
        self.incarnation
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
    /// Disconnected when the link thread ends.
    ended: flume::Receiver<()>,
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
    /// Voters elsewhere, `(id, HOST:PORT)`, tried in turn (over cluster mTLS when on).
    Remote(Arc<Vec<(u64, String)>>, Option<Arc<ClusterTls>>),
}

impl QuorumLink {
    /// Starts the voter this node runs (if any) and the link thread. Every new metadata image goes to
    /// `images`; once `shutdown` is triggered the link asks for a controlled shutdown and ends.
    pub fn start(
        settings: LinkSettings,
        images: flume::Sender<Arc<MetadataImage>>,
        shutdown: Shutdown,
    ) -> Result<QuorumLink, LinkError> {
        let previous_incarnation = read_incarnation(&settings.data_dir, settings.node)?;
        let quorum_dir = settings.data_dir.join(QUORUM_DIR);
        let quorum = if settings.voters.is_empty() {
            let mut voter = VoterSettings::alone(settings.node.0 as u64, quorum_dir);
            voter.session_timeout_ms = settings.session_timeout_ms as i64;
            voter.reserve_bytes = settings.quorum_reserve_bytes;
            voter.leader_rebalance = settings.leader_rebalance;
            voter.bootstrap_scram = settings.bootstrap_scram.clone();
            voter.cluster_tls = settings.cluster_tls.clone();
            let voter = Voter::start(voter).map_err(|e| LinkError::Voter(settings.node.to_string(), e))?;
            Quorum::Embedded(Arc::new(voter))
        } else if let Some((_, addr)) = settings.voters.iter().find(|(id, _)| *id == settings.node.0 as u64) {
            let listen = resolve(addr).map_err(|e| LinkError::Voter(addr.clone(), e))?;
            let mut voter = VoterSettings::new(settings.node.0 as u64, quorum_dir, listen, settings.voters.clone());
            voter.session_timeout_ms = settings.session_timeout_ms as i64;
            voter.reserve_bytes = settings.quorum_reserve_bytes;
            voter.leader_rebalance = settings.leader_rebalance;
            voter.bootstrap_scram = settings.bootstrap_scram.clone();
            voter.cluster_tls = settings.cluster_tls.clone();
            let voter = Voter::start(voter).map_err(|e| LinkError::Voter(addr.clone(), e))?;
            Quorum::Embedded(Arc::new(voter))
        } else if !settings.bootstrap_scram.is_empty() {
            return Err(LinkError::AddScramWithoutVoter(settings.node));
        } else {
            Quorum::Remote(Arc::new(settings.voters.clone()), settings.cluster_tls.clone())
        };
        let (writes, write_requests) = flume::unbounded();
        let incarnation = uuid::Uuid::new_v4().as_u64_pair().0;
        let handle = QuorumHandle {
            incarnation,
            writes,
            registered_at: Arc::new(AtomicU64::new(u64::MAX)),
            in_session: Arc::new(AtomicBool::new(false)),
            import_incomplete: Arc::new(AtomicBool::new(false)),
            leadership_news: Arc::default(),
        };
        let (registered_at, in_session) = (handle.registered_at.clone(), handle.in_session.clone());
        let leadership_news = handle.leadership_news.clone();
        let import_incomplete = handle.import_incomplete.clone();
        let (ended_tx, ended) = flume::bounded::<()>(0);
        let thread = std::thread::Builder::new()
            .name("quorum-link".into())
            .spawn(move || {
                let _ended = ended_tx;
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a current-thread tokio runtime builds");
                let link = Link {
                    settings,
                    quorum,
                    latest: Arc::new(tokio::sync::watch::Sender::new(Arc::new(MetadataImage::default()))),
                    import_incomplete,
                    registered_at,
                    in_session,
                    leadership_news,
                    shutdown,
                    previous_incarnation,
                    incarnation,
                };
                runtime.block_on(link.run(images, write_requests));
            })
            .map_err(LinkError::Thread)?;
        Ok(QuorumLink { handle, thread: Some(thread), ended })
    }

    pub fn handle(&self) -> QuorumHandle {
        self.handle.clone()
    }

    /// Waits (a bounded time) for the link to end: it ends once shutdown is triggered and the controlled
    /// shutdown is done or given up, and stops the voter it runs.
    /// Returns false if it did not end in time (it is left running).
    pub fn stop(mut self) -> bool {
        if self.ended.recv_timeout(STOP_LIMIT) == Err(flume::RecvTimeoutError::Timeout) {
            tracing::warn!("the quorum link did not stop in time; leaving it");
            return false;
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        true
    }
}

fn resolve(addr: &str) -> Result<std::net::SocketAddr, StartError> {
    use std::net::ToSocketAddrs;
    let unresolved = |error| StartError::Listen { addr: std::net::SocketAddr::from(([0, 0, 0, 0], 0)), error };
    addr.to_socket_addrs().map_err(unresolved)?.next().ok_or_else(|| {
        unresolved(std::io::Error::new(std::io::ErrorKind::NotFound, format!("{addr} does not resolve")))
    })
}

/// The link thread's state.
pub(super) struct Link {
    settings: LinkSettings,
    quorum: Quorum,
    /// The follower's latest image (the import checks what the quorum already holds).
    latest: Arc<tokio::sync::watch::Sender<Arc<MetadataImage>>>,
    /// Set while topics of an old record could not be imported: their logs are then not strays.
    import_incomplete: Arc<AtomicBool>,
    registered_at: Arc<AtomicU64>,
    in_session: Arc<AtomicBool>,
    leadership_news: Arc<LogNews>,
    shutdown: Shutdown,
    previous_incarnation: Option<u64>,
    incarnation: u64,
}

impl Link {
    async fn run(self, images: flume::Sender<Arc<MetadataImage>>, write_requests: flume::Receiver<WriteRequest>) {
        let writer = {
            let quorum = self.quorum.clone();
            tokio::spawn(async move {
                while let Ok(request) = write_requests.recv_async().await {
                    let quorum = quorum.clone();
                    tokio::spawn(async move {
                        let result =
                            tokio::time::timeout(ADMIN_WRITE_LIMIT, quorum.write(request.command, ADMIN_WRITE_LIMIT))
                                .await
                                .unwrap_or_else(|_| {
                                    WireWriteResult::Failed(format!("not committed within {ADMIN_WRITE_LIMIT:?}"))
                                });
                        let _ = request.reply.send(result);
                    });
                }
            })
        };
        // Without the follower the broker would serve frozen metadata: if it ends, the broker stops.
        let follower = tokio::spawn(follow(self.quorum.clone(), images, self.latest.clone()));
        let follower_abort = follower.abort_handle();
        let watch = {
            let shutdown = self.shutdown.clone();
            tokio::spawn(async move {
                let outcome = follower.await;
                if !shutdown.is_triggered() {
                    tracing::error!(?outcome, "the metadata follower stopped; stopping the broker");
                    shutdown.trigger();
                }
            })
        };
        self.lifecycle().await;
        follower_abort.abort();
        watch.abort();
        writer.abort();
    }

    /// A write that gives up after `limit`, or at once when shutdown is triggered (it may still commit).
    async fn write(&self, command: Command, limit: Duration) -> WireWriteResult {
        tokio::select! {
            result = self.quorum.write(command, limit) => result,
            _ = tokio::time::sleep(limit) => WireWriteResult::Failed(format!("no answer within {limit:?}")),
            _ = wait_for_shutdown(&self.shutdown) => WireWriteResult::Failed("the broker is stopping".into()),
        }
    }

    /// Register, heartbeat until shutdown, then ask for a controlled shutdown.
    async fn lifecycle(&self) {
        let settings = &self.settings;
        let incarnation = self.incarnation;
        // Recorded before registering: if this process dies, the next one on this data takes over from it.
        crate::quorum::log_store::replace_file(
            &settings.data_dir.join(INCARNATION_FILE),
            format!("{} {incarnation}\n", settings.node).as_bytes(),
        );
        let register = Command::RegisterBrokerListeners {
            id: settings.node,
            endpoint: settings.endpoint.clone(),
            listeners: settings.listeners.clone(),
            incarnation,
            previous_incarnation: self.previous_incarnation,
            // Stamped by the voter that proposes it.
            now_ms: 0,
            session_timeout_ms: 0,
        };
        let call_limit = self.heartbeat_limit();
        let mut registered = false;
        let session = Duration::from_millis(settings.session_timeout_ms);
        let mut acknowledged = tokio::time::Instant::now();
        while !self.shutdown.is_triggered() {
            let command = if registered {
                Command::BrokerHeartbeat { id: settings.node, incarnation, now_ms: 0 }
            } else {
                register.clone()
            };
            let pause = match self.write(command, call_limit).await {
                WireWriteResult::Applied { index, outcome: Ok(_) } => {
                    acknowledged = tokio::time::Instant::now();
                    if registered && !self.in_session.swap(true, Ordering::SeqCst) {
                        self.leadership_news.bump();
                        tracing::info!(node = %settings.node, "heartbeats acknowledged again; back in session");
                    }
                    if !registered {
                        registered = true;
                        let index = super::import::import_topics_file(self, index, incarnation).await;
                        self.in_session.store(true, Ordering::SeqCst);
                        self.registered_at.store(index, Ordering::SeqCst);
                        self.leadership_news.bump();
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
                        CommandError::StaleBrokerEpoch { .. } => {
                            // Another process with this id registered after our session expired: it owns the
                            // id now, and two brokers must never serve as one.
                            tracing::error!(node = %settings.node, "another process took over this node id; stopping");
                            self.shutdown.trigger();
                            return;
                        }
                        e => {
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
            if registered && acknowledged.elapsed() >= session && self.in_session.swap(false, Ordering::SeqCst) {
                self.leadership_news.bump();
                tracing::error!(
                    node = %settings.node,
                    "no heartbeat acknowledged for a whole session: the quorum has fenced this broker; leading nothing"
                );
            }
            sleep_unless_stopping(pause, &self.shutdown).await;
        }
        if registered {
            // Leaderships are given up only once the requests clients sent before the stop are answered:
            // a request taken in is not refused because its broker was on the way out.
            let clients_done = async {
                while !self.shutdown.clients_done() {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            };
            let _ = tokio::time::timeout(CLIENTS_DONE_LIMIT, clients_done).await;
            self.controlled_shutdown(incarnation).await;
        }
    }

    async fn controlled_shutdown(&self, incarnation: u64) {
        let node = self.settings.node;
        let attempt = async {
            loop {
                let command = Command::ControlledShutdown { id: node, incarnation };
                match self.quorum.write(command, CONTROLLED_SHUTDOWN_LIMIT).await {
                    WireWriteResult::Applied { outcome, .. } => return outcome.map(|_| ()),
                    _ => tokio::time::sleep(RETRY_PAUSE).await,
                }
            }
        };
        match tokio::time::timeout(CONTROLLED_SHUTDOWN_LIMIT, attempt).await {
            Ok(Ok(())) => tracing::info!(node = %node, "controlled shutdown: leaderships moved, broker fenced"),
            Ok(Err(e)) => tracing::warn!(node = %node, error = %e, "controlled shutdown refused"),
            // No quorum: when a whole cluster stops, the last brokers find the other voters gone. Nothing
            // is lost: the quorum fences this broker when its session expires.
            Err(_) => {
                tracing::info!(node = %node, "controlled shutdown not committed (no quorum); the session will expire")
            }
        }
    }

    pub(super) fn settings(&self) -> &LinkSettings {
        &self.settings
    }

    pub(super) fn shutdown(&self) -> &Shutdown {
        &self.shutdown
    }

    pub(super) fn mark_import_incomplete(&self) {
        self.import_incomplete.store(true, Ordering::SeqCst);
    }

    /// Waits (at most `limit`) for the follower's image to include log index `index`.
    pub(super) async fn image_at(&self, index: u64, limit: Duration) -> Option<Arc<MetadataImage>> {
        let mut latest = self.latest.subscribe();
        let reached = tokio::time::timeout(limit, async {
            latest.wait_for(|image| image.applied >= Some(index)).await.map(|image| image.clone())
        });
        reached.await.ok()?.ok()
    }

    /// A heartbeat on the import's behalf (the import may outlast a heartbeat interval); its outcome is
    /// the next regular heartbeat's business.
    pub(super) async fn heartbeat(&self, incarnation: u64) {
        let command = Command::BrokerHeartbeat { id: self.settings.node, incarnation, now_ms: 0 };
        let _ = self.write(command, self.heartbeat_limit()).await;
    }

    /// A registration or heartbeat that takes longer than a third of the session is given up and tried
    /// again, so that one slow attempt does not cost the session.
    fn heartbeat_limit(&self) -> Duration {
        Duration::from_millis((self.settings.session_timeout_ms / 3).max(100))
    }

    /// Commits a command on the link's behalf (the topic import), with the admin limit.
    pub(super) async fn commit(&self, command: Command) -> WireWriteResult {
        self.write(command, ADMIN_WRITE_LIMIT).await
    }
}

async fn wait_for_shutdown(shutdown: &Shutdown) {
    while !shutdown.is_triggered() {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn sleep_unless_stopping(pause: Duration, shutdown: &Shutdown) {
    tokio::select! {
        _ = tokio::time::sleep(pause) => {}
        _ = wait_for_shutdown(shutdown) => {}
    }
}

/// The incarnation the last process on this data dir registered with; refuses a data dir of another node.
fn read_incarnation(data_dir: &Path, node: NodeId) -> Result<Option<u64>, LinkError> {
    let path = data_dir.join(INCARNATION_FILE);
    let Ok(text) = std::fs::read_to_string(&path) else { return Ok(None) };
    let mut fields = text.split_whitespace().map(str::parse::<u64>);
    match (fields.next(), fields.next()) {
        (Some(Ok(recorded)), Some(Ok(incarnation))) if recorded == node.0 as u64 => Ok(Some(incarnation)),
        (Some(Ok(recorded)), Some(Ok(_))) => {
            Err(LinkError::OtherNode { path, recorded: recorded as u32, configured: node.0 })
        }
        // The first form of the record: the incarnation alone.
        (Some(Ok(incarnation)), None) => Ok(Some(incarnation)),
        _ => {
            tracing::warn!(path = %path.display(), "unreadable incarnation record; registering as a new process");
            Ok(None)
        }
    }
}

/// Fetches what the quorum applied after the image's index, sending every new image on. Ends only when
/// the voter this broker runs has stopped (the broker then stops too).
async fn follow(
    quorum: Quorum,
    images: flume::Sender<Arc<MetadataImage>>,
    latest: Arc<tokio::sync::watch::Sender<Arc<MetadataImage>>>,
) {
    let mut image = MetadataImage::default();
    let mut voter = 0;
    loop {
        let fetched = match &quorum {
            Quorum::Embedded(voter) => match voter.fetch_async(image.applied, FETCH_WAIT).await {
                Some(fetched) => Some(fetched),
                None => return,
            },
            Quorum::Remote(voters, tls) => fetch_remote(voters, tls.as_deref(), &mut voter, image.applied).await,
        };
        let Some(fetched) = fetched else {
            tokio::time::sleep(RETRY_PAUSE).await;
            continue;
        };
        let controller = fetched.leader.map(|id| NodeId(id as u32));
        let moved = image.apply(fetched.delta);
        if moved || controller != image.controller {
            image.controller = controller;
            let image = Arc::new(image.clone());
            latest.send_replace(image.clone());
            if images.send_async(image).await.is_err() {
                return;
            }
        }
    }
}

/// One fetch from the remote voters, starting with `voters[*current]`, which then becomes the leader the
/// answer names: a voter cut off from the others would never have news, the leader always has the latest.
async fn fetch_remote(
    voters: &[(u64, String)],
    tls: Option<&ClusterTls>,
    current: &mut usize,
    after: Option<u64>,
) -> Option<WireFetchResult> {
    let body = encode_message(&WireFetch { after, wait_ms: FETCH_WAIT.as_millis() as u32 });
    for attempt in 0..voters.len() {
        let at = (*current + attempt) % voters.len();
        let (node, addr) = (voters[at].0, &voters[at].1);
        match call((node, addr.as_str(), tls), kind::FETCH, &body, kind::FETCH_RESULT, FETCH_WAIT + CONNECT_TIMEOUT * 5)
            .await
        {
            Ok(result) => {
                let result: WireFetchResult = result;
                // Follow the leader an answer with news names; after an answer without news, or from a voter
                // that knows no leader, try the next voter: a voter cut off from the others (even one that
                // still believes it leads) never has news.
                let named = result.leader.and_then(|id| voters.iter().position(|(v, _)| *v == id));
                *current = match (&result.delta, named) {
                    (MetadataDelta::Unchanged, _) | (_, None) => (at + 1) % voters.len(),
                    (_, Some(leader)) => leader,
                };
                return Some(result);
            }
            Err(e) => tracing::debug!(%addr, error = %e.error, "metadata fetch failed"),
        }
    }
    None
}

impl Quorum {
    /// Commits `command`; remote calls give up after `limit`.
    async fn write(&self, command: Command, limit: Duration) -> WireWriteResult {
        match self {
            Quorum::Embedded(voter) => voter.write_async(command).await,
            Quorum::Remote(voters, tls) => {
                let body = encode_message(&WireWrite { command, forwarded: false });
                for (node, addr) in voters.iter() {
                    match call((*node, addr.as_str(), tls.as_deref()), kind::WRITE, &body, kind::WRITE_RESULT, limit)
                        .await
                    {
                        Ok(WireWriteResult::NoLeader) => continue,
                        Ok(result) => return result,
                        // Never reached that voter: the command was not proposed; the next may take it.
                        Err(Failure { sent: false, error }) => tracing::debug!(%addr, %error, "voter unreachable"),
                        // Sent but not answered: it may have been committed. Sending it to another voter
                        // could apply it twice; the caller decides.
                        Err(Failure { sent: true, error }) => {
                            return WireWriteResult::Failed(format!("voter {addr}: {error}"));
                        }
                    }
                }
                WireWriteResult::NoLeader
            }
        }
    }
}

/// A failed call to a remote voter, and whether the request may have reached it.
#[derive(Debug)]
struct Failure {
    sent: bool,
    error: CallError,
}

/// One request to a remote voter (its id, address and the cluster mTLS to reach it over) over a fresh
/// connection.
async fn call<T>(
    to: (u64, &str, Option<&ClusterTls>),
    request: u16,
    body: &[u8],
    answer: u16,
    timeout: Duration,
) -> Result<T, Failure>
where
    T: rkyv::Archive,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>>
        + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rkyv::rancor::Error>>,
{
    let unsent = |error| Failure { sent: false, error };
    let (node, addr, tls) = to;
    let mut conn = match tokio::time::timeout(CONNECT_TIMEOUT, PeerConnection::connect(addr, node, tls)).await {
        Ok(Ok(conn)) => conn,
        Ok(Err(e)) => return Err(unsent(CallError::Io(e))),
        Err(_) => return Err(unsent(CallError::Timeout(CONNECT_TIMEOUT))),
    };
    let sent = |error| Failure { sent: true, error };
    let frame = conn.call(request, body, timeout).await.map_err(sent)?;
    if frame.kind != answer {
        return Err(sent(CallError::Frame(shardlog_net::peer::PeerFrameError::UnexpectedType(frame.kind))));
    }
    decode_message(&frame.body).map_err(|e| sent(CallError::Frame(e)))
}
