//! What one Fetch answer holds: Kafka's fetch.max.bytes, filled in request order, with the first
//! batch always sent, and no partition starved while the answer has room.

mod common;

use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, FetchRequest, ResponseKind};

use common::requests::{batch, create, name, produce_request};
use common::{Broker, receive, send};

#[test]
fn a_fetch_naming_one_partition_many_times_stays_within_its_limit() {
    let broker = Broker::start(1);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "big", 1, 1, &[]), 0);
    let big: Vec<Vec<u8>> = (0..3).map(|i| batch(i, 1000, 0)).collect(); // ~100 KiB each
    for (i, b) in big.iter().enumerate() {
        send(&mut s, ApiKey::Produce, 9, i as i32, &produce_request("big", 0, b, -1));
        assert_eq!(receive(&mut s, ApiKey::Produce, 9).0, i as i32);
    }
    let limit = big[0].len() * 3 / 2;
    let same_partition: Vec<FetchPartition> = (0..200)
        .map(|_| FetchPartition::default().with_partition(0).with_fetch_offset(0).with_partition_max_bytes(1 << 20))
        .collect();
    let request = FetchRequest::default()
        .with_max_wait_ms(0)
        .with_max_bytes(limit as i32)
        .with_topics(vec![FetchTopic::default().with_topic(name("big")).with_partitions(same_partition)]);
    send(&mut s, ApiKey::Fetch, 11, 9, &request);
    let ResponseKind::Fetch(f) = receive(&mut s, ApiKey::Fetch, 11).1 else { panic!() };
    let sizes: Vec<usize> =
        f.responses[0].partitions.iter().map(|p| p.records.as_ref().map_or(0, |r| r.len())).collect();
    assert_eq!(sizes.len(), 200);
    assert_eq!(sizes[0], big[0].len(), "the first partition gets the first batch");
    assert!(sizes.iter().sum::<usize>() <= limit, "the answer stays within fetch max bytes: {sizes:?}");
}

#[test]
fn a_consumer_with_a_small_fetch_limit_reads_every_partition_to_the_end() {
    let broker = Broker::start(2);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "wide", 12, 1, &[]), 0);
    let one = batch(0, 100, 0); // ~10 KiB
    for p in 0..12 {
        for i in 0..3 {
            send(&mut s, ApiKey::Produce, 9, i, &produce_request("wide", p, &batch(i as u8, 100, 0), -1));
            assert_eq!(receive(&mut s, ApiKey::Produce, 9).0, i);
        }
    }
    // Room for two batches per answer, twelve partitions of three batches: a consumer fetching from its
    // positions must get through all of them. (If later partitions were left empty while the answer had
    // room, it would stall once the first partitions are read.)
    let mut positions = [0i64; 12];
    let mut fetches = 0;
    while positions.iter().any(|&p| p < 300) {
        fetches += 1;
        assert!(fetches <= 100, "no progress: positions {positions:?}");
        let partitions = (0..12)
            .map(|p| {
                FetchPartition::default()
                    .with_partition(p)
                    .with_fetch_offset(positions[p as usize])
                    .with_partition_max_bytes(1 << 20)
            })
            .collect();
        let request = FetchRequest::default()
            .with_max_wait_ms(0)
            .with_max_bytes(2 * one.len() as i32)
            .with_topics(vec![FetchTopic::default().with_topic(name("wide")).with_partitions(partitions)]);
        send(&mut s, ApiKey::Fetch, 11, fetches, &request);
        let ResponseKind::Fetch(f) = receive(&mut s, ApiKey::Fetch, 11).1 else { panic!() };
        let mut answer_bytes = 0;
        for p in &f.responses[0].partitions {
            let records = p.records.clone().unwrap_or_default();
            answer_bytes += records.len();
            // Every batch holds 100 records.
            positions[p.partition_index as usize] += 100 * (records.len() / one.len()) as i64;
        }
        assert!(answer_bytes <= 2 * one.len(), "within fetch max bytes: {answer_bytes}");
    }
}
