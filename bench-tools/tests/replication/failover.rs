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
    Reports, all_led_with_isr, broker_log, cluster_with, listener_certificate, log_bytes, node_certificates,
    partitions, wait_for,
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
    produce_through(Fault::Kill, &Security::default());
}

#[test]
fn a_leader_paused_past_the_lag_time_leaves_every_isr_and_rejoins_without_losing_an_acknowledged_record() {
    produce_through(Fault::Pause, &Security::default());
}

/// How the cluster is secured: settings of every broker, further arguments of each, and what the
/// clients connect to and with.
#[derive(Default)]
struct Security {
    settings: Vec<String>,
    broker_args: Vec<Vec<String>>,
    /// The clients' bootstrap list; `None`: the brokers' PLAINTEXT addresses.
    bootstrap: Option<String>,
    client: Vec<(&'static str, String)>,
}

/// Cluster mTLS settings, with the node certificates made in `dir`.
fn cluster_mtls(dir: &std::path::Path) -> Vec<String> {
    let (keystore, truststore) = node_certificates(dir, 3);
    vec![format!("cluster.ssl.keystore.location={keystore}"), format!("cluster.ssl.truststore.location={truststore}")]
}

/// No broker refused a peer.
fn assert_nothing_refused(logs: &[Vec<String>]) {
    for (broker, log) in logs.iter().enumerate() {
        let refused: Vec<&str> = log
            .iter()
            .filter(|l| l.contains("refused a replication connection") || l.contains("quorum port: refused"))
            .map(String::as_str)
            .collect();
        assert!(refused.is_empty(), "broker {}: no peer was refused: {refused:#?}", broker + 1);
    }
}

/// The same with replication and the quorum over cluster mTLS, the node certificates made with openssl
/// as `docs/security.md` §8a says: a follower or voter that could not prove itself would stop the
/// cluster from forming, keeping its ISRs whole, or electing a new leader.
#[test]
fn with_cluster_mtls_a_leaders_sigkill_loses_and_repeats_no_acknowledged_record_and_nothing_is_refused() {
    let certificates = tempfile::tempdir().unwrap();
    let security = Security { settings: cluster_mtls(certificates.path()), ..Security::default() };
    assert_nothing_refused(&produce_through(Fault::Kill, &security));
}

/// Secured everywhere: clients over SASL_SSL (SCRAM-SHA-512) on a listener that is also the inter-broker
/// listener, so followers reach it with TLS too and are told apart by their ClientHello; replication and
/// the quorum over cluster mTLS. (The brokers keep a PLAINTEXT listener for the test's own Metadata
/// calls.)
#[test]
fn secured_everywhere_a_leaders_sigkill_loses_and_repeats_no_acknowledged_record_and_nothing_is_refused() {
    let certificates = tempfile::tempdir().unwrap();
    let mut settings = cluster_mtls(certificates.path());
    let (listener_keystore, clients_ca) = listener_certificate(certificates.path());
    settings.extend([
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL".to_string(),
        "inter.broker.listener.name=SASL_SSL".to_string(),
        format!("ssl.keystore.location={listener_keystore}"),
        "sasl.enabled.mechanisms=SCRAM-SHA-512".to_string(),
    ]);
    let ports: Vec<u16> = (0..3).map(|_| shardlog_bench::cluster::free_port().unwrap()).collect();
    let broker_args = ports
        .iter()
        .map(|port| {
            let listeners = format!("listeners=SASL_SSL://127.0.0.1:{port},PLAINTEXT://127.0.0.1:{{port}}");
            let admin = "SCRAM-SHA-512=[name=admin,password=admin-secret]";
            ["--set", &listeners, "--add-scram", admin].map(String::from).to_vec()
        })
        .collect();
    let bootstrap = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
    let client = vec![
        ("security.protocol", "SASL_SSL".to_string()),
        ("sasl.mechanism", "SCRAM-SHA-512".to_string()),
        ("sasl.username", "admin".to_string()),
        ("sasl.password", "admin-secret".to_string()),
        ("ssl.ca.location", clients_ca),
    ];
    let security = Security { settings, broker_args, bootstrap: Some(bootstrap), client };
    assert_nothing_refused(&produce_through(Fault::Kill, &security));
}

/// Returns each broker's log lines once the cluster has stopped.
fn produce_through(fault: Fault, security: &Security) -> Vec<Vec<String>> {
    let dir = tempfile::tempdir().unwrap();
    let mut settings = vec!["replica.lag.time.max.ms=3000"];
    settings.extend(security.settings.iter().map(String::as_str));
    let mut cluster = cluster_with(dir.path(), 3, 2, &settings, security.broker_args.clone());
    let bootstrap = security.bootstrap.clone().unwrap_or_else(|| cluster.bootstrap.clone());
    let secured = |config: &mut ClientConfig| {
        for (key, value) in &security.client {
            config.set(*key, value);
        }
    };
    let configs = [("min.insync.replicas".to_string(), "2".to_string())];
    KafkaClient::connect(cluster.addr(1)).unwrap().create_topic(TOPIC, PARTITIONS, 3, &configs).unwrap();
    wait_for("every broker to know the topic with three in-sync replicas", Duration::from_secs(30), || {
        (1..=3).all(|b| all_led_with_isr(cluster.addr(b), TOPIC, PARTITIONS as usize, 3))
    });
    let victim = partitions(cluster.addr(1), TOPIC)[&0].leader as usize;

    let reports = Reports::default();
    let mut config = ClientConfig::new();
    secured(&mut config);
    let producer: BaseProducer<Reports> = config
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
    let mut config = ClientConfig::new();
    secured(&mut config);
    let consumer: BaseConsumer = config
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
