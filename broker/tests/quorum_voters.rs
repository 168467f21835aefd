//! Three voters on loopback, each with its own thread, directory and quorum port: commands written through
//! any voter commit once, in one order, on all of them; a stopped voter catches up from the log when it
//! starts again; when the leader stops, the others elect a new one and go on.

use std::path::Path;
use std::time::{Duration, Instant};

use shardlog_broker::quorum::service::{Voter, VoterSettings};
use shardlog_broker::quorum::state::{BrokerEndpoint, ClusterState, Command, CommandError, NodeId};
use shardlog_broker::quorum::wire::WireWriteResult;
use uuid::Uuid;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

struct Cluster {
    dir: tempfile::TempDir,
    voters: Vec<(u64, String)>,
    running: Vec<Option<Voter>>,
    snapshot_after_entries: u64,
    session_timeout_ms: i64,
}

impl Cluster {
    fn start(n: u64) -> Cluster {
        Self::start_with_snapshots_every(n, 1000)
    }

    fn start_with_snapshots_every(n: u64, entries: u64) -> Cluster {
        let voters: Vec<(u64, String)> = (1..=n).map(|id| (id, format!("127.0.0.1:{}", free_port()))).collect();
        let dir = tempfile::tempdir().unwrap();
        // The tests' brokers register once and never heartbeat, unless a test says otherwise.
        let session_timeout_ms = 3_600_000;
        let mut cluster =
            Cluster { dir, voters, running: Vec::new(), snapshot_after_entries: entries, session_timeout_ms };
        for id in 1..=n {
            let voter = cluster.voter(id);
            cluster.running.push(Some(voter));
        }
        cluster
    }

    fn settings(&self, id: u64) -> VoterSettings {
        let addr = self.voters[(id - 1) as usize].1.parse().unwrap();
        let dir = self.dir.path().join(format!("voter-{id}"));
        let mut settings = VoterSettings::new(id, dir, addr, self.voters.clone());
        settings.snapshot_after_entries = self.snapshot_after_entries;
        settings.session_timeout_ms = self.session_timeout_ms;
        settings
    }

    fn voter(&self, id: u64) -> Voter {
        Voter::start(self.settings(id)).unwrap()
    }

    fn get(&self, id: u64) -> &Voter {
        self.running[(id - 1) as usize].as_ref().expect("a running voter")
    }

    fn leader(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let seen: Vec<u64> = self.running.iter().flatten().filter_map(|v| v.leader()).collect();
            if let Some(&leader) = seen.first()
                && seen.iter().all(|l| *l == leader)
                && self.running[(leader - 1) as usize].is_some()
            {
                return leader;
            }
            assert!(Instant::now() < deadline, "no leader agreed on: {seen:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Writes through voter `via`, retrying while an election is under way. A retry may meet the first
    /// attempt's effect (the answer was lost, the command committed): a topic that exists then counts.
    fn write(&self, via: u64, command: Command) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut retried = false;
        loop {
            match self.get(via).write(command.clone()) {
                WireWriteResult::Applied { index, outcome: Err(CommandError::TopicAlreadyExists(_)) } if retried => {
                    return index;
                }
                WireWriteResult::Applied { index, outcome } => {
                    assert!(outcome.is_ok(), "{command:?} refused: {outcome:?}");
                    return index;
                }
                other => {
                    assert!(Instant::now() < deadline, "{command:?} not committed: {other:?}");
                    retried = true;
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
    }

    /// Waits until every running voter applied `index`, and returns their (equal) states.
    fn converged(&self, index: u64) -> ClusterState {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let states: Vec<(ClusterState, Option<u64>)> =
                self.running.iter().flatten().map(|v| v.state().unwrap()).collect();
            if states.iter().all(|(_, applied)| applied.is_some_and(|a| a >= index)) {
                let first = &states[0].0;
                for (state, _) in &states {
                    assert_eq!(state, first, "voters applied the same log to different states");
                }
                return first.clone();
            }
            assert!(
                Instant::now() < deadline,
                "not every voter applied {index}: {:?}",
                states.iter().map(|s| s.1).collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A broker registration; the voter that proposes it stamps its time and session timeout.
fn register(id: u32, incarnation: u64) -> Command {
    Command::RegisterBroker {
        previous_incarnation: None,
        id: NodeId(id),
        endpoint: BrokerEndpoint { host: "127.0.0.1".into(), port: 9092 },
        incarnation,
        now_ms: 0,
        session_timeout_ms: 0,
    }
}

fn create(name: &str) -> Command {
    Command::CreateTopic {
        assignment: None,
        name: name.into(),
        id: Uuid::new_v4(),
        partitions: 1,
        replication_factor: 1,
        configs: Default::default(),
    }
}

fn topic_names(state: &ClusterState) -> Vec<String> {
    state.topics.keys().cloned().collect()
}

fn raft_files_exist(dir: &Path) -> bool {
    dir.join("raft-log").is_file() && dir.join("raft-vote").is_file()
}

#[test]
fn three_voters_commit_through_any_voter_catch_up_after_a_restart_and_survive_the_leader_stopping() {
    let mut cluster = Cluster::start(3);
    cluster.leader();
    cluster.write(1, register(1, 1));
    // Through every voter in turn: two of them forward to the leader.
    let mut last = 0;
    for i in 0..12 {
        last = cluster.write(1 + i % 3, create(&format!("t{i:02}")));
    }
    let state = cluster.converged(last);
    assert_eq!(topic_names(&state), (0..12).map(|i| format!("t{i:02}")).collect::<Vec<_>>());
    for id in 1..=3 {
        assert!(raft_files_exist(&cluster.dir.path().join(format!("voter-{id}"))));
    }

    // A follower stops; the other two go on; it comes back and catches up from the leader's log.
    let leader = cluster.leader();
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    cluster.running[(follower - 1) as usize].take().unwrap().stop();
    for i in 12..16 {
        last = cluster.write(leader, create(&format!("t{i:02}")));
    }
    cluster.running[(follower - 1) as usize] = Some(cluster.voter(follower));
    let state = cluster.converged(last);
    assert_eq!(state.topics.len(), 16, "the restarted voter has every command, in the same state");

    // The leader stops: the two others elect a new leader and keep committing.
    cluster.running[(leader - 1) as usize].take().unwrap().stop();
    let survivor = (1..=3).find(|id| *id != leader).unwrap();
    last = cluster.write(survivor, create("after-the-leader"));
    let new_leader = cluster.leader();
    assert_ne!(new_leader, leader);
    let state = cluster.converged(last);
    assert!(state.topics.contains_key("after-the-leader"));
    assert_eq!(state.topics.len(), 17);
}

#[test]
fn voters_take_snapshots_and_a_restarted_voter_resumes_from_its_snapshot_and_log() {
    // A snapshot every 10 entries.
    let mut cluster = Cluster::start_with_snapshots_every(3, 10);
    let leader = cluster.leader();
    cluster.write(leader, register(1, 1));
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    cluster.running[(follower - 1) as usize].take().unwrap().stop();
    let mut last = 0;
    for i in 0..250 {
        last = cluster.write(leader, create(&format!("s{i:03}")));
    }
    cluster.running[(follower - 1) as usize] = Some(cluster.voter(follower));
    let state = cluster.converged(last);
    assert_eq!(state.topics.len(), 250, "the restarted voter caught up");
    for id in 1..=3 {
        let dir = cluster.dir.path().join(format!("voter-{id}"));
        assert!(dir.join("raft-snapshot").is_file(), "voter {id} took a snapshot");
    }

    // Every voter restarts from its snapshot plus the log after it, to the same state.
    for id in 1..=3 {
        cluster.running[(id - 1) as usize].take().unwrap().stop();
        cluster.running[(id - 1) as usize] = Some(cluster.voter(id));
        let after = cluster.converged(last);
        assert!(after == state, "voter {id} reopened to another state ({} topics)", after.topics.len());
    }
    last = cluster.write(cluster.leader(), create("after-restarts"));
    assert_eq!(cluster.converged(last).topics.len(), 251);
}

#[test]
fn the_leader_fences_a_broker_whose_heartbeats_stop_and_a_heartbeat_unfences_it() {
    let mut cluster = Cluster::start(1);
    // Short sessions: restart the voter with them.
    cluster.session_timeout_ms = 600;
    cluster.running[0].take().unwrap().stop();
    cluster.running[0] = Some(cluster.voter(1));
    cluster.leader();
    cluster.write(1, register(7, 3));
    let (state, _) = cluster.get(1).state().unwrap();
    assert!(!state.brokers[&NodeId(7)].fenced, "registered live");
    assert!(state.brokers[&NodeId(7)].last_heartbeat_ms > 0, "stamped with the controller's clock");

    let deadline = Instant::now() + Duration::from_secs(10);
    while !cluster.get(1).state().unwrap().0.brokers[&NodeId(7)].fenced {
        assert!(Instant::now() < deadline, "the broker was not fenced after its session expired");
        std::thread::sleep(Duration::from_millis(50));
    }
    cluster.write(1, Command::BrokerHeartbeat { id: NodeId(7), incarnation: 3, now_ms: 0 });
    assert!(!cluster.get(1).state().unwrap().0.brokers[&NodeId(7)].fenced, "a heartbeat unfences it");
}
