//! What a broker logs when nothing is wrong: a clean start, a restart and a clean stop print no WARN or
//! ERROR line (those are for what an operator must act on), no colour codes into a file, and openraft's
//! chatter stays out even at `RUST_LOG=debug`. What happens to many partitions at once (the offsets topic
//! created, a broker shut down) is one line with counts, not one per partition; a voter that is away is
//! reported once, not at every snapshot openraft fails to send it; a host without room to lock I/O
//! memory is told so once, as `shardlog check` tells it.

mod common;

use std::time::{Duration, Instant};

use common::Broker;
use common::requests::{batch, create, find_coordinator, produce_one};
use common::voters::Voters;

/// A data dir on the disk the build is on (not /tmp, which may be a tmpfs, and would be warned about).
fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// The WARN and ERROR lines of a log.
fn alarms(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains(" WARN ") || l.contains(" ERROR ")).collect()
}

#[test]
fn a_clean_start_restart_and_stop_log_no_warning_and_no_colour() {
    let data = disk_dir();
    let broker = Broker::start_in_env(data.path(), 2, &[], None);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "quiet", 4, 1, &[]), 0);
    for p in 0..4 {
        assert_eq!(produce_one(&mut s, "quiet", p, &batch(1, 3, 0)).0, 0);
    }
    drop(s);
    let (status, first) = broker.terminate_with_log();
    assert!(status.success());
    let broker = Broker::start_in_env(data.path(), 2, &[], None);
    let mut s = broker.connect();
    assert_eq!(produce_one(&mut s, "quiet", 0, &batch(2, 3, 0)), (0, 3), "the restarted broker serves");
    drop(s);
    let (status, second) = broker.terminate_with_log();
    assert!(status.success());
    for log in [&first, &second] {
        assert!(log.contains("accepting connections") && log.contains("stopped"), "{log}");
        assert_eq!(alarms(log), Vec::<&str>::new(), "{log}");
        assert!(!log.contains('\u{1b}'), "colour codes in a log file:\n{log}");
    }
}

#[test]
fn openraft_stays_quiet_at_rust_log_debug_unless_named() {
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in_env(data.path(), 1, &[], Some("debug"));
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "chatty", 1, 1, &[]), 0);
    drop(s);
    std::thread::sleep(std::time::Duration::from_secs(1));
    let (status, log) = broker.terminate_with_log();
    assert!(status.success());
    assert!(log.contains(" DEBUG "), "debug logging is on: {log}");
    let raft: Vec<&str> = log.lines().filter(|l| l.contains(" openraft")).collect();
    assert_eq!(raft, Vec::<&str>::new());

    let broker = Broker::start_in_env(data.path(), 1, &[], Some("info,openraft=debug"));
    std::thread::sleep(std::time::Duration::from_millis(500));
    let (_, log) = broker.terminate_with_log();
    assert!(log.lines().any(|l| l.contains(" openraft")), "named, openraft logs: {log}");
}

/// A tmpfs for the test: `/dev/shm` when it is one, else one mounted here (root) and unmounted at the end.
struct MemoryDir {
    dir: tempfile::TempDir,
    mounted: bool,
}

impl MemoryDir {
    fn new() -> MemoryDir {
        let shm_is_tmpfs = std::fs::read_to_string("/proc/mounts")
            .unwrap_or_default()
            .lines()
            .any(|l| l.split_whitespace().nth(1) == Some("/dev/shm") && l.split_whitespace().nth(2) == Some("tmpfs"));
        if shm_is_tmpfs {
            return MemoryDir { dir: tempfile::tempdir_in("/dev/shm").unwrap(), mounted: false };
        }
        let dir = tempfile::tempdir().unwrap();
        let status = std::process::Command::new("mount").args(["-t", "tmpfs", "tmpfs"]).arg(dir.path()).status();
        assert!(status.is_ok_and(|s| s.success()), "no /dev/shm tmpfs and cannot mount one");
        MemoryDir { dir, mounted: true }
    }
}

impl Drop for MemoryDir {
    fn drop(&mut self) {
        if self.mounted {
            let _ = std::process::Command::new("umount").arg(self.dir.path()).status();
        }
    }
}

#[test]
fn a_data_dir_in_memory_is_warned_about_naming_the_filesystem() {
    let memory = MemoryDir::new();
    let broker = Broker::start_in_env(memory.dir.path(), 1, &[], None);
    let (status, log) = broker.terminate_with_log();
    assert!(status.success());
    let warned: Vec<&str> = alarms(&log);
    assert_eq!(warned.len(), 1, "{log}");
    assert!(warned[0].contains("filesystem=\"tmpfs\"") && warned[0].contains("lost when the host restarts"), "{log}");

    let disk = disk_dir();
    let (_, log) = Broker::start_in_env(disk.path(), 1, &[], None).terminate_with_log();
    assert_eq!(alarms(&log), Vec::<&str>::new(), "a disk is not warned about");
}

/// Lines of `log` that contain `text`.
fn lines_with<'a>(log: &'a str, text: &str) -> Vec<&'a str> {
    log.lines().filter(|l| l.contains(text)).collect()
}

#[test]
fn the_offsets_topic_created_and_a_restart_are_one_line_each_with_counts() {
    let data = disk_dir();
    let broker = Broker::start_in_env(data.path(), 2, &[], None);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "greetings", 12, 1, &[]), 0);
    assert_eq!(find_coordinator(&mut s, "counted"), 0, "the offsets topic is created");
    drop(s);
    let (status, first) = broker.terminate_with_log();
    assert!(status.success());
    // The offsets topic's 50 partitions: hosted and led here, one line each, none per partition.
    let per_partition = lines_with(&first, "__consumer_offsets-");
    assert_eq!(per_partition, Vec::<&str>::new(), "{first}");
    let hosting = lines_with(&first, "hosting partitions");
    assert!(hosting.iter().any(|l| l.contains("partitions=50") && l.contains("__consumer_offsets:0-49")), "{first}");
    assert!(lines_with(&first, "leading partitions").iter().any(|l| l.contains("partitions=50")), "{first}");
    // The shutdown leaves all 62 without a leader: one line.
    let offline = lines_with(&first, "offline while their broker is shut down");
    assert_eq!(offline.len(), 1, "{first}");
    assert!(offline[0].contains("partitions=62") && offline[0].contains("greetings:0-11"), "{first}");

    let broker = Broker::start_in_env(data.path(), 2, &[], None);
    let (status, second) = broker.terminate_with_log();
    assert!(status.success());
    // The restart replays the last shutdown from the quorum log, and stops again: a line each at most.
    assert!(lines_with(&second, "offline while their broker is shut down").len() <= 2, "{second}");
    for log in [&first, &second] {
        assert!(lines_with(log, "partition offline").is_empty(), "a line per partition: {log}");
    }
}

#[test]
fn a_voter_away_is_reported_once_and_summed_up_when_it_is_back() {
    // A snapshot every 10 entries, so the leader soon has none of the log the absent voter lacks and
    // tries to send it snapshots instead (which openraft reports, each attempt, twice).
    let mut voters = Voters::start(3, &["--snapshot-after-entries", "10", "--broker-session-timeout-ms", "3600000"]);
    let leader = voters.leader();
    let away = if leader == 3 { 2 } else { 3 };
    voters.kill(away);
    // Commands that commit (refused: no such broker) and fill the log past what is kept after a snapshot.
    let mut client = shardlog_broker::quorum::client::QuorumClient::connect(
        &voters.addrs[leader as usize - 1],
        Duration::from_secs(5),
    )
    .unwrap();
    for i in 0..300 {
        let heartbeat = shardlog_broker::quorum::state::Command::BrokerHeartbeat {
            id: shardlog_broker::quorum::state::NodeId(99),
            incarnation: i,
            now_ms: 0,
        };
        client.write(heartbeat).unwrap();
    }
    // Away for longer than the quorum waits before it reports a voter unreachable.
    let reported = "a voter has been unreachable";
    let deadline = Instant::now() + Duration::from_secs(60);
    while !voters.log(leader).contains(reported) {
        assert!(Instant::now() < deadline, "the absence was never reported:\n{}", voters.log(leader));
        std::thread::sleep(Duration::from_millis(200));
    }
    voters.restart(away);
    let back = "the voter answers again after an outage";
    let deadline = Instant::now() + Duration::from_secs(60);
    while !voters.log(leader).contains(back) {
        assert!(Instant::now() < deadline, "the return was never reported:\n{}", voters.log(leader));
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = voters.log(leader);
    assert!(lines_with(&log, "InstallSnapshot").is_empty() && lines_with(&log, "send snapshot").is_empty(), "{log}");
    let away_lines = lines_with(&log, reported);
    assert_eq!(away_lines.len(), 1, "{log}");
    assert!(away_lines[0].contains(&format!("voter={away}")), "{log}");
    assert_eq!(alarms(&log), away_lines, "the one line for the outage is its only warning");
    let summary = lines_with(&log, back);
    assert_eq!(summary.len(), 1, "{log}");
    assert!(summary[0].contains(" INFO ") && summary[0].contains("seconds=") && summary[0].contains("failed_calls="));
}

/// CAP_IPC_LOCK, which lifts the locked-memory limit for its holder.
const CAP_IPC_LOCK: libc::c_ulong = 14;

#[test]
fn without_room_to_lock_io_memory_the_start_says_so_once_as_check_does() {
    let data = disk_dir();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut broker = Broker::spawn_with(data.path(), port, 2, &[], None, |command| {
        use std::os::unix::process::CommandExt;
        // SAFETY: setrlimit(2) and prctl(2) are async-signal-safe; the closure touches no shared memory.
        unsafe {
            command.pre_exec(|| {
                // 8 MiB: above glommio's floor, below what one shard registers (30 MiB).
                let limit = libc::rlimit { rlim_cur: 8 << 20, rlim_max: 8 << 20 };
                if libc::setrlimit(libc::RLIMIT_MEMLOCK, &limit) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // Root holds CAP_IPC_LOCK, which lifts the limit: out of the bounding set, the program
                // about to run does not get it. (A runner without the capability cannot drop it, and
                // has no need to.)
                libc::prctl(libc::PR_CAPBSET_DROP, CAP_IPC_LOCK, 0, 0, 0);
                Ok(())
            });
        }
    });
    broker.wait_until_it_answers();
    let (status, log) = broker.terminate_with_log();
    assert!(status.success(), "{log}");
    assert!(!log.contains("registering buffers") && !log.contains("SkippingOs"), "glommio's report: {log}");
    let told = lines_with(&log, "io_uring buffers not registered");
    assert_eq!(told.len(), 1, "{log}");
    assert!(told[0].contains("8192 KiB") && told[0].contains("LimitMEMLOCK=infinity"), "{log}");
    assert_eq!(alarms(&log), told, "the one warning of the start");
}
