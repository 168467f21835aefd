//! `faults --security sasl_ssl`: the campaign's cluster secured everywhere, as `docs/security.md` §8 and
//! §8a set one up. Clients (the workload, the nemesis's admin calls) reach the brokers' only listener over
//! SASL_SSL with SCRAM-SHA-512; that listener is also the inter-broker one, so followers replicate through
//! it over cluster mTLS, and the brokers reach the quorum over cluster mTLS too. Kafka's StandardAuthorizer
//! is on, with the campaign's user as the super user. The certificates (two authorities: one for the
//! listeners, one for the nodes) and the client's properties file are made here, with rcgen, in the
//! report folder's `certificates/`.

use std::net::IpAddr;
use std::path::Path;

use anyhow::{Context, Result};
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, SanType};
use shardlog_broker::client::ClientSecurity;

/// How the campaign's clients and brokers talk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Security {
    /// No TLS, no SASL, no authorizer, no cluster mTLS.
    #[default]
    Plaintext,
    /// SASL_SSL (SCRAM-SHA-512) for clients, cluster mTLS for replication and the quorum, ACLs on.
    #[value(name = "sasl_ssl", alias = "sasl-ssl")]
    SaslSsl,
}

/// The user the workload and the nemesis authenticate as.
const USER: &str = "campaign";

/// What a secured campaign adds to its brokers and gives its clients.
pub struct Secured {
    /// Settings for every broker (`{id}`, `{host}` and `{port}` filled in per broker by the cluster).
    pub settings: Vec<String>,
    /// Further arguments of every broker: the user, made when the cluster is formed.
    pub broker_args: Vec<String>,
    pub client: ClientSecurity,
    /// The same for librdkafka clients (the transactional workload): its settings' names and values.
    pub rdkafka: Vec<(String, String)>,
}

/// Makes the certificates for brokers 1..=`hosts.len()` (broker `id` listens on `hosts[id - 1]`), the
/// campaign user's password and its properties file in `dir`.
pub fn prepare(dir: &Path, hosts: &[IpAddr]) -> Result<Secured> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("write {}", path.display()))?;
        Ok::<_, anyhow::Error>(path.display().to_string())
    };
    let clients_ca = Authority::new("shardlog campaign CA")?;
    let cluster_ca = Authority::new("shardlog campaign cluster CA")?;
    let ca = write("ca.pem", &clients_ca.pem)?;
    let cluster_trust = write("cluster-ca.pem", &cluster_ca.pem)?;
    for (index, host) in hosts.iter().enumerate() {
        let id = index + 1;
        // The listener's certificate names the address clients dial.
        let mut listener = CertificateParams::new(Vec::<String>::new())?;
        listener.subject_alt_names = vec![SanType::IpAddress(*host)];
        listener.distinguished_name.push(DnType::CommonName, host.to_string());
        listener.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        write(&format!("broker-{id}.pem"), &clients_ca.keystore(listener)?)?;
        // The node certificate names the node, for both ends of replication and quorum connections.
        let mut node = CertificateParams::new(Vec::<String>::new())?;
        node.distinguished_name.push(DnType::CommonName, format!("node-{id}"));
        node.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        write(&format!("node-{id}.pem"), &cluster_ca.keystore(node)?)?;
    }
    let password = uuid::Uuid::new_v4().simple().to_string();
    let properties = write(
        "client.properties",
        &format!(
            "# The campaign user's settings: shardlog's tools take them with --command-config, kcat with -F.\n\
             security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\nsasl.username={USER}\n\
             sasl.password={password}\nssl.ca.location={ca}\n"
        ),
    )?;
    let client = ClientSecurity::load(Some(Path::new(&properties)))?;
    let file = |name: &str| dir.join(name).display().to_string();
    let settings = vec![
        "listeners=SASL_SSL://{host}:{port}".to_string(),
        format!("ssl.keystore.location={}", file("broker-{id}.pem")),
        "sasl.enabled.mechanisms=SCRAM-SHA-512".to_string(),
        format!("cluster.ssl.keystore.location={}", file("node-{id}.pem")),
        format!("cluster.ssl.truststore.location={cluster_trust}"),
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer".to_string(),
        format!("super.users=User:{USER}"),
    ];
    let broker_args = vec!["--add-scram".to_string(), format!("SCRAM-SHA-512=[name={USER},password={password}]")];
    let rdkafka = [
        ("security.protocol", "SASL_SSL".to_string()),
        ("sasl.mechanism", "SCRAM-SHA-512".to_string()),
        ("sasl.username", USER.to_string()),
        ("sasl.password", password),
        ("ssl.ca.location", ca.clone()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    Ok(Secured { settings, broker_args, client, rdkafka })
}

/// A certificate authority made for one campaign.
struct Authority {
    issuer: Issuer<'static, KeyPair>,
    pem: String,
}

impl Authority {
    fn new(name: &str) -> Result<Authority> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate()?;
        let pem = params.self_signed(&key)?.pem();
        Ok(Authority { issuer: Issuer::new(params, key), pem })
    }

    /// A Kafka PEM keystore: a new key, then the certificate this authority signs for it.
    fn keystore(&self, params: CertificateParams) -> Result<String> {
        let key = KeyPair::generate()?;
        let certificate = params.signed_by(&key, &self.issuer)?;
        Ok(format!("{}{}", key.serialize_pem(), certificate.pem()))
    }
}
