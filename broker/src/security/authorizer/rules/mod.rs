//! The request edge of authorization: what Kafka's `KafkaApis` checks for each API, applied to a decoded
//! request before any handler sees it.
//!
//! Every request passes [`authorize_request`], which matches on the request's kind and applies that
//! API's rule. The answer is a [`Gate`]:
//!
//! - [`Gate::Handle`]: handle the request (unchanged, or with the denied items taken out), then give the
//!   handler's response to [`Merge::finish`], which puts the denied items back with their error codes
//!   in the form Kafka answers, and leaves out what the principal may not see (Metadata for all topics,
//!   ListGroups, OffsetFetch for all of a group's partitions).
//! - [`Gate::Answer`]: do not handle; answer with this response, the API's own error response (e.g.
//!   CLUSTER_AUTHORIZATION_FAILED for CreateAcls, GROUP_AUTHORIZATION_FAILED for JoinGroup).
//! - [`Gate::Close`]: close the connection without an answer: an acks=0 produce that Kafka would refuse
//!   whole, or an API that has no rule here (the codec admits no such API, and a new one cannot slip
//!   through: it is refused until it gets its rule, and the test over `supported_apis()` fails).
//!
//! Denials are logged at INFO with the principal, operation, resource, client address and API, and
//! counted in `shardlog_authorization_denials_total{api, operation, resource_type}`; allowed decisions
//! are logged at DEBUG. The denials Kafka does not log (a topic left out of Metadata for all topics, a
//! group left out of ListGroups, the CLUSTER check that precedes a per-topic one) are neither logged nor
//! counted.
//!
//! Nothing here does I/O or knows which topics exist: existence errors (UNKNOWN_TOPIC_OR_PARTITION)
//! stay the handlers' business, as they come after authorization in Kafka too.

mod admin;
mod data;
mod groups;
mod transactions;

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::{ApiKey, RequestKind, ResponseKind};

use super::acl::{AclOperation, ResourceType};
use super::{Authorizer, RequestContext, Resource};

pub use admin::may_auto_create_topic;

/// The counter of denied decisions.
pub const DENIALS_METRIC: &str = "shardlog_authorization_denials_total";

/// What to do with a request after authorization. See the module doc.
#[derive(Debug)]
pub enum Gate {
    /// Handle `request`, then pass the handler's response through `merge`.
    Handle { request: RequestKind, merge: Merge },
    /// Answer with this response without handling the request.
    Answer(ResponseKind),
    /// Close the connection without an answer.
    Close,
}

type MergeFn = Box<dyn FnOnce(ResponseKind) -> ResponseKind + Send>;

/// What a partly denied request owes its response: the denied items to put back, or the items to
/// leave out.
pub struct Merge {
    finish: Option<MergeFn>,
    denied: bool,
}

impl fmt::Debug for Merge {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Merge").field("changes_response", &self.finish.is_some()).field("denied", &self.denied).finish()
    }
}

impl Merge {
    /// Nothing to change: the request was allowed whole.
    pub fn nothing() -> Merge {
        Merge { finish: None, denied: false }
    }

    /// Puts the denied items back into the handler's `response` and leaves out what must not be shown.
    /// A response of another API than the request's is returned unchanged (a dispatcher bug).
    pub fn finish(self, response: ResponseKind) -> ResponseKind {
        match self.finish {
            Some(finish) => finish(response),
            None => response,
        }
    }

    /// Whether some item of the request was denied. An acks=0 produce is not answered, so Kafka closes
    /// its connection when any partition failed: the dispatcher does the same when this is true.
    pub fn has_denials(&self) -> bool {
        self.denied
    }

    /// A merge that puts denied items back (`denied` true) or filters (`denied` false).
    fn with(denied: bool, finish: impl FnOnce(ResponseKind) -> ResponseKind + Send + 'static) -> Merge {
        Merge { finish: Some(Box::new(finish)), denied }
    }
}

/// Passes every request through its API's authorization rule. `version` is the request's API version.
pub fn authorize_request(
    ctx: &RequestContext,
    authorizer: &Arc<Authorizer>,
    request: RequestKind,
    version: i16,
) -> Gate {
    let check = |api| Check { ctx, authorizer, api };
    match request {
        // Never checked: they come before (or are) authentication.
        RequestKind::ApiVersions(_) | RequestKind::SaslHandshake(_) | RequestKind::SaslAuthenticate(_) => pass(request),
        RequestKind::Produce(req) => data::produce(&check(ApiKey::Produce), req),
        RequestKind::Fetch(req) => data::fetch(&check(ApiKey::Fetch), req),
        RequestKind::ListOffsets(req) => data::list_offsets(&check(ApiKey::ListOffsets), req),
        RequestKind::OffsetForLeaderEpoch(req) => {
            data::offset_for_leader_epoch(&check(ApiKey::OffsetForLeaderEpoch), req)
        }
        RequestKind::DeleteRecords(req) => data::delete_records(&check(ApiKey::DeleteRecords), req),
        RequestKind::InitProducerId(req) => data::init_producer_id(&check(ApiKey::InitProducerId), req),
        RequestKind::AddPartitionsToTxn(req) => {
            transactions::add_partitions_to_txn(&check(ApiKey::AddPartitionsToTxn), req)
        }
        RequestKind::AddOffsetsToTxn(req) => transactions::add_offsets_to_txn(&check(ApiKey::AddOffsetsToTxn), req),
        RequestKind::EndTxn(req) => transactions::end_txn(&check(ApiKey::EndTxn), req),
        RequestKind::DescribeTransactions(req) => {
            transactions::describe_transactions(&check(ApiKey::DescribeTransactions), req)
        }
        RequestKind::ListTransactions(req) => transactions::list_transactions(&check(ApiKey::ListTransactions), req),
        RequestKind::WriteTxnMarkers(req) => transactions::write_txn_markers(&check(ApiKey::WriteTxnMarkers), req),
        RequestKind::DescribeProducers(req) => transactions::describe_producers(&check(ApiKey::DescribeProducers), req),
        RequestKind::Metadata(req) => admin::metadata(&check(ApiKey::Metadata), req, version),
        RequestKind::DescribeCluster(req) => admin::describe_cluster(&check(ApiKey::DescribeCluster), req),
        RequestKind::CreateTopics(req) => admin::create_topics(&check(ApiKey::CreateTopics), req),
        RequestKind::DeleteTopics(req) => admin::delete_topics(&check(ApiKey::DeleteTopics), req),
        RequestKind::CreatePartitions(req) => admin::create_partitions(&check(ApiKey::CreatePartitions), req),
        RequestKind::DescribeConfigs(req) => admin::describe_configs(&check(ApiKey::DescribeConfigs), req),
        RequestKind::AlterConfigs(req) => admin::alter_configs(&check(ApiKey::AlterConfigs), req),
        RequestKind::IncrementalAlterConfigs(req) => {
            admin::incremental_alter_configs(&check(ApiKey::IncrementalAlterConfigs), req)
        }
        RequestKind::ElectLeaders(req) => admin::elect_leaders(&check(ApiKey::ElectLeaders), req, version),
        RequestKind::AlterPartitionReassignments(req) => {
            admin::alter_partition_reassignments(&check(ApiKey::AlterPartitionReassignments), req)
        }
        RequestKind::ListPartitionReassignments(req) => {
            admin::list_partition_reassignments(&check(ApiKey::ListPartitionReassignments), req)
        }
        RequestKind::DescribeUserScramCredentials(req) => {
            admin::describe_user_scram_credentials(&check(ApiKey::DescribeUserScramCredentials), req)
        }
        RequestKind::AlterUserScramCredentials(req) => {
            admin::alter_user_scram_credentials(&check(ApiKey::AlterUserScramCredentials), req)
        }
        RequestKind::CreateAcls(req) => admin::create_acls(&check(ApiKey::CreateAcls), req),
        RequestKind::DescribeAcls(req) => admin::describe_acls(&check(ApiKey::DescribeAcls), req),
        RequestKind::DeleteAcls(req) => admin::delete_acls(&check(ApiKey::DeleteAcls), req),
        RequestKind::DescribeClientQuotas(req) => {
            admin::describe_client_quotas(&check(ApiKey::DescribeClientQuotas), req)
        }
        RequestKind::AlterClientQuotas(req) => admin::alter_client_quotas(&check(ApiKey::AlterClientQuotas), req),
        RequestKind::FindCoordinator(req) => groups::find_coordinator(&check(ApiKey::FindCoordinator), req, version),
        RequestKind::JoinGroup(req) => groups::join_group(&check(ApiKey::JoinGroup), req, version),
        RequestKind::SyncGroup(req) => groups::sync_group(&check(ApiKey::SyncGroup), req),
        RequestKind::Heartbeat(req) => groups::heartbeat(&check(ApiKey::Heartbeat), req),
        RequestKind::LeaveGroup(req) => groups::leave_group(&check(ApiKey::LeaveGroup), req),
        RequestKind::OffsetCommit(req) => groups::offset_commit(&check(ApiKey::OffsetCommit), req),
        RequestKind::TxnOffsetCommit(req) => groups::txn_offset_commit(&check(ApiKey::TxnOffsetCommit), req),
        RequestKind::OffsetFetch(req) => groups::offset_fetch(&check(ApiKey::OffsetFetch), req, version),
        RequestKind::ListGroups(req) => groups::list_groups(&check(ApiKey::ListGroups), req),
        RequestKind::DescribeGroups(req) => groups::describe_groups(&check(ApiKey::DescribeGroups), req, version),
        RequestKind::DeleteGroups(req) => groups::delete_groups(&check(ApiKey::DeleteGroups), req),
        RequestKind::OffsetDelete(req) => groups::offset_delete(&check(ApiKey::OffsetDelete), req),
        RequestKind::ConsumerGroupHeartbeat(req) => {
            groups::consumer_group_heartbeat(&check(ApiKey::ConsumerGroupHeartbeat), req)
        }
        RequestKind::ConsumerGroupDescribe(req) => {
            groups::consumer_group_describe(&check(ApiKey::ConsumerGroupDescribe), req)
        }
        // `RequestKind` is non-exhaustive and lists every API Kafka has: an API without a rule above is
        // refused, never let through.
        other => {
            tracing::info!(
                principal = %ctx.principal,
                client = %ctx.host,
                request = ?std::mem::discriminant(&other),
                "refused a request whose API has no authorization rule; closing the connection"
            );
            Gate::Close
        }
    }
}

/// Handles what is left of a request, or, when every item was denied, answers at once with the merge
/// applied to an empty response, as Kafka does (without touching a log, or a fetch's long poll).
fn answer_if_empty(request: RequestKind, nothing_left: bool, merge: Merge, empty: ResponseKind) -> Gate {
    if nothing_left && merge.has_denials() {
        Gate::Answer(merge.finish(empty))
    } else {
        Gate::Handle { request, merge }
    }
}

fn pass(request: RequestKind) -> Gate {
    Gate::Handle { request, merge: Merge::nothing() }
}

/// One request's questions to the authorizer, logged and counted as the module doc says.
pub(super) struct Check<'a> {
    ctx: &'a RequestContext,
    authorizer: &'a Arc<Authorizer>,
    api: ApiKey,
}

impl Check<'_> {
    /// Asks, and logs a denial at INFO (and counts it).
    fn allowed(&self, operation: AclOperation, resource: Resource<'_>) -> bool {
        self.ask(operation, resource, true)
    }

    /// Asks, without logging or counting a denial (Kafka's `logIfDenied = false`).
    fn allowed_quietly(&self, operation: AclOperation, resource: Resource<'_>) -> bool {
        self.ask(operation, resource, false)
    }

    fn ask(&self, operation: AclOperation, resource: Resource<'_>, log_denial: bool) -> bool {
        let allowed = self.authorizer.authorize(self.ctx, operation, &resource).is_allowed();
        if allowed {
            tracing::debug!(
                principal = %self.ctx.principal, %operation, %resource, client = %self.ctx.host, api = ?self.api,
                "authorization allowed"
            );
        } else if log_denial {
            self.denial(operation, resource.resource_type, &resource);
        }
        allowed
    }

    fn denial(&self, operation: AclOperation, resource_type: ResourceType, resource: &dyn fmt::Display) {
        tracing::info!(
            principal = %self.ctx.principal, %operation, %resource, client = %self.ctx.host, api = ?self.api,
            "authorization denied"
        );
        metrics::counter!(
            DENIALS_METRIC,
            "api" => format!("{:?}", self.api),
            "operation" => operation.name(),
            "resource_type" => resource_type.name(),
        )
        .increment(1);
    }

    /// The names among `names` the principal may not do `operation` to (each asked and logged once).
    fn denied_names<'n>(
        &self,
        operation: AclOperation,
        resource_type: ResourceType,
        names: impl IntoIterator<Item = &'n str>,
        log_denials: bool,
    ) -> HashSet<String> {
        let mut seen = HashSet::new();
        let mut denied = HashSet::new();
        for name in names {
            if !seen.insert(name) {
                continue;
            }
            if !self.ask(operation, Resource { resource_type, name }, log_denials) {
                denied.insert(name.to_string());
            }
        }
        denied
    }

    /// The CLUSTER check most admin APIs make whole.
    fn cluster(&self, operation: AclOperation) -> bool {
        self.allowed(operation, Resource::cluster())
    }

    /// A filter for responses, with what it needs to ask later (the merge outlives this borrow).
    fn filter(&self) -> Filter {
        Filter { ctx: self.ctx.clone(), authorizer: Arc::clone(self.authorizer) }
    }
}

/// Asks questions after the handler answered (to leave out what may not be seen), without logging
/// denials, as Kafka does for such filtering.
struct Filter {
    ctx: RequestContext,
    authorizer: Arc<Authorizer>,
}

impl Filter {
    fn allowed(&self, operation: AclOperation, resource: Resource<'_>) -> bool {
        self.authorizer.authorize(&self.ctx, operation, &resource).is_allowed()
    }

    /// Kafka's authorized-operations bit field for a resource: bit `code` set for each operation of the
    /// resource's type the principal may do.
    fn authorized_operations(&self, resource: Resource<'_>) -> i32 {
        use AclOperation::*;
        let supported: &[AclOperation] = match resource.resource_type {
            ResourceType::Topic => &[Read, Write, Create, Describe, Delete, Alter, DescribeConfigs, AlterConfigs],
            ResourceType::Group => &[Read, Describe, Delete],
            ResourceType::Cluster => {
                &[Create, ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite, Alter, Describe]
            }
            ResourceType::TransactionalId => &[Describe, Write],
            ResourceType::DelegationToken => &[Describe],
            ResourceType::User => &[CreateTokens, DescribeTokens],
            ResourceType::Unknown | ResourceType::Any => &[],
        };
        supported.iter().filter(|op| self.allowed(**op, resource)).fold(0, |bits, op| bits | (1 << op.code()))
    }
}

fn code(error: ResponseError) -> i16 {
    error.code()
}

const TOPIC_DENIED: ResponseError = ResponseError::TopicAuthorizationFailed;
const GROUP_DENIED: ResponseError = ResponseError::GroupAuthorizationFailed;
const CLUSTER_DENIED: ResponseError = ResponseError::ClusterAuthorizationFailed;
const TXN_DENIED: ResponseError = ResponseError::TransactionalIdAuthorizationFailed;

#[cfg(test)]
mod tests;
