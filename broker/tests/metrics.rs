//! The Prometheus endpoint of the real binary, scraped around a produce and a consume by librdkafka:
//! counters move by exactly what the test sent and read, the fdatasync histogram fills, each
//! partition's log end offset and high watermark match ListOffsets, errors are counted by Kafka's name;
//! `/ready` says whether the broker serves, `/health` whether it is alive (a stalled shard is not); a
//! port in use stops the start.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{ApiKey, MetadataRequest, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};
use shardlog_broker::client::KafkaClient;

use common::requests::{batch, create, fetch_request, produce_request, stored};
use common::{Broker, receive, send};

const TOPIC: &str = "scraped";
const PARTITIONS: i32 = 3;
const RECORDS: usize = 5_000;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// `GET path`: the status code and the body.
fn get(port: u16, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\nAccept: */*\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").expect("a head and a body");
    let status = head.split(' ').nth(1).unwrap().parse().unwrap();
    (status, body.to_string())
}

/// One scrape: every sample, keyed by its name with its labels as printed (`name{a="1",b="2"}`) but
/// sorted, so keys do not depend on the order the exporter prints labels in.
fn scrape(port: u16) -> BTreeMap<String, f64> {
    let (status, body) = get(port, "/metrics");
    assert_eq!(status, 200, "{body}");
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (key, value) = l.rsplit_once(' ').unwrap_or_else(|| panic!("a sample line: {l}"));
            (normalise(key), value.parse::<f64>().unwrap_or_else(|_| panic!("a number: {l}")))
        })
        .collect()
}

fn normalise(key: &str) -> String {
    match key.split_once('{') {
        None => key.to_string(),
        Some((name, labels)) => {
            let mut labels: Vec<&str> = labels.trim_end_matches('}').split(',').collect();
            labels.sort_unstable();
            format!("{name}{{{}}}", labels.join(","))
        }
    }
}

/// The sum of every sample of `name` whose labels include all of `with` (`key="value"` each).
fn sum(samples: &BTreeMap<String, f64>, name: &str, with: &[&str]) -> f64 {
    samples
        .iter()
        .filter(|(k, _)| k.split_once('{').map_or(k.as_str(), |(n, _)| n) == name)
        .filter(|(k, _)| with.iter().all(|w| k.contains(w)))
        .map(|(_, v)| v)
        .sum()
}

fn produce(port: u16) {
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", format!("127.0.0.1:{port}"))
        .set("acks", "all")
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    for i in 0..RECORDS {
        let (key, value) = (format!("k{i}"), format!("value {i}"));
        producer.send(BaseRecord::to(TOPIC).key(&key).payload(&value).partition(i as i32 % PARTITIONS)).unwrap();
    }
    producer.flush(Duration::from_secs(60)).expect("every record acknowledged");
}

/// acks=all produce in small batches to several partitions of one shard: once a partition's segment holds
/// a megabyte, zeros are written ahead of its data, and after its file's fdatasync made them durable its
/// syncs are the shard's device flushes, shared with the other partitions. Every batch is still made
/// durable and counted once. (The data dir is on ext4, where a flush can do that.)
#[test]
fn small_batches_to_several_partitions_share_the_shards_device_flushes() {
    const SHARED: &str = "flushed";
    let metrics_port = free_port();
    let listen = format!("metrics.listen=\"127.0.0.1:{metrics_port}\"");
    let broker = Broker::start_with(1, &["--set", &listen]);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    KafkaClient::connect(&bootstrap).unwrap().create_topic(SHARED, 6, 1, &[]).unwrap();
    let before = scrape(metrics_port);
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("acks", "all")
        .set("batch.size", "16384")
        .set("linger.ms", "1")
        .create()
        .expect("producer");
    // 2 MiB to each of the 6 partitions, in batches of up to 16 KiB.
    let value = vec![b'v'; 1000];
    for i in 0..12_000 {
        let key = format!("k{i}");
        producer.send(BaseRecord::to(SHARED).key(&key).payload(&value).partition(i % 6)).unwrap();
    }
    producer.flush(Duration::from_secs(120)).expect("every record acknowledged");
    let after = scrape(metrics_port);
    let delta = |name: &str, with: &[&str]| sum(&after, name, with) - sum(&before, name, with);
    let device = delta("shardlog_log_fdatasyncs_total", &["sync=\"device\""]);
    let file = delta("shardlog_log_fdatasyncs_total", &["sync=\"file\""]);
    assert!(device > 0.0, "no device flush made a batch durable ({file} fdatasyncs)");
    let batches_synced = delta("shardlog_log_batches_per_fdatasync_sum", &[]);
    let appends = delta("shardlog_log_append_seconds_count", &[]);
    assert_eq!(batches_synced, appends, "every batch made durable once, by one or the other");
    assert!(broker.data_dir().join("device-flush.shard-0").exists(), "the shard's flush anchor is in the data dir");
}

fn consume(port: u16) -> usize {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", format!("127.0.0.1:{port}"))
        .set("group.id", "metrics-test")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        assignment.add_partition_offset(TOPIC, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let (mut read, deadline) = (0, Instant::now() + Duration::from_secs(60));
    while read < RECORDS {
        assert!(Instant::now() < deadline, "read {read} of {RECORDS} records within 60 s");
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            message.unwrap().offset();
            read += 1;
        }
    }
    consumer.commit_consumer_state(CommitMode::Sync).expect("the group's offsets committed");
    read
}

#[test]
fn counters_move_by_what_was_sent_and_gauges_match_list_offsets() {
    let metrics_port = free_port();
    let listen = format!("metrics.listen=\"127.0.0.1:{metrics_port}\"");
    let broker = Broker::start_with(2, &["--set", &listen]);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    KafkaClient::connect(&bootstrap).unwrap().create_topic(TOPIC, PARTITIONS, 1, &[]).unwrap();

    let before = scrape(metrics_port);
    produce(broker.port);
    let after_produce = scrape(metrics_port);
    let delta =
        |after: &BTreeMap<String, f64>, name: &str, with: &[&str]| sum(after, name, with) - sum(&before, name, with);
    assert_eq!(delta(&after_produce, "shardlog_produce_records_total", &[]), RECORDS as f64);
    assert!(delta(&after_produce, "shardlog_kafka_requests_total", &["api=\"Produce\""]) >= 1.0);
    assert!(delta(&after_produce, "shardlog_kafka_request_seconds_count", &["api=\"Produce\""]) >= 1.0);
    let syncs = delta(&after_produce, "shardlog_log_fdatasync_seconds_count", &[]);
    assert!(syncs >= 1.0, "acks=all syncs before it answers: {syncs} fdatasyncs timed");
    assert_eq!(delta(&after_produce, "shardlog_log_fdatasyncs_total", &[]), syncs);
    // Every batch appended was made durable by one fdatasync or another, and counted there once.
    let batches_synced = delta(&after_produce, "shardlog_log_batches_per_fdatasync_sum", &[]);
    let appends = delta(&after_produce, "shardlog_log_append_seconds_count", &[]);
    assert!(appends >= 1.0 && batches_synced == appends, "{batches_synced} batches synced, {appends} appended");
    assert!(sum(&after_produce, "shardlog_log_fdatasync_seconds_bucket", &["le=\"+Inf\""]) >= syncs);
    // Every byte appended reached the disk by a direct write (a partial last block is written again with
    // the next bytes, so some count twice).
    let written = delta(&after_produce, "shardlog_log_written_bytes_total", &[]);
    let produced = delta(&after_produce, "shardlog_produce_bytes_total", &[]);
    assert!(written >= produced, "{written} bytes written for {produced} produced");

    // The log gauges are sampled every second: they reach what ListOffsets says, and the bytes
    // produced are the bytes the partitions' logs hold.
    let offsets = KafkaClient::connect(&bootstrap).unwrap().offsets(TOPIC, PARTITIONS).unwrap();
    assert_eq!(offsets.iter().map(|(_, end)| end).sum::<i64>(), RECORDS as i64);
    let deadline = Instant::now() + Duration::from_secs(10);
    let sampled = loop {
        let samples = scrape(metrics_port);
        let matches = (0..PARTITIONS).all(|p| {
            let labels = [format!("topic=\"{TOPIC}\""), format!("partition=\"{p}\"")];
            let labels: Vec<&str> = labels.iter().map(String::as_str).collect();
            let end = offsets[p as usize].1 as f64;
            sum(&samples, "shardlog_partition_log_end_offset", &labels) == end
                && sum(&samples, "shardlog_partition_high_watermark", &labels) == end
        });
        if matches {
            break samples;
        }
        assert!(Instant::now() < deadline, "log end offsets and HWs never matched {offsets:?}: {samples:#?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let topic = format!("topic=\"{TOPIC}\"");
    assert_eq!(
        sum(&sampled, "shardlog_partition_log_size_bytes", &[&topic]),
        delta(&after_produce, "shardlog_produce_bytes_total", &[])
    );
    assert_eq!(sum(&sampled, "shardlog_partition_log_segments", &[&topic]), PARTITIONS as f64);
    assert_eq!(sum(&sampled, "shardlog_partition_isr_size", &[&topic]), PARTITIONS as f64);
    assert_eq!(sum(&sampled, "shardlog_partitions_under_replicated", &[]), 0.0);
    assert_eq!(sum(&sampled, "shardlog_partitions_offline", &[]), 0.0);
    assert!(sum(&sampled, "shardlog_partitions_led", &[]) >= PARTITIONS as f64);
    assert_eq!(sum(&sampled, "shardlog_quorum_leader", &[]), 1.0, "a single node leads its own quorum");
    assert_eq!(sum(&sampled, "shardlog_ready", &[]), 1.0);

    let before_consume = scrape(metrics_port);
    assert_eq!(consume(broker.port), RECORDS);
    let after_consume = scrape(metrics_port);
    let read = sum(&after_consume, "shardlog_fetch_records_total", &[])
        - sum(&before_consume, "shardlog_fetch_records_total", &[]);
    assert_eq!(read, RECORDS as f64);
    let read_bytes = sum(&after_consume, "shardlog_fetch_bytes_total", &[])
        - sum(&before_consume, "shardlog_fetch_bytes_total", &[]);
    assert_eq!(read_bytes, sum(&sampled, "shardlog_partition_log_size_bytes", &[&topic]));

    // An error is counted under its API and Kafka's name for it.
    let unknown = "error=\"UNKNOWN_TOPIC_OR_PARTITION\"";
    let errors_before = sum(&after_consume, "shardlog_kafka_errors_total", &["api=\"Metadata\"", unknown]);
    let mut stream = broker.connect();
    let mut request = MetadataRequest::default();
    request.allow_auto_topic_creation = false;
    request.topics = Some(vec![
        MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_static_str("no-such-topic")))),
    ]);
    common::send(&mut stream, ApiKey::Metadata, 9, 1, &request);
    let (_, answer) = common::receive(&mut stream, ApiKey::Metadata, 9);
    let ResponseKind::Metadata(answer) = answer else { panic!("a Metadata answer") };
    assert_eq!(answer.topics[0].error_code, 3);
    let answered = scrape(metrics_port);
    let errors_after = sum(&answered, "shardlog_kafka_errors_total", &["api=\"Metadata\"", unknown]);
    assert_eq!(errors_after - errors_before, 1.0);
    assert!(sum(&answered, "shardlog_connections", &[]) >= 1.0, "the connection just answered is open");

    // The committed offsets reach their gauge (sampled every second by the group's coordinator).
    let deadline = Instant::now() + Duration::from_secs(10);
    let samples = loop {
        let samples = scrape(metrics_port);
        let committed = (0..PARTITIONS).all(|p| {
            let labels = ["group=\"metrics-test\"", &topic, &format!("partition=\"{p}\"")];
            sum(&samples, "shardlog_consumer_group_committed_offset", &labels) == offsets[p as usize].1 as f64
        });
        if committed {
            break samples;
        }
        assert!(Instant::now() < deadline, "committed offsets never shown: {samples:#?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    // Every metric the Grafana dashboard queries is one the broker exports.
    let dashboard =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/grafana/shardlog.json")).unwrap();
    let exported: std::collections::BTreeSet<&str> =
        samples.keys().map(|k| k.split_once('{').map_or(k.as_str(), |(name, _)| name)).collect();
    let mut queried =
        dashboard.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).filter(|w| w.starts_with("shardlog_"));
    assert!(queried.clone().count() > 20, "the dashboard queries the broker's metrics");
    assert!(
        queried.all(|name| exported.contains(name)),
        "the dashboard queries a metric the broker does not export: {:?}",
        {
            let names: std::collections::BTreeSet<&str> = dashboard
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.starts_with("shardlog_") && !exported.contains(w))
                .collect();
            names
        }
    );

    assert_eq!(get(metrics_port, "/ready"), (200, "ready\n".to_string()));
    assert_eq!(get(metrics_port, "/health"), (200, "ready\n".to_string()));
    assert_eq!(get(metrics_port, "/nothing-here").0, 404);
    assert!(broker.terminate().success());
}

#[test]
fn health_names_a_stalled_shard() {
    let metrics_port = free_port();
    let listen = format!("metrics.listen=\"127.0.0.1:{metrics_port}\"");
    let broker = Broker::start_with(2, &["--set", &listen, "--set", "test.stall.shard=1"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = get(metrics_port, "/health");
        if body.contains("shard 1 has not run") {
            assert_eq!(status, 503, "{body}");
            assert_eq!(get(metrics_port, "/ready").0, 503);
            break;
        }
        // Before the stall the process is alive: ready, or (the harness waits for one shard only) still
        // starting, which /health says with a 200.
        assert_eq!(status, 200, "{body}");
        assert!(Instant::now() < deadline, "/health never named the stalled shard");
        std::thread::sleep(Duration::from_millis(200));
    }
    broker.kill();
}

#[test]
fn a_metrics_port_in_use_stops_the_start() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["start", "--listen", &format!("127.0.0.1:{}", free_port()), "--shards", "1"])
        .args(["--metrics-listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started with its metrics port taken: {stderr}");
    assert!(stderr.contains(&format!("metrics.listen: listen on 127.0.0.1:{port}")), "{stderr}");
    assert!(stderr.contains("Address already in use"), "{stderr}");
    // The usual cause is a second broker on the host; the flag that gives it its own port is named.
    assert!(stderr.contains("--metrics-listen"), "{stderr}");
    drop(taken);
}

/// `/proc/<pid>/stat`'s fields (proc(5)): field n is `fields[n - 3]`, counted after the command name.
fn proc_stat(pid: u32) -> Vec<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(')').unwrap();
    rest.split_whitespace().map(|f| f.parse().unwrap_or(0)).collect()
}

#[test]
fn process_metrics_and_build_info_are_the_processs_own() {
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let metrics_port = free_port();
    let listen = format!("metrics.listen=\"127.0.0.1:{metrics_port}\"");
    let broker = Broker::start_with(1, &["--set", &listen]);
    let pid = broker.pid();
    // SAFETY: sysconf(3) with a valid name.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let cpu = |stat: &[u64]| (stat[14 - 3] + stat[15 - 3]) as f64 / ticks;
    let fds = || std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count() as f64;

    let (cpu_before, fds_before) = (cpu(&proc_stat(pid)), fds());
    let samples = scrape(metrics_port);
    let (cpu_after, fds_after) = (cpu(&proc_stat(pid)), fds());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();

    // The CPU time the kernel counts for the process, read around the scrape.
    let scraped_cpu = sum(&samples, "process_cpu_seconds_total", &[]);
    assert!(cpu_before <= scraped_cpu && scraped_cpu <= cpu_after, "{cpu_before} <= {scraped_cpu} <= {cpu_after}");
    assert!(scraped_cpu > 0.0, "a broker that started has used CPU");
    // Its descriptors: those counted around the scrape, and the scrape's own connection and listing.
    let open = sum(&samples, "process_open_fds", &[]);
    assert!(
        open >= fds_before.min(fds_after) && open <= fds_before.max(fds_after) + 2.0,
        "{open} open, {fds_before}/{fds_after}"
    );
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let soft: f64 = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(sum(&samples, "process_max_fds", &[]), soft);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let vm_kib = |key: &str| -> f64 {
        status.lines().find_map(|l| l.strip_prefix(key)).unwrap().split_whitespace().next().unwrap().parse().unwrap()
    };
    let resident = sum(&samples, "process_resident_memory_bytes", &[]);
    assert!(resident > 1e6 && resident <= 2.0 * vm_kib("VmHWM:") * 1024.0, "{resident} bytes resident");
    assert!(sum(&samples, "process_virtual_memory_bytes", &[]) >= resident);
    // Started after this test began and before the scrape: the boot time /proc gives is whole seconds,
    // and the wall clock may have been stepped a little since the boot.
    let start = sum(&samples, "process_start_time_seconds", &[]);
    assert!(start >= started - 5.0 && start <= now + 5.0, "started at {start}, the test at {started}, now {now}");
    // The build: the package version and the commit this tree is at.
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map_or("unknown".to_string(), |o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let info = format!("shardlog_build_info{{commit=\"{head}\",version=\"{}\"}}", env!("CARGO_PKG_VERSION"));
    assert_eq!(
        samples.get(&info),
        Some(&1.0),
        "{info} in {:?}",
        samples.keys().filter(|k| k.contains("build")).collect::<Vec<_>>()
    );
    let (_, text) = get(metrics_port, "/metrics");
    for (name, kind) in
        [("process_cpu_seconds_total", "counter"), ("process_open_fds", "gauge"), ("shardlog_build_info", "gauge")]
    {
        assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name} is a {kind}");
    }
    assert!(broker.terminate().success());
}

#[test]
fn a_consumer_catching_up_from_the_start_takes_the_reads_made_ahead_and_reads_every_record_in_order() {
    const BIG: &str = "read-ahead";
    const MESSAGES: usize = 30_000;
    let metrics_port = free_port();
    let listen = format!("metrics.listen=\"127.0.0.1:{metrics_port}\"");
    let broker = Broker::start_with(2, &["--set", &listen]);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    KafkaClient::connect(&bootstrap).unwrap().create_topic(BIG, 1, 1, &[]).unwrap();
    let producer: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", &bootstrap).set("linger.ms", "5").create().expect("producer");
    let value = |i: usize| format!("{i:>1000}");
    for i in 0..MESSAGES {
        producer.send(BaseRecord::<(), String>::to(BIG).payload(&value(i)).partition(0)).unwrap();
    }
    producer.flush(Duration::from_secs(60)).expect("every record acknowledged");
    let before = scrape(metrics_port);

    // librdkafka's defaults: fetches of up to 1 MiB of the partition, one at a time.
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("group.id", "read-ahead-test")
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer");
    let mut assignment = TopicPartitionList::new();
    assignment.add_partition_offset(BIG, 0, Offset::Beginning).unwrap();
    consumer.assign(&assignment).unwrap();
    let (mut read, deadline) = (0, Instant::now() + Duration::from_secs(60));
    while read < MESSAGES {
        assert!(Instant::now() < deadline, "read {read} of {MESSAGES} records within 60 s");
        if let Some(message) = consumer.poll(Duration::from_millis(200)) {
            let message = message.unwrap();
            assert_eq!(message.offset(), read as i64, "every record once, in order");
            assert_eq!(message.payload(), Some(value(read).as_bytes()), "offset {read} holds its record");
            read += 1;
        }
    }

    let after = scrape(metrics_port);
    let delta = |name: &str| sum(&after, name, &[]) - sum(&before, name, &[]);
    let (started, used) =
        (delta("shardlog_fetch_readahead_started_total"), delta("shardlog_fetch_readahead_used_total"));
    // About 30 MB in fetches of 1 MiB: each full one reads the next ahead, and the consumer's next fetch
    // takes it (all but the last few, which the consumer may not have asked for yet).
    assert!(started >= 10.0, "{started} reads made ahead");
    assert!(used >= started * 0.8 && used <= started, "{used} of {started} reads made ahead were taken");
}

/// Fetches `(partition, offset)`s of topic "held" at their ends on `s`, held up to `max_wait_ms`:
/// the record bytes of each partition's answer.
fn held_fetch(s: &mut TcpStream, at: &[(i32, i64)], max_wait_ms: i32) -> Vec<usize> {
    held_fetch_for(s, at, max_wait_ms, 1)
}

/// [`held_fetch`] held until `min_bytes` of records are there.
fn held_fetch_for(s: &mut TcpStream, at: &[(i32, i64)], max_wait_ms: i32, min_bytes: i32) -> Vec<usize> {
    let mut request = fetch_request("held", at[0].0, at[0].1, max_wait_ms).with_min_bytes(min_bytes);
    let asked = &mut request.topics[0].partitions;
    for &(partition, offset) in &at[1..] {
        let mut more = asked[0].clone();
        more.partition = partition;
        more.fetch_offset = offset;
        asked.push(more);
    }
    send(s, ApiKey::Fetch, 11, 1, &request);
    let (_, body) = receive(s, ApiKey::Fetch, 11);
    let ResponseKind::Fetch(answer) = body else { panic!("wrong response") };
    let partitions = &answer.responses[0].partitions;
    assert!(partitions.iter().all(|p| p.error_code == 0), "{partitions:?}");
    partitions.iter().map(|p| p.records.as_ref().map_or(0, |r| r.len())).collect()
}

/// A fetch held for records (Kafka's delayed fetch) is woken by their arrival: after an acknowledged
/// produce, after acks=0 records the broker syncs in the background, when one of several partitions
/// (on either shard) gets some, and, held for fetch.min.bytes of three batches, once the third is there.
/// With nothing arriving it expires at max.wait.ms. Each fetch that waits
/// for records may wait a minute: one that nothing woke would expire, and be counted so.
#[test]
fn a_held_fetch_is_answered_when_records_arrive_and_expires_when_none_do() {
    let metrics_port = free_port();
    let listen = format!("metrics.listen=\"127.0.0.1:{metrics_port}\"");
    let broker = Broker::start_with(2, &["--set", &listen]);
    let mut s = broker.connect();
    s.set_read_timeout(Some(Duration::from_secs(90))).unwrap();
    assert_eq!(create(&mut s, "held", 2, 1, &[]), 0);
    let port = broker.port;
    let held = |samples: &BTreeMap<String, f64>| {
        let count = |outcome: &str| sum(samples, "shardlog_fetch_held_total", &[&format!("outcome=\"{outcome}\"")]);
        (count("answered"), count("expired"))
    };
    // Produces `batches` batches of one record to `partition` with `acks` on a connection of its own, one
    // at a time, once the fetch waits.
    let produce_later_n = |partition: i32, acks: i16, batches: usize| {
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            let mut p = TcpStream::connect(("127.0.0.1", port)).unwrap();
            for _ in 0..batches {
                send(&mut p, ApiKey::Produce, 9, 1, &produce_request("held", partition, &batch(7, 1, 0), acks));
                if acks != 0 {
                    let (_, body) = receive(&mut p, ApiKey::Produce, 9);
                    let ResponseKind::Produce(answer) = body else { panic!("wrong response") };
                    assert_eq!(answer.responses[0].partition_responses[0].error_code, 0);
                }
            }
            // Held open until the fetch is answered: closing may drop what acks=0 sent.
            p
        })
    };
    let produce_later = |partition: i32, acks: i16| produce_later_n(partition, acks, 1);

    let before = held(&scrape(metrics_port));
    let producer = produce_later(0, -1);
    assert!(held_fetch(&mut s, &[(0, 0)], 60_000)[0] > 0, "the acknowledged record is answered");
    drop(producer.join().unwrap());
    let producer = produce_later(1, 0);
    assert!(held_fetch(&mut s, &[(1, 0)], 60_000)[0] > 0, "the acks=0 record is answered once synced");
    drop(producer.join().unwrap());
    let producer = produce_later(1, 1);
    let answered = held_fetch(&mut s, &[(0, 1), (1, 1)], 60_000);
    assert_eq!((answered[0], answered[1] > 0), (0, true), "the partition that got a record answers the fetch");
    drop(producer.join().unwrap());
    // Held for more than one batch holds: answered once the third of three batches is there.
    let one = stored(&batch(7, 1, 0), 0).len();
    let producer = produce_later_n(0, 1, 3);
    let answered = held_fetch_for(&mut s, &[(0, 1)], 60_000, (2 * one + 1) as i32);
    assert_eq!(answered, vec![3 * one], "the fetch waited for all three batches");
    drop(producer.join().unwrap());
    let after = held(&scrape(metrics_port));
    assert_eq!(after.1 - before.1, 0.0, "no fetch waiting for records expired");
    assert!(after.0 - before.0 >= 1.0, "held fetches answered: {}", after.0 - before.0);

    // Nothing arrives: the fetch expires at its max.wait.ms, empty.
    assert_eq!(held_fetch(&mut s, &[(0, 4), (1, 2)], 200), vec![0, 0]);
    let expired = held(&scrape(metrics_port));
    assert_eq!((expired.0 - after.0, expired.1 - after.1), (0.0, 1.0), "one fetch expired");
}

/// A topic's `flush.messages` alone switches it to Kafka's interval flush, as `config list` says: 2,000
/// one-record batches with acks=1 cost one fdatasync per 1,000 messages, not one per batch.
#[test]
fn a_topic_with_flush_messages_alone_syncs_once_per_that_many_messages() {
    let metrics_port = free_port();
    let listen = format!("metrics.listen=\"127.0.0.1:{metrics_port}\"");
    let broker = Broker::start_with(1, &["--set", &listen]);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "by-count", 1, 1, &[("flush.messages", "1000")]), 0);
    let before = scrape(metrics_port);
    for i in 0..2000 {
        send(&mut s, ApiKey::Produce, 9, i, &produce_request("by-count", 0, &batch(i as u8, 1, 0), 1));
        let (_, body) = receive(&mut s, ApiKey::Produce, 9);
        let ResponseKind::Produce(r) = body else { panic!("a Produce answer") };
        let p = &r.responses[0].partition_responses[0];
        assert_eq!((p.error_code, p.base_offset), (0, i as i64));
    }
    let syncs = sum(&scrape(metrics_port), "shardlog_log_fdatasyncs_total", &[])
        - sum(&before, "shardlog_log_fdatasyncs_total", &[]);
    assert_eq!(syncs, 2.0, "flush.messages=1000 over 2,000 messages");
}
