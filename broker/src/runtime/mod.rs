//! The shard runtime: one glommio executor per shard, pinned to a core when there are enough cores,
//! each accepting connections on every Kafka listener and serving them to the end.
//!
//! The listeners are bound and listening from the start ([`listeners`]). Every shard gets a duplicate of
//! each listener's descriptor and accepts once the broker is ready to serve; connections made before wait
//! in the backlog (as Kafka's do until its request handlers start).
//!
//! Shutdown: the process's signal thread sets [`Shutdown`]; every shard stops accepting and lets its
//! connections finish the requests in hand. Only when every shard has done so do the shards close their
//! logs (a request on one shard may still need a partition another shard owns) and does the quorum link
//! ask for the controlled shutdown that gives up this broker's leaderships.
//!
//! A rule for every task spawned on a shard: one that waits on something another thread wakes (a flume
//! reply from another shard or from the quorum link) is detached, never awaited or dropped through its
//! glommio task handle. glommio 0.9 frees a finished task twice when its handle is dropped while another
//! thread drops the task's last waker (see `connection::spawn_handler`).

mod authentication;
mod connection;
pub mod limits;
mod listeners;
mod offline;
pub(crate) mod peer_calls;
mod replication;
mod throttling;

use std::cell::Cell;
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use futures_lite::future;
use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement};

use shardlog_storage::fs::dma::DmaFs;
use shardlog_storage::{LogDir, LogDirScope, SystemClock, TopicPartition};

use crate::config::BrokerConfig;
use crate::context::{AdminRequest, BrokerContext};
use crate::handlers;
use crate::host_check::system::RESERVED_FILES;
use crate::logging::Throttle;
use crate::metadata::image::MetadataImage;
use crate::metadata::link::{LinkSettings, QuorumLink};
use crate::quorum::state::{BrokerEndpoint, ListenerEndpoint, NodeId};
use crate::security::cluster_tls::ClusterTls;
use crate::shard::{self, PartitionRequest};
use crate::shutdown::Shutdown;
use limits::Clients;
use listeners::{ServedListener, bind_listeners, serve_listeners};

/// Triggers shutdown if dropped while its thread panics.
struct StopOnFailure(Shutdown);

impl Drop for StopOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.trigger();
        }
    }
}

/// Shards still finishing their connections; each shard counts itself out once, and the last one out
/// marks the clients done.
struct Drained {
    count: Option<Arc<AtomicUsize>>,
    shutdown: Shutdown,
}

impl Drained {
    fn done(&mut self) -> Arc<AtomicUsize> {
        let count = self.count.take().expect("counted out once");
        if count.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.shutdown.mark_clients_done();
        }
        count
    }
}

impl Drop for Drained {
    fn drop(&mut self) {
        if self.count.is_some() {
            self.done();
        }
    }
}

/// How long a stopping shard waits for its connections to finish before closing its logs anyway.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// Runs the broker's shards until shutdown; returns once every shard has stopped and closed its logs.
pub fn run(config: BrokerConfig, shutdown: Shutdown) -> Result<()> {
    let clients = client_limits(&config);
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("create data dir {}", config.data_dir.display()))?;
    let lock = lock_data_dir(&config.data_dir)?;
    // Before anything is bound or started: without direct I/O no log could be opened.
    crate::host_check::data_dir::require_direct_io(&config.data_dir)?;
    warn_if_volatile(&config.data_dir);
    if config.test_acks_all_before_replication {
        tracing::warn!(
            "test.acks.all.before.replication is set: acks=all is answered without the followers and loses writes when a leader fails; for tests only"
        );
    }
    let cluster_tls = ClusterTls::load(&config.cluster_tls, config.node_id).context("cluster mTLS")?;
    if cluster_tls.is_some() {
        tracing::info!(
            node = config.node_id,
            "cluster mTLS: replication and quorum peers must present a node certificate"
        );
    }
    let shards = config.shards;
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..shards).map(|_| flume::unbounded()).unzip();
    let (admin_tx, admin_rx) = flume::unbounded();
    let (group_txs, group_rxs): (Vec<_>, Vec<_>) = (0..shards).map(|_| flume::unbounded()).unzip();
    let mut group_rxs = group_rxs.into_iter();
    let (txn_txs, txn_rxs): (Vec<_>, Vec<_>) = (0..shards).map(|_| flume::unbounded()).unzip();
    let mut txn_rxs = txn_rxs.into_iter();
    let served = serve_listeners(&config, shards)?;
    let tls_listeners = served.iter().filter_map(|(l, _)| l.tls.clone()).collect();
    let mut per_shard = bind_listeners(served, shards).into_iter();
    let metrics_listener = crate::metrics::endpoint::bind(&config.metrics_listen)?;
    // Before anything registers a metric: handles registered earlier would record nothing.
    let recorder = crate::metrics::install();
    let (images_tx, images_rx) = flume::unbounded();
    let link = QuorumLink::start(link_settings(&config, cluster_tls.clone()), images_tx, shutdown.clone())
        .context("start the quorum link")?;
    let disk = crate::disk_space::DiskSpace::watch(&config.data_dir, config.log_dir_min_free_bytes)
        .with_context(|| format!("measure the free space of {}", config.data_dir.display()))?;
    let ctx = Arc::new(BrokerContext::new(
        config,
        handlers::supported_apis(),
        link.handle(),
        crate::context::ContextChannels { shards: senders, admin: admin_tx, groups: group_txs, txns: txn_txs },
        shutdown.clone(),
        disk,
        cluster_tls.clone(),
    ));
    crate::security::reload::watch_certificates(tls_listeners, cluster_tls, shutdown.clone())?;
    let notifier = crate::notify::spawn(ctx.clone());
    let metrics = crate::metrics::endpoint::Endpoint::start(metrics_listener, recorder, ctx.clone(), clients.clone())?;
    let draining = Arc::new(AtomicUsize::new(shards));
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut admin_rx = Some((admin_rx, images_rx));
    let mut handles = Vec::with_capacity(shards);
    for (shard, requests) in receivers.into_iter().enumerate() {
        // Pinned one per core when every shard has its own core; unpinned when there are more shards.
        let placement = if shards <= cpus { Placement::Fixed(shard) } else { Placement::Unbound };
        let (ctx, shutdown, admin, draining) = (ctx.clone(), shutdown.clone(), admin_rx.take(), draining.clone());
        let clients = clients.clone();
        let listeners = per_shard.next().expect("descriptors for every shard");
        let groups = group_rxs.next().expect("one group coordinator channel per shard");
        let txns = txn_rxs.next().expect("one transaction coordinator channel per shard");
        let mut builder = LocalExecutorBuilder::new(placement).name(&format!("shard-{shard}"));
        if ctx.config.shard_limits.idle_poll_us > 0 {
            builder = builder.spin_before_park(Duration::from_micros(ctx.config.shard_limits.idle_poll_us));
        }
        let handle = builder
            .spawn(move || async move {
                // A shard that fails or panics stops the whole broker: the others would serve a
                // cluster view with its partitions missing.
                let guard = StopOnFailure(shutdown.clone());
                let channels = ShardChannels { requests, groups, txns, admin };
                let result = run_shard(shard, listeners, ctx, clients, channels, shutdown, draining).await;
                if let Err(e) = &result {
                    tracing::error!(shard, error = %e, "shard failed; stopping the broker");
                    guard.0.trigger();
                }
                result
            })
            .map_err(|e| anyhow::anyhow!("start shard {shard}: {e}"))?;
        handles.push(handle);
    }
    let mut first_error = None;
    for (shard, handle) in handles.into_iter().enumerate() {
        let outcome = handle.join().map_err(|e| anyhow::anyhow!("shard {shard} executor failed: {e}"));
        if let Err(e) = outcome.and_then(|r| r) {
            shutdown.trigger();
            first_error.get_or_insert(e);
        }
    }
    // The link ends once shutdown is triggered and its controlled shutdown is done; the voter it runs
    // stops with it, after the shards.
    shutdown.trigger();
    shutdown.mark_clients_done();
    if let Some(notifier) = notifier {
        let _ = notifier.join();
    }
    metrics.stop();
    if !link.stop() {
        // Its voter may still write to the data dir: the dir stays taken until the process ends.
        std::mem::forget(lock);
    }
    first_error.map_or(Ok(()), Err)
}

fn link_settings(config: &BrokerConfig, cluster_tls: Option<Arc<ClusterTls>>) -> LinkSettings {
    LinkSettings {
        node: NodeId(config.node_id),
        endpoint: BrokerEndpoint {
            host: config.advertised_listener.host.clone(),
            port: config.advertised_listener.port,
        },
        listeners: config
            .listeners
            .all
            .iter()
            .map(|l| ListenerEndpoint {
                name: l.name.clone(),
                host: l.advertised.host.clone(),
                port: l.advertised.port,
            })
            .collect(),
        data_dir: config.data_dir.clone(),
        voters: config.quorum_voters.iter().map(|v| (v.id as u64, format!("{}:{}", v.host, v.port))).collect(),
        heartbeat_interval: Duration::from_millis(config.broker_heartbeat_interval_ms),
        session_timeout_ms: config.broker_session_timeout_ms,
        quorum_reserve_bytes: crate::disk_space::quorum_reserve_bytes(config.log_dir_min_free_bytes),
        leader_rebalance: config.leader_rebalance,
        bootstrap_scram: config.bootstrap_scram.clone(),
        cluster_tls,
    }
}

/// The file whose lock says a broker process runs on the data dir.
pub const LOCK_FILE: &str = ".shardlog-lock";

/// Takes the data dir for this process (an exclusive `flock`, released when the process ends however it
/// ends): two brokers appending to the same segment files would destroy them.
pub fn lock_data_dir(dir: &std::path::Path) -> Result<std::fs::File> {
    let path = dir.join(LOCK_FILE);
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("open {}", path.display()))?;
    // SAFETY: flock(2) on a descriptor this function owns.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        anyhow::bail!("data dir {} is in use by another shardlog process ({e})", dir.display());
    }
    Ok(file)
}

/// Warns when the data dir is in memory (tmpfs): O_DIRECT and fdatasync succeed there, so every
/// acknowledgement looks durable, but the data is gone when the host restarts or loses power.
fn warn_if_volatile(dir: &std::path::Path) {
    if let Some(name) = crate::host_check::data_dir::in_memory_filesystem(dir) {
        tracing::warn!(
            data_dir = %dir.display(),
            filesystem = name,
            "the data dir is in memory: every acknowledged record is lost when the host restarts or loses power"
        );
    }
}

/// How often a repeated failure or refusal is logged.
const LOG_INTERVAL: Duration = Duration::from_secs(1);

/// The client limits in force: `max.connections` lowered, when the open file limit cannot hold that
/// many connections beside the segment files, to what it can (a connection beyond the limit would take
/// the descriptor a segment roll needs).
fn client_limits(config: &BrokerConfig) -> Arc<Clients> {
    let segment_files = config.shards * config.shard_limits.open_files_max;
    let files = raise_open_file_limit(segment_files);
    let mut settings = config.clients;
    let room = files.saturating_sub(segment_files + RESERVED_FILES).max(64);
    if settings.max_connections > room {
        let explicit = config.effective.iter().any(|s| s.key == "max.connections" && s.explicit);
        if explicit {
            tracing::warn!(
                max_connections = settings.max_connections,
                lowered_to = room,
                open_file_limit = files,
                "max.connections does not fit the open file limit beside shards x shard.open.files.max; raise LimitNOFILE"
            );
        } else {
            tracing::info!(
                max_connections = room,
                open_file_limit = files,
                "max.connections fitted to the open file limit"
            );
        }
        settings.max_connections = room;
    }
    Clients::new(settings)
}

/// Gives large request buffers that lie unused back to the system (see `shardlog_net::pool`).
async fn trim_frame_buffers(shutdown: Shutdown) {
    while !shutdown.is_triggered() {
        shardlog_net::pool::trim_idle();
        glommio::timer::sleep(Duration::from_secs(1)).await;
    }
}

/// Raises the soft limit on open descriptors to the hard limit (many systems start at 1024), and warns
/// when even that cannot hold the segment files every shard may keep open. Returns the limit in force.
fn raise_open_file_limit(wanted: usize) -> usize {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid resource and a pointer to a live rlimit.
    let raised = unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0
        }
    };
    if !raised {
        tracing::warn!(error = %std::io::Error::last_os_error(), "cannot raise the open file limit");
        // SAFETY: as above.
        unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    } else if (limit.rlim_cur as usize) < wanted + RESERVED_FILES {
        tracing::warn!(
            limit = limit.rlim_cur,
            segment_files = wanted,
            "the open file limit is low for shards x shard.open.files.max; lower that setting or raise LimitNOFILE"
        );
    }
    usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX)
}

/// What a shard receives work on: its partitions' requests, its group coordinator's, and (shard 0 only)
/// topic changes and metadata images.
struct ShardChannels {
    requests: flume::Receiver<PartitionRequest>,
    groups: flume::Receiver<crate::group::call::CoordinatorRequest>,
    txns: flume::Receiver<crate::txn::call::TxnRequest>,
    admin: Option<(flume::Receiver<AdminRequest>, flume::Receiver<Arc<MetadataImage>>)>,
}

#[allow(clippy::too_many_arguments)]
async fn run_shard(
    shard: usize,
    listeners: Vec<(Arc<ServedListener>, OwnedFd)>,
    ctx: Arc<BrokerContext>,
    clients: Arc<Clients>,
    channels: ShardChannels,
    shutdown: Shutdown,
    draining: Arc<AtomicUsize>,
) -> Result<()> {
    let ShardChannels { requests, groups, txns, admin } = channels;
    crate::metrics::register_shard(shard);
    glommio::spawn_local(crate::notify::beat(ctx.clone(), shard)).detach();
    // Counts this shard out of the drain however it ends, so a shard that fails to start does not hold
    // the others' shutdown.
    let mut drained = Drained { count: Some(draining), shutdown: shutdown.clone() };
    // Every partition directory this shard would serve is opened (with the default settings, until the
    // metadata gives the topic's): which of them this broker still hosts is known once the metadata is
    // caught up, and the others are then deleted as strays (see `crate::metadata::follow`).
    let scope_shards = ctx.shards.len();
    let scope = LogDirScope {
        name: format!("shard-{shard}"),
        owns: Box::new(move |tp| crate::topics::assign_shard(&tp.topic, tp.partition, scope_shards) == shard),
        max_open_files: ctx.config.shard_limits.open_files_max,
        max_producer_ids: ctx.config.shard_limits.producer_ids_max,
        space_floor: Some(ctx.disk.reservations()),
    };
    let default_log = ctx.config.log.clone();
    let (logs, reports) =
        LogDir::open_scoped(DmaFs, Rc::new(SystemClock), &ctx.config.data_dir, Some(scope), &|_: &TopicPartition| {
            default_log.clone()
        })
        .await
        .with_context(|| format!("shard {shard}: open logs"))?;
    for (tp, report) in &reports {
        if report.damage.is_some() || report.scanned_bytes > 0 {
            tracing::info!(shard, partition = %tp, ?report, "recovered partition");
        }
    }
    ctx.liveness.recovered();
    let logs = Rc::new(logs);
    let quorum = ctx.quorum.clone();
    // Notified when a partition led here gets records or a new high watermark: follower fetches this
    // shard holds for news look again.
    let progress = Arc::new(event_listener::Event::new());
    let (me, lag_time_ms) = (NodeId(ctx.config.node_id), ctx.config.replica_lag_time_max_ms);
    let replicas = Rc::new(shard::ShardReplicas::new(me, lag_time_ms, move || quorum.in_session(), progress));
    if ctx.config.test_acks_all_before_replication {
        replicas.break_acks_all_for_tests();
    }
    let readahead = Rc::new(shard::ReadAhead::new(ctx.config.shard_limits.fetch_readahead_bytes));
    glommio::spawn_local(shard::serve(logs.clone(), replicas.clone(), readahead.clone(), requests)).detach();
    let replicating = replication::replicate(ctx.clone(), shard, logs.clone(), replicas.clone(), shutdown.clone());
    glommio::spawn_local(replicating).detach();
    glommio::spawn_local(offline::run(ctx.clone(), logs.clone(), replicas.clone(), shutdown.clone())).detach();
    let limits = ctx.config.shard_limits;
    glommio::spawn_local(crate::group::coordinator::run(ctx.clone(), shard, groups)).detach();
    glommio::spawn_local(crate::coordinator::transactions::run(ctx.clone(), shard, txns)).detach();
    let cleaner = glommio::spawn_local(crate::compaction::run(logs.clone(), limits.cleaner, shutdown.clone()));
    let sampling = crate::metrics::sample_shard(shard, logs.clone(), shutdown.clone());
    glommio::spawn_local(sampling).detach();
    let upkeep = glommio::spawn_local(shard::upkeep(logs.clone(), replicas, readahead, limits, shutdown.clone()));
    if let Some((admin, images)) = admin {
        glommio::spawn_local(handlers::admin(ctx.clone(), admin)).detach();
        glommio::spawn_local(crate::metadata::follow::follow(ctx.clone(), images)).detach();
        glommio::spawn_local(trim_frame_buffers(shutdown.clone())).detach();
    }
    let served = serve(shard, listeners, ctx, clients, shutdown.clone()).await;
    if served.is_err() {
        // This shard cannot serve (its listener failed): the broker stops, and upkeep with it.
        shutdown.trigger();
    }
    // Every shard's connections are done (or past the drain limit) before any shard closes its logs.
    let draining = drained.done();
    let deadline = std::time::Instant::now() + DRAIN_LIMIT;
    while draining.load(Ordering::SeqCst) > 0 && std::time::Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    upkeep.await;
    cleaner.await;
    logs.close().await.with_context(|| format!("shard {shard}: close logs"))?;
    tracing::info!(shard, "logs closed");
    served
}

async fn serve(
    shard: usize,
    listeners: Vec<(Arc<ServedListener>, OwnedFd)>,
    ctx: Arc<BrokerContext>,
    clients: Arc<Clients>,
    shutdown: Shutdown,
) -> Result<()> {
    // Clients are served once the broker is registered and has caught up with the metadata.
    while !ctx.ready.load(Ordering::SeqCst) {
        if shutdown.is_triggered() {
            return Ok(());
        }
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    ctx.liveness.accepting();
    if ctx.config.test_stall_shard == Some(shard) {
        tracing::warn!(shard, "test.stall.shard: this shard's thread blocks for good in a second");
        glommio::spawn_local(async {
            glommio::timer::sleep(Duration::from_secs(1)).await;
            loop {
                std::thread::sleep(Duration::from_secs(1));
            }
        })
        .detach();
    }
    let open_connections = Rc::new(Cell::new(0usize));
    let accepting = listeners.into_iter().map(|(listener, fd)| {
        accept(shard, listener, fd, ctx.clone(), clients.clone(), shutdown.clone(), open_connections.clone())
    });
    futures_util::future::join_all(accepting).await;
    tracing::info!(shard, connections = open_connections.get(), "stopped accepting; finishing connections");
    let deadline = std::time::Instant::now() + DRAIN_LIMIT;
    while open_connections.get() > 0 && std::time::Instant::now() < deadline {
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}

/// Accepts connections on one listener until shutdown, each served as a task of its own.
async fn accept(
    shard: usize,
    served: Arc<ServedListener>,
    fd: OwnedFd,
    ctx: Arc<BrokerContext>,
    clients: Arc<Clients>,
    shutdown: Shutdown,
    open_connections: Rc<Cell<usize>>,
) {
    // SAFETY: the descriptor is a bound, listening, non-blocking TCP socket that nothing else owns: it
    // moves into the listener, which closes it when dropped.
    let listener = unsafe { TcpListener::from_raw_fd(fd.into_raw_fd()) };
    tracing::info!(shard, listener = %served.config.name, protocol = %served.config.protocol, addr = %served.addr, "accepting connections");
    let (mut refusals, mut accept_failures) = (Throttle::new(LOG_INTERVAL), Throttle::new(LOG_INTERVAL));
    loop {
        let accepted = future::or(async { Some(listener.accept().await) }, async {
            shutdown.wait().await;
            None
        })
        .await;
        match accepted {
            None => break,
            Some(Ok(stream)) => {
                let ip = stream.peer_addr().map_or(std::net::Ipv4Addr::UNSPECIFIED.into(), |a| a.ip());
                let slot = match clients.counts.admit(ip) {
                    Ok(slot) => slot,
                    Err(refusal) => {
                        // Closed at once (dropping the stream), counted, logged at most once a second.
                        drop(stream);
                        if let Some(skipped) = refusals.event(std::time::Instant::now()) {
                            tracing::warn!(
                                shard,
                                %ip,
                                limit = refusal.setting(),
                                refused_since_start = clients.counts.refused(),
                                refused_unlogged = skipped,
                                "refused a client connection: too many open"
                            );
                        }
                        continue;
                    }
                };
                // KIP-612: a connection over its IP's connection_creation_rate is closed after the
                // throttle time, as Kafka closes it. The inter-broker listener is exempt from both
                // connection rates (Kafka exempts it from the broker's): other brokers' replication
                // connections come there, and a default `ip` quota must not cut the cluster apart.
                let limited = !served.peers;
                let ip_throttle = if limited && ctx.quotas.any() {
                    ctx.quotas.ip_connection_throttle(&ctx.image(), ip)
                } else {
                    Duration::ZERO
                };
                if !ip_throttle.is_zero() {
                    crate::metrics::quota_throttled("connection_creation", ip_throttle);
                    tracing::debug!(shard, %ip, throttle_ms = ip_throttle.as_millis() as u64, "closing a connection over its IP's connection_creation_rate");
                    glommio::spawn_local(async move {
                        glommio::timer::sleep(ip_throttle).await;
                        drop((stream, slot));
                    })
                    .detach();
                    continue;
                }
                // max.connection.creation.rate: the listener waits before it accepts another. Its own
                // limit (listener.name.<name>.max.connection.creation.rate) applies to every listener,
                // the inter-broker one included, as in Kafka.
                let broker_throttle = if limited { ctx.quotas.broker_connection_throttle() } else { Duration::ZERO };
                let listener_throttle = served
                    .connection_rate
                    .as_ref()
                    .map_or(Duration::ZERO, |limit| ctx.quotas.listener_connection_throttle(limit));
                let broker_throttle = broker_throttle.max(listener_throttle);
                let stopping = shutdown.clone();
                let (ctx, clients, shutdown, open) =
                    (ctx.clone(), clients.clone(), shutdown.clone(), open_connections.clone());
                let served = served.clone();
                open.set(open.get() + 1);
                glommio::spawn_local(async move {
                    connection::serve(stream, served, ctx, clients, shutdown, slot).await;
                    open.set(open.get() - 1);
                })
                .detach();
                if !broker_throttle.is_zero() {
                    crate::metrics::quota_throttled("connection_creation", broker_throttle);
                    future::or(glommio::timer::sleep(broker_throttle), stopping.wait()).await;
                }
            }
            Some(Err(e)) => {
                // Out of descriptors and the like: keep the shard alive, back off, log once a second.
                if let Some(skipped) = accept_failures.event(std::time::Instant::now()) {
                    tracing::warn!(shard, error = %e, failed_unlogged = skipped, "accept failed");
                }
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    drop(listener);
}
