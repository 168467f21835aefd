//! A quorum leader paused (SIGSTOP) for longer than the brokers' session timeout, then resumed, with
//! two-second sessions. It fences no healthy broker, and says nothing of fencing, on waking: the silence
//! it would hold against the brokers is its own.
//! - With the quorum's only voter on broker 1 (brokers 2 and 3 reach it over the network), the voter
//!   still leads when it wakes; nobody could reach it while it slept, so it must observe a whole session
//!   before it fences anyone: brokers that come back within that session (the others, stalled with it
//!   and resumed half a session after it) are not fenced.
//! - With a voter on each broker, the other two elect a new leader, which fences the paused broker (its
//!   session did expire); the old leader, waking, has been deposed and must neither fence nor log as
//!   leader.

mod common;

use std::time::{Duration, Instant};

use shardlog_broker::quorum::client::QuorumClient;
use shardlog_broker::quorum::state::{ClusterState, Command, NodeId};

use common::Broker;

const SESSION_MS: u64 = 2000;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// (leader, state) as the voter at `addr` holds them.
fn status(addr: &str) -> Option<(Option<u64>, ClusterState)> {
    let status = QuorumClient::connect(addr, Duration::from_secs(2)).ok()?.status().ok()?;
    Some((status.leader, status.state))
}

fn wait_for<T>(what: &str, mut done: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(value) = done() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The leader every voter in `addrs` agrees on, with its state, once all brokers are registered and live.
fn settled(addrs: &[&String]) -> Option<(u64, ClusterState)> {
    let seen: Vec<(Option<u64>, ClusterState)> = addrs.iter().map(|a| status(a)).collect::<Option<_>>()?;
    let leader = seen[0].0?;
    let agreed = seen.iter().all(|(l, _)| *l == Some(leader));
    let state = seen.into_iter().next()?.1;
    let live = state.brokers.len() == 3 && state.brokers.values().all(|b| !b.fenced);
    (agreed && live).then_some((leader, state))
}

/// Lines of `log` that say a broker is being fenced for an expired session.
fn fencing_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.contains("session expired; fencing")).collect()
}

/// Whether a fencing line names broker `id` (in either of the forms the line has had).
fn names(line: &str, id: u64) -> bool {
    line.contains(&format!("broker={id} ")) || line.contains(&format!("NodeId({id})"))
}

/// The commands in the voter's committed log at `addr` that fence broker `id`.
fn fencings_of(addr: &str, id: u64) -> usize {
    let status = QuorumClient::connect(addr, Duration::from_secs(2)).unwrap().status().unwrap();
    status
        .commands
        .iter()
        .filter(|(_, c)| matches!(c, Command::FenceBroker { id: i, .. } if u64::from(i.0) == id))
        .count()
}

/// Three brokers with two-second sessions, each started with `--quorum-voters voters`.
fn three_brokers(dirs: &[tempfile::TempDir], voters: &str) -> Vec<Broker> {
    let session = format!("broker.session.timeout.ms={SESSION_MS}");
    let heartbeat = format!("broker.heartbeat.interval.ms={}", SESSION_MS / 10);
    let mut brokers: Vec<Broker> = (0..3)
        .map(|i| {
            let id = (i + 1).to_string();
            let extra = ["--node-id", &id, "--quorum-voters", voters, "--set", &session, "--set", &heartbeat];
            Broker::spawn_at(dirs[i].path(), free_port(), 1, &extra, None)
        })
        .collect();
    for broker in &mut brokers {
        broker.wait_until_it_answers();
    }
    brokers
}

#[test]
fn a_lone_voter_paused_past_the_session_timeout_fences_nobody_it_did_not_observe_for_a_session() {
    let voter = format!("127.0.0.1:{}", free_port());
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let brokers = three_brokers(&dirs, &format!("1@{voter}"));
    wait_for("three live brokers", || settled(&[&voter]));
    // The voter has led for a whole session: it may fence a broker that goes silent.
    std::thread::sleep(Duration::from_millis(SESSION_MS));

    // The voter's broker stalls for three sessions; the other two stall too while it does, and come
    // back half a session after it: the voter, awake, has observed their silence for half a session.
    brokers[0].signal(19); // SIGSTOP
    std::thread::sleep(Duration::from_millis(SESSION_MS));
    brokers[1].signal(19);
    brokers[2].signal(19);
    std::thread::sleep(Duration::from_millis(2 * SESSION_MS));
    brokers[0].signal(18); // SIGCONT
    std::thread::sleep(Duration::from_millis(SESSION_MS / 2));
    brokers[1].signal(18);
    brokers[2].signal(18);
    // Two sessions: time enough to fence, were the voter's sleep held against the brokers.
    std::thread::sleep(Duration::from_millis(2 * SESSION_MS));
    let (_, state) = wait_for("three live brokers again", || settled(&[&voter]));
    assert_eq!(state.brokers.len(), 3);

    for id in 1..=3 {
        assert_eq!(fencings_of(&voter, id), 0, "broker {id} was fenced for the voter's own sleep");
    }
    assert_eq!(fencing_lines(&brokers[0].log()), Vec::<&str>::new());
}

#[test]
fn a_quorum_leader_paused_past_the_session_timeout_fences_no_healthy_broker_when_it_wakes() {
    let quorum_addrs: Vec<String> = (0..3).map(|_| format!("127.0.0.1:{}", free_port())).collect();
    let voters: Vec<String> = quorum_addrs.iter().enumerate().map(|(i, a)| format!("{}@{a}", i + 1)).collect();
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let brokers = three_brokers(&dirs, &voters.join(","));
    let all: Vec<&String> = quorum_addrs.iter().collect();
    let (leader, _) = wait_for("a leader all voters agree on, and three live brokers", || settled(&all));
    // The leader has led for a whole session: it may fence a broker that goes silent.
    std::thread::sleep(Duration::from_millis(SESSION_MS));
    assert_eq!(wait_for("a settled quorum", || settled(&all)).0, leader);
    let paused = &brokers[leader as usize - 1];
    let others: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let other_addrs: Vec<&String> = others.iter().map(|id| &quorum_addrs[*id as usize - 1]).collect();

    paused.signal(19); // SIGSTOP
    // The others elect a new leader, which fences the paused broker once its session has expired.
    let fenced = wait_for("the paused broker fenced by a new leader", || {
        let (new_leader, state) = status(other_addrs[0])?;
        let moved = new_leader.is_some_and(|l| l != leader);
        (moved && state.brokers.get(&NodeId(leader as u32))?.fenced).then_some(state)
    });
    assert!(others.iter().all(|id| !fenced.brokers[&NodeId(*id as u32)].fenced), "{:?}", fenced.brokers);
    // Paused for three sessions in all.
    std::thread::sleep(Duration::from_millis(2 * SESSION_MS));
    paused.signal(18); // SIGCONT

    // Awake, the old leader learns of the new one; its broker heartbeats again and is unfenced.
    wait_for("every voter to agree on a leader and all three brokers live again", || settled(&all));
    // Two more sessions: time enough for a stale leader's fencing to be proposed and logged.
    std::thread::sleep(Duration::from_millis(2 * SESSION_MS));
    wait_for("a settled quorum", || settled(&all));
    for id in &others {
        assert_eq!(fencings_of(other_addrs[0], *id), 0, "healthy broker {id} was fenced");
    }

    let logs: Vec<String> = brokers.iter().map(Broker::log).collect();
    let woken = fencing_lines(&logs[leader as usize - 1]);
    assert_eq!(woken, Vec::<&str>::new(), "the deposed leader acted as leader on waking");
    for (i, log) in logs.iter().enumerate() {
        for line in fencing_lines(log) {
            for healthy in &others {
                assert!(!names(line, *healthy), "broker {} fenced healthy broker {healthy}: {line}", i + 1);
            }
        }
    }
}
