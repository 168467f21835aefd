//! A seeded simulation of the transaction coordinator's state machine (`shardlog_broker::txn`) with
//! producers, replicated data partitions and a `__transaction_state` log, with no I/O, no threads and a
//! logical clock.
//!
//! What is simulated:
//! - Producers (some sharing a transactional id, so that one fences the other and the fenced one carries
//!   on as a zombie) begin transactions, add partitions, write data and commit or abort; some stall past
//!   their transaction timeout.
//! - Each batch is verified (KIP-890 part 1) and appended later, not in the same step: the leader takes
//!   the producer's verification guard (the storage's own `ProducerStates`), asks the coordinator
//!   (`verify_partition`) unless the producer's transaction is already open there, and the batch reaches
//!   the leader some time later, now and then long after. Meanwhile its transaction may end and its marker
//!   land: the guard the marker took away refuses the batch. A producer that waits too long for a batch
//!   gives up on it (it may still be appended), aborts, and asks for a new epoch.
//! - Data partitions have three replicas (`partitions`): appends are acknowledged once the in-sync
//!   replicas hold them; followers stall and leave the ISR; leaders change, losing the suffix the new
//!   leader lacks and every verification guard, the new one rebuilding its producer state from its log. A
//!   batch not acknowledged is retried (and verified afresh); a marker not acknowledged is sent again to
//!   the new leader, as the coordinator retries.
//! - Writes to the `__transaction_state` log are delayed and fail; markers are delayed; the coordinator
//!   crashes (what it had not been told was committed is lost, or sometimes durable without it knowing)
//!   and a new one is rebuilt from the log's bytes.
//!
//! After every step the simulator checks:
//! - no transaction is both committed and aborted (its records, its markers, its partitions agree);
//! - markers of a transaction go exactly to the partitions its records list, and a marker that closes a
//!   transaction closes the one it was sent for;
//! - no transaction is left hanging: no data is appended after a marker of its own transaction, and every
//!   transaction open at a leader is one the coordinator has Ongoing or being decided for that producer,
//!   with that partition, as the id's current transaction;
//! - an Ok answer to AddPartitions, EndTxn or a leader's verification goes only to the latest epoch
//!   initialised for the id, so a fenced producer changes nothing;
//! - no acknowledged entry of a data partition is lost, and its HW never moves back;
//! - the LSO read_committed readers see (bounded by the HW, so losing unacknowledged entries cannot move
//!   it) never moves back, and every record below it belongs to a transaction whose marker is below the HW.
//!
//! Then the faults stop and producers start nothing new: every replica must catch up, every transaction
//! end, every partition's LSO reach its log end with each transaction's data there followed by a marker of
//! its outcome, and every id leave Ongoing/Prepare*. A failing seed is printed with the command that
//! replays it: `SIM_SEED=<seed> cargo test -p shardlog-broker --test txn_sim -- --ignored replay
//! --nocapture` (add `SIM_TRACE=1` for every step). `SIM_SEEDS=<n>` runs more seeds than the default.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::ResponseError;
use shardlog_broker::txn::{
    Effect, InitProducerId, ProducerIdAndEpoch, ProducerIdSource, Reply, RequestToken, TxnCoordinator, TxnLogRecord,
    TxnMarkers, TxnResult, TxnSettings, TxnState, WriteId,
};
use shardlog_storage::TopicPartition;
use shardlog_storage::txn::MarkerKind;

static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// With `SIM_TRACE=1`, what happens, step by step (for replaying a seed).
macro_rules! trace {
    ($($arg:tt)*) => {
        if *$crate::TRACE.get_or_init(|| std::env::var_os("SIM_TRACE").is_some()) {
            println!($($arg)*);
        }
    };
}

mod delivery;
mod partitions;
mod rng;

use delivery::{DataWrite, Delivery, MarkerJob, WriteStage};
use partitions::{Partition, RunId, result_name};
use rng::Rng;

const STEPS: usize = 1500;
const HEAL_STEPS: usize = 3000;
const PARTITIONS: u32 = 5;
const TXN_TIMEOUT_MS: i32 = 2_000;
/// How long a producer waits for a batch's acknowledgement before it gives up on it and aborts.
const REQUEST_TIMEOUT_MS: i64 = 1_000;
/// Short, so that ids expire during a run.
const EXPIRATION_MS: i64 = 8_000;
/// Producers and their transactional ids: two pairs share an id.
const PRODUCER_IDS: [&str; 5] = ["a", "b", "c", "a", "b"];

/// The quorum's producer id blocks: ids survive coordinator crashes.
struct Ids(i64);

impl ProducerIdSource for Ids {
    fn next_producer_id(&mut self) -> Option<i64> {
        self.0 += 1;
        Some(self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    NeedInit,
    Idle,
    Adding(Vec<TopicPartition>),
    /// Partitions added, data still to write to these.
    Producing(Vec<TopicPartition>),
    Ending(TxnResult),
}

#[derive(Debug)]
struct Producer {
    transactional_id: &'static str,
    phase: Phase,
    /// What its last InitProducerId gave it (stale once another instance of its id initialised).
    me: Option<ProducerIdAndEpoch>,
    /// The request it waits on the answer of.
    waiting: Option<RequestToken>,
    /// It waits for the acknowledgement of a batch (its one in `Sim::data` not abandoned).
    writing: bool,
    /// The run its AddPartitions was answered for: the transaction its batches belong to.
    run: Option<RunId>,
    /// It gave up on a batch: once its transaction is aborted it asks for a new epoch (KIP-360), since
    /// that batch may still be appended under the old one.
    bump_epoch: bool,
    stalled_until: i64,
}

/// A run of a transactional id as the log tells it: from the Ongoing record that opened it to its outcome.
#[derive(Debug, Default)]
struct Run {
    transactional_id: String,
    partitions: BTreeSet<TopicPartition>,
    outcome: Option<TxnResult>,
}

struct Sim {
    rng: Rng,
    now: i64,
    faults: bool,
    coordinator: TxnCoordinator,
    coordinator_epoch: i32,
    ids: Ids,
    /// `__transaction_state`: the records whose write committed (key and value bytes).
    log: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    /// Writes asked for and not yet reported: (due time, write, record).
    writes: Vec<(i64, WriteId, TxnLogRecord)>,
    jobs: Vec<MarkerJob>,
    producers: Vec<Producer>,
    data: Vec<DataWrite>,
    /// The next sequence of each producer id and epoch at each partition.
    seqs: BTreeMap<(i64, i16, TopicPartition), i32>,
    /// Request token → producer index.
    asks: BTreeMap<RequestToken, usize>,
    next_request: u64,
    partitions: BTreeMap<TopicPartition, Partition>,
    runs: BTreeMap<RunId, Run>,
    /// Per transactional id: its open (or last) run as the log tells it.
    current_run: BTreeMap<String, RunId>,
    /// Per transactional id: the last producer id and epoch an InitProducerId answered.
    initialised: BTreeMap<String, ProducerIdAndEpoch>,
    committed: usize,
    aborted: usize,
    crashes: usize,
    /// Ids expired (tombstones in the log).
    expired: usize,
    /// Batches refused for want of their guard: a marker took it away after their verification began,
    /// or their transaction, open when they were sent, had ended by their append.
    unverified: usize,
    /// Batches their producers gave up on.
    abandoned: usize,
}

fn tp(partition: u32) -> TopicPartition {
    TopicPartition::new("t", partition)
}

fn settings() -> TxnSettings {
    TxnSettings { transaction_max_timeout_ms: 60_000, transactional_id_expiration_ms: EXPIRATION_MS }
}

impl Sim {
    fn new(seed: u64) -> Self {
        let mut coordinator = TxnCoordinator::loading(settings(), 0);
        assert!(coordinator.finish_loading().is_empty());
        Sim {
            rng: Rng(seed),
            now: 0,
            faults: true,
            coordinator,
            coordinator_epoch: 0,
            ids: Ids(0),
            log: Vec::new(),
            writes: Vec::new(),
            jobs: Vec::new(),
            producers: PRODUCER_IDS
                .iter()
                .map(|id| Producer {
                    transactional_id: id,
                    phase: Phase::NeedInit,
                    me: None,
                    waiting: None,
                    writing: false,
                    run: None,
                    bump_epoch: false,
                    stalled_until: 0,
                })
                .collect(),
            asks: BTreeMap::new(),
            next_request: 0,
            data: Vec::new(),
            seqs: BTreeMap::new(),
            partitions: (0..PARTITIONS).map(|p| (tp(p), Partition::new())).collect(),
            runs: BTreeMap::new(),
            current_run: BTreeMap::new(),
            initialised: BTreeMap::new(),
            committed: 0,
            aborted: 0,
            crashes: 0,
            expired: 0,
            unverified: 0,
            abandoned: 0,
        }
    }

    fn run(&mut self) -> Result<(), String> {
        for step in 0..STEPS + HEAL_STEPS {
            if step == STEPS {
                trace!("--- faults stop");
                self.faults = false;
                for p in &mut self.producers {
                    p.stalled_until = 0;
                }
            }
            self.now += self.rng.range(1, 20);
            self.step().map_err(|e| format!("step {step} at {} ms: {e}", self.now))?;
            self.check().map_err(|e| format!("step {step} at {} ms: {e}", self.now))?;
        }
        self.check_settled()
    }

    fn step(&mut self) -> Result<(), String> {
        if self.faults && self.rng.permille(4) {
            self.crash()?;
        }
        let effects = self.coordinator.tick(self.now);
        self.handle(effects)?;
        self.settle_writes()?;
        for p in self.partitions.values_mut() {
            p.step(&mut self.rng, self.now, self.faults)?;
        }
        self.deliver_markers()?;
        self.deliver_data()?;
        for _ in 0..2 {
            let i = self.rng.below(self.producers.len() as u64) as usize;
            self.act(i)?;
        }
        Ok(())
    }

    /// The coordinator's broker fails: writes it was not told about are lost (or, sometimes, durable
    /// without it ever hearing so), its answers are never sent, and a new coordinator loads the log.
    fn crash(&mut self) -> Result<(), String> {
        self.crashes += 1;
        for (_, write, record) in std::mem::take(&mut self.writes) {
            if self.rng.permille(200) {
                trace!("crash: write {write:?} of {} durable unreported", record.transactional_id);
                self.append(&record)?;
            }
        }
        for p in &mut self.producers {
            p.waiting = None;
        }
        self.asks.clear();
        self.coordinator_epoch += 1;
        trace!("crash: coordinator epoch {} loads {} records", self.coordinator_epoch, self.log.len());
        let mut coordinator = TxnCoordinator::loading(settings(), self.coordinator_epoch);
        for (key, value) in &self.log {
            let record = TxnLogRecord::decode(key, value.as_deref()).map_err(|e| format!("unreadable record: {e}"))?;
            coordinator.replay(record);
        }
        let effects = coordinator.finish_loading();
        self.coordinator = coordinator;
        self.handle(effects)
    }

    fn request(&mut self, producer: usize) -> RequestToken {
        self.next_request += 1;
        let token = RequestToken(self.next_request);
        self.asks.insert(token, producer);
        self.producers[producer].waiting = Some(token);
        token
    }

    fn handle(&mut self, effects: Vec<Effect>) -> Result<(), String> {
        for effect in effects {
            match effect {
                Effect::Write { write, record } => {
                    let due = self.now + self.rng.range(0, 40);
                    self.writes.push((due, write, record));
                }
                Effect::Answer { request, reply } => self.answered(request, reply)?,
                Effect::SendMarkers(markers) => self.send_markers(markers)?,
            }
        }
        Ok(())
    }

    fn settle_writes(&mut self) -> Result<(), String> {
        let now = self.now;
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.writes).into_iter().partition(|w| w.0 <= now);
        self.writes = later;
        for (_, write, record) in due {
            if self.faults && self.rng.permille(80) {
                trace!("write {write:?} of {} fails", record.transactional_id);
                let effects = self.coordinator.write_failed(write, ResponseError::NotEnoughReplicas);
                self.handle(effects)?;
            } else {
                self.append(&record)?;
                let effects = self.coordinator.write_committed(write, self.now);
                self.handle(effects)?;
            }
        }
        Ok(())
    }

    /// A record reaches the log: the runs are followed from what the log says.
    fn append(&mut self, record: &TxnLogRecord) -> Result<(), String> {
        trace!(
            "log: {} {:?}",
            record.transactional_id,
            record.value.as_ref().map(|v| (v.state, v.producer_id, v.producer_epoch, v.partitions.len()))
        );
        self.log.push((record.encode_key(), record.encode_value()));
        let id = &record.transactional_id;
        let open = self.current_run.get(id).copied().filter(|r| self.runs[r].outcome.is_none());
        let Some(value) = &record.value else {
            if let Some(run) = open {
                return Err(format!("{id} expired with run {run} open"));
            }
            self.expired += 1;
            return Ok(());
        };
        match value.state {
            TxnState::Ongoing => {
                let run = match open {
                    Some(run) => run,
                    None => {
                        let run = self.runs.len() as RunId;
                        self.runs.insert(run, Run { transactional_id: id.clone(), ..Run::default() });
                        self.current_run.insert(id.clone(), run);
                        run
                    }
                };
                let r = self.runs.get_mut(&run).expect("run");
                if !r.partitions.is_subset(&value.partitions) {
                    return Err(format!("run {run} lost partitions"));
                }
                r.partitions = value.partitions.clone();
            }
            TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::CompleteCommit | TxnState::CompleteAbort => {
                let result = if matches!(value.state, TxnState::PrepareCommit | TxnState::CompleteCommit) {
                    TxnResult::Commit
                } else {
                    TxnResult::Abort
                };
                let run = *self.current_run.get(id).ok_or(format!("{id}: {:?} without a run", value.state))?;
                let r = self.runs.get_mut(&run).expect("run");
                match r.outcome {
                    Some(o) if o != result => {
                        return Err(format!("run {run} of {id} both {} and {}", result_name(o), result_name(result)));
                    }
                    Some(_) => {}
                    None => {
                        r.outcome = Some(result);
                        match result {
                            TxnResult::Commit => self.committed += 1,
                            TxnResult::Abort => self.aborted += 1,
                        }
                    }
                }
                if value.state.is_prepare() && value.partitions != r.partitions {
                    return Err(format!("run {run}: decided with other partitions than it added"));
                }
            }
            TxnState::Empty => {
                if let Some(run) = open {
                    return Err(format!("{id} went Empty with run {run} open"));
                }
            }
            state => return Err(format!("{id}: {state:?} written to the log")),
        }
        Ok(())
    }

    fn send_markers(&mut self, markers: TxnMarkers) -> Result<(), String> {
        let id = &markers.transactional_id;
        let run = *self.current_run.get(id).ok_or(format!("markers for {id} without a run"))?;
        let r = &self.runs[&run];
        if r.outcome != Some(markers.result) {
            return Err(format!(
                "run {run}: {} markers, but the log says {:?}",
                result_name(markers.result),
                r.outcome
            ));
        }
        let to: BTreeSet<TopicPartition> = markers.partitions.iter().cloned().collect();
        if to != r.partitions {
            return Err(format!("run {run}: markers for {to:?}, the transaction has {:?}", r.partitions));
        }
        trace!("markers: run {run} of {id} {} to {} partitions", result_name(markers.result), to.len());
        let deliveries = to.into_iter().map(|p| Delivery::Due(self.now + self.rng.range(1, 300), p)).collect();
        self.jobs.push(MarkerJob { markers, run, deliveries });
        Ok(())
    }

    /// The producer does its next thing, unless it is waiting or stalled.
    fn act(&mut self, i: usize) -> Result<(), String> {
        let p = &self.producers[i];
        if p.waiting.is_some() || p.stalled_until > self.now {
            return Ok(());
        }
        if p.writing {
            let now = self.now;
            let Some(w) = self.data.iter_mut().find(|w| w.producer == i && !w.abandoned) else {
                return Err(format!("producer {i} waits for a batch not on its way"));
            };
            if now - w.sent_ms < REQUEST_TIMEOUT_MS {
                return Ok(());
            }
            // The batch timed out: the transaction can only abort, and the batch may still be appended
            // under this epoch, so the producer will ask for a new one.
            trace!("producer {i} gives up on batch {} of run {} at {:?}", w.seq, w.run, w.partition);
            w.abandoned = true;
            self.abandoned += 1;
            let p = &mut self.producers[i];
            p.writing = false;
            p.bump_epoch = true;
            p.phase = Phase::Ending(TxnResult::Abort);
            return Ok(());
        }
        if self.faults && self.rng.permille(20) {
            // Mostly shorter than the transaction timeout or a little longer; now and then, between
            // transactions, longer than the id's expiration, so it comes back to a forgotten id.
            let stall = if p.phase == Phase::Idle && self.rng.permille(500) {
                self.rng.range(EXPIRATION_MS, EXPIRATION_MS + 3_000)
            } else {
                self.rng.range(100, 4_000)
            };
            trace!("producer {i} stalls {stall} ms");
            self.producers[i].stalled_until = self.now + stall;
            return Ok(());
        }
        let id = p.transactional_id;
        let me = p.me;
        match p.phase.clone() {
            Phase::NeedInit => {
                // KIP-360: sometimes ask for a bump of the epoch it has; always after giving up on a batch.
                let bump = std::mem::take(&mut self.producers[i].bump_epoch) || self.rng.permille(300);
                let expected = me.filter(|_| bump);
                let req = InitProducerId { transactional_id: id.into(), txn_timeout_ms: TXN_TIMEOUT_MS, expected };
                let token = self.request(i);
                trace!("producer {i} ({id}) InitProducerId expecting {expected:?}");
                let effects = self.coordinator.init_producer_id(token, &req, self.now, &mut self.ids);
                self.handle(effects)?;
            }
            Phase::Idle => {
                if !self.faults {
                    return Ok(());
                }
                let count = self.rng.range(1, 3) as usize;
                let mut parts: Vec<TopicPartition> =
                    (0..count).map(|_| tp(self.rng.below(u64::from(PARTITIONS)) as u32)).collect();
                parts.sort();
                parts.dedup();
                self.producers[i].phase = Phase::Adding(parts);
                return self.act(i);
            }
            Phase::Adding(parts) => {
                let me = me.expect("initialised");
                let token = self.request(i);
                trace!("producer {i} ({id}, {me:?}) adds {parts:?}");
                let effects = self.coordinator.add_partitions(token, id, me, &parts, self.now);
                self.handle(effects)?;
            }
            Phase::Producing(left) => {
                let me = me.expect("initialised");
                let run = self.producers[i].run.expect("partitions added");
                // Now and then a stray write to a partition it did not add: it must be refused.
                let stray = self.rng.permille(50);
                let partition = if stray { tp(self.rng.below(u64::from(PARTITIONS)) as u32) } else { left[0].clone() };
                let p = self.partitions.get_mut(&partition).expect("partition");
                let leader_epoch = p.leader_epoch;
                // KIP-890: the leader takes the producer's guard before it asks the coordinator, which it
                // need not when the producer's transaction is open there at this epoch.
                let guard = p.begin_verification(me.producer_id, me.epoch, self.now);
                let verified =
                    if guard.is_some() { self.coordinator.verify_partition(id, me, &partition) } else { Ok(()) };
                trace!("producer {i} ({id}, {me:?}) writes to {partition:?} with {guard:?}: {verified:?}");
                match verified {
                    Ok(()) => {
                        if guard.is_some() {
                            self.check_latest(id, me, "verified")?;
                            let open = self.current_run.get(id).copied().ok_or("verified without a run")?;
                            let r = &self.runs[&open];
                            if open != run || r.outcome.is_some() || !r.partitions.contains(&partition) {
                                return Err(format!("verified {partition:?} of run {run} outside open run {open}"));
                            }
                        }
                        let seq = self.seqs.get(&(me.producer_id, me.epoch, partition.clone())).copied().unwrap_or(0);
                        // Mostly quick; now and then the append comes long after the verification (a slow
                        // request), past its producer's patience or its transaction's timeout.
                        let delay = if self.faults && self.rng.permille(40) {
                            self.rng.range(REQUEST_TIMEOUT_MS / 2, 3 * REQUEST_TIMEOUT_MS)
                        } else {
                            self.rng.range(0, 40)
                        };
                        let stage = WriteStage::Appending { due: self.now + delay, leader_epoch, guard };
                        self.data.push(DataWrite {
                            producer: i,
                            partition,
                            me,
                            seq,
                            run,
                            stage,
                            sent_ms: self.now,
                            abandoned: false,
                        });
                        self.producers[i].writing = true;
                    }
                    Err(_) if stray => {}
                    Err(ResponseError::ProducerFenced | ResponseError::InvalidProducerIdMapping) => {
                        self.producers[i].phase = Phase::NeedInit;
                    }
                    Err(ResponseError::InvalidTxnState) => {
                        self.producers[i].phase = Phase::Ending(TxnResult::Abort);
                    }
                    Err(e) => return Err(format!("unexpected verification error {e:?}")),
                }
            }
            Phase::Ending(result) => {
                let me = me.expect("initialised");
                let token = self.request(i);
                trace!("producer {i} ({id}, {me:?}) EndTxn {}", result_name(result));
                let effects = self.coordinator.end_txn(token, id, me, result, self.now);
                self.handle(effects)?;
            }
        }
        Ok(())
    }

    /// A request's answer reaches its producer.
    fn answered(&mut self, request: RequestToken, reply: Result<Reply, ResponseError>) -> Result<(), String> {
        let Some(i) = self.asks.remove(&request) else { return Ok(()) };
        self.producers[i].waiting = None;
        let id = self.producers[i].transactional_id;
        let phase = self.producers[i].phase.clone();
        trace!("producer {i} ({id}) {phase:?} answered {reply:?}");
        let next = match (phase, reply) {
            (Phase::NeedInit, Ok(Reply::ProducerId(me))) => {
                let prev = self.initialised.get(id).filter(|prev| prev.producer_id == me.producer_id);
                if prev.is_some_and(|prev| me.epoch < prev.epoch) {
                    return Err(format!("{id}: epoch went back from {prev:?} to {me:?}"));
                }
                self.initialised.insert(id.to_string(), me);
                self.producers[i].me = Some(me);
                Phase::Idle
            }
            (Phase::NeedInit, Err(ResponseError::ProducerFenced)) => {
                self.producers[i].me = None;
                Phase::NeedInit
            }
            (Phase::NeedInit, Err(_)) => Phase::NeedInit,
            (Phase::Adding(parts), Ok(Reply::Done)) => {
                self.check_latest(id, self.producers[i].me.expect("initialised"), "added partitions")?;
                let run = self.current_run.get(id).copied().ok_or("partitions added without a run")?;
                self.producers[i].run = Some(run);
                Phase::Producing(parts)
            }
            (Phase::Ending(result), Ok(Reply::Done)) => {
                let me = self.producers[i].me.expect("initialised");
                self.check_latest(id, me, "ended its transaction")?;
                let run = self.current_run.get(id).map(|r| &self.runs[r]);
                if run.and_then(|r| r.outcome) != Some(result) {
                    return Err(format!("{id}: EndTxn {} answered Ok, the log says {:?}", result_name(result), run));
                }
                Phase::Idle
            }
            (Phase::Adding(_) | Phase::Ending(_), Err(ResponseError::ProducerFenced))
            | (Phase::Adding(_) | Phase::Ending(_), Err(ResponseError::InvalidProducerIdMapping)) => Phase::NeedInit,
            (Phase::Ending(_), Err(ResponseError::InvalidTxnState)) => Phase::Idle,
            (Phase::Adding(_), Err(ResponseError::InvalidTxnState)) => Phase::NeedInit,
            (phase @ (Phase::Adding(_) | Phase::Ending(_)), Err(_)) => phase,
            (phase, reply) => return Err(format!("producer {i}: {reply:?} in {phase:?}")),
        };
        let p = &mut self.producers[i];
        p.phase = if next == Phase::Idle && p.bump_epoch { Phase::NeedInit } else { next };
        Ok(())
    }

    /// An Ok that changes a transaction goes only to the latest epoch initialised for the id.
    fn check_latest(&self, id: &str, me: ProducerIdAndEpoch, what: &str) -> Result<(), String> {
        match self.initialised.get(id) {
            Some(latest) if *latest == me => Ok(()),
            latest => Err(format!("{id}: fenced producer {me:?} {what}; latest is {latest:?}")),
        }
    }

    /// After every step: the partitions' LSOs, and that every transaction open at a leader is one its
    /// coordinator has open (Ongoing or being decided) for that producer, including that partition, and
    /// the run the log tells is the id's current one. Data appended after its transaction ended (a
    /// hanging transaction) fails this, or the check at its append if it came after its own marker.
    fn check(&mut self) -> Result<(), String> {
        for (partition, p) in &mut self.partitions {
            p.update_lso().map_err(|e| format!("{partition:?}: {e}"))?;
            for (producer_id, epoch, run) in p.open_txns() {
                let id = &self.runs[&run].transactional_id;
                let meta = self.coordinator.transactions().find(|m| m.transactional_id == *id);
                let open = meta.is_some_and(|m| {
                    let c = &m.current;
                    matches!(
                        c.state,
                        TxnState::Ongoing
                            | TxnState::PrepareCommit
                            | TxnState::PrepareAbort
                            | TxnState::PrepareEpochFence
                    ) && (c.producer_id == producer_id || c.last_producer_id == producer_id)
                        && epoch <= c.producer_epoch
                        && c.partitions.contains(partition)
                });
                if !open || self.current_run.get(id) != Some(&run) {
                    return Err(format!(
                        "{partition:?}: hanging transaction of run {run} (producer {producer_id} epoch {epoch}); the \
                         coordinator has {:?}, the id's run is {:?}",
                        meta.map(|m| &m.current),
                        self.current_run.get(id)
                    ));
                }
            }
        }
        Ok(())
    }

    fn check_settled(&mut self) -> Result<(), String> {
        for (partition, p) in &mut self.partitions {
            p.check_replicas_settled().map_err(|e| format!("{partition:?}: {e}"))?;
            let lso = p.update_lso()?;
            if lso != p.log_end() {
                return Err(format!(
                    "{partition:?}: hanging: LSO {lso}, log end {}, open {:?}",
                    p.log_end(),
                    p.open_txns()
                ));
            }
            // Every transaction with data here is closed by a marker of its outcome, after its data.
            for (run, marker) in p.runs_written() {
                let r = &self.runs[&run];
                if !r.partitions.contains(partition) {
                    return Err(format!("run {run} has data at {partition:?}, outside its partitions"));
                }
                let expected = r.outcome.map(|o| match o {
                    TxnResult::Commit => MarkerKind::Commit,
                    TxnResult::Abort => MarkerKind::Abort,
                });
                if expected.is_none() || marker.map(|m| m.kind) != expected {
                    return Err(format!("run {run} at {partition:?}: outcome {:?}, marker {marker:?}", r.outcome));
                }
            }
        }
        for meta in self.coordinator.transactions() {
            if !meta.state().is_idle() || meta.pending.is_some() {
                return Err(format!("{} left in {:?}", meta.transactional_id, meta.state()));
            }
        }
        Ok(())
    }
}

/// What a seed went through, to show that the simulation exercised what it checks.
#[derive(Debug, Default, Clone, Copy)]
struct Totals {
    committed: usize,
    aborted: usize,
    crashes: usize,
    expired: usize,
    leader_changes: usize,
    suffixes_lost: usize,
    unverified: usize,
    abandoned: usize,
}

fn run_seed(seed: u64) -> Result<Totals, String> {
    let mut sim = Sim::new(seed);
    sim.run()?;
    Ok(Totals {
        committed: sim.committed,
        aborted: sim.aborted,
        crashes: sim.crashes,
        expired: sim.expired,
        leader_changes: sim.partitions.values().map(|p| p.leader_changes).sum(),
        suffixes_lost: sim.partitions.values().map(|p| p.suffixes_lost).sum(),
        unverified: sim.unverified,
        abandoned: sim.abandoned,
    })
}

fn replay_hint(seed: u64) -> String {
    format!("replay: SIM_SEED={seed} cargo test -p shardlog-broker --test txn_sim -- --ignored replay --nocapture")
}

#[test]
fn transactions_end_once_and_markers_go_where_their_data_is_over_many_seeds() {
    let seeds: u64 = std::env::var("SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(600);
    let mut all = Totals::default();
    for seed in 0..seeds {
        match std::panic::catch_unwind(|| run_seed(seed)) {
            Ok(Ok(t)) => {
                all.committed += t.committed;
                all.aborted += t.aborted;
                all.crashes += t.crashes;
                all.expired += t.expired;
                all.leader_changes += t.leader_changes;
                all.suffixes_lost += t.suffixes_lost;
                all.unverified += t.unverified;
                all.abandoned += t.abandoned;
            }
            Ok(Err(e)) => panic!("seed {seed}: {e}\n{}", replay_hint(seed)),
            Err(_) => panic!("seed {seed} panicked\n{}", replay_hint(seed)),
        }
    }
    println!("{seeds} seeds: {all:?}");
    let seeds = seeds as usize;
    assert!(all.committed > seeds * 5, "too few commits for the simulation to mean much: {all:?}");
    assert!(all.aborted > seeds, "too few aborts: {all:?}");
    assert!(all.crashes > seeds, "too few coordinator crashes: {all:?}");
    assert!(all.expired > seeds, "too few expired ids: {all:?}");
    assert!(all.leader_changes > seeds * 5, "too few leader changes: {all:?}");
    assert!(seeds < 100 || all.suffixes_lost > seeds / 4, "too few unacknowledged suffixes lost: {all:?}");
    assert!(all.abandoned > seeds, "too few batches given up on: {all:?}");
    // About one a seed: too rare to ask of a handful of seeds.
    assert!(seeds < 100 || all.unverified > seeds / 4, "too few batches refused for their guard: {all:?}");
}

/// Replays one seed: `SIM_SEED=<seed> cargo test -p shardlog-broker --test txn_sim -- --ignored replay`.
#[test]
#[ignore = "replays the seed in SIM_SEED"]
fn replay() {
    let seed: u64 = std::env::var("SIM_SEED").expect("SIM_SEED").parse().expect("a number");
    let totals = run_seed(seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    println!("seed {seed}: {totals:?}");
}
