//! Who may use a data dir, and what a data dir from before the quorum becomes: a second process on the
//! same dir is refused (two brokers appending to one segment file would destroy it), a dir recorded for
//! another node id is refused, and the topic record single-node brokers kept before the quorum held the
//! metadata (`topics.toml`) is imported with every log kept.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use shardlog_broker::client::KafkaClient;

use common::Broker;
use common::requests::{batch, create, fetch_all, produce_one, stored};

/// Runs `shardlog start` expected to refuse: returns its stderr once it has exited unsuccessfully.
fn refused_start(data: &Path, extra: &[&str]) -> String {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let out = Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["start", "--listen", &format!("127.0.0.1:{port}"), "--metrics-listen", "127.0.0.1:0"])
        .args(["--shards", "1", "--data-dir"])
        .arg(data)
        .args(extra)
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "started anyway: {stderr}");
    stderr
}

#[test]
fn a_second_process_on_a_data_dir_in_use_is_refused() {
    let broker = Broker::start(1);
    let data = broker.data_dir().to_path_buf();
    let stderr = refused_start(&data, &[]);
    assert!(stderr.contains("in use by another shardlog process"), "{stderr}");
    // The first one is untouched and still serves.
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "still-here", 1, 1, &[]), 0);
}

#[test]
fn a_data_dir_of_another_node_is_refused() {
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in(data.path(), 1, &["--node-id", "1"]);
    assert!(broker.terminate().success());
    let stderr = refused_start(data.path(), &["--node-id", "2"]);
    assert!(stderr.contains("belongs to node 1, not node 2"), "{stderr}");
}

/// Leaves `dir` as a broker from before the quorum did: topic "legacy" (2 partitions, retention.ms
/// 123456) with records, its logs without `partition.metadata`, no quorum; returns the topic id and each
/// partition's stored records. The caller writes `topics.toml`.
fn legacy_data_dir(dir: &Path) -> (String, Vec<Vec<u8>>) {
    let broker = Broker::start_in(dir, 2, &[]);
    let mut s = broker.connect();
    assert_eq!(create(&mut s, "legacy", 2, 1, &[("retention.ms", "123456")]), 0);
    let expected: Vec<Vec<u8>> = (0..2)
        .map(|p| {
            let b = batch(p as u8, 4, 0);
            let (err, base) = produce_one(&mut s, "legacy", p, &b);
            assert_eq!(err, 0);
            stored(&b, base)
        })
        .collect();
    assert!(broker.terminate().success());
    let metadata = std::fs::read_to_string(dir.join("legacy-0/partition.metadata")).unwrap();
    let id = metadata.lines().find_map(|l| l.strip_prefix("topic_id: ")).unwrap().to_string();
    std::fs::remove_dir_all(dir.join("quorum")).unwrap();
    std::fs::remove_file(dir.join("broker-incarnation")).unwrap();
    for p in 0..2 {
        std::fs::remove_file(dir.join(format!("legacy-{p}/partition.metadata"))).unwrap();
    }
    (id, expected)
}

#[test]
fn topics_recorded_before_the_quorum_are_imported_with_their_logs() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path();
    let (id, expected) = legacy_data_dir(dir);
    let old_record = format!(
        "[topics.legacy]\nid = \"{id}\"\nconfigs = {{ \"retention.ms\" = \"123456\" }}\n\n\
         [[topics.legacy.partitions]]\nshard = 0\nleader_epoch = 0\n\n\
         [[topics.legacy.partitions]]\nshard = 1\nleader_epoch = 0\n"
    );
    std::fs::write(dir.join("topics.toml"), old_record).unwrap();

    let broker = Broker::start_in(dir, 2, &[]);
    let mut s = broker.connect();
    for p in 0..2 {
        let (err, records) = fetch_all(&mut s, "legacy", p);
        assert_eq!(err, 0);
        assert_eq!(records.as_ref(), expected[p as usize].as_slice(), "partition {p} kept its records");
    }
    let mut admin = KafkaClient::connect(&format!("127.0.0.1:{}", broker.port)).unwrap();
    let topic = admin.metadata(Some(&["legacy"])).unwrap().topics.remove(0);
    assert_eq!(topic.topic_id.to_string(), id, "the recorded topic id is kept");
    let retention = admin.configs("legacy").unwrap().into_iter().find(|(k, _, _)| k == "retention.ms").unwrap();
    assert_eq!(retention.1, "123456", "and its settings");
    assert!(!dir.join("topics.toml").exists() && dir.join("topics.toml.imported").exists());
    assert!(!broker.log().contains("stray"), "no log was set aside: {}", broker.log());
}

#[test]
fn a_single_node_quorum_is_not_silently_turned_into_a_second_quorum() {
    let data = tempfile::tempdir().unwrap();
    let broker = Broker::start_in(data.path(), 1, &[]);
    assert!(broker.terminate().success());
    let voters = "1@127.0.0.1:1,2@127.0.0.1:2,3@127.0.0.1:3";
    let stderr = refused_start(data.path(), &["--quorum-voters", voters]);
    assert!(stderr.contains("voters 1, not 1,2,3: changing the voters is not supported"), "{stderr}");
}

#[test]
fn an_old_topic_record_that_cannot_be_imported_keeps_every_log_where_it_is() {
    let data = tempfile::tempdir().unwrap();
    let dir = data.path();
    legacy_data_dir(dir);
    std::fs::write(dir.join("topics.toml"), "[topics.legacy\nnot toml").unwrap();
    let broker = Broker::start_in(dir, 2, &[]);
    assert!(broker.log().contains("not (wholly) imported"), "{}", broker.log());
    for p in 0..2 {
        assert!(dir.join(format!("legacy-{p}")).is_dir(), "legacy-{p} is not set aside");
    }
    assert!(dir.join("topics.toml").exists(), "kept for the next start");
}
