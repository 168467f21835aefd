//! `shardlog-bench loopback`: the floor any broker measured on this host stands on, with no broker at all.
//!
//! 1. Round trip: one thread sends a request of `--request-bytes` over loopback TCP and waits, blocked in
//!    `read`, for an answer of `--answer-bytes` from another thread that echoes it (also blocked while it
//!    waits): exactly what a sync producer and a broker do per message, minus the broker's work. Measured
//!    with both threads free to run on any core, then with both pinned to the same core, because waking a
//!    thread on another core is what such a round trip mostly costs on virtual machines. One over the
//!    cross-core median is the most one-at-a-time requests per second a single lane could reach.
//! 2. Bandwidth: one stream of 1 MiB writes, read as fast as it arrives.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use hdrhistogram::Histogram;

/// Options of `shardlog-bench loopback`.
#[derive(Debug, Clone, clap::Args)]
pub struct LoopbackArgs {
    /// How long each measurement runs.
    #[arg(long, default_value = "3s", value_parser = crate::stats::duration)]
    pub duration: Duration,
    /// Bytes each round trip sends (a 1 KiB message in a produce request is about 1100).
    #[arg(long, default_value_t = 1100)]
    pub request_bytes: usize,
    /// Bytes each round trip answers (a produce answer is about 60).
    #[arg(long, default_value_t = 60)]
    pub answer_bytes: usize,
}

pub fn run(args: &LoopbackArgs) -> Result<()> {
    for (label, cpu) in [("threads on any core", None), ("both threads on core 0", Some(0))] {
        let h = round_trips(args, cpu)?;
        let p50_us = h.value_at_quantile(0.5) as f64 / 1000.0;
        println!(
            "round trip, {label}: p50 {p50_us:.1} us  p99 {:.1} us  max {:.1} us over {} round trips \
             (one lane: at most {:.0}/s)",
            h.value_at_quantile(0.99) as f64 / 1000.0,
            h.max() as f64 / 1000.0,
            h.len(),
            1e6 / p50_us,
        );
    }
    let (bytes, elapsed) = stream(args.duration)?;
    println!(
        "one stream: {:.0} MB/s ({} MiB in {:.2} s)",
        bytes as f64 / elapsed.as_secs_f64() / 1e6,
        bytes >> 20,
        elapsed.as_secs_f64()
    );
    Ok(())
}

fn pin(cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and sched_setaffinity only read and write it.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
        }
    }
}

fn connected_pair() -> Result<(TcpStream, TcpListener)> {
    let listener = TcpListener::bind("127.0.0.1:0").context("bind a loopback port")?;
    let client = TcpStream::connect(listener.local_addr()?).context("connect over loopback")?;
    client.set_nodelay(true)?;
    Ok((client, listener))
}

fn round_trips(args: &LoopbackArgs, cpu: Option<usize>) -> Result<Histogram<u64>> {
    let (mut client, listener) = connected_pair()?;
    let (request_bytes, answer_bytes) = (args.request_bytes, args.answer_bytes);
    let echo = std::thread::spawn(move || -> std::io::Result<()> {
        pin(cpu);
        let (mut server, _) = listener.accept()?;
        server.set_nodelay(true)?;
        let mut request = vec![0u8; request_bytes];
        let answer = vec![1u8; answer_bytes];
        while server.read_exact(&mut request).is_ok() {
            server.write_all(&answer)?;
        }
        Ok(())
    });
    let measure = std::thread::spawn({
        let duration = args.duration;
        move || -> Result<Histogram<u64>> {
            pin(cpu);
            let mut h = Histogram::<u64>::new(3)?;
            let request = vec![2u8; request_bytes];
            let mut answer = vec![0u8; answer_bytes];
            let end = Instant::now() + duration;
            while Instant::now() < end {
                let start = Instant::now();
                client.write_all(&request)?;
                client.read_exact(&mut answer)?;
                h.record(start.elapsed().as_nanos() as u64)?;
            }
            Ok(h)
        }
    });
    let h = measure.join().expect("the measuring thread does not panic")?;
    echo.join().expect("the echo thread does not panic")?;
    Ok(h)
}

fn stream(duration: Duration) -> Result<(u64, Duration)> {
    let (mut client, listener) = connected_pair()?;
    let reader = std::thread::spawn(move || -> std::io::Result<u64> {
        let (mut server, _) = listener.accept()?;
        let mut buf = vec![0u8; 1 << 20];
        let mut total = 0u64;
        loop {
            match server.read(&mut buf)? {
                0 => return Ok(total),
                n => total += n as u64,
            }
        }
    });
    let chunk = vec![3u8; 1 << 20];
    let start = Instant::now();
    while start.elapsed() < duration {
        client.write_all(&chunk)?;
    }
    drop(client);
    let total = reader.join().expect("the reading thread does not panic")?;
    Ok((total, start.elapsed()))
}
