//! Read-ahead for consumers catching up: when a consumer's fetch of a partition came back full (it is
//! reading old data, from the disk), the shard reads the partition's next range at once, while that answer
//! is on its way to the consumer, and hands it to the consumer's next fetch if it asks for exactly that
//! offset. The disk's time then overlaps the network's and the client's instead of following them.
//!
//! What is read ahead is only ever used if the log is as it was: same log, no bytes removed since the read
//! began (the log's generation), the consumer's bound (its high watermark) not below the one the read used,
//! and the result within what the fetch may carry. Anything else, and the read-ahead is dropped and the
//! fetch reads as usual. Memory held is bounded per shard by `shard.fetch.readahead.bytes` (counted at
//! what each read may return, from its start until its result is taken, or dropped and the read done);
//! an entry nobody asked for in [`KEEP`] is dropped.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::{Duration, Instant};

use shardlog_storage::fs::Fs;
use shardlog_storage::{LogRead, Offset, PartitionLog, TopicPartition};

/// How long a read-ahead waits for the fetch it was made for.
pub const KEEP: Duration = Duration::from_secs(2);
/// Reads smaller than this are not worth reading ahead.
const MIN_BYTES: usize = 64 << 10;

/// The reads made ahead on one shard.
pub struct ReadAhead<F: Fs> {
    budget_bytes: usize,
    /// What the reads made ahead may hold: counted from a read's start until its result is taken or
    /// dropped (a read whose entry was dropped still counts while it runs).
    held_bytes: Rc<Cell<usize>>,
    entries: RefCell<HashMap<TopicPartition, Entry<F>>>,
}

/// A read's share of the budget, given back when its slot goes (the read taken, or dropped and done).
struct Held {
    bytes: usize,
    total: Rc<Cell<usize>>,
}

impl Drop for Held {
    fn drop(&mut self) {
        self.total.set(self.total.get() - self.bytes);
    }
}

struct Entry<F: Fs> {
    log: Rc<PartitionLog<F>>,
    generation: u64,
    from: Offset,
    max_bytes: usize,
    /// The consumer's high watermark the read was bounded by.
    end: Offset,
    started: Instant,
    slot: Rc<Slot>,
}

/// Where the read's task leaves its result.
struct Slot {
    read: RefCell<Option<Option<LogRead>>>,
    done: event_listener::Event,
    _held: Held,
}

impl Slot {
    async fn wait(&self) -> Option<LogRead> {
        loop {
            if let Some(read) = self.read.borrow_mut().take() {
                return read;
            }
            let listener = self.done.listen();
            if let Some(read) = self.read.borrow_mut().take() {
                return read;
            }
            listener.await;
        }
    }
}

impl<F: Fs> std::fmt::Debug for ReadAhead<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadAhead")
            .field("budget_bytes", &self.budget_bytes)
            .field("held_bytes", &self.held_bytes.get())
            .field("entries", &self.entries.borrow().len())
            .finish()
    }
}

impl<F: Fs + 'static> ReadAhead<F> {
    /// Read-ahead holding at most `budget_bytes` at once (0: none).
    pub fn new(budget_bytes: usize) -> Self {
        ReadAhead { budget_bytes, held_bytes: Rc::new(Cell::new(0)), entries: RefCell::new(HashMap::new()) }
    }

    /// Bytes the reads made ahead may hold now.
    pub fn held_bytes(&self) -> usize {
        self.held_bytes.get()
    }

    /// The read made ahead for a fetch of `tp` from `from` of at most `max_bytes` bounded by `end`, if there
    /// is one that still holds (see the module documentation); the read is taken either way.
    pub async fn take(
        &self,
        tp: &TopicPartition,
        log: &Rc<PartitionLog<F>>,
        from: Offset,
        max_bytes: usize,
        end: Offset,
    ) -> Option<LogRead> {
        let matches = {
            let entries = self.entries.borrow();
            let entry = entries.get(tp)?;
            Rc::ptr_eq(&entry.log, log) && entry.from == from
        };
        if !matches {
            // Another reader of the partition (another group, or a consumer that moved): the read made
            // ahead stays for the one it was made for.
            return None;
        }
        let entry = self.entries.borrow_mut().remove(tp)?;
        if entry.end > end || from < log.log_start_offset() {
            return None;
        }
        let read = entry.slot.wait().await?;
        let intact = log.generation() == entry.generation;
        let used = intact && !read.bytes.is_empty() && read.bytes.len() <= max_bytes;
        if used {
            crate::metrics::read_ahead(true);
        }
        used.then_some(read)
    }

    /// After a fetch of `tp` that returned `read` (asked for at most `max_bytes`, bounded by `end`): reads
    /// the next range ahead if the fetch came back full and there is more below `end`, within the budget.
    pub fn after_fetch(
        &self,
        tp: &TopicPartition,
        log: &Rc<PartitionLog<F>>,
        read: &LogRead,
        max_bytes: usize,
        end: Offset,
    ) {
        // (A first batch larger than the limit came back whole: the next range would not fit the limit.)
        let full = max_bytes >= MIN_BYTES && read.bytes.len() * 2 >= max_bytes && read.bytes.len() <= max_bytes;
        if !full || read.next_offset >= end {
            return;
        }
        let from = read.next_offset;
        self.expire(Instant::now());
        let generation = log.generation();
        let under_way = self.entries.borrow().get(tp).is_some_and(|e| {
            Rc::ptr_eq(&e.log, log) && e.from == from && e.generation == generation && e.max_bytes == max_bytes
        });
        if under_way {
            // The same fetch again (a long poll looking once more): the read made for it stays.
            return;
        }
        self.entries.borrow_mut().remove(tp);
        if self.held_bytes.get() + max_bytes > self.budget_bytes {
            return;
        }
        self.held_bytes.set(self.held_bytes.get() + max_bytes);
        let held = Held { bytes: max_bytes, total: self.held_bytes.clone() };
        let slot = Rc::new(Slot { read: RefCell::new(None), done: event_listener::Event::new(), _held: held });
        let entry =
            Entry { log: log.clone(), generation, from, max_bytes, end, started: Instant::now(), slot: slot.clone() };
        self.entries.borrow_mut().insert(tp.clone(), entry);
        crate::metrics::read_ahead(false);
        let log = log.clone();
        glommio::spawn_local(async move {
            // A read that fails is not kept: the fetch reads again and meets the error itself.
            let read = log.read_until_at_most(from, max_bytes, end).await.ok();
            *slot.read.borrow_mut() = Some(read);
            slot.done.notify(usize::MAX);
        })
        .detach();
    }

    /// Drops reads made ahead that nobody asked for within [`KEEP`].
    pub fn expire(&self, now: Instant) {
        self.entries.borrow_mut().retain(|_, entry| now.duration_since(entry.started) < KEEP);
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use shardlog_storage::batch::build_batch;
    use shardlog_storage::fs::sim::SimFs;
    use shardlog_storage::{Clock, LeaderEpoch, LogConfig, LogDir};

    use super::*;

    struct FixedClock;
    impl Clock for FixedClock {
        fn now_ms(&self) -> i64 {
            1_700_000_000_000
        }
    }

    const READ: usize = MIN_BYTES;

    /// Runs `test` on a glommio executor (read-ahead spawns its reads there) with a log of 40 batches of
    /// about 8 KiB, read from the (simulated) disk: no tail cache.
    fn with_log<T: Send + 'static>(
        test: impl FnOnce(LogDir<SimFs>, Rc<PartitionLog<SimFs>>) -> futures_lite::future::BoxedLocal<T> + Send + 'static,
    ) -> T {
        glommio::LocalExecutorBuilder::default()
            .spawn(move || async move {
                let config = || LogConfig { tail_cache_bytes: 0, ..LogConfig::default() };
                let fs = SimFs::new();
                let (dir, _) = LogDir::open(fs, Rc::new(FixedClock), Path::new("/data"), |_| config()).await.unwrap();
                let log = dir.get_or_create(&tp(), config()).await.unwrap();
                let value = vec![7u8; 8 << 10];
                for _ in 0..40 {
                    log.append(&build_batch(1_700_000_000_000, &[&value]), LeaderEpoch(0)).await.unwrap();
                }
                log.flush().await.unwrap();
                test(dir, log).await
            })
            .unwrap()
            .join()
            .unwrap()
    }

    fn tp() -> TopicPartition {
        TopicPartition::new("t", 0)
    }

    #[test]
    fn a_full_fetch_reads_the_next_range_ahead_and_the_next_fetch_gets_exactly_what_it_would_have_read() {
        with_log(|_dir, log| {
            Box::pin(async move {
                let ahead = ReadAhead::new(1 << 20);
                let end = log.log_end_offset();
                let first = log.read_until_at_most(Offset(0), READ, end).await.unwrap();
                ahead.after_fetch(&tp(), &log, &first, READ, end);
                assert_eq!(ahead.held_bytes(), READ, "the next range is being read");
                let next = ahead.take(&tp(), &log, first.next_offset, READ, end).await.expect("read ahead");
                assert_eq!(next, log.read_until_at_most(first.next_offset, READ, end).await.unwrap());
                assert_eq!(ahead.held_bytes(), 0, "taken");
                assert!(ahead.take(&tp(), &log, first.next_offset, READ, end).await.is_none(), "taken once");
            })
        });
    }

    #[test]
    fn a_read_ahead_is_not_used_once_the_log_lost_bytes_or_for_another_offset_or_a_lower_bound() {
        with_log(|_dir, log| {
            Box::pin(async move {
                let ahead = ReadAhead::new(1 << 20);
                let end = log.log_end_offset();
                let first = log.read_until_at_most(Offset(0), READ, end).await.unwrap();
                let next = first.next_offset;

                ahead.after_fetch(&tp(), &log, &first, READ, end);
                assert!(ahead.take(&tp(), &log, next.plus(1), READ, end).await.is_none(), "another offset");
                ahead.after_fetch(&tp(), &log, &first, READ, end);
                assert_eq!(ahead.held_bytes(), READ, "the same fetch again keeps the read under way");
                assert!(
                    ahead.take(&tp(), &log, next, READ, end).await.is_some(),
                    "a reader at another offset left it to the one it was made for"
                );
                ahead.after_fetch(&tp(), &log, &first, READ, end);
                assert!(ahead.take(&tp(), &log, next, READ, Offset(end.0 - 1)).await.is_none(), "a lower bound");
                ahead.after_fetch(&tp(), &log, &first, READ, end);
                assert!(ahead.take(&tp(), &log, next, READ / 2, end).await.is_none(), "more than the fetch may carry");

                // The range read ahead is cut away and written again with other records (a follower
                // truncating to its new leader's log): the bytes read ahead are not what the log holds.
                ahead.after_fetch(&tp(), &log, &first, READ, end);
                glommio::timer::sleep(std::time::Duration::from_millis(5)).await; // the read ahead is done
                log.truncate_to(next.plus(1)).await.unwrap();
                let other = vec![9u8; 8 << 10];
                while log.log_end_offset() < end {
                    log.append(&build_batch(1_700_000_000_000, &[&other]), LeaderEpoch(1)).await.unwrap();
                }
                log.flush().await.unwrap();
                assert!(ahead.take(&tp(), &log, next, READ, end).await.is_none(), "bytes were removed");

                // DeleteRecords moves the log start past the range read ahead, inside its segment.
                let again = log.read_until_at_most(Offset(0), READ, end).await.unwrap();
                ahead.after_fetch(&tp(), &log, &again, READ, end);
                glommio::timer::sleep(std::time::Duration::from_millis(5)).await; // the read ahead is done
                log.delete_records(again.next_offset.plus(2)).await.unwrap();
                assert!(ahead.take(&tp(), &log, again.next_offset, READ, end).await.is_none(), "records were deleted");
                glommio::timer::sleep(std::time::Duration::from_millis(5)).await;
                assert_eq!(ahead.held_bytes(), 0);
            })
        });
    }

    #[test]
    fn reads_ahead_stay_within_the_budget_and_expire_when_nobody_asks() {
        with_log(|_dir, log| {
            Box::pin(async move {
                let ahead = ReadAhead::new(READ);
                let end = log.log_end_offset();
                let first = log.read_until_at_most(Offset(0), READ, end).await.unwrap();
                ahead.after_fetch(&tp(), &log, &first, READ, end);
                ahead.after_fetch(&TopicPartition::new("t", 1), &log, &first, READ, end);
                assert_eq!(ahead.held_bytes(), READ, "the second is over the budget");
                assert!(ahead.take(&TopicPartition::new("t", 1), &log, first.next_offset, READ, end).await.is_none());

                let small = log.read_until_at_most(Offset(0), READ / 2 - 1, end).await.unwrap();
                let none = ReadAhead::new(1 << 20);
                none.after_fetch(&tp(), &log, &small, READ, end);
                assert_eq!(none.held_bytes(), 0, "a fetch that did not come back full reads nothing ahead");

                ahead.expire(Instant::now() + KEEP);
                assert!(ahead.take(&tp(), &log, first.next_offset, READ, end).await.is_none(), "nobody asked in time");
                glommio::timer::sleep(std::time::Duration::from_millis(5)).await; // its read is done
                assert_eq!(ahead.held_bytes(), 0);
            })
        });
    }
}
