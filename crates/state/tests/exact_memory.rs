//! What an exact table costs in resident memory: what its entries touch, not its capacity.
//! An empty table, and a copy of one (each worker's is a copy of a template), take address
//! space only; the kernel gives the pages as entries arrive. One test in its own process,
//! so that nothing else allocates while it reads the process's resident size.

#![allow(clippy::unwrap_used)]

use stateplane_state::{ExactTable, ExpireProfile};
use stateplane_wire::FlowKey;

/// The process's resident memory in bytes (`/proc/self/statm`, in pages).
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn a_table_costs_what_its_entries_touch_not_its_capacity() {
    const MIB: u64 = 1 << 20;
    let capacity = 4_194_304;
    let whole = ExactTable::<FlowKey, u64>::bytes_for(capacity);
    assert!(whole > 300 * MIB, "{whole} bytes at full size");
    let before = resident_bytes();
    let template = ExactTable::<FlowKey, u64>::new(capacity, &[ExpireProfile::NEVER], 1);
    let mut copies = vec![template.clone(), template.clone()];
    let empty = resident_bytes().saturating_sub(before);
    assert!(
        empty < 16 * MIB,
        "three empty tables of {whole} bytes took {empty} resident"
    );
    // Eight entries touch at most eight pages of each array (2 MiB each where huge).
    for i in 0..8u16 {
        let key = FlowKey {
            src_port: i,
            ..FlowKey::default()
        };
        copies[0].add_entry(key, u64::from(i), 0, 0).unwrap();
    }
    assert_eq!(copies[0].len(), 8);
    let used = resident_bytes().saturating_sub(before);
    assert!(used < 48 * MIB, "eight entries took {used} resident");
    // A copy of a table that holds entries holds them too.
    copies.push(copies[0].clone());
    assert_eq!(copies[2].len(), 8);
    drop(template);
}
