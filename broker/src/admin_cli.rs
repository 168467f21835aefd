//! `shardlog topic ...`: topic administration over the Kafka protocol, so it works against any
//! Kafka-compatible broker. A small blocking client: one connection, one request at a time.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use kafka_protocol::ResponseError;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, DeleteTopicsRequest, DescribeConfigsRequest, ListOffsetsRequest, MetadataRequest,
    MetadataResponse, ResponseKind, TopicName,
};
use kafka_protocol::protocol::{Encodable, StrBytes};
use shardlog_net::kafka::{decode_response, encode_request};

/// Versions this client speaks (widely supported ones). Metadata goes up to v12 (topic ids, from v10)
/// when the broker has it.
const METADATA_V: i16 = 9;
const METADATA_V_MAX: i16 = 12;
const CREATE_TOPICS_V: i16 = 5;
const DELETE_TOPICS_V: i16 = 4;
const LIST_OFFSETS_V: i16 = 5;
const DESCRIBE_CONFIGS_V: i16 = 2;

/// A blocking Kafka protocol connection.
#[derive(Debug)]
pub struct AdminClient {
    stream: TcpStream,
    next_correlation_id: i32,
    metadata_version: i16,
}

fn name(n: &str) -> TopicName {
    TopicName(StrBytes::from_string(n.to_string()))
}

fn check(code: i16, what: &str) -> Result<()> {
    match ResponseError::try_from_code(code) {
        None => Ok(()),
        Some(e) => bail!("{what}: {e} (error code {code})"),
    }
}

impl AdminClient {
    pub fn connect(bootstrap: &str) -> Result<AdminClient> {
        let stream = TcpStream::connect(bootstrap).with_context(|| format!("connect to {bootstrap}"))?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        let mut client = AdminClient { stream, next_correlation_id: 1, metadata_version: METADATA_V };
        // ApiVersions v0 is answered by every broker version; use the newest Metadata both sides have.
        let ResponseKind::ApiVersions(versions) =
            client.call(ApiKey::ApiVersions, 0, &kafka_protocol::messages::ApiVersionsRequest::default())?
        else {
            bail!("wrong response")
        };
        check(versions.error_code, "ApiVersions")?;
        if let Some(metadata) = versions.api_keys.iter().find(|k| k.api_key == ApiKey::Metadata as i16) {
            client.metadata_version = METADATA_V_MAX.min(metadata.max_version).max(METADATA_V);
        }
        Ok(client)
    }

    fn call<T: Encodable>(&mut self, api: ApiKey, version: i16, body: &T) -> Result<ResponseKind> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id += 1;
        let out = encode_request(api, version, correlation_id, "shardlog-admin", body)?;
        self.stream.write_all(&out).context("send request")?;
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).context("read response (the broker closed the connection?)")?;
        let size = i32::from_be_bytes(size);
        if !(0..=(256 << 20)).contains(&size) {
            bail!("response frame of {size} bytes");
        }
        let mut frame = vec![0u8; size as usize];
        self.stream.read_exact(&mut frame)?;
        let (answered, body) = decode_response(Bytes::from(frame), api, version)?;
        if answered != correlation_id {
            bail!("response to request {answered} while waiting for {correlation_id}");
        }
        Ok(body)
    }

    pub fn create_topic(
        &mut self,
        topic: &str,
        partitions: i32,
        replication: i16,
        configs: &[(String, String)],
    ) -> Result<()> {
        let t = CreatableTopic::default()
            .with_name(name(topic))
            .with_num_partitions(partitions)
            .with_replication_factor(replication)
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
        let ResponseKind::CreateTopics(r) = self.call(ApiKey::CreateTopics, CREATE_TOPICS_V, &req)? else {
            bail!("wrong response")
        };
        let result = r.topics.first().context("empty CreateTopics response")?;
        let detail = result.error_message.as_ref().map(|m| m.as_str().to_string()).unwrap_or_default();
        check(result.error_code, &format!("create topic {topic} {detail}"))
    }

    pub fn delete_topic(&mut self, topic: &str) -> Result<()> {
        let req = DeleteTopicsRequest::default().with_topic_names(vec![name(topic)]).with_timeout_ms(30_000);
        let ResponseKind::DeleteTopics(r) = self.call(ApiKey::DeleteTopics, DELETE_TOPICS_V, &req)? else {
            bail!("wrong response")
        };
        check(r.responses.first().context("empty DeleteTopics response")?.error_code, &format!("delete topic {topic}"))
    }

    pub fn metadata(&mut self, topics: Option<&[&str]>) -> Result<MetadataResponse> {
        let req = MetadataRequest::default().with_allow_auto_topic_creation(false).with_topics(
            topics.map(|ts| ts.iter().map(|t| MetadataRequestTopic::default().with_name(Some(name(t)))).collect()),
        );
        let ResponseKind::Metadata(r) = self.call(ApiKey::Metadata, self.metadata_version, &req)? else {
            bail!("wrong response")
        };
        Ok(r)
    }

    /// (earliest, latest) offsets of each partition.
    pub fn offsets(&mut self, topic: &str, partitions: i32) -> Result<Vec<(i64, i64)>> {
        let mut ends = Vec::new();
        for timestamp in [-2i64, -1] {
            let req = ListOffsetsRequest::default()
                .with_replica_id(kafka_protocol::messages::BrokerId(-1))
                .with_topics(vec![
                    ListOffsetsTopic::default().with_name(name(topic)).with_partitions(
                        (0..partitions)
                            .map(|p| ListOffsetsPartition::default().with_partition_index(p).with_timestamp(timestamp))
                            .collect(),
                    ),
                ]);
            let ResponseKind::ListOffsets(r) = self.call(ApiKey::ListOffsets, LIST_OFFSETS_V, &req)? else {
                bail!("wrong response")
            };
            let mut by_partition = BTreeMap::new();
            for p in r.topics.iter().flat_map(|t| &t.partitions) {
                check(p.error_code, &format!("list offsets of {topic}-{}", p.partition_index))?;
                by_partition.insert(p.partition_index, p.offset);
            }
            ends.push(by_partition);
        }
        Ok((0..partitions)
            .map(|p| (ends[0].get(&p).copied().unwrap_or(-1), ends[1].get(&p).copied().unwrap_or(-1)))
            .collect())
    }

    /// (key, value, set on the topic) for every config the broker reports.
    pub fn configs(&mut self, topic: &str) -> Result<Vec<(String, String, bool)>> {
        let req = DescribeConfigsRequest::default().with_resources(vec![
            DescribeConfigsResource::default()
                .with_resource_type(2)
                .with_resource_name(StrBytes::from_string(topic.to_string())),
        ]);
        let ResponseKind::DescribeConfigs(r) = self.call(ApiKey::DescribeConfigs, DESCRIBE_CONFIGS_V, &req)? else {
            bail!("wrong response")
        };
        let result = r.results.first().context("empty DescribeConfigs response")?;
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
}

/// `topic list`: one name per line, sorted.
pub fn list(client: &mut AdminClient) -> Result<String> {
    let metadata = client.metadata(None)?;
    let mut names: Vec<String> =
        metadata.topics.iter().filter_map(|t| t.name.as_ref().map(|n| n.0.as_str().to_string())).collect();
    names.sort();
    Ok(names.iter().map(|n| format!("{n}\n")).collect())
}

/// `topic describe`: partitions with leader, replicas, ISR and offsets, then the configs.
pub fn describe(client: &mut AdminClient, topic: &str) -> Result<String> {
    let metadata = client.metadata(Some(&[topic]))?;
    let t = metadata.topics.first().context("empty Metadata response")?;
    check(t.error_code, &format!("topic {topic}"))?;
    let mut partitions: Vec<_> = t.partitions.iter().collect();
    partitions.sort_by_key(|p| p.partition_index);
    let offsets = client.offsets(topic, partitions.len() as i32)?;
    let id = if t.topic_id.is_nil() { "-".to_string() } else { t.topic_id.to_string() };
    let mut out = format!("Topic: {topic}\tTopicId: {id}\tPartitionCount: {}\n", partitions.len());
    let ids =
        |v: &[kafka_protocol::messages::BrokerId]| v.iter().map(|b| b.0.to_string()).collect::<Vec<_>>().join(",");
    for (p, (start, end)) in partitions.iter().zip(&offsets) {
        out.push_str(&format!(
            "\tPartition: {}\tLeader: {}\tEpoch: {}\tReplicas: {}\tIsr: {}\tLogStartOffset: {start}\tLogEndOffset: {end}\n",
            p.partition_index,
            p.leader_id.0,
            p.leader_epoch,
            ids(&p.replica_nodes),
            ids(&p.isr_nodes),
        ));
    }
    out.push_str("Configs:\n");
    for (key, value, set) in client.configs(topic)? {
        out.push_str(&format!("\t{key}={value}{}\n", if set { "" } else { " (default)" }));
    }
    Ok(out)
}
