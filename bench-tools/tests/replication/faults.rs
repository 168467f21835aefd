//! Five brokers (so the quorum keeps a majority with two of them down) and a topic with one partition on
//! three of them. With one follower dead and the other stalled (SIGSTOP) the leader shrinks the ISR to
//! itself and refuses acks=all with NOT_ENOUGH_REPLICAS under `min.insync.replicas=2`; when the leader
//! dies too and the stalled follower resumes, the partition stays offline until the topic allows an
//! unclean election, and then the follower leads without the record it never had, and the quorum logs
//! the possible loss.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_lite::future::block_on;
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use shardlog_broker::client::KafkaClient;

use crate::common::{broker_log, cluster, partitions, wait_for};

const TOPIC: &str = "fragile";

/// The outcome of the one record a producer sends.
#[derive(Clone, Default)]
struct Outcome(Arc<Mutex<Option<Result<i64, KafkaError>>>>);

impl ClientContext for Outcome {}

impl ProducerContext for Outcome {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        *self.0.lock().unwrap() = Some(result.as_ref().map(|m| m.offset()).map_err(|(e, _)| e.clone()));
    }
}

/// Sends one record with acks=all and no retries; its offset, or the error the broker answered.
fn produce_one(bootstrap: &str, value: &str) -> Result<i64, KafkaError> {
    let outcome = Outcome::default();
    let producer: BaseProducer<Outcome> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("retries", "0")
        .set("message.timeout.ms", "20000")
        .create_with_context(outcome.clone())
        .expect("producer");
    producer.send(BaseRecord::<(), str>::to(TOPIC).partition(0).payload(value)).expect("queued");
    producer.flush(Duration::from_secs(30)).expect("a delivery report");
    outcome.0.lock().unwrap().take().expect("reported")
}

/// AlterConfigs of the topic (the whole set of overrides, as Kafka's AlterConfigs replaces them).
fn alter_topic(bootstrap: &str, configs: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", bootstrap).create().expect("admin client");
    let mut alter = AlterConfig::new(ResourceSpecifier::Topic(TOPIC));
    for (key, value) in configs {
        alter = alter.set(key, value);
    }
    let results = block_on(admin.alter_configs([&alter], &AdminOptions::new())).expect("AlterConfigs");
    assert!(results.iter().all(Result::is_ok), "{results:?}");
}

/// Every record of the partition, as (offset, value), read from the beginning.
fn read_all(bootstrap: &str, expected: usize) -> Vec<(i64, String)> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "faults-test")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(TOPIC, 0, Offset::Beginning).unwrap();
    consumer.assign(&assignment).unwrap();
    let mut read = Vec::new();
    wait_for("the records to read", Duration::from_secs(30), || {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            read.push((m.offset(), String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned()));
        }
        read.len() >= expected
    });
    read
}

#[test]
fn one_live_replica_of_three_refuses_acks_all_and_an_unclean_election_happens_only_when_the_topic_allows_it() {
    let dir = tempfile::tempdir().unwrap();
    // The lag time is well below the session timeout: followers leave the ISR for lagging, long before the
    // quorum could fence their brokers (which would take them out of every ISR too).
    let mut cluster = cluster(dir.path(), 5, 1, &["replica.lag.time.max.ms=3000", "broker.session.timeout.ms=20000"]);
    let configs = [("min.insync.replicas".to_string(), "2".to_string())];
    KafkaClient::connect(cluster.addr(1)).unwrap().create_topic(TOPIC, 1, 3, &configs).unwrap();
    wait_for("the partition led, with three in-sync replicas", Duration::from_secs(30), || {
        (1..=5).all(|b| partitions(cluster.addr(b), TOPIC).get(&0).is_some_and(|p| p.leader > 0 && p.isr.len() == 3))
    });
    let view = partitions(cluster.addr(1), TOPIC)[&0].clone();
    let leader = view.leader as usize;
    let followers: Vec<usize> = view.replicas.iter().map(|&r| r as usize).filter(|&r| r != leader).collect();
    let observer = (1..=5).find(|b| !view.replicas.contains(&(*b as i32))).unwrap();
    let bootstrap = cluster.bootstrap.clone();
    assert_eq!(produce_one(&bootstrap, "kept"), Ok(0));

    // One follower dies and the other stalls: past replica.lag.time.max.ms the leader takes both out of
    // the ISR (the quorum keeps its majority: three of five voters answer).
    let (dead, stalled) = (followers[0], followers[1]);
    cluster.kill(dead).unwrap();
    cluster.pause(stalled).unwrap();
    wait_for("the ISR shrunk to the leader", Duration::from_secs(30), || {
        partitions(cluster.addr(observer), TOPIC).get(&0).is_some_and(|p| p.isr == [leader as i32])
    });
    let shrunk = partitions(cluster.addr(observer), TOPIC)[&0].clone();
    assert!(
        shrunk.offline.is_empty(),
        "the followers left the ISR by replica.lag.time.max.ms, while their brokers were still live: {shrunk:?}"
    );
    assert_eq!(
        produce_one(&bootstrap, "refused"),
        Err(KafkaError::MessageProduction(RDKafkaErrorCode::NotEnoughReplicas)),
        "acks=all with an ISR of 1 under min.insync.replicas=2"
    );
    alter_topic(&bootstrap, &[("min.insync.replicas", "1")]);
    assert_eq!(produce_one(&bootstrap, "only on the leader"), Ok(1), "the ISR of 1 is enough now");

    // The leader dies too, and the stalled follower resumes (the quorum has its majority again): it is out
    // of the ISR, so by default nobody may lead.
    cluster.kill(leader).unwrap();
    cluster.resume(stalled).unwrap();
    wait_for("the resumed follower live", Duration::from_secs(30), || {
        partitions(cluster.addr(observer), TOPIC).get(&0).is_some_and(|p| !p.offline.contains(&(stalled as i32)))
    });
    wait_for("the partition offline", Duration::from_secs(60), || {
        partitions(cluster.addr(observer), TOPIC).get(&0).is_some_and(|p| p.leader == -1)
    });
    // The quorum took the leadership away while the follower was live: an unclean election was possible.
    let offline = partitions(cluster.addr(observer), TOPIC)[&0].clone();
    assert!(!offline.offline.contains(&(stalled as i32)), "{offline:?}");
    assert_eq!(offline.isr, [leader as i32], "the ISR keeps the dead leader, which has every record");

    alter_topic(&bootstrap, &[("min.insync.replicas", "1"), ("unclean.leader.election.enable", "true")]);
    wait_for("the resumed follower elected", Duration::from_secs(30), || {
        partitions(cluster.addr(observer), TOPIC).get(&0).is_some_and(|p| p.leader == stalled as i32)
    });
    // The record only the old leader had is gone, and its offset is used again.
    assert_eq!(produce_one(&bootstrap, "after"), Ok(1));
    assert_eq!(read_all(&bootstrap, 2), [(0, "kept".to_string()), (1, "after".to_string())]);
    let logged = broker_log(dir.path(), observer);
    assert!(
        logged.iter().any(|l| l.contains("WARN") && l.contains("unclean leader election, possible data loss")),
        "the quorum logs the unclean election on every voter"
    );
}
