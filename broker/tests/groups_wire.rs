//! Consumer group APIs over the wire against the real binary: the coordinator found, a member joining,
//! syncing, heartbeating and committing, Kafka's fencing errors for stale and unknown members and for a
//! malformed JoinGroup (none of which disturbs the group), commits from outside the group, offsets
//! listed, described, deleted; the offsets topic internal and out of clients' reach; committed offsets
//! kept across a SIGKILL of the broker; a consumer-protocol member's commits and fetches checked against its
//! member epoch; a group id changing protocol only while it has no members; an empty group keeping its
//! protocol type, also across a restart.

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::requests::{batch, create, name, produce_request};
use common::{Broker, receive, send};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::leave_group_request::MemberIdentity;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_commit_request::{OffsetCommitRequestPartition, OffsetCommitRequestTopic};
use kafka_protocol::messages::offset_delete_request::{OffsetDeleteRequestPartition, OffsetDeleteRequestTopic};
use kafka_protocol::messages::offset_fetch_request::{OffsetFetchRequestGroup, OffsetFetchRequestTopics};
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::{
    ApiKey, ConsumerGroupHeartbeatRequest, DeleteGroupsRequest, DeleteTopicsRequest, DescribeGroupsRequest,
    FindCoordinatorRequest, GroupId, HeartbeatRequest, JoinGroupRequest, JoinGroupResponse, LeaveGroupRequest,
    ListGroupsRequest, MetadataRequest, OffsetCommitRequest, OffsetDeleteRequest, OffsetFetchRequest,
    OffsetFetchResponse, ResponseKind, SyncGroupRequest,
};
use kafka_protocol::protocol::{Encodable, StrBytes};

const TOPIC: &str = "orders";

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

fn gid(text: &str) -> GroupId {
    GroupId(s(text))
}

fn call<T: Encodable>(stream: &mut TcpStream, api: ApiKey, version: i16, body: &T) -> ResponseKind {
    send(stream, api, version, 7, body);
    receive(stream, api, version).1
}

/// Retries `attempt` while the coordinator is being created or loaded (errors clients retry).
fn until_coordinated<T>(mut attempt: impl FnMut() -> (i16, T)) -> (i16, T) {
    let retriable = [
        ResponseError::CoordinatorNotAvailable.code(),
        ResponseError::CoordinatorLoadInProgress.code(),
        ResponseError::NotCoordinator.code(),
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (code, value) = attempt();
        if !retriable.contains(&code) || Instant::now() > deadline {
            return (code, value);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// FindCoordinator v3 for `group` until it is answered (the first ask creates the offsets topic).
fn find_coordinator(stream: &mut TcpStream, group: &str) {
    assert_eq!(common::requests::find_coordinator(stream, group), 0);
}

fn join(stream: &mut TcpStream, group: &str, member: &str, protocols: &[(&str, &[u8])]) -> JoinGroupResponse {
    let request = JoinGroupRequest::default()
        .with_group_id(gid(group))
        .with_session_timeout_ms(10_000)
        .with_rebalance_timeout_ms(10_000)
        .with_member_id(s(member))
        .with_protocol_type(s("consumer"))
        .with_protocols(
            protocols
                .iter()
                .map(|(n, m)| {
                    JoinGroupRequestProtocol::default().with_name(s(n)).with_metadata(Bytes::copy_from_slice(m))
                })
                .collect(),
        );
    let ResponseKind::JoinGroup(r) = call(stream, ApiKey::JoinGroup, 5, &request) else { panic!("wrong response") };
    r
}

fn heartbeat(stream: &mut TcpStream, group: &str, member: &str, generation: i32) -> i16 {
    let request =
        HeartbeatRequest::default().with_group_id(gid(group)).with_member_id(s(member)).with_generation_id(generation);
    let ResponseKind::Heartbeat(r) = call(stream, ApiKey::Heartbeat, 4, &request) else { panic!("wrong response") };
    r.error_code
}

/// Commits `offset` for partitions 0 and 1 of [`TOPIC`]; the error of each.
fn commit(stream: &mut TcpStream, group: &str, member: &str, generation: i32, offset: i64) -> Vec<i16> {
    commit_v(stream, 8, group, member, generation, offset)
}

/// [`commit`] at a given OffsetCommit version.
fn commit_v(stream: &mut TcpStream, version: i16, group: &str, member: &str, epoch: i32, offset: i64) -> Vec<i16> {
    let partitions = (0..2)
        .map(|p| {
            OffsetCommitRequestPartition::default()
                .with_partition_index(p)
                .with_committed_offset(offset + p as i64)
                .with_committed_leader_epoch(-1)
                .with_committed_metadata(Some(s("meta")))
        })
        .collect();
    let request = OffsetCommitRequest::default()
        .with_group_id(gid(group))
        .with_generation_id_or_member_epoch(epoch)
        .with_member_id(s(member))
        .with_topics(vec![OffsetCommitRequestTopic::default().with_name(name(TOPIC)).with_partitions(partitions)]);
    let ResponseKind::OffsetCommit(r) = call(stream, ApiKey::OffsetCommit, version, &request) else {
        panic!("wrong response")
    };
    r.topics.iter().flat_map(|t| t.partitions.iter().map(|p| p.error_code)).collect()
}

/// OffsetDelete of partition 0 of [`TOPIC`]: the group's error and the partition's.
fn delete_offset(stream: &mut TcpStream, group: &str) -> (i16, i16) {
    let request = OffsetDeleteRequest::default().with_group_id(gid(group)).with_topics(vec![
        OffsetDeleteRequestTopic::default()
            .with_name(name(TOPIC))
            .with_partitions(vec![OffsetDeleteRequestPartition::default().with_partition_index(0)]),
    ]);
    let ResponseKind::OffsetDelete(r) = call(stream, ApiKey::OffsetDelete, 0, &request) else {
        panic!("wrong response")
    };
    (r.error_code, r.topics[0].partitions[0].error_code)
}

/// OffsetFetch v8 for several groups, partitions 0 and 1 of [`TOPIC`].
fn fetch_offsets(stream: &mut TcpStream, groups: &[&str]) -> OffsetFetchResponse {
    let request = OffsetFetchRequest::default().with_groups(groups.iter().map(|g| fetch_group(g)).collect());
    let ResponseKind::OffsetFetch(r) = call(stream, ApiKey::OffsetFetch, 8, &request) else { panic!("wrong response") };
    r
}

fn fetch_group(group: &str) -> OffsetFetchRequestGroup {
    OffsetFetchRequestGroup::default().with_group_id(gid(group)).with_topics(Some(vec![
        OffsetFetchRequestTopics::default().with_name(name(TOPIC)).with_partition_indexes(vec![0, 1]),
    ]))
}

/// OffsetFetch v9 for one group, asked as `member` at `epoch`: the group's error and offsets.
fn fetch_offsets_as(stream: &mut TcpStream, group: &str, member: Option<&str>, epoch: i32) -> (i16, Vec<i64>) {
    let asked = fetch_group(group).with_member_id(member.map(s)).with_member_epoch(epoch);
    let request = OffsetFetchRequest::default().with_groups(vec![asked]);
    let ResponseKind::OffsetFetch(r) = call(stream, ApiKey::OffsetFetch, 9, &request) else { panic!("wrong response") };
    committed(&r, group)
}

/// ConsumerGroupHeartbeat v1 for `member` subscribed to [`TOPIC`]: the answer's error, epoch and how
/// many partitions it assigns (`None`: no assignment in the answer).
fn consumer_heartbeat(stream: &mut TcpStream, group: &str, member: &str, epoch: i32) -> (i16, i32, Option<usize>) {
    let mut request = ConsumerGroupHeartbeatRequest::default()
        .with_group_id(gid(group))
        .with_member_id(s(member))
        .with_member_epoch(epoch);
    if epoch == 0 {
        // A join says everything: the subscription, the timeout, and that it owns nothing.
        request = request
            .with_rebalance_timeout_ms(10_000)
            .with_subscribed_topic_names(Some(vec![name(TOPIC)]))
            .with_topic_partitions(Some(Vec::new()));
    }
    let ResponseKind::ConsumerGroupHeartbeat(r) = call(stream, ApiKey::ConsumerGroupHeartbeat, 1, &request) else {
        panic!("wrong response")
    };
    let assigned = r.assignment.as_ref().map(|a| a.topic_partitions.iter().map(|t| t.partitions.len()).sum());
    (r.error_code, r.member_epoch, assigned)
}

/// The committed offsets of partitions 0 and 1 of one group in an OffsetFetch v8 answer.
fn committed(r: &OffsetFetchResponse, group: &str) -> (i16, Vec<i64>) {
    let g = r.groups.iter().find(|g| g.group_id.0.as_str() == group).expect("the group is answered");
    (g.error_code, g.topics.iter().flat_map(|t| t.partitions.iter().map(|p| p.committed_offset)).collect())
}

fn describe(stream: &mut TcpStream, group: &str) -> (i16, String, usize) {
    let request = DescribeGroupsRequest::default().with_groups(vec![gid(group)]);
    let ResponseKind::DescribeGroups(r) = call(stream, ApiKey::DescribeGroups, 6, &request) else {
        panic!("wrong response")
    };
    let g = &r.groups[0];
    (g.error_code, g.group_state.as_str().to_string(), g.members.len())
}

fn list(stream: &mut TcpStream, states: &[&str]) -> Vec<(String, String)> {
    let request = ListGroupsRequest::default().with_states_filter(states.iter().map(|x| s(x)).collect());
    let ResponseKind::ListGroups(r) = call(stream, ApiKey::ListGroups, 4, &request) else { panic!("wrong response") };
    assert_eq!(r.error_code, 0);
    r.groups.iter().map(|g| (g.group_id.0.as_str().to_string(), g.group_state.as_str().to_string())).collect()
}

fn start() -> Broker {
    Broker::start_with(2, &["--set", "offsets.topic.num.partitions=5", "--set", "group.initial.rebalance.delay.ms=0"])
}

#[test]
fn a_member_joins_syncs_commits_and_leaves_and_stale_or_unknown_members_are_fenced() {
    let broker = start();
    let mut st = broker.connect();
    assert_eq!(create(&mut st, TOPIC, 2, 1, &[]), 0);

    // FindCoordinator v4, two keys at once: answered by this broker once the offsets topic exists.
    let find = FindCoordinatorRequest::default().with_key_type(0).with_coordinator_keys(vec![s("g1"), s("g2")]);
    let (code, coordinators) = until_coordinated(|| {
        let ResponseKind::FindCoordinator(r) = call(&mut st, ApiKey::FindCoordinator, 4, &find) else {
            panic!("wrong response")
        };
        (r.coordinators.iter().map(|c| c.error_code).max().unwrap_or(0), r.coordinators)
    });
    assert_eq!(code, 0, "{coordinators:?}");
    assert_eq!(coordinators.len(), 2);
    assert!(coordinators.iter().all(|c| c.node_id.0 == 1 && c.port == broker.port as i32), "{coordinators:?}");

    // The offsets topic is internal.
    let metadata = MetadataRequest::default()
        .with_topics(Some(vec![MetadataRequestTopic::default().with_name(Some(name("__consumer_offsets")))]));
    let ResponseKind::Metadata(m) = call(&mut st, ApiKey::Metadata, 12, &metadata) else { panic!("wrong response") };
    assert!(m.topics[0].is_internal, "{:?}", m.topics[0]);
    assert_eq!(m.topics[0].partitions.len(), 5);

    // Join v5: a new member is given its id first (MEMBER_ID_REQUIRED), then joins with it.
    let (code, first) = until_coordinated(|| {
        let r = join(&mut st, "g1", "", &[("range", b"r-meta")]);
        (r.error_code, r)
    });
    assert_eq!(code, ResponseError::MemberIdRequired.code());
    // Before v7 the protocol name is not nullable: a refusal says "" (Java clients reject a null).
    assert_eq!(first.protocol_name.as_ref().map(|p| p.as_str()), Some(""));
    let member = first.member_id.as_str().to_string();
    assert!(!member.is_empty());
    let joined = join(&mut st, "g1", &member, &[("range", b"r-meta")]);
    assert_eq!(joined.error_code, 0);
    assert_eq!(joined.generation_id, 1);
    assert_eq!(joined.leader.as_str(), member);
    assert_eq!(joined.protocol_name.as_ref().map(|p| p.as_str()), Some("range"));
    assert_eq!(joined.members.len(), 1);
    assert_eq!(&joined.members[0].metadata[..], b"r-meta");

    let sync = SyncGroupRequest::default()
        .with_group_id(gid("g1"))
        .with_generation_id(1)
        .with_member_id(s(&member))
        .with_assignments(vec![
            SyncGroupRequestAssignment::default()
                .with_member_id(s(&member))
                .with_assignment(Bytes::from_static(b"all of it")),
        ]);
    let ResponseKind::SyncGroup(synced) = call(&mut st, ApiKey::SyncGroup, 4, &sync) else { panic!("wrong response") };
    assert_eq!(synced.error_code, 0);
    assert_eq!(&synced.assignment[..], b"all of it");
    assert_eq!(heartbeat(&mut st, "g1", &member, 1), 0);

    // Commits: from the member of the current generation; a stale generation and an unknown member are
    // refused with Kafka's errors.
    assert_eq!(commit(&mut st, "g1", &member, 1, 40), vec![0, 0]);
    let stale = ResponseError::IllegalGeneration.code();
    assert_eq!(commit(&mut st, "g1", &member, 0, 99), vec![stale, stale]);
    let unknown = ResponseError::UnknownMemberId.code();
    assert_eq!(commit(&mut st, "g1", "nobody", 1, 99), vec![unknown, unknown]);
    assert_eq!(heartbeat(&mut st, "g1", "nobody", 1), unknown);
    assert_eq!(heartbeat(&mut st, "g1", &member, 0), stale);

    // A malformed JoinGroup (the same protocol twice) is refused and changes nothing.
    let malformed = join(&mut st, "g1", &member, &[("range", b"a"), ("range", b"b")]);
    assert_eq!(malformed.error_code, ResponseError::InvalidRequest.code());
    assert_eq!(heartbeat(&mut st, "g1", &member, 1), 0, "the member is undisturbed");
    assert_eq!(describe(&mut st, "g1"), (0, "Stable".to_string(), 1));

    // OffsetFetch v8: several groups at once; one that never committed gets -1.
    let fetched = fetch_offsets(&mut st, &["g1", "g-none"]);
    assert_eq!(committed(&fetched, "g1"), (0, vec![40, 41]), "refused commits changed nothing");
    assert_eq!(committed(&fetched, "g-none"), (0, vec![-1, -1]));

    // ListGroups with a state filter.
    assert!(list(&mut st, &["Stable"]).contains(&("g1".to_string(), "Stable".to_string())));
    assert!(!list(&mut st, &["Empty"]).iter().any(|(g, _)| g == "g1"));

    // A group with members cannot be deleted.
    let delete = DeleteGroupsRequest::default().with_groups_names(vec![gid("g1")]);
    let ResponseKind::DeleteGroups(d) = call(&mut st, ApiKey::DeleteGroups, 2, &delete) else {
        panic!("wrong response")
    };
    assert_eq!(d.results[0].error_code, ResponseError::NonEmptyGroup.code());

    // LeaveGroup v3 (batched): the group is empty; then a client outside the group (assign() and commit,
    // generation -1) may commit.
    leave_classic(&mut st, "g1", &member);
    assert_eq!(describe(&mut st, "g1"), (0, "Empty".to_string(), 0));
    assert_eq!(commit(&mut st, "g1", "", -1, 70), vec![0, 0]);
    assert_eq!(committed(&fetch_offsets(&mut st, &["g1"]), "g1"), (0, vec![70, 71]));

    // OffsetDelete of partition 0, then DeleteGroups: the group is gone.
    assert_eq!(delete_offset(&mut st, "g1"), (0, 0));
    assert_eq!(committed(&fetch_offsets(&mut st, &["g1"]), "g1"), (0, vec![-1, 71]));
    let ResponseKind::DeleteGroups(d) = call(&mut st, ApiKey::DeleteGroups, 2, &delete) else {
        panic!("wrong response")
    };
    assert_eq!(d.results[0].error_code, 0);
    assert_eq!(describe(&mut st, "g1").0, ResponseError::GroupIdNotFound.code());
    assert_eq!(committed(&fetch_offsets(&mut st, &["g1"]), "g1"), (0, vec![-1, -1]));
}

/// KIP-848's checks of a consumer-protocol group's offsets: a member commits and fetches at its current
/// epoch only (STALE_MEMBER_EPOCH otherwise, UNKNOWN_MEMBER_ID for a stranger); a client outside the
/// group fetches always and commits only once the group has no members; the offsets of a topic a
/// member subscribes to are not deleted.
#[test]
fn a_consumer_protocol_member_commits_and_fetches_offsets_at_its_current_epoch_only() {
    let broker = start();
    let mut st = broker.connect();
    assert_eq!(create(&mut st, TOPIC, 2, 1, &[]), 0);
    find_coordinator(&mut st, "cg");
    let member = "m-7c1e0f2a";

    // The only member gets both partitions at once: nobody else holds them.
    let (code, (joined, assigned)) = until_coordinated(|| {
        let (code, epoch, assigned) = consumer_heartbeat(&mut st, "cg", member, 0);
        (code, (epoch, assigned))
    });
    assert_eq!(code, 0);
    assert!(joined >= 1, "{joined}");
    assert_eq!(assigned, Some(2));
    assert_eq!(consumer_heartbeat(&mut st, "cg", member, joined), (0, joined, None));

    // OffsetCommit v9 carries the member epoch: only the current one is taken.
    assert_eq!(commit_v(&mut st, 9, "cg", member, joined, 40), vec![0, 0]);
    let stale = ResponseError::StaleMemberEpoch.code();
    assert_eq!(commit_v(&mut st, 9, "cg", member, joined - 1, 90), vec![stale, stale]);
    assert_eq!(commit_v(&mut st, 9, "cg", "stranger", joined, 90), vec![ResponseError::UnknownMemberId.code(); 2]);
    // From outside the group (epoch -1) while it has a member: refused too.
    let outside = commit_v(&mut st, 9, "cg", "", -1, 90);
    assert_eq!(outside, vec![ResponseError::UnknownMemberId.code(); 2]);

    // OffsetFetch v9 likewise, and the offsets are the member's own commit.
    assert_eq!(fetch_offsets_as(&mut st, "cg", Some(member), joined), (0, vec![40, 41]));
    assert_eq!(fetch_offsets_as(&mut st, "cg", Some(member), joined - 1), (stale, vec![]));
    assert_eq!(fetch_offsets_as(&mut st, "cg", Some(member), joined + 1), (stale, vec![]));
    let unknown = ResponseError::UnknownMemberId.code();
    assert_eq!(fetch_offsets_as(&mut st, "cg", Some("stranger"), joined), (unknown, vec![]));
    // Naming no member but an epoch is not "outside the group".
    assert_eq!(fetch_offsets_as(&mut st, "cg", None, joined), (unknown, vec![]));
    // An admin client names neither: always answered, as are older versions.
    assert_eq!(fetch_offsets_as(&mut st, "cg", None, -1), (0, vec![40, 41]));
    assert_eq!(committed(&fetch_offsets(&mut st, &["cg"]), "cg"), (0, vec![40, 41]));

    // A refused first heartbeat (v1 needs the client's member id) leaves no group behind.
    let (code, ()) = until_coordinated(|| (consumer_heartbeat(&mut st, "cg-refused", "", 0).0, ()));
    assert_eq!(code, ResponseError::InvalidRequest.code());
    assert!(!list(&mut st, &[]).iter().any(|(g, _)| g == "cg-refused"));

    // The member's topic keeps its offsets: OffsetDelete is refused for it.
    assert_eq!(delete_offset(&mut st, "cg"), (0, ResponseError::GroupSubscribedToTopic.code()));
    assert_eq!(fetch_offsets_as(&mut st, "cg", None, -1), (0, vec![40, 41]));

    // A heartbeat from an epoch ahead of the member's is fenced.
    let (code, _, _) = consumer_heartbeat(&mut st, "cg", member, joined + 5);
    assert_eq!(code, ResponseError::FencedMemberEpoch.code());
    // The member leaves; the group, empty now, takes commits from outside it.
    assert_eq!(consumer_heartbeat(&mut st, "cg", member, -1).0, 0);
    assert_eq!(commit_v(&mut st, 9, "cg", "", -1, 70), vec![0, 0]);
    assert_eq!(fetch_offsets_as(&mut st, "cg", None, -1), (0, vec![70, 71]));
    assert_eq!(fetch_offsets_as(&mut st, "cg", Some(member), joined), (unknown, vec![]));
    // Nobody subscribes to the topic now: its offsets may go.
    assert_eq!(delete_offset(&mut st, "cg"), (0, 0));
    assert_eq!(fetch_offsets_as(&mut st, "cg", None, -1), (0, vec![-1, 71]));
}

/// The group type of `group` as ListGroups v5 gives it ("classic", "consumer"), if listed.
fn group_type(stream: &mut TcpStream, group: &str) -> Option<String> {
    let ResponseKind::ListGroups(l) = call(stream, ApiKey::ListGroups, 5, &ListGroupsRequest::default()) else {
        panic!("wrong response")
    };
    l.groups.iter().find(|g| g.group_id.0.as_str() == group).map(|g| g.group_type.as_str().to_string())
}

fn leave_classic(stream: &mut TcpStream, group: &str, member: &str) {
    let leave = LeaveGroupRequest::default()
        .with_group_id(gid(group))
        .with_members(vec![MemberIdentity::default().with_member_id(s(member))]);
    let ResponseKind::LeaveGroup(left) = call(stream, ApiKey::LeaveGroup, 3, &leave) else { panic!("wrong response") };
    assert_eq!((left.error_code, left.members[0].error_code), (0, 0));
}

/// A group id is of one protocol at a time: a consumer-protocol heartbeat does not join a classic group
/// with members, but takes one over once it is empty, offsets and all; a JoinGroup is refused
/// INCONSISTENT_GROUP_PROTOCOL while the consumer-protocol group has members, and takes it back once it
/// has none.
#[test]
fn an_empty_group_changes_protocol_and_one_with_members_keeps_its_own() {
    let broker = start();
    let mut st = broker.connect();
    assert_eq!(create(&mut st, TOPIC, 2, 1, &[]), 0);
    find_coordinator(&mut st, "mig");

    let (code, first) = until_coordinated(|| {
        let r = join(&mut st, "mig", "", &[("range", b"r-meta")]);
        (r.error_code, r)
    });
    assert_eq!(code, ResponseError::MemberIdRequired.code());
    let classic = first.member_id.as_str().to_string();
    assert_eq!(join(&mut st, "mig", &classic, &[("range", b"r-meta")]).error_code, 0);
    assert_eq!(group_type(&mut st, "mig").as_deref(), Some("classic"));
    let (code, _, _) = consumer_heartbeat(&mut st, "mig", "m-new", 0);
    assert_eq!(code, ResponseError::GroupIdNotFound.code(), "a classic group with a member");

    leave_classic(&mut st, "mig", &classic);
    assert_eq!(commit(&mut st, "mig", "", -1, 5), vec![0, 0]);
    let (code, joined, assigned) = consumer_heartbeat(&mut st, "mig", "m-new", 0);
    assert_eq!((code, assigned), (0, Some(2)), "the empty classic group is taken over");
    assert_eq!(group_type(&mut st, "mig").as_deref(), Some("consumer"));
    assert_eq!(fetch_offsets_as(&mut st, "mig", Some("m-new"), joined), (0, vec![5, 6]), "its offsets stay");

    let refused = join(&mut st, "mig", "", &[("range", b"r-meta")]);
    assert_eq!(refused.error_code, ResponseError::InconsistentGroupProtocol.code());
    assert_eq!(consumer_heartbeat(&mut st, "mig", "m-new", -1).0, 0);
    let back = join(&mut st, "mig", "", &[("range", b"r-meta")]);
    assert_eq!(back.error_code, ResponseError::MemberIdRequired.code(), "the empty group is classic again");
    assert_eq!(join(&mut st, "mig", back.member_id.as_str(), &[("range", b"r-meta")]).error_code, 0);
    assert_eq!(group_type(&mut st, "mig").as_deref(), Some("classic"));
    assert_eq!(committed(&fetch_offsets(&mut st, &["mig"]), "mig"), (0, vec![5, 6]));
}

/// The Java client (3.x and 4.x, classic protocol) negotiates each API's newest version: a group's life at
/// exactly those versions (FindCoordinator v6, JoinGroup v9, SyncGroup v5, Heartbeat v4, OffsetCommit v9,
/// OffsetFetch v9, LeaveGroup v5 with a reason, DescribeGroups v6, ListGroups v5). The Java client itself
/// cannot be run here (no Maven registry is reachable), so its requests are made by hand.
#[test]
fn a_group_lives_through_the_newest_versions_the_java_client_sends() {
    use kafka_protocol::messages::{DescribeGroupsResponse, JoinGroupResponse, SyncGroupResponse};
    let broker = start();
    let mut st = broker.connect();
    assert_eq!(create(&mut st, TOPIC, 2, 1, &[]), 0);
    let find = FindCoordinatorRequest::default().with_key_type(0).with_coordinator_keys(vec![s("java")]);
    let (code, _) = until_coordinated(|| {
        let ResponseKind::FindCoordinator(r) = call(&mut st, ApiKey::FindCoordinator, 6, &find) else { panic!() };
        (r.coordinators[0].error_code, ())
    });
    assert_eq!(code, 0);

    let join = |st: &mut TcpStream, member: &str| -> JoinGroupResponse {
        let request = JoinGroupRequest::default()
            .with_group_id(gid("java"))
            .with_session_timeout_ms(45_000)
            .with_rebalance_timeout_ms(300_000)
            .with_member_id(s(member))
            .with_protocol_type(s("consumer"))
            .with_reason(Some(s("rebalance failed due to MemberIdRequiredException")))
            .with_protocols(vec![
                JoinGroupRequestProtocol::default().with_name(s("range")).with_metadata(Bytes::from_static(b"r")),
                JoinGroupRequestProtocol::default()
                    .with_name(s("cooperative-sticky"))
                    .with_metadata(Bytes::from_static(b"c")),
            ]);
        let ResponseKind::JoinGroup(r) = call(st, ApiKey::JoinGroup, 9, &request) else { panic!() };
        r
    };
    let (code, first) = until_coordinated(|| {
        let r = join(&mut st, "");
        (r.error_code, r)
    });
    assert_eq!(code, ResponseError::MemberIdRequired.code());
    let member = first.member_id.as_str().to_string();
    let joined = join(&mut st, &member);
    assert_eq!(joined.error_code, 0);
    assert_eq!(joined.protocol_type.as_ref().map(|p| p.as_str()), Some("consumer"), "v7+ names the type");
    assert_eq!(joined.protocol_name.as_ref().map(|p| p.as_str()), Some("range"), "the first protocol listed");
    assert!(!joined.skip_assignment, "v9: the leader assigns");
    assert_eq!(joined.leader.as_str(), member);

    let sync = SyncGroupRequest::default()
        .with_group_id(gid("java"))
        .with_generation_id(joined.generation_id)
        .with_member_id(s(&member))
        .with_protocol_type(Some(s("consumer")))
        .with_protocol_name(Some(s("range")))
        .with_assignments(vec![
            SyncGroupRequestAssignment::default().with_member_id(s(&member)).with_assignment(Bytes::from_static(b"a")),
        ]);
    let ResponseKind::SyncGroup(synced) = call(&mut st, ApiKey::SyncGroup, 5, &sync) else { panic!() };
    let synced: SyncGroupResponse = synced;
    assert_eq!(synced.error_code, 0);
    assert_eq!((synced.protocol_type.as_deref(), synced.protocol_name.as_deref()), (Some("consumer"), Some("range")));
    assert_eq!(&synced.assignment[..], b"a");
    assert_eq!(heartbeat(&mut st, "java", &member, joined.generation_id), 0);

    let commit = OffsetCommitRequest::default()
        .with_group_id(gid("java"))
        .with_generation_id_or_member_epoch(joined.generation_id)
        .with_member_id(s(&member))
        .with_topics(vec![OffsetCommitRequestTopic::default().with_name(name(TOPIC)).with_partitions(vec![
            OffsetCommitRequestPartition::default()
                .with_partition_index(1)
                .with_committed_offset(17)
                .with_committed_leader_epoch(0)
                .with_committed_metadata(Some(s(""))),
        ])]);
    let ResponseKind::OffsetCommit(c) = call(&mut st, ApiKey::OffsetCommit, 9, &commit) else { panic!() };
    assert_eq!(c.topics[0].partitions[0].error_code, 0);
    let fetch = OffsetFetchRequest::default().with_require_stable(true).with_groups(vec![
        OffsetFetchRequestGroup::default()
            .with_group_id(gid("java"))
            .with_member_id(Some(s(&member)))
            .with_member_epoch(-1)
            .with_topics(Some(vec![
                OffsetFetchRequestTopics::default().with_name(name(TOPIC)).with_partition_indexes(vec![0, 1]),
            ])),
    ]);
    let ResponseKind::OffsetFetch(f) = call(&mut st, ApiKey::OffsetFetch, 9, &fetch) else { panic!() };
    let offsets: Vec<(i64, i32)> =
        f.groups[0].topics[0].partitions.iter().map(|p| (p.committed_offset, p.committed_leader_epoch)).collect();
    assert_eq!((f.groups[0].error_code, offsets), (0, vec![(-1, -1), (17, 0)]));

    let describe =
        DescribeGroupsRequest::default().with_groups(vec![gid("java")]).with_include_authorized_operations(true);
    let ResponseKind::DescribeGroups(d) = call(&mut st, ApiKey::DescribeGroups, 6, &describe) else { panic!() };
    let d: DescribeGroupsResponse = d;
    assert_eq!((d.groups[0].error_code, d.groups[0].group_state.as_str()), (0, "Stable"));
    assert_eq!(d.groups[0].members[0].member_id.as_str(), member);
    let listed = ListGroupsRequest::default().with_types_filter(vec![s("classic")]);
    let ResponseKind::ListGroups(l) = call(&mut st, ApiKey::ListGroups, 5, &listed) else { panic!() };
    assert!(l.groups.iter().any(|g| g.group_id.0.as_str() == "java" && g.group_type.as_str() == "classic"), "{l:?}");

    let leave = LeaveGroupRequest::default().with_group_id(gid("java")).with_members(vec![
        MemberIdentity::default().with_member_id(s(&member)).with_reason(Some(s("the consumer is being closed"))),
    ]);
    let ResponseKind::LeaveGroup(left) = call(&mut st, ApiKey::LeaveGroup, 5, &leave) else { panic!() };
    assert_eq!((left.error_code, left.members[0].error_code), (0, 0));
    assert_eq!(describe_state(&mut st, "java"), "Empty");
}

fn describe_state(stream: &mut TcpStream, group: &str) -> String {
    describe(stream, group).1
}

#[test]
fn the_offsets_topic_is_out_of_reach_of_client_produce_create_and_delete() {
    let broker = start();
    let mut st = broker.connect();
    assert_eq!(create(&mut st, TOPIC, 2, 1, &[]), 0);
    // A commit from outside any group, once the coordinator is known.
    find_coordinator(&mut st, "g");
    let (code, _) = until_coordinated(|| {
        let errors = commit(&mut st, "g", "", -1, 5);
        (errors[0], errors)
    });
    assert_eq!(code, 0);

    let produce = produce_request("__consumer_offsets", 0, &batch(1, 1, 0), -1);
    let ResponseKind::Produce(p) = call(&mut st, ApiKey::Produce, 9, &produce) else { panic!("wrong response") };
    assert_eq!(p.responses[0].partition_responses[0].error_code, ResponseError::InvalidTopicException.code());

    assert_eq!(create(&mut st, "__consumer_offsets", 3, 1, &[]), ResponseError::InvalidRequest.code());

    let delete =
        DeleteTopicsRequest::default().with_topic_names(vec![name("__consumer_offsets")]).with_timeout_ms(5000);
    let ResponseKind::DeleteTopics(d) = call(&mut st, ApiKey::DeleteTopics, 4, &delete) else {
        panic!("wrong response")
    };
    assert_eq!(d.responses[0].error_code, ResponseError::InvalidTopicException.code());
    // Still there, offsets and all.
    assert_eq!(committed(&fetch_offsets(&mut st, &["g"]), "g"), (0, vec![5, 6]));
}

/// The protocol type DescribeGroups v5 and ListGroups v4 give `group`, and its state.
fn protocol_type(stream: &mut TcpStream, group: &str) -> (String, String, String) {
    let request = DescribeGroupsRequest::default().with_groups(vec![gid(group)]);
    let ResponseKind::DescribeGroups(d) = call(stream, ApiKey::DescribeGroups, 5, &request) else {
        panic!("wrong response")
    };
    assert_eq!(d.groups[0].error_code, 0);
    let ResponseKind::ListGroups(l) = call(stream, ApiKey::ListGroups, 4, &ListGroupsRequest::default()) else {
        panic!("wrong response")
    };
    let listed = l.groups.iter().find(|g| g.group_id.0.as_str() == group).expect("listed");
    let described = &d.groups[0];
    (described.group_state.to_string(), described.protocol_type.to_string(), listed.protocol_type.to_string())
}

/// A consumer group whose last member left is still a consumer group, as in Kafka: DescribeGroups and
/// ListGroups name its protocol type, also after the broker restarts and reloads it from its record.
#[test]
fn an_empty_group_keeps_its_protocol_type_also_after_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let extra = ["--set", "offsets.topic.num.partitions=5", "--set", "group.initial.rebalance.delay.ms=0"];
    let broker = Broker::start_in(data.path(), 2, &extra);
    let port = broker.port;
    let mut st = broker.connect();
    assert_eq!(create(&mut st, TOPIC, 2, 1, &[]), 0);
    find_coordinator(&mut st, "kept");
    let (code, first) = until_coordinated(|| {
        let r = join(&mut st, "kept", "", &[("range", b"r-meta")]);
        (r.error_code, r)
    });
    assert_eq!(code, ResponseError::MemberIdRequired.code());
    let member = first.member_id.as_str().to_string();
    assert_eq!(join(&mut st, "kept", &member, &[("range", b"r-meta")]).error_code, 0);
    let sync = SyncGroupRequest::default().with_group_id(gid("kept")).with_generation_id(1).with_member_id(s(&member));
    let ResponseKind::SyncGroup(synced) = call(&mut st, ApiKey::SyncGroup, 4, &sync) else { panic!("wrong response") };
    assert_eq!(synced.error_code, 0);
    assert_eq!(commit(&mut st, "kept", &member, 1, 7), vec![0, 0]);
    let consumer = |state: &str| (state.to_string(), "consumer".to_string(), "consumer".to_string());
    assert_eq!(protocol_type(&mut st, "kept"), consumer("Stable"));
    leave_classic(&mut st, "kept", &member);
    assert_eq!(protocol_type(&mut st, "kept"), consumer("Empty"), "the last member left");

    broker.terminate();
    let broker = Broker::start_at(data.path(), port, 2, &extra, None);
    let mut st = broker.connect();
    let (code, _) = until_coordinated(|| committed(&fetch_offsets(&mut st, &["kept"]), "kept"));
    assert_eq!(code, 0);
    assert_eq!(protocol_type(&mut st, "kept"), consumer("Empty"), "reloaded from its record");
}

#[test]
fn committed_offsets_survive_a_sigkill_of_the_broker() {
    let data = tempfile::tempdir().unwrap();
    let extra = ["--set", "offsets.topic.num.partitions=5", "--set", "group.initial.rebalance.delay.ms=0"];
    let broker = Broker::start_in(data.path(), 2, &extra);
    let port = broker.port;
    let mut st = broker.connect();
    assert_eq!(create(&mut st, TOPIC, 2, 1, &[]), 0);
    find_coordinator(&mut st, "survivor");
    let (code, _) = until_coordinated(|| {
        let errors = commit(&mut st, "survivor", "", -1, 1234);
        (errors[0], errors)
    });
    assert_eq!(code, 0);
    broker.kill();

    let broker = Broker::start_at(data.path(), port, 2, &extra, None);
    let mut st = broker.connect();
    let (code, offsets) = until_coordinated(|| {
        let r = fetch_offsets(&mut st, &["survivor"]);
        committed(&r, "survivor")
    });
    assert_eq!((code, offsets), (0, vec![1234, 1235]));
}

#[test]
fn offsets_of_a_group_without_members_expire_after_offsets_retention_minutes_and_stay_gone_after_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let extra = [
        "--set",
        "offsets.topic.num.partitions=5",
        "--set",
        "offsets.retention.minutes=1",
        "--set",
        "offsets.retention.check.interval.ms=500",
    ];
    let broker = Broker::start_in(data.path(), 2, &extra);
    let port = broker.port;
    let mut st = broker.connect();
    assert_eq!(create(&mut st, TOPIC, 2, 1, &[]), 0);
    find_coordinator(&mut st, "fleeting");
    let (code, _) = until_coordinated(|| {
        let errors = commit(&mut st, "fleeting", "", -1, 3);
        (errors[0], errors)
    });
    assert_eq!(code, 0);
    let committed_at = Instant::now();
    assert!(list(&mut st, &[]).iter().any(|(g, _)| g == "fleeting"));
    // Kept for the minute, gone soon after.
    loop {
        let offsets = committed(&fetch_offsets(&mut st, &["fleeting"]), "fleeting");
        if offsets == (0, vec![-1, -1]) {
            break;
        }
        assert_eq!(offsets, (0, vec![3, 4]));
        assert!(committed_at.elapsed() < Duration::from_secs(90), "the offsets expire after a minute");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(committed_at.elapsed() >= Duration::from_secs(60), "not before the minute is up");
    // The group, left with nothing, goes too; after a restart it is still gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    while list(&mut st, &[]).iter().any(|(g, _)| g == "fleeting") {
        assert!(Instant::now() < deadline, "the empty group is removed");
        std::thread::sleep(Duration::from_millis(100));
    }
    broker.kill();
    let broker = Broker::start_at(data.path(), port, 2, &extra, None);
    let mut st = broker.connect();
    let (code, offsets) = until_coordinated(|| committed(&fetch_offsets(&mut st, &["fleeting"]), "fleeting"));
    assert_eq!((code, offsets), (0, vec![-1, -1]));
}
