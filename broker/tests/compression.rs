//! `compression.type`: a topic set to a codec stores every batch in it, recompressing what producers
//! send in another codec, as Kafka does; librdkafka reads every record back.

mod common;

use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};
use shardlog_storage::batch::BatchHeader;

use common::Broker;
use common::requests::{batch, create, fetch_all, produce_one};

const RECORDS: usize = 2_000;

fn produce(bootstrap: &str, topic: &str, codec: &str) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("compression.codec", codec)
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    for i in 0..RECORDS {
        let value = format!("{codec}-{i}-{}", "z".repeat(i % 300));
        producer.send(BaseRecord::<(), _>::to(topic).payload(&value)).expect("queued");
    }
    producer.flush(Duration::from_secs(60)).expect("every record acknowledged");
}

/// The codec of every batch partition 0 stores, in order.
fn stored_codecs(broker: &Broker, topic: &str) -> Vec<u8> {
    let (error, mut records) = fetch_all(&mut broker.connect(), topic, 0);
    assert_eq!(error, 0);
    let mut codecs = Vec::new();
    while let Ok(header) = BatchHeader::parse(&records) {
        if header.total_bytes() > records.len() {
            break;
        }
        codecs.push(header.compression());
        records = records.slice(header.total_bytes()..);
    }
    codecs
}

fn consume_values(bootstrap: &str, topic: &str, count: usize) -> Vec<String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "compression-test")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(topic, 0, Offset::Beginning).unwrap();
    consumer.assign(&assignment).unwrap();
    let mut values = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while values.len() < count {
        assert!(Instant::now() < deadline, "consumed {} of {count}", values.len());
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            values.push(String::from_utf8(m.expect("no consume error").payload().unwrap().to_vec()).unwrap());
        }
    }
    values
}

#[test]
fn a_topic_with_a_codec_stores_every_batch_in_it_and_clients_read_every_record() {
    let broker = Broker::start(2);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    let mut s = broker.connect();
    for (topic, codec) in [("in-zstd", "zstd"), ("in-none", "uncompressed"), ("as-sent", "producer")] {
        assert_eq!(create(&mut s, topic, 1, 1, &[("compression.type", codec)]), 0, "{topic}");
        // Not lz4: librdkafka sends lz4 only to brokers that serve FindCoordinator (consumer groups).
        produce(&bootstrap, topic, "snappy");
        produce(&bootstrap, topic, "gzip");
        produce(&bootstrap, topic, "none");
    }
    // Kafka's codec numbers: 0 none, 1 gzip, 2 snappy, 4 zstd.
    let zstd = stored_codecs(&broker, "in-zstd");
    assert!(!zstd.is_empty() && zstd.iter().all(|c| *c == 4), "{zstd:?}");
    let none = stored_codecs(&broker, "in-none");
    assert!(!none.is_empty() && none.iter().all(|c| *c == 0), "{none:?}");
    let sent = stored_codecs(&broker, "as-sent");
    for codec in [2, 1, 0] {
        assert!(sent.contains(&codec), "producer: stored as sent, {sent:?}");
    }
    let expected: Vec<String> = ["snappy", "gzip", "none"]
        .iter()
        .flat_map(|codec| (0..RECORDS).map(move |i| format!("{codec}-{i}-{}", "z".repeat(i % 300))))
        .collect();
    for topic in ["in-zstd", "in-none", "as-sent"] {
        assert_eq!(consume_values(&bootstrap, topic, expected.len()), expected, "{topic}");
    }
}

#[test]
fn a_damaged_batch_is_refused_not_recompressed_into_a_valid_one() {
    let broker = Broker::start(1);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "in-zstd", 1, 1, &[("compression.type", "zstd")]), 0);
    let mut damaged = batch(7, 3, 0);
    let last = damaged.len() - 1;
    damaged[last] ^= 0x40;
    assert_eq!(produce_one(&mut s, "in-zstd", 0, &damaged), (2, -1), "CORRUPT_MESSAGE");
    assert_eq!(produce_one(&mut s, "in-zstd", 0, &batch(7, 3, 0)), (0, 0), "an intact one is taken");
    assert_eq!(stored_codecs(&broker, "in-zstd"), vec![4]);
}
