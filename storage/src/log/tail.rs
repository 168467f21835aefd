//! The active segment's in-memory tail: its bytes from a block-aligned file position to its end, kept in
//! direct-write buffers (blocks) so that a write-out hands them to the disk as they are, without copying
//! them into write buffers first.
//!
//! Every block starts at a block-aligned file position, and each holds the bytes from there up to where
//! the next one starts. An append copies the batch into the last block if it has room; otherwise a new
//! block starts at the block boundary at or below the end, taking over the partial last file block (at
//! most `ALIGN` bytes, copied) so that its writes stay aligned.
//!
//! A large write-out seals the blocks it writes: the disk reads them while readers go on reading them, and
//! nothing writes to them again; appends after it go to a new block, with room for half as much again as
//! the write-out took, so a partition whose write-outs are alike mostly fills its blocks. A small
//! write-out is copied into write buffers, and its block goes on taking appends. The cache is bounded by
//! the memory its blocks hold, not by the bytes in them.

use std::collections::VecDeque;
use std::ops::Range;
use std::rc::Rc;

use crate::batch;
use crate::fs::{ALIGN, DirectBuf, WriteBuf, align_down, align_up};
use crate::types::{LeaderEpoch, Offset};

/// A write-out of at least this much (one that is not small: `durability::SMALL_WRITE_OUT_BYTES`) goes
/// from the blocks as they are. A smaller one is copied into write buffers, as its copy costs less than
/// giving it blocks of its own: a block for each small write-out is an allocation from the heap (the
/// ring's registered memory is for short-lived buffers), and its pages are pinned for the write, where the
/// write buffers come from registered memory.
const SHARED_WRITE_OUT_BYTES: usize = super::durability::SMALL_WRITE_OUT_BYTES as usize;
/// The least a new block holds.
const MIN_BLOCK_BYTES: usize = 8 << 10;
/// The most a new block holds beyond what the batch that starts it needs.
const MAX_BLOCK_BYTES: usize = 1 << 20;

#[derive(Debug)]
struct Block<B> {
    /// Block-aligned file position of the first byte.
    pos: u64,
    /// Bytes of data from `pos`.
    len: usize,
    /// Bytes allocated.
    cap: usize,
    buf: Rc<B>,
    /// Handed to a write (or written): never written to again. Until then the block is not shared and
    /// appends may write into the room past its data.
    sealed: bool,
}

impl<B: DirectBuf> Block<B> {
    fn end(&self) -> u64 {
        self.pos + self.len as u64
    }

    fn bytes(&self) -> &[u8] {
        &(*self.buf).as_ref()[..self.len]
    }

    /// The buffer of a block not sealed.
    fn open_buf(&mut self) -> &mut B {
        assert!(!self.sealed, "a sealed block is never written to again");
        Rc::get_mut(&mut self.buf).expect("a block not sealed is not shared")
    }
}

/// See the module documentation.
#[derive(Debug)]
pub(super) struct Tail<B> {
    /// Block-aligned file position of the first cached byte.
    pub(super) start: u64,
    blocks: VecDeque<Block<B>>,
    /// Bytes cached: the file's bytes `[start, start + len)`.
    len: u64,
    /// Bytes the blocks hold allocated.
    held: usize,
    /// File bytes `[0, written)` hold the segment's data.
    pub(super) written: u64,
    /// Bytes from here on were appended by this process (checked as they came in); those before it were
    /// read back from the disk when the tail was set up.
    pub(super) appended_from: u64,
    /// Bytes the last write-out took (those appended since the one before).
    last_write_out: usize,
}

impl<B> Default for Tail<B> {
    fn default() -> Tail<B> {
        Tail { start: 0, blocks: VecDeque::new(), len: 0, held: 0, written: 0, appended_from: 0, last_write_out: 0 }
    }
}

impl<B: DirectBuf> Tail<B> {
    /// A tail whose bytes from `start` to `written` were read back from the disk; appends go on from
    /// `written`.
    pub(super) fn from_disk(start: u64, bytes: &[u8], written: u64, alloc: impl FnOnce(usize) -> B) -> Tail<B> {
        let mut tail = Tail { start, written, appended_from: written, ..Tail::default() };
        if !bytes.is_empty() {
            let cap = align_up(bytes.len() as u64) as usize;
            let mut buf = alloc(cap);
            buf.as_mut()[..bytes.len()].copy_from_slice(bytes);
            tail.push_block(Block { pos: start, len: bytes.len(), cap, buf: Rc::new(buf), sealed: false });
        }
        tail
    }

    /// The file position just past the last cached byte (the segment's size).
    pub(super) fn end(&self) -> u64 {
        self.start + self.len
    }

    /// Memory the blocks hold.
    pub(super) fn held_bytes(&self) -> usize {
        self.held
    }

    fn push_block(&mut self, block: Block<B>) {
        self.len += block.len as u64;
        self.held += block.cap;
        self.blocks.push_back(block);
    }

    /// The cached bytes from file position `from` on, block by block, each with its file position.
    pub(super) fn slices_from(&self, from: u64) -> impl Iterator<Item = (u64, &[u8])> {
        assert!(from >= self.start, "bytes at {from} are no longer cached (from {})", self.start);
        self.blocks.iter().filter(move |b| b.end() > from).map(move |b| {
            let skip = from.saturating_sub(b.pos) as usize;
            (b.pos + skip as u64, &b.bytes()[skip..])
        })
    }

    /// Copies the cached bytes from file position `from` into `out`.
    pub(super) fn copy_out(&self, from: u64, out: &mut [u8]) {
        let mut done = 0;
        for (_, bytes) in self.slices_from(from) {
            let n = bytes.len().min(out.len() - done);
            out[done..done + n].copy_from_slice(&bytes[..n]);
            done += n;
            if done == out.len() {
                return;
            }
        }
        assert_eq!(done, out.len(), "bytes past the tail's end were asked for");
    }

    /// The cached bytes of the file range `range`.
    pub(super) fn to_vec(&self, range: Range<u64>) -> Vec<u8> {
        let mut out = vec![0; (range.end - range.start) as usize];
        self.copy_out(range.start, &mut out);
        out
    }

    /// Appends `batch` with its base offset and leader epoch stamped in; a new block, if one is needed,
    /// comes from `alloc`.
    pub(super) fn push_stamped(
        &mut self,
        batch: &[u8],
        base: Offset,
        epoch: LeaderEpoch,
        alloc: impl FnOnce(usize) -> B,
    ) {
        let room = match self.blocks.back() {
            Some(block) if !block.sealed => block.cap - block.len,
            _ => 0,
        };
        if room < batch.len() {
            self.start_block(batch.len(), alloc);
        }
        let block = self.blocks.back_mut().expect("a block with room");
        let len = block.len;
        let into = &mut block.open_buf().as_mut()[len..len + batch.len()];
        into.copy_from_slice(batch);
        batch::stamp(into, base, epoch);
        block.len += batch.len();
        self.len += batch.len() as u64;
    }

    /// Starts a block at the block boundary at or below the end, with room for `more` bytes after the
    /// partial last file block, which it takes over from the block before.
    fn start_block(&mut self, more: usize, alloc: impl FnOnce(usize) -> B) {
        let end = self.end();
        // An empty tail starts where it stands (block-aligned, except a rolled segment's momentary tail).
        let pos = if self.blocks.is_empty() { end } else { align_down(end) };
        let carry = (end - pos) as usize;
        // After a large write-out, room for half as much again, so the next write-out mostly fills the
        // block it seals. Otherwise twice the last block: a quiet partition holds little (a broker may
        // have thousands), a busy one soon has large blocks that take many small write-outs each.
        let wanted = match self.last_write_out {
            large if large >= SHARED_WRITE_OUT_BYTES => large + large / 2,
            _ => 2 * self.blocks.back().map_or(0, |b| b.cap),
        }
        .clamp(MIN_BLOCK_BYTES, MAX_BLOCK_BYTES);
        let cap = align_up((carry + more.max(wanted)) as u64) as usize;
        let mut buf = alloc(cap);
        if carry > 0 {
            let last = self.blocks.back_mut().expect("the partial block is cached");
            let keep = last.len - carry;
            buf.as_mut()[..carry].copy_from_slice(&last.bytes()[keep..]);
            last.len = keep;
            self.len -= carry as u64;
            if keep == 0 {
                let gone = self.blocks.pop_back().expect("the last block");
                self.held -= gone.cap;
            }
        }
        self.push_block(Block { pos, len: carry, cap, buf: Rc::new(buf), sealed: false });
    }

    /// The writes that put the cached bytes from `align_down(written)` to the end on the disk, each of
    /// whole file blocks (the last zero-padded). In a write-out of at least `SHARED_WRITE_OUT_BYTES`,
    /// blocks not yet written at all go as they are, sealed (the next append starts a new block). The rest
    /// (a small write-out, bytes of a block written before) are copied into buffers from `alloc`, in
    /// pieces of at most `chunk` bytes.
    pub(super) fn writes(&mut self, chunk: usize, mut alloc: impl FnMut(usize) -> B) -> Vec<(WriteBuf<B>, u64)> {
        let first = align_down(self.written);
        assert!(first >= self.start, "unwritten data was dropped from the tail");
        self.last_write_out = (self.end() - self.written) as usize;
        let share = self.last_write_out >= SHARED_WRITE_OUT_BYTES;
        let mut writes = Vec::new();
        for block in self.blocks.iter_mut() {
            if block.end() <= first {
                continue;
            }
            if share && !block.sealed && block.pos >= first {
                let (len, padded) = (block.len, align_up(block.len as u64) as usize);
                let buf = block.open_buf();
                buf.as_mut()[len..padded].fill(0);
                buf.truncate(padded);
                block.sealed = true;
                writes.push((WriteBuf::Shared(block.buf.clone()), block.pos));
                continue;
            }
            let mut pos = first.max(block.pos);
            while pos < block.end() {
                let len = ((block.end() - pos) as usize).min(chunk);
                let mut buf = alloc(align_up(len as u64) as usize);
                let from = (pos - block.pos) as usize;
                buf.as_mut()[..len].copy_from_slice(&block.bytes()[from..from + len]);
                buf.as_mut()[len..].fill(0);
                writes.push((WriteBuf::Owned(buf), pos));
                pos += len as u64;
            }
        }
        writes
    }

    /// Drops whole blocks from the front, already on the disk, while the rest hold at least `keep` bytes
    /// of memory. A single block holding far more than `keep` bytes (a small cache) is cut down to its last
    /// `keep` bytes, copied.
    pub(super) fn trim(&mut self, keep: u64, alloc: impl FnOnce(usize) -> B) {
        let on_disk = align_down(self.written);
        while self.blocks.len() > 1 {
            let front = &self.blocks[0];
            if front.end() > on_disk || ((self.held - front.cap) as u64) < keep {
                break;
            }
            let gone = self.blocks.pop_front().expect("a front block");
            self.len -= gone.len as u64;
            self.held -= gone.cap;
            self.start = self.blocks[0].pos;
        }
        if self.blocks.len() == 1 && self.held as u64 >= 2 * keep + ALIGN {
            let from = align_down(self.end().saturating_sub(keep)).min(on_disk);
            if from > self.start {
                self.keep_from(from, alloc);
            }
        }
    }

    /// Keeps only what is not on the disk yet: the partial last file block (which the next write-out
    /// rewrites) and whatever was appended after the last write-out, in a block of its own.
    pub(super) fn release(&mut self, alloc: impl FnOnce(usize) -> B) {
        self.keep_from(align_down(self.written).max(self.start), alloc);
    }

    /// Keeps the cached bytes from `from` (block-aligned) on, copied into a block of their own.
    fn keep_from(&mut self, from: u64, alloc: impl FnOnce(usize) -> B) {
        let kept = self.to_vec(from..self.end());
        let (written, appended_from, last_write_out) = (self.written, self.appended_from, self.last_write_out);
        *self = Tail { appended_from, last_write_out, ..Tail::from_disk(from, &kept, written, alloc) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alloc(n: usize) -> Vec<u8> {
        vec![0xAA; n]
    }

    /// A batch-like run of bytes: 16 bytes of header (stamped over) and a body of `n` bytes.
    fn batch(n: usize, fill: u8) -> Vec<u8> {
        vec![fill; 16 + n]
    }

    fn stamped(batch: &[u8], base: u64, epoch: i32) -> Vec<u8> {
        let mut b = batch.to_vec();
        batch::stamp(&mut b, Offset(base), LeaderEpoch(epoch));
        b
    }

    /// Applies writes to a file image, as the disk would.
    fn apply(file: &mut Vec<u8>, writes: &[(WriteBuf<Vec<u8>>, u64)]) {
        for (buf, pos) in writes {
            let bytes = buf.as_ref();
            assert!(pos.is_multiple_of(ALIGN) && (bytes.len() as u64).is_multiple_of(ALIGN));
            let end = *pos as usize + bytes.len();
            if file.len() < end {
                file.resize(end, 0);
            }
            file[*pos as usize..end].copy_from_slice(bytes);
        }
    }

    #[test]
    fn appends_across_blocks_read_back_and_write_out_as_the_bytes_appended() {
        let mut tail = Tail::<Vec<u8>>::default();
        let mut want = Vec::new();
        let mut file = Vec::new();
        let (mut shared, mut copied) = (0, 0);
        let sizes = [100usize, 5000, 20_000, 3, 70_000, 4080, 1 << 20, 17, 300_000, 9];
        for (i, &n) in sizes.iter().cycle().take(60).enumerate() {
            let b = batch(n, i as u8);
            tail.push_stamped(&b, Offset(i as u64 * 7), LeaderEpoch(2), alloc);
            want.extend(stamped(&b, i as u64 * 7, 2));
            assert_eq!(tail.end(), want.len() as u64);
            if i % 3 == 2 {
                let writes = tail.writes(1 << 20, alloc);
                for (w, _) in &writes {
                    match w {
                        WriteBuf::Shared(b) => shared += b.len(),
                        WriteBuf::Owned(b) => copied += b.len(),
                    }
                }
                apply(&mut file, &writes);
                tail.written = tail.end();
                assert_eq!(&file[..want.len()], &want[..], "after append {i}");
                tail.trim(64 << 10, alloc);
            }
            let from = tail.start;
            assert_eq!(tail.to_vec(from..tail.end()), want[from as usize..], "after append {i}");
            assert!(tail.start == 0 || tail.held_bytes() >= 64 << 10, "trimmed no further than the cache size");
        }
        assert!(shared > copied, "most bytes went to the disk without a copy: {shared} against {copied}");
        assert!(tail.held_bytes() < 4 << 20, "trimmed: {} bytes held", tail.held_bytes());
    }

    /// Appends `rounds` rounds of `per_write_out` batches of `batch_len` bytes, each round written out;
    /// returns the bytes written from the blocks and those copied.
    fn write_rounds(tail: &mut Tail<Vec<u8>>, rounds: u64, batch_len: usize, per_write_out: u64) -> (usize, usize) {
        let (mut shared, mut copied) = (0, 0);
        for round in 0..rounds {
            for i in 0..per_write_out {
                tail.push_stamped(&batch(batch_len, 1), Offset(round * 10 + i), LeaderEpoch(0), alloc);
            }
            for (w, _) in tail.writes(1 << 20, alloc) {
                match w {
                    WriteBuf::Shared(b) => shared += b.len(),
                    WriteBuf::Owned(b) => copied += b.len(),
                }
            }
            tail.written = tail.end();
            tail.trim(4 << 20, alloc);
        }
        (shared, copied)
    }

    #[test]
    fn a_partition_whose_write_outs_are_large_and_alike_writes_its_blocks_without_copies() {
        for (batch_len, per_write_out) in [(256 << 10, 1), (50 << 10, 3), (1_000_000, 1), (300_000, 2)] {
            let mut tail = Tail::<Vec<u8>>::default();
            let (shared, copied) = write_rounds(&mut tail, 40, batch_len, per_write_out);
            assert!(copied <= 2 * batch_len * per_write_out as usize, "{batch_len} x {per_write_out}: {copied} copied");
            assert!(shared > 30 * batch_len * per_write_out as usize, "{batch_len} x {per_write_out}: {shared} shared");
            let cached = tail.end() - tail.start;
            assert!(tail.held_bytes() as u64 <= 2 * cached + (1 << 20), "{} held for {cached}", tail.held_bytes());
        }
    }

    #[test]
    fn a_quiet_partition_holds_little() {
        let mut tail = Tail::<Vec<u8>>::default();
        write_rounds(&mut tail, 3, 200, 1);
        assert_eq!(tail.held_bytes(), MIN_BLOCK_BYTES);
    }

    #[test]
    fn small_write_outs_are_copied_from_a_few_large_blocks() {
        let mut tail = Tail::<Vec<u8>>::default();
        let (shared, copied) = write_rounds(&mut tail, 400, 16 << 10, 1);
        assert_eq!(shared, 0);
        assert!(copied >= 400 * (16 << 10), "{copied}");
        assert!(tail.blocks.len() <= 8, "{} blocks for {} bytes", tail.blocks.len(), tail.end() - tail.start);
    }

    #[test]
    fn a_sealed_block_is_never_written_to_again_and_a_new_block_carries_its_partial_file_block() {
        let mut tail = Tail::<Vec<u8>>::default();
        tail.push_stamped(&batch(200_000, 1), Offset(0), LeaderEpoch(0), alloc);
        let writes = tail.writes(1 << 20, alloc);
        let [(WriteBuf::Shared(first), 0)] = &writes[..] else { panic!("one whole block written as it is") };
        let before = first.as_ref().clone();
        assert_eq!(before.len(), align_up(200_016) as usize);
        tail.written = tail.end();
        tail.push_stamped(&batch(100, 2), Offset(1), LeaderEpoch(0), alloc);
        assert_eq!(first.as_ref(), &before, "the written block did not change");
        // The next write-out starts at the partial block, now in the new block with the new batch.
        let writes = tail.writes(1 << 20, alloc);
        assert_eq!(writes.len(), 1);
        assert_eq!(writes[0].1, align_down(200_016));
        let mut want = stamped(&batch(200_000, 1), 0, 0);
        want.extend(stamped(&batch(100, 2), 1, 0));
        let from = align_down(200_016) as usize;
        assert_eq!(&writes[0].0.as_ref()[..want.len() - from], &want[from..]);
    }

    #[test]
    fn a_small_write_out_is_copied_and_its_block_goes_on_taking_appends() {
        let mut tail = Tail::<Vec<u8>>::default();
        tail.push_stamped(&batch(100, 1), Offset(0), LeaderEpoch(0), alloc);
        let writes = tail.writes(1 << 20, alloc);
        assert!(matches!(writes[..], [(WriteBuf::Owned(_), 0)]), "copied");
        tail.written = tail.end();
        tail.push_stamped(&batch(100, 2), Offset(1), LeaderEpoch(0), alloc);
        assert_eq!(tail.blocks.len(), 1, "the same block took the append");
        // A large write-out that did not complete (`written` not moved) leaves a sealed block: written
        // again from a copy.
        tail.push_stamped(&batch(1 << 20, 3), Offset(2), LeaderEpoch(0), alloc);
        let cut_short = tail.writes(1 << 20, alloc);
        assert!(cut_short.iter().any(|(w, _)| matches!(w, WriteBuf::Shared(_))));
        let writes = tail.writes(1 << 20, alloc);
        assert!(writes.iter().all(|(w, _)| matches!(w, WriteBuf::Owned(_))), "copied");
        let first_block = align_down(tail.written);
        assert_eq!(writes[0].1, first_block);
        assert_eq!(
            writes.iter().map(|(w, _)| w.as_ref().len() as u64).sum::<u64>(),
            align_up(tail.end()) - first_block
        );
    }

    #[test]
    fn release_keeps_only_the_partial_file_block() {
        let mut tail = Tail::<Vec<u8>>::default();
        for i in 0..50 {
            tail.push_stamped(&batch(10_000, i), Offset(i as u64), LeaderEpoch(0), alloc);
        }
        let want = tail.to_vec(align_down(tail.end())..tail.end());
        tail.written = tail.end();
        tail.release(alloc);
        assert_eq!(tail.held_bytes(), ALIGN as usize);
        assert_eq!(tail.start, align_down(tail.end()));
        assert_eq!(tail.to_vec(tail.start..tail.end()), want);
    }
}
