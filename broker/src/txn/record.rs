//! The records of `__transaction_state`, in Kafka's byte layout, so that the topic reads the same to Kafka's
//! tools and to us.
//!
//! Key (`TransactionLogKey`, version 0):
//!
//! | field            | type                          |
//! |------------------|-------------------------------|
//! | version          | int16 = 0                     |
//! | transactional id | string (int16 length, UTF-8)  |
//!
//! Value (`TransactionLogValue`); a null value (tombstone) means the id expired:
//!
//! | field                  | version 0                      | version 1 (flexible)                 |
//! |------------------------|--------------------------------|--------------------------------------|
//! | version                | int16 = 0                      | int16 = 1                            |
//! | producer id            | int64                          | int64                                |
//! | producer epoch         | int16                          | int16                                |
//! | transaction timeout ms | int32                          | int32                                |
//! | state                  | int8 ([`TxnState::id`])        | int8                                 |
//! | partitions             | int32 count (-1 null), entries | uvarint count+1 (0 null), entries    |
//! | - topic                | string (int16 length)          | uvarint length+1, UTF-8              |
//! | - partition ids        | int32 count, int32 each        | uvarint count+1, int32 each          |
//! | - (entry tags)         | -                              | tagged fields                        |
//! | last update ms         | int64                          | int64                                |
//! | start ms               | int64                          | int64                                |
//! | (tags)                 | -                              | tag 0: previous producer id (int64), tag 1: next producer id, tag 2: client transaction version |
//!
//! We write version 1 (Kafka's current), with tag 0 when the id's producer id was rotated; we read both.
//! Unknown tags are skipped. Every length is checked against the bytes left before anything is allocated.

use std::collections::{BTreeMap, BTreeSet};

use shardlog_storage::TopicPartition;

use super::metadata::{NO_PRODUCER_EPOCH, NO_PRODUCER_ID, TxnSnapshot, TxnState};

/// A record of `__transaction_state`: the id, and its metadata or a tombstone (`None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnLogRecord {
    pub transactional_id: String,
    pub value: Option<TxnSnapshot>,
}

/// Why a record of `__transaction_state` could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RecordError {
    #[error("record ends before its {0}")]
    Truncated(&'static str),
    #[error("unknown {what} version {version}")]
    UnknownVersion { what: &'static str, version: i16 },
    #[error("{0} is not UTF-8")]
    NotUtf8(&'static str),
    #[error("negative length for {0}")]
    BadLength(&'static str),
    #[error("unknown transaction state {0}")]
    UnknownState(i8),
    #[error("negative partition id {0}")]
    NegativePartition(i32),
    #[error("{0} bytes after the end of the record")]
    TrailingBytes(usize),
}

const TAG_PREVIOUS_PRODUCER_ID: u32 = 0;

impl TxnLogRecord {
    pub fn encode_key(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(4 + self.transactional_id.len());
        out.extend_from_slice(&0i16.to_be_bytes());
        put_string(&mut out, &self.transactional_id);
        out
    }

    /// The value's bytes (version 1), or `None` for a tombstone.
    pub fn encode_value(&self) -> Option<Vec<u8>> {
        self.value.as_ref().map(encode_value_v1)
    }

    /// Reads a record from its key and value bytes (`None`: a tombstone).
    pub fn decode(key: &[u8], value: Option<&[u8]>) -> Result<TxnLogRecord, RecordError> {
        let mut r = Reader(key);
        let version = r.i16("key version")?;
        if version != 0 {
            return Err(RecordError::UnknownVersion { what: "key", version });
        }
        let transactional_id = r.string("transactional id")?;
        r.finish()?;
        let value = value.map(decode_value).transpose()?;
        Ok(TxnLogRecord { transactional_id, value })
    }
}

fn by_topic(partitions: &BTreeSet<TopicPartition>) -> BTreeMap<&str, Vec<u32>> {
    let mut topics: BTreeMap<&str, Vec<u32>> = BTreeMap::new();
    for tp in partitions {
        topics.entry(tp.topic.as_str()).or_default().push(tp.partition);
    }
    topics
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    let len = i16::try_from(s.len()).expect("names fit an int16 length");
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_uvarint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn put_compact_len(out: &mut Vec<u8>, len: usize) {
    put_uvarint(out, u32::try_from(len + 1).expect("lengths fit a uvarint"));
}

fn state_for_log(state: TxnState) -> TxnState {
    assert!(state != TxnState::PrepareEpochFence, "PrepareEpochFence is never written to the log");
    state
}

/// Version 0 of the value: what Kafka before version 1 wrote (kept for the round-trip tests and for
/// reading; we write version 1).
pub fn encode_value_v0(v: &TxnSnapshot) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&0i16.to_be_bytes());
    out.extend_from_slice(&v.producer_id.to_be_bytes());
    out.extend_from_slice(&v.producer_epoch.to_be_bytes());
    out.extend_from_slice(&v.txn_timeout_ms.to_be_bytes());
    out.push(state_for_log(v.state).id() as u8);
    let topics = by_topic(&v.partitions);
    out.extend_from_slice(&(topics.len() as i32).to_be_bytes());
    for (topic, ids) in topics {
        put_string(&mut out, topic);
        out.extend_from_slice(&(ids.len() as i32).to_be_bytes());
        for id in ids {
            out.extend_from_slice(&(id as i32).to_be_bytes());
        }
    }
    out.extend_from_slice(&v.txn_last_update_ms.to_be_bytes());
    out.extend_from_slice(&v.txn_start_ms.to_be_bytes());
    out
}

fn encode_value_v1(v: &TxnSnapshot) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.extend_from_slice(&1i16.to_be_bytes());
    out.extend_from_slice(&v.producer_id.to_be_bytes());
    out.extend_from_slice(&v.producer_epoch.to_be_bytes());
    out.extend_from_slice(&v.txn_timeout_ms.to_be_bytes());
    out.push(state_for_log(v.state).id() as u8);
    let topics = by_topic(&v.partitions);
    put_compact_len(&mut out, topics.len());
    for (topic, ids) in topics {
        put_compact_len(&mut out, topic.len());
        out.extend_from_slice(topic.as_bytes());
        put_compact_len(&mut out, ids.len());
        for id in ids {
            out.extend_from_slice(&(id as i32).to_be_bytes());
        }
        put_uvarint(&mut out, 0); // no tagged fields in an entry
    }
    out.extend_from_slice(&v.txn_last_update_ms.to_be_bytes());
    out.extend_from_slice(&v.txn_start_ms.to_be_bytes());
    if v.last_producer_id == NO_PRODUCER_ID {
        put_uvarint(&mut out, 0);
    } else {
        put_uvarint(&mut out, 1);
        put_uvarint(&mut out, TAG_PREVIOUS_PRODUCER_ID);
        put_uvarint(&mut out, 8);
        out.extend_from_slice(&v.last_producer_id.to_be_bytes());
    }
    out
}

fn decode_value(bytes: &[u8]) -> Result<TxnSnapshot, RecordError> {
    let mut r = Reader(bytes);
    let version = r.i16("value version")?;
    let flexible = match version {
        0 => false,
        1 => true,
        _ => return Err(RecordError::UnknownVersion { what: "value", version }),
    };
    let producer_id = r.i64("producer id")?;
    let producer_epoch = r.i16("producer epoch")?;
    let txn_timeout_ms = r.i32("transaction timeout")?;
    let state_id = r.i8("state")?;
    let state = TxnState::from_id(state_id).ok_or(RecordError::UnknownState(state_id))?;
    let mut partitions = BTreeSet::new();
    // An entry takes at least 2 bytes (flexible) or 6 bytes, so a count is bounded by what is left.
    let topics = if flexible { r.compact_len("partitions", 3)? } else { r.array_len("partitions", 6)? };
    for _ in 0..topics.unwrap_or(0) {
        let topic = if flexible { r.compact_string("topic")? } else { r.string("topic")? };
        let ids = if flexible { r.compact_len("partition ids", 4)? } else { r.array_len("partition ids", 4)? };
        for _ in 0..ids.ok_or(RecordError::BadLength("partition ids"))? {
            let id = r.i32("partition id")?;
            let id = u32::try_from(id).map_err(|_| RecordError::NegativePartition(id))?;
            partitions.insert(TopicPartition::new(topic.clone(), id));
        }
        if flexible {
            r.skip_tags(|_, _| Ok(()))?;
        }
    }
    let txn_last_update_ms = r.i64("last update")?;
    let txn_start_ms = r.i64("start")?;
    let mut last_producer_id = NO_PRODUCER_ID;
    if flexible {
        r.skip_tags(|tag, data| {
            if tag == TAG_PREVIOUS_PRODUCER_ID {
                let bytes: [u8; 8] = data.try_into().map_err(|_| RecordError::BadLength("previous producer id"))?;
                last_producer_id = i64::from_be_bytes(bytes);
            }
            Ok(())
        })?;
    }
    r.finish()?;
    Ok(TxnSnapshot {
        producer_id,
        last_producer_id,
        producer_epoch,
        last_producer_epoch: NO_PRODUCER_EPOCH,
        txn_timeout_ms,
        state,
        partitions,
        txn_start_ms,
        txn_last_update_ms,
    })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], RecordError> {
        if self.0.len() < n {
            return Err(RecordError::Truncated(what));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn i8(&mut self, what: &'static str) -> Result<i8, RecordError> {
        Ok(self.take(1, what)?[0] as i8)
    }
    fn i16(&mut self, what: &'static str) -> Result<i16, RecordError> {
        Ok(i16::from_be_bytes(self.take(2, what)?.try_into().expect("2 bytes")))
    }
    fn i32(&mut self, what: &'static str) -> Result<i32, RecordError> {
        Ok(i32::from_be_bytes(self.take(4, what)?.try_into().expect("4 bytes")))
    }
    fn i64(&mut self, what: &'static str) -> Result<i64, RecordError> {
        Ok(i64::from_be_bytes(self.take(8, what)?.try_into().expect("8 bytes")))
    }
    fn uvarint(&mut self, what: &'static str) -> Result<u32, RecordError> {
        let mut value = 0u32;
        for shift in (0..35).step_by(7) {
            let b = self.take(1, what)?[0];
            value |= u32::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(RecordError::BadLength(what))
    }
    fn utf8(bytes: &[u8], what: &'static str) -> Result<String, RecordError> {
        std::str::from_utf8(bytes).map(str::to_owned).map_err(|_| RecordError::NotUtf8(what))
    }
    fn string(&mut self, what: &'static str) -> Result<String, RecordError> {
        let len = usize::try_from(self.i16(what)?).map_err(|_| RecordError::BadLength(what))?;
        Self::utf8(self.take(len, what)?, what)
    }
    fn compact_string(&mut self, what: &'static str) -> Result<String, RecordError> {
        let len = self.uvarint(what)?.checked_sub(1).ok_or(RecordError::BadLength(what))? as usize;
        Self::utf8(self.take(len, what)?, what)
    }
    /// A non-flexible array's count (`None` for null), bounded by the bytes left at `min_entry` each.
    fn array_len(&mut self, what: &'static str, min_entry: usize) -> Result<Option<usize>, RecordError> {
        let len = self.i32(what)?;
        if len == -1 {
            return Ok(None);
        }
        let len = usize::try_from(len).map_err(|_| RecordError::BadLength(what))?;
        self.bounded(len, min_entry, what).map(Some)
    }
    fn compact_len(&mut self, what: &'static str, min_entry: usize) -> Result<Option<usize>, RecordError> {
        let Some(len) = self.uvarint(what)?.checked_sub(1) else { return Ok(None) };
        self.bounded(len as usize, min_entry, what).map(Some)
    }
    fn bounded(&self, len: usize, min_entry: usize, what: &'static str) -> Result<usize, RecordError> {
        if len.saturating_mul(min_entry) > self.0.len() {
            return Err(RecordError::Truncated(what));
        }
        Ok(len)
    }
    /// Reads a tagged-field section, handing each field to `field`.
    fn skip_tags(&mut self, mut field: impl FnMut(u32, &[u8]) -> Result<(), RecordError>) -> Result<(), RecordError> {
        let count = self.uvarint("tagged fields")?;
        for _ in 0..count {
            let tag = self.uvarint("tag")?;
            let size = self.uvarint("tag size")? as usize;
            let data = self.take(size, "tagged field")?;
            field(tag, data)?;
        }
        Ok(())
    }
    fn finish(&self) -> Result<(), RecordError> {
        if self.0.is_empty() { Ok(()) } else { Err(RecordError::TrailingBytes(self.0.len())) }
    }
}
