//! The `replicated` guarantee's protocol cores (RedPlane, and beyond it), with no I/O: each
//! is a state machine fed `(now, input)` that returns what to send or do, so that it runs
//! the same under a real clock, against a real store, and in a simulation.
//!
//! - [`protocol`]: what a switch asks of the store and what the store answers;
//! - [`store`]: the store's side of each step (lease, fencing epoch, sequenced write),
//!   which the in-process `memory` store runs as it is and the Redis functions mirror;
//! - [`replica`]: a worker's side: which packets may be processed now, which wait for a
//!   lease or for their flow's write to be acknowledged, the writes coalesced per flow
//!   (group commit) and sent again until acknowledged, the leases renewed;
//! - [`snapshot`]: a worker's side of bounded replication: periodic consistent snapshots
//!   of its state written to the store while packets go on, their staleness against the
//!   bound, and recovery from the store's latest image;
//! - [`history`]: per-flow histories of packets (input, output, call and return times) and
//!   a linearizability checker for them (Wing and Gong's search, per flow, memoized).
//!
//! Must never: read a clock or do I/O (time arrives as `now_ns`); release a packet whose
//! output reflects a state the store has not acknowledged; let a switch process a flow's
//! packet without a lease the store would still call its own.

mod flow_table;
pub mod history;
pub mod protocol;
pub mod replica;
pub mod snapshot;
pub mod store;

pub use protocol::{FlowBytes, Holder, Reply, Request};

/// A place hint that names no place yet: where a program finds a flow's state
/// (`Program::replicated_state_into`), kept with the flow ([`replica::Places`]).
pub const NO_HINT: u32 = u32::MAX;

/// A map keyed by flows (or per-packet tokens) on the replication path, which hashes a key
/// a packet: foldhash with a per-process random seed, as resistant to crafted keys as the
/// standard map and several times faster on a flow's 48 bytes than its SipHash.
pub type FlowMap<K, V> = std::collections::HashMap<K, V, foldhash::quality::RandomState>;
