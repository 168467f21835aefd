//! The aborted-transactions index: Kafka's `.txnindex` file beside a segment, one entry per ABORT marker
//! in that segment, in log order.
//!
//! | bytes  | field                                                           | type |
//! |--------|-----------------------------------------------------------------|------|
//! | 0..2   | version (= 0)                                                   | i16  |
//! | 2..10  | producer id                                                     | i64  |
//! | 10..18 | first offset of the aborted transaction                         | i64  |
//! | 18..26 | last offset: the ABORT marker's offset                          | i64  |
//! | 26..34 | last stable offset when the marker was written (see below)      | i64  |
//!
//! The last stable offset of an entry is the first offset of the earliest transaction still open (of
//! another producer) when the marker was written, or the marker's offset + 1 if none was: no transaction
//! aborted later can start below it. A read_committed fetch looks for the aborted transactions
//! overlapping what it returns segment by segment, and stops at the first entry whose last stable offset
//! is at or past the end of what it returns (Kafka's `collectAbortedTransactions`).
//!
//! The entries are derived from the log alone (markers and the transactions open before them), so a
//! file that does not check is rebuilt from the log, never trusted (`docs/storage-format.md` §3).

use crate::types::Offset;

/// Suffix of a segment's aborted-transactions index.
pub const TXN_INDEX_SUFFIX: &str = ".txnindex";
/// Bytes of one entry.
pub const ENTRY_BYTES: usize = 34;

/// One aborted transaction, as its ABORT marker recorded it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: Offset,
    /// The ABORT marker's offset.
    pub last_offset: Offset,
    pub last_stable_offset: Offset,
}

/// What a read_committed fetch answers for each aborted transaction its records overlap (Kafka's
/// `FetchResponse.AbortedTransaction`): the consumer drops that producer's records from `first_offset`
/// up to the producer's ABORT marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AbortedRange {
    pub producer_id: i64,
    pub first_offset: Offset,
}

impl AbortedTxn {
    fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&0i16.to_be_bytes());
        out.extend_from_slice(&self.producer_id.to_be_bytes());
        out.extend_from_slice(&self.first_offset.as_i64().to_be_bytes());
        out.extend_from_slice(&self.last_offset.as_i64().to_be_bytes());
        out.extend_from_slice(&self.last_stable_offset.as_i64().to_be_bytes());
    }
}

/// The file's bytes for `entries`.
pub fn encode(entries: &[AbortedTxn]) -> Vec<u8> {
    let mut out = Vec::with_capacity(entries.len() * ENTRY_BYTES);
    for entry in entries {
        entry.encode_into(&mut out);
    }
    out
}

/// Reads the file of the segment whose batches hold offsets `[base, end)`. Refused unless the length is a
/// whole number of entries, each of version 0, with `first ≤ last` offset, a marker inside the segment,
/// a non-negative producer id, and markers in increasing order: a torn or stale file fails one of these
/// and is rebuilt from the log instead.
pub fn decode(bytes: &[u8], base: Offset, end: Offset) -> Result<Vec<AbortedTxn>, String> {
    if !bytes.len().is_multiple_of(ENTRY_BYTES) {
        return Err(format!("{} bytes is not a whole number of {ENTRY_BYTES}-byte entries", bytes.len()));
    }
    let mut entries: Vec<AbortedTxn> = Vec::with_capacity(bytes.len() / ENTRY_BYTES);
    for raw in bytes.chunks_exact(ENTRY_BYTES) {
        let i64_at = |at: usize| i64::from_be_bytes(raw[at..at + 8].try_into().expect("8 bytes"));
        let version = i16::from_be_bytes([raw[0], raw[1]]);
        let (producer_id, first, last, lso) = (i64_at(2), i64_at(10), i64_at(18), i64_at(26));
        if version != 0 || producer_id < 0 || first < 0 || lso < 0 || first > last {
            return Err(format!("bad entry: version {version}, producer {producer_id}, offsets {first}..{last}"));
        }
        let entry = AbortedTxn {
            producer_id,
            first_offset: Offset(first as u64),
            last_offset: Offset(last as u64),
            last_stable_offset: Offset(lso as u64),
        };
        if entry.last_offset < base || entry.last_offset >= end {
            return Err(format!("marker {} outside the segment {base}..{end}", entry.last_offset));
        }
        if entries.last().is_some_and(|prev| prev.last_offset >= entry.last_offset) {
            return Err(format!("marker {} out of order", entry.last_offset));
        }
        entries.push(entry);
    }
    Ok(entries)
}

/// Adds to `out` the transactions of `entries` (one segment's, in order) that overlap `[from, upto)`.
/// Returns true once the search is complete: an entry's last stable offset reached `upto`, so no later
/// segment can hold a transaction that starts below it.
pub fn collect_overlapping(entries: &[AbortedTxn], from: Offset, upto: Offset, out: &mut Vec<AbortedRange>) -> bool {
    for entry in entries {
        if entry.last_offset >= from && entry.first_offset < upto {
            out.push(AbortedRange { producer_id: entry.producer_id, first_offset: entry.first_offset });
        }
        if entry.last_stable_offset >= upto {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(pid: i64, first: u64, last: u64, lso: u64) -> AbortedTxn {
        AbortedTxn {
            producer_id: pid,
            first_offset: Offset(first),
            last_offset: Offset(last),
            last_stable_offset: Offset(lso),
        }
    }

    #[test]
    fn entries_round_trip_in_kafkas_34_byte_layout() {
        let entries = vec![entry(1, 10, 20, 15), entry(2, 12, 25, 26)];
        let bytes = encode(&entries);
        assert_eq!(bytes.len(), 68);
        assert_eq!(&bytes[0..2], &[0, 0], "version 0");
        assert_eq!(&bytes[2..10], &1i64.to_be_bytes());
        assert_eq!(&bytes[26..34], &15i64.to_be_bytes());
        assert_eq!(decode(&bytes, Offset(5), Offset(30)), Ok(entries));
    }

    #[test]
    fn a_torn_or_stale_file_is_refused() {
        let bytes = encode(&[entry(1, 10, 20, 15), entry(2, 12, 25, 26)]);
        assert!(decode(&bytes[..50], Offset(0), Offset(30)).is_err(), "partial entry");
        assert!(decode(&bytes, Offset(0), Offset(25)).is_err(), "a marker past the segment's end");
        assert!(decode(&bytes, Offset(21), Offset(30)).is_err(), "a marker before the segment's base");
        let swapped = encode(&[entry(2, 12, 25, 26), entry(1, 10, 20, 15)]);
        assert!(decode(&swapped, Offset(0), Offset(30)).is_err(), "out of order");
        assert!(decode(&[0u8; 34], Offset(0), Offset(30)).is_ok(), "zeros are an entry at offset 0 of segment 0");
        assert!(decode(&[0u8; 34], Offset(1), Offset(30)).is_err(), "zeros elsewhere are not");
        let mut version = bytes.clone();
        version[1] = 1;
        assert!(decode(&version, Offset(0), Offset(30)).is_err(), "unknown version");
    }

    #[test]
    fn the_search_takes_overlapping_transactions_and_stops_at_the_last_stable_offset() {
        let entries = [entry(1, 0, 4, 5), entry(2, 6, 9, 7), entry(3, 8, 12, 20), entry(4, 21, 30, 31)];
        let mut out = Vec::new();
        assert!(collect_overlapping(&entries, Offset(5), Offset(10), &mut out));
        let pids: Vec<i64> = out.iter().map(|r| r.producer_id).collect();
        assert_eq!(pids, [2, 3], "1 ended before the read, 4 starts after it; 3's LSO 20 ends the search");
        let mut out = Vec::new();
        assert!(!collect_overlapping(&entries[..2], Offset(0), Offset(10), &mut out));
        assert_eq!(out.len(), 2);
    }
}
