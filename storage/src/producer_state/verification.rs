//! KIP-890's verification guard: the partition's half of making sure a transactional batch is appended
//! only into a transaction its coordinator knows to include this partition.
//!
//! The partition leader asks the coordinator before it appends a producer's first transactional batch of
//! a transaction (the broker's `handlers::txn_verify`). That answer can go stale before the append: the
//! transaction may end meanwhile, its marker landing here first. Appended after the marker, the batch
//! would open a transaction the coordinator knows nothing of, which no marker would ever close (a hanging
//! transaction, holding the last stable offset back for good). So:
//!
//! - Before the coordinator is asked, [`ProducerStates::begin_verification`] hands out the producer's
//!   guard here, made if it has none. None is needed when the producer's transaction is already open here
//!   at the batch's epoch: the coordinator was asked for its first batch, and a marker would have closed it.
//! - Every marker for the producer (and its first transactional batch, which opens the transaction)
//!   takes the guard away.
//! - A transactional batch that would open a transaction here is appended only with the guard the
//!   producer still has ([`ProducerStates::check_guarded`]). One the coordinator was asked about
//!   before a marker came presents a guard that is gone (or a newer one is there): it is refused, and
//!   nothing is written. A retry is verified afresh.
//!
//! A guard is a number never handed out twice in the process's life, so a guard taken away cannot be
//! mistaken for the next one (the ABA case: verify, marker, a new verification for the next
//! transaction, then the first answer's append). Guards are a leader's memory only: not in snapshots,
//! gone when the state is rebuilt (an append that needed one is then refused, and retried). Their number
//! per partition is bounded, the oldest forgotten first; forgetting one only costs a retry.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::batch::BatchHeader;
use crate::txn::marker::TRANSACTIONAL_BIT;

use super::{ProducerError, ProducerStates, Verdict};

/// Verification guards one partition holds at most. A client can start verifications for any producer
/// ids it makes up; past this many the oldest guard is forgotten (its append, if one comes, is refused
/// and retried).
pub const MAX_GUARDS_PER_PARTITION: usize = 1_000;

/// Proof that a producer's verification began after the last marker for it was appended here. Unique in
/// the process: see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct VerificationGuard(u64);

/// The next guard's number. Shared by every partition of every shard, so a guard is never made twice.
static NEXT_GUARD: AtomicU64 = AtomicU64::new(1);

impl VerificationGuard {
    fn fresh() -> VerificationGuard {
        VerificationGuard(NEXT_GUARD.fetch_add(1, Ordering::Relaxed))
    }
}

/// The guards of one partition's producers, and when each was made (on the broker's clock).
#[derive(Debug, Clone, Default)]
pub(super) struct Guards {
    by_producer: HashMap<i64, (VerificationGuard, i64)>,
}

impl Guards {
    fn get(&self, producer_id: i64) -> Option<VerificationGuard> {
        self.by_producer.get(&producer_id).map(|(guard, _)| *guard)
    }

    /// Takes the producer's guard away (a marker for it, or its transaction's first batch, was appended).
    pub(super) fn clear(&mut self, producer_id: i64) {
        self.by_producer.remove(&producer_id);
    }

    /// Forgets the guards made `expiration_ms` or more before `now_ms`.
    pub(super) fn expire(&mut self, now_ms: i64, expiration_ms: i64) {
        self.by_producer.retain(|_, (_, made_ms)| now_ms.saturating_sub(*made_ms) < expiration_ms);
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.by_producer.len()
    }
}

impl ProducerStates {
    /// Whether `producer_id` has a transaction open here that its batches at `epoch` go on with.
    pub fn in_transaction(&self, producer_id: i64, epoch: i16) -> bool {
        self.get(producer_id).is_some_and(|e| e.epoch == epoch && e.txn_first_offset.is_some())
    }

    /// Starts the verification of a transactional batch of `producer_id` at `epoch`, before its
    /// coordinator is asked: `None` when its transaction is open here at that epoch (nothing to verify),
    /// otherwise the producer's guard (the one it has, so that concurrent verifications share it, or a new
    /// one), which the append must present.
    pub fn begin_verification(&mut self, producer_id: i64, epoch: i16, now_ms: i64) -> Option<VerificationGuard> {
        if self.in_transaction(producer_id, epoch) {
            return None;
        }
        if let Some(guard) = self.guards.get(producer_id) {
            return Some(guard);
        }
        let by_producer = &mut self.guards.by_producer;
        if by_producer.len() >= MAX_GUARDS_PER_PARTITION {
            // Numbers grow: the smallest is the oldest guard. A scan only at the bound, which takes a
            // client making up producer ids to reach.
            let oldest = by_producer.iter().min_by_key(|(_, (guard, _))| *guard).map(|(id, _)| *id);
            if let Some(oldest) = oldest {
                by_producer.remove(&oldest);
            }
        }
        let guard = VerificationGuard::fresh();
        by_producer.insert(producer_id, (guard, now_ms));
        Some(guard)
    }

    /// The producer's guard, if it has one.
    pub fn verification_guard(&self, producer_id: i64) -> Option<VerificationGuard> {
        self.guards.get(producer_id)
    }

    /// Forgets every guard: the partition is no longer led here (or is led at a new epoch), and every
    /// append the guards were for is refused by its leader epoch anyway.
    pub fn drop_verification_guards(&mut self) {
        self.guards.by_producer.clear();
    }

    /// Judges a client's batch as [`Self::check`] does, and then by KIP-890's rule: a transactional batch
    /// that would open a transaction here (its producer has none open at its epoch) is refused unless
    /// `guard` is the guard its producer still holds. Changes nothing.
    pub fn check_guarded(
        &self,
        header: &BatchHeader,
        guard: Option<VerificationGuard>,
    ) -> Result<Verdict, ProducerError> {
        let verdict = self.check(header)?;
        let (id, epoch) = (header.producer_id, header.producer_epoch);
        let opens =
            verdict == Verdict::Append && header.attributes & TRANSACTIONAL_BIT != 0 && !self.in_transaction(id, epoch);
        if opens && (guard.is_none() || guard != self.guards.get(id)) {
            return Err(ProducerError::Unverified { producer_id: id, epoch });
        }
        Ok(verdict)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::txn::{MarkerKind, TxnMarker};
    use crate::types::Offset;

    /// A transactional batch of one record (the producer-state tests' header).
    fn txn_batch(id: i64, epoch: i16, seq: i32) -> BatchHeader {
        crate::producer_state::tests::txn_header(id, epoch, seq, 1)
    }

    fn abort(id: i64, epoch: i16) -> TxnMarker {
        TxnMarker { kind: MarkerKind::Abort, producer_id: id, producer_epoch: epoch, coordinator_epoch: 0 }
    }

    #[test]
    fn a_marker_after_the_verification_began_takes_the_guard_away_and_the_batch_is_refused() {
        let mut s = ProducerStates::default();
        let guard = s.begin_verification(1, 0, 0).expect("no transaction open: a guard");
        // The coordinator said yes; then the transaction ended, its marker landing first.
        s.record_marker(&abort(1, 0), Offset(0), 0, true);
        assert_eq!(s.verification_guard(1), None);
        assert_eq!(
            s.check_guarded(&txn_batch(1, 0, 0), Some(guard)),
            Err(ProducerError::Unverified { producer_id: 1, epoch: 0 })
        );
        // The next transaction's verification gets a new guard; the stale one still does not pass.
        let next = s.begin_verification(1, 0, 0).unwrap();
        assert_ne!(next, guard, "a guard is never handed out twice");
        assert!(matches!(s.check_guarded(&txn_batch(1, 0, 0), Some(guard)), Err(ProducerError::Unverified { .. })));
        assert_eq!(s.check_guarded(&txn_batch(1, 0, 0), Some(next)), Ok(Verdict::Append));
    }

    #[test]
    fn the_first_batch_takes_the_guard_and_the_rest_of_its_transaction_needs_none() {
        let mut s = ProducerStates::default();
        let guard = s.begin_verification(1, 0, 0).unwrap();
        assert_eq!(s.begin_verification(1, 0, 0), Some(guard), "concurrent verifications share the guard");
        assert_eq!(
            s.check_guarded(&txn_batch(1, 0, 0), None),
            Err(ProducerError::Unverified { producer_id: 1, epoch: 0 })
        );
        assert_eq!(s.check_guarded(&txn_batch(1, 0, 0), Some(guard)), Ok(Verdict::Append));
        s.record(&txn_batch(1, 0, 0), Offset(0), 0, true);
        assert_eq!(s.verification_guard(1), None, "the transaction is open: its first batch took the guard");
        assert_eq!(s.begin_verification(1, 0, 0), None, "nothing to verify while it is open at this epoch");
        assert_eq!(s.check_guarded(&txn_batch(1, 0, 1), None), Ok(Verdict::Append));
        // A verification that shared the guard appends after the first batch: the transaction is open.
        assert_eq!(s.check_guarded(&txn_batch(1, 0, 1), Some(guard)), Ok(Verdict::Append));
        // At another epoch the open transaction is not the batch's: it is verified.
        assert!(s.begin_verification(1, 1, 0).is_some());
        assert!(matches!(s.check_guarded(&txn_batch(1, 1, 0), None), Err(ProducerError::Unverified { .. })));
    }

    #[test]
    fn only_transactional_batches_that_open_a_transaction_need_a_guard() {
        let s = ProducerStates::default();
        let idempotent = BatchHeader { attributes: 0, ..txn_batch(1, 0, 0) };
        assert_eq!(s.check_guarded(&idempotent, None), Ok(Verdict::Append));
        // The producer rules come first: a stale epoch is told as such, not as unverified.
        let mut s = ProducerStates::default();
        s.record(&idempotent, Offset(0), 0, true);
        s.record(&BatchHeader { producer_epoch: 3, ..idempotent }, Offset(1), 0, true);
        assert!(matches!(s.check_guarded(&txn_batch(1, 2, 0), None), Err(ProducerError::StaleEpoch { .. })));
    }

    #[test]
    fn guards_are_bounded_oldest_first_and_expire() {
        let mut s = ProducerStates::default();
        let first = s.begin_verification(0, 0, 0).unwrap();
        for id in 1..MAX_GUARDS_PER_PARTITION as i64 {
            s.begin_verification(id, 0, 10).unwrap();
        }
        assert_eq!(s.guards.len(), MAX_GUARDS_PER_PARTITION);
        let newest = s.begin_verification(i64::MAX, 0, 10).unwrap();
        assert_eq!(s.guards.len(), MAX_GUARDS_PER_PARTITION);
        assert_eq!(s.verification_guard(0), None, "the oldest was forgotten");
        assert_ne!(s.begin_verification(0, 0, 10), Some(first));
        assert_eq!(s.verification_guard(i64::MAX), Some(newest));
        s.expire(15, 10);
        assert_eq!(s.guards.len(), MAX_GUARDS_PER_PARTITION, "none made 10 ms or more ago");
        s.expire(20, 10);
        assert_eq!(s.guards.len(), 0);
    }
}
