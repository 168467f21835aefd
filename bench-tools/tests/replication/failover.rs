//! Replication between real `shardlog` processes: three brokers, a topic with replication factor 3 and
//! `min.insync.replicas=2`, an idempotent librdkafka producer (acks=all, retries) writing while the leader
//! of a partition is killed with SIGKILL and later restarted. Afterwards every acknowledged record is at
//! its acknowledged offset, exactly once and with no gap, and the three replicas of every partition hold
//! the same bytes below the high watermark.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use shardlog_bench::cluster::{Cluster, ClusterArgs};
use shardlog_broker::client::KafkaClient;
use shardlog_storage::batch::{BatchHeader, LOG_OVERHEAD};

const TOPIC: &str = "replicated";
const PARTITIONS: i32 = 3;

/// One delivery report: (partition, offset, value, acknowledged).
type Report = (i32, i64, String, bool);

/// Every delivery report.
#[derive(Clone, Default)]
struct Reports(Arc<Mutex<Vec<Report>>>);

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let (message, ok) = match result {
            Ok(m) => (m, true),
            Err((_, m)) => (m, false),
        };
        let value = String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned();
        self.0.lock().unwrap().push((message.partition(), message.offset(), value, ok));
    }
}

fn three_brokers(dir: &Path) -> Cluster {
    Cluster::start(&ClusterArgs {
        brokers: 3,
        base_port: 0,
        quorum_base_port: None,
        data_dir: dir.to_path_buf(),
        shards: Some(2),
        shardlog: None,
        // A killed broker is fenced 6 s after its last heartbeat, so the test does not wait 9 s.
        settings: vec!["broker.session.timeout.ms=6000".into(), "broker.heartbeat.interval.ms=500".into()],
    })
    .expect("three brokers start")
}

/// Partition -> (leader, ISR) as broker `addr` tells it.
fn partitions(addr: &str) -> BTreeMap<i32, (i32, Vec<i32>)> {
    let Ok(mut client) = KafkaClient::connect(addr) else { return BTreeMap::new() };
    let Ok(metadata) = client.metadata(Some(&[TOPIC])) else { return BTreeMap::new() };
    let Some(topic) = metadata.topics.iter().find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == TOPIC)) else {
        return BTreeMap::new();
    };
    topic
        .partitions
        .iter()
        .map(|p| (p.partition_index, (p.leader_id.0, p.isr_nodes.iter().map(|b| b.0).collect())))
        .collect()
}

fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The bytes of a partition's log on one broker from offset 0 up to (not including) `end`: its segment
/// files in order, batch by batch (a preallocated or torn tail ends the walk).
fn log_bytes(dir: &Path, broker: usize, partition: i32, end: i64) -> Vec<u8> {
    let partition_dir = dir.join(format!("broker-{broker}")).join(format!("{TOPIC}-{partition}"));
    let mut segments: Vec<_> = std::fs::read_dir(&partition_dir)
        .unwrap_or_else(|e| panic!("{}: {e}", partition_dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .collect();
    segments.sort();
    let mut out = Vec::new();
    for segment in segments {
        let bytes = std::fs::read(&segment).unwrap();
        let mut at = 0;
        while let Ok(header) = BatchHeader::parse(&bytes[at..]) {
            let len = LOG_OVERHEAD + header.batch_length.max(0) as usize;
            if header.batch_length <= 0 || at + len > bytes.len() || header.base_offset >= end {
                break;
            }
            out.extend_from_slice(&bytes[at..at + len]);
            at += len;
        }
    }
    out
}

#[test]
fn an_idempotent_acks_all_producer_loses_and_repeats_nothing_through_a_leaders_sigkill_and_replicas_match() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster = three_brokers(dir.path());
    let bootstrap = cluster.bootstrap.clone();
    let configs = [("min.insync.replicas".to_string(), "2".to_string())];
    KafkaClient::connect(cluster.addr(1)).unwrap().create_topic(TOPIC, PARTITIONS, 3, &configs).unwrap();
    wait_for("every broker to know the topic with three in-sync replicas", Duration::from_secs(30), || {
        (1..=3).all(|b| {
            let seen = partitions(cluster.addr(b));
            seen.len() == PARTITIONS as usize && seen.values().all(|(leader, isr)| *leader > 0 && isr.len() == 3)
        })
    });
    let victim = partitions(cluster.addr(1))[&0].0 as usize;

    let reports = Reports::default();
    let producer: BaseProducer<Reports> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "90000")
        .set("topic.metadata.refresh.interval.ms", "500")
        .create_with_context(reports.clone())
        .expect("producer");
    let per_partition = 400;
    let mut sent = 0;
    for i in 0..per_partition {
        for p in 0..PARTITIONS {
            let value = format!("p{p}-{i:05}");
            producer.send(BaseRecord::<(), str>::to(TOPIC).partition(p).payload(&value)).expect("queued");
            sent += 1;
        }
        producer.poll(Duration::from_millis(2));
        if i == per_partition / 3 {
            // The leader of partition 0 dies with records in flight; the producer keeps sending until the
            // quorum has fenced it and elected another in-sync replica.
            cluster.kill(victim).unwrap();
            let survivor = if victim == 1 { 2 } else { 1 };
            wait_for("a new leader for partition 0", Duration::from_secs(30), || {
                producer.poll(Duration::from_millis(50));
                partitions(cluster.addr(survivor))
                    .get(&0)
                    .is_some_and(|(leader, _)| *leader > 0 && *leader as usize != victim)
            });
        }
        if i == 2 * per_partition / 3 {
            cluster.restart(victim, 3).unwrap();
        }
    }
    let _ = producer.flush(Duration::from_secs(120));
    let reports = reports.0.lock().unwrap().clone();
    assert_eq!(reports.len(), sent, "a delivery report for every record");
    let failed: Vec<_> = reports.iter().filter(|r| !r.3).collect();
    assert!(failed.is_empty(), "every record acknowledged; failed: {:?}", &failed[..failed.len().min(5)]);

    // The restarted broker catches up and is back in every ISR.
    wait_for("the restarted broker back in every ISR", Duration::from_secs(60), || {
        let seen = partitions(cluster.addr(victim));
        seen.len() == PARTITIONS as usize && seen.values().all(|(leader, isr)| *leader > 0 && isr.len() == 3)
    });

    // Every acknowledged record is read back at its acknowledged offset; each value once, none missing.
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "replication-test")
        .set("enable.auto.commit", "false")
        .set("topic.metadata.refresh.interval.ms", "500")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        assignment.add_partition_offset(TOPIC, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut read: BTreeMap<(i32, i64), String> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while read.len() < sent {
        assert!(Instant::now() < deadline, "read {} of {sent} records", read.len());
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let value = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            read.insert((m.partition(), m.offset()), value);
        }
    }
    for (p, offset, value, _) in &reports {
        assert_eq!(read.get(&(*p, *offset)), Some(value), "acknowledged record at {p}/{offset}");
    }
    for p in 0..PARTITIONS {
        let values: Vec<&String> = read.range((p, 0)..(p + 1, 0)).map(|(_, v)| v).collect();
        let expected: Vec<String> = (0..per_partition).map(|i| format!("p{p}-{i:05}")).collect();
        assert_eq!(values.len(), expected.len(), "partition {p}: no duplicate, no gap");
        assert!(values.iter().zip(&expected).all(|(a, b)| *a == b), "partition {p} in order, exactly once");
    }

    // The replicas hold the same bytes below the high watermark.
    let mut high_watermarks = BTreeMap::new();
    for p in 0..PARTITIONS {
        let (_, high) = consumer.fetch_watermarks(TOPIC, p, Duration::from_secs(10)).unwrap();
        high_watermarks.insert(p, high);
    }
    drop(consumer);
    cluster.stop().unwrap();
    for (p, high) in high_watermarks {
        let leader_copy = log_bytes(dir.path(), 1, p, high);
        assert!(!leader_copy.is_empty());
        for broker in 2..=3 {
            assert!(
                log_bytes(dir.path(), broker, p, high) == leader_copy,
                "partition {p}: broker {broker} differs from broker 1 below HW {high}"
            );
        }
    }
}
