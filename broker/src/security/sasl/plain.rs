//! PLAIN (RFC 4616) as Kafka's `PlainSaslServer` takes it: one message, `authzid NUL authcid NUL
//! passwd`, checked against the user's SCRAM credential (shardlog stores no password, so the
//! password is derived with the credential's salt and iterations and the stored keys compared).
//!
//! [`verify`] costs a full PBKDF2 run (thousands of HMACs): the caller runs it off the shard's thread
//! and rate-limits it. An unknown user costs the same and fails the same way as a wrong password.
//!
//! Bounds: each of the three fields at most [`FIELD_MAX_BYTES`] (RFC 4616's 255 octets), so the
//! message at most [`MESSAGE_MAX_BYTES`].

use std::fmt;

use super::scram::{self, ScramCredential, ScramError, ScramMechanism};

/// The longest authzid, authcid or password (RFC 4616: "up to 255 octets").
pub const FIELD_MAX_BYTES: usize = 255;
/// The longest PLAIN message: three fields and two separators.
pub const MESSAGE_MAX_BYTES: usize = 3 * FIELD_MAX_BYTES + 2;

/// Why a PLAIN login was refused. No variant carries the password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PlainError {
    /// The message is longer than [`MESSAGE_MAX_BYTES`] or a field longer than [`FIELD_MAX_BYTES`].
    #[error("PLAIN message or field longer than RFC 4616 allows")]
    TooLong,
    /// Not three NUL-separated fields, an empty username or password, or not UTF-8.
    #[error("malformed PLAIN message: {0}")]
    Malformed(&'static str),
    /// The authorization id is neither empty nor the username (Kafka allows no impersonation).
    #[error("Authentication failed: Client requested an authorization id that is different from username")]
    AuthorizationIdMismatch,
    /// Wrong password or unknown user (indistinguishable on purpose).
    #[error("Authentication failed: Invalid username or password")]
    AuthenticationFailed,
    /// The stored credential could not be used (corrupt, or for the other mechanism).
    #[error("PLAIN check against the SCRAM credential failed: {0}")]
    Credential(#[from] ScramError),
}

/// A parsed PLAIN message. Debug shows the username only.
#[derive(Clone, PartialEq, Eq)]
pub struct PlainRequest {
    username: String,
    password: String,
}

impl PlainRequest {
    /// Parses `authzid NUL authcid NUL passwd`; the authzid must be empty or equal the authcid.
    pub fn parse(message: &[u8]) -> Result<Self, PlainError> {
        if message.len() > MESSAGE_MAX_BYTES {
            return Err(PlainError::TooLong);
        }
        let mut fields = message.split(|&b| b == 0);
        let (Some(authzid), Some(username), Some(password), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(PlainError::Malformed("expected authzid NUL authcid NUL passwd"));
        };
        if [authzid, username, password].iter().any(|field| field.len() > FIELD_MAX_BYTES) {
            return Err(PlainError::TooLong);
        }
        let text = |field: &[u8]| String::from_utf8(field.to_vec()).map_err(|_| PlainError::Malformed("not UTF-8"));
        let (authzid, username, password) = (text(authzid)?, text(username)?, text(password)?);
        if username.is_empty() {
            return Err(PlainError::Malformed("empty username"));
        }
        if password.is_empty() {
            return Err(PlainError::Malformed("empty password"));
        }
        if !authzid.is_empty() && authzid != username {
            return Err(PlainError::AuthorizationIdMismatch);
        }
        Ok(PlainRequest { username, password })
    }

    /// The username (authcid): the caller looks its credential up.
    pub fn username(&self) -> &str {
        &self.username
    }
}

impl fmt::Debug for PlainRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PlainRequest").field("username", &self.username).finish_non_exhaustive()
    }
}

/// Checks the request's password against the user's credential for `mechanism` (`None`: unknown
/// user, which is refused after the same work as a wrong password). Derives the password with the
/// credential's salt and iterations and compares the stored keys in constant time.
pub fn verify(
    request: &PlainRequest,
    mechanism: ScramMechanism,
    credential: Option<&ScramCredential>,
) -> Result<(), PlainError> {
    let (salt, iterations, stored_key, known_user) = match credential {
        Some(credential) if credential.fits(mechanism) => {
            (&credential.salt[..], credential.iterations, &credential.stored_key[..], true)
        }
        Some(_) => return Err(ScramError::CredentialMismatch { mechanism }.into()),
        // The same cost as a credential at Kafka's default iterations; an empty stored key, which no
        // derivation equals (and the user is refused whatever the comparison says).
        None => (&b"unknown user"[..], ScramMechanism::MIN_ITERATIONS, &[0u8; 0][..], false),
    };
    let derived = ScramCredential::derive(mechanism, request.password.as_bytes(), salt, iterations)?;
    let matches = scram::constant_time_eq(&derived.stored_key, stored_key)?;
    if matches && known_user { Ok(()) } else { Err(PlainError::AuthenticationFailed) }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(mechanism: ScramMechanism, password: &str) -> ScramCredential {
        ScramCredential::derive(mechanism, password.as_bytes(), b"some salt", 4096).unwrap()
    }

    #[test]
    fn good_password_is_accepted_for_both_mechanisms() {
        for mechanism in ScramMechanism::ALL {
            let request = PlainRequest::parse(b"\0alice\0s3cret").unwrap();
            assert_eq!(request.username(), "alice");
            assert_eq!(verify(&request, mechanism, Some(&stored(mechanism, "s3cret"))), Ok(()));
        }
        let with_authzid = PlainRequest::parse(b"alice\0alice\0s3cret").unwrap();
        let credential = stored(ScramMechanism::Sha256, "s3cret");
        assert_eq!(verify(&with_authzid, ScramMechanism::Sha256, Some(&credential)), Ok(()));
    }

    #[test]
    fn wrong_password_and_unknown_user_fail_alike() {
        let credential = stored(ScramMechanism::Sha512, "s3cret");
        let wrong = PlainRequest::parse(b"\0alice\0S3cret").unwrap();
        assert_eq!(verify(&wrong, ScramMechanism::Sha512, Some(&credential)), Err(PlainError::AuthenticationFailed));
        let unknown = PlainRequest::parse(b"\0mallory\0s3cret").unwrap();
        assert_eq!(verify(&unknown, ScramMechanism::Sha512, None), Err(PlainError::AuthenticationFailed));
    }

    #[test]
    fn credential_of_the_other_mechanism_is_an_error_not_a_login() {
        let request = PlainRequest::parse(b"\0alice\0s3cret").unwrap();
        let sha512 = stored(ScramMechanism::Sha512, "s3cret");
        assert_eq!(
            verify(&request, ScramMechanism::Sha256, Some(&sha512)),
            Err(PlainError::Credential(ScramError::CredentialMismatch { mechanism: ScramMechanism::Sha256 }))
        );
    }

    #[test]
    fn bad_framing_is_refused() {
        let long_field = [&[0u8][..], &[b'a'; 256][..], b"\0pw"].concat();
        let cases: [(&[u8], PlainError); 9] = [
            (b"", PlainError::Malformed("expected authzid NUL authcid NUL passwd")),
            (b"alice", PlainError::Malformed("expected authzid NUL authcid NUL passwd")),
            (b"\0alice", PlainError::Malformed("expected authzid NUL authcid NUL passwd")),
            (b"\0alice\0pw\0", PlainError::Malformed("expected authzid NUL authcid NUL passwd")),
            (b"\0\0pw", PlainError::Malformed("empty username")),
            (b"\0alice\0", PlainError::Malformed("empty password")),
            (b"\0al\xffice\0pw", PlainError::Malformed("not UTF-8")),
            (&long_field, PlainError::TooLong),
            (&[b'a'; MESSAGE_MAX_BYTES + 1], PlainError::TooLong),
        ];
        for (message, expected) in cases {
            assert_eq!(PlainRequest::parse(message), Err(expected), "{message:?}");
        }
    }

    #[test]
    fn authzid_other_than_the_username_is_refused() {
        assert_eq!(PlainRequest::parse(b"admin\0alice\0pw"), Err(PlainError::AuthorizationIdMismatch));
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_parse_to_an_error_or_a_bounded_request(
            message in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..800),
        ) {
            if let Ok(request) = PlainRequest::parse(&message) {
                proptest::prop_assert!(!request.username().is_empty());
                proptest::prop_assert!(request.username().len() <= FIELD_MAX_BYTES);
                proptest::prop_assert!(!request.username().contains('\0'));
            }
        }
    }

    #[test]
    fn debug_shows_no_password() {
        let request = PlainRequest::parse(b"\0alice\0hunter2").unwrap();
        let shown = format!("{request:?}");
        assert!(shown.contains("alice") && !shown.contains("hunter2"), "{shown}");
    }
}
