//! Registers (typed arrays indexed by the data plane and the control plane) and indexed
//! packet/byte counters built on them.

use std::ops::Range;

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

/// A cell's values as synced state reports them: a 64-bit word for each of its `LANES`
/// (one for a number; a counter's packets and bytes are two, each its own declared
/// state). Lane 0 is [`Word::word`], the one a snapshot reads. Invariant: the lanes are
/// the whole of a cell's value (two cells with the same lanes are the same).
pub trait Word: Copy {
    /// At most [`MAX_LANES`].
    const LANES: usize = 1;

    fn word(&self) -> u64;

    /// The word of lane `lane` (below `LANES`).
    #[inline]
    fn lane(&self, lane: usize) -> u64 {
        debug_assert!(lane < Self::LANES);
        self.word()
    }

    /// Sets lane `lane` (below `LANES`) to `word`, cut to the lane's width (whoever
    /// writes a declared register checks a value against its width first).
    fn set_lane(&mut self, lane: usize, word: u64);

    /// Whether `self` and `other` hold the same value: every lane the same (a cell's lanes
    /// are the whole of its value).
    #[inline]
    fn same(&self, other: &Self) -> bool {
        (0..Self::LANES.min(MAX_LANES)).all(|lane| self.lane(lane) == other.lane(lane))
    }
}

/// The most lanes a cell has ([`Word::LANES`]).
pub const MAX_LANES: usize = 2;

macro_rules! word_of_unsigned {
    ($($t:ty),*) => {$(
        impl Word for $t {
            #[inline]
            fn word(&self) -> u64 {
                u64::from(*self)
            }

            fn set_lane(&mut self, lane: usize, word: u64) {
                debug_assert_eq!(lane, 0);
                *self = word as $t;
            }
        }
    )*};
}
word_of_unsigned!(u8, u16, u32, u64);

/// Where a register is synced or snapshotted: the state each tracked lane of its cells is
/// (its id and first location), the marks of the blocks changed since the last take, and
/// the cells as they were at the last take (a copy as large as the register).
///
/// A snapshot (`snapshot_begin`) is a take that the reader makes a block at a time while
/// the data plane goes on writing (RedPlane's lazy snapshotting, its Appendix A): `taken`
/// is the second copy, `pending` marks the blocks changed before the snapshot began that
/// `taken` does not have yet. A write to a pending block first copies the block into
/// `taken` (the paper's "first packet to update an index synchronizes the two copies"),
/// and so does the reader's visit; every block's `taken` is then the cells as they were
/// when the snapshot began.
///
/// A synced register whose takes find most of its blocks changed (a count-min sketch
/// under traffic, every counter changing between two passes) stops marking: its takes
/// compare every cell, which they nearly did already, and the data plane's updates pay
/// nothing for the tracking. It marks again once a take finds few blocks changed
/// ([`Tracked::marks_next`]).
#[derive(Debug, Clone)]
struct Tracked<T> {
    /// By lane: `(state, first)`, cell `i` being the state's location `first + i`.
    lanes: [Option<(u16, u32)>; MAX_LANES],
    /// Whether the data plane marks the blocks it changes in `dirty`. Invariant: while it
    /// does not, the next take compares every block, and no snapshot is pending.
    marking: bool,
    dirty: Dirty,
    taken: Box<[T]>,
    pending: Dirty,
    /// Blocks marked in `pending` (0: no snapshot is being read, and a write looks no
    /// further than this).
    pending_blocks: usize,
    /// The blocks the snapshot begun last found changed since the one before began.
    changed: Dirty,
}

impl<T: Copy> Tracked<T> {
    /// Whether the takes after one that found `changed` of `blocks` blocks changed should
    /// find them by marks: not once half change, when a take compares little less than
    /// every cell anyway; again once fewer than an eighth do, when comparing every cell
    /// costs a take eight times what the changes do. The gap keeps a rate near either
    /// end from switching at every take.
    fn marks_next(&self, changed: usize, blocks: usize) -> bool {
        if self.marking {
            changed * 2 < blocks
        } else {
            changed * 8 < blocks
        }
    }

    /// Brings pending block `block` of `cells` into `taken` before anything changes it.
    #[inline]
    fn settle(&mut self, cells: &[T], block: usize) {
        if self.pending.unmark(block) {
            let range = self.pending.cells_of(block);
            self.taken[range.clone()].copy_from_slice(&cells[range]);
            self.pending_blocks -= 1;
        }
    }
}

/// `index` reduced modulo `n` (not 0), by a comparison where it is below `n` already, as a
/// program's indexes mostly are: a division takes tens of cycles, and a count-min sketch
/// makes one for each of its rows at every packet.
#[inline]
fn within(index: usize, n: usize) -> usize {
    if index < n { index } else { index % n }
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
    /// ([`Register::take_changes`]) or the snapshots of bounded replication
    /// ([`Register::snapshot_begin`]); cell `i` is the state's location `first + i` (a
    /// state made of several registers gives each its own `first`). The cells as they are
    /// now are what the first take compares with.
    pub fn track(&mut self, state: u16, first: u32)
    where
        T: Word,
    {
        self.tracked = None;
        self.track_lane(0, state, first);
    }

    /// Tracks lane `lane` of the cells ([`Word::lane`]) as state `state` from location
    /// `first`, beside the lanes tracked already; `false` (nothing tracked) for a lane
    /// the cells do not have, or for more cells than a state's locations count (a `u32`).
    /// The register's first lane tracked starts the tracking as [`Register::track`] does; a later one reports at the next take the cells changed
    /// since the last, so its lanes are tracked before the data plane writes (as a
    /// program's are, when it is built).
    pub fn track_lane(&mut self, lane: usize, state: u16, first: u32) -> bool
    where
        T: Word,
    {
        if lane >= T::LANES.min(MAX_LANES) || u32::try_from(self.cells.len()).is_err() {
            return false;
        }
        let cells = &self.cells;
        let tracked = self.tracked.get_or_insert_with(|| Tracked {
            lanes: [None; MAX_LANES],
            marking: true,
            dirty: Dirty::new(cells.len()),
            taken: cells.clone(),
            pending: Dirty::new(cells.len()),
            pending_blocks: 0,
            changed: Dirty::new(cells.len()),
        });
        tracked.lanes[lane] = Some((state, first));
        true
    }

    /// The lane tracked as state `state`, if one is.
    pub fn lane_of(&self, state: u16) -> Option<usize> {
        let tracked = self.tracked.as_ref()?;
        (tracked.lanes.iter()).position(|l| l.is_some_and(|(s, _)| s == state))
    }

    /// The states tracked, `(state, cells)` lane by lane.
    pub fn tracked_states(&self) -> impl Iterator<Item = (u16, u32)> + '_ {
        // A register tracked has at most a state's locations (`track_lane`).
        let cells = u32::try_from(self.cells.len()).unwrap_or(u32::MAX);
        (self.tracked.iter())
            .flat_map(|t| t.lanes.iter().flatten())
            .map(move |&(state, _)| (state, cells))
    }

    /// Cell `index` is about to change: marks it if the register is tracked (and, while a
    /// snapshot is read, keeps its block's value for the snapshot first).
    #[inline]
    fn changing(&mut self, index: usize) {
        if let Some(tracked) = &mut self.tracked {
            if tracked.pending_blocks > 0 {
                let block = tracked.dirty.block_of(index);
                tracked.settle(&self.cells, block);
            }
            if tracked.marking {
                tracked.dirty.mark(index);
            }
        }
    }

    /// Starts a snapshot of the cells as they are now, to be read with
    /// [`Register::snapshot_read`] while the data plane goes on writing; `false` (and
    /// nothing started) if the register is not tracked. A snapshot begun before this one
    /// and not read to its end is given up (what it had not read is read by this one).
    /// A register snapshotted must not be synced: both use the last take.
    pub fn snapshot_begin(&mut self) -> bool {
        let Some(tracked) = &mut self.tracked else {
            return false;
        };
        if !tracked.marking {
            // Synced and snapshotted both (which must not be): every block may have
            // changed since the last take.
            tracked.dirty.mark_all();
            tracked.marking = true;
        }
        tracked.pending.absorb(&mut tracked.dirty);
        tracked.pending_blocks = tracked.pending.marked();
        tracked.changed.copy_from(&tracked.pending);
        true
    }
    /// Reads the snapshot begun last: the words of cells `first, first + 1, ...` as they
    /// were when it began, into `out`; how many were read (fewer past the end, none if the
    /// register is not tracked). A snapshot is read to its end once its cells have all
    /// been read (in any order, any number of times).
    pub fn snapshot_read(&mut self, first: usize, out: &mut [u64]) -> usize
    where
        T: Word,
    {
        let Some(tracked) = &mut self.tracked else {
            return 0;
        };
        let end = (first + out.len()).min(self.cells.len());
        if first >= end {
            return 0;
        }
        if tracked.pending_blocks > 0 {
            for block in tracked.dirty.block_of(first)..=tracked.dirty.block_of(end - 1) {
                tracked.settle(&self.cells, block);
            }
        }
        for (word, cell) in out.iter_mut().zip(&tracked.taken[first..end]) {
            *word = cell.word();
        }
        end - first
    }

    /// Whether any of cells `first .. first + len` may differ in the snapshot begun last
    /// from the one begun before it (always, for a register not tracked): the reader of
    /// a snapshot may keep what it read of them last time.
    pub fn snapshot_changed(&self, first: usize, len: usize) -> bool {
        self.tracked
            .as_ref()
            .is_none_or(|t| t.changed.any_in(first..(first + len).min(self.cells.len())))
    }

    /// Whether a snapshot is being read: some of its blocks are not read yet.
    pub fn snapshot_pending(&self) -> bool {
        self.tracked.as_ref().is_some_and(|t| t.pending_blocks > 0)
    }

    /// Appends to `out`, for each cell and tracked lane whose word differs from the last
    /// take's (or from the start of tracking), the change with both words, lane after
    /// lane of a cell; nothing if the register is not tracked.
    pub fn take_changes(&mut self, out: &mut Vec<Change>)
    where
        T: Word,
    {
        let Some(tracked) = &mut self.tracked else {
            return;
        };
        let Tracked {
            lanes,
            dirty,
            taken,
            marking,
            ..
        } = tracked;
        // `(lane, state, first)` of each lane tracked, in order.
        let mut active = [(0, 0, 0); MAX_LANES];
        let mut tracked_lanes = 0;
        for (lane, l) in lanes.iter().enumerate().take(T::LANES.min(MAX_LANES)) {
            if let Some((state, first)) = *l {
                active[tracked_lanes] = (lane, state, first);
                tracked_lanes += 1;
            }
        }
        let active = &active[..tracked_lanes];
        let cells = &self.cells;
        let mut changed = 0;
        let mut compare = |block: Range<usize>| {
            let start = block.start;
            let reported = out.len();
            let then = &mut taken[block.clone()];
            for (i, (now, then)) in cells[block].iter().zip(then).enumerate() {
                // Most cells of a block are as they were: one comparison a lane passes them.
                if now.same(then) {
                    continue;
                }
                for &(lane, state, first) in active {
                    let (old, new) = (then.lane(lane), now.lane(lane));
                    if old != new {
                        out.push(Change {
                            state,
                            index: first.wrapping_add((start + i) as u32),
                            old,
                            new,
                            exact: false,
                            by_write: false,
                        });
                    }
                }
                *then = *now;
            }
            changed += usize::from(out.len() > reported);
        };
        if *marking {
            dirty.take(&mut compare);
        } else {
            // Marks a write or a clear made meanwhile say nothing the comparison misses.
            dirty.unmark_all();
            (0..dirty.blocks()).for_each(|block| compare(dirty.cells_of(block)));
        }
        let blocks = dirty.blocks();
        tracked.marking = tracked.marks_next(changed, blocks);
    }

    /// Whether the data plane's updates mark the blocks they change (see [`Tracked`]);
    /// `false` for a register not tracked.
    pub fn marks_changes(&self) -> bool {
        self.tracked.as_ref().is_some_and(|t| t.marking)
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
        if index >= size {
            return Err(OutOfRange { index, size });
        }
        self.changing(index);
        self.cells[index] = value;
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
            let i = within(index, n);
            self.changing(i);
            f(&mut self.cells[i]);
        }
    }

    /// The data plane's read-modify-write of several cells, `f` applied to the cell of each
    /// index in turn, as [`Register::update`] does to one: a tracked register's tracking is
    /// looked at once for all of them, and its marks' array held in registers (a count-min
    /// sketch's rows at every packet: docs/BENCHMARKS.md, "What syncing costs the data
    /// plane"), or no mark made while its takes compare every cell.
    #[inline]
    pub fn update_each(
        &mut self,
        indexes: impl IntoIterator<Item = usize>,
        mut f: impl FnMut(&mut T),
    ) {
        let n = self.cells.len();
        if n == 0 {
            return;
        }
        let cells = &mut self.cells;
        let marker = match &mut self.tracked {
            None => None,
            // A snapshot is being read: each cell's block is settled first, as one at a time.
            Some(tracked) if tracked.pending_blocks > 0 => {
                for i in indexes {
                    self.update(i, &mut f);
                }
                return;
            }
            // None while tracked by comparing every cell.
            Some(tracked) => tracked.marking.then(|| tracked.dirty.marker()),
        };
        match marker {
            Some(mut marker) => {
                for i in indexes {
                    let i = within(i, n);
                    marker.mark(i);
                    f(&mut cells[i]);
                }
            }
            None => {
                for i in indexes {
                    f(&mut cells[within(i, n)]);
                }
            }
        }
    }

    pub fn as_slice(&self) -> &[T] {
        &self.cells
    }

    /// Sets every cell back to its default (e.g. counters reset every interval).
    pub fn clear(&mut self) {
        if let Some(tracked) = &mut self.tracked {
            if tracked.pending_blocks > 0 {
                tracked.pending.copy_marked(&self.cells, &mut tracked.taken);
                tracked.pending_blocks = 0;
            }
            tracked.dirty.mark_all();
        }
        self.cells.fill(T::default());
    }
}

/// Packets and bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PacketBytes {
    pub packets: u64,
    pub bytes: u64,
}

/// A counter's packets are its first lane when synced, its bytes the second.
impl Word for PacketBytes {
    const LANES: usize = 2;

    #[inline]
    fn word(&self) -> u64 {
        self.packets
    }

    #[inline]
    fn lane(&self, lane: usize) -> u64 {
        if lane == 0 { self.packets } else { self.bytes }
    }

    fn set_lane(&mut self, lane: usize, word: u64) {
        if lane == 0 {
            self.packets = word;
        } else {
            self.bytes = word;
        }
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
    use crate::changes::BLOCK;

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
            by_write: false,
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

    /// A counter's bytes are a second lane, tracked as a state of their own: each lane
    /// reports its own changes under its own id and locations, and one lane untracked
    /// reports nothing.
    #[test]
    fn each_tracked_lane_of_a_counter_reports_its_own_changes() {
        let mut counters: Counters = Register::new(3);
        assert!(counters.track_lane(1, 5, 100), "bytes alone");
        assert!(!counters.track_lane(2, 6, 0), "a counter has two lanes");
        counters.count(2, 60);
        let mut got = Vec::new();
        counters.take_changes(&mut got);
        let c = |state, index, old, new| Change {
            state,
            index,
            old,
            new,
            exact: false,
            by_write: false,
        };
        assert_eq!(got, [c(5, 102, 0, 60)], "the bytes only, at 100 + 2");
        assert!(counters.track_lane(0, 4, 0), "then the packets beside them");
        assert_eq!(counters.lane_of(4), Some(0));
        assert_eq!(counters.lane_of(5), Some(1));
        assert_eq!(counters.lane_of(6), None);
        assert_eq!(
            counters.tracked_states().collect::<Vec<_>>(),
            [(4, 3), (5, 3)]
        );
        counters.count(2, 40);
        counters.count(0, 10);
        counters
            .write(
                1,
                PacketBytes {
                    packets: 0,
                    bytes: 7,
                },
            )
            .unwrap();
        got.clear();
        counters.take_changes(&mut got);
        assert_eq!(
            got,
            [
                c(4, 0, 0, 1),
                c(5, 100, 0, 10),
                c(5, 101, 0, 7),
                c(4, 2, 1, 2),
                c(5, 102, 60, 100)
            ],
            "cell by cell, lane after lane; cell 1's packets did not change"
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Write(usize, u32),
        Add(usize, u32),
        AddEach(Vec<usize>, u32),
        Clear,
        Begin,
        Read(usize, usize),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0..300usize, any::<u32>()).prop_map(|(i, v)| Op::Write(i, v)),
            8 => (0..300usize, 1..5u32).prop_map(|(i, v)| Op::Add(i, v)),
            4 => (proptest::collection::vec(0..600usize, 0..6), 1..5u32)
                .prop_map(|(is, v)| Op::AddEach(is, v)),
            1 => Just(Op::Clear),
            2 => Just(Op::Begin),
            6 => (0..300usize, 1..80usize).prop_map(|(i, n)| Op::Read(i, n)),
        ]
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]
        /// Whatever the writes, clears and reads in between, a snapshot reads the cells as
        /// they were when it began; once every cell is read, writes no longer copy.
        #[test]
        fn a_snapshot_reads_the_cells_as_they_were_when_it_began(
            ops in proptest::collection::vec(op(), 1..300)
        ) {
            let mut r: Register<u32> = Register::new(290);
            r.track(3, 0);
            let mut frozen: Option<Vec<u32>> = None;
            let mut before: Option<Vec<u32>> = None;
            for op in ops {
                match op {
                    Op::Write(i, v) => r.write(i % 290, v).unwrap(),
                    Op::Add(i, v) => r.update(i, |c| *c = c.wrapping_add(v)),
                    Op::AddEach(is, v) => r.update_each(is, |c| *c = c.wrapping_add(v)),
                    Op::Clear => r.clear(),
                    Op::Begin => {
                        proptest::prop_assert!(r.snapshot_begin());
                        let now = r.as_slice().to_vec();
                        // What the snapshot calls unchanged is as the one before had it.
                        if let Some(before) = &before {
                            for first in (0..290).step_by(20) {
                                let end = (first + 20).min(290);
                                if !r.snapshot_changed(first, 20) {
                                    proptest::prop_assert_eq!(&now[first..end], &before[first..end]);
                                }
                            }
                        }
                        before = Some(now.clone());
                        frozen = Some(now);
                    }
                    Op::Read(first, n) => {
                        let mut out = vec![0u64; n];
                        let got = r.snapshot_read(first, &mut out);
                        proptest::prop_assert_eq!(got, n.min(290usize.saturating_sub(first)));
                        if let Some(frozen) = &frozen {
                            for (k, word) in out[..got].iter().enumerate() {
                                proptest::prop_assert_eq!(*word, u64::from(frozen[first + k]));
                            }
                        }
                    }
                }
            }
            if let Some(frozen) = frozen {
                let mut out = vec![0u64; 290];
                r.snapshot_read(0, &mut out);
                let want: Vec<u64> = frozen.iter().map(|&c| u64::from(c)).collect();
                proptest::prop_assert_eq!(out, want);
                proptest::prop_assert!(!r.snapshot_pending(), "read to its end");
            }
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
        /// Updating several cells at once changes the cells, and reports the changes, as
        /// updating them one at a time does: tracked or not, indexes past the end wrapped.
        #[test]
        fn updates_of_several_cells_at_once_are_updates_one_at_a_time(
            ops in proptest::collection::vec(
                (proptest::collection::vec(0..700usize, 0..6), 1..5u32, proptest::bool::ANY),
                1..200,
            )
        ) {
            let (mut each, mut one, mut untracked) =
                (Register::<u32>::new(290), Register::<u32>::new(290), Register::<u32>::new(290));
            each.track(2, 7);
            one.track(2, 7);
            let (mut got, mut want) = (Vec::new(), Vec::new());
            for (indexes, v, take) in ops {
                each.update_each(indexes.iter().copied(), |c| *c = c.wrapping_add(v));
                untracked.update_each(indexes.iter().copied(), |c| *c = c.wrapping_add(v));
                for &i in &indexes {
                    one.update(i, |c| *c = c.wrapping_add(v));
                }
                if take {
                    each.take_changes(&mut got);
                    one.take_changes(&mut want);
                    proptest::prop_assert_eq!(&got, &want);
                }
            }
            proptest::prop_assert_eq!(each.as_slice(), one.as_slice());
            proptest::prop_assert_eq!(untracked.as_slice(), one.as_slice());
        }
    }

    /// The changes a take of `r` should report: each cell (lane 0, first location 0,
    /// state `state`) that differs from `then`, in order; `then` becomes `r`'s cells.
    fn changes_since(then: &mut [u32], r: &Register<u32>, state: u16) -> Vec<Change> {
        let mut want = Vec::new();
        for (i, (then, &now)) in then.iter_mut().zip(r.as_slice()).enumerate() {
            if *then != now {
                want.push(Change {
                    state,
                    index: i as u32,
                    old: u64::from(*then),
                    new: u64::from(now),
                    exact: false,
                    by_write: false,
                });
                *then = now;
            }
        }
        want
    }

    /// A register whose takes find most of its blocks changed stops marking, and marks
    /// again once a take finds few: its takes report every change either way.
    #[test]
    fn a_register_changed_all_over_is_compared_whole_and_marks_again_when_quiet() {
        let cells = BLOCK * 64;
        let mut r: Register<u32> = Register::new(cells);
        r.track(4, 0);
        let mut then = vec![0; cells];
        let mut got = Vec::new();
        let mut take = |r: &mut Register<u32>, then: &mut Vec<u32>| {
            got.clear();
            r.take_changes(&mut got);
            assert_eq!(got, changes_since(then, r, 4));
        };
        assert!(r.marks_changes(), "a register tracked starts by marking");
        // Half the blocks changed: a take that marks compares little less than them all.
        r.update_each((0..cells).step_by(2 * BLOCK), |c| *c += 1);
        take(&mut r, &mut then);
        assert!(
            !r.marks_changes(),
            "half the blocks changed: the next take compares all"
        );
        // Unmarked, the writes and updates are found by the comparison alone.
        r.update_each([5, cells - 1, 3 * BLOCK], |c| *c += 7);
        r.update(9 * BLOCK + 2, |c| *c += 1);
        r.write(40 * BLOCK, 11).unwrap();
        r.update_each((0..cells).step_by(BLOCK), |c| *c += 1);
        take(&mut r, &mut then);
        assert!(
            !r.marks_changes(),
            "every block changed: still compared whole"
        );
        // Seven blocks of 64 changed: fewer than an eighth.
        r.update_each((0..7).map(|b| b * 9 * BLOCK), |c| *c += 1);
        take(&mut r, &mut then);
        assert!(r.marks_changes(), "few blocks changed: marks again");
        r.update_each([1, 63 * BLOCK], |c| *c += 2);
        r.clear();
        take(&mut r, &mut then);
        take(&mut r, &mut then);
        assert!(r.marks_changes(), "nothing changed: still marks");
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]
        /// Whatever the mix of dense and sparse changes between takes (so that the
        /// register marks, compares whole, and goes from one to the other), each take
        /// reports exactly the cells that differ from the last, once.
        #[test]
        fn takes_report_exactly_the_cells_changed_since_the_last_marked_or_not(
            ops in proptest::collection::vec(
                (proptest::collection::vec(0..700usize, 0..400), 1..5u32, 0..8u8),
                1..60,
            )
        ) {
            let mut r: Register<u32> = Register::new(290);
            r.track(6, 0);
            let mut then = vec![0u32; 290];
            let mut got = Vec::new();
            for (indexes, v, how) in ops {
                match how {
                    0 => r.clear(),
                    1 => {
                        for &i in &indexes {
                            r.write(i % 290, v).unwrap();
                        }
                    }
                    2 => r.update(indexes.first().copied().unwrap_or(0), |c| *c += v),
                    _ => r.update_each(indexes.iter().copied(), |c| *c = c.wrapping_add(v)),
                }
                if how % 2 == 1 {
                    got.clear();
                    r.take_changes(&mut got);
                    proptest::prop_assert_eq!(&got, &changes_since(&mut then, &r, 6));
                }
            }
        }
    }

    #[test]
    fn an_untracked_register_takes_no_snapshot() {
        let mut r: Register<u32> = Register::new(8);
        assert!(!r.snapshot_begin());
        assert_eq!(r.snapshot_read(0, &mut [0; 4]), 0);
        r.track(1, 0);
        r.write(2, 5).unwrap();
        assert!(r.snapshot_begin());
        assert!(r.snapshot_pending());
        r.write(2, 6).unwrap();
        let mut out = [0u64; 8];
        assert_eq!(r.snapshot_read(0, &mut out), 8);
        assert_eq!(out[2], 5, "the write after the snapshot began is not in it");
        assert!(!r.snapshot_pending());
        assert_eq!(r.snapshot_read(8, &mut out), 0, "nothing past the end");
    }

    /// A register compared whole at its takes (which a synced one may be) and then
    /// snapshotted (which it must not be) still snapshots the cells as they were: its
    /// unmarked changes are all taken as marked. One of no cells takes nothing.
    #[test]
    fn a_register_compared_whole_snapshots_every_cell_and_an_empty_one_takes_nothing() {
        let cells = BLOCK * 4;
        let mut r: Register<u32> = Register::new(cells);
        r.track(1, 0);
        r.update_each((0..cells).step_by(BLOCK), |c| *c += 1);
        r.take_changes(&mut Vec::new());
        assert!(!r.marks_changes());
        r.update_each([3, BLOCK + 1, 3 * BLOCK + 15], |c| *c += 9);
        let frozen: Vec<u64> = r.as_slice().iter().map(|&c| u64::from(c)).collect();
        assert!(r.snapshot_begin());
        assert!(
            r.marks_changes(),
            "a snapshot's writes settle blocks by their marks"
        );
        r.update_each([3, 2 * BLOCK], |c| *c += 1);
        let mut out = vec![0u64; cells];
        assert_eq!(r.snapshot_read(0, &mut out), cells);
        assert_eq!(out, frozen);
        let mut empty: Register<u64> = Register::new(0);
        empty.track(2, 0);
        empty.update_each([0, 5], |c| *c += 1);
        let mut got = Vec::new();
        empty.take_changes(&mut got);
        empty.take_changes(&mut got);
        assert!(got.is_empty());
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
