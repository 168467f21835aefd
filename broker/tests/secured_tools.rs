//! shardlog's own tools against a secured broker, through the real binaries: `--command-config` with
//! SASL_SSL (SCRAM-SHA-512) as the super user manages topics, users, ACLs and quotas and lists
//! transactions; the ACL granted takes effect for the user made; a wrong password and a plaintext client on the SASL port fail with
//! a clear message and a non-zero exit; a client certificate on a mutual-TLS listener authenticates as
//! the principal `ssl.principal.mapping.rules` makes of it.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::Broker;
use common::pki::{Issued, Pki};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

const ADMIN_PASSWORD: &str = "admin-secret";

/// A broker with the harness's PLAINTEXT listener, a SASL_SSL one (SCRAM-SHA-512) and a mutual-TLS one,
/// the StandardAuthorizer with User:admin as super user, admin's credential made at formation.
struct Secured {
    _broker: Broker,
    sasl_ssl: u16,
    mtls: u16,
    pki: Pki,
    dir: tempfile::TempDir,
}

fn start() -> Secured {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path(), "tools");
    let server = pki.server("broker", "broker-1");
    let (plain, sasl_ssl, mtls) = (free_port(), free_port(), free_port());
    let listeners =
        format!("listeners=PLAINTEXT://127.0.0.1:{plain},SASL_SSL://127.0.0.1:{sasl_ssl},MTLS://127.0.0.1:{mtls}");
    let keystore = format!("ssl.keystore.location={}", server.keystore.display());
    let truststore = format!("listener.name.mtls.ssl.truststore.location={}", pki.ca.display());
    let admin = format!("SCRAM-SHA-512=[name=admin,password={ADMIN_PASSWORD}]");
    let args = [
        "--set",
        &listeners,
        "--set",
        "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,SASL_SSL:SASL_SSL,MTLS:SSL",
        "--set",
        &keystore,
        "--set",
        "listener.name.sasl_ssl.sasl.enabled.mechanisms=SCRAM-SHA-512",
        "--set",
        "listener.name.mtls.ssl.client.auth=required",
        "--set",
        &truststore,
        "--set",
        "ssl.principal.mapping.rules=RULE:^CN=([^,]*),O=Apps$/$1/L",
        "--set",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "--set",
        "super.users=User:admin",
        "--add-scram",
        &admin,
    ];
    let broker = Broker::start_at(dir.path().join("data").as_path(), plain, 1, &args, None);
    Secured { _broker: broker, sasl_ssl, mtls, pki, dir }
}

impl Secured {
    /// A command-config file with these lines.
    fn config(&self, name: &str, lines: &[String]) -> PathBuf {
        let path = self.dir.path().join(name);
        std::fs::write(&path, format!("# {name}\n{}\n", lines.join("\n"))).unwrap();
        path
    }

    fn scram(&self, name: &str, user: &str, password: &str) -> PathBuf {
        self.config(
            name,
            &[
                "security.protocol=SASL_SSL".into(),
                "sasl.mechanism=SCRAM-SHA-512".into(),
                format!("sasl.username={user}"),
                format!("sasl.password={password}"),
                format!("ssl.ca.location={}", self.pki.ca.display()),
            ],
        )
    }

    fn certificate(&self, name: &str, issued: &Issued) -> PathBuf {
        self.config(
            name,
            &[
                "security.protocol=SSL".into(),
                format!("ssl.ca.location={}", self.pki.ca.display()),
                format!("ssl.certificate.location={}", issued.certificate.display()),
                format!("ssl.key.location={}", issued.key.display()),
            ],
        )
    }
}

/// Runs `shardlog ARGS --bootstrap 127.0.0.1:PORT [--command-config FILE]`: (success, stdout, stderr).
fn shardlog(port: u16, config: Option<&Path>, args: &[&str]) -> (bool, String, String) {
    let mut command = Command::new(env!("CARGO_BIN_EXE_shardlog"));
    command.args(args).args(["--bootstrap", &format!("127.0.0.1:{port}")]).env_remove("SHARDLOG_COMMAND_CONFIG");
    if let Some(config) = config {
        command.arg("--command-config").arg(config);
    }
    let out = command.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn succeeds(port: u16, config: Option<&Path>, args: &[&str]) -> String {
    let (ok, stdout, stderr) = shardlog(port, config, args);
    assert!(ok, "shardlog {args:?} failed:\n{stdout}\n{stderr}");
    stdout
}

/// The table rows of `acl list`/`acl remove` output, split into cells, without the header.
fn rows(table: &str) -> Vec<Vec<String>> {
    let start = table.lines().position(|l| l.starts_with("PRINCIPAL")).expect("a table header");
    table.lines().skip(start + 1).map(|l| l.split_whitespace().map(String::from).collect()).collect()
}

/// Asks until `check` holds (the authorizer sees new bindings once the broker's metadata has them).
fn eventually(what: &str, mut check: impl FnMut() -> Option<String>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let Some(last) = check() else { return };
        assert!(Instant::now() < deadline, "{what}: still {last}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn the_super_user_manages_topics_users_acls_and_quotas_over_sasl_ssl_with_a_command_config() {
    let s = start();
    let port = s.sasl_ssl;
    let admin = s.scram("admin.properties", "admin", ADMIN_PASSWORD);
    let admin = Some(admin.as_path());

    succeeds(port, admin, &["topic", "create", "orders", "--partitions", "1", "--replication-factor", "1"]);
    succeeds(port, admin, &["topic", "create", "audit", "--partitions", "1", "--replication-factor", "1"]);
    assert_eq!(succeeds(port, admin, &["topic", "list"]), "audit\norders\n");
    succeeds(port, admin, &["user", "create", "app", "--password", "app-secret"]);

    let added = succeeds(
        port,
        admin,
        &["acl", "add", "--allow-principal", "User:app", "--operation", "write", "--topic", "orders"],
    );
    let granted = vec![vec!["User:app", "*", "Write", "Allow", "Topic", "orders", "Literal"]];
    assert_eq!(rows(&added), granted, "{added}");
    let listed = succeeds(port, admin, &["acl", "list"]);
    assert_eq!(rows(&listed), granted, "{listed}");
    let listed = succeeds(port, admin, &["acl", "list", "--topic", "audit"]);
    assert!(rows(&listed).is_empty(), "{listed}");

    // The grant holds for app, over its own SCRAM login: WRITE implies DESCRIBE, so it sees orders only.
    let app = s.scram("app.properties", "app", "app-secret");
    eventually("app sees the topic it may write", || {
        let (ok, stdout, stderr) = shardlog(port, Some(&app), &["topic", "list"]);
        (!(ok && stdout == "orders\n")).then(|| format!("{stdout}{stderr}"))
    });

    // The transaction tools too; DescribeProducers needs READ on the topic, which app (WRITE only) lacks.
    let listed = succeeds(port, admin, &["transactions", "list"]);
    assert_eq!(listed, "TransactionalId\tCoordinator\tProducerId\tState\n");
    let producers = ["transactions", "describe-producers", "--topic", "orders", "--partition", "0"];
    let described = succeeds(port, admin, &producers);
    assert_eq!(described.lines().count(), 1, "the header, no producer yet: {described}");
    let (ok, _, stderr) = shardlog(port, Some(&app), &producers);
    assert!(!ok && stderr.contains("describe producers of orders-0") && stderr.contains("error code 29"), "{stderr}");

    succeeds(port, admin, &["quota", "set", "--user", "app", "--producer-byte-rate", "1048576"]);
    succeeds(
        port,
        admin,
        &["quota", "set", "--user-default", "--consumer-byte-rate", "2048", "--request-percentage", "50"],
    );
    let described = succeeds(port, admin, &["quota", "describe"]);
    assert_eq!(
        described,
        "user=<default>: consumer_byte_rate=2048, request_percentage=50\nuser=app: producer_byte_rate=1048576\n"
    );
    succeeds(port, admin, &["quota", "set", "--user-default", "--delete", "request_percentage"]);
    assert_eq!(
        succeeds(port, admin, &["quota", "describe", "--user-default"]),
        "user=<default>: consumer_byte_rate=2048\n"
    );

    let removed = succeeds(
        port,
        admin,
        &["acl", "remove", "--allow-principal", "User:app", "--operation", "write", "--topic", "orders"],
    );
    assert_eq!(rows(&removed), granted, "{removed}");
    let listed = succeeds(port, admin, &["acl", "list"]);
    assert!(rows(&listed).is_empty(), "{listed}");

    // A wrong password: the broker's refusal, and a non-zero exit.
    let wrong = s.scram("wrong.properties", "admin", "not-the-password");
    let (ok, stdout, stderr) = shardlog(port, Some(&wrong), &["topic", "list"]);
    assert!(!ok && stdout.is_empty(), "{stdout}{stderr}");
    assert!(stderr.contains("authenticate to") && stderr.contains("SaslAuthenticationFailed"), "{stderr}");
    assert!(!stderr.contains("not-the-password"), "{stderr}");

    // A plaintext client on the SASL_SSL port is closed on, and told what to give.
    let (ok, stdout, stderr) = shardlog(port, None, &["topic", "list"]);
    assert!(!ok && stdout.is_empty(), "{stdout}{stderr}");
    assert!(stderr.contains("--command-config"), "{stderr}");

    // A setting the tools do not know is refused before anything is sent, naming it.
    let typo = s.config("typo.properties", &["security.protocol=SASL_SSL".into(), "sasl.mechanisms=PLAIN".into()]);
    let (ok, _, stderr) = shardlog(port, Some(&typo), &["topic", "list"]);
    assert!(!ok && stderr.contains("sasl.mechanisms is not a setting"), "{stderr}");
}

#[test]
fn a_client_certificate_authenticates_the_tools_as_its_mapped_principal_over_mutual_tls() {
    let s = start();
    // CN=admin,O=Apps maps to User:admin, the super user; CN=app,O=Apps to User:app, who may do nothing.
    let admin = s.certificate("admin-cert.properties", &s.pki.client("admin-client", "admin", "Apps"));
    let app = s.certificate("app-cert.properties", &s.pki.client("app-client", "app", "Apps"));

    succeeds(s.mtls, Some(&admin), &["topic", "create", "ledger", "--partitions", "1", "--replication-factor", "1"]);
    assert_eq!(succeeds(s.mtls, Some(&admin), &["topic", "list"]), "ledger\n");
    let (ok, stdout, stderr) =
        shardlog(s.mtls, Some(&app), &["topic", "create", "other", "--partitions", "1", "--replication-factor", "1"]);
    assert!(!ok && stderr.contains("TopicAuthorizationFailed"), "{stdout}{stderr}");
    assert_eq!(succeeds(s.mtls, Some(&app), &["topic", "list"]), "", "User:app may describe nothing");

    // Without a certificate the listener refuses the handshake.
    let none = s.config(
        "no-cert.properties",
        &["security.protocol=SSL".into(), format!("ssl.ca.location={}", s.pki.ca.display())],
    );
    let (ok, _, stderr) = shardlog(s.mtls, Some(&none), &["topic", "list"]);
    assert!(!ok && stderr.contains("no bootstrap broker answered"), "{stderr}");
}
