//! `shardlog-bench`: how we and our users measure shardlog. The load generators speak the Kafka
//! protocol, so every figure can be taken against shardlog or any other Kafka-compatible broker.

use clap::{Parser, Subcommand};

mod audit;
mod authorizer_bench;
mod campaign;
mod compaction_bench;
use shardlog_bench::cluster;
mod consume;
mod faults_chart;
mod groups_bench;
mod loopback;
mod payload;
mod probe;
mod produce;
mod quorum_bench;
mod rebalance_bench;
mod report;
mod scenario5;
mod stats;
mod storage_bench;
mod tps_table;

#[derive(Debug, Parser)]
#[command(name = "shardlog-bench", version = shardlog_broker::VERSION, about = "Benchmarks for shardlog and any Kafka-compatible broker")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Produce load: the seed's sync mode (one message per request, one request per partition at a time)
    /// or pipelined batches (async); messages/s, MB/s, latency percentiles, errors by Kafka code.
    Produce(produce::ProduceArgs),
    /// Consume a topic as fast as it is served: messages/s, MB/s, end-to-end latency.
    Consume(consume::ConsumeArgs),
    /// Check a topic against the acknowledged records `produce --record` wrote down.
    Audit(audit::AuditArgs),
    /// The seed's TPS tables (scenarios 1-5), ours beside the seed's Kafka figures, with a report folder.
    TpsTable(tps_table::TpsArgs),
    /// Run local shardlog brokers on loopback until Ctrl-C.
    Cluster(cluster::ClusterArgs),
    /// The storage engine against the raw disk: sequential bandwidth and fdatasync latency, then durable
    /// log appends (throughput and latency) on the same disk, in one run.
    Storage(storage_bench::StorageArgs),
    /// The host's own floor, no broker involved: loopback TCP round trips as a sync producer makes them
    /// (across cores and on one core) and one stream's bandwidth.
    Loopback(loopback::LoopbackArgs),
    /// The metadata quorum with real voter processes: commit rate, and time from killing the Raft leader
    /// to the next committed command.
    Quorum(quorum_bench::QuorumArgs),
    /// A fault campaign: a local cluster under producers and a consumer while a seeded nemesis kills,
    /// tears and pauses its brokers; then every acknowledged record is checked. Exits non-zero on a loss.
    Faults(campaign::FaultsArgs),
    /// Consumer groups: offset commits per second from the members of one group, and how long a group
    /// takes to settle (and its members pause) when a member joins.
    Groups(groups_bench::GroupsArgs),
    /// A member joins a group of real librdkafka consumers: the classic protocol (cooperative-sticky)
    /// against the consumer protocol of KIP-848, how long until settled and how long members pause.
    Rebalance(rebalance_bench::RebalanceArgs),
    /// Produce latency to a compacted topic while its cleaner works, beside a topic that is not compacted.
    Compaction(compaction_bench::CompactionArgs),
    /// What a hostile client can make a broker hold: partial frames, slowloris, large requests; the
    /// broker's memory and an ordinary client's answers meanwhile.
    Probe(probe::ProbeArgs),
    /// What an authorization decision costs with 10,000 ACLs in force against none: single decisions,
    /// the request gate for a Produce, and rebuilding the ACL index.
    Authorizer(authorizer_bench::AuthorizerArgs),
}

fn main() -> std::process::ExitCode {
    shardlog_net::alloc::keep_request_buffers_in_the_heap();
    match run(Cli::parse().command) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // An expected error: its message and causes, never a backtrace (see `shardlog_broker::exit`).
            eprintln!("{}", shardlog_broker::exit::report(&error));
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Produce(args) => print!("{}", produce::run(&args)?.report()),
        Command::Consume(args) => {
            let result = consume::run(&args)?;
            print!("{}", result.report());
            if let Some(why) = result.gave_up {
                eprintln!("Error: {why}");
                std::process::exit(1);
            }
        }
        Command::Audit(args) => {
            let report = audit::run(&args)?;
            print!("{}", report.render());
            if !report.passed() {
                std::process::exit(1);
            }
        }
        Command::TpsTable(args) => {
            let out = tps_table::run(&args)?;
            println!("\nreport: {}", out.display());
        }
        Command::Cluster(args) => cluster::run(&args)?,
        Command::Storage(args) => storage_bench::run(args)?,
        Command::Loopback(args) => loopback::run(&args)?,
        Command::Quorum(args) => quorum_bench::run(&args)?,
        Command::Probe(args) => probe::run(&args)?,
        Command::Authorizer(args) => authorizer_bench::run(&args)?,
        Command::Groups(args) => print!("{}", groups_bench::run(&args)?.render()),
        Command::Rebalance(args) => print!("{}", rebalance_bench::run(&args)?.render()),
        Command::Compaction(args) => print!("{}", compaction_bench::run(&args)?.render()),
        Command::Faults(args) => {
            let outcome = campaign::run(&args)?;
            println!("report: {}", outcome.report.display());
            if outcome.failures > 0 {
                std::process::exit(1);
            }
        }
    }
    Ok(())
}
