//! The fault campaign as a user runs it: `shardlog-bench faults` against real broker processes, each in
//! its own network namespace, killed, torn, paused, partitioned, slowed, losing packets and with a full
//! disk, must report every acknowledged record where it was acknowledged; and a broker broken on purpose
//! (acks=all answered before the followers have the batch) must make it fail.

use std::path::Path;
use std::process::{Command, Output};

use shardlog_bench::faults::plan::FaultKind;
use shardlog_bench::faults::{disk, net};

fn campaign(out: &Path, args: &[&str]) -> (Output, String) {
    let run = Command::new(env!("CARGO_BIN_EXE_shardlog-bench"))
        .arg("faults")
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .expect("run shardlog-bench faults");
    let report = std::fs::read_to_string(out.join("report.md")).unwrap_or_else(|_| {
        panic!("no report.md: {}\n{}", String::from_utf8_lossy(&run.stdout), String::from_utf8_lossy(&run.stderr))
    });
    (run, report)
}

/// The acknowledged and lost counts of a row of the report's table.
fn row(report: &str, label: &str) -> (u64, u64) {
    let line = report.lines().find(|l| l.starts_with(&format!("| {label} |"))).expect(label);
    let cell = |i: usize| line.split('|').nth(i).unwrap().trim().parse().unwrap();
    (cell(2), cell(3))
}

/// The campaign needs root and nftables for its namespaces; `.ci/run` installs nftables.
fn require_namespaces() {
    if let Some(why) = net::unavailable() {
        panic!("this test runs brokers in network namespaces: {why}");
    }
}

#[test]
fn a_short_campaign_of_thirty_faults_of_every_kind_loses_no_acknowledged_record() {
    require_namespaces();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let (run, report) =
        campaign(&out, &["--brokers", "3", "--faults", "30", "--seed", "20261201", "--duration", "60s"]);
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(report.contains("PASSED: no acknowledged record lost"), "{report}");
    // Every kind this machine can carry out came at least once: all of them where loop mounts work.
    let kinds = FaultKind::ALL.into_iter().filter(|&k| k != FaultKind::DiskFull || disk::unavailable().is_none());
    for kind in kinds {
        assert!(report.contains(&format!("| {} |", kind.name())), "{} came\n{report}", kind.name());
    }
    // The workload ran through the faults: each acks=all producer had records acknowledged.
    assert!(row(&report, "idempotent, acks=all").0 > 100, "{report}");
    assert!(row(&report, "acks=all, retries").0 > 100, "{report}");
    assert!(stdout.contains("seed 20261201 (replay with --seed 20261201)"), "{stdout}");
    assert!(report.contains("The brokers killed were, just before (by the metadata): "), "{report}");
    assert!(out.join("timeline.svg").is_file() && out.join("timeline.png").is_file(), "the timeline chart");
    // Nothing of the campaign is left on the host: namespaces, bridge, mounts.
    let netns = Command::new("ip").args(["netns", "list"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&netns.stdout).contains(&format!("shardlog-faults-{}-", run_pid(&stdout))));
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(!mounts.contains(&*out.to_string_lossy()), "the campaign's filesystems are unmounted\n{mounts}");
}

/// Secured everywhere (clients over SASL_SSL with SCRAM-SHA-512, replication and the quorum over cluster
/// mTLS, the StandardAuthorizer on): a short campaign of every kind loses no acknowledged record, and no
/// broker refused another, killed, torn, paused or cut off as it was.
#[test]
fn a_short_campaign_on_a_cluster_secured_everywhere_loses_no_acknowledged_record() {
    require_namespaces();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let (run, report) = campaign(
        &out,
        &["--brokers", "3", "--faults", "12", "--seed", "20261207", "--duration", "36s", "--security", "sasl_ssl"],
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(report.contains("PASSED: no acknowledged record lost"), "{report}");
    assert!(report.contains("Secured everywhere: clients over SASL_SSL"), "{report}");
    assert!(row(&report, "idempotent, acks=all").0 > 100, "{report}");
    assert!(row(&report, "acks=all, retries").0 > 100, "{report}");
    let properties = std::fs::read_to_string(out.join("certificates/client.properties")).unwrap();
    assert!(properties.contains("security.protocol=SASL_SSL"), "{properties}");
    for id in 1..=3 {
        let log = std::fs::read_to_string(out.join(format!("broker-{id}.log"))).unwrap();
        // The broker ran with the secured listener and cluster mTLS, and refused no peer.
        assert!(log.contains("SASL_SSL"), "broker {id} ran a SASL_SSL listener:\n{log}");
        assert!(log.contains("cluster mTLS"), "broker {id} ran cluster mTLS:\n{log}");
        let refused: Vec<&str> = log
            .lines()
            .filter(|l| l.contains("refused a replication connection") || l.contains("quorum port: refused"))
            .collect();
        assert!(refused.is_empty(), "broker {id} refused no peer: {refused:#?}");
    }
}

/// The transactional workload: a librdkafka consume-transform-produce application, crashing
/// mid-transaction now and then, under every kind of fault; every input comes out exactly once, the
/// read_committed reader sees every committed record and none other, and no transaction hangs.
#[test]
fn a_transactional_campaign_keeps_exactly_once_and_leaves_no_transaction_hanging() {
    require_namespaces();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let (run, report) = campaign(
        &out,
        &["--brokers", "3", "--faults", "12", "--seed", "20261208", "--duration", "40s", "--workload", "transactions"],
    );
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    assert!(report.contains("PASSED: no acknowledged record lost"), "{report}");
    let count = |label: &str| -> u64 {
        let line = report.lines().find(|l| l.starts_with(&format!("| {label} |"))).expect(label);
        line.split('|').nth(2).unwrap().trim().parse().unwrap()
    };
    // The application ran through the faults, and its crashes left transactions the coordinator aborted.
    let inputs = count("input records");
    assert!(inputs > 500, "{report}");
    assert_eq!(count("records committed"), inputs, "every input once\n{report}");
    assert_eq!(count("records the read_committed consumer read"), inputs, "{report}");
    assert!(count("crashes mid-transaction (on purpose)") > 0, "{report}");
    assert!(count("records aborted") > 0, "aborted records in the log, never read\n{report}");
    for finding in [
        "inputs without a committed output: 0",
        "inputs with more than one: 0",
        "records read under read_committed that are not committed: 0",
        "partitions whose LSO stayed below the high watermark: 0",
    ] {
        assert!(report.contains(finding), "{finding}\n{report}");
    }
}

/// The campaign's process id, as its report prints it in the namespaces' names.
fn run_pid(stdout: &str) -> String {
    stdout.lines().find_map(|l| l.strip_prefix("namespaces: shardlog-faults-")).map_or_else(
        || panic!("the campaign names its namespaces\n{stdout}"),
        |rest| rest.split('-').next().unwrap().to_string(),
    )
}

/// A leader that answers acks=all before its followers have the batch loses those writes when the
/// majority elects another leader: split off, it goes on answering until the quorum fences it.
#[test]
fn a_broker_that_acknowledges_acks_all_before_replicating_fails_the_campaign() {
    require_namespaces();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let (run, report) = campaign(
        &out,
        &[
            "--brokers",
            "3",
            // Six splits: a split catches acknowledged writes only when the broker split off leads
            // partitions then, which depends on where leadership went after the splits before it (four
            // were once not enough, on a loaded CI machine).
            "--faults",
            "6",
            "--seed",
            "7",
            "--kinds",
            "split",
            "--duration",
            "30s",
            "--set",
            "test.acks.all.before.replication=true",
        ],
    );
    assert_eq!(run.status.code(), Some(1), "the campaign fails\n{report}");
    assert!(report.contains("FAILED"), "{report}");
    let lost = row(&report, "idempotent, acks=all").1 + row(&report, "acks=all, retries").1;
    assert!(lost > 0, "acks=all records were lost and reported\n{report}");
}

/// The seed's scenario 5 through the campaign's machinery: brokers killed under a sync acks=all
/// producer, with retries=0 and with retries; nothing acknowledged is lost, and without retries the
/// producer gives records up on the broken connections, as the seed's did.
#[test]
fn tps_table_scenario_five_kills_brokers_and_loses_nothing_acknowledged() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("tps");
    let run = Command::new(env!("CARGO_BIN_EXE_shardlog-bench"))
        .args(["tps-table", "--scenario", "5", "--local", "--duration", "9s", "--out"])
        .arg(&out)
        .output()
        .expect("run shardlog-bench tps-table");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    let rows: Vec<Vec<&str>> =
        report.lines().filter(|l| l.starts_with("| -1 | 4 | 2 |")).map(|l| l.split(" | ").collect()).collect();
    assert_eq!(rows.len(), 3, "the seed's three rows\n{report}");
    // Columns: acks, replicas, min.insync, retries, method, seed TPS, seed disk, seed errors, TPS,
    // acknowledged, given up (stored), acknowledged and lost, stored twice, errors seen.
    for row in &rows {
        assert!(row.len() > 11, "every column of the row measured\n{report}");
        let acknowledged = row[9].parse::<u64>().unwrap_or_else(|e| panic!("{e}: {:?}\n{report}", row[9]));
        assert!(acknowledged > 0, "records were acknowledged\n{report}");
        assert_eq!(row[11], "0", "no acknowledged record lost\n{report}");
    }
    assert_eq!(rows[0][3], "0");
    let given_up: u64 = rows[0][10].split(' ').next().unwrap().parse().unwrap_or_else(|e| panic!("{e}\n{report}"));
    assert!(given_up > 0, "with retries=0 the killed leaders' records fail\n{report}");
    assert!(rows[0][13].contains("NETWORK_EXCEPTION"), "{report}");
    assert!(rows[2][4].contains("restart"), "{report}");
}

/// Without root the namespaces cannot be made: the campaign refuses at once, says why and what to do.
#[test]
fn without_root_the_campaign_refuses_and_says_why() {
    // A copy of the tool where an unprivileged user may run it.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let tool = dir.path().join("shardlog-bench");
    std::fs::copy(env!("CARGO_BIN_EXE_shardlog-bench"), &tool).unwrap();
    let run = Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups"])
        .arg(&tool)
        .args(["faults", "--faults", "1"])
        .arg("--out")
        .arg(dir.path().join("report"))
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("setpriv (util-linux) runs");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("need root") && stderr.contains("--no-netns"), "{stderr}");
    assert!(!dir.path().join("report").exists(), "nothing was made");
}
