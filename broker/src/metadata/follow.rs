//! Applying metadata images to this broker's shards: shard 0 runs [`follow`], which, for every new image
//! from the quorum link, creates the logs of partitions this broker now hosts, deletes those of deleted
//! topics and of partitions moved to other brokers, passes changed topic settings to the logs, and only
//! then publishes the image to the request handlers, so no client is told about a partition before its
//! log exists here.
//!
//! Once the broker is registered and an image at least as new as its registration is applied, the broker
//! is ready: logs on disk of partitions that exist but were moved to other brokers meanwhile are deleted;
//! other logs this image does not give to this broker are strays (their topic was deleted while the broker
//! was down, or the quorum lost its state) and are set aside (renamed to `<topic>-<partition>.stray`, kept
//! for an operator, never served), and the shards start accepting clients. Until then no log is deleted:
//! the images that arrive while the broker catches up replay history (a topic created, then deleted while
//! the broker was down), and a log the metadata did not delete while this broker was running is only ever
//! set aside.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use shardlog_storage::TopicPartition;
use uuid::Uuid;

use super::image::MetadataImage;
use crate::context::{BrokerContext, ask_shard};
use crate::logging::PartitionSet;
use crate::quorum::state::{NodeId, PartitionRecord};
use crate::shard::{PartitionRequest, RoleChange};
use crate::topics::configs::TopicConfig;

/// A partition log this broker hosts, as of the last image applied: the shard is told again whenever any
/// of it changes (its settings, or its record: leader, epochs, replicas, ISR).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Hosted {
    topic_id: Uuid,
    configs: BTreeMap<String, String>,
    record: PartitionRecord,
}

/// Shard 0's task: applies every image from the link, newest first when several are waiting.
pub async fn follow(ctx: Arc<BrokerContext>, images: flume::Receiver<Arc<MetadataImage>>) {
    let mut hosted: BTreeMap<TopicPartition, Hosted> = BTreeMap::new();
    let mut applied: Option<Arc<MetadataImage>> = None;
    while let Ok(mut image) = images.recv_async().await {
        while let Ok(newer) = images.try_recv() {
            image = newer;
        }
        // Most images only move heartbeat times: the logs need nothing unless the topics changed (or the
        // last image could not be applied whole, which the next one retries).
        let topics_changed = applied.as_ref().is_none_or(|last| last.state.topics != image.state.topics);
        if topics_changed {
            let whole = apply(&ctx, &mut hosted, &image, ctx.ready.load(Ordering::SeqCst)).await;
            applied = whole.then(|| image.clone());
        }
        ctx.quotas.image_applied(&image);
        *ctx.metadata.write().expect("metadata lock") = image.clone();
        if topics_changed {
            ctx.quorum.leadership_news().bump();
        }
        // Admin requests wait for this: a change is reported applied only once its logs are in place.
        if applied.is_some() {
            ctx.mark_reconciled(image.applied);
        }
        let caught_up = ctx.quorum.registered_at().is_some_and(|at| image.applied >= Some(at));
        if caught_up && !ctx.ready.load(Ordering::SeqCst) {
            if ctx.quorum.strays_known() && !ctx.shutdown.is_triggered() {
                remove_strays(&ctx, &image).await;
            }
            // What catching up would have deleted is set aside now (or, if strays cannot be told yet,
            // left alone): either way it is no longer this broker's to delete.
            let wanted = wanted(&image, NodeId(ctx.config.node_id));
            hosted.retain(|tp, h| wanted.get(tp).is_some_and(|w| w.topic_id == h.topic_id));
            ctx.ready.store(true, Ordering::SeqCst);
            tracing::info!(applied = ?image.applied, partitions = hosted.len(), "metadata caught up; serving clients");
        }
    }
}

/// What `image` asks this broker to host: every partition it is a replica of.
fn wanted(image: &MetadataImage, node: NodeId) -> BTreeMap<TopicPartition, Hosted> {
    let mut out = BTreeMap::new();
    for (name, topic) in &image.state.topics {
        for (index, p) in topic.partitions.iter().enumerate() {
            if p.replicas.contains(&node) {
                let hosted = Hosted { topic_id: topic.id, configs: topic.configs.clone(), record: p.clone() };
                out.insert(TopicPartition::new(name.clone(), index as u32), hosted);
            }
        }
    }
    out
}

/// Brings the shards' logs in line with `image`; false if some partition could not be. Logs of deleted
/// topics are deleted only when `ready` (see the module doc).
async fn apply(
    ctx: &Arc<BrokerContext>,
    hosted: &mut BTreeMap<TopicPartition, Hosted>,
    image: &MetadataImage,
    ready: bool,
) -> bool {
    let mut whole = true;
    let wanted = wanted(image, NodeId(ctx.config.node_id));
    // Gone, or a topic of the same name with another id (deleted and created again): delete first.
    let gone: Vec<TopicPartition> = hosted
        .iter()
        .filter(|(tp, h)| ready && wanted.get(*tp).is_none_or(|w| w.topic_id != h.topic_id))
        .map(|(tp, _)| tp.clone())
        .collect();
    for tp in gone {
        if delete_log(ctx, &tp).await {
            hosted.remove(&tp);
        } else {
            whole = false;
        }
    }
    let defaults = ctx.topic_defaults();
    let mut news = HostingNews::default();
    for (tp, want) in wanted {
        if hosted.get(&tp) == Some(&want) {
            continue;
        }
        // The settings were validated before they were proposed; a default-only config is the fallback
        // for a value this broker's version does not accept.
        let (config, min_insync_replicas) = TopicConfig::resolve(&defaults, &want.configs)
            .map_or_else(|_| (defaults.log.clone(), defaults.min_insync_replicas), |c| (c.log, c.min_insync_replicas));
        let shard = ctx.shard_of(&tp);
        let request_tp = tp.clone();
        let (topic_id, record) = (want.topic_id, Box::new(want.record.clone()));
        let create =
            |reply| PartitionRequest::Create { tp: request_tp, topic_id, config, record, min_insync_replicas, reply };
        match ask_shard(ctx, shard, create).await {
            Some(Ok(change)) => {
                if !hosted.contains_key(&tp) {
                    tracing::debug!(partition = %tp, shard, "hosting partition");
                    news.hosting.add(&tp.topic, tp.partition);
                }
                match change {
                    Some(RoleChange::Leading) => news.leading.add(&tp.topic, tp.partition),
                    Some(RoleChange::Following(leader)) => {
                        news.following.entry(leader).or_default().add(&tp.topic, tp.partition)
                    }
                    Some(RoleChange::Neither) | None => {}
                }
                hosted.insert(tp, want);
            }
            Some(Err(error)) => {
                tracing::error!(partition = %tp, %error, "cannot create or configure partition log");
                whole = false;
            }
            None => {
                tracing::error!(partition = %tp, "cannot create or configure partition log: its shard is gone");
                whole = false;
            }
        }
    }
    news.log();
    whole
}

/// What one image changed about the partitions hosted here, logged as one line per kind with counts (a
/// topic of 50 partitions created is three lines, not 100): the partitions now hosted, and those now led
/// or followed here.
#[derive(Debug, Default)]
struct HostingNews {
    hosting: PartitionSet,
    leading: PartitionSet,
    following: BTreeMap<NodeId, PartitionSet>,
}

impl HostingNews {
    fn log(&self) {
        if !self.hosting.is_empty() {
            let (partitions, topics) = (self.hosting.count(), self.hosting.to_string());
            tracing::info!(partitions, %topics, "hosting partitions");
        }
        if !self.leading.is_empty() {
            let (partitions, topics) = (self.leading.count(), self.leading.to_string());
            tracing::info!(partitions, %topics, "leading partitions");
        }
        for (leader, set) in &self.following {
            let (partitions, topics) = (set.count(), set.to_string());
            tracing::info!(leader = leader.0, partitions, %topics, "following partitions");
        }
    }
}

async fn delete_log(ctx: &Arc<BrokerContext>, tp: &TopicPartition) -> bool {
    let shard = ctx.shard_of(tp);
    let request_tp = tp.clone();
    match ask_shard(ctx, shard, |reply| PartitionRequest::Delete { tp: request_tp, reply }).await {
        Some(Ok(())) => {
            tracing::info!(partition = %tp, "deleted partition log");
            true
        }
        other => {
            tracing::error!(partition = %tp, outcome = ?other, "cannot delete partition log");
            false
        }
    }
}

/// Sets aside the logs the shards opened at start that the caught-up image does not give to this broker,
/// and deletes those of partitions that exist and were moved to other brokers.
async fn remove_strays(ctx: &Arc<BrokerContext>, image: &MetadataImage) {
    let wanted = wanted(image, NodeId(ctx.config.node_id));
    for shard in 0..ctx.shards.len() {
        let on_shard = ask_shard(ctx, shard, |reply| PartitionRequest::Hosted { reply }).await;
        for (tp, topic_id) in on_shard.unwrap_or_default() {
            if wanted.contains_key(&tp) {
                continue;
            }
            // The topic is there but its partition is on other brokers now (moved away while this one was
            // down): the copy here is not needed, as the metadata would have had it deleted.
            let moved_away = topic_id.is_some_and(|id| {
                image
                    .state
                    .topics
                    .get(&tp.topic)
                    .is_some_and(|t| t.id == id && (tp.partition as usize) < t.partitions.len())
            });
            if moved_away {
                delete_log(ctx, &tp).await;
                continue;
            }
            let request_tp = tp.clone();
            match ask_shard(ctx, shard, |reply| PartitionRequest::SetAside { tp: request_tp, reply }).await {
                Some(Ok(aside)) => tracing::warn!(
                    partition = %tp,
                    ?aside,
                    "stray partition log (not this broker's in the cluster metadata) set aside"
                ),
                other => tracing::error!(partition = %tp, outcome = ?other, "cannot set aside stray partition log"),
            }
        }
    }
}
