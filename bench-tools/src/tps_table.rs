//! `shardlog-bench tps-table`: the seed's benchmark (document 003, section 4) against shardlog or any
//! Kafka-compatible broker, each table printed in the seed's layout with three more columns: the seed's
//! Kafka TPS, ours, and the ratio.
//!
//! Every row produces 1 KiB messages in the seed's `sync` mode from one producer to a fresh topic with
//! the row's partitions, replication factor, `min.insync.replicas` and acks, for `--duration`. Rows that
//! need more brokers than the cluster has are printed as "needs N brokers", not skipped. `--flush`
//! chooses what an acknowledgement means: `always` (shardlog's default: fdatasync'ed) or `interval`
//! (Kafka's: `flush.messages` and `flush.ms` set to never, the page-cache semantics of the seed's runs).
//! Scenario 5 kills brokers while sending, so it runs only with `--local`, on 4-broker clusters of its own
//! (see `scenario5`), and prints its own table.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use shardlog_broker::client::KafkaClient;

use crate::produce::{self, Mode, ProduceArgs};
use crate::report;
use crate::stats::{self, Tally};
use shardlog_bench::cluster::{Cluster, ClusterArgs};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Flush {
    /// Acknowledged means fdatasync'ed (shardlog's default).
    Always,
    /// Kafka's page-cache acknowledgement: topics get flush.messages and flush.ms of "never".
    Interval,
}

/// Options of `shardlog-bench tps-table`.
#[derive(Debug, Clone, clap::Args)]
pub struct TpsArgs {
    /// 1, 2, 3, 4, 5 or all.
    #[arg(long, default_value = "all")]
    pub scenario: String,
    /// Measure this cluster: brokers HOST:PORT[,HOST:PORT...] (default: $SHARDLOG_BOOTSTRAP, unless --local).
    #[arg(long, conflicts_with = "local")]
    pub bootstrap: Option<String>,
    /// Start a local cluster to measure (see `cluster`), with as many brokers as the largest replication
    /// factor of the chosen scenarios' rows (4 for all of them).
    #[arg(long)]
    pub local: bool,
    /// How long each row sends.
    #[arg(long, default_value = "10s", value_parser = stats::duration)]
    pub duration: Duration,
    /// The report folder (default: bench-reports/tps-<local date>-<time>).
    #[arg(long)]
    pub out: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = Flush::Always)]
    pub flush: Flush,
    /// Shards of each local broker (with --local).
    #[arg(long)]
    pub shards: Option<usize>,
    /// The shardlog binary for --local.
    #[arg(long)]
    pub shardlog: Option<PathBuf>,
    /// Extra `KEY=VALUE` settings for the --local broker (named in the report).
    #[arg(long = "set", value_name = "KEY=VALUE", requires = "local")]
    pub settings: Vec<String>,
}

/// The fewest records a row must have acknowledged for its figures to mean something: below it the rate
/// is a handful of round trips and p99.9 is the slowest record or two, so the report says the run was too
/// short for the row instead of passing the figures off as a measurement.
pub const MIN_RECORDS_PER_ROW: u64 = 1_000;

/// One row of a seed table.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    pub scenario: u8,
    pub partitions: i32,
    pub replicas: i16,
    /// `None` where the seed prints N/A (acks 0 and 1 in scenario 1).
    pub min_insync: Option<i16>,
    pub acks: i16,
    /// The seed's Kafka figure, where the seed has one.
    pub seed_tps: Option<f64>,
}

/// What a row came to.
#[derive(Debug, Clone)]
pub enum Outcome {
    Measured { tally: Tally, elapsed: Duration },
    Needs { brokers: usize },
    Failed(String),
}

impl Outcome {
    pub fn tps(&self) -> Option<f64> {
        match self {
            Outcome::Measured { tally, elapsed } => Some(tally.messages_per_sec(*elapsed)),
            _ => None,
        }
    }
}

fn row(scenario: u8, partitions: i32, replicas: i16, min_insync: Option<i16>, acks: i16, seed: Option<f64>) -> Row {
    Row { scenario, partitions, replicas, min_insync, acks, seed_tps: seed }
}

/// The seed's tables, row for row (scenario 4's figures did not survive in the seed: no seed column).
pub fn scenario_rows(scenario: u8) -> Vec<Row> {
    match scenario {
        1 => vec![
            row(1, 12, 1, Some(1), -1, Some(28511.3)),
            row(1, 12, 2, Some(1), -1, Some(22359.5)),
            row(1, 12, 2, Some(2), -1, Some(22927.4)),
            row(1, 12, 4, Some(1), -1, Some(16193.9)),
            row(1, 12, 4, Some(2), -1, Some(16599.9)),
            row(1, 12, 4, Some(4), -1, Some(16680.3)),
            row(1, 12, 1, None, 0, Some(45353.8)),
            row(1, 12, 2, None, 0, Some(46426.5)),
            row(1, 12, 4, None, 0, Some(46764.2)),
            row(1, 12, 1, None, 1, Some(33950.3)),
            row(1, 12, 2, None, 1, Some(32192.2)),
            row(1, 12, 4, None, 1, Some(32275.9)),
        ],
        2 => vec![
            row(2, 1, 2, Some(1), -1, Some(9738.8)),
            row(2, 1, 2, Some(2), -1, Some(9701.6)),
            row(2, 1, 3, Some(1), -1, Some(8999.7)),
            row(2, 1, 3, Some(2), -1, Some(9243.1)),
            row(2, 1, 4, Some(1), -1, Some(9005.8)),
            row(2, 1, 4, Some(2), -1, Some(8216.9)),
            row(2, 1, 4, Some(4), -1, Some(9092.4)),
        ],
        3 => vec![
            row(3, 1, 1, Some(1), 0, Some(76696.0)),
            row(3, 1, 2, Some(1), 0, Some(57503.0)),
            row(3, 1, 4, Some(1), 0, Some(59367.0)),
            row(3, 1, 1, Some(1), 1, Some(19489.0)),
            row(3, 1, 2, Some(1), 1, Some(20404.0)),
            row(3, 1, 4, Some(1), 1, Some(18365.0)),
            row(3, 1, 1, Some(1), -1, Some(18641.0)),
            row(3, 1, 2, Some(1), -1, Some(9739.0)),
            row(3, 1, 4, Some(1), -1, Some(9006.0)),
        ],
        4 => [1, 2, 4, 8, 12].into_iter().map(|p| row(4, p, 2, Some(2), -1, None)).collect(),
        _ => Vec::new(),
    }
}

/// A measured table, ready for the report.
#[derive(Debug, Clone)]
pub struct Table {
    pub scenario: u8,
    pub title: String,
    pub rows: Vec<(Row, Outcome)>,
    /// A table of its own layout, in markdown, instead of rows (scenario 5).
    pub text: Option<String>,
}

/// Refuses a flag that would change nothing (before anything runs), as `produce` does: `--shards` and
/// `--shardlog` shape the brokers this tool starts, so without `--local` there are none to shape.
fn refuse_ignored_flags(args: &TpsArgs) -> Result<()> {
    if !args.local {
        let given = [("--shards", args.shards.is_some()), ("--shardlog", args.shardlog.is_some())];
        if let Some((flag, _)) = given.iter().find(|(_, given)| *given) {
            bail!(
                "{flag} applies to --local (the brokers this tool starts; a cluster given by --bootstrap runs as it was started)"
            );
        }
    }
    Ok(())
}

pub fn run(args: &TpsArgs) -> Result<PathBuf> {
    refuse_ignored_flags(args)?;
    let scenarios: Vec<u8> = match args.scenario.as_str() {
        "all" => vec![1, 2, 3, 4, 5],
        s => vec![
            s.parse().ok().filter(|n| (1..=5).contains(n)).with_context(|| format!("scenario {s:?}: 1-5 or all"))?,
        ],
    };
    let out = args.out.clone().unwrap_or_else(default_out);
    let mut local = None;
    let largest = scenarios.iter().flat_map(|s| scenario_rows(*s)).map(|r| r.replicas as usize).max();
    let bootstrap = match (&args.bootstrap, args.local) {
        (Some(b), false) => b.clone(),
        // Scenario 5 alone starts clusters of its own.
        (None, true) if largest.is_none() => String::new(),
        (None, true) => {
            let cluster = Cluster::start(&ClusterArgs {
                brokers: largest.unwrap_or(1),
                base_port: 0,
                quorum_base_port: None,
                metrics_base_port: None,
                data_dir: out.join("cluster"),
                shards: args.shards,
                shardlog: args.shardlog.clone(),
                settings: args.settings.clone(),
                log_dir: None,
                die_with_parent: false,
                broker_args: Vec::new(),
                client_security: None,
            })?;
            let bootstrap = cluster.bootstrap.clone();
            local = Some(cluster);
            bootstrap
        }
        (None, false) => match std::env::var(shardlog_broker::client::BOOTSTRAP_ENV) {
            Ok(list) if !list.trim().is_empty() => list,
            _ => bail!("give --bootstrap HOST:PORT[,...] (or set $SHARDLOG_BOOTSTRAP) or --local"),
        },
        (Some(_), true) => unreachable!("clap refuses --bootstrap with --local"),
    };
    let brokers = match largest {
        Some(_) => KafkaClient::connect(&bootstrap)?.metadata(None)?.brokers.len(),
        None => crate::scenario5::BROKERS,
    };
    let run_id = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let measured_rows: usize =
        scenarios.iter().flat_map(|s| scenario_rows(*s)).filter(|r| r.replicas as usize <= brokers).count();
    let progress = indicatif::ProgressBar::new(measured_rows as u64 * args.duration.as_secs().max(1));
    progress.set_style(
        indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:40}] {pos}/{len} s  {msg}")
            .expect("a valid template"),
    );
    let mut tables = Vec::new();
    for scenario in scenarios {
        if scenario == 5 {
            // It kills brokers, so it runs on clusters of its own, which only --local lets it start.
            let text = if args.local {
                progress.set_message("scenario 5: killing brokers");
                crate::scenario5::run(args.duration, args.shards, args.shardlog.as_deref(), &out)?
            } else {
                "Not run: scenario 5 kills brokers, so it runs on clusters the tool starts itself: run with --local.\n"
                    .to_string()
            };
            let title = "Scenario 5: brokers killed while sending (replicas 4, min.insync.replicas 2, acks=all)".into();
            tables.push(Table { scenario, title, rows: Vec::new(), text: Some(text) });
            continue;
        }
        let mut rows = Vec::new();
        for (i, r) in scenario_rows(scenario).into_iter().enumerate() {
            let outcome = if r.replicas as usize > brokers {
                Outcome::Needs { brokers: r.replicas as usize }
            } else {
                progress.set_message(format!("scenario {scenario} row {}", i + 1));
                let topic = format!("tps-s{scenario}-{i}-{run_id}");
                let outcome = measure(&bootstrap, &topic, &r, args, &progress);
                let _ = KafkaClient::connect(&bootstrap).and_then(|mut a| a.delete_topic(&topic));
                outcome
            };
            rows.push((r, outcome));
        }
        tables.push(Table { scenario, title: title(scenario), rows, text: None });
    }
    progress.finish_and_clear();
    let flush = match args.flush {
        Flush::Always => "acknowledged = fdatasync'ed (--flush always)",
        Flush::Interval => "acknowledged = written, synced by Kafka's interval policy (--flush interval)",
    };
    let conditions = match args.settings.as_slice() {
        [] => flush.to_string(),
        settings => format!("{flush}; broker settings {}", settings.join(" ")),
    };
    report::write(&out, &tables, &conditions, brokers)?;
    drop(local);
    Ok(out)
}

fn title(scenario: u8) -> String {
    match scenario {
        1 => "Scenario 1: 12 partitions, replicas x min.insync.replicas x acks".into(),
        2 => "Scenario 2: 1 partition, acks=all, replicas x min.insync.replicas".into(),
        3 => "Scenario 3: 1 partition, min.insync.replicas=1, replicas x acks".into(),
        4 => "Scenario 4: partitions, replicas=2, min.insync.replicas=2, acks=all".into(),
        _ => format!("Scenario {scenario}"),
    }
}

fn measure(bootstrap: &str, topic: &str, r: &Row, args: &TpsArgs, progress: &indicatif::ProgressBar) -> Outcome {
    let mut configs: Vec<(String, String)> = Vec::new();
    if let Some(m) = r.min_insync {
        configs.push(("min.insync.replicas".into(), m.to_string()));
    }
    if args.flush == Flush::Interval {
        configs.push(("flush.messages".into(), i64::MAX.to_string()));
        configs.push(("flush.ms".into(), i64::MAX.to_string()));
    }
    let created =
        KafkaClient::connect(bootstrap).and_then(|mut a| a.create_topic(topic, r.partitions, r.replicas, &configs));
    if let Err(e) = created {
        return Outcome::Failed(format!("create topic: {e:#}"));
    }
    let produce = ProduceArgs {
        bootstrap: bootstrap.to_string(),
        command_config: None,
        topic: topic.to_string(),
        // Created above, with the row's settings.
        create: false,
        partitions: None,
        replication_factor: None,
        min_insync: None,
        acks: r.acks,
        message_size: 1024,
        mode: Mode::Sync,
        in_flight: None,
        batch_bytes: None,
        rate: None,
        linger_ms: None,
        // The seed's Kafka 0.10 producer did not retry (`retries` defaulted to 0 then).
        retries: 0,
        delivery_timeout_ms: 120_000,
        compression: "none".into(),
        messages: None,
        duration: Some(args.duration),
        record: None,
        quiet: true,
        idempotence: false,
        transactional: false,
        txn_records: None,
        transactional_id: None,
    };
    let ticker = {
        let (progress, seconds) = (progress.clone(), args.duration.as_secs());
        std::thread::spawn(move || {
            for _ in 0..seconds {
                std::thread::sleep(Duration::from_secs(1));
                progress.inc(1);
            }
        })
    };
    let outcome = match produce::run(&produce) {
        Ok(result) => Outcome::Measured { tally: result.tally, elapsed: result.elapsed },
        Err(e) => Outcome::Failed(format!("{e:#}")),
    };
    let _ = ticker.join();
    outcome
}

/// `bench-reports/tps-<local date>-<time>`, e.g. `tps-2026-11-30-142501`.
fn default_out() -> PathBuf {
    PathBuf::from("bench-reports").join(format!("tps-{}", local_timestamp()))
}

/// The local date and time, `YYYY-MM-DD-HHMMSS`.
fn local_timestamp() -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let now = now as libc::time_t;
    // SAFETY: tm is a plain C struct of integers (and a pointer localtime_r sets), valid when zeroed.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: localtime_r(3) with pointers to a live time_t and tm; it only writes the tm.
    if unsafe { libc::localtime_r(&now, &mut tm) }.is_null() {
        return now.to_string();
    }
    format!(
        "{:04}-{:02}-{:02}-{:02}{:02}{:02}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn report_folders_are_named_by_local_date_and_time() {
        let folder = super::default_out();
        let name = folder.file_name().unwrap().to_str().unwrap();
        let stamp = name.strip_prefix("tps-").unwrap_or_else(|| panic!("{name}"));
        let digits: Vec<usize> = stamp.split('-').map(str::len).collect();
        assert_eq!(digits, vec![4, 2, 2, 6], "{stamp}: YYYY-MM-DD-HHMMSS");
        assert!(stamp.chars().all(|c| c.is_ascii_digit() || c == '-'), "{stamp}");
        let year: i32 = stamp[..4].parse().unwrap();
        assert!(year >= 2024, "{stamp}: a date, not seconds since 1970");
    }
}
