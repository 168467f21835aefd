//! The inter-broker protocol: what quorum voters and brokers send each other.
//!
//! Every message is a frame: a fixed 16-byte header, then the body. The header is checked before any of
//! the body is buffered (magic, version, a bounded length); the CRC32C, over the header's first 12 bytes
//! and the body, is checked before the body is looked at. Control messages are rkyv archives, validated
//! (bytecheck) before they are read; record-batch bytes travel as they are. The byte layout is in
//! `docs/peer-protocol.md`.
//!
//! A reader made with [`PeerFrameReader::with_frame_buffers`] receives the body of a frame of
//! [`IN_PLACE_BYTES`] or more straight into a pooled buffer of its own ([`crate::pool`]), read there in
//! place ([`PeerFrameReader::frame_space`]) rather than copied out of a shared read buffer: a follower's
//! replication answers, whose record bytes are large and go on to its log.
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

use crate::pool::PooledBuf;

pub mod calls;
mod crc;
pub mod replication;

/// `SLP1`: shardlog peer protocol, first layout.
pub const MAGIC: u32 = 0x534C_5031;
/// The one version this build speaks.
pub const VERSION: u16 = 1;
/// Header length.
pub const HEADER_BYTES: usize = 16;
/// A reader [`PeerFrameReader::with_frame_buffers`] receives bodies of this size or more in place.
pub const IN_PLACE_BYTES: usize = 64 << 10;

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
    #[error("no memory for a frame body of {len} bytes: {error}")]
    NoMemory { len: u32, error: String },
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
    let head = frame_head(kind, len);
    let crc = parts.iter().fold(crc32c::crc32c(&head), |crc, part| crc32c::crc32c_append(crc, part));
    let mut header = [0u8; HEADER_BYTES];
    header[..12].copy_from_slice(&head);
    header[12..16].copy_from_slice(&crc.to_be_bytes());
    header
}

/// A header's first 12 bytes (the CRC's field follows them): magic, version, `kind`, body length.
fn frame_head(kind: u16, body_len: usize) -> [u8; 12] {
    let len = u32::try_from(body_len).expect("a peer message under 4 GiB");
    let mut head = [0u8; 12];
    head[0..4].copy_from_slice(&MAGIC.to_be_bytes());
    head[4..6].copy_from_slice(&VERSION.to_be_bytes());
    head[6..8].copy_from_slice(&kind.to_be_bytes());
    head[8..12].copy_from_slice(&len.to_be_bytes());
    head
}

/// A frame whose header passed its checks and whose body is all here, but whose CRC32C is not checked
/// yet. Its body is reachable only through a check: [`UncheckedFrame::check`], over every byte, or, for a
/// replication fetch result, [`replication::decode_fetch_result`], which takes each record batch's
/// bytes at its own CRC's word (its storage checks that CRC before it appends them).
#[derive(Debug)]
pub struct UncheckedFrame {
    pub kind: u16,
    /// The header's first 12 bytes, which the CRC covers.
    head: [u8; 12],
    /// The CRC the header claims.
    claimed: u32,
    body: Bytes,
}

impl UncheckedFrame {
    /// The frame, once the CRC over its header and every byte of its body checks.
    pub fn check(self) -> Result<PeerFrame, PeerFrameError> {
        self.check_crc(crc_of(&self.head, &self.body))?;
        Ok(PeerFrame { kind: self.kind, body: self.body })
    }

    fn check_crc(&self, actual: u32) -> Result<(), PeerFrameError> {
        match actual == self.claimed {
            true => Ok(()),
            false => Err(PeerFrameError::BadCrc { claimed: self.claimed, actual }),
        }
    }
}

/// A body being received in place: its frame's header and the buffer its bytes go to.
#[derive(Debug)]
struct InPlace {
    head: [u8; 12],
    kind: u16,
    claimed: u32,
    len: usize,
    body: PooledBuf,
}

/// Splits a peer's byte stream into checked frames.
#[derive(Debug)]
pub struct PeerFrameReader {
    buf: BytesMut,
    max_body_bytes: u32,
    /// Whether bodies of [`IN_PLACE_BYTES`] or more go to buffers of their own.
    frame_buffers: bool,
    /// The large body under way.
    in_place: Option<InPlace>,
}

impl PeerFrameReader {
    pub fn new(max_body_bytes: u32) -> Self {
        PeerFrameReader { buf: BytesMut::new(), max_body_bytes, frame_buffers: false, in_place: None }
    }

    /// A reader that receives each body of [`IN_PLACE_BYTES`] or more into a pooled buffer of its own
    /// (the frame's, freed to the pool when the last slice of its body is dropped), to be read there in
    /// place through [`Self::frame_space`].
    pub fn with_frame_buffers(max_body_bytes: u32) -> Self {
        PeerFrameReader { frame_buffers: true, ..Self::new(max_body_bytes) }
    }

    /// Adds bytes read from the connection.
    pub fn extend(&mut self, mut bytes: &[u8]) {
        if let Some(frame) = &mut self.in_place {
            let n = (frame.len - frame.body.buf().len()).min(bytes.len());
            frame.body.buf_mut().extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Room for the rest of the body being received in place, exactly what it still lacks (so a read
    /// never runs into the next frame); `None` when no such body is under way. Bytes read into it are
    /// counted with [`Self::frame_filled`].
    pub fn frame_space(&mut self) -> Option<&mut [u8]> {
        let frame = self.in_place.as_mut()?;
        let missing = frame.len - frame.body.buf().len();
        (missing > 0).then(|| &mut frame.body.buf_mut().spare_mut()[..missing])
    }

    /// Counts `n` bytes read into [`Self::frame_space`].
    pub fn frame_filled(&mut self, n: usize) {
        let frame = self.in_place.as_mut().expect("a body under way in place");
        assert!(frame.body.buf().len() + n <= frame.len, "more bytes than the body lacks");
        frame.body.buf_mut().fill(n);
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len() + self.in_place.as_ref().map_or(0, |f| HEADER_BYTES + f.body.buf().len())
    }

    /// The body length of the frame whose header has arrived (and passed its checks, see
    /// [`PeerFrameReader::next_frame`]) but whose body has not, all of it.
    pub fn announced(&self) -> Option<usize> {
        if let Some(frame) = &self.in_place {
            return (frame.body.buf().len() < frame.len).then_some(frame.len);
        }
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
        self.next_unchecked()?.map(UncheckedFrame::check).transpose()
    }

    /// [`Self::next_frame`] without the CRC check, which the caller makes (see [`UncheckedFrame`]).
    pub fn next_unchecked(&mut self) -> Result<Option<UncheckedFrame>, PeerFrameError> {
        if let Some(frame) = &self.in_place {
            if frame.body.buf().len() < frame.len {
                return Ok(None);
            }
            let InPlace { head, kind, claimed, body, .. } = self.in_place.take().expect("checked above");
            return Ok(Some(UncheckedFrame { kind, head, claimed, body: Bytes::from_owner(body) }));
        }
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
        let claimed = field(12);
        let head: [u8; 12] = self.buf[..12].try_into().expect("12 bytes");
        let total = HEADER_BYTES + len as usize;
        if self.frame_buffers && len as usize >= IN_PLACE_BYTES && self.buf.len() < total {
            // The mapping takes memory only as the body's bytes arrive.
            let body =
                PooledBuf::take(len as usize).map_err(|e| PeerFrameError::NoMemory { len, error: e.to_string() })?;
            self.buf.advance(HEADER_BYTES);
            let arrived = self.buf.split_to(self.buf.len());
            self.in_place = Some(InPlace { head, kind, claimed, len: len as usize, body });
            self.extend(&arrived);
            return self.next_unchecked();
        }
        if self.buf.len() < total {
            return Ok(None);
        }
        self.buf.advance(HEADER_BYTES);
        let body = self.buf.split_to(len as usize).freeze();
        Ok(Some(UncheckedFrame { kind, head, claimed, body }))
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
