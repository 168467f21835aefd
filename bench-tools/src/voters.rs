//! Standalone `shardlog quorum` voter processes on loopback, each with its own directory and log file:
//! started, killed, paused and restarted by `shardlog-bench quorum` and by the quorum process tests.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use shardlog_broker::quorum::client::QuorumClient;
use shardlog_broker::quorum::state::{BrokerEndpoint, Command as QuorumCommand, NodeId};
use shardlog_broker::quorum::wire::WireStatus;

use crate::cluster::free_port;

/// How long a status question to a voter may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// Registers broker 1 with a session that never expires: topics need a live broker for their replicas,
/// and the quorum benchmark and tests run voters without brokers.
pub fn everlasting_broker_registration() -> QuorumCommand {
    QuorumCommand::RegisterBroker {
        previous_incarnation: None,
        id: NodeId(1),
        endpoint: BrokerEndpoint { host: "127.0.0.1".into(), port: 9092 },
        incarnation: 1,
        now_ms: 0,
        session_timeout_ms: i64::MAX,
    }
}

/// Running voters `1..=n`; killed when dropped.
#[derive(Debug)]
pub struct VoterProcesses {
    binary: PathBuf,
    dir: PathBuf,
    /// Flags every voter is started with besides its id, address, voter list and directory.
    extra: Vec<String>,
    /// Each voter's quorum address, `HOST:PORT` (voter `i + 1` at index `i`).
    pub addrs: Vec<String>,
    children: Vec<Option<Child>>,
}

impl VoterProcesses {
    /// Starts `n` voters on free ports, their data in `<dir>/voter-<id>`.
    pub fn start(binary: PathBuf, dir: PathBuf, n: usize, extra: &[&str]) -> Result<VoterProcesses> {
        let addrs = (0..n).map(|_| Ok(format!("127.0.0.1:{}", free_port()?))).collect::<Result<Vec<_>>>()?;
        let extra = extra.iter().map(|s| s.to_string()).collect();
        let mut voters = VoterProcesses { binary, dir, extra, addrs, children: Vec::new() };
        for i in 0..n {
            let child = voters.spawn(i)?;
            voters.children.push(Some(child));
        }
        Ok(voters)
    }

    pub fn dir_of(&self, i: usize) -> PathBuf {
        self.dir.join(format!("voter-{}", i + 1))
    }

    fn spawn(&self, i: usize) -> Result<Child> {
        let list: Vec<String> = self.addrs.iter().enumerate().map(|(j, a)| format!("{}@{a}", j + 1)).collect();
        let dir = self.dir_of(i);
        std::fs::create_dir_all(&dir)?;
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("voter.log"))?;
        Command::new(&self.binary)
            .args([
                "quorum",
                "--node-id",
                &(i + 1).to_string(),
                "--listen",
                &self.addrs[i],
                "--voters",
                &list.join(","),
            ])
            .args(&self.extra)
            .arg("--data-dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .with_context(|| format!("start {}", self.binary.display()))
    }

    /// Starts voter `i` again on its directory (after [`VoterProcesses::kill`]).
    pub fn restart(&mut self, i: usize) -> Result<()> {
        self.children[i] = Some(self.spawn(i)?);
        Ok(())
    }

    /// SIGKILL to voter `i`; returns once it is gone.
    pub fn kill(&mut self, i: usize) -> Result<()> {
        if let Some(mut child) = self.children[i].take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Sends `signal` (SIGSTOP, SIGCONT, ...) to voter `i`.
    pub fn signal(&self, i: usize, signal: i32) -> Result<()> {
        let child = self.children[i].as_ref().context("the voter is not running")?;
        // SAFETY: kill(2) with the pid of a child we started and a signal number; no memory is involved.
        if unsafe { libc::kill(child.id() as i32, signal) } != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        Ok(())
    }

    /// What voter `i` holds, if it answers.
    pub fn status(&self, i: usize) -> Option<WireStatus> {
        QuorumClient::connect(&self.addrs[i], CALL_TIMEOUT).ok()?.status().ok()
    }

    /// The index of the voter the running voters agree leads, once they do (at most 30 s).
    pub fn leader(&self) -> Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let seen: Vec<Option<u64>> = (0..self.addrs.len())
                .filter(|i| self.children[*i].is_some())
                .map(|i| self.status(i).and_then(|s| s.leader))
                .collect();
            if let Some(Some(leader)) = seen.first()
                && seen.iter().all(|l| *l == Some(*leader))
            {
                return Ok((*leader - 1) as usize);
            }
            if Instant::now() > deadline {
                bail!("the voters did not agree on a leader within 30 s: {seen:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Voter `i`'s log so far.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir_of(i).join("voter.log")).unwrap_or_default()
    }
}

impl Drop for VoterProcesses {
    fn drop(&mut self) {
        for child in self.children.iter_mut().flatten() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
