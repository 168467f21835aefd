//! `shardlog start` refuses a data dir that cannot take direct I/O, at once and saying why: on a ramfs
//! the test mounts itself (root needed) and unmounts however it ends. ramfs refuses O_DIRECT at open.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A filesystem of `fstype` (tmpfs, ramfs) mounted on a temporary directory; unmounted when dropped.
struct Mount {
    dir: tempfile::TempDir,
}

impl Mount {
    fn new(fstype: &str) -> Mount {
        let dir = tempfile::tempdir().unwrap();
        let mut mount = Command::new("mount");
        mount.args(["-t", fstype, fstype]);
        if fstype == "tmpfs" {
            mount.args(["-o", "size=64m"]);
        }
        let status = mount.arg(dir.path()).status().expect("mount runs");
        assert!(status.success(), "mounting {fstype} needs root: {status}");
        Mount { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

#[test]
fn start_refuses_a_data_dir_without_direct_io_before_serving() {
    let ramfs = Mount::new("ramfs");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["start", "--shards", "1", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
        .arg(ramfs.path())
        .stdout(Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .expect("start shardlog");
    // A guard against a broker that starts after all, not a measure of how fast it stops.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the broker runs on ramfs:\n{}", std::fs::read_to_string(log.path()).unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(log.path()).unwrap();
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("does not support O_DIRECT"), "{stderr}");
    assert!(!stderr.contains("accepting connections"), "{stderr}");
    // The probe file is gone too (ramfs creates it before refusing the open); the data dir's lock stays.
    let left: Vec<_> = std::fs::read_dir(ramfs.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, [".shardlog-lock"], "files left behind in the data dir");
}
