//! Consumer groups: the classic protocol's state machine ([`classic`], no I/O), the records it keeps in
//! `__consumer_offsets` ([`records`]), the coordinator on each shard that adapts it to that topic's
//! partitions ([`coordinator`]) and the calls handlers make to it ([`call`]), and which partition of the
//! offsets topic (and so which broker and shard) coordinates a group.

pub mod call;
pub mod classic;
pub mod consumer;
pub mod coordinator;
pub mod records;

/// The internal topic holding committed offsets and group membership.
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// The `__consumer_offsets` partition that holds `group`, as Kafka computes it (Java's `String.hashCode`
/// of the group id, sign bit cleared, modulo the partition count), so a group has the same partition
/// number it would have on Kafka.
pub fn offsets_partition(group: &str, partitions: u32) -> i32 {
    assert!(partitions > 0, "the offsets topic has partitions");
    let mut hash: i32 = 0;
    for unit in group.encode_utf16() {
        hash = hash.wrapping_mul(31).wrapping_add(unit as i32);
    }
    ((hash & 0x7fff_ffff) as u32 % partitions) as i32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_land_on_the_partition_kafka_would_choose() {
        // Java's String.hashCode is s[0]*31^(n-1) + ... + s[n-1] over UTF-16 units, wrapping.
        assert_eq!(offsets_partition("", 50), 0);
        assert_eq!(offsets_partition("a", 50), 97 % 50);
        assert_eq!(offsets_partition("ab", 50), (97 * 31 + 98) % 50);
        // "polygenelubricants".hashCode() is i32::MIN: the sign bit is cleared, not negated.
        assert_eq!(offsets_partition("polygenelubricants", 50), 0);
        // A non-ASCII id hashes its UTF-16 units: U+00E9 is 233.
        assert_eq!(offsets_partition("\u{e9}", 50), 233 % 50);
        for p in [1, 7, 50] {
            assert!((0..p as i32).contains(&offsets_partition("some group", p)));
        }
    }
}
