//! One-time import of the topic record brokers kept in their data dir before the quorum held the cluster
//! metadata (`<data>/topics.toml`, single-node brokers only): each topic recorded there is created in the
//! quorum with its recorded id, settings and partition count, all on this broker, before the broker
//! serves anyone, so its logs are kept rather than set aside as strays. The file is then renamed to
//! `topics.toml.imported`; if any topic could not be imported it stays, the next start tries again, and
//! meanwhile no log is set aside as a stray.

use std::collections::BTreeMap;

use serde::Deserialize;
use uuid::Uuid;

use super::link::Link;
use crate::quorum::state::Command;
use crate::quorum::wire::WireWriteResult;
use crate::topics::MAX_PARTITIONS;

/// The old record's file name in the data dir.
pub const OLD_TOPICS_FILE: &str = "topics.toml";
/// The old record's bound (it was refused as corrupt beyond it).
const MAX_OLD_TOPICS_FILE_BYTES: u64 = 64 << 20;

#[derive(Debug, Deserialize)]
struct OldRecord {
    #[serde(default)]
    topics: BTreeMap<String, OldTopic>,
}

#[derive(Debug, Deserialize)]
struct OldTopic {
    id: Uuid,
    /// One entry per partition (its shard and leader epoch, which the quorum now decides).
    partitions: Vec<toml::Value>,
    #[serde(default)]
    configs: BTreeMap<String, String>,
}

/// How long the import waits for the follower to see the registration (to learn which topics exist).
const IMAGE_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Imports the old record if there is one; returns the index of the last command committed for it (or
/// `registered_at`), which the broker's metadata must reach before it serves. If some topic could not be
/// imported, the link is marked so that no log is set aside as a stray in this run.
pub(super) async fn import_topics_file(link: &Link, registered_at: u64, incarnation: u64) -> u64 {
    let settings = link.settings();
    let path = settings.data_dir.join(OLD_TOPICS_FILE);
    let text = match std::fs::metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return registered_at,
        Ok(meta) if meta.len() > MAX_OLD_TOPICS_FILE_BYTES => Err("larger than its bound".to_string()),
        _ => std::fs::read_to_string(&path).map_err(|e| e.to_string()),
    };
    let record = text.and_then(|t| toml::from_str::<OldRecord>(&t).map_err(|e| e.to_string()));
    let incomplete = |reason: &dyn std::fmt::Display| {
        tracing::error!(path = %path.display(), %reason, "old topic record not (wholly) imported; no log is set aside");
        link.mark_import_incomplete();
    };
    let record = match record {
        Ok(record) => record,
        Err(reason) => {
            incomplete(&reason);
            return registered_at;
        }
    };
    // What the quorum already holds: topics imported by an earlier start that stopped before the rename.
    let Some(image) = link.image_at(registered_at, IMAGE_WAIT).await else {
        incomplete(&"the metadata did not reach this broker's registration in time");
        return registered_at;
    };
    let mut last = registered_at;
    let mut complete = true;
    let mut heartbeat_due = tokio::time::Instant::now() + settings.heartbeat_interval;
    for (name, topic) in record.topics {
        let partitions = topic.partitions.len() as u32;
        if let Some(existing) = image.topic(&name) {
            if existing.id != topic.id || existing.partitions.len() as u32 != partitions {
                incomplete(&format!("topic {name:?} exists in the quorum as another topic"));
                complete = false;
            }
            continue;
        }
        if crate::topics::validate_topic_name(&name).is_err() || partitions == 0 || partitions > MAX_PARTITIONS {
            incomplete(&format!("topic {name:?}: invalid name or partition count {partitions}"));
            complete = false;
            continue;
        }
        if link.shutdown().is_triggered() {
            incomplete(&"the broker is stopping");
            return last;
        }
        let command = Command::CreateTopic {
            name: name.clone(),
            id: topic.id,
            partitions,
            replication_factor: 1,
            configs: topic.configs,
            assignment: Some(vec![vec![settings.node]; partitions as usize]),
        };
        match link.commit(command).await {
            WireWriteResult::Applied { index, outcome: Ok(_) } => {
                last = last.max(index);
                tracing::info!(topic = %name, partitions, "imported topic from the old topic record");
            }
            other => {
                incomplete(&format!("topic {name:?}: {other:?}"));
                complete = false;
            }
        }
        if tokio::time::Instant::now() >= heartbeat_due {
            link.heartbeat(incarnation).await;
            heartbeat_due = tokio::time::Instant::now() + settings.heartbeat_interval;
        }
    }
    if complete {
        let imported = settings.data_dir.join(format!("{OLD_TOPICS_FILE}.imported"));
        let renamed = std::fs::rename(&path, &imported)
            .and_then(|()| std::fs::File::open(&settings.data_dir).and_then(|d| d.sync_all()));
        if let Err(e) = renamed {
            tracing::warn!(path = %path.display(), error = %e, "imported, but cannot rename the old topic record");
        }
    }
    last
}
