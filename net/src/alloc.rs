//! The allocator for processes that decode Kafka requests: the system allocator, except that very large
//! allocations are reserved as address space (anonymous `mmap` with `MAP_NORESERVE`) and take memory
//! only where they are written.
//!
//! Why it exists: `kafka-protocol` 0.18 sizes a decoded array from its length prefix before it reads a
//! single element. A 14-byte Metadata request that claims 2^31 topics asks for tens of gigabytes up
//! front; the system allocator refuses a request larger than memory, and Rust answers a refused
//! allocation by aborting the process, so one bad frame would stop the broker. Reserved instead, the
//! decode reads the elements that are really there, fails with an error at the end of the frame, and
//! hands back the reservation with only the pages it wrote committed (the frame size bounds those).
//!
//! What it must never do: change the behaviour of ordinary allocations (they go to the system
//! allocator unchanged), or hand out memory that is not zero when zeroed memory is asked for.
//!
//! Limits: address space is 128 TiB; a claimed array costs at most 2^32 times its element size (a few
//! TiB) and is released as soon as its decode fails. Under `vm.overcommit_memory = 2` the kernel ignores
//! `MAP_NORESERVE` and large claims are refused (and the process aborts) as before.
//!
//! Register it in a binary or test with `#[global_allocator] static ALLOC: ReservingAllocator = ReservingAllocator;`.

use std::alloc::{GlobalAlloc, Layout, System};

/// Allocations of this size or more are reserved with `mmap` rather than taken from the system allocator.
pub const RESERVE_THRESHOLD_BYTES: usize = 256 << 20;
/// `mmap` returns page-aligned memory; larger alignments go to the system allocator.
const PAGE_BYTES: usize = 4096;

/// See the module documentation.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReservingAllocator;

/// Keeps allocations below 64 MiB in glibc's heap. By default glibc maps every allocation of 128 KiB or
/// more separately and unmaps it on free: request frames, record batches and fetch answers of that size
/// come and go with every request, and each unmap costs page faults on the next use and a TLB shootdown
/// on every core. Likewise glibc gives the top of the heap back to the kernel whenever 128 KiB there
/// are free, and the next large request faults it in again; up to 256 MiB of free heap is kept instead.
/// Call once at the start of a binary, before threads start.
pub fn keep_request_buffers_in_the_heap() {
    // SAFETY: mallopt only changes glibc's allocation thresholds; called before other threads exist.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 64 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}

fn reserved(layout: Layout) -> bool {
    layout.size() >= RESERVE_THRESHOLD_BYTES && layout.align() <= PAGE_BYTES
}

// SAFETY: every method upholds GlobalAlloc's contract: reservations are page-aligned (enough for any
// layout routed to them), at least `layout.size()` long, zero-filled by the kernel, and released with
// the same length; everything else is passed to `System` with the caller's own guarantees.
unsafe impl GlobalAlloc for ReservingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if !reserved(layout) {
            // SAFETY: forwarded with the caller's guarantees (non-zero size).
            return unsafe { System.alloc(layout) };
        }
        // SAFETY: an anonymous private mapping with no address hint touches no existing memory.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                layout.size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED { std::ptr::null_mut() } else { ptr.cast() }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if !reserved(layout) {
            // SAFETY: forwarded with the caller's guarantees.
            return unsafe { System.alloc_zeroed(layout) };
        }
        // SAFETY: as `alloc`; anonymous mappings read as zero.
        unsafe { self.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if !reserved(layout) {
            // SAFETY: `ptr` came from `System.alloc` with this layout (same routing as `alloc`).
            unsafe { System.dealloc(ptr, layout) };
            return;
        }
        // SAFETY: `ptr` is a mapping of `layout.size()` bytes made by `alloc`.
        let unmapped = unsafe { libc::munmap(ptr.cast(), layout.size()) };
        if unmapped != 0 {
            // A broken invariant, but an allocator must not unwind (nor allocate to report it).
            std::process::abort();
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: the caller guarantees `new_size` is valid for `layout.align()`.
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match (reserved(layout), reserved(new_layout)) {
            // SAFETY: both sides are the system allocator's, as `alloc` routed them.
            (false, false) => return unsafe { System.realloc(ptr, layout, new_size) },
            (true, true) => {
                // Moves the pages rather than copying them: a reservation may be mostly untouched.
                // SAFETY: `ptr` is a mapping of `layout.size()` bytes made by `alloc`.
                let moved = unsafe { libc::mremap(ptr.cast(), layout.size(), new_size, libc::MREMAP_MAYMOVE) };
                return if moved == libc::MAP_FAILED { std::ptr::null_mut() } else { moved.cast() };
            }
            _ => {}
        }
        // Between the two routes: a fresh block, the smaller length copied (below the threshold, so
        // cheap), the old block freed by its own route.
        // SAFETY: as described; `new` does not overlap `ptr`.
        unsafe {
            let new = self.alloc(new_layout);
            if !new.is_null() {
                std::ptr::copy_nonoverlapping(ptr, new, layout.size().min(new_size));
                self.dealloc(ptr, layout);
            }
            new
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_far_beyond_memory_is_reserved_and_released() {
        let allocator = ReservingAllocator;
        // 1 TiB: more than any test machine has, so the system allocator would refuse it.
        let layout = Layout::from_size_align(1 << 40, 8).unwrap();
        // SAFETY: non-zero size; the block is written within bounds and freed with its layout.
        unsafe {
            let ptr = allocator.alloc_zeroed(layout);
            assert!(!ptr.is_null());
            assert_eq!(*ptr.add(12345), 0);
            *ptr.add((1 << 40) - 1) = 7;
            let grown = allocator.realloc(ptr, layout, (1 << 40) + 4096);
            assert!(!grown.is_null());
            assert_eq!(*grown.add((1 << 40) - 1), 7, "realloc keeps the contents");
            allocator.dealloc(grown, Layout::from_size_align(layout.size() + 4096, 8).unwrap());
        }
    }

    #[test]
    fn ordinary_allocations_go_to_the_system_allocator_and_can_grow_into_reservations() {
        let allocator = ReservingAllocator;
        let small = Layout::from_size_align(100, 8).unwrap();
        // SAFETY: as above.
        unsafe {
            let ptr = allocator.alloc(small);
            ptr.write_bytes(3, 100);
            let big = allocator.realloc(ptr, small, RESERVE_THRESHOLD_BYTES);
            assert_eq!(std::slice::from_raw_parts(big, 100), &[3u8; 100][..]);
            let back = allocator.realloc(big, Layout::from_size_align(RESERVE_THRESHOLD_BYTES, 8).unwrap(), 50);
            assert_eq!(std::slice::from_raw_parts(back, 50), &[3u8; 50][..]);
            allocator.dealloc(back, Layout::from_size_align(50, 8).unwrap());
        }
    }
}
