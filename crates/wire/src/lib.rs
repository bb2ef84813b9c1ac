//! Packet formats.
//!
//! Owns: zero-copy views over packet bytes (`EthernetFrame<T>`, `Ipv4Packet<T>`, ...) whose
//! accessors never panic once `new_checked` has succeeded; owned representations
//! (`EthernetRepr`, `Ipv4Repr`, ...) that `parse` a view and `emit` into a buffer; and the
//! one-pass fast-path [`parse`](parse::parse) that yields header offsets, the flow key and the
//! flow hash of a frame.
//!
//! Must never: allocate on the parse path, panic on any input, or know about ports, workers
//! or programs (that is the runtime's business).
//!
//! The style follows smoltcp's `wire` module: a view checks its length once
//! (`check_len`), then its accessors index freely within what was checked.

pub mod arp;
pub mod checksum;
pub mod edit;
pub mod ethernet;
pub mod flow;
pub mod gtp;
pub mod icmp;
pub mod ipv4;
pub mod ipv6;
pub mod kv_proto;
pub mod offload;
pub mod parse;
pub mod tcp;
pub mod udp;

pub use ethernet::MacAddr;
pub use flow::{FlowHasher, FlowKey};
pub use parse::{Malformed, ParseFlags, Parsed, parse, parse_in_place};

use std::fmt;

/// Why a view or a representation refused its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The buffer ends before the header (or the length it declares) does.
    Truncated,
    /// A field holds a value the format does not allow (bad version, bad length field, ...).
    Malformed,
    /// The buffer given to `emit` is too small for the representation.
    BufferTooSmall,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Error::Truncated => "truncated packet",
            Error::Malformed => "malformed header field",
            Error::BufferTooSmall => "buffer too small to emit into",
        })
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Big-endian field access on slices whose length the caller has already checked.
pub(crate) mod field {
    #[inline(always)]
    pub fn be16(b: &[u8], at: usize) -> u16 {
        u16::from_be_bytes([b[at], b[at + 1]])
    }
    #[inline(always)]
    pub fn be32(b: &[u8], at: usize) -> u32 {
        u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }
    #[inline(always)]
    pub fn set_be16(b: &mut [u8], at: usize, v: u16) {
        b[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
    #[inline(always)]
    pub fn set_be32(b: &mut [u8], at: usize, v: u32) {
        b[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }
    /// Copies `N` bytes starting at `at` into an array.
    #[inline(always)]
    pub fn array<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
        let mut out = [0u8; N];
        out.copy_from_slice(&b[at..at + N]);
        out
    }
}

/// Requires `buf` to hold at least `len` bytes, for `emit`.
pub(crate) fn need(buf: &[u8], len: usize) -> Result<()> {
    if buf.len() < len {
        Err(Error::BufferTooSmall)
    } else {
        Ok(())
    }
}
