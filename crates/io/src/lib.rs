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
//! or hand out a frame that is not Ethernet (a capture of another link type that [`link`]
//! takes is read through a synthesized Ethernet header; any other is refused by name).
//! Its `unsafe` lives in `live::sys` only (sockets, rings, BPF), checked under valgrind by
//! the test script; huge-page advice is `stateplane-mem`'s.

pub mod capture;
pub mod hugemem;
pub mod link;
pub mod live;
pub mod pcap;
pub mod pcapng;
pub mod receive_queue;
pub mod replay;
pub mod udp_socket;

/// Bytes written to the connected TCP `stream` that its peer has not acknowledged: what
/// may be lost if the connection ends now (what the peer acknowledged, it received).
pub fn tcp_unacknowledged(stream: &std::net::TcpStream) -> std::io::Result<usize> {
    live::sys::unacknowledged_bytes(stream)
}

/// Makes closing the TCP `stream` abort it (a reset, SO_LINGER of 0): what its peer has
/// not acknowledged is dropped rather than sent on after the close, so that what was
/// counted as not delivered is not delivered.
pub fn tcp_abort_on_close(stream: &std::net::TcpStream) -> std::io::Result<()> {
    let abort = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    live::sys::setsockopt(stream, libc::SOL_SOCKET, libc::SO_LINGER, &abort)
}

pub use capture::{
    CaptureError, CaptureFormat, CaptureReader, CaptureWriter, ChunkedCapture, Record,
};
pub use replay::{ReplayQueue, ReplayTrace};

/// For a command line's `main`: a closed standard output (a reader gone, as after
/// `stateplane ctl stats | head -4`) ends the process quietly at the next print, with the
/// status a shell shows for SIGPIPE (141), as Unix tools end, rather than with a panic's
/// message. SIGPIPE itself stays ignored (the Rust runtime's choice): a server's peer
/// that goes away mid-write (a `ctl sync watch` that has seen enough) must end that
/// connection with an error, never the whole process.
pub fn end_quietly_when_stdout_closes() {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = (info.payload().downcast_ref::<String>().map(String::as_str))
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        // The standard library's `print!` panics with this message when stdout is gone.
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        previous(info);
    }));
}
