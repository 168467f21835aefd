//! `shardlog-bench audit`: checks a topic against the acknowledged records a producer wrote down
//! (`produce --record FILE`): every acknowledged record must be in the log at the offset it was
//! acknowledged with. Also reports duplicates (one sent record stored more than once) and reordering
//! (a sender's records for a partition stored out of its order).
//!
//! Exits non-zero when an acknowledged record is missing or has moved.

use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::{ApiKey, FetchRequest, ResponseKind, TopicName};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::RecordBatchDecoder;
use shardlog_broker::client::{BOOTSTRAP_ENV, Connection, DEFAULT_BOOTSTRAP, KafkaClient, Leaderless};

use crate::payload::{self, Origin};

/// Options of `shardlog-bench audit`.
#[derive(Debug, Clone, clap::Args)]
pub struct AuditArgs {
    /// Brokers to reach the cluster through, HOST:PORT[,HOST:PORT...].
    #[arg(long, env = BOOTSTRAP_ENV, default_value = DEFAULT_BOOTSTRAP)]
    pub bootstrap: String,
    #[arg(long)]
    pub topic: String,
    /// The file `produce --record` wrote.
    #[arg(long)]
    pub records: PathBuf,
    /// Fail on any duplicate too (what idempotent producers promise). Without it, duplicates are
    /// reported but pass: plain producers that retry deliver at least once.
    #[arg(long)]
    pub exactly_once: bool,
}

/// What the audit found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuditReport {
    pub acknowledged: u64,
    /// Records in the log.
    pub stored: u64,
    /// Acknowledged records found nowhere in their partition.
    pub missing: u64,
    /// Acknowledged records found in their partition, but not at the acknowledged offset.
    pub moved: u64,
    /// Extra copies of a sent record.
    pub duplicated: u64,
    /// Records stored after a later record of the same sender and partition.
    pub reordered: u64,
    /// `--exactly-once`: a duplicate fails the audit.
    pub exactly_once: bool,
}

impl AuditReport {
    pub fn passed(&self) -> bool {
        self.missing == 0 && self.moved == 0 && !(self.exactly_once && self.duplicated > 0)
    }

    pub fn render(&self) -> String {
        let verdict = if self.passed() { "every acknowledged record is where it was acknowledged" } else { "FAILED" };
        let duplicates = match (self.duplicated, self.exactly_once) {
            (0, _) => "duplicates: none".to_string(),
            (n, true) => format!("duplicates: {n} extra copies of sent records: FAILED (--exactly-once)"),
            (n, false) => format!(
                "duplicates: {n} extra copies of sent records (at least once, allowed; --exactly-once fails on them)"
            ),
        };
        format!(
            "acknowledged {}, stored {}: missing {}, moved {}, reordered {}: {verdict}\n{duplicates}\n",
            self.acknowledged, self.stored, self.missing, self.moved, self.reordered,
        )
    }
}

pub fn run(args: &AuditArgs) -> Result<AuditReport> {
    let acknowledged = read_acknowledged(&args.records)?;
    let mut client = KafkaClient::connect(&args.bootstrap)?;
    let layout = client.led_layout(&args.topic)?;
    let bounds = client.offsets(&args.topic, layout.partitions)?;
    let mut report = AuditReport {
        acknowledged: acknowledged.values().map(|v| v.len() as u64).sum(),
        exactly_once: args.exactly_once,
        ..Default::default()
    };
    for partition in 0..layout.partitions {
        let (start, end) = bounds[partition as usize];
        let stored = read_partition(&mut client, &args.topic, partition, start, end)?;
        report.stored += stored.len() as u64;
        let acked = acknowledged.get(&partition).map(Vec::as_slice).unwrap_or_default();
        check_partition(acked, &stored, &mut report);
    }
    Ok(report)
}

/// Compares one partition's acknowledged (offset, hash) with what it stores: (offset, hash, origin).
fn check_partition(acked: &[(i64, u32)], stored: &[(i64, u32, Option<Origin>)], report: &mut AuditReport) {
    let by_offset: HashMap<i64, u32> = stored.iter().map(|(o, h, _)| (*o, *h)).collect();
    let mut copies: HashMap<u32, u64> = HashMap::new();
    for (_, h, _) in stored {
        *copies.entry(*h).or_default() += 1;
    }
    for (offset, hash) in acked {
        if by_offset.get(offset) == Some(hash) {
            continue;
        }
        if copies.contains_key(hash) { report.moved += 1 } else { report.missing += 1 }
    }
    // A duplicate is a sent record stored twice: told by its origin (sender run, partition, sequence),
    // which values from `produce` carry. Values without one are told by their 32-bit hash, where two
    // different values may collide.
    let mut sent: HashMap<Origin, u64> = HashMap::new();
    let mut unknown: HashMap<u32, u64> = HashMap::new();
    for (_, h, origin) in stored {
        match origin {
            Some(origin) => *sent.entry(*origin).or_default() += 1,
            None => *unknown.entry(*h).or_default() += 1,
        }
    }
    report.duplicated += sent.values().chain(unknown.values()).map(|n| n - 1).sum::<u64>();
    let mut latest: HashMap<(u64, u32), u64> = HashMap::new();
    for origin in stored.iter().filter_map(|(_, _, o)| *o) {
        let last = latest.entry((origin.run, origin.partition)).or_insert(origin.sequence);
        if origin.sequence < *last {
            report.reordered += 1;
        } else {
            *last = origin.sequence;
        }
    }
}

/// `partition offset hash` lines, by partition.
fn read_acknowledged(path: &PathBuf) -> Result<BTreeMap<i32, Vec<(i64, u32)>>> {
    let file = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let mut out: BTreeMap<i32, Vec<(i64, u32)>> = BTreeMap::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line?;
        let fields: Vec<&str> = line.split_whitespace().collect();
        let parsed = match fields.as_slice() {
            [p, o, h] => p.parse().ok().zip(o.parse().ok()).zip(u32::from_str_radix(h, 16).ok()),
            _ => None,
        };
        let Some(((partition, offset), hash)) = parsed else {
            bail!("{}:{}: expected `partition offset hash`, found {line:?}", path.display(), n + 1)
        };
        out.entry(partition).or_default().push((offset, hash));
    }
    Ok(out)
}

/// Fetch versions this tool speaks.
const FETCH_VERSIONS: (i16, i16) = (4, 11);

/// Every record of a partition in `[start, end)`: offset, value hash and origin. Each part is fetched
/// from the partition's leader at the time.
fn read_partition(
    client: &mut KafkaClient,
    topic: &str,
    partition: i32,
    start: i64,
    end: i64,
) -> Result<Vec<(i64, u32, Option<Origin>)>> {
    let mut out = Vec::new();
    let mut position = start;
    while position < end {
        let mut answers = client.route(topic, &[partition], "fetch", Leaderless::Wait, |conn, _| {
            Ok(vec![(partition, fetch_from(conn, topic, partition, position)?.map(|(_, records)| records))])
        })?;
        let mut records = answers.remove(&partition).expect("routed");
        let before = position;
        while !records.is_empty() {
            let Ok(set) = RecordBatchDecoder::decode(&mut records) else { break };
            for r in set.records {
                if r.offset >= position && r.offset < end {
                    let value = r.value.as_deref().unwrap_or_default();
                    out.push((r.offset, payload::hash(value), Origin::parse(value)));
                }
                position = position.max(r.offset + 1);
            }
        }
        if position == before {
            bail!("fetch {topic}-{partition} at {position} made no progress");
        }
    }
    Ok(out)
}

/// One Fetch of a partition from `position`: the partition's high watermark and its records, or the
/// partition's error code.
pub fn fetch_from(
    conn: &mut Connection,
    topic: &str,
    partition: i32,
    position: i64,
) -> Result<Result<(i64, Bytes), i16>> {
    let version = conn.negotiate(ApiKey::Fetch, FETCH_VERSIONS)?;
    let request = FetchRequest::default()
        .with_replica_id(kafka_protocol::messages::BrokerId(-1))
        .with_max_wait_ms(0)
        .with_min_bytes(0)
        .with_max_bytes(50 << 20)
        .with_topics(vec![
            FetchTopic::default().with_topic(TopicName(StrBytes::from_string(topic.to_string()))).with_partitions(
                vec![
                    FetchPartition::default()
                        .with_partition(partition)
                        .with_fetch_offset(position)
                        .with_partition_max_bytes(8 << 20),
                ],
            ),
        ]);
    let ResponseKind::Fetch(response) = conn.call(ApiKey::Fetch, version, &request)? else {
        bail!("wrong answer to Fetch")
    };
    let p = response.responses.first().and_then(|t| t.partitions.first()).context("empty Fetch answer")?;
    Ok(if p.error_code == 0 {
        Ok((p.high_watermark, p.records.clone().unwrap_or_default()))
    } else {
        Err(p.error_code)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin(sequence: u64) -> Option<Origin> {
        Some(Origin { run: 1, partition: 0, sequence })
    }

    #[test]
    fn missing_moved_duplicated_and_reordered_records_are_told_apart() {
        let acked = [(0, 10), (1, 11), (2, 12), (3, 13)];
        // 10 in place; 11 moved to offset 5; 12 gone; 13 in place and stored twice; 14 before 13.
        let stored =
            [(0, 10, origin(0)), (3, 13, origin(3)), (4, 14, origin(4)), (5, 11, origin(1)), (6, 13, origin(3))];
        let mut report = AuditReport::default();
        check_partition(&acked, &stored, &mut report);
        assert_eq!((report.missing, report.moved, report.duplicated), (1, 1, 1));
        assert_eq!(report.reordered, 2, "1 after 4, and the second 3 after 4");
        assert!(!report.passed());
    }

    #[test]
    fn records_that_only_share_a_hash_are_not_duplicates() {
        let stored = [(0, 10, origin(0)), (1, 10, origin(1))];
        let mut report = AuditReport::default();
        check_partition(&[(0, 10), (1, 10)], &stored, &mut report);
        assert_eq!(report.duplicated, 0, "two sends, two records");
    }

    #[test]
    fn duplicates_pass_at_least_once_and_fail_exactly_once() {
        let acked = [(0, 10), (1, 11)];
        let stored = [(0, 10, origin(0)), (1, 11, origin(1)), (2, 11, origin(1))];
        let mut report = AuditReport::default();
        check_partition(&acked, &stored, &mut report);
        assert_eq!((report.missing, report.moved, report.duplicated), (0, 0, 1));
        assert!(report.passed(), "at least once");
        assert!(
            report.render().lines().nth(1).unwrap().starts_with("duplicates: 1 extra copies"),
            "{}",
            report.render()
        );
        report.exactly_once = true;
        assert!(!report.passed());
        assert!(report.render().contains("FAILED (--exactly-once)"), "{}", report.render());
    }
}
