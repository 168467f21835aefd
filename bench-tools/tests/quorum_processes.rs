//! Three `shardlog quorum` processes on loopback. A client writes a stream of CreateTopic and AlterConfigs
//! commands while the Raft leader is killed with SIGKILL (and restarted), and later paused with SIGSTOP
//! and resumed. Afterwards every acknowledged command is on every voter, in the order it was acknowledged;
//! the voters hold the same commands in the same order (so an unacknowledged one is on all or none) and
//! identical states.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use shardlog_bench::cluster::shardlog_binary;
use shardlog_bench::voters::{VoterProcesses, everlasting_broker_registration};
use shardlog_broker::quorum::client::QuorumClient;
use shardlog_broker::quorum::state::Command;
use shardlog_broker::quorum::wire::{WireStatus, WireWriteResult};
use uuid::Uuid;

const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// `n` voters in a temporary directory (kept as long as they run).
struct Voters {
    processes: VoterProcesses,
    _dir: tempfile::TempDir,
}

impl std::ops::Deref for Voters {
    type Target = VoterProcesses;
    fn deref(&self) -> &VoterProcesses {
        &self.processes
    }
}

impl std::ops::DerefMut for Voters {
    fn deref_mut(&mut self) -> &mut VoterProcesses {
        &mut self.processes
    }
}

impl Voters {
    fn start(n: usize) -> Voters {
        let dir = tempfile::tempdir().unwrap();
        let extra = [
            // No snapshot during the test: every voter's log keeps every command, for the comparison.
            "--snapshot-after-entries",
            "1000000",
            // The writer registers a broker that never heartbeats: keep it live for the whole test.
            "--broker-session-timeout-ms",
            "3600000",
        ];
        let processes = VoterProcesses::start(shardlog_binary(None), dir.path().to_path_buf(), n, &extra).unwrap();
        Voters { processes, _dir: dir }
    }
}

/// The writer's view of one command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Acknowledged,
    /// Sent, but no answer said whether it was committed.
    Unknown,
}

/// Writes `commands` one after another through any voter that answers, until they run out or `stop`.
fn write_stream(
    addrs: Vec<String>,
    commands: Vec<Command>,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicUsize>,
) -> Vec<(Command, Fate)> {
    let mut fates = Vec::new();
    let mut via = 0usize;
    let mut client: Option<QuorumClient> = None;
    'commands: for command in commands {
        loop {
            if stop.load(Ordering::SeqCst) {
                break 'commands;
            }
            if client.is_none() {
                client = QuorumClient::connect(&addrs[via % addrs.len()], CALL_TIMEOUT).ok();
                if client.is_none() {
                    via += 1;
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
            }
            match client.as_mut().unwrap().write(command.clone()) {
                Ok(WireWriteResult::Applied { outcome, .. }) => {
                    assert!(outcome.is_ok(), "{command:?} was refused: {outcome:?}");
                    fates.push((command, Fate::Acknowledged));
                    acked.fetch_add(1, Ordering::SeqCst);
                    break;
                }
                // Nothing was proposed: the same command can be sent again.
                Ok(WireWriteResult::NoLeader) => std::thread::sleep(Duration::from_millis(50)),
                // Proposed or not, nobody can say: never sent again (that could apply it twice).
                Ok(WireWriteResult::Failed(_)) | Err(_) => {
                    fates.push((command, Fate::Unknown));
                    client = None;
                    via += 1;
                    break;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    fates
}

fn commands(n: usize) -> Vec<Command> {
    let register = everlasting_broker_registration();
    let mut out = vec![register];
    for i in 0..n {
        out.push(Command::CreateTopic {
            assignment: None,
            name: format!("t{i:04}"),
            id: Uuid::from_u128(i as u128 + 1),
            partitions: 1,
            replication_factor: 1,
            configs: BTreeMap::new(),
        });
        if i % 3 == 2 {
            // Settings of a topic whose creation may itself be unknown: AlterConfigs on a missing topic
            // is refused, so only topics created for sure are altered.
            out.push(Command::AlterConfigs {
                name: "t0000".into(),
                configs: BTreeMap::from([("retention.ms".to_string(), (1000 + i).to_string())]),
            });
        }
    }
    out
}

/// Waits (at most 60 s) for `done`; the bound only catches a quorum that never recovers.
fn wait_until(done: impl Fn() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "no {what} within 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What identifies a command the writer sent.
fn key(command: &Command) -> String {
    match command {
        Command::RegisterBroker { id, incarnation, .. } => format!("register {id} {incarnation}"),
        Command::CreateTopic { name, .. } => format!("create {name}"),
        Command::AlterConfigs { name, configs } => format!("alter {name} {configs:?}"),
        other => panic!("the writer does not send {other:?}"),
    }
}

fn wait_converged(voters: &Voters, at_least: u64) -> Vec<WireStatus> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let statuses: Vec<Option<WireStatus>> = (0..voters.addrs.len()).map(|i| voters.status(i)).collect();
        if statuses.iter().all(|s| s.as_ref().is_some_and(|s| s.applied.is_some_and(|a| a >= at_least))) {
            let statuses: Vec<WireStatus> = statuses.into_iter().map(Option::unwrap).collect();
            if statuses.iter().all(|s| s.applied == statuses[0].applied) {
                return statuses;
            }
        }
        assert!(Instant::now() < deadline, "voters did not converge on {at_least}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn dir_has_raft_files(dir: &Path) -> bool {
    ["raft-log", "raft-vote"].iter().all(|f| dir.join(f).is_file())
}

#[test]
fn acknowledged_commands_survive_a_killed_and_a_paused_leader_in_order_on_every_voter() {
    let mut voters = Voters::start(3);
    voters.leader().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let acked = Arc::new(AtomicUsize::new(0));
    let writer = {
        let (addrs, stop, acked) = (voters.addrs.clone(), stop.clone(), acked.clone());
        std::thread::spawn(move || write_stream(addrs, commands(5000), stop, acked))
    };
    let acked_now = || acked.load(Ordering::SeqCst);

    std::thread::sleep(Duration::from_millis(1500));
    let killed = voters.leader().unwrap();
    voters.kill(killed).unwrap();
    let at_kill = acked_now();
    // While the killed voter is down, the two others elect a leader and go on (however long that takes).
    wait_until(|| acked_now() > at_kill + 20, "commits while the killed voter was down");
    voters.restart(killed).unwrap();
    std::thread::sleep(Duration::from_millis(1500));

    let paused = voters.leader().unwrap();
    voters.signal(paused, libc::SIGSTOP).unwrap();
    let at_pause = acked_now();
    wait_until(|| acked_now() > at_pause + 20, "commits while the leader was paused");
    std::thread::sleep(Duration::from_millis(1000));
    voters.signal(paused, libc::SIGCONT).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    stop.store(true, Ordering::SeqCst);
    let fates = writer.join().unwrap();

    let acknowledged: Vec<&Command> = fates.iter().filter(|(_, f)| *f == Fate::Acknowledged).map(|(c, _)| c).collect();
    let unknown = fates.len() - acknowledged.len();
    assert!(acknowledged.len() > 100, "the writer got through: {} acknowledged", acknowledged.len());
    let statuses = wait_converged(&voters, 1);
    let log = &statuses[0].commands;
    for (i, s) in statuses.iter().enumerate() {
        assert_eq!(&s.commands, log, "voter {} holds other commands or another order\n{}", i + 1, voters.log(i));
        assert_eq!(s.state, statuses[0].state, "voter {} applied them to another state", i + 1);
        assert!(dir_has_raft_files(&voters.dir_of(i)));
    }
    // Every acknowledged command, exactly once, in acknowledgement order. (Commands are compared by what
    // the writer chose: the proposing voter stamps registrations with its own clock.)
    let logged: Vec<String> = log.iter().map(|(_, c)| key(c)).collect();
    let mut last_position = None;
    for command in &acknowledged {
        let k = key(command);
        let positions: Vec<usize> = logged.iter().enumerate().filter(|(_, c)| **c == k).map(|(p, _)| p).collect();
        assert_eq!(positions.len(), 1, "{k} appears {} times", positions.len());
        assert!(last_position < Some(positions[0]), "{k} is out of acknowledgement order");
        last_position = Some(positions[0]);
    }
    // Unacknowledged ones: at most once (and, as the logs are equal, on all voters or none).
    for (command, _) in fates.iter().filter(|(_, f)| *f == Fate::Unknown) {
        let k = key(command);
        assert!(logged.iter().filter(|c| **c == k).count() <= 1, "{k} applied twice");
    }
    // Nothing that was never sent got in.
    assert!(logged.iter().all(|l| fates.iter().any(|(f, _)| key(f) == *l)));
    eprintln!(
        "acknowledged {}, unknown {unknown}, killed voter {}, paused voter {}",
        acknowledged.len(),
        killed + 1,
        paused + 1
    );
}

#[test]
fn bad_frames_on_the_quorum_port_close_only_their_connection() {
    use shardlog_net::peer::{HEADER_BYTES, encode_frame};
    use std::io::{Read, Write};
    let voters = Voters::start(1);
    voters.leader().unwrap();
    let good = encode_frame(16, b"not an archive of a write");
    let mut bad_crc = encode_frame(18, &[]);
    bad_crc[HEADER_BYTES - 1] ^= 1;
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let random: Vec<u8> = (0..256)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect();
    for (what, bytes) in [("a bad CRC", bad_crc), ("a malformed archive", good), ("random bytes", random)] {
        let mut s = std::net::TcpStream::connect(&voters.addrs[0]).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(&bytes).unwrap();
        let mut buf = [0u8; 64];
        match s.read(&mut buf) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            other => panic!("{what}: the connection should be closed, read gave {other:?}"),
        }
        let status = voters.status(0).unwrap_or_else(|| panic!("the voter stopped answering after {what}"));
        assert_eq!(status.node, 1);
    }
    let log = voters.log(0);
    assert_eq!(log.matches("quorum port: closing connection").count(), 3, "one line per bad connection:\n{log}");
    assert!(log.contains("CRC32C mismatch") && log.contains("malformed message body"), "{log}");
}
