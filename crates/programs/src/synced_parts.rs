//! Programs with several pieces of state that may be synced (a report table beside the
//! sketch it is derived from, a connection table beside the policy's rule counters, the
//! stages of a `chain`): each piece is a [`SyncedPart`], and [`synced_parts_methods!`]
//! answers the sync stage for all of them, each part answering only for the ids it
//! tracks.
//!
//! Must never: let a part answer for an id it did not track: another part's values would
//! be read or written through it, or its changes counted twice.

use stateplane_runtime::Running;
use stateplane_state::changes::Change;
use stateplane_state::{CountMin, DeclaredTable, ExactCodec, Register, Word};

use crate::sketches::SketchRegister;

/// A piece of state as the sync stage reads it: see the methods of the same names on
/// `stateplane_runtime::Program`, which [`synced_parts_methods!`] answers with them.
/// Each method is given ids of every part of its program, and answers (reads, writes,
/// takes) only for those its part tracks.
pub(crate) trait SyncedView {
    /// Appends `(id, length)` of each state the part tracks.
    fn synced_into(&self, out: &mut Vec<(u16, u32)>);

    fn synced_room_bytes(&self) -> u64 {
        0
    }

    fn read_synced_run(&self, id: u16, first: u32, out: &mut [u64]) -> usize;
}

/// A piece of state as the sync stage takes, writes and commits it (see [`SyncedView`]).
pub(crate) trait SyncedPart: SyncedView {
    fn track(&mut self, name: &str, id: u16) -> Option<u32>;

    fn track_snapshots(&mut self, _name: &str, _id: u16) -> Option<u32> {
        None
    }

    fn make_synced_resident(&mut self) {}

    fn changes(&mut self, out: &mut Vec<Change>, budget: usize) -> bool;

    fn write_synced(&mut self, id: u16, index: u32, value: u64) -> Option<u64>;

    fn write_synced_run(&mut self, id: u16, first: u32, values: &[u64]) {
        for (index, &value) in (first..).zip(values) {
            let _ = self.write_synced(id, index, value);
        }
    }

    fn stage_synced_run(&mut self, _id: u16, _first: u32, _values: &[u64]) -> bool {
        false
    }

    fn drop_synced_write(&mut self) {}

    /// The entries refused.
    fn commit_synced_write(&mut self) -> u64 {
        0
    }
}

/// A program made of [`SyncedPart`]s: it hands each to `f` in turn, always the same
/// parts in the same order.
pub(crate) trait SyncedParts {
    fn synced_views(&self, f: &mut dyn FnMut(&dyn SyncedView));
    fn synced_parts(&mut self, f: &mut dyn FnMut(&mut dyn SyncedPart));
}

/// Inside the `impl Program` of a program that is [`SyncedParts`]: the synced-state
/// methods, each asking every part.
macro_rules! synced_parts_methods {
    () => {
        fn track(&mut self, name: &str, id: u16) -> Option<u32> {
            let mut length = None;
            $crate::synced_parts::SyncedParts::synced_parts(self, &mut |p| {
                length = length.or_else(|| p.track(name, id));
            });
            length
        }

        fn track_snapshots(&mut self, name: &str, id: u16) -> Option<u32> {
            let mut length = None;
            $crate::synced_parts::SyncedParts::synced_parts(self, &mut |p| {
                length = length.or_else(|| p.track_snapshots(name, id));
            });
            length
        }

        fn synced_room_bytes(&self) -> u64 {
            let mut bytes = 0;
            $crate::synced_parts::SyncedParts::synced_views(self, &mut |p| {
                bytes += p.synced_room_bytes();
            });
            bytes
        }

        fn make_synced_resident(&mut self) {
            $crate::synced_parts::SyncedParts::synced_parts(self, &mut |p| {
                p.make_synced_resident();
            });
        }

        /// Each part takes its changes in turn, each within the budget: what one part
        /// took never leaves another nothing (a sketch's counters, taken whole, would
        /// otherwise starve the table beside it pass after pass).
        fn changes(
            &mut self,
            out: &mut Vec<stateplane_state::changes::Change>,
            budget: usize,
        ) -> bool {
            let mut all = true;
            $crate::synced_parts::SyncedParts::synced_parts(self, &mut |p| {
                all &= p.changes(out, budget);
            });
            all
        }

        /// In the order the states were tracked: by id.
        fn synced(&self) -> Vec<(u16, u32)> {
            let mut states = Vec::new();
            $crate::synced_parts::SyncedParts::synced_views(self, &mut |p| {
                p.synced_into(&mut states);
            });
            states.sort_unstable();
            states
        }

        fn read_synced(&self, id: u16, index: u32) -> Option<u64> {
            let mut word = [0];
            let read = stateplane_runtime::Program::read_synced_run(self, id, index, &mut word);
            (read == 1).then_some(word[0])
        }

        fn read_synced_run(&self, id: u16, first: u32, out: &mut [u64]) -> usize {
            let mut read = 0;
            $crate::synced_parts::SyncedParts::synced_views(self, &mut |p| {
                read += p.read_synced_run(id, first, out);
            });
            read
        }

        fn write_synced(&mut self, id: u16, index: u32, value: u64) -> Option<u64> {
            let mut old = None;
            $crate::synced_parts::SyncedParts::synced_parts(self, &mut |p| {
                old = old.or(p.write_synced(id, index, value));
            });
            old
        }

        fn write_synced_run(&mut self, id: u16, first: u32, values: &[u64]) {
            $crate::synced_parts::SyncedParts::synced_parts(self, &mut |p| {
                p.write_synced_run(id, first, values);
            });
        }

        fn stage_synced_run(&mut self, id: u16, first: u32, values: &[u64]) -> bool {
            let mut staged = false;
            $crate::synced_parts::SyncedParts::synced_parts(self, &mut |p| {
                staged |= p.stage_synced_run(id, first, values);
            });
            staged
        }

        fn drop_synced_write(&mut self) {
            $crate::synced_parts::SyncedParts::synced_parts(self, &mut |p| {
                p.drop_synced_write();
            });
        }

        fn commit_synced_write(&mut self) -> u64 {
            let mut refused = 0;
            $crate::synced_parts::SyncedParts::synced_parts(self, &mut |p| {
                refused += p.commit_synced_write();
            });
            refused
        }
    };
}
pub(crate) use synced_parts_methods;

impl<C: ExactCodec> SyncedView for DeclaredTable<C> {
    fn synced_into(&self, out: &mut Vec<(u16, u32)>) {
        out.extend(self.synced());
    }

    fn synced_room_bytes(&self) -> u64 {
        DeclaredTable::synced_room_bytes(self)
    }

    fn read_synced_run(&self, id: u16, first: u32, out: &mut [u64]) -> usize {
        DeclaredTable::read_synced_run(self, id, first, out)
    }
}

impl<C: ExactCodec> SyncedPart for DeclaredTable<C> {
    fn track(&mut self, name: &str, id: u16) -> Option<u32> {
        DeclaredTable::track(self, name, id)
    }

    fn make_synced_resident(&mut self) {
        DeclaredTable::make_synced_resident(self);
    }

    fn changes(&mut self, out: &mut Vec<Change>, budget: usize) -> bool {
        DeclaredTable::changes(self, out, budget)
    }

    fn write_synced(&mut self, id: u16, index: u32, value: u64) -> Option<u64> {
        DeclaredTable::write_synced(self, id, index, value)
    }

    fn write_synced_run(&mut self, id: u16, first: u32, values: &[u64]) {
        DeclaredTable::write_synced_run(self, id, first, values);
    }

    fn stage_synced_run(&mut self, id: u16, first: u32, values: &[u64]) -> bool {
        DeclaredTable::stage_synced_run(self, id, first, values)
    }

    fn drop_synced_write(&mut self) {
        DeclaredTable::drop_synced_write(self);
    }

    fn commit_synced_write(&mut self) -> u64 {
        DeclaredTable::commit_synced_write(self).refused
    }
}

/// A program's sketches as one register, read (see `crate::sketches`).
pub(crate) struct SketchesView<'a>(pub &'a SketchRegister, pub &'a [CountMin]);

/// A program's sketches as one register, taken and written.
pub(crate) struct SketchesPart<'a>(pub &'a mut SketchRegister, pub &'a mut [CountMin]);

impl SyncedView for SketchesView<'_> {
    fn synced_into(&self, out: &mut Vec<(u16, u32)>) {
        out.extend(self.0.synced(self.1));
    }

    fn read_synced_run(&self, id: u16, first: u32, out: &mut [u64]) -> usize {
        self.0.read_synced_run(self.1, id, first, out)
    }
}

impl SyncedView for SketchesPart<'_> {
    fn synced_into(&self, out: &mut Vec<(u16, u32)>) {
        SketchesView(self.0, self.1).synced_into(out);
    }

    fn read_synced_run(&self, id: u16, first: u32, out: &mut [u64]) -> usize {
        SketchesView(self.0, self.1).read_synced_run(id, first, out)
    }
}

impl SyncedPart for SketchesPart<'_> {
    fn track(&mut self, name: &str, id: u16) -> Option<u32> {
        self.0.track(self.1, name, id)
    }

    fn track_snapshots(&mut self, name: &str, id: u16) -> Option<u32> {
        self.0.track_snapshots(self.1, name, id)
    }

    /// A sketch's counters are taken whole.
    fn changes(&mut self, out: &mut Vec<Change>, _budget: usize) -> bool {
        self.0.changes(self.1, out);
        true
    }

    fn write_synced(&mut self, id: u16, index: u32, value: u64) -> Option<u64> {
        self.0.write_synced(self.1, id, index, value)
    }
}

/// A register whose cells' lanes ([`Word::lane`]) are declared states of their own (acl's
/// rule counters: `rule_packets` and `rule_bytes`), read.
pub(crate) struct LanesView<'a, T: Copy + Default>(pub &'a Register<T>);

/// [`LanesView`]'s register, taken and written: lane `k` is tracked as `names[k]`.
pub(crate) struct LanesPart<'a, T: Copy + Default> {
    pub names: &'static [&'static str],
    pub register: &'a mut Register<T>,
}

impl<T: Word + Default> SyncedView for LanesView<'_, T> {
    fn synced_into(&self, out: &mut Vec<(u16, u32)>) {
        out.extend(self.0.tracked_states());
    }

    fn read_synced_run(&self, id: u16, first: u32, out: &mut [u64]) -> usize {
        let Some(lane) = self.0.lane_of(id) else {
            return 0;
        };
        let cells = self.0.as_slice().get(first as usize..).unwrap_or(&[]);
        for (o, cell) in out.iter_mut().zip(cells) {
            *o = cell.lane(lane);
        }
        out.len().min(cells.len())
    }
}

impl<T: Word + Default> SyncedView for LanesPart<'_, T> {
    fn synced_into(&self, out: &mut Vec<(u16, u32)>) {
        LanesView(self.register).synced_into(out);
    }

    fn read_synced_run(&self, id: u16, first: u32, out: &mut [u64]) -> usize {
        LanesView(self.register).read_synced_run(id, first, out)
    }
}

impl<T: Word + Default> SyncedPart for LanesPart<'_, T> {
    fn track(&mut self, name: &str, id: u16) -> Option<u32> {
        let lane = self.names.iter().position(|n| *n == name)?;
        let cells = u32::try_from(self.register.len()).ok()?;
        self.register.track_lane(lane, id, 0).then_some(cells)
    }

    /// A register's cells are taken whole.
    fn changes(&mut self, out: &mut Vec<Change>, _budget: usize) -> bool {
        self.register.take_changes(out);
        true
    }

    fn write_synced(&mut self, id: u16, index: u32, value: u64) -> Option<u64> {
        let lane = self.register.lane_of(id)?;
        let mut cell = self.register.read(index as usize).ok()?;
        let old = cell.lane(lane);
        cell.set_lane(lane, value);
        self.register.write(index as usize, cell).ok()?;
        Some(old)
    }
}

/// A program as a part of another (a stage of `chain`): it answers for the ids it tracks,
/// as every program does.
impl SyncedView for Box<dyn Running> {
    fn synced_into(&self, out: &mut Vec<(u16, u32)>) {
        out.extend(self.synced());
    }

    fn synced_room_bytes(&self) -> u64 {
        Running::synced_room_bytes(self.as_ref())
    }

    fn read_synced_run(&self, id: u16, first: u32, out: &mut [u64]) -> usize {
        Running::read_synced_run(self.as_ref(), id, first, out)
    }
}

impl SyncedPart for Box<dyn Running> {
    fn track(&mut self, name: &str, id: u16) -> Option<u32> {
        Running::track(self.as_mut(), name, id)
    }

    fn track_snapshots(&mut self, name: &str, id: u16) -> Option<u32> {
        Running::track_snapshots(self.as_mut(), name, id)
    }

    fn make_synced_resident(&mut self) {
        Running::make_synced_resident(self.as_mut());
    }

    fn changes(&mut self, out: &mut Vec<Change>, budget: usize) -> bool {
        Running::changes(self.as_mut(), out, budget)
    }

    fn write_synced(&mut self, id: u16, index: u32, value: u64) -> Option<u64> {
        Running::write_synced(self.as_mut(), id, index, value)
    }

    fn write_synced_run(&mut self, id: u16, first: u32, values: &[u64]) {
        Running::write_synced_run(self.as_mut(), id, first, values);
    }

    fn stage_synced_run(&mut self, id: u16, first: u32, values: &[u64]) -> bool {
        Running::stage_synced_run(self.as_mut(), id, first, values)
    }

    fn drop_synced_write(&mut self) {
        Running::drop_synced_write(self.as_mut());
    }

    fn commit_synced_write(&mut self) -> u64 {
        Running::commit_synced_write(self.as_mut())
    }
}
