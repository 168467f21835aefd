//! The fault campaign's checker: a history of what producers were told and what consumers saw, and the
//! cluster's logs at the end, judged against what the topic promises. It does no I/O: the campaign
//! records events as they happen and hands the whole history here, and the tests hand it histories made
//! by hand.
//!
//! What counts as a failure:
//! - a record acknowledged under acks=all that is not in the final log at the offset it was acknowledged
//!   with, with the same value, below the final high watermark (lost; under `--beyond` reported but not
//!   failed);
//! - an offset a consumer read whose value later changed, or that is gone from the final log (moved);
//! - a high watermark that went back between two answers to the same consumer;
//! - a replica whose copy differs from the leader's below the final high watermark;
//! - a record of an idempotent producer stored at more than one offset.
//!
//! Records acknowledged under acks=1 are a labelled baseline: their losses are counted, never failed (acks=1
//! promises nothing once its leader is gone). Duplicates from plain producers that retry are counted
//! separately: they deliver at least once.

use std::collections::{BTreeMap, BTreeSet};

/// A record's identity in the workload: its producer and its place in that producer's sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tag {
    pub producer: u32,
    pub sequence: u64,
}

/// How a producer sends, which decides what its acknowledgements promise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// acks=all with idempotence: no loss, no duplicate.
    Idempotent,
    /// acks=all without idempotence, with retries: no loss; duplicates are allowed.
    AcksAll,
    /// acks=1: the labelled baseline, lossy by design when a leader dies before its followers copy.
    AcksOne,
}

/// One record as stored: where, which record, and a checksum of its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    pub partition: u32,
    pub offset: u64,
    pub tag: Tag,
    pub checksum: u32,
}

/// What happened during the run, in the order the campaign saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A producer was told its record is stored here.
    Acked(Stored),
    /// A consumer read this record (consumers read only below the high watermark).
    Read { consumer: u32, record: Stored },
    /// A fetch answer to a consumer carried this high watermark.
    HighWatermark { consumer: u32, partition: u32, high_watermark: u64 },
}

/// The cluster's logs once the faults have healed: the leader's log of each partition read from its start,
/// its high watermark, and every replica's copy below it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FinalState {
    /// Per partition: the leader's records by offset.
    pub log: BTreeMap<u32, BTreeMap<u64, Stored>>,
    /// Per partition: the high watermark at the end.
    pub high_watermark: BTreeMap<u32, u64>,
    /// Per (broker, partition): that replica's records by offset, as read from it.
    pub replicas: BTreeMap<(u32, u32), BTreeMap<u64, Stored>>,
}

/// An acknowledged record that is not where it was acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    pub acked: Stored,
    /// What the final log holds at that offset instead (`None`: nothing).
    pub found: Option<Stored>,
}

/// An offset a consumer read that later held something else, or nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Moved {
    pub first: Stored,
    pub later: Option<Stored>,
}

/// A high watermark that went back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HighWatermarkBack {
    pub consumer: u32,
    pub partition: u32,
    pub from: u64,
    pub to: u64,
}

/// A replica that disagrees with the leader below the high watermark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diverged {
    pub broker: u32,
    pub partition: u32,
    pub offset: u64,
    pub leader: Option<Stored>,
    pub replica: Option<Stored>,
}

/// The checker's findings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdict {
    /// Acknowledgements per delivery: idempotent, acks=all, acks=1.
    pub acknowledged: [u64; 3],
    /// acks=all records (idempotent or not) lost.
    pub lost: Vec<Lost>,
    /// acks=1 records lost: the baseline, never a failure.
    pub lost_acks_one: u64,
    pub moved: Vec<Moved>,
    pub high_watermark_back: Vec<HighWatermarkBack>,
    pub diverged: Vec<Diverged>,
    /// Records of idempotent producers stored more than once: (tag, offsets).
    pub duplicated_idempotent: Vec<(Tag, Vec<(u32, u64)>)>,
    /// Extra copies of plain producers' records (retries deliver at least once).
    pub duplicated_retries: u64,
}

impl Verdict {
    /// How many findings fail the campaign; with `beyond` (faults past what the topic promises to
    /// survive) losses are reported and not counted.
    pub fn failures(&self, beyond: bool) -> usize {
        let lost = if beyond { 0 } else { self.lost.len() + self.moved.len() };
        lost + self.high_watermark_back.len() + self.diverged.len() + self.duplicated_idempotent.len()
    }
}

fn index(delivery: Delivery) -> usize {
    match delivery {
        Delivery::Idempotent => 0,
        Delivery::AcksAll => 1,
        Delivery::AcksOne => 2,
    }
}

/// Judges a run: `deliveries` says how each producer sent.
pub fn check(deliveries: &BTreeMap<u32, Delivery>, history: &[Event], end: &FinalState) -> Verdict {
    let mut verdict = Verdict::default();
    let at = |partition: u32, offset: u64| end.log.get(&partition).and_then(|log| log.get(&offset)).copied();
    let same = |a: &Stored, b: &Stored| a.tag == b.tag && a.checksum == b.checksum;

    // Every acknowledgement against the final log.
    for event in history {
        let Event::Acked(acked) = event else { continue };
        // A producer the campaign did not declare is judged as strictly as possible.
        let delivery = deliveries.get(&acked.tag.producer).copied().unwrap_or(Delivery::Idempotent);
        verdict.acknowledged[index(delivery)] += 1;
        let found = at(acked.partition, acked.offset);
        // Committed: below the high watermark, so on every in-sync replica; above it the record is on the
        // leader only, and a later leader may not have it.
        let committed = acked.offset < end.high_watermark.get(&acked.partition).copied().unwrap_or(0);
        if committed && found.is_some_and(|f| same(&f, acked)) {
            continue;
        }
        match delivery {
            Delivery::AcksOne => verdict.lost_acks_one += 1,
            Delivery::Idempotent | Delivery::AcksAll => verdict.lost.push(Lost { acked: *acked, found }),
        }
    }

    // What consumers read must never change: against every later read of the offset, and the final log.
    let mut first_read: BTreeMap<(u32, u64), Stored> = BTreeMap::new();
    let mut moved_at: BTreeSet<(u32, u64)> = BTreeSet::new();
    let mut high_watermarks: BTreeMap<(u32, u32), u64> = BTreeMap::new();
    for event in history {
        match event {
            Event::Read { record, .. } => {
                let key = (record.partition, record.offset);
                match first_read.get(&key) {
                    None => {
                        first_read.insert(key, *record);
                    }
                    Some(first) if !same(first, record) && moved_at.insert(key) => {
                        verdict.moved.push(Moved { first: *first, later: Some(*record) });
                    }
                    Some(_) => {}
                }
            }
            Event::HighWatermark { consumer, partition, high_watermark } => {
                let seen = high_watermarks.entry((*consumer, *partition)).or_insert(*high_watermark);
                if *high_watermark < *seen {
                    verdict.high_watermark_back.push(HighWatermarkBack {
                        consumer: *consumer,
                        partition: *partition,
                        from: *seen,
                        to: *high_watermark,
                    });
                }
                *seen = (*seen).max(*high_watermark);
            }
            Event::Acked(_) => {}
        }
    }
    for (&(partition, offset), first) in &first_read {
        if moved_at.contains(&(partition, offset)) {
            continue;
        }
        let later = at(partition, offset);
        if !later.is_some_and(|l| same(&l, first)) {
            verdict.moved.push(Moved { first: *first, later });
        }
    }

    // Replicas agree with the leader below the high watermark.
    for (&(broker, partition), copy) in &end.replicas {
        let high_watermark = end.high_watermark.get(&partition).copied().unwrap_or(0);
        let empty = BTreeMap::new();
        let leader = end.log.get(&partition).unwrap_or(&empty);
        let offsets: BTreeSet<u64> =
            leader.range(..high_watermark).chain(copy.range(..high_watermark)).map(|(&o, _)| o).collect();
        for offset in offsets {
            let (l, r) = (leader.get(&offset).copied(), copy.get(&offset).copied());
            let agree = matches!((&l, &r), (Some(l), Some(r)) if same(l, r));
            if !agree {
                verdict.diverged.push(Diverged { broker, partition, offset, leader: l, replica: r });
            }
        }
    }

    // Duplicates: a tag stored at more than one offset of the final log.
    let mut places: BTreeMap<Tag, Vec<(u32, u64)>> = BTreeMap::new();
    for (&partition, log) in &end.log {
        for (&offset, record) in log {
            places.entry(record.tag).or_default().push((partition, offset));
        }
    }
    for (tag, offsets) in places {
        if offsets.len() < 2 {
            continue;
        }
        match deliveries.get(&tag.producer).copied().unwrap_or(Delivery::Idempotent) {
            Delivery::Idempotent => verdict.duplicated_idempotent.push((tag, offsets)),
            Delivery::AcksAll | Delivery::AcksOne => verdict.duplicated_retries += offsets.len() as u64 - 1,
        }
    }
    verdict
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDEMPOTENT: u32 = 1;
    const PLAIN: u32 = 2;
    const BASELINE: u32 = 3;

    fn deliveries() -> BTreeMap<u32, Delivery> {
        BTreeMap::from([(IDEMPOTENT, Delivery::Idempotent), (PLAIN, Delivery::AcksAll), (BASELINE, Delivery::AcksOne)])
    }

    fn rec(producer: u32, sequence: u64, partition: u32, offset: u64) -> Stored {
        // The value's checksum follows from the tag: the same record always has the same bytes.
        let checksum = (producer << 16) ^ sequence as u32;
        Stored { partition, offset, tag: Tag { producer, sequence }, checksum }
    }

    /// A healthy run: partition 0 holds records 0..n of the idempotent producer, all acknowledged, read and
    /// copied by replicas 2 and 3, with the high watermark at the end.
    fn healthy(n: u64) -> (Vec<Event>, FinalState) {
        let records: Vec<Stored> = (0..n).map(|i| rec(IDEMPOTENT, i, 0, i)).collect();
        let mut history: Vec<Event> = records.iter().map(|r| Event::Acked(*r)).collect();
        for (i, r) in records.iter().enumerate() {
            history.push(Event::HighWatermark { consumer: 1, partition: 0, high_watermark: i as u64 + 1 });
            history.push(Event::Read { consumer: 1, record: *r });
        }
        let log: BTreeMap<u64, Stored> = records.iter().map(|r| (r.offset, *r)).collect();
        let end = FinalState {
            log: BTreeMap::from([(0, log.clone())]),
            high_watermark: BTreeMap::from([(0, n)]),
            replicas: BTreeMap::from([((2, 0), log.clone()), ((3, 0), log)]),
        };
        (history, end)
    }

    #[test]
    fn a_healthy_history_passes() {
        let (history, end) = healthy(10);
        let verdict = check(&deliveries(), &history, &end);
        assert_eq!(verdict.acknowledged, [10, 0, 0]);
        assert_eq!(verdict.failures(false), 0, "{verdict:?}");
        assert_eq!(verdict, Verdict { acknowledged: [10, 0, 0], ..Verdict::default() });
    }

    #[test]
    fn a_lost_acknowledged_record_is_found() {
        let (history, mut end) = healthy(10);
        // The leader's log lost its last three records (a truncation below an acknowledgement).
        end.log.get_mut(&0).unwrap().retain(|&o, _| o < 7);
        end.high_watermark.insert(0, 7);
        let verdict = check(&deliveries(), &history, &end);
        assert_eq!(verdict.lost.len(), 3, "{verdict:?}");
        assert_eq!(verdict.lost[0].acked, rec(IDEMPOTENT, 7, 0, 7));
        assert_eq!(verdict.lost[0].found, None);
        // The consumer had read them: those offsets moved too.
        assert_eq!(verdict.moved.len(), 3);
        assert_eq!(verdict.failures(false), 6);
        assert_eq!(verdict.failures(true), 0, "beyond what the topic survives, losses are reported only");
    }

    #[test]
    fn an_acknowledged_record_above_the_high_watermark_is_not_committed() {
        let (history, mut end) = healthy(4);
        end.high_watermark.insert(0, 3);
        let verdict = check(&deliveries(), &history, &end);
        let lost = rec(IDEMPOTENT, 3, 0, 3);
        assert_eq!(verdict.lost, vec![Lost { acked: lost, found: Some(lost) }]);
    }

    #[test]
    fn a_record_replaced_at_its_offset_is_lost_and_moved() {
        let (history, mut end) = healthy(5);
        let other = rec(PLAIN, 99, 0, 2);
        end.log.get_mut(&0).unwrap().insert(2, other);
        for replica in end.replicas.values_mut() {
            replica.insert(2, other);
        }
        let verdict = check(&deliveries(), &history, &end);
        assert_eq!(verdict.lost, vec![Lost { acked: rec(IDEMPOTENT, 2, 0, 2), found: Some(other) }]);
        assert_eq!(verdict.moved, vec![Moved { first: rec(IDEMPOTENT, 2, 0, 2), later: Some(other) }]);
        assert!(verdict.diverged.is_empty(), "the replicas agree with the leader");
    }

    #[test]
    fn an_offset_read_twice_with_different_records_is_moved_once() {
        let (mut history, end) = healthy(5);
        let other = rec(PLAIN, 7, 0, 3);
        history.push(Event::Read { consumer: 2, record: other });
        history.push(Event::Read { consumer: 3, record: other });
        let verdict = check(&deliveries(), &history, &end);
        assert_eq!(verdict.moved, vec![Moved { first: rec(IDEMPOTENT, 3, 0, 3), later: Some(other) }]);
        assert!(verdict.lost.is_empty());
        assert_eq!(verdict.failures(false), 1);
    }

    #[test]
    fn a_high_watermark_going_back_is_found_per_consumer() {
        let (mut history, end) = healthy(5);
        history.push(Event::HighWatermark { consumer: 1, partition: 0, high_watermark: 3 });
        // Another consumer starting lower is not a step back.
        history.push(Event::HighWatermark { consumer: 2, partition: 0, high_watermark: 2 });
        let verdict = check(&deliveries(), &history, &end);
        assert_eq!(verdict.high_watermark_back, vec![HighWatermarkBack { consumer: 1, partition: 0, from: 5, to: 3 }]);
        assert_eq!(verdict.failures(true), 1, "a HW going back fails even beyond");
    }

    #[test]
    fn a_replica_that_differs_below_the_high_watermark_is_found() {
        let (history, mut end) = healthy(6);
        end.high_watermark.insert(0, 4);
        let replica = end.replicas.get_mut(&(3, 0)).unwrap();
        replica.insert(1, rec(PLAIN, 1, 0, 1));
        replica.remove(&2);
        // Above the high watermark a follower may still be behind or differ.
        replica.remove(&5);
        let verdict = check(&deliveries(), &history, &end);
        let found: Vec<(u32, u64)> = verdict.diverged.iter().map(|d| (d.broker, d.offset)).collect();
        assert_eq!(found, vec![(3, 1), (3, 2)]);
        assert_eq!(verdict.diverged[1].replica, None);
    }

    #[test]
    fn duplicates_fail_for_idempotent_producers_and_are_counted_for_plain_ones() {
        let (mut history, mut end) = healthy(3);
        let log = end.log.get_mut(&0).unwrap();
        log.insert(3, rec(IDEMPOTENT, 1, 0, 3));
        log.insert(4, rec(PLAIN, 0, 0, 4));
        log.insert(5, rec(PLAIN, 0, 0, 5));
        log.insert(6, rec(PLAIN, 0, 0, 6));
        end.high_watermark.insert(0, 7);
        for replica in end.replicas.values_mut() {
            *replica = end.log[&0].clone();
        }
        history.push(Event::Acked(rec(PLAIN, 0, 0, 4)));
        let verdict = check(&deliveries(), &history, &end);
        assert_eq!(
            verdict.duplicated_idempotent,
            vec![(Tag { producer: IDEMPOTENT, sequence: 1 }, vec![(0, 1), (0, 3)])]
        );
        assert_eq!(verdict.duplicated_retries, 2);
        assert_eq!(verdict.acknowledged, [3, 1, 0]);
        assert_eq!(verdict.failures(false), 1);
    }

    #[test]
    fn acks_one_losses_are_the_baseline_not_failures() {
        let (mut history, end) = healthy(2);
        history.push(Event::Acked(rec(BASELINE, 0, 0, 2)));
        history.push(Event::Acked(rec(PLAIN, 0, 1, 0)));
        let verdict = check(&deliveries(), &history, &end);
        assert_eq!(verdict.lost_acks_one, 1);
        assert_eq!(verdict.lost, vec![Lost { acked: rec(PLAIN, 0, 1, 0), found: None }]);
        assert_eq!(verdict.acknowledged, [2, 1, 1]);
        assert_eq!(verdict.failures(false), 1, "only the acks=all loss fails");
    }
}
