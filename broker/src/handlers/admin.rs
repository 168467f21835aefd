//! Topic changes: CreateTopics, DeleteTopics, CreatePartitions, AlterConfigs, IncrementalAlterConfigs.
//! Requests on any shard are forwarded to shard 0, which handles them one at a time: validate against the
//! metadata image, commit the change through the quorum, then wait until this broker's shards have
//! applied it (created, reconfigured or deleted the partition logs), so the client's next request here
//! sees it. One at a time, so a settings edit is never computed from a state another edit is replacing.

use kafka_protocol::messages::create_topics_request::CreatableTopic;

use super::*;
use std::collections::BTreeSet;

use crate::context::ConfigEdit;
use crate::quorum::state::{Command, Event, NodeId};
use crate::quorum::wire::WireWriteResult;
use crate::topics::MAX_PARTITIONS;
use crate::topics::configs::TOPIC_SETTINGS;

pub(super) async fn create_topics(ctx: &Arc<BrokerContext>, request: CreateTopicsRequest) -> CreateTopicsResponse {
    let (tx, rx) = flume::bounded(1);
    if ctx
        .admin
        .send_async(AdminRequest::CreateTopics { request: request.clone(), internal: false, reply: tx })
        .await
        .is_ok()
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
            AdminRequest::CreateTopics { request, internal, reply } => {
                let response = apply_create_topics(&ctx, request, internal).await;
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

/// How long an admin request waits, after its change committed, for this broker to apply it (so that
/// the client's next request here sees it).
const APPLY_WAIT: Duration = Duration::from_secs(30);

/// A refusal: Kafka error code and message.
type Refusal = (i16, String);

/// Commits a topic change through the quorum and waits until this broker's shards apply it.
pub(super) async fn commit(ctx: &Arc<BrokerContext>, command: Command) -> Result<(), Refusal> {
    commit_events(ctx, command).await.map(|_| ())
}

/// [`commit`], giving the events the command caused (DeleteAcls answers with them).
pub(super) async fn commit_events(ctx: &Arc<BrokerContext>, command: Command) -> Result<Vec<Event>, Refusal> {
    let (index, events) = match ctx.quorum.write(command).await {
        WireWriteResult::Applied { index, outcome: Ok(events) } => (index, events),
        WireWriteResult::Applied { outcome: Err(e), .. } => return Err((e.kafka_code(), e.to_string())),
        WireWriteResult::NoLeader => {
            return Err((ResponseError::NotController.code(), "the quorum has no leader right now".into()));
        }
        WireWriteResult::Failed(reason) if reason.contains(crate::disk_space::QUORUM_DISK_FULL) => {
            return Err((ResponseError::KafkaStorageError.code(), reason));
        }
        WireWriteResult::Failed(reason) => return Err((ResponseError::RequestTimedOut.code(), reason)),
    };
    if !ctx.wait_reconciled(index, APPLY_WAIT).await {
        tracing::warn!(index, "a committed topic change is not applied here yet");
    }
    Ok(events)
}

fn refusal(error: ResponseError, message: impl Into<String>) -> Refusal {
    (error.code(), message.into())
}

/// Checks a partition count against Kafka's bounds.
fn check_partition_count(count: i64) -> Result<u32, Refusal> {
    if count < 1 || count > MAX_PARTITIONS as i64 {
        return Err(refusal(
            ResponseError::InvalidPartitions,
            format!("{count} partitions: must be in [1, {MAX_PARTITIONS}]"),
        ));
    }
    Ok(count as u32)
}

/// Validates one topic of a CreateTopics request into the command that creates it and the answer given
/// once it is committed.
fn plan_create(
    ctx: &BrokerContext,
    image: &MetadataImage,
    topic: &CreatableTopic,
    internal: bool,
) -> Result<(Command, CreatableTopicResult), Refusal> {
    let name = topic.name.0.as_str().to_string();
    crate::topics::validate_topic_name(&name)
        .map_err(|e| refusal(ResponseError::InvalidTopicException, e.to_string()))?;
    if crate::topics::is_internal(&name) && !internal {
        return Err(refusal(
            ResponseError::InvalidRequest,
            format!("{name} is internal: the broker creates it when its coordinator is first asked for"),
        ));
    }
    if image.topic(&name).is_some() {
        return Err(refusal(ResponseError::TopicAlreadyExists, "a topic of this name already exists"));
    }
    let assignment = if topic.assignments.is_empty() {
        None
    } else {
        if topic.num_partitions != -1 || topic.replication_factor != -1 {
            return Err(refusal(
                ResponseError::InvalidRequest,
                "with a replica assignment, the partition count and replication factor must be -1",
            ));
        }
        let mut lists = vec![None; topic.assignments.len()];
        for a in &topic.assignments {
            let slot = usize::try_from(a.partition_index).ok().and_then(|i| lists.get_mut(i));
            match slot {
                Some(slot @ None) => *slot = Some(broker_ids(&a.broker_ids)?),
                _ => {
                    return Err(refusal(
                        ResponseError::InvalidReplicaAssignment,
                        format!("partition {} is not one of 0..{} once", a.partition_index, topic.assignments.len()),
                    ));
                }
            }
        }
        let lists: Vec<Vec<NodeId>> = lists.into_iter().map(|l| l.expect("every index filled once")).collect();
        check_assignment(image, &lists, lists[0].len())?;
        Some(lists)
    };
    let partitions = match &assignment {
        Some(lists) => lists.len() as i64,
        None if topic.num_partitions == -1 => ctx.config.num_partitions as i64,
        None => topic.num_partitions as i64,
    };
    let partitions = check_partition_count(partitions)?;
    let replication = match &assignment {
        Some(lists) => lists[0].len() as i64,
        None if topic.replication_factor == -1 => ctx.config.default_replication_factor as i64,
        None => topic.replication_factor as i64,
    };
    let live = image.state.live().len();
    if assignment.is_none() && (replication < 1 || replication > live as i64) {
        return Err(refusal(
            ResponseError::InvalidReplicationFactor,
            format!("replication factor {replication}: {live} live broker(s)"),
        ));
    }
    let mut configs = BTreeMap::new();
    for c in &topic.configs {
        let value = c
            .value
            .as_ref()
            .ok_or_else(|| refusal(ResponseError::InvalidConfig, format!("config {} has no value", c.name.as_str())))?;
        configs.insert(c.name.as_str().to_string(), value.as_str().to_string());
    }
    let resolved = TopicConfig::resolve(&ctx.topic_defaults(), &configs)
        .map_err(|e| refusal(ResponseError::InvalidConfig, e.to_string()))?;
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
    let id = uuid::Uuid::new_v4();
    let created = CreatableTopicResult::default()
        .with_name(topic.name.clone())
        .with_topic_id(id)
        .with_num_partitions(partitions as i32)
        .with_replication_factor(replication as i16)
        .with_configs(Some(described));
    let command =
        Command::CreateTopic { name, id, partitions, replication_factor: replication as u16, configs, assignment };
    Ok((command, created))
}

/// Kafka's checks of an explicit replica assignment: every partition has `replication` replicas (at
/// least one), no broker twice in a partition, every broker registered. INVALID_REPLICA_ASSIGNMENT
/// otherwise. (The quorum checks again when it applies the command.)
fn check_assignment(image: &MetadataImage, lists: &[Vec<NodeId>], replication: usize) -> Result<(), Refusal> {
    let invalid = |message: String| Err(refusal(ResponseError::InvalidReplicaAssignment, message));
    for (index, replicas) in lists.iter().enumerate() {
        if replicas.is_empty() || replicas.len() != replication {
            return invalid(format!(
                "partition {index}: {} replicas, all partitions need {replication}",
                replicas.len()
            ));
        }
        if replicas.iter().collect::<BTreeSet<_>>().len() != replicas.len() {
            let listed: Vec<String> = replicas.iter().map(ToString::to_string).collect();
            return invalid(format!("partition {index}: a broker appears twice in {}", listed.join(",")));
        }
        if let Some(unknown) = replicas.iter().find(|id| !image.state.brokers.contains_key(id)) {
            return invalid(format!("partition {index}: broker {unknown} is not registered"));
        }
        if !replicas.iter().any(|id| image.is_live(*id)) {
            return invalid(format!("partition {index}: every broker of it is fenced"));
        }
    }
    Ok(())
}

/// Broker ids of a request's assignment; a negative one is no broker.
fn broker_ids(ids: &[BrokerId]) -> Result<Vec<NodeId>, Refusal> {
    ids.iter()
        .map(|b| {
            u32::try_from(b.0).map(NodeId).map_err(|_| {
                refusal(ResponseError::InvalidReplicaAssignment, format!("broker {} is not registered", b.0))
            })
        })
        .collect()
}

pub(super) async fn apply_create_topics(
    ctx: &Arc<BrokerContext>,
    request: CreateTopicsRequest,
    internal: bool,
) -> CreateTopicsResponse {
    let mut results = Vec::new();
    for topic in &request.topics {
        let refused = |(code, message): Refusal| {
            CreatableTopicResult::default()
                .with_name(topic.name.clone())
                .with_error_code(code)
                .with_error_message(Some(StrBytes::from_string(message)))
        };
        let (command, created) = match plan_create(ctx, &ctx.image(), topic, internal) {
            Ok(planned) => planned,
            Err(refusal) => {
                results.push(refused(refusal));
                continue;
            }
        };
        if request.validate_only {
            results.push(created);
            continue;
        }
        match commit(ctx, command).await {
            Ok(()) => {
                tracing::info!(topic = %topic.name.0.as_str(), partitions = created.num_partitions, "created topic");
                results.push(created);
            }
            Err(refusal) => results.push(refused(refusal)),
        }
    }
    CreateTopicsResponse::default().with_topics(results)
}

/// Asks shard 0 to apply a topic change and waits for its answer; `None` if shard 0 is gone.
pub(super) async fn ask_admin<T>(
    ctx: &BrokerContext,
    make: impl FnOnce(flume::Sender<T>) -> AdminRequest,
) -> Option<T> {
    let (tx, rx) = flume::bounded(1);
    ctx.admin.send_async(make(tx)).await.ok()?;
    rx.recv_async().await.ok()
}

pub(super) async fn delete_topics(ctx: &Arc<BrokerContext>, req: DeleteTopicsRequest) -> DeleteTopicsResponse {
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

pub(super) async fn apply_delete_topics(
    ctx: &Arc<BrokerContext>,
    names: Vec<String>,
) -> Vec<(String, Option<ResponseError>)> {
    let mut outcomes = Vec::new();
    for name in names {
        if crate::topics::is_internal(&name) {
            // Every group's committed offsets, or every transactional id's state, live there.
            tracing::info!(topic = %name, "refused to delete an internal topic");
            outcomes.push((name, Some(ResponseError::InvalidTopicException)));
            continue;
        }
        let outcome = match commit(ctx, Command::DeleteTopic { name: name.clone() }).await {
            Ok(()) => {
                tracing::info!(topic = %name, "deleted topic");
                None
            }
            Err((code, _)) => Some(ResponseError::try_from_code(code).unwrap_or(ResponseError::UnknownServerError)),
        };
        outcomes.push((name, outcome));
    }
    outcomes
}

pub(super) async fn create_partitions(
    ctx: &Arc<BrokerContext>,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
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

pub(super) async fn apply_create_partitions(
    ctx: &Arc<BrokerContext>,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut results = Vec::new();
    for topic in &req.topics {
        let name = topic.name.0.as_str().to_string();
        let result = CreatePartitionsTopicResult::default().with_name(topic.name.clone());
        let image = ctx.image();
        let checked = check_partition_count(topic.count as i64).and_then(|count| {
            if crate::topics::is_internal(&name) {
                return Err(refusal(
                    ResponseError::InvalidRequest,
                    format!("the partition count of {name} decides which of its partitions holds each key"),
                ));
            }
            let current = image
                .topic(&name)
                .map(|t| (t.partitions.len() as u32, t.partitions.first().map_or(0, |p| p.target_replicas().len())));
            let (current, replication) = match current {
                None => {
                    return Err(refusal(
                        ResponseError::UnknownTopicOrPartition,
                        format!("topic {name:?} does not exist"),
                    ));
                }
                Some((current, _)) if count <= current => {
                    return Err(refusal(
                        ResponseError::InvalidPartitions,
                        format!("topic {name:?} has {current} partitions; the count can only grow"),
                    ));
                }
                Some(found) => found,
            };
            // Kafka's CreatePartitions assignment: the replicas of each new partition, in order.
            let assignment = match topic.assignments.as_ref() {
                None => None,
                Some(lists) if lists.len() != (count - current) as usize => {
                    return Err(refusal(
                        ResponseError::InvalidReplicaAssignment,
                        format!("{} replica lists for {} new partitions", lists.len(), count - current),
                    ));
                }
                Some(lists) => {
                    let lists: Vec<Vec<NodeId>> =
                        lists.iter().map(|a| broker_ids(&a.broker_ids)).collect::<Result<_, _>>()?;
                    check_assignment(&image, &lists, replication)?;
                    Some(lists)
                }
            };
            Ok((count, assignment))
        });
        let outcome = match checked {
            Ok(_) if req.validate_only => Ok(()),
            Ok((count, None)) => commit(ctx, Command::CreatePartitions { name, count }).await,
            Ok((count, Some(assignment))) => {
                commit(ctx, Command::CreatePartitionsAssigned { name, count, assignment }).await
            }
            Err(refusal) => Err(refusal),
        };
        results.push(match outcome {
            Ok(()) => result,
            Err((code, message)) => {
                result.with_error_code(code).with_error_message(Some(StrBytes::from_string(message)))
            }
        });
    }
    CreatePartitionsResponse::default().with_results(results)
}

pub(super) async fn alter_configs(ctx: &Arc<BrokerContext>, req: AlterConfigsRequest) -> AlterConfigsResponse {
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

pub(super) async fn incremental_alter_configs(
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
                let value = c.value.as_ref().map(|v| v.as_str().to_string());
                let list = LIST_SETTINGS.contains(&key.as_str());
                let edit = match (c.config_operation, value) {
                    (0, Some(v)) => ConfigEdit::Set(v),
                    (1, _) => ConfigEdit::Delete,
                    (2, Some(v)) if list => ConfigEdit::Append(v),
                    (3, Some(v)) if list => ConfigEdit::Subtract(v),
                    (0 | 2 | 3, None) => {
                        return ConfigChange::Refused(
                            ResponseError::InvalidConfig,
                            format!("operation {} on {key} without a value", c.config_operation),
                        );
                    }
                    (2 | 3, Some(_)) => {
                        return ConfigChange::Refused(
                            ResponseError::InvalidConfig,
                            format!("{key} is not a list: APPEND and SUBTRACT apply to {}", LIST_SETTINGS.join(", ")),
                        );
                    }
                    (op, _) => {
                        return ConfigChange::Refused(
                            ResponseError::InvalidRequest,
                            format!("unknown config operation {op} on {key}"),
                        );
                    }
                };
                edits.push((key, edit));
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

/// The topic settings whose values are comma-separated lists, which IncrementalAlterConfigs may APPEND
/// to and SUBTRACT from (as Kafka).
const LIST_SETTINGS: &[&str] = &["cleanup.policy"];

/// A list setting's value when the topic does not set it.
fn list_default(key: &str) -> &'static str {
    TOPIC_SETTINGS.iter().find(|s| s.key == key).map_or("", |s| s.fixed_default)
}

/// `current` with `items` appended (those it lacks, in order) or subtracted.
fn edit_list(current: &str, items: &str, append: bool) -> String {
    let split = |text: &str| -> Vec<String> {
        text.split(',').map(str::trim).filter(|i| !i.is_empty()).map(str::to_string).collect()
    };
    let mut list = split(current);
    for item in split(items) {
        if append && !list.contains(&item) {
            list.push(item);
        } else if !append {
            list.retain(|i| *i != item);
        }
    }
    list.join(",")
}

pub(super) async fn alter(
    ctx: &Arc<BrokerContext>,
    changes: Vec<ConfigChange>,
    validate_only: bool,
    count: usize,
) -> Vec<Result<(), (ResponseError, String)>> {
    ask_admin(ctx, |reply| AdminRequest::AlterConfigs { changes, validate_only, reply })
        .await
        .unwrap_or_else(|| vec![Err((ResponseError::KafkaStorageError, "broker is stopping".into())); count])
}

pub(super) async fn apply_alter_configs(
    ctx: &Arc<BrokerContext>,
    changes: Vec<ConfigChange>,
    validate_only: bool,
) -> Vec<Result<(), (ResponseError, String)>> {
    let defaults = ctx.topic_defaults();
    let mut outcomes = Vec::new();
    for change in changes {
        let image = ctx.image();
        // The settings the topic will have, and the command that gives them to it.
        let (topic, planned) = match change {
            ConfigChange::Refused(e, m) => {
                outcomes.push(Err((e, m)));
                continue;
            }
            ConfigChange::Replace { topic, configs } => {
                let planned = image
                    .topic(&topic)
                    .map(|_| (configs.clone(), Command::AlterConfigs { name: topic.clone(), configs }));
                (topic, planned)
            }
            ConfigChange::Edit { topic, edits } => {
                let planned = image.topic(&topic).map(|t| {
                    let mut result = t.configs.clone();
                    let (mut set, mut delete) = (BTreeMap::new(), Vec::new());
                    let current = |configs: &BTreeMap<String, String>, key: &str| {
                        configs.get(key).cloned().unwrap_or_else(|| list_default(key).to_string())
                    };
                    for (key, edit) in edits {
                        let value = match edit {
                            ConfigEdit::Set(v) => Some(v),
                            ConfigEdit::Delete => None,
                            ConfigEdit::Append(items) => Some(edit_list(&current(&result, &key), &items, true)),
                            ConfigEdit::Subtract(items) => Some(edit_list(&current(&result, &key), &items, false)),
                        };
                        match value {
                            Some(v) => {
                                result.insert(key.clone(), v.clone());
                                set.insert(key, v);
                            }
                            None => {
                                result.remove(&key);
                                set.remove(&key);
                                delete.push(key);
                            }
                        }
                    }
                    // Applied as edits, so that another broker's concurrent edit of other keys stays.
                    (result, Command::EditConfigs { name: topic.clone(), set, delete })
                });
                (topic, planned)
            }
        };
        let Some((configs, command)) = planned else {
            outcomes.push(Err((ResponseError::UnknownTopicOrPartition, format!("topic {topic:?} does not exist"))));
            continue;
        };
        if let Err(e) = TopicConfig::resolve(&defaults, &configs) {
            outcomes.push(Err((ResponseError::InvalidConfig, e.to_string())));
            continue;
        }
        if validate_only {
            outcomes.push(Ok(()));
            continue;
        }
        let outcome = commit(ctx, command)
            .await
            .map_err(|(code, m)| (ResponseError::try_from_code(code).unwrap_or(ResponseError::UnknownServerError), m));
        if outcome.is_ok() {
            tracing::info!(topic = %topic, "altered topic configs");
        }
        outcomes.push(outcome);
    }
    outcomes
}
