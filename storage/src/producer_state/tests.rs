//! The producer-state rules, checked batch by batch and marker by marker, and the snapshot format.

use super::*;

fn header(id: i64, epoch: i16, seq: i32, count: i32) -> BatchHeader {
    BatchHeader {
        base_offset: 0,
        batch_length: 0,
        partition_leader_epoch: 0,
        magic: 2,
        crc: 0,
        attributes: 0,
        last_offset_delta: count - 1,
        base_timestamp: 1_000,
        max_timestamp: 1_000,
        producer_id: id,
        producer_epoch: epoch,
        base_sequence: seq,
        record_count: count,
    }
}

/// Checks and, when it is to be appended, records the batch at `*end`, as the log does.
fn offer(states: &mut ProducerStates, h: BatchHeader, end: &mut u64) -> Result<Verdict, ProducerError> {
    let verdict = states.check(&h)?;
    if verdict == Verdict::Append {
        states.record(&h, Offset(*end), 1_000, true);
        *end += h.record_count as u64;
    }
    Ok(verdict)
}

#[test]
fn retry_of_any_of_the_last_five_batches_is_answered_with_its_offsets() {
    let mut s = ProducerStates::default();
    let mut end = 0;
    for i in 0..6 {
        assert_eq!(offer(&mut s, header(7, 0, i * 2, 2), &mut end), Ok(Verdict::Append));
    }
    // Batches 1..=5 (sequences 2..=11) are kept; batch 0 (sequences 0..=1) is not.
    let dup = offer(&mut s, header(7, 0, 4, 2), &mut end).unwrap();
    let original = ProducerBatch { first_seq: 4, last_seq: 5, base_offset: Offset(4), last_offset: Offset(5) };
    assert_eq!(dup, Verdict::Duplicate(original));
    assert_eq!(end, 12, "a duplicate gets no offsets");
    assert!(matches!(
        offer(&mut s, header(7, 0, 0, 2), &mut end),
        Err(ProducerError::OutOfOrderSequence { first_seq: 0, last_seq: 11, .. })
    ));
}

#[test]
fn gap_is_out_of_order_and_next_sequence_appends() {
    let mut s = ProducerStates::default();
    let mut end = 0;
    offer(&mut s, header(1, 0, 0, 3), &mut end).unwrap();
    assert!(matches!(offer(&mut s, header(1, 0, 4, 1), &mut end), Err(ProducerError::OutOfOrderSequence { .. })));
    assert_eq!(offer(&mut s, header(1, 0, 3, 1), &mut end), Ok(Verdict::Append));
    // A range overlapping a kept one without matching it is not a duplicate.
    assert!(matches!(offer(&mut s, header(1, 0, 1, 2), &mut end), Err(ProducerError::OutOfOrderSequence { .. })));
}

#[test]
fn older_epoch_is_fenced_and_newer_epoch_must_start_at_zero() {
    let mut s = ProducerStates::default();
    let mut end = 0;
    offer(&mut s, header(1, 3, 0, 1), &mut end).unwrap();
    assert!(matches!(
        offer(&mut s, header(1, 2, 1, 1), &mut end),
        Err(ProducerError::StaleEpoch { epoch: 2, current: 3, .. })
    ));
    assert!(matches!(offer(&mut s, header(1, 4, 5, 1), &mut end), Err(ProducerError::OutOfOrderSequence { .. })));
    assert_eq!(offer(&mut s, header(1, 4, 0, 1), &mut end), Ok(Verdict::Append));
    let entry = s.get(1).unwrap();
    assert_eq!((entry.epoch, entry.batches.len()), (4, 1), "the bump replaced the old epoch's batches");
    // The old epoch is fenced from now on, even a retry of its batch.
    assert!(matches!(offer(&mut s, header(1, 3, 0, 1), &mut end), Err(ProducerError::StaleEpoch { .. })));
}

#[test]
fn unknown_producer_is_accepted_at_any_sequence() {
    let mut s = ProducerStates::default();
    let mut end = 0;
    assert_eq!(offer(&mut s, header(9, 2, 12345, 1), &mut end), Ok(Verdict::Append));
    assert_eq!(offer(&mut s, header(9, 2, 12346, 1), &mut end), Ok(Verdict::Append));
    assert_eq!(offer(&mut s, header(-1, -1, -1, 1), &mut end), Ok(Verdict::Append), "not idempotent");
    assert_eq!(s.len(), 1);
}

#[test]
fn sequences_wrap_after_i32_max() {
    assert_eq!(last_sequence(i32::MAX - 1, 3), 1);
    let mut s = ProducerStates::default();
    let mut end = 0;
    offer(&mut s, header(1, 0, i32::MAX - 1, 2), &mut end).unwrap();
    assert_eq!(offer(&mut s, header(1, 0, 0, 1), &mut end), Ok(Verdict::Append));
}

#[test]
fn bad_idempotent_fields_and_client_control_batches_are_refused() {
    let s = ProducerStates::default();
    assert!(matches!(s.check(&header(1, 0, -1, 1)), Err(ProducerError::InvalidBatch(_))));
    assert!(matches!(s.check(&header(1, -1, 0, 1)), Err(ProducerError::InvalidBatch(_))));
    let mut control = header(1, 0, 0, 1);
    control.attributes = CONTROL_BIT | TRANSACTIONAL_BIT;
    assert!(matches!(s.check(&control), Err(ProducerError::InvalidBatch(_))));
    assert!(matches!(s.check(&txn_header(-1, -1, -1, 1)), Err(ProducerError::InvalidBatch(_))));
}

pub(super) fn txn_header(id: i64, epoch: i16, seq: i32, count: i32) -> BatchHeader {
    BatchHeader { attributes: TRANSACTIONAL_BIT, ..header(id, epoch, seq, count) }
}

fn marker(kind: MarkerKind, id: i64, epoch: i16, coordinator_epoch: i32) -> TxnMarker {
    TxnMarker { kind, producer_id: id, producer_epoch: epoch, coordinator_epoch }
}

#[test]
fn the_first_transactional_batch_opens_a_transaction_and_its_marker_ends_it() {
    let mut s = ProducerStates::default();
    let mut end = 0;
    offer(&mut s, header(2, 0, 0, 2), &mut end).unwrap();
    offer(&mut s, txn_header(1, 0, 0, 3), &mut end).unwrap();
    offer(&mut s, txn_header(3, 0, 0, 1), &mut end).unwrap();
    offer(&mut s, txn_header(1, 0, 3, 2), &mut end).unwrap();
    assert_eq!(s.get(1).unwrap().txn_first_offset, Some(Offset(2)), "set by the first batch only");
    assert_eq!(s.open_txns().collect::<Vec<_>>(), [(Offset(2), 1), (Offset(5), 3)]);
    assert_eq!(s.first_open_txn(), Some(Offset(2)));
    let m = marker(MarkerKind::Abort, 1, 0, 4);
    s.check_marker(&m).unwrap();
    let done = s.record_marker(&m, Offset(end), 1_000, true).expect("an open transaction ended");
    end += 1;
    assert_eq!(
        done,
        CompletedTxn {
            producer_id: 1,
            kind: MarkerKind::Abort,
            first_offset: Offset(2),
            last_offset: Offset(8),
            last_stable_offset: Offset(5),
        },
        "producer 3's transaction is still open from 5"
    );
    assert_eq!(s.get(1).unwrap().coordinator_epoch, 4);
    assert_eq!(s.first_open_txn(), Some(Offset(5)));
    // The batches of the ended transaction are still its sequence history.
    assert_eq!(offer(&mut s, txn_header(1, 0, 5, 1), &mut end), Ok(Verdict::Append));
    assert_eq!(s.get(1).unwrap().txn_first_offset, Some(Offset(9)), "the next transaction opens");
}

#[test]
fn a_non_transactional_batch_during_an_open_transaction_is_invalid_txn_state() {
    let mut s = ProducerStates::default();
    let mut end = 0;
    offer(&mut s, txn_header(1, 0, 0, 1), &mut end).unwrap();
    assert_eq!(
        offer(&mut s, header(1, 0, 1, 1), &mut end),
        Err(ProducerError::NotTransactional { producer_id: 1, txn_first_offset: Offset(0) })
    );
    assert!(matches!(offer(&mut s, txn_header(1, 0, 1, 1), &mut end), Ok(Verdict::Append)), "the transaction goes on");
    // A retry of the transactional batch is still a duplicate, not a refusal.
    assert!(matches!(s.check(&txn_header(1, 0, 0, 1)), Ok(Verdict::Duplicate(_))));
    assert!(matches!(offer(&mut s, txn_header(1, 0, 2, 1), &mut end), Ok(Verdict::Append)));
    assert!(
        matches!(s.check(&txn_header(1, 0, 7, 1)), Err(ProducerError::OutOfOrderSequence { .. })),
        "sequences are checked as ever"
    );
}

#[test]
fn stale_epochs_and_stale_coordinators_are_fenced() {
    let mut s = ProducerStates::default();
    let mut end = 0;
    offer(&mut s, txn_header(1, 5, 0, 1), &mut end).unwrap();
    assert!(matches!(s.check(&txn_header(1, 4, 1, 1)), Err(ProducerError::StaleEpoch { epoch: 4, current: 5, .. })));
    assert_eq!(
        s.check_marker(&marker(MarkerKind::Commit, 1, 4, 0)),
        Err(ProducerError::StaleMarkerEpoch { producer_id: 1, epoch: 4, current: 5 })
    );
    s.record_marker(&marker(MarkerKind::Commit, 1, 5, 3), Offset(end), 1_000, true).unwrap();
    end += 1;
    assert_eq!(
        s.check_marker(&marker(MarkerKind::Abort, 1, 5, 2)),
        Err(ProducerError::CoordinatorFenced { producer_id: 1, coordinator_epoch: 2, current: 3 })
    );
    assert_eq!(s.check_marker(&marker(MarkerKind::Abort, 1, 5, 3)), Ok(()), "the same coordinator epoch");
    assert!(matches!(s.check_marker(&marker(MarkerKind::Abort, -1, 0, 0)), Err(ProducerError::InvalidBatch(_))));
    // A marker at a newer epoch (the coordinator fenced the producer) bumps it: its batches are forgotten
    // and the next must start at sequence 0.
    assert_eq!(s.record_marker(&marker(MarkerKind::Abort, 1, 6, 3), Offset(end), 1_000, true), None);
    let entry = s.get(1).unwrap();
    assert_eq!((entry.epoch, entry.batches.len(), entry.txn_first_offset), (6, 0, None));
    assert!(matches!(s.check(&txn_header(1, 6, 1, 1)), Err(ProducerError::OutOfOrderSequence { .. })));
    assert_eq!(s.check(&txn_header(1, 6, 0, 1)), Ok(Verdict::Append));
    assert!(matches!(s.check(&txn_header(1, 5, 1, 1)), Err(ProducerError::StaleEpoch { .. })));
}

#[test]
fn a_marker_for_a_producer_without_an_open_transaction_changes_only_its_epochs() {
    let mut s = ProducerStates::default();
    assert_eq!(s.record_marker(&marker(MarkerKind::Commit, 9, 2, 7), Offset(0), 1_000, true), None);
    assert_eq!(s.transactions().get(&9), Some(&(None, 7)));
    assert_eq!(s.first_open_txn(), None);
    assert_eq!(s.record_marker(&marker(MarkerKind::Commit, 10, 2, 7), Offset(1), 1_000, false), None);
    assert!(s.get(10).is_none(), "past the budget, not remembered");
}

#[test]
fn a_producer_with_an_open_transaction_does_not_expire() {
    let mut s = ProducerStates::default();
    s.record(&txn_header(1, 0, 0, 1), Offset(0), 0, true);
    s.record(&header(2, 0, 0, 1), Offset(1), 0, true);
    assert_eq!(s.expire(DEFAULT_PRODUCER_ID_EXPIRATION_MS * 2, DEFAULT_PRODUCER_ID_EXPIRATION_MS), 1);
    assert_eq!(s.first_open_txn(), Some(Offset(0)));
}

#[test]
fn a_snapshot_keeps_open_transactions_and_coordinator_epochs() {
    let mut s = ProducerStates::default();
    let mut end = 0;
    offer(&mut s, txn_header(1, 0, 0, 2), &mut end).unwrap();
    offer(&mut s, txn_header(2, 3, 0, 2), &mut end).unwrap();
    s.record_marker(&marker(MarkerKind::Commit, 2, 3, 11), Offset(end), 1_000, true).unwrap();
    end += 1;
    s.record_marker(&marker(MarkerKind::Abort, 3, 1, 4), Offset(end), 1_000, true);
    end += 1;
    let bytes = s.encode(Offset(end));
    let (at, back) = ProducerStates::decode(&bytes).unwrap();
    assert_eq!((at, &back), (Offset(end), &s));
    assert_eq!(back.first_open_txn(), Some(Offset(0)));
    assert_eq!(back.get(3).unwrap().batches.len(), 0, "known by its marker alone");
}

#[test]
fn a_version_1_snapshot_reads_as_no_open_transactions() {
    // Producer 4 at epoch 1, one batch (sequences 0..=1 at offsets 0..=1), in the version 1 layout.
    let mut body = Vec::new();
    body.extend_from_slice(&2u64.to_be_bytes());
    body.extend_from_slice(&1u32.to_be_bytes());
    body.extend_from_slice(&4i64.to_be_bytes());
    body.extend_from_slice(&1i16.to_be_bytes());
    body.extend_from_slice(&500i64.to_be_bytes());
    body.push(1);
    for field in [0i32, 1] {
        body.extend_from_slice(&field.to_be_bytes());
    }
    body.extend_from_slice(&0u64.to_be_bytes());
    body.extend_from_slice(&1u64.to_be_bytes());
    let mut file = SNAPSHOT_MAGIC.to_vec();
    file.extend_from_slice(&1u16.to_be_bytes());
    file.extend_from_slice(&crc32c::crc32c(&body).to_be_bytes());
    file.extend_from_slice(&body);
    let (at, s) = ProducerStates::decode(&file).unwrap();
    assert_eq!(at, Offset(2));
    let entry = s.get(4).unwrap();
    assert_eq!((entry.epoch, entry.batches.len(), entry.last_append_ms), (1, 1, 500));
    assert_eq!((entry.txn_first_offset, entry.coordinator_epoch), (None, NO_COORDINATOR_EPOCH));
    // A version 1 producer without batches was never written, and is refused.
    let mut empty = body.clone();
    empty[30] = 0;
    empty.truncate(31);
    let mut file = SNAPSHOT_MAGIC.to_vec();
    file.extend_from_slice(&1u16.to_be_bytes());
    file.extend_from_slice(&crc32c::crc32c(&empty).to_be_bytes());
    file.extend_from_slice(&empty);
    assert!(ProducerStates::decode(&file).is_err());
}

#[test]
fn producers_expire_when_idle_by_the_brokers_clock_not_by_their_record_timestamps() {
    let mut s = ProducerStates::default();
    let mut old = header(1, 0, 0, 1);
    old.max_timestamp = 0;
    s.record(&old, Offset(0), 5_000, true);
    s.record(&header(2, 0, 0, 1), Offset(1), 9_000, true);
    let day = DEFAULT_PRODUCER_ID_EXPIRATION_MS;
    assert_eq!(s.expire(5_000 + day - 1, day), 0, "an old record timestamp does not expire its producer");
    assert_eq!(s.expire(5_000 + day, day), 1);
    assert!(s.get(1).is_none() && s.get(2).is_some());
}

#[test]
fn snapshot_round_trips_and_refuses_damage() {
    let mut s = ProducerStates::default();
    let mut end = 0;
    for id in 0..20 {
        for k in 0..(id % 7) + 1 {
            offer(&mut s, header(id, (id % 3) as i16, k as i32 * 3, 3), &mut end).unwrap();
        }
    }
    let bytes = s.encode(Offset(end));
    assert_eq!(ProducerStates::decode(&bytes), Ok((Offset(end), s.clone())));
    for at in [0, 5, 7, 12, bytes.len() - 1] {
        let mut bad = bytes.clone();
        bad[at] ^= 0x40;
        assert!(ProducerStates::decode(&bad).is_err(), "flipped byte {at} accepted");
    }
    assert!(ProducerStates::decode(&bytes[..bytes.len() - 3]).is_err());
    // A body that claims more producers than it holds is refused before anything is allocated.
    let mut huge = ProducerStates::default().encode(Offset(5));
    huge[18..22].copy_from_slice(&u32::MAX.to_be_bytes());
    let crc = crc32c::crc32c(&huge[10..]);
    huge[6..10].copy_from_slice(&crc.to_be_bytes());
    assert!(ProducerStates::decode(&huge).unwrap_err().contains("cannot fit"));
}

#[test]
fn a_producer_id_past_the_budget_is_appended_but_not_remembered() {
    let mut s = ProducerStates::default();
    s.record(&header(1, 0, 0, 1), Offset(0), 0, true);
    s.record(&header(2, 0, 0, 1), Offset(1), 0, false);
    assert!(s.get(2).is_none(), "a new id past the budget is not remembered");
    s.record(&header(1, 0, 1, 1), Offset(2), 0, false);
    assert_eq!(s.get(1).unwrap().batches.len(), 2, "a known id goes on being tracked");
    let budget = ProducerBudget::new(2);
    budget.adjust(0, 2);
    assert!(!budget.has_room());
    budget.adjust(2, 1);
    assert_eq!(budget.used(), 1);
}

#[test]
fn a_coordinators_transactional_write_is_judged_by_its_epoch_alone_and_opens_the_transaction() {
    let mut s = ProducerStates::default();
    // The coordinator's own records (no producer id) pass as a client's would.
    assert_eq!(s.check_coordinator_write(&header(-1, -1, -1, 3)), Ok(Verdict::Append));
    let mut offsets = header(7, 2, -1, 2);
    offsets.attributes = TRANSACTIONAL_BIT;
    assert_eq!(s.check_coordinator_write(&offsets), Ok(Verdict::Append));
    s.record(&offsets, Offset(10), 0, true);
    assert_eq!(s.get(7).unwrap().txn_first_offset, Some(Offset(10)), "its transaction is open here");
    assert!(s.get(7).unwrap().batches.is_empty(), "nothing kept for deduplication: it has no sequence");
    // Again at the same epoch, with no sequence: still judged by the epoch alone.
    assert_eq!(s.check_coordinator_write(&offsets), Ok(Verdict::Append));
    // An older epoch is refused; so is anything a coordinator never writes.
    let mut stale = header(7, 1, -1, 1);
    stale.attributes = TRANSACTIONAL_BIT;
    assert!(matches!(s.check_coordinator_write(&stale), Err(ProducerError::StaleEpoch { .. })));
    let mut sequenced = header(7, 2, 0, 1);
    sequenced.attributes = TRANSACTIONAL_BIT;
    assert!(matches!(s.check_coordinator_write(&sequenced), Err(ProducerError::InvalidBatch(_))));
    assert!(matches!(s.check_coordinator_write(&header(7, 2, -1, 1)), Err(ProducerError::InvalidBatch(_))));
    // A client's batch without a sequence is refused as before.
    assert!(matches!(s.check(&offsets), Err(ProducerError::InvalidBatch(_))));
}
