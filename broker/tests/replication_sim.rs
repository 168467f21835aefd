//! A seeded simulation of one partition replicated over three brokers: the replica state machines of
//! `shardlog_broker::replication` and the quorum's real state machine (`ClusterState`), with no I/O, no
//! threads and a logical clock. Messages between brokers are lost, delayed, duplicated and reordered;
//! brokers crash (losing what was not fdatasync'ed), pause, and are cut off from each other and from the
//! quorum. After every step the simulator checks:
//! - every record acknowledged under acks=all is, at its offset and fdatasync'ed, on every member of the
//!   quorum's ISR (so whichever the quorum elects has it);
//! - any two replicas hold the same records below the lower of their high watermarks;
//! - what consumers read below a leader's HW never changes;
//! - a leader's HW never moves back within its epoch;
//! - only the leader the quorum currently names acknowledges.
//!
//! At the end the faults heal and the partition must come back whole: every broker in the ISR, the HW at
//! the log end. A failing seed is printed with the command that replays it:
//! `SIM_SEED=<seed> cargo test -p shardlog-broker --test replication_sim -- --ignored replay --nocapture`.
//! `SIM_SEEDS=<n>` runs more seeds than the default.

use std::collections::{BTreeMap, BTreeSet};

use shardlog_broker::quorum::state::{BrokerEndpoint, ClusterState, Command, CommandError, NodeId, PartitionRecord};
use shardlog_broker::replication::{
    FetchPosition, FetchReply, FollowerStep, IsrProposal, LogView, ProposalOutcome, Replica, ReplicaSettings,
};
use shardlog_storage::epoch_cache::LeaderEpochCache;
use shardlog_storage::{LeaderEpoch, Offset};

const BROKERS: u32 = 3;

static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// With `SIM_TRACE=1`, what happens, step by step (for replaying a seed).
macro_rules! trace {
    ($($arg:tt)*) => {
        if *TRACE.get_or_init(|| std::env::var_os("SIM_TRACE").is_some()) {
            println!($($arg)*);
        }
    };
}
const TOPIC: &str = "t";
/// The broker gives up its leadership this long after its last heartbeat that reached the quorum ...
const SESSION_LOCAL_MS: i64 = 400;
/// ... well before the quorum fences it.
const SESSION_QUORUM_MS: i64 = 700;
const HEARTBEAT_MS: i64 = 100;
const STEPS: usize = 1500;
const HEAL_STEPS: usize = 1500;
/// Records a follower takes per fetch at most.
const FETCH_BATCHES: usize = 7;

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
    fn chance(&mut self, percent: u64) -> bool {
        self.below(1000) < percent * 10
    }
    fn permille(&mut self, permille: u64) -> bool {
        self.below(1000) < permille
    }
    fn range(&mut self, low: i64, high: i64) -> i64 {
        low + self.below((high - low + 1) as u64) as i64
    }
}

/// A replica's log in memory: one record per batch, its offset its index.
#[derive(Debug, Clone, Default)]
struct SimLog {
    /// (leader epoch, record id)
    records: Vec<(LeaderEpoch, u64)>,
    durable: usize,
    epochs: LeaderEpochCache,
}

impl SimLog {
    fn append(&mut self, epoch: LeaderEpoch, id: u64) {
        self.epochs.assign(epoch, Offset(self.records.len() as u64));
        self.records.push((epoch, id));
    }
    fn truncate(&mut self, to: usize) {
        self.records.truncate(to);
        self.durable = self.durable.min(to);
        self.epochs.truncate_from_end(Offset(to as u64));
    }
}

impl LogView for SimLog {
    fn log_start(&self) -> Offset {
        Offset::ZERO
    }
    fn log_end(&self) -> Offset {
        Offset(self.records.len() as u64)
    }
    fn stable_end(&self) -> Offset {
        Offset(self.durable as u64)
    }
    fn last_epoch(&self) -> Option<LeaderEpoch> {
        self.epochs.latest().map(|e| e.epoch)
    }
    fn first_epoch(&self) -> Option<LeaderEpoch> {
        self.epochs.entries().first().map(|e| e.epoch)
    }
    fn epoch_end(&self, epoch: LeaderEpoch) -> Option<(LeaderEpoch, Offset)> {
        self.epochs.end_offset_for(epoch, self.log_end())
    }
}

#[derive(Debug, Clone)]
enum Msg {
    Fetch { from: NodeId, to: NodeId, position: FetchPosition },
    Reply { from: NodeId, to: NodeId, asked: FetchPosition, reply: FetchReply, records: Vec<(LeaderEpoch, u64)> },
    Propose { from: NodeId, proposal: IsrProposal },
    Answer { to: NodeId, proposal: IsrProposal, outcome: ProposalOutcome },
}

impl Msg {
    /// (sender, receiver); the quorum is node 0.
    fn link(&self) -> (u32, u32) {
        match self {
            Msg::Fetch { from, to, .. } | Msg::Reply { from, to, .. } => (from.0, to.0),
            Msg::Propose { from, .. } => (from.0, 0),
            Msg::Answer { to, .. } => (0, to.0),
        }
    }
}

struct Broker {
    id: NodeId,
    log: SimLog,
    replica: Replica,
    incarnation: u64,
    /// Down (crashed) until this time; `None` when up.
    down_until: Option<i64>,
    paused_until: i64,
    last_heartbeat_ok: i64,
    next_heartbeat: i64,
    next_fetch: i64,
    checkpoint_hw: Offset,
    /// (leader epoch, incarnation) → highest HW seen, to check it never moves back.
    hw_seen: Option<(LeaderEpoch, u64, Offset)>,
}

impl Broker {
    fn up(&self, now: i64) -> bool {
        self.down_until.is_none() && now >= self.paused_until
    }
}

struct Sim {
    rng: Rng,
    now: i64,
    quorum: ClusterState,
    brokers: Vec<Broker>,
    net: Vec<(i64, Msg)>,
    /// Directed links that drop everything: (from, to), node 0 being the quorum.
    cut: BTreeSet<(u32, u32)>,
    cut_until: i64,
    next_id: u64,
    /// acks=all acknowledged: offset → record id.
    acked: BTreeMap<usize, u64>,
    /// Waiting produces: token (= record id) → offset.
    waiting: BTreeMap<u64, usize>,
    /// What consumers read below a leader's HW: the record id at each offset.
    seen: Vec<u64>,
    /// The leader (broker index, its incarnation, epoch) whose HW prefix was last compared with `seen`, and how far.
    seen_scan: Option<(usize, u64, LeaderEpoch, usize)>,
    /// Per pair of brokers, how far their logs are known to agree.
    agree: BTreeMap<(usize, usize), usize>,
    faults: bool,
    settings: ReplicaSettings,
}

fn node(i: u32) -> NodeId {
    NodeId(i)
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let settings = ReplicaSettings { replica_lag_time_max_ms: 1000, min_insync_replicas: 2, isr_retry_ms: 100 };
        let mut sim = Sim {
            rng: Rng(seed),
            now: 0,
            quorum: ClusterState::default(),
            brokers: Vec::new(),
            net: Vec::new(),
            cut: BTreeSet::new(),
            cut_until: 0,
            next_id: 1,
            acked: BTreeMap::new(),
            waiting: BTreeMap::new(),
            seen: Vec::new(),
            seen_scan: None,
            agree: BTreeMap::new(),
            faults: true,
            settings,
        };
        for i in 1..=BROKERS {
            sim.brokers.push(Broker {
                id: node(i),
                log: SimLog::default(),
                replica: Replica::new(node(i), settings, Offset::ZERO),
                incarnation: 1,
                down_until: None,
                paused_until: 0,
                last_heartbeat_ok: 0,
                next_heartbeat: 0,
                next_fetch: 0,
                checkpoint_hw: Offset::ZERO,
                hw_seen: None,
            });
            sim.register(i as usize - 1, None);
        }
        let create = Command::CreateTopic {
            name: TOPIC.into(),
            id: uuid::Uuid::from_u128(1),
            partitions: 1,
            replication_factor: BROKERS as u16,
            configs: BTreeMap::from([("min.insync.replicas".into(), "2".into())]),
            assignment: None,
        };
        sim.quorum.apply(&create).expect("topic created");
        for b in 0..sim.brokers.len() {
            sim.heartbeat(b);
        }
        sim
    }

    fn record(&self) -> &PartitionRecord {
        &self.quorum.topics[TOPIC].partitions[0]
    }

    fn register(&mut self, b: usize, previous: Option<u64>) {
        let broker = &self.brokers[b];
        let command = Command::RegisterBroker {
            id: broker.id,
            endpoint: BrokerEndpoint { host: "127.0.0.1".into(), port: 9000 + broker.id.0 as u16 },
            incarnation: broker.incarnation,
            previous_incarnation: previous,
            now_ms: self.now,
            session_timeout_ms: SESSION_QUORUM_MS,
        };
        self.quorum.apply(&command).expect("registration");
        self.brokers[b].last_heartbeat_ok = self.now;
    }

    /// A heartbeat that reached the quorum: the broker's session goes on and it learns the partition's record.
    fn heartbeat(&mut self, b: usize) {
        let broker = &self.brokers[b];
        let command = Command::BrokerHeartbeat { id: broker.id, incarnation: broker.incarnation, now_ms: self.now };
        if self.quorum.apply(&command).is_err() {
            return;
        }
        let record = self.record().clone();
        let now = self.now;
        trace!("t={now} broker {} heartbeat: {record:?}", b + 1);
        let broker = &mut self.brokers[b];
        broker.last_heartbeat_ok = now;
        broker.replica.set_session(true);
        broker.replica.apply_record(&record, now, &broker.log);
        self.after_change(b);
    }

    fn send(&mut self, msg: Msg) {
        let (from, to) = msg.link();
        if self.faults && (self.cut.contains(&(from, to)) || self.rng.chance(3)) {
            return;
        }
        let delay = if self.faults { self.rng.range(1, 60) } else { self.rng.range(1, 5) };
        if self.faults && self.rng.chance(2) {
            self.net.push((self.now + self.rng.range(1, 200), msg.clone()));
        }
        self.net.push((self.now + delay, msg));
    }

    fn run(&mut self, seed: u64) -> Result<(), String> {
        for step in 0..STEPS {
            self.step().map_err(|e| format!("seed {seed}, step {step} (t={} ms): {e}", self.now))?;
        }
        self.faults = false;
        self.cut.clear();
        for b in 0..self.brokers.len() {
            self.brokers[b].paused_until = self.brokers[b].paused_until.min(self.now);
            if self.brokers[b].down_until.is_some() {
                self.brokers[b].down_until = Some(self.now);
            }
        }
        for step in 0..HEAL_STEPS {
            self.step().map_err(|e| format!("seed {seed}, healing step {step} (t={} ms): {e}", self.now))?;
        }
        self.check_healed().map_err(|e| format!("seed {seed}, after healing: {e}"))
    }

    fn step(&mut self) -> Result<(), String> {
        self.now += self.rng.range(1, 15);
        let now = self.now;
        if self.faults {
            self.nemesis();
        }
        if now >= self.cut_until {
            self.cut.clear();
        }
        for b in 0..self.brokers.len() {
            if let Some(until) = self.brokers[b].down_until
                && now >= until
            {
                self.restart(b);
            }
            // The broker notices its session lapsed before it does anything else.
            let lapsed = now - self.brokers[b].last_heartbeat_ok > SESSION_LOCAL_MS;
            if self.brokers[b].down_until.is_none() && lapsed {
                self.brokers[b].replica.set_session(false);
                self.after_change(b);
            }
        }
        self.controller();
        for b in 0..self.brokers.len() {
            if !self.brokers[b].up(now) {
                continue;
            }
            self.broker_tick(b)?;
        }
        self.deliver()?;
        self.check()
    }

    fn nemesis(&mut self) {
        let now = self.now;
        let n = self.brokers.len();
        if self.rng.permille(4) {
            let b = self.rng.below(n as u64) as usize;
            if self.brokers[b].down_until.is_none() {
                self.crash(b);
                self.brokers[b].down_until = Some(now + self.rng.range(50, 3000));
            }
        }
        if self.rng.permille(4) {
            let b = self.rng.below(n as u64) as usize;
            self.brokers[b].paused_until = now + self.rng.range(100, 2500);
            trace!("t={now} broker {} pauses until {}", b + 1, self.brokers[b].paused_until);
        }
        if self.rng.permille(5) && self.cut.is_empty() {
            let b = self.rng.range(1, n as i64) as u32;
            let kind = self.rng.below(4);
            for other in 0..=n as u32 {
                if other == b {
                    continue;
                }
                let to_quorum = other == 0;
                match kind {
                    // Isolated from everyone.
                    0 => {
                        self.cut.insert((b, other));
                        self.cut.insert((other, b));
                    }
                    // Cut from its peers, still talking to the quorum.
                    1 if !to_quorum => {
                        self.cut.insert((b, other));
                        self.cut.insert((other, b));
                    }
                    // Cut from the quorum only.
                    2 if to_quorum => {
                        self.cut.insert((b, 0));
                        self.cut.insert((0, b));
                    }
                    // One way: nothing it sends arrives.
                    3 => {
                        self.cut.insert((b, other));
                    }
                    _ => {}
                }
            }
            self.cut_until = now + self.rng.range(100, 3000);
            trace!("t={now} links cut until {}: {:?}", self.cut_until, self.cut);
        }
    }

    /// The process dies: what was not fdatasync'ed is gone, and so is everything in memory.
    fn crash(&mut self, b: usize) {
        trace!(
            "t={} broker {} crashes, keeping {} of {} records",
            self.now,
            b + 1,
            self.brokers[b].log.durable,
            self.brokers[b].log.records.len()
        );
        let broker = &mut self.brokers[b];
        let durable = broker.log.durable;
        broker.log.truncate(durable);
        broker.replica = Replica::new(broker.id, self.settings, Offset::ZERO);
        let id = broker.id.0;
        self.forget_agreement(b);
        self.net.retain(|(_, m)| m.link().1 != id);
    }

    fn restart(&mut self, b: usize) {
        let now = self.now;
        let broker = &mut self.brokers[b];
        broker.down_until = None;
        let hw = broker.checkpoint_hw.min(broker.log.log_end());
        broker.replica = Replica::new(broker.id, self.settings, hw);
        let previous = broker.incarnation;
        broker.incarnation += 1;
        broker.paused_until = now;
        broker.next_heartbeat = now;
        self.register(b, Some(previous));
        self.heartbeat(b);
    }

    /// The quorum's controller fences brokers whose heartbeats stopped.
    fn controller(&mut self) {
        let expired: Vec<_> = self
            .quorum
            .brokers
            .iter()
            .filter(|(_, r)| !r.fenced && self.now - r.last_heartbeat_ms > SESSION_QUORUM_MS)
            .map(|(id, r)| (*id, r.incarnation, r.last_heartbeat_ms))
            .collect();
        for (id, incarnation, last_heartbeat_ms) in expired {
            self.quorum.apply(&Command::FenceBroker { id, incarnation, last_heartbeat_ms }).expect("fence");
            trace!("t={} quorum fences {id:?}: {:?}", self.now, self.record());
        }
    }

    fn broker_tick(&mut self, b: usize) -> Result<(), String> {
        let now = self.now;
        let id = self.brokers[b].id.0;
        if now >= self.brokers[b].next_heartbeat {
            self.brokers[b].next_heartbeat = now + HEARTBEAT_MS;
            let cut_off = self.cut.contains(&(id, 0)) || self.cut.contains(&(0, id));
            if !(self.faults && cut_off) {
                self.heartbeat(b);
            }
        }
        // Clients produce to whoever says it leads, acks=all.
        if self.rng.chance(30) {
            self.produce(b);
        }
        // Group commit.
        if self.rng.chance(25) {
            let broker = &mut self.brokers[b];
            broker.log.durable = broker.log.records.len();
            broker.replica.stable_end_moved(&broker.log);
            self.after_change(b);
        }
        if self.rng.chance(20) {
            self.brokers[b].checkpoint_hw = self.brokers[b].replica.high_watermark();
        }
        if now >= self.brokers[b].next_fetch {
            self.brokers[b].next_fetch = now + self.rng.range(3, 30);
            let broker = &self.brokers[b];
            if let Some((leader, position)) = broker.replica.fetch_position(&broker.log) {
                self.send(Msg::Fetch { from: broker.id, to: leader, position });
            }
        }
        if let Some(proposal) = self.brokers[b].replica.poll_isr_change(now) {
            let from = self.brokers[b].id;
            self.send(Msg::Propose { from, proposal });
        }
        Ok(())
    }

    fn produce(&mut self, b: usize) {
        let broker = &mut self.brokers[b];
        let Ok(epoch) = broker.replica.check_append(true) else { return };
        let id = self.next_id;
        self.next_id += 1;
        let offset = broker.log.records.len();
        broker.log.append(epoch, id);
        self.waiting.insert(id, offset);
        broker.replica.await_ack(id, Offset(offset as u64 + 1), &broker.log);
        self.after_change(b);
    }

    /// Collects a replica's finished acks and checks its HW.
    fn after_change(&mut self, b: usize) {
        let broker = &mut self.brokers[b];
        if let Some(epoch) = broker.replica.leading() {
            let hw = broker.replica.high_watermark();
            match broker.hw_seen {
                Some((e, inc, seen)) if e == epoch && inc == broker.incarnation => {
                    assert!(hw >= seen, "broker {} moved its HW back from {seen} to {hw} in epoch {epoch}", b + 1);
                    broker.hw_seen = Some((e, inc, hw));
                }
                _ => broker.hw_seen = Some((epoch, broker.incarnation, hw)),
            }
        }
        let acks = broker.replica.take_acks();
        let leading = broker.replica.leading();
        for (token, outcome) in acks {
            let offset = self.waiting.remove(&token).expect("a known wait");
            if outcome.is_err() {
                continue;
            }
            let record = self.record();
            assert!(
                record.leader == Some(node(b as u32 + 1)) && Some(record.leader_epoch) == leading,
                "broker {} acknowledged offset {offset} as leader at {leading:?}, but the quorum says {:?} leads at {}",
                b + 1,
                record.leader,
                record.leader_epoch
            );
            trace!(
                "t={} broker {} acks offset {offset}, hw {}",
                self.now,
                b + 1,
                self.brokers[b].replica.high_watermark()
            );
            for member in &record.isr {
                let log = &self.brokers[member.0 as usize - 1].log;
                assert!(
                    offset < log.durable && log.records[offset].1 == token,
                    "offset {offset} acknowledged by broker {}, but ISR member {} does not have it on disk",
                    b + 1,
                    member.0
                );
            }
            self.acked.insert(offset, token);
        }
    }

    fn deliver(&mut self) -> Result<(), String> {
        let now = self.now;
        if self.net.iter().all(|(at, _)| *at > now) {
            return Ok(());
        }
        let mut due = Vec::new();
        let mut later = Vec::with_capacity(self.net.len());
        for (at, msg) in self.net.drain(..) {
            if at <= now { due.push((at, msg)) } else { later.push((at, msg)) }
        }
        self.net = later;
        due.sort_by_key(|(at, _)| *at);
        for (at, msg) in due {
            let (_, to) = msg.link();
            if to != 0 {
                let b = to as usize - 1;
                if self.brokers[b].down_until.is_some() {
                    continue;
                }
                if !self.brokers[b].up(now) {
                    // Paused: it reads the message when it wakes.
                    self.net.push((self.brokers[b].paused_until.max(at), msg));
                    continue;
                }
            }
            self.receive(msg)?;
        }
        Ok(())
    }

    fn receive(&mut self, msg: Msg) -> Result<(), String> {
        let now = self.now;
        match msg {
            Msg::Fetch { from, to, position } => {
                let b = to.0 as usize - 1;
                let broker = &mut self.brokers[b];
                let reply = broker.replica.on_fetch(now, &position, &broker.log);
                let records = match reply {
                    FetchReply::Records { from: start, .. } => {
                        let start = start.0 as usize;
                        let end = broker.log.records.len().min(start + FETCH_BATCHES);
                        broker.log.records[start..end].to_vec()
                    }
                    _ => Vec::new(),
                };
                self.after_change(b);
                self.send(Msg::Reply { from: to, to: from, asked: position, reply, records });
            }
            Msg::Reply { to, asked, reply, records, .. } => {
                let b = to.0 as usize - 1;
                let broker = &mut self.brokers[b];
                match broker.replica.on_reply(&asked, &reply, &broker.log) {
                    FollowerStep::Append { high_watermark } => {
                        for (epoch, id) in records {
                            broker.log.append(epoch, id);
                        }
                        broker.replica.appended(high_watermark, &broker.log);
                    }
                    FollowerStep::Truncate(to) => {
                        trace!("t={now} broker {} truncates to {to} after {reply:?}", b + 1);
                        broker.log.truncate(to.0 as usize);
                        self.forget_agreement(b);
                        self.check_truncation(b, to.0 as usize)?;
                    }
                    // With no retention every log starts at 0: starting over means emptying the log.
                    FollowerStep::StartAt(Offset(0)) => {
                        trace!("t={now} broker {} empties its log after {reply:?}", b + 1);
                        broker.log.truncate(0);
                        self.forget_agreement(b);
                        self.check_truncation(b, 0)?;
                    }
                    FollowerStep::StartAt(offset) => {
                        return Err(format!("log start moved to {offset} with no retention"));
                    }
                    FollowerStep::Ignore => {}
                }
                self.after_change(b);
            }
            Msg::Propose { from, proposal } => {
                let command = Command::AlterPartition {
                    topic: TOPIC.into(),
                    partition: 0,
                    leader: from,
                    leader_epoch: proposal.leader_epoch,
                    partition_epoch: proposal.partition_epoch,
                    isr: proposal.isr.clone(),
                };
                trace!("t={now} quorum gets {command:?}");
                let outcome = match self.quorum.apply(&command) {
                    Ok(_) => ProposalOutcome::Applied,
                    Err(CommandError::FencedLeaderEpoch { .. } | CommandError::InvalidUpdateVersion { .. }) => {
                        ProposalOutcome::Stale
                    }
                    Err(_) => ProposalOutcome::Refused,
                };
                // A member may have joined: it must hold everything acknowledged so far.
                self.check_isr_members()?;
                self.send(Msg::Answer { to: from, proposal, outcome });
            }
            Msg::Answer { to, proposal, outcome } => {
                let b = to.0 as usize - 1;
                let broker = &mut self.brokers[b];
                broker.replica.isr_change_answered(now, &proposal, outcome, &broker.log);
                self.after_change(b);
            }
        }
        Ok(())
    }

    fn forget_agreement(&mut self, b: usize) {
        let len = self.brokers[b].log.records.len();
        for ((x, y), upto) in self.agree.iter_mut() {
            if *x == b || *y == b {
                *upto = (*upto).min(len);
            }
        }
    }

    /// A truncating ISR member must keep every acknowledged record.
    fn check_truncation(&self, b: usize, to: usize) -> Result<(), String> {
        let record = self.record();
        if !record.isr.contains(&node(b as u32 + 1)) {
            return Ok(());
        }
        match self.acked.range(to..).next() {
            Some((offset, _)) => {
                Err(format!("ISR member {} truncated to {to}, below acknowledged offset {offset}", b + 1))
            }
            None => Ok(()),
        }
    }

    /// Every member of the quorum's ISR holds every acknowledged record on disk.
    fn check_isr_members(&self) -> Result<(), String> {
        for member in &self.record().isr {
            let log = &self.brokers[member.0 as usize - 1].log;
            for (&offset, &id) in &self.acked {
                if offset >= log.durable || log.records[offset].1 != id {
                    return Err(format!("ISR member {} lacks acknowledged offset {offset} (record {id})", member.0));
                }
            }
        }
        Ok(())
    }

    fn check(&mut self) -> Result<(), String> {
        // A crash loses what was not on disk: no ISR member may lose an acknowledged record that way.
        self.check_isr_members_cheap()?;
        let n = self.brokers.len();
        for x in 0..n {
            for y in x + 1..n {
                let (a, b) = (&self.brokers[x], &self.brokers[y]);
                let below = a.replica.high_watermark().0.min(b.replica.high_watermark().0) as usize;
                let below = below.min(a.log.records.len()).min(b.log.records.len());
                let from = self.agree.get(&(x, y)).copied().unwrap_or(0);
                for offset in from..below {
                    if a.log.records[offset] != b.log.records[offset] {
                        return Err(format!(
                            "brokers {} and {} differ at offset {offset} below their HWs ({} and {}): {:?} vs {:?}",
                            x + 1,
                            y + 1,
                            a.replica.high_watermark(),
                            b.replica.high_watermark(),
                            a.log.records[offset],
                            b.log.records[offset]
                        ));
                    }
                }
                self.agree.insert((x, y), from.max(below));
            }
        }
        // Consumers read from the leader up to its HW (once KIP-207 lets them see its offsets).
        let record = self.record();
        if let Some(leader) = record.leader {
            let broker = &self.brokers[leader.0 as usize - 1];
            if broker.down_until.is_none()
                && broker.replica.leading() == Some(record.leader_epoch)
                && broker.replica.offsets_available()
            {
                let hw = (broker.replica.high_watermark().0 as usize).min(broker.log.records.len());
                let b = leader.0 as usize - 1;
                // A leader's log changes only at its end: what was compared in its term stays compared.
                let from = match self.seen_scan {
                    Some((x, inc, epoch, upto))
                        if x == b && inc == broker.incarnation && epoch == record.leader_epoch =>
                    {
                        upto.min(hw)
                    }
                    _ => 0,
                };
                self.seen_scan = Some((b, broker.incarnation, record.leader_epoch, hw));
                for offset in from..hw {
                    let id = broker.log.records[offset].1;
                    match self.seen.get(offset) {
                        Some(&was) if was != id => {
                            return Err(format!("consumers read record {was} at offset {offset}, now record {id}"));
                        }
                        Some(_) => {}
                        None => self.seen.push(id),
                    }
                }
            }
        }
        Ok(())
    }

    /// The on-disk part of [`Sim::check_isr_members`], for the newest acknowledged records only (older ones
    /// were checked when acknowledged, and logs change only at their ends).
    fn check_isr_members_cheap(&self) -> Result<(), String> {
        for member in &self.record().isr {
            let log = &self.brokers[member.0 as usize - 1].log;
            if let Some((&offset, _)) = self.acked.last_key_value()
                && offset >= log.durable
            {
                return Err(format!(
                    "ISR member {} has only {} records on disk, below acknowledged offset {offset}",
                    member.0, log.durable
                ));
            }
        }
        Ok(())
    }

    fn check_healed(&self) -> Result<(), String> {
        self.check_isr_members()?;
        let record = self.record();
        let leader = record.leader.ok_or("no leader")?;
        if record.isr.len() != BROKERS as usize {
            return Err(format!("ISR {:?} after healing", record.isr));
        }
        let broker = &self.brokers[leader.0 as usize - 1];
        let hw = broker.replica.high_watermark();
        if hw.0 as usize + FETCH_BATCHES * 4 < broker.log.records.len() {
            return Err(format!("leader HW {hw} far behind its log end {}", broker.log.records.len()));
        }
        if self.acked.is_empty() {
            return Err("nothing was acknowledged".into());
        }
        Ok(())
    }
}

fn run_seed(seed: u64) -> Result<usize, String> {
    let mut sim = Sim::new(seed);
    sim.run(seed)?;
    Ok(sim.acked.len())
}

#[test]
fn replicas_keep_every_acknowledged_record_over_many_seeds() {
    let seeds: u64 = std::env::var("SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2000);
    let mut acked = 0;
    for seed in 0..seeds {
        let outcome = std::panic::catch_unwind(|| run_seed(seed));
        match outcome {
            Ok(Ok(count)) => acked += count,
            Ok(Err(e)) => panic!(
                "{e}\nreplay: SIM_SEED={seed} cargo test -p shardlog-broker --test replication_sim -- --ignored replay --nocapture"
            ),
            Err(_) => panic!(
                "seed {seed} panicked\nreplay: SIM_SEED={seed} cargo test -p shardlog-broker --test replication_sim -- --ignored replay --nocapture"
            ),
        }
    }
    println!("{seeds} seeds, {acked} records acknowledged");
    assert!(acked as u64 > seeds * 10, "too few acknowledgements ({acked}) for the simulation to mean much");
}

/// Replays one seed: `SIM_SEED=<seed> cargo test -p shardlog-broker --test replication_sim -- --ignored replay`.
#[test]
#[ignore = "replays the seed in SIM_SEED"]
fn replay() {
    let seed: u64 = std::env::var("SIM_SEED").expect("SIM_SEED").parse().expect("a number");
    let acked = run_seed(seed).unwrap_or_else(|e| panic!("{e}"));
    println!("seed {seed}: {acked} records acknowledged");
}
