//! The real `shardlog` binary as a test subject: started as a process on a free port with its own data
//! dir, spoken to over TCP with requests encoded by `kafka-protocol`'s client side.
#![allow(dead_code)]

pub mod cluster;
pub mod pki;
pub mod requests;
pub mod txn;
pub mod voters;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::messages::{ApiKey, ResponseKind};
use kafka_protocol::protocol::Encodable;
use shardlog_net::kafka::{decode_response, encode_request};

pub struct Broker {
    child: Child,
    pub port: u16,
    data: std::path::PathBuf,
    _owned: Option<tempfile::TempDir>,
    /// The broker's stderr (its log), kept in a file; printed if the test fails.
    log: tempfile::NamedTempFile,
}

impl Broker {
    pub fn start(shards: usize) -> Broker {
        Self::start_with(shards, &[])
    }

    pub fn start_with(shards: usize, extra: &[&str]) -> Broker {
        let data = tempfile::tempdir().unwrap();
        let mut broker = Self::start_in(data.path(), shards, extra);
        broker._owned = Some(data);
        broker
    }

    /// Starts on an existing data dir (for restarts); the caller keeps the dir alive.
    pub fn start_in(data: &Path, shards: usize, extra: &[&str]) -> Broker {
        Self::start_in_env(data, shards, extra, None)
    }

    /// [`Broker::start_in`] with `RUST_LOG` set to `rust_log` (`None`: unset, the broker's default).
    pub fn start_in_env(data: &Path, shards: usize, extra: &[&str], rust_log: Option<&str>) -> Broker {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        Self::start_at(data, port, shards, extra, rust_log)
    }

    /// Starts on `port` (a restart where clients already know the address).
    pub fn start_at(data: &Path, port: u16, shards: usize, extra: &[&str], rust_log: Option<&str>) -> Broker {
        let mut broker = Self::spawn_at(data, port, shards, extra, rust_log);
        broker.wait_until_it_answers();
        broker
    }

    /// Starts the process on `port` without waiting for it to answer (brokers of one quorum answer only
    /// once a majority of its voters runs); [`Broker::wait_until_it_answers`] waits.
    pub fn spawn_at(data: &Path, port: u16, shards: usize, extra: &[&str], rust_log: Option<&str>) -> Broker {
        Self::spawn_with(data, port, shards, extra, rust_log, |_| {})
    }

    /// [`Broker::spawn_at`] with the command changed by `prepare` before it runs (limits, capabilities).
    pub fn spawn_with(
        data: &Path,
        port: u16,
        shards: usize,
        extra: &[&str],
        rust_log: Option<&str>,
        prepare: impl FnOnce(&mut Command),
    ) -> Broker {
        let log = tempfile::NamedTempFile::new().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_shardlog"));
        prepare(&mut command);
        match rust_log {
            Some(filter) => command.env("RUST_LOG", filter),
            None => command.env_remove("RUST_LOG"),
        };
        let child = command
            .args(["start", "--listen", &format!("127.0.0.1:{port}"), "--shards", &shards.to_string()])
            .args(["--metrics-listen", "127.0.0.1:0"])
            .arg("--data-dir")
            .arg(data)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .expect("start shardlog");
        Broker { child, port, data: data.to_path_buf(), _owned: None, log }
    }

    /// Waits (up to 60 s) until the broker answers: the listener is open from the start, and the broker
    /// is ready once it answers.
    pub fn wait_until_it_answers(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.answers() {
            if let Some(status) = self.child.try_wait().unwrap() {
                panic!("broker exited with {status} before it answered:\n{}", self.log());
            }
            assert!(Instant::now() < deadline, "broker did not answer within 60 s:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Whether the broker answers an ApiVersions request now (within a second).
    fn answers(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        let request = kafka_protocol::messages::ApiVersionsRequest::default();
        if try_send(&mut s, ApiKey::ApiVersions, 0, 0, &request).is_err() {
            return false;
        }
        let mut size = [0u8; 4];
        s.read_exact(&mut size).is_ok()
    }

    pub fn data_dir(&self) -> &Path {
        &self.data
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    }

    /// Sends SIGTERM; returns the exit status and everything the broker logged.
    pub fn terminate_with_log(mut self) -> (std::process::ExitStatus, String) {
        let status = self.stop();
        (status, self.log())
    }

    /// Sends SIGTERM and returns the exit status.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        self.stop()
    }

    fn stop(&mut self) -> std::process::ExitStatus {
        let pid = self.child.id() as i32;
        // SAFETY: kill(2) with a pid we spawned and a valid signal number.
        assert_eq!(unsafe { libc_kill(pid, 15) }, 0);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                if !status.success() {
                    eprintln!("--- broker log ({status:?}) ---\n{}", self.log());
                }
                return status;
            }
            assert!(Instant::now() < deadline, "broker did not stop within 20 s of SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

unsafe extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

impl Broker {
    /// Sends `signal` (SIGSTOP, SIGCONT, ...) to the broker process.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) with a pid we spawned and a valid signal number.
        assert_eq!(unsafe { libc_kill(self.child.id() as i32, signal) }, 0);
    }

    /// SIGKILL, as a crash would.
    pub fn kill(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Broker {
    /// What the broker has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("--- broker log ---\n{}", self.log());
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn send<T: Encodable>(stream: &mut TcpStream, api_key: ApiKey, version: i16, correlation_id: i32, body: &T) {
    try_send(stream, api_key, version, correlation_id, body).unwrap();
}

/// Like [`send`], for a connection the broker may close.
pub fn try_send<T: Encodable>(
    stream: &mut TcpStream,
    api_key: ApiKey,
    version: i16,
    correlation_id: i32,
    body: &T,
) -> std::io::Result<()> {
    let out = encode_request(api_key, version, correlation_id, "wire-test", body).unwrap();
    stream.write_all(&out)
}

pub fn receive(stream: &mut TcpStream, api_key: ApiKey, version: i16) -> (i32, ResponseKind) {
    let mut size = [0u8; 4];
    stream.read_exact(&mut size).expect("a response");
    let mut frame = vec![0u8; i32::from_be_bytes(size) as usize];
    stream.read_exact(&mut frame).unwrap();
    decode_response(Bytes::from(frame), api_key, version).unwrap()
}

pub fn assert_closed(stream: &mut TcpStream) {
    let mut byte = [0u8; 1];
    match stream.read(&mut byte) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("connection should be closed, read gave {other:?}"),
    }
}

/// Runs a client script that prints `restart-broker` on a line of its own midway and then waits for
/// `restarted` on its stdin: meanwhile the broker is stopped with SIGTERM and started again on the same
/// port and data dir `data` (with `shards` and `extra` as before). Panics with the script's output if it
/// fails, does not ask for the restart, or does not finish within `limit`; returns its stdout and the
/// broker now running.
pub fn run_across_restart(
    mut script: Command,
    broker: Broker,
    data: &Path,
    shards: usize,
    extra: &[&str],
    limit: Duration,
) -> (String, Broker) {
    use std::io::BufRead;
    let port = broker.port;
    let mut child = script
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the client script starts (.ci/run installs the clients)");
    let (lines_tx, lines) = std::sync::mpsc::channel();
    let stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    std::thread::spawn(move || stdout.lines().map_while(Result::ok).try_for_each(|l| lines_tx.send(l)));
    let mut stderr = child.stderr.take().unwrap();
    let errors = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let deadline = Instant::now() + limit;
    let mut out = String::new();
    let mut running = broker;
    let mut restarted = false;
    // Until the script closes its stdout (it ends) or the time is up.
    while let Ok(line) = lines.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
        out.push_str(&line);
        out.push('\n');
        if line == "restart-broker" {
            assert!(!restarted, "the script asked for one restart:\n{out}");
            let stopped = running.terminate();
            assert!(stopped.success(), "the broker stopped cleanly: {stopped:?}");
            running = Broker::start_at(data, port, shards, extra, None);
            restarted = true;
            child.stdin.as_mut().unwrap().write_all(b"restarted\n").unwrap();
        }
    }
    if Instant::now() >= deadline {
        let _ = child.kill();
    }
    let status = child.wait().unwrap();
    let errors = errors.join().unwrap();
    assert!(status.success(), "the client script failed ({status}):\n{out}\n{errors}");
    assert!(restarted, "the script asked for the broker's restart:\n{out}\n{errors}");
    (out, running)
}

/// Runs `scripts/client-tests/<script>` (a real client's check, in Python) with `args`; panics with its
/// output and errors unless it exits 0 with "ok" as its last line. Its output is printed either way.
pub fn run_client_script(script: &str, args: &[&str]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/client-tests").join(script);
    let out = std::process::Command::new("python3").arg(&path).args(args).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}");
    assert!(
        out.status.success() && stdout.trim_end().ends_with("ok"),
        "{script}: {stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
