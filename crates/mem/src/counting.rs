//! An allocator that counts the bytes live, for tests that check what a structure tells
//! the [`budget`](crate::budget) against what it allocates. A test binary installs it
//! with `#[global_allocator] static A: Counting = Counting;`.
//!
//! Must never: change what is allocated; it only counts.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, Ordering};

/// The system allocator, counting the bytes live (in the whole process).
pub struct Counting;

static LIVE: AtomicI64 = AtomicI64::new(0);

// SAFETY: every call goes to the system allocator unchanged; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: the caller's layout, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: `ptr` came from this allocator with `layout`, as the caller promises.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: `ptr` came from this allocator with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// `make`'s result, and the bytes live after it returns less those before: what it made
/// holds, where nothing else allocates meanwhile.
pub fn held_by<T>(make: impl FnOnce() -> T) -> (T, i64) {
    let before = LIVE.load(Ordering::Relaxed);
    let made = make();
    (made, LIVE.load(Ordering::Relaxed) - before)
}

/// Checks what a structure tells the budget (`told`) against what it took (`taken`,
/// from [`held_by`]): never less, and not more than `slack` times over. Prints both for
/// the test's log.
pub fn assert_told_enough(what: &str, told: u64, taken: i64, slack: u64) {
    eprintln!("{what}: {taken} bytes taken, {told} told");
    assert!(
        told >= taken.max(0) as u64,
        "{what}: told {told}, took {taken}"
    );
    assert!(
        told <= slack * taken.max(1) as u64,
        "{what}: told {told}, far over the {taken} taken"
    );
}
