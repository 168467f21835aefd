//! Which topic a partition's log belongs to: the `partition.metadata` file naming its topic id, and what
//! becomes of a log left by an earlier topic of the same name (set aside, never served or destroyed).

use shardlog_storage::durable;
use shardlog_storage::fs::dma::DmaFs;
use shardlog_storage::{LogConfig, LogDir, PartitionLog, TopicPartition};

/// The file in a partition directory naming the topic (by id) its log belongs to, as Kafka's
/// `partition.metadata`: `version: 0` and `topic_id: <uuid>` lines.
pub const PARTITION_METADATA_FILE: &str = "partition.metadata";

pub(super) async fn ensure_log(
    logs: &LogDir<DmaFs>,
    tp: &TopicPartition,
    topic_id: uuid::Uuid,
    config: LogConfig,
) -> Result<(), String> {
    // The whole data dir is offline (a failing disk): hosted, never created.
    if logs.hold_offline(tp) {
        return Ok(());
    }
    if logs.offline(tp).is_some() {
        let dir = logs.path().join(tp.dir_name());
        match topic_id_in(&dir).await? {
            // An earlier topic of this name: its damaged log is kept aside, the new topic starts afresh.
            Some(id) if id != topic_id => {
                let aside = logs.set_aside(tp).await.map_err(|e| e.to_string())?;
                tracing::warn!(partition = %tp, old = %id, new = %topic_id, ?aside, "damaged log of an earlier topic of this name set aside");
            }
            // Hosted, and offline until repaired (logged when it was found).
            _ => return Ok(()),
        }
    }
    if let Some(log) = logs.get(tp) {
        match recorded_topic_id(&log).await? {
            Some(id) if id != topic_id => {
                // An earlier topic of this name, deleted (and this one created) while this broker was away;
                // or the quorum lost its state and the topic was created anew. Kept, not served.
                let aside = logs.set_aside(tp).await.map_err(|e| e.to_string())?;
                tracing::warn!(partition = %tp, old = %id, new = %topic_id, ?aside, "log of an earlier topic of this name set aside");
            }
            // Opened at start with the default settings, or the topic's settings changed.
            Some(_) => return log.set_config(config).map_err(|e| e.to_string()),
            // Created just before a crash, before its topic was recorded (no client has seen it yet).
            None => {
                log.set_config(config).map_err(|e| e.to_string())?;
                return record_topic_id(&log, topic_id).await;
            }
        }
    }
    let log = logs.get_or_create(tp, config).await.map_err(|e| e.to_string())?;
    record_topic_id(&log, topic_id).await
}

pub(super) async fn recorded_topic_id(log: &PartitionLog<DmaFs>) -> Result<Option<uuid::Uuid>, String> {
    topic_id_in(log.dir()).await
}

/// The topic id recorded in a partition directory's [`PARTITION_METADATA_FILE`], if any.
async fn topic_id_in(dir: &std::path::Path) -> Result<Option<uuid::Uuid>, String> {
    let path = dir.join(PARTITION_METADATA_FILE);
    let Some(bytes) = durable::read_file(&DmaFs, &path, 4096).await.map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let text = String::from_utf8_lossy(&bytes);
    let id = text.lines().find_map(|line| line.strip_prefix("topic_id:")).map(|v| v.trim().parse::<uuid::Uuid>());
    match id {
        Some(Ok(id)) => Ok(Some(id)),
        _ => Err(format!("{}: no readable topic_id", path.display())),
    }
}

async fn record_topic_id(log: &PartitionLog<DmaFs>, topic_id: uuid::Uuid) -> Result<(), String> {
    let path = log.dir().join(PARTITION_METADATA_FILE);
    let body = format!("version: 0\ntopic_id: {topic_id}\n");
    durable::replace_file(&DmaFs, &path, body.as_bytes()).await.map_err(|e| e.to_string())
}
