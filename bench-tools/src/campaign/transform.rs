//! The campaign's transactional workload (`--workload transactions`): a consume-transform-produce
//! application, as Kafka Streams and Flink's exactly-once sink run one, over real librdkafka clients.
//!
//! Two instances of the application share the consumer group `campaign-transform` on the campaign's
//! topic (the input, which the record workload's producers fill as always). Each reads a batch of input
//! records (read_committed), and in one transaction (its own `transactional.id`) writes one output record
//! per input record to `campaign-out` (the same partition, naming the input's partition, offset and value
//! checksum) and commits the input offsets with `send_offsets_to_transaction` (KIP-447: the group's
//! generation fences an instance that lost the partitions). After an error it aborts and goes back to
//! the group's committed offsets; when the producer is fenced or the abort fails, the instance starts
//! over (a new producer with the same `transactional.id` fences the old one and aborts what it left
//! open). Now and then an instance crashes on purpose halfway through a transaction: its clients are
//! dropped with the transaction open, and it starts over.
//!
//! A read_committed consumer reads every output partition from the start all along. At the end
//! [`Transactional::finish`] lets the application drain the input, waits for every output partition's
//! last stable offset to reach its high watermark, reads the output logs from their leaders (markers
//! included) and lets the reader catch up; `faults::txn_check` judges it all.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerGroupMetadata};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use shardlog_bench::faults::plan::Rng;
use shardlog_bench::faults::replica::log_records;
use shardlog_bench::faults::txn_check::{self, LogRecord, Read, Source, TxnHistory, TxnVerdict, checksum};
use shardlog_broker::client::KafkaClient;

use super::TOPIC;

/// The output topic.
pub(crate) const OUTPUT: &str = "campaign-out";
const GROUP: &str = "campaign-transform";
const INSTANCES: u64 = 2;
/// The most input records one transaction takes.
const BATCH: usize = 50;
/// How long an instance gathers input for one transaction.
const GATHER: Duration = Duration::from_millis(200);
/// One transaction in this many is left open by a crash of its instance.
const CRASH_ONE_IN: u64 = 40;
/// The application's `transaction.timeout.ms`: a transaction its instance left open (a crash the new
/// instance could not yet fence) is aborted by the coordinator after this.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a call of the application (commit, abort, init, committed offsets) may block.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the end waits for the application to drain the input, and then for each further step.
const DRAIN_WAIT: Duration = Duration::from_secs(120);
const SETTLE_WAIT: Duration = Duration::from_secs(60);

/// What the application's threads and the reader share with the campaign.
#[derive(Default)]
struct State {
    stop: AtomicBool,
    stop_reading: AtomicBool,
    reads: Mutex<Vec<Read>>,
    committed: AtomicU64,
    aborted: AtomicU64,
    crashes: AtomicU64,
    restarts: AtomicU64,
    /// Why transactions were aborted or instances started over, by error.
    errors: Mutex<BTreeMap<String, u64>>,
    /// What each instance holds now: the input partitions assigned to it and its position in each.
    holds: Mutex<BTreeMap<u64, String>>,
}

impl State {
    fn count(&self, why: String) {
        *self.errors.lock().expect("errors lock").entry(why).or_default() += 1;
    }
}

/// The running application and its reader.
pub(crate) struct Transactional {
    state: Arc<State>,
    instances: Vec<JoinHandle<()>>,
    reader: JoinHandle<()>,
}

/// What the end found, for the checker and the report.
pub(crate) struct TxnOutcome {
    pub history: TxnHistory,
    /// Input records the application had not committed when the end gave up waiting (0: it drained).
    pub undrained: i64,
    pub committed: u64,
    pub aborted: u64,
    pub crashes: u64,
    pub restarts: u64,
    pub errors: BTreeMap<String, u64>,
}

impl Transactional {
    /// Starts the application's instances and the reader against `bootstrap`; `settings` are the
    /// clients' security settings (librdkafka's names), `seed` decides the crashes.
    pub(crate) fn start(bootstrap: &str, settings: &[(String, String)], partitions: i32, seed: u64) -> Transactional {
        let mut base = ClientConfig::new();
        base.set("bootstrap.servers", bootstrap);
        for (key, value) in settings {
            base.set(key, value);
        }
        let state = Arc::new(State::default());
        let instances = (1..=INSTANCES)
            .map(|instance| {
                let (state, base) = (state.clone(), base.clone());
                std::thread::spawn(move || run(&state, &base, instance, Rng::new(seed ^ (instance << 32))))
            })
            .collect();
        let reader = {
            let (state, base) = (state.clone(), base.clone());
            std::thread::spawn(move || read(&state, &base, partitions))
        };
        Transactional { state, instances, reader }
    }

    /// The end, once the faults have healed and the input's producers stopped: the application drains
    /// the input and stops, every output partition's LSO must reach its high watermark, the output logs
    /// are read from their leaders, and the reader reads all that is committed.
    pub(crate) fn finish(self, admin: &mut KafkaClient, partitions: i32) -> Result<TxnOutcome> {
        let undrained = drain(admin, partitions)?;
        if undrained > 0 {
            let committed = admin.committed_offsets(GROUP).map_or_else(|e| format!("{e:#}"), |c| format!("{c:?}"));
            self.state.count(format!("not drained: the group's committed offsets {committed}"));
            for (instance, holds) in self.state.holds.lock().expect("holds lock").iter() {
                self.state.count(format!("not drained: instance {instance} held {holds}"));
            }
            self.state.count(format!("not drained: stable offsets {}", stable_offsets(admin, partitions)));
            let listed = admin.list_transactions(&[]).map_or_else(
                |e| format!("{e:#}"),
                |txns| txns.iter().map(|t| format!("{}={}", t.transactional_id, t.state)).collect::<Vec<_>>().join(" "),
            );
            self.state.count(format!("not drained: transactions {listed}"));
        }
        self.state.stop.store(true, Ordering::Relaxed);
        for instance in self.instances {
            instance.join().expect("an application thread");
        }
        let bounds = settle(admin, partitions)?;
        let output = output_logs(admin, &bounds)?;
        let mut history = TxnHistory { output, bounds, ..TxnHistory::default() };
        let expected = txn_check::check(&history).committed_records;
        let deadline = Instant::now() + SETTLE_WAIT;
        while distinct(&self.state.reads.lock().expect("reads lock")) < expected && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(200));
        }
        self.state.stop_reading.store(true, Ordering::Relaxed);
        self.reader.join().expect("the reader thread");
        history.reads = std::mem::take(&mut *self.state.reads.lock().expect("reads lock"));
        let state = &self.state;
        Ok(TxnOutcome {
            history,
            undrained,
            committed: state.committed.load(Ordering::Relaxed),
            aborted: state.aborted.load(Ordering::Relaxed),
            crashes: state.crashes.load(Ordering::Relaxed),
            restarts: state.restarts.load(Ordering::Relaxed),
            errors: std::mem::take(&mut *state.errors.lock().expect("errors lock")),
        })
    }
}

/// The group's committed offsets as a read_committed consumer asks for them (OffsetFetch v7 with
/// `require_stable`): each partition's offset or error, to tell why an application waits.
fn stable_offsets(admin: &mut KafkaClient, partitions: i32) -> String {
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    use kafka_protocol::messages::{ApiKey, GroupId, OffsetFetchRequest, ResponseKind, TopicName};
    use kafka_protocol::protocol::StrBytes;
    let mut asked = || -> Result<String> {
        let coordinator = admin.coordinator(GROUP)?;
        let req = OffsetFetchRequest::default()
            .with_group_id(GroupId(StrBytes::from_static_str(GROUP)))
            .with_require_stable(true)
            .with_topics(Some(vec![
                OffsetFetchRequestTopic::default()
                    .with_name(TopicName(StrBytes::from_static_str(TOPIC)))
                    .with_partition_indexes((0..partitions).collect()),
            ]));
        let ResponseKind::OffsetFetch(r) = admin.connection(&coordinator)?.call(ApiKey::OffsetFetch, 7, &req)? else {
            anyhow::bail!("wrong answer to OffsetFetch")
        };
        let parts: Vec<String> = r
            .topics
            .iter()
            .flat_map(|t| &t.partitions)
            .map(|p| format!("{}: {} (error {})", p.partition_index, p.committed_offset, p.error_code))
            .collect();
        Ok(format!("group error {}; {}", r.error_code, parts.join(", ")))
    };
    asked().unwrap_or_else(|e| format!("{e:#}"))
}

fn distinct(reads: &[Read]) -> usize {
    reads.iter().map(|r| (r.partition, r.offset)).collect::<BTreeSet<_>>().len()
}

/// One instance of the application, started over after a crash or an error it cannot recover from.
fn run(state: &State, base: &ClientConfig, instance: u64, mut rng: Rng) {
    while !state.stop.load(Ordering::Relaxed) {
        match serve(state, base, instance, &mut rng) {
            Ok(()) => return,
            Err(Restart::Crash) => {
                state.crashes.fetch_add(1, Ordering::Relaxed);
            }
            Err(Restart::Failed(why)) => {
                state.count(format!("started over: {why}"));
            }
        }
        state.restarts.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Why an instance starts over.
enum Restart {
    /// On purpose, halfway through a transaction.
    Crash,
    Failed(String),
}

fn failed(e: impl std::fmt::Display) -> Restart {
    Restart::Failed(e.to_string())
}

/// The instance's clients, serving until the campaign stops it.
fn serve(state: &State, base: &ClientConfig, instance: u64, rng: &mut Rng) -> Result<(), Restart> {
    let consumer: BaseConsumer = base
        .clone()
        .set("group.id", GROUP)
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "1000")
        .create()
        .map_err(failed)?;
    consumer.subscribe(&[TOPIC]).map_err(failed)?;
    let timeout = TRANSACTION_TIMEOUT.as_millis().to_string();
    // Its delivery reports served on a thread of its own, as an abort or a commit waits for them.
    let producer: ThreadedProducer<DefaultProducerContext> = base
        .clone()
        .set("transactional.id", format!("campaign-transform-{instance}"))
        .set("transaction.timeout.ms", &timeout)
        .set("message.timeout.ms", &timeout)
        .create()
        .map_err(failed)?;
    producer.init_transactions(CALL_TIMEOUT).map_err(failed)?;
    while !state.stop.load(Ordering::Relaxed) {
        // The group's generation as the batch is read: offsets committed under it are refused once a
        // rebalance has moved on (KIP-447), while the generation after a rebalance would let through
        // offsets of records read before it, which the rebalance has already sent to be read again.
        let group = consumer.group_metadata().ok_or_else(|| failed("no group metadata"))?;
        let batch = gather(&consumer)?;
        let holds = consumer.position().map_or_else(
            |e| e.to_string(),
            |list| {
                let held: Vec<String> =
                    list.elements().iter().map(|e| format!("{}@{:?}", e.partition(), e.offset())).collect();
                held.join(" ")
            },
        );
        state.holds.lock().expect("holds lock").insert(instance, holds);
        if batch.is_empty() {
            continue;
        }
        match transact(&producer, &group, &batch, rng) {
            Ok(()) => {
                state.committed.fetch_add(1, Ordering::Relaxed);
            }
            Err(Restart::Crash) => return Err(Restart::Crash),
            Err(Restart::Failed(why)) => {
                state.count(format!("aborted: {why}"));
                producer.abort_transaction(CALL_TIMEOUT).map_err(|e| failed(format!("abort: {e}")))?;
                state.aborted.fetch_add(1, Ordering::Relaxed);
                rewind(&consumer)?;
            }
        }
    }
    Ok(())
}

/// Input records (partition, offset, checksum) read within [`GATHER`], at most [`BATCH`].
fn gather(consumer: &BaseConsumer) -> Result<Vec<(i32, i64, u32)>, Restart> {
    let until = Instant::now() + GATHER;
    let mut batch = Vec::new();
    while batch.len() < BATCH {
        let Some(left) = until.checked_duration_since(Instant::now()) else { break };
        match consumer.poll(left) {
            Some(Ok(m)) => batch.push((m.partition(), m.offset(), checksum(m.payload().unwrap_or_default()))),
            // Errors the consumer reports and gets past by itself (a broker gone, a leader moved).
            Some(Err(KafkaError::MessageConsumption(_))) | None => {}
            Some(Err(e)) => return Err(failed(format!("consume: {e}"))),
        }
    }
    Ok(batch)
}

/// One transaction: the batch's output records, and its input offsets for the group.
fn transact(
    producer: &ThreadedProducer<DefaultProducerContext>,
    group: &ConsumerGroupMetadata,
    batch: &[(i32, i64, u32)],
    rng: &mut Rng,
) -> Result<(), Restart> {
    producer.begin_transaction().map_err(|e| failed(format!("begin: {e}")))?;
    let mut next: BTreeMap<i32, i64> = BTreeMap::new();
    for &(partition, offset, sum) in batch {
        let value = Source { partition: partition as u32, offset: offset as u64, checksum: sum }.encode();
        loop {
            match producer.send(BaseRecord::<(), str>::to(OUTPUT).payload(&value).partition(partition)) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err((e, _)) => return Err(failed(format!("produce: {e}"))),
            }
        }
        next.insert(partition, offset + 1);
    }
    if rng.between(0, CRASH_ONE_IN - 1) == 0 {
        // The records stored (as far as the faults let them be), and then nothing ends the transaction
        // but a new instance or the coordinator's timeout: read_committed readers must never see them.
        let _ = producer.flush(CALL_TIMEOUT);
        return Err(Restart::Crash);
    }
    let mut offsets = TopicPartitionList::new();
    for (&partition, &offset) in &next {
        offsets.add_partition_offset(TOPIC, partition, Offset::Offset(offset)).map_err(failed)?;
    }
    producer
        .send_offsets_to_transaction(&offsets, group, CALL_TIMEOUT)
        .map_err(|e| failed(format!("send offsets: {e}")))?;
    producer.commit_transaction(CALL_TIMEOUT).map_err(|e| failed(format!("commit: {e}")))
}

/// Back to the group's committed offsets for every partition the instance holds, after an abort.
fn rewind(consumer: &BaseConsumer) -> Result<(), Restart> {
    let assigned = consumer.assignment().map_err(failed)?;
    let committed = consumer.committed_offsets(assigned, CALL_TIMEOUT).map_err(|e| failed(format!("rewind: {e}")))?;
    for element in committed.elements() {
        let offset = match element.offset() {
            Offset::Offset(n) => Offset::Offset(n),
            _ => Offset::Beginning,
        };
        consumer
            .seek(element.topic(), element.partition(), offset, CALL_TIMEOUT)
            .map_err(|e| failed(format!("rewind: {e}")))?;
    }
    Ok(())
}

/// The read_committed reader of every output partition, from the start.
fn read(state: &State, base: &ClientConfig, partitions: i32) {
    let consumer: BaseConsumer = match base
        .clone()
        .set("group.id", "campaign-verify")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()
    {
        Ok(consumer) => consumer,
        Err(e) => {
            state.count(format!("reader: {e}"));
            return;
        }
    };
    let mut all = TopicPartitionList::new();
    for p in 0..partitions {
        let _ = all.add_partition_offset(OUTPUT, p, Offset::Beginning);
    }
    if let Err(e) = consumer.assign(&all) {
        state.count(format!("reader: {e}"));
        return;
    }
    while !state.stop_reading.load(Ordering::Relaxed) {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
            let read = Read {
                partition: m.partition() as u32,
                offset: m.offset() as u64,
                checksum: checksum(m.payload().unwrap_or_default()),
            };
            state.reads.lock().expect("reads lock").push(read);
        }
    }
}

/// Waits until the group has committed every input record (its committed offset at each partition's
/// high watermark); the input records it had not when the wait ended.
fn drain(admin: &mut KafkaClient, partitions: i32) -> Result<i64> {
    let deadline = Instant::now() + DRAIN_WAIT;
    loop {
        let ends = admin.offsets(TOPIC, partitions)?;
        let committed = admin.committed_offsets(GROUP).unwrap_or_default();
        let left: i64 = (0..partitions)
            .map(|p| {
                let done = committed.get(&(TOPIC.to_string(), p)).copied().unwrap_or(0);
                (ends[p as usize].1 - done).max(0)
            })
            .sum();
        if left == 0 || Instant::now() > deadline {
            return Ok(left);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Each output partition's (LSO, high watermark), once the LSO has reached the high watermark everywhere
/// or the wait ended.
fn settle(admin: &mut KafkaClient, partitions: i32) -> Result<BTreeMap<u32, (u64, u64)>> {
    let all: Vec<i32> = (0..partitions).collect();
    let deadline = Instant::now() + SETTLE_WAIT;
    loop {
        let stable = admin.last_stable_offsets(OUTPUT, &all)?;
        let ends = admin.offsets(OUTPUT, partitions)?;
        let bounds: BTreeMap<u32, (u64, u64)> = all
            .iter()
            .map(|&p| (p as u32, (stable.get(&p).copied().unwrap_or(0) as u64, ends[p as usize].1 as u64)))
            .collect();
        if bounds.values().all(|(lso, hw)| lso == hw) || Instant::now() > deadline {
            return Ok(bounds);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Every output partition's log up to its high watermark, markers included, read from its leader.
fn output_logs(admin: &mut KafkaClient, bounds: &BTreeMap<u32, (u64, u64)>) -> Result<BTreeMap<u32, Vec<LogRecord>>> {
    let mut logs = BTreeMap::new();
    for (&partition, &(_, high_watermark)) in bounds {
        let p = partition as i32;
        let mut log: Vec<LogRecord> = Vec::new();
        let mut position = 0u64;
        while position < high_watermark {
            let leader = admin.leader(OUTPUT, p)?.with_context(|| format!("no leader of {OUTPUT}-{p}"))?;
            let conn = admin.connection(&leader)?;
            let (_, records) = crate::audit::fetch_from(conn, OUTPUT, p, position as i64)?
                .map_err(|code| anyhow::anyhow!("fetch {OUTPUT}-{p} at {position}: error {code}"))?;
            let read = log_records(records)?;
            let before = position;
            for record in read {
                if record.offset >= position && record.offset < high_watermark {
                    position = record.offset + 1;
                    log.push(record);
                }
            }
            if position == before {
                anyhow::bail!("{OUTPUT}-{p}: nothing read at {position}, below the high watermark {high_watermark}");
            }
        }
        logs.insert(partition, log);
    }
    Ok(logs)
}

/// The report's section on the transactional workload.
pub(crate) fn render(outcome: &TxnOutcome, verdict: &TxnVerdict) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let inputs = outcome.history.inputs.len();
    let _ = writeln!(
        out,
        "\n## Transactions (consume-transform-produce)\n\n{INSTANCES} instances of a librdkafka application read `{TOPIC}` (read_committed, group `{GROUP}`) and write one record per input to `{OUTPUT}` in a transaction with the input offsets; a read_committed consumer reads `{OUTPUT}` throughout.\n"
    );
    let _ = writeln!(
        out,
        "| | count |\n|---|---|\n| input records | {inputs} |\n| transactions committed, per partition (its COMMIT markers) | {} |\n| records committed | {} |\n| transactions aborted, per partition (its ABORT markers) | {} |\n| records aborted | {} |\n| commits the application saw | {} |\n| aborts the application made | {} |\n| crashes mid-transaction (on purpose) | {} |\n| instances started over | {} |\n| records the read_committed consumer read | {} |\n",
        verdict.committed_transactions,
        verdict.committed_records,
        verdict.aborted_transactions,
        verdict.aborted_records,
        outcome.committed,
        outcome.aborted,
        outcome.crashes,
        outcome.restarts,
        outcome.history.reads.len(),
    );
    let _ = writeln!(
        out,
        "- inputs without a committed output: {}\n- inputs with more than one: {}\n- committed outputs naming no input: {}\n- records read under read_committed that are not committed: {}\n- committed records the consumer never read: {}\n- transactions left without a marker: {}\n- partitions whose LSO stayed below the high watermark: {}\n- input records the application had not drained at the end: {}",
        verdict.missing.len(),
        verdict.doubled.len(),
        verdict.foreign.len(),
        verdict.read_uncommitted.len(),
        verdict.unread.len(),
        verdict.open.len(),
        verdict.stuck.len(),
        outcome.undrained,
    );
    for (why, count) in &outcome.errors {
        let _ = writeln!(out, "- {count} × {why}");
    }
    let mut examples: Vec<String> = Vec::new();
    examples.extend(verdict.missing.iter().take(10).map(|m| format!("missing: {m:?}")));
    examples.extend(verdict.doubled.iter().take(10).map(|d| format!("doubled: {d:?}")));
    examples.extend(verdict.foreign.iter().take(10).map(|f| format!("foreign: {f:?}")));
    examples.extend(verdict.read_uncommitted.iter().take(10).map(|r| format!("read uncommitted: {r:?}")));
    examples.extend(verdict.unread.iter().take(10).map(|u| format!("unread: {u:?}")));
    examples.extend(verdict.open.iter().take(10).map(|o| format!("open: {o:?}")));
    examples.extend(verdict.stuck.iter().map(|s| format!("stuck (partition, LSO, HW): {s:?}")));
    if !examples.is_empty() {
        let _ = writeln!(out);
    }
    for example in examples {
        let _ = writeln!(out, "- {example}");
    }
    out
}
