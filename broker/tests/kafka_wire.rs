//! The real `shardlog` binary, started as a process, spoken to over TCP with requests encoded by the
//! `kafka-protocol` crate's client side: what is served, what is refused, and shutdown.

mod common;
#[path = "../../net/tests/support/corpus.rs"]
mod corpus;

use std::io::Write;
use std::net::TcpStream;

use bytes::{BufMut, BytesMut};
use common::requests::{batch, create, fetch_all, fetch_request, keyed_batch, produce_request, stored};
use common::{Broker, assert_closed, receive, send};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
use kafka_protocol::messages::metadata_request::{MetadataRequest, MetadataRequestTopic};
use kafka_protocol::messages::{ApiKey, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;

fn api_versions_v3() -> ApiVersionsRequest {
    ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("wire-test"))
        .with_client_software_version(StrBytes::from_static_str("1"))
}

#[test]
fn api_versions_lists_exactly_what_is_served() {
    let broker = Broker::start(1);
    let mut s = broker.connect();
    send(&mut s, ApiKey::ApiVersions, 3, 11, &api_versions_v3());
    let (correlation_id, body) = receive(&mut s, ApiKey::ApiVersions, 3);
    assert_eq!(correlation_id, 11);
    let ResponseKind::ApiVersions(r) = body else { panic!("wrong response kind") };
    assert_eq!(r.error_code, 0);
    let listed: Vec<_> = r.api_keys.iter().map(|a| (a.api_key, a.min_version, a.max_version)).collect();
    assert_eq!(
        listed,
        vec![
            // Produce up to v11: v12 is transaction.version 2's (KIP-890 part 2).
            (0, 3, 11),
            (1, 4, 12),
            (2, 1, 6),
            (3, 0, 12),
            (8, 2, 9),
            (9, 1, 9),
            (10, 0, 6),
            (11, 0, 9),
            (12, 0, 4),
            (13, 0, 5),
            (14, 0, 5),
            (15, 0, 6),
            (16, 0, 5),
            // SaslHandshake, listed on every listener as Kafka does.
            (17, 0, 1),
            (18, 0, 4),
            (19, 2, 7),
            (20, 1, 6),
            (21, 0, 2),
            (22, 0, 5),
            (23, 2, 4),
            // Transactions (transaction.version 1): AddPartitionsToTxn v0-3 (v4-5 are brokers' calls),
            // AddOffsetsToTxn, EndTxn v0-4, WriteTxnMarkers, TxnOffsetCommit v0-4 (v5 is KIP-890's second
            // part).
            (24, 0, 3),
            (25, 0, 4),
            (26, 0, 4),
            (27, 1, 1),
            (28, 0, 4),
            // DescribeAcls, CreateAcls, DeleteAcls.
            (29, 1, 3),
            (30, 1, 3),
            (31, 1, 3),
            (32, 1, 4),
            (33, 0, 2),
            // SaslAuthenticate.
            (36, 0, 2),
            (37, 0, 3),
            (42, 0, 2),
            (43, 0, 2),
            (44, 0, 1),
            (45, 0, 1),
            (46, 0, 0),
            (47, 0, 0),
            // Describe/AlterClientQuotas and Describe/AlterUserScramCredentials.
            (48, 0, 1),
            (49, 0, 1),
            (50, 0, 0),
            (51, 0, 0),
            (60, 0, 2),
            // DescribeProducers, DescribeTransactions, ListTransactions.
            (61, 0, 0),
            (65, 0, 0),
            (66, 0, 1),
            // KIP-848's ConsumerGroupHeartbeat and ConsumerGroupDescribe.
            (68, 0, 1),
            (69, 0, 1)
        ]
    );
}

#[test]
fn metadata_names_this_broker_and_refuses_unknown_topics() {
    let broker = Broker::start_with(1, &["--set", "auto.create.topics.enable=false"]);
    let mut s = broker.connect();
    let req = MetadataRequest::default().with_topics(Some(vec![
        MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_static_str("orders")))),
    ]));
    for (i, version) in [1i16, 9, 12].into_iter().enumerate() {
        send(&mut s, ApiKey::Metadata, version, i as i32, &req);
        let (correlation_id, body) = receive(&mut s, ApiKey::Metadata, version);
        assert_eq!(correlation_id, i as i32, "responses come back in request order");
        let ResponseKind::Metadata(m) = body else { panic!("wrong response kind") };
        assert_eq!(m.brokers.len(), 1);
        assert_eq!(
            (m.brokers[0].node_id.0, m.brokers[0].host.as_str(), m.brokers[0].port),
            (1, "127.0.0.1", broker.port as i32)
        );
        assert_eq!(m.topics.len(), 1);
        assert_eq!(m.topics[0].error_code, 3, "UNKNOWN_TOPIC_OR_PARTITION");
    }
}

#[test]
fn metadata_v0_empty_list_means_every_topic_and_v12_finds_topics_by_id() {
    let broker = Broker::start(1);
    let mut s = broker.connect();
    for name in ["a", "b"] {
        assert_eq!(create(&mut s, name, 2, 1, &[]), 0);
    }
    // v0 has no null list: an empty one asks for every topic. From v1 on, an empty list asks for none.
    let empty = MetadataRequest::default().with_topics(Some(Vec::new()));
    for (version, expected) in [(0i16, vec!["a", "b"]), (1, vec![])] {
        send(&mut s, ApiKey::Metadata, version, 1, &empty);
        let ResponseKind::Metadata(m) = receive(&mut s, ApiKey::Metadata, version).1 else { panic!() };
        let mut names: Vec<_> = m.topics.iter().map(|t| t.name.as_ref().unwrap().0.to_string()).collect();
        names.sort();
        assert_eq!(names, expected, "Metadata v{version} with an empty list");
    }
    // All topics at v12, to learn an id; then ask for it, and for an id nobody has.
    send(&mut s, ApiKey::Metadata, 12, 2, &MetadataRequest::default().with_topics(None));
    let ResponseKind::Metadata(all) = receive(&mut s, ApiKey::Metadata, 12).1 else { panic!() };
    let b = all.topics.iter().find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == "b")).unwrap();
    assert!(!b.topic_id.is_nil());
    let unknown = uuid::Uuid::from_u128(42);
    let by_id = MetadataRequest::default().with_topics(Some(vec![
        MetadataRequestTopic::default().with_name(None).with_topic_id(b.topic_id),
        MetadataRequestTopic::default().with_name(None).with_topic_id(unknown),
    ]));
    send(&mut s, ApiKey::Metadata, 12, 3, &by_id);
    let ResponseKind::Metadata(m) = receive(&mut s, ApiKey::Metadata, 12).1 else { panic!() };
    assert_eq!(m.topics.len(), 2);
    assert_eq!((m.topics[0].name.as_ref().unwrap().0.as_str(), m.topics[0].error_code), ("b", 0));
    assert_eq!(m.topics[0].partitions.len(), 2);
    assert_eq!((m.topics[1].topic_id, m.topics[1].error_code), (unknown, 100), "UNKNOWN_TOPIC_ID");
}

/// KIP-467: a compacted topic refuses a batch with records without a key whole (INVALID_RECORD), and from
/// Produce v8 the answer names each of those records by its index in the batch, with a reason, and says
/// what happened in its error message, so that a client can tell the records at fault from the others.
/// Before v8 the answer has no room for them: the error code alone.
#[test]
fn a_compacted_topic_refuses_a_batch_with_keyless_records_and_names_each_of_them() {
    let broker = Broker::start(1);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "keyed", 1, 1, &[("cleanup.policy", "compact")]), 0);
    // 100 records; every tenth (0, 10, ..., 90) without a key.
    let keys: Vec<Option<String>> = (0..100).map(|i| (i % 10 != 0).then(|| format!("key {i}"))).collect();
    let mixed = keyed_batch(&keys);
    let invalid_record = ResponseError::InvalidRecord.code();
    for (correlation_id, version) in [(1, 7i16), (2, 8), (3, 9), (4, 11)] {
        send(&mut s, ApiKey::Produce, version, correlation_id, &produce_request("keyed", 0, &mixed, -1));
        let ResponseKind::Produce(r) = receive(&mut s, ApiKey::Produce, version).1 else { panic!("wrong response") };
        let p = &r.responses[0].partition_responses[0];
        assert_eq!((p.error_code, p.base_offset), (invalid_record, -1), "v{version}: the whole batch is refused");
        if version < 8 {
            assert!(p.record_errors.is_empty() && p.error_message.is_none(), "v{version} has no room for them");
            continue;
        }
        let named: Vec<i32> = p.record_errors.iter().map(|e| e.batch_index).collect();
        assert_eq!(named, (0..100).step_by(10).collect::<Vec<_>>(), "v{version}: each keyless record, in order");
        for e in &p.record_errors {
            let why = e.batch_index_error_message.as_deref().unwrap_or_default();
            assert!(why.contains("without a key") && why.contains("keyed-0"), "v{version}: {why}");
        }
        let message = p.error_message.as_deref().unwrap_or_default();
        assert!(message.starts_with("10 of the batch's 100 records refused"), "v{version}: {message}");
    }
    assert_eq!(fetch_all(&mut s, "keyed", 0), (0, bytes::Bytes::new()), "nothing of the refused batches stored");

    // Every record keyed: taken, with no record errors.
    let keys: Vec<Option<String>> = (0..100).map(|i| Some(format!("key {i}"))).collect();
    send(&mut s, ApiKey::Produce, 9, 5, &produce_request("keyed", 0, &keyed_batch(&keys), -1));
    let ResponseKind::Produce(r) = receive(&mut s, ApiKey::Produce, 9).1 else { panic!("wrong response") };
    let p = &r.responses[0].partition_responses[0];
    assert_eq!((p.error_code, p.base_offset, p.record_errors.len(), p.error_message.is_none()), (0, 0, 0, true));
}

#[test]
fn unknown_api_versions_version_is_answered_then_the_client_retries() {
    let broker = Broker::start(1);
    let mut s = broker.connect();
    let mut frame = BytesMut::new();
    frame.put_i32(8);
    frame.put_i16(ApiKey::ApiVersions as i16);
    frame.put_i16(42);
    frame.put_i32(5);
    s.write_all(&frame).unwrap();
    let (correlation_id, body) = receive(&mut s, ApiKey::ApiVersions, 0);
    assert_eq!(correlation_id, 5);
    let ResponseKind::ApiVersions(r) = body else { panic!() };
    assert_eq!(r.error_code, 35, "UNSUPPORTED_VERSION");
    // Same connection, a version from the list.
    send(&mut s, ApiKey::ApiVersions, 3, 6, &api_versions_v3());
    assert_eq!(receive(&mut s, ApiKey::ApiVersions, 3).0, 6);
}

/// The fuzz target's corpus of malformed frames.
fn malformed_frames() -> Vec<(String, Vec<u8>)> {
    corpus::malformed_frames(&std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../net"))
}

#[test]
fn each_malformed_frame_closes_only_its_connection_is_logged_once_and_changes_no_log() {
    let broker = Broker::start(2);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "events", 1, 1, &[]), 0);
    send(&mut s, ApiKey::Produce, 9, 1, &produce_request("events", 0, &batch(1, 2, 0), -1));
    assert_eq!(receive(&mut s, ApiKey::Produce, 9).0, 1);

    let corpus = malformed_frames();
    assert!(corpus.len() >= 15, "the corpus is there");
    for (name, bytes) in &corpus {
        let mut bad = broker.connect();
        bad.write_all(bytes).unwrap();
        // End of stream: a frame that was never completed is closed too.
        bad.shutdown(std::net::Shutdown::Write).unwrap();
        assert_closed(&mut bad);
        // The broker is still there for everyone else.
        send(&mut s, ApiKey::ApiVersions, 3, 2, &api_versions_v3());
        assert_eq!(receive(&mut s, ApiKey::ApiVersions, 3).0, 2, "after {name}");
    }
    // One line per bad connection; past the log's burst limit per call site, a count of the lines not
    // logged (within a few seconds of the window's end).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let log = broker.log();
        let closings = log.lines().filter(|l| l.contains("closing connection")).count();
        let dropped: usize = log
            .lines()
            .filter(|l| l.contains("were not logged") && l.contains("runtime/connection.rs"))
            .map(|l| l.split("dropped=").nth(1).and_then(|v| v.split(' ').next()).unwrap().parse::<usize>().unwrap())
            .sum();
        assert!(closings + dropped <= corpus.len(), "at most one log line per bad connection:\n{log}");
        if closings + dropped == corpus.len() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "every bad connection is logged or counted:\n{log}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }

    send(&mut s, ApiKey::Fetch, 11, 3, &fetch_request("events", 0, 0, 0));
    let (_, body) = receive(&mut s, ApiKey::Fetch, 11);
    let ResponseKind::Fetch(r) = body else { panic!("wrong response") };
    let p = &r.responses[0].partitions[0];
    assert_eq!(p.high_watermark, 2, "no log changed");
    assert_eq!(p.records.as_deref(), Some(&stored(&batch(1, 2, 0), 0)[..]));
}

#[test]
fn more_shards_than_cores_serve_many_connections() {
    let broker = Broker::start(4);
    let mut streams: Vec<TcpStream> = (0..32).map(|_| broker.connect()).collect();
    for (i, s) in streams.iter_mut().enumerate() {
        send(s, ApiKey::ApiVersions, 3, i as i32, &api_versions_v3());
    }
    for (i, s) in streams.iter_mut().enumerate() {
        assert_eq!(receive(s, ApiKey::ApiVersions, 3).0, i as i32);
    }
}

#[test]
fn sigterm_stops_the_broker_with_exit_code_zero() {
    let broker = Broker::start(2);
    let mut idle = broker.connect();
    send(&mut idle, ApiKey::ApiVersions, 3, 1, &api_versions_v3());
    receive(&mut idle, ApiKey::ApiVersions, 3);
    let status = broker.terminate();
    assert!(status.success(), "exit status {status:?}");
}
