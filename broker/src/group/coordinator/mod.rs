//! The group coordinator of one shard: the adapter between the group state machines (the classic
//! protocol's, [`super::classic`], and the consumer protocol's of KIP-848, [`super::consumer`]) and the
//! shard's `__consumer_offsets` partitions. A group id is of one protocol at a time: a consumer-protocol
//! heartbeat takes over a classic group only while it has no members, and a JoinGroup an empty
//! consumer-protocol group.
//!
//! The coordinator of a group is the leader of the group's offsets partition, on the shard that owns
//! that partition. When this shard's broker becomes leader of one (seen on the coordinator's timer, or
//! on the first request for it), the partition's log is read from its start to the log end it had then,
//! and the groups and committed offsets are rebuilt; meanwhile requests are answered
//! COORDINATOR_LOAD_IN_PROGRESS. When leadership moves away, the groups are dropped and waiting
//! answers get NOT_COORDINATOR.
//!
//! Every change is written to the partition as an acks=all produce through the shard's own partition
//! channel, and answered only once that write is acknowledged: durable here, and past the high
//! watermark when the topic is replicated. Writes are sent without an await between deciding a change
//! and sending its record, so records land in the order the changes were made.
//!
//! State lives in `RefCell`s on the shard's thread; no borrow is held across an await.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_lite::future;
use kafka_protocol::ResponseError;
use shardlog_storage::{Clock, LeaderEpoch, SystemClock, TopicPartition};

mod answers;
mod consumer;
mod offsets;
mod state;
mod writes;

use answers::{coordinator_error, describe, describe_consumer, fetch_offsets, refuse};
use consumer::consumer_records;
use state::{Entry, Replay, encode_batch};
use writes::Writes;

use super::OFFSETS_TOPIC;
use super::call::{CoordinatorRequest, GroupCall, GroupListing, GroupOp};
use super::classic::{Effects, GroupSettings, GroupState, JoinAnswer, Reply, SyncAnswer, Ticket};
use super::consumer::ConsumerGroupSettings;
use super::records::OffsetsRecord;
use crate::context::{BrokerContext, ask_shard};
use crate::shard::{FetchRead, OffsetSpec, PartitionRequest, ProduceBatch};

/// How often groups are checked for expired sessions and rebalance timeouts, and leadership of the
/// offsets partitions for changes.
const TICK: Duration = Duration::from_millis(100);
/// A gauge per group and partition: the offset committed.
const COMMITTED_OFFSET: &str = "shardlog_consumer_group_committed_offset";
/// How much of the log one read takes while loading.
const LOAD_READ_BYTES: usize = 1 << 20;
/// How long a load waits before reading again when the high watermark has not reached the end yet.
const LOAD_RETRY: Duration = Duration::from_millis(20);

enum Slot {
    Loading(LeaderEpoch),
    Loaded { epoch: LeaderEpoch, groups: HashMap<String, Entry> },
}

enum Waiter {
    Join(flume::Sender<JoinAnswer>),
    Sync(flume::Sender<SyncAnswer>),
}

/// One shard's coordinator.
struct Coordinator {
    ctx: Arc<BrokerContext>,
    shard: usize,
    settings: GroupSettings,
    consumer_settings: ConsumerGroupSettings,
    partitions: RefCell<HashMap<i32, Slot>>,
    waiters: RefCell<HashMap<Ticket, Waiter>>,
    next_ticket: Cell<Ticket>,
    /// The writes in flight, which answers without records of their own wait for.
    writes: Rc<Writes>,
    /// When offsets were last checked for expiry (wall ms), and whether a check is under way.
    last_expiry: Cell<u64>,
    expiring: Cell<bool>,
}

fn now_ms() -> u64 {
    SystemClock.now_ms().max(0) as u64
}

/// Runs the shard's coordinator until the broker stops.
pub async fn run(ctx: Arc<BrokerContext>, shard: usize, requests: flume::Receiver<CoordinatorRequest>) {
    metrics::describe_gauge!(COMMITTED_OFFSET, "the offset a consumer group committed for a partition (coordinator)");
    let me = Rc::new(Coordinator {
        settings: ctx.config.groups.settings,
        consumer_settings: ctx.config.groups.consumer,
        ctx,
        shard,
        partitions: RefCell::new(HashMap::new()),
        waiters: RefCell::new(HashMap::new()),
        next_ticket: Cell::new(1),
        writes: Rc::default(),
        last_expiry: Cell::new(now_ms()),
        expiring: Cell::new(false),
    });
    let ticker = me.clone();
    glommio::spawn_local(async move {
        let mut last_sample = std::time::Instant::now();
        while !ticker.ctx.shutdown.is_triggered() {
            glommio::timer::sleep(TICK).await;
            ticker.clone().tick().await;
            if last_sample.elapsed() >= crate::metrics::SAMPLE_INTERVAL {
                last_sample = std::time::Instant::now();
                ticker.sample_committed_offsets();
            }
        }
    })
    .detach();
    loop {
        let next = future::or(async { requests.recv_async().await.ok() }, async {
            me.ctx.shutdown.wait().await;
            None
        })
        .await;
        let Some(request) = next else { return };
        // Handled as tasks of their own: a JoinGroup waits for the rebalance, others must not wait behind it.
        glommio::spawn_local(me.clone().handle(request)).detach();
    }
}

impl Coordinator {
    async fn handle(self: Rc<Self>, request: CoordinatorRequest) {
        match request {
            CoordinatorRequest::List { reply } => {
                let _ = reply.send(self.list());
            }
            CoordinatorRequest::Group(call) => self.handle_group(call).await,
        }
    }

    /// Sets the committed offset gauge of every group this shard coordinates (a group's lag is a
    /// partition's high watermark less it: see `deploy/README.md`).
    fn sample_committed_offsets(&self) {
        for slot in self.partitions.borrow().values() {
            let Slot::Loaded { groups, .. } = slot else { continue };
            for (id, entry) in groups {
                for ((topic, partition), stored) in &entry.offsets {
                    let labels =
                        [("group", id.clone()), ("topic", topic.clone()), ("partition", partition.to_string())];
                    metrics::gauge!(COMMITTED_OFFSET, &labels).set(stored.value.offset as f64);
                }
            }
        }
    }

    fn list(&self) -> Result<Vec<GroupListing>, ResponseError> {
        let partitions = self.partitions.borrow();
        let mut out = Vec::new();
        for slot in partitions.values() {
            match slot {
                Slot::Loading(_) => return Err(ResponseError::CoordinatorLoadInProgress),
                Slot::Loaded { groups, .. } => out.extend(groups.iter().map(|(id, e)| match &e.consumer {
                    Some(consumer) => GroupListing {
                        group: id.clone(),
                        protocol_type: "consumer".to_string(),
                        state: consumer.state().name(),
                        group_type: "consumer",
                    },
                    None => GroupListing {
                        group: id.clone(),
                        protocol_type: e.group.protocol_type.clone().unwrap_or_default(),
                        state: e.group.state.name(),
                        group_type: "classic",
                    },
                })),
            }
        }
        Ok(out)
    }

    /// Whether the partition is loaded at `epoch`; starts loading it when this is the first word of a
    /// newer leadership.
    fn ready(self: &Rc<Self>, partition: i32, epoch: LeaderEpoch) -> Result<(), ResponseError> {
        let current = match self.partitions.borrow().get(&partition) {
            Some(Slot::Loaded { epoch: e, .. }) => Some((*e, true)),
            Some(Slot::Loading(e)) => Some((*e, false)),
            None => None,
        };
        match current {
            Some((e, true)) if e == epoch => Ok(()),
            Some((e, false)) if e == epoch => Err(ResponseError::CoordinatorLoadInProgress),
            // The handler saw an older leadership than the one loaded: it is no longer the coordinator.
            Some((e, _)) if e > epoch => Err(ResponseError::NotCoordinator),
            _ => {
                self.start_load(partition, epoch);
                Err(ResponseError::CoordinatorLoadInProgress)
            }
        }
    }

    fn start_load(self: &Rc<Self>, partition: i32, epoch: LeaderEpoch) {
        let old = self.partitions.borrow_mut().insert(partition, Slot::Loading(epoch));
        if let Some(Slot::Loaded { groups, .. }) = old {
            self.abandon(partition, groups);
        }
        let me = self.clone();
        glommio::spawn_local(async move {
            let loaded = me.read_partition(partition, epoch).await;
            let mut partitions = me.partitions.borrow_mut();
            if !matches!(partitions.get(&partition), Some(Slot::Loading(e)) if *e == epoch) {
                return;
            }
            match loaded {
                Ok(groups) => {
                    if groups.is_empty() {
                        tracing::debug!(partition, %epoch, "no consumer groups to load");
                    } else {
                        tracing::info!(partition, %epoch, groups = groups.len(), "loaded consumer groups");
                    }
                    partitions.insert(partition, Slot::Loaded { epoch, groups });
                }
                Err(reason) => {
                    // Tried again on the next tick while this broker still leads it.
                    tracing::debug!(partition, %epoch, %reason, "consumer groups not loaded");
                    partitions.remove(&partition);
                }
            }
        })
        .detach();
    }

    /// Answers every waiting request of groups this shard no longer coordinates, and refuses answers
    /// still waiting for the partition's writes.
    fn abandon(&self, partition: i32, groups: HashMap<String, Entry>) {
        self.writes.dropped(partition);
        for (_, mut entry) in groups {
            self.deliver(entry.group.abandon(ResponseError::NotCoordinator), None);
        }
    }

    /// Rebuilds the groups of a partition from its log, from the start to the log end it has now.
    async fn read_partition(&self, partition: i32, epoch: LeaderEpoch) -> Result<HashMap<String, Entry>, String> {
        let tp = TopicPartition::new(OFFSETS_TOPIC.to_string(), partition as u32);
        let list = |spec| {
            let tp = tp.clone();
            ask_shard(&self.ctx, self.shard, move |reply| PartitionRequest::ListOffsets { tp, spec, reply })
        };
        let end = list(OffsetSpec::LogEnd).await.ok_or("shard gone")?;
        let start = list(OffsetSpec::Earliest).await.ok_or("shard gone")?;
        if let Some(e) = end.error.or(start.error) {
            return Err(format!("list offsets: {e:?}"));
        }
        let mut replay = Replay::default();
        let mut next = start.offset;
        while next < end.offset {
            if self.ctx.leader_here(OFFSETS_TOPIC, partition).map(|led| led.epoch) != Ok(epoch) {
                return Err("no longer the leader".into());
            }
            let tp = tp.clone();
            let reads = vec![FetchRead { tp, offset: next, max_bytes: LOAD_READ_BYTES, whole_first_batch: true }];
            let read = ask_shard(&self.ctx, self.shard, move |reply| PartitionRequest::Fetch { reads, reply })
                .await
                .and_then(|mut outcomes| outcomes.pop())
                .ok_or("shard gone")?;
            match read.error {
                None if !read.records.is_empty() => next = replay.batches(read.records, next)?,
                // The high watermark has not reached the log end yet (a new leader's followers catch up).
                None | Some(ResponseError::OffsetNotAvailable) => glommio::timer::sleep(LOAD_RETRY).await,
                Some(e) => return Err(format!("read at {next}: {e:?}")),
            }
        }
        Ok(replay.into_groups(self.settings, now_ms()))
    }

    /// The next ticket, with its waiter.
    fn wait_for(&self, waiter: Waiter) -> Ticket {
        let ticket = self.next_ticket.get();
        self.next_ticket.set(ticket + 1);
        self.waiters.borrow_mut().insert(ticket, waiter);
        ticket
    }

    /// Sends answers to their waiters; with `error`, each is replaced by that refusal.
    fn deliver(&self, replies: Vec<Reply>, error: Option<ResponseError>) {
        let mut waiters = self.waiters.borrow_mut();
        for reply in replies {
            match reply {
                Reply::Join(ticket, answer) => {
                    if let Some(Waiter::Join(tx)) = waiters.remove(&ticket) {
                        let answer = match error {
                            Some(e) => JoinAnswer::refused(e, &answer.member_id),
                            None => answer,
                        };
                        let _ = tx.send(answer);
                    }
                }
                Reply::Sync(ticket, answer) => {
                    if let Some(Waiter::Sync(tx)) = waiters.remove(&ticket) {
                        let _ = tx.send(error.map_or(answer, SyncAnswer::refused));
                    }
                }
            }
        }
    }

    /// Runs `f` on the partition's groups, if it is (still) loaded at `epoch`: what was decided under
    /// one leadership never touches the groups rebuilt under the next.
    fn with_groups<R>(
        &self,
        partition: i32,
        epoch: LeaderEpoch,
        f: impl FnOnce(&mut HashMap<String, Entry>) -> R,
    ) -> Option<R> {
        match self.partitions.borrow_mut().get_mut(&partition) {
            Some(Slot::Loaded { epoch: loaded, groups }) if *loaded == epoch => Some(f(groups)),
            _ => None,
        }
    }

    /// Carries out a group's effects: writes its membership record first when asked, then answers, then
    /// tells the group how the write went (which may make it stable, or make its members join again).
    async fn settle(&self, partition: i32, epoch: LeaderEpoch, group: &str, mut effects: Effects) {
        while effects.persist {
            let record = self.with_groups(partition, epoch, |groups| {
                groups.get_mut(group).map(|e| {
                    e.recorded = true;
                    e.group.record()
                })
            });
            let Some(Some(record)) = record else {
                self.deliver(effects.replies, Some(ResponseError::NotCoordinator));
                return;
            };
            let generation = record.generation;
            let write =
                self.write(partition, epoch, &[OffsetsRecord::Group { group: group.to_string(), value: Some(record) }]);
            let next = match write.await {
                Ok(_) => {
                    self.deliver(effects.replies, None);
                    self.with_groups(partition, epoch, |groups| {
                        groups.get_mut(group).map(|e| e.group.record_written(generation, now_ms()))
                    })
                }
                Err(e) => {
                    let error = coordinator_error(e);
                    tracing::debug!(group, ?e, "group record not written");
                    self.deliver(effects.replies, Some(error));
                    self.with_groups(partition, epoch, |groups| {
                        groups.get_mut(group).map(|e| e.group.record_failed(generation, error, now_ms()))
                    })
                }
            };
            effects = next.flatten().unwrap_or_default();
        }
        self.deliver(effects.replies, None);
    }

    /// Appends records to the partition (acks=all) and returns the offset of the first.
    fn write(
        &self,
        partition: i32,
        epoch: LeaderEpoch,
        records: &[OffsetsRecord],
    ) -> impl Future<Output = Result<i64, ResponseError>> + use<> {
        let in_flight = self.writes.start(partition);
        let sent = encode_batch(records).and_then(|batch| {
            let (reply, outcome) = flume::bounded(1);
            let request = PartitionRequest::Produce {
                batches: vec![ProduceBatch {
                    tp: TopicPartition::new(OFFSETS_TOPIC.to_string(), partition as u32),
                    batch,
                    epoch,
                }],
                acks: -1,
                timeout_ms: self.ctx.config.groups.commit_timeout_ms,
                reply,
            };
            // Sent now, not when the future is first polled: records keep the order of the decisions.
            self.ctx.shards[self.shard].send(request).map(|()| outcome).map_err(|_| ResponseError::NotCoordinator)
        });
        async move {
            let _in_flight = in_flight;
            let mut outcomes = sent?.recv_async().await.map_err(|_| ResponseError::NotCoordinator)?;
            let outcome = outcomes.pop().ok_or(ResponseError::NotCoordinator)?;
            match outcome.error {
                None => Ok(outcome.base_offset),
                Some(e) => Err(e),
            }
        }
    }

    async fn handle_group(self: Rc<Self>, call: GroupCall) {
        let GroupCall { partition, epoch, group, op } = call;
        if let Err(error) = self.ready(partition, epoch) {
            refuse(op, error);
            return;
        }
        let now = now_ms();
        let settings = self.settings;
        match op {
            GroupOp::Join { args, reply } => {
                let ticket = self.wait_for(Waiter::Join(reply));
                let effects = self.with_groups(partition, epoch, |groups| {
                    let entry = groups.entry(group.clone()).or_insert_with(|| Entry::new(&group, settings, now));
                    if let Err(error) = self.make_classic(partition, epoch, &group, entry) {
                        let refused = JoinAnswer::refused(error, &args.member_id);
                        return Effects { replies: vec![Reply::Join(ticket, refused)], persist: false };
                    }
                    entry.group.join(args, ticket, now)
                });
                // (`ready` just found the partition loaded at this epoch, with no await since.)
                let effects = effects.unwrap_or_else(|| Effects {
                    replies: vec![Reply::Join(ticket, JoinAnswer::refused(ResponseError::NotCoordinator, ""))],
                    persist: false,
                });
                self.settle(partition, epoch, &group, effects).await;
            }
            GroupOp::Sync { member, generation, protocol_type, protocol_name, assignments, reply } => {
                let ticket = self.wait_for(Waiter::Sync(reply));
                let effects = self.with_groups(partition, epoch, |groups| match groups.get_mut(&group) {
                    Some(entry) => {
                        let protocol = (protocol_type.as_deref(), protocol_name.as_deref());
                        entry.group.sync(&member, generation, protocol, assignments, ticket, now)
                    }
                    None => Effects {
                        replies: vec![Reply::Sync(ticket, SyncAnswer::refused(ResponseError::UnknownMemberId))],
                        persist: false,
                    },
                });
                let effects = effects.unwrap_or_else(|| Effects {
                    replies: vec![Reply::Sync(ticket, SyncAnswer::refused(ResponseError::NotCoordinator))],
                    persist: false,
                });
                self.settle(partition, epoch, &group, effects).await;
            }
            GroupOp::Heartbeat { member, generation, reply } => {
                let error = self.with_groups(partition, epoch, |groups| match groups.get_mut(&group) {
                    Some(entry) => entry.group.heartbeat(&member, generation, now),
                    None => Some(ResponseError::UnknownMemberId),
                });
                let _ = reply.send(error.unwrap_or(Some(ResponseError::NotCoordinator)));
            }
            GroupOp::Leave { members, reply } => {
                let outcome = self.with_groups(partition, epoch, |groups| match groups.get_mut(&group) {
                    Some(entry) if entry.group.state == GroupState::Dead => Err(ResponseError::CoordinatorNotAvailable),
                    Some(entry) => Ok(entry.group.leave(&members, now)),
                    None => Ok((vec![Some(ResponseError::UnknownMemberId); members.len()], Effects::default())),
                });
                let (errors, effects) = match outcome {
                    Some(Ok(outcome)) => outcome,
                    Some(Err(error)) => {
                        let _ = reply.send(Err(error));
                        return;
                    }
                    None => {
                        let _ = reply.send(Err(ResponseError::NotCoordinator));
                        return;
                    }
                };
                let _ = reply.send(Ok(errors));
                self.settle(partition, epoch, &group, effects).await;
            }
            GroupOp::Commit { member, generation, offsets, reply } => {
                let _ = reply.send(self.commit(partition, epoch, &group, member, generation, offsets, now).await);
            }
            GroupOp::FetchOffsets { partitions, member, reply } => {
                let fetched = self.with_groups(partition, epoch, |groups| {
                    let entry = groups.get(&group);
                    // Classic groups answer anyone, as Kafka's do; a consumer-protocol group checks
                    // its members' epochs.
                    if let Some(consumer) = entry.and_then(|e| e.consumer.as_ref()) {
                        consumer.check_fetch(member.member_id.as_deref(), member.member_epoch)?;
                    }
                    Ok(fetch_offsets(entry, partitions))
                });
                let _ = reply.send(fetched.unwrap_or(Err(ResponseError::NotCoordinator)));
            }
            GroupOp::Describe { reply } => {
                // DescribeGroups describes classic groups only.
                let described = self.with_groups(partition, epoch, |groups| {
                    groups.get(&group).filter(|e| e.consumer.is_none()).map(describe)
                });
                let _ = reply.send(described.ok_or(ResponseError::NotCoordinator));
            }
            GroupOp::ConsumerDescribe { reply } => {
                let described = self.with_groups(partition, epoch, |groups| {
                    let consumer = groups.get(&group).and_then(|e| e.consumer.as_ref());
                    consumer.map(|c| describe_consumer(c, &self.consumer_settings))
                });
                let _ = reply.send(described.ok_or(ResponseError::NotCoordinator));
            }
            GroupOp::ConsumerHeartbeat { heartbeat, reply } => {
                let _ = reply.send(self.consumer_heartbeat(partition, epoch, &group, *heartbeat, now).await);
            }
            GroupOp::Delete { reply } => {
                let _ = reply.send(self.delete(partition, epoch, &group).await);
            }
            GroupOp::DeleteOffsets { partitions, reply } => {
                let _ = reply.send(self.delete_offsets(partition, epoch, &group, partitions).await);
            }
        }
    }

    async fn delete(&self, partition: i32, epoch: LeaderEpoch, group: &str) -> Option<ResponseError> {
        let planned = self.with_groups(partition, epoch, |groups| {
            let entry = groups.get_mut(group).ok_or(ResponseError::GroupIdNotFound)?;
            if entry.consumer.as_ref().is_some_and(|c| !c.members.is_empty()) {
                return Err(ResponseError::NonEmptyGroup);
            }
            entry.group.check_delete()?;
            // Taken out while the deletion is written, so no heartbeat joins it meanwhile; put back if
            // the write fails.
            let consumer = entry.consumer.take();
            let consumer_deletion = consumer.as_ref().map(|c| consumer_records(group, c.deletion()));
            let effects = entry.group.mark_dead(now_ms());
            let mut records: Vec<OffsetsRecord> = entry
                .offsets
                .keys()
                .chain(entry.pending_commits.keys().filter(|k| !entry.offsets.contains_key(*k)))
                .map(|(topic, p)| OffsetsRecord::Offset {
                    group: group.to_string(),
                    topic: topic.clone(),
                    partition: *p,
                    value: None,
                })
                .collect();
            records.push(OffsetsRecord::Group { group: group.to_string(), value: None });
            records.extend(consumer_deletion.into_iter().flatten());
            Ok((records, effects, consumer))
        });
        let (records, effects, consumer) = match planned {
            None => return Some(ResponseError::NotCoordinator),
            Some(Err(e)) => return Some(e),
            Some(Ok(planned)) => planned,
        };
        self.deliver(effects.replies, None);
        let written = self.write(partition, epoch, &records).await;
        match written {
            Ok(_) => {
                self.with_groups(partition, epoch, |groups| {
                    if groups.get(group).is_some_and(|e| e.group.state == GroupState::Dead) {
                        groups.remove(group);
                    }
                });
                tracing::info!(group, "deleted consumer group");
                None
            }
            Err(e) => {
                // Not recorded: the group stays, empty, as it was (unless a new group of that name
                // has taken its place meanwhile).
                self.with_groups(partition, epoch, |groups| {
                    if let Some(entry) = groups.get_mut(group)
                        && entry.group.state == GroupState::Dead
                    {
                        entry.group.state = GroupState::Empty;
                        entry.consumer = consumer;
                    }
                });
                Some(coordinator_error(e))
            }
        }
    }

    /// The coordinator's timer: follows leadership of the offsets partitions, then moves every group's
    /// clock and forgets empty groups without offsets.
    async fn tick(self: Rc<Self>) {
        self.follow_leadership();
        let now = now_ms();
        let interval = self.ctx.config.groups.retention_check_interval_ms;
        if now.saturating_sub(self.last_expiry.get()) >= interval && !self.expiring.replace(true) {
            self.last_expiry.set(now);
            let me = self.clone();
            glommio::spawn_local(async move {
                me.expire_offsets(now).await;
                me.expiring.set(false);
            })
            .detach();
        }
        let mut work: Vec<(i32, LeaderEpoch, String, Effects)> = Vec::new();
        let mut gone: Vec<(i32, LeaderEpoch, Vec<OffsetsRecord>)> = Vec::new();
        for (partition, slot) in self.partitions.borrow_mut().iter_mut() {
            let Slot::Loaded { epoch, groups } = slot else { continue };
            for (id, entry) in groups.iter_mut() {
                let effects = entry.group.tick(now);
                if !effects.replies.is_empty() || effects.persist {
                    work.push((*partition, *epoch, id.clone(), effects));
                }
                // Members whose session or rebalance timeout ran out leave the group.
                if let Some(consumer) = entry.consumer.as_mut() {
                    let changes = consumer.tick(&self.consumer_settings, now);
                    if !changes.is_empty() {
                        gone.push((*partition, *epoch, consumer_records(id, changes)));
                        entry.note_consumer_members(now);
                    }
                }
            }
            groups.retain(|id, entry| {
                // A group being deleted is settled by its deletion (removed, or put back if the write
                // fails).
                if !entry.is_idle() || entry.group.state == GroupState::Dead {
                    return true;
                }
                let mut tombstones = Vec::new();
                if entry.recorded {
                    tombstones.push(OffsetsRecord::Group { group: id.clone(), value: None });
                }
                if let Some(consumer) = &entry.consumer {
                    tombstones.extend(consumer_records(id, consumer.deletion()));
                }
                if !tombstones.is_empty() {
                    gone.push((*partition, *epoch, tombstones));
                }
                false
            });
        }
        // Each write on a task of its own: a slow one must not hold up the next tick (sessions,
        // rebalance deadlines, leadership).
        for (partition, epoch, group, effects) in work {
            let me = self.clone();
            glommio::spawn_local(async move { me.settle(partition, epoch, &group, effects).await }).detach();
        }
        for (partition, epoch, records) in gone {
            let write = self.write(partition, epoch, &records);
            let me = self.clone();
            glommio::spawn_local(async move {
                if let Err(e) = write.await {
                    tracing::debug!(partition, ?e, "group records of the timer not written");
                    me.reload_after_failed_write(partition, epoch);
                }
            })
            .detach();
        }
    }

    /// Starts loading the offsets partitions this shard has come to lead and drops those it no longer
    /// leads.
    fn follow_leadership(self: &Rc<Self>) {
        let image = self.ctx.image();
        let count = image.topic(OFFSETS_TOPIC).map_or(0, |t| t.partitions.len() as i32);
        // By the metadata alone: a moment without a quorum session (requests are answered NOT_COORDINATOR
        // meanwhile) does not throw the groups away; only another leader or epoch does.
        let me = crate::quorum::state::NodeId(self.ctx.config.node_id);
        let led: BTreeMap<i32, LeaderEpoch> = (0..count)
            .filter_map(|p| image.partition(OFFSETS_TOPIC, p).map(|record| (p, record)))
            .filter(|(_, record)| record.leader == Some(me))
            .filter(|(p, _)| {
                self.ctx.shard_of(&TopicPartition::new(OFFSETS_TOPIC.to_string(), *p as u32)) == self.shard
            })
            .map(|(p, record)| (p, record.leader_epoch))
            .collect();
        let stale: Vec<i32> = self
            .partitions
            .borrow()
            .iter()
            .filter(|(p, slot)| {
                let epoch = match slot {
                    Slot::Loading(e) | Slot::Loaded { epoch: e, .. } => *e,
                };
                led.get(p) != Some(&epoch)
            })
            .map(|(p, _)| *p)
            .collect();
        for p in stale {
            if let Some(Slot::Loaded { groups, .. }) = self.partitions.borrow_mut().remove(&p) {
                tracing::info!(partition = p, groups = groups.len(), "no longer coordinating these consumer groups");
                self.abandon(p, groups);
            }
        }
        for (p, epoch) in led {
            if !self.partitions.borrow().contains_key(&p) {
                self.start_load(p, epoch);
            }
        }
    }
}
