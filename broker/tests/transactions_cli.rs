//! `shardlog transactions ...` and `topic describe` against the real broker, as an operator runs them,
//! with a transaction opened by raw requests (InitProducerId, AddPartitionsToTxn v3, a transactional
//! produce): the tools see it open at the coordinator and at the partition, `abort` ends it at the
//! partition with an ABORT marker (read_committed consumers then pass it and drop its records), and the
//! coordinator's own marker, written later when the producer commits, changes nothing more. And
//! DescribeProducers itself: answered by the partition's leader only, naming unknown partitions.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;
use kafka_protocol::messages::{ApiKey, DescribeProducersRequest, ResponseKind};

use common::requests::{batch, create, name, produce_one};
use common::txn::{
    add_partition, describe, end_txn, fetch_committed, init, latest, produce_transactional, transactional_batch,
    wait_for,
};
use common::{Broker, receive, send};

const TXN: &str = "tx-cli";

fn shardlog(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shardlog")).args(args).output().unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// (LSO, aborted transactions) of a read_committed fetch of partition 0.
fn committed(stream: &mut std::net::TcpStream, topic: &str) -> (i64, Vec<(i64, i64)>) {
    let read = fetch_committed(stream, topic, 0);
    (read.last_stable_offset, read.aborted)
}

/// The rows of a tool's answer after its header, each split at its tabs.
fn rows(out: &str) -> Vec<Vec<String>> {
    out.lines().skip(1).map(|l| l.split('\t').map(str::to_string).collect()).collect()
}

#[test]
fn the_tools_see_an_open_transaction_and_abort_ends_it_at_the_partition() {
    let broker = Broker::start(2);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    let b = bootstrap.as_str();
    let mut stream = broker.connect();
    assert_eq!(create(&mut stream, "orders", 1, 1, &[]), 0);
    // A record outside any transaction first: the transaction starts at offset 1.
    assert_eq!(produce_one(&mut stream, "orders", 0, &batch(1, 1, 1_700_000_000_000)), (0, 0));
    let producer = init(&mut stream, TXN, 60_000);
    assert_eq!(add_partition(&mut stream, TXN, producer, "orders", 0), 0);
    assert_eq!(produce_transactional(&mut stream, TXN, "orders", &transactional_batch(producer, 0, 2)), (0, 1));
    let (pid, epoch) = (producer.0.to_string(), producer.1.to_string());

    let (ok, out, err) = shardlog(&["transactions", "list", "--bootstrap", b]);
    assert!(ok, "{err}");
    assert!(out.starts_with("TransactionalId\tCoordinator\tProducerId\tState\n"), "{out}");
    assert_eq!(rows(&out), vec![vec![TXN.to_string(), "1".into(), pid.clone(), "Ongoing".into()]], "{out}");

    let (ok, out, err) = shardlog(&["transactions", "describe", "--transactional-id", TXN, "--bootstrap", b]);
    assert!(ok, "{err}");
    let described = &rows(&out)[0];
    assert_eq!(
        (&described[0], &described[2], &described[3], &described[4]),
        (&TXN.to_string(), &pid, &epoch, &"Ongoing".to_string()),
        "{out}"
    );
    assert_eq!(described[7], "orders-0", "{out}");
    let (ok, _, err) = shardlog(&["transactions", "describe", "--transactional-id", "nope", "--bootstrap", b]);
    assert!(!ok && err.contains("transactional id nope does not exist"), "{err}");

    let (ok, out, err) =
        shardlog(&["transactions", "describe-producers", "--topic", "orders", "--partition", "0", "--bootstrap", b]);
    assert!(ok, "{err}");
    assert!(out.starts_with("ProducerId\tProducerEpoch\tCoordinatorEpoch\tLastSequence\tLastTimestamp\t"), "{out}");
    let producers = rows(&out);
    assert_eq!(producers.len(), 1, "only the transactional producer has an id: {out}");
    let p = &producers[0];
    assert_eq!((&p[0], &p[1], &p[2], &p[3], &p[5]), (&pid, &epoch, &"-1".into(), &"1".into(), &"1".into()), "{out}");
    assert!(p[4].parse::<i64>().unwrap() > 1_700_000_000_000, "the broker's clock at the append: {out}");

    let (ok, out, err) = shardlog(&["topic", "describe", "orders", "--bootstrap", b]);
    assert!(ok, "{err}");
    assert!(
        out.contains("\tHighWatermark: 3\tReplicaLogEnds: 1:3\tLastStableOffset: 1\tOpenTransactions: 1\n"),
        "{out}"
    );

    // Held open by its coordinator and recent: not hanging, unless every idle moment counts.
    let (ok, out, err) = shardlog(&["transactions", "find-hanging", "--topic", "orders", "--bootstrap", b]);
    assert!(ok, "{err}");
    assert_eq!(rows(&out), Vec::<Vec<String>>::new(), "{out}");
    std::thread::sleep(Duration::from_millis(5));
    let (ok, out, err) = shardlog(&[
        "transactions",
        "find-hanging",
        "--broker-id",
        "1",
        "--max-transaction-timeout-ms",
        "0",
        "--bootstrap",
        b,
    ]);
    assert!(ok, "{err}");
    let hanging = rows(&out);
    assert_eq!(hanging.len(), 1, "{out}");
    assert_eq!((&hanging[0][0], &hanging[0][2], &hanging[0][5]), (&"orders".to_string(), &pid, &"1".to_string()));
    assert_eq!(hanging[0][7], "idle past transaction.max.timeout.ms", "{out}");

    let abort = ["transactions", "abort", "--topic", "orders", "--partition", "0", "--bootstrap", b];
    let (ok, _, err) = shardlog(&[&abort[..], &["--start-offset", "2"]].concat());
    assert!(!ok && err.contains("no open transaction on orders-0 starts at offset 2"), "{err}");
    let (ok, out, err) = shardlog(&[&abort[..], &["--start-offset", "1"]].concat());
    assert!(ok, "{err}");
    assert_eq!(
        out,
        format!("Aborted the transaction of producer {pid} (epoch {epoch}) on orders-0 starting at offset 1.\n")
    );

    // The marker is at offset 3: the LSO reached the HW, and read_committed consumers skip the records.
    assert_eq!((latest(&mut stream, "orders", 0, 0), latest(&mut stream, "orders", 0, 1)), (4, 4));
    assert_eq!(committed(&mut stream, "orders"), (4, vec![(producer.0, 1)]));
    let (_, out, _) =
        shardlog(&["transactions", "describe-producers", "--topic", "orders", "--partition", "0", "--bootstrap", b]);
    let p = &rows(&out)[0];
    assert_eq!(
        (&p[2], &p[5]),
        (&"0".to_string(), &"-1".to_string()),
        "the tool's coordinator epoch, no open transaction: {out}"
    );
    let (_, out, _) = shardlog(&["topic", "describe", "orders", "--bootstrap", b]);
    assert!(out.contains("\tHighWatermark: 4\tReplicaLogEnds: 1:4\n"), "nothing unstable left to show: {out}");

    // The coordinator still holds it open; when the producer commits, its COMMIT marker lands on a
    // partition where the transaction is no longer open: taken, and nothing it aborted comes back.
    assert_eq!(describe(&mut stream, TXN).state, "Ongoing");
    assert_eq!(end_txn(&mut stream, 3, TXN, producer, true), 0);
    wait_for("the coordinator's marker taken", Duration::from_secs(30), || {
        (describe(&mut stream, TXN).state == "CompleteCommit").then_some(())
    });
    assert_eq!((latest(&mut stream, "orders", 0, 0), latest(&mut stream, "orders", 0, 1)), (5, 5), "its marker at 4");
    assert_eq!(committed(&mut stream, "orders"), (5, vec![(producer.0, 1)]), "still aborted");
    broker.terminate();
}

#[test]
fn describe_producers_answers_each_partition_and_names_the_unknown_ones() {
    use kafka_protocol::messages::describe_producers_request::TopicRequest;
    let broker = Broker::start(1);
    let mut stream = broker.connect();
    assert_eq!(create(&mut stream, "orders", 1, 1, &[]), 0);
    let req = DescribeProducersRequest::default().with_topics(vec![
        TopicRequest::default().with_name(name("orders")).with_partition_indexes(vec![0, 5, -1]),
        TopicRequest::default().with_name(name("nope")).with_partition_indexes(vec![0]),
    ]);
    send(&mut stream, ApiKey::DescribeProducers, 0, 9, &req);
    let ResponseKind::DescribeProducers(r) = receive(&mut stream, ApiKey::DescribeProducers, 0).1 else { panic!() };
    let answered: Vec<(String, i32, i16, usize)> = (r.topics.iter())
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (t.name.0.to_string(), p.partition_index, p.error_code, p.active_producers.len()))
        })
        .collect();
    let unknown = ResponseError::UnknownTopicOrPartition.code();
    assert_eq!(
        answered,
        vec![
            ("orders".to_string(), 0, 0, 0),
            ("orders".to_string(), 5, unknown, 0),
            ("orders".to_string(), -1, unknown, 0),
            ("nope".to_string(), 0, unknown, 0),
        ]
    );
    broker.terminate();
}

#[test]
fn describe_producers_is_answered_by_the_leader_only_and_the_tool_finds_it() {
    use kafka_protocol::messages::describe_producers_request::TopicRequest;
    let cluster = common::cluster::Cluster::start(&[]);
    let mut client = cluster.client();
    client.create_topic("spread", 1, 1, &[]).unwrap();
    let leader = client.led_layout("spread").unwrap().leaders[&0].clone();
    let req = DescribeProducersRequest::default()
        .with_topics(vec![TopicRequest::default().with_name(name("spread")).with_partition_indexes(vec![0])]);
    let bootstrap = cluster.bootstrap();
    for addr in bootstrap.split(',') {
        let expected = if addr == leader { 0 } else { ResponseError::NotLeaderOrFollower.code() };
        // A broker the topic's metadata has not reached yet does not know the partition.
        let deadline = Instant::now() + Duration::from_secs(30);
        let code = loop {
            let answer = client.connection(addr).unwrap().call(ApiKey::DescribeProducers, 0, &req).unwrap();
            let ResponseKind::DescribeProducers(r) = answer else { panic!() };
            let code = r.topics[0].partitions[0].error_code;
            if code != ResponseError::UnknownTopicOrPartition.code() || Instant::now() > deadline {
                break code;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(code, expected, "{addr} (the leader is {leader})");
    }
    // Bootstrapped with a broker that does not lead it, the tool asks the leader.
    let follower = bootstrap.split(',').find(|a| *a != leader).unwrap();
    let (ok, out, err) = shardlog(&[
        "transactions",
        "describe-producers",
        "--topic",
        "spread",
        "--partition",
        "0",
        "--bootstrap",
        follower,
    ]);
    assert!(ok, "{err}");
    assert_eq!(out.lines().count(), 1, "the header, no producer: {out}");
    let (ok, out, err) = shardlog(&["transactions", "list", "--bootstrap", follower]);
    assert!(ok, "{err}");
    assert_eq!(out, "TransactionalId\tCoordinator\tProducerId\tState\n", "every broker asked, none lists one");
}
