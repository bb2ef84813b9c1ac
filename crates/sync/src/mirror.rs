//! The collector's copy of the switches' synced state, with the bound that holds for each
//! location: what it claims is of the data plane as of the sending of the stream's last
//! message applied (`Reading::as_of_ns`).
//!
//! A value arrived in message `j` of its stream is within `divergence_bound(T)` of the data
//! plane's as of message `k`, the last applied, where `T` is the largest `t_max` of
//! messages `j..=k` (each covers the thresholds in force since the one before it). After a
//! lost message (a gap in the sequence), every location whose value is older than the gap
//! may have missed an update: it is unbounded until it arrives again (an update or the
//! refresh). Messages older than the last applied change nothing (duplicates, late ones),
//! unless lost and still asked for (below).
//!
//! The messages a worker sends at one instant (a batch: all but the last carry
//! `FLAG_MORE`) are applied together when the last arrives, so that the copy is always the
//! data plane's as of one instant; a batch cut short by a loss is applied up to the loss
//! when the next message shows it.
//!
//! Beyond that, a lost message is asked for again (`Mirror::nack`, kind 8; the switch
//! keeps its last messages) while it is among the last [`MAX_REPAIRABLE`] missing, at most
//! [`MAX_NACKS`] times. A message that comes back is applied where it is the newest word
//! of a location, and its `t_max` joins the thresholds of the messages after it: as if it
//! had come in order, so that once every lost message after a location's value is back,
//! the value is bounded again, without waiting for the refresh to carry it.

use crate::sender::SyncedState;
use crate::wire::{Kind, Message};
use crate::{Location, Update, divergence_bound};
use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};

/// The largest thresholds since each message, kept short: entries beyond this are merged
/// (over-approximating, so that a bound stays sound).
const MAX_THRESHOLDS: usize = 1024;

/// Epochs a stream remembers having left (older ones are forgotten).
const RETIRED_EPOCHS: usize = 64;

/// Lost messages a stream asks for again at most (older ones are given up: their
/// locations wait for the refresh, as without repair).
pub const MAX_REPAIRABLE: usize = 1024;

/// How many times a lost message is asked for before it is given up.
pub const MAX_NACKS: u8 = 8;

/// How long a stream waits for an answer before asking again.
pub const NACK_RETRY_NS: u64 = 5_000_000;

/// One stream's (a worker's) view.
#[derive(Clone, Debug)]
struct StreamView {
    epoch: u32,
    /// The epochs the stream has left, latest last: their late messages are refused.
    retired: Vec<u32>,
    next_seq: u64,
    /// The last message applied: what the copy is as of.
    applied_seq: u64,
    /// Messages of a batch whose last has not arrived.
    staged: Vec<Message>,
    /// The first message after the latest gap: values older than it are unbounded. It
    /// is the later of `given_up_seq` and one past the latest of `repairable`.
    gap_seq: u64,
    /// Lost messages still asked for, with the times they were asked for so far.
    repairable: std::collections::BTreeMap<u64, u8>,
    /// One past the latest lost message given up (or too many to ask for).
    given_up_seq: u64,
    /// Lost messages that came again while the copy is as of a message before them (the
    /// later ones wait in a batch): each is taken once the copy is as of it or later, so
    /// that the copy never holds a value newer than its instant.
    repairs_waiting: std::collections::BTreeMap<u64, Message>,
    /// When the last request for lost messages went (the collector's clock).
    last_nack_ns: Option<u64>,
    /// Messages found missing so far.
    missing: u64,
    last_sent_ns: u64,
    /// `(seq, t_max)` with `seq` rising and `t_max` falling: the largest `t_max` of the
    /// messages from `s` on is that of the first entry at or after `s`.
    thresholds: VecDeque<(u64, u64)>,
    values: Values,
    /// The synced states as the stream last announced them (`Kind::Layout`), by id.
    layout: Vec<SyncedState>,
}

/// Indexes below this are held in a vector per state (a read of 65,536 locations is then
/// 65,536 array reads); those above in a map, so that a message naming a far index cannot
/// make the collector allocate for all below it (at most 8 Mi cells of 16 bytes, 128 MiB, a
/// state; a synced table of 262,144 flows, 524,288 slots of 11 words, is 5.8 Mi).
const DENSE_INDEXES: u32 = 1 << 23;

/// The locations a stream's messages have carried, by state.
#[derive(Clone, Debug, Default)]
struct Values {
    states: HashMap<u16, Cells, foldhash::fast::RandomState>,
    count: usize,
    /// Cells made, dense and sparse (a dense cell made for a far index counts, carried
    /// or not).
    cells: usize,
}

#[derive(Clone, Debug, Default)]
struct Cells {
    /// `seq` 0: never carried (every message has a `seq` of 1 or more).
    dense: Vec<Held>,
    sparse: HashMap<u32, Held, foldhash::fast::RandomState>,
}

const NEVER: Held = Held { value: 0, place: 0 };

impl Cells {
    /// One past the largest index carried (a dense cell past every carried one is never
    /// made).
    fn extent(&self) -> u32 {
        let sparse = self.sparse.keys().max().map_or(0, |&i| i.saturating_add(1));
        sparse.max(self.dense.len() as u32)
    }

    /// As [`Values::hold`] for entries of this state; the locations new to it.
    fn hold(&mut self, entries: &[Update], seq: u64, bounded_from: u64) -> usize {
        let dense_end = (entries.iter())
            .map(|e| e.location.index)
            .filter(|&i| i < DENSE_INDEXES)
            .max();
        if let Some(last) = dense_end
            && last as usize >= self.dense.len()
        {
            self.dense.resize(last as usize + 1, NEVER);
        }
        let mut new = 0;
        for e in entries {
            let held = Held::new(e.value, seq, bounded_from);
            let index = e.location.index;
            if index < DENSE_INDEXES {
                let cell = &mut self.dense[index as usize];
                if cell.seq() <= seq {
                    new += usize::from(cell.seq() == 0);
                    *cell = held;
                }
                continue;
            }
            match self.sparse.entry(index) {
                Entry::Occupied(mut o) => {
                    if o.get().seq() <= seq {
                        o.insert(held);
                    }
                }
                Entry::Vacant(v) => {
                    v.insert(held);
                    new += 1;
                }
            }
        }
        new
    }

    fn get(&self, index: u32) -> Option<&Held> {
        if index < DENSE_INDEXES {
            self.dense.get(index as usize).filter(|h| h.seq() > 0)
        } else {
            self.sparse.get(&index)
        }
    }
}

/// A message's entries in runs of one state each, in order (a message's are mostly one
/// state's, so a state's cells are looked up once a run).
fn runs_of_states(entries: &[Update]) -> impl Iterator<Item = (u16, &[Update])> {
    let mut rest = entries;
    std::iter::from_fn(move || {
        let state = rest.first()?.location.state;
        let n = (rest.iter())
            .take_while(|e| e.location.state == state)
            .count();
        let (these, after) = rest.split_at(n);
        rest = after;
        Some((state, these))
    })
}

impl Values {
    fn get(&self, at: Location) -> Option<&Held> {
        self.states.get(&at.state)?.get(at.index)
    }

    /// Holds each entry's value, from message `seq` bounded from `bounded_from`, where no
    /// later message carried its location (one held from message `seq` itself is an
    /// earlier entry of it, which a later one follows). A state's cells are looked up
    /// once for the entries of it in a row (a message's are mostly one state's).
    fn hold(&mut self, entries: &[Update], seq: u64, bounded_from: u64) {
        for (state, these) in runs_of_states(entries) {
            let cells = self.states.entry(state).or_default();
            let before = cells.dense.len() + cells.sparse.len();
            self.count += cells.hold(these, seq, bounded_from);
            self.cells += cells.dense.len() + cells.sparse.len() - before;
        }
    }

    /// The cells holding `entries` would make, at most.
    fn growth(&self, entries: &[Update]) -> usize {
        let mut growth = 0;
        for (state, these) in runs_of_states(entries) {
            let cells = self.states.get(&state);
            let dense_end = (these.iter())
                .map(|e| e.location.index)
                .filter(|&i| i < DENSE_INDEXES)
                .max();
            if let Some(last) = dense_end {
                growth += (last as usize + 1).saturating_sub(cells.map_or(0, |c| c.dense.len()));
            }
            growth += (these.iter())
                .map(|e| e.location.index)
                .filter(|&i| i >= DENSE_INDEXES && cells.is_none_or(|c| !c.sparse.contains_key(&i)))
                .count();
        }
        growth
    }

    /// Every location held, in order.
    fn locations(&self) -> Vec<Location> {
        let mut all: Vec<Location> = Vec::with_capacity(self.count);
        for (&state, cells) in &self.states {
            let dense = (cells.dense.iter().enumerate())
                .filter(|(_, h)| h.seq() > 0)
                .map(|(i, _)| i as u32);
            let indexes = dense.chain(cells.sparse.keys().copied());
            all.extend(indexes.map(|index| Location { state, index }));
        }
        all.sort_unstable();
        all
    }
}

/// A location's value, the message it came in, and the first message whose threshold
/// bounds it: that one for an update (its value may be older than the message), the first
/// of the next batch for a refresh (its value is the data plane's as the batch is sent,
/// and every message of a batch carries the `t_max` of the period before it).
///
/// In 16 bytes, since a table's copy holds millions and a migration reads them all: the
/// message in the low [`SEQ_BITS`] bits of `place`, and how many messages after it the
/// bound starts from in the bits above. Each is cut to its width in the direction that
/// keeps a bound sound: a message past 2^48 - 1 (no stream sends as many) is held as that
/// one, which a gap after it makes unbounded rather than bounded too long; a bound that
/// starts more messages later than the bits hold starts as far as they reach, earlier,
/// where the largest threshold since is larger, never smaller.
#[derive(Clone, Copy, Debug)]
struct Held {
    value: u64,
    place: u64,
}

/// The bits of [`Held::place`] that hold the message.
const SEQ_BITS: u32 = 48;
const SEQ_MASK: u64 = (1 << SEQ_BITS) - 1;

impl Held {
    /// `value` from message `seq`, bounded from message `bounded_from` (never before `seq`)
    /// on.
    fn new(value: u64, seq: u64, bounded_from: u64) -> Held {
        debug_assert!(
            bounded_from >= seq,
            "a value is bounded from its message on"
        );
        let seq = seq.min(SEQ_MASK);
        let later = bounded_from.saturating_sub(seq).min(u64::MAX >> SEQ_BITS);
        Held {
            value,
            place: later << SEQ_BITS | seq,
        }
    }

    /// The message it came in (0: never carried).
    fn seq(&self) -> u64 {
        self.place & SEQ_MASK
    }

    /// The first message whose threshold bounds it.
    fn bounded_from(&self) -> u64 {
        self.seq() + (self.place >> SEQ_BITS)
    }
}

impl StreamView {
    fn new(epoch: u32) -> StreamView {
        StreamView {
            epoch,
            retired: Vec::new(),
            next_seq: 1,
            applied_seq: 0,
            staged: Vec::new(),
            gap_seq: 0,
            repairable: std::collections::BTreeMap::new(),
            given_up_seq: 0,
            repairs_waiting: std::collections::BTreeMap::new(),
            last_nack_ns: None,
            missing: 0,
            last_sent_ns: 0,
            thresholds: VecDeque::new(),
            values: Values::default(),
            layout: Vec::new(),
        }
    }

    /// Takes `m`'s values and threshold, `m` being of the batch that ends with message
    /// `batch_end`: the copy is now as of `m`.
    fn take(&mut self, m: &Message, batch_end: u64) {
        self.push_threshold(m.seq, m.t_max);
        let bounded_from = match m.kind {
            Kind::Refresh => batch_end + 1,
            _ => m.seq,
        };
        self.hold(m, bounded_from);
        self.applied_seq = m.seq;
        self.last_sent_ns = m.sent_ns;
    }

    /// Applies the staged messages of a batch that ends with message `batch_end` (or, cut
    /// short by a loss, will not end: its values are then older than the gap, unbounded).
    fn take_staged(&mut self, batch_end: u64) {
        for m in std::mem::take(&mut self.staged) {
            self.take(&m, batch_end);
        }
    }

    /// Takes message `m`, lost and asked for again: its values where no later message
    /// carried the location, its threshold among the later ones'; and the gap it left
    /// closes.
    fn repair(&mut self, m: &Message) {
        self.repairable.remove(&m.seq);
        self.raise_thresholds_to(m.seq, m.t_max);
        // A refresh's value is the data plane's as its batch went, no earlier than the
        // message: bounded from the message on (a larger bound than from its batch's end,
        // never a smaller one).
        self.hold(m, m.seq);
        self.set_gap_seq();
    }

    /// Takes the lost messages that came again and that the copy has now passed.
    fn take_repairs_due(&mut self) {
        while let Some(entry) = self.repairs_waiting.first_entry() {
            if *entry.key() > self.applied_seq {
                return;
            }
            let m = entry.remove();
            self.repair(&m);
        }
    }

    /// Holds `m`'s values (or layout), bounded from message `bounded_from` on, where no
    /// later message carried the location (a location held from `m` itself is an
    /// earlier entry of it, which a later one follows).
    fn hold(&mut self, m: &Message, bounded_from: u64) {
        if m.kind == Kind::Layout {
            return self.take_layout(m);
        }
        self.values.hold(&m.entries, m.seq, bounded_from);
    }

    /// Values older than the latest loss not repaired yet are unbounded.
    fn set_gap_seq(&mut self) {
        let open = self.repairable.keys().next_back().map_or(0, |&s| s + 1);
        self.gap_seq = self.given_up_seq.max(open);
    }

    /// Messages `from..to` are missing: asked for again, within [`MAX_REPAIRABLE`].
    fn lost(&mut self, from: u64, to: u64) {
        if to - from > MAX_REPAIRABLE as u64 {
            self.given_up_seq = self.given_up_seq.max(to);
        } else {
            self.repairable.extend((from..to).map(|s| (s, 0)));
        }
        while self.repairable.len() > MAX_REPAIRABLE {
            if let Some((seq, _)) = self.repairable.pop_first() {
                self.given_up_seq = self.given_up_seq.max(seq + 1);
            }
        }
        self.set_gap_seq();
    }

    /// Message `seq` with threshold `t` joins the thresholds: every message from a seq at
    /// or before it on has had at least `t`.
    fn raise_thresholds_to(&mut self, seq: u64, t: u64) {
        let mut all: Vec<(u64, u64)> = self.thresholds.drain(..).collect();
        let at = all.partition_point(|&(s, _)| s < seq);
        for e in &mut all[..at] {
            e.1 = e.1.max(t);
        }
        all.insert(at, (seq, t));
        // Each entry answers for the messages from it on: the largest of it and those after.
        for i in (0..all.len().saturating_sub(1)).rev() {
            all[i].1 = all[i].1.max(all[i + 1].1);
        }
        for (s, t) in all {
            self.push_threshold(s, t);
        }
    }

    fn take_layout(&mut self, m: &Message) {
        for e in &m.entries {
            let state = SyncedState {
                id: e.location.state,
                length: e.location.index,
                stride: e.value.clamp(1, u64::from(u32::MAX)) as u32,
            };
            self.layout.retain(|s| s.id != state.id);
            self.layout.push(state);
        }
        self.layout.sort_unstable_by_key(|s| s.id);
    }

    fn push_threshold(&mut self, seq: u64, t_max: u64) {
        while self.thresholds.back().is_some_and(|&(_, t)| t <= t_max) {
            self.thresholds.pop_back();
        }
        self.thresholds.push_back((seq, t_max));
        if self.thresholds.len() > MAX_THRESHOLDS
            && let Some((_, t0)) = self.thresholds.pop_front()
        {
            // The two oldest become one, at the later place with the larger threshold.
            self.thresholds[0].1 = t0;
        }
    }

    /// The largest threshold in force from message `seq` on.
    fn threshold_since(&self, seq: u64) -> u64 {
        let i = self.thresholds.partition_point(|&(s, _)| s < seq);
        self.thresholds.get(i).map_or(0, |&(_, t)| t)
    }
}

/// The bounds of the cells [`Mirror::gather_entries`] reads, as it goes: the earliest
/// message a bounded one is bounded from (whose bound is the largest: a threshold since a
/// message is the largest of those since then), and those unbounded.
#[derive(Default)]
struct Bounds {
    earliest_from: Option<u64>,
    unbounded: u64,
    first_unbounded: Option<u32>,
}

impl Bounds {
    /// Cell `index`, `held`, the stream's last gap at `gap_seq`.
    fn note(&mut self, index: u32, held: &Held, gap_seq: u64) {
        if held.seq() >= gap_seq {
            self.bounded_from(held.bounded_from());
        } else {
            self.unbounded += 1;
            self.first_unbounded.get_or_insert(index);
        }
    }

    fn bounded_from(&mut self, from: u64) {
        self.earliest_from = Some(self.earliest_from.map_or(from, |e| e.min(from)));
    }
}

/// What [`Mirror::gather_entries`] read: the locations (a table's empty slots by their
/// first word alone), the largest bound among them, and those unbounded (a loss the
/// refresh has not made up yet) with the first of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Gathered {
    pub read: u64,
    /// The values appended (an occupied slot's words; none of an empty one).
    pub values: u64,
    pub largest_bound: u64,
    pub unbounded: u64,
    pub first_unbounded: Option<u32>,
}

/// A location as the collector holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reading {
    pub value: u64,
    /// How far the data plane's value may be from `value`; `None` after a lost message,
    /// until the location is sent again.
    pub bound: Option<u64>,
    /// The sender's clock at the stream's last message applied.
    pub as_of_ns: u64,
}

/// Why a message changed nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    UnknownSwitch,
    /// Of an epoch the stream has left (a switch that started again since).
    StaleEpoch,
    /// At or before the stream's last applied message (a duplicate, or late).
    Stale,
    /// A sequence number no sender gives (0, or the last one there is).
    Seq,
    /// Its locations would take the copy past the locations it may hold.
    Full,
}

impl Refused {
    pub fn reason(self) -> &'static str {
        match self {
            Refused::UnknownSwitch => "unknown_switch",
            Refused::StaleEpoch => "stale_epoch",
            Refused::Stale => "stale",
            Refused::Seq => "bad_seq",
            Refused::Full => "full",
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MirrorCounters {
    pub applied: u64,
    pub entries: u64,
    /// Messages known lost: the holes in the streams' sequences.
    pub missing: u64,
    pub gaps: u64,
    pub unknown_switch: u64,
    pub stale_epoch: u64,
    pub stale: u64,
    pub bad_seq: u64,
    /// Streams started over by a new epoch.
    pub restarts: u64,
    /// Lost messages that came again when asked for, and those given up.
    pub repaired: u64,
    pub given_up: u64,
    /// Messages refused for the locations they would add past the limit.
    pub full: u64,
}

/// The collector's copy of every stream of the switches it accepts.
pub struct Mirror {
    known: Option<Vec<u32>>,
    streams: HashMap<(u32, u16), StreamView>,
    pub counters: MirrorCounters,
    /// Cells held over every stream (a stream's own keeping counted as
    /// [`CELLS_A_STREAM`]), and the most it may hold.
    cells: usize,
    max_cells: usize,
}

/// The locations a collector holds at most unless told otherwise: 64 Mi cells of 16
/// bytes, 1 GiB.
pub const DEFAULT_MAX_LOCATIONS: usize = 1 << 26;

/// What a stream's own keeping (its sequence, thresholds and repairs) counts as, in
/// cells, so that a flood of new streams fills the mirror as locations do.
pub const CELLS_A_STREAM: usize = 64;

impl Mirror {
    /// A mirror of the switches `known` (any switch where `None`).
    pub fn new(known: Option<Vec<u32>>) -> Mirror {
        Mirror {
            known,
            streams: HashMap::new(),
            counters: MirrorCounters::default(),
            cells: 0,
            max_cells: DEFAULT_MAX_LOCATIONS,
        }
    }

    /// A mirror that holds at most `locations` cells (see [`DEFAULT_MAX_LOCATIONS`]).
    pub fn with_max_locations(self, locations: usize) -> Mirror {
        Mirror {
            max_cells: locations,
            ..self
        }
    }

    /// Cells held now over every stream (a stream's keeping as [`CELLS_A_STREAM`]).
    pub fn cells(&self) -> usize {
        self.cells
    }

    /// Applies `m`, or says why it changes nothing (and counts it).
    pub fn apply(&mut self, m: &Message) -> Result<(), Refused> {
        let key = (m.switch, m.stream);
        let cells_of = |streams: &HashMap<(u32, u16), StreamView>| {
            streams
                .get(&key)
                .map_or(0, |v| v.values.cells + CELLS_A_STREAM)
        };
        let before = cells_of(&self.streams);
        let applied = self.apply_to_stream(m);
        self.cells = self.cells + cells_of(&self.streams) - before;
        applied
    }

    fn apply_to_stream(&mut self, m: &Message) -> Result<(), Refused> {
        let refused = |c: &mut MirrorCounters, why: Refused| {
            match why {
                Refused::UnknownSwitch => c.unknown_switch += 1,
                Refused::StaleEpoch => c.stale_epoch += 1,
                Refused::Stale => c.stale += 1,
                Refused::Seq => c.bad_seq += 1,
                Refused::Full => c.full += 1,
            }
            Err(why)
        };
        if self.known.as_ref().is_some_and(|k| !k.contains(&m.switch)) {
            return refused(&mut self.counters, Refused::UnknownSwitch);
        }
        if m.seq == 0 || m.seq == u64::MAX {
            return refused(&mut self.counters, Refused::Seq);
        }
        // What it would add is checked before anything is made for it.
        let growth = match self.streams.get(&(m.switch, m.stream)) {
            Some(view) => view.values.growth(&m.entries),
            None => CELLS_A_STREAM + Values::default().growth(&m.entries),
        };
        if self.cells.saturating_add(growth) > self.max_cells {
            return refused(&mut self.counters, Refused::Full);
        }
        let view =
            (self.streams.entry((m.switch, m.stream))).or_insert_with(|| StreamView::new(m.epoch));
        if m.epoch != view.epoch {
            if view.retired.contains(&m.epoch) {
                return refused(&mut self.counters, Refused::StaleEpoch);
            }
            // A switch that started again draws a new epoch: its stream starts over.
            let mut retired = std::mem::take(&mut view.retired);
            if retired.len() == RETIRED_EPOCHS {
                retired.remove(0);
            }
            retired.push(view.epoch);
            *view = StreamView {
                retired,
                ..StreamView::new(m.epoch)
            };
            self.counters.restarts += 1;
        }
        if m.seq < view.next_seq {
            if !view.repairable.contains_key(&m.seq) || view.repairs_waiting.contains_key(&m.seq) {
                return refused(&mut self.counters, Refused::Stale);
            }
            view.repairs_waiting.insert(m.seq, m.clone());
            view.take_repairs_due();
            self.counters.repaired += 1;
            self.counters.entries += m.entries.len() as u64;
            return Ok(());
        }
        if m.seq > view.next_seq {
            self.counters.gaps += 1;
            self.counters.missing += m.seq - view.next_seq;
            view.missing += m.seq - view.next_seq;
            // What came of a batch before the loss is applied; what is older than the gap
            // is unbounded until the lost messages come again.
            view.take_staged(m.seq - 1);
            view.lost(view.next_seq, m.seq);
        }
        view.next_seq = m.seq + 1;
        if m.more {
            view.staged.push(m.clone());
        } else {
            view.take_staged(m.seq);
            view.take(m, m.seq);
            view.take_repairs_due();
        }
        self.counters.applied += 1;
        self.counters.entries += m.entries.len() as u64;
        Ok(())
    }

    /// `location` of `switch`'s `stream`, or `None` before the stream's first message
    /// applied.
    pub fn read(&self, switch: u32, stream: u16, location: Location) -> Option<Reading> {
        let view = (self.streams.get(&(switch, stream))).filter(|v| v.applied_seq > 0)?;
        // A location never sent holds what every location starts with.
        let held = view.values.get(location).copied().unwrap_or(NEVER);
        let bound = (held.seq() >= view.gap_seq)
            .then(|| divergence_bound(view.threshold_since(held.bounded_from())));
        let value = held.value;
        Some(Reading {
            value,
            bound,
            as_of_ns: view.last_sent_ns,
        })
    }

    /// `count` locations of `state` from `first` in `switch`'s `stream`, as `read` gives
    /// each, with the stream looked up once and the bound worked out once for the
    /// locations that came in one message (most do: a refresh's).
    pub fn read_range(
        &self,
        switch: u32,
        stream: u16,
        state: u16,
        first: u32,
        count: u32,
    ) -> Option<Vec<Reading>> {
        let mut readings = Vec::with_capacity(count as usize);
        self.visit_range(switch, stream, state, first, count, |_, r| readings.push(r))?;
        Some(readings)
    }

    /// The values of the entries of `entry_words` locations each that `count` locations
    /// of `state` from `first` hold (whole entries: a rest is not read), appended to
    /// `out`: every value of a register (1 word an entry), the occupied slots' words of a
    /// table, whose empty slots (first word 0) give nothing and are read by their first
    /// word alone (half of a table's slots, whose other words would be read for
    /// nothing). With what was read and how far it is bounded, as [`Mirror::read_range`]
    /// would bound each location; `None` where `read_range` answers `None`. One pass
    /// over the cells with no reading made of each: what a migration moves is megabytes.
    pub fn gather_entries(
        &self,
        (switch, stream, state): (u32, u16, u16),
        first: u32,
        count: u32,
        entry_words: u32,
        out: &mut Vec<u64>,
    ) -> Option<Gathered> {
        let view = (self.streams.get(&(switch, stream))).filter(|v| v.applied_seq > 0)?;
        let cells = view.values.states.get(&state);
        let dense: &[Held] = cells.map_or(&[], |c| &c.dense);
        // A dense cell never carried is NEVER's alike (seq 0), so reads as it.
        let at = |index: u32| match dense.get(index as usize) {
            Some(held) => held,
            None => (cells.and_then(|c| c.get(index))).unwrap_or(&NEVER),
        };
        let (stride, gap_seq) = (entry_words.max(1), view.gap_seq);
        let out_before = out.len();
        let mut bounds = Bounds::default();
        // Entry `head` cell by cell (one unbounded, or past the dense cells); the
        // locations read.
        let each_cell = |head: u32, out: &mut Vec<u64>, bounds: &mut Bounds| {
            let first_cell = at(head);
            if stride > 1 && first_cell.value == 0 {
                bounds.note(head, first_cell, gap_seq);
                return 1;
            }
            for index in head..head + stride {
                let held = at(index);
                bounds.note(index, held, gap_seq);
                out.push(held.value);
            }
            u64::from(stride)
        };
        let entries = count / stride;
        // The entries whose cells are all dense, walked as one slice.
        let from_first = dense.get(first as usize..).unwrap_or_default();
        let in_dense = (from_first.len() / stride as usize).min(entries as usize);
        let walked = &from_first[..in_dense * stride as usize];
        let (mut read, mut head) = (0, first);
        // The entries read are scattered among empty slots skipped whole (a table half
        // full), a walk the hardware's prefetcher follows poorly: the walk asks for each
        // line of cells (four of 16 bytes) as it comes within four entries.
        const LINE: usize = 4;
        let mut asked = 0;
        for (i, entry) in walked.chunks_exact(stride as usize).enumerate() {
            while asked < (i + 5) * stride as usize
                && let Some(cell) = walked.get(asked)
            {
                stateplane_mem::prefetch(cell);
                asked += LINE;
            }
            let this = head;
            head += stride;
            if stride > 1 && entry[0].value == 0 {
                read += 1;
                bounds.note(this, &entry[0], gap_seq);
                continue;
            }
            // An entry all bounded (a copy whole: every entry a migration reads) is taken
            // in one pass over its cells' bounds and one over their values, with no
            // branch a cell.
            let (oldest, from) = (entry.iter()).fold((u64::MAX, u64::MAX), |(o, f), held| {
                (o.min(held.seq()), f.min(held.bounded_from()))
            });
            if oldest >= gap_seq {
                out.extend(entry.iter().map(|held| held.value));
                bounds.bounded_from(from);
                read += u64::from(stride);
            } else {
                read += each_cell(this, out, &mut bounds);
            }
        }
        for _ in in_dense as u32..entries {
            read += each_cell(head, out, &mut bounds);
            head += stride;
        }
        let largest_bound =
            (bounds.earliest_from).map_or(0, |from| divergence_bound(view.threshold_since(from)));
        let Bounds {
            unbounded,
            first_unbounded,
            ..
        } = bounds;
        Some(Gathered {
            read,
            values: (out.len() - out_before) as u64,
            largest_bound,
            unbounded,
            first_unbounded,
        })
    }

    /// Calls `each` with the offset from `first` and the reading of every location of
    /// `count` from `first` in order, as [`Mirror::read_range`] reads them, without
    /// gathering them; `None` (and no call) where `read_range` answers `None`.
    pub fn visit_range(
        &self,
        switch: u32,
        stream: u16,
        state: u16,
        first: u32,
        count: u32,
        mut each: impl FnMut(usize, Reading),
    ) -> Option<()> {
        let view = (self.streams.get(&(switch, stream))).filter(|v| v.applied_seq > 0)?;
        let cells = view.values.states.get(&state);
        let end = first.saturating_add(count);
        // The dense cells of the range as one slice, walked without a lookup each (a read
        // of a whole register is this loop alone).
        let dense: &[Held] = match cells {
            Some(c) => {
                let from = (first as usize).min(c.dense.len());
                let to = (end.min(DENSE_INDEXES) as usize).clamp(from, c.dense.len());
                &c.dense[from..to]
            }
            None => &[],
        };
        let as_of_ns = view.last_sent_ns;
        let mut last: Option<(u64, u64)> = None;
        let mut reading_of = |held: &Held| {
            let bound = (held.seq() >= view.gap_seq).then(|| match last {
                Some((from, bound)) if from == held.bounded_from() => bound,
                _ => {
                    let bound = divergence_bound(view.threshold_since(held.bounded_from()));
                    last = Some((held.bounded_from(), bound));
                    bound
                }
            });
            Reading {
                value: held.value,
                bound,
                as_of_ns,
            }
        };
        for i in 0..(end - first) as usize {
            // A dense cell never carried is NEVER's alike (seq 0), so reads as it.
            let held = match dense.get(i) {
                Some(held) => held,
                None => (cells.and_then(|c| c.get(first + i as u32))).unwrap_or(&NEVER),
            };
            each(i, reading_of(held));
        }
        Some(())
    }

    /// The report to send `switch` on its `stream` at `now_ns` (its feedback to the rate
    /// controller): the last message seen and the messages found missing.
    pub fn report(&self, switch: u32, stream: u16, now_ns: u64) -> Option<Message> {
        let view = self.streams.get(&(switch, stream))?;
        Some(Message {
            kind: crate::wire::Kind::Report,
            switch,
            epoch: view.epoch,
            stream,
            seq: view.next_seq - 1,
            sent_ns: now_ns,
            t_max: view.missing,
            more: false,
            entries: Vec::new(),
        })
    }

    /// The request to send `switch` on its `stream` at `now_ns` for the messages it lost
    /// (kind 8: each entry's `value` a message's seq), if any are still asked for and the
    /// last request went [`NACK_RETRY_NS`] ago; a message asked for [`MAX_NACKS`] times
    /// is given up.
    pub fn nack(&mut self, switch: u32, stream: u16, now_ns: u64) -> Option<Message> {
        let view = self.streams.get_mut(&(switch, stream))?;
        if view.repairable.is_empty()
            || view
                .last_nack_ns
                .is_some_and(|t| now_ns.saturating_sub(t) < NACK_RETRY_NS)
        {
            return None;
        }
        let waiting = &view.repairs_waiting;
        let worn: Vec<u64> = (view.repairable.iter())
            .filter(|&(seq, &asked)| asked >= MAX_NACKS && !waiting.contains_key(seq))
            .map(|(&seq, _)| seq)
            .collect();
        for seq in worn {
            view.repairable.remove(&seq);
            view.given_up_seq = view.given_up_seq.max(seq + 1);
            self.counters.given_up += 1;
        }
        view.set_gap_seq();
        let waiting = &view.repairs_waiting;
        let asked: Vec<Update> = (view.repairable.iter_mut())
            .filter(|(seq, _)| !waiting.contains_key(seq))
            .take(crate::wire::MAX_ENTRIES)
            .map(|(&seq, asked)| {
                *asked += 1;
                Update {
                    location: Location { state: 0, index: 0 },
                    value: seq,
                    threshold: 0,
                }
            })
            .collect();
        if asked.is_empty() {
            return None;
        }
        view.last_nack_ns = Some(now_ns);
        Some(Message {
            kind: Kind::Nack,
            switch,
            epoch: view.epoch,
            stream,
            seq: view.next_seq - 1,
            sent_ns: now_ns,
            t_max: 0,
            more: false,
            entries: asked,
        })
    }

    /// The streams seen, as `(switch, stream)`, in order.
    pub fn streams(&self) -> Vec<(u32, u16)> {
        let mut streams: Vec<(u32, u16)> = self.streams.keys().copied().collect();
        streams.sort_unstable();
        streams
    }

    /// Every location of `switch`'s `stream` that a message has carried, in order, with
    /// its reading (the others hold 0, as every location starts).
    pub fn held(&self, switch: u32, stream: u16) -> Vec<(Location, Reading)> {
        let Some(view) = self.streams.get(&(switch, stream)) else {
            return Vec::new();
        };
        (view.values.locations().into_iter())
            .filter_map(|l| Some((l, self.read(switch, stream, l)?)))
            .collect()
    }

    /// When `switch`'s `stream` sent its last message applied (its clock): what the copy
    /// is as of.
    pub fn as_of(&self, switch: u32, stream: u16) -> Option<u64> {
        (self.streams.get(&(switch, stream)))
            .filter(|v| v.applied_seq > 0)
            .map(|v| v.last_sent_ns)
    }

    /// The synced states of `switch`'s `stream` as it last announced them, by id (none
    /// before its first `Layout` message arrives).
    pub fn layout(&self, switch: u32, stream: u16) -> Vec<SyncedState> {
        (self.streams.get(&(switch, stream))).map_or_else(Vec::new, |v| v.layout.clone())
    }

    /// Per state of `switch`'s `stream`, in order: one past the largest index a message
    /// has carried (once a refresh has gone by, the state's length).
    pub fn extents(&self, switch: u32, stream: u16) -> Vec<(u16, u32)> {
        let Some(view) = self.streams.get(&(switch, stream)) else {
            return Vec::new();
        };
        let mut extents: Vec<(u16, u32)> = (view.values.states.iter())
            .map(|(&state, cells)| (state, cells.extent()))
            .collect();
        extents.sort_unstable();
        extents
    }

    /// How many locations of `switch`'s `stream` a message has carried.
    pub fn held_count(&self, switch: u32, stream: u16) -> usize {
        (self.streams.get(&(switch, stream))).map_or(0, |v| v.values.count)
    }

    /// The epoch of `switch`'s `stream` and the messages found missing in it.
    pub fn stream_state(&self, switch: u32, stream: u16) -> Option<(u32, u64)> {
        (self.streams.get(&(switch, stream))).map(|v| (v.epoch, v.missing))
    }

    /// The last message applied of `switch`'s `stream` (what its copy is as of), for the
    /// checker.
    pub fn last_seq(&self, switch: u32, stream: u16) -> Option<u64> {
        (self.streams.get(&(switch, stream)))
            .map(|v| v.applied_seq)
            .filter(|&seq| seq > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cell keeps its message and where its bound starts in 16 bytes; where either
    /// passes its bits it is cut the way that keeps bounds sound: a message held as an
    /// earlier one (unbounded by a later gap sooner), a bound from an earlier message on.
    #[test]
    fn a_cell_packs_its_message_and_bound_and_cuts_them_soundly() {
        assert_eq!(size_of::<Held>(), 16);
        let held = |seq, from| {
            let h = Held::new(7, seq, from);
            (h.value, h.seq(), h.bounded_from())
        };
        assert_eq!(held(5, 5), (7, 5, 5));
        assert_eq!(held(5, 5 + 65_535), (7, 5, 5 + 65_535));
        assert_eq!(held(5, 5 + 70_000), (7, 5, 5 + 65_535), "from earlier on");
        assert_eq!(held(SEQ_MASK, SEQ_MASK + 3), (7, SEQ_MASK, SEQ_MASK + 3));
        let far = SEQ_MASK + 65_535;
        assert_eq!(held(u64::MAX - 1, u64::MAX - 1), (7, SEQ_MASK, far));
        assert_eq!((NEVER.seq(), NEVER.bounded_from()), (0, 0));
    }
    use crate::Update;
    use crate::wire::Kind;

    fn msg(seq: u64, t_max: u64, entries: &[(u32, u64)]) -> Message {
        Message {
            kind: Kind::Updates,
            switch: 1,
            epoch: 1,
            stream: 0,
            seq,
            sent_ns: seq.wrapping_mul(10),
            t_max,
            more: false,
            entries: (entries.iter())
                .map(|&(index, value)| Update {
                    location: Location { state: 0, index },
                    value,
                    threshold: t_max,
                })
                .collect(),
        }
    }

    fn at(index: u32) -> Location {
        Location { state: 0, index }
    }

    /// A message's entries of several states, in turns, each land in their own state
    /// (a state's cells are looked up once for its entries in a row), a location twice
    /// in one message keeps the later entry, and the locations are counted once each.
    #[test]
    fn entries_of_several_states_in_turns_land_each_in_its_state() {
        let mut m = Mirror::new(None);
        let mut message = msg(1, 0, &[(0, 1), (1, 2), (0, 3), (DENSE_INDEXES + 1, 4)]);
        message.entries[1].location.state = 7;
        message.entries.push(Update {
            location: Location { state: 7, index: 1 },
            value: 5,
            threshold: 0,
        });
        m.apply(&message).unwrap();
        let value = |state, index| m.read(1, 0, Location { state, index }).map(|r| r.value);
        assert_eq!(value(0, 0), Some(3), "the later entry of location 0");
        assert_eq!(value(7, 1), Some(5));
        assert_eq!(
            value(0, 1),
            Some(0),
            "state 0's location 1 was never carried"
        );
        assert_eq!(value(0, DENSE_INDEXES + 1), Some(4));
        assert_eq!(m.held_count(1, 0), 3);
    }

    #[test]
    fn bounds_follow_the_largest_threshold_since_each_value() {
        let mut m = Mirror::new(Some(vec![1]));
        m.apply(&msg(1, 0, &[(1, 5)])).unwrap();
        m.apply(&msg(2, 8, &[(2, 7)])).unwrap();
        m.apply(&msg(3, 2, &[(3, 9)])).unwrap();
        let bound = |i| m.read(1, 0, at(i)).unwrap().bound;
        assert_eq!(bound(1), Some(7), "t 8 came after its value");
        assert_eq!(bound(2), Some(7));
        assert_eq!(bound(3), Some(1));
        assert_eq!(bound(4), Some(7), "never sent: since the stream began");
        assert_eq!(m.read(1, 0, at(3)).unwrap().as_of_ns, 30);
    }

    #[test]
    fn a_gap_unbounds_what_is_older_until_it_comes_again() {
        let mut m = Mirror::new(None);
        m.apply(&msg(1, 0, &[(1, 5), (2, 6)])).unwrap();
        m.apply(&msg(4, 0, &[(2, 8)])).unwrap();
        assert_eq!(m.counters.missing, 2);
        assert_eq!(m.read(1, 0, at(1)).unwrap().bound, None);
        assert_eq!(m.read(1, 0, at(2)).unwrap().bound, Some(0));
        // A lost message that comes late (asked for again, or only delayed) is taken where
        // it is the newest word: location 1's, not location 2's (message 4 came after).
        // Location 1 is then bounded (by message 3's threshold on), as its value came
        // after the loss that is still open; location 7, never sent, is not.
        m.apply(&msg(3, 2, &[(1, 1), (2, 3)])).unwrap();
        let value = |m: &Mirror, i| m.read(1, 0, at(i)).unwrap().value;
        assert_eq!((value(&m, 1), value(&m, 2)), (1, 8));
        assert_eq!(m.read(1, 0, at(1)).unwrap().bound, Some(1));
        assert_eq!(m.read(1, 0, at(7)).unwrap().bound, None);
        assert_eq!(m.apply(&msg(3, 2, &[(1, 1)])), Err(Refused::Stale), "again");
        // The last lost message back, every value is bounded again, with message 3's
        // threshold among those after it.
        m.apply(&msg(2, 0, &[])).unwrap();
        assert_eq!(m.read(1, 0, at(1)).unwrap().bound, Some(1));
        assert_eq!(m.read(3, 0, at(2)), None);
        assert_eq!(m.read(1, 0, at(2)).unwrap().bound, Some(0));
        assert_eq!(m.read(1, 0, at(7)).unwrap().bound, Some(1), "never sent");
        assert_eq!(m.counters.repaired, 2);
        m.apply(&msg(5, 0, &[(1, 7)])).unwrap();
        assert_eq!(m.read(1, 0, at(1)).unwrap().bound, Some(0));
        assert_eq!(m.apply(&msg(5, 0, &[])), Err(Refused::Stale), "a duplicate");
    }

    /// A lost message that comes back while the copy waits for the end of a later batch
    /// is taken only once the copy is as of it: the copy never holds a value newer than
    /// its instant.
    #[test]
    fn a_message_back_before_the_copy_reaches_it_waits() {
        let mut m = Mirror::new(None);
        m.apply(&msg(1, 0, &[(1, 5)])).unwrap();
        let mut more = msg(3, 0, &[(2, 9)]);
        more.more = true;
        m.apply(&more).unwrap();
        m.apply(&msg(2, 0, &[(1, 6)])).unwrap();
        assert_eq!(
            m.read(1, 0, at(1)).unwrap().value,
            5,
            "as of message 1 still"
        );
        m.apply(&msg(4, 0, &[])).unwrap();
        assert_eq!(
            m.read(1, 0, at(1)).unwrap(),
            Reading {
                value: 6,
                bound: Some(0),
                as_of_ns: 40
            }
        );
    }

    /// The collector asks for what it lost, again every `NACK_RETRY_NS`, at most
    /// `MAX_NACKS` times; then it gives the message up, and what is older than it stays
    /// unbounded until the refresh carries it.
    #[test]
    fn lost_messages_are_asked_for_then_given_up() {
        let mut m = Mirror::new(None);
        m.apply(&msg(1, 0, &[(1, 5)])).unwrap();
        m.apply(&msg(4, 0, &[])).unwrap();
        let asked = |n: &Message| n.entries.iter().map(|e| e.value).collect::<Vec<_>>();
        let nack = m.nack(1, 0, 0).unwrap();
        assert_eq!(
            (nack.kind, nack.seq, asked(&nack)),
            (Kind::Nack, 4, vec![2, 3])
        );
        assert!(m.nack(1, 0, NACK_RETRY_NS - 1).is_none(), "not yet again");
        m.apply(&msg(2, 0, &[])).unwrap();
        let mut now = NACK_RETRY_NS;
        for _ in 1..MAX_NACKS {
            assert_eq!(asked(&m.nack(1, 0, now).unwrap()), [3]);
            now += NACK_RETRY_NS;
        }
        assert!(m.nack(1, 0, now).is_none(), "given up");
        assert_eq!(m.counters.given_up, 1);
        assert_eq!(m.read(1, 0, at(1)).unwrap().bound, None);
        assert_eq!(m.apply(&msg(3, 0, &[])), Err(Refused::Stale), "too late");
        assert!(m.nack(9, 0, now).is_none(), "an unknown stream");
    }

    /// A message whose locations would take the copy past its limit is refused as
    /// `full` before anything is made for it: far dense indexes count every cell up to
    /// them, sparse ones each, and every stream its keeping; what a stream held goes when
    /// it starts over, and room comes back.
    #[test]
    fn messages_past_the_location_limit_are_refused_before_anything_is_made() {
        let mut m = Mirror::new(None).with_max_locations(1_000);
        m.apply(&msg(1, 0, &[(9, 1), (DENSE_INDEXES + 5, 2)]))
            .unwrap();
        assert_eq!(m.cells(), CELLS_A_STREAM + 10 + 1);
        // A far dense index would make every cell below it (the collector once made
        // 192 MiB a state for one such entry).
        let far = msg(2, 0, &[(DENSE_INDEXES - 1, 3)]);
        assert_eq!(m.apply(&far), Err(Refused::Full));
        assert_eq!((m.counters.full, m.cells()), (1, CELLS_A_STREAM + 11));
        assert_eq!(Refused::Full.reason(), "full");
        // Up to the limit is taken; a location held already adds nothing.
        let fill: Vec<(u32, u64)> = (0..1_000 - CELLS_A_STREAM as u32 - 1)
            .map(|i| (i, 7))
            .collect();
        m.apply(&msg(3, 0, &fill)).unwrap();
        assert_eq!(m.cells(), 1_000);
        m.apply(&msg(4, 0, &[(DENSE_INDEXES + 5, 8), (3, 9)]))
            .unwrap();
        assert_eq!(m.read(1, 0, at(3)).unwrap().value, 9);
        // A new stream's keeping counts, as a new sparse location does.
        let other_stream = Message {
            stream: 1,
            ..msg(1, 0, &[])
        };
        assert_eq!(m.apply(&other_stream), Err(Refused::Full));
        assert_eq!(
            m.apply(&msg(5, 0, &[(DENSE_INDEXES + 6, 1)])),
            Err(Refused::Full)
        );
        // A stream that starts over drops what it held.
        let restart = Message {
            epoch: 9,
            ..msg(1, 0, &[(0, 1)])
        };
        m.apply(&restart).unwrap();
        assert_eq!(m.cells(), CELLS_A_STREAM + 1);
        m.apply(&other_stream).unwrap();
        assert_eq!(m.cells(), 2 * CELLS_A_STREAM + 1);
    }

    #[test]
    fn unknown_switches_and_left_epochs_are_refused_and_a_new_epoch_starts_over() {
        let mut m = Mirror::new(Some(vec![1]));
        let other = Message {
            switch: 2,
            ..msg(1, 0, &[])
        };
        assert_eq!(m.apply(&other), Err(Refused::UnknownSwitch));
        assert_eq!(m.read(2, 0, at(0)), None);
        m.apply(&Message {
            epoch: 5,
            ..msg(7, 0, &[(1, 3)])
        })
        .unwrap();
        assert_eq!(m.read(1, 0, at(2)).unwrap().bound, None, "began with a gap");
        assert_eq!(m.read(1, 0, at(1)).unwrap().bound, Some(0), "sent after it");
        // Epochs are drawn at random: a new one, lower or higher, starts the stream over,
        // and the one left behind is refused from then on.
        m.apply(&Message {
            epoch: 2,
            ..msg(1, 0, &[])
        })
        .unwrap();
        assert_eq!(m.counters.restarts, 1);
        let old = Message {
            epoch: 5,
            ..msg(8, 0, &[(1, 1)])
        };
        assert_eq!(m.apply(&old), Err(Refused::StaleEpoch));
        assert_eq!(m.stream_state(1, 0), Some((2, 0)));
        assert_eq!(
            m.read(1, 0, at(1)).unwrap(),
            Reading {
                value: 0,
                bound: Some(0),
                as_of_ns: 10
            }
        );
    }

    /// However many thresholds come, the kept list stays short and its answers never
    /// below the true largest threshold since each message.
    #[test]
    fn merged_thresholds_over_approximate() {
        let mut view = StreamView::new(1);
        let ts: Vec<u64> = (1..=5_000u64).map(|s| 10_000 - s).collect();
        for (s, &t) in (1..).zip(&ts) {
            view.push_threshold(s, t);
        }
        assert!(view.thresholds.len() <= MAX_THRESHOLDS);
        for s in 1..=5_000u64 {
            let truth = ts[s as usize - 1..].iter().max().copied().unwrap_or(0);
            assert!(view.threshold_since(s) >= truth, "from {s}");
        }
        assert_eq!(
            view.threshold_since(5_000),
            ts[4_999],
            "exact for the recent ones"
        );
    }

    /// A batch is applied when its last message arrives; one cut by a loss is applied up
    /// to the loss when the next message shows it, what it lost unbounded.
    #[test]
    fn a_batch_is_applied_whole_or_up_to_its_loss() {
        let more = |m: Message| Message { more: true, ..m };
        let mut m = Mirror::new(None);
        m.apply(&more(msg(1, 0, &[(1, 5)]))).unwrap();
        assert_eq!(m.read(1, 0, at(1)), None, "nothing applied yet");
        m.apply(&msg(2, 0, &[(2, 6)])).unwrap();
        assert_eq!(m.last_seq(1, 0), Some(2));
        assert_eq!(m.read(1, 0, at(1)).unwrap().value, 5);
        m.apply(&more(msg(3, 0, &[(1, 7)]))).unwrap();
        assert_eq!(m.read(1, 0, at(1)).unwrap().value, 5, "its batch goes on");
        // Message 4, the batch's last, is lost; 5 shows it.
        m.apply(&msg(5, 0, &[(3, 1)])).unwrap();
        assert_eq!(m.last_seq(1, 0), Some(5));
        assert_eq!(
            m.read(1, 0, at(1)).unwrap(),
            Reading {
                value: 7,
                bound: None,
                as_of_ns: 50
            }
        );
        assert_eq!(m.read(1, 0, at(3)).unwrap().bound, Some(0));
    }

    /// Any message, however odd its fields, is applied or refused: no panic, no sequence
    /// number that wraps the stream's.
    #[test]
    fn odd_messages_are_refused_or_applied_without_panic() {
        let mut m = Mirror::new(None);
        for seq in [0, u64::MAX] {
            assert_eq!(m.apply(&msg(seq, 0, &[(1, 1)])), Err(Refused::Seq));
        }
        m.apply(&msg(u64::MAX - 1, u64::MAX, &[(u32::MAX, u64::MAX)]))
            .unwrap();
        let r = m.read(1, 0, at(u32::MAX)).unwrap();
        // Held as message 2^48 - 1 (`Held`), before the gap the stream's first message
        // shows (messages 1 to 2^64 - 3 missing): unbounded, never bounded wrongly.
        assert_eq!((r.value, r.bound), (u64::MAX, None));
        assert_eq!(m.counters.bad_seq, 2);
        assert_eq!(m.report(1, 0, 0).unwrap().seq, u64::MAX - 1);
    }

    /// A range read gives what one read of each location gives, near indexes and far
    /// (held apart), after gaps, refreshes and thresholds; and `held` lists each location
    /// carried once, in order.
    #[test]
    fn a_range_read_is_each_location_read() {
        let mut rng = stateplane_gen::rng::Rng::new(3);
        let far = DENSE_INDEXES + 5;
        let mut m = Mirror::new(None);
        let mut seq = 1;
        for _ in 0..300 {
            // Now and then a message is skipped (a gap), or a refresh comes.
            seq += 1 + u64::from(rng.chance(0.05));
            let entries: Vec<(u32, u64)> = (0..rng.below(6))
                .map(|_| {
                    let index = if rng.chance(0.1) {
                        far + rng.below(3) as u32
                    } else {
                        rng.below(64) as u32
                    };
                    (index, rng.below(1000))
                })
                .collect();
            let mut message = msg(seq, rng.below(5), &entries);
            if rng.chance(0.2) {
                message.kind = Kind::Refresh;
            }
            let _ = m.apply(&message);
        }
        for first in [0, far - 2] {
            let range = m.read_range(1, 0, 0, first, 70).unwrap();
            for (i, r) in range.iter().enumerate() {
                assert_eq!(
                    Some(*r),
                    m.read(1, 0, at(first + i as u32)),
                    "{first} + {i}"
                );
            }
        }
        // Entries gathered are the locations read one by one: an entry whose first word
        // is 0 read by that word alone, the others whole, each bound taken.
        for (first, stride) in [(0, 1), (0, 3), (far - 2, 1), (far - 2, 4)] {
            let (mut want, mut values) = (Gathered::default(), Vec::new());
            let mut want_values = Vec::new();
            for entry in 0..70 / stride {
                let head = first + entry * stride;
                let empty = stride > 1 && m.read(1, 0, at(head)).unwrap().value == 0;
                let len = if empty { 1 } else { stride };
                for index in head..head + len {
                    let r = m.read(1, 0, at(index)).unwrap();
                    want.read += 1;
                    match r.bound {
                        Some(b) => want.largest_bound = want.largest_bound.max(b),
                        None => {
                            want.unbounded += 1;
                            want.first_unbounded.get_or_insert(index);
                        }
                    }
                    if !empty {
                        want_values.push(r.value);
                        want.values += 1;
                    }
                }
            }
            let got = m.gather_entries((1, 0, 0), first, 70, stride, &mut values);
            assert_eq!(got, Some(want), "{first}, {stride}");
            assert_eq!(values, want_values, "{first}, {stride}");
        }
        let held = m.held(1, 0);
        assert_eq!(held.len(), m.held_count(1, 0));
        assert!(held.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(held.iter().any(|(l, _)| l.index >= far));
        assert_eq!(
            m.read_range(1, 1, 0, 0, 1),
            None,
            "a stream never heard from"
        );
    }
}
