//! SASL mechanisms (issue 38, item 3): what a client's SaslAuthenticate bytes mean and what the
//! server answers, for PLAIN ([`plain`]), SCRAM-SHA-256 and SCRAM-SHA-512 ([`scram`]) and
//! OAUTHBEARER ([`oauthbearer`]).
//!
//! This module owns the mechanisms only: each is pure code that takes the client's bytes and gives
//! the server's bytes, a principal, or a typed error. The connection layer (SaslHandshake and
//! SaslAuthenticate frames, `sasl.server.max.receive.size`, running key derivations off the shard's
//! thread, rate limits, `connection.failed.authentication.delay.ms`) and the credential store (SCRAM
//! credentials in the quorum) live elsewhere and call in here: the caller looks a user's credential
//! up between the steps of a conversation.
//!
//! Rules kept here:
//! - No I/O, except that [`oauthbearer::JwtValidator`] reads its JWKS file (and only a local file).
//! - No secret is ever logged or formatted: errors carry no password, proof, key or token, and the
//!   Debug forms of credentials and conversations print no key material.
//! - Every input is bounded before it is parsed, and bad input is a typed error, never a panic.

use std::fmt;

pub mod oauthbearer;
pub mod plain;
pub mod scram;

pub use oauthbearer::OAuthBearerError;
pub use plain::PlainError;
pub use scram::{ScramError, ScramMechanism};

/// The SASL mechanisms shardlog offers, with Kafka's names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SaslMechanism {
    /// `PLAIN` (RFC 4616), checked against the user's SCRAM credential.
    Plain,
    /// `SCRAM-SHA-256` (RFC 7677).
    ScramSha256,
    /// `SCRAM-SHA-512`.
    ScramSha512,
    /// `OAUTHBEARER` (RFC 7628) with JWTs checked against a JWKS file.
    OAuthBearer,
}

impl SaslMechanism {
    /// Every mechanism, in the order SaslHandshake lists them.
    pub const ALL: [SaslMechanism; 4] =
        [SaslMechanism::Plain, SaslMechanism::ScramSha256, SaslMechanism::ScramSha512, SaslMechanism::OAuthBearer];

    /// Kafka's name, as in `sasl.enabled.mechanisms` and SaslHandshake.
    pub fn name(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
            SaslMechanism::OAuthBearer => "OAUTHBEARER",
        }
    }

    /// The mechanism of a name. Kafka compares mechanism names exactly, so `plain` is unknown.
    pub fn from_name(name: &str) -> Result<Self, SaslError> {
        Self::ALL.into_iter().find(|m| m.name() == name).ok_or_else(|| SaslError::UnknownMechanism {
            // The name comes from the client: keep only a bounded, printable prefix for messages.
            name: name.chars().take(64).filter(|c| !c.is_control()).collect(),
        })
    }

    /// The SCRAM mechanism this is, if it is one.
    pub fn scram(self) -> Option<ScramMechanism> {
        match self {
            SaslMechanism::ScramSha256 => Some(ScramMechanism::Sha256),
            SaslMechanism::ScramSha512 => Some(ScramMechanism::Sha512),
            SaslMechanism::Plain | SaslMechanism::OAuthBearer => None,
        }
    }
}

impl fmt::Display for SaslMechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for SaslMechanism {
    type Err = SaslError;

    fn from_str(name: &str) -> Result<Self, SaslError> {
        Self::from_name(name)
    }
}

/// Why authentication failed, for the connection layer: one enum over the mechanisms' own errors.
/// Its Display is safe to log and to return in SaslAuthenticate's error message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SaslError {
    /// A mechanism shardlog does not offer (UNSUPPORTED_SASL_MECHANISM).
    #[error("unsupported SASL mechanism {name:?}")]
    UnknownMechanism { name: String },
    /// PLAIN refused the login.
    #[error(transparent)]
    Plain(#[from] PlainError),
    /// A SCRAM conversation failed.
    #[error(transparent)]
    Scram(#[from] ScramError),
    /// OAUTHBEARER refused the token or the message.
    #[error(transparent)]
    OAuthBearer(#[from] OAuthBearerError),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mechanism_names_are_kafkas_exact_upper_case() {
        for mechanism in SaslMechanism::ALL {
            assert_eq!(SaslMechanism::from_name(mechanism.name()), Ok(mechanism));
            assert_eq!(mechanism.name().parse::<SaslMechanism>(), Ok(mechanism));
        }
        assert_eq!(SaslMechanism::from_name("plain"), Err(SaslError::UnknownMechanism { name: "plain".to_owned() }));
        assert!(SaslMechanism::from_name("GSSAPI").is_err());
        assert!(SaslMechanism::from_name("").is_err());
        assert_eq!(SaslMechanism::ScramSha512.scram(), Some(ScramMechanism::Sha512));
        assert_eq!(SaslMechanism::ScramSha256.scram().map(ScramMechanism::name), Some("SCRAM-SHA-256"));
        assert_eq!(SaslMechanism::Plain.scram(), None);
    }

    #[test]
    fn unknown_mechanism_message_is_bounded() {
        let name = format!("{}\n{}", "X".repeat(100), "Y");
        let SaslError::UnknownMechanism { name: shown } = SaslMechanism::from_name(&name).unwrap_err() else {
            panic!("wrong error");
        };
        assert_eq!(shown, "X".repeat(64));
    }
}
