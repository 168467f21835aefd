//! The broker's stop signal, shared by every shard, the quorum link and the signal handler.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once to stop every shard; then, once every shard has finished its client connections, marked
/// again so the quorum link knows it may give up this broker's leaderships (see [`Shutdown::clients_done`]).
///
/// Waiting is event-driven: a task awaiting [`Shutdown::wait`] is woken once, when the stop is triggered,
/// never before. A periodic wake-up would poll whatever the task races the wait against again and again,
/// and glommio keeps one more waker for every poll of a pending accept (its `collect_rw`): a shard idle in
/// `accept` for half an hour overflowed the task's waker count (an i16) and panicked in the reactor.
#[derive(Debug, Clone, Default)]
pub struct Shutdown {
    stop: Arc<AtomicBool>,
    clients_done: Arc<AtomicBool>,
    stopped: Arc<event_listener::Event>,
}

impl Shutdown {
    pub fn trigger(&self) {
        self.stop.store(true, Ordering::SeqCst);
        self.stopped.notify(usize::MAX);
    }

    pub fn is_triggered(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// Resolves once shutdown is triggered; the waiting task is not woken before.
    pub async fn wait(&self) {
        loop {
            if self.is_triggered() {
                return;
            }
            let stopped = self.stopped.listen();
            // Checked again once listening, so a trigger in between is not missed.
            if self.is_triggered() {
                return;
            }
            stopped.await;
        }
    }

    /// Sleeps for `duration` on the shard's timer, or less if shutdown is triggered meanwhile. Returns
    /// whether it was (the loop calling it stops).
    pub async fn sleep(&self, duration: std::time::Duration) -> bool {
        futures_lite::future::or(
            async {
                glommio::timer::sleep(duration).await;
                false
            },
            async {
                self.wait().await;
                true
            },
        )
        .await
    }

    /// Triggers on SIGTERM and SIGINT, from a thread of its own that waits for them.
    pub fn on_signals(&self) -> std::io::Result<()> {
        use signal_hook::consts::{SIGINT, SIGTERM};
        let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])?;
        let shutdown = self.clone();
        std::thread::Builder::new().name("signals".into()).spawn(move || {
            for _ in signals.forever() {
                shutdown.trigger();
            }
        })?;
        Ok(())
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

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;
    use std::time::Duration;

    use super::*;

    /// A future that never completes and counts how often it is polled.
    struct Polled(Rc<Cell<u32>>);

    impl std::future::Future for Polled {
        type Output = ();
        fn poll(self: std::pin::Pin<&mut Self>, _: &mut std::task::Context<'_>) -> std::task::Poll<()> {
            self.0.set(self.0.get() + 1);
            std::task::Poll::Pending
        }
    }

    #[test]
    fn waiting_for_shutdown_does_not_wake_what_it_races_against_until_the_stop() {
        let polls = glommio::LocalExecutorBuilder::default()
            .spawn(|| async move {
                let shutdown = Shutdown::default();
                let trigger = shutdown.clone();
                glommio::spawn_local(async move {
                    glommio::timer::sleep(Duration::from_secs(1)).await;
                    trigger.trigger();
                })
                .detach();
                let polls = Rc::new(Cell::new(0));
                futures_lite::future::or(Polled(polls.clone()), shutdown.wait()).await;
                polls.get()
            })
            .unwrap()
            .join()
            .unwrap();
        // Once at the start and once when the stop wakes the task: nothing in between.
        assert!(polls <= 2, "the other future was polled {polls} times in a second");
    }

    #[test]
    fn a_stop_from_another_thread_wakes_the_waiter() {
        let shutdown = Shutdown::default();
        let trigger = shutdown.clone();
        let waiter =
            glommio::LocalExecutorBuilder::default().spawn(move || async move { shutdown.wait().await }).unwrap();
        std::thread::sleep(Duration::from_millis(100));
        trigger.trigger();
        waiter.join().unwrap();
    }
}
