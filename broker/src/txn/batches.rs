//! Transactional record batches as a produce request carries them: whether a partition's records hold one
//! (attributes bit 4 of a v2 batch), and whose it is. Only the fixed header fields are read; the produce
//! handler and the log validate the batches themselves.

use super::ProducerIdAndEpoch;

/// Where a batch's length field ends: the batch is this many bytes plus its length.
const LENGTH_END: usize = 12;
/// The batch header's attributes (2 bytes, big-endian).
const ATTRIBUTES: usize = 21;
/// The producer id (8 bytes) and epoch (2 bytes).
const PRODUCER_ID: usize = 43;
const PRODUCER_EPOCH: usize = 51;
/// The transactional bit of the attributes' low byte.
const TRANSACTIONAL: u8 = 0x10;

/// The bytes from the first transactional batch in `records` on. Malformed bytes end the walk.
fn first_transactional(records: &[u8]) -> Option<&[u8]> {
    let mut rest = records;
    while rest.len() > ATTRIBUTES + 1 {
        if rest[ATTRIBUTES + 1] & TRANSACTIONAL != 0 {
            return Some(rest);
        }
        let length = i32::from_be_bytes([rest[8], rest[9], rest[10], rest[11]]);
        let next = usize::try_from(length).ok().and_then(|l| l.checked_add(LENGTH_END))?;
        if next > rest.len() {
            return None;
        }
        rest = &rest[next..];
    }
    None
}

/// Whether any record batch in `records` is transactional.
pub fn has_transactional_batch(records: &[u8]) -> bool {
    first_transactional(records).is_some()
}

/// The producer of the first transactional batch in `records`, `None` if there is none. A header cut
/// before its producer fields names producer id and epoch -1, which no transaction has: such a batch is
/// never taken as verified.
pub fn transactional_producer(records: &[u8]) -> Option<ProducerIdAndEpoch> {
    let batch = first_transactional(records)?;
    let field = |at: usize, len: usize| batch.get(at..at + len);
    let producer = match (field(PRODUCER_ID, 8), field(PRODUCER_EPOCH, 2)) {
        (Some(id), Some(epoch)) => ProducerIdAndEpoch {
            producer_id: i64::from_be_bytes(id.try_into().expect("8 bytes")),
            epoch: i16::from_be_bytes(epoch.try_into().expect("2 bytes")),
        },
        _ => ProducerIdAndEpoch { producer_id: -1, epoch: -1 },
    };
    Some(producer)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch header with `attributes`, producer 77 at epoch 2, and `body` bytes after the attributes.
    fn batch(attributes: i16, body: usize) -> Vec<u8> {
        // base offset (8), length (4) counting from the leader epoch on, epoch (4), magic, crc (4),
        // attributes (2), then the rest.
        let length = i32::try_from(4 + 1 + 4 + 2 + body).expect("small");
        let mut b = vec![0u8; 8];
        b.extend_from_slice(&length.to_be_bytes());
        b.extend_from_slice(&[0, 0, 0, 0, 2, 0, 0, 0, 0]);
        b.extend_from_slice(&attributes.to_be_bytes());
        b.extend(std::iter::repeat_n(0u8, body));
        if b.len() >= PRODUCER_EPOCH + 2 {
            b[PRODUCER_ID..PRODUCER_ID + 8].copy_from_slice(&77i64.to_be_bytes());
            b[PRODUCER_EPOCH..PRODUCER_EPOCH + 2].copy_from_slice(&2i16.to_be_bytes());
        }
        b
    }

    #[test]
    fn transactional_batches_are_found_in_any_position() {
        assert!(!has_transactional_batch(&batch(0, 40)));
        assert!(has_transactional_batch(&batch(0x10, 40)));
        let mut two = batch(0x01, 30);
        two.extend(batch(0x10 | 0x20, 10));
        assert!(has_transactional_batch(&two));
        assert!(!has_transactional_batch(&two[..30]));
        assert!(!has_transactional_batch(&[]));
    }

    #[test]
    fn the_producer_is_the_first_transactional_batchs() {
        let producer = Some(ProducerIdAndEpoch { producer_id: 77, epoch: 2 });
        assert_eq!(transactional_producer(&batch(0x10, 40)), producer);
        assert_eq!(transactional_producer(&batch(0, 40)), None);
        let mut two = batch(0x01, 40);
        two.extend(batch(0x10, 40));
        assert_eq!(transactional_producer(&two), producer);
        let cut = batch(0x10, 10);
        assert_eq!(
            transactional_producer(&cut),
            Some(ProducerIdAndEpoch { producer_id: -1, epoch: -1 }),
            "no producer"
        );
    }
}
