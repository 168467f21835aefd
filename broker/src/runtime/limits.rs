//! What clients together may make the broker hold: request bytes (`queued.max.request.bytes`) and
//! connections (`max.connections`, `max.connections.per.ip`). Shared by every shard.
//!
//! The request budget counts the bytes of each frame from the moment its length arrives until its
//! handler has answered. A connection whose next frame does not fit waits before reading it (the bytes
//! stay in the kernel's socket buffer and TCP holds the client back), so memory for request bytes stays
//! within the budget however many clients send at once. Waiting is not first-come-first-served: a small
//! request goes ahead of a large one that does not fit yet, so ordinary clients are served while a few
//! connections hold large partial frames (those are closed at `socket.request.timeout.ms`).
//!
//! What it must never do: admit a frame larger than the whole budget (it would wait forever; the
//! settings refuse a budget below `socket.request.max.bytes`), or lose bytes (a permit gives back
//! exactly what it took, when dropped).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::config::ClientLimits;

/// The broker-wide budget of request bytes being read or waiting for their answer.
#[derive(Debug)]
pub struct RequestBudget {
    capacity: usize,
    used: AtomicUsize,
    /// Tasks waiting for bytes to be given back; a release notifies only when there are some.
    waiting: AtomicUsize,
    released: tokio::sync::Notify,
}

/// A share of the [`RequestBudget`], given back when dropped.
#[derive(Debug)]
pub struct BudgetPermit {
    budget: Arc<RequestBudget>,
    bytes: usize,
}

impl RequestBudget {
    pub fn new(capacity: usize) -> Arc<Self> {
        Arc::new(RequestBudget {
            capacity,
            used: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            released: tokio::sync::Notify::new(),
        })
    }

    /// Bytes taken now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::SeqCst)
    }

    /// Takes `bytes`, waiting until they fit.
    pub async fn acquire(self: &Arc<Self>, bytes: usize) -> BudgetPermit {
        assert!(bytes <= self.capacity, "a frame of {bytes} bytes exceeds the whole request budget");
        if let Some(permit) = self.try_acquire(bytes) {
            return permit;
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _done = WaitingGuard(self);
        loop {
            // Registered before the check, so a release between the check and the wait is not missed.
            let released = self.released.notified();
            let mut released = std::pin::pin!(released);
            released.as_mut().enable();
            if let Some(permit) = self.try_acquire(bytes) {
                return permit;
            }
            released.await;
        }
    }

    /// Takes `bytes` if they fit now.
    pub fn try_acquire(self: &Arc<Self>, bytes: usize) -> Option<BudgetPermit> {
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                (used + bytes <= self.capacity).then_some(used + bytes)
            })
            .ok()
            .map(|_| BudgetPermit { budget: self.clone(), bytes })
    }
}

struct WaitingGuard<'a>(&'a RequestBudget);

impl Drop for WaitingGuard<'_> {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for BudgetPermit {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::SeqCst);
        if self.budget.waiting.load(Ordering::SeqCst) > 0 {
            self.budget.released.notify_waiters();
        }
    }
}

/// Open client connections, in all and per address.
#[derive(Debug)]
pub struct ConnectionCounts {
    max: usize,
    max_per_ip: usize,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
    refused: AtomicU64,
}

/// Why a connection was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max.connections` are open.
    Total,
    /// `max.connections.per.ip` are open from this address.
    PerIp,
}

impl Refusal {
    pub fn setting(self) -> &'static str {
        match self {
            Refusal::Total => "max.connections",
            Refusal::PerIp => "max.connections.per.ip",
        }
    }
}

/// A counted connection; uncounted when dropped.
#[derive(Debug)]
pub struct ConnectionSlot {
    counts: Arc<ConnectionCounts>,
    ip: IpAddr,
}

impl ConnectionCounts {
    pub fn new(max: usize, max_per_ip: usize) -> Arc<Self> {
        Arc::new(ConnectionCounts {
            max,
            max_per_ip,
            open: Mutex::new((0, HashMap::new())),
            refused: AtomicU64::new(0),
        })
    }

    /// Counts a new connection from `ip`, or refuses it (and counts the refusal).
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Result<ConnectionSlot, Refusal> {
        let mut open = self.open.lock().expect("connection counts lock");
        let from_ip = open.1.get(&ip).copied().unwrap_or(0);
        let refusal = if open.0 >= self.max {
            Some(Refusal::Total)
        } else if from_ip >= self.max_per_ip {
            Some(Refusal::PerIp)
        } else {
            None
        };
        if let Some(refusal) = refusal {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return Err(refusal);
        }
        open.0 += 1;
        open.1.insert(ip, from_ip + 1);
        Ok(ConnectionSlot { counts: self.clone(), ip })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.open.lock().expect("connection counts lock").0
    }

    /// Connections refused since the start.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut open = self.counts.open.lock().expect("connection counts lock");
        open.0 -= 1;
        let from_ip = open.1.get_mut(&self.ip).expect("a counted address");
        *from_ip -= 1;
        if *from_ip == 0 {
            open.1.remove(&self.ip);
        }
    }
}

/// Everything the shards share about client limits.
#[derive(Debug)]
pub struct Clients {
    pub settings: ClientLimits,
    pub budget: Arc<RequestBudget>,
    pub counts: Arc<ConnectionCounts>,
}

impl Clients {
    pub fn new(settings: ClientLimits) -> Arc<Self> {
        Arc::new(Clients {
            budget: RequestBudget::new(settings.queued_max_request_bytes),
            counts: ConnectionCounts::new(settings.max_connections, settings.max_connections_per_ip),
            settings,
        })
    }

    pub fn idle_limit(&self) -> Duration {
        Duration::from_millis(self.settings.connections_max_idle_ms)
    }

    pub fn frame_limit(&self) -> Duration {
        Duration::from_millis(self.settings.socket_request_timeout_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: Future>(f: F) -> F::Output {
        futures_lite::future::block_on(f)
    }

    #[test]
    fn the_budget_lends_what_fits_and_a_small_request_passes_a_large_one_that_waits() {
        let budget = RequestBudget::new(100);
        let big = budget.try_acquire(70).unwrap();
        assert!(budget.try_acquire(40).is_none(), "70 + 40 exceeds 100");
        let small = budget.try_acquire(30).unwrap();
        assert_eq!(budget.used(), 100);
        drop(small);
        // A waiter for 60 does not get in while 70 are held; 30 do.
        let waiting = std::thread::spawn({
            let budget = budget.clone();
            move || block_on(budget.acquire(60)).bytes
        });
        std::thread::sleep(Duration::from_millis(50));
        let small = budget.try_acquire(30).expect("a small request fits beside the held 70");
        drop(small);
        drop(big);
        assert_eq!(waiting.join().unwrap(), 60, "the waiter got its bytes once the 70 came back");
        assert_eq!(budget.used(), 0, "every permit gave back what it took");
    }

    #[test]
    fn connections_are_counted_in_all_and_per_address() {
        let counts = ConnectionCounts::new(3, 2);
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let b: IpAddr = "127.0.0.2".parse().unwrap();
        let a1 = counts.admit(a).unwrap();
        let _a2 = counts.admit(a).unwrap();
        assert_eq!(counts.admit(a).unwrap_err(), Refusal::PerIp);
        let _b1 = counts.admit(b).unwrap();
        assert_eq!(counts.admit(b).unwrap_err(), Refusal::Total);
        assert_eq!(counts.refused(), 2);
        drop(a1);
        assert_eq!(counts.open(), 2);
        let _a3 = counts.admit(a).expect("a slot was given back");
    }
}
