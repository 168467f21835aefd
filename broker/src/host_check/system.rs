//! The host beyond the data dir: the kernel and io_uring, the resource limits the broker needs (locked
//! memory, open files), the CPUs, and two kernel settings that cost tail latency (transparent huge
//! pages, the clock source).

use std::os::fd::{FromRawFd, OwnedFd};

use super::Row;
use crate::config::BrokerConfig;

/// Descriptors kept for everything but segment files and client connections (the quorum's files and
/// connections, checkpoints, index files, the log).
pub const RESERVED_FILES: usize = 1024;

/// The oldest kernel glommio supports.
const KERNEL_MIN: (u32, u32) = (5, 8);

/// Bytes of I/O memory each glommio executor registers with each of its three rings (glommio's
/// default `io_memory`); registered pages count against RLIMIT_MEMLOCK without CAP_IPC_LOCK.
const REGISTERED_BYTES_PER_SHARD: u64 = 3 * (10 << 20);

const MIB: u64 = 1 << 20;

fn read_trimmed(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// `major.minor` of a kernel release such as `6.8.0-45-generic`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The kernel row: glommio needs 5.8 or newer.
pub fn kernel() -> Row {
    let Some(release) = read_trimmed("/proc/sys/kernel/osrelease") else {
        return Row::warn("kernel", "cannot read /proc/sys/kernel/osrelease", "mount /proc");
    };
    match kernel_version(&release) {
        Some(version) if version >= KERNEL_MIN => Row::pass("kernel", format!("Linux {release}")),
        Some(_) => Row::fail(
            "kernel",
            format!("Linux {release}; glommio needs {}.{} or newer", KERNEL_MIN.0, KERNEL_MIN.1),
            format!("a kernel {}.{} or newer", KERNEL_MIN.0, KERNEL_MIN.1),
        ),
        None => Row::warn("kernel", format!("Linux {release} (version not understood)"), "a kernel 5.8 or newer"),
    }
}

/// Sets up a tiny io_uring and closes it: the errno when the kernel refuses.
fn io_uring_setup() -> Result<(), std::io::Error> {
    // struct io_uring_params is 120 bytes; all zeros asks for the defaults.
    let mut params = [0u32; 30];
    // SAFETY: io_uring_setup(2) with a pointer to a live, zeroed io_uring_params-sized buffer, which the
    // kernel reads and fills in.
    let fd = unsafe { libc::syscall(libc::SYS_io_uring_setup, 4u32, params.as_mut_ptr()) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the syscall returned a new descriptor that nothing else owns; it is closed when dropped.
    drop(unsafe { OwnedFd::from_raw_fd(fd as i32) });
    Ok(())
}

/// The io_uring row: a ring must be set up (as the broker's user); `kernel.io_uring_disabled=1` lets
/// only root and `kernel.io_uring_group` do so.
pub fn io_uring() -> Row {
    let disabled = read_trimmed("/proc/sys/kernel/io_uring_disabled");
    let setting = disabled.as_deref().map_or(String::new(), |v| format!("; kernel.io_uring_disabled = {v}"));
    match io_uring_setup() {
        Err(e) => {
            let fix = match e.raw_os_error() {
                Some(libc::ENOSYS) => "a kernel built with CONFIG_IO_URING; in a container, allow io_uring_setup, \
                                       io_uring_enter and io_uring_register in its seccomp profile"
                    .to_string(),
                Some(libc::ENOMEM) => "LimitMEMLOCK=infinity in the unit, or `ulimit -l unlimited`".to_string(),
                _ => "sysctl -w kernel.io_uring_disabled=0 (and in a container, allow the io_uring system calls \
                      in its seccomp profile)"
                    .to_string(),
            };
            Row::fail("io_uring", format!("io_uring_setup failed: {e}{setting}"), fix)
        }
        Ok(()) if disabled.as_deref() == Some("1") => Row::warn(
            "io_uring",
            format!("a ring was set up here, but only root and kernel.io_uring_group may{setting}"),
            "sysctl -w kernel.io_uring_disabled=0, or put the broker's user in the group kernel.io_uring_group names",
        ),
        Ok(()) => Row::pass("io_uring", format!("a ring was set up{setting}")),
    }
}

/// Whether this process holds CAP_IPC_LOCK (its locked memory is then not limited).
fn has_ipc_lock() -> bool {
    const CAP_IPC_LOCK: u32 = 14;
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else { return false };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << CAP_IPC_LOCK) != 0)
}

/// (soft, hard) of a resource limit as `get` reads it; `None` for unlimited.
fn rlimit(get: impl FnOnce(&mut libc::rlimit) -> libc::c_int) -> (Option<u64>, Option<u64>) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    if get(&mut limit) != 0 {
        return (None, None);
    }
    let finite = |v: libc::rlim_t| (v != libc::RLIM_INFINITY).then_some(v);
    (finite(limit.rlim_cur), finite(limit.rlim_max))
}

/// What to change when the locked memory is too small.
pub const LOCKED_MEMORY_FIX: &str =
    "LimitMEMLOCK=infinity in the unit (deploy/shardlog.service has it), or `ulimit -l unlimited`";

/// The soft RLIMIT_MEMLOCK, `None` for unlimited, and as `shardlog check` shows it.
fn locked_memory_limit() -> (Option<u64>, String) {
    // SAFETY: getrlimit(2) with a valid resource and a pointer to a live rlimit.
    let (soft, _) = rlimit(|l| unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, l) });
    (soft, soft.map_or("unlimited".to_string(), |b| format!("{} KiB", b / 1024)))
}

/// The locked-memory row: each shard's executor registers its I/O memory with its rings; without room
/// for it glommio falls back to unregistered buffers (slower), or cannot set rings up at all.
pub fn locked_memory(shards: usize) -> Row {
    let wanted = shards as u64 * REGISTERED_BYTES_PER_SHARD;
    let (soft, shown) = locked_memory_limit();
    if has_ipc_lock() {
        return Row::pass("locked memory", format!("{shown}; this user holds CAP_IPC_LOCK, so it is not limited"));
    }
    match soft {
        Some(bytes) if bytes < wanted => Row::warn(
            "locked memory",
            format!("{shown}; {shards} shard(s) register {} MiB of I/O memory with io_uring", wanted / MIB),
            LOCKED_MEMORY_FIX,
        ),
        _ => Row::pass("locked memory", shown),
    }
}

/// The locked-memory row for a broker whose executors could not register their I/O memory (glommio
/// then uses unregistered buffers): what `shardlog check` would say, for the start's log.
pub fn buffers_not_registered() -> Row {
    let (_, shown) = locked_memory_limit();
    Row::warn(
        "locked memory",
        format!(
            "{shown}; each shard registers {} MiB of I/O memory with io_uring, so its buffers were not \
             registered and its I/O is slower",
            REGISTERED_BYTES_PER_SHARD / MIB
        ),
        LOCKED_MEMORY_FIX,
    )
}

/// Descriptors the broker may use with `config`: every shard's segment files, every client connection
/// and the reserve.
pub fn open_files_wanted(config: &BrokerConfig) -> usize {
    config.shards * config.shard_limits.open_files_max + config.clients.max_connections + RESERVED_FILES
}

/// The open-files row. The broker raises its soft limit to the hard one, so the hard limit is what
/// counts; below what the settings need, `max.connections` is lowered to fit.
pub fn open_files(config: &BrokerConfig) -> Row {
    let wanted = open_files_wanted(config);
    // SAFETY: getrlimit(2) with a valid resource and a pointer to a live rlimit.
    let (soft, hard) = rlimit(|l| unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, l) });
    let show = |v: Option<u64>| v.map_or("unlimited".to_string(), |v| v.to_string());
    let found = format!(
        "soft {}, hard {} (start raises soft to hard); the settings need {wanted} \
         ({} shards x shard.open.files.max {} + max.connections {} + {RESERVED_FILES})",
        show(soft),
        show(hard),
        config.shards,
        config.shard_limits.open_files_max,
        config.clients.max_connections,
    );
    match hard {
        Some(hard) if (hard as usize) < wanted => Row::warn(
            "open files",
            found,
            format!(
                "LimitNOFILE=1048576 in the unit (deploy/shardlog.service has it), or `ulimit -n {wanted}`; \
                 or lower max.connections or shard.open.files.max"
            ),
        ),
        _ => Row::pass("open files", found),
    }
}

/// The CPU row: shards default to one per CPU, each pinned to its own.
pub fn cpus(shards: usize) -> Row {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if shards > cpus {
        return Row::warn(
            "CPUs",
            format!("{cpus} available; shards = {shards}, more than CPUs, so shards are not pinned"),
            format!("shards = {cpus} (the default), or leave shards unset"),
        );
    }
    Row::pass("CPUs", format!("{cpus} available; {shards} shard(s), one pinned per CPU (shards defaults to the CPUs)"))
}

/// The transparent-huge-pages row: `always` makes the kernel compact memory on a shard's page fault.
pub fn transparent_huge_pages() -> Row {
    let Some(text) = read_trimmed("/sys/kernel/mm/transparent_hugepage/enabled") else {
        return Row::pass("huge pages", "transparent huge pages are not available");
    };
    let mode = text.split_whitespace().find_map(|w| w.strip_prefix('[')?.strip_suffix(']')).unwrap_or(&text);
    if mode == "always" {
        return Row::warn(
            "huge pages",
            "transparent_hugepage = always: page faults may stall on memory compaction (tail latency)",
            "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled (or transparent_hugepage=madvise on the \
             kernel command line; never also does)",
        );
    }
    Row::pass("huge pages", format!("transparent_hugepage = {mode}"))
}

/// The clock-source row: reading the time is on every request's path; hpet and acpi_pm make it a slow
/// system call.
pub fn clock_source() -> Row {
    let Some(source) = read_trimmed("/sys/devices/system/clocksource/clocksource0/current_clocksource") else {
        return Row::pass("clock source", "not reported");
    };
    match source.as_str() {
        "tsc" | "kvm-clock" | "arch_sys_counter" => Row::pass("clock source", source),
        _ => Row::warn(
            "clock source",
            format!("{source}: reading the time is a slow system call"),
            "tsc (or kvm-clock on KVM guests): echo tsc > \
             /sys/devices/system/clocksource/clocksource0/current_clocksource, if available_clocksource lists it",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_versions_are_read_from_release_strings() {
        assert_eq!(kernel_version("6.8.0-45-generic"), Some((6, 8)));
        assert_eq!(kernel_version("5.10.226"), Some((5, 10)));
        assert_eq!(kernel_version("4.19.0+"), Some((4, 19)));
        assert_eq!(kernel_version("weird"), None);
    }

    #[test]
    fn the_open_files_wanted_add_segments_connections_and_the_reserve() {
        let config = BrokerConfig::from_toml("shards = 2\n\"max.connections\" = 100\n").unwrap();
        assert_eq!(open_files_wanted(&config), 2 * config.shard_limits.open_files_max + 100 + RESERVED_FILES);
    }
}
