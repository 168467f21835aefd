//! SIGTERM under load: every request a shard has taken in is answered without error before any shard
//! closes its logs, and every acknowledged record is there after the restart.

mod common;

use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kafka_protocol::messages::{ApiKey, ResponseKind};

use shardlog_net::kafka::decode_response;
use shardlog_storage::batch::BatchHeader;

use common::requests::{batch, create, fetch_request, produce_request, stored};
use common::{Broker, receive, send, try_send};

const PARTITIONS: i32 = 8;

/// Pipelines produce requests (acks=all) round-robin over the partitions until told to stop or the
/// connection closes; returns every answer as (partition, error code, base offset, batch sent).
fn produce_stream(port: u16, stop: Arc<AtomicBool>, seed: u8) -> Vec<(i32, i16, i64, Vec<u8>)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut sent = std::collections::VecDeque::new();
    let mut answers = Vec::new();
    let mut i = 0i32;
    loop {
        // Keep a few requests in flight.
        while sent.len() < 4 && !stop.load(Ordering::SeqCst) {
            let partition = i % PARTITIONS;
            let b = batch(seed.wrapping_add(i as u8), 2, 1_700_000_000_000 + i as i64);
            if try_send(&mut s, ApiKey::Produce, 9, i, &produce_request("orders", partition, &b, -1)).is_err() {
                break;
            }
            sent.push_back((i, partition, b));
            i += 1;
        }
        let Some((correlation_id, partition, b)) = sent.pop_front() else { return answers };
        let mut size = [0u8; 4];
        // The broker closes the connection once it has answered what it took in.
        if std::io::Read::read_exact(&mut s, &mut size).is_err() {
            return answers;
        }
        let mut frame = vec![0u8; i32::from_be_bytes(size) as usize];
        if std::io::Read::read_exact(&mut s, &mut frame).is_err() {
            return answers;
        }
        let (answered, body) = decode_response(bytes::Bytes::from(frame), ApiKey::Produce, 9).unwrap();
        assert_eq!(answered, correlation_id, "answers in request order");
        let ResponseKind::Produce(r) = body else { panic!("wrong response") };
        let p = &r.responses[0].partition_responses[0];
        answers.push((partition, p.error_code, p.base_offset, b));
    }
}

#[test]
fn sigterm_under_load_answers_every_request_taken_in_and_keeps_every_acknowledged_record() {
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in(data.path(), 4, &[]);
    assert_eq!(create(&mut broker.connect(), "orders", PARTITIONS, 1, &[]), 0);
    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..6u8)
        .map(|n| {
            let (port, stop) = (broker.port, stop.clone());
            std::thread::spawn(move || produce_stream(port, stop, n * 40))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    let status = broker.terminate();
    stop.store(true, Ordering::SeqCst);
    assert!(status.success(), "exit status {status:?}");
    let answers: Vec<_> = producers.into_iter().flat_map(|p| p.join().unwrap()).collect();
    assert!(answers.len() > 50, "the producers got going: {} answers", answers.len());
    for (partition, error, _, _) in &answers {
        assert_eq!(*error, 0, "partition {partition}: a request taken in was refused during shutdown");
    }

    let broker = Broker::start_in(data.path(), 4, &[]);
    let mut s = broker.connect();
    for partition in 0..PARTITIONS {
        let stored_batches = read_partition(&mut s, partition);
        for (_, _, base, b) in answers.iter().filter(|(p, ..)| *p == partition) {
            assert_eq!(
                stored_batches.get(base),
                Some(&stored(b, *base)),
                "partition {partition}: acknowledged batch at {base} is not there after restart"
            );
        }
    }
}

/// Every batch of a partition, by base offset.
fn read_partition(s: &mut TcpStream, partition: i32) -> std::collections::HashMap<i64, Vec<u8>> {
    let mut batches = std::collections::HashMap::new();
    let mut next = 0i64;
    loop {
        send(s, ApiKey::Fetch, 11, 1, &fetch_request("orders", partition, next, 0));
        let ResponseKind::Fetch(r) = receive(s, ApiKey::Fetch, 11).1 else { panic!() };
        let p = &r.responses[0].partitions[0];
        let records = p.records.clone().unwrap_or_default();
        let mut pos = 0;
        while pos < records.len() {
            let header = BatchHeader::parse(&records[pos..]).unwrap();
            batches.insert(header.base_offset, records[pos..pos + header.total_bytes()].to_vec());
            next = header.base_offset + header.last_offset_delta as i64 + 1;
            pos += header.total_bytes();
        }
        if next >= p.high_watermark {
            return batches;
        }
    }
}

#[test]
fn sigterm_answers_a_long_poll_at_once_instead_of_cutting_it_off() {
    let broker = Broker::start(2);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "quiet", 1, 1, &[]), 0);
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    // Waits up to 40 s for data that never comes: longer than the broker's 10 s drain limit.
    send(&mut s, ApiKey::Fetch, 11, 7, &fetch_request("quiet", 0, 0, 40_000));
    std::thread::sleep(Duration::from_millis(300));
    let status = broker.terminate();
    assert!(status.success(), "exit status {status:?}");
    let (correlation_id, body) = receive(&mut s, ApiKey::Fetch, 11);
    assert_eq!(correlation_id, 7, "the long poll was answered before the broker stopped");
    let ResponseKind::Fetch(r) = body else { panic!("wrong response") };
    let p = &r.responses[0].partitions[0];
    assert_eq!((p.error_code, p.high_watermark), (0, 0));
}
