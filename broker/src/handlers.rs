//! Request handlers: one function per API, from a decoded request to a response body.
//!
//! Only what is implemented is listed in [`supported_apis`]; the codec refuses everything else before a
//! handler sees it. Partition work is sent to the owning shard ([`crate::shard`]); topic changes go to
//! shard 0, which applies them one at a time ([`admin`]).

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
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
use shardlog_storage::{LeaderEpoch, Offset, TopicPartition};

use crate::config::BrokerConfig;
use crate::shard::{FetchOutcome, ListOutcome, OffsetSpec, PartitionRequest, ProduceOutcome};
use crate::topics::configs::{TopicConfig, TopicDefaults};
use crate::topics::store::{TopicError, TopicStore};

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
    pub topics: RwLock<TopicStore>,
    /// One channel per shard for partition work.
    pub shards: Vec<flume::Sender<PartitionRequest>>,
    /// Shard 0's channel for topic changes.
    pub admin: flume::Sender<AdminRequest>,
}

impl BrokerContext {
    pub fn topic_defaults(&self) -> TopicDefaults {
        TopicDefaults {
            log: self.config.log.clone(),
            min_insync_replicas: self.config.min_insync_replicas,
            unclean_leader_election: self.config.unclean_leader_election,
        }
    }

    /// The shard serving a partition, or `None` if the topic or partition does not exist.
    pub fn owner(&self, topic: &str, partition: i32) -> Option<usize> {
        let partition = u32::try_from(partition).ok()?;
        self.topics.read().expect("topic lock").serving_shard(topic, partition, self.shards.len())
    }

    fn leader_epoch(&self, topic: &str, partition: i32) -> i32 {
        let topics = self.topics.read().expect("topic lock");
        topics.topics.get(topic).and_then(|t| t.partitions.get(partition as usize)).map_or(0, |p| p.leader_epoch)
    }
}

/// Answers a decoded request; `None` for requests Kafka does not answer (produce with acks=0).
pub async fn handle(ctx: &Arc<BrokerContext>, request: DecodedRequest) -> Option<ResponseKind> {
    let version = request.version;
    Some(match request.body {
        RequestKind::ApiVersions(_) => ResponseKind::ApiVersions(ctx.apis.api_versions_response(0)),
        RequestKind::Metadata(req) => ResponseKind::Metadata(metadata(ctx, &req, version).await),
        RequestKind::CreateTopics(req) => ResponseKind::CreateTopics(create_topics(ctx, req).await),
        RequestKind::Produce(req) => return produce(ctx, req).await.map(ResponseKind::Produce),
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
async fn ask<T>(
    ctx: &BrokerContext,
    shard: usize,
    make: impl FnOnce(flume::Sender<T>) -> PartitionRequest,
) -> Option<T> {
    let (tx, rx) = flume::bounded(1);
    ctx.shards[shard].send_async(make(tx)).await.ok()?;
    rx.recv_async().await.ok()
}

async fn metadata(ctx: &Arc<BrokerContext>, req: &MetadataRequest, version: i16) -> MetadataResponse {
    let node = BrokerId(ctx.config.node_id as i32);
    let advertised = &ctx.config.advertised_listener;
    let broker = MetadataResponseBroker::default()
        .with_node_id(node)
        .with_host(StrBytes::from_string(advertised.host.clone()))
        .with_port(advertised.port as i32);
    // Before v4 there is no flag and auto-creation is always asked for.
    let auto_create = ctx.config.auto_create_topics && (version < 4 || req.allow_auto_topic_creation);
    let names: Vec<String> = match &req.topics {
        None => ctx.topics.read().expect("topic lock").topics.keys().cloned().collect(),
        Some(topics) => topics.iter().filter_map(|t| t.name.as_ref().map(|n| n.0.as_str().to_string())).collect(),
    };
    let missing: Vec<String> =
        names.iter().filter(|n| !ctx.topics.read().expect("topic lock").topics.contains_key(*n)).cloned().collect();
    if auto_create && !missing.is_empty() {
        let mut request = CreateTopicsRequest::default();
        request.topics = missing
            .iter()
            .filter(|n| crate::topics::validate_topic_name(n).is_ok())
            .map(|n| {
                kafka_protocol::messages::create_topics_request::CreatableTopic::default()
                    .with_name(topic_name(n))
                    .with_num_partitions(-1)
                    .with_replication_factor(-1)
            })
            .collect();
        let (tx, rx) = flume::bounded(1);
        if ctx.admin.send_async(AdminRequest::CreateTopics { request, reply: tx }).await.is_ok() {
            let _ = rx.recv_async().await;
        }
    }
    let topics = ctx.topics.read().expect("topic lock").clone();
    let topic_entries = names
        .iter()
        .map(|name| match topics.topics.get(name) {
            Some(meta) => MetadataResponseTopic::default()
                .with_name(Some(topic_name(name)))
                .with_topic_id(meta.id)
                .with_partitions(
                    meta.partitions
                        .iter()
                        .enumerate()
                        .map(|(i, p)| {
                            MetadataResponsePartition::default()
                                .with_partition_index(i as i32)
                                .with_leader_id(node)
                                .with_leader_epoch(p.leader_epoch)
                                .with_replica_nodes(vec![node])
                                .with_isr_nodes(vec![node])
                        })
                        .collect(),
                ),
            None => {
                let error = if crate::topics::validate_topic_name(name).is_err() {
                    ResponseError::InvalidTopicException
                } else {
                    ResponseError::UnknownTopicOrPartition
                };
                MetadataResponseTopic::default().with_name(Some(topic_name(name))).with_error_code(error.code())
            }
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(vec![broker])
        .with_cluster_id(Some(StrBytes::from_string(ctx.cluster_id.clone())))
        .with_controller_id(node)
        .with_topics(topic_entries)
}

async fn create_topics(ctx: &Arc<BrokerContext>, request: CreateTopicsRequest) -> CreateTopicsResponse {
    let (tx, rx) = flume::bounded(1);
    if ctx.admin.send_async(AdminRequest::CreateTopics { request: request.clone(), reply: tx }).await.is_ok()
        && let Ok(response) = rx.recv_async().await
    {
        return response;
    }
    let mut response = CreateTopicsResponse::default();
    response.topics = request
        .topics
        .iter()
        .map(|t| {
            CreatableTopicResult::default()
                .with_name(t.name.clone())
                .with_error_code(ResponseError::KafkaStorageError.code())
        })
        .collect();
    response
}

/// Shard 0's loop applying topic changes one at a time, so the durable topic record never loses an
/// update to a concurrent one.
pub async fn admin(ctx: Arc<BrokerContext>, requests: flume::Receiver<AdminRequest>) {
    while let Ok(request) = requests.recv_async().await {
        match request {
            AdminRequest::CreateTopics { request, reply } => {
                let response = apply_create_topics(&ctx, request).await;
                let _ = reply.send(response);
            }
            AdminRequest::DeleteTopics { names, reply } => {
                let _ = reply.send(apply_delete_topics(&ctx, names).await);
            }
            AdminRequest::CreatePartitions { request, reply } => {
                let _ = reply.send(apply_create_partitions(&ctx, request).await);
            }
            AdminRequest::AlterConfigs { changes, validate_only, reply } => {
                let _ = reply.send(apply_alter_configs(&ctx, changes, validate_only).await);
            }
        }
    }
}

fn topic_error_code(e: &TopicError) -> ResponseError {
    match e {
        TopicError::InvalidName(_) => ResponseError::InvalidTopicException,
        TopicError::AlreadyExists(_) => ResponseError::TopicAlreadyExists,
        TopicError::Unknown(_) => ResponseError::UnknownTopicOrPartition,
        TopicError::InvalidPartitions { .. } => ResponseError::InvalidPartitions,
        TopicError::InvalidConfig(_) => ResponseError::InvalidConfig,
        _ => ResponseError::KafkaStorageError,
    }
}

async fn apply_create_topics(ctx: &Arc<BrokerContext>, request: CreateTopicsRequest) -> CreateTopicsResponse {
    let defaults = ctx.topic_defaults();
    let shards = ctx.shards.len();
    let mut updated = ctx.topics.read().expect("topic lock").clone();
    let mut results = Vec::new();
    let mut created = Vec::new();
    for topic in &request.topics {
        let name = topic.name.0.as_str().to_string();
        let partitions =
            if topic.num_partitions == -1 { ctx.config.num_partitions as i64 } else { topic.num_partitions as i64 };
        let replication = if topic.replication_factor == -1 {
            ctx.config.default_replication_factor as i64
        } else {
            topic.replication_factor as i64
        };
        let result =
            CreatableTopicResult::default().with_name(topic.name.clone()).with_replication_factor(replication as i16);
        let refuse = |error: ResponseError, message: String| {
            result.clone().with_error_code(error.code()).with_error_message(Some(StrBytes::from_string(message)))
        };
        if replication != 1 {
            results.push(refuse(
                ResponseError::InvalidReplicationFactor,
                format!("replication factor {replication}: this cluster has 1 broker"),
            ));
            continue;
        }
        if !topic.assignments.is_empty() {
            results.push(refuse(
                ResponseError::InvalidReplicaAssignment,
                "manual replica assignment is not supported".into(),
            ));
            continue;
        }
        let mut configs = BTreeMap::new();
        let mut bad_config = None;
        for c in &topic.configs {
            match &c.value {
                Some(v) => {
                    configs.insert(c.name.as_str().to_string(), v.as_str().to_string());
                }
                None => bad_config = Some(format!("config {} has no value", c.name.as_str())),
            }
        }
        if let Some(message) = bad_config {
            results.push(refuse(ResponseError::InvalidConfig, message));
            continue;
        }
        match updated.create(&name, partitions, configs, &defaults, shards) {
            Ok(meta) => {
                let resolved = TopicConfig::resolve(&defaults, &meta.configs).expect("validated by create");
                let described = resolved
                    .describe()
                    .into_iter()
                    .map(|(k, v, set)| {
                        CreatableTopicConfigs::default()
                            .with_name(StrBytes::from_static_str(k))
                            .with_value(Some(StrBytes::from_string(v)))
                            .with_config_source(if set { 1 } else { 5 })
                    })
                    .collect();
                results.push(
                    result
                        .clone()
                        .with_topic_id(meta.id)
                        .with_num_partitions(partitions as i32)
                        .with_configs(Some(described)),
                );
                created.push((name, resolved));
            }
            Err(e) => results.push(refuse(topic_error_code(&e), e.to_string())),
        }
    }
    if !request.validate_only && !created.is_empty() {
        // Durable first, then visible, then the logs: a crash in between leaves a recorded topic whose
        // partitions are created empty on the next start.
        if let Err(e) = updated.save(&shardlog_storage::fs::dma::DmaFs, &ctx.config.data_dir).await {
            tracing::error!(error = %e, "cannot record topics");
            for r in results.iter_mut().filter(|r| r.error_code == 0) {
                r.error_code = ResponseError::KafkaStorageError.code();
            }
            return CreateTopicsResponse::default().with_topics(results);
        }
        *ctx.topics.write().expect("topic lock") = updated;
        for (name, config) in &created {
            let partitions = ctx.topics.read().expect("topic lock").topics[name].partitions.len();
            for p in 0..partitions {
                let Some(shard) = ctx.owner(name, p as i32) else { continue };
                let tp = TopicPartition::new(name.clone(), p as u32);
                let log = config.log.clone();
                match ask(ctx, shard, |reply| PartitionRequest::Create { tp: tp.clone(), config: log, reply }).await {
                    Some(Ok(())) => {}
                    other => tracing::error!(partition = %tp, outcome = ?other, "cannot create partition log"),
                }
            }
            tracing::info!(topic = %name, partitions, "created topic");
        }
    }
    CreateTopicsResponse::default().with_topics(results)
}

async fn produce(ctx: &Arc<BrokerContext>, req: ProduceRequest) -> Option<ProduceResponse> {
    let acks = req.acks;
    let mut pending = Vec::new();
    for topic in &req.topic_data {
        let name = topic.name.0.as_str().to_string();
        for partition in &topic.partition_data {
            let outcome: Result<flume::Receiver<ProduceOutcome>, ResponseError> = if ![-1, 0, 1].contains(&acks) {
                Err(ResponseError::InvalidRequiredAcks)
            } else if let Some(shard) = ctx.owner(&name, partition.index) {
                match &partition.records {
                    Some(records) => {
                        let (tx, rx) = flume::bounded(1);
                        let request = PartitionRequest::Produce {
                            tp: TopicPartition::new(name.clone(), partition.index as u32),
                            batch: records.clone(),
                            epoch: LeaderEpoch(ctx.leader_epoch(&name, partition.index)),
                            acks,
                            reply: tx,
                        };
                        match ctx.shards[shard].send_async(request).await {
                            Ok(()) => Ok(rx),
                            Err(_) => Err(ResponseError::KafkaStorageError),
                        }
                    }
                    None => Err(ResponseError::CorruptMessage),
                }
            } else {
                Err(ResponseError::UnknownTopicOrPartition)
            };
            pending.push((topic.name.clone(), partition.index, outcome));
        }
    }
    let mut by_topic: Vec<TopicProduceResponse> = Vec::new();
    for (name, index, outcome) in pending {
        let outcome = match outcome {
            Ok(rx) => rx.recv_async().await.unwrap_or(ProduceOutcome {
                error: Some(ResponseError::KafkaStorageError),
                base_offset: -1,
                log_start_offset: -1,
            }),
            Err(error) => ProduceOutcome { error: Some(error), base_offset: -1, log_start_offset: -1 },
        };
        let partition = PartitionProduceResponse::default()
            .with_index(index)
            .with_error_code(code(outcome.error))
            .with_base_offset(outcome.base_offset)
            .with_log_append_time_ms(-1)
            .with_log_start_offset(outcome.log_start_offset);
        match by_topic.iter_mut().find(|t| t.name == name) {
            Some(t) => t.partition_responses.push(partition),
            None => {
                by_topic.push(TopicProduceResponse::default().with_name(name).with_partition_responses(vec![partition]))
            }
        }
    }
    (acks != 0).then(|| ProduceResponse::default().with_responses(by_topic))
}

/// Kafka's default `fetch.max.bytes`: the most one Fetch answer carries (at least one batch is always sent).
const FETCH_MAX_BYTES: usize = 57_671_680;

async fn fetch(ctx: &Arc<BrokerContext>, req: FetchRequest) -> FetchResponse {
    let deadline = Instant::now() + Duration::from_millis(req.max_wait_ms.clamp(0, 60_000) as u64);
    let min_bytes = req.min_bytes.max(0) as usize;
    loop {
        let (response, bytes) = fetch_once(ctx, &req).await;
        let any_error = response.responses.iter().flat_map(|t| &t.partitions).any(|p| p.error_code != 0);
        if bytes >= min_bytes || any_error || Instant::now() >= deadline {
            return response;
        }
        // Long poll: look again shortly, until enough data arrived or max.wait.ms passed.
        glommio::timer::sleep(Duration::from_millis(5)).await;
    }
}

async fn fetch_once(ctx: &Arc<BrokerContext>, req: &FetchRequest) -> (FetchResponse, usize) {
    // Kafka's fetch.max.bytes bounds what one answer holds, whatever the client asks for.
    let mut budget = if req.max_bytes <= 0 { FETCH_MAX_BYTES } else { (req.max_bytes as usize).min(FETCH_MAX_BYTES) };
    let mut total = 0usize;
    let mut topics = Vec::new();
    for topic in &req.topics {
        let name = topic.topic.0.as_str().to_string();
        let mut partitions = Vec::new();
        for p in &topic.partitions {
            let outcome = match (ctx.owner(&name, p.partition), u64::try_from(p.fetch_offset)) {
                // The answer is full: later partitions get nothing this time (Kafka's fetch.max.bytes).
                (Some(_), Ok(_)) if budget == 0 && total > 0 => {
                    Some(FetchOutcome { error: None, records: Bytes::new(), high_watermark: -1, log_start_offset: -1 })
                }
                (Some(shard), Ok(offset)) => {
                    let max_bytes = (p.partition_max_bytes.max(0) as usize).min(budget);
                    let tp = TopicPartition::new(name.clone(), p.partition as u32);
                    ask(ctx, shard, |reply| PartitionRequest::Fetch { tp, offset: Offset(offset), max_bytes, reply })
                        .await
                }
                (Some(_), Err(_)) => Some(FetchOutcome {
                    error: Some(ResponseError::OffsetOutOfRange),
                    records: Bytes::new(),
                    high_watermark: -1,
                    log_start_offset: -1,
                }),
                (None, _) => None,
            };
            let outcome = outcome.unwrap_or(FetchOutcome {
                error: Some(ResponseError::UnknownTopicOrPartition),
                records: Bytes::new(),
                high_watermark: -1,
                log_start_offset: -1,
            });
            total += outcome.records.len();
            budget = budget.saturating_sub(outcome.records.len());
            partitions.push(
                PartitionData::default()
                    .with_partition_index(p.partition)
                    .with_error_code(code(outcome.error))
                    .with_high_watermark(outcome.high_watermark)
                    .with_last_stable_offset(outcome.high_watermark)
                    .with_log_start_offset(outcome.log_start_offset)
                    .with_preferred_read_replica(BrokerId(-1))
                    .with_records(Some(outcome.records)),
            );
        }
        topics.push(FetchableTopicResponse::default().with_topic(topic.topic.clone()).with_partitions(partitions));
    }
    (FetchResponse::default().with_responses(topics), total)
}

async fn list_offsets(ctx: &Arc<BrokerContext>, req: ListOffsetsRequest, version: i16) -> ListOffsetsResponse {
    let mut topics = Vec::new();
    for topic in &req.topics {
        let name = topic.name.0.as_str().to_string();
        let mut partitions = Vec::new();
        for p in &topic.partitions {
            let spec = match p.timestamp {
                -2 => Some(OffsetSpec::Earliest),
                -1 => Some(OffsetSpec::Latest),
                ts if ts >= 0 => Some(OffsetSpec::Timestamp(ts)),
                _ => None,
            };
            let outcome = match (ctx.owner(&name, p.partition_index), spec) {
                (Some(shard), Some(spec)) => {
                    let tp = TopicPartition::new(name.clone(), p.partition_index as u32);
                    ask(ctx, shard, |reply| PartitionRequest::ListOffsets { tp, spec, reply }).await
                }
                (Some(_), None) => {
                    Some(ListOutcome { error: Some(ResponseError::InvalidRequest), offset: -1, timestamp: -1 })
                }
                (None, _) => None,
            };
            let outcome = outcome.unwrap_or(ListOutcome {
                error: Some(ResponseError::UnknownTopicOrPartition),
                offset: -1,
                timestamp: -1,
            });
            let mut answer = ListOffsetsPartitionResponse::default()
                .with_partition_index(p.partition_index)
                .with_error_code(code(outcome.error))
                .with_offset(outcome.offset)
                .with_timestamp(outcome.timestamp);
            // The leader epoch is in the answer from v4 on; the codec refuses it earlier.
            if version >= 4 && outcome.error.is_none() {
                answer.leader_epoch = ctx.leader_epoch(&name, p.partition_index);
            }
            partitions.push(answer);
        }
        topics.push(ListOffsetsTopicResponse::default().with_name(topic.name.clone()).with_partitions(partitions));
    }
    ListOffsetsResponse::default().with_topics(topics)
}

/// Asks shard 0 to apply a topic change and waits for its answer; `None` if shard 0 is gone.
async fn ask_admin<T>(ctx: &BrokerContext, make: impl FnOnce(flume::Sender<T>) -> AdminRequest) -> Option<T> {
    let (tx, rx) = flume::bounded(1);
    ctx.admin.send_async(make(tx)).await.ok()?;
    rx.recv_async().await.ok()
}

async fn delete_topics(ctx: &Arc<BrokerContext>, req: DeleteTopicsRequest) -> DeleteTopicsResponse {
    // v6 names topics in `topics` (by name; deletion by id is not supported), earlier versions in `topic_names`.
    let mut names: Vec<Option<String>> = req.topic_names.iter().map(|n| Some(n.0.as_str().to_string())).collect();
    names.extend(req.topics.iter().map(|t| t.name.as_ref().map(|n| n.0.as_str().to_string())));
    let known: Vec<String> = names.iter().flatten().cloned().collect();
    let outcomes = ask_admin(ctx, |reply| AdminRequest::DeleteTopics { names: known, reply }).await.unwrap_or_default();
    let responses = names
        .iter()
        .map(|name| match name {
            Some(name) => {
                let error = outcomes
                    .iter()
                    .find(|(n, _)| n == name)
                    .map_or(Some(ResponseError::KafkaStorageError), |(_, e)| *e);
                DeletableTopicResult::default().with_name(Some(topic_name(name))).with_error_code(code(error))
            }
            None => DeletableTopicResult::default().with_error_code(ResponseError::UnsupportedVersion.code()),
        })
        .collect();
    DeleteTopicsResponse::default().with_responses(responses)
}

async fn apply_delete_topics(ctx: &Arc<BrokerContext>, names: Vec<String>) -> Vec<(String, Option<ResponseError>)> {
    let mut updated = ctx.topics.read().expect("topic lock").clone();
    let mut outcomes = Vec::new();
    let mut deleted = Vec::new();
    for name in names {
        match updated.delete(&name) {
            Ok(meta) => {
                deleted.push((name.clone(), meta.partitions.len()));
                outcomes.push((name, None));
            }
            Err(e) => outcomes.push((name, Some(topic_error_code(&e)))),
        }
    }
    if deleted.is_empty() {
        return outcomes;
    }
    if let Err(e) = updated.save(&shardlog_storage::fs::dma::DmaFs, &ctx.config.data_dir).await {
        tracing::error!(error = %e, "cannot record topic deletion");
        return outcomes.into_iter().map(|(n, _)| (n, Some(ResponseError::KafkaStorageError))).collect();
    }
    // Owners are looked up before the record changes; the logs go after it, so a crash in between leaves
    // unrecorded partition directories, which no shard opens.
    let owners: Vec<(TopicPartition, Option<usize>)> = deleted
        .iter()
        .flat_map(|(name, count)| (0..*count).map(move |p| (name.clone(), p)))
        .map(|(name, p)| {
            let owner = ctx.owner(&name, p as i32);
            (TopicPartition::new(name, p as u32), owner)
        })
        .collect();
    *ctx.topics.write().expect("topic lock") = updated;
    for (tp, owner) in owners {
        let Some(shard) = owner else { continue };
        let log = tp.clone();
        match ask(ctx, shard, |reply| PartitionRequest::Delete { tp: log, reply }).await {
            Some(Ok(())) => {}
            other => tracing::error!(partition = %tp, outcome = ?other, "cannot delete partition log"),
        }
    }
    for (name, _) in &deleted {
        tracing::info!(topic = %name, "deleted topic");
    }
    outcomes
}

async fn create_partitions(ctx: &Arc<BrokerContext>, req: CreatePartitionsRequest) -> CreatePartitionsResponse {
    let fallback = req
        .topics
        .iter()
        .map(|t| {
            CreatePartitionsTopicResult::default()
                .with_name(t.name.clone())
                .with_error_code(ResponseError::KafkaStorageError.code())
        })
        .collect();
    ask_admin(ctx, |reply| AdminRequest::CreatePartitions { request: req, reply })
        .await
        .unwrap_or_else(|| CreatePartitionsResponse::default().with_results(fallback))
}

async fn apply_create_partitions(ctx: &Arc<BrokerContext>, req: CreatePartitionsRequest) -> CreatePartitionsResponse {
    let shards = ctx.shards.len();
    let mut updated = ctx.topics.read().expect("topic lock").clone();
    let mut results = Vec::new();
    let mut grown = Vec::new();
    for topic in &req.topics {
        let name = topic.name.0.as_str().to_string();
        let result = CreatePartitionsTopicResult::default().with_name(topic.name.clone());
        if topic.assignments.as_ref().is_some_and(|a| !a.is_empty()) {
            results.push(result.with_error_code(ResponseError::InvalidReplicaAssignment.code()));
            continue;
        }
        let before = updated.topics.get(&name).map_or(0, |t| t.partitions.len());
        match updated.add_partitions(&name, topic.count as i64, shards) {
            Ok(()) => {
                grown.push((name, before, topic.count as usize));
                results.push(result);
            }
            Err(e) => results.push(
                result
                    .with_error_code(topic_error_code(&e).code())
                    .with_error_message(Some(StrBytes::from_string(e.to_string()))),
            ),
        }
    }
    if req.validate_only || grown.is_empty() {
        return CreatePartitionsResponse::default().with_results(results);
    }
    if let Err(e) = updated.save(&shardlog_storage::fs::dma::DmaFs, &ctx.config.data_dir).await {
        tracing::error!(error = %e, "cannot record new partitions");
        for r in results.iter_mut().filter(|r| r.error_code == 0) {
            r.error_code = ResponseError::KafkaStorageError.code();
        }
        return CreatePartitionsResponse::default().with_results(results);
    }
    *ctx.topics.write().expect("topic lock") = updated;
    let defaults = ctx.topic_defaults();
    for (name, from, to) in grown {
        let overrides = ctx.topics.read().expect("topic lock").topics[&name].configs.clone();
        let log = TopicConfig::resolve(&defaults, &overrides).map_or_else(|_| defaults.log.clone(), |c| c.log);
        for p in from..to {
            let Some(shard) = ctx.owner(&name, p as i32) else { continue };
            let tp = TopicPartition::new(name.clone(), p as u32);
            let config = log.clone();
            if !matches!(
                ask(ctx, shard, |reply| PartitionRequest::Create { tp: tp.clone(), config, reply }).await,
                Some(Ok(()))
            ) {
                tracing::error!(partition = %tp, "cannot create partition log");
            }
        }
    }
    CreatePartitionsResponse::default().with_results(results)
}

async fn delete_records(ctx: &Arc<BrokerContext>, req: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let mut topics = Vec::new();
    for topic in &req.topics {
        let name = topic.name.0.as_str().to_string();
        let mut partitions = Vec::new();
        for p in &topic.partitions {
            let outcome = match ctx.owner(&name, p.partition_index) {
                Some(shard) => {
                    let tp = TopicPartition::new(name.clone(), p.partition_index as u32);
                    ask(ctx, shard, |reply| PartitionRequest::DeleteRecords { tp, offset: p.offset, reply }).await
                }
                None => None,
            };
            let (error, low_watermark) = outcome.unwrap_or((Some(ResponseError::UnknownTopicOrPartition), -1));
            partitions.push(
                DeleteRecordsPartitionResult::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(code(error))
                    .with_low_watermark(low_watermark),
            );
        }
        topics.push(DeleteRecordsTopicResult::default().with_name(topic.name.clone()).with_partitions(partitions));
    }
    DeleteRecordsResponse::default().with_topics(topics)
}

/// Kafka's config resource types.
const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;

fn describe_configs(ctx: &Arc<BrokerContext>, req: DescribeConfigsRequest, version: i16) -> DescribeConfigsResponse {
    let defaults = ctx.topic_defaults();
    let results = req
        .resources
        .iter()
        .map(|resource| {
            let result = DescribeConfigsResult::default()
                .with_resource_type(resource.resource_type)
                .with_resource_name(resource.resource_name.clone());
            match resource.resource_type {
                RESOURCE_TOPIC => {
                    let name = resource.resource_name.as_str();
                    let overrides = ctx.topics.read().expect("topic lock").topics.get(name).map(|t| t.configs.clone());
                    let Some(overrides) = overrides else {
                        return result.with_error_code(ResponseError::UnknownTopicOrPartition.code());
                    };
                    let Ok(config) = TopicConfig::resolve(&defaults, &overrides) else {
                        return result.with_error_code(ResponseError::InvalidConfig.code());
                    };
                    let wanted = |key: &str| {
                        resource
                            .configuration_keys
                            .as_ref()
                            .is_none_or(|keys| keys.is_empty() || keys.iter().any(|k| k.as_str() == key))
                    };
                    let configs = config
                        .describe()
                        .into_iter()
                        .filter(|(key, _, _)| wanted(key))
                        .map(|(key, value, set)| {
                            let mut entry = DescribeConfigsResourceResult::default()
                                .with_name(StrBytes::from_static_str(key))
                                .with_value(Some(StrBytes::from_string(value)))
                                // DYNAMIC_TOPIC_CONFIG when set on the topic, DEFAULT_CONFIG otherwise.
                                .with_config_source(if set { 1 } else { 5 });
                            if version >= 3 {
                                // BOOLEAN (1) or LONG (5).
                                entry.config_type = if key == "unclean.leader.election.enable" { 1 } else { 5 };
                            }
                            entry
                        })
                        .collect();
                    result.with_configs(configs)
                }
                RESOURCE_BROKER if resource.resource_name.as_str() == ctx.config.node_id.to_string() => result,
                RESOURCE_BROKER => result.with_error_code(ResponseError::InvalidRequest.code()),
                _ => result.with_error_code(ResponseError::InvalidRequest.code()),
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

fn describe_cluster(ctx: &Arc<BrokerContext>) -> DescribeClusterResponse {
    let node = BrokerId(ctx.config.node_id as i32);
    let advertised = &ctx.config.advertised_listener;
    DescribeClusterResponse::default()
        .with_cluster_id(StrBytes::from_string(ctx.cluster_id.clone()))
        .with_controller_id(node)
        .with_brokers(vec![
            DescribeClusterBroker::default()
                .with_broker_id(node)
                .with_host(StrBytes::from_string(advertised.host.clone()))
                .with_port(advertised.port as i32),
        ])
}

async fn offset_for_leader_epoch(
    ctx: &Arc<BrokerContext>,
    req: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let mut topics = Vec::new();
    for topic in &req.topics {
        let name = topic.topic.0.as_str().to_string();
        let mut partitions = Vec::new();
        for p in &topic.partitions {
            let current = ctx.leader_epoch(&name, p.partition);
            let answer =
                EpochEndOffset::default().with_partition(p.partition).with_leader_epoch(-1).with_end_offset(-1);
            let answer = match ctx.owner(&name, p.partition) {
                None => answer.with_error_code(ResponseError::UnknownTopicOrPartition.code()),
                // The client's view of the leader epoch must be ours (-1: it has none).
                Some(_) if p.current_leader_epoch > current => {
                    answer.with_error_code(ResponseError::UnknownLeaderEpoch.code())
                }
                Some(_) if p.current_leader_epoch >= 0 && p.current_leader_epoch < current => {
                    answer.with_error_code(ResponseError::FencedLeaderEpoch.code())
                }
                Some(shard) => {
                    let tp = TopicPartition::new(name.clone(), p.partition as u32);
                    let epoch = LeaderEpoch(p.leader_epoch);
                    match ask(ctx, shard, |reply| PartitionRequest::EpochEnd { tp, epoch, reply }).await {
                        Some(Some((epoch, end))) => answer.with_leader_epoch(epoch.0).with_end_offset(end.as_i64()),
                        Some(None) => answer,
                        None => answer.with_error_code(ResponseError::KafkaStorageError.code()),
                    }
                }
            };
            partitions.push(answer);
        }
        topics.push(OffsetForLeaderTopicResult::default().with_topic(topic.topic.clone()).with_partitions(partitions));
    }
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}

async fn alter_configs(ctx: &Arc<BrokerContext>, req: AlterConfigsRequest) -> AlterConfigsResponse {
    use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
    let changes = req
        .resources
        .iter()
        .map(|r| {
            if r.resource_type != RESOURCE_TOPIC {
                return ConfigChange::Refused(
                    ResponseError::InvalidRequest,
                    "only topic configs can be altered".into(),
                );
            }
            let mut configs = BTreeMap::new();
            for c in &r.configs {
                match &c.value {
                    Some(v) => {
                        configs.insert(c.name.as_str().to_string(), v.as_str().to_string());
                    }
                    None => {
                        return ConfigChange::Refused(
                            ResponseError::InvalidConfig,
                            format!("{} has no value", c.name.as_str()),
                        );
                    }
                }
            }
            ConfigChange::Replace { topic: r.resource_name.as_str().to_string(), configs }
        })
        .collect();
    let outcomes = alter(ctx, changes, req.validate_only, req.resources.len()).await;
    let responses = req
        .resources
        .iter()
        .zip(outcomes)
        .map(|(r, outcome)| {
            let base = AlterConfigsResourceResponse::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            match outcome {
                Ok(()) => base,
                Err((e, m)) => base.with_error_code(e.code()).with_error_message(Some(StrBytes::from_string(m))),
            }
        })
        .collect();
    AlterConfigsResponse::default().with_responses(responses)
}

async fn incremental_alter_configs(
    ctx: &Arc<BrokerContext>,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
    let changes = req
        .resources
        .iter()
        .map(|r| {
            if r.resource_type != RESOURCE_TOPIC {
                return ConfigChange::Refused(
                    ResponseError::InvalidRequest,
                    "only topic configs can be altered".into(),
                );
            }
            let mut edits = Vec::new();
            for c in &r.configs {
                let key = c.name.as_str().to_string();
                match (c.config_operation, &c.value) {
                    (0, Some(v)) => edits.push((key, Some(v.as_str().to_string()))),
                    (0, None) => {
                        return ConfigChange::Refused(
                            ResponseError::InvalidConfig,
                            format!("SET {key} without a value"),
                        );
                    }
                    (1, _) => edits.push((key, None)),
                    // APPEND and SUBTRACT are for list-valued settings; none of the topic settings is one.
                    (op, _) => {
                        return ConfigChange::Refused(
                            ResponseError::InvalidConfig,
                            format!("operation {op} does not apply to {key}"),
                        );
                    }
                }
            }
            ConfigChange::Edit { topic: r.resource_name.as_str().to_string(), edits }
        })
        .collect();
    let outcomes = alter(ctx, changes, req.validate_only, req.resources.len()).await;
    let responses = req
        .resources
        .iter()
        .zip(outcomes)
        .map(|(r, outcome)| {
            let base = AlterConfigsResourceResponse::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            match outcome {
                Ok(()) => base,
                Err((e, m)) => base.with_error_code(e.code()).with_error_message(Some(StrBytes::from_string(m))),
            }
        })
        .collect();
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}

async fn alter(
    ctx: &Arc<BrokerContext>,
    changes: Vec<ConfigChange>,
    validate_only: bool,
    count: usize,
) -> Vec<Result<(), (ResponseError, String)>> {
    ask_admin(ctx, |reply| AdminRequest::AlterConfigs { changes, validate_only, reply })
        .await
        .unwrap_or_else(|| vec![Err((ResponseError::KafkaStorageError, "broker is stopping".into())); count])
}

async fn apply_alter_configs(
    ctx: &Arc<BrokerContext>,
    changes: Vec<ConfigChange>,
    validate_only: bool,
) -> Vec<Result<(), (ResponseError, String)>> {
    let defaults = ctx.topic_defaults();
    let mut updated = ctx.topics.read().expect("topic lock").clone();
    let mut outcomes = Vec::new();
    let mut changed = Vec::new();
    for change in changes {
        let (topic, configs) = match change {
            ConfigChange::Refused(e, m) => {
                outcomes.push(Err((e, m)));
                continue;
            }
            ConfigChange::Replace { topic, configs } => (topic, Some(configs)),
            ConfigChange::Edit { topic, edits } => {
                let current = updated.topics.get(&topic).map(|t| t.configs.clone());
                let edited = current.map(|mut c| {
                    for (key, value) in edits {
                        match value {
                            Some(v) => c.insert(key, v),
                            None => c.remove(&key),
                        };
                    }
                    c
                });
                (topic, edited)
            }
        };
        let Some(meta) = updated.topics.get_mut(&topic) else {
            outcomes.push(Err((ResponseError::UnknownTopicOrPartition, format!("topic {topic:?} does not exist"))));
            continue;
        };
        let configs = configs.expect("present for an existing topic");
        match TopicConfig::resolve(&defaults, &configs) {
            Ok(resolved) => {
                meta.configs = configs;
                changed.push((topic, resolved, meta.partitions.len()));
                outcomes.push(Ok(()));
            }
            Err(e) => outcomes.push(Err((ResponseError::InvalidConfig, e.to_string()))),
        }
    }
    if validate_only || changed.is_empty() {
        return outcomes;
    }
    if let Err(e) = updated.save(&shardlog_storage::fs::dma::DmaFs, &ctx.config.data_dir).await {
        tracing::error!(error = %e, "cannot record topic configs");
        return outcomes
            .into_iter()
            .map(|o| o.and(Err((ResponseError::KafkaStorageError, "cannot record the change".into()))))
            .collect();
    }
    *ctx.topics.write().expect("topic lock") = updated;
    for (topic, resolved, partitions) in changed {
        for p in 0..partitions {
            let Some(shard) = ctx.owner(&topic, p as i32) else { continue };
            let tp = TopicPartition::new(topic.clone(), p as u32);
            let config = resolved.log.clone();
            if !matches!(
                ask(ctx, shard, |reply| PartitionRequest::SetConfig { tp: tp.clone(), config, reply }).await,
                Some(Ok(()))
            ) {
                tracing::error!(partition = %tp, "cannot apply new settings");
            }
        }
        tracing::info!(topic = %topic, "altered topic configs");
    }
    outcomes
}
