//! The changes of synced state, as the worker's sync stage takes them. A tracked register
//! (and the count-min sketch built on one) marks the block of cells each change falls in
//! (a tracked exact table, the slot), and keeps a copy of its cells as they were at the
//! last take; a take compares the marked
//! blocks with that copy and reports each cell that differs, once, with its value then and
//! now. This is dirty-page tracking, as live migration of virtual machines does it: the
//! data plane's path pays one bit set per change, the take pays for the blocks changed
//! however often each changed, and state that is not tracked pays one predictable branch.
//!
//! Must never: miss a cell changed since the last take, or report one that is back where
//! it was then.

use std::ops::Range;

pub use stateplane_api::Change;

/// Cells per mark of a register: a take looks at all of a marked block's cells.
pub const BLOCK: usize = 16;

/// One byte per block of cells, set when a cell of the block may have changed since the
/// last take. A byte, not a bit: marking is then a store alone, which the next mark of a
/// nearby cell need not wait for (a bit's read-modify-write of a shared word chains each
/// mark on the one before).
#[derive(Clone, Debug)]
pub struct Dirty {
    marks: Box<[u8]>,
    cells: usize,
    /// log2 of the cells a mark covers.
    shift: u32,
}

impl Dirty {
    /// Marks of [`BLOCK`] cells: a register's, whose cells cost a word's compare each.
    pub fn new(cells: usize) -> Dirty {
        Dirty::with_block(cells, BLOCK.trailing_zeros())
    }

    /// A mark per cell: a table's, whose cells (slots) cost an entry's encoding each.
    pub fn per_cell(cells: usize) -> Dirty {
        Dirty::with_block(cells, 0)
    }

    fn with_block(cells: usize, shift: u32) -> Dirty {
        Dirty {
            marks: vec![0; cells.div_ceil(1 << shift)].into_boxed_slice(),
            cells,
            shift,
        }
    }

    /// Cell `cell` may have changed (`cell` is below the cells this was made for).
    #[inline]
    pub fn mark(&mut self, cell: usize) {
        self.marks[cell >> self.shift] = 1;
    }

    /// Cell `cell` may have changed in the ways of `bits` (a caller's own kinds of change,
    /// kept together until the take: [`Dirty::take_cells`]).
    #[inline]
    pub fn mark_as(&mut self, cell: usize, bits: u8) {
        self.marks[cell >> self.shift] |= bits;
    }

    /// As [`Dirty::take`] for marks of one cell each ([`Dirty::per_cell`]): calls `each`
    /// with every marked cell, in order, and the bits it was marked with.
    pub fn take_cells(&mut self, mut each: impl FnMut(usize, u8)) {
        debug_assert_eq!(self.shift, 0, "marks of one cell each");
        const WORD: usize = 8;
        for (c, chunk) in self.marks.chunks_mut(WORD).enumerate() {
            if unmarked(chunk) {
                continue;
            }
            for (i, mark) in chunk.iter_mut().enumerate() {
                let bits = std::mem::take(mark);
                if bits != 0 {
                    each(c * WORD + i, bits);
                }
            }
        }
    }

    /// Whether cell `cell` may have changed since the last take.
    #[inline]
    pub fn is_marked(&self, cell: usize) -> bool {
        self.marks.get(cell >> self.shift).is_some_and(|&m| m != 0)
    }

    pub fn mark_all(&mut self) {
        self.marks.fill(1);
    }

    /// Calls `each` with the cells of every marked block, in order, and clears the marks.
    pub fn take(&mut self, mut each: impl FnMut(Range<usize>)) {
        const WORD: usize = 8;
        let (cells, block) = (self.cells, 1 << self.shift);
        let mut visit = |b: usize| {
            let start = b * block;
            each(start..(start + block).min(cells));
        };
        let tail = self.marks.len() / WORD * WORD;
        let mut chunks = self.marks.chunks_exact_mut(WORD);
        for (c, chunk) in chunks.by_ref().enumerate() {
            // Eight blocks at a time: most are unmarked when the changes are few.
            if unmarked(chunk) {
                continue;
            }
            for (i, mark) in chunk.iter_mut().enumerate() {
                if std::mem::take(mark) != 0 {
                    visit(c * WORD + i);
                }
            }
        }
        for (i, mark) in chunks.into_remainder().iter_mut().enumerate() {
            if std::mem::take(mark) != 0 {
                visit(tail + i);
            }
        }
    }
}

/// Whether no mark of `chunk` is set: eight at one load where it holds eight (a byte at a
/// time, the scan of a large table's marks measured a quarter of its take).
#[inline]
fn unmarked(chunk: &[u8]) -> bool {
    match <[u8; 8]>::try_from(chunk) {
        Ok(eight) => u64::from_ne_bytes(eight) == 0,
        Err(_) => chunk.iter().all(|&m| m == 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marked_blocks_come_back_once_in_order_and_never_past_the_end() {
        let mut d = Dirty::new(BLOCK * 70 + 3);
        for cell in [BLOCK * 70 + 2, 5, 6, BLOCK * 65, BLOCK * 65 + 1] {
            d.mark(cell);
        }
        let mut got = Vec::new();
        d.take(|r| got.push(r));
        assert_eq!(
            got,
            [0..BLOCK, BLOCK * 65..BLOCK * 66, BLOCK * 70..BLOCK * 70 + 3]
        );
        got.clear();
        d.take(|r| got.push(r));
        assert!(got.is_empty(), "the marks were cleared");
        d.mark_all();
        d.take(|r| got.push(r));
        assert_eq!(got.len(), 71, "every block, none past the last cell");
        assert_eq!(got.last(), Some(&(BLOCK * 70..BLOCK * 70 + 3)));
        let mut d = Dirty::per_cell(20);
        d.mark(19);
        d.mark(3);
        got.clear();
        d.take(|r| got.push(r));
        assert_eq!(got, [3..4, 19..20], "a table's marks are a slot each");
        let mut d = Dirty::per_cell(20);
        d.mark_as(19, 1);
        d.mark_as(19, 2);
        d.mark_as(4, 1);
        let mut cells = Vec::new();
        d.take_cells(|cell, bits| cells.push((cell, bits)));
        assert_eq!(
            cells,
            [(4, 1), (19, 3)],
            "each cell once, its kinds together"
        );
        cells.clear();
        d.take_cells(|cell, bits| cells.push((cell, bits)));
        assert!(cells.is_empty());
    }
}
