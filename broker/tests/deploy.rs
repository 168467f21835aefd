//! `deploy/`: the sample settings file is exactly what `shardlog config sample` prints (so it never drifts
//! from the settings table) and, uncommented, gives every default; systemd accepts the units
//! (`systemd-analyze verify`, and `security --offline` below an exposure of 3.0: systemd is not PID 1 on
//! these machines, so the units cannot be started here).

use std::path::{Path, PathBuf};
use std::process::Command;

use shardlog_broker::config::settings::{self, EXAMPLE_MARK, SETTINGS};

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
    // Uncommented, every line that gives a value gives the default (but those marked as an example,
    // where the default is worked out at start).
    let uncommented: String = file
        .lines()
        .filter_map(|l| l.strip_prefix("# ").filter(|l| l.contains(" = ") && !l.contains(EXAMPLE_MARK)))
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
fn every_commented_setting_of_the_sample_is_valid_toml_once_uncommented() {
    let file = std::fs::read_to_string(deploy().join("shardlog.toml")).unwrap();
    // A setting's line starts with its quoted key; the lines above it say what it means.
    let lines: Vec<&str> = file.lines().filter_map(|l| l.strip_prefix("# ")).filter(|l| l.starts_with('"')).collect();
    let settings = SETTINGS.iter().filter(|s| !s.key.starts_with("test.")).count();
    assert_eq!(lines.len(), settings, "one line per setting:\n{}", lines.join("\n"));
    for line in &lines {
        let table: toml::Table = toml::from_str(line).unwrap_or_else(|e| panic!("not TOML uncommented: {line}\n{e}"));
        let key = table.keys().next().unwrap();
        assert!(table.len() == 1 && settings::setting(key).is_some(), "one known setting: {line}");
        // Each one alone is a settings file the broker takes.
        shardlog_broker::config::BrokerConfig::from_toml(line).unwrap_or_else(|e| panic!("{line}: {e:#}"));
    }
    // And all of them together: the examples given for defaults worked out at start are valid values.
    let all: String = lines.iter().map(|l| format!("{l}\n")).collect();
    shardlog_broker::config::BrokerConfig::from_toml(&all).unwrap();
}

#[test]
fn the_units_point_at_the_projects_docs_which_the_package_installs() {
    let manifest = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml")).unwrap();
    for unit in ["shardlog.service", "shardlog@.service"] {
        let text = std::fs::read_to_string(deploy().join(unit)).unwrap();
        let docs: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("Documentation=")).collect();
        assert!(!docs.is_empty(), "{unit} has no Documentation=");
        for uri in docs.iter().flat_map(|d| d.split_whitespace()) {
            // A file the package installs: its asset line names the installed path.
            let path = uri.strip_prefix("file:/").unwrap_or_else(|| panic!("{unit}: {uri} is not the package's docs"));
            assert!(manifest.contains(&format!("\"{path}\"")), "{unit}: {uri} is not installed by the package");
        }
    }
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
