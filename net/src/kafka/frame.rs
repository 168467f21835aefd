//! Size-prefixed Kafka frames: a 4-byte big-endian length, then that many bytes.
//!
//! The length is checked against a bound before anything is buffered for it, so a client claiming a
//! 2 GiB frame is refused at once rather than waited for.

use bytes::{Buf, Bytes, BytesMut};

use crate::pool::{LARGE_FRAME_BYTES, PooledBuf};

/// Why the byte stream cannot be read as frames. Either way the connection must be closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FrameError {
    #[error("frame length {0} is negative")]
    Negative(i32),
    #[error("frame of {size} bytes exceeds the {max}-byte limit ({setting})")]
    TooLarge { size: usize, max: usize, setting: &'static str },
    #[error("no memory for a frame of {size} bytes: {error}")]
    NoMemory { size: usize, error: String },
}

/// Splits a byte stream into frames.
///
/// A frame smaller than [`LARGE_FRAME_BYTES`] is cut from the connection's buffer; a larger one is read
/// into a pooled buffer of its own ([`crate::pool`]), so its memory goes back once it is answered.
#[derive(Debug)]
pub struct FrameReader {
    buf: BytesMut,
    /// The large frame being received: its announced size and the buffer its bytes go to.
    large: Option<(usize, PooledBuf)>,
    max_frame_bytes: usize,
    /// The setting the limit comes from, for the error.
    setting: &'static str,
}

impl FrameReader {
    /// A reader refusing frames larger than `max_frame_bytes` (Kafka's `socket.request.max.bytes`,
    /// default 100 MiB).
    pub fn new(max_frame_bytes: usize) -> Self {
        FrameReader { buf: BytesMut::new(), large: None, max_frame_bytes, setting: "socket.request.max.bytes" }
    }

    /// Changes the limit for frames whose size has not arrived yet: a SASL listener bounds frames by
    /// `sasl.server.max.receive.size` until the client has authenticated.
    pub fn set_limit(&mut self, max_frame_bytes: usize, setting: &'static str) {
        self.max_frame_bytes = max_frame_bytes;
        self.setting = setting;
    }

    /// Adds bytes read from the connection.
    pub fn extend(&mut self, mut bytes: &[u8]) {
        if let Some((size, frame)) = &mut self.large {
            let n = (*size - frame.buf().len()).min(bytes.len());
            frame.buf_mut().extend_from_slice(&bytes[..n]);
            bytes = &bytes[n..];
        }
        self.buf.extend_from_slice(bytes);
    }

    /// Room for the rest of the large frame being received, to read it in place rather than through
    /// [`Self::extend`] (which copies); exactly what the frame still lacks, so a read never runs into the
    /// next frame. `None` when no large frame is under way.
    pub fn large_frame_space(&mut self) -> Option<&mut [u8]> {
        let (size, frame) = self.large.as_mut()?;
        let missing = *size - frame.buf().len();
        (missing > 0).then(|| &mut frame.buf_mut().spare_mut()[..missing])
    }

    /// Counts `n` bytes read into [`Self::large_frame_space`].
    pub fn large_frame_filled(&mut self, n: usize) {
        let (size, frame) = self.large.as_mut().expect("a large frame under way");
        assert!(frame.buf().len() + n <= *size, "more bytes than the large frame lacks");
        frame.buf_mut().fill(n);
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len() + self.large.as_ref().map_or(0, |(_, frame)| frame.buf().len())
    }

    /// The size of the frame whose length has arrived but whose body has not, all of it.
    pub fn announced(&self) -> Option<usize> {
        if let Some((size, _)) = &self.large {
            return Some(*size);
        }
        let claimed = i32::from_be_bytes(self.buf.get(..4)?.try_into().expect("4 bytes"));
        let size = usize::try_from(claimed).ok()?;
        (self.buf.len() < 4 + size).then_some(size)
    }

    /// The next complete frame's body, `Ok(None)` if more bytes are needed.
    pub fn next_frame(&mut self) -> Result<Option<Bytes>, FrameError> {
        if let Some((size, frame)) = &self.large {
            if frame.buf().len() < *size {
                return Ok(None);
            }
            let (_, frame) = self.large.take().expect("checked above");
            return Ok(Some(Bytes::from_owner(frame)));
        }
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let claimed = i32::from_be_bytes(self.buf[..4].try_into().expect("4 bytes"));
        if claimed < 0 {
            return Err(FrameError::Negative(claimed));
        }
        let size = claimed as usize;
        if size > self.max_frame_bytes {
            return Err(FrameError::TooLarge { size, max: self.max_frame_bytes, setting: self.setting });
        }
        if size >= LARGE_FRAME_BYTES {
            // The mapping takes memory only as the frame's bytes arrive.
            let frame = PooledBuf::take(size).map_err(|e| FrameError::NoMemory { size, error: e.to_string() })?;
            self.buf.advance(4);
            let body = self.buf.split_to(self.buf.len().min(size));
            self.large = Some((size, frame));
            self.extend(&body);
            return self.next_frame();
        }
        if self.buf.len() < 4 + size {
            // Room for the rest of the frame, so it arrives without the buffer growing (and copying)
            // step by step.
            if self.buf.capacity() < 4 + size {
                self.buf.reserve(4 + size - self.buf.len());
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
        assert_eq!(
            r.next_frame(),
            Err(FrameError::TooLarge { size: 0x7FFF_FFFF, max: 1 << 20, setting: "socket.request.max.bytes" })
        );
        assert!(r.buf.capacity() < 1 << 20, "nothing was reserved for the refused frame");
    }

    #[test]
    fn a_large_frame_arrives_in_a_buffer_of_its_own_and_the_next_frame_follows_it() {
        let size = LARGE_FRAME_BYTES + 5;
        let body: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        let mut stream = (size as u32).to_be_bytes().to_vec();
        stream.extend_from_slice(&body);
        stream.extend_from_slice(&[0, 0, 0, 2, b'x', b'y']);
        let mut r = FrameReader::new(LARGE_FRAME_BYTES * 2);
        assert_eq!(r.announced(), None);
        let mut frames = Vec::new();
        for chunk in stream.chunks(64 << 10) {
            r.extend(chunk);
            while let Some(frame) = r.next_frame().unwrap() {
                frames.push(frame);
            }
            if frames.is_empty() {
                assert_eq!(r.announced(), Some(size), "the large frame is announced until it is whole");
            }
        }
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0], body);
        assert_eq!(&frames[1][..], b"xy");
        assert_eq!(r.buffered(), 0);
        assert_eq!(r.announced(), None);
    }

    #[test]
    fn a_large_frame_read_in_place_stops_at_its_end_and_the_next_frames_follow() {
        // As the connection reads: into the large frame's own buffer while one is under way (a reused
        // buffer holding an earlier frame's bytes, too), otherwise into a read buffer.
        for round in 0..2 {
            let size = LARGE_FRAME_BYTES + 7 + round;
            let body: Vec<u8> = (0..size).map(|i| ((i + round) % 253) as u8).collect();
            let mut stream = (size as u32).to_be_bytes().to_vec();
            stream.extend_from_slice(&body);
            stream.extend_from_slice(&[0, 0, 0, 2, b'x', b'y', 0, 0, 0, 1, b'z']);
            let mut r = FrameReader::new(LARGE_FRAME_BYTES * 2);
            let (mut at, mut frames, mut in_place) = (0, Vec::new(), 0);
            while at < stream.len() {
                let unread = &stream[at..];
                let n = match r.large_frame_space() {
                    Some(space) => {
                        assert!(space.len() <= size, "no more room than the frame lacks");
                        let n = space.len().min(unread.len()).min(300 << 10);
                        space[..n].copy_from_slice(&unread[..n]);
                        r.large_frame_filled(n);
                        in_place += n;
                        n
                    }
                    None => {
                        let n = unread.len().min(64 << 10);
                        r.extend(&unread[..n]);
                        n
                    }
                };
                at += n;
                while let Some(frame) = r.next_frame().unwrap() {
                    frames.push(frame);
                }
            }
            assert_eq!(in_place, size - ((64 << 10) - 4), "all but the first read's share went in place");
            assert_eq!(frames.len(), 3);
            assert_eq!(frames[0], body);
            assert_eq!((&frames[1][..], &frames[2][..]), (&b"xy"[..], &b"z"[..]));
            assert_eq!((r.buffered(), r.large_frame_space().map(|s| s.len())), (0, None));
        }
    }
}
