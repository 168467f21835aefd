//! The settings as an operator and a Kafka admin client meet them: `shardlog config list`, refusals at
//! start for settings that would do nothing, `--version`, DescribeConfigs of the broker resource, and a
//! setting's effect on requests (`min.insync.replicas`).

mod common;

use std::collections::BTreeMap;
use std::process::Command;

use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::{ApiKey, DescribeConfigsRequest, ResponseKind};
use kafka_protocol::protocol::StrBytes;
use shardlog_broker::config::settings::SETTINGS;
use shardlog_broker::topics::configs::TOPIC_SETTINGS;

use common::requests::{batch, create, produce_request};
use common::{Broker, receive, send};

fn shardlog(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_shardlog")).args(args).output().expect("run shardlog")
}

#[test]
fn config_list_prints_every_broker_and_topic_setting_with_its_default_and_meaning() {
    let out = shardlog(&["config", "list"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let line = |key: &str| {
        text.lines()
            .find(|l| l.split_whitespace().next() == Some(key))
            .unwrap_or_else(|| panic!("no line for {key} in:\n{text}"))
            .to_string()
    };
    for s in SETTINGS {
        let l = line(s.key);
        assert!(l.contains(s.default_text()) && l.contains(s.meaning), "{l}");
    }
    for s in TOPIC_SETTINGS {
        // Topic keys that share a broker key's name (compression.type, min.insync.replicas) appear twice.
        let l = text.lines().rfind(|l| l.split_whitespace().next() == Some(s.key)).unwrap();
        assert!(l.contains(s.broker_key.unwrap_or(s.fixed_default)) && l.contains(s.meaning), "{l}");
    }
    let help = String::from_utf8(shardlog(&["start", "--help"]).stdout).unwrap();
    assert!(help.contains("shardlog config list"), "start --help names where the settings are: {help}");
}

#[test]
fn a_setting_that_would_do_nothing_stops_the_start_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().to_str().unwrap();
    let args = ["start", "--data-dir", data, "--listen", "127.0.0.1:0", "--set", "unclean.leader.election.enable=true"];
    let out = shardlog(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} started");
    assert!(stderr.contains("is not supported"), "{args:?}: {stderr}");
}

#[test]
fn version_names_the_commit_and_the_build_profile() {
    let out = shardlog(&["--version"]);
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with(&format!("shardlog {} (commit ", env!("CARGO_PKG_VERSION"))), "{text}");
    assert!(text.contains("debug build)") || text.contains("release build)"), "{text}");
    let head = Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success());
    if let Some(head) = head {
        let head = String::from_utf8(head.stdout).unwrap();
        assert!(text.contains(head.trim()), "built at {} but says {text}", head.trim());
    }
}

/// A described setting: (value, config source, read only).
type Described = (Option<String>, i8, bool);

/// DescribeConfigs v4 of the broker resource `name`: (error code, key -> what it says of that key).
fn describe_broker(broker: &Broker, name: &str, keys: Option<&[&str]>) -> (i16, BTreeMap<String, Described>) {
    let mut s = broker.connect();
    let request = DescribeConfigsRequest::default().with_include_documentation(true).with_resources(vec![
        DescribeConfigsResource::default()
            .with_resource_type(4)
            .with_resource_name(StrBytes::from_string(name.to_string()))
            .with_configuration_keys(keys.map(|k| k.iter().map(|k| StrBytes::from_string(k.to_string())).collect())),
    ]);
    send(&mut s, ApiKey::DescribeConfigs, 4, 1, &request);
    let (_, body) = receive(&mut s, ApiKey::DescribeConfigs, 4);
    let ResponseKind::DescribeConfigs(r) = body else { panic!("wrong response") };
    let result = &r.results[0];
    for c in &result.configs {
        assert!(c.documentation.as_ref().is_some_and(|d| !d.is_empty()), "{} has no documentation", c.name.as_str());
    }
    let configs = result
        .configs
        .iter()
        .map(|c| {
            let value = c.value.as_ref().map(|v| v.as_str().to_string());
            (c.name.as_str().to_string(), (value, c.config_source, c.read_only))
        })
        .collect();
    (result.error_code, configs)
}

#[test]
fn describe_configs_of_the_broker_gives_every_setting_with_its_value_and_source() {
    let broker = Broker::start_with(2, &["--set", "log.retention.ms=1234", "--set", "num.partitions=5"]);
    let (error, configs) = describe_broker(&broker, "1", None);
    assert_eq!(error, 0);
    assert_eq!(configs.len(), SETTINGS.len(), "{configs:?}");
    // STATIC_BROKER_CONFIG (4) for what was set at start, DEFAULT_CONFIG (5) otherwise; all read-only.
    assert_eq!(configs["log.retention.ms"], (Some("1234".into()), 4, true));
    assert_eq!(configs["num.partitions"], (Some("5".into()), 4, true));
    assert_eq!(configs["shards"], (Some("2".into()), 4, true), "--shards is a setting too");
    assert_eq!(configs["message.max.bytes"], (Some("1048588".into()), 5, true));
    assert_eq!(configs["listeners"].0, Some(format!("127.0.0.1:{}", broker.port)));
    assert_eq!(configs["log.flush.interval.ms"], (None, 5, true), "unset: no value");

    let (error, some) = describe_broker(&broker, "1", Some(&["num.partitions", "no.such.key"]));
    assert_eq!((error, some.keys().map(String::as_str).collect::<Vec<_>>()), (0, vec!["num.partitions"]));
    assert_eq!(describe_broker(&broker, "", None), (0, BTreeMap::new()), "no cluster-wide dynamic defaults");
    assert_eq!(describe_broker(&broker, "7", None).0, 42, "INVALID_REQUEST: broker 7 is another broker");
}

/// Produces one batch to partition 0 with `acks`; returns the error code.
fn produce_code(broker: &Broker, topic: &str, acks: i16) -> i16 {
    let mut s = broker.connect();
    send(&mut s, ApiKey::Produce, 9, 1, &produce_request(topic, 0, &batch(1, 1, 0), acks));
    let (_, body) = receive(&mut s, ApiKey::Produce, 9);
    let ResponseKind::Produce(r) = body else { panic!("wrong response") };
    r.responses[0].partition_responses[0].error_code
}

#[test]
fn acks_all_is_refused_while_the_isr_is_smaller_than_min_insync_replicas() {
    let broker = Broker::start_with(1, &["--set", "min.insync.replicas=2"]);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "broker-default", 1, 1, &[]), 0);
    assert_eq!(create(&mut s, "topic-setting", 1, 1, &[("min.insync.replicas", "1")]), 0);
    // One replica, so an ISR of one: NOT_ENOUGH_REPLICAS (19) for acks=all under the broker's default of 2.
    assert_eq!(produce_code(&broker, "broker-default", -1), 19);
    assert_eq!(produce_code(&broker, "broker-default", 1), 0, "acks=1 does not wait for the ISR");
    assert_eq!(produce_code(&broker, "topic-setting", -1), 0, "the topic's own setting wins");
}
