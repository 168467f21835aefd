//! Three brokers, a topic with replication factor 3 and `min.insync.replicas=2`, an idempotent librdkafka
//! producer (acks=all, retries) writing while the leader of a partition is killed with SIGKILL and later
//! restarted, or paused with SIGSTOP past `replica.lag.time.max.ms` and resumed. Afterwards every
//! acknowledged record is at its acknowledged offset, exactly once and with no gap, the ISR is whole
//! again, and the three replicas of every partition hold the same bytes below the high watermark.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use shardlog_broker::client::KafkaClient;

use crate::common::{
    Reports, all_led_with_isr, broker_log, cluster, log_bytes, node_certificates, partitions, wait_for,
};

const TOPIC: &str = "replicated";
const PARTITIONS: i32 = 3;

/// What happens to the leader of partition 0 a third of the way through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// SIGKILL, restarted two thirds of the way through.
    Kill,
    /// SIGSTOP until the quorum has fenced it and every leader has taken it out of its ISR, then SIGCONT.
    Pause,
}

#[test]
fn an_idempotent_acks_all_producer_loses_and_repeats_nothing_through_a_leaders_sigkill_and_replicas_match() {
    produce_through(Fault::Kill, &[]);
}

#[test]
fn a_leader_paused_past_the_lag_time_leaves_every_isr_and_rejoins_without_losing_an_acknowledged_record() {
    produce_through(Fault::Pause, &[]);
}

/// The same with replication and the quorum over cluster mTLS, the node certificates made with openssl
/// as `docs/security.md` §8a says: a follower or voter that could not prove itself would stop the
/// cluster from forming, keeping its ISRs whole, or electing a new leader.
#[test]
fn with_cluster_mtls_a_leaders_sigkill_loses_and_repeats_no_acknowledged_record_and_nothing_is_refused() {
    let certificates = tempfile::tempdir().unwrap();
    let (keystore, truststore) = node_certificates(certificates.path(), 3);
    let keystore = format!("cluster.ssl.keystore.location={keystore}");
    let truststore = format!("cluster.ssl.truststore.location={truststore}");
    let logs = produce_through(Fault::Kill, &[&keystore, &truststore]);
    for (broker, log) in logs.iter().enumerate() {
        let refused: Vec<&str> = log
            .iter()
            .filter(|l| l.contains("refused a replication connection") || l.contains("quorum port: refused"))
            .map(String::as_str)
            .collect();
        assert!(refused.is_empty(), "broker {}: no peer was refused: {refused:#?}", broker + 1);
    }
}

/// Returns each broker's log lines once the cluster has stopped.
fn produce_through(fault: Fault, extra: &[&str]) -> Vec<Vec<String>> {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = vec!["replica.lag.time.max.ms=3000"];
    settings.extend_from_slice(extra);
    let mut cluster = cluster(dir.path(), 3, 2, &settings);
    let bootstrap = cluster.bootstrap.clone();
    let configs = [("min.insync.replicas".to_string(), "2".to_string())];
    KafkaClient::connect(cluster.addr(1)).unwrap().create_topic(TOPIC, PARTITIONS, 3, &configs).unwrap();
    wait_for("every broker to know the topic with three in-sync replicas", Duration::from_secs(30), || {
        (1..=3).all(|b| all_led_with_isr(cluster.addr(b), TOPIC, PARTITIONS as usize, 3))
    });
    let victim = partitions(cluster.addr(1), TOPIC)[&0].leader as usize;

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
            // The leader of partition 0 dies (or stalls) with records in flight; the producer keeps sending
            // until the quorum has fenced it and elected another in-sync replica.
            match fault {
                Fault::Kill => cluster.kill(victim).unwrap(),
                Fault::Pause => cluster.pause(victim).unwrap(),
            }
            let survivor = if victim == 1 { 2 } else { 1 };
            wait_for("a new leader for partition 0", Duration::from_secs(30), || {
                producer.poll(Duration::from_millis(50));
                partitions(cluster.addr(survivor), TOPIC)
                    .get(&0)
                    .is_some_and(|p| p.leader > 0 && p.leader as usize != victim)
            });
            if fault == Fault::Pause {
                // Past replica.lag.time.max.ms every leader proposes the stalled follower out of its ISR.
                wait_for("the paused broker out of every ISR", Duration::from_secs(30), || {
                    producer.poll(Duration::from_millis(50));
                    let seen = partitions(cluster.addr(survivor), TOPIC);
                    seen.len() == PARTITIONS as usize
                        && seen.values().all(|p| p.isr.len() == 2 && !p.isr.contains(&(victim as i32)))
                });
                cluster.resume(victim).unwrap();
            }
        }
        if i == 2 * per_partition / 3 && fault == Fault::Kill {
            cluster.restart(victim, 3).unwrap();
        }
    }
    let _ = producer.flush(Duration::from_secs(120));
    let reports = reports.0.lock().unwrap().clone();
    assert_eq!(reports.len(), sent, "a delivery report for every record");
    let failed: Vec<_> = reports.iter().filter(|r| !r.3).collect();
    assert!(failed.is_empty(), "every record acknowledged; failed: {:?}", &failed[..failed.len().min(5)]);

    // The restarted (or resumed) broker catches up and is back in every ISR.
    wait_for("the broker back in every ISR", Duration::from_secs(60), || {
        all_led_with_isr(cluster.addr(victim), TOPIC, PARTITIONS as usize, 3)
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
        let leader_copy = log_bytes(dir.path(), 1, TOPIC, p, high);
        assert!(!leader_copy.is_empty());
        for broker in 2..=3 {
            assert!(
                log_bytes(dir.path(), broker, TOPIC, p, high) == leader_copy,
                "partition {p}: broker {broker} differs from broker 1 below HW {high}"
            );
        }
    }
    (1..=3).map(|b| broker_log(dir.path(), b)).collect()
}
