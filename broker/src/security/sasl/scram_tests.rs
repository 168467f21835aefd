//! Tests of [`super`]: RFC 7677's example conversation, round trips against a client written here,
//! and every way a conversation must fail.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use proptest::prelude::*;
use ring::{digest, hmac};

use super::*;

// RFC 7677, section 3.
const RFC_CLIENT_FIRST: &str = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
const RFC_SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
const RFC_SERVER_FIRST: &str = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
const RFC_CLIENT_FINAL: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                                p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
const RFC_SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

fn rfc_credential() -> ScramCredential {
    let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
    ScramCredential::derive(ScramMechanism::Sha256, b"pencil", &salt, 4096).unwrap()
}

fn rfc_server() -> ScramServer {
    ScramServer::with_server_nonce(ScramMechanism::Sha256, RFC_SERVER_NONCE.to_owned())
}

/// A SCRAM client, written from RFC 5802 independently of the server's code paths.
struct TestClient {
    mechanism: ScramMechanism,
    gs2_header: String,
    client_first_bare: String,
}

impl TestClient {
    fn new(mechanism: ScramMechanism, username: &str) -> (Self, Vec<u8>) {
        let gs2_header = "n,,".to_owned();
        let client_first_bare = format!("n={username},r=fyko+d2lbbFgONRv9qkxdawL");
        let first = format!("{gs2_header}{client_first_bare}").into_bytes();
        (TestClient { mechanism, gs2_header, client_first_bare }, first)
    }

    /// client-final for `server_first`, and the server-final the client expects back.
    fn client_final(&self, server_first: &[u8], password: &str) -> (Vec<u8>, String) {
        self.client_final_echoing(server_first, password, |nonce| nonce.to_owned())
    }

    /// [`Self::client_final`] with the nonce sent back as `echo` makes it of the server's.
    fn client_final_echoing(
        &self,
        server_first: &[u8],
        password: &str,
        echo: impl Fn(&str) -> String,
    ) -> (Vec<u8>, String) {
        let server_first = std::str::from_utf8(server_first).unwrap();
        let mut nonce = "";
        let mut salt = Vec::new();
        let mut iterations = 0;
        for attribute in server_first.split(',') {
            let (key, value) = attribute.split_at(2);
            match key {
                "r=" => nonce = value,
                "s=" => salt = STANDARD.decode(value).unwrap(),
                "i=" => iterations = value.parse().unwrap(),
                _ => panic!("unexpected attribute {attribute}"),
            }
        }
        let (hmac_alg, pbkdf2_alg, digest_alg) = match self.mechanism {
            ScramMechanism::Sha256 => (hmac::HMAC_SHA256, pbkdf2::PBKDF2_HMAC_SHA256, &digest::SHA256),
            ScramMechanism::Sha512 => (hmac::HMAC_SHA512, pbkdf2::PBKDF2_HMAC_SHA512, &digest::SHA512),
        };
        let mut salted = vec![0u8; digest_alg.output_len()];
        pbkdf2::derive(pbkdf2_alg, NonZeroU32::new(iterations).unwrap(), &salt, password.as_bytes(), &mut salted);
        let salted = hmac::Key::new(hmac_alg, &salted);
        let client_key = hmac::sign(&salted, b"Client Key");
        let stored_key = digest::digest(digest_alg, client_key.as_ref());
        let without_proof = format!("c={},r={}", STANDARD.encode(&self.gs2_header), echo(nonce));
        let auth_message = format!("{},{server_first},{without_proof}", self.client_first_bare);
        let signature = hmac::sign(&hmac::Key::new(hmac_alg, stored_key.as_ref()), auth_message.as_bytes());
        let proof: Vec<u8> = client_key.as_ref().iter().zip(signature.as_ref()).map(|(k, s)| k ^ s).collect();
        let server_key = hmac::sign(&salted, b"Server Key");
        let server_signature = hmac::sign(&hmac::Key::new(hmac_alg, server_key.as_ref()), auth_message.as_bytes());
        (
            format!("{without_proof},p={}", STANDARD.encode(proof)).into_bytes(),
            format!("v={}", STANDARD.encode(server_signature.as_ref())),
        )
    }
}

/// Runs a whole conversation; the store holds `stored` for "alice" only.
fn converse(
    mechanism: ScramMechanism,
    username: &str,
    stored: &ScramCredential,
    password: &str,
) -> Result<Vec<u8>, ScramError> {
    let mut server = ScramServer::new(mechanism).unwrap();
    let (client, first) = TestClient::new(mechanism, username);
    let name = server.client_first(&first)?.to_owned();
    let server_first = server.server_first((name == "alice").then_some(stored))?;
    let (final_message, _) = client.client_final(&server_first, password);
    server.client_final(&final_message)
}

#[test]
fn rfc7677_example_conversation_gives_the_rfc_messages() {
    let mut server = rfc_server();
    assert_eq!(server.client_first(RFC_CLIENT_FIRST.as_bytes()).unwrap(), "user");
    let credential = rfc_credential();
    let server_first = server.server_first(Some(&credential)).unwrap();
    assert_eq!(std::str::from_utf8(&server_first).unwrap(), RFC_SERVER_FIRST);
    let server_final = server.client_final(RFC_CLIENT_FINAL.as_bytes()).unwrap();
    assert_eq!(std::str::from_utf8(&server_final).unwrap(), RFC_SERVER_FINAL);
    assert_eq!(server.authenticated_user(), Some("user"));
}

#[test]
fn credential_from_salted_password_equals_the_derived_one() {
    let salt = STANDARD.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
    let mut salted = [0u8; 32];
    pbkdf2::derive(pbkdf2::PBKDF2_HMAC_SHA256, NonZeroU32::new(4096).unwrap(), &salt, b"pencil", &mut salted);
    let from_salted = ScramCredential::from_salted_password(ScramMechanism::Sha256, &salted, &salt, 4096).unwrap();
    assert_eq!(from_salted, rfc_credential());
    assert_eq!(
        ScramCredential::from_salted_password(ScramMechanism::Sha512, &salted, &salt, 4096),
        Err(ScramError::CredentialMismatch { mechanism: ScramMechanism::Sha512 })
    );
}

#[test]
fn sha512_round_trip_against_a_test_client() {
    let salt = ScramCredential::new_salt().unwrap();
    let stored = ScramCredential::derive(ScramMechanism::Sha512, b"s3cret", &salt, 4096).unwrap();
    let mut server = ScramServer::new(ScramMechanism::Sha512).unwrap();
    let (client, first) = TestClient::new(ScramMechanism::Sha512, "alice");
    assert_eq!(server.client_first(&first).unwrap(), "alice");
    let server_first = server.server_first(Some(&stored)).unwrap();
    let (final_message, expected_server_final) = client.client_final(&server_first, "s3cret");
    let server_final = server.client_final(&final_message).unwrap();
    assert_eq!(String::from_utf8(server_final).unwrap(), expected_server_final);
    assert_eq!(server.authenticated_user(), Some("alice"));
}

#[test]
fn wrong_password_fails_authentication() {
    let stored = ScramCredential::derive(ScramMechanism::Sha256, b"right", b"salt", 4096).unwrap();
    assert_eq!(converse(ScramMechanism::Sha256, "alice", &stored, "wrong"), Err(ScramError::AuthenticationFailed));
    assert!(converse(ScramMechanism::Sha256, "alice", &stored, "right").is_ok());
}

#[test]
fn unknown_user_is_indistinguishable_from_a_wrong_password() {
    let stored = ScramCredential::derive(ScramMechanism::Sha512, b"right", b"salt", 4096).unwrap();
    let unknown = converse(ScramMechanism::Sha512, "mallory", &stored, "guess");
    let wrong = converse(ScramMechanism::Sha512, "alice", &stored, "guess");
    assert_eq!(unknown, Err(ScramError::AuthenticationFailed));
    assert_eq!(unknown, wrong);

    // The fake server-first has the shape of a real one and is the same on every attempt, so
    // asking twice does not reveal that the salt is made up.
    let first_of = |user: &str| {
        let mut server = ScramServer::with_server_nonce(ScramMechanism::Sha512, "n".to_owned());
        let (_, first) = TestClient::new(ScramMechanism::Sha512, user);
        server.client_first(&first).unwrap();
        String::from_utf8(server.server_first(None).unwrap()).unwrap()
    };
    let fake = first_of("mallory");
    assert_eq!(fake, first_of("mallory"));
    assert_ne!(fake, first_of("eve"));
    let salt = fake.split(",s=").nth(1).unwrap().split(',').next().unwrap();
    assert_eq!(STANDARD.decode(salt).unwrap().len(), SALT_BYTES);
    assert!(fake.ends_with(",i=4096"));
}

#[test]
fn wrong_nonce_is_refused() {
    let mut server = rfc_server();
    server.client_first(RFC_CLIENT_FIRST.as_bytes()).unwrap();
    server.server_first(Some(&rfc_credential())).unwrap();
    let tampered = RFC_CLIENT_FINAL.replace("k0,p=", "k1,p=");
    assert_eq!(server.client_final(tampered.as_bytes()), Err(ScramError::NonceMismatch));
    assert_eq!(server.authenticated_user(), None);
}

#[test]
fn old_librdkafka_sending_its_nonce_twice_is_accepted_and_nothing_looser() {
    // librdkafka before 2.6.1 sends r=<client nonce><client nonce><server nonce> (librdkafka#4895).
    let client_nonce = "fyko+d2lbbFgONRv9qkxdawL";
    let stored = ScramCredential::derive(ScramMechanism::Sha256, b"s3cret", b"salt", 4096).unwrap();
    let attempt = |echo: &dyn Fn(&str) -> String| {
        let mut server = ScramServer::new(ScramMechanism::Sha256).unwrap();
        let (client, first) = TestClient::new(ScramMechanism::Sha256, "alice");
        server.client_first(&first).unwrap();
        let server_first = server.server_first(Some(&stored)).unwrap();
        let (final_message, _) = client.client_final_echoing(&server_first, "s3cret", echo);
        server.client_final(&final_message).map(|_| ())
    };
    assert_eq!(attempt(&|n| format!("{client_nonce}{n}")), Ok(()));
    assert_eq!(attempt(&|n| format!("x{n}")), Err(ScramError::NonceMismatch));
    assert_eq!(attempt(&|n| format!("{client_nonce}{client_nonce}{n}")), Err(ScramError::NonceMismatch));
    assert_eq!(attempt(&|_| client_nonce.to_owned()), Err(ScramError::NonceMismatch));
}

#[test]
fn channel_binding_must_repeat_the_gs2_header() {
    // `y,,` is accepted, but then client-final must say `c=eSws` (base64 of "y,,"), not `c=biws`.
    let mut server = rfc_server();
    server.client_first(b"y,,n=user,r=rOprNGfwEbeRWgbNEkqO").unwrap();
    server.server_first(Some(&rfc_credential())).unwrap();
    assert_eq!(server.client_final(RFC_CLIENT_FINAL.as_bytes()), Err(ScramError::ChannelBindingMismatch));
}

#[test]
fn steps_out_of_order_are_refused() {
    let mut server = rfc_server();
    assert_eq!(server.server_first(None), Err(ScramError::OutOfOrder));
    let mut server = rfc_server();
    assert_eq!(server.client_final(RFC_CLIENT_FINAL.as_bytes()), Err(ScramError::OutOfOrder));
    let mut server = rfc_server();
    server.client_first(RFC_CLIENT_FIRST.as_bytes()).unwrap();
    assert_eq!(server.client_first(RFC_CLIENT_FIRST.as_bytes()), Err(ScramError::OutOfOrder));
    // A failed conversation stays failed.
    let mut server = rfc_server();
    assert!(server.client_first(b"garbage").is_err());
    assert_eq!(server.server_first(None), Err(ScramError::OutOfOrder));
}

#[test]
fn malformed_client_first_messages_get_typed_errors() {
    let long = format!("n,,n=user,r={}", "a".repeat(CLIENT_FIRST_MAX_BYTES));
    let long_nonce = format!("n,,n=user,r={}", "a".repeat(CLIENT_NONCE_MAX_BYTES + 1));
    let cases: [(&[u8], ScramError); 16] = [
        (b"", ScramError::Malformed("gs2 header")),
        (b"n,,", ScramError::Malformed("username")),
        (b"x,,n=user,r=abc", ScramError::Malformed("gs2 channel-binding flag")),
        (b"p=tls-unique,,n=user,r=abc", ScramError::ChannelBindingNotSupported),
        (b"n,,n=user", ScramError::Malformed("nonce")),
        (b"n,,n=user,r=a,b", ScramError::Malformed("extension")),
        (b"n,,n=user,r=", ScramError::Malformed("nonce")),
        (b"n,,n=,r=abc", ScramError::Malformed("saslname")),
        (b"n,,n=us=er,r=abc", ScramError::Malformed("saslname escape")),
        (b"n,,n=user=2,r=abc", ScramError::Malformed("saslname escape")),
        (b"n,,m=ext,n=user,r=abc", ScramError::UnsupportedExtension),
        (b"n,,n=user,r=abc,foo=bar", ScramError::UnsupportedExtension),
        (b"n,,n=user,r=abc,tokenauth=true", ScramError::DelegationTokensNotSupported),
        (b"n,a=admin,n=user,r=abc", ScramError::AuthorizationIdMismatch),
        (b"n,,n=\xff,r=abc", ScramError::Malformed("not UTF-8")),
        (long_nonce.as_bytes(), ScramError::Malformed("nonce longer than 256 bytes")),
    ];
    for (message, expected) in cases {
        let mut server = rfc_server();
        assert_eq!(server.client_first(message), Err(expected), "{:?}", String::from_utf8_lossy(message));
    }
    assert_eq!(
        rfc_server().client_first(long.as_bytes()),
        Err(ScramError::TooLong { len: long.len(), limit: CLIENT_FIRST_MAX_BYTES })
    );
}

#[test]
fn accepted_client_first_variants() {
    let accepted: [(&str, &str); 4] = [
        ("n,a=user,n=user,r=abc", "user"),
        ("n,,n=a=2Cb=3Dc,r=abc", "a,b=c"),
        ("n,a=a=2Cb,n=a=2Cb,r=abc", "a,b"),
        ("n,,n=user,r=abc,tokenauth=false", "user"),
    ];
    for (message, username) in accepted {
        let mut server = rfc_server();
        assert_eq!(server.client_first(message.as_bytes()), Ok(username), "{message}");
    }
}

#[test]
fn malformed_client_final_messages_get_typed_errors() {
    let cases: [(&str, ScramError); 6] = [
        ("c=biws,r=x", ScramError::Malformed("proof")),
        ("c=biws,r=x,p=!!", ScramError::Malformed("proof")),
        ("r=x,p=AAAA", ScramError::Malformed("channel binding")),
        ("c=biws,p=AAAA", ScramError::Malformed("nonce")),
        ("c=biws,r=x,ext,p=AAAA", ScramError::Malformed("extension")),
        ("c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=AAAA", ScramError::Malformed("proof length")),
    ];
    for (message, expected) in cases {
        let mut server = rfc_server();
        server.client_first(RFC_CLIENT_FIRST.as_bytes()).unwrap();
        server.server_first(Some(&rfc_credential())).unwrap();
        assert_eq!(server.client_final(message.as_bytes()), Err(expected), "{message}");
    }
}

#[test]
fn credential_for_the_other_mechanism_is_refused() {
    let mut server = rfc_server();
    server.client_first(RFC_CLIENT_FIRST.as_bytes()).unwrap();
    let sha512 = ScramCredential::derive(ScramMechanism::Sha512, b"pencil", b"salt", 4096).unwrap();
    assert_eq!(
        server.server_first(Some(&sha512)),
        Err(ScramError::CredentialMismatch { mechanism: ScramMechanism::Sha256 })
    );
}

#[test]
fn mechanism_names_codes_and_bounds_are_kafkas() {
    assert_eq!(ScramMechanism::from_name("SCRAM-SHA-256"), Some(ScramMechanism::Sha256));
    assert_eq!(ScramMechanism::from_name("SCRAM-SHA-512"), Some(ScramMechanism::Sha512));
    assert_eq!(ScramMechanism::from_name("scram-sha-256"), None);
    assert_eq!(ScramMechanism::from_type_code(1), Some(ScramMechanism::Sha256));
    assert_eq!(ScramMechanism::from_type_code(2), Some(ScramMechanism::Sha512));
    assert_eq!(ScramMechanism::from_type_code(0), None);
    assert_eq!(ScramMechanism::Sha512.type_code(), 2);
    assert!(ScramMechanism::Sha256.check_iterations(4096).is_ok());
    assert!(ScramMechanism::Sha256.check_iterations(16384).is_ok());
    assert_eq!(
        ScramMechanism::Sha256.check_iterations(4095),
        Err(ScramError::IterationsOutOfRange { iterations: 4095 })
    );
    assert!(ScramMechanism::Sha512.check_iterations(16385).is_err());
    assert!(ScramCredential::derive(ScramMechanism::Sha256, b"p", b"s", 0).is_err());
}

#[test]
fn debug_and_errors_print_no_key_material() {
    let credential = rfc_credential();
    let debug = format!("{credential:?}");
    assert!(debug.contains("iterations: 4096"), "{debug}");
    for secret in [&credential.stored_key, &credential.server_key, &credential.salt] {
        assert!(!debug.contains(&format!("{secret:?}")), "{debug}");
        assert!(!debug.contains(&STANDARD.encode(secret)), "{debug}");
    }
    let mut server = rfc_server();
    server.client_first(RFC_CLIENT_FIRST.as_bytes()).unwrap();
    server.server_first(Some(&credential)).unwrap();
    let error = server.client_final(RFC_CLIENT_FINAL.replace("dHzb", "dHzc").as_bytes()).unwrap_err();
    let shown = format!("{error} {error:?} {server:?}");
    assert!(!shown.contains("dHz") && !shown.contains("pencil"), "{shown}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_client_first_bytes_never_panic(message in proptest::collection::vec(any::<u8>(), 0..1200)) {
        let mut server = rfc_server();
        if let Ok(username) = server.client_first(&message) {
            // Whatever parses names a user and leads to a server-first that starts with the nonce.
            prop_assert!(!username.is_empty());
            let reply = server.server_first(None).unwrap();
            prop_assert!(reply.starts_with(b"r="));
        }
    }

    #[test]
    fn arbitrary_client_final_bytes_are_refused_without_panic(
        message in proptest::collection::vec(any::<u8>(), 0..1200),
        known in any::<bool>(),
    ) {
        let mut server = rfc_server();
        server.client_first(RFC_CLIENT_FIRST.as_bytes()).unwrap();
        let credential = rfc_credential();
        server.server_first(known.then_some(&credential)).unwrap();
        prop_assert!(server.client_final(&message).is_err());
        prop_assert_eq!(server.authenticated_user(), None);
    }

    #[test]
    fn structured_client_final_with_random_proof_is_refused(proof in proptest::collection::vec(any::<u8>(), 0..80)) {
        let mut server = rfc_server();
        server.client_first(RFC_CLIENT_FIRST.as_bytes()).unwrap();
        server.server_first(Some(&rfc_credential())).unwrap();
        let message = format!(
            "c=biws,r=rOprNGfwEbeRWgbNEkqO{RFC_SERVER_NONCE},p={}",
            STANDARD.encode(&proof)
        );
        prop_assert!(server.client_final(message.as_bytes()).is_err());
    }
}
