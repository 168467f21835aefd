//! The client side of the codec, for shardlog's own tools (the admin CLI, the load generators): request
//! frames as a Kafka client sends them, and response frames decoded at the version asked for.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader, ResponseKind};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use super::EncodeError;

/// A response frame that does not decode as the answer to the request it was read for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{api_key:?} v{version} response does not decode: {reason}")]
pub struct ResponseDecodeError {
    pub api_key: ApiKey,
    pub version: i16,
    pub reason: String,
}

/// A request frame, size prefix included, with the header version `api_key` uses at `version`.
pub fn encode_request<T: Encodable>(
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    client_id: &str,
    body: &T,
) -> Result<BytesMut, EncodeError> {
    let failed = |reason: String| EncodeError { api_key, version, reason };
    let header = RequestHeader::default()
        .with_request_api_key(api_key as i16)
        .with_request_api_version(version)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_string(client_id.to_string())));
    let mut out = BytesMut::new();
    out.put_i32(0); // size, filled below
    header.encode(&mut out, api_key.request_header_version(version)).map_err(|e| failed(e.to_string()))?;
    body.encode(&mut out, version).map_err(|e| failed(e.to_string()))?;
    let size = i32::try_from(out.len() - 4).map_err(|_| failed(format!("{} bytes do not fit a frame", out.len())))?;
    out[..4].copy_from_slice(&size.to_be_bytes());
    Ok(out)
}

/// Decodes a response frame (without its size prefix): its correlation id and body. Trailing bytes are
/// an error: they mean the versions of the two sides disagree.
pub fn decode_response(
    mut frame: Bytes,
    api_key: ApiKey,
    version: i16,
) -> Result<(i32, ResponseKind), ResponseDecodeError> {
    let failed = |reason: String| ResponseDecodeError { api_key, version, reason };
    let header = ResponseHeader::decode(&mut frame, api_key.response_header_version(version))
        .map_err(|e| failed(e.to_string()))?;
    let body = ResponseKind::decode(api_key, &mut frame, version).map_err(|e| failed(e.to_string()))?;
    if frame.has_remaining() {
        return Err(failed(format!("{} trailing bytes", frame.remaining())));
    }
    Ok((header.correlation_id, body))
}
