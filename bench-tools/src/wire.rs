//! A blocking Kafka protocol connection for the load generators, and what they need from the cluster:
//! the versions a broker speaks and where each partition's leader is.
//!
//! Requests may be pipelined: [`Connection::split`] gives a sending half and a receiving half that run
//! on two threads, with answers matched to requests by order (Kafka answers a connection in order).

use std::collections::BTreeMap;
use std::io::{BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ResponseKind};
use kafka_protocol::protocol::Encodable;
use shardlog_broker::admin_cli::AdminClient;
use shardlog_net::kafka::{decode_response, encode_request};

const CLIENT_ID: &str = "shardlog-bench";
/// The largest response frame read.
const MAX_RESPONSE_BYTES: usize = 256 << 20;

/// Sends requests on a connection.
#[derive(Debug)]
pub struct Sender {
    stream: TcpStream,
    next_correlation_id: i32,
}

/// Reads the answers of a connection, in request order.
#[derive(Debug)]
pub struct Receiver {
    stream: BufReader<TcpStream>,
}

/// One connection to one broker.
#[derive(Debug)]
pub struct Connection {
    pub sender: Sender,
    pub receiver: Receiver,
}

impl Connection {
    pub fn open(addr: &str) -> Result<Connection> {
        let stream = TcpStream::connect(addr).with_context(|| format!("connect to {addr}"))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        let receiver = Receiver { stream: BufReader::with_capacity(1 << 20, stream.try_clone()?) };
        Ok(Connection { sender: Sender { stream, next_correlation_id: 0 }, receiver })
    }

    /// One request, one answer.
    pub fn call<T: Encodable>(&mut self, api: ApiKey, version: i16, body: &T) -> Result<ResponseKind> {
        let sent = self.sender.send(api, version, body)?;
        let (answered, response) = self.receiver.receive(api, version)?;
        if answered != sent {
            bail!("answer to request {answered} while waiting for {sent}");
        }
        Ok(response)
    }
}

impl Sender {
    /// Sends a request; returns its correlation id.
    pub fn send<T: Encodable>(&mut self, api: ApiKey, version: i16, body: &T) -> Result<i32> {
        let correlation_id = self.next_correlation_id;
        self.next_correlation_id = self.next_correlation_id.wrapping_add(1);
        let frame = encode_request(api, version, correlation_id, CLIENT_ID, body)?;
        self.stream.write_all(&frame).context("send request")?;
        Ok(correlation_id)
    }
}

impl Receiver {
    /// The next answer: its correlation id and body.
    pub fn receive(&mut self, api: ApiKey, version: i16) -> Result<(i32, ResponseKind)> {
        let mut size = [0u8; 4];
        self.stream.read_exact(&mut size).context("read answer (did the broker close the connection?)")?;
        let size = i32::from_be_bytes(size);
        if size < 0 || size as usize > MAX_RESPONSE_BYTES {
            bail!("answer frame of {size} bytes");
        }
        // Read into spare capacity: zeroing a fetch answer's tens of MiB first would cost as much as a copy.
        let mut frame = Vec::with_capacity(size as usize);
        (&mut self.stream).take(size as u64).read_to_end(&mut frame).context("read answer")?;
        if frame.len() != size as usize {
            bail!("the broker closed the connection {} bytes into a {size}-byte answer", frame.len());
        }
        Ok(decode_response(Bytes::from(frame), api, version)?)
    }
}

/// The newest version both this tool and the broker speak, within `ours`.
pub fn negotiate(conn: &mut Connection, api: ApiKey, ours: (i16, i16)) -> Result<i16> {
    let ResponseKind::ApiVersions(r) = conn.call(ApiKey::ApiVersions, 0, &ApiVersionsRequest::default())? else {
        bail!("wrong answer to ApiVersions")
    };
    let theirs = r
        .api_keys
        .iter()
        .find(|k| k.api_key == api as i16)
        .with_context(|| format!("the broker does not serve {api:?}"))?;
    let version = ours.1.min(theirs.max_version);
    if version < ours.0.max(theirs.min_version) {
        bail!(
            "no common {api:?} version: we speak {}..={}, the broker {}..={}",
            ours.0,
            ours.1,
            theirs.min_version,
            theirs.max_version
        );
    }
    Ok(version)
}

/// A topic's partitions and the address of each one's leader.
#[derive(Debug, Clone)]
pub struct TopicLayout {
    pub partitions: i32,
    /// Leader address per partition.
    pub leaders: BTreeMap<i32, String>,
}

impl TopicLayout {
    pub fn fetch(admin: &mut AdminClient, topic: &str) -> Result<TopicLayout> {
        let metadata = admin.metadata(Some(&[topic]))?;
        let brokers: BTreeMap<i32, String> =
            metadata.brokers.iter().map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port))).collect();
        let t = metadata.topics.first().context("empty Metadata answer")?;
        if t.error_code != 0 {
            bail!(
                "topic {topic}: error code {} ({:?})",
                t.error_code,
                kafka_protocol::ResponseError::try_from_code(t.error_code)
            );
        }
        let mut leaders = BTreeMap::new();
        for p in &t.partitions {
            let addr = brokers
                .get(&p.leader_id.0)
                .with_context(|| format!("{topic}-{} has no live leader", p.partition_index))?;
            leaders.insert(p.partition_index, addr.clone());
        }
        Ok(TopicLayout { partitions: t.partitions.len() as i32, leaders })
    }

    /// Partitions grouped by leader address.
    pub fn by_leader(&self) -> BTreeMap<String, Vec<i32>> {
        let mut out: BTreeMap<String, Vec<i32>> = BTreeMap::new();
        for (p, addr) in &self.leaders {
            out.entry(addr.clone()).or_default().push(*p);
        }
        out
    }
}
