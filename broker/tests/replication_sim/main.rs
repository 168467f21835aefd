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

// After the macro, which they use.
mod checks;
mod faults;
mod flow;

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
