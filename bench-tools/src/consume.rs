//! `shardlog-bench consume`: fetches a topic as fast as the broker serves it, with every partition a
//! leader leads in each Fetch to it, and measures messages/s, MB/s and end-to-end latency: now minus each
//! batch's newest producer timestamp, for batches produced after the consumer started (older records
//! would measure how old the data is, not how fast it arrives).
//!
//! Batches are counted from their headers, not decoded: the measure is the broker's, not the decoder's.
//! Control batches (transaction markers) are not records and are skipped. With `--isolation
//! read_committed` the broker answers up to the last stable offset, so a transactional record arrives once
//! its transaction is committed and its end-to-end latency includes waiting for the commit; the records of
//! aborted transactions it lists are skipped, as Kafka's consumers skip them.
//! A partition whose leader moves is fetched from its new leader, found through fresh metadata, as Kafka
//! consumers do.
//!
//! Rates are over the time records arrived: from the sending of the first Fetch that brought records to
//! the arrival of the last, so waiting for a producer to start, or for records that never come, does not
//! dilute them. A run never waits silently: a topic that does not exist yet and a pause in the records
//! are announced on stderr once they last [`NOTICE_AFTER`], and `--timeout-ms` without either ends the
//! run with an error (as Kafka's console consumer's `--timeout-ms` does).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, FetchRequest, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;
use shardlog_broker::client::{
    BOOTSTRAP_ENV, COMMAND_CONFIG_ENV, ClientSecurity, DEFAULT_BOOTSTRAP, KafkaClient, RETRY_FOR,
};
use shardlog_storage::batch::BatchHeader;

use crate::stats::{self, Tally};

/// Fetch versions this tool speaks.
const FETCH_VERSIONS: (i16, i16) = (4, 11);
/// Bytes asked for per partition and per Fetch.
const PARTITION_MAX_BYTES: i32 = 8 << 20;
const FETCH_MAX_BYTES: i32 = 50 << 20;
/// How long a wait lasts before the tool says what it waits for.
const NOTICE_AFTER: Duration = Duration::from_secs(2);
/// The default `--timeout-ms`.
const DEFAULT_TIMEOUT_MS: u64 = 10_000;
/// How often the tool looks at its waits.
const WATCH_EVERY: Duration = Duration::from_millis(100);
/// Kafka's UNKNOWN_TOPIC_OR_PARTITION.
const UNKNOWN_TOPIC_OR_PARTITION: i16 = 3;

/// Kafka's `isolation.level`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Isolation {
    #[value(name = "read_uncommitted")]
    ReadUncommitted,
    #[value(name = "read_committed")]
    ReadCommitted,
}

impl Isolation {
    /// Fetch's `isolation_level`.
    fn level(self) -> i8 {
        match self {
            Isolation::ReadUncommitted => 0,
            Isolation::ReadCommitted => 1,
        }
    }
}

/// A batch's attribute bits: part of a transaction, a control batch (a transaction marker).
const TRANSACTIONAL_BIT: i16 = 0x10;
const CONTROL_BIT: i16 = 0x20;

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
    /// Kafka client properties for a secured cluster (`security.protocol`, `sasl.*`, `ssl.*`), as
    /// `shardlog --command-config` takes them. Without it: plaintext.
    #[arg(long, value_name = "FILE", env = COMMAND_CONFIG_ENV)]
    pub command_config: Option<PathBuf>,
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
    /// Give up, with an error, when the topic does not exist for this long, or (with --messages) when no
    /// record arrives for this long before the count is reached (Kafka's console consumer's
    /// `--timeout-ms`).
    #[arg(long, default_value_t = DEFAULT_TIMEOUT_MS)]
    pub timeout_ms: u64,
    /// Kafka's `isolation.level`: read_committed reads up to the last stable offset and skips aborted
    /// transactions.
    #[arg(long, value_enum, default_value_t = Isolation::ReadUncommitted)]
    pub isolation: Isolation,
}

/// What a consume run measured.
#[derive(Debug, Clone)]
pub struct ConsumeResult {
    pub tally: Tally,
    /// The time records arrived over (what the rates are over).
    pub elapsed: Duration,
    /// The whole run, waits included.
    pub run: Duration,
    /// Why the run stopped before it had the messages it was asked for (`--timeout-ms`).
    pub gave_up: Option<String>,
}

impl ConsumeResult {
    pub fn report(&self) -> String {
        let measured = self.tally.latency_us.len();
        let mut out = if measured == 0 {
            format!(
                "{}end to end: not measured (no record was produced after the consumer started)\n",
                self.tally.report(self.elapsed, None)
            )
        } else {
            let label =
                format!("end to end, producer timestamp to fetch, of the {measured} records produced after the start");
            self.tally.report(self.elapsed, Some(&label))
        };
        if self.run.saturating_sub(self.elapsed) >= WATCH_EVERY {
            out.push_str(&format!(
                "records arrived over {:.2} s of the {:.2} s run (the rates are over the former)\n",
                self.elapsed.as_secs_f64(),
                self.run.as_secs_f64()
            ));
        }
        out
    }
}

/// When records arrived, as a lane saw them: from the sending of the first Fetch that brought some to the
/// arrival of the last.
#[derive(Debug, Clone, Copy, Default)]
struct Arrivals {
    first_asked: Option<Instant>,
    last: Option<Instant>,
}

impl Arrivals {
    fn merge(self, other: Arrivals) -> Arrivals {
        let first_asked = match (self.first_asked, other.first_asked) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Arrivals { first_asked, last: self.last.max(other.last) }
    }

    fn span(&self) -> Duration {
        match (self.first_asked, self.last) {
            (Some(first), Some(last)) => last.saturating_duration_since(first),
            _ => Duration::ZERO,
        }
    }
}

/// What every lane shares: how many records arrived, and when the last did (microseconds from the start),
/// so that a pause in all of them is seen, said and, past `--timeout-ms`, given up on.
#[derive(Debug)]
struct Watch {
    started: Instant,
    consumed: AtomicU64,
    last_arrival_us: AtomicU64,
    gave_up: AtomicBool,
}

impl Watch {
    fn arrived(&self, count: u64) {
        self.consumed.fetch_add(count, Ordering::Relaxed);
        self.last_arrival_us.store(self.started.elapsed().as_micros() as u64, Ordering::Relaxed);
    }

    /// How long no record has arrived (since the start, before the first).
    fn idle(&self) -> Duration {
        self.started.elapsed().saturating_sub(Duration::from_micros(self.last_arrival_us.load(Ordering::Relaxed)))
    }
}

/// Waits, saying so, until the cluster knows `topic` (a consumer may start before its topic is created),
/// up to `timeout`.
fn await_topic(admin: &mut KafkaClient, topic: &str, timeout: Duration) -> Result<()> {
    let started = Instant::now();
    let mut said = false;
    loop {
        let metadata = admin.metadata(Some(&[topic]))?;
        let code = metadata.topics.first().context("empty Metadata answer")?.error_code;
        if code != UNKNOWN_TOPIC_OR_PARTITION {
            return Ok(());
        }
        let waited = started.elapsed();
        if waited >= timeout {
            bail!(
                "topic {topic} does not exist: the cluster answered UNKNOWN_TOPIC_OR_PARTITION for {:.1} s \
                 (--timeout-ms {})",
                waited.as_secs_f64(),
                timeout.as_millis()
            );
        }
        if !said && waited >= NOTICE_AFTER {
            eprintln!(
                "waiting for topic {topic} to be created (the cluster does not know it); giving up after {:.0} s \
                 (--timeout-ms)",
                timeout.as_secs_f64()
            );
            said = true;
        }
        std::thread::sleep(WATCH_EVERY);
    }
}

pub fn run(args: &ConsumeArgs) -> Result<ConsumeResult> {
    let started_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
    let timeout = Duration::from_millis(args.timeout_ms);
    let security = ClientSecurity::load(args.command_config.as_deref())?;
    let mut admin = KafkaClient::connect_secured(&args.bootstrap, security.clone())?;
    await_topic(&mut admin, &args.topic, timeout)?;
    let layout = admin.led_layout(&args.topic)?;
    let bounds = admin.offsets(&args.topic, layout.partitions)?;
    let any_leader = layout.leaders.values().next().context("a topic without partitions")?.clone();
    let version = admin.connection(&any_leader)?.negotiate(ApiKey::Fetch, FETCH_VERSIONS)?;
    // What the topic held at the start, from where this run reads: said when records stop coming.
    let available: i64 =
        bounds.iter().map(|&(earliest, latest)| if args.from == From::Earliest { latest - earliest } else { 0 }).sum();
    let started = Instant::now();
    let shared = Arc::new(Watch {
        started,
        consumed: AtomicU64::new(0),
        last_arrival_us: AtomicU64::new(0),
        gave_up: AtomicBool::new(false),
    });
    let deadline = args.duration.map(|d| started + d);
    let bar = stats::Progress::start(args.messages, args.duration, {
        let shared = shared.clone();
        move || shared.consumed.load(Ordering::Relaxed)
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
                security: security.clone(),
                first_leader: leader,
                topic: args.topic.clone(),
                version,
                started_ms,
                limit: args.messages,
                deadline,
                repeat: args.repeat,
                timeout,
                isolation: args.isolation,
            };
            let shared = shared.clone();
            std::thread::spawn(move || lane.fetch(positions, &shared))
        })
        .collect::<Vec<_>>();
    // Say what the run waits for when records stop coming (once per pause).
    let mut said = false;
    while !lanes.iter().all(|l| l.is_finished()) {
        std::thread::sleep(WATCH_EVERY);
        let idle = shared.idle();
        if idle < NOTICE_AFTER {
            said = false;
        } else if !said {
            said = true;
            let consumed = shared.consumed.load(Ordering::Relaxed);
            let wanted = args.messages.map_or(String::new(), |m| format!(" of the {m} asked for"));
            let held = match args.from {
                From::Earliest => format!("the topic held {available} from its earliest offsets when the run began"),
                From::Latest => "the run began at the topic's end".to_string(),
            };
            let until = match args.messages {
                Some(_) => format!("giving up after {:.0} s without one (--timeout-ms)", timeout.as_secs_f64()),
                None => "until --duration ends".to_string(),
            };
            bar.note(&format!(
                "waiting for records of {}: {consumed}{wanted} so far, none for {:.0} s; {held}; {until}",
                args.topic,
                idle.as_secs_f64()
            ));
        }
    }
    let mut tally = Tally::default();
    let mut arrivals = Arrivals::default();
    for lane in lanes {
        let (t, a) = lane.join().map_err(|_| anyhow::anyhow!("a fetch thread panicked"))??;
        tally.merge(&t);
        arrivals = arrivals.merge(a);
    }
    drop(bar);
    let run = started.elapsed();
    let gave_up = shared.gave_up.load(Ordering::Relaxed).then(|| {
        let consumed = shared.consumed.load(Ordering::Relaxed);
        let held = match args.from {
            From::Earliest => format!("; the topic held {available} when the run began"),
            From::Latest => String::new(),
        };
        format!(
            "consumed {consumed} of the {} messages asked for: none arrived for {:.1} s (--timeout-ms {}){held}",
            args.messages.unwrap_or(0),
            timeout.as_secs_f64(),
            args.timeout_ms
        )
    });
    Ok(ConsumeResult { tally, elapsed: arrivals.span(), run, gave_up })
}

/// One fetching thread: its share of the partitions, and what it fetches them with.
struct Lane {
    bootstrap: String,
    /// How its connections are opened (TLS, SASL).
    security: ClientSecurity,
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
    /// With a limit: how long no record may arrive (in any lane) before the run gives up.
    timeout: Duration,
    isolation: Isolation,
}

impl Lane {
    fn fetch(self, mut positions: BTreeMap<i32, i64>, shared: &Watch) -> Result<(Tally, Arrivals)> {
        let mut client = KafkaClient::connect_secured(&self.bootstrap, self.security.clone())?;
        let mut leaders: BTreeMap<i32, String> = positions.keys().map(|p| (*p, self.first_leader.clone())).collect();
        let mut tally = Tally::default();
        let first_positions = positions.clone();
        let name = TopicName(StrBytes::from_string(self.topic.clone()));
        // Since when some partition has had no leader to fetch from, and why.
        let mut stuck: Option<(Instant, String)> = None;
        let mut arrivals = Arrivals::default();
        loop {
            if self.deadline.is_some_and(|d| Instant::now() >= d)
                || self.limit.is_some_and(|l| shared.consumed.load(Ordering::Relaxed) >= l)
            {
                return Ok((tally, arrivals));
            }
            if self.limit.is_some() && shared.idle() >= self.timeout {
                shared.gave_up.store(true, Ordering::Relaxed);
                return Ok((tally, arrivals));
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
                    .with_isolation_level(self.isolation.level())
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
                let asked = Instant::now();
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
                    let aborted: Vec<(i64, i64)> =
                        p.aborted_transactions.iter().flatten().map(|a| (a.producer_id.0, a.first_offset)).collect();
                    if self.count(records, &aborted, position, &mut tally, shared) > 0 {
                        arrivals.first_asked.get_or_insert(asked);
                        arrivals.last = Some(Instant::now());
                    }
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

    /// Counts the whole batches of one partition's answer from `position` on, and moves it past them;
    /// returns how many records that was. Control batches are not counted, nor (read_committed) the
    /// batches of the `aborted` transactions (producer id, first offset) the answer listed: from a
    /// transaction's first offset to its producer's next control batch (its abort marker).
    fn count(
        &self,
        records: &bytes::Bytes,
        aborted: &[(i64, i64)],
        position: &mut i64,
        tally: &mut Tally,
        shared: &Watch,
    ) -> u64 {
        // Producers whose aborted transaction the batches are inside of.
        let mut aborting: std::collections::BTreeSet<i64> = std::collections::BTreeSet::new();
        let mut pending: Vec<(i64, i64)> = aborted.to_vec();
        pending.sort_by_key(|&(_, first)| first);
        let now_ms = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
        let mut at = 0;
        let mut counted = 0;
        while at < records.len() {
            let Ok(header) = BatchHeader::parse(&records[at..]) else { break };
            let total = header.total_bytes();
            if at + total > records.len() {
                break; // a partial batch at the end of the answer: fetched again next time
            }
            let last = header.base_offset + header.last_offset_delta as i64;
            let control = header.attributes & CONTROL_BIT != 0;
            // Kafka's consumer: an aborted transaction starts to count once a batch reaches its first offset.
            while let Some(&(producer, first)) = pending.first()
                && first <= last
            {
                aborting.insert(producer);
                pending.remove(0);
            }
            let in_aborted = self.isolation == Isolation::ReadCommitted
                && header.attributes & TRANSACTIONAL_BIT != 0
                && aborting.contains(&header.producer_id);
            if control && in_aborted {
                aborting.remove(&header.producer_id); // its abort marker
            }
            if control || in_aborted {
                *position = (*position).max(last + 1);
            } else if last >= *position {
                // A fetch may start inside a batch; count only the records from the position on.
                let count = (last - (*position).max(header.base_offset) + 1) as u64;
                tally.messages += count;
                tally.bytes += (total as u64) * count / (header.record_count.max(1) as u64);
                if header.base_timestamp >= self.started_ms && header.max_timestamp <= now_ms {
                    tally.record_latency(Duration::from_millis((now_ms - header.max_timestamp) as u64), count);
                }
                shared.arrived(count);
                counted += count;
                *position = last + 1;
            }
            at += total;
        }
        counted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::payload::{self, Idempotent, Origin};
    use bytes::{Bytes, BytesMut};

    /// A transactional batch of producer 7 holding `count` records from `base_offset`; a control batch
    /// (a marker) when `control`.
    fn batch(base_offset: i64, count: u64, control: bool) -> Bytes {
        let values: Vec<Bytes> =
            (0..count).map(|s| payload::value(Origin { run: 1, partition: 0, sequence: s }, 32)).collect();
        let producer = Idempotent { producer_id: 7, epoch: 0, first_sequence: 0, transactional: true };
        let encoded = payload::batch(&values, 0, kafka_protocol::records::Compression::None, Some(producer));
        let mut bytes = BytesMut::from(&encoded.unwrap()[..]);
        bytes[0..8].copy_from_slice(&base_offset.to_be_bytes());
        if control {
            bytes[22] |= CONTROL_BIT as u8;
        }
        bytes.freeze()
    }

    fn lane(isolation: Isolation) -> Lane {
        Lane {
            bootstrap: String::new(),
            security: ClientSecurity::plaintext(),
            first_leader: String::new(),
            topic: "t".into(),
            version: 11,
            started_ms: i64::MAX,
            limit: None,
            deadline: None,
            repeat: false,
            timeout: Duration::from_secs(1),
            isolation,
        }
    }

    /// Counts one answer of: an aborted transaction (offsets 0-2), its abort marker (3), a committed
    /// transaction of the same producer (4-5) and its commit marker (6), the abort listed from offset 0.
    fn count(isolation: Isolation) -> (u64, i64) {
        let mut records = BytesMut::new();
        for (base, count, control) in [(0, 3, false), (3, 1, true), (4, 2, false), (6, 1, true)] {
            records.extend_from_slice(&batch(base, count, control));
        }
        let watch = Watch {
            started: Instant::now(),
            consumed: AtomicU64::new(0),
            last_arrival_us: AtomicU64::new(0),
            gave_up: AtomicBool::new(false),
        };
        let mut position = 0;
        let counted = lane(isolation).count(&records.freeze(), &[(7, 0)], &mut position, &mut Tally::default(), &watch);
        (counted, position)
    }

    #[test]
    fn read_committed_skips_an_aborted_transaction_and_markers_but_counts_the_next_committed_one() {
        assert_eq!(count(Isolation::ReadCommitted), (2, 7));
    }

    #[test]
    fn read_uncommitted_counts_every_record_but_no_marker() {
        assert_eq!(count(Isolation::ReadUncommitted), (5, 7));
    }
}
