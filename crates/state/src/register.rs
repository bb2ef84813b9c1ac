//! Registers (typed arrays indexed by the data plane and the control plane) and indexed
//! packet/byte counters built on them.

use crate::changes::{Change, Dirty};

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

/// A cell's value as synced state reports it: one 64-bit word.
pub trait Word: Copy {
    fn word(&self) -> u64;
}

macro_rules! word_of_unsigned {
    ($($t:ty),*) => {$(
        impl Word for $t {
            #[inline]
            fn word(&self) -> u64 {
                u64::from(*self)
            }
        }
    )*};
}
word_of_unsigned!(u8, u16, u32, u64);

/// Where a register is synced: its state id, and what its changes since the last take need
/// (`changes`): the marks of the blocks changed, and the cells as they were at the last
/// take (a copy as large as the register).
#[derive(Debug, Clone)]
struct Tracked<T> {
    state: u16,
    first: u32,
    dirty: Dirty,
    taken: Box<[T]>,
}

/// A fixed-size array of `T`, zeroed (default) at creation.
#[derive(Debug, Clone)]
pub struct Register<T: Copy + Default> {
    cells: Box<[T]>,
    tracked: Option<Tracked<T>>,
}

impl<T: Copy + Default> Register<T> {
    pub fn new(size: usize) -> Self {
        Register {
            cells: vec![T::default(); size].into_boxed_slice(),
            tracked: None,
        }
    }

    /// Tracks every change of a cell from now on as state `state`, for the sync stage
    /// ([`Register::take_changes`]); cell `i` is the state's location `first + i` (a state
    /// made of several registers gives each its own `first`). The cells as they are now
    /// are what the first take compares with.
    pub fn track(&mut self, state: u16, first: u32)
    where
        T: Word,
    {
        self.tracked = Some(Tracked {
            state,
            first,
            dirty: Dirty::new(self.cells.len()),
            taken: self.cells.clone(),
        });
    }

    /// Cell `index` may have changed: marks it if the register is tracked.
    #[inline]
    fn changed(&mut self, index: usize) {
        if let Some(tracked) = &mut self.tracked {
            tracked.dirty.mark(index);
        }
    }

    /// Appends to `out` each cell whose word differs from the last take's (or from the
    /// start of tracking), with both words; nothing if the register is not tracked.
    pub fn take_changes(&mut self, out: &mut Vec<Change>)
    where
        T: Word,
    {
        let Some(Tracked {
            state,
            first,
            dirty,
            taken,
        }) = &mut self.tracked
        else {
            return;
        };
        let cells = &self.cells;
        dirty.take(|block| {
            let start = block.start;
            let then = &mut taken[block.clone()];
            for (i, (now, then)) in cells[block].iter().zip(then).enumerate() {
                let (old, new) = (then.word(), now.word());
                if old != new {
                    out.push(Change {
                        state: *state,
                        index: first.wrapping_add((start + i) as u32),
                        old,
                        new,
                        exact: false,
                    });
                    *then = *now;
                }
            }
        });
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
        self.changed(index);
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
            let i = index % n;
            f(&mut self.cells[i]);
            self.changed(i);
        }
    }

    pub fn as_slice(&self) -> &[T] {
        &self.cells
    }

    /// Sets every cell back to its default (e.g. counters reset every interval).
    pub fn clear(&mut self) {
        self.cells.fill(T::default());
        if let Some(tracked) = &mut self.tracked {
            tracked.dirty.mark_all();
        }
    }
}

/// Packets and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacketBytes {
    pub packets: u64,
    pub bytes: u64,
}

/// A counter's packets are its word when synced (its bytes are not).
impl Word for PacketBytes {
    #[inline]
    fn word(&self) -> u64 {
        self.packets
    }
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

    /// A tracked register reports each cell changed since the last take once, by write,
    /// update and clear, and none that is back where it was; one not tracked reports none.
    #[test]
    fn a_tracked_register_reports_each_change_and_an_untracked_one_none() {
        let mut got = Vec::new();
        let mut quiet: Register<u64> = Register::new(4);
        quiet.write(1, 5).unwrap();
        quiet.update(2, |x| *x += 1);
        quiet.take_changes(&mut got);
        assert!(got.is_empty());
        let mut r: Register<u64> = Register::new(200);
        r.write(3, 9).unwrap();
        r.track(7, 0);
        r.write(1, 5).unwrap();
        r.write(1, 6).unwrap();
        r.update(202, |x| *x += 3);
        r.update(150, |x| *x += 1);
        r.update(150, |x| *x -= 1);
        r.take_changes(&mut got);
        let c = |index, old, new| Change {
            state: 7,
            index,
            old,
            new,
            exact: false,
        };
        assert_eq!(
            got,
            [c(1, 0, 6), c(2, 0, 3)],
            "each cell once, with its value at the start of tracking; 150 is back"
        );
        got.clear();
        r.take_changes(&mut got);
        assert!(got.is_empty(), "nothing since the last take");
        r.clear();
        r.take_changes(&mut got);
        assert_eq!(got, [c(1, 6, 0), c(2, 3, 0), c(3, 9, 0)]);
        let mut counters: Counters = Register::new(2);
        counters.track(1, 10);
        counters.count(0, 100);
        got.clear();
        counters.take_changes(&mut got);
        assert_eq!(
            got,
            [Change {
                state: 1,
                ..c(10, 0, 1)
            }],
            "packets are the word, cell 0 is location 10"
        );
    }

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
