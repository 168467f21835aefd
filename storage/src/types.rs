//! Position and epoch newtypes shared by the whole crate.
//!
//! Offsets, byte positions and leader epochs are all integers on the wire; keeping them in distinct types
//! means a file position can never be passed where a log offset is expected.

use std::fmt;

/// A Kafka log offset: the index of a record in a partition. Never negative once stored.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Default,
    serde::Serialize,
    serde::Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[serde(transparent)]
pub struct Offset(pub u64);

impl Offset {
    pub const ZERO: Offset = Offset(0);

    /// The offset `n` records after this one.
    pub fn plus(self, n: u64) -> Offset {
        Offset(self.0.checked_add(n).expect("offset overflow"))
    }

    /// The offset as Kafka's signed wire type.
    pub fn as_i64(self) -> i64 {
        i64::try_from(self.0).expect("offset beyond i64")
    }
}

impl fmt::Debug for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "@{}", self.0)
    }
}

impl fmt::Display for Offset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A partition leader epoch. Kafka uses -1 for "unknown"; stored epochs are never negative.
#[derive(
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Debug,
    Default,
    serde::Serialize,
    serde::Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[serde(transparent)]
pub struct LeaderEpoch(pub i32);

impl LeaderEpoch {
    /// Kafka's `UNDEFINED_EPOCH`.
    pub const UNDEFINED: LeaderEpoch = LeaderEpoch(-1);
}

impl fmt::Display for LeaderEpoch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// A topic partition, as named on disk: `<topic>-<partition>`.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct TopicPartition {
    pub topic: String,
    pub partition: u32,
}

impl TopicPartition {
    pub fn new(topic: impl Into<String>, partition: u32) -> Self {
        TopicPartition { topic: topic.into(), partition }
    }

    /// The directory name of this partition inside a data dir.
    pub fn dir_name(&self) -> String {
        format!("{}-{}", self.topic, self.partition)
    }

    /// Parses a directory name `<topic>-<partition>`; the topic may itself contain dashes.
    pub fn parse_dir_name(name: &str) -> Option<TopicPartition> {
        let (topic, partition) = name.rsplit_once('-')?;
        if topic.is_empty() || partition.is_empty() || !partition.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        Some(TopicPartition { topic: topic.to_string(), partition: partition.parse().ok()? })
    }
}

impl fmt::Display for TopicPartition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}", self.topic, self.partition)
    }
}

/// A source of wall-clock milliseconds since the Unix epoch. Tests substitute a manual clock.
pub trait Clock {
    fn now_ms(&self) -> i64;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock before 1970");
        i64::try_from(now.as_millis()).expect("clock beyond i64 milliseconds")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_dir_names_round_trip_with_dashes_in_topic() {
        let tp = TopicPartition::new("orders-eu-west", 12);
        assert_eq!(tp.dir_name(), "orders-eu-west-12");
        assert_eq!(TopicPartition::parse_dir_name("orders-eu-west-12"), Some(tp));
        assert_eq!(TopicPartition::parse_dir_name("orders"), None);
        assert_eq!(TopicPartition::parse_dir_name("-3"), None);
        assert_eq!(TopicPartition::parse_dir_name("t-x3"), None);
    }
}
