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
//!
//! Groups of the consumer protocol (KIP-848, [`super::consumer`]) are kept as Kafka 4.0 keeps them: the
//! key is the record type, then the group id (and member id); the value is version 0 in the flexible
//! encoding (compact strings and arrays counted as an unsigned varint of length + 1, 0 for null; every
//! struct ends with its tagged fields, which are skipped on reading).
//!
//! | type | key | value |
//! |---|---|---|
//! | 3 ConsumerGroupMetadata | group | group epoch (int32) |
//! | 5 ConsumerGroupMemberMetadata | group, member | instance id (nullable), rack id (nullable), client id, client host, subscribed topic names, subscribed regex (nullable), rebalance timeout (int32), server assignor (nullable) |
//! | 6 ConsumerGroupTargetAssignmentMetadata | group | assignment epoch (int32) |
//! | 7 ConsumerGroupTargetAssignmentMember | group, member | partitions by topic id |
//! | 8 ConsumerGroupCurrentMemberAssignment | group, member | member epoch, previous member epoch (int32), state (int8), assigned and pending-revocation partitions by topic id |
//!
//! Types 4 (subscription metadata) and 16 (resolved regular expressions) are not written: the group
//! resolves its subscriptions again from the topics it finds; reading them gives
//! [`OffsetsRecord::Unused`].

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::classic::{GroupRecord, RecordedMember};
use super::consumer::{Assignment, Change, Current, MemberMetadata, MemberState};

const OFFSET_KEY_VERSION: i16 = 1;
const GROUP_KEY_VERSION: i16 = 2;
const OFFSET_VALUE_VERSION: i16 = 3;
const GROUP_VALUE_VERSION: i16 = 3;
const CONSUMER_GROUP_EPOCH: i16 = 3;
const CONSUMER_SUBSCRIPTION_METADATA: i16 = 4;
const CONSUMER_MEMBER: i16 = 5;
const CONSUMER_ASSIGNMENT_EPOCH: i16 = 6;
const CONSUMER_TARGET: i16 = 7;
const CONSUMER_CURRENT: i16 = 8;
const CONSUMER_REGEX: i16 = 16;

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
    /// A change to a group of the consumer protocol.
    Consumer { group: String, change: Change },
    /// A record of a kind this broker reads past (Kafka's consumer-group types 4 and 16).
    Unused,
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
    #[error("unknown member state {0}")]
    UnknownMemberState(i8),
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
            OffsetsRecord::Consumer { group, change } => {
                let (kind, member) = match change {
                    Change::GroupEpoch(_) => (CONSUMER_GROUP_EPOCH, None),
                    Change::Member(m, _) => (CONSUMER_MEMBER, Some(m)),
                    Change::AssignmentEpoch(_) => (CONSUMER_ASSIGNMENT_EPOCH, None),
                    Change::Target(m, _) => (CONSUMER_TARGET, Some(m)),
                    Change::Current(m, _) => (CONSUMER_CURRENT, Some(m)),
                };
                out.put_i16(kind);
                put_str(&mut out, group);
                if let Some(member) = member {
                    put_str(&mut out, member);
                }
            }
            OffsetsRecord::Unused => {}
        }
        out.freeze()
    }

    /// The record's value; `None` for a tombstone.
    pub fn value(&self) -> Option<Bytes> {
        let mut out = BytesMut::new();
        match self {
            OffsetsRecord::Offset { value: None, .. }
            | OffsetsRecord::Group { value: None, .. }
            | OffsetsRecord::Unused => return None,
            OffsetsRecord::Consumer { change, .. } => return consumer_value(change),
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
            CONSUMER_SUBSCRIPTION_METADATA | CONSUMER_REGEX => Ok(OffsetsRecord::Unused),
            CONSUMER_GROUP_EPOCH..=CONSUMER_CURRENT => {
                let group = get_str(&mut key)?;
                let change = decode_consumer(version, &mut key, value)?;
                Ok(OffsetsRecord::Consumer { group, change })
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

/// The value of a consumer-group record (version 0, flexible encoding); `None` for a tombstone.
fn consumer_value(change: &Change) -> Option<Bytes> {
    let mut out = BytesMut::new();
    out.put_i16(0);
    match change {
        Change::GroupEpoch(Some(epoch)) | Change::AssignmentEpoch(Some(epoch)) => out.put_i32(*epoch),
        Change::Member(_, Some(m)) => {
            put_compact_str(&mut out, m.instance_id.as_deref());
            put_compact_str(&mut out, m.rack_id.as_deref());
            put_compact_str(&mut out, Some(&m.client_id));
            put_compact_str(&mut out, Some(&m.client_host));
            put_uvarint(&mut out, m.subscribed_topic_names.len() as u64 + 1);
            for name in &m.subscribed_topic_names {
                put_compact_str(&mut out, Some(name));
            }
            put_compact_str(&mut out, m.subscribed_topic_regex.as_deref());
            out.put_i32(m.rebalance_timeout_ms);
            put_compact_str(&mut out, m.server_assignor.as_deref());
        }
        Change::Target(_, Some(assignment)) => put_assignment(&mut out, assignment),
        Change::Current(_, Some(c)) => {
            out.put_i32(c.epoch);
            out.put_i32(c.previous_epoch);
            out.put_i8(c.state.code());
            put_assignment(&mut out, &c.assigned);
            put_assignment(&mut out, &c.pending_revocation);
        }
        Change::GroupEpoch(None)
        | Change::AssignmentEpoch(None)
        | Change::Member(_, None)
        | Change::Target(_, None)
        | Change::Current(_, None) => return None,
    }
    // No tagged fields.
    put_uvarint(&mut out, 0);
    Some(out.freeze())
}

fn decode_consumer(kind: i16, key: &mut &[u8], value: Option<&[u8]>) -> Result<Change, RecordError> {
    let member = match kind {
        CONSUMER_MEMBER | CONSUMER_TARGET | CONSUMER_CURRENT => Some(get_str(key)?),
        _ => None,
    };
    let Some(mut v) = value else {
        return Ok(match (kind, member) {
            (CONSUMER_GROUP_EPOCH, _) => Change::GroupEpoch(None),
            (CONSUMER_ASSIGNMENT_EPOCH, _) => Change::AssignmentEpoch(None),
            (CONSUMER_MEMBER, Some(m)) => Change::Member(m, None),
            (CONSUMER_TARGET, Some(m)) => Change::Target(m, None),
            (_, m) => Change::Current(m.unwrap_or_default(), None),
        });
    };
    let version = get_i16(&mut v)?;
    if version != 0 {
        return Err(RecordError::UnknownValueVersion(version));
    }
    let change = match (kind, member) {
        (CONSUMER_GROUP_EPOCH, _) => Change::GroupEpoch(Some(get_i32(&mut v)?)),
        (CONSUMER_ASSIGNMENT_EPOCH, _) => Change::AssignmentEpoch(Some(get_i32(&mut v)?)),
        (CONSUMER_MEMBER, Some(m)) => {
            let instance_id = get_compact_str(&mut v)?;
            let rack_id = get_compact_str(&mut v)?;
            let client_id = get_compact_str(&mut v)?.unwrap_or_default();
            let client_host = get_compact_str(&mut v)?.unwrap_or_default();
            let count = get_compact_len(&mut v, 1)?;
            let mut subscribed_topic_names = std::collections::BTreeSet::new();
            for _ in 0..count {
                subscribed_topic_names.insert(get_compact_str(&mut v)?.unwrap_or_default());
            }
            let subscribed_topic_regex = get_compact_str(&mut v)?.filter(|r| !r.is_empty());
            let rebalance_timeout_ms = get_i32(&mut v)?;
            let server_assignor = get_compact_str(&mut v)?;
            let metadata = MemberMetadata {
                instance_id,
                rack_id,
                client_id,
                client_host,
                subscribed_topic_names,
                subscribed_topic_regex,
                server_assignor,
                rebalance_timeout_ms,
            };
            Change::Member(m, Some(metadata))
        }
        (CONSUMER_TARGET, Some(m)) => Change::Target(m, Some(get_assignment(&mut v)?)),
        (_, m) => {
            let epoch = get_i32(&mut v)?;
            let previous_epoch = get_i32(&mut v)?;
            let code = get_i8(&mut v)?;
            let state = MemberState::from_code(code).ok_or(RecordError::UnknownMemberState(code))?;
            let assigned = get_assignment(&mut v)?;
            let pending_revocation = get_assignment(&mut v)?;
            let current = Current { state, epoch, previous_epoch, assigned, pending_revocation };
            Change::Current(m.unwrap_or_default(), Some(current))
        }
    };
    skip_tagged_fields(&mut v)?;
    Ok(change)
}

fn put_uvarint(out: &mut BytesMut, mut n: u64) {
    while n >= 0x80 {
        out.put_u8((n as u8 & 0x7f) | 0x80);
        n >>= 7;
    }
    out.put_u8(n as u8);
}

fn put_compact_str(out: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => {
            put_uvarint(out, s.len() as u64 + 1);
            out.put_slice(s.as_bytes());
        }
        None => put_uvarint(out, 0),
    }
}

/// Partitions by topic id, as Kafka's TopicPartitions struct arrays lay them out.
fn put_assignment(out: &mut BytesMut, assignment: &Assignment) {
    let topics: Vec<_> = assignment.iter().filter(|(_, ps)| !ps.is_empty()).collect();
    put_uvarint(out, topics.len() as u64 + 1);
    for (topic, partitions) in topics {
        out.put_slice(topic.as_bytes());
        put_uvarint(out, partitions.len() as u64 + 1);
        for p in partitions {
            out.put_i32(*p);
        }
        put_uvarint(out, 0);
    }
}

fn get_uvarint(b: &mut &[u8]) -> Result<u64, RecordError> {
    let mut n = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = get_i8(b)? as u8;
        n |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(n);
        }
    }
    Err(RecordError::Truncated)
}

/// A compact array's length (None for null is read as empty), bounded by what is left: each element
/// takes at least `min_bytes`.
fn get_compact_len(b: &mut &[u8], min_bytes: usize) -> Result<usize, RecordError> {
    let n = get_uvarint(b)?;
    let len = n.saturating_sub(1);
    if len > (b.remaining() / min_bytes) as u64 {
        return Err(RecordError::Truncated);
    }
    Ok(len as usize)
}

fn get_compact_str(b: &mut &[u8]) -> Result<Option<String>, RecordError> {
    let n = get_uvarint(b)?;
    if n == 0 {
        return Ok(None);
    }
    let len = (n - 1) as usize;
    if b.remaining() < len {
        return Err(RecordError::Truncated);
    }
    let s = std::str::from_utf8(&b[..len]).map_err(|_| RecordError::NotUtf8)?.to_string();
    b.advance(len);
    Ok(Some(s))
}

fn get_assignment(b: &mut &[u8]) -> Result<Assignment, RecordError> {
    let topics = get_compact_len(b, 18)?;
    let mut out = Assignment::new();
    for _ in 0..topics {
        if b.remaining() < 16 {
            return Err(RecordError::Truncated);
        }
        let topic = uuid::Uuid::from_slice(&b[..16]).map_err(|_| RecordError::Truncated)?;
        b.advance(16);
        let count = get_compact_len(b, 4)?;
        let partitions = out.entry(topic).or_default();
        for _ in 0..count {
            partitions.insert(get_i32(b)?);
        }
        skip_tagged_fields(b)?;
    }
    Ok(out)
}

fn skip_tagged_fields(b: &mut &[u8]) -> Result<(), RecordError> {
    let count = get_uvarint(b)?;
    for _ in 0..count {
        let _tag = get_uvarint(b)?;
        let size = get_uvarint(b)?;
        if (b.remaining() as u64) < size {
            return Err(RecordError::Truncated);
        }
        b.advance(size as usize);
    }
    Ok(())
}

fn get_i8(b: &mut &[u8]) -> Result<i8, RecordError> {
    if b.remaining() < 1 {
        return Err(RecordError::Truncated);
    }
    Ok(b.get_i8())
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

    fn consumer_records() -> Vec<OffsetsRecord> {
        let topic = uuid::Uuid::from_u128(0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10);
        let assignment = Assignment::from([(topic, [0, 3, 7].into_iter().collect())]);
        let metadata = MemberMetadata {
            instance_id: Some("host-a".into()),
            rack_id: None,
            client_id: "rdkafka".into(),
            client_host: "/127.0.0.1".into(),
            subscribed_topic_names: ["orders".to_string(), "payments".to_string()].into_iter().collect(),
            subscribed_topic_regex: Some("^audit-.*".into()),
            server_assignor: Some("range".into()),
            rebalance_timeout_ms: 300_000,
        };
        let current = Current {
            state: MemberState::UnrevokedPartitions,
            epoch: 4,
            previous_epoch: 3,
            assigned: assignment.clone(),
            pending_revocation: Assignment::from([(topic, [1].into_iter().collect())]),
        };
        let changes = [
            Change::GroupEpoch(Some(5)),
            Change::GroupEpoch(None),
            Change::Member("m-1".into(), Some(metadata)),
            Change::Member("m-1".into(), None),
            Change::AssignmentEpoch(Some(5)),
            Change::AssignmentEpoch(None),
            Change::Target("m-1".into(), Some(assignment)),
            Change::Target("m-1".into(), None),
            Change::Current("m-1".into(), Some(current)),
            Change::Current("m-1".into(), None),
        ];
        changes.into_iter().map(|change| OffsetsRecord::Consumer { group: "g".into(), change }).collect()
    }

    #[test]
    fn consumer_group_records_read_back_as_written_and_damage_is_an_error() {
        for record in consumer_records() {
            let (key, value) = (record.key(), record.value());
            assert_eq!(OffsetsRecord::decode(Some(&key), value.as_deref()), Ok(record.clone()));
            if let Some(value) = value {
                for cut in 0..value.len() {
                    assert!(OffsetsRecord::decode(Some(&key), Some(&value[..cut])).is_err(), "{record:?} cut at {cut}");
                }
            }
        }
    }

    #[test]
    fn consumer_group_records_are_laid_out_as_kafka_lays_them_out() {
        let epoch = OffsetsRecord::Consumer { group: "g".into(), change: Change::GroupEpoch(Some(5)) };
        assert_eq!(&epoch.key()[..], b"\x00\x03\x00\x01g");
        assert_eq!(&epoch.value().unwrap()[..], b"\x00\x00\x00\x00\x00\x05\x00");
        let topic = uuid::Uuid::from_u128(1);
        let current = Current {
            state: MemberState::Stable,
            epoch: 2,
            previous_epoch: 1,
            assigned: Assignment::from([(topic, [4].into_iter().collect())]),
            pending_revocation: Assignment::new(),
        };
        let record = OffsetsRecord::Consumer { group: "g".into(), change: Change::Current("m".into(), Some(current)) };
        assert_eq!(&record.key()[..], b"\x00\x08\x00\x01g\x00\x01m");
        let mut expected = b"\x00\x00\x00\x00\x00\x02\x00\x00\x00\x01\x00\x02".to_vec();
        expected.extend_from_slice(topic.as_bytes());
        // One partition (4), the struct's tags; no pending revocation; the value's tags.
        expected.extend_from_slice(b"\x02\x00\x00\x00\x04\x00\x01\x00");
        assert_eq!(&record.value().unwrap()[..], &expected[..]);
        // Tagged fields a later version adds are read past.
        let mut tagged = epoch.value().unwrap().to_vec();
        *tagged.last_mut().unwrap() = 1;
        tagged.extend_from_slice(b"\x00\x08\x00\x00\x00\x00\x00\x00\x00\x07");
        assert_eq!(OffsetsRecord::decode(Some(&epoch.key()), Some(&tagged)), Ok(epoch));
        // Subscription metadata and regex records are read past.
        assert_eq!(
            OffsetsRecord::decode(Some(b"\x00\x04\x00\x01g"), Some(b"\x00\x00\x01\x00")),
            Ok(OffsetsRecord::Unused)
        );
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
