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
//! follower's storage checks each batch's CRC32C before it appends. So the follower checks the frame's
//! CRC without reading the record bytes a second time: each batch enters it through its own CRC field
//! ([`decode_fetch_result`]). The byte layout is in `docs/peer-protocol.md` §2.2.

use bytes::{Bytes, BytesMut};

use super::{HEADER_BYTES, PeerFrameError, UncheckedFrame, crc, decode_message, encode_message, frame_head};
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
///
/// The frame's CRC is computed as the follower checks it ([`frame_crc_of_fetch_result`]): each stored
/// batch enters it through its own CRC field, so the leader does not read the record bytes for it either.
/// For batches whose bytes match their CRC fields (every batch the log appended) it is the CRC over every
/// byte, and a follower of an older build, which reads them all, finds the same.
pub fn fetch_result_frame_pieces(result: &ReplicaFetchResult, records: &[Bytes]) -> Vec<Bytes> {
    debug_assert_eq!(result.partitions.len(), records.len());
    let control = encode_message(result);
    let control_len = (control.len() as u32).to_be_bytes();
    let body_len = 4 + control.len() + records.iter().map(Bytes::len).sum::<usize>();
    let head = frame_head(kind::FETCH_RESULT, body_len);
    let mut pieces = Vec::new();
    let mut current = BytesMut::with_capacity(HEADER_BYTES + 4 + control.len());
    current.extend_from_slice(&head);
    current.extend_from_slice(&[0; 4]);
    current.extend_from_slice(&control_len);
    current.extend_from_slice(&control);
    let parts: Vec<&[u8]> = records.iter().map(|r| r.as_ref()).collect();
    let crc = frame_crc_of_fetch_result(&head, &current[HEADER_BYTES..], &parts);
    current[12..HEADER_BYTES].copy_from_slice(&crc.to_be_bytes());
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

/// Splits a fetch result frame into its control part and each partition's record bytes (slices of the
/// body, not copies), once its CRC checks. The lengths must add up exactly.
///
/// The CRC is checked without a pass over the record bytes: the control part is validated (bytecheck)
/// first, so that each partition's bytes are known, and each record batch in them enters the frame's CRC
/// through its own CRC32C field, which covers all of the batch after its 21st byte
/// ([`frame_crc_of_fetch_result`]). The result is the CRC over every byte exactly when each such batch's
/// bytes match its CRC field, so **the caller must use a partition's record bytes only through a check of
/// every batch's CRC32C** (the follower's `append_replicated` checks them all before it appends any) and
/// must use no part of a partition whose batches do not all check.
pub fn decode_fetch_result(frame: &UncheckedFrame) -> Result<(ReplicaFetchResult, Vec<&[u8]>), PeerFrameError> {
    let (control_end, result, parts) = split_fetch_result(&frame.body)?;
    frame.check_crc(frame_crc_of_fetch_result(&frame.head, &frame.body[..control_end], &parts))?;
    Ok((result, parts))
}

/// Splits a fetch result body: where its control part ends, the control part, each partition's bytes.
fn split_fetch_result(body: &[u8]) -> Result<(usize, ReplicaFetchResult, Vec<&[u8]>), PeerFrameError> {
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
    Ok((4 + len, result, parts))
}

/// A Kafka v2 record batch's layout, as far as its CRC goes: base offset (8 bytes), batch length (4,
/// counting the bytes after it), partition leader epoch (4), magic (1), CRC32C (4) of the bytes from 21 on.
const BATCH_LENGTH_AT: usize = 8;
const BATCH_CRC_AT: usize = 17;
const BATCH_CRC_FROM: usize = 21;

/// The CRC32C of a fetch result frame (header bytes 0..12, the control length and part, then the
/// partitions' record bytes), with each whole batch of each partition taken at its CRC field's word for
/// its bytes from 21 on: those bytes are not read. Bytes that do not frame as whole batches (a cut or a
/// length that does not fit) are read as they are.
fn frame_crc_of_fetch_result(head: &[u8], control: &[u8], parts: &[&[u8]]) -> u32 {
    let mut sum = crc32c::crc32c_append(crc32c::crc32c(head), control);
    for mut records in parts.iter().copied() {
        while let Some(prefix) = records.first_chunk::<BATCH_CRC_FROM>() {
            let length = i32::from_be_bytes(prefix[BATCH_LENGTH_AT..BATCH_LENGTH_AT + 4].try_into().expect("4"));
            let total = BATCH_LENGTH_AT as i64 + 4 + length as i64;
            if total < BATCH_CRC_FROM as i64 || total > records.len() as i64 {
                break;
            }
            let claimed = u32::from_be_bytes(prefix[BATCH_CRC_AT..BATCH_CRC_FROM].try_into().expect("4"));
            sum = crc32c::crc32c_append(sum, prefix);
            sum = crc::concat(sum, claimed, total as usize - BATCH_CRC_FROM);
            records = &records[total as usize..];
        }
        sum = crc32c::crc32c_append(sum, records);
    }
    sum
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
        let frame = reader.next_unchecked().unwrap().unwrap();
        let (decoded, parts) = decode_fetch_result(&frame).unwrap();
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
        let frame = reader.next_unchecked().unwrap().expect("a whole frame");
        let (decoded, parts) = decode_fetch_result(&frame).unwrap();
        assert_eq!((decoded, parts), (control, refs));
    }

    #[test]
    fn lengths_that_do_not_add_up_are_refused() {
        let body = encode_fetch_result(&result(&[5]), &[b"12345"]);
        for cut in [0, 3, 4, body.len() - 1] {
            assert!(split_fetch_result(&body[..cut]).is_err(), "cut at {cut}");
        }
        let mut longer = body.clone();
        longer.push(0);
        assert!(split_fetch_result(&longer).is_err());
        let mut bad_length = body;
        bad_length[..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(split_fetch_result(&bad_length).is_err());
    }

    /// Bytes framed as a v2 record batch as far as its CRC goes: length field, CRC32C of bytes 21 on.
    fn batch(base: u64, len: usize, seed: u8) -> Vec<u8> {
        let mut b: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect();
        b[..8].copy_from_slice(&base.to_be_bytes());
        b[8..12].copy_from_slice(&((len - 12) as i32).to_be_bytes());
        b[16] = 2;
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// A fetch result frame of three partitions: two batches, none, one batch and a cut one.
    fn frame_of_batches() -> (ReplicaFetchResult, Vec<Vec<u8>>, Vec<u8>) {
        let first = [batch(0, 70_000, 1), batch(10, 61, 2)].concat();
        let mut third = batch(5, 5000, 3);
        third.extend_from_slice(&batch(9, 300, 4)[..100]);
        let records = vec![first, Vec::new(), third];
        let control = result(&records.iter().map(|r| r.len() as u32).collect::<Vec<_>>());
        let refs: Vec<&[u8]> = records.iter().map(|r| r.as_ref()).collect();
        let frame = encode_frame(kind::FETCH_RESULT, &encode_fetch_result(&control, &refs));
        (control, records, frame)
    }

    fn decode_whole(frame: &[u8]) -> Result<(ReplicaFetchResult, Vec<Vec<u8>>), PeerFrameError> {
        let mut reader = PeerFrameReader::new(1 << 20);
        reader.extend(frame);
        // A flipped length may claim more bytes than came: no frame, never a wrong one.
        let frame = reader.next_unchecked()?.ok_or(PeerFrameError::Malformed("not a whole frame".into()))?;
        let (result, parts) = decode_fetch_result(&frame)?;
        Ok((result, parts.into_iter().map(<[u8]>::to_vec).collect()))
    }

    #[test]
    fn a_frame_crc_taken_from_the_batches_crcs_is_the_crc_over_every_byte() {
        let (control, records, frame) = frame_of_batches();
        assert_eq!(decode_whole(&frame).unwrap(), (control, records));
        // Received in place, its bytes read straight into the frame's buffer.
        let mut reader = PeerFrameReader::with_frame_buffers(1 << 20);
        reader.extend(&frame[..1000]);
        assert!(reader.next_unchecked().unwrap().is_none());
        let mut at = 1000;
        while let Some(space) = reader.frame_space() {
            let n = space.len().min(4096).min(frame.len() - at);
            space[..n].copy_from_slice(&frame[at..at + n]);
            reader.frame_filled(n);
            at += n;
        }
        assert_eq!((at, reader.buffered()), (frame.len(), frame.len()));
        let received = reader.next_unchecked().unwrap().expect("the whole frame");
        let (_, parts) = decode_fetch_result(&received).unwrap();
        assert_eq!(parts.concat(), frame_of_batches().1.concat());
        assert_eq!(reader.buffered(), 0);
    }

    #[test]
    fn a_leaders_pieces_of_whole_batches_carry_the_crc_over_every_byte() {
        let (control, records, frame) = frame_of_batches();
        let records: Vec<Bytes> = records.into_iter().map(Bytes::from).collect();
        assert_eq!(fetch_result_frame_pieces(&control, &records).concat(), frame);
    }

    #[test]
    fn a_flipped_bit_outside_a_batchs_own_crc_fails_the_frame_crc() {
        let (_, _, frame) = frame_of_batches();
        let records_at = frame.len() - frame_of_batches().1.iter().map(Vec::len).sum::<usize>();
        // Every byte of the header's covered fields and of the control part; each batch's first 21 bytes
        // (base offset, length, epoch, magic, its CRC); the cut batch at the end, read as it is.
        let second_batch = records_at + 70_000;
        let third_part = second_batch + 61;
        let cut = third_part + 5000;
        let bytes = (6..12)
            .chain(HEADER_BYTES..records_at)
            .chain(records_at..records_at + 21)
            .chain(second_batch..second_batch + 21)
            .chain(third_part..third_part + 21)
            .chain(cut..frame.len());
        for at in bytes {
            let mut bad = frame.clone();
            bad[at] ^= 0x04;
            match decode_whole(&bad) {
                Err(PeerFrameError::BadCrc { .. } | PeerFrameError::Malformed(_) | PeerFrameError::TooLarge { .. }) => {
                }
                Ok(_) => panic!("flipped byte {at}: passed"),
                Err(other) => panic!("flipped byte {at}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_flipped_bit_inside_a_batch_passes_the_frame_but_not_the_batchs_own_crc() {
        // What the caller's batch check is for: the frame's CRC took the batch at its CRC field's word.
        let (_, records, frame) = frame_of_batches();
        let at = frame.len() - records.iter().map(Vec::len).sum::<usize>() + 30_000;
        let mut bad = frame;
        bad[at] ^= 0x04;
        let (_, parts) = decode_whole(&bad).expect("the frame's CRC checks");
        let first = &parts[0][..70_000];
        let claimed = u32::from_be_bytes(first[17..21].try_into().unwrap());
        assert_ne!(crc32c::crc32c(&first[21..]), claimed, "the batch's CRC finds the flipped bit");
    }

    #[test]
    fn a_frame_cut_short_is_never_a_frame() {
        let (_, _, frame) = frame_of_batches();
        for frame_buffers in [false, true] {
            let mut reader = match frame_buffers {
                true => PeerFrameReader::with_frame_buffers(1 << 20),
                false => PeerFrameReader::new(1 << 20),
            };
            reader.extend(&frame[..frame.len() - 1]);
            assert!(reader.next_unchecked().unwrap().is_none(), "in place: {frame_buffers}");
            assert_eq!(reader.buffered(), frame.len() - 1);
            assert_eq!(reader.announced(), Some(frame.len() - HEADER_BYTES));
        }
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
