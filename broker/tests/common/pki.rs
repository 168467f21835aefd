//! Test certificates, made by the tests themselves (rcgen): an authority, broker certificates it signs
//! for 127.0.0.1 and localhost, client certificates, and the PEM files the broker and clients read.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};

/// A certificate authority and the directory its files go to.
pub struct Pki {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    /// `ca.pem`: the authority's certificate, the trust store of brokers and clients.
    pub ca: PathBuf,
}

/// A certificate with its key, written as PEM files.
pub struct Issued {
    /// The certificate chain (the certificate alone; the authority is the trust anchor).
    pub certificate: PathBuf,
    pub key: PathBuf,
    /// Key and certificate in one file: Kafka's PEM keystore (`ssl.keystore.location`).
    pub keystore: PathBuf,
    pub der: Vec<u8>,
}

impl Pki {
    pub fn new(dir: &Path, name: &str) -> Pki {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, format!("{name} test authority"));
        let key = KeyPair::generate().unwrap();
        let certificate = params.self_signed(&key).unwrap();
        let ca = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&ca, certificate.pem()).unwrap();
        Pki { dir: dir.to_path_buf(), issuer: Issuer::new(params, key), ca }
    }

    /// A server certificate for 127.0.0.1 and localhost, with `cn` as its common name.
    pub fn server(&self, file: &str, cn: &str) -> Issued {
        let mut params = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        self.issue(file, params)
    }

    /// A client certificate with the subject `CN=<cn>,O=<org>`.
    pub fn client(&self, file: &str, cn: &str, org: &str) -> Issued {
        self.client_valid_until(file, cn, org, None)
    }

    /// A client certificate that expired in 2020 (`Some`) or lasts (`None`).
    pub fn client_valid_until(&self, file: &str, cn: &str, org: &str, expired: Option<()>) -> Issued {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::OrganizationName, org);
        params.distinguished_name.push(DnType::CommonName, cn);
        if expired.is_some() {
            params.not_before = rcgen::date_time_ymd(2019, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 1, 1);
        }
        self.issue(file, params)
    }

    /// A node certificate for cluster mTLS: subject `CN=node-<id>`, for both ends of a connection.
    pub fn node(&self, file: &str, id: u32) -> Issued {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, format!("node-{id}"));
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        self.issue(file, params)
    }

    fn issue(&self, file: &str, params: CertificateParams) -> Issued {
        let key = KeyPair::generate().unwrap();
        let certificate = params.signed_by(&key, &self.issuer).unwrap();
        let (cert_path, key_path, keystore) = (
            self.dir.join(format!("{file}.crt")),
            self.dir.join(format!("{file}.key")),
            self.dir.join(format!("{file}.pem")),
        );
        std::fs::write(&cert_path, certificate.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        std::fs::write(&keystore, format!("{}{}", key.serialize_pem(), certificate.pem())).unwrap();
        Issued { certificate: cert_path, key: key_path, keystore, der: certificate.der().to_vec() }
    }
}
