//! A short measurement of the data disk, as the broker uses it: sequential O_DIRECT write bandwidth
//! (1 MiB writes, one at a time, then one fdatasync) and the latency of a durable 4 KiB append (an
//! O_DIRECT write then fdatasync, repeated: what acks=all waits for at the least).
//!
//! Bounded in time ([`BANDWIDTH_TIME`], [`SYNC_TIME`]) and in space (at most [`BANDWIDTH_BYTES_MAX`], and
//! at most half the room above `log.dir.min.free.bytes`); the files are removed afterwards, also when a
//! write fails.

use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use super::Row;
use super::data_dir::{AlignedBuf, ProbeFile};

/// How long the bandwidth measurement writes.
pub const BANDWIDTH_TIME: Duration = Duration::from_millis(2500);
/// The most it writes.
pub const BANDWIDTH_BYTES_MAX: u64 = 1 << 30;
/// How long the latency measurement runs.
pub const SYNC_TIME: Duration = Duration::from_millis(2500);
/// The most durable appends it times.
pub const SYNC_COUNT_MAX: usize = 2000;

/// Below this bandwidth the disk is a bottleneck long before the network is.
const BANDWIDTH_LOW_BYTES_PER_SEC: f64 = 100e6;
/// Above this p99, acks=all produce latency is dominated by the disk.
const SYNC_P99_HIGH: Duration = Duration::from_millis(10);
/// Less room than this and bandwidth is not measured.
const BANDWIDTH_BYTES_MIN: u64 = 16 << 20;
const CHUNK: usize = 1 << 20;
const BLOCK: usize = 4096;

/// What the bandwidth measurement found.
#[derive(Debug, Clone, Copy)]
pub struct Bandwidth {
    pub bytes: u64,
    pub elapsed: Duration,
}

impl Bandwidth {
    pub fn bytes_per_sec(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Writes 1 MiB blocks with O_DIRECT into a new file in `dir` until `time` has passed or `max_bytes`
/// are written, then fdatasyncs; the elapsed time includes the fdatasync.
pub fn sequential_bandwidth(dir: &Path, max_bytes: u64, time: Duration) -> io::Result<Bandwidth> {
    let probe = ProbeFile::create(dir)?;
    let mut chunk = AlignedBuf::zeroed(CHUNK);
    chunk.as_mut_slice().fill(0x5a);
    let start = Instant::now();
    let mut bytes = 0u64;
    while bytes + CHUNK as u64 <= max_bytes && start.elapsed() < time {
        probe.file.write_all_at(chunk.as_slice(), bytes)?;
        bytes += CHUNK as u64;
    }
    probe.file.sync_data()?;
    Ok(Bandwidth { bytes, elapsed: start.elapsed() })
}

/// Latencies of a 4 KiB O_DIRECT write followed by fdatasync, each at the next position of a new file
/// in `dir`, until `time` has passed or `max_count` are timed; sorted, shortest first.
pub fn durable_append_latencies(dir: &Path, max_count: usize, time: Duration) -> io::Result<Vec<Duration>> {
    let probe = ProbeFile::create(dir)?;
    let mut block = AlignedBuf::zeroed(BLOCK);
    let start = Instant::now();
    let mut latencies = Vec::with_capacity(max_count);
    while latencies.len() < max_count && start.elapsed() < time {
        block.as_mut_slice().fill(latencies.len() as u8);
        let t = Instant::now();
        probe.file.write_all_at(block.as_slice(), (latencies.len() * BLOCK) as u64)?;
        probe.file.sync_data()?;
        latencies.push(t.elapsed());
    }
    latencies.sort_unstable();
    Ok(latencies)
}

/// The `q` quantile (0 < q <= 1) of sorted, non-empty `values`.
fn quantile(values: &[Duration], q: f64) -> Duration {
    assert!(!values.is_empty(), "a quantile of nothing");
    let rank = ((q * values.len() as f64).ceil() as usize).clamp(1, values.len());
    values[rank - 1]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// The disk rows: write bandwidth and durable-append latency. `room` is the free space above
/// `log.dir.min.free.bytes` (`None`: unknown).
pub fn rows(dir: &Path, room: Option<u64>) -> Vec<Row> {
    const FIX_DISK: &str = "put log.dirs on a faster disk (a local SSD; with power-loss protection, \
                            fdatasync is fast)";
    let mut rows = Vec::with_capacity(2);
    let max_bytes = room.map_or(BANDWIDTH_BYTES_MAX, |r| (r / 2).min(BANDWIDTH_BYTES_MAX));
    rows.push(if max_bytes < BANDWIDTH_BYTES_MIN {
        Row::warn("write bandwidth", "not measured: too little free space", "free space on the data dir's disk")
    } else {
        match sequential_bandwidth(dir, max_bytes, BANDWIDTH_TIME) {
            Err(e) => Row::fail("write bandwidth", format!("O_DIRECT write failed: {e}"), "check the disk"),
            Ok(b) => {
                let found = format!(
                    "{:.0} MB/s sequential O_DIRECT, 1 MiB writes ({} MiB in {:.1} s with the fdatasync)",
                    b.bytes_per_sec() / 1e6,
                    b.bytes >> 20,
                    b.elapsed.as_secs_f64()
                );
                if b.bytes_per_sec() < BANDWIDTH_LOW_BYTES_PER_SEC {
                    Row::warn("write bandwidth", format!("{found}; below 100 MB/s"), FIX_DISK)
                } else {
                    Row::pass("write bandwidth", found)
                }
            }
        }
    });
    rows.push(match durable_append_latencies(dir, SYNC_COUNT_MAX, SYNC_TIME) {
        Err(e) => Row::fail("fdatasync", format!("4 KiB O_DIRECT write + fdatasync failed: {e}"), "check the disk"),
        Ok(latencies) if latencies.is_empty() => {
            Row::warn("fdatasync", "not measured: no write finished in time", "check the disk")
        }
        Ok(latencies) => {
            let (p50, p99) = (quantile(&latencies, 0.5), quantile(&latencies, 0.99));
            let found = format!(
                "4 KiB O_DIRECT write + fdatasync: p50 {} p99 {} ({} timed)",
                ms(p50),
                ms(p99),
                latencies.len()
            );
            if p99 > SYNC_P99_HIGH {
                Row::warn("fdatasync", format!("{found}; p99 above {}", ms(SYNC_P99_HIGH)), FIX_DISK)
            } else {
                Row::pass("fdatasync", found)
            }
        }
    });
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_taken_by_rank() {
        let values: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(quantile(&values, 0.5), Duration::from_millis(50));
        assert_eq!(quantile(&values, 0.99), Duration::from_millis(99));
        assert_eq!(quantile(&values, 1.0), Duration::from_millis(100));
        assert_eq!(quantile(&values[..1], 0.99), Duration::from_millis(1));
    }
}
