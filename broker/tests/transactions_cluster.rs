//! Transactions on three brokers with replication factor 3 (the real binary, three standalone voters):
//! real clients commit and abort with coordinators, partition leaders and markers spread over the
//! brokers, and a transaction whose coordinator's broker is killed (SIGKILL) while it commits is committed
//! whole by the next coordinator, which rebuilds the id from its replica of `__transaction_state`.

mod common;

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use shardlog_broker::client::KafkaClient;
use shardlog_broker::txn::{TRANSACTION_STATE_TOPIC, transaction_partition};

use common::cluster::{Cluster, FIRST_BROKER_ID};

#[test]
fn real_clients_commit_and_abort_transactions_on_three_brokers_with_three_replicas() {
    let cluster = Cluster::start(&[]);
    common::run_client_script("transactions.py", &[&cluster.bootstrap(), "txn-cluster", "3"]);
}

/// The broker index of the leader of `transactional_id`'s `__transaction_state` partition, once all three
/// replicas of that partition are in sync.
fn coordinator_in_sync(cluster: &Cluster, client: &mut KafkaClient, transactional_id: &str) -> usize {
    cluster.wait_until("the id's __transaction_state partition led, with three replicas in sync", || {
        let metadata = client.metadata(Some(&[TRANSACTION_STATE_TOPIC])).map_err(|e| e.to_string())?;
        let topic = metadata.topics.first().ok_or("no topic")?;
        let partition = transaction_partition(transactional_id, topic.partitions.len() as u32);
        let p = topic.partitions.iter().find(|p| p.partition_index == partition).ok_or("no partition")?;
        if p.isr_nodes.len() != 3 || p.leader_id.0 < 0 {
            return Err(format!("{p:?}"));
        }
        Ok(p.leader_id.0 as usize - FIRST_BROKER_ID as usize)
    })
}

#[test]
fn a_transaction_whose_coordinator_is_killed_while_it_commits_is_committed_whole() {
    const RECORDS: i32 = 300;
    let mut cluster = Cluster::start(&[]);
    let mut client = cluster.client();
    let bootstrap = cluster.bootstrap();
    let mut admin = KafkaClient::connect(&bootstrap).unwrap();
    admin.create_topic("killed-mid-commit", 3, 3, &[("min.insync.replicas".to_string(), "2".to_string())]).unwrap();
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("transactional.id", "killed-mid-commit")
        .create()
        .unwrap();
    let timeout = Duration::from_secs(60);
    producer.init_transactions(timeout).unwrap();
    let coordinator = coordinator_in_sync(&cluster, &mut client, "killed-mid-commit");
    producer.begin_transaction().unwrap();
    for i in 0..RECORDS {
        let value = format!("record-{i}");
        let record = BaseRecord::<(), _>::to("killed-mid-commit").payload(&value).partition(i % 3);
        producer.send(record).map_err(|(e, _)| e).unwrap();
    }
    producer.flush(timeout).unwrap();
    // The commit starts, and the coordinator's broker dies while it runs (its EndTxn in flight, its
    // PrepareCommit being written, or its markers being sent).
    let committing = std::thread::spawn(move || {
        let committed = producer.commit_transaction(Duration::from_secs(90));
        (committed, producer)
    });
    std::thread::sleep(Duration::from_millis(5));
    cluster.kill(coordinator);
    let (committed, _producer) = committing.join().unwrap();
    committed.expect("the commit goes through on the next coordinator");

    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", cluster.live_bootstrap())
        .set("group.id", "killed-mid-commit-check")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for p in 0..3 {
        assignment.add_partition_offset("killed-mid-commit", p, Offset::Beginning).unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut seen = Vec::new();
    cluster.wait_until("read_committed to see every record of the transaction", || {
        while let Some(m) = consumer.poll(Duration::from_millis(200)) {
            let m = m.map_err(|e| e.to_string())?;
            seen.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
        }
        if seen.len() >= RECORDS as usize { Ok(()) } else { Err(format!("{} records", seen.len())) }
    });
    seen.sort();
    let mut expected: Vec<String> = (0..RECORDS).map(|i| format!("record-{i}")).collect();
    expected.sort();
    assert_eq!(seen, expected, "each record once");
}
