//! FindCoordinator for transactional ids (key type 1) against the real binary: the first ask creates
//! `__transaction_state` and is answered COORDINATOR_NOT_AVAILABLE until the id's partition has a leader,
//! then with that leader. The topic is created as Kafka creates it: `transaction.state.log.num.partitions`
//! partitions, compacted, its replication factor at most the live brokers and its `min.insync.replicas`
//! at most that (one broker alone gets RF 1, min ISR 1; three get Kafka's 3 and 2). It is internal:
//! clients can neither produce to it nor create, grow or delete it.

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, CreatePartitionsRequest, DeleteTopicsRequest, DescribeConfigsRequest, FindCoordinatorRequest,
    MetadataRequest, MetadataResponse, ResponseKind,
};
use kafka_protocol::protocol::StrBytes;

use common::requests::{batch, create, name, produce_one};
use common::{Broker, receive, send};

const TOPIC: &str = "__transaction_state";

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

/// FindCoordinator for transactional ids at `version` (v4+: all `ids` in one request; before: the first
/// alone): per id, (error code, node id, port).
fn find_transaction_coordinators(stream: &mut TcpStream, version: i16, ids: &[&str]) -> Vec<(i16, i32, i32)> {
    let mut req = FindCoordinatorRequest::default().with_key_type(1);
    if version >= 4 {
        req = req.with_coordinator_keys(ids.iter().map(|id| s(id)).collect());
    } else {
        req = req.with_key(s(ids[0]));
    }
    send(stream, ApiKey::FindCoordinator, version, 1, &req);
    let ResponseKind::FindCoordinator(r) = receive(stream, ApiKey::FindCoordinator, version).1 else {
        panic!("wrong response")
    };
    if version >= 4 {
        let answered: Vec<&str> = r.coordinators.iter().map(|c| c.key.as_str()).collect();
        assert_eq!(answered, ids, "one answer per key, in order");
        r.coordinators.iter().map(|c| (c.error_code, c.node_id.0, c.port)).collect()
    } else {
        vec![(r.error_code, r.node_id.0, r.port)]
    }
}

/// Asks until every id has a coordinator (30 s at most); every answer before is COORDINATOR_NOT_AVAILABLE.
fn until_coordinated(stream: &mut TcpStream, version: i16, ids: &[&str]) -> Vec<(i16, i32, i32)> {
    let not_available = ResponseError::CoordinatorNotAvailable.code();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let answers = find_transaction_coordinators(stream, version, ids);
        for (code, node, _) in &answers {
            assert!(*code == 0 || (*code == not_available && *node == -1), "{answers:?}");
        }
        if answers.iter().all(|(code, _, _)| *code == 0) {
            return answers;
        }
        assert!(Instant::now() < deadline, "no coordinator after 30 s: {answers:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn metadata(stream: &mut TcpStream, topics: Option<&[&str]>) -> MetadataResponse {
    let topics = topics.map(|t| t.iter().map(|n| MetadataRequestTopic::default().with_name(Some(name(n)))).collect());
    send(stream, ApiKey::Metadata, 12, 1, &MetadataRequest::default().with_topics(topics));
    let ResponseKind::Metadata(r) = receive(stream, ApiKey::Metadata, 12).1 else { panic!("wrong response") };
    r
}

/// The topic's settings as DescribeConfigs v4 reports them.
fn topic_configs(stream: &mut TcpStream, topic: &str) -> Vec<(String, String)> {
    let req = DescribeConfigsRequest::default()
        .with_resources(vec![DescribeConfigsResource::default().with_resource_type(2).with_resource_name(s(topic))]);
    send(stream, ApiKey::DescribeConfigs, 4, 1, &req);
    let ResponseKind::DescribeConfigs(r) = receive(stream, ApiKey::DescribeConfigs, 4).1 else { panic!() };
    assert_eq!(r.results[0].error_code, 0);
    r.results[0]
        .configs
        .iter()
        .map(|c| (c.name.as_str().to_string(), c.value.as_ref().map_or(String::new(), |v| v.as_str().to_string())))
        .collect()
}

fn config(configs: &[(String, String)], key: &str) -> String {
    configs.iter().find(|(k, _)| k == key).unwrap_or_else(|| panic!("no {key}: {configs:?}")).1.clone()
}

/// (is_internal, partition count, replicas of each partition) of `__transaction_state`.
fn described_topic(stream: &mut TcpStream) -> (bool, usize, Vec<usize>) {
    let r = metadata(stream, Some(&[TOPIC]));
    let t = &r.topics[0];
    assert_eq!(t.error_code, 0);
    (t.is_internal, t.partitions.len(), t.partitions.iter().map(|p| p.replica_nodes.len()).collect())
}

#[test]
fn a_lone_broker_creates_the_transaction_state_topic_at_the_first_lookup_and_coordinates_every_id() {
    let broker = Broker::start(2);
    let mut st = broker.connect();
    assert_eq!(metadata(&mut st, Some(&[TOPIC])).topics[0].error_code, ResponseError::UnknownTopicOrPartition.code());

    // v3, one id: COORDINATOR_NOT_AVAILABLE while the topic is created, then this broker.
    let answers = until_coordinated(&mut st, 3, &["my-transactional-id"]);
    assert_eq!(answers, vec![(0, 1, broker.port as i32)]);
    // v4, several ids at once (their partitions differ: 46, 9, 0 of 50): all here.
    let ids = ["my-transactional-id", "txn-0", "polygenelubricants"];
    assert_eq!(until_coordinated(&mut st, 4, &ids), vec![(0, 1, broker.port as i32); 3]);

    let (internal, partitions, replicas) = described_topic(&mut st);
    assert!(internal, "Metadata marks {TOPIC} internal");
    assert_eq!(partitions, 50);
    assert!(replicas.iter().all(|r| *r == 1), "RF 1 on one broker: {replicas:?}");
    let configs = topic_configs(&mut st, TOPIC);
    assert_eq!(config(&configs, "cleanup.policy"), "compact");
    assert_eq!(config(&configs, "min.insync.replicas"), "1", "min ISR 2 capped at the RF");
    assert_eq!(config(&configs, "segment.bytes"), "104857600");

    // Out of clients' reach.
    let invalid_topic = ResponseError::InvalidTopicException.code();
    assert_eq!(produce_one(&mut st, TOPIC, 0, &batch(1, 1, 0)).0, invalid_topic, "produce");
    assert_eq!(create(&mut st, TOPIC, 1, 1, &[]), ResponseError::InvalidRequest.code(), "create");
    let grow = CreatePartitionsRequest::default().with_topics(vec![
        CreatePartitionsTopic::default().with_name(name(TOPIC)).with_count(60).with_assignments(None),
    ]);
    send(&mut st, ApiKey::CreatePartitions, 3, 1, &grow);
    let ResponseKind::CreatePartitions(r) = receive(&mut st, ApiKey::CreatePartitions, 3).1 else { panic!() };
    assert_eq!(r.results[0].error_code, ResponseError::InvalidRequest.code(), "add partitions");
    let delete = DeleteTopicsRequest::default().with_topic_names(vec![name(TOPIC)]).with_timeout_ms(5000);
    send(&mut st, ApiKey::DeleteTopics, 4, 1, &delete);
    let ResponseKind::DeleteTopics(r) = receive(&mut st, ApiKey::DeleteTopics, 4).1 else { panic!() };
    assert_eq!(r.responses[0].error_code, invalid_topic, "delete");
    assert_eq!(described_topic(&mut st).1, 50, "still there, as it was");

    // A key type this broker does not serve is refused per key, and creates nothing.
    send(
        &mut st,
        ApiKey::FindCoordinator,
        4,
        1,
        &FindCoordinatorRequest::default().with_key_type(2).with_coordinator_keys(vec![s("k")]),
    );
    let ResponseKind::FindCoordinator(r) = receive(&mut st, ApiKey::FindCoordinator, 4).1 else { panic!() };
    assert_eq!(r.coordinators[0].error_code, ResponseError::InvalidRequest.code());
}

#[test]
fn the_transaction_state_topics_settings_come_from_the_transaction_state_log_settings() {
    let broker = Broker::start_with(
        1,
        &["--set", "transaction.state.log.num.partitions=7", "--set", "transaction.state.log.segment.bytes=1048576"],
    );
    let mut st = broker.connect();
    until_coordinated(&mut st, 3, &["app"]);
    assert_eq!(described_topic(&mut st).1, 7);
    let configs = topic_configs(&mut st, TOPIC);
    assert_eq!(config(&configs, "segment.bytes"), "1048576");
    // The group coordinator's topic is another one, created only when a group asks.
    assert_eq!(metadata(&mut st, Some(&["__consumer_offsets"])).topics[0].error_code, 3);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn three_live_brokers_give_the_topic_kafkas_replication_factor_three_and_min_isr_two() {
    // The quorum's only voter on broker 1; brokers 2 and 3 reach it over the network.
    let voter = format!("1@127.0.0.1:{}", free_port());
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let mut brokers: Vec<Broker> = (0..3)
        .map(|i| {
            let id = (i + 1).to_string();
            Broker::spawn_at(dirs[i].path(), free_port(), 1, &["--node-id", &id, "--quorum-voters", &voter], None)
        })
        .collect();
    for broker in &mut brokers {
        broker.wait_until_it_answers();
    }
    let mut st = brokers[0].connect();
    // All three registered before the first lookup, which caps the replication factor at the live brokers.
    let deadline = Instant::now() + Duration::from_secs(30);
    while metadata(&mut st, Some(&[])).brokers.len() < 3 {
        assert!(Instant::now() < deadline, "three brokers never registered");
        std::thread::sleep(Duration::from_millis(100));
    }

    let ids = ["my-transactional-id", "txn-0", "app-producer-1", "payments"];
    let answers = until_coordinated(&mut st, 4, &ids);
    let ports: Vec<i32> = brokers.iter().map(|b| b.port as i32).collect();
    for (code, node, port) in &answers {
        assert_eq!(*code, 0);
        assert!((1..=3).contains(node) && *port == ports[*node as usize - 1], "{answers:?} {ports:?}");
    }
    let (internal, partitions, replicas) = described_topic(&mut st);
    assert!(internal);
    assert_eq!(partitions, 50);
    assert!(replicas.iter().all(|r| *r == 3), "RF 3: {replicas:?}");
    assert_eq!(config(&topic_configs(&mut st, TOPIC), "min.insync.replicas"), "2");
    // Any broker answers the same for an id.
    let mut other = brokers[2].connect();
    assert_eq!(until_coordinated(&mut other, 4, &ids), answers);
}
