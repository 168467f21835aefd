//! Creating the broker's internal topics when a coordinator is first asked for: `__consumer_offsets`
//! (FindCoordinator key type 0) and `__transaction_state` (key type 1). The topic is created in the
//! background through shard 0, as the broker itself (`internal`), from its [`InternalTopicSpec`] planned
//! for the brokers live at that moment; FindCoordinator answers COORDINATOR_NOT_AVAILABLE meanwhile, which
//! clients retry. A broker asks for each topic once at a time: a FindCoordinator that finds the topic's
//! creation under way asks nothing more.
//!
//! What it must never do: create an internal topic with settings other than its spec's, or leave a
//! topic marked as being created once its attempt is over (the next FindCoordinator could then never
//! create it).

use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};

use super::*;
use crate::topics::internal::InternalTopicSpec;

/// `__consumer_offsets` as the settings want it.
pub(super) fn offsets_topic_spec(ctx: &BrokerContext) -> InternalTopicSpec {
    let groups = &ctx.config.groups;
    InternalTopicSpec {
        name: crate::group::OFFSETS_TOPIC,
        partitions: groups.offsets_partitions,
        replication_factor: groups.offsets_replication_factor,
        // Kafka has no setting for it: the broker's default applies.
        min_insync_replicas: None,
        segment_bytes: groups.offsets_segment_bytes,
    }
}

/// `__transaction_state` as the settings want it.
pub(super) fn transaction_state_spec(ctx: &BrokerContext) -> InternalTopicSpec {
    let log = &ctx.config.transaction_log;
    InternalTopicSpec {
        name: crate::txn::TRANSACTION_STATE_TOPIC,
        partitions: log.partitions,
        replication_factor: log.replication_factor,
        min_insync_replicas: Some(log.min_isr),
        segment_bytes: log.segment_bytes,
    }
}

/// Marks an internal topic as being created by this broker until dropped.
struct Creating {
    ctx: Arc<BrokerContext>,
    name: &'static str,
}

impl Creating {
    /// `None` if this broker is already creating `name`.
    fn begin(ctx: &Arc<BrokerContext>, name: &'static str) -> Option<Creating> {
        let mut creating = ctx.creating_internal_topics.lock().unwrap_or_else(|e| e.into_inner());
        creating.insert(name).then(|| Creating { ctx: ctx.clone(), name })
    }
}

impl Drop for Creating {
    fn drop(&mut self) {
        let mut creating = self.ctx.creating_internal_topics.lock().unwrap_or_else(|e| e.into_inner());
        let removed = creating.remove(self.name);
        assert!(removed, "{} was marked as being created", self.name);
    }
}

/// Creates the internal topic of `spec` in the background unless it exists or this broker is already
/// creating it.
pub(super) fn ensure_internal_topic(ctx: &Arc<BrokerContext>, spec: InternalTopicSpec) {
    assert!(crate::topics::is_internal(spec.name), "{} is not an internal topic", spec.name);
    if ctx.image().topic(spec.name).is_some() {
        return;
    }
    let Some(creating) = Creating::begin(ctx, spec.name) else {
        return;
    };
    glommio::spawn_local(async move {
        create(&creating.ctx, spec).await;
        drop(creating);
    })
    .detach();
}

async fn create(ctx: &Arc<BrokerContext>, spec: InternalTopicSpec) {
    let plan = spec.plan(ctx.image().state.live().len());
    let configs = plan
        .configs
        .iter()
        .map(|(name, value)| {
            CreatableTopicConfig::default()
                .with_name(StrBytes::from_static_str(name))
                .with_value(Some(StrBytes::from_string(value.clone())))
        })
        .collect();
    let topic = CreatableTopic::default()
        .with_name(topic_name(spec.name))
        .with_num_partitions(plan.partitions as i32)
        .with_replication_factor(plan.replication_factor as i16)
        .with_configs(configs);
    let request = CreateTopicsRequest::default().with_topics(vec![topic]).with_timeout_ms(30_000);
    let (tx, rx) = flume::bounded(1);
    if ctx.admin.send_async(AdminRequest::CreateTopics { request, internal: true, reply: tx }).await.is_err() {
        return;
    }
    let Ok(response) = rx.recv_async().await else {
        return;
    };
    for t in response.topics {
        match ResponseError::try_from_code(t.error_code) {
            None => tracing::info!(
                partitions = plan.partitions,
                replication_factor = plan.replication_factor,
                "created {}",
                spec.name
            ),
            Some(ResponseError::TopicAlreadyExists) => {}
            Some(e) => tracing::warn!(error = ?e, message = ?t.error_message, "cannot create {} yet", spec.name),
        }
    }
}
