//! Pipelined requests on one connection: served at once, answered in request order, and a partition's
//! appends kept in the order the client sent them.

mod common;

use std::io::Write;

use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ResponseKind};

use common::requests::{batch, create, fetch_request, produce_request, stored};
use common::{Broker, assert_closed, receive, send};

#[test]
fn pipelined_produces_append_in_request_order_across_segment_rolls() {
    let broker = Broker::start(2);
    let mut s = broker.connect();
    // Segments of about three batches, so many appends wait for a roll while later ones queue behind them.
    assert_eq!(create(&mut s, "orders", 3, 1, &[("segment.bytes", "1200")]), 0);
    let requests = 300;
    let mut sent = Vec::new();
    for i in 0..requests {
        let partition = i % 3;
        let b = batch(i as u8, 3, 1_700_000_000_000 + i as i64);
        send(&mut s, ApiKey::Produce, 9, i, &produce_request("orders", partition, &b, -1));
        sent.push((partition, b));
    }
    let mut expected = vec![Vec::new(); 3];
    let mut next_offset = [0i64; 3];
    for (i, (partition, b)) in sent.iter().enumerate() {
        let (correlation_id, body) = receive(&mut s, ApiKey::Produce, 9);
        assert_eq!(correlation_id, i as i32, "answers come in request order");
        let ResponseKind::Produce(r) = body else { panic!("wrong response") };
        let p = &r.responses[0].partition_responses[0];
        let slot = *partition as usize;
        assert_eq!((p.error_code, p.base_offset), (0, next_offset[slot]), "request {i} appended in order");
        next_offset[slot] += 3;
        expected[slot].extend_from_slice(&stored(b, p.base_offset));
    }
    // Every batch has the same size, so the offset to fetch next follows from the bytes read so far.
    let batch_bytes = sent[0].1.len();
    for (partition, expected) in expected.iter().enumerate() {
        let mut read = Vec::new();
        while read.len() < expected.len() {
            let offset = 3 * (read.len() / batch_bytes) as i64;
            send(&mut s, ApiKey::Fetch, 11, 1, &fetch_request("orders", partition as i32, offset, 0));
            let (_, body) = receive(&mut s, ApiKey::Fetch, 11);
            let ResponseKind::Fetch(r) = body else { panic!("wrong response") };
            let records = r.responses[0].partitions[0].records.clone().unwrap_or_default();
            assert!(!records.is_empty(), "partition {partition} ends early at offset {offset}");
            read.extend_from_slice(&records);
        }
        assert_eq!(&read, expected, "partition {partition} reads back in request order");
    }
}

#[test]
fn a_long_poll_does_not_hold_up_the_requests_pipelined_behind_it() {
    let broker = Broker::start(1);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "events", 1, 1, &[]), 0);
    // The fetch waits up to 20 s for data that only the produce behind it brings. Served one at a time,
    // the fetch would come back empty (after the test's read timeout); served at once, it carries the data.
    send(&mut s, ApiKey::Fetch, 11, 1, &fetch_request("events", 0, 0, 20_000));
    let b = batch(7, 2, 1_700_000_000_000);
    send(&mut s, ApiKey::Produce, 9, 2, &produce_request("events", 0, &b, -1));

    let (correlation_id, body) = receive(&mut s, ApiKey::Fetch, 11);
    assert_eq!(correlation_id, 1, "the fetch, asked first, is answered first");
    let ResponseKind::Fetch(r) = body else { panic!("wrong response") };
    let p = &r.responses[0].partitions[0];
    assert_eq!((p.error_code, p.high_watermark), (0, 2));
    assert_eq!(p.records.as_deref(), Some(&stored(&b, 0)[..]), "the fetch carries the produce sent after it");

    let (correlation_id, body) = receive(&mut s, ApiKey::Produce, 9);
    assert_eq!(correlation_id, 2);
    let ResponseKind::Produce(r) = body else { panic!("wrong response") };
    assert_eq!(r.responses[0].partition_responses[0].base_offset, 0);
}

#[test]
fn requests_before_a_bad_frame_are_answered_then_the_connection_closes() {
    let broker = Broker::start(1);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "events", 1, 1, &[]), 0);
    send(&mut s, ApiKey::Produce, 9, 1, &produce_request("events", 0, &batch(1, 1, 0), -1));
    send(&mut s, ApiKey::ApiVersions, 3, 2, &ApiVersionsRequest::default());
    // API key 999 does not exist: Kafka closes the connection without an answer.
    let mut unknown = Vec::new();
    unknown.extend_from_slice(&8i32.to_be_bytes());
    unknown.extend_from_slice(&999i16.to_be_bytes());
    unknown.extend_from_slice(&0i16.to_be_bytes());
    unknown.extend_from_slice(&3i32.to_be_bytes());
    s.write_all(&unknown).unwrap();
    // Sent after the bad frame: never served. It is larger than one read of the broker's, so part of it is
    // still unread when the broker closes; that must not reset the connection (a reset discards the
    // answers the client has not read yet).
    send(&mut s, ApiKey::Produce, 9, 4, &produce_request("events", 0, &batch(2, 1000, 0), -1));
    std::thread::sleep(std::time::Duration::from_millis(200));

    assert_eq!(receive(&mut s, ApiKey::Produce, 9).0, 1);
    assert_eq!(receive(&mut s, ApiKey::ApiVersions, 3).0, 2);
    assert_closed(&mut s);

    let mut s = broker.connect();
    send(&mut s, ApiKey::Fetch, 11, 5, &fetch_request("events", 0, 0, 0));
    let (_, body) = receive(&mut s, ApiKey::Fetch, 11);
    let ResponseKind::Fetch(r) = body else { panic!("wrong response") };
    assert_eq!(r.responses[0].partitions[0].high_watermark, 1, "the produce after the bad frame was not served");
}

#[test]
fn requests_that_change_offsets_are_not_overtaken_by_produces_pipelined_behind_them() {
    use kafka_protocol::messages::DeleteRecordsRequest;
    use kafka_protocol::messages::delete_records_request::{DeleteRecordsPartition, DeleteRecordsTopic};
    let broker = Broker::start(2);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "events", 1, 1, &[]), 0);
    // Produce A, delete everything below the high watermark, produce B: all in one go.
    let (a, b) = (batch(1, 2, 0), batch(2, 3, 0));
    send(&mut s, ApiKey::Produce, 9, 1, &produce_request("events", 0, &a, -1));
    let delete = DeleteRecordsRequest::default().with_timeout_ms(5000).with_topics(vec![
        DeleteRecordsTopic::default()
            .with_name(common::requests::name("events"))
            .with_partitions(vec![DeleteRecordsPartition::default().with_partition_index(0).with_offset(-1)]),
    ]);
    send(&mut s, ApiKey::DeleteRecords, 2, 2, &delete);
    send(&mut s, ApiKey::Produce, 9, 3, &produce_request("events", 0, &b, -1));
    assert_eq!(receive(&mut s, ApiKey::Produce, 9).0, 1);
    let ResponseKind::DeleteRecords(d) = receive(&mut s, ApiKey::DeleteRecords, 2).1 else { panic!() };
    let deleted = &d.topics[0].partitions[0];
    assert_eq!((deleted.error_code, deleted.low_watermark), (0, 2), "only A was below the high watermark");
    let ResponseKind::Produce(p) = receive(&mut s, ApiKey::Produce, 9).1 else { panic!() };
    assert_eq!(p.responses[0].partition_responses[0].base_offset, 2);
    send(&mut s, ApiKey::Fetch, 11, 4, &fetch_request("events", 0, 2, 0));
    let ResponseKind::Fetch(f) = receive(&mut s, ApiKey::Fetch, 11).1 else { panic!() };
    let p = &f.responses[0].partitions[0];
    assert_eq!((p.log_start_offset, p.high_watermark), (2, 5));
    assert_eq!(p.records.as_deref(), Some(&stored(&b, 2)[..]), "B, produced after the deletion, is there");
}
