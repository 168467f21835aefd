//! ACLs as Kafka defines them: the four enumerations with Kafka's wire codes and names, a concrete rule
//! ([`AclBinding`], validated as Kafka's CreateAcls validates one) and the filter DescribeAcls and
//! DeleteAcls select rules with ([`AclBindingFilter`], Kafka's ANY / MATCH / null-field semantics).
//!
//! Nothing here decides access; that is [`super::Authorizer`]'s job.

use std::fmt;

/// The name of the one CLUSTER resource (Kafka's `kafka-cluster`).
pub const CLUSTER_NAME: &str = "kafka-cluster";

/// The resource name that, in a LITERAL pattern, stands for every resource of its type.
pub const WILDCARD_RESOURCE: &str = "*";

/// The principal that stands for every principal (Kafka's `User:*`, whatever the asker's principal type).
pub const WILDCARD_PRINCIPAL: &str = "User:*";

/// The host that stands for every client address.
pub const WILDCARD_HOST: &str = "*";

/// Declares one of Kafka's code enumerations: variants with their wire code and Kafka's name. A code
/// Kafka does not know reads as `Unknown`, as Kafka's `fromCode` does.
macro_rules! kafka_code_enum {
    ($(#[$meta:meta])* $name:ident { $($variant:ident = $code:literal, $text:literal;)+ }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($variant,)+
        }

        impl $name {
            /// Every value, in code order.
            pub const ALL_VALUES: &'static [$name] = &[$($name::$variant,)+];

            /// The value of a wire code; `Unknown` for a code Kafka does not define.
            pub fn from_code(code: i8) -> Self {
                match code {
                    $($code => $name::$variant,)+
                    _ => $name::Unknown,
                }
            }

            /// The wire code.
            pub fn code(self) -> i8 {
                match self {
                    $($name::$variant => $code,)+
                }
            }

            /// Kafka's name (`TOPIC`, `PREFIXED`, `DESCRIBE_CONFIGS`, ...).
            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

kafka_code_enum! {
    /// What an ACL protects (Kafka's `ResourceType`).
    ResourceType {
        Unknown = 0, "UNKNOWN";
        Any = 1, "ANY";
        Topic = 2, "TOPIC";
        Group = 3, "GROUP";
        Cluster = 4, "CLUSTER";
        TransactionalId = 5, "TRANSACTIONAL_ID";
        DelegationToken = 6, "DELEGATION_TOKEN";
        User = 7, "USER";
    }
}

kafka_code_enum! {
    /// How an ACL's resource name is matched (Kafka's `PatternType`). MATCH and ANY exist only in filters.
    PatternType {
        Unknown = 0, "UNKNOWN";
        Any = 1, "ANY";
        Match = 2, "MATCH";
        Literal = 3, "LITERAL";
        Prefixed = 4, "PREFIXED";
    }
}

kafka_code_enum! {
    /// What an ACL allows or denies (Kafka's `AclOperation`).
    AclOperation {
        Unknown = 0, "UNKNOWN";
        Any = 1, "ANY";
        All = 2, "ALL";
        Read = 3, "READ";
        Write = 4, "WRITE";
        Create = 5, "CREATE";
        Delete = 6, "DELETE";
        Alter = 7, "ALTER";
        Describe = 8, "DESCRIBE";
        ClusterAction = 9, "CLUSTER_ACTION";
        DescribeConfigs = 10, "DESCRIBE_CONFIGS";
        AlterConfigs = 11, "ALTER_CONFIGS";
        IdempotentWrite = 12, "IDEMPOTENT_WRITE";
        CreateTokens = 13, "CREATE_TOKENS";
        DescribeTokens = 14, "DESCRIBE_TOKENS";
    }
}

kafka_code_enum! {
    /// Whether an ACL allows or denies (Kafka's `AclPermissionType`). ANY exists only in filters.
    AclPermissionType {
        Unknown = 0, "UNKNOWN";
        Any = 1, "ANY";
        Deny = 2, "DENY";
        Allow = 3, "ALLOW";
    }
}

impl AclOperation {
    /// Whether an ALLOW rule for `self` grants `asked`: the same operation, ALL, or an operation Kafka
    /// lets imply the asked one (READ, WRITE, DELETE and ALTER imply DESCRIBE; ALTER_CONFIGS implies
    /// DESCRIBE_CONFIGS). A DENY rule takes no implications: it denies only its own operation or ALL.
    pub fn allow_grants(self, asked: AclOperation) -> bool {
        use AclOperation::*;
        match (self, asked) {
            (All, _) => true,
            (Read | Write | Delete | Alter | Describe, Describe) => true,
            (AlterConfigs | DescribeConfigs, DescribeConfigs) => true,
            (granted, asked) => granted == asked,
        }
    }

    /// Whether a DENY rule for `self` denies `asked`.
    pub fn deny_covers(self, asked: AclOperation) -> bool {
        self == AclOperation::All || self == asked
    }
}

/// Why an ACL or a filter from CreateAcls, DescribeAcls or DeleteAcls is refused. Each is answered with
/// Kafka's INVALID_REQUEST and this text as the error message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AclError {
    #[error("Invalid resourceType {0}")]
    InvalidResourceType(ResourceType),
    #[error("Invalid patternType {0}")]
    InvalidPatternType(PatternType),
    #[error("Invalid operation {0}")]
    InvalidOperation(AclOperation),
    #[error("Invalid permissionType {0}")]
    InvalidPermissionType(AclPermissionType),
    #[error("Resource name should not be empty")]
    EmptyResourceName,
    #[error("The only valid name for the CLUSTER resource is {CLUSTER_NAME}")]
    InvalidClusterName,
    #[error("expected a string in format principalType:principalName but got {0}")]
    InvalidPrincipal(String),
    #[error("Unknown patternFilter.")]
    UnknownPatternFilter,
    #[error("Unknown entryFilter.")]
    UnknownEntryFilter,
}

impl AclError {
    /// The Kafka error code a client gets for it (INVALID_REQUEST).
    pub fn error_code(&self) -> i16 {
        kafka_protocol::ResponseError::InvalidRequest.code()
    }
}

/// A resource name and how it is matched: `TOPIC:LITERAL:orders`, `GROUP:PREFIXED:app-`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ResourcePattern {
    resource_type: ResourceType,
    name: String,
    pattern_type: PatternType,
}

impl ResourcePattern {
    pub fn resource_type(&self) -> ResourceType {
        self.resource_type
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pattern_type(&self) -> PatternType {
        self.pattern_type
    }

    /// Whether this (LITERAL or PREFIXED) pattern covers the resource named `name` of its type.
    pub fn covers(&self, name: &str) -> bool {
        match self.pattern_type {
            PatternType::Literal => self.name == name || self.name == WILDCARD_RESOURCE,
            PatternType::Prefixed => name.starts_with(self.name.as_str()),
            _ => false,
        }
    }
}

impl fmt::Display for ResourcePattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.resource_type, self.pattern_type, self.name)
    }
}

/// One concrete ACL: who (principal, host) may or may not do what (operation) to which resources.
/// Only [`AclBinding::from_codes`] makes one, so every binding is valid by Kafka's rules.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AclBinding {
    pattern: ResourcePattern,
    principal: String,
    host: String,
    operation: AclOperation,
    permission_type: AclPermissionType,
}

impl AclBinding {
    /// Builds a binding from the wire codes of CreateAcls (or a stored ACL record), refusing what Kafka
    /// refuses: UNKNOWN or ANY resource types, operations and permissions; pattern types other than
    /// LITERAL and PREFIXED; an empty resource name; a CLUSTER resource not named `kafka-cluster`; a
    /// principal not of the form `Type:name`.
    pub fn from_codes(
        resource_type: i8,
        resource_name: impl Into<String>,
        pattern_type: i8,
        principal: impl Into<String>,
        host: impl Into<String>,
        operation: i8,
        permission_type: i8,
    ) -> Result<AclBinding, AclError> {
        let resource_type = ResourceType::from_code(resource_type);
        let pattern_type = PatternType::from_code(pattern_type);
        let operation = AclOperation::from_code(operation);
        let permission_type = AclPermissionType::from_code(permission_type);
        let name = resource_name.into();
        let principal = principal.into();
        if matches!(resource_type, ResourceType::Unknown | ResourceType::Any) {
            return Err(AclError::InvalidResourceType(resource_type));
        }
        if !matches!(pattern_type, PatternType::Literal | PatternType::Prefixed) {
            return Err(AclError::InvalidPatternType(pattern_type));
        }
        if matches!(operation, AclOperation::Unknown | AclOperation::Any) {
            return Err(AclError::InvalidOperation(operation));
        }
        if !matches!(permission_type, AclPermissionType::Allow | AclPermissionType::Deny) {
            return Err(AclError::InvalidPermissionType(permission_type));
        }
        if name.is_empty() {
            return Err(AclError::EmptyResourceName);
        }
        if resource_type == ResourceType::Cluster && name != CLUSTER_NAME {
            return Err(AclError::InvalidClusterName);
        }
        if !is_principal(&principal) {
            return Err(AclError::InvalidPrincipal(principal));
        }
        Ok(AclBinding {
            pattern: ResourcePattern { resource_type, name, pattern_type },
            principal,
            host: host.into(),
            operation,
            permission_type,
        })
    }

    pub fn pattern(&self) -> &ResourcePattern {
        &self.pattern
    }

    /// `Type:name`, e.g. `User:alice`, or [`WILDCARD_PRINCIPAL`].
    pub fn principal(&self) -> &str {
        &self.principal
    }

    /// An IP address as text, or [`WILDCARD_HOST`].
    pub fn host(&self) -> &str {
        &self.host
    }

    pub fn operation(&self) -> AclOperation {
        self.operation
    }

    pub fn permission_type(&self) -> AclPermissionType {
        self.permission_type
    }
}

impl fmt::Display for AclBinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} {} from host {} on {}",
            self.principal, self.permission_type, self.operation, self.host, self.pattern
        )
    }
}

/// Kafka's principal form, `Type:name`: a type before the first colon. (Kafka splits at the first colon
/// and needs both parts; the name may itself hold colons.)
fn is_principal(principal: &str) -> bool {
    matches!(principal.split_once(':'), Some((kind, _)) if !kind.is_empty())
}

/// Selects ACLs for DescribeAcls and DeleteAcls. A `None` name, principal or host matches anything;
/// resource type ANY, operation ANY and permission ANY match anything; pattern type ANY matches any
/// pattern with exactly the given name; MATCH matches every pattern that covers the given name (the
/// LITERAL name itself, the LITERAL `*`, and every PREFIXED pattern the name starts with).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AclBindingFilter {
    resource_type: ResourceType,
    name: Option<String>,
    pattern_type: PatternType,
    principal: Option<String>,
    host: Option<String>,
    operation: AclOperation,
    permission_type: AclPermissionType,
}

impl AclBindingFilter {
    /// A filter that matches every ACL.
    pub fn any() -> AclBindingFilter {
        AclBindingFilter {
            resource_type: ResourceType::Any,
            name: None,
            pattern_type: PatternType::Any,
            principal: None,
            host: None,
            operation: AclOperation::Any,
            permission_type: AclPermissionType::Any,
        }
    }

    /// Builds a filter from the wire codes of DescribeAcls or DeleteAcls, refusing a filter with an
    /// UNKNOWN resource type, pattern type, operation or permission type, as Kafka does.
    pub fn from_codes(
        resource_type: i8,
        resource_name: Option<String>,
        pattern_type: i8,
        principal: Option<String>,
        host: Option<String>,
        operation: i8,
        permission_type: i8,
    ) -> Result<AclBindingFilter, AclError> {
        let resource_type = ResourceType::from_code(resource_type);
        let pattern_type = PatternType::from_code(pattern_type);
        let operation = AclOperation::from_code(operation);
        let permission_type = AclPermissionType::from_code(permission_type);
        if resource_type == ResourceType::Unknown || pattern_type == PatternType::Unknown {
            return Err(AclError::UnknownPatternFilter);
        }
        if operation == AclOperation::Unknown || permission_type == AclPermissionType::Unknown {
            return Err(AclError::UnknownEntryFilter);
        }
        Ok(AclBindingFilter {
            resource_type,
            name: resource_name,
            pattern_type,
            principal,
            host,
            operation,
            permission_type,
        })
    }

    /// Whether `binding` is one this filter selects.
    pub fn matches(&self, binding: &AclBinding) -> bool {
        self.matches_pattern(&binding.pattern) && self.matches_entry(binding)
    }

    fn matches_pattern(&self, pattern: &ResourcePattern) -> bool {
        if self.resource_type != ResourceType::Any && self.resource_type != pattern.resource_type {
            return false;
        }
        let any_pattern = matches!(self.pattern_type, PatternType::Any | PatternType::Match);
        if !any_pattern && self.pattern_type != pattern.pattern_type {
            return false;
        }
        let Some(name) = &self.name else {
            return true;
        };
        if self.pattern_type == PatternType::Match {
            pattern.covers(name)
        } else {
            // ANY, or the binding's own pattern type: the name must be the same.
            *name == pattern.name
        }
    }

    fn matches_entry(&self, binding: &AclBinding) -> bool {
        self.principal.as_ref().is_none_or(|p| *p == binding.principal)
            && self.host.as_ref().is_none_or(|h| *h == binding.host)
            && (self.operation == AclOperation::Any || self.operation == binding.operation)
            && (self.permission_type == AclPermissionType::Any || self.permission_type == binding.permission_type)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding(rt: ResourceType, name: &str, pt: PatternType, principal: &str, op: AclOperation) -> AclBinding {
        AclBinding::from_codes(rt.code(), name, pt.code(), principal, "*", op.code(), AclPermissionType::Allow.code())
            .expect("a valid binding")
    }

    fn filter(rt: ResourceType, name: Option<&str>, pt: PatternType) -> AclBindingFilter {
        AclBindingFilter::from_codes(
            rt.code(),
            name.map(str::to_string),
            pt.code(),
            None,
            None,
            AclOperation::Any.code(),
            AclPermissionType::Any.code(),
        )
        .expect("a valid filter")
    }

    #[test]
    fn codes_and_names_are_kafkas() {
        let expected_types = [
            (0, "UNKNOWN"),
            (1, "ANY"),
            (2, "TOPIC"),
            (3, "GROUP"),
            (4, "CLUSTER"),
            (5, "TRANSACTIONAL_ID"),
            (6, "DELEGATION_TOKEN"),
            (7, "USER"),
        ];
        for (code, name) in expected_types {
            assert_eq!(ResourceType::from_code(code).name(), name);
            assert_eq!(ResourceType::from_code(code).code(), code);
        }
        let expected_patterns = [(0, "UNKNOWN"), (1, "ANY"), (2, "MATCH"), (3, "LITERAL"), (4, "PREFIXED")];
        for (code, name) in expected_patterns {
            assert_eq!(PatternType::from_code(code).name(), name);
        }
        let expected_ops = [
            (0, "UNKNOWN"),
            (1, "ANY"),
            (2, "ALL"),
            (3, "READ"),
            (4, "WRITE"),
            (5, "CREATE"),
            (6, "DELETE"),
            (7, "ALTER"),
            (8, "DESCRIBE"),
            (9, "CLUSTER_ACTION"),
            (10, "DESCRIBE_CONFIGS"),
            (11, "ALTER_CONFIGS"),
            (12, "IDEMPOTENT_WRITE"),
            (13, "CREATE_TOKENS"),
            (14, "DESCRIBE_TOKENS"),
        ];
        for (code, name) in expected_ops {
            assert_eq!(AclOperation::from_code(code).name(), name);
            assert_eq!(AclOperation::from_code(code).code(), code);
        }
        for (code, name) in [(0, "UNKNOWN"), (1, "ANY"), (2, "DENY"), (3, "ALLOW")] {
            assert_eq!(AclPermissionType::from_code(code).name(), name);
        }
        assert_eq!(AclOperation::from_code(15), AclOperation::Unknown);
        assert_eq!(ResourceType::from_code(-1), ResourceType::Unknown);
    }

    #[test]
    fn from_codes_refuses_what_kafka_refuses() {
        let ok = |rt: i8, name: &str, pt: i8, principal: &str, op: i8, perm: i8| {
            AclBinding::from_codes(rt, name, pt, principal, "*", op, perm)
        };
        assert_eq!(ok(1, "t", 3, "User:a", 3, 3), Err(AclError::InvalidResourceType(ResourceType::Any)));
        assert_eq!(ok(0, "t", 3, "User:a", 3, 3), Err(AclError::InvalidResourceType(ResourceType::Unknown)));
        assert_eq!(ok(2, "t", 2, "User:a", 3, 3), Err(AclError::InvalidPatternType(PatternType::Match)));
        assert_eq!(ok(2, "t", 1, "User:a", 3, 3), Err(AclError::InvalidPatternType(PatternType::Any)));
        assert_eq!(ok(2, "t", 3, "User:a", 1, 3), Err(AclError::InvalidOperation(AclOperation::Any)));
        assert_eq!(ok(2, "t", 3, "User:a", 99, 3), Err(AclError::InvalidOperation(AclOperation::Unknown)));
        assert_eq!(ok(2, "t", 3, "User:a", 3, 1), Err(AclError::InvalidPermissionType(AclPermissionType::Any)));
        assert_eq!(ok(2, "", 3, "User:a", 3, 3), Err(AclError::EmptyResourceName));
        assert_eq!(ok(4, "other", 3, "User:a", 3, 3), Err(AclError::InvalidClusterName));
        assert_eq!(ok(2, "t", 3, "alice", 3, 3), Err(AclError::InvalidPrincipal("alice".into())));
        assert_eq!(ok(2, "t", 3, ":alice", 3, 3), Err(AclError::InvalidPrincipal(":alice".into())));
        let fine = ok(4, CLUSTER_NAME, 4, "User:a:b", 2, 2).expect("valid");
        assert_eq!(fine.pattern().to_string(), "CLUSTER:PREFIXED:kafka-cluster");
        assert_eq!(fine.principal(), "User:a:b");
        assert_eq!(AclError::EmptyResourceName.error_code(), 42);
    }

    #[test]
    fn filter_refuses_unknown_fields() {
        let f = |rt: i8, pt: i8, op: i8, perm: i8| AclBindingFilter::from_codes(rt, None, pt, None, None, op, perm);
        assert_eq!(f(0, 1, 1, 1), Err(AclError::UnknownPatternFilter));
        assert_eq!(f(1, 0, 1, 1), Err(AclError::UnknownPatternFilter));
        assert_eq!(f(1, 1, 0, 1), Err(AclError::UnknownEntryFilter));
        assert_eq!(f(1, 1, 1, 0), Err(AclError::UnknownEntryFilter));
        assert!(f(1, 2, 1, 1).is_ok());
    }

    #[test]
    fn filter_any_pattern_matches_the_exact_name_only() {
        use {
            PatternType::*,
            ResourceType::{Group, Topic},
        };
        let lit = binding(Topic, "orders", Literal, "User:a", AclOperation::Read);
        let star = binding(Topic, "*", Literal, "User:a", AclOperation::Read);
        let pre = binding(Topic, "ord", Prefixed, "User:a", AclOperation::Read);
        let f = filter(Topic, Some("orders"), Any);
        assert!(f.matches(&lit));
        assert!(!f.matches(&star));
        assert!(!f.matches(&pre));
        // ANY with no name selects everything of the type; resource type ANY every type.
        assert!(filter(Topic, None, Any).matches(&pre));
        assert!(!filter(Group, None, Any).matches(&pre));
        assert!(filter(ResourceType::Any, None, Any).matches(&pre));
    }

    #[test]
    fn filter_match_selects_every_pattern_covering_the_name() {
        use {PatternType::*, ResourceType::Topic};
        let lit = binding(Topic, "orders", Literal, "User:a", AclOperation::Read);
        let star = binding(Topic, "*", Literal, "User:a", AclOperation::Read);
        let pre = binding(Topic, "ord", Prefixed, "User:a", AclOperation::Read);
        let other = binding(Topic, "payments", Literal, "User:a", AclOperation::Read);
        let longer = binding(Topic, "orders-eu", Prefixed, "User:a", AclOperation::Read);
        let f = filter(Topic, Some("orders"), Match);
        assert!(f.matches(&lit));
        assert!(f.matches(&star));
        assert!(f.matches(&pre));
        assert!(!f.matches(&other));
        assert!(!f.matches(&longer));
        // A concrete pattern type matches that type with the exact name.
        assert!(filter(Topic, Some("ord"), Prefixed).matches(&pre));
        assert!(!filter(Topic, Some("orders"), Prefixed).matches(&pre));
        assert!(!filter(Topic, Some("ord"), Literal).matches(&pre));
        // MATCH with no name matches every pattern type.
        assert!(filter(Topic, None, Match).matches(&pre));
    }

    #[test]
    fn filter_entry_fields_null_means_any() {
        use {PatternType::*, ResourceType::Topic};
        let b = AclBinding::from_codes(2, "t", 3, "User:a", "10.0.0.1", 3, 2).expect("valid");
        let f = |principal: Option<&str>, host: Option<&str>, op: AclOperation, perm: AclPermissionType| {
            AclBindingFilter::from_codes(
                Topic.code(),
                None,
                Any.code(),
                principal.map(str::to_string),
                host.map(str::to_string),
                op.code(),
                perm.code(),
            )
            .expect("valid")
        };
        assert!(f(None, None, AclOperation::Any, AclPermissionType::Any).matches(&b));
        assert!(f(Some("User:a"), Some("10.0.0.1"), AclOperation::Read, AclPermissionType::Deny).matches(&b));
        assert!(!f(Some("User:b"), None, AclOperation::Any, AclPermissionType::Any).matches(&b));
        assert!(!f(None, Some("*"), AclOperation::Any, AclPermissionType::Any).matches(&b));
        assert!(!f(None, None, AclOperation::Write, AclPermissionType::Any).matches(&b));
        assert!(!f(None, None, AclOperation::Any, AclPermissionType::Allow).matches(&b));
        // ALL in a filter is a concrete operation: it selects ALL bindings only.
        assert!(!f(None, None, AclOperation::All, AclPermissionType::Any).matches(&b));
    }

    #[test]
    fn implied_operations_follow_kafka() {
        use AclOperation::*;
        for granted in [Read, Write, Delete, Alter, Describe, All] {
            assert!(granted.allow_grants(Describe), "{granted} implies DESCRIBE");
        }
        for granted in [Create, ClusterAction, AlterConfigs, DescribeConfigs, IdempotentWrite] {
            assert_eq!(granted.allow_grants(Describe), granted == Describe, "{granted}");
        }
        assert!(AlterConfigs.allow_grants(DescribeConfigs));
        assert!(!DescribeConfigs.allow_grants(AlterConfigs));
        assert!(!Describe.allow_grants(Read));
        assert!(!Alter.allow_grants(AlterConfigs));
        assert!(All.allow_grants(IdempotentWrite));
        assert!(!Write.deny_covers(Describe));
        assert!(All.deny_covers(Write));
    }
}
