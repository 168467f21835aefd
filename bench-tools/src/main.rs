//! `shardlog-bench`: how we and our users measure shardlog.

use clap::{Parser, Subcommand};

mod storage_bench;

#[derive(Debug, Parser)]
#[command(name = "shardlog-bench", version, about = "Benchmarks for shardlog")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// The storage engine against the raw disk: sequential bandwidth and fdatasync latency, then durable
    /// log appends (throughput and latency) on the same disk, in one run.
    Storage(storage_bench::StorageArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Storage(args) => storage_bench::run(args),
    }
}
