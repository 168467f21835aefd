//! The shell commands of README.md and deploy/README.md, run as a user pastes them on one host: every
//! command of every ```sh block, in order, from one directory, with `shardlog` and `shardlog-bench` on
//! the PATH (the binaries this test build made, not a release build), each expected to exit 0, some to
//! print what the text says they print. A command that starts a server (`shardlog start`, `shardlog
//! quorum`, `shardlog-bench cluster`: a user runs each in a terminal of its own) runs in the background
//! until the file's commands are done, and the next command runs only once it serves: a broker's
//! `/ready` answers 200, a voter's port accepts, a launched cluster's brokers answer Metadata.
//!
//! The docs use the default ports (Kafka 9092, metrics 9644, ...), so each file runs in a network
//! namespace of its own (root: CI runs as root), where those ports are free whatever else runs on the
//! machine. Commands that cannot run here are listed in [`NOT_RUN`] with the reason, and commands run
//! in another form in [`RUN_AS`], with the reason; a listed command the docs no longer have fails the
//! test, so the lists stay true. ```toml blocks are settings files: each must load.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use shardlog_broker::client::KafkaClient;

/// Commands that cannot run in a test, with the reason. Each list names a command by its first line
/// without its comment (continuation lines joined), or by the words it starts with ([`names`]).
const NOT_RUN: &[(&str, &str)] = &[
    (
        "cargo build --release --locked",
        "a release build takes 10-15 minutes here; the commands run the debug binaries this test build made",
    ),
    (
        "export PATH=\"$PWD/target/release:$PATH\"",
        "puts the release build on the PATH; the test puts its own build's binaries there instead",
    ),
    ("bash .ci/run", "runs every test of the project, this one included"),
    (
        "shardlog-bench tps-table --scenario all --local",
        "runs for tens of minutes (every scenario, four local brokers per row); bench-tools/tests runs tps-table",
    ),
    (
        "shardlog-bench faults --brokers 3 --faults 100",
        "a campaign of 100 faults runs for many minutes; bench-tools/tests/faults.rs runs short campaigns",
    ),
    (
        "cargo install --locked cargo-deb",
        "installs a tool from crates.io; scripts/check-package.sh installs it (CI runs that script)",
    ),
    (
        "cargo deb -p shardlog-broker --locked",
        "a release build and a package; scripts/check-package.sh builds and checks the package (CI)",
    ),
    ("dpkg -i shardlog_0.1.0-1_amd64.deb", "installs a package on the machine; scripts/check-package.sh does (CI)"),
    ("dpkg -i shardlog_NEW_amd64.deb", "installs a package on the machine; scripts/check-package.sh does (CI)"),
    ("editor /etc/shardlog/shardlog.toml", "an editor, for a person"),
    ("systemctl enable --now shardlog", "systemd is not PID 1 on the machines the tests run on"),
    ("systemctl enable --now --no-block shardlog", "systemd is not PID 1 on the machines the tests run on"),
    ("systemctl status shardlog", "systemd is not PID 1 on the machines the tests run on"),
    ("systemctl restart shardlog", "systemd is not PID 1 on the machines the tests run on"),
    ("journalctl -u shardlog", "no journal: systemd is not PID 1 on the machines the tests run on"),
    (
        "shardlog topic create orders --partitions 6 --replication-factor 3 --bootstrap sl1:9092,sl2:9092,sl3:9092",
        "names the hosts sl1, sl2, sl3 of a cluster of three machines",
    ),
    ("shardlog topic describe orders --bootstrap sl1:9092", "names the host sl1 of a cluster of three machines"),
];

/// A command run in another form: the command, replacements made in all of its text, why.
type RunAs = (&'static str, &'static [(&'static str, &'static str)], &'static str);

/// Commands run in another form.
const RUN_AS: &[RunAs] = &[
    (
        "shardlog-bench produce --topic t --create",
        &[("--messages 1000000", "--messages 20000")],
        "fewer records: the same command, at a size a debug build sends in seconds",
    ),
    (
        "shardlog-bench consume --topic t",
        &[("--messages 1000000", "--messages 20000")],
        "reads the 20,000 records the produce above sent here",
    ),
    (
        "for n in 1 2 3; do",
        &[
            ("cat > /etc/shardlog/", "mkdir -p etc; cat > etc/"),
            ("/var/lib/shardlog/", "var/"),
            ("install -d -o shardlog -g shardlog -m 0750", "install -d -m 0750"),
        ],
        "the host's /etc and /var are not the test's: the files go under its directory, owned by whoever \
         runs it (the package makes the shardlog user)",
    ),
];

/// The command that starts the units' instances, which the test starts as systemd would (see
/// [`systemd_instances`]).
const ONE_HOST_UNITS: &str = "systemctl enable --now --no-block shardlog@n1 shardlog@n2 shardlog@n3";

/// What some commands must print (besides exiting 0): (the command, what its output holds).
const PRINTS: &[(&str, &[&str])] = &[
    ("kcat -C -b 127.0.0.1:9092 -t greetings", &["k1=hello", "k2=world"]),
    ("shardlog topic describe greetings", &["PartitionCount: 3"]),
    ("kcat -L -b 127.0.0.1:9092", &["topic \"greetings\" with 3 partitions"]),
    ("shardlog group list", &["orders-app"]),
    ("shardlog group describe orders-app", &["orders"]),
    ("shardlog group reset-offsets orders-app", &["orders\t0\t0"]),
    ("shardlog topic describe placed", &["PartitionCount: 3", "Replicas: 1,2\t", "Replicas: 3,1\t"]),
    ("shardlog topic list", &["clicks", "views"]),
    ("shardlog topic describe clicks", &["PartitionCount: 6", "retention.ms=86400000"]),
    ("shardlog --version", &["shardlog 0."]),
    ("shardlog-bench audit --topic t", &["missing 0"]),
    ("shardlog topic create try", &["Created topic try."]),
];

/// How long a server may take to serve, and a command to finish.
const SERVE_WITHIN: Duration = Duration::from_secs(120);
const COMMAND_WITHIN: Duration = Duration::from_secs(300);

#[test]
fn every_command_of_the_readme_works_when_pasted_on_one_host() {
    run_doc("README.md");
}

#[test]
fn every_command_of_the_deploy_notes_works_when_pasted_on_one_host() {
    run_doc("deploy/README.md");
}

/// Every `NOT_RUN`, `RUN_AS` and `PRINTS` entry names a command the docs have.
#[test]
fn every_listed_command_is_one_the_docs_have() {
    let statements: Vec<Statement> = ["README.md", "deploy/README.md"].iter().flat_map(|f| statements(f)).collect();
    let keys = NOT_RUN.iter().map(|(k, _)| *k).chain(RUN_AS.iter().map(|(k, _, _)| *k));
    for key in keys.chain(PRINTS.iter().map(|(k, _)| *k)).chain([ONE_HOST_UNITS]) {
        assert!(statements.iter().any(|s| names(&s.key(), key)), "no command of the docs is {key:?}");
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// One command of a ```sh block, as bash takes it (continuation lines, loops and here-documents included).
#[derive(Debug, Clone)]
struct Statement {
    file: &'static str,
    line: usize,
    text: String,
}

impl Statement {
    /// Its first line (continuations joined), without a trailing comment: what the lists match on.
    fn key(&self) -> String {
        let mut first = String::new();
        for line in self.text.lines() {
            match line.strip_suffix('\\') {
                Some(part) => first.push_str(part.trim_start()),
                None => {
                    first.push_str(line.trim_start());
                    break;
                }
            }
        }
        strip_comment(&first).trim().to_string()
    }

    fn whence(&self) -> String {
        format!("{}:{}: {}", self.file, self.line, self.key())
    }
}

/// Whether `listed` names the command `key`: the same, or its first words.
fn names(key: &str, listed: &str) -> bool {
    key == listed || key.starts_with(&format!("{listed} "))
}

/// `line` without a ` # comment` outside quotes.
fn strip_comment(line: &str) -> &str {
    let (mut single, mut double, mut previous) = (false, false, ' ');
    for (i, c) in line.char_indices() {
        match c {
            '\'' if !double => single = !single,
            '"' if !single => double = !double,
            '#' if !single && !double && previous.is_whitespace() => return &line[..i],
            _ => {}
        }
        previous = c;
    }
    line
}

/// The statements of `file`'s ```sh blocks, in order.
fn statements(file: &'static str) -> Vec<Statement> {
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    let mut out = Vec::new();
    let mut in_block = false;
    let mut pending: Option<(usize, String)> = None;
    let mut shape = Shape::default();
    for (i, line) in text.lines().enumerate() {
        if !in_block {
            in_block = line.trim() == "```sh";
            continue;
        }
        if line.trim() == "```" {
            assert!(pending.is_none(), "{file}:{}: a command is not finished at the end of its block", i + 1);
            in_block = false;
            continue;
        }
        if pending.is_none() && (line.trim().is_empty() || line.trim_start().starts_with('#')) {
            continue;
        }
        let (_, statement) = pending.get_or_insert_with(|| (i + 1, String::new()));
        statement.push_str(line);
        statement.push('\n');
        shape.read(line);
        if shape.complete() {
            let (line, text) = pending.take().expect("a statement");
            out.push(Statement { file, line, text });
            shape = Shape::default();
        }
    }
    out
}

/// How much of a compound command has been read: open quotes, loops, a here-document, a continuation.
#[derive(Debug, Default)]
struct Shape {
    single: bool,
    double: bool,
    depth: i32,
    heredoc: Option<String>,
    continued: bool,
}

impl Shape {
    fn read(&mut self, line: &str) {
        if let Some(end) = &self.heredoc {
            if line.trim() == end {
                self.heredoc = None;
            }
            return;
        }
        self.continued = line.ends_with('\\');
        let mut word = String::new();
        let mut words = Vec::new();
        for c in line.chars().chain([' ']) {
            match c {
                '\'' if !self.double => self.single = !self.single,
                '"' if !self.single => self.double = !self.double,
                '#' if !self.single && !self.double && word.is_empty() => break,
                c if !self.single && !self.double && (c.is_whitespace() || c == ';') => {
                    words.push(std::mem::take(&mut word));
                }
                c => word.push(c),
            }
        }
        for w in &words {
            match w.as_str() {
                "for" | "while" | "until" | "if" | "case" => self.depth += 1,
                "done" | "fi" | "esac" => self.depth -= 1,
                _ => {}
            }
            if let Some(end) = w.strip_prefix("<<") {
                self.heredoc = Some(end.trim_start_matches('-').trim_matches(['\'', '"']).to_string());
            }
        }
    }

    fn complete(&self) -> bool {
        !self.single && !self.double && self.depth == 0 && self.heredoc.is_none() && !self.continued
    }
}

/// What the test does with a statement.
#[derive(Debug)]
enum Step {
    /// Runs it and waits for its exit.
    Run(String),
    /// Starts it in the background and waits until it serves.
    Serve(String),
    NotRun(&'static str),
}

fn plan(statement: &Statement) -> Vec<Step> {
    let key = statement.key();
    if let Some((_, why)) = NOT_RUN.iter().find(|(k, _)| names(&key, k)) {
        return vec![Step::NotRun(why)];
    }
    if key == ONE_HOST_UNITS {
        return systemd_instances(&key).into_iter().map(Step::Serve).collect();
    }
    let mut text = statement.text.clone();
    if let Some((_, replacements, _)) = RUN_AS.iter().find(|(k, _, _)| names(&key, k)) {
        for (from, to) in *replacements {
            assert!(text.contains(from), "{}: no {from:?} to replace", statement.whence());
            text = text.replace(from, to);
        }
    }
    // `cargo run --release -p shardlog-broker --bin shardlog -- ARGS` is the built binary with ARGS.
    if let Some(rest) = key.strip_prefix("cargo run")
        && let Some((flags, args)) = rest.split_once(" -- ")
    {
        let binary = if flags.contains("shardlog-bench") { "shardlog-bench" } else { "shardlog" };
        text = format!("{binary} {args}");
    }
    assert!(!text.trim_start().starts_with("cargo "), "{}: a cargo command: list it in NOT_RUN", statement.whence());
    let runs = strip_comment(text.lines().next().unwrap_or_default()).trim().to_string();
    let server = ["shardlog start", "shardlog quorum", "shardlog-bench cluster"].iter().any(|s| names(&runs, s))
        && !runs.contains("--help");
    if server {
        vec![Step::Serve(strip_comment(text.trim_end()).trim_end_matches('&').to_string())]
    } else {
        vec![Step::Run(text)]
    }
}

/// `systemctl enable --now shardlog@n1 ...`: each instance's `ExecStart` from deploy/shardlog@.service
/// (`%i` the instance), with the paths [`RUN_AS`] moves into the test's directory.
fn systemd_instances(command: &str) -> Vec<String> {
    let unit = std::fs::read_to_string(repo().join("deploy/shardlog@.service")).unwrap();
    let exec = unit.lines().find_map(|l| l.strip_prefix("ExecStart=")).expect("an ExecStart line");
    command
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("shardlog@"))
        .map(|instance| {
            exec.replace("%i", instance)
                .replace("/usr/bin/shardlog", "shardlog")
                .replace("/etc/shardlog/", "etc/")
                .replace("/var/lib/shardlog/", "var/")
        })
        .collect()
}

/// A server a command started; stopped (SIGTERM, then SIGKILL) when dropped.
struct Server {
    child: Child,
    whence: String,
    log: PathBuf,
}

impl Server {
    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: kill(2) with a pid this test spawned.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `file`'s commands in a network namespace of this thread's own, from a new directory.
fn run_doc(file: &'static str) {
    // SAFETY: unshare(2) of this thread's network namespace; what it spawns from now on inherits it.
    let unshared = unsafe { libc::unshare(libc::CLONE_NEWNET) };
    assert_eq!(unshared, 0, "a network namespace of its own needs root: {}", std::io::Error::last_os_error());
    let lo = Command::new("ip").args(["link", "set", "lo", "up"]).status().expect("ip (iproute2)");
    assert!(lo.success(), "ip link set lo up");

    let base = std::env::var_os("SHARDLOG_TEST_DIR").map_or_else(|| repo().join("target/disk-tests"), PathBuf::from);
    std::fs::create_dir_all(&base).unwrap();
    let dir = tempfile::tempdir_in(&base).unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_shardlog")).parent().unwrap().to_path_buf();
    assert!(
        bin.join("shardlog-bench").is_file(),
        "the docs run shardlog-bench too: build it first (cargo build -p shardlog-bench)"
    );
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap_or_default());

    let mut servers: Vec<Server> = Vec::new();
    // Servers started since the last command ran: the first brokers of a cluster wait for each other, so
    // they are all started before any is waited for, as a user starts them in their terminals.
    let mut starting: Vec<(Server, String, PathBuf)> = Vec::new();
    let mut not_run = Vec::new();
    for (n, statement) in statements(file).iter().enumerate() {
        for step in plan(statement) {
            match step {
                Step::NotRun(why) => not_run.push(format!("{}\n    not run: {why}", statement.whence())),
                Step::Run(text) => {
                    for (mut server, text, stdout) in starting.drain(..) {
                        await_serving(&mut server, &text, &stdout);
                        servers.push(server);
                    }
                    let (ok, out) = run(&text, dir.path(), &path, &servers);
                    assert!(ok, "{} failed:\n{out}", statement.whence());
                    if let Some((_, wanted)) = PRINTS.iter().find(|(k, _)| names(&statement.key(), k)) {
                        for w in *wanted {
                            assert!(out.contains(w), "{}: printed no {w:?}:\n{out}", statement.whence());
                        }
                    }
                }
                Step::Serve(text) => {
                    let log = dir.path().join(format!("server-{n}-{}.log", servers.len() + starting.len()));
                    let child = Command::new("bash")
                        .args(["-c", &format!("exec {text}")])
                        .current_dir(dir.path())
                        .env("PATH", &path)
                        .env_remove("RUST_LOG")
                        .env_remove(shardlog_broker::client::BOOTSTRAP_ENV)
                        .stdin(Stdio::null())
                        .stdout(std::fs::File::create(&log).unwrap())
                        .stderr(std::fs::File::create(log.with_extension("err")).unwrap())
                        .spawn()
                        .unwrap();
                    let server = Server { child, whence: statement.whence(), log: log.with_extension("err") };
                    starting.push((server, text, log));
                }
            }
        }
    }
    for (mut server, text, stdout) in starting {
        await_serving(&mut server, &text, &stdout);
    }
    eprintln!("{file}: {} commands not run here:\n{}", not_run.len(), not_run.join("\n"));
    check_toml_blocks(file);
}

/// Runs `text` with bash (`pipefail`: a failing command in a pipe fails it); whether it exited 0, and
/// its stdout and stderr.
fn run(text: &str, dir: &Path, path: &str, servers: &[Server]) -> (bool, String) {
    let mut child = Command::new("bash")
        .args(["-o", "pipefail", "-c", text])
        .current_dir(dir)
        .env("PATH", path)
        .env_remove("RUST_LOG")
        .env_remove(shardlog_broker::client::BOOTSTRAP_ENV)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut stdout, mut stderr) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = stdout.read_to_string(&mut out);
        out
    });
    let err_reader = std::thread::spawn(move || {
        let mut err = String::new();
        let _ = stderr.read_to_string(&mut err);
        err
    });
    let deadline = Instant::now() + COMMAND_WITHIN;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (out, err) = (reader.join().unwrap(), err_reader.join().unwrap());
    let ok = status.is_some_and(|s| s.success());
    let mut said =
        format!("exit: {status:?} (None: still running after {COMMAND_WITHIN:?})\n{out}\n--- stderr ---\n{err}");
    if !ok {
        for s in servers {
            said.push_str(&format!("\n--- log of {} ---\n{}", s.whence, s.log()));
        }
        return (false, said);
    }
    (true, out)
}

/// Waits until the server `text` started serves (see the module doc); fails the test with its log if it
/// exits or does not serve within [`SERVE_WITHIN`].
fn await_serving(server: &mut Server, text: &str, stdout: &Path) {
    let deadline = Instant::now() + SERVE_WITHIN;
    loop {
        if let Some(status) = server.child.try_wait().unwrap() {
            panic!("{} exited with {status} instead of serving:\n{}", server.whence, server.log());
        }
        assert!(
            Instant::now() < deadline,
            "{} did not serve within {SERVE_WITHIN:?}:\n{}",
            server.whence,
            server.log()
        );
        if serves(text, &server.log(), &std::fs::read_to_string(stdout).unwrap_or_default()) {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn serves(text: &str, log: &str, stdout: &str) -> bool {
    if text.starts_with("shardlog start") {
        // The broker logs where its metrics endpoint listens; its /ready says whether it serves.
        let Some(addr) = log
            .lines()
            .find(|l| l.contains("metrics endpoint"))
            .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("addr=")))
        else {
            return false;
        };
        return get(addr, "/ready").is_some_and(|(status, _)| status == 200);
    }
    if text.starts_with("shardlog quorum") {
        let listen = text.split_whitespace().skip_while(|w| *w != "--listen").nth(1).expect("--listen");
        return log.contains("quorum voter running") && std::net::TcpStream::connect(listen).is_ok();
    }
    // shardlog-bench cluster prints the bootstrap list once its brokers run: each answers Metadata
    // naming all of them.
    let Some(list) = stdout.lines().next() else { return false };
    let count = list.split(',').count();
    list.split(',').all(|addr| {
        KafkaClient::connect(addr).and_then(|mut c| c.metadata(None)).is_ok_and(|m| m.brokers.len() == count)
    })
}

/// `GET path` of an HTTP endpoint: the status and the body.
fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: test\r\n\r\n").ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    Some((head.split(' ').nth(1)?.parse().ok()?, body.to_string()))
}

/// Every ```toml block of `file` is a settings file the broker takes.
fn check_toml_blocks(file: &str) {
    let text = std::fs::read_to_string(repo().join(file)).unwrap();
    let mut blocks = text.split("```toml\n").skip(1);
    for block in blocks.by_ref() {
        let toml = block.split("```").next().unwrap();
        shardlog_broker::config::BrokerConfig::from_toml(toml).unwrap_or_else(|e| panic!("{file}: {toml}\n{e:#}"));
    }
}
