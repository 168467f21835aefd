//! Build facts for `--version` ([`shardlog_broker::VERSION`], also shown by `shardlog-bench`): the git
//! commit the binary was built from and the build profile. A build outside a git checkout (a source package)
//! says `commit unknown`.

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).current_dir(env("CARGO_MANIFEST_DIR")).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string()).filter(|s| !s.is_empty())
}

fn env(key: &str) -> String {
    std::env::var(key).unwrap_or_default()
}

fn main() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=SHARDLOG_GIT_COMMIT={commit}");
    println!("cargo:rustc-env=SHARDLOG_BUILD_PROFILE={}", env("PROFILE"));
    // Run again when HEAD moves: a commit, a checkout, a branch update.
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        let dir = Path::new(&dir);
        println!("cargo:rerun-if-changed={}", dir.join("HEAD").display());
        println!("cargo:rerun-if-changed={}", dir.join("packed-refs").display());
        if let Some(head) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo:rerun-if-changed={}", dir.join(head).display());
        }
    }
}
