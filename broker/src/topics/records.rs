//! The records inside a v2 batch, as far as the broker needs them: each record's offset delta, key and
//! whether it has a value (compaction keeps the latest record per key and drops expired tombstones; a
//! compacted topic refuses records without a key), and a batch rebuilt with some of its records.
//!
//! A record (after the batch's codec is undone): length varint, attributes i8, timestamp delta varlong,
//! offset delta varint, key length varint (-1: null) and key, value length varint (-1: null, a
//! tombstone) and value, then headers. Kept records are copied byte for byte, so their offset and
//! timestamp deltas stay relative to the batch's unchanged base offset and base timestamp.

use std::ops::Range;

use bytes::BytesMut;
use shardlog_storage::batch::{self, BatchHeader, HEADER_BYTES, LOG_OVERHEAD};

use super::configs::Codec;
use super::recompress::{self, RecompressError};

/// Attribute bit of a transactional batch, and of a control batch (transaction markers).
pub const TRANSACTIONAL_BIT: i16 = 0x10;
pub const CONTROL_BIT: i16 = 0x20;

/// One record of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordView {
    pub offset_delta: i32,
    /// Where the key is in the records section; `None` for a null key.
    pub key: Option<Range<usize>>,
    /// A null value: the record is a tombstone for its key.
    pub tombstone: bool,
    /// The whole record, length prefix included.
    pub bytes: Range<usize>,
}

/// A batch's header and its records section with the codec undone.
#[derive(Debug)]
pub struct OpenBatch {
    pub header: BatchHeader,
    pub codec: Codec,
    pub records: Vec<u8>,
}

impl OpenBatch {
    /// Decodes one whole stored or produced batch (its CRC32C already checked by the caller or the log).
    pub fn open(batch: &[u8]) -> Result<OpenBatch, RecompressError> {
        let header = BatchHeader::parse(batch)?;
        if header.total_bytes() != batch.len() {
            return Err(RecompressError::Invalid(batch::BatchError::LengthMismatch {
                field: header.batch_length as i64,
                actual: batch.len() - LOG_OVERHEAD,
            }));
        }
        let codec =
            Codec::from_attributes(header.attributes).ok_or(RecompressError::UnknownCodec(header.attributes & 7))?;
        let records = recompress::decompress(codec, &batch[HEADER_BYTES..])?;
        Ok(OpenBatch { header, codec, records })
    }

    /// The records, in order. Refuses a section that does not frame as the header's count of records.
    pub fn records(&self) -> Result<Vec<RecordView>, RecompressError> {
        let bad = RecompressError::BadRecords;
        let bytes = &self.records;
        let mut out = Vec::with_capacity(self.header.record_count.clamp(0, 1 << 16) as usize);
        let mut at = 0usize;
        while at < bytes.len() {
            let start = at;
            let (len, used) = varint(&bytes[at..]).ok_or(bad("a cut length prefix"))?;
            let len = usize::try_from(len).map_err(|_| bad("a negative record length"))?;
            let end = (at + used)
                .checked_add(len)
                .filter(|e| *e <= bytes.len())
                .ok_or(bad("a record longer than what is left"))?;
            let mut field = Fields { bytes: &bytes[..end], at: at + used + 1 };
            field.next()?; // timestamp delta
            let offset_delta = i32::try_from(field.next()?)
                .ok()
                .filter(|d| (0..=self.header.last_offset_delta).contains(d))
                .ok_or(bad("an offset delta outside the batch's offsets"))?;
            let key = field.blob()?;
            let tombstone = field.blob()?.is_none();
            out.push(RecordView { offset_delta, key, tombstone, bytes: start..end });
            at = end;
        }
        if out.len() != self.header.record_count.max(0) as usize {
            return Err(bad("the record count does not match the header"));
        }
        Ok(out)
    }

    /// The offset of one of [`Self::records`] (their deltas are checked to lie within the batch).
    pub fn offset_of(&self, record: &RecordView) -> u64 {
        self.header.base_offset as u64 + record.offset_delta as u64
    }

    /// The batch with only `kept` of its records (in order), in its own codec; header fields but the
    /// length, count and CRC32C kept. With no records left the batch is stored uncompressed (an empty
    /// body needs no codec), keeping its offsets and producer fields.
    pub fn rebuild(&self, stored: &[u8], kept: &[RecordView]) -> Result<Vec<u8>, RecompressError> {
        let mut body = Vec::with_capacity(kept.iter().map(|r| r.bytes.len()).sum());
        for r in kept {
            body.extend_from_slice(&self.records[r.bytes.clone()]);
        }
        let mut out = BytesMut::with_capacity(HEADER_BYTES + body.len());
        out.extend_from_slice(&stored[..HEADER_BYTES]);
        let mut attributes = self.header.attributes;
        if kept.is_empty() {
            attributes &= !7;
        } else {
            recompress::compress(self.codec, &body, &mut out)?;
        }
        let length = i32::try_from(out.len() - LOG_OVERHEAD).map_err(|_| RecompressError::TooLarge)?;
        out[8..12].copy_from_slice(&length.to_be_bytes());
        out[21..23].copy_from_slice(&attributes.to_be_bytes());
        out[57..61].copy_from_slice(&(kept.len() as i32).to_be_bytes());
        let crc = batch::compute_crc(&out);
        out[17..21].copy_from_slice(&crc.to_be_bytes());
        Ok(out.to_vec())
    }
}

/// The records of a produced batch without a key, by their index in the batch (a compacted topic
/// refuses them, and KIP-467's answer names them so). Control batches carry no user records: none.
pub fn keyless_records(batch: &[u8]) -> Result<Vec<i32>, RecompressError> {
    // Nothing is decompressed before the batch is known to be what the producer sent.
    batch::validate(batch, usize::MAX)?;
    let open = OpenBatch::open(batch)?;
    if open.header.attributes & CONTROL_BIT != 0 {
        return Ok(Vec::new());
    }
    let records = open.records()?;
    Ok((0..).zip(&records).filter(|(_, r)| r.key.is_none()).map(|(index, _)| index).collect())
}

/// Reads the varint fields of one record.
struct Fields<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Fields<'_> {
    fn next(&mut self) -> Result<i64, RecompressError> {
        let (v, used) = varint(self.bytes.get(self.at..).unwrap_or_default())
            .ok_or(RecompressError::BadRecords("a record cut inside its fields"))?;
        self.at += used;
        Ok(v)
    }

    /// A length-prefixed byte string; `None` for length -1.
    fn blob(&mut self) -> Result<Option<Range<usize>>, RecompressError> {
        let len = self.next()?;
        if len < 0 {
            return Ok(None);
        }
        let start = self.at;
        let end = start
            .checked_add(len as usize)
            .filter(|e| *e <= self.bytes.len())
            .ok_or(RecompressError::BadRecords("a key or value longer than its record"))?;
        self.at = end;
        Ok(Some(start..end))
    }
}

/// A zigzag varint (Kafka's record framing): the value and the bytes it took.
pub fn varint(bytes: &[u8]) -> Option<(i64, usize)> {
    let mut raw: u64 = 0;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        raw |= ((b & 0x7f) as u64) << (7 * i);
        if b & 0x80 == 0 {
            return Some(((raw >> 1) as i64 ^ -((raw & 1) as i64), i + 1));
        }
    }
    None
}
