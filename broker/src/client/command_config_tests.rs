use super::*;

fn parse(text: &str) -> Result<CommandConfig> {
    CommandConfig::parse(text)
}

fn error(text: &str) -> String {
    format!("{:#}", parse(text).unwrap_err())
}

#[test]
fn properties_take_kafkas_separators_comments_and_spaces() {
    let text = "# a comment\n! another\n\n  a.b = 1 \nc.d:2\ne.f 3\ng.h=x=y\nempty=\n";
    let got: Vec<(String, String)> = properties(text).unwrap().into_iter().map(|(_, k, v)| (k, v)).collect();
    let expected = [("a.b", "1"), ("c.d", "2"), ("e.f", "3"), ("g.h", "x=y"), ("empty", "")];
    assert_eq!(got, expected.map(|(k, v)| (k.to_string(), v.to_string())));
    assert!(format!("{:#}", properties("lonely\n").unwrap_err()).contains("line 1"));
}

#[test]
fn an_empty_file_is_plaintext() {
    let config = parse("# nothing\n").unwrap();
    assert_eq!(config.protocol, SecurityProtocol::Plaintext);
    assert_eq!(config.mechanism, None);
}

#[test]
fn sasl_ssl_with_scram_is_read_with_its_files_and_case_insensitive_protocol() {
    let config = parse(
        "security.protocol=sasl_ssl\nsasl.mechanism=SCRAM-SHA-512\nsasl.username=admin\nsasl.password=p=w\n\
         ssl.ca.location=/etc/ca.pem\nssl.endpoint.identification.algorithm=none\n",
    )
    .unwrap();
    assert_eq!(config.protocol, SecurityProtocol::SaslSsl);
    assert_eq!(config.mechanism, Some(SaslMechanism::Scram(ScramMechanism::Sha512)));
    assert_eq!(config.username.as_deref(), Some("admin"));
    assert_eq!(config.password.as_deref(), Some("p=w"));
    assert_eq!(config.ca.as_deref(), Some(Path::new("/etc/ca.pem")));
    assert!(!config.verify_hostname);
    assert!(!format!("{config:?}").contains("p=w"), "Debug shows no password");
}

#[test]
fn kafkas_jaas_config_gives_the_user_and_password() {
    let config = parse(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.jaas.config=org.apache.kafka.common.security.\
         plain.PlainLoginModule required username=\"alice\" password=\"a b;c\";\n",
    )
    .unwrap();
    assert_eq!((config.username.as_deref(), config.password.as_deref()), (Some("alice"), Some("a b;c")));
    let unknown = error(
        "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.jaas.config=x.PlainLoginModule required \
         username=\"a\" password=\"b\" debug=\"true\";\n",
    );
    assert!(unknown.contains("option debug"), "{unknown}");
}

#[test]
fn settings_that_would_do_nothing_are_refused_naming_the_key() {
    let cases = [
        ("bootstrap.servers=x:1\n", "bootstrap.servers is not a setting"),
        ("security.protocol=SSL\nssl.ca.location=a\nsasl.username=u\n", "sasl.username is set, but"),
        (
            "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=u\nsasl.password=p\nssl.ca.location=a\n",
            "ssl.ca.location is set, but",
        ),
        ("security.protocol=SSL\n", "needs ssl.ca.location"),
        ("security.protocol=SASL_SSL\nssl.ca.location=a\nsasl.username=u\nsasl.password=p\n", "needs sasl.mechanism"),
        (
            "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.username=u\n",
            "needs sasl.username and sasl.password",
        ),
        ("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=OAUTHBEARER\n", "OAUTHBEARER"),
        (
            "security.protocol=SASL_PLAINTEXT\nsasl.mechanism=scram-sha-256\nsasl.username=u\nsasl.password=p\n",
            "sasl.mechanism=scram-sha-256",
        ),
        ("security.protocol=TLS\n", "security.protocol=TLS"),
        ("security.protocol=SSL\nssl.ca.location=a\nssl.certificate.location=c\n", "go together"),
        ("security.protocol=SSL\nssl.ca.location=a\nssl.endpoint.identification.algorithm=http\n", "https or none"),
        ("security.protocol=SSL\nsecurity.protocol=SSL\n", "set twice"),
    ];
    for (text, expected) in cases {
        let said = error(text);
        assert!(said.contains(expected), "{text:?} gave {said:?}, not {expected:?}");
    }
}

#[test]
fn a_ca_file_without_certificates_is_refused_when_the_settings_are_built() {
    let dir = tempfile::tempdir().unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "not a certificate\n").unwrap();
    let config = parse(&format!("security.protocol=SSL\nssl.ca.location={}\n", ca.display())).unwrap();
    let said = format!("{:#}", config.security().unwrap_err());
    assert!(said.contains("ssl.ca.location") && said.contains("ca.pem"), "{said}");
}
