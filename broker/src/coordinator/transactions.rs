//! The transaction coordinator of one shard: the I/O-free state machine of [`crate::txn`] for every
//! `__transaction_state` partition this shard leads, on the coordinator runtime.
//!
//! Requests are decided at once (nothing here waits inside a decision); what the state machine asks for
//! is carried out here: records are written through the runtime (acks=all, in decision order) and the
//! outcome of each is reported back, answers go to the waiting handlers, and markers are written to the
//! leaders of the transaction's partitions, again and again until each has it, while this shard still
//! coordinates the id's partition at the epoch that decided them.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_lite::future;
use kafka_protocol::ResponseError;
use kafka_protocol::records::Record;
use shardlog_storage::LeaderEpoch;

use super::{Coordinated, Runtime, now_ms};
use crate::context::BrokerContext;
use crate::txn::call::{TxnListing, TxnOp, TxnReply, TxnRequest};
use crate::txn::{
    Effect, ProducerIdSource, Reply, RequestToken, TRANSACTION_STATE_TOPIC, TxnCoordinator, TxnLogRecord, TxnMarkers,
    TxnSettings, TxnSnapshot,
};

/// How often leadership of the `__transaction_state` partitions is looked at.
const TICK: Duration = Duration::from_millis(100);
/// The first wait before markers are written again after a leader could not take them, and the longest.
const MARKER_RETRY_FIRST: Duration = Duration::from_millis(50);
const MARKER_RETRY_MAX: Duration = Duration::from_secs(1);

/// The transactional ids of one `__transaction_state` partition, as the coordinator runtime keeps them.
pub(crate) struct TxnShard(TxnCoordinator);

impl Coordinated for TxnShard {
    const TOPIC: &'static str = TRANSACTION_STATE_TOPIC;
    const WHAT: &'static str = "transactional ids";
    /// The last record of each id, in log order: what the coordinator is rebuilt from.
    type Replay = BTreeMap<String, Option<TxnSnapshot>>;
    type Settings = TxnSettings;

    fn start_replay() -> Self::Replay {
        BTreeMap::new()
    }

    fn replay(replay: &mut Self::Replay, record: &Record) {
        if record.control {
            return;
        }
        let Some(key) = record.key.as_deref() else { return };
        match TxnLogRecord::decode(key, record.value.as_deref()) {
            Ok(r) => {
                replay.insert(r.transactional_id, r.value);
            }
            // Written by another version or damaged: skipped, as Kafka skips unknown record types.
            Err(e) => {
                tracing::warn!(offset = record.offset, error = %e, "skipped an unreadable record in __transaction_state")
            }
        }
    }

    fn finish(replay: Self::Replay, settings: &TxnSettings, epoch: LeaderEpoch, _now_ms: u64) -> TxnShard {
        let mut coordinator = TxnCoordinator::loading(*settings, epoch.0);
        for (transactional_id, value) in replay {
            coordinator.replay(TxnLogRecord { transactional_id, value });
        }
        TxnShard(coordinator)
    }

    fn len(&self) -> usize {
        self.0.transactions().count()
    }
}

/// The producer id a handler took beforehand, given to the state machine if it needs one.
struct Prefetched(Option<i64>);

impl ProducerIdSource for Prefetched {
    fn next_producer_id(&mut self) -> Option<i64> {
        self.0.take()
    }
}

/// One shard's transaction coordinator.
struct Service {
    ctx: Arc<BrokerContext>,
    runtime: Rc<Runtime<TxnShard>>,
    waiting: RefCell<HashMap<RequestToken, TxnReply>>,
    next_token: Cell<u64>,
}

/// Runs the shard's transaction coordinator until the broker stops.
pub async fn run(ctx: Arc<BrokerContext>, shard: usize, requests: flume::Receiver<TxnRequest>) {
    let settings = ctx.config.transactions.settings;
    let runtime = Runtime::new(ctx.clone(), shard, settings, ctx.config.transactions.write_timeout_ms);
    let me = Rc::new(Service {
        ctx,
        runtime: runtime.clone(),
        waiting: RefCell::new(HashMap::new()),
        next_token: Cell::new(1),
    });
    let on_unload = Rc::downgrade(&me);
    runtime.on_unload(move |_, TxnShard(mut coordinator)| {
        let answers = coordinator.resign();
        if let Some(me) = on_unload.upgrade() {
            for effect in answers {
                if let Effect::Answer { request, reply } = effect {
                    me.answer(request, reply);
                }
            }
        }
    });
    let on_load = Rc::downgrade(&me);
    runtime.on_load(move |partition, epoch| {
        let Some(me) = on_load.upgrade() else { return };
        // Transactions found decided but not completed get their markers again.
        if let Some(effects) = me.runtime.with_state(partition, epoch, |s| s.0.finish_loading()) {
            me.carry_out(partition, epoch, effects);
        }
    });
    let ticker = me.clone();
    glommio::spawn_local(async move {
        let interval = ticker.ctx.config.transactions.abort_timed_out_interval_ms;
        let mut last_cleanup = now_ms();
        while !ticker.ctx.shutdown.is_triggered() {
            glommio::timer::sleep(TICK).await;
            ticker.runtime.follow_leadership();
            let now = now_ms();
            if now.saturating_sub(last_cleanup) >= interval {
                last_cleanup = now;
                ticker.cleanup(now as i64);
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
        me.handle(request);
    }
}

impl Service {
    fn handle(self: &Rc<Self>, request: TxnRequest) {
        match request {
            TxnRequest::List { reply } => {
                let _ = reply.send(self.list());
            }
            TxnRequest::Call { partition, epoch, op } => {
                if let Err(error) = self.runtime.ready(partition, epoch) {
                    op.refuse(error);
                    return;
                }
                self.call(partition, epoch, op);
            }
        }
    }

    fn call(self: &Rc<Self>, partition: i32, epoch: LeaderEpoch, op: TxnOp) {
        let now = now_ms() as i64;
        let (token, effects) = match op {
            TxnOp::InitProducerId { req, fresh_producer_id, reply } => {
                let token = self.wait(reply);
                let mut ids = Prefetched(fresh_producer_id);
                (token, self.runtime.with_state(partition, epoch, |s| s.0.init_producer_id(token, &req, now, &mut ids)))
            }
            TxnOp::AddPartitions { transactional_id, producer, partitions, reply } => {
                let token = self.wait(reply);
                let effects = self.runtime.with_state(partition, epoch, |s| {
                    s.0.add_partitions(token, &transactional_id, producer, &partitions, now)
                });
                (token, effects)
            }
            TxnOp::AddOffsets { transactional_id, producer, offsets_partition, reply } => {
                let token = self.wait(reply);
                let effects = self.runtime.with_state(partition, epoch, |s| {
                    s.0.add_offsets(token, &transactional_id, producer, offsets_partition, now)
                });
                (token, effects)
            }
            TxnOp::EndTxn { transactional_id, producer, result, reply } => {
                let token = self.wait(reply);
                let effects = self
                    .runtime
                    .with_state(partition, epoch, |s| s.0.end_txn(token, &transactional_id, producer, result, now));
                (token, effects)
            }
            TxnOp::Verify { transactional_id, producer, partitions, reply } => {
                let verified = self.runtime.with_state(partition, epoch, |s| {
                    partitions.iter().map(|tp| s.0.verify_partition(&transactional_id, producer, tp)).collect()
                });
                let _ =
                    reply.send(verified.unwrap_or_else(|| vec![Err(ResponseError::NotCoordinator); partitions.len()]));
                return;
            }
            TxnOp::Describe { transactional_id, reply } => {
                let described = self.runtime.with_state(partition, epoch, |s| s.0.metadata(&transactional_id).cloned());
                let _ = reply.send(described.ok_or(ResponseError::NotCoordinator));
                return;
            }
        };
        match effects {
            Some(effects) => self.carry_out(partition, epoch, effects),
            // (`ready` just found the partition loaded at this epoch, with no await since.)
            None => self.answer(token, Err(ResponseError::NotCoordinator)),
        }
    }

    fn wait(&self, reply: TxnReply) -> RequestToken {
        let token = RequestToken(self.next_token.get());
        self.next_token.set(token.0 + 1);
        self.waiting.borrow_mut().insert(token, reply);
        token
    }

    fn answer(&self, request: RequestToken, reply: Result<Reply, ResponseError>) {
        if let Some(waiter) = self.waiting.borrow_mut().remove(&request) {
            let _ = waiter.send(reply);
        }
    }

    /// Does what the state machine asked, in order: writes are sent before this returns.
    fn carry_out(self: &Rc<Self>, partition: i32, epoch: LeaderEpoch, effects: Vec<Effect>) {
        for effect in effects {
            match effect {
                Effect::Answer { request, reply } => self.answer(request, reply),
                Effect::Write { write, record } => {
                    let record = (Bytes::from(record.encode_key()), record.encode_value().map(Bytes::from));
                    let batch = super::encode_batch(vec![record], None);
                    let written = self.runtime.write(partition, epoch, batch);
                    let me = self.clone();
                    glommio::spawn_local(async move {
                        let outcome = written.await;
                        let next = me.runtime.with_state(partition, epoch, |s| match outcome {
                            Ok(_) => s.0.write_committed(write, now_ms() as i64),
                            Err(e) => {
                                tracing::debug!(partition, ?e, "a __transaction_state record was not written");
                                s.0.write_failed(write, e)
                            }
                        });
                        if let Some(effects) = next {
                            me.carry_out(partition, epoch, effects);
                        }
                    })
                    .detach();
                }
                Effect::SendMarkers(markers) => {
                    glommio::spawn_local(self.clone().send_markers(partition, epoch, markers)).detach();
                }
            }
        }
    }

    /// Writes a decided transaction's markers to the leaders of its partitions until each has taken it,
    /// then tells the state machine. Given up when this shard stops coordinating the id's partition at
    /// `epoch`: the next coordinator sends them again.
    async fn send_markers(self: Rc<Self>, partition: i32, epoch: LeaderEpoch, markers: TxnMarkers) {
        let mut left = markers.partitions.clone();
        let mut wait = MARKER_RETRY_FIRST;
        loop {
            if self.runtime.with_state(partition, epoch, |_| ()).is_none() || self.ctx.shutdown.is_triggered() {
                return;
            }
            left = crate::handlers::txn_markers::write_markers(&self.ctx, &markers, left).await;
            if left.is_empty() {
                break;
            }
            tracing::debug!(transactional_id = markers.transactional_id, left = left.len(), "markers not written yet");
            glommio::timer::sleep(wait).await;
            wait = (wait * 2).min(MARKER_RETRY_MAX);
        }
        let next = self.runtime.with_state(partition, epoch, |s| {
            let producer =
                crate::txn::ProducerIdAndEpoch { producer_id: markers.producer_id, epoch: markers.producer_epoch };
            s.0.markers_written(&markers.transactional_id, producer, markers.result, now_ms() as i64)
        });
        if let Some(effects) = next {
            self.carry_out(partition, epoch, effects);
        }
    }

    /// Aborts transactions open longer than their timeout and forgets ids idle past
    /// `transactional.id.expiration.ms`, in every partition loaded here.
    fn cleanup(self: &Rc<Self>, now: i64) {
        let mut work = Vec::new();
        self.runtime.each_loaded(|partition, epoch, s| work.push((partition, epoch, s.0.tick(now))));
        for (partition, epoch, effects) in work {
            self.carry_out(partition, epoch, effects);
        }
    }

    fn list(&self) -> Result<Vec<TxnListing>, ResponseError> {
        let mut out = Vec::new();
        let all_loaded = self.runtime.each_loaded(|_, _, s| {
            out.extend(s.0.transactions().map(|meta| TxnListing {
                transactional_id: meta.transactional_id.clone(),
                producer_id: meta.current.producer_id,
                state: meta.state(),
                txn_start_ms: meta.current.txn_start_ms,
            }))
        });
        if !all_loaded {
            return Err(ResponseError::CoordinatorLoadInProgress);
        }
        Ok(out)
    }
}
