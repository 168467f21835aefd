//! The records of `__consumer_offsets`, in Kafka's layout so that tools reading that topic understand them:
//! keys and values are big-endian, strings are an int16 length then UTF-8 (-1 for null), byte arrays an
//! int32 length then the bytes, and each starts with its schema version.
//!
//! | record | key (version) | value (version) |
//! |---|---|---|
//! | committed offset | `1`: group, topic, partition (int32) | `3`: offset (int64), leader epoch (int32), metadata, commit timestamp (int64) |
//! | group membership | `2`: group | `3`: protocol type, generation (int32), protocol (nullable), leader (nullable), state timestamp (int64), members |
//!
//! A member in a membership value: member id, group instance id (nullable), client id, client host,
//! rebalance timeout (int32), session timeout (int32), subscription (bytes), assignment (bytes). A null
//! value (a tombstone) removes what the key names. Decoding bounds every length by what is left, so a
//! damaged record is an error, never a panic or a large allocation.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::classic::{GroupRecord, RecordedMember};

const OFFSET_KEY_VERSION: i16 = 1;
const GROUP_KEY_VERSION: i16 = 2;
const OFFSET_VALUE_VERSION: i16 = 3;
const GROUP_VALUE_VERSION: i16 = 3;

/// A committed offset as the offsets topic keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommittedOffset {
    pub offset: i64,
    /// -1 when the client did not give one.
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp_ms: i64,
}

/// What a record of the offsets topic says, once decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OffsetsRecord {
    /// `None`: the committed offset was deleted.
    Offset { group: String, topic: String, partition: i32, value: Option<CommittedOffset> },
    /// `None`: the group was deleted.
    Group { group: String, value: Option<GroupRecord> },
}

/// Why a record of the offsets topic could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    #[error("the record ends early")]
    Truncated,
    #[error("a string is not UTF-8")]
    NotUtf8,
    #[error("a length of {0} is negative")]
    NegativeLength(i32),
    #[error("unknown key version {0}")]
    UnknownKeyVersion(i16),
    #[error("unknown value version {0}")]
    UnknownValueVersion(i16),
    #[error("the record has no key")]
    NoKey,
}

impl OffsetsRecord {
    /// The record's key.
    pub fn key(&self) -> Bytes {
        let mut out = BytesMut::new();
        match self {
            OffsetsRecord::Offset { group, topic, partition, .. } => {
                out.put_i16(OFFSET_KEY_VERSION);
                put_str(&mut out, group);
                put_str(&mut out, topic);
                out.put_i32(*partition);
            }
            OffsetsRecord::Group { group, .. } => {
                out.put_i16(GROUP_KEY_VERSION);
                put_str(&mut out, group);
            }
        }
        out.freeze()
    }

    /// The record's value; `None` for a tombstone.
    pub fn value(&self) -> Option<Bytes> {
        let mut out = BytesMut::new();
        match self {
            OffsetsRecord::Offset { value: None, .. } | OffsetsRecord::Group { value: None, .. } => return None,
            OffsetsRecord::Offset { value: Some(v), .. } => {
                out.put_i16(OFFSET_VALUE_VERSION);
                out.put_i64(v.offset);
                out.put_i32(v.leader_epoch);
                put_str(&mut out, &v.metadata);
                out.put_i64(v.commit_timestamp_ms);
            }
            OffsetsRecord::Group { value: Some(g), .. } => {
                out.put_i16(GROUP_VALUE_VERSION);
                put_str(&mut out, g.protocol_type.as_deref().unwrap_or(""));
                out.put_i32(g.generation);
                put_nullable_str(&mut out, g.protocol.as_deref());
                put_nullable_str(&mut out, g.leader.as_deref());
                out.put_i64(g.state_since_ms as i64);
                out.put_i32(g.members.len() as i32);
                for m in &g.members {
                    put_str(&mut out, &m.member_id);
                    put_nullable_str(&mut out, m.instance_id.as_deref());
                    put_str(&mut out, &m.client_id);
                    put_str(&mut out, &m.client_host);
                    out.put_i32(m.rebalance_timeout_ms);
                    out.put_i32(m.session_timeout_ms);
                    put_bytes(&mut out, &m.subscription);
                    put_bytes(&mut out, &m.assignment);
                }
            }
        }
        Some(out.freeze())
    }

    /// Reads a record from its key and value.
    pub fn decode(key: Option<&[u8]>, value: Option<&[u8]>) -> Result<OffsetsRecord, RecordError> {
        let mut key = key.ok_or(RecordError::NoKey)?;
        let version = get_i16(&mut key)?;
        match version {
            0 | 1 => {
                let group = get_str(&mut key)?;
                let topic = get_str(&mut key)?;
                let partition = get_i32(&mut key)?;
                let value = value.map(decode_offset_value).transpose()?;
                Ok(OffsetsRecord::Offset { group, topic, partition, value })
            }
            2 => {
                let group = get_str(&mut key)?;
                let value = value.map(decode_group_value).transpose()?;
                Ok(OffsetsRecord::Group { group, value })
            }
            other => Err(RecordError::UnknownKeyVersion(other)),
        }
    }
}

fn decode_offset_value(mut v: &[u8]) -> Result<CommittedOffset, RecordError> {
    let version = get_i16(&mut v)?;
    if !(0..=OFFSET_VALUE_VERSION).contains(&version) {
        return Err(RecordError::UnknownValueVersion(version));
    }
    let offset = get_i64(&mut v)?;
    let leader_epoch = if version >= 3 { get_i32(&mut v)? } else { -1 };
    let metadata = get_str(&mut v)?;
    let commit_timestamp_ms = get_i64(&mut v)?;
    Ok(CommittedOffset { offset, leader_epoch, metadata, commit_timestamp_ms })
}

fn decode_group_value(mut v: &[u8]) -> Result<GroupRecord, RecordError> {
    let version = get_i16(&mut v)?;
    if !(0..=GROUP_VALUE_VERSION).contains(&version) {
        return Err(RecordError::UnknownValueVersion(version));
    }
    let protocol_type = Some(get_str(&mut v)?).filter(|t| !t.is_empty());
    let generation = get_i32(&mut v)?;
    let protocol = get_nullable_str(&mut v)?;
    let leader = get_nullable_str(&mut v)?;
    let state_since_ms = if version >= 2 { get_i64(&mut v)?.max(0) as u64 } else { 0 };
    let count = get_i32(&mut v)?;
    if count < 0 {
        return Err(RecordError::NegativeLength(count));
    }
    // Each member takes at least 18 bytes (version 0's): a count larger than that allows is damage.
    if count as usize > v.len() / 18 + 1 {
        return Err(RecordError::Truncated);
    }
    let mut members = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let member_id = get_str(&mut v)?;
        let instance_id = if version >= 3 { get_nullable_str(&mut v)? } else { None };
        let client_id = get_str(&mut v)?;
        let client_host = get_str(&mut v)?;
        let rebalance_timeout_ms = if version >= 1 { get_i32(&mut v)? } else { 0 };
        let session_timeout_ms = get_i32(&mut v)?;
        let subscription = get_bytes(&mut v)?;
        let assignment = get_bytes(&mut v)?;
        let rebalance_timeout_ms = if version >= 1 { rebalance_timeout_ms } else { session_timeout_ms };
        members.push(RecordedMember {
            member_id,
            instance_id,
            client_id,
            client_host,
            rebalance_timeout_ms,
            session_timeout_ms,
            subscription,
            assignment,
        });
    }
    Ok(GroupRecord { protocol_type, generation, protocol, leader, state_since_ms, members })
}

fn put_str(out: &mut BytesMut, s: &str) {
    put_nullable_str(out, Some(s));
}

fn put_nullable_str(out: &mut BytesMut, s: Option<&str>) {
    match s {
        // Longer strings than an int16 can count are cut (client ids and hosts are far shorter; group
        // ids, topics and metadata are bounded before they get here).
        Some(s) => {
            let bytes = &s.as_bytes()[..s.len().min(i16::MAX as usize)];
            out.put_i16(bytes.len() as i16);
            out.put_slice(bytes);
        }
        None => out.put_i16(-1),
    }
}

fn put_bytes(out: &mut BytesMut, b: &[u8]) {
    out.put_i32(b.len() as i32);
    out.put_slice(b);
}

fn get_i16(b: &mut &[u8]) -> Result<i16, RecordError> {
    if b.remaining() < 2 {
        return Err(RecordError::Truncated);
    }
    Ok(b.get_i16())
}

fn get_i32(b: &mut &[u8]) -> Result<i32, RecordError> {
    if b.remaining() < 4 {
        return Err(RecordError::Truncated);
    }
    Ok(b.get_i32())
}

fn get_i64(b: &mut &[u8]) -> Result<i64, RecordError> {
    if b.remaining() < 8 {
        return Err(RecordError::Truncated);
    }
    Ok(b.get_i64())
}

fn get_nullable_str(b: &mut &[u8]) -> Result<Option<String>, RecordError> {
    let len = get_i16(b)?;
    if len < 0 {
        return Ok(None);
    }
    let len = len as usize;
    if b.remaining() < len {
        return Err(RecordError::Truncated);
    }
    let s = std::str::from_utf8(&b[..len]).map_err(|_| RecordError::NotUtf8)?.to_string();
    b.advance(len);
    Ok(Some(s))
}

fn get_str(b: &mut &[u8]) -> Result<String, RecordError> {
    Ok(get_nullable_str(b)?.unwrap_or_default())
}

fn get_bytes(b: &mut &[u8]) -> Result<Bytes, RecordError> {
    let len = get_i32(b)?;
    if len < 0 {
        return Ok(Bytes::new());
    }
    let len = len as usize;
    if b.remaining() < len {
        return Err(RecordError::Truncated);
    }
    let out = Bytes::copy_from_slice(&b[..len]);
    b.advance(len);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group_record() -> GroupRecord {
        GroupRecord {
            protocol_type: Some("consumer".into()),
            generation: 7,
            protocol: Some("range".into()),
            leader: Some("m-1".into()),
            state_since_ms: 1_700_000_000_000,
            members: vec![RecordedMember {
                member_id: "m-1".into(),
                instance_id: Some("host-a".into()),
                client_id: "rdkafka".into(),
                client_host: "/127.0.0.1".into(),
                rebalance_timeout_ms: 300_000,
                session_timeout_ms: 45_000,
                subscription: Bytes::from_static(b"\x00\x01sub"),
                assignment: Bytes::from_static(b"\x00\x01asg"),
            }],
        }
    }

    #[test]
    fn records_read_back_as_written_and_tombstones_have_no_value() {
        let records = [
            OffsetsRecord::Offset {
                group: "g".into(),
                topic: "orders".into(),
                partition: 3,
                value: Some(CommittedOffset {
                    offset: 42,
                    leader_epoch: 5,
                    metadata: "m".into(),
                    commit_timestamp_ms: 9,
                }),
            },
            OffsetsRecord::Offset { group: "g".into(), topic: "orders".into(), partition: 3, value: None },
            OffsetsRecord::Group { group: "g".into(), value: Some(group_record()) },
            OffsetsRecord::Group { group: "g".into(), value: None },
        ];
        for record in records {
            let (key, value) = (record.key(), record.value());
            assert_eq!(OffsetsRecord::decode(Some(&key), value.as_deref()), Ok(record));
        }
    }

    #[test]
    fn an_offset_key_is_laid_out_as_kafka_lays_it_out() {
        let key = OffsetsRecord::Offset { group: "g".into(), topic: "t".into(), partition: 2, value: None }.key();
        assert_eq!(&key[..], b"\x00\x01\x00\x01g\x00\x01t\x00\x00\x00\x02");
        let value = OffsetsRecord::Offset {
            group: "g".into(),
            topic: "t".into(),
            partition: 2,
            value: Some(CommittedOffset {
                offset: 1,
                leader_epoch: -1,
                metadata: String::new(),
                commit_timestamp_ms: 2,
            }),
        }
        .value()
        .unwrap();
        assert_eq!(
            &value[..],
            b"\x00\x03\x00\x00\x00\x00\x00\x00\x00\x01\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02"
        );
    }

    #[test]
    fn damaged_records_are_errors_at_every_length() {
        let record = OffsetsRecord::Group { group: "g".into(), value: Some(group_record()) };
        let (key, value) = (record.key(), record.value().unwrap());
        for cut in 0..value.len() {
            assert!(OffsetsRecord::decode(Some(&key), Some(&value[..cut])).is_err(), "cut at {cut}");
        }
        for cut in 0..key.len() {
            assert!(OffsetsRecord::decode(Some(&key[..cut]), Some(&value)).is_err(), "key cut at {cut}");
        }
        assert_eq!(OffsetsRecord::decode(Some(b"\x00\x09"), None), Err(RecordError::UnknownKeyVersion(9)));
        assert_eq!(OffsetsRecord::decode(None, None), Err(RecordError::NoKey));
        let mut huge_count = value.to_vec();
        // protocol type "consumer" (2+8), generation (4), protocol "range" (2+5), leader "m-1" (2+3), ts (8).
        let at = 2 + 10 + 4 + 7 + 5 + 8;
        huge_count[at..at + 4].copy_from_slice(&i32::MAX.to_be_bytes());
        assert!(OffsetsRecord::decode(Some(&key), Some(&huge_count)).is_err());
    }
}
