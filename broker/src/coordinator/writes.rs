//! A coordinator's writes in flight, per partition of its internal topic, in the order they were sent.
//! An answer that has no records of its own may still reflect changes whose records are not yet written
//! (another member's join, a timer's removal): it waits until every write sent before it has been
//! answered, and is refused NOT_COORDINATOR if the partition's state was dropped meanwhile (a write
//! failed and it is read again, or leadership moved), so no client acts on a state the log does not
//! have. Kafka's coordinator holds such answers the same way.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap};
use std::rc::Rc;

use kafka_protocol::ResponseError;

#[derive(Default)]
struct Partition {
    /// Writes sent so far; the last one's number.
    sent: u64,
    /// The numbers of the writes sent and not yet answered.
    in_flight: BTreeSet<u64>,
    /// How many times the partition's state in memory was dropped.
    drops: u64,
}

#[derive(Default)]
pub(crate) struct Writes {
    partitions: RefCell<HashMap<i32, Partition>>,
    answered: event_listener::Event,
}

/// A write in flight: it counts as answered when this is dropped (answered, or given up).
pub(crate) struct InFlight {
    writes: Rc<Writes>,
    partition: i32,
    number: u64,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(p) = self.writes.partitions.borrow_mut().get_mut(&self.partition) {
            p.in_flight.remove(&self.number);
        }
        self.writes.answered.notify(usize::MAX);
    }
}

/// Where the partition's writes stood when an answer was decided.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mark {
    partition: i32,
    last_sent: u64,
    drops: u64,
}

impl Writes {
    /// A write about to be sent.
    pub(crate) fn start(self: &Rc<Self>, partition: i32) -> InFlight {
        let mut partitions = self.partitions.borrow_mut();
        let p = partitions.entry(partition).or_default();
        p.sent += 1;
        p.in_flight.insert(p.sent);
        InFlight { writes: self.clone(), partition, number: p.sent }
    }

    /// The partition's state in memory is dropped (to be read again, or for good): what was decided
    /// before may not be in the log.
    pub(crate) fn dropped(&self, partition: i32) {
        self.partitions.borrow_mut().entry(partition).or_default().drops += 1;
        // Answers waiting on the partition's writes are refused now, not when those writes end.
        self.answered.notify(usize::MAX);
    }

    /// Whether the partition's state was dropped since `mark`: an answer decided before then may
    /// reflect changes the log does not have, even if its own write went through.
    pub(crate) fn dropped_since(&self, mark: Mark) -> bool {
        self.partitions.borrow().get(&mark.partition).is_some_and(|p| p.drops != mark.drops)
    }

    /// Where the partition's writes stand now.
    pub(crate) fn mark(&self, partition: i32) -> Mark {
        let mut partitions = self.partitions.borrow_mut();
        let p = partitions.entry(partition).or_default();
        Mark { partition, last_sent: p.sent, drops: p.drops }
    }

    /// Waits until every write sent before `mark` has been answered; NOT_COORDINATOR if the partition's
    /// state was dropped since.
    pub(crate) async fn settled(&self, mark: Mark) -> Result<(), ResponseError> {
        loop {
            let listener = self.answered.listen();
            if self.dropped_since(mark) {
                return Err(ResponseError::NotCoordinator);
            }
            let first_in_flight =
                self.partitions.borrow().get(&mark.partition).and_then(|p| p.in_flight.first().copied());
            if first_in_flight.is_none_or(|first| first > mark.last_sent) {
                return Ok(());
            }
            listener.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_lite::future;

    fn ready(f: impl std::future::Future<Output = Result<(), ResponseError>>) -> Option<Result<(), ResponseError>> {
        let mut f = std::pin::pin!(f);
        future::block_on(future::poll_once(&mut f))
    }

    #[test]
    fn an_answer_waits_for_the_writes_sent_before_it_only() {
        let writes = Rc::new(Writes::default());
        assert_eq!(ready(writes.settled(writes.mark(3))), Some(Ok(())), "nothing in flight");
        let first = writes.start(3);
        let second = writes.start(3);
        let other = writes.start(4);
        let mark = writes.mark(3);
        let later = writes.start(3);
        assert_eq!(ready(writes.settled(mark)), None);
        drop(second);
        assert_eq!(ready(writes.settled(mark)), None, "the first is still in flight");
        drop(first);
        // Neither a later write nor another partition's holds it.
        assert_eq!(ready(writes.settled(mark)), Some(Ok(())));
        drop((later, other));
    }

    #[test]
    fn an_answer_waiting_is_woken_when_the_writes_are_answered_and_refused_after_a_drop() {
        let writes = Rc::new(Writes::default());
        let write = writes.start(0);
        let mark = writes.mark(0);
        let mut waiting = Box::pin(writes.settled(mark));
        assert_eq!(future::block_on(future::poll_once(&mut waiting)), None);
        drop(write);
        assert_eq!(future::block_on(waiting), Ok(()));

        let write = writes.start(0);
        let mark = writes.mark(0);
        writes.dropped(0);
        drop(write);
        assert_eq!(ready(writes.settled(mark)), Some(Err(ResponseError::NotCoordinator)));
        // A mark taken after the drop is not refused for it.
        assert_eq!(ready(writes.settled(writes.mark(0))), Some(Ok(())));
    }

    #[test]
    fn a_drop_refuses_a_waiting_answer_at_once_and_marks_answers_whose_own_write_went_through() {
        let writes = Rc::new(Writes::default());
        let _stuck = writes.start(1);
        let mark = writes.mark(1);
        let mut waiting = Box::pin(writes.settled(mark));
        assert_eq!(future::block_on(future::poll_once(&mut waiting)), None);
        assert!(!writes.dropped_since(mark));
        writes.dropped(1);
        // Refused although the write it waits for is still out.
        assert_eq!(future::block_on(future::poll_once(&mut waiting)), Some(Err(ResponseError::NotCoordinator)));
        assert!(writes.dropped_since(mark));
        assert!(!writes.dropped_since(writes.mark(1)));
    }
}
