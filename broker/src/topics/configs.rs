//! Topic settings with Kafka's names and meanings, checked and turned into the storage engine's
//! [`LogConfig`] on top of the broker's defaults.
//!
//! Only the keys below are accepted; anything else is refused by name (Kafka answers
//! INVALID_CONFIG), so a typo never silently does nothing.

use std::collections::BTreeMap;

use shardlog_storage::{FlushPolicy, LogConfig};

/// One topic setting: Kafka's name, the broker setting that gives its default, and what it means.
#[derive(Debug, Clone, Copy)]
pub struct TopicSetting {
    pub key: &'static str,
    /// The broker setting whose value a topic without this key gets; `None`: [`TopicSetting::fixed_default`].
    pub broker_key: Option<&'static str>,
    /// The default when there is no broker setting for it.
    pub fixed_default: &'static str,
    pub unit: &'static str,
    pub meaning: &'static str,
    /// A valid value other than the default (the tests set every key to it and check it has an effect).
    pub example: &'static str,
}

const fn topic_setting(
    key: &'static str,
    broker_key: &'static str,
    unit: &'static str,
    meaning: &'static str,
    example: &'static str,
) -> TopicSetting {
    TopicSetting { key, broker_key: Some(broker_key), fixed_default: "", unit, meaning, example }
}

/// Kafka's topic settings this broker implements, in the order DescribeConfigs and `config list` give them.
pub const TOPIC_SETTINGS: &[TopicSetting] = &[
    topic_setting(
        "retention.ms",
        "log.retention.ms",
        "ms",
        "segments whose newest record is older are deleted (-1: keep)",
        "-1",
    ),
    topic_setting(
        "retention.bytes",
        "log.retention.bytes",
        "bytes",
        "oldest segments are deleted while a partition is larger (-1: no limit)",
        "1073741824",
    ),
    topic_setting(
        "segment.bytes",
        "log.segment.bytes",
        "bytes",
        "a segment is rolled before it grows past this",
        "1048576",
    ),
    topic_setting(
        "segment.ms",
        "log.roll.ms",
        "ms",
        "a segment older than this is rolled on the next append",
        "3600000",
    ),
    topic_setting(
        "max.message.bytes",
        "message.max.bytes",
        "bytes",
        "the largest record batch accepted (after recompression)",
        "2097152",
    ),
    topic_setting(
        "compression.type",
        "compression.type",
        "",
        "producer (store batches as sent), or the codec batches are stored in: uncompressed, gzip, snappy, lz4, zstd",
        "zstd",
    ),
    topic_setting(
        "flush.messages",
        "log.flush.interval.messages",
        "",
        "with it or flush.ms set: Kafka's interval flush (acks mean written, not synced)",
        "1000",
    ),
    topic_setting(
        "flush.ms",
        "log.flush.interval.ms",
        "ms",
        "see flush.messages; unset, every acknowledged batch is fdatasync'ed first",
        "1000",
    ),
    topic_setting(
        "min.insync.replicas",
        "min.insync.replicas",
        "",
        "acks=all is refused (NOT_ENOUGH_REPLICAS) while the ISR is smaller",
        "2",
    ),
    TopicSetting {
        key: "cleanup.policy",
        broker_key: None,
        fixed_default: "delete",
        unit: "",
        meaning: "delete (old segments by retention.ms/retention.bytes), compact (the latest record of each key \
                  kept), or both: compact,delete",
        example: "compact",
    },
    TopicSetting {
        key: "delete.retention.ms",
        broker_key: None,
        fixed_default: "86400000",
        unit: "ms",
        meaning: "on a compacted topic, how long a tombstone (a key with a null value) is kept once compaction first \
                  reached it",
        example: "60000",
    },
    TopicSetting {
        key: "min.cleanable.dirty.ratio",
        broker_key: None,
        fixed_default: "0.5",
        unit: "",
        meaning: "a compacted partition is cleaned once this share of its cleanable bytes was written since \
                  the last cleaning",
        example: "0.1",
    },
    TopicSetting {
        key: "min.compaction.lag.ms",
        broker_key: None,
        fixed_default: "0",
        unit: "ms",
        meaning: "on a compacted topic, a record stays uncompacted at least this long",
        example: "60000",
    },
    TopicSetting {
        key: "unclean.leader.election.enable",
        broker_key: None,
        fixed_default: "false",
        unit: "",
        meaning: "a replica outside the ISR may become leader when no ISR member is alive (records may be lost)",
        example: "true",
    },
];

/// The codec a topic stores its batches in (`compression.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    /// Batches are stored as the producer sent them (Kafka's default).
    Producer,
    /// Batches are stored in this codec; a batch sent in another one is recompressed by the broker.
    Codec(Codec),
}

/// A record batch codec: the low three bits of a v2 batch's attributes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    None = 0,
    Gzip = 1,
    Snappy = 2,
    Lz4 = 3,
    Zstd = 4,
}

impl Codec {
    /// The codec of attribute bits `0..=4`; `None` for the values Kafka does not define.
    pub fn from_attributes(attributes: i16) -> Option<Codec> {
        Some(match attributes & 0x7 {
            0 => Codec::None,
            1 => Codec::Gzip,
            2 => Codec::Snappy,
            3 => Codec::Lz4,
            4 => Codec::Zstd,
            _ => return None,
        })
    }
}

impl Compression {
    /// Kafka's values: `producer`, `uncompressed`, `gzip`, `snappy`, `lz4`, `zstd`.
    pub fn parse(text: &str) -> Result<Compression, String> {
        Ok(match text.trim() {
            "producer" => Compression::Producer,
            "uncompressed" => Compression::Codec(Codec::None),
            "gzip" => Compression::Codec(Codec::Gzip),
            "snappy" => Compression::Codec(Codec::Snappy),
            "lz4" => Compression::Codec(Codec::Lz4),
            "zstd" => Compression::Codec(Codec::Zstd),
            other => {
                return Err(format!("{other:?}: use producer, uncompressed, gzip, snappy, lz4 or zstd"));
            }
        })
    }

    pub fn as_str(&self) -> &'static str {
        match self {
            Compression::Producer => "producer",
            Compression::Codec(Codec::None) => "uncompressed",
            Compression::Codec(Codec::Gzip) => "gzip",
            Compression::Codec(Codec::Snappy) => "snappy",
            Compression::Codec(Codec::Lz4) => "lz4",
            Compression::Codec(Codec::Zstd) => "zstd",
        }
    }
}

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
    pub compression: Compression,
    /// `delete.retention.ms`, `min.cleanable.dirty.ratio`, `min.compaction.lag.ms`: kept whatever the
    /// policy, in effect (as `log.compaction`) while `cleanup.policy` holds `compact`.
    pub compaction: shardlog_storage::CompactionConfig,
}

/// The broker-wide defaults a topic starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicDefaults {
    pub log: LogConfig,
    pub min_insync_replicas: u16,
    pub compression: Compression,
}

fn parse_i64(key: &str, value: &str, min: i64) -> Result<i64, TopicConfigError> {
    let invalid = |reason: String| TopicConfigError::Invalid { key: key.into(), value: value.into(), reason };
    let v: i64 = value.trim().parse().map_err(|_| invalid("not an integer".into()))?;
    if v < min {
        return Err(invalid(format!("must be at least {min}")));
    }
    Ok(v)
}

/// `cleanup.policy`'s value: a comma-separated list of `delete` and `compact` (Kafka treats it as a
/// list). Returns (compact, delete).
pub fn parse_cleanup_policy(value: &str) -> Result<(bool, bool), String> {
    let (mut compact, mut delete) = (false, false);
    for item in value.split(',').map(str::trim) {
        match item {
            "compact" => compact = true,
            "delete" => delete = true,
            other => return Err(format!("{other:?}: use delete, compact, or compact,delete")),
        }
    }
    Ok((compact, delete))
}

/// `min.cleanable.dirty.ratio` in millionths: a number in [0, 1].
fn parse_ratio(key: &str, value: &str) -> Result<u32, TopicConfigError> {
    let invalid =
        |reason: &str| TopicConfigError::Invalid { key: key.into(), value: value.into(), reason: reason.into() };
    let v: f64 = value.trim().parse().map_err(|_| invalid("not a number"))?;
    if !(0.0..=1.0).contains(&v) {
        return Err(invalid("must be between 0 and 1"));
    }
    Ok((v * 1_000_000.0).round() as u32)
}

impl TopicConfig {
    /// Resolves `overrides` (Kafka names) against `defaults`, refusing unknown keys and bad values.
    pub fn resolve(
        defaults: &TopicDefaults,
        overrides: &BTreeMap<String, String>,
    ) -> Result<TopicConfig, TopicConfigError> {
        let mut log = defaults.log.clone();
        let mut min_insync_replicas = defaults.min_insync_replicas;
        let mut unclean_leader_election = false;
        let mut compression = defaults.compression;
        let (mut compact, mut delete) = (false, true);
        let mut compaction = shardlog_storage::CompactionConfig::default();
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
                "segment.bytes" => {
                    // A segment holds at least one batch header (Kafka's own minimum, 14, predates them).
                    log.segment_bytes =
                        parse_i64(key, value, shardlog_storage::batch::HEADER_BYTES as i64)?.min(i32::MAX as i64) as u64
                }
                "segment.ms" => log.segment_ms = parse_i64(key, value, 1)?,
                "max.message.bytes" => log.max_message_bytes = parse_i64(key, value, 0)?.min(i32::MAX as i64) as usize,
                "flush.messages" => flush_messages = Some(parse_i64(key, value, 1)? as u64),
                "flush.ms" => flush_ms = Some(parse_i64(key, value, 0)?.max(1) as u64),
                "compression.type" => {
                    compression = Compression::parse(value).map_err(|reason| TopicConfigError::Invalid {
                        key: key.clone(),
                        value: value.clone(),
                        reason,
                    })?
                }
                "min.insync.replicas" => {
                    min_insync_replicas = parse_i64(key, value, 1)?.min(i16::MAX as i64) as u16;
                }
                "cleanup.policy" => {
                    (compact, delete) = parse_cleanup_policy(value).map_err(|reason| TopicConfigError::Invalid {
                        key: key.clone(),
                        value: value.clone(),
                        reason,
                    })?
                }
                "delete.retention.ms" => compaction.delete_retention_ms = parse_i64(key, value, 0)?,
                "min.cleanable.dirty.ratio" => compaction.min_cleanable_dirty_ratio_ppm = parse_ratio(key, value)?,
                "min.compaction.lag.ms" => compaction.min_compaction_lag_ms = parse_i64(key, value, 0)?,
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
        log.compaction = compact.then_some(compaction);
        if !delete {
            // Without `delete` nothing is removed by age or size (Kafka's compact-only topics).
            log.retention_ms = None;
            log.retention_bytes = None;
        }
        log.validate().map_err(|e| TopicConfigError::Invalid {
            key: "topic configs".into(),
            value: format!("{overrides:?}"),
            reason: e.to_string(),
        })?;
        Ok(TopicConfig {
            overrides: overrides.clone(),
            log,
            min_insync_replicas,
            unclean_leader_election,
            compression,
            compaction,
        })
    }

    /// `cleanup.policy` as Kafka spells it.
    pub fn cleanup_policy(&self) -> &'static str {
        let policy = self.overrides.get("cleanup.policy").and_then(|v| parse_cleanup_policy(v).ok());
        match policy.unwrap_or((false, true)) {
            (true, true) => "compact,delete",
            (true, false) => "compact",
            _ => "delete",
        }
    }

    /// Every implemented key with its effective value, for DescribeConfigs: (key, value, set on the topic).
    pub fn describe(&self) -> Vec<(&'static str, String, bool)> {
        let log = &self.log;
        let (flush_messages, flush_ms) = match log.flush {
            FlushPolicy::Always => (None, None),
            FlushPolicy::Interval { messages, ms } => (Some(messages), Some(ms)),
        };
        let compaction = self.compaction;
        let or_max =
            |v: Option<u64>| v.filter(|v| *v < i64::MAX as u64).map_or(i64::MAX.to_string(), |v| v.to_string());
        TOPIC_SETTINGS
            .iter()
            .map(|setting| {
                let key = setting.key;
                let value = match key {
                    "retention.ms" => log.retention_ms.map_or("-1".to_string(), |v| v.to_string()),
                    "retention.bytes" => log.retention_bytes.map_or("-1".to_string(), |v| v.to_string()),
                    "segment.bytes" => log.segment_bytes.to_string(),
                    "segment.ms" => log.segment_ms.to_string(),
                    "max.message.bytes" => log.max_message_bytes.to_string(),
                    "compression.type" => self.compression.as_str().to_string(),
                    "flush.messages" => or_max(flush_messages),
                    "flush.ms" => or_max(flush_ms),
                    "min.insync.replicas" => self.min_insync_replicas.to_string(),
                    "unclean.leader.election.enable" => self.unclean_leader_election.to_string(),
                    "cleanup.policy" => self.cleanup_policy().to_string(),
                    "delete.retention.ms" => compaction.delete_retention_ms.to_string(),
                    "min.cleanable.dirty.ratio" => {
                        (compaction.min_cleanable_dirty_ratio_ppm as f64 / 1_000_000.0).to_string()
                    }
                    "min.compaction.lag.ms" => compaction.min_compaction_lag_ms.to_string(),
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
        TopicDefaults { log: LogConfig::default(), min_insync_replicas: 1, compression: Compression::Producer }
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
        assert_eq!(described.len(), TOPIC_SETTINGS.len());
        assert!(described.contains(&("compression.type", "producer".to_string(), false)));
        assert!(described.contains(&("segment.bytes", "1048576".to_string(), true)));
        assert!(described.contains(&("segment.ms", "604800000".to_string(), false)));
        assert!(described.contains(&("flush.ms", i64::MAX.to_string(), false)));
    }

    #[test]
    fn every_topic_setting_changes_the_topic_config_when_set() {
        let base = TopicConfig::resolve(&defaults(), &BTreeMap::new()).unwrap();
        let effect = |c: &TopicConfig| TopicConfig { overrides: BTreeMap::new(), ..c.clone() };
        for setting in TOPIC_SETTINGS {
            let c = TopicConfig::resolve(&defaults(), &set(&[(setting.key, setting.example)]))
                .unwrap_or_else(|e| panic!("{}={}: {e}", setting.key, setting.example));
            assert_ne!(effect(&c), effect(&base), "{}={} changes nothing", setting.key, setting.example);
            assert!(c.describe().contains(&(setting.key, setting.example.to_string(), true)), "{}", setting.key);
        }
    }

    #[test]
    fn cleanup_policy_is_a_list_and_compact_alone_keeps_everything_by_age_and_size() {
        let with =
            |v: &str| TopicConfig::resolve(&defaults(), &set(&[("cleanup.policy", v), ("retention.bytes", "1000")]));
        let compact = with("compact").unwrap();
        assert!(compact.log.compaction.is_some());
        assert_eq!((compact.log.retention_ms, compact.log.retention_bytes), (None, None));
        assert_eq!(compact.cleanup_policy(), "compact");
        for both in ["compact,delete", "delete, compact"] {
            let c = with(both).unwrap();
            assert!(c.log.compaction.is_some(), "{both}");
            assert_eq!(c.log.retention_bytes, Some(1000), "{both}");
            assert_eq!(c.cleanup_policy(), "compact,delete");
        }
        let delete = with("delete").unwrap();
        assert_eq!((delete.log.compaction, delete.cleanup_policy()), (None, "delete"));
        let ratio = TopicConfig::resolve(
            &defaults(),
            &set(&[("cleanup.policy", "compact"), ("min.cleanable.dirty.ratio", "0.01")]),
        )
        .unwrap();
        assert_eq!(ratio.log.compaction.unwrap().min_cleanable_dirty_ratio_ppm, 10_000);
        assert!(ratio.describe().contains(&("min.cleanable.dirty.ratio", "0.01".to_string(), true)));
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
            ("compression.type", "brotli"),
            ("cleanup.policy", "compact,forever"),
            ("min.cleanable.dirty.ratio", "1.5"),
            ("delete.retention.ms", "-1"),
        ] {
            match TopicConfig::resolve(&defaults(), &set(&[(key, value)])) {
                Err(TopicConfigError::Invalid { key: k, .. }) => assert_eq!(k, key),
                other => panic!("{key}={value}: {other:?}"),
            }
        }
    }
}
