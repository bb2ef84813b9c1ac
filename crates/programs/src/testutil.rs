//! Helpers for the programs' tests.

use stateplane_runtime::{Burst, Context, Program};
use stateplane_wire::FlowHasher;

/// The hasher the tests parse with.
pub fn hasher() -> FlowHasher {
    FlowHasher::with_seed(1)
}

/// The context of worker 0 of 1 at `now_ns`, on a switch of `ports` ports.
pub fn ctx(now_ns: u64, ports: usize) -> Context {
    Context {
        now_ns,
        worker: 0,
        workers: 1,
        hasher: hasher(),
        ports,
    }
}

/// Runs `program` on one burst of `frames`, all arriving on port 0 at time 1, on a switch
/// of `ports` ports; returns the burst with the verdicts.
pub fn run(program: &mut impl Program, frames: &[Vec<u8>], ports: usize) -> Burst {
    let mut b = Burst::with_capacity(frames.len().max(1));
    for f in frames {
        b.push(f, f.len() as u32, 1, 0, 0);
    }
    b.parse(&hasher());
    program.process(&mut b, &mut ctx(1, ports));
    b
}
