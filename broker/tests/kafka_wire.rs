//! The real `shardlog` binary, started as a process, spoken to over TCP with requests encoded by the
//! `kafka-protocol` crate's client side: what is served, what is refused, and shutdown.

mod common;

use std::io::Write;
use std::net::TcpStream;

use bytes::{BufMut, BytesMut};
use common::{Broker, assert_closed, receive, send};
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
            (0, 3, 12),
            (1, 4, 12),
            (2, 1, 6),
            (3, 0, 12),
            (18, 0, 4),
            (19, 2, 7),
            (20, 1, 6),
            (21, 0, 2),
            (23, 2, 4),
            (32, 1, 4),
            (33, 0, 2),
            (37, 0, 3),
            (44, 0, 1),
            (60, 0, 2)
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

#[test]
fn bad_input_closes_only_that_connection() {
    let broker = Broker::start(2);
    let bad: [&[u8]; 5] = [
        b"\x00\x00\x00\x0cGARBAGE!GARB",                             // unknown API key
        b"\xff\xff\xff\xff",                                         // negative length
        b"\x7f\xff\xff\xff",                                         // 2 GiB frame
        b"\x00\x00\x00\x02\x00\x12",                                 // too short for a header
        b"\x00\x00\x00\x0a\x00\x00\x00\x02\x00\x00\x00\x01\x00\x00", // Produce v2, not served
    ];
    for bytes in bad {
        let mut s = broker.connect();
        s.write_all(bytes).unwrap();
        assert_closed(&mut s);
        // The broker is still there for everyone else.
        let mut ok = broker.connect();
        send(&mut ok, ApiKey::ApiVersions, 3, 1, &api_versions_v3());
        assert_eq!(receive(&mut ok, ApiKey::ApiVersions, 3).0, 1);
    }
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
