//! The broker's copy of the cluster metadata: the quorum's state as of a log index, kept up to date by
//! applying the commands fetched after that index (the same deterministic
//! [`ClusterState::apply`](crate::quorum::state::ClusterState::apply) the voters run), or by taking a whole
//! state when the voter's log no longer holds them.
//!
//! Handlers read it through `BrokerContext::image()` (an `Arc`, swapped whole when the follower
//! publishes a newer one, so a handler's copy never changes under it). The security metadata is
//! [`MetadataImage::security`]; code that builds something from it (an authorizer's index of the ACLs,
//! the quota limits) keeps the `acls_version` / `quotas_version` / `scram_version` it built from and
//! rebuilds when the image's moves: the same log gives the same versions everywhere.

use crate::quorum::security::SecurityState;
use crate::quorum::state::{ClusterState, NodeId, PartitionRecord, TopicRecord};
use crate::quorum::wire::MetadataDelta;

/// The cluster metadata as of log index `applied`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetadataImage {
    /// The index of the last quorum log entry reflected here; `None` before the first fetch.
    pub applied: Option<u64>,
    pub state: ClusterState,
    /// The Raft leader when last heard of (Kafka's controller).
    pub controller: Option<NodeId>,
}

impl MetadataImage {
    /// Applies what a fetch returned. Returns whether the image moved on.
    pub fn apply(&mut self, delta: MetadataDelta) -> bool {
        match delta {
            MetadataDelta::Unchanged => false,
            MetadataDelta::Entries { commands, applied } => {
                if Some(applied) <= self.applied {
                    return false;
                }
                for (index, command) in commands {
                    if Some(index) > self.applied {
                        // A refused command changes nothing, on the voters as here.
                        let _ = self.state.apply(&command);
                    }
                }
                self.applied = Some(applied);
                true
            }
            MetadataDelta::Snapshot { state, applied } => {
                if applied <= self.applied {
                    return false;
                }
                self.state = state;
                self.applied = applied;
                true
            }
        }
    }

    pub fn topic(&self, name: &str) -> Option<&TopicRecord> {
        self.state.topics.get(name)
    }

    pub fn partition(&self, topic: &str, partition: i32) -> Option<&PartitionRecord> {
        self.topic(topic)?.partitions.get(usize::try_from(partition).ok()?)
    }

    /// SCRAM credentials, ACL bindings and client quotas, with their change counters.
    pub fn security(&self) -> &SecurityState {
        &self.state.security
    }

    /// Whether `id` is registered and not fenced.
    pub fn is_live(&self, id: NodeId) -> bool {
        self.state.brokers.get(&id).is_some_and(|b| !b.fenced)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use uuid::Uuid;

    use super::*;
    use crate::quorum::state::{BrokerEndpoint, Command};

    fn register(id: u32) -> Command {
        Command::RegisterBroker {
            id: NodeId(id),
            endpoint: BrokerEndpoint { host: "127.0.0.1".into(), port: 9092 },
            incarnation: 1,
            previous_incarnation: None,
            now_ms: 0,
            session_timeout_ms: 9000,
        }
    }

    fn create(name: &str) -> Command {
        Command::CreateTopic {
            assignment: None,
            name: name.into(),
            id: Uuid::nil(),
            partitions: 2,
            replication_factor: 1,
            configs: BTreeMap::new(),
        }
    }

    #[test]
    fn entries_apply_once_in_order_and_a_snapshot_replaces_only_an_older_image() {
        let mut image = MetadataImage::default();
        let first = MetadataDelta::Entries { commands: vec![(1, register(1)), (2, create("a"))], applied: 3 };
        assert!(image.apply(first.clone()));
        assert_eq!(image.applied, Some(3));
        assert_eq!(image.topic("a").unwrap().partitions.len(), 2);
        // The same entries again (a retried fetch) change nothing.
        assert!(!image.apply(first));
        // Entries overlapping what is applied: only the new ones count.
        let overlap = MetadataDelta::Entries { commands: vec![(2, create("a")), (4, create("b"))], applied: 4 };
        assert!(image.apply(overlap));
        assert!(image.topic("b").is_some());
        assert_eq!(image.partition("b", 1).map(|p| p.leader), Some(Some(NodeId(1))));
        assert_eq!(image.partition("b", 2), None);
        assert_eq!(image.partition("b", -1), None);

        let mut voter = ClusterState::default();
        voter.apply(&register(1)).unwrap();
        assert!(!image.apply(MetadataDelta::Snapshot { state: voter.clone(), applied: Some(4) }), "not newer");
        assert!(image.apply(MetadataDelta::Snapshot { state: voter, applied: Some(9) }));
        assert_eq!(image.applied, Some(9));
        assert!(image.state.topics.is_empty());
        assert!(image.is_live(NodeId(1)) && !image.is_live(NodeId(2)));
    }

    #[test]
    fn acl_commands_move_the_images_acls_version_as_on_the_voters() {
        use crate::quorum::security::AclRecord;
        let binding = AclRecord {
            resource_type: 2,
            resource_name: "orders".into(),
            pattern_type: 3,
            principal: "User:alice".into(),
            host: "*".into(),
            operation: 3,
            permission_type: 3,
        };
        let create = Command::CreateAcls { acls: vec![binding.clone()] };
        let mut image = MetadataImage::default();
        assert!(image.apply(MetadataDelta::Entries { commands: vec![(1, create.clone())], applied: 1 }));
        assert_eq!(image.security().acls_version, 1);
        assert!(image.security().acls.contains(&binding));
        let mut voter = ClusterState::default();
        voter.apply(&create).unwrap();
        assert_eq!(image.state, voter);
    }
}
