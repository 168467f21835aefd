//! `shardlog-bench produce --transactional`: a transactional producer (KIP-98), as Kafka's clients are.
//!
//! InitProducerId with the transactional id at its coordinator gives the producer id and epoch. Then,
//! one transaction after another, each of `--txn-records` records spread round robin over the topic's
//! partitions:
//! 1. AddPartitionsToTxn, once, for the partitions the transaction will write (all new to it). After a
//!    commit the coordinator answers CONCURRENT_TRANSACTIONS until the last transaction's markers are
//!    written; it is asked again after [`CONCURRENT_RETRY_BACKOFF`], and the time counts in its latency.
//! 2. The produce requests, transactional batches (attribute bit 0x10) with the producer id, epoch and
//!    per-partition sequences of an idempotent producer, up to `--in-flight` unanswered per leader.
//! 3. EndTxn(commit) once every batch is acknowledged; its answer means the commit is durable (the
//!    markers follow).
//!
//! One producer, one thread: a transaction is a sequence, so a transactional producer's throughput is
//! bounded by its transactions' round trips, which is what this measures. A batch refused for good aborts
//! the transaction (EndTxn(abort)) and ends the run with an error.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use hdrhistogram::Histogram;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, ApiKey, EndTxnRequest, FindCoordinatorRequest, InitProducerIdRequest, ProducerId,
    ResponseKind, TopicName, TransactionalId,
};
use kafka_protocol::protocol::StrBytes;
use shardlog_broker::client::{Connection, KafkaClient, TopicLayout, check};

use super::{InFlight, Plan, Recorder, Redelivery, Sent, now_ms, outcomes, record, request};
use crate::payload::{self, Origin};
use crate::stats::Tally;

/// The pause before asking again a coordinator that answered CONCURRENT_TRANSACTIONS (the last commit's
/// markers are still being written) or that is loading. Kafka's Java producer waits 20 ms for an
/// AddPartitionsToTxn refused so; a short pause measures the broker rather than the client's backoff.
const CONCURRENT_RETRY_BACKOFF: Duration = Duration::from_millis(1);
/// How long a coordinator may keep answering retriable errors before the run gives up.
const COORDINATOR_RETRY_FOR: Duration = Duration::from_secs(30);
/// `transaction.timeout.ms` the producer asks for (Kafka's default).
const TRANSACTION_TIMEOUT_MS: i32 = 60_000;

/// What the transactions measured, beside the records' [`Tally`].
#[derive(Debug, Clone)]
pub struct TxnTally {
    pub transactions: u64,
    pub records_per_transaction: u64,
    /// Microseconds from sending EndTxn(commit) to its answer.
    pub end_txn_us: Histogram<u64>,
    /// Microseconds from sending AddPartitionsToTxn to its success, retries included.
    pub add_partitions_us: Histogram<u64>,
    /// AddPartitionsToTxn answered CONCURRENT_TRANSACTIONS (asked again).
    pub add_partitions_retries: u64,
}

impl TxnTally {
    fn new(records_per_transaction: u64) -> TxnTally {
        let histogram = || Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds");
        TxnTally {
            transactions: 0,
            records_per_transaction,
            end_txn_us: histogram(),
            add_partitions_us: histogram(),
            add_partitions_retries: 0,
        }
    }

    /// The lines `produce` prints after the records' figures.
    pub fn report(&self, elapsed: Duration) -> String {
        let ms = |h: &Histogram<u64>, q: f64| h.value_at_quantile(q) as f64 / 1000.0;
        let line = |label: &str, h: &Histogram<u64>| {
            format!(
                "{label} (ms): p50 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}\n",
                ms(h, 0.5),
                ms(h, 0.99),
                ms(h, 0.999),
                h.max() as f64 / 1000.0
            )
        };
        let mut out = format!(
            "{} transactions of up to {} records committed: {:.1} transactions/s\n",
            self.transactions,
            self.records_per_transaction,
            self.transactions as f64 / elapsed.as_secs_f64().max(1e-9)
        );
        if !self.end_txn_us.is_empty() {
            out.push_str(&line("EndTxn(commit), send to answer", &self.end_txn_us));
            out.push_str(&line("AddPartitionsToTxn, send to success", &self.add_partitions_us));
        }
        out.push_str(&format!(
            "AddPartitionsToTxn asked again after CONCURRENT_TRANSACTIONS (markers of the last commit still \
             being written): {}\n",
            self.add_partitions_retries
        ));
        out
    }
}

/// The transactional producer: its id, its coordinator's connection, producer id and epoch.
pub(super) struct Producer {
    pub id: String,
    coordinator: Connection,
    pub producer: (i64, i16),
}

fn retriable_at_coordinator(code: i16) -> bool {
    [
        ResponseError::CoordinatorNotAvailable,
        ResponseError::CoordinatorLoadInProgress,
        ResponseError::NotCoordinator,
        ResponseError::ConcurrentTransactions,
    ]
    .iter()
    .any(|e| e.code() == code)
}

/// Asks `ask` again while it answers a coordinator's retriable error (counted in `retries`), for up to
/// [`COORDINATOR_RETRY_FOR`]; returns the last answer's error code and value.
fn until_settled<T>(what: &str, retries: &mut u64, mut ask: impl FnMut() -> Result<(i16, T)>) -> Result<(i16, T)> {
    let deadline = Instant::now() + COORDINATOR_RETRY_FOR;
    loop {
        let (code, answer) = ask()?;
        if !retriable_at_coordinator(code) {
            return Ok((code, answer));
        }
        if Instant::now() >= deadline {
            check(code, &format!("{what}, still after {COORDINATOR_RETRY_FOR:?}"))?;
        }
        *retries += 1;
        std::thread::sleep(CONCURRENT_RETRY_BACKOFF);
    }
}

fn txn_id(id: &str) -> TransactionalId {
    TransactionalId(StrBytes::from_string(id.to_string()))
}

impl Producer {
    /// FindCoordinator (key type 1, a transactional id), then InitProducerId with the id at the coordinator.
    pub fn init(admin: &mut KafkaClient, id: &str) -> Result<Producer> {
        let mut ignored = 0;
        let (_, address) = until_settled("find the transaction coordinator", &mut ignored, || {
            let request =
                FindCoordinatorRequest::default().with_key_type(1).with_key(StrBytes::from_string(id.to_string()));
            let ResponseKind::FindCoordinator(r) = admin.call_any(ApiKey::FindCoordinator, 3, &request)? else {
                bail!("not a FindCoordinator answer")
            };
            Ok((r.error_code, format!("{}:{}", r.host.as_str(), r.port)))
        })
        .and_then(|(code, address)| check(code, "FindCoordinator for a transactional id").map(|()| (code, address)))?;
        let mut coordinator = Connection::open_secured(&address, admin.security())
            .with_context(|| format!("connect to the transaction coordinator {address}"))?;
        let version = coordinator.negotiate(ApiKey::InitProducerId, (0, 4))?;
        let (code, producer) = until_settled("InitProducerId", &mut ignored, || {
            let request = InitProducerIdRequest::default()
                .with_transactional_id(Some(txn_id(id)))
                .with_transaction_timeout_ms(TRANSACTION_TIMEOUT_MS)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1);
            let ResponseKind::InitProducerId(r) = coordinator.call(ApiKey::InitProducerId, version, &request)? else {
                bail!("not an InitProducerId answer")
            };
            Ok((r.error_code, (r.producer_id.0, r.producer_epoch)))
        })?;
        check(code, &format!("InitProducerId for transactional id {id}"))?;
        Ok(Producer { id: id.to_string(), coordinator, producer })
    }

    /// AddPartitionsToTxn v3 for `partitions` of `topic`; retried while the coordinator answers
    /// CONCURRENT_TRANSACTIONS.
    fn add_partitions(&mut self, topic: &str, partitions: &BTreeSet<i32>, tally: &mut TxnTally) -> Result<()> {
        let started = Instant::now();
        let (id, (producer_id, epoch)) = (self.id.clone(), self.producer);
        let coordinator = &mut self.coordinator;
        let (code, ()) = until_settled("AddPartitionsToTxn", &mut tally.add_partitions_retries, || {
            let request = AddPartitionsToTxnRequest::default()
                .with_v3_and_below_transactional_id(txn_id(&id))
                .with_v3_and_below_producer_id(ProducerId(producer_id))
                .with_v3_and_below_producer_epoch(epoch)
                .with_v3_and_below_topics(vec![
                    AddPartitionsToTxnTopic::default()
                        .with_name(TopicName(StrBytes::from_string(topic.to_string())))
                        .with_partitions(partitions.iter().copied().collect()),
                ]);
            let ResponseKind::AddPartitionsToTxn(r) = coordinator.call(ApiKey::AddPartitionsToTxn, 3, &request)? else {
                bail!("not an AddPartitionsToTxn answer")
            };
            // The first error of any partition (they fail together).
            let code = r
                .results_by_topic_v3_and_below
                .iter()
                .flat_map(|t| &t.results_by_partition)
                .map(|p| p.partition_error_code)
                .find(|&c| c != 0)
                .unwrap_or(r.error_code);
            Ok((code, ()))
        })?;
        check(code, &format!("AddPartitionsToTxn of {} partitions of {topic}", partitions.len()))?;
        record_us(&mut tally.add_partitions_us, started.elapsed());
        Ok(())
    }

    /// EndTxn; returns how long its answer took.
    fn end(&mut self, commit: bool) -> Result<Duration> {
        let started = Instant::now();
        let version = self.coordinator.negotiate(ApiKey::EndTxn, (0, 3))?;
        let (id, (producer_id, epoch)) = (self.id.clone(), self.producer);
        let coordinator = &mut self.coordinator;
        let mut ignored = 0;
        let (code, ()) = until_settled("EndTxn", &mut ignored, || {
            let request = EndTxnRequest::default()
                .with_transactional_id(txn_id(&id))
                .with_producer_id(ProducerId(producer_id))
                .with_producer_epoch(epoch)
                .with_committed(commit);
            let ResponseKind::EndTxn(r) = coordinator.call(ApiKey::EndTxn, version, &request)? else {
                bail!("not an EndTxn answer")
            };
            Ok((r.error_code, ()))
        })?;
        check(code, if commit { "EndTxn(commit)" } else { "EndTxn(abort)" })?;
        Ok(started.elapsed())
    }
}

fn record_us(histogram: &mut Histogram<u64>, latency: Duration) {
    let us = (latency.as_micros() as u64).clamp(1, histogram.high());
    histogram.record(us).expect("value within bounds");
}

/// A leader's connection and the requests of the current transaction still to send or to be answered.
struct Leader {
    connection: Connection,
    to_send: VecDeque<(kafka_protocol::messages::ProduceRequest, InFlight)>,
    on_the_wire: VecDeque<InFlight>,
}

/// Runs transactions until the budget is spent; returns the records' tally and the transactions'.
pub(super) fn lane(
    plan: &Plan,
    layout: &TopicLayout,
    mut producer: Producer,
    txn_records: u64,
    in_flight: usize,
    batch_bytes: usize,
    recorder: &Recorder,
) -> Result<(Tally, TxnTally)> {
    let by_leader = layout.by_leader();
    let partitions: Vec<i32> = layout.leaders.keys().copied().collect();
    let most_per_leader = by_leader.values().map(Vec::len).max().unwrap_or(1);
    let batch_bytes = batch_bytes.min(super::MAX_REQUEST_BYTES / most_per_leader);
    let per_batch = (batch_bytes.saturating_sub(shardlog_storage::batch::HEADER_BYTES)
        / (plan.message_size + super::RECORD_OVERHEAD_BYTES))
        .max(1) as u64;
    let mut leaders: BTreeMap<String, Leader> = BTreeMap::new();
    for address in by_leader.keys() {
        let connection = Connection::open_secured(address, &plan.security)?;
        leaders.insert(address.clone(), Leader { connection, to_send: VecDeque::new(), on_the_wire: VecDeque::new() });
    }
    let mut sequences: BTreeMap<i32, u64> = partitions.iter().map(|&p| (p, 0)).collect();
    let mut tally = Tally::default();
    let mut txns = TxnTally::new(txn_records);
    let mut again = Redelivery { plan, client: None };
    let mut next_partition = 0usize;
    let started = Instant::now();
    let mut records_started = 0u64;
    loop {
        // Under --rate, a transaction starts when its first record is due.
        if let Some((rate, _)) = plan.pacing {
            let due = started + Duration::from_secs_f64(records_started as f64 / rate);
            std::thread::sleep(due.saturating_duration_since(Instant::now()));
        }
        let n = plan.budget.take(txn_records);
        if n == 0 {
            break;
        }
        records_started += n;
        // Round robin from where the last transaction stopped, so small transactions visit every partition.
        let mut counts: BTreeMap<i32, u64> = BTreeMap::new();
        for i in 0..n {
            *counts.entry(partitions[(next_partition + i as usize) % partitions.len()]).or_default() += 1;
        }
        next_partition = (next_partition + n as usize) % partitions.len();
        let added: BTreeSet<i32> = counts.keys().copied().collect();
        producer.add_partitions(&plan.topic, &added, &mut txns)?;
        // The transaction's requests: per leader, one batch per partition of up to `per_batch` records.
        let mut committed: Vec<(i32, i64, Vec<u32>)> = Vec::new();
        for (address, led) in &by_leader {
            let leader = leaders.get_mut(address).expect("a connection per leader");
            loop {
                let mut batches = Vec::new();
                let mut in_request = BTreeMap::new();
                for partition in led {
                    let Some(left) = counts.get_mut(partition).filter(|left| **left > 0) else { continue };
                    let take = (*left).min(per_batch);
                    *left -= take;
                    let sequence = sequences.get_mut(partition).expect("a sequence per partition");
                    let values: Vec<Bytes> = (0..take)
                        .map(|i| {
                            let origin =
                                Origin { run: plan.run, partition: *partition as u32, sequence: *sequence + i };
                            payload::value(origin, plan.message_size)
                        })
                        .collect();
                    let batch = payload::batch(&values, now_ms(), plan.compression, plan.idempotent(*sequence))?;
                    *sequence += take;
                    let hashes =
                        if recorder.is_some() { values.iter().map(|v| payload::hash(v)).collect() } else { Vec::new() };
                    let bytes = values.iter().map(|v| v.len() as u64).sum();
                    batches.push((*partition, batch.clone()));
                    in_request.insert(*partition, Sent { count: take, bytes, hashes, batch });
                }
                if batches.is_empty() {
                    break;
                }
                let sent = InFlight { sent_at: Instant::now(), batches: in_request };
                leader.to_send.push_back((request(plan, batches), sent));
            }
        }
        // Send them, up to `in_flight` unanswered per leader, and read the answers in order.
        let mut refused: Option<String> = None;
        while leaders.values().any(|l| !l.to_send.is_empty() || !l.on_the_wire.is_empty()) {
            for leader in leaders.values_mut() {
                while leader.on_the_wire.len() < in_flight
                    && let Some((request, mut sent)) = leader.to_send.pop_front()
                {
                    sent.sent_at = Instant::now();
                    leader.connection.sender.send(ApiKey::Produce, plan.version, &request)?;
                    leader.on_the_wire.push_back(sent);
                }
            }
            for leader in leaders.values_mut() {
                let Some(sent) = leader.on_the_wire.pop_front() else { continue };
                let (_, response) = leader.connection.receiver.receive(ApiKey::Produce, plan.version)?;
                for (partition, error, base_offset) in outcomes(response)? {
                    let Some(batch) = sent.batches.get(&partition) else { continue };
                    let outcome = match error {
                        0 => Ok(base_offset),
                        error => again.send(partition, &batch.batch, error, sent.sent_at, batch.count, &mut tally)?,
                    };
                    match outcome {
                        Ok(base_offset) => {
                            tally.messages += batch.count;
                            tally.bytes += batch.bytes;
                            tally.record_latency(sent.sent_at.elapsed(), batch.count);
                            committed.push((partition, base_offset, batch.hashes.clone()));
                        }
                        Err(error) => {
                            *tally.errors.entry(error).or_default() += batch.count;
                            let name = shardlog_broker::metrics::error_name(error);
                            refused.get_or_insert(format!("partition {partition} refused a batch: {name}"));
                        }
                    }
                }
            }
        }
        if let Some(refused) = refused {
            producer.end(false).context("abort the transaction after a refused batch")?;
            bail!("{refused}; the transaction was aborted");
        }
        record_us(&mut txns.end_txn_us, producer.end(true)?);
        txns.transactions += 1;
        for (partition, base_offset, hashes) in committed {
            record(recorder, partition, base_offset, &hashes)?;
        }
    }
    Ok((tally, txns))
}
