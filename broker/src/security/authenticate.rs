//! The SASL exchange of a connection on a SASL listener: SaslHandshake (v0-1) picks a mechanism,
//! SaslAuthenticate (v0-2) carries its messages — or, after a v0 handshake, raw size-prefixed tokens
//! without Kafka headers, as the oldest clients send them — until the client has proved who it is.
//!
//! Rules, as Kafka keeps them:
//! - Before authentication only ApiVersions, SaslHandshake and SaslAuthenticate are served; anything
//!   else closes the connection (the caller's part). Frames are bounded by `sasl.server.max.receive.size`
//!   until then.
//! - A failed authentication is answered with its error `connection.failed.authentication.delay.ms`
//!   late, and the connection is closed.
//! - With `connections.max.reauth.ms` the session ends after that long (and no later than an
//!   OAUTHBEARER token's expiry); the client authenticates again on the same connection (KIP-368), as the
//!   same principal; a request other than re-authentication after the end closes the connection.
//! - PLAIN checks the password against the user's SCRAM credential, a key derivation of thousands of
//!   iterations: it runs on the shard's blocking thread, never on the shard, and each client address
//!   gets at most [`PLAIN_PER_ADDRESS_PER_SECOND`] of them.
//! - No password, proof or token is ever logged.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use kafka_protocol::ResponseError;
use kafka_protocol::messages::{SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse};
use kafka_protocol::protocol::StrBytes;

use super::principal::Principal;
use super::sasl::oauthbearer::{JwtValidator, OAuthBearerServer, OAuthBearerStep};
use super::sasl::plain::{self, PlainRequest};
use super::sasl::scram::{ScramCredential, ScramMechanism, ScramServer};
use super::sasl::{SaslError, SaslMechanism};
use crate::metadata::image::MetadataImage;

/// PLAIN key derivations one client address may cause per second; more wait their turn.
pub const PLAIN_PER_ADDRESS_PER_SECOND: u32 = 20;

/// Where SCRAM credentials are looked up (the cluster metadata).
pub trait Credentials {
    fn scram(&self, user: &str, mechanism: ScramMechanism) -> Option<ScramCredential>;
}

impl Credentials for MetadataImage {
    fn scram(&self, user: &str, mechanism: ScramMechanism) -> Option<ScramCredential> {
        let record = self.security().scram.get(user)?.get(&mechanism.type_code())?;
        Some(ScramCredential {
            salt: record.salt.clone(),
            iterations: record.iterations,
            stored_key: record.stored_key.clone(),
            server_key: record.server_key.clone(),
        })
    }
}

/// What a SASL listener's connections share.
#[derive(Debug)]
pub struct SaslListener {
    pub mechanisms: Vec<SaslMechanism>,
    /// Present when OAUTHBEARER is enabled.
    pub oauthbearer: Option<Arc<JwtValidator>>,
    pub failed_delay: Duration,
    /// `connections.max.reauth.ms`; `None` for 0.
    pub max_session: Option<Duration>,
    pub plain_limiter: Arc<PlainLimiter>,
}

/// Where a connection's SASL exchange stands.
#[derive(Debug)]
enum Exchange {
    /// Waiting for SaslHandshake.
    Idle,
    /// A mechanism was chosen; its first message is awaited.
    Chosen(SaslMechanism),
    /// SCRAM's server-first was sent; the client's final message is awaited.
    Scram(Box<ScramServer>),
    /// OAUTHBEARER refused the token; the client's `\x01` is awaited before the failure is final.
    OAuthRefused,
}

/// One connection's authentication.
#[derive(Debug)]
pub struct SaslSession {
    listener: Arc<SaslListener>,
    exchange: Exchange,
    /// Whether the handshake was v0: the mechanism's messages then come as raw tokens.
    raw: bool,
    principal: Option<Principal>,
    /// When the session ends (KIP-368).
    ends: Option<Instant>,
}

/// What the connection does after a SASL request.
#[derive(Debug)]
pub enum Outcome<T> {
    /// Send the answer and go on.
    Continue(T),
    /// Authenticated (again): send the answer; the connection now speaks for the principal.
    Authenticated(T, Principal),
    /// Failed: wait out the delay, send the answer, close.
    Failed(T, Duration),
}

/// A SaslAuthenticate answer or a raw token.
#[derive(Debug)]
pub struct Reply {
    pub bytes: Vec<u8>,
    pub error: Option<(ResponseError, String)>,
    pub session_lifetime_ms: i64,
}

impl SaslSession {
    pub fn new(listener: Arc<SaslListener>) -> SaslSession {
        SaslSession { listener, exchange: Exchange::Idle, raw: false, principal: None, ends: None }
    }

    /// The principal once authenticated.
    pub fn principal(&self) -> Option<&Principal> {
        self.principal.as_ref()
    }

    /// Whether the session has ended without re-authentication (KIP-368).
    pub fn expired(&self, now: Instant) -> bool {
        self.ends.is_some_and(|end| now >= end) && matches!(self.exchange, Exchange::Idle)
    }

    /// Whether the next frame is a raw token (after a v0 handshake), not a Kafka request.
    pub fn expects_raw_token(&self) -> bool {
        self.raw && !matches!(self.exchange, Exchange::Idle)
    }

    /// Answers SaslHandshake. An unknown mechanism fails the connection.
    pub fn handshake(&mut self, request: &SaslHandshakeRequest, version: i16) -> Outcome<SaslHandshakeResponse> {
        let offered = self.listener.mechanisms.iter().map(|m| StrBytes::from_static_str(m.name())).collect();
        let response = SaslHandshakeResponse::default().with_mechanisms(offered);
        if !matches!(self.exchange, Exchange::Idle) || (self.principal.is_some() && self.listener.max_session.is_none())
        {
            // A second handshake in the middle of an exchange, or re-authentication where sessions do
            // not expire.
            let response = response.with_error_code(ResponseError::IllegalSaslState.code());
            return Outcome::Failed(response, Duration::ZERO);
        }
        match SaslMechanism::from_name(request.mechanism.as_str()) {
            Ok(mechanism) if self.listener.mechanisms.contains(&mechanism) => {
                self.exchange = Exchange::Chosen(mechanism);
                self.raw = version == 0;
                Outcome::Continue(response)
            }
            _ => Outcome::Failed(
                response.with_error_code(ResponseError::UnsupportedSaslMechanism.code()),
                self.listener.failed_delay,
            ),
        }
    }

    /// Answers one message of the chosen mechanism (SaslAuthenticate's bytes, or a raw token).
    pub async fn authenticate(
        &mut self,
        message: &[u8],
        credentials: &dyn Credentials,
        client: IpAddr,
    ) -> Outcome<Reply> {
        let exchange = std::mem::replace(&mut self.exchange, Exchange::Idle);
        let step = match exchange {
            Exchange::Idle => {
                return self.fail("SaslAuthenticate before SaslHandshake".into(), ResponseError::IllegalSaslState);
            }
            Exchange::Chosen(SaslMechanism::Plain) => self.plain(message, credentials, client).await,
            Exchange::Chosen(mechanism @ (SaslMechanism::ScramSha256 | SaslMechanism::ScramSha512)) => {
                let scram = mechanism.scram().expect("a SCRAM mechanism");
                return self.scram_first(scram, message, credentials);
            }
            Exchange::Scram(mut server) => match server.client_final(message) {
                Ok(last) => {
                    let user = server.authenticated_user().expect("authenticated").to_string();
                    Ok((last, user, None))
                }
                Err(e) => Err(SaslError::from(e)),
            },
            Exchange::Chosen(SaslMechanism::OAuthBearer) => {
                let validator = self.listener.oauthbearer.clone().expect("OAUTHBEARER is enabled with its validator");
                match OAuthBearerServer::new().evaluate(&validator, message) {
                    Ok(OAuthBearerStep::Authenticated(token)) => {
                        let expiry = SystemTime::UNIX_EPOCH + Duration::from_secs(token.expires_at_unix_secs);
                        Ok((Vec::new(), token.principal, Some(expiry)))
                    }
                    Ok(OAuthBearerStep::ErrorReply(reply)) => {
                        // RFC 7628: the error goes to the client, whose `\x01` then ends the exchange.
                        self.exchange = Exchange::OAuthRefused;
                        return Outcome::Continue(Reply { bytes: reply, error: None, session_lifetime_ms: 0 });
                    }
                    Err(e) => Err(SaslError::from(e)),
                }
            }
            Exchange::OAuthRefused => {
                return self.fail("the OAUTHBEARER token was refused".into(), ResponseError::SaslAuthenticationFailed);
            }
        };
        match step {
            Ok((bytes, user, expiry)) => self.authenticated(bytes, user, expiry),
            Err(e) => self.fail(e.to_string(), ResponseError::SaslAuthenticationFailed),
        }
    }

    fn scram_first(
        &mut self,
        mechanism: ScramMechanism,
        message: &[u8],
        credentials: &dyn Credentials,
    ) -> Outcome<Reply> {
        let mut server = match ScramServer::new(mechanism) {
            Ok(server) => server,
            Err(e) => return self.fail(e.to_string(), ResponseError::SaslAuthenticationFailed),
        };
        let user = match server.client_first(message) {
            Ok(user) => user.to_string(),
            Err(e) => return self.fail(e.to_string(), ResponseError::SaslAuthenticationFailed),
        };
        // An unknown user goes on with a made-up credential and fails at the proof, like a wrong password.
        let credential = credentials.scram(&user, mechanism);
        match server.server_first(credential.as_ref()) {
            Ok(first) => {
                self.exchange = Exchange::Scram(Box::new(server));
                Outcome::Continue(Reply { bytes: first, error: None, session_lifetime_ms: 0 })
            }
            Err(e) => self.fail(e.to_string(), ResponseError::SaslAuthenticationFailed),
        }
    }

    async fn plain(
        &mut self,
        message: &[u8],
        credentials: &dyn Credentials,
        client: IpAddr,
    ) -> Result<(Vec<u8>, String, Option<SystemTime>), SaslError> {
        let request = PlainRequest::parse(message)?;
        let user = request.username().to_string();
        let found = [ScramMechanism::Sha256, ScramMechanism::Sha512]
            .into_iter()
            .find_map(|m| credentials.scram(&user, m).map(|c| (m, c)));
        self.listener.plain_limiter.wait_turn(client).await;
        let (mechanism, credential) = match found {
            Some((m, c)) => (m, Some(c)),
            None => (ScramMechanism::Sha256, None),
        };
        // The derivation takes milliseconds: off the shard.
        let checked =
            glommio::executor().spawn_blocking(move || plain::verify(&request, mechanism, credential.as_ref())).await;
        checked?;
        Ok((Vec::new(), user, None))
    }

    fn authenticated(&mut self, bytes: Vec<u8>, user: String, expiry: Option<SystemTime>) -> Outcome<Reply> {
        let principal = Principal::user(&user);
        if let Some(before) = &self.principal
            && *before != principal
        {
            // KIP-368: re-authentication may not change who the connection speaks for.
            return self.fail(
                format!("re-authenticated as {principal}, not as {before}"),
                ResponseError::SaslAuthenticationFailed,
            );
        }
        let mut lifetime = self.listener.max_session;
        if let (Some(max), Some(expiry)) = (lifetime, expiry) {
            let left = expiry.duration_since(SystemTime::now()).unwrap_or(Duration::ZERO);
            lifetime = Some(max.min(left));
        }
        self.ends = lifetime.map(|l| Instant::now() + l);
        self.principal = Some(principal.clone());
        self.raw = false;
        let session_lifetime_ms = lifetime.map_or(0, |l| l.as_millis().max(1) as i64);
        Outcome::Authenticated(Reply { bytes, error: None, session_lifetime_ms }, principal)
    }

    /// A failure: `reason` is for the broker's log; the client is told only that it failed.
    fn fail(&mut self, reason: String, error: ResponseError) -> Outcome<Reply> {
        self.exchange = Exchange::Idle;
        let reply = Reply { bytes: Vec::new(), error: Some((error, reason)), session_lifetime_ms: 0 };
        Outcome::Failed(reply, self.listener.failed_delay)
    }
}

/// The SaslAuthenticate answer for a reply (the message said to the client never carries a secret).
pub fn authenticate_response(reply: &Reply) -> SaslAuthenticateResponse {
    let response = SaslAuthenticateResponse::default()
        .with_auth_bytes(bytes::Bytes::copy_from_slice(&reply.bytes))
        .with_session_lifetime_ms(reply.session_lifetime_ms);
    match &reply.error {
        None => response,
        Some((error, _)) => {
            let message = match error {
                ResponseError::SaslAuthenticationFailed => "Authentication failed: invalid credentials".to_string(),
                other => format!("{other:?}"),
            };
            response.with_error_code(error.code()).with_error_message(Some(StrBytes::from_string(message)))
        }
    }
}

/// Spaces PLAIN key derivations per client address: at most [`PLAIN_PER_ADDRESS_PER_SECOND`] each.
/// Bounded: addresses not seen for a while are forgotten once many are held.
#[derive(Debug, Default)]
pub struct PlainLimiter {
    /// The earliest time each address's next derivation may start.
    next: Mutex<HashMap<IpAddr, Instant>>,
}

/// Addresses remembered before idle ones are dropped.
const LIMITER_ADDRESSES_MAX: usize = 4096;

impl PlainLimiter {
    async fn wait_turn(&self, client: IpAddr) {
        let spacing = Duration::from_secs(1) / PLAIN_PER_ADDRESS_PER_SECOND;
        let start = {
            let mut next = self.next.lock().expect("never poisoned: nothing panics holding it");
            let now = Instant::now();
            if next.len() >= LIMITER_ADDRESSES_MAX {
                next.retain(|_, at| *at > now);
            }
            let slot = next.entry(client).or_insert(now);
            let start = (*slot).max(now);
            *slot = start + spacing;
            start
        };
        let wait = start.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            glommio::timer::sleep(wait).await;
        }
    }
}
