//! What a cleaning pass does with transactions (Kafka's `CleanedTransactionMetadata`).
//!
//! The rules, as Kafka keeps them:
//! - The pass cleans only below the log's last stable offset (the storage engine offers no segment past
//!   it), so every transaction it meets is decided.
//! - The records of an aborted transaction are removed: a transactional batch of a producer inside one of
//!   the log's aborted transactions (known from the `.txnindex` entries, from its first offset up to its
//!   ABORT marker) is dropped, or kept empty where the log needs the batch (a group's last batch, a
//!   producer's latest batch).
//! - A marker stays while its transaction still has a batch in the log: an ABORT marker is kept if the
//!   pass met any batch of its transaction (the next pass, which meets none, may remove it), a COMMIT
//!   marker if the pass met any batch of its transaction. Once a pass meets none, the marker goes when
//!   `delete.retention.ms` have passed since a pass first cleaned it, as a tombstone does (a consumer
//!   reading the transaction's last batches has that long to read its end).
//! - Committed transactions' records are kept whole (not compacted by key), and so are control batches
//!   holding no marker.
//!
//! This is a state machine fed the batches of a pass in log order; it does no I/O.

use std::collections::{HashMap, HashSet, VecDeque};

use shardlog_storage::Offset;
use shardlog_storage::txn::{AbortedRange, MarkerKind};

/// A pass's knowledge of the transactions it walks through.
#[derive(Debug, Default)]
pub(super) struct TxnCleaning {
    /// The aborted transactions not reached yet, by first offset.
    pending: VecDeque<AbortedRange>,
    /// Producers inside an aborted transaction: whether the pass met a batch of it.
    aborted: HashMap<i64, bool>,
    /// Producers inside a transaction not aborted that the pass met a batch of.
    committed: HashSet<i64>,
}

impl TxnCleaning {
    /// For a pass over a part of the log with these aborted transactions (those overlapping it).
    pub(super) fn new(mut aborted: Vec<AbortedRange>) -> TxnCleaning {
        aborted.sort_by_key(|a| a.first_offset);
        TxnCleaning { pending: aborted.into(), ..TxnCleaning::default() }
    }

    /// The aborted transactions starting at or before `offset` have begun.
    fn reach(&mut self, offset: Offset) {
        while let Some(next) = self.pending.front()
            && next.first_offset <= offset
        {
            self.aborted.entry(next.producer_id).or_insert(false);
            self.pending.pop_front();
        }
    }

    /// A transactional data batch of `producer_id` ending at `last`: whether it belongs to an aborted
    /// transaction (its records go).
    pub(super) fn on_data(&mut self, producer_id: i64, last: Offset) -> bool {
        self.reach(last);
        match self.aborted.get_mut(&producer_id) {
            Some(met) => {
                *met = true;
                true
            }
            None => {
                self.committed.insert(producer_id);
                false
            }
        }
    }

    /// A control batch of `producer_id` at `last` holding a marker of `kind` (`None`: no marker): whether
    /// the pass met no batch of the transaction it ends, so that it may go once past its horizon.
    pub(super) fn on_marker(&mut self, producer_id: i64, last: Offset, kind: Option<MarkerKind>) -> bool {
        self.reach(last);
        match kind {
            Some(MarkerKind::Abort) => !self.aborted.remove(&producer_id).unwrap_or(false),
            Some(MarkerKind::Commit) => !self.committed.remove(&producer_id),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aborted(producer_id: i64, first: u64) -> AbortedRange {
        AbortedRange { producer_id, first_offset: Offset(first) }
    }

    #[test]
    fn an_aborted_transactions_batches_go_and_its_marker_stays_while_the_pass_met_one() {
        let mut t = TxnCleaning::new(vec![aborted(2, 5), aborted(1, 0)]);
        assert!(t.on_data(1, Offset(1)), "producer 1 aborted from 0");
        assert!(!t.on_data(3, Offset(2)), "producer 3 commits");
        assert!(!t.on_data(2, Offset(4)), "producer 2's aborted transaction starts at 5, not before");
        assert!(t.on_data(2, Offset(6)));
        assert!(!t.on_marker(1, Offset(7), Some(MarkerKind::Abort)), "a batch of it was met: kept");
        assert!(!t.on_marker(3, Offset(8), Some(MarkerKind::Commit)), "a batch of it was met: kept");
        assert!(!t.on_marker(2, Offset(9), Some(MarkerKind::Commit)), "producer 2's commit of 4");
        assert!(!t.on_data(1, Offset(10)), "producer 1's next transaction is not aborted");
        assert!(!t.on_marker(9, Offset(11), None), "not a marker: kept");
    }

    #[test]
    fn a_marker_whose_transaction_has_no_batch_left_may_go() {
        let mut t = TxnCleaning::new(vec![aborted(1, 0)]);
        assert!(t.on_marker(1, Offset(3), Some(MarkerKind::Abort)), "its records went in an earlier pass");
        assert!(t.on_marker(2, Offset(4), Some(MarkerKind::Commit)), "so did these");
        assert!(t.on_marker(3, Offset(5), Some(MarkerKind::Abort)), "a marker without a transaction");
    }
}
