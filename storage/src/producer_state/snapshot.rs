//! The producer-state snapshot file (`docs/storage-format.md` §9): the state of the batches below an
//! offset, so that opening a log replays only the batches after it.
//!
//! Version 2 adds each producer's open transaction and last coordinator epoch, and lets a producer known
//! by markers alone have no batches. Version 1 files (written before transactions were served, so with no
//! open transaction) are still read.

use std::collections::{BTreeMap, VecDeque};

use crate::types::Offset;

use super::{BATCHES_KEPT, NO_COORDINATOR_EPOCH, ProducerBatch, ProducerEntry, ProducerStates};

/// The first bytes of a snapshot file.
pub const SNAPSHOT_MAGIC: &[u8; 4] = b"SLPS";
/// The version written.
pub const SNAPSHOT_VERSION: u16 = 2;
/// The version before transactions: no transaction fields, at least one batch per producer.
const SNAPSHOT_VERSION_1: u16 = 1;
/// Magic, version, CRC32C.
const SNAPSHOT_HEADER_BYTES: usize = 10;
/// The smallest producer of a version 1 file: id, epoch, timestamp, count, and one batch.
const PRODUCER_MIN_BYTES_V1: usize = 8 + 2 + 8 + 1 + 24;
/// The smallest producer of a version 2 file: id, epoch, timestamp, coordinator epoch, transaction's first
/// offset, count, and no batch.
const PRODUCER_MIN_BYTES_V2: usize = 8 + 2 + 8 + 4 + 8 + 1;
/// The suffix of a snapshot file; its name is the offset it was taken at, 20 digits, as segments are named.
pub const SNAPSHOT_SUFFIX: &str = ".snapshot";

impl ProducerStates {
    /// The snapshot file's bytes for this state, taken at log end offset `offset`
    /// (`docs/storage-format.md` §9).
    pub fn encode(&self, offset: Offset) -> Vec<u8> {
        let mut body = Vec::with_capacity(12 + self.producers.len() * 64);
        body.extend_from_slice(&offset.0.to_be_bytes());
        body.extend_from_slice(&(self.producers.len() as u32).to_be_bytes());
        for (id, e) in &self.producers {
            body.extend_from_slice(&id.to_be_bytes());
            body.extend_from_slice(&e.epoch.to_be_bytes());
            body.extend_from_slice(&e.last_append_ms.to_be_bytes());
            body.extend_from_slice(&e.coordinator_epoch.to_be_bytes());
            body.extend_from_slice(&e.txn_first_offset.map_or(-1, Offset::as_i64).to_be_bytes());
            body.push(e.batches.len() as u8);
            for b in &e.batches {
                body.extend_from_slice(&b.first_seq.to_be_bytes());
                body.extend_from_slice(&b.last_seq.to_be_bytes());
                body.extend_from_slice(&b.base_offset.0.to_be_bytes());
                body.extend_from_slice(&b.last_offset.0.to_be_bytes());
            }
        }
        let mut out = Vec::with_capacity(SNAPSHOT_HEADER_BYTES + body.len());
        out.extend_from_slice(SNAPSHOT_MAGIC);
        out.extend_from_slice(&SNAPSHOT_VERSION.to_be_bytes());
        out.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Reads a snapshot file (version 1 or 2): the offset it was taken at and the state. Every length is
    /// bounded by the bytes present before anything is allocated; the CRC32C is checked before the body is
    /// parsed.
    pub fn decode(bytes: &[u8]) -> Result<(Offset, ProducerStates), String> {
        if bytes.len() < SNAPSHOT_HEADER_BYTES + 12 {
            return Err(format!("{} bytes, shorter than a snapshot header", bytes.len()));
        }
        if &bytes[..4] != SNAPSHOT_MAGIC {
            return Err("not a producer-state snapshot (bad magic)".into());
        }
        let version = u16::from_be_bytes([bytes[4], bytes[5]]);
        let min_producer_bytes = match version {
            SNAPSHOT_VERSION_1 => PRODUCER_MIN_BYTES_V1,
            SNAPSHOT_VERSION => PRODUCER_MIN_BYTES_V2,
            _ => return Err(format!("unknown snapshot version {version}")),
        };
        let crc = u32::from_be_bytes(bytes[6..10].try_into().expect("4 bytes"));
        let body = &bytes[SNAPSHOT_HEADER_BYTES..];
        if crc32c::crc32c(body) != crc {
            return Err("CRC32C mismatch".into());
        }
        let mut r = Reader { bytes: body, at: 0 };
        let offset = Offset(r.u64()?);
        let count = r.u32()? as usize;
        if count > body.len() / min_producer_bytes {
            return Err(format!("{count} producers cannot fit in {} bytes", body.len()));
        }
        let mut producers = BTreeMap::new();
        for _ in 0..count {
            let id = r.u64()? as i64;
            let epoch = r.u16()? as i16;
            let last_append_ms = r.u64()? as i64;
            let (coordinator_epoch, txn_first) = if version == SNAPSHOT_VERSION_1 {
                (NO_COORDINATOR_EPOCH, -1)
            } else {
                (r.u32()? as i32, r.u64()? as i64)
            };
            let n = r.u8()? as usize;
            let fewest = if version == SNAPSHOT_VERSION_1 { 1 } else { 0 };
            if n < fewest || n > BATCHES_KEPT || id < 0 || epoch < 0 || coordinator_epoch < NO_COORDINATOR_EPOCH {
                return Err(format!(
                    "producer {id}: epoch {epoch}, coordinator epoch {coordinator_epoch}, {n} batches"
                ));
            }
            let txn_first_offset = match txn_first {
                -1 => None,
                first if first >= 0 && (first as u64) < offset.0 => Some(Offset(first as u64)),
                first => return Err(format!("producer {id}: open transaction from {first}, beyond {offset}")),
            };
            let mut batches = VecDeque::with_capacity(n);
            for _ in 0..n {
                let first_seq = r.u32()? as i32;
                let last_seq = r.u32()? as i32;
                let base_offset = Offset(r.u64()?);
                let last_offset = Offset(r.u64()?);
                if last_offset < base_offset || last_offset >= offset {
                    return Err(format!("producer {id}: batch {base_offset}..{last_offset} beyond {offset}"));
                }
                batches.push_back(ProducerBatch { first_seq, last_seq, base_offset, last_offset });
            }
            let entry = ProducerEntry { epoch, batches, last_append_ms, txn_first_offset, coordinator_epoch };
            if producers.insert(id, entry).is_some() {
                return Err(format!("producer {id} appears twice"));
            }
        }
        if r.at != body.len() {
            return Err(format!("{} bytes after the last producer", body.len() - r.at));
        }
        let states = ProducerStates::from_producers(producers);
        if states.open_txns.len() != states.producers.values().filter(|e| e.txn_first_offset.is_some()).count() {
            return Err("two open transactions start at the same offset".into());
        }
        Ok((offset, states))
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], String> {
        let end = self.at + N;
        let slice = self.bytes.get(self.at..end).ok_or("the snapshot ends inside a producer")?;
        self.at = end;
        Ok(slice.try_into().expect("N bytes"))
    }
    fn u8(&mut self) -> Result<u8, String> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from_be_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from_be_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, String> {
        Ok(u64::from_be_bytes(self.take()?))
    }
}
