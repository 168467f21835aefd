//! A follower's append: the leader's batches stored as they are, at the leader's offsets and epochs.
//! Control batches are stored too, and a transaction marker among them ends its transaction in the
//! follower's producer state as it did in the leader's, so a follower that becomes leader has the same
//! open transactions, last stable offset and aborted-transactions index.

use crate::batch::{self, BatchHeader, HEADER_BYTES};
use crate::error::{Result, StorageError};
use crate::fs::Fs;
use crate::txn::TxnMarker;
use crate::txn::marker::CONTROL_BIT;
use crate::types::Offset;

use super::{AppendInfo, PartitionLog};

impl<F: Fs> PartitionLog<F> {
    /// A follower's append: `bytes` are whole batches as the leader stores them, with the leader's base
    /// offsets and leader epochs, which are kept. The first must start at or after the log end offset and
    /// each after the one before (a compacted leader log has gaps where whole batches were removed); each batch's epoch goes into the epoch cache and its producer fields into the
    /// producer state (without the sequence checks: the leader made them). Every batch is validated (CRC
    /// included) before any is appended, so a refused call leaves the log unchanged. Returns the offsets
    /// the batches took; `None` for no bytes.
    pub async fn append_replicated(&self, bytes: &[u8]) -> Result<Option<AppendInfo>> {
        let mut batches = Vec::new();
        let mut at = 0usize;
        while at < bytes.len() {
            let claimed = batch::claimed_total_bytes(&bytes[at..])
                .filter(|c| *c >= HEADER_BYTES as i64 && *c as usize <= bytes.len() - at)
                .ok_or(StorageError::InvalidBatch(batch::BatchError::TooShort { len: bytes.len() - at }))?;
            let range = at..at + claimed as usize;
            let header = batch::validate_stored(&bytes[range.clone()], i32::MAX as usize)?;
            if let Some((_, previous)) = batches.last() {
                let previous: &BatchHeader = previous;
                let expected = previous.base_offset.saturating_add(previous.last_offset_delta as i64 + 1);
                if header.base_offset < expected {
                    return Err(StorageError::NotAtLogEnd {
                        expected: Offset(expected as u64),
                        got: header.base_offset,
                    });
                }
            }
            batches.push((range, header));
            at += claimed as usize;
        }
        let mut appended: Option<AppendInfo> = None;
        for (range, header) in batches {
            let started = std::time::Instant::now();
            let batch = &bytes[range];
            // A control batch that holds no marker (emptied by compaction, or another kind) changes nothing.
            let marker = (header.attributes & CONTROL_BIT != 0).then(|| TxnMarker::decode(batch)).flatten();
            let info = self.append_validated(batch, &header, None, marker).await;
            crate::metrics::appended(started.elapsed());
            let info = info?;
            appended = Some(match appended {
                None => info,
                Some(first) => AppendInfo {
                    last_offset: info.last_offset,
                    max_timestamp: first.max_timestamp.max(info.max_timestamp),
                    ..first
                },
            });
        }
        Ok(appended)
    }
}
