//! Topic changes: CreateTopics, DeleteTopics, CreatePartitions, AlterConfigs, IncrementalAlterConfigs.
//! Requests on any shard are forwarded to shard 0, which applies them one at a time: record durably,
//! publish, then create, reconfigure or delete the partition logs on their shards.

use super::*;

pub(super) async fn create_topics(ctx: &Arc<BrokerContext>, request: CreateTopicsRequest) -> CreateTopicsResponse {
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

pub(super) fn topic_error_code(e: &TopicError) -> ResponseError {
    match e {
        TopicError::InvalidName(_) => ResponseError::InvalidTopicException,
        TopicError::AlreadyExists(_) => ResponseError::TopicAlreadyExists,
        TopicError::Unknown(_) => ResponseError::UnknownTopicOrPartition,
        TopicError::InvalidPartitions { .. } => ResponseError::InvalidPartitions,
        TopicError::InvalidConfig(_) => ResponseError::InvalidConfig,
        _ => ResponseError::KafkaStorageError,
    }
}

pub(super) async fn apply_create_topics(
    ctx: &Arc<BrokerContext>,
    request: CreateTopicsRequest,
) -> CreateTopicsResponse {
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
        // Durable first, then the logs, then visible: a crash in between leaves a recorded topic whose
        // partitions are created empty on the next start, and no client sees a partition before its log.
        if let Err(e) = updated.save(&shardlog_storage::fs::dma::DmaFs, &ctx.config.data_dir).await {
            tracing::error!(error = %e, "cannot record topics");
            for r in results.iter_mut().filter(|r| r.error_code == 0) {
                r.error_code = ResponseError::KafkaStorageError.code();
            }
            return CreateTopicsResponse::default().with_topics(results);
        }
        for (name, config) in &created {
            let partitions = updated.topics[name].partitions.len();
            create_logs(ctx, &updated, name, 0..partitions, &config.log).await;
            tracing::info!(topic = %name, partitions, "created topic");
        }
        *ctx.topics.write().expect("topic lock") = updated;
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
    // As for new topics: the logs exist before the partitions are visible.
    let defaults = ctx.topic_defaults();
    for (name, from, to) in grown {
        let overrides = &updated.topics[&name].configs;
        let log = TopicConfig::resolve(&defaults, overrides).map_or_else(|_| defaults.log.clone(), |c| c.log);
        create_logs(ctx, &updated, &name, from..to, &log).await;
    }
    *ctx.topics.write().expect("topic lock") = updated;
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

/// Creates the logs of partitions `range` of `topic` on their owning shards.
async fn create_logs(
    ctx: &Arc<BrokerContext>,
    store: &TopicStore,
    topic: &str,
    range: std::ops::Range<usize>,
    log: &shardlog_storage::LogConfig,
) {
    for p in range {
        let Some(shard) = store.serving_shard(topic, p as u32, ctx.shards.len()) else { continue };
        let tp = TopicPartition::new(topic.to_string(), p as u32);
        let config = log.clone();
        match ask(ctx, shard, |reply| PartitionRequest::Create { tp: tp.clone(), config, reply }).await {
            Some(Ok(())) => {}
            other => tracing::error!(partition = %tp, outcome = ?other, "cannot create partition log"),
        }
    }
}
