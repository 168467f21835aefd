//! Transactions with real clients against the real binary (`scripts/client-tests/transactions.py`):
//! confluent-kafka (librdkafka) and kafka-python transactional producers commit and abort, a zombie is
//! fenced by a new instance of its transactional id, and read_committed consumers see exactly the
//! committed records while read_uncommitted ones see everything.

mod common;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use common::Broker;

#[test]
fn librdkafka_and_kafka_python_transactions_on_one_broker() {
    let broker = Broker::start(2);
    common::run_client_script("transactions.py", &[&format!("127.0.0.1:{}", broker.port), "txn-clients", "1"]);
    let (_, log) = broker.terminate_with_log();
    for line in log.lines() {
        assert!(!line.contains(" WARN ") && !line.contains(" ERROR "), "transactions logged: {line}");
    }
}

/// Produces `values` to `topic`, value `i` to partition `i % partitions`, with librdkafka (acks=all).
fn produce_values(bootstrap: &str, topic: &str, partitions: i32, values: &[String]) {
    let producer: BaseProducer = ClientConfig::new().set("bootstrap.servers", bootstrap).create().unwrap();
    for (i, value) in values.iter().enumerate() {
        let mut record = BaseRecord::<(), _>::to(topic).payload(value).partition(i as i32 % partitions);
        // The local queue may fill up: poll it empty and send again.
        while let Err((_, back)) = producer.send(record) {
            producer.poll(Duration::from_millis(100));
            record = back;
        }
    }
    producer.flush(Duration::from_secs(30)).unwrap();
}

/// Every value of `topic` as a read_committed librdkafka consumer sees it, read from the start until no
/// more come for two seconds (or 60 s pass).
fn read_committed_values(bootstrap: &str, topic: &str, partitions: i32) -> Vec<String> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "read-committed-check")
        .set("isolation.level", "read_committed")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut assignment = TopicPartitionList::new();
    for p in 0..partitions {
        assignment.add_partition_offset(topic, p, Offset::Beginning).unwrap();
    }
    consumer.assign(&assignment).unwrap();
    let mut values = Vec::new();
    let (deadline, mut quiet_since) = (Instant::now() + Duration::from_secs(60), Instant::now());
    while Instant::now() < deadline && quiet_since.elapsed() < Duration::from_secs(2) {
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                values.push(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
                quiet_since = Instant::now();
            }
            Some(Err(e)) => panic!("read_committed consumer: {e}"),
            None => {}
        }
    }
    values
}

/// Consume-transform-produce with transactions (`scripts/client-tests/transform_loop.py`, librdkafka):
/// the loop is killed with SIGKILL at several points while it works and started again; at the end every
/// input record is in the output exactly once, as read_committed consumers see it.
#[test]
fn a_transform_loop_killed_with_sigkill_and_restarted_produces_every_input_exactly_once() {
    const INPUTS: usize = 3000;
    let broker = Broker::start(2);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    let mut stream = broker.connect();
    for topic in ["ctp-in", "ctp-out"] {
        assert_eq!(common::requests::create(&mut stream, topic, 3, 1, &[]), 0);
    }
    let inputs: Vec<String> = (0..INPUTS).map(|i| i.to_string()).collect();
    produce_values(&bootstrap, "ctp-in", 3, &inputs);
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/client-tests/transform_loop.py");
    let start = || {
        Command::new("python3")
            .arg(&script)
            .args([&bootstrap, "ctp-in", "ctp-out", "ctp-group", "ctp-loop", &INPUTS.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    // Killed after 1.5 s, 2.2 s, 0.9 s and 3.1 s (a fixed schedule: each run is somewhere else when it dies,
    // between polls, inside a transaction, or committing).
    for run_ms in [1500u64, 2200, 900, 3100] {
        let mut child = start();
        std::thread::sleep(Duration::from_millis(run_ms));
        let _ = child.kill();
        let _ = child.wait();
    }
    let mut last = start();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(status) = last.try_wait().unwrap() {
            let mut out = String::new();
            std::io::Read::read_to_string(last.stdout.as_mut().unwrap(), &mut out).unwrap();
            assert!(status.success() && out.contains("done"), "the last run ended: {status}: {out}");
            break;
        }
        assert!(Instant::now() < deadline, "the last run did not finish in 120 s");
        std::thread::sleep(Duration::from_millis(200));
    }
    let outputs = read_committed_values(&bootstrap, "ctp-out", 3);
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for value in &outputs {
        *counts.entry(value.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(twice.is_empty(), "outputs seen more than once: {twice:?}");
    let missing: Vec<&String> =
        inputs.iter().filter(|i| !counts.contains_key(format!("out-{i}").as_str())).take(5).collect();
    assert!(missing.is_empty(), "inputs without an output: {missing:?}");
    assert_eq!(outputs.len(), INPUTS);
    broker.terminate();
}

/// The rdkafka crate's transactional producer: a committed and an aborted transaction, and a
/// read_committed consumer that sees exactly the committed records.
#[test]
fn the_rdkafka_crates_transactional_producer_commits_and_aborts() {
    let broker = Broker::start(1);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    let mut stream = broker.connect();
    assert_eq!(common::requests::create(&mut stream, "rdkafka-txn", 2, 1, &[]), 0);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("transactional.id", "rdkafka-txn")
        .create()
        .unwrap();
    let timeout = Duration::from_secs(30);
    producer.init_transactions(timeout).unwrap();
    for (outcome, count) in [("committed", 20), ("aborted", 15), ("committed-again", 5)] {
        producer.begin_transaction().unwrap();
        for i in 0..count {
            let value = format!("{outcome}-{i}");
            let record = BaseRecord::<(), _>::to("rdkafka-txn").payload(&value).partition(i % 2);
            producer.send(record).map_err(|(e, _)| e).unwrap();
        }
        producer.flush(timeout).unwrap();
        if outcome == "aborted" {
            producer.abort_transaction(timeout).unwrap();
        } else {
            producer.commit_transaction(timeout).unwrap();
        }
    }
    let mut seen = read_committed_values(&bootstrap, "rdkafka-txn", 2);
    seen.sort();
    let mut expected: Vec<String> = (0..20).map(|i| format!("committed-{i}")).collect();
    expected.extend((0..5).map(|i| format!("committed-again-{i}")));
    expected.sort();
    assert_eq!(seen, expected);
    broker.terminate();
}

/// The rdkafka crate's transactional producer goes silent inside a transaction past its
/// `transaction.timeout.ms`: the coordinator aborts the transaction (see `transactions_timeout.rs` for the
/// requests one by one), and librdkafka, told PRODUCER_FENCED when it commits at last, fails for good with
/// its own fenced error, as it does against Kafka. Its records are not read_committed.
#[test]
fn the_rdkafka_crates_producer_silent_past_its_transaction_timeout_is_fenced() {
    use rdkafka::error::{KafkaError, RDKafkaErrorCode};
    let broker = Broker::start_with(1, &["--set", "transaction.abort.timed.out.transaction.cleanup.interval.ms=100"]);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    let mut stream = broker.connect();
    assert_eq!(common::requests::create(&mut stream, "rdkafka-silent", 1, 1, &[]), 0);
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("transactional.id", "rdkafka-silent")
        .set("transaction.timeout.ms", "1000")
        .set("message.timeout.ms", "1000")
        .create()
        .unwrap();
    let timeout = Duration::from_secs(30);
    producer.init_transactions(timeout).unwrap();
    producer.begin_transaction().unwrap();
    for i in 0..3 {
        let value = format!("silent-{i}");
        producer.send(BaseRecord::<(), _>::to("rdkafka-silent").payload(&value)).map_err(|(e, _)| e).unwrap();
    }
    producer.flush(timeout).unwrap();
    common::txn::wait_for("the coordinator's abort", Duration::from_secs(60), || {
        (common::txn::describe(&mut stream, "rdkafka-silent").state == "CompleteAbort").then_some(())
    });
    match producer.commit_transaction(timeout) {
        Err(KafkaError::Transaction(e)) => {
            assert!(e.is_fatal(), "{e}");
            assert_eq!(e.code(), RDKafkaErrorCode::Fenced, "{e}");
        }
        other => panic!("the commit of a transaction the coordinator aborted: {other:?}"),
    }
    assert_eq!(read_committed_values(&bootstrap, "rdkafka-silent", 1), Vec::<String>::new());
    broker.terminate();
}
