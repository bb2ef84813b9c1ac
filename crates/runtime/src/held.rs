//! Packets held across bursts: a state stage's parking place (replication: a packet whose
//! flow waits for its lease, an output that waits for the store). A packet is copied out
//! of its burst with its descriptor and goes back into a later one
//! ([`crate::Burst::push_desc`], [`crate::Burst::put_in_front`]), so the worker goes on
//! with other packets meanwhile and never waits.
//!
//! Owns: the held packets' bytes (buffers reused, so a busy worker stops allocating once
//! it has held its most), their occupancy, and the bound on their buffers' bytes (held
//! and spare together), which [`Held::has_room`] answers.
//!
//! Must never: decide what is held or for how long (the stage that holds a packet bounds
//! both and accounts for each: it goes out, or is dropped and counted).

use crate::burst::PacketDesc;
use std::collections::HashMap;

/// One held packet: its descriptor as it was in its burst, its bytes, and what the
/// holder keeps of it.
pub struct HeldPacket<T> {
    pub desc: PacketDesc,
    pub data: Vec<u8>,
    pub meta: T,
}

/// Packets held by name (the holder's token).
pub struct Held<T> {
    packets: HashMap<u64, HeldPacket<T>>,
    /// Buffers of packets gone, for the next ones.
    spare: Vec<Vec<u8>>,
    bytes: usize,
    most: usize,
    /// The bytes of every buffer it owns (held and spare), and of the spare ones.
    buffered: usize,
    spare_bytes: usize,
    limit: usize,
}

impl<T> Default for Held<T> {
    fn default() -> Self {
        Held::with_limit(usize::MAX)
    }
}

impl<T> Held<T> {
    /// A parking place whose buffers take at most `limit` bytes, as long as holders hold
    /// only what [`Held::has_room`] allows.
    pub fn with_limit(limit: usize) -> Self {
        Held {
            packets: HashMap::new(),
            spare: Vec::new(),
            bytes: 0,
            most: 0,
            buffered: 0,
            spare_bytes: 0,
            limit,
        }
    }

    /// Whether a packet of `len` bytes can be held within the limit (spare buffers are
    /// given up to make room).
    pub fn has_room(&self, len: usize) -> bool {
        (self.buffered - self.spare_bytes).saturating_add(len) <= self.limit
    }

    /// Holds a copy of a packet under `token` (a token already held is replaced).
    pub fn hold(&mut self, token: u64, desc: &PacketDesc, data: &[u8], meta: T) {
        let mut buf = self.spare.pop().unwrap_or_default();
        let before = buf.capacity();
        self.spare_bytes -= before;
        buf.clear();
        buf.extend_from_slice(data);
        self.buffered += buf.capacity() - before;
        self.bytes += buf.len();
        // Past the limit, spare buffers go first.
        while self.buffered > self.limit {
            let Some(spare) = self.spare.pop() else {
                break;
            };
            (self.buffered, self.spare_bytes) = (
                self.buffered - spare.capacity(),
                self.spare_bytes - spare.capacity(),
            );
        }
        let packet = HeldPacket {
            desc: *desc,
            data: buf,
            meta,
        };
        if let Some(old) = self.packets.insert(token, packet) {
            (self.bytes, self.buffered) = (
                self.bytes - old.data.len(),
                self.buffered - old.data.capacity(),
            );
            self.recycle(old);
        }
        self.most = self.most.max(self.packets.len());
    }

    pub fn get(&self, token: u64) -> Option<&HeldPacket<T>> {
        self.packets.get(&token)
    }

    pub fn get_mut(&mut self, token: u64) -> Option<&mut HeldPacket<T>> {
        self.packets.get_mut(&token)
    }

    /// Takes a packet out; hand it back to [`Held::recycle`] once its bytes are copied.
    pub fn take(&mut self, token: u64) -> Option<HeldPacket<T>> {
        let packet = self.packets.remove(&token)?;
        self.bytes -= packet.data.len();
        // Out of its keeping until recycled.
        self.buffered -= packet.data.capacity();
        Some(packet)
    }

    /// Keeps a taken packet's buffer for the next (within the limit).
    pub fn recycle(&mut self, packet: HeldPacket<T>) {
        // Spare buffers for as many packets as were ever held at once, no more.
        let capacity = packet.data.capacity();
        if self.spare.len() < self.most && self.buffered + capacity <= self.limit {
            (self.buffered, self.spare_bytes) =
                (self.buffered + capacity, self.spare_bytes + capacity);
            self.spare.push(packet.data);
        }
    }

    /// The tokens of the packets held, in no order.
    pub fn tokens(&self) -> impl Iterator<Item = u64> + '_ {
        self.packets.keys().copied()
    }

    /// Packets held now.
    pub fn len(&self) -> usize {
        self.packets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packets.is_empty()
    }

    /// Their bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The most packets held at once so far.
    pub fn most(&self) -> usize {
        self.most
    }

    /// The bytes of the buffers it keeps, held and spare.
    pub fn buffered(&self) -> usize {
        self.buffered
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Burst;

    #[test]
    fn a_packet_comes_back_as_it_went_and_the_counts_follow() {
        let mut b = Burst::with_capacity(2);
        assert!(b.push(&[5; 100], 120, 42, 1, 9));
        let mut held: Held<&str> = Held::default();
        held.hold(3, &b.descs()[0], b.data(0), "flow a");
        held.hold(4, &b.descs()[0], &b.data(0)[..10], "flow b");
        assert_eq!((held.len(), held.bytes(), held.most()), (2, 110, 2));
        b.clear();
        let p = held.take(3).unwrap();
        assert_eq!((p.desc.seq, p.desc.orig_len, p.meta), (9, 120, "flow a"));
        assert!(b.push_desc(&p.desc, &p.data));
        assert_eq!(b.data(0), &[5; 100]);
        held.recycle(p);
        assert!(held.take(3).is_none());
        assert_eq!((held.len(), held.bytes(), held.most()), (1, 10, 2));
        // A reused buffer carries nothing of its last packet.
        held.hold(5, &b.descs()[0], &[1, 2], "flow c");
        assert_eq!(held.get(5).unwrap().data, [1, 2]);
        assert_eq!(held.bytes(), 12);
    }

    /// Buffers, held and spare together, stay within the limit while the holder asks
    /// `has_room` first: spare ones are given up to make room, and a returned one that
    /// would pass the limit is not kept.
    #[test]
    fn buffers_stay_within_the_limit() {
        let mut b = Burst::with_capacity(1);
        assert!(b.push(&[5; 100], 100, 42, 1, 9));
        let d = b.descs()[0];
        let mut held: Held<()> = Held::with_limit(1000);
        for t in 0..9 {
            assert!(held.has_room(100));
            held.hold(t, &d, &[1; 100], ());
        }
        assert_eq!(held.buffered(), 900);
        assert!(held.has_room(100) && !held.has_room(101));
        for t in 0..5 {
            let p = held.take(t).unwrap();
            held.recycle(p);
        }
        assert_eq!(
            (held.len(), held.buffered()),
            (4, 900),
            "five spare buffers"
        );
        assert!(held.has_room(600), "spare buffers can go");
        held.hold(100, &d, &[2; 600], ());
        assert_eq!(held.get(100).unwrap().data, [2; 600]);
        assert_eq!(
            (held.buffered(), held.bytes()),
            (1000, 1000),
            "spares given up"
        );
        // A buffer taken out and never returned leaves the count.
        drop(held.take(100));
        assert_eq!(held.buffered(), 400);
        // Holding under a token held replaces it and its bytes.
        held.hold(200, &d, &[3; 50], ());
        held.hold(200, &d, &[4; 70], ());
        assert_eq!((held.len(), held.bytes()), (5, 470));
    }
}
