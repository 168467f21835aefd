//! Prometheus metrics: what the broker counts and measures, and the endpoint that serves it
//! (`metrics.listen`, `GET /metrics`, with `GET /health` and `GET /ready` beside it).
//!
//! Counting goes through the `metrics` crate into the recorder of `metrics-exporter-prometheus`, installed
//! once per process. Every shard registers its own handles once, labelled `shard`, and keeps them in a
//! thread-local: a request or an append then costs a few atomic operations on handles no other thread
//! touches, with no lookup and no lock. What is a state rather than an event (log end offsets, high
//! watermarks, ISR sizes, connections, the quorum's role) is sampled: per partition by each shard every
//! [`SAMPLE_INTERVAL`], from the metadata and the connection counts when the endpoint is scraped, and by
//! the metadata quorum's voter from its Raft metrics. The process's own metrics (CPU, memory, file
//! descriptors, start time) and the build's are read from `/proc` at each scrape ([`process`]).

pub mod endpoint;
mod partitions;
mod process;
mod requests;

use std::sync::OnceLock;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

pub use partitions::{sample_shard, scrape_broker};
pub use requests::{fetch_held, observe_request, produced, quota_throttled, read_ahead, register_shard};

/// How often a shard samples its partitions' gauges.
pub const SAMPLE_INTERVAL: Duration = Duration::from_secs(1);

/// A gauge not set again for this long is dropped from the output (a partition deleted or moved away).
/// Gauges are set every [`SAMPLE_INTERVAL`] or at every scrape, so a live one never gets this old.
const STALE_GAUGE: Duration = Duration::from_secs(30);

/// Latency histograms' bucket bounds, in seconds: 50 us to 10 s.
const LATENCY_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Batches per fdatasync: bucket bounds.
const BATCH_COUNT_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process's recorder (once; later calls return the same handle). Handles registered
/// before it record nothing, so it is installed before any shard starts.
pub fn install() -> PrometheusHandle {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .idle_timeout(MetricKindMask::GAUGE, Some(STALE_GAUGE))
                .set_buckets(LATENCY_BUCKETS)
                .expect("latency buckets are not empty")
                .set_buckets_for_metric(
                    metrics_exporter_prometheus::Matcher::Full(shardlog_storage::metrics::BATCHES_PER_FDATASYNC.into()),
                    BATCH_COUNT_BUCKETS,
                )
                .expect("batch count buckets are not empty");
            let recorder = builder.build_recorder();
            let handle = recorder.handle();
            if metrics::set_global_recorder(recorder).is_err() {
                // Another recorder was installed first (an embedding program's): ours sees nothing.
                tracing::warn!("a metrics recorder was already installed; /metrics shows none of the broker's");
            }
            handle
        })
        .clone()
}

/// A connection of another node refused under cluster mTLS: `service` is `replication` or `quorum`,
/// `reason` what failed (`handshake`, `certificate`, `forbidden`, `plaintext`).
pub fn peer_refused(service: &'static str, reason: &'static str) {
    metrics::counter!("shardlog_peer_refused_total", "service" => service, "reason" => reason).increment(1);
}

/// Kafka's name of an error code, as its clients print it (`NOT_LEADER_OR_FOLLOWER`).
pub fn error_name(code: i16) -> String {
    let error = match kafka_protocol::ResponseError::try_from_code(code) {
        None | Some(kafka_protocol::ResponseError::Unknown(_)) => return format!("UNKNOWN_CODE_{code}"),
        Some(error) => error,
    };
    let camel = format!("{error:?}");
    let mut name = String::with_capacity(camel.len() + 8);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_names_are_kafkas() {
        assert_eq!(error_name(6), "NOT_LEADER_OR_FOLLOWER");
        assert_eq!(error_name(3), "UNKNOWN_TOPIC_OR_PARTITION");
        assert_eq!(error_name(-1), "UNKNOWN_SERVER_ERROR");
        assert_eq!(error_name(9999), "UNKNOWN_CODE_9999");
    }
}
