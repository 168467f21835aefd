//! `shardlog-bench probe`: what a hostile or careless client can make a broker hold, measured from
//! outside. Each probe opens its connections, watches the broker's resident memory (`/proc/PID/status`)
//! and, once a second, times an ordinary client's ApiVersions request on a fresh connection, then says
//! how many of its connections the broker closed.
//!
//! - `partial-frames`: each connection sends part of one large frame and holds it.
//! - `slowloris`: each connection trickles a small frame a byte at a time.
//! - `large-requests`: one connection sends whole large Produce requests (for a topic that does not
//!   exist, so nothing is stored) and waits for each answer; then memory is watched as it idles.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ProduceRequest};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    PartialFrames,
    Slowloris,
    LargeRequests,
}

#[derive(Debug, clap::Args)]
pub struct ProbeArgs {
    /// Which probe.
    #[arg(long)]
    kind: Kind,
    /// The broker, HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:9092")]
    broker: String,
    /// The broker's process id (its memory is read from /proc).
    #[arg(long)]
    pid: u32,
    /// Connections (partial-frames, slowloris) or requests (large-requests).
    #[arg(long, default_value_t = 10)]
    connections: usize,
    /// The frame size announced (partial-frames) or sent (large-requests).
    #[arg(long, default_value_t = 100 << 20)]
    frame_bytes: usize,
    /// The share of each partial frame sent.
    #[arg(long, default_value_t = 0.9)]
    sent_fraction: f64,
    /// How long to watch after the probe's bytes are sent.
    #[arg(long, default_value_t = 45)]
    watch_s: u64,
}

pub fn run(args: &ProbeArgs) -> Result<()> {
    let addr = args
        .broker
        .to_socket_addrs()
        .with_context(|| format!("resolve {}", args.broker))?
        .next()
        .with_context(|| format!("{} does not resolve", args.broker))?;
    let baseline = rss(args.pid)?;
    println!("probe {:?} against {} (pid {}): RSS before {} MB", args.kind, addr, args.pid, mb(baseline));
    let sent = Instant::now();
    let mut connections = match args.kind {
        Kind::PartialFrames => partial_frames(addr, args)?,
        Kind::Slowloris => slowloris(addr, args.connections)?,
        Kind::LargeRequests => {
            large_requests(addr, args)?;
            Vec::new()
        }
    };
    println!("probe bytes sent in {:.1} s", sent.elapsed().as_secs_f64());
    let mut peak = rss(args.pid)?;
    let mut ordinary = Vec::new();
    let mut refused = 0;
    let watch_until = Instant::now() + Duration::from_secs(args.watch_s);
    let mut next_sample = Instant::now();
    let mut trickled = 4;
    while Instant::now() < watch_until {
        peak = peak.max(rss(args.pid)?);
        if Instant::now() >= next_sample {
            next_sample += Duration::from_secs(1);
            match ordinary_request(addr) {
                Ok(took) => ordinary.push(took),
                Err(_) => refused += 1,
            }
            if args.kind == Kind::Slowloris && trickled < SLOW_FRAME.len() {
                for c in &mut connections {
                    let _ = c.write_all(&SLOW_FRAME[trickled..trickled + 1]);
                }
                trickled += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let after = rss(args.pid)?;
    let closed = connections.iter_mut().map(closed_by_peer).filter(|&closed| closed).count();
    ordinary.sort();
    println!("RSS peak {} MB, at the end {} MB (before {} MB)", mb(peak), mb(after), mb(baseline));
    if !connections.is_empty() {
        println!("probe connections closed by the broker: {closed} of {}", connections.len());
    }
    match (ordinary.first(), ordinary.get(ordinary.len() / 2), ordinary.last()) {
        (Some(min), Some(median), Some(max)) => println!(
            "ordinary client, one ApiVersions a second: {} answered (min {:.1} ms, median {:.1} ms, max {:.1} ms), {refused} failed",
            ordinary.len(),
            ms(*min),
            ms(*median),
            ms(*max)
        ),
        _ => println!("ordinary client, one ApiVersions a second: none answered, {refused} failed"),
    }
    Ok(())
}

/// A 100-byte ApiVersions-sized frame, trickled a byte per second by slowloris.
const SLOW_FRAME: [u8; 104] = {
    let mut f = [1u8; 104];
    f[0] = 0;
    f[1] = 0;
    f[2] = 0;
    f[3] = 100;
    f
};

fn partial_frames(addr: SocketAddr, args: &ProbeArgs) -> Result<Vec<TcpStream>> {
    if args.frame_bytes > i32::MAX as usize || !(0.0..=1.0).contains(&args.sent_fraction) {
        bail!("--frame-bytes must fit a frame and --sent-fraction lie in 0..1");
    }
    let (announced, sent) = (args.frame_bytes, (args.frame_bytes as f64 * args.sent_fraction) as usize);
    let threads: Vec<_> = (0..args.connections)
        .map(|_| {
            std::thread::spawn(move || -> std::io::Result<TcpStream> {
                let mut s = TcpStream::connect(addr)?;
                // A broker that stops reading (the frame does not fit its budget) stops the writing.
                s.set_write_timeout(Some(Duration::from_secs(2)))?;
                s.write_all(&(announced as u32).to_be_bytes())?;
                let chunk = vec![0x5au8; 1 << 20];
                let mut left = sent;
                while left > 0 {
                    let n = left.min(chunk.len());
                    if s.write_all(&chunk[..n]).is_err() {
                        break;
                    }
                    left -= n;
                }
                Ok(s)
            })
        })
        .collect();
    let mut out = Vec::new();
    for t in threads {
        out.push(t.join().expect("probe thread")?);
    }
    Ok(out)
}

fn slowloris(addr: SocketAddr, connections: usize) -> Result<Vec<TcpStream>> {
    let mut out = Vec::with_capacity(connections);
    for _ in 0..connections {
        let mut s = TcpStream::connect(addr).context("connect")?;
        s.write_all(&SLOW_FRAME[..4])?;
        out.push(s);
    }
    Ok(out)
}

fn large_requests(addr: SocketAddr, args: &ProbeArgs) -> Result<()> {
    let mut s = TcpStream::connect(addr).context("connect")?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    let records = bytes::Bytes::from(vec![0x33u8; args.frame_bytes.saturating_sub(200)]);
    for i in 0..args.connections {
        let request = ProduceRequest::default().with_acks(1).with_timeout_ms(30_000).with_topic_data(vec![
            TopicProduceData::default()
                .with_name(kafka_protocol::protocol::StrBytes::from_static_str("shardlog-probe-nowhere").into())
                .with_partition_data(vec![
                    PartitionProduceData::default().with_index(0).with_records(Some(records.clone())),
                ]),
        ]);
        let frame = shardlog_net::kafka::encode_request(ApiKey::Produce, 9, i as i32, "probe", &request)?;
        s.write_all(&frame)?;
        let mut size = [0u8; 4];
        s.read_exact(&mut size).context("the broker answers a large request")?;
        let mut answer = vec![0u8; i32::from_be_bytes(size).max(0) as usize];
        s.read_exact(&mut answer)?;
    }
    Ok(())
}

/// How long an ApiVersions request on a fresh connection takes to be answered.
fn ordinary_request(addr: SocketAddr) -> Result<Duration> {
    let started = Instant::now();
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let frame =
        shardlog_net::kafka::encode_request(ApiKey::ApiVersions, 3, 1, "probe", &ApiVersionsRequest::default())?;
    s.write_all(&frame)?;
    let mut size = [0u8; 4];
    s.read_exact(&mut size)?;
    let mut answer = vec![0u8; i32::from_be_bytes(size).max(0) as usize];
    s.read_exact(&mut answer)?;
    Ok(started.elapsed())
}

/// Whether the broker has closed `s` (end of stream or reset), looking for at most 100 ms.
fn closed_by_peer(s: &mut TcpStream) -> bool {
    let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                return false;
            }
            Err(_) => return true,
        }
    }
}

fn rss(pid: u32) -> Result<usize> {
    let status =
        std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("read /proc/{pid}/status"))?;
    let kib: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("VmRSS in /proc/PID/status")?;
    Ok(kib * 1024)
}

fn mb(bytes: usize) -> usize {
    bytes / 1_000_000
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}
