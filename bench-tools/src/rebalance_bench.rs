//! `shardlog-bench rebalance`: how a group of real librdkafka consumers takes in one more member, under
//! the classic protocol with the cooperative-sticky assignor and under the consumer protocol of KIP-848
//! (`group.protocol=consumer`), on the same broker, one protocol after the other (each its own topic and
//! group).
//!
//! A producer keeps writing a record to every partition every 20 ms, each carrying when it was sent.
//! `--members` - 1 consumers of one group share `--partitions` partitions; then one more joins. Measured
//! per round: the time from the new member's `subscribe` to the last change of any member's assignment
//! that leaves every partition with exactly one member and every member with some; and, for each member
//! that was already there, the longest a record of a partition it kept throughout waited between being
//! sent and being consumed, from the join until a second after the group settled (its pause; a member
//! that never stops consuming shows the stream's usual latency). Then the new member leaves, the group
//! settles again, and the next round begins.
//!
//! Both protocols heartbeat every `--heartbeat-ms`: the classic members with `heartbeat.interval.ms`,
//! the local broker's consumer-protocol groups with `group.consumer.heartbeat.interval.ms`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use shardlog_broker::client::KafkaClient;

use crate::groups_bench::{local_or, median};

/// Options of `shardlog-bench rebalance`.
#[derive(Debug, Clone, clap::Args)]
pub struct RebalanceArgs {
    /// Brokers to measure, HOST:PORT[,...]; without it a local single broker is started (its consumer
    /// protocol then heartbeats every --heartbeat-ms too).
    #[arg(long)]
    pub bootstrap: Option<String>,
    /// Members of the group once the joining member is in.
    #[arg(long, default_value_t = 10)]
    pub members: usize,
    #[arg(long, default_value_t = 100)]
    pub partitions: i32,
    /// Join-and-leave rounds per protocol.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// The members' heartbeat interval.
    #[arg(long, default_value_t = 3000)]
    pub heartbeat_ms: u64,
    /// The local broker's data dir (emptied first).
    #[arg(long, default_value = "bench-rebalance")]
    pub data_dir: std::path::PathBuf,
    /// The group protocols measured, in this order.
    #[arg(long, value_delimiter = ',', default_value = "classic,consumer", value_parser = ["classic", "consumer"])]
    pub protocols: Vec<String>,
}
/// How long a group may take to settle before the run gives up.
const SETTLE_LIMIT: Duration = Duration::from_secs(120);

/// What one member thread saw.
#[derive(Default)]
struct Seen {
    assigned: BTreeSet<i32>,
    /// When its assignment last changed.
    changed: Option<Instant>,
    /// The longest a record waited between being sent and consumed, per partition, since the window
    /// opened.
    waits: BTreeMap<i32, Duration>,
    /// When the latest record consumed per partition was sent (microseconds on the run's clock).
    latest_sent: BTreeMap<i32, u64>,
}

struct MemberThread {
    seen: Arc<Mutex<Seen>>,
    stop: Arc<AtomicBool>,
    handle: thread::JoinHandle<()>,
}

impl MemberThread {
    fn start(config: ClientConfig, topic: &str, clock: Instant) -> Result<MemberThread> {
        let consumer: BaseConsumer = config.create()?;
        consumer.subscribe(&[topic])?;
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (seen.clone(), stop.clone());
        let handle = thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let message = consumer.poll(Duration::from_millis(20));
                let now = Instant::now();
                let assigned: BTreeSet<i32> = consumer
                    .assignment()
                    .map(|list| list.elements().iter().map(|e| e.partition()).collect())
                    .unwrap_or_default();
                let mut seen = s.lock().expect("not poisoned");
                if assigned != seen.assigned {
                    seen.assigned = assigned;
                    seen.changed = Some(now);
                }
                if let Some(Ok(m)) = message {
                    let sent = m.payload().and_then(|b| b.try_into().ok()).map(u64::from_be_bytes);
                    if let Some(sent) = sent {
                        let waited = (now - clock).saturating_sub(Duration::from_micros(sent));
                        let wait = seen.waits.entry(m.partition()).or_default();
                        *wait = (*wait).max(waited);
                        seen.latest_sent.insert(m.partition(), sent);
                    }
                }
            }
            // Leaves the group.
            drop(consumer);
        });
        Ok(MemberThread { seen, stop, handle })
    }

    fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.handle.join();
    }
}

/// The group settled: every partition has exactly one member and every member has some. Returns when
/// the last assignment changed.
fn settled(members: &[MemberThread], partitions: i32) -> Option<Instant> {
    let seen: Vec<_> = members.iter().map(|m| m.seen.lock().expect("not poisoned")).collect();
    let total: usize = seen.iter().map(|s| s.assigned.len()).sum();
    let union: BTreeSet<i32> = seen.iter().flat_map(|s| s.assigned.iter().copied()).collect();
    let complete = total == partitions as usize && union.len() == total && seen.iter().all(|s| !s.assigned.is_empty());
    complete.then(|| seen.iter().filter_map(|s| s.changed).max()).flatten()
}

fn wait_settled(members: &[MemberThread], partitions: i32, what: &str) -> Result<Instant> {
    let deadline = Instant::now() + SETTLE_LIMIT;
    loop {
        if let Some(at) = settled(members, partitions) {
            return Ok(at);
        }
        if Instant::now() > deadline {
            bail!("{what}: the group did not settle within {SETTLE_LIMIT:?}");
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// One round's figures: the time to settle, and each old member's pause.
type Round = (Duration, Vec<Duration>);

fn measure(args: &RebalanceArgs, bootstrap: &str, protocol: &str, run_id: u64) -> Result<Vec<Round>> {
    let topic = format!("bench-rebalance-{protocol}-{run_id}");
    KafkaClient::connect(bootstrap)?.create_topic(&topic, args.partitions, 1, &[])?;
    let producing = Arc::new(AtomicBool::new(true));
    // Its delivery reports served on a thread of its own: a BaseProducer serves one report per poll,
    // too few for thousands of records a second, and its queue fills with records long acknowledged.
    let producer: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap).set("linger.ms", "5").create()?;
    // Records the producer could not queue: a stream that stopped makes the waits meaningless.
    let refused = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let (t, p, go, refused_by) = (topic.clone(), args.partitions, producing.clone(), refused.clone());
    // Records carry when they were sent, in microseconds on this clock.
    let clock = Instant::now();
    let writer = thread::spawn(move || {
        while go.load(Ordering::Relaxed) {
            for partition in 0..p {
                let sent = (clock.elapsed().as_micros() as u64).to_be_bytes();
                if producer.send(BaseRecord::<(), [u8]>::to(&t).payload(&sent[..]).partition(partition)).is_err() {
                    refused_by.fetch_add(1, Ordering::Relaxed);
                }
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = producer.flush(Duration::from_secs(10));
    });
    let config = || {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", bootstrap)
            .set("group.id", format!("bench-rebalance-{protocol}-{run_id}"))
            .set("auto.offset.reset", "latest")
            .set("enable.auto.commit", "false");
        if protocol == "consumer" {
            c.set("group.protocol", "consumer");
        } else {
            c.set("partition.assignment.strategy", "cooperative-sticky")
                .set("heartbeat.interval.ms", args.heartbeat_ms.to_string());
        }
        c
    };
    let mut members = Vec::new();
    for _ in 0..args.members - 1 {
        members.push(MemberThread::start(config(), &topic, clock)?);
    }
    wait_settled(&members, args.partitions, "the first members")?;
    let mut rounds = Vec::new();
    for _ in 0..args.rounds {
        // A second of steady consumption, then the window opens.
        thread::sleep(Duration::from_secs(1));
        let before: Vec<BTreeSet<i32>> = members
            .iter()
            .map(|m| {
                let mut seen = m.seen.lock().expect("not poisoned");
                seen.waits.clear();
                seen.assigned.clone()
            })
            .collect();
        let joined = Instant::now();
        members.push(MemberThread::start(config(), &topic, clock)?);
        let settled_at = wait_settled(&members, args.partitions, "after a join")?;
        // Measured until every old member has consumed, on each partition it kept, a record sent a
        // second after the group settled: a pause still going on then is measured to its end.
        thread::sleep(Duration::from_secs(1));
        let closing = clock.elapsed().as_micros() as u64;
        let deadline = Instant::now() + SETTLE_LIMIT;
        while Instant::now() < deadline
            && members.iter().zip(&before).any(|(m, before)| {
                let seen = m.seen.lock().expect("not poisoned");
                let kept = before.intersection(&seen.assigned);
                kept.into_iter().any(|p| seen.latest_sent.get(p).is_none_or(|sent| *sent < closing))
            })
        {
            thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "{protocol}: round {}: settled in {:?}",
            rounds.len() + 1,
            settled_at.saturating_duration_since(joined)
        );
        let mut pauses = Vec::new();
        for (m, before) in members.iter().zip(&before) {
            let seen = m.seen.lock().expect("not poisoned");
            let kept = before.intersection(&seen.assigned);
            pauses.extend(kept.map(|p| seen.waits.get(p).copied().unwrap_or_default()).max());
        }
        rounds.push((settled_at.saturating_duration_since(joined), pauses));
        members.pop().expect("the member that joined").finish();
        wait_settled(&members, args.partitions, "after the leave")?;
    }
    for m in members {
        m.finish();
    }
    producing.store(false, Ordering::Relaxed);
    let _ = writer.join();
    let refused = refused.load(Ordering::Relaxed);
    if refused > 0 {
        eprintln!("{protocol}: the producer could not queue {refused} records (librdkafka's queue was full)");
    }
    Ok(rounds)
}

pub struct RebalanceReport {
    /// Per protocol, its rounds.
    pub rounds: Vec<(String, Vec<Round>)>,
    pub args: RebalanceArgs,
}

impl RebalanceReport {
    pub fn render(&self) -> String {
        let a = &self.args;
        let mut out = format!(
            "rebalance: a member joins a group of {} librdkafka consumers on {} partitions, heartbeats every {} ms\n\
             | protocol | settled, ms per round (median) | longest wait of a record on a kept partition, ms: median of members (max) per round |\n|---|---|---|\n",
            a.members - 1,
            a.partitions,
            a.heartbeat_ms
        );
        for (protocol, rounds) in &self.rounds {
            let name = if protocol == "consumer" { "consumer (KIP-848)" } else { "classic, cooperative-sticky" };
            let settles: Vec<String> = rounds.iter().map(|r| r.0.as_millis().to_string()).collect();
            let pauses: Vec<String> = rounds
                .iter()
                .map(|r| {
                    let max = r.1.iter().max().copied().unwrap_or_default();
                    format!("{} ({})", median(r.1.clone()).as_millis(), max.as_millis())
                })
                .collect();
            out.push_str(&format!(
                "| {name} | {} ({}) | {} |\n",
                settles.join(", "),
                median(rounds.iter().map(|r| r.0).collect()).as_millis(),
                pauses.join(", ")
            ));
        }
        out
    }
}

pub fn run(args: &RebalanceArgs) -> Result<RebalanceReport> {
    if args.members < 2 || args.partitions < args.members as i32 || args.rounds == 0 {
        bail!("--members at least 2, --partitions at least --members, --rounds at least 1");
    }
    let settings = vec![
        "group.initial.rebalance.delay.ms=0".to_string(),
        format!("group.consumer.heartbeat.interval.ms={}", args.heartbeat_ms),
    ];
    let (bootstrap, local) = local_or(&args.bootstrap, &args.data_dir, settings)?;
    let run_id = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_secs();
    let mut rounds = Vec::new();
    for protocol in &args.protocols {
        rounds.push((protocol.clone(), measure(args, &bootstrap, protocol, run_id)?));
    }
    drop(local);
    Ok(RebalanceReport { rounds, args: args.clone() })
}
