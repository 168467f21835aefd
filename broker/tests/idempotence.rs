//! Idempotent producers against the real binary: InitProducerId, the sequence rules answered with Kafka's
//! error codes, retries stored once (also across kill -9 and restart), and librdkafka with
//! `enable.idempotence=true` through a paused broker (its requests time out and are retried) and a
//! SIGKILL, every record stored exactly once and in order.

mod common;

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kafka_protocol::messages::{ApiKey, InitProducerIdRequest, ProducerId, ResponseKind, TransactionalId};
use kafka_protocol::protocol::StrBytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use shardlog_storage::batch::{BatchHeader, compute_crc};

use common::requests::{batch, create, fetch_all, produce_one};
use common::{Broker, receive, send};

const OUT_OF_ORDER_SEQUENCE_NUMBER: i16 = 45;
const INVALID_PRODUCER_EPOCH: i16 = 47;
const NOT_COORDINATOR: i16 = 16;

/// InitProducerId (v4); returns (error code, producer id, epoch).
fn init_producer_id(s: &mut TcpStream, transactional_id: Option<&str>) -> (i16, i64, i16) {
    let request = InitProducerIdRequest::default()
        .with_transactional_id(transactional_id.map(|t| TransactionalId(StrBytes::from_string(t.to_string()))))
        .with_transaction_timeout_ms(60_000)
        .with_producer_id(ProducerId(-1))
        .with_producer_epoch(-1);
    send(s, ApiKey::InitProducerId, 4, 7, &request);
    let (_, body) = receive(s, ApiKey::InitProducerId, 4);
    let ResponseKind::InitProducerId(r) = body else { panic!("wrong response") };
    (r.error_code, r.producer_id.0, r.producer_epoch)
}

/// A batch of `records` records from producer `id` at `epoch`, first sequence `seq`.
fn idempotent(id: i64, epoch: i16, seq: i32, records: usize) -> Vec<u8> {
    let mut b = batch(seq as u8, records, 1_700_000_000_000);
    b[43..51].copy_from_slice(&id.to_be_bytes());
    b[51..53].copy_from_slice(&epoch.to_be_bytes());
    b[53..57].copy_from_slice(&seq.to_be_bytes());
    let crc = compute_crc(&b);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

/// The base offsets of the batches stored in partition 0 of `topic`.
fn stored_batches(s: &mut TcpStream, topic: &str) -> Vec<i64> {
    let (err, bytes) = fetch_all(s, topic, 0);
    assert_eq!(err, 0);
    let mut bases = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        let h = BatchHeader::parse(&bytes[at..]).unwrap();
        bases.push(h.base_offset);
        at += h.total_bytes();
    }
    bases
}

#[test]
fn init_producer_id_gives_each_producer_its_own_id_and_sends_transactional_ids_to_their_coordinator() {
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in(data.path(), 2, &[]);
    let mut s = broker.connect();
    let (err, first, epoch) = init_producer_id(&mut s, None);
    assert_eq!((err, epoch), (0, 0));
    let ids: Vec<i64> =
        (0..50).map(|_| init_producer_id(&mut s, None)).map(|(e, id, _)| (e == 0).then_some(id).unwrap()).collect();
    let mut unique = ids.clone();
    unique.push(first);
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), 51, "every producer gets an id of its own");
    assert!(unique.iter().all(|id| *id >= 0));
    // A transactional id is its coordinator's business (transactions_wire.rs): before any client has looked
    // for one, this broker coordinates none, as Kafka answers.
    assert_eq!(init_producer_id(&mut s, Some("orders-tx")).0, NOT_COORDINATOR);
    // A restart takes a new block: no id is handed out twice.
    drop(s);
    assert!(broker.terminate().success());
    let broker = Broker::start_in(data.path(), 2, &[]);
    let mut s = broker.connect();
    let (err, after, _) = init_producer_id(&mut s, None);
    assert_eq!(err, 0);
    assert!(!unique.contains(&after), "id {after} handed out again after a restart");
}

#[test]
fn a_resent_batch_is_stored_once_and_gaps_and_stale_epochs_are_refused_also_after_kill_9() {
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in(data.path(), 2, &[]);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "idem", 1, 1, &[]), 0);
    let (_, id, epoch) = init_producer_id(&mut s, None);

    let first = idempotent(id, epoch, 0, 3);
    assert_eq!(produce_one(&mut s, "idem", 0, &first), (0, 0));
    assert_eq!(produce_one(&mut s, "idem", 0, &first), (0, 0), "a retry is answered with the first offset");
    assert_eq!(produce_one(&mut s, "idem", 0, &idempotent(id, epoch, 3, 2)), (0, 3));
    assert_eq!(produce_one(&mut s, "idem", 0, &idempotent(id, epoch, 9, 1)).0, OUT_OF_ORDER_SEQUENCE_NUMBER);
    // The client bumps its epoch after a fatal sequence error: only at sequence 0.
    assert_eq!(produce_one(&mut s, "idem", 0, &idempotent(id, 1, 5, 1)).0, OUT_OF_ORDER_SEQUENCE_NUMBER);
    let bumped = idempotent(id, 1, 0, 2);
    assert_eq!(produce_one(&mut s, "idem", 0, &bumped), (0, 5));
    assert_eq!(produce_one(&mut s, "idem", 0, &idempotent(id, 0, 5, 1)).0, INVALID_PRODUCER_EPOCH);
    // Another producer, unknown to the partition, starts wherever it likes.
    assert_eq!(produce_one(&mut s, "idem", 0, &idempotent(id + 1, 0, 4242, 1)), (0, 7));
    assert_eq!(stored_batches(&mut s, "idem"), vec![0, 3, 5, 7]);

    broker.kill();
    let broker = Broker::start_in(data.path(), 2, &[]);
    let mut s = broker.connect();
    assert_eq!(produce_one(&mut s, "idem", 0, &bumped), (0, 5), "the retry after kill -9 is still a duplicate");
    assert_eq!(produce_one(&mut s, "idem", 0, &idempotent(id, 1, 3, 1)).0, OUT_OF_ORDER_SEQUENCE_NUMBER);
    assert_eq!(produce_one(&mut s, "idem", 0, &idempotent(id, 0, 5, 1)).0, INVALID_PRODUCER_EPOCH);
    assert_eq!(produce_one(&mut s, "idem", 0, &idempotent(id, 1, 2, 1)), (0, 8));
    assert_eq!(stored_batches(&mut s, "idem"), vec![0, 3, 5, 7, 8]);

    // And after a clean stop, from the snapshot written at close.
    assert!(broker.terminate().success());
    let broker = Broker::start_in(data.path(), 2, &[]);
    let mut s = broker.connect();
    assert_eq!(produce_one(&mut s, "idem", 0, &idempotent(id, 1, 2, 1)), (0, 8));
    assert_eq!(produce_one(&mut s, "idem", 0, &idempotent(id + 1, 0, 4243, 1)), (0, 9));
    assert_eq!(stored_batches(&mut s, "idem"), vec![0, 3, 5, 7, 8, 9]);
    assert!(
        data.path()
            .join("idem-0")
            .read_dir()
            .unwrap()
            .any(|e| { e.unwrap().file_name().to_string_lossy().ends_with(".snapshot") })
    );
}

/// Counts delivery reports.
#[derive(Clone, Default)]
struct Deliveries {
    delivered: Arc<AtomicUsize>,
    failed: Arc<AtomicUsize>,
}

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(_) => self.delivered.fetch_add(1, Ordering::SeqCst),
            Err((e, _)) => {
                eprintln!("delivery failed: {e}");
                self.failed.fetch_add(1, Ordering::SeqCst)
            }
        };
    }
}

const PARTITIONS: i32 = 3;

#[test]
fn librdkafka_idempotent_producer_stores_every_record_once_through_a_pause_and_a_kill_9() {
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in_env(data.path(), 2, &[], Some("info,shardlog_broker::shard=debug"));
    let port = broker.port;
    {
        let mut s = broker.connect();
        assert_eq!(create(&mut s, "exactly", PARTITIONS, 1, &[]), 0);
    }
    let bootstrap = format!("127.0.0.1:{port}");
    let deliveries = Deliveries::default();
    let producer: ThreadedProducer<Deliveries> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        // Requests time out while the broker is paused, and are sent again.
        .set("request.timeout.ms", "2000")
        .set("message.timeout.ms", "180000")
        .set("reconnect.backoff.max.ms", "200")
        .set("queue.buffering.max.messages", "20000")
        .create_with_context(deliveries.clone())
        .unwrap();

    // Send as fast as the broker takes them (a short client queue keeps requests in flight all the time)
    // until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let sender = {
        let (producer, stop) = (producer.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut n = 0usize;
            while !stop.load(Ordering::SeqCst) {
                for p in 0..PARTITIONS {
                    let value = format!("{p}:{n:08}:{}", "x".repeat(100));
                    let mut record: BaseRecord<(), String> = BaseRecord::to("exactly").partition(p).payload(&value);
                    while let Err((_, back)) = producer.send(record) {
                        record = back;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                n += 1;
            }
            n
        })
    };
    std::thread::sleep(Duration::from_millis(1500));
    // Paused past the request timeout, then killed with requests in flight: they are sent again, and
    // those the broker had appended are answered from the producer state (after kill -9, as rebuilt).
    broker.signal(libc::SIGSTOP);
    std::thread::sleep(Duration::from_millis(4000));
    broker.signal(libc::SIGCONT);
    std::thread::sleep(Duration::from_millis(1500));
    let retried_before = broker.log().matches("retried batch").count();
    broker.kill();
    let broker = Broker::start_at(data.path(), port, 2, &[], Some("info,shardlog_broker::shard=debug"));
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::SeqCst);
    let per_partition = sender.join().unwrap();
    producer.flush(Duration::from_secs(170)).unwrap();
    assert_eq!(deliveries.failed.load(Ordering::SeqCst), 0, "every record is delivered");
    assert_eq!(deliveries.delivered.load(Ordering::SeqCst), PARTITIONS as usize * per_partition);
    eprintln!(
        "{per_partition} records per partition; retries answered as duplicates: {retried_before} before the kill, {} after",
        broker.log().matches("retried batch").count()
    );

    // The audit: every record exactly once, in order, per partition.
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "unused")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        assignment.add_partition_offset("exactly", p, Offset::Beginning).unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut seen: BTreeMap<i32, Vec<usize>> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.values().map(Vec::len).sum::<usize>() < PARTITIONS as usize * per_partition {
        assert!(
            Instant::now() < deadline,
            "consumed only {:?}",
            seen.iter().map(|(p, v)| (p, v.len())).collect::<Vec<_>>()
        );
        let Some(message) = consumer.poll(Duration::from_millis(500)) else { continue };
        let message = message.unwrap();
        let value = std::str::from_utf8(message.payload().unwrap()).unwrap();
        let mut fields = value.split(':');
        assert_eq!(fields.next().unwrap().parse::<i32>().unwrap(), message.partition());
        seen.entry(message.partition()).or_default().push(fields.next().unwrap().parse().unwrap());
    }
    // Nothing more behind them: no duplicate past the count either.
    assert!(consumer.poll(Duration::from_millis(1500)).is_none(), "more records than were sent");
    for (p, values) in &seen {
        let expected: Vec<usize> = (0..per_partition).collect();
        assert!(values == &expected, "partition {p}: records missing, repeated or out of order");
    }
    drop(broker);
}

#[test]
fn after_shardlog_repair_a_cleanly_stopped_partition_rebuilds_its_producers_from_the_log() {
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in(data.path(), 1, &[]);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "fixed", 1, 1, &[]), 0);
    let (_, id, _) = init_producer_id(&mut s, None);
    let batches: Vec<Vec<u8>> = (0..4).map(|k| idempotent(id, 0, k * 3, 3)).collect();
    for (k, b) in batches.iter().enumerate() {
        assert_eq!(produce_one(&mut s, "fixed", 0, b), (0, k as i64 * 3));
    }
    assert!(broker.terminate().success());
    let repaired = std::process::Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["repair", "--partition", "fixed-0", "--truncate-at", "9"])
        .arg("--data-dir")
        .arg(data.path())
        .output()
        .unwrap();
    assert!(repaired.status.success(), "{}", String::from_utf8_lossy(&repaired.stderr));

    let broker = Broker::start_in(data.path(), 1, &[]);
    let mut s = broker.connect();
    assert_eq!(produce_one(&mut s, "fixed", 0, &batches[2]), (0, 6), "the batch below the cut is still known");
    // New again, at an offset past every one the log held: offsets 9..11 named the cut records, and an
    // offset never names two records.
    assert_eq!(produce_one(&mut s, "fixed", 0, &batches[3]), (0, 12), "the cut batch is new again");
    assert_eq!(stored_batches(&mut s, "fixed"), vec![0, 3, 6, 12]);
    // What repair moved aside is left alone: not taken for a partition of some topic "fixed-0.cut".
    assert!(data.path().join("fixed-0.cut.1").is_dir());
    let alarms: Vec<String> =
        broker.log().lines().filter(|l| l.contains(" WARN ") || l.contains(" ERROR ")).map(String::from).collect();
    assert_eq!(alarms, Vec::<String>::new());
}
