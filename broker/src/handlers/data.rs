//! Partition data: Produce, Fetch, ListOffsets, DeleteRecords and OffsetForLeaderEpoch, each routed to
//! the shards owning the partitions and merged into one answer.

use super::txn_verify::TxnVerdicts;
use super::*;
use crate::shard::{FetchRead, NewsSeen, ProduceBatch};
use crate::shutdown::Shutdown;
use crate::topics::configs::Compression;
use crate::topics::recompress::{RecompressError, recompress};
use crate::topics::records::keyless_records;
use bytes::Bytes;
use futures_lite::future;
use kafka_protocol::messages::ProducerId;
use kafka_protocol::messages::fetch_response::AbortedTransaction;
use kafka_protocol::messages::produce_response::BatchIndexAndErrorMessage;
use shardlog_storage::batch::{BatchError, BatchHeader};
use shardlog_storage::log::Isolation;

/// A produce request whose batches have been handed to their shards, waiting for the outcomes.
#[derive(Debug)]
pub struct DispatchedProduce {
    acks: i16,
    /// Each partition of the request in its order: where its outcome comes from.
    pending: Vec<(TopicName, i32, Result<Slot, Refused>)>,
    replies: ShardReplies<ProduceOutcome>,
}

/// Why a partition's batch was refused before it reached its shard. From Produce v8 (KIP-467) the answer
/// may name the records at fault by their index in the batch and say why in words; clients then fail
/// those records with the error and the batch's others as "part of a batch with invalid records".
#[derive(Debug)]
struct Refused {
    error: ResponseError,
    records: Vec<BatchIndexAndErrorMessage>,
    message: Option<StrBytes>,
}

impl From<ResponseError> for Refused {
    fn from(error: ResponseError) -> Refused {
        Refused { error, records: Vec::new(), message: None }
    }
}

impl Refused {
    /// INVALID_RECORD for the records of a batch without a key, sent to compacted `tp`.
    fn keyless(tp: &TopicPartition, keyless: &[i32], in_batch: usize) -> Refused {
        let why = format!(
            "a record without a key in compacted topic partition {tp}: compaction keeps the latest record of each key"
        );
        let records = keyless
            .iter()
            .map(|&index| {
                BatchIndexAndErrorMessage::default()
                    .with_batch_index(index)
                    .with_batch_index_error_message(Some(StrBytes::from_string(why.clone())))
            })
            .collect();
        let message = format!("{} of the batch's {in_batch} records refused: {why}", keyless.len());
        Refused { error: ResponseError::InvalidRecord, records, message: Some(StrBytes::from_string(message)) }
    }
}

/// Where an item's outcome comes from: its shard's reply, at `index`.
#[derive(Debug, Clone, Copy)]
struct Slot {
    shard: usize,
    index: usize,
}

/// The items of one request (a produce's batches, a fetch's reads) split by the shard that owns them, so
/// that each shard gets its share in one message and answers it in one reply.
struct ByShard<T>(Vec<Vec<T>>);

impl<T> ByShard<T> {
    fn new(shards: usize) -> ByShard<T> {
        ByShard((0..shards).map(|_| Vec::new()).collect())
    }

    /// Adds an item for `shard`; its outcome will be at the slot returned.
    fn push(&mut self, shard: usize, item: T) -> Slot {
        let items = &mut self.0[shard];
        items.push(item);
        Slot { shard, index: items.len() - 1 }
    }

    /// Sends each shard with items its share, made into a request by `request`, without waiting.
    fn send<O>(
        self,
        ctx: &BrokerContext,
        request: impl Fn(Vec<T>, flume::Sender<Vec<O>>) -> PartitionRequest,
    ) -> ShardReplies<O> {
        let replies = self.0.into_iter().enumerate().map(|(shard, items)| {
            (!items.is_empty()).then(|| {
                let (reply, outcomes) = flume::bounded(1);
                // Shard channels are unbounded: the requests in flight are bounded per connection instead.
                ctx.shards[shard]
                    .send(request(items, reply))
                    .map(|()| outcomes)
                    .map_err(|_| ResponseError::KafkaStorageError)
            })
        });
        ShardReplies(replies.collect())
    }
}

/// By shard, for the shards a request went to: the reply with their outcomes in the order sent, or why
/// the shard could not be reached.
#[derive(Debug)]
struct ShardReplies<O>(Vec<Option<Result<flume::Receiver<Vec<O>>, ResponseError>>>);

impl<O> ShardReplies<O> {
    /// Every shard's outcomes by shard, indexed by [`Slot`]; a shard that dropped the request answers none.
    async fn gather(self) -> Vec<Result<Vec<Option<O>>, ResponseError>> {
        let mut gathered = Vec::with_capacity(self.0.len());
        for reply in self.0 {
            gathered.push(match reply {
                Some(Ok(reply)) => Ok(reply.recv_async().await.unwrap_or_default().into_iter().map(Some).collect()),
                Some(Err(e)) => Err(e),
                None => Ok(Vec::new()),
            });
        }
        gathered
    }
}

/// The outcome at `slot` of what [`ShardReplies::gather`] returned: `None` if its shard dropped the
/// request, the send's error if it could not be reached.
fn take_outcome<O>(
    gathered: &mut [Result<Vec<Option<O>>, ResponseError>],
    slot: Slot,
    failed: impl FnOnce(ResponseError) -> O,
) -> Option<O> {
    match &mut gathered[slot.shard] {
        Ok(outcomes) => outcomes.get_mut(slot.index).and_then(Option::take),
        Err(e) => Some(failed(*e)),
    }
}

/// Hands every batch of a produce request to the shard owning its partition, without waiting: nothing in
/// here awaits, so the batches of requests dispatched one after another reach each shard in that order,
/// and each shard appends a partition's batches in the order they arrive. A shard gets all of its batches
/// of the request in one message, and answers them in one.
///
/// A partition whose transactional batch `verdicts` refuses ([`super::txn_verify`]) gets that error, and
/// its batch goes nowhere.
pub fn dispatch_produce(ctx: &Arc<BrokerContext>, req: ProduceRequest, verdicts: &TxnVerdicts) -> DispatchedProduce {
    let acks = req.acks;
    let mut pending = Vec::new();
    let mut by_shard = ByShard::new(ctx.shards.len());
    let image = ctx.image();
    for topic in req.topic_data {
        let name = topic.name.0.as_str().to_string();
        let compression = ctx.compression(&image, &name);
        let compacted = ctx.compacted(&image, &name);
        for partition in topic.partition_data {
            let slot = if ![-1, 0, 1].contains(&acks) {
                Err(ResponseError::InvalidRequiredAcks.into())
            } else if crate::topics::is_internal(&name) {
                // Only the broker writes there (the group and transaction coordinators).
                Err(ResponseError::InvalidTopicException.into())
            } else if let Some(refused) = verdicts.refusal(&name, partition.index, partition.records.as_deref()) {
                Err(refused.into())
            } else {
                let tp = TopicPartition::new(name.clone(), partition.index as u32);
                match (ctx.leader_in(&image, &name, partition.index), partition.records) {
                    // The disk is nearly full: refused before anything is written, retriable.
                    (Ok(_), Some(_)) if ctx.disk.below_floor() => Err(ResponseError::KafkaStorageError.into()),
                    (Ok(led), Some(batch)) => stored_form(&tp, batch, compression, compacted).map(|batch| {
                        let guard = verdicts.guard(&name, partition.index);
                        by_shard.push(
                            led.shard,
                            ProduceBatch { tp, batch, epoch: led.epoch, from_coordinator: false, guard },
                        )
                    }),
                    (Ok(_), None) => Err(ResponseError::CorruptMessage.into()),
                    (Err(e), _) => Err(e.into()),
                }
            };
            pending.push((topic.name.clone(), partition.index, slot));
        }
    }
    let timeout_ms = req.timeout_ms;
    let replies = by_shard.send(ctx, |batches, reply| PartitionRequest::Produce { batches, acks, timeout_ms, reply });
    DispatchedProduce { acks, pending, replies }
}

impl DispatchedProduce {
    /// The answer once every partition has replied; `None` for acks=0 (Kafka sends nothing back).
    pub async fn answer(self) -> Option<ProduceResponse> {
        let mut outcomes = self.replies.gather().await;
        let failed = |error| ProduceOutcome { error: Some(error), base_offset: -1, log_start_offset: -1 };
        let mut by_topic: Vec<TopicProduceResponse> = Vec::new();
        for (name, index, slot) in self.pending {
            // A shard that is gone answers KAFKA_STORAGE_ERROR for every batch it had.
            let (outcome, refused) = match slot {
                Ok(slot) => (
                    take_outcome(&mut outcomes, slot, failed)
                        .unwrap_or_else(|| failed(ResponseError::KafkaStorageError)),
                    None,
                ),
                Err(refused) => (failed(refused.error), Some(refused)),
            };
            let (record_errors, error_message) = refused.map(|r| (r.records, r.message)).unwrap_or_default();
            let partition = PartitionProduceResponse::default()
                .with_index(index)
                .with_error_code(code(outcome.error))
                .with_base_offset(outcome.base_offset)
                .with_log_append_time_ms(-1)
                .with_log_start_offset(outcome.log_start_offset)
                .with_record_errors(record_errors)
                .with_error_message(error_message);
            match by_topic.iter_mut().find(|t| t.name == name) {
                Some(t) => t.partition_responses.push(partition),
                None => by_topic
                    .push(TopicProduceResponse::default().with_name(name).with_partition_responses(vec![partition])),
            }
        }
        (self.acks != 0).then(|| ProduceResponse::default().with_responses(by_topic))
    }
}

/// The batch as the topic stores it: as sent, or recompressed into the topic's `compression.type`. A
/// compacted topic refuses a batch with a record without a key whole (INVALID_RECORD), naming each such
/// record, as Kafka does.
fn stored_form(tp: &TopicPartition, batch: Bytes, compression: Compression, compacted: bool) -> Result<Bytes, Refused> {
    if compacted {
        match keyless_records(&batch) {
            Ok(keyless) if keyless.is_empty() => {}
            Ok(keyless) => {
                let records = BatchHeader::parse(&batch).map_or(0, |h| h.record_count.max(0) as usize);
                return Err(Refused::keyless(tp, &keyless, records));
            }
            // The log's own checks name what is wrong with it (a bad CRC, a wrong count).
            Err(RecompressError::Invalid(_)) => {}
            Err(RecompressError::TooLarge) => return Err(ResponseError::MessageTooLarge.into()),
            Err(_) => return Err(ResponseError::CorruptMessage.into()),
        }
    }
    let Compression::Codec(target) = compression else { return Ok(batch) };
    match recompress(&batch, target) {
        Ok(None) => Ok(batch),
        Ok(Some(recompressed)) => Ok(recompressed),
        Err(e) => {
            tracing::debug!(error = %e, "batch not recompressed; produce refused");
            Err(match e {
                RecompressError::TooLarge => ResponseError::MessageTooLarge,
                RecompressError::Invalid(BatchError::BadMagic { .. }) => ResponseError::UnsupportedForMessageFormat,
                _ => ResponseError::CorruptMessage,
            }
            .into())
        }
    }
}

/// Kafka's default `fetch.max.bytes`: the most one Fetch answer carries (at least one batch is always sent).
pub const FETCH_MAX_BYTES: usize = 57_671_680;

pub(super) async fn fetch(ctx: &Arc<BrokerContext>, req: FetchRequest) -> FetchResponse {
    let deadline = Instant::now() + Duration::from_millis(req.max_wait_ms.clamp(0, 60_000) as u64);
    let min_bytes = req.min_bytes.max(0) as usize;
    let (mut held, mut expired) = (false, false);
    loop {
        // Before the read: a partition that stops being led here meanwhile is news.
        let leadership = NewsSeen::now(ctx.quorum.leadership_news());
        let read_at = Instant::now();
        let (response, bytes, mut seen) = fetch_once(ctx, &req).await;
        seen.push(leadership);
        let any_error = response.responses.iter().flat_map(|t| &t.partitions).any(|p| p.error_code != 0);
        let enough = bytes >= min_bytes || any_error;
        if enough || expired || Instant::now() >= deadline || ctx.shutdown.is_triggered() {
            if held {
                crate::metrics::fetch_held(expired || !enough);
            }
            return response;
        }
        // Kafka's delayed fetch: held until one of its partitions has news, then read again; at
        // max.wait.ms read once more and answer with what is there.
        held = true;
        expired = !news_or_deadline(&seen, deadline, &ctx.shutdown).await;
        if !expired && min_bytes > 1 {
            // Each new record is news, and a fetch that waits for many would otherwise read all its
            // partitions again for each; paced as the fetches were before they waited for news.
            let next = (read_at + MIN_BYTES_RECHECK).min(deadline);
            if let Some(pause) = next.checked_duration_since(Instant::now()) {
                glommio::timer::sleep(pause).await;
            }
        }
    }
}

/// The least time between two reads of a fetch held for `fetch.min.bytes` above one.
const MIN_BYTES_RECHECK: Duration = Duration::from_millis(5);

/// Returns true when one of `seen` has news since its read (a new high watermark, a new leader, the log
/// closed); false at `deadline` or when the broker stops. Listens before it looks, so news that lands in
/// between still wakes it.
async fn news_or_deadline(seen: &[NewsSeen], deadline: Instant, shutdown: &Shutdown) -> bool {
    let mut listeners: Vec<_> = seen.iter().map(|s| s.news.listen()).collect();
    if seen.iter().any(NewsSeen::moved) {
        return true;
    }
    let Some(left) = deadline.checked_duration_since(Instant::now()) else { return false };
    let news = std::future::poll_fn(|cx| {
        for listener in &mut listeners {
            if std::pin::Pin::new(listener).poll(cx).is_ready() {
                return std::task::Poll::Ready(true);
            }
        }
        std::task::Poll::Pending
    });
    let end = async {
        future::or(glommio::timer::sleep(left), shutdown.wait()).await;
        false
    };
    future::or(news, end).await
}

/// The fetch's `isolation_level`: 1 is read_committed (consumers' `isolation.level`), anything else reads
/// up to the high watermark.
fn isolation(req: &FetchRequest) -> Isolation {
    if req.isolation_level == 1 { Isolation::ReadCommitted } else { Isolation::ReadUncommitted }
}

/// Partitions of one fetch being read at once, at most, when their limits together exceed the answer's.
const FETCH_READS_IN_FLIGHT: usize = 32;

/// One read of every partition a Fetch asks for: the answer, its record bytes, and where to listen for
/// news of the partitions read.
pub(super) async fn fetch_once(ctx: &Arc<BrokerContext>, req: &FetchRequest) -> (FetchResponse, usize, Vec<NewsSeen>) {
    let limit = if req.max_bytes <= 0 { FETCH_MAX_BYTES } else { (req.max_bytes as usize).min(FETCH_MAX_BYTES) };
    let asked = req.topics.iter().flat_map(|t| &t.partitions).map(|p| p.partition_max_bytes.max(0) as usize);
    let (partitions, asked_bytes) = asked.fold((0usize, 0usize), |(n, bytes), b| (n + 1, bytes.saturating_add(b)));
    let outcomes = if asked_bytes <= limit && partitions <= FETCH_READS_IN_FLIGHT {
        read_together(ctx, req).await
    } else {
        read_within(ctx, req, limit).await
    };
    let total = outcomes.iter().flatten().map(|o| o.records.len()).sum();
    let seen = outcomes.iter().flatten().filter_map(|o| o.news.clone()).collect();
    let mut outcomes = outcomes.into_iter();
    let mut topics = Vec::new();
    for topic in &req.topics {
        let mut partitions = Vec::new();
        for p in &topic.partitions {
            let outcome = outcomes
                .next()
                .expect("one outcome per partition asked")
                .unwrap_or_else(|| FetchOutcome::empty(Some(ResponseError::UnknownTopicOrPartition)));
            // read_committed answers name the aborted transactions in the records (possibly none);
            // read_uncommitted answers have no list at all, as Kafka's.
            let aborted = (isolation(req) == Isolation::ReadCommitted).then(|| {
                outcome
                    .aborted
                    .iter()
                    .map(|a| {
                        AbortedTransaction::default()
                            .with_producer_id(ProducerId(a.producer_id))
                            .with_first_offset(a.first_offset.as_i64())
                    })
                    .collect()
            });
            partitions.push(
                PartitionData::default()
                    .with_partition_index(p.partition)
                    .with_error_code(code(outcome.error))
                    .with_high_watermark(outcome.high_watermark)
                    .with_last_stable_offset(outcome.last_stable_offset)
                    .with_log_start_offset(outcome.log_start_offset)
                    .with_aborted_transactions(aborted)
                    .with_preferred_read_replica(BrokerId(-1))
                    .with_records(Some(outcome.records)),
            );
        }
        topics.push(FetchableTopicResponse::default().with_topic(topic.topic.clone()).with_partitions(partitions));
    }
    (FetchResponse::default().with_responses(topics), total, seen)
}

/// Every partition read at once, each shard's reads in one message: when the partitions' limits together
/// fit in the answer, none can take another's room, so each is read up to its own limit. For at most
/// `FETCH_READS_IN_FLIGHT` partitions, as many reads as the other path has under way at most.
async fn read_together(ctx: &Arc<BrokerContext>, req: &FetchRequest) -> Vec<Option<FetchOutcome>> {
    let mut by_shard = ByShard::new(ctx.shards.len());
    let mut slots = Vec::new();
    for topic in &req.topics {
        let name = topic.topic.0.as_str();
        for p in &topic.partitions {
            let whole_first_batch = slots.is_empty();
            slots.push(ctx.leader_here(name, p.partition).map(|led| {
                let tp = TopicPartition::new(name.to_string(), p.partition as u32);
                let max_bytes = p.partition_max_bytes.max(0) as usize;
                let isolation = isolation(req);
                by_shard
                    .push(led.shard, FetchRead { tp, offset: p.fetch_offset, max_bytes, whole_first_batch, isolation })
            }));
        }
    }
    let mut gathered = by_shard.send(ctx, |reads, reply| PartitionRequest::Fetch { reads, reply }).gather().await;
    // As on the other path: a shard that cannot be reached is KAFKA_STORAGE_ERROR, and one that drops the
    // reads leaves its partitions unknown.
    let failed = |error| FetchOutcome::empty(Some(error));
    slots
        .into_iter()
        .map(|slot| match slot {
            Ok(slot) => take_outcome(&mut gathered, slot, failed),
            Err(e) => Some(failed(e)),
        })
        .collect()
}

/// The partitions read several at once when their limits together exceed the answer's `limit` (Kafka's
/// fetch.max.bytes, which bounds what one answer holds whatever the client asks for, filled in request
/// order). Each is promised up to its partition limit out of what is not yet promised; when nothing is
/// left to promise, the oldest read is settled first and what it did not use goes on to the next
/// partitions. Only the first partition may go over (by one batch), so that the consumer always makes
/// progress. So the bytes read for one answer stay within the limit plus one batch, however the request
/// is made, and a partition gets nothing only when the answer is full.
async fn read_within(ctx: &Arc<BrokerContext>, req: &FetchRequest, limit: usize) -> Vec<Option<FetchOutcome>> {
    let mut unpromised = limit;
    type Reply = Result<flume::Receiver<Vec<FetchOutcome>>, ResponseError>;
    let mut pending: std::collections::VecDeque<(usize, Reply)> = std::collections::VecDeque::new();
    let mut outcomes: Vec<Option<FetchOutcome>> = Vec::new();
    // A read's outcome, and what it did not use of what it was promised back to be promised again.
    async fn settle(promised: usize, reply: Reply, unpromised: &mut usize) -> Option<FetchOutcome> {
        let outcome = match reply {
            Ok(reply) => reply.recv_async().await.ok().and_then(|mut outcomes| outcomes.pop()),
            Err(e) => Some(FetchOutcome::empty(Some(e))),
        };
        let used = outcome.as_ref().map_or(0, |o| o.records.len());
        *unpromised += promised.saturating_sub(used);
        outcome
    }
    let mut index = 0usize;
    for topic in &req.topics {
        let name = topic.topic.0.as_str().to_string();
        for p in &topic.partitions {
            while pending.len() == FETCH_READS_IN_FLIGHT || (unpromised == 0 && !pending.is_empty()) {
                let (promised, reply) = pending.pop_front().expect("a read in flight");
                outcomes.push(settle(promised, reply, &mut unpromised).await);
            }
            let whole_first_batch = index == 0;
            index += 1;
            let max_bytes = (p.partition_max_bytes.max(0) as usize).min(unpromised);
            unpromised -= max_bytes;
            let reply = ctx.leader_here(&name, p.partition).and_then(|led| {
                let (reply, outcome) = flume::bounded(1);
                let tp = TopicPartition::new(name.clone(), p.partition as u32);
                let isolation = isolation(req);
                let reads = vec![FetchRead { tp, offset: p.fetch_offset, max_bytes, whole_first_batch, isolation }];
                let request = PartitionRequest::Fetch { reads, reply };
                ctx.shards[led.shard].send(request).map(|()| outcome).map_err(|_| ResponseError::KafkaStorageError)
            });
            pending.push_back((max_bytes, reply));
        }
    }
    for (promised, reply) in pending {
        outcomes.push(settle(promised, reply, &mut unpromised).await);
    }
    outcomes
}

/// ListOffsets' `replica_id` for tools that read a replica's own offsets (Kafka's
/// `DEBUGGING_REPLICA_ID`): earliest and latest come from this broker's replica, latest as its log end.
const DEBUGGING_REPLICA: i32 = -2;

pub(super) async fn list_offsets(
    ctx: &Arc<BrokerContext>,
    req: ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    let mut topics = Vec::new();
    for topic in &req.topics {
        let name = topic.name.0.as_str().to_string();
        let mut partitions = Vec::new();
        for p in &topic.partitions {
            let spec = match p.timestamp {
                -2 => Some(OffsetSpec::Earliest),
                // read_committed consumers' "latest" is the last stable offset.
                -1 if req.isolation_level == 1 => Some(OffsetSpec::LastStable),
                -1 => Some(OffsetSpec::Latest),
                ts if ts >= 0 => Some(OffsetSpec::Timestamp(ts)),
                _ => None,
            };
            let led = ctx.leader_here(&name, p.partition_index);
            let failed = |error| ListOutcome { error: Some(error), offset: -1, timestamp: -1 };
            let outcome = match (led, spec) {
                // Kafka's debugging replica id: this broker's own replica answers, whether it leads or not.
                (_, Some(spec @ (OffsetSpec::Earliest | OffsetSpec::Latest)))
                    if req.replica_id.0 == DEBUGGING_REPLICA =>
                {
                    let spec = if spec == OffsetSpec::Latest { OffsetSpec::LogEnd } else { spec };
                    match ctx.replica_here(&name, p.partition_index) {
                        Ok(shard) => {
                            let tp = TopicPartition::new(name.clone(), p.partition_index as u32);
                            ask_shard(ctx, shard, |reply| PartitionRequest::ListOffsets { tp, spec, reply })
                                .await
                                .unwrap_or_else(|| failed(ResponseError::KafkaStorageError))
                        }
                        Err(e) => failed(e),
                    }
                }
                (Ok(led), Some(spec)) => {
                    let tp = TopicPartition::new(name.clone(), p.partition_index as u32);
                    ask_shard(ctx, led.shard, |reply| PartitionRequest::ListOffsets { tp, spec, reply })
                        .await
                        .unwrap_or_else(|| failed(ResponseError::KafkaStorageError))
                }
                (Ok(_), None) => failed(ResponseError::InvalidRequest),
                (Err(e), _) => failed(e),
            };
            let mut answer = ListOffsetsPartitionResponse::default()
                .with_partition_index(p.partition_index)
                .with_error_code(code(outcome.error))
                .with_offset(outcome.offset)
                .with_timestamp(outcome.timestamp);
            // The leader epoch is in the answer from v4 on; the codec refuses it earlier.
            if version >= 4
                && outcome.error.is_none()
                && let Ok(led) = led
            {
                answer.leader_epoch = led.epoch.0;
            }
            partitions.push(answer);
        }
        topics.push(ListOffsetsTopicResponse::default().with_name(topic.name.clone()).with_partitions(partitions));
    }
    ListOffsetsResponse::default().with_topics(topics)
}

pub(super) async fn delete_records(ctx: &Arc<BrokerContext>, req: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let mut topics = Vec::new();
    for topic in &req.topics {
        let name = topic.name.0.as_str().to_string();
        let mut partitions = Vec::new();
        for p in &topic.partitions {
            let (error, low_watermark) = match ctx.leader_here(&name, p.partition_index) {
                Ok(led) => {
                    let tp = TopicPartition::new(name.clone(), p.partition_index as u32);
                    ask_shard(ctx, led.shard, |reply| PartitionRequest::DeleteRecords { tp, offset: p.offset, reply })
                        .await
                        .unwrap_or((Some(ResponseError::KafkaStorageError), -1))
                }
                Err(e) => (Some(e), -1),
            };
            partitions.push(
                DeleteRecordsPartitionResult::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(code(error))
                    .with_low_watermark(low_watermark),
            );
        }
        topics.push(DeleteRecordsTopicResult::default().with_name(topic.name.clone()).with_partitions(partitions));
    }
    DeleteRecordsResponse::default().with_topics(topics)
}

pub(super) async fn offset_for_leader_epoch(
    ctx: &Arc<BrokerContext>,
    req: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let mut topics = Vec::new();
    for topic in &req.topics {
        let name = topic.topic.0.as_str().to_string();
        let mut partitions = Vec::new();
        for p in &topic.partitions {
            let answer =
                EpochEndOffset::default().with_partition(p.partition).with_leader_epoch(-1).with_end_offset(-1);
            let answer = match ctx.leader_here(&name, p.partition) {
                Err(e) => answer.with_error_code(e.code()),
                // The client's view of the leader epoch must be ours (-1: it has none).
                Ok(led) if p.current_leader_epoch > led.epoch.0 => {
                    answer.with_error_code(ResponseError::UnknownLeaderEpoch.code())
                }
                Ok(led) if p.current_leader_epoch >= 0 && p.current_leader_epoch < led.epoch.0 => {
                    answer.with_error_code(ResponseError::FencedLeaderEpoch.code())
                }
                Ok(led) => {
                    let tp = TopicPartition::new(name.clone(), p.partition as u32);
                    let epoch = LeaderEpoch(p.leader_epoch);
                    match ask_shard(ctx, led.shard, |reply| PartitionRequest::EpochEnd { tp, epoch, reply }).await {
                        Some(Some((epoch, end))) => answer.with_leader_epoch(epoch.0).with_end_offset(end.as_i64()),
                        Some(None) => answer,
                        None => answer.with_error_code(ResponseError::KafkaStorageError.code()),
                    }
                }
            };
            partitions.push(answer);
        }
        topics.push(OffsetForLeaderTopicResult::default().with_topic(topic.topic.clone()).with_partitions(partitions));
    }
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}
