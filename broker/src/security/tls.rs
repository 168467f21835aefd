//! TLS for the Kafka listeners, through rustls (no OpenSSL): a listener's key, certificate chain and
//! trusted authorities from PEM files, TLS 1.2 and 1.3 only, client certificates asked for as
//! `ssl.client.auth` says, and the files read again when they change.
//!
//! Each TLS listener has one [`TlsListener`]. A connection takes the listener's rustls configuration as it
//! is when the connection is accepted; a reload swaps in a new one for the connections that come after,
//! and those already open keep theirs, so replacing a certificate drops no client. Files are looked at
//! every second (their size and modification time) and on SIGHUP; a file that cannot be used (half
//! written, a key that does not match) leaves the listener serving with what it had, and is logged.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::listeners::{ClientAuth, Listener, TlsSettings, TlsVersion};
use crate::config::principal::PrincipalRules;
use crate::security::principal::{self, CertificatePrincipalError, Principal};

/// Why a listener's TLS files cannot be used. The message names the file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    #[error("read {path}: {reason}")]
    Read { path: PathBuf, reason: String },
    #[error("{path}: no private key (ssl.keystore.location must hold the key and the certificate chain, PEM)")]
    NoKey { path: PathBuf },
    #[error("{path}: no certificate (ssl.keystore.location must hold the key and the certificate chain, PEM)")]
    NoCertificate { path: PathBuf },
    #[error("{path}: no certificate of a trusted authority")]
    NoAuthority { path: PathBuf },
    #[error("listener {listener}: {reason}")]
    Rustls { listener: String, reason: String },
}

/// When a file was last seen changed: its size and modification time.
/// A file's size and modification time, to notice that it changed.
pub(super) type Stamp = Option<(u64, SystemTime)>;

pub(super) fn stamp(path: &Path) -> Stamp {
    std::fs::metadata(path).ok().and_then(|m| Some((m.len(), m.modified().ok()?)))
}

/// One TLS listener's current configuration.
#[derive(Debug)]
pub struct TlsListener {
    listener: String,
    settings: TlsSettings,
    rules: PrincipalRules,
    current: RwLock<Arc<ServerConfig>>,
    /// The stamps of the keystore and truststore the current configuration was built from.
    stamps: Mutex<(Stamp, Stamp)>,
}

impl TlsListener {
    /// Reads the listener's files; an error says which file and why.
    pub fn load(listener: &Listener) -> Result<TlsListener, TlsError> {
        let settings = listener.tls.clone().expect("a TLS listener has TLS settings");
        let rules = PrincipalRules::parse(&settings.principal_rules).expect("checked when the config was read");
        let stamps = (stamp(&settings.keystore), settings.truststore.as_deref().and_then(stamp));
        let config = server_config(&listener.name, &settings)?;
        Ok(TlsListener {
            listener: listener.name.clone(),
            settings,
            rules,
            current: RwLock::new(Arc::new(config)),
            stamps: Mutex::new(stamps),
        })
    }

    pub fn name(&self) -> &str {
        &self.listener
    }

    /// The configuration for a connection accepted now.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.current.read().expect("never poisoned: nothing panics holding it").clone()
    }

    pub fn client_auth(&self) -> ClientAuth {
        self.settings.client_auth
    }

    /// Reads the files again if they changed since the last load (or if `force`, on SIGHUP). Returns
    /// whether a new configuration is in force; on error the old one stays.
    pub fn reload(&self, force: bool) -> Result<bool, TlsError> {
        let now = (stamp(&self.settings.keystore), self.settings.truststore.as_deref().and_then(stamp));
        let mut stamps = self.stamps.lock().expect("never poisoned: nothing panics holding it");
        if !force && *stamps == now {
            return Ok(false);
        }
        // Seen, whether it loads or not: a broken file is reported once, not every second.
        *stamps = now;
        let config = server_config(&self.listener, &self.settings)?;
        *self.current.write().expect("never poisoned: nothing panics holding it") = Arc::new(config);
        Ok(true)
    }

    /// The principal of a connection that completed its handshake with these peer certificates (the
    /// client's first). `None` certificates: `User:ANONYMOUS`.
    pub fn principal(
        &self,
        certificates: Option<&[CertificateDer<'_>]>,
    ) -> Result<Principal, CertificatePrincipalError> {
        match certificates.and_then(|c| c.first()) {
            Some(leaf) => principal::from_certificate(leaf, &self.rules),
            None => Ok(Principal::anonymous()),
        }
    }

    /// The keystore and truststore files, for `shardlog check`.
    pub fn files(&self) -> Vec<&Path> {
        std::iter::once(self.settings.keystore.as_path()).chain(self.settings.truststore.as_deref()).collect()
    }
}

fn read_err(path: &Path) -> impl FnOnce(rustls_pki_types::pem::Error) -> TlsError + '_ {
    move |e| TlsError::Read { path: path.to_path_buf(), reason: e.to_string() }
}

/// The certificates of a PEM file, in order.
pub fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    CertificateDer::pem_file_iter(path).map_err(read_err(path))?.collect::<Result<Vec<_>, _>>().map_err(read_err(path))
}

/// The private key of a PEM keystore (the key and its certificate chain in one file).
pub fn private_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => TlsError::NoKey { path: path.to_path_buf() },
        other => read_err(path)(other),
    })
}

/// The cryptography every TLS endpoint of shardlog uses, listeners, peers and tools alike: ring rather
/// than aws-lc-rs, rustls's default, which needs cmake and a C build of its own. ring offers no
/// post-quantum key exchange (rustls marks it deprecated for that): X25519, P-256 and P-384 are offered
/// (docs/security.md).
pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    #[allow(deprecated)]
    Arc::new(rustls::crypto::ring::default_provider())
}

fn server_config(listener: &str, settings: &TlsSettings) -> Result<ServerConfig, TlsError> {
    let rustls_err = |e: rustls::Error| TlsError::Rustls { listener: listener.to_string(), reason: e.to_string() };
    let chain = certificates(&settings.keystore)?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate { path: settings.keystore.clone() });
    }
    let key = private_key(&settings.keystore)?;
    let provider = provider();
    let versions: Vec<&'static rustls::SupportedProtocolVersion> = settings
        .versions
        .iter()
        .map(|v| match v {
            TlsVersion::Tls12 => &rustls::version::TLS12,
            TlsVersion::Tls13 => &rustls::version::TLS13,
        })
        .collect();
    let builder =
        ServerConfig::builder_with_provider(provider.clone()).with_protocol_versions(&versions).map_err(rustls_err)?;
    let verifier = match (settings.client_auth, &settings.truststore) {
        (ClientAuth::None, _) => WebPkiClientVerifier::no_client_auth(),
        (auth, Some(path)) => {
            let mut roots = rustls::RootCertStore::empty();
            for certificate in certificates(path)? {
                roots.add(certificate).map_err(rustls_err)?;
            }
            if roots.is_empty() {
                return Err(TlsError::NoAuthority { path: path.clone() });
            }
            let builder = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
            let builder = if auth == ClientAuth::Requested { builder.allow_unauthenticated() } else { builder };
            builder.build().map_err(|e| TlsError::Rustls { listener: listener.to_string(), reason: e.to_string() })?
        }
        (_, None) => unreachable!("the config refuses client certificates without a truststore"),
    };
    let config = builder.with_client_cert_verifier(verifier).with_single_cert(chain, key).map_err(rustls_err)?;
    Ok(config)
}

/// Certificates that expire within `days` of now: (file, subject, days left; negative once expired).
pub fn expiring(path: &Path, days: i64) -> Result<Vec<(String, i64)>, TlsError> {
    let now = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64);
    let mut out = Vec::new();
    for der in certificates(path)? {
        let Ok((_, cert)) = <x509_parser::prelude::X509Certificate as x509_parser::prelude::FromDer<
            x509_parser::error::X509Error,
        >>::from_der(&der) else {
            continue;
        };
        let left = (cert.validity().not_after.timestamp() - now).div_euclid(86_400);
        if left < days {
            out.push((principal::subject_rfc2253(&der).unwrap_or_default(), left));
        }
    }
    Ok(out)
}
