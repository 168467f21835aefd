//! Explicit replica assignment through real clients (librdkafka's admin API): CreateTopics and
//! CreatePartitions place each partition's replicas exactly as asked, in preference order (the first
//! leads), the replicas replicate, and assignments Kafka refuses are refused with
//! INVALID_REPLICA_ASSIGNMENT.

use std::time::Duration;

use futures_lite::future::block_on;
use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::types::RDKafkaErrorCode;

use crate::common::{Reports, cluster, partitions, wait_for};

fn create(admin: &AdminClient<DefaultClientContext>, topic: &str, lists: &[&[i32]]) -> Result<(), RDKafkaErrorCode> {
    let new = NewTopic::new(topic, lists.len() as i32, TopicReplication::Variable(lists));
    let results = block_on(admin.create_topics([&new], &AdminOptions::new())).expect("CreateTopics answered");
    results.into_iter().next().expect("one result").map(|_| ()).map_err(|(_, code)| code)
}

#[test]
fn explicit_replica_assignments_place_replicas_as_asked_and_bad_ones_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path(), 3, 1, &[]);
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &cluster.bootstrap).create().expect("admin client");

    assert_eq!(create(&admin, "placed", &[&[2, 3], &[3, 1]]), Ok(()));
    wait_for("the assignment in Metadata", Duration::from_secs(30), || {
        let seen = partitions(cluster.addr(1), "placed");
        seen.len() == 2
            && seen[&0].replicas == [2, 3]
            && seen[&1].replicas == [3, 1]
            && seen[&0].leader == 2
            && seen[&1].leader == 3
            && seen.values().all(|p| p.isr.len() == 2)
    });

    // Refused as Kafka refuses them: a broker twice, a broker that does not exist, uneven replica counts.
    assert_eq!(create(&admin, "twice", &[&[1, 1]]), Err(RDKafkaErrorCode::InvalidReplicaAssignment));
    assert_eq!(create(&admin, "unknown", &[&[1, 9]]), Err(RDKafkaErrorCode::InvalidReplicaAssignment));
    assert_eq!(create(&admin, "uneven", &[&[1, 2], &[3]]), Err(RDKafkaErrorCode::InvalidReplicaAssignment));
    assert!(partitions(cluster.addr(1), "twice").is_empty(), "nothing created");

    // CreatePartitions with the new partition's replicas.
    let grow = NewPartitions::new("placed", 3).assign(&[&[1, 2]]);
    let results = block_on(admin.create_partitions([&grow], &AdminOptions::new())).expect("CreatePartitions answered");
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    wait_for("the new partition as assigned", Duration::from_secs(30), || {
        partitions(cluster.addr(2), "placed").get(&2).is_some_and(|p| p.replicas == [1, 2] && p.leader == 1)
    });
    let bad = NewPartitions::new("placed", 4).assign(&[&[1, 2, 3]]);
    let results = block_on(admin.create_partitions([&bad], &AdminOptions::new())).expect("CreatePartitions answered");
    assert!(
        matches!(results.as_slice(), [Err((_, RDKafkaErrorCode::InvalidReplicaAssignment))]),
        "three replicas for a topic of two: {results:?}"
    );

    // The placed replicas replicate: acks=all to each partition succeeds with both in the ISR.
    let reports = Reports::default();
    let producer: BaseProducer<Reports> = ClientConfig::new()
        .set("bootstrap.servers", &cluster.bootstrap)
        .set("acks", "all")
        .create_with_context(reports.clone())
        .expect("producer");
    for p in 0..3 {
        producer.send(BaseRecord::<(), str>::to("placed").partition(p).payload("x")).expect("queued");
    }
    producer.flush(Duration::from_secs(30)).expect("flushed");
    let reports = reports.0.lock().unwrap();
    assert!(reports.len() == 3 && reports.iter().all(|r| r.3 && r.1 == 0), "{:?}", *reports);
}
