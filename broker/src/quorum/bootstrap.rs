//! The first SCRAM users of a cluster, added when its quorum forms (`shardlog start --add-scram`, as
//! Kafka's `kafka-storage format --add-scram`), so a secured cluster has an administrator without an
//! unauthenticated window.
//!
//! When they are added: by a voter whose Raft log was empty when it started (the start that forms the
//! cluster), once the quorum has a leader. So that a crash between forming and committing does not lose
//! them, the voter writes a marker file (`scram-bootstrap-pending`, without any secret in it) into its
//! quorum directory before it forms the cluster and removes it once the credentials are committed; a
//! later start with the marker present tries again. Any other start ignores the flag: a user deleted
//! since is never brought back by a restart with the same command line. Credentials that already exist
//! when the bootstrap is proposed are left as they are.
//!
//! The password is salted while the flag is parsed (PBKDF2 with a random salt, as Kafka's tool does);
//! only the salted keys go further, and no error message repeats the flag's value.

use std::path::Path;
use std::time::Duration;

use super::network::{self, Served};
use super::security::{self, ScramUpsertion};
use super::state::Command;
use super::wire::WireWriteResult;

/// The marker of a formation whose credentials are not committed yet.
const PENDING_FILE: &str = "scram-bootstrap-pending";
/// Kafka's default iteration count for `--add-scram`.
pub const DEFAULT_ITERATIONS: u32 = 4096;

/// Why an `--add-scram` value was refused. Never carries the value itself.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddScramError {
    #[error("--add-scram takes MECHANISM=[name=NAME,password=PASSWORD(,iterations=N)]: {0}")]
    Syntax(&'static str),
    #[error("--add-scram: unknown mechanism (SCRAM-SHA-256 or SCRAM-SHA-512)")]
    Mechanism,
    #[error("--add-scram: iterations must be a number in [4096, 16384]")]
    Iterations,
    #[error("--add-scram: a user appears twice for one mechanism")]
    Duplicate,
    #[error("--add-scram: no random salt could be had from the system")]
    Random,
}

/// Parses one `--add-scram` value, Kafka's `MECHANISM=[name=NAME,password=PASSWORD,iterations=N]`
/// (`iterations` optional; a value may be in double quotes), into the credential to store.
pub fn parse_add_scram(value: &str) -> Result<ScramUpsertion, AddScramError> {
    let (mechanism, rest) = value.split_once('=').ok_or(AddScramError::Syntax("no MECHANISM="))?;
    let mechanism = security::scram_mechanism_code(mechanism.trim()).ok_or(AddScramError::Mechanism)?;
    let body = rest
        .trim()
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .ok_or(AddScramError::Syntax("the fields go in [ ]"))?;
    let (mut name, mut password, mut iterations) = (None, None, None);
    for field in body.split(',') {
        let (key, value) = field.split_once('=').ok_or(AddScramError::Syntax("a field without ="))?;
        let value = value.trim();
        let value = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')).unwrap_or(value);
        let slot = match key.trim() {
            "name" => &mut name,
            "password" => &mut password,
            "iterations" => &mut iterations,
            _ => return Err(AddScramError::Syntax("fields are name, password and iterations")),
        };
        if slot.replace(value).is_some() {
            return Err(AddScramError::Syntax("a field appears twice"));
        }
    }
    let name = name.filter(|n| !n.is_empty()).ok_or(AddScramError::Syntax("no name"))?;
    let password = password.filter(|p| !p.is_empty()).ok_or(AddScramError::Syntax("no password"))?;
    let iterations = match iterations {
        None => DEFAULT_ITERATIONS,
        Some(n) => n.parse().map_err(|_| AddScramError::Iterations)?,
    };
    if !(security::SCRAM_MIN_ITERATIONS..=security::SCRAM_MAX_ITERATIONS).contains(&iterations) {
        return Err(AddScramError::Iterations);
    }
    let salt = security::random_salt(mechanism).ok_or(AddScramError::Random)?;
    let salted =
        security::salt_password(mechanism, password.as_bytes(), &salt, iterations).ok_or(AddScramError::Mechanism)?;
    let credential = security::credential_from_salted_password(mechanism, &salt, iterations, &salted)
        .ok_or(AddScramError::Mechanism)?;
    Ok(ScramUpsertion { user: name.to_string(), mechanism, credential })
}

/// Parses every `--add-scram` value; one user twice for one mechanism is refused.
pub fn parse_all(values: &[String]) -> Result<Vec<ScramUpsertion>, AddScramError> {
    let upsertions: Vec<ScramUpsertion> = values.iter().map(|v| parse_add_scram(v)).collect::<Result<_, _>>()?;
    let mut seen = std::collections::BTreeSet::new();
    if upsertions.iter().any(|u| !seen.insert((u.user.clone(), u.mechanism))) {
        return Err(AddScramError::Duplicate);
    }
    Ok(upsertions)
}

/// Marks, before a pristine voter forms the cluster, that its bootstrap credentials are to be added.
pub fn mark_pending(dir: &Path) {
    super::log_store::replace_file(&dir.join(PENDING_FILE), b"");
}

/// Whether a formation's credentials are still to be committed (the voter stopped before they were).
pub fn pending(dir: &Path) -> bool {
    dir.join(PENDING_FILE).exists()
}

/// Proposes the credentials until they are committed (or refused), then removes the marker. Users that
/// have a credential for the mechanism already are left out. Runs on the voter's runtime; the voter
/// aborts it when it stops.
pub async fn add_credentials(served: Served, upsertions: Vec<ScramUpsertion>) {
    const RETRY: Duration = Duration::from_millis(200);
    loop {
        let (state, _) = served.state.state();
        let missing: Vec<ScramUpsertion> = upsertions
            .iter()
            .filter(|u| state.security.scram_credential(&u.user, u.mechanism).is_none())
            .cloned()
            .collect();
        let Some(mechanism) = missing.first().map(|u| u.mechanism) else { break };
        // One mechanism per command: a command names each user once (as AlterUserScramCredentials
        // does), and `--add-scram` may give one user a credential for each mechanism.
        let missing: Vec<ScramUpsertion> = missing.into_iter().filter(|u| u.mechanism == mechanism).collect();
        let users: Vec<&str> = missing.iter().map(|u| u.user.as_str()).collect();
        let users = users.join(",");
        let command = Command::AlterScramCredentials { upsertions: missing, deletions: Vec::new() };
        match network::write(&served, command, false).await {
            WireWriteResult::Applied { outcome: Ok(_), .. } => {
                tracing::info!(%users, "quorum: SCRAM credentials from --add-scram added at cluster formation");
            }
            WireWriteResult::Applied { outcome: Err(e), .. } => {
                tracing::error!(%users, error = %e, "quorum: the --add-scram credentials were refused");
                break;
            }
            WireWriteResult::NoLeader | WireWriteResult::Failed(_) => tokio::time::sleep(RETRY).await,
        }
    }
    let _ = std::fs::remove_file(served.dir.join(PENDING_FILE));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafkas_add_scram_syntax_gives_a_salted_credential_and_errors_never_repeat_the_value() {
        let u = parse_add_scram("SCRAM-SHA-256=[name=admin,password=admin-secret]").unwrap();
        assert_eq!((u.user.as_str(), u.mechanism, u.credential.iterations), ("admin", 1, 4096));
        // The stored keys are those of the password with the credential's salt.
        let salted = security::salt_password(1, b"admin-secret", &u.credential.salt, 4096).unwrap();
        assert_eq!(security::credential_from_salted_password(1, &u.credential.salt, 4096, &salted), Some(u.credential));

        let u = parse_add_scram("SCRAM-SHA-512=[name=\"ops\",password=\"p,w\",iterations=8192]");
        // A comma inside quotes is not supported (Kafka's tool splits on it too): refused, not misread.
        assert!(u.is_err());
        let u = parse_add_scram("SCRAM-SHA-512=[name=ops,password=\"pw\",iterations=8192]").unwrap();
        assert_eq!((u.user.as_str(), u.mechanism, u.credential.iterations), ("ops", 2, 8192));

        for bad in [
            "SCRAM-SHA-1=[name=a,password=hunter2]",
            "SCRAM-SHA-256=name=a,password=hunter2",
            "SCRAM-SHA-256=[name=a]",
            "SCRAM-SHA-256=[password=hunter2]",
            "SCRAM-SHA-256=[name=a,password=hunter2,iterations=100]",
            "SCRAM-SHA-256=[name=a,password=hunter2,iterations=x]",
            "SCRAM-SHA-256=[name=a,password=hunter2,salt=abc]",
            "SCRAM-SHA-256=[name=a,password=hunter2,password=hunter2]",
        ] {
            let error = parse_add_scram(bad).unwrap_err().to_string();
            assert!(!error.contains("hunter2"), "{error}");
        }
        let twice = ["SCRAM-SHA-256=[name=a,password=x]".to_string(), "SCRAM-SHA-256=[name=a,password=y]".to_string()];
        assert_eq!(parse_all(&twice), Err(AddScramError::Duplicate));
    }
}
