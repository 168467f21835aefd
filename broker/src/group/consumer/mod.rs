//! One consumer group under the consumer protocol of KIP-848 (ConsumerGroupHeartbeat), as a state machine
//! that does no I/O: every call takes the time and the topics it may need, and returns the answer and the
//! records to write to `__consumer_offsets` before the answer goes out.
//!
//! Three epochs move the group along. The group epoch is bumped whenever what the assignment depends on
//! changes (a member joins or leaves, a subscription, the assignor, the partitions of subscribed topics).
//! The target assignment is computed by the server-side assignor ([`assign`]) for the group epoch when a
//! heartbeat finds it behind. Each member's current assignment moves towards its target
//! ([`reconcile`]): it is given a partition only once no other member holds it, and it reaches the target
//! epoch once it has given up what it must. A member's heartbeat carries its member epoch; one that is not
//! its epoch (or, for a member that missed an answer, the one before) is fenced.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use kafka_protocol::ResponseError;
use uuid::Uuid;

pub mod assign;
pub mod reconcile;
#[cfg(test)]
mod tests;
mod validate;

pub use assign::{AssignmentSpec, Assignor};
pub use reconcile::{Current, MemberState};
use validate::{compile, validate};

/// A topic's id.
pub type TopicId = Uuid;

/// Partitions by topic: what a member is assigned.
pub type Assignment = BTreeMap<TopicId, BTreeSet<i32>>;

/// The member epoch of a heartbeat that joins (or rejoins) the group.
pub const JOIN_EPOCH: i32 = 0;
/// The member epoch of a heartbeat that leaves the group.
pub const LEAVE_EPOCH: i32 = -1;
/// The member epoch of a static member's heartbeat that leaves for now: it keeps its partitions until its
/// session times out, for a new process with its instance id to take over.
pub const STATIC_LEAVE_EPOCH: i32 = -2;

/// Bounds and timings every consumer-protocol group of a broker shares (Kafka's broker settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerGroupSettings {
    /// `group.consumer.session.timeout.ms`
    pub session_timeout_ms: i32,
    /// `group.consumer.heartbeat.interval.ms`
    pub heartbeat_interval_ms: i32,
    /// `group.consumer.max.size`: members one group may have.
    pub max_size: usize,
    /// `group.consumer.assignors`: those members may choose, the first the default.
    pub assignors: &'static [Assignor],
}

impl Default for ConsumerGroupSettings {
    fn default() -> Self {
        ConsumerGroupSettings {
            session_timeout_ms: 45_000,
            heartbeat_interval_ms: 5_000,
            max_size: 1_000,
            assignors: &[Assignor::Uniform, Assignor::Range],
        }
    }
}

/// The topics a group's subscriptions are resolved against: name to (id, partition count).
pub trait TopicsView {
    /// Changes whenever a topic is created, deleted, or changes its partition count.
    fn version(&self) -> u64;
    fn lookup(&self, name: &str) -> Option<(TopicId, i32)>;
    /// Every topic a regular expression may match (internal topics left out).
    fn names(&self) -> Vec<String>;
}

/// A ConsumerGroupHeartbeat, as the state machine needs it. `None` fields are "unchanged".
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Heartbeat {
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    /// -1: unchanged.
    pub rebalance_timeout_ms: i32,
    pub subscribed_topic_names: Option<Vec<String>>,
    pub subscribed_topic_regex: Option<String>,
    pub server_assignor: Option<String>,
    /// What the member owns now.
    pub owned: Option<Assignment>,
    pub client_id: String,
    pub client_host: String,
}

/// A heartbeat's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeartbeatAnswer {
    pub member_id: String,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// The member's assignment, when it changed or the member needs to be told it again.
    pub assignment: Option<Assignment>,
}

/// A refused heartbeat: the error and a message for the client's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub error: ResponseError,
    pub message: String,
}

fn refuse(error: ResponseError, message: impl Into<String>) -> Refusal {
    Refusal { error, message: message.into() }
}

/// A member's subscription and client details, as ConsumerGroupMemberMetadata records them.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemberMetadata {
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: BTreeSet<String>,
    pub subscribed_topic_regex: Option<String>,
    pub server_assignor: Option<String>,
    pub rebalance_timeout_ms: i32,
}

/// One member of a consumer-protocol group.
#[derive(Debug, Clone)]
pub struct Member {
    pub member_id: String,
    pub metadata: MemberMetadata,
    pub current: Current,
    /// When it last heartbeated.
    last_seen_ms: u64,
    /// When it must have given up its pending revocation.
    revoke_by_ms: Option<u64>,
    /// Its subscription regular expression, compiled.
    regex: Option<regex::Regex>,
}

impl Member {
    /// A static member that left for now (epoch -2): its partitions wait for its instance id.
    pub fn left_for_now(&self) -> bool {
        self.current.epoch == STATIC_LEAVE_EPOCH
    }

    /// A member that has just joined, or is being read back: nothing assigned, epoch 0.
    fn new(member_id: String, now_ms: u64) -> Member {
        Member {
            member_id,
            metadata: MemberMetadata::default(),
            current: Current::joined(),
            last_seen_ms: now_ms,
            revoke_by_ms: None,
            regex: None,
        }
    }
}

/// A change the group asks to have written to `__consumer_offsets`, one per Kafka record type. A group is
/// rebuilt by [`ConsumerGroup::replay`] of these in the order written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// ConsumerGroupMetadata: the group epoch. `None`: the group is deleted.
    GroupEpoch(Option<i32>),
    /// ConsumerGroupMemberMetadata. `None`: the member left.
    Member(String, Option<MemberMetadata>),
    /// ConsumerGroupTargetAssignmentMetadata: the epoch of the target assignment.
    AssignmentEpoch(Option<i32>),
    /// ConsumerGroupTargetAssignmentMember: one member's target.
    Target(String, Option<Assignment>),
    /// ConsumerGroupCurrentMemberAssignment: one member's current assignment.
    Current(String, Option<Current>),
}

/// The group's state as ConsumerGroupDescribe and ListGroups name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsumerGroupState {
    Empty,
    /// The group epoch is ahead of the target assignment's.
    Assigning,
    /// Some member is not yet at its target.
    Reconciling,
    Stable,
}

impl ConsumerGroupState {
    pub fn name(self) -> &'static str {
        match self {
            ConsumerGroupState::Empty => "Empty",
            ConsumerGroupState::Assigning => "Assigning",
            ConsumerGroupState::Reconciling => "Reconciling",
            ConsumerGroupState::Stable => "Stable",
        }
    }
}

/// One consumer-protocol group.
#[derive(Debug, Clone)]
pub struct ConsumerGroup {
    pub id: String,
    /// Bumped whenever what the target assignment depends on changes.
    pub epoch: i32,
    /// The group epoch the target assignment was computed for.
    pub assignment_epoch: i32,
    pub members: BTreeMap<String, Member>,
    /// Each member's target assignment.
    pub target: BTreeMap<String, Assignment>,
    /// Which member holds each held partition (assigned or pending revocation).
    holders: HashMap<(TopicId, i32), String>,
    /// The subscribed topics' ids and partition counts when the group epoch was last bumped for them.
    subscribed_topics: BTreeMap<String, (TopicId, i32)>,
    /// The topics view's version `subscribed_topics` was resolved at.
    topics_version: Option<u64>,
    /// Read back from records, its subscribed topics not resolved yet.
    restored: bool,
}

impl ConsumerGroup {
    pub fn new(id: &str) -> ConsumerGroup {
        ConsumerGroup {
            id: id.to_string(),
            epoch: 0,
            assignment_epoch: 0,
            members: BTreeMap::new(),
            target: BTreeMap::new(),
            holders: HashMap::new(),
            subscribed_topics: BTreeMap::new(),
            topics_version: None,
            restored: false,
        }
    }

    pub fn state(&self) -> ConsumerGroupState {
        if self.members.is_empty() {
            ConsumerGroupState::Empty
        } else if self.epoch > self.assignment_epoch {
            ConsumerGroupState::Assigning
        } else if self
            .members
            .values()
            .any(|m| m.current.epoch != self.assignment_epoch || m.current.state != MemberState::Stable)
        {
            ConsumerGroupState::Reconciling
        } else {
            ConsumerGroupState::Stable
        }
    }

    /// The assignor the group uses: the one most members ask for, else the broker's default.
    pub fn assignor(&self, settings: &ConsumerGroupSettings) -> Assignor {
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(name) = &m.metadata.server_assignor {
                *votes.entry(name).or_default() += 1;
            }
        }
        let chosen = votes.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))).map(|(name, _)| *name);
        chosen.and_then(Assignor::from_name).unwrap_or(settings.assignors[0])
    }

    /// The check of an OffsetCommit (KIP-848): a commit from outside the group (negative epoch) only
    /// while it has no members; else from a member, at its current epoch (STALE_MEMBER_EPOCH otherwise,
    /// which tells the client to heartbeat first).
    pub fn check_commit(&self, member_id: &str, epoch: i32) -> Result<(), ResponseError> {
        if epoch < 0 && self.members.is_empty() {
            return Ok(());
        }
        self.check_member_epoch(member_id, epoch)
    }

    /// The check of an OffsetFetch v9+: a fetch that names no member and no epoch comes from outside
    /// the group (an admin client, a consumer that assigns itself) and is always answered; else the
    /// member must exist and be at its current epoch, so a fenced member does not read offsets that
    /// may already be its successor's.
    pub fn check_fetch(&self, member_id: Option<&str>, epoch: i32) -> Result<(), ResponseError> {
        match member_id {
            None if epoch < 0 => Ok(()),
            member_id => self.check_member_epoch(member_id.unwrap_or_default(), epoch),
        }
    }

    fn check_member_epoch(&self, member_id: &str, epoch: i32) -> Result<(), ResponseError> {
        let member = self.members.get(member_id).ok_or(ResponseError::UnknownMemberId)?;
        if epoch != member.current.epoch {
            return Err(ResponseError::StaleMemberEpoch);
        }
        Ok(())
    }

    /// The changes that delete the group, once it has no members.
    pub fn deletion(&self) -> Vec<Change> {
        debug_assert!(self.members.is_empty());
        vec![Change::AssignmentEpoch(None), Change::GroupEpoch(None)]
    }

    /// Whether a member subscribes to `topic`, by name or by its regular expression: such a topic's
    /// committed offsets are the group's to keep (never expired, not deleted by OffsetDelete).
    pub fn is_subscribed_to(&self, topic: &str) -> bool {
        self.members.values().any(|m| {
            m.metadata.subscribed_topic_names.contains(topic) || m.regex.as_ref().is_some_and(|r| r.is_match(topic))
        })
    }

    /// Which member holds a partition (assigned, or pending revocation).
    pub fn holder(&self, topic: TopicId, partition: i32) -> Option<&str> {
        self.holders.get(&(topic, partition)).map(String::as_str)
    }

    /// A ConsumerGroupHeartbeat.
    pub fn heartbeat(
        &mut self,
        hb: Heartbeat,
        topics: &dyn TopicsView,
        settings: &ConsumerGroupSettings,
        now_ms: u64,
    ) -> Result<(HeartbeatAnswer, Vec<Change>), Refusal> {
        validate(&hb, settings)?;
        let mut changes = Vec::new();
        if hb.member_epoch == LEAVE_EPOCH || hb.member_epoch == STATIC_LEAVE_EPOCH {
            return self.leave(&hb, &mut changes).map(|answer| (answer, changes));
        }
        let joined_now = self.member_for(&hb, settings, now_ms, &mut changes)?;
        let member_id = hb.member_id.clone();
        let member = self.members.get_mut(&member_id).expect("the member was found or made");
        if hb.member_epoch == JOIN_EPOCH && member.left_for_now() {
            // A static member back after leaving for now starts from epoch 0 with what it held.
            member.current.epoch = JOIN_EPOCH;
        }
        let before = member.current.clone();
        member.last_seen_ms = now_ms;
        let full = hb.rebalance_timeout_ms >= 0
            && (hb.subscribed_topic_names.is_some() || hb.subscribed_topic_regex.is_some())
            && hb.owned.is_some();

        let mut metadata = member.metadata.clone();
        metadata.client_id = hb.client_id;
        metadata.client_host = hb.client_host;
        if hb.rack_id.is_some() {
            metadata.rack_id = hb.rack_id;
        }
        if hb.rebalance_timeout_ms >= 0 {
            metadata.rebalance_timeout_ms = hb.rebalance_timeout_ms;
        }
        if let Some(names) = hb.subscribed_topic_names {
            metadata.subscribed_topic_names = names.into_iter().filter(|n| !n.is_empty()).collect();
        }
        if let Some(regex) = hb.subscribed_topic_regex {
            metadata.subscribed_topic_regex = if regex.is_empty() { None } else { Some(regex) };
        }
        if let Some(assignor) = hb.server_assignor {
            metadata.server_assignor = Some(assignor);
        }
        let subscription_changed = metadata.subscribed_topic_names != member.metadata.subscribed_topic_names
            || metadata.subscribed_topic_regex != member.metadata.subscribed_topic_regex
            || metadata.server_assignor != member.metadata.server_assignor;
        if metadata.subscribed_topic_regex != member.metadata.subscribed_topic_regex {
            member.regex = metadata.subscribed_topic_regex.as_deref().map(|r| compile(r).expect("validated"));
        }
        if joined_now || metadata != member.metadata {
            member.metadata = metadata.clone();
            changes.push(Change::Member(member_id.clone(), Some(metadata)));
        }
        if subscription_changed || joined_now {
            self.bump_epoch(&mut changes);
        }
        self.refresh_subscribed_topics(topics, subscription_changed || joined_now, &mut changes);
        if self.epoch > self.assignment_epoch {
            self.compute_target(settings, &mut changes);
        }

        let member = &self.members[&member_id];
        let target = self.target.get(&member_id).cloned().unwrap_or_default();
        let next = member.current.reconcile(self.assignment_epoch, &target, hb.owned.as_ref(), |t, p| {
            self.holders.get(&(t, p)).is_some_and(|holder| *holder != member_id)
        });
        let revoke_by = match (before.state, next.state) {
            (MemberState::UnrevokedPartitions, MemberState::UnrevokedPartitions) => member.revoke_by_ms,
            (_, MemberState::UnrevokedPartitions) => Some(now_ms + member.metadata.rebalance_timeout_ms.max(0) as u64),
            _ => None,
        };
        if next != before {
            self.set_current(&member_id, next.clone());
        }
        // Records in Kafka's order: a new member's metadata, the group epoch, the target, then its
        // current assignment (written even when it is still the joining one).
        if next != before || joined_now {
            changes.push(Change::Current(member_id.clone(), Some(next.clone())));
        }
        self.members.get_mut(&member_id).expect("a member").revoke_by_ms = revoke_by;

        let tell = hb.member_epoch == JOIN_EPOCH
            || full
            || next.assigned != before.assigned
            || hb.owned.as_ref().is_some_and(|owned| !same_partitions(owned, &next.assigned));
        let answer = HeartbeatAnswer {
            member_id,
            member_epoch: next.epoch,
            heartbeat_interval_ms: settings.heartbeat_interval_ms,
            assignment: tell.then(|| next.assigned.clone()),
        };
        Ok((answer, changes))
    }

    /// The member a heartbeat comes from, after the checks of its identity and epoch; a heartbeat of
    /// epoch 0 adds it (or a static member's new process takes over its instance id). Whether it was
    /// added now.
    fn member_for(
        &mut self,
        hb: &Heartbeat,
        settings: &ConsumerGroupSettings,
        now_ms: u64,
        changes: &mut Vec<Change>,
    ) -> Result<bool, Refusal> {
        if let Some(member) = self.members.get(&hb.member_id) {
            self.check_instance(hb)?;
            if hb.member_epoch != JOIN_EPOCH {
                check_epoch(member, hb)?;
            }
            return Ok(false);
        }
        if hb.member_epoch != JOIN_EPOCH {
            return Err(refuse(
                ResponseError::UnknownMemberId,
                format!("member {} is not in group {}", hb.member_id, self.id),
            ));
        }
        let by_instance = hb.instance_id.as_ref().and_then(|instance| {
            self.members
                .values()
                .find(|m| m.metadata.instance_id.as_ref() == Some(instance))
                .map(|m| m.member_id.clone())
        });
        if let Some(old_id) = by_instance {
            if !self.members[&old_id].left_for_now() {
                return Err(refuse(
                    ResponseError::UnreleasedInstanceId,
                    format!("instance id {} is used by member {old_id}", hb.instance_id.as_deref().unwrap_or("")),
                ));
            }
            // A static member's new process takes over the one that left for now: its assignment and
            // target go with the instance id, and the group epoch stays. It starts from epoch 0 and
            // reconciles to the target's at once.
            let current =
                Current { epoch: JOIN_EPOCH, previous_epoch: JOIN_EPOCH, ..self.members[&old_id].current.clone() };
            self.set_current(&old_id, Current::joined());
            let mut member = self.members.remove(&old_id).expect("found above");
            let target = self.target.remove(&old_id);
            member.member_id = hb.member_id.clone();
            member.revoke_by_ms = None;
            member.last_seen_ms = now_ms;
            self.members.insert(hb.member_id.clone(), member);
            self.set_current(&hb.member_id, current.clone());
            changes.push(Change::Current(old_id.clone(), None));
            changes.push(Change::Target(old_id.clone(), None));
            changes.push(Change::Member(old_id, None));
            if let Some(target) = target {
                changes.push(Change::Target(hb.member_id.clone(), Some(target.clone())));
                self.target.insert(hb.member_id.clone(), target);
            }
            changes.push(Change::Current(hb.member_id.clone(), Some(current)));
            let metadata = self.members[&hb.member_id].metadata.clone();
            changes.push(Change::Member(hb.member_id.clone(), Some(metadata)));
            return Ok(false);
        }
        if self.members.len() >= settings.max_size {
            return Err(refuse(
                ResponseError::GroupMaxSizeReached,
                format!("group {} has {} members, group.consumer.max.size", self.id, self.members.len()),
            ));
        }
        let mut member = Member::new(hb.member_id.clone(), now_ms);
        member.metadata.instance_id = hb.instance_id.clone();
        member.metadata.rebalance_timeout_ms = hb.rebalance_timeout_ms;
        // Its records (metadata, the group epoch, its current assignment) follow in the heartbeat.
        self.members.insert(hb.member_id.clone(), member);
        Ok(true)
    }

    /// A heartbeat that names an instance id must come from the member that instance id is bound to:
    /// FENCED_INSTANCE_ID if it is bound to another, UNKNOWN_MEMBER_ID if to none. (Heartbeats that
    /// leave it out are known by their member id alone.)
    fn check_instance(&self, hb: &Heartbeat) -> Result<(), Refusal> {
        let Some(instance) = &hb.instance_id else { return Ok(()) };
        match self.members.values().find(|m| m.metadata.instance_id.as_ref() == Some(instance)) {
            Some(bound) if bound.member_id == hb.member_id => Ok(()),
            Some(bound) => Err(refuse(
                ResponseError::FencedInstanceId,
                format!("instance id {instance} is bound to member {}", bound.member_id),
            )),
            None => Err(refuse(ResponseError::UnknownMemberId, format!("instance id {instance} is not in the group"))),
        }
    }

    /// A heartbeat of epoch -1 (leave) or -2 (a static member leaving for now).
    fn leave(&mut self, hb: &Heartbeat, changes: &mut Vec<Change>) -> Result<HeartbeatAnswer, Refusal> {
        if !self.members.contains_key(&hb.member_id) {
            return Err(refuse(
                ResponseError::UnknownMemberId,
                format!("member {} is not in group {}", hb.member_id, self.id),
            ));
        }
        self.check_instance(hb)?;
        if hb.member_epoch == STATIC_LEAVE_EPOCH {
            // It keeps what it is assigned, for its instance id's next process; what it was giving up is
            // given up.
            let current = &self.members[&hb.member_id].current;
            let left = Current {
                epoch: STATIC_LEAVE_EPOCH,
                previous_epoch: current.epoch,
                pending_revocation: Assignment::new(),
                ..current.clone()
            };
            self.set_current(&hb.member_id, left.clone());
            self.members.get_mut(&hb.member_id).expect("checked above").revoke_by_ms = None;
            changes.push(Change::Current(hb.member_id.clone(), Some(left)));
        } else {
            self.remove_member(&hb.member_id, changes);
        }
        Ok(HeartbeatAnswer {
            member_id: hb.member_id.clone(),
            member_epoch: hb.member_epoch,
            heartbeat_interval_ms: 0,
            assignment: None,
        })
    }

    /// Removes members whose session has ended or who did not give up partitions in time; a group whose
    /// last member goes stays, empty, with its offsets.
    pub fn tick(&mut self, settings: &ConsumerGroupSettings, now_ms: u64) -> Vec<Change> {
        let session = settings.session_timeout_ms.max(0) as u64;
        let expired: Vec<String> = self
            .members
            .values()
            .filter(|m| now_ms > m.last_seen_ms + session || m.revoke_by_ms.is_some_and(|by| now_ms > by))
            .map(|m| m.member_id.clone())
            .collect();
        let mut changes = Vec::new();
        for id in expired {
            self.remove_member(&id, &mut changes);
        }
        changes
    }

    fn remove_member(&mut self, id: &str, changes: &mut Vec<Change>) {
        self.set_current(id, Current::joined());
        self.members.remove(id);
        self.target.remove(id);
        changes.push(Change::Current(id.to_string(), None));
        changes.push(Change::Target(id.to_string(), None));
        changes.push(Change::Member(id.to_string(), None));
        self.bump_epoch(changes);
    }

    fn bump_epoch(&mut self, changes: &mut Vec<Change>) {
        self.epoch += 1;
        changes.push(Change::GroupEpoch(Some(self.epoch)));
    }

    /// Sets a member's current assignment, keeping the holders of partitions in step.
    fn set_current(&mut self, id: &str, current: Current) {
        let Some(member) = self.members.get_mut(id) else { return };
        for tp in member.current.held() {
            if self.holders.get(&tp).is_some_and(|h| h == id) {
                self.holders.remove(&tp);
            }
        }
        for tp in current.held() {
            let previous = self.holders.insert(tp, id.to_string());
            debug_assert!(previous.as_deref().is_none_or(|p| p == id), "{tp:?} held by {previous:?} and {id}");
        }
        member.current = current;
    }

    /// The topics the members subscribe to, resolved against `topics`: by name, and by each member's
    /// regular expression (anchored at both ends).
    fn resolve(&self, topics: &dyn TopicsView) -> BTreeMap<String, (TopicId, i32)> {
        let mut names: BTreeSet<String> = BTreeSet::new();
        for m in self.members.values() {
            names.extend(m.metadata.subscribed_topic_names.iter().cloned());
        }
        if self.members.values().any(|m| m.regex.is_some()) {
            for name in topics.names() {
                if self.members.values().any(|m| m.regex.as_ref().is_some_and(|r| r.is_match(&name))) {
                    names.insert(name);
                }
            }
        }
        names.into_iter().filter_map(|n| topics.lookup(&n).map(|found| (n, found))).collect()
    }

    /// Bumps the group epoch if the subscribed topics (or their partition counts) changed since it was
    /// last bumped for them; looks only when the subscriptions or the topics changed.
    fn refresh_subscribed_topics(
        &mut self,
        topics: &dyn TopicsView,
        subscriptions_changed: bool,
        changes: &mut Vec<Change>,
    ) {
        if !subscriptions_changed && self.topics_version == Some(topics.version()) {
            return;
        }
        self.topics_version = Some(topics.version());
        let resolved = self.resolve(topics);
        let restored = std::mem::take(&mut self.restored);
        if resolved == self.subscribed_topics {
            return;
        }
        // A group read back from its records has its target but not the topics it was computed for: it
        // needs a new one only if the target does not cover every partition of those topics.
        let covered = restored && {
            let mut targeted: BTreeSet<(TopicId, i32)> = BTreeSet::new();
            for assignment in self.target.values() {
                targeted.extend(reconcile::partitions(assignment));
            }
            let resolved_partitions: BTreeSet<(TopicId, i32)> =
                resolved.values().flat_map(|(id, n)| (0..*n).map(move |p| (*id, p))).collect();
            targeted == resolved_partitions
        };
        self.subscribed_topics = resolved;
        if !covered && !changes.iter().any(|c| matches!(c, Change::GroupEpoch(_))) {
            self.bump_epoch(changes);
        }
    }

    /// The topics a member subscribes to, by id, among those resolved for the group.
    fn member_topics(&self, member: &Member) -> BTreeSet<TopicId> {
        self.subscribed_topics
            .iter()
            .filter(|(name, _)| {
                member.metadata.subscribed_topic_names.contains(*name)
                    || member.regex.as_ref().is_some_and(|r| r.is_match(name))
            })
            .map(|(_, (id, _))| *id)
            .collect()
    }

    fn compute_target(&mut self, settings: &ConsumerGroupSettings, changes: &mut Vec<Change>) {
        let specs: BTreeMap<String, AssignmentSpec> = self
            .members
            .values()
            .map(|m| {
                let spec = AssignmentSpec {
                    subscribed: self.member_topics(m),
                    previous: self.target.get(&m.member_id).cloned().unwrap_or_default(),
                };
                (m.member_id.clone(), spec)
            })
            .collect();
        let partitions: BTreeMap<TopicId, i32> = self.subscribed_topics.values().copied().collect();
        let target = self.assignor(settings).assign(&specs, &partitions);
        for (id, assignment) in &target {
            if self.target.get(id) != Some(assignment) {
                changes.push(Change::Target(id.clone(), Some(assignment.clone())));
            }
        }
        self.target = target;
        self.assignment_epoch = self.epoch;
        changes.push(Change::AssignmentEpoch(Some(self.assignment_epoch)));
    }

    /// Applies a change read back from `__consumer_offsets`; members get a full session from `now_ms`.
    pub fn replay(&mut self, change: Change, now_ms: u64) {
        match change {
            Change::GroupEpoch(Some(epoch)) => self.epoch = epoch,
            Change::GroupEpoch(None) => *self = ConsumerGroup::new(&self.id),
            Change::AssignmentEpoch(epoch) => self.assignment_epoch = epoch.unwrap_or(0),
            Change::Member(id, Some(metadata)) => {
                let regex = metadata.subscribed_topic_regex.as_deref().and_then(|r| compile(r).ok());
                let member = self.members.entry(id.clone()).or_insert_with(|| Member::new(id, now_ms));
                member.metadata = metadata;
                member.regex = regex;
            }
            Change::Member(id, None) => {
                self.set_current(&id, Current::joined());
                self.members.remove(&id);
            }
            Change::Target(id, Some(assignment)) => {
                self.target.insert(id, assignment);
            }
            Change::Target(id, None) => {
                self.target.remove(&id);
            }
            Change::Current(id, current) => {
                if current.is_some() && !self.members.contains_key(&id) {
                    // A new member's current assignment may come before its metadata.
                    self.members.insert(id.clone(), Member::new(id.clone(), now_ms));
                }
                if self.members.contains_key(&id) {
                    let current = current.unwrap_or_else(Current::joined);
                    let member = self.members.get_mut(&id).expect("checked above");
                    // One revoking gets its whole rebalance timeout again from the load.
                    member.revoke_by_ms = (current.state == MemberState::UnrevokedPartitions)
                        .then(|| now_ms + member.metadata.rebalance_timeout_ms.max(0) as u64);
                    self.set_current(&id, current);
                }
            }
        }
        self.restored = true;
        self.topics_version = None;
    }

    /// The records that rebuild the group as it is now (for a compacted log or a moved coordinator).
    pub fn snapshot(&self) -> Vec<Change> {
        let mut out = vec![Change::GroupEpoch(Some(self.epoch))];
        for m in self.members.values() {
            out.push(Change::Member(m.member_id.clone(), Some(m.metadata.clone())));
        }
        for (id, assignment) in &self.target {
            out.push(Change::Target(id.clone(), Some(assignment.clone())));
        }
        out.push(Change::AssignmentEpoch(Some(self.assignment_epoch)));
        for m in self.members.values() {
            out.push(Change::Current(m.member_id.clone(), Some(m.current.clone())));
        }
        out
    }
}

/// Whether two assignments name the same partitions (ignoring topics listed with none).
fn same_partitions(a: &Assignment, b: &Assignment) -> bool {
    reconcile::is_subset(a, b) && reconcile::is_subset(b, a)
}

/// The epoch check of a member's heartbeat: its own epoch, or the one before it if the member only
/// missed the answer that moved it on (it owns nothing it was not given).
fn check_epoch(member: &Member, hb: &Heartbeat) -> Result<(), Refusal> {
    let current = &member.current;
    if hb.member_epoch == current.epoch {
        return Ok(());
    }
    let missed_answer = hb.member_epoch == current.previous_epoch
        && hb.member_epoch < current.epoch
        && hb.owned.as_ref().is_some_and(|owned| reconcile::is_subset(owned, &current.assigned));
    if missed_answer {
        return Ok(());
    }
    Err(refuse(
        ResponseError::FencedMemberEpoch,
        format!("member epoch {} is not the member's epoch {}", hb.member_epoch, current.epoch),
    ))
}
