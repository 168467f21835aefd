//! The security metadata's Kafka admin APIs against the real binary: confluent-kafka's AdminClient
//! managing SCRAM credentials and ACLs (the checks are in `scripts/client-tests/security_admin.py`),
//! client quotas through raw KIP-546 requests (no Python client has them), Kafka's per-item errors, and
//! everything still there after a restart.

mod common;

use std::net::TcpStream;
use std::path::Path;
use std::process::Command;

use bytes::Bytes;
use common::{Broker, receive, send};
use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
use kafka_protocol::messages::alter_user_scram_credentials_request::{
    ScramCredentialDeletion, ScramCredentialUpsertion,
};
use kafka_protocol::messages::describe_client_quotas_request::ComponentData;
use kafka_protocol::messages::{
    AlterClientQuotasRequest, AlterClientQuotasResponse, AlterUserScramCredentialsRequest,
    AlterUserScramCredentialsResponse, ApiKey, DescribeClientQuotasRequest, DescribeClientQuotasResponse,
    DescribeUserScramCredentialsRequest, DescribeUserScramCredentialsResponse, ResponseKind,
};
use kafka_protocol::protocol::StrBytes;

fn text(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

#[test]
fn confluent_kafka_manages_scram_credentials_and_acls() {
    let broker = Broker::start(2);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/client-tests/security_admin.py");
    let out = Command::new("python3")
        .arg(&script)
        .arg(format!("127.0.0.1:{}", broker.port))
        .output()
        .expect("python3 runs (.ci/run installs confluent-kafka)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "security admin checks failed:\n{stdout}\n{stderr}\n{}", broker.log());
    assert!(stdout.contains("security admin: all checks passed"), "{stdout}");
    // The passwords sent (salted) never reach the log.
    let log = broker.log();
    assert!(!log.contains("alice-secret") && !log.contains("bob-secret"), "{log}");
}

fn entity(parts: &[(&str, Option<&str>)]) -> Vec<EntityData> {
    parts
        .iter()
        .map(|(kind, name)| EntityData::default().with_entity_type(text(kind)).with_entity_name(name.map(text)))
        .collect()
}

fn op(key: &str, value: Option<f64>) -> OpData {
    OpData::default().with_key(text(key)).with_value(value.unwrap_or(0.0)).with_remove(value.is_none())
}

fn alter_quotas(s: &mut TcpStream, entries: Vec<EntryData>, validate_only: bool) -> Vec<i16> {
    let request = AlterClientQuotasRequest::default().with_entries(entries).with_validate_only(validate_only);
    send(s, ApiKey::AlterClientQuotas, 1, 1, &request);
    let (_, ResponseKind::AlterClientQuotas(response)) = receive(s, ApiKey::AlterClientQuotas, 1) else {
        panic!("not an AlterClientQuotas response")
    };
    let response: AlterClientQuotasResponse = response;
    response.entries.iter().map(|e| e.error_code).collect()
}

/// `(entity as (type, name) pairs, (key, value) pairs)` of every entry the filter matches, sorted.
type Described = Vec<(Vec<(String, Option<String>)>, Vec<(String, f64)>)>;

fn describe_quotas(s: &mut TcpStream, components: &[(&str, i8, Option<&str>)], strict: bool) -> (i16, Described) {
    let components = components
        .iter()
        .map(|(kind, match_type, name)| {
            ComponentData::default()
                .with_entity_type(text(kind))
                .with_match_type(*match_type)
                .with_match(name.map(text))
        })
        .collect();
    let request = DescribeClientQuotasRequest::default().with_components(components).with_strict(strict);
    send(s, ApiKey::DescribeClientQuotas, 1, 2, &request);
    let (_, ResponseKind::DescribeClientQuotas(response)) = receive(s, ApiKey::DescribeClientQuotas, 1) else {
        panic!("not a DescribeClientQuotas response")
    };
    let response: DescribeClientQuotasResponse = response;
    let mut entries: Described = response
        .entries
        .unwrap_or_default()
        .into_iter()
        .map(|e| {
            let entity =
                e.entity.iter().map(|d| (d.entity_type.to_string(), d.entity_name.as_ref().map(|n| n.to_string())));
            let values = e.values.iter().map(|v| (v.key.to_string(), v.value));
            (entity.collect(), values.collect())
        })
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    (response.error_code, entries)
}

fn pairs(parts: &[(&str, Option<&str>)]) -> Vec<(String, Option<String>)> {
    parts.iter().map(|(k, n)| (k.to_string(), n.map(str::to_string))).collect()
}

const EXACT: i8 = 0;
const DEFAULT: i8 = 1;
const SPECIFIED: i8 = 2;

#[test]
fn client_quotas_are_altered_and_described_as_kip_546_says_and_survive_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in(data.path(), 2, &[]);
    let mut s = broker.connect();
    let alice = || entity(&[("user", Some("alice"))]);
    let alice_app = || entity(&[("user", Some("alice")), ("client-id", Some("app"))]);
    let codes = alter_quotas(
        &mut s,
        vec![
            EntryData::default().with_entity(alice()).with_ops(vec![op("producer_byte_rate", Some(1048576.0))]),
            EntryData::default()
                .with_entity(alice_app())
                .with_ops(vec![op("consumer_byte_rate", Some(2048.0)), op("request_percentage", Some(25.5))]),
            EntryData::default()
                .with_entity(entity(&[("user", None)]))
                .with_ops(vec![op("producer_byte_rate", Some(4096.0))]),
            EntryData::default()
                .with_entity(entity(&[("ip", Some("10.1.2.3"))]))
                .with_ops(vec![op("connection_creation_rate", Some(50.0))]),
            // Refused per entity with INVALID_REQUEST: a key the ip entity cannot have, a value of 0, an
            // unknown entity type.
            EntryData::default()
                .with_entity(entity(&[("ip", Some("10.1.2.4"))]))
                .with_ops(vec![op("producer_byte_rate", Some(1.0))]),
            EntryData::default()
                .with_entity(entity(&[("user", Some("bob"))]))
                .with_ops(vec![op("producer_byte_rate", Some(0.0))]),
            EntryData::default()
                .with_entity(entity(&[("group", Some("g"))]))
                .with_ops(vec![op("producer_byte_rate", Some(1.0))]),
        ],
        false,
    );
    assert_eq!(codes, vec![0, 0, 0, 0, 42, 42, 42]);
    // validate_only: answered, not stored.
    let validate = EntryData::default()
        .with_entity(entity(&[("user", Some("carol"))]))
        .with_ops(vec![op("producer_byte_rate", Some(1.0))]);
    assert_eq!(alter_quotas(&mut s, vec![validate], true), vec![0]);

    let everything = describe_quotas(&mut s, &[], false);
    assert_eq!(everything.0, 0);
    assert_eq!(everything.1.len(), 4, "{everything:?}");
    // A user named alice: both her entities (not strict), only the user one (strict).
    let (_, found) = describe_quotas(&mut s, &[("user", EXACT, Some("alice"))], false);
    let alice_entities: Vec<_> = found.iter().map(|(e, _)| e.clone()).collect();
    assert_eq!(alice_entities.len(), 2, "{found:?}");
    let (_, found) = describe_quotas(&mut s, &[("user", EXACT, Some("alice"))], true);
    assert_eq!(found, vec![(pairs(&[("user", Some("alice"))]), vec![("producer_byte_rate".to_string(), 1048576.0)])]);
    // The default user; any specified client id; the ip entity.
    let (_, found) = describe_quotas(&mut s, &[("user", DEFAULT, None)], true);
    assert_eq!(found, vec![(pairs(&[("user", None)]), vec![("producer_byte_rate".to_string(), 4096.0)])]);
    let (_, found) = describe_quotas(&mut s, &[("client-id", SPECIFIED, None)], false);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].1, vec![("consumer_byte_rate".to_string(), 2048.0), ("request_percentage".to_string(), 25.5)]);
    let (_, found) = describe_quotas(&mut s, &[("ip", EXACT, Some("10.1.2.3"))], true);
    assert_eq!(found, vec![(pairs(&[("ip", Some("10.1.2.3"))]), vec![("connection_creation_rate".to_string(), 50.0)])]);
    // A malformed filter: INVALID_REQUEST for the whole request.
    assert_eq!(describe_quotas(&mut s, &[("user", EXACT, None)], false).0, 42);
    assert_eq!(describe_quotas(&mut s, &[("user", SPECIFIED, None), ("user", DEFAULT, None)], false).0, 42);

    // Removing a key; removing the last key of an entity removes the entity.
    let codes = alter_quotas(
        &mut s,
        vec![
            EntryData::default().with_entity(alice_app()).with_ops(vec![op("request_percentage", None)]),
            EntryData::default().with_entity(alice()).with_ops(vec![op("producer_byte_rate", None)]),
        ],
        false,
    );
    assert_eq!(codes, vec![0, 0]);
    let before_restart = describe_quotas(&mut s, &[], false);
    assert_eq!(before_restart.1.len(), 3, "{before_restart:?}");

    drop(s);
    assert!(broker.terminate().success());
    let broker = Broker::start_in(data.path(), 2, &[]);
    let mut s = broker.connect();
    assert_eq!(describe_quotas(&mut s, &[], false), before_restart);
}

/// Each user with its error code and `(mechanism, iterations)` credentials.
type Users = Vec<(String, i16, Vec<(i8, i32)>)>;

fn describe_users(s: &mut TcpStream) -> Users {
    send(s, ApiKey::DescribeUserScramCredentials, 0, 3, &DescribeUserScramCredentialsRequest::default());
    let (_, ResponseKind::DescribeUserScramCredentials(response)) = receive(s, ApiKey::DescribeUserScramCredentials, 0)
    else {
        panic!("not a DescribeUserScramCredentials response")
    };
    let response: DescribeUserScramCredentialsResponse = response;
    response
        .results
        .iter()
        .map(|r| {
            let infos = r.credential_infos.iter().map(|c| (c.mechanism, c.iterations)).collect();
            (r.user.to_string(), r.error_code, infos)
        })
        .collect()
}

fn upsertion(user: &str, mechanism: i8, iterations: i32) -> ScramCredentialUpsertion {
    ScramCredentialUpsertion::default()
        .with_name(text(user))
        .with_mechanism(mechanism)
        .with_iterations(iterations)
        .with_salt(Bytes::from_static(b"0123456789abcdef"))
        .with_salted_password(Bytes::from(vec![7u8; 32]))
}

#[test]
fn scram_changes_answer_kafkas_per_user_errors_and_survive_a_restart() {
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in(data.path(), 1, &[]);
    let mut s = broker.connect();
    let request = AlterUserScramCredentialsRequest::default()
        .with_upsertions(vec![
            upsertion("alice", 1, 4096),
            upsertion("dup", 1, 4096),
            upsertion("dup", 2, 4096),
            upsertion("strong", 2, 16385),
            upsertion("md5", 3, 4096),
            upsertion("", 1, 4096),
        ])
        .with_deletions(vec![ScramCredentialDeletion::default().with_name(text("ghost")).with_mechanism(1)]);
    send(&mut s, ApiKey::AlterUserScramCredentials, 0, 1, &request);
    let (_, ResponseKind::AlterUserScramCredentials(response)) = receive(&mut s, ApiKey::AlterUserScramCredentials, 0)
    else {
        panic!("not an AlterUserScramCredentials response")
    };
    let response: AlterUserScramCredentialsResponse = response;
    let mut codes: Vec<(String, i16)> = response.results.iter().map(|r| (r.user.to_string(), r.error_code)).collect();
    codes.sort();
    let expected = [("", 93), ("alice", 0), ("dup", 92), ("ghost", 91), ("md5", 33), ("strong", 93)];
    assert_eq!(codes, expected.map(|(u, c)| (u.to_string(), c)).to_vec());
    assert_eq!(describe_users(&mut s), vec![("alice".to_string(), 0, vec![(1, 4096)])]);

    drop(s);
    assert!(broker.terminate().success());
    let broker = Broker::start_in(data.path(), 1, &[]);
    let mut s = broker.connect();
    assert_eq!(describe_users(&mut s), vec![("alice".to_string(), 0, vec![(1, 4096)])]);
}

fn delete_user(s: &mut TcpStream, user: &str, mechanism: i8) -> i16 {
    let deletion = ScramCredentialDeletion::default().with_name(text(user)).with_mechanism(mechanism);
    let request = AlterUserScramCredentialsRequest::default().with_deletions(vec![deletion]);
    send(s, ApiKey::AlterUserScramCredentials, 0, 4, &request);
    let (_, ResponseKind::AlterUserScramCredentials(response)) = receive(s, ApiKey::AlterUserScramCredentials, 0)
    else {
        panic!("not an AlterUserScramCredentials response")
    };
    response.results[0].error_code
}

/// The users once the bootstrap credentials are committed (they are proposed once the quorum leads).
fn users_once_added(broker: &Broker, count: usize) -> Users {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let users = describe_users(&mut broker.connect());
        if users.len() >= count || std::time::Instant::now() > deadline {
            return users;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// Every byte of every file under `dir`.
fn contains_bytes(dir: &Path, needle: &[u8]) -> bool {
    std::fs::read_dir(dir).unwrap().flatten().any(|entry| {
        let path = entry.path();
        if path.is_dir() {
            return contains_bytes(&path, needle);
        }
        let bytes = std::fs::read(&path).unwrap_or_default();
        bytes.windows(needle.len()).any(|w| w == needle)
    })
}

#[test]
fn add_scram_creates_users_when_the_cluster_forms_and_never_again() {
    let data = tempfile::tempdir().unwrap();
    let flags = [
        "--add-scram",
        "SCRAM-SHA-256=[name=admin,password=admin-secret]",
        "--add-scram",
        "SCRAM-SHA-512=[name=ops,password=\"ops-secret\",iterations=8192]",
    ];
    let broker = Broker::start_in(data.path(), 1, &flags);
    let expected = vec![("admin".to_string(), 0, vec![(1, 4096)]), ("ops".to_string(), 0, vec![(2, 8192)])];
    assert_eq!(users_once_added(&broker, 2), expected, "{}", broker.log());
    assert_eq!(delete_user(&mut broker.connect(), "admin", 1), 0);
    let (status, log) = broker.terminate_with_log();
    assert!(status.success());
    assert!(!log.contains("admin-secret") && !log.contains("ops-secret"), "{log}");
    assert!(log.contains("SCRAM credentials from --add-scram added"), "{log}");

    // A restart with the same flags: the cluster exists, so the deleted user stays deleted.
    let broker = Broker::start_in(data.path(), 1, &flags);
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert_eq!(describe_users(&mut broker.connect()), vec![("ops".to_string(), 0, vec![(2, 8192)])]);
    let (status, log) = broker.terminate_with_log();
    assert!(status.success());
    assert!(!log.contains("--add-scram added"), "{log}");
    // Only salted keys were stored: no password in the quorum's log or snapshot, nor anywhere else.
    assert!(!contains_bytes(data.path(), b"admin-secret") && !contains_bytes(data.path(), b"ops-secret"));
}

#[test]
fn a_malformed_add_scram_is_refused_at_start_without_repeating_the_value() {
    let data = tempfile::tempdir().unwrap();
    for bad in ["SCRAM-SHA-256=[name=a,password=hunter2,iterations=10]", "SCRAM-MD5=[name=a,password=hunter2]"] {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let out = Command::new(env!("CARGO_BIN_EXE_shardlog"))
            .args(["start", "--listen", &format!("127.0.0.1:{port}"), "--metrics-listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(data.path())
            .args(["--add-scram", bad])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{stderr}");
        assert!(stderr.contains("--add-scram"), "{stderr}");
        assert!(!stderr.contains("hunter2"), "{stderr}");
    }
}

fn shardlog(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shardlog")).args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn shardlog_user_creates_lists_and_deletes_scram_users() {
    let broker = Broker::start(1);
    let bootstrap = format!("127.0.0.1:{}", broker.port);
    let b = ["--bootstrap", bootstrap.as_str()];
    let user = |args: &[&str]| shardlog(&[&["user"], args, &b[..]].concat());

    let (ok, out) =
        user(&["create", "alice", "--mechanism", "SCRAM-SHA-256", "--password", "pw-alice", "--iterations", "8192"]);
    assert!(ok, "{out}");
    let file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(file.path(), "pw-bob\n").unwrap();
    let (ok, out) = user(&["create", "bob", "--password-file", file.path().to_str().unwrap()]);
    assert!(ok, "{out}");
    let (ok, out) = user(&["create", "bob", "--mechanism", "SCRAM-SHA-256", "--password", "pw-bob"]);
    assert!(ok, "{out}");

    let (ok, out) = user(&["list"]);
    assert!(ok, "{out}");
    let rows: Vec<Vec<&str>> = out.lines().skip(1).map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        rows,
        vec![
            vec!["alice", "SCRAM-SHA-256", "8192"],
            vec!["bob", "SCRAM-SHA-256", "4096"],
            vec!["bob", "SCRAM-SHA-512", "4096"]
        ],
        "{out}"
    );
    // Kafka's refusals, in Kafka's words; the password never echoed.
    let (ok, out) = user(&["create", "carol", "--password", "pw-carol", "--iterations", "100"]);
    assert!(!ok && out.contains("UnacceptableCredential"), "{out}");
    assert!(!out.contains("pw-carol"), "{out}");
    let (ok, out) = user(&["delete", "nobody", "--mechanism", "SCRAM-SHA-256"]);
    assert!(!ok && out.contains("ResourceNotFound"), "{out}");
    let (ok, out) = user(&["create", "dave", "--mechanism", "SCRAM-SHA-1", "--password", "x"]);
    assert!(!ok && out.contains("--mechanism"), "{out}");

    // Deleting one mechanism, then every credential of a user.
    let (ok, out) = user(&["delete", "bob", "--mechanism", "SCRAM-SHA-512"]);
    assert!(ok, "{out}");
    let (ok, out) = user(&["delete", "alice"]);
    assert!(ok && out.contains("SCRAM-SHA-256"), "{out}");
    let users = describe_users(&mut broker.connect());
    assert_eq!(users, vec![("bob".to_string(), 0, vec![(1, 4096)])]);
    let log = broker.log();
    assert!(!log.contains("pw-alice") && !log.contains("pw-bob"), "{log}");
}
