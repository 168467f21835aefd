//! Read-ahead for consumers catching up: when a consumer's fetch of a partition came back full (it is
//! reading old data, from the disk), the shard reads the partition's next ranges at once, while that answer
//! is on its way to the consumer, and hands them to the consumer's next fetches if they ask for exactly
//! those offsets. The disk's time then overlaps the network's and the client's instead of following them.
//!
//! Each partition read ahead has a stream: up to [`DEPTH_MAX`] ranges, one after the other, read one at a
//! time (a range begins where the one before it ended, known only once that one is read). When a fetch
//! takes the first range, the stream reads on; so while one answer is on the wire and the next waits in
//! memory, the disk is already reading the ones after, and it never waits for the client. How deep a
//! stream reads is the budget's to say: the first range of every stream may use all of it, the ranges
//! behind a first only half, so that deep streams never keep another partition from its next range.
//!
//! What is read ahead is only ever used if the log is as it was: same log, no bytes removed since the read
//! began (the log's generation), and the consumer's bound (its high watermark) not below the one the read
//! used. Anything else, and the stream is dropped and the fetch reads as usual. A fetch with less room than
//! the range holds (a partition's limit is what the answer has left) takes the whole batches that fit, as
//! its own read would have, and the rest stays first in the stream for the fetch after it. Memory held is bounded per shard by `shard.fetch.readahead.bytes` (counted at what each
//! read may return, from its start until its result is taken, or dropped and the read done); a stream
//! nobody asked anything of in [`KEEP`] is dropped.

use std::cell::{Cell, RefCell};
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::time::{Duration, Instant};

use shardlog_storage::fs::Fs;
use shardlog_storage::{LogRead, Offset, PartitionLog, TopicPartition};

/// How long a stream waits for a fetch to ask for its next range.
pub const KEEP: Duration = Duration::from_secs(2);
/// Ranges a stream reads ahead of the consumer at most, when the budget has room for them: the next
/// fetch's range waiting in memory and the ones after it read meanwhile, so that a consumer taking several
/// answers quicker than one range is read (a burst after a slow answer) still finds them read.
pub const DEPTH_MAX: usize = 4;
/// Reads smaller than this are not worth reading ahead.
const MIN_BYTES: usize = 64 << 10;

/// The reads made ahead on one shard.
pub struct ReadAhead<F: Fs> {
    state: Rc<State<F>>,
}

struct State<F: Fs> {
    budget_bytes: usize,
    /// What the reads made ahead may hold: counted from a read's start until its result is taken or
    /// dropped (a read whose stream was dropped still counts while it runs).
    held_bytes: Rc<Cell<usize>>,
    streams: RefCell<HashMap<TopicPartition, Stream<F>>>,
    next_id: Cell<u64>,
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

/// The ranges read ahead of one consumer of one partition.
struct Stream<F: Fs> {
    /// Tells this stream from one that took its place while a read was under way.
    id: u64,
    log: Rc<PartitionLog<F>>,
    generation: u64,
    max_bytes: usize,
    /// The consumer's high watermark the reads are bounded by.
    end: Offset,
    /// When a fetch last asked for a range (or the stream began).
    touched: Instant,
    /// The ranges read or being read, in offset order; the first is the one the next fetch asks for.
    ranges: VecDeque<Rc<Slot>>,
    /// Where the last range queued begins.
    last_from: Offset,
    /// Where a next range would begin: set once the last range queued is read and came back full, below
    /// the bound; `None` while it is being read, or when the stream has nothing more to read.
    next_from: Option<Offset>,
}

/// Where a read's task leaves its result.
struct Slot {
    from: Offset,
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

/// A fetch that came back this full was cut by its limit, not by the end of the log: the consumer will
/// ask for more. (A first batch larger than the limit came back whole: the next range would not fit.)
fn came_back_full(read: &LogRead, max_bytes: usize) -> bool {
    max_bytes >= MIN_BYTES && read.bytes.len() * 2 >= max_bytes && read.bytes.len() <= max_bytes
}

impl<F: Fs> std::fmt::Debug for ReadAhead<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadAhead")
            .field("budget_bytes", &self.state.budget_bytes)
            .field("held_bytes", &self.state.held_bytes.get())
            .field("streams", &self.state.streams.borrow().len())
            .finish()
    }
}

impl<F: Fs + 'static> ReadAhead<F> {
    /// Read-ahead holding at most `budget_bytes` at once (0: none).
    pub fn new(budget_bytes: usize) -> Self {
        ReadAhead {
            state: Rc::new(State {
                budget_bytes,
                held_bytes: Rc::new(Cell::new(0)),
                streams: RefCell::new(HashMap::new()),
                next_id: Cell::new(0),
            }),
        }
    }

    /// Bytes the reads made ahead may hold now.
    pub fn held_bytes(&self) -> usize {
        self.state.held_bytes.get()
    }

    /// The read made ahead for a fetch of `tp` from `from` of at most `max_bytes` (or the first batch
    /// whole, if `whole_first_batch` and it is larger) bounded by `end`, if there is one that still holds
    /// (see the module documentation). A range asked for is taken, and the stream reads one more in its
    /// place; what the fetch has no room for stays first in the stream.
    pub async fn take(
        &self,
        tp: &TopicPartition,
        log: &Rc<PartitionLog<F>>,
        from: Offset,
        max_bytes: usize,
        end: Offset,
        whole_first_batch: bool,
    ) -> Option<LogRead> {
        let (id, generation, slot) = {
            let mut streams = self.state.streams.borrow_mut();
            let stream = streams.get_mut(tp)?;
            if !Rc::ptr_eq(&stream.log, log) || stream.ranges.front().map(|slot| slot.from) != Some(from) {
                // Another reader of the partition (another group, or a consumer that moved): the stream
                // stays for the one it was made for.
                return None;
            }
            if stream.end > end || from < log.log_start_offset() || stream.generation != log.generation() {
                streams.remove(tp);
                return None;
            }
            stream.touched = Instant::now();
            // A stream begun by a fetch with little room reads more once its fetches have more.
            stream.max_bytes = stream.max_bytes.max(max_bytes);
            let slot = stream.ranges.pop_front().expect("the first range was just seen");
            (stream.id, stream.generation, slot)
        };
        self.state.top_up(tp);
        let read = slot.wait().await;
        // The range's share of the budget goes; what the fetch leaves of it is counted anew.
        drop(slot);
        let Some(mut rest) = read.filter(|read| log.generation() == generation && !read.bytes.is_empty()) else {
            self.state.drop_stream(tp, id);
            return None;
        };
        // A fetch may carry less than the range holds (its limit is what the answer has room left for):
        // it takes the batches that fit, as its own read would have, and the rest waits for the next.
        let first_batch_bytes = rest.first_batch_bytes().unwrap_or(0);
        let limit = if whole_first_batch { max_bytes.max(first_batch_bytes) } else { max_bytes };
        let head = match rest.split_to_at_most(limit) {
            Some(head) => {
                crate::metrics::read_ahead(true);
                head
            }
            // Not even the first batch fits: the fetch gets nothing of this partition, as its own read
            // would have, and the range waits whole for the next.
            None => LogRead { bytes: bytes::Bytes::new(), first_offset: None, next_offset: from },
        };
        if !rest.bytes.is_empty() {
            self.state.put_back(tp, id, head.next_offset, rest);
        }
        Some(head)
    }

    /// After a fetch of `tp` that returned `read` (asked for at most `max_bytes`, bounded by `end`): reads
    /// the next ranges ahead if the fetch came back full and there is more below `end`, within the budget.
    pub fn after_fetch(
        &self,
        tp: &TopicPartition,
        log: &Rc<PartitionLog<F>>,
        read: &LogRead,
        max_bytes: usize,
        end: Offset,
    ) {
        if !came_back_full(read, max_bytes) || read.next_offset >= end {
            return;
        }
        let from = read.next_offset;
        let now = Instant::now();
        self.expire(now);
        let generation = log.generation();
        {
            let mut streams = self.state.streams.borrow_mut();
            if let Some(stream) = streams.get_mut(tp) {
                let same = Rc::ptr_eq(&stream.log, log) && stream.generation == generation && stream.end <= end;
                let goes_on_from_here = match stream.ranges.front() {
                    Some(first) => first.from == from,
                    None => stream.next_from == Some(from),
                };
                if same && goes_on_from_here {
                    // The stream this fetch took from, or the same fetch again (a long poll looking once
                    // more): it goes on.
                    stream.touched = now;
                    // Ranges read from now on follow the consumer's latest limit.
                    stream.max_bytes = max_bytes;
                    drop(streams);
                    self.state.top_up(tp);
                    return;
                }
                streams.remove(tp);
            }
            let id = self.state.next_id.get();
            self.state.next_id.set(id + 1);
            let stream = Stream {
                id,
                log: log.clone(),
                generation,
                max_bytes,
                end,
                touched: now,
                ranges: VecDeque::new(),
                last_from: from,
                next_from: Some(from),
            };
            streams.insert(tp.clone(), stream);
        }
        self.state.top_up(tp);
    }

    /// Drops streams nobody asked anything of within [`KEEP`].
    pub fn expire(&self, now: Instant) {
        self.state.streams.borrow_mut().retain(|_, stream| now.duration_since(stream.touched) < KEEP);
    }
}

impl<F: Fs + 'static> State<F> {
    /// Starts reading the next range of `tp`'s stream if it is known where it begins, the stream holds
    /// fewer than [`DEPTH_MAX`] ranges, the log is as it was and the budget allows.
    fn top_up(self: &Rc<Self>, tp: &TopicPartition) {
        let mut streams = self.streams.borrow_mut();
        let Some(stream) = streams.get_mut(tp) else { return };
        let Some(from) = stream.next_from else { return };
        if stream.ranges.len() >= DEPTH_MAX || stream.log.generation() != stream.generation {
            return;
        }
        let max_bytes = stream.max_bytes;
        // A range a fetch will ask for next may take the whole budget; ranges behind it only half, so
        // that streams reading deep do not keep others from reading at all.
        let budget_bytes = if stream.ranges.is_empty() { self.budget_bytes } else { self.budget_bytes / 2 };
        if self.held_bytes.get() + max_bytes > budget_bytes {
            return;
        }
        let slot = self.slot(from, max_bytes, None);
        stream.ranges.push_back(slot.clone());
        stream.last_from = from;
        stream.next_from = None;
        crate::metrics::read_ahead(false);
        let (state, tp, id, log, end) = (self.clone(), tp.clone(), stream.id, stream.log.clone(), stream.end);
        // glommio may run a task it is given at once: nothing of the streams stays borrowed.
        drop(streams);
        glommio::spawn_local(async move {
            // A read that fails is not kept: the fetch reads again and meets the error itself.
            let read = log.read_until_at_most(from, max_bytes, end).await.ok();
            let next = read
                .as_ref()
                .filter(|read| came_back_full(read, max_bytes) && read.next_offset < end)
                .map(|read| read.next_offset);
            *slot.read.borrow_mut() = Some(read);
            slot.done.notify(usize::MAX);
            state.read_done(&tp, id, from, next);
        })
        .detach();
    }

    /// A read of `tp`'s stream `id` from `from` is done; the stream goes on from `next`, if it is the
    /// stream's last range.
    fn read_done(self: &Rc<Self>, tp: &TopicPartition, id: u64, from: Offset, next: Option<Offset>) {
        {
            let mut streams = self.streams.borrow_mut();
            let Some(stream) = streams.get_mut(tp).filter(|stream| stream.id == id && stream.last_from == from) else {
                return;
            };
            stream.next_from = next;
        }
        self.top_up(tp);
    }

    /// Puts what a fetch left of the range it took back in front of `tp`'s stream `id` (if it still
    /// is), as the range from `from`, if the budget has room.
    fn put_back(&self, tp: &TopicPartition, id: u64, from: Offset, rest: LogRead) {
        let mut streams = self.streams.borrow_mut();
        let Some(stream) = streams.get_mut(tp).filter(|stream| stream.id == id) else { return };
        let bytes = rest.bytes.len();
        if self.held_bytes.get() + bytes > self.budget_bytes {
            // The next fetch reads for itself, and the stream begins anew after it.
            streams.remove(tp);
            return;
        }
        stream.ranges.push_front(self.slot(from, bytes, Some(rest)));
    }

    /// A range from `from` counted as `bytes` of the budget until it goes: read already, or to be read.
    fn slot(&self, from: Offset, bytes: usize, read: Option<LogRead>) -> Rc<Slot> {
        self.held_bytes.set(self.held_bytes.get() + bytes);
        let held = Held { bytes, total: self.held_bytes.clone() };
        let read = RefCell::new(read.map(Some));
        Rc::new(Slot { from, read, done: event_listener::Event::new(), _held: held })
    }

    fn drop_stream(&self, tp: &TopicPartition, id: u64) {
        let mut streams = self.streams.borrow_mut();
        if streams.get(tp).is_some_and(|stream| stream.id == id) {
            streams.remove(tp);
        }
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

    /// Runs `test` on a glommio executor (read-ahead spawns its reads there) with a log of 80 batches of
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
                for _ in 0..80 {
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

    /// Read-ahead within `budget_bytes`, the log's end, and a first fetch of `tp()` from offset 0 that came
    /// back full, with its stream started.
    async fn first_fetch(log: &Rc<PartitionLog<SimFs>>, budget_bytes: usize) -> (ReadAhead<SimFs>, Offset, LogRead) {
        let ahead = ReadAhead::new(budget_bytes);
        let end = log.log_end_offset();
        let first = log.read_until_at_most(Offset(0), READ, end).await.unwrap();
        ahead.after_fetch(&tp(), log, &first, READ, end);
        (ahead, end, first)
    }

    /// Ranges `tp`'s stream holds, read or being read.
    fn ranges_of(ahead: &ReadAhead<SimFs>, tp: &TopicPartition) -> usize {
        ahead.state.streams.borrow().get(tp).map_or(0, |stream| stream.ranges.len())
    }

    /// Lets the reads under way finish.
    async fn reads_run() {
        glommio::timer::sleep(std::time::Duration::from_millis(5)).await;
    }

    #[test]
    fn a_consumer_reading_to_the_end_takes_every_range_from_the_stream_exactly_as_it_would_have_read_it() {
        with_log(|_dir, log| {
            Box::pin(async move {
                let ahead = ReadAhead::new(1 << 20);
                let end = log.log_end_offset();
                let mut read = log.read_until_at_most(Offset(0), READ, end).await.unwrap();
                let (mut fetches, mut taken, mut most_held) = (0, 0, 0);
                while read.next_offset < end {
                    ahead.after_fetch(&tp(), &log, &read, READ, end);
                    // The consumer is busy with the answer: the stream reads on meanwhile.
                    reads_run().await;
                    most_held = most_held.max(ahead.held_bytes());
                    let from = read.next_offset;
                    let plain = log.read_until_at_most(from, READ, end).await.unwrap();
                    fetches += 1;
                    if let Some(from_stream) = ahead.take(&tp(), &log, from, READ, end, false).await {
                        assert_eq!(from_stream, plain, "the range read ahead from {from:?}");
                        taken += 1;
                    }
                    read = plain;
                }
                assert!(fetches >= 4, "the log is several ranges long ({fetches})");
                assert_eq!(taken, fetches, "every fetch after the first was read ahead");
                assert_eq!(most_held, DEPTH_MAX * READ, "the stream read {DEPTH_MAX} ranges ahead, no more");
                reads_run().await;
                assert_eq!(ahead.held_bytes(), 0, "nothing read past the end");
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
                assert!(ahead.take(&tp(), &log, next.plus(1), READ, end, false).await.is_none(), "another offset");
                let held = ahead.held_bytes();
                assert!(held > 0 && held <= DEPTH_MAX * READ);
                ahead.after_fetch(&tp(), &log, &first, READ, end);
                assert_eq!(ahead.held_bytes(), held, "the same fetch again keeps the stream and reads nothing more");
                assert!(
                    ahead.take(&tp(), &log, next, READ, end, false).await.is_some(),
                    "a reader at another offset left it to the one it was made for"
                );
                ahead.after_fetch(&tp(), &log, &first, READ, end);
                assert!(ahead.take(&tp(), &log, next, READ, Offset(end.0 - 1), false).await.is_none(), "a lower bound");
                ahead.after_fetch(&tp(), &log, &first, READ, end);
                // Less room than one batch of this log: nothing fits, as the fetch's own read would find,
                // and the range stays for the next fetch; the first partition of a fetch gets it whole.
                let little = 8 << 10;
                let nothing = ahead.take(&tp(), &log, next, little, end, false).await.expect("known to not fit");
                assert!(nothing.bytes.is_empty() && nothing.next_offset == next);
                let whole = ahead.take(&tp(), &log, next, little, end, true).await.expect("the first batch whole");
                assert_eq!(whole, log.read_until(next, little, end).await.unwrap());
                let range = log.read_until_at_most(next, READ, end).await.unwrap();
                let rest = ahead.take(&tp(), &log, whole.next_offset, READ, end, false).await.expect("the rest");
                assert_eq!([whole.bytes.as_ref(), rest.bytes.as_ref()].concat(), range.bytes.to_vec());

                // The range read ahead is cut away and written again with other records (a follower
                // truncating to its new leader's log): the bytes read ahead are not what the log holds.
                ahead.after_fetch(&tp(), &log, &first, READ, end);
                reads_run().await; // the read ahead is done
                log.truncate_to(next.plus(1)).await.unwrap();
                let other = vec![9u8; 8 << 10];
                while log.log_end_offset() < end {
                    log.append(&build_batch(1_700_000_000_000, &[&other]), LeaderEpoch(1)).await.unwrap();
                }
                log.flush().await.unwrap();
                assert!(ahead.take(&tp(), &log, next, READ, end, false).await.is_none(), "bytes were removed");

                // DeleteRecords moves the log start past the range read ahead, inside its segment.
                let again = log.read_until_at_most(Offset(0), READ, end).await.unwrap();
                ahead.after_fetch(&tp(), &log, &again, READ, end);
                reads_run().await; // the read ahead is done
                log.delete_records(again.next_offset.plus(2)).await.unwrap();
                assert!(
                    ahead.take(&tp(), &log, again.next_offset, READ, end, false).await.is_none(),
                    "records were deleted"
                );
                reads_run().await;
                assert_eq!(ahead.held_bytes(), 0);
            })
        });
    }

    #[test]
    fn reads_ahead_stay_within_the_budget_and_expire_when_nobody_asks() {
        with_log(|_dir, log| {
            Box::pin(async move {
                let (ahead, end, first) = first_fetch(&log, READ).await;
                ahead.after_fetch(&TopicPartition::new("t", 1), &log, &first, READ, end);
                assert_eq!(ahead.held_bytes(), READ, "the second is over the budget");
                assert!(
                    ahead.take(&TopicPartition::new("t", 1), &log, first.next_offset, READ, end, false).await.is_none()
                );

                let small = log.read_until_at_most(Offset(0), READ / 2 - 1, end).await.unwrap();
                let none = ReadAhead::new(1 << 20);
                none.after_fetch(&tp(), &log, &small, READ, end);
                assert_eq!(none.held_bytes(), 0, "a fetch that did not come back full reads nothing ahead");

                ahead.expire(Instant::now() + KEEP);
                assert!(
                    ahead.take(&tp(), &log, first.next_offset, READ, end, false).await.is_none(),
                    "nobody asked in time"
                );
                reads_run().await; // its read is done
                assert_eq!(ahead.held_bytes(), 0);
            })
        });
    }

    #[test]
    fn a_stream_reads_deep_only_into_half_the_budget_so_another_partition_still_gets_its_next_range() {
        with_log(|_dir, log| {
            Box::pin(async move {
                let (ahead, end, first) = first_fetch(&log, 2 * READ).await;
                reads_run().await; // the first range is read
                assert_eq!(ahead.held_bytes(), READ, "no second range past half the budget");
                let other = TopicPartition::new("t", 1);
                ahead.after_fetch(&other, &log, &first, READ, end);
                assert_eq!(ahead.held_bytes(), 2 * READ, "the other partition's next range is read");
                assert!(ahead.take(&other, &log, first.next_offset, READ, end, false).await.is_some());
            })
        });
    }

    #[test]
    fn many_streams_reading_deep_hold_no_more_than_the_budget_and_deep_ranges_no_more_than_half() {
        with_log(|_dir, log| {
            Box::pin(async move {
                let budget = 6 * READ;
                let (ahead, end, first) = first_fetch(&log, budget).await;
                let partitions: Vec<_> = (0..8).map(|p| TopicPartition::new("t", p)).collect();
                let mut most_held = 0;
                for tp in &partitions {
                    ahead.after_fetch(tp, &log, &first, READ, end);
                    most_held = most_held.max(ahead.held_bytes());
                    reads_run().await;
                    most_held = most_held.max(ahead.held_bytes());
                }
                assert_eq!(most_held, budget, "the budget is used, and no more");
                // The first stream read three deep (its first range, then two behind it within half the
                // budget); the next three got their first range only; the others none yet.
                let ranges: Vec<_> = partitions.iter().map(|tp| ranges_of(&ahead, tp)).collect();
                assert_eq!(ranges, [3, 1, 1, 1, 0, 0, 0, 0]);
                // The first stream's next range taken: it reads on only while the shard holds less than
                // half the budget.
                assert!(ahead.take(&partitions[0], &log, first.next_offset, READ, end, false).await.is_some());
                reads_run().await;
                assert!(ahead.held_bytes() <= budget);
                assert_eq!(ranges_of(&ahead, &partitions[0]), 2, "no range behind the first past half the budget");
            })
        });
    }

    #[test]
    fn a_fetch_with_less_room_takes_what_fits_of_the_range_and_the_next_fetch_takes_the_rest() {
        with_log(|_dir, log| {
            Box::pin(async move {
                let (ahead, end, first) = first_fetch(&log, 1 << 20).await;
                let next = first.next_offset;
                let head = ahead.take(&tp(), &log, next, READ / 2, end, false).await.expect("what fits");
                assert_eq!(head, log.read_until_at_most(next, READ / 2, end).await.unwrap());
                let rest = ahead.take(&tp(), &log, head.next_offset, READ, end, false).await.expect("the rest");
                let range = log.read_until_at_most(next, READ, end).await.unwrap();
                assert_eq!(rest.next_offset, range.next_offset, "the rest ends where the range read ahead ended");
                assert_eq!([head.bytes.as_ref(), rest.bytes.as_ref()].concat(), range.bytes.to_vec());
                // The stream went on behind the rest: the fetch after it takes the next range.
                let after = ahead.take(&tp(), &log, rest.next_offset, READ, end, false).await.expect("the next range");
                assert_eq!(after, log.read_until_at_most(rest.next_offset, READ, end).await.unwrap());
            })
        });
    }

    #[test]
    fn a_stream_begun_by_a_fetch_with_little_room_reads_more_once_the_fetches_have_more() {
        with_log(|_dir, log| {
            Box::pin(async move {
                let (ahead, end, first) = first_fetch(&log, 1 << 20).await;
                let mut at = first.next_offset;
                let mut sizes = Vec::new();
                // The ranges read before the room grew are taken first, then the ones read after.
                for _ in 0..=DEPTH_MAX {
                    reads_run().await;
                    let read = ahead.take(&tp(), &log, at, 2 * READ, end, false).await.expect("read ahead");
                    let direct = log.read_until_at_most(at, 2 * READ, end).await.unwrap();
                    assert!(direct.bytes.starts_with(&read.bytes), "whole batches from the same place");
                    ahead.after_fetch(&tp(), &log, &read, 2 * READ, end);
                    sizes.push(read.bytes.len());
                    at = read.next_offset;
                }
                assert!(sizes[..DEPTH_MAX].iter().all(|&size| size <= READ), "read before the room grew: {sizes:?}");
                assert!(sizes[DEPTH_MAX] > READ, "read after: {sizes:?}");
            })
        });
    }
}
