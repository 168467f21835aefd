//! What the cluster looks like: Metadata (with topic auto-creation), DescribeConfigs, DescribeCluster.

use super::*;
use crate::topics::configs::TOPIC_SETTINGS;

pub(super) async fn metadata(
    ctx: &Arc<BrokerContext>,
    req: &MetadataRequest,
    version: i16,
    client: &ClientInfo,
) -> MetadataResponse {
    let listener = &*client.listener;
    // Before v4 there is no flag and auto-creation is always asked for.
    let auto_create = ctx.config.auto_create_topics && (version < 4 || req.allow_auto_topic_creation);
    // All topics: a null list, or (v0 only, which has no null) an empty one. From v10 on a topic may be
    // asked for by id instead of name; an id nobody has is answered as unknown.
    let mut unknown_ids = Vec::new();
    let image = ctx.image();
    let names: Vec<String> = match &req.topics {
        None => image.state.topics.keys().cloned().collect(),
        Some(topics) if version == 0 && topics.is_empty() => image.state.topics.keys().cloned().collect(),
        Some(topics) => topics
            .iter()
            .filter_map(|t| match &t.name {
                // Asked by id when the name is null (or, from lenient clients, empty with an id set).
                Some(name) if !name.0.is_empty() || t.topic_id.is_nil() => Some(name.0.as_str().to_string()),
                _ => {
                    let found =
                        image.state.topics.iter().find(|(_, meta)| meta.id == t.topic_id && !t.topic_id.is_nil());
                    if found.is_none() {
                        unknown_ids.push(t.topic_id);
                    }
                    found.map(|(name, _)| name.clone())
                }
            })
            .collect(),
    };
    let missing: Vec<&String> = names.iter().filter(|n| image.topic(n).is_none()).collect();
    let image = if auto_create && !missing.is_empty() {
        let mut request = CreateTopicsRequest::default();
        // With an authorizer, auto-creation needs CREATE on the cluster or on the topic.
        let authorizer = ctx.authorization.as_ref().map(|a| (a.authorizer(&image), client.request_context()));
        let may_create = |name: &str| {
            authorizer.as_ref().is_none_or(|(authorizer, asker)| {
                crate::security::authorizer::rules::may_auto_create_topic(asker, authorizer, name)
            })
        };
        request.topics = missing
            .iter()
            // Internal topics are made by the broker, with their own settings.
            .filter(|n| crate::topics::validate_topic_name(n).is_ok() && !crate::topics::is_internal(n))
            .filter(|n| may_create(n))
            .map(|n| {
                kafka_protocol::messages::create_topics_request::CreatableTopic::default()
                    .with_name(topic_name(n))
                    .with_num_partitions(-1)
                    .with_replication_factor(-1)
            })
            .collect();
        let (tx, rx) = flume::bounded(1);
        if ctx.admin.send_async(AdminRequest::CreateTopics { request, internal: false, reply: tx }).await.is_ok() {
            let _ = rx.recv_async().await;
        }
        ctx.image()
    } else {
        image
    };
    let unknown_id_entries = unknown_ids.into_iter().map(|id| {
        MetadataResponseTopic::default().with_topic_id(id).with_error_code(ResponseError::UnknownTopicId.code())
    });
    let broker_id = |id: &NodeId| BrokerId(id.0 as i32);
    let topic_entries = names
        .iter()
        .map(|name| match image.topic(name) {
            Some(meta) => MetadataResponseTopic::default()
                .with_name(Some(topic_name(name)))
                .with_topic_id(meta.id)
                .with_is_internal(crate::topics::is_internal(name))
                .with_partitions(
                    meta.partitions
                        .iter()
                        .enumerate()
                        .map(|(i, p)| {
                            let error = if p.leader.is_none() { ResponseError::LeaderNotAvailable.code() } else { 0 };
                            MetadataResponsePartition::default()
                                .with_partition_index(i as i32)
                                .with_error_code(error)
                                .with_leader_id(p.leader.as_ref().map_or(BrokerId(-1), broker_id))
                                .with_leader_epoch(p.leader_epoch.0)
                                .with_replica_nodes(p.replicas.iter().map(broker_id).collect())
                                .with_isr_nodes(p.isr.iter().map(broker_id).collect())
                                // Down, or holding a damaged log (reported offline by its broker).
                                .with_offline_replicas(
                                    p.replicas
                                        .iter()
                                        .filter(|id| !image.is_live(**id) || p.offline_replicas.contains(id))
                                        .map(broker_id)
                                        .collect(),
                                )
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
        .chain(unknown_id_entries)
        .collect();
    let brokers = live_brokers(ctx, &image, listener)
        .into_iter()
        .map(|(id, host, port)| MetadataResponseBroker::default().with_node_id(id).with_host(host).with_port(port))
        .collect();
    MetadataResponse::default()
        .with_brokers(brokers)
        .with_cluster_id(Some(StrBytes::from_string(ctx.cluster_id.clone())))
        .with_controller_id(controller(ctx, &image))
        .with_topics(topic_entries)
}

/// The controller clients are told of: the Raft leader when it is a live broker, else this broker
/// (as in Kafka's KRaft mode, admin requests may go to any broker, which forwards them to the quorum).
fn controller(ctx: &BrokerContext, image: &MetadataImage) -> BrokerId {
    let id = image.controller.filter(|id| image.is_live(*id)).map_or(ctx.config.node_id, |id| id.0);
    BrokerId(id as i32)
}

/// The unfenced brokers with their addresses for the clients of `listener`; this broker is always among
/// them (a client that reached it may use it, and it answers for itself).
fn live_brokers(ctx: &BrokerContext, image: &MetadataImage, listener: &str) -> Vec<(BrokerId, StrBytes, i32)> {
    let me = NodeId(ctx.config.node_id);
    let others = image.state.brokers.iter().filter(|(id, b)| !b.fenced && **id != me).map(|(id, _)| *id);
    let mut out: Vec<(BrokerId, StrBytes, i32)> = others
        .chain([me])
        .filter_map(|id| {
            let (host, port) = ctx.broker_address(image, id, listener)?;
            Some((BrokerId(id.0 as i32), StrBytes::from_string(host), port as i32))
        })
        .collect();
    out.sort_by_key(|(id, _, _)| *id);
    out
}

/// Kafka's config resource types.
pub(super) const RESOURCE_TOPIC: i8 = 2;
pub(super) const RESOURCE_BROKER: i8 = 4;

pub(super) fn describe_configs(
    ctx: &Arc<BrokerContext>,
    req: DescribeConfigsRequest,
    version: i16,
) -> DescribeConfigsResponse {
    let defaults = ctx.topic_defaults();
    let documented = version >= 3 && req.include_documentation;
    let with_synonyms = version >= 1 && req.include_synonyms;
    let results = req
        .resources
        .iter()
        .map(|resource| {
            let result = DescribeConfigsResult::default()
                .with_resource_type(resource.resource_type)
                .with_resource_name(resource.resource_name.clone());
            let wanted = |key: &str| {
                resource
                    .configuration_keys
                    .as_ref()
                    .is_none_or(|keys| keys.is_empty() || keys.iter().any(|k| k.as_str() == key))
            };
            // Kafka's config types (v3+) and sources.
            let entry = |key: &'static str, value: Option<String>, source: i8, kafka_type: i8, doc: &'static str| {
                let mut entry = DescribeConfigsResourceResult::default()
                    .with_name(StrBytes::from_static_str(key))
                    .with_value(value.map(StrBytes::from_string))
                    .with_config_source(source);
                if version >= 3 {
                    entry.config_type = kafka_type;
                }
                if documented {
                    entry.documentation = Some(StrBytes::from_static_str(doc));
                }
                entry
            };
            match resource.resource_type {
                RESOURCE_TOPIC => {
                    let name = resource.resource_name.as_str();
                    let overrides = ctx.image().topic(name).map(|t| t.configs.clone());
                    let Some(overrides) = overrides else {
                        return result.with_error_code(ResponseError::UnknownTopicOrPartition.code());
                    };
                    let Ok(config) = TopicConfig::resolve(&defaults, &overrides) else {
                        return result.with_error_code(ResponseError::InvalidConfig.code());
                    };
                    let configs = config
                        .describe()
                        .into_iter()
                        .zip(TOPIC_SETTINGS)
                        .filter(|((key, _, _), _)| wanted(key))
                        .map(|((key, value, set), setting)| {
                            let kafka_type = match key {
                                "unclean.leader.election.enable" => CONFIG_TYPE_BOOLEAN,
                                "compression.type" => CONFIG_TYPE_STRING,
                                _ => CONFIG_TYPE_LONG,
                            };
                            let source = if set { SOURCE_DYNAMIC_TOPIC } else { SOURCE_DEFAULT };
                            let mut described = entry(key, Some(value.clone()), source, kafka_type, setting.meaning);
                            if with_synonyms {
                                described.synonyms = topic_synonyms(ctx, setting, set.then_some(value));
                            }
                            described
                        })
                        .collect();
                    result.with_configs(configs)
                }
                // This broker's own settings: all static (set at start), so read-only.
                RESOURCE_BROKER if resource.resource_name.as_str() == ctx.config.node_id.to_string() => {
                    let configs = ctx
                        .config
                        .effective
                        .iter()
                        .zip(crate::config::settings::SETTINGS)
                        .filter(|(e, _)| wanted(e.key))
                        .map(|(e, setting)| {
                            let source = if e.explicit { SOURCE_STATIC_BROKER } else { SOURCE_DEFAULT };
                            entry(e.key, e.value.clone(), source, setting.kafka_type(), setting.meaning)
                                .with_read_only(true)
                        })
                        .collect();
                    result.with_configs(configs)
                }
                // The cluster-wide dynamic broker defaults: there are none.
                RESOURCE_BROKER if resource.resource_name.is_empty() => result,
                RESOURCE_BROKER => result.with_error_code(ResponseError::InvalidRequest.code()).with_error_message(
                    Some(StrBytes::from_string(format!(
                        "this is broker {}: ask each broker for its own settings",
                        ctx.config.node_id
                    ))),
                ),
                _ => result.with_error_code(ResponseError::InvalidRequest.code()),
            }
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

/// Where a topic setting's value comes from, as Kafka lists it (DescribeConfigs v1+ `synonyms`): the
/// topic's own value if set, then the broker setting that gives its default, as set at start or as its
/// default. A broker setting left unset has no value: for `log.flush.interval.messages` and
/// `log.flush.interval.ms` that means every acknowledged batch is fdatasync'ed first, which the topic's
/// own values (Kafka's numbers for "never") cannot say.
fn topic_synonyms(
    ctx: &BrokerContext,
    setting: &crate::topics::configs::TopicSetting,
    on_topic: Option<String>,
) -> Vec<DescribeConfigsSynonym> {
    let synonym = |name: &str, value: Option<String>, source: i8| {
        DescribeConfigsSynonym::default()
            .with_name(StrBytes::from_string(name.to_string()))
            .with_value(value.map(StrBytes::from_string))
            .with_source(source)
    };
    let mut synonyms: Vec<_> =
        on_topic.map(|v| synonym(setting.key, Some(v), SOURCE_DYNAMIC_TOPIC)).into_iter().collect();
    let broker = setting.broker_key.and_then(|key| ctx.config.effective.iter().find(|e| e.key == key));
    if let Some(broker) = broker {
        let source = if broker.explicit { SOURCE_STATIC_BROKER } else { SOURCE_DEFAULT };
        synonyms.push(synonym(broker.key, broker.value.clone(), source));
    }
    synonyms
}

/// Kafka's `ConfigSource` values.
const SOURCE_DYNAMIC_TOPIC: i8 = 1;
const SOURCE_STATIC_BROKER: i8 = 4;
const SOURCE_DEFAULT: i8 = 5;
/// Kafka's `ConfigType` values (DescribeConfigs v3+).
const CONFIG_TYPE_BOOLEAN: i8 = 1;
const CONFIG_TYPE_STRING: i8 = 2;
const CONFIG_TYPE_LONG: i8 = 5;

pub(super) fn describe_cluster(ctx: &Arc<BrokerContext>, listener: &str) -> DescribeClusterResponse {
    let image = ctx.image();
    let brokers = live_brokers(ctx, &image, listener)
        .into_iter()
        .map(|(id, host, port)| DescribeClusterBroker::default().with_broker_id(id).with_host(host).with_port(port))
        .collect();
    DescribeClusterResponse::default()
        .with_cluster_id(StrBytes::from_string(ctx.cluster_id.clone()))
        .with_controller_id(controller(ctx, &image))
        .with_brokers(brokers)
}
