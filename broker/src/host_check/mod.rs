//! What the host must offer a broker, checked before it runs. For now, the data dir's filesystem
//! ([`data_dir`]): `shardlog start` refuses a data dir that cannot take direct I/O
//! ([`data_dir::require_direct_io`]) before it binds or starts anything, and warns when it is in memory.
//!
//! It must never leave anything behind in the data dir: every file it makes is removed, also when a
//! probe fails.

pub mod data_dir;

/// A check's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Outcome {
    Pass,
    /// The broker runs, but slower or less safely than it could.
    Warn,
    /// The broker cannot run, or would lose acknowledged data.
    Fail,
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
