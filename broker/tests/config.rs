//! Broker settings: defaults, Kafka key names in TOML (dotted or quoted), command-line overrides, and a
//! clear refusal naming the key for anything unknown or invalid.

use std::path::PathBuf;

use shardlog_broker::config::settings::SETTINGS;
use shardlog_broker::config::{BrokerConfig, ConfigError, Endpoint, Sources, Voter};
use shardlog_storage::FlushPolicy;

#[test]
fn no_settings_give_the_documented_single_node_defaults() {
    let c = BrokerConfig::load(&Sources::default()).unwrap();
    assert_eq!(c.node_id, 1);
    assert_eq!(c.data_dir, PathBuf::from("data"));
    assert_eq!(c.listener, Endpoint { host: "127.0.0.1".into(), port: 9092 });
    assert_eq!(c.advertised_listener, c.listener);
    assert_eq!(c.quorum_voters, Vec::<Voter>::new(), "its own one-voter quorum");
    assert_eq!((c.broker_session_timeout_ms, c.broker_heartbeat_interval_ms), (9000, 2000));
    assert!(c.shards >= 1);
    assert!(c.auto_create_topics);
    assert_eq!(c.num_partitions, 3);
    assert_eq!(c.socket_request_max_bytes, 100 << 20);
    assert_eq!(c.log.flush, FlushPolicy::Always, "acks mean fsynced unless Kafka's interval flush is asked for");
    assert_eq!(c.log.segment_bytes, 1 << 30);
    assert_eq!(c.shard_limits.idle_poll_us, 0, "an idle shard sleeps at once unless asked to poll");
}

#[test]
fn kafka_names_work_as_dotted_or_quoted_toml_keys() {
    let dotted = BrokerConfig::from_toml(
        r#"
        node.id = 3
        log.dirs = "/var/lib/shardlog"
        listeners = "PLAINTEXT://0.0.0.0:19092"
        advertised.listeners = "broker3.example:19092"
        shards = 4
        controller.quorum.voters = "1@h1:9093,2@h2:9093,3@h3:9093"
        log.retention.ms = 3600000
        log.segment.bytes = 1048576
        num.partitions = 6
        auto.create.topics.enable = false
        shard.idle.poll.us = 100
        "#,
    )
    .unwrap();
    let quoted = BrokerConfig::from_toml(
        r#"
        "node.id" = 3
        "log.dirs" = "/var/lib/shardlog"
        listeners = "PLAINTEXT://0.0.0.0:19092"
        "advertised.listeners" = "broker3.example:19092"
        shards = 4
        "controller.quorum.voters" = "1@h1:9093,2@h2:9093,3@h3:9093"
        "log.retention.ms" = 3600000
        "log.segment.bytes" = 1048576
        "num.partitions" = 6
        "auto.create.topics.enable" = false
        "shard.idle.poll.us" = 100
        "#,
    )
    .unwrap();
    assert_eq!(dotted, quoted);
    assert_eq!(dotted.node_id, 3);
    assert_eq!(dotted.listener, Endpoint { host: "0.0.0.0".into(), port: 19092 });
    assert_eq!(dotted.advertised_listener.host, "broker3.example");
    assert_eq!(dotted.quorum_voters.len(), 3);
    assert_eq!(dotted.log.retention_ms, Some(3_600_000));
    assert_eq!(dotted.log.segment_bytes, 1 << 20);
    assert!(!dotted.auto_create_topics);
    assert_eq!(dotted.shard_limits.idle_poll_us, 100);
}

#[test]
fn command_line_overrides_beat_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("shardlog.toml");
    std::fs::write(&file, "node.id = 2\nlisteners = \"127.0.0.1:9100\"\nlog.flush.interval.ms = 1000\n").unwrap();
    let c = BrokerConfig::load(&Sources {
        file: Some(file),
        overrides: vec!["node.id=7".into(), "listeners=127.0.0.1:9200".into(), "log.retention.ms=-1".into()],
    })
    .unwrap();
    assert_eq!(c.node_id, 7);
    assert_eq!(c.listener.port, 9200, "a bare HOST:PORT override is taken as a string");
    assert_eq!(c.log.retention_ms, None, "-1 keeps data forever");
    assert_eq!(c.log.flush, FlushPolicy::Interval { messages: i64::MAX as u64, ms: 1000 });
}

#[test]
fn unknown_keys_and_invalid_values_are_refused_by_name() {
    let err = BrokerConfig::from_toml("log.retention.mins = 5").unwrap_err();
    assert_eq!(err, ConfigError::UnknownKey { key: "log.retention.mins".into() });
    assert_eq!(err.to_string(), "unknown setting `log.retention.mins` (`shardlog config list` shows every setting)");

    let cases = [
        ("num.partitions = 0", "num.partitions"),
        ("listeners = \"localhost\"", "listeners"),
        // A TLS listener needs its key and certificate.
        ("listeners = \"SSL://h:9093\"", "ssl.keystore.location"),
        ("listeners = \"KERBEROS://h:9093\"", "listener.security.protocol.map"),
        ("listeners = \"PLAINTEXT://h:9092,SASL_PLAINTEXT://h:9092\"", "listeners"),
        ("ssl.client.auth = \"always\"", "ssl.client.auth"),
        ("authorizer.class.name = \"kafka.security.authorizer.AclAuthorizer\"", "authorizer.class.name"),
        ("super.users = \"admin\"", "super.users"),
        ("sasl.enabled.mechanisms = \"GSSAPI\"", "sasl.enabled.mechanisms"),
        ("ssl.enabled.protocols = [\"TLSv1.1\"]", "ssl.enabled.protocols"),
        ("ssl.keystore.type = \"JKS\"", "ssl.keystore.type"),
        ("inter.broker.listener.name = \"INTERNAL\"", "inter.broker.listener.name"),
        ("listener.name.internal.ssl.client.auth = \"required\"", "listener.name.internal.ssl.client.auth"),
        (
            "\"listener.name.plaintext.max.connection.creation.rate\" = 0",
            "listener.name.plaintext.max.connection.creation.rate",
        ),
        ("listeners = \"h:99999\"", "listeners"),
        ("shards = 0", "shards"),
        ("controller.quorum.voters = \"1@a:1,2@b:2\"", "controller.quorum.voters"),
        ("controller.quorum.voters = \"1@a:1,1@b:2,3@c:3\"", "controller.quorum.voters"),
        ("log.segment.bytes = 10", "log.segment.bytes"),
        ("log.retention.ms = -5", "log.retention.ms"),
        ("socket.request.max.bytes = 12", "socket.request.max.bytes"),
        ("log.flush.interval.messages = 0", "log.flush.interval.messages"),
        ("shard.idle.poll.us = -1", "shard.idle.poll.us"),
        ("shard.idle.poll.us = 5000000", "shard.idle.poll.us"),
    ];
    for (text, key) in cases {
        match BrokerConfig::from_toml(text) {
            Err(ConfigError::Invalid { key: k, reason }) => assert_eq!(k, key, "{text}: {reason}"),
            other => panic!("{text}: expected an invalid-value error for {key}, got {other:?}"),
        }
    }
    // A listener's own connection rate, as a TOML integer or a string.
    for text in [
        "\"listener.name.plaintext.max.connection.creation.rate\" = 50",
        "listener.name.plaintext.max.connection.creation.rate = \"50\"",
    ] {
        let config = BrokerConfig::from_toml(text).unwrap_or_else(|e| panic!("{text}: {e}"));
        assert_eq!(config.listeners.all[0].max_connection_creation_rate, Some(50), "{text}");
    }
    // A value of the wrong type names its key too.
    let err = BrokerConfig::from_toml("listeners = \"127.0.0.1:9092\"\nnum.partitions = \"three\"").unwrap_err();
    assert!(matches!(&err, ConfigError::Invalid { key, .. } if key == "num.partitions"), "{err}");
    assert!(matches!(
        BrokerConfig::load(&Sources { file: None, overrides: vec!["nonsense".into()] }),
        Err(ConfigError::BadOverride(_))
    ));
    let missing = BrokerConfig::load(&Sources { file: Some("/nonexistent/shardlog.toml".into()), overrides: vec![] });
    assert!(matches!(missing, Err(ConfigError::Read { .. })));
}

fn overrides(items: &[String]) -> Sources {
    Sources { file: None, overrides: items.to_vec() }
}

#[test]
fn every_setting_in_the_table_is_reported_and_changes_the_broker_config_when_set() {
    let defaults = BrokerConfig::load(&Sources::default()).unwrap();
    let keys: Vec<&str> = defaults.effective.iter().map(|e| e.key).collect();
    assert_eq!(keys, SETTINGS.iter().map(|s| s.key).collect::<Vec<_>>(), "every row, in the table's order");
    assert!(defaults.effective.iter().all(|e| !e.explicit), "nothing was set");
    let unset: Vec<&str> = defaults.effective.iter().filter(|e| e.value.is_none()).map(|e| e.key).collect();
    assert_eq!(
        unset,
        [
            "ssl.keystore.location",
            "ssl.truststore.location",
            "cluster.ssl.keystore.location",
            "cluster.ssl.truststore.location",
            "sasl.oauthbearer.jwks.endpoint.url",
            "sasl.oauthbearer.expected.issuer",
            "sasl.oauthbearer.expected.audience",
            "authorizer.class.name",
            "super.users",
            "controller.quorum.voters",
            "log.flush.interval.messages",
            "log.flush.interval.ms"
        ]
    );
    let without_report = |c: &BrokerConfig| BrokerConfig { effective: Vec::new(), ..c.clone() };
    for row in SETTINGS {
        let c = BrokerConfig::load(&overrides(&[format!("{}={}", row.key, row.example)]))
            .unwrap_or_else(|e| panic!("{}={}: {e}", row.key, row.example));
        assert_ne!(
            without_report(&c),
            without_report(&defaults),
            "{}={} is accepted but changes nothing",
            row.key,
            row.example
        );
        let reported = c.effective.iter().find(|e| e.key == row.key).unwrap();
        assert!(reported.explicit, "{}", row.key);
        let value = reported.value.as_deref().unwrap();
        let bare = row.example.trim_start_matches("PLAINTEXT://");
        assert!(value == row.example || value == bare, "{}: reported {value:?}, set {:?}", row.key, row.example);
    }
}

#[test]
fn settings_kafka_has_but_shardlog_does_not_implement_are_refused_with_the_reason() {
    let err = BrokerConfig::from_toml("unclean.leader.election.enable = true").unwrap_err();
    assert!(matches!(&err, ConfigError::Unsupported { key, .. } if key == "unclean.leader.election.enable"));
    assert!(err.to_string().contains("per topic"), "{err}");
}

#[test]
fn the_metrics_endpoint_takes_host_and_port() {
    let config = BrokerConfig::load(&overrides(&["metrics.listen=0.0.0.0:9100".into()])).unwrap();
    assert_eq!((config.metrics_listen.host.as_str(), config.metrics_listen.port), ("0.0.0.0", 9100));
    let default = BrokerConfig::load(&overrides(&[])).unwrap();
    assert_eq!(default.metrics_listen.to_string(), "127.0.0.1:9644");
    let err = BrokerConfig::load(&overrides(&["metrics.listen=9100".into()])).unwrap_err();
    assert!(matches!(&err, ConfigError::Invalid { key, .. } if key == "metrics.listen"), "{err}");
}

#[test]
fn the_heartbeat_must_come_more_often_than_the_session_expires() {
    let err = BrokerConfig::load(&overrides(&[
        "broker.session.timeout.ms=1000".into(),
        "broker.heartbeat.interval.ms=1000".into(),
    ]))
    .unwrap_err();
    assert!(matches!(&err, ConfigError::Invalid { key, .. } if key == "broker.heartbeat.interval.ms"), "{err}");
}

#[test]
fn the_transaction_state_log_settings_have_kafkas_defaults_and_refuse_what_no_topic_can_be() {
    let c = BrokerConfig::load(&Sources::default()).unwrap();
    let log = c.transaction_log;
    assert_eq!((log.partitions, log.replication_factor, log.min_isr), (50, 3, 2));
    assert_eq!(log.segment_bytes, 100 << 20);
    // RF 1 alone is a valid single-broker setting: the min ISR is capped at the RF when the topic is made.
    let single = BrokerConfig::load(&overrides(&["transaction.state.log.replication.factor=1".into()])).unwrap();
    assert_eq!((single.transaction_log.replication_factor, single.transaction_log.min_isr), (1, 2));
    for (setting, key) in [
        ("transaction.state.log.num.partitions=0", "transaction.state.log.num.partitions"),
        ("transaction.state.log.num.partitions=10001", "transaction.state.log.num.partitions"),
        ("transaction.state.log.replication.factor=0", "transaction.state.log.replication.factor"),
        ("transaction.state.log.replication.factor=40000", "transaction.state.log.replication.factor"),
        ("transaction.state.log.min.isr=0", "transaction.state.log.min.isr"),
        ("transaction.state.log.min.isr=-1", "transaction.state.log.min.isr"),
        ("transaction.state.log.segment.bytes=10", "transaction.state.log.segment.bytes"),
        ("transaction.state.log.segment.bytes=4294967296", "transaction.state.log.segment.bytes"),
    ] {
        match BrokerConfig::load(&overrides(&[setting.into()])) {
            Err(ConfigError::Invalid { key: k, reason }) => {
                assert_eq!(k, key, "{setting}: {reason}");
                assert!(!reason.is_empty(), "{setting}: a reason is given");
            }
            other => panic!("{setting}: expected an invalid-value error for {key}, got {other:?}"),
        }
    }
}
