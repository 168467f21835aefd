//! Response frames kept as pieces, so that a Fetch answer's record bytes go to the socket from where the
//! log read put them instead of being copied into one buffer the size of the answer.
//!
//! The crate's encoder writes a `bytes` field with one `put_slice` of the field's whole contents. The
//! encoding buffer here ([`PieceBuf`]) is told beforehand which `Bytes` the response carries (the
//! partitions' records); a `put_slice` that is one of them, or a part of one, ends the current piece and
//! adds that slice as a piece of its own, sharing its memory. Everything else (the header, the fields
//! around the records, small record sets) is copied into the current piece as usual.

use std::ops::Range;

use bytes::buf::UninitSlice;
use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::protocol::buf::ByteBufMut;

/// Record bytes shorter than this are copied into the frame: one more piece to write costs more than the
/// copy of a small set.
pub const SHARED_MIN_BYTES: usize = 64 << 10;

/// An encoded response frame, size prefix included: its bytes in order, as one or more pieces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResponseFrame {
    pieces: Vec<Bytes>,
    len: usize,
}

impl ResponseFrame {
    pub(super) fn new(pieces: Vec<Bytes>) -> Self {
        let len = pieces.iter().map(Bytes::len).sum();
        ResponseFrame { pieces, len }
    }

    /// `payload` framed by its size: a SASL token as SaslHandshake v0's clients read it (no Kafka
    /// response header).
    pub fn raw(payload: &[u8]) -> Self {
        let mut frame = BytesMut::with_capacity(4 + payload.len());
        frame.extend_from_slice(&(payload.len() as i32).to_be_bytes());
        frame.extend_from_slice(payload);
        ResponseFrame::new(vec![frame.freeze()])
    }

    /// Bytes in the frame, size prefix included.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The frame's bytes in order; write them one after the other.
    pub fn pieces(&self) -> &[Bytes] {
        &self.pieces
    }

    /// The whole frame in one buffer (a copy when it has more than one piece).
    pub fn to_bytes(&self) -> Bytes {
        match self.pieces.as_slice() {
            [one] => one.clone(),
            pieces => {
                let mut all = BytesMut::with_capacity(self.len);
                pieces.iter().for_each(|p| all.extend_from_slice(p));
                all.freeze()
            }
        }
    }
}

/// The encoder's buffer: written bytes go into `current`; a `put_slice` of a part of one of `shareable`
/// (at least [`SHARED_MIN_BYTES`] long) becomes a piece of its own.
pub(super) struct PieceBuf {
    done: Vec<Bytes>,
    done_len: usize,
    current: BytesMut,
    shareable: Vec<Bytes>,
}

impl PieceBuf {
    /// A buffer that goes on from `start`.
    pub(super) fn new(start: BytesMut, shareable: Vec<Bytes>) -> Self {
        let shareable = shareable.into_iter().filter(|b| b.len() >= SHARED_MIN_BYTES).collect();
        PieceBuf { done: Vec::new(), done_len: 0, current: start, shareable }
    }

    /// Bytes written so far.
    pub(super) fn len(&self) -> usize {
        self.done_len + self.current.len()
    }

    pub(super) fn into_pieces(mut self) -> Vec<Bytes> {
        self.end_piece();
        self.done
    }

    /// The shared slice `src` is, if it is a part of one of the shareable buffers.
    fn shared(&self, src: &[u8]) -> Option<Bytes> {
        if src.len() < SHARED_MIN_BYTES {
            return None;
        }
        let (start, end) = (src.as_ptr() as usize, src.as_ptr() as usize + src.len());
        self.shareable
            .iter()
            .find(|b| {
                let from = b.as_ptr() as usize;
                from <= start && end <= from + b.len()
            })
            .map(|b| b.slice_ref(src))
    }

    fn end_piece(&mut self) {
        if !self.current.is_empty() {
            let piece = self.current.split().freeze();
            self.done_len += piece.len();
            self.done.push(piece);
        }
    }

    /// `r` (positions in the whole frame) as positions in the current piece: only bytes not yet ended can be
    /// revisited (the crate's message encoders never reach back across a bytes field).
    fn in_current(&self, r: Range<usize>) -> Range<usize> {
        assert!(
            r.start >= self.done_len,
            "encoder reached back {} bytes into a finished piece",
            self.done_len - r.start
        );
        r.start - self.done_len..r.end - self.done_len
    }
}

// SAFETY: every method forwards to `current`, a `BytesMut`, whose implementation upholds the trait's
// contract; `put_slice` only appends (to `current` or as a whole piece).
unsafe impl BufMut for PieceBuf {
    fn remaining_mut(&self) -> usize {
        self.current.remaining_mut()
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        // SAFETY: the caller initialised `cnt` bytes of `chunk_mut`, which is `current`'s.
        unsafe { self.current.advance_mut(cnt) }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        self.current.chunk_mut()
    }

    fn put_slice(&mut self, src: &[u8]) {
        match self.shared(src) {
            Some(piece) => {
                self.end_piece();
                self.done_len += piece.len();
                self.done.push(piece);
            }
            None => self.current.extend_from_slice(src),
        }
    }
}

impl ByteBufMut for PieceBuf {
    fn offset(&self) -> usize {
        self.len()
    }

    fn seek(&mut self, offset: usize) {
        let at = self.in_current(offset..offset).start;
        self.current.resize(at, 0);
    }

    fn range(&mut self, r: Range<usize>) -> &mut [u8] {
        let r = self.in_current(r);
        &mut self.current[r]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slice_of_a_shareable_buffer_becomes_its_own_piece_sharing_its_memory() {
        let records = Bytes::from(vec![7u8; 3 * SHARED_MIN_BYTES]);
        let mut buf = PieceBuf::new(BytesMut::new(), vec![records.clone()]);
        buf.put_i32(5);
        buf.put_slice(&records[10..10 + 2 * SHARED_MIN_BYTES]);
        buf.put_u8(1);
        assert_eq!(buf.offset(), 4 + 2 * SHARED_MIN_BYTES + 1);
        let pieces = buf.into_pieces();
        assert_eq!(pieces.len(), 3);
        assert_eq!(&pieces[0][..], &5i32.to_be_bytes());
        assert_eq!(pieces[1].as_ptr(), records[10..].as_ptr(), "the records piece is the read's memory, not a copy");
        assert_eq!(pieces[1].len(), 2 * SHARED_MIN_BYTES);
        assert_eq!(&pieces[2][..], &[1]);
    }

    #[test]
    fn small_slices_and_unknown_memory_are_copied_into_the_current_piece() {
        let small = Bytes::from(vec![1u8; SHARED_MIN_BYTES - 1]);
        let other = vec![2u8; 2 * SHARED_MIN_BYTES];
        let mut buf = PieceBuf::new(BytesMut::new(), vec![small.clone()]);
        buf.put_slice(&small);
        buf.put_slice(&other);
        let pieces = buf.into_pieces();
        assert_eq!(pieces.len(), 1);
        assert_eq!(pieces[0].len(), small.len() + other.len());
    }

    #[test]
    fn a_gap_filled_later_lands_in_the_current_piece() {
        let mut buf = PieceBuf::new(BytesMut::new(), Vec::new());
        buf.put_u8(9);
        let gap = buf.put_gap(4);
        buf.put_u8(8);
        buf.gap_buf(gap).copy_from_slice(&[1, 2, 3, 4]);
        assert_eq!(&buf.into_pieces()[0][..], &[9, 1, 2, 3, 4, 8]);
    }
}
