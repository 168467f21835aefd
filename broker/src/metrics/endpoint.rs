//! The HTTP endpoint on `metrics.listen`: `GET /metrics` (Prometheus' text format), `GET /health` and
//! `GET /ready` (200 with "ready", or 503 with what the broker waits for: load balancers and probes).
//!
//! It runs on a thread of its own, away from the shards, and answers one connection at a time: a
//! request is at most [`REQUEST_BYTES_MAX`] bytes and must arrive within [`IO_TIMEOUT`], and every
//! answer closes its connection, so nothing a scraper does holds more than one descriptor and one
//! small buffer for longer than that. Between connections it runs the recorder's upkeep (histogram
//! samples folded in, stale gauges dropped), which bounds its memory when nobody scrapes.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use metrics_exporter_prometheus::PrometheusHandle;

use crate::context::BrokerContext;
use crate::runtime::limits::Clients;

/// The longest request read (a scraper's GET with its headers is a few hundred bytes).
const REQUEST_BYTES_MAX: usize = 8 << 10;
/// How long a connection may take to send its request or to take its answer.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the recorder's upkeep runs.
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);
/// How long a shard may go without running before `/health` says so (the watchdog's probe).
const STALL_LIMIT: Duration = Duration::from_secs(5);

/// The endpoint's thread; stopped by [`Endpoint::stop`].
#[derive(Debug)]
pub struct Endpoint {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Binds `addr` (before the broker starts anything else, so a port in use stops the start).
pub fn bind(addr: &crate::config::Endpoint) -> Result<TcpListener> {
    let socket = addr.socket_addr().with_context(|| format!("metrics.listen: resolve {addr}"))?;
    let listener = TcpListener::bind(socket).with_context(|| format!("metrics.listen: listen on {addr}"))?;
    listener.set_nonblocking(true).context("metrics.listen: set non-blocking")?;
    Ok(listener)
}

impl Endpoint {
    /// Serves on `listener` until stopped.
    pub fn start(listener: TcpListener, ctx: Arc<BrokerContext>, clients: Arc<Clients>) -> Result<Endpoint> {
        let handle = super::install();
        super::partitions::describe_broker();
        let addr = listener.local_addr().context("metrics.listen: local address")?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name("metrics".into())
            .spawn(move || serve(&listener, &ctx, &clients, &handle, &stopping))
            .context("start the metrics endpoint's thread")?;
        tracing::info!(%addr, "metrics endpoint: GET /metrics, /health, /ready");
        Ok(Endpoint { stop, thread: Some(thread) })
    }

    pub fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(listener: &TcpListener, ctx: &BrokerContext, clients: &Clients, handle: &PrometheusHandle, stop: &AtomicBool) {
    let mut last_upkeep = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        if last_upkeep.elapsed() >= UPKEEP_INTERVAL {
            handle.run_upkeep();
            last_upkeep = Instant::now();
        }
        if !readable(listener, Duration::from_millis(200)) {
            continue;
        }
        match listener.accept() {
            Ok((stream, peer)) => {
                if let Err(e) = answer(stream, ctx, clients, handle) {
                    tracing::debug!(%peer, error = %e, "metrics endpoint: connection ended");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => {
                tracing::debug!(error = %e, "metrics endpoint: accept failed");
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// Whether a connection waits to be accepted, waiting at most `wait`.
fn readable(listener: &TcpListener, wait: Duration) -> bool {
    let mut fd = libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: poll(2) on one pollfd that lives for the call.
    let ready = unsafe { libc::poll(&mut fd, 1, wait.as_millis() as libc::c_int) };
    ready > 0
}

fn answer(mut stream: TcpStream, ctx: &BrokerContext, clients: &Clients, handle: &PrometheusHandle) -> Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let deadline = Instant::now() + IO_TIMEOUT;
    let mut request = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") {
        if request.len() >= REQUEST_BYTES_MAX || Instant::now() > deadline {
            return respond(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "request too large or slow\n",
            );
        }
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        request.extend_from_slice(&chunk[..n]);
    }
    let line = request.split(|b| *b == b'\r').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut words = line.split(' ');
    let (method, target) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if method != "GET" {
        return respond(&mut stream, "405 Method Not Allowed", "text/plain", "only GET\n");
    }
    match path {
        "/metrics" => {
            super::scrape_broker(ctx, clients);
            respond(&mut stream, "200 OK", "text/plain; version=0.0.4", &handle.render())
        }
        "/health" | "/ready" => match crate::notify::readiness(ctx, STALL_LIMIT) {
            Ok(()) => respond(&mut stream, "200 OK", "text/plain", "ready\n"),
            Err(why) => respond(&mut stream, "503 Service Unavailable", "text/plain", &format!("not ready: {why}\n")),
        },
        _ => respond(&mut stream, "404 Not Found", "text/plain", "GET /metrics, /health or /ready\n"),
    }
}

fn respond(stream: &mut TcpStream, status: &str, content_type: &str, body: &str) -> Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())?;
    stream.flush()?;
    Ok(())
}
