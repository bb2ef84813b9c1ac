//! Unsampled flow records, TurboFlow's way: a per-worker microflow table
//! ([`microflow`]) whose evicted records an aggregator ([`aggregator`]) stitches into
//! flow records, exported as IPFIX ([`ipfix`]) or as text ([`text_lines`]).
//!
//! Everything here is a core with no I/O: fed packets and the time, it returns records or
//! bytes to send. It never reads a clock, opens a socket or file, or allocates per packet.

pub mod aggregator;
pub mod compact_key;
pub mod exporter;
pub mod flow_stats;
pub mod ipfix;
pub mod microflow;
pub mod record;
pub mod stage;
pub mod text_lines;

pub use aggregator::{Aggregator, Biflow, FlowValue, TcpEnd, Timeouts, Uniflow};
pub use compact_key::{CompactKey, V4Key, V6Key};
pub use flow_stats::{FlowStats, FlowTotals, KeptStats, Observation};
pub use microflow::{Microflow, MicroflowTable};
pub use record::{EndReason, FlowRecord};
