//! ACL authorization against the real binary with confluent-kafka clients
//! (`scripts/client-tests/acl_enforcement.py`): a super user grants another user PREFIXED, LITERAL and
//! `*` ACLs with a DENY over an ALLOW; a user without ACLs is refused with Kafka's errors; Metadata
//! shows each principal only what it may describe; denials are logged.

mod common;

use std::path::Path;
use std::process::Command;

use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, MetadataRequest, ResponseKind};

use common::{Broker, receive, send};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn acls_decide_what_each_principal_may_do_as_kafka_does() {
    let dir = tempfile::tempdir().unwrap();
    let (plain, sasl) = (free_port(), free_port());
    let listeners = format!("listeners=PLAINTEXT://127.0.0.1:{plain},SASL_PLAINTEXT://127.0.0.1:{sasl}");
    let users: Vec<String> = [("admin", "admin-secret"), ("alice", "alice-secret"), ("bob", "bob-secret")]
        .iter()
        .map(|(name, password)| format!("SCRAM-SHA-256=[name={name},password={password}]"))
        .collect();
    let mut args = vec![
        "--set",
        &listeners,
        "--set",
        "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "--set",
        "super.users=User:admin",
    ];
    for user in &users {
        args.extend(["--add-scram", user.as_str()]);
    }
    let broker = Broker::start_at(dir.path().join("data").as_path(), plain, 1, &args, None);

    // The PLAINTEXT listener's clients are User:ANONYMOUS: ApiVersions is answered, Metadata shows nothing.
    let mut anonymous = broker.connect();
    send(&mut anonymous, ApiKey::ApiVersions, 3, 1, &ApiVersionsRequest::default());
    receive(&mut anonymous, ApiKey::ApiVersions, 3);

    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/client-tests/acl_enforcement.py");
    let out = Command::new("python3")
        .arg(&script)
        .args([&format!("127.0.0.1:{sasl}"), "admin-secret", "alice-secret", "bob-secret"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.trim() == "ok",
        "{stdout}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        broker.log()
    );

    send(&mut anonymous, ApiKey::Metadata, 12, 2, &MetadataRequest::default());
    let (_, ResponseKind::Metadata(metadata)) = receive(&mut anonymous, ApiKey::Metadata, 12) else { panic!() };
    assert!(metadata.topics.is_empty(), "User:ANONYMOUS sees {:?}", metadata.topics);
    let log = broker.log();
    assert!(
        log.contains("authorization denied") && log.contains("User:bob") && log.contains("payroll"),
        "denials are logged with principal and resource:\n{log}"
    );
}
