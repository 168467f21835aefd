//! ACL bindings for `shardlog acl add|list|remove`, over CreateAcls, DescribeAcls and DeleteAcls (v3,
//! or the newest both sides speak), with Kafka's codes and names as `kafka-acls` shows them.
//!
//! A binding says: `principal` from `host` is ALLOWed or DENYed `operation` on the resources a pattern
//! (resource type, name, LITERAL or PREFIXED) covers. A filter has the same fields, each of which may be
//! left open (ANY, or no name, principal or host); pattern type MATCH finds every binding that applies
//! to the named resource (literal, wildcard and prefixed ones).

use anyhow::{Context, Result, bail};
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::delete_acls_request::DeleteAclsFilter;
use kafka_protocol::messages::{ApiKey, CreateAclsRequest, DeleteAclsRequest, DescribeAclsRequest, ResponseKind};
use kafka_protocol::protocol::StrBytes;

use super::{KafkaClient, check_said};
use crate::quorum::security::{operation, pattern_type, permission_type, resource_type};

/// The versions this client speaks (v2 and up: pattern types; v3: flexible versions).
const ACL_VERSIONS: (i16, i16) = (1, 3);

/// Kafka's names for the codes, as `kafka-acls` prints them.
const RESOURCE_TYPES: [(i8, &str); 7] = [
    (resource_type::ANY, "Any"),
    (resource_type::TOPIC, "Topic"),
    (resource_type::GROUP, "Group"),
    (resource_type::CLUSTER, "Cluster"),
    (resource_type::TRANSACTIONAL_ID, "TransactionalId"),
    (resource_type::DELEGATION_TOKEN, "DelegationToken"),
    (resource_type::USER, "User"),
];
const PATTERN_TYPES: [(i8, &str); 4] = [
    (pattern_type::ANY, "Any"),
    (pattern_type::MATCH, "Match"),
    (pattern_type::LITERAL, "Literal"),
    (pattern_type::PREFIXED, "Prefixed"),
];
const OPERATIONS: [(i8, &str); 14] = [
    (operation::ANY, "Any"),
    (operation::ALL, "All"),
    (operation::READ, "Read"),
    (operation::WRITE, "Write"),
    (operation::CREATE, "Create"),
    (operation::DELETE, "Delete"),
    (operation::ALTER, "Alter"),
    (operation::DESCRIBE, "Describe"),
    (operation::CLUSTER_ACTION, "ClusterAction"),
    (operation::DESCRIBE_CONFIGS, "DescribeConfigs"),
    (operation::ALTER_CONFIGS, "AlterConfigs"),
    (operation::IDEMPOTENT_WRITE, "IdempotentWrite"),
    (operation::CREATE_TOKENS, "CreateTokens"),
    (operation::DESCRIBE_TOKENS, "DescribeTokens"),
];
const PERMISSIONS: [(i8, &str); 3] =
    [(permission_type::ANY, "Any"), (permission_type::DENY, "Deny"), (permission_type::ALLOW, "Allow")];

fn name_of(table: &[(i8, &'static str)], code: i8) -> String {
    table.iter().find(|(c, _)| *c == code).map_or_else(|| format!("Unknown({code})"), |(_, n)| n.to_string())
}

/// A name to its code, case-insensitive, `-` and `_` ignored (`describe-configs`, `DESCRIBE_CONFIGS`).
fn code_of(table: &[(i8, &'static str)], name: &str, what: &str) -> Result<i8> {
    let plain = |s: &str| s.chars().filter(|c| *c != '-' && *c != '_').collect::<String>().to_ascii_lowercase();
    let wanted = plain(name);
    table.iter().find(|(_, n)| plain(n) == wanted).map(|(c, _)| *c).with_context(|| {
        let names: Vec<&str> = table.iter().map(|(_, n)| *n).collect();
        format!("{what} {name:?} is not one of {}", names.join(", "))
    })
}

/// An operation's code from its name (`read`, `Write`, `describe-configs`, `All`).
pub fn operation_code(name: &str) -> Result<i8> {
    code_of(&OPERATIONS, name, "operation")
}

/// A pattern type's code from its name (`literal`, `prefixed`, and for filters `match`, `any`).
pub fn pattern_type_code(name: &str) -> Result<i8> {
    code_of(&PATTERN_TYPES, name, "resource pattern type")
}

/// One ACL binding and a filter of them: the quorum's own types, which carry Kafka's codes.
pub use crate::quorum::security::{AclFilter, AclRecord as AclBinding};

impl AclFilter {
    /// Every binding.
    pub fn any() -> Self {
        AclFilter {
            resource_type: resource_type::ANY,
            resource_name: None,
            pattern_type: pattern_type::ANY,
            principal: None,
            host: None,
            operation: operation::ANY,
            permission_type: permission_type::ANY,
        }
    }
}

fn text(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

impl KafkaClient {
    fn acl_version(&mut self, api: ApiKey) -> Result<i16> {
        let home = self.home.clone();
        let version = self.connection(&home)?.negotiate(api, ACL_VERSIONS)?;
        Ok(version)
    }

    /// Creates the bindings; fails naming the first one refused (the others may have been created).
    pub fn create_acls(&mut self, bindings: &[AclBinding]) -> Result<()> {
        let creations = bindings
            .iter()
            .map(|b| {
                AclCreation::default()
                    .with_resource_type(b.resource_type)
                    .with_resource_name(text(&b.resource_name))
                    .with_resource_pattern_type(b.pattern_type)
                    .with_principal(text(&b.principal))
                    .with_host(text(&b.host))
                    .with_operation(b.operation)
                    .with_permission_type(b.permission_type)
            })
            .collect();
        let version = self.acl_version(ApiKey::CreateAcls)?;
        let req = CreateAclsRequest::default().with_creations(creations);
        let ResponseKind::CreateAcls(r) = self.call_any(ApiKey::CreateAcls, version, &req)? else {
            bail!("wrong answer to CreateAcls")
        };
        if r.results.len() != bindings.len() {
            bail!("CreateAcls answered {} results for {} bindings", r.results.len(), bindings.len());
        }
        for (result, binding) in r.results.iter().zip(bindings) {
            let what = format!("create ACL {}", render_one(binding));
            check_said(result.error_code, result.error_message.as_ref().map(|m| m.as_str()), &what)?;
        }
        Ok(())
    }

    /// The bindings `filter` matches, sorted.
    pub fn describe_acls(&mut self, filter: &AclFilter) -> Result<Vec<AclBinding>> {
        let version = self.acl_version(ApiKey::DescribeAcls)?;
        let req = DescribeAclsRequest::default()
            .with_resource_type_filter(filter.resource_type)
            .with_resource_name_filter(filter.resource_name.as_deref().map(text))
            .with_pattern_type_filter(filter.pattern_type)
            .with_principal_filter(filter.principal.as_deref().map(text))
            .with_host_filter(filter.host.as_deref().map(text))
            .with_operation(filter.operation)
            .with_permission_type(filter.permission_type);
        let ResponseKind::DescribeAcls(r) = self.call_any(ApiKey::DescribeAcls, version, &req)? else {
            bail!("wrong answer to DescribeAcls")
        };
        check_said(r.error_code, r.error_message.as_ref().map(|m| m.as_str()), "describe ACLs")?;
        let mut out: Vec<AclBinding> = r
            .resources
            .iter()
            .flat_map(|resource| {
                resource.acls.iter().map(|acl| AclBinding {
                    resource_type: resource.resource_type,
                    resource_name: resource.resource_name.to_string(),
                    pattern_type: resource.pattern_type,
                    principal: acl.principal.to_string(),
                    host: acl.host.to_string(),
                    operation: acl.operation,
                    permission_type: acl.permission_type,
                })
            })
            .collect();
        out.sort();
        Ok(out)
    }

    /// Deletes every binding the filters match; gives those deleted, sorted.
    pub fn delete_acls(&mut self, filters: &[AclFilter]) -> Result<Vec<AclBinding>> {
        let version = self.acl_version(ApiKey::DeleteAcls)?;
        let req = DeleteAclsRequest::default().with_filters(
            filters
                .iter()
                .map(|f| {
                    DeleteAclsFilter::default()
                        .with_resource_type_filter(f.resource_type)
                        .with_resource_name_filter(f.resource_name.as_deref().map(text))
                        .with_pattern_type_filter(f.pattern_type)
                        .with_principal_filter(f.principal.as_deref().map(text))
                        .with_host_filter(f.host.as_deref().map(text))
                        .with_operation(f.operation)
                        .with_permission_type(f.permission_type)
                })
                .collect(),
        );
        let ResponseKind::DeleteAcls(r) = self.call_any(ApiKey::DeleteAcls, version, &req)? else {
            bail!("wrong answer to DeleteAcls")
        };
        let mut removed = Vec::new();
        for result in &r.filter_results {
            check_said(result.error_code, result.error_message.as_ref().map(|m| m.as_str()), "delete ACLs")?;
            for acl in &result.matching_acls {
                check_said(acl.error_code, acl.error_message.as_ref().map(|m| m.as_str()), "delete ACL")?;
                removed.push(AclBinding {
                    resource_type: acl.resource_type,
                    resource_name: acl.resource_name.to_string(),
                    pattern_type: acl.pattern_type,
                    principal: acl.principal.to_string(),
                    host: acl.host.to_string(),
                    operation: acl.operation,
                    permission_type: acl.permission_type,
                });
            }
        }
        removed.sort();
        removed.dedup();
        Ok(removed)
    }
}

fn render_one(b: &AclBinding) -> String {
    format!(
        "{} {} {} from host {} on {}:{} ({})",
        b.principal,
        name_of(&PERMISSIONS, b.permission_type),
        name_of(&OPERATIONS, b.operation),
        b.host,
        name_of(&RESOURCE_TYPES, b.resource_type),
        b.resource_name,
        name_of(&PATTERN_TYPES, b.pattern_type)
    )
}

/// `shardlog acl list`'s table (and `remove`'s): one row per binding.
pub fn render_acls(bindings: &[AclBinding]) -> String {
    let rows: Vec<[String; 7]> = bindings
        .iter()
        .map(|b| {
            [
                b.principal.clone(),
                b.host.clone(),
                name_of(&OPERATIONS, b.operation),
                name_of(&PERMISSIONS, b.permission_type),
                name_of(&RESOURCE_TYPES, b.resource_type),
                b.resource_name.clone(),
                name_of(&PATTERN_TYPES, b.pattern_type),
            ]
        })
        .collect();
    let header = ["PRINCIPAL", "HOST", "OPERATION", "PERMISSION", "RESOURCE TYPE", "RESOURCE", "PATTERN"];
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let line = |cells: &[&str]| {
        let mut out = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<width$}  ", width = widths[i]));
            }
        }
        out.push('\n');
        out
    };
    let mut out = line(&header);
    for row in &rows {
        out.push_str(&line(&row.each_ref().map(String::as_str)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_names_are_taken_in_kafkas_spellings() {
        assert_eq!(operation_code("Write").unwrap(), operation::WRITE);
        assert_eq!(operation_code("describe-configs").unwrap(), operation::DESCRIBE_CONFIGS);
        assert_eq!(operation_code("IDEMPOTENT_WRITE").unwrap(), operation::IDEMPOTENT_WRITE);
        assert!(format!("{:#}", operation_code("fly").unwrap_err()).contains("\"fly\" is not one of Any, All, Read"));
        assert_eq!(pattern_type_code("prefixed").unwrap(), pattern_type::PREFIXED);
    }

    #[test]
    fn the_table_has_one_aligned_row_per_binding() {
        let binding = AclBinding {
            resource_type: resource_type::TOPIC,
            resource_name: "orders".into(),
            pattern_type: pattern_type::LITERAL,
            principal: "User:app".into(),
            host: "*".into(),
            operation: operation::WRITE,
            permission_type: permission_type::ALLOW,
        };
        let table = render_acls(&[binding]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            ["User:app", "*", "Write", "Allow", "Topic", "orders", "Literal"]
        );
        assert_eq!(lines[0].find("OPERATION"), lines[1].find("Write"), "columns line up");
    }
}
