//! Many partitions in one log line: `topic:0-11,14 other:3`, for the lines that report what happened to
//! a batch of partitions at once (a topic created, a broker shut down) with a count, instead of one line
//! per partition.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// Partitions by topic, written as `topic:0-11,14 other:3`.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct PartitionSet(BTreeMap<String, BTreeSet<u32>>);

impl PartitionSet {
    pub fn add(&mut self, topic: &str, partition: u32) {
        match self.0.get_mut(topic) {
            Some(partitions) => {
                partitions.insert(partition);
            }
            None => {
                self.0.insert(topic.to_string(), BTreeSet::from([partition]));
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// How many partitions, all topics together.
    pub fn count(&self) -> usize {
        self.0.values().map(BTreeSet::len).sum()
    }
}

impl std::fmt::Display for PartitionSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut out = String::new();
        for (topic, partitions) in &self.0 {
            let sorted: Vec<u32> = partitions.iter().copied().collect();
            if !out.is_empty() {
                out.push(' ');
            }
            let _ = write!(out, "{topic}:{}", ranges(&sorted));
        }
        f.write_str(&out)
    }
}

/// `0-11,14,20-21` for sorted, distinct numbers.
fn ranges(sorted: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if end == start {
            let _ = write!(out, "{start}");
        } else {
            let _ = write!(out, "{start}-{end}");
        }
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partitions_are_written_as_ranges_per_topic() {
        let mut set = PartitionSet::default();
        for p in (0..12).chain([14, 21, 20]) {
            set.add("greetings", p);
        }
        set.add("__consumer_offsets", 3);
        set.add("greetings", 5);
        assert_eq!(set.count(), 16, "greetings 5 counts once");
        assert_eq!(set.to_string(), "__consumer_offsets:3 greetings:0-11,14,20-21");
        assert!(PartitionSet::default().is_empty());
    }
}
