//! librdkafka through the `rdkafka` crate against the real binary: 100,000 records with each compression
//! codec to a 6-partition topic with acks=all, consumed back; every key, value, header and timestamp
//! checked, and per-partition order. Records without a key sent to a compacted topic fail one by one, as
//! librdkafka's own test 0011 expects of Kafka (KIP-467's record errors).

mod common;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{
    BaseProducer, BaseRecord, DefaultProducerContext, DeliveryResult, Producer, ProducerContext, ThreadedProducer,
};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use common::Broker;

const RECORDS: usize = 100_000;
const PARTITIONS: i32 = 6;
const BASE_TS: i64 = 1_700_000_000_000;

fn create_topic(port: u16, topic: &str) {
    create_topic_with(port, topic, PARTITIONS, &[]);
}

fn create_topic_with(port: u16, topic: &str, partitions: i32, configs: &[&str]) {
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["topic", "create", topic, "--partitions", &partitions.to_string(), "--replication-factor", "1"])
        .args(configs.iter().flat_map(|c| ["--config", c]))
        .args(["--bootstrap", &format!("127.0.0.1:{port}")])
        .status()
        .unwrap();
    assert!(status.success());
}

fn round_trip(broker: &Broker, codec: &str) {
    let topic = format!("rd-{codec}");
    create_topic(broker.port, &topic);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("acks", "all")
        .set("compression.codec", codec)
        .set("linger.ms", "5")
        .set("message.timeout.ms", "60000")
        .create()
        .expect("producer");
    for i in 0..RECORDS {
        let key = format!("key-{}", i % 1000);
        let value = format!("value-{i}-{}", "x".repeat(i % 50));
        let headers = OwnedHeaders::new().insert(Header { key: "n", value: Some(&i.to_string()) });
        let mut record =
            BaseRecord::to(&topic).key(&key).payload(&value).headers(headers).timestamp(BASE_TS + i as i64);
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((e, r)) => {
                    assert!(
                        matches!(
                            e,
                            rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull)
                        ),
                        "{e}"
                    );
                    record = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
        }
    }
    producer.flush(Duration::from_secs(120)).expect("every record acknowledged");

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "rdkafka-test")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        assignment.add_partition_offset(&topic, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut seen = vec![false; RECORDS];
    let mut last_offset: BTreeMap<i32, i64> = BTreeMap::new();
    let mut last_for_key: BTreeMap<String, usize> = BTreeMap::new();
    let mut count = 0;
    let deadline = Instant::now() + Duration::from_secs(120);
    while count < RECORDS {
        assert!(Instant::now() < deadline, "{codec}: consumed {count} of {RECORDS} in time");
        let Some(message) = consumer.poll(Duration::from_millis(500)) else { continue };
        let m = message.expect("no consume error");
        let n: usize =
            std::str::from_utf8(m.headers().expect("headers").get(0).value.unwrap()).unwrap().parse().unwrap();
        let key = std::str::from_utf8(m.key().unwrap()).unwrap().to_string();
        assert_eq!(key, format!("key-{}", n % 1000), "{codec}: key of record {n}");
        assert_eq!(m.payload().unwrap(), format!("value-{n}-{}", "x".repeat(n % 50)).as_bytes(), "{codec}: value {n}");
        assert_eq!(m.timestamp().to_millis(), Some(BASE_TS + n as i64), "{codec}: timestamp {n}");
        assert!(!seen[n], "{codec}: record {n} delivered twice");
        seen[n] = true;
        let prev = last_offset.insert(m.partition(), m.offset());
        assert!(
            prev.is_none_or(|p| m.offset() == p + 1),
            "{codec}: partition {} offsets not consecutive",
            m.partition()
        );
        if let Some(prev) = last_for_key.insert(key.clone(), n) {
            assert!(n > prev, "{codec}: {key} out of order");
        }
        count += 1;
    }
    assert!(seen.iter().all(|s| *s));
    assert_eq!(last_offset.len(), PARTITIONS as usize, "{codec}: records spread over every partition");
}

#[test]
fn librdkafka_round_trips_with_every_codec() {
    let broker = Broker::start(2);
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        round_trip(&broker, codec);
    }
}

/// Each record's delivery report, by the number it was sent with: `None` when it was delivered.
#[derive(Default)]
struct Deliveries(Mutex<BTreeMap<usize, Option<RDKafkaErrorCode>>>);

impl ClientContext for Deliveries {}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = Box<usize>;

    fn delivery(&self, result: &DeliveryResult<'_>, n: Box<usize>) {
        let error = match result {
            Ok(_) => None,
            Err((KafkaError::MessageProduction(code), _)) => Some(*code),
            Err((e, _)) => panic!("record {n}: {e}"),
        };
        self.0.lock().unwrap().insert(*n, error);
    }
}

/// 100 records to a compacted topic, every tenth without a key, as librdkafka's test 0011 sends them:
/// what each record's delivery report says, by the number it was sent with.
fn keyless_among_keyed(
    bootstrap: &str,
    topic: &str,
    batch_size: Option<&str>,
) -> BTreeMap<usize, Option<RDKafkaErrorCode>> {
    let mut config = ClientConfig::new();
    // The 100 records leave in one batch unless batch.size says otherwise.
    config.set("bootstrap.servers", bootstrap).set("linger.ms", "200");
    if let Some(bytes) = batch_size {
        config.set("batch.size", bytes);
    }
    let producer: BaseProducer<Deliveries> = config.create_with_context(Deliveries::default()).expect("producer");
    for n in 0..100usize {
        let key = format!("key {n}");
        let value = format!("record {n}");
        let record = BaseRecord::with_opaque_to(topic, Box::new(n)).payload(&value).partition(0);
        let record = if n.is_multiple_of(10) { record } else { record.key(&key) };
        producer.send(record).map_err(|(e, _)| e).expect("queued");
    }
    producer.flush(Duration::from_secs(60)).expect("every record reported");
    let reports = std::mem::take(&mut *producer.context().0.lock().unwrap());
    assert_eq!(reports.len(), 100, "a report for each record");
    reports
}

/// librdkafka's test 0011 (`test_message_single_partition_record_fail`) against this broker: in one batch,
/// the 10 records without a key fail INVALID_RECORD and the 90 others "as part of a batch with invalid
/// records", which librdkafka can only tell from Produce v8's record errors (KIP-467); one record per
/// batch, the 10 fail and the 90 are stored.
#[test]
fn librdkafka_fails_exactly_the_keyless_records_of_a_batch_to_a_compacted_topic() {
    let broker = Broker::start(2);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    create_topic_with(broker.port, "rd-compacted", 1, &["cleanup.policy=compact"]);
    let keyless = |n: &usize| n.is_multiple_of(10);

    let reports = keyless_among_keyed(&bootstrap, "rd-compacted", None);
    for (n, error) in &reports {
        let expected =
            if keyless(n) { RDKafkaErrorCode::InvalidRecord } else { RDKafkaErrorCode::InvalidDifferentRecord };
        assert_eq!(*error, Some(expected), "record {n} in one batch");
    }

    let reports = keyless_among_keyed(&bootstrap, "rd-compacted", Some("1"));
    for (n, error) in &reports {
        let expected = keyless(n).then_some(RDKafkaErrorCode::InvalidRecord);
        assert_eq!(*error, expected, "record {n} alone in its batch");
    }
    let consumer: BaseConsumer = ClientConfig::new().set("bootstrap.servers", &bootstrap).create().unwrap();
    let (low, high) = consumer.fetch_watermarks("rd-compacted", 0, Duration::from_secs(10)).unwrap();
    assert_eq!((low, high), (0, 90), "only the keyed records of the second round are stored");
}
