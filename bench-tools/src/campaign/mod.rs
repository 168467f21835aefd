//! `shardlog-bench faults`: a fault campaign. A local cluster, each broker in its own network namespace
//! (or, with `--no-netns`, on loopback), runs a replicated topic under three producers (idempotent with
//! acks=all, plain with acks=all and retries, and acks=1 as the labelled lossy baseline) and a consumer,
//! while the nemesis carries out a plan drawn from the seed: brokers killed and restarted, killed with
//! their active segment cut or torn before the restart, paused past `replica.lag.time.max.ms` and the
//! broker session, isolated, split from the majority, dropping their own packets one way, on a slow link,
//! losing packets, and with a full data directory. Then every fault is healed, the cluster stopped, every
//! replica read from its data directory, and the history judged (`faults::check`). Exits non-zero on a
//! loss, a moved offset, a high watermark going back, replicas that differ below the high watermark, or a
//! duplicate from the idempotent producer. With `--workload transactions` a consume-transform-produce
//! application runs on top (`transform`), and every input must come out exactly once.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use shardlog_bench::cluster::{Cluster, ClusterArgs};
use shardlog_bench::faults::check::{self, Delivery, Event, FinalState, Stored, Tag};
use shardlog_bench::faults::disk::{self, Disks};
use shardlog_bench::faults::net::{self, Network};
use shardlog_bench::faults::plan::{self, Fault, FaultKind, PlanSpec, Rng};
use shardlog_bench::faults::{replica, tear};
use shardlog_broker::client::{ClientSecurity, KafkaClient};

use crate::faults_chart;
use crate::payload::{self, Origin};

mod report;
mod security;
mod transform;
mod workload;

pub use security::Security;
use workload::consume;
pub(crate) use workload::{ProducerSpec, Shared, produce};

pub(crate) const TOPIC: &str = "campaign";
/// Bytes of each record's value.
const VALUE_BYTES: usize = 100;
/// Short timeouts, so that pauses outlast them within a short campaign, and a free-space floor that fits
/// the campaign's small filesystems.
pub(crate) const SETTINGS: [&str; 4] = [
    "replica.lag.time.max.ms=2000",
    "broker.session.timeout.ms=3000",
    "broker.heartbeat.interval.ms=500",
    "log.dir.min.free.bytes=67108864",
];
/// Each broker's filesystem (a sparse image: it takes only what is written).
const DISK_BYTES: u64 = 16 << 30;
/// How long the workload's clients wait for an answer before they give the connection up (Kafka's
/// `request.timeout.ms`): a request to an isolated broker gets none.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How far back from the end of its whole batches a torn segment is damaged.
const TEAR_WINDOW: u64 = 64 * 1024;
/// How long the healed cluster may take to bring every replica back into the ISR.
const HEAL_WAIT: Duration = Duration::from_secs(60);

/// The producers: id and how each sends.
const PRODUCERS: [(u32, Delivery); 3] = [(1, Delivery::Idempotent), (2, Delivery::AcksAll), (3, Delivery::AcksOne)];

/// Options of `shardlog-bench faults`.
#[derive(Debug, Clone, clap::Args)]
pub struct FaultsArgs {
    /// Brokers of the local cluster (1 to 5); the topic has min(3, brokers) replicas.
    #[arg(long, default_value_t = 3)]
    pub brokers: usize,
    /// Faults the nemesis carries out.
    #[arg(long, default_value_t = 30)]
    pub faults: usize,
    /// The nemesis's seed (default: from the clock). Printed, so that a campaign can be replayed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// The report folder (default `bench-reports/faults-<seed>`); the cluster's data goes to its `cluster/`.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Let faults overlap past what the topic promises to survive (up to all brokers but one at once);
    /// losses are then reported, not failed.
    #[arg(long)]
    pub beyond: bool,
    /// How long the faults are spread over, e.g. 90s (default: 3 s per fault).
    #[arg(long, value_parser = crate::stats::duration)]
    pub duration: Option<Duration>,
    /// Partitions of the campaign's topic.
    #[arg(long, default_value_t = 6)]
    pub partitions: i32,
    /// The shardlog binary (default: next to this one, else on PATH).
    #[arg(long)]
    pub shardlog: Option<PathBuf>,
    /// Extra `KEY=VALUE` broker settings for every broker, after the campaign's own short timeouts.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub settings: Vec<String>,
    /// Run the brokers on loopback ports, without network faults (the namespaces need root).
    #[arg(long)]
    pub no_netns: bool,
    /// Only these fault kinds, comma-separated: kill, tear, pause, isolate, split, one-way-drop, slow-link,
    /// packet-loss, disk-full (default: every kind this machine can carry out).
    #[arg(long, value_delimiter = ',', value_parser = FaultKind::from_flag)]
    pub kinds: Vec<FaultKind>,
    /// `sasl_ssl`: the cluster secured everywhere (clients over SASL_SSL with SCRAM-SHA-512, replication
    /// and the quorum over cluster mTLS, ACLs on), with certificates and the client's properties made in
    /// the report folder's `certificates/`.
    #[arg(long, value_enum, default_value_t = Security::Plaintext)]
    pub security: Security,
    /// `transactions`: besides the producers and the consumer, a consume-transform-produce application
    /// (librdkafka, exactly once) reads the topic into `campaign-out` under a read_committed consumer,
    /// and the checker proves every input came out exactly once and no transaction hung.
    #[arg(long, value_enum, default_value_t = Workload::Records)]
    pub workload: Workload,
}

/// What the campaign's clients do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Workload {
    /// Producers of every kind and a consumer on one topic.
    Records,
    /// The same, and a transactional consume-transform-produce application on top.
    Transactions,
}

/// What the campaign made on the host: removed however it ends.
struct Sandbox {
    net: Option<Network>,
    disks: Option<Disks>,
}

impl Sandbox {
    fn remove(&self) {
        // The namespaces first: that kills the brokers in them, which frees their filesystems.
        if let Some(net) = &self.net {
            net.remove();
        }
        if let Some(disks) = &self.disks {
            disks.remove();
        }
    }
}

/// Removes the sandbox when the campaign returns, however it does.
struct Teardown(Arc<Sandbox>);

impl Drop for Teardown {
    fn drop(&mut self) {
        self.0.remove();
    }
}

/// What a campaign found.
pub struct Outcome {
    pub failures: usize,
    pub report: PathBuf,
}

pub fn run(args: &FaultsArgs) -> Result<Outcome> {
    if !(1..=5).contains(&args.brokers) {
        bail!("--brokers {}: a local cluster has 1 to 5 brokers", args.brokers);
    }
    if args.faults == 0 || args.partitions < 1 {
        bail!("a campaign needs at least one fault and one partition");
    }
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    if !args.no_netns
        && let Some(why) = net::unavailable()
    {
        bail!("{why}: run as root with iproute2 and nftables installed, or pass --no-netns");
    }
    println!("seed {seed} (replay with --seed {seed})");
    let out = args.out.clone().unwrap_or_else(|| PathBuf::from("bench-reports").join(format!("faults-{seed}")));
    let data = out.join("cluster");
    if data.exists() {
        // A campaign killed outright on this folder may have left its filesystems mounted in it.
        disk::unmount_below(&data);
        std::fs::remove_dir_all(&data).with_context(|| format!("remove {}", data.display()))?;
    }
    std::fs::create_dir_all(&data).with_context(|| format!("create {}", data.display()))?;

    // Registered first, so that a signal while the namespaces or filesystems are made waits for them.
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM])?;
    let net = if args.no_netns { None } else { Some(Network::create(args.brokers)?) };
    if let Some(net) = &net {
        println!("namespaces: {}", net.describe());
    }
    // Filesystems only for a campaign with disk-full faults: asked for, or left to the default.
    let disk_full_asked = args.kinds.contains(&FaultKind::DiskFull);
    let disks = match disk::unavailable() {
        None if disk_full_asked || args.kinds.is_empty() => Some(Disks::create(&data, args.brokers, DISK_BYTES)),
        None => None,
        Some(why) if disk_full_asked => Some(Err(anyhow::anyhow!("--kinds disk-full: {why}"))),
        Some(why) => {
            println!("disk-full faults left out: {why}");
            None
        }
    };
    let disks = match disks.transpose() {
        Ok(disks) => disks,
        Err(e) => {
            net.inspect(Network::remove);
            return Err(e);
        }
    };
    let sandbox = Arc::new(Sandbox { net, disks });
    // Dropped after the cluster (declared before it): the brokers have stopped by then.
    let _teardown = Teardown(sandbox.clone());
    {
        let sandbox = sandbox.clone();
        std::thread::spawn(move || {
            if let Some(signal) = signals.forever().next() {
                eprintln!("signal {signal}: removing the campaign's namespaces and filesystems");
                // The brokers die with this process (their parent-death signal); the namespaces' own
                // processes are killed as they go.
                sandbox.remove();
                std::process::exit(128 + signal);
            }
        });
    }

    let replicas = args.brokers.min(3) as i16;
    let min_insync = if replicas >= 3 { 2 } else { 1 };
    let kinds = kinds(args, &sandbox, replicas)?;
    let duration = args.duration.unwrap_or(Duration::from_secs(3) * args.faults as u32);
    let spec = PlanSpec {
        seed,
        brokers: args.brokers as u32,
        faults: args.faults,
        kinds,
        tolerance: (replicas - min_insync).max(1) as u32,
        beyond: args.beyond,
        shortest: Duration::from_secs(1),
        longest: Duration::from_secs(6),
        shortest_pause: shortest_pause(&args.settings),
        gap: duration * 2 / args.faults as u32,
    };
    let faults = plan::plan(&spec);

    let hosts: Vec<_> = sandbox
        .net
        .as_ref()
        .map_or_else(Vec::new, |net| (1..=args.brokers).map(|id| (net.addr(id), net.namespace(id))).collect());
    let secured = match args.security {
        Security::Plaintext => None,
        Security::SaslSsl => {
            let addresses: Vec<std::net::IpAddr> = (0..args.brokers)
                .map(|i| hosts.get(i).map_or(std::net::Ipv4Addr::LOCALHOST, |(ip, _)| *ip).into())
                .collect();
            Some(security::prepare(&out.join("certificates"), &addresses)?)
        }
    };
    let client = secured.as_ref().map_or_else(ClientSecurity::plaintext, |s| s.client.clone());
    let mut settings: Vec<String> = SETTINGS.iter().map(|s| s.to_string()).collect();
    settings.extend(secured.iter().flat_map(|s| s.settings.iter().cloned()));
    settings.extend(args.settings.iter().cloned());
    let mut cluster = Cluster::start_on(
        &ClusterArgs {
            brokers: args.brokers,
            base_port: if hosts.is_empty() { 0 } else { 9092 },
            quorum_base_port: None,
            metrics_base_port: None,
            data_dir: data.clone(),
            shards: None,
            shardlog: args.shardlog.clone(),
            settings,
            // Beside the report, not on a filesystem a fault fills.
            log_dir: Some(out.clone()),
            die_with_parent: true,
            broker_args: secured.iter().map(|s| s.broker_args.clone()).cycle().take(args.brokers).collect(),
            client_security: Some(client.clone()),
        },
        &hosts,
    )?;
    let bootstrap = cluster.bootstrap.clone();
    let mut admin = KafkaClient::connect_secured(&bootstrap, client.clone())?;
    admin.set_read_timeout(REQUEST_TIMEOUT)?;
    let configs = [("min.insync.replicas".to_string(), min_insync.to_string())];
    admin.create_topic(TOPIC, args.partitions, replicas, &configs)?;
    admin.led_layout(TOPIC)?;
    let transactional = match args.workload {
        Workload::Records => None,
        Workload::Transactions => {
            admin.create_topic(transform::OUTPUT, args.partitions, replicas, &configs)?;
            admin.led_layout(transform::OUTPUT)?;
            let rdkafka = secured.as_ref().map(|s| s.rdkafka.clone()).unwrap_or_default();
            Some(transform::Transactional::start(&bootstrap, &rdkafka, args.partitions, seed))
        }
    };

    let shared = Arc::new(Shared::new(client));
    let mut producers = Vec::new();
    for (id, delivery) in PRODUCERS {
        let spec = ProducerSpec { id, delivery, partitions: args.partitions, value_bytes: VALUE_BYTES, retries: true };
        let (shared, bootstrap) = (shared.clone(), bootstrap.clone());
        producers.push(std::thread::spawn(move || produce(&shared, &bootstrap, &spec)));
    }
    let consumer = {
        let (shared, bootstrap, partitions) = (shared.clone(), bootstrap.clone(), args.partitions);
        std::thread::spawn(move || consume(&shared, &bootstrap, partitions))
    };

    let mut timeline = String::new();
    let target = Target {
        cluster: &mut cluster,
        sandbox: &sandbox,
        admin: &mut admin,
        data: &data,
        partitions: args.partitions,
        replicas: replicas as usize,
    };
    let nemesis = carry_out(target, &faults, seed, args.beyond, shared.start, &mut timeline);
    let healed = nemesis.and_then(|started| {
        wait_for_full_isr(&mut admin, args.partitions, replicas as usize)?;
        Ok(started)
    });
    shared.stop.store(true, Ordering::Relaxed);
    let ended = shared.start.elapsed();
    for producer in producers {
        producer.join().expect("a producer thread")?;
    }
    consumer.join().expect("the consumer thread")?;
    let Nemesis { spans, kills } = healed?;
    let started: Vec<Duration> = spans.iter().map(|&(start, _)| start).collect();
    let transactions = transactional.map(|t| t.finish(&mut admin, args.partitions)).transpose()?;

    let end = final_state(&mut admin, &mut cluster, &data, args.partitions, replicas as usize)?;
    let history: Vec<(Duration, Event)> = std::mem::take(&mut *shared.history.lock().expect("history lock"));
    let events: Vec<Event> = history.iter().map(|(_, e)| e.clone()).collect();
    let deliveries: BTreeMap<u32, Delivery> = PRODUCERS.into_iter().collect();
    let verdict = check::check(&deliveries, &events, &end);
    let refused = shared.refused.lock().expect("refused lock").clone();
    // An idempotent producer refused for good (an out-of-order sequence, say) stopped: a finding.
    let idempotent_refused = refused.keys().filter(|(producer, _)| *producer == PRODUCERS[0].0).count();
    let mut failures = verdict.failures(args.beyond) + idempotent_refused;
    let transactions = transactions.map(|mut outcome| {
        outcome.history.inputs =
            end.log.iter().flat_map(|(&p, records)| records.iter().map(move |(&o, s)| ((p, o), s.checksum))).collect();
        let verdict = shardlog_bench::faults::txn_check::check(&outcome.history);
        failures += verdict.failures() + usize::from(outcome.undrained > 0);
        transform::render(&outcome, &verdict)
    });
    let mut report = report::render(
        args, seed, replicas, min_insync, &faults, &kills, &started, ended, &history, &verdict, failures, &refused,
        &timeline,
    );
    if let Some(section) = transactions {
        // Before the timeline, after the verdict.
        let at = report.find("\n## Timeline").unwrap_or(report.len());
        report.insert_str(at, &section);
    }
    let samples = std::mem::take(&mut *shared.samples.lock().expect("samples lock"));
    let shaded: Vec<(Duration, Duration, FaultKind)> =
        spans.iter().zip(&faults).map(|(&(start, end), f)| (start, end, f.kind)).collect();
    std::fs::create_dir_all(&out)?;
    // The brokers' filesystems hold their data and logs: kept after a failure, for a look.
    if let Some(disks) = &sandbox.disks {
        disks.remove();
        if failures == 0 {
            disks.discard();
        } else {
            println!("the brokers' data and logs are in {}/broker-<id>.img (mount -o loop)", data.display());
        }
    }
    std::fs::create_dir_all(&out)?;
    let path = out.join("report.md");
    std::fs::write(&path, &report).with_context(|| format!("write {}", path.display()))?;
    print!("{report}");
    // The verdict stands without the chart (it needs a font, say).
    if let Err(e) = faults_chart::write(&out, &samples, &shaded, ended) {
        eprintln!("the timeline chart was not drawn: {e:#}");
    }
    Ok(Outcome { failures, report: path })
}

/// The end of a run: once every replica has all the leader has, every partition's leader and high
/// watermark, then the cluster stopped and each replica read as its stopped broker holds it.
pub(crate) fn final_state(
    admin: &mut KafkaClient,
    cluster: &mut Cluster,
    data: &Path,
    partitions: i32,
    replicas: usize,
) -> Result<FinalState> {
    let brokers = cluster.bootstrap.split(',').count();
    let ids: BTreeMap<String, u32> = (1..=brokers).map(|b| (cluster.addr(b).to_string(), b as u32)).collect();
    wait_for_full_isr(admin, partitions, replicas)?;
    wait_for_caught_up(admin, partitions)?;
    let layout = admin.led_layout(TOPIC)?;
    let bounds = admin.offsets(TOPIC, partitions)?;
    let assigned = assignment(admin)?;
    cluster.stop()?;
    let mut end = FinalState::default();
    for p in 0..partitions {
        let partition = p as u32;
        end.high_watermark.insert(partition, bounds[p as usize].1 as u64);
        let leader = layout.leaders.get(&p).and_then(|addr| ids.get(addr)).copied().context("a leader")?;
        // Every replica the metadata assigns: one without the partition's log holds nothing of it.
        for &broker in assigned.get(&p).map(Vec::as_slice).unwrap_or_default() {
            let broker = broker as u32;
            let dir = data.join(format!("broker-{broker}"));
            let records = replica::read_replica(&dir, TOPIC, partition)?.unwrap_or_default();
            let copy: BTreeMap<u64, Stored> =
                records.into_iter().map(|r| (r.offset, stored(partition, r.offset, &r.value))).collect();
            if broker == leader {
                end.log.insert(partition, copy);
            } else {
                end.replicas.insert((broker, partition), copy);
            }
        }
    }
    Ok(end)
}

/// The record at `offset` of `partition` as the checker sees it.
pub(crate) fn stored(partition: u32, offset: u64, value: &[u8]) -> Stored {
    let tag = Origin::parse(value)
        .map_or(Tag { producer: u32::MAX, sequence: offset }, |o| Tag { producer: o.run as u32, sequence: o.sequence });
    Stored { partition, offset, tag, checksum: payload::hash(value) }
}

/// A pause outlasts the broker session and `replica.lag.time.max.ms` as the brokers run with them (the
/// campaign's own, or `--set` ones after), by a second for the quorum and the leaders to act.
fn shortest_pause(extra: &[String]) -> Duration {
    let setting = |key: &str| {
        let all: Vec<String> = SETTINGS.iter().map(|s| s.to_string()).chain(extra.iter().cloned()).collect();
        all.into_iter()
            .rev()
            .find_map(|s| {
                let (k, v) = s.split_once('=')?;
                if k.trim() == key { v.trim().parse::<u64>().ok() } else { None }
            })
            .unwrap_or(0)
    };
    let longest = setting("broker.session.timeout.ms").max(setting("replica.lag.time.max.ms"));
    Duration::from_millis(longest + 1000)
}

/// The fault kinds of this campaign: those asked for (`--kinds`), else every kind it can carry out.
/// Network faults need the namespaces (a split or one-way drop, other brokers), a full disk the
/// filesystems, and with one replica a torn segment loses what it held, beyond what such a topic survives.
fn kinds(args: &FaultsArgs, sandbox: &Sandbox, replicas: i16) -> Result<Vec<FaultKind>> {
    let why_not = |kind: FaultKind| match kind {
        FaultKind::KillAndTear if replicas < 2 && !args.beyond => Some("with one replica it loses what it held"),
        FaultKind::Split | FaultKind::OneWayDrop if args.brokers < 2 => Some("it needs other brokers"),
        FaultKind::DiskFull if sandbox.disks.is_none() => Some("loop-mounted filesystems are not available"),
        kind if kind.needs_network() && sandbox.net.is_none() => Some("the brokers are not in namespaces"),
        _ => None,
    };
    if args.kinds.is_empty() {
        return Ok(FaultKind::ALL.into_iter().filter(|&kind| why_not(kind).is_none()).collect());
    }
    for &kind in &args.kinds {
        if let Some(why) = why_not(kind) {
            bail!("--kinds {}: not in this campaign: {why}", kind.flag());
        }
    }
    let mut kinds = args.kinds.clone();
    kinds.sort();
    kinds.dedup();
    Ok(kinds)
}

/// What the nemesis works on.
struct Target<'a> {
    cluster: &'a mut Cluster,
    sandbox: &'a Sandbox,
    admin: &'a mut KafkaClient,
    data: &'a Path,
    partitions: i32,
    replicas: usize,
}

/// The nemesis: each fault started and healed at its time. Unless going `beyond`, a fault starts only once
/// every replica is back in sync after the previous ones (a broker still catching up counts as faulty),
/// and the rest of the plan moves later by the wait. Returns when each fault actually started and healed.
fn carry_out(
    target: Target<'_>,
    faults: &[Fault],
    seed: u64,
    beyond: bool,
    start: Instant,
    timeline: &mut String,
) -> Result<Nemesis> {
    let Target { cluster, sandbox, admin, data, partitions, replicas } = target;
    // (when, heal?, fault index): heals first at the same instant, so a broker is free before it is hit.
    let mut steps: Vec<(Duration, bool, usize)> =
        faults.iter().enumerate().flat_map(|(i, f)| [(f.start, false, i), (f.end(), true, i)]).collect();
    steps.sort_by_key(|&(at, heal, i)| (at, !heal, i));
    let mut rng = Rng::new(seed ^ 0x7EA2);
    let brokers = cluster.bootstrap.split(',').count();
    let mut delay = Duration::ZERO;
    let mut spans = vec![(Duration::ZERO, Duration::ZERO); faults.len()];
    // Brokers a kill fault holds down, or a full disk, right now: not started again meanwhile.
    let mut killed: BTreeSet<usize> = BTreeSet::new();
    let mut kills: BTreeMap<&'static str, usize> = BTreeMap::new();
    // Brokers whose durable data a tear has damaged once: a second time within the hour, a broker takes
    // its whole data dir offline (a failing disk), which the campaign does not heal.
    let mut rotted: BTreeSet<usize> = BTreeSet::new();
    for (at, heal, i) in steps {
        let due = at + delay;
        if let Some(wait) = due.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
        revive(cluster, &killed, plan::faulty_at(faults, at).len(), start, timeline)?;
        if !heal && !beyond {
            wait_for_full_isr(admin, partitions, replicas)?;
            delay += start.elapsed().saturating_sub(due);
        }
        let fault = &faults[i];
        if !heal {
            spans[i].0 = start.elapsed();
        }
        // Brokers that must be back in the metadata after a restart: those no other fault holds.
        let expected = brokers - plan::faulty_at(faults, at).len();
        let targets: Vec<u32> = fault.brokers.iter().copied().collect();
        let mut line = format!("{:>7.1} s  ", start.elapsed().as_secs_f64());
        let net = || sandbox.net.as_ref().context("a network fault without the namespaces");
        let disks = || sandbox.disks.as_ref().context("a disk-full fault without the filesystems");
        if fault.kind == FaultKind::Split && !heal {
            net()?.split(&targets.iter().map(|&b| b as usize).collect::<Vec<_>>())?;
        }
        for &b in &targets {
            let b = b as usize;
            match (fault.kind, heal) {
                (FaultKind::Kill | FaultKind::KillAndTear, false) => {
                    let role = role_of(admin, b);
                    *kills.entry(role).or_default() += 1;
                    let _ = write!(line, "({role}) ");
                    cluster.kill(b)?;
                }
                (FaultKind::Pause, false) => cluster.pause(b)?,
                (FaultKind::Isolate, false) => net()?.isolate(b)?,
                (FaultKind::Split, false) => {}
                (FaultKind::OneWayDrop, false) => net()?.one_way_drop(b)?,
                (FaultKind::Latency, false) => net()?.slow_link(b)?,
                (FaultKind::PacketLoss, false) => net()?.packet_loss(b)?,
                (FaultKind::DiskFull, false) => {
                    let filled = disks()?.fill(b)?;
                    let _ = write!(line, "(filled {} MiB) ", filled >> 20);
                }
                (FaultKind::Kill | FaultKind::KillAndTear, true) => cluster.restart(b, expected)?,
                (FaultKind::Pause, true) => cluster.resume(b)?,
                (FaultKind::DiskFull, true) => disks()?.free_up(b)?,
                (_, true) => net()?.heal(b)?,
            }
            // A killed broker comes back when its fault heals, one on a full disk once it has room.
            if matches!(fault.kind, FaultKind::Kill | FaultKind::KillAndTear | FaultKind::DiskFull) {
                if heal {
                    killed.remove(&b);
                } else {
                    killed.insert(b);
                }
            }
            if fault.kind == FaultKind::KillAndTear && !heal {
                let broker_data = data.join(format!("broker-{b}"));
                // A broker's first tear damages what it made durable: it must rebuild the replica from an
                // in-sync one by itself (the other replicas are whole: one fault at a time).
                let rot = !beyond && !rotted.contains(&b);
                let torn = match rot {
                    true => tear::rot(&broker_data, &mut rng)?,
                    false => None,
                };
                if torn.is_some() {
                    rotted.insert(b);
                }
                let torn = match torn {
                    Some(torn) => Some(torn),
                    None => tear::tear(&broker_data, &mut rng, TEAR_WINDOW, beyond)?,
                };
                if let Some(torn) = torn {
                    let _ = write!(line, "(tore {} at byte {}: {:?}) ", torn.segment.display(), torn.at, torn.damage);
                }
            }
        }
        if heal {
            spans[i].1 = start.elapsed();
        }
        let what = if heal { "heal" } else { "start" };
        let _ = writeln!(line, "{what} #{} {} on broker {targets:?}", i + 1, fault.kind.name());
        print!("{line}");
        timeline.push_str(&line);
    }
    revive(cluster, &killed, 0, start, timeline)?;
    Ok(Nemesis { spans, kills })
}

/// What the nemesis did: when each fault started and healed, and what the brokers it killed were.
struct Nemesis {
    spans: Vec<(Duration, Duration)>,
    kills: BTreeMap<&'static str, usize>,
}

/// What broker `id` is just before it is killed, by the metadata: the quorum's leader (the controller),
/// a leader of the campaign's partitions, or a follower of them only.
fn role_of(admin: &mut KafkaClient, id: usize) -> &'static str {
    let Ok(metadata) = admin.metadata(Some(&[TOPIC])) else { return "role unknown" };
    let leads = metadata.topics.iter().flat_map(|t| &t.partitions).any(|p| p.leader_id.0 == id as i32);
    match (metadata.controller_id.0 == id as i32, leads) {
        (true, true) => "quorum leader and partition leader",
        (true, false) => "quorum leader",
        (false, true) => "partition leader",
        (false, false) => "follower only",
    }
}

/// Starts again every broker that stopped by itself (as on a disk failure it cannot get past), as its
/// service manager would, and says so in the timeline; not those a kill fault or a full disk holds down
/// (a broker may not start on a full disk). `faulty` brokers may be missing from the metadata meanwhile.
fn revive(
    cluster: &mut Cluster,
    killed: &BTreeSet<usize>,
    faulty: usize,
    start: Instant,
    timeline: &mut String,
) -> Result<()> {
    let brokers = cluster.bootstrap.split(',').count();
    for b in (1..=brokers).filter(|b| !killed.contains(b)) {
        if let Some(status) = cluster.exited(b)? {
            let line =
                format!("{:>7.1} s  broker {b} had stopped ({status}): restarted\n", start.elapsed().as_secs_f64());
            print!("{line}");
            timeline.push_str(&line);
            cluster.restart(b, brokers - faulty.min(brokers - 1))?;
        }
    }
    Ok(())
}

/// Waits until every partition of the campaign's topic has a leader and all its replicas in sync, and
/// so has every other topic's (the transactional workload's output and the internal topics of its
/// groups and transactions): a fault must not meet a partition already short of a replica.
fn wait_for_full_isr(admin: &mut KafkaClient, partitions: i32, replicas: usize) -> Result<()> {
    let deadline = Instant::now() + HEAL_WAIT;
    loop {
        let full = admin.metadata(None).is_ok_and(|m| {
            let campaign = m.topics.iter().find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == TOPIC));
            campaign.is_some_and(|t| {
                t.partitions.len() == partitions as usize && t.partitions.iter().all(|p| p.isr_nodes.len() == replicas)
            }) && m
                .topics
                .iter()
                .flat_map(|t| &t.partitions)
                .all(|p| p.leader_id.0 >= 0 && p.isr_nodes.len() == p.replica_nodes.len())
        });
        if full {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the healed cluster did not bring every replica of {TOPIC} back in sync within {HEAL_WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits until every replica of every partition has the leader's whole log and the high watermark is at
/// its end (the workload has stopped).
fn wait_for_caught_up(admin: &mut KafkaClient, partitions: i32) -> Result<()> {
    let deadline = Instant::now() + HEAL_WAIT;
    loop {
        let assigned = assignment(admin)?;
        let mut by_broker: BTreeMap<i32, Vec<i32>> = BTreeMap::new();
        for (&p, replicas) in &assigned {
            for &b in replicas {
                by_broker.entry(b).or_default().push(p);
            }
        }
        let ends = admin.replica_log_ends(TOPIC, &by_broker);
        let bounds = admin.offsets(TOPIC, partitions)?;
        let caught_up = (0..partitions).all(|p| {
            let high_watermark = bounds[p as usize].1;
            assigned.get(&p).is_some_and(|replicas| {
                replicas.iter().all(|&b| ends.get(&(p, b)).is_some_and(|&end| end == high_watermark))
            })
        });
        if caught_up {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the replicas of {TOPIC} did not all reach the leader's log end within {HEAL_WAIT:?}");
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Each partition's replicas (broker ids) as the metadata assigns them.
fn assignment(admin: &mut KafkaClient) -> Result<BTreeMap<i32, Vec<i32>>> {
    let metadata = admin.metadata(Some(&[TOPIC]))?;
    let topic = metadata.topics.first().context("empty Metadata answer")?;
    Ok(topic.partitions.iter().map(|p| (p.partition_index, p.replica_nodes.iter().map(|b| b.0).collect())).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pause_outlasts_the_session_and_lag_time_the_brokers_run_with() {
        assert_eq!(shortest_pause(&[]), Duration::from_secs(4), "the campaign's 3 s session, and a second");
        let longer = ["broker.session.timeout.ms=9000".to_string()];
        assert_eq!(shortest_pause(&longer), Duration::from_secs(10), "a --set session counts");
        let lag = ["replica.lag.time.max.ms = 12000".to_string()];
        assert_eq!(shortest_pause(&lag), Duration::from_secs(13));
    }
}
