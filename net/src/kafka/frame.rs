//! Size-prefixed Kafka frames: a 4-byte big-endian length, then that many bytes.
//!
//! The length is checked against a bound before anything is buffered for it, so a client claiming a
//! 2 GiB frame is refused at once rather than waited for.

use bytes::{Buf, Bytes, BytesMut};

/// The most a reader sets aside for a frame before its bytes arrive.
const RESERVE_MAX_BYTES: usize = 8 << 20;

/// Why the byte stream cannot be read as frames. Either way the connection must be closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    #[error("frame length {0} is negative")]
    Negative(i32),
    #[error("frame of {size} bytes exceeds the {max}-byte limit (socket.request.max.bytes)")]
    TooLarge { size: usize, max: usize },
}

/// Splits a byte stream into frames.
#[derive(Debug)]
pub struct FrameReader {
    buf: BytesMut,
    max_frame_bytes: usize,
}

impl FrameReader {
    /// A reader refusing frames larger than `max_frame_bytes` (Kafka's `socket.request.max.bytes`,
    /// default 100 MiB).
    pub fn new(max_frame_bytes: usize) -> Self {
        FrameReader { buf: BytesMut::new(), max_frame_bytes }
    }

    /// Adds bytes read from the connection.
    pub fn extend(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete frame's body, `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Bytes>, FrameError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let claimed = i32::from_be_bytes(self.buf[..4].try_into().expect("4 bytes"));
        if claimed < 0 {
            return Err(FrameError::Negative(claimed));
        }
        let size = claimed as usize;
        if size > self.max_frame_bytes {
            return Err(FrameError::TooLarge { size, max: self.max_frame_bytes });
        }
        if self.buf.len() < 4 + size {
            // Room for the rest of the frame, so it arrives without the buffer growing (and copying)
            // step by step; beyond RESERVE_MAX_BYTES the buffer grows with what really arrives, so a
            // client announcing large frames and sending little costs little.
            let wanted = (4 + size).min(RESERVE_MAX_BYTES);
            if self.buf.capacity() < wanted {
                self.buf.reserve(wanted - self.buf.len());
            }
            return Ok(None);
        }
        self.buf.advance(4);
        Ok(Some(self.buf.split_to(size).freeze()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_split_across_reads_and_back_to_back() {
        let mut r = FrameReader::new(100);
        r.extend(&[0, 0, 0, 3, b'a']);
        assert_eq!(r.next_frame(), Ok(None));
        r.extend(&[b'b', b'c', 0, 0, 0, 1, b'd', 0, 0]);
        assert_eq!(r.next_frame(), Ok(Some(Bytes::from_static(b"abc"))));
        assert_eq!(r.next_frame(), Ok(Some(Bytes::from_static(b"d"))));
        assert_eq!(r.next_frame(), Ok(None));
        assert_eq!(r.buffered(), 2);
    }

    #[test]
    fn oversized_and_negative_lengths_are_refused_before_buffering() {
        let mut r = FrameReader::new(1 << 20);
        r.extend(&0x8000_0000u32.to_be_bytes());
        assert_eq!(r.next_frame(), Err(FrameError::Negative(i32::MIN)));
        let mut r = FrameReader::new(1 << 20);
        r.extend(&0x7FFF_FFFFu32.to_be_bytes());
        assert_eq!(r.next_frame(), Err(FrameError::TooLarge { size: 0x7FFF_FFFF, max: 1 << 20 }));
        assert!(r.buf.capacity() < 1 << 20, "nothing was reserved for the refused frame");
    }
}
