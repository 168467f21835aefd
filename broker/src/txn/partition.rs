//! Which partition of `__transaction_state` holds a transactional id, and so which broker coordinates it:
//! Kafka's `Utils.abs(transactionalId.hashCode()) % transaction.state.log.num.partitions`, to the bit, so
//! that a client, a Kafka tool or a Kafka broker reading the topic finds each id where shardlog put it.
//!
//! Two details of Kafka's that a reimplementation could miss: `hashCode` is Java's `String.hashCode`,
//! over UTF-16 code units (not UTF-8 bytes) with wrapping 32-bit arithmetic; and `Utils.abs` is the
//! absolute value with `Integer.MIN_VALUE` taken to 0, not the sign bit masked off (which gives another
//! partition for every other negative hash). The group coordinator's partition
//! ([`crate::group::offsets_partition`]) is a different function and is not this one.

/// Java's `String.hashCode`: `s[0]*31^(n-1) + s[1]*31^(n-2) + ... + s[n-1]` over the UTF-16 code units of
/// `s`, in wrapping 32-bit arithmetic.
fn java_string_hash(s: &str) -> i32 {
    s.encode_utf16().fold(0i32, |hash, unit| hash.wrapping_mul(31).wrapping_add(i32::from(unit)))
}

/// Kafka's `Utils.abs`: the absolute value, except that `i32::MIN` (which has none) is 0.
fn kafka_abs(n: i32) -> i32 {
    if n == i32::MIN { 0 } else { n.abs() }
}

/// The partition of `__transaction_state` that holds `transactional_id`, of `partitions`.
pub fn transaction_partition(transactional_id: &str, partitions: u32) -> i32 {
    let partitions = i32::try_from(partitions).expect("a topic's partition count fits an int32");
    assert!(partitions > 0, "a topic has partitions");
    kafka_abs(java_string_hash(transactional_id)) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hashes are Java's (`"hello".hashCode()` and so on, checked with a JVM); the partitions are
    /// what Kafka's `Utils.abs(hash) % 50` gives for them.
    #[test]
    fn ids_land_on_the_partition_kafka_gives_them() {
        let cases: [(&str, i32, i32); 8] = [
            ("hello", 99_162_322, 22),
            ("", 0, 0),
            ("txn-0", 110_810_509, 9),
            // Negative hashes: the absolute value, where masking the sign bit would give 2, 6 and 36.
            ("my-transactional-id", -959_806_496, 46),
            ("app-producer-1", -524_403_742, 42),
            ("zzzzzzzz", -1_910_022_912, 12),
            // One UTF-16 unit for `é`, two (a surrogate pair) for the crab.
            ("é", 233, 33),
            ("\u{1F980}crab", 840_398_034, 34),
        ];
        for (id, hash, partition) in cases {
            assert_eq!(java_string_hash(id), hash, "{id:?}");
            assert_eq!(transaction_partition(id, 50), partition, "{id:?}");
        }
    }

    #[test]
    fn a_hash_of_i32_min_goes_to_partition_zero() {
        // A well-known string whose Java hash is Integer.MIN_VALUE.
        assert_eq!(java_string_hash("polygenelubricants"), i32::MIN);
        for partitions in [1, 7, 50, 1000] {
            assert_eq!(transaction_partition("polygenelubricants", partitions), 0);
        }
    }

    #[test]
    fn kafka_abs_is_the_absolute_value_but_of_i32_min() {
        assert_eq!(kafka_abs(-5), 5);
        assert_eq!(kafka_abs(5), 5);
        assert_eq!(kafka_abs(i32::MAX), i32::MAX);
        assert_eq!(kafka_abs(-i32::MAX), i32::MAX);
        assert_eq!(kafka_abs(i32::MIN), 0);
    }

    #[test]
    fn every_partition_is_below_the_count() {
        for n in 0..2000 {
            let id = format!("producer-{n}");
            assert!(transaction_partition(&id, 7) < 7);
        }
        assert_eq!(transaction_partition("anything", 1), 0);
    }
}
