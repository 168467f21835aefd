//! `shardlog-bench consume`: fetches a topic as fast as the broker serves it, one connection per leader
//! broker with every partition it leads in each Fetch, and measures messages/s, MB/s and end-to-end
//! latency (now minus each batch's newest producer timestamp) when producer timestamps are present.
//!
//! Batches are counted from their headers, not decoded: the measure is the broker's, not the decoder's.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Result, bail};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, FetchRequest, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;
use shardlog_broker::admin_cli::AdminClient;
use shardlog_storage::batch::BatchHeader;

use crate::stats::{self, Tally};
use crate::wire::{Connection, TopicLayout, negotiate};

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
    #[arg(long, default_value = "127.0.0.1:9092")]
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
}

/// What a consume run measured.
#[derive(Debug, Clone)]
pub struct ConsumeResult {
    pub tally: Tally,
    pub elapsed: Duration,
}

impl ConsumeResult {
    pub fn report(&self) -> String {
        self.tally.report(self.elapsed, Some("end to end (producer timestamp to fetch)"))
    }
}

pub fn run(args: &ConsumeArgs) -> Result<ConsumeResult> {
    let mut admin = AdminClient::connect(&args.bootstrap)?;
    let layout = TopicLayout::fetch(&mut admin, &args.topic)?;
    let bounds = admin.offsets(&args.topic, layout.partitions)?;
    let version = negotiate(&mut Connection::open(&args.bootstrap)?, ApiKey::Fetch, FETCH_VERSIONS)?;
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
            let (topic, consumed, limit) = (args.topic.clone(), consumed.clone(), args.messages);
            std::thread::spawn(move || fetch_lane(&leader, &topic, version, positions, &consumed, limit, deadline))
        })
        .collect();
    let mut tally = Tally::default();
    for lane in lanes {
        tally.merge(&lane.join().map_err(|_| anyhow::anyhow!("a fetch thread panicked"))??);
    }
    drop(progress);
    Ok(ConsumeResult { tally, elapsed: started.elapsed() })
}

fn fetch_lane(
    leader: &str,
    topic: &str,
    version: i16,
    mut positions: BTreeMap<i32, i64>,
    consumed: &AtomicU64,
    limit: Option<u64>,
    deadline: Option<Instant>,
) -> Result<Tally> {
    let mut conn = Connection::open(leader)?;
    let mut tally = Tally::default();
    let name = TopicName(StrBytes::from_string(topic.to_string()));
    loop {
        if deadline.is_some_and(|d| Instant::now() >= d) || limit.is_some_and(|l| consumed.load(Ordering::Relaxed) >= l)
        {
            return Ok(tally);
        }
        let partitions = positions
            .iter()
            .map(|(&p, &offset)| {
                FetchPartition::default()
                    .with_partition(p)
                    .with_fetch_offset(offset)
                    .with_partition_max_bytes(PARTITION_MAX_BYTES)
            })
            .collect();
        let request = FetchRequest::default()
            .with_replica_id(kafka_protocol::messages::BrokerId(-1))
            .with_max_wait_ms(100)
            .with_min_bytes(1)
            .with_max_bytes(FETCH_MAX_BYTES)
            .with_topics(vec![FetchTopic::default().with_topic(name.clone()).with_partitions(partitions)]);
        let ResponseKind::Fetch(response) = conn.call(ApiKey::Fetch, version, &request)? else {
            bail!("wrong answer to Fetch")
        };
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        for p in response.responses.iter().flat_map(|t| &t.partitions) {
            if p.error_code != 0 {
                *tally.errors.entry(p.error_code).or_default() += 1;
                continue;
            }
            let Some(records) = &p.records else { continue };
            let position = positions.get_mut(&p.partition_index).expect("a partition we asked for");
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
                    if header.max_timestamp > 0 && header.max_timestamp <= now_ms {
                        tally.record_latency(Duration::from_millis((now_ms - header.max_timestamp) as u64), count);
                    }
                    consumed.fetch_add(count, Ordering::Relaxed);
                    *position = last + 1;
                }
                at += total;
            }
        }
    }
}
