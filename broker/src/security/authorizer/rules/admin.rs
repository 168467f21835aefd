//! Rules for metadata and administration: Metadata, DescribeCluster, topics, configs, leader elections,
//! reassignments, and the security APIs (SCRAM credentials, ACLs, client quotas).

use std::collections::HashSet;
use std::sync::Arc;

use kafka_protocol::messages::alter_client_quotas_response::{EntityData, EntryData};
use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::delete_acls_response::DeleteAclsFilterResult;
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::describe_configs_response::DescribeConfigsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::DescribeUserScramCredentialsResult;
use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::metadata_response::MetadataResponseTopic;
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, AlterConfigsRequest, AlterConfigsResponse,
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse, CreateAclsRequest, CreateAclsResponse, CreatePartitionsRequest,
    CreateTopicsRequest, DeleteAclsRequest, DeleteAclsResponse, DeleteTopicsRequest, DescribeAclsRequest,
    DescribeAclsResponse, DescribeClientQuotasRequest, DescribeClientQuotasResponse, DescribeClusterRequest,
    DescribeConfigsRequest, DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
    ElectLeadersRequest, ElectLeadersResponse, IncrementalAlterConfigsRequest, ListPartitionReassignmentsRequest,
    ListPartitionReassignmentsResponse, MetadataRequest, RequestKind, ResponseKind, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::{ResponseError, messages::ApiKey};

use super::{CLUSTER_DENIED, Check, GROUP_DENIED, Gate, Merge, TOPIC_DENIED, answer_if_empty, code};
use crate::security::authorizer::acl::{AclOperation, ResourceType};
use crate::security::authorizer::{Authorizer, RequestContext, Resource};

/// Kafka's config resource types (`ConfigResource.Type`) as DescribeConfigs and AlterConfigs send them.
const CONFIG_TOPIC: i8 = 2;
const CONFIG_BROKER: i8 = 4;
const CONFIG_BROKER_LOGGER: i8 = 8;
const CONFIG_CLIENT_METRICS: i8 = 16;
const CONFIG_GROUP: i8 = 32;

/// Whether Metadata may create the missing `topic` for this principal (topic auto-creation): CREATE on
/// the CLUSTER (asked quietly) or on the topic. The Metadata handler asks this for each topic it would
/// create, and answers TOPIC_AUTHORIZATION_FAILED for a topic it may not.
pub fn may_auto_create_topic(ctx: &RequestContext, authorizer: &Arc<Authorizer>, topic: &str) -> bool {
    let check = Check { ctx, authorizer, api: ApiKey::Metadata };
    check.allowed_quietly(AclOperation::Create, Resource::cluster())
        || check.allowed(AclOperation::Create, Resource::topic(topic))
}

fn denied_topic_entry(name: TopicName) -> MetadataResponseTopic {
    MetadataResponseTopic::default().with_error_code(code(TOPIC_DENIED)).with_name(Some(name))
}

/// Metadata: DESCRIBE on each named topic (else TOPIC_AUTHORIZATION_FAILED for it). For all topics,
/// those the principal may not DESCRIBE are left out, quietly. Asked-for authorized-operation bit fields
/// are filled in.
pub(super) fn metadata(check: &Check<'_>, mut req: MetadataRequest, version: i16) -> Gate {
    let all_topics = match &req.topics {
        None => true,
        Some(topics) => version == 0 && topics.is_empty(),
    };
    let mut denied = Vec::new();
    let mut by_id = HashSet::new();
    let mut v0_all_denied = false;
    if let Some(topics) = req.topics.as_mut().filter(|_| !all_topics) {
        let names = topics.iter().filter_map(|t| t.name.as_ref().map(|n| n.0.as_str()));
        let denied_names = check.denied_names(AclOperation::Describe, ResourceType::Topic, names, true);
        topics.retain(|t| match &t.name {
            Some(name) if denied_names.contains(name.0.as_str()) => {
                denied.push(name.clone());
                false
            }
            Some(_) => true,
            None => {
                by_id.insert(t.topic_id);
                true
            }
        });
        // In v0 an empty list means every topic: keep the request and keep only the errors.
        v0_all_denied = version == 0 && topics.is_empty() && !denied.is_empty();
    }
    let topic_ops = version >= 8 && req.include_topic_authorized_operations;
    let cluster_ops = (8..=10).contains(&version) && req.include_cluster_authorized_operations;
    if denied.is_empty() && by_id.is_empty() && !all_topics && !topic_ops && !cluster_ops {
        return super::pass(RequestKind::Metadata(req));
    }
    if v0_all_denied {
        req.topics = Some(Vec::new());
    }
    let filter = check.filter();
    let has_denials = !denied.is_empty();
    let merge = Merge::with(has_denials, move |response| match response {
        ResponseKind::Metadata(mut r) => {
            if v0_all_denied {
                r.topics.clear();
            }
            if all_topics && !v0_all_denied {
                r.topics.retain(|t| {
                    t.name
                        .as_ref()
                        .is_none_or(|n| filter.allowed(AclOperation::Describe, Resource::topic(n.0.as_str())))
                });
            }
            for t in r.topics.iter_mut().filter(|t| by_id.contains(&t.topic_id)) {
                // Asked for by id: the name is known only now. Kafka answers the id with the error.
                if let Some(name) = &t.name
                    && !filter.allowed(AclOperation::Describe, Resource::topic(name.0.as_str()))
                {
                    *t = MetadataResponseTopic::default().with_error_code(code(TOPIC_DENIED)).with_topic_id(t.topic_id);
                }
            }
            if topic_ops {
                for t in r.topics.iter_mut().filter(|t| t.error_code == 0) {
                    if let Some(name) = &t.name {
                        t.topic_authorized_operations = filter.authorized_operations(Resource::topic(name.0.as_str()));
                    }
                }
            }
            if cluster_ops {
                r.cluster_authorized_operations = if filter.allowed(AclOperation::Describe, Resource::cluster()) {
                    filter.authorized_operations(Resource::cluster())
                } else {
                    0
                };
            }
            r.topics.extend(denied.into_iter().map(denied_topic_entry));
            ResponseKind::Metadata(r)
        }
        other => other,
    });
    Gate::Handle { request: RequestKind::Metadata(req), merge }
}

/// DescribeCluster: no check; the asked-for CLUSTER authorized-operations bit field is filled in (0
/// without DESCRIBE on the CLUSTER).
pub(super) fn describe_cluster(check: &Check<'_>, req: DescribeClusterRequest) -> Gate {
    if !req.include_cluster_authorized_operations {
        return super::pass(RequestKind::DescribeCluster(req));
    }
    let allowed = check.allowed(AclOperation::Describe, Resource::cluster());
    let filter = check.filter();
    let merge = Merge::with(false, move |response| match response {
        ResponseKind::DescribeCluster(mut r) => {
            r.cluster_authorized_operations =
                if allowed { filter.authorized_operations(Resource::cluster()) } else { 0 };
            ResponseKind::DescribeCluster(r)
        }
        other => other,
    });
    Gate::Handle { request: RequestKind::DescribeCluster(req), merge }
}

/// CreateTopics: CREATE on the CLUSTER (asked quietly) or on each topic (else TOPIC_AUTHORIZATION_FAILED
/// for it); a topic whose configs the principal may not DESCRIBE_CONFIGS gets its configs left out and
/// `topic_config_error_code` TOPIC_AUTHORIZATION_FAILED.
pub(super) fn create_topics(check: &Check<'_>, mut req: CreateTopicsRequest) -> Gate {
    let names = || req.topics.iter().map(|t| t.name.0.as_str());
    let denied = if check.allowed_quietly(AclOperation::Create, Resource::cluster()) {
        HashSet::new()
    } else {
        check.denied_names(AclOperation::Create, ResourceType::Topic, names(), true)
    };
    let no_configs = check.denied_names(AclOperation::DescribeConfigs, ResourceType::Topic, names(), false);
    if denied.is_empty() && no_configs.is_empty() {
        return super::pass(RequestKind::CreateTopics(req));
    }
    let mut taken = Vec::new();
    req.topics.retain(|t| {
        let keep = !denied.contains(t.name.0.as_str());
        if !keep {
            taken.push(t.name.clone());
        }
        keep
    });
    let nothing_left = req.topics.is_empty();
    let merge = Merge::with(!taken.is_empty(), move |response| match response {
        ResponseKind::CreateTopics(mut r) => {
            for t in r.topics.iter_mut().filter(|t| no_configs.contains(t.name.0.as_str())) {
                t.topic_config_error_code = code(TOPIC_DENIED);
                t.configs = None;
            }
            r.topics.extend(taken.into_iter().map(|name| {
                let config_error = if no_configs.contains(name.0.as_str()) { code(TOPIC_DENIED) } else { 0 };
                CreatableTopicResult::default()
                    .with_name(name)
                    .with_error_code(code(TOPIC_DENIED))
                    .with_error_message(Some(StrBytes::from_static_str("Authorization failed.")))
                    .with_topic_config_error_code(config_error)
            }));
            ResponseKind::CreateTopics(r)
        }
        other => other,
    });
    let empty = ResponseKind::CreateTopics(Default::default());
    answer_if_empty(RequestKind::CreateTopics(req), nothing_left, merge, empty)
}

/// DeleteTopics: DELETE on each named topic (else TOPIC_AUTHORIZATION_FAILED), in `topic_names` (v0-5)
/// and `topics` (v6+) alike. A topic named only by its id (v6+) cannot be checked before it is
/// resolved, and a deletion cannot be undone, so it is refused with TOPIC_AUTHORIZATION_FAILED unless
/// the principal is a super user.
pub(super) fn delete_topics(check: &Check<'_>, mut req: DeleteTopicsRequest) -> Gate {
    let names = req
        .topic_names
        .iter()
        .map(|n| n.0.as_str())
        .chain(req.topics.iter().filter_map(|t| t.name.as_ref().map(|n| n.0.as_str())));
    let denied = check.denied_names(AclOperation::Delete, ResourceType::Topic, names, true);
    let super_user = check.authorizer.is_super_user(&check.ctx.principal);
    let mut denied_results = Vec::new();
    req.topic_names.retain(|n| {
        let keep = !denied.contains(n.0.as_str());
        if !keep {
            denied_results.push(DeletableTopicResult::default().with_name(Some(n.clone())));
        }
        keep
    });
    req.topics.retain(|t| {
        let keep = match &t.name {
            Some(name) => !denied.contains(name.0.as_str()),
            None => super_user,
        };
        if !keep {
            denied_results.push(DeletableTopicResult::default().with_name(t.name.clone()).with_topic_id(t.topic_id));
        }
        keep
    });
    if denied_results.is_empty() {
        return super::pass(RequestKind::DeleteTopics(req));
    }
    let nothing_left = req.topics.is_empty() && req.topic_names.is_empty();
    let merge = Merge::with(true, move |response| match response {
        ResponseKind::DeleteTopics(mut r) => {
            r.responses.extend(denied_results.into_iter().map(|d| d.with_error_code(code(TOPIC_DENIED))));
            ResponseKind::DeleteTopics(r)
        }
        other => other,
    });
    answer_if_empty(RequestKind::DeleteTopics(req), nothing_left, merge, ResponseKind::DeleteTopics(Default::default()))
}

/// CreatePartitions: ALTER on each topic.
pub(super) fn create_partitions(check: &Check<'_>, mut req: CreatePartitionsRequest) -> Gate {
    let names = req.topics.iter().map(|t| t.name.0.as_str());
    let denied = check.denied_names(AclOperation::Alter, ResourceType::Topic, names, true);
    if denied.is_empty() {
        return super::pass(RequestKind::CreatePartitions(req));
    }
    let mut taken = Vec::new();
    req.topics.retain(|t| {
        let keep = !denied.contains(t.name.0.as_str());
        if !keep {
            taken.push(t.name.clone());
        }
        keep
    });
    let nothing_left = req.topics.is_empty();
    let merge = Merge::with(true, move |response| match response {
        ResponseKind::CreatePartitions(mut r) => {
            r.results.extend(taken.into_iter().map(|name| {
                CreatePartitionsTopicResult::default()
                    .with_name(name)
                    .with_error_code(code(TOPIC_DENIED))
                    .with_error_message(Some(StrBytes::from_static_str("The topic authorization is failed.")))
            }));
            ResponseKind::CreatePartitions(r)
        }
        other => other,
    });
    let empty = ResponseKind::CreatePartitions(Default::default());
    answer_if_empty(RequestKind::CreatePartitions(req), nothing_left, merge, empty)
}

/// The resource a config request names and the error for it, or `None` for a type the handler answers.
fn config_resource(resource_type: i8, name: &str) -> Option<(Resource<'_>, ResponseError)> {
    match resource_type {
        CONFIG_TOPIC => Some((Resource::topic(name), TOPIC_DENIED)),
        CONFIG_BROKER | CONFIG_BROKER_LOGGER | CONFIG_CLIENT_METRICS => Some((Resource::cluster(), CLUSTER_DENIED)),
        CONFIG_GROUP => Some((Resource::group(name), GROUP_DENIED)),
        _ => None,
    }
}

/// The config resources of a request that `operation` is denied on: (type, name, error code), each
/// removed from `resources`.
fn take_denied_configs<T>(
    check: &Check<'_>,
    operation: AclOperation,
    resources: &mut Vec<T>,
    key: impl Fn(&T) -> (i8, &StrBytes),
) -> Vec<(i8, StrBytes, i16)> {
    let mut taken = Vec::new();
    resources.retain(|r| {
        let (resource_type, name) = key(r);
        match config_resource(resource_type, name.as_str()) {
            Some((resource, error)) if !check.allowed(operation, resource) => {
                taken.push((resource_type, name.clone(), code(error)));
                false
            }
            _ => true,
        }
    });
    taken
}

/// DescribeConfigs: DESCRIBE_CONFIGS on the topic, the group, or the CLUSTER (for a broker, a broker
/// logger or client metrics), with the matching authorization error.
pub(super) fn describe_configs(check: &Check<'_>, mut req: DescribeConfigsRequest) -> Gate {
    let taken = take_denied_configs(check, AclOperation::DescribeConfigs, &mut req.resources, |r| {
        (r.resource_type, &r.resource_name)
    });
    if taken.is_empty() {
        return super::pass(RequestKind::DescribeConfigs(req));
    }
    let nothing_left = req.resources.is_empty();
    let merge = Merge::with(true, move |response| match response {
        ResponseKind::DescribeConfigs(mut r) => {
            r.results.extend(taken.into_iter().map(|(resource_type, name, error)| {
                DescribeConfigsResult::default()
                    .with_error_code(error)
                    .with_resource_type(resource_type)
                    .with_resource_name(name)
            }));
            ResponseKind::DescribeConfigs(r)
        }
        other => other,
    });
    let empty = ResponseKind::DescribeConfigs(Default::default());
    answer_if_empty(RequestKind::DescribeConfigs(req), nothing_left, merge, empty)
}

/// AlterConfigs: ALTER_CONFIGS on the topic or the CLUSTER.
pub(super) fn alter_configs(check: &Check<'_>, mut req: AlterConfigsRequest) -> Gate {
    use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
    let taken = take_denied_configs(check, AclOperation::AlterConfigs, &mut req.resources, |r| {
        (r.resource_type, &r.resource_name)
    });
    if taken.is_empty() {
        return super::pass(RequestKind::AlterConfigs(req));
    }
    let nothing_left = req.resources.is_empty();
    let merge = Merge::with(true, move |response| match response {
        ResponseKind::AlterConfigs(mut r) => {
            r.responses.extend(taken.into_iter().map(|(resource_type, name, error)| {
                AlterConfigsResourceResponse::default()
                    .with_error_code(error)
                    .with_resource_type(resource_type)
                    .with_resource_name(name)
            }));
            ResponseKind::AlterConfigs(r)
        }
        other => other,
    });
    let empty = ResponseKind::AlterConfigs(AlterConfigsResponse::default());
    answer_if_empty(RequestKind::AlterConfigs(req), nothing_left, merge, empty)
}

/// IncrementalAlterConfigs: ALTER_CONFIGS on the topic, the group or the CLUSTER.
pub(super) fn incremental_alter_configs(check: &Check<'_>, mut req: IncrementalAlterConfigsRequest) -> Gate {
    use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse;
    let taken = take_denied_configs(check, AclOperation::AlterConfigs, &mut req.resources, |r| {
        (r.resource_type, &r.resource_name)
    });
    if taken.is_empty() {
        return super::pass(RequestKind::IncrementalAlterConfigs(req));
    }
    let nothing_left = req.resources.is_empty();
    let merge = Merge::with(true, move |response| match response {
        ResponseKind::IncrementalAlterConfigs(mut r) => {
            r.responses.extend(taken.into_iter().map(|(resource_type, name, error)| {
                AlterConfigsResourceResponse::default()
                    .with_error_code(error)
                    .with_resource_type(resource_type)
                    .with_resource_name(name)
            }));
            ResponseKind::IncrementalAlterConfigs(r)
        }
        other => other,
    });
    let empty = ResponseKind::IncrementalAlterConfigs(Default::default());
    answer_if_empty(RequestKind::IncrementalAlterConfigs(req), nothing_left, merge, empty)
}

/// ElectLeaders: ALTER on the CLUSTER, else CLUSTER_AUTHORIZATION_FAILED for the request and each
/// partition it names.
pub(super) fn elect_leaders(check: &Check<'_>, req: ElectLeadersRequest, version: i16) -> Gate {
    if check.cluster(AclOperation::Alter) {
        return super::pass(RequestKind::ElectLeaders(req));
    }
    let results = req
        .topic_partitions
        .unwrap_or_default()
        .into_iter()
        .map(|t| {
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| PartitionResult::default().with_partition_id(p).with_error_code(code(CLUSTER_DENIED)))
                .collect();
            ReplicaElectionResult::default().with_topic(t.topic).with_partition_result(partitions)
        })
        .collect();
    // v0 has no top-level error code: the partitions carry it.
    let top = if version >= 1 { code(CLUSTER_DENIED) } else { 0 };
    Gate::Answer(ResponseKind::ElectLeaders(
        ElectLeadersResponse::default().with_error_code(top).with_replica_election_results(results),
    ))
}

/// AlterPartitionReassignments: ALTER on the CLUSTER, else CLUSTER_AUTHORIZATION_FAILED for the request
/// and each partition.
pub(super) fn alter_partition_reassignments(check: &Check<'_>, req: AlterPartitionReassignmentsRequest) -> Gate {
    if check.cluster(AclOperation::Alter) {
        return super::pass(RequestKind::AlterPartitionReassignments(req));
    }
    let responses = req
        .topics
        .into_iter()
        .map(|t| {
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    ReassignablePartitionResponse::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(code(CLUSTER_DENIED))
                })
                .collect();
            ReassignableTopicResponse::default().with_name(t.name).with_partitions(partitions)
        })
        .collect();
    Gate::Answer(ResponseKind::AlterPartitionReassignments(
        AlterPartitionReassignmentsResponse::default().with_error_code(code(CLUSTER_DENIED)).with_responses(responses),
    ))
}

/// ListPartitionReassignments: DESCRIBE on the CLUSTER.
pub(super) fn list_partition_reassignments(check: &Check<'_>, req: ListPartitionReassignmentsRequest) -> Gate {
    if check.cluster(AclOperation::Describe) {
        return super::pass(RequestKind::ListPartitionReassignments(req));
    }
    Gate::Answer(ResponseKind::ListPartitionReassignments(
        ListPartitionReassignmentsResponse::default().with_error_code(code(CLUSTER_DENIED)),
    ))
}

/// DescribeUserScramCredentials: DESCRIBE on the CLUSTER.
pub(super) fn describe_user_scram_credentials(check: &Check<'_>, req: DescribeUserScramCredentialsRequest) -> Gate {
    if check.cluster(AclOperation::Describe) {
        return super::pass(RequestKind::DescribeUserScramCredentials(req));
    }
    // Kafka answers one error result per user asked for, without the user's name.
    let results = req
        .users
        .unwrap_or_default()
        .iter()
        .map(|_| DescribeUserScramCredentialsResult::default().with_error_code(code(CLUSTER_DENIED)))
        .collect();
    Gate::Answer(ResponseKind::DescribeUserScramCredentials(
        DescribeUserScramCredentialsResponse::default().with_error_code(code(CLUSTER_DENIED)).with_results(results),
    ))
}

/// AlterUserScramCredentials: ALTER on the CLUSTER, else CLUSTER_AUTHORIZATION_FAILED for each user.
pub(super) fn alter_user_scram_credentials(check: &Check<'_>, req: AlterUserScramCredentialsRequest) -> Gate {
    if check.cluster(AclOperation::Alter) {
        return super::pass(RequestKind::AlterUserScramCredentials(req));
    }
    let users: std::collections::BTreeSet<StrBytes> =
        req.deletions.iter().map(|d| d.name.clone()).chain(req.upsertions.iter().map(|u| u.name.clone())).collect();
    let results = users
        .into_iter()
        .map(|user| AlterUserScramCredentialsResult::default().with_user(user).with_error_code(code(CLUSTER_DENIED)))
        .collect();
    Gate::Answer(ResponseKind::AlterUserScramCredentials(
        AlterUserScramCredentialsResponse::default().with_results(results),
    ))
}

/// CreateAcls: ALTER on the CLUSTER, else CLUSTER_AUTHORIZATION_FAILED for each ACL.
pub(super) fn create_acls(check: &Check<'_>, req: CreateAclsRequest) -> Gate {
    if check.cluster(AclOperation::Alter) {
        return super::pass(RequestKind::CreateAcls(req));
    }
    let results =
        req.creations.iter().map(|_| AclCreationResult::default().with_error_code(code(CLUSTER_DENIED))).collect();
    Gate::Answer(ResponseKind::CreateAcls(CreateAclsResponse::default().with_results(results)))
}

/// DescribeAcls: DESCRIBE on the CLUSTER.
pub(super) fn describe_acls(check: &Check<'_>, req: DescribeAclsRequest) -> Gate {
    if check.cluster(AclOperation::Describe) {
        return super::pass(RequestKind::DescribeAcls(req));
    }
    Gate::Answer(ResponseKind::DescribeAcls(DescribeAclsResponse::default().with_error_code(code(CLUSTER_DENIED))))
}

/// DeleteAcls: ALTER on the CLUSTER, else CLUSTER_AUTHORIZATION_FAILED for each filter.
pub(super) fn delete_acls(check: &Check<'_>, req: DeleteAclsRequest) -> Gate {
    if check.cluster(AclOperation::Alter) {
        return super::pass(RequestKind::DeleteAcls(req));
    }
    let results =
        req.filters.iter().map(|_| DeleteAclsFilterResult::default().with_error_code(code(CLUSTER_DENIED))).collect();
    Gate::Answer(ResponseKind::DeleteAcls(DeleteAclsResponse::default().with_filter_results(results)))
}

/// DescribeClientQuotas: DESCRIBE_CONFIGS on the CLUSTER.
pub(super) fn describe_client_quotas(check: &Check<'_>, req: DescribeClientQuotasRequest) -> Gate {
    if check.cluster(AclOperation::DescribeConfigs) {
        return super::pass(RequestKind::DescribeClientQuotas(req));
    }
    Gate::Answer(ResponseKind::DescribeClientQuotas(
        DescribeClientQuotasResponse::default().with_error_code(code(CLUSTER_DENIED)).with_entries(None),
    ))
}

/// AlterClientQuotas: ALTER_CONFIGS on the CLUSTER, else CLUSTER_AUTHORIZATION_FAILED for each entry.
pub(super) fn alter_client_quotas(check: &Check<'_>, req: AlterClientQuotasRequest) -> Gate {
    if check.cluster(AclOperation::AlterConfigs) {
        return super::pass(RequestKind::AlterClientQuotas(req));
    }
    let entries = req
        .entries
        .into_iter()
        .map(|e| {
            let entity = e
                .entity
                .into_iter()
                .map(|d| EntityData::default().with_entity_type(d.entity_type).with_entity_name(d.entity_name))
                .collect();
            EntryData::default().with_entity(entity).with_error_code(code(CLUSTER_DENIED))
        })
        .collect();
    Gate::Answer(ResponseKind::AlterClientQuotas(AlterClientQuotasResponse::default().with_entries(entries)))
}
