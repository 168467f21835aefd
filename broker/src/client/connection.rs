//! One blocking Kafka protocol connection, for shardlog's own tools and tests.
//!
//! Requests may be pipelined: the sending half and the receiving half of a [`Connection`] can run on
//! two threads, with answers matched to requests by order (Kafka answers a connection in order), over
//! TLS as over plain TCP ([`super::transport`]).
//!
//! A connection opened with SASL authenticates before it is handed out: SaslHandshake v1 names the
//! mechanism, then SaslAuthenticate carries its messages (PLAIN's one, SCRAM's two, the server's
//! signature checked).

use std::io::{BufReader, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, ResponseKind, SaslAuthenticateRequest, SaslHandshakeRequest,
};
use kafka_protocol::protocol::{Encodable, StrBytes};
use rustls_pki_types::ServerName;
use shardlog_net::kafka::{decode_response, encode_request};

use super::command_config::{ClientSecurity, SaslLogin, SaslMechanism};
use super::scram::ScramClient;
use super::transport::{self, ReadHalf, WriteHalf};

/// The client id requests carry.
const CLIENT_ID: &str = "shardlog-tools";
/// The largest answer frame read.
const MAX_RESPONSE_BYTES: usize = 256 << 20;
/// How long connecting may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long an answer may take (a long-polling Fetch waits at most its max wait, far less).
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);
/// SaslHandshake v1: the mechanism's messages then travel in SaslAuthenticate requests (KIP-152).
const SASL_HANDSHAKE_V: i16 = 1;
/// SaslAuthenticate v2 (session lifetime in the answer, KIP-368).
const SASL_AUTHENTICATE_V: i16 = 2;

/// Sends requests on a connection.
#[derive(Debug)]
pub struct Sender {
    stream: WriteHalf,
    next_correlation_id: i32,
}

/// Reads the answers of a connection, in request order.
#[derive(Debug)]
pub struct Receiver {
    stream: BufReader<ReadHalf>,
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
    /// Connects to `addr` (`HOST:PORT`, every address it resolves to tried in turn) over plain TCP.
    pub fn open(addr: &str) -> Result<Connection> {
        Self::open_secured(addr, &ClientSecurity::plaintext())
    }

    /// Connects to `addr` as `security` says: TLS first if it has TLS, then SASL if it has SASL.
    pub fn open_secured(addr: &str, security: &ClientSecurity) -> Result<Connection> {
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
        let (read, write) = match &security.tls {
            None => transport::plain(stream)?,
            Some(config) => {
                let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let name = ServerName::try_from(host.to_string())
                    .with_context(|| format!("{host:?} is not a name TLS can check a certificate against"))?;
                let tls = rustls::ClientConnection::new(config.clone(), name).context("start TLS")?;
                transport::tls(stream, tls).with_context(|| format!("TLS handshake with {addr}"))?
            }
        };
        let receiver = Receiver { stream: BufReader::with_capacity(1 << 20, read) };
        let mut conn =
            Connection { sender: Sender { stream: write, next_correlation_id: 0 }, receiver, versions: None };
        if let Some(login) = &security.sasl {
            conn.authenticate(login).with_context(|| {
                format!("authenticate to {addr} as {} with {}", login.username, login.mechanism.name())
            })?;
        }
        Ok(conn)
    }

    /// The SASL exchange: SaslHandshake v1, then SaslAuthenticate for each message of the mechanism.
    fn authenticate(&mut self, login: &SaslLogin) -> Result<()> {
        let handshake =
            SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str(login.mechanism.name()));
        let ResponseKind::SaslHandshake(r) = self.call(ApiKey::SaslHandshake, SASL_HANDSHAKE_V, &handshake)? else {
            bail!("wrong answer to SaslHandshake")
        };
        if r.error_code != 0 {
            let offered: Vec<&str> = r.mechanisms.iter().map(|m| m.as_str()).collect();
            super::check(r.error_code, &format!("the listener offers {}", offered.join(", ")))?;
        }
        match login.mechanism {
            SaslMechanism::Plain => {
                let message = format!("\0{}\0{}", login.username, login.password);
                self.sasl_step(message.into_bytes())?;
            }
            SaslMechanism::Scram(mechanism) => {
                let mut scram = ScramClient::new(mechanism, &login.username, &login.password)?;
                let server_first = self.sasl_step(scram.client_first()?)?;
                let server_final = self.sasl_step(scram.client_final(&server_first)?)?;
                scram.verify_server(&server_final)?;
            }
        }
        Ok(())
    }

    /// One SaslAuthenticate round: our bytes out, the broker's back.
    fn sasl_step(&mut self, auth_bytes: Vec<u8>) -> Result<Bytes> {
        let req = SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(auth_bytes));
        let ResponseKind::SaslAuthenticate(r) = self.call(ApiKey::SaslAuthenticate, SASL_AUTHENTICATE_V, &req)? else {
            bail!("wrong answer to SaslAuthenticate")
        };
        super::check_said(r.error_code, r.error_message.as_ref().map(|m| m.as_str()), "SaslAuthenticate")?;
        Ok(r.auth_bytes)
    }

    /// How long an answer may take from now on (default [`READ_TIMEOUT`]).
    pub fn set_read_timeout(&mut self, timeout: Duration) -> Result<()> {
        // Both halves are the same socket: its receive timeout is the one that counts.
        self.receiver.stream.get_ref().socket().set_read_timeout(Some(timeout))?;
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
        // A TLS listener answers a plaintext request with a TLS alert or handshake record: content type
        // 21 or 22, then version 3.x.
        if matches!(size, [21 | 22, 3, 0..=4, _]) {
            bail!("the broker answered with TLS: this listener needs security.protocol=SSL or SASL_SSL");
        }
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
