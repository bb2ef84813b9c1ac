//! Zeroed byte buffers backed by huge pages where the system gives them (replay traces);
//! the advice itself is `stateplane_mem`'s.

pub use stateplane_mem::HUGE_PAGE;

/// A zeroed, fixed-size buffer whose pages are huge where the kernel allows.
pub struct HugeBuf {
    storage: Vec<u8>,
    huge: bool,
}

impl HugeBuf {
    /// A zeroed buffer of `len` bytes; `want_huge` false never asks for huge pages.
    pub fn new(len: usize, want_huge: bool) -> Self {
        let (storage, huge) = stateplane_mem::huge_bytes(len, want_huge);
        HugeBuf { storage, huge }
    }

    /// Whether the kernel accepted the huge-page advice.
    pub fn is_huge(&self) -> bool {
        self.huge
    }

    pub fn len(&self) -> usize {
        self.storage.len()
    }

    pub fn is_empty(&self) -> bool {
        self.storage.is_empty()
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.storage
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zeroed_and_writable() {
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
            assert!(want || !b.is_huge());
        }
    }
}
