//! A counting global allocator, for measuring heap allocations per request in benchmarks.
//! Compiled only with the `alloc-count` feature; the binary then installs it as
//! `#[global_allocator]` around the allocator it uses anyway, so a counted build allocates
//! exactly like a production one.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicU64, Ordering};

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

/// Counts every allocation (and reallocation), then delegates to `A`.
pub struct CountingAllocator<A>(pub A);

// SAFETY: every method delegates to the inner allocator with the caller's arguments
// unchanged; the only addition is a relaxed counter increment. Needed because allocation
// counts per request are a reported benchmark metric (measured, not estimated); the feature
// is off by default.
unsafe impl<A: GlobalAlloc> GlobalAlloc for CountingAllocator<A> {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged; the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { self.0.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by the inner allocator with `layout` (every
        // allocation goes there).
        unsafe { self.0.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged.
        unsafe { self.0.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: forwarded unchanged; `ptr`/`layout` come from the inner allocator.
        unsafe { self.0.realloc(ptr, layout, new_size) }
    }
}

/// Allocations so far (process-wide).
pub fn allocations() -> u64 {
    ALLOCATIONS.load(Ordering::Relaxed)
}
