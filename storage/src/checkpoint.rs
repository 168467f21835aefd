//! Text checkpoint files in Kafka's format: a version line, a count line, then one entry per line.
//!
//! ```text
//! 0
//! 2
//! orders 0 1523
//! orders 1 977
//! ```
//!
//! The same layout (with `<epoch> <start offset>` entries) is used by `leader-epoch-checkpoint`. Files are
//! always replaced whole through [`crate::durable::replace_file`].

use std::collections::BTreeMap;
use std::path::Path;

use crate::durable;
use crate::error::{Result, StorageError};
use crate::fs::Fs;
use crate::types::{Offset, TopicPartition};

const VERSION: u32 = 0;
/// Checkpoint files larger than this are refused as corrupt rather than read.
const MAX_CHECKPOINT_BYTES: u64 = 64 << 20;

/// Per-partition offsets for one data dir.
pub type OffsetCheckpoint = BTreeMap<TopicPartition, Offset>;

/// Formats entries as a checkpoint file body.
pub fn format_lines(entries: impl ExactSizeIterator<Item = String>) -> String {
    let mut out = format!("{VERSION}\n{}\n", entries.len());
    for line in entries {
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Splits a checkpoint body into its entry lines, checking the version and count.
pub fn parse_lines<'a>(path: &Path, text: &'a str) -> Result<Vec<&'a str>> {
    let corrupt = |detail: String| StorageError::CorruptFile { path: path.into(), detail };
    let mut lines = text.lines();
    let version = lines.next().ok_or_else(|| corrupt("empty file".into()))?;
    if version.trim() != VERSION.to_string() {
        return Err(corrupt(format!("unsupported version {version:?}")));
    }
    let count: usize =
        lines.next().and_then(|c| c.trim().parse().ok()).ok_or_else(|| corrupt("missing entry count".into()))?;
    let entries: Vec<&str> = lines.filter(|l| !l.trim().is_empty()).collect();
    if entries.len() != count {
        return Err(corrupt(format!("header says {count} entries, file has {}", entries.len())));
    }
    Ok(entries)
}

/// Reads an offset checkpoint; a missing file is an empty checkpoint.
pub async fn read_offsets<F: Fs>(fs: &F, path: &Path) -> Result<OffsetCheckpoint> {
    let Some(bytes) = durable::read_file(fs, path, MAX_CHECKPOINT_BYTES).await? else {
        return Ok(OffsetCheckpoint::new());
    };
    let corrupt = |detail: String| StorageError::CorruptFile { path: path.into(), detail };
    let text = std::str::from_utf8(&bytes).map_err(|e| corrupt(e.to_string()))?;
    let mut out = OffsetCheckpoint::new();
    for line in parse_lines(path, text)? {
        let mut parts = line.split(' ');
        let (Some(topic), Some(partition), Some(offset), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(corrupt(format!("bad entry {line:?}")));
        };
        let partition = partition.parse().map_err(|_| corrupt(format!("bad partition in {line:?}")))?;
        let offset = offset.parse().map_err(|_| corrupt(format!("bad offset in {line:?}")))?;
        out.insert(TopicPartition::new(topic, partition), Offset(offset));
    }
    Ok(out)
}

/// Atomically replaces an offset checkpoint.
pub async fn write_offsets<F: Fs>(fs: &F, path: &Path, offsets: &OffsetCheckpoint) -> Result<()> {
    let body = format_lines(offsets.iter().map(|(tp, o)| format!("{} {} {}", tp.topic, tp.partition, o.0)));
    durable::replace_file(fs, path, body.as_bytes()).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_refuses_count_mismatch_and_unknown_version() {
        let p = Path::new("/x");
        assert_eq!(parse_lines(p, "0\n2\na 0 1\nb 0 2\n").unwrap().len(), 2);
        assert!(parse_lines(p, "0\n3\na 0 1\n").is_err());
        assert!(parse_lines(p, "1\n0\n").is_err());
        assert!(parse_lines(p, "").is_err());
    }
}
