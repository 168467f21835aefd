//! Broker settings: a TOML file whose keys are Kafka's broker setting names, every value overridable on
//! the command line, validated once into [`BrokerConfig`], the only form the rest of the broker reads.
//!
//! Kafka's names contain dots. In TOML `log.retention.ms = 60000` is a dotted key (nested tables); the
//! file is flattened back to dotted names, so both that and `"log.retention.ms" = 60000` work. An unknown
//! key or an invalid value stops the start with a message naming the key.
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `node.id` | 1 | this broker's id |
//! | `log.dirs` | `./data` | data directory |
//! | `listeners` | `127.0.0.1:9092` | Kafka listener, `HOST:PORT` or `PLAINTEXT://HOST:PORT` |
//! | `advertised.listeners` | the listener | address given to clients in Metadata |
//! | `shards` | number of CPUs | shard executors (one per core, pinned when there are enough cores) |
//! | `controller.quorum.voters` | unset: this node is its own one-voter quorum, without a quorum port | quorum voters, `ID@HOST:PORT,...`; a broker whose `node.id` is listed runs that voter (on that port) |
//! | `broker.session.timeout.ms` | 9000 | (voters) a broker not heard from for this long is fenced |
//! | `broker.heartbeat.interval.ms` | 2000 | how often the broker heartbeats to the quorum |
//! | `metrics.listen` | off | Prometheus endpoint `HOST:PORT` |
//! | `auto.create.topics.enable` | true | create unknown topics on Metadata/Produce |
//! | `num.partitions` | 3 | partitions of an auto-created topic |
//! | `default.replication.factor` | 1 | replication factor of an auto-created topic |
//! | `socket.request.max.bytes` | 104857600 | largest request frame accepted |
//! | `message.max.bytes` | 1048588 | default `max.message.bytes` of topics |
//! | `log.segment.bytes` | 1073741824 | default `segment.bytes` |
//! | `log.roll.ms` | 604800000 | default `segment.ms` |
//! | `log.retention.ms` | 604800000 | default `retention.ms` (-1: keep forever) |
//! | `log.retention.bytes` | -1 | default `retention.bytes` (-1: no limit) |
//! | `log.flush.interval.messages` | unset | with `log.flush.interval.ms`: Kafka's interval flush instead of fsync-before-ack |
//! | `log.flush.interval.ms` | unset | see above |
//! | `log.index.interval.bytes` | 4096 | bytes between offset index entries |
//! | `min.insync.replicas` | 1 | default `min.insync.replicas` |
//! | `unclean.leader.election.enable` | false | default `unclean.leader.election.enable` |
//! | `shard.open.files.max` | 4096 | segment files each shard keeps open (least recently used closed beyond it) |
//! | `shard.cache.max.bytes` | 268435456 | memory each shard's partitions may hold in tail caches |
//! | `shard.cache.idle.ms` | 10000 | a partition unused this long releases its cache and closes its files |
//! | `shard.idle.poll.us` | 0 | how long an idle shard polls for work before it sleeps (pinned shards only) |
//!
//! Memory per shard is bounded by `shard.cache.max.bytes` for cached recent data, plus appended data
//! waiting for its write-out (at most 16 MiB per partition; under the default flush policy it is written
//! within 100 ms) and one aligned I/O buffer copy of it while it is written, plus the segment indexes
//! (about 0.5% of the data stored), plus per connection at most 32 requests / 64 MiB in flight. An idle
//! partition keeps less than one 4 KiB block of its data in memory and no open file.

use std::collections::BTreeMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use shardlog_storage::{FlushPolicy, LogConfig};

/// Why the settings cannot be used. The message names the key or file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("read config file {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("config file {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("unknown setting `{key}`")]
    UnknownKey { key: String },
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

/// Validated broker settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerConfig {
    pub node_id: u32,
    pub data_dir: PathBuf,
    pub listener: Endpoint,
    pub advertised_listener: Endpoint,
    pub shards: usize,
    /// Empty: the broker is its own one-voter quorum, reachable only from its own process.
    pub quorum_voters: Vec<Voter>,
    pub broker_session_timeout_ms: u64,
    pub broker_heartbeat_interval_ms: u64,
    pub metrics_listen: Option<Endpoint>,
    pub auto_create_topics: bool,
    pub num_partitions: u32,
    pub default_replication_factor: u16,
    pub socket_request_max_bytes: usize,
    pub min_insync_replicas: u16,
    pub unclean_leader_election: bool,
    /// Defaults for each topic's log settings.
    pub log: LogConfig,
    /// What each shard may hold for its partitions.
    pub shard_limits: ShardLimits,
}

/// Per-shard bounds on what partitions hold, and how a shard waits for work (shardlog settings; Kafka has
/// no equivalent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardLimits {
    /// `shard.open.files.max`: segment files a shard keeps open; the least recently used are closed
    /// beyond it and reopened on demand. Default 4096.
    pub open_files_max: usize,
    /// `shard.cache.max.bytes`: memory a shard's partitions may hold in their tail caches; beyond it the
    /// least recently used partitions release theirs. Default 256 MiB.
    pub cache_max_bytes: usize,
    /// `shard.cache.idle.ms`: a partition neither written nor read for this long releases its cache and
    /// closes its files. Default 10 s.
    pub cache_idle_ms: i64,
    /// `shard.idle.poll.us`: when a shard runs out of work it keeps polling its rings this long before it
    /// sleeps. Waking a sleeping thread on another core costs tens of microseconds on virtual machines,
    /// once per request and once per hop between shards; polling saves that for requests that arrive
    /// meanwhile, at the price of a busy core. Default 0 (sleep at once), which suits hosts shared with
    /// other work; 50-200 lowers the latency of one-at-a-time requests on dedicated hosts. Only shards
    /// pinned to their own core poll.
    pub idle_poll_us: u64,
}

impl Default for ShardLimits {
    fn default() -> Self {
        ShardLimits { open_files_max: 4096, cache_max_bytes: 256 << 20, cache_idle_ms: 10_000, idle_poll_us: 0 }
    }
}

/// The file's keys, each optional; `deny_unknown_fields` turns a typo into an error naming it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Settings {
    #[serde(rename = "node.id")]
    node_id: Option<u32>,
    #[serde(rename = "log.dirs")]
    log_dirs: Option<PathBuf>,
    listeners: Option<String>,
    #[serde(rename = "advertised.listeners")]
    advertised_listeners: Option<String>,
    shards: Option<usize>,
    #[serde(rename = "controller.quorum.voters")]
    quorum_voters: Option<String>,
    #[serde(rename = "broker.session.timeout.ms")]
    broker_session_timeout_ms: Option<i64>,
    #[serde(rename = "broker.heartbeat.interval.ms")]
    broker_heartbeat_interval_ms: Option<i64>,
    #[serde(rename = "metrics.listen")]
    metrics_listen: Option<String>,
    #[serde(rename = "auto.create.topics.enable")]
    auto_create_topics: Option<bool>,
    #[serde(rename = "num.partitions")]
    num_partitions: Option<i64>,
    #[serde(rename = "default.replication.factor")]
    default_replication_factor: Option<i64>,
    #[serde(rename = "socket.request.max.bytes")]
    socket_request_max_bytes: Option<i64>,
    #[serde(rename = "message.max.bytes")]
    message_max_bytes: Option<i64>,
    #[serde(rename = "log.segment.bytes")]
    segment_bytes: Option<i64>,
    #[serde(rename = "log.roll.ms")]
    roll_ms: Option<i64>,
    #[serde(rename = "log.retention.ms")]
    retention_ms: Option<i64>,
    #[serde(rename = "log.retention.bytes")]
    retention_bytes: Option<i64>,
    #[serde(rename = "log.flush.interval.messages")]
    flush_messages: Option<i64>,
    #[serde(rename = "log.flush.interval.ms")]
    flush_ms: Option<i64>,
    #[serde(rename = "log.index.interval.bytes")]
    index_interval_bytes: Option<i64>,
    #[serde(rename = "min.insync.replicas")]
    min_insync_replicas: Option<i64>,
    #[serde(rename = "unclean.leader.election.enable")]
    unclean_leader_election: Option<bool>,
    #[serde(rename = "shard.open.files.max")]
    open_files_max: Option<i64>,
    #[serde(rename = "shard.cache.max.bytes")]
    cache_max_bytes: Option<i64>,
    #[serde(rename = "shard.cache.idle.ms")]
    cache_idle_ms: Option<i64>,
    #[serde(rename = "shard.idle.poll.us")]
    idle_poll_us: Option<i64>,
}

/// Everything that goes into the settings, in increasing precedence: the file, then command-line
/// overrides (`KEY=VALUE`, Kafka names; the dedicated flags are turned into these).
#[derive(Debug, Clone, Default)]
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
        Self::from_flat(flat)
    }

    /// Parses settings from TOML text (for tests and tools).
    pub fn from_toml(text: &str) -> Result<BrokerConfig, ConfigError> {
        let table: toml::Table = toml::from_str(text)
            .map_err(|e| ConfigError::Parse { path: Path::new("<text>").into(), reason: e.to_string() })?;
        let mut flat = BTreeMap::new();
        flatten("", table, &mut flat);
        Self::from_flat(flat)
    }

    fn from_flat(flat: BTreeMap<String, toml::Value>) -> Result<BrokerConfig, ConfigError> {
        let table: toml::Table = flat.clone().into_iter().collect();
        let settings = Settings::deserialize(toml::Value::Table(table)).map_err(|e| {
            let message = e.message().to_string();
            if let Some(key) = message.strip_prefix("unknown field `").and_then(|rest| rest.split('`').next()) {
                return ConfigError::UnknownKey { key: key.to_string() };
            }
            // A value of the wrong type: serde does not say which key, so find the one that fails alone.
            let culprit = flat.iter().find(|(key, value)| {
                let single: toml::Table = [((*key).clone(), (*value).clone())].into_iter().collect();
                Settings::deserialize(toml::Value::Table(single)).is_err()
            });
            let key = culprit.map_or_else(|| "settings".to_string(), |(key, _)| key.clone());
            ConfigError::Invalid { key, reason: message }
        })?;
        settings.validate()
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
    let text = text.trim();
    let bare = text.strip_prefix("PLAINTEXT://").unwrap_or(text);
    if bare.contains("://") {
        return Err(invalid(key, format!("{text:?}: only PLAINTEXT listeners are supported")));
    }
    let (host, port) = bare.rsplit_once(':').ok_or_else(|| invalid(key, format!("{text:?} is not HOST:PORT")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(invalid(key, format!("{text:?} has no host")));
    }
    let port = port.parse().map_err(|_| invalid(key, format!("{text:?}: port is not a number 0-65535")))?;
    Ok(Endpoint { host: host.to_string(), port })
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

fn in_range(key: &str, value: i64, min: i64, max: i64) -> Result<i64, ConfigError> {
    if value < min || value > max {
        return Err(invalid(key, format!("{value} is outside [{min}, {max}]")));
    }
    Ok(value)
}

impl Settings {
    fn validate(self) -> Result<BrokerConfig, ConfigError> {
        let node_id = self.node_id.unwrap_or(1);
        let listener = endpoint("listeners", self.listeners.as_deref().unwrap_or("127.0.0.1:9092"))?;
        let advertised_listener = match &self.advertised_listeners {
            Some(text) => endpoint("advertised.listeners", text)?,
            None => listener.clone(),
        };
        if advertised_listener.port == 0 {
            return Err(invalid("advertised.listeners", "port 0 cannot be advertised"));
        }
        let default_shards = std::thread::available_parallelism().map_or(1, |n| n.get());
        let shards = self.shards.unwrap_or(default_shards);
        if shards == 0 || shards > 1024 {
            return Err(invalid("shards", format!("{shards} is outside [1, 1024]")));
        }
        let quorum_voters = match &self.quorum_voters {
            Some(text) => voters("controller.quorum.voters", text)?,
            None => Vec::new(),
        };
        let broker_session_timeout_ms =
            in_range("broker.session.timeout.ms", self.broker_session_timeout_ms.unwrap_or(9000), 100, 3_600_000)?
                as u64;
        let broker_heartbeat_interval_ms = in_range(
            "broker.heartbeat.interval.ms",
            self.broker_heartbeat_interval_ms.unwrap_or(2000),
            10,
            broker_session_timeout_ms as i64 - 1,
        )? as u64;
        let metrics_listen = self.metrics_listen.as_deref().map(|t| endpoint("metrics.listen", t)).transpose()?;

        let mut log = LogConfig::default();
        if let Some(v) = self.message_max_bytes {
            log.max_message_bytes = in_range("message.max.bytes", v, 1024, i32::MAX as i64)? as usize;
        }
        if let Some(v) = self.segment_bytes {
            log.segment_bytes = in_range("log.segment.bytes", v, 14, i32::MAX as i64)? as u64;
        }
        if let Some(v) = self.roll_ms {
            log.segment_ms = in_range("log.roll.ms", v, 1, i64::MAX)?;
        }
        if let Some(v) = self.retention_ms {
            log.retention_ms = (in_range("log.retention.ms", v, -1, i64::MAX)? >= 0).then_some(v);
        }
        if let Some(v) = self.retention_bytes {
            log.retention_bytes = (in_range("log.retention.bytes", v, -1, i64::MAX)? >= 0).then_some(v as u64);
        }
        if let Some(v) = self.index_interval_bytes {
            log.index_interval_bytes = in_range("log.index.interval.bytes", v, 1, i32::MAX as i64)? as u64;
        }
        log.flush = match (self.flush_messages, self.flush_ms) {
            (None, None) => FlushPolicy::Always,
            (messages, ms) => FlushPolicy::Interval {
                messages: in_range("log.flush.interval.messages", messages.unwrap_or(i64::MAX), 1, i64::MAX)? as u64,
                ms: in_range("log.flush.interval.ms", ms.unwrap_or(i64::MAX), 1, i64::MAX)? as u64,
            },
        };
        log.validate().map_err(|e| invalid("log settings", e.to_string()))?;
        let defaults = ShardLimits::default();
        let shard_limits = ShardLimits {
            open_files_max: in_range(
                "shard.open.files.max",
                self.open_files_max.unwrap_or(defaults.open_files_max as i64),
                16,
                1 << 20,
            )? as usize,
            cache_max_bytes: in_range(
                "shard.cache.max.bytes",
                self.cache_max_bytes.unwrap_or(defaults.cache_max_bytes as i64),
                0,
                i64::MAX,
            )? as usize,
            cache_idle_ms: in_range(
                "shard.cache.idle.ms",
                self.cache_idle_ms.unwrap_or(defaults.cache_idle_ms),
                1,
                i64::MAX,
            )?,
            idle_poll_us: in_range(
                "shard.idle.poll.us",
                self.idle_poll_us.unwrap_or(defaults.idle_poll_us as i64),
                0,
                1_000_000,
            )? as u64,
        };

        Ok(BrokerConfig {
            node_id,
            data_dir: self.log_dirs.unwrap_or_else(|| PathBuf::from("data")),
            listener,
            advertised_listener,
            shards,
            quorum_voters,
            broker_session_timeout_ms,
            broker_heartbeat_interval_ms,
            metrics_listen,
            auto_create_topics: self.auto_create_topics.unwrap_or(true),
            num_partitions: in_range("num.partitions", self.num_partitions.unwrap_or(3), 1, 100_000)? as u32,
            default_replication_factor: in_range(
                "default.replication.factor",
                self.default_replication_factor.unwrap_or(1),
                1,
                i16::MAX as i64,
            )? as u16,
            socket_request_max_bytes: in_range(
                "socket.request.max.bytes",
                self.socket_request_max_bytes.unwrap_or(100 << 20),
                1024,
                i32::MAX as i64,
            )? as usize,
            min_insync_replicas: in_range(
                "min.insync.replicas",
                self.min_insync_replicas.unwrap_or(1),
                1,
                i16::MAX as i64,
            )? as u16,
            unclean_leader_election: self.unclean_leader_election.unwrap_or(false),
            log,
            shard_limits,
        })
    }
}
