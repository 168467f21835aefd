//! The layouts of [`ClusterState`] that older snapshot files hold, read at start and rewritten in today's
//! layout with the next snapshot. Each older layout converts to today's without losing anything: what
//! it lacks starts at its default (no producer ids handed out, no reassignment in progress, no replica
//! offline, no security metadata, each broker's one `PLAINTEXT` listener at its endpoint).

use std::collections::BTreeMap;

use shardlog_net::peer::decode_message;
use shardlog_storage::LeaderEpoch;
use uuid::Uuid;

use super::state::{
    BrokerEndpoint, BrokerRecord, ClusterState, DEFAULT_LISTENER_NAME, ListenerEndpoint, NodeId, PartitionEpoch,
    PartitionRecord, TopicRecord,
};

/// Snapshot frame kinds: before producer ids, before reassignments, before offline replicas, before
/// security metadata and listeners, today's.
pub const RECORD_SNAPSHOT_V0: u16 = 5;
pub const RECORD_SNAPSHOT_V1: u16 = 6;
pub const RECORD_SNAPSHOT_V2: u16 = 7;
pub const RECORD_SNAPSHOT_V3: u16 = 8;
pub const RECORD_SNAPSHOT: u16 = 9;

/// A broker's record before listeners.
#[derive(Debug, Clone, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct BrokerRecordV0 {
    pub endpoint: BrokerEndpoint,
    pub incarnation: u64,
    pub fenced: bool,
    pub last_heartbeat_ms: i64,
}

fn brokers(old: BTreeMap<NodeId, BrokerRecordV0>) -> BTreeMap<NodeId, BrokerRecord> {
    old.into_iter()
        .map(|(id, b)| {
            let listener = ListenerEndpoint {
                name: DEFAULT_LISTENER_NAME.to_string(),
                host: b.endpoint.host.clone(),
                port: b.endpoint.port,
            };
            let record = BrokerRecord {
                endpoint: b.endpoint,
                listeners: vec![listener],
                incarnation: b.incarnation,
                fenced: b.fenced,
                last_heartbeat_ms: b.last_heartbeat_ms,
            };
            (id, record)
        })
        .collect()
}

/// A partition's record before reassignments.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct PartitionRecordV0 {
    pub replicas: Vec<NodeId>,
    pub isr: Vec<NodeId>,
    pub leader: Option<NodeId>,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
}

#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct TopicRecordV0 {
    pub id: Uuid,
    pub configs: BTreeMap<String, String>,
    pub partitions: Vec<PartitionRecordV0>,
}

/// Snapshot kind [`RECORD_SNAPSHOT_V0`].
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ClusterStateV0 {
    pub brokers: BTreeMap<NodeId, BrokerRecordV0>,
    pub topics: BTreeMap<String, TopicRecordV0>,
}

/// Snapshot kind [`RECORD_SNAPSHOT_V1`].
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ClusterStateV1 {
    pub brokers: BTreeMap<NodeId, BrokerRecordV0>,
    pub topics: BTreeMap<String, TopicRecordV0>,
    pub next_producer_id: i64,
}

/// A partition's record before offline replicas.
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct PartitionRecordV2 {
    pub replicas: Vec<NodeId>,
    pub isr: Vec<NodeId>,
    pub leader: Option<NodeId>,
    pub leader_epoch: LeaderEpoch,
    pub partition_epoch: PartitionEpoch,
    pub adding_replicas: Vec<NodeId>,
    pub removing_replicas: Vec<NodeId>,
}

#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct TopicRecordV2 {
    pub id: Uuid,
    pub configs: BTreeMap<String, String>,
    pub partitions: Vec<PartitionRecordV2>,
}

/// Snapshot kind [`RECORD_SNAPSHOT_V2`].
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ClusterStateV2 {
    pub brokers: BTreeMap<NodeId, BrokerRecordV0>,
    pub topics: BTreeMap<String, TopicRecordV2>,
    pub next_producer_id: i64,
}

/// Snapshot kind [`RECORD_SNAPSHOT_V3`].
#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ClusterStateV3 {
    pub brokers: BTreeMap<NodeId, BrokerRecordV0>,
    pub topics: BTreeMap<String, TopicRecord>,
    pub next_producer_id: i64,
}

fn topics_v2(old: BTreeMap<String, TopicRecordV2>) -> BTreeMap<String, TopicRecord> {
    old.into_iter()
        .map(|(name, t)| {
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| PartitionRecord {
                    leader_epoch: p.leader_epoch,
                    partition_epoch: p.partition_epoch,
                    adding_replicas: p.adding_replicas,
                    removing_replicas: p.removing_replicas,
                    ..PartitionRecord::new(p.replicas, p.isr, p.leader)
                })
                .collect();
            (name, TopicRecord { id: t.id, configs: t.configs, partitions })
        })
        .collect()
}

fn topics(old: BTreeMap<String, TopicRecordV0>) -> BTreeMap<String, TopicRecord> {
    old.into_iter()
        .map(|(name, t)| {
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| PartitionRecord {
                    leader_epoch: p.leader_epoch,
                    partition_epoch: p.partition_epoch,
                    ..PartitionRecord::new(p.replicas, p.isr, p.leader)
                })
                .collect();
            (name, TopicRecord { id: t.id, configs: t.configs, partitions })
        })
        .collect()
}

/// The state a snapshot of frame kind `kind` holds in `bytes`.
pub fn decode_state(kind: u16, bytes: &[u8]) -> Result<ClusterState, String> {
    match kind {
        RECORD_SNAPSHOT => decode_message::<ClusterState>(bytes).map_err(|e| e.to_string()),
        RECORD_SNAPSHOT_V3 => {
            let old: ClusterStateV3 = decode_message(bytes).map_err(|e| e.to_string())?;
            Ok(ClusterState {
                brokers: brokers(old.brokers),
                topics: old.topics,
                next_producer_id: old.next_producer_id,
                security: Default::default(),
            })
        }
        RECORD_SNAPSHOT_V2 => {
            let old: ClusterStateV2 = decode_message(bytes).map_err(|e| e.to_string())?;
            Ok(ClusterState {
                brokers: brokers(old.brokers),
                topics: topics_v2(old.topics),
                next_producer_id: old.next_producer_id,
                security: Default::default(),
            })
        }
        RECORD_SNAPSHOT_V1 => {
            let old: ClusterStateV1 = decode_message(bytes).map_err(|e| e.to_string())?;
            Ok(ClusterState {
                brokers: brokers(old.brokers),
                topics: topics(old.topics),
                next_producer_id: old.next_producer_id,
                security: Default::default(),
            })
        }
        RECORD_SNAPSHOT_V0 => {
            let old: ClusterStateV0 = decode_message(bytes).map_err(|e| e.to_string())?;
            Ok(ClusterState {
                brokers: brokers(old.brokers),
                topics: topics(old.topics),
                next_producer_id: 0,
                security: Default::default(),
            })
        }
        other => Err(format!("snapshot kind {other} is not one this version reads")),
    }
}
