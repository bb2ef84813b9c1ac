//! State that programs keep, declared with its guarantees.
//!
//! Owns: the state primitives a program holds in its own struct, one instance per worker
//! shard: exact-match tables with PNA add-on-miss, data-plane-updatable entries, idle
//! timeouts and hit counters ([`exact`]); registers and indexed counters ([`register`]);
//! RFC 2697/2698 meters ([`meter`]); a count-min sketch on registers ([`sketch`]);
//! longest-prefix match for IPv4 and IPv6 ([`lpm`]) with an Internet-like prefix
//! generator ([`prefixes`]), updated prefix by prefix; ternary 5-tuple ACLs by tuple-space
//! search with a ClassBench-like rule generator ([`ternary`]); and control requests applied
//! next to the tables ([`declared`]; the requests' types are `stateplane-api`'s, re-exported
//! as [`control`]); the changes tracked state makes, for the sync stage ([`changes`]), and an exact table's
//! entries as synced words ([`synced_table`]).
//!
//! Must never: allocate, rehash, lock or make a system call on a lookup, an insert or a
//! delete (capacity is fixed at creation and preallocated; a full table refuses and
//! counts; a take of tracked state's changes appends to the caller's buffer), or read a
//! clock (time comes in as `now_ns`, the data-plane clock, so tests run on a virtual one). It has no `unsafe` code (its prefetch hints are `stateplane-mem`'s).

pub mod changes;
pub mod declared;
pub mod exact;
pub mod key_fields;
pub mod lpm;
pub mod meter;
pub mod prefixes;
pub mod register;
pub mod sketch;
pub mod synced_table;
pub mod table_key;
pub mod ternary;

/// The control API's types, and what applies them to tables.
pub mod control {
    pub use crate::declared::{DeclaredTable, ExactCodec, Outbox, ValueCodec, params_into};
    pub use stateplane_api::*;
}

pub use control::{
    Carried, ControlError, Declaration, DeclaredTable, Entry, ExactCodec, Expiry, FlowChange,
    FlowFilter, FlowStat, Guarantee, Kind, Match, Notification, NotificationKind, Outbox,
    RemovedReason, Reply, Request, WorkerCounters, Write,
};
pub use declared::{NotLeased, ValueCodec, params_into};
pub use exact::{
    AddError, Adopted, ExactTable, ExpireMode, ExpireProfile, Expired, InsertLimit, TableStats,
};
pub use key_fields::KeyFields;
pub use lpm::{Lpm4, Lpm6, PrefixError};
pub use meter::{Colour, Meter, MeterConfig, SrTcm, TrTcm};
pub use register::{Counters, OutOfRange, PacketBytes, Register, Word};
pub use sketch::CountMin;
pub use table_key::TableKey;
pub use ternary::{Packet5, Rule, Ternary};
