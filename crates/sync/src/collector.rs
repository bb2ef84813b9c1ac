//! The collector whole, with no I/O: datagrams in (with the address each came from),
//! datagrams out (reports, the parts of writes), and what applications ask of it (reads
//! with their bound, the streams' freshness and loss, writes into a switch, the changes
//! as they are applied). `stateplane collector` is a shell of sockets around it.
//!
//! Must never: apply a message the decoder or the mirror refused (each is counted by
//! reason), or send to an address no accepted message came from (a spoofed datagram
//! cannot turn the collector on someone else).

use crate::Location;
use crate::mirror::{Gathered, Mirror, MirrorCounters, Reading};
use crate::sender::SyncedState;
use crate::wire::{ENTRY_LEN, HEADER_LEN, Key, Kind, MAC_LEN, Message};
use crate::write::{Cancel, Completed, WriteEngine, WriteValues};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::net::SocketAddr;

/// A write's parts go again after this long unacknowledged, before any round trip is
/// measured.
const FIRST_RTO_NS: u64 = 10_000_000;

/// A stream not heard from for this long, and for ten times the longest gap between its
/// messages so far (a switch whose passes are slow speaks less often than every 10 ms), is
/// taken as gone: its writes' parts and abandons wait until it speaks again, rather than
/// going to a dead address every timeout for as long as the collector runs.
pub const SILENT_NS: u64 = 1_000_000_000;

/// Changes kept for subscribers that fall behind (older ones are counted as missed).
pub const CHANGES_KEPT: usize = 1 << 20;

/// What the collector knows of one stream (one worker of one switch).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamInfo {
    pub switch: u32,
    pub stream: u16,
    pub epoch: u32,
    /// The last message applied, and when the switch sent it (its clock).
    pub last_seq: u64,
    pub as_of_ns: u64,
    /// When the collector applied it (the collector's clock): freshness is now less this.
    pub applied_ns: u64,
    /// Messages found missing so far.
    pub missing: u64,
    /// The `t_max` of the last message applied: the threshold the switch works with.
    pub threshold: u64,
    pub locations: usize,
    /// Per state, one past the largest index carried (`Mirror::extents`).
    pub extents: Vec<(u16, u32)>,
    /// The synced states as the stream announced them (`Mirror::layout`).
    pub layout: Vec<SyncedState>,
    pub writes_in_flight: bool,
}

/// One location's value as applied, for subscribers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Applied {
    /// Its place among every change applied (from 1), for a subscriber's cursor.
    pub number: u64,
    pub switch: u32,
    pub stream: u16,
    /// The stream's epoch: a new one means the switch started again, its state afresh.
    pub epoch: u32,
    pub location: Location,
    pub value: u64,
    pub as_of_ns: u64,
}

/// Where one stream's messages come from, and its writes.
struct Peer {
    addr: SocketAddr,
    epoch: u32,
    applied_ns: u64,
    /// The longest time between two of the stream's messages (see `SILENT_NS`).
    longest_gap_ns: u64,
    threshold: u64,
    engine: WriteEngine,
}

impl Peer {
    fn is_silent(&self, now_ns: u64) -> bool {
        let silence = now_ns.saturating_sub(self.applied_ns);
        silence >= SILENT_NS.max(self.longest_gap_ns.saturating_mul(10))
    }
}

/// What became of a write: seen through, or never to complete (why).
type Outcome = Result<Completed, &'static str>;

/// A write queued into a stream, as its submitter names it: the run of the switch (epoch)
/// it was queued for, and its id there. A switch that starts again numbers its writes
/// from 1 again, so an id alone could name a write of the new run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WriteTicket {
    pub epoch: u32,
    pub id: u64,
}

/// A write of a stream: switch, stream, and its ticket.
type WriteOf = (u32, u16, WriteTicket);

/// A datagram to send: where, its bytes, and how many copies of it.
pub type Outgoing = (SocketAddr, Vec<u8>, usize);

/// Outcomes of writes until their submitters take them: at most [`MAX_OUTCOMES`], the
/// oldest forgotten first, so that outcomes no one takes (a client gone while it waited,
/// a write submitted only to be sent) do not pile up in a collector that runs for months.
#[derive(Default)]
struct Outcomes {
    /// Each write's outcome, and its place in `order`.
    by_write: HashMap<WriteOf, (Outcome, u64)>,
    /// The writes in the order their outcomes came, each with its place; some taken
    /// already, or kept again since (a stream that starts over numbers its writes anew).
    order: VecDeque<(WriteOf, u64)>,
    next_place: u64,
}

/// Outcomes kept at most: far more than can come while a submitter waits between two
/// looks (the API looks every 100 µs).
const MAX_OUTCOMES: usize = 4096;

impl Outcomes {
    fn keep(&mut self, write: WriteOf, outcome: Outcome) {
        if self.order.len() == MAX_OUTCOMES
            && let Some((oldest, place)) = self.order.pop_front()
            && self.by_write.get(&oldest).is_some_and(|&(_, p)| p == place)
        {
            self.by_write.remove(&oldest);
        }
        let place = self.next_place;
        self.next_place += 1;
        self.order.push_back((write, place));
        self.by_write.insert(write, (outcome, place));
    }

    fn take(&mut self, write: WriteOf) -> Option<Outcome> {
        self.by_write.remove(&write).map(|(outcome, _)| outcome)
    }
}

pub struct Collector {
    mirror: Mirror,
    key: Option<Key>,
    peers: HashMap<(u32, u16), Peer>,
    /// Datagrams refused, by reason (the decoder's and the mirror's).
    pub refused: BTreeMap<&'static str, u64>,
    pub datagrams: u64,
    pub reports_sent: u64,
    /// What became of writes (seen through, or never to complete and why), until taken.
    outcomes: Outcomes,
    changes: VecDeque<Applied>,
    next_change: u64,
    scratch: Vec<Message>,
    /// Room for a write's values, lent to the write opened and back when it ends
    /// ([`Collector::with_write_room`]).
    write_room: Vec<u64>,
}

impl Collector {
    /// A collector of the switches `known` (any where `None`), checking every message's
    /// MAC with `key` where one is given.
    pub fn new(known: Option<Vec<u32>>, key: Option<Key>) -> Collector {
        Collector {
            mirror: Mirror::new(known),
            key,
            peers: HashMap::new(),
            refused: BTreeMap::new(),
            datagrams: 0,
            reports_sent: 0,
            outcomes: Outcomes::default(),
            changes: VecDeque::new(),
            next_change: 1,
            scratch: Vec::new(),
            write_room: Vec::new(),
        }
    }

    /// A collector that makes room for a write's values now, its pages supplied by the
    /// kernel (`MAX_WRITE_VALUES`, 8 MiB, resident from then on): lent to each write it
    /// opens ([`Collector::open_write`]: a migration's, filled as the copy is read) and
    /// taken back when the write ends, so that filling it takes no page fault. A
    /// process's first migration of 65,536 connections filled 6.8 MB new, some 2 ms of
    /// the collector's work on a move (docs/BENCHMARKS.md, "A connection table").
    pub fn with_write_room(mut self) -> Collector {
        stateplane_mem::reserve_populated(&mut self.write_room, crate::write::MAX_WRITE_VALUES);
        self
    }

    /// A collector whose copy holds at most `locations` (see [`Mirror::with_max_locations`]).
    pub fn with_max_locations(self, locations: usize) -> Collector {
        Collector {
            mirror: self.mirror.with_max_locations(locations),
            ..self
        }
    }

    pub fn counters(&self) -> MirrorCounters {
        self.mirror.counters
    }

    fn refuse(&mut self, reason: &'static str) {
        *self.refused.entry(reason).or_default() += 1;
    }

    /// Takes a datagram that came from `from` at `now_ns`.
    pub fn on_datagram(&mut self, now_ns: u64, bytes: &[u8], from: SocketAddr) {
        self.datagrams += 1;
        let message = match Message::decode_with(self.key.as_ref(), bytes) {
            Ok(m) => m,
            Err(e) => return self.refuse(e.reason()),
        };
        match message.kind {
            Kind::Updates | Kind::Refresh | Kind::Heartbeat | Kind::Layout => {
                self.apply(now_ns, message, bytes.len(), from)
            }
            Kind::WriteAck => self.on_ack(now_ns, &message, from),
            Kind::Report | Kind::Write | Kind::Nack => self.refuse("unexpected_kind"),
        }
    }

    /// As [`Collector::on_datagram`] for a write's answer only (`true`); any other
    /// datagram is left untaken and uncounted (`false`), for the caller to hold and give
    /// to `on_datagram` after: a move takes its target's answers while it reads the copy,
    /// so that the parts lost go again meanwhile, and must not change the copy it reads.
    /// A datagram whose header names another kind is left undecoded (the updates of every
    /// switch that come during a move, decoded once, when they are given again).
    pub fn on_answer_datagram(&mut self, now_ns: u64, bytes: &[u8], from: SocketAddr) -> bool {
        if Message::kind_named(bytes) != Some(Kind::WriteAck) {
            return false;
        }
        match Message::decode_with(self.key.as_ref(), bytes) {
            Ok(m) if m.kind == Kind::WriteAck => {
                self.datagrams += 1;
                self.on_ack(now_ns, &m, from);
                true
            }
            _ => false,
        }
    }

    /// Applies `m`, which came whole in a datagram of `datagram_len` bytes.
    fn apply(&mut self, now_ns: u64, m: Message, datagram_len: usize, from: SocketAddr) {
        if let Err(why) = self.mirror.apply(&m) {
            return self.refuse(why.reason());
        }
        let key = (m.switch, m.stream);
        let peer = self.peers.entry(key).or_insert_with(|| Peer {
            addr: from,
            epoch: m.epoch,
            applied_ns: now_ns,
            longest_gap_ns: 0,
            threshold: m.t_max,
            engine: new_engine(&m, self.key.clone()),
        });
        if peer.epoch != m.epoch {
            // The switch started again: its writes on the way are gone with its state.
            for id in peer.engine.pending() {
                let ticket = WriteTicket {
                    epoch: peer.epoch,
                    id,
                };
                (self.outcomes).keep(
                    (m.switch, m.stream, ticket),
                    Err("the switch started again"),
                );
            }
            peer.epoch = m.epoch;
            let old = std::mem::replace(&mut peer.engine, new_engine(&m, self.key.clone()));
            // The room lent to a write of the switch's last run comes back.
            let room = old.into_room();
            if room.capacity() > self.write_room.capacity() {
                self.write_room = room;
            }
        }
        peer.addr = from;
        let gap = now_ns.saturating_sub(peer.applied_ns);
        peer.longest_gap_ns = peer.longest_gap_ns.max(gap);
        peer.applied_ns = now_ns;
        peer.threshold = m.t_max;
        // The switch cuts its messages to what its path carries as plain entries; as runs
        // they may take fewer bytes than that, and still say it.
        let plain = HEADER_LEN + m.entries.len() * ENTRY_LEN + MAC_LEN;
        peer.engine.path_carries(datagram_len.max(plain));
        // A layout's entries describe the states; they are no values.
        if m.entries.is_empty() || m.kind == Kind::Layout {
            return;
        }
        for e in &m.entries {
            self.changes.push_back(Applied {
                number: self.next_change,
                switch: m.switch,
                stream: m.stream,
                epoch: m.epoch,
                location: e.location,
                value: e.value,
                as_of_ns: m.sent_ns,
            });
            self.next_change += 1;
        }
        while self.changes.len() > CHANGES_KEPT {
            self.changes.pop_front();
        }
    }

    fn on_ack(&mut self, now_ns: u64, ack: &Message, from: SocketAddr) {
        let Some(peer) = self.peers.get_mut(&(ack.switch, ack.stream)) else {
            return self.refuse("unknown_stream");
        };
        // Only the stream's own address may acknowledge its writes, and only for the run
        // (epoch) they were written into.
        if peer.addr != from {
            return self.refuse("ack_not_from_stream");
        }
        if peer.epoch != ack.epoch {
            return self.refuse("stale_epoch");
        }
        let done = peer.engine.on_ack(now_ns, ack);
        // The room a write that ended filled comes back, for the next write to fill.
        let spent = peer.engine.take_spent();
        if spent.capacity() > self.write_room.capacity() {
            self.write_room = spent;
        }
        if let Some(done) = done {
            let ticket = WriteTicket {
                epoch: ack.epoch,
                id: done.id,
            };
            let key = (ack.switch, ack.stream, ticket);
            let outcome = if done.cancelled {
                Err("cancelled: the switch dropped it, nothing of it committed")
            } else {
                Ok(done)
            };
            self.outcomes.keep(key, outcome);
        }
    }

    /// What to send at `now_ns`: the parts of writes due, and, if `report` is true, a
    /// report to every stream. Appends `(address, datagram, copies to send)` to `out`;
    /// whether parts are due that this poll left to the next (a write engine encodes so
    /// many bytes of parts a poll), which the caller makes once it has sent these.
    pub fn poll(&mut self, now_ns: u64, report: bool, out: &mut Vec<Outgoing>) -> bool {
        let key = self.key.as_ref();
        let mut more = false;
        for (&(switch, stream), peer) in &mut self.peers {
            self.scratch.clear();
            if !peer.is_silent(now_ns) {
                let addr = peer.addr;
                more |= peer.engine.poll_with(now_ns, |datagram, copies| {
                    out.push((addr, datagram.to_vec(), copies));
                });
            }
            if report && let Some(r) = self.mirror.report(switch, stream, now_ns) {
                self.scratch.push(r);
                self.reports_sent += 1;
            }
            if let Some(nack) = self.mirror.nack(switch, stream, now_ns) {
                self.scratch.push(nack);
            }
            for m in self.scratch.drain(..) {
                let mut bytes = Vec::new();
                m.encode_with(key, &mut bytes);
                out.push((peer.addr, bytes, 1));
            }
        }
        more
    }

    /// `count` locations of `state` from `first` in `switch`'s `stream`; `None` for a
    /// stream never heard from.
    pub fn read(
        &self,
        switch: u32,
        stream: u16,
        state: u16,
        first: u32,
        count: u32,
    ) -> Option<Vec<Reading>> {
        self.mirror.read_range(switch, stream, state, first, count)
    }

    /// [`Collector::read`], each reading handed to `each` with its offset from `first`
    /// rather than gathered.
    pub fn visit(
        &self,
        (switch, stream, state): (u32, u16, u16),
        first: u32,
        count: u32,
        each: impl FnMut(usize, Reading),
    ) -> Option<()> {
        (self.mirror).visit_range(switch, stream, state, first, count, each)
    }

    /// The values of the entries of `entry_words` words that `count` locations from
    /// `first` hold, appended to `out`, and how far they are bounded
    /// ([`Mirror::gather_entries`]): what a migration moves.
    pub fn gather_entries(
        &self,
        at: (u32, u16, u16),
        first: u32,
        count: u32,
        entry_words: u32,
        out: &mut Vec<u64>,
    ) -> Option<Gathered> {
        (self.mirror).gather_entries(at, first, count, entry_words, out)
    }

    /// The streams heard from, in order.
    pub fn streams(&self) -> Vec<StreamInfo> {
        (self.mirror.streams().into_iter())
            .filter_map(|(switch, stream)| {
                let peer = self.peers.get(&(switch, stream))?;
                let (epoch, missing) = self.mirror.stream_state(switch, stream)?;
                Some(StreamInfo {
                    switch,
                    stream,
                    epoch,
                    last_seq: self.mirror.last_seq(switch, stream).unwrap_or(0),
                    as_of_ns: self.mirror.as_of(switch, stream).unwrap_or(0),
                    applied_ns: peer.applied_ns,
                    missing,
                    threshold: peer.threshold,
                    locations: self.mirror.held_count(switch, stream),
                    extents: self.extents(switch, stream),
                    layout: self.mirror.layout(switch, stream),
                    writes_in_flight: !peer.engine.is_idle(),
                })
            })
            .collect()
    }

    /// The streams of `switch` heard from, in order.
    pub fn streams_of(&self, switch: u32) -> Vec<u16> {
        (self.mirror.streams().into_iter())
            .filter(|&(s, _)| s == switch)
            .map(|(_, stream)| stream)
            .filter(|stream| self.peers.contains_key(&(switch, *stream)))
            .collect()
    }

    /// The synced states of `switch`'s `stream` as it announced them (`Mirror::layout`).
    pub fn layout(&self, switch: u32, stream: u16) -> Vec<SyncedState> {
        self.mirror.layout(switch, stream)
    }

    /// The locations held of each state of `switch`'s `stream`, by state.
    pub fn extents(&self, switch: u32, stream: u16) -> Vec<(u16, u32)> {
        self.mirror.extents(switch, stream)
    }

    /// Every location held of `switch`'s `stream` (see `Mirror::held`).
    pub fn held(&self, switch: u32, stream: u16) -> Vec<(Location, Reading)> {
        self.mirror.held(switch, stream)
    }

    /// Queues a write of `values` into `switch`'s `stream`; its ticket, or why it cannot
    /// go.
    pub fn write(
        &mut self,
        switch: u32,
        stream: u16,
        values: impl Into<WriteValues>,
    ) -> Result<WriteTicket, String> {
        let peer = Self::peer_to_write(&mut self.peers, switch, stream)?;
        let id = peer.engine.submit(values)?;
        Ok(WriteTicket {
            epoch: peer.epoch,
            id,
        })
    }

    /// Queues an open write into `switch`'s `stream` of values set at `first` on, in
    /// `columns`, whose values come with [`Collector::extend_write`] and go as they come,
    /// committed once [`Collector::close_write`] closes it (`WriteEngine::open`).
    pub fn open_write(
        &mut self,
        switch: u32,
        stream: u16,
        first: Location,
        columns: usize,
        capacity: usize,
    ) -> Result<WriteTicket, String> {
        let peer = Self::peer_to_write(&mut self.peers, switch, stream)?;
        let id = (peer.engine).open_in(first, columns, capacity, &mut self.write_room);
        Ok(WriteTicket {
            epoch: peer.epoch,
            id,
        })
    }

    /// Adds `values` to an open write (`WriteEngine::extend`).
    pub fn extend_write(
        &mut self,
        switch: u32,
        stream: u16,
        write: WriteTicket,
        values: &[u64],
    ) -> Result<(), String> {
        Self::engine_of(&mut self.peers, switch, stream, write)?.extend(write.id, values)
    }

    /// Appends to an open write the values [`Collector::gather_entries`] reads from the
    /// copy, read straight into the write (what a migration moves is megabytes); what it
    /// read, or `None` as `gather_entries` answers it.
    pub fn gather_into_write(
        &mut self,
        at: (u32, u16, u16),
        (first, count, entry_words): (u32, u32, u32),
        (switch, stream, write): (u32, u16, WriteTicket),
    ) -> Result<Option<Gathered>, String> {
        let mirror = &self.mirror;
        let engine = Self::engine_of(&mut self.peers, switch, stream, write)?;
        engine.extend_with(write.id, |values| {
            mirror.gather_entries(at, first, count, entry_words, values)
        })
    }

    /// Closes an open write (`WriteEngine::close`).
    pub fn close_write(
        &mut self,
        switch: u32,
        stream: u16,
        write: WriteTicket,
    ) -> Result<(), String> {
        Self::engine_of(&mut self.peers, switch, stream, write)?.close(write.id)
    }

    /// The engine that took `write` into `switch`'s `stream`, if the stream's run did.
    fn engine_of(
        peers: &mut HashMap<(u32, u16), Peer>,
        switch: u32,
        stream: u16,
        write: WriteTicket,
    ) -> Result<&mut WriteEngine, String> {
        match peers.get_mut(&(switch, stream)) {
            Some(peer) if peer.epoch == write.epoch => Ok(&mut peer.engine),
            _ => Err(format!(
                "switch {switch} stream {stream} started again since write {} was queued",
                write.id
            )),
        }
    }

    fn peer_to_write(
        peers: &mut HashMap<(u32, u16), Peer>,
        switch: u32,
        stream: u16,
    ) -> Result<&mut Peer, String> {
        (peers.get_mut(&(switch, stream))).ok_or_else(|| {
            format!(
                "switch {switch} stream {stream} has sent nothing yet, so there is nowhere to write"
            )
        })
    }

    /// The values one write into `switch`'s `stream` may hold, as its path allows
    /// (`WriteEngine::max_values`); the least, `MAX_VALUES`, for a stream not heard from.
    pub fn max_write_values(&self, switch: u32, stream: u16) -> usize {
        (self.peers.get(&(switch, stream)))
            .map_or(crate::write::MAX_VALUES, |p| p.engine.max_values())
    }

    /// Cancels a write of `switch`'s `stream` (see `WriteEngine::cancel`); its fate comes
    /// with the switch's answer (`take_write`). One queued for a run of the switch that
    /// has ended is not on its way (its outcome says so).
    pub fn cancel(&mut self, switch: u32, stream: u16, write: WriteTicket) -> Cancel {
        match self.peers.get_mut(&(switch, stream)) {
            Some(peer) if peer.epoch == write.epoch => peer.engine.cancel(write.id),
            _ => Cancel::Unknown,
        }
    }

    /// What became of a write of `switch`'s `stream`: done, given up (why), or still on
    /// its way (`None`). Taken once.
    /// Outcomes of writes kept so far (each write's once it settles, taken or not): a
    /// waiter that saw this many has nothing new to look for until it grows.
    pub fn outcomes_kept(&self) -> u64 {
        self.outcomes.next_place
    }

    pub fn take_write(
        &mut self,
        switch: u32,
        stream: u16,
        write: WriteTicket,
    ) -> Option<Result<Completed, &'static str>> {
        self.outcomes.take((switch, stream, write))
    }

    /// The changes applied after number `after` (at most `limit`), and how many a
    /// subscriber that far behind has missed (the oldest are not kept).
    pub fn changes_after(&self, after: u64, limit: usize) -> (Vec<Applied>, u64) {
        let oldest = self.changes.front().map_or(self.next_change, |c| c.number);
        let missed = oldest.saturating_sub(after + 1);
        let start = (after + 1).saturating_sub(oldest) as usize;
        let taken = self
            .changes
            .iter()
            .skip(start)
            .take(limit)
            .copied()
            .collect();
        (taken, missed)
    }

    /// The number the next change applied will have.
    pub fn next_change(&self) -> u64 {
        self.next_change
    }
}

/// The write engine of the stream `m` came on. Its writes are numbered from a random id
/// (below 2^62, so that no id wraps), so that a switch that outlived this collector's
/// predecessor takes them as a new numbering, never as writes it committed already. Its
/// messages carry MACs made with `key`, the collector's.
fn new_engine(m: &Message, key: Option<Key>) -> WriteEngine {
    use std::hash::{BuildHasher, Hasher};
    let mut random = std::collections::hash_map::RandomState::new().build_hasher();
    random.write_u32(m.epoch);
    let first_id = random.finish() >> 2;
    WriteEngine::new(m.switch, m.epoch, m.stream, FIRST_RTO_NS)
        .numbered_from(first_id)
        .with_key(key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sender::{Sender, SenderConfig, Threshold};
    use crate::write::tests::answer_of;
    use crate::write::{Mode, WriteStage, WriteTarget, Written};

    /// Outcomes no one takes are forgotten, the oldest first, once [`MAX_OUTCOMES`] came
    /// after them; one kept again under the same write is not forgotten with its older
    /// namesake's place.
    #[test]
    fn outcomes_not_taken_are_bounded_and_the_latest_kept() {
        let mut o = Outcomes::default();
        let t = |id| WriteTicket { epoch: 7, id };
        o.keep((1, 0, t(1)), Err("the switch started again"));
        o.keep((1, 0, t(1)), Err("cancelled"));
        for id in 2..=MAX_OUTCOMES as u64 {
            o.keep((1, 0, t(id)), Err("x"));
        }
        // The first place went; write 1's outcome, kept in the second, stays.
        assert_eq!(
            (o.by_write.len(), o.order.len()),
            (MAX_OUTCOMES, MAX_OUTCOMES)
        );
        assert_eq!(
            o.take((1, 0, t(1))),
            Some(Err("cancelled")),
            "its newer place stays"
        );
        for id in 0..10 * MAX_OUTCOMES as u64 {
            o.keep((2, 0, t(id)), Err("y"));
        }
        assert_eq!(
            (o.by_write.len(), o.order.len()),
            (MAX_OUTCOMES, MAX_OUTCOMES)
        );
        assert_eq!(o.take((1, 0, t(5))), None, "forgotten");
        let last = 10 * MAX_OUTCOMES as u64 - 1;
        assert_eq!(o.take((2, 0, t(last))), Some(Err("y")));
        assert_eq!(o.take((2, 0, t(last))), None, "taken once");
    }

    const SWITCH: &str = "127.0.0.1:4000";

    fn sender(epoch: u32) -> Sender {
        Sender::new(SenderConfig {
            switch: 1,
            epoch,
            stream: 0,
            slots: 64,
            threshold: Threshold::Fixed(0),
            max_age_ns: 1_000_000,
            heartbeat_ns: 1_000_000,
            batch_ns: 0,
            refresh_ns: 0,
            states: vec![SyncedState::register(0, 8)],
        })
    }

    /// `c` once switch 1's stream 0 (run 7) has announced itself; the switch's sender.
    fn heard_from(mut c: Collector) -> (Collector, Sender) {
        let mut s = sender(7);
        let mut out = Vec::new();
        s.poll(0, |_| 0, &mut out);
        send(&mut c, 0, &mut out, SWITCH);
        (c, s)
    }

    struct State(Vec<u64>);

    impl WriteTarget for State {
        fn read(&self, l: Location) -> u64 {
            self.0[l.index as usize]
        }
        fn write(&mut self, l: Location, v: u64) {
            self.0[l.index as usize] = v;
        }
    }

    fn send(c: &mut Collector, now: u64, messages: &mut Vec<Message>, from: &str) {
        for m in messages.drain(..) {
            let mut bytes = Vec::new();
            m.encode(&mut bytes);
            c.on_datagram(now, &bytes, from.parse().unwrap());
        }
    }

    #[test]
    fn updates_are_read_with_their_bound_and_followed_by_subscribers() {
        let mut c = Collector::new(None, None);
        let mut s = sender(7);
        let mut out = Vec::new();
        s.change(0, Location { state: 0, index: 3 }, 0, 5);
        s.poll(10, |_| 0, &mut out);
        send(&mut c, 20, &mut out, SWITCH);
        let r = c.read(1, 0, 0, 2, 2).unwrap();
        assert_eq!((r[0].value, r[1].value, r[1].bound), (0, 5, Some(0)));
        assert_eq!(c.read(2, 0, 0, 0, 1), None, "a switch never heard from");
        let info = &c.streams()[0];
        // The stream's first message announced its layout; its second carried the update.
        assert_eq!((info.epoch, info.last_seq, info.applied_ns), (7, 2, 20));
        assert_eq!(info.layout, [SyncedState::register(0, 8)]);
        assert_eq!(info.locations, 1, "the layout's entries are no values");
        let (changes, missed) = c.changes_after(0, 10);
        assert_eq!((changes.len(), missed), (1, 0));
        assert_eq!((changes[0].number, changes[0].value), (1, 5));
        assert_eq!(c.changes_after(1, 10).0, []);
        // Reports go to where the stream's messages came from, and nowhere else.
        let mut sent = Vec::new();
        c.poll(30, true, &mut sent);
        assert_eq!(sent.len(), 1);
        assert_eq!(sent[0].0, SWITCH.parse().unwrap());
    }

    #[test]
    fn a_write_goes_to_the_stream_and_completes_on_its_acknowledgement() {
        let (mut c, _) = heard_from(Collector::new(None, None));
        let values: Vec<Written> = (0..8)
            .map(|index| Written {
                location: Location { state: 0, index },
                value: 100 + u64::from(index),
                mode: Mode::Set,
            })
            .collect();
        let id = c.write(1, 0, values).unwrap();
        assert!(
            c.write(1, 1, Vec::new()).is_err(),
            "a stream never heard from"
        );
        let mut sent = Vec::new();
        c.poll(1_000, false, &mut sent);
        assert_eq!(sent.len(), 1, "one part");
        let mut stage = WriteStage::default();
        let mut state = State(vec![0; 8]);
        let part = Message::decode(&sent[0].1).unwrap();
        stage.on_part(&part, &mut state).unwrap();
        assert!(stage.commit(&mut state).is_some());
        assert_eq!(state.0[7], 107);
        let ack = answer_of(&mut stage);
        let mut acks = vec![ack];
        // From another address, an acknowledgement is refused and completes nothing.
        send(&mut c, 2_000, &mut acks.clone(), "127.0.0.1:4001");
        assert_eq!(c.refused.get("ack_not_from_stream"), Some(&1));
        assert_eq!(c.take_write(1, 0, id), None);
        // From the stream's address but of another run of the switch: refused too.
        let mut other_run = vec![Message {
            epoch: 6,
            ..acks[0].clone()
        }];
        send(&mut c, 2_000, &mut other_run, SWITCH);
        assert_eq!(c.refused.get("stale_epoch"), Some(&1));
        assert_eq!(c.take_write(1, 0, id), None);
        send(&mut c, 2_000, &mut acks, SWITCH);
        let done = c.take_write(1, 0, id).unwrap().unwrap();
        assert_eq!((done.parts, done.latency_ns), (1, 1_000));
        assert_eq!(c.take_write(1, 0, id), None, "taken once");
    }

    /// A write's answer is taken alone: an update, or a datagram that does not decode, is
    /// left as it was (nothing applied, refused or counted), for `on_datagram` later.
    #[test]
    fn an_answer_is_taken_alone_and_the_rest_left_for_later() {
        let (mut c, mut s) = heard_from(Collector::new(None, None));
        let mut out = Vec::new();
        let at = Location { state: 0, index: 3 };
        let id = c.write(
            1,
            0,
            vec![Written {
                location: at,
                value: 4,
                mode: Mode::Set,
            }],
        );
        let mut sent = Vec::new();
        c.poll(1_000, false, &mut sent);
        let mut stage = WriteStage::default();
        let mut state = State(vec![0; 8]);
        stage
            .on_part(Message::decode(&sent[0].1).unwrap(), &mut state)
            .unwrap();
        assert!(stage.commit(&mut state).is_some());
        s.change(0, at, 0, 5);
        s.poll(10, |_| 0, &mut out);
        let encoded = |m: &Message| {
            let mut bytes = Vec::new();
            m.encode(&mut bytes);
            bytes
        };
        let (update, answer) = (encoded(&out[0]), encoded(&answer_of(&mut stage)));
        let from = SWITCH.parse().unwrap();
        let datagrams = c.datagrams;
        // Another kind, a header cut short, nothing, an answer cut short.
        for other in [&update[..], &update[..5], &[], &answer[..answer.len() - 1]] {
            assert!(!c.on_answer_datagram(2_000, other, from));
        }
        assert_eq!(c.datagrams, datagrams, "nothing counted");
        assert!(c.refused.is_empty(), "nor refused");
        assert_eq!(c.read(1, 0, 0, 3, 1).unwrap()[0].value, 0, "nor applied");
        assert!(c.on_answer_datagram(2_000, &answer, from));
        assert!(c.take_write(1, 0, id.unwrap()).unwrap().is_ok());
        c.on_datagram(2_000, &update, from);
        assert_eq!(
            c.read(1, 0, 0, 3, 1).unwrap()[0].value,
            5,
            "applied when given"
        );
    }

    /// A collector with write room lends it to the write it opens and takes it back when
    /// the write has committed, or when the switch started again meanwhile, for the next;
    /// the room's pages are there from the start.
    #[test]
    fn a_collectors_write_room_goes_to_each_open_write_and_comes_back() {
        let (mut c, _) = heard_from(Collector::new(None, None).with_write_room());
        let room = (c.write_room.as_ptr(), c.write_room.capacity());
        assert!(room.1 >= crate::write::MAX_WRITE_VALUES);
        let (mut stage, mut state) = (WriteStage::default(), State(vec![0; 8]));
        for round in 0..2u64 {
            let first = Location { state: 0, index: 0 };
            let ticket = c.open_write(1, 0, first, 1, 8).unwrap();
            assert_eq!(c.write_room.capacity(), 0, "lent");
            c.extend_write(1, 0, ticket, &[round + 1; 8]).unwrap();
            c.close_write(1, 0, ticket).unwrap();
            let mut sent = Vec::new();
            c.poll(1_000, false, &mut sent);
            for (_, datagram, _) in &sent {
                let part = Message::decode(datagram).unwrap();
                stage.on_part(&part, &mut state).unwrap();
            }
            assert!(stage.commit(&mut state).is_some());
            assert_eq!(state.0, [round + 1; 8]);
            send(&mut c, 2_000, &mut vec![answer_of(&mut stage)], SWITCH);
            assert!(c.take_write(1, 0, ticket).unwrap().is_ok());
            let back = (c.write_room.as_ptr(), c.write_room.capacity());
            assert_eq!(back, room, "back after write {round}");
        }
        // A write the switch's restart leaves unanswered gives its room back too.
        let first = Location { state: 0, index: 0 };
        let ticket = c.open_write(1, 0, first, 1, 8).unwrap();
        c.extend_write(1, 0, ticket, &[9; 8]).unwrap();
        assert_eq!(c.write_room.capacity(), 0, "lent");
        let mut restarted = Vec::new();
        sender(8).poll(3_000, |_| 0, &mut restarted);
        send(&mut c, 3_000, &mut restarted, SWITCH);
        assert!(c.take_write(1, 0, ticket).unwrap().is_err());
        let back = (c.write_room.as_ptr(), c.write_room.capacity());
        assert_eq!(back, room, "back from the write the restart ended");
    }

    /// A collector with a key signs its writes' parts with it, each transmission anew, and
    /// its abandons: a switch with the key takes them, one without refuses them.
    #[test]
    fn a_keyed_collector_signs_its_writes() {
        let key = Key::new([9; 32]);
        let mut c = Collector::new(None, Some(key.clone()));
        let mut s = sender(7);
        let mut out = Vec::new();
        s.poll(0, |_| 0, &mut out);
        for m in out.drain(..) {
            let mut bytes = Vec::new();
            m.encode_with(Some(&key), &mut bytes);
            c.on_datagram(0, &bytes, SWITCH.parse().unwrap());
        }
        let write = |value| -> Vec<Written> {
            vec![Written {
                location: Location { state: 0, index: 1 },
                value,
                mode: Mode::Set,
            }]
        };
        let id = c.write(1, 0, write(5)).unwrap();
        let mut sent = Vec::new();
        c.poll(1_000, false, &mut sent);
        // Sent again on its timeout: signed over its new sending time.
        c.poll(1_000 + FIRST_RTO_NS, false, &mut sent);
        assert_eq!(sent.len(), 2);
        for (_, datagram, _) in &sent {
            let part = Message::decode_with(Some(&key), datagram).unwrap();
            assert_eq!((part.kind, part.entries[0].value), (Kind::Write, 5));
            assert!(Message::decode_with(None, datagram).is_err());
        }
        let first = Message::decode_with(Some(&key), &sent[0].1).unwrap();
        let again = Message::decode_with(Some(&key), &sent[1].1).unwrap();
        assert!(again.sent_ns > first.sent_ns);
        sent.clear();
        c.cancel(1, 0, id);
        c.poll(2_000 + FIRST_RTO_NS, false, &mut sent);
        assert_eq!(sent.len(), 1);
        let abandon = Message::decode_with(Some(&key), &sent[0].1).unwrap();
        assert_eq!((abandon.kind, abandon.t_max), (Kind::Write, 0));
        assert!(abandon.entries.is_empty());
    }

    /// What a new switch answers `part` with, as its sync stage does: the part taken, the
    /// write committed, the acknowledgement saying so.
    fn answered(part: &Message) -> Message {
        let (mut stage, mut state) = (WriteStage::default(), State(vec![0; 8]));
        stage.on_part(part, &mut state).unwrap();
        stage.commit(&mut state).unwrap();
        answer_of(&mut stage)
    }

    #[test]
    fn a_restarted_switch_abandons_the_writes_on_their_way() {
        let mut c = Collector::new(None, None);
        let mut out = Vec::new();
        sender(7).poll(0, |_| 0, &mut out);
        send(&mut c, 0, &mut out, SWITCH);
        let old = c.write(1, 0, Vec::new()).unwrap();
        sender(8).poll(0, |_| 0, &mut out);
        send(&mut c, 0, &mut out, SWITCH);
        assert_eq!(c.streams()[0].epoch, 8);
        // The new run's writes are numbered afresh (from a random id, as each engine's
        // are): its first write, seen through before anyone asks after the old one, is not
        // the old one's outcome.
        let new = c.write(1, 0, Vec::new()).unwrap();
        assert_ne!(old, new);
        let mut sent = Vec::new();
        c.poll(1_000, false, &mut sent);
        let part = Message::decode(&sent[0].1).unwrap();
        let mut acks = vec![answered(&part)];
        send(&mut c, 2_000, &mut acks, SWITCH);
        assert_eq!(
            c.take_write(1, 0, old),
            Some(Err("the switch started again"))
        );
        assert!(matches!(c.take_write(1, 0, new), Some(Ok(_))));
        assert_eq!(c.cancel(1, 0, old), Cancel::Unknown, "its run is over");
    }

    #[test]
    fn a_subscriber_far_behind_is_told_what_it_missed() {
        let mut c = Collector::new(None, None);
        let mut s = sender(7);
        let mut out = Vec::new();
        for i in 0..(CHANGES_KEPT as u64 + 10) {
            s.change(i, Location { state: 0, index: 1 }, i, i + 1);
            s.poll(i, |_| 0, &mut out);
            send(&mut c, i, &mut out, SWITCH);
        }
        let (changes, missed) = c.changes_after(0, 3);
        assert_eq!(missed, 10);
        assert_eq!(changes[0].number, 11);
    }

    /// A refresh of 2,000 locations in order goes as a short run, yet says the switch's
    /// path carries 2,000 entries of 24 bytes: writes to the stream go in parts as large.
    #[test]
    fn a_message_as_runs_says_the_path_carries_its_entries_as_plain_ones() {
        let mut c = Collector::new(None, None);
        let refresh = Message {
            kind: Kind::Refresh,
            switch: 1,
            epoch: 7,
            stream: 0,
            seq: 1,
            sent_ns: 0,
            t_max: 0,
            more: false,
            entries: (0..2_000)
                .map(|index| crate::Update {
                    location: Location { state: 0, index },
                    value: 1,
                    threshold: 0,
                })
                .collect(),
        };
        let mut bytes = Vec::new();
        refresh.encode(&mut bytes);
        assert!(bytes.len() < 2_200, "{} bytes: as a run", bytes.len());
        c.on_datagram(0, &bytes, SWITCH.parse().unwrap());
        // Every other location, 8-byte values: 24 bytes each as entries or runs of one.
        let values: Vec<Written> = (0..2_000)
            .map(|i| Written {
                location: Location {
                    state: 0,
                    index: 2 * i,
                },
                value: u64::MAX - u64::from(i),
                mode: Mode::Set,
            })
            .collect();
        c.write(1, 0, values).unwrap();
        let mut sent = Vec::new();
        c.poll(10, false, &mut sent);
        let parts: Vec<usize> = (sent.iter())
            .map(|(_, b, _)| Message::decode(b).unwrap())
            .filter(|m| m.kind == Kind::Write)
            .map(|m| m.entries.len())
            .collect();
        assert_eq!(parts, [2_000]);
    }

    /// A write to a stream that has gone silent sends nothing until the stream speaks
    /// again; then its parts go, and it completes.
    #[test]
    fn writes_wait_while_their_stream_is_silent() {
        let mut c = Collector::new(None, None);
        let mut s = sender(7);
        let mut out = Vec::new();
        s.poll(0, |_| 0, &mut out);
        send(&mut c, 0, &mut out, SWITCH);
        let one = vec![Written {
            location: Location { state: 0, index: 1 },
            value: 9,
            mode: Mode::Set,
        }];
        let first = c.write(1, 0, one).unwrap();
        let parts = |c: &mut Collector, now| {
            let mut sent = Vec::new();
            c.poll(now, false, &mut sent);
            sent.len()
        };
        assert_eq!(parts(&mut c, 10), 1, "heard from just now");
        assert_eq!(parts(&mut c, SILENT_NS), 0, "silent for a second: gone");
        assert_eq!(parts(&mut c, 10 * SILENT_NS), 0);
        // The switch speaks again (a heartbeat): the part goes again at once.
        s.poll(10 * SILENT_NS, |_| 0, &mut out);
        assert!(!out.is_empty());
        send(&mut c, 10 * SILENT_NS, &mut out, SWITCH);
        let mut sent = Vec::new();
        c.poll(10 * SILENT_NS + 1, false, &mut sent);
        let (_, bytes, _) = &sent[0];
        let part = Message::decode(bytes).unwrap();
        let ack = answered(&part);
        let mut ack_bytes = Vec::new();
        ack.encode(&mut ack_bytes);
        c.on_datagram(10 * SILENT_NS + 2, &ack_bytes, SWITCH.parse().unwrap());
        assert!(matches!(c.take_write(1, 0, first), Some(Ok(_))));
        // That stream has been quiet for 10 s once: 50 s of quiet is not yet gone.
        c.write(1, 0, vec![]).unwrap();
        assert_eq!(
            parts(&mut c, 60 * SILENT_NS),
            1,
            "within ten times its longest gap"
        );
        assert_eq!(parts(&mut c, 110 * SILENT_NS), 0, "past it");
    }
}
