//! The broker's client quota budgets, shared by every shard: a client whose connections land on several
//! shards has one budget per quota here, as in a Kafka broker. The quota table is rebuilt the first time
//! a request meets an image whose quotas changed (`SecurityState::quotas_version`), as the authorizer is.
//!
//! With no client quota in the metadata a request costs one atomic load: no lock and no lookup.
//!
//! Connection creation rates (KIP-612) are kept here too: per IP, the `ip` entities'
//! `connection_creation_rate`, and for the whole broker `max.connection.creation.rate`. A listener's own
//! `listener.name.<name>.max.connection.creation.rate` is a [`ConnectionRateLimit`] its served listener
//! holds, measured with the same window.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::metadata::image::MetadataImage;
use crate::security::quotas::{Applied, Budget, QuotaKind, QuotaTable, Rate, Window};

/// How many budgets may be kept before the idle ones (whose samples have all expired, so that a new
/// rate is the same) are dropped.
const BUDGETS_BEFORE_PRUNING: usize = 1024;

/// Every budget's rate and the quota table they are measured against.
#[derive(Debug)]
pub struct Quotas {
    window: Window,
    /// Whether the image the shards serve has any quota (set as each image is applied).
    any: AtomicBool,
    /// The table as of the quotas' version (`SecurityState::quotas_version`) it was built from.
    table: Mutex<Option<(u64, Arc<QuotaTable>)>>,
    rates: Mutex<Rates>,
    /// Connections accepted per IP, for the IPs with a connection creation rate.
    ip_rates: Mutex<HashMap<IpAddr, Rate>>,
    /// `max.connection.creation.rate` and the rate of connections accepted, when it is set.
    broker_connections: Option<ConnectionRateLimit>,
}

/// A limit on connections accepted per second, and the rate of those accepted so far.
#[derive(Debug)]
pub struct ConnectionRateLimit {
    limit: f64,
    rate: Mutex<Rate>,
}

impl ConnectionRateLimit {
    pub fn new(per_second: u32) -> ConnectionRateLimit {
        ConnectionRateLimit { limit: f64::from(per_second), rate: Mutex::new(Rate::new(Instant::now())) }
    }

    /// Counts a connection accepted now: how long to wait before accepting the next one.
    fn accepted(&self, window: &Window, now: Instant) -> Duration {
        let mut rate = self.rate.lock().expect("never poisoned: nothing panics holding it");
        rate.record_and_throttle(window, 1.0, self.limit, now)
    }
}

#[derive(Debug, Default)]
struct Rates {
    by_budget: HashMap<Budget, Rate>,
    /// Budgets past which idle ones are pruned (doubled when pruning frees too little).
    prune_at: usize,
}

impl Quotas {
    /// `max_connection_creation_rate`: `None` when unbounded.
    pub fn new(window: Window, max_connection_creation_rate: Option<u32>) -> Quotas {
        Quotas {
            window,
            any: AtomicBool::new(false),
            ip_rates: Mutex::new(HashMap::new()),
            broker_connections: max_connection_creation_rate.map(ConnectionRateLimit::new),
            table: Mutex::new(None),
            rates: Mutex::new(Rates { by_budget: HashMap::new(), prune_at: BUDGETS_BEFORE_PRUNING }),
        }
    }

    /// Notes whether `image`, about to be served, has any quota.
    pub fn image_applied(&self, image: &MetadataImage) {
        self.any.store(!image.security().quotas.is_empty(), Ordering::Release);
    }

    /// False when the metadata the shards serve has no quota at all: nothing need be recorded.
    pub fn any(&self) -> bool {
        self.any.load(Ordering::Acquire)
    }

    pub fn window(&self) -> Window {
        self.window
    }

    /// The quota table for `image`'s quotas; `None` when it has none at all (the common case, answered
    /// without taking a lock).
    pub fn table(&self, image: &MetadataImage) -> Option<Arc<QuotaTable>> {
        let security = image.security();
        if security.quotas.is_empty() {
            return None;
        }
        let mut current = self.table.lock().expect("never poisoned: nothing panics holding it");
        if let Some((version, table)) = current.as_ref()
            && *version == security.quotas_version
        {
            return Some(table.clone());
        }
        let table = Arc::new(QuotaTable::new(&security.quotas));
        *current = Some((security.quotas_version, table.clone()));
        Some(table)
    }

    /// The `kind` quota that applies to `user` with `client_id`, if any.
    pub fn applied(&self, image: &MetadataImage, kind: QuotaKind, user: &str, client_id: &str) -> Option<Applied> {
        let table = self.table(image)?;
        if table.no_client_quotas() {
            return None;
        }
        table.applied(kind, user, client_id)
    }

    /// Records `value` against `applied`'s budget and returns how long its client is to be throttled.
    pub fn record(&self, applied: &Applied, value: f64) -> Duration {
        let now = Instant::now();
        let mut rates = self.rates.lock().expect("never poisoned: nothing panics holding it");
        if rates.by_budget.len() >= rates.prune_at && !rates.by_budget.contains_key(&applied.budget) {
            rates.by_budget.retain(|_, rate| !rate.is_idle(&self.window, now));
            rates.prune_at = (rates.by_budget.len() * 2).max(BUDGETS_BEFORE_PRUNING);
        }
        let rate = rates.by_budget.entry(applied.budget.clone()).or_insert_with(|| Rate::new(now));
        let throttle = rate.record_and_throttle(&self.window, value, applied.limit, now);
        // Kafka throttles a request quota for at most one sample.
        if applied.budget.kind == QuotaKind::Request { throttle.min(self.window.sample) } else { throttle }
    }

    /// Counts a connection accepted from `ip` against its `connection_creation_rate`, if it has one:
    /// how long to hold it before closing it when that takes the IP above its rate (it is then not
    /// counted, as in Kafka), else zero.
    pub fn ip_connection_throttle(&self, image: &MetadataImage, ip: IpAddr) -> Duration {
        let Some(table) = self.table(image) else { return Duration::ZERO };
        let Some(limit) = table.connection_creation_rate(&ip.to_string()) else { return Duration::ZERO };
        let now = Instant::now();
        let mut rates = self.ip_rates.lock().expect("never poisoned: nothing panics holding it");
        if rates.len() >= BUDGETS_BEFORE_PRUNING && !rates.contains_key(&ip) {
            rates.retain(|_, rate| !rate.is_idle(&self.window, now));
        }
        let rate = rates.entry(ip).or_insert_with(|| Rate::new(now));
        let throttle = rate.record_and_throttle(&self.window, 1.0, limit, now);
        if !throttle.is_zero() {
            rate.record(&self.window, -1.0, now);
        }
        throttle
    }

    /// Counts a connection accepted against `max.connection.creation.rate`: how long the listener is to
    /// wait before it accepts the next one (zero when the rate is within the limit or unbounded).
    pub fn broker_connection_throttle(&self) -> Duration {
        let Some(limit) = &self.broker_connections else { return Duration::ZERO };
        limit.accepted(&self.window, Instant::now())
    }

    /// Counts a connection accepted against a listener's own `max.connection.creation.rate`, as
    /// [`Quotas::broker_connection_throttle`] does against the broker's.
    pub fn listener_connection_throttle(&self, limit: &ConnectionRateLimit) -> Duration {
        limit.accepted(&self.window, Instant::now())
    }

    /// Takes back `value` recorded against `applied`'s budget (an answer that was not sent after all).
    pub fn unrecord(&self, applied: &Applied, value: f64) {
        let mut rates = self.rates.lock().expect("never poisoned: nothing panics holding it");
        if let Some(rate) = rates.by_budget.get_mut(&applied.budget) {
            rate.record(&self.window, -value, Instant::now());
        }
    }
}
