//! A running switch assembled from a configuration: its ports, workers and program, the
//! flow stage and exporter of its records, the metrics endpoint, the control server and
//! the live daemon's signals, so that a test or another binary builds a switch in a few
//! lines, and the command line only parses, calls and prints.
//!
//! Owns: [`Switch`] (`assemble`: a configuration checked and built into a run over capture
//! files or interfaces), the live daemon (`daemon`: interfaces opened, signals, reload,
//! the control server), the run configuration (`config`: TOML, errors that name the key),
//! the units users write (`units`), flow export (`flow_export`: settings, stages, report;
//! `export`: the exporter thread and its sinks), the flow monitor behind `stateplane flows`
//! (`flow_monitor`: files or interfaces in, records out, behind a program that only
//! observes), the metrics endpoint (`metrics`), and the summary of what a run did
//! ([`Outcome`], as a table or JSON).
//!
//! Must never: process packets itself (the runtime's workers and the programs do), print
//! (it returns reports; the caller shows them), or read standard input other than as a
//! capture the user named `-`.

pub mod assemble;
pub mod collector;
pub mod config;
pub mod daemon;
pub mod export;
pub mod flow_export;
pub mod flow_monitor;
pub mod metrics;
pub mod out_file;
pub mod redis_mirror;
pub mod relay;
pub mod replication_stage;
pub mod snapshot_stage;
pub mod summary;
pub mod sync_stage;
#[cfg(test)]
mod test_packets;
#[cfg(test)]
mod test_store;
pub mod units;

pub use assemble::{Switch, SwitchOptions};
pub use summary::Outcome;

/// Errors of setting a switch up: one line that names the field or flag and the fix.
pub type SetupResult<T> = Result<T, String>;
