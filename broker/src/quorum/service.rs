//! Running a voter: openraft on its own thread with a current-thread tokio runtime, its durable log and
//! state machine in a directory, the quorum port on a TCP listener, and a handle that other threads (shards,
//! the admin CLI, tests) use through flume channels.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use openraft::{BasicNode, Config, Raft, SnapshotPolicy};

use super::fencing::FencingWatch;
use super::log_store::LogStore;
use super::network::{self, Network};
use super::state::{ClusterState, Command};
use super::state_machine::StateMachineStore;
use super::wire::{WireFetchResult, WireWriteResult};

/// How a voter runs.
#[derive(Debug, Clone)]
pub struct VoterSettings {
    pub node_id: u64,
    /// Raft log, vote and snapshot files.
    pub dir: PathBuf,
    /// The quorum port; `None` for a voter that is the whole quorum and serves only its own process.
    pub listen: Option<SocketAddr>,
    /// Every voter, this one included: id and `HOST:PORT` of its quorum port.
    pub voters: Vec<(u64, String)>,
    /// Raft timing (see [`VoterSettings::raft_config`]).
    pub heartbeat_ms: u64,
    pub election_timeout_min_ms: u64,
    /// A snapshot is taken after this many entries since the last one; the log before it is dropped
    /// (but for the last 100 entries), and a voter further behind is sent the snapshot.
    pub snapshot_after_entries: u64,
    /// `broker.session.timeout.ms`: a broker not heard from for this long is fenced by the leader.
    pub session_timeout_ms: i64,
    /// Commands that change topics are refused while the disk holding `dir` has less free space than
    /// this (see [`crate::disk_space::quorum_reserve_bytes`]): the log's appends must never meet a
    /// full disk.
    pub reserve_bytes: u64,
    /// `auto.leader.rebalance.enable`: what the leader checks, and how often; `None` when off.
    pub leader_rebalance: Option<LeaderRebalance>,
    /// `--add-scram`: credentials added when this voter forms the cluster (see [`super::bootstrap`]).
    pub bootstrap_scram: Vec<super::security::ScramUpsertion>,
    /// Cluster mTLS on the quorum port and to the other voters; `None`: plain TCP.
    pub cluster_tls: Option<std::sync::Arc<crate::security::cluster_tls::ClusterTls>>,
}

/// Kafka's automatic preferred-leader election: every `interval`, a live broker that does not lead more
/// than `imbalance_percent` of the partitions whose preferred (first) replica it is gets those back,
/// where it is in sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaderRebalance {
    pub interval: Duration,
    pub imbalance_percent: u32,
}

impl Default for LeaderRebalance {
    /// Kafka's defaults: every 300 s, above 10%.
    fn default() -> Self {
        LeaderRebalance { interval: Duration::from_secs(300), imbalance_percent: 10 }
    }
}

impl VoterSettings {
    /// Settings with the default timing (heartbeats every 100 ms, elections after 500-1000 ms of silence)
    /// and a snapshot every 1000 entries.
    pub fn new(node_id: u64, dir: PathBuf, listen: SocketAddr, voters: Vec<(u64, String)>) -> Self {
        VoterSettings {
            node_id,
            dir,
            listen: Some(listen),
            voters,
            heartbeat_ms: 100,
            election_timeout_min_ms: 500,
            snapshot_after_entries: 1000,
            session_timeout_ms: 9000,
            reserve_bytes: crate::disk_space::quorum_reserve_bytes(1 << 30),
            leader_rebalance: Some(LeaderRebalance::default()),
            bootstrap_scram: Vec::new(),
            cluster_tls: None,
        }
    }

    /// A voter that is the whole quorum, without a quorum port (a single-node broker's own quorum).
    pub fn alone(node_id: u64, dir: PathBuf) -> Self {
        let mut settings =
            Self::new(node_id, dir, SocketAddr::from(([127, 0, 0, 1], 0)), vec![(node_id, String::new())]);
        settings.listen = None;
        settings
    }

    fn raft_config(&self) -> Config {
        Config {
            cluster_name: "shardlog".into(),
            heartbeat_interval: self.heartbeat_ms,
            election_timeout_min: self.election_timeout_min_ms,
            election_timeout_max: self.election_timeout_min_ms * 2,
            snapshot_policy: SnapshotPolicy::LogsSinceLast(self.snapshot_after_entries),
            max_in_snapshot_log_to_keep: 100,
            // A snapshot's last chunk waits for the follower to decode it and sync three files.
            install_snapshot_timeout: 5000,
            ..Config::default()
        }
    }
}

enum Request {
    Write(Command, flume::Sender<WireWriteResult>),
    Fetch(Option<u64>, Duration, flume::Sender<WireFetchResult>),
    State(flume::Sender<(ClusterState, Option<u64>)>),
    Leader(flume::Sender<Option<u64>>),
}

/// A running voter. Dropping it (or [`Voter::stop`]) shuts it down.
#[derive(Debug)]
pub struct Voter {
    requests: Option<flume::Sender<Request>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Request::Write(c, _) => f.debug_tuple("Write").field(c).finish(),
            Request::Fetch(after, _, _) => f.debug_tuple("Fetch").field(after).finish(),
            Request::State(_) => f.write_str("State"),
            Request::Leader(_) => f.write_str("Leader"),
        }
    }
}

/// Refuses to start with other voter ids than the membership this voter's log (or, failing that, its
/// snapshot) holds: Raft would go on with that membership (a single node's quorum of one stays one), and
/// the voters named now would form a second quorum with a second metadata history. Changing the voters
/// is not supported. A new voter (no membership yet) takes the configured ids.
fn check_voter_ids(settings: &VoterSettings, log: &LogStore, state: &StateMachineStore) -> Result<(), StartError> {
    let Some(mut recorded) = log.last_membership_voters().or_else(|| state.snapshot_membership_voters()) else {
        return Ok(());
    };
    let mut wanted: Vec<u64> = settings.voters.iter().map(|(id, _)| *id).collect();
    recorded.sort_unstable();
    wanted.sort_unstable();
    if recorded == wanted {
        return Ok(());
    }
    let list = |ids: &[u64]| ids.iter().map(u64::to_string).collect::<Vec<_>>().join(",");
    Err(StartError::OtherVoters { dir: settings.dir.clone(), recorded: list(&recorded), wanted: list(&wanted) })
}

/// Why a voter could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(
        "quorum directory {dir} belongs to a quorum of voters {recorded}, not {wanted}: changing the voters is not supported"
    )]
    OtherVoters { dir: PathBuf, recorded: String, wanted: String },
    // The I/O error is part of the message (not a separate cause), so it is printed once.
    #[error("quorum directory {dir}: {error}")]
    Storage { dir: PathBuf, error: std::io::Error },
    #[error("quorum port {addr}: {error}")]
    Listen { addr: SocketAddr, error: std::io::Error },
    #[error("raft: {0}")]
    Raft(String),
}

impl Voter {
    /// Opens the voter's files, binds its port and starts Raft on a thread of its own. A voter whose log
    /// is empty proposes the initial membership (every voter in `voters`); openraft ignores it where a
    /// log exists.
    pub fn start(settings: VoterSettings) -> Result<Voter, StartError> {
        let storage_error = |error| StartError::Storage { dir: settings.dir.clone(), error };
        let (log_store, recovery) = LogStore::open(&settings.dir).map_err(storage_error)?;
        let state_machine = StateMachineStore::open(&settings.dir).map_err(storage_error)?;
        check_voter_ids(&settings, &log_store, &state_machine)?;
        let std_listener = match settings.listen {
            Some(addr) => {
                let listen_error = |error| StartError::Listen { addr, error };
                let listener = std::net::TcpListener::bind(addr).map_err(listen_error)?;
                listener.set_nonblocking(true).map_err(listen_error)?;
                Some(listener)
            }
            None => None,
        };
        tracing::info!(
            node = settings.node_id,
            entries = recovery.entries,
            cut_bytes = recovery.cut_bytes,
            "quorum log opened"
        );

        let (requests, inbox) = flume::unbounded();
        let (ready_tx, ready_rx) = flume::bounded(1);
        let thread = std::thread::Builder::new()
            .name(format!("quorum-{}", settings.node_id))
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                    Ok(r) => r,
                    Err(e) => {
                        let _ = ready_tx.send(Err(StartError::Raft(format!("tokio runtime: {e}"))));
                        return;
                    }
                };
                runtime.block_on(run(settings, log_store, state_machine, std_listener, inbox, ready_tx));
            })
            .map_err(|e| StartError::Raft(format!("spawn the quorum thread: {e}")))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Voter { requests: Some(requests), thread: Some(thread) }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StartError::Raft("the quorum thread ended while starting".into())),
        }
    }

    fn ask<T>(&self, make: impl FnOnce(flume::Sender<T>) -> Request) -> Option<flume::Receiver<T>> {
        let (tx, rx) = flume::bounded(1);
        self.requests.as_ref()?.send(make(tx)).ok()?;
        Some(rx)
    }

    /// Commits a command (through the leader) and returns how it applied. Blocks the calling thread.
    pub fn write(&self, command: Command) -> WireWriteResult {
        futures_lite::future::block_on(self.write_async(command))
    }

    /// [`Voter::write`] for async callers on any runtime.
    pub async fn write_async(&self, command: Command) -> WireWriteResult {
        match self.ask(|tx| Request::Write(command, tx)) {
            Some(rx) => rx.recv_async().await.unwrap_or_else(|_| WireWriteResult::Failed("the voter stopped".into())),
            None => WireWriteResult::Failed("the voter stopped".into()),
        }
    }

    /// What this voter applied after `after`, waiting up to `wait` for something new (see
    /// [`network::fetch`]); `None` once the voter has stopped.
    pub async fn fetch_async(&self, after: Option<u64>, wait: Duration) -> Option<WireFetchResult> {
        self.ask(|tx| Request::Fetch(after, wait, tx))?.recv_async().await.ok()
    }

    /// This voter's copy of the cluster state and the index of the last command applied to it.
    pub fn state(&self) -> Option<(ClusterState, Option<u64>)> {
        self.ask(Request::State)?.recv().ok()
    }

    /// The current Raft leader as this voter knows it.
    pub fn leader(&self) -> Option<u64> {
        self.ask(Request::Leader)?.recv().ok().flatten()
    }

    /// Shuts Raft down and waits for the thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.requests.take();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Voter {
    fn drop(&mut self) {
        self.shutdown();
    }
}

async fn run(
    settings: VoterSettings,
    log_store: LogStore,
    state_machine: StateMachineStore,
    listener: Option<std::net::TcpListener>,
    inbox: flume::Receiver<Request>,
    ready: flume::Sender<Result<(), StartError>>,
) {
    let config = match settings.raft_config().validate() {
        Ok(c) => Arc::new(c),
        Err(e) => {
            let _ = ready.send(Err(StartError::Raft(e.to_string())));
            return;
        }
    };
    let network = Network::new(settings.cluster_tls.clone());
    let raft = match Raft::new(settings.node_id, config, network, log_store.clone(), state_machine.clone()).await {
        Ok(r) => r,
        Err(e) => {
            let _ = ready.send(Err(StartError::Raft(e.to_string())));
            return;
        }
    };
    let listener = match listener.map(tokio::net::TcpListener::from_std).transpose() {
        Ok(l) => l,
        Err(error) => {
            let addr = settings.listen.expect("a listener was bound");
            let _ = ready.send(Err(StartError::Listen { addr, error }));
            return;
        }
    };
    let served = network::Served {
        node: settings.node_id,
        session_timeout_ms: settings.session_timeout_ms,
        dir: settings.dir.clone(),
        reserve_bytes: settings.reserve_bytes,
        raft: raft.clone(),
        log: log_store,
        state: state_machine.clone(),
        voters: Arc::new(settings.voters.iter().map(|(id, _)| *id).collect()),
        tls: settings.cluster_tls.clone(),
    };
    let server = listener.map(|listener| tokio::spawn(network::serve(listener, served.clone())));
    let fencing = tokio::spawn(fence_expired_sessions(served.clone()));
    let reporting = tokio::spawn(report_raft_metrics(raft.clone()));
    let rebalancing = settings.leader_rebalance.map(|r| tokio::spawn(rebalance_leaders(served.clone(), r)));
    let members: BTreeMap<u64, BasicNode> =
        settings.voters.iter().map(|(id, addr)| (*id, BasicNode { addr: addr.clone() })).collect();
    // Only a pristine voter proposes the membership: openraft logs an ERROR when asked on a voter that
    // has a log or a vote (every start but the first).
    let pristine = matches!(raft.is_initialized().await, Ok(false));
    // The credentials of `--add-scram` belong to the cluster's formation: marked before it, so a crash
    // before they are committed does not lose them; never added by a later start.
    let bootstrap = match settings.bootstrap_scram.is_empty() {
        true => false,
        false if pristine => {
            super::bootstrap::mark_pending(&settings.dir);
            true
        }
        false => super::bootstrap::pending(&settings.dir),
    };
    match if pristine { raft.initialize(members).await } else { Ok(()) } {
        Ok(()) => {}
        // Another voter's vote request arrived first: the cluster is forming without this proposal.
        Err(openraft::error::RaftError::APIError(openraft::error::InitializeError::NotAllowed(_))) => {}
        Err(e) => tracing::warn!(node = settings.node_id, error = %e, "quorum: initial membership not proposed"),
    }
    let bootstrapping = bootstrap
        .then(|| tokio::spawn(super::bootstrap::add_credentials(served.clone(), settings.bootstrap_scram.clone())));
    let _ = ready.send(Ok(()));
    while let Ok(request) = inbox.recv_async().await {
        match request {
            Request::Write(command, reply) => {
                let served = served.clone();
                tokio::spawn(async move {
                    let _ = reply.send(network::write(&served, command, false).await);
                });
            }
            Request::Fetch(after, wait, reply) => {
                let served = served.clone();
                tokio::spawn(async move {
                    let _ = reply.send(network::fetch(&served, after, wait).await);
                });
            }
            Request::State(reply) => {
                let (state, applied) = state_machine.state();
                let _ = reply.send((state, applied.map(|l| l.index)));
            }
            Request::Leader(reply) => {
                let _ = reply.send(raft.current_leader().await);
            }
        }
    }
    if let Some(server) = server {
        server.abort();
    }
    fencing.abort();
    reporting.abort();
    if let Some(bootstrapping) = bootstrapping {
        bootstrapping.abort();
    }
    if let Some(rebalancing) = rebalancing {
        rebalancing.abort();
    }
    if let Err(e) = raft.shutdown().await {
        tracing::warn!(node = settings.node_id, error = %e, "quorum shutdown");
    }
}

/// Sets the quorum's gauges from Raft's own metrics every second: this voter's role and term, the last
/// log index, the index applied, and counts changes of leader it sees.
async fn report_raft_metrics(raft: Raft<super::wire::QuorumConfig>) {
    metrics::describe_gauge!("shardlog_quorum_leader", "1 while this node's voter leads the metadata quorum");
    metrics::describe_gauge!(
        "shardlog_quorum_role",
        "this voter's Raft role: 0 follower, 1 candidate, 2 leader, 3 learner"
    );
    metrics::describe_gauge!("shardlog_quorum_term", "this voter's Raft term");
    metrics::describe_gauge!("shardlog_quorum_last_log_index", "the last index in this voter's Raft log");
    metrics::describe_gauge!("shardlog_quorum_applied_index", "the last Raft index this voter applied (committed)");
    metrics::describe_counter!("shardlog_quorum_leader_changes_total", "changes of the quorum's leader seen here");
    let (leader, role, term) = (
        metrics::gauge!("shardlog_quorum_leader"),
        metrics::gauge!("shardlog_quorum_role"),
        metrics::gauge!("shardlog_quorum_term"),
    );
    let (last_log, applied) =
        (metrics::gauge!("shardlog_quorum_last_log_index"), metrics::gauge!("shardlog_quorum_applied_index"));
    let changes = metrics::counter!("shardlog_quorum_leader_changes_total");
    let mut known_leader = None;
    loop {
        let now = raft.metrics().borrow().clone();
        let state = match now.state {
            openraft::ServerState::Follower => 0.0,
            openraft::ServerState::Candidate => 1.0,
            openraft::ServerState::Leader => 2.0,
            openraft::ServerState::Learner | openraft::ServerState::Shutdown => 3.0,
        };
        role.set(state);
        leader.set(if now.state == openraft::ServerState::Leader { 1.0 } else { 0.0 });
        term.set(now.current_term as f64);
        last_log.set(now.last_log_index.map_or(-1.0, |i| i as f64));
        applied.set(now.last_applied.map_or(-1.0, |l| l.index as f64));
        if now.current_leader.is_some() && now.current_leader != known_leader {
            if known_leader.is_some() {
                changes.increment(1);
            }
            known_leader = now.current_leader;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// While this voter leads, every `rebalance.interval`: moves leadership back to preferred replicas where
/// [`crate::quorum::state::ClusterState::preferred_elections`] finds a broker leading too few of its own.
async fn rebalance_leaders(served: network::Served, rebalance: LeaderRebalance) {
    loop {
        tokio::time::sleep(rebalance.interval).await;
        if served.raft.current_leader().await != Some(served.node) {
            continue;
        }
        if served.state.state().0.preferred_elections(rebalance.imbalance_percent).is_empty() {
            continue;
        }
        if !still_leading(&served).await {
            continue;
        }
        let (state, _) = served.state.state();
        let elections = state.preferred_elections(rebalance.imbalance_percent);
        if !elections.is_empty() {
            tracing::info!(partitions = elections.len(), "quorum: moving leadership back to preferred replicas");
        }
        for election in elections {
            if let Err(e) = served.raft.client_write(election).await {
                tracing::debug!(error = %e, "quorum: preferred election not committed (no longer leader?)");
            }
        }
    }
}

/// While this voter leads: fences every broker whose session expired (no registration or heartbeat for
/// `broker.session.timeout.ms` by this voter's clock), which moves its leaderships away. It fences only
/// for silence it observed as leader ([`FencingWatch`]: a new leader, or one whose timer stopped, first
/// waits a whole session), and only after a majority has confirmed it still leads, with what was
/// committed before applied here: a leader that slept through its own deposition must neither act nor
/// say anything as leader.
async fn fence_expired_sessions(served: network::Served) {
    let timeout = Duration::from_millis(served.session_timeout_ms as u64);
    let mut watch = FencingWatch::new(timeout);
    loop {
        let slept_at = Instant::now();
        tokio::time::sleep(watch.period()).await;
        let leading = served.raft.current_leader().await == Some(served.node);
        if !watch.may_fence(slept_at, Instant::now(), leading) {
            continue;
        }
        if served.state.state().0.expired_sessions(network::now_ms(), served.session_timeout_ms).is_empty() {
            continue;
        }
        if !still_leading(&served).await {
            continue;
        }
        let (state, _) = served.state.state();
        let now = network::now_ms();
        for fence in state.expired_sessions(now, served.session_timeout_ms) {
            if let Command::FenceBroker { id, incarnation, last_heartbeat_ms } = &fence {
                tracing::warn!(
                    broker = %id,
                    incarnation,
                    silent_ms = now - last_heartbeat_ms,
                    "quorum: broker session expired; fencing it"
                );
            }
            if let Err(e) = served.raft.client_write(fence).await {
                tracing::debug!(error = %e, "quorum: fencing not committed (no longer leader?)");
            }
        }
    }
}

/// How long a leader waits for a majority to confirm its leadership before it gives up acting as leader
/// (until its next look).
const LEADERSHIP_CHECK_LIMIT: Duration = Duration::from_secs(5);

/// Whether a majority of voters confirms that this voter still leads (openraft's read-index: a heartbeat
/// round), with every entry committed before the check applied here.
async fn still_leading(served: &network::Served) -> bool {
    match tokio::time::timeout(LEADERSHIP_CHECK_LIMIT, served.raft.ensure_linearizable()).await {
        Ok(Ok(_)) => true,
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "quorum: leadership not confirmed; nothing done as leader");
            false
        }
        Err(_) => false,
    }
}
