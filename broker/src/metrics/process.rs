//! The process's own metrics, under the names the Prometheus client libraries give them
//! (`process_cpu_seconds_total`, `process_resident_memory_bytes`, `process_virtual_memory_bytes`,
//! `process_open_fds`, `process_max_fds`, `process_start_time_seconds`), and `shardlog_build_info`, so that
//! the dashboards and alerts written for any Prometheus-instrumented service work on the broker too.
//!
//! They are read from `/proc/self` when the endpoint is scraped and rendered as text after the recorder's
//! output: the recorder's counters count whole numbers, while CPU time is fractional seconds, and a value
//! read at each scrape needs no sampling thread. A file that cannot be read leaves its metrics out (a
//! scrape never fails for them).

use std::fmt::Write as _;

/// What `/proc/self/stat` says of the process (proc(5)), in its own units.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stat {
    /// User and system CPU time, in clock ticks.
    cpu_ticks: u64,
    /// When the process started, in clock ticks after boot.
    start_ticks: u64,
    virtual_bytes: u64,
    resident_pages: u64,
}

/// Parses a `/proc/<pid>/stat` line. The command name (field 2) is in parentheses and may hold spaces
/// and parentheses itself, so the fields are counted from its last `)`.
fn parse_stat(line: &str) -> Option<Stat> {
    let (_, rest) = line.rsplit_once(')')?;
    // rest[0] is field 3 (state): field n is rest[n - 3].
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        cpu_ticks: field(14)? + field(15)?,
        start_ticks: field(22)?,
        virtual_bytes: field(23)?,
        resident_pages: field(24)?,
    })
}

/// The soft limit on open files from a `/proc/<pid>/limits` text (`None` for "unlimited").
fn parse_max_open_files(limits: &str) -> Option<u64> {
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line["Max open files".len()..].split_whitespace().next()?.parse().ok()
}

/// The boot time, seconds since the epoch, from `/proc/stat`'s `btime` line.
fn parse_boot_time(stat: &str) -> Option<u64> {
    stat.lines().find_map(|l| l.strip_prefix("btime "))?.trim().parse().ok()
}

fn sysconf(name: libc::c_int) -> Option<u64> {
    // SAFETY: sysconf(3) takes any name and returns -1 for one it does not know.
    let value = unsafe { libc::sysconf(name) };
    u64::try_from(value).ok().filter(|v| *v > 0)
}

/// One metric in Prometheus' text format.
fn push(out: &mut String, name: &str, kind: &str, help: &str, sample: &str) {
    let _ = write!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{sample}\n");
}

/// A label value as Prometheus' text format writes it.
fn label(value: &str) -> String {
    value.replace('\\', r"\\").replace('"', "\\\"").replace('\n', r"\n")
}

/// The process metrics and the build's, in Prometheus' text format.
pub fn render() -> String {
    let mut out = String::new();
    let ticks = sysconf(libc::_SC_CLK_TCK);
    let page = sysconf(libc::_SC_PAGESIZE);
    if let (Some(stat), Some(ticks), Some(page)) =
        (std::fs::read_to_string("/proc/self/stat").ok().as_deref().and_then(parse_stat), ticks, page)
    {
        let cpu = stat.cpu_ticks as f64 / ticks as f64;
        push(
            &mut out,
            "process_cpu_seconds_total",
            "counter",
            "Total user and system CPU time spent in seconds.",
            &format!(" {cpu}"),
        );
        let resident = stat.resident_pages * page;
        push(
            &mut out,
            "process_resident_memory_bytes",
            "gauge",
            "Resident memory size in bytes.",
            &format!(" {resident}"),
        );
        push(
            &mut out,
            "process_virtual_memory_bytes",
            "gauge",
            "Virtual memory size in bytes.",
            &format!(" {}", stat.virtual_bytes),
        );
        if let Some(boot) = std::fs::read_to_string("/proc/stat").ok().as_deref().and_then(parse_boot_time) {
            let start = boot as f64 + stat.start_ticks as f64 / ticks as f64;
            push(
                &mut out,
                "process_start_time_seconds",
                "gauge",
                "Start time of the process since unix epoch in seconds.",
                &format!(" {start}"),
            );
        }
    }
    if let Ok(fds) = std::fs::read_dir("/proc/self/fd") {
        // The directory being read is one of them, as in the client libraries' count.
        push(&mut out, "process_open_fds", "gauge", "Number of open file descriptors.", &format!(" {}", fds.count()));
    }
    if let Some(max) = std::fs::read_to_string("/proc/self/limits").ok().as_deref().and_then(parse_max_open_files) {
        push(&mut out, "process_max_fds", "gauge", "Maximum number of open file descriptors.", &format!(" {max}"));
    }
    push(
        &mut out,
        "shardlog_build_info",
        "gauge",
        "the version and git commit the broker was built from (value 1)",
        &format!("{{version=\"{}\",commit=\"{}\"}} 1", label(crate::PACKAGE_VERSION), label(crate::GIT_COMMIT)),
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis_of_the_command_name() {
        // A command name with a space and a parenthesis of its own (proc(5): fields 14, 15, 22, 23, 24).
        let line = "4242 (a b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 123456 \
                    987654321 2048 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0";
        let stat = parse_stat(line).unwrap();
        assert_eq!(
            stat,
            Stat { cpu_ticks: 300, start_ticks: 123_456, virtual_bytes: 987_654_321, resident_pages: 2048 }
        );
        assert_eq!(parse_stat("4242 (truncated) S 1 2"), None);
    }

    #[test]
    fn the_soft_open_files_limit_and_the_boot_time_are_read() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units     \n\
                      Max processes             63704                63704                processes \n\
                      Max open files            1024                 524288               files     \n";
        assert_eq!(parse_max_open_files(limits), Some(1024));
        assert_eq!(
            parse_max_open_files("Max open files            unlimited            unlimited            files"),
            None
        );
        assert_eq!(parse_boot_time("cpu  1 2 3\nintr 5\nbtime 1765075200\nprocesses 9\n"), Some(1_765_075_200));
    }

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(label(r#"a"b\c"#), r#"a\"b\\c"#);
    }
}
