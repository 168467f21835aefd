//! When the quorum's leader may fence brokers whose sessions expired: the rule the voter's fencing loop
//! ([`super::service`]) follows, without I/O, so it is tested with made-up instants.
//!
//! A broker's session is judged by the leader's clock, and the leader holds against a broker only
//! silence it observed itself, running as leader:
//! - a voter that has just become leader waits one session timeout first: what it applied may not yet
//!   hold the latest heartbeats, and every broker gets a full session to reach it;
//! - a gap in its own timer (its process was paused by SIGSTOP, a VM stall or a swap storm) starts that
//!   wait over. No broker could reach it during the gap, so the gap is not held against them (Kafka's
//!   controller likewise fences brokers only for time it observed). The wait it starts over also gives
//!   a leader that was deposed while it slept the time to find out;
//! - and before it fences anyone, the loop confirms with a majority that it still leads (a leader that
//!   slept may have been deposed and not know it yet), which this module leaves to the adapter.

use std::time::{Duration, Instant};

/// The fencing loop's clock: how often it looks, and whether it may fence now.
#[derive(Debug, Clone)]
pub struct FencingWatch {
    session: Duration,
    period: Duration,
    /// Since when this voter has led without a gap in its timer; `None` while it does not lead.
    observing_since: Option<Instant>,
}

impl FencingWatch {
    /// A watch for `broker.session.timeout.ms` = `session`.
    pub fn new(session: Duration) -> FencingWatch {
        let period = (session / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        FencingWatch { session, period, observing_since: None }
    }

    /// How long the loop sleeps between looks.
    pub fn period(&self) -> Duration {
        self.period
    }

    /// How much longer than [`FencingWatch::period`] a sleep may last before it counts as a gap in this
    /// voter's timer: a quarter of a session (brokers heartbeat several times a session, so a gap this
    /// long costs them a heartbeat or more), and never less than a period, so a busy machine's late
    /// timers do not keep postponing every fencing.
    pub fn gap_allowance(&self) -> Duration {
        (self.session / 4).max(self.period)
    }

    /// After a sleep that began at `slept_at` and ended at `woke`, with `leading` saying whether this
    /// voter leads as far as it knows: whether it may fence brokers now. It may once it has led for a
    /// whole session without a gap in its timer.
    pub fn may_fence(&mut self, slept_at: Instant, woke: Instant, leading: bool) -> bool {
        if !leading {
            self.observing_since = None;
            return false;
        }
        let overslept = woke.saturating_duration_since(slept_at).saturating_sub(self.period);
        if overslept > self.gap_allowance() {
            // Nobody could reach this voter while its timer did not run: observe a whole session anew.
            self.observing_since = Some(woke);
            return false;
        }
        let since = *self.observing_since.get_or_insert(woke);
        woke.saturating_duration_since(since) >= self.session
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SESSION: Duration = Duration::from_secs(9);

    /// Ticks the watch every period from `start` for `ticks` ticks; returns the instant after the last one
    /// and whether the last tick allowed fencing.
    fn run(watch: &mut FencingWatch, start: Instant, ticks: u32, leading: bool) -> (Instant, bool) {
        let mut now = start;
        let mut may = false;
        for _ in 0..ticks {
            let woke = now + watch.period();
            may = watch.may_fence(now, woke, leading);
            now = woke;
        }
        (now, may)
    }

    #[test]
    fn a_new_leader_fences_only_after_leading_for_a_whole_session() {
        let mut watch = FencingWatch::new(SESSION);
        assert_eq!(watch.period(), Duration::from_secs(1));
        let t0 = Instant::now();
        // Leading is first seen at the first tick; 9 ticks later it has led for 8 s.
        let (t, may) = run(&mut watch, t0, 9, true);
        assert!(!may, "8 s of leading is less than the 9 s session");
        let (_, may) = run(&mut watch, t, 1, true);
        assert!(may, "a whole session observed as leader");
    }

    #[test]
    fn a_leader_whose_timer_stopped_observes_a_whole_session_again_before_it_fences() {
        let mut watch = FencingWatch::new(SESSION);
        let t0 = Instant::now();
        let (t, may) = run(&mut watch, t0, 20, true);
        assert!(may, "a leader of 20 s may fence");
        // SIGSTOP for 10 s: the sleep of one period ends 10 s late.
        let woke = t + watch.period() + Duration::from_secs(10);
        assert!(!watch.may_fence(t, woke, true), "no fencing for time the leader did not observe");
        let (t, may) = run(&mut watch, woke, 8, true);
        assert!(!may, "8 s observed since waking");
        let (_, may) = run(&mut watch, t, 1, true);
        assert!(may, "a whole session observed since waking");
    }

    #[test]
    fn a_late_timer_within_the_allowance_is_not_a_gap() {
        let mut watch = FencingWatch::new(SESSION);
        let t0 = Instant::now();
        let (t, _) = run(&mut watch, t0, 20, true);
        let woke = t + watch.period() + watch.gap_allowance();
        assert!(watch.may_fence(t, woke, true), "late by the allowance: still observed");
        let woke2 = woke + watch.period() + watch.gap_allowance() + Duration::from_millis(1);
        assert!(!watch.may_fence(woke, woke2, true), "late by more: a gap");
    }

    #[test]
    fn losing_leadership_starts_the_wait_over() {
        let mut watch = FencingWatch::new(SESSION);
        let t0 = Instant::now();
        let (t, may) = run(&mut watch, t0, 20, true);
        assert!(may);
        let (t, may) = run(&mut watch, t, 1, false);
        assert!(!may, "a follower never fences");
        let (t, may) = run(&mut watch, t, 9, true);
        assert!(!may, "leading again for 8 s");
        assert!(run(&mut watch, t, 1, true).1);
    }

    #[test]
    fn short_sessions_tick_often_and_allow_at_least_a_period_of_lateness() {
        let watch = FencingWatch::new(Duration::from_millis(100));
        assert_eq!(watch.period(), Duration::from_millis(50));
        assert_eq!(watch.gap_allowance(), Duration::from_millis(50));
        let watch = FencingWatch::new(Duration::from_secs(60));
        assert_eq!(watch.period(), Duration::from_secs(1));
        assert_eq!(watch.gap_allowance(), Duration::from_secs(15));
    }
}
