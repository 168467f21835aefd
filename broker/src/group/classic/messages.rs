//! What goes into and comes out of the classic group state machine: its settings, the requests it is
//! given, the answers it gives (through [`Ticket`]s the adapter keeps), and the membership record it asks
//! to have written.

use bytes::Bytes;
use kafka_protocol::ResponseError;

/// The adapter's handle on a waiting JoinGroup or SyncGroup answer.
pub type Ticket = u64;

/// Bounds and timings every group of a broker shares (Kafka's broker settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupSettings {
    /// `group.min.session.timeout.ms`
    pub min_session_timeout_ms: i32,
    /// `group.max.session.timeout.ms`
    pub max_session_timeout_ms: i32,
    /// `group.initial.rebalance.delay.ms`: how long the first rebalance of an empty group waits for more
    /// members.
    pub initial_rebalance_delay_ms: i32,
    /// `group.max.size`: members one group may have.
    pub max_size: usize,
}

impl Default for GroupSettings {
    fn default() -> Self {
        GroupSettings {
            min_session_timeout_ms: 6_000,
            max_session_timeout_ms: 1_800_000,
            initial_rebalance_delay_ms: 3_000,
            max_size: 1_000,
        }
    }
}

/// A group's state, with Kafka's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
    Dead,
}

impl GroupState {
    /// The name DescribeGroups and ListGroups give.
    pub fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
            GroupState::Dead => "Dead",
        }
    }
}

/// A JoinGroup, as the state machine needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinArgs {
    /// Empty for a member's first join.
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocol_type: String,
    /// (name, metadata), in the member's order of preference.
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: a new member is first given its id with MEMBER_ID_REQUIRED and joins again with it.
    pub require_known_member_id: bool,
    /// JoinGroup v9+: the answer can tell a restarted static leader to keep the assignment it made.
    pub supports_skip_assignment: bool,
}

/// A member as the group leader sees it in its JoinGroup answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinedMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    /// The member's metadata for the group's chosen protocol.
    pub metadata: Bytes,
}

/// A JoinGroup answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinAnswer {
    pub error: Option<ResponseError>,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// Every member, for the leader only (which runs the assignor).
    pub members: Vec<JoinedMember>,
    /// The leader of a static group rejoining with a new member id keeps the assignment it made.
    pub skip_assignment: bool,
}

impl JoinAnswer {
    /// The answer of a refused JoinGroup.
    pub fn refused(error: ResponseError, member_id: &str) -> JoinAnswer {
        JoinAnswer {
            error: Some(error),
            generation: -1,
            protocol_type: None,
            protocol_name: None,
            leader: String::new(),
            member_id: member_id.to_string(),
            members: Vec::new(),
            skip_assignment: false,
        }
    }
}

/// A SyncGroup answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncAnswer {
    pub error: Option<ResponseError>,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

impl SyncAnswer {
    /// The answer of a refused SyncGroup.
    pub fn refused(error: ResponseError) -> SyncAnswer {
        SyncAnswer { error: Some(error), protocol_type: None, protocol_name: None, assignment: Bytes::new() }
    }
}

/// Who a request says it is: its member id and, for a static member, its `group.instance.id`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemberRef {
    pub member_id: String,
    pub instance_id: Option<String>,
}

/// An answer the adapter delivers through a ticket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    Join(Ticket, JoinAnswer),
    Sync(Ticket, SyncAnswer),
}

/// What a call asks of the adapter.
#[derive(Debug, Default, PartialEq, Eq)]
#[must_use]
pub struct Effects {
    /// Answers to deliver now, or, when `persist` is set, once the group's record is written.
    pub replies: Vec<Reply>,
    /// The group's membership record changed and must be written to `__consumer_offsets` (see
    /// [`super::Group::record`]) before the replies go out.
    pub persist: bool,
}

impl Effects {
    pub(super) fn none() -> Effects {
        Effects::default()
    }

    pub(super) fn merge(&mut self, other: Effects) {
        self.replies.extend(other.replies);
        self.persist |= other.persist;
    }
}

/// The membership part of a group as `__consumer_offsets` records it (Kafka's GroupMetadataValue).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupRecord {
    pub protocol_type: Option<String>,
    pub generation: i32,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub state_since_ms: u64,
    pub members: Vec<RecordedMember>,
}

/// One member in a [`GroupRecord`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedMember {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    /// Its metadata for the chosen protocol.
    pub subscription: Bytes,
    pub assignment: Bytes,
}
