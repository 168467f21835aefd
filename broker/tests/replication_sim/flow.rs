//! The simulation's steps: brokers' ticks, the controller, produce, and message delivery.

use super::*;

impl Sim {
    pub(super) fn new(seed: u64) -> Sim {
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

    pub(super) fn record(&self) -> &PartitionRecord {
        &self.quorum.topics[TOPIC].partitions[0]
    }

    pub(super) fn register(&mut self, b: usize, previous: Option<u64>) {
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
    pub(super) fn heartbeat(&mut self, b: usize) {
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

    pub(super) fn send(&mut self, msg: Msg) {
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

    pub(super) fn run(&mut self, seed: u64) -> Result<(), String> {
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

    pub(super) fn step(&mut self) -> Result<(), String> {
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

    /// The quorum's controller fences brokers whose heartbeats stopped.
    pub(super) fn controller(&mut self) {
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

    pub(super) fn broker_tick(&mut self, b: usize) -> Result<(), String> {
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

    pub(super) fn produce(&mut self, b: usize) {
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
    pub(super) fn after_change(&mut self, b: usize) {
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

    pub(super) fn deliver(&mut self) -> Result<(), String> {
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

    pub(super) fn receive(&mut self, msg: Msg) -> Result<(), String> {
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
}
