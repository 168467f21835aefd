//! Topics: names, settings, and which shard serves each partition here.
//!
//! The topics themselves live in the quorum's state ([`crate::quorum::state`]). Which shard of a broker
//! holds a partition is the broker's own business: a hash of the topic name plus the partition index,
//! modulo the shard count. Every shard opens the partition directories in the one data dir, so after a
//! change of shard count a partition's log is simply opened by its new shard.

pub mod configs;
pub mod internal;
pub mod recompress;
pub mod records;

/// Kafka's longest topic name.
pub const MAX_TOPIC_NAME_LEN: usize = 249;
/// The most partitions one topic may have.
pub const MAX_PARTITIONS: u32 = 10_000;

/// Why a topic name is refused (Kafka answers INVALID_TOPIC_EXCEPTION).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid topic name {name:?}: {reason}")]
pub struct InvalidTopicName {
    pub name: String,
    pub reason: &'static str,
}

/// Checks a topic name against Kafka's rules: 1-249 characters of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), InvalidTopicName> {
    let refuse = |reason| Err(InvalidTopicName { name: name.to_string(), reason });
    if name.is_empty() {
        return refuse("empty");
    }
    if name.len() > MAX_TOPIC_NAME_LEN {
        return refuse("longer than 249 characters");
    }
    if name == "." || name == ".." {
        return refuse("`.` and `..` are not topic names");
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-') {
        return refuse("only ASCII letters, digits, `.`, `_` and `-` are allowed");
    }
    Ok(())
}

/// Whether the broker keeps `name` for itself (`__consumer_offsets`, `__transaction_state`): Metadata marks
/// it internal, and clients may not produce to it, create it, delete it, add partitions to it or commit
/// offsets of it.
pub fn is_internal(name: &str) -> bool {
    internal::INTERNAL_TOPICS.contains(&name)
}

/// The shard a new partition goes to: partitions of a topic spread over consecutive shards from a
/// starting shard chosen by the topic's name, so different topics start on different shards.
pub fn assign_shard(topic: &str, partition: u32, shards: usize) -> usize {
    assert!(shards > 0, "at least one shard");
    // FNV-1a: stable across releases and platforms, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in topic.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    ((h % shards as u64 + partition as u64) % shards as u64) as usize
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_coordinator_topics_are_internal_and_lookalikes_are_not() {
        assert!(is_internal("__consumer_offsets"));
        assert!(is_internal("__transaction_state"));
        for other in ["__transaction_state2", "_transaction_state", "transaction_state", "orders", ""] {
            assert!(!is_internal(other), "{other:?}");
        }
    }

    #[test]
    fn topic_names_follow_kafka_rules() {
        for ok in ["orders", "orders.eu-west_1", "a", &"x".repeat(249)] {
            assert_eq!(validate_topic_name(ok), Ok(()), "{ok}");
        }
        for bad in ["", ".", "..", "has space", "slash/name", "ümlaut", &"x".repeat(250)] {
            assert!(validate_topic_name(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn partitions_spread_evenly_and_deterministically() {
        for shards in [1usize, 2, 3, 4] {
            let mut counts = vec![0; shards];
            for p in 0..(shards as u32 * 5) {
                counts[assign_shard("orders", p, shards)] += 1;
            }
            assert!(counts.iter().all(|&c| c == 5), "{shards} shards: {counts:?}");
        }
        assert_eq!(assign_shard("orders", 3, 4), assign_shard("orders", 3, 4));
        let starts: std::collections::BTreeSet<_> =
            ["a", "b", "c", "d", "e", "f"].iter().map(|t| assign_shard(t, 0, 4)).collect();
        assert!(starts.len() > 1, "every topic starts on the same shard");
    }
}
