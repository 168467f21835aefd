//! The fault campaign as a user runs it: `shardlog-bench faults` against real broker processes, killed,
//! torn and paused by its nemesis, must report every acknowledged record where it was acknowledged.

use std::process::Command;

#[test]
fn a_short_campaign_of_thirty_faults_loses_no_acknowledged_record() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("report");
    let run = Command::new(env!("CARGO_BIN_EXE_shardlog-bench"))
        .args(["faults", "--brokers", "3", "--faults", "30", "--seed", "20261201", "--duration", "60s"])
        .arg("--out")
        .arg(&out)
        .output()
        .expect("run shardlog-bench faults");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(run.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&run.stderr));
    let report = std::fs::read_to_string(out.join("report.md")).expect("report.md");
    assert!(report.contains("PASSED: no acknowledged record lost"), "{report}");
    for kind in ["| kill |", "| kill and tear the active segment |", "| pause |"] {
        assert!(report.contains(kind), "every kind this machine can do came: {kind}\n{report}");
    }
    // The workload ran through the faults: each acks=all producer had records acknowledged.
    let acknowledged = |label: &str| -> u64 {
        let line = report.lines().find(|l| l.starts_with(&format!("| {label} |"))).expect(label);
        line.split('|').nth(2).unwrap().trim().parse().unwrap()
    };
    assert!(acknowledged("idempotent, acks=all") > 100, "{report}");
    assert!(acknowledged("acks=all, retries") > 100, "{report}");
    assert!(stdout.contains("seed 20261201 (replay with --seed 20261201)"), "{stdout}");
}
