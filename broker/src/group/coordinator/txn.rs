//! Transactional offset commits (KIP-98, KIP-447): TxnOffsetCommit writes a group's offsets as one
//! transactional batch under the producer's id and epoch, and they wait ([`super::pending`]) until the
//! transaction's COMMIT or ABORT marker lands on the offsets partition ([`Coordinator::txn_completed`]).
//!
//! The group check is OffsetCommit's with Kafka's allowances for transactions: a commit that names no
//! member, no instance and generation -1 is not checked (TxnOffsetCommit before v3 carries none), a
//! classic group completing a rebalance accepts it, and a stale member epoch of a consumer-protocol
//! group is ILLEGAL_GENERATION (what a transactional producer understands as fencing).
//!
//! A marker may be reported while a transactional write of its producer is still in flight here (the
//! client gave up waiting and ended the transaction): the marker is remembered until those writes are
//! answered, and a write that landed before it is committed or dropped at once instead of waiting for a
//! marker that has come and gone. The replay of the partition reaches the same state by log order.
//! A write that was appended here but not acknowledged (timed out, too few replicas after the append)
//! makes the coordinator read the partition again: offsets in the log that the state here lacked would
//! be missed by their COMMIT.

use std::collections::HashMap;

use kafka_protocol::ResponseError;
use shardlog_storage::LeaderEpoch;

use super::Coordinator;
use super::answers::commit_error;
use super::offsets::offset_records;
use super::state::{Entry, Groups, Stored, encode_batch};
use crate::group::call::{OffsetToCommit, PerItem, TxnProducer};
use crate::group::classic::MemberRef;
use crate::group::records::OffsetsRecord;

/// One partition's transactional writes in flight, and the markers that came meanwhile.
#[derive(Debug, Default)]
pub(super) struct TxnWrites {
    /// Writes sent and not yet answered, by producer id.
    in_flight: HashMap<i64, u32>,
    /// Markers (log offset, commit) reported while a write of the producer was in flight, oldest first;
    /// forgotten once none is.
    ended: HashMap<i64, Vec<(i64, bool)>>,
}

impl TxnWrites {
    fn started(&mut self, producer_id: i64) {
        *self.in_flight.entry(producer_id).or_default() += 1;
    }

    /// A write of the producer was answered: the markers reported since it may end its offsets.
    fn answered(&mut self, producer_id: i64) -> Vec<(i64, bool)> {
        let left = self.in_flight.get_mut(&producer_id).map(|n| {
            *n -= 1;
            *n
        });
        assert!(left.is_some(), "a transactional write answered that was never started");
        if left == Some(0) {
            self.in_flight.remove(&producer_id);
            return self.ended.remove(&producer_id).unwrap_or_default();
        }
        self.ended.get(&producer_id).cloned().unwrap_or_default()
    }

    fn marker(&mut self, producer_id: i64, marker_at: i64, commit: bool) {
        if self.in_flight.contains_key(&producer_id) {
            self.ended.entry(producer_id).or_default().push((marker_at, commit));
        }
    }
}

/// Places a transactional offset written at `at`: it waits for its marker, or, when a marker after it
/// was already reported (`ended`), is committed or dropped now.
fn place(entry: &mut Entry, producer_id: i64, key: (String, i32), stored: Stored, ended: &[(i64, bool)]) {
    match ended.iter().find(|(marker_at, _)| stored.at < *marker_at) {
        Some((_, true)) => entry.store(key, stored.value, stored.at),
        Some((_, false)) => {}
        None => entry.txn_offsets.stage(producer_id, key, stored),
    }
}

/// The group check of a TxnOffsetCommit (see the module documentation).
fn check_txn_commit(entry: &mut Entry, member: &MemberRef, generation: i32) -> Result<(), ResponseError> {
    match &entry.consumer {
        Some(consumer) => {
            if generation == -1 && member.member_id.is_empty() && member.instance_id.is_none() {
                return Ok(());
            }
            consumer.check_commit(&member.member_id, generation).map_err(|e| match e {
                ResponseError::StaleMemberEpoch => ResponseError::IllegalGeneration,
                other => other,
            })
        }
        None => entry.group.check_txn_commit(member, generation),
    }
}

impl Coordinator {
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn txn_commit(
        &self,
        partition: i32,
        epoch: LeaderEpoch,
        group: &str,
        producer: TxnProducer,
        member: MemberRef,
        generation: i32,
        offsets: Vec<OffsetToCommit>,
        now: u64,
    ) -> PerItem {
        let settings = self.settings;
        let keys: Vec<(String, i32)> = offsets.iter().map(|o| (o.topic.clone(), o.partition)).collect();
        let checked = self.runtime.with_state(partition, epoch, |Groups { groups, txn_writes }| {
            let entry = match groups.get_mut(group) {
                Some(entry) => entry,
                // As OffsetCommit: a producer outside any group makes an empty one.
                None if generation < 0 => {
                    groups.entry(group.to_string()).or_insert_with(|| Entry::new(group, settings, now))
                }
                None => return Err(ResponseError::IllegalGeneration),
            };
            check_txn_commit(entry, &member, generation)?;
            // Counted until the write is answered, as a plain commit's (the group stays; a deletion
            // writes tombstones for these keys).
            entry.commits_started(&keys);
            txn_writes.started(producer.id);
            Ok(())
        });
        checked.ok_or(ResponseError::NotCoordinator)??;
        let records = offset_records(group, &offsets);
        let written = self.runtime.write(partition, epoch, encode_batch(&records, Some(producer))).await;
        self.runtime.with_state(partition, epoch, |Groups { groups, txn_writes }| {
            let ended = txn_writes.answered(producer.id);
            // Gone only if deleted meanwhile, and then its tombstones covered these keys.
            let Some(entry) = groups.get_mut(group) else { return };
            entry.commits_done(&keys);
            let Ok(base) = written else { return };
            for (i, record) in records.into_iter().enumerate() {
                if let OffsetsRecord::Offset { topic, partition, value: Some(value), .. } = record {
                    let stored = Stored { value, at: base + i as i64 };
                    place(entry, producer.id, (topic, partition), stored, &ended);
                }
            }
        });
        match written {
            Ok(_) => Ok(vec![None; offsets.len()]),
            Err(e) => {
                tracing::debug!(group, producer = producer.id, ?e, "transactional offset commit not written");
                if matches!(e, ResponseError::RequestTimedOut | ResponseError::NotEnoughReplicasAfterAppend) {
                    // Appended here but not acknowledged: the log may hold offsets that wait for a
                    // marker while the state here has none. Read again, so a COMMIT does not miss them.
                    self.runtime.reload_after_failed_write(partition, epoch);
                }
                Ok(vec![Some(commit_error(e)); offsets.len()])
            }
        }
    }

    /// A transaction marker landed on the partition: see [`crate::group::call::CoordinatorRequest::TxnCompleted`].
    pub(super) fn txn_completed(
        &self,
        partition: i32,
        epoch: LeaderEpoch,
        producer_id: i64,
        commit: bool,
        marker_offset: i64,
    ) -> Result<(), ResponseError> {
        self.runtime.ready(partition, epoch)?;
        let applied = self.runtime.with_state(partition, epoch, |Groups { groups, txn_writes }| {
            txn_writes.marker(producer_id, marker_offset, commit);
            for entry in groups.values_mut() {
                entry.end_txn(producer_id, commit, marker_offset);
            }
        });
        applied.ok_or(ResponseError::NotCoordinator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::group::classic::GroupSettings;
    use crate::group::records::CommittedOffset;

    fn stored(offset: i64, at: i64) -> Stored {
        let value = CommittedOffset { offset, leader_epoch: -1, metadata: String::new(), commit_timestamp_ms: 0 };
        Stored { value, at }
    }

    #[test]
    fn a_consumer_protocol_member_of_a_stale_epoch_is_fenced_with_illegal_generation() {
        use crate::group::consumer::{Change, ConsumerGroup, Current};
        let mut group = ConsumerGroup::new("g");
        group.replay(Change::Member("m".into(), Some(Default::default())), 0);
        group.replay(Change::Current("m".into(), Some(Current { epoch: 3, ..Current::joined() })), 0);
        let mut entry = Entry::new("g", GroupSettings::default(), 0);
        entry.consumer = Some(group);
        let member = |id: &str| MemberRef { member_id: id.into(), instance_id: None };
        assert_eq!(check_txn_commit(&mut entry, &member("m"), 3), Ok(()));
        assert_eq!(check_txn_commit(&mut entry, &member("m"), 2), Err(ResponseError::IllegalGeneration));
        assert_eq!(check_txn_commit(&mut entry, &member("x"), 3), Err(ResponseError::UnknownMemberId));
        // No group metadata (before v3): not checked, although the group has members.
        assert_eq!(check_txn_commit(&mut entry, &member(""), -1), Ok(()));
    }

    #[test]
    fn a_write_answered_after_its_marker_is_ended_by_it_and_a_later_one_waits() {
        let mut writes = TxnWrites::default();
        let mut entry = Entry::new("g", GroupSettings::default(), 0);
        writes.started(7);
        writes.started(7);
        // Reported while both writes are out; a marker of a producer with none out is not kept.
        writes.marker(7, 10, false);
        writes.marker(8, 10, true);
        assert!(!writes.ended.contains_key(&8));

        let ended = writes.answered(7);
        place(&mut entry, 7, ("t".into(), 0), stored(1, 5), &ended);
        assert!(entry.txn_offsets.is_empty() && entry.offsets.is_empty(), "aborted before it was answered");

        let ended = writes.answered(7);
        place(&mut entry, 7, ("t".into(), 0), stored(2, 12), &ended);
        assert!(entry.txn_offsets.has(&("t".into(), 0)), "written after the marker: the next transaction's");
        assert!(writes.in_flight.is_empty() && writes.ended.is_empty(), "nothing kept once no write is out");

        writes.started(7);
        writes.marker(7, 20, true);
        entry.end_txn(7, true, 20);
        let ended = writes.answered(7);
        place(&mut entry, 7, ("t".into(), 1), stored(3, 15), &ended);
        assert_eq!(entry.offsets[&("t".to_string(), 0)].value.offset, 2, "committed by the marker");
        assert_eq!(entry.offsets[&("t".to_string(), 1)].value.offset, 3, "committed on its answer");
        assert!(entry.txn_offsets.is_empty());
    }
}

/// Replaying a partition with transactional offsets and their markers.
#[cfg(test)]
mod replay_tests {
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::records::{
        Compression, NO_PARTITION_LEADER_EPOCH, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    use super::super::answers::fetch_offsets;
    use super::super::state::{Entry, Replay, encode_batch};
    use super::*;
    use crate::group::classic::GroupSettings;
    use crate::group::records::CommittedOffset;

    /// A batch of the records at log offset `base`: plain, or transactional of `producer`.
    fn batch(base: i64, producer: Option<i64>, records: &[OffsetsRecord]) -> Bytes {
        let producer = producer.map(|id| TxnProducer { id, epoch: 3 });
        let mut bytes = BytesMut::from(&encode_batch(records, producer).unwrap()[..]);
        // The base offset is not covered by the batch's CRC.
        bytes[..8].copy_from_slice(&base.to_be_bytes());
        bytes.freeze()
    }

    /// A COMMIT or ABORT marker of `producer` at log offset `at`, as the log writes it.
    fn marker(at: i64, producer: i64, commit: bool) -> Bytes {
        let record = Record {
            transactional: true,
            control: true,
            delete_horizon: false,
            partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
            producer_id: producer,
            producer_epoch: 3,
            timestamp_type: TimestampType::Creation,
            offset: at,
            sequence: -1,
            timestamp: 0,
            key: Some(Bytes::from(vec![0, 0, 0, commit as u8])),
            value: Some(Bytes::from(vec![0, 0, 0, 0, 0, 1])),
            headers: Default::default(),
        };
        let mut out = BytesMut::new();
        let options = RecordEncodeOptions { version: 2, compression: Compression::None };
        RecordBatchEncoder::encode(&mut out, &[record], &options).unwrap();
        out.freeze()
    }

    fn offset(group: &str, partition: i32, value: Option<i64>) -> OffsetsRecord {
        OffsetsRecord::Offset {
            group: group.into(),
            topic: "t".into(),
            partition,
            value: value.map(|offset| CommittedOffset {
                offset,
                leader_epoch: -1,
                metadata: String::new(),
                commit_timestamp_ms: 0,
            }),
        }
    }

    fn replayed(batches: &[Bytes]) -> HashMap<String, Entry> {
        let mut replay = Replay::default();
        for b in batches {
            replay.batches(b.clone(), 0).unwrap();
        }
        replay.into_groups(GroupSettings::default(), 0)
    }

    fn committed(entry: &Entry, partition: i32) -> Option<i64> {
        entry.offsets.get(&("t".to_string(), partition)).map(|s| s.value.offset)
    }

    #[test]
    fn replay_keeps_transactional_offsets_pending_until_their_marker_commits_or_drops_them() {
        let open = [
            batch(0, None, &[offset("g", 0, Some(5))]),
            batch(1, Some(7), &[offset("g", 0, Some(10)), offset("g", 1, Some(11))]),
            batch(3, Some(8), &[offset("g", 2, Some(20)), offset("h", 0, Some(30))]),
        ];
        let groups = replayed(&open);
        let g = &groups["g"];
        assert_eq!((committed(g, 0), committed(g, 1)), (Some(5), None), "not visible before the marker");
        assert!(groups["h"].offsets.is_empty() && !groups["h"].is_idle(), "a group with only pending offsets stays");

        let mut ended = open.to_vec();
        ended.extend([marker(5, 7, true), marker(6, 8, false)]);
        let groups = replayed(&ended);
        let g = &groups["g"];
        assert_eq!((committed(g, 0), committed(g, 1), committed(g, 2)), (Some(10), Some(11), None));
        assert_eq!(g.offsets[&("t".to_string(), 0)].at, 1, "committed at its own log offset");
        assert!(g.txn_offsets.is_empty());
        assert!(!groups.contains_key("h"), "its only offsets were aborted");
    }

    #[test]
    fn a_commit_written_after_a_transactional_offset_outlives_its_commit_marker_replayed_or_live() {
        let batches = [
            batch(0, Some(7), &[offset("g", 0, Some(10)), offset("g", 1, Some(11))]),
            batch(2, None, &[offset("g", 0, Some(20))]),
            marker(3, 7, true),
            // The producer's next transaction, after the marker: still pending.
            batch(4, Some(7), &[offset("g", 1, Some(12))]),
        ];
        let groups = replayed(&batches);
        let g = &groups["g"];
        assert_eq!((committed(g, 0), committed(g, 1)), (Some(20), Some(11)));
        assert!(g.txn_offsets.has(&("t".to_string(), 1)));

        // Live: the same decisions from the same log offsets.
        let mut live = replayed(&batches[..2]).remove("g").unwrap();
        live.end_txn(7, true, 3);
        assert_eq!((committed(&live, 0), committed(&live, 1)), (Some(20), Some(11)));
    }

    #[test]
    fn a_tombstone_drops_the_transactional_offsets_written_before_it() {
        let groups = replayed(&[
            batch(0, Some(7), &[offset("g", 0, Some(10)), offset("g", 1, Some(11))]),
            batch(2, None, &[offset("g", 0, None)]),
            marker(3, 7, true),
        ]);
        let g = &groups["g"];
        assert_eq!((committed(g, 0), committed(g, 1)), (None, Some(11)));
    }

    #[test]
    fn require_stable_answers_unstable_offset_commit_for_partitions_with_pending_offsets() {
        let groups = replayed(&[
            batch(0, None, &[offset("g", 0, Some(5)), offset("g", 1, Some(6))]),
            batch(2, Some(7), &[offset("g", 0, Some(10))]),
        ]);
        let g = groups.get("g");
        let wanted = Some(vec![("t".to_string(), 0), ("t".to_string(), 1)]);
        let stable = fetch_offsets(g, wanted.clone(), true);
        assert_eq!(stable[0].error, Some(ResponseError::UnstableOffsetCommit));
        assert_eq!(stable[0].committed, None);
        assert_eq!((stable[1].error, stable[1].committed.as_ref().map(|c| c.offset)), (None, Some(6)));
        // Without require_stable: the committed offset, never the pending one.
        let plain = fetch_offsets(g, wanted, false);
        assert_eq!(
            plain.iter().map(|f| (f.error, f.committed.as_ref().map(|c| c.offset))).collect::<Vec<_>>(),
            [(None, Some(5)), (None, Some(6))]
        );
        // Every partition of the group: the same rule.
        let all = fetch_offsets(g, None, true);
        assert_eq!(all.iter().map(|f| f.error).collect::<Vec<_>>(), [Some(ResponseError::UnstableOffsetCommit), None]);
    }

    #[test]
    fn pending_offsets_do_not_expire_and_a_marker_of_another_producer_leaves_them() {
        let mut groups = replayed(&[
            batch(0, None, &[offset("g", 0, Some(5)), offset("g", 1, Some(6))]),
            batch(2, Some(7), &[offset("g", 0, Some(10))]),
        ]);
        let g = groups.get_mut("g").unwrap();
        assert_eq!(g.expired_offsets(u64::MAX / 2, 1), vec![("t".to_string(), 1)]);
        g.end_txn(8, true, 10);
        assert!(g.txn_offsets.has(&("t".to_string(), 0)));
        g.end_txn(7, false, 10);
        assert_eq!(committed(g, 0), Some(5), "aborted");
        assert_eq!(g.expired_offsets(u64::MAX / 2, 1).len(), 2);
    }
}
