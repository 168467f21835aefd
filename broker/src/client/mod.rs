//! A blocking Kafka client for shardlog's own tools: the admin CLI, the load generators, the tests. It
//! does what Kafka clients do, so that a tool works against a cluster as it does against one broker: it
//! takes a bootstrap list and uses whichever broker answers, asks any broker for the cluster's metadata,
//! sends each partition's requests to that partition's leader, and on NOT_LEADER_OR_FOLLOWER,
//! UNKNOWN_TOPIC_OR_PARTITION and Kafka's other retriable errors refreshes the metadata and tries again,
//! for up to [`KafkaClient::retry_for`]. It reaches a secured cluster as `--command-config` says
//! ([`command_config`]): TLS, SASL, or both, on every connection it opens.

mod acls;
pub mod command_config;
mod connection;
mod groups;
mod quotas;
mod reassign;
mod scram;
mod transactions;
mod transport;
mod users;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_topics_request::{
    CreatableReplicaAssignment, CreatableTopic, CreatableTopicConfig,
};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, BrokerId, CreateTopicsRequest, DeleteTopicsRequest, DescribeConfigsRequest, ListOffsetsRequest,
    MetadataRequest, MetadataResponse, ResponseKind, TopicName,
};
use kafka_protocol::protocol::{Encodable, StrBytes};

pub use acls::{AclBinding, AclFilter, operation_code, pattern_type_code, render_acls};
pub use command_config::{COMMAND_CONFIG_ENV, ClientSecurity, SecurityProtocol};
pub use connection::{Connection, READ_TIMEOUT, Receiver, Sender};
pub use groups::{DescribedGroup, GroupMember, ListedGroup};
pub use quotas::{DescribedQuota, Entity, QuotaChange, render_entity, render_quotas};
pub use reassign::{Ongoing, Refused};
pub use transactions::{DescribedTxn, ListedTxn, PartitionProducer};
pub use users::{ScramUser, render_users};

/// The environment variable a `--bootstrap` list defaults to.
pub const BOOTSTRAP_ENV: &str = "SHARDLOG_BOOTSTRAP";
/// The bootstrap list without `--bootstrap` or `$SHARDLOG_BOOTSTRAP`: the default single node.
pub const DEFAULT_BOOTSTRAP: &str = "127.0.0.1:9092";
/// How long a request that gets a retriable answer is tried again (metadata reaches every broker
/// within a heartbeat; a new leader is elected within a broker session).
pub const RETRY_FOR: Duration = Duration::from_secs(30);
/// The pause before a retry.
const RETRY_PAUSE: Duration = Duration::from_millis(100);

/// Versions this client speaks (ones every current broker has).
const METADATA_VERSIONS: (i16, i16) = (1, 12);
const CREATE_TOPICS_V: i16 = 5;
const DELETE_TOPICS_V: i16 = 4;
const LIST_OFFSETS_V: i16 = 5;
const DESCRIBE_CONFIGS_V: i16 = 2;
/// ListOffsets' replica id for reading a replica's own offsets (Kafka's `DEBUGGING_REPLICA_ID`).
const DEBUGGING_REPLICA: i32 = -2;

/// Splits a bootstrap list, `HOST:PORT[,HOST:PORT...]`.
pub fn parse_bootstrap(list: &str) -> Result<Vec<String>> {
    let addrs: Vec<String> = list.split(',').map(str::trim).filter(|a| !a.is_empty()).map(String::from).collect();
    if addrs.is_empty() {
        bail!("empty bootstrap list {list:?}: give HOST:PORT[,HOST:PORT...]");
    }
    if let Some(bad) =
        addrs.iter().find(|a| !a.rsplit_once(':').is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()))
    {
        bail!("bootstrap address {bad:?} is not HOST:PORT");
    }
    Ok(addrs)
}

/// What [`KafkaClient::route`] does with a partition the cluster says has no leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leaderless {
    /// Ask again until one is elected (up to [`KafkaClient::retry_for`]): the caller needs its answer.
    Wait,
    /// Leave it out of the answer (a description of the topic shows it without one).
    Skip,
}

/// A topic's partitions and where each one's leader is.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicLayout {
    pub partitions: i32,
    /// Leader address per partition, for the partitions that have a leader.
    pub leaders: BTreeMap<i32, String>,
}

impl TopicLayout {
    /// Partitions grouped by leader address.
    pub fn by_leader(&self) -> BTreeMap<String, Vec<i32>> {
        let mut out: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for (p, addr) in &self.leaders {
            out.entry(addr.clone()).or_default().push(*p);
        }
        out
    }
}

/// A Kafka error code as an error, or nothing for 0.
pub fn check(code: i16, what: &str) -> Result<()> {
    match ResponseError::try_from_code(code) {
        None => Ok(()),
        Some(e) => bail!("{what}: {e} (error code {code})"),
    }
}

/// [`check`] for an answer that carries the broker's own words for the error (`error_message`): they
/// come first, the code after them.
pub fn check_said(code: i16, message: Option<&str>, what: &str) -> Result<()> {
    match (ResponseError::try_from_code(code), message.map(str::trim).filter(|m| !m.is_empty())) {
        (None, _) => Ok(()),
        (Some(e), None) => bail!("{what}: {e} (error code {code})"),
        (Some(e), Some(said)) => bail!("{what}: {said} ({e}, error code {code})"),
    }
}

/// What to add to a failure to reach any broker: a broker closes a plaintext connection to a TLS
/// listener at once, and one to a SASL listener at the first request past ApiVersions, without a word.
fn plaintext_hint(security: &ClientSecurity) -> &'static str {
    match security.protocol {
        SecurityProtocol::Plaintext => {
            "; if the listener uses TLS or SASL, give --command-config FILE with its security.protocol"
        }
        _ => "",
    }
}

fn retriable(code: i16) -> bool {
    ResponseError::try_from_code(code).is_some_and(|e| e.is_retriable())
}

fn topic_name(n: &str) -> TopicName {
    TopicName(StrBytes::from_string(n.to_string()))
}

/// Connections to a cluster's brokers, and what it was last told of them.
#[derive(Debug)]
pub struct KafkaClient {
    bootstrap: Vec<String>,
    /// How every connection is opened (TLS, SASL).
    security: ClientSecurity,
    /// Open connections, by broker address.
    connections: BTreeMap<String, Connection>,
    /// Where cluster-wide requests (Metadata, topic administration) go: the broker that answered last.
    home: String,
    /// Broker id to address, from the last Metadata answer.
    brokers: BTreeMap<i32, String>,
    /// Each topic's layout as last looked up: where [`Self::route`] sends requests first.
    layouts: BTreeMap<String, TopicLayout>,
    metadata_version: i16,
    /// How long requests that get retriable answers are tried again.
    pub retry_for: Duration,
    /// How long an answer may take on the connections opened from now on.
    pub read_timeout: Duration,
}

impl KafkaClient {
    /// Connects to the first broker of the bootstrap list that answers, over plain TCP.
    pub fn connect(bootstrap: &str) -> Result<KafkaClient> {
        Self::connect_secured(bootstrap, ClientSecurity::plaintext())
    }

    /// Connects to the first broker of the bootstrap list that answers, as `security` says.
    pub fn connect_secured(bootstrap: &str, security: ClientSecurity) -> Result<KafkaClient> {
        let bootstrap = parse_bootstrap(bootstrap)?;
        let mut failures = Vec::new();
        for addr in &bootstrap {
            match Connection::open_secured(addr, &security)
                .and_then(|mut c| c.negotiate(ApiKey::Metadata, METADATA_VERSIONS).map(|v| (c, v)))
            {
                Ok((conn, metadata_version)) => {
                    return Ok(KafkaClient {
                        security,
                        connections: BTreeMap::from([(addr.clone(), conn)]),
                        home: addr.clone(),
                        bootstrap,
                        brokers: BTreeMap::new(),
                        layouts: BTreeMap::new(),
                        metadata_version,
                        retry_for: RETRY_FOR,
                        read_timeout: READ_TIMEOUT,
                    });
                }
                Err(e) => failures.push(format!("{addr}: {e:#}")),
            }
        }
        bail!("no bootstrap broker answered ({}){}", failures.join("; "), plaintext_hint(&security))
    }

    /// How this client opens connections.
    pub fn security(&self) -> &ClientSecurity {
        &self.security
    }

    /// The connection to `addr`, opened if need be.
    pub fn connection(&mut self, addr: &str) -> Result<&mut Connection> {
        if !self.connections.contains_key(addr) {
            let mut conn = Connection::open_secured(addr, &self.security)?;
            if self.read_timeout != READ_TIMEOUT {
                conn.set_read_timeout(self.read_timeout)?;
            }
            self.connections.insert(addr.to_string(), conn);
        }
        Ok(self.connections.get_mut(addr).expect("inserted above"))
    }

    /// How long an answer may take, on every connection (Kafka's `request.timeout.ms`): past it the
    /// request fails as a lost connection would. Default [`READ_TIMEOUT`].
    pub fn set_read_timeout(&mut self, timeout: Duration) -> Result<()> {
        self.read_timeout = timeout;
        for conn in self.connections.values_mut() {
            conn.set_read_timeout(timeout)?;
        }
        Ok(())
    }

    /// Drops the connection to `addr` (after it failed; the next use opens a new one).
    pub fn forget(&mut self, addr: &str) {
        self.connections.remove(addr);
    }

    /// Sends a request any broker may answer: to the home broker, or, if it does not answer, to the
    /// next of the known brokers and the bootstrap list that does (which becomes home).
    pub fn call_any<T: Encodable>(&mut self, api: ApiKey, version: i16, body: &T) -> Result<ResponseKind> {
        let mut candidates = vec![self.home.clone()];
        for addr in self.brokers.values().chain(&self.bootstrap) {
            if !candidates.contains(addr) {
                candidates.push(addr.clone());
            }
        }
        let mut failures = Vec::new();
        for addr in candidates {
            match self.connection(&addr).and_then(|c| c.call(api, version, body)) {
                Ok(answer) => {
                    self.home = addr;
                    return Ok(answer);
                }
                Err(e) => {
                    self.forget(&addr);
                    failures.push(format!("{addr}: {e:#}"));
                }
            }
        }
        bail!("no broker answered {api:?} ({}){}", failures.join("; "), plaintext_hint(&self.security))
    }

    /// Metadata of `topics` (`None`: every topic), from any broker; remembers the brokers' addresses.
    pub fn metadata(&mut self, topics: Option<&[&str]>) -> Result<MetadataResponse> {
        let req = MetadataRequest::default().with_allow_auto_topic_creation(false).with_topics(
            topics
                .map(|ts| ts.iter().map(|t| MetadataRequestTopic::default().with_name(Some(topic_name(t)))).collect()),
        );
        let ResponseKind::Metadata(r) = self.call_any(ApiKey::Metadata, self.metadata_version, &req)? else {
            bail!("wrong answer to Metadata")
        };
        self.brokers = r.brokers.iter().map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port))).collect();
        Ok(r)
    }

    /// The topic's partitions and their leaders as the cluster tells them now. A topic the answering
    /// broker does not know yet (just created through another broker) is asked for again, up to
    /// [`Self::retry_for`].
    pub fn layout(&mut self, topic: &str) -> Result<TopicLayout> {
        let deadline = Instant::now() + self.retry_for;
        loop {
            let metadata = self.metadata(Some(&[topic]))?;
            let t = metadata.topics.first().context("empty Metadata answer")?;
            if t.error_code == 0 {
                let mut layout = TopicLayout { partitions: t.partitions.len() as i32, leaders: BTreeMap::new() };
                for p in &t.partitions {
                    if let Some(addr) = self.brokers.get(&p.leader_id.0) {
                        layout.leaders.insert(p.partition_index, addr.clone());
                    }
                }
                self.layouts.insert(topic.to_string(), layout.clone());
                return Ok(layout);
            }
            if !retriable(t.error_code) || Instant::now() >= deadline {
                check(t.error_code, &format!("topic {topic}"))?;
            }
            std::thread::sleep(RETRY_PAUSE);
        }
    }

    /// [`Self::layout`] once every partition has a leader (up to [`Self::retry_for`]).
    pub fn led_layout(&mut self, topic: &str) -> Result<TopicLayout> {
        let deadline = Instant::now() + self.retry_for;
        loop {
            let layout = self.layout(topic)?;
            if layout.leaders.len() == layout.partitions as usize {
                return Ok(layout);
            }
            if Instant::now() >= deadline {
                let leaderless = (0..layout.partitions).find(|p| !layout.leaders.contains_key(p)).unwrap_or(0);
                bail!("{topic}-{leaderless} has no leader after {:?}", self.retry_for);
            }
            std::thread::sleep(RETRY_PAUSE);
        }
    }

    /// The address of a partition's leader now, from fresh metadata (`None`: it has none right now).
    pub fn leader(&mut self, topic: &str, partition: i32) -> Result<Option<String>> {
        Ok(self.layout(topic)?.leaders.remove(&partition))
    }

    /// Asks each partition's leader about it: `ask` gets a connection to a leader and the partitions it
    /// leads, and returns each one's outcome (a value, or a Kafka error code). The leaders are those last
    /// looked up; partitions answered with a retriable error (NOT_LEADER_OR_FOLLOWER,
    /// UNKNOWN_TOPIC_OR_PARTITION, ...), or whose leader did not answer or is not known, are asked again
    /// after fresh metadata, up to [`Self::retry_for`]; a partition the metadata gives no leader is
    /// waited for or left out, as `leaderless` says. `what` names the request in errors.
    pub fn route<T>(
        &mut self,
        topic: &str,
        partitions: &[i32],
        what: &str,
        leaderless: Leaderless,
        mut ask: impl FnMut(&mut Connection, &[i32]) -> Result<Vec<(i32, Result<T, i16>)>>,
    ) -> Result<BTreeMap<i32, T>> {
        let deadline = Instant::now() + self.retry_for;
        let mut done = BTreeMap::new();
        let mut pending: BTreeSet<i32> = partitions.iter().copied().collect();
        let mut reasons: BTreeMap<i32, String> = BTreeMap::new();
        let mut cached = self.layouts.get(topic).cloned();
        loop {
            let layout = match cached.take() {
                Some(layout) => layout,
                None => self.layout(topic)?,
            };
            if let Some(p) = pending.iter().find(|p| **p < 0 || **p >= layout.partitions) {
                bail!("{what} of {topic}-{p}: the topic has {} partitions", layout.partitions);
            }
            if leaderless == Leaderless::Skip {
                pending.retain(|p| layout.leaders.contains_key(p));
            }
            let mut by_leader: BTreeMap<String, Vec<i32>> = BTreeMap::new();
            for p in &pending {
                match layout.leaders.get(p) {
                    Some(addr) => by_leader.entry(addr.clone()).or_default().push(*p),
                    None => {
                        reasons.insert(*p, "no leader".into());
                    }
                }
            }
            for (addr, asked) in by_leader {
                let answers = match self.connection(&addr).and_then(|conn| ask(conn, &asked)) {
                    Ok(answers) => answers,
                    Err(e) => {
                        self.forget(&addr);
                        for p in &asked {
                            reasons.insert(*p, format!("{addr}: {e:#}"));
                        }
                        continue;
                    }
                };
                for (p, outcome) in answers {
                    if !asked.contains(&p) {
                        continue;
                    }
                    match outcome {
                        Ok(value) => {
                            pending.remove(&p);
                            done.insert(p, value);
                        }
                        Err(code) if retriable(code) => {
                            let error = ResponseError::try_from_code(code).expect("a known code");
                            reasons.insert(p, format!("{error} (error code {code}) from {addr}"));
                        }
                        Err(code) => check(code, &format!("{what} of {topic}-{p}"))?,
                    }
                }
            }
            if pending.is_empty() {
                return Ok(done);
            }
            if Instant::now() >= deadline {
                let p = pending.first().expect("not empty");
                let reason = reasons.get(p).map_or("no answer", String::as_str);
                bail!("{what} of {topic}-{p}: {reason}, still after {:?} of retries", self.retry_for);
            }
            std::thread::sleep(RETRY_PAUSE);
        }
    }

    /// (earliest, latest) offsets of each partition, each asked of its leader.
    pub fn offsets(&mut self, topic: &str, partitions: i32) -> Result<Vec<(i64, i64)>> {
        let all: Vec<i32> = (0..partitions).collect();
        let bounds = self.offsets_of(topic, &all, Leaderless::Wait)?;
        Ok(all.iter().map(|p| bounds[p]).collect())
    }

    /// (earliest, latest) offsets of the given partitions, each asked of its leader; with
    /// [`Leaderless::Skip`], those without a leader are left out.
    pub fn offsets_of(
        &mut self,
        topic: &str,
        partitions: &[i32],
        leaderless: Leaderless,
    ) -> Result<BTreeMap<i32, (i64, i64)>> {
        let mut bounds = Vec::new();
        for timestamp in [-2i64, -1] {
            bounds.push(self.route(topic, partitions, "list offsets", leaderless, |conn, asked| {
                let req = ListOffsetsRequest::default().with_replica_id(BrokerId(-1)).with_topics(vec![
                    ListOffsetsTopic::default().with_name(topic_name(topic)).with_partitions(
                        asked
                            .iter()
                            .map(|&p| ListOffsetsPartition::default().with_partition_index(p).with_timestamp(timestamp))
                            .collect(),
                    ),
                ]);
                let ResponseKind::ListOffsets(r) = conn.call(ApiKey::ListOffsets, LIST_OFFSETS_V, &req)? else {
                    bail!("wrong answer to ListOffsets")
                };
                Ok(r.topics
                    .iter()
                    .flat_map(|t| &t.partitions)
                    .map(|p| (p.partition_index, if p.error_code == 0 { Ok(p.offset) } else { Err(p.error_code) }))
                    .collect())
            })?);
        }
        // A partition answered for the earliest offset may have lost its leader before the latest.
        Ok(partitions.iter().filter_map(|p| Some((*p, (*bounds[0].get(p)?, *bounds[1].get(p)?)))).collect())
    }

    /// Each replica's own log end offset, asked of the broker holding it (ListOffsets as Kafka's
    /// debugging replica): `partitions` lists the partitions of `topic` each broker id holds, and the
    /// answer has an entry per (partition, broker) that answered. A broker down is left out.
    pub fn replica_log_ends(&mut self, topic: &str, partitions: &BTreeMap<i32, Vec<i32>>) -> BTreeMap<(i32, i32), i64> {
        let mut out = BTreeMap::new();
        for (broker, asked) in partitions {
            let Some(addr) = self.brokers.get(broker).cloned() else { continue };
            let req = ListOffsetsRequest::default().with_replica_id(BrokerId(DEBUGGING_REPLICA)).with_topics(vec![
                ListOffsetsTopic::default().with_name(topic_name(topic)).with_partitions(
                    asked
                        .iter()
                        .map(|&p| ListOffsetsPartition::default().with_partition_index(p).with_timestamp(-1))
                        .collect(),
                ),
            ]);
            match self.connection(&addr).and_then(|c| c.call(ApiKey::ListOffsets, LIST_OFFSETS_V, &req)) {
                Ok(ResponseKind::ListOffsets(r)) => {
                    let answered = r.topics.iter().flat_map(|t| &t.partitions).filter(|p| p.error_code == 0);
                    out.extend(answered.map(|p| ((p.partition_index, *broker), p.offset)));
                }
                Ok(_) => {}
                Err(_) => self.forget(&addr),
            }
        }
        out
    }

    /// Creates a topic with `partitions` partitions of `replication` replicas each; -1 for either takes
    /// the cluster's `num.partitions` or `default.replication.factor` (KIP-464, CreateTopics v4+).
    pub fn create_topic(
        &mut self,
        topic: &str,
        partitions: i32,
        replication: i16,
        configs: &[(String, String)],
    ) -> Result<()> {
        self.create_topic_as(topic, partitions, replication, &[], configs)
    }

    /// Creates a topic whose partition `i` has the replicas `assignment[i]` (the first leads).
    pub fn create_topic_assigned(
        &mut self,
        topic: &str,
        assignment: &[Vec<i32>],
        configs: &[(String, String)],
    ) -> Result<()> {
        self.create_topic_as(topic, -1, -1, assignment, configs)
    }

    fn create_topic_as(
        &mut self,
        topic: &str,
        partitions: i32,
        replication: i16,
        assignment: &[Vec<i32>],
        configs: &[(String, String)],
    ) -> Result<()> {
        let assignments = assignment
            .iter()
            .enumerate()
            .map(|(i, brokers)| {
                CreatableReplicaAssignment::default()
                    .with_partition_index(i as i32)
                    .with_broker_ids(brokers.iter().map(|&b| BrokerId(b)).collect())
            })
            .collect();
        let t = CreatableTopic::default()
            .with_name(topic_name(topic))
            .with_num_partitions(partitions)
            .with_replication_factor(replication)
            .with_assignments(assignments)
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        CreatableTopicConfig::default()
                            .with_name(StrBytes::from_string(k.clone()))
                            .with_value(Some(StrBytes::from_string(v.clone())))
                    })
                    .collect(),
            );
        let req = CreateTopicsRequest::default().with_topics(vec![t]).with_timeout_ms(30_000);
        let ResponseKind::CreateTopics(r) = self.call_any(ApiKey::CreateTopics, CREATE_TOPICS_V, &req)? else {
            bail!("wrong answer to CreateTopics")
        };
        let result = r.topics.first().context("empty CreateTopics answer")?;
        check_said(
            result.error_code,
            result.error_message.as_ref().map(|m| m.as_str()),
            &format!("create topic {topic}"),
        )
    }

    pub fn delete_topic(&mut self, topic: &str) -> Result<()> {
        let req = DeleteTopicsRequest::default().with_topic_names(vec![topic_name(topic)]).with_timeout_ms(30_000);
        let ResponseKind::DeleteTopics(r) = self.call_any(ApiKey::DeleteTopics, DELETE_TOPICS_V, &req)? else {
            bail!("wrong answer to DeleteTopics")
        };
        check(r.responses.first().context("empty DeleteTopics answer")?.error_code, &format!("delete topic {topic}"))
    }

    /// (key, value, set on the topic) for every config the broker reports for `topic`.
    pub fn configs(&mut self, topic: &str) -> Result<Vec<(String, String, bool)>> {
        let req = DescribeConfigsRequest::default().with_resources(vec![
            DescribeConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(StrBytes::from_string(topic.to_string())),
        ]);
        let ResponseKind::DescribeConfigs(r) = self.call_any(ApiKey::DescribeConfigs, DESCRIBE_CONFIGS_V, &req)? else {
            bail!("wrong answer to DescribeConfigs")
        };
        let result = r.results.first().context("empty DescribeConfigs answer")?;
        check(result.error_code, &format!("describe configs of {topic}"))?;
        Ok(result
            .configs
            .iter()
            .map(|c| {
                let value = c.value.as_ref().map_or_else(|| "(null)".to_string(), |v| v.as_str().to_string());
                // DYNAMIC_TOPIC_CONFIG (1) means set on the topic.
                (c.name.as_str().to_string(), value, c.config_source == 1)
            })
            .collect())
    }

    /// Where the topic's `keys` get their values, as the broker lists it (DescribeConfigs synonyms): per
    /// key, (name, value, source) from the topic's own setting down to the broker's default.
    pub fn config_synonyms(&mut self, topic: &str, keys: &[&str]) -> Result<BTreeMap<String, Vec<Synonym>>> {
        let req = DescribeConfigsRequest::default().with_include_synonyms(true).with_resources(vec![
            DescribeConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(StrBytes::from_string(topic.to_string()))
                .with_configuration_keys(Some(keys.iter().map(|k| StrBytes::from_string(k.to_string())).collect())),
        ]);
        let ResponseKind::DescribeConfigs(r) = self.call_any(ApiKey::DescribeConfigs, DESCRIBE_CONFIGS_V, &req)? else {
            bail!("wrong answer to DescribeConfigs")
        };
        let result = r.results.first().context("empty DescribeConfigs answer")?;
        check(result.error_code, &format!("describe configs of {topic}"))?;
        Ok(result
            .configs
            .iter()
            .map(|c| {
                let synonyms = (c.synonyms.iter())
                    .map(|s| Synonym {
                        name: s.name.as_str().to_string(),
                        value: s.value.as_ref().map(|v| v.as_str().to_string()),
                        source: s.source,
                    })
                    .collect();
                (c.name.as_str().to_string(), synonyms)
            })
            .collect())
    }
}

/// One place a config's value may come from (DescribeConfigs' synonyms), the first in effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Synonym {
    pub name: String,
    /// `None`: the setting there is unset (shardlog's interval flush keys).
    pub value: Option<String>,
    /// Kafka's `ConfigSource`: 1 the topic's own setting, 4 the broker's as set at start, 5 a default.
    pub source: i8,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bootstrap_lists_are_split_and_checked() {
        assert_eq!(parse_bootstrap("a:1, b:2,").unwrap(), vec!["a:1", "b:2"]);
        assert_eq!(parse_bootstrap("[::1]:9092").unwrap(), vec!["[::1]:9092"]);
        for bad in ["", " , ", "a", "a:x", ":9092", "a:1,b"] {
            assert!(parse_bootstrap(bad).is_err(), "{bad:?}");
        }
    }
}
