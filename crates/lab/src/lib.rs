//! The lab: hosts, switches and a controller on one machine, each in its own network
//! namespace, joined by veth pairs, with `stateplane` running in every switch.
//!
//! Owns: reading and checking topology files, creating and removing the namespaces, links,
//! addresses and switch processes of a lab, and reporting its state. Every name it creates
//! starts with `sp-LAB-`, so `down` finds everything from the names alone, even after a
//! crash left no state file.
//!
//! Must never: touch a namespace or interface it did not name, give a lab a route out of
//! the lab, or use addresses outside 198.18.0.0/15.

pub mod namespaces;
pub mod redis_server;
pub mod topology;

pub use namespaces::{NodeStatus, down, exec, start_switch, state_dir, status, stop_switch, up};
pub use redis_server::{RedisServer, free_loopback_port};
pub use topology::Topology;
