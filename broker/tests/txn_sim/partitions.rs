//! The data partitions of the simulation, replicated: each has [`REPLICAS`] replicas, a leader, an in-sync
//! set (ISR) and a high watermark. The leader judges producers' batches and the coordinator's markers with
//! the storage's own producer state (`shardlog_storage::producer_state::ProducerStates`: sequences,
//! epochs, open transactions and KIP-890's verification guards), so the simulation drives the code the
//! broker runs rather than a copy of its rules.
//!
//! Replication as the simulation models it:
//! - Appends (transactional data, written acks=all, and markers, which are always acks=all) go to the
//!   leader's log and are acknowledged once the high watermark passes them: the HW is the shortest prefix
//!   every ISR member shares with the leader.
//! - A follower now and then stalls (its broker pauses): it leaves the ISR at once (as after
//!   `replica.lag.time.max.ms`) and rejoins once it is back and has caught up to the HW. At most one
//!   replica is out at a time, so the ISR keeps two (`min.insync.replicas`).
//! - A leader change elects another ISR member. With three in sync the old leader crashed (it leaves the
//!   ISR and stalls); with two it is a controlled move and it stays in sync. Either way a follower
//!   truncates what it holds past its common prefix with the leader, so the unacknowledged suffix the old
//!   leader had and the new one lacks is lost. Appends waiting for their acknowledgement at the old leader
//!   are answered NOT_LEADER_OR_FOLLOWER (the producer or coordinator retries them). The new leader
//!   rebuilds its producer state from its own log, as recovery does, so every verification guard is gone.
//!
//! Checks kept here, after every change:
//! - no acknowledged entry is ever lost, and the HW never moves back;
//! - no data of a transaction is appended after a marker of that transaction (a hanging transaction:
//!   nothing would ever close it);
//! - a marker that closes a transaction closes the one it was sent for;
//! - the LSO read_committed readers see (the earliest of the first open transaction, the first ended one
//!   whose marker is not yet below the HW, and the HW, as the log computes it) never moves back, and every
//!   record it passes belongs to a transaction whose marker is below the HW.

use std::collections::{BTreeMap, BTreeSet};

use shardlog_storage::Offset;
use shardlog_storage::batch::BatchHeader;
use shardlog_storage::producer_state::{ProducerError, ProducerStates, Verdict, VerificationGuard};
use shardlog_storage::txn::TxnMarker;
use shardlog_storage::txn::marker::TRANSACTIONAL_BIT;

use crate::rng::Rng;

/// A transaction of the simulation: one run of a transactional id between an Ongoing record and its
/// outcome, numbered by the simulator.
pub type RunId = u64;

/// Replicas of each partition.
pub const REPLICAS: usize = 3;

/// An entry of a replica's log. `id` is unique in the partition, so that two logs agree on an offset only
/// when they hold the same append (what leader epochs tell a real follower).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Data { id: u64, producer_id: i64, epoch: i16, seq: i32, run: RunId },
    Marker { id: u64, marker: TxnMarker, run: RunId },
}

impl Entry {
    fn id(&self) -> u64 {
        match self {
            Entry::Data { id, .. } | Entry::Marker { id, .. } => *id,
        }
    }
}

/// A producer's batch, as the leader's producer state sees it: one record.
fn header(producer_id: i64, epoch: i16, seq: i32) -> BatchHeader {
    BatchHeader {
        base_offset: 0,
        batch_length: 0,
        partition_leader_epoch: 0,
        magic: 2,
        crc: 0,
        attributes: TRANSACTIONAL_BIT,
        last_offset_delta: 0,
        base_timestamp: 0,
        max_timestamp: 0,
        producer_id,
        producer_epoch: epoch,
        base_sequence: seq,
        record_count: 1,
    }
}

/// What the leader did with a producer's batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataAnswer {
    /// Appended at this offset; acknowledged once the HW passes it.
    Appended(u64),
    /// A retry of a batch already in the log at this offset; acknowledged once the HW passes it.
    Duplicate(u64),
    /// Refused by the producer rules (a stale epoch, or KIP-890's guard); nothing written.
    Refused(ProducerError),
}

/// What the leader did with a marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MarkerAnswer {
    /// Appended at this offset, closing the run's transaction here or nothing.
    Appended {
        offset: u64,
        closed: Option<RunId>,
    },
    Refused(ProducerError),
}

#[derive(Debug)]
pub struct Partition {
    logs: Vec<Vec<Entry>>,
    leader: usize,
    /// Bumped by every leader change: an append waiting for its acknowledgement under an older one is
    /// answered NOT_LEADER_OR_FOLLOWER.
    pub leader_epoch: u32,
    isr: BTreeSet<usize>,
    /// How many entries each replica shares with the leader from the start (kept, not recomputed, since
    /// logs grow long).
    matched: [usize; REPLICAS],
    /// Each replica's broker is stalled until then.
    stalled_until: [i64; REPLICAS],
    hw: u64,
    /// The leader's producer state, rebuilt from its log when it takes over.
    states: ProducerStates,
    /// Transactions ended by a marker not yet below the HW: (first offset, marker offset). They hold the
    /// LSO back, as the log's "completed" transactions do.
    completed: Vec<(u64, u64)>,
    /// The first marker of each run in the leader's log.
    markers_at: BTreeMap<RunId, u64>,
    /// The LSO readers were last shown.
    lso: u64,
    /// The ids of the acknowledged entries (those below the HW), offset by offset.
    acked: Vec<u64>,
    next_id: u64,
    pub leader_changes: usize,
    /// Leader changes that lost entries the old leader had and the new one lacked.
    pub suffixes_lost: usize,
}

impl Partition {
    pub fn new() -> Self {
        Partition {
            logs: vec![Vec::new(); REPLICAS],
            leader: 0,
            leader_epoch: 0,
            isr: (0..REPLICAS).collect(),
            matched: [0; REPLICAS],
            stalled_until: [0; REPLICAS],
            hw: 0,
            states: ProducerStates::default(),
            completed: Vec::new(),
            markers_at: BTreeMap::new(),
            lso: 0,
            acked: Vec::new(),
            next_id: 0,
            leader_changes: 0,
            suffixes_lost: 0,
        }
    }

    pub fn log_end(&self) -> u64 {
        self.logs[self.leader].len() as u64
    }

    /// KIP-890: the leader hands out the producer's guard before the coordinator is asked, or `None`
    /// when its transaction is open here at `epoch` (nothing to ask).
    pub fn begin_verification(&mut self, producer_id: i64, epoch: i16, now: i64) -> Option<VerificationGuard> {
        self.states.begin_verification(producer_id, epoch, now)
    }

    /// A producer's batch reaches the leader, which judges it (with the guard its verification got) and
    /// appends it in the same step, as the log does.
    pub fn append_data(
        &mut self,
        producer_id: i64,
        epoch: i16,
        seq: i32,
        run: RunId,
        guard: Option<VerificationGuard>,
        now: i64,
    ) -> Result<DataAnswer, String> {
        let h = header(producer_id, epoch, seq);
        let verdict = self.states.check_guarded(&h, guard);
        let offset = self.log_end();
        match verdict {
            Err(e) => Ok(DataAnswer::Refused(e)),
            Ok(Verdict::Duplicate(batch)) => Ok(DataAnswer::Duplicate(batch.base_offset.0)),
            Ok(Verdict::Append) => {
                if let Some(marker) = self.markers_at.get(&run) {
                    return Err(format!(
                        "hanging transaction: data of run {run} (producer {producer_id} epoch {epoch}) appended at \
                         {offset}, after the run's marker at {marker}"
                    ));
                }
                self.states.record(&h, Offset(offset), now, true);
                self.next_id += 1;
                let entry = Entry::Data { id: self.next_id, producer_id, epoch, seq, run };
                self.logs[self.leader].push(entry);
                Ok(DataAnswer::Appended(offset))
            }
        }
    }

    /// WriteTxnMarkers for this partition, at its leader.
    pub fn append_marker(&mut self, marker: &TxnMarker, run: RunId, now: i64) -> Result<MarkerAnswer, String> {
        if let Err(e) = self.states.check_marker(marker) {
            return Ok(MarkerAnswer::Refused(e));
        }
        let offset = self.log_end();
        let done = self.states.record_marker(marker, Offset(offset), now, true);
        self.next_id += 1;
        self.logs[self.leader].push(Entry::Marker { id: self.next_id, marker: *marker, run });
        self.markers_at.entry(run).or_insert(offset);
        let closed = match done {
            None => None,
            Some(done) => {
                self.completed.push((done.first_offset.0, offset));
                let Entry::Data { run: opened, .. } = self.logs[self.leader][done.first_offset.0 as usize] else {
                    return Err(format!("a marker closed a transaction starting at marker {}", done.first_offset.0));
                };
                if opened != run {
                    return Err(format!("a marker of run {run} closed run {opened} at {}", done.first_offset.0));
                }
                Some(opened)
            }
        };
        Ok(MarkerAnswer::Appended { offset, closed })
    }

    /// Whether the append at `offset` under `leader_epoch` is acknowledged (`Some(true)`), still waiting
    /// (`Some(false)`), or was answered NOT_LEADER_OR_FOLLOWER by a leader change (`None`).
    pub fn acknowledged(&self, offset: u64, leader_epoch: u32) -> Option<bool> {
        (leader_epoch == self.leader_epoch).then_some(offset < self.hw)
    }

    /// One step of the replicas: stalls, leader changes (with `faults`), followers fetching, the ISR and
    /// the HW.
    pub fn step(&mut self, rng: &mut Rng, now: i64, faults: bool) -> Result<(), String> {
        if faults && self.isr.len() == REPLICAS && rng.permille(3) {
            let follower = (self.leader + 1 + rng.below(REPLICAS as u64 - 1) as usize) % REPLICAS;
            self.isr.remove(&follower);
            self.stalled_until[follower] = now + rng.range(50, 1_500);
        }
        if faults && rng.permille(2) {
            self.change_leader(rng, now)?;
        }
        for r in 0..REPLICAS {
            if r == self.leader || self.stalled_until[r] > now || !rng.permille(600) {
                continue;
            }
            let common = self.matched[r];
            let leader_log = &self.logs[self.leader];
            let upto = (common + rng.range(1, 4) as usize).min(leader_log.len());
            let copied = leader_log[common..upto].to_vec();
            let log = &mut self.logs[r];
            log.truncate(common);
            log.extend(copied);
            self.matched[r] = upto;
            if !self.isr.contains(&r) && upto as u64 >= self.hw {
                self.isr.insert(r);
            }
        }
        self.advance_hw()
    }

    /// How many entries replica `r` shares with the leader from the start.
    fn common_prefix(&self, r: usize) -> usize {
        let (log, leader) = (&self.logs[r], &self.logs[self.leader]);
        log.iter().zip(leader).take_while(|(a, b)| a.id() == b.id()).count()
    }

    fn advance_hw(&mut self) -> Result<(), String> {
        self.matched[self.leader] = self.log_end() as usize;
        let hw = self.isr.iter().map(|r| self.matched[*r] as u64).min().expect("the leader is in sync");
        if hw < self.hw {
            return Err(format!("HW moved back from {} to {hw}", self.hw));
        }
        self.hw = hw;
        self.completed.retain(|(_, marker)| *marker >= hw);
        let log = &self.logs[self.leader];
        for entry in &log[self.acked.len()..hw as usize] {
            self.acked.push(entry.id());
        }
        Ok(())
    }

    /// Another in-sync replica takes over; it rebuilds the producer state from its log.
    fn change_leader(&mut self, rng: &mut Rng, now: i64) -> Result<(), String> {
        let others: Vec<usize> = self.isr.iter().copied().filter(|r| *r != self.leader).collect();
        if others.is_empty() {
            return Ok(());
        }
        let old = self.leader;
        self.leader = others[rng.below(others.len() as u64) as usize];
        self.leader_epoch += 1;
        self.leader_changes += 1;
        if self.isr.len() == REPLICAS {
            self.isr.remove(&old);
            self.stalled_until[old] = now + rng.range(50, 1_500);
        }
        trace!(
            "leader {old} -> {} at epoch {}, log end {} -> {}, HW {}, ISR {:?}",
            self.leader,
            self.leader_epoch,
            self.logs[old].len(),
            self.logs[self.leader].len(),
            self.hw,
            self.isr
        );
        self.matched = std::array::from_fn(|r| self.common_prefix(r));
        if self.matched[old] < self.logs[old].len() {
            self.suffixes_lost += 1;
        }
        let log = &self.logs[self.leader];
        if log.len() < self.acked.len() || log.iter().zip(&self.acked).any(|(e, id)| e.id() != *id) {
            return Err(format!("new leader {} lacks acknowledged entries", self.leader));
        }
        self.states = ProducerStates::default();
        self.completed.clear();
        self.markers_at.clear();
        for (offset, entry) in log.iter().enumerate() {
            match entry {
                Entry::Data { producer_id, epoch, seq, .. } => {
                    self.states.record(&header(*producer_id, *epoch, *seq), Offset(offset as u64), now, true);
                }
                Entry::Marker { marker, run, .. } => {
                    self.markers_at.entry(*run).or_insert(offset as u64);
                    if let Some(done) = self.states.record_marker(marker, Offset(offset as u64), now, true)
                        && offset as u64 >= self.hw
                    {
                        self.completed.push((done.first_offset.0, offset as u64));
                    }
                }
            }
        }
        self.advance_hw()
    }

    /// Recomputes the LSO readers see and checks it: it never moves back, and every record it passes
    /// belongs to a transaction whose marker is below the HW.
    pub fn update_lso(&mut self) -> Result<u64, String> {
        let first_open = self.states.first_open_txn().map(|o| o.0);
        let held = self.completed.iter().map(|(first, _)| *first).min();
        let lso = [first_open, held].into_iter().flatten().fold(self.hw, u64::min);
        if lso < self.lso {
            return Err(format!("LSO moved back from {} to {lso}", self.lso));
        }
        let log = &self.logs[self.leader];
        for offset in self.lso..lso {
            if let Entry::Data { run, .. } = &log[offset as usize] {
                match self.markers_at.get(run) {
                    Some(marker) if *marker > offset && *marker < self.hw => {}
                    marker => {
                        return Err(format!(
                            "LSO {lso} passed data of run {run} at {offset}, its marker at {marker:?}, HW {}",
                            self.hw
                        ));
                    }
                }
            }
        }
        self.lso = lso;
        Ok(lso)
    }

    /// The transactions open at the leader: (producer id, epoch of its first batch, run).
    pub fn open_txns(&self) -> Vec<(i64, i16, RunId)> {
        let log = &self.logs[self.leader];
        self.states
            .open_txns()
            .map(|(first, _)| match &log[first.0 as usize] {
                Entry::Data { producer_id, epoch, run, .. } => (*producer_id, *epoch, *run),
                Entry::Marker { .. } => panic!("a transaction opened by a marker at {}", first.0),
            })
            .collect()
    }

    /// Every run with data in the leader's log, with the marker that follows it, if one does.
    pub fn runs_written(&self) -> BTreeMap<RunId, Option<TxnMarker>> {
        let log = &self.logs[self.leader];
        let mut runs = BTreeMap::new();
        for entry in log {
            if let Entry::Data { run, .. } = entry {
                let marker = self.markers_at.get(run).map(|at| match &log[*at as usize] {
                    Entry::Marker { marker, .. } => *marker,
                    Entry::Data { .. } => panic!("markers_at points at data"),
                });
                runs.insert(*run, marker);
            }
        }
        runs
    }

    /// After the faults: every replica back in sync with the same log, and the HW at its end.
    pub fn check_replicas_settled(&self) -> Result<(), String> {
        let end = self.log_end();
        for r in 0..REPLICAS {
            if !self.isr.contains(&r) || self.logs[r] != self.logs[self.leader] {
                return Err(format!("replica {r} out of sync (ISR {:?})", self.isr));
            }
        }
        if self.hw != end {
            return Err(format!("HW {} short of the log end {end}", self.hw));
        }
        Ok(())
    }
}

/// The result the markers of a run carry, for messages.
pub fn result_name(r: shardlog_broker::txn::TxnResult) -> &'static str {
    match r {
        shardlog_broker::txn::TxnResult::Commit => "commit",
        shardlog_broker::txn::TxnResult::Abort => "abort",
    }
}
