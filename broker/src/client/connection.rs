//! One blocking Kafka protocol connection, for shardlog's own tools and tests.
//!
//! Requests may be pipelined: the sending half and the receiving half of a [`Connection`] can run on
//! two threads, with answers matched to requests by order (Kafka answers a connection in order).

use std::io::{BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse, ResponseKind};
use kafka_protocol::protocol::Encodable;
use shardlog_net::kafka::{decode_response, encode_request};

/// The client id requests carry.
const CLIENT_ID: &str = "shardlog-tools";
/// The largest answer frame read.
const MAX_RESPONSE_BYTES: usize = 256 << 20;
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an answer may take (a long-polling Fetch waits at most its max wait, far less).
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);

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
    /// What the broker answered to ApiVersions, asked once.
    versions: Option<ApiVersionsResponse>,
}

impl Connection {
    /// Connects to `addr` (`HOST:PORT`, every address it resolves to tried in turn).
    pub fn open(addr: &str) -> Result<Connection> {
        let mut last_error = None;
        let resolved = addr.to_socket_addrs().with_context(|| format!("resolve {addr:?} (HOST:PORT)"))?;
        let stream = resolved
            .into_iter()
            .find_map(|a| TcpStream::connect_timeout(&a, CONNECT_TIMEOUT).map_err(|e| last_error = Some(e)).ok());
        let stream = match (stream, last_error) {
            (Some(stream), _) => stream,
            (None, Some(e)) => return Err(e).with_context(|| format!("connect to {addr}")),
            (None, None) => bail!("{addr:?} resolves to no address"),
        };
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(READ_TIMEOUT))?;
        let receiver = Receiver { stream: BufReader::with_capacity(1 << 20, stream.try_clone()?) };
        Ok(Connection { sender: Sender { stream, next_correlation_id: 0 }, receiver, versions: None })
    }

    /// How long an answer may take from now on (default [`READ_TIMEOUT`]).
    pub fn set_read_timeout(&mut self, timeout: Duration) -> Result<()> {
        // Both halves are the same socket: its receive timeout is the one that counts.
        self.receiver.stream.get_ref().set_read_timeout(Some(timeout))?;
        Ok(())
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

    /// The broker's ApiVersions answer (v0, which every broker version answers), asked once.
    pub fn versions(&mut self) -> Result<&ApiVersionsResponse> {
        if self.versions.is_none() {
            let ResponseKind::ApiVersions(r) = self.call(ApiKey::ApiVersions, 0, &ApiVersionsRequest::default())?
            else {
                bail!("wrong answer to ApiVersions")
            };
            if let Some(e) = kafka_protocol::ResponseError::try_from_code(r.error_code) {
                bail!("ApiVersions: {e}");
            }
            self.versions = Some(r);
        }
        Ok(self.versions.as_ref().expect("asked above"))
    }

    /// The newest version of `api` both this client (`ours`, inclusive) and the broker speak.
    pub fn negotiate(&mut self, api: ApiKey, ours: (i16, i16)) -> Result<i16> {
        let theirs = self
            .versions()?
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
