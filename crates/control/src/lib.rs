//! The control API: a gRPC service over the running program's declared state.
//!
//! Owns: the protobuf schema (`proto/`, compiled at build time by protox, so no `protoc`
//! is needed), the service that turns calls into [`stateplane_runtime::ControlPlane`]
//! requests ([`server`]), the blocking client `stateplane ctl` uses ([`client`]), and the
//! text form of entries people type and read ([`entry_text`]), and the collector's API
//! over its core ([`collector_api`]: reads with bounds, writes, subscriptions), and state
//! migration through it ([`migrate`]) and the sketch applications on it ([`sketch_app`]),
//! and where the APIs listen and who may call them ([`endpoint`]: a Unix socket by
//! default, TLS with a token or client certificates beyond loopback).
//!
//! Must never: touch program state itself (requests go through the control plane, which
//! has the workers apply them between bursts), or listen beyond loopback without TLS and a
//! way to tell clients apart.

pub mod client;
pub mod collector_api;
pub mod convert;
pub mod endpoint;
pub mod entry_text;
pub mod migrate;
pub mod server;
pub mod sketch_app;

/// The generated protobuf messages and gRPC stubs.
#[allow(clippy::all, clippy::unwrap_used, clippy::expect_used)]
pub mod pb {
    tonic::include_proto!("stateplane.control.v1");
}

/// The collector API's generated messages and stubs.
#[allow(clippy::all, clippy::unwrap_used, clippy::expect_used)]
pub mod sync_pb {
    tonic::include_proto!("stateplane.sync.v1");
}

/// Entries a read or write carries in one message at most, so that the widest entries stay
/// well inside gRPC's 4 MB message limit; larger reads and writes go in pieces.
pub const PIECE: usize = 4096;

/// The control API's TCP port when `--control` gives a TCP address without one in mind
/// (P4Runtime's port); by default it listens on a Unix socket ([`endpoint::default_socket`]).
pub const DEFAULT_PORT: u16 = 9559;
