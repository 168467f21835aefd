//! librdkafka through the `rdkafka` crate against the real binary: 100,000 records with each compression
//! codec to a 6-partition topic with acks=all, consumed back; every key, value, header and timestamp
//! checked, and per-partition order.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use common::Broker;

const RECORDS: usize = 100_000;
const PARTITIONS: i32 = 6;
const BASE_TS: i64 = 1_700_000_000_000;

fn create_topic(port: u16, topic: &str) {
    let status = std::process::Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["topic", "create", topic, "--partitions", &PARTITIONS.to_string(), "--replication-factor", "1"])
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
