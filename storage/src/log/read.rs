//! Reading the log: whole batches from an offset (from the in-memory tail when they are recent, from the
//! segment files otherwise), time lookups, and the index check used by tests.

use std::ops::Range;

use bytes::Bytes;

use super::*;

/// Bytes of one segment as read.
struct Chunk {
    bytes: Bytes,
    /// The file position from which the bytes are ones this process appended (still in the in-memory
    /// tail, checked when they came in); `u64::MAX` when none are.
    appended_from: u64,
}

impl Default for Chunk {
    fn default() -> Chunk {
        Chunk { bytes: Bytes::new(), appended_from: u64::MAX }
    }
}

/// The batches a read returns, gathered without copying: runs of consecutive batches are kept as slices of
/// the chunks they were read in, and joined only when a read spans chunks.
#[derive(Default)]
struct Gathered {
    parts: Vec<Bytes>,
    /// Taken bytes of the current chunk not yet in `parts`.
    run: Option<Range<usize>>,
    len: usize,
}

impl Gathered {
    /// Takes `range` of the current chunk (normally right after what was taken from it before).
    fn take(&mut self, chunk: &Bytes, range: Range<usize>) {
        self.len += range.len();
        self.run = Some(match self.run.take() {
            Some(run) if run.end == range.start => run.start..range.end,
            Some(run) => {
                // A batch was skipped between two taken ones (offsets out of order in a damaged file).
                self.parts.push(chunk.slice(run));
                range
            }
            None => range,
        });
    }

    /// The current chunk is about to be replaced: keep what was taken from it.
    fn leave(&mut self, chunk: &Bytes) {
        if let Some(run) = self.run.take() {
            self.parts.push(chunk.slice(run));
        }
    }

    fn finish(mut self) -> Bytes {
        assert!(self.run.is_none(), "a chunk was left without keeping its run");
        match self.parts.len() {
            0 => Bytes::new(),
            1 => self.parts.pop().expect("one part"),
            _ => self.parts.concat().into(),
        }
    }
}

/// Where a read ended: the batch holding `next` starts at `position` of the segment based at `segment`, as
/// long as nothing was removed from the log (`generation`). A consumer's next read starts there instead of
/// at the index entry before its offset (the index is sparse and keyed by last offsets, so that entry is
/// a whole batch early: with large batches, a read of the budget from there would run a batch short and
/// take a second read and a copy to join the two). When the read ended because that batch did not fit its
/// limit, its size is known too: a read from `next` with a limit it does not fit either (a fetch with
/// little room left in its answer) returns nothing at once, without waiting for the disk to say so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ReadHint {
    next: Offset,
    segment: Offset,
    position: u64,
    generation: u64,
    /// The size of the batch at `position`, if the read stopped before it for want of room.
    next_batch_bytes: Option<usize>,
}

impl<F: Fs> PartitionLog<F> {
    /// Reads whole batches from `from` on, up to `max_bytes` (at least one whole batch if any is there).
    pub async fn read(&self, from: Offset, max_bytes: usize) -> Result<LogRead> {
        self.read_until(from, max_bytes, Offset(u64::MAX)).await
    }

    /// Like [`PartitionLog::read`], but returns only batches whose last offset is below `end` (a consumer's
    /// high watermark).
    pub async fn read_until(&self, from: Offset, max_bytes: usize, end: Offset) -> Result<LogRead> {
        self.read_bounded(from, max_bytes, end, true).await
    }

    /// Like [`PartitionLog::read_until`], but never returns more than `max_bytes`: a first batch larger
    /// than that is not read at all (the answer is empty). For all but the first partition of a Kafka
    /// fetch, which may not go over the fetch's limit.
    pub async fn read_until_at_most(&self, from: Offset, max_bytes: usize, end: Offset) -> Result<LogRead> {
        self.read_bounded(from, max_bytes, end, false).await
    }

    async fn read_bounded(
        &self,
        from: Offset,
        max_bytes: usize,
        end: Offset,
        first_batch_whole: bool,
    ) -> Result<LogRead> {
        self.inner.borrow_mut().last_used_ms = self.clock.now_ms();
        loop {
            let generation = self.inner.borrow().generation;
            let read = self.read_once(from, max_bytes, end, first_batch_whole).await;
            if self.inner.borrow().generation == generation {
                // Damage in bytes nothing removed meanwhile: the disk's doing, the log goes offline.
                if let Err(StorageError::Damaged { path, position, offset, reason }) = read {
                    return Err(self.damaged_at(path, position, offset, reason).await);
                }
                return read;
            }
            // Bytes were removed while the read waited for the disk: what it got (or failed on) may be
            // stale. Read again.
        }
    }

    async fn read_once(&self, from: Offset, max_bytes: usize, end: Offset, first_batch_whole: bool) -> Result<LogRead> {
        // A damaged log still serves what lies before its damage; a read that would need the damaged
        // batch is refused.
        let damage = self.inner.borrow().damaged.clone();
        let mut end = end;
        if let Some(damage) = &damage {
            if from >= damage.readable_below {
                return Err(StorageError::Offline(damage.what.clone()));
            }
            end = end.min(damage.readable_below);
        }
        let (log_start, log_end, mut seg_idx, generation, mut hint) = {
            let inner = self.inner.borrow();
            let hint = inner.read_hint.filter(|h| h.next == from && h.generation == inner.generation);
            (inner.log_start, inner.log_end(), inner.segment_for(from), inner.generation, hint)
        };
        if from < log_start || from > log_end {
            return Err(StorageError::OffsetOutOfRange { requested: from, log_start, log_end });
        }
        if !first_batch_whole && hint.and_then(|h| h.next_batch_bytes).is_some_and(|bytes| bytes > max_bytes) {
            return Ok(LogRead { bytes: Bytes::new(), first_offset: None, next_offset: from });
        }
        let mut out = Gathered::default();
        let mut first_offset = None;
        let mut next_offset = from;
        // The file position after the last batch taken, in segment `seg_idx`.
        let mut next_position = None;
        let finish = |out: Gathered,
                      first_offset,
                      next_offset,
                      seg_idx: usize,
                      next_position: Option<u64>,
                      next_batch_bytes: Option<usize>| {
            let mut inner = self.inner.borrow_mut();
            if let (Some(position), Some(segment)) = (next_position, inner.segments.get(seg_idx).map(|s| s.base)) {
                inner.read_hint = Some(ReadHint { next: next_offset, segment, position, generation, next_batch_bytes });
            }
            LogRead { bytes: out.finish(), first_offset, next_offset }
        };
        loop {
            let (pos, seg_size, seg_next) = {
                let inner = self.inner.borrow();
                let Some(seg) = inner.segments.get(seg_idx) else { break };
                let pos = match hint.take() {
                    Some(h) if h.segment == seg.base && h.position <= seg.size => h.position,
                    _ => seg.index.position_for(from),
                };
                // Nothing at or after the damage is read.
                let size = match &damage {
                    Some(d) if d.segment == seg.base => seg.size.min(d.position),
                    _ => seg.size,
                };
                (pos, size, seg.next_offset)
            };
            if seg_next <= from || pos >= seg_size {
                seg_idx += 1;
                continue;
            }
            let interval = self.inner.borrow().config.index_interval_bytes as usize;
            let want = (max_bytes.saturating_add(2 * interval)).max(HEADER_BYTES) as u64;
            let mut chunk_pos = pos;
            let Chunk { bytes: mut chunk, mut appended_from } =
                self.read_segment_chunk(seg_idx, pos, want.min(seg_size - pos)).await?;
            let mut at = 0usize;
            loop {
                let file_pos = chunk_pos + at as u64;
                if file_pos >= seg_size {
                    break;
                }
                if chunk.len() - at < HEADER_BYTES {
                    out.leave(&chunk);
                    // Once batches are taken, only what the budget still allows is worth reading.
                    let need =
                        if out.len == 0 { want } else { max_bytes.saturating_sub(out.len).max(HEADER_BYTES) as u64 };
                    Chunk { bytes: chunk, appended_from } =
                        self.read_segment_chunk(seg_idx, file_pos, need.min(seg_size - file_pos)).await?;
                    chunk_pos = file_pos;
                    at = 0;
                    if chunk.len() < HEADER_BYTES {
                        break;
                    }
                }
                let header = BatchHeader::parse(&chunk[at..]).expect("header length checked");
                let total = header.total_bytes();
                if total < HEADER_BYTES || file_pos + total as u64 > seg_size {
                    // Only damage after recovery (bit rot) can get here: the partition goes offline, the
                    // shard stays.
                    return Err(StorageError::Damaged {
                        path: self.segment_path(seg_idx),
                        position: file_pos,
                        offset: next_offset.max(from),
                        reason: format!("stored batch claims {total} bytes"),
                    });
                }
                let last = Offset(header.base_offset as u64 + header.last_offset_delta as u64);
                if last >= end {
                    out.leave(&chunk);
                    return Ok(finish(out, first_offset, next_offset, seg_idx, next_position, None));
                }
                let skip = last < from;
                if !skip {
                    if (out.len > 0 || !first_batch_whole) && out.len + total > max_bytes {
                        out.leave(&chunk);
                        // The batch that did not fit is where a read from `next_offset` begins.
                        let at = Some(file_pos);
                        return Ok(finish(out, first_offset, next_offset, seg_idx, at, Some(total)));
                    }
                    if chunk.len() - at < total {
                        // The batch runs past the chunk: read from it on, as far as the budget allows.
                        out.leave(&chunk);
                        let need = total.max(max_bytes.saturating_sub(out.len)) as u64;
                        Chunk { bytes: chunk, appended_from } =
                            self.read_segment_chunk(seg_idx, file_pos, need.min(seg_size - file_pos)).await?;
                        chunk_pos = file_pos;
                        at = 0;
                        if chunk.len() < total {
                            return Err(StorageError::Damaged {
                                path: self.segment_path(seg_idx),
                                position: file_pos,
                                offset: Offset(header.base_offset as u64),
                                reason: "batch runs past the segment's end".into(),
                            });
                        }
                    }
                    // Every batch served from the disk is checked: a disk that lost durable bytes must not
                    // hand them to consumers (or followers) as if they were records. Batches this process
                    // appended and still holds in memory were checked on their way in.
                    let stored = &chunk[at..at + total];
                    // (Test builds check those too: a fault in the tail's own bookkeeping shows there.)
                    debug_assert!(
                        file_pos < appended_from || batch::compute_crc(stored) == header.crc,
                        "a batch from the in-memory tail does not match its CRC32C"
                    );
                    if file_pos < appended_from && batch::compute_crc(stored) != header.crc {
                        return Err(StorageError::Damaged {
                            path: self.segment_path(seg_idx),
                            position: file_pos,
                            offset: Offset(header.base_offset as u64),
                            reason: "CRC32C does not match the batch".into(),
                        });
                    }
                    out.take(&chunk, at..at + total);
                    first_offset.get_or_insert(Offset(header.base_offset as u64));
                    next_offset = last.plus(1);
                    next_position = Some(file_pos + total as u64);
                } else if chunk.len() - at < total {
                    // Skip a batch that is not in the chunk without reading it.
                    out.leave(&chunk);
                    chunk = Bytes::new();
                    chunk_pos = file_pos + total as u64;
                    at = 0;
                    continue;
                }
                at += total;
            }
            out.leave(&chunk);
            if out.len > 0 && out.len >= max_bytes {
                break;
            }
            seg_idx += 1;
            next_position = None;
        }
        Ok(finish(out, first_offset, next_offset, seg_idx, next_position, None))
    }

    pub(super) fn segment_path(&self, seg_idx: usize) -> std::path::PathBuf {
        self.inner.borrow().segments.get(seg_idx).map_or_else(|| self.dir.clone(), |seg| seg.log_path())
    }

    /// Reads `[pos, pos + len)` of a segment: from the in-memory tail where it has the bytes, from the disk
    /// below it.
    pub(super) async fn read_segment_range(&self, seg_idx: usize, pos: u64, len: u64) -> Result<Bytes> {
        self.read_segment_chunk(seg_idx, pos, len).await.map(|chunk| chunk.bytes)
    }

    /// [`Self::read_segment_range`], telling where the bytes this process appended begin.
    async fn read_segment_chunk(&self, seg_idx: usize, pos: u64, len: u64) -> Result<Chunk> {
        let (file, path, mut mem_part, disk_len, appended_from) = {
            let inner = self.inner.borrow();
            let Some(seg) = inner.segments.get(seg_idx) else { return Ok(Chunk::default()) };
            let end = (pos + len).min(seg.size);
            if pos >= end {
                return Ok(Chunk::default());
            }
            let is_active = seg_idx + 1 == inner.segments.len();
            let mem_from = if is_active { inner.tail.start.max(pos).min(end) } else { end };
            let mem_part = if mem_from < end { inner.tail.to_vec(mem_from..end) } else { Vec::new() };
            let appended_from = if is_active { inner.tail.appended_from.max(mem_from) } else { u64::MAX };
            (seg.file.clone(), seg.log_path(), mem_part, mem_from - pos, appended_from)
        };
        if disk_len == 0 {
            return Ok(Chunk { bytes: mem_part.into(), appended_from });
        }
        let file = self.open_file(&file).await?;
        // Shared with the buffer the disk read into: a consumer's records go from there to the socket.
        let bytes = file.read_shared(pos, disk_len as usize).await.map_err(|e| read_failure("read", &path, e))?;
        if (bytes.len() as u64) < disk_len {
            return Err(StorageError::io(
                "read",
                path,
                std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "segment shorter than its recorded size"),
            ));
        }
        if mem_part.is_empty() {
            return Ok(Chunk { bytes, appended_from });
        }
        // A read reaching into the in-memory tail (the active segment's last bytes) joins the two.
        let mut joined = Vec::with_capacity(bytes.len() + mem_part.len());
        joined.extend_from_slice(&bytes);
        joined.append(&mut mem_part);
        Ok(Chunk { bytes: joined.into(), appended_from })
    }

    /// The first batch whose max timestamp is at least `timestamp`: its base offset and max timestamp
    /// (Kafka's ListOffsets by time, at batch granularity). `None` when every batch is older.
    pub async fn offset_for_timestamp(&self, timestamp: i64) -> Result<Option<(Offset, i64)>> {
        let start = {
            let inner = self.inner.borrow();
            let last = inner.segments.len() - 1;
            let seg =
                inner.segments.iter().enumerate().find(|(i, s)| s.index.max_timestamp() >= timestamp || *i == last);
            seg.map(|(_, s)| s.index.offset_for_timestamp(timestamp).max(inner.log_start))
        };
        let mut at = start.expect("a log always has an active segment");
        loop {
            let read = match self.read(at, 64 << 10).await {
                Ok(r) => r,
                Err(StorageError::OffsetOutOfRange { .. }) => return Ok(None),
                Err(e) => return Err(e),
            };
            if read.bytes.is_empty() {
                return Ok(None);
            }
            let mut pos = 0;
            while pos < read.bytes.len() {
                let h = BatchHeader::parse(&read.bytes[pos..]).expect("stored batch");
                if h.max_timestamp >= timestamp {
                    let base = Offset(h.base_offset as u64).max(self.log_start_offset());
                    return Ok(Some((base, h.max_timestamp)));
                }
                pos += h.total_bytes();
            }
            at = read.next_offset;
        }
    }

    /// Checks every index entry of every segment against the batches in the log. For tests and
    /// diagnostics; reads the whole log.
    pub async fn verify_indexes(&self) -> Result<(), String> {
        let count = self.segment_count();
        for seg_idx in 0..count {
            let (size, offsets, times, base) = {
                let inner = self.inner.borrow();
                let s = &inner.segments[seg_idx];
                (
                    s.size,
                    s.index.offset_entries().collect::<Vec<_>>(),
                    s.index.time_entries().collect::<Vec<_>>(),
                    s.base,
                )
            };
            let bytes = self.read_segment_range(seg_idx, 0, size).await.map_err(|e| e.to_string())?;
            let mut batches = Vec::new();
            let mut pos = 0usize;
            while pos < bytes.len() {
                let h = BatchHeader::parse(&bytes[pos..]).map_err(|e| format!("segment {base}: {e}"))?;
                batches.push((pos as u64, h.base_offset as u64 + h.last_offset_delta as u64, h.max_timestamp));
                pos += h.total_bytes();
            }
            if pos != bytes.len() {
                return Err(format!("segment {base}: batches overrun its size"));
            }
            for (offset, position) in offsets {
                if !batches.iter().any(|&(p, last, _)| p == position && last == offset.0) {
                    return Err(format!("segment {base}: index entry ({offset}, {position}) matches no batch"));
                }
            }
            for (ts, offset) in times {
                if !batches.iter().any(|&(_, last, max_ts)| last == offset.0 && max_ts == ts) {
                    return Err(format!("segment {base}: time index entry ({ts}, {offset}) matches no batch"));
                }
            }
        }
        Ok(())
    }
}
