//! Exact tables as synced state: a program whose table may be configured `synced` answers
//! the sync stage with its [`DeclaredTable`](stateplane_state::DeclaredTable)'s entries,
//! one slot's words after another (`stateplane_state::synced_table`).
//!
//! Must never: be used by a program that keeps state derived from the table beside it
//! (a reverse index, a port pool) without `after_commit`: a write placed by the table
//! alone would leave that state behind.

/// Inside a program's `impl Program`: the synced-state methods of a program whose one
/// table at `self.$table` may be synced. With `after_commit: $after`, a program that keeps
/// state derived from the table beside it makes that state again once a synced write has
/// placed anything: `self.$after(entries, now_ns)`, given the table's entries with those
/// written last (`DeclaredTable::entries_written_last`), deletes the entries it cannot
/// keep and returns how many, counted as refused.
macro_rules! synced_table_methods {
    ($($table:ident).+) => {
        crate::synced_tables::synced_table_methods!(@reads_and_writes $($table).+);

        fn commit_synced_write(&mut self) -> u64 {
            self.$($table).+.commit_synced_write().refused
        }
    };
    ($($table:ident).+, after_commit: $after:ident) => {
        crate::synced_tables::synced_table_methods!(@reads_and_writes $($table).+);

        fn commit_synced_write(&mut self) -> u64 {
            let placed = self.$($table).+.commit_synced_write();
            if placed.entries + placed.deleted == 0 {
                return placed.refused;
            }
            let entries = self.$($table).+.entries_written_last();
            let now_ns = self.$($table).+.swept_at_ns();
            placed.refused + self.$after(entries, now_ns)
        }
    };
    (@reads_and_writes $($table:ident).+) => {
        fn track(&mut self, name: &str, id: u16) -> Option<u32> {
            self.$($table).+.track(name, id)
        }

        fn synced_room_bytes(&self) -> u64 {
            self.$($table).+.synced_room_bytes()
        }

        fn make_synced_resident(&mut self) {
            self.$($table).+.make_synced_resident();
        }

        fn changes(
            &mut self,
            out: &mut Vec<stateplane_state::changes::Change>,
            budget: usize,
        ) -> bool {
            self.$($table).+.changes(out, budget)
        }

        fn synced(&self) -> Vec<(u16, u32)> {
            self.$($table).+.synced().into_iter().collect()
        }

        fn read_synced(&self, id: u16, index: u32) -> Option<u64> {
            self.$($table).+.read_synced(id, index)
        }

        fn read_synced_run(&self, id: u16, first: u32, out: &mut [u64]) -> usize {
            self.$($table).+.read_synced_run(id, first, out)
        }

        fn write_synced(&mut self, id: u16, index: u32, value: u64) -> Option<u64> {
            self.$($table).+.write_synced(id, index, value)
        }

        fn write_synced_run(&mut self, id: u16, first: u32, values: &[u64]) {
            self.$($table).+.write_synced_run(id, first, values);
        }

        fn stage_synced_run(&mut self, id: u16, first: u32, values: &[u64]) -> bool {
            self.$($table).+.stage_synced_run(id, first, values)
        }

        fn drop_synced_write(&mut self) {
            self.$($table).+.drop_synced_write();
        }
    };
}
pub(crate) use synced_table_methods;
