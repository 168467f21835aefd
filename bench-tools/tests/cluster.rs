//! Three `shardlog` brokers, each running one of the quorum's three voters, started by the launcher behind
//! `shardlog-bench cluster --brokers 3`: a 6-partition topic with replication factor 1 spreads over all
//! three; librdkafka produces to and consumes from every partition through one bootstrap broker; a
//! broker killed with SIGKILL takes its partitions away (leaderless, produce to them fails) while the
//! others go on; restarted, it brings them back with their data. A topic deleted while a broker is down
//! has its logs there set aside (kept, never served) once the broker is back.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_protocol::messages::{ApiKey, InitProducerIdRequest, ProducerId, ResponseKind};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use shardlog_bench::cluster::{Cluster, ClusterArgs};
use shardlog_broker::client::KafkaClient;

const TOPIC: &str = "spread";
const PARTITIONS: i32 = 6;

/// Records every delivery report: (partition, value, acknowledged).
#[derive(Clone, Default)]
struct Reports(Arc<Mutex<Vec<(i32, String, bool)>>>);

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let (message, ok) = match result {
            Ok(m) => (m, true),
            Err((_, m)) => (m, false),
        };
        let value = String::from_utf8_lossy(message.payload().unwrap_or_default()).into_owned();
        self.0.lock().unwrap().push((message.partition(), value, ok));
    }
}

/// Sends `values` to partition `partition` and returns how many were acknowledged.
fn produce(bootstrap: &str, partition_values: &[(i32, String)], timeout_ms: u64) -> Vec<(i32, String, bool)> {
    let reports = Reports::default();
    let producer: BaseProducer<Reports> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("message.timeout.ms", timeout_ms.to_string())
        .set("topic.metadata.refresh.interval.ms", "500")
        .create_with_context(reports.clone())
        .expect("producer");
    for (partition, value) in partition_values {
        producer.send(BaseRecord::<(), str>::to(TOPIC).partition(*partition).payload(value)).expect("queued");
    }
    // Flushing waits for every report, acknowledged or failed (each fails by message.timeout.ms at most).
    let _ = producer.flush(Duration::from_millis(timeout_ms + 30_000));
    let reports = reports.0.lock().unwrap().clone();
    assert_eq!(reports.len(), partition_values.len(), "a delivery report for every record");
    reports
}

/// Reads `partitions` from the beginning until each has `expected[p]` records; returns the values read.
fn consume(bootstrap: &str, expected: &BTreeMap<i32, usize>) -> BTreeMap<i32, Vec<String>> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "cluster-test")
        .set("enable.auto.commit", "false")
        .set("topic.metadata.refresh.interval.ms", "500")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for p in expected.keys() {
        assignment.add_partition_offset(TOPIC, *p, Offset::Beginning).unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut read: BTreeMap<i32, Vec<String>> = expected.keys().map(|p| (*p, Vec::new())).collect();
    let deadline = Instant::now() + Duration::from_secs(90);
    while expected.iter().any(|(p, n)| read[p].len() < *n) {
        assert!(Instant::now() < deadline, "not every record came back: read {:?}", counts(&read));
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let value = String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned();
            read.get_mut(&m.partition()).expect("an assigned partition").push(value);
        }
    }
    read
}

fn counts(read: &BTreeMap<i32, Vec<String>>) -> BTreeMap<i32, usize> {
    read.iter().map(|(p, v)| (*p, v.len())).collect()
}

/// Partition -> leader id (-1: none), from broker `addr`'s Metadata.
fn leaders(addr: &str) -> BTreeMap<i32, i32> {
    leaders_of(addr, TOPIC)
}

/// Each partition's leader as `addr` tells it (none while it does not know the topic yet).
fn leaders_of(addr: &str, name: &str) -> BTreeMap<i32, i32> {
    let metadata = KafkaClient::connect(addr).unwrap().metadata(Some(&[name])).unwrap();
    let topic = metadata.topics.iter().find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == name)).unwrap();
    topic.partitions.iter().map(|p| (p.partition_index, p.leader_id.0)).collect()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn values(partition: i32, round: &str, n: usize) -> Vec<(i32, String)> {
    (0..n).map(|i| (partition, format!("{round}-p{partition}-{i}"))).collect()
}

/// Three brokers (each with one of the quorum's voters) on free ports, with their data in `dir`.
fn three_brokers(dir: &std::path::Path, shards: usize, settings: &[&str]) -> Cluster {
    Cluster::start(&ClusterArgs {
        brokers: 3,
        base_port: 0,
        quorum_base_port: None,
        metrics_base_port: None,
        data_dir: dir.to_path_buf(),
        shards: Some(shards),
        shardlog: None,
        settings: settings.iter().map(|s| s.to_string()).collect(),
        log_dir: None,
        die_with_parent: false,
        broker_args: Vec::new(),
        client_security: None,
    })
    .expect("three brokers start")
}

#[test]
fn three_brokers_spread_a_topic_and_a_killed_broker_takes_its_partitions_away_and_back() {
    let dir = tempfile::tempdir().unwrap();
    // A killed broker is fenced 6 s after its last heartbeat instead of 9 s (a live one heartbeats
    // twelve times a session, so a loaded machine does not get it fenced).
    let mut cluster =
        three_brokers(dir.path(), 2, &["broker.session.timeout.ms=6000", "broker.heartbeat.interval.ms=500"]);
    // Everything goes through broker 1 as the only bootstrap server: clients find the others from it.
    let bootstrap = cluster.addr(1).to_string();
    KafkaClient::connect(&bootstrap).unwrap().create_topic(TOPIC, PARTITIONS, 1, &[]).unwrap();

    let led = leaders(&bootstrap);
    let mut per_broker: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
    for (p, leader) in &led {
        per_broker.entry(*leader).or_default().push(*p);
    }
    assert_eq!(per_broker.keys().copied().collect::<Vec<_>>(), vec![1, 2, 3], "every broker leads: {led:?}");
    assert!(per_broker.values().all(|ps| ps.len() == 2), "two partitions each: {led:?}");
    // The other brokers learn of the topic from the quorum on their own, soon after broker 1 answered.
    for addr in [cluster.addr(2), cluster.addr(3)] {
        wait_for("every broker to tell the same leaders", || leaders(addr) == led);
    }

    let first: Vec<(i32, String)> = (0..PARTITIONS).flat_map(|p| values(p, "first", 50)).collect();
    let reports = produce(&bootstrap, &first, 30_000);
    assert!(reports.iter().all(|(_, _, ok)| *ok), "every record acknowledged: {reports:?}");
    let expected: BTreeMap<i32, usize> = (0..PARTITIONS).map(|p| (p, 50)).collect();
    let read = consume(&bootstrap, &expected);
    for p in 0..PARTITIONS {
        let want: Vec<String> = values(p, "first", 50).into_iter().map(|(_, v)| v).collect();
        assert_eq!(read[&p], want, "partition {p} in order");
    }

    // Broker 3 dies. Once its session expires its partitions have no leader (their only replica is gone).
    cluster.kill(3).unwrap();
    let gone = per_broker[&3].clone();
    wait_for("broker 3's partitions to lose their leader", || {
        let now = leaders(&bootstrap);
        gone.iter().all(|p| now[p] == -1)
    });
    let now = leaders(&bootstrap);
    for p in per_broker[&1].iter().chain(&per_broker[&2]) {
        assert_eq!(now[p], led[p], "partition {p} keeps its leader");
    }
    // Records for the leaderless partitions fail (after a short message timeout); the others are taken
    // (with a timeout long enough for any machine).
    let second_lost: Vec<(i32, String)> = gone.iter().flat_map(|p| values(*p, "lost", 5)).collect();
    let reports = produce(&bootstrap, &second_lost, 2_000);
    assert!(reports.iter().all(|(_, _, ok)| !*ok), "nothing acknowledged without a leader: {reports:?}");
    let second: Vec<(i32, String)> =
        (0..PARTITIONS).filter(|p| !gone.contains(p)).flat_map(|p| values(p, "second", 10)).collect();
    let reports = produce(&bootstrap, &second, 30_000);
    assert!(reports.iter().all(|(_, _, ok)| *ok), "the other brokers go on: {reports:?}");

    // Back on its data: it leads its partitions again, with what they held.
    cluster.restart(3, 3).unwrap();
    wait_for("broker 3 to lead its partitions again", || {
        let now = leaders(&bootstrap);
        gone.iter().all(|p| now[p] == 3)
    });
    let third: Vec<(i32, String)> = gone.iter().flat_map(|p| values(*p, "third", 10)).collect();
    let reports = produce(&bootstrap, &third, 30_000);
    assert!(reports.iter().all(|(_, _, ok)| *ok), "broker 3 takes records again: {reports:?}");
    let expected: BTreeMap<i32, usize> = (0..PARTITIONS).map(|p| (p, 60)).collect();
    let read = consume(&bootstrap, &expected);
    for p in 0..PARTITIONS {
        let round = if gone.contains(&p) { "third" } else { "second" };
        let want: Vec<String> =
            values(p, "first", 50).into_iter().chain(values(p, round, 10)).map(|(_, v)| v).collect();
        assert_eq!(read[&p], want, "partition {p}: what it held before, then what came after");
    }

    // The topic is deleted while broker 3 is down: when it comes back, its logs of that topic are strays
    // (the caught-up metadata no longer has them), set aside before it serves anyone: kept, never served.
    let broker_3_data = dir.path().join("broker-3");
    let dirs = |suffix: &str| -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&broker_3_data)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|name| name.starts_with(&format!("{TOPIC}-")) && name.ends_with(suffix))
            .collect();
        names.sort();
        names
    };
    let held: Vec<String> = gone.iter().map(|p| format!("{TOPIC}-{p}")).collect();
    assert_eq!(dirs(""), held, "broker 3 holds its partitions");
    cluster.kill(3).unwrap();
    KafkaClient::connect(&bootstrap).unwrap().delete_topic(TOPIC).unwrap();
    cluster.restart(3, 3).unwrap();
    let set_aside: Vec<String> = held.iter().map(|d| format!("{d}.stray")).collect();
    assert_eq!(dirs(""), set_aside, "the deleted topic's logs are set aside on broker 3, not served");
    let metadata = KafkaClient::connect(cluster.addr(3)).unwrap().metadata(None).unwrap();
    // Only internal topics are left (the consumers' group.id brought __consumer_offsets).
    let names: Vec<String> = metadata
        .topics
        .iter()
        .filter(|t| !t.is_internal)
        .filter_map(|t| t.name.as_ref().map(|n| n.to_string()))
        .collect();
    assert!(names.is_empty(), "broker 3 knows the topic is gone: {names:?}");
    cluster.stop().unwrap();
}

#[test]
fn three_brokers_start_restart_and_stop_without_a_warning() {
    // On the build's disk: /tmp may be a tmpfs, which brokers warn about.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let args = ClusterArgs {
        brokers: 3,
        base_port: 0,
        quorum_base_port: None,
        metrics_base_port: None,
        data_dir: dir.path().to_path_buf(),
        shards: Some(1),
        shardlog: None,
        log_dir: None,
        die_with_parent: false,
        broker_args: Vec::new(),
        client_security: None,
        settings: Vec::new(),
    };
    let mut producer_ids = Vec::new();
    for round in 0..2 {
        // The second start finds the voters' ports recorded in the data dir, as the quorum remembers them.
        let mut cluster = Cluster::start(&args).expect("three brokers start");
        if round == 0 {
            KafkaClient::connect(cluster.addr(1)).unwrap().create_topic("calm", 6, 1, &[]).unwrap();
        }
        let led = |leaders: BTreeMap<i32, i32>| leaders.len() == 6 && leaders.values().all(|l| *l > 0);
        wait_for("every partition to have a leader", || led(leaders_of(cluster.addr(3), "calm")));
        // Each broker has its own metrics endpoint: one of them leads the quorum, together they lead
        // the topic's six partitions, and none counts a partition offline.
        let gauge = |id: usize, name: &str| scraped_gauge(cluster.metrics_addr(id), name);
        wait_for("the metrics to show one quorum leader and six led partitions", || {
            let leaders: f64 = (1..=3).map(|id| gauge(id, "shardlog_quorum_leader")).sum();
            let led: f64 = (1..=3).map(|id| gauge(id, "shardlog_partitions_led")).sum();
            leaders == 1.0 && led >= 6.0
        });
        for id in 1..=3 {
            assert_eq!(gauge(id, "shardlog_ready"), 1.0, "broker {id}");
            assert_eq!(gauge(id, "shardlog_partitions_offline"), 0.0, "broker {id}");
        }
        // Idempotent producers get ids from whichever broker they ask: never the same id twice, across
        // brokers and restarts.
        for id in 1..=3 {
            let mut connection = shardlog_broker::client::Connection::open(cluster.addr(id)).unwrap();
            for _ in 0..5 {
                // No transactional id (null): an empty one is a malformed request, as in Kafka.
                let request = InitProducerIdRequest::default()
                    .with_transactional_id(None)
                    .with_producer_id(ProducerId(-1))
                    .with_producer_epoch(-1);
                let ResponseKind::InitProducerId(r) = connection.call(ApiKey::InitProducerId, 4, &request).unwrap()
                else {
                    panic!("not an InitProducerId answer")
                };
                assert_eq!((r.error_code, r.producer_epoch), (0, 0));
                producer_ids.push(r.producer_id.0);
            }
        }
        cluster.stop().unwrap();
    }
    let given = producer_ids.len();
    producer_ids.sort();
    producer_ids.dedup();
    assert_eq!(producer_ids.len(), given, "a producer id was handed out twice");
    for id in 1..=3 {
        let log = std::fs::read_to_string(dir.path().join(format!("broker-{id}/broker.log"))).unwrap();
        assert_eq!(log.matches("INFO shardlog: stopped").count(), 2, "broker {id} stopped cleanly twice:\n{log}");
        let alarms: Vec<&str> = log.lines().filter(|l| l.contains(" WARN ") || l.contains(" ERROR ")).collect();
        assert_eq!(alarms, Vec::<&str>::new(), "broker {id}");
    }
}

/// The value of the unlabelled gauge `name` in a scrape of the metrics endpoint at `addr`.
fn scraped_gauge(addr: &str, name: &str) -> f64 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let line = answer.lines().find(|l| l.split(' ').next() == Some(name)).unwrap_or_else(|| panic!("{name}: {answer}"));
    line.split(' ').nth(1).unwrap().parse().unwrap()
}

/// The value of `name` in a `topic describe` partition line (`Name: value` fields split by tabs).
fn field<'a>(line: &'a str, name: &str) -> &'a str {
    let prefix = format!("{name}: ");
    line.split('\t').find_map(|f| f.trim().strip_prefix(prefix.as_str())).unwrap_or_else(|| panic!("{name} in {line}"))
}

/// Runs `binary args...` with `$SHARDLOG_BOOTSTRAP` set to `env_bootstrap`; returns stdout, failing the test
/// (with stderr) if it fails.
fn tool(binary: &std::path::Path, args: &[&str], env_bootstrap: &str) -> String {
    let out = std::process::Command::new(binary)
        .args(args)
        .env(shardlog_broker::client::BOOTSTRAP_ENV, env_bootstrap)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{args:?}: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    stdout
}

#[test]
fn every_tool_works_against_three_brokers_through_a_bootstrap_list() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = three_brokers(dir.path(), 1, &[]);
    let shardlog = shardlog_bench::cluster::shardlog_binary(None);
    let bench = std::path::PathBuf::from(env!("CARGO_BIN_EXE_shardlog-bench"));
    // The launcher's list, led by an address nobody listens on: the tools go on to the next one.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let list = format!("{dead},{}", cluster.bootstrap);
    assert_eq!(cluster.bootstrap.split(',').count(), 3, "{}", cluster.bootstrap);
    // Half of the calls name the list with --bootstrap, the others take it from $SHARDLOG_BOOTSTRAP.
    let no_env = "nobody.invalid:1";

    tool(
        &shardlog,
        &["topic", "create", "c3", "--partitions", "6", "--replication-factor", "1", "--bootstrap", &list],
        no_env,
    );
    assert!(tool(&shardlog, &["topic", "list"], &list).lines().any(|l| l == "c3"));
    let acked = dir.path().join("acked.txt");
    let produced = tool(
        &bench,
        &["produce", "--topic", "c3", "--mode", "async", "--messages", "6000", "--record", acked.to_str().unwrap()],
        &list,
    );
    assert!(produced.contains("6000 messages in"), "{produced}");

    let described = tool(&shardlog, &["topic", "describe", "c3", "--bootstrap", &list], no_env);
    let partitions: Vec<&str> = described.lines().filter(|l| l.contains("Partition: ")).collect();
    assert_eq!(partitions.len(), 6, "{described}");
    for broker in 1..=3 {
        assert!(described.contains(&format!("Leader: {broker}\t")), "every broker leads some: {described}");
    }
    let end: i64 = partitions.iter().map(|l| field(l, "HighWatermark").parse::<i64>().unwrap()).sum();
    assert_eq!(end, 6000, "offsets come from each partition's leader: {described}");

    let consumed = tool(&bench, &["consume", "--topic", "c3", "--messages", "6000"], &list);
    assert!(consumed.starts_with("6000 messages in"), "{consumed}");
    let audit = tool(
        &bench,
        &["audit", "--topic", "c3", "--records", acked.to_str().unwrap(), "--exactly-once", "--bootstrap", &list],
        no_env,
    );
    assert!(audit.starts_with("acknowledged 6000, stored 6000: missing 0, moved 0"), "{audit}");

    let report = dir.path().join("report");
    let table =
        tool(&bench, &["tps-table", "--scenario", "3", "--duration", "1s", "--out", report.to_str().unwrap()], &list);
    assert!(report.join("report.md").is_file(), "{table}");

    tool(&shardlog, &["topic", "delete", "c3"], &list);
    assert!(!tool(&shardlog, &["topic", "list", "--bootstrap", &list], no_env).lines().any(|l| l == "c3"));
}

#[test]
fn tools_wait_out_a_leader_that_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let mut cluster =
        three_brokers(dir.path(), 1, &["broker.session.timeout.ms=6000", "broker.heartbeat.interval.ms=500"]);
    let shardlog = shardlog_bench::cluster::shardlog_binary(None);
    let bench = std::path::PathBuf::from(env!("CARGO_BIN_EXE_shardlog-bench"));
    let list = cluster.bootstrap.clone();
    let acked = dir.path().join("acked.txt");
    tool(&shardlog, &["topic", "create", "moving", "--partitions", "3", "--replication-factor", "1"], &list);
    tool(
        &bench,
        &["produce", "--topic", "moving", "--messages", "3000", "--mode", "async", "--record", acked.to_str().unwrap()],
        &list,
    );

    // Broker 2 dies: its partition has no reachable leader until it is back, some seconds later. Audit and
    // describe, started meanwhile, wait for it.
    cluster.kill(2).unwrap();
    let (audit, described) = {
        let (bench, shardlog, list, acked) = (bench.clone(), shardlog.clone(), list.clone(), acked.clone());
        let audit = std::thread::spawn(move || {
            tool(&bench, &["audit", "--topic", "moving", "--records", acked.to_str().unwrap()], &list)
        });
        let list = cluster.bootstrap.clone();
        let described = std::thread::spawn(move || tool(&shardlog, &["topic", "describe", "moving"], &list));
        (audit, described)
    };
    std::thread::sleep(Duration::from_secs(3));
    cluster.restart(2, 3).unwrap();
    let audit = audit.join().unwrap();
    assert!(audit.starts_with("acknowledged 3000, stored 3000: missing 0, moved 0"), "{audit}");
    let described = described.join().unwrap();
    assert_eq!(described.lines().filter(|l| l.contains("Partition: ")).count(), 3, "{described}");

    // Down for good: once the quorum fences broker 2, its partition has no leader, and describe still
    // shows every partition, without offsets for that one (as Kafka's tools do).
    cluster.kill(2).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let leaderless = loop {
        let described = tool(&shardlog, &["topic", "describe", "moving"], &list);
        if described.contains("Leader: -1") {
            break described;
        }
        assert!(std::time::Instant::now() < deadline, "broker 2 never fenced: {described}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(leaderless.contains("LogStartOffset: -\tHighWatermark: -"), "{leaderless}");
    assert_eq!(leaderless.lines().filter(|l| l.contains("Partition: ")).count(), 3, "{leaderless}");
}
