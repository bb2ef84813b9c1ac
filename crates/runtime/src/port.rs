//! Port traits: where packets come from and where they go.

use std::io;

/// One received packet, borrowed from the port until the next call.
#[derive(Debug, Clone, Copy)]
pub struct RxPacket<'a> {
    pub data: &'a [u8],
    /// Length on the wire (more than `data.len()` if the capture was cut short).
    pub orig_len: u32,
    pub ts_ns: u64,
}

/// A source of packets, read one at a time (capture files, live sockets).
pub trait RxPort: Send {
    fn name(&self) -> &str;
    /// The next packet, or `None` at the end of the input.
    fn next_packet(&mut self) -> io::Result<Option<RxPacket<'_>>>;
    /// Bytes of the input consumed so far, for progress; 0 where that means nothing.
    fn bytes_read(&self) -> u64 {
        0
    }
}

/// A sink of packets.
pub trait TxPort: Send {
    fn name(&self) -> &str;
    fn send(&mut self, data: &[u8], orig_len: u32, ts_ns: u64) -> io::Result<()>;
    /// Makes everything sent so far durable or visible (end of run).
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
