//! The ACLs in force, indexed so that a decision touches only the rules that can apply to its resource.
//!
//! Per resource type: LITERAL names in a hash map (one lookup by the resource's name); the LITERAL `*`
//! rules in a list of their own; PREFIXED names in a hash map beside the set of distinct prefix lengths
//! in use, so every stored prefix of a name is found with one lookup per distinct length (a handful),
//! never a scan of all prefixed rules. Every rule of a type is also kept in one list for the rare
//! question that is about the type rather than a name ([`super::Authorizer::authorize_any`]).

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;

use super::acl::{AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType, WILDCARD_HOST};
use super::acl::{WILDCARD_PRINCIPAL, WILDCARD_RESOURCE};

/// The number of resource type codes (UNKNOWN 0 .. USER 7): the index keeps one slot per code.
const TYPE_SLOTS: usize = 8;

/// Which client addresses a rule applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum HostMatch {
    Any,
    Ip(IpAddr),
    /// A host that is not an IP address: Kafka compares it with the client's address as text, which it
    /// can never equal, so the rule never applies.
    Never,
}

impl HostMatch {
    fn parse(host: &str) -> HostMatch {
        if host == WILDCARD_HOST {
            HostMatch::Any
        } else {
            host.parse().map_or(HostMatch::Never, |ip: IpAddr| HostMatch::Ip(ip.to_canonical()))
        }
    }

    pub(super) fn matches(&self, client: IpAddr) -> bool {
        match self {
            HostMatch::Any => true,
            // An IPv4 client on a dual-stack socket shows as `::ffff:a.b.c.d`; Kafka (Java) sees a.b.c.d.
            HostMatch::Ip(ip) => *ip == client.to_canonical(),
            HostMatch::Never => false,
        }
    }
}

/// One ACL's entry, as the index keeps it under its resource pattern.
#[derive(Debug, Clone)]
pub(super) struct Rule {
    /// `Type:name`; [`WILDCARD_PRINCIPAL`] matches every principal.
    pub(super) principal: Box<str>,
    pub(super) host: HostMatch,
    pub(super) operation: AclOperation,
    pub(super) allow: bool,
}

impl Rule {
    fn new(binding: &AclBinding) -> Rule {
        Rule {
            principal: binding.principal().into(),
            host: HostMatch::parse(binding.host()),
            operation: binding.operation(),
            allow: binding.permission_type() == AclPermissionType::Allow,
        }
    }

    pub(super) fn matches_who(&self, principal: &str, client: IpAddr) -> bool {
        (&*self.principal == principal || &*self.principal == WILDCARD_PRINCIPAL) && self.host.matches(client)
    }
}

/// A rule with the pattern it sits under, for questions about a whole resource type.
#[derive(Debug, Clone)]
pub(super) struct PatternedRule {
    pub(super) pattern_type: PatternType,
    pub(super) name: Box<str>,
    pub(super) rule: Rule,
}

/// The rules of one resource type.
#[derive(Debug, Default)]
pub(super) struct TypeIndex {
    literal: HashMap<Box<str>, Vec<Rule>>,
    wildcard: Vec<Rule>,
    prefixed: HashMap<Box<str>, Vec<Rule>>,
    /// The distinct byte lengths of the keys of `prefixed`.
    prefix_lens: BTreeSet<usize>,
    pub(super) all: Vec<PatternedRule>,
}

impl TypeIndex {
    /// Calls `visit` with every group of rules whose pattern covers the resource `name`: its LITERAL
    /// name, then each PREFIXED pattern it starts with, then the LITERAL `*`. Stops early when `visit`
    /// returns false.
    pub(super) fn for_each_group(&self, name: &str, mut visit: impl FnMut(&[Rule]) -> bool) {
        if let Some(rules) = self.literal.get(name)
            && !visit(rules)
        {
            return;
        }
        for &len in self.prefix_lens.range(..=name.len()) {
            if !name.is_char_boundary(len) {
                continue;
            }
            if let Some(rules) = self.prefixed.get(&name[..len])
                && !visit(rules)
            {
                return;
            }
        }
        if !self.wildcard.is_empty() {
            visit(&self.wildcard);
        }
    }
}

/// Every ACL in force, by resource type.
#[derive(Debug, Default)]
pub(super) struct AclIndex {
    types: [TypeIndex; TYPE_SLOTS],
    len: usize,
}

impl AclIndex {
    pub(super) fn build(bindings: impl IntoIterator<Item = AclBinding>) -> AclIndex {
        let mut index = AclIndex::default();
        for binding in bindings {
            let pattern = binding.pattern();
            let slot = &mut index.types[type_slot(pattern.resource_type())];
            let rule = Rule::new(&binding);
            let name: Box<str> = pattern.name().into();
            match pattern.pattern_type() {
                PatternType::Literal if &*name == WILDCARD_RESOURCE => slot.wildcard.push(rule.clone()),
                PatternType::Literal => slot.literal.entry(name.clone()).or_default().push(rule.clone()),
                PatternType::Prefixed => {
                    slot.prefix_lens.insert(name.len());
                    slot.prefixed.entry(name.clone()).or_default().push(rule.clone());
                }
                // `AclBinding::from_codes` admits LITERAL and PREFIXED only.
                other => unreachable!("an AclBinding with pattern type {other}"),
            }
            slot.all.push(PatternedRule { pattern_type: pattern.pattern_type(), name, rule });
            index.len += 1;
        }
        index
    }

    pub(super) fn of_type(&self, resource_type: ResourceType) -> &TypeIndex {
        &self.types[type_slot(resource_type)]
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }
}

fn type_slot(resource_type: ResourceType) -> usize {
    // Codes run 0..=7 (`ResourceType` has no other values).
    usize::try_from(resource_type.code()).expect("resource type codes are not negative")
}
