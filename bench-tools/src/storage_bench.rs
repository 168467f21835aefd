//! `shardlog-bench storage`: the storage engine against the disk it runs on, in one run.
//!
//! 1. The disk itself: sequential O_DIRECT write bandwidth (large aligned writes, several in flight, then
//!    one fdatasync), the same bytes read back the same way, and fdatasync latency (a 4 KiB write then
//!    fdatasync, repeated).
//! 2. The partition log with flush policy `always`: throughput of durable appends for each batch size and
//!    partition count, with many appends in flight per partition so group commit has something to group.
//! 3. Durable-append latency with 16 concurrent appenders (one append in flight each), beside the raw
//!    fdatasync latency.
//!
//! Everything runs on one glommio executor: one shard, as in the broker.

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use glommio::io::{DmaFile, OpenOptions};
use glommio::{LocalExecutorBuilder, Placement};
use hdrhistogram::Histogram;
use shardlog_storage::batch::build_batch;
use shardlog_storage::fs::dma::DmaFs;
use shardlog_storage::{LeaderEpoch, LogConfig, LogDir, SystemClock, TopicPartition};

/// Options of `shardlog-bench storage`.
#[derive(Debug, Clone, clap::Args)]
pub struct StorageArgs {
    /// Directory for the benchmark's files (on the disk to measure); emptied before and after.
    #[arg(long, default_value = "bench-data")]
    pub dir: PathBuf,
    /// How long each log case runs.
    #[arg(long, default_value = "5s", value_parser = crate::stats::duration)]
    pub duration: Duration,
    /// Bytes written by the raw sequential-bandwidth measurement.
    #[arg(long, default_value_t = 1 << 30)]
    pub raw_bytes: u64,
    /// fdatasyncs timed by the raw latency measurement.
    #[arg(long, default_value_t = 1000)]
    pub raw_syncs: u64,
    /// Appends in flight per partition in the throughput cases.
    #[arg(long, default_value_t = 512)]
    pub in_flight: usize,
    /// Batch sizes to measure, in bytes.
    #[arg(long, value_delimiter = ',', default_values_t = [1024usize, 16384])]
    pub batch_bytes: Vec<usize>,
    /// Partition counts to measure.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16])]
    pub partitions: Vec<usize>,
    /// How far ahead of its writes the active segment's file is allocated (fallocate); 0: the file grows
    /// with its writes. The broker uses the storage engine's default.
    #[arg(long, default_value_t = LogConfig::default().preallocate_bytes)]
    pub preallocate_bytes: u64,
    /// Reserve ahead by writing zeros instead of with fallocate.
    #[arg(long)]
    pub preallocate_with_zeros: bool,
}

/// Latency percentiles in microseconds.
#[derive(Debug, Clone, Copy)]
struct Percentiles {
    p50: u64,
    p99: u64,
    p999: u64,
    max: u64,
}

impl Percentiles {
    fn of(h: &Histogram<u64>) -> Self {
        Percentiles {
            p50: h.value_at_quantile(0.5),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
        }
    }
}

fn ms(us: u64) -> String {
    format!("{:.2}", us as f64 / 1000.0)
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

/// Runs the whole storage benchmark and prints its report.
pub fn run(args: StorageArgs) -> Result<()> {
    if args.dir.exists() {
        std::fs::remove_dir_all(&args.dir).with_context(|| format!("empty {}", args.dir.display()))?;
    }
    std::fs::create_dir_all(&args.dir).with_context(|| format!("create {}", args.dir.display()))?;
    let ex = LocalExecutorBuilder::new(Placement::Unbound)
        .name("bench-storage")
        .make()
        .map_err(|e| anyhow::anyhow!("start glommio executor: {e}"))?;
    let result = ex.run(run_all(args.clone()));
    std::fs::remove_dir_all(&args.dir).ok();
    result
}

async fn run_all(args: StorageArgs) -> Result<()> {
    println!("shardlog-bench storage: {} (one shard, flush policy `always`)", args.dir.display());
    shardlog_storage::fs::dma::probe_device(&args.dir).await.context("probe the disk")?;
    // The disk is shared and noisy: take the median of three bandwidth runs.
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(raw_sequential_bandwidth(&args.dir, args.raw_bytes).await?);
    }
    let mut reads: Vec<f64> = runs.iter().map(|r| r.1).collect();
    let mut runs: Vec<f64> = runs.iter().map(|r| r.0).collect();
    runs.sort_by(f64::total_cmp);
    reads.sort_by(f64::total_cmp);
    let raw_bw = runs[1];
    let (raw_sync, raw_write_sync) = raw_fdatasync_latency(&args.dir, args.raw_syncs).await?;
    println!();
    println!("## The disk (glommio DMA, O_DIRECT)");
    println!(
        "sequential write, 1 MiB writes x 8 in flight + fdatasync: {:.0} MB/s (median of {:.0} / {:.0} / {:.0})",
        raw_bw / 1e6,
        runs[0] / 1e6,
        runs[1] / 1e6,
        runs[2] / 1e6
    );
    println!(
        "sequential read, 1 MiB reads x 8 in flight: {:.0} MB/s (median of {:.0} / {:.0} / {:.0})",
        reads[1] / 1e6,
        reads[0] / 1e6,
        reads[1] / 1e6,
        reads[2] / 1e6
    );
    println!(
        "fdatasync after a 4 KiB write (ms): p50 {} p99 {} p99.9 {} max {}",
        ms(raw_sync.p50),
        ms(raw_sync.p99),
        ms(raw_sync.p999),
        ms(raw_sync.max)
    );
    println!(
        "4 KiB write + fdatasync, together (ms): p50 {} p99 {} p99.9 {} max {}",
        ms(raw_write_sync.p50),
        ms(raw_write_sync.p99),
        ms(raw_write_sync.p999),
        ms(raw_write_sync.max)
    );
    println!();
    println!("## Durable appends, {} in flight per partition, {:?} per case", args.in_flight, args.duration);
    println!("| batch | partitions | MB/s | of raw | appends/s | fsyncs/s | p50 ms | p99 ms | p99.9 ms | max ms |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mut case = 0;
    for &batch in &args.batch_bytes {
        for &partitions in &args.partitions {
            case += 1;
            let dir = args.dir.join(format!("case-{case}"));
            let r = log_case(
                &dir,
                batch,
                partitions,
                args.in_flight,
                args.duration,
                (args.preallocate_bytes, args.preallocate_with_zeros),
            )
            .await?;
            println!(
                "| {} | {} | {:.0} | {:.0}% | {:.0} | {:.0} | {} | {} | {} | {} |",
                size_label(batch),
                partitions,
                r.bytes_per_sec / 1e6,
                100.0 * r.bytes_per_sec / raw_bw,
                r.appends_per_sec,
                r.fsyncs_per_sec,
                ms(r.latency.p50),
                ms(r.latency.p99),
                ms(r.latency.p999),
                ms(r.latency.max)
            );
            std::fs::remove_dir_all(&dir).ok();
        }
    }
    println!();
    println!("## Durable-append latency, 16 concurrent appenders (1 KiB, one in flight each)");
    println!("| case | p50 ms | p99 ms | p99.9 ms | max ms | p99 / raw fdatasync p99 |");
    println!("|---|---|---|---|---|---|");
    for partitions in [1usize, 16] {
        case += 1;
        let dir = args.dir.join(format!("case-{case}"));
        let per_partition = 16 / partitions;
        let r = log_case(
            &dir,
            1024,
            partitions,
            per_partition,
            args.duration,
            (args.preallocate_bytes, args.preallocate_with_zeros),
        )
        .await?;
        println!(
            "| 16 appenders on {partitions} partition(s) | {} | {} | {} | {} | {:.2} |",
            ms(r.latency.p50),
            ms(r.latency.p99),
            ms(r.latency.p999),
            ms(r.latency.max),
            r.latency.p99 as f64 / raw_sync.p99.max(1) as f64
        );
        std::fs::remove_dir_all(&dir).ok();
    }
    println!(
        "| raw fdatasync (reference) | {} | {} | {} | {} | 1.00 |",
        ms(raw_sync.p50),
        ms(raw_sync.p99),
        ms(raw_sync.p999),
        ms(raw_sync.max)
    );
    Ok(())
}

fn size_label(bytes: usize) -> String {
    if bytes.is_multiple_of(1024) { format!("{} KiB", bytes / 1024) } else { format!("{bytes} B") }
}

async fn open_dma(path: &Path) -> Result<DmaFile> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .dma_open(path)
        .await
        .map_err(|e| anyhow::anyhow!("open {}: {e}", path.display()))
}

/// Bytes per second of large sequential direct writes, including the final fdatasync, and of reading them
/// back the same way.
async fn raw_sequential_bandwidth(dir: &Path, total: u64) -> Result<(f64, f64)> {
    const CHUNK: usize = 1 << 20;
    const DEPTH: u64 = 8;
    let path = dir.join("raw-sequential");
    let file = Rc::new(open_dma(&path).await?);
    let chunks = total.div_ceil(CHUNK as u64);
    let start = Instant::now();
    let workers: Vec<_> = (0..DEPTH)
        .map(|w| {
            let file = file.clone();
            glommio::spawn_local(async move {
                let mut i = w;
                while i < chunks {
                    let mut buf = file.alloc_dma_buffer(CHUNK);
                    buf.as_bytes_mut().fill(0x5a);
                    file.write_at(buf, i * CHUNK as u64).await.map_err(|e| anyhow::anyhow!("raw write: {e}"))?;
                    i += DEPTH;
                }
                Ok::<_, anyhow::Error>(())
            })
        })
        .collect();
    for w in workers {
        w.await?;
    }
    file.fdatasync().await.map_err(|e| anyhow::anyhow!("raw fdatasync: {e}"))?;
    let write_secs = start.elapsed().as_secs_f64();
    // Then read it all back the same way (what a consumer catching up from the disk is compared with).
    let start = Instant::now();
    let readers: Vec<_> = (0..DEPTH)
        .map(|w| {
            let file = file.clone();
            glommio::spawn_local(async move {
                let mut i = w;
                while i < chunks {
                    let read = file.read_at_aligned(i * CHUNK as u64, CHUNK).await;
                    let read = read.map_err(|e| anyhow::anyhow!("raw read: {e}"))?;
                    anyhow::ensure!(read.len() == CHUNK, "raw read: {} of {CHUNK} bytes", read.len());
                    i += DEPTH;
                }
                Ok::<_, anyhow::Error>(())
            })
        })
        .collect();
    for r in readers {
        r.await?;
    }
    let read_secs = start.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(&path).ok();
    let bytes = (chunks * CHUNK as u64) as f64;
    Ok((bytes / write_secs, bytes / read_secs))
}

/// fdatasync latency after a 4 KiB write at a new position each time, and the latency of the write and
/// fdatasync together (the least a single durable append can cost).
async fn raw_fdatasync_latency(dir: &Path, syncs: u64) -> Result<(Percentiles, Percentiles)> {
    let path = dir.join("raw-fdatasync");
    let file = open_dma(&path).await?;
    let mut sync_only = histogram();
    let mut write_and_sync = histogram();
    for i in 0..syncs {
        let mut buf = file.alloc_dma_buffer(4096);
        buf.as_bytes_mut().fill(i as u8);
        let t = Instant::now();
        file.write_at(buf, i * 4096).await.map_err(|e| anyhow::anyhow!("raw write: {e}"))?;
        let s = Instant::now();
        file.fdatasync().await.map_err(|e| anyhow::anyhow!("raw fdatasync: {e}"))?;
        sync_only.record(s.elapsed().as_micros().max(1) as u64)?;
        write_and_sync.record(t.elapsed().as_micros().max(1) as u64)?;
    }
    drop(file);
    std::fs::remove_file(&path).ok();
    Ok((Percentiles::of(&sync_only), Percentiles::of(&write_and_sync)))
}

struct CaseResult {
    bytes_per_sec: f64,
    appends_per_sec: f64,
    fsyncs_per_sec: f64,
    latency: Percentiles,
}

/// `partitions` logs, `per_partition` appenders each looping append + wait for durability.
async fn log_case(
    dir: &Path,
    batch_bytes: usize,
    partitions: usize,
    per_partition: usize,
    duration: Duration,
    (preallocate_bytes, preallocate_with_zeros): (u64, bool),
) -> Result<CaseResult> {
    let config = LogConfig { retention_ms: None, preallocate_bytes, preallocate_with_zeros, ..LogConfig::default() };
    let (logs, _) = LogDir::open(DmaFs, Rc::new(SystemClock), dir, |_| config.clone()).await?;
    // One record per batch, its value sized so the whole batch is `batch_bytes`.
    let overhead = build_batch(0, &[b""]).len();
    let value = vec![0x42u8; batch_bytes.saturating_sub(overhead + 2)];
    let batch = Rc::new(build_batch(1_700_000_000_000, &[&value]));
    let mut tasks = Vec::new();
    let mut all_logs = Vec::new();
    // One histogram for the case: a histogram per appender would cost more memory than the log.
    let latency = Rc::new(std::cell::RefCell::new(histogram()));
    let deadline = Instant::now() + duration;
    let start = Instant::now();
    for p in 0..partitions {
        let log = logs.get_or_create(&TopicPartition::new("bench", p as u32), config.clone()).await?;
        all_logs.push(log.clone());
        for _ in 0..per_partition {
            let log = log.clone();
            let batch = batch.clone();
            let latency = latency.clone();
            tasks.push(glommio::spawn_local(async move {
                let mut bytes = 0u64;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    let info = log.append(&batch, LeaderEpoch(0)).await?;
                    log.wait_durable(info.next_offset()).await?;
                    latency.borrow_mut().record(t.elapsed().as_micros().max(1) as u64)?;
                    bytes += batch.len() as u64;
                }
                Ok::<_, anyhow::Error>(bytes)
            }));
        }
    }
    let mut bytes = 0;
    for t in tasks {
        bytes += t.await?;
    }
    let h = latency.borrow().clone();
    let secs = start.elapsed().as_secs_f64();
    // Each log's own fdatasyncs, and the device flushes the logs shared (each once).
    let fsyncs: u64 = all_logs.iter().map(|l| l.stats().fsyncs).sum::<u64>() + logs.device_flushes().unwrap_or(0);
    logs.close().await?;
    Ok(CaseResult {
        bytes_per_sec: bytes as f64 / secs,
        appends_per_sec: h.len() as f64 / secs,
        fsyncs_per_sec: fsyncs as f64 / secs,
        latency: Percentiles::of(&h),
    })
}
