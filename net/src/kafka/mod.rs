//! The Kafka protocol: size-prefixed frames, request headers and bodies decoded at the version the
//! client asked for, responses encoded with the matching header version.
//!
//! What the broker implements is declared once, in [`versions::SupportedApis`]; a request for anything
//! else is refused the way Kafka refuses it (see [`codec::decode_request`]).

pub mod client;
pub mod codec;
pub mod frame;
pub mod pieces;
pub mod versions;

pub use client::{ResponseDecodeError, decode_response, encode_request};
pub use codec::{DecodedRequest, EncodeError, RequestError, decode_request, encode_response};
pub use frame::{FrameError, FrameReader};
pub use pieces::ResponseFrame;
pub use versions::SupportedApis;
