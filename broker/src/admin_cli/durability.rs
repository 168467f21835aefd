//! A topic's durability as `topic describe` shows it beside Kafka's values: shardlog's default, where
//! every acknowledged batch is fdatasync'ed before the answer, or Kafka's interval flush. Kafka's own
//! values cannot tell them apart: `flush.messages` and `flush.ms` read 9223372036854775807 ("never") both
//! for a topic that syncs every batch and for one that never syncs. Where the values come from does: the
//! broker lists, for each, the topic's own setting and the broker setting beneath it, and a broker setting
//! left unset (no value) means the default.

use std::collections::BTreeMap;

use crate::client::Synonym;

/// The keys whose sources decide the durability.
pub const FLUSH_KEYS: [&str; 2] = ["flush.messages", "flush.ms"];

/// When an acknowledged batch reaches the disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// fdatasync'ed before the answer (shardlog's default: neither flush setting set anywhere).
    Always,
    /// Kafka's interval flush: acknowledged once written, fdatasync'ed after `messages` messages or `ms`
    /// milliseconds (`None`: never by that measure).
    Interval { messages: Option<u64>, ms: Option<u64> },
}

impl Durability {
    /// From the synonyms of [`FLUSH_KEYS`]; `None` when the broker does not list them.
    pub fn from_synonyms(synonyms: &BTreeMap<String, Vec<Synonym>>) -> Option<Durability> {
        let [messages, ms] = FLUSH_KEYS.map(|key| synonyms.get(key).and_then(|s| s.first()).map(|s| s.value.clone()));
        let (messages, ms) = (messages?, ms?);
        if messages.is_none() && ms.is_none() {
            return Some(Durability::Always);
        }
        // Kafka's "never" is i64::MAX (anything that large is never reached either).
        let interval =
            |v: Option<String>| v.and_then(|v| v.trim().parse::<u64>().ok()).filter(|v| *v < i64::MAX as u64);
        Some(Durability::Interval { messages: interval(messages), ms: interval(ms) })
    }
}

impl std::fmt::Display for Durability {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Durability::Always => write!(f, "always (each acknowledged batch is fdatasync'ed before the answer)"),
            Durability::Interval { messages, ms } => {
                write!(f, "interval (acknowledged once written; ")?;
                match (messages, ms) {
                    (Some(m), Some(t)) => write!(f, "fdatasync'ed every {m} messages or {t} ms)"),
                    (Some(m), None) => write!(f, "fdatasync'ed every {m} messages)"),
                    (None, Some(t)) => write!(f, "fdatasync'ed every {t} ms)"),
                    (None, None) => write!(f, "never fdatasync'ed by the interval)"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sources(
        messages: &[(&str, Option<&str>, i8)],
        ms: &[(&str, Option<&str>, i8)],
    ) -> BTreeMap<String, Vec<Synonym>> {
        let list = |s: &[(&str, Option<&str>, i8)]| {
            s.iter()
                .map(|(name, value, source)| Synonym {
                    name: name.to_string(),
                    value: value.map(str::to_string),
                    source: *source,
                })
                .collect()
        };
        BTreeMap::from([("flush.messages".into(), list(messages)), ("flush.ms".into(), list(ms))])
    }

    const NEVER: &str = "9223372036854775807";

    #[test]
    fn unset_everywhere_is_always_and_any_value_is_the_interval() {
        let unset_messages = [("log.flush.interval.messages", None, 5)];
        let unset_ms = [("log.flush.interval.ms", None, 5)];
        assert_eq!(Durability::from_synonyms(&sources(&unset_messages, &unset_ms)), Some(Durability::Always));
        // The topic's own flush.messages over an unset broker setting.
        let topic = [("flush.messages", Some("1000"), 1), ("log.flush.interval.messages", None, 5)];
        let d = Durability::from_synonyms(&sources(&topic, &unset_ms)).unwrap();
        assert_eq!(d, Durability::Interval { messages: Some(1000), ms: None });
        assert_eq!(d.to_string(), "interval (acknowledged once written; fdatasync'ed every 1000 messages)");
        // Set "never" on the topic: no sync by the interval, not "always".
        let never_messages = [("flush.messages", Some(NEVER), 1)];
        let never_ms = [("flush.ms", Some(NEVER), 1)];
        let d = Durability::from_synonyms(&sources(&never_messages, &never_ms)).unwrap();
        assert_eq!(d, Durability::Interval { messages: None, ms: None });
        // A broker-wide setting, and Kafka's defaults (a value, not unset).
        let broker = [("log.flush.interval.ms", Some("500"), 4)];
        let d = Durability::from_synonyms(&sources(&unset_messages, &broker)).unwrap();
        assert_eq!(d, Durability::Interval { messages: None, ms: Some(500) });
        let kafka_messages = [("log.flush.interval.messages", Some(NEVER), 5)];
        let kafka_ms = [("log.flush.interval.ms", Some(NEVER), 5)];
        assert_ne!(Durability::from_synonyms(&sources(&kafka_messages, &kafka_ms)), Some(Durability::Always));
        // A broker that lists no sources: unknown.
        assert_eq!(Durability::from_synonyms(&sources(&[], &[])), None);
    }
}
