//! Request decoding and response encoding.
//!
//! A request frame is `api key (i16) | api version (i16) | correlation id (i32) | rest of the header |
//! body`. The first 8 bytes are read by hand, so an unknown API key or version is known (with its
//! correlation id) before the crate is asked to decode anything at a version it does not have.
//!
//! How Kafka answers what it cannot serve, and so how we do:
//! - ApiVersions at a version it does not support: an ApiVersions v0 answer with UNSUPPORTED_VERSION and
//!   the supported ranges (KIP-511), so the client can pick a version and retry;
//! - any other API or version it does not support, or a request that does not decode: the connection is
//!   closed (the client cannot read an answer at a version nobody agreed on).
//!
//! Known limit: `kafka-protocol` 0.18 sizes decoded arrays from their length prefix before reading them
//! (upstream pull requests #152/#161/#200 are open), so a request declaring a huge array asks the
//! allocator for gigabytes. A process that decodes untrusted requests must use
//! [`crate::alloc::ReservingAllocator`], which turns such a claim into an untouched address-space
//! reservation instead of an abort.

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, FetchResponse, RequestHeader, RequestKind, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable};

use super::pieces::{PieceBuf, ResponseFrame};
use super::versions::SupportedApis;

/// A request ready for a handler.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedRequest {
    pub api_key: ApiKey,
    pub version: i16,
    pub header: RequestHeader,
    pub body: RequestKind,
}

/// Why a frame is not a request the broker serves.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    #[error("frame of {len} bytes is too short for a request header")]
    TooShort { len: usize },
    #[error("unknown API key {api_key} (correlation id {correlation_id})")]
    UnknownApi { api_key: i16, correlation_id: i32 },
    #[error("{api_key:?} v{version} is not supported (correlation id {correlation_id})")]
    UnsupportedVersion { api_key: ApiKey, version: i16, correlation_id: i32 },
    #[error("{api_key:?} v{version} request header does not decode: {reason}")]
    BadHeader { api_key: ApiKey, version: i16, reason: String },
    #[error("{api_key:?} v{version} request body does not decode (correlation id {correlation_id}): {reason}")]
    BadBody { api_key: ApiKey, version: i16, correlation_id: i32, reason: String },
}

impl RequestError {
    /// The frame to send before closing, if Kafka would answer at all: only an ApiVersions request at an
    /// unsupported version gets one. `None` means close the connection without an answer.
    pub fn response(&self, apis: &SupportedApis) -> Option<ResponseFrame> {
        match *self {
            RequestError::UnsupportedVersion { api_key: ApiKey::ApiVersions, correlation_id, .. } => {
                let body = apis.api_versions_response(kafka_protocol::ResponseError::UnsupportedVersion.code());
                Some(
                    encode_response(correlation_id, ApiKey::ApiVersions, 0, &ResponseKind::ApiVersions(body))
                        .expect("an ApiVersions v0 answer always encodes"),
                )
            }
            _ => None,
        }
    }
}

/// Decodes one request frame (without its size prefix).
pub fn decode_request(frame: Bytes, apis: &SupportedApis) -> Result<DecodedRequest, RequestError> {
    if frame.len() < 8 {
        return Err(RequestError::TooShort { len: frame.len() });
    }
    let raw_key = i16::from_be_bytes([frame[0], frame[1]]);
    let version = i16::from_be_bytes([frame[2], frame[3]]);
    let correlation_id = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
    let api_key =
        ApiKey::try_from(raw_key).map_err(|()| RequestError::UnknownApi { api_key: raw_key, correlation_id })?;
    if !apis.range(api_key).is_some_and(|r| r.contains(version)) {
        return Err(RequestError::UnsupportedVersion { api_key, version, correlation_id });
    }
    let mut buf = frame;
    let header = RequestHeader::decode(&mut buf, api_key.request_header_version(version))
        .map_err(|e| RequestError::BadHeader { api_key, version, reason: e.to_string() })?;
    let body = RequestKind::decode(api_key, &mut buf, version).map_err(|e| RequestError::BadBody {
        api_key,
        version,
        correlation_id,
        reason: e.to_string(),
    })?;
    Ok(DecodedRequest { api_key, version, header, body })
}

/// Encodes a response frame, size prefix included, with the header version `api_key` uses at `version`.
///
/// A Fetch answer's large record sets are not copied: they are pieces of the frame of their own, sharing
/// the memory the log read them into (see [`super::pieces`]).
pub fn encode_response(
    correlation_id: i32,
    api_key: ApiKey,
    version: i16,
    body: &ResponseKind,
) -> Result<ResponseFrame, EncodeError> {
    let failed = |reason: String| EncodeError { api_key, version, reason };
    let mut head = BytesMut::new();
    head.put_i32(0); // size, filled below
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    header.encode(&mut head, api_key.response_header_version(version)).map_err(|e| failed(e.to_string()))?;
    let pieces = match body {
        ResponseKind::Fetch(fetch) => {
            // The size goes first, so it is known before the record sets are taken as pieces.
            let len = head.len() - 4 + fetch.compute_size(version).map_err(|e| failed(e.to_string()))?;
            head[..4].copy_from_slice(&frame_size(len).map_err(failed)?.to_be_bytes());
            let mut out = PieceBuf::new(head, record_sets(fetch));
            fetch.encode(&mut out, version).map_err(|e| failed(e.to_string()))?;
            assert_eq!(out.len(), len + 4, "the Fetch answer's computed size is what it encoded to");
            out.into_pieces()
        }
        _ => {
            body.encode(&mut head, version).map_err(|e| failed(e.to_string()))?;
            let size = frame_size(head.len() - 4).map_err(failed)?;
            head[..4].copy_from_slice(&size.to_be_bytes());
            vec![head.freeze()]
        }
    };
    Ok(ResponseFrame::new(pieces))
}

/// A frame's size prefix for `len` bytes after it.
fn frame_size(len: usize) -> Result<i32, String> {
    i32::try_from(len).map_err(|_| format!("{len} bytes do not fit a frame"))
}

/// The record sets of a Fetch answer's partitions.
fn record_sets(fetch: &FetchResponse) -> Vec<Bytes> {
    fetch
        .responses
        .iter()
        .flat_map(|topic| topic.partitions.iter())
        .filter_map(|partition| partition.records.clone())
        .collect()
}

/// A response the codec cannot encode (a field the version cannot carry, or an oversized frame): a
/// broker bug, reported with what was being encoded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("encode {api_key:?} v{version} response: {reason}")]
pub struct EncodeError {
    pub api_key: ApiKey,
    pub version: i16,
    pub reason: String,
}
