//! What the coordinator knows of one `transactional.id`, and the states its transaction moves through.
//!
//! Every change is made in two steps, as in Kafka: [`TxnMetadata::prepare`] records the target as a pending
//! transition (the caller writes it to `__transaction_state`), and only [`TxnMetadata::apply_pending`], once
//! the write is known committed, makes it the current state; [`TxnMetadata::revert_pending`] forgets it when
//! the write failed. While a transition is pending, every other request on the id is answered
//! CONCURRENT_TRANSACTIONS.

use std::collections::BTreeSet;

use shardlog_storage::TopicPartition;

/// Kafka's "no producer id".
pub const NO_PRODUCER_ID: i64 = -1;
/// Kafka's "no producer epoch".
pub const NO_PRODUCER_EPOCH: i16 = -1;

/// A producer epoch at or past this cannot be bumped for a new session: the coordinator gives the
/// transactional id a new producer id instead (Kafka keeps `Short.MAX_VALUE` for fencing a last time).
pub const EXHAUSTED_EPOCH: i16 = i16::MAX - 1;

/// Whether `epoch` is too high to be bumped again for a new producer session.
pub fn epoch_exhausted(epoch: i16) -> bool {
    epoch >= EXHAUSTED_EPOCH
}

/// The state of a transactional id's transaction, with the byte `__transaction_state` stores for it.
///
/// - `Empty`: no transaction open; the producer id and epoch are set.
/// - `Ongoing`: partitions have been added; the transaction runs until EndTxn or its timeout.
/// - `PrepareCommit` / `PrepareAbort`: the outcome is decided and durable; markers are being written.
/// - `CompleteCommit` / `CompleteAbort`: every marker is written; the id is ready for its next transaction.
/// - `PrepareEpochFence`: the coordinator is aborting an ongoing transaction under a bumped epoch (a new
///   producer session, or a timeout). Held in memory only while its PrepareAbort is being written; it
///   never reaches the log.
/// - `Dead`: the id expired; its tombstone is being written, after which it is forgotten.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum TxnState {
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
    Dead,
    PrepareEpochFence,
}

impl TxnState {
    /// The byte `TransactionLogValue.TransactionStatus` holds for this state (Kafka's numbering).
    pub fn id(self) -> i8 {
        match self {
            TxnState::Empty => 0,
            TxnState::Ongoing => 1,
            TxnState::PrepareCommit => 2,
            TxnState::PrepareAbort => 3,
            TxnState::CompleteCommit => 4,
            TxnState::CompleteAbort => 5,
            TxnState::Dead => 6,
            TxnState::PrepareEpochFence => 7,
        }
    }

    pub fn from_id(id: i8) -> Option<TxnState> {
        Some(match id {
            0 => TxnState::Empty,
            1 => TxnState::Ongoing,
            2 => TxnState::PrepareCommit,
            3 => TxnState::PrepareAbort,
            4 => TxnState::CompleteCommit,
            5 => TxnState::CompleteAbort,
            6 => TxnState::Dead,
            7 => TxnState::PrepareEpochFence,
            _ => return None,
        })
    }

    /// Kafka's name of the state, as DescribeTransactions and ListTransactions show it.
    pub fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
            TxnState::Dead => "Dead",
            TxnState::PrepareEpochFence => "PrepareEpochFence",
        }
    }

    pub fn from_name(name: &str) -> Option<TxnState> {
        (0..=7).filter_map(TxnState::from_id).find(|s| s.name() == name)
    }

    /// The states a transaction may move to this one from (Kafka's table). Moving from any other state is
    /// a bug in the coordinator, not a client's mistake.
    pub fn valid_previous(self) -> &'static [TxnState] {
        use TxnState::*;
        match self {
            Empty => &[Empty, CompleteCommit, CompleteAbort],
            Ongoing => &[Ongoing, Empty, CompleteCommit, CompleteAbort],
            PrepareCommit => &[Ongoing],
            PrepareAbort => &[Ongoing, PrepareEpochFence],
            CompleteCommit => &[PrepareCommit],
            CompleteAbort => &[PrepareAbort],
            Dead => &[Empty, CompleteCommit, CompleteAbort],
            PrepareEpochFence => &[Ongoing],
        }
    }

    /// Whether the transaction is between its decision and its last marker.
    pub fn is_prepare(self) -> bool {
        matches!(self, TxnState::PrepareCommit | TxnState::PrepareAbort)
    }

    /// Whether no transaction is open: a new one may start, and the id may expire.
    pub fn is_idle(self) -> bool {
        matches!(self, TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort)
    }
}

/// What a record of `__transaction_state` keeps of an id: the fields of `TransactionLogValue`, and
/// what a pending transition would make them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnSnapshot {
    pub producer_id: i64,
    /// The producer id before the last rotation (an exhausted epoch), so that a KIP-360 retry of that
    /// rotation is recognised; [`NO_PRODUCER_ID`] if none.
    pub last_producer_id: i64,
    pub producer_epoch: i16,
    /// The epoch before the last bump requested with an expected epoch (KIP-360), so that a retry of that
    /// bump gets the same answer; [`NO_PRODUCER_EPOCH`] otherwise. Kept in memory only, as in Kafka.
    pub last_producer_epoch: i16,
    pub txn_timeout_ms: i32,
    pub state: TxnState,
    pub partitions: BTreeSet<TopicPartition>,
    /// When the current transaction began (its first AddPartitions), -1 if none is open.
    pub txn_start_ms: i64,
    pub txn_last_update_ms: i64,
}

/// One transactional id at the coordinator: the committed snapshot, and the transition being written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnMetadata {
    pub transactional_id: String,
    pub current: TxnSnapshot,
    /// The transition being written to the log, if any; applied only once the write commits.
    pub pending: Option<TxnSnapshot>,
    /// In memory only: the markers of the prepared outcome are all written (so the Complete record may be
    /// written, or written again after a failed attempt).
    pub markers_done: bool,
}

impl TxnMetadata {
    /// A new id, before its first InitProducerId write: epoch -1, Empty.
    pub fn new(transactional_id: String, producer_id: i64, txn_timeout_ms: i32, now_ms: i64) -> Self {
        TxnMetadata {
            transactional_id,
            current: TxnSnapshot {
                producer_id,
                last_producer_id: NO_PRODUCER_ID,
                producer_epoch: NO_PRODUCER_EPOCH,
                last_producer_epoch: NO_PRODUCER_EPOCH,
                txn_timeout_ms,
                state: TxnState::Empty,
                partitions: BTreeSet::new(),
                txn_start_ms: -1,
                txn_last_update_ms: now_ms,
            },
            pending: None,
            markers_done: false,
        }
    }

    /// Rebuilt from a record of the log.
    pub fn from_snapshot(transactional_id: String, snapshot: TxnSnapshot) -> Self {
        TxnMetadata { transactional_id, current: snapshot, pending: None, markers_done: false }
    }

    pub fn state(&self) -> TxnState {
        self.current.state
    }

    /// The state this id is moving to, if a transition is being written.
    pub fn pending_state(&self) -> Option<TxnState> {
        self.pending.as_ref().map(|p| p.state)
    }

    /// Records `target` as the transition to write. The caller has checked that the request allows it;
    /// a transition outside Kafka's table, or a second one while one is pending, is a bug.
    pub fn prepare(&mut self, target: TxnSnapshot) -> &TxnSnapshot {
        assert!(self.pending.is_none(), "{}: a transition is already pending", self.transactional_id);
        assert!(
            target.state.valid_previous().contains(&self.current.state),
            "{}: {:?} -> {:?} is not a valid transition",
            self.transactional_id,
            self.current.state,
            target.state
        );
        assert!(target.state != TxnState::PrepareEpochFence, "PrepareEpochFence is never written");
        self.pending.insert(target)
    }

    /// Starts aborting the Ongoing transaction under a bumped epoch: the id is PrepareEpochFence in memory
    /// while `target` (a PrepareAbort with the new epoch) is written.
    pub fn prepare_fence(&mut self, target: TxnSnapshot) -> &TxnSnapshot {
        assert!(
            TxnState::PrepareEpochFence.valid_previous().contains(&self.current.state),
            "{}: cannot fence from {:?}",
            self.transactional_id,
            self.current.state
        );
        assert_eq!(target.state, TxnState::PrepareAbort, "a fence aborts");
        self.current.state = TxnState::PrepareEpochFence;
        self.prepare(target)
    }

    /// The pending transition's write committed: it becomes the current state.
    pub fn apply_pending(&mut self) {
        let target = self.pending.take().expect("a committed write has a pending transition");
        if !target.state.is_prepare() {
            self.markers_done = false;
        }
        self.current = target;
    }

    /// The pending transition's write failed: back to the state before it. A PrepareEpochFence falls back
    /// to the Ongoing transaction it was fencing (the epoch was never bumped, since the bump was pending).
    pub fn revert_pending(&mut self) {
        assert!(self.pending.take().is_some(), "a failed write has a pending transition");
        if self.current.state == TxnState::PrepareEpochFence {
            self.current.state = TxnState::Ongoing;
        }
    }
}
