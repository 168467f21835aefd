//! ElectLeaders against real brokers: a preferred election brings leadership back to the first replica
//! once it has rejoined the ISR (and is not needed while it leads); an unclean one gives a partition whose
//! only in-sync replica died the live out-of-sync replica, which the quorum logs as possible data loss.
//! With `auto.leader.rebalance.enable` (the default) the quorum's leader does the preferred election by
//! itself, every `leader.imbalance.check.interval.seconds`.

use std::time::Duration;

use futures_lite::future::block_on;
use kafka_protocol::messages::elect_leaders_request::TopicPartitions;
use kafka_protocol::messages::{ApiKey, ElectLeadersRequest, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use shardlog_broker::client::KafkaClient;

use crate::common::{broker_log, cluster, partitions, wait_for};

/// ElectLeaders v2 (`election_type` 0 preferred, 1 unclean) for partition 0 of `topic` (`None`: every
/// partition that needs it); (topic, partition, error code) of each result.
fn elect(addr: &str, election_type: i8, topic: Option<&str>) -> Vec<(String, i32, i16)> {
    let asked = topic.map(|t| {
        vec![TopicPartitions::default().with_topic(TopicName(StrBytes::from_string(t.into()))).with_partitions(vec![0])]
    });
    let req = ElectLeadersRequest::default()
        .with_election_type(election_type)
        .with_topic_partitions(asked)
        .with_timeout_ms(30_000);
    let answer = KafkaClient::connect(addr).unwrap().call_any(ApiKey::ElectLeaders, 2, &req).unwrap();
    let ResponseKind::ElectLeaders(r) = answer else { panic!("an ElectLeaders answer") };
    assert_eq!(r.error_code, 0);
    r.replica_election_results
        .iter()
        .flat_map(|t| t.partition_result.iter().map(|p| (t.topic.0.to_string(), p.partition_id, p.error_code)))
        .collect()
}

fn create(bootstrap: &str, topic: &str, replicas: &[i32]) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("admin client");
    let lists = [replicas];
    let new = NewTopic::new(topic, 1, TopicReplication::Variable(&lists));
    let results = block_on(admin.create_topics([&new], &AdminOptions::new())).expect("CreateTopics");
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}

#[test]
fn preferred_and_unclean_leader_elections() {
    let dir = tempfile::tempdir().unwrap();
    // Without the automatic rebalance, which would do the preferred election by itself.
    let settings = ["replica.lag.time.max.ms=3000", "auto.leader.rebalance.enable=false"];
    let mut cluster = cluster(dir.path(), 3, 1, &settings);
    let bootstrap = cluster.bootstrap.clone();
    create(&bootstrap, "preferred", &[1, 2, 3]);
    wait_for("broker 1 leading with three in sync", Duration::from_secs(30), || {
        partitions(cluster.addr(2), "preferred").get(&0).is_some_and(|p| p.leader == 1 && p.isr.len() == 3)
    });
    const ELECTION_NOT_NEEDED: i16 = 84;
    assert_eq!(elect(cluster.addr(2), 0, Some("preferred")), [("preferred".into(), 0, ELECTION_NOT_NEEDED)]);

    // Broker 1 dies: broker 2 leads. Back and in sync again, it is not leader until asked.
    cluster.kill(1).unwrap();
    wait_for("broker 2 leading", Duration::from_secs(30), || {
        partitions(cluster.addr(2), "preferred").get(&0).is_some_and(|p| p.leader == 2)
    });
    cluster.restart(1, 3).unwrap();
    wait_for("broker 1 back in the ISR", Duration::from_secs(30), || {
        partitions(cluster.addr(2), "preferred").get(&0).is_some_and(|p| p.isr.len() == 3)
    });
    assert_eq!(partitions(cluster.addr(2), "preferred")[&0].leader, 2);
    // Without a list: every partition whose preferred replica does not lead.
    assert_eq!(elect(cluster.addr(3), 0, None), [("preferred".into(), 0, 0)]);
    wait_for("broker 1 leading again", Duration::from_secs(30), || {
        (1..=3).all(|b| partitions(cluster.addr(b), "preferred").get(&0).is_some_and(|p| p.leader == 1))
    });

    // Unclean: broker 3 stalls out of the ISR of "lonely" (replicas 2, 3), broker 2 dies, broker 3
    // resumes: only an unclean election can give the partition a leader.
    create(&bootstrap, "lonely", &[2, 3]);
    wait_for("lonely in sync", Duration::from_secs(30), || {
        partitions(cluster.addr(1), "lonely").get(&0).is_some_and(|p| p.leader == 2 && p.isr.len() == 2)
    });
    cluster.pause(3).unwrap();
    wait_for("broker 3 out of the ISR", Duration::from_secs(30), || {
        partitions(cluster.addr(1), "lonely").get(&0).is_some_and(|p| p.isr == [2])
    });
    cluster.kill(2).unwrap();
    cluster.resume(3).unwrap();
    wait_for("lonely offline with broker 3 live", Duration::from_secs(60), || {
        partitions(cluster.addr(1), "lonely").get(&0).is_some_and(|p| p.leader == -1 && !p.offline.contains(&3))
    });
    const PREFERRED_LEADER_NOT_AVAILABLE: i16 = 80;
    assert_eq!(elect(cluster.addr(1), 0, Some("lonely")), [("lonely".into(), 0, PREFERRED_LEADER_NOT_AVAILABLE)]);
    assert_eq!(elect(cluster.addr(1), 1, Some("lonely")), [("lonely".into(), 0, 0)], "unclean election");
    wait_for("broker 3 leading lonely", Duration::from_secs(30), || {
        partitions(cluster.addr(1), "lonely").get(&0).is_some_and(|p| p.leader == 3 && p.isr == [3])
    });
    assert!(broker_log(dir.path(), 1).iter().any(|l| l.contains("unclean leader election, possible data loss")));
    assert_eq!(elect(cluster.addr(1), 1, Some("lonely")), [("lonely".into(), 0, ELECTION_NOT_NEEDED)]);
}

#[test]
fn auto_leader_rebalance_gives_a_returning_preferred_replica_its_leadership_back() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = cluster(dir.path(), 3, 1, &["leader.imbalance.check.interval.seconds=1"]);
    create(&cluster.bootstrap.clone(), "balanced", &[1, 2, 3]);
    wait_for("broker 1 leading with three in sync", Duration::from_secs(30), || {
        partitions(cluster.addr(2), "balanced").get(&0).is_some_and(|p| p.leader == 1 && p.isr.len() == 3)
    });
    cluster.kill(1).unwrap();
    wait_for("broker 2 leading", Duration::from_secs(30), || {
        partitions(cluster.addr(2), "balanced").get(&0).is_some_and(|p| p.leader == 2)
    });
    cluster.restart(1, 3).unwrap();
    // Nobody asks: once broker 1 is back in sync, the quorum's leader moves the leadership back.
    wait_for("broker 1 leading again by itself", Duration::from_secs(60), || {
        (1..=3).all(|b| partitions(cluster.addr(b), "balanced").get(&0).is_some_and(|p| p.leader == 1))
    });
}
