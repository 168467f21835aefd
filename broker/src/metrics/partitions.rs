//! Gauges of state: each partition's log (sampled by its shard), and what the metadata says of the
//! partitions this broker leads, of the cluster's offline partitions and of this broker's connections
//! (set when the endpoint is scraped).

use std::collections::HashMap;
use std::rc::Rc;

use metrics::Gauge;
use shardlog_storage::fs::dma::DmaFs;
use shardlog_storage::{LogDir, TopicPartition};

use crate::context::BrokerContext;
use crate::quorum::state::NodeId;
use crate::runtime::limits::Clients;
use crate::shutdown::Shutdown;
use crate::topics::configs::TopicConfig;

const LOG_END_OFFSET: &str = "shardlog_partition_log_end_offset";
const HIGH_WATERMARK: &str = "shardlog_partition_high_watermark";
const LOG_START_OFFSET: &str = "shardlog_partition_log_start_offset";
const LOG_SIZE: &str = "shardlog_partition_log_size_bytes";
const SEGMENTS: &str = "shardlog_partition_log_segments";

struct LogGauges {
    log_end: Gauge,
    high_watermark: Gauge,
    log_start: Gauge,
    size: Gauge,
    segments: Gauge,
}

impl LogGauges {
    fn new(tp: &TopicPartition, shard: &str) -> LogGauges {
        let labels =
            [("topic", tp.topic.clone()), ("partition", tp.partition.to_string()), ("shard", shard.to_string())];
        LogGauges {
            log_end: metrics::gauge!(LOG_END_OFFSET, &labels),
            high_watermark: metrics::gauge!(HIGH_WATERMARK, &labels),
            log_start: metrics::gauge!(LOG_START_OFFSET, &labels),
            size: metrics::gauge!(LOG_SIZE, &labels),
            segments: metrics::gauge!(SEGMENTS, &labels),
        }
    }
}

/// Samples the shard's partition logs every [`super::SAMPLE_INTERVAL`] until shutdown: offsets, size,
/// segments. A partition that left the shard stops being set, and its gauges age out of the output.
pub async fn sample_shard(shard: usize, logs: Rc<LogDir<DmaFs>>, shutdown: Shutdown) {
    metrics::describe_gauge!(LOG_END_OFFSET, "the offset the next record appended to this replica will take");
    metrics::describe_gauge!(HIGH_WATERMARK, "the offset up to which consumers may read this replica");
    metrics::describe_gauge!(LOG_START_OFFSET, "the replica's first offset (after retention and DeleteRecords)");
    metrics::describe_gauge!(LOG_SIZE, metrics::Unit::Bytes, "the replica's segment files together");
    metrics::describe_gauge!(SEGMENTS, "the replica's segment files");
    let shard = shard.to_string();
    let mut gauges: HashMap<TopicPartition, LogGauges> = HashMap::new();
    loop {
        let partitions = logs.partitions();
        let here: std::collections::HashSet<&TopicPartition> = partitions.iter().collect();
        gauges.retain(|tp, _| here.contains(tp));
        for tp in partitions {
            let Some(log) = logs.get(&tp) else { continue };
            let g = gauges.entry(tp.clone()).or_insert_with(|| LogGauges::new(&tp, &shard));
            g.log_end.set(log.log_end_offset().0 as f64);
            // The HW as the replica last set it: a sampler only reads, it never moves a replica's state.
            g.high_watermark.set(log.high_watermark().0 as f64);
            g.log_start.set(log.log_start_offset().0 as f64);
            g.size.set(log.size_bytes() as f64);
            g.segments.set(log.segment_count() as f64);
        }
        if shutdown.sleep(super::SAMPLE_INTERVAL).await {
            return;
        }
    }
}

/// Sets the gauges that describe the broker as a whole, from the metadata as last applied and the
/// connection counts; called before every scrape's output is rendered.
pub fn scrape_broker(ctx: &BrokerContext, clients: &Clients) {
    let me = NodeId(ctx.config.node_id);
    let image = ctx.image();
    let defaults = ctx.topic_defaults();
    let (mut led, mut under_replicated, mut under_min_isr, mut offline) = (0u64, 0u64, 0u64, 0u64);
    let mut offline_here = 0u64;
    for (topic, record) in &image.state.topics {
        // As the shards apply it (`metadata::follow`): the topic's own setting, else the broker's.
        let min_isr = TopicConfig::resolve(&defaults, &record.configs)
            .map_or(defaults.min_insync_replicas, |c| c.min_insync_replicas) as usize;
        for (partition, p) in record.partitions.iter().enumerate() {
            // Without a leader, or led read-only by a replica whose log is damaged: no writes either way.
            if p.leader.is_none_or(|leader| p.offline_replicas.contains(&leader)) {
                offline += 1;
            }
            offline_here += u64::from(p.offline_replicas.contains(&me));
            if p.leader != Some(me) {
                continue;
            }
            led += 1;
            under_replicated += u64::from(p.isr.len() < p.replicas.len());
            under_min_isr += u64::from(p.isr.len() < min_isr);
            let labels = [("topic", topic.clone()), ("partition", partition.to_string())];
            metrics::gauge!("shardlog_partition_isr_size", &labels).set(p.isr.len() as f64);
            metrics::gauge!("shardlog_partition_replicas", &labels).set(p.replicas.len() as f64);
        }
    }
    metrics::gauge!("shardlog_partitions_led").set(led as f64);
    metrics::gauge!("shardlog_partitions_under_replicated").set(under_replicated as f64);
    metrics::gauge!("shardlog_partitions_under_min_isr").set(under_min_isr as f64);
    metrics::gauge!("shardlog_partitions_offline").set(offline as f64);
    metrics::gauge!("shardlog_replicas_offline").set(offline_here as f64);
    metrics::gauge!("shardlog_metadata_applied_index").set(image.applied.map_or(-1.0, |i| i as f64));
    metrics::gauge!("shardlog_connections").set(clients.counts.open() as f64);
    metrics::counter!("shardlog_log_lines_dropped_total").absolute(crate::logging::dropped_lines());
    metrics::gauge!("shardlog_ready").set(if ctx.ready.load(std::sync::atomic::Ordering::SeqCst) { 1.0 } else { 0.0 });
}

/// The descriptions of the gauges [`scrape_broker`] sets.
pub(super) fn describe_broker() {
    metrics::describe_gauge!("shardlog_partition_isr_size", "in-sync replicas of a partition this broker leads");
    metrics::describe_gauge!("shardlog_partition_replicas", "replicas of a partition this broker leads");
    metrics::describe_gauge!("shardlog_partitions_led", "partitions this broker leads");
    metrics::describe_gauge!(
        "shardlog_partitions_under_replicated",
        "partitions this broker leads with fewer in-sync replicas than replicas"
    );
    metrics::describe_gauge!(
        "shardlog_partitions_under_min_isr",
        "partitions this broker leads with fewer in-sync replicas than min.insync.replicas (acks=all refused)"
    );
    metrics::describe_gauge!(
        "shardlog_partitions_offline",
        "partitions of the cluster that take no writes: without a leader, or led read-only by a damaged replica"
    );
    metrics::describe_gauge!(
        "shardlog_replicas_offline",
        "replicas on this broker whose logs are offline (damaged): out of the ISR until rebuilt or repaired"
    );
    metrics::describe_gauge!(
        "shardlog_metadata_applied_index",
        "the metadata quorum's log index this broker has applied"
    );
    metrics::describe_gauge!("shardlog_connections", "open Kafka client connections");
    metrics::describe_counter!(
        "shardlog_log_lines_dropped_total",
        "log lines dropped because stderr was too slow to take them (the log never blocks a shard)"
    );
    metrics::describe_gauge!("shardlog_ready", "1 once the broker serves (recovered, registered, caught up)");
}
