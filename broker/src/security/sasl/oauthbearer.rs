//! OAUTHBEARER (RFC 7628) as Kafka's `OAuthBearerSaslServer` and its JWT validator run it: the
//! client's initial response ([`ClientInitialResponse`]), the check of its JWT against keys from a
//! JWKS file ([`JwtValidator`]), and the conversation ([`OAuthBearerServer`]): accept, or answer
//! RFC 7628's `{"status":"invalid_token"}`, wait for the client's single `\x01`, and fail.
//!
//! Keys come only from a local JWKS file (`sasl.oauthbearer.jwks.endpoint.url` as a `file:` URL or
//! a path): the broker does not fetch keys over the network, so an `http(s)` URL is refused. Publish
//! the identity provider's JWKS to the file (a cron job, a config-management run). The file is
//! re-read when its modification time or size changes, and when a token names an unknown `kid` —
//! at most once per [`JWKS_MIN_RELOAD_INTERVAL`], so a stream of made-up kids cannot make the
//! broker re-read the file constantly. A file that fails to parse on re-read leaves the old keys
//! in force (it may be half-written).
//!
//! A token must be signed with an asymmetric algorithm (RS*, PS*, ES256, ES384, EdDSA) by the JWKS
//! key its header's `kid` names; `alg: none` and HMAC are refused (a JWKS holds public keys, and a
//! shared secret in it would let anyone who reads it mint tokens). `exp` is required; `nbf` and
//! `iat` are honoured with `sasl.oauthbearer.clock.skew.seconds`; issuer and audience are checked
//! when configured; the principal is the `sasl.oauthbearer.sub.claim.name` claim.
//!
//! Bounds: the initial response (and so the token) at most [`INITIAL_RESPONSE_MAX_BYTES`], the JWKS
//! file at most [`JWKS_FILE_MAX_BYTES`]. No token is ever part of an error or a Debug form.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::{AlgorithmParameters, Jwk, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

/// The longest client initial response accepted (the token is most of it).
pub const INITIAL_RESPONSE_MAX_BYTES: usize = 64 * 1024;
/// The largest JWKS file read.
pub const JWKS_FILE_MAX_BYTES: u64 = 1024 * 1024;
/// The least time between two re-reads of the JWKS file caused by unknown kids.
pub const JWKS_MIN_RELOAD_INTERVAL: Duration = Duration::from_secs(10);
/// RFC 7628's error reply for a token that fails validation.
pub const INVALID_TOKEN_REPLY: &[u8] = br#"{"status":"invalid_token"}"#;
/// The largest `sasl.oauthbearer.clock.skew.seconds` accepted: beyond an hour, expiry means little.
pub const CLOCK_SKEW_SECONDS_MAX: u64 = 3600;

/// Why an OAUTHBEARER login or the validator's setup failed. Carries no token. In three groups:
/// the conversation and its initial response, the settings and the JWKS file, the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OAuthBearerError {
    // The conversation.
    #[error("OAUTHBEARER initial response longer than {INITIAL_RESPONSE_MAX_BYTES} bytes")]
    TooLong,
    #[error("malformed OAUTHBEARER initial response: {0}")]
    Malformed(&'static str),
    #[error("Authentication failed: authorization id differs from the token's principal")]
    AuthorizationIdMismatch,
    #[error("OAUTHBEARER step out of order")]
    OutOfOrder,
    // The settings and the JWKS file (the broker refuses to start with these).
    #[error("{name} {reason}")]
    InvalidSetting { name: &'static str, reason: &'static str },
    #[error(
        "sasl.oauthbearer.jwks.endpoint.url {url:?} is not supported: the broker reads keys only \
         from a local JWKS file (a file: URL or a path)"
    )]
    JwksUrlNotSupported { url: String },
    #[error("read JWKS file {path}: {reason}")]
    JwksRead { path: PathBuf, reason: String },
    #[error("JWKS file {path} holds no usable public signing key with a kid")]
    JwksNoUsableKeys { path: PathBuf },
    // The token.
    #[error("malformed token: {0}")]
    TokenMalformed(&'static str),
    #[error("token algorithm none is refused")]
    AlgorithmNone,
    #[error("token algorithm {alg} is refused: HMAC keys cannot come from a JWKS")]
    AlgorithmHmac { alg: String },
    #[error("token algorithm is not supported")]
    AlgorithmUnsupported,
    #[error("token header has no kid")]
    MissingKeyId,
    #[error("token kid {kid:?} is not in the JWKS")]
    UnknownKeyId { kid: String },
    #[error("token algorithm does not fit the JWKS key")]
    KeyAlgorithmMismatch,
    #[error("token signature is invalid")]
    BadSignature,
    #[error("token has expired")]
    Expired,
    #[error("token is not valid yet (nbf)")]
    NotYetValid,
    #[error("token was issued in the future (iat)")]
    IssuedInFuture,
    #[error("token issuer is not the expected one")]
    WrongIssuer,
    #[error("token audience is not an expected one")]
    WrongAudience,
    #[error("token lacks the {claim} claim")]
    MissingClaim { claim: String },
    #[error("token claim {claim} is malformed")]
    InvalidClaim { claim: String },
}

/// The client's first message: `n,[a=authzid],^Aauth=Bearer <token>^A[key=value^A]*^A`.
/// Debug hides the token.
#[derive(Clone, PartialEq, Eq)]
pub struct ClientInitialResponse {
    authzid: Option<String>,
    token: String,
    extensions: BTreeMap<String, String>,
}

impl ClientInitialResponse {
    /// Parses the message by Kafka's `OAuthBearerClientInitialResponse` rules: keys `[A-Za-z]+`,
    /// values `[\x21-\x7E \t\r\n]+`, `auth` required (scheme `Bearer`, any case) and not an
    /// extension, the token `[-_.A-Za-z0-9]+`.
    pub fn parse(message: &[u8]) -> Result<Self, OAuthBearerError> {
        if message.len() > INITIAL_RESPONSE_MAX_BYTES {
            return Err(OAuthBearerError::TooLong);
        }
        let text = std::str::from_utf8(message).map_err(|_| OAuthBearerError::Malformed("not UTF-8"))?;
        let rest = text.strip_prefix("n,").ok_or(OAuthBearerError::Malformed("gs2 header"))?;
        let (authzid, rest) = rest.split_once(',').ok_or(OAuthBearerError::Malformed("gs2 header"))?;
        let authzid = match authzid {
            "" => None,
            _ => {
                let name = authzid.strip_prefix("a=").ok_or(OAuthBearerError::Malformed("authzid"))?;
                if !name.bytes().all(|b| (0x01..=0x7f).contains(&b)) {
                    return Err(OAuthBearerError::Malformed("authzid"));
                }
                Some(super::scram::decode_saslname(name).map_err(|_| OAuthBearerError::Malformed("authzid"))?)
            }
        };
        let pairs = rest
            .strip_prefix('\x01')
            .and_then(|rest| rest.strip_suffix('\x01'))
            .ok_or(OAuthBearerError::Malformed("separators"))?;
        if !pairs.is_empty() && !pairs.ends_with('\x01') {
            return Err(OAuthBearerError::Malformed("separators"));
        }
        let mut auth = None;
        let mut extensions = BTreeMap::new();
        for pair in pairs.split_terminator('\x01') {
            let (key, value) = pair.split_once('=').ok_or(OAuthBearerError::Malformed("key=value"))?;
            let key_ok = !key.is_empty() && key.bytes().all(|b| b.is_ascii_alphabetic());
            let value_ok =
                !value.is_empty() && value.bytes().all(|b| matches!(b, 0x21..=0x7e | b' ' | b'\t' | b'\r' | b'\n'));
            if !key_ok || !value_ok {
                return Err(OAuthBearerError::Malformed("key=value"));
            }
            if key == "auth" {
                if auth.replace(value).is_some() {
                    return Err(OAuthBearerError::Malformed("auth given twice"));
                }
            } else if extensions.insert(key.to_owned(), value.to_owned()).is_some() {
                return Err(OAuthBearerError::Malformed("extension given twice"));
            }
        }
        let auth = auth.ok_or(OAuthBearerError::Malformed("no auth"))?;
        let (scheme, token) = auth.split_once(' ').ok_or(OAuthBearerError::Malformed("auth"))?;
        let token = token.trim_start_matches(' ');
        let token_ok =
            !token.is_empty() && token.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !scheme.eq_ignore_ascii_case("bearer") || !token_ok {
            return Err(OAuthBearerError::Malformed("auth"));
        }
        Ok(ClientInitialResponse { authzid, token: token.to_owned(), extensions })
    }

    /// The authorization id, when the client gave one.
    pub fn authzid(&self) -> Option<&str> {
        self.authzid.as_deref()
    }

    /// The bearer token (a JWT).
    pub fn token(&self) -> &str {
        &self.token
    }

    /// The SASL extensions besides `auth` (Kafka accepts them all; nothing here uses them).
    pub fn extensions(&self) -> &BTreeMap<String, String> {
        &self.extensions
    }
}

impl fmt::Debug for ClientInitialResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientInitialResponse")
            .field("authzid", &self.authzid)
            .field("extensions", &self.extensions)
            .finish_non_exhaustive()
    }
}

/// The validator's settings, with Kafka's names; the config layer fills it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OAuthBearerSettings {
    /// `sasl.oauthbearer.jwks.endpoint.url`: a `file:` URL or a path to a JWKS JSON file.
    pub jwks_endpoint_url: String,
    /// `sasl.oauthbearer.expected.issuer`: when set, the `iss` claim must equal it.
    pub expected_issuer: Option<String>,
    /// `sasl.oauthbearer.expected.audience`: when not empty, `aud` must name one of these.
    pub expected_audience: Vec<String>,
    /// `sasl.oauthbearer.sub.claim.name` (default `sub`): the claim that is the principal.
    pub sub_claim_name: String,
    /// `sasl.oauthbearer.clock.skew.seconds` (default 30): leeway for `exp`, `nbf` and `iat`.
    pub clock_skew_seconds: u64,
}

impl OAuthBearerSettings {
    // Kafka's setting names, and the defaults of those that have one.
    pub const JWKS_ENDPOINT_URL: &'static str = "sasl.oauthbearer.jwks.endpoint.url";
    pub const EXPECTED_ISSUER: &'static str = "sasl.oauthbearer.expected.issuer";
    pub const EXPECTED_AUDIENCE: &'static str = "sasl.oauthbearer.expected.audience";
    pub const SUB_CLAIM_NAME: &'static str = "sasl.oauthbearer.sub.claim.name";
    pub const CLOCK_SKEW_SECONDS: &'static str = "sasl.oauthbearer.clock.skew.seconds";
    pub const DEFAULT_SUB_CLAIM_NAME: &'static str = "sub";
    pub const DEFAULT_CLOCK_SKEW_SECONDS: u64 = 30;

    /// Settings with Kafka's defaults and the given JWKS location.
    pub fn new(jwks_endpoint_url: impl Into<String>) -> Self {
        OAuthBearerSettings {
            jwks_endpoint_url: jwks_endpoint_url.into(),
            expected_issuer: None,
            expected_audience: Vec::new(),
            sub_claim_name: Self::DEFAULT_SUB_CLAIM_NAME.to_owned(),
            clock_skew_seconds: Self::DEFAULT_CLOCK_SKEW_SECONDS,
        }
    }

    /// The JWKS file `jwks_endpoint_url` names: `file:///p`, `file://localhost/p`, `file:p` or a
    /// plain path (percent-escapes are not decoded); any other URL is refused.
    pub fn jwks_path(&self) -> Result<PathBuf, OAuthBearerError> {
        let url = self.jwks_endpoint_url.as_str();
        let refused = || OAuthBearerError::JwksUrlNotSupported { url: url.to_owned() };
        let path = match url.strip_prefix("file:") {
            Some(rest) => match rest.strip_prefix("//") {
                Some(authority_and_path) if authority_and_path.starts_with('/') => authority_and_path,
                Some(authority_and_path) => {
                    authority_and_path.strip_prefix("localhost").filter(|p| p.starts_with('/')).ok_or_else(refused)?
                }
                None => rest,
            },
            None if url.contains("://") => return Err(refused()),
            None => url,
        };
        if path.is_empty() {
            return Err(refused());
        }
        Ok(PathBuf::from(path))
    }
}

/// What a valid token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidatedToken {
    /// The principal's name (the sub claim); the principal is `User:` + this.
    pub principal: String,
    /// The `exp` claim, seconds since the Unix epoch: the session's end for re-authentication.
    pub expires_at_unix_secs: u64,
}

/// Checks JWTs against the keys of a JWKS file. Shareable between threads.
#[derive(Debug)]
pub struct JwtValidator {
    settings: OAuthBearerSettings,
    path: PathBuf,
    keys: Mutex<KeySet>,
}

/// A JWKS file's version as the key cache tells them apart: modification time and size.
type FileStamp = (SystemTime, u64);
type KeysByKid = HashMap<String, Jwk>;

/// The keys last read, and when and from which version of the file.
#[derive(Debug)]
struct KeySet {
    by_kid: KeysByKid,
    /// The version of the file the keys were read from (or last tried).
    stamp: FileStamp,
    loaded_at: Instant,
    loads: u64,
}

impl JwtValidator {
    /// Reads the JWKS file; fails if the URL is not a local file, the file holds no usable key, the
    /// clock skew is above [`CLOCK_SKEW_SECONDS_MAX`] or the sub claim name is empty.
    pub fn new(settings: OAuthBearerSettings) -> Result<Self, OAuthBearerError> {
        if settings.clock_skew_seconds > CLOCK_SKEW_SECONDS_MAX {
            return Err(OAuthBearerError::InvalidSetting {
                name: OAuthBearerSettings::CLOCK_SKEW_SECONDS,
                reason: "must be at most 3600",
            });
        }
        if settings.sub_claim_name.is_empty() {
            return Err(OAuthBearerError::InvalidSetting {
                name: OAuthBearerSettings::SUB_CLAIM_NAME,
                reason: "must not be empty",
            });
        }
        let path = settings.jwks_path()?;
        let (by_kid, stamp) = read_jwks(&path)?;
        let keys = KeySet { by_kid, stamp, loaded_at: Instant::now(), loads: 1 };
        Ok(JwtValidator { settings, path, keys: Mutex::new(keys) })
    }

    /// The settings this validator checks tokens with.
    pub fn settings(&self) -> &OAuthBearerSettings {
        &self.settings
    }

    /// Checks a token's signature and claims; returns its principal and expiry.
    pub fn validate(&self, token: &str) -> Result<ValidatedToken, OAuthBearerError> {
        self.validate_at(token, Instant::now())
    }

    fn validate_at(&self, token: &str, now: Instant) -> Result<ValidatedToken, OAuthBearerError> {
        if token.len() > INITIAL_RESPONSE_MAX_BYTES {
            return Err(OAuthBearerError::TokenMalformed("too long"));
        }
        let (algorithm, kid) = read_header(token)?;
        let jwk = self.key(&kid, now)?;
        if jwk.common.key_algorithm.is_some_and(|key_alg| key_alg.to_string() != format!("{algorithm:?}")) {
            return Err(OAuthBearerError::KeyAlgorithmMismatch);
        }
        let key = DecodingKey::from_jwk(&jwk).map_err(|_| OAuthBearerError::KeyAlgorithmMismatch)?;
        if key.family() != algorithm.family() {
            return Err(OAuthBearerError::KeyAlgorithmMismatch);
        }
        let mut validation = Validation::new(algorithm);
        validation.leeway = self.settings.clock_skew_seconds;
        validation.validate_nbf = true;
        let mut required = vec!["exp"];
        if let Some(issuer) = &self.settings.expected_issuer {
            validation.set_issuer(&[issuer]);
            required.push("iss");
        }
        if self.settings.expected_audience.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&self.settings.expected_audience);
            required.push("aud");
        }
        validation.set_required_spec_claims(&required);
        let claims = jsonwebtoken::decode::<serde_json::Map<String, Value>>(token, &key, &validation)
            .map_err(|error| token_error(error.into_kind()))?
            .claims;
        let now_unix_secs = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
        let numeric = |claim: &str| match claims.get(claim) {
            None => Ok(None),
            Some(value) => value
                .as_f64()
                .filter(|v| v.is_finite() && *v >= 0.0)
                .map(|v| Some(v as u64))
                .ok_or_else(|| OAuthBearerError::InvalidClaim { claim: claim.to_owned() }),
        };
        if numeric("iat")?.is_some_and(|iat| iat > now_unix_secs.saturating_add(self.settings.clock_skew_seconds)) {
            return Err(OAuthBearerError::IssuedInFuture);
        }
        let expires_at_unix_secs =
            numeric("exp")?.ok_or_else(|| OAuthBearerError::MissingClaim { claim: "exp".to_owned() })?;
        let sub_claim = &self.settings.sub_claim_name;
        let principal = match claims.get(sub_claim) {
            None => return Err(OAuthBearerError::MissingClaim { claim: sub_claim.clone() }),
            Some(Value::String(name)) if !name.trim().is_empty() => name.clone(),
            Some(_) => return Err(OAuthBearerError::InvalidClaim { claim: sub_claim.clone() }),
        };
        Ok(ValidatedToken { principal, expires_at_unix_secs })
    }

    /// The key for `kid`, re-reading the file when it changed, or when the kid is unknown and the
    /// last read is at least [`JWKS_MIN_RELOAD_INTERVAL`] old.
    fn key(&self, kid: &str, now: Instant) -> Result<Jwk, OAuthBearerError> {
        let mut keys = self.keys.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let current = file_stamp(&self.path).ok();
        let changed = current.is_some_and(|stamp| stamp != keys.stamp);
        let stale = now.checked_duration_since(keys.loaded_at).is_some_and(|age| age >= JWKS_MIN_RELOAD_INTERVAL);
        if changed || (!keys.by_kid.contains_key(kid) && stale) {
            keys.loaded_at = now;
            keys.loads += 1;
            // The stamp is taken even when the read fails, so a broken file is re-read when it
            // changes again (or for an unknown kid after the interval), not on every token.
            if let Some(stamp) = current {
                keys.stamp = stamp;
            }
            // A failed re-read keeps the keys in force: the file may be in the middle of a rewrite.
            if let Ok((by_kid, _)) = read_jwks(&self.path) {
                keys.by_kid = by_kid;
            }
        }
        keys.by_kid.get(kid).cloned().ok_or_else(|| OAuthBearerError::UnknownKeyId {
            kid: kid.chars().take(64).filter(|c| !c.is_control()).collect(),
        })
    }
}

/// The header's algorithm and kid, with `none` and HMAC refused by name.
fn read_header(token: &str) -> Result<(Algorithm, String), OAuthBearerError> {
    let mut parts = token.split('.');
    let (Some(header), Some(_), Some(_), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return Err(OAuthBearerError::TokenMalformed("not three dot-separated parts"));
    };
    let header =
        URL_SAFE_NO_PAD.decode(header).map_err(|_| OAuthBearerError::TokenMalformed("header is not base64url"))?;
    let header: serde_json::Map<String, Value> =
        serde_json::from_slice(&header).map_err(|_| OAuthBearerError::TokenMalformed("header is not a JSON object"))?;
    let alg = header.get("alg").and_then(Value::as_str).ok_or(OAuthBearerError::TokenMalformed("header has no alg"))?;
    if alg.eq_ignore_ascii_case("none") {
        return Err(OAuthBearerError::AlgorithmNone);
    }
    let algorithm = Algorithm::from_str(alg).map_err(|_| OAuthBearerError::AlgorithmUnsupported)?;
    if matches!(algorithm, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512) {
        return Err(OAuthBearerError::AlgorithmHmac { alg: alg.to_owned() });
    }
    let kid = header.get("kid").and_then(Value::as_str).ok_or(OAuthBearerError::MissingKeyId)?;
    Ok((algorithm, kid.to_owned()))
}

fn token_error(kind: ErrorKind) -> OAuthBearerError {
    match kind {
        ErrorKind::InvalidSignature => OAuthBearerError::BadSignature,
        ErrorKind::ExpiredSignature => OAuthBearerError::Expired,
        ErrorKind::ImmatureSignature => OAuthBearerError::NotYetValid,
        ErrorKind::InvalidIssuer => OAuthBearerError::WrongIssuer,
        ErrorKind::InvalidAudience => OAuthBearerError::WrongAudience,
        ErrorKind::MissingRequiredClaim(claim) => OAuthBearerError::MissingClaim { claim },
        ErrorKind::InvalidClaimFormat(claim) => OAuthBearerError::InvalidClaim { claim },
        ErrorKind::InvalidAlgorithm
        | ErrorKind::InvalidEcdsaKey
        | ErrorKind::InvalidEddsaKey
        | ErrorKind::InvalidRsaKey(_)
        | ErrorKind::InvalidKeyFormat => OAuthBearerError::KeyAlgorithmMismatch,
        _ => OAuthBearerError::TokenMalformed("undecodable"),
    }
}

fn file_stamp(path: &Path) -> std::io::Result<FileStamp> {
    let metadata = std::fs::metadata(path)?;
    Ok((metadata.modified()?, metadata.len()))
}

/// Reads the JWKS file: public signing keys with a kid, each usable by jsonwebtoken; keys of other
/// kinds (symmetric `oct`, `use: enc`, unknown types) are skipped, the first of a repeated kid kept.
fn read_jwks(path: &Path) -> Result<(KeysByKid, FileStamp), OAuthBearerError> {
    let read_error = |reason: String| OAuthBearerError::JwksRead { path: path.to_owned(), reason };
    let stamp = file_stamp(path).map_err(|e| read_error(e.to_string()))?;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|file| file.take(JWKS_FILE_MAX_BYTES + 1).read_to_end(&mut bytes))
        .map_err(|e| read_error(e.to_string()))?;
    if bytes.len() as u64 > JWKS_FILE_MAX_BYTES {
        return Err(read_error(format!("larger than {JWKS_FILE_MAX_BYTES} bytes")));
    }
    let document: Value = serde_json::from_slice(&bytes).map_err(|e| read_error(format!("not JSON: {e}")))?;
    let entries =
        document.get("keys").and_then(Value::as_array).ok_or_else(|| read_error("no \"keys\" array".to_owned()))?;
    let mut by_kid = HashMap::new();
    for entry in entries {
        let Ok(jwk) = serde_json::from_value::<Jwk>(entry.clone()) else { continue };
        let signing = !matches!(jwk.common.public_key_use, Some(PublicKeyUse::Encryption));
        let asymmetric = !matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_));
        if let (Some(kid), true, true) = (jwk.common.key_id.clone(), signing, asymmetric)
            && DecodingKey::from_jwk(&jwk).is_ok()
        {
            by_kid.entry(kid).or_insert(jwk);
        }
    }
    if by_kid.is_empty() {
        return Err(OAuthBearerError::JwksNoUsableKeys { path: path.to_owned() });
    }
    Ok((by_kid, stamp))
}

/// What the server answers a step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OAuthBearerStep {
    /// The token is valid: answer with empty bytes; the session is authenticated.
    Authenticated(ValidatedToken),
    /// The token was refused: answer with these bytes (RFC 7628's JSON error) and expect `\x01`.
    ErrorReply(Vec<u8>),
}

#[derive(Debug)]
enum State {
    AwaitingInitialResponse,
    /// The error reply was sent; the client must acknowledge with `\x01`, then the login fails.
    AwaitingErrorAck(OAuthBearerError),
    Authenticated,
    Failed,
}

/// The server's side of one OAUTHBEARER conversation.
#[derive(Debug)]
pub struct OAuthBearerServer {
    state: State,
}

impl Default for OAuthBearerServer {
    fn default() -> Self {
        Self::new()
    }
}

impl OAuthBearerServer {
    /// A conversation awaiting the client's initial response.
    pub fn new() -> Self {
        OAuthBearerServer { state: State::AwaitingInitialResponse }
    }

    /// Takes the client's next message. A malformed initial response or an authzid other than the
    /// principal fails at once; a refused token gets [`OAuthBearerStep::ErrorReply`], and the
    /// client's `\x01` that follows gets the token's error (the conversation has failed).
    pub fn evaluate(&mut self, validator: &JwtValidator, message: &[u8]) -> Result<OAuthBearerStep, OAuthBearerError> {
        match std::mem::replace(&mut self.state, State::Failed) {
            State::AwaitingInitialResponse => {
                let response = ClientInitialResponse::parse(message)?;
                match validator.validate(response.token()) {
                    Ok(token) => {
                        if response.authzid().is_some_and(|authzid| authzid != token.principal) {
                            return Err(OAuthBearerError::AuthorizationIdMismatch);
                        }
                        self.state = State::Authenticated;
                        Ok(OAuthBearerStep::Authenticated(token))
                    }
                    Err(error) => {
                        self.state = State::AwaitingErrorAck(error);
                        Ok(OAuthBearerStep::ErrorReply(INVALID_TOKEN_REPLY.to_vec()))
                    }
                }
            }
            State::AwaitingErrorAck(error) if message == b"\x01" => Err(error),
            State::AwaitingErrorAck(_) => Err(OAuthBearerError::Malformed("expected \\x01 after the error reply")),
            State::Authenticated => {
                self.state = State::Authenticated;
                Err(OAuthBearerError::OutOfOrder)
            }
            State::Failed => Err(OAuthBearerError::OutOfOrder),
        }
    }

    /// Whether the conversation ended with a valid token.
    pub fn is_authenticated(&self) -> bool {
        matches!(self.state, State::Authenticated)
    }
}

#[cfg(test)]
#[path = "oauthbearer_tests.rs"]
mod tests;
