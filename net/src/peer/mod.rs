//! The inter-broker protocol: what quorum voters and brokers send each other.
//!
//! Every message is a frame: a fixed 16-byte header, then the body. The header is checked before any of
//! the body is buffered (magic, version, a bounded length); the CRC32C, over the header's first 12 bytes
//! and the body, is checked before the body is looked at. Control messages are rkyv archives, validated
//! (bytecheck) before they are read; record-batch bytes travel as they are. The byte layout is in
//! `docs/peer-protocol.md`.
//!
//! | bytes | field | |
//! |---|---|---|
//! | 0..4 | magic | `SLP1` (0x534C5031), big-endian |
//! | 4..6 | version | 1, big-endian |
//! | 6..8 | message type | big-endian; the meaning belongs to the service speaking |
//! | 8..12 | body length | big-endian, at most the reader's limit |
//! | 12..16 | CRC32C | big-endian, of bytes 0..12 then the body |
//! | 16.. | body | |

use bytes::{Buf, Bytes, BytesMut};

pub mod calls;
pub mod replication;

/// `SLP1`: shardlog peer protocol, first layout.
pub const MAGIC: u32 = 0x534C_5031;
/// The one version this build speaks.
pub const VERSION: u16 = 1;
/// Header length.
pub const HEADER_BYTES: usize = 16;

/// Why bytes from a peer cannot be used. Any of these closes the connection, with the reason logged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PeerFrameError {
    #[error("bad magic {0:#010x}: not a shardlog peer")]
    BadMagic(u32),
    #[error("protocol version {0} is not supported (this build speaks {VERSION})")]
    UnsupportedVersion(u16),
    #[error("frame body of {len} bytes exceeds the {max}-byte limit")]
    TooLarge { len: u32, max: u32 },
    #[error("CRC32C mismatch: header says {claimed:#010x}, the frame's bytes give {actual:#010x}")]
    BadCrc { claimed: u32, actual: u32 },
    #[error("message type {0} is not expected here")]
    UnexpectedType(u16),
    #[error("malformed message body: {0}")]
    Malformed(String),
}

/// A checked frame: its type and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerFrame {
    pub kind: u16,
    pub body: Bytes,
}

fn crc_of(header: &[u8], body: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(header), body)
}

/// The bytes of one frame.
pub fn encode_frame(kind: u16, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(&frame_header(kind, &[body]));
    out.extend_from_slice(body);
    out
}

/// The header of a frame whose body is `parts`, one after the other.
pub fn frame_header(kind: u16, parts: &[&[u8]]) -> [u8; HEADER_BYTES] {
    let len = parts.iter().map(|p| p.len()).sum::<usize>();
    let len = u32::try_from(len).expect("a peer message under 4 GiB");
    let mut header = [0u8; HEADER_BYTES];
    header[0..4].copy_from_slice(&MAGIC.to_be_bytes());
    header[4..6].copy_from_slice(&VERSION.to_be_bytes());
    header[6..8].copy_from_slice(&kind.to_be_bytes());
    header[8..12].copy_from_slice(&len.to_be_bytes());
    let crc = parts.iter().fold(crc32c::crc32c(&header[..12]), |crc, part| crc32c::crc32c_append(crc, part));
    header[12..16].copy_from_slice(&crc.to_be_bytes());
    header
}

/// Splits a peer's byte stream into checked frames.
#[derive(Debug)]
pub struct PeerFrameReader {
    buf: BytesMut,
    max_body_bytes: u32,
}

impl PeerFrameReader {
    pub fn new(max_body_bytes: u32) -> Self {
        PeerFrameReader { buf: BytesMut::new(), max_body_bytes }
    }

    /// Adds bytes read from the connection.
    pub fn extend(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The body length of the frame whose header has arrived (and passed its checks, see
    /// [`PeerFrameReader::next_frame`]) but whose body has not, all of it.
    pub fn announced(&self) -> Option<usize> {
        if self.buf.len() < HEADER_BYTES {
            return None;
        }
        let field = |at: usize| u32::from_be_bytes(self.buf[at..at + 4].try_into().expect("4 bytes"));
        let version = u16::from_be_bytes([self.buf[4], self.buf[5]]);
        let len = field(8);
        if field(0) != MAGIC || version != VERSION || len > self.max_body_bytes {
            return None;
        }
        let len = len as usize;
        (self.buf.len() < HEADER_BYTES + len).then_some(len)
    }

    /// The next complete frame, `Ok(None)` if more bytes are needed. The header is judged as soon as its
    /// 16 bytes are here; an error means the stream is unusable from there on.
    pub fn next_frame(&mut self) -> Result<Option<PeerFrame>, PeerFrameError> {
        if self.buf.len() < HEADER_BYTES {
            return Ok(None);
        }
        let field = |at: usize| u32::from_be_bytes(self.buf[at..at + 4].try_into().expect("4 bytes"));
        let magic = field(0);
        if magic != MAGIC {
            return Err(PeerFrameError::BadMagic(magic));
        }
        let version = u16::from_be_bytes([self.buf[4], self.buf[5]]);
        if version != VERSION {
            return Err(PeerFrameError::UnsupportedVersion(version));
        }
        let kind = u16::from_be_bytes([self.buf[6], self.buf[7]]);
        let len = field(8);
        if len > self.max_body_bytes {
            return Err(PeerFrameError::TooLarge { len, max: self.max_body_bytes });
        }
        let total = HEADER_BYTES + len as usize;
        if self.buf.len() < total {
            return Ok(None);
        }
        let claimed = field(12);
        let actual = crc_of(&self.buf[..12], &self.buf[HEADER_BYTES..total]);
        if claimed != actual {
            return Err(PeerFrameError::BadCrc { claimed, actual });
        }
        self.buf.advance(HEADER_BYTES);
        Ok(Some(PeerFrame { kind, body: self.buf.split_to(len as usize).freeze() }))
    }
}

/// Serializes a control message as an rkyv archive.
pub fn encode_message<T>(value: &T) -> Vec<u8>
where
    T: for<'a> rkyv::Serialize<
            rkyv::api::high::HighSerializer<
                rkyv::util::AlignedVec,
                rkyv::ser::allocator::ArenaHandle<'a>,
                rkyv::rancor::Error,
            >,
        >,
{
    rkyv::to_bytes::<rkyv::rancor::Error>(value).expect("serializing to memory cannot fail").into_vec()
}

/// Validates a control message's archive, then reads it. The body is copied into an aligned buffer
/// first: a frame's body sits at any address in the read buffer.
pub fn decode_message<T>(body: &[u8]) -> Result<T, PeerFrameError>
where
    T: rkyv::Archive,
    T::Archived: for<'a> rkyv::bytecheck::CheckBytes<rkyv::api::high::HighValidator<'a, rkyv::rancor::Error>>
        + rkyv::Deserialize<T, rkyv::api::high::HighDeserializer<rkyv::rancor::Error>>,
{
    let mut aligned = rkyv::util::AlignedVec::<16>::with_capacity(body.len());
    aligned.extend_from_slice(body);
    rkyv::from_bytes::<T, rkyv::rancor::Error>(&aligned).map_err(|e| PeerFrameError::Malformed(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
    struct Vote {
        term: u64,
        candidate: u32,
        note: String,
        entries: Vec<u64>,
    }

    fn vote() -> Vote {
        Vote { term: 7, candidate: 2, note: "hello".into(), entries: vec![1, 2, 3] }
    }

    #[test]
    fn a_message_round_trips_through_a_frame_split_across_reads() {
        let frame = encode_frame(3, &encode_message(&vote()));
        let mut reader = PeerFrameReader::new(1 << 20);
        for chunk in frame.chunks(5) {
            reader.extend(chunk);
        }
        reader.extend(&encode_frame(4, b"raw batch bytes"));
        let first = reader.next_frame().unwrap().unwrap();
        assert_eq!(first.kind, 3);
        assert_eq!(decode_message::<Vote>(&first.body).unwrap(), vote());
        let second = reader.next_frame().unwrap().unwrap();
        assert_eq!((second.kind, second.body.as_ref()), (4, b"raw batch bytes".as_ref()), "bodies pass untouched");
        assert_eq!(reader.next_frame().unwrap(), None);
    }

    #[test]
    fn a_bad_header_is_refused_before_the_body_arrives() {
        let frame = encode_frame(1, &[0u8; 1000]);
        let header_only = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut bytes = frame[..HEADER_BYTES].to_vec();
            edit(&mut bytes);
            let mut reader = PeerFrameReader::new(100);
            reader.extend(&bytes);
            reader.next_frame()
        };
        assert_eq!(header_only(&|b| b[0] = b'X'), Err(PeerFrameError::BadMagic(0x584C_5031)));
        assert_eq!(header_only(&|b| b[5] = 2), Err(PeerFrameError::UnsupportedVersion(2)));
        assert_eq!(header_only(&|_| {}), Err(PeerFrameError::TooLarge { len: 1000, max: 100 }));
        let mut reader = PeerFrameReader::new(2000);
        reader.extend(&frame[..HEADER_BYTES + 10]);
        assert_eq!(reader.next_frame(), Ok(None), "a good header waits for its body");
    }

    #[test]
    fn a_flipped_bit_anywhere_fails_the_crc() {
        let frame = encode_frame(1, &encode_message(&vote()));
        for at in (6..12).chain(HEADER_BYTES..frame.len()) {
            let mut bad = frame.clone();
            bad[at] ^= 0x10;
            let mut reader = PeerFrameReader::new(1 << 20);
            reader.extend(&bad);
            // A flipped length bit may claim a longer body: more bytes arrive (the next frames', say).
            reader.extend(&[0u8; 8192]);
            match reader.next_frame() {
                Err(PeerFrameError::BadCrc { .. }) | Err(PeerFrameError::TooLarge { .. }) => {}
                other => panic!("flipped byte {at}: {other:?}"),
            }
        }
    }

    #[test]
    fn malformed_archives_are_refused_not_read() {
        let body = encode_message(&vote());
        for cut in [0, 1, body.len() / 2, body.len() - 1] {
            assert!(matches!(decode_message::<Vote>(&body[..cut]), Err(PeerFrameError::Malformed(_))), "cut at {cut}");
        }
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..200 {
            let garbage: Vec<u8> = (0..body.len())
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            // Pointers and lengths out of bounds, invalid UTF-8: validation refuses before anything is read.
            assert!(matches!(decode_message::<Vote>(&garbage), Err(PeerFrameError::Malformed(_))));
        }
    }
}
