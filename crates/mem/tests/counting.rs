//! The counting allocator counts what is live through every kind of call (valgrind runs
//! this in the test script, for its unsafe blocks).

#![allow(clippy::unwrap_used)]

use stateplane_mem::counting::{Counting, held_by};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn what_is_made_and_kept_is_counted_and_what_is_freed_is_not() {
    let (v, bytes) = held_by(|| vec![7u8; 1000]);
    assert_eq!(bytes, 1000);
    let (zeroed, bytes) = held_by(|| vec![0u64; 512]);
    assert_eq!(bytes, 4096, "alloc_zeroed");
    let (grown, bytes) = held_by(move || {
        let mut v = v;
        v.reserve_exact(3000);
        v
    });
    assert_eq!(
        (bytes, grown.capacity()),
        (3000, 4000),
        "realloc counts the difference"
    );
    let ((), bytes) = held_by(|| {
        let scratch: Vec<u32> = (0..10_000).collect();
        assert_eq!(scratch.len(), 10_000);
    });
    assert_eq!(bytes, 0, "made and freed");
    let ((), bytes) = held_by(move || drop((grown, zeroed)));
    assert_eq!(bytes, -8096);
}
