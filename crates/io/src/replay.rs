//! In-memory replay: a trace loaded once, split into per-worker queues by flow hash (as a
//! NIC's RSS would), and replayed N times with no file I/O in the measured loop.

use crate::capture::{CaptureError, CaptureReader};
use crate::hugemem::HugeBuf;
use stateplane_runtime::Burst;
use stateplane_runtime::BurstSource;
use stateplane_wire::flow::shard_of;
use stateplane_wire::{FlowHasher, parse};
use std::fs::File;
use std::io::BufReader;
use std::path::Path;

#[derive(Clone, Copy, Debug)]
struct ReplayPacket {
    offset: usize,
    len: u32,
    orig_len: u32,
    ts_ns: u64,
}

/// Packets packed back to back in one (huge-page) buffer.
struct Packed {
    data: HugeBuf,
    used: usize,
    packets: Vec<ReplayPacket>,
}

impl Packed {
    fn with_capacity(bytes: usize, packets: usize, huge: bool) -> Self {
        Packed {
            data: HugeBuf::new(bytes, huge),
            used: 0,
            packets: Vec::with_capacity(packets),
        }
    }

    /// Appends a packet; `false` if the buffer is full.
    fn push(&mut self, data: &[u8], orig_len: u32, ts_ns: u64) -> bool {
        let end = self.used + data.len();
        if end > self.data.len() {
            return false;
        }
        self.data.as_mut_slice()[self.used..end].copy_from_slice(data);
        self.packets.push(ReplayPacket {
            offset: self.used,
            len: data.len() as u32,
            orig_len,
            ts_ns,
        });
        self.used = end;
        true
    }

    fn bytes(&self, p: &ReplayPacket) -> &[u8] {
        &self.data.as_slice()[p.offset..p.offset + p.len as usize]
    }
}

/// A whole trace in memory.
pub struct ReplayTrace {
    packed: Packed,
}

impl ReplayTrace {
    /// Loads up to `limit` packets of a capture file into memory.
    pub fn load(path: &Path, limit: Option<usize>, huge: bool) -> Result<Self, CaptureError> {
        let file = File::open(path)?;
        let size = file.metadata()?.len() as usize;
        let mut reader = CaptureReader::new(BufReader::with_capacity(1 << 20, file))?;
        // Packet bytes never exceed the file's size, so one allocation holds them all.
        let mut packed = Packed::with_capacity(size, size / 80, huge);
        while let Some(rec) = reader.next_record()? {
            if limit.is_some_and(|l| packed.packets.len() >= l) {
                break;
            }
            packed.push(rec.data, rec.orig_len, rec.ts_ns);
        }
        Ok(ReplayTrace { packed })
    }

    /// A trace from packets already in memory: (timestamp, bytes).
    pub fn from_packets<'a>(packets: impl IntoIterator<Item = (u64, &'a [u8])>) -> Self {
        let packets: Vec<_> = packets.into_iter().collect();
        let bytes = packets.iter().map(|p| p.1.len()).sum();
        let mut packed = Packed::with_capacity(bytes, packets.len(), false);
        for (ts, d) in packets {
            packed.push(d, d.len() as u32, ts);
        }
        ReplayTrace { packed }
    }

    pub fn len(&self) -> usize {
        self.packed.packets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packed.packets.is_empty()
    }

    /// Captured bytes of all packets.
    pub fn bytes(&self) -> u64 {
        self.packed.used as u64
    }

    /// Whether the trace's memory got huge pages.
    pub fn is_huge(&self) -> bool {
        self.packed.data.is_huge()
    }

    /// Splits the trace into `n` queues by flow hash, each replayed `loops` times and
    /// delivered on `in_port`. Malformed packets go to queue 0 (where they are counted).
    pub fn into_queues(
        &self,
        n: usize,
        hasher: &FlowHasher,
        loops: u64,
        in_port: u16,
        huge: bool,
    ) -> Vec<ReplayQueue> {
        let n = n.max(1);
        let mut shard_bytes = vec![0usize; n];
        let mut shard_of_packet = Vec::with_capacity(self.len());
        for p in &self.packed.packets {
            let s = parse(self.packed.bytes(p), in_port, hasher)
                .map(|x| shard_of(x.hash, n))
                .unwrap_or(0);
            shard_bytes[s] += p.len as usize;
            shard_of_packet.push(s);
        }
        let mut shards: Vec<Packed> = shard_bytes
            .iter()
            .map(|&b| Packed::with_capacity(b, b / 60 + 1, huge))
            .collect();
        for (p, &s) in self.packed.packets.iter().zip(&shard_of_packet) {
            shards[s].push(self.packed.bytes(p), p.orig_len, p.ts_ns);
        }
        let first = self.packed.packets.first().map_or(0, |p| p.ts_ns);
        let last = self.packed.packets.last().map_or(0, |p| p.ts_ns);
        let span_ns = last.saturating_sub(first) + 1;
        shards
            .into_iter()
            .map(|packed| ReplayQueue {
                packed,
                pos: 0,
                round: 0,
                loops,
                span_ns,
                in_port,
                seq: 0,
            })
            .collect()
    }
}

/// One worker's share of a trace, replayed `loops` times. Each replay shifts timestamps by
/// the trace's span, so the data-plane clock keeps moving forward.
pub struct ReplayQueue {
    packed: Packed,
    pos: usize,
    round: u64,
    loops: u64,
    span_ns: u64,
    in_port: u16,
    seq: u64,
}

impl ReplayQueue {
    pub fn len(&self) -> usize {
        self.packed.packets.len()
    }

    pub fn is_empty(&self) -> bool {
        self.packed.packets.is_empty()
    }

    pub fn is_huge(&self) -> bool {
        self.packed.data.is_huge()
    }
}

impl BurstSource for ReplayQueue {
    #[inline]
    fn fill(&mut self, burst: &mut Burst) -> bool {
        let packets = &self.packed.packets;
        let bytes = self.packed.data.as_slice();
        if packets.is_empty() {
            return false;
        }
        let mut added = false;
        while self.round < self.loops {
            let Some(p) = packets.get(self.pos) else {
                self.pos = 0;
                self.round += 1;
                continue;
            };
            let data = &bytes[p.offset..p.offset + p.len as usize];
            let ts = p.ts_ns + self.round * self.span_ns;
            if !burst.push(data, p.orig_len, ts, self.in_port, self.seq) {
                break;
            }
            added = true;
            self.seq += 1;
            self.pos += 1;
        }
        added
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(src: u8, sport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12] = 0x08;
        f[14] = 0x45;
        f[16..18].copy_from_slice(&28u16.to_be_bytes());
        f[23] = 17;
        f[26..30].copy_from_slice(&[198, 18, 0, src]);
        f[30..34].copy_from_slice(&[198, 18, 1, 1]);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&53u16.to_be_bytes());
        f[38..40].copy_from_slice(&8u16.to_be_bytes());
        f
    }

    #[test]
    fn queues_split_by_flow_and_replay_every_packet_n_times() {
        let frames: Vec<Vec<u8>> = (0..200u16)
            .map(|i| frame((i % 7) as u8, 1000 + i % 13))
            .collect();
        let trace = ReplayTrace::from_packets(
            frames
                .iter()
                .enumerate()
                .map(|(i, f)| (i as u64 * 10, &f[..])),
        );
        let hasher = FlowHasher::with_seed(5);
        let mut queues = trace.into_queues(3, &hasher, 4, 0, false);
        assert_eq!(queues.iter().map(ReplayQueue::len).sum::<usize>(), 200);
        let mut flows_seen: std::collections::HashMap<_, usize> = Default::default();
        let mut total = 0;
        for (q, queue) in queues.iter_mut().enumerate() {
            let mut burst = Burst::with_capacity(32);
            let mut last_ts = 0;
            while queue.fill(&mut burst) {
                for (d, data) in burst.iter() {
                    let key = parse(data, 0, &hasher).unwrap().key;
                    assert_eq!(
                        *flows_seen.entry(key).or_insert(q),
                        q,
                        "a flow reached two queues"
                    );
                    assert!(d.ts_ns >= last_ts, "time went backwards across replays");
                    last_ts = d.ts_ns;
                    total += 1;
                }
                burst.clear();
            }
        }
        assert_eq!(total, 800);
    }
}
