//! Kafka v2 record batches (magic 2): header parsing, validation, and the two fields the log stamps.
//!
//! The log stores batches byte for byte as producers sent them. Only the base offset (bytes 0..8) and the
//! partition leader epoch (bytes 12..16) are written by the broker; both lie outside the CRC32C, which covers
//! everything from the attributes field (byte 21) to the end of the batch.
//!
//! | bytes  | field                   | type |
//! |--------|-------------------------|------|
//! | 0..8   | base offset             | i64  |
//! | 8..12  | batch length (after it) | i32  |
//! | 12..16 | partition leader epoch  | i32  |
//! | 16     | magic (= 2)             | i8   |
//! | 17..21 | CRC32C of bytes 21..end | u32  |
//! | 21..23 | attributes              | i16  |
//! | 23..27 | last offset delta       | i32  |
//! | 27..35 | base timestamp          | i64  |
//! | 35..43 | max timestamp           | i64  |
//! | 43..51 | producer id             | i64  |
//! | 51..53 | producer epoch          | i16  |
//! | 53..57 | base sequence           | i32  |
//! | 57..61 | record count            | i32  |
//! | 61..   | records                 |      |

use crate::types::{LeaderEpoch, Offset};

/// Size of the fixed v2 batch header.
pub const HEADER_BYTES: usize = 61;
/// Bytes before the batch length field's coverage starts: base offset and the length itself.
pub const LOG_OVERHEAD: usize = 12;
/// The only batch format the log accepts.
pub const MAGIC_V2: i8 = 2;

/// The smallest uncompressed v2 record: length, attributes, timestamp delta, offset delta, key length,
/// value length and header count, one byte each.
const MIN_RECORD_BYTES: u64 = 7;
/// The most a compressed batch body is taken to expand.
const MAX_COMPRESSION_RATIO: u64 = 1024;

/// Where the CRC32C's coverage starts: the attributes field.
pub const CRC_START: usize = 21;

/// Why a batch was refused. Each has its own Kafka error code at the broker.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BatchError {
    #[error("batch of {len} bytes is shorter than the {HEADER_BYTES}-byte v2 header")]
    TooShort { len: usize },
    #[error("batch length field {field} does not match the {actual} bytes that follow it")]
    LengthMismatch { field: i64, actual: usize },
    #[error("batch of {size} bytes exceeds max.message.bytes {max}")]
    TooLarge { size: usize, max: usize },
    #[error("unsupported record batch magic {magic} (only v2 is stored)")]
    BadMagic { magic: i8 },
    #[error("record batch CRC32C mismatch: header says {stored:#010x}, content has {computed:#010x}")]
    BadCrc { stored: u32, computed: u32 },
    #[error("record count {count} does not match last offset delta {last_offset_delta}")]
    BadRecordCount { count: i32, last_offset_delta: i32 },
}

/// The fixed header of a v2 batch, decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    /// Bytes after the length field; the whole batch is `LOG_OVERHEAD + batch_length` bytes.
    pub batch_length: i32,
    pub partition_leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

fn be_i64(b: &[u8], at: usize) -> i64 {
    i64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
fn be_i32(b: &[u8], at: usize) -> i32 {
    i32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn be_i16(b: &[u8], at: usize) -> i16 {
    i16::from_be_bytes(b[at..at + 2].try_into().expect("2 bytes"))
}

impl BatchHeader {
    /// Decodes the fixed header. Checks nothing but that the header is present.
    pub fn parse(bytes: &[u8]) -> Result<BatchHeader, BatchError> {
        if bytes.len() < HEADER_BYTES {
            return Err(BatchError::TooShort { len: bytes.len() });
        }
        Ok(BatchHeader {
            base_offset: be_i64(bytes, 0),
            batch_length: be_i32(bytes, 8),
            partition_leader_epoch: be_i32(bytes, 12),
            magic: bytes[16] as i8,
            crc: be_i32(bytes, 17) as u32,
            attributes: be_i16(bytes, 21),
            last_offset_delta: be_i32(bytes, 23),
            base_timestamp: be_i64(bytes, 27),
            max_timestamp: be_i64(bytes, 35),
            producer_id: be_i64(bytes, 43),
            producer_epoch: be_i16(bytes, 51),
            base_sequence: be_i32(bytes, 53),
            record_count: be_i32(bytes, 57),
        })
    }

    /// Total size of the batch on disk, header included. Only meaningful once the length was bounds-checked.
    pub fn total_bytes(&self) -> usize {
        LOG_OVERHEAD + self.batch_length.max(0) as usize
    }

    /// Number of offsets the batch occupies.
    pub fn offset_count(&self) -> u64 {
        self.last_offset_delta as u64 + 1
    }

    /// The compression codec in the attributes (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd).
    pub fn compression(&self) -> u8 {
        (self.attributes & 0x7) as u8
    }
}

/// Reads the total size a batch claims from its first 12 bytes, if they are present, without trusting it.
pub fn claimed_total_bytes(bytes: &[u8]) -> Option<i64> {
    if bytes.len() < LOG_OVERHEAD {
        return None;
    }
    Some(LOG_OVERHEAD as i64 + be_i32(bytes, 8) as i64)
}

/// Computes the CRC32C the header should carry for these batch bytes.
pub fn compute_crc(bytes: &[u8]) -> u32 {
    crc32c::crc32c(&bytes[CRC_START..])
}

/// Validates one complete batch as a producer sent it: exactly `bytes` long, v2, CRC correct, record count
/// consistent, no larger than `max_batch_bytes`. Nothing is trusted before its bounds are checked.
pub fn validate(bytes: &[u8], max_batch_bytes: usize) -> Result<BatchHeader, BatchError> {
    let header = validate_stored(bytes, max_batch_bytes)?;
    if header.record_count == 0 || header.last_offset_delta != header.record_count - 1 {
        return Err(BatchError::BadRecordCount {
            count: header.record_count,
            last_offset_delta: header.last_offset_delta,
        });
    }
    Ok(header)
}

/// Whether a stored batch's record count fits its offsets. A batch rewritten by compaction keeps its base
/// and last offset but may hold fewer records than offsets, or none (Kafka keeps an idempotent producer's
/// last batch even when compaction empties it); a producer's batch holds exactly one record per offset.
pub fn stored_count_fits(header: &BatchHeader) -> bool {
    header.last_offset_delta >= 0 && header.record_count >= 0 && header.record_count <= header.last_offset_delta + 1
}

/// Validates one complete batch as the log may store it: like [`validate`], but a batch compaction
/// rewrote (fewer records than offsets, or none) is accepted. For a follower's appends, which copy the
/// leader's log.
pub fn validate_stored(bytes: &[u8], max_batch_bytes: usize) -> Result<BatchHeader, BatchError> {
    let header = BatchHeader::parse(bytes)?;
    let claimed = LOG_OVERHEAD as i64 + header.batch_length as i64;
    if claimed != bytes.len() as i64 {
        return Err(BatchError::LengthMismatch {
            field: header.batch_length as i64,
            actual: bytes.len() - LOG_OVERHEAD,
        });
    }
    if bytes.len() > max_batch_bytes {
        return Err(BatchError::TooLarge { size: bytes.len(), max: max_batch_bytes });
    }
    if header.magic != MAGIC_V2 {
        return Err(BatchError::BadMagic { magic: header.magic });
    }
    let computed = compute_crc(bytes);
    if computed != header.crc {
        return Err(BatchError::BadCrc { stored: header.crc, computed });
    }
    if !stored_count_fits(&header) {
        return Err(BatchError::BadRecordCount {
            count: header.record_count,
            last_offset_delta: header.last_offset_delta,
        });
    }
    // The count must fit the body: an uncompressed record takes at least 7 bytes; a compressed body can
    // expand, but not beyond a generous ratio. A count no body could hold would move the log end by
    // billions of offsets and make any decoder size its buffers from it.
    let body = (bytes.len() - HEADER_BYTES) as u64;
    let most =
        if header.compression() == 0 { body / MIN_RECORD_BYTES } else { body.saturating_mul(MAX_COMPRESSION_RATIO) };
    if header.record_count as u64 > most {
        return Err(BatchError::BadRecordCount {
            count: header.record_count,
            last_offset_delta: header.last_offset_delta,
        });
    }
    Ok(header)
}

/// Writes the broker-owned fields: base offset and partition leader epoch. The CRC stays valid.
pub fn stamp(bytes: &mut [u8], base_offset: Offset, epoch: LeaderEpoch) {
    bytes[0..8].copy_from_slice(&base_offset.as_i64().to_be_bytes());
    bytes[12..16].copy_from_slice(&epoch.0.to_be_bytes());
}

/// Builds a valid uncompressed v2 batch holding `values` as records with no keys or headers.
///
/// The log never builds batches itself; this exists for tests and tools that need real batches without a
/// Kafka client.
pub fn build_batch(base_timestamp: i64, values: &[&[u8]]) -> Vec<u8> {
    assert!(!values.is_empty(), "a batch holds at least one record");
    let mut records = Vec::new();
    for (i, value) in values.iter().enumerate() {
        let mut body = Vec::new();
        body.push(0u8); // record attributes
        put_varlong(&mut body, 0); // timestamp delta
        put_varlong(&mut body, i as i64); // offset delta
        put_varlong(&mut body, -1); // key: null
        put_varlong(&mut body, value.len() as i64);
        body.extend_from_slice(value);
        put_varlong(&mut body, 0); // no headers
        put_varlong(&mut records, body.len() as i64);
        records.extend_from_slice(&body);
    }
    let count = values.len() as i32;
    let mut b = Vec::with_capacity(HEADER_BYTES + records.len());
    b.extend_from_slice(&0i64.to_be_bytes());
    b.extend_from_slice(&((HEADER_BYTES - LOG_OVERHEAD + records.len()) as i32).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.push(MAGIC_V2 as u8);
    b.extend_from_slice(&0u32.to_be_bytes()); // CRC, filled below
    b.extend_from_slice(&0i16.to_be_bytes());
    b.extend_from_slice(&(count - 1).to_be_bytes());
    b.extend_from_slice(&base_timestamp.to_be_bytes());
    b.extend_from_slice(&base_timestamp.to_be_bytes());
    b.extend_from_slice(&(-1i64).to_be_bytes());
    b.extend_from_slice(&(-1i16).to_be_bytes());
    b.extend_from_slice(&(-1i32).to_be_bytes());
    b.extend_from_slice(&count.to_be_bytes());
    b.extend_from_slice(&records);
    let crc = compute_crc(&b);
    b[17..21].copy_from_slice(&crc.to_be_bytes());
    b
}

fn put_varlong(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_batch_validates_and_stamping_keeps_crc() {
        let mut b = build_batch(1_700_000_000_000, &[b"a", b"bc", b"def"]);
        let h = validate(&b, 1 << 20).expect("valid");
        assert_eq!(h.record_count, 3);
        assert_eq!(h.last_offset_delta, 2);
        stamp(&mut b, Offset(42), LeaderEpoch(7));
        let h = validate(&b, 1 << 20).expect("still valid after stamping");
        assert_eq!(h.base_offset, 42);
        assert_eq!(h.partition_leader_epoch, 7);
    }

    #[test]
    fn each_kind_of_bad_batch_has_its_own_error() {
        let good = build_batch(0, &[b"x"]);
        let mut crc = good.clone();
        *crc.last_mut().unwrap() ^= 0xff;
        assert!(matches!(validate(&crc, 1 << 20), Err(BatchError::BadCrc { .. })));
        let mut magic = good.clone();
        magic[16] = 1;
        assert_eq!(validate(&magic, 1 << 20), Err(BatchError::BadMagic { magic: 1 }));
        let mut len = good.clone();
        len[8..12].copy_from_slice(&0xFFFF_FFFFu32.to_be_bytes());
        assert!(matches!(validate(&len, 1 << 20), Err(BatchError::LengthMismatch { field: -1, .. })));
        assert!(matches!(validate(&good, 10), Err(BatchError::TooShort { .. }) | Err(BatchError::TooLarge { .. })));
        assert_eq!(
            validate(&good, good.len() - 1),
            Err(BatchError::TooLarge { size: good.len(), max: good.len() - 1 })
        );
        assert_eq!(validate(&good[..30], 1 << 20), Err(BatchError::TooShort { len: 30 }));
        let mut huge = good.clone();
        huge[23..27].copy_from_slice(&(i32::MAX - 1).to_be_bytes());
        huge[57..61].copy_from_slice(&i32::MAX.to_be_bytes());
        let crc = compute_crc(&huge);
        huge[17..21].copy_from_slice(&crc.to_be_bytes());
        assert!(
            matches!(validate(&huge, 1 << 20), Err(BatchError::BadRecordCount { count: i32::MAX, .. })),
            "a count no body could hold"
        );
        let mut count = good.clone();
        count[57..61].copy_from_slice(&5i32.to_be_bytes());
        let crc = compute_crc(&count);
        count[17..21].copy_from_slice(&crc.to_be_bytes());
        assert_eq!(validate(&count, 1 << 20), Err(BatchError::BadRecordCount { count: 5, last_offset_delta: 0 }));
    }
}
