//! Transactions for the operator tools (Kafka's `kafka-transactions.sh` and `Admin`'s transaction
//! calls): list them at every broker (ListTransactions), describe one at its coordinator (FindCoordinator
//! with key type 1, DescribeTransactions), read each partition leader's producers (DescribeProducers), and
//! abort a partition's open transaction by writing its ABORT marker at the leader (WriteTxnMarkers, as
//! `Admin.abortTransaction` does). Coordinator requests are asked again while the coordinator moves.

use std::collections::BTreeMap;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::write_txn_markers_request::{WritableTxnMarker, WritableTxnMarkerTopic};
use kafka_protocol::messages::{
    ApiKey, BrokerId, DescribeProducersRequest, DescribeTransactionsRequest, ListOffsetsRequest,
    ListTransactionsRequest, ProducerId, ResponseKind, TransactionalId, WriteTxnMarkersRequest,
};
use kafka_protocol::protocol::StrBytes;

use super::groups::moving;
use super::{KafkaClient, LIST_OFFSETS_V, Leaderless, RETRY_PAUSE, check, topic_name};

/// FindCoordinator's key type for a transactional id.
const TRANSACTION_KEY: i8 = 1;

/// A transaction as its coordinator lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedTxn {
    pub transactional_id: String,
    /// The id of the broker that listed it (its coordinator).
    pub coordinator: i32,
    pub producer_id: i64,
    pub state: String,
}

/// A transaction as its coordinator describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescribedTxn {
    pub transactional_id: String,
    /// The coordinator's address.
    pub coordinator: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub state: String,
    pub timeout_ms: i32,
    /// When the transaction began, by the coordinator's clock; -1 when none is in progress.
    pub start_time_ms: i64,
    /// The partitions in the transaction, sorted.
    pub partitions: Vec<(String, i32)>,
}

/// A producer as a partition's leader remembers it (DescribeProducers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionProducer {
    pub producer_id: i64,
    pub producer_epoch: i32,
    pub last_sequence: i32,
    pub last_timestamp: i64,
    pub coordinator_epoch: i32,
    /// -1 when it has no open transaction there.
    pub current_txn_start_offset: i64,
}

impl KafkaClient {
    /// Every transaction of the cluster (ListTransactions asks each broker for those it coordinates),
    /// by transactional id; only those of `producer_ids` when it is not empty.
    pub fn list_transactions(&mut self, producer_ids: &[i64]) -> Result<Vec<ListedTxn>> {
        self.metadata(Some(&[]))?;
        let brokers: Vec<(i32, String)> = self.brokers.iter().map(|(id, addr)| (*id, addr.clone())).collect();
        let req = ListTransactionsRequest::default()
            .with_producer_id_filters(producer_ids.iter().map(|id| ProducerId(*id)).collect());
        let mut out = BTreeMap::new();
        for (broker, addr) in brokers {
            let deadline = Instant::now() + self.retry_for;
            loop {
                let conn = self.connection(&addr)?;
                let version = conn.negotiate(ApiKey::ListTransactions, (0, 1))?;
                let ResponseKind::ListTransactions(r) = conn.call(ApiKey::ListTransactions, version, &req)? else {
                    bail!("ListTransactions: unexpected response");
                };
                if moving(r.error_code) && Instant::now() < deadline {
                    std::thread::sleep(RETRY_PAUSE);
                    continue;
                }
                check(r.error_code, &format!("list the transactions of {addr}"))?;
                for t in r.transaction_states {
                    let id = t.transactional_id.0.to_string();
                    let listed = ListedTxn {
                        transactional_id: id.clone(),
                        coordinator: broker,
                        producer_id: t.producer_id.0,
                        state: t.transaction_state.to_string(),
                    };
                    out.insert(id, listed);
                }
                break;
            }
        }
        Ok(out.into_values().collect())
    }

    /// The transaction of `transactional_id`, asked of its coordinator; `None` if the id is not known.
    pub fn describe_transaction(&mut self, transactional_id: &str) -> Result<Option<DescribedTxn>> {
        let deadline = Instant::now() + self.retry_for;
        let req = DescribeTransactionsRequest::default()
            .with_transactional_ids(vec![TransactionalId(StrBytes::from_string(transactional_id.to_string()))]);
        loop {
            let addr = self.find_coordinator(TRANSACTION_KEY, transactional_id)?;
            let answer = self.connection(&addr).and_then(|c| c.call(ApiKey::DescribeTransactions, 0, &req));
            let r = match answer {
                Ok(ResponseKind::DescribeTransactions(r)) => r,
                Ok(_) => bail!("DescribeTransactions: unexpected response"),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => {
                    self.forget(&addr);
                    std::thread::sleep(RETRY_PAUSE);
                    continue;
                }
            };
            let t = r.transaction_states.into_iter().next().context("DescribeTransactions: no state in the answer")?;
            if moving(t.error_code) && Instant::now() < deadline {
                std::thread::sleep(RETRY_PAUSE);
                continue;
            }
            if t.error_code == ResponseError::TransactionalIdNotFound.code() {
                return Ok(None);
            }
            check(t.error_code, &format!("describe transactional id {transactional_id}"))?;
            let mut partitions: Vec<(String, i32)> = (t.topics.iter())
                .flat_map(|topic| topic.partitions.iter().map(|p| (topic.topic.0.to_string(), *p)))
                .collect();
            partitions.sort();
            return Ok(Some(DescribedTxn {
                transactional_id: transactional_id.to_string(),
                coordinator: addr,
                producer_id: t.producer_id.0,
                producer_epoch: t.producer_epoch,
                state: t.transaction_state.to_string(),
                timeout_ms: t.transaction_timeout_ms,
                start_time_ms: t.transaction_start_time_ms,
                partitions,
            }));
        }
    }

    /// The producers each of `partitions` of `topic` remembers, asked of its leader (a partition
    /// without a leader is waited for or left out, as `leaderless` says).
    pub fn describe_producers(
        &mut self,
        topic: &str,
        partitions: &[i32],
        leaderless: Leaderless,
    ) -> Result<BTreeMap<i32, Vec<PartitionProducer>>> {
        self.route(topic, partitions, "describe producers", leaderless, |conn, asked| {
            conn.negotiate(ApiKey::DescribeProducers, (0, 0))?;
            let req = DescribeProducersRequest::default().with_topics(vec![
                kafka_protocol::messages::describe_producers_request::TopicRequest::default()
                    .with_name(topic_name(topic))
                    .with_partition_indexes(asked.to_vec()),
            ]);
            let ResponseKind::DescribeProducers(r) = conn.call(ApiKey::DescribeProducers, 0, &req)? else {
                bail!("wrong answer to DescribeProducers")
            };
            Ok((r.topics.iter().flat_map(|t| &t.partitions))
                .map(|p| {
                    let producers = (p.active_producers.iter())
                        .map(|s| PartitionProducer {
                            producer_id: s.producer_id.0,
                            producer_epoch: s.producer_epoch,
                            last_sequence: s.last_sequence,
                            last_timestamp: s.last_timestamp,
                            coordinator_epoch: s.coordinator_epoch,
                            current_txn_start_offset: s.current_txn_start_offset,
                        })
                        .collect();
                    (p.partition_index, if p.error_code == 0 { Ok(producers) } else { Err(p.error_code) })
                })
                .collect())
        })
    }

    /// Each led partition's last stable offset (ListOffsets for read_committed), asked of its leader.
    pub fn last_stable_offsets(&mut self, topic: &str, partitions: &[i32]) -> Result<BTreeMap<i32, i64>> {
        self.route(topic, partitions, "list last stable offsets", Leaderless::Skip, |conn, asked| {
            let req =
                ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_isolation_level(1).with_topics(vec![
                    ListOffsetsTopic::default().with_name(topic_name(topic)).with_partitions(
                        asked
                            .iter()
                            .map(|&p| ListOffsetsPartition::default().with_partition_index(p).with_timestamp(-1))
                            .collect(),
                    ),
                ]);
            let ResponseKind::ListOffsets(r) = conn.call(ApiKey::ListOffsets, LIST_OFFSETS_V, &req)? else {
                bail!("wrong answer to ListOffsets")
            };
            Ok((r.topics.iter().flat_map(|t| &t.partitions))
                .map(|p| (p.partition_index, if p.error_code == 0 { Ok(p.offset) } else { Err(p.error_code) }))
                .collect())
        })
    }

    /// Whether the broker this client talks to serves `api` (at any version).
    pub fn serves(&mut self, api: ApiKey) -> bool {
        let home = self.home.clone();
        self.connection(&home).and_then(|c| c.negotiate(api, (0, i16::MAX))).is_ok()
    }

    /// Writes an ABORT marker for `producer`'s open transaction on `topic`-`partition` at the partition's
    /// leader (WriteTxnMarkers v1, as `Admin.abortTransaction` does), with its producer epoch and
    /// coordinator epoch (0 when it has none, as Kafka's tool sends).
    pub fn abort_transaction(&mut self, topic: &str, partition: i32, producer: &PartitionProducer) -> Result<()> {
        let epoch = i16::try_from(producer.producer_epoch).context("a producer epoch beyond i16")?;
        let marker = WritableTxnMarker::default()
            .with_producer_id(ProducerId(producer.producer_id))
            .with_producer_epoch(epoch)
            .with_transaction_result(false)
            .with_coordinator_epoch(producer.coordinator_epoch.max(0))
            .with_topics(vec![
                WritableTxnMarkerTopic::default().with_name(topic_name(topic)).with_partition_indexes(vec![partition]),
            ]);
        let req = WriteTxnMarkersRequest::default().with_markers(vec![marker]);
        self.route(topic, &[partition], "abort transaction", Leaderless::Wait, |conn, _| {
            conn.negotiate(ApiKey::WriteTxnMarkers, (1, 1))?;
            let ResponseKind::WriteTxnMarkers(r) = conn.call(ApiKey::WriteTxnMarkers, 1, &req)? else {
                bail!("wrong answer to WriteTxnMarkers")
            };
            Ok((r.markers.iter().flat_map(|m| &m.topics).flat_map(|t| &t.partitions))
                .map(|p| (p.partition_index, if p.error_code == 0 { Ok(()) } else { Err(p.error_code) }))
                .collect())
        })?;
        Ok(())
    }
}
