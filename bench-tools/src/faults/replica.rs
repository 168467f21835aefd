//! Reads a replica's copy of a partition straight from a stopped broker's data directory, so the campaign
//! can compare every replica with the leader, followers included (a follower answers no consumer fetch).
//! It only reads: the segment files of `<data>/<topic>-<partition>/` in base-offset order, each batch in
//! turn, up to the first place that holds no whole batch (the zeros a segment's reserved space ends in, or
//! a batch cut short).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use kafka_protocol::records::RecordBatchDecoder;

use super::txn_check::{LogRecord, RecordKind};

/// Bytes of a batch header before its length field ends: base offset (8) and batch length (4).
const LENGTH_END: usize = 12;
/// The smallest batch length field of a v2 batch: its header after the length field (49 bytes).
const MIN_BATCH_LENGTH: usize = 49;
/// Where a v2 batch keeps its magic byte and its CRC32C, which covers the batch from the byte after it.
const MAGIC_AT: usize = 16;
const CRC_AT: usize = 17;
const CRC_COVERS_FROM: usize = 21;

/// One record of a replica's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaRecord {
    pub offset: u64,
    pub value: Bytes,
}

/// The records of `topic`-`partition` in the data directory `data`, in offset order; `None` if the broker
/// holds no such log.
pub fn read_replica(data: &Path, topic: &str, partition: u32) -> Result<Option<Vec<ReplicaRecord>>> {
    let dir = data.join(format!("{topic}-{partition}"));
    if !dir.is_dir() {
        return Ok(None);
    }
    let mut out = Vec::new();
    for (_, path) in segments(&dir)? {
        let bytes = std::fs::read(&path).with_context(|| format!("read {}", path.display()))?;
        read_batches(Bytes::from(bytes), &mut out).with_context(|| format!("decode {}", path.display()))?;
    }
    Ok(Some(out))
}

/// The segment files (`<base offset>.log`) of a partition directory, by base offset.
pub fn segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let mut segments: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .with_context(|| format!("list {}", dir.display()))?
        .filter_map(|entry| entry.ok())
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let base = name.strip_suffix(".log")?.parse::<u64>().ok()?;
            Some((base, entry.path()))
        })
        .collect();
    segments.sort();
    Ok(segments)
}

/// Where each whole batch at the start of `segment` ends, judged by the batches' length fields alone: the
/// first place that holds no whole batch ends the list.
pub fn batch_ends(segment: &[u8]) -> Vec<usize> {
    let mut ends = Vec::new();
    let mut at = 0;
    while segment.len() - at >= LENGTH_END {
        let length = i32::from_be_bytes(segment[at + 8..at + 12].try_into().expect("four bytes"));
        let end = at + LENGTH_END + length.max(0) as usize;
        if length < MIN_BATCH_LENGTH as i32 || end > segment.len() {
            break;
        }
        ends.push(end);
        at = end;
    }
    ends
}

/// Appends the records of the whole batches at the start of `segment` to `out`.
fn read_batches(segment: Bytes, out: &mut Vec<ReplicaRecord>) -> Result<()> {
    for record in log_records(segment)? {
        out.push(ReplicaRecord { offset: record.offset, value: record.value });
    }
    Ok(())
}

/// The records of the whole batches at the start of `bytes` (a segment, or a fetch answer's records),
/// each with what its batch says it is: plain, transactional, or a transaction's marker. Every batch's
/// CRC32C is checked.
pub fn log_records(bytes: Bytes) -> Result<Vec<LogRecord>> {
    let segment = bytes;
    let mut out = Vec::new();
    let mut at = 0;
    for end in batch_ends(&segment) {
        let mut batch = segment.slice(at..end);
        if batch.len() < CRC_COVERS_FROM || batch[MAGIC_AT] != 2 {
            bail!("a batch at byte {at} that is not a v2 record batch");
        }
        let stored = u32::from_be_bytes(batch[CRC_AT..CRC_COVERS_FROM].try_into().expect("four bytes"));
        if crc32c::crc32c(&batch[CRC_COVERS_FROM..]) != stored {
            bail!("the batch at byte {at} fails its CRC32C");
        }
        let set = RecordBatchDecoder::decode(&mut batch).context("a batch that does not decode")?;
        for record in set.records {
            let kind = match (record.control, record.transactional) {
                // A control record's key: version (2 bytes), then type (2 bytes): 0 ABORT, 1 COMMIT.
                (true, _) => {
                    let key = record.key.as_deref().unwrap_or_default();
                    let commit = key.get(2..4).is_some_and(|t| t == [0, 1]);
                    RecordKind::Marker { producer_id: record.producer_id, commit }
                }
                (false, true) => RecordKind::Transactional { producer_id: record.producer_id },
                (false, false) => RecordKind::Plain,
            };
            let value = record.value.unwrap_or_default();
            out.push(LogRecord { offset: record.offset as u64, kind, value });
        }
        at = end;
    }
    Ok(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use bytes::BytesMut;
    use kafka_protocol::records::{
        Compression, NO_PARTITION_LEADER_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, Record, RecordBatchEncoder,
        RecordEncodeOptions, TimestampType,
    };

    use super::*;

    pub(crate) fn batch(base: i64, values: &[&str]) -> BytesMut {
        let records: Vec<Record> = values
            .iter()
            .enumerate()
            .map(|(i, v)| Record {
                transactional: false,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
                producer_id: NO_PRODUCER_ID,
                producer_epoch: NO_PRODUCER_EPOCH,
                timestamp_type: TimestampType::Creation,
                offset: base + i as i64,
                // One batch: the encoder splits where offset - sequence changes (no producer: from -1).
                sequence: i as i32 - 1,
                timestamp: 0,
                key: None,
                value: Some(Bytes::copy_from_slice(v.as_bytes())),
                headers: Default::default(),
            })
            .collect();
        let mut out = BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression: Compression::None };
        RecordBatchEncoder::encode(&mut out, &records, &options).expect("encoded");
        out
    }

    #[test]
    fn segments_are_read_in_offset_order_up_to_the_first_gap() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("orders-eu-3");
        std::fs::create_dir(&log).unwrap();
        let mut first = batch(0, &["a", "b"]);
        first.extend_from_slice(&batch(2, &["c"]));
        std::fs::write(log.join("00000000000000000000.log"), &first).unwrap();
        // The active segment: a batch, then its reserved space (zeros), as a killed broker leaves it.
        let mut active = batch(3, &["d", "e"]);
        active.extend_from_slice(&[0u8; 4096]);
        std::fs::write(log.join("00000000000000000003.log"), &active).unwrap();
        std::fs::write(log.join("00000000000000000003.index"), [1u8; 8]).unwrap();

        let records = read_replica(dir.path(), "orders-eu", 3).unwrap().expect("a log");
        let seen: Vec<(u64, &[u8])> = records.iter().map(|r| (r.offset, r.value.as_ref())).collect();
        assert_eq!(seen, vec![(0, &b"a"[..]), (1, b"b"), (2, b"c"), (3, b"d"), (4, b"e")]);
        assert_eq!(read_replica(dir.path(), "orders-eu", 4).unwrap(), None, "no such log");
    }

    #[test]
    fn records_say_whether_they_are_plain_transactional_or_a_marker() {
        let record = |offset: i64, control: bool, key: Option<&'static [u8]>| Record {
            transactional: true,
            control,
            delete_horizon: false,
            partition_leader_epoch: 0,
            producer_id: 42,
            producer_epoch: 3,
            timestamp_type: TimestampType::Creation,
            offset,
            sequence: if control { -1 } else { offset as i32 },
            timestamp: 0,
            key: key.map(Bytes::from_static),
            value: Some(Bytes::from_static(b"v")),
            headers: Default::default(),
        };
        let options = RecordEncodeOptions { version: 2, compression: Compression::None };
        let mut bytes = batch(0, &["plain"]);
        RecordBatchEncoder::encode(&mut bytes, &[record(1, false, None)], &options).unwrap();
        // Control records' keys: version 0, then type 0 (ABORT) or 1 (COMMIT).
        RecordBatchEncoder::encode(&mut bytes, &[record(2, true, Some(&[0, 0, 0, 0]))], &options).unwrap();
        RecordBatchEncoder::encode(&mut bytes, &[record(3, true, Some(&[0, 0, 0, 1]))], &options).unwrap();
        let kinds: Vec<(u64, RecordKind)> =
            log_records(bytes.freeze()).unwrap().into_iter().map(|r| (r.offset, r.kind)).collect();
        assert_eq!(
            kinds,
            vec![
                (0, RecordKind::Plain),
                (1, RecordKind::Transactional { producer_id: 42 }),
                (2, RecordKind::Marker { producer_id: 42, commit: false }),
                (3, RecordKind::Marker { producer_id: 42, commit: true }),
            ]
        );
    }

    #[test]
    fn a_batch_cut_short_ends_the_log_and_a_damaged_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("t-0");
        std::fs::create_dir(&log).unwrap();
        let mut bytes = batch(0, &["a"]);
        let second = batch(1, &["b", "c"]);
        bytes.extend_from_slice(&second[..40]);
        std::fs::write(log.join("00000000000000000000.log"), &bytes).unwrap();
        let records = read_replica(dir.path(), "t", 0).unwrap().expect("a log");
        assert_eq!(records.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![0]);

        let mut damaged = batch(0, &["a"]);
        let last = damaged.len() - 1;
        damaged[last] ^= 0xff;
        std::fs::write(log.join("00000000000000000000.log"), &damaged).unwrap();
        assert!(read_replica(dir.path(), "t", 0).is_err(), "a whole batch whose CRC does not check");
    }
}
