//! The security metadata the quorum holds: SCRAM credentials (KIP-554), ACL bindings and client quotas
//! (KIP-546), with the rules [`ClusterState::apply`] keeps for the commands that change them. No I/O, no
//! authentication and no authorization: the SASL mechanisms, the authorizer and the quota enforcement read
//! this state from the broker's metadata image and do their own work.
//!
//! What is stored, and in which form:
//! - SCRAM credentials as RFC 5802's salted keys (salt, iterations, StoredKey, ServerKey), never a
//!   password; mechanisms by KIP-554's codes ([`SCRAM_SHA_256`], [`SCRAM_SHA_512`]).
//! - ACL bindings with Kafka's numeric codes, only concrete ones (no ANY, MATCH or UNKNOWN), checked as
//!   Kafka's controller checks a new binding: a CLUSTER resource is named `kafka-cluster`, a principal is
//!   `Type:name`, a host is non-empty (`*` for any).
//! - Client quotas per entity (a sorted list of `(entity type, name)` pairs, `None` naming the default
//!   entity of that type), each a map of Kafka's quota keys to values.
//!
//! Per-item errors. Kafka answers AlterUserScramCredentials per user, CreateAcls per binding and
//! AlterClientQuotas per entity. Here every command is all-or-nothing (a refused command changes nothing,
//! as every other command), and the handlers validate each item against the metadata image with the same
//! checks first ([`check_upsertion`], [`check_acl`], [`check_quota_entry`], ...), answer the invalid ones
//! with their own errors and propose the valid ones in one command: one quorum round trip per request,
//! not one per item. A command refused anyway (the image was behind: a user deleted meanwhile) answers
//! its error for every item it carried, as Kafka answers a controller that refused the batch.
//!
//! Every command is bounded ([`MAX_ITEMS_PER_COMMAND`]): a request can make every voter and broker hold
//! only so much at once. Kafka sets no limit on the number of ACLs in force; neither does this.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::command_error::CommandError;

/// KIP-554's mechanism codes.
pub const SCRAM_SHA_256: i8 = 1;
pub const SCRAM_SHA_512: i8 = 2;
/// Kafka's bounds on a SCRAM credential's iteration count.
pub const SCRAM_MIN_ITERATIONS: u32 = 4096;
pub const SCRAM_MAX_ITERATIONS: u32 = 16384;
/// The most items (credentials, bindings, filters, quota entities) one command carries.
pub const MAX_ITEMS_PER_COMMAND: usize = 1000;
/// The longest user name, principal, resource name or host a command may carry (bytes).
pub const MAX_NAME_BYTES: usize = 1024;
/// The longest salt a SCRAM credential may have (bytes).
pub const MAX_SALT_BYTES: usize = 1024;

/// A SCRAM mechanism's name (`SCRAM-SHA-256`) from its KIP-554 code.
pub fn scram_mechanism_name(code: i8) -> Option<&'static str> {
    match code {
        SCRAM_SHA_256 => Some("SCRAM-SHA-256"),
        SCRAM_SHA_512 => Some("SCRAM-SHA-512"),
        _ => None,
    }
}

/// A SCRAM mechanism's KIP-554 code from its name.
pub fn scram_mechanism_code(name: &str) -> Option<i8> {
    match name {
        "SCRAM-SHA-256" => Some(SCRAM_SHA_256),
        "SCRAM-SHA-512" => Some(SCRAM_SHA_512),
        _ => None,
    }
}

/// The length of a mechanism's StoredKey and ServerKey (its digest's output).
pub fn scram_key_len(code: i8) -> Option<usize> {
    match code {
        SCRAM_SHA_256 => Some(32),
        SCRAM_SHA_512 => Some(64),
        _ => None,
    }
}

/// Kafka's resource type codes (concrete ones).
pub mod resource_type {
    pub const ANY: i8 = 1;
    pub const TOPIC: i8 = 2;
    pub const GROUP: i8 = 3;
    pub const CLUSTER: i8 = 4;
    pub const TRANSACTIONAL_ID: i8 = 5;
    pub const DELEGATION_TOKEN: i8 = 6;
    pub const USER: i8 = 7;
}

/// Kafka's pattern type codes.
pub mod pattern_type {
    pub const ANY: i8 = 1;
    pub const MATCH: i8 = 2;
    pub const LITERAL: i8 = 3;
    pub const PREFIXED: i8 = 4;
}

/// Kafka's ACL operation codes.
pub mod operation {
    pub const ANY: i8 = 1;
    pub const ALL: i8 = 2;
    pub const READ: i8 = 3;
    pub const WRITE: i8 = 4;
    pub const CREATE: i8 = 5;
    pub const DELETE: i8 = 6;
    pub const ALTER: i8 = 7;
    pub const DESCRIBE: i8 = 8;
    pub const CLUSTER_ACTION: i8 = 9;
    pub const DESCRIBE_CONFIGS: i8 = 10;
    pub const ALTER_CONFIGS: i8 = 11;
    pub const IDEMPOTENT_WRITE: i8 = 12;
    pub const CREATE_TOKENS: i8 = 13;
    pub const DESCRIBE_TOKENS: i8 = 14;
}

/// Kafka's permission type codes.
pub mod permission_type {
    pub const ANY: i8 = 1;
    pub const DENY: i8 = 2;
    pub const ALLOW: i8 = 3;
}

/// The only name a CLUSTER resource has.
pub const CLUSTER_RESOURCE_NAME: &str = "kafka-cluster";
/// The literal resource name and host that match any.
pub const WILDCARD: &str = "*";

/// One user's credential for one mechanism: RFC 5802's salted keys.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ScramCredentialRecord {
    pub salt: Vec<u8>,
    pub iterations: u32,
    /// H(ClientKey).
    pub stored_key: Vec<u8>,
    /// HMAC(SaltedPassword, "Server Key").
    pub server_key: Vec<u8>,
}

impl std::fmt::Debug for ScramCredentialRecord {
    /// Without the keys: whoever holds the ServerKey can pose as the broker to a client.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramCredentialRecord").field("iterations", &self.iterations).finish_non_exhaustive()
    }
}

/// Adds or replaces a user's credential for one mechanism.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ScramUpsertion {
    pub user: String,
    pub mechanism: i8,
    pub credential: ScramCredentialRecord,
}

/// Removes a user's credential for one mechanism.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct ScramDeletion {
    pub user: String,
    pub mechanism: i8,
}

/// An ACL binding, with Kafka's codes (see [`resource_type`], [`pattern_type`], [`operation`],
/// [`permission_type`]).
#[derive(
    Debug,
    Clone,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    Deserialize,
    rkyv::Archive,
    rkyv::Serialize,
    rkyv::Deserialize,
)]
#[rkyv(derive(PartialEq, Eq, PartialOrd, Ord))]
pub struct AclRecord {
    pub resource_type: i8,
    pub resource_name: String,
    pub pattern_type: i8,
    /// `Type:name`, as `User:alice`.
    pub principal: String,
    /// An address, or `*` for any.
    pub host: String,
    pub operation: i8,
    pub permission_type: i8,
}

/// Which bindings a DescribeAcls or DeleteAcls selects, as the request carries it: ANY (and MATCH for the
/// pattern type) in the codes, `None` for any name, principal or host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct AclFilter {
    pub resource_type: i8,
    pub resource_name: Option<String>,
    pub pattern_type: i8,
    pub principal: Option<String>,
    pub host: Option<String>,
    pub operation: i8,
    pub permission_type: i8,
}

/// A client quota entity: `(entity type, name)` pairs sorted by type, `None` naming the default entity.
pub type QuotaEntity = Vec<(String, Option<String>)>;

/// Kafka's quota entity types.
pub const QUOTA_USER: &str = "user";
pub const QUOTA_CLIENT_ID: &str = "client-id";
pub const QUOTA_IP: &str = "ip";

/// Kafka's client quota keys.
pub const PRODUCER_BYTE_RATE: &str = "producer_byte_rate";
pub const CONSUMER_BYTE_RATE: &str = "consumer_byte_rate";
pub const REQUEST_PERCENTAGE: &str = "request_percentage";
pub const CONNECTION_CREATION_RATE: &str = "connection_creation_rate";

/// One key of a quota entity: set to `Some(value)`, or removed with `None`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct QuotaOp {
    pub key: String,
    pub value: Option<f64>,
}

/// The changes to one quota entity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize)]
pub struct QuotaEntry {
    pub entity: QuotaEntity,
    pub ops: Vec<QuotaOp>,
}

/// Commands are compared as values (tests, retries); a NaN value, the one f64 unequal to itself, is
/// refused by apply and never proposed by a broker.
impl Eq for QuotaOp {}
impl Eq for QuotaEntry {}

/// The security metadata: SCRAM credentials, ACL bindings and client quotas.
#[derive(
    Debug, Clone, Default, PartialEq, Serialize, Deserialize, rkyv::Archive, rkyv::Serialize, rkyv::Deserialize,
)]
pub struct SecurityState {
    /// User -> mechanism code -> credential.
    pub scram: BTreeMap<String, BTreeMap<i8, ScramCredentialRecord>>,
    pub acls: BTreeSet<AclRecord>,
    /// Entity -> quota key -> value; an entity without keys is not kept.
    pub quotas: BTreeMap<QuotaEntity, BTreeMap<String, f64>>,
    /// Bumped by every command that changes `acls`: an authorizer rebuilds its index when it moves. The
    /// same log gives the same count on every voter and broker, snapshots included.
    pub acls_version: u64,
    /// Bumped by every command that changes `quotas`.
    pub quotas_version: u64,
    /// Bumped by every command that changes `scram`.
    pub scram_version: u64,
}

/// Quota values are finite (apply refuses NaN and infinities), so equality is total.
impl Eq for SecurityState {}

impl SecurityState {
    /// A user's credential for a mechanism.
    pub fn scram_credential(&self, user: &str, mechanism: i8) -> Option<&ScramCredentialRecord> {
        self.scram.get(user)?.get(&mechanism)
    }

    /// Applies `AlterScramCredentials`: every item valid, or nothing changes.
    pub(super) fn alter_scram(
        &mut self,
        upsertions: &[ScramUpsertion],
        deletions: &[ScramDeletion],
    ) -> Result<(), CommandError> {
        check_count(upsertions.len() + deletions.len())?;
        let mut seen = BTreeSet::new();
        for (user, mechanism) in
            deletions.iter().map(|d| (&d.user, d.mechanism)).chain(upsertions.iter().map(|u| (&u.user, u.mechanism)))
        {
            if !seen.insert(user) {
                return Err(CommandError::DuplicateResource(user.clone()));
            }
            check_user(user)?;
            scram_key_len(mechanism).ok_or(CommandError::UnsupportedSaslMechanism(mechanism))?;
        }
        for d in deletions {
            self.scram_credential(&d.user, d.mechanism)
                .ok_or_else(|| CommandError::ResourceNotFound(d.user.clone()))?;
        }
        for u in upsertions {
            check_upsertion(u)?;
        }
        for d in deletions {
            let removed_all = self.scram.get_mut(&d.user).is_some_and(|m| {
                m.remove(&d.mechanism);
                m.is_empty()
            });
            if removed_all {
                self.scram.remove(&d.user);
            }
        }
        for u in upsertions {
            self.scram.entry(u.user.clone()).or_default().insert(u.mechanism, u.credential.clone());
        }
        if !(upsertions.is_empty() && deletions.is_empty()) {
            self.scram_version += 1;
        }
        Ok(())
    }

    /// Applies `CreateAcls`: every binding valid, or nothing changes. A binding already present stays
    /// as it is (Kafka's CreateAcls is idempotent).
    pub(super) fn create_acls(&mut self, acls: &[AclRecord]) -> Result<(), CommandError> {
        check_count(acls.len())?;
        for acl in acls {
            check_acl(acl)?;
        }
        let before = self.acls.len();
        self.acls.extend(acls.iter().cloned());
        if self.acls.len() != before {
            self.acls_version += 1;
        }
        Ok(())
    }

    /// Applies `DeleteAcls`: the bindings each filter removed, in filter order. A binding that several
    /// filters match is reported by the first of them only.
    pub(super) fn delete_acls(&mut self, filters: &[AclFilter]) -> Result<Vec<Vec<AclRecord>>, CommandError> {
        check_count(filters.len())?;
        for filter in filters {
            check_filter(filter)?;
        }
        let mut removed = Vec::with_capacity(filters.len());
        for filter in filters {
            let matched: Vec<AclRecord> = self.acls.iter().filter(|acl| filter.matches(acl)).cloned().collect();
            for acl in &matched {
                self.acls.remove(acl);
            }
            removed.push(matched);
        }
        if removed.iter().any(|m| !m.is_empty()) {
            self.acls_version += 1;
        }
        Ok(removed)
    }

    /// Applies `AlterClientQuotas`: every entry valid, or nothing changes.
    pub(super) fn alter_quotas(&mut self, entries: &[QuotaEntry]) -> Result<(), CommandError> {
        check_count(entries.len())?;
        let mut seen = BTreeSet::new();
        for entry in entries {
            check_quota_entry(entry)?;
            if !seen.insert(&entry.entity) {
                return Err(CommandError::InvalidClientQuota("an entity appears twice".into()));
            }
        }
        for entry in entries {
            let values = self.quotas.entry(entry.entity.clone()).or_default();
            for op in &entry.ops {
                match op.value {
                    Some(value) => values.insert(op.key.clone(), value),
                    None => values.remove(&op.key),
                };
            }
            if values.is_empty() {
                self.quotas.remove(&entry.entity);
            }
        }
        if !entries.is_empty() {
            self.quotas_version += 1;
        }
        Ok(())
    }
}

fn check_count(items: usize) -> Result<(), CommandError> {
    if items > MAX_ITEMS_PER_COMMAND {
        return Err(CommandError::TooManyItems { items, max: MAX_ITEMS_PER_COMMAND });
    }
    Ok(())
}

fn check_user(user: &str) -> Result<(), CommandError> {
    if user.is_empty() {
        return Err(CommandError::UnacceptableCredential("a user name must not be empty".into()));
    }
    if user.len() > MAX_NAME_BYTES {
        return Err(CommandError::UnacceptableCredential(format!("a user name is at most {MAX_NAME_BYTES} bytes")));
    }
    Ok(())
}

/// Kafka's checks of a new SCRAM credential.
pub fn check_upsertion(u: &ScramUpsertion) -> Result<(), CommandError> {
    check_user(&u.user)?;
    let key_len = scram_key_len(u.mechanism).ok_or(CommandError::UnsupportedSaslMechanism(u.mechanism))?;
    let c = &u.credential;
    if !(SCRAM_MIN_ITERATIONS..=SCRAM_MAX_ITERATIONS).contains(&c.iterations) {
        return Err(CommandError::UnacceptableCredential(format!(
            "iterations {} not in [{SCRAM_MIN_ITERATIONS}, {SCRAM_MAX_ITERATIONS}]",
            c.iterations
        )));
    }
    if c.salt.is_empty() || c.salt.len() > MAX_SALT_BYTES {
        return Err(CommandError::UnacceptableCredential(format!("a salt has 1 to {MAX_SALT_BYTES} bytes")));
    }
    if c.stored_key.len() != key_len || c.server_key.len() != key_len {
        return Err(CommandError::UnacceptableCredential(format!("the keys must be {key_len} bytes")));
    }
    Ok(())
}

fn invalid_acl(reason: impl Into<String>) -> Result<(), CommandError> {
    Err(CommandError::InvalidAclBinding(reason.into()))
}

fn check_name(what: &str, name: &str) -> Result<(), CommandError> {
    if name.len() > MAX_NAME_BYTES {
        return invalid_acl(format!("a {what} is at most {MAX_NAME_BYTES} bytes"));
    }
    Ok(())
}

/// Whether `principal` is Kafka's `Type:name` (both parts non-empty).
fn check_principal(principal: &str) -> Result<(), CommandError> {
    check_name("principal", principal)?;
    match principal.split_once(':') {
        Some((kind, name)) if !kind.is_empty() && !name.is_empty() => Ok(()),
        _ => invalid_acl(format!("principal {principal:?} is not Type:name")),
    }
}

/// Kafka's checks of a new ACL binding: concrete codes, a named resource (`kafka-cluster` for CLUSTER), a
/// `Type:name` principal and a non-empty host.
pub fn check_acl(acl: &AclRecord) -> Result<(), CommandError> {
    if !(resource_type::TOPIC..=resource_type::USER).contains(&acl.resource_type) {
        return invalid_acl(format!("resource type {} is not a concrete one", acl.resource_type));
    }
    if !matches!(acl.pattern_type, pattern_type::LITERAL | pattern_type::PREFIXED) {
        return invalid_acl(format!("pattern type {} is neither LITERAL nor PREFIXED", acl.pattern_type));
    }
    if !(operation::ALL..=operation::DESCRIBE_TOKENS).contains(&acl.operation) {
        return invalid_acl(format!("operation {} is not a concrete one", acl.operation));
    }
    if !matches!(acl.permission_type, permission_type::ALLOW | permission_type::DENY) {
        return invalid_acl(format!("permission type {} is neither ALLOW nor DENY", acl.permission_type));
    }
    check_name("resource name", &acl.resource_name)?;
    if acl.resource_name.is_empty() {
        return invalid_acl("a resource name must not be empty");
    }
    if acl.resource_type == resource_type::CLUSTER && acl.resource_name != CLUSTER_RESOURCE_NAME {
        return invalid_acl(format!("a CLUSTER resource is named {CLUSTER_RESOURCE_NAME}"));
    }
    check_principal(&acl.principal)?;
    check_name("host", &acl.host)?;
    if acl.host.is_empty() {
        return invalid_acl("a host must not be empty (`*` for any)");
    }
    Ok(())
}

/// The checks of a DescribeAcls or DeleteAcls filter: known codes (UNKNOWN matches nothing, so Kafka
/// refuses it), a well-formed principal where one is given.
pub fn check_filter(filter: &AclFilter) -> Result<(), CommandError> {
    if !(resource_type::ANY..=resource_type::USER).contains(&filter.resource_type) {
        return invalid_acl(format!("resource type {} is unknown", filter.resource_type));
    }
    if !(pattern_type::ANY..=pattern_type::PREFIXED).contains(&filter.pattern_type) {
        return invalid_acl(format!("pattern type {} is unknown", filter.pattern_type));
    }
    if !(operation::ANY..=operation::DESCRIBE_TOKENS).contains(&filter.operation) {
        return invalid_acl(format!("operation {} is unknown", filter.operation));
    }
    if !(permission_type::ANY..=permission_type::ALLOW).contains(&filter.permission_type) {
        return invalid_acl(format!("permission type {} is unknown", filter.permission_type));
    }
    if let Some(principal) = &filter.principal {
        check_principal(principal)?;
    }
    for name in filter.resource_name.iter().chain(&filter.host) {
        check_name("filter field", name)?;
    }
    Ok(())
}

impl AclFilter {
    /// Kafka's filter semantics: ANY (and `None`) match everything; with MATCH, a binding matches when it
    /// would apply to the named resource: LITERAL with the same name or `*`, or PREFIXED with a prefix of it.
    pub fn matches(&self, acl: &AclRecord) -> bool {
        let code = |want: i8, any: i8, have: i8| want == any || want == have;
        if !code(self.resource_type, resource_type::ANY, acl.resource_type)
            || !code(self.operation, operation::ANY, acl.operation)
            || !code(self.permission_type, permission_type::ANY, acl.permission_type)
        {
            return false;
        }
        if self.principal.as_ref().is_some_and(|p| *p != acl.principal)
            || self.host.as_ref().is_some_and(|h| *h != acl.host)
        {
            return false;
        }
        match (self.pattern_type, &self.resource_name) {
            (pattern_type::ANY, name) => name.as_ref().is_none_or(|n| *n == acl.resource_name),
            (pattern_type::MATCH, None) => true,
            (pattern_type::MATCH, Some(name)) => match acl.pattern_type {
                pattern_type::LITERAL => acl.resource_name == *name || acl.resource_name == WILDCARD,
                pattern_type::PREFIXED => name.starts_with(&acl.resource_name),
                _ => false,
            },
            (exact, name) => exact == acl.pattern_type && name.as_ref().is_none_or(|n| *n == acl.resource_name),
        }
    }
}

fn invalid_quota(reason: impl Into<String>) -> Result<(), CommandError> {
    Err(CommandError::InvalidClientQuota(reason.into()))
}

/// Kafka's checks of a client quota entity: known types, sorted, each at most once, `ip` alone and naming
/// an address when it names one.
pub fn check_quota_entity(entity: &QuotaEntity) -> Result<(), CommandError> {
    if entity.is_empty() {
        return invalid_quota("an entity needs at least one entity type");
    }
    for (kind, name) in entity {
        if ![QUOTA_USER, QUOTA_CLIENT_ID, QUOTA_IP].contains(&kind.as_str()) {
            return invalid_quota(format!("unknown entity type {kind:?}"));
        }
        if name.as_ref().is_some_and(|n| n.len() > MAX_NAME_BYTES) {
            return invalid_quota(format!("an entity name is at most {MAX_NAME_BYTES} bytes"));
        }
    }
    if entity.windows(2).any(|w| w[0].0 >= w[1].0) {
        return invalid_quota("entity types must be sorted and appear once each");
    }
    if entity.iter().any(|(kind, _)| kind == QUOTA_IP) {
        if entity.len() > 1 {
            return invalid_quota("an ip entity cannot be combined with user or client-id");
        }
        if let Some(Some(name)) = entity.first().map(|(_, n)| n)
            && name.parse::<std::net::IpAddr>().is_err()
        {
            return invalid_quota(format!("{name:?} is not an IP address"));
        }
    }
    Ok(())
}

/// The quota keys an entity may have: `ip` only the connection rate, users and client ids the others.
pub fn quota_keys(entity: &QuotaEntity) -> &'static [&'static str] {
    if entity.iter().any(|(kind, _)| kind == QUOTA_IP) {
        &[CONNECTION_CREATION_RATE]
    } else {
        &[PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE]
    }
}

/// Kafka's checks of a quota change: a valid entity, known keys that entity may have, each once, values
/// finite and above 0 (whole numbers for the rates Kafka types as integers).
pub fn check_quota_entry(entry: &QuotaEntry) -> Result<(), CommandError> {
    check_quota_entity(&entry.entity)?;
    let allowed = quota_keys(&entry.entity);
    let mut seen = BTreeSet::new();
    for op in &entry.ops {
        if !allowed.contains(&op.key.as_str()) {
            return invalid_quota(format!("{:?} is not a quota key this entity may have", op.key));
        }
        if !seen.insert(&op.key) {
            return invalid_quota(format!("key {:?} appears twice", op.key));
        }
        if let Some(value) = op.value {
            if !value.is_finite() || value <= 0.0 {
                return invalid_quota(format!("{} must be a number above 0", op.key));
            }
            if op.key != REQUEST_PERCENTAGE && value.fract() != 0.0 {
                return invalid_quota(format!("{} must be a whole number", op.key));
            }
        }
    }
    Ok(())
}

/// RFC 5802's `Hi(password, salt, iterations)` (PBKDF2 with the mechanism's HMAC): the salted password a
/// KIP-554 client sends. `None` for a mechanism that is not SCRAM or no iterations.
pub fn salt_password(mechanism: i8, password: &[u8], salt: &[u8], iterations: u32) -> Option<Vec<u8>> {
    let (algorithm, len) = match mechanism {
        SCRAM_SHA_256 => (ring::pbkdf2::PBKDF2_HMAC_SHA256, 32),
        SCRAM_SHA_512 => (ring::pbkdf2::PBKDF2_HMAC_SHA512, 64),
        _ => return None,
    };
    let mut salted = vec![0; len];
    ring::pbkdf2::derive(algorithm, std::num::NonZeroU32::new(iterations)?, salt, password, &mut salted);
    Some(salted)
}

/// The credential stored for a salted password: StoredKey = H(HMAC(salted, "Client Key")) and
/// ServerKey = HMAC(salted, "Server Key") (RFC 5802). The salted password itself is not kept.
pub fn credential_from_salted_password(
    mechanism: i8,
    salt: &[u8],
    iterations: u32,
    salted_password: &[u8],
) -> Option<ScramCredentialRecord> {
    let (hmac, digest) = match mechanism {
        SCRAM_SHA_256 => (ring::hmac::HMAC_SHA256, &ring::digest::SHA256),
        SCRAM_SHA_512 => (ring::hmac::HMAC_SHA512, &ring::digest::SHA512),
        _ => return None,
    };
    let key = ring::hmac::Key::new(hmac, salted_password);
    let client_key = ring::hmac::sign(&key, b"Client Key");
    let stored_key = ring::digest::digest(digest, client_key.as_ref()).as_ref().to_vec();
    let server_key = ring::hmac::sign(&key, b"Server Key").as_ref().to_vec();
    Some(ScramCredentialRecord { salt: salt.to_vec(), iterations, stored_key, server_key })
}

/// A new random salt, as long as the mechanism's digest (Kafka's `ScramFormatter` uses a random salt too).
pub fn random_salt(mechanism: i8) -> Option<Vec<u8>> {
    use ring::rand::SecureRandom;
    let mut salt = vec![0; scram_key_len(mechanism)?];
    ring::rand::SystemRandom::new().fill(&mut salt).ok()?;
    Some(salt)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677's SCRAM-SHA-256 example: user "user", password "pencil", the salt below, 4096 iterations.
    #[test]
    fn keys_match_rfc_7677s_example() {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let salt = b64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let salted = salt_password(SCRAM_SHA_256, b"pencil", &salt, 4096).unwrap();
        let credential = credential_from_salted_password(SCRAM_SHA_256, &salt, 4096, &salted).unwrap();
        // ServerSignature = HMAC(ServerKey, AuthMessage) is the example's "v=" value.
        let auth_message = "n=user,r=rOprNGfwEbeRWgbNEkqO,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                            s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
        let server_key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &credential.server_key);
        let signature = ring::hmac::sign(&server_key, auth_message.as_bytes());
        assert_eq!(b64.encode(signature.as_ref()), "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
        assert_eq!(credential.stored_key.len(), 32);
        assert_eq!(salt_password(3, b"pencil", &salt, 4096), None);
        assert_eq!(random_salt(SCRAM_SHA_512).map(|s| s.len()), Some(64));
    }
}
