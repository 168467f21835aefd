//! Mutual TLS among the cluster's own processes: replication between brokers and the quorum port
//! (`docs/peer-protocol.md` §4, `docs/security.md` §9).
//!
//! Every process holds a node certificate (`cluster.ssl.keystore.location`, key and chain in one PEM
//! file) issued by the cluster's authority (`cluster.ssl.truststore.location`). A node certificate names
//! the node it speaks for: its subject's common name is `node-<id>`, or it carries the URI
//! `urn:shardlog:node:<id>` among its subject alternative names (both may be present; they must then
//! agree). So one node's certificate cannot speak for another node.
//!
//! Both ends of every connection prove themselves:
//! - the dialler knows which node it dials (the leader broker it fetches from, the voter it calls). The
//!   server name it gives rustls is `node-<id>`, and [`NodeServerVerifier`] accepts the server's
//!   certificate only if it chains to the cluster's authority and names that node id; no host name is
//!   looked at (nodes move between addresses, ids do not);
//! - the acceptor requires a client certificate that chains to the same authority, then reads the node
//!   id from it ([`node_of`]); what that node may do is the service's rule (a replication Hello must be
//!   the certificate's broker, a Raft RPC the certificate's voter, ...).
//!
//! TLS 1.3 only (both ends are shardlog), and no session resumption: every connection's peer is proven
//! by its own handshake. The files are read at start, and again when they change or on SIGHUP
//! ([`ClusterTls::reload`], `crate::security::reload`): a renewed node certificate or a new authority
//! bundle is taken without a restart, for the connections made from then on.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{Resumption, verify_server_cert_signed_by_trust_anchor};
use rustls::crypto::CryptoProvider;
use rustls::server::{NoServerSessionStorage, ParsedCertificate, WebPkiClientVerifier};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, ServerConfig, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

use super::tls::{Stamp, TlsError, certificates, stamp};
pub use crate::config::ClusterTlsSettings;

/// A node certificate's common name: this prefix, then the node id in decimal.
pub const NODE_COMMON_NAME_PREFIX: &str = "node-";
/// A node certificate's URI subject alternative name: this prefix, then the node id in decimal.
pub const NODE_URI_PREFIX: &str = "urn:shardlog:node:";

/// Why a certificate does not name a node.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NodeCertError {
    #[error("the certificate cannot be parsed")]
    Unparsable,
    #[error("the certificate names no node (subject CN=node-<id> or SAN URI urn:shardlog:node:<id>)")]
    NoNode,
    #[error("the certificate's node name {0:?} is not a node id")]
    BadNodeName(String),
    #[error("the certificate names two nodes, {0} and {1}")]
    TwoNodes(u32, u32),
    #[error("the certificate is node {named}'s, not node {expected}'s")]
    OtherNode { expected: u32, named: u32 },
    #[error("no client certificate")]
    NoCertificate,
}

/// Why cluster mTLS cannot start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterTlsError {
    #[error(
        "cluster mTLS needs both cluster.ssl.keystore.location and cluster.ssl.truststore.location; only {set} is set"
    )]
    OnlyOne { set: &'static str },
    #[error(transparent)]
    Files(#[from] TlsError),
    #[error("cluster.ssl.keystore.location {path}: {error}, and this is node {node}")]
    NotThisNode { path: PathBuf, node: u32, error: NodeCertError },
    #[error("cluster mTLS: {0}")]
    Rustls(String),
}

/// The node id a certificate (DER) names.
pub fn node_of(der: &[u8]) -> Result<u32, NodeCertError> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|_| NodeCertError::Unparsable)?;
    let mut found: Option<u32> = None;
    let mut note = |id: u32| match found {
        Some(other) if other != id => Err(NodeCertError::TwoNodes(other, id)),
        _ => {
            found = Some(id);
            Ok(())
        }
    };
    for name in cert.subject().iter_common_name() {
        let text = name.as_str().map_err(|_| NodeCertError::Unparsable)?;
        if let Some(id) = text.strip_prefix(NODE_COMMON_NAME_PREFIX) {
            note(parse_id(id).ok_or_else(|| NodeCertError::BadNodeName(text.to_string()))?)?;
        }
    }
    let alternative = cert.subject_alternative_name().map_err(|_| NodeCertError::Unparsable)?;
    for name in alternative.iter().flat_map(|san| san.value.general_names.iter()) {
        if let GeneralName::URI(uri) = name
            && let Some(id) = uri.strip_prefix(NODE_URI_PREFIX)
        {
            note(parse_id(id).ok_or_else(|| NodeCertError::BadNodeName(uri.to_string()))?)?;
        }
    }
    found.ok_or(NodeCertError::NoNode)
}

/// A node id in decimal, as `node.id` allows it (0 to 2^31-1), with no sign or padding.
fn parse_id(text: &str) -> Option<u32> {
    let plain = !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) && (text == "0" || !text.starts_with('0'));
    plain.then(|| text.parse::<u32>().ok()).flatten().filter(|id| *id <= i32::MAX as u32)
}

/// The server name a dialler gives rustls for node `node`: what [`NodeServerVerifier`] checks the
/// server's certificate against.
pub fn server_name(node: u64) -> ServerName<'static> {
    ServerName::try_from(format!("{NODE_COMMON_NAME_PREFIX}{node}")).expect("node-<digits> is a valid DNS name")
}

/// The node id a server name made by [`server_name`] stands for.
fn expected_node(name: &ServerName<'_>) -> Option<u32> {
    match name {
        ServerName::DnsName(dns) => parse_id(dns.as_ref().strip_prefix(NODE_COMMON_NAME_PREFIX)?),
        _ => None,
    }
}

fn refused(error: NodeCertError) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(error))))
}

/// Checks a server's certificate as a dialler of node `<id>` must: it chains to the cluster's authority
/// and names node `<id>` (from the server name, see [`server_name`]).
#[derive(Debug)]
pub struct NodeServerVerifier {
    roots: Arc<RootCertStore>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for NodeServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let parsed = ParsedCertificate::try_from(end_entity)?;
        let algorithms = self.provider.signature_verification_algorithms.all;
        verify_server_cert_signed_by_trust_anchor(&parsed, &self.roots, intermediates, now, algorithms)?;
        let expected = expected_node(server_name)
            .ok_or(rustls::Error::General(format!("cluster mTLS dials nodes by id, not {server_name:?}")))?;
        let named = node_of(end_entity).map_err(refused)?;
        if named != expected {
            return Err(refused(NodeCertError::OtherNode { expected, named }));
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

/// This node's cluster mTLS: the configurations of both ends of its connections to other nodes.
#[derive(Debug)]
pub struct ClusterTls {
    node: u32,
    keystore: PathBuf,
    truststore: PathBuf,
    current: RwLock<Configs>,
    /// The stamps of the keystore and truststore the current configurations were built from.
    stamps: Mutex<(Stamp, Stamp)>,
}

#[derive(Debug)]
struct Configs {
    server: Arc<ServerConfig>,
    client: Arc<ClientConfig>,
}

impl ClusterTls {
    /// Reads the files for node `node`; `None` when neither is set (cluster mTLS off). Refused: only one
    /// of them set, files that cannot be used, or a certificate that does not name `node`.
    pub fn load(settings: &ClusterTlsSettings, node: u32) -> Result<Option<Arc<ClusterTls>>, ClusterTlsError> {
        let (keystore, truststore) = match (&settings.keystore, &settings.truststore) {
            (None, None) => return Ok(None),
            (Some(_), None) => return Err(ClusterTlsError::OnlyOne { set: "cluster.ssl.keystore.location" }),
            (None, Some(_)) => return Err(ClusterTlsError::OnlyOne { set: "cluster.ssl.truststore.location" }),
            (Some(k), Some(t)) => (k, t),
        };
        let stamps = (stamp(keystore), stamp(truststore));
        let current = RwLock::new(configs(keystore, truststore, node)?);
        let (keystore, truststore) = (keystore.clone(), truststore.clone());
        Ok(Some(Arc::new(ClusterTls { node, keystore, truststore, current, stamps: Mutex::new(stamps) })))
    }

    /// Reads the files again if they changed since the last load (or if `force`, on SIGHUP). Returns
    /// whether new configurations are in force: connections made from then on use them, those open keep
    /// theirs. On error (a file that cannot be used, a certificate of another node) the old ones stay.
    pub fn reload(&self, force: bool) -> Result<bool, ClusterTlsError> {
        let now = (stamp(&self.keystore), stamp(&self.truststore));
        let mut stamps = self.stamps.lock().expect("never poisoned: nothing panics holding it");
        if !force && *stamps == now {
            return Ok(false);
        }
        // Seen, whether it loads or not: a broken file is reported once, not every second.
        *stamps = now;
        let configs = configs(&self.keystore, &self.truststore, self.node)?;
        *self.current.write().expect("never poisoned: nothing panics holding it") = configs;
        Ok(true)
    }

    /// The keystore and truststore files.
    pub fn files(&self) -> [&Path; 2] {
        [&self.keystore, &self.truststore]
    }

    /// This node's id, which its certificate names.
    pub fn node(&self) -> u32 {
        self.node
    }

    /// The acceptor's configuration: a client certificate of the cluster's authority is required.
    pub fn server_config(&self) -> Arc<ServerConfig> {
        self.current.read().expect("never poisoned: nothing panics holding it").server.clone()
    }

    /// The dialler's configuration, offering `alpn` when given.
    pub fn client_config(&self, alpn: Option<Vec<u8>>) -> Arc<ClientConfig> {
        let client = self.current.read().expect("never poisoned: nothing panics holding it").client.clone();
        match alpn {
            None => client,
            Some(protocol) => {
                let mut config = (*client).clone();
                config.alpn_protocols = vec![protocol];
                Arc::new(config)
            }
        }
    }

    /// Whether a failed handshake was refused (a certificate or the TLS exchange itself was wrong), rather
    /// than cut short by the peer going away, which is no news (a node stopping).
    pub fn is_refusal(error: &std::io::Error) -> bool {
        error.kind() == std::io::ErrorKind::InvalidData
    }

    /// The node a connection's peer proved to be, from the certificates its handshake presented.
    pub fn peer_node(certificates: Option<&[CertificateDer<'_>]>) -> Result<u32, NodeCertError> {
        let leaf = certificates.and_then(|c| c.first()).ok_or(NodeCertError::NoCertificate)?;
        node_of(leaf)
    }
}

/// Both ends' configurations from the files, for node `node`: the keystore's certificate must name it.
fn configs(keystore: &Path, truststore: &Path, node: u32) -> Result<Configs, ClusterTlsError> {
    let rustls_err = |e: rustls::Error| ClusterTlsError::Rustls(e.to_string());
    let chain = certificates(keystore)?;
    let Some(leaf) = chain.first() else { return Err(TlsError::NoCertificate { path: keystore.to_path_buf() }.into()) };
    match node_of(leaf) {
        Ok(named) if named == node => {}
        Ok(named) => {
            let error = NodeCertError::OtherNode { expected: node, named };
            return Err(ClusterTlsError::NotThisNode { path: keystore.to_path_buf(), node, error });
        }
        Err(error) => return Err(ClusterTlsError::NotThisNode { path: keystore.to_path_buf(), node, error }),
    }
    let key = super::tls::private_key(keystore)?;
    let mut roots = RootCertStore::empty();
    for certificate in certificates(truststore)? {
        roots.add(certificate).map_err(rustls_err)?;
    }
    if roots.is_empty() {
        return Err(TlsError::NoAuthority { path: truststore.to_path_buf() }.into());
    }
    let roots = Arc::new(roots);
    let provider = super::tls::provider();

    let verifier = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
        .build()
        .map_err(|e| ClusterTlsError::Rustls(e.to_string()))?;
    let mut server = ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(rustls_err)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain.clone(), key.clone_key())
        .map_err(rustls_err)?;
    server.session_storage = Arc::new(NoServerSessionStorage {});
    server.send_tls13_tickets = 0;

    let verifier = Arc::new(NodeServerVerifier { roots, provider: provider.clone() });
    let mut client = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(rustls_err)?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(chain, key)
        .map_err(rustls_err)?;
    client.resumption = Resumption::disabled();
    Ok(Configs { server: Arc::new(server), client: Arc::new(client) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{
        BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
        SanType,
    };

    fn authority(name: &str) -> (Issuer<'static, KeyPair>, String) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        (Issuer::new(params, key), pem)
    }

    /// A certificate with these common names and URIs, and its key, as DER and as a PEM keystore.
    fn issue(issuer: &Issuer<'static, KeyPair>, names: &[&str], uris: &[&str]) -> (Vec<u8>, String) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = DistinguishedName::new();
        for name in names {
            params.distinguished_name.push(DnType::CommonName, *name);
        }
        params.subject_alt_names = uris.iter().map(|u| SanType::URI(u.to_string().try_into().unwrap())).collect();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, issuer).unwrap();
        (cert.der().to_vec(), format!("{}{}", key.serialize_pem(), cert.pem()))
    }

    #[test]
    fn a_node_id_comes_from_the_common_name_or_the_uri_and_both_must_agree() {
        let (ca, _) = authority("cluster");
        assert_eq!(node_of(&issue(&ca, &["node-7"], &[]).0), Ok(7));
        assert_eq!(node_of(&issue(&ca, &["broker.example"], &["urn:shardlog:node:12"]).0), Ok(12));
        assert_eq!(node_of(&issue(&ca, &["node-3"], &["urn:shardlog:node:3"]).0), Ok(3));
        assert_eq!(node_of(&issue(&ca, &["node-3"], &["urn:shardlog:node:4"]).0), Err(NodeCertError::TwoNodes(3, 4)));
        assert_eq!(node_of(&issue(&ca, &["alice"], &[]).0), Err(NodeCertError::NoNode));
        for bad in ["node-", "node-x1", "node--1", "node-01", "node-4294967296", "node-2147483648"] {
            assert_eq!(node_of(&issue(&ca, &[bad], &[]).0), Err(NodeCertError::BadNodeName(bad.into())), "{bad}");
        }
        assert_eq!(node_of(b"not a certificate"), Err(NodeCertError::Unparsable));
    }

    struct Files {
        _dir: tempfile::TempDir,
        settings: ClusterTlsSettings,
    }

    fn files(keystore: &str, truststore: &str) -> Files {
        let dir = tempfile::tempdir().unwrap();
        let (k, t) = (dir.path().join("node.pem"), dir.path().join("ca.pem"));
        std::fs::write(&k, keystore).unwrap();
        std::fs::write(&t, truststore).unwrap();
        Files { _dir: dir, settings: ClusterTlsSettings { keystore: Some(k), truststore: Some(t) } }
    }

    #[test]
    fn a_node_starts_cluster_mtls_only_with_both_files_and_its_own_certificate() {
        let (ca, ca_pem) = authority("cluster");
        let (_, node_2) = issue(&ca, &["node-2"], &[]);
        let both = files(&node_2, &ca_pem);
        assert_eq!(ClusterTls::load(&both.settings, 2).unwrap().unwrap().node(), 2);
        assert!(ClusterTls::load(&ClusterTlsSettings::default(), 2).unwrap().is_none());
        let only_key = ClusterTlsSettings { truststore: None, ..both.settings.clone() };
        assert!(matches!(ClusterTls::load(&only_key, 2), Err(ClusterTlsError::OnlyOne { .. })));
        let only_trust = ClusterTlsSettings { keystore: None, ..both.settings.clone() };
        assert!(matches!(ClusterTls::load(&only_trust, 2), Err(ClusterTlsError::OnlyOne { .. })));
        let error = ClusterTls::load(&both.settings, 3).unwrap_err();
        assert!(matches!(error, ClusterTlsError::NotThisNode { node: 3, .. }), "{error}");
    }

    /// Runs a handshake in memory between a dialler of node `dialled` and an acceptor.
    fn handshake(client: &ClusterTls, dialled: u64, server: &ClusterTls) -> Result<u32, String> {
        let mut c = rustls::ClientConnection::new(client.client_config(None), server_name(dialled))
            .map_err(|e| e.to_string())?;
        let mut s = rustls::ServerConnection::new(server.server_config()).map_err(|e| e.to_string())?;
        for _ in 0..10 {
            let mut bytes = Vec::new();
            c.write_tls(&mut bytes).unwrap();
            s.read_tls(&mut bytes.as_slice()).unwrap();
            s.process_new_packets().map_err(|e| format!("server: {e}"))?;
            let mut bytes = Vec::new();
            s.write_tls(&mut bytes).unwrap();
            c.read_tls(&mut bytes.as_slice()).unwrap();
            c.process_new_packets().map_err(|e| format!("client: {e}"))?;
            if !c.is_handshaking() && !s.is_handshaking() {
                return ClusterTls::peer_node(s.peer_certificates()).map_err(|e| e.to_string());
            }
        }
        Err("the handshake did not finish".into())
    }

    #[test]
    fn each_end_proves_its_node_id_to_the_other() {
        let (ca, ca_pem) = authority("cluster");
        let (_, node_1) = issue(&ca, &["node-1"], &[]);
        let (_, node_2) = issue(&ca, &["node-2"], &[]);
        let (one, two) = (files(&node_1, &ca_pem), files(&node_2, &ca_pem));
        let one = ClusterTls::load(&one.settings, 1).unwrap().unwrap();
        let two = ClusterTls::load(&two.settings, 2).unwrap().unwrap();
        assert_eq!(handshake(&one, 2, &two), Ok(1), "node 1 dials node 2, which learns it is node 1");
        let error = handshake(&one, 3, &two).unwrap_err();
        // rustls shows the reason in its Debug form.
        let named = error.contains("OtherNode") && error.contains("expected: 3") && error.contains("named: 2");
        assert!(named, "a dialler of node 3 refuses node 2's certificate: {error}");
    }

    #[test]
    fn a_certificate_of_another_authority_is_refused_at_both_ends() {
        let (ca, ca_pem) = authority("cluster");
        let (stranger_ca, _) = authority("stranger");
        let (_, node_1) = issue(&ca, &["node-1"], &[]);
        let (_, forged_2) = issue(&stranger_ca, &["node-2"], &[]);
        // The stranger trusts the cluster's authority, so what is refused is its own certificate.
        let (one, forged) = (files(&node_1, &ca_pem), files(&forged_2, &ca_pem));
        let one = ClusterTls::load(&one.settings, 1).unwrap().unwrap();
        let forged = ClusterTls::load(&forged.settings, 2).unwrap().unwrap();
        let error = handshake(&forged, 1, &one).unwrap_err();
        assert!(error.starts_with("server:"), "the acceptor refuses the stranger's client certificate: {error}");
        let error = handshake(&one, 2, &forged).unwrap_err();
        assert!(error.starts_with("client:"), "the dialler refuses the stranger's server certificate: {error}");
    }
}
