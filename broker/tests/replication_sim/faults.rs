//! The nemesis: crashes, restarts, pauses and partitions.

use super::*;

impl Sim {
    pub(super) fn nemesis(&mut self) {
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
    pub(super) fn crash(&mut self, b: usize) {
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

    pub(super) fn restart(&mut self, b: usize) {
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

    pub(super) fn forget_agreement(&mut self, b: usize) {
        let len = self.brokers[b].log.records.len();
        for ((x, y), upto) in self.agree.iter_mut() {
            if *x == b || *y == b {
                *upto = (*upto).min(len);
            }
        }
    }
}
