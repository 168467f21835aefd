//! The group coordinator of one shard: the adapter between the group state machines (the classic
//! protocol's, [`super::classic`], and the consumer protocol's of KIP-848, [`super::consumer`]) and the
//! shard's `__consumer_offsets` partitions. A group id is of one protocol at a time: a consumer-protocol
//! heartbeat takes over a classic group only while it has no members, and a JoinGroup an empty
//! consumer-protocol group.
//!
//! The coordinator of a group is the leader of the group's offsets partition, on the shard that owns
//! that partition. Loading the groups from the partition, writing their records (acks=all, answered once
//! acknowledged, in the order decided), and dropping them when leadership moves are the coordinator
//! runtime's ([`crate::coordinator`]); this module decides what each request does to a group. When a
//! partition's groups are dropped, their waiting JoinGroup and SyncGroup answers get NOT_COORDINATOR.
//! Offsets committed in transactions wait for the transaction's marker ([`pending`], [`txn`]).
//!
//! State lives in `RefCell`s on the shard's thread; no borrow is held across an await.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use futures_lite::future;
use kafka_protocol::ResponseError;
use shardlog_storage::LeaderEpoch;

mod answers;
mod consumer;
mod offsets;
mod pending;
mod state;
mod txn;

use answers::{coordinator_error, describe, describe_consumer, fetch_offsets, refuse};
use consumer::consumer_records;
use state::{Entry, Groups, encode_batch};

use super::call::{CoordinatorRequest, GroupCall, GroupListing, GroupOp};
use super::classic::{Effects, GroupSettings, GroupState, JoinAnswer, Reply, SyncAnswer, Ticket};
use super::consumer::ConsumerGroupSettings;
use super::records::OffsetsRecord;
use crate::context::BrokerContext;
use crate::coordinator::{Runtime, now_ms};

/// How often groups are checked for expired sessions and rebalance timeouts, and leadership of the
/// offsets partitions for changes.
const TICK: Duration = Duration::from_millis(100);
/// A gauge per group and partition: the offset committed.
const COMMITTED_OFFSET: &str = "shardlog_consumer_group_committed_offset";
enum Waiter {
    Join(flume::Sender<JoinAnswer>),
    Sync(flume::Sender<SyncAnswer>),
}

/// The answers of JoinGroup and SyncGroup requests that wait for a rebalance, by ticket.
#[derive(Default)]
struct Waiters {
    waiting: RefCell<HashMap<Ticket, Waiter>>,
    next_ticket: Cell<Ticket>,
}

impl Waiters {
    /// The next ticket, with its waiter.
    fn wait_for(&self, waiter: Waiter) -> Ticket {
        let ticket = self.next_ticket.get();
        self.next_ticket.set(ticket + 1);
        self.waiting.borrow_mut().insert(ticket, waiter);
        ticket
    }

    /// Sends answers to their waiters; with `error`, each is replaced by that refusal.
    fn deliver(&self, replies: Vec<Reply>, error: Option<ResponseError>) {
        let mut waiters = self.waiting.borrow_mut();
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
}

/// One shard's coordinator.
struct Coordinator {
    ctx: Arc<BrokerContext>,
    settings: GroupSettings,
    consumer_settings: ConsumerGroupSettings,
    runtime: Rc<Runtime<Groups>>,
    waiters: Rc<Waiters>,
    /// When offsets were last checked for expiry (wall ms), and whether a check is under way.
    last_expiry: Cell<u64>,
    expiring: Cell<bool>,
}

/// Runs the shard's coordinator until the broker stops.
pub async fn run(ctx: Arc<BrokerContext>, shard: usize, requests: flume::Receiver<CoordinatorRequest>) {
    metrics::describe_gauge!(COMMITTED_OFFSET, "the offset a consumer group committed for a partition (coordinator)");
    let settings = ctx.config.groups.settings;
    let runtime = Runtime::new(ctx.clone(), shard, settings, ctx.config.groups.commit_timeout_ms);
    let waiters = Rc::new(Waiters { waiting: RefCell::default(), next_ticket: Cell::new(1) });
    let on_unload = waiters.clone();
    runtime.on_unload(move |_, Groups { groups, .. }| {
        for (_, mut entry) in groups {
            on_unload.deliver(entry.group.abandon(ResponseError::NotCoordinator), None);
        }
    });
    let me = Rc::new(Coordinator {
        settings,
        consumer_settings: ctx.config.groups.consumer,
        ctx,
        runtime,
        waiters,
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
            CoordinatorRequest::TxnCompleted { partition, epoch, producer_id, commit, marker_offset, reply } => {
                let _ = reply.send(self.txn_completed(partition, epoch, producer_id, commit, marker_offset));
            }
        }
    }

    /// Sets the committed offset gauge of every group this shard coordinates (a group's lag is a
    /// partition's high watermark less it: see `deploy/README.md`).
    fn sample_committed_offsets(&self) {
        self.runtime.each_loaded(|_, _, Groups { groups, .. }| {
            for (id, entry) in groups.iter() {
                for ((topic, partition), stored) in &entry.offsets {
                    let labels =
                        [("group", id.clone()), ("topic", topic.clone()), ("partition", partition.to_string())];
                    metrics::gauge!(COMMITTED_OFFSET, &labels).set(stored.value.offset as f64);
                }
            }
        });
    }

    fn list(&self) -> Result<Vec<GroupListing>, ResponseError> {
        let mut out = Vec::new();
        let all_loaded = self.runtime.each_loaded(|_, _, Groups { groups, .. }| {
            out.extend(groups.iter().map(|(id, e)| match &e.consumer {
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
            }))
        });
        if !all_loaded {
            return Err(ResponseError::CoordinatorLoadInProgress);
        }
        Ok(out)
    }

    /// Runs `f` on the partition's groups, if it is (still) loaded at `epoch`: what was decided under
    /// one leadership never touches the groups rebuilt under the next.
    fn with_groups<R>(
        &self,
        partition: i32,
        epoch: LeaderEpoch,
        f: impl FnOnce(&mut HashMap<String, Entry>) -> R,
    ) -> Option<R> {
        self.runtime.with_state(partition, epoch, |Groups { groups, .. }| f(groups))
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
                self.waiters.deliver(effects.replies, Some(ResponseError::NotCoordinator));
                return;
            };
            let generation = record.generation;
            let write =
                self.write(partition, epoch, &[OffsetsRecord::Group { group: group.to_string(), value: Some(record) }]);
            let next = match write.await {
                Ok(_) => {
                    self.waiters.deliver(effects.replies, None);
                    self.with_groups(partition, epoch, |groups| {
                        groups.get_mut(group).map(|e| e.group.record_written(generation, now_ms()))
                    })
                }
                Err(e) => {
                    let error = coordinator_error(e);
                    tracing::debug!(group, ?e, "group record not written");
                    self.waiters.deliver(effects.replies, Some(error));
                    self.with_groups(partition, epoch, |groups| {
                        groups.get_mut(group).map(|e| e.group.record_failed(generation, error, now_ms()))
                    })
                }
            };
            effects = next.flatten().unwrap_or_default();
        }
        self.waiters.deliver(effects.replies, None);
    }

    /// Appends records to the partition (acks=all) and returns the offset of the first; sent now, so
    /// records keep the order of the decisions.
    fn write(
        &self,
        partition: i32,
        epoch: LeaderEpoch,
        records: &[OffsetsRecord],
    ) -> impl Future<Output = Result<i64, ResponseError>> + use<> {
        self.runtime.write(partition, epoch, encode_batch(records, None))
    }

    async fn handle_group(self: Rc<Self>, call: GroupCall) {
        let GroupCall { partition, epoch, group, op } = call;
        if let Err(error) = self.runtime.ready(partition, epoch) {
            refuse(op, error);
            return;
        }
        let now = now_ms();
        let settings = self.settings;
        match op {
            GroupOp::Join { args, reply } => {
                let ticket = self.waiters.wait_for(Waiter::Join(reply));
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
                let ticket = self.waiters.wait_for(Waiter::Sync(reply));
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
            GroupOp::TxnCommit { transactional_id, producer, member, generation, offsets, reply } => {
                tracing::trace!(group, transactional_id, producer = producer.id, "transactional offset commit");
                let answer = self.txn_commit(partition, epoch, &group, producer, member, generation, offsets, now);
                let _ = reply.send(answer.await);
            }
            GroupOp::FetchOffsets { partitions, member, require_stable, reply } => {
                let fetched = self.with_groups(partition, epoch, |groups| {
                    let entry = groups.get(&group);
                    // Classic groups answer anyone, as Kafka's do; a consumer-protocol group checks
                    // its members' epochs.
                    if let Some(consumer) = entry.and_then(|e| e.consumer.as_ref()) {
                        consumer.check_fetch(member.member_id.as_deref(), member.member_epoch)?;
                    }
                    Ok(fetch_offsets(entry, partitions, require_stable))
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
            // Tombstones for every partition it has an offset of: committed, being written, or waiting
            // for a transaction's marker (which Kafka deletes with the group too).
            let keys: BTreeSet<&(String, i32)> =
                entry.offsets.keys().chain(entry.pending_commits.keys()).chain(entry.txn_offsets.keys()).collect();
            let mut records: Vec<OffsetsRecord> = keys
                .into_iter()
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
        self.waiters.deliver(effects.replies, None);
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
        self.runtime.follow_leadership();
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
        self.runtime.each_loaded(|partition, epoch, Groups { groups, .. }| {
            for (id, entry) in groups.iter_mut() {
                let effects = entry.group.tick(now);
                if !effects.replies.is_empty() || effects.persist {
                    work.push((partition, epoch, id.clone(), effects));
                }
                // Members whose session or rebalance timeout ran out leave the group.
                if let Some(consumer) = entry.consumer.as_mut() {
                    let changes = consumer.tick(&self.consumer_settings, now);
                    if !changes.is_empty() {
                        gone.push((partition, epoch, consumer_records(id, changes)));
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
                    gone.push((partition, epoch, tombstones));
                }
                false
            });
        });
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
                    me.runtime.reload_after_failed_write(partition, epoch);
                }
            })
            .detach();
        }
    }
}
