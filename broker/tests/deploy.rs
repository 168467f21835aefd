//! `deploy/`: the sample settings file is exactly what `shardlog config sample` prints (so it never drifts
//! from the settings table) and, uncommented, gives every default; systemd accepts the units
//! (`systemd-analyze verify`, and `security --offline` below an exposure of 3.0: systemd is not PID 1 on
//! these machines, so the units cannot be started here).

use std::path::{Path, PathBuf};
use std::process::Command;

fn deploy() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn shardlog(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_shardlog")).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_sample_settings_file_is_the_settings_table_at_its_defaults() {
    let file = std::fs::read_to_string(deploy().join("shardlog.toml")).unwrap();
    assert_eq!(file, shardlog(&["config", "sample"]), "regenerate: shardlog config sample > deploy/shardlog.toml");
    // Uncommented, every line that gives a value gives the default.
    let uncommented: String = file
        .lines()
        .filter_map(|l| l.strip_prefix("# ").filter(|l| l.contains(" = ")))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(uncommented.lines().count() > 40, "{uncommented}");
    let set = shardlog_broker::config::BrokerConfig::from_toml(&uncommented).unwrap();
    let defaults = shardlog_broker::config::BrokerConfig::from_toml("").unwrap();
    let values = |c: &shardlog_broker::config::BrokerConfig| -> Vec<(&str, Option<String>)> {
        c.effective.iter().map(|s| (s.key, s.value.clone())).collect()
    };
    assert_eq!(values(&set), values(&defaults));
    assert!(set.effective.iter().filter(|s| s.explicit).count() == uncommented.lines().count());
}

#[test]
fn systemd_accepts_the_units() {
    let analyze = Command::new("systemd-analyze").arg("--version").output();
    assert!(analyze.is_ok_and(|o| o.status.success()), "systemd-analyze is needed (.ci/run installs systemd)");
    let dir = tempfile::tempdir().unwrap();
    // The installed binary's path is /usr/bin/shardlog; verify wants an executable there.
    for (unit, name) in [("shardlog.service", "shardlog.service"), ("shardlog@.service", "shardlog@east.service")] {
        let text = std::fs::read_to_string(deploy().join(unit)).unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text.replace("/usr/bin/shardlog", env!("CARGO_BIN_EXE_shardlog"))).unwrap();
        let verify = Command::new("systemd-analyze").arg("verify").arg(&path).output().unwrap();
        let said = String::from_utf8_lossy(&verify.stderr);
        assert!(verify.status.success() && said.trim().is_empty(), "{name}: {said}");
        let security = Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--threshold=30"])
            .arg(&path)
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&security.stdout);
        assert!(security.status.success(), "{name}: exposure above 3.0:\n{report}");
    }
}
