//! The classic group state machine driven by hand, on a clock the test moves.

use super::*;

const SESSION_MS: i32 = 10_000;
const REBALANCE_MS: i32 = 30_000;
const DELAY_MS: u64 = 3_000;

fn settings() -> GroupSettings {
    GroupSettings { initial_rebalance_delay_ms: DELAY_MS as i32, max_size: 5, ..GroupSettings::default() }
}

fn join_args(member_id: &str, protocols: &[&str]) -> JoinArgs {
    JoinArgs {
        member_id: member_id.to_string(),
        instance_id: None,
        client_id: "client".to_string(),
        client_host: "/127.0.0.1".to_string(),
        session_timeout_ms: SESSION_MS,
        rebalance_timeout_ms: REBALANCE_MS,
        protocol_type: "consumer".to_string(),
        protocols: protocols.iter().map(|p| (p.to_string(), Bytes::from(format!("meta-{p}")))).collect(),
        require_known_member_id: false,
        supports_skip_assignment: true,
    }
}

fn who(member_id: &str) -> MemberRef {
    MemberRef { member_id: member_id.to_string(), instance_id: None }
}

/// The join answers in `effects`, by ticket.
fn joins(effects: &Effects) -> BTreeMap<Ticket, JoinAnswer> {
    effects
        .replies
        .iter()
        .filter_map(|r| match r {
            Reply::Join(t, a) => Some((*t, a.clone())),
            Reply::Sync(..) => None,
        })
        .collect()
}

fn syncs(effects: &Effects) -> BTreeMap<Ticket, SyncAnswer> {
    effects
        .replies
        .iter()
        .filter_map(|r| match r {
            Reply::Sync(t, a) => Some((*t, a.clone())),
            Reply::Join(..) => None,
        })
        .collect()
}

/// SyncGroup, and when the leader's assignment is to be recorded, the record written: the answers of
/// both steps.
fn sync(
    group: &mut Group,
    who: &MemberRef,
    generation: i32,
    assignments: Vec<(String, Bytes)>,
    ticket: Ticket,
    now: u64,
) -> Effects {
    let mut effects = group.sync(who, generation, (None, None), assignments, ticket, now);
    if effects.persist {
        assert_eq!(group.state, GroupState::CompletingRebalance, "not stable before the record is written");
        let written = group.record_written(group.generation, now);
        effects.replies.extend(written.replies);
    }
    effects
}

/// A group with one member `a` joined and synced (generation 1); returns a's member id.
fn stable_group_of_one(now: &mut u64) -> (Group, String) {
    let mut group = Group::new("g", settings(), *now);
    let effects = group.join(join_args("", &["range"]), 1, *now);
    assert!(effects.replies.is_empty(), "the first join waits for the initial delay");
    *now += DELAY_MS;
    let answer = joins(&group.tick(*now)).remove(&1).expect("answered once the delay is over");
    let a = answer.member_id.clone();
    let effects = sync(&mut group, &who(&a), 1, vec![(a.clone(), Bytes::from_static(b"A"))], 2, *now);
    assert!(effects.persist);
    (group, a)
}

#[test]
fn first_join_waits_for_the_initial_delay_then_forms_generation_one_led_by_the_member() {
    let mut now = 1_000;
    let mut group = Group::new("g", settings(), now);
    assert!(group.join(join_args("", &["range"]), 1, now).replies.is_empty());
    assert_eq!(group.state, GroupState::PreparingRebalance);
    now += DELAY_MS - 1;
    assert!(group.tick(now).replies.is_empty(), "still within the delay");
    now += 1;
    let answer = joins(&group.tick(now)).remove(&1).unwrap();
    assert_eq!(answer.error, None);
    assert_eq!(answer.generation, 1);
    assert_eq!(answer.leader, answer.member_id);
    assert_eq!(answer.protocol_name.as_deref(), Some("range"));
    assert_eq!(answer.members.len(), 1);
    assert_eq!(answer.members[0].metadata, Bytes::from_static(b"meta-range"));
    assert_eq!(group.state, GroupState::CompletingRebalance);
}

#[test]
fn a_new_member_of_a_v4_join_is_given_its_id_with_member_id_required_and_joins_with_it() {
    let now = 0;
    let mut group = Group::new("g", settings(), now);
    let mut args = join_args("", &["range"]);
    args.require_known_member_id = true;
    let answer = joins(&group.join(args.clone(), 1, now)).remove(&1).unwrap();
    assert_eq!(answer.error, Some(ResponseError::MemberIdRequired));
    assert!(!answer.member_id.is_empty());
    assert_eq!(group.state, GroupState::Empty, "no member yet");
    args.member_id = answer.member_id.clone();
    assert!(group.join(args, 2, now).replies.is_empty());
    assert!(group.members.contains_key(&answer.member_id));
    let answer2 = joins(&group.tick(now + DELAY_MS)).remove(&2).unwrap();
    assert_eq!(answer2.member_id, answer.member_id);
    assert_eq!(answer2.generation, 1);
}

#[test]
fn a_second_member_makes_the_first_rejoin_and_only_the_leader_gets_the_member_list() {
    let mut now = 0;
    let (mut group, a) = stable_group_of_one(&mut now);
    assert_eq!(group.state, GroupState::Stable);
    now += 100;
    assert!(group.join(join_args("", &["range"]), 3, now).replies.is_empty(), "b waits for a to rejoin");
    assert_eq!(group.state, GroupState::PreparingRebalance);
    assert_eq!(group.heartbeat(&who(&a), 1, now), Some(ResponseError::RebalanceInProgress));
    let effects = group.join(join_args(&a, &["range"]), 4, now);
    let answers = joins(&effects);
    assert_eq!(answers.len(), 2, "both joins answered once a rejoined");
    let (la, lb) = (&answers[&4], &answers[&3]);
    assert_eq!((la.generation, lb.generation), (2, 2));
    assert_eq!(la.leader, a, "the leader stays");
    assert_eq!(lb.leader, a);
    assert_eq!(la.members.len(), 2);
    assert!(lb.members.is_empty());
    let b = lb.member_id.clone();
    // b syncs first and waits; a (the leader) gives the assignment; both are answered.
    assert!(group.sync(&who(&b), 2, (Some("consumer"), Some("range")), vec![], 5, now).replies.is_empty());
    let assignment = vec![(a.clone(), Bytes::from_static(b"A2")), (b.clone(), Bytes::from_static(b"B2"))];
    let effects = group.sync(&who(&a), 2, (Some("consumer"), Some("range")), assignment, 6, now);
    assert!(effects.persist, "the new generation is written before the answers go");
    assert!(effects.replies.is_empty());
    assert_eq!(group.state, GroupState::CompletingRebalance);
    assert_eq!(group.heartbeat(&who(&b), 2, now), None, "heartbeats are fine meanwhile");
    let effects = group.record_written(2, now);
    let answers = syncs(&effects);
    assert_eq!(answers[&5].assignment, Bytes::from_static(b"B2"));
    assert_eq!(answers[&6].assignment, Bytes::from_static(b"A2"));
    assert_eq!(group.state, GroupState::Stable);
    assert_eq!(group.heartbeat(&who(&b), 2, now), None);
}

#[test]
fn stale_generations_and_unknown_members_are_refused_with_kafkas_errors() {
    let mut now = 0;
    let (mut group, a) = stable_group_of_one(&mut now);
    assert_eq!(group.heartbeat(&who(&a), 0, now), Some(ResponseError::IllegalGeneration));
    assert_eq!(group.heartbeat(&who("nobody"), 1, now), Some(ResponseError::UnknownMemberId));
    assert_eq!(group.check_commit(&who(&a), 0, now), Err(ResponseError::IllegalGeneration));
    assert_eq!(group.check_commit(&who("nobody"), 1, now), Err(ResponseError::UnknownMemberId));
    assert_eq!(group.check_commit(&who(&a), 1, now), Ok(()));
    let sync = group.sync(&who(&a), 7, (None, None), vec![], 9, now);
    assert_eq!(syncs(&sync)[&9].error, Some(ResponseError::IllegalGeneration));
    let join = group.join(join_args("made-up", &["range"]), 10, now);
    assert_eq!(joins(&join)[&10].error, Some(ResponseError::UnknownMemberId));
    // None of this disturbed the member.
    assert_eq!(group.state, GroupState::Stable);
    assert_eq!(group.heartbeat(&who(&a), 1, now), None);
}

#[test]
fn a_member_silent_past_its_session_timeout_leaves_and_the_rest_rebalance() {
    let mut now = 0;
    let (mut group, a) = stable_group_of_one(&mut now);
    let _ = group.join(join_args("", &["range"]), 3, now);
    let answers = joins(&group.join(join_args(&a, &["range"]), 4, now));
    let b = answers[&3].member_id.clone();
    let assignment = vec![(a.clone(), Bytes::new()), (b.clone(), Bytes::new())];
    let _ = sync(&mut group, &who(&a), 2, assignment, 5, now);
    let _ = sync(&mut group, &who(&b), 2, vec![], 6, now);
    assert_eq!(group.state, GroupState::Stable);
    // a keeps heartbeating, b goes silent.
    for _ in 0..12 {
        now += 1_000;
        let _ = group.tick(now);
        let beat = group.heartbeat(&who(&a), group.generation, now);
        if beat.is_some() {
            assert_eq!(beat, Some(ResponseError::RebalanceInProgress));
            break;
        }
    }
    assert!(!group.members.contains_key(&b), "b expired");
    let answer = joins(&group.join(join_args(&a, &["range"]), 7, now)).remove(&7).unwrap();
    assert_eq!(answer.generation, 3);
    assert_eq!(answer.members.len(), 1);
}

#[test]
fn a_member_that_does_not_rejoin_within_the_rebalance_timeout_is_dropped() {
    let mut now = 0;
    let (mut group, a) = stable_group_of_one(&mut now);
    let _ = group.join(join_args("", &["range"]), 3, now);
    let answers = joins(&group.join(join_args(&a, &["range"]), 4, now));
    let b = answers[&3].member_id.clone();
    let _ = sync(&mut group, &who(&a), 2, vec![], 5, now);
    let _ = sync(&mut group, &who(&b), 2, vec![], 6, now);
    // A third member joins; a rejoins, b keeps heartbeating but never rejoins.
    let _ = group.join(join_args("", &["range"]), 7, now);
    let _ = group.join(join_args(&a, &["range"]), 8, now);
    let (mut answered, started) = (BTreeMap::new(), now);
    while answered.is_empty() {
        now += 1_000;
        assert!(now <= started + REBALANCE_MS as u64, "the rebalance completes at its timeout");
        let _ = group.heartbeat(&who(&b), 2, now);
        answered = joins(&group.tick(now));
    }
    assert_eq!(answered.len(), 2);
    assert!(!group.members.contains_key(&b));
    assert_eq!(group.generation, 3);
}

#[test]
fn leaving_starts_a_rebalance_and_the_last_member_leaving_empties_the_group() {
    let mut now = 0;
    let (mut group, a) = stable_group_of_one(&mut now);
    let (errors, effects) = group.leave(&[who(&a), who("ghost")], now);
    assert_eq!(errors, vec![None, Some(ResponseError::UnknownMemberId)]);
    assert!(effects.persist, "the empty group is recorded");
    assert_eq!(group.state, GroupState::Empty);
    assert_eq!(group.generation, 2);
    // Now a client outside the group may commit (assign() without joining).
    assert_eq!(group.check_commit(&MemberRef::default(), -1, now), Ok(()));
    assert_eq!(group.check_delete(), Ok(()));
}

#[test]
fn an_empty_group_keeps_its_protocol_type_through_its_record_until_a_member_of_another_type_joins() {
    let mut now = 0;
    let (mut group, a) = stable_group_of_one(&mut now);
    let _ = group.leave(&[who(&a)], now);
    assert_eq!(group.state, GroupState::Empty);
    assert_eq!((group.protocol_type.as_deref(), group.protocol.as_deref()), (Some("consumer"), None));
    // Its record, written when it became empty, and the group rebuilt from it on a reload.
    let record = group.record();
    assert_eq!(record.protocol_type.as_deref(), Some("consumer"));
    let restored = Group::restored("g", settings(), record, now);
    assert_eq!((restored.state, restored.protocol_type.as_deref()), (GroupState::Empty, Some("consumer")));
    // With no members, a member of another type may join; the group is then of its type.
    let mut other_type = join_args("", &["connect-proto"]);
    other_type.protocol_type = "connect".into();
    let _ = group.join(other_type, 3, now);
    now += DELAY_MS;
    let answer = joins(&group.tick(now)).remove(&3).expect("answered once the delay is over");
    assert_eq!((answer.error, answer.protocol_type.as_deref()), (None, Some("connect")));
}

#[test]
fn a_commit_without_membership_is_refused_while_the_group_has_members() {
    let mut now = 0;
    let (mut group, _a) = stable_group_of_one(&mut now);
    assert_eq!(group.check_commit(&MemberRef::default(), -1, now), Err(ResponseError::UnknownMemberId));
    assert_eq!(group.check_delete(), Err(ResponseError::NonEmptyGroup));
}

#[test]
fn a_restarted_static_member_takes_its_place_without_a_rebalance_and_fences_the_old_process() {
    let mut now = 0;
    let mut group = Group::new("g", settings(), now);
    let mut args = join_args("", &["range"]);
    args.instance_id = Some("host-1".into());
    args.require_known_member_id = true;
    let _ = group.join(args.clone(), 1, now);
    now += DELAY_MS;
    let old = joins(&group.tick(now))[&1].member_id.clone();
    let old_ref = MemberRef { member_id: old.clone(), instance_id: Some("host-1".into()) };
    let _ = sync(&mut group, &old_ref, 1, vec![(old.clone(), Bytes::from_static(b"A"))], 2, now);
    assert_eq!(group.state, GroupState::Stable);
    // The process restarts: same instance id, no member id.
    let effects = group.join(args, 3, now);
    assert!(effects.persist, "the new member id is recorded");
    let answer = joins(&effects).remove(&3).unwrap();
    assert_eq!(answer.error, None);
    assert_ne!(answer.member_id, old);
    assert_eq!(answer.generation, 1, "no rebalance");
    assert!(answer.skip_assignment, "the leader keeps the assignment it made");
    assert_eq!(group.state, GroupState::Stable);
    assert_eq!(group.heartbeat(&old_ref, 1, now), Some(ResponseError::FencedInstanceId));
    let new_ref = MemberRef { member_id: answer.member_id.clone(), instance_id: Some("host-1".into()) };
    assert_eq!(group.heartbeat(&new_ref, 1, now), None);
    let sync = group.sync(&new_ref, 1, (None, None), vec![], 4, now);
    assert_eq!(syncs(&sync)[&4].assignment, Bytes::from_static(b"A"), "the assignment carried over");
}

#[test]
fn joins_that_do_not_fit_the_group_are_refused() {
    let mut now = 0;
    let (mut group, _a) = stable_group_of_one(&mut now);
    let mut other_type = join_args("", &["range"]);
    other_type.protocol_type = "connect".into();
    assert_eq!(joins(&group.join(other_type, 3, now))[&3].error, Some(ResponseError::InconsistentGroupProtocol));
    let no_common = join_args("", &["roundrobin"]);
    assert_eq!(joins(&group.join(no_common, 4, now))[&4].error, Some(ResponseError::InconsistentGroupProtocol));
    let mut short = join_args("", &["range"]);
    short.session_timeout_ms = 10;
    assert_eq!(joins(&group.join(short, 5, now))[&5].error, Some(ResponseError::InvalidSessionTimeout));
    assert_eq!(group.state, GroupState::Stable, "refused joins change nothing");
}

#[test]
fn the_protocol_most_members_prefer_among_those_all_support_is_chosen() {
    let now = 0;
    let mut group = Group::new("g", GroupSettings { initial_rebalance_delay_ms: 0, ..settings() }, now);
    let joined = group.join(join_args("", &["cooperative-sticky", "range"]), 1, now);
    let first = joins(&joined)[&1].member_id.clone();
    let _ = sync(&mut group, &who(&first), 1, vec![], 2, now);
    let _ = group.join(join_args("", &["range", "cooperative-sticky"]), 3, now);
    let _ = group.join(join_args("", &["range", "cooperative-sticky"]), 4, now);
    let answers = joins(&group.join(join_args(&first, &["cooperative-sticky", "range"]), 5, now));
    // Both are supported by all; two of three members put range first.
    assert_eq!(answers.len(), 3);
    assert!(answers.values().all(|a| a.protocol_name.as_deref() == Some("range")), "{answers:?}");
}

#[test]
fn a_group_holds_at_most_group_max_size_members() {
    let now = 0;
    let mut group = Group::new("g", settings(), now);
    for t in 0..5 {
        assert!(group.join(join_args("", &["range"]), t, now).replies.is_empty());
    }
    let refused = joins(&group.join(join_args("", &["range"]), 9, now)).remove(&9).unwrap();
    assert_eq!(refused.error, Some(ResponseError::GroupMaxSizeReached));
    assert_eq!(group.members.len(), 5);
}

#[test]
fn a_restored_group_keeps_its_generation_and_assignments_and_gives_members_a_session() {
    let mut now = 0;
    let (group, a) = stable_group_of_one(&mut now);
    let record = group.record();
    let mut restored = Group::restored("g", settings(), record.clone(), 50_000);
    assert_eq!(restored.state, GroupState::Stable);
    assert_eq!(restored.generation, 1);
    assert_eq!(restored.record(), record);
    assert_eq!(restored.heartbeat(&who(&a), 1, 50_000 + SESSION_MS as u64 - 1), None);
    let _ = restored.tick(50_000 + 2 * SESSION_MS as u64);
    assert!(restored.members.is_empty(), "a member that never comes back expires");
    assert_eq!(restored.state, GroupState::Empty, "and the group, with nobody left, is empty");
}

/// A stable group of one static member (`host-1`) led by it; returns its member id.
fn stable_static_group(now: &mut u64) -> (Group, String, JoinArgs) {
    let mut group = Group::new("g", settings(), *now);
    let mut args = join_args("", &["range"]);
    args.instance_id = Some("host-1".into());
    let _ = group.join(args.clone(), 1, *now);
    *now += DELAY_MS;
    let id = joins(&group.tick(*now))[&1].member_id.clone();
    let member = MemberRef { member_id: id.clone(), instance_id: Some("host-1".into()) };
    let _ = sync(&mut group, &member, 1, vec![(id.clone(), Bytes::from_static(b"A"))], 2, *now);
    assert_eq!(group.state, GroupState::Stable);
    (group, id, args)
}

#[test]
fn a_join_of_another_protocol_type_is_refused_while_the_group_has_a_member_even_the_one_it_replaces() {
    let mut now = 0;
    let (mut group, id, mut args) = stable_static_group(&mut now);
    args.protocol_type = "connect".into();
    let answer = joins(&group.join(args, 3, now)).remove(&3).unwrap();
    assert_eq!(answer.error, Some(ResponseError::InconsistentGroupProtocol), "a static member's new process");
    let mut rejoin = join_args(&id, &["range"]);
    rejoin.instance_id = Some("host-1".into());
    rejoin.protocol_type = "connect".into();
    let answer = joins(&group.join(rejoin, 4, now)).remove(&4).unwrap();
    assert_eq!(answer.error, Some(ResponseError::InconsistentGroupProtocol), "the member itself");
    assert_eq!((group.state, group.protocol_type.as_deref()), (GroupState::Stable, Some("consumer")));
    assert!(group.members.contains_key(&id), "the member keeps its place");
}

#[test]
fn a_restarted_static_leader_on_join_group_before_v9_is_not_told_it_leads() {
    let mut now = 0;
    let (mut group, old, mut args) = stable_static_group(&mut now);
    args.supports_skip_assignment = false;
    // The new process's subscription bytes differ (owned partitions): still the same protocol.
    args.protocols = vec![("range".into(), Bytes::from_static(b"other bytes"))];
    let effects = group.join(args, 3, now);
    let answer = joins(&effects).remove(&3).unwrap();
    assert_eq!(answer.error, None);
    assert_eq!(answer.leader, old, "the leader as it was, not the new id: no reassignment");
    assert_ne!(answer.member_id, old);
    assert!(answer.members.is_empty() && !answer.skip_assignment);
    assert_eq!((group.state, group.generation), (GroupState::Stable, 1), "no rebalance");
}

#[test]
fn a_join_or_sync_sent_again_answers_the_one_it_replaces() {
    let mut now = 0;
    let (mut group, a) = stable_group_of_one(&mut now);
    let _ = group.join(join_args("", &["range"]), 3, now);
    assert!(group.join(join_args(&a, &["range"]), 4, now).replies.len() >= 2, "b's and a's joins answered");
    // b's client times out waiting in SyncGroup and sends it again.
    let b = group.members.keys().find(|id| **id != a).unwrap().clone();
    assert!(group.sync(&who(&b), 2, (None, None), vec![], 5, now).replies.is_empty());
    let again = group.sync(&who(&b), 2, (None, None), vec![], 6, now);
    assert_eq!(syncs(&again)[&5].error, Some(ResponseError::RebalanceInProgress), "the first one is not left waiting");
    // The same for JoinGroup during a rebalance.
    let _ = group.join(join_args("", &["range"]), 7, now);
    assert!(group.join(join_args(&b, &["range"]), 8, now).replies.is_empty());
    let again = group.join(join_args(&b, &["range"]), 9, now);
    assert_eq!(joins(&again)[&8].error, Some(ResponseError::RebalanceInProgress));
}

#[test]
fn a_failed_record_of_the_assignment_makes_the_members_join_again_but_a_stale_failure_changes_nothing() {
    let mut now = 0;
    let (mut group, a) = stable_group_of_one(&mut now);
    let _ = group.join(join_args("", &["range"]), 3, now);
    let answers = joins(&group.join(join_args(&a, &["range"]), 4, now));
    let b = answers[&3].member_id.clone();
    let _ = group.sync(&who(&b), 2, (None, None), vec![], 5, now);
    let effects = group.sync(&who(&a), 2, (None, None), vec![], 6, now);
    assert!(effects.persist);
    assert!(group.record_failed(1, ResponseError::NotCoordinator, now).replies.is_empty(), "an older generation's");
    assert_eq!(group.state, GroupState::CompletingRebalance);
    let failed = group.record_failed(2, ResponseError::CoordinatorNotAvailable, now);
    let answers = syncs(&failed);
    assert_eq!(answers[&5].error, Some(ResponseError::CoordinatorNotAvailable));
    assert_eq!(answers[&6].error, Some(ResponseError::CoordinatorNotAvailable));
    assert_eq!(group.state, GroupState::PreparingRebalance);
}

#[test]
fn a_member_id_given_out_keeps_a_new_group_and_unbound_instance_ids_are_unknown() {
    let now = 0;
    let mut group = Group::new("g", settings(), now);
    let mut args = join_args("", &["range"]);
    args.require_known_member_id = true;
    let _ = group.join(args, 1, now);
    assert!(!group.is_idle(), "the member id given out is still to be used");
    let stranger = MemberRef { member_id: "x".into(), instance_id: Some("nobody".into()) };
    assert_eq!(group.heartbeat(&stranger, 0, now), Some(ResponseError::UnknownMemberId));
    // A commit from outside the group with a member id is accepted while it is empty, as Kafka does.
    assert_eq!(group.check_commit(&who("some-client"), -1, now), Ok(()));
}

/// Random schedules of joins, syncs, leaves, ticks and record outcomes (written or failed, in any
/// order): every JoinGroup and SyncGroup is answered exactly once, or is still held by its member; once
/// every write is settled and time has passed every deadline, none is held.
mod random_schedules {
    use super::*;
    use std::collections::BTreeSet;

    /// xorshift64: a seed replays a schedule.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    struct World {
        group: Group,
        issued: BTreeSet<Ticket>,
        answered: BTreeSet<Ticket>,
        next: Ticket,
        writes: Vec<i32>,
        now: u64,
        ids: Vec<String>,
    }

    impl World {
        fn ticket(&mut self) -> Ticket {
            self.next += 1;
            self.issued.insert(self.next);
            self.next
        }
        fn apply(&mut self, e: Effects) {
            for r in &e.replies {
                let t = match r {
                    Reply::Join(t, a) => {
                        if !a.member_id.is_empty() && !self.ids.contains(&a.member_id) {
                            self.ids.push(a.member_id.clone());
                        }
                        *t
                    }
                    Reply::Sync(t, _) => *t,
                };
                assert!(self.issued.contains(&t), "unknown ticket {t}");
                assert!(self.answered.insert(t), "ticket {t} answered twice");
            }
            if e.persist {
                self.writes.push(self.group.generation);
            }
        }
        fn held(&self) -> BTreeSet<Ticket> {
            let mut h = BTreeSet::new();
            for m in self.group.members.values() {
                if let Some(t) = m.joining {
                    assert!(h.insert(t));
                }
                if let Some(t) = m.syncing {
                    assert!(h.insert(t));
                }
            }
            h
        }
        fn check(&self) {
            let held = self.held();
            for t in &self.issued {
                assert!(
                    self.answered.contains(t) || held.contains(t),
                    "ticket {t} neither answered nor held: {:?}",
                    self.group.state
                );
            }
            for t in &held {
                assert!(!self.answered.contains(t), "ticket {t} held but answered");
            }
        }
    }

    #[test]
    fn no_join_or_sync_answer_is_lost_or_given_twice_in_random_schedules() {
        for seed in 1..1000u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1);
            let mut w = World {
                group: Group::new("g", settings(), 0),
                issued: BTreeSet::new(),
                answered: BTreeSet::new(),
                next: 0,
                writes: Vec::new(),
                now: 0,
                ids: Vec::new(),
            };
            for _ in 0..200 {
                let op = rng.below(10);
                let id = if w.ids.is_empty() || rng.below(4) == 0 {
                    String::new()
                } else {
                    w.ids[rng.below(w.ids.len() as u64) as usize].clone()
                };
                match op {
                    0 | 1 => {
                        let t = w.ticket();
                        let mut args = join_args(&id, if rng.below(5) == 0 { &["range", "rr"] } else { &["range"] });
                        if rng.below(3) == 0 {
                            args.instance_id = Some(format!("i{}", rng.below(3)));
                        }
                        args.require_known_member_id = rng.below(2) == 0;
                        let e = w.group.join(args, t, w.now);
                        w.apply(e);
                    }
                    2 | 3 => {
                        let t = w.ticket();
                        let leader = w.group.leader.clone();
                        let who_id = if rng.below(2) == 0 { leader.unwrap_or(id) } else { id };
                        let inst = w.group.members.get(&who_id).and_then(|m| m.instance_id.clone());
                        let generation = w.group.generation;
                        let e = w.group.sync(
                            &MemberRef { member_id: who_id, instance_id: inst },
                            generation,
                            (None, None),
                            vec![],
                            t,
                            w.now,
                        );
                        w.apply(e);
                    }
                    4 => {
                        let inst = w.group.members.get(&id).and_then(|m| m.instance_id.clone());
                        let (_, e) = w.group.leave(&[MemberRef { member_id: id, instance_id: inst }], w.now);
                        w.apply(e);
                    }
                    5 | 6 => {
                        w.now += rng.below(15_000);
                        let e = w.group.tick(w.now);
                        w.apply(e);
                    }
                    _ => {
                        if !w.writes.is_empty() {
                            let i = rng.below(w.writes.len() as u64) as usize;
                            let g = w.writes.remove(i);
                            let e = if rng.below(3) == 0 {
                                w.group.record_failed(g, ResponseError::CoordinatorNotAvailable, w.now)
                            } else {
                                w.group.record_written(g, w.now)
                            };
                            w.apply(e);
                        }
                    }
                }
                w.check();
            }
            // Quiesce: every write answered, time moves on past every deadline.
            for _ in 0..50 {
                while let Some(g) = w.writes.pop() {
                    let e = w.group.record_written(g, w.now);
                    w.apply(e);
                }
                w.now += 40_000;
                let e = w.group.tick(w.now);
                w.apply(e);
                w.check();
            }
            assert!(
                w.held().is_empty(),
                "seed {seed}: tickets still held at quiescence: {:?} {:?}",
                w.held(),
                w.group.state
            );
        }
    }
}

#[test]
fn a_transactional_commit_is_fenced_by_generation_and_member_but_unchecked_without_group_metadata() {
    let mut now = 0;
    let (group, a) = stable_group_of_one(&mut now);
    // TxnOffsetCommit before v3 names no member: accepted while the group has members (KIP-447 aside).
    assert_eq!(group.check_txn_commit(&MemberRef::default(), -1), Ok(()));
    assert_eq!(group.check_txn_commit(&who(&a), 1), Ok(()));
    assert_eq!(group.check_txn_commit(&who(&a), 0), Err(ResponseError::IllegalGeneration), "a zombie's generation");
    assert_eq!(group.check_txn_commit(&who("nobody"), 1), Err(ResponseError::UnknownMemberId));
    let fenced = MemberRef { member_id: "other".into(), instance_id: Some("i".into()) };
    assert_eq!(group.check_txn_commit(&fenced, 1), Err(ResponseError::UnknownMemberId), "no member has instance i");
}
