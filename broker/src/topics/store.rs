//! The durable record of topics: names, ids, settings, and each partition's shard and leader epoch.
//!
//! One TOML file, `<data>/topics.toml`, replaced atomically on every change through the storage crate's
//! helper. It is the broker's source of truth until the quorum service takes the role over.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use shardlog_storage::durable;
use shardlog_storage::fs::Fs;
use uuid::Uuid;

use super::configs::{TopicConfig, TopicConfigError, TopicDefaults};
use super::{InvalidTopicName, assign_shard, validate_topic_name};

/// File name of the topic record in the data dir.
pub const TOPICS_FILE: &str = "topics.toml";
/// The most partitions one topic may have.
pub const MAX_PARTITIONS: u32 = 10_000;
/// A topic record larger than this is refused as corrupt rather than read.
const MAX_TOPICS_FILE_BYTES: u64 = 64 << 20;

/// One partition's placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionMeta {
    /// The shard that was assigned the partition (and holds its log).
    pub shard: usize,
    pub leader_epoch: i32,
}

/// A topic as recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicMeta {
    pub id: Uuid,
    pub partitions: Vec<PartitionMeta>,
    /// Topic settings set explicitly, with Kafka's names.
    #[serde(default)]
    pub configs: BTreeMap<String, String>,
}

/// Why a topic operation is refused; each maps to a Kafka error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TopicError {
    #[error(transparent)]
    InvalidName(#[from] InvalidTopicName),
    #[error("topic {0:?} already exists")]
    AlreadyExists(String),
    #[error("topic {0:?} does not exist")]
    Unknown(String),
    #[error("invalid partition count {count}: {reason}")]
    InvalidPartitions { count: i64, reason: String },
    #[error(transparent)]
    InvalidConfig(#[from] TopicConfigError),
    #[error("topic record {path}: {reason}")]
    Corrupt { path: String, reason: String },
    #[error("write topic record: {0}")]
    Storage(String),
}

/// All topics, keyed by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicStore {
    #[serde(default)]
    pub topics: BTreeMap<String, TopicMeta>,
}

impl TopicStore {
    /// Reads the record; a missing file is an empty store.
    pub async fn load<F: Fs>(fs: &F, data_dir: &Path) -> Result<TopicStore, TopicError> {
        let path = data_dir.join(TOPICS_FILE);
        let corrupt = |reason: String| TopicError::Corrupt { path: path.display().to_string(), reason };
        let Some(bytes) =
            durable::read_file(fs, &path, MAX_TOPICS_FILE_BYTES).await.map_err(|e| corrupt(e.to_string()))?
        else {
            return Ok(TopicStore::default());
        };
        let text = std::str::from_utf8(&bytes).map_err(|e| corrupt(e.to_string()))?;
        Self::parse(&path, text)
    }

    /// Reads the record with plain blocking I/O, before any shard runs; a missing file is an empty store.
    pub fn load_blocking(data_dir: &Path) -> Result<TopicStore, TopicError> {
        let path = data_dir.join(TOPICS_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => Self::parse(&path, &text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(TopicStore::default()),
            Err(e) => Err(TopicError::Corrupt { path: path.display().to_string(), reason: e.to_string() }),
        }
    }

    fn parse(path: &Path, text: &str) -> Result<TopicStore, TopicError> {
        let corrupt = |reason: String| TopicError::Corrupt { path: path.display().to_string(), reason };
        if text.len() as u64 > MAX_TOPICS_FILE_BYTES {
            return Err(corrupt("larger than the record's bound".into()));
        }
        let store: TopicStore = toml::from_str(text).map_err(|e| corrupt(e.to_string()))?;
        for (name, topic) in &store.topics {
            validate_topic_name(name).map_err(|e| corrupt(e.to_string()))?;
            if topic.partitions.is_empty() {
                return Err(corrupt(format!("topic {name:?} has no partitions")));
            }
        }
        Ok(store)
    }

    /// Replaces the record durably.
    pub async fn save<F: Fs>(&self, fs: &F, data_dir: &Path) -> Result<(), TopicError> {
        let text = toml::to_string(self).map_err(|e| TopicError::Storage(e.to_string()))?;
        durable::replace_file(fs, &data_dir.join(TOPICS_FILE), text.as_bytes())
            .await
            .map_err(|e| TopicError::Storage(e.to_string()))
    }

    /// Adds a topic after checking its name, partition count and settings. Does not save.
    pub fn create(
        &mut self,
        name: &str,
        partitions: i64,
        configs: BTreeMap<String, String>,
        defaults: &TopicDefaults,
        shards: usize,
    ) -> Result<&TopicMeta, TopicError> {
        validate_topic_name(name)?;
        if self.topics.contains_key(name) {
            return Err(TopicError::AlreadyExists(name.to_string()));
        }
        check_partition_count(partitions)?;
        TopicConfig::resolve(defaults, &configs)?;
        let partitions = (0..partitions as u32)
            .map(|p| PartitionMeta { shard: assign_shard(name, p, shards), leader_epoch: 0 })
            .collect();
        let topic = TopicMeta { id: Uuid::new_v4(), partitions, configs };
        Ok(self.topics.entry(name.to_string()).or_insert(topic))
    }

    /// Grows a topic to `total` partitions (Kafka's CreatePartitions). Does not save.
    pub fn add_partitions(&mut self, name: &str, total: i64, shards: usize) -> Result<(), TopicError> {
        let topic = self.topics.get_mut(name).ok_or_else(|| TopicError::Unknown(name.to_string()))?;
        check_partition_count(total)?;
        let current = topic.partitions.len() as i64;
        if total <= current {
            return Err(TopicError::InvalidPartitions {
                count: total,
                reason: format!("topic already has {current} partitions; the count can only grow"),
            });
        }
        for p in current as u32..total as u32 {
            topic.partitions.push(PartitionMeta { shard: assign_shard(name, p, shards), leader_epoch: 0 });
        }
        Ok(())
    }

    /// Removes a topic. Does not save.
    pub fn delete(&mut self, name: &str) -> Result<TopicMeta, TopicError> {
        self.topics.remove(name).ok_or_else(|| TopicError::Unknown(name.to_string()))
    }

    /// The shard serving a partition now: the recorded one, unless the shard count shrank below it.
    pub fn serving_shard(&self, name: &str, partition: u32, shards: usize) -> Option<usize> {
        let meta = self.topics.get(name)?.partitions.get(partition as usize)?;
        Some(if meta.shard < shards { meta.shard } else { assign_shard(name, partition, shards) })
    }
}

fn check_partition_count(count: i64) -> Result<(), TopicError> {
    if count < 1 || count > MAX_PARTITIONS as i64 {
        return Err(TopicError::InvalidPartitions { count, reason: format!("must be in [1, {MAX_PARTITIONS}]") });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use futures_lite::future::block_on;
    use shardlog_storage::LogConfig;
    use shardlog_storage::fs::sim::{SimFs, SimRng};

    use super::*;

    fn defaults() -> TopicDefaults {
        TopicDefaults { log: LogConfig::default(), min_insync_replicas: 1, unclean_leader_election: false }
    }

    #[test]
    fn topics_are_created_validated_and_survive_a_crash_once_saved() {
        let fs = SimFs::new();
        let dir = Path::new("/data");
        block_on(fs.create_dir_all(dir)).unwrap();
        let mut store = block_on(TopicStore::load(&fs, dir)).unwrap();
        assert!(store.topics.is_empty());
        let configs: BTreeMap<_, _> = [("retention.ms".to_string(), "60000".to_string())].into();
        let created = store.create("orders", 6, configs.clone(), &defaults(), 2).unwrap().clone();
        assert_eq!(created.partitions.len(), 6);
        assert_eq!(created.partitions.iter().filter(|p| p.shard == 0).count(), 3);
        assert_eq!(
            store.create("orders", 1, BTreeMap::new(), &defaults(), 2),
            Err(TopicError::AlreadyExists("orders".into()))
        );
        assert!(matches!(
            store.create("bad name", 1, BTreeMap::new(), &defaults(), 2),
            Err(TopicError::InvalidName(_))
        ));
        assert!(matches!(
            store.create("t", 0, BTreeMap::new(), &defaults(), 2),
            Err(TopicError::InvalidPartitions { .. })
        ));
        let unknown: BTreeMap<_, _> = [("retention.hours".to_string(), "1".to_string())].into();
        assert!(matches!(store.create("t", 1, unknown, &defaults(), 2), Err(TopicError::InvalidConfig(_))));
        store.add_partitions("orders", 8, 2).unwrap();
        assert!(matches!(store.add_partitions("orders", 8, 2), Err(TopicError::InvalidPartitions { .. })));
        block_on(store.save(&fs, dir)).unwrap();

        let after_crash = fs.crash(&mut SimRng::new(1));
        let loaded = block_on(TopicStore::load(&after_crash, dir)).unwrap();
        assert_eq!(loaded, store, "a saved record survives power loss whole");
        assert_eq!(loaded.topics["orders"].configs, configs);

        // More shards later: recorded placements stay; fewer: partitions on missing shards move.
        assert_eq!(loaded.serving_shard("orders", 1, 4), Some(loaded.topics["orders"].partitions[1].shard));
        assert!(loaded.serving_shard("orders", 1, 1) == Some(0));
        assert_eq!(loaded.serving_shard("orders", 99, 2), None);
        let mut loaded = loaded;
        loaded.delete("orders").unwrap();
        assert_eq!(loaded.delete("orders"), Err(TopicError::Unknown("orders".into())));
    }

    #[test]
    fn a_corrupt_record_is_refused_not_guessed() {
        let fs = SimFs::new();
        let dir = Path::new("/data");
        block_on(fs.create_dir_all(dir)).unwrap();
        block_on(durable::replace_file(&fs, &dir.join(TOPICS_FILE), b"[topics.\"bad name\"]\nid = \"x\"")).unwrap();
        assert!(matches!(block_on(TopicStore::load(&fs, dir)), Err(TopicError::Corrupt { .. })));
    }
}
