//! A burst: up to `capacity` packets, their bytes packed one after another in an arena, each
//! with a descriptor that carries its parse and, after the program, its verdict.

use crate::port::{RxPacket, SeenAt};
use crate::program::{DropReason, Verdict};
use stateplane_wire::{FlowHasher, Malformed, Parsed};

/// The largest frame a port accepts; longer ones are counted (`oversize`) and dropped at
/// the port. Large enough for jumbo frames and for the 64 KiB segments of offloaded
/// captures.
pub const MAX_FRAME: usize = 65_535 + 14 + 8;

/// Arena bytes reserved per packet slot: a burst of full-size Ethernet frames fits.
pub const ARENA_BYTES_PER_SLOT: usize = 2048;

/// Bytes left free before each packet, so that a program can add headers in place without
/// moving the packet (a VLAN tag; a GTP-U tunnel's IPv4, UDP and GTP-U headers, 36 bytes;
/// a key-value reply's value): see [`Burst::grow_front`]. Measured at no cost against 4
/// bytes with `stateplane bench --programs rx,forward,conntrack --repeat 5 --packets
/// 1000000` (forward 44 then 48 Mpps, conntrack 12.0 then 11.3: the machine's noise).
pub const HEADROOM: usize = 64;

/// Where one packet sits in its burst, and what is known of it.
#[derive(Clone, Copy, Debug)]
pub struct PacketDesc {
    /// Offset of the packet's bytes in the burst's arena.
    pub offset: u32,
    /// Captured length (the bytes in the arena).
    pub len: u32,
    /// Length on the wire (larger than `len` when a capture was cut at its snap length).
    /// A program that changes the packet's length changes it too: the bytes it adds or
    /// takes from the front are on the wire, and a packet cut to a reply is all there is.
    pub orig_len: u32,
    /// Time of arrival in nanoseconds (capture time offline, clock time on live ports).
    pub ts_ns: u64,
    /// Position of the packet in its input stream, for order-preserving output.
    pub seq: u64,
    pub in_port: u16,
    /// Where its capture says it was seen (see [`SeenAt`]).
    pub seen: SeenAt,
    /// Free bytes before `offset` that belong to this packet (set by the burst).
    pub headroom: u8,
    /// A large segment's piece size; 0 for any other packet. A live port that receives a
    /// TCP segment whole where its sender left the cutting to a device (TSO, GSO, GRO)
    /// sets it to the size of the pieces the sender asked for; such a packet's transport
    /// checksum is left partial (its pseudo-header's sum), for the device that cuts it.
    pub segment_size: u16,
    /// Set by the replication stage for every packet of a burst whose program checks its
    /// flows' leases (meaningless elsewhere): `None` for a packet the stage admitted (its
    /// flow's lease is held, and the stage accounts for what processing it changes), which
    /// the program processes whatever its entry's lease mark says; else the packet's place
    /// in the burst, which the program's table keeps with each entry it finds under its
    /// lease mark (`DeclaredTable::lookup_leased`), for the stage to find the packet
    /// again after the program.
    pub lease_check: Option<u16>,
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
/// Invariants: `slots[..count]` are the packets, in arena order, non-overlapping, each
/// one's bytes inside `arena[..used]`. The slots past `count` hold stale descriptors of
/// earlier bursts: they are allocated once and overwritten, so receiving a packet writes
/// only its receive fields and the parser writes `parsed` once.
pub struct Burst {
    arena: Vec<u8>,
    used: usize,
    slots: Vec<PacketDesc>,
    count: usize,
    /// Whether the packets have been parsed (by the dispatcher or the worker).
    pub parsed: bool,
    /// Which round of the dispatcher this burst belongs to (ordered output merges by it).
    pub round: u64,
    /// The data-plane clock: never earlier than any packet pushed since creation (pushes
    /// raise it), and raised further by a dispatcher to move time on for idle workers.
    pub now_ns: u64,
}

const EMPTY_DESC: PacketDesc = PacketDesc {
    offset: 0,
    len: 0,
    orig_len: 0,
    ts_ns: 0,
    seq: 0,
    in_port: 0,
    seen: SeenAt {
        interface: 0,
        outgoing: false,
    },
    headroom: 0,
    segment_size: 0,
    lease_check: None,
    parsed: Parsed::EMPTY,
    malformed: None,
    verdict: Verdict::Drop(DropReason::NO_VERDICT),
};

/// A burst with no room at all, allocating nothing: a placeholder for a slot whose burst
/// has been handed on (`std::mem::take`).
impl Default for Burst {
    fn default() -> Self {
        Burst {
            arena: Vec::new(),
            used: 0,
            slots: Vec::new(),
            count: 0,
            parsed: false,
            round: 0,
            now_ns: 0,
        }
    }
}

impl Burst {
    /// A burst for up to `capacity` packets; its arena and slots are allocated once, here.
    pub fn with_capacity(capacity: usize) -> Self {
        let capacity = capacity.max(1);
        Burst {
            arena: vec![0u8; capacity * ARENA_BYTES_PER_SLOT + MAX_FRAME],
            used: 0,
            slots: vec![EMPTY_DESC; capacity],
            count: 0,
            parsed: false,
            round: 0,
            now_ns: 0,
        }
    }

    /// The bytes a burst of `capacity` packets takes (what [`Burst::with_capacity`] makes).
    pub fn bytes_for(capacity: usize) -> u64 {
        let capacity = capacity.max(1);
        (capacity * (ARENA_BYTES_PER_SLOT + std::mem::size_of::<PacketDesc>()) + MAX_FRAME) as u64
    }

    /// The bursts a worker's run over files keeps (its queues' and its spares), and the
    /// packets each holds: twice the burst where a state stage puts held packets back
    /// into later bursts (`holds_packets`).
    pub fn pool(queue_depth: usize, burst_size: usize, holds_packets: bool) -> (usize, usize) {
        let capacity = if holds_packets {
            2 * burst_size
        } else {
            burst_size
        };
        (queue_depth * 2 + 2, capacity)
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Whether another packet of `len` bytes can be pushed.
    pub fn has_room(&self, len: usize) -> bool {
        self.count < self.slots.len() && self.used + HEADROOM + len <= self.arena.len()
    }

    pub fn clear(&mut self) {
        self.count = 0;
        self.used = 0;
        self.parsed = false;
    }

    /// Copies `data` into the arena and claims the next slot; `None` if the burst is full.
    #[inline]
    fn append(&mut self, data: &[u8], ts_ns: u64) -> Option<&mut PacketDesc> {
        if !self.has_room(data.len()) {
            return None;
        }
        let offset = self.used + HEADROOM;
        self.arena[offset..offset + data.len()].copy_from_slice(data);
        self.used = offset + data.len();
        self.now_ns = self.now_ns.max(ts_ns);
        let slot = &mut self.slots[self.count];
        self.count += 1;
        slot.offset = offset as u32;
        slot.len = data.len() as u32;
        slot.headroom = HEADROOM as u8;
        Some(slot)
    }

    /// Appends a received packet, copying its bytes into the arena. Returns `false` (and
    /// changes nothing) if the burst is full: the caller starts another burst.
    #[inline]
    pub fn push(&mut self, data: &[u8], orig_len: u32, ts_ns: u64, in_port: u16, seq: u64) -> bool {
        let Some(slot) = self.append(data, ts_ns) else {
            return false;
        };
        slot.orig_len = orig_len;
        slot.ts_ns = ts_ns;
        slot.seq = seq;
        slot.in_port = in_port;
        slot.seen = SeenAt::default();
        slot.segment_size = 0;
        slot.malformed = None;
        slot.verdict = Verdict::Drop(DropReason::NO_VERDICT);
        true
    }

    /// Appends a large segment received whole, to be cut into pieces of `segment_size`
    /// bytes when it is sent (see [`PacketDesc::segment_size`]). Returns `false` (and
    /// changes nothing) if the burst is full.
    pub fn push_large_segment(
        &mut self,
        data: &[u8],
        ts_ns: u64,
        in_port: u16,
        segment_size: u16,
    ) -> bool {
        let pushed = self.push(data, data.len() as u32, ts_ns, in_port, 0);
        if pushed {
            self.slots[self.count - 1].segment_size = segment_size;
        }
        pushed
    }

    /// Appends a received packet already parsed (`parsed` is copied once, into its
    /// descriptor). Returns `false` (and changes nothing) if the burst is full.
    #[inline]
    pub fn push_parsed(
        &mut self,
        packet: &RxPacket,
        in_port: u16,
        seq: u64,
        parsed: &Parsed,
    ) -> bool {
        let pushed = self.push(packet.data, packet.orig_len, packet.ts_ns, in_port, seq);
        if pushed {
            let slot = &mut self.slots[self.count - 1];
            slot.parsed = *parsed;
            slot.seen = packet.seen;
        }
        pushed
    }

    /// Appends a packet held outside any burst (by a state stage, across bursts) with its
    /// descriptor as it was: parse, verdict and arrival stay, its place is this arena's.
    /// Returns `false` (and changes nothing) if the burst is full.
    #[inline]
    pub fn push_desc(&mut self, desc: &PacketDesc, data: &[u8]) -> bool {
        let Some(slot) = self.append(data, desc.ts_ns) else {
            return false;
        };
        *slot = PacketDesc {
            offset: slot.offset,
            len: slot.len,
            headroom: slot.headroom,
            ..*desc
        };
        true
    }

    /// Puts packets before the burst's own, in the order given, as many as fit beside all
    /// of the burst's own; returns how many went in. The burst is rebuilt in `spare` (any
    /// burst, emptied here), and the two are swapped: its arena becomes this one's.
    pub fn put_in_front<'a>(
        &mut self,
        spare: &mut Burst,
        front: impl IntoIterator<Item = (&'a PacketDesc, &'a [u8])>,
    ) -> usize {
        spare.clear();
        let own_bytes: usize = (self.descs().iter())
            .map(|d| HEADROOM + d.len as usize)
            .sum();
        let mut put = 0;
        for (desc, data) in front {
            let fits = spare.count + 1 + self.count <= spare.slots.len()
                && spare.used + HEADROOM + data.len() + own_bytes <= spare.arena.len();
            if !fits || !spare.push_desc(desc, data) {
                break;
            }
            put += 1;
        }
        if put == 0 {
            return 0;
        }
        for i in 0..self.count {
            let desc = self.slots[i];
            // Room for every one of them was kept above.
            let pushed = spare.push_desc(&desc, self.data(i));
            debug_assert!(pushed);
        }
        spare.parsed = self.parsed;
        spare.round = self.round;
        spare.now_ns = spare.now_ns.max(self.now_ns);
        std::mem::swap(self, spare);
        put
    }

    /// Parses the last packet in place (for a source that decides per packet whether to
    /// keep it): its connection hash, or why it is malformed (also kept in its
    /// descriptor). `None` for an empty burst.
    #[inline]
    pub fn parse_last(&mut self, hasher: &FlowHasher) -> Option<Result<u64, Malformed>> {
        let d = self.slots[..self.count].last_mut()?;
        let data = &self.arena[d.offset as usize..(d.offset + d.len) as usize];
        let parsed = stateplane_wire::parse_in_place(data, d.in_port, hasher, &mut d.parsed);
        d.malformed = parsed.err();
        Some(parsed.map(|()| d.parsed.hash))
    }

    /// Takes the last packet back out, its bytes included (undoing its push).
    #[inline]
    pub fn pop(&mut self) {
        if let Some(d) = self.slots[..self.count].last() {
            self.used = d.offset as usize - usize::from(d.headroom);
            self.count -= 1;
        }
    }

    /// Parses every packet in place, once; returns how many are malformed.
    #[inline]
    pub fn parse(&mut self, hasher: &FlowHasher) -> usize {
        let mut bad = 0;
        for d in &mut self.slots[..self.count] {
            let data = &self.arena[d.offset as usize..(d.offset + d.len) as usize];
            if let Err(m) = stateplane_wire::parse_in_place(data, d.in_port, hasher, &mut d.parsed)
            {
                d.malformed = Some(m);
                bad += 1;
            }
        }
        self.parsed = true;
        bad
    }

    /// Keeps only the packets for which `keep` holds, in order; the bytes of the others
    /// stay in the arena as dead space until `clear`.
    pub fn retain(&mut self, mut keep: impl FnMut(&PacketDesc) -> bool) {
        let mut kept = 0;
        for i in 0..self.count {
            if keep(&self.slots[i]) {
                self.slots.swap(kept, i);
                kept += 1;
            }
        }
        self.count = kept;
    }

    /// Runs `f` on the packets for which `keep` holds, as if they were the whole burst
    /// (in their order); the others are out of its sight and come back afterwards,
    /// untouched and in their places. For a program that runs on part of a burst: a
    /// chain's later stages see only what the earlier ones passed. `f` must not add
    /// packets.
    pub fn with_only<R>(
        &mut self,
        keep: impl FnMut(&PacketDesc) -> bool,
        f: impl FnOnce(&mut Burst) -> R,
    ) -> R {
        let all = self.count;
        self.retain(keep);
        let hidden = self.count < all;
        let result = f(self);
        self.count = all;
        // Packets sit in the arena in arrival order and grow or shrink only within their
        // own room, so their offsets give that order back (nothing moved if none was
        // hidden).
        if hidden {
            self.slots[..all].sort_unstable_by_key(|d| d.offset);
        }
        result
    }

    pub fn descs(&self) -> &[PacketDesc] {
        &self.slots[..self.count]
    }

    pub fn descs_mut(&mut self) -> &mut [PacketDesc] {
        &mut self.slots[..self.count]
    }

    /// The bytes of packet `i`.
    pub fn data(&self, i: usize) -> &[u8] {
        let d = &self.descs()[i];
        &self.arena[d.offset as usize..(d.offset + d.len) as usize]
    }

    /// Packet `i`'s descriptor and bytes, mutable.
    pub fn packet_mut(&mut self, i: usize) -> PacketMut<'_> {
        let desc = &mut self.slots[..self.count][i];
        let data = &mut self.arena[desc.offset as usize..(desc.offset + desc.len) as usize];
        PacketMut { desc, data }
    }

    /// Makes packet `i` start `n` bytes earlier, in its headroom; its bytes, the first `n`
    /// of them for the caller to fill. `None` (and nothing changed) if its headroom is
    /// smaller. The parse's offsets still describe the frame as it was.
    pub fn grow_front(&mut self, i: usize, n: usize) -> Option<PacketMut<'_>> {
        let desc = self.slots[..self.count].get_mut(i)?;
        if usize::from(desc.headroom) < n {
            return None;
        }
        desc.headroom -= n as u8;
        desc.offset -= n as u32;
        desc.len += n as u32;
        desc.orig_len = desc.orig_len.saturating_add(n as u32);
        Some(self.packet_mut(i))
    }

    /// Drops the first `n` bytes of packet `i` (they become headroom); whether it had them.
    pub fn shrink_front(&mut self, i: usize, n: usize) -> bool {
        let Some(desc) = self.slots[..self.count].get_mut(i) else {
            return false;
        };
        if (desc.len as usize) < n || usize::from(desc.headroom) + n > usize::from(u8::MAX) {
            return false;
        }
        desc.headroom += n as u8;
        desc.offset += n as u32;
        desc.len -= n as u32;
        desc.orig_len = desc.orig_len.saturating_sub(n as u32).max(desc.len);
        true
    }

    /// Makes packet `i` its first `len` bytes, all of it on the wire (a reply shorter
    /// than the packet it is written over); whether it had them.
    pub fn truncate(&mut self, i: usize, len: usize) -> bool {
        let Some(desc) = self.slots[..self.count].get_mut(i) else {
            return false;
        };
        if (desc.len as usize) < len {
            return false;
        }
        desc.len = len as u32;
        desc.orig_len = len as u32;
        true
    }

    /// Each packet with its descriptor and its bytes, mutable, in order.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = PacketMut<'_>> {
        let mut rest: &mut [u8] = &mut self.arena[..self.used];
        let mut consumed = 0usize;
        self.slots[..self.count].iter_mut().map(move |desc| {
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
        self.descs().iter().map(|d| {
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
    fn reused_slots_start_clean_and_retain_keeps_order() {
        let h = FlowHasher::with_seed(1);
        let mut b = Burst::with_capacity(4);
        b.push(&[0u8; 10], 10, 5, 0, 0);
        assert_eq!(b.parse(&h), 1);
        b.descs_mut()[0].verdict = Verdict::Forward(1);
        b.clear();
        // The slot is reused: its malformed mark and verdict from the last burst are gone.
        b.push(&[1u8; 10], 10, 3, 0, 7);
        assert_eq!(
            (
                b.descs()[0].malformed,
                b.descs()[0].verdict,
                b.descs()[0].seq
            ),
            (None, Verdict::Drop(DropReason::NO_VERDICT), 7)
        );
        assert_eq!(b.now_ns, 5, "the clock never goes back");
        for i in 1..4u8 {
            b.push(&[i + 1; 10], 10, 6, 0, u64::from(i) + 7);
        }
        b.retain(|d| d.seq % 2 == 1);
        assert_eq!(b.descs().iter().map(|d| d.seq).collect::<Vec<_>>(), [7, 9]);
        assert_eq!(b.data(1), &[3; 10]);
    }

    /// A packet parsed where it lies and taken back out leaves the burst as it was: the
    /// next push lands where it had, and its bytes and descriptor are the new packet's.
    #[test]
    fn the_last_packet_parses_in_place_and_pops_without_a_trace() {
        let h = FlowHasher::with_seed(1);
        let mut b = Burst::with_capacity(4);
        assert_eq!(b.parse_last(&h), None);
        b.pop(); // nothing to take out
        let hosts = stateplane_gen::build::Hosts {
            src_mac: stateplane_wire::ethernet::MacAddr([2, 0, 0, 0, 0, 1]),
            dst_mac: stateplane_wire::ethernet::MacAddr([2, 0, 0, 0, 0, 2]),
            vlan: 0,
            src: [198, 18, 0, 1].into(),
            dst: [198, 18, 0, 2].into(),
            ttl: 64,
        };
        let l4 = stateplane_gen::build::L4::Udp {
            src_port: 5,
            dst_port: 6,
        };
        let mut frame = Vec::new();
        stateplane_gen::build::emit_frame(&mut frame, &hosts, &l4, b"x");
        b.push(&frame, frame.len() as u32, 1, 0, 0);
        let hash = b.parse_last(&h).unwrap().unwrap();
        assert_eq!(hash, stateplane_wire::parse(&frame, 0, &h).unwrap().hash);
        let used = b.used;
        b.push(&[0u8; 10], 10, 2, 0, 1);
        assert!(matches!(b.parse_last(&h), Some(Err(_))));
        assert!(b.descs()[1].malformed.is_some());
        b.pop();
        assert_eq!((b.len(), b.used), (1, used));
        b.push(&[9u8; 12], 12, 3, 0, 2);
        assert_eq!(b.data(1), &[9; 12]);
        assert_eq!(b.descs()[1].seq, 2);
        assert_eq!(b.data(0), &frame[..]);
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

    #[test]
    fn a_part_of_a_burst_is_worked_on_alone_and_the_rest_comes_back_in_place() {
        let mut b = Burst::with_capacity(8);
        for i in 0..6u8 {
            b.push(&[i; 30], 30, 0, 0, u64::from(i));
            b.descs_mut()[usize::from(i)].verdict = if i % 2 == 0 {
                Verdict::Forward(1)
            } else {
                Verdict::Drop(DropReason::program(0))
            };
        }
        let seen = b.with_only(
            |d| d.verdict == Verdict::Forward(1),
            |part| {
                // The even packets, in order; one grows into its headroom on the way.
                let seen: Vec<u64> = part.descs().iter().map(|d| d.seq).collect();
                part.grow_front(1, 4).unwrap().data[..4].fill(0xee);
                for d in part.descs_mut() {
                    d.verdict = Verdict::Forward(2);
                }
                seen
            },
        );
        assert_eq!(seen, [0, 2, 4]);
        let order: Vec<u64> = b.descs().iter().map(|d| d.seq).collect();
        assert_eq!(order, [0, 1, 2, 3, 4, 5], "back in arrival order");
        for (i, d) in b.descs().iter().enumerate() {
            let want = if i % 2 == 0 {
                Verdict::Forward(2)
            } else {
                Verdict::Drop(DropReason::program(0))
            };
            assert_eq!(d.verdict, want, "packet {i}");
        }
        assert_eq!(
            &b.data(2)[..5],
            &[0xee, 0xee, 0xee, 0xee, 2],
            "the grown one kept"
        );
        assert_eq!(b.data(3), &[3u8; 30], "a hidden one untouched");
    }

    #[test]
    fn held_packets_come_back_with_their_descriptors_in_front_or_behind() {
        let mut b = Burst::with_capacity(4);
        assert!(b.push(&[1; 60], 60, 10, 0, 1));
        assert!(b.push(&[2; 70], 70, 20, 1, 2));
        // Two packets held elsewhere, each with its verdict and sequence as it was.
        let mut held = Burst::with_capacity(4);
        assert!(held.push(&[7; 80], 90, 5, 1, 7));
        assert!(held.push(&[8; 40], 40, 6, 0, 8));
        assert!(held.push(&[9; 40], 40, 7, 0, 9));
        held.descs_mut()[0].verdict = Verdict::Forward(1);
        let front: Vec<(PacketDesc, Vec<u8>)> =
            held.iter().map(|(d, data)| (*d, data.to_vec())).collect();
        let mut spare = Burst::default();
        // A burst of no room takes none in front, and nothing changes.
        assert_eq!(
            b.put_in_front(&mut spare, front.iter().map(|(d, v)| (d, &v[..]))),
            0
        );
        assert_eq!(b.len(), 2);
        // Room for two in front of the burst's own two.
        let mut spare = Burst::with_capacity(4);
        let put = b.put_in_front(&mut spare, front.iter().map(|(d, v)| (d, &v[..])));
        assert_eq!(put, 2);
        let seqs: Vec<u64> = b.descs().iter().map(|d| d.seq).collect();
        assert_eq!(seqs, [7, 8, 1, 2]);
        assert_eq!(b.data(0), &[7; 80]);
        assert_eq!(b.descs()[0].orig_len, 90);
        assert_eq!(b.descs()[0].verdict, Verdict::Forward(1));
        assert_eq!(b.data(3), &[2; 70]);
        assert_eq!(b.descs()[3].in_port, 1);
        // The third comes behind once there is room, and a full burst refuses it.
        b.pop();
        assert!(b.push_desc(&front[2].0, &front[2].1));
        assert_eq!(b.descs()[3].seq, 9);
        assert!(!b.push_desc(&front[2].0, &front[2].1));
    }

    /// The length on the wire follows what a program adds or takes at the front; a packet
    /// cut at its snap length stays as much longer than its bytes as it was.
    #[test]
    fn the_length_on_the_wire_follows_the_front() {
        let mut b = Burst::with_capacity(2);
        b.push(&[1u8; 100], 100, 0, 0, 0);
        b.push(&[2u8; 100], 1500, 0, 0, 1);
        b.grow_front(0, 36).unwrap();
        b.grow_front(1, 36).unwrap();
        let lens = |b: &Burst| {
            b.descs()
                .iter()
                .map(|d| (d.len, d.orig_len))
                .collect::<Vec<_>>()
        };
        assert_eq!(lens(&b), [(136, 136), (136, 1536)]);
        assert!(b.shrink_front(0, 50) && b.shrink_front(1, 50));
        assert_eq!(lens(&b), [(86, 86), (86, 1486)]);
    }

    #[test]
    fn a_packet_grows_into_its_own_headroom_only() {
        let mut b = Burst::with_capacity(2);
        b.push(&[1u8; 20], 20, 0, 0, 0);
        b.push(&[2u8; 20], 20, 0, 0, 1);
        let p = b.grow_front(1, HEADROOM).unwrap();
        p.data[..HEADROOM].fill(9);
        assert!(b.grow_front(1, 1).is_none(), "its headroom is used up");
        assert_eq!(b.data(0), &[1u8; 20], "the packet before is untouched");
        assert!(b.data(1)[..HEADROOM].iter().all(|&x| x == 9));
        assert_eq!(b.data(1)[HEADROOM], 2);
        assert!(b.shrink_front(1, HEADROOM));
        assert_eq!(b.data(1), &[2u8; 20]);
        assert!(
            b.grow_front(1, HEADROOM).is_some(),
            "shrinking gives it back"
        );
        assert!(!b.shrink_front(0, 21));
    }

    #[test]
    fn a_packet_is_cut_to_its_first_bytes_and_the_next_keeps_its_own() {
        let mut b = Burst::with_capacity(3);
        b.push(&[1u8; 2000], 2000, 0, 0, 0);
        b.push(&[2u8; 20], 20, 0, 0, 1);
        assert!(!b.truncate(0, 2001), "no bytes it does not have");
        assert!(b.truncate(0, 60));
        assert_eq!(b.data(0), &[1u8; 60]);
        assert_eq!(b.descs()[0].orig_len, 60, "all of it on the wire");
        assert_eq!(b.data(1), &[2u8; 20]);
        let lens: Vec<usize> = b.iter_mut().map(|p| p.data.len()).collect();
        assert_eq!(lens, [60, 20]);
        assert!(!b.truncate(2, 0), "no such packet");
    }
}
