//! Bytes on the Kafka listener that start like the peer protocol but are not a follower's fetches:
//! garbage, a frame whose CRC does not check, a frame cut short, a Hello from a broker the cluster does
//! not have, and a bad frame after a good Hello (answered, and the connection handed to the shard it
//! names). Each closes only its own connection, with one log line,
//! while the partition goes on replicating (acks=all with `min.insync.replicas=3` keeps succeeding).
//! Then DeleteRecords on the leader moves the log start of every replica.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use futures_lite::future::block_on;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};
use shardlog_broker::client::KafkaClient;
use shardlog_net::peer::replication::{ReplicaHello, ReplicaHelloAnswer, kind};
use shardlog_net::peer::{MAGIC, PeerFrameReader, decode_message, encode_frame, encode_message};

use crate::common::{Reports, all_led_with_isr, broker_log, cluster, wait_for};

const TOPIC: &str = "steady";

/// Sends `bytes` (then, if `half_close`, ends the sending side) and returns once the broker has closed
/// the connection; panics if it keeps it open.
fn refused(addr: &str, bytes: &[u8], half_close: bool) {
    let stream = TcpStream::connect(addr).unwrap();
    refused_on(stream, bytes, half_close);
}

fn refused_on(mut stream: TcpStream, bytes: &[u8], half_close: bool) {
    stream.write_all(bytes).unwrap();
    if half_close {
        stream.shutdown(Shutdown::Write).unwrap();
    }
    stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0u8; 256];
    match stream.read(&mut buf) {
        Ok(0) => {}
        Ok(n) => panic!("the broker answered {n} bytes instead of closing"),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the broker kept the connection open: {e}"),
    }
}

/// The log start offset broker `id` last checkpointed for `partition`.
fn checkpointed_log_start(dir: &std::path::Path, id: usize, partition: i32) -> Option<i64> {
    let broker = dir.join(format!("broker-{id}"));
    let wanted = format!("{TOPIC} {partition} ");
    std::fs::read_dir(&broker)
        .ok()?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("log-start-offset-checkpoint"))
        .filter_map(|e| std::fs::read_to_string(e.path()).ok())
        .find_map(|text| text.lines().find_map(|l| l.strip_prefix(&wanted).and_then(|o| o.parse().ok())))
}

fn produce(bootstrap: &str, count: usize) {
    let reports = Reports::default();
    let producer: BaseProducer<Reports> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "30000")
        .create_with_context(reports.clone())
        .expect("producer");
    for i in 0..count {
        // Both partitions get records (DeleteRecords below cuts partition 0 at offset 10).
        let record = format!("r{i}");
        producer.send(BaseRecord::<(), str>::to(TOPIC).partition(i as i32 % 2).payload(&record)).expect("queued");
    }
    producer.flush(Duration::from_secs(60)).expect("flushed");
    let reports = reports.0.lock().unwrap();
    assert_eq!(reports.len(), count);
    assert!(reports.iter().all(|r| r.3), "acknowledged by all three replicas: {:?}", reports.iter().find(|r| !r.3));
}

#[test]
fn bad_peer_frames_close_only_their_connection_with_one_log_line_and_replication_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path(), 3, 2, &[]);
    let configs = [("min.insync.replicas".to_string(), "3".to_string())];
    let mut client = KafkaClient::connect(cluster.addr(1)).unwrap();
    client.create_topic(TOPIC, 2, 3, &configs).unwrap();
    wait_for("both partitions with three in-sync replicas", Duration::from_secs(30), || {
        (1..=3).all(|b| all_led_with_isr(cluster.addr(b), TOPIC, 2, 3))
    });
    produce(&cluster.bootstrap, 50);
    let cluster_id = client.metadata(None).unwrap().cluster_id.expect("a cluster id").to_string();
    let hello = |broker: u32| {
        encode_frame(
            kind::HELLO,
            &encode_message(&ReplicaHello { cluster_id: cluster_id.clone(), broker, from_shard: 0, to_shard: 1 }),
        )
    };
    let target = cluster.addr(1);
    let before = broker_log(dir.path(), 1).len();

    let mut garbage = MAGIC.to_be_bytes().to_vec();
    garbage.extend((0..60u8).map(|i| i.wrapping_mul(37)));
    refused(target, &garbage, false);
    let mut bad_crc = hello(2);
    *bad_crc.last_mut().unwrap() ^= 0x40;
    refused(target, &bad_crc, false);
    let truncated = hello(2);
    refused(target, &truncated[..truncated.len() - 3], true);
    refused(target, &hello(99), false);
    // A good Hello is answered with the shard count, and the connection goes to shard 1, which refuses
    // a fetch whose CRC does not check.
    let mut stream = TcpStream::connect(target).unwrap();
    stream.write_all(&hello(2)).unwrap();
    let mut reader = PeerFrameReader::new(1 << 20);
    let answer = loop {
        if let Some(frame) = reader.next_frame().unwrap() {
            break frame;
        }
        let mut buf = [0u8; 256];
        let n = stream.read(&mut buf).unwrap();
        assert!(n > 0, "the Hello is answered");
        reader.extend(&buf[..n]);
    };
    assert_eq!(answer.kind, kind::HELLO_ANSWER);
    assert_eq!(decode_message::<ReplicaHelloAnswer>(&answer.body).unwrap().shards, 2);
    let mut fetch = encode_frame(kind::FETCH, b"not an rkyv archive of a fetch");
    *fetch.last_mut().unwrap() ^= 0x01;
    refused_on(stream, &fetch, false);

    // Replication goes on: acks=all needs every one of the three replicas.
    produce(&cluster.bootstrap, 50);
    assert!((1..=3).all(|b| all_led_with_isr(cluster.addr(b), TOPIC, 2, 3)), "nobody left the ISR");

    let added: Vec<String> = broker_log(dir.path(), 1).split_off(before);
    let closed: Vec<&String> = added.iter().filter(|l| l.contains("closing replication connection")).collect();
    assert_eq!(closed.len(), 5, "one line per bad connection: {closed:#?}");
    for (line, reason) in closed.iter().zip([
        "protocol version",
        "CRC32C mismatch",
        "inside a frame",
        "not a broker of this cluster",
        "bad frame",
    ]) {
        assert!(line.contains("WARN") && line.contains(reason), "{line:?} should say {reason:?}");
    }
    let others: Vec<&String> = added
        .iter()
        .filter(|l| (l.contains("WARN") || l.contains("ERROR")) && !l.contains("closing replication connection"))
        .collect();
    assert!(others.is_empty(), "no other warning: {others:#?}");

    // DeleteRecords goes to the leader; the followers learn its log start from their fetches.
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", &cluster.bootstrap).create().expect("admin client");
    let mut cut = TopicPartitionList::new();
    cut.add_partition_offset(TOPIC, 0, Offset::Offset(10)).unwrap();
    let answer = block_on(admin.delete_records(&cut, &AdminOptions::new())).expect("DeleteRecords");
    assert!(answer.elements().iter().all(|e| e.error().is_ok()), "{answer:?}");
    produce(&cluster.bootstrap, 10);
    wait_for("every replica's log start at 10", Duration::from_secs(30), || {
        (1..=3).all(|b| checkpointed_log_start(dir.path(), b, 0) == Some(10))
    });
}
