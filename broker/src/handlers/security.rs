//! The Kafka admin APIs of the security metadata: DescribeUserScramCredentials and
//! AlterUserScramCredentials (KIP-554), CreateAcls, DescribeAcls and DeleteAcls, DescribeClientQuotas and
//! AlterClientQuotas (KIP-546). They store and serve the data the quorum holds
//! ([`crate::quorum::security`]); they authenticate and authorize nothing (that is the request edge's work).
//!
//! A change is validated item by item against the metadata image with the quorum's own checks: the
//! invalid items are answered with their errors, the valid ones go to the quorum in one command, and the
//! answer waits until it is committed and this broker serves it. If the quorum refuses that command (the
//! image was behind), each of its items gets the refusal's error.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::ResponseError;
use kafka_protocol::messages::alter_client_quotas_response::{EntityData as AlteredEntity, EntryData as AlteredEntry};
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{DeleteAclsFilterResult, DeleteAclsMatchingAcl};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::describe_client_quotas_response::{EntityData, EntryData, ValueData};
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse, CreateAclsRequest, CreateAclsResponse, DeleteAclsRequest, DeleteAclsResponse,
    DescribeAclsRequest, DescribeAclsResponse, DescribeClientQuotasRequest, DescribeClientQuotasResponse,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::admin::commit_events;
use crate::context::BrokerContext;
use crate::quorum::security::{
    self, AclFilter, AclRecord, QuotaEntity, QuotaEntry, QuotaOp, ScramDeletion, ScramUpsertion, SecurityState,
};
use crate::quorum::state::{Command, CommandError, Event};

fn text(s: impl Into<String>) -> StrBytes {
    StrBytes::from_string(s.into())
}

/// An item's answer: 0 or a Kafka error code, with a message.
type Answer = (i16, Option<StrBytes>);

fn refused(error: &CommandError) -> Answer {
    (error.kafka_code(), Some(text(error.to_string())))
}

/// Commits `command` and gives the events it caused, or the answer every item it carried gets.
async fn commit(ctx: &Arc<BrokerContext>, command: Command) -> Result<Vec<Event>, Answer> {
    commit_events(ctx, command).await.map_err(|(code, message)| (code, Some(text(message))))
}

pub(super) fn describe_user_scram_credentials(
    ctx: &Arc<BrokerContext>,
    req: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let image = ctx.image();
    let scram = &image.state.security.scram;
    let describe = |user: &str| {
        let infos = scram.get(user).map(|credentials| {
            credentials
                .iter()
                .map(|(mechanism, c)| {
                    CredentialInfo::default().with_mechanism(*mechanism).with_iterations(c.iterations as i32)
                })
                .collect::<Vec<_>>()
        });
        let result = DescribeUserScramCredentialsResult::default().with_user(text(user));
        match infos {
            Some(infos) => result.with_credential_infos(infos),
            None => result.with_error_code(ResponseError::ResourceNotFound.code()).with_error_message(Some(text(
                format!("attempt to describe a user credential that does not exist: {user}"),
            ))),
        }
    };
    // No names (null or empty): every user that has a credential.
    let results = match req.users.filter(|u| !u.is_empty()) {
        None => scram.keys().map(|user| describe(user)).collect(),
        Some(users) => {
            let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
            for user in &users {
                *counts.entry(user.name.as_str()).or_default() += 1;
            }
            counts
                .into_iter()
                .map(|(user, count)| {
                    if count > 1 {
                        DescribeUserScramCredentialsResult::default()
                            .with_user(text(user))
                            .with_error_code(ResponseError::DuplicateResource.code())
                            .with_error_message(Some(text(format!("cannot describe the same user twice: {user}"))))
                    } else {
                        describe(user)
                    }
                })
                .collect()
        }
    };
    DescribeUserScramCredentialsResponse::default().with_results(results)
}

pub(super) async fn alter_user_scram_credentials(
    ctx: &Arc<BrokerContext>,
    req: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    let image = ctx.image();
    // Each user once: a user named twice (in either list) is DUPLICATE_RESOURCE, and nothing of it changes.
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for name in req.deletions.iter().map(|d| &d.name).chain(req.upsertions.iter().map(|u| &u.name)) {
        *counts.entry(name.to_string()).or_default() += 1;
    }
    let mut answers: BTreeMap<String, Answer> = BTreeMap::new();
    let mut deletions = Vec::new();
    let mut upsertions = Vec::new();
    for d in &req.deletions {
        let user = d.name.to_string();
        if counts[&user] > 1 {
            continue;
        }
        let deletion = ScramDeletion { user: user.clone(), mechanism: d.mechanism };
        match check_deletion(&image.state.security, &deletion) {
            Ok(()) => deletions.push(deletion),
            Err(e) => {
                answers.insert(user, refused(&e));
            }
        }
    }
    for u in &req.upsertions {
        let user = u.name.to_string();
        if counts[&user] > 1 {
            continue;
        }
        match upsertion(&user, u.mechanism, u.iterations, &u.salt, &u.salted_password) {
            Ok(upsertion) => upsertions.push(upsertion),
            Err(e) => {
                answers.insert(user, refused(&e));
            }
        }
    }
    for (user, count) in &counts {
        if *count > 1 {
            let message = format!("a user credential cannot be altered twice in one request: {user}");
            answers.insert(user.clone(), (ResponseError::DuplicateResource.code(), Some(text(message))));
        }
    }
    let proposed: Vec<String> =
        deletions.iter().map(|d| d.user.clone()).chain(upsertions.iter().map(|u| u.user.clone())).collect();
    if !proposed.is_empty() {
        let outcome = commit(ctx, Command::AlterScramCredentials { upsertions, deletions }).await;
        for user in proposed {
            answers.insert(user, outcome.as_ref().map_or_else(Clone::clone, |_| (0, None)));
        }
    }
    let results = answers
        .into_iter()
        .map(|(user, (code, message))| {
            AlterUserScramCredentialsResult::default()
                .with_user(text(user))
                .with_error_code(code)
                .with_error_message(message)
        })
        .collect();
    AlterUserScramCredentialsResponse::default().with_results(results)
}

fn check_deletion(state: &SecurityState, deletion: &ScramDeletion) -> Result<(), CommandError> {
    if deletion.user.is_empty() {
        return Err(CommandError::UnacceptableCredential("a user name must not be empty".into()));
    }
    security::scram_key_len(deletion.mechanism).ok_or(CommandError::UnsupportedSaslMechanism(deletion.mechanism))?;
    state
        .scram_credential(&deletion.user, deletion.mechanism)
        .map(|_| ())
        .ok_or_else(|| CommandError::ResourceNotFound(deletion.user.clone()))
}

/// The credential a KIP-554 upsertion asks for, checked as the quorum checks it.
fn upsertion(
    user: &str,
    mechanism: i8,
    iterations: i32,
    salt: &[u8],
    salted_password: &[u8],
) -> Result<ScramUpsertion, CommandError> {
    let unacceptable = |reason: &str| CommandError::UnacceptableCredential(reason.to_string());
    if user.is_empty() {
        return Err(unacceptable("a user name must not be empty"));
    }
    security::scram_key_len(mechanism).ok_or(CommandError::UnsupportedSaslMechanism(mechanism))?;
    let iterations = u32::try_from(iterations).map_err(|_| unacceptable("iterations must be positive"))?;
    if salted_password.is_empty() {
        return Err(unacceptable("the salted password must not be empty"));
    }
    let credential = security::credential_from_salted_password(mechanism, salt, iterations, salted_password)
        .ok_or(CommandError::UnsupportedSaslMechanism(mechanism))?;
    let upsertion = ScramUpsertion { user: user.to_string(), mechanism, credential };
    security::check_upsertion(&upsertion)?;
    Ok(upsertion)
}

pub(super) async fn create_acls(ctx: &Arc<BrokerContext>, req: CreateAclsRequest) -> CreateAclsResponse {
    let mut answers: Vec<Option<Answer>> = Vec::with_capacity(req.creations.len());
    let mut valid = Vec::new();
    for c in &req.creations {
        let acl = AclRecord {
            resource_type: c.resource_type,
            resource_name: c.resource_name.to_string(),
            pattern_type: c.resource_pattern_type,
            principal: c.principal.to_string(),
            host: c.host.to_string(),
            operation: c.operation,
            permission_type: c.permission_type,
        };
        match security::check_acl(&acl) {
            Ok(()) => {
                valid.push(acl);
                answers.push(None);
            }
            Err(e) => answers.push(Some(refused(&e))),
        }
    }
    let mut outcome = Ok(Vec::new());
    for chunk in valid.chunks(security::MAX_ITEMS_PER_COMMAND) {
        outcome = commit(ctx, Command::CreateAcls { acls: chunk.to_vec() }).await;
        if outcome.is_err() {
            break;
        }
    }
    let committed = outcome.map_or_else(|e| e, |_| (0, None));
    let results = answers
        .into_iter()
        .map(|answer| {
            let (code, message) = answer.unwrap_or_else(|| committed.clone());
            AclCreationResult::default().with_error_code(code).with_error_message(message)
        })
        .collect();
    CreateAclsResponse::default().with_results(results)
}

fn filter(
    resource_type: i8,
    resource_name: Option<&StrBytes>,
    pattern_type: i8,
    principal: Option<&StrBytes>,
    host: Option<&StrBytes>,
    operation: i8,
    permission_type: i8,
) -> AclFilter {
    AclFilter {
        resource_type,
        resource_name: resource_name.map(|s| s.to_string()),
        pattern_type,
        principal: principal.map(|s| s.to_string()),
        host: host.map(|s| s.to_string()),
        operation,
        permission_type,
    }
}

pub(super) fn describe_acls(ctx: &Arc<BrokerContext>, req: DescribeAclsRequest) -> DescribeAclsResponse {
    let filter = filter(
        req.resource_type_filter,
        req.resource_name_filter.as_ref(),
        req.pattern_type_filter,
        req.principal_filter.as_ref(),
        req.host_filter.as_ref(),
        req.operation,
        req.permission_type,
    );
    if let Err(e) = security::check_filter(&filter) {
        let (code, message) = refused(&e);
        return DescribeAclsResponse::default().with_error_code(code).with_error_message(message);
    }
    let image = ctx.image();
    // One resource per (type, name, pattern type), its bindings listed under it, as Kafka answers.
    let mut resources: BTreeMap<(i8, &str, i8), Vec<AclDescription>> = BTreeMap::new();
    for acl in image.state.security.acls.iter().filter(|acl| filter.matches(acl)) {
        resources.entry((acl.resource_type, &acl.resource_name, acl.pattern_type)).or_default().push(
            AclDescription::default()
                .with_principal(text(acl.principal.clone()))
                .with_host(text(acl.host.clone()))
                .with_operation(acl.operation)
                .with_permission_type(acl.permission_type),
        );
    }
    let resources = resources
        .into_iter()
        .map(|((resource_type, name, pattern_type), acls)| {
            DescribeAclsResource::default()
                .with_resource_type(resource_type)
                .with_resource_name(text(name))
                .with_pattern_type(pattern_type)
                .with_acls(acls)
        })
        .collect();
    DescribeAclsResponse::default().with_resources(resources)
}

pub(super) async fn delete_acls(ctx: &Arc<BrokerContext>, req: DeleteAclsRequest) -> DeleteAclsResponse {
    let filters: Vec<Result<AclFilter, CommandError>> = req
        .filters
        .iter()
        .map(|f| {
            let filter = filter(
                f.resource_type_filter,
                f.resource_name_filter.as_ref(),
                f.pattern_type_filter,
                f.principal_filter.as_ref(),
                f.host_filter.as_ref(),
                f.operation,
                f.permission_type,
            );
            security::check_filter(&filter).map(|()| filter)
        })
        .collect();
    let valid: Vec<AclFilter> = filters.iter().filter_map(|f| f.as_ref().ok().cloned()).collect();
    // What each valid filter removed, in order.
    let mut removed: Vec<Vec<AclRecord>> = Vec::with_capacity(valid.len());
    let mut failure = None;
    for chunk in valid.chunks(security::MAX_ITEMS_PER_COMMAND) {
        match commit(ctx, Command::DeleteAcls { filters: chunk.to_vec() }).await {
            Ok(events) => {
                for event in events {
                    if let Event::AclsDeleted { removed: lists } = event {
                        removed.extend(lists);
                    }
                }
            }
            Err(answer) => {
                failure = Some(answer);
                break;
            }
        }
    }
    let mut removed = removed.into_iter();
    let results = filters
        .into_iter()
        .map(|f| {
            let result = DeleteAclsFilterResult::default();
            if let Err(e) = f {
                let (code, message) = refused(&e);
                return result.with_error_code(code).with_error_message(message);
            }
            if let Some((code, message)) = &failure {
                return result.with_error_code(*code).with_error_message(message.clone());
            }
            let matching = removed
                .next()
                .unwrap_or_default()
                .into_iter()
                .map(|acl| {
                    DeleteAclsMatchingAcl::default()
                        .with_resource_type(acl.resource_type)
                        .with_resource_name(text(acl.resource_name))
                        .with_pattern_type(acl.pattern_type)
                        .with_principal(text(acl.principal))
                        .with_host(text(acl.host))
                        .with_operation(acl.operation)
                        .with_permission_type(acl.permission_type)
                })
                .collect();
            result.with_matching_acls(matching)
        })
        .collect();
    DeleteAclsResponse::default().with_filter_results(results)
}

/// KIP-546's match types of a DescribeClientQuotas component.
const MATCH_EXACT: i8 = 0;
const MATCH_DEFAULT: i8 = 1;
const MATCH_SPECIFIED: i8 = 2;

pub(super) fn describe_client_quotas(
    ctx: &Arc<BrokerContext>,
    req: DescribeClientQuotasRequest,
) -> DescribeClientQuotasResponse {
    let invalid = |message: String| {
        DescribeClientQuotasResponse::default()
            .with_error_code(ResponseError::InvalidRequest.code())
            .with_error_message(Some(text(message)))
    };
    let mut components: BTreeMap<&str, (i8, Option<&str>)> = BTreeMap::new();
    for c in &req.components {
        let kind = c.entity_type.as_str();
        if ![security::QUOTA_USER, security::QUOTA_CLIENT_ID, security::QUOTA_IP].contains(&kind) {
            return invalid(format!("unknown entity type {kind:?}"));
        }
        if c.match_type == MATCH_EXACT && c._match.is_none() {
            return invalid(format!("an exact match of {kind} needs a name"));
        }
        if ![MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED].contains(&c.match_type) {
            return invalid(format!("unknown match type {}", c.match_type));
        }
        if components.insert(kind, (c.match_type, c._match.as_ref().map(|m| m.as_str()))).is_some() {
            return invalid(format!("entity type {kind} appears twice"));
        }
    }
    let image = ctx.image();
    let matches = |entity: &QuotaEntity| {
        let kinds_match = !req.strict || entity.len() == components.len();
        kinds_match
            && components.iter().all(|(kind, (match_type, name))| {
                entity.iter().find(|(k, _)| k == kind).is_some_and(|(_, entity_name)| match *match_type {
                    MATCH_EXACT => entity_name.as_deref() == *name,
                    MATCH_DEFAULT => entity_name.is_none(),
                    _ => entity_name.is_some(),
                })
            })
    };
    let entries = image
        .state
        .security
        .quotas
        .iter()
        .filter(|(entity, _)| matches(entity))
        .map(|(entity, values)| {
            let entity = entity
                .iter()
                .map(|(kind, name)| {
                    EntityData::default().with_entity_type(text(kind.clone())).with_entity_name(name.clone().map(text))
                })
                .collect();
            let values =
                values.iter().map(|(key, value)| ValueData::default().with_key(text(key.clone())).with_value(*value));
            EntryData::default().with_entity(entity).with_values(values.collect())
        })
        .collect();
    DescribeClientQuotasResponse::default().with_entries(Some(entries))
}

pub(super) async fn alter_client_quotas(
    ctx: &Arc<BrokerContext>,
    req: AlterClientQuotasRequest,
) -> AlterClientQuotasResponse {
    let mut answers: Vec<Option<Answer>> = Vec::with_capacity(req.entries.len());
    let mut valid: Vec<QuotaEntry> = Vec::new();
    for e in &req.entries {
        let mut entity: QuotaEntity = e
            .entity
            .iter()
            .map(|d| (d.entity_type.to_string(), d.entity_name.as_ref().map(|n| n.to_string())))
            .collect();
        entity.sort();
        let ops = e
            .ops
            .iter()
            .map(|op| QuotaOp { key: op.key.to_string(), value: (!op.remove).then_some(op.value) })
            .collect();
        let entry = QuotaEntry { entity, ops };
        let duplicate = valid.iter().any(|v| v.entity == entry.entity);
        match security::check_quota_entry(&entry) {
            Err(e) => answers.push(Some(refused(&e))),
            Ok(()) if duplicate => {
                let error = CommandError::InvalidClientQuota("an entity appears twice in the request".into());
                answers.push(Some(refused(&error)));
            }
            Ok(()) => {
                valid.push(entry);
                answers.push(None);
            }
        }
    }
    let mut outcome = Ok(Vec::new());
    if !req.validate_only {
        for chunk in valid.chunks(security::MAX_ITEMS_PER_COMMAND) {
            outcome = commit(ctx, Command::AlterClientQuotas { entries: chunk.to_vec() }).await;
            if outcome.is_err() {
                break;
            }
        }
    }
    let committed = outcome.map_or_else(|e| e, |_| (0, None));
    let entries = req
        .entries
        .iter()
        .zip(answers)
        .map(|(e, answer)| {
            let (code, message) = answer.unwrap_or_else(|| committed.clone());
            let entity = e
                .entity
                .iter()
                .map(|d| {
                    AlteredEntity::default()
                        .with_entity_type(d.entity_type.clone())
                        .with_entity_name(d.entity_name.clone())
                })
                .collect();
            AlteredEntry::default().with_error_code(code).with_error_message(message).with_entity(entity)
        })
        .collect();
    AlterClientQuotasResponse::default().with_entries(entries)
}
