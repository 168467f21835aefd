//! The Kafka listeners, with Kafka's settings: `listeners` (`NAME://HOST:PORT,...`),
//! `advertised.listeners`, `listener.security.protocol.map`, `inter.broker.listener.name`, the `ssl.*`
//! settings, and their per-listener overrides `listener.name.<name>.<setting>`.
//!
//! This is the validation only: which listeners there are, what each speaks and where its certificate
//! files are. Nothing here reads a file; the files are read when the broker starts
//! (`crate::security::tls`), so a config can be checked on a host that does not hold them.
//!
//! Unlike Kafka, brokers do not reach each other over a Kafka listener (replication has its own protocol,
//! the quorum its own port), so a config whose only listener is SASL_SSL is valid; the inter-broker
//! listener is the one whose advertised address a broker registers for its peers.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{ConfigError, Endpoint, invalid};

/// What a listener speaks (Kafka's `SecurityProtocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub const ALL: [SecurityProtocol; 4] = [
        SecurityProtocol::Plaintext,
        SecurityProtocol::Ssl,
        SecurityProtocol::SaslPlaintext,
        SecurityProtocol::SaslSsl,
    ];

    /// Kafka's name (upper case).
    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    pub fn parse(text: &str) -> Option<SecurityProtocol> {
        SecurityProtocol::ALL.into_iter().find(|p| p.name().eq_ignore_ascii_case(text.trim()))
    }

    /// Whether connections are TLS.
    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    /// Whether clients authenticate with SASL.
    pub fn sasl(self) -> bool {
        matches!(self, SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl)
    }
}

impl std::fmt::Display for SecurityProtocol {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// `ssl.client.auth`: whether a TLS listener asks clients for a certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClientAuth {
    /// No certificate is asked for.
    None,
    /// Asked for; a client without one is served (as `User:ANONYMOUS` on an SSL listener), a client with
    /// an untrusted one is refused.
    Requested,
    /// A client without a trusted certificate is refused in the handshake.
    Required,
}

impl ClientAuth {
    fn parse(key: &str, text: &str) -> Result<ClientAuth, ConfigError> {
        match text.trim().to_ascii_lowercase().as_str() {
            "none" => Ok(ClientAuth::None),
            "requested" => Ok(ClientAuth::Requested),
            "required" => Ok(ClientAuth::Required),
            other => Err(invalid(key, format!("{other:?}: expected none, requested or required"))),
        }
    }
}

/// A TLS version `ssl.enabled.protocols` may name: TLS 1.2 and 1.3 only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    Tls12,
    Tls13,
}

/// The TLS side of a listener, after the per-listener overrides are applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    /// `ssl.keystore.location`: a PEM file with the private key and the certificate chain.
    pub keystore: PathBuf,
    /// `ssl.truststore.location`: PEM certificates of the authorities client certificates are checked
    /// against; required when clients are asked for certificates.
    pub truststore: Option<PathBuf>,
    pub client_auth: ClientAuth,
    /// `ssl.principal.mapping.rules`, as written (checked here, applied by `crate::security::principal`).
    pub principal_rules: String,
    /// `ssl.enabled.protocols`.
    pub versions: Vec<TlsVersion>,
}

/// One Kafka listener.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    /// Its name, upper case (`PLAINTEXT`, `CLIENTS`, ...).
    pub name: String,
    pub protocol: SecurityProtocol,
    /// Where it listens (port 0: any free port, for tests).
    pub bind: Endpoint,
    /// What Metadata tells the clients that connected through it.
    pub advertised: Endpoint,
    /// Present exactly when the protocol is TLS.
    pub tls: Option<TlsSettings>,
    /// `sasl.enabled.mechanisms` (Kafka's names) for a SASL listener; empty for the others.
    pub sasl_mechanisms: Vec<String>,
    /// `listener.name.<name>.max.connection.creation.rate`: connections this listener accepts per second
    /// (`None`: unbounded), besides the broker-wide `max.connection.creation.rate`.
    pub max_connection_creation_rate: Option<u32>,
}

/// The SASL mechanisms shardlog serves, by Kafka's names.
pub const SASL_MECHANISMS: [&str; 4] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"];

/// The settings a listener may override with `listener.name.<name>.<setting>`.
pub const PER_LISTENER: &[&str] = &[
    "ssl.keystore.type",
    "ssl.keystore.location",
    "ssl.truststore.type",
    "ssl.truststore.location",
    "ssl.client.auth",
    "ssl.principal.mapping.rules",
    "ssl.enabled.protocols",
    "sasl.enabled.mechanisms",
    "max.connection.creation.rate",
];

/// The base `ssl.*` settings that are rows of the settings table.
pub const BASE_SSL: [&str; 5] = [
    "ssl.keystore.location",
    "ssl.truststore.location",
    "ssl.client.auth",
    "ssl.principal.mapping.rules",
    "ssl.enabled.protocols",
];

/// Kafka's default `listener.security.protocol.map`: each protocol's name maps to itself.
pub const DEFAULT_PROTOCOL_MAP: &str = "PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL";

/// The listener settings as given (the base `ssl.*` values hold the table's defaults when unset).
#[derive(Debug, Clone, Default)]
pub struct ListenerInputs {
    pub listeners: String,
    pub advertised: Option<String>,
    pub protocol_map: String,
    pub inter_broker: Option<String>,
    /// The base `ssl.*` settings by key.
    pub ssl: BTreeMap<&'static str, String>,
    /// `sasl.enabled.mechanisms`.
    pub sasl_mechanisms: String,
    /// `listener.name.<name>.<setting>`: (upper-cased name, setting) -> value.
    pub overrides: BTreeMap<(String, String), String>,
}

/// The listeners in the order `listeners` gives them, and which one peers are told about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listeners {
    pub all: Vec<Listener>,
    /// Index into `all` of the inter-broker listener (`inter.broker.listener.name`, else the first).
    pub inter_broker: usize,
}

impl Listeners {
    pub fn inter_broker(&self) -> &Listener {
        &self.all[self.inter_broker]
    }

    /// Validates the listener settings.
    pub fn parse(inputs: &ListenerInputs) -> Result<Listeners, ConfigError> {
        let map = protocol_map(&inputs.protocol_map)?;
        let mut all: Vec<Listener> = Vec::new();
        for item in list_items(&inputs.listeners) {
            let (name, bind) = named_endpoint("listeners", item)?;
            if all.iter().any(|l| l.name == name) {
                return Err(invalid("listeners", format!("listener {name} is named twice")));
            }
            if bind.port != 0
                && let Some(other) = all.iter().find(|l| l.bind.port == bind.port)
            {
                return Err(invalid(
                    "listeners",
                    format!("listeners {} and {name} both use port {}", other.name, bind.port),
                ));
            }
            let protocol = *map.get(&name).ok_or_else(|| {
                invalid(
                    "listener.security.protocol.map",
                    format!("listener {name} has no security protocol; add {name}:<PROTOCOL>"),
                )
            })?;
            all.push(Listener {
                name,
                protocol,
                advertised: bind.clone(),
                bind,
                tls: None,
                sasl_mechanisms: Vec::new(),
                max_connection_creation_rate: None,
            });
        }
        if all.is_empty() {
            return Err(invalid("listeners", "no listener given"));
        }
        if let Some(text) = &inputs.advertised {
            let items: Vec<&str> = list_items(text).collect();
            for item in &items {
                // A bare HOST:PORT advertises the only listener there is.
                let (name, endpoint) = if item.contains("://") {
                    named_endpoint("advertised.listeners", item)?
                } else if all.len() == 1 {
                    (all[0].name.clone(), bare_endpoint("advertised.listeners", item)?)
                } else {
                    return Err(invalid(
                        "advertised.listeners",
                        format!("{item:?} names no listener; with several listeners write NAME://HOST:PORT"),
                    ));
                };
                let listener = all
                    .iter_mut()
                    .find(|l| l.name == name)
                    .ok_or_else(|| invalid("advertised.listeners", format!("{name} is not one of the listeners")))?;
                listener.advertised = endpoint;
            }
        }
        if let Some(l) = all.iter().find(|l| l.advertised.port == 0) {
            return Err(invalid(
                "advertised.listeners",
                format!("listener {}: port 0 cannot be advertised; give its port", l.name),
            ));
        }
        let inter_broker = match &inputs.inter_broker {
            Some(name) => {
                let name = name.trim().to_ascii_uppercase();
                all.iter().position(|l| l.name == name).ok_or_else(|| {
                    invalid("inter.broker.listener.name", format!("{name} is not one of the listeners"))
                })?
            }
            None => 0,
        };
        for (name, key) in inputs.overrides.keys() {
            if !all.iter().any(|l| &l.name == name) {
                return Err(invalid(
                    &format!("listener.name.{}.{key}", name.to_ascii_lowercase()),
                    format!("{name} is not one of the listeners"),
                ));
            }
        }
        check_base_ssl(&inputs.ssl)?;
        let base_mechanisms = sasl_mechanisms("sasl.enabled.mechanisms", &inputs.sasl_mechanisms)?;
        for listener in &mut all {
            let own = (listener.name.clone(), "max.connection.creation.rate".to_string());
            if let Some(text) = inputs.overrides.get(&own) {
                let key = format!("listener.name.{}.max.connection.creation.rate", listener.name.to_ascii_lowercase());
                let rate = text
                    .trim()
                    .parse::<u32>()
                    .ok()
                    .filter(|rate| (1..=i32::MAX as u32).contains(rate))
                    .ok_or_else(|| invalid(&key, format!("{text:?} is not a whole number from 1 to 2147483647")))?;
                // Kafka's default, Int.MaxValue, is no limit.
                listener.max_connection_creation_rate = Some(rate).filter(|rate| *rate < i32::MAX as u32);
            }
            if listener.protocol.tls() {
                listener.tls = Some(tls_settings(&listener.name, inputs)?);
            }
            if listener.protocol.sasl() {
                let own = (listener.name.clone(), "sasl.enabled.mechanisms".to_string());
                listener.sasl_mechanisms = match inputs.overrides.get(&own) {
                    Some(text) => {
                        let key =
                            format!("listener.name.{}.sasl.enabled.mechanisms", listener.name.to_ascii_lowercase());
                        sasl_mechanisms(&key, text)?
                    }
                    None => base_mechanisms.clone(),
                };
                if listener.sasl_mechanisms.is_empty() {
                    return Err(invalid(
                        "sasl.enabled.mechanisms",
                        format!(
                            "listener {} speaks {} but enables no SASL mechanism",
                            listener.name, listener.protocol
                        ),
                    ));
                }
            }
        }
        Ok(Listeners { all, inter_broker })
    }
}

/// The items of a list setting (Kafka's comma-separated form).
pub fn list_items(text: &str) -> impl Iterator<Item = &str> {
    text.split(',').map(str::trim).filter(|s| !s.is_empty())
}

fn protocol_map(text: &str) -> Result<BTreeMap<String, SecurityProtocol>, ConfigError> {
    let key = "listener.security.protocol.map";
    let mut map = BTreeMap::new();
    for item in list_items(text) {
        let (name, protocol) =
            item.split_once(':').ok_or_else(|| invalid(key, format!("{item:?} is not NAME:PROTOCOL")))?;
        let protocol = SecurityProtocol::parse(protocol).ok_or_else(|| {
            invalid(key, format!("{protocol:?} is not a security protocol (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)"))
        })?;
        let name = listener_name(key, name)?;
        if map.insert(name.clone(), protocol).is_some() {
            return Err(invalid(key, format!("{name} is mapped twice")));
        }
    }
    Ok(map)
}

fn listener_name(key: &str, name: &str) -> Result<String, ConfigError> {
    let name = name.trim();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        return Err(invalid(key, format!("{name:?} is not a listener name (letters, digits, _ and -)")));
    }
    Ok(name.to_ascii_uppercase())
}

/// `NAME://HOST:PORT`; a bare `HOST:PORT` is a PLAINTEXT listener, as shardlog always took it.
fn named_endpoint(key: &str, item: &str) -> Result<(String, Endpoint), ConfigError> {
    match item.split_once("://") {
        Some((name, rest)) => Ok((listener_name(key, name)?, bare_endpoint(key, rest)?)),
        None => Ok(("PLAINTEXT".to_string(), bare_endpoint(key, item)?)),
    }
}

/// `HOST:PORT` (an IPv6 host in brackets).
pub fn bare_endpoint(key: &str, text: &str) -> Result<Endpoint, ConfigError> {
    let text = text.trim();
    let (host, port) = text.rsplit_once(':').ok_or_else(|| invalid(key, format!("{text:?} is not HOST:PORT")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(invalid(key, format!("{text:?} has no host (0.0.0.0 listens on every address)")));
    }
    let port = port.parse().map_err(|_| invalid(key, format!("{text:?}: port is not a number 0-65535")))?;
    Ok(Endpoint { host: host.to_string(), port })
}

/// A TLS listener's settings: its `listener.name.<name>.ssl.*` overrides over the base `ssl.*` ones.
fn tls_settings(name: &str, inputs: &ListenerInputs) -> Result<TlsSettings, ConfigError> {
    let lower = name.to_ascii_lowercase();
    // The value in force and the key it came from (for messages).
    let get = |setting: &'static str| -> (Option<&String>, String) {
        match inputs.overrides.get(&(name.to_string(), setting.to_string())) {
            Some(v) => (Some(v), format!("listener.name.{lower}.{setting}")),
            None => (inputs.ssl.get(setting), setting.to_string()),
        }
    };
    for setting in ["ssl.keystore.type", "ssl.truststore.type"] {
        if let (Some(kind), key) = get(setting)
            && !kind.trim().eq_ignore_ascii_case("PEM")
        {
            return Err(invalid(&key, format!("{kind:?}: only PEM files are supported (no JKS or PKCS12)")));
        }
    }
    let keystore = match get("ssl.keystore.location") {
        (Some(path), _) if !path.trim().is_empty() => PathBuf::from(path.trim()),
        _ => {
            return Err(invalid(
                "ssl.keystore.location",
                format!(
                    "listener {name} speaks TLS but has no certificate: set ssl.keystore.location (or \
                     listener.name.{lower}.ssl.keystore.location) to a PEM file with its key and certificate chain"
                ),
            ));
        }
    };
    let truststore = get("ssl.truststore.location").0.map(|p| p.trim()).filter(|p| !p.is_empty()).map(PathBuf::from);
    let (auth, auth_key) = get("ssl.client.auth");
    let client_auth = ClientAuth::parse(&auth_key, auth.map_or("none", String::as_str))?;
    if client_auth != ClientAuth::None && truststore.is_none() {
        return Err(invalid(
            &auth_key,
            format!(
                "listener {name} asks clients for certificates but has no ssl.truststore.location to check them against"
            ),
        ));
    }
    let (rules, rules_key) = get("ssl.principal.mapping.rules");
    let principal_rules = rules.cloned().unwrap_or_else(|| "DEFAULT".to_string());
    crate::config::principal::PrincipalRules::parse(&principal_rules).map_err(|reason| invalid(&rules_key, reason))?;
    let (protocols, protocols_key) = get("ssl.enabled.protocols");
    let versions = tls_versions(&protocols_key, protocols.map_or("TLSv1.2,TLSv1.3", String::as_str))?;
    Ok(TlsSettings { keystore, truststore, client_auth, principal_rules, versions })
}

/// A list of SASL mechanism names, each one shardlog serves (Kafka's exact upper-case names).
fn sasl_mechanisms(key: &str, text: &str) -> Result<Vec<String>, ConfigError> {
    let mut out: Vec<String> = Vec::new();
    for name in list_items(text) {
        if !SASL_MECHANISMS.contains(&name) {
            let reason = match name {
                "GSSAPI" => "GSSAPI (Kerberos) is not supported".to_string(),
                other => format!("{other:?} is not a SASL mechanism shardlog serves ({})", SASL_MECHANISMS.join(", ")),
            };
            return Err(invalid(key, reason));
        }
        if !out.iter().any(|m| m == name) {
            out.push(name.to_string());
        }
    }
    Ok(out)
}

/// The base `ssl.*` values are checked even when no listener uses them yet.
fn check_base_ssl(ssl: &BTreeMap<&'static str, String>) -> Result<(), ConfigError> {
    for key in ["ssl.keystore.type", "ssl.truststore.type"] {
        if let Some(kind) = ssl.get(key)
            && !kind.trim().eq_ignore_ascii_case("PEM")
        {
            return Err(invalid(key, format!("{kind:?}: only PEM files are supported (no JKS or PKCS12)")));
        }
    }
    if let Some(auth) = ssl.get("ssl.client.auth") {
        ClientAuth::parse("ssl.client.auth", auth)?;
    }
    if let Some(rules) = ssl.get("ssl.principal.mapping.rules") {
        crate::config::principal::PrincipalRules::parse(rules)
            .map_err(|reason| invalid("ssl.principal.mapping.rules", reason))?;
    }
    if let Some(protocols) = ssl.get("ssl.enabled.protocols") {
        tls_versions("ssl.enabled.protocols", protocols)?;
    }
    Ok(())
}

fn tls_versions(key: &str, text: &str) -> Result<Vec<TlsVersion>, ConfigError> {
    let mut out = Vec::new();
    for item in list_items(text) {
        let version = match item {
            "TLSv1.2" => TlsVersion::Tls12,
            "TLSv1.3" => TlsVersion::Tls13,
            other => return Err(invalid(key, format!("{other:?}: only TLSv1.2 and TLSv1.3 are supported"))),
        };
        if !out.contains(&version) {
            out.push(version);
        }
    }
    if out.is_empty() {
        return Err(invalid(key, "no protocol given"));
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inputs(listeners: &str) -> ListenerInputs {
        ListenerInputs {
            listeners: listeners.to_string(),
            protocol_map: DEFAULT_PROTOCOL_MAP.to_string(),
            // `sasl.enabled.mechanisms`' default.
            sasl_mechanisms: "SCRAM-SHA-256,SCRAM-SHA-512".to_string(),
            ..ListenerInputs::default()
        }
    }

    fn error(inputs: &ListenerInputs) -> String {
        Listeners::parse(inputs).unwrap_err().to_string()
    }

    #[test]
    fn a_bare_host_and_port_is_one_plaintext_listener_advertised_as_bound() {
        let l = Listeners::parse(&inputs("127.0.0.1:9092")).unwrap();
        assert_eq!(l.all.len(), 1);
        assert_eq!((l.all[0].name.as_str(), l.all[0].protocol), ("PLAINTEXT", SecurityProtocol::Plaintext));
        assert_eq!(l.all[0].advertised.to_string(), "127.0.0.1:9092");
    }

    #[test]
    fn named_listeners_take_their_protocol_from_the_map_and_their_own_advertised_address() {
        let mut i = inputs("CLIENTS://0.0.0.0:9093,PLAINTEXT://127.0.0.1:9092");
        i.protocol_map = format!("{DEFAULT_PROTOCOL_MAP},CLIENTS:SASL_PLAINTEXT");
        i.advertised = Some("CLIENTS://broker1.example:9093".into());
        i.inter_broker = Some("plaintext".into());
        let l = Listeners::parse(&i).unwrap();
        assert_eq!(l.all[0].protocol, SecurityProtocol::SaslPlaintext);
        assert_eq!(l.all[0].advertised.to_string(), "broker1.example:9093");
        assert_eq!(l.all[1].advertised.to_string(), "127.0.0.1:9092");
        assert_eq!(l.inter_broker().name, "PLAINTEXT");
    }

    #[test]
    fn unknown_protocols_unmapped_names_and_shared_ports_are_refused_with_the_reason() {
        let mut i = inputs("PLAINTEXT://127.0.0.1:9092");
        i.protocol_map = "PLAINTEXT:KERBEROS".into();
        assert!(error(&i).contains("not a security protocol"), "{}", error(&i));
        let i = inputs("INTERNAL://127.0.0.1:9092");
        assert!(error(&i).contains("INTERNAL has no security protocol"), "{}", error(&i));
        let i = inputs("PLAINTEXT://127.0.0.1:9092,SASL_PLAINTEXT://0.0.0.0:9092");
        assert!(error(&i).contains("both use port 9092"), "{}", error(&i));
        let i = inputs("PLAINTEXT://127.0.0.1:9092,PLAINTEXT://127.0.0.1:9093");
        assert!(error(&i).contains("named twice"), "{}", error(&i));
        let mut i = inputs("PLAINTEXT://127.0.0.1:9092");
        i.inter_broker = Some("INTERNAL".into());
        assert!(error(&i).contains("not one of the listeners"), "{}", error(&i));
        let mut i = inputs("SASL_PLAINTEXT://127.0.0.1:9092");
        i.sasl_mechanisms = String::new();
        assert!(error(&i).contains("enables no SASL mechanism"), "{}", error(&i));
    }

    #[test]
    fn a_tls_listener_without_its_certificate_is_refused() {
        let i = inputs("SSL://127.0.0.1:9093");
        assert!(error(&i).contains("has no certificate"), "{}", error(&i));
        let mut i = inputs("SSL://127.0.0.1:9093");
        i.ssl.insert("ssl.keystore.location", "/etc/shardlog/broker.pem".into());
        i.ssl.insert("ssl.keystore.type", "JKS".into());
        assert!(error(&i).contains("only PEM"), "{}", error(&i));
        let mut i = inputs("SSL://127.0.0.1:9093");
        i.ssl.insert("ssl.keystore.location", "/etc/shardlog/broker.pem".into());
        i.ssl.insert("ssl.client.auth", "required".into());
        assert!(error(&i).contains("no ssl.truststore.location"), "{}", error(&i));
    }

    #[test]
    fn per_listener_overrides_win_over_the_base_settings() {
        let mut i = inputs("SSL://127.0.0.1:9093,MTLS://127.0.0.1:9094");
        i.protocol_map = format!("{DEFAULT_PROTOCOL_MAP},MTLS:SSL");
        i.ssl.insert("ssl.keystore.location", "/etc/shardlog/broker.pem".into());
        i.overrides.insert(("MTLS".into(), "ssl.client.auth".into()), "required".into());
        i.overrides.insert(("MTLS".into(), "ssl.truststore.location".into()), "/etc/shardlog/ca.pem".into());
        i.overrides.insert(("MTLS".into(), "ssl.enabled.protocols".into()), "TLSv1.3".into());
        let l = Listeners::parse(&i).unwrap();
        let (plain, mutual) = (l.all[0].tls.as_ref().unwrap(), l.all[1].tls.as_ref().unwrap());
        assert_eq!((plain.client_auth, plain.truststore.as_ref()), (ClientAuth::None, None));
        assert_eq!(mutual.client_auth, ClientAuth::Required);
        assert_eq!(mutual.keystore, PathBuf::from("/etc/shardlog/broker.pem"));
        assert_eq!(mutual.versions, [TlsVersion::Tls13]);
        let mut i = inputs("PLAINTEXT://127.0.0.1:9092");
        i.overrides.insert(("OTHER".into(), "ssl.client.auth".into()), "required".into());
        assert!(error(&i).contains("OTHER is not one of the listeners"), "{}", error(&i));
        let mut i = inputs("SSL://127.0.0.1:9093");
        i.ssl.insert("ssl.keystore.location", "/etc/shardlog/broker.pem".into());
        i.ssl.insert("ssl.enabled.protocols", "TLSv1.1,TLSv1.2".into());
        assert!(error(&i).contains("only TLSv1.2 and TLSv1.3"), "{}", error(&i));
    }

    #[test]
    fn a_listener_may_have_a_connection_creation_rate_of_its_own() {
        let mut i = inputs("PLAINTEXT://127.0.0.1:9092,CLIENTS://127.0.0.1:9093");
        i.protocol_map = format!("{DEFAULT_PROTOCOL_MAP},CLIENTS:PLAINTEXT");
        i.overrides.insert(("CLIENTS".into(), "max.connection.creation.rate".into()), "20".into());
        let l = Listeners::parse(&i).unwrap();
        assert_eq!((l.all[0].max_connection_creation_rate, l.all[1].max_connection_creation_rate), (None, Some(20)));
        // Kafka's default, Int.MaxValue, is no limit.
        i.overrides.insert(("CLIENTS".into(), "max.connection.creation.rate".into()), "2147483647".into());
        assert_eq!(Listeners::parse(&i).unwrap().all[1].max_connection_creation_rate, None);
        for bad in ["0", "-1", "ten", "2147483648"] {
            i.overrides.insert(("CLIENTS".into(), "max.connection.creation.rate".into()), bad.into());
            let e = error(&i);
            assert!(
                e.contains("listener.name.clients.max.connection.creation.rate") && e.contains("1 to 2147483647"),
                "{bad}: {e}"
            );
        }
    }
}
