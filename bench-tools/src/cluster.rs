//! `shardlog-bench cluster`: a local cluster of shardlog processes on loopback, each with its own data
//! dir, for `tps-table` and for trying things out. With more than one broker the first brokers run the
//! quorum's voters (`--quorum-voters`): all of them for 3 or 5 brokers, the first for 2, the first three
//! for 4 (a quorum has an odd number of voters); the others reach the quorum over the network. Prints the bootstrap list once every broker answers Metadata
//! listing all of them, and stops them all (SIGTERM) on Ctrl-C or when dropped. Tests also kill and
//! restart single brokers through [`Cluster`].

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use shardlog_broker::client::{ClientSecurity, KafkaClient};

/// Options of `shardlog-bench cluster`.
#[derive(Debug, Clone, clap::Args)]
pub struct ClusterArgs {
    #[arg(long, default_value_t = 1)]
    pub brokers: usize,
    /// Kafka port of the first broker; the others follow. 0: a free port for each.
    #[arg(long, default_value_t = 9092)]
    pub base_port: u16,
    /// With more than one broker, the voting brokers' quorum ports: the first one's, the others following.
    /// Default: `--base-port` + 100 (9192, 9193, ...), or a free port for each with `--base-port 0`. A
    /// cluster started again on the same `--data-dir` keeps its voters' ports (`<data-dir>/quorum-voters`):
    /// the quorum remembers its voters' addresses. (A single broker is its own quorum, without a port.)
    #[arg(long)]
    pub quorum_base_port: Option<u16>,
    /// The brokers' metrics endpoints (`metrics.listen`): the first one's port, the others following.
    /// Default: `--base-port` + 200 (9292, 9293, ...), or a free port for each with `--base-port 0`.
    #[arg(long)]
    pub metrics_base_port: Option<u16>,
    /// Each broker's data goes to `<data-dir>/broker-<id>`.
    #[arg(long, default_value = "bench-cluster")]
    pub data_dir: PathBuf,
    /// Shards per broker (default: the broker's own, one per CPU).
    #[arg(long)]
    pub shards: Option<usize>,
    /// The shardlog binary (default: next to this one, else on PATH).
    #[arg(long)]
    pub shardlog: Option<PathBuf>,
    /// Extra `KEY=VALUE` broker settings for every broker; `{id}` in one stands for the broker's node id
    /// (`cluster.ssl.keystore.location=/etc/shardlog/node-{id}.pem`), `{host}` for its address and `{port}`
    /// for its Kafka port (`listeners=SASL_SSL://{host}:{port}`).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub settings: Vec<String>,
    /// Where each broker's log goes, `<log-dir>/broker-<id>.log` (default: `broker.log` in its data dir).
    #[arg(skip)]
    pub log_dir: Option<PathBuf>,
    /// The brokers get SIGKILL when the thread that started them ends (the fault campaign, whose
    /// namespaces and filesystems must not outlive it with brokers in them).
    #[arg(skip)]
    pub die_with_parent: bool,
    /// Further command-line arguments of broker `i + 1` at index `i` (tests: listeners of its own,
    /// `--add-scram`), after the settings; `{id}` and `{port}` in them as in `settings`.
    #[arg(skip)]
    pub broker_args: Vec<Vec<String>>,
    /// How the cluster's own Metadata calls reach the brokers (`None`: plain TCP), for a cluster whose
    /// listeners `settings` secure.
    #[arg(skip)]
    pub client_security: Option<ClientSecurity>,
}

/// One broker of the cluster: how to start it, and its process while it runs.
#[derive(Debug)]
struct BrokerProcess {
    id: usize,
    addr: String,
    /// Its metrics endpoint, HOST:PORT.
    metrics: String,
    log: PathBuf,
    command: Vec<std::ffi::OsString>,
    /// The network namespace it runs in (its file under /run/netns), if not the campaign's own.
    netns: Option<PathBuf>,
    die_with_parent: bool,
    child: Option<Child>,
}

impl BrokerProcess {
    fn spawn(&mut self, binary: &Path) -> Result<()> {
        // The log is appended to, so a restarted broker's log follows its previous one.
        let log = std::fs::OpenOptions::new().create(true).append(true).open(&self.log)?;
        let mut command = Command::new(binary);
        command.args(&self.command).stdout(Stdio::null()).stderr(log);
        // Opened here (close-on-exec), entered in the child between fork and exec.
        let netns = self.netns.as_ref().map(std::fs::File::open).transpose().context("open the namespace")?;
        let fd = netns.as_ref().map(std::os::fd::AsRawFd::as_raw_fd);
        let die_with_parent = self.die_with_parent;
        if fd.is_some() || die_with_parent {
            // SAFETY: setns(2) and prctl(2) are async-signal-safe; the closure allocates nothing and
            // touches only `fd`, which stays open until spawn has returned.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                    if die_with_parent && libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    if let Some(fd) = fd
                        && libc::setns(fd, libc::CLONE_NEWNET) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let child = command.spawn().with_context(|| format!("start {}", binary.display()))?;
        drop(netns);
        self.child = Some(child);
        Ok(())
    }
}

/// Running brokers; stopped when dropped.
#[derive(Debug)]
pub struct Cluster {
    binary: PathBuf,
    brokers: Vec<BrokerProcess>,
    pub bootstrap: String,
    security: ClientSecurity,
}

/// A loopback port free right now, for a local broker or voter to bind a moment later.
///
/// A port the kernel hands out for `bind(0)` lies in the ephemeral range, where any outgoing connection
/// or any other `bind(0)` on the machine may take it before the broker binds it: under a test suite's
/// load that happened to one start in fifty ("Address already in use"). So the ports come from below
/// that range, which the kernel never picks by itself, and in turn: every process handing them out
/// goes through one counter file under a lock, so two launchers never give out the same port, and a
/// port is given out again only once the whole range has gone round.
pub fn free_port() -> Result<u16> {
    let Some(range) = ports_below_ephemeral() else {
        // No room below the ephemeral range: the kernel's choice, with its race.
        return Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port());
    };
    let width = range.end - range.start;
    // The counter, when this user may open it (another user's file is not shared): a start of its own
    // otherwise, and for a fresh or garbled file, rather than where every fresh machine would begin.
    let mut counter = open_port_counter();
    let recorded = counter.as_mut().and_then(|file| {
        let mut text = String::new();
        std::io::Read::read_to_string(file, &mut text).ok()?;
        text.trim().parse::<u16>().ok().filter(|p| range.contains(p))
    });
    let start = recorded.unwrap_or_else(|| {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let spread = u64::from(std::process::id()) ^ u64::from(now.subsec_nanos());
        range.start + (spread % u64::from(width)) as u16
    });
    let port = (0..width)
        .map(|step| range.start + (start - range.start + step) % width)
        // Taken by something that binds fixed ports: skipped.
        .find(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
        .with_context(|| format!("no free loopback port in {}..{}", range.start, range.end))?;
    if let Some(file) = &mut counter {
        let next = range.start + (port - range.start + 1) % width;
        std::io::Seek::rewind(file)?;
        file.set_len(0)?;
        std::io::Write::write_all(file, format!("{next}\n").as_bytes())?;
    }
    // The lock goes with the file.
    Ok(port)
}

/// The machine's port counter for [`free_port`], locked; `None` when this user cannot open it.
fn open_port_counter() -> Option<std::fs::File> {
    let path = std::env::temp_dir().join("shardlog-bench-ports");
    let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(false).open(path).ok()?;
    file.lock().ok()?;
    Some(file)
}

/// The ports [`free_port`] gives out: from 20000 up to the start of the kernel's ephemeral range
/// (`net.ipv4.ip_local_port_range`, 32768 by default), when there are at least a thousand.
fn ports_below_ephemeral() -> Option<std::ops::Range<u16>> {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    let ephemeral: u16 = range.split_whitespace().next()?.parse().ok()?;
    (ephemeral >= 21_000).then_some(20_000..ephemeral)
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

/// The file in `--data-dir` that keeps the voters' addresses of a cluster started there.
const VOTERS_FILE: &str = "quorum-voters";

/// The `--quorum-voters` list: the one recorded in the data dir (unless `--quorum-base-port` is given),
/// else a new one, which is recorded. `host(i)` is voter i's address (from 0).
fn voter_list(
    args: &ClusterArgs,
    port: impl Fn(usize, u16) -> Result<u16>,
    host: impl Fn(usize) -> String,
) -> Result<String> {
    let record = args.data_dir.join(VOTERS_FILE);
    if args.quorum_base_port.is_none()
        && let Ok(recorded) = std::fs::read_to_string(&record)
    {
        let recorded = recorded.trim().to_string();
        if recorded.split(',').count() != voter_count(args.brokers) {
            bail!("{} holds {recorded:?}, a quorum of another size: use another --data-dir", record.display());
        }
        return Ok(recorded);
    }
    let base = args.quorum_base_port.unwrap_or(if args.base_port == 0 { 0 } else { args.base_port + 100 });
    let ports = (0..voter_count(args.brokers)).map(|i| port(i, base)).collect::<Result<Vec<_>>>()?;
    let list: Vec<String> = ports.iter().enumerate().map(|(i, p)| format!("{}@{}:{p}", i + 1, host(i))).collect();
    let list = list.join(",");
    std::fs::create_dir_all(&args.data_dir).with_context(|| format!("create {}", args.data_dir.display()))?;
    std::fs::write(&record, format!("{list}\n")).with_context(|| format!("write {}", record.display()))?;
    Ok(list)
}

/// How many of `brokers` run a quorum voter: an odd number, all of them where that is possible.
fn voter_count(brokers: usize) -> usize {
    if brokers % 2 == 1 { brokers } else { brokers - 1 }
}

impl Cluster {
    /// Starts the brokers on loopback and returns once every one answers Metadata listing all of them.
    pub fn start(args: &ClusterArgs) -> Result<Cluster> {
        Cluster::start_on(args, &[])
    }

    /// Starts the brokers, each in its own network namespace when `hosts` gives one per broker (its
    /// address and namespace file; the same Kafka port, `--base-port`, and quorum port, `--base-port` +
    /// 100, on each), and returns once every one answers Metadata listing all of them.
    pub fn start_on(args: &ClusterArgs, hosts: &[(std::net::Ipv4Addr, PathBuf)]) -> Result<Cluster> {
        if !(1..=5).contains(&args.brokers) {
            bail!("{} brokers: a local cluster has 1 to 5", args.brokers);
        }
        if !hosts.is_empty() && (hosts.len() != args.brokers || args.base_port == 0) {
            bail!("a cluster in namespaces needs one host per broker and a fixed --base-port");
        }
        let host = |i: usize| hosts.get(i).map_or_else(|| "127.0.0.1".to_string(), |(ip, _)| ip.to_string());
        let port = |i: usize, base: u16| match (base, hosts.is_empty()) {
            (0, _) => free_port(),
            (base, true) => Ok(base + i as u16),
            // Each broker has its own address: the same port on each.
            (base, false) => Ok(base),
        };
        let kafka_ports = (0..args.brokers).map(|i| port(i, args.base_port)).collect::<Result<Vec<_>>>()?;
        let metrics_base = args.metrics_base_port.unwrap_or(if args.base_port == 0 { 0 } else { args.base_port + 200 });
        let metrics_ports = (0..args.brokers).map(|i| port(i, metrics_base)).collect::<Result<Vec<_>>>()?;
        let voters = if args.brokers > 1 { Some(voter_list(args, port, host)?) } else { None };
        let binary = shardlog_binary(args.shardlog.as_deref());
        let security = args.client_security.clone().unwrap_or_else(ClientSecurity::plaintext);
        let mut cluster = Cluster { binary, brokers: Vec::new(), bootstrap: String::new(), security };
        for (i, kafka_port) in kafka_ports.iter().enumerate() {
            let id = i + 1;
            let addr = format!("{}:{kafka_port}", host(i));
            let data = args.data_dir.join(format!("broker-{id}"));
            std::fs::create_dir_all(&data).with_context(|| format!("create {}", data.display()))?;
            let metrics = format!("{}:{}", host(i), metrics_ports[i]);
            let mut command: Vec<std::ffi::OsString> =
                ["start", "--node-id", &id.to_string(), "--listen", &addr, "--metrics-listen", &metrics]
                    .iter()
                    .map(Into::into)
                    .collect();
            command.push("--data-dir".into());
            command.push(data.clone().into());
            if let Some(voters) = &voters {
                command.extend(["--quorum-voters".into(), voters.into()]);
            }
            if let Some(shards) = args.shards {
                command.extend(["--shards".into(), shards.to_string().into()]);
            }
            let fill = |text: &str| {
                text.replace("{id}", &id.to_string())
                    .replace("{host}", &host(i))
                    .replace("{port}", &kafka_port.to_string())
            };
            for setting in &args.settings {
                command.extend(["--set".into(), fill(setting).into()]);
            }
            command.extend(args.broker_args.get(i).into_iter().flatten().map(|arg| fill(arg).into()));
            let netns = hosts.get(i).map(|(_, ns)| ns.clone());
            let log =
                args.log_dir.as_ref().map_or_else(|| data.join("broker.log"), |d| d.join(format!("broker-{id}.log")));
            let die_with_parent = args.die_with_parent;
            let mut broker = BrokerProcess { id, addr, metrics, log, command, netns, die_with_parent, child: None };
            broker.spawn(&cluster.binary)?;
            cluster.brokers.push(broker);
        }
        for i in 0..cluster.brokers.len() {
            cluster.wait_for_metadata(i, args.brokers)?;
        }
        cluster.bootstrap = cluster.brokers.iter().map(|b| b.addr.clone()).collect::<Vec<_>>().join(",");
        Ok(cluster)
    }

    /// The Kafka address of broker `id` (1-based).
    pub fn addr(&self, id: usize) -> &str {
        &self.brokers[id - 1].addr
    }

    /// The metrics endpoint of broker `id` (1-based), HOST:PORT.
    pub fn metrics_addr(&self, id: usize) -> &str {
        &self.brokers[id - 1].metrics
    }

    /// SIGKILL to broker `id` (1-based); returns once it is gone.
    pub fn kill(&mut self, id: usize) -> Result<()> {
        if let Some(mut child) = self.brokers[id - 1].child.take() {
            child.kill()?;
            child.wait()?;
        }
        Ok(())
    }

    /// Whether broker `id` (1-based) was started and has exited since (by itself: a broker stops on a disk
    /// failure it cannot get past).
    pub fn exited(&mut self, id: usize) -> Result<Option<std::process::ExitStatus>> {
        let broker = &mut self.brokers[id - 1];
        let status = match &mut broker.child {
            Some(child) => child.try_wait()?,
            None => None,
        };
        if status.is_some() {
            // Reaped: its pid may be another process's from now on.
            broker.child = None;
        }
        Ok(status)
    }

    /// SIGSTOP to broker `id` (1-based): it stays alive but does nothing, as a broker stalled by a long
    /// pause would, until [`Cluster::resume`].
    pub fn pause(&mut self, id: usize) -> Result<()> {
        self.signal(id, libc::SIGSTOP)
    }

    /// SIGCONT to a broker paused by [`Cluster::pause`] (none to one that has exited since).
    pub fn resume(&mut self, id: usize) -> Result<()> {
        if self.brokers[id - 1].child.is_none() {
            return Ok(());
        }
        self.signal(id, libc::SIGCONT)
    }

    fn signal(&self, id: usize, signal: i32) -> Result<()> {
        let Some(child) = &self.brokers[id - 1].child else { bail!("broker {id} is not running") };
        // SAFETY: kill(2) on a process we started and have not waited for, with a valid signal.
        if unsafe { libc::kill(child.id() as i32, signal) } != 0 {
            bail!("signal {signal} to broker {id}: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Starts broker `id` again on its data and waits until it answers Metadata listing `expected` brokers.
    pub fn restart(&mut self, id: usize, expected: usize) -> Result<()> {
        let binary = self.binary.clone();
        self.brokers[id - 1].spawn(&binary)?;
        self.wait_for_metadata(id - 1, expected)
    }

    /// SIGTERM to every broker, then wait for them.
    pub fn stop(&mut self) -> Result<()> {
        for broker in &self.brokers {
            if let Some(child) = &broker.child {
                // SAFETY: kill(2) on a process we started, with valid signals. A paused broker is
                // continued first, or it could not act on SIGTERM.
                unsafe {
                    libc::kill(child.id() as i32, libc::SIGCONT);
                    libc::kill(child.id() as i32, libc::SIGTERM);
                }
            }
        }
        // A broker stops within its drain and controlled-shutdown limits; one that does not is killed.
        let deadline = Instant::now() + Duration::from_secs(30);
        for broker in &mut self.brokers {
            if let Some(mut child) = broker.child.take() {
                let status = loop {
                    if let Some(status) = child.try_wait()? {
                        break status;
                    }
                    if Instant::now() > deadline {
                        eprintln!("broker {} did not stop within 30 s of SIGTERM; killing it", broker.id);
                        child.kill()?;
                        break child.wait()?;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                };
                if !status.success() {
                    eprintln!("broker {} exited with {status}", broker.id);
                }
            }
        }
        Ok(())
    }

    /// Waits until broker `index` answers Metadata with `expected` live brokers (all registered).
    fn wait_for_metadata(&mut self, index: usize, expected: usize) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr = self.brokers[index].addr.clone();
        loop {
            if let Ok(mut admin) = KafkaClient::connect_secured(&addr, self.security.clone())
                && admin.metadata(None).is_ok_and(|m| m.brokers.len() >= expected)
            {
                return Ok(());
            }
            for broker in &mut self.brokers {
                if let Some(child) = &mut broker.child
                    && let Some(status) = child.try_wait()?
                {
                    let log = std::fs::read_to_string(&broker.log).unwrap_or_default();
                    // What the broker said before any backtrace: the backtrace would hide the reason.
                    let said: Vec<&str> = log
                        .lines()
                        .take_while(|l| !l.trim_start().to_lowercase().starts_with("stack backtrace"))
                        .collect();
                    let tail = &said[said.len().saturating_sub(5)..];
                    bail!(
                        "broker {} exited with {status}; {} ends with:\n{}",
                        broker.id,
                        broker.log.display(),
                        tail.join("\n")
                    );
                }
            }
            if Instant::now() > deadline {
                bail!("{addr} did not list {expected} brokers in Metadata within 60 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.stop();
    }
}

/// The command: start, print the bootstrap list, wait for Ctrl-C, stop.
pub fn run(args: &ClusterArgs) -> Result<()> {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGINT, stop.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGTERM, stop.clone())?;
    let mut cluster = Cluster::start(args)?;
    println!("{}", cluster.bootstrap);
    let metrics: Vec<String> = cluster.brokers.iter().map(|b| format!("http://{}/metrics", b.metrics)).collect();
    eprintln!("{} broker(s) running (metrics: {}); Ctrl-C stops them", args.brokers, metrics.join(" "));
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    cluster.stop()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Launchers starting at once (threads here, each with its own lock on the counter, as processes
    /// would have) are given different ports, none of them where the kernel picks ports by itself.
    #[test]
    fn ports_given_out_at_once_differ_and_lie_below_the_ephemeral_range() {
        let range = ports_below_ephemeral().expect("this machine has room below the ephemeral range");
        let handed: Vec<u16> = std::thread::scope(|scope| {
            let launchers: Vec<_> =
                (0..8).map(|_| scope.spawn(|| (0..100).map(|_| free_port().unwrap()).collect::<Vec<_>>())).collect();
            launchers.into_iter().flat_map(|l| l.join().unwrap()).collect()
        });
        let distinct: std::collections::HashSet<u16> = handed.iter().copied().collect();
        assert_eq!(distinct.len(), handed.len(), "no port given out twice: {handed:?}");
        assert!(handed.iter().all(|p| range.contains(p)), "{range:?}: {handed:?}");
    }
}
