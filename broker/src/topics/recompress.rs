//! `compression.type` set to a codec: a batch that arrives in another codec is stored recompressed, as
//! Kafka does. This is the one case where the broker does not store a batch byte for byte as sent.
//!
//! Only the records section (bytes 61..) changes: it is decompressed and compressed again; the records
//! inside are kept byte for byte, so the batch keeps its record count, offset deltas, timestamps,
//! producer id, epoch and base sequence. The header gets the new length, the new codec in the low three
//! attribute bits (every other attribute bit is kept) and a CRC32C computed afresh.
//!
//! Untrusted input is checked before it is believed: the batch's CRC32C before anything is
//! decompressed (a damaged batch must not come out with a fresh, valid CRC), the decompressed size
//! against [`DECOMPRESSED_MAX_BYTES`] while it is produced, and the record framing (length prefixes
//! adding up, the count matching the header) before anything is compressed again.

use std::io::Read;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::compression::{self as codecs, Compressor};
use shardlog_storage::batch::{self, BatchError, HEADER_BYTES, LOG_OVERHEAD};

use super::configs::Codec;
use super::records::varint;

/// The most bytes one batch's records may decompress to. Recompression runs on the shard's thread
/// without pausing, so this bounds what one shard holds for it at any moment.
pub const DECOMPRESSED_MAX_BYTES: usize = 64 << 20;

/// Attribute bit of a control batch (transaction markers): never recompressed, as in Kafka.
const CONTROL_BIT: i16 = 0x20;

/// Why a batch could not be stored recompressed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecompressError {
    #[error(transparent)]
    Invalid(#[from] BatchError),
    #[error("unknown compression codec {0} in the batch attributes")]
    UnknownCodec(i16),
    #[error("records do not decompress: {0}")]
    Undecodable(String),
    #[error("records decompress to more than {DECOMPRESSED_MAX_BYTES} bytes")]
    TooLarge,
    #[error("decompressed records do not frame: {0}")]
    BadRecords(&'static str),
    #[error("records do not compress: {0}")]
    Compress(String),
}

/// The batch as it is to be stored in `target`: `None` when it already is (or is a control batch, or too
/// short to tell: the log's own checks refuse what is wrong with it), else the recompressed batch.
pub fn recompress(batch: &[u8], target: Codec) -> Result<Option<Bytes>, RecompressError> {
    let Ok(header) = batch::BatchHeader::parse(batch) else { return Ok(None) };
    let source =
        Codec::from_attributes(header.attributes).ok_or(RecompressError::UnknownCodec(header.attributes & 7))?;
    if source == target || header.attributes & CONTROL_BIT != 0 {
        return Ok(None);
    }
    let header = batch::validate(batch, usize::MAX)?;
    let records = decompress(source, &batch[HEADER_BYTES..])?;
    check_framing(&records, header.record_count)?;
    let mut out = BytesMut::with_capacity(HEADER_BYTES + records.len() / 2);
    out.put_slice(&batch[..HEADER_BYTES]);
    compress(target, &records, &mut out)?;
    let length = i32::try_from(out.len() - LOG_OVERHEAD).map_err(|_| RecompressError::TooLarge)?;
    out[8..12].copy_from_slice(&length.to_be_bytes());
    let attributes = (header.attributes & !7) | target as i16;
    out[21..23].copy_from_slice(&attributes.to_be_bytes());
    let crc = batch::compute_crc(&out);
    out[17..21].copy_from_slice(&crc.to_be_bytes());
    Ok(Some(out.freeze()))
}

/// Decompresses a records section, never holding more than [`DECOMPRESSED_MAX_BYTES`].
pub(crate) fn decompress(codec: Codec, body: &[u8]) -> Result<Vec<u8>, RecompressError> {
    let undecodable = |e: std::io::Error| RecompressError::Undecodable(e.to_string());
    match codec {
        Codec::None => Ok(body.to_vec()),
        Codec::Gzip => read_bounded(flate2::read::GzDecoder::new(body)),
        Codec::Zstd => read_bounded(zstd::stream::read::Decoder::new(body).map_err(undecodable)?),
        Codec::Lz4 => read_bounded(lz4::Decoder::new(body).map_err(undecodable)?),
        Codec::Snappy => snappy(body),
    }
}

fn read_bounded(reader: impl Read) -> Result<Vec<u8>, RecompressError> {
    let mut out = Vec::new();
    reader
        .take(DECOMPRESSED_MAX_BYTES as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|e| RecompressError::Undecodable(e.to_string()))?;
    if out.len() > DECOMPRESSED_MAX_BYTES {
        return Err(RecompressError::TooLarge);
    }
    Ok(out)
}

/// The header Kafka's clients put before snappy blocks (xerial's framing); without it the body is one
/// raw snappy block, as Kafka also accepts.
const XERIAL_MAGIC: &[u8; 8] = b"\x82SNAPPY\x00";
const XERIAL_HEADER_BYTES: usize = 16;

fn snappy(body: &[u8]) -> Result<Vec<u8>, RecompressError> {
    let mut blocks: Vec<&[u8]> = Vec::new();
    if body.starts_with(XERIAL_MAGIC) && body.len() >= XERIAL_HEADER_BYTES {
        let mut rest = &body[XERIAL_HEADER_BYTES..];
        while !rest.is_empty() {
            let (len, tail) =
                rest.split_at_checked(4).ok_or(RecompressError::Undecodable("cut block length".into()))?;
            let len = u32::from_be_bytes(len.try_into().expect("4 bytes")) as usize;
            let (block, tail) = tail.split_at_checked(len).ok_or(RecompressError::Undecodable("cut block".into()))?;
            blocks.push(block);
            rest = tail;
        }
    } else {
        blocks.push(body);
    }
    let mut out = Vec::new();
    for block in blocks {
        let undecodable = |e: snap::Error| RecompressError::Undecodable(e.to_string());
        // The length a block claims is checked before anything is allocated for it.
        let len = snap::raw::decompress_len(block).map_err(undecodable)?;
        if out.len() + len > DECOMPRESSED_MAX_BYTES {
            return Err(RecompressError::TooLarge);
        }
        let start = out.len();
        out.resize(start + len, 0);
        snap::raw::Decoder::new().decompress(block, &mut out[start..]).map_err(undecodable)?;
    }
    Ok(out)
}

pub(crate) fn compress(codec: Codec, records: &[u8], out: &mut BytesMut) -> Result<(), RecompressError> {
    let write = |buf: &mut BytesMut| {
        buf.put_slice(records);
        Ok(())
    };
    let done = match codec {
        Codec::None => {
            out.put_slice(records);
            Ok(())
        }
        Codec::Gzip => codecs::Gzip::compress(out, write),
        Codec::Snappy => codecs::Snappy::compress(out, write),
        Codec::Lz4 => codecs::Lz4::compress(out, write),
        Codec::Zstd => codecs::Zstd::compress(out, write),
    };
    done.map_err(|e| RecompressError::Compress(e.to_string()))
}

/// Walks the records' length prefixes: they must add up to the whole section, `count` of them.
fn check_framing(records: &[u8], count: i32) -> Result<(), RecompressError> {
    let mut at = 0usize;
    let mut seen = 0i64;
    while at < records.len() {
        let (len, used) = varint(&records[at..]).ok_or(RecompressError::BadRecords("a cut length prefix"))?;
        let len = usize::try_from(len).map_err(|_| RecompressError::BadRecords("a negative record length"))?;
        at = at
            .checked_add(used + len)
            .filter(|end| *end <= records.len())
            .ok_or(RecompressError::BadRecords("a record longer than what is left"))?;
        seen += 1;
    }
    if seen != count as i64 {
        return Err(RecompressError::BadRecords("the record count does not match the header"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use kafka_protocol::records::{
        Compression, NO_PARTITION_LEADER_EPOCH, Record, RecordBatchDecoder, RecordBatchEncoder, RecordEncodeOptions,
        TimestampType,
    };

    use super::*;

    /// A batch of `n` records from an idempotent producer, encoded by kafka-protocol in `codec`.
    fn client_batch(codec: Compression, n: i32) -> Vec<u8> {
        let records: Vec<Record> = (0..n)
            .map(|i| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
                producer_id: 77,
                producer_epoch: 3,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: 40 + i,
                timestamp: 1_700_000_000_000 + i as i64,
                key: Some(format!("key-{i}").into_bytes().into()),
                value: Some(vec![b'v'; 200 + i as usize].into()),
                headers: Default::default(),
            })
            .collect();
        let mut out = BytesMut::new();
        RecordBatchEncoder::encode(&mut out, &records, &RecordEncodeOptions { version: 2, compression: codec })
            .unwrap();
        out.to_vec()
    }

    #[test]
    fn a_recompressed_batch_keeps_its_records_and_header_fields_with_a_valid_crc() {
        let codecs = [
            (Compression::None, Codec::None),
            (Compression::Gzip, Codec::Gzip),
            (Compression::Snappy, Codec::Snappy),
            (Compression::Lz4, Codec::Lz4),
            (Compression::Zstd, Codec::Zstd),
        ];
        for (from_client, from) in codecs {
            let sent = client_batch(from_client, 25);
            let sent_header = batch::BatchHeader::parse(&sent).unwrap();
            for (_, to) in codecs {
                let stored = recompress(&sent, to).unwrap();
                if from == to {
                    assert_eq!(stored, None, "{from:?}: already in the codec, stored as sent");
                    continue;
                }
                let stored = stored.unwrap();
                let header = batch::validate(&stored, usize::MAX).unwrap_or_else(|e| panic!("{from:?}->{to:?}: {e}"));
                assert_eq!(header.compression(), to as u8);
                let same = |h: &batch::BatchHeader| {
                    (h.record_count, h.last_offset_delta, h.base_timestamp, h.max_timestamp, h.producer_id)
                };
                assert_eq!(same(&header), same(&sent_header));
                assert_eq!((header.producer_epoch, header.base_sequence), (3, 40));
                assert_eq!(header.attributes & !7, sent_header.attributes & !7, "other attribute bits kept");
                let decoded = RecordBatchDecoder::decode(&mut stored.clone()).unwrap();
                let original = RecordBatchDecoder::decode(&mut bytes::Bytes::from(sent.clone())).unwrap();
                assert_eq!(decoded.records, original.records, "{from:?}->{to:?}");
            }
        }
    }

    #[test]
    fn a_damaged_batch_is_refused_before_it_could_get_a_fresh_crc() {
        let mut sent = client_batch(Compression::Gzip, 3);
        let last = sent.len() - 1;
        sent[last] ^= 0xff;
        assert!(matches!(recompress(&sent, Codec::Zstd), Err(RecompressError::Invalid(BatchError::BadCrc { .. }))));
    }

    /// A batch claiming `count` records whose records section is `body`, in `codec`, with a correct CRC.
    fn forged(codec: Codec, count: i32, body: &[u8]) -> Vec<u8> {
        let mut records = BytesMut::new();
        compress(codec, body, &mut records).unwrap();
        let mut b = client_batch(Compression::None, 1)[..HEADER_BYTES].to_vec();
        b.extend_from_slice(&records);
        let length = (b.len() - LOG_OVERHEAD) as i32;
        b[8..12].copy_from_slice(&length.to_be_bytes());
        b[21..23].copy_from_slice(&(codec as i16).to_be_bytes());
        b[23..27].copy_from_slice(&(count - 1).to_be_bytes());
        b[57..61].copy_from_slice(&count.to_be_bytes());
        let crc = batch::compute_crc(&b);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
        b
    }

    #[test]
    fn a_decompression_bomb_stops_at_the_limit() {
        let zeros = vec![0u8; DECOMPRESSED_MAX_BYTES + 4096];
        for codec in [Codec::Gzip, Codec::Zstd, Codec::Lz4, Codec::Snappy] {
            let bomb = forged(codec, 1, &zeros);
            assert!(bomb.len() < zeros.len() / 10, "{codec:?} compresses zeros well");
            assert_eq!(recompress(&bomb, Codec::None), Err(RecompressError::TooLarge), "{codec:?}");
        }
    }

    #[test]
    fn records_that_do_not_frame_or_count_up_are_refused() {
        // One record of 3 bytes (length prefix 6 = zigzag 3), but the header claims two.
        let body = [6u8, 1, 2, 3];
        assert!(matches!(recompress(&forged(Codec::Gzip, 2, &body), Codec::None), Err(RecompressError::BadRecords(_))));
        // A length running past the end.
        let body = [40u8, 1, 2, 3];
        assert!(matches!(recompress(&forged(Codec::Gzip, 1, &body), Codec::None), Err(RecompressError::BadRecords(_))));
        // Garbage that does not decompress at all.
        let mut garbage = forged(Codec::Gzip, 1, &[6u8, 1, 2, 3]);
        garbage[HEADER_BYTES + 12] ^= 0x5a;
        let crc = batch::compute_crc(&garbage);
        garbage[17..21].copy_from_slice(&crc.to_be_bytes());
        assert!(recompress(&garbage, Codec::None).is_err());
        assert_eq!(recompress(&forged(Codec::Gzip, 1, &[6u8, 1, 2, 3]), Codec::None).map(|b| b.is_some()), Ok(true));
    }
}
