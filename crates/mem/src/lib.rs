//! Memory backed by huge pages where the system gives them.
//!
//! Owns: the one `madvise(MADV_HUGEPAGE)` call of the project, and the shapes that use it:
//! [`huge_vec`] (a vector whose pages are advised before anything touches them, for large
//! tables), [`lazy_zeroed_vec`] (the same, all zero bytes, whose pages the kernel supplies
//! only when first touched, for tables that use a growing prefix of a fixed budget) and
//! [`HUGE_PAGE`]-aligned windows of them; [`populate`] and [`reserve_populated`], the
//! one `madvise(MADV_POPULATE_WRITE)` call, which has the kernel supply a buffer's pages
//! before the time-critical code that fills it; and [`prefetch`], the project's one
//! cache-line hint (tables and caches warm the lines a batch will read); and the run's memory
//! [`budget`], which what sizes itself from the configuration claims before allocating,
//! and the [`counting`] allocator its tests check those claims with.
//!
//! Must never: change what memory holds or how long it lives; advice is only about page
//! size and when pages arrive, and where the kernel refuses it everything works the same,
//! only slower.
//!
//! Large replay buffers and tables touch far more memory than the TLB covers with 4 KiB
//! pages; 2 MiB pages roughly halve the cost of a bare packet loop on this kind of machine,
//! and save a page walk per lookup in tables of hundreds of megabytes.

pub mod budget;
pub mod counting;

/// Asks the CPU to start loading the cache line of `value`: a hint with no effect on
/// results, so that a batch can start every lookup's memory read before it needs any.
#[inline(always)]
pub fn prefetch<T>(value: &T) {
    prefetch_line((value as *const T).cast());
}

/// [`prefetch`] of every cache line `value` covers: for records that straddle lines.
#[inline(always)]
pub fn prefetch_whole<T>(value: &T) {
    let first = (value as *const T).cast::<u8>();
    each_line(first as usize, size_of::<T>(), |offset| {
        prefetch_line(first.wrapping_add(offset));
    });
}

/// Calls `visit` with an offset inside a value of `size` bytes at address `start` in each
/// 64-byte cache line it covers: its first byte, then each later line's first byte. (A
/// plain loop: an iterator chain here measured a third slower in the aggregator.)
#[inline(always)]
fn each_line(start: usize, size: usize, mut visit: impl FnMut(usize)) {
    let last = start + size.max(1) - 1;
    let mut line = start & !63;
    while line <= last {
        visit(line.max(start) - start);
        line += 64;
    }
}

#[inline(always)]
fn prefetch_line(address: *const u8) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        use std::arch::x86_64::{_MM_HINT_T0, _mm_prefetch};
        // SAFETY: SSE is part of the x86-64 baseline, and a prefetch is a hint that never
        // faults or changes memory, whatever the address (here, always one inside a live
        // reference's value).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(address.cast()) };
    }
    #[cfg(any(not(target_arch = "x86_64"), miri))]
    let _ = address;
}

/// Size of a huge page on x86-64 and aarch64 with 4 KiB base pages.
pub const HUGE_PAGE: usize = 2 << 20;

/// The whole pages of `page` bytes (a power of two) inside `[start, start + len)`, as
/// `(first, bytes)`; `None` where not one fits.
fn whole_pages(start: usize, len: usize, page: usize) -> Option<(usize, usize)> {
    let first = start.next_multiple_of(page);
    let end = (start + len) / page * page;
    (end > first).then(|| (first, end - first))
}

/// Advises the kernel to back the 2 MiB-aligned pages inside `[start, start + len)` with
/// huge pages; returns whether it accepted. The range must lie inside one allocation that
/// the caller owns (the advice itself changes neither contents nor validity).
fn advise(start: usize, len: usize) -> bool {
    let Some((first, window)) = whole_pages(start, len, HUGE_PAGE) else {
        return false;
    };
    // SAFETY: [first, first + window) lies inside the caller's allocation (whole_pages
    // keeps it within [start, start + len)). MADV_HUGEPAGE is advice about page size only:
    // it changes neither the contents nor the validity of the memory, so no Rust reference
    // is affected.
    let rc = unsafe { libc::madvise(first as *mut libc::c_void, window, libc::MADV_HUGEPAGE) };
    rc == 0
}

/// Size of a base page on x86-64 (and on aarch64 with 4 KiB pages; with larger pages the
/// kernel refuses a range not aligned to them, and [`populate`] does nothing).
const BASE_PAGE: usize = 4096;

/// Has the kernel supply now, writable, every whole page of `[start, start + len)` (its
/// bytes unchanged), as the first write to each would; returns whether it did (Linux 5.14
/// and later). The range must lie inside one allocation that the caller owns.
fn populate_range(start: usize, len: usize) -> bool {
    let Some((first, bytes)) = whole_pages(start, len, BASE_PAGE).filter(|_| !cfg!(miri)) else {
        return false;
    };
    // SAFETY: [first, first + bytes) lies inside the caller's allocation (whole_pages
    // keeps it within [start, start + len)). MADV_POPULATE_WRITE faults the pages in as a
    // write would but writes nothing: neither the contents nor the validity of the memory
    // change, so no Rust reference is affected.
    let rc = unsafe { libc::madvise(first as *mut libc::c_void, bytes, libc::MADV_POPULATE_WRITE) };
    rc == 0
}

/// Has the kernel supply the pages of `values` now, their contents unchanged, so that the
/// first writes to them take no page fault (docs/SYNC.md, "Exact tables": a first write
/// of 65,536 connections spent most of its time on the target in them); whether it did.
/// Memory the kernel supplies lazily (a large zeroed vector, [`lazy_zeroed_vec`]) becomes
/// resident.
pub fn populate<T>(values: &mut [T]) -> bool {
    populate_range(values.as_mut_ptr() as usize, size_of_val(values))
}

/// Makes room in `v` for `more` values beyond its length and has the kernel supply that
/// room's pages now (as [`populate`]), so that filling it later neither moves the vector
/// nor takes a page fault; whether the kernel did. The vector's values are unchanged.
pub fn reserve_populated<T>(v: &mut Vec<T>, more: usize) -> bool {
    v.reserve_exact(more);
    let room = v.spare_capacity_mut();
    populate_range(room.as_mut_ptr() as usize, size_of_val(room))
}

/// A vector of `n` copies of `fill` whose pages are advised huge before they are first
/// touched (so the advice decides their size); returns whether the kernel accepted.
/// `want_huge` false never asks (for comparisons).
pub fn huge_vec<T: Clone>(n: usize, fill: T, want_huge: bool) -> (Vec<T>, bool) {
    let bytes = n.saturating_mul(size_of::<T>());
    if !want_huge || bytes < 2 * HUGE_PAGE {
        return (vec![fill; n], false);
    }
    // A fresh allocation this large comes from the kernel untouched; advise, then fill.
    let mut v: Vec<T> = Vec::with_capacity(n);
    let huge = advise(v.as_mut_ptr() as usize, bytes);
    v.resize(n, fill);
    (v, huge)
}

/// A vector of `n` all-zero values whose memory is not touched here: a large one comes
/// straight from the kernel (`calloc` of a fresh mapping), whose pages are zero-filled on
/// first touch, so that a table using a prefix of it costs only that prefix in time and
/// resident memory. Pages are advised huge as in [`huge_vec`].
pub fn lazy_zeroed_vec<T: bytemuck::Zeroable>(n: usize, want_huge: bool) -> (Vec<T>, bool) {
    let v: Vec<T> = bytemuck::allocation::zeroed_vec(n);
    let bytes = n.saturating_mul(size_of::<T>());
    let huge = want_huge && bytes >= 2 * HUGE_PAGE && advise(v.as_ptr() as usize, bytes);
    (v, huge)
}

/// Bytes, zeroed, with huge-page advice: the replay buffers' shape.
pub fn huge_bytes(len: usize, want_huge: bool) -> (Vec<u8>, bool) {
    huge_vec(len, 0u8, want_huge)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filled_and_usable_with_or_without_advice() {
        for (n, want) in [
            (10, true),
            (3 * HUGE_PAGE / 8 + 5, true),
            (3 * HUGE_PAGE / 8 + 5, false),
        ] {
            let (mut v, huge) = huge_vec(n, 7u64, want);
            assert_eq!(v.len(), n);
            assert!(v.iter().all(|&x| x == 7));
            v[n - 1] = 9;
            assert_eq!(v[n - 1], 9);
            if !want || n * 8 < 2 * HUGE_PAGE {
                assert!(!huge);
            }
        }
        let (b, _) = huge_bytes(5 * HUGE_PAGE, true);
        assert!(b.iter().all(|&x| x == 0));
    }

    /// A lazily zeroed vector reads as zeros and is usable, small or large; a large one is
    /// not resident until touched (its pages come on first touch).
    #[test]
    fn lazy_zeroed_reads_zero_and_stays_untouched() {
        for (n, want) in [
            (10, true),
            (5 * HUGE_PAGE / 8, true),
            (5 * HUGE_PAGE / 8, false),
        ] {
            let (mut v, _) = lazy_zeroed_vec::<u64>(n, want);
            assert_eq!(v.len(), n);
            v[n - 1] = 9;
            assert_eq!(v[n - 1], 9);
            assert!(v[..n - 1].iter().all(|&x| x == 0));
        }
        let resident = || budget::resident(budget::Resident::Now);
        let before = resident();
        let (v, _) = lazy_zeroed_vec::<u64>(512 << 20 >> 3, true); // 512 MiB, untouched
        let after = resident();
        if let (Some(b), Some(a)) = (before, after) {
            assert!(a < b + (64 << 20), "{b} B resident before, {a} B after");
        }
        drop(v);
    }

    /// Populated memory is resident afterwards, its values unchanged.
    #[test]
    fn populated_memory_is_resident() {
        let resident = || budget::resident(budget::Resident::Now);
        let n = 256 << 20 >> 3; // 256 MiB of u64, lazily zeroed: not resident yet
        let (mut v, _) = lazy_zeroed_vec::<u64>(n, false);
        v[12345] = 7;
        let before = resident();
        // Linux 5.14 and later (the machines this project runs its suite on) take it.
        assert!(populate(&mut v), "the kernel refused MADV_POPULATE_WRITE");
        let after = resident();
        assert!(
            v.iter()
                .enumerate()
                .all(|(i, &x)| x == u64::from(i == 12345) * 7)
        );
        let (Some(before), Some(after)) = (before, after) else {
            panic!("no resident memory figure from /proc/self/statm");
        };
        assert!(
            after >= before + (200 << 20),
            "{before} B resident before, {after} B after"
        );
    }

    /// Populating keeps every value, within a page's edges or across them; room reserved
    /// populated is there, and the vector's values are unchanged. (Under valgrind in the
    /// test script: `populate_keeps`; valgrind's own zeroed allocations are resident at
    /// once, so the test above cannot run there.)
    #[test]
    fn populate_keeps_values_and_reserves_room() {
        let mut v: Vec<u64> = (0..3 * BASE_PAGE as u64).collect();
        for range in [0..v.len(), 1..v.len() - 1, 5..6, 700..5000] {
            assert_eq!(
                populate(&mut v[range.clone()]),
                range.len() * 8 >= 2 * BASE_PAGE
            );
            assert!(v.iter().enumerate().all(|(i, &x)| x == i as u64));
        }
        let mut w: Vec<u32> = (0..1000).collect();
        assert!(reserve_populated(&mut w, 3 << 20));
        assert!(w.capacity() >= 1000 + (3 << 20));
        assert_eq!(w, (0..1000).collect::<Vec<u32>>());
        let at = w.as_ptr();
        w.extend(0..3 << 20);
        assert_eq!(w.as_ptr(), at, "the room was made once");
        // Nothing to populate: no whole page, or none at all.
        assert!(!populate::<u8>(&mut []));
        assert!(!reserve_populated(&mut Vec::<u8>::new(), 10));
        assert!(!populate(&mut [1u8; 100][..]));
    }

    /// `prefetch_whole` touches one address in every line a value covers, and only
    /// addresses inside the value.
    #[test]
    fn whole_prefetch_covers_each_line_once_and_stays_inside() {
        for start in [0, 1, 8, 63, 64, 100, 4095] {
            for size in [0, 1, 2, 40, 63, 64, 65, 88, 128, 130, 200] {
                let mut offsets = Vec::new();
                each_line(start, size, |o| offsets.push(o));
                let lines: Vec<usize> = offsets.iter().map(|o| (start + o) / 64).collect();
                let first_line = start / 64;
                let last_line = (start + size.max(1) - 1) / 64;
                assert_eq!(
                    lines,
                    (first_line..=last_line).collect::<Vec<_>>(),
                    "start {start}, size {size}"
                );
                assert_eq!(offsets[0], 0);
                assert!(offsets.iter().all(|&o| o < size.max(1)), "{offsets:?}");
            }
        }
        // And on real values (the hint reads nothing back).
        let records = vec![[3u64; 11]; 8];
        records.iter().for_each(prefetch_whole);
        prefetch_whole(&());
    }
}
