//! Offline replicas in the quorum's rules: a replica its broker reports damaged leaves the ISR and its
//! leadership, never leads but read-only as the ISR's last member, and comes back only when reported.

use super::*;

/// Broker `id`'s report of its replica of `topic`-0 (registered with incarnation `id`, as [`cluster`] does).
fn report(id: u32, topic: &str, offline: bool) -> Command {
    Command::SetReplicaOffline { id: NodeId(id), incarnation: id as u64, topic: topic.into(), partition: 0, offline }
}

#[test]
fn an_offline_replica_loses_its_leadership_and_isr_place_and_leads_again_only_once_reported_back() {
    let mut state = cluster(3);
    state.apply(&create_assigned("d", &[&[1, 2, 3]])).unwrap();
    let before = state.topics["d"].partitions[0].clone();

    // The leader's log is damaged: an in-sync replica leads at a new epoch, and the damaged one leaves the ISR.
    let events = state.apply(&report(1, "d", true)).unwrap();
    assert!(events.is_empty(), "a clean election: {events:?}");
    let p = state.topics["d"].partitions[0].clone();
    assert_eq!((p.leader, p.isr.clone(), p.offline_replicas.clone()), (Some(NodeId(2)), ids(&[2, 3]), ids(&[1])));
    assert!(p.leader_epoch > before.leader_epoch && p.partition_epoch > before.partition_epoch);
    // Reported again: nothing changes.
    state.apply(&report(1, "d", true)).unwrap();
    assert_eq!(state.topics["d"].partitions[0], p);

    // Never the preferred leader, never back in the ISR, never chosen while it is offline.
    let preferred = Command::ElectPreferredLeader { topic: "d".into(), partition: 0 };
    assert_eq!(refused(&mut state, preferred.clone()).kafka_code(), 80, "PREFERRED_LEADER_NOT_AVAILABLE");
    assert!(state.preferred_elections(0).is_empty(), "auto rebalance leaves it alone");
    let rejoin = |p: &shardlog_broker::quorum::state::PartitionRecord| Command::AlterPartition {
        topic: "d".into(),
        partition: 0,
        leader: p.leader.unwrap(),
        leader_epoch: p.leader_epoch,
        partition_epoch: p.partition_epoch,
        isr: ids(&[2, 3, 1]),
    };
    assert_eq!(refused(&mut state, rejoin(&p)).kafka_code(), 107, "INELIGIBLE_REPLICA: offline");
    state.apply(&fence_now(&state, 2, 2)).unwrap();
    assert_eq!(state.topics["d"].partitions[0].leader, Some(NodeId(3)), "3, not the offline 1");

    // Rebuilt, it is reported back; it joins the ISR through the leader, and may then lead again.
    state.apply(&report(1, "d", false)).unwrap();
    let p = state.topics["d"].partitions[0].clone();
    assert!(p.offline_replicas.is_empty());
    assert_eq!((p.leader, p.isr.clone()), (Some(NodeId(3)), ids(&[3])), "back is not in sync");
    let alter = Command::AlterPartition {
        topic: "d".into(),
        partition: 0,
        leader: NodeId(3),
        leader_epoch: p.leader_epoch,
        partition_epoch: p.partition_epoch,
        isr: ids(&[3, 1]),
    };
    state.apply(&alter).unwrap();
    state.apply(&preferred).unwrap();
    assert_eq!(state.topics["d"].partitions[0].leader, Some(NodeId(1)));
}

#[test]
fn an_offline_last_isr_member_leads_read_only_until_repaired_or_replaced_by_an_unclean_election() {
    let mut state = cluster(2);
    state.apply(&create_assigned("d", &[&[1, 2]])).unwrap();
    let p = state.topics["d"].partitions[0].clone();
    let shrink = Command::AlterPartition {
        topic: "d".into(),
        partition: 0,
        leader: NodeId(1),
        leader_epoch: p.leader_epoch,
        partition_epoch: p.partition_epoch,
        isr: ids(&[1]),
    };
    state.apply(&shrink).unwrap();
    let events = state.apply(&report(1, "d", true)).unwrap();
    assert!(events.is_empty(), "{events:?}");
    let p = state.topics["d"].partitions[0].clone();
    assert_eq!(
        (p.leader, p.isr.clone(), p.offline_replicas.clone()),
        (Some(NodeId(1)), ids(&[1]), ids(&[1])),
        "nobody else may lead: it stays, read-only, and the ISR keeps it (nothing committed is given up)"
    );
    // Leading read-only, it cannot grow its ISR: a follower it counts in sync may lack what lies above
    // the damage, and would be elected cleanly without it.
    let grow = Command::AlterPartition {
        topic: "d".into(),
        partition: 0,
        leader: NodeId(1),
        leader_epoch: p.leader_epoch,
        partition_epoch: p.partition_epoch,
        isr: ids(&[1, 2]),
    };
    assert_eq!(refused(&mut state, grow).kafka_code(), 107);
    // Its broker restarts: fenced, the partition has no leader; registered again, it leads read-only again.
    state.apply(&fence_now(&state, 1, 1)).unwrap();
    assert_eq!(state.topics["d"].partitions[0].leader, None);
    state.apply(&register(1, 1, 5)).unwrap();
    let q = state.topics["d"].partitions[0].clone();
    assert_eq!(q.leader, Some(NodeId(1)));
    assert!(q.leader_epoch > p.leader_epoch);

    // Repaired (`shardlog repair`), the replica is reported back and takes writes again: same leader.
    state.apply(&report(1, "d", false)).unwrap();
    let r = state.topics["d"].partitions[0].clone();
    assert_eq!((r.leader, r.leader_epoch, r.offline_replicas.clone()), (Some(NodeId(1)), q.leader_epoch, vec![]));

    // Damaged again; this time an unclean election hands the partition to the out-of-sync replica.
    state.apply(&report(1, "d", true)).unwrap();
    let events = state.apply(&Command::ElectUncleanLeader { topic: "d".into(), partition: 0 }).unwrap();
    assert!(matches!(events.as_slice(), [Event::UncleanElection { leader: NodeId(2), .. }]), "{events:?}");
    let p = &state.topics["d"].partitions[0];
    assert_eq!((p.leader, p.isr.clone()), (Some(NodeId(2)), ids(&[2])));

    // Only a replica's own broker, at its own incarnation, reports it.
    let stranger =
        Command::SetReplicaOffline { id: NodeId(3), incarnation: 3, topic: "d".into(), partition: 0, offline: true };
    assert_eq!(refused(&mut state, stranger).kafka_code(), 102, "BROKER_ID_NOT_REGISTERED");
    let stale =
        Command::SetReplicaOffline { id: NodeId(2), incarnation: 9, topic: "d".into(), partition: 0, offline: true };
    assert_eq!(refused(&mut state, stale).kafka_code(), 77, "STALE_BROKER_EPOCH");
    state.apply(&register(3, 3, 5)).unwrap();
    let not_a_replica =
        Command::SetReplicaOffline { id: NodeId(3), incarnation: 3, topic: "d".into(), partition: 0, offline: true };
    assert_eq!(refused(&mut state, not_a_replica).kafka_code(), 9, "REPLICA_NOT_AVAILABLE");
}
