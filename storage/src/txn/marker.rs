//! Transaction markers: the control batch a transaction coordinator's WriteTxnMarkers has the partition
//! leader append to end a transaction, exactly as Kafka writes it.
//!
//! A marker is a v2 batch with attributes control (0x20) | transactional (0x10), no compression, the
//! producer's id and epoch, base sequence -1, and one record:
//!
//! | part  | bytes | field                                  | type |
//! |-------|-------|----------------------------------------|------|
//! | key   | 0..2  | version (= 0)                          | i16  |
//! |       | 2..4  | control type: 0 = ABORT, 1 = COMMIT     | i16  |
//! | value | 0..2  | version (= 0)                          | i16  |
//! |       | 2..6  | coordinator epoch                      | i32  |
//!
//! Reading accepts any non-negative version and longer keys and values (later versions add fields at the
//! end), but only the two transaction control types: other control records (KRaft's) are not markers.

use crate::batch::{self, BatchHeader, HEADER_BYTES, LOG_OVERHEAD, MAGIC_V2};

/// Attribute bit of a transactional batch.
pub const TRANSACTIONAL_BIT: i16 = 0x10;
/// Attribute bit of a control batch.
pub const CONTROL_BIT: i16 = 0x20;

/// How a transaction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MarkerKind {
    Abort,
    Commit,
}

impl MarkerKind {
    /// Kafka's control record type.
    pub fn control_type(self) -> i16 {
        match self {
            MarkerKind::Abort => 0,
            MarkerKind::Commit => 1,
        }
    }
}

/// A COMMIT or ABORT marker for one producer's transaction, as the coordinator sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnMarker {
    pub kind: MarkerKind,
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// The epoch of the coordinator that wrote it: a partition refuses markers of an older coordinator.
    pub coordinator_epoch: i32,
}

impl TxnMarker {
    /// The marker's control batch, base offset 0 and leader epoch -1 (the log stamps both), records
    /// timestamped `timestamp_ms`.
    pub fn encode(&self, timestamp_ms: i64) -> Vec<u8> {
        let mut record = Vec::with_capacity(24);
        record.push(0u8); // record attributes
        record.push(0u8); // timestamp delta 0 (zigzag varint)
        record.push(0u8); // offset delta 0
        record.push(8u8); // key length 4 (zigzag)
        record.extend_from_slice(&0i16.to_be_bytes());
        record.extend_from_slice(&self.kind.control_type().to_be_bytes());
        record.push(12u8); // value length 6 (zigzag)
        record.extend_from_slice(&0i16.to_be_bytes());
        record.extend_from_slice(&self.coordinator_epoch.to_be_bytes());
        record.push(0u8); // no headers
        let mut b = Vec::with_capacity(HEADER_BYTES + 1 + record.len());
        b.extend_from_slice(&0i64.to_be_bytes());
        b.extend_from_slice(&((HEADER_BYTES - LOG_OVERHEAD + 1 + record.len()) as i32).to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes());
        b.push(MAGIC_V2 as u8);
        b.extend_from_slice(&0u32.to_be_bytes()); // CRC, filled below
        b.extend_from_slice(&(CONTROL_BIT | TRANSACTIONAL_BIT).to_be_bytes());
        b.extend_from_slice(&0i32.to_be_bytes()); // last offset delta
        b.extend_from_slice(&timestamp_ms.to_be_bytes());
        b.extend_from_slice(&timestamp_ms.to_be_bytes());
        b.extend_from_slice(&self.producer_id.to_be_bytes());
        b.extend_from_slice(&self.producer_epoch.to_be_bytes());
        b.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
        b.extend_from_slice(&1i32.to_be_bytes()); // record count
        b.push((record.len() as u8) << 1); // record length (zigzag varint, < 64)
        b.extend_from_slice(&record);
        let crc = batch::compute_crc(&b);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    }

    /// Reads the marker a stored control batch holds. `None` when the batch is not a control batch, is
    /// compressed, holds no record (compaction emptied it), or its record is not a COMMIT or ABORT marker.
    /// The bytes must be one whole batch, its CRC already checked.
    pub fn decode(bytes: &[u8]) -> Option<TxnMarker> {
        let header = BatchHeader::parse(bytes).ok()?;
        if header.attributes & CONTROL_BIT == 0
            || header.compression() != 0
            || header.record_count < 1
            || bytes.len() < header.total_bytes()
        {
            return None;
        }
        let mut r = VarReader { bytes: &bytes[HEADER_BYTES..header.total_bytes()], at: 0 };
        let _record_len = r.varint()?;
        let _attributes = r.take(1)?;
        let _timestamp_delta = r.varint()?;
        let _offset_delta = r.varint()?;
        let key_len = usize::try_from(r.varint()?).ok()?;
        let key = r.take(key_len)?;
        let value_len = usize::try_from(r.varint()?).ok()?;
        let value = r.take(value_len)?;
        if key.len() < 4 || value.len() < 6 {
            return None;
        }
        let be16 = |b: &[u8]| i16::from_be_bytes([b[0], b[1]]);
        if be16(key) < 0 || be16(value) < 0 {
            return None;
        }
        let kind = match be16(&key[2..]) {
            0 => MarkerKind::Abort,
            1 => MarkerKind::Commit,
            _ => return None,
        };
        Some(TxnMarker {
            kind,
            producer_id: header.producer_id,
            producer_epoch: header.producer_epoch,
            coordinator_epoch: i32::from_be_bytes(value[2..6].try_into().expect("4 bytes")),
        })
    }
}

/// Reads zigzag varints (at most 10 bytes each) and byte runs, refusing to run past the end.
struct VarReader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> VarReader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let end = self.at.checked_add(n)?;
        let slice = self.bytes.get(self.at..end)?;
        self.at = end;
        Some(slice)
    }

    fn varint(&mut self) -> Option<i64> {
        let mut raw = 0u64;
        for i in 0..10 {
            let b = *self.bytes.get(self.at)?;
            self.at += 1;
            raw |= ((b & 0x7f) as u64) << (7 * i);
            if b & 0x80 == 0 {
                return Some((raw >> 1) as i64 ^ -((raw & 1) as i64));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_marker_is_a_valid_control_batch_that_reads_back() {
        for kind in [MarkerKind::Abort, MarkerKind::Commit] {
            let marker = TxnMarker { kind, producer_id: 77, producer_epoch: 3, coordinator_epoch: -2 };
            let bytes = marker.encode(1_700_000_000_000);
            let header = batch::validate(&bytes, 1 << 20).expect("a valid batch");
            assert_eq!(header.attributes, 0x30);
            assert_eq!((header.producer_id, header.producer_epoch, header.base_sequence), (77, 3, -1));
            assert_eq!((header.record_count, header.last_offset_delta), (1, 0));
            assert_eq!(TxnMarker::decode(&bytes), Some(marker));
        }
    }

    #[test]
    fn a_marker_has_kafkas_exact_record_bytes() {
        let marker =
            TxnMarker { kind: MarkerKind::Commit, producer_id: 1, producer_epoch: 0, coordinator_epoch: 0x0102_0304 };
        let bytes = marker.encode(0);
        // length 16, attributes, ts delta, offset delta, key len 4, key [0 0 0 1], value len 6,
        // value [0 0 1 2 3 4], no headers.
        let record = [32, 0, 0, 0, 8, 0, 0, 0, 1, 12, 0, 0, 1, 2, 3, 4, 0];
        assert_eq!(&bytes[HEADER_BYTES..], &record);
    }

    #[test]
    fn data_batches_and_other_control_records_are_not_markers() {
        assert_eq!(TxnMarker::decode(&batch::build_batch(0, &[b"x"])), None);
        let mut leader_change =
            TxnMarker { kind: MarkerKind::Abort, producer_id: 1, producer_epoch: 0, coordinator_epoch: 0 }.encode(0);
        leader_change[HEADER_BYTES + 8] = 2; // control type 2: KRaft's LEADER_CHANGE
        assert_eq!(TxnMarker::decode(&leader_change), None);
        let whole =
            TxnMarker { kind: MarkerKind::Abort, producer_id: 1, producer_epoch: 0, coordinator_epoch: 0 }.encode(0);
        for cut in HEADER_BYTES..whole.len() {
            assert_eq!(TxnMarker::decode(&whole[..cut]), None, "cut at {cut}");
        }
    }
}
