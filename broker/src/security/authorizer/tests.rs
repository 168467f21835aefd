use std::net::IpAddr;

use proptest::prelude::*;

use super::acl::{AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType};
use super::*;

const ALICE: &str = "User:alice";

fn ctx(principal: &str, host: &str) -> RequestContext {
    RequestContext { principal: principal.to_string(), host: host.parse().expect("an IP address") }
}

fn alice() -> RequestContext {
    ctx(ALICE, "10.0.0.1")
}

fn acl(
    rt: ResourceType,
    name: &str,
    pt: PatternType,
    principal: &str,
    host: &str,
    op: AclOperation,
    perm: AclPermissionType,
) -> AclBinding {
    AclBinding::from_codes(rt.code(), name, pt.code(), principal, host, op.code(), perm.code()).expect("a valid ACL")
}

fn allow_topic(name: &str, pt: PatternType, op: AclOperation) -> AclBinding {
    acl(ResourceType::Topic, name, pt, ALICE, "*", op, AclPermissionType::Allow)
}

fn deny_topic(name: &str, pt: PatternType, op: AclOperation) -> AclBinding {
    acl(ResourceType::Topic, name, pt, ALICE, "*", op, AclPermissionType::Deny)
}

fn authorizer(acls: Vec<AclBinding>) -> Authorizer {
    Authorizer::new(&AuthorizerConfig::default(), acls)
}

fn allowed(a: &Authorizer, c: &RequestContext, op: AclOperation, topic: &str) -> bool {
    a.authorize(c, op, &Resource::topic(topic)).is_allowed()
}

#[test]
fn literal_acl_applies_to_its_name_only() {
    let a = authorizer(vec![allow_topic("orders", PatternType::Literal, AclOperation::Read)]);
    assert!(allowed(&a, &alice(), AclOperation::Read, "orders"));
    assert!(!allowed(&a, &alice(), AclOperation::Read, "orders2"));
    assert!(!allowed(&a, &alice(), AclOperation::Read, "order"));
    assert!(!allowed(&a, &alice(), AclOperation::Write, "orders"));
    assert!(!a.authorize(&alice(), AclOperation::Read, &Resource::group("orders")).is_allowed());
}

#[test]
fn literal_star_applies_to_every_resource_of_its_type() {
    let a = authorizer(vec![allow_topic("*", PatternType::Literal, AclOperation::Write)]);
    assert!(allowed(&a, &alice(), AclOperation::Write, "orders"));
    assert!(allowed(&a, &alice(), AclOperation::Write, "anything"));
    assert!(!a.authorize(&alice(), AclOperation::Write, &Resource::group("orders")).is_allowed());
    // A PREFIXED `*` is no wildcard: it covers names that start with `*`.
    let p = authorizer(vec![allow_topic("*", PatternType::Prefixed, AclOperation::Write)]);
    assert!(!allowed(&p, &alice(), AclOperation::Write, "orders"));
    assert!(allowed(&p, &alice(), AclOperation::Write, "*x"));
}

#[test]
fn prefixed_acl_applies_to_names_starting_with_it() {
    let a = authorizer(vec![allow_topic("app-", PatternType::Prefixed, AclOperation::Read)]);
    assert!(allowed(&a, &alice(), AclOperation::Read, "app-"));
    assert!(allowed(&a, &alice(), AclOperation::Read, "app-orders"));
    assert!(!allowed(&a, &alice(), AclOperation::Read, "app"));
    assert!(!allowed(&a, &alice(), AclOperation::Read, "my-app-orders"));
}

#[test]
fn deny_wins_over_allow_from_any_pattern() {
    let cases = [
        deny_topic("app-orders", PatternType::Literal, AclOperation::Read),
        deny_topic("app-", PatternType::Prefixed, AclOperation::Read),
        deny_topic("*", PatternType::Literal, AclOperation::Read),
        deny_topic("app-orders", PatternType::Literal, AclOperation::All),
    ];
    for deny in cases {
        let a = authorizer(vec![allow_topic("app-orders", PatternType::Literal, AclOperation::All), deny.clone()]);
        assert!(!allowed(&a, &alice(), AclOperation::Read, "app-orders"), "{deny}");
    }
    // A DENY of READ takes no implications: DESCRIBE stays allowed by the ALLOW of ALL.
    let a = authorizer(vec![
        allow_topic("t", PatternType::Literal, AclOperation::All),
        deny_topic("t", PatternType::Literal, AclOperation::Read),
    ]);
    assert!(allowed(&a, &alice(), AclOperation::Describe, "t"));
    assert!(allowed(&a, &alice(), AclOperation::Write, "t"));
}

#[test]
fn super_user_is_allowed_despite_deny() {
    let config = AuthorizerConfig { super_users: vec!["User:admin".into()], allow_everyone_if_no_acl_found: false };
    let admin_deny = acl(
        ResourceType::Topic,
        "*",
        PatternType::Literal,
        "User:admin",
        "*",
        AclOperation::All,
        AclPermissionType::Deny,
    );
    let a = Authorizer::new(&config, vec![admin_deny]);
    let admin = ctx("User:admin", "10.0.0.9");
    assert!(allowed(&a, &admin, AclOperation::Write, "x"));
    assert!(a.authorize(&admin, AclOperation::Alter, &Resource::cluster()).is_allowed());
    assert!(!allowed(&a, &alice(), AclOperation::Write, "x"));
}

#[test]
fn no_acl_found_follows_allow_everyone_both_ways() {
    let other = acl(
        ResourceType::Topic,
        "orders",
        PatternType::Literal,
        "User:bob",
        "*",
        AclOperation::Read,
        AclPermissionType::Allow,
    );
    for allow_everyone in [false, true] {
        let config = AuthorizerConfig { super_users: vec![], allow_everyone_if_no_acl_found: allow_everyone };
        let a = Authorizer::new(&config, vec![other.clone()]);
        // No ACL on `payments`: the setting decides.
        assert_eq!(allowed(&a, &alice(), AclOperation::Read, "payments"), allow_everyone);
        // `orders` has an ACL (for bob): alice is denied whatever the setting.
        assert!(!allowed(&a, &alice(), AclOperation::Read, "orders"));
    }
}

#[test]
fn host_matches_star_or_the_exact_address() {
    let on = |host: &str| {
        authorizer(vec![acl(
            ResourceType::Topic,
            "t",
            PatternType::Literal,
            ALICE,
            host,
            AclOperation::Read,
            AclPermissionType::Allow,
        )])
    };
    assert!(allowed(&on("*"), &alice(), AclOperation::Read, "t"));
    assert!(allowed(&on("10.0.0.1"), &alice(), AclOperation::Read, "t"));
    assert!(!allowed(&on("10.0.0.2"), &alice(), AclOperation::Read, "t"));
    assert!(!allowed(&on("client.example"), &alice(), AclOperation::Read, "t"));
    // Kafka writes IPv6 addresses in full; the address, not its spelling, is compared.
    assert!(allowed(&on("0:0:0:0:0:0:0:1"), &ctx(ALICE, "::1"), AclOperation::Read, "t"));
    // An IPv4 client seen through a dual-stack socket is its IPv4 address.
    assert!(allowed(&on("10.0.0.1"), &ctx(ALICE, "::ffff:10.0.0.1"), AclOperation::Read, "t"));
}

#[test]
fn allow_implies_describe_and_describe_configs_as_kafka() {
    for op in [AclOperation::Read, AclOperation::Write, AclOperation::Delete, AclOperation::Alter] {
        let a = authorizer(vec![allow_topic("t", PatternType::Literal, op)]);
        assert!(allowed(&a, &alice(), AclOperation::Describe, "t"), "{op} implies DESCRIBE");
        assert!(!allowed(&a, &alice(), AclOperation::DescribeConfigs, "t"));
    }
    let create = authorizer(vec![allow_topic("t", PatternType::Literal, AclOperation::Create)]);
    assert!(!allowed(&create, &alice(), AclOperation::Describe, "t"));
    let alter_configs = authorizer(vec![allow_topic("t", PatternType::Literal, AclOperation::AlterConfigs)]);
    assert!(allowed(&alter_configs, &alice(), AclOperation::DescribeConfigs, "t"));
    assert!(!allowed(&alter_configs, &alice(), AclOperation::Describe, "t"));
    let all = authorizer(vec![allow_topic("t", PatternType::Literal, AclOperation::All)]);
    for op in AclOperation::ALL_VALUES.iter().filter(|op| op.code() >= 2) {
        assert!(allowed(&all, &alice(), *op, "t"), "ALL covers {op}");
    }
}

#[test]
fn user_star_principal_matches_every_principal() {
    let a = authorizer(vec![acl(
        ResourceType::Topic,
        "t",
        PatternType::Literal,
        "User:*",
        "*",
        AclOperation::Read,
        AclPermissionType::Allow,
    )]);
    assert!(allowed(&a, &alice(), AclOperation::Read, "t"));
    assert!(allowed(&a, &ctx("User:ANONYMOUS", "10.0.0.7"), AclOperation::Read, "t"));
    // Kafka matches `User:*` whatever the asker's principal type.
    assert!(allowed(&a, &ctx("Group:ops", "10.0.0.7"), AclOperation::Read, "t"));
    let bob_only = authorizer(vec![acl(
        ResourceType::Topic,
        "t",
        PatternType::Literal,
        "User:bob",
        "*",
        AclOperation::Read,
        AclPermissionType::Allow,
    )]);
    assert!(!allowed(&bob_only, &alice(), AclOperation::Read, "t"));
}

#[test]
fn authorize_any_write_on_some_topic() {
    use PatternType::*;
    let w = AclOperation::Write;
    let any = |acls: Vec<AclBinding>| authorizer(acls).authorize_any(&alice(), w, ResourceType::Topic).is_allowed();
    assert!(!any(vec![]));
    assert!(any(vec![allow_topic("orders", Literal, w)]));
    assert!(any(vec![allow_topic("app-", Prefixed, w)]));
    // READ does not count: no implied operations here.
    assert!(!any(vec![allow_topic("orders", Literal, AclOperation::Read)]));
    // A DENY on the same literal, or on a prefix of it, takes the allow away.
    assert!(!any(vec![allow_topic("orders", Literal, w), deny_topic("orders", Literal, w)]));
    assert!(!any(vec![allow_topic("orders", Literal, w), deny_topic("ord", Prefixed, w)]));
    assert!(!any(vec![allow_topic("app-x", Prefixed, w), deny_topic("app-", Prefixed, w)]));
    // A LITERAL DENY does not dominate a PREFIXED allow.
    assert!(any(vec![allow_topic("app-", Prefixed, w), deny_topic("app-", Literal, w)]));
    // One free allow is enough.
    assert!(any(vec![
        allow_topic("orders", Literal, w),
        deny_topic("orders", Literal, w),
        allow_topic("pay", Literal, w)
    ]));
    // DENY on `*` wins even over an ALLOW on `*`.
    assert!(!any(vec![allow_topic("*", Literal, w), deny_topic("*", Literal, w)]));
    assert!(!any(vec![deny_topic("*", Literal, w), allow_topic("*", Literal, w)]));
    // allow.everyone.if.no.acl.found allows when nothing names the probe.
    let open = Authorizer::new(&AuthorizerConfig { super_users: vec![], allow_everyone_if_no_acl_found: true }, vec![]);
    assert!(open.authorize_any(&alice(), w, ResourceType::Topic).is_allowed());
}

// ---- The indexed authorizer against a linear scan, on random ACL sets and questions. ----

const NAMES: &[&str] = &["a", "ab", "abc", "b", "*", "hard", "hardcode", "é", "éa"];
const QUERY_NAMES: &[&str] = &["a", "ab", "abc", "abcd", "b", "ba", "*", "hardcode", "x", "é", "éa"];
const PRINCIPALS: &[&str] = &["User:alice", "User:bob", "User:*", "Group:alice"];
const ASKERS: &[&str] = &["User:alice", "User:bob", "User:carol", "Group:alice"];
const HOSTS: &[&str] = &["*", "10.0.0.1", "10.0.0.2", "0:0:0:0:0:0:0:1", "::ffff:10.0.0.2", "client.example"];
const CLIENTS: &[&str] = &["10.0.0.1", "10.0.0.2", "::1", "::ffff:10.0.0.1"];
const TYPES: &[ResourceType] = &[ResourceType::Topic, ResourceType::Group];

/// Kafka's implications, written out as a table independent of `AclOperation::allow_grants`.
fn naive_allow_grants(granted: AclOperation, asked: AclOperation) -> bool {
    use AclOperation::*;
    granted == All
        || granted == asked
        || (asked == Describe && [Read, Write, Delete, Alter].contains(&granted))
        || (asked == DescribeConfigs && granted == AlterConfigs)
}

fn naive_who(acl: &AclBinding, c: &RequestContext) -> bool {
    let principal = acl.principal() == c.principal || acl.principal() == "User:*";
    let host =
        acl.host() == "*" || acl.host().parse::<IpAddr>().is_ok_and(|ip| ip.to_canonical() == c.host.to_canonical());
    principal && host
}

fn naive_authorize(
    config: &AuthorizerConfig,
    acls: &[AclBinding],
    c: &RequestContext,
    op: AclOperation,
    rt: ResourceType,
    name: &str,
) -> bool {
    if config.super_users.contains(&c.principal) {
        return true;
    }
    let applicable: Vec<&AclBinding> = acls
        .iter()
        .filter(|b| b.pattern().resource_type() == rt)
        .filter(|b| match b.pattern().pattern_type() {
            PatternType::Literal => b.pattern().name() == name || b.pattern().name() == "*",
            PatternType::Prefixed => name.starts_with(b.pattern().name()),
            _ => false,
        })
        .collect();
    if applicable.is_empty() {
        return config.allow_everyone_if_no_acl_found;
    }
    let counting = applicable.iter().filter(|b| naive_who(b, c));
    let mut allow = false;
    for b in counting {
        match b.permission_type() {
            AclPermissionType::Deny if b.operation() == AclOperation::All || b.operation() == op => return false,
            AclPermissionType::Allow if naive_allow_grants(b.operation(), op) => allow = true,
            _ => {}
        }
    }
    allow
}

fn naive_authorize_any(
    config: &AuthorizerConfig,
    acls: &[AclBinding],
    c: &RequestContext,
    op: AclOperation,
    rt: ResourceType,
) -> bool {
    if naive_authorize(config, acls, c, op, rt, "hardcode") {
        return true;
    }
    let relevant: Vec<&AclBinding> = acls
        .iter()
        .filter(|b| b.pattern().resource_type() == rt && naive_who(b, c))
        .filter(|b| b.operation() == op || b.operation() == AclOperation::All)
        .collect();
    let denies = |pt: PatternType| {
        relevant
            .iter()
            .filter(move |b| b.permission_type() == AclPermissionType::Deny && b.pattern().pattern_type() == pt)
            .map(|b| b.pattern().name())
    };
    if denies(PatternType::Literal).any(|n| n == "*") {
        return false;
    }
    let allows = relevant.iter().filter(|b| b.permission_type() == AclPermissionType::Allow);
    let mut allows = allows.peekable();
    if relevant.iter().any(|b| {
        b.permission_type() == AclPermissionType::Allow
            && b.pattern().pattern_type() == PatternType::Literal
            && b.pattern().name() == "*"
    }) {
        return true;
    }
    allows.any(|b| {
        let name = b.pattern().name();
        let literal_denied =
            b.pattern().pattern_type() == PatternType::Literal && denies(PatternType::Literal).any(|n| n == name);
        let prefix_denied = denies(PatternType::Prefixed).any(|p| name.starts_with(p));
        !literal_denied && !prefix_denied
    })
}

fn arb_acl() -> impl Strategy<Value = AclBinding> {
    (0..TYPES.len(), 0..NAMES.len(), prop::bool::ANY, 0..PRINCIPALS.len(), 0..HOSTS.len(), 2i8..=14, prop::bool::ANY)
        .prop_map(|(t, n, prefixed, p, h, op, allow)| {
            let pt = if prefixed { PatternType::Prefixed } else { PatternType::Literal };
            let perm = if allow { AclPermissionType::Allow } else { AclPermissionType::Deny };
            AclBinding::from_codes(TYPES[t].code(), NAMES[n], pt.code(), PRINCIPALS[p], HOSTS[h], op, perm.code())
                .expect("generated ACLs are valid")
        })
}

#[derive(Debug, Clone)]
struct Query {
    asker: &'static str,
    client: &'static str,
    op: AclOperation,
    rt: ResourceType,
    name: &'static str,
}

fn arb_query() -> impl Strategy<Value = Query> {
    (0..ASKERS.len(), 0..CLIENTS.len(), 2i8..=14, 0..TYPES.len(), 0..QUERY_NAMES.len()).prop_map(|(a, c, op, t, n)| {
        Query {
            asker: ASKERS[a],
            client: CLIENTS[c],
            op: AclOperation::from_code(op),
            rt: TYPES[t],
            name: QUERY_NAMES[n],
        }
    })
}

fn arb_config() -> impl Strategy<Value = AuthorizerConfig> {
    (prop::bool::ANY, prop::bool::ANY).prop_map(|(bob_super, allow_everyone)| AuthorizerConfig {
        super_users: if bob_super { vec!["User:bob".into()] } else { vec![] },
        allow_everyone_if_no_acl_found: allow_everyone,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(500))]

    #[test]
    fn indexed_authorizer_agrees_with_a_linear_scan(
        config in arb_config(),
        acls in proptest::collection::vec(arb_acl(), 0..40),
        queries in proptest::collection::vec(arb_query(), 1..40),
    ) {
        let indexed = Authorizer::new(&config, acls.clone());
        for q in queries {
            let c = ctx(q.asker, q.client);
            let resource = Resource { resource_type: q.rt, name: q.name };
            let expected = naive_authorize(&config, &acls, &c, q.op, q.rt, q.name);
            prop_assert_eq!(indexed.authorize(&c, q.op, &resource).is_allowed(), expected, "authorize {:?}", q);
            let expected_any = naive_authorize_any(&config, &acls, &c, q.op, q.rt);
            prop_assert_eq!(indexed.authorize_any(&c, q.op, q.rt).is_allowed(), expected_any, "authorize_any {:?}", q);
        }
    }
}
