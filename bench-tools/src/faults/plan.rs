//! The nemesis's schedule: which faults hit which brokers when, drawn from a seed so that a campaign can be
//! replayed exactly. It does no I/O; the campaign carries the plan out.
//!
//! Faults never leave more brokers faulty at once than the topic promises to survive (`tolerance`: with
//! RF=3 and `min.insync.replicas=2`, one), unless the campaign goes beyond on purpose; then up to all but
//! one broker may be faulty together.

use std::collections::BTreeSet;
use std::time::Duration;

use shardlog_storage::fs::sim::SimRng;

/// What the nemesis does to a broker (or, for a split, to a group of brokers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// SIGKILL, then a restart when the fault heals.
    Kill,
    /// SIGKILL, the active segment cut or torn at a random byte, then a restart.
    KillAndTear,
    /// SIGSTOP, SIGCONT when the fault heals: long enough to outlast `replica.lag.time.max.ms` and the
    /// broker's session.
    Pause,
    /// Cut off from every other broker and from clients.
    Isolate,
    /// The brokers split in two groups that cannot reach each other; the faulty group is the minority.
    Split,
    /// The broker's packets to the others are dropped, theirs to it still arrive.
    OneWayDrop,
    /// Its packets are delayed: its link is made slow, so they queue.
    Latency,
    /// A share of its packets is lost.
    PacketLoss,
    /// Its data directory fills up, then gets space back.
    DiskFull,
}

impl FaultKind {
    pub const ALL: [FaultKind; 9] = [
        FaultKind::Kill,
        FaultKind::KillAndTear,
        FaultKind::Pause,
        FaultKind::Isolate,
        FaultKind::Split,
        FaultKind::OneWayDrop,
        FaultKind::Latency,
        FaultKind::PacketLoss,
        FaultKind::DiskFull,
    ];

    /// Faults that need the brokers' network in namespaces the campaign controls.
    pub fn needs_network(self) -> bool {
        matches!(
            self,
            FaultKind::Isolate | FaultKind::Split | FaultKind::OneWayDrop | FaultKind::Latency | FaultKind::PacketLoss
        )
    }

    /// Its name on the command line (`--kinds`).
    pub fn flag(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::KillAndTear => "tear",
            FaultKind::Pause => "pause",
            FaultKind::Isolate => "isolate",
            FaultKind::Split => "split",
            FaultKind::OneWayDrop => "one-way-drop",
            FaultKind::Latency => "slow-link",
            FaultKind::PacketLoss => "packet-loss",
            FaultKind::DiskFull => "disk-full",
        }
    }

    /// The kind named `flag` on the command line.
    pub fn from_flag(flag: &str) -> Result<FaultKind, String> {
        FaultKind::ALL.into_iter().find(|k| k.flag() == flag).ok_or_else(|| {
            let all: Vec<&str> = FaultKind::ALL.iter().map(|k| k.flag()).collect();
            format!("unknown fault kind {flag:?}: one of {}", all.join(", "))
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::KillAndTear => "kill and tear the active segment",
            FaultKind::Pause => "pause",
            FaultKind::Isolate => "isolate",
            FaultKind::Split => "split minority from majority",
            FaultKind::OneWayDrop => "one-way drop",
            FaultKind::Latency => "slow link (latency)",
            FaultKind::PacketLoss => "packet loss",
            FaultKind::DiskFull => "disk full",
        }
    }
}

/// One fault of the plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    pub kind: FaultKind,
    /// The brokers it hits (ids from 1); for a split, the minority side.
    pub brokers: BTreeSet<u32>,
    /// From the campaign's start.
    pub start: Duration,
    /// How long it lasts before it heals.
    pub lasts: Duration,
}

impl Fault {
    pub fn end(&self) -> Duration {
        self.start + self.lasts
    }
}

/// What the plan is drawn for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanSpec {
    pub seed: u64,
    /// Brokers in the cluster, ids 1..=brokers.
    pub brokers: u32,
    pub faults: usize,
    /// The kinds this machine can do.
    pub kinds: Vec<FaultKind>,
    /// Brokers that may be faulty at once without breaking the topic's promise.
    pub tolerance: u32,
    /// Go past `tolerance` on purpose (up to all brokers but one).
    pub beyond: bool,
    /// The shortest and longest fault.
    pub shortest: Duration,
    pub longest: Duration,
    /// The shortest pause: longer than the broker session and `replica.lag.time.max.ms`, so that a
    /// paused broker is fenced and dropped from the ISR before it wakes up.
    pub shortest_pause: Duration,
    /// The longest quiet time between one fault's start and the next's.
    pub gap: Duration,
}

/// The schedule's seeded generator: the storage simulator's SplitMix64 (the same on every machine, which
/// is all a replayable schedule needs), with the draws a schedule makes.
#[derive(Debug, Clone)]
pub struct Rng(SimRng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(SimRng::new(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in `low..=high`.
    pub fn between(&mut self, low: u64, high: u64) -> u64 {
        low + self.0.up_to(high - low)
    }

    fn duration(&mut self, low: Duration, high: Duration) -> Duration {
        Duration::from_millis(self.between(low.as_millis() as u64, high.as_millis().max(low.as_millis()) as u64))
    }
}

/// Draws the plan. Every kind of `spec.kinds` comes at least once when there are faults enough; faults
/// are kept to `spec.tolerance` faulty brokers at once (or all but one with `beyond`), a later fault
/// waiting for earlier ones to heal.
pub fn plan(spec: &PlanSpec) -> Vec<Fault> {
    assert!(spec.brokers >= 1 && !spec.kinds.is_empty(), "a plan needs brokers and fault kinds");
    let mut rng = Rng::new(spec.seed);
    let limit = if spec.beyond { spec.brokers.saturating_sub(1).max(1) } else { spec.tolerance.max(1) };
    // Each kind once, in a seeded order, then kinds drawn at random.
    let mut kinds = spec.kinds.clone();
    for i in (1..kinds.len()).rev() {
        kinds.swap(i, rng.between(0, i as u64) as usize);
    }
    while kinds.len() < spec.faults {
        kinds.push(spec.kinds[rng.between(0, spec.kinds.len() as u64 - 1) as usize]);
    }
    kinds.truncate(spec.faults);

    let mut faults: Vec<Fault> = Vec::with_capacity(kinds.len());
    let mut at = Duration::ZERO;
    for kind in kinds {
        at += rng.duration(Duration::ZERO, spec.gap);
        let size = match kind {
            // A split's minority: at most half the brokers, and within the limit.
            FaultKind::Split => rng.between(1, u64::from(limit.min(spec.brokers / 2).max(1))) as u32,
            _ => 1,
        };
        // Wait until enough brokers are healthy, then pick among them.
        let start = loop {
            let busy = faulty_at(&faults, at);
            if busy.len() as u32 + size <= limit {
                break at;
            }
            at = faults.iter().map(Fault::end).filter(|&end| end > at).min().expect("a fault that heals");
        };
        let busy = faulty_at(&faults, start);
        let mut healthy: Vec<u32> = (1..=spec.brokers).filter(|b| !busy.contains(b)).collect();
        let mut brokers = BTreeSet::new();
        while (brokers.len() as u32) < size && !healthy.is_empty() {
            brokers.insert(healthy.swap_remove(rng.between(0, healthy.len() as u64 - 1) as usize));
        }
        let lasts = match kind {
            FaultKind::Pause => rng.duration(spec.shortest_pause, spec.longest.max(spec.shortest_pause)),
            _ => rng.duration(spec.shortest, spec.longest),
        };
        faults.push(Fault { kind, brokers, start, lasts });
    }
    faults
}

/// The brokers some fault of `faults` holds at `at`.
pub fn faulty_at(faults: &[Fault], at: Duration) -> BTreeSet<u32> {
    faults.iter().filter(|f| f.start <= at && at < f.end()).flat_map(|f| f.brokers.iter().copied()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(seed: u64, faults: usize) -> PlanSpec {
        PlanSpec {
            seed,
            brokers: 3,
            faults,
            kinds: FaultKind::ALL.to_vec(),
            tolerance: 1,
            beyond: false,
            shortest: Duration::from_secs(1),
            longest: Duration::from_secs(8),
            shortest_pause: Duration::from_secs(4),
            gap: Duration::from_secs(3),
        }
    }

    /// The largest number of brokers faulty at once over the plan (it can only grow at a fault's start).
    fn most_faulty(faults: &[Fault]) -> usize {
        faults.iter().map(|f| faulty_at(faults, f.start).len()).max().unwrap_or(0)
    }

    #[test]
    fn the_same_seed_gives_the_same_plan_and_another_seed_another() {
        assert_eq!(plan(&spec(7, 40)), plan(&spec(7, 40)));
        assert_ne!(plan(&spec(7, 40)), plan(&spec(8, 40)));
    }

    #[test]
    fn every_kind_comes_and_faults_stay_within_the_tolerance() {
        for seed in 0..200 {
            let faults = plan(&spec(seed, 30));
            assert_eq!(faults.len(), 30);
            let kinds: BTreeSet<FaultKind> = faults.iter().map(|f| f.kind).collect();
            assert_eq!(kinds.len(), FaultKind::ALL.len(), "seed {seed}: every kind at least once");
            assert_eq!(most_faulty(&faults), 1, "seed {seed}: one broker faulty at a time");
            for f in &faults {
                assert!(!f.brokers.is_empty() && f.brokers.iter().all(|b| (1..=3).contains(b)), "seed {seed}: {f:?}");
                assert!(f.lasts >= Duration::from_secs(1) && f.lasts <= Duration::from_secs(8));
                if f.kind == FaultKind::Pause {
                    assert!(f.lasts >= Duration::from_secs(4), "seed {seed}: a pause outlasts the session: {f:?}");
                }
            }
            assert!(faults.windows(2).all(|w| w[0].start <= w[1].start), "seed {seed}: in start order");
        }
    }

    #[test]
    fn beyond_lets_faults_overlap_up_to_all_brokers_but_one() {
        let mut overlapped = false;
        for seed in 0..200 {
            let faults = plan(&PlanSpec { beyond: true, gap: Duration::from_millis(500), ..spec(seed, 30) });
            let most = most_faulty(&faults);
            assert!(most <= 2, "seed {seed}: never all three brokers at once");
            overlapped |= most == 2;
        }
        assert!(overlapped, "some plan has two brokers faulty together");
    }

    #[test]
    fn a_wider_tolerance_splits_off_larger_minorities() {
        let five = PlanSpec { brokers: 5, tolerance: 2, kinds: vec![FaultKind::Split], ..spec(3, 50) };
        let sizes: BTreeSet<usize> = plan(&five).iter().map(|f| f.brokers.len()).collect();
        assert_eq!(sizes, BTreeSet::from([1, 2]));
        assert!(plan(&five).iter().all(|f| f.brokers.len() <= 2));
    }

    #[test]
    fn every_kind_is_named_on_the_command_line_by_its_own_flag() {
        for kind in FaultKind::ALL {
            assert_eq!(FaultKind::from_flag(kind.flag()), Ok(kind));
        }
        assert!(FaultKind::from_flag("meteor").unwrap_err().contains("one of kill, tear, pause"));
    }

    #[test]
    fn a_machine_without_network_faults_gets_none() {
        let kinds: Vec<FaultKind> = FaultKind::ALL.into_iter().filter(|k| !k.needs_network()).collect();
        let faults = plan(&PlanSpec { kinds, ..spec(11, 30) });
        assert!(faults.iter().all(|f| !f.kind.needs_network()));
        assert_eq!(faults.iter().map(|f| f.kind).collect::<BTreeSet<_>>().len(), 4);
    }
}
