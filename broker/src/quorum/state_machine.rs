//! The Raft state machine around [`ClusterState`]: applies committed commands in log order, builds and
//! installs snapshots.
//!
//! The state itself lives in memory; what survives a restart is the latest snapshot (`raft-snapshot`,
//! replaced atomically) and the Raft log after it, which openraft applies again at start. A snapshot is a
//! peer-protocol frame whose body is an rkyv archive of its metadata and the state.

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use openraft::storage::{RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, RaftSnapshotBuilder, SnapshotMeta, StorageError, StoredMembership,
};
use shardlog_net::peer::{PeerFrameReader, decode_message, encode_frame, encode_message};

use super::legacy::{self, RECORD_SNAPSHOT};
use super::log_store::replace_file;

/// The least room kept for the next snapshot.
const SNAPSHOT_SPARE_BYTES: u64 = 1 << 20;
use super::state::ClusterState;
use super::wire::{CommandOutcome, QuorumConfig, WireLogId, WireStoredMembership};

const SNAPSHOT_FILE: &str = "raft-snapshot";
const MAX_SNAPSHOT_BYTES: u32 = 1 << 30;

#[derive(Debug, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
struct SnapshotFile {
    last_log_id: Option<WireLogId>,
    membership: WireStoredMembership,
    snapshot_id: String,
    /// rkyv archive of the [`ClusterState`]: the snapshot's data as sent to followers.
    state: Vec<u8>,
}

#[derive(Debug)]
struct SmInner {
    dir: PathBuf,
    state: ClusterState,
    last_applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
    /// The latest snapshot: its metadata and data.
    snapshot: Option<(SnapshotMeta<u64, BasicNode>, Vec<u8>)>,
    snapshots_built: u64,
}

/// The state machine handed to openraft. Clones share it; [`StateMachineStore::state`] reads it.
#[derive(Debug, Clone)]
pub struct StateMachineStore {
    inner: Arc<Mutex<SmInner>>,
    /// The index of the last applied entry, for metadata fetches waiting for something new.
    applied: Arc<tokio::sync::watch::Sender<Option<u64>>>,
}

fn decode_state(bytes: &[u8]) -> Result<ClusterState, String> {
    decode_message::<ClusterState>(bytes).map_err(|e| e.to_string())
}

fn snapshot_error(e: impl std::fmt::Display) -> StorageError<u64> {
    openraft::StorageIOError::read_snapshot(None, openraft::AnyError::error(e.to_string())).into()
}

impl StateMachineStore {
    /// Opens the state machine in `dir`, starting from the snapshot there if any.
    pub fn open(dir: &Path) -> std::io::Result<StateMachineStore> {
        let mut inner = SmInner {
            dir: dir.to_path_buf(),
            state: ClusterState::default(),
            last_applied: None,
            membership: StoredMembership::default(),
            snapshot: None,
            snapshots_built: 0,
        };
        let path = dir.join(SNAPSHOT_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let invalid = |what: String| {
                    std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {what}", path.display()))
                };
                let mut reader = PeerFrameReader::new(MAX_SNAPSHOT_BYTES);
                reader.extend(&bytes);
                let frame = match reader.next_frame() {
                    Ok(Some(frame)) => frame,
                    other => return Err(invalid(format!("not a snapshot: {other:?}"))),
                };
                let mut file: SnapshotFile = decode_message(&frame.body).map_err(|e| invalid(e.to_string()))?;
                inner.state = legacy::decode_state(frame.kind, &file.state).map_err(invalid)?;
                if frame.kind != RECORD_SNAPSHOT {
                    // Followers are sent today's layout.
                    file.state = encode_message(&inner.state);
                }
                inner.last_applied = file.last_log_id.map(Into::into);
                inner.membership = file.membership.into();
                let meta = SnapshotMeta {
                    last_log_id: inner.last_applied,
                    last_membership: inner.membership.clone(),
                    snapshot_id: file.snapshot_id,
                };
                inner.snapshot = Some((meta, file.state));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        // Room for the next snapshot even if the disk fills before it is taken (the first one included).
        let size = std::fs::metadata(&path).map_or(0, |m| m.len());
        super::log_store::reserve_spare(&path, (size * 2).max(SNAPSHOT_SPARE_BYTES));
        let applied = Arc::new(tokio::sync::watch::Sender::new(inner.last_applied.map(|l| l.index)));
        Ok(StateMachineStore { inner: Arc::new(Mutex::new(inner)), applied })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SmInner> {
        self.inner.lock().expect("the state machine lock is never poisoned: nothing panics while holding it")
    }

    /// The voter ids of the membership the latest snapshot holds, if any.
    pub fn snapshot_membership_voters(&self) -> Option<Vec<u64>> {
        let inner = self.lock();
        let (meta, _) = inner.snapshot.as_ref()?;
        Some(meta.last_membership.membership().voter_ids().collect())
    }

    /// Watches the index of the last applied entry.
    pub fn subscribe_applied(&self) -> tokio::sync::watch::Receiver<Option<u64>> {
        self.applied.subscribe()
    }

    /// A copy of the current state and the log id it includes.
    pub fn state(&self) -> (ClusterState, Option<LogId<u64>>) {
        let inner = self.lock();
        (inner.state.clone(), inner.last_applied)
    }
}

impl SmInner {
    fn persist_snapshot(&mut self, meta: SnapshotMeta<u64, BasicNode>, data: Vec<u8>) {
        let file = SnapshotFile {
            last_log_id: meta.last_log_id.map(Into::into),
            membership: (&meta.last_membership).into(),
            snapshot_id: meta.snapshot_id.clone(),
            state: data,
        };
        replace_file(&self.dir.join(SNAPSHOT_FILE), &encode_frame(RECORD_SNAPSHOT, &encode_message(&file)));
        self.snapshot = Some((meta, file.state));
    }
}

impl RaftSnapshotBuilder<QuorumConfig> for StateMachineStore {
    async fn build_snapshot(&mut self) -> Result<Snapshot<QuorumConfig>, StorageError<u64>> {
        let mut inner = self.lock();
        inner.snapshots_built += 1;
        let last = inner.last_applied;
        let snapshot_id = format!(
            "{}-{}-{}",
            last.map_or(0, |l| l.leader_id.term),
            last.map_or(0, |l| l.index),
            inner.snapshots_built
        );
        let meta = SnapshotMeta { last_log_id: last, last_membership: inner.membership.clone(), snapshot_id };
        let data = encode_message(&inner.state);
        inner.persist_snapshot(meta.clone(), data.clone());
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(data)) })
    }
}

impl RaftStateMachine<QuorumConfig> for StateMachineStore {
    type SnapshotBuilder = StateMachineStore;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), StorageError<u64>> {
        let inner = self.lock();
        Ok((inner.last_applied, inner.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<CommandOutcome>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<QuorumConfig>> + Send,
        I::IntoIter: Send,
    {
        let mut inner = self.lock();
        let mut outcomes = Vec::new();
        for entry in entries {
            inner.last_applied = Some(entry.log_id);
            match entry.payload {
                EntryPayload::Blank => outcomes.push(Ok(Vec::new())),
                EntryPayload::Normal(command) => {
                    let outcome = inner.state.apply(&command);
                    if let Ok(events) = &outcome {
                        super::event_log::log_events(&command, events);
                    }
                    outcomes.push(outcome);
                }
                EntryPayload::Membership(m) => {
                    inner.membership = StoredMembership::new(Some(entry.log_id), m);
                    outcomes.push(Ok(Vec::new()));
                }
            }
        }
        self.applied.send_replace(inner.last_applied.map(|l| l.index));
        Ok(outcomes)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let data = snapshot.into_inner();
        // Validated before anything is replaced. A snapshot that does not decode (it passed the frame CRC
        // and archive checks on the wire, so this is a bug, not noise) stops this voter's Raft, with the
        // state machine as it was.
        let state = decode_state(&data).map_err(snapshot_error)?;
        let mut inner = self.lock();
        inner.persist_snapshot(meta.clone(), data);
        inner.state = state;
        inner.last_applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
        self.applied.send_replace(inner.last_applied.map(|l| l.index));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<QuorumConfig>>, StorageError<u64>> {
        let inner = self.lock();
        Ok(inner
            .snapshot
            .as_ref()
            .map(|(meta, data)| Snapshot { meta: meta.clone(), snapshot: Box::new(Cursor::new(data.clone())) }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quorum::state::{
        BrokerEndpoint, BrokerRecord, ListenerEndpoint, NodeId, PartitionEpoch, PartitionRecord, TopicRecord,
    };

    fn write_snapshot(dir: &Path, kind: u16, state: Vec<u8>) {
        let file = SnapshotFile {
            last_log_id: None,
            membership: (&StoredMembership::<u64, BasicNode>::default()).into(),
            snapshot_id: "old".into(),
            state,
        };
        std::fs::write(dir.join(SNAPSHOT_FILE), encode_frame(kind, &encode_message(&file))).unwrap();
    }

    /// A broker's record in the layouts before listeners.
    fn old_broker() -> legacy::BrokerRecordV0 {
        legacy::BrokerRecordV0 {
            endpoint: BrokerEndpoint { host: "127.0.0.1".into(), port: 9092 },
            incarnation: 7,
            fenced: false,
            last_heartbeat_ms: 5,
        }
    }

    /// What the old broker record is today: its one listener, `PLAINTEXT`, at its endpoint.
    fn broker() -> BrokerRecord {
        BrokerRecord {
            endpoint: BrokerEndpoint { host: "127.0.0.1".into(), port: 9092 },
            listeners: vec![ListenerEndpoint { name: "PLAINTEXT".into(), host: "127.0.0.1".into(), port: 9092 }],
            incarnation: 7,
            fenced: false,
            last_heartbeat_ms: 5,
        }
    }

    fn old_topic() -> legacy::TopicRecordV0 {
        legacy::TopicRecordV0 {
            id: uuid::Uuid::from_u128(9),
            configs: Default::default(),
            partitions: vec![legacy::PartitionRecordV0 {
                replicas: vec![NodeId(1), NodeId(2)],
                isr: vec![NodeId(2)],
                leader: Some(NodeId(2)),
                leader_epoch: shardlog_storage::LeaderEpoch(4),
                partition_epoch: PartitionEpoch(6),
            }],
        }
    }

    /// What the old topic is in today's layout.
    fn today_topic() -> TopicRecord {
        let partition = PartitionRecord {
            leader_epoch: shardlog_storage::LeaderEpoch(4),
            partition_epoch: PartitionEpoch(6),
            ..PartitionRecord::new(vec![NodeId(1), NodeId(2)], vec![NodeId(2)], Some(NodeId(2)))
        };
        TopicRecord { id: uuid::Uuid::from_u128(9), configs: Default::default(), partitions: vec![partition] }
    }

    fn open_and_check(dir: &Path) -> ClusterState {
        let store = StateMachineStore::open(dir).unwrap();
        let (state, _) = store.state();
        assert_eq!(state.brokers.get(&NodeId(1)), Some(&broker()));
        assert_eq!(state.topics.get("t"), Some(&today_topic()));
        // What followers would be sent is in today's layout.
        let (_, data) = store.lock().snapshot.clone().unwrap();
        assert_eq!(decode_state(&data).unwrap(), state);
        state
    }

    #[test]
    fn a_snapshot_file_from_before_producer_ids_opens_with_the_first_id_unused() {
        let dir = tempfile::tempdir().unwrap();
        let old = legacy::ClusterStateV0 {
            brokers: [(NodeId(1), old_broker())].into(),
            topics: [("t".to_string(), old_topic())].into(),
        };
        write_snapshot(dir.path(), legacy::RECORD_SNAPSHOT_V0, encode_message(&old));
        assert_eq!(open_and_check(dir.path()).next_producer_id, 0);
    }

    #[test]
    fn a_snapshot_file_from_before_reassignments_opens_with_none_in_progress() {
        let dir = tempfile::tempdir().unwrap();
        let old = legacy::ClusterStateV1 {
            brokers: [(NodeId(1), old_broker())].into(),
            topics: [("t".to_string(), old_topic())].into(),
            next_producer_id: 3000,
        };
        write_snapshot(dir.path(), legacy::RECORD_SNAPSHOT_V1, encode_message(&old));
        assert_eq!(open_and_check(dir.path()).next_producer_id, 3000);
    }

    #[test]
    fn a_snapshot_file_from_before_offline_replicas_opens_with_every_replica_online() {
        let dir = tempfile::tempdir().unwrap();
        let mut topic = old_topic();
        let p = topic.partitions.remove(0);
        let old = legacy::ClusterStateV2 {
            brokers: [(NodeId(1), old_broker())].into(),
            topics: [(
                "t".to_string(),
                legacy::TopicRecordV2 {
                    id: topic.id,
                    configs: topic.configs,
                    partitions: vec![legacy::PartitionRecordV2 {
                        replicas: p.replicas,
                        isr: p.isr,
                        leader: p.leader,
                        leader_epoch: p.leader_epoch,
                        partition_epoch: p.partition_epoch,
                        adding_replicas: Vec::new(),
                        removing_replicas: Vec::new(),
                    }],
                },
            )]
            .into(),
            next_producer_id: 4000,
        };
        write_snapshot(dir.path(), legacy::RECORD_SNAPSHOT_V2, encode_message(&old));
        let state = open_and_check(dir.path());
        assert_eq!(state.next_producer_id, 4000);
        assert!(state.topics["t"].partitions[0].offline_replicas.is_empty());
    }

    #[test]
    fn a_snapshot_file_from_before_security_metadata_opens_with_plaintext_listeners_and_no_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let old = legacy::ClusterStateV3 {
            brokers: [(NodeId(1), old_broker())].into(),
            topics: [("t".to_string(), today_topic())].into(),
            next_producer_id: 5000,
        };
        write_snapshot(dir.path(), legacy::RECORD_SNAPSHOT_V3, encode_message(&old));
        let state = open_and_check(dir.path());
        assert_eq!(state.next_producer_id, 5000);
        assert_eq!(state.brokers[&NodeId(1)].listener("PLAINTEXT"), Some(("127.0.0.1", 9092)));
        assert_eq!(state.brokers[&NodeId(1)].listener("SASL_SSL"), None);
        assert_eq!(state.security, Default::default());
    }

    #[test]
    fn a_snapshot_in_todays_layout_keeps_the_security_metadata() {
        use crate::quorum::security::{AclRecord, ScramCredentialRecord};
        let dir = tempfile::tempdir().unwrap();
        let mut state = ClusterState::default();
        state.brokers.insert(NodeId(1), broker());
        state.topics.insert("t".into(), today_topic());
        let credential = ScramCredentialRecord {
            salt: vec![1; 16],
            iterations: 4096,
            stored_key: vec![2; 32],
            server_key: vec![3; 32],
        };
        state.security.scram.entry("alice".into()).or_default().insert(1, credential);
        state.security.acls.insert(AclRecord {
            resource_type: 2,
            resource_name: "orders".into(),
            pattern_type: 3,
            principal: "User:alice".into(),
            host: "*".into(),
            operation: 3,
            permission_type: 3,
        });
        state.security.quotas.insert(vec![("user".into(), None)], [("producer_byte_rate".into(), 1024.0)].into());
        state.security.acls_version = 1;
        write_snapshot(dir.path(), RECORD_SNAPSHOT, encode_message(&state));
        assert_eq!(open_and_check(dir.path()), state);
    }

    #[test]
    fn a_snapshot_of_an_unknown_kind_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        write_snapshot(dir.path(), 99, encode_message(&ClusterState::default()));
        let error = StateMachineStore::open(dir.path()).unwrap_err();
        assert!(error.to_string().contains("snapshot kind 99"), "{error}");
    }
}
