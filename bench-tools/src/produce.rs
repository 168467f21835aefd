//! `shardlog-bench produce`: a Kafka producer load, in the seed's `sync` mode or pipelined (`async`).
//!
//! - `sync` follows the seed's tables: one lane per partition, each sending one message per request and
//!   waiting for its acknowledgement before the next, so more partitions give more parallelism.
//! - `async` sends, per leader broker, requests holding one batch of up to `--batch-bytes` per
//!   partition, with up to `--in-flight` requests unanswered on the connection.
//!
//! Latency is from the moment a request is written to the moment its answer is read. With acks=0 there
//! is no answer: messages are counted when written to the socket, and no latency is reported.
//!
//! As a Kafka producer does, a batch refused with a retriable error (NOT_LEADER_OR_FOLLOWER after a
//! leader moved, ...) is sent again to whoever leads its partition then, within `--retries` and
//! `--delivery-timeout-ms`; its latency runs from the first send.
//!
//! With `--transactional`, one transactional producer sends transactions of `--txn-records` records
//! (see [`transactions`]).

mod transactions;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, InitProducerIdRequest, ProduceRequest, ProducerId, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::Compression;
use shardlog_broker::client::{
    BOOTSTRAP_ENV, COMMAND_CONFIG_ENV, ClientSecurity, Connection, DEFAULT_BOOTSTRAP, KafkaClient,
};

use crate::payload::{self, Origin};
use crate::stats::{self, Tally};

/// Produce versions this tool speaks.
pub(crate) const PRODUCE_VERSIONS: (i16, i16) = (3, 9);

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Sync,
    Async,
}

/// Options of `shardlog-bench produce`.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("amount").required(true).args(["messages", "duration"])))]
pub struct ProduceArgs {
    /// Brokers to reach the cluster through, HOST:PORT[,HOST:PORT...].
    #[arg(long, env = BOOTSTRAP_ENV, default_value = DEFAULT_BOOTSTRAP)]
    pub bootstrap: String,
    /// Kafka client properties for a secured cluster (`security.protocol`, `sasl.*`, `ssl.*`), as
    /// `shardlog --command-config` takes them. Without it: plaintext.
    #[arg(long, value_name = "FILE", env = COMMAND_CONFIG_ENV)]
    pub command_config: Option<PathBuf>,
    #[arg(long)]
    pub topic: String,
    /// Create the topic first (an existing one is used as it is).
    #[arg(long)]
    pub create: bool,
    /// Partitions of a created topic (with --create; default 1).
    #[arg(long)]
    pub partitions: Option<i32>,
    /// Replication factor of a created topic (with --create; default 1).
    #[arg(long)]
    pub replication_factor: Option<i16>,
    /// `min.insync.replicas` of a created topic (with --create; default: the broker's).
    #[arg(long)]
    pub min_insync: Option<i16>,
    /// 0, 1 or all.
    #[arg(long, default_value = "all", value_parser = parse_acks)]
    pub acks: i16,
    #[arg(long, default_value_t = 1024)]
    pub message_size: usize,
    #[arg(long, value_enum, default_value_t = Mode::Sync)]
    pub mode: Mode,
    /// Requests unanswered per connection (async mode; default 5, librdkafka's
    /// `max.in.flight.requests.per.connection` with idempotence).
    #[arg(long)]
    pub in_flight: Option<usize>,
    /// The most bytes of one partition's batch (async mode; default 1000000, librdkafka's `batch.size`).
    #[arg(long)]
    pub batch_bytes: Option<usize>,
    /// Messages per second to offer, in all (async mode). Without it the producer sends as fast as the
    /// broker takes (closed loop); with it, records are created on schedule and latency runs from a
    /// request's oldest record's creation, so it includes lingering and waiting for a slot.
    #[arg(long)]
    pub rate: Option<f64>,
    /// With --rate: how long a record may wait for its batch to fill before the request goes anyway
    /// (default 5, librdkafka's `linger.ms`).
    #[arg(long)]
    pub linger_ms: Option<u64>,
    /// Kafka's `retries`: how often a batch refused with a retriable error (NOT_LEADER_OR_FOLLOWER, ...)
    /// is sent again, to whoever leads its partition then.
    #[arg(long, default_value_t = i32::MAX as u32)]
    pub retries: u32,
    /// Kafka's `delivery.timeout.ms`: no batch is sent again once this long has passed since it was first
    /// sent.
    #[arg(long, default_value_t = 120_000)]
    pub delivery_timeout_ms: u64,
    /// none, gzip, snappy, lz4 or zstd.
    #[arg(long, default_value = "none")]
    pub compression: String,
    /// Messages to send in all.
    #[arg(long)]
    pub messages: Option<u64>,
    /// How long to send, e.g. 30s.
    #[arg(long, value_parser = stats::duration)]
    pub duration: Option<Duration>,
    /// Produce as an idempotent producer (Kafka's `enable.idempotence`): a producer id from
    /// InitProducerId and per-partition sequence numbers, so that retries are not stored twice. Needs
    /// acks=all and at most 5 requests in flight.
    #[arg(long)]
    pub idempotence: bool,
    /// Produce as a transactional producer (KIP-98): InitProducerId with a transactional id, then
    /// transactions of --txn-records records, each AddPartitionsToTxn, transactional batches and
    /// EndTxn(commit) once they are acknowledged. Needs --acks all and --mode async.
    #[arg(long)]
    pub transactional: bool,
    /// Records per transaction (with --transactional; default 100), spread round robin over the
    /// partitions.
    #[arg(long)]
    pub txn_records: Option<u64>,
    /// The transactional id (with --transactional; default: one of this run's own).
    #[arg(long)]
    pub transactional_id: Option<String>,
    /// Write every acknowledged record as `partition offset hash` lines, for `audit` (with
    /// --transactional: once its transaction is committed).
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// No progress bar (callers that draw their own).
    #[arg(skip)]
    pub quiet: bool,
}

fn parse_acks(s: &str) -> Result<i16, String> {
    match s {
        "0" => Ok(0),
        "1" => Ok(1),
        "all" | "-1" => Ok(-1),
        other => Err(format!("acks {other:?}: use 0, 1 or all")),
    }
}

/// What a produce run measured.
#[derive(Debug, Clone)]
pub struct ProduceResult {
    pub tally: Tally,
    pub elapsed: Duration,
    pub acks: i16,
    /// Paced by --rate: latency runs from record creation.
    pub paced: bool,
    /// How the load was sent: the mode, and for async the batch size, linger and requests in flight.
    pub setup: String,
    /// With --transactional: the transactions' figures.
    pub transactions: Option<transactions::TxnTally>,
}

impl ProduceResult {
    pub fn report(&self) -> String {
        let figures = if self.acks == 0 {
            format!("acks=0: sent, not acknowledged\n{}", self.tally.report(self.elapsed, None))
        } else if self.paced {
            self.tally.report(self.elapsed, Some("creation to acknowledgement"))
        } else {
            self.tally.report(self.elapsed, Some("send to acknowledgement"))
        };
        let transactions = self.transactions.as_ref().map_or(String::new(), |t| t.report(self.elapsed));
        format!("{}\n{figures}{transactions}", self.setup)
    }
}

/// The default `--linger-ms` (librdkafka's `linger.ms`).
const DEFAULT_LINGER_MS: u64 = 5;
/// The default `--in-flight`.
const DEFAULT_IN_FLIGHT: usize = 5;
/// The default `--txn-records`.
const DEFAULT_TXN_RECORDS: u64 = 100;
/// The default `--batch-bytes` (librdkafka's `batch.size`).
const DEFAULT_BATCH_BYTES: usize = 1_000_000;
/// Partitions and replication factor of a created topic without `--partitions` or `--replication-factor`.
const DEFAULT_PARTITIONS: i32 = 1;
const DEFAULT_REPLICATION_FACTOR: i16 = 1;
/// Kafka's `retry.backoff.ms`: the pause before a batch is sent again.
const RETRY_BACKOFF: Duration = Duration::from_millis(100);
/// The most bytes of batches one request carries (async mode): a request holds a batch for every
/// partition its broker leads, and must stay well within brokers' `socket.request.max.bytes` (100 MiB).
const MAX_REQUEST_BYTES: usize = 32 << 20;
/// Bytes a record adds to its value in a batch, at most for the values this tool sends (length, attributes,
/// timestamp and offset deltas, key and value lengths, header count as varints).
const RECORD_OVERHEAD_BYTES: usize = 16;

/// What `setup` says for `args`.
fn describe_setup(args: &ProduceArgs, linger_ms: u64) -> String {
    let setup = describe_mode(args, linger_ms);
    if args.transactional {
        let id = args.transactional_id.as_deref().unwrap_or("its own");
        let records = args.txn_records.unwrap_or(DEFAULT_TXN_RECORDS);
        format!("{setup}; transactional producer (transactional id {id}), {records} records per transaction")
    } else if args.idempotence {
        format!("{setup}; idempotent producer")
    } else {
        setup
    }
}

fn describe_mode(args: &ProduceArgs, linger_ms: u64) -> String {
    match args.mode {
        Mode::Sync => "sync: one message per request, one request at a time per partition".to_string(),
        Mode::Async => {
            let pacing = match args.rate {
                Some(rate) if args.transactional => format!("{rate:.0} msg/s offered, a transaction started when due"),
                Some(rate) => format!("{rate:.0} msg/s offered, linger {linger_ms} ms"),
                None => "as fast as acknowledged (closed loop)".to_string(),
            };
            format!(
                "async: batches up to {} bytes per partition (requests up to {} MiB), {} requests in flight \
                 per broker, {pacing}",
                args.batch_bytes.unwrap_or(DEFAULT_BATCH_BYTES),
                MAX_REQUEST_BYTES >> 20,
                args.in_flight.unwrap_or(DEFAULT_IN_FLIGHT)
            )
        }
    }
}

/// How many messages may still be sent, and until when.
#[derive(Debug)]
struct Budget {
    remaining: Option<AtomicU64>,
    deadline: Option<Instant>,
    /// Messages handed out so far.
    taken: AtomicU64,
}

impl Budget {
    /// Takes up to `n` messages; 0 when the run is over.
    fn take(&self, n: u64) -> u64 {
        let granted = self.grant(n);
        self.taken.fetch_add(granted, Ordering::Relaxed);
        granted
    }

    fn grant(&self, n: u64) -> u64 {
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return 0;
        }
        let Some(remaining) = &self.remaining else { return n };
        let mut current = remaining.load(Ordering::Relaxed);
        loop {
            let granted = current.min(n);
            if granted == 0 {
                return 0;
            }
            match remaining.compare_exchange(current, current - granted, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return granted,
                Err(now) => current = now,
            }
        }
    }
}

/// The audit file: acknowledged (partition, offset, hash).
type Recorder = Option<Arc<Mutex<BufWriter<File>>>>;

fn record(recorder: &Recorder, partition: i32, base_offset: i64, hashes: &[u32]) -> Result<()> {
    if let Some(file) = recorder {
        let mut file = file.lock().expect("audit file lock");
        for (i, h) in hashes.iter().enumerate() {
            writeln!(file, "{partition} {} {h:08x}", base_offset + i as i64)?;
        }
    }
    Ok(())
}

/// What every lane shares.
#[derive(Debug)]
struct Plan {
    bootstrap: String,
    /// How every connection is opened (TLS, SASL).
    security: ClientSecurity,
    topic: String,
    retries: u32,
    delivery_timeout: Duration,
    version: i16,
    acks: i16,
    message_size: usize,
    compression: Compression,
    run: u64,
    budget: Budget,
    /// Messages per second per async lane, and the linger, when the load is paced.
    pacing: Option<(f64, Duration)>,
    /// With --idempotence or --transactional: the producer id and epoch InitProducerId gave.
    producer: Option<(i64, i16)>,
    /// The batches are transactional (--transactional), and the produce requests name this id (a
    /// partition leader verifies each transactional batch with the id's coordinator, KIP-890).
    transactional: Option<String>,
}

impl Plan {
    /// The idempotence fields of a batch whose first record has per-partition sequence `first_sequence`.
    fn idempotent(&self, first_sequence: u64) -> Option<payload::Idempotent> {
        self.producer.map(|(producer_id, epoch)| payload::Idempotent {
            producer_id,
            epoch,
            first_sequence,
            transactional: self.transactional.is_some(),
        })
    }
}

/// InitProducerId, as an idempotent producer without a transactional id starts.
pub(crate) fn init_producer_id(connection: &mut Connection) -> Result<(i64, i16)> {
    let version = connection.negotiate(ApiKey::InitProducerId, (0, 4))?;
    // No transactional id: `None`, not the empty id the request's default has, which Kafka refuses.
    let request = InitProducerIdRequest::default()
        .with_transactional_id(None)
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    let ResponseKind::InitProducerId(r) = connection.call(ApiKey::InitProducerId, version, &request)? else {
        bail!("not an InitProducerId answer")
    };
    shardlog_broker::client::check(r.error_code, "InitProducerId")?;
    Ok((r.producer_id.0, r.producer_epoch))
}

/// Refuses a flag that would change nothing with the others given (before anything is sent), naming what
/// it applies to: a run that silently ignored one would measure something else than was asked for.
fn refuse_ignored_flags(args: &ProduceArgs) -> Result<()> {
    if args.linger_ms.is_some() && args.rate.is_none() {
        bail!("--linger-ms applies to --mode async --rate (a closed loop always has full batches)");
    }
    if args.mode == Mode::Sync {
        let given = [("--in-flight", args.in_flight.is_some()), ("--batch-bytes", args.batch_bytes.is_some())];
        if let Some((flag, _)) = given.iter().find(|(_, given)| *given) {
            bail!(
                "{flag} applies to --mode async (sync mode sends one message per request, one request at a time per partition)"
            );
        }
    }
    if args.transactional {
        if args.acks != -1 {
            bail!("--transactional needs --acks all (Kafka refuses a transactional producer with other acks)");
        }
        if args.mode == Mode::Sync {
            bail!("--transactional applies to --mode async (a transaction's batches are pipelined to its commit)");
        }
        if args.in_flight.unwrap_or(DEFAULT_IN_FLIGHT) > 5 {
            bail!("--transactional needs at most 5 requests in flight, as Kafka's idempotent producers do");
        }
        if args.linger_ms.is_some() {
            bail!("--linger-ms does not apply to --transactional (a transaction's records are sent when it starts)");
        }
        if args.txn_records == Some(0) {
            bail!("--txn-records must be at least 1");
        }
    } else {
        let given =
            [("--txn-records", args.txn_records.is_some()), ("--transactional-id", args.transactional_id.is_some())];
        if let Some((flag, _)) = given.iter().find(|(_, given)| *given) {
            bail!("{flag} applies to --transactional");
        }
    }
    if !args.create {
        let given = [
            ("--partitions", args.partitions.is_some()),
            ("--replication-factor", args.replication_factor.is_some()),
            ("--min-insync", args.min_insync.is_some()),
        ];
        if let Some((flag, _)) = given.iter().find(|(_, given)| *given) {
            bail!("{flag} applies to --create (a topic that exists is used as it is)");
        }
    }
    Ok(())
}

pub fn run(args: &ProduceArgs) -> Result<ProduceResult> {
    refuse_ignored_flags(args)?;
    let security = ClientSecurity::load(args.command_config.as_deref())?;
    let mut admin = KafkaClient::connect_secured(&args.bootstrap, security.clone())?;
    if args.create {
        let configs: Vec<(String, String)> =
            args.min_insync.iter().map(|m| ("min.insync.replicas".to_string(), m.to_string())).collect();
        let partitions = args.partitions.unwrap_or(DEFAULT_PARTITIONS);
        let replication_factor = args.replication_factor.unwrap_or(DEFAULT_REPLICATION_FACTOR);
        match admin.create_topic(&args.topic, partitions, replication_factor, &configs) {
            Ok(()) => {}
            Err(e) if e.to_string().contains("TopicAlreadyExists") => {
                eprintln!("topic {} exists; using it as it is", args.topic)
            }
            Err(e) => return Err(e),
        }
    }
    let layout = admin.led_layout(&args.topic)?;
    let any_leader = layout.leaders.values().next().context("a topic without partitions")?.clone();
    let version = admin.connection(&any_leader)?.negotiate(ApiKey::Produce, PRODUCE_VERSIONS)?;
    let recorder: Recorder = match &args.record {
        Some(path) => Some(Arc::new(Mutex::new(BufWriter::new(
            File::create(path).with_context(|| format!("create {}", path.display()))?,
        )))),
        None => None,
    };
    if args.message_size < payload::PREFIX_BYTES {
        bail!("--message-size must be at least {} bytes", payload::PREFIX_BYTES);
    }
    let linger_ms = args.linger_ms.unwrap_or(DEFAULT_LINGER_MS);
    let run_id = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let transactional = if args.transactional {
        let id = args.transactional_id.clone().unwrap_or_else(|| format!("shardlog-bench-{run_id:x}"));
        Some(transactions::Producer::init(&mut admin, &id)?)
    } else {
        None
    };
    let producer = if let Some(transactional) = &transactional {
        Some(transactional.producer)
    } else if args.idempotence {
        if args.acks != -1 || args.in_flight.unwrap_or(DEFAULT_IN_FLIGHT) > 5 {
            bail!("--idempotence needs --acks all and at most 5 requests in flight, as Kafka's producers do");
        }
        Some(init_producer_id(admin.connection(&any_leader)?)?)
    } else {
        None
    };
    let plan = Arc::new(Plan {
        bootstrap: args.bootstrap.clone(),
        security,
        topic: args.topic.clone(),
        retries: args.retries,
        delivery_timeout: Duration::from_millis(args.delivery_timeout_ms),
        version,
        acks: args.acks,
        message_size: args.message_size,
        compression: payload::compression(&args.compression)?,
        run: run_id,
        pacing: match args.rate {
            Some(rate) if rate > 0.0 && args.mode == Mode::Async => {
                // One transactional producer sends to every leader; otherwise a lane per leader.
                let lanes = if args.transactional { 1.0 } else { layout.by_leader().len().max(1) as f64 };
                Some((rate / lanes, Duration::from_millis(linger_ms)))
            }
            Some(_) if args.mode == Mode::Async => bail!("--rate must be positive"),
            Some(_) => bail!("--rate and --linger-ms apply to --mode async"),
            None => None,
        },
        producer,
        transactional: transactional.as_ref().map(|t| t.id.clone()),
        budget: Budget {
            remaining: args.messages.map(AtomicU64::new),
            deadline: args.duration.map(|d| Instant::now() + d),
            taken: AtomicU64::new(0),
        },
    });
    let started = Instant::now();
    let progress = (!args.quiet).then(|| {
        crate::stats::Progress::start(args.messages, args.duration, {
            let plan = plan.clone();
            move || plan.budget.taken.load(Ordering::Relaxed)
        })
    });
    if let Some(producer) = transactional {
        let txn_records = args.txn_records.unwrap_or(DEFAULT_TXN_RECORDS);
        let in_flight = args.in_flight.unwrap_or(DEFAULT_IN_FLIGHT).max(1);
        let batch_bytes = args.batch_bytes.unwrap_or(DEFAULT_BATCH_BYTES);
        let (tally, txns) =
            transactions::lane(&plan, &layout, producer, txn_records, in_flight, batch_bytes, &recorder)?;
        let elapsed = started.elapsed();
        drop(progress);
        if let Some(file) = &recorder {
            file.lock().expect("audit file lock").flush()?;
        }
        return Ok(ProduceResult {
            tally,
            elapsed,
            acks: args.acks,
            paced: false,
            setup: describe_setup(args, linger_ms),
            transactions: Some(txns),
        });
    }
    let lanes: Vec<std::thread::JoinHandle<Result<Tally>>> = match args.mode {
        Mode::Sync => layout
            .leaders
            .iter()
            .map(|(&partition, leader)| {
                let (plan, recorder, leader) = (plan.clone(), recorder.clone(), leader.clone());
                std::thread::spawn(move || sync_lane(&plan, leader, partition, &recorder))
            })
            .collect(),
        Mode::Async => layout
            .by_leader()
            .into_iter()
            .map(|(leader, partitions)| {
                let (plan, recorder) = (plan.clone(), recorder.clone());
                let in_flight = args.in_flight.unwrap_or(DEFAULT_IN_FLIGHT).max(1);
                let batch_bytes = args.batch_bytes.unwrap_or(DEFAULT_BATCH_BYTES);
                std::thread::spawn(move || async_lane(plan, &leader, &partitions, in_flight, batch_bytes, &recorder))
            })
            .collect(),
    };
    let mut tally = Tally::default();
    for lane in lanes {
        tally.merge(&lane.join().map_err(|_| anyhow::anyhow!("a producer thread panicked"))??);
    }
    let elapsed = started.elapsed();
    drop(progress);
    if let Some(file) = &recorder {
        file.lock().expect("audit file lock").flush()?;
    }
    Ok(ProduceResult {
        tally,
        elapsed,
        acks: args.acks,
        paced: plan.pacing.is_some(),
        setup: describe_setup(args, linger_ms),
        transactions: None,
    })
}

pub(crate) fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

fn request(plan: &Plan, batches: Vec<(i32, Bytes)>) -> ProduceRequest {
    let transactional_id = plan
        .transactional
        .as_ref()
        .map(|id| kafka_protocol::messages::TransactionalId(StrBytes::from_string(id.clone())));
    produce_request(&plan.topic, plan.acks, batches).with_transactional_id(transactional_id)
}

/// A Produce request of `batches` (partition, record batch) to `topic`.
pub(crate) fn produce_request(topic: &str, acks: i16, batches: Vec<(i32, Bytes)>) -> ProduceRequest {
    let partitions =
        batches.into_iter().map(|(p, b)| PartitionProduceData::default().with_index(p).with_records(Some(b))).collect();
    ProduceRequest::default().with_acks(acks).with_timeout_ms(30_000).with_topic_data(vec![
        TopicProduceData::default()
            .with_name(TopicName(StrBytes::from_string(topic.to_string())))
            .with_partition_data(partitions),
    ])
}

/// (partition, error code, base offset) of every partition in a produce answer.
pub(crate) fn outcomes(response: ResponseKind) -> Result<Vec<(i32, i16, i64)>> {
    let ResponseKind::Produce(r) = response else { bail!("wrong answer to Produce") };
    Ok(r.responses
        .iter()
        .flat_map(|t| t.partition_responses.iter().map(|p| (p.index, p.error_code, p.base_offset)))
        .collect())
}

/// One partition, one message per request, the next sent once the last is acknowledged.
fn sync_lane(plan: &Plan, mut leader: String, partition: i32, recorder: &Recorder) -> Result<Tally> {
    let mut conn = Connection::open_secured(&leader, &plan.security)?;
    let mut tally = Tally::default();
    let mut again = Redelivery { plan, client: None };
    let mut sequence = 0u64;
    while plan.budget.take(1) == 1 {
        let value = payload::value(Origin { run: plan.run, partition: partition as u32, sequence }, plan.message_size);
        let batch =
            payload::batch(std::slice::from_ref(&value), now_ms(), plan.compression, plan.idempotent(sequence))?;
        sequence += 1;
        let sent_at = Instant::now();
        conn.sender.send(ApiKey::Produce, plan.version, &request(plan, vec![(partition, batch.clone())]))?;
        if plan.acks == 0 {
            tally.messages += 1;
            tally.bytes += value.len() as u64;
            continue;
        }
        let (_, response) = conn.receiver.receive(ApiKey::Produce, plan.version)?;
        for (_, error, base_offset) in outcomes(response)? {
            let outcome = if error == 0 {
                Ok(base_offset)
            } else {
                again.send(partition, &batch, error, sent_at, 1, &mut tally)?
            };
            match outcome {
                Ok(base_offset) => {
                    tally.messages += 1;
                    tally.bytes += value.len() as u64;
                    tally.record_latency(sent_at.elapsed(), 1);
                    record(recorder, partition, base_offset, &[payload::hash(&value)])?;
                }
                Err(error) => *tally.errors.entry(error).or_default() += 1,
            }
            // After a retry, the next message goes where the retry went.
            if error != 0
                && let Some(moved) = again.moved_leader(partition, &leader)
            {
                conn = Connection::open_secured(&moved, &plan.security)?;
                leader = moved;
            }
        }
    }
    Ok(tally)
}

/// Sends a batch refused with a retriable error again, to whoever leads its partition then, until it is
/// acknowledged, refused for good, or out of retries or time (Kafka's `retries`, `delivery.timeout.ms`).
struct Redelivery<'a> {
    plan: &'a Plan,
    /// Opened on the first retry: the cluster's view, for finding leaders.
    client: Option<KafkaClient>,
}

impl Redelivery<'_> {
    /// `error` came back for `batch` (of `count` messages), first sent at `first_sent`. Returns its base
    /// offset once acknowledged, or the last error code.
    fn send(
        &mut self,
        partition: i32,
        batch: &Bytes,
        mut error: i16,
        first_sent: Instant,
        count: u64,
        tally: &mut Tally,
    ) -> Result<Result<i64, i16>> {
        let plan = self.plan;
        let mut attempts = 0u32;
        while is_retriable(error) && attempts < plan.retries && first_sent.elapsed() < plan.delivery_timeout {
            *tally.retried.entry(error).or_default() += count;
            attempts += 1;
            std::thread::sleep(RETRY_BACKOFF);
            let client = match &mut self.client {
                Some(client) => client,
                None => self.client.insert(KafkaClient::connect_secured(&plan.bootstrap, plan.security.clone())?),
            };
            let Some(leader) = client.leader(&plan.topic, partition)? else {
                error = kafka_protocol::ResponseError::LeaderNotAvailable.code();
                continue;
            };
            let sent = client.connection(&leader).and_then(|conn| {
                conn.call(ApiKey::Produce, plan.version, &request(plan, vec![(partition, batch.clone())]))
            });
            match sent.and_then(outcomes) {
                Ok(answers) => {
                    for (p, code, base_offset) in answers {
                        if p == partition {
                            if code == 0 {
                                return Ok(Ok(base_offset));
                            }
                            error = code;
                        }
                    }
                }
                Err(_) => {
                    client.forget(&leader);
                    error = kafka_protocol::ResponseError::NetworkException.code();
                }
            }
        }
        Ok(Err(error))
    }

    /// The partition's leader now (fresh metadata) if a retry went on and it is not `current`.
    fn moved_leader(&mut self, partition: i32, current: &str) -> Option<String> {
        let client = self.client.as_mut()?;
        let leader = client.leader(&self.plan.topic, partition).ok()??;
        (leader != current).then_some(leader)
    }
}

fn is_retriable(code: i16) -> bool {
    kafka_protocol::ResponseError::try_from_code(code).is_some_and(|e| e.is_retriable())
}

/// A request on the wire: when it was sent, and per partition what it carried.
struct InFlight {
    sent_at: Instant,
    batches: BTreeMap<i32, Sent>,
}

/// One partition's batch in a request: its message count, value bytes, value hashes (for `--record`),
/// and the batch itself (sent again after a retriable error).
struct Sent {
    count: u64,
    bytes: u64,
    hashes: Vec<u32>,
    batch: Bytes,
}

/// When records are due under `--rate`, and how long they may linger.
struct Schedule {
    interval: Duration,
    linger: Duration,
    next_due: Instant,
    next_partition: usize,
}

impl Schedule {
    /// Records for the next request, per partition (round robin), taken as they come due: until a
    /// partition's batch is full, the oldest has lingered long enough, or the run is over. Returns the
    /// counts and when the oldest record was due.
    fn collect(&mut self, budget: &Budget, partitions: usize, per_batch: u64) -> (Vec<u64>, Option<Instant>) {
        let mut counts = vec![0u64; partitions];
        let mut oldest: Option<Instant> = None;
        loop {
            let now = Instant::now();
            while self.next_due <= now {
                if counts[self.next_partition] >= per_batch {
                    return (counts, oldest); // a batch is full
                }
                if budget.take(1) == 0 {
                    return (counts, oldest); // the run is over
                }
                counts[self.next_partition] += 1;
                oldest.get_or_insert(self.next_due);
                self.next_partition = (self.next_partition + 1) % partitions;
                self.next_due += self.interval;
            }
            let send_at = oldest.map(|o| o + self.linger);
            if send_at.is_some_and(|at| at <= now) {
                return (counts, oldest);
            }
            if budget.deadline.is_some_and(|d| d <= now) {
                return (counts, oldest);
            }
            let wake = send_at.map_or(self.next_due, |at| at.min(self.next_due));
            std::thread::sleep(wake.saturating_duration_since(now));
        }
    }
}

/// One leader broker, requests of one batch per partition, `in_flight` of them unanswered at most.
fn async_lane(
    plan: Arc<Plan>,
    leader: &str,
    partitions: &[i32],
    in_flight: usize,
    batch_bytes: usize,
    recorder: &Recorder,
) -> Result<Tally> {
    let Connection { mut sender, mut receiver, .. } = Connection::open_secured(leader, &plan.security)?;
    // Each partition's batch within --batch-bytes, and the whole request within MAX_REQUEST_BYTES.
    let batch_bytes = batch_bytes.min(MAX_REQUEST_BYTES / partitions.len().max(1));
    let per_batch = (batch_bytes.saturating_sub(shardlog_storage::batch::HEADER_BYTES)
        / (plan.message_size + RECORD_OVERHEAD_BYTES))
        .max(1) as u64;
    let mut sequences = vec![0u64; partitions.len()];
    // Requests on the wire go to the answer reader in order; a request is sent only with one of the
    // `in_flight` slots, which the reader hands back as each answer arrives.
    let (queue, answers) = std::sync::mpsc::channel::<InFlight>();
    let (free, slots) = std::sync::mpsc::sync_channel::<()>(in_flight);
    for _ in 0..in_flight {
        free.send(()).expect("room for every slot");
    }
    let (version, acks) = (plan.version, plan.acks);
    let recorder_for_reader = recorder.clone();
    let plan_for_reader = plan.clone();
    let reader = std::thread::spawn(move || -> Result<Tally> {
        let mut tally = Tally::default();
        let mut again = Redelivery { plan: &plan_for_reader, client: None };
        while let Ok(request) = answers.recv() {
            let (_, response) = receiver.receive(ApiKey::Produce, version)?;
            let _ = free.send(());
            for (partition, error, base_offset) in outcomes(response)? {
                let Some(sent) = request.batches.get(&partition) else { continue };
                let outcome = match error {
                    0 => Ok(base_offset),
                    error => again.send(partition, &sent.batch, error, request.sent_at, sent.count, &mut tally)?,
                };
                match outcome {
                    Ok(base_offset) => {
                        tally.messages += sent.count;
                        tally.bytes += sent.bytes;
                        tally.record_latency(request.sent_at.elapsed(), sent.count);
                        record(&recorder_for_reader, partition, base_offset, &sent.hashes)?;
                    }
                    Err(error) => *tally.errors.entry(error).or_default() += sent.count,
                }
            }
        }
        Ok(tally)
    });
    let mut sent = Tally::default();
    let mut schedule = plan.pacing.map(|(rate, linger)| Schedule {
        interval: Duration::from_secs_f64(1.0 / rate),
        linger,
        next_due: Instant::now(),
        next_partition: 0,
    });
    'requests: loop {
        let mut batches = Vec::new();
        let mut in_request = BTreeMap::new();
        let (counts, oldest) = match &mut schedule {
            Some(schedule) => schedule.collect(&plan.budget, partitions.len(), per_batch),
            None => (partitions.iter().map(|_| plan.budget.take(per_batch)).collect(), None),
        };
        for (slot, &partition) in partitions.iter().enumerate() {
            let n = counts[slot];
            if n == 0 {
                continue;
            }
            let values: Vec<Bytes> = (0..n)
                .map(|i| {
                    let origin = Origin { run: plan.run, partition: partition as u32, sequence: sequences[slot] + i };
                    payload::value(origin, plan.message_size)
                })
                .collect();
            let first_sequence = sequences[slot];
            sequences[slot] += n;
            let hashes =
                if recorder.is_some() { values.iter().map(|v| payload::hash(v)).collect() } else { Vec::new() };
            let bytes = values.iter().map(|v| v.len() as u64).sum();
            let batch = payload::batch(&values, now_ms(), plan.compression, plan.idempotent(first_sequence))?;
            batches.push((partition, batch.clone()));
            in_request.insert(partition, Sent { count: n, bytes, hashes, batch });
        }
        if batches.is_empty() {
            break 'requests;
        }
        let request = request(&plan, batches);
        if acks == 0 {
            sender.send(ApiKey::Produce, version, &request)?;
            for batch in in_request.values() {
                sent.messages += batch.count;
                sent.bytes += batch.bytes;
            }
            continue;
        }
        // Waits while `in_flight` requests are unanswered.
        if slots.recv().is_err()
            || queue.send(InFlight { sent_at: oldest.unwrap_or_else(Instant::now), batches: in_request }).is_err()
        {
            break 'requests; // the reader failed; its error is reported below
        }
        sender.send(ApiKey::Produce, version, &request)?;
    }
    drop(queue);
    let mut tally = reader.join().map_err(|_| anyhow::anyhow!("the answer reader panicked"))??;
    tally.merge(&sent);
    Ok(tally)
}
