//! Peer calls: small requests one broker makes of another for transactions, each answered by one frame.
//!
//! A transaction coordinator writes COMMIT/ABORT markers through each partition's leader
//! ([`WriteMarkers`]), and a partition leader asks a transactional id's coordinator whether partitions
//! are in a producer's ongoing transaction before it appends transactional data ([`VerifyTxn`], KIP-890
//! part 1). A connection starts with [`CallsHello`] (which cluster, which broker), answered by
//! [`CallsHelloAnswer`]; then each request frame is answered by one answer frame, in order, carrying the
//! request's correlation id. Every request holds at most [`MAX_CALL_ITEMS`] items and every answer
//! exactly one error code per item, in order; anything else is malformed and closes the connection.
//! The byte layout is in `docs/peer-protocol.md` §2.3.
//!
//! These are plain types: nothing here does I/O or trusts a peer's bytes before [`decode_message`] has
//! validated them.

use super::{PeerFrame, PeerFrameError, decode_message};

/// Frame types on a peer-calls connection.
pub mod kind {
    pub const HELLO: u16 = 40;
    pub const HELLO_ANSWER: u16 = 41;
    pub const WRITE_MARKERS: u16 = 42;
    pub const WRITE_MARKERS_ANSWER: u16 = 43;
    pub const VERIFY_TXN: u16 = 44;
    pub const VERIFY_TXN_ANSWER: u16 = 45;
}

/// Under cluster mTLS the caller's TLS ClientHello offers this ALPN protocol: the accepting broker tells
/// a calls connection from a replication one (`shardlog-peer/<shard>`) and from a Kafka client by it.
pub const CALLS_ALPN: &[u8] = b"shardlog-calls/1";

/// The largest frame either side of a calls connection reads.
pub const MAX_CALL_FRAME_BYTES: u32 = 4 << 20;
/// The most items (markers, partitions) one request carries; a caller with more sends several requests.
pub const MAX_CALL_ITEMS: usize = 8192;
/// The longest transactional id a [`VerifyTxn`] carries (Kafka's string length limit).
pub const MAX_TRANSACTIONAL_ID_BYTES: usize = i16::MAX as usize;

/// The first frame on a connection: who is calling. The callee closes a connection from another cluster
/// or from a broker that is not registered (under cluster mTLS, one other than its certificate names).
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct CallsHello {
    pub cluster_id: String,
    pub broker: u32,
}

/// The callee's answer to a Hello it accepts: which broker it is (an address may have changed hands).
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct CallsHelloAnswer {
    pub broker: u32,
}

/// A partition, by name.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct CallPartition {
    pub topic: String,
    pub partition: u32,
}

/// One COMMIT or ABORT marker for one partition.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireMarker {
    pub partition: CallPartition,
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// The epoch of the coordinator's leadership of its `__transaction_state` partition.
    pub coordinator_epoch: i32,
    pub commit: bool,
}

/// Markers to write to partitions the callee leads.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WriteMarkers {
    pub correlation: u64,
    pub markers: Vec<WireMarker>,
}

/// Whether each partition is in `producer`'s ongoing transaction under `transactional_id`, asked of the
/// id's coordinator.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct VerifyTxn {
    pub correlation: u64,
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub partitions: Vec<CallPartition>,
}

/// The answer to a [`WriteMarkers`] or a [`VerifyTxn`]: a Kafka error code per item, in order, 0 for none.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct CallAnswer {
    pub correlation: u64,
    pub errors: Vec<i16>,
}

/// A request as the callee reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallRequest {
    WriteMarkers(WriteMarkers),
    VerifyTxn(VerifyTxn),
}

impl CallRequest {
    pub fn correlation(&self) -> u64 {
        match self {
            CallRequest::WriteMarkers(w) => w.correlation,
            CallRequest::VerifyTxn(v) => v.correlation,
        }
    }

    /// How many items it carries (the answer has one error code for each).
    pub fn items(&self) -> usize {
        match self {
            CallRequest::WriteMarkers(w) => w.markers.len(),
            CallRequest::VerifyTxn(v) => v.partitions.len(),
        }
    }

    /// The frame type of its answer.
    pub fn answer_kind(&self) -> u16 {
        match self {
            CallRequest::WriteMarkers(_) => kind::WRITE_MARKERS_ANSWER,
            CallRequest::VerifyTxn(_) => kind::VERIFY_TXN_ANSWER,
        }
    }
}

fn malformed(why: String) -> PeerFrameError {
    PeerFrameError::Malformed(why)
}

/// A request frame after the Hello, validated: its type, its archive and its bounds.
pub fn decode_request(frame: &PeerFrame) -> Result<CallRequest, PeerFrameError> {
    let request = match frame.kind {
        kind::WRITE_MARKERS => CallRequest::WriteMarkers(decode_message(&frame.body)?),
        kind::VERIFY_TXN => {
            let verify: VerifyTxn = decode_message(&frame.body)?;
            if verify.transactional_id.is_empty() || verify.transactional_id.len() > MAX_TRANSACTIONAL_ID_BYTES {
                return Err(malformed(format!("a transactional id of {} bytes", verify.transactional_id.len())));
            }
            CallRequest::VerifyTxn(verify)
        }
        other => return Err(PeerFrameError::UnexpectedType(other)),
    };
    if request.items() > MAX_CALL_ITEMS {
        return Err(malformed(format!("{} items in one request, at most {MAX_CALL_ITEMS}", request.items())));
    }
    Ok(request)
}

/// An answer frame, validated against the request it must answer: its type, correlation id and one
/// error code per item.
pub fn decode_answer(
    frame: &PeerFrame,
    answer_kind: u16,
    correlation: u64,
    items: usize,
) -> Result<Vec<i16>, PeerFrameError> {
    if frame.kind != answer_kind {
        return Err(PeerFrameError::UnexpectedType(frame.kind));
    }
    let answer: CallAnswer = decode_message(&frame.body)?;
    if answer.correlation != correlation {
        return Err(malformed(format!("answer to request {}, expected {correlation}", answer.correlation)));
    }
    if answer.errors.len() != items {
        return Err(malformed(format!("{} error codes for {items} items", answer.errors.len())));
    }
    Ok(answer.errors)
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::peer::{PeerFrameReader, encode_frame, encode_message};

    fn partition(topic: &str, partition: u32) -> CallPartition {
        CallPartition { topic: topic.into(), partition }
    }

    fn verify(partitions: usize) -> VerifyTxn {
        VerifyTxn {
            correlation: 7,
            transactional_id: "payments-1".into(),
            producer_id: 4000,
            producer_epoch: 3,
            partitions: (0..partitions as u32).map(|p| partition("orders", p)).collect(),
        }
    }

    fn frame_of(kind: u16, body: Vec<u8>) -> PeerFrame {
        PeerFrame { kind, body: Bytes::from(body) }
    }

    #[test]
    fn requests_round_trip_through_frames() {
        let markers = WriteMarkers {
            correlation: 1,
            markers: vec![WireMarker {
                partition: partition("orders", 3),
                producer_id: 12,
                producer_epoch: 0,
                coordinator_epoch: 5,
                commit: true,
            }],
        };
        let mut reader = PeerFrameReader::new(MAX_CALL_FRAME_BYTES);
        reader.extend(&encode_frame(kind::WRITE_MARKERS, &encode_message(&markers)));
        reader.extend(&encode_frame(kind::VERIFY_TXN, &encode_message(&verify(2))));
        let first = decode_request(&reader.next_frame().unwrap().unwrap()).unwrap();
        assert_eq!(first, CallRequest::WriteMarkers(markers));
        assert_eq!((first.correlation(), first.items(), first.answer_kind()), (1, 1, kind::WRITE_MARKERS_ANSWER));
        let second = decode_request(&reader.next_frame().unwrap().unwrap()).unwrap();
        assert_eq!(second, CallRequest::VerifyTxn(verify(2)));
        assert_eq!(second.answer_kind(), kind::VERIFY_TXN_ANSWER);
    }

    #[test]
    fn an_answer_must_match_its_request() {
        let answer = |correlation, errors: Vec<i16>| {
            frame_of(kind::VERIFY_TXN_ANSWER, encode_message(&CallAnswer { correlation, errors }))
        };
        assert_eq!(decode_answer(&answer(7, vec![0, 48]), kind::VERIFY_TXN_ANSWER, 7, 2), Ok(vec![0, 48]));
        assert!(matches!(
            decode_answer(&answer(8, vec![0, 48]), kind::VERIFY_TXN_ANSWER, 7, 2),
            Err(PeerFrameError::Malformed(_))
        ));
        assert!(matches!(
            decode_answer(&answer(7, vec![0]), kind::VERIFY_TXN_ANSWER, 7, 2),
            Err(PeerFrameError::Malformed(_))
        ));
        assert_eq!(
            decode_answer(&answer(7, vec![0, 48]), kind::WRITE_MARKERS_ANSWER, 7, 2),
            Err(PeerFrameError::UnexpectedType(kind::VERIFY_TXN_ANSWER))
        );
    }

    #[test]
    fn requests_past_their_bounds_are_refused() {
        let too_many = encode_message(&verify(MAX_CALL_ITEMS + 1));
        assert!(matches!(decode_request(&frame_of(kind::VERIFY_TXN, too_many)), Err(PeerFrameError::Malformed(_))));
        let mut no_id = verify(1);
        no_id.transactional_id.clear();
        let no_id = encode_message(&no_id);
        assert!(matches!(decode_request(&frame_of(kind::VERIFY_TXN, no_id)), Err(PeerFrameError::Malformed(_))));
        let hello = encode_message(&CallsHello { cluster_id: "c".into(), broker: 1 });
        assert_eq!(decode_request(&frame_of(kind::HELLO, hello)), Err(PeerFrameError::UnexpectedType(kind::HELLO)));
    }

    #[test]
    fn an_oversized_request_frame_is_refused_from_its_header() {
        let body = encode_message(&verify(MAX_CALL_ITEMS));
        let frame = encode_frame(kind::VERIFY_TXN, &body);
        let mut reader = PeerFrameReader::new(1024);
        reader.extend(&frame[..crate::peer::HEADER_BYTES]);
        assert_eq!(reader.next_frame(), Err(PeerFrameError::TooLarge { len: body.len() as u32, max: 1024 }));
    }

    #[test]
    fn garbage_and_cut_request_bodies_are_malformed_not_read() {
        let body = encode_message(&verify(3));
        for cut in [0, 1, body.len() / 2, body.len() - 1] {
            let frame = frame_of(kind::VERIFY_TXN, body[..cut].to_vec());
            assert!(matches!(decode_request(&frame), Err(PeerFrameError::Malformed(_))), "cut at {cut}");
        }
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..300 {
            let garbage: Vec<u8> = (0..body.len())
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            for kind in [kind::VERIFY_TXN, kind::WRITE_MARKERS] {
                assert!(decode_request(&frame_of(kind, garbage.clone())).is_err());
            }
        }
    }
}
