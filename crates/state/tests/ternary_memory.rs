//! What a ternary table takes, measured by the allocator, against what the run's memory
//! budget is told ([`Ternary::bytes_for`]): the budget must never be told less.

#![allow(clippy::unwrap_used)]

use stateplane_mem::counting::{Counting, assert_told_enough, held_by};
use stateplane_state::ternary::{Rule, Ternary, acl_rules};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

#[test]
fn the_budget_is_told_at_least_what_a_ternary_table_takes() {
    for n in [1, 100, 897, 2_178, 4_096, 50_000, 200_000] {
        let shapes: [(&str, Vec<Rule<u32>>); 2] = [
            ("ClassBench-like", acl_rules(n, 7)),
            ("every rule a tuple of its own", {
                let mut rules = acl_rules(n, 9);
                for (i, r) in rules.iter_mut().enumerate() {
                    (r.src_len, r.dst_len) = ((i % 33) as u8, (i / 33 % 33) as u8);
                    r.proto = (i / 1089 % 2 == 0).then_some(6);
                }
                rules
            }),
        ];
        for (shape, rules) in shapes {
            let told = Ternary::<u32>::bytes_for(n);
            let (table, taken) = held_by(|| Ternary::build(&rules));
            assert_told_enough(&format!("{shape}, {n} rules"), told, taken, 16);
            drop(table);
        }
    }
}
