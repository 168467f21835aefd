//! The `shardlog` command.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use shardlog_broker::config::{BrokerConfig, Sources};
use shardlog_broker::runtime::{self, Shutdown};
use shardlog_net::alloc::ReservingAllocator;

/// A request claiming a huge array must not abort the broker (see `shardlog_net::alloc`).
#[global_allocator]
static ALLOCATOR: ReservingAllocator = ReservingAllocator;

#[derive(Debug, Parser)]
#[command(name = "shardlog", version, about = "A durable, Kafka-compatible message broker")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run a broker. With no arguments: node 1 on 127.0.0.1:9092, data in ./data.
    Start(StartArgs),
    /// Manage topics over the Kafka protocol (works against any Kafka-compatible broker).
    Topic {
        #[command(subcommand)]
        command: TopicCommand,
    },
}

#[derive(Debug, Subcommand)]
enum TopicCommand {
    /// Create a topic.
    Create {
        name: String,
        #[arg(long)]
        partitions: i32,
        #[arg(long)]
        replication_factor: i16,
        /// A topic setting, KEY=VALUE with Kafka's names (repeatable).
        #[arg(long = "config", value_name = "KEY=VALUE")]
        configs: Vec<String>,
        #[arg(long, default_value = "127.0.0.1:9092")]
        bootstrap: String,
    },
    /// List topic names.
    List {
        #[arg(long, default_value = "127.0.0.1:9092")]
        bootstrap: String,
    },
    /// Show a topic's partitions (leader, replicas, ISR, log start and end offsets) and settings.
    Describe {
        name: String,
        #[arg(long, default_value = "127.0.0.1:9092")]
        bootstrap: String,
    },
    /// Delete a topic and its data.
    Delete {
        name: String,
        #[arg(long, default_value = "127.0.0.1:9092")]
        bootstrap: String,
    },
}

/// Every flag is a shorthand for a setting of the config file; `--set KEY=VALUE` reaches any of them.
#[derive(Debug, Args)]
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
    /// `metrics.listen`, HOST:PORT
    #[arg(long)]
    metrics_listen: Option<String>,
    /// Any setting, KEY=VALUE (repeatable); wins over the file and the flags above.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    set: Vec<String>,
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

fn main() -> Result<()> {
    shardlog_net::alloc::keep_request_buffers_in_the_heap();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Start(args) => start(args),
        Command::Topic { command } => topic(command),
    }
}

fn start(args: StartArgs) -> Result<()> {
    let config = BrokerConfig::load(&args.sources()).context("invalid settings")?;
    let shutdown = Shutdown::default();
    for signal in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(signal, shutdown.flag()).context("install signal handler")?;
    }
    tracing::info!(node = config.node_id, listener = %config.listener, shards = config.shards, "starting");
    runtime::run(config, shutdown)?;
    tracing::info!("stopped");
    Ok(())
}

fn topic(command: TopicCommand) -> Result<()> {
    use shardlog_broker::admin_cli::{self, AdminClient};
    match command {
        TopicCommand::Create { name, partitions, replication_factor, configs, bootstrap } => {
            let configs = configs
                .iter()
                .map(|c| {
                    c.split_once('=')
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .with_context(|| format!("--config {c:?} is not KEY=VALUE"))
                })
                .collect::<Result<Vec<_>>>()?;
            AdminClient::connect(&bootstrap)?.create_topic(&name, partitions, replication_factor, &configs)?;
            println!("Created topic {name}.");
        }
        TopicCommand::List { bootstrap } => print!("{}", admin_cli::list(&mut AdminClient::connect(&bootstrap)?)?),
        TopicCommand::Describe { name, bootstrap } => {
            print!("{}", admin_cli::describe(&mut AdminClient::connect(&bootstrap)?, &name)?)
        }
        TopicCommand::Delete { name, bootstrap } => {
            AdminClient::connect(&bootstrap)?.delete_topic(&name)?;
            println!("Deleted topic {name}.");
        }
    }
    Ok(())
}
