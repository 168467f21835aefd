//! JoinGroup: a member joining for the first time (given its id first, from v4), again, or as a
//! static member's new process taking the old one's place; and the checks a join must pass.

use bytes::Bytes;
use kafka_protocol::ResponseError;

use super::{
    Effects, Group, GroupState, JoinAnswer, JoinArgs, MEMBER_ID_PREFIX_BYTES, Member, MemberRef, Reply, SyncAnswer,
    Ticket,
};

impl Group {
    /// Whether a joining member's protocols fit the group: the same protocol type while the group has
    /// members (the one it replaces counts: Kafka's rule), and at least one protocol every other member
    /// supports.
    fn accepts_protocols(&self, args: &JoinArgs, replacing: Option<&str>) -> bool {
        if args.protocol_type.is_empty() || args.protocols.is_empty() {
            return false;
        }
        if !self.members.is_empty() && self.protocol_type.as_ref().is_some_and(|t| *t != args.protocol_type) {
            return false;
        }
        let others: Vec<&Member> = self.members.values().filter(|m| Some(m.member_id.as_str()) != replacing).collect();
        if others.is_empty() {
            return true;
        }
        args.protocols.iter().any(|(name, _)| others.iter().all(|m| m.protocols.iter().any(|(n, _)| n == name)))
    }

    /// JoinGroup. The answer comes at once (an error, or MEMBER_ID_REQUIRED) or through `ticket` when
    /// the rebalance completes.
    pub fn join(&mut self, args: JoinArgs, ticket: Ticket, now_ms: u64) -> Effects {
        let refuse = |error, member_id: &str| Effects {
            replies: vec![Reply::Join(ticket, JoinAnswer::refused(error, member_id))],
            persist: false,
        };
        if args.session_timeout_ms < self.settings.min_session_timeout_ms
            || args.session_timeout_ms > self.settings.max_session_timeout_ms
        {
            return refuse(ResponseError::InvalidSessionTimeout, &args.member_id);
        }
        if self.state == GroupState::Dead {
            return refuse(ResponseError::CoordinatorNotAvailable, &args.member_id);
        }
        if args.member_id.is_empty() {
            self.join_new(args, ticket, now_ms)
        } else {
            self.join_known(args, ticket, now_ms)
        }
    }

    fn join_new(&mut self, args: JoinArgs, ticket: Ticket, now_ms: u64) -> Effects {
        let refuse =
            |error| Effects { replies: vec![Reply::Join(ticket, JoinAnswer::refused(error, ""))], persist: false };
        let prefix = args.instance_id.as_deref().unwrap_or(&args.client_id);
        // Kafka's member ids start with the client id; a long one is cut (at a character boundary).
        let cut =
            (0..=prefix.len().min(MEMBER_ID_PREFIX_BYTES)).rev().find(|i| prefix.is_char_boundary(*i)).unwrap_or(0);
        let new_id = format!("{}-{}", &prefix[..cut], uuid::Uuid::new_v4());
        if let Some(instance) = args.instance_id.clone()
            && let Some(old) = self.member_of_instance(&instance).map(|m| m.member_id.clone())
        {
            if !self.accepts_protocols(&args, Some(&old)) {
                return refuse(ResponseError::InconsistentGroupProtocol);
            }
            return self.replace_static_member(&old, new_id, args, ticket, now_ms);
        }
        if !self.accepts_protocols(&args, None) {
            return refuse(ResponseError::InconsistentGroupProtocol);
        }
        if self.members.len() + self.pending.len() >= self.settings.max_size {
            return refuse(ResponseError::GroupMaxSizeReached);
        }
        if args.instance_id.is_none() && args.require_known_member_id {
            // The member joins again with this id; until then it counts as pending, and a rebalance
            // waits for it.
            self.pending.insert(new_id.clone(), now_ms + args.session_timeout_ms.max(0) as u64);
            return Effects {
                replies: vec![Reply::Join(ticket, JoinAnswer::refused(ResponseError::MemberIdRequired, &new_id))],
                persist: false,
            };
        }
        self.add_member(new_id, args, ticket, now_ms)
    }

    fn join_known(&mut self, args: JoinArgs, ticket: Ticket, now_ms: u64) -> Effects {
        let refuse = |error, member_id: &str| Effects {
            replies: vec![Reply::Join(ticket, JoinAnswer::refused(error, member_id))],
            persist: false,
        };
        if self.pending.remove(&args.member_id).is_some() {
            if !self.accepts_protocols(&args, None) {
                return refuse(ResponseError::InconsistentGroupProtocol, &args.member_id);
            }
            let id = args.member_id.clone();
            return self.add_member(id, args, ticket, now_ms);
        }
        let who = MemberRef { member_id: args.member_id.clone(), instance_id: args.instance_id.clone() };
        if let Err(error) = self.check_member(&who) {
            return refuse(error, &args.member_id);
        }
        if !self.accepts_protocols(&args, Some(&args.member_id)) {
            return refuse(ResponseError::InconsistentGroupProtocol, &args.member_id);
        }
        let id = args.member_id.clone();
        let member = self.members.get_mut(&id).expect("checked");
        member.last_seen_ms = now_ms;
        let unchanged = member.protocols == args.protocols;
        match self.state {
            GroupState::PreparingRebalance => {
                let mut effects = self.update_member(&id, args, ticket);
                effects.merge(self.try_complete_join(now_ms));
                effects
            }
            GroupState::CompletingRebalance | GroupState::Stable if unchanged && self.leader.as_ref() != Some(&id) => {
                // A join answer it lost: the current generation again.
                let answer = self.join_answer(&id, false);
                Effects { replies: vec![Reply::Join(ticket, answer)], persist: false }
            }
            GroupState::CompletingRebalance if unchanged => {
                let answer = self.join_answer(&id, false);
                Effects { replies: vec![Reply::Join(ticket, answer)], persist: false }
            }
            _ => {
                // The leader rejoining (its subscription may have changed) or new protocols: rebalance.
                let mut effects = self.update_member(&id, args, ticket);
                effects.merge(self.prepare_rebalance(now_ms));
                effects.merge(self.try_complete_join(now_ms));
                effects
            }
        }
    }

    /// A static member's new process joined (a restart): it takes over the old member id's place.
    fn replace_static_member(
        &mut self,
        old: &str,
        new_id: String,
        args: JoinArgs,
        ticket: Ticket,
        now_ms: u64,
    ) -> Effects {
        let mut member = self.members.remove(old).expect("bound to a member");
        let mut effects = Effects::none();
        // The old process's waiting requests are answered: it is fenced.
        if let Some(t) = member.joining.take() {
            effects.replies.push(Reply::Join(t, JoinAnswer::refused(ResponseError::FencedInstanceId, old)));
        }
        if let Some(t) = member.syncing.take() {
            effects.replies.push(Reply::Sync(t, SyncAnswer::refused(ResponseError::FencedInstanceId)));
        }
        member.member_id = new_id.clone();
        member.last_seen_ms = now_ms;
        self.members.insert(new_id.clone(), member);
        let previous_leader = self.leader.clone();
        if self.leader.as_deref() == Some(old) {
            self.leader = Some(new_id.clone());
        }
        let supports_skip = args.supports_skip_assignment;
        effects.merge(self.update_member(&new_id, args, ticket));
        // The new process's subscription bytes differ from the old one's (owned partitions, generation),
        // but what counts is whether the group would choose another protocol.
        let same_protocol = self.select_protocol() == self.protocol;
        match self.state {
            GroupState::Stable if same_protocol => {
                // Nothing about the group changes: no rebalance. The new id is recorded first.
                let member = self.members.get_mut(&new_id).expect("just inserted");
                let ticket = member.joining.take().expect("just set");
                let is_leader = self.leader.as_deref() == Some(new_id.as_str());
                let mut answer = self.join_answer(&new_id, true);
                if !supports_skip {
                    // Before JoinGroup v9 there is no "skip assignment": the answer names the leader as it
                    // was, so a restarted leader does not take itself for the leader and reassign a
                    // stable group (Kafka does the same).
                    answer.leader = previous_leader.unwrap_or_default();
                    answer.members.clear();
                    answer.skip_assignment = false;
                } else if !is_leader {
                    answer.skip_assignment = false;
                }
                effects.replies.push(Reply::Join(ticket, answer));
                effects.persist = true;
                effects
            }
            GroupState::PreparingRebalance => {
                effects.merge(self.try_complete_join(now_ms));
                effects
            }
            _ => {
                effects.merge(self.prepare_rebalance(now_ms));
                effects.merge(self.try_complete_join(now_ms));
                effects
            }
        }
    }

    fn add_member(&mut self, member_id: String, args: JoinArgs, ticket: Ticket, now_ms: u64) -> Effects {
        if self.members.len() >= self.settings.max_size {
            return Effects {
                replies: vec![Reply::Join(ticket, JoinAnswer::refused(ResponseError::GroupMaxSizeReached, &member_id))],
                persist: false,
            };
        }
        let member = Member {
            member_id: member_id.clone(),
            instance_id: args.instance_id.clone(),
            client_id: args.client_id.clone(),
            client_host: args.client_host.clone(),
            session_timeout_ms: args.session_timeout_ms,
            rebalance_timeout_ms: args.rebalance_timeout_ms,
            protocols: args.protocols.clone(),
            assignment: Bytes::new(),
            last_seen_ms: now_ms,
            joining: Some(ticket),
            syncing: None,
        };
        // The first member decides the type; an empty group keeps its last one until then.
        if self.members.is_empty() {
            self.protocol_type = Some(args.protocol_type);
        }
        self.members.insert(member_id, member);
        let mut effects = Effects::none();
        match self.state {
            GroupState::PreparingRebalance => {
                if let Some(until) = self.initial_delay_until_ms {
                    // More members arrive during the initial delay: wait a little longer, within the
                    // rebalance timeout.
                    let limit = self.rebalance_started_ms + self.max_rebalance_timeout_ms();
                    let extended = (now_ms + self.settings.initial_rebalance_delay_ms.max(0) as u64).min(limit);
                    self.initial_delay_until_ms = Some(until.max(extended));
                }
            }
            _ => effects.merge(self.prepare_rebalance(now_ms)),
        }
        effects.merge(self.try_complete_join(now_ms));
        effects
    }

    /// A member's join with new settings; a JoinGroup of it still waiting (the client gave up on it
    /// and sent another) is answered REBALANCE_IN_PROGRESS, so no answer is left waiting forever.
    fn update_member(&mut self, member_id: &str, args: JoinArgs, ticket: Ticket) -> Effects {
        let member = self.members.get_mut(member_id).expect("a member");
        member.client_id = args.client_id;
        member.client_host = args.client_host;
        member.session_timeout_ms = args.session_timeout_ms;
        member.rebalance_timeout_ms = args.rebalance_timeout_ms;
        member.protocols = args.protocols;
        let mut effects = Effects::none();
        if let Some(old) = member.joining.replace(ticket) {
            let refused = JoinAnswer::refused(ResponseError::RebalanceInProgress, member_id);
            effects.replies.push(Reply::Join(old, refused));
        }
        effects
    }
}
