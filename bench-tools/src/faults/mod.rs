//! Fault campaigns: a cluster under a producer and consumer workload while a seeded nemesis kills,
//! pauses, partitions and starves its brokers, then a check that every acknowledged record survived.
//! [`plan`] draws the nemesis's schedule from a seed; [`tear`] damages a killed broker's active segment;
//! [`replica`] reads each replica's copy from a stopped broker's data directory; [`check`] judges a
//! recorded history against the cluster's final logs. [`net`] puts each broker in its own network
//! namespace and partitions, drops and slows its traffic; [`disk`] gives each broker a filesystem that can
//! fill up.

pub mod check;
pub mod disk;
pub mod net;
pub mod plan;
pub mod replica;
pub mod tear;
pub mod txn_check;

/// Runs a command to its end; its stderr is the error when it fails.
fn run(command: &mut std::process::Command) -> anyhow::Result<()> {
    let output = command.stdin(std::process::Stdio::null()).output()?;
    if !output.status.success() {
        anyhow::bail!("{command:?}: {}", String::from_utf8_lossy(&output.stderr).trim());
    }
    Ok(())
}
