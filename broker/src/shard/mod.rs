//! A shard's partitions: the storage logs it owns and the requests other shards send it for them.
//!
//! Every operation on a partition runs on the shard that owns it. A request handler on any shard sends
//! a [`PartitionRequest`] over the owner's channel (the same path for the local shard) and awaits the
//! reply, so logs are only ever touched from their own thread.

use std::cell::Cell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_lite::future;
use kafka_protocol::ResponseError;
use shardlog_storage::fs::dma::DmaFs;
use shardlog_storage::log::Isolation;
use shardlog_storage::producer_state::VerificationGuard;
use shardlog_storage::txn::AbortedRange;
use shardlog_storage::{
    FlushPolicy, LeaderEpoch, LogConfig, LogDir, LogNews, Offset, PartitionLog, StorageError, TopicPartition,
};

use crate::quorum::state::PartitionRecord;

mod producers;
mod readahead;
mod replicas;
mod topic_ids;
mod txn_guards;
mod upkeep;

pub use producers::ProducerView;
pub use readahead::ReadAhead;
pub use replicas::{RoleChange, ShardReplicas, replica_error, stable_end};
pub use topic_ids::PARTITION_METADATA_FILE;
pub use txn_guards::{VerificationBegun, VerificationStart};
pub use upkeep::upkeep;

use topic_ids::{ensure_log, recorded_topic_id};

/// The most records a time lookup decodes from one batch.
const MAX_DECODED_RECORDS: i32 = 1 << 20;

/// Which offset ListOffsets asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetSpec {
    Earliest,
    Latest,
    /// The last stable offset: "latest" for read_committed (the end of what a read_committed consumer
    /// can read).
    LastStable,
    Timestamp(i64),
    /// This replica's own log end offset, leader or follower (ListOffsets from Kafka's debugging replica
    /// id -2: tools comparing replicas).
    LogEnd,
}

/// Work for the shard owning a partition.
#[derive(Debug)]
pub enum PartitionRequest {
    /// Makes sure the partition's log of topic `topic_id` exists here, with these settings, and gives its
    /// replica the partition's record (leader, epochs, ISR) and the topic's `min.insync.replicas`. A log
    /// left by an earlier topic of the same name (deleted and created again while this broker was away)
    /// is set aside first.
    Create {
        tp: TopicPartition,
        topic_id: uuid::Uuid,
        config: LogConfig,
        record: Box<PartitionRecord>,
        min_insync_replicas: u16,
        /// The partition's new role here, if it changed.
        reply: flume::Sender<Result<Option<RoleChange>, String>>,
    },
    Delete {
        tp: TopicPartition,
        reply: flume::Sender<Result<(), String>>,
    },
    /// Closes a partition's log and keeps its files under a name never opened again
    /// (`<topic>-<partition>.stray`): a log this broker must not serve but will not destroy.
    SetAside {
        tp: TopicPartition,
        reply: flume::Sender<Result<Option<std::path::PathBuf>, String>>,
    },
    /// The partitions whose logs this shard holds, with the topic id each log records.
    Hosted {
        reply: flume::Sender<Vec<(TopicPartition, Option<uuid::Uuid>)>>,
    },
    /// The batches of one produce request for partitions of this shard, answered together (one message
    /// and one task for all of them, whatever their number), outcomes in the order of `batches`.
    /// `timeout_ms`: how long acks=all waits for the in-sync replicas (the request's timeout).
    Produce {
        batches: Vec<ProduceBatch>,
        acks: i16,
        timeout_ms: i32,
        reply: flume::Sender<Vec<ProduceOutcome>>,
    },
    /// Transaction markers for partitions of this shard, appended as their leader (each in its
    /// partition's line of appends, as a produce) and acknowledged as an acks=all produce is: outcomes in
    /// the order of `markers`.
    WriteMarkers {
        markers: Vec<MarkerAppend>,
        timeout_ms: i32,
        reply: flume::Sender<Vec<ProduceOutcome>>,
    },
    /// Reads of partitions of this shard for one fetch, made together in one task and answered in one
    /// reply, outcomes in the order of `reads`.
    Fetch {
        reads: Vec<FetchRead>,
        reply: flume::Sender<Vec<FetchOutcome>>,
    },
    ListOffsets {
        tp: TopicPartition,
        spec: OffsetSpec,
        reply: flume::Sender<ListOutcome>,
    },
    /// Kafka's OffsetForLeaderEpoch: the largest epoch not above `epoch` and where it ended.
    EpochEnd {
        tp: TopicPartition,
        epoch: LeaderEpoch,
        reply: flume::Sender<Option<(LeaderEpoch, Offset)>>,
    },
    /// Begins KIP-890's verification of transactional batches for partitions of this shard, before their
    /// coordinator is asked (see [`txn_guards`]): answers in the order of `starts`.
    BeginVerification {
        starts: Vec<VerificationStart>,
        reply: flume::Sender<Vec<VerificationBegun>>,
    },
    /// Kafka's DescribeProducers: the producers the partition remembers, with their open transactions.
    DescribeProducers {
        tp: TopicPartition,
        reply: flume::Sender<Result<Vec<ProducerView>, ResponseError>>,
    },
    /// Kafka's DeleteRecords: `offset` -1 means the high watermark. Replies (error, new log start).
    DeleteRecords {
        tp: TopicPartition,
        offset: i64,
        reply: flume::Sender<(Option<ResponseError>, i64)>,
    },
}

/// A produce result: the base offset, or a Kafka error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProduceOutcome {
    pub error: Option<ResponseError>,
    pub base_offset: i64,
    pub log_start_offset: i64,
}

impl FetchOutcome {
    /// No records and no offsets known; `error` if the partition could not be read at all.
    pub fn empty(error: Option<ResponseError>) -> Self {
        FetchOutcome {
            error,
            records: Bytes::new(),
            high_watermark: -1,
            log_start_offset: -1,
            last_stable_offset: -1,
            aborted: Vec::new(),
            news: None,
        }
    }
}

/// Where a fetch that found too little listens for more: the partition's [`LogNews`] and its version when
/// the read began. The news has moved when the version has.
#[derive(Debug, Clone)]
pub struct NewsSeen {
    pub news: Arc<LogNews>,
    pub version: u64,
}

impl NewsSeen {
    /// `news` as it is now.
    pub fn now(news: &Arc<LogNews>) -> NewsSeen {
        NewsSeen { news: news.clone(), version: news.version() }
    }

    pub fn moved(&self) -> bool {
        self.news.version() != self.version
    }
}

impl PartialEq for NewsSeen {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.news, &other.news) && self.version == other.version
    }
}

impl Eq for NewsSeen {}

/// One partition's read for a fetch. A negative `offset` is out of range (answered with the partition's
/// offsets, as Kafka does). `whole_first_batch`: a first batch larger than `max_bytes` is still returned
/// (only for the first partition of a fetch, so that the consumer makes progress); otherwise `max_bytes`
/// is a hard limit.
#[derive(Debug)]
pub struct FetchRead {
    pub tp: TopicPartition,
    pub offset: i64,
    pub max_bytes: usize,
    pub whole_first_batch: bool,
    /// read_committed reads stop at the last stable offset and name the aborted transactions they meet.
    pub isolation: Isolation,
}

/// One batch of a produce request. `epoch`: the leader epoch the handler routed by.
#[derive(Debug)]
pub struct ProduceBatch {
    pub tp: TopicPartition,
    pub batch: Bytes,
    pub epoch: LeaderEpoch,
    /// Written by a coordinator of this broker (its own records, or a producer's transactional offsets
    /// without sequences), never by a client: see `PartitionLog::append_for_coordinator`.
    pub from_coordinator: bool,
    /// For a client's transactional batch: the verification guard its partition handed out before the
    /// coordinator was asked (`None` when its transaction was open here then, or for any other batch). A
    /// batch that would open a transaction is appended only with the guard still held (KIP-890).
    pub guard: Option<VerificationGuard>,
}

/// A transaction marker for one partition, appended by its leader at `epoch`.
#[derive(Debug, Clone)]
pub struct MarkerAppend {
    pub tp: TopicPartition,
    pub epoch: LeaderEpoch,
    pub marker: shardlog_storage::txn::TxnMarker,
}

/// What an append writes: a client's batch, or a transaction marker the log encodes.
#[derive(Clone, Copy)]
enum Appended<'a> {
    Batch(&'a [u8], Option<VerificationGuard>),
    CoordinatorBatch(&'a [u8]),
    Marker(shardlog_storage::txn::TxnMarker),
}

/// A fetch result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchOutcome {
    pub error: Option<ResponseError>,
    pub records: Bytes,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub last_stable_offset: i64,
    /// For a read_committed read: the aborted transactions with records in what was read.
    pub aborted: Vec<AbortedRange>,
    /// For a fetch held until there is more (none for a partition not served here).
    pub news: Option<NewsSeen>,
}

/// A ListOffsets result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListOutcome {
    pub error: Option<ResponseError>,
    pub offset: i64,
    pub timestamp: i64,
}

/// Serves partition requests for this shard until the channel closes. Each request runs as its own task,
/// so a produce waiting for its fdatasync does not hold up the next one; appends to one partition still
/// happen in the order their requests arrived (see [`AppendTurn`]).
pub async fn serve(
    logs: Rc<LogDir<DmaFs>>,
    replicas: Rc<ShardReplicas>,
    readahead: Rc<ReadAhead<DmaFs>>,
    requests: flume::Receiver<PartitionRequest>,
) {
    let mut lines: HashMap<TopicPartition, Rc<AppendLine>> = HashMap::new();
    while let Ok(request) = requests.recv_async().await {
        // Taken here, in the order requests arrive, so that appends to a partition keep that order.
        let turns = match &request {
            PartitionRequest::Produce { batches, .. } => {
                batches.iter().map(|b| AppendTurn::take(&mut lines, &b.tp)).collect()
            }
            PartitionRequest::WriteMarkers { markers, .. } => {
                markers.iter().map(|m| AppendTurn::take(&mut lines, &m.tp)).collect()
            }
            PartitionRequest::Delete { tp, .. } => {
                lines.remove(tp);
                Vec::new()
            }
            _ => Vec::new(),
        };
        if lines.len() > 1024 {
            // Forget partitions with no produce in line; a later produce to them need not wait.
            lines.retain(|_, line| Rc::strong_count(line) > 1);
        }
        let (logs, replicas, readahead) = (logs.clone(), replicas.clone(), readahead.clone());
        glommio::spawn_local(async move { handle(&logs, &replicas, &readahead, request, turns).await }).detach();
    }
}

/// The produces to one partition in the order their requests arrived: each takes a ticket, and appends
/// when the tickets before it are done.
#[derive(Default)]
struct AppendLine {
    issued: Cell<u64>,
    /// Produces with a ticket below this have appended.
    done: Cell<u64>,
    next: event_listener::Event,
}

/// A produce's place in its partition's line of appends: it appends after the produce that arrived
/// before it has appended (not after that one is durable, so consecutive produces share fdatasyncs).
/// An append that pauses (for a segment roll, or to write out buffered data) would otherwise let a later
/// produce overtake it. Taking and waiting for a turn allocates nothing.
struct AppendTurn {
    line: Rc<AppendLine>,
    ticket: u64,
}

impl AppendTurn {
    fn take(lines: &mut HashMap<TopicPartition, Rc<AppendLine>>, tp: &TopicPartition) -> AppendTurn {
        // The partition's name is cloned only the first time it is seen.
        let line = match lines.get(tp) {
            Some(line) => line.clone(),
            None => lines.entry(tp.clone()).or_default().clone(),
        };
        let ticket = line.issued.get();
        line.issued.set(ticket + 1);
        AppendTurn { line, ticket }
    }

    async fn wait(&self) {
        while self.line.done.get() < self.ticket {
            event_listener::listener!(self.line.next => next);
            next.await;
        }
    }
}

impl Drop for AppendTurn {
    /// Lets the next produce append (also when this one gave up before its turn came).
    fn drop(&mut self) {
        let line = &self.line;
        line.done.set(line.done.get().max(self.ticket + 1));
        line.next.notify(usize::MAX);
    }
}

async fn handle(
    logs: &LogDir<DmaFs>,
    replicas: &ShardReplicas,
    readahead: &ReadAhead<DmaFs>,
    request: PartitionRequest,
    turns: Vec<AppendTurn>,
) {
    match request {
        PartitionRequest::Create { tp, topic_id, config, record, min_insync_replicas, reply } => {
            let outcome = ensure_log(logs, &tp, topic_id, config).await.map(|()| {
                let log = logs.get(&tp)?;
                replicas.apply_record(&tp, topic_id, &record, min_insync_replicas, &log)
            });
            let _ = reply.send(outcome);
        }
        PartitionRequest::SetAside { tp, reply } => {
            replicas.remove(&tp);
            let _ = reply.send(logs.set_aside(&tp).await.map_err(|e| e.to_string()));
        }
        PartitionRequest::Hosted { reply } => {
            let mut hosted = Vec::new();
            for tp in logs.partitions() {
                let id = match logs.get(&tp) {
                    Some(log) => recorded_topic_id(&log).await.ok().flatten(),
                    None => None,
                };
                hosted.push((tp, id));
            }
            let _ = reply.send(hosted);
        }
        PartitionRequest::Delete { tp, reply } => {
            replicas.remove(&tp);
            let _ = reply.send(logs.delete(&tp).await.map_err(|e| e.to_string()));
        }
        PartitionRequest::Produce { batches, acks, timeout_ms, reply } => {
            assert_eq!(turns.len(), batches.len(), "every batch gets an append turn");
            // Appended one after another in this one task, their waits for the disk and the followers
            // overlapping.
            let produces = batches.iter().zip(turns).map(|(b, turn)| {
                let asked = Produce { epoch: b.epoch, acks, timeout_ms };
                let what = if b.from_coordinator {
                    Appended::CoordinatorBatch(&b.batch)
                } else {
                    Appended::Batch(&b.batch, b.guard)
                };
                produce(logs, replicas, &b.tp, what, asked, turn)
            });
            let _ = reply.send(futures_util::future::join_all(produces).await);
        }
        PartitionRequest::WriteMarkers { markers, timeout_ms, reply } => {
            assert_eq!(turns.len(), markers.len(), "every marker gets an append turn");
            let appends = markers.iter().zip(turns).map(|(m, turn)| {
                let asked = Produce { epoch: m.epoch, acks: -1, timeout_ms };
                produce(logs, replicas, &m.tp, Appended::Marker(m.marker), asked, turn)
            });
            let _ = reply.send(futures_util::future::join_all(appends).await);
        }
        PartitionRequest::Fetch { reads, reply } => {
            let fetches = reads.iter().map(|r| fetch(logs, replicas, readahead, r));
            let _ = reply.send(futures_util::future::join_all(fetches).await);
        }
        PartitionRequest::ListOffsets { tp, spec, reply } => {
            let _ = reply.send(list_offsets(logs, replicas, &tp, spec).await);
        }
        PartitionRequest::EpochEnd { tp, epoch, reply } => {
            // Not from a damaged log: its epochs stop at its damage, and a follower would cut to them.
            let intact = logs.get(&tp).filter(|log| log.damage().is_none());
            let _ = reply.send(intact.and_then(|log| log.end_offset_for_epoch(epoch)));
        }
        PartitionRequest::DeleteRecords { tp, offset, reply } => {
            let _ = reply.send(delete_records(logs, replicas, &tp, offset).await);
        }
        PartitionRequest::BeginVerification { starts, reply } => {
            let _ = reply.send(txn_guards::begin(logs, replicas, &starts));
        }
        PartitionRequest::DescribeProducers { tp, reply } => {
            let _ = reply.send(producers::describe(logs, &tp));
        }
    }
}

/// The error for a partition this shard has no log for: KAFKA_STORAGE_ERROR while it is offline (its log
/// is damaged), UNKNOWN_TOPIC_OR_PARTITION when it is not here.
fn missing(logs: &LogDir<DmaFs>, tp: &TopicPartition) -> ResponseError {
    if logs.offline(tp).is_some() { ResponseError::KafkaStorageError } else { ResponseError::UnknownTopicOrPartition }
}

/// The Kafka error for a storage refusal.
pub fn kafka_error(e: &StorageError) -> ResponseError {
    use shardlog_storage::batch::BatchError;
    use shardlog_storage::producer_state::ProducerError;
    match e {
        StorageError::InvalidBatch(BatchError::TooLarge { .. }) => ResponseError::MessageTooLarge,
        StorageError::InvalidBatch(BatchError::BadMagic { .. }) => ResponseError::UnsupportedForMessageFormat,
        StorageError::InvalidBatch(_) => ResponseError::CorruptMessage,
        StorageError::OffsetOutOfRange { .. } => ResponseError::OffsetOutOfRange,
        StorageError::StaleEpoch { .. } => ResponseError::FencedLeaderEpoch,
        StorageError::Closed(_) => ResponseError::NotLeaderOrFollower,
        StorageError::Producer(e) => match e {
            ProducerError::OutOfOrderSequence { .. } => ResponseError::OutOfOrderSequenceNumber,
            ProducerError::StaleEpoch { .. } => ResponseError::InvalidProducerEpoch,
            ProducerError::NotTransactional { .. } => ResponseError::InvalidTxnState,
            ProducerError::StaleMarkerEpoch { .. } => ResponseError::InvalidProducerEpoch,
            ProducerError::CoordinatorFenced { .. } => ResponseError::TransactionCoordinatorFenced,
            // Kafka answers INVALID_TXN_STATE, which producers take for a transaction to abort. A guard
            // also goes for reasons of ours (leadership moved, the state was rebuilt, the bound): the
            // client retries NOT_ENOUGH_REPLICAS (as Kafka's leaders answer a verification that could
            // not finish), and the retry is verified afresh, which refuses a transaction that did end.
            ProducerError::Unverified { .. } => ResponseError::NotEnoughReplicas,
            _ => ResponseError::InvalidRecord,
        },
        _ => ResponseError::KafkaStorageError,
    }
}

/// What a produce asks of its partition.
#[derive(Debug, Clone, Copy)]
struct Produce {
    epoch: LeaderEpoch,
    acks: i16,
    timeout_ms: i32,
}

/// Appends a batch (or a transaction marker) as the partition's leader, then waits as `acks` asks: acks=0 not at all; acks=1 until
/// the batch is on disk (or, under Kafka's interval flush, written); acks=all until the high watermark has
/// passed it, which means it is on every in-sync replica as well.
async fn produce(
    logs: &LogDir<DmaFs>,
    replicas: &ShardReplicas,
    tp: &TopicPartition,
    what: Appended<'_>,
    asked: Produce,
    turn: AppendTurn,
) -> ProduceOutcome {
    let failed = |error| ProduceOutcome { error: Some(error), base_offset: -1, log_start_offset: -1 };
    turn.wait().await;
    let Some(log) = logs.get(tp) else { return failed(missing(logs, tp)) };
    // Refused before anything is appended (so a retry cannot duplicate it): not the leader at the epoch
    // the client was routed by, or, for acks=all, fewer in-sync replicas than min.insync.replicas.
    let epoch = match replicas.check_append(tp, asked.epoch, asked.acks == -1) {
        Ok(epoch) => epoch,
        Err(error) => return failed(error),
    };
    let appended = match what {
        Appended::Batch(batch, guard) => log.append_guarded(batch, epoch, guard).await,
        Appended::CoordinatorBatch(batch) => log.append_for_coordinator(batch, epoch).await,
        Appended::Marker(marker) => log.append_marker(marker, epoch).await,
    };
    drop(turn);
    replicas.appended_as_leader(tp);
    let info = match appended {
        Ok(info) if info.duplicate => {
            tracing::debug!(partition = %tp, base_offset = %info.base_offset, "retried batch answered with its first offsets");
            info
        }
        Ok(info) => {
            if let Appended::Batch(batch, _) | Appended::CoordinatorBatch(batch) = what {
                crate::metrics::produced(info.next_offset().0 - info.base_offset.0, batch.len() as u64);
            }
            info
        }
        Err(e) => {
            tracing::debug!(partition = %tp, error = %e, "produce refused");
            return failed(kafka_error(&e));
        }
    };
    // Followers copy the batch while the leader writes it out: the wait starts now.
    let waits = asked.acks == -1 && replicas.acks_all_waits_for_followers();
    let replicated = waits.then(|| replicas.await_ack(tp, info.next_offset(), &log));
    // Under the default policy an acknowledgement means the data is on disk here; under Kafka's interval
    // policy the append is the acknowledgement point.
    let durable = match log.config().flush {
        FlushPolicy::Always if asked.acks != 0 => log.wait_durable(info.next_offset()).await,
        FlushPolicy::Always => Ok(()),
        FlushPolicy::Interval { .. } => log.flush_if_due().await.map(|_| ()),
    };
    if let Err(e) = durable {
        if let Some(wait) = &replicated {
            replicas.forget_ack(tp, wait);
        }
        return failed(kafka_error(&e));
    }
    // The HW follows what is durable now (and retention, which stops at it).
    replicas.log_moved(tp, &log);
    if let Some(wait) = replicated {
        let limit = Duration::from_millis(asked.timeout_ms.max(0) as u64);
        let verdict = future::or(async { Some(wait.verdict.recv_async().await) }, async {
            glommio::timer::sleep(limit).await;
            None
        })
        .await;
        let error = match verdict {
            Some(Ok(Ok(()))) => None,
            Some(Ok(Err(e))) => Some(replica_error(e)),
            Some(Err(_)) => Some(ResponseError::NotLeaderOrFollower),
            None => {
                replicas.forget_ack(tp, &wait);
                Some(ResponseError::RequestTimedOut)
            }
        };
        if let Some(error) = error {
            tracing::debug!(partition = %tp, ?error, "acks=all produce not acknowledged");
            return failed(error);
        }
    }
    ProduceOutcome {
        error: None,
        base_offset: info.base_offset.as_i64(),
        log_start_offset: log.log_start_offset().as_i64(),
    }
}

async fn fetch(
    logs: &LogDir<DmaFs>,
    replicas: &ShardReplicas,
    readahead: &ReadAhead<DmaFs>,
    asked: &FetchRead,
) -> FetchOutcome {
    let FetchRead { tp, offset, max_bytes, whole_first_batch, isolation } = asked;
    let (offset, max_bytes, whole_first_batch) = (*offset, *max_bytes, *whole_first_batch);
    let Some(log) = logs.get(tp) else {
        return FetchOutcome::empty(Some(missing(logs, tp)));
    };
    // Read first: it brings the replica's HW up to date. Any news after it is news to this fetch.
    let hw = replicas.high_watermark(tp, &log);
    let news = NewsSeen::now(log.news());
    if !replicas.offsets_available(tp) {
        // KIP-207's rule, for Fetch as for ListOffsets: a new leader's HW can be below the one the
        // previous leader showed until it reaches the start of the new epoch, and a consumer must never
        // see the HW go back. Clients retry OFFSET_NOT_AVAILABLE after a backoff.
        return FetchOutcome::empty(Some(ResponseError::OffsetNotAvailable));
    }
    // Never above the HW; read_committed reads stop here.
    let lso = log.last_stable_offset().min(hw);
    let outcome = |error, records| FetchOutcome {
        error,
        records,
        high_watermark: hw.as_i64(),
        log_start_offset: log.log_start_offset().as_i64(),
        last_stable_offset: lso.as_i64(),
        aborted: Vec::new(),
        news: Some(news.clone()),
    };
    let Ok(offset) = u64::try_from(offset).map(Offset) else {
        return outcome(Some(ResponseError::OffsetOutOfRange), Bytes::new());
    };
    // A damaged log serves what lies before its damage; a read from the damage on needs the damaged
    // batch (the records after it exist, but cannot be reached): never "out of range", which would make
    // a consumer reset its position.
    if log.readable_below().is_some_and(|below| offset >= below) {
        return outcome(Some(ResponseError::KafkaStorageError), Bytes::new());
    }
    if offset > hw {
        // Beyond what consumers may see: out of range unless it is within the appended-but-unsynced tail.
        return if offset <= log.log_end_offset() {
            outcome(None, Bytes::new())
        } else {
            outcome(Some(ResponseError::OffsetOutOfRange), Bytes::new())
        };
    }
    let bound = match isolation {
        Isolation::ReadUncommitted => hw,
        Isolation::ReadCommitted => lso,
    };
    if (max_bytes == 0 && !whole_first_batch) || offset >= bound {
        // No room left in the answer, or nothing stable yet: the partition's offsets only.
        return outcome(None, Bytes::new());
    }
    let read = match readahead.take(tp, &log, offset, max_bytes, bound, whole_first_batch).await {
        Some(ahead) => Ok(ahead),
        None if whole_first_batch => log.read_until(offset, max_bytes, bound).await,
        None => log.read_until_at_most(offset, max_bytes, bound).await,
    };
    match read {
        Ok(read) => {
            readahead.after_fetch(tp, &log, &read, max_bytes, bound);
            let aborted = match isolation {
                Isolation::ReadCommitted if !read.bytes.is_empty() => log.aborted_txns(offset, read.next_offset),
                _ => Vec::new(),
            };
            FetchOutcome { aborted, ..outcome(None, read.bytes) }
        }
        Err(e) => outcome(Some(kafka_error(&e)), Bytes::new()),
    }
}

async fn list_offsets(
    logs: &LogDir<DmaFs>,
    replicas: &ShardReplicas,
    tp: &TopicPartition,
    spec: OffsetSpec,
) -> ListOutcome {
    let refused = |error| ListOutcome { error: Some(error), offset: -1, timestamp: -1 };
    let Some(log) = logs.get(tp) else { return refused(missing(logs, tp)) };
    let found = |offset: Offset| ListOutcome { error: None, offset: offset.as_i64(), timestamp: -1 };
    let hw = replicas.high_watermark(tp, &log);
    match spec {
        OffsetSpec::Earliest => found(log.log_start_offset()),
        // KIP-207: a new leader whose HW has not reached the start of its epoch could show a latest offset
        // below one the previous leader showed; clients retry this error.
        OffsetSpec::Latest | OffsetSpec::LastStable if !replicas.offsets_available(tp) => {
            refused(ResponseError::OffsetNotAvailable)
        }
        OffsetSpec::Latest => found(hw),
        OffsetSpec::LastStable => found(log.last_stable_offset().min(hw)),
        OffsetSpec::LogEnd => found(log.log_end_offset()),
        OffsetSpec::Timestamp(ts) => match log.offset_for_timestamp(ts).await {
            Ok(Some((offset, _))) if offset < hw => match first_record_at_or_after(&log, offset, ts).await {
                Some((offset, timestamp)) => ListOutcome { error: None, offset, timestamp },
                None => ListOutcome { error: None, offset: -1, timestamp: -1 },
            },
            Ok(_) => ListOutcome { error: None, offset: -1, timestamp: -1 },
            Err(e) => ListOutcome { error: Some(kafka_error(&e)), offset: -1, timestamp: -1 },
        },
    }
}

/// The storage engine finds the first batch whose newest record is at or after `ts`; Kafka answers with
/// the record itself, so the batch is decoded (decompressed if need be) to find it.
async fn first_record_at_or_after(log: &PartitionLog<DmaFs>, batch_offset: Offset, ts: i64) -> Option<(i64, i64)> {
    let read = log.read(batch_offset, 1).await.ok()?;
    let start = log.log_start_offset().as_i64();
    // Decoding sizes its record list from the count; stored counts were checked against the body on
    // append, but a very large one is still answered at batch level rather than decoded.
    let header = shardlog_storage::batch::BatchHeader::parse(&read.bytes).ok()?;
    if header.record_count > MAX_DECODED_RECORDS {
        return Some((batch_offset.as_i64().max(start), ts));
    }
    let mut bytes = read.bytes;
    match kafka_protocol::records::RecordBatchDecoder::decode(&mut bytes) {
        Ok(set) => set.records.iter().find(|r| r.timestamp >= ts && r.offset >= start).map(|r| (r.offset, r.timestamp)),
        Err(e) => {
            // Stored batches were validated on append; one that does not decode can still be pointed at.
            tracing::warn!(offset = %batch_offset, error = %e, "cannot decode a stored batch for a time lookup");
            Some((batch_offset.as_i64().max(start), ts))
        }
    }
}

async fn delete_records(
    logs: &LogDir<DmaFs>,
    replicas: &ShardReplicas,
    tp: &TopicPartition,
    offset: i64,
) -> (Option<ResponseError>, i64) {
    let Some(log) = logs.get(tp) else { return (Some(missing(logs, tp)), -1) };
    let hw = replicas.high_watermark(tp, &log);
    let target = match offset {
        -1 => hw,
        o if o >= 0 && (o as u64) <= hw.0 => Offset(o as u64),
        _ => return (Some(ResponseError::OffsetOutOfRange), log.log_start_offset().as_i64()),
    };
    match logs.delete_records(tp, target).await {
        Ok(start) => (None, start.as_i64()),
        Err(e) => (Some(kafka_error(&e)), log.log_start_offset().as_i64()),
    }
}
