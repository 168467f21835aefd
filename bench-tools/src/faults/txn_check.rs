//! The transactional workload's checker. A consume-transform-produce application reads the campaign's
//! input topic and, in one transaction per batch of input, writes one output record per input record and
//! commits the input offsets with it (KIP-98, KIP-447); a read_committed consumer reads the output topic
//! all along. At the end this judges, without I/O:
//!
//! - **exactly once**: every record of the final input log has exactly one committed output record that
//!   names it (its partition, offset and the checksum of its value); none is missing, none doubled, and
//!   no committed output names a record the input log does not hold;
//! - **read_committed**: every record the consumer read is a committed one in the final output log (with
//!   the same value at the same offset), never one of an aborted or open transaction, and it read every
//!   committed record;
//! - **nothing hangs**: no transaction's data in the output log is left without its marker, and every
//!   output partition's last stable offset reached its high watermark once the workload stopped.
//!
//! A transaction's fate is read from the log itself: a transactional record belongs to the first marker
//! (COMMIT or ABORT) of its producer after it in the same partition, as a read_committed reader decides.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;

/// The checksum that names a value (CRC32C, as the campaign's other records use).
pub fn checksum(value: &[u8]) -> u32 {
    crc32c::crc32c(value)
}

/// What a record of a log is, from its batch's header and, for a marker, its key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordKind {
    /// A record of a batch outside any transaction.
    Plain,
    /// A record of a transactional batch of this producer id.
    Transactional { producer_id: i64 },
    /// A control record ending this producer's transaction: COMMIT (`commit`) or ABORT.
    Marker { producer_id: i64, commit: bool },
}

/// One record of a partition's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogRecord {
    pub offset: u64,
    pub kind: RecordKind,
    pub value: Bytes,
}

/// What an output record says it was made from: an input record's place and its value's checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Source {
    pub partition: u32,
    pub offset: u64,
    pub checksum: u32,
}

impl Source {
    const PREFIX: &'static str = "from ";

    /// The output record's value: `from <partition> <offset> <checksum>`.
    pub fn encode(&self) -> String {
        format!("{}{} {} {:08x}", Self::PREFIX, self.partition, self.offset, self.checksum)
    }

    pub fn parse(value: &[u8]) -> Option<Source> {
        let text = std::str::from_utf8(value).ok()?.strip_prefix(Self::PREFIX)?;
        let mut words = text.split(' ');
        let source = Source {
            partition: words.next()?.parse().ok()?,
            offset: words.next()?.parse().ok()?,
            checksum: u32::from_str_radix(words.next()?, 16).ok()?,
        };
        words.next().is_none().then_some(source)
    }
}

/// A record the read_committed consumer read: where, and its value's checksum.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Read {
    pub partition: u32,
    pub offset: u64,
    pub checksum: u32,
}

/// Everything the checker judges.
#[derive(Debug, Default)]
pub struct TxnHistory {
    /// The final input log: (partition, offset) → checksum of the value.
    pub inputs: BTreeMap<(u32, u64), u32>,
    /// The final output log of each partition, read from its start, markers included.
    pub output: BTreeMap<u32, Vec<LogRecord>>,
    /// What the read_committed consumer read of the output, in the order it read it.
    pub reads: Vec<Read>,
    /// Each output partition's (last stable offset, high watermark) once the workload stopped.
    pub bounds: BTreeMap<u32, (u64, u64)>,
}

/// Where a transactional output record ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    Committed,
    Aborted,
    Open,
}

/// The findings, and the counts the report shows.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TxnVerdict {
    /// Transactions (a producer's run of records up to its marker, per partition) committed and aborted.
    pub committed_transactions: usize,
    pub aborted_transactions: usize,
    /// Output records committed and aborted.
    pub committed_records: usize,
    pub aborted_records: usize,
    /// Inputs without a committed output.
    pub missing: Vec<(u32, u64)>,
    /// Inputs with more than one committed output, and how many.
    pub doubled: Vec<((u32, u64), usize)>,
    /// Committed output records that name no input of the final log, or with another value, or that are
    /// not the transformer's at all (not transactional, or unreadable): (partition, offset).
    pub foreign: Vec<(u32, u64)>,
    /// Records the read_committed consumer read that are not committed there: (partition, offset, what
    /// the log holds there).
    pub read_uncommitted: Vec<(u32, u64, &'static str)>,
    /// Committed records the consumer never read.
    pub unread: Vec<(u32, u64)>,
    /// Transactional records left without a marker: (partition, offset).
    pub open: Vec<(u32, u64)>,
    /// Partitions whose last stable offset stayed below the high watermark: (partition, LSO, HW).
    pub stuck: Vec<(u32, u64, u64)>,
}

impl TxnVerdict {
    pub fn failures(&self) -> usize {
        self.missing.len()
            + self.doubled.len()
            + self.foreign.len()
            + self.read_uncommitted.len()
            + self.unread.len()
            + self.open.len()
            + self.stuck.len()
    }
}

pub fn check(history: &TxnHistory) -> TxnVerdict {
    let mut verdict = TxnVerdict::default();
    // (partition, offset) → (fate, checksum) of every data record of the output.
    let mut fates: BTreeMap<(u32, u64), (Fate, u32)> = BTreeMap::new();
    let mut produced: BTreeMap<Source, usize> = BTreeMap::new();
    for (&partition, log) in &history.output {
        // Each producer's records since its last marker, in this partition.
        let mut pending: BTreeMap<i64, Vec<&LogRecord>> = BTreeMap::new();
        for record in log {
            match record.kind {
                RecordKind::Plain => {
                    verdict.foreign.push((partition, record.offset));
                    fates.insert((partition, record.offset), (Fate::Open, 0));
                }
                RecordKind::Transactional { producer_id } => pending.entry(producer_id).or_default().push(record),
                RecordKind::Marker { producer_id, commit } => {
                    let Some(records) = pending.remove(&producer_id) else { continue };
                    let fate = if commit { Fate::Committed } else { Fate::Aborted };
                    if commit {
                        verdict.committed_transactions += 1;
                        verdict.committed_records += records.len();
                    } else {
                        verdict.aborted_transactions += 1;
                        verdict.aborted_records += records.len();
                    }
                    for r in records {
                        fates.insert((partition, r.offset), (fate, checksum(&r.value)));
                        if !commit {
                            continue;
                        }
                        match Source::parse(&r.value) {
                            Some(source) => *produced.entry(source).or_default() += 1,
                            None => verdict.foreign.push((partition, r.offset)),
                        }
                    }
                }
            }
        }
        for r in pending.into_values().flatten() {
            verdict.open.push((partition, r.offset));
            fates.insert((partition, r.offset), (Fate::Open, checksum(&r.value)));
        }
    }
    for (&(partition, offset), &checksum) in &history.inputs {
        let source = Source { partition, offset, checksum };
        match produced.remove(&source) {
            None => verdict.missing.push((partition, offset)),
            Some(1) => {}
            Some(n) => verdict.doubled.push(((partition, offset), n)),
        }
    }
    // What is left names no input of the final log (or names it with another value): found by its place
    // in the output.
    if !produced.is_empty() {
        for (&partition, log) in &history.output {
            for r in log {
                let named = Source::parse(&r.value).is_some_and(|s| produced.contains_key(&s));
                if named && fates.get(&(partition, r.offset)).is_some_and(|(fate, _)| *fate == Fate::Committed) {
                    verdict.foreign.push((partition, r.offset));
                }
            }
        }
    }
    let mut read: BTreeSet<(u32, u64)> = BTreeSet::new();
    for r in &history.reads {
        let what = match fates.get(&(r.partition, r.offset)) {
            Some((Fate::Committed, checksum)) if *checksum == r.checksum => {
                read.insert((r.partition, r.offset));
                continue;
            }
            Some((Fate::Committed, _)) => "another value",
            Some((Fate::Aborted, _)) => "a record of an aborted transaction",
            Some((Fate::Open, _)) => "a record of a transaction never ended",
            None => "no record",
        };
        verdict.read_uncommitted.push((r.partition, r.offset, what));
    }
    for (&(partition, offset), (fate, _)) in &fates {
        if *fate == Fate::Committed && !read.contains(&(partition, offset)) {
            verdict.unread.push((partition, offset));
        }
    }
    for (&partition, &(lso, hw)) in &history.bounds {
        if lso < hw {
            verdict.stuck.push((partition, lso, hw));
        }
    }
    verdict.foreign.sort();
    verdict.foreign.dedup();
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(value: &str) -> u32 {
        checksum(value.as_bytes())
    }

    fn data(offset: u64, producer_id: i64, source: Source) -> LogRecord {
        LogRecord { offset, kind: RecordKind::Transactional { producer_id }, value: Bytes::from(source.encode()) }
    }

    fn marker(offset: u64, producer_id: i64, commit: bool) -> LogRecord {
        LogRecord { offset, kind: RecordKind::Marker { producer_id, commit }, value: Bytes::new() }
    }

    fn read_of(partition: u32, record: &LogRecord) -> Read {
        Read { partition, offset: record.offset, checksum: checksum(&record.value) }
    }

    /// Two inputs in partition 0; an aborted try of the first, then both committed, read once each.
    fn good() -> TxnHistory {
        let a = Source { partition: 0, offset: 0, checksum: input("a") };
        let b = Source { partition: 0, offset: 1, checksum: input("b") };
        let log = vec![
            data(0, 7, a),
            marker(1, 7, false),
            data(2, 7, a),
            data(3, 8, b),
            marker(4, 7, true),
            marker(5, 8, true),
        ];
        let reads = vec![read_of(0, &log[2]), read_of(0, &log[3])];
        TxnHistory {
            inputs: [((0, 0), a.checksum), ((0, 1), b.checksum)].into(),
            output: [(0, log)].into(),
            reads,
            bounds: [(0, (6, 6))].into(),
        }
    }

    #[test]
    fn a_clean_history_passes_with_its_counts() {
        let verdict = check(&good());
        assert_eq!(verdict.failures(), 0, "{verdict:?}");
        assert_eq!((verdict.committed_transactions, verdict.committed_records), (2, 2));
        assert_eq!((verdict.aborted_transactions, verdict.aborted_records), (1, 1));
    }

    #[test]
    fn an_input_without_output_and_one_with_two_are_found() {
        let mut history = good();
        history.inputs.insert((0, 2), input("c"));
        let a = Source { partition: 0, offset: 0, checksum: input("a") };
        let log = history.output.get_mut(&0).unwrap();
        log.push(data(6, 9, a));
        log.push(marker(7, 9, true));
        history.reads.push(read_of(0, &log[6]));
        history.bounds.insert(0, (8, 8));
        let verdict = check(&history);
        assert_eq!(verdict.missing, vec![(0, 2)]);
        assert_eq!(verdict.doubled, vec![((0, 0), 2)]);
        assert_eq!(verdict.failures(), 2, "{verdict:?}");
    }

    #[test]
    fn an_output_naming_a_changed_input_is_foreign() {
        let mut history = good();
        // The input at offset 1 holds another value in the final log: its output names a record gone.
        history.inputs.insert((0, 1), input("b'"));
        let verdict = check(&history);
        assert_eq!(verdict.missing, vec![(0, 1)]);
        assert_eq!(verdict.foreign, vec![(0, 3)]);
    }

    #[test]
    fn reading_an_aborted_or_open_record_or_missing_a_committed_one_fails() {
        let mut history = good();
        let aborted = history.output[&0][0].clone();
        history.reads.push(read_of(0, &aborted));
        let verdict = check(&history);
        assert_eq!(verdict.read_uncommitted, vec![(0, 0, "a record of an aborted transaction")]);

        let mut history = good();
        history.reads.pop();
        let verdict = check(&history);
        assert_eq!(verdict.unread, vec![(0, 3)]);
        assert_eq!(verdict.failures(), 1);

        let mut history = good();
        let c = Source { partition: 0, offset: 2, checksum: input("c") };
        history.inputs.insert((0, 2), c.checksum);
        let log = history.output.get_mut(&0).unwrap();
        log.push(data(6, 10, c));
        let open = log[6].clone();
        history.reads.push(read_of(0, &open));
        history.bounds.insert(0, (6, 7));
        let verdict = check(&history);
        assert_eq!(verdict.open, vec![(0, 6)]);
        assert_eq!(verdict.stuck, vec![(0, 6, 7)]);
        assert_eq!(verdict.read_uncommitted, vec![(0, 6, "a record of a transaction never ended")]);
        assert_eq!(verdict.missing, vec![(0, 2)]);
    }

    #[test]
    fn a_plain_record_in_the_output_is_foreign() {
        let mut history = good();
        let log = history.output.get_mut(&0).unwrap();
        log.push(LogRecord { offset: 6, kind: RecordKind::Plain, value: Bytes::from_static(b"stray") });
        history.bounds.insert(0, (7, 7));
        let verdict = check(&history);
        assert_eq!(verdict.foreign, vec![(0, 6)]);
    }

    #[test]
    fn a_source_reads_back_what_it_wrote_and_nothing_else() {
        let s = Source { partition: 3, offset: 12_345, checksum: 0xdead_beef };
        assert_eq!(Source::parse(s.encode().as_bytes()), Some(s));
        assert_eq!(Source::parse(b"from 3 12345"), None);
        assert_eq!(Source::parse(b"from 3 12345 deadbeef extra"), None);
        assert_eq!(Source::parse(b"to 3 1 0"), None);
    }
}
