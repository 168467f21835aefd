//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), the client side, for shardlog's tools: the
//! three messages a client sends and the check of the server's signature, with no I/O.
//!
//! ```text
//! client_first()             -> client-first  (n,,n=user,r=client-nonce)
//! client_final(server-first) -> client-final  (c=biws,r=nonce,p=proof)
//! verify_server(server-final)                 (v=server-signature: the server knew the credential)
//! ```
//!
//! No channel binding (`n,,`) and no authorization id, as Kafka's clients; no SASLprep of the name or
//! the password (Kafka does none either).

use std::num::NonZeroU32;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::rand::{SecureRandom, SystemRandom};
use ring::{digest, hmac, pbkdf2};

use crate::security::sasl::scram::ScramMechanism;

/// Random bytes in the client's nonce.
const CLIENT_NONCE_RANDOM_BYTES: usize = 24;
/// The most iterations a server may ask for (Kafka's own bound): more would let a server make the
/// client spin.
const MAX_ITERATIONS: u32 = 16384;
/// The fewest iterations accepted (RFC 5802 asks for 4096 at least).
const MIN_ITERATIONS: u32 = 4096;

/// Why the exchange failed on the client's side.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScramClientError {
    #[error("malformed SCRAM server message: {0}")]
    Malformed(&'static str),
    #[error("the server's nonce does not start with ours")]
    NonceMismatch,
    #[error("the server asks for {0} iterations, outside 4096..=16384")]
    Iterations(u32),
    #[error("the server refused the proof: {0}")]
    ServerError(String),
    #[error("the server's signature is wrong: it does not know this user's credential")]
    BadServerSignature,
    #[error("SCRAM step out of order")]
    OutOfOrder,
    #[error("system random number generator failed")]
    Random,
}

enum State {
    Start,
    SentFirst { client_first_bare: String },
    SentFinal { server_signature: Vec<u8> },
    Done,
}

/// One client conversation.
pub struct ScramClient {
    mechanism: ScramMechanism,
    username: String,
    password: String,
    nonce: String,
    state: State,
}

impl std::fmt::Debug for ScramClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramClient")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// RFC 5802's `saslname`: `,` and `=` escaped.
fn encode_saslname(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

impl ScramClient {
    /// A conversation with a fresh random nonce.
    pub fn new(mechanism: ScramMechanism, username: &str, password: &str) -> Result<Self, ScramClientError> {
        let mut random = [0u8; CLIENT_NONCE_RANDOM_BYTES];
        SystemRandom::new().fill(&mut random).map_err(|_| ScramClientError::Random)?;
        Ok(Self::with_nonce(mechanism, username, password, URL_SAFE_NO_PAD.encode(random)))
    }

    /// A conversation with a given nonce (RFC 7677's example in the tests).
    pub(crate) fn with_nonce(mechanism: ScramMechanism, username: &str, password: &str, nonce: String) -> Self {
        assert!(!nonce.is_empty() && !nonce.contains(','), "a nonce is printable without commas");
        ScramClient {
            mechanism,
            username: username.to_string(),
            password: password.to_string(),
            nonce,
            state: State::Start,
        }
    }

    /// Step 1: client-first.
    pub fn client_first(&mut self) -> Result<Vec<u8>, ScramClientError> {
        if !matches!(self.state, State::Start) {
            return Err(ScramClientError::OutOfOrder);
        }
        let bare = format!("n={},r={}", encode_saslname(&self.username), self.nonce);
        let message = format!("n,,{bare}").into_bytes();
        self.state = State::SentFirst { client_first_bare: bare };
        Ok(message)
    }

    /// Step 2: takes server-first (`r=nonce,s=salt,i=iterations`) and gives client-final with the proof.
    pub fn client_final(&mut self, server_first: &[u8]) -> Result<Vec<u8>, ScramClientError> {
        let State::SentFirst { client_first_bare } = std::mem::replace(&mut self.state, State::Done) else {
            return Err(ScramClientError::OutOfOrder);
        };
        let server_first =
            std::str::from_utf8(server_first).map_err(|_| ScramClientError::Malformed("server-first not UTF-8"))?;
        if server_first.starts_with("m=") {
            return Err(ScramClientError::Malformed("mandatory extension in server-first"));
        }
        let mut attributes = server_first.split(',');
        let nonce = attributes
            .next()
            .and_then(|a| a.strip_prefix("r="))
            .ok_or(ScramClientError::Malformed("server-first nonce"))?;
        let salt = attributes
            .next()
            .and_then(|a| a.strip_prefix("s="))
            .and_then(|s| STANDARD.decode(s).ok())
            .filter(|s| !s.is_empty())
            .ok_or(ScramClientError::Malformed("server-first salt"))?;
        let iterations: u32 = attributes
            .next()
            .and_then(|a| a.strip_prefix("i="))
            .and_then(|i| i.parse().ok())
            .ok_or(ScramClientError::Malformed("server-first iterations"))?;
        if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
            return Err(ScramClientError::NonceMismatch);
        }
        if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&iterations) {
            return Err(ScramClientError::Iterations(iterations));
        }
        let (hmac_algorithm, pbkdf2_algorithm, digest_algorithm) = match self.mechanism {
            ScramMechanism::Sha256 => (hmac::HMAC_SHA256, pbkdf2::PBKDF2_HMAC_SHA256, &digest::SHA256),
            ScramMechanism::Sha512 => (hmac::HMAC_SHA512, pbkdf2::PBKDF2_HMAC_SHA512, &digest::SHA512),
        };
        let mut salted = vec![0u8; self.mechanism.hash_bytes()];
        let rounds = NonZeroU32::new(iterations).expect("checked to be at least 4096");
        pbkdf2::derive(pbkdf2_algorithm, rounds, &salt, self.password.as_bytes(), &mut salted);
        let salted_key = hmac::Key::new(hmac_algorithm, &salted);
        let client_key = hmac::sign(&salted_key, b"Client Key");
        let stored_key = digest::digest(digest_algorithm, client_key.as_ref());
        // `biws` is base64 of the gs2 header `n,,`.
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{client_first_bare},{server_first},{without_proof}");
        let client_signature =
            hmac::sign(&hmac::Key::new(hmac_algorithm, stored_key.as_ref()), auth_message.as_bytes());
        let proof: Vec<u8> = client_key.as_ref().iter().zip(client_signature.as_ref()).map(|(k, s)| k ^ s).collect();
        let server_key = hmac::sign(&salted_key, b"Server Key");
        let server_signature =
            hmac::sign(&hmac::Key::new(hmac_algorithm, server_key.as_ref()), auth_message.as_bytes());
        self.state = State::SentFinal { server_signature: server_signature.as_ref().to_vec() };
        Ok(format!("{without_proof},p={}", STANDARD.encode(proof)).into_bytes())
    }

    /// Step 3: checks server-final: `v=` must carry the signature only a server holding this user's
    /// credential can make; `e=` is the server's refusal.
    pub fn verify_server(&mut self, server_final: &[u8]) -> Result<(), ScramClientError> {
        let State::SentFinal { server_signature } = std::mem::replace(&mut self.state, State::Done) else {
            return Err(ScramClientError::OutOfOrder);
        };
        let text =
            std::str::from_utf8(server_final).map_err(|_| ScramClientError::Malformed("server-final not UTF-8"))?;
        if let Some(error) = text.strip_prefix("e=") {
            return Err(ScramClientError::ServerError(error.to_string()));
        }
        let signature = text
            .split(',')
            .next()
            .and_then(|v| v.strip_prefix("v="))
            .and_then(|v| STANDARD.decode(v).ok())
            .ok_or(ScramClientError::Malformed("server-final signature"))?;
        // Both are public once sent; a plain comparison leaks nothing.
        if signature != server_signature {
            return Err(ScramClientError::BadServerSignature);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::security::sasl::scram::{ScramCredential, ScramServer};

    fn credential(mechanism: ScramMechanism, password: &str) -> ScramCredential {
        ScramCredential::derive(mechanism, password.as_bytes(), b"a salt of some bytes", 4096).unwrap()
    }

    /// Runs a whole conversation against the broker's own server side.
    fn converse(mechanism: ScramMechanism, client_password: &str, server_password: &str) -> Result<(), String> {
        let mut client = ScramClient::new(mechanism, "app,=user", client_password).unwrap();
        let mut server = ScramServer::new(mechanism).unwrap();
        let user = server.client_first(&client.client_first().unwrap()).map_err(|e| e.to_string())?.to_string();
        assert_eq!(user, "app,=user", "the name's escapes are undone by the server");
        let server_first = server.server_first(Some(&credential(mechanism, server_password))).unwrap();
        let client_final = client.client_final(&server_first).map_err(|e| e.to_string())?;
        let server_final = server.client_final(&client_final).map_err(|e| e.to_string())?;
        client.verify_server(&server_final).map_err(|e| e.to_string())?;
        assert_eq!(server.authenticated_user(), Some("app,=user"));
        Ok(())
    }

    #[test]
    fn the_client_authenticates_to_the_brokers_scram_server_with_both_mechanisms() {
        for mechanism in ScramMechanism::ALL {
            converse(mechanism, "secret", "secret").unwrap();
        }
    }

    #[test]
    fn a_wrong_password_is_refused_by_the_server() {
        for mechanism in ScramMechanism::ALL {
            let error = converse(mechanism, "wrong", "secret").unwrap_err();
            assert!(error.contains("Authentication failed"), "{error}");
        }
    }

    #[test]
    fn rfc_7677s_example_gives_its_proof_and_accepts_its_server_signature() {
        let mut client =
            ScramClient::with_nonce(ScramMechanism::Sha256, "user", "pencil", "rOprNGfwEbeRWgbNEkqO".into());
        assert_eq!(client.client_first().unwrap(), b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        let client_final = client.client_final(server_first).unwrap();
        assert_eq!(
            String::from_utf8(client_final).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        client.verify_server(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=").unwrap();
    }

    #[test]
    fn a_server_that_does_not_know_the_credential_is_caught_by_its_signature() {
        let mut client = ScramClient::new(ScramMechanism::Sha512, "app", "secret").unwrap();
        let mut server = ScramServer::new(ScramMechanism::Sha512).unwrap();
        server.client_first(&client.client_first().unwrap()).unwrap();
        let server_first = server.server_first(Some(&credential(ScramMechanism::Sha512, "secret"))).unwrap();
        client.client_final(&server_first).unwrap();
        let forged = format!("v={}", STANDARD.encode([7u8; 64]));
        assert_eq!(client.verify_server(forged.as_bytes()), Err(ScramClientError::BadServerSignature));
    }

    #[test]
    fn server_first_messages_that_break_the_rules_are_refused() {
        let cases: [(&str, ScramClientError); 4] = [
            ("r=other,s=c2FsdA==,i=4096", ScramClientError::NonceMismatch),
            ("r=abc,s=c2FsdA==,i=4096", ScramClientError::NonceMismatch),
            ("r=abcdef,s=c2FsdA==,i=100000000", ScramClientError::Iterations(100_000_000)),
            ("r=abcdef,i=4096", ScramClientError::Malformed("server-first salt")),
        ];
        for (server_first, expected) in cases {
            let mut client = ScramClient::with_nonce(ScramMechanism::Sha256, "app", "secret", "abc".into());
            client.client_first().unwrap();
            assert_eq!(client.client_final(server_first.as_bytes()), Err(expected), "{server_first}");
        }
    }
}
