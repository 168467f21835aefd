//! The coordinator's offset operations: commits (checked against the group of either protocol),
//! OffsetDelete, and the expiry of offsets after `offsets.retention.minutes`.

use kafka_protocol::ResponseError;
use shardlog_storage::{Clock, LeaderEpoch, SystemClock};

use super::Coordinator;
use super::answers::{commit_error, coordinator_error, subscribed_topics};
use super::state::Entry;
use super::state::Groups;
use crate::group::call::{OffsetToCommit, PerItem};
use crate::group::classic::{GroupState, MemberRef};
use crate::group::records::{CommittedOffset, OffsetsRecord};

/// The records of a commit of `offsets` to `group`, stamped now.
pub(super) fn offset_records(group: &str, offsets: &[OffsetToCommit]) -> Vec<OffsetsRecord> {
    let timestamp = SystemClock.now_ms();
    offsets
        .iter()
        .map(|o| OffsetsRecord::Offset {
            group: group.to_string(),
            topic: o.topic.clone(),
            partition: o.partition,
            value: Some(CommittedOffset {
                offset: o.offset,
                leader_epoch: o.leader_epoch,
                metadata: o.metadata.clone(),
                commit_timestamp_ms: timestamp,
            }),
        })
        .collect()
}

impl Coordinator {
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn commit(
        &self,
        partition: i32,
        epoch: LeaderEpoch,
        group: &str,
        member: MemberRef,
        generation: i32,
        offsets: Vec<OffsetToCommit>,
        now: u64,
    ) -> PerItem {
        let settings = self.settings;
        let keys: Vec<(String, i32)> = offsets.iter().map(|o| (o.topic.clone(), o.partition)).collect();
        let checked = self.with_groups(partition, epoch, |groups| {
            let entry = match groups.get_mut(group) {
                Some(entry) => entry,
                // A client outside any group (assign() and commit) creates an empty group; a member of a
                // generation the coordinator does not know is from before a move: refused.
                None if generation < 0 => {
                    groups.entry(group.to_string()).or_insert_with(|| Entry::new(group, settings, now))
                }
                None => return Err(ResponseError::IllegalGeneration),
            };
            match &entry.consumer {
                Some(consumer) => consumer.check_commit(&member.member_id, generation)?,
                None => entry.group.check_commit(&member, generation, now)?,
            }
            // Counted until the write is answered: the group is not dropped meanwhile, and a delete
            // writes tombstones for these keys too.
            entry.commits_started(&keys);
            Ok(())
        });
        checked.ok_or(ResponseError::NotCoordinator)??;
        let records = offset_records(group, &offsets);
        let written = if records.is_empty() { Ok(0) } else { self.write(partition, epoch, &records).await };
        self.with_groups(partition, epoch, |groups| {
            // Gone only if deleted meanwhile, and then its tombstones covered these keys.
            if let Some(entry) = groups.get_mut(group) {
                entry.commits_done(&keys);
                if let Ok(base) = written {
                    for (i, record) in records.into_iter().enumerate() {
                        if let OffsetsRecord::Offset { topic, partition, value: Some(value), .. } = record {
                            entry.store((topic, partition), value, base + i as i64);
                        }
                    }
                }
            }
        });
        match written {
            Ok(_) => Ok(vec![None; offsets.len()]),
            Err(e) => {
                tracing::debug!(group, ?e, "offset commit not written");
                Ok(vec![Some(commit_error(e)); offsets.len()])
            }
        }
    }

    pub(super) async fn delete_offsets(
        &self,
        partition: i32,
        epoch: LeaderEpoch,
        group: &str,
        partitions: Vec<(String, i32)>,
    ) -> PerItem {
        let planned = self.with_groups(partition, epoch, |groups| {
            let entry = groups
                .get(group)
                .filter(|e| e.group.state != GroupState::Dead)
                .ok_or(ResponseError::GroupIdNotFound)?;
            let refused = |subscribed: &dyn Fn(&str) -> bool| {
                let each = partitions.iter().map(|(topic, _)| subscribed(topic));
                each.map(|yes| yes.then_some(ResponseError::GroupSubscribedToTopic)).collect::<Vec<_>>()
            };
            if let Some(consumer) = &entry.consumer {
                return Ok(refused(&|topic| consumer.is_subscribed_to(topic)));
            }
            let consumer = entry.group.protocol_type.as_deref() == Some("consumer");
            if !consumer && entry.group.state != GroupState::Empty {
                // Which topics a non-consumer group uses is not known: only an empty one loses offsets.
                return Err(ResponseError::NonEmptyGroup);
            }
            let subscribed = subscribed_topics(&entry.group);
            Ok(refused(&|topic| subscribed.contains(topic)))
        });
        let errors = planned.ok_or(ResponseError::NotCoordinator)??;
        let records: Vec<OffsetsRecord> = partitions
            .iter()
            .zip(&errors)
            .filter(|(_, e)| e.is_none())
            .map(|((topic, p), _)| OffsetsRecord::Offset {
                group: group.to_string(),
                topic: topic.clone(),
                partition: *p,
                value: None,
            })
            .collect();
        if records.is_empty() {
            return Ok(errors);
        }
        match self.write(partition, epoch, &records).await {
            Ok(base) => {
                self.with_groups(partition, epoch, |groups| {
                    if let Some(entry) = groups.get_mut(group) {
                        let deleted = partitions.iter().zip(&errors).filter(|(_, e)| e.is_none());
                        for (i, ((topic, p), _)) in deleted.enumerate() {
                            entry.forget(&(topic.clone(), *p), base + i as i64);
                        }
                    }
                });
                Ok(errors)
            }
            Err(e) => Err(coordinator_error(e)),
        }
    }

    /// Deletes the offsets of groups without members that have outlived `offsets.retention.minutes`
    /// (tombstones, then forgotten here); a group left with neither members nor offsets goes at the
    /// next tick.
    pub(super) async fn expire_offsets(&self, now: u64) {
        let retention = self.ctx.config.groups.offsets_retention_ms;
        let mut candidates: Vec<(i32, LeaderEpoch, String)> = Vec::new();
        self.runtime.each_loaded(|partition, epoch, Groups { groups, .. }| {
            candidates.extend(groups.keys().map(|id| (partition, epoch, id.clone())))
        });
        for (partition, epoch, group) in candidates {
            // Decided just before the tombstones are sent (no await between): the group is still empty,
            // and keys with a commit in flight are left for the next pass (a later commit outlives them).
            let decided = self.with_groups(partition, epoch, |groups| {
                let entry = groups.get(&group)?;
                let keys: Vec<(String, i32)> = entry
                    .expired_offsets(now, retention)
                    .into_iter()
                    .filter(|key| !entry.pending_commits.contains_key(key))
                    .collect();
                (!keys.is_empty()).then_some(keys)
            });
            let Some(Some(keys)) = decided else { continue };
            let tombstones: Vec<OffsetsRecord> = keys
                .iter()
                .map(|(topic, p)| OffsetsRecord::Offset {
                    group: group.clone(),
                    topic: topic.clone(),
                    partition: *p,
                    value: None,
                })
                .collect();
            match self.write(partition, epoch, &tombstones).await {
                Ok(base) => {
                    self.with_groups(partition, epoch, |groups| {
                        if let Some(entry) = groups.get_mut(&group) {
                            for (i, key) in keys.iter().enumerate() {
                                entry.forget(key, base + i as i64);
                            }
                        }
                    });
                    tracing::info!(
                        group,
                        offsets = keys.len(),
                        "expired committed offsets (offsets.retention.minutes)"
                    );
                }
                Err(e) => tracing::debug!(group, ?e, "tombstones of expired offsets not written"),
            }
        }
    }
}
