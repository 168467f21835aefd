//! What a request handler asks of the group coordinator on the shard that owns a group's
//! `__consumer_offsets` partition, and what it answers. Plain values and reply channels, so that the
//! broker's shared context can hold the channels without knowing the coordinator.

use bytes::Bytes;
use kafka_protocol::ResponseError;
use shardlog_storage::LeaderEpoch;

use super::classic::{JoinAnswer, JoinArgs, MemberRef, SyncAnswer};
use super::consumer::{Assignment, Heartbeat, HeartbeatAnswer, Refusal};
use super::records::CommittedOffset;

/// A request for one group, to the coordinator of `partition` (which the handler found led here at
/// `epoch`).
#[derive(Debug)]
pub struct GroupCall {
    pub partition: i32,
    pub epoch: LeaderEpoch,
    pub group: String,
    pub op: GroupOp,
}

/// One partition's offset in an OffsetCommit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetToCommit {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
}

/// A committed offset in an OffsetFetch answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchedOffset {
    pub topic: String,
    pub partition: i32,
    /// `None`: nothing committed (the answer says offset -1).
    pub committed: Option<CommittedOffset>,
    /// The partition's own error: UNSTABLE_OFFSET_COMMIT when the fetch requires stable offsets and a
    /// transaction's offset for it waits for its marker (then `committed` is `None`).
    pub error: Option<ResponseError>,
}

/// The transactional producer a TxnOffsetCommit writes for: its offsets go to the log in a
/// transactional batch under this id and epoch, and wait for the transaction's marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnProducer {
    pub id: i64,
    pub epoch: i16,
}

/// Who asks for a group's offsets: OffsetFetch v9's member id and epoch. Older versions, and clients
/// outside the group, name no member and epoch -1.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchingMember {
    pub member_id: Option<String>,
    pub member_epoch: i32,
}

impl FetchingMember {
    /// A fetch from outside any group.
    pub fn outsider() -> Self {
        Self { member_id: None, member_epoch: -1 }
    }
}

/// A group as DescribeGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupDescription {
    pub state: &'static str,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<DescribedMember>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// A group as ListGroups shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupListing {
    pub group: String,
    pub protocol_type: String,
    pub state: &'static str,
    /// "classic", or "consumer" for a group of the consumer protocol (KIP-848).
    pub group_type: &'static str,
}

/// A consumer-protocol group as ConsumerGroupDescribe shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerGroupDescription {
    pub state: &'static str,
    pub epoch: i32,
    pub assignment_epoch: i32,
    pub assignor: &'static str,
    pub members: Vec<ConsumerMemberDescription>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerMemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub member_epoch: i32,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    pub assignment: Assignment,
    pub target: Assignment,
}

/// A group-level error, or the per-item outcome.
pub type PerItem = Result<Vec<Option<ResponseError>>, ResponseError>;

#[derive(Debug)]
pub enum GroupOp {
    Join {
        args: JoinArgs,
        reply: flume::Sender<JoinAnswer>,
    },
    Sync {
        member: MemberRef,
        generation: i32,
        protocol_type: Option<String>,
        protocol_name: Option<String>,
        assignments: Vec<(String, Bytes)>,
        reply: flume::Sender<SyncAnswer>,
    },
    Heartbeat {
        member: MemberRef,
        generation: i32,
        reply: flume::Sender<Option<ResponseError>>,
    },
    /// Per leaving member: its error.
    Leave {
        members: Vec<MemberRef>,
        reply: flume::Sender<PerItem>,
    },
    /// Per offset: its error.
    Commit {
        member: MemberRef,
        generation: i32,
        offsets: Vec<OffsetToCommit>,
        reply: flume::Sender<PerItem>,
    },
    /// TxnOffsetCommit (v0-4): per offset, its error. `member` and `generation` are KIP-447's group
    /// metadata (v3+); with generation -1, an empty member id and no instance id the group is not
    /// checked, as before v3.
    TxnCommit {
        transactional_id: String,
        producer: TxnProducer,
        member: MemberRef,
        generation: i32,
        offsets: Vec<OffsetToCommit>,
        reply: flume::Sender<PerItem>,
    },
    /// `partitions` `None`: every committed offset of the group. `member` is who asks (OffsetFetch
    /// v9+), checked against a consumer-protocol group. `require_stable` (v7+): a partition with a
    /// transaction's offset waiting answers UNSTABLE_OFFSET_COMMIT instead of its committed offset.
    FetchOffsets {
        partitions: Option<Vec<(String, i32)>>,
        member: FetchingMember,
        require_stable: bool,
        reply: flume::Sender<Result<Vec<FetchedOffset>, ResponseError>>,
    },
    /// `Ok(None)`: no such group.
    Describe {
        reply: flume::Sender<Result<Option<GroupDescription>, ResponseError>>,
    },
    Delete {
        reply: flume::Sender<Option<ResponseError>>,
    },
    /// OffsetDelete: per partition, its error (GROUP_SUBSCRIBED_TO_TOPIC while the group consumes it).
    DeleteOffsets {
        partitions: Vec<(String, i32)>,
        reply: flume::Sender<PerItem>,
    },
    /// ConsumerGroupHeartbeat (KIP-848).
    ConsumerHeartbeat {
        heartbeat: Box<Heartbeat>,
        reply: flume::Sender<Result<HeartbeatAnswer, Refusal>>,
    },
    /// ConsumerGroupDescribe; `Ok(None)`: no consumer-protocol group of that id.
    ConsumerDescribe {
        reply: flume::Sender<Result<Option<ConsumerGroupDescription>, ResponseError>>,
    },
}

/// Shard-wide questions to a shard's coordinator.
#[derive(Debug)]
pub enum CoordinatorRequest {
    Group(GroupCall),
    /// Every group of the offsets partitions this shard coordinates; COORDINATOR_LOAD_IN_PROGRESS while
    /// one of them is still loading.
    List {
        reply: flume::Sender<Result<Vec<GroupListing>, ResponseError>>,
    },
    /// A transaction marker landed on `partition` of `__consumer_offsets`, led by this shard: the COMMIT
    /// (`commit` true) or ABORT control batch of `producer_id`, at log offset `marker_offset`, written at
    /// leader epoch `epoch`. Sent by the path that writes markers, after the write is acknowledged. The
    /// producer's transactional offsets written before the marker, in every group of the partition,
    /// become committed (each unless a later commit is there) or are dropped.
    ///
    /// The answer: `Ok(())` once applied. Applying it again changes nothing (only offsets written before
    /// `marker_offset` are ended), so it may be retried. COORDINATOR_LOAD_IN_PROGRESS: the partition is
    /// loading at `epoch`; send it again (the load may have listed its end before the marker landed).
    /// NOT_COORDINATOR: a newer leadership is loaded (its load reads the marker from the log), nothing to
    /// do.
    TxnCompleted {
        partition: i32,
        epoch: LeaderEpoch,
        producer_id: i64,
        commit: bool,
        marker_offset: i64,
        reply: flume::Sender<Result<(), ResponseError>>,
    },
}
