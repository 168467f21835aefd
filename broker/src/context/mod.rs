//! What every shard's handlers share: the broker's settings, the cluster metadata as the shards serve it,
//! the channels to each shard's partitions and to shard 0's topic changes, and the stop signal.
//!
//! This module sits below the request handlers, the runtime and the metadata follower, which all use it;
//! it uses only the shard's request types, the metadata image and the quorum handle.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse,
};
use shardlog_net::kafka::SupportedApis;
use shardlog_storage::{LeaderEpoch, TopicPartition};

mod authorization;
mod producer_ids;
pub(crate) mod quotas;

pub use authorization::Authorization;
pub use producer_ids::{PRODUCER_ID_BLOCK, ProducerIds};
pub use quotas::Quotas;

use crate::config::BrokerConfig;
use crate::disk_space::DiskSpace;
use crate::group::call::CoordinatorRequest;
use crate::metadata::image::MetadataImage;
use crate::metadata::link::QuorumHandle;
use crate::quorum::state::NodeId;
use crate::security::cluster_tls::ClusterTls;
use crate::shard::PartitionRequest;
use crate::shutdown::Shutdown;
use crate::topics::configs::{Compression, TopicDefaults};

/// Topic changes, applied by shard 0 one at a time.
#[derive(Debug)]
pub enum AdminRequest {
    /// `internal`: from the broker itself, which alone may create internal topics
    /// ([`crate::topics::internal`]).
    CreateTopics {
        request: CreateTopicsRequest,
        internal: bool,
        reply: flume::Sender<CreateTopicsResponse>,
    },
    DeleteTopics {
        names: Vec<String>,
        reply: flume::Sender<Vec<(String, Option<ResponseError>)>>,
    },
    CreatePartitions {
        request: CreatePartitionsRequest,
        reply: flume::Sender<CreatePartitionsResponse>,
    },
    /// New topic settings, per resource: the outcome of each, in order.
    AlterConfigs {
        changes: Vec<ConfigChange>,
        validate_only: bool,
        reply: flume::Sender<Vec<Result<(), (ResponseError, String)>>>,
    },
}

/// One topic's settings change, from AlterConfigs (replace all) or IncrementalAlterConfigs (edit).
#[derive(Debug, Clone)]
pub enum ConfigChange {
    /// A resource that is not a topic, or an operation that is not supported.
    Refused(ResponseError, String),
    Replace {
        topic: String,
        configs: BTreeMap<String, String>,
    },
    /// IncrementalAlterConfigs' operations, key by key.
    Edit {
        topic: String,
        edits: Vec<(String, ConfigEdit)>,
    },
}

/// One key's change in an IncrementalAlterConfigs request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConfigEdit {
    Set(String),
    /// Back to the default.
    Delete,
    /// A list-valued setting (`cleanup.policy`) gains these comma-separated items (those it lacks).
    Append(String),
    /// A list-valued setting loses these items.
    Subtract(String),
}

/// What every handler on every shard shares.
#[derive(Debug)]
pub struct BrokerContext {
    pub config: BrokerConfig,
    pub apis: SupportedApis,
    pub cluster_id: String,
    /// The cluster metadata as last applied to the shards ([`crate::metadata::follow`]).
    pub metadata: RwLock<Arc<MetadataImage>>,
    /// Commits topic changes through the quorum.
    pub quorum: QuorumHandle,
    /// Set once the broker is registered and has applied the metadata up to its registration.
    pub ready: AtomicBool,
    /// What the shards tell systemd's notifications (started, serving, still running).
    pub liveness: crate::notify::Liveness,
    /// One more than the index of the last image applied to the shards (0: none yet).
    reconciled: AtomicU64,
    /// One channel per shard for partition work.
    pub shards: Vec<flume::Sender<PartitionRequest>>,
    /// Shard 0's channel for topic changes.
    pub admin: flume::Sender<AdminRequest>,
    /// One channel per shard to its group coordinator.
    pub groups: Vec<flume::Sender<CoordinatorRequest>>,
    /// The internal topics this broker is creating, so that concurrent FindCoordinator requests ask for
    /// each once.
    pub creating_internal_topics: Mutex<BTreeSet<&'static str>>,
    /// One channel per shard to its transaction coordinator.
    pub txns: Vec<flume::Sender<crate::txn::call::TxnRequest>>,
    /// Set when the broker is stopping: long polls answer at once.
    pub shutdown: Shutdown,
    /// The data dir's free space: produce is refused below `log.dir.min.free.bytes`.
    pub disk: Arc<DiskSpace>,
    /// The block of producer ids InitProducerId hands out.
    pub producer_ids: ProducerIds,
    /// Per shard: followers' replication connections handed to the shard that owns their partitions.
    pub peer_handoffs: Vec<(flume::Sender<PeerHandoff>, flume::Receiver<PeerHandoff>)>,
    /// ACL authorization; `None` without `authorizer.class.name`.
    pub authorization: Option<Authorization>,
    /// Client quotas' budgets, one per client across all shards.
    pub quotas: Quotas,
    /// Mutual TLS with the other brokers (replication); `None` without `cluster.ssl.*`.
    pub cluster_tls: Option<Arc<ClusterTls>>,
}

/// The channels to every shard's work: partitions, topic changes (shard 0), group coordinators.
#[derive(Debug)]
pub struct ContextChannels {
    pub shards: Vec<flume::Sender<PartitionRequest>>,
    pub admin: flume::Sender<AdminRequest>,
    pub groups: Vec<flume::Sender<CoordinatorRequest>>,
    pub txns: Vec<flume::Sender<crate::txn::call::TxnRequest>>,
}

/// A follower's replication connection on its way from the shard that accepted it to the shard that owns
/// the partitions it fetches (see `docs/peer-protocol.md` §2.2).
pub struct PeerHandoff {
    /// The connected socket.
    pub fd: std::os::fd::OwnedFd,
    /// Its address, for logs.
    pub peer: String,
    pub start: PeerStart,
    /// Its place in the connection limits, held for as long as the connection lives.
    pub slot: Box<dyn Send>,
}

/// How far a handed-over replication connection has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerStart {
    /// Plain TCP: the accepting shard checked and answered the follower's Hello.
    Answered { follower: NodeId },
    /// Cluster mTLS: nothing was read yet; the shard runs the handshake and checks the Hello itself.
    Tls,
}

impl std::fmt::Debug for PeerHandoff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerHandoff")
            .field("fd", &self.fd)
            .field("peer", &self.peer)
            .field("start", &self.start)
            .finish()
    }
}

/// The shard that serves partition `partition` of `topic` here and the leader epoch it leads it at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Led {
    pub shard: usize,
    pub epoch: LeaderEpoch,
}

impl BrokerContext {
    pub fn new(
        config: BrokerConfig,
        apis: SupportedApis,
        quorum: QuorumHandle,
        channels: ContextChannels,
        shutdown: Shutdown,
        disk: Arc<DiskSpace>,
        cluster_tls: Option<Arc<ClusterTls>>,
    ) -> BrokerContext {
        let ContextChannels { shards, admin, groups, txns } = channels;
        let lowest_voter = config.quorum_voters.iter().map(|v| v.id).min().unwrap_or(config.node_id);
        let shards_count = shards.len();
        BrokerContext {
            cluster_id: format!("shardlog-{lowest_voter}"),
            apis,
            metadata: RwLock::new(Arc::new(MetadataImage::default())),
            quorum,
            ready: AtomicBool::new(false),
            liveness: crate::notify::Liveness::new(shards_count),
            reconciled: AtomicU64::new(0),
            shards,
            admin,
            groups,
            creating_internal_topics: Mutex::new(BTreeSet::new()),
            txns,
            shutdown,
            disk,
            producer_ids: ProducerIds::default(),
            peer_handoffs: (0..shards_count).map(|_| flume::unbounded()).collect(),
            authorization: Authorization::new(&config.authorization),
            quotas: Quotas::new(config.quota_window, config.clients.max_connection_creation_rate),
            cluster_tls,
            config,
        }
    }

    pub fn topic_defaults(&self) -> TopicDefaults {
        TopicDefaults {
            log: self.config.log.clone(),
            min_insync_replicas: self.config.min_insync_replicas,
            compression: self.config.compression,
        }
    }

    /// The metadata as last applied to the shards.
    pub fn image(&self) -> Arc<MetadataImage> {
        self.metadata.read().expect("metadata lock").clone()
    }

    /// The shard holding a partition's log on this broker.
    /// Where clients of `listener` reach broker `id`: this broker's own advertised address for that
    /// listener, another's as it registered it; `None` for a broker that is not registered.
    pub fn broker_address(&self, image: &MetadataImage, id: NodeId, listener: &str) -> Option<(String, u16)> {
        if id.0 == self.config.node_id {
            let mine = self.config.listeners.all.iter().find(|l| l.name == listener);
            let advertised = mine.map_or(&self.config.advertised_listener, |l| &l.advertised);
            return Some((advertised.host.clone(), advertised.port));
        }
        // A broker without that listener is left out, as Kafka leaves it out of Metadata.
        let (host, port) = image.state.brokers.get(&id)?.listener(listener)?;
        Some((host.to_string(), port))
    }

    pub fn shard_of(&self, tp: &TopicPartition) -> usize {
        self.shard_for(&tp.topic, tp.partition)
    }

    fn shard_for(&self, topic: &str, partition: u32) -> usize {
        crate::topics::assign_shard(topic, partition, self.shards.len())
    }

    /// Where this broker serves a partition it leads; UNKNOWN_TOPIC_OR_PARTITION if there is no such
    /// partition, NOT_LEADER_OR_FOLLOWER if another broker leads it (or none does right now), or if this
    /// broker has lost its session with the quorum (which has fenced it by then).
    pub fn leader_here(&self, topic: &str, partition: i32) -> Result<Led, ResponseError> {
        self.leader_in(&self.image(), topic, partition)
    }

    /// The shard of this broker's replica of the partition, leader or follower.
    pub fn replica_here(&self, topic: &str, partition: i32) -> Result<usize, ResponseError> {
        let image = self.image();
        let p = image.partition(topic, partition).ok_or(ResponseError::UnknownTopicOrPartition)?;
        if !p.replicas.contains(&NodeId(self.config.node_id)) {
            return Err(ResponseError::NotLeaderOrFollower);
        }
        Ok(self.shard_for(topic, partition as u32))
    }

    /// [`Self::leader_here`] as of `image`.
    pub fn leader_in(&self, image: &MetadataImage, topic: &str, partition: i32) -> Result<Led, ResponseError> {
        let p = image.partition(topic, partition).ok_or(ResponseError::UnknownTopicOrPartition)?;
        if p.leader != Some(NodeId(self.config.node_id)) || !self.quorum.in_session() {
            return Err(ResponseError::NotLeaderOrFollower);
        }
        Ok(Led { shard: self.shard_for(topic, partition as u32), epoch: p.leader_epoch })
    }

    /// The topic's `compression.type`: its own setting, else this broker's default.
    pub fn compression(&self, image: &MetadataImage, topic: &str) -> Compression {
        image
            .topic(topic)
            .and_then(|t| t.configs.get("compression.type"))
            .and_then(|v| Compression::parse(v).ok())
            .unwrap_or(self.config.compression)
    }

    /// Whether a topic is compacted (`cleanup.policy` holds `compact`): its records must have keys.
    pub fn compacted(&self, image: &MetadataImage, topic: &str) -> bool {
        image
            .topic(topic)
            .and_then(|t| t.configs.get("cleanup.policy"))
            .and_then(|v| crate::topics::configs::parse_cleanup_policy(v).ok())
            .is_some_and(|(compact, _)| compact)
    }

    /// Records that the image at `applied` is now what the shards serve.
    pub fn mark_reconciled(&self, applied: Option<u64>) {
        self.reconciled.store(applied.map_or(0, |a| a + 1), Ordering::SeqCst);
    }

    /// Waits (at most `limit`) until the shards serve an image that includes log index `index`.
    pub async fn wait_reconciled(&self, index: u64, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while self.reconciled.load(Ordering::SeqCst) <= index {
            if Instant::now() >= deadline || self.shutdown.is_triggered() {
                return false;
            }
            glommio::timer::sleep(Duration::from_millis(2)).await;
        }
        true
    }
}

/// Sends a partition request to its shard and waits for the reply; `None` if the shard is gone.
pub async fn ask_shard<T>(
    ctx: &BrokerContext,
    shard: usize,
    make: impl FnOnce(flume::Sender<T>) -> PartitionRequest,
) -> Option<T> {
    let (tx, rx) = flume::bounded(1);
    ctx.shards[shard].send_async(make(tx)).await.ok()?;
    rx.recv_async().await.ok()
}
