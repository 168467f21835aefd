//! The partition leaders of the simulation: each keeps a log of transactional data and markers, its open
//! transactions (the first offset of each producer's), and its last stable offset, as a leader does for
//! read_committed fetches.

use std::collections::BTreeMap;

use shardlog_broker::txn::{TxnMarkers, TxnResult};

/// A transaction of the simulation: one run of a transactional id between an Ongoing record and its
/// outcome, numbered by the simulator.
pub type RunId = u64;

#[derive(Debug, Clone, Copy)]
struct OpenTxn {
    first_offset: u64,
    epoch: i16,
    run: RunId,
}

#[derive(Debug, Default)]
pub struct Partition {
    pub log_end: u64,
    open: BTreeMap<i64, OpenTxn>,
    /// The highest coordinator epoch a marker of each producer came with: older coordinators are fenced.
    coordinator_epochs: BTreeMap<i64, i32>,
    lso: u64,
}

/// What a marker did at a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerOutcome {
    /// It closed the producer's open transaction, which was `run`.
    Closed(RunId),
    /// Nothing was open for the producer (a resent marker, or a partition added but never written to).
    NothingOpen,
    /// It came from an older coordinator than one already heard from: refused.
    Fenced,
}

impl Partition {
    /// Appends a transactional record of `run`, by `producer_id` at `epoch`.
    pub fn append(&mut self, producer_id: i64, epoch: i16, run: RunId) -> Result<(), String> {
        let offset = self.log_end;
        self.log_end += 1;
        match self.open.get(&producer_id) {
            Some(open) if open.run != run => {
                Err(format!("producer {producer_id} wrote run {run} while run {} is still open here", open.run))
            }
            Some(_) => Ok(()),
            None => {
                self.open.insert(producer_id, OpenTxn { first_offset: offset, epoch, run });
                Ok(())
            }
        }
    }

    /// WriteTxnMarkers for this partition.
    pub fn marker(&mut self, m: &TxnMarkers) -> MarkerOutcome {
        let seen = self.coordinator_epochs.entry(m.producer_id).or_insert(m.coordinator_epoch);
        if *seen > m.coordinator_epoch {
            return MarkerOutcome::Fenced;
        }
        *seen = m.coordinator_epoch;
        self.log_end += 1;
        match self.open.get(&m.producer_id) {
            Some(open) if open.epoch <= m.producer_epoch => {
                let run = open.run;
                self.open.remove(&m.producer_id);
                MarkerOutcome::Closed(run)
            }
            _ => MarkerOutcome::NothingOpen,
        }
    }

    /// Recomputes the LSO and checks it: it never moves back and never passes an open transaction.
    pub fn update_lso(&mut self) -> Result<u64, String> {
        let lso = self.open.values().map(|o| o.first_offset).min().unwrap_or(self.log_end);
        if lso < self.lso {
            return Err(format!("LSO moved back from {} to {lso}", self.lso));
        }
        if let Some(open) = self.open.values().find(|o| o.first_offset < lso) {
            return Err(format!("LSO {lso} passed open run {} at {}", open.run, open.first_offset));
        }
        self.lso = lso;
        Ok(lso)
    }

    pub fn open_runs(&self) -> Vec<RunId> {
        self.open.values().map(|o| o.run).collect()
    }
}

/// The result the markers of a run carry, for messages.
pub fn result_name(r: TxnResult) -> &'static str {
    match r {
        TxnResult::Commit => "commit",
        TxnResult::Abort => "abort",
    }
}
