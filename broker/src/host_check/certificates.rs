//! The TLS listeners' certificate files: each certificate in a keystore or truststore that expires within
//! [`WARN_DAYS`] is a warning (one row per listener), so that an operator replaces it in time — the broker
//! reads replaced files without a restart. The cluster mTLS files (`cluster.ssl.*`) get a row of their
//! own; they too are read again when replaced. A file that cannot be read is a failure: `start` would refuse it.

use std::fmt::Write as _;
use std::path::Path;

use super::Row;
use crate::config::ClusterTlsSettings;
use crate::config::listeners::Listener;
use crate::security::tls;

/// Certificates expiring within this many days are reported.
pub const WARN_DAYS: i64 = 30;

const CHECK: &str = "certificates";

/// One row per TLS listener; none when no listener speaks TLS.
pub fn rows(listeners: &[Listener]) -> Vec<Row> {
    listeners
        .iter()
        .filter_map(|l| Some((l, l.tls.as_ref()?)))
        .map(|(l, settings)| {
            let files = std::iter::once(settings.keystore.as_path()).chain(settings.truststore.as_deref());
            listener_row(&l.name, files)
        })
        .collect()
}

/// The row of the cluster mTLS files; none when they are not set.
pub fn cluster_row(settings: &ClusterTlsSettings) -> Option<Row> {
    let files: Vec<&Path> = settings.keystore.iter().chain(&settings.truststore).map(|p| p.as_path()).collect();
    if files.is_empty() {
        return None;
    }
    let advice = "replace the node certificate (same file): the node reads it again without a restart";
    Some(files_row("cluster mTLS", files.into_iter(), advice))
}

fn listener_row<'a>(name: &str, files: impl Iterator<Item = &'a Path>) -> Row {
    let advice = "replace the certificate (same file): the broker reads it again within a second, or on SIGHUP";
    files_row(&format!("listener {name}"), files, advice)
}

/// One row for the files of `what` (`listener SSL`, `cluster mTLS`); `advice` for a certificate that
/// expires soon.
fn files_row<'a>(what: &str, files: impl Iterator<Item = &'a Path>, advice: &'static str) -> Row {
    let mut soon = String::new();
    let mut checked = Vec::new();
    for file in files {
        match tls::expiring(file, WARN_DAYS) {
            Ok(expiring) => {
                for (subject, days) in expiring {
                    let when = match days {
                        d if d < 0 => format!("expired {} day(s) ago", -d),
                        d => format!("expires in {d} day(s)"),
                    };
                    let _ = write!(
                        soon,
                        "{}{}: {subject:?} {when}",
                        if soon.is_empty() { "" } else { "; " },
                        file.display()
                    );
                }
                checked.push(file.display().to_string());
            }
            Err(e) => {
                return Row::fail(CHECK, format!("{what}: {e}"), "fix the file: start refuses it");
            }
        }
    }
    if soon.is_empty() {
        Row::pass(CHECK, format!("{what}: {} valid for {WARN_DAYS} days or more", checked.join(", ")))
    } else {
        Row::warn(CHECK, format!("{what}: {soon}"), advice)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use rcgen::{CertificateParams, DistinguishedName, DnType, KeyPair};

    use super::*;
    use crate::host_check::Outcome;

    /// A self-signed certificate for `cn` valid until `days` from now, as a PEM file.
    fn certificate(dir: &Path, cn: &str, days: i64) -> std::path::PathBuf {
        let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
        let until = (now + days * 86_400 + 3_600) as u64;
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(until);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        let path = dir.join(format!("{cn}.pem"));
        std::fs::write(&path, format!("{}{}", key.serialize_pem(), cert.pem())).unwrap();
        path
    }

    #[test]
    fn a_certificate_expiring_within_thirty_days_is_a_warning_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let lasting = certificate(dir.path(), "lasting", 400);
        let row = listener_row("SSL", [lasting.as_path()].into_iter());
        assert_eq!(row.outcome, Outcome::Pass, "{row:?}");
        let soon = certificate(dir.path(), "soon", 10);
        let row = listener_row("SSL", [lasting.as_path(), soon.as_path()].into_iter());
        assert_eq!(row.outcome, Outcome::Warn, "{row:?}");
        assert!(row.found.contains("CN=soon") && row.found.contains("expires in 10 day(s)"), "{row:?}");
        assert!(!row.found.contains("CN=lasting"), "{row:?}");
    }

    #[test]
    fn an_expired_certificate_is_reported_as_expired_and_an_unreadable_file_fails() {
        let dir = tempfile::tempdir().unwrap();
        let expired = certificate(dir.path(), "old", -3);
        let row = listener_row("SSL", [expired.as_path()].into_iter());
        assert_eq!(row.outcome, Outcome::Warn, "{row:?}");
        assert!(row.found.contains("expired 3 day(s) ago"), "{row:?}");
        let missing = dir.path().join("missing.pem");
        assert_eq!(listener_row("SSL", [missing.as_path()].into_iter()).outcome, Outcome::Fail);
    }

    #[test]
    fn an_expiring_node_certificate_is_a_warning_that_says_a_restart_takes_the_new_one() {
        let dir = tempfile::tempdir().unwrap();
        assert!(cluster_row(&ClusterTlsSettings::default()).is_none(), "no row without cluster mTLS");
        let (node, ca) = (certificate(dir.path(), "node-1", 5), certificate(dir.path(), "ca", 400));
        let row = cluster_row(&ClusterTlsSettings { keystore: Some(node), truststore: Some(ca) }).unwrap();
        assert_eq!(row.outcome, Outcome::Warn, "{row:?}");
        assert!(row.found.starts_with("cluster mTLS: ") && row.found.contains("CN=node-1"), "{row:?}");
        assert!(!row.found.contains("CN=ca"), "{row:?}");
    }
}
