//! The shard runtime: one glommio executor per shard, pinned to a core when there are enough cores,
//! each accepting connections on the shared listener address (SO_REUSEPORT) and serving them to the end.
//!
//! Shutdown: the process's signal thread sets [`Shutdown`]; every shard stops accepting, lets its
//! connections finish the request in hand, and returns.

mod connection;

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};
use futures_lite::future;
use glommio::net::TcpListener;
use glommio::{LocalExecutorBuilder, Placement};

use crate::handlers::BrokerContext;

/// Set once to stop every shard.
#[derive(Debug, Clone, Default)]
pub struct Shutdown(Arc<AtomicBool>);

impl Shutdown {
    pub fn trigger(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_triggered(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }

    /// Resolves once shutdown is triggered (checked every 50 ms: shutdown is rare, a timer is cheap).
    pub async fn wait(&self) {
        while !self.is_triggered() {
            glommio::timer::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The flag, for registering with a signal handler.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.0.clone()
    }
}

/// Runs `ctx.config.shards` shards until shutdown; returns once every shard has stopped.
pub fn run(ctx: BrokerContext, shutdown: Shutdown) -> Result<()> {
    let ctx = Arc::new(ctx);
    let shards = ctx.config.shards;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let addr =
        ctx.config.listener.socket_addr().with_context(|| format!("resolve listener {}", ctx.config.listener))?;
    let mut handles = Vec::with_capacity(shards);
    for shard in 0..shards {
        // Pinned one per core when every shard has its own core; unpinned when there are more shards.
        let placement = if shards <= cpus { Placement::Fixed(shard) } else { Placement::Unbound };
        let ctx = ctx.clone();
        let shutdown = shutdown.clone();
        let handle = LocalExecutorBuilder::new(placement)
            .name(&format!("shard-{shard}"))
            .spawn(move || async move { serve(shard, addr, ctx, shutdown).await })
            .map_err(|e| anyhow::anyhow!("start shard {shard}: {e}"))?;
        handles.push(handle);
    }
    let mut first_error = None;
    for (shard, handle) in handles.into_iter().enumerate() {
        let outcome = handle.join().map_err(|e| anyhow::anyhow!("shard {shard} executor failed: {e}"));
        if let Err(e) = outcome.and_then(|r| r) {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}

async fn serve(shard: usize, addr: std::net::SocketAddr, ctx: Arc<BrokerContext>, shutdown: Shutdown) -> Result<()> {
    let listener = TcpListener::bind(addr)
        .map_err(std::io::Error::from)
        .with_context(|| format!("shard {shard}: listen on {addr}"))?;
    tracing::info!(shard, %addr, "accepting connections");
    let open_connections = Rc::new(Cell::new(0usize));
    loop {
        let accepted = future::or(async { Some(listener.accept().await) }, async {
            shutdown.wait().await;
            None
        })
        .await;
        match accepted {
            None => break,
            Some(Ok(stream)) => {
                let (ctx, shutdown, open) = (ctx.clone(), shutdown.clone(), open_connections.clone());
                open.set(open.get() + 1);
                glommio::spawn_local(async move {
                    connection::serve(stream, ctx, shutdown).await;
                    open.set(open.get() - 1);
                })
                .detach();
            }
            Some(Err(e)) => {
                // Out of descriptors and the like: log, back off, keep the shard alive.
                tracing::warn!(shard, error = %e, "accept failed");
                glommio::timer::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    drop(listener);
    tracing::info!(shard, connections = open_connections.get(), "stopped accepting; finishing connections");
    while open_connections.get() > 0 {
        glommio::timer::sleep(Duration::from_millis(10)).await;
    }
    Ok(())
}
