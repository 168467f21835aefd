//! A port belongs to one process: a second broker (or quorum voter) started on a port another process
//! listens on stops with "address already in use", also when both start at the same moment, and the one
//! that got the port serves every client. The shards of one broker share its port.

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shardlog_broker::admin_cli;
use shardlog_broker::client::KafkaClient;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn spawn(args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start shardlog")
}

/// Waits until one of the two has exited; returns (the survivor, the loser's exit status and stderr).
fn one_wins(mut a: Child, mut b: Child) -> (Child, std::process::ExitStatus, String) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for _ in 0..2 {
            if let Some(status) = a.try_wait().unwrap() {
                let out = a.wait_with_output().unwrap();
                return (b, status, String::from_utf8_lossy(&out.stderr).into_owned());
            }
            std::mem::swap(&mut a, &mut b);
        }
        assert!(Instant::now() < deadline, "both processes still run on one port after 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stop(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn two_brokers_started_at_once_on_one_port_leave_one_serving_and_one_refused() {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let listen = format!("127.0.0.1:{}", free_port());
    let start = |dir: &tempfile::TempDir| {
        let data = dir.path().to_str().unwrap();
        spawn(&["start", "--listen", &listen, "--metrics-listen", "127.0.0.1:0", "--shards", "2", "--data-dir", data])
    };
    let (a, b) = (start(&dirs[0]), start(&dirs[1]));
    let (survivor, status, stderr) = one_wins(a, b);
    assert!(!status.success(), "the loser exits non-zero: {status}");
    assert!(stderr.contains("Address already in use"), "{stderr}");

    // Every client lands on the survivor: a topic created once is listed by every new connection.
    KafkaClient::connect(&listen).unwrap().create_topic("only-here", 1, 1, &[]).unwrap();
    for _ in 0..6 {
        assert_eq!(admin_cli::list(&mut KafkaClient::connect(&listen).unwrap()).unwrap(), "only-here\n");
    }
    stop(survivor);
}

#[test]
fn a_broker_started_on_a_port_in_use_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let taken = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["start", "--listen", &format!("127.0.0.1:{port}"), "--metrics-listen", "127.0.0.1:0"])
        .args(["--data-dir", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(&format!("listen on 127.0.0.1:{port}")) && stderr.contains("Address already in use"),
        "{stderr}"
    );
    drop(taken);
}

#[test]
fn two_quorum_voters_started_at_once_on_one_port_leave_one_running() {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let listen = format!("127.0.0.1:{}", free_port());
    let start = |dir: &tempfile::TempDir| {
        spawn(&["quorum", "--node-id", "1", "--listen", &listen, "--data-dir", dir.path().to_str().unwrap()])
    };
    let (a, b) = (start(&dirs[0]), start(&dirs[1]));
    let (mut survivor, status, stderr) = one_wins(a, b);
    assert!(!status.success(), "the loser exits non-zero: {status}");
    assert!(stderr.contains("Address already in use"), "{stderr}");
    std::thread::sleep(Duration::from_millis(500));
    assert!(survivor.try_wait().unwrap().is_none(), "the other voter keeps running");
    stop(survivor);
}
