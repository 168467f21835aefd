//! `shardlog-bench authorizer`: what an authorization decision costs with `--acls` ACLs in force against
//! none, in one run: single decisions (a LITERAL hit, a PREFIXED hit, a resource no ACL names, a super
//! user), the whole request gate for a one-topic Produce, and rebuilding the index (which every ACL
//! change does). The baseline ("none") has no ACLs and `allow.everyone.if.no.acl.found` on. No broker
//! is involved; the figures are per call on this thread.

use std::hint::black_box;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ProduceRequest, RequestKind, TopicName};
use kafka_protocol::protocol::StrBytes;
use shardlog_broker::security::authorizer::acl::ResourceType;
use shardlog_broker::security::authorizer::acl::{AclBinding, AclOperation, AclPermissionType, PatternType};
use shardlog_broker::security::authorizer::rules::{Gate, authorize_request};
use shardlog_broker::security::authorizer::{Authorizer, AuthorizerConfig, RequestContext, Resource};

/// Options of `shardlog-bench authorizer`.
#[derive(Debug, Clone, clap::Args)]
pub struct AuthorizerArgs {
    /// ACLs in force for the loaded case.
    #[arg(long, default_value_t = 10_000)]
    pub acls: usize,
    /// Calls per measured case.
    #[arg(long, default_value_t = 1_000_000)]
    pub iterations: u32,
}

/// A mix like a shared cluster's: per application principal, LITERAL topic ACLs (most of them),
/// PREFIXED topic ACLs, group ACLs, and a few DENY rules.
fn acls(count: usize) -> Vec<AclBinding> {
    let binding = |rt: ResourceType, name: String, pt: PatternType, i: usize, op: AclOperation, allow: bool| {
        let permission = if allow { AclPermissionType::Allow } else { AclPermissionType::Deny };
        AclBinding::from_codes(
            rt.code(),
            name,
            pt.code(),
            format!("User:app-{}", i % 200),
            "*",
            op.code(),
            permission.code(),
        )
        .expect("generated ACLs are valid")
    };
    (0..count)
        .map(|i| match i % 20 {
            0..=15 => {
                let op = if i % 2 == 0 { AclOperation::Write } else { AclOperation::Read };
                binding(ResourceType::Topic, format!("topic-{i}"), PatternType::Literal, i, op, true)
            }
            16 => {
                binding(ResourceType::Topic, format!("team-{i}-"), PatternType::Prefixed, i, AclOperation::Read, true)
            }
            17 => binding(ResourceType::Group, format!("group-{i}"), PatternType::Literal, i, AclOperation::Read, true),
            18 => {
                binding(ResourceType::Group, format!("team-{i}-"), PatternType::Prefixed, i, AclOperation::Read, true)
            }
            _ => binding(
                ResourceType::Topic,
                format!("topic-{}", i - 1),
                PatternType::Literal,
                i + 1,
                AclOperation::Write,
                false,
            ),
        })
        .collect()
}

fn per_call(iterations: u32, mut call: impl FnMut()) -> Duration {
    for _ in 0..iterations / 10 {
        call();
    }
    let start = Instant::now();
    for _ in 0..iterations {
        call();
    }
    start.elapsed() / iterations
}

fn produce_one_topic() -> RequestKind {
    let topic = TopicProduceData::default()
        .with_name(TopicName(StrBytes::from_static_str("topic-0")))
        .with_partition_data(vec![PartitionProduceData::default().with_index(0)]);
    RequestKind::Produce(ProduceRequest::default().with_acks(1).with_topic_data(vec![topic]))
}

pub fn run(args: &AuthorizerArgs) -> Result<()> {
    let config = AuthorizerConfig { super_users: vec!["User:admin".into()], allow_everyone_if_no_acl_found: false };
    let bindings = acls(args.acls);
    let build_start = Instant::now();
    let loaded = Arc::new(Authorizer::new(&config, bindings.clone()));
    let build = build_start.elapsed();
    // The baseline lets everyone in (`allow.everyone.if.no.acl.found`), so that the request gate takes
    // the same path (allowed, handled) in both columns.
    let open = AuthorizerConfig { allow_everyone_if_no_acl_found: true, ..config.clone() };
    let empty = Arc::new(Authorizer::new(&open, Vec::new()));
    let host = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
    let ctx = |principal: &str| RequestContext { principal: principal.to_string(), host };
    // app-0 owns topic-0 (WRITE), app-16 owns the prefix team-16-, nobody names `unnamed`.
    let cases: [(&str, RequestContext, AclOperation, Resource<'static>); 4] = [
        ("LITERAL hit", ctx("User:app-0"), AclOperation::Write, Resource::topic("topic-0")),
        ("PREFIXED hit", ctx("User:app-16"), AclOperation::Read, Resource::topic("team-16-orders")),
        ("no ACL names it", ctx("User:app-1"), AclOperation::Write, Resource::topic("unnamed")),
        ("super user", ctx("User:admin"), AclOperation::Write, Resource::topic("topic-0")),
    ];
    println!("authorize() per call, {} ACLs against none ({} calls each):", loaded.acl_count(), args.iterations);
    println!("{:<18} {:>12} {:>12} {:>10}", "case", "none", "loaded", "decision");
    for (name, ctx, op, resource) in &cases {
        let none = per_call(args.iterations, || {
            black_box(empty.authorize(black_box(ctx), *op, black_box(resource)));
        });
        let with = per_call(args.iterations, || {
            black_box(loaded.authorize(black_box(ctx), *op, black_box(resource)));
        });
        let decision = loaded.authorize(ctx, *op, resource);
        println!("{name:<18} {:>10} ns {:>10} ns {:>10?}", none.as_nanos(), with.as_nanos(), decision);
    }
    let producer = ctx("User:app-0");
    let request = produce_one_topic();
    let gate = |authorizer: &Arc<Authorizer>| {
        per_call(args.iterations, || {
            let gate = authorize_request(&producer, authorizer, black_box(request.clone()), 12);
            assert!(matches!(gate, Gate::Handle { .. }), "the producer may write topic-0");
            black_box(gate);
        })
    };
    let gate_none = gate(&empty);
    let gate_loaded = gate(&loaded);
    let clone_only = per_call(args.iterations, || {
        black_box(black_box(&request).clone());
    });
    println!(
        "{:<18} {:>10} ns {:>10} ns   (one-topic Produce through the gate; cloning the request alone: {} ns)",
        "request gate",
        gate_none.as_nanos(),
        gate_loaded.as_nanos(),
        clone_only.as_nanos()
    );
    println!(
        "index build for {} ACLs: {:.1} ms (each ACL change rebuilds it)",
        bindings.len(),
        build.as_secs_f64() * 1e3
    );
    Ok(())
}
