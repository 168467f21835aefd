//! What a coordinator keeps of a group (its state machine, its committed offsets) and how that is
//! written to and rebuilt from the offsets partition: records batched for a write, and the partition's
//! records replayed in log order when this shard becomes its leader.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::records::Record;
use shardlog_storage::LeaderEpoch;

use crate::coordinator::Coordinated;
use crate::group::OFFSETS_TOPIC;

use super::pending::PendingTxns;
use super::txn::TxnWrites;
use crate::group::call::TxnProducer;
use crate::group::classic::{Group, GroupRecord, GroupSettings, GroupState};
use crate::group::consumer::{Change, ConsumerGroup};
use crate::group::records::{CommittedOffset, OffsetsRecord};

/// A committed offset and where its record is in the log (a later write of an earlier decision must
/// not replace it).
#[derive(Debug, Clone)]
pub(super) struct Stored {
    pub(super) value: CommittedOffset,
    pub(super) at: i64,
}

/// A group and its committed offsets.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) group: Group,
    /// The group as the consumer protocol (KIP-848) keeps it, when it is of that protocol.
    pub(super) consumer: Option<ConsumerGroup>,
    pub(super) offsets: BTreeMap<(String, i32), Stored>,
    /// Whether a membership record of it may be in the log (a tombstone is then written when it goes).
    pub(super) recorded: bool,
    /// Offset commits whose writes are out, by key: how many.
    pub(super) pending_commits: BTreeMap<(String, i32), u32>,
    /// Since when (wall ms) the consumer-protocol group has had no members; `None` while it has some.
    pub(super) consumer_empty_since: Option<u64>,
    /// Offsets written in transactions not yet ended ([`super::pending`]).
    pub(super) txn_offsets: PendingTxns,
}

impl Entry {
    pub(super) fn new(id: &str, settings: GroupSettings, now: u64) -> Entry {
        Entry {
            group: Group::new(id, settings, now),
            consumer: None,
            offsets: BTreeMap::new(),
            recorded: false,
            pending_commits: BTreeMap::new(),
            consumer_empty_since: None,
            txn_offsets: PendingTxns::default(),
        }
    }

    /// Notes, after the consumer-protocol group's members changed, whether it has any left.
    pub(super) fn note_consumer_members(&mut self, now: u64) {
        match &self.consumer {
            Some(c) if c.members.is_empty() => {
                self.consumer_empty_since.get_or_insert(now);
            }
            _ => self.consumer_empty_since = None,
        }
    }

    /// Holds nothing worth keeping: no members (of either protocol), no member id to be used, no offsets,
    /// no commit out, no offsets of a transaction still open.
    pub(super) fn is_idle(&self) -> bool {
        self.group.is_idle()
            && self.consumer.as_ref().is_none_or(|c| c.members.is_empty())
            && self.offsets.is_empty()
            && self.pending_commits.is_empty()
            && self.txn_offsets.is_empty()
    }

    pub(super) fn commits_started(&mut self, keys: &[(String, i32)]) {
        for key in keys {
            *self.pending_commits.entry(key.clone()).or_default() += 1;
        }
    }

    pub(super) fn commits_done(&mut self, keys: &[(String, i32)]) {
        for key in keys {
            if let Some(n) = self.pending_commits.get_mut(key) {
                *n -= 1;
                if *n == 0 {
                    self.pending_commits.remove(key);
                }
            }
        }
    }

    /// The offsets that have outlived `retention_ms` at wall time `now_ms`, each counted from its commit
    /// or from when the group last became empty, whichever is later (Kafka's rule since KIP-211). A
    /// classic group with members loses none (which topics it uses is the client's to know); a
    /// consumer-protocol group with members keeps those of the topics they subscribe to and loses the
    /// others' from their commits (KIP-848). A partition with a transaction's offset waiting for it is
    /// kept until that transaction ends.
    pub(super) fn expired_offsets(&self, now_ms: u64, retention_ms: u64) -> Vec<(String, i32)> {
        let (counted_from, subscribed) = match &self.consumer {
            Some(c) if !c.members.is_empty() => (0, Some(c)),
            Some(_) => (self.consumer_empty_since.unwrap_or(now_ms), None),
            None if self.group.state == GroupState::Empty => (self.group.state_since_ms, None),
            None => return Vec::new(),
        };
        self.offsets
            .iter()
            .filter(|(key, _)| !self.txn_offsets.has(key))
            .filter(|((topic, _), s)| {
                if subscribed.is_some_and(|c| c.is_subscribed_to(topic)) {
                    return false;
                }
                let since = counted_from.max(s.value.commit_timestamp_ms.max(0) as u64);
                now_ms.saturating_sub(since) > retention_ms
            })
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Forgets an offset a tombstone at log offset `at` removed, unless a later commit replaced it, and
    /// the transactions' offsets for it written before the tombstone.
    pub(super) fn forget(&mut self, key: &(String, i32), at: i64) {
        if self.offsets.get(key).is_some_and(|s| s.at < at) {
            self.offsets.remove(key);
        }
        self.txn_offsets.forget(key, at);
    }

    /// A COMMIT (`commit`) or ABORT marker of `producer_id` at log offset `marker_at`: its offsets written
    /// before the marker are committed (each unless a later commit is there) or dropped.
    pub(super) fn end_txn(&mut self, producer_id: i64, commit: bool, marker_at: i64) {
        for (key, stored) in self.txn_offsets.end(producer_id, marker_at) {
            if commit {
                self.store(key, stored.value, stored.at);
            }
        }
    }

    pub(super) fn store(&mut self, key: (String, i32), value: CommittedOffset, at: i64) {
        match self.offsets.get(&key) {
            Some(stored) if stored.at > at => {}
            _ => {
                self.offsets.insert(key, Stored { value, at });
            }
        }
    }
}

/// A group as a replay has found it so far: its last membership record, its offsets, and the changes of
/// its consumer-protocol state since it was last deleted.
#[derive(Default)]
struct Replayed {
    record: Option<GroupRecord>,
    offsets: BTreeMap<(String, i32), Stored>,
    consumer: Vec<Change>,
    txn_offsets: PendingTxns,
}

impl Replayed {
    /// A transaction marker: the producer's offsets written before it are committed (each unless a later
    /// commit is there: log offsets decide, as live) or dropped.
    fn end_txn(&mut self, producer_id: i64, commit: bool, marker_at: i64) {
        for (key, stored) in self.txn_offsets.end(producer_id, marker_at) {
            if commit && self.offsets.get(&key).is_none_or(|s| s.at < stored.at) {
                self.offsets.insert(key, stored);
            }
        }
    }
}

/// A transaction marker's kind, from its control record's key: version (int16, 0), type (int16: 0 ABORT,
/// 1 COMMIT). Other control records (none are written to this topic) are not markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Marker {
    Abort,
    Commit,
}

impl Marker {
    pub(super) fn parse(key: Option<&[u8]>) -> Option<Marker> {
        let key = key?;
        if key.len() < 4 || i16::from_be_bytes([key[0], key[1]]) < 0 {
            return None;
        }
        match i16::from_be_bytes([key[2], key[3]]) {
            0 => Some(Marker::Abort),
            1 => Some(Marker::Commit),
            _ => None,
        }
    }
}

/// The partition's records, applied in log order.
#[derive(Default)]
pub(super) struct Replay {
    groups: BTreeMap<String, Replayed>,
}

/// The consumer groups of one offsets partition, as the coordinator runtime keeps them, and the
/// partition's transactional writes in flight.
pub(super) struct Groups {
    pub(super) groups: HashMap<String, Entry>,
    pub(super) txn_writes: TxnWrites,
}

impl Coordinated for Groups {
    const TOPIC: &'static str = OFFSETS_TOPIC;
    const WHAT: &'static str = "consumer groups";
    type Replay = Replay;
    type Settings = GroupSettings;

    fn start_replay() -> Replay {
        Replay::default()
    }

    fn replay(replay: &mut Replay, record: &Record) {
        replay.record(record)
    }

    fn finish(replay: Replay, settings: &GroupSettings, _epoch: LeaderEpoch, now_ms: u64) -> Groups {
        Groups { groups: replay.into_groups(*settings, now_ms), txn_writes: TxnWrites::default() }
    }

    fn len(&self) -> usize {
        self.groups.len()
    }
}

impl Replay {
    /// Applies the batches read from `from` on; returns the offset after the last one.
    #[cfg(test)]
    pub(super) fn batches(&mut self, bytes: Bytes, from: i64) -> Result<i64, String> {
        crate::coordinator::replay_batches(bytes, from, |record| self.record(record))
    }

    /// One record of the partition, in log order. A record with a producer id is of a transaction: its
    /// offset waits for the transaction's marker (a control record), which commits or drops it.
    fn record(&mut self, record: &Record) {
        if record.control {
            match Marker::parse(record.key.as_deref()) {
                Some(marker) => {
                    for group in self.groups.values_mut() {
                        group.end_txn(record.producer_id, marker == Marker::Commit, record.offset);
                    }
                }
                None => {
                    tracing::warn!(offset = record.offset, "skipped an unknown control record in __consumer_offsets")
                }
            }
            return;
        }
        let producer_id = (record.producer_id >= 0).then_some(record.producer_id);
        match OffsetsRecord::decode(record.key.as_deref(), record.value.as_deref()) {
            Ok(decoded) => self.apply(decoded, record.offset, producer_id),
            // Written by another version or damaged: skipped, as Kafka skips unknown record types.
            Err(e) => {
                tracing::warn!(offset = record.offset, error = %e, "skipped an unreadable record in __consumer_offsets")
            }
        }
    }

    fn apply(&mut self, record: OffsetsRecord, at: i64, producer_id: Option<i64>) {
        match record {
            OffsetsRecord::Offset { group, topic, partition, value } => {
                let replayed = self.groups.entry(group).or_default();
                let key = (topic, partition);
                match (value, producer_id) {
                    (Some(value), None) => {
                        replayed.offsets.insert(key, Stored { value, at });
                    }
                    (Some(value), Some(producer_id)) => {
                        replayed.txn_offsets.stage(producer_id, key, Stored { value, at })
                    }
                    (None, _) => {
                        replayed.offsets.remove(&key);
                        replayed.txn_offsets.forget(&key, at);
                    }
                }
            }
            OffsetsRecord::Group { group, value } => match value {
                Some(value) => self.groups.entry(group).or_default().record = Some(value),
                None => {
                    if let Some(entry) = self.groups.get_mut(&group) {
                        entry.record = None;
                    }
                }
            },
            OffsetsRecord::Consumer { group, change } => {
                let changes = &mut self.groups.entry(group).or_default().consumer;
                if change == Change::GroupEpoch(None) {
                    changes.clear();
                } else {
                    changes.push(change);
                }
            }
            OffsetsRecord::Unused => {}
        }
    }

    pub(super) fn into_groups(self, settings: GroupSettings, now: u64) -> HashMap<String, Entry> {
        self.groups
            .into_iter()
            .filter(|(_, r)| {
                r.record.is_some() || !r.offsets.is_empty() || !r.consumer.is_empty() || !r.txn_offsets.is_empty()
            })
            .map(|(id, Replayed { record, offsets, consumer: changes, txn_offsets })| {
                let recorded = record.is_some();
                let group = match record {
                    Some(record) => Group::restored(&id, settings, record, now),
                    None => Group::new(&id, settings, now),
                };
                let consumer = (!changes.is_empty()).then(|| {
                    let mut consumer = ConsumerGroup::new(&id);
                    for change in changes {
                        consumer.replay(change, now);
                    }
                    consumer
                });
                let mut entry = Entry {
                    group,
                    consumer,
                    offsets,
                    recorded,
                    pending_commits: BTreeMap::new(),
                    consumer_empty_since: None,
                    txn_offsets,
                };
                entry.note_consumer_members(now);
                (id, entry)
            })
            .collect()
    }
}

/// One uncompressed batch of the records: without a producer id, or, for a transaction's offsets
/// (TxnOffsetCommit), transactional with the producer's id and epoch (see
/// [`crate::coordinator::encode_batch`]).
pub(super) fn encode_batch(records: &[OffsetsRecord], producer: Option<TxnProducer>) -> Result<Bytes, ResponseError> {
    let records = records.iter().map(|r| (r.key(), r.value())).collect();
    crate::coordinator::encode_batch(records, producer.map(|p| (p.id, p.epoch)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: u64 = 60_000;

    fn committed_at(ms: i64) -> CommittedOffset {
        CommittedOffset { offset: 1, leader_epoch: -1, metadata: String::new(), commit_timestamp_ms: ms }
    }

    #[test]
    fn offsets_expire_only_without_members_counted_from_the_later_of_commit_and_emptiness() {
        let settings = GroupSettings::default();
        // Commits from outside the group (assign()): each offset counts from its own commit.
        let mut standalone = Entry::new("g", settings, 0);
        standalone.store(("t".into(), 0), committed_at(0), 1);
        standalone.store(("t".into(), 1), committed_at(30 * MINUTE as i64), 2);
        assert!(standalone.expired_offsets(60 * MINUTE, 60 * MINUTE).is_empty(), "exactly at the limit: kept");
        assert_eq!(standalone.expired_offsets(60 * MINUTE + 1, 60 * MINUTE), vec![("t".to_string(), 0)]);
        assert_eq!(standalone.expired_offsets(91 * MINUTE, 60 * MINUTE).len(), 2);

        // A group that became empty after its commits: counted from then.
        let record = GroupRecord {
            protocol_type: Some("consumer".into()),
            generation: 3,
            protocol: Some("range".into()),
            leader: None,
            state_since_ms: 100 * MINUTE,
            members: Vec::new(),
        };
        let mut emptied = Entry {
            group: Group::restored("g", settings, record, 100 * MINUTE),
            consumer: None,
            offsets: BTreeMap::new(),
            recorded: true,
            pending_commits: BTreeMap::new(),
            consumer_empty_since: None,
            txn_offsets: PendingTxns::default(),
        };
        emptied.store(("t".into(), 0), committed_at(0), 1);
        assert!(emptied.expired_offsets(150 * MINUTE, 60 * MINUTE).is_empty());
        assert_eq!(emptied.expired_offsets(161 * MINUTE, 60 * MINUTE).len(), 1);

        // A tombstone does not remove a commit written after it.
        emptied.store(("t".into(), 0), committed_at(0), 9);
        emptied.forget(&("t".into(), 0), 5);
        assert_eq!(emptied.offsets.len(), 1);
        emptied.forget(&("t".into(), 0), 10);
        assert!(emptied.offsets.is_empty());
    }

    #[test]
    fn a_consumer_protocol_group_is_rebuilt_from_the_partitions_records_until_deleted() {
        use crate::group::consumer::{Assignment, Current};
        let topic = uuid::Uuid::from_u128(9);
        let current = Current {
            epoch: 1,
            previous_epoch: 0,
            assigned: Assignment::from([(topic, [0, 1].into_iter().collect())]),
            ..Current::joined()
        };
        let changes = [
            Change::Current("m".into(), Some(Current::joined())),
            Change::GroupEpoch(Some(1)),
            Change::Member("m".into(), Some(Default::default())),
            Change::Target("m".into(), Some(current.assigned.clone())),
            Change::AssignmentEpoch(Some(1)),
            Change::Current("m".into(), Some(current.clone())),
        ];
        let records: Vec<OffsetsRecord> =
            changes.iter().map(|c| OffsetsRecord::Consumer { group: "g".into(), change: c.clone() }).collect();
        let mut replay = Replay::default();
        assert_eq!(replay.batches(encode_batch(&records, None).unwrap(), 0), Ok(6));
        let groups = replay.into_groups(GroupSettings::default(), 0);
        let consumer = groups["g"].consumer.as_ref().expect("a consumer-protocol group");
        assert_eq!((consumer.epoch, consumer.assignment_epoch), (1, 1));
        assert_eq!(consumer.members["m"].current, current);
        assert_eq!(consumer.holder(topic, 1), Some("m"));

        let mut deleted = records.clone();
        for change in [Change::Current("m".into(), None), Change::Target("m".into(), None)] {
            deleted.push(OffsetsRecord::Consumer { group: "g".into(), change });
        }
        deleted.push(OffsetsRecord::Consumer { group: "g".into(), change: Change::GroupEpoch(None) });
        let mut replay = Replay::default();
        replay.batches(encode_batch(&deleted, None).unwrap(), 0).unwrap();
        assert!(replay.into_groups(GroupSettings::default(), 0).is_empty(), "nothing left of a deleted group");
    }

    #[test]
    fn a_consumer_protocol_group_keeps_its_subscribed_topics_offsets_while_it_has_members() {
        use crate::group::consumer::MemberMetadata;
        let settings = GroupSettings::default();
        let mut entry = Entry::new("g", settings, 0);
        let mut group = ConsumerGroup::new("g");
        let by_name = MemberMetadata { subscribed_topic_names: ["a".to_string()].into(), ..Default::default() };
        let by_regex = MemberMetadata { subscribed_topic_regex: Some("r-.*".into()), ..Default::default() };
        group.replay(Change::Member("m1".into(), Some(by_name)), 0);
        group.replay(Change::Member("m2".into(), Some(by_regex)), 0);
        entry.consumer = Some(group);
        entry.note_consumer_members(0);
        for topic in ["a", "b", "r-1"] {
            entry.store((topic.into(), 0), committed_at(0), 1);
        }
        // With members: the subscribed topics' offsets stay however old; the others' go.
        assert_eq!(entry.expired_offsets(1_000 * MINUTE, MINUTE), vec![("b".to_string(), 0)]);

        // Without members: every offset counts from the later of its commit and the group's emptying.
        let group = entry.consumer.as_mut().unwrap();
        for id in ["m1", "m2"] {
            group.replay(Change::Member(id.into(), None), 0);
        }
        entry.note_consumer_members(500 * MINUTE);
        entry.note_consumer_members(700 * MINUTE);
        assert!(entry.expired_offsets(560 * MINUTE, 60 * MINUTE).is_empty(), "emptied at 500 minutes");
        assert_eq!(entry.expired_offsets(561 * MINUTE, 60 * MINUTE).len(), 3);
    }

    #[test]
    fn a_group_with_members_keeps_its_offsets() {
        let settings = GroupSettings::default();
        let record = GroupRecord {
            protocol_type: Some("consumer".into()),
            generation: 1,
            protocol: Some("range".into()),
            leader: Some("m".into()),
            state_since_ms: 0,
            members: vec![crate::group::classic::RecordedMember {
                member_id: "m".into(),
                instance_id: None,
                client_id: "c".into(),
                client_host: "/h".into(),
                rebalance_timeout_ms: 1000,
                session_timeout_ms: 1000,
                subscription: Bytes::new(),
                assignment: Bytes::new(),
            }],
        };
        let mut stable = Entry {
            group: Group::restored("g", settings, record, 0),
            consumer: None,
            offsets: BTreeMap::new(),
            recorded: true,
            pending_commits: BTreeMap::new(),
            consumer_empty_since: None,
            txn_offsets: PendingTxns::default(),
        };
        stable.store(("t".into(), 0), committed_at(0), 1);
        assert!(stable.expired_offsets(1_000 * MINUTE, MINUTE).is_empty());
    }
}
