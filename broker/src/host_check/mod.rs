//! What the host must offer a broker, checked before it runs: `shardlog check` prints one row per
//! check (pass, warn or fail, what was found, and for a warn or fail the setting or command to change),
//! and `shardlog start` refuses a data dir that cannot take direct I/O with the same explanation
//! ([`data_dir::require_direct_io`]).
//!
//! It owns the probes of the host (kernel, io_uring, resource limits, kernel settings), of the data dir's
//! filesystem (direct I/O, its type, free space), a short measurement of the data disk, and the TLS
//! listeners' certificates (those expiring within 30 days). It must never
//! leave anything behind in the data dir (every file it makes is removed, also when a probe fails), and
//! never take longer than [`disk_speed::BANDWIDTH_TIME`] plus [`disk_speed::SYNC_TIME`] on the disk.
//!
//! A data dir that does not exist yet is not created: its nearest existing parent, where `start` would
//! create it, is checked instead.

pub mod certificates;
pub mod data_dir;
pub mod disk_speed;
pub mod system;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::config::BrokerConfig;

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    Pass,
    /// The broker runs, but slower or less safely than it could.
    Warn,
    /// The broker cannot run, or would lose acknowledged data.
    Fail,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Warn => "warn",
            Outcome::Fail => "fail",
        }
    }
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub check: &'static str,
    pub outcome: Outcome,
    pub found: String,
    /// The setting or command that changes a warn or fail; `None` on a pass.
    pub fix: Option<String>,
}

impl Row {
    pub fn pass(check: &'static str, found: impl Into<String>) -> Row {
        Row { check, outcome: Outcome::Pass, found: found.into(), fix: None }
    }

    pub fn warn(check: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Row {
        Row { check, outcome: Outcome::Warn, found: found.into(), fix: Some(fix.into()) }
    }

    pub fn fail(check: &'static str, found: impl Into<String>, fix: impl Into<String>) -> Row {
        Row { check, outcome: Outcome::Fail, found: found.into(), fix: Some(fix.into()) }
    }
}

/// The directory the data-dir checks look at: the data dir, or when it does not exist yet, its nearest
/// existing parent (where `start` would create it). The second value says which.
pub fn existing_dir(data_dir: &Path) -> (PathBuf, bool) {
    let absolute = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.to_path_buf());
    let mut dir = absolute.as_path();
    loop {
        if dir.is_dir() {
            return (dir.to_path_buf(), dir == absolute);
        }
        match dir.parent() {
            Some(parent) => dir = parent,
            None => return (PathBuf::from("/"), false),
        }
    }
}

/// Runs every check against the host and the data dir of `config`.
pub fn run(config: &BrokerConfig) -> Vec<Row> {
    let mut rows = vec![
        system::kernel(),
        system::io_uring(),
        system::locked_memory(config.shards),
        system::open_files(config),
        system::cpus(config.shards),
        system::transparent_huge_pages(),
        system::clock_source(),
    ];
    let (dir, exists) = existing_dir(&config.data_dir);
    rows.push(if exists {
        Row::pass("data dir", format!("{}", dir.display()))
    } else {
        Row::pass(
            "data dir",
            format!("{} does not exist yet: checked {} (start creates it)", config.data_dir.display(), dir.display()),
        )
    });
    let direct = data_dir::direct_io(&dir);
    let direct_ok = direct.outcome == Outcome::Pass;
    rows.push(direct);
    let filesystem = data_dir::filesystem(&dir);
    let in_memory = filesystem.outcome == Outcome::Fail;
    rows.push(filesystem);
    let (space, free) = data_dir::free_space(&dir, config.log_dir_min_free_bytes);
    rows.push(space);
    if !direct_ok {
        rows.push(Row::fail("disk speed", "not measured: the data dir cannot take direct I/O", "see the O_DIRECT row"));
    } else if in_memory {
        rows.push(Row::fail("disk speed", "not measured: the data dir is in memory", "see the filesystem row"));
    } else {
        rows.extend(disk_speed::rows(&dir, free.map(|f| f.saturating_sub(config.log_dir_min_free_bytes))));
    }
    rows.extend(certificates::rows(&config.listeners.all));
    rows.extend(certificates::cluster_row(&config.cluster_tls));
    rows
}

/// The table `shardlog check` prints: a header, one line per row, each warn or fail followed by an
/// indented `fix:` line, then a count of each outcome.
pub fn render(rows: &[Row]) -> String {
    let width = rows.iter().map(|r| r.check.len()).max().unwrap_or(0).max("CHECK".len());
    let mut out = String::new();
    let _ = writeln!(out, "{:<width$}  {:<6}  FOUND", "CHECK", "RESULT");
    for row in rows {
        let _ = writeln!(out, "{:<width$}  {:<6}  {}", row.check, row.outcome.label(), row.found);
        if let Some(fix) = &row.fix {
            let _ = writeln!(out, "{:<width$}  {:<6}  fix: {fix}", "", "");
        }
    }
    let count = |o: Outcome| rows.iter().filter(|r| r.outcome == o).count();
    let _ =
        writeln!(out, "\n{} pass, {} warn, {} fail", count(Outcome::Pass), count(Outcome::Warn), count(Outcome::Fail));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_puts_the_fix_under_a_failing_row_and_counts_outcomes() {
        let rows = vec![Row::pass("kernel", "6.8.0"), Row::fail("O_DIRECT", "refused", "use ext4")];
        let table = render(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "CHECK     RESULT  FOUND");
        assert_eq!(lines[1], "kernel    pass    6.8.0");
        assert_eq!(lines[2], "O_DIRECT  fail    refused");
        assert_eq!(lines[3], "                  fix: use ext4");
        assert_eq!(lines.last(), Some(&"1 pass, 0 warn, 1 fail"));
    }

    #[test]
    fn a_missing_data_dir_is_checked_through_its_nearest_existing_parent() {
        let dir = tempfile::tempdir().unwrap();
        let (checked, exists) = existing_dir(&dir.path().join("a/b"));
        assert_eq!(checked, dir.path());
        assert!(!exists);
        let (checked, exists) = existing_dir(dir.path());
        assert_eq!(checked, dir.path());
        assert!(exists);
    }
}
