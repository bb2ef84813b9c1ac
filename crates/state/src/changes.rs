//! The changes of synced state, as the worker's sync stage takes them. A tracked register
//! (and the count-min sketch built on one) marks the block of cells each change falls in,
//! and keeps a copy of its cells as they were at the last take; a take compares the marked
//! blocks with that copy and reports each cell that differs, once, with its value then and
//! now. This is dirty-page tracking, as live migration of virtual machines does it: the
//! data plane's path pays one byte stored per change, the take pays for the blocks changed
//! however often each changed, and state that is not tracked pays one predictable branch.
//! A register whose takes find most of its blocks marked stops marking and is compared
//! whole at each take until few change (a sketch under traffic: `Register::take_changes`).
//! (A tracked exact table marks its slots itself, and saves each one's entry at its first
//! write instead of keeping a copy: [`crate::exact::ExactTable::take_written_slots`].)
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
    /// Marks of [`BLOCK`] cells.
    pub fn new(cells: usize) -> Dirty {
        let shift = BLOCK.trailing_zeros();
        Dirty {
            marks: vec![0; cells.div_ceil(1 << shift)].into_boxed_slice(),
            cells,
            shift,
        }
    }

    /// Cell `cell` may have changed (`cell` is below the cells this was made for).
    #[inline]
    pub fn mark(&mut self, cell: usize) {
        self.marker().mark(cell);
    }

    pub fn mark_all(&mut self) {
        self.marks.fill(1);
    }

    /// Clears every mark, for a take that compares every block whatever is marked.
    pub fn unmark_all(&mut self) {
        self.marks.fill(0);
    }

    /// The marks as a [`Marker`], for many marks in a row: what a mark reads is then held
    /// in registers, where each [`Dirty::mark`] loads it again (the compiler cannot tell a
    /// mark's byte from the fields it reads).
    #[inline]
    pub fn marker(&mut self) -> Marker<'_> {
        Marker {
            marks: &mut self.marks,
            shift: self.shift,
        }
    }

    /// The block of cell `cell`.
    #[inline]
    pub fn block_of(&self, cell: usize) -> usize {
        cell >> self.shift
    }

    /// How many blocks the cells make.
    pub fn blocks(&self) -> usize {
        self.marks.len()
    }

    /// The cells of block `block`.
    pub fn cells_of(&self, block: usize) -> Range<usize> {
        let start = block << self.shift;
        start..(start + (1 << self.shift)).min(self.cells)
    }

    /// Unmarks block `block`; whether it was marked.
    #[inline]
    pub fn unmark(&mut self, block: usize) -> bool {
        std::mem::take(&mut self.marks[block]) != 0
    }

    /// How many blocks are marked.
    pub fn marked(&self) -> usize {
        self.marks.iter().filter(|&&m| m != 0).count()
    }

    /// Copies each marked block of `cells` into `copy` and unmarks it.
    pub fn copy_marked<T: Copy>(&mut self, cells: &[T], copy: &mut [T]) {
        self.take(|block| copy[block.clone()].copy_from_slice(&cells[block]));
    }

    /// Takes `other`'s marks as these (`other`: for as many cells).
    pub fn copy_from(&mut self, other: &Dirty) {
        self.marks.copy_from_slice(&other.marks);
    }

    /// Whether a block of cells `cells` is marked.
    pub fn any_in(&self, cells: Range<usize>) -> bool {
        if cells.is_empty() {
            return false;
        }
        let (first, last) = (self.block_of(cells.start), self.block_of(cells.end - 1));
        self.marks
            .get(first..=last.min(self.marks.len().saturating_sub(1)))
            .is_some_and(|m| m.iter().any(|&b| b != 0))
    }

    /// Moves `other`'s marks into these (`other`: for as many cells), leaving it unmarked.
    pub fn absorb(&mut self, other: &mut Dirty) {
        for (mine, theirs) in self.marks.iter_mut().zip(other.marks.iter_mut()) {
            *mine |= std::mem::take(theirs);
        }
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

/// A [`Dirty`]'s marks, borrowed for a run of marks ([`Dirty::marker`]).
pub struct Marker<'a> {
    marks: &'a mut [u8],
    shift: u32,
}

impl Marker<'_> {
    /// Cell `cell` may have changed (`cell` is below the cells the marks were made for).
    #[inline]
    pub fn mark(&mut self, cell: usize) {
        self.marks[cell >> self.shift] = 1;
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
    }
}
