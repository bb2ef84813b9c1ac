//! Packets held across bursts: a state stage's parking place (replication: a packet whose
//! flow waits for its lease, an output that waits for the store). A packet is copied out
//! of its burst with its descriptor and goes back into a later one
//! ([`crate::Burst::push_desc`], [`crate::Burst::put_in_front`]), so the worker goes on
//! with other packets meanwhile and never waits.
//!
//! Owns: the held packets' bytes (buffers reused, so a busy worker stops allocating once
//! it has held its most) and their occupancy.
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
}

impl<T> Default for Held<T> {
    fn default() -> Self {
        Held {
            packets: HashMap::new(),
            spare: Vec::new(),
            bytes: 0,
            most: 0,
        }
    }
}

impl<T> Held<T> {
    /// Holds a copy of a packet under `token` (a token already held is replaced).
    pub fn hold(&mut self, token: u64, desc: &PacketDesc, data: &[u8], meta: T) {
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.extend_from_slice(data);
        self.bytes += buf.len();
        let packet = HeldPacket {
            desc: *desc,
            data: buf,
            meta,
        };
        if let Some(old) = self.packets.insert(token, packet) {
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
        Some(packet)
    }

    /// Keeps a taken packet's buffer for the next.
    pub fn recycle(&mut self, packet: HeldPacket<T>) {
        // Spare buffers for as many packets as were ever held at once, no more.
        if self.spare.len() < self.most {
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
}
