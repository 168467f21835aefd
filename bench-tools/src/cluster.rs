//! `shardlog-bench cluster`: a local cluster of shardlog processes on loopback, each with its own data
//! dir, for `tps-table` and for trying things out. Prints the bootstrap list once every broker answers
//! Metadata, and stops them all (SIGTERM) on Ctrl-C or when dropped.
//!
//! More than one broker needs the quorum service; until it exists the launcher refuses N > 1.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use shardlog_broker::admin_cli::AdminClient;

/// Options of `shardlog-bench cluster`.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    #[arg(long, default_value_t = 1)]
    pub brokers: usize,
    /// Port of the first broker; the others follow.
    #[arg(long, default_value_t = 9092)]
    pub base_port: u16,
    /// Each broker's data goes to `<data-dir>/broker-<id>`.
    #[arg(long, default_value = "bench-cluster")]
    pub data_dir: PathBuf,
    /// Shards per broker (default: the broker's own, one per CPU).
    #[arg(long)]
    pub shards: Option<usize>,
    /// The shardlog binary (default: next to this one, else on PATH).
    #[arg(long)]
    pub shardlog: Option<PathBuf>,
    /// Extra `KEY=VALUE` broker settings for every broker.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub settings: Vec<String>,
}

/// Running brokers; stopped when dropped.
#[derive(Debug)]
pub struct Cluster {
    children: Vec<Child>,
    pub bootstrap: String,
}

/// A loopback port free right now (for local brokers and voters).
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The `shardlog` binary: `explicit`, else next to the running executable, else `shardlog` on PATH.
pub fn shardlog_binary(explicit: Option<&Path>) -> PathBuf {
    if let Some(path) = explicit {
        return path.to_path_buf();
    }
    let beside = std::env::current_exe().ok().and_then(|exe| {
        // Test binaries live in target/<profile>/deps; the broker binary one level up.
        let dir = exe.parent()?.to_path_buf();
        [dir.join("shardlog"), dir.parent()?.join("shardlog")].into_iter().find(|p| p.is_file())
    });
    beside.unwrap_or_else(|| PathBuf::from("shardlog"))
}

impl Cluster {
    pub fn start(args: &ClusterArgs) -> Result<Cluster> {
        if args.brokers != 1 {
            bail!("{} brokers need the quorum service, which is not built yet: run with --brokers 1", args.brokers);
        }
        let binary = shardlog_binary(args.shardlog.as_deref());
        let mut cluster = Cluster { children: Vec::new(), bootstrap: String::new() };
        let mut addresses = Vec::new();
        for i in 0..args.brokers {
            let id = i + 1;
            let port = args.base_port + i as u16;
            let data = args.data_dir.join(format!("broker-{id}"));
            std::fs::create_dir_all(&data).with_context(|| format!("create {}", data.display()))?;
            let mut command = Command::new(&binary);
            command
                .args(["start", "--node-id", &id.to_string(), "--listen", &format!("127.0.0.1:{port}")])
                .arg("--data-dir")
                .arg(&data)
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(data.join("broker.log"))?);
            if let Some(shards) = args.shards {
                command.args(["--shards", &shards.to_string()]);
            }
            for setting in &args.settings {
                command.args(["--set", setting]);
            }
            let child = command.spawn().with_context(|| format!("start {}", binary.display()))?;
            cluster.children.push(child);
            addresses.push(format!("127.0.0.1:{port}"));
        }
        for addr in &addresses {
            wait_for_metadata(addr, &mut cluster.children)?;
        }
        cluster.bootstrap = addresses.join(",");
        Ok(cluster)
    }

    /// SIGTERM to every broker, then wait for them.
    pub fn stop(&mut self) -> Result<()> {
        for child in &mut self.children {
            // SAFETY: kill(2) on a process we started, with a valid signal.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        for child in &mut self.children {
            let status = child.wait()?;
            if !status.success() {
                eprintln!("broker {} exited with {status}", child.id());
            }
        }
        self.children.clear();
        Ok(())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

fn wait_for_metadata(addr: &str, children: &mut [Child]) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(mut admin) = AdminClient::connect(addr)
            && admin.metadata(None).is_ok()
        {
            return Ok(());
        }
        for child in children.iter_mut() {
            if let Some(status) = child.try_wait()? {
                bail!("a broker exited during start-up with {status}; see its broker.log");
            }
        }
        if Instant::now() > deadline {
            bail!("{addr} did not answer Metadata within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The command: start, print the bootstrap list, wait for Ctrl-C, stop.
pub fn run(args: &ClusterArgs) -> Result<()> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    let mut cluster = Cluster::start(args)?;
    println!("{}", cluster.bootstrap);
    eprintln!("{} broker(s) running; Ctrl-C stops them", args.brokers);
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    cluster.stop()
}
