//! One segment of a partition log: a `.log` file of consecutive batches starting at a base offset, with its
//! offset and time indexes, and the scan that validates a segment batch by batch during recovery.
//!
//! Files are named by base offset, 20 digits: `00000000000000000000.log`, `.index`, `.timeindex`,
//! `.txnindex`.

pub mod index;

use std::path::{Path, PathBuf};

use crate::batch::{self, BatchHeader, CRC_START, HEADER_BYTES, MAGIC_V2};
use crate::durable::read_failure;
use crate::error::Result;
use crate::fs::open_files::FileHandle;
use crate::fs::{Fs, SegmentFile};
use crate::txn::AbortedTxn;
use crate::types::Offset;

pub use crate::txn::index::TXN_INDEX_SUFFIX;

use index::{BatchMeta, SegmentIndex};

pub const LOG_SUFFIX: &str = ".log";
pub const INDEX_SUFFIX: &str = ".index";
pub const TIME_INDEX_SUFFIX: &str = ".timeindex";

/// Bytes read at a time when scanning a segment.
const SCAN_CHUNK_BYTES: usize = 1 << 20;

/// The file name of a segment file: base offset in 20 digits and a suffix.
pub fn file_name(base: Offset, suffix: &str) -> String {
    format!("{:020}{suffix}", base.0)
}

/// Parses `<20 digits><suffix>` into a base offset.
pub fn parse_file_name(name: &str, suffix: &str) -> Option<Offset> {
    let digits = name.strip_suffix(suffix)?;
    if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok().map(Offset)
}

/// A segment's state in memory. The file is shared with in-flight reads.
#[derive(Debug)]
pub struct Segment<F: Fs> {
    pub base: Offset,
    pub dir: PathBuf,
    pub file: FileHandle<F>,
    /// Logical size: bytes of whole batches. The file may be longer (zero padding of the tail block,
    /// and the active segment's preallocation).
    pub size: u64,
    /// Bytes of the file allocated, as far as this process made or found them (the active segment is
    /// preallocated ahead of its writes; see `LogConfig::preallocate_bytes`): the file's size, but
    /// `u64::MAX` on a filesystem without fallocate.
    pub allocated: u64,
    /// The active segment's blocks below this were written with zeros ahead of its data by this process
    /// (see `log::durability`), so writes into them change no extent; 0 when none were.
    pub zeroed: u64,
    /// The active segment's blocks below this hold written data (or zeros), and their written state,
    /// the file's size covering them and the file's directory entry were made durable by a completed
    /// fdatasync of this file: a direct write into them needs only a device flush to be durable (see
    /// [`crate::fs::device_flush`]). 0 until this process's first fdatasync of the file.
    pub durable_written: u64,
    /// The offset after the segment's last batch.
    pub next_offset: Offset,
    pub index: SegmentIndex,
    /// How many leading entries of each index (offset, time) the `.index` and `.timeindex` files on disk
    /// hold, durably and matching `index`; `None` when the files are missing or cannot be trusted to
    /// match (see `log::index_files`).
    pub persisted_index: Option<(usize, usize)>,
    /// When the segment was created, for `segment.ms`.
    pub created_ms: i64,
    /// The aborted transactions whose ABORT marker is in this segment, in log order: its `.txnindex`
    /// (`crate::txn::index`), kept in memory. On disk for a sealed segment; the active segment's file, if
    /// any, may lag (written whole at each seal, and rebuilt from the log at open).
    pub aborted: Vec<AbortedTxn>,
}

impl<F: Fs> Segment<F> {
    /// The file was cut at `len`: nothing past it is reserved or zeroed any more.
    pub fn cut_reservation(&mut self, len: u64) {
        self.allocated = len;
        self.zeroed = self.zeroed.min(len);
        // The cut (a size change) is durable only at the file's next fdatasync: until then nothing
        // is covered by a device flush alone.
        self.durable_written = 0;
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.join(file_name(self.base, LOG_SUFFIX))
    }
    pub fn index_path(&self) -> PathBuf {
        self.dir.join(file_name(self.base, INDEX_SUFFIX))
    }
    pub fn time_index_path(&self) -> PathBuf {
        self.dir.join(file_name(self.base, TIME_INDEX_SUFFIX))
    }
    pub fn txn_index_path(&self) -> PathBuf {
        self.dir.join(file_name(self.base, TXN_INDEX_SUFFIX))
    }
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }
}

/// Why a scan stopped before the end of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanStop {
    /// Every byte up to the file size holds whole valid batches.
    Clean,
    /// Zeros where the next batch would start: the end of what was written (a block's padding, or
    /// preallocated space), not a bad batch.
    ZeroPadding,
    /// The bytes at `valid_bytes` are not a valid batch: the reason says why.
    Invalid(String),
}

impl ScanStop {
    /// Why the scan stopped before the end of the file, if it did.
    pub fn reason(&self) -> Option<String> {
        match self {
            ScanStop::Clean => None,
            ScanStop::ZeroPadding => Some("zero padding after the last batch".into()),
            ScanStop::Invalid(reason) => Some(reason.clone()),
        }
    }
}

/// The outcome of validating a segment from its start.
#[derive(Debug)]
pub struct ScanResult {
    /// Bytes of whole valid batches from the start of the segment.
    pub valid_bytes: u64,
    pub next_offset: Offset,
    pub batch_count: u64,
    pub last_batch: Option<BatchMeta>,
    pub stop: ScanStop,
}

/// The CRC32C of the batch at `pos` (`total` bytes), read a chunk at a time. `None` if the file ends first.
async fn streamed_crc<F: SegmentFile>(file: &F, path: &Path, pos: u64, total: u64) -> Result<Option<u32>> {
    let mut crc = 0u32;
    let mut at = pos + CRC_START as u64;
    let end = pos + total;
    while at < end {
        let want = (end - at).min(SCAN_CHUNK_BYTES as u64) as usize;
        let piece = file.read_at(at, want).await.map_err(|e| read_failure("read", path, e))?;
        if piece.len() < want {
            return Ok(None);
        }
        crc = crc32c::crc32c_append(crc, &piece);
        at += want as u64;
    }
    Ok(Some(crc))
}

/// Reads batches from `start` (a batch boundary at offset `start_offset`) until `end` or the first invalid
/// batch, checking length bounds before reading a batch, then its magic, CRC32C and that offsets only go up
/// (contiguous but for the gaps compaction leaves).
///
/// A batch whose length field is zero at a block boundary is padding after the last batch, not damage, but
/// it ends the scan all the same; the caller distinguishes only "clean" from "everything after is invalid".
pub async fn scan<F: SegmentFile>(
    file: &F,
    path: &Path,
    start: u64,
    start_offset: Offset,
    end: u64,
    mut on_batch: impl FnMut(&BatchMeta),
) -> Result<ScanResult> {
    let mut pos = start;
    let mut next = start_offset;
    let mut batch_count = 0;
    let mut last_batch = None;
    let mut chunk: Vec<u8> = Vec::new();
    let mut chunk_pos = start;
    let stop = loop {
        if pos >= end {
            break ScanStop::Clean;
        }
        let remaining = end - pos;
        if remaining < HEADER_BYTES as u64 {
            let rest = file.read_at(pos, remaining as usize).await.map_err(|e| read_failure("read", path, e))?;
            if rest.iter().all(|&b| b == 0) {
                break ScanStop::ZeroPadding;
            }
            break ScanStop::Invalid(format!("{remaining} trailing bytes, less than a batch header"));
        }
        // Make sure the header is in the chunk.
        if pos + HEADER_BYTES as u64 > chunk_pos + chunk.len() as u64 {
            let want = (SCAN_CHUNK_BYTES as u64).min(remaining) as usize;
            chunk = file.read_at(pos, want).await.map_err(|e| read_failure("read", path, e))?;
            chunk_pos = pos;
            if chunk.len() < HEADER_BYTES {
                break ScanStop::Invalid(format!("file ends {} bytes into a batch header", chunk.len()));
            }
        }
        let at = (pos - chunk_pos) as usize;
        let claimed = batch::claimed_total_bytes(&chunk[at..]).expect("header is in the chunk");
        if claimed < HEADER_BYTES as i64 || claimed as u64 > remaining {
            if claimed == batch::LOG_OVERHEAD as i64 && chunk[at..at + HEADER_BYTES].iter().all(|&b| b == 0) {
                break ScanStop::ZeroPadding;
            }
            break ScanStop::Invalid(format!("batch length {claimed} out of bounds ({remaining} bytes left)"));
        }
        let total = claimed as usize;
        let header = BatchHeader::parse(&chunk[at..]).expect("header is in the chunk");
        if header.magic != MAGIC_V2 {
            break ScanStop::Invalid(format!("magic {}", header.magic));
        }
        // The length is bounded by the file. A batch that fits a chunk is read whole; a larger one is
        // checked piece by piece, so memory stays bounded whatever a damaged length field says.
        let crc = if total <= SCAN_CHUNK_BYTES {
            if at + total > chunk.len() {
                chunk = file
                    .read_at(pos, SCAN_CHUNK_BYTES.min(remaining as usize))
                    .await
                    .map_err(|e| read_failure("read", path, e))?;
                chunk_pos = pos;
                if chunk.len() < total {
                    break ScanStop::Invalid(format!("file ends inside a {total}-byte batch"));
                }
            }
            let at = (pos - chunk_pos) as usize;
            Some(batch::compute_crc(&chunk[at..at + total]))
        } else {
            let crc = streamed_crc(file, path, pos, total as u64).await?;
            chunk.clear();
            chunk_pos = pos + total as u64;
            crc
        };
        let Some(crc) = crc else {
            break ScanStop::Invalid(format!("file ends inside a {total}-byte batch"));
        };
        if crc != header.crc {
            break ScanStop::Invalid(format!("CRC32C {crc:#010x} != stored {:#010x}", header.crc));
        }
        // Offsets only go up. Compaction leaves gaps where it removed whole batches.
        if header.base_offset < next.as_i64() {
            break ScanStop::Invalid(format!("base offset {} where {next} or later was expected", header.base_offset));
        }
        if !batch::stored_count_fits(&header) {
            break ScanStop::Invalid("record count inconsistent with last offset delta".into());
        }
        let base_offset = Offset(header.base_offset as u64);
        let meta = BatchMeta {
            position: pos,
            size: total as u64,
            base_offset,
            last_offset: base_offset.plus(header.last_offset_delta as u64),
            max_timestamp: header.max_timestamp,
            epoch: header.partition_leader_epoch,
        };
        on_batch(&meta);
        batch_count += 1;
        last_batch = Some(meta);
        next = meta.last_offset.plus(1);
        pos += total as u64;
    };
    Ok(ScanResult { valid_bytes: pos, next_offset: next, batch_count, last_batch, stop })
}
