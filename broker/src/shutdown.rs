//! The broker's stop signal, shared by every shard, the quorum link and the signal handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Set once to stop every shard; then, once every shard has finished its client connections, marked
/// again so the quorum link knows it may give up this broker's leaderships (see [`Shutdown::clients_done`]).
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    stop: Arc<AtomicBool>,
    clients_done: Arc<AtomicBool>,
}

impl Shutdown {
    pub fn trigger(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    pub fn is_triggered(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Resolves once shutdown is triggered (checked every 50 ms: shutdown is rare, a timer is cheap).
    pub async fn wait(&self) {
        while !self.is_triggered() {
            glommio::timer::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The flag, for registering with a signal handler.
    pub fn flag(&self) -> Arc<AtomicBool> {
        self.stop.clone()
    }

    /// True once every shard has answered the requests its connections took in (or given up waiting):
    /// until then this broker keeps its leaderships, so that no request it accepted is refused because
    /// the broker was on its way out.
    pub fn clients_done(&self) -> bool {
        self.clients_done.load(Ordering::SeqCst)
    }

    pub(crate) fn mark_clients_done(&self) {
        self.clients_done.store(true, Ordering::SeqCst);
    }
}
