//! `shardlog quorum` voters as processes on loopback, each with its directory and its log in a file, for
//! tests that stop and restart voters and read what they logged.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shardlog_broker::quorum::client::QuorumClient;
use shardlog_broker::quorum::state::ClusterState;

pub struct Voters {
    dir: tempfile::TempDir,
    /// Flags every voter gets besides its id, address, voter list and directory; `{id}` in one is replaced
    /// by the voter's id.
    extra: Vec<String>,
    /// Voter `i + 1`'s quorum address at index `i`.
    pub addrs: Vec<String>,
    children: Vec<Option<Child>>,
}

impl Voters {
    /// Voters `1..=n` on free ports, started with `extra` flags.
    pub fn start(n: usize, extra: &[&str]) -> Voters {
        let free_port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let addrs = (0..n).map(|_| format!("127.0.0.1:{}", free_port())).collect();
        let extra = extra.iter().map(|s| s.to_string()).collect();
        let mut voters = Voters { dir: tempfile::tempdir().unwrap(), extra, addrs, children: Vec::new() };
        for id in 1..=n as u64 {
            let child = voters.spawn(id);
            voters.children.push(Some(child));
        }
        voters
    }

    fn spawn(&self, id: u64) -> Child {
        let list: Vec<String> = self.addrs.iter().enumerate().map(|(i, a)| format!("{}@{a}", i + 1)).collect();
        let dir = self.dir.path().join(format!("voter-{id}"));
        std::fs::create_dir_all(&dir).unwrap();
        // Appended to, so a restarted voter's log follows its previous one.
        let log = std::fs::OpenOptions::new().create(true).append(true).open(self.log_path(id)).unwrap();
        Command::new(env!("CARGO_BIN_EXE_shardlog"))
            .args(["quorum", "--node-id", &id.to_string(), "--listen", &self.addrs[id as usize - 1]])
            .args(["--voters", &list.join(",")])
            // `{id}` in a flag stands for the voter's id (its own node certificate, say).
            .args(self.extra.iter().map(|flag| flag.replace("{id}", &id.to_string())))
            .arg("--data-dir")
            .arg(&dir)
            .env_remove("RUST_LOG")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start shardlog quorum")
    }

    fn log_path(&self, id: u64) -> std::path::PathBuf {
        self.dir.path().join(format!("voter-{id}.log"))
    }

    /// What voter `id` has logged so far (over all its runs).
    pub fn log(&self, id: u64) -> String {
        std::fs::read_to_string(self.log_path(id)).unwrap_or_default()
    }

    /// (leader, state) as voter `id` holds them; `None` while it does not answer.
    pub fn status(&self, id: u64) -> Option<(Option<u64>, ClusterState)> {
        let addr = &self.addrs[id as usize - 1];
        let status = QuorumClient::connect(addr, Duration::from_secs(2)).ok()?.status().ok()?;
        Some((status.leader, status.state))
    }

    /// The leader every running voter agrees on (waits up to 30 s).
    pub fn leader(&self) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let running = (1..=self.children.len() as u64).filter(|id| self.children[*id as usize - 1].is_some());
            let seen: Vec<Option<u64>> = running.map(|id| self.status(id).and_then(|(l, _)| l)).collect();
            if let Some(Some(leader)) = seen.first()
                && seen.iter().all(|l| *l == Some(*leader))
            {
                return *leader;
            }
            assert!(Instant::now() < deadline, "no leader agreed on: {seen:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILL to voter `id`; returns once it is gone.
    pub fn kill(&mut self, id: u64) {
        if let Some(mut child) = self.children[id as usize - 1].take() {
            child.kill().unwrap();
            child.wait().unwrap();
        }
    }

    /// Starts voter `id` again on its directory.
    pub fn restart(&mut self, id: u64) {
        let child = self.spawn(id);
        self.children[id as usize - 1] = Some(child);
    }
}

impl Drop for Voters {
    fn drop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
        if std::thread::panicking() {
            for id in 1..=self.children.len() as u64 {
                eprintln!("--- voter {id} log ---\n{}", self.log(id));
            }
        }
    }
}
