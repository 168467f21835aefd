//! The coordinator runtime: what every coordinator of an internal topic does the same way, whatever it
//! coordinates (consumer groups on `__consumer_offsets`, transactions on `__transaction_state`).
//!
//! A coordinator keeps state in memory for each partition of its topic that this shard's broker leads,
//! and the partition's log is the state's only durable copy. The runtime ([`Runtime`]) owns, per
//! partition, a slot that is loading or loaded at a leader epoch, and keeps these rules:
//! - **Loading.** When this shard's broker becomes leader of a partition (seen on the coordinator's
//!   timer, by the metadata alone, or on the first request that carries the newer leader epoch), the
//!   partition's log is read from its start to the log end it had then, every record handed to the
//!   coordinator's replay in log order (control records too), and the state built from them becomes the
//!   slot's. Meanwhile requests are answered COORDINATOR_LOAD_IN_PROGRESS. A load that fails leaves no
//!   slot: the next tick tries again while the broker still leads the partition.
//! - **One leadership at a time.** Every decision is made under the epoch it was asked at, and its
//!   continuation ([`Runtime::with_state`]) runs only if the slot is still loaded at that epoch: what was
//!   decided under one leadership never touches the state rebuilt under the next. A request carrying an
//!   older epoch than the one loaded is answered NOT_COORDINATOR.
//! - **Writes.** A change is written to the partition as an acks=all produce at the loaded leader epoch
//!   (a deposed leader's write fails FENCED_LEADER_EPOCH), sent synchronously so records land in the
//!   order the decisions were made, and its future resolves once the write is acknowledged: durable here
//!   and past the high watermark when replicated. Answers are sent only after that. An answer without a
//!   record of its own waits for the writes sent before it ([`Runtime::mark`], [`Runtime::settled`]).
//! - **Failure.** After a failed write the state in memory may be ahead of the log; the coordinator
//!   either repairs it or asks for the partition to be read again ([`Runtime::reload_after_failed_write`]).
//! - **Unloading.** When leadership moves away, the state is handed to the coordinator's unload hook,
//!   which refuses what it still holds; answers waiting on the partition's writes are refused
//!   NOT_COORDINATOR.
//!
//! The timer follows leadership by the metadata image only: a moment without a quorum session does not
//! throw state away (the handlers refuse requests meanwhile, by the session); only another leader or epoch
//! does.
//!
//! State lives in `RefCell`s on the shard's thread; no borrow is held across an await.

pub mod transactions;
mod writes;

use std::cell::{OnceCell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use bytes::BytesMut;
use kafka_protocol::ResponseError;
use kafka_protocol::records::{
    Compression, NO_PARTITION_LEADER_EPOCH, NO_PRODUCER_EPOCH, NO_PRODUCER_ID, Record, RecordBatchDecoder,
    RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};
use shardlog_storage::{Clock, LeaderEpoch, SystemClock, TopicPartition};

pub(crate) use writes::Mark;
use writes::Writes;

use crate::context::{BrokerContext, ask_shard};
use crate::quorum::state::NodeId;
use crate::shard::{FetchRead, OffsetSpec, PartitionRequest, ProduceBatch};

/// How much of the log one read takes while loading.
const LOAD_READ_BYTES: usize = 1 << 20;
/// How long a load waits before reading again when the high watermark has not reached the end yet.
const LOAD_RETRY: Duration = Duration::from_millis(20);

/// What a coordinator keeps of one partition of its topic, and how it is rebuilt from the log.
pub(crate) trait Coordinated: Sized + 'static {
    /// The internal topic.
    const TOPIC: &'static str;
    /// What the state holds, for log lines ("consumer groups", "transactions").
    const WHAT: &'static str;
    /// What loading builds, record by record.
    type Replay;
    /// What finishing a load needs besides the records (settings).
    type Settings: Clone;

    fn start_replay() -> Self::Replay;
    /// One record of the partition at `record.offset`, in log order. Control records are handed over too.
    fn replay(replay: &mut Self::Replay, record: &Record);
    /// The state once every record up to the log end was replayed, loaded under `epoch`.
    fn finish(replay: Self::Replay, settings: &Self::Settings, epoch: LeaderEpoch, now_ms: u64) -> Self;
    /// How many things the state holds, for log lines.
    fn len(&self) -> usize;
}

/// Hands every record of `bytes` (whole batches, as a fetch returns them) at `from` or later to `f`;
/// returns the offset after the last batch.
pub(crate) fn replay_batches(mut bytes: Bytes, from: i64, mut f: impl FnMut(&Record)) -> Result<i64, String> {
    let mut next = from;
    while !bytes.is_empty() {
        let header = shardlog_storage::batch::BatchHeader::parse(&bytes).map_err(|e| e.to_string())?;
        let set = RecordBatchDecoder::decode(&mut bytes)
            .map_err(|e| format!("decode batch at {}: {e}", header.base_offset))?;
        for record in set.records.iter().filter(|r| r.offset >= from) {
            f(record);
        }
        next = next.max(header.base_offset + header.last_offset_delta as i64 + 1);
    }
    Ok(next)
}

/// One uncompressed batch of a coordinator's records (key, value or tombstone): without a producer id, or,
/// with `producer` (id, epoch), transactional data of that producer (a transaction's offsets). Either way
/// its base sequence is -1 (no sequence), as Kafka's coordinators write them: a coordinator does not know,
/// and need not keep, the producer's sequences.
pub(crate) fn encode_batch(
    records: Vec<(Bytes, Option<Bytes>)>,
    producer: Option<(i64, i16)>,
) -> Result<Bytes, ResponseError> {
    let timestamp = SystemClock.now_ms();
    let (producer_id, producer_epoch) = producer.unwrap_or((NO_PRODUCER_ID, NO_PRODUCER_EPOCH));
    let records: Vec<Record> = records
        .into_iter()
        .enumerate()
        .map(|(i, (key, value))| Record {
            transactional: producer.is_some(),
            control: false,
            delete_horizon: false,
            partition_leader_epoch: NO_PARTITION_LEADER_EPOCH,
            producer_id,
            producer_epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // The encoder keeps records in one batch while offset - sequence stays the same; the batch's
            // base sequence is the first record's, -1.
            sequence: i as i32 - 1,
            timestamp,
            key: Some(key),
            value,
            headers: Default::default(),
        })
        .collect();
    let mut out = BytesMut::new();
    RecordBatchEncoder::encode(&mut out, &records, &RecordEncodeOptions { version: 2, compression: Compression::None })
        .map_err(|_| ResponseError::UnknownServerError)?;
    Ok(out.freeze())
}

enum Slot<S> {
    Loading(LeaderEpoch),
    Loaded { epoch: LeaderEpoch, state: S },
}

type UnloadHook<S> = Box<dyn Fn(i32, S)>;
type LoadHook = Box<dyn Fn(i32, LeaderEpoch)>;

/// One shard's runtime for one coordinator: see the module documentation.
pub(crate) struct Runtime<S: Coordinated> {
    ctx: Arc<BrokerContext>,
    shard: usize,
    settings: S::Settings,
    /// How long an acks=all write of the coordinator waits for the in-sync replicas.
    write_timeout_ms: i32,
    slots: RefCell<HashMap<i32, Slot<S>>>,
    writes: Rc<Writes>,
    unloaded: OnceCell<UnloadHook<S>>,
    loaded: OnceCell<LoadHook>,
}

pub(crate) fn now_ms() -> u64 {
    SystemClock.now_ms().max(0) as u64
}

impl<S: Coordinated> Runtime<S> {
    pub(crate) fn new(ctx: Arc<BrokerContext>, shard: usize, settings: S::Settings, write_timeout_ms: i32) -> Rc<Self> {
        Rc::new(Runtime {
            ctx,
            shard,
            settings,
            write_timeout_ms,
            slots: RefCell::new(HashMap::new()),
            writes: Rc::default(),
            unloaded: OnceCell::new(),
            loaded: OnceCell::new(),
        })
    }

    /// What is done with a partition's state when it is dropped (leadership moved, or it is read again):
    /// refuse what it still holds. Set once, before the first load.
    pub(crate) fn on_unload(&self, hook: impl Fn(i32, S) + 'static) {
        if self.unloaded.set(Box::new(hook)).is_err() {
            unreachable!("a coordinator's unload hook is set once");
        }
    }

    /// What is done once a partition's state is loaded, before any request sees it (the transaction
    /// coordinator completes the transactions it finds decided). Set once, before the first load.
    pub(crate) fn on_load(&self, hook: impl Fn(i32, LeaderEpoch) + 'static) {
        if self.loaded.set(Box::new(hook)).is_err() {
            unreachable!("a coordinator's load hook is set once");
        }
    }

    /// Whether the partition is loaded at `epoch`; starts loading it when this is the first word of a
    /// newer leadership.
    pub(crate) fn ready(self: &Rc<Self>, partition: i32, epoch: LeaderEpoch) -> Result<(), ResponseError> {
        let current = match self.slots.borrow().get(&partition) {
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

    /// Runs `f` on the partition's state, if it is (still) loaded at `epoch`.
    pub(crate) fn with_state<R>(&self, partition: i32, epoch: LeaderEpoch, f: impl FnOnce(&mut S) -> R) -> Option<R> {
        match self.slots.borrow_mut().get_mut(&partition) {
            Some(Slot::Loaded { epoch: loaded, state }) if *loaded == epoch => Some(f(state)),
            _ => None,
        }
    }

    /// Runs `f` on every loaded partition's state; false if some partition is still loading.
    pub(crate) fn each_loaded(&self, mut f: impl FnMut(i32, LeaderEpoch, &mut S)) -> bool {
        let mut all = true;
        for (partition, slot) in self.slots.borrow_mut().iter_mut() {
            match slot {
                Slot::Loading(_) => all = false,
                Slot::Loaded { epoch, state } => f(*partition, *epoch, state),
            }
        }
        all
    }

    /// Appends one batch to the partition (acks=all, at the loaded leader epoch) and returns the offset of
    /// its first record. The produce is sent now, not when the future is first polled: records keep the
    /// order of the decisions.
    pub(crate) fn write(
        &self,
        partition: i32,
        epoch: LeaderEpoch,
        batch: Result<Bytes, ResponseError>,
    ) -> impl Future<Output = Result<i64, ResponseError>> + use<S> {
        let in_flight = self.writes.start(partition);
        let sent = batch.and_then(|batch| {
            let (reply, outcome) = flume::bounded(1);
            let request = PartitionRequest::Produce {
                batches: vec![ProduceBatch {
                    tp: TopicPartition::new(S::TOPIC.to_string(), partition as u32),
                    batch,
                    epoch,
                    from_coordinator: true,
                    guard: None,
                }],
                acks: -1,
                timeout_ms: self.write_timeout_ms,
                reply,
            };
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

    /// Where the partition's writes stand now (taken with no await since the decision it is for).
    pub(crate) fn mark(&self, partition: i32) -> Mark {
        self.writes.mark(partition)
    }

    /// Waits until every write sent before `mark` has been answered; NOT_COORDINATOR if the partition's
    /// state was dropped since.
    pub(crate) async fn settled(&self, mark: Mark) -> Result<(), ResponseError> {
        self.writes.settled(mark).await
    }

    /// Whether the partition's state was dropped since `mark`: an answer decided before then may reflect
    /// changes the log does not have, even if its own write went through.
    pub(crate) fn dropped_since(&self, mark: Mark) -> bool {
        self.writes.dropped_since(mark)
    }

    /// After a write failed, the state in memory may be ahead of the log: it is dropped and rebuilt from
    /// the log, if this shard still leads the partition at `epoch`.
    pub(crate) fn reload_after_failed_write(self: &Rc<Self>, partition: i32, epoch: LeaderEpoch) {
        let loaded = matches!(self.slots.borrow().get(&partition), Some(Slot::Loaded { epoch: e, .. }) if *e == epoch);
        if loaded {
            self.start_load(partition, epoch);
        }
    }

    fn start_load(self: &Rc<Self>, partition: i32, epoch: LeaderEpoch) {
        let old = self.slots.borrow_mut().insert(partition, Slot::Loading(epoch));
        if let Some(Slot::Loaded { state, .. }) = old {
            self.unload(partition, state);
        }
        let me = self.clone();
        glommio::spawn_local(async move {
            let loaded = me.read_partition(partition, epoch).await;
            {
                let mut slots = me.slots.borrow_mut();
                if !matches!(slots.get(&partition), Some(Slot::Loading(e)) if *e == epoch) {
                    return;
                }
                match loaded {
                    Ok(replay) => {
                        let state = S::finish(replay, &me.settings, epoch, now_ms());
                        if state.len() == 0 {
                            tracing::debug!(topic = S::TOPIC, partition, %epoch, "nothing to load");
                        } else {
                            tracing::info!(topic = S::TOPIC, partition, %epoch, count = state.len(), "loaded {}", S::WHAT);
                        }
                        slots.insert(partition, Slot::Loaded { epoch, state });
                    }
                    Err(reason) => {
                        // Tried again on the next tick while this broker still leads it.
                        tracing::debug!(topic = S::TOPIC, partition, %epoch, %reason, "not loaded");
                        slots.remove(&partition);
                        return;
                    }
                }
            }
            if let Some(hook) = me.loaded.get() {
                hook(partition, epoch);
            }
        })
        .detach();
    }

    /// Refuses answers still waiting for the partition's writes, and hands the state to the unload hook.
    fn unload(&self, partition: i32, state: S) {
        self.writes.dropped(partition);
        if let Some(hook) = self.unloaded.get() {
            hook(partition, state);
        }
    }

    /// Reads the partition's log from its start to the log end it has now, replaying every record.
    async fn read_partition(&self, partition: i32, epoch: LeaderEpoch) -> Result<S::Replay, String> {
        let tp = TopicPartition::new(S::TOPIC.to_string(), partition as u32);
        let list = |spec| {
            let tp = tp.clone();
            ask_shard(&self.ctx, self.shard, move |reply| PartitionRequest::ListOffsets { tp, spec, reply })
        };
        let end = list(OffsetSpec::LogEnd).await.ok_or("shard gone")?;
        let start = list(OffsetSpec::Earliest).await.ok_or("shard gone")?;
        if let Some(e) = end.error.or(start.error) {
            return Err(format!("list offsets: {e:?}"));
        }
        let mut replay = S::start_replay();
        let mut next = start.offset;
        // Also for an empty partition: a request queued under an older leadership must not load it.
        if self.ctx.leader_here(S::TOPIC, partition).map(|led| led.epoch) != Ok(epoch) {
            return Err("no longer the leader".into());
        }
        while next < end.offset {
            if self.ctx.leader_here(S::TOPIC, partition).map(|led| led.epoch) != Ok(epoch) {
                return Err("no longer the leader".into());
            }
            let tp = tp.clone();
            // To the high watermark, open transactions included (their markers decide them in replay).
            let isolation = shardlog_storage::log::Isolation::ReadUncommitted;
            let reads =
                vec![FetchRead { tp, offset: next, max_bytes: LOAD_READ_BYTES, whole_first_batch: true, isolation }];
            let read = ask_shard(&self.ctx, self.shard, move |reply| PartitionRequest::Fetch { reads, reply })
                .await
                .and_then(|mut outcomes| outcomes.pop())
                .ok_or("shard gone")?;
            match read.error {
                None if !read.records.is_empty() => {
                    next = replay_batches(read.records, next, |record| S::replay(&mut replay, record))?
                }
                // The high watermark has not reached the log end yet (a new leader's followers catch up).
                None | Some(ResponseError::OffsetNotAvailable) => glommio::timer::sleep(LOAD_RETRY).await,
                Some(e) => return Err(format!("read at {next}: {e:?}")),
            }
        }
        Ok(replay)
    }

    /// Starts loading the partitions this shard has come to lead and drops those it no longer leads. By
    /// the metadata alone: a moment without a quorum session (requests are answered NOT_COORDINATOR
    /// meanwhile) does not throw the state away; only another leader or epoch does.
    pub(crate) fn follow_leadership(self: &Rc<Self>) {
        let image = self.ctx.image();
        let count = image.topic(S::TOPIC).map_or(0, |t| t.partitions.len() as i32);
        let me = NodeId(self.ctx.config.node_id);
        let led: BTreeMap<i32, LeaderEpoch> = (0..count)
            .filter_map(|p| image.partition(S::TOPIC, p).map(|record| (p, record)))
            .filter(|(_, record)| record.leader == Some(me))
            .filter(|(p, _)| self.ctx.shard_of(&TopicPartition::new(S::TOPIC.to_string(), *p as u32)) == self.shard)
            .map(|(p, record)| (p, record.leader_epoch))
            .collect();
        let stale: Vec<i32> = self
            .slots
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
            let removed = self.slots.borrow_mut().remove(&p);
            if let Some(Slot::Loaded { state, .. }) = removed {
                tracing::info!(
                    topic = S::TOPIC,
                    partition = p,
                    count = state.len(),
                    "no longer coordinating these {}",
                    S::WHAT
                );
                self.unload(p, state);
            }
        }
        for (p, epoch) in led {
            if !self.slots.borrow().contains_key(&p) {
                self.start_load(p, epoch);
            }
        }
    }
}
