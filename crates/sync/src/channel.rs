//! A sync channel on a virtual clock, with what a real one does to messages: it carries
//! so many bytes a second and queues so many before it drops (a link's or a socket's
//! queue); and at configured rates it loses, duplicates and delays them (delay reorders).
//! Seeded, so that a run repeats. For the simulation and the experiments, which feed it
//! `(now, bytes)`, and for `stateplane relay`, the fault injection of tests with real
//! processes, on the wall clock; never on a switch's or a collector's own path.

use crate::wire::{DecodeError, Message};
use crate::write::{Completed, WriteEngine, WriteStage, WriteTarget};
use stateplane_gen::rng::Rng;
use std::collections::BTreeMap;

/// What goes wrong on the way, at these rates.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// Chance that a message is lost.
    pub loss: f64,
    /// Chance that a message arrives twice.
    pub duplicate: f64,
    /// Each copy is delayed by up to this long, drawn uniformly.
    pub max_delay_ns: u64,
}

#[derive(Clone, Copy, Debug)]
pub struct ChannelConfig {
    /// Bytes a second the channel carries; 0: as many as come.
    pub bytes_per_second: u64,
    /// Bytes it holds not yet sent, the message on the wire included (a send buffer); a
    /// message that would make it hold more is dropped (one always fits an idle wire).
    pub buffer_bytes: u64,
    /// The fixed delay of every message (propagation).
    pub latency_ns: u64,
    pub faults: Faults,
    pub seed: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelCounters {
    pub sent: u64,
    pub sent_bytes: u64,
    /// Dropped because the queue was full: the channel's capacity exceeded.
    pub dropped_full: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub delivered: u64,
}

/// What became of a message sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Dropped: the buffer was full.
    Dropped,
    Lost,
    /// On its way, in one copy or two.
    Sent {
        copies: u8,
    },
}

pub struct Channel {
    config: ChannelConfig,
    rng: Rng,
    /// When the wire is free again.
    busy_until_ns: u64,
    /// In flight, by arrival then order of sending.
    flight: BTreeMap<(u64, u64), Vec<u8>>,
    order: u64,
    pub counters: ChannelCounters,
}

impl Channel {
    pub fn new(config: ChannelConfig) -> Channel {
        Channel {
            rng: Rng::new(config.seed),
            config,
            busy_until_ns: 0,
            flight: BTreeMap::new(),
            order: 0,
            counters: ChannelCounters::default(),
        }
    }

    /// From now on, `faults`.
    pub fn set_faults(&mut self, faults: Faults) {
        self.config.faults = faults;
    }

    /// How long `bytes` take on the wire.
    fn wire_ns(&self, bytes: u64) -> u64 {
        match self.config.bytes_per_second {
            0 => 0,
            rate => (u128::from(bytes) * 1_000_000_000 / u128::from(rate)) as u64,
        }
    }

    /// Sends `bytes` at `now_ns`.
    pub fn send(&mut self, now_ns: u64, bytes: Vec<u8>) -> Fate {
        self.counters.sent += 1;
        self.counters.sent_bytes += bytes.len() as u64;
        let start = self.busy_until_ns.max(now_ns);
        let queued_ns = start - now_ns;
        let queued_bytes = match self.config.bytes_per_second {
            0 => 0,
            rate => (u128::from(queued_ns) * u128::from(rate) / 1_000_000_000) as u64,
        };
        if queued_bytes + bytes.len() as u64 > self.config.buffer_bytes.max(bytes.len() as u64)
            && queued_ns > 0
        {
            self.counters.dropped_full += 1;
            return Fate::Dropped;
        }
        let done = start + self.wire_ns(bytes.len() as u64);
        self.busy_until_ns = done;
        let faults = self.config.faults;
        if self.rng.chance(faults.loss) {
            self.counters.lost += 1;
            return Fate::Lost;
        }
        let copies: u8 = if self.rng.chance(faults.duplicate) {
            self.counters.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let delay = match faults.max_delay_ns {
                0 => 0,
                max => self.rng.below(max + 1),
            };
            let arrival = done + self.config.latency_ns + delay;
            self.flight.insert((arrival, self.order), bytes.clone());
            self.order += 1;
        }
        Fate::Sent { copies }
    }

    /// Appends what has arrived by `now_ns` to `out`, in order of arrival.
    pub fn deliver(&mut self, now_ns: u64, out: &mut Vec<Vec<u8>>) {
        while let Some(entry) = self.flight.first_entry() {
            if entry.key().0 > now_ns {
                break;
            }
            out.push(entry.remove());
            self.counters.delivered += 1;
        }
    }

    /// Whether nothing is in flight.
    pub fn is_idle(&self) -> bool {
        self.flight.is_empty()
    }
}

/// A write's way between a collector's engine and a switch's stage, over a channel each
/// way, stepped on the virtual clock (what the simulation and the experiments share).
pub struct WriteLink {
    pub down: Channel,
    pub up: Channel,
    out: Vec<Message>,
    arrived: Vec<Vec<u8>>,
}

impl WriteLink {
    pub fn new(down: Channel, up: Channel) -> WriteLink {
        WriteLink {
            down,
            up,
            out: Vec::new(),
            arrived: Vec::new(),
        }
    }

    /// At `now_ns`: the engine's parts go down; the answers of the writes the caller
    /// committed since the last step (between its bursts) go up
    /// ([`WriteStage::take_answers`]); the parts arrived reach the stage (reading `state`),
    /// and its acknowledgements go up; those arrived reach the engine. The write the
    /// engine sees completed, if one.
    pub fn step(
        &mut self,
        now_ns: u64,
        engine: &mut WriteEngine,
        stage: &mut WriteStage,
        state: &mut impl WriteTarget,
    ) -> Result<Option<Completed>, DecodeError> {
        // Encoding takes no virtual time: every part due goes now.
        let mut more = true;
        while more {
            more = engine.poll_with(now_ns, |datagram, copies| {
                let bytes = datagram.to_vec();
                for _ in 1..copies {
                    let _ = self.down.send(now_ns, bytes.clone());
                }
                let _ = self.down.send(now_ns, bytes);
            });
        }
        // No reports cross this channel: the switch knows of no loss toward the collector,
        // so its answers go in the least copies and its acknowledgements once.
        stage.take_answers(&mut self.out);
        for answer in self.out.drain(..) {
            let bytes = encoded(&answer);
            for _ in 0..WriteStage::answer_copies(0.0) {
                let _ = self.up.send(now_ns, bytes.clone());
            }
        }
        self.down.deliver(now_ns, &mut self.arrived);
        for bytes in self.arrived.drain(..) {
            // As a switch takes them: a part that is a stretch as its values.
            let (part, stretch) = Message::decode_write_part(None, &bytes, |_| false)?;
            if let Some(ack) = stage.on_part_carrying(part, stretch, state) {
                let _ = self.up.send(now_ns, encoded(&ack));
            }
        }
        self.up.deliver(now_ns, &mut self.arrived);
        let mut completed = None;
        for bytes in self.arrived.drain(..) {
            completed = engine
                .on_ack(now_ns, &Message::decode(&bytes)?)
                .or(completed);
        }
        Ok(completed)
    }
}

fn encoded(m: &Message) -> Vec<u8> {
    let mut bytes = Vec::new();
    m.encode(&mut bytes);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(bytes_per_second: u64, buffer_bytes: u64) -> ChannelConfig {
        ChannelConfig {
            bytes_per_second,
            buffer_bytes,
            latency_ns: 1_000,
            faults: Faults::default(),
            seed: 1,
        }
    }

    #[test]
    fn a_full_queue_drops_and_a_free_wire_carries_at_its_rate() {
        // 1,000 bytes a second: a 100-byte message takes 100 ms on the wire; 250 bytes of
        // buffer hold it and one more.
        let mut c = Channel::new(config(1_000, 250));
        for _ in 0..4 {
            let _ = c.send(0, vec![0; 100]);
        }
        assert_eq!(
            c.counters.dropped_full, 2,
            "one on the wire, one queued, two dropped"
        );
        let mut got = Vec::new();
        c.deliver(100_000_999, &mut got);
        assert!(
            got.is_empty(),
            "the first arrives after its 100 ms and the latency"
        );
        c.deliver(100_001_000, &mut got);
        assert_eq!(got.len(), 1);
        c.deliver(200_001_000, &mut got);
        assert_eq!(got.len(), 2);
        assert!(c.is_idle());
    }

    #[test]
    fn faults_lose_duplicate_and_reorder_at_their_rates() {
        let mut c = Channel::new(ChannelConfig {
            faults: Faults {
                loss: 0.2,
                duplicate: 0.1,
                max_delay_ns: 1_000_000,
            },
            ..config(0, 0)
        });
        for i in 0..10_000u32 {
            let _ = c.send(u64::from(i) * 1_000, i.to_be_bytes().to_vec());
        }
        let mut got = Vec::new();
        c.deliver(u64::MAX, &mut got);
        let n = &c.counters;
        assert!((1_800..2_200).contains(&n.lost), "{n:?}");
        assert!((700..1_100).contains(&n.duplicated), "{n:?}");
        assert_eq!(got.len() as u64, 10_000 - n.lost + n.duplicated);
        assert!(
            got.windows(2).any(|w| w[0] > w[1]),
            "some arrive out of order"
        );
    }
}
