//! One consumer group under Kafka's classic protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup), as a
//! state machine that does no I/O: every method takes the time and returns what to answer. The
//! coordinator ([`super::coordinator`]) owns the groups of the offsets partitions this shard leads, keeps
//! the reply channels behind [`Ticket`]s, writes what [`Effects::persist`] asks to `__consumer_offsets`,
//! and calls [`Group::tick`] on a timer.
//!
//! States (Kafka's names): `Empty` (no members), `PreparingRebalance` (members are (re)joining; JoinGroup
//! answers wait), `CompletingRebalance` (the generation is formed; SyncGroup answers wait for the leader's
//! assignment and its record), `Stable`, and `Dead` (deleted). Member metadata and assignments are opaque
//! bytes: the assignor runs in the group leader's client. JoinGroup's paths are in `join.rs`; the inputs and
//! outputs in `messages.rs`.

use std::collections::BTreeMap;

use bytes::Bytes;
use kafka_protocol::ResponseError;

mod join;
mod messages;

pub use messages::*;

/// How much of a client id starts the member ids given to its members.
const MEMBER_ID_PREFIX_BYTES: usize = 200;

/// A member of the group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout_ms: i32,
    pub rebalance_timeout_ms: i32,
    pub protocols: Vec<(String, Bytes)>,
    /// The assignment the leader gave it in this generation.
    pub assignment: Bytes,
    /// When it last showed it is alive (join, sync, heartbeat, commit).
    last_seen_ms: u64,
    /// Its JoinGroup waiting for the rebalance to complete.
    joining: Option<Ticket>,
    /// Its SyncGroup waiting for the leader's assignment.
    syncing: Option<Ticket>,
}

impl Member {
    /// Its metadata for `protocol`.
    pub fn metadata(&self, protocol: &str) -> Bytes {
        self.protocols.iter().find(|(name, _)| name == protocol).map(|(_, m)| m.clone()).unwrap_or_default()
    }

    fn expired(&self, now_ms: u64) -> bool {
        self.joining.is_none()
            && self.syncing.is_none()
            && now_ms > self.last_seen_ms + self.session_timeout_ms.max(0) as u64
    }
}

/// One consumer group's membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub id: String,
    pub state: GroupState,
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    /// By member id.
    pub members: BTreeMap<String, Member>,
    /// Member ids given out with MEMBER_ID_REQUIRED, not joined yet: until when they may join.
    pending: BTreeMap<String, u64>,
    /// When the state last changed (wall time of the adapter's clock).
    pub state_since_ms: u64,
    /// PreparingRebalance: when the rebalance gives up on members that have not rejoined.
    rebalance_deadline_ms: u64,
    /// PreparingRebalance of an empty group: the join completes no earlier than this.
    initial_delay_until_ms: Option<u64>,
    /// When the current rebalance started (the initial delay's extensions stay within its timeout).
    rebalance_started_ms: u64,
    /// CompletingRebalance: when members that have not synced are removed.
    sync_deadline_ms: u64,
    /// CompletingRebalance: the leader's assignment is being written; the group becomes stable once it is.
    assignment_recording: bool,
    settings: GroupSettings,
}

impl Group {
    pub fn new(id: &str, settings: GroupSettings, now_ms: u64) -> Group {
        Group {
            id: id.to_string(),
            state: GroupState::Empty,
            generation: 0,
            protocol_type: None,
            protocol: None,
            leader: None,
            members: BTreeMap::new(),
            pending: BTreeMap::new(),
            state_since_ms: now_ms,
            rebalance_deadline_ms: 0,
            initial_delay_until_ms: None,
            rebalance_started_ms: 0,
            sync_deadline_ms: 0,
            assignment_recording: false,
            settings,
        }
    }

    /// A group as its last membership record left it: members get a full session from `now_ms` to show
    /// they are still there.
    pub fn restored(id: &str, settings: GroupSettings, record: GroupRecord, now_ms: u64) -> Group {
        let mut group = Group::new(id, settings, now_ms);
        group.generation = record.generation;
        group.protocol_type = record.protocol_type;
        group.protocol = record.protocol;
        group.leader = record.leader;
        group.state_since_ms = record.state_since_ms;
        for m in record.members {
            let protocols = vec![(group.protocol.clone().unwrap_or_default(), m.subscription)];
            group.members.insert(
                m.member_id.clone(),
                Member {
                    member_id: m.member_id,
                    instance_id: m.instance_id,
                    client_id: m.client_id,
                    client_host: m.client_host,
                    session_timeout_ms: m.session_timeout_ms,
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    protocols,
                    assignment: m.assignment,
                    last_seen_ms: now_ms,
                    joining: None,
                    syncing: None,
                },
            );
        }
        group.state = if group.members.is_empty() { GroupState::Empty } else { GroupState::Stable };
        group
    }

    /// The membership record `__consumer_offsets` keeps for the group.
    pub fn record(&self) -> GroupRecord {
        let protocol = self.protocol.clone().unwrap_or_default();
        GroupRecord {
            protocol_type: self.protocol_type.clone(),
            generation: self.generation,
            protocol: self.protocol.clone(),
            leader: self.leader.clone(),
            state_since_ms: self.state_since_ms,
            members: self
                .members
                .values()
                .map(|m| RecordedMember {
                    member_id: m.member_id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout_ms,
                    session_timeout_ms: m.session_timeout_ms,
                    subscription: m.metadata(&protocol),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }

    fn set_state(&mut self, state: GroupState, now_ms: u64) {
        self.state = state;
        self.state_since_ms = now_ms;
    }

    /// The member id a static member's instance id is bound to.
    fn member_of_instance(&self, instance_id: &str) -> Option<&Member> {
        self.members.values().find(|m| m.instance_id.as_deref() == Some(instance_id))
    }

    /// Checks that `who` is a member: UNKNOWN_MEMBER_ID, or FENCED_INSTANCE_ID when its instance id is
    /// bound to another member id (a newer process of the same static member took over).
    /// A static member's instance id bound to no member is UNKNOWN_MEMBER_ID too.
    fn check_member(&self, who: &MemberRef) -> Result<(), ResponseError> {
        if let Some(instance) = &who.instance_id {
            return match self.member_of_instance(instance) {
                Some(bound) if bound.member_id == who.member_id => Ok(()),
                Some(_) => Err(ResponseError::FencedInstanceId),
                None => Err(ResponseError::UnknownMemberId),
            };
        }
        if self.members.contains_key(&who.member_id) { Ok(()) } else { Err(ResponseError::UnknownMemberId) }
    }

    /// The protocols every member supports, in the first member's order.
    fn common_protocols(&self) -> Vec<&str> {
        let mut lists = self.members.values().map(|m| &m.protocols[..]);
        let Some(first) = lists.next() else { return Vec::new() };
        let mut common: Vec<&str> = first.iter().map(|(n, _)| n.as_str()).collect();
        for list in lists {
            common.retain(|name| list.iter().any(|(n, _)| n == name));
        }
        common
    }

    fn max_rebalance_timeout_ms(&self) -> u64 {
        self.members.values().map(|m| m.rebalance_timeout_ms.max(0) as u64).max().unwrap_or(0)
    }

    /// Starts a rebalance: every member must join again. SyncGroups waiting are answered
    /// REBALANCE_IN_PROGRESS.
    fn prepare_rebalance(&mut self, now_ms: u64) -> Effects {
        self.assignment_recording = false;
        let mut effects = Effects::none();
        for member in self.members.values_mut() {
            if let Some(t) = member.syncing.take() {
                effects.replies.push(Reply::Sync(t, SyncAnswer::refused(ResponseError::RebalanceInProgress)));
            }
        }
        self.initial_delay_until_ms =
            (self.state == GroupState::Empty).then(|| now_ms + self.settings.initial_rebalance_delay_ms.max(0) as u64);
        self.rebalance_started_ms = now_ms;
        self.rebalance_deadline_ms = now_ms + self.max_rebalance_timeout_ms();
        self.set_state(GroupState::PreparingRebalance, now_ms);
        effects
    }

    /// Completes the join phase once every member has joined again and no member id given out is still
    /// to join (and the initial delay, if any, is over).
    fn try_complete_join(&mut self, now_ms: u64) -> Effects {
        if self.state != GroupState::PreparingRebalance {
            return Effects::none();
        }
        if self.initial_delay_until_ms.is_some_and(|until| now_ms < until) {
            return Effects::none();
        }
        let all_joined = self.members.values().all(|m| m.joining.is_some()) && self.pending.is_empty();
        if !all_joined {
            return Effects::none();
        }
        self.complete_join(now_ms)
    }

    /// The next generation: its protocol, its leader, and the JoinGroup answers.
    fn complete_join(&mut self, now_ms: u64) -> Effects {
        self.initial_delay_until_ms = None;
        self.pending.clear();
        self.generation += 1;
        if self.members.is_empty() {
            // The protocol type stays, as Kafka's does: ListGroups and DescribeGroups keep showing a
            // consumer group without members as one (librdkafka would call it a "simple" group), and
            // its record keeps it across a reload. The next first member sets it again.
            self.protocol = None;
            self.leader = None;
            self.set_state(GroupState::Empty, now_ms);
            return Effects { replies: Vec::new(), persist: true };
        }
        self.protocol = self.select_protocol();
        if !self.leader.as_ref().is_some_and(|l| self.members.contains_key(l)) {
            self.leader = self.members.keys().next().cloned();
        }
        for member in self.members.values_mut() {
            member.assignment = Bytes::new();
            member.last_seen_ms = now_ms;
        }
        self.sync_deadline_ms = now_ms + self.max_rebalance_timeout_ms();
        self.set_state(GroupState::CompletingRebalance, now_ms);
        let mut effects = Effects::none();
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            let leader = self.leader.as_deref() == Some(id.as_str());
            let ticket = self.members.get_mut(&id).and_then(|m| m.joining.take());
            if let Some(ticket) = ticket {
                let mut answer = self.join_answer(&id, false);
                if !leader {
                    answer.members.clear();
                }
                effects.replies.push(Reply::Join(ticket, answer));
            }
        }
        effects
    }

    /// Kafka's choice: each member votes for the first protocol of its list that every member supports;
    /// the most votes win (ties to the earliest in the first member's list).
    fn select_protocol(&self) -> Option<String> {
        let candidates = self.common_protocols();
        let mut votes = vec![0usize; candidates.len()];
        for member in self.members.values() {
            if let Some(i) = member.protocols.iter().find_map(|(n, _)| candidates.iter().position(|c| c == n)) {
                votes[i] += 1;
            }
        }
        // The most votes; among equals, the earliest candidate.
        let best = (0..candidates.len()).max_by_key(|&i| (votes[i], std::cmp::Reverse(i)))?;
        Some(candidates[best].to_string())
    }

    /// The current generation's JoinGroup answer for `member_id`; the member list goes to the leader.
    fn join_answer(&self, member_id: &str, skip_assignment: bool) -> JoinAnswer {
        let protocol = self.protocol.clone().unwrap_or_default();
        let is_leader = self.leader.as_deref() == Some(member_id);
        JoinAnswer {
            error: None,
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            leader: self.leader.clone().unwrap_or_default(),
            member_id: member_id.to_string(),
            members: if is_leader {
                self.members
                    .values()
                    .map(|m| JoinedMember {
                        member_id: m.member_id.clone(),
                        instance_id: m.instance_id.clone(),
                        metadata: m.metadata(&protocol),
                    })
                    .collect()
            } else {
                Vec::new()
            },
            skip_assignment: skip_assignment && is_leader,
        }
    }

    /// SyncGroup. `assignments` is the leader's (empty from the others).
    pub fn sync(
        &mut self,
        who: &MemberRef,
        generation: i32,
        protocol: (Option<&str>, Option<&str>),
        assignments: Vec<(String, Bytes)>,
        ticket: Ticket,
        now_ms: u64,
    ) -> Effects {
        let refuse = |error| Effects { replies: vec![Reply::Sync(ticket, SyncAnswer::refused(error))], persist: false };
        if self.state == GroupState::Dead {
            return refuse(ResponseError::CoordinatorNotAvailable);
        }
        if let Err(error) = self.check_member(who) {
            return refuse(error);
        }
        if generation != self.generation {
            return refuse(ResponseError::IllegalGeneration);
        }
        let (protocol_type, protocol_name) = protocol;
        if protocol_type.is_some_and(|t| Some(t) != self.protocol_type.as_deref())
            || protocol_name.is_some_and(|n| Some(n) != self.protocol.as_deref())
        {
            return refuse(ResponseError::InconsistentGroupProtocol);
        }
        let member = self.members.get_mut(&who.member_id).expect("checked");
        member.last_seen_ms = now_ms;
        match self.state {
            GroupState::Empty => refuse(ResponseError::UnknownMemberId),
            GroupState::PreparingRebalance => refuse(ResponseError::RebalanceInProgress),
            GroupState::Stable => {
                Effects { replies: vec![Reply::Sync(ticket, self.sync_answer(&who.member_id))], persist: false }
            }
            GroupState::CompletingRebalance => {
                let mut effects = Effects::none();
                if let Some(old) = member.syncing.replace(ticket) {
                    // A SyncGroup the client gave up on: answered, not left waiting.
                    effects.replies.push(Reply::Sync(old, SyncAnswer::refused(ResponseError::RebalanceInProgress)));
                }
                if self.leader.as_deref() != Some(who.member_id.as_str()) || self.assignment_recording {
                    return effects;
                }
                for (id, assignment) in assignments {
                    if let Some(m) = self.members.get_mut(&id) {
                        m.assignment = assignment;
                    }
                }
                // The generation becomes stable, and the members get their assignments, only once its
                // record is written (`record_written`).
                self.assignment_recording = true;
                effects.persist = true;
                effects
            }
            GroupState::Dead => unreachable!("refused above"),
        }
    }

    /// The group's record of `generation` is written: a generation whose assignment was being recorded
    /// becomes stable, and every member waiting in SyncGroup gets its assignment.
    pub fn record_written(&mut self, generation: i32, now_ms: u64) -> Effects {
        let recorded = self.assignment_recording && self.state == GroupState::CompletingRebalance;
        if !recorded || generation != self.generation {
            return Effects::none();
        }
        self.assignment_recording = false;
        self.set_state(GroupState::Stable, now_ms);
        let mut effects = Effects::none();
        let ids: Vec<String> = self.members.keys().cloned().collect();
        for id in ids {
            if let Some(t) = self.members.get_mut(&id).and_then(|m| m.syncing.take()) {
                effects.replies.push(Reply::Sync(t, self.sync_answer(&id)));
            }
        }
        effects
    }

    fn sync_answer(&self, member_id: &str) -> SyncAnswer {
        SyncAnswer {
            error: None,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            assignment: self.members.get(member_id).map(|m| m.assignment.clone()).unwrap_or_default(),
        }
    }

    /// Writing the group's record of `generation` failed with `error`: an assignment being recorded is
    /// lost (the members waiting in SyncGroup get the error) and the members join again; so do they
    /// when a stable group's record (a static member's new id) could not be written. A failure reported
    /// for an older generation changes nothing.
    pub fn record_failed(&mut self, generation: i32, error: ResponseError, now_ms: u64) -> Effects {
        if generation != self.generation {
            return Effects::none();
        }
        let recording = self.assignment_recording && self.state == GroupState::CompletingRebalance;
        if !recording && self.state != GroupState::Stable {
            return Effects::none();
        }
        let mut effects = Effects::none();
        for member in self.members.values_mut() {
            member.assignment = Bytes::new();
            if let Some(t) = member.syncing.take() {
                effects.replies.push(Reply::Sync(t, SyncAnswer::refused(error)));
            }
        }
        effects.merge(self.prepare_rebalance(now_ms));
        effects.merge(self.try_complete_join(now_ms));
        effects
    }

    /// Heartbeat: NONE while the generation is current and stable or completing, REBALANCE_IN_PROGRESS
    /// while members must join again.
    pub fn heartbeat(&mut self, who: &MemberRef, generation: i32, now_ms: u64) -> Option<ResponseError> {
        if self.state == GroupState::Dead {
            return Some(ResponseError::CoordinatorNotAvailable);
        }
        if let Err(error) = self.check_member(who) {
            return Some(error);
        }
        if generation != self.generation {
            return Some(ResponseError::IllegalGeneration);
        }
        self.members.get_mut(&who.member_id).expect("checked").last_seen_ms = now_ms;
        match self.state {
            GroupState::PreparingRebalance => Some(ResponseError::RebalanceInProgress),
            GroupState::Empty => Some(ResponseError::UnknownMemberId),
            _ => None,
        }
    }

    /// LeaveGroup for each of `leaving`: its error (UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID) or none.
    /// A static member may leave by its instance id alone (an empty member id).
    pub fn leave(&mut self, leaving: &[MemberRef], now_ms: u64) -> (Vec<Option<ResponseError>>, Effects) {
        let mut errors = Vec::with_capacity(leaving.len());
        let mut removed = Vec::new();
        for who in leaving {
            let id = match (&who.instance_id, who.member_id.is_empty()) {
                (Some(instance), true) => match self.member_of_instance(instance) {
                    Some(m) => Ok(m.member_id.clone()),
                    None => Err(ResponseError::UnknownMemberId),
                },
                _ => self.check_member(who).map(|()| who.member_id.clone()),
            };
            match id {
                Ok(id) => {
                    removed.push(id);
                    errors.push(None);
                }
                Err(e) => {
                    if self.pending.remove(&who.member_id).is_some() {
                        errors.push(None);
                    } else {
                        errors.push(Some(e));
                    }
                }
            }
        }
        let mut effects = Effects::none();
        for id in removed {
            effects.merge(self.remove_member(&id, now_ms));
        }
        (errors, effects)
    }

    fn remove_member(&mut self, member_id: &str, now_ms: u64) -> Effects {
        let Some(mut member) = self.members.remove(member_id) else { return Effects::none() };
        let mut effects = Effects::none();
        if let Some(t) = member.joining.take() {
            effects.replies.push(Reply::Join(t, JoinAnswer::refused(ResponseError::UnknownMemberId, member_id)));
        }
        if let Some(t) = member.syncing.take() {
            effects.replies.push(Reply::Sync(t, SyncAnswer::refused(ResponseError::UnknownMemberId)));
        }
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => effects.merge(self.prepare_rebalance(now_ms)),
            _ => {}
        }
        effects.merge(self.try_complete_join(now_ms));
        effects
    }

    /// The passing of time: members whose session expired leave, a rebalance past its timeout
    /// completes without the members that did not join again, a sync past its timeout drops the
    /// members that did not sync, member ids given out but never used are forgotten.
    pub fn tick(&mut self, now_ms: u64) -> Effects {
        let mut effects = Effects::none();
        self.pending.retain(|_, until| *until > now_ms);
        let expired: Vec<String> =
            self.members.values().filter(|m| m.expired(now_ms)).map(|m| m.member_id.clone()).collect();
        for id in expired {
            effects.merge(self.remove_member(&id, now_ms));
        }
        match self.state {
            GroupState::PreparingRebalance
                if now_ms >= self.rebalance_deadline_ms
                    && self.initial_delay_until_ms.is_none_or(|until| now_ms >= until) =>
            {
                let late: Vec<String> =
                    self.members.values().filter(|m| m.joining.is_none()).map(|m| m.member_id.clone()).collect();
                for id in late {
                    self.members.remove(&id);
                }
                effects.merge(self.complete_join(now_ms));
            }
            GroupState::CompletingRebalance if now_ms >= self.sync_deadline_ms => {
                let late: Vec<String> =
                    self.members.values().filter(|m| m.syncing.is_none()).map(|m| m.member_id.clone()).collect();
                for id in late {
                    effects.merge(self.remove_member(&id, now_ms));
                }
            }
            _ => effects.merge(self.try_complete_join(now_ms)),
        }
        effects
    }

    /// Whether an offset commit from `who` at `generation` is accepted: from a member of the current
    /// generation, or from a client outside the group (generation -1, no member id) while it has no
    /// members. A member's commit shows it is alive.
    pub fn check_commit(&mut self, who: &MemberRef, generation: i32, now_ms: u64) -> Result<(), ResponseError> {
        if self.state == GroupState::Dead {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        if generation < 0 && self.state == GroupState::Empty {
            // A client outside the group (assign() and commit), as Kafka accepts it.
            return Ok(());
        }
        self.check_member(who)?;
        if generation != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        if self.state == GroupState::CompletingRebalance {
            return Err(ResponseError::RebalanceInProgress);
        }
        self.members.get_mut(&who.member_id).expect("checked").last_seen_ms = now_ms;
        Ok(())
    }

    /// The check of a TxnOffsetCommit (Kafka's, for transactions): OffsetCommit's, except that a commit
    /// naming no member, no instance and generation -1 is not checked (TxnOffsetCommit before v3 carries
    /// none), and a group completing a rebalance accepts it.
    pub fn check_txn_commit(&self, who: &MemberRef, generation: i32) -> Result<(), ResponseError> {
        if self.state == GroupState::Dead {
            return Err(ResponseError::CoordinatorNotAvailable);
        }
        if generation < 0 && who.member_id.is_empty() && who.instance_id.is_none() {
            return Ok(());
        }
        if generation < 0 && self.state == GroupState::Empty {
            return Ok(());
        }
        self.check_member(who)?;
        if generation != self.generation {
            return Err(ResponseError::IllegalGeneration);
        }
        Ok(())
    }

    /// Whether the group holds nothing: no members and no member id given out and still to be used.
    pub fn is_idle(&self) -> bool {
        matches!(self.state, GroupState::Empty | GroupState::Dead) && self.pending.is_empty()
    }

    /// DeleteGroups: only a group without members may go.
    pub fn check_delete(&self) -> Result<(), ResponseError> {
        match self.state {
            GroupState::Empty | GroupState::Dead => Ok(()),
            _ => Err(ResponseError::NonEmptyGroup),
        }
    }

    pub fn mark_dead(&mut self, now_ms: u64) -> Effects {
        let mut effects = Effects::none();
        for (id, member) in &mut self.members {
            if let Some(t) = member.joining.take() {
                effects.replies.push(Reply::Join(t, JoinAnswer::refused(ResponseError::CoordinatorNotAvailable, id)));
            }
            if let Some(t) = member.syncing.take() {
                effects.replies.push(Reply::Sync(t, SyncAnswer::refused(ResponseError::CoordinatorNotAvailable)));
            }
        }
        self.members.clear();
        self.set_state(GroupState::Dead, now_ms);
        effects
    }

    /// Every waiting answer, refused with `error` (the coordinator moved away).
    pub fn abandon(&mut self, error: ResponseError) -> Vec<Reply> {
        let mut replies = Vec::new();
        for (id, member) in &mut self.members {
            if let Some(t) = member.joining.take() {
                replies.push(Reply::Join(t, JoinAnswer::refused(error, id)));
            }
            if let Some(t) = member.syncing.take() {
                replies.push(Reply::Sync(t, SyncAnswer::refused(error)));
            }
        }
        replies
    }
}

#[cfg(test)]
mod tests;
