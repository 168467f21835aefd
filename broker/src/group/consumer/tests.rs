use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::ResponseError;
use proptest::prelude::*;
use uuid::Uuid;

use super::validate::{MAX_ID_BYTES, MAX_REGEX_BYTES};
use super::*;

/// Topics for the tests: name to (id, partitions), with a version bumped on every change.
#[derive(Debug, Default, Clone)]
struct Topics {
    version: u64,
    topics: BTreeMap<String, (TopicId, i32)>,
}

impl Topics {
    fn with(topics: &[(&str, i32)]) -> Topics {
        let mut t = Topics::default();
        for (name, n) in topics {
            t.set(name, *n);
        }
        t
    }

    fn set(&mut self, name: &str, partitions: i32) {
        let next_id = Uuid::from_u128(self.topics.len() as u128 + 1);
        let id = self.topics.get(name).map(|(id, _)| *id).unwrap_or(next_id);
        self.topics.insert(name.to_string(), (id, partitions));
        self.version += 1;
    }

    fn id(&self, name: &str) -> TopicId {
        self.topics[name].0
    }
}

impl TopicsView for Topics {
    fn version(&self) -> u64 {
        self.version
    }
    fn lookup(&self, name: &str) -> Option<(TopicId, i32)> {
        self.topics.get(name).copied()
    }
    fn names(&self) -> Vec<String> {
        self.topics.keys().cloned().collect()
    }
}

fn settings() -> ConsumerGroupSettings {
    ConsumerGroupSettings { session_timeout_ms: 10_000, ..ConsumerGroupSettings::default() }
}

fn join(member: &str, topics: &[&str]) -> Heartbeat {
    Heartbeat {
        member_id: member.to_string(),
        member_epoch: JOIN_EPOCH,
        rebalance_timeout_ms: 20_000,
        subscribed_topic_names: Some(topics.iter().map(|t| t.to_string()).collect()),
        owned: Some(Assignment::new()),
        client_id: "c".into(),
        client_host: "/127.0.0.1".into(),
        ..Heartbeat::default()
    }
}

fn beat(member: &str, epoch: i32, owned: Option<Assignment>) -> Heartbeat {
    Heartbeat {
        member_id: member.to_string(),
        member_epoch: epoch,
        rebalance_timeout_ms: -1,
        owned,
        client_id: "c".into(),
        client_host: "/127.0.0.1".into(),
        ..Heartbeat::default()
    }
}

fn count(a: &Assignment) -> usize {
    a.values().map(BTreeSet::len).sum()
}

#[test]
fn a_first_member_gets_every_partition_at_once() {
    let topics = Topics::with(&[("t", 6)]);
    let mut group = ConsumerGroup::new("g");
    let (answer, changes) = group.heartbeat(join("a", &["t"]), &topics, &settings(), 0).unwrap();
    assert_eq!(answer.member_epoch, 1);
    assert_eq!(answer.assignment, Some(Assignment::from([(topics.id("t"), (0..6).collect())])));
    assert_eq!(answer.heartbeat_interval_ms, 5_000);
    // The records in Kafka's order: member metadata (5), group epoch (3), target (6), target epoch (7),
    // current assignment (8).
    let kinds: Vec<&str> = changes
        .iter()
        .map(|c| match c {
            Change::Member(..) => "member",
            Change::GroupEpoch(_) => "group epoch",
            Change::Target(..) => "target",
            Change::AssignmentEpoch(_) => "target epoch",
            Change::Current(..) => "current",
        })
        .collect();
    assert_eq!(kinds, ["member", "group epoch", "target", "target epoch", "current"]);
    assert!(changes.contains(&Change::GroupEpoch(Some(1))));
    assert!(changes.contains(&Change::AssignmentEpoch(Some(1))));
    assert_eq!(group.state(), ConsumerGroupState::Stable);
}

#[test]
fn a_second_member_gets_partitions_only_after_the_first_revokes_them() {
    let topics = Topics::with(&[("t", 4)]);
    let s = settings();
    let mut group = ConsumerGroup::new("g");
    let (a1, _) = group.heartbeat(join("a", &["t"]), &topics, &s, 0).unwrap();
    let a_owned = a1.assignment.unwrap();
    let (b1, _) = group.heartbeat(join("b", &["t"]), &topics, &s, 10).unwrap();
    assert_eq!(b1.member_epoch, 2, "b is at the new target epoch");
    assert_eq!(b1.assignment, Some(Assignment::new()), "but gets nothing a still holds");
    assert_eq!(group.state(), ConsumerGroupState::Reconciling);

    // a is told to give up two partitions; its epoch stays until it has.
    let (a2, _) = group.heartbeat(beat("a", 1, Some(a_owned.clone())), &topics, &s, 20).unwrap();
    assert_eq!(a2.member_epoch, 1);
    let a_kept = a2.assignment.unwrap();
    assert_eq!(count(&a_kept), 2);
    let (b2, _) = group.heartbeat(beat("b", 2, Some(Assignment::new())), &topics, &s, 30).unwrap();
    assert_eq!(b2.assignment, None, "nothing released yet");

    let (a3, _) = group.heartbeat(beat("a", 1, Some(a_kept.clone())), &topics, &s, 40).unwrap();
    assert_eq!(a3.member_epoch, 2, "revoked: a reaches the target epoch");
    let (b3, _) = group.heartbeat(beat("b", 2, Some(Assignment::new())), &topics, &s, 50).unwrap();
    let b_owned = b3.assignment.unwrap();
    assert_eq!(count(&b_owned), 2);
    assert!(!reconcile::intersects(&a_kept, &b_owned));
    assert_eq!(group.state(), ConsumerGroupState::Stable);
}

#[test]
fn a_wrong_epoch_is_fenced_and_an_unknown_member_is_told_so() {
    let topics = Topics::with(&[("t", 2)]);
    let s = settings();
    let mut group = ConsumerGroup::new("g");
    let (a1, _) = group.heartbeat(join("a", &["t"]), &topics, &s, 0).unwrap();
    let owned = a1.assignment.clone();
    let refused = group.heartbeat(beat("a", 7, owned.clone()), &topics, &s, 1).unwrap_err();
    assert_eq!(refused.error, ResponseError::FencedMemberEpoch);
    let refused = group.heartbeat(beat("zz", 1, owned), &topics, &s, 1).unwrap_err();
    assert_eq!(refused.error, ResponseError::UnknownMemberId);
}

#[test]
fn a_member_that_missed_an_answer_may_heartbeat_at_its_previous_epoch() {
    let topics = Topics::with(&[("t", 4)]);
    let s = settings();
    let mut group = ConsumerGroup::new("g");
    group.heartbeat(join("a", &["t"]), &topics, &s, 0).unwrap();
    // A subscription change moves a to epoch 2; say that answer is lost.
    let mut change = beat("a", 1, None);
    change.subscribed_topic_names = Some(vec!["t".into(), "u".into()]);
    let (moved, _) = group.heartbeat(change, &topics, &s, 1).unwrap();
    assert_eq!(moved.member_epoch, 2);
    let owned = Assignment::from([(topics.id("t"), (0..2).collect())]);
    let (ok, _) = group.heartbeat(beat("a", 1, Some(owned)), &topics, &s, 2).unwrap();
    assert_eq!(ok.member_epoch, 2, "the previous epoch with owned partitions it was given is accepted");
    let refused = group.heartbeat(beat("a", 1, None), &topics, &s, 3).unwrap_err();
    assert_eq!(refused.error, ResponseError::FencedMemberEpoch, "without its owned partitions it is fenced");
}

#[test]
fn a_static_member_that_leaves_for_now_keeps_its_partitions_for_its_next_process() {
    let topics = Topics::with(&[("t", 4)]);
    let s = settings();
    let mut group = ConsumerGroup::new("g");
    let mut first = join("a1", &["t"]);
    first.instance_id = Some("i".into());
    let (a, _) = group.heartbeat(first, &topics, &s, 0).unwrap();
    let mut leave = beat("a1", STATIC_LEAVE_EPOCH, None);
    leave.instance_id = Some("i".into());
    group.heartbeat(leave, &topics, &s, 1).unwrap();
    let epoch = group.epoch;

    let mut other = join("a2", &["t"]);
    other.instance_id = Some("i".into());
    let (taken, _) = group.heartbeat(other, &topics, &s, 2).unwrap();
    assert_eq!(group.epoch, epoch, "no rebalance");
    assert_eq!(taken.member_epoch, a.member_epoch);
    assert_eq!(taken.assignment, a.assignment);
    assert!(!group.members.contains_key("a1"));

    let mut third = join("a3", &["t"]);
    third.instance_id = Some("i".into());
    let refused = group.heartbeat(third, &topics, &s, 3).unwrap_err();
    assert_eq!(refused.error, ResponseError::UnreleasedInstanceId, "a2 has not left");
}

#[test]
fn bad_heartbeats_are_refused_with_the_protocols_errors() {
    let topics = Topics::with(&[("t", 1)]);
    let s = settings();
    let mut group = ConsumerGroup::new("g");
    let mut no_timeout = join("a", &["t"]);
    no_timeout.rebalance_timeout_ms = -1;
    let mut no_subscription = join("a", &[]);
    no_subscription.subscribed_topic_names = None;
    let mut owning = join("a", &["t"]);
    owning.owned = Some(Assignment::from([(topics.id("t"), BTreeSet::from([0]))]));
    let mut unknown_assignor = join("a", &["t"]);
    unknown_assignor.server_assignor = Some("sticky".into());
    let mut bad_regex = join("a", &[]);
    bad_regex.subscribed_topic_regex = Some("(".into());
    let mut huge_regex = join("a", &[]);
    huge_regex.subscribed_topic_regex = Some("a".repeat(MAX_REGEX_BYTES + 1));
    let long_id = "m".repeat(MAX_ID_BYTES + 1);
    let mut long_instance = join("a", &["t"]);
    long_instance.instance_id = Some(long_id.clone());
    let mut long_rack = join("a", &["t"]);
    long_rack.rack_id = Some(long_id.clone());
    let long_name = "t".repeat(250);
    for (hb, error) in [
        (join("", &["t"]), ResponseError::InvalidRequest),
        (no_timeout, ResponseError::InvalidRequest),
        (no_subscription, ResponseError::InvalidRequest),
        (owning, ResponseError::InvalidRequest),
        (beat("a", -3, None), ResponseError::InvalidRequest),
        (beat("a", STATIC_LEAVE_EPOCH, None), ResponseError::InvalidRequest),
        (unknown_assignor, ResponseError::UnsupportedAssignor),
        (bad_regex, ResponseError::InvalidRegularExpression),
        (huge_regex, ResponseError::InvalidRegularExpression),
        (join(&long_id, &["t"]), ResponseError::InvalidRequest),
        (long_instance, ResponseError::InvalidRequest),
        (long_rack, ResponseError::InvalidRequest),
        (join("a", &["t", &long_name]), ResponseError::InvalidRequest),
    ] {
        assert_eq!(group.heartbeat(hb.clone(), &topics, &s, 0).unwrap_err().error, error, "{hb:?}");
    }
    assert!(group.members.is_empty());
}

#[test]
fn a_full_group_refuses_a_new_member() {
    let topics = Topics::with(&[("t", 1)]);
    let s = ConsumerGroupSettings { max_size: 2, ..settings() };
    let mut group = ConsumerGroup::new("g");
    group.heartbeat(join("a", &["t"]), &topics, &s, 0).unwrap();
    group.heartbeat(join("b", &["t"]), &topics, &s, 0).unwrap();
    assert_eq!(
        group.heartbeat(join("c", &["t"]), &topics, &s, 0).unwrap_err().error,
        ResponseError::GroupMaxSizeReached
    );
}

#[test]
fn a_regex_subscription_follows_new_topics_and_partitions() {
    let mut topics = Topics::with(&[("orders-eu", 2), ("other", 3)]);
    let s = settings();
    let mut group = ConsumerGroup::new("g");
    let mut hb = join("a", &[]);
    hb.subscribed_topic_names = None;
    hb.subscribed_topic_regex = Some("orders-.*".into());
    let (a, _) = group.heartbeat(hb, &topics, &s, 0).unwrap();
    assert_eq!(count(a.assignment.as_ref().unwrap()), 2, "orders-eu only: the regex matches whole names");
    topics.set("orders-us", 1);
    topics.set("orders-eu", 3);
    let (b, _) = group.heartbeat(beat("a", a.member_epoch, a.assignment), &topics, &s, 1).unwrap();
    assert_eq!(b.member_epoch, a.member_epoch + 1);
    assert_eq!(count(b.assignment.as_ref().unwrap()), 4);
}

#[test]
fn a_silent_member_is_removed_after_its_session_and_its_partitions_move() {
    let topics = Topics::with(&[("t", 2)]);
    let s = settings();
    let mut group = ConsumerGroup::new("g");
    group.heartbeat(join("a", &["t"]), &topics, &s, 0).unwrap();
    let (b, _) = group.heartbeat(join("b", &["t"]), &topics, &s, 0).unwrap();
    assert!(group.tick(&s, 10_000).is_empty(), "not yet");
    let changes = group.tick(&s, 10_001);
    assert!(changes.contains(&Change::Member("a".into(), None)));
    assert!(changes.contains(&Change::Member("b".into(), None)), "b did not heartbeat either");
    let (b2, _) = group.heartbeat(join("b", &["t"]), &topics, &s, 10_002).unwrap();
    assert_eq!(count(b2.assignment.as_ref().unwrap()), 2);
    assert!(b2.member_epoch > b.member_epoch);
}

#[test]
fn a_group_read_back_from_its_records_is_the_same_group() {
    let topics = Topics::with(&[("t", 5), ("u", 3)]);
    let s = settings();
    let mut group = ConsumerGroup::new("g");
    let mut written = Vec::new();
    let (a, c) = group.heartbeat(join("a", &["t", "u"]), &topics, &s, 0).unwrap();
    written.extend(c);
    let (_, c) = group.heartbeat(join("b", &["t"]), &topics, &s, 1).unwrap();
    written.extend(c);
    let (_, c) = group.heartbeat(beat("a", a.member_epoch, a.assignment), &topics, &s, 2).unwrap();
    written.extend(c);

    for records in [written, group.snapshot()] {
        let mut back = ConsumerGroup::new("g");
        for change in records {
            back.replay(change, 100);
        }
        assert_eq!((back.epoch, back.assignment_epoch), (group.epoch, group.assignment_epoch));
        assert_eq!(back.target, group.target);
        for (id, m) in &group.members {
            assert_eq!(back.members[id].metadata, m.metadata);
            assert_eq!(back.members[id].current, m.current);
        }
        assert_eq!(back.members.len(), group.members.len());
        // The first heartbeat after the move finds the target still covering the topics: no new epoch.
        let epoch = back.epoch;
        let b = &back.members["b"].current;
        back.heartbeat(beat("b", b.epoch, None), &topics, &s, 101).unwrap();
        assert_eq!(back.epoch, epoch);
    }
}

/// A consumer as the simulation runs it: it owns what its last answer gave it, revokes at once what an
/// answer takes away, and, fenced or silent past its session, drops everything and joins again.
#[derive(Debug, Clone)]
struct Client {
    member_id: String,
    instance_id: Option<String>,
    epoch: i32,
    owned: Assignment,
    subscription: Vec<String>,
    /// When its last answer came.
    last_answer_ms: u64,
    /// Crashed or left: no process any more.
    gone: bool,
}

#[derive(Debug, Clone)]
enum Op {
    Join(Vec<usize>),
    /// A static member's process, with one of a few instance ids.
    JoinStatic(Vec<usize>, u8),
    /// A static member's process closes, leaving its partitions for its instance id's next process.
    LeaveStatic(usize),
    /// The coordinator moves: the group is read back from what it wrote.
    Reload,
    Heartbeat(usize),
    /// Heartbeats and loses the answer.
    HeartbeatLost(usize),
    Leave(usize),
    Crash(usize),
    Subscribe(usize, Vec<usize>),
    Wait(u64),
    Grow(usize),
}

const TOPIC_NAMES: [&str; 3] = ["t0", "t1", "t2"];

fn op() -> impl Strategy<Value = Op> {
    let topics = || proptest::collection::vec(0..TOPIC_NAMES.len(), 1..3);
    prop_oneof![
        2 => topics().prop_map(Op::Join),
        1 => (topics(), 0..3u8).prop_map(|(t, i)| Op::JoinStatic(t, i)),
        1 => (0..8usize).prop_map(Op::LeaveStatic),
        1 => Just(Op::Reload),
        8 => (0..8usize).prop_map(Op::Heartbeat),
        1 => (0..8usize).prop_map(Op::HeartbeatLost),
        1 => (0..8usize).prop_map(Op::Leave),
        1 => (0..8usize).prop_map(Op::Crash),
        1 => (0..8usize, topics()).prop_map(|(i, t)| Op::Subscribe(i, t)),
        2 => (0..15_000u64).prop_map(Op::Wait),
        1 => (0..TOPIC_NAMES.len()).prop_map(Op::Grow),
    ]
}

struct Sim {
    group: ConsumerGroup,
    topics: Topics,
    settings: ConsumerGroupSettings,
    clients: Vec<Client>,
    now: u64,
    /// Everything the group asked to have written, in order.
    written: Vec<Change>,
}

impl Sim {
    fn new(assignor: Assignor) -> Sim {
        Sim {
            group: ConsumerGroup::new("g"),
            topics: Topics::with(&[("t0", 3), ("t1", 5), ("t2", 1)]),
            settings: ConsumerGroupSettings {
                assignors: if assignor == Assignor::Range { &[Assignor::Range] } else { &[Assignor::Uniform] },
                ..settings()
            },
            clients: Vec::new(),
            now: 0,
            written: Vec::new(),
        }
    }

    fn heartbeat(&mut self, i: usize, deliver: bool) {
        let c = &self.clients[i];
        let hb = if c.epoch == JOIN_EPOCH {
            let names: Vec<&str> = c.subscription.iter().map(String::as_str).collect();
            Heartbeat { instance_id: c.instance_id.clone(), ..join(&c.member_id, &names) }
        } else {
            let mut hb = beat(&c.member_id, c.epoch, Some(c.owned.clone()));
            hb.subscribed_topic_names = Some(c.subscription.clone());
            hb
        };
        let result = self.group.heartbeat(hb, &self.topics, &self.settings, self.now);
        if let Ok((_, changes)) = &result {
            self.written.extend(changes.iter().cloned());
        }
        if !deliver {
            return;
        }
        let c = &mut self.clients[i];
        match result {
            Err(r) if r.error == ResponseError::UnreleasedInstanceId => {
                // Fatal for the consumer: its instance id is still another live process's.
                assert!(c.instance_id.is_some());
                c.gone = true;
                c.owned.clear();
            }
            Ok((answer, _)) => {
                c.epoch = answer.member_epoch;
                c.last_answer_ms = self.now;
                if let Some(assignment) = answer.assignment {
                    c.owned = assignment;
                }
            }
            Err(r) => {
                assert!(matches!(r.error, ResponseError::FencedMemberEpoch | ResponseError::UnknownMemberId), "{r:?}");
                c.owned.clear();
                c.epoch = JOIN_EPOCH;
            }
        }
    }

    fn live(&self, i: usize) -> Option<usize> {
        let live: Vec<usize> = (0..self.clients.len()).filter(|&c| !self.clients[c].gone).collect();
        (!live.is_empty()).then(|| live[i % live.len()])
    }

    fn apply(&mut self, op: Op) {
        let names = |t: &[usize]| t.iter().map(|i| TOPIC_NAMES[*i].to_string()).collect::<Vec<_>>();
        match op {
            Op::Join(_) | Op::JoinStatic(..) => {
                let (topics, instance_id) = match op {
                    Op::JoinStatic(topics, i) => (topics, Some(format!("i{i}"))),
                    Op::Join(topics) => (topics, None),
                    _ => unreachable!(),
                };
                self.clients.push(Client {
                    member_id: format!("m{}", self.clients.len()),
                    instance_id,
                    epoch: JOIN_EPOCH,
                    owned: Assignment::new(),
                    subscription: names(&topics),
                    last_answer_ms: self.now,
                    gone: false,
                });
                self.heartbeat(self.clients.len() - 1, true);
            }
            Op::Heartbeat(i) | Op::HeartbeatLost(i) => {
                if let Some(c) = self.live(i) {
                    self.heartbeat(c, matches!(op, Op::Heartbeat(_)));
                }
            }
            Op::Leave(i) => {
                if let Some(c) = self.live(i) {
                    let client = &mut self.clients[c];
                    client.gone = true;
                    client.owned.clear();
                    if client.epoch != JOIN_EPOCH {
                        let leave = beat(&client.member_id, LEAVE_EPOCH, None);
                        if let Ok((_, changes)) = self.group.heartbeat(leave, &self.topics, &self.settings, self.now) {
                            self.written.extend(changes);
                        }
                    }
                }
            }
            Op::LeaveStatic(i) => {
                if let Some(c) = self.live(i).filter(|c| self.clients[*c].instance_id.is_some()) {
                    let client = &mut self.clients[c];
                    client.gone = true;
                    client.owned.clear();
                    if client.epoch != JOIN_EPOCH {
                        let leave = Heartbeat {
                            instance_id: client.instance_id.clone(),
                            ..beat(&client.member_id, STATIC_LEAVE_EPOCH, None)
                        };
                        if let Ok((_, changes)) = self.group.heartbeat(leave, &self.topics, &self.settings, self.now) {
                            self.written.extend(changes);
                        }
                    }
                }
            }
            Op::Reload => {
                let mut back = ConsumerGroup::new("g");
                for change in self.written.iter().cloned() {
                    back.replay(change, self.now);
                }
                self.group = back;
            }
            Op::Crash(i) => {
                if let Some(c) = self.live(i) {
                    self.clients[c].gone = true;
                    self.clients[c].owned.clear();
                }
            }
            Op::Subscribe(i, topics) => {
                if let Some(c) = self.live(i) {
                    self.clients[c].subscription = names(&topics);
                }
            }
            Op::Wait(ms) => {
                self.now += ms;
                let session = self.settings.session_timeout_ms as u64;
                for c in self.clients.iter_mut().filter(|c| !c.gone) {
                    if self.now >= c.last_answer_ms + session {
                        // Its own session ran out: its partitions are lost to it.
                        c.owned.clear();
                        c.epoch = JOIN_EPOCH;
                    }
                }
                let changes = self.group.tick(&self.settings, self.now);
                self.written.extend(changes);
            }
            Op::Grow(t) => {
                let name = TOPIC_NAMES[t];
                let n = self.topics.topics[name].1;
                self.topics.set(name, n + 1);
            }
        }
    }

    /// No partition has two owners, on the coordinator or among the consumers; a consumer owns only what
    /// the coordinator counts as held by it.
    fn check_owners(&self) -> Result<(), TestCaseError> {
        let mut held: BTreeMap<(TopicId, i32), &str> = BTreeMap::new();
        for (id, m) in &self.group.members {
            for tp in m.current.held() {
                prop_assert!(held.insert(tp, id).is_none(), "{:?} held twice on the coordinator", tp);
                prop_assert_eq!(self.group.holder(tp.0, tp.1), Some(id.as_str()));
            }
        }
        let mut owners: BTreeMap<(TopicId, i32), &str> = BTreeMap::new();
        for c in self.clients.iter().filter(|c| !c.gone) {
            for tp in reconcile::partitions(&c.owned) {
                prop_assert!(owners.insert(tp, &c.member_id).is_none(), "{:?} owned by two consumers", tp);
                prop_assert_eq!(held.get(&tp).copied(), Some(c.member_id.as_str()), "{:?} owned but not held", tp);
            }
        }
        Ok(())
    }

    /// The group read back from what it wrote is the group.
    fn check_written(&self) -> Result<(), TestCaseError> {
        let mut back = ConsumerGroup::new("g");
        for change in self.written.iter().cloned() {
            back.replay(change, self.now);
        }
        prop_assert_eq!((back.epoch, back.assignment_epoch), (self.group.epoch, self.group.assignment_epoch));
        prop_assert_eq!(&back.target, &self.group.target);
        prop_assert_eq!(back.members.len(), self.group.members.len());
        for (id, m) in &self.group.members {
            prop_assert_eq!(&back.members[id].metadata, &m.metadata);
            prop_assert_eq!(&back.members[id].current, &m.current);
        }
        Ok(())
    }

    /// Every live consumer heartbeats in turn, a second apart, until the group is stable.
    fn settle(&mut self) -> Result<(), TestCaseError> {
        for _ in 0..60 {
            self.apply(Op::Wait(1_000));
            for i in 0..self.clients.len() {
                if !self.clients[i].gone {
                    self.heartbeat(i, true);
                    self.check_owners()?;
                }
            }
        }
        let live: Vec<&Client> = self.clients.iter().filter(|c| !c.gone).collect();
        let settled = if live.is_empty() { ConsumerGroupState::Empty } else { ConsumerGroupState::Stable };
        prop_assert_eq!(self.group.state(), settled);
        prop_assert_eq!(self.group.members.len(), live.len(), "only live consumers are members");
        let mut owner: BTreeMap<(TopicId, i32), &Client> = BTreeMap::new();
        for c in &live {
            prop_assert_eq!(&self.group.members[&c.member_id].current.assigned, &c.owned);
            for tp in reconcile::partitions(&c.owned) {
                owner.insert(tp, c);
            }
        }
        for (name, (id, n)) in &self.topics.topics {
            let subscribed = live.iter().any(|c| c.subscription.contains(name));
            for p in 0..*n {
                match owner.get(&(*id, p)) {
                    Some(c) => prop_assert!(c.subscription.contains(name), "{} {} owned by a non-subscriber", name, p),
                    None => prop_assert!(!subscribed, "{} {} is subscribed but owned by nobody", name, p),
                }
            }
        }
        Ok(())
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Random joins, heartbeats (some answers lost), leaves, crashes, subscription changes, waits past
    /// sessions and new partitions: no partition ever has two owners, and once every live consumer keeps
    /// heartbeating, every subscribed partition is owned by one of its subscribers.
    #[test]
    fn no_partition_has_two_owners_and_every_subscribed_one_ends_up_owned(
        ops in proptest::collection::vec(op(), 1..60),
        range in any::<bool>(),
    ) {
        let mut sim = Sim::new(if range { Assignor::Range } else { Assignor::Uniform });
        for op in ops {
            sim.apply(op);
            sim.check_owners()?;
            sim.check_written()?;
        }
        sim.settle()?;
        sim.check_written()?;
    }
}

#[test]
fn the_assignor_most_members_ask_for_is_used_and_a_change_of_it_recomputes_the_target() {
    let topics = Topics::with(&[("t1", 3), ("t2", 3)]);
    let s = settings();
    let mut group = ConsumerGroup::new("g");
    let mut a = join("a", &["t1", "t2"]);
    a.server_assignor = Some("range".into());
    group.heartbeat(a, &topics, &s, 0).unwrap();
    group.heartbeat(join("b", &["t1", "t2"]), &topics, &s, 0).unwrap();
    assert_eq!(group.assignor(&s), Assignor::Range, "b asks for none: a's choice stands");
    // Range per topic, in member-id order: a takes 0-1 of each topic, b the last one of each.
    let counts = |g: &ConsumerGroup| (count(&g.target["a"]), count(&g.target["b"]));
    assert_eq!(counts(&group), (4, 2));

    let epoch = group.epoch;
    let mut uniform = beat("a", group.members["a"].current.epoch, None);
    uniform.server_assignor = Some("uniform".into());
    group.heartbeat(uniform, &topics, &s, 1).unwrap();
    assert_eq!(group.assignor(&s), Assignor::Uniform);
    assert!(group.epoch > epoch);
    assert_eq!(counts(&group), (3, 3));
}
