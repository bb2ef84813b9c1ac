//! Packet I/O.
//!
//! Owns: reading and writing capture files (pcap with micro- or nanosecond timestamps,
//! pcapng), streamed so files larger than memory work; in-memory replay queues that load a
//! trace once and replay it N times for benchmarks; sinks; huge-page-backed buffers; and
//! live ports on network interfaces (AF_XDP and AF_PACKET rings, in [`live`]); and UDP
//! segmentation offload for exporters ([`udp_socket`]) with the queue of a receiver on
//! this host that they pace themselves by ([`receive_queue`]).
//!
//! Must never: interpret packets beyond what sharding needs (that is `stateplane-wire`'s),
//! or accept a capture whose link type is not Ethernet (it says which it found instead).
//! Its `unsafe` lives in `live::sys` only (sockets, rings, BPF), checked under valgrind by
//! the test script; huge-page advice is `stateplane-mem`'s.

pub mod capture;
pub mod hugemem;
pub mod live;
pub mod pcap;
pub mod pcapng;
pub mod receive_queue;
pub mod replay;
pub mod udp_socket;

pub use capture::{
    CaptureError, CaptureFormat, CaptureReader, CaptureWriter, ChunkedCapture, Record,
};
pub use replay::{ReplayQueue, ReplayTrace};

/// For a command line's `main`: a closed standard output (a reader gone) ends the process
/// quietly, as it ends Unix tools, rather than panic at the next print.
pub fn end_quietly_when_stdout_closes() {
    live::sys::default_sigpipe();
}
