//! A broker whose quorum runs elsewhere: a standalone `shardlog quorum` voter, and a broker started with
//! `--quorum-voters` naming it. The broker registers, its topics live in the voter's state, SIGTERM makes
//! it ask for a controlled shutdown (fenced at once, its partitions leaderless, long before its session
//! would expire), and restarted it leads them again at a new leader epoch, with its data.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shardlog_broker::quorum::client::QuorumClient;
use shardlog_broker::quorum::state::{ClusterState, NodeId};

use common::Broker;
use common::requests::{batch, create, fetch_all, produce_one, stored};

struct StandaloneVoter {
    child: Child,
    addr: String,
}

impl StandaloneVoter {
    /// One voter that is the whole quorum; brokers' sessions last ten minutes, so within this test only
    /// a controlled shutdown can fence a broker.
    fn start(dir: &std::path::Path) -> StandaloneVoter {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addr = format!("127.0.0.1:{port}");
        let child = Command::new(env!("CARGO_BIN_EXE_shardlog"))
            .args(["quorum", "--node-id", "1", "--listen", &addr, "--broker-session-timeout-ms", "600000"])
            .arg("--data-dir")
            .arg(dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let voter = StandaloneVoter { child, addr };
        let deadline = Instant::now() + Duration::from_secs(30);
        while voter.status().is_none_or(|(leader, _)| leader != Some(1)) {
            assert!(Instant::now() < deadline, "the voter did not lead within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        voter
    }

    /// (leader, state) as the voter holds them.
    fn status(&self) -> Option<(Option<u64>, ClusterState)> {
        let status = QuorumClient::connect(&self.addr, Duration::from_secs(5)).ok()?.status().ok()?;
        Some((status.leader, status.state))
    }

    fn state(&self) -> ClusterState {
        self.status().expect("the voter answers").1
    }
}

impl Drop for StandaloneVoter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A standalone voter and the data dir and arguments of a broker (node 2) that uses it.
struct RemoteQuorum {
    _dir: tempfile::TempDir,
    voter: StandaloneVoter,
    data: std::path::PathBuf,
    voters: String,
}

impl RemoteQuorum {
    fn new() -> RemoteQuorum {
        let dir = tempfile::tempdir().unwrap();
        let voter = StandaloneVoter::start(&dir.path().join("voter"));
        let voters = format!("1@{}", voter.addr);
        RemoteQuorum { data: dir.path().join("broker"), _dir: dir, voter, voters }
    }

    fn start_broker(&self) -> Broker {
        Broker::start_in(&self.data, 2, &["--node-id", "2", "--quorum-voters", &self.voters])
    }
}

fn produce(s: &mut std::net::TcpStream, partition: i32, b: &[u8]) -> (i16, i64) {
    produce_one(s, "remote", partition, b)
}

fn fetch(s: &mut std::net::TcpStream, partition: i32) -> (i16, bytes::Bytes) {
    fetch_all(s, "remote", partition)
}

#[test]
fn a_broker_with_a_remote_quorum_registers_shuts_down_under_control_and_comes_back_leading_its_partitions() {
    let quorum = RemoteQuorum::new();
    let voter = &quorum.voter;
    let broker = quorum.start_broker();
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "remote", 2, 1, &[]), 0);
    let mut expected = Vec::new();
    for p in 0..2 {
        let b = batch(p as u8, 3, 0);
        let (err, base) = produce(&mut s, p, &b);
        assert_eq!(err, 0);
        expected.push(stored(&b, base));
    }
    let state = voter.state();
    assert!(!state.brokers[&NodeId(2)].fenced, "registered and live");
    let before: Vec<_> = state.topics["remote"].partitions.clone();
    assert!(before.iter().all(|p| p.leader == Some(NodeId(2))), "the topic is in the voter's state: {before:?}");

    assert!(broker.terminate().success());
    let state = voter.state();
    assert!(state.brokers[&NodeId(2)].fenced, "fenced by its controlled shutdown, not by a session timeout");
    assert!(state.topics["remote"].partitions.iter().all(|p| p.leader.is_none()), "no other replica to lead");

    let broker = quorum.start_broker();
    let mut s = broker.connect();
    for p in 0..2 {
        let (err, records) = fetch(&mut s, p);
        assert_eq!(err, 0);
        assert_eq!(records.as_ref(), expected[p as usize].as_slice(), "partition {p} kept its records");
    }
    let state = voter.state();
    assert!(!state.brokers[&NodeId(2)].fenced);
    for (old, new) in before.iter().zip(&state.topics["remote"].partitions) {
        assert_eq!(new.leader, Some(NodeId(2)));
        assert!(new.leader_epoch > old.leader_epoch, "led again at a new epoch: {old:?} -> {new:?}");
    }
}

#[test]
fn a_topic_deleted_and_created_again_while_its_broker_was_down_comes_back_empty() {
    use shardlog_broker::quorum::state::Command;
    use shardlog_broker::quorum::wire::WireWriteResult;
    let quorum = RemoteQuorum::new();
    let voter = &quorum.voter;
    let broker = quorum.start_broker();
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "remote", 1, 1, &[]), 0);
    assert_eq!(produce(&mut s, 0, &batch(1, 3, 0)), (0, 0));
    let old_id = voter.state().topics["remote"].id;
    broker.kill();

    // While the broker is down (and, with its ten-minute session, still counted live), the topic is
    // deleted and a new one of the same name lands on it.
    let mut client = QuorumClient::connect(&voter.addr, Duration::from_secs(10)).unwrap();
    for command in [
        Command::DeleteTopic { name: "remote".into() },
        Command::CreateTopic {
            assignment: None,
            name: "remote".into(),
            id: uuid::Uuid::new_v4(),
            partitions: 1,
            replication_factor: 1,
            configs: Default::default(),
        },
    ] {
        let result = client.write(command).unwrap();
        assert!(matches!(result, WireWriteResult::Applied { outcome: Ok(_), .. }), "{result:?}");
    }
    assert_ne!(voter.state().topics["remote"].id, old_id);

    let broker = quorum.start_broker();
    let mut s = broker.connect();
    let (err, records) = fetch(&mut s, 0);
    assert_eq!(err, 0);
    assert!(records.is_empty(), "the old topic's records must not show up in the new one");
    assert_eq!(produce(&mut s, 0, &batch(2, 1, 0)), (0, 0), "the new topic starts at offset 0");
}

#[test]
fn a_broker_whose_heartbeats_go_unanswered_for_a_session_stops_leading_until_they_are_answered_again() {
    let quorum = RemoteQuorum::new();
    let broker = Broker::start_in(
        &quorum.data,
        1,
        &[
            "--node-id",
            "2",
            "--quorum-voters",
            &quorum.voters,
            "--set",
            "broker.session.timeout.ms=1000",
            "--set",
            "broker.heartbeat.interval.ms=100",
        ],
    );
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "remote", 1, 1, &[]), 0);
    assert_eq!(produce(&mut s, 0, &batch(1, 1, 0)).0, 0);

    // The quorum stops answering (paused): after a session without an acknowledged heartbeat the broker
    // must assume it was fenced and refuse to act as leader.
    let voter_pid = quorum.voter.child.id() as i32;
    signal(voter_pid, 19); // SIGSTOP
    let refused = wait_for_code(&mut s, 6); // NOT_LEADER_OR_FOLLOWER
    signal(voter_pid, 18); // SIGCONT
    assert!(refused, "the broker kept leading without a session");
    assert!(wait_for_code(&mut s, 0), "the broker leads again once its heartbeats are answered");
    assert!(broker.log().contains("no heartbeat acknowledged for a whole session"));
}

/// Produces until the answer has `code` (at most 30 s); whether it did.
fn wait_for_code(s: &mut std::net::TcpStream, code: i16) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while std::time::Instant::now() < deadline {
        if produce(s, 0, &batch(2, 1, 0)).0 == code {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: kill(2) on a process this test started, with a valid signal.
    assert_eq!(unsafe { kill(pid, sig) }, 0);
}

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
}

#[test]
fn the_quorum_port_closes_connections_beyond_its_own_limit_and_serves_again_when_they_go() {
    use shardlog_broker::quorum::network::MAX_PEER_CONNECTIONS;
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let voter = StandaloneVoter::start(dir.path());
    let held: Vec<std::net::TcpStream> =
        (0..MAX_PEER_CONNECTIONS).map(|_| std::net::TcpStream::connect(&voter.addr).unwrap()).collect();
    // One more is closed as it is accepted (the voter counts the held ones first: it has accepted them
    // once it has answered this one, either way).
    let mut extra = std::net::TcpStream::connect(&voter.addr).unwrap();
    extra.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut byte = [0u8; 1];
    match extra.read(&mut byte) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("a connection beyond {MAX_PEER_CONNECTIONS} should be closed, read gave {other:?}"),
    }
    assert!(voter.status().is_none(), "members get no slot either while the port is full");
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    while voter.status().is_none() {
        assert!(Instant::now() < deadline, "the voter serves again once the connections are gone");
        std::thread::sleep(Duration::from_millis(50));
    }
}
