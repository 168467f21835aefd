//! Authorization: who may do what to which resource, decided as Kafka's `StandardAuthorizer` decides it,
//! and the request edge that asks it for every request ([`rules`]).
//!
//! This module does no I/O. It is given the ACLs in force (from the quorum, by its caller) and answers
//! questions; it never stores, loads or logs on its own (the request edge logs).
//!
//! # The rules (Kafka's)
//!
//! 1. A principal named in `super.users` may do everything.
//! 2. Otherwise the ACLs that apply to the resource are those of its type whose pattern covers its name:
//!    the LITERAL name itself, the LITERAL `*`, and every PREFIXED pattern the name starts with.
//! 3. Of those, a rule counts when its principal is the asker's or `User:*` and its host is `*` or the
//!    client's IP address. A DENY rule counts for its own operation or ALL; an ALLOW rule for its own
//!    operation, ALL, or an operation it implies (READ, WRITE, DELETE and ALTER imply DESCRIBE;
//!    ALTER_CONFIGS implies DESCRIBE_CONFIGS).
//! 4. Any counting DENY denies; else any counting ALLOW allows.
//! 5. Else, when no ACL at all applies to the resource (whoever it names), the answer is
//!    `allow.everyone.if.no.acl.found` (default false: denied); when some apply but none counts, denied.
//!
//! # Design: rebuilt whole, shared read-only
//!
//! An [`Authorizer`] is immutable: built from an iterator of [`AclBinding`]s and the settings, then only
//! read. When the ACLs change, the caller builds a new one and swaps it in (an `Arc` per shard). ACLs
//! change rarely (an administrator's CreateAcls / DeleteAcls) and decisions are made on every request,
//! so the index is shaped for reading: no lock, no incremental update to get wrong, and a decision never
//! sees half a change. Building 10,000 ACLs takes milliseconds, which an ACL change can afford.

pub mod acl;
mod index;
pub mod rules;

use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;

use acl::{AclBinding, AclOperation, PatternType, ResourceType, WILDCARD_RESOURCE};
use index::AclIndex;

/// The authorizer's settings, with Kafka's names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AuthorizerConfig {
    /// `super.users`: principals (`User:admin`) allowed everything.
    pub super_users: Vec<String>,
    /// `allow.everyone.if.no.acl.found` (default false): the answer for a resource no ACL applies to.
    pub allow_everyone_if_no_acl_found: bool,
}

/// Who asks: the connection's authenticated principal and the client's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestContext {
    /// `Type:name`, e.g. `User:alice` (`User:ANONYMOUS` on a PLAINTEXT listener, as in Kafka).
    pub principal: String,
    pub host: IpAddr,
}

/// A concrete resource a request touches: a type and a name (what Kafka calls a LITERAL resource pattern).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource<'a> {
    pub resource_type: ResourceType,
    pub name: &'a str,
}

impl<'a> Resource<'a> {
    pub fn topic(name: &'a str) -> Self {
        Resource { resource_type: ResourceType::Topic, name }
    }

    pub fn group(name: &'a str) -> Self {
        Resource { resource_type: ResourceType::Group, name }
    }

    pub fn transactional_id(name: &'a str) -> Self {
        Resource { resource_type: ResourceType::TransactionalId, name }
    }

    /// The one CLUSTER resource, `kafka-cluster`.
    pub fn cluster() -> Resource<'static> {
        Resource { resource_type: ResourceType::Cluster, name: acl::CLUSTER_NAME }
    }
}

impl fmt::Display for Resource<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.resource_type, PatternType::Literal, self.name)
    }
}

/// An authorization answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allowed,
    Denied,
}

impl Decision {
    pub fn is_allowed(self) -> bool {
        self == Decision::Allowed
    }

    fn from_bool(allowed: bool) -> Decision {
        if allowed { Decision::Allowed } else { Decision::Denied }
    }
}

/// The ACLs in force and the settings, ready to answer. See the module doc for the rules and why it
/// is rebuilt whole rather than updated.
#[derive(Debug, Default)]
pub struct Authorizer {
    super_users: HashSet<String>,
    allow_everyone_if_no_acl_found: bool,
    index: AclIndex,
}

impl Authorizer {
    /// Builds the authorizer for these ACLs and settings.
    pub fn new(config: &AuthorizerConfig, acls: impl IntoIterator<Item = AclBinding>) -> Authorizer {
        Authorizer {
            super_users: config.super_users.iter().cloned().collect(),
            allow_everyone_if_no_acl_found: config.allow_everyone_if_no_acl_found,
            index: AclIndex::build(acls),
        }
    }

    /// Whether `principal` is named in `super.users`.
    pub fn is_super_user(&self, principal: &str) -> bool {
        self.super_users.contains(principal)
    }

    /// The number of ACLs in force.
    pub fn acl_count(&self) -> usize {
        self.index.len()
    }

    /// Whether `ctx` may do `operation` to `resource`.
    pub fn authorize(&self, ctx: &RequestContext, operation: AclOperation, resource: &Resource<'_>) -> Decision {
        if self.super_users.contains(&ctx.principal) {
            return Decision::Allowed;
        }
        let mut any_acl = false;
        let mut allowed = false;
        let mut denied = false;
        self.index.of_type(resource.resource_type).for_each_group(resource.name, |rules| {
            any_acl = true;
            for rule in rules {
                if !rule.matches_who(&ctx.principal, ctx.host) {
                    continue;
                }
                if rule.allow {
                    allowed |= rule.operation.allow_grants(operation);
                } else if rule.operation.deny_covers(operation) {
                    denied = true;
                    return false;
                }
            }
            true
        });
        if denied {
            Decision::Denied
        } else if allowed {
            Decision::Allowed
        } else {
            Decision::from_bool(!any_acl && self.allow_everyone_if_no_acl_found)
        }
    }

    /// Whether `ctx` may do `operation` to at least one resource of `resource_type` (Kafka's
    /// `authorizeByResourceType`, KIP-679: InitProducerId without a transactional id is allowed with
    /// WRITE on any topic). Allowed when Kafka's probe of a resource named `hardcode` is allowed (super
    /// users, `allow.everyone.if.no.acl.found`); denied by a DENY on the LITERAL `*`; else allowed when
    /// some ALLOW pattern (by exact operation or ALL, no implied operations) is not dominated by a DENY:
    /// a LITERAL allow by a DENY on the same name or on a prefix of it, a PREFIXED allow by a DENY on a
    /// prefix of it.
    pub fn authorize_any(
        &self,
        ctx: &RequestContext,
        operation: AclOperation,
        resource_type: ResourceType,
    ) -> Decision {
        // Kafka's own probe name: a resource of this type that nobody names, so that only super users,
        // the `*` and `allow.everyone.if.no.acl.found` can allow it.
        let probe = Resource { resource_type, name: "hardcode" };
        if self.authorize(ctx, operation, &probe).is_allowed() {
            return Decision::Allowed;
        }
        let mut deny_literal = HashSet::new();
        let mut deny_prefixed = HashSet::new();
        let mut allows = Vec::new();
        let mut wildcard_allow = false;
        for patterned in &self.index.of_type(resource_type).all {
            let rule = &patterned.rule;
            if !rule.matches_who(&ctx.principal, ctx.host) || !rule.operation.deny_covers(operation) {
                continue;
            }
            let name = &*patterned.name;
            match (rule.allow, patterned.pattern_type) {
                (false, PatternType::Literal) if name == WILDCARD_RESOURCE => return Decision::Denied,
                (false, PatternType::Literal) => {
                    deny_literal.insert(name);
                }
                (false, _) => {
                    deny_prefixed.insert(name);
                }
                // Not an answer yet: a DENY on `*` later in the list still wins.
                (true, PatternType::Literal) if name == WILDCARD_RESOURCE => wildcard_allow = true,
                (true, pattern_type) => allows.push((pattern_type, name)),
            }
        }
        if wildcard_allow {
            return Decision::Allowed;
        }
        let dominated_by_prefix =
            |name: &str| name.char_indices().any(|(i, c)| deny_prefixed.contains(&name[..i + c.len_utf8()]));
        let any_free = allows.iter().any(|&(pattern_type, name)| {
            let denied_literal = pattern_type == PatternType::Literal && deny_literal.contains(name);
            !denied_literal && !dominated_by_prefix(name)
        });
        Decision::from_bool(any_free)
    }
}

#[cfg(test)]
mod tests;
