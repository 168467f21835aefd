use std::sync::Arc;

use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::{Gate, authorize_request, may_auto_create_topic};
use crate::handlers::supported_apis;
use crate::security::authorizer::acl::{AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType};
use crate::security::authorizer::{Authorizer, AuthorizerConfig, RequestContext};

const TOPIC_DENIED: i16 = 29;
const GROUP_DENIED: i16 = 30;
const CLUSTER_DENIED: i16 = 31;
const TXN_DENIED: i16 = 53;

/// The APIs being added beside the handlers' (SASL, SCRAM credentials, ACLs, client quotas), with the
/// version the samples use.
const ADDED_APIS: &[(ApiKey, i16)] = &[
    (ApiKey::SaslHandshake, 1),
    (ApiKey::SaslAuthenticate, 2),
    (ApiKey::DescribeUserScramCredentials, 0),
    (ApiKey::AlterUserScramCredentials, 0),
    (ApiKey::CreateAcls, 3),
    (ApiKey::DescribeAcls, 3),
    (ApiKey::DeleteAcls, 3),
    (ApiKey::DescribeClientQuotas, 1),
    (ApiKey::AlterClientQuotas, 1),
];

fn s(text: &str) -> StrBytes {
    StrBytes::from_string(text.to_string())
}

fn topic(name: &str) -> TopicName {
    TopicName(s(name))
}

fn group(name: &str) -> GroupId {
    GroupId(s(name))
}

fn nobody() -> RequestContext {
    RequestContext { principal: "User:nobody".into(), host: "10.0.0.1".parse().expect("an address") }
}

fn alice() -> RequestContext {
    RequestContext { principal: "User:alice".into(), host: "10.0.0.1".parse().expect("an address") }
}

fn allow(rt: ResourceType, name: &str, pt: PatternType, op: AclOperation) -> AclBinding {
    AclBinding::from_codes(rt.code(), name, pt.code(), "User:alice", "*", op.code(), AclPermissionType::Allow.code())
        .expect("a valid ACL")
}

fn authorizer(acls: Vec<AclBinding>) -> Arc<Authorizer> {
    Arc::new(Authorizer::new(&AuthorizerConfig::default(), acls))
}

/// A request of `api` naming one topic `t` (partition 0), one group `g`, one user or one ACL, as fits.
fn sample(api: ApiKey) -> RequestKind {
    use ApiKey as K;
    match api {
        K::Produce => RequestKind::Produce(ProduceRequest::default().with_acks(1).with_topic_data(vec![
                produce_request::TopicProduceData::default()
                    .with_name(topic("t"))
                    .with_partition_data(vec![produce_request::PartitionProduceData::default().with_index(0)]),
            ])),
        K::Fetch => RequestKind::Fetch(FetchRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![
            fetch_request::FetchTopic::default()
                .with_topic(topic("t"))
                .with_partitions(vec![fetch_request::FetchPartition::default().with_partition(0)]),
        ])),
        K::ListOffsets => {
            RequestKind::ListOffsets(ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![
                list_offsets_request::ListOffsetsTopic::default()
                    .with_name(topic("t"))
                    .with_partitions(vec![list_offsets_request::ListOffsetsPartition::default()]),
            ]))
        }
        K::Metadata => RequestKind::Metadata(
            MetadataRequest::default()
                .with_topics(Some(vec![metadata_request::MetadataRequestTopic::default().with_name(Some(topic("t")))])),
        ),
        K::ApiVersions => RequestKind::ApiVersions(ApiVersionsRequest::default()),
        K::CreateTopics => RequestKind::CreateTopics(
            CreateTopicsRequest::default()
                .with_topics(vec![create_topics_request::CreatableTopic::default().with_name(topic("t"))]),
        ),
        K::DeleteTopics => RequestKind::DeleteTopics(
            DeleteTopicsRequest::default()
                .with_topics(vec![delete_topics_request::DeleteTopicState::default().with_name(Some(topic("t")))])
                .with_topic_names(vec![topic("t")]),
        ),
        K::DeleteRecords => RequestKind::DeleteRecords(DeleteRecordsRequest::default().with_topics(vec![
            delete_records_request::DeleteRecordsTopic::default()
                .with_name(topic("t"))
                .with_partitions(vec![delete_records_request::DeleteRecordsPartition::default()]),
        ])),
        K::DescribeConfigs => RequestKind::DescribeConfigs(DescribeConfigsRequest::default().with_resources(vec![
                describe_configs_request::DescribeConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s("t")),
            ])),
        K::CreatePartitions => RequestKind::CreatePartitions(
            CreatePartitionsRequest::default()
                .with_topics(vec![create_partitions_request::CreatePartitionsTopic::default().with_name(topic("t"))]),
        ),
        K::OffsetForLeaderEpoch => {
            RequestKind::OffsetForLeaderEpoch(OffsetForLeaderEpochRequest::default().with_topics(vec![
                offset_for_leader_epoch_request::OffsetForLeaderTopic::default()
                    .with_topic(topic("t"))
                    .with_partitions(vec![offset_for_leader_epoch_request::OffsetForLeaderPartition::default()]),
            ]))
        }
        K::DescribeCluster => RequestKind::DescribeCluster(DescribeClusterRequest::default()),
        K::AlterConfigs => RequestKind::AlterConfigs(AlterConfigsRequest::default().with_resources(vec![
            alter_configs_request::AlterConfigsResource::default().with_resource_type(2).with_resource_name(s("t")),
        ])),
        K::IncrementalAlterConfigs => {
            RequestKind::IncrementalAlterConfigs(IncrementalAlterConfigsRequest::default().with_resources(vec![
                incremental_alter_configs_request::AlterConfigsResource::default()
                    .with_resource_type(2)
                    .with_resource_name(s("t")),
            ]))
        }
        K::ElectLeaders => RequestKind::ElectLeaders(ElectLeadersRequest::default().with_topic_partitions(Some(vec![
            elect_leaders_request::TopicPartitions::default().with_topic(topic("t")).with_partitions(vec![0]),
        ]))),
        K::AlterPartitionReassignments => {
            RequestKind::AlterPartitionReassignments(AlterPartitionReassignmentsRequest::default().with_topics(vec![
                alter_partition_reassignments_request::ReassignableTopic::default()
                    .with_name(topic("t"))
                    .with_partitions(vec![alter_partition_reassignments_request::ReassignablePartition::default()]),
            ]))
        }
        K::ListPartitionReassignments => {
            RequestKind::ListPartitionReassignments(ListPartitionReassignmentsRequest::default())
        }
        K::InitProducerId => RequestKind::InitProducerId(InitProducerIdRequest::default().with_transactional_id(None)),
        K::FindCoordinator => {
            RequestKind::FindCoordinator(FindCoordinatorRequest::default().with_coordinator_keys(vec![s("g")]))
        }
        K::JoinGroup => RequestKind::JoinGroup(JoinGroupRequest::default().with_group_id(group("g"))),
        K::SyncGroup => RequestKind::SyncGroup(SyncGroupRequest::default().with_group_id(group("g"))),
        K::Heartbeat => RequestKind::Heartbeat(HeartbeatRequest::default().with_group_id(group("g"))),
        K::LeaveGroup => RequestKind::LeaveGroup(LeaveGroupRequest::default().with_group_id(group("g"))),
        K::OffsetCommit => RequestKind::OffsetCommit(offset_commit(&["t"])),
        K::TxnOffsetCommit => RequestKind::TxnOffsetCommit(txn_offset_commit(&["t"])),
        K::OffsetFetch => RequestKind::OffsetFetch(OffsetFetchRequest::default().with_groups(vec![
            offset_fetch_request::OffsetFetchRequestGroup::default().with_group_id(group("g")).with_topics(Some(vec![
                offset_fetch_request::OffsetFetchRequestTopics::default()
                    .with_name(topic("t"))
                    .with_partition_indexes(vec![0]),
            ])),
        ])),
        K::ListGroups => RequestKind::ListGroups(ListGroupsRequest::default()),
        K::DescribeGroups => {
            RequestKind::DescribeGroups(DescribeGroupsRequest::default().with_groups(vec![group("g")]))
        }
        K::DeleteGroups => {
            RequestKind::DeleteGroups(DeleteGroupsRequest::default().with_groups_names(vec![group("g")]))
        }
        K::OffsetDelete => {
            RequestKind::OffsetDelete(OffsetDeleteRequest::default().with_group_id(group("g")).with_topics(vec![
                offset_delete_request::OffsetDeleteRequestTopic::default()
                    .with_name(topic("t"))
                    .with_partitions(vec![offset_delete_request::OffsetDeleteRequestPartition::default()]),
            ]))
        }
        K::ConsumerGroupHeartbeat => {
            RequestKind::ConsumerGroupHeartbeat(ConsumerGroupHeartbeatRequest::default().with_group_id(group("g")))
        }
        K::ConsumerGroupDescribe => {
            RequestKind::ConsumerGroupDescribe(ConsumerGroupDescribeRequest::default().with_group_ids(vec![group("g")]))
        }
        K::SaslHandshake => RequestKind::SaslHandshake(SaslHandshakeRequest::default().with_mechanism(s("PLAIN"))),
        K::SaslAuthenticate => RequestKind::SaslAuthenticate(SaslAuthenticateRequest::default()),
        K::DescribeUserScramCredentials => {
            RequestKind::DescribeUserScramCredentials(DescribeUserScramCredentialsRequest::default().with_users(Some(
                vec![describe_user_scram_credentials_request::UserName::default().with_name(s("alice"))],
            )))
        }
        K::AlterUserScramCredentials => {
            RequestKind::AlterUserScramCredentials(AlterUserScramCredentialsRequest::default().with_upsertions(vec![
                alter_user_scram_credentials_request::ScramCredentialUpsertion::default().with_name(s("alice")),
            ]))
        }
        K::CreateAcls => RequestKind::CreateAcls(
            CreateAclsRequest::default().with_creations(vec![create_acls_request::AclCreation::default()]),
        ),
        K::DescribeAcls => RequestKind::DescribeAcls(DescribeAclsRequest::default()),
        K::DeleteAcls => RequestKind::DeleteAcls(
            DeleteAclsRequest::default().with_filters(vec![delete_acls_request::DeleteAclsFilter::default()]),
        ),
        K::DescribeClientQuotas => RequestKind::DescribeClientQuotas(DescribeClientQuotasRequest::default()),
        K::AlterClientQuotas => RequestKind::AlterClientQuotas(
            AlterClientQuotasRequest::default().with_entries(vec![alter_client_quotas_request::EntryData::default()]),
        ),
        K::AddPartitionsToTxn => RequestKind::AddPartitionsToTxn(
            AddPartitionsToTxnRequest::default()
                .with_v3_and_below_transactional_id(TransactionalId(s("tx")))
                .with_v3_and_below_topics(vec![
                    add_partitions_to_txn_request::AddPartitionsToTxnTopic::default()
                        .with_name(topic("t"))
                        .with_partitions(vec![0]),
                ]),
        ),
        K::AddOffsetsToTxn => RequestKind::AddOffsetsToTxn(
            AddOffsetsToTxnRequest::default().with_transactional_id(TransactionalId(s("tx"))).with_group_id(group("g")),
        ),
        K::EndTxn => RequestKind::EndTxn(EndTxnRequest::default().with_transactional_id(TransactionalId(s("tx")))),
        K::DescribeTransactions => RequestKind::DescribeTransactions(
            DescribeTransactionsRequest::default().with_transactional_ids(vec![TransactionalId(s("tx"))]),
        ),
        K::ListTransactions => RequestKind::ListTransactions(ListTransactionsRequest::default()),
        K::WriteTxnMarkers => RequestKind::WriteTxnMarkers(WriteTxnMarkersRequest::default().with_markers(vec![
            write_txn_markers_request::WritableTxnMarker::default().with_topics(vec![
                write_txn_markers_request::WritableTxnMarkerTopic::default()
                    .with_name(topic("t"))
                    .with_partition_indexes(vec![0]),
            ]),
        ])),
        K::DescribeProducers => RequestKind::DescribeProducers(DescribeProducersRequest::default().with_topics(vec![
            describe_producers_request::TopicRequest::default().with_name(topic("t")).with_partition_indexes(vec![0]),
        ])),
        other => panic!("no sample request for {other:?}: add one (and its rule)"),
    }
}

fn offset_commit(topics: &[&str]) -> OffsetCommitRequest {
    OffsetCommitRequest::default().with_group_id(group("g")).with_topics(
        topics
            .iter()
            .map(|t| {
                offset_commit_request::OffsetCommitRequestTopic::default()
                    .with_name(topic(t))
                    .with_partitions(vec![offset_commit_request::OffsetCommitRequestPartition::default()])
            })
            .collect(),
    )
}

fn txn_offset_commit(topics: &[&str]) -> TxnOffsetCommitRequest {
    TxnOffsetCommitRequest::default()
        .with_transactional_id(TransactionalId(s("tx")))
        .with_group_id(group("g"))
        .with_topics(
            topics
                .iter()
                .map(|t| {
                    txn_offset_commit_request::TxnOffsetCommitRequestTopic::default()
                        .with_name(topic(t))
                        .with_partitions(vec![txn_offset_commit_request::TxnOffsetCommitRequestPartition::default()])
                })
                .collect(),
        )
}

/// What Kafka answers a principal without ACLs for each API.
#[derive(Debug, PartialEq)]
enum Expected {
    /// Not checked: handled as asked.
    Unchecked,
    /// Handled, with what may not be seen left out of the response.
    Filtered,
    /// Refused, answered with this error code.
    Error(i16),
    /// Handled with nothing left to do but the parts of the answer that are not about the items (the
    /// brokers in Metadata); the answer carries this error code for each item.
    HandledWithError(i16),
}

fn expected(api: ApiKey) -> Expected {
    use ApiKey as K;
    match api {
        K::ApiVersions | K::SaslHandshake | K::SaslAuthenticate | K::DescribeCluster => Expected::Unchecked,
        K::ListGroups | K::ListTransactions => Expected::Filtered,
        K::AddPartitionsToTxn | K::AddOffsetsToTxn | K::EndTxn | K::DescribeTransactions => Expected::Error(TXN_DENIED),
        K::Metadata => Expected::HandledWithError(TOPIC_DENIED),
        K::Produce
        | K::Fetch
        | K::ListOffsets
        | K::DescribeProducers
        | K::CreateTopics
        | K::DeleteTopics
        | K::DeleteRecords
        | K::DescribeConfigs
        | K::CreatePartitions
        | K::OffsetForLeaderEpoch
        | K::AlterConfigs
        | K::IncrementalAlterConfigs => Expected::Error(TOPIC_DENIED),
        K::FindCoordinator
        | K::JoinGroup
        | K::SyncGroup
        | K::Heartbeat
        | K::LeaveGroup
        | K::OffsetCommit
        | K::OffsetFetch
        | K::DescribeGroups
        | K::DeleteGroups
        | K::OffsetDelete
        | K::ConsumerGroupHeartbeat
        | K::ConsumerGroupDescribe => Expected::Error(GROUP_DENIED),
        K::ElectLeaders
        | K::AlterPartitionReassignments
        | K::ListPartitionReassignments
        | K::InitProducerId
        | K::WriteTxnMarkers
        | K::DescribeUserScramCredentials
        | K::AlterUserScramCredentials
        | K::CreateAcls
        | K::DescribeAcls
        | K::DeleteAcls
        | K::DescribeClientQuotas
        | K::AlterClientQuotas => Expected::Error(CLUSTER_DENIED),
        // The transactional id is checked first.
        K::TxnOffsetCommit => Expected::Error(TXN_DENIED),
        other => panic!("no expectation for {other:?}: add what Kafka answers for it"),
    }
}

/// Every API the broker serves or is getting, with the highest version the samples use.
fn every_api() -> Vec<(ApiKey, i16)> {
    let served = supported_apis().api_versions_response(0).api_keys;
    let mut apis: Vec<(ApiKey, i16)> =
        served.iter().map(|a| (ApiKey::try_from(a.api_key).expect("a known API key"), a.max_version)).collect();
    apis.extend_from_slice(ADDED_APIS);
    apis
}

#[test]
fn every_api_is_denied_with_kafkas_error_for_a_principal_without_acls() {
    let authorizer = authorizer(vec![]);
    let apis = every_api();
    assert!(apis.len() >= 40, "the served APIs and the added ones: {}", apis.len());
    for (api, version) in apis {
        let request = sample(api);
        let gate = authorize_request(&nobody(), &authorizer, request.clone(), version);
        match (expected(api), gate) {
            (Expected::Unchecked, Gate::Handle { request: handled, merge }) => {
                assert_eq!(handled, request, "{api:?} is passed unchanged");
                assert!(!merge.has_denials(), "{api:?}");
            }
            (Expected::Filtered, Gate::Handle { request: handled, merge }) if api == ApiKey::ListTransactions => {
                assert_eq!(handled, request, "{api:?}");
                let listed = ListTransactionsResponse::default().with_transaction_states(vec![
                    list_transactions_response::TransactionState::default()
                        .with_transactional_id(TransactionalId(s("tx"))),
                ]);
                let ResponseKind::ListTransactions(r) = merge.finish(ResponseKind::ListTransactions(listed)) else {
                    panic!("a ListTransactions response");
                };
                assert!(r.transaction_states.is_empty(), "the id is left out of ListTransactions");
            }
            (Expected::Filtered, Gate::Handle { request: handled, merge }) => {
                assert_eq!(handled, request, "{api:?}");
                let listed = ListGroupsResponse::default()
                    .with_groups(vec![list_groups_response::ListedGroup::default().with_group_id(group("g"))]);
                let ResponseKind::ListGroups(r) = merge.finish(ResponseKind::ListGroups(listed)) else {
                    panic!("a ListGroups response");
                };
                assert!(r.groups.is_empty(), "the group is left out of ListGroups");
            }
            (Expected::HandledWithError(error), Gate::Handle { request: RequestKind::Metadata(handled), merge }) => {
                assert_eq!(handled.topics, Some(vec![]), "{api:?}: nothing left to look up");
                let response = merge.finish(ResponseKind::Metadata(MetadataResponse::default()));
                let ResponseKind::Metadata(r) = response else { panic!("a Metadata response") };
                let answered: Vec<_> = r.topics.iter().map(|t| (t.name.clone(), t.error_code)).collect();
                assert_eq!(answered, vec![(Some(topic("t")), error)], "{api:?}");
            }
            (Expected::Error(error), Gate::Answer(response)) => {
                let text = format!("{response:?}");
                assert!(text.contains(&format!("error_code: {error},")), "{api:?} answers {error}: {text}");
                for other in [TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED, TXN_DENIED].iter().filter(|e| **e != error) {
                    assert!(!text.contains(&format!("error_code: {other},")), "{api:?} answers only {error}: {text}");
                }
            }
            (expected, gate) => panic!("{api:?}: expected {expected:?}, got {gate:?}"),
        }
    }
}

#[test]
fn every_api_passes_unchanged_for_a_super_user() {
    let config = AuthorizerConfig { super_users: vec!["User:nobody".into()], allow_everyone_if_no_acl_found: false };
    let authorizer = Arc::new(Authorizer::new(&config, vec![]));
    for (api, version) in every_api() {
        let request = sample(api);
        match authorize_request(&nobody(), &authorizer, request.clone(), version) {
            Gate::Handle { request: handled, merge } => {
                assert_eq!(handled, request, "{api:?}");
                assert!(!merge.has_denials(), "{api:?}");
            }
            other => panic!("{api:?} refused for a super user: {other:?}"),
        }
    }
}

fn produce(topics: &[(&str, &[i32])], acks: i16) -> ProduceRequest {
    ProduceRequest::default().with_acks(acks).with_topic_data(
        topics
            .iter()
            .map(|(name, partitions)| {
                produce_request::TopicProduceData::default().with_name(topic(name)).with_partition_data(
                    partitions
                        .iter()
                        .map(|p| produce_request::PartitionProduceData::default().with_index(*p))
                        .collect(),
                )
            })
            .collect(),
    )
}

#[test]
fn produce_partly_denied_answers_denied_topics_per_partition() {
    let authorizer = authorizer(vec![allow(ResourceType::Topic, "ok", PatternType::Literal, AclOperation::Write)]);
    let request = produce(&[("ok", &[0, 1]), ("bad", &[0, 2])], 1);
    let Gate::Handle { request: RequestKind::Produce(handled), merge } =
        authorize_request(&alice(), &authorizer, RequestKind::Produce(request), 12)
    else {
        panic!("a partly allowed produce is handled");
    };
    assert_eq!(handled, produce(&[("ok", &[0, 1])], 1));
    assert!(merge.has_denials());
    let appended =
        produce_response::TopicProduceResponse::default().with_name(topic("ok")).with_partition_responses(vec![
            produce_response::PartitionProduceResponse::default().with_index(0).with_base_offset(7),
        ]);
    let ResponseKind::Produce(r) =
        merge.finish(ResponseKind::Produce(ProduceResponse::default().with_responses(vec![appended.clone()])))
    else {
        panic!("a produce response");
    };
    assert_eq!(r.responses[0], appended, "the handler's answer is kept");
    let bad = &r.responses[1];
    assert_eq!(bad.name, topic("bad"));
    let partitions: Vec<(i32, i16, i64)> =
        bad.partition_responses.iter().map(|p| (p.index, p.error_code, p.base_offset)).collect();
    assert_eq!(partitions, vec![(0, TOPIC_DENIED, -1), (2, TOPIC_DENIED, -1)]);
}

#[test]
fn produce_with_acks_zero_and_a_denied_topic_closes_the_connection() {
    let authorizer = authorizer(vec![allow(ResourceType::Topic, "ok", PatternType::Literal, AclOperation::Write)]);
    let request = RequestKind::Produce(produce(&[("ok", &[0]), ("bad", &[0])], 0));
    assert!(matches!(authorize_request(&alice(), &authorizer, request, 12), Gate::Close));
}

#[test]
fn transactional_produce_needs_write_on_the_transactional_id() {
    // A v2 batch with the transactional attribute (bit 4 of the attributes' low byte).
    let mut batch = vec![0u8; 8];
    batch.extend_from_slice(&49i32.to_be_bytes());
    batch.extend_from_slice(&[0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0x10]);
    batch.resize(61, 0);
    let mut request = produce(&[("t", &[0])], -1);
    request.topic_data[0].partition_data[0].records = Some(batch.into());
    request.transactional_id = Some(TransactionalId(s("tx")));
    let topic_only = authorizer(vec![allow(ResourceType::Topic, "t", PatternType::Literal, AclOperation::Write)]);
    let Gate::Answer(ResponseKind::Produce(r)) =
        authorize_request(&alice(), &topic_only, RequestKind::Produce(request.clone()), 12)
    else {
        panic!("refused whole");
    };
    assert_eq!(r.responses[0].partition_responses[0].error_code, 53);
    let both = authorizer(vec![
        allow(ResourceType::Topic, "t", PatternType::Literal, AclOperation::Write),
        allow(ResourceType::TransactionalId, "tx", PatternType::Literal, AclOperation::Write),
    ]);
    assert!(matches!(
        authorize_request(&alice(), &both, RequestKind::Produce(request), 12),
        Gate::Handle { merge, .. } if !merge.has_denials()
    ));
}

#[test]
fn transaction_coordinator_lookup_needs_describe_on_the_transactional_id_not_on_a_group() {
    const TXN_DENIED: i16 = 53;
    let authorizer = authorizer(vec![
        allow(ResourceType::TransactionalId, "tx-ok", PatternType::Literal, AclOperation::Describe),
        // A group of the same name grants nothing on the transactional id.
        allow(ResourceType::Group, "tx-other", PatternType::Literal, AclOperation::Describe),
    ]);
    let batched =
        FindCoordinatorRequest::default().with_key_type(1).with_coordinator_keys(vec![s("tx-ok"), s("tx-other")]);
    let Gate::Handle { request: RequestKind::FindCoordinator(handled), merge } =
        authorize_request(&alice(), &authorizer, RequestKind::FindCoordinator(batched), 4)
    else {
        panic!("the allowed key is handled");
    };
    assert_eq!(handled.coordinator_keys, vec![s("tx-ok")]);
    let ResponseKind::FindCoordinator(r) =
        merge.finish(ResponseKind::FindCoordinator(FindCoordinatorResponse::default()))
    else {
        panic!("a FindCoordinator answer");
    };
    let denied: Vec<(&str, i16)> = r.coordinators.iter().map(|c| (c.key.as_str(), c.error_code)).collect();
    assert_eq!(denied, vec![("tx-other", TXN_DENIED)]);

    let single = FindCoordinatorRequest::default().with_key_type(1).with_key(s("tx-other"));
    let Gate::Answer(ResponseKind::FindCoordinator(r)) =
        authorize_request(&alice(), &authorizer, RequestKind::FindCoordinator(single), 3)
    else {
        panic!("a denied single key is answered at once");
    };
    assert_eq!((r.error_code, r.node_id.0), (TXN_DENIED, -1));
}

fn metadata_topics(names: &[&str]) -> Vec<metadata_response::MetadataResponseTopic> {
    names.iter().map(|n| metadata_response::MetadataResponseTopic::default().with_name(Some(topic(n)))).collect()
}

#[test]
fn metadata_for_all_topics_leaves_out_undescribable_ones() {
    let authorizer = authorizer(vec![allow(ResourceType::Topic, "a", PatternType::Prefixed, AclOperation::Read)]);
    for (request, version) in
        [(MetadataRequest::default().with_topics(None), 12), (MetadataRequest::default().with_topics(Some(vec![])), 0)]
    {
        let Gate::Handle { request: handled, merge } =
            authorize_request(&alice(), &authorizer, RequestKind::Metadata(request.clone()), version)
        else {
            panic!("metadata for all topics is handled");
        };
        assert_eq!(handled, RequestKind::Metadata(request));
        assert!(!merge.has_denials(), "filtering is not denying");
        let response = MetadataResponse::default().with_topics(metadata_topics(&["a1", "b", "a2"]));
        let ResponseKind::Metadata(r) = merge.finish(ResponseKind::Metadata(response)) else { panic!() };
        let names: Vec<_> = r.topics.iter().map(|t| t.name.clone()).collect();
        assert_eq!(names, vec![Some(topic("a1")), Some(topic("a2"))], "v{version}");
    }
}

#[test]
fn metadata_for_named_topics_answers_each_denied_one() {
    let authorizer = authorizer(vec![allow(ResourceType::Topic, "a", PatternType::Literal, AclOperation::Write)]);
    let named = |names: &[&str]| {
        MetadataRequest::default().with_topics(Some(
            names.iter().map(|n| metadata_request::MetadataRequestTopic::default().with_name(Some(topic(n)))).collect(),
        ))
    };
    let Gate::Handle { request: handled, merge } =
        authorize_request(&alice(), &authorizer, RequestKind::Metadata(named(&["a", "b"])), 12)
    else {
        panic!("handled");
    };
    assert_eq!(handled, RequestKind::Metadata(named(&["a"])), "WRITE implies DESCRIBE; b is taken out");
    let ResponseKind::Metadata(r) =
        merge.finish(ResponseKind::Metadata(MetadataResponse::default().with_topics(metadata_topics(&["a"]))))
    else {
        panic!()
    };
    let answered: Vec<_> = r.topics.iter().map(|t| (t.name.clone(), t.error_code)).collect();
    assert_eq!(answered, vec![(Some(topic("a")), 0), (Some(topic("b")), TOPIC_DENIED)]);

    // v0 with every named topic denied must not become a request for all topics.
    let Gate::Handle { request: handled, merge } =
        authorize_request(&alice(), &authorizer, RequestKind::Metadata(named(&["b"])), 0)
    else {
        panic!("handled");
    };
    assert_eq!(handled, RequestKind::Metadata(named(&[])));
    let everything = MetadataResponse::default().with_topics(metadata_topics(&["a", "b", "c"]));
    let ResponseKind::Metadata(r) = merge.finish(ResponseKind::Metadata(everything)) else { panic!() };
    let answered: Vec<_> = r.topics.iter().map(|t| (t.name.clone(), t.error_code)).collect();
    assert_eq!(answered, vec![(Some(topic("b")), TOPIC_DENIED)]);
}

#[test]
fn topic_auto_creation_needs_create_on_the_cluster_or_the_topic() {
    let none = authorizer(vec![]);
    assert!(!may_auto_create_topic(&alice(), &none, "new"));
    let on_topic = authorizer(vec![allow(ResourceType::Topic, "new", PatternType::Literal, AclOperation::Create)]);
    assert!(may_auto_create_topic(&alice(), &on_topic, "new"));
    assert!(!may_auto_create_topic(&alice(), &on_topic, "other"));
    let on_cluster =
        authorizer(vec![allow(ResourceType::Cluster, "kafka-cluster", PatternType::Literal, AclOperation::Create)]);
    assert!(may_auto_create_topic(&alice(), &on_cluster, "other"));
}

fn create_topics(names: &[&str]) -> CreateTopicsRequest {
    CreateTopicsRequest::default().with_topics(
        names.iter().map(|n| create_topics_request::CreatableTopic::default().with_name(topic(n))).collect(),
    )
}

#[test]
fn create_topics_is_decided_per_topic() {
    let prefixed = authorizer(vec![
        allow(ResourceType::Topic, "app-", PatternType::Prefixed, AclOperation::Create),
        allow(ResourceType::Topic, "app-", PatternType::Prefixed, AclOperation::AlterConfigs),
    ]);
    let Gate::Handle { request: handled, merge } =
        authorize_request(&alice(), &prefixed, RequestKind::CreateTopics(create_topics(&["app-x", "other"])), 7)
    else {
        panic!("handled");
    };
    assert_eq!(handled, RequestKind::CreateTopics(create_topics(&["app-x"])));
    let created =
        create_topics_response::CreatableTopicResult::default().with_name(topic("app-x")).with_num_partitions(3);
    let ResponseKind::CreateTopics(r) =
        merge.finish(ResponseKind::CreateTopics(CreateTopicsResponse::default().with_topics(vec![created.clone()])))
    else {
        panic!()
    };
    assert_eq!(r.topics[0], created, "ALTER_CONFIGS implies DESCRIBE_CONFIGS: the configs stay");
    assert_eq!((r.topics[1].name.clone(), r.topics[1].error_code), (topic("other"), TOPIC_DENIED));

    // CREATE on the CLUSTER allows every topic.
    let cluster =
        authorizer(vec![allow(ResourceType::Cluster, "kafka-cluster", PatternType::Literal, AclOperation::Create)]);
    let request = RequestKind::CreateTopics(create_topics(&["x", "y"]));
    let Gate::Handle { request: handled, merge } = authorize_request(&alice(), &cluster, request.clone(), 7) else {
        panic!("handled")
    };
    assert_eq!(handled, request);
    assert!(!merge.has_denials());
    // Without DESCRIBE_CONFIGS the created topic's configs are withheld.
    let ResponseKind::CreateTopics(r) = merge.finish(ResponseKind::CreateTopics(
        CreateTopicsResponse::default()
            .with_topics(vec![create_topics_response::CreatableTopicResult::default().with_name(topic("x"))]),
    )) else {
        panic!()
    };
    assert_eq!(
        (r.topics[0].error_code, r.topics[0].topic_config_error_code, r.topics[0].configs.clone()),
        (0, TOPIC_DENIED, None)
    );
}

#[test]
fn offset_commit_checks_the_group_then_each_topic() {
    let group_read = allow(ResourceType::Group, "g", PatternType::Literal, AclOperation::Read);
    let topic_read = allow(ResourceType::Topic, "t", PatternType::Literal, AclOperation::Read);
    let no_group = authorizer(vec![topic_read.clone()]);
    let request = RequestKind::OffsetCommit(offset_commit(&["t", "u"]));
    let Gate::Answer(ResponseKind::OffsetCommit(r)) = authorize_request(&alice(), &no_group, request.clone(), 9) else {
        panic!("refused whole");
    };
    let codes: Vec<i16> = r.topics.iter().flat_map(|t| t.partitions.iter().map(|p| p.error_code)).collect();
    assert_eq!(codes, vec![GROUP_DENIED, GROUP_DENIED]);

    let both = authorizer(vec![group_read, topic_read]);
    let Gate::Handle { request: handled, merge } = authorize_request(&alice(), &both, request, 9) else {
        panic!("handled");
    };
    assert_eq!(handled, RequestKind::OffsetCommit(offset_commit(&["t"])));
    let ResponseKind::OffsetCommit(r) = merge.finish(ResponseKind::OffsetCommit(OffsetCommitResponse::default()))
    else {
        panic!()
    };
    assert_eq!((r.topics[0].name.clone(), r.topics[0].partitions[0].error_code), (topic("u"), TOPIC_DENIED));
}

#[test]
fn init_producer_id_without_transactional_id_accepts_write_on_any_topic() {
    let request = RequestKind::InitProducerId(InitProducerIdRequest::default().with_transactional_id(None));
    let write_some = authorizer(vec![allow(ResourceType::Topic, "app-", PatternType::Prefixed, AclOperation::Write)]);
    assert!(matches!(authorize_request(&alice(), &write_some, request.clone(), 5), Gate::Handle { .. }));
    let idempotent = authorizer(vec![allow(
        ResourceType::Cluster,
        "kafka-cluster",
        PatternType::Literal,
        AclOperation::IdempotentWrite,
    )]);
    assert!(matches!(authorize_request(&alice(), &idempotent, request.clone(), 5), Gate::Handle { .. }));
    let read_only = authorizer(vec![allow(ResourceType::Topic, "app-", PatternType::Prefixed, AclOperation::Read)]);
    let Gate::Answer(ResponseKind::InitProducerId(r)) = authorize_request(&alice(), &read_only, request, 5) else {
        panic!("refused");
    };
    assert_eq!((r.error_code, r.producer_id, r.producer_epoch), (CLUSTER_DENIED, ProducerId(-1), -1));
}

#[test]
fn list_groups_with_describe_on_the_cluster_shows_every_group() {
    let authorizer =
        authorizer(vec![allow(ResourceType::Cluster, "kafka-cluster", PatternType::Literal, AclOperation::Describe)]);
    let Gate::Handle { merge, .. } =
        authorize_request(&alice(), &authorizer, RequestKind::ListGroups(ListGroupsRequest::default()), 5)
    else {
        panic!("handled");
    };
    let listed = ListGroupsResponse::default()
        .with_groups(vec![list_groups_response::ListedGroup::default().with_group_id(group("g"))]);
    assert_eq!(merge.finish(ResponseKind::ListGroups(listed.clone())), ResponseKind::ListGroups(listed));
}

#[test]
fn denials_are_counted_but_quiet_filtering_is_not() {
    let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
    let handle = recorder.handle();
    let authorizer = authorizer(vec![]);
    metrics::with_local_recorder(&recorder, || {
        let produce = RequestKind::Produce(produce(&[("t", &[0])], 1));
        let _ = authorize_request(&nobody(), &authorizer, produce, 12);
        let Gate::Handle { merge, .. } =
            authorize_request(&nobody(), &authorizer, RequestKind::ListGroups(ListGroupsRequest::default()), 5)
        else {
            panic!("handled");
        };
        let listed = ListGroupsResponse::default()
            .with_groups(vec![list_groups_response::ListedGroup::default().with_group_id(group("g"))]);
        let _ = merge.finish(ResponseKind::ListGroups(listed));
    });
    let text = handle.render();
    let lines: Vec<&str> = text.lines().filter(|l| l.starts_with(super::DENIALS_METRIC)).collect();
    assert_eq!(lines.len(), 1, "{text}");
    assert!(lines[0].contains("api=\"Produce\""), "{text}");
    assert!(lines[0].contains("operation=\"WRITE\""), "{text}");
    assert!(lines[0].contains("resource_type=\"TOPIC\""), "{text}");
    assert!(lines[0].ends_with(" 1"), "{text}");
}

#[test]
fn follower_fetch_needs_cluster_action_and_consumer_fetch_needs_read() {
    let read = authorizer(vec![allow(ResourceType::Topic, "t", PatternType::Literal, AclOperation::Read)]);
    let consumer = sample(ApiKey::Fetch);
    let Gate::Handle { request, merge } = authorize_request(&alice(), &read, consumer.clone(), 12) else {
        panic!("a consumer with READ fetches");
    };
    assert_eq!((request, merge.has_denials()), (consumer.clone(), false));
    let RequestKind::Fetch(follower) = consumer else { panic!() };
    let follower = RequestKind::Fetch(follower.with_replica_id(BrokerId(2)));
    let Gate::Answer(ResponseKind::Fetch(r)) = authorize_request(&alice(), &read, follower.clone(), 12) else {
        panic!("READ is not enough to fetch as a follower");
    };
    assert_eq!(r.responses[0].partitions[0].error_code, TOPIC_DENIED);
    let cluster_action = authorizer(vec![allow(
        ResourceType::Cluster,
        "kafka-cluster",
        PatternType::Literal,
        AclOperation::ClusterAction,
    )]);
    assert!(matches!(
        authorize_request(&alice(), &cluster_action, follower, 12),
        Gate::Handle { merge, .. } if !merge.has_denials()
    ));
}

#[test]
fn consumer_group_heartbeat_needs_describe_on_every_subscribed_topic() {
    let heartbeat = |topics: &[&str]| {
        RequestKind::ConsumerGroupHeartbeat(
            ConsumerGroupHeartbeatRequest::default()
                .with_group_id(group("g"))
                .with_subscribed_topic_names(Some(topics.iter().map(|t| topic(t)).collect())),
        )
    };
    let authorizer = authorizer(vec![
        allow(ResourceType::Group, "g", PatternType::Literal, AclOperation::Read),
        allow(ResourceType::Topic, "t", PatternType::Literal, AclOperation::Read),
    ]);
    assert!(matches!(authorize_request(&alice(), &authorizer, heartbeat(&["t"]), 1), Gate::Handle { .. }));
    let Gate::Answer(ResponseKind::ConsumerGroupHeartbeat(r)) =
        authorize_request(&alice(), &authorizer, heartbeat(&["t", "secret"]), 1)
    else {
        panic!("refused");
    };
    assert_eq!(r.error_code, TOPIC_DENIED);
}

#[test]
fn describe_configs_answers_each_resource_with_its_own_authorization_error() {
    let resource = |resource_type: i8, name: &str| {
        describe_configs_request::DescribeConfigsResource::default()
            .with_resource_type(resource_type)
            .with_resource_name(s(name))
    };
    let request = DescribeConfigsRequest::default().with_resources(vec![
        resource(2, "t"),
        resource(4, "1"),
        resource(32, "g"),
        resource(2, "mine"),
    ]);
    let authorizer =
        authorizer(vec![allow(ResourceType::Topic, "mine", PatternType::Literal, AclOperation::AlterConfigs)]);
    let Gate::Handle { request: RequestKind::DescribeConfigs(handled), merge } =
        authorize_request(&alice(), &authorizer, RequestKind::DescribeConfigs(request), 4)
    else {
        panic!("handled");
    };
    assert_eq!(handled.resources, vec![resource(2, "mine")], "ALTER_CONFIGS implies DESCRIBE_CONFIGS");
    let ResponseKind::DescribeConfigs(r) =
        merge.finish(ResponseKind::DescribeConfigs(DescribeConfigsResponse::default()))
    else {
        panic!()
    };
    let answered: Vec<(i8, String, i16)> =
        r.results.iter().map(|d| (d.resource_type, d.resource_name.to_string(), d.error_code)).collect();
    assert_eq!(
        answered,
        vec![(2, "t".into(), TOPIC_DENIED), (4, "1".into(), CLUSTER_DENIED), (32, "g".into(), GROUP_DENIED)]
    );
}

#[test]
fn txn_offset_commit_needs_write_on_the_transactional_id_then_read_on_the_group_and_topics() {
    let group_and_topic = || {
        vec![
            allow(ResourceType::Group, "g", PatternType::Literal, AclOperation::Read),
            allow(ResourceType::Topic, "t", PatternType::Literal, AclOperation::Read),
        ]
    };
    let request = RequestKind::TxnOffsetCommit(txn_offset_commit(&["t", "u"]));
    let Gate::Answer(ResponseKind::TxnOffsetCommit(r)) =
        authorize_request(&alice(), &authorizer(group_and_topic()), request.clone(), 4)
    else {
        panic!("refused whole without WRITE on the transactional id");
    };
    let codes: Vec<i16> = r.topics.iter().flat_map(|t| &t.partitions).map(|p| p.error_code).collect();
    assert_eq!(codes, vec![TXN_DENIED, TXN_DENIED]);

    let mut acls = group_and_topic();
    acls.push(allow(ResourceType::TransactionalId, "tx", PatternType::Literal, AclOperation::Write));
    let Gate::Handle { request: handled, merge } = authorize_request(&alice(), &authorizer(acls), request, 4) else {
        panic!("handled for the topic it may read");
    };
    assert_eq!(handled, RequestKind::TxnOffsetCommit(txn_offset_commit(&["t"])));
    let ResponseKind::TxnOffsetCommit(r) = merge.finish(ResponseKind::TxnOffsetCommit(Default::default())) else {
        panic!("a TxnOffsetCommit response");
    };
    assert_eq!((r.topics[0].name.0.as_str(), r.topics[0].partitions[0].error_code), ("u", TOPIC_DENIED));
}
