//! The security metadata in the quorum's rules: SCRAM credentials (KIP-554), ACL bindings and client
//! quotas (KIP-546), each command all or nothing; and brokers registering their named listeners.

use shardlog_broker::quorum::security::{
    self, AclFilter, AclRecord, QuotaEntry, QuotaOp, ScramCredentialRecord, ScramDeletion, ScramUpsertion, operation,
    pattern_type, permission_type, resource_type,
};
use shardlog_broker::quorum::state::ListenerEndpoint;

use super::*;

fn credential(mechanism: i8, iterations: u32) -> ScramCredentialRecord {
    let len = security::scram_key_len(mechanism).unwrap_or(32);
    ScramCredentialRecord { salt: vec![7; 16], iterations, stored_key: vec![1; len], server_key: vec![2; len] }
}

fn upsert(user: &str, mechanism: i8) -> ScramUpsertion {
    ScramUpsertion { user: user.into(), mechanism, credential: credential(mechanism, 4096) }
}

fn scram(upsertions: Vec<ScramUpsertion>, deletions: Vec<ScramDeletion>) -> Command {
    Command::AlterScramCredentials { upsertions, deletions }
}

fn delete_credential(user: &str, mechanism: i8) -> ScramDeletion {
    ScramDeletion { user: user.into(), mechanism }
}

#[test]
fn scram_credentials_are_added_replaced_and_deleted_per_user_and_mechanism() {
    let mut state = ClusterState::default();
    state.apply(&scram(vec![upsert("alice", 1), upsert("bob", 2)], vec![])).unwrap();
    assert_eq!(state.security.scram_credential("alice", 1), Some(&credential(1, 4096)));
    assert_eq!(state.security.scram_credential("alice", 2), None);
    assert_eq!(state.security.scram_version, 1);

    // Replaced: another iteration count.
    let mut again = upsert("alice", 1);
    again.credential.iterations = 8192;
    state.apply(&scram(vec![again, upsert("carol", 2)], vec![])).unwrap();
    assert_eq!(state.security.scram_credential("alice", 1).map(|c| c.iterations), Some(8192));

    // Deleting one mechanism of a user keeps the others; the last one takes the user away.
    state.apply(&scram(vec![upsert("bob", 1)], vec![])).unwrap();
    state.apply(&scram(vec![], vec![delete_credential("bob", 2)])).unwrap();
    assert!(state.security.scram_credential("bob", 1).is_some() && state.security.scram_credential("bob", 2).is_none());
    state.apply(&scram(vec![], vec![delete_credential("bob", 1)])).unwrap();
    assert!(!state.security.scram.contains_key("bob"));
    assert_eq!(state.security.scram_version, 5);
}

#[test]
fn a_scram_change_with_one_bad_item_changes_nothing_and_says_which_error() {
    let mut state = ClusterState::default();
    state.apply(&scram(vec![upsert("alice", 1)], vec![])).unwrap();

    let cases: Vec<(Command, i16)> = vec![
        // RESOURCE_NOT_FOUND: no such credential to delete.
        (scram(vec![upsert("bob", 1)], vec![delete_credential("alice", 2)]), 91),
        (scram(vec![], vec![delete_credential("nobody", 1)]), 91),
        // DUPLICATE_RESOURCE: one user twice in one request, in either list.
        (scram(vec![upsert("bob", 1), upsert("bob", 2)], vec![]), 92),
        (scram(vec![upsert("alice", 2)], vec![delete_credential("alice", 1)]), 92),
        // UNSUPPORTED_SASL_MECHANISM.
        (scram(vec![upsert("bob", 3)], vec![]), 33),
        (scram(vec![upsert("bob", 0)], vec![]), 33),
        (scram(vec![], vec![delete_credential("alice", 9)]), 33),
        // UNACCEPTABLE_CREDENTIAL: iterations out of Kafka's bounds, an empty user, a malformed key.
        (scram(vec![ScramUpsertion { user: "bob".into(), mechanism: 1, credential: credential(1, 4095) }], vec![]), 93),
        (
            scram(vec![ScramUpsertion { user: "bob".into(), mechanism: 2, credential: credential(2, 16385) }], vec![]),
            93,
        ),
        (scram(vec![upsert("", 1)], vec![]), 93),
        (
            scram(
                vec![ScramUpsertion {
                    user: "bob".into(),
                    mechanism: 2,
                    // SHA-256's key length for SCRAM-SHA-512.
                    credential: credential(1, 4096),
                }],
                vec![],
            ),
            93,
        ),
        (
            scram(
                vec![ScramUpsertion {
                    user: "bob".into(),
                    mechanism: 1,
                    credential: ScramCredentialRecord { salt: vec![], ..credential(1, 4096) },
                }],
                vec![],
            ),
            93,
        ),
    ];
    for (command, code) in cases {
        let error = refused(&mut state, command.clone());
        assert_eq!(error.kafka_code(), code, "{command:?}: {error}");
    }
    // Bounded: at most MAX_ITEMS_PER_COMMAND items.
    let many = (0..=security::MAX_ITEMS_PER_COMMAND).map(|i| upsert(&format!("u{i}"), 1)).collect();
    assert_eq!(refused(&mut state, scram(many, vec![])).kafka_code(), 42);
    let most = (0..security::MAX_ITEMS_PER_COMMAND).map(|i| upsert(&format!("u{i}"), 1)).collect();
    state.apply(&scram(most, vec![])).unwrap();
}

fn acl(resource_type: i8, name: &str, pattern_type: i8, principal: &str, operation: i8, permission: i8) -> AclRecord {
    AclRecord {
        resource_type,
        resource_name: name.into(),
        pattern_type,
        principal: principal.into(),
        host: "*".into(),
        operation,
        permission_type: permission,
    }
}

fn read_topic(name: &str, pattern: i8) -> AclRecord {
    acl(resource_type::TOPIC, name, pattern, "User:alice", operation::READ, permission_type::ALLOW)
}

fn any_filter() -> AclFilter {
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

#[test]
fn acl_bindings_are_created_once_and_invalid_ones_refuse_the_whole_command() {
    let mut state = ClusterState::default();
    let orders = read_topic("orders", pattern_type::LITERAL);
    state.apply(&Command::CreateAcls { acls: vec![orders.clone()] }).unwrap();
    assert_eq!(state.security.acls_version, 1);
    // Created again: no change, and the version stays (an authorizer need not rebuild).
    state.apply(&Command::CreateAcls { acls: vec![orders.clone()] }).unwrap();
    assert_eq!((state.security.acls.len(), state.security.acls_version), (1, 1));

    let cluster = |name: &str| acl(resource_type::CLUSTER, name, 3, "User:admin", operation::ALTER, 3);
    state.apply(&Command::CreateAcls { acls: vec![cluster("kafka-cluster")] }).unwrap();
    let bad = [
        cluster("other"),
        AclRecord { resource_type: resource_type::ANY, ..orders.clone() },
        AclRecord { resource_type: 0, ..orders.clone() },
        AclRecord { resource_type: 8, ..orders.clone() },
        AclRecord { pattern_type: pattern_type::MATCH, ..orders.clone() },
        AclRecord { pattern_type: pattern_type::ANY, ..orders.clone() },
        AclRecord { operation: operation::ANY, ..orders.clone() },
        AclRecord { operation: 15, ..orders.clone() },
        AclRecord { permission_type: permission_type::ANY, ..orders.clone() },
        AclRecord { principal: "alice".into(), ..orders.clone() },
        AclRecord { principal: "User:".into(), ..orders.clone() },
        AclRecord { principal: ":alice".into(), ..orders.clone() },
        AclRecord { host: String::new(), ..orders.clone() },
        AclRecord { resource_name: String::new(), ..orders.clone() },
    ];
    for binding in bad {
        let command = Command::CreateAcls { acls: vec![read_topic("payments", 3), binding.clone()] };
        assert_eq!(refused(&mut state, command).kafka_code(), 42, "INVALID_REQUEST for {binding:?}");
    }
    // Every kind of concrete binding Kafka has is accepted.
    let good = vec![
        acl(resource_type::GROUP, "app-", pattern_type::PREFIXED, "User:bob", operation::READ, permission_type::DENY),
        acl(resource_type::TRANSACTIONAL_ID, "*", 3, "User:*", operation::WRITE, 3),
        acl(resource_type::DELEGATION_TOKEN, "t", 3, "User:bob", operation::DESCRIBE, 3),
        acl(resource_type::USER, "bob", 3, "User:bob", operation::CREATE_TOKENS, 3),
        AclRecord { host: "10.0.0.1".into(), ..read_topic("orders", 3) },
    ];
    state.apply(&Command::CreateAcls { acls: good }).unwrap();
    assert_eq!(state.security.acls.len(), 7);
    let many = (0..=security::MAX_ITEMS_PER_COMMAND).map(|i| read_topic(&format!("t{i}"), 3)).collect();
    assert_eq!(refused(&mut state, Command::CreateAcls { acls: many }).kafka_code(), 42);
}

#[test]
fn delete_acls_filters_match_as_kafkas_and_report_what_each_removed() {
    let literal = read_topic("orders", pattern_type::LITERAL);
    let wildcard = read_topic("*", pattern_type::LITERAL);
    let prefixed = read_topic("ord", pattern_type::PREFIXED);
    let other = read_topic("payments", pattern_type::LITERAL);
    let group = acl(resource_type::GROUP, "orders", 3, "User:bob", operation::READ, permission_type::DENY);
    let mut state = ClusterState::default();
    state
        .apply(&Command::CreateAcls {
            acls: vec![literal.clone(), wildcard.clone(), prefixed.clone(), other.clone(), group.clone()],
        })
        .unwrap();
    let acls_version = state.security.acls_version;

    // MATCH for a name: the LITERAL binding of that name, the `*` one and the PREFIXED prefixes of it.
    let matching = AclFilter {
        resource_type: resource_type::TOPIC,
        resource_name: Some("orders".into()),
        pattern_type: pattern_type::MATCH,
        ..any_filter()
    };
    for binding in [&literal, &wildcard, &prefixed] {
        assert!(matching.matches(binding), "{binding:?}");
    }
    assert!(!matching.matches(&other) && !matching.matches(&group));
    // ANY with a name: that exact name, whatever the pattern type; an exact pattern type: only it.
    let exact_name = AclFilter { resource_name: Some("ord".into()), ..any_filter() };
    assert!(exact_name.matches(&prefixed) && !exact_name.matches(&literal));
    let literal_only = AclFilter { pattern_type: pattern_type::LITERAL, ..any_filter() };
    assert!(literal_only.matches(&literal) && !literal_only.matches(&prefixed));
    // Principal, host, operation and permission narrow it.
    assert!(!AclFilter { principal: Some("User:bob".into()), ..matching.clone() }.matches(&literal));
    assert!(!AclFilter { host: Some("10.0.0.1".into()), ..matching.clone() }.matches(&literal));
    assert!(!AclFilter { operation: operation::WRITE, ..matching.clone() }.matches(&literal));
    assert!(!AclFilter { permission_type: permission_type::DENY, ..matching.clone() }.matches(&literal));

    // Filters remove in order; a binding two filters match is reported by the first only.
    let events = state.apply(&Command::DeleteAcls { filters: vec![exact_name, matching.clone()] }).unwrap();
    assert_eq!(events, vec![Event::AclsDeleted { removed: vec![vec![prefixed], vec![wildcard, literal]] }]);
    assert_eq!(state.security.acls.iter().cloned().collect::<Vec<_>>(), vec![other, group.clone()]);
    assert_eq!(state.security.acls_version, acls_version + 1);

    // Nothing matched: an empty list, and no new version.
    let events = state.apply(&Command::DeleteAcls { filters: vec![matching] }).unwrap();
    assert_eq!(events, vec![Event::AclsDeleted { removed: vec![vec![]] }]);
    assert_eq!(state.security.acls_version, acls_version + 1);

    // Unknown codes (UNKNOWN = 0) and a malformed principal are refused, and change nothing.
    for bad in [
        AclFilter { resource_type: 0, ..any_filter() },
        AclFilter { pattern_type: 0, ..any_filter() },
        AclFilter { operation: 0, ..any_filter() },
        AclFilter { permission_type: 0, ..any_filter() },
        AclFilter { principal: Some("bob".into()), ..any_filter() },
    ] {
        let command = Command::DeleteAcls { filters: vec![any_filter(), bad] };
        assert_eq!(refused(&mut state, command).kafka_code(), 42);
    }
    // ANY everywhere: everything.
    let events = state.apply(&Command::DeleteAcls { filters: vec![any_filter()] }).unwrap();
    assert_eq!(events.len(), 1);
    assert!(state.security.acls.is_empty());
}

fn entity(parts: &[(&str, Option<&str>)]) -> Vec<(String, Option<String>)> {
    parts.iter().map(|(k, n)| (k.to_string(), n.map(str::to_string))).collect()
}

fn set(key: &str, value: f64) -> QuotaOp {
    QuotaOp { key: key.into(), value: Some(value) }
}

fn quotas(entries: Vec<QuotaEntry>) -> Command {
    Command::AlterClientQuotas { entries }
}

#[test]
fn client_quotas_are_set_and_removed_per_entity_and_key() {
    let mut state = ClusterState::default();
    let alice = entity(&[("client-id", Some("app")), ("user", Some("alice"))]);
    let default_user = entity(&[("user", None)]);
    let ip = entity(&[("ip", Some("10.0.0.1"))]);
    state
        .apply(&quotas(vec![
            QuotaEntry {
                entity: alice.clone(),
                ops: vec![set("producer_byte_rate", 1024.0), set("request_percentage", 12.5)],
            },
            QuotaEntry { entity: default_user.clone(), ops: vec![set("consumer_byte_rate", 2048.0)] },
            QuotaEntry { entity: ip.clone(), ops: vec![set("connection_creation_rate", 10.0)] },
        ]))
        .unwrap();
    assert_eq!(state.security.quotas[&alice]["request_percentage"], 12.5);
    assert_eq!(state.security.quotas[&default_user]["consumer_byte_rate"], 2048.0);
    assert_eq!(state.security.quotas[&ip]["connection_creation_rate"], 10.0);
    assert_eq!(state.security.quotas_version, 1);

    // Removing one key keeps the others; removing the last takes the entity away.
    let remove = |key: &str| QuotaOp { key: key.into(), value: None };
    state.apply(&quotas(vec![QuotaEntry { entity: alice.clone(), ops: vec![remove("producer_byte_rate")] }])).unwrap();
    assert_eq!(state.security.quotas[&alice].len(), 1);
    state
        .apply(&quotas(vec![QuotaEntry { entity: default_user.clone(), ops: vec![remove("consumer_byte_rate")] }]))
        .unwrap();
    assert!(!state.security.quotas.contains_key(&default_user));
}

#[test]
fn a_quota_change_breaking_kafkas_rules_is_refused_whole() {
    let mut state = ClusterState::default();
    let user = entity(&[("user", Some("alice"))]);
    let good = QuotaEntry { entity: user.clone(), ops: vec![set("producer_byte_rate", 1024.0)] };
    let bad = [
        // The ip entity has only the connection rate; users and client ids do not have it.
        QuotaEntry { entity: entity(&[("ip", Some("10.0.0.1"))]), ops: vec![set("producer_byte_rate", 1.0)] },
        QuotaEntry { entity: user.clone(), ops: vec![set("connection_creation_rate", 1.0)] },
        QuotaEntry { entity: user.clone(), ops: vec![set("no_such_key", 1.0)] },
        // Values above 0, finite, whole for the byte and connection rates.
        QuotaEntry { entity: user.clone(), ops: vec![set("producer_byte_rate", 0.0)] },
        QuotaEntry { entity: user.clone(), ops: vec![set("consumer_byte_rate", -5.0)] },
        QuotaEntry { entity: user.clone(), ops: vec![set("request_percentage", f64::NAN)] },
        QuotaEntry { entity: user.clone(), ops: vec![set("request_percentage", f64::INFINITY)] },
        QuotaEntry { entity: user.clone(), ops: vec![set("producer_byte_rate", 10.5)] },
        // A key twice.
        QuotaEntry { entity: user.clone(), ops: vec![set("producer_byte_rate", 1.0), set("producer_byte_rate", 2.0)] },
        // Entities: known types, sorted, each once, ip alone and an address.
        QuotaEntry { entity: entity(&[]), ops: vec![set("producer_byte_rate", 1.0)] },
        QuotaEntry { entity: entity(&[("group", Some("g"))]), ops: vec![set("producer_byte_rate", 1.0)] },
        QuotaEntry {
            entity: entity(&[("user", Some("a")), ("client-id", Some("c"))]),
            ops: vec![set("producer_byte_rate", 1.0)],
        },
        QuotaEntry {
            entity: entity(&[("user", Some("a")), ("user", None)]),
            ops: vec![set("producer_byte_rate", 1.0)],
        },
        QuotaEntry {
            entity: entity(&[("ip", Some("10.0.0.1")), ("user", Some("a"))]),
            ops: vec![set("connection_creation_rate", 1.0)],
        },
        QuotaEntry { entity: entity(&[("ip", Some("not-an-ip"))]), ops: vec![set("connection_creation_rate", 1.0)] },
        // The same entity twice in one command.
        good.clone(),
    ];
    for entry in bad {
        let command = quotas(vec![good.clone(), entry.clone()]);
        assert_eq!(refused(&mut state, command).kafka_code(), 42, "INVALID_REQUEST for {entry:?}");
    }
    // The default ip entity and a v6 address are fine.
    let ips = vec![
        QuotaEntry { entity: entity(&[("ip", None)]), ops: vec![set("connection_creation_rate", 5.0)] },
        QuotaEntry { entity: entity(&[("ip", Some("::1"))]), ops: vec![set("connection_creation_rate", 5.0)] },
    ];
    state.apply(&quotas(ips)).unwrap();
    assert_eq!(state.security.quotas.len(), 2);
}

fn listener(name: &str, port: u16) -> ListenerEndpoint {
    ListenerEndpoint { name: name.into(), host: "broker1.example".into(), port }
}

fn register_listeners(id: u32, incarnation: u64, now_ms: i64, listeners: Vec<ListenerEndpoint>) -> Command {
    Command::RegisterBrokerListeners {
        id: NodeId(id),
        endpoint: BrokerEndpoint { host: "10.0.0.1".into(), port: 9000 + id as u16 },
        listeners,
        incarnation,
        previous_incarnation: None,
        now_ms,
        session_timeout_ms: SESSION_MS,
    }
}

#[test]
fn a_broker_registers_its_named_listeners_and_an_old_registration_gets_plaintext() {
    let mut state = ClusterState::default();
    state.apply(&register(1, 1, 0)).unwrap();
    assert_eq!(state.brokers[&NodeId(1)].listener("PLAINTEXT"), Some(("127.0.0.1", 9001)));

    let both = vec![listener("PLAINTEXT", 9092), listener("SASL_SSL", 9093)];
    state.apply(&register_listeners(2, 1, 0, both.clone())).unwrap();
    let broker = &state.brokers[&NodeId(2)];
    assert_eq!(broker.listeners, both);
    assert_eq!(broker.listener("SASL_SSL"), Some(("broker1.example", 9093)));
    assert_eq!(broker.listener("SSL"), None);
    assert_eq!(broker.endpoint.port, 9002, "the peer endpoint stays as registered");

    // The registration rules are RegisterBroker's: another live incarnation within its session is refused.
    let takeover = register_listeners(2, 2, 1000, both.clone());
    assert_eq!(refused(&mut state, takeover).kafka_code(), 101, "DUPLICATE_BROKER_REGISTRATION");
    let later = register_listeners(2, 2, SESSION_MS + 1, vec![listener("SASL_SSL", 9094)]);
    state.apply(&later).unwrap();
    assert_eq!(state.brokers[&NodeId(2)].listener("PLAINTEXT"), None);

    for bad in [
        vec![],
        vec![listener("", 9092)],
        vec![ListenerEndpoint { host: String::new(), ..listener("PLAINTEXT", 9092) }],
        vec![listener("PLAINTEXT", 9092), listener("PLAINTEXT", 9093)],
        (0..=shardlog_broker::quorum::state::MAX_LISTENERS as u16).map(|i| listener(&format!("L{i}"), i)).collect(),
    ] {
        assert_eq!(refused(&mut state, register_listeners(3, 1, 0, bad)).kafka_code(), 42);
    }
}

/// A random security command over few users, names and entities, valid or not.
fn security_command() -> impl Strategy<Value = Command> {
    let user = prop::sample::select(vec!["", "alice", "bob"]);
    let mechanism = 0i8..4;
    let iterations = prop::sample::select(vec![100u32, 4096, 16384, 20000]);
    let upsertion = (user.clone(), mechanism.clone(), iterations).prop_map(|(u, m, i)| ScramUpsertion {
        user: u.into(),
        mechanism: m,
        credential: credential(m, i),
    });
    let deletion = (user, mechanism).prop_map(|(u, m)| delete_credential(u, m));
    let name = prop::sample::select(vec!["", "*", "orders", "ord", "kafka-cluster"]);
    let principal = prop::sample::select(vec!["User:alice", "User:*", "alice"]);
    let binding = (0i8..9, name.clone(), 0i8..5, principal.clone(), 0i8..16, 0i8..4).prop_map(
        |(resource_type, name, pattern_type, principal, operation, permission_type)| AclRecord {
            resource_type,
            resource_name: name.into(),
            pattern_type,
            principal: principal.into(),
            host: "*".into(),
            operation,
            permission_type,
        },
    );
    let filter = (0i8..9, prop::option::of(name), 0i8..5, prop::option::of(principal), 0i8..16, 0i8..4).prop_map(
        |(resource_type, name, pattern_type, principal, operation, permission_type)| AclFilter {
            resource_type,
            resource_name: name.map(str::to_string),
            pattern_type,
            principal: principal.map(str::to_string),
            host: None,
            operation,
            permission_type,
        },
    );
    let kind = prop::sample::select(vec!["user", "client-id", "ip", "group"]);
    let entity_name = prop::sample::select(vec![None, Some("alice"), Some("10.0.0.1")]);
    let key = prop::sample::select(vec!["producer_byte_rate", "request_percentage", "connection_creation_rate"]);
    let value = prop::option::of(prop::sample::select(vec![-1.0f64, 0.0, 2.5, 1024.0]));
    let entry = (
        prop::collection::vec((kind, entity_name), 0..3),
        prop::collection::vec((key, value).prop_map(|(k, v)| QuotaOp { key: k.into(), value: v }), 0..3),
    )
        .prop_map(|(parts, ops)| QuotaEntry {
            entity: parts.into_iter().map(|(k, n)| (k.to_string(), n.map(str::to_string))).collect(),
            ops,
        });
    prop_oneof![
        (prop::collection::vec(upsertion, 0..3), prop::collection::vec(deletion, 0..2)).prop_map(|(u, d)| scram(u, d)),
        prop::collection::vec(binding, 0..3).prop_map(|acls| Command::CreateAcls { acls }),
        prop::collection::vec(filter, 0..3).prop_map(|filters| Command::DeleteAcls { filters }),
        prop::collection::vec(entry, 0..3).prop_map(quotas),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Whatever security commands arrive: refused ones change nothing, the same log gives the same state,
    /// everything stored passes the checks a new item must pass, and each version moves whenever its part
    /// of the state does (the ACLs' only then).
    #[test]
    fn every_security_command_stream_keeps_only_valid_metadata(
        commands in prop::collection::vec(security_command(), 1..60)
    ) {
        let mut state = ClusterState::default();
        let mut replay = ClusterState::default();
        for command in &commands {
            let before = state.security.clone();
            match state.apply(command) {
                Err(_) => prop_assert_eq!(&state.security, &before),
                Ok(_) => {
                    prop_assert_eq!(state.security.acls != before.acls, state.security.acls_version != before.acls_version);
                    // A credential replaced by an equal one still counts as a change.
                    if state.security.scram != before.scram {
                        prop_assert!(state.security.scram_version > before.scram_version);
                    }
                    if state.security.quotas != before.quotas {
                        prop_assert!(state.security.quotas_version > before.quotas_version);
                    }
                }
            }
            let _ = replay.apply(command);
            let s = &state.security;
            for acl in &s.acls {
                prop_assert!(security::check_acl(acl).is_ok(), "{:?}", acl);
            }
            for (user, credentials) in &s.scram {
                prop_assert!(!credentials.is_empty());
                for (mechanism, credential) in credentials {
                    let upsertion =
                        ScramUpsertion { user: user.clone(), mechanism: *mechanism, credential: credential.clone() };
                    let checked = security::check_upsertion(&upsertion);
                    prop_assert!(checked.is_ok());
                }
            }
            for (entity, values) in &s.quotas {
                prop_assert!(!values.is_empty());
                let ops = values.iter().map(|(k, v)| QuotaOp { key: k.clone(), value: Some(*v) }).collect();
                let entry = QuotaEntry { entity: entity.clone(), ops };
                prop_assert!(security::check_quota_entry(&entry).is_ok());
            }
        }
        prop_assert_eq!(state, replay);
    }
}
