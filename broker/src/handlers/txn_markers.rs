//! Transaction markers: the COMMIT or ABORT control batch a transaction coordinator has written to each
//! partition of a decided transaction (Kafka's WriteTxnMarkers). The coordinator hands its markers to
//! [`write_markers`], which writes those of partitions led here itself ([`write_markers_here`]) and sends
//! the others to their leaders over the peer protocol, all leaders at once.
//!
//! A leader answers within [`MARKERS_ANSWER_BOUND`] of getting markers, whatever happens meanwhile; a
//! coordinator on another broker waits longer than that for the answer (see `runtime::peer_calls`), so it
//! sends a marker again only once the leader has answered for the first one. A marker written twice all the
//! same (its answer lost with a connection, or its wait for the in-sync replicas timed out) is harmless: it
//! ends no transaction the second time, so the last stable offset and read_committed reads do not change
//! (Kafka appends such a marker too).

use futures_lite::future;

use super::*;
use crate::shard::MarkerAppend;
use crate::txn::TxnMarkers;

/// The longest [`write_markers_here`] takes to answer, from the moment it is called: the wait for the in-sync
/// replicas (Kafka's `request.timeout.ms`, 30 s, which Kafka's leaders wait for markers too) and the
/// completion of transactional offsets share it. Past it, what is not done is answered REQUEST_TIMED_OUT,
/// which the coordinator retries; a marker already appended stays (see the module doc). A constant, not a
/// setting: a coordinator on another broker sizes its wait for the answer by it.
pub(crate) const MARKERS_ANSWER_BOUND: Duration = Duration::from_secs(30);

/// One marker for one partition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MarkerWrite {
    pub tp: TopicPartition,
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// The epoch of the coordinator's leadership of its `__transaction_state` partition: a partition
    /// refuses markers of an older coordinator (TRANSACTION_COORDINATOR_FENCED).
    pub coordinator_epoch: i32,
    pub commit: bool,
}

/// Writes `markers` to the partitions in `left`, each through its leader; returns the partitions that
/// did not take it (to be tried again). A partition that no longer exists needs no marker.
pub(crate) async fn write_markers(
    ctx: &Arc<BrokerContext>,
    markers: &TxnMarkers,
    left: Vec<TopicPartition>,
) -> Vec<TopicPartition> {
    let image = ctx.image();
    let me = NodeId(ctx.config.node_id);
    let mut by_leader: BTreeMap<NodeId, Vec<MarkerWrite>> = BTreeMap::new();
    let mut not_led = Vec::new();
    for tp in left {
        let Some(partition) = image.partition(&tp.topic, tp.partition as i32) else { continue };
        let Some(leader) = partition.leader else {
            not_led.push(tp);
            continue;
        };
        by_leader.entry(leader).or_default().push(MarkerWrite {
            tp,
            producer_id: markers.producer_id,
            producer_epoch: markers.producer_epoch,
            coordinator_epoch: markers.coordinator_epoch,
            commit: markers.result == crate::txn::TxnResult::Commit,
        });
    }
    // Every leader at once: one that is slow or unreachable holds up only its own partitions' markers.
    let sent = by_leader.into_iter().map(|(leader, writes)| async move {
        let errors = if leader == me {
            write_markers_here(ctx, &writes).await
        } else {
            crate::runtime::peer_calls::write_markers(ctx, leader, &writes).await
        };
        (writes, errors)
    });
    let mut failed = not_led;
    for (writes, errors) in futures_util::future::join_all(sent).await {
        for (write, error) in writes.into_iter().zip(errors) {
            match error {
                None => {}
                // The partition has seen a newer epoch of the producer, or a newer coordinator of it: this
                // marker can never be written, and the newer one decides (Kafka stops sending it too).
                Some(
                    error @ (ResponseError::ProducerFenced
                    | ResponseError::InvalidProducerEpoch
                    | ResponseError::TransactionCoordinatorFenced),
                ) => {
                    tracing::info!(
                        partition = %write.tp,
                        transactional_id = markers.transactional_id,
                        ?error,
                        "transaction marker refused for good: a newer producer epoch or coordinator owns the partition's transaction"
                    );
                }
                // Retried, also UNKNOWN_TOPIC_OR_PARTITION (a leader whose log is not there yet): a partition
                // deleted meanwhile is dropped above, by the metadata.
                Some(error) => {
                    tracing::debug!(partition = %write.tp, ?error, "transaction marker not written");
                    failed.push(write.tp);
                }
            }
        }
    }
    failed
}

/// Writes markers to partitions this broker leads, each acknowledged by its in-sync replicas (as an acks=all
/// produce); the error of each, in order, within [`MARKERS_ANSWER_BOUND`]. A marker that lands on a
/// `__consumer_offsets` partition also ends the producer's pending transactional offsets there (the group
/// coordinator's TxnCompleted).
pub(crate) async fn write_markers_here(ctx: &Arc<BrokerContext>, writes: &[MarkerWrite]) -> Vec<Option<ResponseError>> {
    use shardlog_storage::txn::{MarkerKind, TxnMarker};
    let deadline = Instant::now() + MARKERS_ANSWER_BOUND;
    let image = ctx.image();
    let mut errors: Vec<Option<ResponseError>> = vec![None; writes.len()];
    let mut led: Vec<Option<crate::context::Led>> = vec![None; writes.len()];
    // Per shard: the index of each write and its append.
    let mut by_shard: BTreeMap<usize, Vec<(usize, MarkerAppend)>> = BTreeMap::new();
    for (i, write) in writes.iter().enumerate() {
        match ctx.leader_in(&image, &write.tp.topic, write.tp.partition as i32) {
            Ok(here) => {
                let marker = TxnMarker {
                    kind: if write.commit { MarkerKind::Commit } else { MarkerKind::Abort },
                    producer_id: write.producer_id,
                    producer_epoch: write.producer_epoch,
                    coordinator_epoch: write.coordinator_epoch,
                };
                let append = MarkerAppend { tp: write.tp.clone(), epoch: here.epoch, marker };
                by_shard.entry(here.shard).or_default().push((i, append));
                led[i] = Some(here);
            }
            Err(e) => errors[i] = Some(e),
        }
    }
    // The shards' own bound is the in-sync replicas' wait only (an append waits its turn and the disk
    // before it); `until` below holds the whole answer to the deadline.
    let timeout_ms = MARKERS_ANSWER_BOUND.as_millis() as i32;
    let sent: Vec<_> = by_shard
        .into_iter()
        .map(|(shard, appends)| {
            let (indexes, markers): (Vec<usize>, Vec<MarkerAppend>) = appends.into_iter().unzip();
            let (reply, outcome) = flume::bounded(1);
            let sent = ctx.shards[shard].send(PartitionRequest::WriteMarkers { markers, timeout_ms, reply });
            (indexes, sent.map(|()| outcome))
        })
        .collect();
    let mut offsets_done = Vec::new();
    for (indexes, sent) in sent {
        // The shard's outcomes, or the error all of its markers get: it went away (the broker stops), or
        // the deadline came first.
        let outcomes = match sent {
            Ok(outcome) => match until(deadline, outcome.recv_async()).await {
                Some(Ok(outcomes)) => Ok(outcomes),
                Some(Err(_)) => Err(ResponseError::NotLeaderOrFollower),
                None => Err(ResponseError::RequestTimedOut),
            },
            Err(_) => Err(ResponseError::NotLeaderOrFollower),
        };
        for (n, i) in indexes.into_iter().enumerate() {
            errors[i] = match outcomes.as_ref().map(|o| o.get(n)) {
                Ok(Some(outcome)) => {
                    if outcome.error.is_none() && writes[i].tp.topic == crate::group::OFFSETS_TOPIC {
                        offsets_done.push((i, outcome.base_offset));
                    }
                    outcome.error
                }
                Ok(None) => Some(ResponseError::NotLeaderOrFollower),
                Err(e) => Some(*e),
            };
        }
    }
    for (i, marker_offset) in offsets_done {
        let here = led[i].as_ref().expect("a marker written here was led here");
        let completed = until(deadline, complete_offsets(ctx, &writes[i], here, marker_offset)).await;
        if let Err(e) = completed.unwrap_or(Err(ResponseError::RequestTimedOut)) {
            // The marker is in the log; the coordinator reads it there when it loads the partition again.
            tracing::debug!(partition = %writes[i].tp, ?e, "transactional offsets not completed");
            errors[i] = Some(e);
        }
    }
    errors
}

/// `work`, unless `deadline` comes first.
async fn until<T>(deadline: Instant, work: impl Future<Output = T>) -> Option<T> {
    future::or(async { Some(work.await) }, async {
        glommio::timer::sleep(deadline.saturating_duration_since(Instant::now())).await;
        None
    })
    .await
}

/// Tells the group coordinator of a `__consumer_offsets` partition that `write`'s marker landed at
/// `marker_offset`, asking again while the partition's groups are loading (the caller bounds the time).
/// NOT_COORDINATOR (it moved, or is not loaded) needs nothing: a coordinator that loads the partition
/// meets the marker in the log.
async fn complete_offsets(
    ctx: &BrokerContext,
    write: &MarkerWrite,
    here: &crate::context::Led,
    marker_offset: i64,
) -> Result<(), ResponseError> {
    use crate::group::call::CoordinatorRequest;
    loop {
        let (reply, answer) = flume::bounded(1);
        let request = CoordinatorRequest::TxnCompleted {
            partition: write.tp.partition as i32,
            epoch: here.epoch,
            producer_id: write.producer_id,
            commit: write.commit,
            marker_offset,
            reply,
        };
        ctx.groups[here.shard].send_async(request).await.map_err(|_| ResponseError::CoordinatorNotAvailable)?;
        match answer.recv_async().await.map_err(|_| ResponseError::CoordinatorNotAvailable)? {
            Ok(()) | Err(ResponseError::NotCoordinator) => return Ok(()),
            Err(ResponseError::CoordinatorLoadInProgress) => {
                glommio::timer::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

/// WriteTxnMarkers v1, as a coordinator of another Kafka-speaking tool sends it (`kafka-transactions.sh
/// abort` does, for a hanging transaction): each marker written to each partition, which must be led here.
pub(super) async fn write_txn_markers(
    ctx: &Arc<BrokerContext>,
    req: kafka_protocol::messages::WriteTxnMarkersRequest,
) -> kafka_protocol::messages::WriteTxnMarkersResponse {
    use kafka_protocol::messages::WriteTxnMarkersResponse;
    use kafka_protocol::messages::write_txn_markers_response::{
        WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
    };
    let mut results = Vec::with_capacity(req.markers.len());
    for marker in req.markers {
        let mut writes = Vec::new();
        // Per (topic, partition) in the request's order: an error decided here, or the index of its write.
        let mut answers: Vec<(TopicName, i32, Result<usize, ResponseError>)> = Vec::new();
        for topic in &marker.topics {
            for &partition in &topic.partition_indexes {
                let led = u32::try_from(partition).map_err(|_| ResponseError::UnknownTopicOrPartition).and_then(|_| {
                    ctx.leader_here(topic.name.0.as_str(), partition).map_err(|e| match e {
                        ResponseError::UnknownTopicOrPartition => e,
                        _ => ResponseError::NotLeaderOrFollower,
                    })
                });
                let answer = led.map(|_| {
                    writes.push(MarkerWrite {
                        tp: TopicPartition::new(topic.name.0.to_string(), partition as u32),
                        producer_id: marker.producer_id.0,
                        producer_epoch: marker.producer_epoch,
                        coordinator_epoch: marker.coordinator_epoch,
                        commit: marker.transaction_result,
                    });
                    writes.len() - 1
                });
                answers.push((topic.name.clone(), partition, answer));
            }
        }
        let written = write_markers_here(ctx, &writes).await;
        let mut topics: Vec<WritableTxnMarkerTopicResult> = Vec::new();
        for (name, partition, answer) in answers {
            let error = match answer {
                Ok(i) => written.get(i).copied().flatten(),
                Err(e) => Some(e),
            };
            let result = WritableTxnMarkerPartitionResult::default()
                .with_partition_index(partition)
                .with_error_code(error.map_or(0, |e| e.code()));
            match topics.last_mut() {
                Some(last) if last.name == name => last.partitions.push(result),
                _ => topics.push(WritableTxnMarkerTopicResult::default().with_name(name).with_partitions(vec![result])),
            }
        }
        results.push(WritableTxnMarkerResult::default().with_producer_id(marker.producer_id).with_topics(topics));
    }
    WriteTxnMarkersResponse::default().with_markers(results)
}
