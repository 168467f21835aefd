//! `shardlog check` and the direct-I/O refusal of `shardlog start`, against real filesystems: the data
//! disk (`$SHARDLOG_TEST_DIR`, ext4 in CI; `target/disk-tests` by default), and a tmpfs and a ramfs each
//! test mounts itself (root needed) and unmounts however it ends. tmpfs takes O_DIRECT on current
//! kernels, so only its filesystem type tells it is in memory; ramfs refuses O_DIRECT at open.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The directory tests that need a real disk work in.
fn disk_root() -> PathBuf {
    let root = std::env::var_os("SHARDLOG_TEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/disk-tests"));
    std::fs::create_dir_all(&root).expect("create test root");
    root
}

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

fn shardlog(args: &[&str], data_dir: Option<&Path>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_shardlog"));
    command.args(args);
    if let Some(dir) = data_dir {
        command.arg("--data-dir").arg(dir);
    }
    command.output().expect("run shardlog")
}

/// The RESULT and FOUND columns of the row named `check`.
fn row(table: &str, check: &str) -> (String, String) {
    let line = table
        .lines()
        .find(|l| l.strip_prefix(check).is_some_and(|rest| rest.starts_with("  ")))
        .unwrap_or_else(|| panic!("no row {check:?} in:\n{table}"));
    let rest = line[check.len()..].trim_start();
    let (result, found) = rest.split_once(' ').unwrap_or((rest, ""));
    (result.to_string(), found.trim().to_string())
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[test]
fn check_passes_on_the_data_disk_and_reports_its_speed() {
    let data = tempfile::tempdir_in(disk_root()).unwrap();
    let output = shardlog(&["check"], Some(data.path()));
    let table = stdout(&output);
    assert!(output.status.success(), "check failed:\n{table}\n{}", stderr(&output));
    assert_eq!(row(&table, "O_DIRECT").0, "pass", "{table}");
    assert_eq!(row(&table, "filesystem").0, "pass", "{table}");
    let (_, bandwidth) = row(&table, "write bandwidth");
    assert!(bandwidth.contains("MB/s"), "{table}");
    let (_, sync) = row(&table, "fdatasync");
    assert!(sync.contains("p50") && sync.contains("p99"), "{table}");
    // Every probe and measurement file is gone.
    assert_eq!(std::fs::read_dir(data.path()).unwrap().count(), 0, "files left behind in the data dir");
}

#[test]
fn check_takes_log_dirs_from_the_config_file_and_checks_a_missing_one_through_its_parent() {
    let parent = tempfile::tempdir_in(disk_root()).unwrap();
    let data = parent.path().join("not-yet");
    let config = parent.path().join("broker.toml");
    std::fs::write(&config, format!("\"log.dirs\" = {:?}\n", data.to_string_lossy())).unwrap();
    let output = shardlog(&["check", "--config", config.to_str().unwrap()], None);
    let table = stdout(&output);
    assert!(output.status.success(), "check failed:\n{table}\n{}", stderr(&output));
    let (result, found) = row(&table, "data dir");
    assert_eq!(result, "pass");
    assert!(found.contains("does not exist yet") && found.contains(&parent.path().display().to_string()), "{table}");
    assert!(!data.exists(), "check created the data dir");
}

#[test]
fn check_fails_a_data_dir_on_tmpfs_as_in_memory() {
    let tmpfs = Mount::new("tmpfs");
    let output = shardlog(&["check"], Some(tmpfs.path()));
    let table = stdout(&output);
    assert!(!output.status.success(), "check passed a tmpfs data dir:\n{table}");
    let (result, found) = row(&table, "filesystem");
    assert_eq!(result, "fail", "{table}");
    assert!(found.contains("tmpfs") && found.contains("acknowledged data would live in memory"), "{table}");
    assert!(stderr(&output).contains("failed"), "{}", stderr(&output));
}

#[test]
fn check_fails_the_direct_io_row_on_ramfs() {
    let ramfs = Mount::new("ramfs");
    let output = shardlog(&["check"], Some(ramfs.path()));
    let table = stdout(&output);
    assert!(!output.status.success(), "check passed a ramfs data dir:\n{table}");
    let (result, found) = row(&table, "O_DIRECT");
    assert_eq!(result, "fail", "{table}");
    assert!(found.contains("does not support O_DIRECT"), "{table}");
    assert_eq!(std::fs::read_dir(ramfs.path()).unwrap().count(), 0, "files left behind in the data dir");
}

#[test]
fn start_refuses_a_data_dir_without_direct_io_before_serving() {
    let ramfs = Mount::new("ramfs");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_shardlog"))
        .args(["start", "--shards", "1", "--listen", &format!("127.0.0.1:{port}"), "--metrics-listen", "127.0.0.1:0"])
        .arg("--data-dir")
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
