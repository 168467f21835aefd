//! Request handlers: one function per API, from a decoded request to a response body.
//!
//! Only what is implemented is listed in [`supported_apis`]; the codec refuses everything else before a
//! handler sees it. Partition work is sent to the owning shard ([`crate::shard`]); topic changes go to
//! shard 0, which applies them one at a time ([`admin`]).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::{CreatableTopicConfigs, CreatableTopicResult};
use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::describe_configs_response::{DescribeConfigsResourceResult, DescribeConfigsResult};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, ApiKey, BrokerId, CreatePartitionsRequest, CreatePartitionsResponse,
    CreateTopicsRequest, CreateTopicsResponse, DeleteRecordsRequest, DeleteRecordsResponse, DeleteTopicsRequest,
    DeleteTopicsResponse, DescribeClusterResponse, DescribeConfigsRequest, DescribeConfigsResponse, FetchRequest,
    FetchResponse, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, ListOffsetsRequest,
    ListOffsetsResponse, MetadataRequest, MetadataResponse, OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse,
    ProduceRequest, ProduceResponse, RequestKind, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use shardlog_net::kafka::{DecodedRequest, SupportedApis};
use shardlog_storage::{LeaderEpoch, TopicPartition};

mod admin;
mod cluster;
mod data;
mod producers;

pub use admin::admin;
use admin::*;
use cluster::*;
use data::*;
pub use data::{DispatchedProduce, FETCH_MAX_BYTES, dispatch_produce};
pub use producers::ProducerIds;
use producers::*;

use crate::config::BrokerConfig;
use crate::metadata::image::MetadataImage;
use crate::metadata::link::QuorumHandle;
use crate::quorum::state::NodeId;
use crate::shard::{FetchOutcome, ListOutcome, OffsetSpec, PartitionRequest, ProduceOutcome};
use crate::topics::configs::{Compression, TopicConfig, TopicDefaults};

/// The APIs and versions this broker serves. Grows with each handler.
pub fn supported_apis() -> SupportedApis {
    SupportedApis::new(&[
        (ApiKey::Produce, 3, 12),
        (ApiKey::Fetch, 4, 12),
        // v7 and v8 add special timestamps (-3 max timestamp, -4 earliest local) not served yet.
        (ApiKey::ListOffsets, 1, 6),
        (ApiKey::Metadata, 0, 12),
        (ApiKey::ApiVersions, 0, 4),
        (ApiKey::CreateTopics, 2, 7),
        (ApiKey::DeleteTopics, 1, 6),
        (ApiKey::DeleteRecords, 0, 2),
        (ApiKey::DescribeConfigs, 1, 4),
        (ApiKey::CreatePartitions, 0, 3),
        (ApiKey::OffsetForLeaderEpoch, 2, 4),
        (ApiKey::DescribeCluster, 0, 2),
        (ApiKey::AlterConfigs, 0, 2),
        (ApiKey::IncrementalAlterConfigs, 0, 1),
        // v6 adds two-phase commit transactions.
        (ApiKey::InitProducerId, 0, 5),
    ])
}

/// Topic changes, applied by shard 0 one at a time.
#[derive(Debug)]
pub enum AdminRequest {
    CreateTopics {
        request: CreateTopicsRequest,
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
    /// (key, Some(value)) sets, (key, None) deletes back to the default.
    Edit {
        topic: String,
        edits: Vec<(String, Option<String>)>,
    },
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
    /// One more than the index of the last image applied to the shards (0: none yet).
    reconciled: AtomicU64,
    /// One channel per shard for partition work.
    pub shards: Vec<flume::Sender<PartitionRequest>>,
    /// Shard 0's channel for topic changes.
    pub admin: flume::Sender<AdminRequest>,
    /// Set when the broker is stopping: long polls answer at once.
    pub shutdown: crate::runtime::Shutdown,
    /// The data dir's free space: produce is refused below `log.dir.min.free.bytes`.
    pub disk: Arc<crate::disk_space::DiskSpace>,
    /// The block of producer ids InitProducerId hands out.
    pub producer_ids: ProducerIds,
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
        quorum: QuorumHandle,
        shards: Vec<flume::Sender<PartitionRequest>>,
        admin: flume::Sender<AdminRequest>,
        shutdown: crate::runtime::Shutdown,
        disk: Arc<crate::disk_space::DiskSpace>,
    ) -> BrokerContext {
        let lowest_voter = config.quorum_voters.iter().map(|v| v.id).min().unwrap_or(config.node_id);
        BrokerContext {
            cluster_id: format!("shardlog-{lowest_voter}"),
            apis: supported_apis(),
            metadata: RwLock::new(Arc::new(MetadataImage::default())),
            quorum,
            ready: AtomicBool::new(false),
            reconciled: AtomicU64::new(0),
            shards,
            admin,
            shutdown,
            disk,
            producer_ids: ProducerIds::default(),
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

    /// [`Self::leader_here`] as of `image`.
    pub fn leader_in(&self, image: &MetadataImage, topic: &str, partition: i32) -> Result<Led, ResponseError> {
        let p = image.partition(topic, partition).ok_or(ResponseError::UnknownTopicOrPartition)?;
        if p.leader != Some(NodeId(self.config.node_id)) || !self.quorum.in_session() {
            return Err(ResponseError::NotLeaderOrFollower);
        }
        Ok(Led { shard: self.shard_for(topic, partition as u32), epoch: p.leader_epoch })
    }

    /// The topic's `min.insync.replicas`: its own setting, else this broker's default. (Settings are
    /// validated before they are committed; one that no longer parses falls back to the default.)
    pub fn min_insync_replicas(&self, image: &MetadataImage, topic: &str) -> usize {
        image
            .topic(topic)
            .and_then(|t| t.configs.get("min.insync.replicas"))
            .and_then(|v| v.trim().parse::<u16>().ok())
            .unwrap_or(self.config.min_insync_replicas) as usize
    }

    /// The topic's `compression.type`: its own setting, else this broker's default.
    pub fn compression(&self, image: &MetadataImage, topic: &str) -> Compression {
        image
            .topic(topic)
            .and_then(|t| t.configs.get("compression.type"))
            .and_then(|v| Compression::parse(v).ok())
            .unwrap_or(self.config.compression)
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

/// Answers a decoded request; `None` for requests Kafka does not answer (produce with acks=0).
pub async fn handle(ctx: &Arc<BrokerContext>, request: DecodedRequest) -> Option<ResponseKind> {
    let version = request.version;
    Some(match request.body {
        RequestKind::ApiVersions(_) => ResponseKind::ApiVersions(ctx.apis.api_versions_response(0)),
        RequestKind::Metadata(req) => ResponseKind::Metadata(metadata(ctx, &req, version).await),
        RequestKind::CreateTopics(req) => ResponseKind::CreateTopics(create_topics(ctx, req).await),
        RequestKind::Produce(req) => return dispatch_produce(ctx, req).answer().await.map(ResponseKind::Produce),
        RequestKind::Fetch(req) => ResponseKind::Fetch(fetch(ctx, req).await),
        RequestKind::ListOffsets(req) => ResponseKind::ListOffsets(list_offsets(ctx, req, version).await),
        RequestKind::DeleteTopics(req) => ResponseKind::DeleteTopics(delete_topics(ctx, req).await),
        RequestKind::CreatePartitions(req) => ResponseKind::CreatePartitions(create_partitions(ctx, req).await),
        RequestKind::DeleteRecords(req) => ResponseKind::DeleteRecords(delete_records(ctx, req).await),
        RequestKind::DescribeConfigs(req) => ResponseKind::DescribeConfigs(describe_configs(ctx, req, version)),
        RequestKind::OffsetForLeaderEpoch(req) => {
            ResponseKind::OffsetForLeaderEpoch(offset_for_leader_epoch(ctx, req).await)
        }
        RequestKind::DescribeCluster(_) => ResponseKind::DescribeCluster(describe_cluster(ctx)),
        RequestKind::AlterConfigs(req) => ResponseKind::AlterConfigs(alter_configs(ctx, req).await),
        RequestKind::IncrementalAlterConfigs(req) => {
            ResponseKind::IncrementalAlterConfigs(incremental_alter_configs(ctx, req).await)
        }
        RequestKind::InitProducerId(req) => ResponseKind::InitProducerId(init_producer_id(ctx, req).await),
        other => unreachable!("the codec admitted an API without a handler: {other:?}"),
    })
}

fn code(error: Option<ResponseError>) -> i16 {
    error.map_or(0, |e| e.code())
}

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}

/// Sends a partition request to its shard and waits for the reply; `None` if the shard is gone.
pub(crate) async fn ask_shard<T>(
    ctx: &BrokerContext,
    shard: usize,
    make: impl FnOnce(flume::Sender<T>) -> PartitionRequest,
) -> Option<T> {
    let (tx, rx) = flume::bounded(1);
    ctx.shards[shard].send_async(make(tx)).await.ok()?;
    rx.recv_async().await.ok()
}
