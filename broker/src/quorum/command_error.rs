//! Why the quorum's state machine refuses a command, with the Kafka error code each refusal maps to.

use serde::{Deserialize, Serialize};
use shardlog_storage::LeaderEpoch;

use super::state::{NodeId, PartitionEpoch};

/// Why a command was refused. Each maps to the Kafka error code a client or broker understands.
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    thiserror::Error,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[non_exhaustive]
pub enum CommandError {
    #[error("broker {0} is registered by another process whose session has not expired")]
    DuplicateBrokerRegistration(NodeId),
    #[error("broker {0} is not registered")]
    BrokerNotRegistered(NodeId),
    #[error("broker {id}: incarnation {incarnation} is not the registered one")]
    StaleBrokerEpoch { id: NodeId, incarnation: u64 },
    #[error("broker {0} was heard from since the fencing was decided")]
    SessionRenewed(NodeId),
    #[error("topic {0:?} already exists")]
    TopicAlreadyExists(String),
    #[error("topic {0:?} does not exist")]
    UnknownTopic(String),
    #[error("partition {partition} of topic {topic:?} does not exist")]
    UnknownPartition { topic: String, partition: u32 },
    #[error("invalid partition count: {0}")]
    InvalidPartitions(String),
    #[error("replication factor {wanted} is larger than the {available} available brokers")]
    InvalidReplicationFactor { wanted: u16, available: usize },
    #[error("leader epoch {given} is not the current {current}: the proposer is not the leader any more")]
    FencedLeaderEpoch { given: LeaderEpoch, current: LeaderEpoch },
    #[error("partition epoch {given:?} is not the current {current:?}")]
    InvalidUpdateVersion { given: PartitionEpoch, current: PartitionEpoch },
    #[error("invalid ISR {isr:?}: {reason}")]
    InvalidIsr { isr: Vec<NodeId>, reason: String },
    #[error("the preferred leader is not live and in sync")]
    PreferredLeaderNotAvailable,
    #[error("the preferred leader already leads")]
    ElectionNotNeeded,
    // New variants go last (rkyv enum tags are positions).
    #[error("invalid replica assignment: {0}")]
    InvalidReplicaAssignment(String),
    #[error("cannot allocate {0} producer ids")]
    ProducerIdsExhausted(u32),
    #[error("no live replica may lead")]
    EligibleLeadersNotAvailable,
    #[error("no reassignment of this partition is in progress")]
    NoReassignmentInProgress,
    #[error("broker {id} holds no replica of partition {partition} of topic {topic:?}")]
    NotAReplica { id: NodeId, topic: String, partition: u32 },
    #[error("{items} items in one command; at most {max}")]
    TooManyItems { items: usize, max: usize },
    #[error("{0:?} appears more than once")]
    DuplicateResource(String),
    #[error("user {0:?} has no credential for this mechanism")]
    ResourceNotFound(String),
    #[error("SASL mechanism code {0} is not a SCRAM mechanism")]
    UnsupportedSaslMechanism(i8),
    #[error("unacceptable credential: {0}")]
    UnacceptableCredential(String),
    #[error("invalid ACL binding: {0}")]
    InvalidAclBinding(String),
    #[error("invalid client quota: {0}")]
    InvalidClientQuota(String),
    #[error("invalid listeners: {0}")]
    InvalidListeners(String),
}

impl CommandError {
    /// The Kafka error code for this refusal.
    pub fn kafka_code(&self) -> i16 {
        match self {
            CommandError::DuplicateBrokerRegistration(_) => 101,
            CommandError::BrokerNotRegistered(_) => 102,
            CommandError::StaleBrokerEpoch { .. } | CommandError::SessionRenewed(_) => 77,
            CommandError::TopicAlreadyExists(_) => 36,
            CommandError::UnknownTopic(_) | CommandError::UnknownPartition { .. } => 3,
            CommandError::InvalidPartitions(_) => 37,
            CommandError::InvalidReplicaAssignment(_) => 39,
            CommandError::InvalidReplicationFactor { .. } => 38,
            CommandError::FencedLeaderEpoch { .. } => 74,
            CommandError::InvalidUpdateVersion { .. } => 96,
            CommandError::InvalidIsr { .. } => 107,
            CommandError::PreferredLeaderNotAvailable => 80,
            CommandError::ElectionNotNeeded => 84,
            CommandError::EligibleLeadersNotAvailable => 83,
            CommandError::NoReassignmentInProgress => 85,
            CommandError::NotAReplica { .. } => 9,
            CommandError::TooManyItems { .. }
            | CommandError::InvalidAclBinding(_)
            | CommandError::InvalidClientQuota(_)
            | CommandError::InvalidListeners(_) => 42,
            CommandError::DuplicateResource(_) => 92,
            CommandError::ResourceNotFound(_) => 91,
            CommandError::UnsupportedSaslMechanism(_) => 33,
            CommandError::UnacceptableCredential(_) => 93,
            // UNKNOWN_SERVER_ERROR: a block of ids cannot be had (an empty block, or the id space is used up).
            CommandError::ProducerIdsExhausted(_) => -1,
        }
    }
}
