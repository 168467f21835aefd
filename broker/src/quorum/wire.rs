//! The quorum's Raft types, and their wire form.
//!
//! openraft's own types carry serde derives; on our wire and in our files they travel as rkyv archives of
//! the plain mirrors below (no maps, no shared pointers), converted at the edge. The same mirrors frame
//! the durable Raft log, so what a voter writes to disk and what it sends are one format.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Cursor;

use openraft::{BasicNode, Entry, EntryPayload, LogId, Membership, StoredMembership, Vote};

use super::state::{Command, CommandError, Event};

/// What applying a command returned: its events, or why it was refused.
pub type CommandOutcome = Result<Vec<Event>, CommandError>;

openraft::declare_raft_types!(
    /// The quorum's openraft configuration: commands are [`Command`]s, voters are `u64` node ids
    /// reachable at a `HOST:PORT`.
    pub QuorumConfig:
        D = Command,
        R = CommandOutcome,
        NodeId = u64,
        Node = BasicNode,
        Entry = Entry<QuorumConfig>,
        SnapshotData = Cursor<Vec<u8>>,
);

#[derive(Debug, Clone, Copy, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireLogId {
    pub term: u64,
    pub node: u64,
    pub index: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireVote {
    pub term: u64,
    pub node: u64,
    pub committed: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireMembership {
    /// Joint configurations: each a set of voter ids.
    pub configs: Vec<Vec<u64>>,
    /// Every node (voters and learners) and its address.
    pub nodes: Vec<(u64, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum WirePayload {
    Blank,
    Command(Command),
    Membership(WireMembership),
}

#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireEntry {
    pub log_id: WireLogId,
    pub payload: WirePayload,
}

impl From<LogId<u64>> for WireLogId {
    fn from(id: LogId<u64>) -> Self {
        WireLogId { term: id.leader_id.term, node: id.leader_id.node_id, index: id.index }
    }
}

impl From<WireLogId> for LogId<u64> {
    fn from(id: WireLogId) -> Self {
        LogId::new(openraft::CommittedLeaderId::new(id.term, id.node), id.index)
    }
}

impl From<&Vote<u64>> for WireVote {
    fn from(v: &Vote<u64>) -> Self {
        WireVote { term: v.leader_id.term, node: v.leader_id.node_id, committed: v.committed }
    }
}

impl From<WireVote> for Vote<u64> {
    fn from(v: WireVote) -> Self {
        if v.committed { Vote::new_committed(v.term, v.node) } else { Vote::new(v.term, v.node) }
    }
}

impl From<&Membership<u64, BasicNode>> for WireMembership {
    fn from(m: &Membership<u64, BasicNode>) -> Self {
        WireMembership {
            configs: m.get_joint_config().iter().map(|c| c.iter().copied().collect()).collect(),
            nodes: m.nodes().map(|(id, node)| (*id, node.addr.clone())).collect(),
        }
    }
}

impl From<WireMembership> for Membership<u64, BasicNode> {
    fn from(m: WireMembership) -> Self {
        let configs: Vec<BTreeSet<u64>> = m.configs.into_iter().map(|c| c.into_iter().collect()).collect();
        let nodes: BTreeMap<u64, BasicNode> = m.nodes.into_iter().map(|(id, addr)| (id, BasicNode { addr })).collect();
        Membership::new(configs, nodes)
    }
}

impl From<&Entry<QuorumConfig>> for WireEntry {
    fn from(e: &Entry<QuorumConfig>) -> Self {
        let payload = match &e.payload {
            EntryPayload::Blank => WirePayload::Blank,
            EntryPayload::Normal(command) => WirePayload::Command(command.clone()),
            EntryPayload::Membership(m) => WirePayload::Membership(m.into()),
        };
        WireEntry { log_id: e.log_id.into(), payload }
    }
}

impl From<WireEntry> for Entry<QuorumConfig> {
    fn from(e: WireEntry) -> Self {
        let payload = match e.payload {
            WirePayload::Blank => EntryPayload::Blank,
            WirePayload::Command(command) => EntryPayload::Normal(command),
            WirePayload::Membership(m) => EntryPayload::Membership(m.into()),
        };
        Entry { log_id: e.log_id.into(), payload }
    }
}

/// A stored membership (the config and the log id of the entry that carried it).
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireStoredMembership {
    pub log_id: Option<WireLogId>,
    pub membership: WireMembership,
}

impl From<&StoredMembership<u64, BasicNode>> for WireStoredMembership {
    fn from(m: &StoredMembership<u64, BasicNode>) -> Self {
        WireStoredMembership { log_id: m.log_id().map(Into::into), membership: m.membership().into() }
    }
}

impl From<WireStoredMembership> for StoredMembership<u64, BasicNode> {
    fn from(m: WireStoredMembership) -> Self {
        StoredMembership::new(m.log_id.map(Into::into), m.membership.into())
    }
}

/// Message types of the quorum port (peer-protocol frame types).
pub mod kind {
    pub const APPEND: u16 = 10;
    pub const APPEND_RESULT: u16 = 11;
    pub const VOTE: u16 = 12;
    pub const VOTE_RESULT: u16 = 13;
    pub const SNAPSHOT: u16 = 14;
    pub const SNAPSHOT_RESULT: u16 = 15;
    /// A command to commit, from a broker or a tool; forwarded to the Raft leader if need be.
    pub const WRITE: u16 = 16;
    pub const WRITE_RESULT: u16 = 17;
    /// What this voter holds: its state, what it applied, the commands in its log (tools and tests).
    pub const STATUS: u16 = 18;
    pub const STATUS_RESULT: u16 = 19;
    /// The receiving voter refused or could not serve the request: a text reason.
    pub const FAILED: u16 = 20;
    /// A broker following the metadata: what was applied after the index it names (a long poll).
    pub const FETCH: u16 = 21;
    pub const FETCH_RESULT: u16 = 22;
}

/// A broker's metadata fetch: everything applied after `after` (`None`: from the start), waiting up to
/// `wait_ms` for something new.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireFetch {
    pub after: Option<u64>,
    pub wait_ms: u32,
}

/// What a follower of the metadata applies next.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum MetadataDelta {
    /// Nothing was applied after the fetcher's index within the wait.
    Unchanged,
    /// The commands after the fetcher's index, in log order, up to and including index `applied`
    /// (entries without a command, such as membership changes, advance the index but are not listed).
    Entries { commands: Vec<(u64, Command)>, applied: u64 },
    /// The voter's log no longer holds what comes after the fetcher's index (a snapshot covers it): the
    /// whole state as of `applied`.
    Snapshot { state: super::state::ClusterState, applied: Option<u64> },
}

/// The answer to a [`kind::FETCH`].
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireFetchResult {
    /// The Raft leader as the answering voter knows it (Kafka's controller id).
    pub leader: Option<u64>,
    pub delta: MetadataDelta,
}

#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireAppend {
    pub vote: WireVote,
    pub prev_log_id: Option<WireLogId>,
    pub entries: Vec<WireEntry>,
    pub leader_commit: Option<WireLogId>,
}

#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum WireAppendResult {
    Success,
    PartialSuccess(Option<WireLogId>),
    Conflict,
    HigherVote(WireVote),
}

#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireVoteRequest {
    pub vote: WireVote,
    pub last_log_id: Option<WireLogId>,
}

#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireVoteResult {
    pub vote: WireVote,
    pub granted: bool,
    pub last_log_id: Option<WireLogId>,
}

#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireSnapshotChunk {
    pub vote: WireVote,
    pub last_log_id: Option<WireLogId>,
    pub membership: WireStoredMembership,
    pub snapshot_id: String,
    pub offset: u64,
    pub data: Vec<u8>,
    pub done: bool,
}

/// The answer to a [`kind::WRITE`]: the command's outcome once committed and applied, or where the
/// leader is when the receiver could not get it committed.
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub enum WireWriteResult {
    Applied { index: u64, outcome: Result<Vec<Event>, CommandError> },
    NoLeader,
    Failed(String),
}

/// A voter's view, answered to [`kind::STATUS`].
#[derive(Debug, Clone, PartialEq, Eq, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct WireStatus {
    pub node: u64,
    pub leader: Option<u64>,
    /// Index of the last entry applied to `state`.
    pub applied: Option<u64>,
    pub state: super::state::ClusterState,
    /// The commands in this voter's log up to `applied`, with their indexes (those a snapshot covers and
    /// the log no longer holds are not listed).
    pub commands: Vec<(u64, Command)>,
}

use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, VoteRequest, VoteResponse};

impl From<&AppendEntriesRequest<QuorumConfig>> for WireAppend {
    fn from(r: &AppendEntriesRequest<QuorumConfig>) -> Self {
        WireAppend {
            vote: (&r.vote).into(),
            prev_log_id: r.prev_log_id.map(Into::into),
            entries: r.entries.iter().map(Into::into).collect(),
            leader_commit: r.leader_commit.map(Into::into),
        }
    }
}

impl From<WireAppend> for AppendEntriesRequest<QuorumConfig> {
    fn from(r: WireAppend) -> Self {
        AppendEntriesRequest {
            vote: r.vote.into(),
            prev_log_id: r.prev_log_id.map(Into::into),
            entries: r.entries.into_iter().map(Into::into).collect(),
            leader_commit: r.leader_commit.map(Into::into),
        }
    }
}

impl From<&AppendEntriesResponse<u64>> for WireAppendResult {
    fn from(r: &AppendEntriesResponse<u64>) -> Self {
        match r {
            AppendEntriesResponse::Success => WireAppendResult::Success,
            AppendEntriesResponse::PartialSuccess(id) => WireAppendResult::PartialSuccess(id.map(Into::into)),
            AppendEntriesResponse::Conflict => WireAppendResult::Conflict,
            AppendEntriesResponse::HigherVote(v) => WireAppendResult::HigherVote(v.into()),
        }
    }
}

impl From<WireAppendResult> for AppendEntriesResponse<u64> {
    fn from(r: WireAppendResult) -> Self {
        match r {
            WireAppendResult::Success => AppendEntriesResponse::Success,
            WireAppendResult::PartialSuccess(id) => AppendEntriesResponse::PartialSuccess(id.map(Into::into)),
            WireAppendResult::Conflict => AppendEntriesResponse::Conflict,
            WireAppendResult::HigherVote(v) => AppendEntriesResponse::HigherVote(v.into()),
        }
    }
}

impl From<&VoteRequest<u64>> for WireVoteRequest {
    fn from(r: &VoteRequest<u64>) -> Self {
        WireVoteRequest { vote: (&r.vote).into(), last_log_id: r.last_log_id.map(Into::into) }
    }
}

impl From<WireVoteRequest> for VoteRequest<u64> {
    fn from(r: WireVoteRequest) -> Self {
        VoteRequest { vote: r.vote.into(), last_log_id: r.last_log_id.map(Into::into) }
    }
}

impl From<&VoteResponse<u64>> for WireVoteResult {
    fn from(r: &VoteResponse<u64>) -> Self {
        WireVoteResult { vote: (&r.vote).into(), granted: r.vote_granted, last_log_id: r.last_log_id.map(Into::into) }
    }
}

impl From<WireVoteResult> for VoteResponse<u64> {
    fn from(r: WireVoteResult) -> Self {
        VoteResponse { vote: r.vote.into(), vote_granted: r.granted, last_log_id: r.last_log_id.map(Into::into) }
    }
}

impl From<&InstallSnapshotRequest<QuorumConfig>> for WireSnapshotChunk {
    fn from(r: &InstallSnapshotRequest<QuorumConfig>) -> Self {
        WireSnapshotChunk {
            vote: (&r.vote).into(),
            last_log_id: r.meta.last_log_id.map(Into::into),
            membership: (&r.meta.last_membership).into(),
            snapshot_id: r.meta.snapshot_id.clone(),
            offset: r.offset,
            data: r.data.clone(),
            done: r.done,
        }
    }
}

impl From<WireSnapshotChunk> for InstallSnapshotRequest<QuorumConfig> {
    fn from(r: WireSnapshotChunk) -> Self {
        InstallSnapshotRequest {
            vote: r.vote.into(),
            meta: openraft::SnapshotMeta {
                last_log_id: r.last_log_id.map(Into::into),
                last_membership: r.membership.into(),
                snapshot_id: r.snapshot_id,
            },
            offset: r.offset,
            data: r.data,
            done: r.done,
        }
    }
}
