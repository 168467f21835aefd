//! Topic settings with Kafka's names and meanings, checked and turned into the storage engine's
//! [`LogConfig`] on top of the broker's defaults.
//!
//! Only the keys below are accepted; anything else is refused by name (Kafka answers
//! INVALID_CONFIG), so a typo never silently does nothing.

use std::collections::BTreeMap;

use shardlog_storage::{FlushPolicy, LogConfig};

/// Kafka's topic setting names this broker implements.
pub const TOPIC_CONFIG_KEYS: &[&str] = &[
    "retention.ms",
    "retention.bytes",
    "segment.bytes",
    "segment.ms",
    "max.message.bytes",
    "flush.messages",
    "flush.ms",
    "min.insync.replicas",
    "unclean.leader.election.enable",
];

/// A topic setting that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TopicConfigError {
    #[error("unknown topic config `{0}`")]
    Unknown(String),
    #[error("invalid value {value:?} for topic config `{key}`: {reason}")]
    Invalid { key: String, value: String, reason: String },
}

/// A topic's settings: the explicitly set keys (what DescribeConfigs reports as set), resolved against
/// the broker defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicConfig {
    /// Keys set on the topic, as given (validated).
    pub overrides: BTreeMap<String, String>,
    pub log: LogConfig,
    pub min_insync_replicas: u16,
    pub unclean_leader_election: bool,
}

/// The broker-wide defaults a topic starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicDefaults {
    pub log: LogConfig,
    pub min_insync_replicas: u16,
    pub unclean_leader_election: bool,
}

fn parse_i64(key: &str, value: &str, min: i64) -> Result<i64, TopicConfigError> {
    let invalid = |reason: String| TopicConfigError::Invalid { key: key.into(), value: value.into(), reason };
    let v: i64 = value.trim().parse().map_err(|_| invalid("not an integer".into()))?;
    if v < min {
        return Err(invalid(format!("must be at least {min}")));
    }
    Ok(v)
}

impl TopicConfig {
    /// Resolves `overrides` (Kafka names) against `defaults`, refusing unknown keys and bad values.
    pub fn resolve(
        defaults: &TopicDefaults,
        overrides: &BTreeMap<String, String>,
    ) -> Result<TopicConfig, TopicConfigError> {
        let mut log = defaults.log.clone();
        let mut min_insync_replicas = defaults.min_insync_replicas;
        let mut unclean_leader_election = defaults.unclean_leader_election;
        let (mut flush_messages, mut flush_ms) = match defaults.log.flush {
            FlushPolicy::Always => (None, None),
            FlushPolicy::Interval { messages, ms } => (Some(messages), Some(ms)),
        };
        for (key, value) in overrides {
            match key.as_str() {
                "retention.ms" => log.retention_ms = Some(parse_i64(key, value, -1)?).filter(|v| *v >= 0),
                "retention.bytes" => {
                    log.retention_bytes = Some(parse_i64(key, value, -1)?).filter(|v| *v >= 0).map(|v| v as u64)
                }
                "segment.bytes" => log.segment_bytes = parse_i64(key, value, 14)?.min(i32::MAX as i64) as u64,
                "segment.ms" => log.segment_ms = parse_i64(key, value, 1)?,
                "max.message.bytes" => log.max_message_bytes = parse_i64(key, value, 0)?.min(i32::MAX as i64) as usize,
                "flush.messages" => flush_messages = Some(parse_i64(key, value, 1)? as u64),
                "flush.ms" => flush_ms = Some(parse_i64(key, value, 0)?.max(1) as u64),
                "min.insync.replicas" => {
                    min_insync_replicas = parse_i64(key, value, 1)?.min(i16::MAX as i64) as u16;
                }
                "unclean.leader.election.enable" => {
                    unclean_leader_election = match value.trim() {
                        "true" => true,
                        "false" => false,
                        _ => {
                            return Err(TopicConfigError::Invalid {
                                key: key.clone(),
                                value: value.clone(),
                                reason: "must be true or false".into(),
                            });
                        }
                    }
                }
                _ => return Err(TopicConfigError::Unknown(key.clone())),
            }
        }
        log.flush = match (flush_messages, flush_ms) {
            (None, None) => FlushPolicy::Always,
            (messages, ms) => {
                FlushPolicy::Interval { messages: messages.unwrap_or(u64::MAX), ms: ms.unwrap_or(u64::MAX) }
            }
        };
        log.validate().map_err(|e| TopicConfigError::Invalid {
            key: "topic configs".into(),
            value: format!("{overrides:?}"),
            reason: e.to_string(),
        })?;
        Ok(TopicConfig { overrides: overrides.clone(), log, min_insync_replicas, unclean_leader_election })
    }

    /// Every implemented key with its effective value, for DescribeConfigs: (key, value, set on the topic).
    pub fn describe(&self) -> Vec<(&'static str, String, bool)> {
        let log = &self.log;
        let (flush_messages, flush_ms) = match log.flush {
            FlushPolicy::Always => (None, None),
            FlushPolicy::Interval { messages, ms } => (Some(messages), Some(ms)),
        };
        let or_max =
            |v: Option<u64>| v.filter(|v| *v < i64::MAX as u64).map_or(i64::MAX.to_string(), |v| v.to_string());
        TOPIC_CONFIG_KEYS
            .iter()
            .map(|&key| {
                let value = match key {
                    "retention.ms" => log.retention_ms.map_or("-1".to_string(), |v| v.to_string()),
                    "retention.bytes" => log.retention_bytes.map_or("-1".to_string(), |v| v.to_string()),
                    "segment.bytes" => log.segment_bytes.to_string(),
                    "segment.ms" => log.segment_ms.to_string(),
                    "max.message.bytes" => log.max_message_bytes.to_string(),
                    "flush.messages" => or_max(flush_messages),
                    "flush.ms" => or_max(flush_ms),
                    "min.insync.replicas" => self.min_insync_replicas.to_string(),
                    "unclean.leader.election.enable" => self.unclean_leader_election.to_string(),
                    other => unreachable!("{other} listed without a value"),
                };
                (key, value, self.overrides.contains_key(key))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn defaults() -> TopicDefaults {
        TopicDefaults { log: LogConfig::default(), min_insync_replicas: 1, unclean_leader_election: false }
    }

    fn set(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn kafka_names_override_the_defaults() {
        let c = TopicConfig::resolve(
            &defaults(),
            &set(&[
                ("retention.ms", "-1"),
                ("retention.bytes", "1073741824"),
                ("segment.bytes", "1048576"),
                ("flush.messages", "1000"),
                ("min.insync.replicas", "2"),
                ("unclean.leader.election.enable", "true"),
            ]),
        )
        .unwrap();
        assert_eq!(c.log.retention_ms, None);
        assert_eq!(c.log.retention_bytes, Some(1 << 30));
        assert_eq!(c.log.segment_bytes, 1 << 20);
        assert_eq!(c.log.flush, FlushPolicy::Interval { messages: 1000, ms: u64::MAX });
        assert_eq!(c.min_insync_replicas, 2);
        assert!(c.unclean_leader_election);
        let described = c.describe();
        assert_eq!(described.len(), TOPIC_CONFIG_KEYS.len());
        assert!(described.contains(&("segment.bytes", "1048576".to_string(), true)));
        assert!(described.contains(&("segment.ms", "604800000".to_string(), false)));
        assert!(described.contains(&("flush.ms", i64::MAX.to_string(), false)));
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused_by_name() {
        assert_eq!(
            TopicConfig::resolve(&defaults(), &set(&[("retention.hours", "5")])),
            Err(TopicConfigError::Unknown("retention.hours".into()))
        );
        for (key, value) in [
            ("retention.ms", "-2"),
            ("segment.bytes", "ten"),
            ("unclean.leader.election.enable", "yes"),
            ("min.insync.replicas", "0"),
        ] {
            match TopicConfig::resolve(&defaults(), &set(&[(key, value)])) {
                Err(TopicConfigError::Invalid { key: k, .. }) => assert_eq!(k, key),
                other => panic!("{key}={value}: {other:?}"),
            }
        }
    }
}
