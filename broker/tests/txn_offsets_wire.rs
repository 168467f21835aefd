//! TxnOffsetCommit over the wire against the real binary: the group checks of KIP-447 (a zombie's stale
//! generation, an unknown member, a generation of a group the coordinator does not know), the request's
//! own checks (group id, unknown and internal topics, producer id), and that a write the partition
//! refuses leaves nothing pending: OffsetFetch with `require_stable` then answers without
//! UNSTABLE_OFFSET_COMMIT; and a written offset stays UNSTABLE_OFFSET_COMMIT (pending, its transaction
//! open) for the coordinator that replays it after a SIGKILL.

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::requests::{create, find_coordinator, name};
use common::{Broker, receive, send};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::txn_offset_commit_request::{
    TxnOffsetCommitRequestPartition, TxnOffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    ApiKey, GroupId, JoinGroupRequest, OffsetFetchRequest, ProducerId, ResponseKind, TransactionalId,
    TxnOffsetCommitRequest,
};
use kafka_protocol::protocol::{Encodable, StrBytes};

const TOPIC: &str = "orders";

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

fn call<T: Encodable>(stream: &mut TcpStream, api: ApiKey, version: i16, body: &T) -> ResponseKind {
    send(stream, api, version, 7, body);
    receive(stream, api, version).1
}

/// A TxnOffsetCommit v3 of partition 0 of `topic` for producer 1000 at epoch 0.
fn txn_commit(group: &str, topic: &str, member: &str, generation: i32) -> TxnOffsetCommitRequest {
    TxnOffsetCommitRequest::default()
        .with_transactional_id(TransactionalId(s("tx")))
        .with_group_id(GroupId(s(group)))
        .with_producer_id(ProducerId(1000))
        .with_producer_epoch(0)
        .with_generation_id(generation)
        .with_member_id(s(member))
        .with_topics(vec![TxnOffsetCommitRequestTopic::default().with_name(name(topic)).with_partitions(vec![
            TxnOffsetCommitRequestPartition::default().with_partition_index(0).with_committed_offset(42),
        ])])
}

/// The error of each partition.
fn send_txn_commit(stream: &mut TcpStream, version: i16, request: &TxnOffsetCommitRequest) -> Vec<i16> {
    let ResponseKind::TxnOffsetCommit(r) = call(stream, ApiKey::TxnOffsetCommit, version, request) else {
        panic!("wrong response")
    };
    r.topics.iter().flat_map(|t| t.partitions.iter().map(|p| p.error_code)).collect()
}

/// [`send_txn_commit`], sent again while the coordinator's partition is loading (up to 30 s).
fn txn_commit_when_loaded(stream: &mut TcpStream, version: i16, request: &TxnOffsetCommitRequest) -> Vec<i16> {
    let loading = [ResponseError::CoordinatorLoadInProgress.code(), ResponseError::NotCoordinator.code()];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let errors = send_txn_commit(stream, version, request);
        if !errors.iter().any(|e| loading.contains(e)) || Instant::now() > deadline {
            return errors;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn join(stream: &mut TcpStream, group: &str) -> (String, i32) {
    let request = JoinGroupRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_session_timeout_ms(10_000)
        .with_rebalance_timeout_ms(10_000)
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![JoinGroupRequestProtocol::default().with_name(s("range")).with_metadata(Bytes::new())]);
    // v4+: the first JoinGroup is answered MEMBER_ID_REQUIRED with the id to join with.
    let ResponseKind::JoinGroup(first) = call(stream, ApiKey::JoinGroup, 5, &request) else { panic!() };
    assert_eq!(first.error_code, ResponseError::MemberIdRequired.code());
    let again = request.with_member_id(first.member_id);
    let ResponseKind::JoinGroup(joined) = call(stream, ApiKey::JoinGroup, 5, &again) else { panic!() };
    assert_eq!(joined.error_code, 0);
    (joined.member_id.as_str().to_string(), joined.generation_id)
}

/// OffsetFetch v7 (require_stable) of partition 0: the partition's error and offset.
fn fetch_stable(stream: &mut TcpStream, group: &str) -> (i16, i16, i64) {
    let request = OffsetFetchRequest::default().with_group_id(GroupId(s(group))).with_require_stable(true).with_topics(
        Some(vec![OffsetFetchRequestTopic::default().with_name(name(TOPIC)).with_partition_indexes(vec![0])]),
    );
    let ResponseKind::OffsetFetch(r) = call(stream, ApiKey::OffsetFetch, 7, &request) else { panic!() };
    // A group-level error (the coordinator loading) comes without partitions.
    match r.topics.first().and_then(|t| t.partitions.first()) {
        Some(p) => (r.error_code, p.error_code, p.committed_offset),
        None => (r.error_code, 0, -1),
    }
}

#[test]
fn txn_offset_commit_fences_stale_generations_and_unknown_members_and_checks_its_request() {
    let broker = Broker::start_with(
        1,
        &["--set", "offsets.topic.num.partitions=3", "--set", "group.initial.rebalance.delay.ms=0"],
    );
    let mut st = broker.connect();
    assert_eq!(create(&mut st, TOPIC, 2, 1, &[]), 0);
    assert_eq!(find_coordinator(&mut st, "g"), 0);
    let code = |e: ResponseError| e.code();

    // A generation of a group the coordinator does not know: from before a move, refused.
    let unknown_group = txn_commit_when_loaded(&mut st, 3, &txn_commit("g", TOPIC, "m", 4));
    assert_eq!(unknown_group, vec![code(ResponseError::IllegalGeneration)]);

    let (member, generation) = join(&mut st, "g");
    let zombie = send_txn_commit(&mut st, 3, &txn_commit("g", TOPIC, &member, generation - 1));
    assert_eq!(zombie, vec![code(ResponseError::IllegalGeneration)], "a zombie of the previous generation");
    let stranger = send_txn_commit(&mut st, 3, &txn_commit("g", TOPIC, "ghost", generation));
    assert_eq!(stranger, vec![code(ResponseError::UnknownMemberId)]);

    // The request's own checks, before the coordinator.
    assert_eq!(send_txn_commit(&mut st, 3, &txn_commit("", TOPIC, "", -1)), vec![code(ResponseError::InvalidGroupId)]);
    let unknown = send_txn_commit(&mut st, 3, &txn_commit("g", "no-such-topic", &member, generation));
    assert_eq!(unknown, vec![code(ResponseError::UnknownTopicOrPartition)]);
    let internal = send_txn_commit(&mut st, 3, &txn_commit("g", "__consumer_offsets", &member, generation));
    assert_eq!(internal, vec![code(ResponseError::UnknownTopicOrPartition)]);
    let no_producer = txn_commit("g", TOPIC, &member, generation).with_producer_id(ProducerId(-1));
    assert_eq!(send_txn_commit(&mut st, 3, &no_producer), vec![code(ResponseError::InvalidRequest)]);

    // The member's commit, and v0's without group metadata, pass the group check; they are then written,
    // or refused by the partition while it does not take transactional batches from the coordinator.
    let fenced = [ResponseError::IllegalGeneration, ResponseError::UnknownMemberId, ResponseError::FencedInstanceId];
    let mut written = false;
    for (version, member, generation) in [(3, member.as_str(), generation), (0, "", -1)] {
        let errors = send_txn_commit(&mut st, version, &txn_commit("g", TOPIC, member, generation));
        assert!(!fenced.iter().any(|e| errors == vec![e.code()]), "v{version} passes the group check: {errors:?}");
        written |= errors == vec![0];
    }

    // No marker: a written offset is pending, never shown; require_stable says so.
    let (group_error, partition_error, offset) = fetch_stable(&mut st, "g");
    assert_eq!((group_error, offset), (0, -1));
    let expected = if written { code(ResponseError::UnstableOffsetCommit) } else { 0 };
    assert_eq!(partition_error, expected, "written: {written}");
}

#[test]
fn pending_transactional_offsets_are_unstable_and_stay_so_after_a_sigkill_and_reload() {
    let data = tempfile::tempdir().unwrap();
    let extra = ["--set", "offsets.topic.num.partitions=3", "--set", "group.initial.rebalance.delay.ms=0"];
    let broker = Broker::start_in(data.path(), 1, &extra);
    let port = broker.port;
    let mut st = broker.connect();
    assert_eq!(create(&mut st, TOPIC, 2, 1, &[]), 0);
    assert_eq!(find_coordinator(&mut st, "g"), 0);
    // From outside any group (v0 carries no group metadata), as a producer that assigns itself.
    assert_eq!(txn_commit_when_loaded(&mut st, 0, &txn_commit("g", TOPIC, "", -1)), vec![0]);
    let unstable = ResponseError::UnstableOffsetCommit.code();
    assert_eq!(fetch_stable(&mut st, "g"), (0, unstable, -1));
    broker.kill();

    // The new coordinator replays the transactional batch: still pending, no marker yet.
    let broker = Broker::start_at(data.path(), port, 1, &extra, None);
    let mut st = broker.connect();
    assert_eq!(find_coordinator(&mut st, "g"), 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let answer = loop {
        let answer = fetch_stable(&mut st, "g");
        let loading = [ResponseError::CoordinatorLoadInProgress.code(), ResponseError::NotCoordinator.code()];
        if !loading.contains(&answer.0) || Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(answer, (0, unstable, -1));
}
