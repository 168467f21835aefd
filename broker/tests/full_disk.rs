//! A full disk, for real: the broker's data dir on a small ext4 filesystem this test makes (a loop
//! mount, removed at the end however the test ends). Filling it gets produce refused with the retriable
//! KAFKA_STORAGE_ERROR below `log.dir.min.free.bytes`, and CreateTopics refused below the quorum's
//! reserve, with the broker alive; deleting a topic brings produce back; nothing acknowledged is lost.
//! The segments' reservations ahead of their writes keep to the floor too, and a checkpoint that fails
//! on a full disk is told once, not every second.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::Broker;
use common::requests::{batch, create, fetch_all, produce_one};
use kafka_protocol::messages::{ApiKey, DeleteTopicsRequest, ResponseKind};
use rdkafka::config::ClientConfig;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};

const KAFKA_STORAGE_ERROR: i16 = 56;
const MIB: u64 = 1 << 20;

/// An ext4 filesystem in a file, mounted; unmounted and removed when dropped.
struct LoopMount {
    dir: tempfile::TempDir,
    mounted: bool,
}

impl LoopMount {
    fn new(bytes: u64) -> LoopMount {
        Self::with_mkfs_args(bytes, &[])
    }

    /// With `mkfs.ext4` given `args` as well (`-m 0`: no blocks kept for root, so that a file filling
    /// the disk leaves the broker, which runs as root here, no room either).
    fn with_mkfs_args(bytes: u64, args: &[&str]) -> LoopMount {
        let dir = tempfile::tempdir().unwrap();
        let image = dir.path().join("disk.img");
        std::fs::File::create(&image).unwrap().set_len(bytes).unwrap();
        let mkfs =
            Command::new("mkfs.ext4").args(["-q", "-F"]).args(args).arg(&image).output().expect("mkfs.ext4 runs");
        assert!(mkfs.status.success(), "mkfs.ext4: {mkfs:?}");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).unwrap();
        let mount = Command::new("mount").args(["-o", "loop"]).arg(&image).arg(&mnt).output().expect("mount runs");
        assert!(mount.status.success(), "a loop mount needs root and a loop device: {mount:?}");
        LoopMount { dir, mounted: true }
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("mnt")
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").arg(self.path()).status();
        }
    }
}

fn free(path: &Path) -> u64 {
    shardlog_broker::disk_space::free_bytes(path).unwrap()
}

fn delete_topic(s: &mut std::net::TcpStream, topic: &str) -> i16 {
    let request =
        DeleteTopicsRequest::default().with_topic_names(vec![common::requests::name(topic)]).with_timeout_ms(10_000);
    common::send(s, ApiKey::DeleteTopics, 4, 3, &request);
    let (_, body) = common::receive(s, ApiKey::DeleteTopics, 4);
    let ResponseKind::DeleteTopics(r) = body else { panic!("a DeleteTopics answer") };
    r.responses[0].error_code
}

#[test]
fn a_full_disk_refuses_produce_and_topic_creation_until_space_is_freed_and_loses_nothing() {
    // The floor leaves room for a segment's next preallocation step (32 MiB) above the quorum's reserve
    // (32 MiB, half the floor at most).
    let disk = LoopMount::new(192 * MIB);
    let data = disk.path().join("data");
    let floor = 72 * MIB;
    let broker = Broker::start_in(&data, 2, &["--set", &format!("log.dir.min.free.bytes={floor}")]);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "keep", 1, 1, &[]), 0);
    assert_eq!(create(&mut s, "fill", 1, 1, &[]), 0);
    let mut kept = 0;
    for i in 0..20u8 {
        assert_eq!(produce_one(&mut s, "keep", 0, &batch(i, 10, 0)), (0, kept));
        kept += 10;
    }

    // Half-megabyte batches until the broker refuses them.
    let mut refused = false;
    for i in 0..400u32 {
        let (error, _) = produce_one(&mut s, "fill", 0, &batch(i as u8, 5000, 0));
        if error == KAFKA_STORAGE_ERROR {
            refused = true;
            break;
        }
        assert_eq!(error, 0, "produce {i} either succeeds or is refused as retriable");
    }
    assert!(refused, "produce is refused before the disk is full");
    assert!(free(&disk.path()) > 32 * MIB, "refused above the quorum's reserve: {} bytes free", free(&disk.path()));
    assert_eq!(produce_one(&mut s, "keep", 0, &batch(1, 1, 0)).0, KAFKA_STORAGE_ERROR, "every topic");
    assert_eq!(fetch_all(&mut s, "keep", 0).0, 0, "fetches go on");

    // Something else fills the disk further, past the quorum's reserve: topic creation is refused too.
    let filler = disk.path().join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; MIB as usize];
        while free(&disk.path()) > 4 * MIB {
            if f.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = f.sync_all();
    }
    assert_eq!(create(&mut s, "more", 1, 1, &[]), KAFKA_STORAGE_ERROR, "refused before the quorum log fills");
    std::fs::remove_file(&filler).unwrap();

    // Freeing space (deleting the big topic) brings produce back, without a restart.
    assert_eq!(delete_topic(&mut s, "fill"), 0);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match produce_one(&mut s, "keep", 0, &batch(99, 10, 0)) {
            (0, base) => {
                assert_eq!(base, kept);
                kept += 10;
                break;
            }
            (KAFKA_STORAGE_ERROR, _) => {}
            other => panic!("unexpected {other:?}"),
        }
        assert!(Instant::now() < deadline, "produce resumes once space is freed");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(create(&mut s, "more", 1, 1, &[]), 0);

    // Every acknowledged record is there, and the broker stops cleanly.
    let (error, records) = fetch_all(&mut s, "keep", 0);
    assert_eq!(error, 0);
    let mut end = 0;
    let mut bytes = records;
    while !bytes.is_empty() {
        let header = shardlog_storage::batch::BatchHeader::parse(&bytes).unwrap();
        assert_eq!(header.base_offset, end, "contiguous");
        end = header.base_offset + header.last_offset_delta as i64 + 1;
        let _ = bytes.split_to(header.total_bytes());
    }
    assert_eq!(end, kept, "every acknowledged record");
    let log = broker.log();
    assert!(log.contains("below log.dir.min.free.bytes"), "the operator is told:\n{log}");
    assert!(!log.contains("fatal"), "{log}");
    assert!(broker.terminate().success());
}

#[test]
fn without_a_floor_a_full_disk_is_met_by_the_segment_preallocation_and_refused_not_fatal() {
    let disk = LoopMount::new(96 * MIB);
    let data = disk.path().join("data");
    // No floor: the disk fills up to where the active segment's next 32 MiB step cannot be allocated.
    let broker = Broker::start_in(&data, 1, &["--set", "log.dir.min.free.bytes=0"]);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "fill", 1, 1, &[]), 0);
    let mut acknowledged = 0;
    let mut refused = false;
    for i in 0..400u32 {
        match produce_one(&mut s, "fill", 0, &batch(i as u8, 5000, 0)) {
            (0, base) => {
                assert_eq!(base, acknowledged);
                acknowledged += 5000;
            }
            (KAFKA_STORAGE_ERROR, _) => {
                refused = true;
                break;
            }
            other => panic!("produce {i}: {other:?}"),
        }
    }
    assert!(refused, "a full disk is a refusal");
    assert!(acknowledged > 0);
    assert_eq!(fetch_all(&mut s, "fill", 0).0, 0, "the broker still serves what it holds");
    let log = broker.log();
    assert!(!log.contains("fatal"), "{log}");
    // Every acknowledged record survives a restart.
    assert!(broker.terminate().success());
    let broker = Broker::start_in(&data, 1, &["--set", "log.dir.min.free.bytes=0"]);
    let mut s = broker.connect();
    // Read in fetches of at most 10 MiB each, every batch contiguous with the one before.
    let mut end = 0;
    loop {
        common::send(&mut s, ApiKey::Fetch, 11, 9, &common::requests::fetch_request("fill", 0, end, 0));
        let (_, body) = common::receive(&mut s, ApiKey::Fetch, 11);
        let ResponseKind::Fetch(r) = body else { panic!("a Fetch answer") };
        let p = &r.responses[0].partitions[0];
        assert_eq!(p.error_code, 0);
        let mut bytes = p.records.clone().unwrap_or_default();
        if bytes.is_empty() {
            break;
        }
        while !bytes.is_empty() {
            let header = shardlog_storage::batch::BatchHeader::parse(&bytes).unwrap();
            assert_eq!(header.base_offset, end, "contiguous");
            end = header.base_offset + header.last_offset_delta as i64 + 1;
            let _ = bytes.split_to(header.total_bytes());
        }
    }
    assert!(end >= acknowledged, "every acknowledged record is there ({end} of {acknowledged})");
    assert!(broker.terminate().success());
}

#[test]
fn an_async_producer_on_three_partitions_leaves_the_floor_free() {
    // The case: a 32 MiB floor, 3 partitions reserving up to 32 MiB ahead each, and a producer
    // with many requests in flight, faster than the broker measures the free space.
    let disk = LoopMount::new(256 * MIB);
    let data = disk.path().join("data");
    let floor = 32 * MIB;
    let broker = Broker::start_in(&data, 2, &["--set", &format!("log.dir.min.free.bytes={floor}")]);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "fill", 3, 1, &[]), 0);
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", format!("127.0.0.1:{}", broker.port))
        .set("acks", "1")
        .set("linger.ms", "5")
        // Refused records (KAFKA_STORAGE_ERROR is retriable) are given up after this.
        .set("message.timeout.ms", "15000")
        .create()
        .expect("producer");
    // More than the disk holds: 256 MiB of 64 KiB records.
    let value = vec![7u8; 64 << 10];
    for i in 0..4096 {
        let mut record: BaseRecord<(), [u8]> = BaseRecord::to("fill").partition(i % 3).payload(&value[..]);
        while let Err((_, back)) = producer.send(record) {
            record = back;
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    let _ = producer.flush(Duration::from_secs(120));
    let left = free(&disk.path());
    // The room below the floor is for the small files written without reservations (index entries,
    // checkpoints, the quorum's log): a few hundred KiB here.
    assert!(left + 4 * MIB >= floor, "reservations took the floor: {left} bytes free of the {floor} to keep");
    assert!(left < floor + 16 * MIB, "the disk was filled up to the floor: {left} bytes free");
    let log = broker.log();
    assert!(!log.contains("fatal"), "{log}");
    assert!(broker.terminate().success());
}

#[test]
fn a_checkpoint_failing_on_a_full_disk_is_told_once_and_when_it_succeeds_again() {
    let disk = LoopMount::with_mkfs_args(64 * MIB, &["-m", "0"]);
    let data = disk.path().join("data");
    // No floor: the disk fills under the checkpoints, and appends still land in reserved blocks.
    let broker = Broker::start_in(&data, 1, &["--set", "log.dir.min.free.bytes=0"]);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "t", 1, 1, &[]), 0);
    assert_eq!(produce_one(&mut s, "t", 0, &batch(1, 10, 0)), (0, 0));

    // Something else fills the disk to the last block.
    let filler = disk.path().join("filler");
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&filler).unwrap();
        let chunk = vec![0u8; 64 << 10];
        // Down to the filesystem's block size (1 KiB on one this small).
        for len in [64 << 10, 4 << 10, 1 << 10] {
            while f.write_all(&chunk[..len]).is_ok() {}
        }
        let _ = f.sync_all();
    }
    // An append into the segment's reserved blocks moves the offsets the checkpoints hold: writing
    // them fails, second after second.
    assert_eq!(produce_one(&mut s, "t", 0, &batch(2, 10, 0)), (0, 10));
    std::thread::sleep(Duration::from_millis(3500));
    let told = broker.log().matches("checkpoint failed").count();
    assert_eq!(told, 1, "once for the episode, not once a second:\n{}", broker.log());

    std::fs::remove_file(&filler).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !broker.log().contains("checkpoints written again") {
        assert!(Instant::now() < deadline, "the end of the episode is told:\n{}", broker.log());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(broker.log().matches("checkpoint failed").count(), 1);
    let log = broker.log();
    assert!(!log.contains("fatal"), "{log}");
    assert!(broker.terminate().success());
}
