//! A seeded simulation of the transaction coordinator's state machine (`shardlog_broker::txn`) with
//! producers, partition leaders and a `__transaction_state` log, with no I/O, no threads and a logical
//! clock. Producers (some sharing a transactional id, so that one fences the other and the fenced one
//! carries on as a zombie) begin transactions, add partitions, write data (each leader verifies the
//! partition with the coordinator first, KIP-890 part 1), and commit or abort; some stall past their
//! transaction timeout. Writes to the log are delayed and fail; markers are delayed; the coordinator
//! crashes (what it had not been told was committed is lost, or sometimes durable without it knowing) and
//! a new one is rebuilt from the log's bytes. After every step the simulator checks:
//! - no transaction is both committed and aborted (its records, its markers, its partitions agree);
//! - markers of a transaction go exactly to the partitions its records list, and every partition holding
//!   its data is closed by a marker of its outcome, never by another transaction's marker;
//! - an Ok answer to AddPartitions, EndTxn or a leader's verification goes only to the latest epoch
//!   initialised for the id, so a fenced producer changes nothing;
//! - each partition's LSO never moves back and never passes the first offset of an open transaction.
//!
//! Then the faults stop and producers start nothing new: every transaction must end, every partition's
//! LSO reach its log end, and every id leave Ongoing/Prepare*. A failing seed is printed with the command
//! that replays it: `SIM_SEED=<seed> cargo test -p shardlog-broker --test txn_sim -- --ignored replay
//! --nocapture` (add `SIM_TRACE=1` for every step). `SIM_SEEDS=<n>` runs more seeds than the default.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::ResponseError;
use shardlog_broker::txn::{
    Effect, InitProducerId, ProducerIdAndEpoch, ProducerIdSource, Reply, RequestToken, TxnCoordinator, TxnLogRecord,
    TxnMarkers, TxnResult, TxnSettings, TxnState, WriteId,
};
use shardlog_storage::TopicPartition;

static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// With `SIM_TRACE=1`, what happens, step by step (for replaying a seed).
macro_rules! trace {
    ($($arg:tt)*) => {
        if *TRACE.get_or_init(|| std::env::var_os("SIM_TRACE").is_some()) {
            println!($($arg)*);
        }
    };
}

mod partitions;

use partitions::{MarkerOutcome, Partition, RunId, result_name};

const STEPS: usize = 1500;
const HEAL_STEPS: usize = 3000;
const PARTITIONS: u32 = 5;
const TXN_TIMEOUT_MS: i32 = 2_000;
/// Short, so that ids expire during a run.
const EXPIRATION_MS: i64 = 8_000;
/// Producers and their transactional ids: two pairs share an id.
const PRODUCER_IDS: [&str; 5] = ["a", "b", "c", "a", "b"];

/// splitmix64: small, seedable, and the same everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn permille(&mut self, permille: u64) -> bool {
        self.below(1000) < permille
    }
    fn range(&mut self, low: i64, high: i64) -> i64 {
        low + self.below((high - low + 1) as u64) as i64
    }
}

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
    stalled_until: i64,
}

/// A run of a transactional id as the log tells it: from the Ongoing record that opened it to its outcome.
#[derive(Debug, Default)]
struct Run {
    transactional_id: String,
    partitions: BTreeSet<TopicPartition>,
    outcome: Option<TxnResult>,
    /// Partitions that hold its data.
    written: BTreeSet<TopicPartition>,
    /// Partitions where a marker of its outcome closed its data.
    closed: BTreeSet<TopicPartition>,
}

/// Markers on their way to the leaders.
struct MarkerJob {
    markers: TxnMarkers,
    run: RunId,
    /// (due time, partition) still to deliver.
    deliveries: Vec<(i64, TopicPartition)>,
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
                    stalled_until: 0,
                })
                .collect(),
            asks: BTreeMap::new(),
            next_request: 0,
            partitions: (0..PARTITIONS).map(|p| (tp(p), Partition::default())).collect(),
            runs: BTreeMap::new(),
            current_run: BTreeMap::new(),
            initialised: BTreeMap::new(),
            committed: 0,
            aborted: 0,
            crashes: 0,
            expired: 0,
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
        self.deliver_markers()?;
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
        let deliveries = to.into_iter().map(|p| (self.now + self.rng.range(1, 300), p)).collect();
        self.jobs.push(MarkerJob { markers, run, deliveries });
        Ok(())
    }

    fn deliver_markers(&mut self) -> Result<(), String> {
        let now = self.now;
        let mut finished = Vec::new();
        for (j, job) in self.jobs.iter_mut().enumerate() {
            let (due, later): (Vec<_>, Vec<_>) = job.deliveries.drain(..).partition(|d| d.0 <= now);
            job.deliveries = later;
            for (_, partition) in due {
                let outcome = self.partitions.get_mut(&partition).expect("partition").marker(&job.markers);
                trace!("marker of run {} at {partition:?}: {outcome:?}", job.run);
                if let MarkerOutcome::Closed(closed) = outcome {
                    if closed != job.run {
                        return Err(format!("a marker of run {} closed run {closed} at {partition:?}", job.run));
                    }
                    let run = self.runs.get_mut(&closed).expect("run");
                    if run.outcome != Some(job.markers.result) || !run.written.contains(&partition) {
                        return Err(format!(
                            "run {closed} closed at {partition:?} by {:?}: {run:?}",
                            job.markers.result
                        ));
                    }
                    if !run.closed.insert(partition.clone()) {
                        return Err(format!("run {closed} closed twice at {partition:?}"));
                    }
                }
            }
            if job.deliveries.is_empty() {
                finished.push(j);
            }
        }
        for j in finished.into_iter().rev() {
            let job = self.jobs.remove(j);
            // A coordinator that crashed since never hears of it.
            if job.markers.coordinator_epoch == self.coordinator_epoch {
                let m = &job.markers;
                let producer = ProducerIdAndEpoch { producer_id: m.producer_id, epoch: m.producer_epoch };
                let effects = self.coordinator.markers_written(&m.transactional_id, producer, m.result, self.now);
                self.handle(effects)?;
            }
        }
        Ok(())
    }

    /// The producer does its next thing, unless it is waiting or stalled.
    fn act(&mut self, i: usize) -> Result<(), String> {
        let p = &self.producers[i];
        if p.waiting.is_some() || p.stalled_until > self.now {
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
                // KIP-360: sometimes ask for a bump of the epoch it has.
                let expected = me.filter(|_| self.rng.permille(300));
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
            Phase::Producing(mut left) => {
                let me = me.expect("initialised");
                // Now and then a stray write to a partition it did not add: it must be refused.
                let stray = self.rng.permille(50);
                let partition = if stray { tp(self.rng.below(u64::from(PARTITIONS)) as u32) } else { left[0].clone() };
                let verified = self.coordinator.verify_partition(id, me, &partition);
                trace!("producer {i} ({id}, {me:?}) writes to {partition:?}: {verified:?}");
                match verified {
                    Ok(()) => {
                        self.check_latest(id, me, "verified")?;
                        let run = *self.current_run.get(id).ok_or("verified without a run")?;
                        let r = self.runs.get_mut(&run).expect("run");
                        if r.outcome.is_some() || !r.partitions.contains(&partition) {
                            return Err(format!("verified {partition:?} outside open run {run}"));
                        }
                        r.written.insert(partition.clone());
                        self.partitions.get_mut(&partition).expect("partition").append(
                            me.producer_id,
                            me.epoch,
                            run,
                        )?;
                        left.retain(|p| *p != partition);
                        self.producers[i].phase = if left.is_empty() {
                            Phase::Ending(if self.rng.permille(700) { TxnResult::Commit } else { TxnResult::Abort })
                        } else {
                            Phase::Producing(left)
                        };
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
        self.producers[i].phase = next;
        Ok(())
    }

    /// An Ok that changes a transaction goes only to the latest epoch initialised for the id.
    fn check_latest(&self, id: &str, me: ProducerIdAndEpoch, what: &str) -> Result<(), String> {
        match self.initialised.get(id) {
            Some(latest) if *latest == me => Ok(()),
            latest => Err(format!("{id}: fenced producer {me:?} {what}; latest is {latest:?}")),
        }
    }

    /// After every step: the partitions' LSOs. (What a run may hold is checked where it changes: data at
    /// verification, markers at delivery, outcomes at each record.)
    fn check(&mut self) -> Result<(), String> {
        for (partition, p) in &mut self.partitions {
            p.update_lso().map_err(|e| format!("{partition:?}: {e}"))?;
        }
        Ok(())
    }

    fn check_runs(&self) -> Result<(), String> {
        for (run, r) in &self.runs {
            if !r.written.is_subset(&r.partitions) {
                return Err(format!("run {run} has data outside its partitions"));
            }
            if !r.closed.is_subset(&r.written) {
                return Err(format!("run {run} closed where it has no data"));
            }
            if !r.closed.is_empty() && r.outcome.is_none() {
                return Err(format!("run {run} closed before its outcome was durable"));
            }
        }
        Ok(())
    }

    fn check_settled(&mut self) -> Result<(), String> {
        self.check_runs()?;
        for (partition, p) in &mut self.partitions {
            let lso = p.update_lso()?;
            if lso != p.log_end {
                return Err(format!(
                    "{partition:?}: hanging: LSO {lso}, log end {}, open {:?}",
                    p.log_end,
                    p.open_runs()
                ));
            }
        }
        for (run, r) in &self.runs {
            if r.outcome.is_none() && !r.written.is_empty() {
                return Err(format!("run {run} of {} never ended", r.transactional_id));
            }
            if r.closed != r.written {
                return Err(format!("run {run}: data at {:?}, closed at {:?}", r.written, r.closed));
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
}

fn run_seed(seed: u64) -> Result<Totals, String> {
    let mut sim = Sim::new(seed);
    sim.run()?;
    Ok(Totals { committed: sim.committed, aborted: sim.aborted, crashes: sim.crashes, expired: sim.expired })
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
}

/// Replays one seed: `SIM_SEED=<seed> cargo test -p shardlog-broker --test txn_sim -- --ignored replay`.
#[test]
#[ignore = "replays the seed in SIM_SEED"]
fn replay() {
    let seed: u64 = std::env::var("SIM_SEED").expect("SIM_SEED").parse().expect("a number");
    let totals = run_seed(seed).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    println!("seed {seed}: {totals:?}");
}
