//! `shardlog-bench compaction`: does the cleaner hold up appends? One producer sends keyed records one
//! at a time (acks=all, each waiting for the last) to a topic, in rounds that alternate between a topic
//! with `cleanup.policy=delete` and one with `cleanup.policy=compact` (same segment size; the compacted
//! one cleaned whenever 1% of it is new, the cleaner looking every `--backoff-ms`), so the cleaner works
//! through the compacted rounds while the produce latency is measured. Reported side by side: the
//! produce latency of each kind of round, and how small the cleaner kept the compacted partition.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use hdrhistogram::Histogram;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, ProduceRequest, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;
use shardlog_broker::client::KafkaClient;

use shardlog_bench::cluster::{Cluster, ClusterArgs};

use crate::payload;

/// Options of `shardlog-bench compaction`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompactionArgs {
    /// How long each round produces.
    #[arg(long, default_value = "10s", value_parser = crate::stats::duration)]
    pub duration: Duration,
    /// Rounds of each kind (delete, compact), alternating.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Distinct keys the records cycle through.
    #[arg(long, default_value_t = 1000)]
    pub keys: usize,
    /// Bytes of each record's value.
    #[arg(long, default_value_t = 1024)]
    pub value_bytes: usize,
    /// `segment.bytes` of both topics (the cleaner cleans closed segments only).
    #[arg(long, default_value_t = 1 << 20)]
    pub segment_bytes: u64,
    /// `log.cleaner.backoff.ms` of the local broker.
    #[arg(long, default_value_t = 200)]
    pub backoff_ms: u64,
    /// Where the local broker keeps its data (removed first).
    #[arg(long, default_value = "bench-compaction")]
    pub data_dir: PathBuf,
}

/// One round: which kind, and every acknowledgement's latency in microseconds.
#[derive(Debug)]
pub struct Round {
    pub compacted: bool,
    pub latency_us: Histogram<u64>,
    pub elapsed: Duration,
}

/// What `run` measured.
#[derive(Debug)]
pub struct CompactionReport {
    pub rounds: Vec<Round>,
    /// Records written to the compacted topic, and the bytes its partition's segments hold at the end.
    pub compacted_records: u64,
    pub compacted_bytes_written: u64,
    pub compacted_bytes_kept: u64,
    pub args: CompactionArgs,
}

impl CompactionReport {
    pub fn render(&self) -> String {
        let a = &self.args;
        let mut out = format!(
            "compaction: one producer, keyed records one at a time (acks=all), {} keys, {} B values, \
             segment.bytes {}, cleaner every {} ms; {} rounds of {:?} per kind, alternating\n",
            a.keys, a.value_bytes, a.segment_bytes, a.backoff_ms, a.rounds, a.duration
        );
        for compacted in [false, true] {
            let kind = if compacted { "compact" } else { "delete " };
            let rounds: Vec<&Round> = self.rounds.iter().filter(|r| r.compacted == compacted).collect();
            for r in &rounds {
                let h = &r.latency_us;
                out.push_str(&format!(
                    "  {kind} round: {:>6.0} msg/s  p50 {:>5} us  p99 {:>6} us  p99.9 {:>6} us  max {:>7} us\n",
                    h.len() as f64 / r.elapsed.as_secs_f64(),
                    h.value_at_quantile(0.5),
                    h.value_at_quantile(0.99),
                    h.value_at_quantile(0.999),
                    h.max()
                ));
            }
            let median = |q: f64| {
                let mut v: Vec<u64> = rounds.iter().map(|r| r.latency_us.value_at_quantile(q)).collect();
                v.sort_unstable();
                v.get(v.len() / 2).copied().unwrap_or(0)
            };
            out.push_str(&format!("  {kind} median of rounds: p50 {} us, p99 {} us\n", median(0.5), median(0.99)));
        }
        out.push_str(&format!(
            "  compacted partition: {} records ({} MB) written, {} KB kept on disk\n",
            self.compacted_records,
            self.compacted_bytes_written / 1_000_000,
            self.compacted_bytes_kept / 1000
        ));
        out
    }
}

pub fn run(args: &CompactionArgs) -> Result<CompactionReport> {
    if args.rounds == 0 || args.keys == 0 {
        bail!("--rounds and --keys must be positive");
    }
    let _ = std::fs::remove_dir_all(&args.data_dir);
    let cluster = Cluster::start(&ClusterArgs {
        brokers: 1,
        base_port: 0,
        quorum_base_port: None,
        metrics_base_port: None,
        data_dir: args.data_dir.clone(),
        shards: None,
        shardlog: None,
        settings: vec![format!("log.cleaner.backoff.ms={}", args.backoff_ms)],
        log_dir: None,
        die_with_parent: true,
        broker_args: Vec::new(),
        client_security: None,
    })?;
    let mut client = KafkaClient::connect(&cluster.bootstrap)?;
    let segment = ("segment.bytes".to_string(), args.segment_bytes.to_string());
    client.create_topic("bench-delete", 1, 1, std::slice::from_ref(&segment))?;
    let compact =
        [segment, ("cleanup.policy".into(), "compact".into()), ("min.cleanable.dirty.ratio".into(), "0.01".into())];
    client.create_topic("bench-compact", 1, 1, &compact)?;
    let value = Bytes::from(vec![b'v'; args.value_bytes]);
    let mut rounds = Vec::new();
    let mut sent = [0u64; 2];
    for _ in 0..args.rounds {
        for compacted in [false, true] {
            let topic = if compacted { "bench-compact" } else { "bench-delete" };
            let round = produce_round(&mut client, topic, args, &value, &mut sent[compacted as usize])?;
            rounds.push(Round { compacted, ..round });
        }
    }
    // The cleaner's last look, then what it kept.
    std::thread::sleep(Duration::from_millis(args.backoff_ms * 3));
    let dir = args.data_dir.join("broker-1").join("bench-compact-0");
    let kept = std::fs::read_dir(&dir)
        .with_context(|| format!("read {}", dir.display()))?
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
        .map(|e| e.metadata().map_or(0, |m| m.len()))
        .sum();
    drop(cluster);
    Ok(CompactionReport {
        rounds,
        compacted_records: sent[1],
        compacted_bytes_written: sent[1] * args.value_bytes as u64,
        compacted_bytes_kept: kept,
        args: args.clone(),
    })
}

/// Produces keyed records to `topic` one at a time for `args.duration`.
fn produce_round(
    client: &mut KafkaClient,
    topic: &str,
    args: &CompactionArgs,
    value: &Bytes,
    sent: &mut u64,
) -> Result<Round> {
    let leader = client.leader(topic, 0)?.context("a leader")?;
    let connection = client.connection(&leader)?;
    let mut latency_us = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let started = Instant::now();
    while started.elapsed() < args.duration {
        let key = Bytes::from(format!("key-{}", *sent as usize % args.keys));
        let records = payload::keyed_batch(&[(key, value.clone())], crate::produce::now_ms(), Compression::None)?;
        let request = ProduceRequest::default().with_acks(-1).with_timeout_ms(30_000).with_topic_data(vec![
            TopicProduceData::default()
                .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                .with_partition_data(vec![PartitionProduceData::default().with_index(0).with_records(Some(records))]),
        ]);
        let at = Instant::now();
        let ResponseKind::Produce(r) = connection.call(ApiKey::Produce, 9, &request)? else {
            bail!("not a produce answer")
        };
        let code = r.responses[0].partition_responses[0].error_code;
        if code != 0 {
            bail!("produce to {topic} refused with error {code}");
        }
        latency_us.record(at.elapsed().as_micros().max(1) as u64)?;
        *sent += 1;
    }
    Ok(Round { compacted: false, latency_us, elapsed: started.elapsed() })
}
