//! Who a connection speaks for: Kafka's principal (`User:alice`), from the listener's protocol and what the
//! client proved — `User:ANONYMOUS` on a PLAINTEXT listener, or on an SSL listener without a client
//! certificate; the mapped subject of the client's certificate on an SSL listener; the SASL identity on
//! the SASL listeners.

use x509_parser::prelude::{FromDer, X509Certificate};

use crate::config::principal::PrincipalRules;

/// Kafka's principal: a type (always `User` here) and a name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Principal {
    pub name: String,
}

impl Principal {
    /// Kafka's `User:ANONYMOUS`: a connection that proved nothing.
    pub fn anonymous() -> Principal {
        Principal::user("ANONYMOUS")
    }

    pub fn user(name: &str) -> Principal {
        Principal { name: name.to_string() }
    }

    pub fn is_anonymous(&self) -> bool {
        self.name == "ANONYMOUS"
    }
}

impl std::fmt::Display for Principal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "User:{}", self.name)
    }
}

/// Why a client certificate gives no principal.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CertificatePrincipalError {
    #[error("the client certificate cannot be parsed")]
    Unparsable,
    #[error("no ssl.principal.mapping.rules rule matches the client certificate's subject {0:?}")]
    Unmapped(String),
}

/// The principal of a client certificate (DER): its subject in RFC 2253 form, mapped by the rules.
pub fn from_certificate(der: &[u8], rules: &PrincipalRules) -> Result<Principal, CertificatePrincipalError> {
    let subject = subject_rfc2253(der).ok_or(CertificatePrincipalError::Unparsable)?;
    let name = rules.apply(&subject).ok_or_else(|| CertificatePrincipalError::Unmapped(subject.clone()))?;
    Ok(Principal { name })
}

/// A certificate's subject as RFC 2253 writes it (and Kafka's `X500Principal.getName()`): the relative
/// names last to first, joined by commas, attributes by their short names (an OID otherwise), special
/// characters escaped.
pub fn subject_rfc2253(der: &[u8]) -> Option<String> {
    let (_, cert) = X509Certificate::from_der(der).ok()?;
    let mut parts = Vec::new();
    for rdn in cert.subject().iter().collect::<Vec<_>>().into_iter().rev() {
        let mut attributes = Vec::new();
        for attribute in rdn.iter() {
            let oid = attribute.attr_type().to_id_string();
            let key = match oid.as_str() {
                "2.5.4.3" => "CN".to_string(),
                "2.5.4.6" => "C".to_string(),
                "2.5.4.7" => "L".to_string(),
                "2.5.4.8" => "ST".to_string(),
                "2.5.4.9" => "STREET".to_string(),
                "2.5.4.10" => "O".to_string(),
                "2.5.4.11" => "OU".to_string(),
                "0.9.2342.19200300.100.1.25" => "DC".to_string(),
                "0.9.2342.19200300.100.1.1" => "UID".to_string(),
                other => other.to_string(),
            };
            let value = attribute.as_str().ok()?;
            attributes.push(format!("{key}={}", escape(value)));
        }
        parts.push(attributes.join("+"));
    }
    Some(parts.join(","))
}

/// RFC 2253 escaping of an attribute value.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        let special = matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';')
            || (i == 0 && (c == ' ' || c == '#'))
            || (i == last && c == ' ');
        if special {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate(subject: &[(rcgen::DnType, &str)]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (kind, value) in subject {
            params.distinguished_name.push(kind.clone(), *value);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn the_subject_reads_last_name_first_as_kafka_writes_it() {
        let der = certificate(&[
            (rcgen::DnType::CountryName, "DE"),
            (rcgen::DnType::OrganizationName, "Example, Inc"),
            (rcgen::DnType::CommonName, "billing"),
        ]);
        assert_eq!(subject_rfc2253(&der).unwrap(), r"CN=billing,O=Example\, Inc,C=DE");
    }

    #[test]
    fn the_mapping_rules_turn_the_subject_into_the_principal() {
        let der = certificate(&[(rcgen::DnType::OrganizationName, "Example"), (rcgen::DnType::CommonName, "Billing")]);
        let rules = PrincipalRules::parse("RULE:^CN=([^,]*),O=Example$/$1/L").unwrap();
        assert_eq!(from_certificate(&der, &rules).unwrap().to_string(), "User:billing");
        let strict = PrincipalRules::parse("RULE:^CN=([^,]*),O=Other$/$1/").unwrap();
        assert!(matches!(from_certificate(&der, &strict), Err(CertificatePrincipalError::Unmapped(_))));
        let default = PrincipalRules::parse("DEFAULT").unwrap();
        assert_eq!(from_certificate(&der, &default).unwrap().name, "CN=Billing,O=Example");
    }
}
