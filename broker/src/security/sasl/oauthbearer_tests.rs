//! Tests of [`super`]: tokens signed here with EC keys made by rcgen, checked against a JWKS file in
//! a temporary directory.

use std::fs;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use proptest::prelude::*;
use serde_json::json;
use tempfile::TempDir;

use super::*;

/// A signing key and its public JWK under `kid`.
struct TestKey {
    encoding: EncodingKey,
    jwk: Jwk,
    kid: String,
}

impl TestKey {
    fn new(kid: &str) -> Self {
        let pkcs8 = rcgen::KeyPair::generate().unwrap().serialize_der();
        let encoding = EncodingKey::from_ec_der(&pkcs8);
        let mut jwk = Jwk::from_encoding_key(&encoding, Algorithm::ES256).unwrap();
        jwk.common.key_id = Some(kid.to_owned());
        TestKey { encoding, jwk, kid: kid.to_owned() }
    }

    fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(Algorithm::ES256);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding).unwrap()
    }
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs()
}

fn claims() -> Value {
    json!({
        "sub": "alice",
        "iss": "https://issuer.example",
        "aud": "shardlog",
        "iat": now_secs(),
        "exp": now_secs() + 600,
    })
}

fn write_jwks(dir: &TempDir, keys: &[&TestKey]) -> PathBuf {
    let path = dir.path().join("jwks.json");
    let set = JwkSet { keys: keys.iter().map(|key| key.jwk.clone()).collect() };
    fs::write(&path, serde_json::to_vec(&set).unwrap()).unwrap();
    path
}

fn settings(path: &Path) -> OAuthBearerSettings {
    let mut settings = OAuthBearerSettings::new(format!("file://{}", path.display()));
    settings.expected_issuer = Some("https://issuer.example".to_owned());
    settings.expected_audience = vec!["other".to_owned(), "shardlog".to_owned()];
    settings
}

fn setup() -> (TempDir, TestKey, JwtValidator) {
    let dir = TempDir::new().unwrap();
    let key = TestKey::new("k1");
    let path = write_jwks(&dir, &[&key]);
    let validator = JwtValidator::new(settings(&path)).unwrap();
    (dir, key, validator)
}

fn token_with_header(header: Value, claims: &Value) -> String {
    let encode = |value: &Value| URL_SAFE_NO_PAD.encode(serde_json::to_vec(value).unwrap());
    format!("{}.{}.c2lnbmF0dXJl", encode(&header), encode(claims))
}

#[test]
fn valid_token_gives_the_sub_claim_and_expiry() {
    let (_dir, key, validator) = setup();
    let claims = claims();
    let token = validator.validate(&key.sign(&claims)).unwrap();
    assert_eq!(token.principal, "alice");
    assert_eq!(token.expires_at_unix_secs, claims["exp"].as_u64().unwrap());
}

#[test]
fn configured_sub_claim_name_is_the_principal() {
    let dir = TempDir::new().unwrap();
    let key = TestKey::new("k1");
    let mut settings = settings(&write_jwks(&dir, &[&key]));
    settings.sub_claim_name = "preferred_username".to_owned();
    let validator = JwtValidator::new(settings).unwrap();
    let mut claims = claims();
    assert_eq!(
        validator.validate(&key.sign(&claims)),
        Err(OAuthBearerError::MissingClaim { claim: "preferred_username".to_owned() })
    );
    claims["preferred_username"] = json!("bob");
    assert_eq!(validator.validate(&key.sign(&claims)).unwrap().principal, "bob");
}

#[test]
fn each_bad_token_is_refused_with_its_own_error() {
    let (_dir, key, validator) = setup();
    let other_key_same_kid = TestKey::new("k1");
    let unknown_kid = TestKey::new("k9");
    let with = |field: &str, value: Value| {
        let mut claims = claims();
        claims[field] = value;
        claims
    };
    let good = key.sign(&claims());
    let mut parts: Vec<&str> = good.split('.').collect();
    let forged_payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&with("sub", json!("admin"))).unwrap());
    parts[1] = &forged_payload;
    let tampered = parts.join(".");
    let without_exp = {
        let mut claims = claims();
        claims.as_object_mut().unwrap().remove("exp");
        claims
    };

    let cases = [
        (key.sign(&with("exp", json!(now_secs() - 3600))), OAuthBearerError::Expired),
        (key.sign(&with("nbf", json!(now_secs() + 3600))), OAuthBearerError::NotYetValid),
        (key.sign(&with("iat", json!(now_secs() + 3600))), OAuthBearerError::IssuedInFuture),
        (key.sign(&with("iss", json!("https://evil.example"))), OAuthBearerError::WrongIssuer),
        (key.sign(&with("aud", json!("someone-else"))), OAuthBearerError::WrongAudience),
        (key.sign(&without_exp), OAuthBearerError::MissingClaim { claim: "exp".to_owned() }),
        (key.sign(&with("sub", json!(42))), OAuthBearerError::InvalidClaim { claim: "sub".to_owned() }),
        (other_key_same_kid.sign(&claims()), OAuthBearerError::BadSignature),
        (tampered, OAuthBearerError::BadSignature),
        (unknown_kid.sign(&claims()), OAuthBearerError::UnknownKeyId { kid: "k9".to_owned() }),
        (token_with_header(json!({"alg": "none", "kid": "k1"}), &claims()), OAuthBearerError::AlgorithmNone),
        (
            token_with_header(json!({"alg": "HS256", "kid": "k1"}), &claims()),
            OAuthBearerError::AlgorithmHmac { alg: "HS256".to_owned() },
        ),
        (token_with_header(json!({"alg": "XY999", "kid": "k1"}), &claims()), OAuthBearerError::AlgorithmUnsupported),
        (token_with_header(json!({"alg": "ES256"}), &claims()), OAuthBearerError::MissingKeyId),
        (token_with_header(json!({"alg": "RS256", "kid": "k1"}), &claims()), OAuthBearerError::KeyAlgorithmMismatch),
        ("garbage".to_owned(), OAuthBearerError::TokenMalformed("not three dot-separated parts")),
        ("a.b.c".to_owned(), OAuthBearerError::TokenMalformed("header is not base64url")),
        (
            format!("{}.e30.", URL_SAFE_NO_PAD.encode("[1]")),
            OAuthBearerError::TokenMalformed("header is not a JSON object"),
        ),
    ];
    for (token, expected) in cases {
        assert_eq!(validator.validate(&token), Err(expected.clone()), "expected {expected:?}");
    }
}

#[test]
fn algorithm_of_another_key_family_is_refused_when_the_jwk_names_no_alg() {
    // Without the JWK's `alg`, an RS256 or EdDSA header names a verifier for another kind of key:
    // refused as a mismatch (both our family check and jsonwebtoken's own catch it), not a panic.
    let dir = TempDir::new().unwrap();
    let mut key = TestKey::new("k1");
    key.jwk.common.key_algorithm = None;
    let validator = JwtValidator::new(settings(&write_jwks(&dir, &[&key]))).unwrap();
    assert_eq!(validator.validate(&key.sign(&claims())).unwrap().principal, "alice");
    for alg in ["RS256", "PS512", "EdDSA"] {
        assert_eq!(
            validator.validate(&token_with_header(json!({"alg": alg, "kid": "k1"}), &claims())),
            Err(OAuthBearerError::KeyAlgorithmMismatch),
            "{alg}"
        );
    }
}

#[test]
fn hmac_token_signed_with_a_secret_is_refused_even_if_the_jwks_holds_it() {
    let dir = TempDir::new().unwrap();
    let key = TestKey::new("k1");
    let path = dir.path().join("jwks.json");
    // An `oct` key in the JWKS is skipped, so the HS256 token cannot be checked against it.
    let oct = json!({"kty": "oct", "kid": "shared", "k": URL_SAFE_NO_PAD.encode("secret")});
    let ec = serde_json::to_value(&key.jwk).unwrap();
    fs::write(&path, serde_json::to_vec(&json!({"keys": [oct, ec]})).unwrap()).unwrap();
    let validator = JwtValidator::new(settings(&path)).unwrap();
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("shared".to_owned());
    let token = jsonwebtoken::encode(&header, &claims(), &EncodingKey::from_secret(b"secret")).unwrap();
    assert_eq!(validator.validate(&token), Err(OAuthBearerError::AlgorithmHmac { alg: "HS256".to_owned() }));
    assert!(!validator.keys.lock().unwrap().by_kid.contains_key("shared"));
}

#[test]
fn rotated_keys_are_picked_up_when_the_file_changes() {
    let (dir, old_key, validator) = setup();
    let new_key = TestKey::new("k2");
    assert_eq!(
        validator.validate(&new_key.sign(&claims())),
        Err(OAuthBearerError::UnknownKeyId { kid: "k2".to_owned() })
    );
    let path = write_jwks(&dir, &[&new_key]);
    // Make sure the modification time moves even on a coarse-grained clock.
    let later = SystemTime::now() + Duration::from_secs(5);
    fs::File::options().write(true).open(&path).unwrap().set_modified(later).unwrap();
    assert_eq!(validator.validate(&new_key.sign(&claims())).unwrap().principal, "alice");
    assert_eq!(
        validator.validate(&old_key.sign(&claims())),
        Err(OAuthBearerError::UnknownKeyId { kid: "k1".to_owned() })
    );
}

#[test]
fn unknown_kid_rereads_the_file_at_most_once_per_interval() {
    let (dir, _old_key, validator) = setup();
    let path = dir.path().join("jwks.json");
    let stamp = fs::metadata(&path).unwrap().modified().unwrap();
    // A rotation the modification time does not show (same size, mtime put back).
    let new_key = TestKey::new("k2");
    write_jwks(&dir, &[&new_key]);
    fs::File::options().write(true).open(&path).unwrap().set_modified(stamp).unwrap();
    assert_eq!(validator.keys.lock().unwrap().stamp, file_stamp(&path).unwrap());

    let loaded_at = validator.keys.lock().unwrap().loaded_at;
    let token = new_key.sign(&claims());
    for seconds in [1, 5, 9] {
        let at = loaded_at + Duration::from_secs(seconds);
        assert_eq!(validator.validate_at(&token, at), Err(OAuthBearerError::UnknownKeyId { kid: "k2".to_owned() }));
    }
    assert_eq!(validator.keys.lock().unwrap().loads, 1, "unknown kids inside the interval must not re-read");
    let at = loaded_at + JWKS_MIN_RELOAD_INTERVAL;
    assert_eq!(validator.validate_at(&token, at).unwrap().principal, "alice");
    assert_eq!(validator.keys.lock().unwrap().loads, 2);
}

#[test]
fn broken_file_on_reload_keeps_the_old_keys() {
    let (dir, key, validator) = setup();
    fs::write(dir.path().join("jwks.json"), b"{\"keys\": [").unwrap();
    assert_eq!(validator.validate(&key.sign(&claims())).unwrap().principal, "alice");
    assert_eq!(validator.keys.lock().unwrap().loads, 2, "the changed file must have been re-read");
    // The failed read is not retried for every token while the file stays as it is.
    assert_eq!(validator.validate(&key.sign(&claims())).unwrap().principal, "alice");
    assert_eq!(validator.keys.lock().unwrap().loads, 2);
}

#[test]
fn jwks_location_must_be_a_local_file() {
    for url in ["https://idp.example/jwks", "http://idp.example/jwks", "file://otherhost/jwks.json", "file:"] {
        assert_eq!(
            OAuthBearerSettings::new(url).jwks_path(),
            Err(OAuthBearerError::JwksUrlNotSupported { url: url.to_owned() }),
            "{url}"
        );
    }
    for (url, path) in [
        ("file:///etc/jwks.json", "/etc/jwks.json"),
        ("file://localhost/etc/jwks.json", "/etc/jwks.json"),
        ("file:/etc/jwks.json", "/etc/jwks.json"),
        ("/etc/jwks.json", "/etc/jwks.json"),
        ("jwks.json", "jwks.json"),
    ] {
        assert_eq!(OAuthBearerSettings::new(url).jwks_path(), Ok(PathBuf::from(path)), "{url}");
    }
    let error = JwtValidator::new(OAuthBearerSettings::new("https://idp.example/jwks")).unwrap_err();
    assert!(error.to_string().contains("local JWKS file"), "{error}");
}

#[test]
fn out_of_range_settings_are_refused_at_start() {
    let dir = TempDir::new().unwrap();
    let path = write_jwks(&dir, &[&TestKey::new("k1")]);
    let mut skewed = settings(&path);
    skewed.clock_skew_seconds = CLOCK_SKEW_SECONDS_MAX + 1;
    assert_eq!(
        JwtValidator::new(skewed).unwrap_err(),
        OAuthBearerError::InvalidSetting {
            name: "sasl.oauthbearer.clock.skew.seconds",
            reason: "must be at most 3600"
        }
    );
    let mut no_sub = settings(&path);
    no_sub.sub_claim_name.clear();
    assert!(matches!(
        JwtValidator::new(no_sub),
        Err(OAuthBearerError::InvalidSetting { name: "sasl.oauthbearer.sub.claim.name", .. })
    ));
    let mut at_max = settings(&path);
    at_max.clock_skew_seconds = CLOCK_SKEW_SECONDS_MAX;
    assert!(JwtValidator::new(at_max).is_ok());
}

#[test]
fn jwks_without_usable_keys_or_missing_is_refused_at_start() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("jwks.json");
    assert!(matches!(
        JwtValidator::new(OAuthBearerSettings::new(path.to_str().unwrap())),
        Err(OAuthBearerError::JwksRead { .. })
    ));
    fs::write(&path, br#"{"keys": [{"kty": "oct", "kid": "x", "k": "c2VjcmV0"}]}"#).unwrap();
    assert_eq!(
        JwtValidator::new(OAuthBearerSettings::new(path.to_str().unwrap())).unwrap_err(),
        OAuthBearerError::JwksNoUsableKeys { path: path.clone() }
    );
}

fn initial_response(token: &str) -> Vec<u8> {
    format!("n,,\x01auth=Bearer {token}\x01\x01").into_bytes()
}

#[test]
fn initial_response_parses_by_kafkas_rules() {
    let parsed = ClientInitialResponse::parse(b"n,a=alice,\x01auth=bearer a.b-c_d\x01traceId=x y\x01\x01").unwrap();
    assert_eq!(parsed.authzid(), Some("alice"));
    assert_eq!(parsed.token(), "a.b-c_d");
    assert_eq!(parsed.extensions().get("traceId").map(String::as_str), Some("x y"));
    assert!(!format!("{parsed:?}").contains("a.b-c_d"));
    assert_eq!(ClientInitialResponse::parse(&initial_response("t")).unwrap().authzid(), None);

    let refused: [&[u8]; 12] = [
        b"",
        b"y,,\x01auth=Bearer t\x01\x01",
        b"n,,auth=Bearer t\x01\x01",
        b"n,,\x01auth=Bearer t\x01",
        b"n,,\x01\x01",
        b"n,,\x01auth=Basic t\x01\x01",
        b"n,,\x01auth=Bearer t!\x01\x01",
        b"n,,\x01auth=Bearer t\x01auth=Bearer u\x01\x01",
        b"n,,\x01auth=Bearer t\x01k1=v\x01\x01",
        b"n,,\x01auth=Bearer t\x01k=\x01\x01",
        b"n,x=y,\x01auth=Bearer t\x01\x01",
        b"n,,\x01auth=Bearer \xff\x01\x01",
    ];
    for message in refused {
        assert!(
            matches!(ClientInitialResponse::parse(message), Err(OAuthBearerError::Malformed(_))),
            "{:?}",
            String::from_utf8_lossy(message)
        );
    }
    let long = initial_response(&"a".repeat(INITIAL_RESPONSE_MAX_BYTES));
    assert_eq!(ClientInitialResponse::parse(&long), Err(OAuthBearerError::TooLong));
}

#[test]
fn conversation_accepts_a_valid_token() {
    let (_dir, key, validator) = setup();
    let mut server = OAuthBearerServer::new();
    let step = server.evaluate(&validator, &initial_response(&key.sign(&claims()))).unwrap();
    let OAuthBearerStep::Authenticated(token) = step else { panic!("not authenticated: {step:?}") };
    assert_eq!(token.principal, "alice");
    assert!(server.is_authenticated());
    assert_eq!(server.evaluate(&validator, b"\x01"), Err(OAuthBearerError::OutOfOrder));
    assert!(server.is_authenticated());
}

#[test]
fn refused_token_gets_the_json_error_then_fails_on_the_clients_separator() {
    let (_dir, key, validator) = setup();
    let mut expired = claims();
    expired["exp"] = json!(now_secs() - 3600);
    let mut server = OAuthBearerServer::new();
    assert_eq!(
        server.evaluate(&validator, &initial_response(&key.sign(&expired))),
        Ok(OAuthBearerStep::ErrorReply(br#"{"status":"invalid_token"}"#.to_vec()))
    );
    assert!(!server.is_authenticated());
    assert_eq!(server.evaluate(&validator, b"\x01"), Err(OAuthBearerError::Expired));
    assert_eq!(server.evaluate(&validator, b"\x01"), Err(OAuthBearerError::OutOfOrder));

    let mut server = OAuthBearerServer::new();
    server.evaluate(&validator, &initial_response("garbage")).unwrap();
    assert!(matches!(server.evaluate(&validator, b"again"), Err(OAuthBearerError::Malformed(_))));
}

#[test]
fn authzid_must_be_the_tokens_principal() {
    let (_dir, key, validator) = setup();
    let message = format!("n,a=admin,\x01auth=Bearer {}\x01\x01", key.sign(&claims()));
    let mut server = OAuthBearerServer::new();
    assert_eq!(server.evaluate(&validator, message.as_bytes()), Err(OAuthBearerError::AuthorizationIdMismatch));
    assert!(!server.is_authenticated());
    let message = format!("n,a=alice,\x01auth=Bearer {}\x01\x01", key.sign(&claims()));
    assert!(OAuthBearerServer::new().evaluate(&validator, message.as_bytes()).is_ok());
}

proptest! {
    #[test]
    fn arbitrary_initial_responses_parse_to_an_error_or_a_well_formed_token(
        message in proptest::collection::vec(any::<u8>(), 0..600),
        framed in any::<bool>(),
    ) {
        // Half the cases inside a valid frame, so the parser gets past the gs2 header.
        let message = if framed {
            [&b"n,,\x01auth=Bearer "[..], &message, b"\x01\x01"].concat()
        } else {
            message
        };
        if let Ok(parsed) = ClientInitialResponse::parse(&message) {
            let token = parsed.token();
            prop_assert!(!token.is_empty());
            prop_assert!(token.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)));
            prop_assert!(!parsed.extensions().contains_key("auth"));
        }
    }
}
