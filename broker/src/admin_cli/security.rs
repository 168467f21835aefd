//! `shardlog acl add|list|remove` and `shardlog quota set|describe`: what the flags mean, as Kafka's
//! `kafka-acls` and `kafka-configs` read them, turned into bindings, filters and quota entities.
//!
//! `acl add` makes one binding per principal × host × operation × resource. `acl list` and `acl remove`
//! make filters: the resources named (each with `--resource-pattern-type`, LITERAL unless said), and
//! when principals are named, only their bindings from the hosts named (default `*`); without
//! `--operation` every operation matches. `acl remove` needs at least one resource, so that no typo
//! removes every binding in the cluster.

use anyhow::{Result, bail};

use crate::client::{AclBinding, AclFilter, Entity, operation_code, pattern_type_code};
use crate::quorum::security::{
    CLUSTER_RESOURCE_NAME, QUOTA_CLIENT_ID, QUOTA_IP, QUOTA_USER, WILDCARD, operation, pattern_type, permission_type,
    resource_type,
};

/// The flags of `acl add|list|remove`, as given.
#[derive(Debug, Clone, Default)]
pub struct AclFlags {
    pub allow_principals: Vec<String>,
    pub deny_principals: Vec<String>,
    pub allow_hosts: Vec<String>,
    pub deny_hosts: Vec<String>,
    pub operations: Vec<String>,
    pub topics: Vec<String>,
    pub groups: Vec<String>,
    pub cluster: bool,
    pub transactional_ids: Vec<String>,
    pub pattern_type: Option<String>,
    /// `acl list --principal`: only this principal's bindings.
    pub principal: Option<String>,
}

impl AclFlags {
    /// The resources named: (type, name).
    fn resources(&self) -> Vec<(i8, String)> {
        let mut out: Vec<(i8, String)> = Vec::new();
        out.extend(self.topics.iter().map(|t| (resource_type::TOPIC, t.clone())));
        out.extend(self.groups.iter().map(|g| (resource_type::GROUP, g.clone())));
        if self.cluster {
            out.push((resource_type::CLUSTER, CLUSTER_RESOURCE_NAME.to_string()));
        }
        out.extend(self.transactional_ids.iter().map(|t| (resource_type::TRANSACTIONAL_ID, t.clone())));
        out
    }

    /// (principal, host, permission) triples the flags name.
    fn grants(&self) -> Result<Vec<(String, String, i8)>> {
        let hosts = |given: &[String]| if given.is_empty() { vec![WILDCARD.to_string()] } else { given.to_vec() };
        if self.allow_principals.is_empty() && !self.allow_hosts.is_empty() {
            bail!("--allow-host needs --allow-principal");
        }
        if self.deny_principals.is_empty() && !self.deny_hosts.is_empty() {
            bail!("--deny-host needs --deny-principal");
        }
        let mut out = Vec::new();
        for (principals, hosts, permission) in [
            (&self.allow_principals, hosts(&self.allow_hosts), permission_type::ALLOW),
            (&self.deny_principals, hosts(&self.deny_hosts), permission_type::DENY),
        ] {
            for principal in principals {
                if !principal.contains(':') {
                    bail!("principal {principal:?} is not TYPE:NAME (User:alice)");
                }
                out.extend(hosts.iter().map(|h| (principal.clone(), h.clone(), permission)));
            }
        }
        Ok(out)
    }

    fn operations(&self) -> Result<Vec<i8>> {
        self.operations.iter().map(|o| operation_code(o)).collect()
    }

    /// `acl add`: every binding the flags name.
    pub fn bindings(&self) -> Result<Vec<AclBinding>> {
        let pattern = match self.pattern_type.as_deref().map(pattern_type_code).transpose()? {
            None | Some(pattern_type::LITERAL) => pattern_type::LITERAL,
            Some(pattern_type::PREFIXED) => pattern_type::PREFIXED,
            Some(_) => bail!("acl add takes --resource-pattern-type literal or prefixed"),
        };
        let resources = self.resources();
        if resources.is_empty() {
            bail!("name a resource: --topic, --group, --cluster or --transactional-id");
        }
        let grants = self.grants()?;
        if grants.is_empty() {
            bail!("name who: --allow-principal or --deny-principal");
        }
        let mut operations = self.operations()?;
        if operations.is_empty() {
            operations.push(operation::ALL);
        }
        if operations.contains(&operation::ANY) {
            bail!("--operation Any is a filter, not an operation to grant");
        }
        let mut out = Vec::new();
        for (kind, name) in &resources {
            for (principal, host, permission) in &grants {
                for op in &operations {
                    out.push(AclBinding {
                        resource_type: *kind,
                        resource_name: name.clone(),
                        pattern_type: pattern,
                        principal: principal.clone(),
                        host: host.clone(),
                        operation: *op,
                        permission_type: *permission,
                    });
                }
            }
        }
        Ok(out)
    }

    /// `acl list` and `acl remove`: the filters the flags name (`list` with no resource: one open filter).
    pub fn filters(&self, removing: bool) -> Result<Vec<AclFilter>> {
        let resources = self.resources();
        if removing && resources.is_empty() {
            bail!("acl remove needs a resource: --topic, --group, --cluster or --transactional-id");
        }
        let pattern = match self.pattern_type.as_deref() {
            Some(name) => pattern_type_code(name)?,
            None if resources.is_empty() => pattern_type::ANY,
            None => pattern_type::LITERAL,
        };
        let operations = self.operations()?;
        let operations = if operations.is_empty() { vec![operation::ANY] } else { operations };
        let grants: Vec<(Option<String>, Option<String>, i8)> = {
            let named = self.grants()?;
            match (named.is_empty(), &self.principal) {
                (true, None) => vec![(None, None, permission_type::ANY)],
                (true, Some(p)) => vec![(Some(p.clone()), None, permission_type::ANY)],
                (false, None) => named.into_iter().map(|(p, h, perm)| (Some(p), Some(h), perm)).collect(),
                (false, Some(_)) => bail!("give --principal or --allow-principal/--deny-principal, not both"),
            }
        };
        let resources: Vec<(i8, Option<String>)> = if resources.is_empty() {
            vec![(resource_type::ANY, None)]
        } else {
            resources.into_iter().map(|(k, n)| (k, Some(n))).collect()
        };
        let mut out = Vec::new();
        for (kind, name) in &resources {
            for (principal, host, permission) in &grants {
                for op in &operations {
                    out.push(AclFilter {
                        resource_type: *kind,
                        resource_name: name.clone(),
                        pattern_type: pattern,
                        principal: principal.clone(),
                        host: host.clone(),
                        operation: *op,
                        permission_type: *permission,
                    });
                }
            }
        }
        Ok(out)
    }
}

/// The entity flags of `quota set|describe`, as given.
#[derive(Debug, Clone, Default)]
pub struct QuotaEntityFlags {
    pub user: Option<String>,
    pub user_default: bool,
    pub client_id: Option<String>,
    pub client_default: bool,
    pub ip: Option<String>,
    pub ip_default: bool,
}

impl QuotaEntityFlags {
    /// The entity named (sorted by type); empty when none is.
    pub fn entity(&self) -> Result<Entity> {
        let mut out = Entity::new();
        for (kind, name, default) in [
            (QUOTA_CLIENT_ID, &self.client_id, self.client_default),
            (QUOTA_IP, &self.ip, self.ip_default),
            (QUOTA_USER, &self.user, self.user_default),
        ] {
            match (name, default) {
                (Some(_), true) => bail!("give a {kind} name or its default, not both"),
                (Some(n), false) => out.push((kind.to_string(), Some(n.clone()))),
                (None, true) => out.push((kind.to_string(), None)),
                (None, false) => {}
            }
        }
        if out.iter().any(|(k, _)| k == QUOTA_IP) && out.len() > 1 {
            bail!("an ip quota stands alone: it cannot be combined with a user or client id");
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> AclFlags {
        AclFlags {
            allow_principals: vec!["User:app".into()],
            operations: vec!["write".into(), "describe".into()],
            topics: vec!["orders".into()],
            ..AclFlags::default()
        }
    }

    #[test]
    fn add_makes_one_binding_per_principal_host_operation_and_resource() {
        let bindings = flags().bindings().unwrap();
        assert_eq!(bindings.len(), 2);
        assert!(bindings.iter().all(|b| b.host == "*" && b.pattern_type == pattern_type::LITERAL));
        assert_eq!(bindings.iter().map(|b| b.operation).collect::<Vec<_>>(), [operation::WRITE, operation::DESCRIBE]);
        let mut two_hosts = flags();
        two_hosts.allow_hosts = vec!["10.0.0.1".into(), "10.0.0.2".into()];
        two_hosts.cluster = true;
        assert_eq!(two_hosts.bindings().unwrap().len(), 2 * 2 * 2);
    }

    #[test]
    fn add_refuses_what_kafka_acls_refuses() {
        let no_resource = AclFlags { topics: vec![], ..flags() };
        assert!(no_resource.bindings().is_err());
        let no_principal = AclFlags { allow_principals: vec![], ..flags() };
        assert!(no_principal.bindings().is_err());
        let bad_principal = AclFlags { allow_principals: vec!["app".into()], ..flags() };
        assert!(format!("{:#}", bad_principal.bindings().unwrap_err()).contains("TYPE:NAME"));
        let match_pattern = AclFlags { pattern_type: Some("match".into()), ..flags() };
        assert!(match_pattern.bindings().is_err());
    }

    #[test]
    fn list_without_flags_matches_every_binding_and_remove_needs_a_resource() {
        assert_eq!(AclFlags::default().filters(false).unwrap(), vec![AclFilter::any()]);
        assert!(AclFlags::default().filters(true).is_err());
        let remove_all_of_topic = AclFlags { topics: vec!["orders".into()], ..AclFlags::default() };
        let filters = remove_all_of_topic.filters(true).unwrap();
        assert_eq!(filters.len(), 1);
        assert_eq!(filters[0].resource_name.as_deref(), Some("orders"));
        assert_eq!((filters[0].principal.as_ref(), filters[0].operation), (None, operation::ANY));
    }

    #[test]
    fn quota_entities_are_sorted_and_ip_stands_alone() {
        let flags = QuotaEntityFlags { user: Some("app".into()), client_default: true, ..Default::default() };
        assert_eq!(
            flags.entity().unwrap(),
            vec![("client-id".to_string(), None), ("user".to_string(), Some("app".to_string()))]
        );
        let ip_and_user = QuotaEntityFlags { user: Some("app".into()), ip_default: true, ..Default::default() };
        assert!(ip_and_user.entity().is_err());
    }
}
