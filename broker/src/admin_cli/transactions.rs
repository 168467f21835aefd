//! `shardlog transactions ...`: Kafka's `kafka-transactions.sh` over the Kafka protocol. Every answer
//! is tab-separated with a header line:
//!
//! - `list`: each transaction every broker coordinates (ListTransactions).
//! - `describe`: one transactional id at its coordinator (DescribeTransactions).
//! - `describe-producers`: what a partition's leader remembers of each producer (DescribeProducers).
//! - `abort`: the producer whose open transaction on a partition starts at an offset, ended there with an
//!   ABORT marker (WriteTxnMarkers), as `Admin.abortTransaction` does. It does not ask the coordinator:
//!   it is for transactions the coordinator no longer ends (hanging), and a coordinator that still does
//!   writes its own marker later, which the partition takes as the marker of a transaction no longer
//!   open (nothing more is aborted or committed).
//! - `find-hanging`: open transactions (DescribeProducers) that their coordinator does not hold open for
//!   that partition, or that have seen no append for longer than `transaction.max.timeout.ms` (a
//!   coordinator ends every transaction within that).

use std::collections::BTreeMap;

use anyhow::{Result, bail};
use kafka_protocol::messages::ApiKey;

use crate::client::{DescribedTxn, KafkaClient, Leaderless, PartitionProducer};

/// Kafka's default `transaction.max.timeout.ms`: 15 minutes.
pub const DEFAULT_MAX_TRANSACTION_TIMEOUT_MS: i64 = 900_000;

/// The coordinator states in which a transaction still reaches its partitions: open, or decided with its
/// markers on their way.
const COORDINATOR_HOLDS_OPEN: [&str; 3] = ["Ongoing", "PrepareCommit", "PrepareAbort"];

/// Which partitions `find-hanging` looks at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every partition this broker leads.
    Broker(i32),
    /// One topic's partitions (all of them when `None`).
    Topic(String, Option<i32>),
}

/// `transactions list`.
pub fn list(client: &mut KafkaClient) -> Result<String> {
    let mut out = String::from("TransactionalId\tCoordinator\tProducerId\tState\n");
    for t in client.list_transactions(&[])? {
        out.push_str(&format!("{}\t{}\t{}\t{}\n", t.transactional_id, t.coordinator, t.producer_id, t.state));
    }
    Ok(out)
}

/// `transactions describe`.
pub fn describe(client: &mut KafkaClient, transactional_id: &str) -> Result<String> {
    let Some(t) = client.describe_transaction(transactional_id)? else {
        bail!("transactional id {transactional_id} does not exist")
    };
    let partitions: Vec<String> = t.partitions.iter().map(|(topic, p)| format!("{topic}-{p}")).collect();
    let mut out = String::from(
        "TransactionalId\tCoordinator\tProducerId\tProducerEpoch\tState\tTimeoutMs\tStartTimeMs\tPartitions\n",
    );
    out.push_str(&format!(
        "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{}\n",
        t.transactional_id,
        t.coordinator,
        t.producer_id,
        t.producer_epoch,
        t.state,
        t.timeout_ms,
        t.start_time_ms,
        if partitions.is_empty() { "-".to_string() } else { partitions.join(",") }
    ));
    Ok(out)
}

/// `transactions describe-producers`. `LastTimestamp` is the broker's clock at the producer's last
/// append, not (as in Kafka) its last batch's max timestamp.
pub fn describe_producers(client: &mut KafkaClient, topic: &str, partition: i32) -> Result<String> {
    let producers =
        client.describe_producers(topic, &[partition], Leaderless::Wait)?.remove(&partition).unwrap_or_default();
    let mut out = String::from(
        "ProducerId\tProducerEpoch\tCoordinatorEpoch\tLastSequence\tLastTimestamp\tCurrentTransactionStartOffset\n",
    );
    for p in producers {
        out.push_str(&format!(
            "{}\t{}\t{}\t{}\t{}\t{}\n",
            p.producer_id,
            p.producer_epoch,
            p.coordinator_epoch,
            p.last_sequence,
            p.last_timestamp,
            p.current_txn_start_offset
        ));
    }
    Ok(out)
}

/// `transactions abort --start-offset`: finds the producer whose open transaction on the partition
/// starts at `start_offset`, and writes its ABORT marker at the leader.
pub fn abort(client: &mut KafkaClient, topic: &str, partition: i32, start_offset: i64) -> Result<String> {
    let producers =
        client.describe_producers(topic, &[partition], Leaderless::Wait)?.remove(&partition).unwrap_or_default();
    let Some(producer) = producers.into_iter().find(|p| p.current_txn_start_offset == start_offset) else {
        bail!("no open transaction on {topic}-{partition} starts at offset {start_offset}")
    };
    client.abort_transaction(topic, partition, &producer)?;
    Ok(format!(
        "Aborted the transaction of producer {} (epoch {}) on {topic}-{partition} starting at offset {start_offset}.\n",
        producer.producer_id, producer.producer_epoch
    ))
}

/// An open transaction on one partition, as its leader shows it.
#[derive(Debug, Clone)]
struct OpenTxn {
    topic: String,
    partition: i32,
    producer: PartitionProducer,
}

/// What the coordinators say of the transactional id whose producer has an open transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CoordinatorView {
    /// No coordinator lists a transaction of the producer id.
    NotListed,
    /// Listed under this id, which its coordinator no longer knows.
    Gone(String),
    Described(DescribedTxn),
}

/// `transactions find-hanging`: the open transactions of the partitions in `scope` their coordinator
/// does not hold open for that partition, or idle longer than `max_timeout_ms`; `now_ms` the clock they
/// are measured by.
pub fn find_hanging(client: &mut KafkaClient, scope: &Scope, max_timeout_ms: i64, now_ms: i64) -> Result<String> {
    let mut open = Vec::new();
    for (topic, partitions) in partitions_in(client, scope)? {
        for (partition, producers) in client.describe_producers(&topic, &partitions, Leaderless::Skip)? {
            let txns = producers.into_iter().filter(|p| p.current_txn_start_offset >= 0);
            open.extend(txns.map(|producer| OpenTxn { topic: topic.clone(), partition, producer }));
        }
    }
    let ids: Vec<i64> = open.iter().map(|t| t.producer.producer_id).collect();
    let listed = if ids.is_empty() { Vec::new() } else { client.list_transactions(&ids)? };
    let mut views: BTreeMap<i64, CoordinatorView> = BTreeMap::new();
    for id in ids {
        if views.contains_key(&id) {
            continue;
        }
        let view = match listed.iter().find(|l| l.producer_id == id) {
            None => CoordinatorView::NotListed,
            Some(l) => match client.describe_transaction(&l.transactional_id)? {
                None => CoordinatorView::Gone(l.transactional_id.clone()),
                Some(d) => CoordinatorView::Described(d),
            },
        };
        views.insert(id, view);
    }
    let mut out = String::from(
        "Topic\tPartition\tProducerId\tProducerEpoch\tCoordinatorEpoch\tStartOffset\tLastTimestamp\tReason\n",
    );
    for txn in &open {
        let view = &views[&txn.producer.producer_id];
        if let Some(reason) = hanging(txn, view, max_timeout_ms, now_ms) {
            let p = &txn.producer;
            out.push_str(&format!(
                "{}\t{}\t{}\t{}\t{}\t{}\t{}\t{reason}\n",
                txn.topic,
                txn.partition,
                p.producer_id,
                p.producer_epoch,
                p.coordinator_epoch,
                p.current_txn_start_offset,
                p.last_timestamp
            ));
        }
    }
    Ok(out)
}

/// Why an open transaction hangs, if it does: idle longer than any transaction may last (a coordinator
/// aborts each within `transaction.max.timeout.ms`), or its coordinator does not hold it open for this
/// partition under this producer (so it will never write the marker that ends it here).
fn hanging(txn: &OpenTxn, view: &CoordinatorView, max_timeout_ms: i64, now_ms: i64) -> Option<String> {
    let p = &txn.producer;
    if now_ms.saturating_sub(p.last_timestamp) > max_timeout_ms {
        return Some("idle past transaction.max.timeout.ms".to_string());
    }
    match view {
        CoordinatorView::NotListed => Some("no coordinator lists its producer id".to_string()),
        CoordinatorView::Gone(id) => Some(format!("transactional id {id} is gone")),
        CoordinatorView::Described(d)
            if d.producer_id != p.producer_id || i32::from(d.producer_epoch) < p.producer_epoch =>
        {
            Some(format!("{} has another producer now", d.transactional_id))
        }
        CoordinatorView::Described(d) if !COORDINATOR_HOLDS_OPEN.contains(&d.state.as_str()) => {
            Some(format!("{} is {} at its coordinator", d.transactional_id, d.state))
        }
        CoordinatorView::Described(d) if !d.partitions.contains(&(txn.topic.clone(), txn.partition)) => {
            Some(format!("{} does not include this partition", d.transactional_id))
        }
        CoordinatorView::Described(_) => None,
    }
}

/// The partitions `scope` names, by topic.
fn partitions_in(client: &mut KafkaClient, scope: &Scope) -> Result<Vec<(String, Vec<i32>)>> {
    match scope {
        Scope::Topic(topic, Some(p)) => Ok(vec![(topic.clone(), vec![*p])]),
        Scope::Topic(topic, None) => {
            let count = client.layout(topic)?.partitions;
            Ok(vec![(topic.clone(), (0..count).collect())])
        }
        Scope::Broker(broker) => {
            let metadata = client.metadata(None)?;
            let mut out = Vec::new();
            for t in &metadata.topics {
                let Some(name) = t.name.as_ref().map(|n| n.0.to_string()) else { continue };
                let led: Vec<i32> =
                    t.partitions.iter().filter(|p| p.leader_id.0 == *broker).map(|p| p.partition_index).collect();
                if !led.is_empty() {
                    out.push((name, led));
                }
            }
            Ok(out)
        }
    }
}

/// A partition's transactional progress, as `topic describe` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Unstable {
    /// The last stable offset: where read_committed consumers stop.
    pub lso: i64,
    /// How many transactions are open on it.
    pub open: usize,
}

/// Each of `led` partitions' last stable offset and open transactions, from their leaders. A broker
/// that does not serve DescribeProducers, or a cluster that cannot answer now, shows none.
pub(super) fn unstable(client: &mut KafkaClient, topic: &str, led: &[i32]) -> BTreeMap<i32, Unstable> {
    if led.is_empty() || !client.serves(ApiKey::DescribeProducers) {
        return BTreeMap::new();
    }
    let Ok(lsos) = client.last_stable_offsets(topic, led) else { return BTreeMap::new() };
    let Ok(producers) = client.describe_producers(topic, led, Leaderless::Skip) else { return BTreeMap::new() };
    lsos.into_iter()
        .map(|(p, lso)| {
            let open = producers.get(&p).map_or(0, |ps| ps.iter().filter(|x| x.current_txn_start_offset >= 0).count());
            (p, Unstable { lso, open })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW_MS: i64 = 1_800_000_000_000;
    const MAX_MS: i64 = DEFAULT_MAX_TRANSACTION_TIMEOUT_MS;

    fn open_txn(last_timestamp: i64) -> OpenTxn {
        OpenTxn {
            topic: "orders".into(),
            partition: 0,
            producer: PartitionProducer {
                producer_id: 7,
                producer_epoch: 2,
                last_sequence: 4,
                last_timestamp,
                coordinator_epoch: 0,
                current_txn_start_offset: 10,
            },
        }
    }

    fn described(state: &str, producer: (i64, i16), partitions: &[(&str, i32)]) -> CoordinatorView {
        CoordinatorView::Described(DescribedTxn {
            transactional_id: "tx".into(),
            coordinator: "127.0.0.1:9092".into(),
            producer_id: producer.0,
            producer_epoch: producer.1,
            state: state.into(),
            timeout_ms: 60_000,
            start_time_ms: NOW_MS - 1_000,
            partitions: partitions.iter().map(|(t, p)| (t.to_string(), *p)).collect(),
        })
    }

    #[test]
    fn a_transaction_its_coordinator_holds_open_for_the_partition_is_not_hanging() {
        let txn = open_txn(NOW_MS - 1_000);
        for state in COORDINATOR_HOLDS_OPEN {
            assert_eq!(hanging(&txn, &described(state, (7, 2), &[("orders", 0)]), MAX_MS, NOW_MS), None, "{state}");
        }
    }

    #[test]
    fn a_transaction_its_coordinator_does_not_hold_open_here_is_hanging() {
        let txn = open_txn(NOW_MS - 1_000);
        let cases = [
            (CoordinatorView::NotListed, "no coordinator lists its producer id"),
            (CoordinatorView::Gone("tx".into()), "transactional id tx is gone"),
            (described("CompleteAbort", (7, 2), &[]), "tx is CompleteAbort at its coordinator"),
            (described("Empty", (7, 2), &[]), "tx is Empty at its coordinator"),
            (described("Ongoing", (7, 2), &[("orders", 1)]), "tx does not include this partition"),
            (described("Ongoing", (8, 0), &[("orders", 0)]), "tx has another producer now"),
            (described("Ongoing", (7, 1), &[("orders", 0)]), "tx has another producer now"),
        ];
        for (view, reason) in cases {
            assert_eq!(hanging(&txn, &view, MAX_MS, NOW_MS).as_deref(), Some(reason), "{view:?}");
        }
    }

    #[test]
    fn a_transaction_idle_past_the_maximum_timeout_is_hanging_whatever_its_coordinator_says() {
        let view = described("Ongoing", (7, 2), &[("orders", 0)]);
        assert_eq!(hanging(&open_txn(NOW_MS - MAX_MS), &view, MAX_MS, NOW_MS), None, "at the limit");
        let reason = hanging(&open_txn(NOW_MS - MAX_MS - 1), &view, MAX_MS, NOW_MS);
        assert_eq!(reason.as_deref(), Some("idle past transaction.max.timeout.ms"));
    }
}
