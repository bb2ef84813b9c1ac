//! Zeroed byte buffers backed by huge pages where the system gives them.
//!
//! Large replay traces and tables touch far more memory than the TLB covers with 4 KiB
//! pages; 2 MiB pages roughly halve the cost of a bare packet loop on this kind of machine.
//! The buffer asks for transparent huge pages with `madvise(MADV_HUGEPAGE)` over a
//! 2 MiB-aligned window of an ordinary allocation, and works the same (only slower) where
//! the kernel says no.

/// Size of a huge page on x86-64 and aarch64 with 4 KiB base pages.
pub const HUGE_PAGE: usize = 2 << 20;

/// A zeroed, fixed-size buffer whose pages are huge where the kernel allows.
pub struct HugeBuf {
    storage: Vec<u8>,
    start: usize,
    len: usize,
    huge: bool,
}

impl HugeBuf {
    /// A zeroed buffer of `len` bytes; `want_huge` false never asks for huge pages.
    pub fn new(len: usize, want_huge: bool) -> Self {
        if !want_huge || len < HUGE_PAGE {
            return HugeBuf {
                storage: vec![0u8; len],
                start: 0,
                len,
                huge: false,
            };
        }
        // Over-allocate so that a 2 MiB-aligned window of `len` bytes fits. `vec![0; n]`
        // takes fresh zero pages from the kernel for sizes like these, so advice given now,
        // before the first touch, decides the page size.
        let storage = vec![0u8; len + HUGE_PAGE];
        let base = storage.as_ptr() as usize;
        let start = base.next_multiple_of(HUGE_PAGE) - base;
        let window = len.next_multiple_of(HUGE_PAGE).min(storage.len() - start);
        // SAFETY: the range [base + start, base + start + window) lies inside `storage`'s
        // allocation (start < HUGE_PAGE and window <= storage.len() - start), which lives as
        // long as `self`. MADV_HUGEPAGE is advice about page size only: it changes neither
        // the contents nor the validity of the memory, so no Rust reference is affected.
        let rc = unsafe {
            libc::madvise(
                (base + start) as *mut libc::c_void,
                window,
                libc::MADV_HUGEPAGE,
            )
        };
        HugeBuf {
            storage,
            start,
            len,
            huge: rc == 0,
        }
    }

    /// Whether the kernel accepted the huge-page advice.
    pub fn is_huge(&self) -> bool {
        self.huge
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_writable_and_aligned() {
        for (len, want) in [
            (100, true),
            (3 * HUGE_PAGE + 5, true),
            (3 * HUGE_PAGE + 5, false),
        ] {
            let mut b = HugeBuf::new(len, want);
            assert_eq!(b.len(), len);
            assert!(b.as_slice().iter().all(|&x| x == 0));
            b.as_mut_slice()[len - 1] = 7;
            assert_eq!(b.as_slice()[len - 1], 7);
            if b.is_huge() {
                assert_eq!(b.as_slice().as_ptr() as usize % HUGE_PAGE, 0);
            }
        }
    }
}
