//! Request handlers: one function per API, from a decoded request to a response body.
//!
//! Only what is implemented is listed in [`supported_apis`]; the codec refuses everything else before a
//! handler sees it. Partition work is sent to the owning shard ([`crate::shard`]); topic changes go to
//! shard 0, which applies them one at a time ([`admin`]); the security metadata's APIs are in `security`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::{CreatableTopicConfigs, CreatableTopicResult};
use kafka_protocol::messages::delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, ApiKey, BrokerId, CreatePartitionsRequest, CreatePartitionsResponse,
    CreateTopicsRequest, CreateTopicsResponse, DeleteRecordsRequest, DeleteRecordsResponse, DeleteTopicsRequest,
    DeleteTopicsResponse, DescribeClusterResponse, DescribeConfigsRequest, DescribeConfigsResponse, FetchRequest,
    FetchResponse, IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, ListOffsetsRequest,
    ListOffsetsResponse, MetadataRequest, MetadataResponse, OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse,
    ProduceRequest, ProduceResponse, RequestKind, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use shardlog_net::kafka::{DecodedRequest, SupportedApis};
use shardlog_storage::{LeaderEpoch, TopicPartition};

mod admin;
mod cluster;
mod consumer_groups;
mod coordinators;
mod data;
mod describe_producers;
mod elect;
mod groups;
mod internal_topics;
mod producers;
mod reassign;
mod security;
pub(crate) mod transactions;
pub(crate) mod txn_markers;
mod txn_verify;

pub use admin::admin;
use admin::*;
use cluster::*;
use consumer_groups::*;
use coordinators::*;
use data::*;
pub use data::{DispatchedProduce, FETCH_MAX_BYTES, dispatch_produce};
use groups::*;
use producers::*;
pub use txn_verify::{TxnVerdicts, verify_transactional};

pub use crate::context::{AdminRequest, BrokerContext, ConfigChange, Led, ask_shard};
use crate::metadata::image::MetadataImage;
use crate::quorum::state::NodeId;
use crate::security::session::ClientInfo;
use crate::shard::{FetchOutcome, ListOutcome, OffsetSpec, PartitionRequest, ProduceOutcome};
use crate::topics::configs::TopicConfig;

/// The APIs and versions this broker serves. Grows with each handler.
pub fn supported_apis() -> SupportedApis {
    SupportedApis::new(&[
        // v12 belongs to transaction.version 2 (KIP-890 part 2), which is not served: a producer in a
        // transaction must stay at v11 or below, so none is offered.
        (ApiKey::Produce, 3, 11),
        (ApiKey::Fetch, 4, 12),
        // v7 and v8 add special timestamps (-3 max timestamp, -4 earliest local) not served yet.
        (ApiKey::ListOffsets, 1, 6),
        (ApiKey::Metadata, 0, 12),
        (ApiKey::ApiVersions, 0, 4),
        // Answered by the connection on SASL listeners (`crate::runtime`); elsewhere ILLEGAL_SASL_STATE.
        (ApiKey::SaslHandshake, 0, 1),
        (ApiKey::SaslAuthenticate, 0, 2),
        (ApiKey::CreateTopics, 2, 7),
        (ApiKey::DeleteTopics, 1, 6),
        (ApiKey::DeleteRecords, 0, 2),
        (ApiKey::DescribeConfigs, 1, 4),
        (ApiKey::CreatePartitions, 0, 3),
        (ApiKey::OffsetForLeaderEpoch, 2, 4),
        (ApiKey::DescribeCluster, 0, 2),
        (ApiKey::AlterConfigs, 0, 2),
        (ApiKey::IncrementalAlterConfigs, 0, 1),
        (ApiKey::ElectLeaders, 0, 2),
        (ApiKey::AlterPartitionReassignments, 0, 1),
        (ApiKey::ListPartitionReassignments, 0, 0),
        // v6 adds two-phase commit transactions.
        (ApiKey::InitProducerId, 0, 5),
        // Transactions, `transaction.version` 1: AddPartitionsToTxn v4-5 are brokers' verify-only calls
        // (here the peer protocol's), EndTxn v5 and TxnOffsetCommit v5 KIP-890 part 2.
        (ApiKey::AddPartitionsToTxn, 0, 3),
        (ApiKey::AddOffsetsToTxn, 0, 4),
        (ApiKey::EndTxn, 0, 4),
        (ApiKey::DescribeTransactions, 0, 0),
        (ApiKey::ListTransactions, 0, 1),
        (ApiKey::WriteTxnMarkers, 1, 1),
        // KIP-664's operator tools: each partition leader's producers and open transactions.
        (ApiKey::DescribeProducers, 0, 0),
        (ApiKey::FindCoordinator, 0, 6),
        (ApiKey::JoinGroup, 0, 9),
        (ApiKey::SyncGroup, 0, 5),
        (ApiKey::Heartbeat, 0, 4),
        (ApiKey::LeaveGroup, 0, 5),
        (ApiKey::OffsetCommit, 2, 9),
        // v5 belongs to KIP-890's second part (the coordinator verifies the transaction itself).
        (ApiKey::TxnOffsetCommit, 0, 4),
        (ApiKey::OffsetFetch, 1, 9),
        (ApiKey::ListGroups, 0, 5),
        (ApiKey::DescribeGroups, 0, 6),
        (ApiKey::DeleteGroups, 0, 2),
        (ApiKey::OffsetDelete, 0, 0),
        // KIP-848's consumer protocol; librdkafka 2.12 speaks heartbeat v1 only.
        (ApiKey::ConsumerGroupHeartbeat, 0, 1),
        (ApiKey::ConsumerGroupDescribe, 0, 1),
        // The security metadata (KIP-554, KIP-546, ACLs); kafka-protocol 0.18 decodes the ACL APIs from
        // v1 (Kafka 4 dropped v0).
        (ApiKey::DescribeUserScramCredentials, 0, 0),
        (ApiKey::AlterUserScramCredentials, 0, 0),
        (ApiKey::CreateAcls, 1, 3),
        (ApiKey::DescribeAcls, 1, 3),
        (ApiKey::DeleteAcls, 1, 3),
        (ApiKey::DescribeClientQuotas, 0, 1),
        (ApiKey::AlterClientQuotas, 0, 1),
    ])
}

/// Answers a decoded request from `client`; `None` for requests Kafka does not answer (produce with
/// acks=0).
pub async fn handle(ctx: &Arc<BrokerContext>, request: DecodedRequest, client: &ClientInfo) -> Option<ResponseKind> {
    let version = request.version;
    let listener = &*client.listener;
    Some(match request.body {
        RequestKind::FindCoordinator(req) => {
            ResponseKind::FindCoordinator(find_coordinator(ctx, req, version, listener).await)
        }
        RequestKind::JoinGroup(req) => {
            let client_id = request.header.client_id.as_ref().map_or("", |c| c.as_str());
            ResponseKind::JoinGroup(join_group(ctx, req, version, client_id, &client.member_host()).await)
        }
        RequestKind::ConsumerGroupHeartbeat(req) => {
            let client_id = request.header.client_id.as_ref().map_or("", |c| c.as_str());
            let host = client.member_host();
            ResponseKind::ConsumerGroupHeartbeat(consumer_group_heartbeat(ctx, req, version, client_id, &host).await)
        }
        RequestKind::ConsumerGroupDescribe(req) => {
            ResponseKind::ConsumerGroupDescribe(consumer_group_describe(ctx, req).await)
        }
        RequestKind::SyncGroup(req) => ResponseKind::SyncGroup(sync_group(ctx, req).await),
        RequestKind::Heartbeat(req) => ResponseKind::Heartbeat(heartbeat(ctx, req).await),
        RequestKind::LeaveGroup(req) => ResponseKind::LeaveGroup(leave_group(ctx, req, version).await),
        RequestKind::OffsetCommit(req) => ResponseKind::OffsetCommit(offset_commit(ctx, req).await),
        RequestKind::TxnOffsetCommit(req) => ResponseKind::TxnOffsetCommit(txn_offset_commit(ctx, req).await),
        RequestKind::OffsetFetch(req) => ResponseKind::OffsetFetch(offset_fetch(ctx, req, version).await),
        RequestKind::ListGroups(req) => ResponseKind::ListGroups(list_groups(ctx, req).await),
        RequestKind::DescribeGroups(req) => ResponseKind::DescribeGroups(describe_groups(ctx, req, version).await),
        RequestKind::DeleteGroups(req) => ResponseKind::DeleteGroups(delete_groups(ctx, req).await),
        RequestKind::OffsetDelete(req) => ResponseKind::OffsetDelete(offset_delete(ctx, req).await),
        RequestKind::ApiVersions(_) => ResponseKind::ApiVersions(ctx.apis.api_versions_response(0)),
        // A listener without SASL has nothing to authenticate (Kafka answers the same).
        RequestKind::SaslHandshake(_) => ResponseKind::SaslHandshake(
            kafka_protocol::messages::SaslHandshakeResponse::default()
                .with_error_code(ResponseError::IllegalSaslState.code()),
        ),
        RequestKind::SaslAuthenticate(_) => ResponseKind::SaslAuthenticate(
            kafka_protocol::messages::SaslAuthenticateResponse::default()
                .with_error_code(ResponseError::IllegalSaslState.code())
                .with_error_message(Some(StrBytes::from_static_str("this listener does not use SASL"))),
        ),
        RequestKind::Metadata(req) => ResponseKind::Metadata(metadata(ctx, &req, version, client).await),
        RequestKind::CreateTopics(req) => ResponseKind::CreateTopics(create_topics(ctx, req).await),
        RequestKind::Produce(req) => {
            let verdicts = Box::pin(verify_transactional(ctx, &req, version)).await;
            return dispatch_produce(ctx, req, &verdicts).answer().await.map(ResponseKind::Produce);
        }
        RequestKind::Fetch(req) => ResponseKind::Fetch(fetch(ctx, req).await),
        RequestKind::ListOffsets(req) => ResponseKind::ListOffsets(list_offsets(ctx, req, version).await),
        RequestKind::DeleteTopics(req) => ResponseKind::DeleteTopics(delete_topics(ctx, req).await),
        RequestKind::CreatePartitions(req) => ResponseKind::CreatePartitions(create_partitions(ctx, req).await),
        RequestKind::DeleteRecords(req) => ResponseKind::DeleteRecords(delete_records(ctx, req).await),
        RequestKind::DescribeConfigs(req) => ResponseKind::DescribeConfigs(describe_configs(ctx, req, version)),
        RequestKind::OffsetForLeaderEpoch(req) => {
            ResponseKind::OffsetForLeaderEpoch(offset_for_leader_epoch(ctx, req).await)
        }
        RequestKind::DescribeCluster(_) => ResponseKind::DescribeCluster(describe_cluster(ctx, listener)),
        RequestKind::AlterConfigs(req) => ResponseKind::AlterConfigs(alter_configs(ctx, req).await),
        RequestKind::IncrementalAlterConfigs(req) => {
            ResponseKind::IncrementalAlterConfigs(incremental_alter_configs(ctx, req).await)
        }
        RequestKind::InitProducerId(req) => ResponseKind::InitProducerId(init_producer_id(ctx, req, version).await),
        RequestKind::AddPartitionsToTxn(req) => {
            ResponseKind::AddPartitionsToTxn(transactions::add_partitions_to_txn(ctx, req, version).await)
        }
        RequestKind::AddOffsetsToTxn(req) => {
            ResponseKind::AddOffsetsToTxn(transactions::add_offsets_to_txn(ctx, req, version).await)
        }
        RequestKind::EndTxn(req) => ResponseKind::EndTxn(transactions::end_txn(ctx, req, version).await),
        RequestKind::DescribeTransactions(req) => {
            ResponseKind::DescribeTransactions(transactions::describe_transactions(ctx, req).await)
        }
        RequestKind::ListTransactions(req) => {
            ResponseKind::ListTransactions(transactions::list_transactions(ctx, req).await)
        }
        RequestKind::WriteTxnMarkers(req) => {
            ResponseKind::WriteTxnMarkers(txn_markers::write_txn_markers(ctx, req).await)
        }
        RequestKind::DescribeProducers(req) => {
            ResponseKind::DescribeProducers(describe_producers::describe_producers(ctx, req).await)
        }
        RequestKind::ElectLeaders(req) => ResponseKind::ElectLeaders(elect::elect_leaders(ctx, req).await),
        RequestKind::AlterPartitionReassignments(req) => {
            ResponseKind::AlterPartitionReassignments(reassign::alter_partition_reassignments(ctx, req).await)
        }
        RequestKind::ListPartitionReassignments(req) => {
            ResponseKind::ListPartitionReassignments(reassign::list_partition_reassignments(ctx, req))
        }
        RequestKind::DescribeUserScramCredentials(req) => {
            ResponseKind::DescribeUserScramCredentials(security::describe_user_scram_credentials(ctx, req))
        }
        RequestKind::AlterUserScramCredentials(req) => {
            ResponseKind::AlterUserScramCredentials(security::alter_user_scram_credentials(ctx, req).await)
        }
        RequestKind::CreateAcls(req) => ResponseKind::CreateAcls(security::create_acls(ctx, req).await),
        RequestKind::DescribeAcls(req) => ResponseKind::DescribeAcls(security::describe_acls(ctx, req)),
        RequestKind::DeleteAcls(req) => ResponseKind::DeleteAcls(security::delete_acls(ctx, req).await),
        RequestKind::DescribeClientQuotas(req) => {
            ResponseKind::DescribeClientQuotas(security::describe_client_quotas(ctx, req))
        }
        RequestKind::AlterClientQuotas(req) => {
            ResponseKind::AlterClientQuotas(security::alter_client_quotas(ctx, req).await)
        }
        other => unreachable!("the codec admitted an API without a handler: {other:?}"),
    })
}

fn code(error: Option<ResponseError>) -> i16 {
    error.map_or(0, |e| e.code())
}

fn topic_name(name: &str) -> TopicName {
    TopicName(StrBytes::from_string(name.to_string()))
}
