//! A failure that repeats while its cause lasts (a full disk under the checkpoints, retried every
//! second): told once when it begins and once when it ends, with how often it was met, not each time.

use std::time::{Duration, Instant};

/// One repeated operation's failures, as an episode.
#[derive(Debug, Default)]
pub struct Episode {
    /// When the current episode began, and the failures in it so far.
    began: Option<(Instant, u64)>,
}

impl Episode {
    /// The operation failed at `now`: whether this begins an episode (and should be told).
    pub fn failed(&mut self, now: Instant) -> bool {
        match &mut self.began {
            Some((_, failures)) => {
                *failures += 1;
                false
            }
            None => {
                self.began = Some((now, 1));
                true
            }
        }
    }

    /// The operation succeeded at `now`: when this ends an episode, its failures and how long it lasted.
    pub fn succeeded(&mut self, now: Instant) -> Option<(u64, Duration)> {
        self.began.take().map(|(began, failures)| (failures, now.duration_since(began)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_episode_is_told_when_it_begins_and_when_it_ends() {
        let mut e = Episode::default();
        let t0 = Instant::now();
        assert_eq!(e.succeeded(t0), None, "no episode, nothing to tell");
        assert!(e.failed(t0));
        for s in 1..5 {
            assert!(!e.failed(t0 + Duration::from_secs(s)), "failure {s} of the same episode");
        }
        assert_eq!(e.succeeded(t0 + Duration::from_secs(6)), Some((5, Duration::from_secs(6))));
        assert_eq!(e.succeeded(t0 + Duration::from_secs(7)), None);
        assert!(e.failed(t0 + Duration::from_secs(8)), "a new episode");
    }
}
