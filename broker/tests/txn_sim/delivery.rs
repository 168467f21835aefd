//! Deliveries to the data partitions' leaders, and their acknowledgements: the coordinator's markers, and
//! producers' batches between their verification and their append (KIP-890's race).

use shardlog_broker::txn::{ProducerIdAndEpoch, TxnMarkers, TxnResult};
use shardlog_storage::TopicPartition;
use shardlog_storage::producer_state::{ProducerError, VerificationGuard};
use shardlog_storage::txn::{MarkerKind, TxnMarker};

use crate::partitions::{DataAnswer, MarkerAnswer, RunId};
use crate::{Phase, Sim};

/// A producer's transactional batch on its way: verified, then appended some time later (KIP-890's
/// race), then acknowledged once replicated.
#[derive(Debug)]
pub struct DataWrite {
    pub producer: usize,
    pub partition: TopicPartition,
    pub me: ProducerIdAndEpoch,
    pub seq: i32,
    pub run: RunId,
    pub stage: WriteStage,
    /// When its producer sent it, in ms of the simulated clock.
    pub sent_ms: i64,
    /// Its producer timed out and no longer waits for it; it may still be appended.
    pub abandoned: bool,
}

#[derive(Debug)]
pub enum WriteStage {
    /// Verified (with the guard the leader handed out, or none when its transaction was open there),
    /// reaching the leader at `due` if it still leads at `leader_epoch`.
    Appending { due: i64, leader_epoch: u32, guard: Option<VerificationGuard> },
    /// In the leader's log at `offset`, waiting for the HW.
    Acking { offset: u64, leader_epoch: u32 },
}

/// Markers on their way to the leaders.
pub struct MarkerJob {
    pub markers: TxnMarkers,
    pub run: RunId,
    /// Those not yet acknowledged.
    pub deliveries: Vec<Delivery>,
}

pub enum Delivery {
    /// To be sent to the partition's leader at this time.
    Due(i64, TopicPartition),
    /// In the leader's log at `offset`, waiting for the HW; sent again if the leader changes first.
    Acking { partition: TopicPartition, offset: u64, leader_epoch: u32 },
}

impl Sim {
    /// Markers reach the leaders, are acknowledged once below the HW, and are sent again to the new leader
    /// when the one that took them lost its leadership first (as the coordinator retries
    /// NOT_LEADER_OR_FOLLOWER). A marker refused as stale (its producer epoch or coordinator epoch was
    /// passed) is given up on, as the coordinator does.
    pub(crate) fn deliver_markers(&mut self) -> Result<(), String> {
        let now = self.now;
        let mut finished = Vec::new();
        for (j, job) in self.jobs.iter_mut().enumerate() {
            let m = &job.markers;
            let marker = TxnMarker {
                kind: match m.result {
                    TxnResult::Commit => MarkerKind::Commit,
                    TxnResult::Abort => MarkerKind::Abort,
                },
                producer_id: m.producer_id,
                producer_epoch: m.producer_epoch,
                coordinator_epoch: m.coordinator_epoch,
            };
            let mut left = Vec::new();
            for delivery in job.deliveries.drain(..) {
                match delivery {
                    Delivery::Due(due, partition) if due <= now => {
                        let p = self.partitions.get_mut(&partition).expect("partition");
                        let answer =
                            p.append_marker(&marker, job.run, now).map_err(|e| format!("{partition:?}: {e}"))?;
                        trace!("marker of run {} at {partition:?}: {answer:?}", job.run);
                        match answer {
                            MarkerAnswer::Appended { offset, .. } => {
                                let leader_epoch = p.leader_epoch;
                                left.push(Delivery::Acking { partition, offset, leader_epoch });
                            }
                            MarkerAnswer::Refused(
                                ProducerError::StaleMarkerEpoch { .. } | ProducerError::CoordinatorFenced { .. },
                            ) => {}
                            MarkerAnswer::Refused(e) => return Err(format!("marker refused at {partition:?}: {e}")),
                        }
                    }
                    Delivery::Acking { partition, offset, leader_epoch } => {
                        match self.partitions[&partition].acknowledged(offset, leader_epoch) {
                            Some(true) => {}
                            Some(false) => left.push(Delivery::Acking { partition, offset, leader_epoch }),
                            None => {
                                trace!("marker of run {} at {partition:?}: leader changed, sent again", job.run);
                                left.push(Delivery::Due(now + self.rng.range(1, 100), partition));
                            }
                        }
                    }
                    due => left.push(due),
                }
            }
            job.deliveries = left;
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

    /// Producers' batches reach their leaders, and acknowledgements their producers. A batch refused
    /// retriably (NOT_LEADER_OR_FOLLOWER, or its guard gone) is sent again, verified afresh, by a producer
    /// still waiting for it.
    pub(crate) fn deliver_data(&mut self) -> Result<(), String> {
        let now = self.now;
        let mut i = 0;
        while i < self.data.len() {
            let w = &self.data[i];
            let p = self.partitions.get_mut(&w.partition).expect("partition");
            let (pid, epoch) = (w.me.producer_id, w.me.epoch);
            // Some(true): acknowledged; Some(false): refused; None: still on its way.
            let done = match w.stage {
                WriteStage::Appending { due, .. } if due > now => None,
                WriteStage::Appending { leader_epoch, .. } if leader_epoch != p.leader_epoch => Some(false),
                WriteStage::Appending { guard, .. } => {
                    let answer = p
                        .append_data(pid, epoch, w.seq, w.run, guard, now)
                        .map_err(|e| format!("{:?}: {e}", w.partition))?;
                    trace!("producer {} batch {} of run {} at {:?}: {answer:?}", w.producer, w.seq, w.run, w.partition);
                    let leader_epoch = p.leader_epoch;
                    match answer {
                        DataAnswer::Appended(offset) | DataAnswer::Duplicate(offset) => {
                            self.data[i].stage = WriteStage::Acking { offset, leader_epoch };
                            None
                        }
                        DataAnswer::Refused(ProducerError::Unverified { .. }) => {
                            self.unverified += 1;
                            Some(false)
                        }
                        DataAnswer::Refused(ProducerError::StaleEpoch { .. }) => {
                            let w = &self.data[i];
                            if !w.abandoned && self.producers[w.producer].me == Some(w.me) {
                                self.producers[w.producer].phase = Phase::NeedInit;
                            }
                            Some(false)
                        }
                        DataAnswer::Refused(e) => {
                            return Err(format!("batch refused at {:?}: {e}", self.data[i].partition));
                        }
                    }
                }
                WriteStage::Acking { offset, leader_epoch } => match p.acknowledged(offset, leader_epoch) {
                    Some(true) => Some(true),
                    Some(false) => None,
                    None => Some(false),
                },
            };
            let Some(acked) = done else {
                i += 1;
                continue;
            };
            let w = self.data.remove(i);
            if w.abandoned {
                continue;
            }
            let producer = &mut self.producers[w.producer];
            producer.writing = false;
            if !acked {
                continue;
            }
            *self.seqs.entry((pid, epoch, w.partition.clone())).or_default() += 1;
            if let Phase::Producing(mut left) = producer.phase.clone() {
                left.retain(|p| *p != w.partition);
                producer.phase = if left.is_empty() {
                    Phase::Ending(if self.rng.permille(700) { TxnResult::Commit } else { TxnResult::Abort })
                } else {
                    Phase::Producing(left)
                };
            }
        }
        Ok(())
    }
}
