//! The quorum's state machine without any I/O: broker registration and fencing, topic commands, leader
//! election (clean, unclean, preferred), and ISR changes fenced by leader and partition epochs. A random
//! command stream checks the invariants every state must keep.

use std::collections::BTreeMap;

use proptest::prelude::*;
use shardlog_broker::quorum::state::{
    BrokerEndpoint, ClusterState, Command, CommandError, Event, NodeId, PartitionEpoch, UNCLEAN_ELECTION_KEY,
};
use shardlog_storage::LeaderEpoch;
use uuid::Uuid;

mod offline;
mod reassignment;
mod security;

const SESSION_MS: i64 = 9_000;

fn register(id: u32, incarnation: u64, now_ms: i64) -> Command {
    Command::RegisterBroker {
        id: NodeId(id),
        endpoint: BrokerEndpoint { host: "127.0.0.1".into(), port: 9000 + id as u16 },
        incarnation,
        previous_incarnation: None,
        now_ms,
        session_timeout_ms: SESSION_MS,
    }
}

fn create(name: &str, partitions: u32, replication_factor: u16) -> Command {
    Command::CreateTopic {
        assignment: None,
        name: name.into(),
        id: Uuid::from_u128(name.len() as u128 + 1),
        partitions,
        replication_factor,
        configs: BTreeMap::new(),
    }
}

/// A topic of one partition per list, with exactly these replicas.
fn create_assigned(name: &str, lists: &[&[u32]]) -> Command {
    Command::CreateTopic {
        name: name.into(),
        id: Uuid::from_u128(1),
        partitions: lists.len() as u32,
        replication_factor: lists[0].len() as u16,
        configs: BTreeMap::new(),
        assignment: Some(lists.iter().map(|l| ids(l)).collect()),
    }
}

/// The controller's fencing of a broker whose last heartbeat was at `last_heartbeat_ms`.
fn fence_seen(id: u32, incarnation: u64, last_heartbeat_ms: i64) -> Command {
    Command::FenceBroker { id: NodeId(id), incarnation, last_heartbeat_ms }
}

/// Fencing as decided on `state` as it is now.
fn fence_now(state: &ClusterState, id: u32, incarnation: u64) -> Command {
    let seen = state.brokers.get(&NodeId(id)).map_or(0, |b| b.last_heartbeat_ms);
    fence_seen(id, incarnation, seen)
}

/// A state with brokers 1..=n registered (incarnation = id) at time 0.
fn cluster(n: u32) -> ClusterState {
    let mut state = ClusterState::default();
    for id in 1..=n {
        state.apply(&register(id, id as u64, 0)).unwrap();
    }
    state
}

fn ids(v: &[u32]) -> Vec<NodeId> {
    v.iter().map(|&i| NodeId(i)).collect()
}

/// Applies a command that must be refused, and checks that it changed nothing.
fn refused(state: &mut ClusterState, command: Command) -> CommandError {
    let before = state.clone();
    let err = state.apply(&command).expect_err("the command should be refused");
    assert_eq!(*state, before, "a refused command ({err}) changed the state");
    err
}

#[test]
fn a_topic_spreads_over_live_brokers_with_balanced_leaders() {
    let mut state = cluster(3);
    state.apply(&create("orders", 6, 1)).unwrap();
    let topic = &state.topics["orders"];
    let mut per_broker = BTreeMap::new();
    for p in &topic.partitions {
        assert_eq!(p.replicas.len(), 1);
        assert_eq!(p.isr, p.replicas, "a new partition's replicas are all in sync");
        assert_eq!(p.leader, Some(p.replicas[0]), "the preferred replica leads");
        assert_eq!((p.leader_epoch, p.partition_epoch), (LeaderEpoch(0), PartitionEpoch(0)));
        *per_broker.entry(p.replicas[0]).or_insert(0) += 1;
    }
    assert_eq!(per_broker.values().copied().collect::<Vec<_>>(), vec![2, 2, 2], "{per_broker:?}");

    // The next topic continues the round robin, so leadership stays balanced across topics.
    state.apply(&create("payments", 1, 3)).unwrap();
    let p = &state.topics["payments"].partitions[0];
    assert_eq!(p.replicas.len(), 3);
    assert_eq!(p.replicas[0], NodeId(1), "partition 7 of the cluster starts again at the first broker");
}

#[test]
fn topic_commands_refuse_what_kafka_refuses() {
    let mut state = cluster(2);
    state.apply(&create("orders", 2, 2)).unwrap();
    assert_eq!(refused(&mut state, create("orders", 1, 1)).kafka_code(), 36, "TOPIC_ALREADY_EXISTS");
    let err = refused(&mut state, create("wide", 1, 3));
    assert_eq!(err, CommandError::InvalidReplicationFactor { wanted: 3, available: 2 });
    assert_eq!(err.kafka_code(), 38);
    assert_eq!(refused(&mut state, create("empty", 0, 1)).kafka_code(), 37, "INVALID_PARTITIONS");
    let shrink = Command::CreatePartitions { name: "orders".into(), count: 2 };
    assert_eq!(refused(&mut state, shrink).kafka_code(), 37, "the count can only grow");
    let unknown = Command::DeleteTopic { name: "nope".into() };
    assert_eq!(refused(&mut state, unknown).kafka_code(), 3, "UNKNOWN_TOPIC_OR_PARTITION");

    state.apply(&Command::CreatePartitions { name: "orders".into(), count: 5 }).unwrap();
    let topic = &state.topics["orders"];
    assert_eq!(topic.partitions.len(), 5);
    assert!(topic.partitions.iter().all(|p| p.replicas.len() == 2), "new partitions keep the replication factor");

    let configs = BTreeMap::from([("retention.ms".to_string(), "1000".to_string())]);
    state.apply(&Command::AlterConfigs { name: "orders".into(), configs: configs.clone() }).unwrap();
    assert_eq!(state.topics["orders"].configs, configs);
    state.apply(&Command::DeleteTopic { name: "orders".into() }).unwrap();
    assert!(state.topics.is_empty());
}

#[test]
fn a_fenced_leader_is_replaced_by_the_first_live_isr_member_and_leaves_the_isr() {
    let mut state = cluster(3);
    state.apply(&create("orders", 1, 3)).unwrap();
    let before = state.topics["orders"].partitions[0].clone();
    assert_eq!(before.replicas, ids(&[1, 2, 3]));

    let events = state.apply(&fence_now(&state, 1, 1)).unwrap();
    assert!(events.is_empty(), "a clean election is not an event: {events:?}");
    let p = &state.topics["orders"].partitions[0];
    assert_eq!(p.leader, Some(NodeId(2)), "first live ISR member in assignment order");
    assert_eq!(p.isr, ids(&[2, 3]));
    assert_eq!(p.leader_epoch, LeaderEpoch(1));
    assert!(p.partition_epoch > before.partition_epoch);

    // A follower that is fenced just leaves the ISR; the leader stays and its epoch does not move.
    state.apply(&fence_now(&state, 3, 3)).unwrap();
    let p = &state.topics["orders"].partitions[0];
    assert_eq!((p.leader, p.isr.clone(), p.leader_epoch), (Some(NodeId(2)), ids(&[2]), LeaderEpoch(1)));
}

#[test]
fn a_partition_whose_isr_is_gone_stays_offline_until_its_last_member_returns() {
    let mut state = cluster(2);
    state.apply(&create("solo", 2, 1)).unwrap();
    let on_broker_1 = state.topics["solo"].partitions.iter().position(|p| p.replicas == ids(&[1])).unwrap();

    let events = state.apply(&fence_now(&state, 1, 1)).unwrap();
    assert_eq!(events, vec![Event::Offline { topic: "solo".into(), partition: on_broker_1 as u32 }]);
    let p = &state.topics["solo"].partitions[on_broker_1];
    assert_eq!(p.leader, None);
    assert_eq!(p.isr, ids(&[1]), "the last ISR member stays: it holds every committed record");
    assert_eq!(p.leader_epoch, LeaderEpoch(1));

    // The broker restarts: a new incarnation registers and takes its partition back at a new epoch.
    state.apply(&register(1, 100, 20_000)).unwrap();
    let p = &state.topics["solo"].partitions[on_broker_1];
    assert_eq!((p.leader, p.leader_epoch), (Some(NodeId(1)), LeaderEpoch(2)));
}

#[test]
fn a_restarted_process_taking_over_its_registration_reports_no_partition_offline() {
    let mut state = cluster(2);
    state.apply(&create("solo", 2, 1)).unwrap();
    let on_broker_1 = state.topics["solo"].partitions.iter().position(|p| p.replicas == ids(&[1])).unwrap();
    let takeover = Command::RegisterBroker {
        id: NodeId(1),
        endpoint: BrokerEndpoint { host: "127.0.0.1".into(), port: 9001 },
        incarnation: 100,
        previous_incarnation: Some(1),
        now_ms: 10,
        session_timeout_ms: SESSION_MS,
    };
    let events = state.apply(&takeover).unwrap();
    assert_eq!(events, vec![], "led again within the same command: never offline");
    let p = &state.topics["solo"].partitions[on_broker_1];
    assert_eq!((p.leader, p.leader_epoch), (Some(NodeId(1)), LeaderEpoch(2)), "at a new epoch");
}

#[test]
fn unclean_election_lets_an_out_of_sync_replica_lead_only_when_the_topic_allows_it() {
    let mut state = cluster(3);
    state.apply(&create("orders", 1, 3)).unwrap();
    // Followers fall out of sync: the leader shrinks the ISR to itself.
    let shrink = Command::AlterPartition {
        topic: "orders".into(),
        partition: 0,
        leader: NodeId(1),
        leader_epoch: LeaderEpoch(0),
        partition_epoch: PartitionEpoch(0),
        isr: ids(&[1]),
    };
    state.apply(&shrink).unwrap();
    let events = state.apply(&fence_now(&state, 1, 1)).unwrap();
    assert_eq!(events, vec![Event::Offline { topic: "orders".into(), partition: 0 }]);
    assert_eq!(state.topics["orders"].partitions[0].leader, None, "unclean election is off by default");

    let allow = BTreeMap::from([(UNCLEAN_ELECTION_KEY.to_string(), "true".to_string())]);
    let events = state.apply(&Command::AlterConfigs { name: "orders".into(), configs: allow }).unwrap();
    assert_eq!(events, vec![Event::UncleanElection { topic: "orders".into(), partition: 0, leader: NodeId(2) }]);
    let p = &state.topics["orders"].partitions[0];
    assert_eq!((p.leader, p.isr.clone()), (Some(NodeId(2)), ids(&[2])), "the ISR restarts from the new leader");
    assert_eq!(p.leader_epoch, LeaderEpoch(2));
}

#[test]
fn alter_partition_is_fenced_by_leader_and_partition_epochs() {
    let mut state = cluster(3);
    state.apply(&create("orders", 1, 3)).unwrap();
    let alter = |leader: u32, leader_epoch: i32, partition_epoch: i32, isr: &[u32]| Command::AlterPartition {
        topic: "orders".into(),
        partition: 0,
        leader: NodeId(leader),
        leader_epoch: LeaderEpoch(leader_epoch),
        partition_epoch: PartitionEpoch(partition_epoch),
        isr: ids(isr),
    };
    state.apply(&alter(1, 0, 0, &[1, 2])).unwrap();
    assert_eq!(state.topics["orders"].partitions[0].partition_epoch, PartitionEpoch(1));

    assert_eq!(refused(&mut state, alter(1, 0, 0, &[1])).kafka_code(), 96, "stale partition epoch");
    assert_eq!(refused(&mut state, alter(2, 0, 1, &[2])).kafka_code(), 74, "not the leader");
    assert_eq!(refused(&mut state, alter(1, 5, 1, &[1])).kafka_code(), 74, "wrong leader epoch");
    assert_eq!(refused(&mut state, alter(1, 0, 1, &[2])).kafka_code(), 107, "leader outside its ISR");
    assert_eq!(refused(&mut state, alter(1, 0, 1, &[1, 4])).kafka_code(), 107, "not a replica");
    assert_eq!(refused(&mut state, alter(1, 0, 1, &[1, 1])).kafka_code(), 107, "twice");
    let missing = Command::AlterPartition {
        topic: "orders".into(),
        partition: 9,
        leader: NodeId(1),
        leader_epoch: LeaderEpoch(0),
        partition_epoch: PartitionEpoch(1),
        isr: ids(&[1]),
    };
    assert_eq!(refused(&mut state, missing).kafka_code(), 3);

    // A fenced broker cannot be added back; once it is unfenced it can.
    state.apply(&fence_now(&state, 3, 3)).unwrap();
    assert_eq!(refused(&mut state, alter(1, 0, 1, &[1, 2, 3])).kafka_code(), 107);
    state.apply(&Command::BrokerHeartbeat { id: NodeId(3), incarnation: 3, now_ms: 1000 }).unwrap();
    state.apply(&alter(1, 0, 1, &[1, 2, 3])).unwrap();

    // The deposed leader's proposal is refused after a new election.
    state.apply(&fence_now(&state, 1, 1)).unwrap();
    let p = state.topics["orders"].partitions[0].clone();
    assert_eq!(p.leader, Some(NodeId(2)));
    assert_eq!(refused(&mut state, alter(1, 0, p.partition_epoch.0, &[1])).kafka_code(), 74);
}

#[test]
fn heartbeats_and_registrations_are_checked_against_the_incarnation_and_session() {
    let mut state = cluster(2);
    let beat = |id, incarnation, now_ms| Command::BrokerHeartbeat { id: NodeId(id), incarnation, now_ms };
    assert_eq!(refused(&mut state, beat(1, 7, 10)).kafka_code(), 77, "STALE_BROKER_EPOCH");
    assert_eq!(refused(&mut state, beat(5, 5, 10)).kafka_code(), 102, "BROKER_ID_NOT_REGISTERED");
    assert_eq!(
        {
            let f = fence_now(&state, 1, 7);
            refused(&mut state, f)
        }
        .kafka_code(),
        77,
        "fencing names the incarnation"
    );

    state.apply(&beat(1, 1, 5_000)).unwrap();
    assert_eq!(state.expired_sessions(9_500, SESSION_MS), vec![fence_seen(2, 2, 0)], "only broker 2 went quiet");
    // A fencing decided before a heartbeat was applied is refused: the broker is alive after all.
    assert_eq!(refused(&mut state, fence_seen(1, 1, 0)).kafka_code(), 77, "broker 1 was heard from at 5000");

    // Another process with broker 1's id while broker 1's session is alive: refused.
    assert_eq!(refused(&mut state, register(1, 99, 6_000)).kafka_code(), 101, "DUPLICATE_BROKER_REGISTRATION");
    // Once the session has expired the new incarnation replaces the old.
    state.apply(&register(1, 99, 5_000 + SESSION_MS)).unwrap();
    assert_eq!(state.brokers[&NodeId(1)].incarnation, 99);
    assert_eq!(refused(&mut state, beat(1, 1, 20_000)).kafka_code(), 77, "the old incarnation is stale");
}

#[test]
fn a_broker_restarted_on_its_own_data_takes_over_its_previous_registration_at_once() {
    let mut state = cluster(2);
    state.apply(&create("orders", 2, 1)).unwrap();
    let led_by_1 = state.topics["orders"].partitions.iter().position(|p| p.leader == Some(NodeId(1))).unwrap();
    let epoch = state.topics["orders"].partitions[led_by_1].leader_epoch;
    let restarted = |previous| Command::RegisterBroker {
        id: NodeId(1),
        endpoint: BrokerEndpoint { host: "127.0.0.1".into(), port: 9001 },
        incarnation: 77,
        previous_incarnation: previous,
        now_ms: 100,
        session_timeout_ms: SESSION_MS,
    };
    // Naming another incarnation than the registered one proves nothing: refused while the session lives.
    assert_eq!(refused(&mut state, restarted(Some(5))).kafka_code(), 101);
    state.apply(&restarted(Some(1))).unwrap();
    assert_eq!(state.brokers[&NodeId(1)].incarnation, 77);
    let p = &state.topics["orders"].partitions[led_by_1];
    assert_eq!(p.leader, Some(NodeId(1)), "its partition (ISR of one) comes back with it");
    assert!(p.leader_epoch > epoch, "at a new leader epoch");
}

#[test]
fn an_assigned_topic_places_its_replicas_as_given_and_refuses_a_bad_assignment() {
    let mut state = cluster(3);
    let assigned = |lists: Vec<Vec<u32>>, rf: u16| Command::CreateTopic {
        name: "imported".into(),
        id: Uuid::nil(),
        partitions: lists.len() as u32,
        replication_factor: rf,
        configs: BTreeMap::new(),
        assignment: Some(lists.iter().map(|l| ids(l)).collect()),
    };
    for (bad, why) in [
        (assigned(vec![vec![1], vec![2]], 2), "wrong replication factor"),
        (assigned(vec![vec![1, 1]], 2), "a broker twice"),
        (assigned(vec![vec![9]], 1), "an unregistered broker"),
    ] {
        assert_eq!(refused(&mut state, bad).kafka_code(), 39, "INVALID_REPLICA_ASSIGNMENT: {why}");
    }
    let mut wrong_count = assigned(vec![vec![3]], 1);
    if let Command::CreateTopic { partitions, .. } = &mut wrong_count {
        *partitions = 2;
    }
    assert_eq!(refused(&mut state, wrong_count).kafka_code(), 39, "one list per partition");
    state.apply(&Command::ControlledShutdown { id: NodeId(3), incarnation: 3 }).unwrap();
    state.apply(&assigned(vec![vec![3, 1], vec![3, 2]], 2)).unwrap();
    let t = &state.topics["imported"];
    assert_eq!(t.partitions[0].replicas, ids(&[3, 1]));
    assert_eq!(t.partitions[0].leader, Some(NodeId(1)), "the first live replica leads");
    assert_eq!(t.partitions[1].leader, Some(NodeId(2)));

    // Growing it with an assignment: one list per new partition, of the topic's replication factor.
    let grow = |count: u32, lists: Vec<Vec<u32>>| Command::CreatePartitionsAssigned {
        name: "imported".into(),
        count,
        assignment: lists.iter().map(|l| ids(l)).collect(),
    };
    assert_eq!(refused(&mut state, grow(3, vec![vec![1, 2, 3]])).kafka_code(), 39, "three replicas for two");
    assert_eq!(refused(&mut state, grow(4, vec![vec![1, 2]])).kafka_code(), 39, "one list for two partitions");
    assert_eq!(refused(&mut state, grow(2, vec![])).kafka_code(), 37, "the count only grows");
    state.apply(&grow(3, vec![vec![2, 1]])).unwrap();
    let grown = &state.topics["imported"].partitions[2];
    assert_eq!((grown.replicas.clone(), grown.leader), (ids(&[2, 1]), Some(NodeId(2))));
}

#[test]
fn partition_counts_are_bounded_whoever_proposes_them() {
    let mut state = cluster(1);
    assert_eq!(refused(&mut state, create("huge", 10_001, 1)).kafka_code(), 37);
    state.apply(&create("t", 1, 1)).unwrap();
    let grow = Command::CreatePartitions { name: "t".into(), count: u32::MAX };
    assert_eq!(refused(&mut state, grow).kafka_code(), 37);
}

#[test]
fn config_edits_change_only_the_keys_they_name() {
    let mut state = cluster(1);
    state.apply(&create("t", 1, 1)).unwrap();
    let edit = |set: &[(&str, &str)], delete: &[&str]| Command::EditConfigs {
        name: "t".into(),
        set: set.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        delete: delete.iter().map(|k| k.to_string()).collect(),
    };
    // Two brokers' edits of different keys, proposed from the same starting point: both stay.
    state.apply(&edit(&[("retention.ms", "1000")], &[])).unwrap();
    state.apply(&edit(&[("segment.bytes", "2000")], &[])).unwrap();
    state.apply(&edit(&[("cleanup.policy", "delete")], &["retention.ms"])).unwrap();
    let configs: Vec<_> = state.topics["t"].configs.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    assert_eq!(configs, vec![("cleanup.policy", "delete"), ("segment.bytes", "2000")]);
    assert_eq!(
        refused(&mut state, Command::EditConfigs { name: "u".into(), set: BTreeMap::new(), delete: vec![] })
            .kafka_code(),
        3
    );
}

#[test]
fn a_restarted_broker_takes_over_only_after_its_old_incarnation_is_fenced() {
    let mut state = cluster(2);
    state.apply(&create("orders", 1, 2)).unwrap();
    // Broker 1 crashes and comes back after its session expired, before the controller fenced it: its old
    // leadership moves to broker 2 first (the new process's log may be behind).
    state.apply(&register(1, 50, SESSION_MS + 1)).unwrap();
    let p = &state.topics["orders"].partitions[0];
    assert_eq!(p.leader, Some(NodeId(2)));
    assert_eq!(p.isr, ids(&[2]));
    assert!(!state.brokers[&NodeId(1)].fenced);
}

#[test]
fn preferred_leader_election_moves_leadership_back_only_when_it_can() {
    let mut state = cluster(2);
    state.apply(&create("orders", 1, 2)).unwrap();
    let elect = || Command::ElectPreferredLeader { topic: "orders".into(), partition: 0 };
    assert_eq!(refused(&mut state, elect()).kafka_code(), 84, "ELECTION_NOT_NEEDED");

    state.apply(&Command::ControlledShutdown { id: NodeId(1), incarnation: 1 }).unwrap();
    let p = state.topics["orders"].partitions[0].clone();
    assert_eq!(p.leader, Some(NodeId(2)), "a controlled shutdown moves leadership away");
    assert_eq!(refused(&mut state, elect()).kafka_code(), 80, "PREFERRED_LEADER_NOT_AVAILABLE");

    // Broker 1 returns and catches up: the leader adds it back to the ISR, then it can lead again.
    state.apply(&register(1, 2, 100)).unwrap();
    assert_eq!(refused(&mut state, elect()).kafka_code(), 80, "live but not in sync yet");
    let rejoin = Command::AlterPartition {
        topic: "orders".into(),
        partition: 0,
        leader: NodeId(2),
        leader_epoch: p.leader_epoch,
        partition_epoch: p.partition_epoch,
        isr: ids(&[2, 1]),
    };
    state.apply(&rejoin).unwrap();
    state.apply(&elect()).unwrap();
    let q = &state.topics["orders"].partitions[0];
    assert_eq!(q.leader, Some(NodeId(1)));
    assert_eq!(q.leader_epoch.0, p.leader_epoch.0 + 1);
}

/// The partition epoch that marks a generated `AlterPartition` to be sent at the current epochs.
const CURRENT: PartitionEpoch = PartitionEpoch(-1);

/// `command`, with a marked `AlterPartition` filled in from `state`: the current leader and epochs, and
/// the leader in the ISR it proposes (so that reassignments complete through it now and then).
fn current_epochs(state: &ClusterState, command: &Command) -> Command {
    let Command::AlterPartition { topic, partition, partition_epoch: CURRENT, isr, .. } = command else {
        return command.clone();
    };
    let Some(p) = state.topics.get(topic).and_then(|t| t.partitions.get(*partition as usize)) else {
        return command.clone();
    };
    let Some(leader) = p.leader else { return command.clone() };
    let mut proposed = vec![leader];
    for id in isr {
        if !proposed.contains(id) && p.replicas.contains(id) {
            proposed.push(*id);
        }
    }
    Command::AlterPartition {
        topic: topic.clone(),
        partition: *partition,
        leader,
        leader_epoch: p.leader_epoch,
        partition_epoch: p.partition_epoch,
        isr: proposed,
    }
}

/// A random command over a small cluster: 4 broker ids, 3 topic names.
fn command() -> impl Strategy<Value = Command> {
    let id = 1u32..=4;
    let name = prop::sample::select(vec!["a", "b", "c"]);
    // Few distinct times, so that a fencing often names the heartbeat the state holds.
    let time = prop::sample::select(vec![0i64, 20_000, 39_999]);
    prop_oneof![
        1 => (id.clone(), 0u64..3, time.clone()).prop_map(|(i, inc, now)| register(i, inc, now)),
        1 => (id.clone(), 0u64..3, time.clone()).prop_map(|(i, inc, now)| Command::BrokerHeartbeat {
            id: NodeId(i),
            incarnation: inc,
            now_ms: now
        }),
        1 => (id.clone(), 0u64..3, prop::sample::select(vec![0i64, 20_000, 39_999]))
            .prop_map(|(i, inc, seen)| fence_seen(i, inc, seen)),
        1 => (id.clone(), 0u64..3).prop_map(|(i, inc)| Command::ControlledShutdown { id: NodeId(i), incarnation: inc }),
        1 => (name.clone(), 0u32..4, 0u16..4).prop_map(|(n, p, rf)| create(n, p, rf)),
        1 => name.clone().prop_map(|n| Command::DeleteTopic { name: n.into() }),
        1 => (name.clone(), 0u32..6).prop_map(|(n, c)| Command::CreatePartitions { name: n.into(), count: c }),
        1 => (name.clone(), any::<bool>()).prop_map(|(n, unclean)| Command::AlterConfigs {
            name: n.into(),
            configs: BTreeMap::from([(UNCLEAN_ELECTION_KEY.to_string(), unclean.to_string())]),
        }),
        1 => (name.clone(), any::<bool>(), any::<bool>()).prop_map(|(n, unclean, delete)| Command::EditConfigs {
            name: n.into(),
            set: if delete {
                BTreeMap::new()
            } else {
                BTreeMap::from([(UNCLEAN_ELECTION_KEY.to_string(), unclean.to_string())])
            },
            delete: if delete { vec![UNCLEAN_ELECTION_KEY.to_string()] } else { Vec::new() },
        }),
        1 => (name.clone(), prop::collection::vec(prop::collection::vec(1u32..=5, 1..3), 1..3)).prop_map(|(n, lists)| {
            let replication_factor = lists[0].len() as u16;
            Command::CreateTopic {
                name: n.into(),
                id: Uuid::nil(),
                partitions: lists.len() as u32,
                replication_factor,
                configs: BTreeMap::new(),
                assignment: Some(lists.into_iter().map(|l| l.into_iter().map(NodeId).collect()).collect()),
            }
        }),
        1 => (name.clone(), 0u32..4, id.clone(), 0i32..4, 0i32..6, prop::collection::vec(1u32..=4, 1..4)).prop_map(
            |(n, p, leader, le, pe, isr)| Command::AlterPartition {
                topic: n.into(),
                partition: p,
                leader: NodeId(leader),
                leader_epoch: LeaderEpoch(le),
                partition_epoch: PartitionEpoch(pe),
                isr: ids(&isr),
            }
        ),
        1 => (name.clone(), 0u32..4).prop_map(|(n, p)| Command::ElectPreferredLeader { topic: n.into(), partition: p }),
        1 => (name.clone(), 0u32..4).prop_map(|(n, p)| Command::ElectUncleanLeader { topic: n.into(), partition: p }),
        // An ISR change from the partition's current leader at its current epochs (filled in when applied).
        // Weighted up, with moves below, so that moves often complete through it.
        4 => (name.clone(), 0u32..4, prop::collection::vec(1u32..=4, 0..4)).prop_map(|(n, p, isr)| {
            Command::AlterPartition {
                topic: n.into(),
                partition: p,
                leader: NodeId(0),
                leader_epoch: LeaderEpoch(-1),
                partition_epoch: CURRENT,
                isr: ids(&isr),
            }
        }),
        3 => (name, 0u32..2, prop::option::of(prop::collection::vec(1u32..=5, 0..4))).prop_map(|(n, p, target)| {
            Command::AlterReassignment { topic: n.into(), partition: p, target: target.map(|t| ids(&t)) }
        }),
        1 => (id.clone(), 0u32..3).prop_map(|(i, count)| Command::AllocateProducerIds { broker: NodeId(i), count }),
        2 => (id, 0u64..3, prop::sample::select(vec!["a", "b", "c"]), 0u32..4, any::<bool>()).prop_map(
            |(i, inc, n, p, offline)| Command::SetReplicaOffline {
                id: NodeId(i),
                incarnation: inc,
                topic: n.into(),
                partition: p,
                offline,
            }
        ),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Whatever commands arrive, in whatever order: refused ones change nothing, the same log gives the
    /// same state, and every partition keeps the invariants elections and ISR changes rely on.
    #[test]
    fn every_command_stream_keeps_the_invariants(commands in prop::collection::vec(command(), 1..80)) {
        let mut state = ClusterState::default();
        let mut replay = ClusterState::default();
        let mut epochs: BTreeMap<(String, usize), (LeaderEpoch, PartitionEpoch)> = BTreeMap::new();
        let mut producer_ids_given = 0i64;
        for command in &commands {
            let command = &current_epochs(&state, command);
            let before = state.clone();
            let outcome = state.apply(command);
            // Producer id blocks follow one another: no id is ever given twice.
            for event in outcome.iter().flatten() {
                if let Event::ProducerIdsAllocated { first, count, .. } = event {
                    prop_assert_eq!(*first, producer_ids_given, "a block starts where the last one ended");
                    prop_assert!(*count > 0);
                    producer_ids_given += i64::from(*count);
                }
            }
            prop_assert_eq!(state.next_producer_id, producer_ids_given);
            prop_assert_eq!(&replay.apply(command), &outcome, "the same command gives the same outcome");
            if outcome.is_err() {
                prop_assert_eq!(&state, &before, "refused {:?} changed the state", command);
            }
            let live = state.live();
            for (name, topic) in &state.topics {
                for (i, p) in topic.partitions.iter().enumerate() {
                    prop_assert!(!p.isr.is_empty(), "{}-{}: empty ISR", name, i);
                    prop_assert!(p.isr.iter().all(|r| p.replicas.contains(r)), "{}-{}: ISR outside replicas", name, i);
                    // A reassignment's adding and removing replicas are replicas, and never the same ones.
                    let moving = p.adding_replicas.iter().chain(&p.removing_replicas);
                    prop_assert!(moving.clone().all(|r| p.replicas.contains(r)), "{}-{}: moving outside replicas", name, i);
                    prop_assert!(p.adding_replicas.iter().all(|r| !p.removing_replicas.contains(r)), "{}-{}: both", name, i);
                    prop_assert!(!p.target_replicas().is_empty(), "{}-{}: empty target", name, i);
                    if p.reassigning() {
                        prop_assert!(p.target_replicas().iter().any(|r| !p.isr.contains(r)) || p.leader.is_none(),
                            "{}-{}: a reassignment whose target is in sync with a leader is not left open", name, i);
                    }
                    if p.isr.len() > 1 {
                        prop_assert!(p.isr.iter().all(|r| live.contains(r)), "{}-{}: fenced member in ISR {:?}", name, i, p.isr);
                    }
                    if let Some(leader) = p.leader {
                        prop_assert!(p.isr.contains(&leader), "{}-{}: leader {} not in ISR {:?}", name, i, leader, p.isr);
                        prop_assert!(live.contains(&leader), "{}-{}: fenced leader {}", name, i, leader);
                        // An offline replica leads (read-only) only as the ISR's last member.
                        prop_assert!(!p.offline_replicas.contains(&leader) || p.isr == vec![leader],
                            "{}-{}: offline leader {} with ISR {:?}", name, i, leader, p.isr);
                    }
                    // An offline replica is a replica, listed once, and in the ISR only as its last member.
                    prop_assert!(p.offline_replicas.iter().all(|r| p.replicas.contains(r)), "{}-{}: offline outside replicas", name, i);
                    prop_assert!(p.offline_replicas.iter().collect::<std::collections::BTreeSet<_>>().len() == p.offline_replicas.len(),
                        "{}-{}: an offline replica twice", name, i);
                    prop_assert!(p.offline_replicas.iter().all(|r| !p.isr.contains(r) || p.isr.len() == 1),
                        "{}-{}: offline {:?} in ISR {:?}", name, i, p.offline_replicas, p.isr);
                    // A new leader was in sync (before, or by this very ISR change), unless the election
                    // was unclean and said so.
                    let was = before.topics.get(name).filter(|t| t.id == topic.id).and_then(|t| t.partitions.get(i));
                    if let (Some(was), Some(leader)) = (was, p.leader)
                        && p.leader_epoch > was.leader_epoch
                        && !was.isr.contains(&leader)
                    {
                        let proposed = matches!(command, Command::AlterPartition { topic: t, partition, isr, .. }
                            if t == name && *partition as usize == i && isr.contains(&leader));
                        let unclean = outcome.iter().flatten().any(|e| matches!(e, Event::UncleanElection { topic: t, partition, .. }
                            if t == name && *partition as usize == i));
                        prop_assert!(proposed || unclean, "{}-{}: {} leads out of sync without an unclean election", name, i, leader);
                    }
                    // Epochs never go back while the topic exists (a re-created topic starts over).
                    let key = (name.clone(), i);
                    if let Some(&(le, pe)) = epochs.get(&key)
                        && before.topics.get(name).is_some_and(|t| t.id == topic.id && t.partitions.len() > i)
                    {
                        prop_assert!(p.leader_epoch >= le && p.partition_epoch >= pe, "{}-{}: epoch went back", name, i);
                    }
                    epochs.insert(key, (p.leader_epoch, p.partition_epoch));
                }
            }
        }
        prop_assert_eq!(state, replay);
    }
}

#[test]
fn auto_rebalance_moves_leadership_back_only_past_the_imbalance_and_only_to_live_in_sync_replicas() {
    let mut state = cluster(3);
    let assigned = |name: &str, lists: &[&[u32]]| Command::CreateTopic {
        name: name.into(),
        id: Uuid::from_u128(name.len() as u128 + 7),
        partitions: lists.len() as u32,
        replication_factor: lists[0].len() as u16,
        configs: BTreeMap::new(),
        assignment: Some(lists.iter().map(|l| ids(l)).collect()),
    };
    // Broker 1 is preferred for four partitions, broker 2 for one.
    state.apply(&assigned("t", &[&[1, 2], &[1, 3], &[1, 2], &[1, 3], &[2, 1]])).unwrap();
    assert!(state.preferred_elections(10).is_empty(), "every preferred replica leads");
    // Broker 1 goes away and comes back: it leads nothing, but is in sync only where the ISR kept it.
    state.apply(&Command::ControlledShutdown { id: NodeId(1), incarnation: 1 }).unwrap();
    state.apply(&Command::BrokerHeartbeat { id: NodeId(1), incarnation: 1, now_ms: 100 }).unwrap();
    assert!(state.topics["t"].partitions[..4].iter().all(|p| p.leader != Some(NodeId(1))));
    for index in [0u32, 1] {
        let p = state.topics["t"].partitions[index as usize].clone();
        let isr = p.isr.clone();
        let back: Vec<NodeId> = isr.iter().copied().chain([NodeId(1)]).collect();
        let alter = Command::AlterPartition {
            topic: "t".into(),
            partition: index,
            leader: p.leader.unwrap(),
            leader_epoch: p.leader_epoch,
            partition_epoch: p.partition_epoch,
            isr: back,
        };
        state.apply(&alter).unwrap();
    }
    // Broker 1 misses 4 of its 4 (100%): the two where it is in sync move back; the others wait.
    assert!(state.preferred_elections(99).len() == 2, "4 of 4 missed is above 99%");
    let elections = state.preferred_elections(10);
    let expected: Vec<Command> =
        [0, 1].map(|partition| Command::ElectPreferredLeader { topic: "t".into(), partition }).into();
    assert_eq!(elections, expected);
    // A broker missing no more than the threshold keeps things as they are.
    assert!(state.preferred_elections(100).is_empty(), "100%: never");
    for e in &elections {
        state.apply(e).unwrap();
    }
    // Now it misses 2 of 4 (50%): above 10%, but nothing movable is left.
    assert!(state.preferred_elections(10).is_empty());
    assert_eq!(state.topics["t"].partitions[0].leader, Some(NodeId(1)));
}

#[test]
fn an_unclean_election_asked_for_takes_a_live_out_of_sync_replica_only_when_nothing_leads() {
    let mut state = cluster(2);
    state.apply(&create("u", 1, 2)).unwrap();
    let elect = || Command::ElectUncleanLeader { topic: "u".into(), partition: 0 };
    assert_eq!(refused(&mut state, elect()).kafka_code(), 84, "ELECTION_NOT_NEEDED while it has a leader");
    let p = state.topics["u"].partitions[0].clone();
    let (leader, follower) = (p.leader.unwrap(), p.replicas.iter().copied().find(|r| Some(*r) != p.leader).unwrap());
    // The follower leaves the ISR, then the leader's broker is fenced: the partition is offline.
    let shrink = Command::AlterPartition {
        topic: "u".into(),
        partition: 0,
        leader,
        leader_epoch: p.leader_epoch,
        partition_epoch: p.partition_epoch,
        isr: vec![leader],
    };
    state.apply(&shrink).unwrap();
    let incarnation = |id: NodeId| state.brokers[&id].incarnation;
    let (li, fi) = (incarnation(leader), incarnation(follower));
    state.apply(&fence_now(&state, leader.0, li)).unwrap();
    assert_eq!(state.topics["u"].partitions[0].leader, None, "no clean choice");
    let events = state.apply(&elect()).unwrap();
    let p = &state.topics["u"].partitions[0];
    assert_eq!((p.leader, p.isr.clone()), (Some(follower), vec![follower]));
    assert!(matches!(events.as_slice(), [Event::UncleanElection { .. }]), "{events:?}");
    // Nobody live: ELIGIBLE_LEADERS_NOT_AVAILABLE.
    state.apply(&fence_now(&state, follower.0, fi)).unwrap();
    assert_eq!(refused(&mut state, elect()).kafka_code(), 83);
}
