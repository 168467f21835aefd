//! The topics the broker keeps for itself: `__consumer_offsets` (the group coordinator's) and
//! `__transaction_state` (the transaction coordinator's). Neither exists until the first FindCoordinator
//! for its key type; the broker then creates it from an [`InternalTopicSpec`], which says what the topic is
//! meant to be, and [`InternalTopicSpec::plan`], which says what it can be with the brokers live at that
//! moment: the replication factor at most the live brokers, `min.insync.replicas` at most the replication
//! factor (so that one broker alone can write to a topic meant for three).
//!
//! Both are compacted: the latest record of each key (a group, an offset, a transactional id) is kept and
//! tombstones remove the rest; nothing goes by age or size.
//!
//! This module only describes; it never creates a topic (the handlers do, through shard 0) and never
//! decides which partition holds a key (the coordinators do).

use crate::group::OFFSETS_TOPIC;
use crate::txn::TRANSACTION_STATE_TOPIC;

/// Every internal topic.
pub const INTERNAL_TOPICS: [&str; 2] = [OFFSETS_TOPIC, TRANSACTION_STATE_TOPIC];

/// What an internal topic is created with, from the broker's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InternalTopicSpec {
    pub name: &'static str,
    pub partitions: u32,
    /// Wanted; fewer when fewer brokers are live at the topic's creation.
    pub replication_factor: u16,
    /// The topic's own `min.insync.replicas`, at most its replication factor; `None`: the broker's
    /// default applies (`__consumer_offsets`, as in Kafka, which has no setting for it).
    pub min_insync_replicas: Option<u16>,
    pub segment_bytes: u32,
}

/// An internal topic as it is created now: its replication factor and its topic settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InternalTopicPlan {
    pub partitions: u32,
    pub replication_factor: u16,
    /// Topic settings by Kafka's names, in the order they are sent.
    pub configs: Vec<(&'static str, String)>,
}

impl InternalTopicSpec {
    /// The topic as it can be with `live_brokers` brokers live (a broker asking counts as one, so at least
    /// one).
    pub fn plan(&self, live_brokers: usize) -> InternalTopicPlan {
        assert!(self.partitions > 0 && self.replication_factor > 0, "a validated spec: {self:?}");
        let replication_factor = (self.replication_factor as usize).min(live_brokers.max(1)) as u16;
        let mut configs =
            vec![("cleanup.policy", "compact".to_string()), ("segment.bytes", self.segment_bytes.to_string())];
        if let Some(min_isr) = self.min_insync_replicas {
            assert!(min_isr > 0, "a validated min ISR: {self:?}");
            configs.push(("min.insync.replicas", min_isr.min(replication_factor).to_string()));
        }
        InternalTopicPlan { partitions: self.partitions, replication_factor, configs }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transaction_state() -> InternalTopicSpec {
        InternalTopicSpec {
            name: TRANSACTION_STATE_TOPIC,
            partitions: 50,
            replication_factor: 3,
            min_insync_replicas: Some(2),
            segment_bytes: 104_857_600,
        }
    }

    fn config<'a>(plan: &'a InternalTopicPlan, key: &str) -> Option<&'a str> {
        plan.configs.iter().find(|(k, _)| *k == key).map(|(_, v)| v.as_str())
    }

    #[test]
    fn replication_and_min_isr_shrink_to_a_lone_broker() {
        let plan = transaction_state().plan(1);
        assert_eq!((plan.partitions, plan.replication_factor), (50, 1));
        assert_eq!(config(&plan, "min.insync.replicas"), Some("1"));
        assert_eq!(config(&plan, "cleanup.policy"), Some("compact"));
        assert_eq!(config(&plan, "segment.bytes"), Some("104857600"));
    }

    #[test]
    fn two_live_brokers_give_replication_two_and_the_wanted_min_isr() {
        let plan = transaction_state().plan(2);
        assert_eq!(plan.replication_factor, 2);
        assert_eq!(config(&plan, "min.insync.replicas"), Some("2"));
    }

    #[test]
    fn more_live_brokers_than_wanted_keep_the_spec() {
        let plan = transaction_state().plan(7);
        assert_eq!(plan.replication_factor, 3);
        assert_eq!(config(&plan, "min.insync.replicas"), Some("2"));
    }

    #[test]
    fn a_min_isr_above_the_replication_factor_is_capped_at_it() {
        let spec = InternalTopicSpec { min_insync_replicas: Some(5), ..transaction_state() };
        assert_eq!(config(&spec.plan(7), "min.insync.replicas"), Some("3"));
    }

    #[test]
    fn no_live_broker_known_yet_counts_the_asking_broker() {
        assert_eq!(transaction_state().plan(0).replication_factor, 1);
    }

    #[test]
    fn without_a_min_isr_the_topic_sets_none() {
        let offsets = InternalTopicSpec { name: OFFSETS_TOPIC, min_insync_replicas: None, ..transaction_state() };
        let plan = offsets.plan(3);
        assert_eq!(config(&plan, "min.insync.replicas"), None);
        assert_eq!(plan.configs.len(), 2);
    }
}
