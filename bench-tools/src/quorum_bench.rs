//! `shardlog-bench quorum`: the metadata quorum's own figures, with real `shardlog quorum` processes on
//! loopback.
//!
//! 1. Commit rate: `--writers` clients each write CreateTopic commands one after another through the leader
//!    for `--duration`; commands/s and commit latency (hdrhistogram).
//! 2. Failover: one client writes continuously while the Raft leader is killed with SIGKILL, `--kills`
//!    times; each time, the time from the kill to the next committed command. The killed voter is
//!    restarted and allowed to catch up before the next kill.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Result, bail};
use hdrhistogram::Histogram;
use shardlog_broker::quorum::client::QuorumClient;
use shardlog_broker::quorum::state::Command;
use shardlog_broker::quorum::wire::WireWriteResult;

use shardlog_bench::cluster::shardlog_binary;
use shardlog_bench::voters::{VoterProcesses, everlasting_broker_registration};

const CALL_TIMEOUT: Duration = Duration::from_secs(1);

/// Options of `shardlog-bench quorum`.
#[derive(Debug, Clone, clap::Args)]
pub struct QuorumArgs {
    /// Voters to run (1, 3 or 5).
    #[arg(long, default_value_t = 3)]
    pub voters: usize,
    /// Concurrent writers for the commit-rate measurement.
    #[arg(long, default_value_t = 4)]
    pub writers: usize,
    /// How long the commit-rate measurement writes.
    #[arg(long, default_value = "5s", value_parser = crate::stats::duration)]
    pub duration: Duration,
    /// Leader kills for the failover measurement (0: skip it).
    #[arg(long, default_value_t = 20)]
    pub kills: usize,
    /// The voters' data go to `<data-dir>/voter-<id>` (emptied first).
    #[arg(long, default_value = "bench-quorum")]
    pub data_dir: PathBuf,
    /// The shardlog binary (default: next to this one, else on PATH).
    #[arg(long)]
    pub shardlog: Option<PathBuf>,
}

fn create(writer: usize, n: u64) -> Command {
    Command::CreateTopic {
        assignment: None,
        name: format!("bench-{writer}-{n}"),
        id: uuid::Uuid::new_v4(),
        partitions: 1,
        replication_factor: 1,
        configs: Default::default(),
    }
}

/// Writes one command through any voter, retrying while there is no leader. `Ok(false)` when the outcome
/// is unknown (the answer was lost).
fn write(addrs: &[String], via: &mut usize, client: &mut Option<QuorumClient>, command: Command) -> bool {
    loop {
        if client.is_none() {
            *client = QuorumClient::connect(&addrs[*via % addrs.len()], CALL_TIMEOUT).ok();
            if client.is_none() {
                *via += 1;
                continue;
            }
        }
        match client.as_mut().expect("connected").write(command.clone()) {
            Ok(WireWriteResult::Applied { outcome: Ok(_), .. }) => return true,
            Ok(WireWriteResult::NoLeader) => std::thread::sleep(Duration::from_millis(10)),
            _ => {
                *client = None;
                *via += 1;
                return false;
            }
        }
    }
}

pub fn run(args: &QuorumArgs) -> Result<()> {
    if ![1, 3, 5].contains(&args.voters) {
        bail!("--voters {}: a quorum has 1, 3 or 5 voters", args.voters);
    }
    let _ = std::fs::remove_dir_all(&args.data_dir);
    // The benchmark's broker registers once and never heartbeats.
    let mut voters = VoterProcesses::start(
        shardlog_binary(args.shardlog.as_deref()),
        args.data_dir.clone(),
        args.voters,
        &["--broker-session-timeout-ms", "86400000"],
    )?;
    voters.leader()?;
    let mut client = None;
    let register = everlasting_broker_registration();
    if !write(&voters.addrs, &mut 0, &mut client, register) {
        bail!("could not register the benchmark's broker");
    }

    // 1. Commit rate.
    let latencies = Arc::new(Mutex::new(Histogram::<u64>::new(3)?));
    let started = Instant::now();
    let writers: Vec<_> = (0..args.writers)
        .map(|w| {
            let (addrs, latencies, duration) = (voters.addrs.clone(), latencies.clone(), args.duration);
            std::thread::spawn(move || {
                let (mut via, mut client, mut n) = (w, None, 0u64);
                while started.elapsed() < duration {
                    let t = Instant::now();
                    if write(&addrs, &mut via, &mut client, create(w, n)) {
                        latencies.lock().expect("no panics while held").record(t.elapsed().as_micros() as u64).ok();
                    }
                    n += 1;
                }
            })
        })
        .collect();
    for w in writers {
        w.join().map_err(|_| anyhow::anyhow!("a writer panicked"))?;
    }
    let h = latencies.lock().expect("no panics while held").clone();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "CreateTopic with {} voters, {} writers: {:.0} commands/s; commit latency p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
        args.voters,
        args.writers,
        h.len() as f64 / secs,
        h.value_at_quantile(0.5) as f64 / 1000.0,
        h.value_at_quantile(0.99) as f64 / 1000.0,
        h.max() as f64 / 1000.0,
    );

    // 2. Failover.
    if args.kills == 0 || args.voters == 1 {
        return Ok(());
    }
    let acks: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let writer = {
        let (addrs, acks, stop) = (voters.addrs.clone(), acks.clone(), stop.clone());
        std::thread::spawn(move || {
            let (mut via, mut client, mut n) = (0usize, None, 0u64);
            while !stop.load(Ordering::SeqCst) {
                if write(&addrs, &mut via, &mut client, create(99, n)) {
                    acks.lock().expect("no panics while held").push(Instant::now());
                }
                n += 1;
            }
        })
    };
    let mut gaps = Histogram::<u64>::new(3)?;
    for kill in 0..args.kills {
        let leader = voters.leader()?;
        let killed_at = Instant::now();
        voters.kill(leader)?;
        let deadline = killed_at + Duration::from_secs(30);
        let next = loop {
            // Acknowledgements are recorded in time order: the first one after the kill.
            let first_after = acks.lock().expect("no panics while held").iter().copied().find(|t| *t > killed_at);
            if let Some(t) = first_after {
                break t;
            }
            if Instant::now() > deadline {
                bail!("kill {}: no command committed within 30 s", kill + 1);
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        gaps.record((next - killed_at).as_micros() as u64)?;
        voters.restart(leader)?;
        // Let it catch up before the next kill.
        let caught_up = Instant::now() + Duration::from_secs(30);
        loop {
            let applied: Vec<Option<u64>> =
                (0..voters.addrs.len()).map(|i| voters.status(i).and_then(|s| s.applied)).collect();
            let max = applied.iter().flatten().max().copied().unwrap_or(0);
            if applied[leader].is_some_and(|a| a + 50 >= max) {
                break;
            }
            if Instant::now() > caught_up {
                bail!("the restarted voter did not catch up within 30 s");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    stop.store(true, Ordering::SeqCst);
    writer.join().map_err(|_| anyhow::anyhow!("the writer panicked"))?;
    println!(
        "leader killed {} times: kill to next committed command p50 {:.0} ms  max {:.0} ms",
        gaps.len(),
        gaps.value_at_quantile(0.5) as f64 / 1000.0,
        gaps.max() as f64 / 1000.0,
    );
    Ok(())
}
