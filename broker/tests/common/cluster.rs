//! Three brokers of the real binary over three standalone quorum voters, all on loopback, for tests that
//! kill a broker: the voters live apart from the brokers, so a SIGKILLed broker takes no voter with it, and
//! short broker sessions have the quorum fence it, and move the partitions it led to other in-sync
//! replicas, within seconds.

use std::time::{Duration, Instant};

use shardlog_broker::client::KafkaClient;

use super::Broker;
use super::voters::Voters;

/// `broker.session.timeout.ms` of the voters and brokers: how long a killed broker goes on being named
/// leader before it is fenced.
pub const SESSION_MS: u64 = 2000;
/// The brokers' node ids are `FIRST_BROKER_ID..FIRST_BROKER_ID + 3` (the voters are 1, 2 and 3).
pub const FIRST_BROKER_ID: u32 = 4;

pub struct Cluster {
    /// Broker `FIRST_BROKER_ID + i` at index `i`, killed or not (a killed one keeps its log).
    brokers: Vec<Broker>,
    killed: Vec<bool>,
    _dirs: Vec<tempfile::TempDir>,
    /// Dropped after the brokers, so that no broker outlives the quorum it reports to.
    _voters: Voters,
}

impl Cluster {
    /// Three voters and three brokers with `extra` flags, once Metadata names all three brokers.
    pub fn start(extra: &[&str]) -> Cluster {
        let session = SESSION_MS.to_string();
        let voters = Voters::start(3, &["--broker-session-timeout-ms", &session]);
        let list: Vec<String> = voters.addrs.iter().enumerate().map(|(i, a)| format!("{}@{a}", i + 1)).collect();
        let list = list.join(",");
        let session = format!("broker.session.timeout.ms={SESSION_MS}");
        let heartbeat = format!("broker.heartbeat.interval.ms={}", SESSION_MS / 10);
        let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let mut brokers: Vec<Broker> = dirs
            .iter()
            .enumerate()
            .map(|(i, dir)| {
                let id = (FIRST_BROKER_ID + i as u32).to_string();
                let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
                let own = ["--node-id", &id, "--quorum-voters", &list, "--set", &session, "--set", &heartbeat];
                Broker::spawn_at(dir.path(), port, 1, &[&own[..], extra].concat(), None)
            })
            .collect();
        for broker in &mut brokers {
            broker.wait_until_it_answers();
        }
        let cluster = Cluster { brokers, killed: vec![false; 3], _dirs: dirs, _voters: voters };
        let mut client = cluster.client();
        cluster.wait_for("Metadata to name three brokers", || {
            client.metadata(None).ok().filter(|m| m.brokers.len() == 3).map(|_| ())
        });
        cluster
    }

    /// Every broker's address, killed ones too (clients skip those that do not answer).
    pub fn bootstrap(&self) -> String {
        let addrs: Vec<String> = self.brokers.iter().map(|b| format!("127.0.0.1:{}", b.port)).collect();
        addrs.join(",")
    }

    /// The addresses of the brokers not killed.
    pub fn live_bootstrap(&self) -> String {
        let live = self.brokers.iter().zip(&self.killed).filter(|(_, killed)| !**killed);
        let addrs: Vec<String> = live.map(|(b, _)| format!("127.0.0.1:{}", b.port)).collect();
        addrs.join(",")
    }

    /// A client bootstrapped with every broker.
    pub fn client(&self) -> KafkaClient {
        KafkaClient::connect(&self.bootstrap()).expect("a broker answers")
    }

    /// The index of the broker listening at `addr` (`127.0.0.1:PORT`).
    pub fn index_of(&self, addr: &str) -> usize {
        self.brokers
            .iter()
            .position(|b| addr == format!("127.0.0.1:{}", b.port))
            .unwrap_or_else(|| panic!("{addr} is none of the cluster's brokers"))
    }

    pub fn is_killed(&self, index: usize) -> bool {
        self.killed[index]
    }

    /// SIGKILL to broker `index`, as a crash would; its log is kept.
    pub fn kill(&mut self, index: usize) {
        assert!(!self.killed[index], "broker {index} is killed once");
        self.brokers[index].signal(9);
        self.killed[index] = true;
    }

    /// Polls `done` until it gives a value, for up to 60 s (every 100 ms); panics naming `what` after.
    pub fn wait_for<T>(&self, what: &str, mut done: impl FnMut() -> Option<T>) -> T {
        self.wait_until(what, || done().ok_or_else(String::new))
    }

    /// Like [`Cluster::wait_for`], for a `done` that says what it saw while the wait goes on: the last
    /// thing it said is in the panic's message.
    pub fn wait_until<T>(&self, what: &str, mut done: impl FnMut() -> Result<T, String>) -> T {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let seen = match done() {
                Ok(value) => return value,
                Err(seen) => seen,
            };
            assert!(Instant::now() < deadline, "timed out after 60 s waiting for {what}; last seen: {seen}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
