//! A burst: up to `capacity` packets, their bytes packed one after another in an arena, each
//! with a descriptor that carries its parse and, after the program, its verdict.

use crate::program::{DropReason, Verdict};
use stateplane_wire::{Malformed, Parsed};

/// The largest frame a port accepts; longer ones are counted (`oversize`) and dropped at
/// the port. Large enough for jumbo frames and for the 64 KiB segments of offloaded
/// captures.
pub const MAX_FRAME: usize = 65_535 + 14 + 8;

/// Arena bytes reserved per packet slot: a burst of full-size Ethernet frames fits.
pub const ARENA_BYTES_PER_SLOT: usize = 2048;

/// Where one packet sits in its burst, and what is known of it.
#[derive(Clone, Copy, Debug)]
pub struct PacketDesc {
    /// Offset of the packet's bytes in the burst's arena.
    pub offset: u32,
    /// Captured length (the bytes in the arena).
    pub len: u32,
    /// Length on the wire (larger than `len` when a capture was cut at its snap length).
    pub orig_len: u32,
    /// Time of arrival in nanoseconds (capture time offline, clock time on live ports).
    pub ts_ns: u64,
    /// Position of the packet in its input stream, for order-preserving output.
    pub seq: u64,
    pub in_port: u16,
    /// Valid when `malformed` is `None`.
    pub parsed: Parsed,
    pub malformed: Option<Malformed>,
    pub verdict: Verdict,
}

/// A packet of a burst as a program sees it: its descriptor and its bytes.
pub struct PacketMut<'a> {
    pub desc: &'a mut PacketDesc,
    pub data: &'a mut [u8],
}

/// A batch of packets that moves through the runtime as one unit.
///
/// Invariant: descriptors are in arena order, non-overlapping, and every descriptor's
/// bytes lie inside `arena[..used]`.
pub struct Burst {
    arena: Vec<u8>,
    used: usize,
    packets: Vec<PacketDesc>,
    capacity: usize,
    /// Whether the packets have been parsed (by the dispatcher or the worker).
    pub parsed: bool,
    /// Which round of the dispatcher this burst belongs to (ordered output merges by it).
    pub round: u64,
    /// The data-plane clock when the burst was formed (nanoseconds).
    pub now_ns: u64,
}

impl Burst {
    /// A burst for up to `capacity` packets; its arena is allocated once, here.
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Burst {
            arena: vec![0u8; capacity * ARENA_BYTES_PER_SLOT + MAX_FRAME],
            used: 0,
            packets: Vec::with_capacity(capacity),
            capacity,
            parsed: false,
            round: 0,
            now_ns: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.packets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packets.is_empty()
    }

    /// Whether another packet of `len` bytes can be pushed.
    pub fn has_room(&self, len: usize) -> bool {
        self.packets.len() < self.capacity && self.used + len <= self.arena.len()
    }

    pub fn clear(&mut self) {
        self.packets.clear();
        self.used = 0;
        self.parsed = false;
    }

    /// Appends a packet, copying its bytes into the arena. Returns `false` (and changes
    /// nothing) if the burst is full: the caller starts another burst.
    #[inline]
    pub fn push(&mut self, data: &[u8], orig_len: u32, ts_ns: u64, in_port: u16, seq: u64) -> bool {
        if !self.has_room(data.len()) {
            return false;
        }
        let offset = self.used;
        self.arena[offset..offset + data.len()].copy_from_slice(data);
        self.used += data.len();
        self.packets.push(PacketDesc {
            offset: offset as u32,
            len: data.len() as u32,
            orig_len,
            ts_ns,
            seq,
            in_port,
            parsed: Parsed::default(),
            malformed: None,
            verdict: Verdict::Drop(DropReason::NO_VERDICT),
        });
        true
    }

    /// Appends a packet whose descriptor (parse included) is already known.
    #[inline]
    pub fn push_desc(&mut self, data: &[u8], desc: PacketDesc) -> bool {
        if !self.has_room(data.len()) {
            return false;
        }
        let offset = self.used;
        self.arena[offset..offset + data.len()].copy_from_slice(data);
        self.used += data.len();
        self.packets.push(PacketDesc {
            offset: offset as u32,
            len: data.len() as u32,
            ..desc
        });
        true
    }

    /// Keeps only the packets for which `keep` holds; the bytes of the others stay in the
    /// arena as dead space until `clear`.
    pub fn retain(&mut self, keep: impl FnMut(&PacketDesc) -> bool) {
        self.packets.retain(keep);
    }

    pub fn descs(&self) -> &[PacketDesc] {
        &self.packets
    }

    pub fn descs_mut(&mut self) -> &mut [PacketDesc] {
        &mut self.packets
    }

    /// The bytes of packet `i`.
    pub fn data(&self, i: usize) -> &[u8] {
        let d = &self.packets[i];
        &self.arena[d.offset as usize..(d.offset + d.len) as usize]
    }

    /// Each packet with its descriptor and its bytes, mutable, in order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = PacketMut<'_>> {
        let mut rest: &mut [u8] = &mut self.arena[..self.used];
        let mut consumed = 0usize;
        self.packets.iter_mut().map(move |desc| {
            let start = desc.offset as usize - consumed;
            let taken = std::mem::take(&mut rest);
            let (_, tail) = taken.split_at_mut(start);
            let (data, tail) = tail.split_at_mut(desc.len as usize);
            rest = tail;
            consumed = desc.offset as usize + desc.len as usize;
            PacketMut { desc, data }
        })
    }

    /// Each packet's descriptor and bytes, read-only, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&PacketDesc, &[u8])> {
        self.packets.iter().map(|d| {
            (
                d,
                &self.arena[d.offset as usize..(d.offset + d.len) as usize],
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_until_full_then_refuse() {
        let mut b = Burst::with_capacity(3);
        for i in 0..3u8 {
            assert!(b.push(&[i; 60], 60, u64::from(i), 0, u64::from(i)));
        }
        assert!(!b.push(&[9; 60], 60, 9, 0, 9));
        assert_eq!(b.len(), 3);
        assert_eq!(b.data(1), &[1; 60]);
        b.clear();
        assert!(b.is_empty());
    }

    #[test]
    fn arena_bounds_refuse_too_many_bytes() {
        let mut b = Burst::with_capacity(2);
        let big = vec![7u8; MAX_FRAME];
        assert!(b.push(&big, MAX_FRAME as u32, 0, 0, 0));
        assert!(!b.push(&big, MAX_FRAME as u32, 0, 0, 1));
    }

    #[test]
    fn iter_mut_hands_out_each_packets_own_bytes() {
        let mut b = Burst::with_capacity(4);
        for i in 0..4u8 {
            b.push(&vec![i; 10 + usize::from(i)], 0, 0, 0, 0);
        }
        for p in b.iter_mut() {
            assert_eq!(p.data.len() as u32, p.desc.len);
            let v = p.data[0];
            assert!(p.data.iter().all(|&x| x == v));
            p.data[0] = v + 100;
        }
        assert_eq!(b.data(3)[0], 103);
        assert_eq!(b.data(3)[1], 3);
    }
}
