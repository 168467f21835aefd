//! What must hold after every step, and once the faults heal.

use super::*;

impl Sim {
    /// A truncating ISR member must keep every acknowledged record.
    pub(super) fn check_truncation(&self, b: usize, to: usize) -> Result<(), String> {
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
    pub(super) fn check_isr_members(&self) -> Result<(), String> {
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

    pub(super) fn check(&mut self) -> Result<(), String> {
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
    pub(super) fn check_isr_members_cheap(&self) -> Result<(), String> {
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

    pub(super) fn check_healed(&self) -> Result<(), String> {
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
