//! What a request handler asks of the transaction coordinator on the shard that owns a transactional id's
//! `__transaction_state` partition, and what it answers. Plain values and reply channels, so that the
//! broker's shared context can hold the channels without knowing the coordinator.

use kafka_protocol::ResponseError;
use shardlog_storage::{LeaderEpoch, TopicPartition};

use super::{InitProducerId, ProducerIdAndEpoch, Reply, TxnMetadata, TxnResult, TxnState};

/// A request to a shard's transaction coordinator.
#[derive(Debug)]
pub enum TxnRequest {
    /// For one transactional id, to the coordinator of `partition` (which the handler found led here at
    /// `epoch`).
    Call { partition: i32, epoch: LeaderEpoch, op: TxnOp },
    /// ListTransactions: the ids of every partition this shard coordinates.
    List { reply: flume::Sender<Result<Vec<TxnListing>, ResponseError>> },
}

/// The answer of a request that changes an id.
pub type TxnReply = flume::Sender<Result<Reply, ResponseError>>;

#[derive(Debug)]
pub enum TxnOp {
    /// `fresh_producer_id`: an id no producer ever had, taken by the handler beforehand in case the
    /// coordinator needs one (a new transactional id, or an exhausted epoch); `None` if none could be had.
    InitProducerId {
        req: InitProducerId,
        fresh_producer_id: Option<i64>,
        reply: TxnReply,
    },
    AddPartitions {
        transactional_id: String,
        producer: ProducerIdAndEpoch,
        partitions: Vec<TopicPartition>,
        reply: TxnReply,
    },
    AddOffsets {
        transactional_id: String,
        producer: ProducerIdAndEpoch,
        offsets_partition: u32,
        reply: TxnReply,
    },
    EndTxn {
        transactional_id: String,
        producer: ProducerIdAndEpoch,
        result: TxnResult,
        reply: TxnReply,
    },
    /// KIP-890 part 1: whether each partition is in the producer's ongoing transaction. Changes nothing.
    Verify {
        transactional_id: String,
        producer: ProducerIdAndEpoch,
        partitions: Vec<TopicPartition>,
        reply: flume::Sender<Vec<Result<(), ResponseError>>>,
    },
    /// DescribeTransactions: the id's committed metadata, `None` if the id is unknown.
    Describe {
        transactional_id: String,
        reply: flume::Sender<Result<Option<TxnMetadata>, ResponseError>>,
    },
}

impl TxnOp {
    /// Answers the request with `error` without handling it.
    pub fn refuse(self, error: ResponseError) {
        match self {
            TxnOp::InitProducerId { reply, .. }
            | TxnOp::AddPartitions { reply, .. }
            | TxnOp::AddOffsets { reply, .. }
            | TxnOp::EndTxn { reply, .. } => {
                let _ = reply.send(Err(error));
            }
            TxnOp::Verify { partitions, reply, .. } => {
                let _ = reply.send(vec![Err(error); partitions.len()]);
            }
            TxnOp::Describe { reply, .. } => {
                let _ = reply.send(Err(error));
            }
        }
    }
}

/// A transactional id as ListTransactions shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxnListing {
    pub transactional_id: String,
    pub producer_id: i64,
    pub state: TxnState,
    /// When its open transaction began (wall ms), -1 if none is open.
    pub txn_start_ms: i64,
}
