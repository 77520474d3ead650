//! A counting global allocator, for measuring heap allocations per request in benchmarks.
//! Compiled only with the `alloc-count` feature; the binary installs it as
//! `#[global_allocator]` then.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Counts every allocation (and reallocation), then delegates to the system allocator.
pub struct CountingAllocator;

// SAFETY: every method delegates to `System` with the caller's arguments unchanged; the only
// addition is a relaxed counter increment. Needed because allocation counts per request are a
// reported benchmark metric (measured, not estimated); the feature is off by default.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged; the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` with `layout` (every allocation goes there).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged; `ptr`/`layout` come from `System`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Allocations so far (process-wide).
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}
