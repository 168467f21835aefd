//! What the load generators send: record values that say who sent them and in which order, batches
//! encoded (and compressed) by `kafka-protocol`, and the hash the durability audit compares.
//!
//! A value is `run id (u64) | partition (u32) | sequence (u64) | filler`, big-endian, `message_size`
//! bytes long (at least the 20-byte prefix). The record timestamp is the producer's clock at creation,
//! so consumers can measure end-to-end latency.

use anyhow::{Result, bail};
use bytes::{Bytes, BytesMut};
use indexmap::IndexMap;
use kafka_protocol::records::{
    Compression, NO_PARTITION_LEADER_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, Record, RecordBatchEncoder,
    RecordEncodeOptions, TimestampType,
};

/// Bytes of the value prefix that identifies a record.
pub const PREFIX_BYTES: usize = 20;

/// Who sent a record and where it sits in that sender's order for its partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Origin {
    pub run: u64,
    pub partition: u32,
    pub sequence: u64,
}

impl Origin {
    /// Reads the prefix of a value, if it has one.
    pub fn parse(value: &[u8]) -> Option<Origin> {
        if value.len() < PREFIX_BYTES {
            return None;
        }
        Some(Origin {
            run: u64::from_be_bytes(value[0..8].try_into().ok()?),
            partition: u32::from_be_bytes(value[8..12].try_into().ok()?),
            sequence: u64::from_be_bytes(value[12..20].try_into().ok()?),
        })
    }
}

/// Bytes of filler text values are cut from (generated once: making it per value would cost the load
/// generator more CPU than the broker it measures).
const FILLER_BYTES: usize = 1 << 20;

/// Filler that compresses like text rather than like zeros or noise.
fn filler() -> &'static [u8] {
    static FILLER: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    FILLER.get_or_init(|| {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        (0..FILLER_BYTES)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b"the quick brown fox jumps over a lazy dog 0123456789"[(x % 52) as usize]
            })
            .collect()
    })
}

/// A value of `size` bytes for `origin`.
pub fn value(origin: Origin, size: usize) -> Bytes {
    let mut v = Vec::with_capacity(size.max(PREFIX_BYTES));
    v.extend_from_slice(&origin.run.to_be_bytes());
    v.extend_from_slice(&origin.partition.to_be_bytes());
    v.extend_from_slice(&origin.sequence.to_be_bytes());
    let filler = filler();
    let mut at = (origin.sequence.wrapping_mul(7919) % (FILLER_BYTES as u64 / 2)) as usize;
    while v.len() < size {
        let n = (size - v.len()).min(FILLER_BYTES - at);
        v.extend_from_slice(&filler[at..at + n]);
        at = 0;
    }
    Bytes::from(v)
}

/// The hash the audit compares: CRC32C of the value.
pub fn hash(value: &[u8]) -> u32 {
    crc32c::crc32c(value)
}

/// `none|gzip|snappy|lz4|zstd`.
pub fn compression(name: &str) -> Result<Compression> {
    Ok(match name {
        "none" => Compression::None,
        "gzip" => Compression::Gzip,
        "snappy" => Compression::Snappy,
        "lz4" => Compression::Lz4,
        "zstd" => Compression::Zstd,
        other => bail!("unknown compression {other:?}: none, gzip, snappy, lz4 or zstd"),
    })
}

/// An idempotent producer's id and epoch, and the sequence of a batch's first record in its partition;
/// `transactional` marks the batch as part of a transaction (attribute bit 0x10).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Idempotent {
    pub producer_id: i64,
    pub epoch: i16,
    pub first_sequence: u64,
    pub transactional: bool,
}

/// One record batch holding `values`, all stamped `timestamp_ms`; from an idempotent producer when
/// `producer` says so.
pub fn batch(
    values: &[Bytes],
    timestamp_ms: i64,
    compression: Compression,
    producer: Option<Idempotent>,
) -> Result<Bytes> {
    encode(values.iter().map(|v| (None, v.clone())), timestamp_ms, compression, producer)
}

/// A batch of `(key, value)` records (for compacted topics, which refuse records without a key).
pub fn keyed_batch(records: &[(Bytes, Bytes)], timestamp_ms: i64, compression: Compression) -> Result<Bytes> {
    encode(records.iter().map(|(k, v)| (Some(k.clone()), v.clone())), timestamp_ms, compression, None)
}

fn encode(
    records: impl Iterator<Item = (Option<Bytes>, Bytes)>,
    timestamp_ms: i64,
    compression: Compression,
    producer: Option<Idempotent>,
) -> Result<Bytes> {
    let records: Vec<Record> = records
        .enumerate()
        .map(|(i, (key, v))| Record {
            transactional: producer.is_some_and(|p| p.transactional),
            control: false,
            delete_horizon: false,
            partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
            producer_id: producer.map_or(NO_PRODUCER_ID, |p| p.producer_id),
            producer_epoch: producer.map_or(NO_PRODUCER_EPOCH, |p| p.epoch),
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // The encoder keeps records in one batch while offset - sequence stays the same; with no
            // producer id the base sequence must be -1 (no sequence). Sequences wrap after i32::MAX.
            sequence: match producer {
                Some(p) => ((p.first_sequence + i as u64) % (i32::MAX as u64 + 1)) as i32,
                None => i as i32 - 1,
            },
            timestamp: timestamp_ms,
            key,
            value: Some(v),
            headers: IndexMap::new(),
        })
        .collect();
    let mut buf = BytesMut::new();
    RecordBatchEncoder::encode(&mut buf, &records, &RecordEncodeOptions { version: 2, compression })?;
    Ok(buf.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kafka_protocol::records::RecordBatchDecoder;

    #[test]
    fn a_transactional_batch_carries_bit_0x10_its_producer_and_sequences() {
        let values: Vec<Bytes> = (0..3).map(|s| value(Origin { run: 1, partition: 0, sequence: s }, 64)).collect();
        let producer = Idempotent { producer_id: 42, epoch: 3, first_sequence: 10, transactional: true };
        let encoded = batch(&values, 1_700_000_000_000, Compression::None, Some(producer)).unwrap();
        let header = shardlog_storage::batch::BatchHeader::parse(&encoded).unwrap();
        assert_eq!(header.attributes & 0x10, 0x10, "transactional");
        assert_eq!(header.attributes & 0x20, 0, "not a control batch");
        assert_eq!((header.producer_id, header.producer_epoch, header.base_sequence), (42, 3, 10));
        let idempotent = batch(&values, 0, Compression::None, Some(Idempotent { transactional: false, ..producer }));
        let header = shardlog_storage::batch::BatchHeader::parse(&idempotent.unwrap()).unwrap();
        assert_eq!(header.attributes & 0x10, 0, "an idempotent batch is not transactional");
    }

    #[test]
    fn values_carry_their_origin_and_batches_decode_whole() {
        for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
            let values: Vec<Bytes> =
                (0..50).map(|s| value(Origin { run: 7, partition: 3, sequence: s }, 1024)).collect();
            let encoded = batch(&values, 1_700_000_000_000, compression(codec).unwrap(), None).unwrap();
            let header = shardlog_storage::batch::BatchHeader::parse(&encoded).unwrap();
            assert_eq!(header.record_count, 50, "{codec}: one batch, not one per record");
            let mut bytes = encoded.clone();
            let set = RecordBatchDecoder::decode(&mut bytes).unwrap();
            for (i, r) in set.records.iter().enumerate() {
                let v = r.value.as_ref().unwrap();
                assert_eq!(Origin::parse(v), Some(Origin { run: 7, partition: 3, sequence: i as u64 }));
                assert_eq!(v.len(), 1024);
                assert_eq!(r.timestamp, 1_700_000_000_000);
            }
        }
    }
}
