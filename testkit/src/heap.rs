//! A counting global allocator, for benches that print the heap a structure takes: exact live
//! bytes while counting is on, and no counting overhead in the timings outside it.
//!
//! A bench installs it with
//! `#[global_allocator] static HEAP: ferrolb_testkit::heap::Counting = ferrolb_testkit::heap::Counting;`
//! and measures with [`measure`], or with [`start`], [`live_bytes`] and [`stop`].

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicIsize, Ordering};

/// The system allocator, counting live bytes while counting is on.
pub struct Counting;

static LIVE_BYTES: AtomicIsize = AtomicIsize::new(0);
static COUNTING: AtomicBool = AtomicBool::new(false);

fn count(delta: isize) {
    if COUNTING.load(Ordering::Relaxed) {
        LIVE_BYTES.fetch_add(delta, Ordering::Relaxed);
    }
}

/// Turns counting on, from zero.
pub fn start() {
    LIVE_BYTES.store(0, Ordering::Relaxed);
    COUNTING.store(true, Ordering::Relaxed);
}

/// Turns counting off.
pub fn stop() {
    COUNTING.store(false, Ordering::Relaxed);
}

/// Bytes allocated and not freed since [`start`] (negative when more was freed than allocated).
pub fn live_bytes() -> isize {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// `make`'s result and the heap bytes it left allocated.
pub fn measure<T>(make: impl FnOnce() -> T) -> (T, isize) {
    start();
    let value = make();
    stop();
    (value, live_bytes())
}

// The workspace denies unsafe code; a global allocator cannot be written without it. It only
// forwards to the system allocator and counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(-(layout.size() as isize));
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size() as isize);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size as isize - layout.size() as isize);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
