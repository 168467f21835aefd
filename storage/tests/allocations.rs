//! The append path allocates nothing per batch: heap allocations made while appending are counted by a
//! counting allocator, on this test's thread only.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::path::Path;

use futures_lite::future::block_on;
use shardlog_storage::fs::sim::SimFs;
use shardlog_storage::log::OpenHints;
use shardlog_storage::{LeaderEpoch, LogConfig, PartitionLog};

use common::{ManualClock, make_batch};

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call goes to the system allocator unchanged; the count is a thread-local cell (const
// initialised, so touching it never allocates).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
        }
        // SAFETY: the caller's layout goes to the system allocator as it came.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `alloc` above with this layout, that is from the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Heap allocations `f` makes on this thread.
fn allocations_of<T>(f: impl FnOnce() -> T) -> (T, u64) {
    ALLOCATIONS.with(|n| n.set(0));
    COUNTING.with(|c| c.set(true));
    let out = f();
    COUNTING.with(|c| c.set(false));
    (out, ALLOCATIONS.with(Cell::get))
}

#[test]
fn appending_a_batch_allocates_nothing_beyond_the_tail_and_index_growing() {
    let fs = SimFs::new();
    let clock = ManualClock::new(1_700_000_000_000);
    let config = LogConfig { retention_ms: None, ..LogConfig::default() };
    let log = block_on(PartitionLog::open(fs, clock, Path::new("/data/t-0"), config, OpenHints::default())).unwrap().0;
    let batch = make_batch(0, 8, 110, 1_700_000_000_000);
    // 10 MB in memory: below the unwritten-bytes bound, so no write-out comes between (the simulated
    // disk keeps its own copies of what is written).
    let appends = (10 << 20) / batch.len();
    block_on(log.append(&batch, LeaderEpoch(1))).unwrap();
    let (last, allocations) = allocations_of(|| {
        block_on(async {
            let mut last = None;
            for _ in 0..appends {
                last = Some(log.append(&batch, LeaderEpoch(1)).await.unwrap());
            }
            last.unwrap()
        })
    });
    assert_eq!(last.base_offset.0, appends as u64 * 8);
    // The tail's buffers (doubling to 1 MiB, then one per MiB) and the sparse indexes' vectors doubling.
    assert!(allocations < appends as u64 / 50, "{allocations} allocations for {appends} appends");
}
