//! Broker settings: a TOML file whose keys are Kafka's broker setting names, every value overridable on
//! the command line, validated once into [`BrokerConfig`], the only form the rest of the broker reads.
//!
//! Every key, with its type, range, default, unit and meaning, is a row of [`settings::SETTINGS`]; the
//! parser reads values through that table (`shardlog config list` prints it), so a key is documented
//! exactly where it is accepted.
//!
//! Kafka's names contain dots. In TOML `log.retention.ms = 60000` is a dotted key (nested tables); the
//! file is flattened back to dotted names, so both that and `"log.retention.ms" = 60000` work. An unknown
//! key or an invalid value stops the start with a message naming the key.
//!
//! Memory per shard is bounded by `shard.cache.max.bytes` for cached recent data, plus
//! `shard.fetch.readahead.bytes` for reads made ahead for consumers catching up, plus appended data
//! waiting for its write-out (at most 16 MiB per partition; under the default flush policy it is written
//! within 100 ms) and one aligned I/O buffer copy of it while it is written, plus the segment indexes
//! (about 0.5% of the data stored), plus per connection at most 32 requests / 64 MiB in flight. An idle
//! partition keeps less than one 4 KiB block of its data in memory and no open file.

pub mod listeners;
pub mod principal;
pub mod settings;

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use shardlog_storage::{FlushPolicy, LogConfig};

use self::settings::{Default, Kind, SETTINGS, UNSUPPORTED, setting};
use crate::topics::configs::Compression;

/// Why the settings cannot be used. The message names the key or file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("read config file {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("config file {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("unknown setting `{key}` (`shardlog config list` shows every setting)")]
    UnknownKey { key: String },
    #[error("setting `{key}` is not supported: {reason}")]
    Unsupported { key: String, reason: String },
    #[error("invalid value for `{key}`: {reason}")]
    Invalid { key: String, reason: String },
    #[error("override `{0}` is not KEY=VALUE")]
    BadOverride(String),
}

/// A quorum voter: `ID@HOST:PORT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Voter {
    pub id: u32,
    pub host: String,
    pub port: u16,
}

/// A `HOST:PORT` endpoint as configured (the host is kept as written, for advertising).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    pub host: String,
    pub port: u16,
}

impl Endpoint {
    /// Resolves the endpoint for binding.
    pub fn socket_addr(&self) -> std::io::Result<SocketAddr> {
        (self.host.as_str(), self.port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, format!("{} does not resolve", self.host)))
    }
}

impl std::fmt::Display for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// A setting's value as the broker runs with it, for DescribeConfigs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EffectiveSetting {
    pub key: &'static str,
    /// `None` when the setting is unset and has no value (the interval flush keys).
    pub value: Option<String>,
    /// Set in the file or on the command line, rather than left at its default.
    pub explicit: bool,
}

/// Validated broker settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerConfig {
    pub node_id: u32,
    pub data_dir: PathBuf,
    /// Every Kafka listener (`listeners`, `advertised.listeners`, `listener.security.protocol.map`).
    pub listeners: listeners::Listeners,
    /// The inter-broker listener's address (`inter.broker.listener.name`, else the first listener).
    pub listener: Endpoint,
    /// The inter-broker listener's advertised address: what this broker registers for its peers.
    pub advertised_listener: Endpoint,
    /// The base `ssl.*` settings as given (each TLS listener's, where it does not override them).
    pub ssl: BTreeMap<&'static str, String>,
    /// SASL authentication on the SASL listeners.
    pub sasl: SaslConfig,
    /// ACL authorization (`authorizer.class.name`, `super.users`, `allow.everyone.if.no.acl.found`).
    pub authorization: AuthorizationConfig,
    /// Mutual TLS among brokers and voters (`cluster.ssl.*`).
    pub cluster_tls: ClusterTlsSettings,
    /// `metrics.listen`: the Prometheus endpoint (port 0: any free port, logged at start).
    pub metrics_listen: Endpoint,
    pub shards: usize,
    /// Empty: the broker is its own one-voter quorum, reachable only from its own process.
    pub quorum_voters: Vec<Voter>,
    pub broker_session_timeout_ms: u64,
    pub broker_heartbeat_interval_ms: u64,
    pub auto_create_topics: bool,
    /// `auto.leader.rebalance.enable` with its interval and threshold; `None` when off.
    pub leader_rebalance: Option<crate::quorum::service::LeaderRebalance>,
    pub num_partitions: u32,
    pub default_replication_factor: u16,
    pub socket_request_max_bytes: usize,
    /// What clients may make the broker hold.
    pub clients: ClientLimits,
    /// `quota.window.num` and `quota.window.size.seconds`: how client quotas' rates are measured.
    pub quota_window: crate::security::quotas::Window,
    /// `log.dir.min.free.bytes`: below this much free space on the data dir's disk, produce is refused.
    pub log_dir_min_free_bytes: u64,
    pub min_insync_replicas: u16,
    /// `replica.lag.time.max.ms`: a follower not caught up for this long leaves the ISR.
    pub replica_lag_time_max_ms: u64,
    /// `test.acks.all.before.replication`: acks=all broken on purpose, for fault campaigns' own tests.
    pub test_acks_all_before_replication: bool,
    /// `test.stall.shard`: a shard whose thread blocks for good a second after it serves (the watchdog's
    /// test).
    pub test_stall_shard: Option<usize>,
    /// Default `compression.type` of topics.
    pub compression: Compression,
    /// Defaults for each topic's log settings.
    pub log: LogConfig,
    /// What each shard may hold for its partitions.
    pub shard_limits: ShardLimits,
    /// Consumer groups and their offsets topic.
    pub groups: GroupConfig,
    /// The transaction coordinator's topic.
    pub transaction_log: TransactionLogConfig,
    /// The transaction coordinator.
    pub transactions: TransactionConfig,
    /// Every row of [`settings::SETTINGS`] with the value in force, in the table's order.
    pub effective: Vec<EffectiveSetting>,
    /// `shardlog start --add-scram` (a flag, not a setting: it acts only when the cluster forms), salted.
    pub bootstrap_scram: Vec<crate::quorum::security::ScramUpsertion>,
}

/// The two files of cluster mTLS (`crate::security::cluster_tls`), as configured: both set turns it on
/// for replication and the quorum port; one alone is refused when the node starts.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterTlsSettings {
    /// `cluster.ssl.keystore.location`: this node's key and certificate chain, PEM.
    pub keystore: Option<PathBuf>,
    /// `cluster.ssl.truststore.location`: the cluster's authority (or authorities), PEM.
    pub truststore: Option<PathBuf>,
}

/// Kafka's only authorizer, the one `authorizer.class.name` may name.
pub const STANDARD_AUTHORIZER: &str = "org.apache.kafka.metadata.authorizer.StandardAuthorizer";

/// ACL authorization (Kafka's settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorizationConfig {
    /// `authorizer.class.name` is the StandardAuthorizer: every request is checked against the ACLs.
    pub enabled: bool,
    /// `super.users`: principals (`User:admin`) allowed everything.
    pub super_users: Vec<String>,
    /// `allow.everyone.if.no.acl.found`
    pub allow_everyone_if_no_acl_found: bool,
}

/// SASL authentication (Kafka's settings).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaslConfig {
    /// `sasl.enabled.mechanisms` (each SASL listener's, where it does not override it).
    pub enabled_mechanisms: Vec<String>,
    /// `sasl.server.max.receive.size`: the largest frame before authentication.
    pub max_receive_bytes: usize,
    /// `connection.failed.authentication.delay.ms`
    pub failed_authentication_delay_ms: u64,
    /// `connections.max.reauth.ms`; 0: sessions do not expire.
    pub max_reauth_ms: u64,
    /// The `sasl.oauthbearer.*` settings.
    pub oauthbearer: OAuthBearerConfig,
}

/// How OAUTHBEARER tokens are checked (Kafka's `sasl.oauthbearer.*` names).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthBearerConfig {
    /// Required when a listener enables OAUTHBEARER.
    pub jwks_endpoint_url: Option<String>,
    pub expected_issuer: Option<String>,
    pub expected_audience: Vec<String>,
    pub sub_claim_name: String,
    pub clock_skew_seconds: u64,
}

/// Bounds on what clients of the Kafka listener may make the broker hold (Kafka's settings; the quorum
/// port has its own, fixed limits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientLimits {
    /// `queued.max.request.bytes`: request bytes being read or waiting for their answer, all
    /// connections together; never below `socket.request.max.bytes`.
    pub queued_max_request_bytes: usize,
    /// `socket.request.timeout.ms`: how long a frame may take to arrive once its first byte has.
    pub socket_request_timeout_ms: u64,
    /// `log.slow.request.ms`: requests answered later are logged.
    pub slow_request_ms: u64,
    /// `connections.max.idle.ms`: how long a connection may sit with nothing in hand and nothing moving.
    pub connections_max_idle_ms: u64,
    /// `max.connections`: open client connections, all addresses together.
    pub max_connections: usize,
    /// `max.connections.per.ip`: open client connections from one address.
    pub max_connections_per_ip: usize,
    /// `max.connection.creation.rate`: connections accepted per second, all listeners together; `None`:
    /// unbounded (Kafka's default, the largest int).
    pub max_connection_creation_rate: Option<u32>,
}

/// Consumer groups: the offsets topic and the group coordinator's bounds and timings (Kafka's settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupConfig {
    /// `offsets.topic.num.partitions`
    pub offsets_partitions: u32,
    /// `offsets.topic.replication.factor`: at most the live brokers when the topic is created.
    pub offsets_replication_factor: u16,
    /// `offsets.topic.segment.bytes`
    pub offsets_segment_bytes: u32,
    /// `offsets.commit.timeout.ms`: the acks=all timeout of the coordinator's writes.
    pub commit_timeout_ms: i32,
    /// `offset.metadata.max.bytes`
    pub offset_metadata_max_bytes: usize,
    /// `offsets.retention.minutes`, in ms: how long a group without members keeps its offsets.
    pub offsets_retention_ms: u64,
    /// `offsets.retention.check.interval.ms`
    pub retention_check_interval_ms: u64,
    /// Session bounds, the initial rebalance delay and `group.max.size`.
    pub settings: crate::group::classic::GroupSettings,
    /// The consumer protocol's (KIP-848) session, heartbeat interval, group size and assignors.
    pub consumer: crate::group::consumer::ConsumerGroupSettings,
}

/// `__transaction_state`, the transaction coordinator's topic (Kafka's settings). It is created when the
/// first producer asks for its transaction coordinator, with the replication factor and min ISR the live
/// brokers allow then; its partition count is fixed from then on (an id's partition depends on it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransactionLogConfig {
    /// `transaction.state.log.num.partitions`
    pub partitions: u32,
    /// `transaction.state.log.replication.factor`: at most the live brokers when the topic is created.
    pub replication_factor: u16,
    /// `transaction.state.log.min.isr`: the topic's `min.insync.replicas`, at most its replication factor.
    pub min_isr: u16,
    /// `transaction.state.log.segment.bytes`
    pub segment_bytes: u32,
}

/// The transaction coordinator's bounds and timings (Kafka's settings).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransactionConfig {
    /// `transaction.max.timeout.ms` and `transactional.id.expiration.ms`.
    pub settings: crate::txn::TxnSettings,
    /// `transaction.abort.timed.out.transaction.cleanup.interval.ms`
    pub abort_timed_out_interval_ms: u64,
    /// The acks=all timeout of the coordinator's writes to `__transaction_state` (Kafka uses the
    /// broker's `request.timeout.ms`, 30 s).
    pub write_timeout_ms: i32,
}

/// Per-shard bounds on what partitions hold, and how a shard waits for work (shardlog settings; Kafka has
/// no equivalent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardLimits {
    /// `shard.producer.ids.max`: idempotent producer ids a shard's partitions remember together; past it a
    /// new producer id's batches are stored but not deduplicated (as if it had expired).
    pub producer_ids_max: usize,
    /// `shard.open.files.max`: segment files a shard keeps open; the least recently used are closed
    /// beyond it and reopened on demand.
    pub open_files_max: usize,
    /// `shard.cache.max.bytes`: memory a shard's partitions may hold in their tail caches; beyond it the
    /// least recently used partitions release theirs.
    pub cache_max_bytes: usize,
    /// `shard.fetch.readahead.bytes`: memory a shard may hold in reads made ahead for consumers catching
    /// up (see `shard::readahead`); 0 turns read-ahead off.
    pub fetch_readahead_bytes: usize,
    /// `shard.cache.idle.ms`: a partition neither written nor read for this long releases its cache and
    /// closes its files.
    pub cache_idle_ms: i64,
    /// `shard.idle.poll.us`: when a shard runs out of work it keeps polling its rings this long before it
    /// sleeps. Waking a sleeping thread on another core costs tens of microseconds on virtual machines,
    /// once per request and once per hop between shards; polling saves that for requests that arrive
    /// meanwhile, at the price of a busy core. Default 0 (sleep at once), which suits hosts shared with
    /// other work; 50-200 lowers the latency of one-at-a-time requests on dedicated hosts. Only shards
    /// pinned to their own core poll.
    pub idle_poll_us: u64,
    /// `log.cleaner.backoff.ms` and `log.cleaner.dedupe.buffer.size` (Kafka's; the buffer is per shard).
    pub cleaner: crate::compaction::CleanerSettings,
}

/// Everything that goes into the settings, in increasing precedence: the file, then command-line
/// overrides (`KEY=VALUE`, Kafka names; the dedicated flags are turned into these).
#[derive(Debug, Clone, std::default::Default)]
pub struct Sources {
    pub file: Option<PathBuf>,
    pub overrides: Vec<String>,
}

impl BrokerConfig {
    /// Reads, merges and validates the settings.
    pub fn load(sources: &Sources) -> Result<BrokerConfig, ConfigError> {
        let mut flat = BTreeMap::new();
        if let Some(path) = &sources.file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ConfigError::Read { path: path.clone(), reason: e.to_string() })?;
            let table: toml::Table =
                toml::from_str(&text).map_err(|e| ConfigError::Parse { path: path.clone(), reason: e.to_string() })?;
            flatten("", table, &mut flat);
        }
        for item in &sources.overrides {
            let (key, value) = parse_override(item)?;
            flat.insert(key, value);
        }
        Reader::new(flat)?.config()
    }

    /// Parses settings from TOML text (for tests and tools).
    pub fn from_toml(text: &str) -> Result<BrokerConfig, ConfigError> {
        let table: toml::Table = toml::from_str(text)
            .map_err(|e| ConfigError::Parse { path: Path::new("<text>").into(), reason: e.to_string() })?;
        let mut flat = BTreeMap::new();
        flatten("", table, &mut flat);
        Reader::new(flat)?.config()
    }
}

fn flatten(prefix: &str, table: toml::Table, out: &mut BTreeMap<String, toml::Value>) {
    for (key, value) in table {
        let name = if prefix.is_empty() { key } else { format!("{prefix}.{key}") };
        match value {
            toml::Value::Table(inner) => flatten(&name, inner, out),
            other => {
                out.insert(name, other);
            }
        }
    }
}

/// `KEY=VALUE`: the value as TOML if it parses as a TOML value, else as a plain string.
fn parse_override(item: &str) -> Result<(String, toml::Value), ConfigError> {
    let (key, raw) = item.split_once('=').ok_or_else(|| ConfigError::BadOverride(item.to_string()))?;
    let key = key.trim();
    if key.is_empty() {
        return Err(ConfigError::BadOverride(item.to_string()));
    }
    let value = toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.to_string()));
    Ok((key.to_string(), value))
}

fn invalid(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key: key.to_string(), reason: reason.into() }
}

fn endpoint(key: &str, text: &str) -> Result<Endpoint, ConfigError> {
    listeners::bare_endpoint(key, text)
}

/// Parses `ID@HOST:PORT,...` (1, 3 or 5 distinct ids); errors name `key`.
pub fn voters(key: &str, text: &str) -> Result<Vec<Voter>, ConfigError> {
    let mut out: Vec<Voter> = Vec::new();
    for item in text.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (id, addr) = item.split_once('@').ok_or_else(|| invalid(key, format!("{item:?} is not ID@HOST:PORT")))?;
        let id: u32 = id.parse().map_err(|_| invalid(key, format!("{item:?}: id is not a number")))?;
        let ep = endpoint(key, addr)?;
        if out.iter().any(|v| v.id == id) {
            return Err(invalid(key, format!("voter id {id} appears twice")));
        }
        out.push(Voter { id, host: ep.host, port: ep.port });
    }
    if ![1, 3, 5].contains(&out.len()) {
        return Err(invalid(key, format!("{} voters given; a quorum has 1, 3 or 5", out.len())));
    }
    Ok(out)
}

/// Reads values through the settings table: the given value, else the table's default, range-checked,
/// and records what each key ends up as.
struct Reader {
    given: BTreeMap<String, toml::Value>,
    effective: BTreeMap<&'static str, EffectiveSetting>,
    /// Listener settings outside the table: `inter.broker.listener.name`, `ssl.keystore.type`,
    /// `ssl.truststore.type` (PEM is the only value) and `listener.name.<name>.<setting>`.
    listener_extras: listeners::ListenerInputs,
}

/// Listener settings Kafka has that are not rows of the table: `listener.name.<name>.<setting>` repeats a
/// row per listener; these three take a name or the one value there is, so they have no example that
/// would change anything on its own.
const LISTENER_EXTRAS: [&str; 3] = ["inter.broker.listener.name", "ssl.keystore.type", "ssl.truststore.type"];

impl Reader {
    /// Refuses unknown and unsupported keys, and values of the wrong type, by name.
    fn new(mut given: BTreeMap<String, toml::Value>) -> Result<Reader, ConfigError> {
        let mut listener_extras = listeners::ListenerInputs::default();
        let extras: Vec<String> = given
            .keys()
            .filter(|k| LISTENER_EXTRAS.contains(&k.as_str()) || k.starts_with("listener.name."))
            .cloned()
            .collect();
        for key in extras {
            let value = given.remove(&key).expect("listed above");
            // Per-listener numbers (`listener.name.<name>.max.connection.creation.rate`) may be TOML integers.
            let text = match &value {
                toml::Value::String(text) => text.clone(),
                toml::Value::Integer(n) if key.starts_with("listener.name.") => n.to_string(),
                _ => return Err(invalid(&key, format!("{value} is not a string"))),
            };
            match key.strip_prefix("listener.name.") {
                Some(rest) => {
                    let (name, setting) = rest
                        .split_once('.')
                        .filter(|(_, setting)| listeners::PER_LISTENER.contains(setting))
                        .ok_or_else(|| ConfigError::UnknownKey { key: key.clone() })?;
                    let key = (name.to_ascii_uppercase(), setting.to_string());
                    listener_extras.overrides.insert(key, text);
                }
                None if key == "inter.broker.listener.name" => listener_extras.inter_broker = Some(text),
                None => {
                    let key = LISTENER_EXTRAS.into_iter().find(|k| *k == key).expect("one of them");
                    listener_extras.ssl.insert(key, text);
                }
            }
        }
        let mut lists = Vec::new();
        for (key, value) in &given {
            if let Some((_, reason)) = UNSUPPORTED.iter().find(|(k, _)| k == key) {
                return Err(ConfigError::Unsupported { key: key.clone(), reason: reason.to_string() });
            }
            let row = setting(key).ok_or_else(|| ConfigError::UnknownKey { key: key.clone() })?;
            if row.kind == Kind::List
                && let toml::Value::Array(items) = value
            {
                // Kafka's list settings are comma-separated strings; TOML arrays of strings are the same.
                let items: Option<Vec<&str>> = items.iter().map(toml::Value::as_str).collect();
                let items = items.ok_or_else(|| invalid(key, "not every item of the list is a string"))?;
                lists.push((key.clone(), items.join(",")));
                continue;
            }
            let fits = matches!(
                (row.kind, value),
                (Kind::Int { .. }, toml::Value::Integer(_))
                    | (Kind::Bool, toml::Value::Boolean(_))
                    | (Kind::Text | Kind::List, toml::Value::String(_))
            );
            if !fits {
                let wanted = match row.kind {
                    Kind::Int { .. } => "an integer",
                    Kind::Bool => "true or false",
                    Kind::Text => "a string",
                    Kind::List => "a string or an array of strings",
                };
                return Err(invalid(key, format!("{value} is not {wanted}")));
            }
        }
        for (key, joined) in lists {
            given.insert(key, toml::Value::String(joined));
        }
        Ok(Reader { given, effective: BTreeMap::new(), listener_extras })
    }

    fn record(&mut self, key: &'static str, value: Option<String>) {
        let explicit = self.given.contains_key(key);
        self.effective.insert(key, EffectiveSetting { key, value, explicit });
    }

    /// The given value, else the default (`None` for a derived default); the caller records derived ones.
    fn value(&self, key: &'static str) -> Option<toml::Value> {
        let row = setting(key).unwrap_or_else(|| panic!("`{key}` is not in the settings table"));
        if let Some(v) = self.given.get(key) {
            return Some(v.clone());
        }
        match row.default {
            Default::Value(text) => Some(match row.kind {
                Kind::Int { .. } => toml::Value::Integer(text.parse().expect("the table's defaults parse")),
                Kind::Bool => toml::Value::Boolean(text.parse().expect("the table's defaults parse")),
                Kind::Text | Kind::List => toml::Value::String(text.to_string()),
            }),
            Default::Derived(_) => None,
        }
    }

    fn int(&mut self, key: &'static str) -> Result<Option<i64>, ConfigError> {
        let Some(Kind::Int { min, max }) = setting(key).map(|s| s.kind) else { panic!("`{key}` is not an integer") };
        let v = self.value(key).map(|v| v.as_integer().expect("type checked"));
        if let Some(v) = v {
            if v < min || v > max {
                return Err(invalid(key, format!("{v} is outside [{min}, {max}]")));
            }
            self.record(key, Some(v.to_string()));
        }
        Ok(v)
    }

    /// An integer whose table default is a value, so it always has one.
    fn int_set(&mut self, key: &'static str) -> Result<i64, ConfigError> {
        Ok(self.int(key)?.expect("a default value"))
    }

    fn bool(&mut self, key: &'static str) -> bool {
        let v = self.value(key).and_then(|v| v.as_bool()).expect("a boolean with a default value");
        self.record(key, Some(v.to_string()));
        v
    }

    fn text(&mut self, key: &'static str) -> Option<String> {
        let v = self.value(key).map(|v| v.as_str().expect("type checked").to_string());
        if let Some(v) = &v {
            self.record(key, Some(v.clone()));
        }
        v
    }

    /// A file's path; unset (or empty) is recorded as unset.
    fn path(&mut self, key: &'static str) -> Option<PathBuf> {
        let path = self.text(key).filter(|p| !p.trim().is_empty()).map(|p| PathBuf::from(p.trim()));
        if path.is_none() {
            self.record(key, None);
        }
        path
    }

    /// The listeners, and the base `ssl.*` settings given.
    fn listeners(&mut self) -> Result<(listeners::Listeners, BTreeMap<&'static str, String>), ConfigError> {
        let mut inputs = std::mem::take(&mut self.listener_extras);
        inputs.listeners = self.text("listeners").expect("a default");
        inputs.protocol_map = self.text("listener.security.protocol.map").expect("a default");
        inputs.advertised = self.text("advertised.listeners");
        inputs.sasl_mechanisms = self.text("sasl.enabled.mechanisms").expect("a default");
        if inputs.advertised.is_none() {
            self.record("advertised.listeners", Some(inputs.listeners.clone()));
        }
        for key in listeners::BASE_SSL {
            match self.text(key) {
                Some(value) => {
                    inputs.ssl.insert(key, value);
                }
                None => self.record(key, None),
            }
        }
        let listeners = listeners::Listeners::parse(&inputs)?;
        Ok((listeners, inputs.ssl))
    }

    fn authorization(&mut self) -> Result<AuthorizationConfig, ConfigError> {
        let enabled = match self.text("authorizer.class.name") {
            None => {
                self.record("authorizer.class.name", None);
                false
            }
            Some(name) if name.trim() == STANDARD_AUTHORIZER => true,
            Some(name) => {
                return Err(invalid(
                    "authorizer.class.name",
                    format!("{name:?}: the only authorizer is {STANDARD_AUTHORIZER} (ACLs kept in the quorum)"),
                ));
            }
        };
        let super_users = match self.text("super.users") {
            None => {
                self.record("super.users", None);
                Vec::new()
            }
            // Kafka separates them with semicolons (a principal's name may hold a comma).
            Some(text) => text.split(';').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect(),
        };
        if let Some(bad) =
            super_users.iter().find(|p| p.split_once(':').is_none_or(|(t, n)| t.is_empty() || n.is_empty()))
        {
            return Err(invalid("super.users", format!("{bad:?} is not a principal Type:name (User:admin)")));
        }
        Ok(AuthorizationConfig {
            enabled,
            super_users,
            allow_everyone_if_no_acl_found: self.bool("allow.everyone.if.no.acl.found"),
        })
    }

    fn sasl(&mut self, listeners: &listeners::Listeners) -> Result<SaslConfig, ConfigError> {
        let jwks = self.text("sasl.oauthbearer.jwks.endpoint.url");
        let issuer = self.text("sasl.oauthbearer.expected.issuer");
        let audience = self.text("sasl.oauthbearer.expected.audience");
        for (key, value) in [
            ("sasl.oauthbearer.jwks.endpoint.url", &jwks),
            ("sasl.oauthbearer.expected.issuer", &issuer),
            ("sasl.oauthbearer.expected.audience", &audience),
        ] {
            if value.is_none() {
                self.record(key, None);
            }
        }
        let oauthbearer = OAuthBearerConfig {
            jwks_endpoint_url: jwks.clone(),
            expected_issuer: issuer,
            expected_audience: audience
                .map_or_else(Vec::new, |a| listeners::list_items(&a).map(String::from).collect()),
            sub_claim_name: self.text("sasl.oauthbearer.sub.claim.name").expect("a default"),
            clock_skew_seconds: self.int_set("sasl.oauthbearer.clock.skew.seconds")? as u64,
        };
        let oauth_listener = listeners.all.iter().find(|l| l.sasl_mechanisms.iter().any(|m| m == "OAUTHBEARER"));
        if let Some(listener) = oauth_listener
            && jwks.is_none()
        {
            return Err(invalid(
                "sasl.oauthbearer.jwks.endpoint.url",
                format!("listener {} enables OAUTHBEARER: set the JWKS file whose keys sign the tokens", listener.name),
            ));
        }
        let text = self.text("sasl.enabled.mechanisms").expect("a default");
        Ok(SaslConfig {
            enabled_mechanisms: listeners::list_items(&text).map(String::from).collect(),
            max_receive_bytes: self.int_set("sasl.server.max.receive.size")? as usize,
            failed_authentication_delay_ms: self.int_set("connection.failed.authentication.delay.ms")? as u64,
            max_reauth_ms: self.int_set("connections.max.reauth.ms")? as u64,
            oauthbearer,
        })
    }

    fn config(mut self) -> Result<BrokerConfig, ConfigError> {
        let node_id = self.int_set("node.id")? as u32;
        let data_dir = PathBuf::from(self.text("log.dirs").expect("a default"));
        let (listeners, ssl) = self.listeners()?;
        let sasl = self.sasl(&listeners)?;
        let authorization = self.authorization()?;
        let cluster_tls = ClusterTlsSettings {
            keystore: self.path("cluster.ssl.keystore.location"),
            truststore: self.path("cluster.ssl.truststore.location"),
        };
        let listener = listeners.inter_broker().bind.clone();
        let advertised_listener = listeners.inter_broker().advertised.clone();
        let metrics_listen = endpoint("metrics.listen", &self.text("metrics.listen").expect("a default"))?;
        let shards = match self.int("shards")? {
            Some(n) => n as usize,
            None => {
                let n = std::thread::available_parallelism().map_or(1, |n| n.get());
                self.record("shards", Some(n.to_string()));
                n
            }
        };
        let quorum_voters = match self.text("controller.quorum.voters") {
            Some(text) => voters("controller.quorum.voters", &text)?,
            None => {
                self.record("controller.quorum.voters", None);
                Vec::new()
            }
        };
        let broker_session_timeout_ms = self.int_set("broker.session.timeout.ms")? as u64;
        let broker_heartbeat_interval_ms = self.int_set("broker.heartbeat.interval.ms")? as u64;
        if broker_heartbeat_interval_ms >= broker_session_timeout_ms {
            return Err(invalid(
                "broker.heartbeat.interval.ms",
                format!(
                    "{broker_heartbeat_interval_ms} must be less than broker.session.timeout.ms ({broker_session_timeout_ms})"
                ),
            ));
        }
        let compression_text = self.text("compression.type").expect("a default");
        let compression =
            Compression::parse(&compression_text).map_err(|reason| invalid("compression.type", reason))?;

        let mut log = LogConfig {
            max_message_bytes: self.int_set("message.max.bytes")? as usize,
            segment_bytes: self.int_set("log.segment.bytes")? as u64,
            segment_ms: self.int_set("log.roll.ms")?,
            retention_ms: Some(self.int_set("log.retention.ms")?).filter(|v| *v >= 0),
            retention_bytes: Some(self.int_set("log.retention.bytes")?).filter(|v| *v >= 0).map(|v| v as u64),
            index_interval_bytes: self.int_set("log.index.interval.bytes")? as u64,
            producer_id_expiration_ms: self.int_set("producer.id.expiration.ms")?,
            ..LogConfig::default()
        };
        let flush_messages = self.int("log.flush.interval.messages")?;
        let flush_ms = self.int("log.flush.interval.ms")?;
        for (key, v) in [("log.flush.interval.messages", flush_messages), ("log.flush.interval.ms", flush_ms)] {
            if v.is_none() {
                self.record(key, None);
            }
        }
        log.flush = match (flush_messages, flush_ms) {
            (None, None) => FlushPolicy::Always,
            (messages, ms) => FlushPolicy::Interval {
                messages: messages.unwrap_or(i64::MAX) as u64,
                ms: ms.unwrap_or(i64::MAX) as u64,
            },
        };
        log.validate().map_err(|e| invalid("log settings", e.to_string()))?;
        let shard_limits = ShardLimits {
            open_files_max: self.int_set("shard.open.files.max")? as usize,
            producer_ids_max: self.int_set("shard.producer.ids.max")? as usize,
            cache_max_bytes: self.int_set("shard.cache.max.bytes")? as usize,
            fetch_readahead_bytes: self.int_set("shard.fetch.readahead.bytes")? as usize,
            cache_idle_ms: self.int_set("shard.cache.idle.ms")?,
            idle_poll_us: self.int_set("shard.idle.poll.us")? as u64,
            cleaner: crate::compaction::CleanerSettings {
                backoff_ms: self.int_set("log.cleaner.backoff.ms")? as u64,
                dedupe_buffer_bytes: self.int_set("log.cleaner.dedupe.buffer.size")? as usize,
            },
        };
        let groups = GroupConfig {
            offsets_partitions: self.int_set("offsets.topic.num.partitions")? as u32,
            offsets_replication_factor: self.int_set("offsets.topic.replication.factor")? as u16,
            offsets_segment_bytes: self.int_set("offsets.topic.segment.bytes")? as u32,
            commit_timeout_ms: self.int_set("offsets.commit.timeout.ms")? as i32,
            offset_metadata_max_bytes: self.int_set("offset.metadata.max.bytes")? as usize,
            offsets_retention_ms: self.int_set("offsets.retention.minutes")? as u64 * 60_000,
            retention_check_interval_ms: self.int_set("offsets.retention.check.interval.ms")? as u64,
            settings: crate::group::classic::GroupSettings {
                initial_rebalance_delay_ms: self.int_set("group.initial.rebalance.delay.ms")? as i32,
                min_session_timeout_ms: self.int_set("group.min.session.timeout.ms")? as i32,
                max_session_timeout_ms: self.int_set("group.max.session.timeout.ms")? as i32,
                max_size: self.int_set("group.max.size")? as usize,
            },
            consumer: crate::group::consumer::ConsumerGroupSettings {
                session_timeout_ms: self.int_set("group.consumer.session.timeout.ms")? as i32,
                heartbeat_interval_ms: self.int_set("group.consumer.heartbeat.interval.ms")? as i32,
                max_size: self.int_set("group.consumer.max.size")? as usize,
                assignors: {
                    let names = self.text("group.consumer.assignors").unwrap_or_default();
                    crate::group::consumer::Assignor::list(&names)
                        .map_err(|reason| invalid("group.consumer.assignors", reason))?
                },
            },
        };
        let transactions = TransactionConfig {
            settings: crate::txn::TxnSettings {
                transaction_max_timeout_ms: self.int_set("transaction.max.timeout.ms")? as i32,
                transactional_id_expiration_ms: self.int_set("transactional.id.expiration.ms")?,
            },
            abort_timed_out_interval_ms: self.int_set("transaction.abort.timed.out.transaction.cleanup.interval.ms")?
                as u64,
            write_timeout_ms: 30_000,
        };
        if groups.consumer.heartbeat_interval_ms >= groups.consumer.session_timeout_ms {
            return Err(invalid(
                "group.consumer.heartbeat.interval.ms",
                format!(
                    "{} is not below group.consumer.session.timeout.ms ({})",
                    groups.consumer.heartbeat_interval_ms, groups.consumer.session_timeout_ms
                ),
            ));
        }
        if groups.settings.min_session_timeout_ms > groups.settings.max_session_timeout_ms {
            return Err(invalid(
                "group.max.session.timeout.ms",
                format!(
                    "{} is below group.min.session.timeout.ms ({})",
                    groups.settings.max_session_timeout_ms, groups.settings.min_session_timeout_ms
                ),
            ));
        }
        let transaction_log = TransactionLogConfig {
            partitions: self.int_set("transaction.state.log.num.partitions")? as u32,
            replication_factor: self.int_set("transaction.state.log.replication.factor")? as u16,
            min_isr: self.int_set("transaction.state.log.min.isr")? as u16,
            segment_bytes: self.int_set("transaction.state.log.segment.bytes")? as u32,
        };
        let socket_request_max_bytes = self.int_set("socket.request.max.bytes")? as usize;
        let clients = ClientLimits {
            queued_max_request_bytes: self.int_set("queued.max.request.bytes")? as usize,
            socket_request_timeout_ms: self.int_set("socket.request.timeout.ms")? as u64,
            slow_request_ms: self.int_set("log.slow.request.ms")? as u64,
            connections_max_idle_ms: self.int_set("connections.max.idle.ms")? as u64,
            max_connections: self.int_set("max.connections")? as usize,
            max_connections_per_ip: self.int_set("max.connections.per.ip")? as usize,
            max_connection_creation_rate: Some(self.int_set("max.connection.creation.rate")? as u32)
                .filter(|rate| *rate < i32::MAX as u32),
        };
        let quota_window = crate::security::quotas::Window {
            samples: self.int_set("quota.window.num")? as usize,
            sample: std::time::Duration::from_secs(self.int_set("quota.window.size.seconds")? as u64),
        };
        if clients.queued_max_request_bytes < socket_request_max_bytes {
            return Err(invalid(
                "queued.max.request.bytes",
                format!(
                    "{} is below socket.request.max.bytes ({socket_request_max_bytes}): a request of the largest \
                     size would wait forever",
                    clients.queued_max_request_bytes
                ),
            ));
        }
        let config = BrokerConfig {
            node_id,
            data_dir,
            listeners,
            listener,
            advertised_listener,
            ssl,
            sasl,
            authorization,
            cluster_tls,
            metrics_listen,
            shards,
            quorum_voters,
            broker_session_timeout_ms,
            broker_heartbeat_interval_ms,
            auto_create_topics: self.bool("auto.create.topics.enable"),
            leader_rebalance: self.bool("auto.leader.rebalance.enable").then_some(
                crate::quorum::service::LeaderRebalance {
                    interval: std::time::Duration::from_secs(
                        self.int_set("leader.imbalance.check.interval.seconds")? as u64
                    ),
                    imbalance_percent: self.int_set("leader.imbalance.per.broker.percentage")? as u32,
                },
            ),
            num_partitions: self.int_set("num.partitions")? as u32,
            default_replication_factor: self.int_set("default.replication.factor")? as u16,
            socket_request_max_bytes,
            clients,
            quota_window,
            log_dir_min_free_bytes: self.int_set("log.dir.min.free.bytes")? as u64,
            min_insync_replicas: self.int_set("min.insync.replicas")? as u16,
            replica_lag_time_max_ms: self.int_set("replica.lag.time.max.ms")? as u64,
            test_acks_all_before_replication: self.bool("test.acks.all.before.replication"),
            test_stall_shard: usize::try_from(self.int_set("test.stall.shard")?).ok(),
            compression,
            log,
            shard_limits,
            groups,
            transaction_log,
            transactions,
            effective: Vec::new(),
            bootstrap_scram: Vec::new(),
        };
        let mut effective = self.effective;
        let effective = SETTINGS
            .iter()
            .map(|row| effective.remove(row.key).unwrap_or_else(|| panic!("`{}` was never read", row.key)))
            .collect();
        Ok(BrokerConfig { effective, ..config })
    }
}
