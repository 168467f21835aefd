//! The HTTP endpoint on `metrics.listen`: `GET /metrics` (Prometheus' text format), `GET /ready` (200
//! "ready" once the broker serves, else 503 with what it waits for: load balancers, the wait between
//! nodes of a rolling restart) and `GET /health` (the process is alive: 200 with the same words, ready or
//! not, and 503 only when a shard has stopped running, a liveness probe's cue to restart it).
//!
//! It runs on a thread of its own, away from the shards, and answers one connection at a time: a
//! request is at most [`REQUEST_BYTES_MAX`] bytes and must arrive within [`IO_TIMEOUT`], its answer must
//! be taken within [`IO_TIMEOUT`] as well, and every answer closes its connection, so nothing a scraper
//! does holds more than one descriptor and one answer for longer than that. Between connections it runs
//! the recorder's upkeep (histogram samples folded in) and, when nobody has scraped for a while, renders
//! into nothing so that gauges of deleted partitions are dropped: its memory stays bounded unscraped.

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
/// With nobody scraping, how often the output is rendered into nothing (see the module doc).
const UNSCRAPED_RENDER_INTERVAL: Duration = Duration::from_secs(30);
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
    let listener = match TcpListener::bind(socket) {
        Ok(listener) => listener,
        // Every broker defaults to the same port: the second one on a host meets the first.
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => anyhow::bail!(
            "metrics.listen: listen on {addr}: {e}: another broker on this host may have it; give each broker \
             its own with --metrics-listen HOST:PORT (or \"metrics.listen\" in its settings; port 0 picks a free one)"
        ),
        Err(e) => return Err(e).with_context(|| format!("metrics.listen: listen on {addr}")),
    };
    listener.set_nonblocking(true).context("metrics.listen: set non-blocking")?;
    Ok(listener)
}

impl Endpoint {
    /// Serves what `handle`'s recorder holds on `listener` until stopped.
    pub fn start(
        listener: TcpListener,
        handle: PrometheusHandle,
        ctx: Arc<BrokerContext>,
        clients: Arc<Clients>,
    ) -> Result<Endpoint> {
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

    pub fn stop(self) {
        drop(self);
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn serve(listener: &TcpListener, ctx: &BrokerContext, clients: &Clients, handle: &PrometheusHandle, stop: &AtomicBool) {
    let (mut last_upkeep, mut last_render) = (Instant::now(), Instant::now());
    while !stop.load(Ordering::SeqCst) {
        if last_upkeep.elapsed() >= UPKEEP_INTERVAL {
            handle.run_upkeep();
            last_upkeep = Instant::now();
        }
        if last_render.elapsed() >= UNSCRAPED_RENDER_INTERVAL {
            // The recorder drops idle gauges only as it renders.
            let _ = handle.render_to_write(&mut std::io::sink());
            last_render = Instant::now();
        }
        if !readable(listener, Duration::from_millis(200)) {
            continue;
        }
        match listener.accept() {
            Ok((stream, peer)) => {
                last_render = Instant::now();
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
            let mut body = handle.render();
            body.push_str(&super::process::render());
            respond(&mut stream, "200 OK", "text/plain; version=0.0.4", &body)
        }
        "/health" | "/ready" => {
            let (status, body) = match crate::notify::readiness(ctx, STALL_LIMIT) {
                Ok(()) => ("200 OK", "ready\n".to_string()),
                Err(crate::notify::NotReady::Stalled(why)) => {
                    ("503 Service Unavailable", format!("not ready: {why}\n"))
                }
                Err(crate::notify::NotReady::Waiting(why)) if path == "/health" => {
                    ("200 OK", format!("not ready: {why}\n"))
                }
                Err(crate::notify::NotReady::Waiting(why)) => {
                    ("503 Service Unavailable", format!("not ready: {why}\n"))
                }
            };
            respond(&mut stream, status, "text/plain", &body)
        }
        _ => respond(&mut stream, "404 Not Found", "text/plain", "GET /metrics, /health or /ready\n"),
    }
}

fn respond(stream: &mut TcpStream, status: &str, content_type: &str, body: &str) -> Result<()> {
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    // One deadline for the whole answer: a reader taking a few bytes at a time must not hold the
    // endpoint (and a stopping broker) for longer.
    let deadline = Instant::now() + IO_TIMEOUT;
    for part in [head.as_bytes(), body.as_bytes()] {
        let mut rest = part;
        while !rest.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            anyhow::ensure!(!left.is_zero(), "the answer was not taken within {IO_TIMEOUT:?}");
            stream.set_write_timeout(Some(left))?;
            let n = stream.write(rest)?;
            anyhow::ensure!(n > 0, "connection closed");
            rest = &rest[n..];
        }
    }
    Ok(())
}
