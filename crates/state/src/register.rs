//! Registers (typed arrays indexed by the data plane and the control plane) and indexed
//! packet/byte counters built on them.

/// An index past the end, for the control plane's error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfRange {
    pub index: usize,
    pub size: usize,
}

impl std::fmt::Display for OutOfRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "index {} is out of range (size {})",
            self.index, self.size
        )
    }
}

/// A fixed-size array of `T`, zeroed (default) at creation.
#[derive(Debug, Clone)]
pub struct Register<T: Copy + Default> {
    cells: Box<[T]>,
}

impl<T: Copy + Default> Register<T> {
    pub fn new(size: usize) -> Self {
        Register {
            cells: vec![T::default(); size].into_boxed_slice(),
        }
    }

    pub fn len(&self) -> usize {
        self.cells.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }

    pub fn read(&self, index: usize) -> Result<T, OutOfRange> {
        self.cells.get(index).copied().ok_or(OutOfRange {
            index,
            size: self.cells.len(),
        })
    }

    pub fn write(&mut self, index: usize, value: T) -> Result<(), OutOfRange> {
        let size = self.cells.len();
        let cell = self
            .cells
            .get_mut(index)
            .ok_or(OutOfRange { index, size })?;
        *cell = value;
        Ok(())
    }

    /// The cells `[start, end)`, for a control-plane read of a range.
    pub fn range(&self, start: usize, end: usize) -> Result<&[T], OutOfRange> {
        let size = self.cells.len();
        if start > end || end > size {
            return Err(OutOfRange { index: end, size });
        }
        Ok(&self.cells[start..end])
    }

    /// The data plane's read-modify-write of one cell (indices come from the program, which
    /// reduces them modulo the size, so this never fails).
    #[inline]
    pub fn update(&mut self, index: usize, f: impl FnOnce(&mut T)) {
        let n = self.cells.len();
        if n > 0 {
            f(&mut self.cells[index % n]);
        }
    }

    pub fn as_slice(&self) -> &[T] {
        &self.cells
    }

    /// Sets every cell back to its default (e.g. counters reset every interval).
    pub fn clear(&mut self) {
        self.cells.fill(T::default());
    }
}

/// Packets and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacketBytes {
    pub packets: u64,
    pub bytes: u64,
}

/// Indexed packet and byte counters (P4 `Counter`, type packets_and_bytes).
pub type Counters = Register<PacketBytes>;

impl Register<PacketBytes> {
    /// Counts one packet of `bytes` at `index` (modulo the size).
    #[inline]
    pub fn count(&mut self, index: usize, bytes: u32) {
        self.update(index, |c| {
            c.packets += 1;
            c.bytes += u64::from(bytes);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_writes_ranges_and_errors() {
        let mut r: Register<u32> = Register::new(8);
        r.write(3, 7).unwrap();
        assert_eq!(r.read(3), Ok(7));
        assert_eq!(r.read(8), Err(OutOfRange { index: 8, size: 8 }));
        assert_eq!(r.write(9, 1), Err(OutOfRange { index: 9, size: 8 }));
        assert_eq!(r.range(2, 5).unwrap(), &[0, 7, 0]);
        assert!(r.range(5, 9).is_err());
        r.update(11, |x| *x += 1); // 11 mod 8 = 3
        assert_eq!(r.read(3), Ok(8));
        let mut c: Counters = Register::new(4);
        c.count(1, 100);
        c.count(5, 60);
        assert_eq!(
            c.read(1).unwrap(),
            PacketBytes {
                packets: 2,
                bytes: 160
            }
        );
        c.clear();
        assert_eq!(c.read(1).unwrap(), PacketBytes::default());
    }
}
