//! Partition reassignment in the quorum's rules: a move adds its target's replicas, completes once they
//! are all in sync and one of them can lead, and can be replaced or cancelled.

use super::*;

#[test]
fn a_reassignment_adds_replicas_then_drops_the_leaving_ones_once_the_target_is_in_sync() {
    let mut state = cluster(4);
    state.apply(&create_assigned("orders", &[&[1, 2]])).unwrap();
    let reassign = |target: Option<&[u32]>| Command::AlterReassignment {
        topic: "orders".into(),
        partition: 0,
        target: target.map(ids),
    };
    let partition = |state: &ClusterState| state.topics["orders"].partitions[0].clone();

    // Nothing to cancel; bad targets are INVALID_REPLICA_ASSIGNMENT; unknown partitions 3.
    assert_eq!(refused(&mut state, reassign(None)), CommandError::NoReassignmentInProgress);
    assert_eq!(refused(&mut state, reassign(None)).kafka_code(), 85);
    for bad in [&[][..], &[3, 3], &[3, 9]] {
        assert_eq!(refused(&mut state, reassign(Some(bad))).kafka_code(), 39, "{bad:?}");
    }
    let elsewhere = Command::AlterReassignment { topic: "orders".into(), partition: 1, target: Some(ids(&[1])) };
    assert_eq!(refused(&mut state, elsewhere).kafka_code(), 3);

    // Moving to 3 and 4: they are added behind the target order, the leader stays until they are in sync.
    let before = partition(&state);
    assert!(state.apply(&reassign(Some(&[3, 4]))).unwrap().is_empty());
    let p = partition(&state);
    assert_eq!(p.replicas, ids(&[3, 4, 1, 2]));
    assert_eq!((p.adding_replicas.clone(), p.removing_replicas.clone()), (ids(&[3, 4]), ids(&[1, 2])));
    assert_eq!((p.isr.clone(), p.leader), (ids(&[1, 2]), Some(NodeId(1))));
    assert_eq!((p.leader_epoch, p.partition_epoch.0), (before.leader_epoch, before.partition_epoch.0 + 1));
    let alter = |state: &ClusterState, isr: &[u32]| {
        let p = partition(state);
        Command::AlterPartition {
            topic: "orders".into(),
            partition: 0,
            leader: p.leader.unwrap(),
            leader_epoch: p.leader_epoch,
            partition_epoch: p.partition_epoch,
            isr: ids(isr),
        }
    };
    // One new replica in sync is not enough.
    assert!(state.apply(&alter(&state, &[1, 2, 3])).unwrap().is_empty());
    assert!(partition(&state).reassigning());
    // Both: the leaving replicas go, and leadership moves to the first target replica.
    let events = state.apply(&alter(&state, &[1, 2, 3, 4])).unwrap();
    let done = Event::ReassignmentCompleted { topic: "orders".into(), partition: 0, replicas: ids(&[3, 4]) };
    assert_eq!(events, vec![done]);
    let p = partition(&state);
    assert_eq!((p.replicas.clone(), p.isr.clone(), p.leader), (ids(&[3, 4]), ids(&[3, 4]), Some(NodeId(3))));
    assert!(!p.reassigning());
    assert_eq!(p.leader_epoch.0, before.leader_epoch.0 + 1, "a new leader, a new epoch");

    // A target already in sync (a smaller replica set) completes at once; the leader stays if kept.
    state.apply(&reassign(Some(&[4, 3]))).unwrap();
    let p = partition(&state);
    assert_eq!((p.replicas.clone(), p.leader, p.reassigning()), (ids(&[4, 3]), Some(NodeId(3)), false));
    let events = state.apply(&reassign(Some(&[3]))).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!((partition(&state).replicas, partition(&state).isr), (ids(&[3]), ids(&[3])));

    // A new target replaces the one in progress, measured from the replicas before either; a cancel goes
    // back to those, and a leader that was only being added gives its leadership back.
    state.apply(&reassign(Some(&[1, 2]))).unwrap();
    state.apply(&reassign(Some(&[2, 4]))).unwrap();
    let p = partition(&state);
    assert_eq!(p.replicas, ids(&[2, 4, 3]));
    assert_eq!((p.adding_replicas.clone(), p.removing_replicas.clone()), (ids(&[2, 4]), ids(&[3])));
    state.apply(&alter(&state, &[3, 2])).unwrap();
    state.apply(&fence_now(&state, 3, 3)).unwrap();
    let p = partition(&state);
    assert_eq!((p.leader, p.isr.clone()), (Some(NodeId(2)), ids(&[2])), "an added replica in sync may lead");
    assert_eq!(refused(&mut state, reassign(None)).kafka_code(), 39, "back to 3 alone, which is out of sync");
    state.apply(&Command::BrokerHeartbeat { id: NodeId(3), incarnation: 3, now_ms: 1000 }).unwrap();
    state.apply(&alter(&state, &[2, 3])).unwrap();
    state.apply(&reassign(None)).unwrap();
    let p = partition(&state);
    assert_eq!((p.replicas.clone(), p.isr.clone(), p.leader), (ids(&[3]), ids(&[3]), Some(NodeId(3))));
    assert!(!p.reassigning());
}

#[test]
fn a_reassignment_whose_target_cannot_lead_waits_for_a_live_target_replica() {
    let mut state = cluster(3);
    state.apply(&create_assigned("orders", &[&[1, 2]])).unwrap();
    // Broker 2 leaves the ISR, then broker 1, the last member, is fenced: the partition is offline.
    let p = state.topics["orders"].partitions[0].clone();
    let shrink = Command::AlterPartition {
        topic: "orders".into(),
        partition: 0,
        leader: NodeId(1),
        leader_epoch: p.leader_epoch,
        partition_epoch: p.partition_epoch,
        isr: ids(&[1]),
    };
    state.apply(&shrink).unwrap();
    state.apply(&fence_now(&state, 1, 1)).unwrap();
    assert_eq!(state.topics["orders"].partitions[0].leader, None);

    // Dropping broker 2: the target is in sync but nobody in it may lead, so the move waits.
    let drop_two = Command::AlterReassignment { topic: "orders".into(), partition: 0, target: Some(ids(&[1])) };
    assert!(state.apply(&drop_two).unwrap().is_empty());
    let p = state.topics["orders"].partitions[0].clone();
    assert!(p.reassigning() && p.leader.is_none(), "{p:?}");
    assert_eq!(p.removing_replicas, ids(&[2]));

    // Broker 1 comes back: it leads again and the move completes.
    let events = state.apply(&Command::BrokerHeartbeat { id: NodeId(1), incarnation: 1, now_ms: 1 }).unwrap();
    let done = Event::ReassignmentCompleted { topic: "orders".into(), partition: 0, replicas: ids(&[1]) };
    assert_eq!(events, vec![done]);
    let p = state.topics["orders"].partitions[0].clone();
    assert_eq!((p.replicas, p.isr, p.leader), (ids(&[1]), ids(&[1]), Some(NodeId(1))));
}
