//! What the replication process tests share: starting a cluster, reading partition state through
//! Metadata, collecting delivery reports, and reading a replica's log files.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::ClientContext;
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::ProducerContext;
use shardlog_bench::cluster::{Cluster, ClusterArgs};
use shardlog_broker::client::KafkaClient;
use shardlog_storage::batch::{BatchHeader, LOG_OVERHEAD};

/// One delivery report: (partition, offset, value, acknowledged).
pub type Report = (i32, i64, String, bool);

/// Every delivery report.
#[derive(Clone, Default)]
pub struct Reports(pub Arc<Mutex<Vec<Report>>>);

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

/// `brokers` brokers with `shards` shards each; a broker that stops heartbeating is fenced after 6 s
/// (so tests do not wait Kafka's 9 s) unless `settings` say otherwise, plus `settings`.
pub fn cluster(dir: &Path, brokers: usize, shards: usize, settings: &[&str]) -> Cluster {
    cluster_with(dir, brokers, shards, settings, Vec::new())
}

/// [`cluster`] with further command-line arguments for each broker (`ClusterArgs::broker_args`).
pub fn cluster_with(
    dir: &Path,
    brokers: usize,
    shards: usize,
    settings: &[&str],
    broker_args: Vec<Vec<String>>,
) -> Cluster {
    let mut all = vec!["broker.heartbeat.interval.ms=500".to_string()];
    if !settings.iter().any(|s| s.starts_with("broker.session.timeout.ms=")) {
        all.push("broker.session.timeout.ms=6000".to_string());
    }
    all.extend(settings.iter().map(|s| s.to_string()));
    Cluster::start(&ClusterArgs {
        brokers,
        base_port: 0,
        quorum_base_port: None,
        metrics_base_port: None,
        data_dir: dir.to_path_buf(),
        shards: Some(shards),
        shardlog: None,
        settings: all,
        log_dir: None,
        die_with_parent: false,
        broker_args,
        client_security: None,
    })
    .expect("the brokers start")
}

/// A partition as one broker's Metadata shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionView {
    /// -1: none.
    pub leader: i32,
    pub replicas: Vec<i32>,
    pub isr: Vec<i32>,
    pub offline: Vec<i32>,
}

/// Partition -> its state, as broker `addr` tells it (empty when it does not answer).
pub fn partitions(addr: &str, topic: &str) -> BTreeMap<i32, PartitionView> {
    let Ok(mut client) = KafkaClient::connect(addr) else { return BTreeMap::new() };
    let Ok(metadata) = client.metadata(Some(&[topic])) else { return BTreeMap::new() };
    let Some(found) = metadata.topics.iter().find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic)) else {
        return BTreeMap::new();
    };
    let ids = |v: &[kafka_protocol::messages::BrokerId]| v.iter().map(|b| b.0).collect::<Vec<_>>();
    found
        .partitions
        .iter()
        .map(|p| {
            let view = PartitionView {
                leader: p.leader_id.0,
                replicas: ids(&p.replica_nodes),
                isr: ids(&p.isr_nodes),
                offline: ids(&p.offline_replicas),
            };
            (p.partition_index, view)
        })
        .collect()
}

/// Whether broker `addr` shows `count` partitions of `topic`, each with a leader and an ISR of `isr`.
pub fn all_led_with_isr(addr: &str, topic: &str, count: usize, isr: usize) -> bool {
    let seen = partitions(addr, topic);
    seen.len() == count && seen.values().all(|p| p.leader > 0 && p.isr.len() == isr)
}

pub fn wait_for(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The bytes of a partition's log on one broker from offset 0 up to (not including) `end`: its segment
/// files in order, batch by batch (a preallocated or torn tail ends the walk).
pub fn log_bytes(dir: &Path, broker: usize, topic: &str, partition: i32, end: i64) -> Vec<u8> {
    let partition_dir = dir.join(format!("broker-{broker}")).join(format!("{topic}-{partition}"));
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

/// The lines of broker `id`'s log.
pub fn broker_log(dir: &Path, id: usize) -> Vec<String> {
    let path = dir.join(format!("broker-{id}")).join("broker.log");
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(String::from)
        .collect()
}

/// A cluster authority and node certificates for nodes 1..=`nodes` in `dir`, made with openssl as
/// `docs/security.md` §8a shows: the keystore setting's value (with `{id}` for the node id, see
/// `ClusterArgs::settings`) and the truststore's.
pub fn node_certificates(dir: &Path, nodes: u32) -> (String, String) {
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl").args(args).current_dir(dir).output().expect("openssl runs");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    openssl(
        &["req", "-x509", "-newkey", "rsa:3072", "-nodes", "-days", "3650", "-subj", "/CN=shardlog cluster CA"]
            .iter()
            .chain(&["-keyout", "cluster-ca.key", "-out", "cluster-ca.pem"])
            .copied()
            .collect::<Vec<_>>(),
    );
    std::fs::write(dir.join("node.ext"), "extendedKeyUsage=serverAuth,clientAuth\n").unwrap();
    for n in 1..=nodes {
        let (key, csr, crt) = (format!("node-{n}.key"), format!("node-{n}.csr"), format!("node-{n}.crt"));
        let subject = format!("/CN=node-{n}");
        openssl(&["req", "-newkey", "rsa:3072", "-nodes", "-subj", &subject, "-keyout", &key, "-out", &csr]);
        openssl(
            &["x509", "-req", "-in", &csr, "-CA", "cluster-ca.pem", "-CAkey", "cluster-ca.key"]
                .iter()
                .chain(&["-CAcreateserial", "-days", "365", "-out", &crt, "-extfile", "node.ext"])
                .copied()
                .collect::<Vec<_>>(),
        );
        let pem = std::fs::read_to_string(dir.join(&key)).unwrap() + &std::fs::read_to_string(dir.join(&crt)).unwrap();
        std::fs::write(dir.join(format!("node-{n}.pem")), pem).unwrap();
    }
    let keystore = dir.join("node-{id}.pem").display().to_string();
    (keystore, dir.join("cluster-ca.pem").display().to_string())
}

/// A certificate for the Kafka listeners of every broker on 127.0.0.1, of an authority of its own, made
/// with openssl as `docs/security.md` §8 shows: (the PEM keystore, the authority's certificate).
pub fn listener_certificate(dir: &Path) -> (String, String) {
    let openssl = |args: &[&str]| {
        let out = std::process::Command::new("openssl").args(args).current_dir(dir).output().expect("openssl runs");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let subject = "/CN=shardlog CA";
    openssl(&[
        "req", "-x509", "-newkey", "rsa:3072", "-nodes", "-days", "3650", "-subj", subject, "-keyout", "ca.key",
        "-out", "ca.pem",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "rsa:3072",
        "-nodes",
        "-subj",
        "/CN=127.0.0.1",
        "-keyout",
        "broker.key",
        "-out",
        "broker.csr",
    ]);
    std::fs::write(dir.join("broker.ext"), "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n").unwrap();
    openssl(&[
        "x509",
        "-req",
        "-in",
        "broker.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "365",
        "-out",
        "broker.crt",
        "-extfile",
        "broker.ext",
    ]);
    let pem = std::fs::read_to_string(dir.join("broker.key")).unwrap()
        + &std::fs::read_to_string(dir.join("broker.crt")).unwrap();
    std::fs::write(dir.join("broker.pem"), pem).unwrap();
    (dir.join("broker.pem").display().to_string(), dir.join("ca.pem").display().to_string())
}
