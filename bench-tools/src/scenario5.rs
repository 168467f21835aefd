//! The seed's scenario 5 (document 003, section 4) through the fault campaign's machinery: one sync
//! producer of 1 KiB messages with acks=all on 12 partitions of a topic with 4 replicas and
//! `min.insync.replicas=2`, on a local cluster of 4 brokers, while brokers are killed with SIGKILL: two
//! brokers with `retries=0`, two with retries, and three with retries, restarted later. Each row runs on a
//! fresh cluster; at its end the killed brokers are started again, every replica is read from disk and the
//! campaign's checker judges the history. The table shows, beside the seed's, what was acknowledged,
//! given up on an error (and how much of that was stored anyway), lost, and stored twice.
//!
//! Four brokers run three quorum voters (brokers 1-3): broker 4 and then voters 3 and 2 are the ones
//! killed, so killing two keeps the quorum's majority, as the seed's separate ZooKeeper kept its own;
//! killing three takes the quorum with them until they come back.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::Result;
use shardlog_bench::cluster::{Cluster, ClusterArgs};
use shardlog_bench::faults::check::{self, Delivery};
use shardlog_broker::client::{ClientSecurity, KafkaClient};

use crate::campaign::{self, ProducerSpec, Shared};
use crate::tps_table::MIN_RECORDS_PER_ROW;

pub const BROKERS: usize = 4;
const PARTITIONS: i32 = 12;
const REPLICAS: i16 = 4;
const MIN_INSYNC: i16 = 2;
const PRODUCER: u32 = 1;
/// The brokers killed, in order: the one without a voter first.
const KILLED: [usize; 3] = [4, 3, 2];

/// One row of the seed's table.
struct Row {
    retries: bool,
    kills: usize,
    restart: bool,
    seed_tps: Option<f64>,
    /// The seed's "data on disk" and "errors" columns, translated.
    seed_disk: &'static str,
    seed_errors: &'static str,
}

const ROWS: [Row; 3] = [
    Row {
        retries: false,
        kills: 2,
        restart: false,
        seed_tps: Some(12840.0),
        seed_disk: "consistent (some records stored, some failed)",
        seed_errors: "NETWORK_EXCEPTION (the server disconnected before a response was received)",
    },
    Row {
        retries: true,
        kills: 2,
        restart: false,
        seed_tps: Some(13870.0),
        seed_disk: "consistent (records stored twice)",
        seed_errors: "NETWORK_EXCEPTION, retried",
    },
    Row {
        retries: true,
        kills: 3,
        restart: true,
        seed_tps: None,
        seed_disk: "consistent (records stored twice)",
        seed_errors: "NETWORK_EXCEPTION, NOT_ENOUGH_REPLICAS, NOT_ENOUGH_REPLICAS_AFTER_APPEND, retried",
    },
];

/// What a row came to.
struct Measured {
    acknowledged: u64,
    given_up: u64,
    /// Records given up that are in the log all the same.
    given_up_stored: u64,
    lost: usize,
    duplicated: u64,
    tps: f64,
    /// Error codes that made the producer give records up (retries=0) or were retried (with retries).
    errors: BTreeMap<i16, u64>,
}

/// Runs the three rows and returns the section of the report, in markdown.
pub fn run(duration: Duration, shards: Option<usize>, shardlog: Option<&Path>, out: &Path) -> Result<String> {
    let mut text = String::from(
        "One sync producer, 1 KiB messages, acks=all, 12 partitions, replicas 4, min.insync.replicas 2, on 4 \
         local brokers (3 of them quorum voters); brokers killed with SIGKILL a third of the way through. At the end \
         the killed brokers are started again and every replica is read from disk and checked.\n\n",
    );
    text.push_str(
        "| acks | replicas | min.insync.replicas | retries | method | Kafka TPS (seed) | data on disk (seed) | errors (seed) | shardlog TPS | acknowledged | given up (of them stored) | acknowledged and lost | stored twice | errors seen |\n",
    );
    text.push_str(&format!("|{}\n", "---|".repeat(14)));
    let mut too_short = 0;
    for (i, row) in ROWS.iter().enumerate() {
        let data = out.join(format!("scenario5-row{}", i + 1));
        let measured = measure(row, duration, shards, shardlog, &data);
        let method = match (row.kills, row.restart) {
            (kills, false) => format!("kill {kills} brokers while sending"),
            (kills, true) => format!("kill {kills} brokers while sending, restart them"),
        };
        let seed_tps = row.seed_tps.map_or("N/A".to_string(), |t| format!("{t:.0}"));
        let retries = if row.retries { "100000000" } else { "0" };
        let ours = match measured {
            Ok(m) => {
                // Marked beside the rate, as the other tables mark it; the counts stay plain numbers.
                let tps = if m.acknowledged < MIN_RECORDS_PER_ROW {
                    too_short += 1;
                    format!("{:.0} (too short: {} records)", m.tps, m.acknowledged)
                } else {
                    format!("{:.0}", m.tps)
                };
                let errors: Vec<String> = m
                    .errors
                    .iter()
                    .map(|(code, n)| format!("{} x{n}", shardlog_broker::metrics::error_name(*code)))
                    .collect();
                format!(
                    "{tps} | {} | {} ({}) | {} | {} | {}",
                    m.acknowledged,
                    m.given_up,
                    m.given_up_stored,
                    m.lost,
                    m.duplicated,
                    if errors.is_empty() { "none".into() } else { errors.join(", ") }
                )
            }
            Err(e) => format!("failed: {} | - | - | - | - | -", crate::report::table_cell(&format!("{e:#}"))),
        };
        let _ = writeln!(
            text,
            "| -1 | {REPLICAS} | {MIN_INSYNC} | {retries} | {method} | {seed_tps} | {} | {} | {ours} |",
            row.seed_disk, row.seed_errors
        );
    }
    if too_short > 0 {
        text.push_str(&crate::report::too_short_note(too_short));
    }
    text.push_str(
        "\n\"Given up\" records failed with the error shown and were not sent again (retries=0); some of them may be \
         stored all the same, as in the seed (the broker had written them before the connection broke). \
         \"Acknowledged and lost\" must be 0. With retries, a record whose answer was lost is sent again and may be \
         stored twice, as the seed saw; an idempotent producer prevents that (see `shardlog-bench faults`).\n",
    );
    Ok(text)
}

fn measure(
    row: &Row,
    duration: Duration,
    shards: Option<usize>,
    shardlog: Option<&Path>,
    data: &Path,
) -> Result<Measured> {
    if data.exists() {
        std::fs::remove_dir_all(data)?;
    }
    let mut cluster = Cluster::start(&ClusterArgs {
        brokers: BROKERS,
        base_port: 0,
        quorum_base_port: None,
        metrics_base_port: None,
        data_dir: data.to_path_buf(),
        shards,
        shardlog: shardlog.map(PathBuf::from),
        settings: campaign::SETTINGS.iter().map(|s| s.to_string()).collect(),
        log_dir: None,
        die_with_parent: false,
        broker_args: Vec::new(),
        client_security: None,
    })?;
    let bootstrap = cluster.bootstrap.clone();
    let mut admin = KafkaClient::connect(&bootstrap)?;
    admin.set_read_timeout(campaign::REQUEST_TIMEOUT)?;
    admin.create_topic(
        campaign::TOPIC,
        PARTITIONS,
        REPLICAS,
        &[("min.insync.replicas".into(), MIN_INSYNC.to_string())],
    )?;
    admin.led_layout(campaign::TOPIC)?;

    let shared = Arc::new(Shared::new(ClientSecurity::plaintext()));
    let spec = ProducerSpec {
        id: PRODUCER,
        delivery: Delivery::AcksAll,
        partitions: PARTITIONS,
        value_bytes: 1024,
        retries: row.retries,
    };
    let producer = {
        let (shared, bootstrap) = (shared.clone(), bootstrap.clone());
        std::thread::spawn(move || campaign::produce(&shared, &bootstrap, &spec))
    };
    let killed = &KILLED[..row.kills];
    let nemesis = (|| -> Result<()> {
        std::thread::sleep(duration / 3);
        for &b in killed {
            cluster.kill(b)?;
        }
        if row.restart {
            std::thread::sleep(duration / 3);
            restart(&mut cluster, killed)?;
        }
        std::thread::sleep(duration.saturating_sub(shared.start.elapsed()));
        Ok(())
    })();
    // However the nemesis ended, the producer stops before this row returns.
    shared.stop.store(true, Ordering::Relaxed);
    let sent_for = shared.start.elapsed();
    let produced = producer.join().expect("the producer thread");
    nemesis?;
    produced?;
    if !row.restart {
        restart(&mut cluster, killed)?;
    }

    let end = campaign::final_state(&mut admin, &mut cluster, data, PARTITIONS, REPLICAS as usize)?;
    let history: Vec<check::Event> =
        shared.history.lock().expect("history lock").iter().map(|(_, e)| e.clone()).collect();
    let verdict = check::check(&BTreeMap::from([(PRODUCER, Delivery::AcksAll)]), &history, &end);
    let stored: BTreeSet<check::Tag> = end.log.values().flat_map(|log| log.values().map(|s| s.tag)).collect();
    let given_up = shared.given_up.lock().expect("given-up lock").clone();
    let mut errors = shared
        .refused
        .lock()
        .expect("refused lock")
        .iter()
        .map(|(&(_, code), &n)| (code, n))
        .collect::<BTreeMap<_, _>>();
    for (&code, &n) in shared.retried.lock().expect("retried lock").iter() {
        *errors.entry(code).or_default() += n;
    }
    let acknowledged = verdict.acknowledged[1];
    Ok(Measured {
        acknowledged,
        given_up: given_up.len() as u64,
        given_up_stored: given_up.iter().filter(|t| stored.contains(t)).count() as u64,
        lost: verdict.lost.len() + verdict.moved.len(),
        duplicated: verdict.duplicated_retries,
        tps: acknowledged as f64 / sent_for.as_secs_f64(),
        errors,
    })
}

/// Starts the killed brokers again, voters first, each waited for until the brokers back so far are
/// registered.
fn restart(cluster: &mut Cluster, killed: &[usize]) -> Result<()> {
    let mut back: Vec<usize> = killed.to_vec();
    back.sort();
    let mut live = BROKERS - killed.len();
    for b in back {
        live += 1;
        // With the quorum gone (three killed), voter 2 coming back gives it its majority again.
        cluster.restart(b, live)?;
    }
    Ok(())
}
