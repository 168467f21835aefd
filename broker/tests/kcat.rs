//! kcat (librdkafka) against the real binary: produce with acks=all, consume from the beginning, every
//! record back in per-partition order. `.ci/run` installs kcat; the test fails if it is missing.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};

use common::Broker;

fn kcat(args: &[&str], input: Option<&str>) -> String {
    let mut child = Command::new("kcat")
        .args(args)
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kcat is installed (.ci/run installs it)");
    if let Some(input) = input {
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "kcat {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn kcat_round_trip_with_acks_all() {
    // More shards than the machine's two cores: the same client checks must hold.
    let broker = Broker::start(4);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    let input: String = (0..1000).map(|i| format!("key-{}:value-{i}\n", i % 17)).collect();
    kcat(&["-b", &bootstrap, "-t", "kcat-topic", "-P", "-K", ":", "-X", "acks=all", "-z", "snappy"], Some(&input));

    let metadata = kcat(&["-b", &bootstrap, "-L", "-t", "kcat-topic"], None);
    assert!(metadata.contains("3 partitions"), "auto-created with num.partitions=3: {metadata}");

    let out = kcat(&["-b", &bootstrap, "-t", "kcat-topic", "-C", "-o", "beginning", "-e", "-f", "%p %o %k %s\n"], None);
    let mut by_partition: BTreeMap<u32, Vec<(u64, String, String)>> = BTreeMap::new();
    for line in out.lines() {
        let parts: Vec<&str> = line.split(' ').collect();
        assert_eq!(parts.len(), 4, "unexpected line {line:?}");
        by_partition.entry(parts[0].parse().unwrap()).or_default().push((
            parts[1].parse().unwrap(),
            parts[2].to_string(),
            parts[3].to_string(),
        ));
    }
    let total: usize = by_partition.values().map(Vec::len).sum();
    assert_eq!(total, 1000, "every record consumed once");
    for (partition, records) in &by_partition {
        let offsets: Vec<u64> = records.iter().map(|r| r.0).collect();
        assert_eq!(
            offsets,
            (0..records.len() as u64).collect::<Vec<_>>(),
            "partition {partition}: offsets 0..n in order"
        );
        // Records of one key keep their produce order (they all go to one partition).
        let mut last_seen: BTreeMap<&str, usize> = BTreeMap::new();
        for (_, key, value) in records {
            let n: usize = value.trim_start_matches("value-").parse().unwrap();
            if let Some(prev) = last_seen.insert(key, n) {
                assert!(n > prev, "{key}: value-{n} after value-{prev}");
            }
        }
    }
}
