//! The `shardlog` command.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use shardlog_broker::client::KafkaClient;
use shardlog_broker::config::{BrokerConfig, Sources};
use shardlog_broker::runtime;
use shardlog_broker::shutdown::Shutdown;
use shardlog_net::alloc::ReservingAllocator;

mod security;

use security::{AclCommand, QuotaCommand, UserCommand};

/// A request claiming a huge array must not abort the broker (see `shardlog_net::alloc`).
#[global_allocator]
static ALLOCATOR: ReservingAllocator = ReservingAllocator;

#[derive(Debug, Parser)]
#[command(name = "shardlog", version = shardlog_broker::VERSION, about = "A durable, Kafka-compatible message broker")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a broker. With no arguments: node 1 on 127.0.0.1:9092, data in ./data.
    Start(StartArgs),
    /// Check the host before a broker's first start: kernel and io_uring, resource limits, kernel
    /// settings, the data dir's filesystem (direct I/O, not in memory, free space), the data disk's
    /// speed and the TLS listeners' certificates (a warning for each that expires within 30 days). Prints
    /// one row per check; exits non-zero when any fails.
    Check(CheckArgs),
    /// Run a standalone quorum voter (the replicated metadata controller).
    Quorum(QuorumArgs),
    /// Manage topics over the Kafka protocol (works against any Kafka-compatible broker).
    Topic {
        #[command(subcommand)]
        command: TopicCommand,
    },
    /// Manage consumer groups over the Kafka protocol: list, describe (lag per partition), delete,
    /// reset offsets.
    Group {
        #[command(subcommand)]
        command: GroupCommand,
    },
    /// Inspect and repair transactions over the Kafka protocol, as kafka-transactions.sh does: list,
    /// describe, describe-producers, abort, find-hanging.
    Transactions {
        #[command(subcommand)]
        command: TransactionsCommand,
    },
    /// Manage SCRAM users over the Kafka protocol (KIP-554): the password is salted here, and only the
    /// salted password reaches the broker.
    User {
        #[command(subcommand)]
        command: UserCommand,
    },
    /// Manage ACL bindings over the Kafka protocol, as kafka-acls does: who may do what on which
    /// topics, groups, transactional ids or the cluster.
    Acl {
        #[command(subcommand)]
        command: AclCommand,
    },
    /// Manage client quotas over the Kafka protocol (KIP-546), as kafka-configs does for users,
    /// client ids and IP addresses.
    Quota {
        #[command(subcommand)]
        command: QuotaCommand,
    },
    /// The broker's settings.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Repair a partition taken offline because its log is damaged (with the broker stopped): cut the
    /// log before an offset, moving everything cut into `<topic>-<partition>.cut.<n>` beside it.
    Repair(RepairArgs),
}

#[derive(Debug, Args)]
#[command(after_help = "A data dir that does not exist yet is not created: its nearest existing parent, where \
`start` would create it, is checked instead. The disk is measured for about 5 s, writing up to 1 GiB (at most \
half the free space above log.dir.min.free.bytes) into temporary files in the data dir, removed afterwards: run \
it before the first start or with the broker stopped.")]
struct CheckArgs {
    /// TOML settings file, as `start --config` takes it: `log.dirs`, `shards`, the limits and the listeners'
    /// certificate files are read from it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// `log.dirs` (default: `data`, as for `start`); wins over the file.
    #[arg(long)]
    data_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
struct RepairArgs {
    /// The broker's data dir.
    #[arg(long, default_value = "data")]
    data_dir: std::path::PathBuf,
    /// The partition, TOPIC-PARTITION (its directory name), as the broker's ERROR line names it.
    #[arg(long)]
    partition: String,
    /// The log is cut before the batch holding this offset (or before damage below it): the offset the
    /// ERROR line names is where the damage starts.
    #[arg(long)]
    truncate_at: u64,
}

#[derive(Debug, Subcommand)]
enum ConfigCommand {
    /// Every broker and topic setting with its default, unit and meaning.
    List,
    /// A settings file for --config with every broker setting commented out at its default.
    Sample,
}

#[derive(Debug, Subcommand)]
enum TopicCommand {
    /// Create a topic.
    Create {
        name: String,
        /// How many partitions (default: the cluster's `num.partitions`).
        #[arg(long)]
        partitions: Option<i32>,
        /// How many replicas each partition has, on as many brokers (default: the cluster's
        /// `default.replication.factor`).
        #[arg(long)]
        replication_factor: Option<i16>,
        /// Each partition's replicas, as kafka-topics.sh takes them: partitions separated by commas,
        /// brokers by colons, the first of each leading (`1:2,2:3,3:1`). Instead of the two above.
        #[arg(long, conflicts_with_all = ["partitions", "replication_factor"])]
        replica_assignment: Option<String>,
        /// A topic setting, KEY=VALUE with Kafka's names (repeatable).
        #[arg(long = "config", value_name = "KEY=VALUE")]
        configs: Vec<String>,
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
    /// List topic names.
    List {
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
    /// Show a topic's partitions (leader, replicas, ISR, log start offset and high watermark, each
    /// replica's log end, reassignments in progress) and settings.
    Describe {
        name: String,
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
    /// Move partitions to other brokers (AlterPartitionReassignments): the new replicas catch up and
    /// join the ISR, then the replicas left out are removed. `topic describe` shows the progress.
    Reassign {
        name: String,
        /// The new replicas of partitions 0, 1, ... in the form of `create --replica-assignment`
        /// (`2:3,3:1`: partition 0 to brokers 2 and 3 with 2 preferred, partition 1 to 3 and 1).
        #[arg(long, required_unless_present = "cancel")]
        replica_assignment: Option<String>,
        /// Cancel the topic's reassignments in progress: back to the replicas from before.
        #[arg(long, conflicts_with = "replica_assignment")]
        cancel: bool,
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
    /// Delete a topic and its data.
    Delete {
        name: String,
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
}

#[derive(Debug, Subcommand)]
enum GroupCommand {
    /// List the groups, NAME and STATE per line.
    List {
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
    /// Show a group's state, members and assignments, and per partition its committed offset, the log
    /// end offset and the lag.
    Describe {
        name: String,
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
    /// Delete a group without members, with its committed offsets.
    Delete {
        name: String,
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
    /// Set a group's committed offsets on every partition of a topic (the group must have no members).
    ResetOffsets {
        name: String,
        #[arg(long)]
        topic: String,
        #[command(flatten)]
        to: ResetTarget,
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
}

#[derive(Debug, Subcommand)]
enum TransactionsCommand {
    /// List the transactions every broker coordinates: id, coordinator, producer id and state.
    List {
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
    /// Show one transactional id at its coordinator: producer id and epoch, state, timeout, start time
    /// and the partitions in its transaction.
    Describe {
        #[arg(long)]
        transactional_id: String,
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
    /// Show what a partition's leader remembers of each producer, with the first offset of the
    /// transaction it has open there (-1 for none). LastTimestamp is the broker's clock at the last
    /// append (Kafka shows the last batch's own max timestamp).
    DescribeProducers {
        #[arg(long)]
        topic: String,
        #[arg(long)]
        partition: i32,
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
    /// Abort the open transaction on a partition that starts at an offset (see describe-producers or
    /// find-hanging): its ABORT marker is written at the partition's leader, as Kafka's
    /// Admin.abortTransaction does. Meant for hanging transactions, which their coordinator no longer ends.
    Abort {
        #[arg(long)]
        topic: String,
        #[arg(long)]
        partition: i32,
        #[arg(long)]
        start_offset: i64,
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
    /// Find hanging transactions: open on a partition, yet not held open there by their coordinator, or
    /// without an append for longer than transaction.max.timeout.ms. Either --broker-id (the partitions it
    /// leads) or --topic (with --partition, one of them).
    FindHanging {
        #[arg(long, required_unless_present = "topic", conflicts_with = "topic")]
        broker_id: Option<i32>,
        #[arg(long)]
        topic: Option<String>,
        #[arg(long, requires = "topic")]
        partition: Option<i32>,
        /// The cluster's `transaction.max.timeout.ms`.
        #[arg(long, default_value_t = shardlog_broker::admin_cli::transactions::DEFAULT_MAX_TRANSACTION_TIMEOUT_MS)]
        max_transaction_timeout_ms: i64,
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
}

/// Where `group reset-offsets` moves the offsets: one of the three.
#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct ResetTarget {
    /// To each partition's earliest offset.
    #[arg(long)]
    to_earliest: bool,
    /// To each partition's latest offset (its high watermark).
    #[arg(long)]
    to_latest: bool,
    /// To this offset, clamped to each partition's earliest and latest.
    #[arg(long, value_name = "OFFSET")]
    to_offset: Option<i64>,
}

/// Where the cluster is (any of its brokers), and how to reach it.
#[derive(Debug, Args)]
struct Bootstrap {
    /// Brokers to reach the cluster through, HOST:PORT[,HOST:PORT...]: the first that answers is used.
    #[arg(long = "bootstrap", env = shardlog_broker::client::BOOTSTRAP_ENV, default_value = shardlog_broker::client::DEFAULT_BOOTSTRAP)]
    list: String,
    /// Kafka client properties for a secured cluster (key=value lines): security.protocol, sasl.mechanism,
    /// sasl.username, sasl.password, ssl.ca.location, ssl.certificate.location, ssl.key.location,
    /// ssl.endpoint.identification.algorithm. Without it: plaintext.
    #[arg(long = "command-config", value_name = "FILE", env = shardlog_broker::client::COMMAND_CONFIG_ENV)]
    command_config: Option<PathBuf>,
}

impl Bootstrap {
    fn connect(&self) -> Result<KafkaClient> {
        let security = shardlog_broker::client::ClientSecurity::load(self.command_config.as_deref())?;
        KafkaClient::connect_secured(&self.list, security)
    }
}

#[derive(Debug, Args)]
struct QuorumArgs {
    /// This voter's id (one of those in --voters).
    #[arg(long)]
    node_id: u32,
    /// Where the Raft log, vote and snapshots live.
    #[arg(long)]
    data_dir: PathBuf,
    /// The quorum port, HOST:PORT.
    #[arg(long)]
    listen: String,
    /// Every voter, ID@HOST:PORT,... (1, 3 or 5); default: this one alone.
    #[arg(long)]
    voters: Option<String>,
    /// Take a snapshot after this many log entries (the log before it is then dropped).
    #[arg(long, default_value_t = 1000)]
    snapshot_after_entries: u64,
    /// `broker.session.timeout.ms`: a broker not heard from for this long is fenced.
    #[arg(long, default_value_t = 9000)]
    broker_session_timeout_ms: u64,
    /// `auto.leader.rebalance.enable`: while leading, move leadership back to preferred replicas.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    auto_leader_rebalance_enable: bool,
    /// `leader.imbalance.check.interval.seconds`: how often.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..))]
    leader_imbalance_check_interval_seconds: u64,
    /// `leader.imbalance.per.broker.percentage`: past which share of a broker's preferred partitions.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=100))]
    leader_imbalance_per_broker_percentage: u32,
    /// `cluster.ssl.keystore.location`: this voter's key and node certificate (CN=node-<id>), PEM; with
    /// the truststore, the quorum port takes only nodes that prove themselves with mutual TLS.
    #[arg(long)]
    cluster_ssl_keystore_location: Option<PathBuf>,
    /// `cluster.ssl.truststore.location`: the cluster's authority, PEM.
    #[arg(long)]
    cluster_ssl_truststore_location: Option<PathBuf>,
}

/// Every flag is a shorthand for a setting of the config file; `--set KEY=VALUE` reaches any of them.
#[derive(Debug, Args)]
#[command(after_help = "Every setting, with its default, unit and meaning: `shardlog config list`. \
The --config file and --set take the same keys (Kafka's names where Kafka has the setting).")]
struct StartArgs {
    /// TOML settings file (Kafka's broker setting names).
    #[arg(long)]
    config: Option<PathBuf>,
    /// `node.id`
    #[arg(long)]
    node_id: Option<u32>,
    /// `log.dirs`
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// `listeners`, HOST:PORT
    #[arg(long)]
    listen: Option<String>,
    /// `advertised.listeners`, HOST:PORT
    #[arg(long)]
    advertised_listener: Option<String>,
    /// `shards`: shard executors (default: number of CPUs)
    #[arg(long)]
    shards: Option<usize>,
    /// `controller.quorum.voters`, ID@HOST:PORT,...
    #[arg(long)]
    quorum_voters: Option<String>,
    /// `metrics.listen`, HOST:PORT: the Prometheus endpoint (GET /metrics, /health, /ready)
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Any setting, KEY=VALUE (repeatable); wins over the file and the flags above.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
    /// How log lines are written to stderr: `human`, or `json` (one object per line). RUST_LOG filters
    /// them by module, as `info,shardlog_broker::group=debug`.
    #[arg(long, value_enum, default_value_t = LogFormat::Human)]
    log_format: LogFormat,
    /// A SCRAM user added when this start forms the cluster (repeatable), as Kafka's `kafka-storage
    /// format --add-scram`: `SCRAM-SHA-256=[name=admin,password=admin-secret]`, optionally with
    /// `iterations=N` (4096 to 16384, default 4096). Ignored by later starts.
    #[arg(long = "add-scram", value_name = "MECHANISM=[name=N,password=P]")]
    add_scram: Vec<Secret>,
}

/// A flag's value that holds a password: never printed, not even by `Debug`.
#[derive(Clone)]
struct Secret(String);

impl std::str::FromStr for Secret {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(Secret(s.to_string()))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

impl StartArgs {
    fn sources(&self) -> Sources {
        let quoted = |v: &str| format!("{v:?}");
        let mut overrides = Vec::new();
        let mut push = |key: &str, value: Option<String>| {
            if let Some(v) = value {
                overrides.push(format!("{key}={v}"));
            }
        };
        push("node.id", self.node_id.map(|v| v.to_string()));
        push("log.dirs", self.data_dir.as_ref().map(|p| quoted(&p.to_string_lossy())));
        push("listeners", self.listen.as_deref().map(quoted));
        push("advertised.listeners", self.advertised_listener.as_deref().map(quoted));
        push("shards", self.shards.map(|v| v.to_string()));
        push("controller.quorum.voters", self.quorum_voters.as_deref().map(quoted));
        push("metrics.listen", self.metrics_listen.as_deref().map(quoted));
        overrides.extend(self.set.iter().cloned());
        Sources { file: self.config.clone(), overrides }
    }
}

use shardlog_broker::logging::LogFormat;

fn main() -> ExitCode {
    shardlog_net::alloc::keep_request_buffers_in_the_heap();
    let cli = Cli::parse();
    let format = match &cli.command {
        Command::Start(args) => args.log_format,
        _ => LogFormat::Human,
    };
    let outcome = shardlog_broker::logging::init(format).and_then(|()| run(cli.command));
    // Lines a slow stderr left queued are written before the process ends.
    shardlog_broker::logging::flush(std::time::Duration::from_secs(2));
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{}", shardlog_broker::exit::report(&error));
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::Start(args) => start(args),
        Command::Check(args) => check(&args),
        Command::Quorum(args) => quorum(args),
        Command::Topic { command } => topic(command),
        Command::Group { command } => group(command),
        Command::Transactions { command } => transactions(command),
        Command::User { command } => security::user(command),
        Command::Acl { command } => security::acl(command),
        Command::Quota { command } => security::quota(command),
        Command::Config { command: ConfigCommand::List } => {
            print!("{}", shardlog_broker::config::settings::render());
            Ok(())
        }
        Command::Config { command: ConfigCommand::Sample } => {
            print!("{}", shardlog_broker::config::settings::sample());
            Ok(())
        }
        Command::Repair(args) => repair(&args),
    }
}

fn check(args: &CheckArgs) -> Result<()> {
    use shardlog_broker::host_check::{self, Outcome};
    // As `start` turns --data-dir into the setting, so that the flag wins over the file.
    let overrides = args.data_dir.iter().map(|dir| format!("log.dirs={:?}", dir.to_string_lossy())).collect();
    let config = BrokerConfig::load(&Sources { file: args.config.clone(), overrides }).context("invalid settings")?;
    let rows = host_check::run(&config);
    print!("{}", host_check::render(&rows));
    let failed = rows.iter().filter(|r| r.outcome == Outcome::Fail).count();
    if failed > 0 {
        anyhow::bail!("{failed} check(s) failed: the broker cannot run safely on this host as configured");
    }
    Ok(())
}

fn repair(args: &RepairArgs) -> Result<()> {
    use shardlog_storage::TopicPartition;
    if TopicPartition::parse_dir_name(&args.partition).is_none() {
        anyhow::bail!("--partition {:?} is not TOPIC-PARTITION", args.partition);
    }
    let dir = args.data_dir.join(&args.partition);
    if !dir.is_dir() {
        anyhow::bail!("{} does not exist: no such partition in {}", dir.display(), args.data_dir.display());
    }
    // A running broker holds the lock; repairing under it would destroy what it writes.
    let _lock = runtime::lock_data_dir(&args.data_dir)?;
    let report = shardlog_storage::repair::truncate_at(&dir, shardlog_storage::Offset(args.truncate_at))
        .with_context(|| format!("repair {}", dir.display()))?;
    println!(
        "{}: log now ends at offset {} ({}); cut {} bytes of {} at byte {} and moved {} later segment(s) to {}",
        args.partition,
        report.log_end,
        report.cut_reason,
        report.cut_bytes,
        report.cut_segment.display(),
        report.cut_position,
        report.moved_segments,
        report.aside.display()
    );
    if report.continues_at > report.log_end {
        println!(
            "the log continues at offset {}: offsets {} to {} named records before the cut and are never used again",
            report.continues_at,
            report.log_end,
            report.continues_at.0 - 1
        );
    } else {
        println!("the log continues at offset {}", report.continues_at);
    }
    println!("start the broker again: the partition is served from what was kept");
    Ok(())
}

fn start(args: StartArgs) -> Result<()> {
    let mut config = BrokerConfig::load(&args.sources()).context("invalid settings")?;
    let add_scram: Vec<String> = args.add_scram.iter().map(|s| s.0.clone()).collect();
    config.bootstrap_scram = shardlog_broker::quorum::bootstrap::parse_all(&add_scram)?;
    let shutdown = Shutdown::default();
    shutdown.on_signals().context("install signal handler")?;
    tracing::info!(node = config.node_id, listener = %config.listener, shards = config.shards, "starting");
    runtime::run(config, shutdown)?;
    tracing::info!("stopped");
    Ok(())
}

/// `--replica-assignment 1:2,2:3`: one list of broker ids per partition.
fn replica_assignment_arg(text: &str) -> Result<Vec<Vec<i32>>> {
    text.split(',')
        .map(|partition| {
            partition
                .split(':')
                .map(|id| {
                    id.trim()
                        .parse::<i32>()
                        .with_context(|| format!("--replica-assignment {text:?}: {id:?} is not a broker id"))
                })
                .collect()
        })
        .collect()
}

fn quorum(args: QuorumArgs) -> Result<()> {
    use shardlog_broker::quorum::service::{LeaderRebalance, Voter, VoterSettings};
    let listen: std::net::SocketAddr = args.listen.parse().with_context(|| format!("--listen {}", args.listen))?;
    let voters = match &args.voters {
        Some(text) => shardlog_broker::config::voters("--voters", text)?
            .into_iter()
            .map(|v| (v.id as u64, format!("{}:{}", v.host, v.port)))
            .collect(),
        None => vec![(args.node_id as u64, args.listen.clone())],
    };
    if !voters.iter().any(|(id, _)| *id == args.node_id as u64) {
        anyhow::bail!("--node-id {} is not one of the voters", args.node_id);
    }
    let tls = shardlog_broker::config::ClusterTlsSettings {
        keystore: args.cluster_ssl_keystore_location,
        truststore: args.cluster_ssl_truststore_location,
    };
    let cluster_tls =
        shardlog_broker::security::cluster_tls::ClusterTls::load(&tls, args.node_id).context("cluster mTLS")?;
    let shutdown = Shutdown::default();
    shutdown.on_signals().context("install signal handler")?;
    let mut settings = VoterSettings::new(args.node_id as u64, args.data_dir, listen, voters);
    settings.snapshot_after_entries = args.snapshot_after_entries.max(1);
    settings.session_timeout_ms = args.broker_session_timeout_ms.clamp(1, i64::MAX as u64) as i64;
    settings.leader_rebalance = args.auto_leader_rebalance_enable.then_some(LeaderRebalance {
        interval: std::time::Duration::from_secs(args.leader_imbalance_check_interval_seconds),
        imbalance_percent: args.leader_imbalance_per_broker_percentage,
    });
    settings.cluster_tls = cluster_tls.clone();
    shardlog_broker::security::reload::watch_certificates(Vec::new(), cluster_tls, shutdown.clone())?;
    let voter = Voter::start(settings).context("start the quorum voter")?;
    tracing::info!(node = args.node_id, %listen, "quorum voter running");
    while !shutdown.is_triggered() {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    voter.stop();
    tracing::info!("stopped");
    Ok(())
}

fn group(command: GroupCommand) -> Result<()> {
    use shardlog_broker::admin_cli::groups::{self, ResetTo};
    match command {
        GroupCommand::List { bootstrap } => print!("{}", groups::list(&mut bootstrap.connect()?)?),
        GroupCommand::Describe { name, bootstrap } => print!("{}", groups::describe(&mut bootstrap.connect()?, &name)?),
        GroupCommand::Delete { name, bootstrap } => {
            bootstrap.connect()?.delete_group(&name)?;
            println!("Deleted group {name}.");
        }
        GroupCommand::ResetOffsets { name, topic, to, bootstrap } => {
            let to = match (to.to_earliest, to.to_latest, to.to_offset) {
                (true, _, _) => ResetTo::Earliest,
                (_, true, _) => ResetTo::Latest,
                (_, _, Some(offset)) => ResetTo::Offset(offset),
                _ => unreachable!("clap asks for one of --to-earliest, --to-latest, --to-offset"),
            };
            print!("{}", groups::reset_offsets(&mut bootstrap.connect()?, &name, &topic, to)?);
        }
    }
    Ok(())
}

fn transactions(command: TransactionsCommand) -> Result<()> {
    use shardlog_broker::admin_cli::transactions::{self, Scope};
    let out = match command {
        TransactionsCommand::List { bootstrap } => transactions::list(&mut bootstrap.connect()?)?,
        TransactionsCommand::Describe { transactional_id, bootstrap } => {
            transactions::describe(&mut bootstrap.connect()?, &transactional_id)?
        }
        TransactionsCommand::DescribeProducers { topic, partition, bootstrap } => {
            transactions::describe_producers(&mut bootstrap.connect()?, &topic, partition)?
        }
        TransactionsCommand::Abort { topic, partition, start_offset, bootstrap } => {
            transactions::abort(&mut bootstrap.connect()?, &topic, partition, start_offset)?
        }
        TransactionsCommand::FindHanging { broker_id, topic, partition, max_transaction_timeout_ms, bootstrap } => {
            let scope = match (broker_id, topic) {
                (_, Some(topic)) => Scope::Topic(topic, partition),
                (Some(broker), None) => Scope::Broker(broker),
                (None, None) => unreachable!("clap asks for --broker-id or --topic"),
            };
            let now_ms =
                std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64);
            transactions::find_hanging(&mut bootstrap.connect()?, &scope, max_transaction_timeout_ms, now_ms)?
        }
    };
    print!("{out}");
    Ok(())
}

/// Kafka's NO_REASSIGNMENT_IN_PROGRESS.
const NO_REASSIGNMENT_IN_PROGRESS: i16 = 85;

fn topic(command: TopicCommand) -> Result<()> {
    use shardlog_broker::admin_cli;
    match command {
        TopicCommand::Create { name, partitions, replication_factor, replica_assignment, configs, bootstrap } => {
            let configs = configs
                .iter()
                .map(|c| {
                    c.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .with_context(|| format!("--config {c:?} is not KEY=VALUE"))
                })
                .collect::<Result<Vec<_>>>()?;
            let mut client = bootstrap.connect()?;
            match replica_assignment {
                Some(text) => client.create_topic_assigned(&name, &replica_assignment_arg(&text)?, &configs)?,
                // -1: the cluster's default, as kafka-topics.sh sends it (KIP-464).
                None => {
                    client.create_topic(&name, partitions.unwrap_or(-1), replication_factor.unwrap_or(-1), &configs)?
                }
            }
            println!("Created topic {name}.");
        }
        TopicCommand::List { bootstrap } => print!("{}", admin_cli::list(&mut bootstrap.connect()?)?),
        TopicCommand::Describe { name, bootstrap } => {
            print!("{}", admin_cli::describe(&mut bootstrap.connect()?, &name)?)
        }
        TopicCommand::Reassign { name, replica_assignment, cancel, bootstrap } => {
            let mut client = bootstrap.connect()?;
            let targets: Vec<(i32, Option<Vec<i32>>)> = match replica_assignment {
                Some(text) => {
                    let lists = replica_assignment_arg(&text)?;
                    lists.into_iter().enumerate().map(|(i, replicas)| (i as i32, Some(replicas))).collect()
                }
                None => {
                    debug_assert!(cancel, "clap asks for --replica-assignment without --cancel");
                    let partitions = client.layout(&name)?.partitions;
                    let ongoing = client.reassignments(&name, &(0..partitions).collect::<Vec<_>>())?;
                    ongoing.keys().map(|&p| (p, None)).collect()
                }
            };
            if targets.is_empty() {
                println!("No reassignment of topic {name} is in progress.");
                return Ok(());
            }
            // A move that completed since it was listed has nothing left to cancel: that is no failure.
            let refused: Vec<String> = (client.reassign(&name, &targets)?.into_iter())
                .filter(|r| !(cancel && r.code == NO_REASSIGNMENT_IN_PROGRESS))
                .map(|r| r.to_string())
                .collect();
            if !refused.is_empty() {
                anyhow::bail!("reassign {name}: {}", refused.join("; "));
            }
            let verb = if cancel { "Cancelled the reassignment of" } else { "Reassigning" };
            println!("{verb} {} partition(s) of topic {name}.", targets.len());
        }
        TopicCommand::Delete { name, bootstrap } => {
            bootstrap.connect()?.delete_topic(&name)?;
            println!("Deleted topic {name}.");
        }
    }
    Ok(())
}
