//! The load tools against a real single-node shardlog, all as processes: `cluster` starts the broker,
//! `produce` writes down what was acknowledged, `consume` and `audit` read it back, and their counts
//! agree. An audit of a record that was never stored fails.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

fn bench() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shardlog-bench"))
}

/// `shardlog-bench cluster --brokers 1` on a free port; stopped with SIGTERM when dropped.
struct Cluster {
    child: Child,
    bootstrap: String,
}

impl Cluster {
    fn start(data: &Path) -> Cluster {
        let port = shardlog_bench::cluster::free_port().unwrap();
        Self::start_with(data, port, &[])
    }

    /// The broker listens on `port` (PLAINTEXT) and as `settings` say (`KEY=VALUE`, passed with --set).
    fn start_with(data: &Path, port: u16, settings: &[&str]) -> Cluster {
        let metrics = shardlog_bench::cluster::free_port().unwrap();
        let mut child = bench()
            .args(["cluster", "--brokers", "1", "--shards", "2", "--base-port", &port.to_string()])
            .args(["--metrics-base-port", &metrics.to_string(), "--data-dir"])
            .arg(data)
            .args(settings.iter().flat_map(|s| ["--set", s]))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        assert_eq!(line.trim(), format!("127.0.0.1:{port}"), "the launcher prints the bootstrap list");
        Cluster { child, bootstrap: line.trim().to_string() }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: kill(2) on a process this test started.
        unsafe { libc_kill(self.child.id() as i32, 15) };
        let _ = self.child.wait();
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

/// Runs the tool; returns (success, stdout).
fn run(args: &[&str]) -> (bool, String) {
    let out = bench().args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success() || args[0] == "audit", "{args:?}: {}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    (out.status.success(), stdout)
}

/// The count at the start of "N messages in ...".
fn messages(report: &str) -> u64 {
    let line = report.lines().find(|l| l.contains(" messages in ")).unwrap_or_else(|| panic!("no count in {report}"));
    line.split_whitespace().next().unwrap().parse().unwrap()
}

#[test]
fn produce_consume_and_audit_agree_on_what_was_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(&dir.path().join("cluster"));
    let b = cluster.bootstrap.as_str();
    let acked = dir.path().join("acked.txt");
    let acked = acked.to_str().unwrap();

    // Sync (one message per request per partition), then async batches with compression, same topic.
    let (_, sync) = run(&[
        "produce",
        "--bootstrap",
        b,
        "--topic",
        "audit-me",
        "--create",
        "--partitions",
        "4",
        "--acks",
        "all",
        "--mode",
        "sync",
        "--messages",
        "2000",
        "--record",
        acked,
    ]);
    assert_eq!(messages(&sync), 2000, "{sync}");
    assert!(sync.starts_with("sync: one message per request"), "the figures say how they were taken: {sync}");
    assert!(sync.contains("send to acknowledgement (ms): p50"), "{sync}");
    let acked_async = dir.path().join("acked-async.txt");
    let (_, batched) = run(&[
        "produce",
        "--bootstrap",
        b,
        "--topic",
        "audit-me",
        "--acks",
        "1",
        "--mode",
        "async",
        "--in-flight",
        "4",
        "--batch-bytes",
        "8192",
        "--compression",
        "lz4",
        "--message-size",
        "512",
        "--messages",
        "30000",
        "--record",
        acked_async.to_str().unwrap(),
    ]);
    assert_eq!(messages(&batched), 30000, "{batched}");
    let setup = "async: batches up to 8192 bytes per partition (requests up to 32 MiB), 4 requests in flight";
    assert!(batched.starts_with(setup), "{batched}");
    let mut all = std::fs::read_to_string(acked).unwrap();
    all.push_str(&std::fs::read_to_string(&acked_async).unwrap());
    std::fs::write(acked, &all).unwrap();
    assert_eq!(all.lines().count(), 32000, "every acknowledged record was written down");

    let (_, consumed) = run(&["consume", "--bootstrap", b, "--topic", "audit-me", "--messages", "32000"]);
    assert_eq!(messages(&consumed), 32000, "{consumed}");
    assert!(
        consumed.contains("end to end: not measured (no record was produced after the consumer started)"),
        "old records say how old they are, not how fast they arrive: {consumed}"
    );

    let (ok, audit) = run(&["audit", "--bootstrap", b, "--topic", "audit-me", "--records", acked, "--exactly-once"]);
    assert!(ok, "{audit}");
    assert!(audit.starts_with("acknowledged 32000, stored 32000: missing 0, moved 0, reordered 0"), "{audit}");
    assert!(audit.contains("\nduplicates: none\n"), "{audit}");

    // A record acknowledged at an offset that holds something else, and one nobody stored.
    all.push_str("0 5 deadbeef\n3 999999 0badf00d\n");
    std::fs::write(acked, &all).unwrap();
    let (ok, audit) = run(&["audit", "--bootstrap", b, "--topic", "audit-me", "--records", acked]);
    assert!(!ok, "an audit with missing records exits non-zero: {audit}");
    assert!(audit.contains("missing 2"), "{audit}");

    // Paced: records are created on schedule (never ahead of it) and wait up to --linger-ms for their
    // batch, which at this rate never fills, so a record is acknowledged no sooner than the linger.
    let (_, paced) = run(&[
        "produce",
        "--bootstrap",
        b,
        "--topic",
        "audit-me",
        "--acks",
        "1",
        "--mode",
        "async",
        "--rate",
        "1000",
        "--linger-ms",
        "50",
        "--batch-bytes",
        "1048576",
        "--duration",
        "1s",
    ]);
    let sent = messages(&paced);
    assert!(sent > 0 && sent <= 1001, "no more than the schedule offers: {paced}");
    let p50: f64 = paced
        .split("creation to acknowledgement (ms): p50 ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| panic!("a creation-to-ack latency: {paced}"))
        .parse()
        .unwrap();
    assert!(p50 >= 45.0, "records lingered: p50 {p50} ms");

    // acks=0 is labelled as sent, not acknowledged.
    let (_, fire) = run(&["produce", "--bootstrap", b, "--topic", "audit-me", "--acks", "0", "--messages", "500"]);
    assert!(fire.contains("\nacks=0: sent, not acknowledged"), "{fire}");
    assert_eq!(messages(&fire), 500);

    // Async by default batches as librdkafka does, and says so.
    let (_, default_batches) =
        run(&["produce", "--bootstrap", b, "--topic", "audit-me", "--mode", "async", "--messages", "5000"]);
    assert!(default_batches.starts_with("async: batches up to 1000000 bytes per partition"), "{default_batches}");
    // A linger without a paced load would change nothing: refused.
    let out = bench()
        .args([
            "produce",
            "--bootstrap",
            b,
            "--topic",
            "audit-me",
            "--mode",
            "async",
            "--linger-ms",
            "5",
            "--messages",
            "1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--linger-ms applies to"));
}

#[test]
fn transactional_produce_commits_every_transaction_and_read_committed_consumers_get_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(&dir.path().join("cluster"));
    let b = cluster.bootstrap.as_str();
    // 1,000 records in transactions of 70 (the last one of 20), over 3 partitions, 2 requests in flight.
    let (_, produced) = run(&[
        "produce",
        "--bootstrap",
        b,
        "--topic",
        "txns",
        "--create",
        "--partitions",
        "3",
        "--mode",
        "async",
        "--in-flight",
        "2",
        "--message-size",
        "256",
        "--transactional",
        "--txn-records",
        "70",
        "--transactional-id",
        "bench-txn",
        "--messages",
        "1000",
    ]);
    assert_eq!(messages(&produced), 1000, "{produced}");
    assert!(produced.contains("transactional producer (transactional id bench-txn), 70 records per"), "{produced}");
    assert!(produced.contains("15 transactions of up to 70 records committed"), "{produced}");
    assert!(produced.contains("EndTxn(commit), send to answer (ms): p50"), "{produced}");
    // Committed: a read_committed consumer (up to the last stable offset) gets all of them. Markers are
    // not records: a read_uncommitted consumer counts the same thousand.
    for isolation in ["read_committed", "read_uncommitted"] {
        let (_, consumed) = run(&[
            "consume",
            "--bootstrap",
            b,
            "--topic",
            "txns",
            "--isolation",
            isolation,
            "--messages",
            "1000",
            "--timeout-ms",
            "5000",
        ]);
        assert_eq!(messages(&consumed), 1000, "{isolation}: {consumed}");
    }
    // A second run with the same transactional id fences the first's epoch and goes on committing.
    let (_, again) = run(&[
        "produce",
        "--bootstrap",
        b,
        "--topic",
        "txns",
        "--mode",
        "async",
        "--transactional",
        "--transactional-id",
        "bench-txn",
        "--txn-records",
        "1",
        "--messages",
        "5",
    ]);
    assert!(again.contains("5 transactions of up to 1 records committed"), "{again}");
    let (_, consumed) =
        run(&["consume", "--bootstrap", b, "--topic", "txns", "--isolation", "read_committed", "--messages", "1005"]);
    assert_eq!(messages(&consumed), 1005, "{consumed}");
    // An idempotent producer beside them: InitProducerId without a transactional id.
    let (_, idempotent) =
        run(&["produce", "--bootstrap", b, "--topic", "txns", "--mode", "async", "--idempotence", "--messages", "100"]);
    assert_eq!(messages(&idempotent), 100, "{idempotent}");
    let (_, consumed) =
        run(&["consume", "--bootstrap", b, "--topic", "txns", "--isolation", "read_committed", "--messages", "1105"]);
    assert_eq!(messages(&consumed), 1105, "{consumed}");
    // Kafka refuses a transactional producer with acks other than all; so does the tool, before sending.
    let (_, stderr) = run_failing(&[
        "produce",
        "--bootstrap",
        b,
        "--topic",
        "txns",
        "--mode",
        "async",
        "--acks",
        "1",
        "--transactional",
        "--messages",
        "1",
    ]);
    assert!(stderr.contains("--transactional needs --acks all"), "{stderr}");
}

#[test]
fn consume_measures_end_to_end_latency_of_records_produced_after_it_started() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(&dir.path().join("cluster"));
    let b = cluster.bootstrap.clone();
    run(&["produce", "--bootstrap", &b, "--topic", "live", "--create", "--partitions", "2", "--messages", "100"]);
    let consumer = {
        let b = b.clone();
        std::thread::spawn(move || {
            run(&["consume", "--bootstrap", &b, "--topic", "live", "--from", "latest", "--messages", "1000"])
        })
    };
    // The consumer starts at the end of the log: what is produced from then on is new to it. Produce
    // until it has its thousand (it may start after the first of these).
    for _ in 0..60 {
        if consumer.is_finished() {
            break;
        }
        run(&["produce", "--bootstrap", &b, "--topic", "live", "--mode", "async", "--messages", "500"]);
    }
    let (_, consumed) = consumer.join().unwrap();
    let count = messages(&consumed);
    assert!(count >= 1000, "{consumed}");
    let label =
        format!("end to end, producer timestamp to fetch, of the {count} records produced after the start (ms): p50");
    assert!(consumed.contains(&label), "{consumed}");
}

#[test]
fn produce_and_consume_authenticate_with_scram_through_a_command_config() {
    let dir = tempfile::tempdir().unwrap();
    let (port, sasl) = (shardlog_bench::cluster::free_port().unwrap(), shardlog_bench::cluster::free_port().unwrap());
    let listeners = format!("listeners=PLAINTEXT://127.0.0.1:{port},SASL_PLAINTEXT://127.0.0.1:{sasl}");
    let _cluster =
        Cluster::start_with(&dir.path().join("cluster"), port, &[&listeners, "sasl.enabled.mechanisms=SCRAM-SHA-256"]);
    let mut admin = shardlog_broker::client::KafkaClient::connect(&format!("127.0.0.1:{port}")).unwrap();
    admin.upsert_scram_user("loader", 1, 4096, b"loader-secret").unwrap();
    let config = dir.path().join("loader.properties");
    std::fs::write(
        &config,
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\nsasl.username=loader\nsasl.password=loader-secret\n",
    )
    .unwrap();
    let (b, c) = (format!("127.0.0.1:{sasl}"), config.to_str().unwrap());
    let secured = ["--bootstrap", b.as_str(), "--command-config", c, "--topic", "signed-in"];

    // Pipelined batches (several requests in flight on each connection), then fetches, all over SASL.
    let produce =
        ["produce", "--create", "--partitions", "2", "--mode", "async", "--in-flight", "4", "--messages", "5000"];
    let (_, produced) = run(&[&produce[..], &secured[..]].concat());
    assert_eq!(messages(&produced), 5000, "{produced}");
    let (_, consumed) = run(&[&["consume", "--messages", "5000"][..], &secured[..]].concat());
    assert_eq!(messages(&consumed), 5000, "{consumed}");

    // Without the file the SASL listener closes the connection, and the tool says what is missing.
    let (_, stderr) = run_failing(&["produce", "--bootstrap", &b, "--topic", "signed-in", "--messages", "1"]);
    assert!(stderr.contains("--command-config"), "{stderr}");
}

/// Runs the tool expecting it to fail; returns (stdout, stderr).
fn run_failing(args: &[&str]) -> (String, String) {
    let out = bench().args(args).output().unwrap();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(!out.status.success(), "{args:?} succeeded:\n{stdout}\n{stderr}");
    (stdout, stderr)
}

#[test]
fn consume_gives_up_with_an_error_when_fewer_records_come_than_asked_for() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(&dir.path().join("cluster"));
    let b = cluster.bootstrap.as_str();
    run(&["produce", "--bootstrap", b, "--topic", "short", "--create", "--partitions", "2", "--messages", "300"]);

    let (stdout, stderr) =
        run_failing(&["consume", "--bootstrap", b, "--topic", "short", "--messages", "1000", "--timeout-ms", "3000"]);
    // It says what it waits for while it waits, then why it stopped.
    assert!(
        stderr.contains("waiting for records of short: 300 of the 1000 asked for so far")
            && stderr.contains("the topic held 300 from its earliest offsets when the run began"),
        "{stderr}"
    );
    assert!(
        stderr
            .contains("Error: consumed 300 of the 1000 messages asked for: none arrived for 3.0 s (--timeout-ms 3000)"),
        "{stderr}"
    );
    // What did arrive is still reported, its rates over the time the records arrived, not the wait.
    assert_eq!(messages(&stdout), 300, "{stdout}");
    let line = stdout.lines().find(|l| l.starts_with("records arrived over ")).unwrap_or_else(|| panic!("{stdout}"));
    let seconds: Vec<f64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    assert_eq!(seconds.len(), 2, "{line}");
    assert!(seconds[0] < seconds[1], "records arrived over less than the run, which waited for more: {line}");
    let span = stdout.split(" messages in ").nth(1).and_then(|r| r.split_whitespace().next()).unwrap();
    assert_eq!(span.parse::<f64>().unwrap(), seconds[0], "the rate is over the arrivals: {stdout}");
}

#[test]
fn consume_of_a_topic_that_does_not_exist_says_so_and_stops() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(&dir.path().join("cluster"));
    let (_, stderr) = run_failing(&[
        "consume",
        "--bootstrap",
        &cluster.bootstrap,
        "--topic",
        "nosuch",
        "--messages",
        "10",
        "--timeout-ms",
        "2500",
    ]);
    assert!(stderr.contains("waiting for topic nosuch to be created (the cluster does not know it)"), "{stderr}");
    assert!(
        stderr.contains("topic nosuch does not exist: the cluster answered UNKNOWN_TOPIC_OR_PARTITION"),
        "{stderr}"
    );
}

#[test]
fn flags_the_run_would_ignore_are_refused_before_anything_is_sent() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = Cluster::start(&dir.path().join("cluster"));
    let b = cluster.bootstrap.as_str();
    let produce = |extra: &[&str]| {
        let mut args = vec!["produce", "--bootstrap", b, "--messages", "10"];
        args.extend_from_slice(extra);
        run_failing(&args).1
    };
    // Sync mode sends one message per request, one request at a time: batches and in-flight requests
    // are async mode's.
    for flag in ["--in-flight", "--batch-bytes"] {
        let value = if flag == "--in-flight" { "4" } else { "8192" };
        let stderr = produce(&["--topic", "unmade", "--create", "--mode", "sync", flag, value]);
        assert!(stderr.contains(&format!("{flag} applies to --mode async")), "{stderr}");
    }
    // A topic's settings apply only to a topic this run creates.
    run(&["produce", "--bootstrap", b, "--topic", "made", "--create", "--messages", "10"]);
    for (flag, value) in [("--min-insync", "2"), ("--partitions", "3"), ("--replication-factor", "1")] {
        let stderr = produce(&["--topic", "made", flag, value]);
        assert!(stderr.contains(&format!("{flag} applies to --create")), "{stderr}");
    }
    // Refused before anything was sent: the topic a refused --create named was not created.
    let (_, stderr) =
        run_failing(&["consume", "--bootstrap", b, "--topic", "unmade", "--messages", "1", "--timeout-ms", "500"]);
    assert!(stderr.contains("topic unmade does not exist"), "{stderr}");

    // tps-table shapes only the brokers it starts itself.
    for (flag, value) in [("--shards", "2"), ("--shardlog", "/bin/true")] {
        let out = dir.path().join(format!("report{flag}"));
        let (_, stderr) = run_failing(&[
            "tps-table",
            "--bootstrap",
            b,
            "--scenario",
            "3",
            "--duration",
            "1s",
            flag,
            value,
            "--out",
            out.to_str().unwrap(),
        ]);
        assert!(stderr.contains(&format!("{flag} applies to --local")), "{stderr}");
        assert!(!out.exists(), "nothing was measured");
    }
}

#[test]
fn the_launcher_refuses_more_brokers_than_a_local_cluster_has() {
    let out = bench().args(["cluster", "--brokers", "6"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("1 to 5"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn tps_table_scenario_3_fills_every_row_on_a_local_cluster_of_four_brokers_and_writes_a_report_folder() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let (_, printed) = run(&[
        "tps-table",
        "--scenario",
        "3",
        "--local",
        "--duration",
        "1s",
        "--shards",
        "2",
        "--set",
        "shard.idle.poll.us=50",
        "--out",
        out.to_str().unwrap(),
    ]);
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(printed.contains(&report), "the tables are printed as written");
    assert!(report.contains("broker settings shard.idle.poll.us=50"), "the report names the local broker's settings");
    assert!(report.contains("| replicas | acks | Kafka TPS (seed) | shardlog TPS | ratio |"), "{report}");
    assert!(report.contains("acknowledged = fdatasync'ed"), "the report says what an acknowledgement meant");

    // results.csv: a header and one line per seed row, every line with the header's columns.
    let csv = std::fs::read_to_string(out.join("results.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 9, "scenario 3 has nine rows");
    let column = |name: &str| header.iter().position(|h| *h == name).unwrap();
    for row in &rows {
        assert_eq!(row.len(), header.len(), "{row:?}");
        let replicas: i32 = row[column("replicas")].parse().unwrap();
        let seed: f64 = row[column("seed_tps")].parse().unwrap();
        assert!(seed > 0.0);
        assert!([1, 2, 4].contains(&replicas), "{row:?}");
        // Every row is measured, the replicated ones on the local cluster of four: a rate, and (but for
        // acks=0) a latency.
        assert_eq!(row[column("status")], "measured", "{row:?}");
        assert!(row[column("tps")].parse::<f64>().unwrap() > 0.0, "{row:?}");
        assert!(row[column("ratio")].parse::<f64>().unwrap() > 0.0, "{row:?}");
        if row[column("acks")] != "0" {
            assert!(row[column("p99_ms")].parse::<f64>().unwrap() > 0.0, "{row:?}");
        }
    }
    assert!(!report.contains("needs"), "{report}");

    // Charts: valid images with a band per row, rows labelled by what they are, the rows that could not
    // run shown as such, percentile ticks people quote; and the latency histograms of acknowledged rows.
    for (chart, size) in [("tps", (1100, 110 + 34 * 9)), ("latency", (1100, 560))] {
        let png = image::open(out.join(format!("{chart}.png"))).unwrap();
        assert_eq!((png.width(), png.height()), size, "{chart}");
    }
    let tps = std::fs::read_to_string(out.join("tps.svg")).unwrap();
    assert!(tps.starts_with("<svg"));
    for text in ["S3 acks=1 RF=1", "S3 acks=-1 RF=1", "S3 acks=0 RF=4", "S3 acks=-1 RF=4", "log scale"] {
        assert!(tps.contains(text), "tps chart lacks {text:?}");
    }
    let latency = std::fs::read_to_string(out.join("latency.svg")).unwrap();
    // SVG text elements hold their text on a line of its own.
    let lines: Vec<&str> = latency.lines().map(str::trim).collect();
    for tick in ["p50", "p90", "p99", "p99.9", "p99.99"] {
        assert!(lines.contains(&tick), "latency chart lacks the {tick} tick");
    }
    assert!(lines.iter().any(|l| l.starts_with("S3 acks=1 RF=1")), "latency curves are labelled by row");
    let logs: Vec<_> = std::fs::read_dir(out.join("hdr")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(logs.len(), 6, "acks=1 and acks=all rows have latency logs: {logs:?}");
}

#[test]
fn loopback_reports_round_trips_across_and_on_one_core_and_a_stream() {
    let (_, printed) = run(&["loopback", "--duration", "200ms"]);
    let round_trips: Vec<&str> = printed.lines().filter(|l| l.starts_with("round trip")).collect();
    assert_eq!(round_trips.len(), 2, "{printed}");
    for line in round_trips {
        // "... over N round trips (one lane: at most R/s)"
        let count: u64 = line.split(" over ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
        assert!(count > 0, "{line}");
        let rate = line.split("at most ").nth(1).unwrap().trim_end_matches("/s)");
        assert!(rate.parse::<f64>().unwrap() > 0.0, "{line}");
    }
    let stream = printed.lines().find(|l| l.starts_with("one stream: ")).expect("a stream line");
    let mb_s: f64 = stream["one stream: ".len()..].split_whitespace().next().unwrap().parse().unwrap();
    assert!(mb_s > 0.0, "{stream}");
}

#[test]
fn quorum_measures_the_commit_rate_and_a_leader_failover_with_real_voters() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("quorum");
    let (_, printed) = run(&[
        "quorum",
        "--voters",
        "3",
        "--writers",
        "2",
        "--duration",
        "500ms",
        "--kills",
        "1",
        "--data-dir",
        data.to_str().unwrap(),
    ]);
    let rate = printed.lines().find(|l| l.starts_with("CreateTopic with 3 voters, 2 writers: ")).expect("a rate line");
    let per_second: f64 = rate.split(": ").nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert!(per_second > 0.0, "{rate}");
    let failover = printed.lines().find(|l| l.starts_with("leader killed 1 times: ")).expect("a failover line");
    assert!(failover.contains("p50") && failover.contains("max"), "{failover}");
    for id in 1..=3 {
        assert!(data.join(format!("voter-{id}/raft-log")).is_file(), "voter {id} kept its log in the data dir");
    }
}

#[test]
fn version_names_the_commit_and_the_build_profile() {
    let (_, out) = run(&["--version"]);
    assert!(out.starts_with(&format!("shardlog-bench {} (commit ", env!("CARGO_PKG_VERSION"))), "{out}");
    assert!(out.contains("debug build)") || out.contains("release build)"), "{out}");
}

/// With `RUST_BACKTRACE=1`, as many Rust users have it set, an expected error is its message only.
#[test]
fn an_expected_error_prints_its_message_without_a_backtrace_even_with_rust_backtrace_set() {
    let out = bench()
        .env("RUST_BACKTRACE", "1")
        .args(["produce", "--bootstrap", "127.0.0.1:1", "--topic", "t", "--messages", "1"])
        .args(["--mode", "sync", "--in-flight", "4"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.starts_with("Error: ") && stderr.contains("--in-flight applies to --mode async"), "{stderr}");
    assert!(!stderr.contains("backtrace") && !stderr.contains("main.rs"), "no backtrace: {stderr}");
}
