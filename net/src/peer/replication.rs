//! The replication messages: a follower shard fetches from a leader shard, many partitions per request.
//!
//! A connection goes from one shard of the follower broker to one shard of the leader broker and carries
//! every partition the two share. It starts with [`ReplicaHello`], naming the leader shard it is for;
//! the leader answers [`ReplicaHelloAnswer`] with its shard count (so the follower knows which of its
//! partitions each leader shard owns) and hands the connection to that shard. Then the follower sends
//! [`ReplicaFetch`] frames, each answered by one [`ReplicaFetchResult`] frame carrying the same
//! correlation id.
//! A fetch result's body is its rkyv control part followed by the record-batch bytes of each partition, as
//! they are stored, in the order of the control part's partitions: the bytes are never re-encoded, and the
//! follower's storage checks each batch's CRC32C before it appends. The byte layout is in
//! `docs/peer-protocol.md` §2.2.

use bytes::{Bytes, BytesMut};

use super::{HEADER_BYTES, PeerFrameError, decode_message, encode_message, frame_header};
use crate::kafka::pieces::SHARED_MIN_BYTES;

/// Frame types on a replication connection.
pub mod kind {
    pub const HELLO: u16 = 30;
    pub const HELLO_ANSWER: u16 = 31;
    pub const FETCH: u16 = 32;
    pub const FETCH_RESULT: u16 = 33;
}

/// Under cluster mTLS a replication connection is TLS from its first byte, and the follower's TLS
/// ClientHello offers the ALPN protocol `shardlog-peer/<leader shard>`: the accepting shard reads it (the
/// ClientHello is looked at, not consumed) to hand the connection, before any frame, to the shard that
/// will run the handshake and serve it. `docs/peer-protocol.md` §4.
pub const PEER_ALPN_PREFIX: &str = "shardlog-peer/";

/// The ALPN protocol a follower offers for `leader_shard`.
pub fn peer_alpn(leader_shard: u16) -> Vec<u8> {
    format!("{PEER_ALPN_PREFIX}{leader_shard}").into_bytes()
}

/// The leader shard an ALPN protocol made by [`peer_alpn`] names; `None` for any other protocol.
pub fn shard_of_alpn(protocol: &[u8]) -> Option<u16> {
    let digits = protocol.strip_prefix(PEER_ALPN_PREFIX.as_bytes())?;
    let plain = !digits.is_empty() && digits.len() <= 5 && digits.iter().all(u8::is_ascii_digit);
    plain.then(|| std::str::from_utf8(digits).ok()?.parse().ok()).flatten()
}

/// "No epoch" in the fields below (Kafka's `UNDEFINED_EPOCH`).
pub const NO_EPOCH: i32 = -1;

/// The first frame on a connection: who is asking. The leader closes a connection whose broker it does
/// not know as a live replica, or whose cluster is another.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ReplicaHello {
    pub cluster_id: String,
    pub broker: u32,
    /// The follower's shard (for the leader's logs).
    pub from_shard: u16,
    /// The leader's shard the connection is for: the one that owns the partitions it will fetch.
    pub to_shard: u16,
}

/// The leader's answer to a Hello it accepts.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ReplicaHelloAnswer {
    /// The leader broker's shard count: partition `p` of topic `t` is on its shard
    /// `assign_shard(t, p, shards)`. A Hello for a shard it does not have is answered, then closed.
    pub shards: u16,
}

/// One partition of a fetch: where the follower's log stands.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct FetchPartition {
    pub topic: String,
    /// The topic's id: a topic deleted and created again under the same name is another topic.
    pub topic_id: [u8; 16],
    pub partition: u32,
    /// The leader epoch the follower believes current.
    pub leader_epoch: i32,
    /// The follower's log end offset: the first offset it asks for.
    pub offset: u64,
    /// The leader epoch of the follower's last batch, or [`NO_EPOCH`].
    pub last_epoch: i32,
    /// Below this offset the follower's log is on disk (or written, under Kafka's interval flush).
    pub stable_end: u64,
    /// The high watermark the follower knows: a leader with another one answers without holding the fetch.
    pub high_watermark: u64,
}

/// A follower's fetch.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ReplicaFetch {
    /// Echoed in the result; fetches may be answered out of order.
    pub correlation: u64,
    /// How long the leader may hold the fetch when no partition has records to send.
    pub max_wait_ms: u32,
    /// The most record bytes the answer may carry, over all partitions.
    pub max_bytes: u32,
    pub partitions: Vec<FetchPartition>,
}

/// One partition of a fetch result.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct FetchedPartition {
    pub topic: String,
    pub partition: u32,
    /// A Kafka error code (0: none): NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH,
    /// OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_ID...
    pub error: i16,
    pub high_watermark: u64,
    pub log_start: u64,
    /// When the follower's log diverges: the largest leader epoch here not above the follower's last
    /// epoch, and where it ends; [`NO_EPOCH`] otherwise.
    pub diverging_epoch: i32,
    pub diverging_end: u64,
    /// How many of the record bytes after the control part are this partition's.
    pub records_len: u32,
}

/// The control part of a leader's answer.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ReplicaFetchResult {
    pub correlation: u64,
    pub partitions: Vec<FetchedPartition>,
}

/// A fetch result frame as pieces to write in order. Its body is a 4-byte big-endian length, the control
/// part, then `records` (each partition's bytes, in order; their lengths are in the control part). The
/// pieces: the header and control part in one, then the record sets, each large one as it is (its memory
/// shared, not copied), small ones gathered into one piece.
pub fn fetch_result_frame_pieces(result: &ReplicaFetchResult, records: &[Bytes]) -> Vec<Bytes> {
    debug_assert_eq!(result.partitions.len(), records.len());
    let control = encode_message(result);
    let control_len = (control.len() as u32).to_be_bytes();
    let mut parts: Vec<&[u8]> = vec![&control_len, &control];
    parts.extend(records.iter().map(|r| r.as_ref()));
    let mut pieces = Vec::new();
    let mut current = BytesMut::with_capacity(HEADER_BYTES + 4 + control.len());
    current.extend_from_slice(&frame_header(kind::FETCH_RESULT, &parts));
    current.extend_from_slice(&control_len);
    current.extend_from_slice(&control);
    for bytes in records {
        if bytes.len() >= SHARED_MIN_BYTES {
            if !current.is_empty() {
                pieces.push(current.split().freeze());
            }
            pieces.push(bytes.clone());
        } else {
            current.extend_from_slice(bytes);
        }
    }
    if !current.is_empty() {
        pieces.push(current.freeze());
    }
    pieces
}

/// Splits a fetch result body into its control part and each partition's record bytes (slices of `body`,
/// not copies). The lengths must add up exactly.
pub fn decode_fetch_result(body: &[u8]) -> Result<(ReplicaFetchResult, Vec<&[u8]>), PeerFrameError> {
    let malformed = |why: &str| PeerFrameError::Malformed(why.to_string());
    let Some((len, rest)) = body.split_first_chunk::<4>() else { return Err(malformed("no control length")) };
    let len = u32::from_be_bytes(*len) as usize;
    if len > rest.len() {
        return Err(malformed("control length past the end of the frame"));
    }
    let (control, mut records) = rest.split_at(len);
    let result: ReplicaFetchResult = decode_message(control)?;
    let mut parts = Vec::with_capacity(result.partitions.len());
    for partition in &result.partitions {
        let n = partition.records_len as usize;
        if n > records.len() {
            return Err(malformed("record lengths past the end of the frame"));
        }
        let (part, after) = records.split_at(n);
        parts.push(part);
        records = after;
    }
    if !records.is_empty() {
        return Err(malformed("bytes after the last partition's records"));
    }
    Ok((result, parts))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peer::{PeerFrameReader, encode_frame};

    #[test]
    fn the_peer_alpn_names_a_leader_shard_and_nothing_else() {
        assert_eq!(peer_alpn(3), b"shardlog-peer/3");
        assert_eq!(shard_of_alpn(&peer_alpn(0)), Some(0));
        assert_eq!(shard_of_alpn(&peer_alpn(65535)), Some(65535));
        for other in [
            &b"h2"[..],
            b"http/1.1",
            b"shardlog-peer/",
            b"shardlog-peer/65536",
            b"shardlog-peer/-1",
            b"shardlog-peer/1x",
        ] {
            assert_eq!(shard_of_alpn(other), None, "{}", String::from_utf8_lossy(other));
        }
    }

    /// The body of a fetch result frame written out plainly (docs/peer-protocol.md §2.2): what the pieces
    /// must add up to.
    fn encode_fetch_result(result: &ReplicaFetchResult, records: &[&[u8]]) -> Vec<u8> {
        let control = encode_message(result);
        let mut body = (control.len() as u32).to_be_bytes().to_vec();
        body.extend_from_slice(&control);
        records.iter().for_each(|bytes| body.extend_from_slice(bytes));
        body
    }

    fn result(lens: &[u32]) -> ReplicaFetchResult {
        ReplicaFetchResult {
            correlation: 9,
            partitions: lens
                .iter()
                .enumerate()
                .map(|(i, &records_len)| FetchedPartition {
                    topic: "orders".into(),
                    partition: i as u32,
                    error: 0,
                    high_watermark: 40,
                    log_start: 0,
                    diverging_epoch: NO_EPOCH,
                    diverging_end: 0,
                    records_len,
                })
                .collect(),
        }
    }

    #[test]
    fn record_bytes_travel_untouched_after_the_control_part() {
        let (a, b) = (vec![0xAB; 70], vec![0xCD; 3]);
        let control = result(&[70, 0, 3]);
        let frame = encode_frame(kind::FETCH_RESULT, &encode_fetch_result(&control, &[&a, &[], &b]));
        let mut reader = PeerFrameReader::new(1 << 20);
        reader.extend(&frame);
        let frame = reader.next_frame().unwrap().unwrap();
        let (decoded, parts) = decode_fetch_result(&frame.body).unwrap();
        assert_eq!(decoded, control);
        assert_eq!(parts, vec![&a[..], &[][..], &b[..]]);
    }

    #[test]
    fn a_fetch_result_as_pieces_is_the_same_frame_and_shares_the_large_record_sets() {
        let large = Bytes::from((0..SHARED_MIN_BYTES + 9).map(|i| (i % 241) as u8).collect::<Vec<u8>>());
        let (small, other) = (Bytes::from_static(b"small set"), Bytes::from_static(b"xyz"));
        let records = [small.clone(), large.clone(), Bytes::new(), other.clone(), large.clone()];
        let control = result(&records.iter().map(|r| r.len() as u32).collect::<Vec<_>>());
        let pieces = fetch_result_frame_pieces(&control, &records);
        let refs: Vec<&[u8]> = records.iter().map(|r| r.as_ref()).collect();
        let whole = encode_frame(kind::FETCH_RESULT, &encode_fetch_result(&control, &refs));
        assert_eq!(pieces.concat(), whole);
        // Header, control part and the small set; the large set; the empty and small ones; the large again.
        assert_eq!(pieces.len(), 4);
        assert_eq!((pieces[1].as_ptr(), pieces[3].as_ptr()), (large.as_ptr(), large.as_ptr()), "not copied");
        let mut reader = PeerFrameReader::new(1 << 20);
        reader.extend(&pieces.concat());
        let frame = reader.next_frame().unwrap().expect("a whole frame whose CRC checks");
        let (decoded, parts) = decode_fetch_result(&frame.body).unwrap();
        assert_eq!((decoded, parts), (control, refs));
    }

    #[test]
    fn lengths_that_do_not_add_up_are_refused() {
        let body = encode_fetch_result(&result(&[5]), &[b"12345"]);
        for cut in [0, 3, 4, body.len() - 1] {
            assert!(decode_fetch_result(&body[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = body.clone();
        longer.push(0);
        assert!(decode_fetch_result(&longer).is_err());
        let mut bad_length = body;
        bad_length[..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode_fetch_result(&bad_length).is_err());
    }

    #[test]
    fn a_fetch_round_trips() {
        let fetch = ReplicaFetch {
            correlation: 1,
            max_wait_ms: 500,
            max_bytes: 1 << 20,
            partitions: vec![FetchPartition {
                topic: "orders".into(),
                topic_id: [7; 16],
                partition: 3,
                leader_epoch: 4,
                offset: 100,
                last_epoch: 4,
                stable_end: 96,
                high_watermark: 90,
            }],
        };
        assert_eq!(decode_message::<ReplicaFetch>(&encode_message(&fetch)).unwrap(), fetch);
    }
}
