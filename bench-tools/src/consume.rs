//! `shardlog-bench consume`: fetches a topic as fast as the broker serves it, with every partition a
//! leader leads in each Fetch to it, and measures messages/s, MB/s and end-to-end latency: now minus each
//! batch's newest producer timestamp, for batches produced after the consumer started (older records
//! would measure how old the data is, not how fast it arrives).
//!
//! Batches are counted from their headers, not decoded: the measure is the broker's, not the decoder's.
//! A partition whose leader moves is fetched from its new leader, found through fresh metadata, as Kafka
//! consumers do.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, FetchRequest, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;
use shardlog_broker::client::{BOOTSTRAP_ENV, DEFAULT_BOOTSTRAP, KafkaClient, RETRY_FOR};
use shardlog_storage::batch::BatchHeader;

use crate::stats::{self, Tally};

/// Fetch versions this tool speaks.
const FETCH_VERSIONS: (i16, i16) = (4, 11);
/// Bytes asked for per partition and per Fetch.
const PARTITION_MAX_BYTES: i32 = 8 << 20;
const FETCH_MAX_BYTES: i32 = 50 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum From {
    Earliest,
    Latest,
}

/// Options of `shardlog-bench consume`.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("amount").required(true).args(["messages", "duration"])))]
pub struct ConsumeArgs {
    /// Brokers to reach the cluster through, HOST:PORT[,HOST:PORT...].
    #[arg(long, env = BOOTSTRAP_ENV, default_value = DEFAULT_BOOTSTRAP)]
    pub bootstrap: String,
    #[arg(long)]
    pub topic: String,
    #[arg(long, value_enum, default_value_t = From::Earliest)]
    pub from: From,
    /// Stop after this many messages.
    #[arg(long)]
    pub messages: Option<u64>,
    /// Stop after this long, e.g. 30s.
    #[arg(long, value_parser = stats::duration)]
    pub duration: Option<Duration>,
    /// Connections per leader broker, each fetching its share of the partitions (as the members of a
    /// consumer group would), so fetches overlap.
    #[arg(long, default_value_t = 1)]
    pub connections: usize,
    /// Each time a partition is read to its end, read it again from where this run began: with a topic
    /// that fits the broker's tail cache, measures fetches served from memory (stop with --messages or
    /// --duration).
    #[arg(long)]
    pub repeat: bool,
}

/// What a consume run measured.
#[derive(Debug, Clone)]
pub struct ConsumeResult {
    pub tally: Tally,
    pub elapsed: Duration,
}

impl ConsumeResult {
    pub fn report(&self) -> String {
        let measured = self.tally.latency_us.len();
        if measured == 0 {
            return format!(
                "{}end to end: not measured (no record was produced after the consumer started)\n",
                self.tally.report(self.elapsed, None)
            );
        }
        let label =
            format!("end to end, producer timestamp to fetch, of the {measured} records produced after the start");
        self.tally.report(self.elapsed, Some(&label))
    }
}

pub fn run(args: &ConsumeArgs) -> Result<ConsumeResult> {
    let started_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let mut admin = KafkaClient::connect(&args.bootstrap)?;
    let layout = admin.led_layout(&args.topic)?;
    let bounds = admin.offsets(&args.topic, layout.partitions)?;
    let any_leader = layout.leaders.values().next().context("a topic without partitions")?.clone();
    let version = admin.connection(&any_leader)?.negotiate(ApiKey::Fetch, FETCH_VERSIONS)?;
    let consumed = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = args.duration.map(|d| started + d);
    let progress = stats::Progress::start(args.messages, args.duration, {
        let consumed = consumed.clone();
        move || consumed.load(Ordering::Relaxed)
    });
    let connections = args.connections.max(1);
    let lanes: Vec<_> = layout
        .by_leader()
        .into_iter()
        .flat_map(|(leader, partitions)| {
            // Partition i goes to connection i mod N.
            (0..connections).map(move |c| {
                let share: Vec<i32> = partitions.iter().copied().skip(c).step_by(connections).collect();
                (leader.clone(), share)
            })
        })
        .filter(|(_, partitions)| !partitions.is_empty())
        .map(|(leader, partitions)| {
            let positions: BTreeMap<i32, i64> = partitions
                .iter()
                .map(|&p| {
                    let (earliest, latest) = bounds[p as usize];
                    (p, if args.from == From::Earliest { earliest } else { latest })
                })
                .collect();
            let lane = Lane {
                bootstrap: args.bootstrap.clone(),
                first_leader: leader,
                topic: args.topic.clone(),
                version,
                started_ms,
                limit: args.messages,
                deadline,
                repeat: args.repeat,
            };
            let consumed = consumed.clone();
            std::thread::spawn(move || lane.fetch(positions, &consumed))
        })
        .collect();
    let mut tally = Tally::default();
    for lane in lanes {
        tally.merge(&lane.join().map_err(|_| anyhow::anyhow!("a fetch thread panicked"))??);
    }
    drop(progress);
    Ok(ConsumeResult { tally, elapsed: started.elapsed() })
}

/// One fetching thread: its share of the partitions, and what it fetches them with.
struct Lane {
    bootstrap: String,
    /// Where its partitions were led when it started.
    first_leader: String,
    topic: String,
    version: i16,
    /// Wall clock when the consumer started: only later batches count for latency.
    started_ms: i64,
    limit: Option<u64>,
    deadline: Option<Instant>,
    /// Read each partition again from its first position once it reaches its end.
    repeat: bool,
}

impl Lane {
    fn fetch(self, mut positions: BTreeMap<i32, i64>, consumed: &AtomicU64) -> Result<Tally> {
        let mut client = KafkaClient::connect(&self.bootstrap)?;
        let mut leaders: BTreeMap<i32, String> = positions.keys().map(|p| (*p, self.first_leader.clone())).collect();
        let mut tally = Tally::default();
        let first_positions = positions.clone();
        let name = TopicName(StrBytes::from_string(self.topic.clone()));
        // Since when some partition has had no leader to fetch from, and why.
        let mut stuck: Option<(Instant, String)> = None;
        loop {
            if self.deadline.is_some_and(|d| Instant::now() >= d)
                || self.limit.is_some_and(|l| consumed.load(Ordering::Relaxed) >= l)
            {
                return Ok(tally);
            }
            let mut by_leader: BTreeMap<String, Vec<i32>> = BTreeMap::new();
            for (p, addr) in &leaders {
                by_leader.entry(addr.clone()).or_default().push(*p);
            }
            let mut trouble = None;
            for (addr, partitions) in by_leader {
                let request = FetchRequest::default()
                    .with_replica_id(kafka_protocol::messages::BrokerId(-1))
                    .with_max_wait_ms(100)
                    .with_min_bytes(1)
                    .with_max_bytes(FETCH_MAX_BYTES)
                    .with_topics(vec![
                        FetchTopic::default().with_topic(name.clone()).with_partitions(
                            partitions
                                .iter()
                                .map(|p| {
                                    FetchPartition::default()
                                        .with_partition(*p)
                                        .with_fetch_offset(positions[p])
                                        .with_partition_max_bytes(PARTITION_MAX_BYTES)
                                })
                                .collect(),
                        ),
                    ]);
                let answer = client.connection(&addr).and_then(|c| c.call(ApiKey::Fetch, self.version, &request));
                let response = match answer {
                    Ok(ResponseKind::Fetch(response)) => response,
                    Ok(_) => bail!("wrong answer to Fetch"),
                    Err(e) => {
                        client.forget(&addr);
                        trouble = Some(format!("{addr}: {e:#}"));
                        continue;
                    }
                };
                for p in response.responses.iter().flat_map(|t| &t.partitions) {
                    let Some(position) = positions.get_mut(&p.partition_index) else { continue };
                    match ResponseError::try_from_code(p.error_code) {
                        None => {}
                        Some(e) if e.is_retriable() => {
                            trouble = Some(format!("{e} from {addr}"));
                            continue;
                        }
                        Some(_) => {
                            *tally.errors.entry(p.error_code).or_default() += 1;
                            continue;
                        }
                    }
                    let Some(records) = &p.records else { continue };
                    self.count(records, position, &mut tally, consumed);
                    if self.repeat && *position >= p.high_watermark {
                        *position = first_positions[&p.partition_index];
                    }
                }
            }
            match trouble {
                None => stuck = None,
                Some(reason) => {
                    let since = stuck.get_or_insert_with(|| (Instant::now(), String::new()));
                    since.1 = reason;
                    if since.0.elapsed() >= RETRY_FOR {
                        bail!("fetch {}: {} (still after {RETRY_FOR:?})", self.topic, since.1);
                    }
                    // Fresh metadata: where each partition is led now.
                    std::thread::sleep(Duration::from_millis(100));
                    let layout = client.layout(&self.topic)?;
                    for (p, addr) in leaders.iter_mut() {
                        if let Some(now) = layout.leaders.get(p) {
                            addr.clone_from(now);
                        }
                    }
                }
            }
        }
    }

    /// Counts the whole batches of one partition's answer from `position` on, and moves it past them.
    fn count(&self, records: &bytes::Bytes, position: &mut i64, tally: &mut Tally, consumed: &AtomicU64) {
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let mut at = 0;
        while at < records.len() {
            let Ok(header) = BatchHeader::parse(&records[at..]) else { break };
            let total = header.total_bytes();
            if at + total > records.len() {
                break; // a partial batch at the end of the answer: fetched again next time
            }
            let last = header.base_offset + header.last_offset_delta as i64;
            if last >= *position {
                // A fetch may start inside a batch; count only the records from the position on.
                let count = (last - (*position).max(header.base_offset) + 1) as u64;
                tally.messages += count;
                tally.bytes += (total as u64) * count / (header.record_count.max(1) as u64);
                if header.base_timestamp >= self.started_ms && header.max_timestamp <= now_ms {
                    tally.record_latency(Duration::from_millis((now_ms - header.max_timestamp) as u64), count);
                }
                consumed.fetch_add(count, Ordering::Relaxed);
                *position = last + 1;
            }
            at += total;
        }
    }
}
