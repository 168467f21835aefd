//! The Kafka codec against requests and responses built by the `kafka-protocol` crate's own client-side
//! encoders, and against malformed frames.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_request::ApiVersionsRequest;
use kafka_protocol::messages::api_versions_response::ApiVersionsResponse;
use kafka_protocol::messages::metadata_request::MetadataRequest;
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use shardlog_net::kafka::{FrameReader, RequestError, SupportedApis, decode_request, encode_response};

fn apis() -> SupportedApis {
    SupportedApis::new(&[(ApiKey::ApiVersions, 0, 4), (ApiKey::Metadata, 0, 12)])
}

/// A size-prefixed request frame as a client would send it.
fn request_frame<T: Encodable>(api_key: ApiKey, version: i16, correlation_id: i32, body: &T) -> BytesMut {
    let header = RequestHeader::default()
        .with_request_api_key(api_key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("codec-test")));
    let mut out = BytesMut::new();
    out.put_i32(0);
    header.encode(&mut out, api_key.request_header_version(version)).unwrap();
    body.encode(&mut out, version).unwrap();
    let size = (out.len() - 4) as i32;
    out[..4].copy_from_slice(&size.to_be_bytes());
    out
}

fn one_frame(bytes: &[u8]) -> Bytes {
    let mut reader = FrameReader::new(100 << 20);
    reader.extend(bytes);
    reader.next_frame().unwrap().expect("a whole frame")
}

fn decode_response(mut frame: Bytes, api_key: ApiKey, version: i16) -> (i32, ResponseKind) {
    let size = frame.get_i32();
    assert_eq!(size as usize, frame.len());
    let header = ResponseHeader::decode(&mut frame, api_key.response_header_version(version)).unwrap();
    let body = ResponseKind::decode(api_key, &mut frame, version).unwrap();
    assert!(frame.is_empty(), "response has trailing bytes");
    (header.correlation_id, body)
}

#[test]
fn api_versions_round_trip_at_every_supported_version() {
    for version in 0..=4 {
        let mut req = ApiVersionsRequest::default();
        if version >= 3 {
            req.client_software_name = StrBytes::from_static_str("librdkafka");
            req.client_software_version = StrBytes::from_static_str("2.12.1");
        }
        let frame = one_frame(&request_frame(ApiKey::ApiVersions, version, 42, &req));
        let decoded = decode_request(frame, &apis()).expect("decodes");
        assert_eq!(
            (decoded.api_key, decoded.version, decoded.header.correlation_id),
            (ApiKey::ApiVersions, version, 42)
        );
        assert_eq!(decoded.body, RequestKind::ApiVersions(req));

        let answer = apis().api_versions_response(0);
        let bytes =
            encode_response(42, ApiKey::ApiVersions, version, &ResponseKind::ApiVersions(answer.clone())).unwrap();
        let (correlation_id, body) = decode_response(bytes.to_bytes(), ApiKey::ApiVersions, version);
        assert_eq!(correlation_id, 42);
        let ResponseKind::ApiVersions(got) = body else { panic!("not an ApiVersions response") };
        let listed: Vec<_> = got.api_keys.iter().map(|a| (a.api_key, a.min_version, a.max_version)).collect();
        assert_eq!(listed, vec![(3, 0, 12), (18, 0, 4)]);
    }
}

#[test]
fn unsupported_api_versions_version_gets_a_v0_answer_listing_what_is_supported() {
    // A client newer than the broker asks with a version we do not have (KIP-511); the body may be in a
    // format we cannot read, so only the first 8 bytes matter.
    let mut frame = BytesMut::new();
    frame.put_i16(ApiKey::ApiVersions as i16);
    frame.put_i16(99);
    frame.put_i32(7);
    frame.put_slice(b"\x00\x0cfuture-stuff");
    let err = decode_request(frame.freeze(), &apis()).unwrap_err();
    assert_eq!(err, RequestError::UnsupportedVersion { api_key: ApiKey::ApiVersions, version: 99, correlation_id: 7 });
    let answer = err.response(&apis()).expect("ApiVersions always gets an answer");
    let (correlation_id, body) = decode_response(answer.to_bytes(), ApiKey::ApiVersions, 0);
    assert_eq!(correlation_id, 7);
    let ResponseKind::ApiVersions(ApiVersionsResponse { error_code, api_keys, .. }) = body else { panic!() };
    assert_eq!(error_code, 35, "UNSUPPORTED_VERSION");
    assert_eq!(api_keys.len(), 2);
}

#[test]
fn other_unsupported_requests_close_the_connection() {
    let produce_v2 = request_frame(ApiKey::Metadata, 13, 1, &MetadataRequest::default());
    // Metadata 13 is beyond our table (0..=12): refused, and no answer is encoded.
    let err = decode_request(one_frame(&produce_v2), &apis()).unwrap_err();
    assert!(matches!(err, RequestError::UnsupportedVersion { api_key: ApiKey::Metadata, version: 13, .. }));
    assert!(err.response(&apis()).is_none());

    let mut unknown = BytesMut::new();
    unknown.put_i16(9999);
    unknown.put_i16(0);
    unknown.put_i32(5);
    let err = decode_request(unknown.freeze(), &apis()).unwrap_err();
    assert_eq!(err, RequestError::UnknownApi { api_key: 9999, correlation_id: 5 });
    assert!(err.response(&apis()).is_none());

    let err = decode_request(Bytes::from_static(b"\x00\x12\x00"), &apis()).unwrap_err();
    assert_eq!(err, RequestError::TooShort { len: 3 });
}

#[test]
fn truncated_and_corrupted_bodies_are_errors_not_panics() {
    let req = ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("kcat"))
        .with_client_software_version(StrBytes::from_static_str("1.7.1"));
    let whole = one_frame(&request_frame(ApiKey::ApiVersions, 3, 9, &req));
    // Every truncation of a valid request is refused with a typed error.
    for cut in 8..whole.len() {
        let result = decode_request(whole.slice(..cut), &apis());
        assert!(
            matches!(result, Err(RequestError::BadHeader { .. } | RequestError::BadBody { .. })),
            "cut at {cut}: {result:?}"
        );
    }
    // A compact string whose length runs past the frame.
    let mut bad = BytesMut::from(&whole[..]);
    // The v3 body is: compact "kcat" (length byte 5), compact "1.7.1" (6), no tagged fields: 12 bytes.
    let name_len_at = whole.len() - 12;
    assert_eq!(bad[name_len_at], 5);
    bad[name_len_at] = 0x7f;
    assert!(matches!(decode_request(bad.freeze(), &apis()), Err(RequestError::BadBody { .. })));
}

#[test]
fn a_fetch_answer_sends_large_record_sets_from_their_own_memory_and_decodes_as_one_frame() {
    use kafka_protocol::messages::TopicName;
    use kafka_protocol::messages::fetch_response::{FetchResponse, FetchableTopicResponse, PartitionData};
    use shardlog_net::kafka::pieces::SHARED_MIN_BYTES;
    use uuid::Uuid;

    let large = Bytes::from((0..3 * SHARED_MIN_BYTES).map(|i| i as u8).collect::<Vec<_>>());
    let small = Bytes::from(vec![9u8; 100]);
    let partition = |index: i32, records: &Bytes| {
        PartitionData::default().with_partition_index(index).with_high_watermark(77).with_records(Some(records.clone()))
    };
    for version in [4, 11, 12, 16] {
        // Topics travel by name before v13 and by id from it.
        let topic = FetchableTopicResponse::default();
        let topic = match version {
            ..13 => topic.with_topic(TopicName(StrBytes::from_static_str("t"))),
            _ => topic.with_topic_id(Uuid::from_u128(0x5eed)),
        };
        let topic =
            topic.with_partitions(vec![partition(0, &large), partition(1, &small), partition(2, &large.slice(5..))]);
        let answer = FetchResponse::default().with_responses(vec![topic]);
        let frame = encode_response(7, ApiKey::Fetch, version, &ResponseKind::Fetch(answer.clone())).unwrap();

        let shared: Vec<&Bytes> = frame.pieces().iter().filter(|p| p.len() >= SHARED_MIN_BYTES).collect();
        assert_eq!(shared.len(), 2, "v{version}: each large record set is a piece of its own");
        assert_eq!(shared[0].as_ptr(), large.as_ptr(), "v{version}: the first is the read's memory, not a copy");
        assert_eq!(shared[1].as_ptr(), large[5..].as_ptr(), "v{version}: so is the second");
        assert_eq!(frame.len(), frame.pieces().iter().map(Bytes::len).sum::<usize>());

        let (correlation_id, body) = decode_response(frame.to_bytes(), ApiKey::Fetch, version);
        assert_eq!(correlation_id, 7);
        // (Compared without printing: the record sets are large.)
        assert!(body == ResponseKind::Fetch(answer), "v{version}: the pieces in order are the whole answer");
    }
}
