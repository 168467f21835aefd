//! A damaged partition log on the real binary: damage no crash can explain (before the tail of the last
//! segment, or in bytes that were durable) takes only that partition offline, with every file kept and
//! an ERROR naming the file and position; as its only replica it still serves what lies before the
//! damage, clients get KAFKA_STORAGE_ERROR for the rest and for produce, while the other partitions
//! serve; `shardlog repair` cuts the log before the damage, moving what it cuts aside, and the log
//! continues after the highest offset it ever held.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use bytes::Bytes;
use common::Broker;
use common::requests::{batch, create, fetch_all, produce_one};
use shardlog_storage::batch::BatchHeader;

const KAFKA_STORAGE_ERROR: i16 = 56;

/// (base offset, last offset) of each batch in a fetch answer.
fn batch_offsets(mut records: Bytes) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    while !records.is_empty() {
        let header = BatchHeader::parse(&records).unwrap();
        out.push((header.base_offset, header.base_offset + header.last_offset_delta as i64));
        let _ = records.split_to(header.total_bytes());
    }
    out
}

/// Two partitions of 16 KiB segments, 40 batches of ten 100-byte records each: several segments each.
fn fill(broker: &Broker) {
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "d", 2, 1, &[("segment.bytes", "16384")]), 0);
    for i in 0..40u8 {
        for p in 0..2 {
            let (error, base) = produce_one(&mut s, "d", p, &batch(i, 10, 1_700_000_000_000));
            assert_eq!((error, base), (0, i as i64 * 10));
        }
    }
}

/// A data dir [`fill`]ed by a broker that then stopped cleanly.
fn filled_and_stopped() -> tempfile::TempDir {
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in(data.path(), 2, &[]);
    fill(&broker);
    assert!(broker.terminate().success());
    data
}

fn segments(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out: Vec<(PathBuf, u64)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .map(|p| {
            let len = std::fs::metadata(&p).unwrap().len();
            (p, len)
        })
        .collect();
    out.sort();
    out
}

/// The offset the broker's damage line names.
fn damaged_offset(log: &str) -> u64 {
    let line = log.lines().find(|l| l.contains("ERROR") && l.contains("damaged log")).expect("an ERROR line");
    let after = line.split("(offset ").nth(1).expect("the offset is named");
    after.split(')').next().unwrap().parse().unwrap()
}

/// The error code of a fetch of `topic`-`partition` from `offset`.
fn fetch_at(s: &mut std::net::TcpStream, topic: &str, partition: i32, offset: i64) -> i16 {
    use common::requests::fetch_request;
    use common::{receive, send};
    use kafka_protocol::messages::{ApiKey, ResponseKind};
    send(s, ApiKey::Fetch, 11, 3, &fetch_request(topic, partition, offset, 0));
    let (_, body) = receive(s, ApiKey::Fetch, 11);
    let ResponseKind::Fetch(r) = body else { panic!("wrong response") };
    r.responses[0].partitions[0].error_code
}

fn repair(data: &Path, partition: &str, offset: u64) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["repair", "--partition", partition, "--truncate-at", &offset.to_string()])
        .arg("--data-dir")
        .arg(data)
        .output()
        .unwrap()
}

#[test]
fn a_segment_cut_short_takes_only_its_partition_offline_until_repair_moves_the_cut_aside() {
    let data = filled_and_stopped();
    let pdir = data.path().join("d-0");
    let before = segments(&pdir);
    assert!(before.len() >= 3, "several segments: {before:?}");
    // As after a crash before any checkpoint (no clean-shutdown marker, no recovery point): every
    // segment is validated. Then 7 bytes go missing from the end of the second segment.
    for entry in std::fs::read_dir(data.path()).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.starts_with(".shardlog-clean-shutdown") || name.starts_with("recovery-point-offset-checkpoint") {
            std::fs::remove_file(data.path().join(name)).unwrap();
        }
    }
    let (second, len) = before[1].clone();
    std::fs::OpenOptions::new().write(true).open(&second).unwrap().set_len(len - 7).unwrap();

    let broker = Broker::start_in(data.path(), 2, &[]);
    let log = broker.log();
    assert!(
        log.lines().any(|l| l.contains("ERROR") && l.contains(second.to_str().unwrap()) && l.contains("at byte")),
        "an ERROR names the file and position:\n{log}"
    );
    let cut_at = damaged_offset(&log);
    let mut s = broker.connect();
    assert_eq!(produce_one(&mut s, "d", 0, &batch(99, 1, 0)).0, KAFKA_STORAGE_ERROR);
    // What lies before the damage is still read; a read that needs the damaged batch is refused.
    let (error, records) = fetch_all(&mut s, "d", 0);
    assert_eq!(error, 0, "the intact records before the damage are served");
    let offsets = batch_offsets(records);
    assert_eq!((offsets.first().map(|b| b.0), offsets.last().map(|b| b.1 + 1)), (Some(0), Some(cut_at as i64)));
    assert_eq!(fetch_at(&mut s, "d", 0, cut_at as i64), KAFKA_STORAGE_ERROR);
    assert_eq!(fetch_at(&mut s, "d", 0, 399), KAFKA_STORAGE_ERROR, "nor anything after it");
    // The broker told the quorum: `topic describe` shows the replica offline, still leading (read-only:
    // nobody else holds its records).
    let describe = || {
        let out = Command::new(env!("CARGO_BIN_EXE_shardlog"))
            .args(["topic", "describe", "d", "--bootstrap", &format!("127.0.0.1:{}", broker.port)])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let mut shown = describe();
    while !shown.contains("Offline: 1") && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(200));
        shown = describe();
    }
    let line =
        |p: &str| shown.lines().find(|l| l.contains(&format!("Partition: {p}\t"))).unwrap_or_default().to_string();
    assert!(line("0").contains("Leader: 1") && line("0").contains("Offline: 1"), "{shown}");
    assert!(!line("1").contains("Offline"), "{shown}");
    assert_eq!(produce_one(&mut s, "d", 1, &batch(99, 1, 0)), (0, 400), "the other partition serves");
    assert_eq!(fetch_all(&mut s, "d", 1).0, 0);
    let mut expected = before.clone();
    expected[1].1 -= 7;
    assert_eq!(segments(&pdir), expected, "every file of the damaged partition is kept");
    // Not while the broker runs.
    let refused = repair(data.path(), "d-0", cut_at);
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("in use"), "{refused:?}");
    assert!(broker.terminate().success());

    let repaired = repair(data.path(), "d-0", cut_at);
    assert!(repaired.status.success(), "{repaired:?}");
    let said = String::from_utf8_lossy(&repaired.stdout);
    assert!(said.contains(&format!("log now ends at offset {cut_at}")), "{said}");
    // The partition held 400 records: the offsets of those cut are never given to new ones.
    assert!(said.contains("the log continues at offset 400"), "{said}");
    let aside = data.path().join("d-0.cut.1");
    for (path, len) in &before[2..] {
        let moved = aside.join(path.file_name().unwrap());
        assert_eq!(std::fs::metadata(&moved).unwrap().len(), *len, "{} moved aside whole", moved.display());
    }

    let broker = Broker::start_in(data.path(), 2, &[]);
    let mut s = broker.connect();
    let (error, records) = fetch_all(&mut s, "d", 0);
    assert_eq!(error, 0, "served again after the repair");
    let offsets = batch_offsets(records);
    assert_eq!(offsets.first().map(|b| b.0), Some(0));
    assert_eq!(offsets.last().map(|b| b.1 + 1), Some(cut_at as i64), "everything below the damage is there");
    assert!(offsets.windows(2).all(|w| w[0].1 + 1 == w[1].0), "contiguous");
    assert_eq!(
        produce_one(&mut s, "d", 0, &batch(7, 1, 0)),
        (0, 400),
        "the log goes on after the highest offset it ever held, not from the cut"
    );
    let (error, records) = fetch_all(&mut s, "d", 0);
    assert_eq!(error, 0);
    let offsets = batch_offsets(records);
    assert_eq!(offsets.last(), Some(&(400, 400)), "a consumer reads across the gap: {offsets:?}");
    assert!(broker.terminate().success());

    // And after a restart: the gap is known for what it is, not taken for a lost segment.
    let broker = Broker::start_in(data.path(), 2, &[]);
    let mut s = broker.connect();
    assert_eq!(produce_one(&mut s, "d", 0, &batch(8, 1, 0)), (0, 401));
    assert!(!broker.log().contains("damaged log"), "{}", broker.log());
    assert!(broker.terminate().success());
}

#[test]
fn a_flipped_byte_below_the_recovery_point_met_by_a_fetch_takes_the_partition_offline() {
    let data = filled_and_stopped();
    // After a clean stop every byte is trusted; one flips in the first batch of partition 0.
    let first = segments(&data.path().join("d-0"))[0].0.clone();
    let mut bytes = std::fs::read(&first).unwrap();
    bytes[200] ^= 0x10;
    std::fs::write(&first, &bytes).unwrap();

    let broker = Broker::start_in(data.path(), 2, &[]);
    let mut s = broker.connect();
    assert_eq!(fetch_all(&mut s, "d", 0).0, KAFKA_STORAGE_ERROR, "the damaged batch is not served");
    assert_eq!(produce_one(&mut s, "d", 0, &batch(99, 1, 0)).0, KAFKA_STORAGE_ERROR, "and the partition is offline");
    assert_eq!(fetch_all(&mut s, "d", 1).0, 0, "the other partition serves");
    assert_eq!(produce_one(&mut s, "d", 1, &batch(99, 1, 0)), (0, 400));
    let log = broker.log();
    assert!(
        log.lines().any(|l| l.contains("ERROR") && l.contains("CRC32C") && l.contains(first.to_str().unwrap())),
        "an ERROR names the damage:\n{log}"
    );
    assert!(broker.terminate().success());
    assert_eq!(std::fs::read(&first).unwrap(), bytes, "the file is kept as found");
}
