//! The coordinator's side of the consumer protocol (KIP-848): the topics its groups resolve
//! subscriptions against, ConsumerGroupHeartbeat decided, written and answered, and the hand-over of an
//! empty group to a JoinGroup.

use std::rc::Rc;

use kafka_protocol::ResponseError;
use shardlog_storage::LeaderEpoch;

use super::Coordinator;
use super::answers::coordinator_error;
use super::state::Entry;
use crate::group::classic::GroupState;
use crate::group::consumer::{
    Change, ConsumerGroup, Heartbeat, HeartbeatAnswer, JOIN_EPOCH, Refusal, TopicId, TopicsView,
};
use crate::group::records::OffsetsRecord;
use crate::metadata::image::MetadataImage;

/// The topics a consumer-protocol group's subscriptions are resolved against: the broker's metadata.
pub(super) struct ImageTopics<'a>(&'a MetadataImage);

impl TopicsView for ImageTopics<'_> {
    fn version(&self) -> u64 {
        self.0.applied.unwrap_or(0)
    }

    fn lookup(&self, name: &str) -> Option<(TopicId, i32)> {
        self.0.topic(name).map(|t| (t.id, t.partitions.len() as i32))
    }

    fn names(&self) -> Vec<String> {
        self.0.state.topics.keys().filter(|name| !crate::topics::is_internal(name)).cloned().collect()
    }
}

/// The records of a consumer-protocol group's changes.
pub(super) fn consumer_records(group: &str, changes: Vec<Change>) -> Vec<OffsetsRecord> {
    changes.into_iter().map(|change| OffsetsRecord::Consumer { group: group.to_string(), change }).collect()
}

impl Coordinator {
    /// A ConsumerGroupHeartbeat: the group's state machine decides, its records are written (acks=all),
    /// and the answer goes out once they are; an answer without records once the partition's writes sent
    /// before it are.
    pub(super) async fn consumer_heartbeat(
        self: &Rc<Self>,
        partition: i32,
        epoch: LeaderEpoch,
        group: &str,
        heartbeat: Heartbeat,
        now: u64,
    ) -> Result<HeartbeatAnswer, Refusal> {
        let (settings, consumer_settings) = (self.settings, self.consumer_settings);
        let image = self.ctx.image();
        let topics = ImageTopics(&image);
        let decided = self.with_groups(partition, epoch, |groups| {
            let joining = heartbeat.member_epoch == JOIN_EPOCH;
            let not_found =
                |why: &str| Refusal { error: ResponseError::GroupIdNotFound, message: format!("group {group} {why}") };
            let created = !groups.contains_key(group);
            let entry = match groups.get_mut(group) {
                Some(entry) => entry,
                None if joining => groups.entry(group.to_string()).or_insert_with(|| Entry::new(group, settings, now)),
                None => return Err(not_found("does not exist")),
            };
            let mut records = Vec::new();
            let mut consumer = match entry.consumer.take() {
                Some(consumer) => consumer,
                None if !joining => return Err(not_found("is not a consumer group")),
                None if entry.group.state != GroupState::Empty => {
                    return Err(not_found("is a classic group with members"));
                }
                None => ConsumerGroup::new(group),
            };
            let taken_over = entry.group.state == GroupState::Empty && consumer.epoch == 0;
            let outcome = consumer.heartbeat(heartbeat, &topics, &consumer_settings, now);
            let keep = outcome.is_ok() || consumer.epoch > 0;
            if keep {
                entry.consumer = Some(consumer);
                entry.note_consumer_members(now);
            }
            let (answer, changes) = match outcome {
                Ok(answered) => answered,
                Err(refusal) => {
                    if !keep && created {
                        // A refused first join leaves no group behind (ListGroups would show it until
                        // the next tick).
                        groups.remove(group);
                    }
                    return Err(refusal);
                }
            };
            if taken_over && entry.recorded {
                // The empty classic group's membership record goes; its offsets stay the group's.
                records.push(OffsetsRecord::Group { group: group.to_string(), value: None });
                entry.recorded = false;
            }
            records.extend(consumer_records(group, changes));
            Ok((answer, records))
        });
        let not_coordinator = Refusal { error: ResponseError::NotCoordinator, message: String::new() };
        let (answer, records) = decided.unwrap_or(Err(not_coordinator.clone()))?;
        // Taken with no await since the decision: where the partition's writes stood when it was made.
        let mark = self.runtime.mark(partition);
        if records.is_empty() {
            // Nothing of its own to write, but it may reflect others' changes still being written.
            return match self.runtime.settled(mark).await {
                Ok(()) => Ok(answer),
                Err(error) => Err(Refusal { error, message: String::new() }),
            };
        }
        match self.write(partition, epoch, &records).await {
            // Decided on state that a failed earlier write may have left out of the log.
            Ok(_) if self.runtime.dropped_since(mark) => Err(not_coordinator),
            Ok(_) => Ok(answer),
            Err(e) => {
                tracing::debug!(group, ?e, "consumer group records not written");
                self.runtime.reload_after_failed_write(partition, epoch);
                Err(Refusal { error: coordinator_error(e), message: String::new() })
            }
        }
    }

    /// Before a JoinGroup: a consumer-protocol group with members refuses it
    /// (INCONSISTENT_GROUP_PROTOCOL); an empty one becomes a classic group, its records' deletion sent
    /// now, so before the membership record the join leads to.
    pub(super) fn make_classic(
        self: &Rc<Self>,
        partition: i32,
        epoch: LeaderEpoch,
        group: &str,
        entry: &mut Entry,
    ) -> Result<(), ResponseError> {
        let Some(consumer) = &entry.consumer else { return Ok(()) };
        if !consumer.members.is_empty() {
            return Err(ResponseError::InconsistentGroupProtocol);
        }
        let write = self.write(partition, epoch, &consumer_records(group, consumer.deletion()));
        entry.consumer = None;
        let me = self.clone();
        let id = group.to_string();
        glommio::spawn_local(async move {
            if let Err(e) = write.await {
                // The log may still hold the consumer group: read it again, as after any failed write
                // of group records.
                tracing::debug!(group = id, ?e, "records of a taken-over consumer group not deleted");
                me.runtime.reload_after_failed_write(partition, epoch);
            }
        })
        .detach();
        Ok(())
    }
}
