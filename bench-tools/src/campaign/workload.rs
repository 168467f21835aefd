//! The fault campaign's workload: the producers, each record tagged with its producer and sequence and
//! sent one per request round robin over the partitions, and the consumer reading every partition up to
//! the high watermark; what they see goes into [`Shared`] for the checker and the report.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use bytes::Bytes;
use kafka_protocol::messages::ApiKey;
use kafka_protocol::records::{Compression, RecordBatchDecoder};
use shardlog_bench::faults::check::{Delivery, Event, Stored, Tag};
use shardlog_broker::client::{ClientSecurity, KafkaClient};

use super::{REQUEST_TIMEOUT, TOPIC, stored};
use crate::faults_chart::Sample;
use crate::payload::{self, Idempotent, Origin};
use crate::produce::{PRODUCE_VERSIONS, init_producer_id, outcomes, produce_request};

/// A plain producer gives a record up after this long (Kafka's `delivery.timeout.ms`).
const DELIVERY_TIMEOUT: Duration = Duration::from_secs(30);
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// What the workload threads share.
pub(crate) struct Shared {
    pub start: Instant,
    pub stop: AtomicBool,
    /// Events with the time they happened since the start.
    pub history: Mutex<Vec<(Duration, Event)>>,
    /// Kafka errors that refused a record for good, by producer and code.
    pub refused: Mutex<BTreeMap<(u32, i16), u64>>,
    /// Retriable errors answered and sent again, by code.
    pub retried: Mutex<BTreeMap<i16, u64>>,
    /// Each acknowledgement: when, and how long since the record was first sent (for the chart).
    pub samples: Mutex<Vec<Sample>>,
    /// Records a producer without retries gave up on an error.
    pub given_up: Mutex<Vec<Tag>>,
    /// How the workload's clients connect.
    pub security: ClientSecurity,
}

impl Shared {
    pub(crate) fn new(security: ClientSecurity) -> Shared {
        Shared {
            start: Instant::now(),
            stop: AtomicBool::new(false),
            history: Mutex::new(Vec::new()),
            refused: Mutex::new(BTreeMap::new()),
            retried: Mutex::new(BTreeMap::new()),
            samples: Mutex::new(Vec::new()),
            given_up: Mutex::new(Vec::new()),
            security,
        }
    }

    fn push(&self, event: Event) {
        let at = self.start.elapsed();
        self.history.lock().expect("history lock").push((at, event));
    }

    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }
}

/// How one producer of the workload sends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ProducerSpec {
    pub id: u32,
    pub delivery: Delivery,
    pub partitions: i32,
    pub value_bytes: usize,
    /// Send again after a retriable error (Kafka's `retries` large) or give the record up (`retries=0`).
    pub retries: bool,
}

/// One producer: one record per request, round robin over the partitions, each record tagged with the
/// producer and its sequence, sent again after a retriable error or a lost connection to whoever leads
/// the partition then (an idempotent producer with the same sequence, until it is acknowledged or the
/// campaign ends; a plain one up to `DELIVERY_TIMEOUT`), unless it does not retry: then a record that
/// fails is given up and counted with its error.
pub(crate) fn produce(shared: &Shared, bootstrap: &str, spec: &ProducerSpec) -> Result<()> {
    let &ProducerSpec { id, delivery, partitions, value_bytes, retries } = spec;
    let mut client = connect(shared, bootstrap)?;
    let acks = if delivery == Delivery::AcksOne { 1 } else { -1 };
    let producer = match delivery {
        Delivery::Idempotent => loop {
            let mut asked = None;
            for addr in bootstrap.split(',') {
                match client.connection(addr).and_then(init_producer_id) {
                    Ok(producer) => {
                        asked = Some(producer);
                        break;
                    }
                    Err(_) => client.forget(addr),
                }
            }
            match asked {
                Some(producer) => break Some(producer),
                None if shared.stopped() => return Ok(()),
                None => std::thread::sleep(RETRY_PAUSE),
            }
        },
        _ => None,
    };
    let mut sequences = vec![0u64; partitions as usize];
    let mut leaders: BTreeMap<i32, String> = BTreeMap::new();
    let mut next = 0u64;
    while !shared.stopped() {
        let partition = (next % partitions as u64) as i32;
        let tag = Tag { producer: id, sequence: next };
        next += 1;
        let origin = Origin { run: u64::from(id), partition: partition as u32, sequence: tag.sequence };
        let value = payload::value(origin, value_bytes);
        let idempotent = producer.map(|(producer_id, epoch)| Idempotent {
            producer_id,
            epoch,
            first_sequence: sequences[partition as usize],
            transactional: false,
        });
        let batch = payload::batch(std::slice::from_ref(&value), now_ms(), Compression::None, idempotent)?;
        let first_sent = Instant::now();
        loop {
            if shared.stopped() {
                break;
            }
            if delivery != Delivery::Idempotent && first_sent.elapsed() > DELIVERY_TIMEOUT {
                // Kafka's delivery.timeout.ms: the record is given up, as on an error.
                shared.given_up.lock().expect("given-up lock").push(tag);
                break;
            }
            match send(&mut client, &mut leaders, partition, &batch, acks) {
                Ok(base_offset) => {
                    sequences[partition as usize] += 1;
                    let checksum = payload::hash(&value);
                    let record = Stored { partition: partition as u32, offset: base_offset as u64, tag, checksum };
                    shared.push(Event::Acked(record));
                    let sample =
                        Sample { at: shared.start.elapsed(), latency: first_sent.elapsed(), acks_all: acks == -1 };
                    shared.samples.lock().expect("samples lock").push(sample);
                    break;
                }
                // Waiting for a leader to send to is not a retry: nothing was sent (Kafka's max.block.ms).
                Err(NO_LEADER_KNOWN) => std::thread::sleep(RETRY_PAUSE),
                Err(code) if retries && retriable(code) => {
                    *shared.retried.lock().expect("retried lock").entry(code).or_default() += 1;
                    std::thread::sleep(RETRY_PAUSE);
                }
                Err(code) => {
                    *shared.refused.lock().expect("refused lock").entry((id, code)).or_default() += 1;
                    shared.given_up.lock().expect("given-up lock").push(tag);
                    // An idempotent producer cannot go on past a refused sequence.
                    if delivery == Delivery::Idempotent {
                        return Ok(());
                    }
                    break;
                }
            }
        }
    }
    Ok(())
}

/// NETWORK_EXCEPTION: the connection failed or gave no answer in time; the request may have arrived.
pub(crate) const NETWORK_EXCEPTION: i16 = 13;
/// Not a Kafka code: no leader of the partition is known right now, so the record was not sent.
const NO_LEADER_KNOWN: i16 = -2;

fn retriable(code: i16) -> bool {
    code == NETWORK_EXCEPTION || kafka_protocol::ResponseError::try_from_code(code).is_some_and(|e| e.is_retriable())
}

/// One attempt: the batch to its partition's leader (looked up again after any failure). Its base
/// offset, or an error code.
fn send(
    client: &mut KafkaClient,
    leaders: &mut BTreeMap<i32, String>,
    partition: i32,
    batch: &Bytes,
    acks: i16,
) -> Result<i64, i16> {
    let leader = match leaders.get(&partition) {
        Some(leader) => leader.clone(),
        None => {
            let Ok(Some(leader)) = client.leader(TOPIC, partition) else { return Err(NO_LEADER_KNOWN) };
            leaders.insert(partition, leader.clone());
            leader
        }
    };
    // The broker gives up waiting for acks=all before the client gives up on its answer.
    let request = produce_request(TOPIC, acks, vec![(partition, batch.clone())])
        .with_timeout_ms((REQUEST_TIMEOUT.as_millis() as i32) * 4 / 5);
    let answer = client.connection(&leader).and_then(|conn| {
        let version = conn.negotiate(ApiKey::Produce, PRODUCE_VERSIONS)?;
        conn.call(ApiKey::Produce, version, &request)
    });
    let code = match answer.and_then(outcomes) {
        Ok(answers) => match answers.iter().find(|(p, _, _)| *p == partition) {
            Some(&(_, 0, base_offset)) => return Ok(base_offset),
            Some(&(_, code, _)) => code,
            None => NETWORK_EXCEPTION,
        },
        Err(_) => {
            client.forget(&leader);
            NETWORK_EXCEPTION
        }
    };
    leaders.remove(&partition);
    Err(code)
}

/// The consumer: reads every partition from its leader, from the start up to the high watermark, and
/// records each answer's high watermark and each record it reads.
pub(crate) fn consume(shared: &Shared, bootstrap: &str, partitions: i32) -> Result<()> {
    const CONSUMER: u32 = 1;
    let mut client = connect(shared, bootstrap)?;
    let mut positions = vec![0i64; partitions as usize];
    let mut leaders: BTreeMap<i32, String> = BTreeMap::new();
    while !shared.stopped() {
        for p in 0..partitions {
            let leader = match leaders.get(&p) {
                Some(leader) => leader.clone(),
                None => match client.leader(TOPIC, p) {
                    Ok(Some(leader)) => {
                        leaders.insert(p, leader.clone());
                        leader
                    }
                    _ => continue,
                },
            };
            let position = positions[p as usize];
            let answer = client.connection(&leader).and_then(|conn| crate::audit::fetch_from(conn, TOPIC, p, position));
            let (high_watermark, mut records) = match answer {
                Ok(Ok(answer)) => answer,
                Ok(Err(_)) => {
                    leaders.remove(&p);
                    continue;
                }
                Err(_) => {
                    client.forget(&leader);
                    leaders.remove(&p);
                    continue;
                }
            };
            let partition = p as u32;
            shared.push(Event::HighWatermark { consumer: CONSUMER, partition, high_watermark: high_watermark as u64 });
            while !records.is_empty() {
                let Ok(set) = RecordBatchDecoder::decode(&mut records) else { break };
                for r in set.records {
                    if r.offset < positions[p as usize] || r.offset >= high_watermark {
                        continue;
                    }
                    let value = r.value.as_deref().unwrap_or_default();
                    shared.push(Event::Read { consumer: CONSUMER, record: stored(partition, r.offset as u64, value) });
                    positions[p as usize] = r.offset + 1;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// A client of the cluster, retried while brokers are down.
fn connect(shared: &Shared, bootstrap: &str) -> Result<KafkaClient> {
    loop {
        match KafkaClient::connect_secured(bootstrap, shared.security.clone()) {
            Ok(mut client) => {
                client.set_read_timeout(REQUEST_TIMEOUT)?;
                return Ok(client);
            }
            Err(_) if !shared.stopped() => std::thread::sleep(RETRY_PAUSE),
            Err(e) => return Err(e),
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}
