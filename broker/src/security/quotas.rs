//! Client quotas as Kafka enforces them, as pure code: which quota applies to a client, and how long to
//! throttle it. The connection runtime (`crate::runtime::connection`) records what each request costs and
//! mutes the connection for the throttle time; `crate::context::Quotas` holds the shared state.
//!
//! **Which quota** (KIP-55, Kafka's `ClientQuotaManager`): for each quota key on its own, the most
//! specific entity that sets it wins, in this order:
//!
//! 1. `/users/<user>/clients/<client-id>`
//! 2. `/users/<user>/clients/<default>`
//! 3. `/users/<user>`
//! 4. `/users/<default>/clients/<client-id>`
//! 5. `/users/<default>/clients/<default>`
//! 6. `/users/<default>`
//! 7. `/clients/<client-id>`
//! 8. `/clients/<default>`
//!
//! A default entity is not one budget shared by everyone it covers: each user (and client id, where the
//! entity names both types) it covers gets a budget of its own of that size, as in Kafka. The budget is
//! named by [`Budget`]: the user and client id of the request, kept only where the matching entity names
//! that type.
//!
//! **How long to throttle** (KIP-13, KIP-219): every budget has a [`Rate`], Kafka's sampled rate:
//! `quota.window.num` samples of `quota.window.size.seconds` each. The rate is the sum of the samples
//! divided by the time they span, counted as at least `quota.window.num - 1` whole samples, so a client's
//! first burst may reach `(quota.window.num - 1) * quota.window.size.seconds` seconds' worth of its quota.
//! A request that takes the rate `O` above the quota `T` is throttled for `(O - T) / T * W`, `W` being
//! that span: the time after which the rate is back at the quota if nothing more is recorded.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::quorum::security::{
    CONNECTION_CREATION_RATE, CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, QUOTA_CLIENT_ID, QUOTA_IP, QUOTA_USER,
    QuotaEntity, REQUEST_PERCENTAGE,
};

/// The quotas a request can use up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QuotaKind {
    /// `producer_byte_rate`: bytes of Produce requests per second.
    Produce,
    /// `consumer_byte_rate`: bytes of Fetch answers per second.
    Fetch,
    /// `request_percentage`: percent of one shard thread's time.
    Request,
}

impl QuotaKind {
    /// Kafka's quota key.
    pub fn key(self) -> &'static str {
        match self {
            QuotaKind::Produce => PRODUCER_BYTE_RATE,
            QuotaKind::Fetch => CONSUMER_BYTE_RATE,
            QuotaKind::Request => REQUEST_PERCENTAGE,
        }
    }

    /// Its name in metrics labels (Kafka's quota type names).
    pub fn label(self) -> &'static str {
        match self {
            QuotaKind::Produce => "produce",
            QuotaKind::Fetch => "fetch",
            QuotaKind::Request => "request",
        }
    }
}

/// One type's part of an entity: the default entity of that type, or a named one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Part {
    Default,
    Named(String),
}

/// An entity with a user part, a client id part or both (`None`: the entity does not name that type).
type Key = (Option<Part>, Option<Part>);

/// Whose budget a request uses: its user where the quota's entity names users, its client id where it
/// names client ids (Kafka's quota metric tags).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Budget {
    pub kind: QuotaKind,
    pub user: Option<String>,
    pub client_id: Option<String>,
}

/// The quota that applies to a request and the budget it uses.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub budget: Budget,
    /// Bytes per second, or percent for [`QuotaKind::Request`].
    pub limit: f64,
}

/// Every client quota of the metadata, indexed for [`QuotaTable::applied`].
#[derive(Debug, Default)]
pub struct QuotaTable {
    /// User and client id entities: their keys and values.
    clients: BTreeMap<Key, BTreeMap<String, f64>>,
    /// `connection_creation_rate` by IP entity (`Part::Default`: the default IP).
    ips: BTreeMap<Part, f64>,
}

impl QuotaTable {
    /// Indexes the quotas as the quorum holds them. The quorum let in only valid entities; one this build
    /// cannot read (an unknown type) is skipped.
    pub fn new(quotas: &BTreeMap<QuotaEntity, BTreeMap<String, f64>>) -> QuotaTable {
        let mut table = QuotaTable::default();
        let part = |name: &Option<String>| name.clone().map_or(Part::Default, Part::Named);
        'entities: for (entity, values) in quotas {
            let (mut user, mut client_id) = (None, None);
            for (kind, name) in entity {
                match kind.as_str() {
                    QUOTA_USER => user = Some(part(name)),
                    QUOTA_CLIENT_ID => client_id = Some(part(name)),
                    QUOTA_IP => {
                        if let Some(rate) = values.get(CONNECTION_CREATION_RATE) {
                            table.ips.insert(part(name), *rate);
                        }
                        continue 'entities;
                    }
                    _ => continue 'entities,
                }
            }
            table.clients.insert((user, client_id), values.clone());
        }
        table
    }

    /// Whether no quota limits requests (there may still be connection creation rates).
    pub fn no_client_quotas(&self) -> bool {
        self.clients.is_empty()
    }

    /// The `kind` quota that applies to requests of `user` (the principal's name) with `client_id`, if
    /// any: the most specific entity that sets it (see the module documentation).
    pub fn applied(&self, kind: QuotaKind, user: &str, client_id: &str) -> Option<Applied> {
        let named_user = || Some(Part::Named(user.to_string()));
        let named_client = || Some(Part::Named(client_id.to_string()));
        let (by_user, by_client, by_both) = ((true, false), (false, true), (true, true));
        let candidates: [(Key, (bool, bool)); 8] = [
            ((named_user(), named_client()), by_both),
            ((named_user(), Some(Part::Default)), by_both),
            ((named_user(), None), by_user),
            ((Some(Part::Default), named_client()), by_both),
            ((Some(Part::Default), Some(Part::Default)), by_both),
            ((Some(Part::Default), None), by_user),
            ((None, named_client()), by_client),
            ((None, Some(Part::Default)), by_client),
        ];
        candidates.into_iter().find_map(|(key, (tags_user, tags_client))| {
            let limit = *self.clients.get(&key)?.get(kind.key())?;
            let budget = Budget {
                kind,
                user: tags_user.then(|| user.to_string()),
                client_id: tags_client.then(|| client_id.to_string()),
            };
            Some(Applied { budget, limit })
        })
    }

    /// The `connection_creation_rate` for connections from `ip`: its own entity's, else the default IP's.
    pub fn connection_creation_rate(&self, ip: &str) -> Option<f64> {
        self.ips.get(&Part::Named(ip.to_string())).or_else(|| self.ips.get(&Part::Default)).copied()
    }
}

/// `quota.window.num` and `quota.window.size.seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    pub samples: usize,
    pub sample: Duration,
}

impl Window {
    /// Kafka's defaults: 11 samples of a second.
    pub const KAFKA: Window = Window { samples: 11, sample: Duration::from_secs(1) };

    /// The most a budget may take at once, after a quiet spell: `samples - 1` samples' worth of `limit`
    /// (Kafka caps a Fetch answer at it, so that one answer never exceeds the quota on its own).
    pub fn most_at_once(&self, limit: f64) -> f64 {
        limit * (self.sample * (self.samples as u32 - 1)).as_secs_f64()
    }
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    start: Instant,
    value: f64,
}

/// Kafka's sampled rate (`SampledStat` with `Rate`): what was recorded in the last samples, per second.
#[derive(Debug, Clone)]
pub struct Rate {
    /// At most `Window::samples`, added as time goes by.
    samples: Vec<Sample>,
    current: usize,
}

impl Rate {
    pub fn new(now: Instant) -> Rate {
        Rate { samples: vec![Sample { start: now, value: 0.0 }], current: 0 }
    }

    /// Adds `value` to the current sample (starting a new one when the current one is a sample long).
    pub fn record(&mut self, window: &Window, value: f64, now: Instant) {
        assert!(window.samples >= 2, "a rate needs at least two samples");
        if now.saturating_duration_since(self.samples[self.current].start) >= window.sample {
            self.current = (self.current + 1) % window.samples;
            let fresh = Sample { start: now, value: 0.0 };
            if self.current == self.samples.len() {
                self.samples.push(fresh);
            } else {
                self.samples[self.current] = fresh;
            }
        }
        self.samples[self.current].value += value;
    }

    /// The rate at `now`, per second, and the time span it is measured over.
    pub fn measure(&mut self, window: &Window, now: Instant) -> (f64, Duration) {
        // Samples older than the whole window count no more.
        let expiry = window.sample * window.samples as u32;
        for sample in &mut self.samples {
            if now.saturating_duration_since(sample.start) >= expiry {
                *sample = Sample { start: now, value: 0.0 };
            }
        }
        let oldest = self.samples.iter().map(|s| s.start).min().expect("never empty");
        let span = now.saturating_duration_since(oldest);
        let whole = (span.as_nanos() / window.sample.as_nanos()) as u32;
        let least = window.samples as u32 - 1;
        let span = if whole < least { span + window.sample * (least - whole) } else { span };
        let total: f64 = self.samples.iter().map(|s| s.value).sum();
        (total / span.as_secs_f64(), span)
    }

    /// Records `value` and returns how long the client must wait for the rate to be back at `limit`
    /// (zero when it is not above it).
    pub fn record_and_throttle(&mut self, window: &Window, value: f64, limit: f64, now: Instant) -> Duration {
        self.record(window, value, now);
        let (rate, span) = self.measure(window, now);
        if rate <= limit {
            return Duration::ZERO;
        }
        // A zero quota blocks everything: throttled for the whole window.
        if limit <= 0.0 {
            return window.sample * window.samples as u32;
        }
        Duration::from_secs_f64(((rate - limit) / limit * span.as_secs_f64()).min(MAX_THROTTLE.as_secs_f64()))
    }

    /// Whether nothing recorded counts any more: such a rate is the same as a new one.
    pub fn is_idle(&self, window: &Window, now: Instant) -> bool {
        let expiry = window.sample * window.samples as u32;
        self.samples.iter().all(|s| now.saturating_duration_since(s.start) >= expiry)
    }
}

/// The longest one throttle lasts, however far above its quota a client went (a safety bound: a quota
/// set tiny by mistake must not mute connections for days; clients time out requests long before).
pub const MAX_THROTTLE: Duration = Duration::from_secs(3600);

#[cfg(test)]
mod tests {
    use super::*;

    /// An entity as `(type, name)` pairs, `None` naming the default.
    type Parts<'a> = &'a [(&'a str, Option<&'a str>)];

    fn table(entries: &[(Parts, &str, f64)]) -> QuotaTable {
        let mut quotas: BTreeMap<QuotaEntity, BTreeMap<String, f64>> = BTreeMap::new();
        for (entity, key, value) in entries {
            let entity: QuotaEntity = entity.iter().map(|(t, n)| (t.to_string(), n.map(str::to_string))).collect();
            quotas.entry(entity).or_default().insert(key.to_string(), *value);
        }
        QuotaTable::new(&quotas)
    }

    const P: &str = PRODUCER_BYTE_RATE;

    #[test]
    fn the_most_specific_entity_wins_in_kafkas_order() {
        // Every level set, each to its place in the order; removing the winner each time exposes the next.
        let levels: Vec<(Parts, f64, (bool, bool))> = vec![
            (&[("client-id", Some("app")), ("user", Some("alice"))], 1.0, (true, true)),
            (&[("client-id", None), ("user", Some("alice"))], 2.0, (true, true)),
            (&[("user", Some("alice"))], 3.0, (true, false)),
            (&[("client-id", Some("app")), ("user", None)], 4.0, (true, true)),
            (&[("client-id", None), ("user", None)], 5.0, (true, true)),
            (&[("user", None)], 6.0, (true, false)),
            (&[("client-id", Some("app"))], 7.0, (false, true)),
            (&[("client-id", None)], 8.0, (false, true)),
        ];
        for first in 0..levels.len() {
            let entries: Vec<_> = levels[first..].iter().map(|(e, v, _)| (*e, P, *v)).collect();
            let applied = table(&entries).applied(QuotaKind::Produce, "alice", "app").expect("a quota applies");
            let (_, limit, (user, client)) = levels[first];
            assert_eq!(applied.limit, limit, "with levels {}.. set", first + 1);
            assert_eq!(applied.budget.user.is_some(), user, "level {}", first + 1);
            assert_eq!(applied.budget.client_id.is_some(), client, "level {}", first + 1);
        }
    }

    #[test]
    fn each_quota_key_resolves_on_its_own() {
        let t = table(&[(&[("user", Some("alice"))], CONSUMER_BYTE_RATE, 10.0), (&[("user", None)], P, 20.0)]);
        assert_eq!(t.applied(QuotaKind::Fetch, "alice", "app").unwrap().limit, 10.0);
        assert_eq!(t.applied(QuotaKind::Produce, "alice", "app").unwrap().limit, 20.0);
        assert_eq!(t.applied(QuotaKind::Request, "alice", "app"), None);
    }

    #[test]
    fn a_default_entity_gives_each_user_a_budget_of_their_own() {
        let t = table(&[(&[("user", None)], P, 100.0)]);
        let alice = t.applied(QuotaKind::Produce, "alice", "a").unwrap().budget;
        let bob = t.applied(QuotaKind::Produce, "bob", "a").unwrap().budget;
        assert_ne!(alice, bob);
        // The client id is not part of a user-only budget: both of alice's clients share hers.
        assert_eq!(alice, t.applied(QuotaKind::Produce, "alice", "b").unwrap().budget);
    }

    #[test]
    fn other_users_and_clients_match_nothing_more_specific_than_theirs() {
        let t = table(&[(&[("client-id", Some("app")), ("user", Some("alice"))], P, 1.0)]);
        assert_eq!(t.applied(QuotaKind::Produce, "bob", "app"), None);
        assert_eq!(t.applied(QuotaKind::Produce, "alice", "other"), None);
    }

    #[test]
    fn connection_creation_rate_takes_the_ips_own_entity_before_the_default() {
        let t = table(&[
            (&[("ip", Some("10.0.0.1"))], CONNECTION_CREATION_RATE, 5.0),
            (&[("ip", None)], CONNECTION_CREATION_RATE, 50.0),
        ]);
        assert_eq!(t.connection_creation_rate("10.0.0.1"), Some(5.0));
        assert_eq!(t.connection_creation_rate("10.0.0.2"), Some(50.0));
        assert!(t.no_client_quotas());
        assert_eq!(table(&[]).connection_creation_rate("10.0.0.1"), None);
    }

    #[test]
    fn throttle_is_the_time_until_the_rate_is_back_at_the_quota() {
        let window = Window::KAFKA;
        let start = Instant::now();
        let mut rate = Rate::new(start);
        // 10 s of quota at once: exactly at the quota over the 10 s the rate counts at least.
        assert_eq!(rate.record_and_throttle(&window, 10_000.0, 1_000.0, start), Duration::ZERO);
        // 1,000 more: 11,000 over 10 s is 10% above; 1 s of quiet brings it back.
        let throttle = rate.record_and_throttle(&window, 1_000.0, 1_000.0, start);
        assert_eq!(throttle.as_millis(), 1_000);
        // Once every sample has expired the rate starts afresh.
        assert!(rate.is_idle(&window, start + Duration::from_secs(11)));
        let later = start + Duration::from_secs(11);
        assert_eq!(rate.record_and_throttle(&window, 1_000.0, 1_000.0, later), Duration::ZERO);
    }

    /// A client that sends as fast as it is let through: `request` units at a time, waiting out each
    /// throttle. Returns the units let through in `[from, to)` of the run (in seconds from its start).
    fn closed_loop(window: Window, limit: f64, request: f64, from: f64, to: f64) -> f64 {
        let start = Instant::now();
        let mut rate = Rate::new(start);
        let (mut now, mut through) = (Duration::ZERO, 0.0);
        // Each request takes a millisecond to send and answer.
        while now.as_secs_f64() < to {
            let throttle = rate.record_and_throttle(&window, request, limit, start + now);
            if now.as_secs_f64() >= from {
                through += request;
            }
            now += Duration::from_millis(1) + throttle;
        }
        through
    }

    #[test]
    fn a_client_sending_ten_times_its_quota_is_held_to_it_after_its_first_burst() {
        let limit = 1_000_000.0;
        let request = 100_000.0;
        // Over a long run the first window's burst counts for little, whatever the window.
        for window in [Window::KAFKA, Window { samples: 2, sample: Duration::from_secs(1) }] {
            let burst = window.most_at_once(limit);
            let through = closed_loop(window, limit, request, 0.0, 60.0);
            assert!(through <= limit * 60.0 + burst + request, "{window:?}: {through}");
            assert!(through >= limit * 55.0, "{window:?}: the quota is given, not starved: {through}");
        }
        // With two samples the burst is a second's worth: over 10 s the average is within 10% of the quota.
        let two = Window { samples: 2, sample: Duration::from_secs(1) };
        let through = closed_loop(two, limit, request, 0.0, 10.0);
        assert!(through / 10.0 <= 1.1 * limit, "{through}");
    }
}
