//! `--command-config FILE`: how shardlog's tools reach a secured cluster, in the Kafka client's own words.
//!
//! The file is Java-properties style, as Kafka's tools and librdkafka take it: one `key=value` per line
//! (`key: value` and `key value` too), `#` and `!` start a comment line, blank lines are skipped, spaces
//! around the key and the value are dropped. The keys understood are Kafka's client names:
//!
//! | key                                     | values                                                  |
//! |-----------------------------------------|---------------------------------------------------------|
//! | `security.protocol`                     | PLAINTEXT (default), SSL, SASL_PLAINTEXT, SASL_SSL      |
//! | `sasl.mechanism`                        | PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (default GSSAPI, refused) |
//! | `sasl.username`, `sasl.password`        | the SASL user                                           |
//! | `sasl.jaas.config`                      | Kafka's `...LoginModule required username="u" password="p";` |
//! | `ssl.ca.location`                       | PEM file of the authorities trusted (required for TLS)  |
//! | `ssl.certificate.location`              | PEM certificate chain of the client (mutual TLS)        |
//! | `ssl.key.location`                      | PEM private key of that certificate                     |
//! | `ssl.endpoint.identification.algorithm` | `https` (default: the broker's name is checked) or `none` |
//!
//! Every other key is refused, naming it: a setting accepted that does nothing would be a lie about the
//! connection's security. A setting that belongs to a protocol not chosen (`sasl.username` with SSL) is
//! refused for the same reason. This build has no store of the system's trusted authorities, so TLS
//! needs `ssl.ca.location`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use crate::security::sasl::scram::ScramMechanism;

/// The environment variable `--command-config` defaults to.
pub const COMMAND_CONFIG_ENV: &str = "SHARDLOG_COMMAND_CONFIG";

/// Kafka's `security.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    fn parse(value: &str) -> Result<Self> {
        Ok(match value.to_ascii_uppercase().as_str() {
            "PLAINTEXT" => SecurityProtocol::Plaintext,
            "SSL" => SecurityProtocol::Ssl,
            "SASL_PLAINTEXT" => SecurityProtocol::SaslPlaintext,
            "SASL_SSL" => SecurityProtocol::SaslSsl,
            _ => bail!("security.protocol={value}: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"),
        })
    }

    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    pub fn sasl(self) -> bool {
        matches!(self, SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl)
    }

    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }
}

/// The SASL mechanisms this client speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SaslMechanism {
    Plain,
    Scram(ScramMechanism),
}

impl SaslMechanism {
    fn parse(value: &str) -> Result<Self> {
        match value {
            "PLAIN" => Ok(SaslMechanism::Plain),
            "OAUTHBEARER" => bail!(
                "sasl.mechanism=OAUTHBEARER: shardlog's tools cannot fetch tokens; use PLAIN or SCRAM-SHA-256/512"
            ),
            "GSSAPI" => bail!("sasl.mechanism=GSSAPI (Kerberos) is not supported: use PLAIN or SCRAM-SHA-256/512"),
            _ => ScramMechanism::from_name(value)
                .map(SaslMechanism::Scram)
                .with_context(|| format!("sasl.mechanism={value}: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512")),
        }
    }

    /// Kafka's name, as SaslHandshake carries it.
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::Scram(m) => m.name(),
        }
    }
}

/// Who the client says it is over SASL. Debug shows no password.
#[derive(Clone)]
pub struct SaslLogin {
    pub mechanism: SaslMechanism,
    pub username: String,
    pub password: String,
}

impl fmt::Debug for SaslLogin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SaslLogin")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// How to reach the cluster: plaintext (the default), or with TLS and/or SASL as the file says.
#[derive(Clone)]
pub struct ClientSecurity {
    pub protocol: SecurityProtocol,
    /// Present exactly when the protocol has TLS.
    pub tls: Option<Arc<ClientConfig>>,
    /// Present exactly when the protocol has SASL.
    pub sasl: Option<SaslLogin>,
}

impl Default for ClientSecurity {
    fn default() -> Self {
        ClientSecurity::plaintext()
    }
}

impl fmt::Debug for ClientSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientSecurity").field("protocol", &self.protocol).field("sasl", &self.sasl).finish()
    }
}

impl ClientSecurity {
    /// No TLS, no SASL.
    pub fn plaintext() -> Self {
        ClientSecurity { protocol: SecurityProtocol::Plaintext, tls: None, sasl: None }
    }

    /// Reads a `--command-config` file; `None` is plaintext.
    pub fn load(file: Option<&Path>) -> Result<Self> {
        let Some(file) = file else { return Ok(Self::plaintext()) };
        let text =
            std::fs::read_to_string(file).with_context(|| format!("read --command-config {}", file.display()))?;
        let settings = CommandConfig::parse(&text).with_context(|| format!("--command-config {}", file.display()))?;
        settings.security().with_context(|| format!("--command-config {}", file.display()))
    }
}

/// The settings of a command-config file, checked but with files not yet read.
#[derive(Clone, PartialEq, Eq)]
pub struct CommandConfig {
    pub protocol: SecurityProtocol,
    pub mechanism: Option<SaslMechanism>,
    pub username: Option<String>,
    pub password: Option<String>,
    pub ca: Option<PathBuf>,
    pub certificate: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// `ssl.endpoint.identification.algorithm`: whether the broker's certificate must name the host dialled.
    pub verify_hostname: bool,
}

impl fmt::Debug for CommandConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommandConfig")
            .field("protocol", &self.protocol)
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .field("ca", &self.ca)
            .field("certificate", &self.certificate)
            .field("key", &self.key)
            .field("verify_hostname", &self.verify_hostname)
            .finish_non_exhaustive()
    }
}

/// Splits properties text into (line number, key, value); a line without a separator is an error.
pub fn properties(text: &str) -> Result<Vec<(usize, String, String)>> {
    let mut out = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with('!') {
            continue;
        }
        let at = line
            .find(['=', ':', ' ', '\t'])
            .with_context(|| format!("line {}: {line:?} is not key=value", index + 1))?;
        let key = line[..at].trim();
        let mut value = line[at..].trim_start();
        if let Some(rest) = value.strip_prefix(['=', ':']) {
            value = rest.trim_start();
        }
        if key.is_empty() {
            bail!("line {}: no key before the separator", index + 1);
        }
        out.push((index + 1, key.to_string(), value.to_string()));
    }
    Ok(out)
}

impl CommandConfig {
    /// Parses and checks the file's text.
    pub fn parse(text: &str) -> Result<Self> {
        let mut protocol = None;
        let mut mechanism = None;
        let (mut username, mut password, mut jaas) = (None, None, None);
        let (mut ca, mut certificate, mut key, mut identification) = (None, None, None, None);
        for (line, name, value) in properties(text)? {
            let slot = match name.as_str() {
                "security.protocol" => &mut protocol,
                "sasl.mechanism" => &mut mechanism,
                "sasl.username" => &mut username,
                "sasl.password" => &mut password,
                "sasl.jaas.config" => &mut jaas,
                "ssl.ca.location" => &mut ca,
                "ssl.certificate.location" => &mut certificate,
                "ssl.key.location" => &mut key,
                "ssl.endpoint.identification.algorithm" => &mut identification,
                _ => bail!(
                    "line {line}: {name} is not a setting shardlog's tools understand (they take security.protocol, \
                     sasl.mechanism, sasl.username, sasl.password, sasl.jaas.config, ssl.ca.location, \
                     ssl.certificate.location, ssl.key.location, ssl.endpoint.identification.algorithm)"
                ),
            };
            if slot.replace(value).is_some() {
                bail!("line {line}: {name} is set twice");
            }
        }
        let protocol = protocol.as_deref().map_or(Ok(SecurityProtocol::Plaintext), SecurityProtocol::parse)?;
        if let Some(jaas) = jaas {
            if username.is_some() || password.is_some() {
                bail!("sasl.jaas.config and sasl.username/sasl.password both name the user: give one of them");
            }
            let (user, pass) = jaas_login(&jaas)?;
            (username, password) = (Some(user), Some(pass));
        }
        let verify_hostname = match identification.as_deref().map(str::to_ascii_lowercase).as_deref() {
            None | Some("https") => true,
            Some("none") | Some("") => false,
            Some(other) => bail!("ssl.endpoint.identification.algorithm={other}: https or none"),
        };
        let sasl_set = [("sasl.mechanism", &mechanism), ("sasl.username", &username), ("sasl.password", &password)]
            .iter()
            .find_map(|(name, value)| value.as_ref().map(|_| *name));
        if let (false, Some(set)) = (protocol.sasl(), sasl_set) {
            bail!("{set} is set, but security.protocol={} has no SASL", protocol.name());
        }
        let mechanism = match (protocol.sasl(), mechanism) {
            (false, _) => None,
            (true, None) => bail!(
                "security.protocol={} needs sasl.mechanism (PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512)",
                protocol.name()
            ),
            (true, Some(m)) => Some(SaslMechanism::parse(&m)?),
        };
        if mechanism.is_some() && (username.is_none() || password.is_none()) {
            bail!("security.protocol={} needs sasl.username and sasl.password", protocol.name());
        }
        if !protocol.tls() {
            let tls_set =
                [("ssl.ca.location", &ca), ("ssl.certificate.location", &certificate), ("ssl.key.location", &key)]
                    .iter()
                    .find_map(|(name, value)| value.as_ref().map(|_| *name))
                    .or(identification.as_ref().map(|_| "ssl.endpoint.identification.algorithm"));
            if let Some(set) = tls_set {
                bail!("{set} is set, but security.protocol={} has no TLS", protocol.name());
            }
        } else if ca.is_none() {
            bail!(
                "security.protocol={} needs ssl.ca.location (a PEM file of the authorities to trust): \
                 shardlog's tools do not read the system's trust store",
                protocol.name()
            );
        }
        if certificate.is_some() != key.is_some() {
            bail!("ssl.certificate.location and ssl.key.location go together (the client certificate and its key)");
        }
        Ok(CommandConfig {
            protocol,
            mechanism,
            username,
            password,
            ca: ca.map(PathBuf::from),
            certificate: certificate.map(PathBuf::from),
            key: key.map(PathBuf::from),
            verify_hostname,
        })
    }

    /// Reads the files named and builds the connection settings.
    pub fn security(&self) -> Result<ClientSecurity> {
        let sasl = self.mechanism.map(|mechanism| SaslLogin {
            mechanism,
            username: self.username.clone().expect("checked by parse"),
            password: self.password.clone().expect("checked by parse"),
        });
        let tls = match &self.ca {
            None => None,
            Some(ca) => Some(Arc::new(self.tls_config(ca)?)),
        };
        Ok(ClientSecurity { protocol: self.protocol, tls, sasl })
    }

    fn tls_config(&self, ca: &Path) -> Result<ClientConfig> {
        let mut roots = RootCertStore::empty();
        let authorities = CertificateDer::pem_file_iter(ca)
            .with_context(|| format!("ssl.ca.location {}", ca.display()))?
            .collect::<Result<Vec<_>, _>>()
            .with_context(|| format!("ssl.ca.location {}", ca.display()))?;
        let (added, _) = roots.add_parsable_certificates(authorities);
        if added == 0 {
            bail!("ssl.ca.location {}: no certificate of an authority in it (PEM)", ca.display());
        }
        let provider = crate::security::tls::provider();
        let chain_checker = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .context("ssl.ca.location: the authorities cannot be used")?;
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .context("TLS versions")?;
        let builder = if self.verify_hostname {
            builder.with_webpki_verifier(chain_checker)
        } else {
            builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyName(chain_checker)))
        };
        match (&self.certificate, &self.key) {
            (Some(certificate), Some(key)) => {
                let chain = CertificateDer::pem_file_iter(certificate)
                    .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
                    .with_context(|| format!("ssl.certificate.location {}", certificate.display()))?;
                if chain.is_empty() {
                    bail!("ssl.certificate.location {}: no certificate in it (PEM)", certificate.display());
                }
                let key = PrivateKeyDer::from_pem_file(key)
                    .with_context(|| format!("ssl.key.location {}: no private key read (PEM)", key.display()))?;
                builder
                    .with_client_auth_cert(chain, key)
                    .context("ssl.certificate.location and ssl.key.location do not go together")
            }
            _ => Ok(builder.with_no_client_auth()),
        }
    }
}

/// The user and password of Kafka's `sasl.jaas.config`:
/// `org.apache.kafka.common.security.scram.ScramLoginModule required username="u" password="p";`
/// (or PlainLoginModule). Other options are refused.
fn jaas_login(text: &str) -> Result<(String, String)> {
    let refuse = |why: &str| anyhow::anyhow!("sasl.jaas.config: {why}");
    let body = text.trim().strip_suffix(';').ok_or_else(|| refuse("must end with ';'"))?;
    let mut words = body.trim_start();
    let module_end = words.find(char::is_whitespace).ok_or_else(|| refuse("no options after the login module"))?;
    let module = &words[..module_end];
    if !module.ends_with(".ScramLoginModule") && !module.ends_with(".PlainLoginModule") {
        bail!("sasl.jaas.config: login module {module}: only ScramLoginModule and PlainLoginModule are understood");
    }
    words = words[module_end..].trim_start();
    words = words.strip_prefix("required").ok_or_else(|| refuse("the login module must be `required`"))?;
    let (mut username, mut password) = (None, None);
    loop {
        words = words.trim_start();
        if words.is_empty() {
            break;
        }
        let (name, rest) = words.split_once('=').ok_or_else(|| refuse("options are name=\"value\""))?;
        let rest = rest.trim_start().strip_prefix('"').ok_or_else(|| refuse("option values are in double quotes"))?;
        let end = rest.find('"').ok_or_else(|| refuse("an option value has no closing quote"))?;
        let value = rest[..end].to_string();
        match name.trim() {
            "username" => username = Some(value),
            "password" => password = Some(value),
            other => bail!("sasl.jaas.config: option {other} is not understood (only username and password)"),
        }
        words = &rest[end + 1..];
    }
    match (username, password) {
        (Some(u), Some(p)) => Ok((u, p)),
        _ => bail!("sasl.jaas.config: needs both username and password"),
    }
}

/// `ssl.endpoint.identification.algorithm=none`: the broker's chain must lead to a trusted authority and
/// its signatures must hold, but its certificate need not name the host dialled.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // webpki checks the chain first and the name last: an error about the name means all else held.
        match self.0.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
#[path = "command_config_tests.rs"]
mod tests;
