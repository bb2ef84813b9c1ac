//! The data-plane runtime.
//!
//! Owns: the [`Burst`] that packets travel in, the [`Program`] interface that network
//! functions implement, the [`Worker`] that runs a program to completion on a burst, the
//! port traits ([`RxPort`], [`TxPort`] for files, [`LiveQueue`] for interfaces), the
//! counters every component reports, and the shapes of a run that wire ports, workers and
//! outputs together on threads ([`offline`], [`sharded`], [`live`]).
//!
//! Must never: allocate, lock or make a system call per packet on the fast path (bursts
//! and their arenas are preallocated and recycled; counters are published once per burst);
//! know any file format or wire protocol beyond what `stateplane-wire` parses.
//!
//! Later capabilities plug in here without changing program code: state primitives hang
//! off a program's own struct (declared at construction, one instance per worker shard),
//! flow records and sync run as stages that see each burst after the program, and the
//! control plane reaches workers between bursts through the [`Context`].

pub mod burst;
pub mod chunked;
pub mod control;
pub mod counters;
pub mod held;
pub mod live;
pub mod offline;
pub mod port;
pub mod program;
pub mod read_ahead;
pub mod run_config;
pub mod sharded;
pub mod source;
pub mod state_stage;
pub mod tap;
pub mod worker;
pub mod worker_loop;

pub use burst::{Burst, MAX_FRAME, PacketDesc, PacketMut};
pub use control::{Applied, ControlPlane, WorkerControl};
pub use counters::{Counter, SharedStats, Stats};
pub use held::{Held, HeldPacket};
pub use offline::{OfflinePorts, run_offline};
pub use port::{
    ChunkedFile, FileRecord, LiveQueue, MemoryRx, PLACE_MASK, PortCounters, RxPacket, RxPort,
    SeenAt, Steering, TxPort,
};
pub use program::{
    Context, DropReason, LeasedPacket, PortId, Prepared, Program, ProgramFactory, Running, Verdict,
    state_alone,
};
pub use read_ahead::ReadAhead;
pub use run_config::{FilePorts, RunHandle, RunReport, RuntimeConfig, Spread, SteerFn};
pub use sharded::run_sharded;
pub use source::{BurstSource, OwnShard, PacketBytes};
pub use state_stage::{StateStage, StateStageFactory};
pub use stateplane_replication::{FlowBytes, NO_HINT};
pub use tap::{Tap, TapFactory};
pub use worker::Worker;
pub use worker_loop::{
    Clock, ManualClock, PortsReport, Receive, Reload, Taken, Timekeeping, WallClock, WorkerPorts,
    WorkerReport, WorkerSetup, run_worker, run_workers,
};
