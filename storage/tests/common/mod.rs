//! Helpers shared by the storage integration tests.
#![allow(dead_code)]

use std::cell::Cell;
use std::rc::Rc;

use shardlog_storage::batch::{self, BatchHeader};
use shardlog_storage::{Clock, LogConfig};

/// A clock the test moves by hand.
#[derive(Debug, Default)]
pub struct ManualClock(pub Cell<i64>);

impl ManualClock {
    pub fn new(now_ms: i64) -> Rc<ManualClock> {
        Rc::new(ManualClock(Cell::new(now_ms)))
    }
    pub fn advance(&self, ms: i64) {
        self.0.set(self.0.get() + ms);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.get()
    }
}

/// A valid batch of `count` records, each `value_len` bytes derived from `seed`.
pub fn make_batch(seed: u64, count: usize, value_len: usize, timestamp: i64) -> Vec<u8> {
    let values: Vec<Vec<u8>> = (0..count)
        .map(|i| (0..value_len).map(|j| (seed as usize).wrapping_mul(31).wrapping_add(i * 7 + j) as u8).collect())
        .collect();
    let refs: Vec<&[u8]> = values.iter().map(|v| v.as_slice()).collect();
    batch::build_batch(timestamp, &refs)
}

/// Splits a read's bytes into (base offset, last offset, batch bytes).
pub fn split_batches(bytes: &[u8]) -> Vec<(u64, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < bytes.len() {
        let h = BatchHeader::parse(&bytes[pos..]).expect("stored batch header");
        let total = h.total_bytes();
        out.push((
            h.base_offset as u64,
            h.base_offset as u64 + h.last_offset_delta as u64,
            bytes[pos..pos + total].to_vec(),
        ));
        pos += total;
    }
    assert_eq!(pos, bytes.len(), "read returned a partial batch");
    out
}

/// Small segments and a dense index so a few dozen appends exercise rolls, index lookups and disk reads.
pub fn small_config() -> LogConfig {
    LogConfig {
        segment_bytes: 6 * 1024,
        index_interval_bytes: 300,
        tail_cache_bytes: 0,
        retention_ms: None,
        ..LogConfig::default()
    }
}

/// Makes `batch` a batch of an idempotent producer: producer id, epoch and base sequence set, CRC redone.
pub fn set_producer(batch: &mut [u8], producer_id: i64, epoch: i16, base_sequence: i32) {
    batch[43..51].copy_from_slice(&producer_id.to_be_bytes());
    batch[51..53].copy_from_slice(&epoch.to_be_bytes());
    batch[53..57].copy_from_slice(&base_sequence.to_be_bytes());
    let crc = batch::compute_crc(batch);
    batch[17..21].copy_from_slice(&crc.to_be_bytes());
}
