//! Client quotas enforced on the real broker (issue 38 §6): a client above its producer_byte_rate or
//! consumer_byte_rate gets `throttle_time_ms` in its answers and is held to its quota, so is one above
//! its request_percentage, connections over an IP's connection_creation_rate are closed, and a client
//! without quotas is never throttled.
//!
//! The clients here speak the Kafka protocol directly and never wait out a throttle themselves, as a
//! real client would (KIP-219): what holds them to the quota is the broker muting their connection. The
//! last test is a real client, librdkafka through confluent-kafka, which does wait throttles out.
//!
//! The brokers run with `quota.window.num=2`: a client's first burst may then reach one second of its
//! quota (Kafka's default of 11 samples allows ten seconds' worth), so a run of a few seconds measures
//! the quota and not the burst. The rates asserted are upper bounds, which a slow machine only makes
//! easier to meet.

mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
use kafka_protocol::messages::{AlterClientQuotasRequest, ApiKey, ResponseKind};
use kafka_protocol::protocol::StrBytes;

use common::requests::{batch, create, fetch_request, produce_request};
use common::{Broker, receive, send};

/// The client id every request of [`common::send`] carries.
const CLIENT_ID: &str = "wire-test";
const QUOTA_BYTES_PER_SECOND: f64 = 1_000_000.0;
/// How far above the quota a measured average may be: one request's worth over a run of several
/// seconds, and the sampled window's granularity.
const TOLERANCE: f64 = 1.1;

fn text(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// Sets `key` to `value` for this test's client id (`/clients/wire-test`).
fn set_client_quota(s: &mut TcpStream, key: &str, value: f64) {
    let entity =
        vec![EntityData::default().with_entity_type(text("client-id")).with_entity_name(Some(text(CLIENT_ID)))];
    let op = OpData::default().with_key(text(key)).with_value(value);
    let request = AlterClientQuotasRequest::default()
        .with_entries(vec![EntryData::default().with_entity(entity).with_ops(vec![op])]);
    send(s, ApiKey::AlterClientQuotas, 1, 1, &request);
    let (_, ResponseKind::AlterClientQuotas(response)) = receive(s, ApiKey::AlterClientQuotas, 1) else {
        panic!("not an AlterClientQuotas response")
    };
    assert_eq!(response.entries[0].error_code, 0, "the quota is set");
}

fn start_broker() -> Broker {
    Broker::start_with(2, &["--set", "quota.window.num=2"])
}

/// Produces `batch` with acks=1 (Produce v9); returns the answer's throttle_time_ms.
fn produce(s: &mut TcpStream, topic: &str, batch: &[u8]) -> i32 {
    send(s, ApiKey::Produce, 9, 1, &produce_request(topic, 0, batch, 1));
    let (_, ResponseKind::Produce(r)) = receive(s, ApiKey::Produce, 9) else { panic!("not a Produce response") };
    assert_eq!(r.responses[0].partition_responses[0].error_code, 0, "the batch is appended");
    r.throttle_time_ms
}

/// Fetches from `offset` (Fetch v11, no wait); returns the record bytes and throttle_time_ms.
fn fetch(s: &mut TcpStream, topic: &str, offset: i64) -> (usize, i32) {
    send(s, ApiKey::Fetch, 11, 2, &fetch_request(topic, 0, offset, 0));
    let (_, ResponseKind::Fetch(r)) = receive(s, ApiKey::Fetch, 11) else { panic!("not a Fetch response") };
    let bytes = r.responses.iter().flat_map(|t| &t.partitions).map(|p| p.records.as_ref().map_or(0, |b| b.len())).sum();
    (bytes, r.throttle_time_ms)
}

/// What a run saw: when the first throttled answer came, and the bytes moved from then on.
struct Run {
    throttled_answers: usize,
    /// From the first throttled answer (the burst spent) to the end of the run.
    after_burst: Duration,
    bytes_after_burst: usize,
    total_bytes: usize,
}

impl Run {
    fn new() -> Run {
        Run { throttled_answers: 0, after_burst: Duration::ZERO, bytes_after_burst: 0, total_bytes: 0 }
    }

    fn bytes_per_second_after_burst(&self) -> f64 {
        self.bytes_after_burst as f64 / self.after_burst.as_secs_f64()
    }
}

/// Runs `step` (which moves bytes and returns them with the answer's throttle_time_ms) for `length`.
fn run_for(length: Duration, mut step: impl FnMut() -> (usize, i32)) -> Run {
    let start = Instant::now();
    let mut run = Run::new();
    let mut burst_spent: Option<Instant> = None;
    while start.elapsed() < length {
        let (bytes, throttle_ms) = step();
        run.total_bytes += bytes;
        if throttle_ms > 0 {
            run.throttled_answers += 1;
        }
        match burst_spent {
            Some(_) => run.bytes_after_burst += bytes,
            None if throttle_ms > 0 => burst_spent = Some(Instant::now()),
            None => {}
        }
    }
    run.after_burst = burst_spent.map_or(Duration::ZERO, |at| at.elapsed());
    eprintln!(
        "{} bytes in {:?}, {} answers throttled; after the burst {} bytes in {:?}",
        run.total_bytes,
        start.elapsed(),
        run.throttled_answers,
        run.bytes_after_burst,
        run.after_burst
    );
    run
}

#[test]
fn a_producer_at_ten_times_its_quota_gets_throttle_time_and_is_held_to_the_quota() {
    let broker = start_broker();
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "quota-produce", 1, 1, &[]), 0);
    set_client_quota(&mut s, "producer_byte_rate", QUOTA_BYTES_PER_SECOND);
    // About 100 KB a request, as fast as the broker takes them: well above 10 MB/s unthrottled.
    let records = batch(7, 1000, 0);
    let run = run_for(Duration::from_secs(9), || (records.len(), produce(&mut s, "quota-produce", &records)));
    assert!(run.throttled_answers > 0, "answers carried throttle_time_ms");
    assert!(run.after_burst >= Duration::from_secs(6), "the burst was spent early: {:?} left", run.after_burst);
    let rate = run.bytes_per_second_after_burst();
    assert!(
        rate <= TOLERANCE * QUOTA_BYTES_PER_SECOND,
        "{rate:.0} B/s after the burst, {} bytes over the whole run",
        run.total_bytes
    );
}

#[test]
fn a_consumer_above_its_quota_gets_throttle_time_and_is_held_to_the_quota() {
    let broker = start_broker();
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "quota-fetch", 1, 1, &[]), 0);
    let records = batch(9, 1000, 0);
    let batches = 100;
    for _ in 0..batches {
        assert_eq!(produce(&mut s, "quota-fetch", &records), 0, "producing is not limited");
    }
    set_client_quota(&mut s, "consumer_byte_rate", QUOTA_BYTES_PER_SECOND);
    // Each batch holds 1000 records; the consumer reads from where it got to, and starts over at the end.
    let mut offset = 0i64;
    let run = run_for(Duration::from_secs(9), || {
        let (bytes, throttle_ms) = fetch(&mut s, "quota-fetch", offset);
        offset += (bytes / records.len()) as i64 * 1000;
        if offset >= batches as i64 * 1000 {
            offset = 0;
        }
        (bytes, throttle_ms)
    });
    assert!(run.throttled_answers > 0, "answers carried throttle_time_ms");
    assert!(run.after_burst >= Duration::from_secs(6), "the burst was spent early: {:?} left", run.after_burst);
    let rate = run.bytes_per_second_after_burst();
    assert!(
        rate <= TOLERANCE * QUOTA_BYTES_PER_SECOND,
        "{rate:.0} B/s after the burst, {} bytes over the whole run",
        run.total_bytes
    );
    assert!(run.total_bytes > 0, "the consumer got records");
}

#[test]
fn without_quotas_nothing_is_throttled() {
    let broker = start_broker();
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "no-quota", 1, 1, &[]), 0);
    let records = batch(3, 1000, 0);
    let produced = run_for(Duration::from_secs(2), || (records.len(), produce(&mut s, "no-quota", &records)));
    assert_eq!(produced.throttled_answers, 0);
    let mut offset = 0i64;
    let fetched = run_for(Duration::from_secs(2), || {
        let (bytes, throttle_ms) = fetch(&mut s, "no-quota", offset);
        offset += (bytes / records.len()) as i64 * 1000;
        (bytes, throttle_ms)
    });
    assert_eq!(fetched.throttled_answers, 0);
    assert!(fetched.total_bytes >= produced.total_bytes.min(2_000_000), "the consumer read what was produced");
}

#[test]
fn connections_over_an_ips_connection_creation_rate_are_closed_unanswered() {
    use kafka_protocol::messages::ApiVersionsRequest;
    // Two listeners: the first, PLAINTEXT, is the inter-broker one, exempt from connection rates (other
    // brokers replicate through it); CLIENTS is an ordinary one.
    let free_port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (inter_broker, clients) = (free_port(), free_port());
    let listeners = format!("listeners=PLAINTEXT://127.0.0.1:{inter_broker},CLIENTS://127.0.0.1:{clients}");
    let dir = tempfile::tempdir().unwrap();
    let broker = Broker::start_at(
        &dir.path().join("data"),
        inter_broker,
        2,
        &[
            "--set",
            "quota.window.num=2",
            "--set",
            &listeners,
            "--set",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CLIENTS:PLAINTEXT",
        ],
        None,
    );
    let mut admin = broker.connect();
    let entity = vec![EntityData::default().with_entity_type(text("ip")).with_entity_name(Some(text("127.0.0.1")))];
    let op = OpData::default().with_key(text("connection_creation_rate")).with_value(1.0);
    let request = AlterClientQuotasRequest::default()
        .with_entries(vec![EntryData::default().with_entity(entity).with_ops(vec![op])]);
    send(&mut admin, ApiKey::AlterClientQuotas, 1, 1, &request);
    let (_, ResponseKind::AlterClientQuotas(response)) = receive(&mut admin, ApiKey::AlterClientQuotas, 1) else {
        panic!("not an AlterClientQuotas response")
    };
    assert_eq!(response.entries[0].error_code, 0, "the quota is set");
    // Ten connections at once against one a second: most are over the rate.
    let mut connections: Vec<TcpStream> =
        (0..10).map(|_| TcpStream::connect(("127.0.0.1", clients)).unwrap()).collect();
    let (mut answered, mut closed) = (0, 0);
    for s in &mut connections {
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        if common::try_send(s, ApiKey::ApiVersions, 2, 1, &ApiVersionsRequest::default()).is_err() {
            closed += 1;
            continue;
        }
        let mut size = [0u8; 4];
        match std::io::Read::read_exact(s, &mut size) {
            Ok(()) => answered += 1,
            Err(e) => {
                assert_ne!(e.kind(), std::io::ErrorKind::WouldBlock, "the connection was closed, not left hanging");
                closed += 1;
            }
        }
    }
    assert!(closed >= 1, "{answered} answered, {closed} closed");
    assert!(answered >= 1, "a connection within the rate is served");
    // The inter-broker listener serves every connection, however fast they come.
    for _ in 0..10 {
        let mut s = broker.connect();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        send(&mut s, ApiKey::ApiVersions, 2, 1, &ApiVersionsRequest::default());
        receive(&mut s, ApiKey::ApiVersions, 2);
    }
    // The connection made before the quota is not affected.
    set_client_quota(&mut admin, "producer_byte_rate", QUOTA_BYTES_PER_SECOND);
}

#[test]
fn a_client_above_its_request_percentage_gets_throttle_time_of_at_most_one_sample() {
    let broker = start_broker();
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "quota-request", 1, 1, &[]), 0);
    // A thousandth of a percent of a shard thread: ten microseconds of handler time a second.
    set_client_quota(&mut s, "request_percentage", 0.001);
    let records = batch(5, 10, 0);
    let throttles: Vec<i32> = (0..10).map(|_| produce(&mut s, "quota-request", &records)).collect();
    assert!(throttles.iter().any(|t| *t > 0), "answers carried throttle_time_ms: {throttles:?}");
    // Kafka throttles a request quota for at most one sample (quota.window.size.seconds, 1 s here).
    assert!(throttles.iter().all(|t| *t <= 1000), "{throttles:?}");
    // Every answer with the field carries the throttle, not only Produce's: Metadata here.
    let metadata_throttles: Vec<i32> = (0..10)
        .map(|_| {
            send(&mut s, ApiKey::Metadata, 12, 1, &kafka_protocol::messages::MetadataRequest::default());
            let (_, ResponseKind::Metadata(r)) = receive(&mut s, ApiKey::Metadata, 12) else {
                panic!("not a Metadata response")
            };
            r.throttle_time_ms
        })
        .collect();
    assert!(metadata_throttles.iter().any(|t| *t > 0), "Metadata answers carried it: {metadata_throttles:?}");
}

/// A real client: a confluent-kafka (librdkafka) producer offering 10 MB/s under a 1 MiB/s
/// producer_byte_rate set with `shardlog quota set` sees throttle time in librdkafka's statistics and
/// has at most 1.1 MiB/s acknowledged once throttled (`scripts/client-tests/quota_throttle.py`).
#[test]
fn a_librdkafka_producer_at_ten_times_its_quota_sees_throttle_time_and_is_held_to_the_quota() {
    let broker = start_broker();
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "quota-librdkafka", 1, 1, &[]), 0);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    let set = std::process::Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["quota", "set", "--client-id", "throttled-producer", "--producer-byte-rate", "1048576"])
        .args(["--bootstrap", &bootstrap])
        .output()
        .unwrap();
    assert!(set.status.success(), "{}", String::from_utf8_lossy(&set.stderr));
    common::run_client_script("quota_throttle.py", &[&bootstrap, "quota-librdkafka", "throttled-producer"]);
}

/// `shardlog_quota_throttled_total{quota="connection_creation"}` on the metrics endpoint at `port`.
fn connection_creation_throttles(port: u16) -> f64 {
    use std::io::{Read, Write};
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: test\r\n\r\n").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    answer
        .lines()
        .filter(|l| l.starts_with("shardlog_quota_throttled_total{") && l.contains("quota=\"connection_creation\""))
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap())
        .sum()
}

/// Opens `count` connections to `port` one after the other, each answered (ApiVersions) before the next.
fn connect_and_ask(port: u16, count: usize) {
    use kafka_protocol::messages::ApiVersionsRequest;
    for _ in 0..count {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        send(&mut s, ApiKey::ApiVersions, 2, 1, &ApiVersionsRequest::default());
        receive(&mut s, ApiKey::ApiVersions, 2);
    }
}

/// `max.connection.creation.rate` holds every listener but the inter-broker one, and
/// `listener.name.<name>.max.connection.creation.rate` its own listener, the inter-broker one included
/// (as in Kafka, KIP-612): past the rate the listener waits before it accepts the next connection, which
/// is then served, not closed.
#[test]
fn the_broker_and_a_listener_hold_connection_creation_to_their_rates() {
    let free_port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let start = |dir: &std::path::Path, limit: &str| {
        let (inter_broker, clients, metrics) = (free_port(), free_port(), free_port());
        let listeners = format!("listeners=PLAINTEXT://127.0.0.1:{inter_broker},CLIENTS://127.0.0.1:{clients}");
        let metrics_listen = format!("metrics.listen=\"127.0.0.1:{metrics}\"");
        let args = [
            "--set",
            "quota.window.num=2",
            "--set",
            &listeners,
            "--set",
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CLIENTS:PLAINTEXT",
            "--set",
            &metrics_listen,
            "--set",
            limit,
        ];
        (Broker::start_at(dir, inter_broker, 2, &args, None), clients, metrics)
    };
    let dir = tempfile::tempdir().unwrap();

    // The broker's limit: not the inter-broker listener, then the other one.
    let (broker, clients, metrics) = start(&dir.path().join("broker"), "max.connection.creation.rate=2");
    connect_and_ask(broker.port, 10);
    assert_eq!(connection_creation_throttles(metrics), 0.0, "the inter-broker listener is exempt");
    connect_and_ask(clients, 10);
    assert!(connection_creation_throttles(metrics) > 0.0, "CLIENTS waited at the broker's rate");
    drop(broker);

    // A listener's own limit: the other listener is not held, the limited one is, inter-broker as it is.
    let (broker, clients, metrics) =
        start(&dir.path().join("listener"), "listener.name.plaintext.max.connection.creation.rate=2");
    connect_and_ask(clients, 10);
    assert_eq!(connection_creation_throttles(metrics), 0.0, "CLIENTS has no limit");
    connect_and_ask(broker.port, 10);
    assert!(connection_creation_throttles(metrics) > 0.0, "PLAINTEXT waited at its own rate");
}
