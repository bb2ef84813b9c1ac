//! Top-down writes: an application's set of values, written into a switch whole. The
//! collector's [`WriteEngine`] splits a write into parts of a message each, sends them and
//! sends again each part that a later part's acknowledgement shows lost, or that is not
//! acknowledged within the retransmission timeout; the switch's
//! [`WriteStage`] holds the parts until it has them all, acknowledges what it holds (a
//! bitmap, so that any one acknowledgement that gets through says everything), and the
//! worker commits the write between two bursts, all of it at once: no packet ever sees a
//! write half applied. Writes commit in the order they were submitted, each once. A write
//! may go before its last values are known ([`WriteEngine::open`]: a migration's, sent as
//! the collector reads its copy); the switch then learns how many parts it has from a
//! later part, and commits nothing before.
//!
//! Beyond the paper, which holds back the data plane's updates to the written locations
//! while a write is on its way and replays them after it (out of order), a location
//! written with [`Mode::SetKeepingChanges`] keeps the changes made to it from the moment
//! its part arrived: it becomes the written value plus them (a counter reset at the end of
//! an interval loses none of the next interval's counts). Nothing is reordered; the
//! locations whose changes were kept are counted.

use crate::wire::{
    ENTRY_LEN, EncodedSize, Entries, HEADER_LEN, Key, Kind, MAC_LEN, MAX_ENTRIES, MAX_RUN_COLUMNS,
    MAX_RUN_ENTRIES, Message, Resendable, RowWidths, Stretch, StretchValues, columns_message_bytes,
};
use crate::{Location, Update};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Range;

/// The parts a write may have: its acknowledgement's bitmap fits one message.
pub const MAX_PARTS: usize = MAX_ENTRIES * 64;
/// The values a write may hold on any path: as many as its parts carry on a 1,500-byte
/// path, as entries.
pub const MAX_VALUES: usize = MAX_PARTS * MAX_ENTRIES;
/// The values a write may hold on a path of larger datagrams (loopback, jumbo frames):
/// what a switch stages of one write at most ([`WriteEngine::max_values`]). A table of
/// 65,536 entries of up to 16 words moves as one write, committed whole.
pub const MAX_WRITE_VALUES: usize = 1 << 20;
/// The values a switch stream holds of all the writes it stages: two whole writes (one
/// committing while the next arrives), so that writes on their way cannot make a switch
/// stage gigabytes.
pub const MAX_HELD_VALUES: usize = 2 * MAX_WRITE_VALUES;

/// The synced state a write lands in (a worker's, between two bursts).
pub trait WriteTarget {
    fn read(&self, location: Location) -> u64;
    fn write(&mut self, location: Location, value: u64);
    /// Writes `values` at `first` and the locations after it in its state, as
    /// [`WriteTarget::write`] each (a write's parts are mostly such runs).
    fn write_run(&mut self, first: Location, values: &[u64]) {
        for (index, &value) in (first.index..).zip(values) {
            self.write(Location { index, ..first }, value);
        }
    }
    /// The locations of `state`, 0 where not known: a write's changes kept are counted
    /// from its first part's arrival only in a state whose locations are known.
    fn extent(&self, _state: u16) -> u32 {
        0
    }
    /// The write's values are all in: state that places them whole (a table's entries)
    /// does so now. Returns the entries it refused.
    fn finish(&mut self) -> u64 {
        0
    }
    /// Takes `values` at `first` and the locations after it ahead of the write's commit,
    /// as [`WriteTarget::write_run`] at the commit would, if the state holds a write until
    /// [`WriteTarget::finish`] anyway (a table, which reads its entries as they come, so
    /// that the commit only places them); `false` where the values would land at once (a
    /// register), and are then held until the commit. Taken values are in the next
    /// `finish`, or dropped by [`WriteTarget::drop_staged`].
    fn stage_run(&mut self, _first: Location, _values: &[u64]) -> bool {
        false
    }
    /// Drops what [`WriteTarget::stage_run`] took of a write that will not commit.
    fn drop_staged(&mut self) {}
}

/// How a written value lands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The location becomes the value.
    Set = 0,
    /// The location becomes the value plus the changes made to it since its part arrived.
    SetKeepingChanges = 1,
    /// The location loses the value (down to 0 at most), as it commits: a counter less
    /// what an application read of it from the copy, so that what was counted after the
    /// copy's value (not yet in the copy when it was read, or since) stays for the next
    /// interval, whenever the read was and however long the write took.
    Subtract = 2,
}

impl Mode {
    /// The mode a part's entry names, `None` for one this switch does not know (a newer
    /// collector's): such a part is refused, never taken as another mode.
    fn named(word: u64) -> Option<Mode> {
        match word {
            0 => Some(Mode::Set),
            1 => Some(Mode::SetKeepingChanges),
            2 => Some(Mode::Subtract),
            _ => None,
        }
    }

    /// The mode of an entry of a part taken (its mode checked by `on_part`).
    fn of(word: u64) -> Mode {
        Mode::named(word).unwrap_or(Mode::Set)
    }
}

/// One value of a write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Written {
    pub location: Location,
    pub value: u64,
    pub mode: Mode,
}

/// A write's values, as [`WriteEngine::submit`] takes them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteValues {
    /// Each at its own location, in its own mode.
    Each(Vec<Written>),
    /// `values` at `first` and the locations after it in its state, all in `mode`: a
    /// register's values, or a table's entries as a migration moves them, cut into parts
    /// and encoded where they are (never made into a [`Written`] each). `columns`: the
    /// words of an entry (a table's slot's, which go as runs in columns, each word as
    /// narrow as its widest in the part: see [`Stretch`]); 1 for a register's values.
    Stretch {
        first: Location,
        mode: Mode,
        values: Vec<u64>,
        columns: usize,
    },
}

impl WriteValues {
    pub fn len(&self) -> usize {
        match self {
            WriteValues::Each(values) => values.len(),
            WriteValues::Stretch { values, .. } => values.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as their encoding reads them.
    fn view(&self) -> ValuesView<'_> {
        match self {
            WriteValues::Each(each) => ValuesView::Each(each),
            &WriteValues::Stretch {
                first,
                mode,
                ref values,
                columns,
            } => ValuesView::Stretch(Stretch {
                first,
                threshold: mode as u64,
                values,
                columns,
            }),
        }
    }
}

/// A write's values as a message's encoding reads them: each written, or the stretch.
enum ValuesView<'a> {
    Each(&'a [Written]),
    Stretch(Stretch<'a>),
}

impl Entries for WriteValues {
    fn count(&self) -> usize {
        self.len()
    }
    #[inline]
    fn entry(&self, i: usize) -> Update {
        match self.view() {
            ValuesView::Each(each) => each.entry(i),
            ValuesView::Stretch(stretch) => stretch.entry(i),
        }
    }
    fn put_values(&self, start: usize, len: usize, width: usize, out: &mut Vec<u8>) {
        match self.view() {
            ValuesView::Each(each) => each.put_values(start, len, width, out),
            ValuesView::Stretch(stretch) => stretch.put_values(start, len, width, out),
        }
    }
    fn stretch(&self) -> Option<Stretch<'_>> {
        match self.view() {
            ValuesView::Each(_) => None,
            ValuesView::Stretch(stretch) => Some(stretch),
        }
    }
}

impl From<Vec<Written>> for WriteValues {
    fn from(values: Vec<Written>) -> Self {
        WriteValues::Each(values)
    }
}

/// A write's values as a part's encoding reads them.
impl Entries for [Written] {
    fn count(&self) -> usize {
        self.len()
    }
    #[inline]
    fn entry(&self, i: usize) -> Update {
        let w = &self[i];
        Update {
            location: w.location,
            value: w.value,
            threshold: w.mode as u64,
        }
    }
    fn put_values(&self, start: usize, len: usize, width: usize, out: &mut Vec<u8>) {
        let values = self[start..start + len].iter().map(|w| w.value);
        crate::wire::put_values(values, width, out);
    }
}

/// A write the engine has seen through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completed {
    pub id: u64,
    pub parts: u32,
    pub latency_ns: u64,
    /// Parts sent, retransmissions included.
    pub transmissions: u64,
    /// The switch dropped the write at the collector's request ([`WriteEngine::cancel`]):
    /// nothing of it was committed.
    pub cancelled: bool,
    /// Entries (or values) the switch's state refused whole as the write committed (a
    /// full table, fields that do not fit its declaration); `None` where the switch did
    /// not say (an abandon answered as committed already).
    pub refused: Option<u64>,
}

/// What [`WriteEngine::cancel`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cancel {
    /// The write sends no more parts, and the switch is asked to drop what it holds of
    /// it; its answer says whether it did or had committed it already.
    Asked,
    /// No write of that id is queued or on its way.
    Unknown,
}

/// An abandon's acknowledgement (no entries): the switch dropped the write.
pub const ABANDONED: u64 = 0;
/// An abandon's acknowledgement (no entries): the write had committed, or was whole and
/// commits at once.
pub const COMMITTED_ALREADY: u64 = 1;
/// An acknowledgement's `t_max` with this bit: its write has committed, and the bits
/// below are the entries (or values) the state refused whole ([`Committed::refused`]).
/// Without it, `t_max` is the parts held, or an abandon's answer.
pub const COMMITTED: u64 = 1 << 63;

/// A write's parts: each its range of the write's values, encoded as it first goes (so
/// that a large write's first parts are on their way while the rest are encoded) and
/// then kept, its sending time set at each transmission.
///
/// A write may be open ([`WriteEngine::open`]): its values still coming, its parts cut
/// as they fill (in rows; other values wait for the close). A part encoded while the
/// write is open does not say how many parts the write has (its count is
/// [`COUNT_NOT_KNOWN`]): the switch learns that from a part encoded after the close (the
/// last part at least is), and commits nothing before it.
struct WriteParts {
    /// A part's message but for its place and the count (`t_max`).
    header: Message,
    values: WriteValues,
    ranges: Vec<Range<usize>>,
    encoded: Vec<Option<Resendable>>,
    /// Values may still come.
    open: bool,
    cutting: Cutting,
}

/// How far a write's values are cut into parts.
enum Cutting {
    /// Not begun (a write is cut as it goes, within the path's limits then).
    NotYet,
    /// In rows, as far as they have come (a cutter is a row's widths: boxed, as large as
    /// the widest row).
    Rows(Box<RowCutter>),
    /// Every value in a part.
    Done,
}

impl WriteParts {
    fn new(header: Message, values: WriteValues, open: bool) -> WriteParts {
        WriteParts {
            header,
            values,
            ranges: Vec::new(),
            encoded: Vec::new(),
            open,
            cutting: Cutting::NotYet,
        }
    }

    /// An abandon's: no parts.
    fn none(header: Message) -> WriteParts {
        WriteParts {
            cutting: Cutting::Done,
            ..WriteParts::new(header, WriteValues::Each(Vec::new()), false)
        }
    }

    fn len(&self) -> usize {
        self.ranges.len()
    }

    fn is_encoded(&self, i: usize) -> bool {
        self.encoded[i].is_some()
    }

    /// Cuts the parts the values make so far within `limits`: all of them once the write
    /// is closed; while it is open, each part of rows once it is full (values not in rows
    /// wait for the close).
    fn cut(&mut self, limits: PartLimits) {
        if let Cutting::NotYet = self.cutting
            && let Some(stretch) = (self.values.stretch()).filter(|s| limits.cuts_in_rows(s))
        {
            self.cutting = Cutting::Rows(Box::new(RowCutter::new(limits, stretch.columns)));
        }
        let closed = !self.open;
        match &mut self.cutting {
            Cutting::Rows(cutter) => {
                if let WriteValues::Stretch { values, .. } = &self.values {
                    cutter.cut(values, closed, &mut self.ranges);
                }
            }
            Cutting::NotYet if closed => self.ranges = limits.parts_of(&self.values),
            Cutting::NotYet | Cutting::Done => return,
        }
        if closed {
            self.cutting = Cutting::Done;
        }
        self.encoded.resize(self.ranges.len(), None);
    }

    /// Part `i`, encoded now if it never was.
    fn encoded(&mut self, i: usize, key: Option<&Key>) -> &mut Resendable {
        let WriteParts {
            header,
            values,
            ranges,
            encoded,
            open,
            ..
        } = self;
        encoded[i].get_or_insert_with(|| {
            let count = if *open {
                COUNT_NOT_KNOWN
            } else {
                ranges.len() as u64
            };
            header.t_max = ((i as u64) << 32) | count;
            let part = Part {
                values,
                range: ranges[i].clone(),
            };
            Resendable::new(header, &part, key)
        })
    }
}

/// What a part may hold: the bytes of the path's datagram, and values at most.
#[derive(Clone, Copy, Debug)]
struct PartLimits {
    part_bytes: usize,
    values_per_part: usize,
}

impl PartLimits {
    /// `values` cut into parts of as many values as a datagram of `part_bytes` carries,
    /// runs counted (a register's values in order take a few bytes each, not 24): each
    /// part's range of them.
    fn parts_of(&self, values: &(impl Entries + ?Sized)) -> Vec<Range<usize>> {
        let mut parts = Vec::new();
        if let Some(stretch) = values.stretch().filter(|s| self.cuts_in_rows(s)) {
            RowCutter::new(*self, stretch.columns).cut(stretch.values, true, &mut parts);
            return parts;
        }
        let mut start = 0;
        let mut size = EncodedSize::default();
        let fits = |size: &EncodedSize| {
            size.bytes() + MAC_LEN <= self.part_bytes && size.count() <= self.values_per_part
        };
        // The size is asked after each chunk of values, and after each value only in the
        // chunk that does not fit: a part of 8,000 values is measured 125 times, not 8,000.
        // What a part holds is measured whole either way, so it fits its datagram.
        let count = values.count();
        for chunk_start in (0..count).step_by(SIZED_AT_ONCE) {
            let chunk = chunk_start..(chunk_start + SIZED_AT_ONCE).min(count);
            let before = size.clone();
            size.push_all(&Part {
                values,
                range: chunk.clone(),
            });
            if fits(&size) {
                continue;
            }
            size = before;
            for i in chunk {
                let update = values.entry(i);
                size.push(&update);
                if !fits(&size) && i > start {
                    parts.push(start..i);
                    start = i;
                    size = EncodedSize::default();
                    size.push(&update);
                }
            }
        }
        // An empty write is one empty part, so that it commits (and is seen to).
        parts.push(start..count);
        parts
    }

    /// Whether a stretch is cut into parts of whole rows: where it goes in columns, and a
    /// part may hold a row.
    fn cuts_in_rows(&self, stretch: &Stretch) -> bool {
        stretch.in_columns() && stretch.columns <= self.values_per_part && {
            let widest_row =
                columns_message_bytes(&[8; MAX_RUN_COLUMNS][..stretch.columns], stretch.columns);
            widest_row + MAC_LEN <= self.part_bytes
        }
    }
}

/// A stretch in columns cut into parts of whole rows (the last row may be short), as
/// many as fit a datagram with each column as wide as its widest value in the part; cut
/// as its values come, a part once a row comes that it cannot hold.
struct RowCutter {
    limits: PartLimits,
    columns: usize,
    /// A part's bytes but for its rows'.
    fixed: usize,
    /// The first value of the part being filled.
    start: usize,
    /// The first value of the first row not taken.
    next_row: usize,
    /// The rows the part being filled has taken (a short last row counted whole: a few
    /// bytes more, never fewer).
    rows: usize,
    widths: RowWidths,
}

impl RowCutter {
    fn new(limits: PartLimits, columns: usize) -> RowCutter {
        RowCutter {
            limits,
            columns,
            fixed: columns_message_bytes(&[0; MAX_RUN_COLUMNS][..columns], 0) + MAC_LEN,
            start: 0,
            next_row: 0,
            rows: 0,
            widths: RowWidths::default(),
        }
    }

    /// Takes the whole rows of `values` not taken before (with `closed`, the short last
    /// one too), pushing each part they fill to `parts`; with `closed`, the last part too
    /// (for no values, one empty part, so that an empty write commits).
    fn cut(&mut self, values: &[u64], closed: bool, parts: &mut Vec<Range<usize>>) {
        let (columns, count) = (self.columns, values.len());
        while self.next_row < count {
            let row_start = self.next_row;
            let end = (row_start + columns).min(count);
            if end - row_start < columns && !closed {
                break;
            }
            self.next_row = end;
            let row = &values[row_start..end];
            let row_bytes = self.widths.take(row);
            let rows = self.rows + 1;
            let fits = self.fixed + rows * row_bytes <= self.limits.part_bytes
                && end - self.start <= self.limits.values_per_part;
            if fits || row_start == self.start {
                self.rows = rows;
                continue;
            }
            // The row goes first in the next part, its widths its own.
            parts.push(self.start..row_start);
            self.start = row_start;
            self.rows = 1;
            self.widths = RowWidths::default();
            self.widths.take(row);
        }
        if closed {
            parts.push(self.start..count);
        }
    }
}

struct InFlight {
    id: u64,
    parts: WriteParts,
    acked: Vec<bool>,
    sent_at: Vec<Option<u64>>,
    left: usize,
    started_ns: u64,
    transmissions: u64,
    /// Each part's place in the order of transmissions (its last), and the latest place
    /// acknowledged: a part sent more than `REORDERING` places before it and not
    /// acknowledged is lost.
    sent_order: Vec<u64>,
    latest_acked_order: u64,
    /// The latest sending time an acknowledgement echoed: a transmission that arrived.
    delivered_sent_ns: u64,
    /// The last part sent or acknowledgement taken.
    last_event_ns: u64,
    /// Cancelled: the abandon's last sending and how often it went.
    abandon: Option<(Option<u64>, u32)>,
    /// How often each part was sent (a part sent once gives a sample of the round trip).
    tries: Vec<u32>,
    /// The copies each part went in, its last time.
    copies: Vec<u32>,
    /// When a part last went on a timeout.
    timeout_sent_ns: u64,
    /// Every transmission's sending time and place in the order of transmissions, in
    /// order (the times increase).
    sends: Vec<(u64, u64)>,
    /// The most datagrams of the write an acknowledgement has said the switch took.
    datagrams_taken: u64,
    /// The latest sending time a round trip was measured from: copies of one
    /// acknowledgement (or of one part's) give one measure, not one each.
    timed_sent_ns: Option<u64>,
    /// When the switch held every part of the write closed: it commits the write then,
    /// between two bursts, and answers.
    held_ns: Option<u64>,
}

impl InFlight {
    /// Makes room for the parts cut since the last call (an open write's come as its
    /// values do).
    fn track_new_parts(&mut self) {
        let n = self.parts.len();
        let new = n.saturating_sub(self.acked.len());
        if new == 0 {
            return;
        }
        self.acked.resize(n, false);
        self.sent_at.resize(n, None);
        self.sent_order.resize(n, 0);
        self.tries.resize(n, 0);
        self.copies.resize(n, 0);
        self.left += new;
    }
}

/// Datagrams (parts, copies counted) unacknowledged on the way at most, so that they do
/// not wait in a queue long enough to time out there (and the round trips measured are
/// the channel's).
pub const WINDOW: usize = 128;

/// The bytes of the parts a timeout sends again at most, copies aside (eight parts of 64
/// KiB; more than a window of a 1,500-byte path's parts; at least one part).
const TIMEOUT_BYTES: usize = 8 * LARGEST_DATAGRAM_BYTES;

/// Doublings of the timeout after timeouts in a row, at most: enough to outgrow a queue
/// (which the window keeps short), few enough to keep trying under heavy loss.
const MAX_BACKOFF: u32 = 2;

/// Parts left unacknowledged, all sent, that make a write's tail (see `poll`).
const TAIL: usize = WINDOW / 4;

/// A part goes as at most 2^this copies at once (see `poll`).
const MAX_COPIES_LOG2: u32 = 2;

/// A datagram goes in as many copies as [`copies_for`] asks, at most this many.
pub const MAX_PATH_COPIES: u32 = 16;

/// The share of a datagram's copies' all being lost that [`copies_for`] allows.
const ALL_COPIES_LOST: f64 = 0.1;

/// The datagrams sent of a write that an acknowledgement must account for before the loss
/// it shows is taken as the path's (a few parts lost together say little).
const LOSS_SAMPLE: u64 = 16;

/// The copies of a datagram that make at least one arrive nine times in ten on a path that
/// loses `loss` of them: 1 where it loses a tenth or less, 2 at a fifth, 4 at half, 11 at
/// four fifths, at most [`MAX_PATH_COPIES`]. Each round of a write's parts waits a round
/// trip or a timeout for its acknowledgements; on a path that loses most datagrams, copies
/// sent at once save rounds. The engine sends the parts it sends again so, by the loss its
/// acknowledgements show; a switch its acknowledgements and commits' answers, by the loss
/// the collector's reports show.
pub fn copies_for(loss: f64) -> u32 {
    if loss.is_nan() || loss <= ALL_COPIES_LOST {
        return 1;
    }
    if loss >= 1.0 {
        return MAX_PATH_COPIES;
    }
    let copies = (ALL_COPIES_LOST.ln() / loss.ln()).ceil();
    (copies as u32).clamp(1, MAX_PATH_COPIES)
}

/// A tail-loss probe never comes sooner than this.
const MIN_PROBE_NS: u64 = 20_000;

/// The bytes of a datagram on a 1,500-byte path (the payload of UDP over IPv4).
const SMALL_PATH_BYTES: usize = 1_472;

/// The bytes of the largest UDP datagram over IPv4.
const LARGEST_DATAGRAM_BYTES: usize = 65_507;

/// The retransmission timeout never goes past this (before backoff), however slow the
/// round trips: a path of 100 ms round trips still has its timeout, not the first one.
pub const MAX_RTO_NS: u64 = 1_000_000_000;

/// The longest a write held whole waits for its commit before a probe, however long the
/// commits before took (`WriteEngine::commit_ps_per_value`): a commit of 851,968 values
/// takes about 3 ms (`bench-sync-migrate --table`), and an answer lost once (its commit then
/// timed until a probe brought it) must not hold back the probes of the writes after.
const MAX_COMMIT_WAIT_NS: u64 = 20_000_000;

/// The retransmission timeout never goes below this, however quick the round trips.
pub const MIN_RTO_NS: u64 = 50_000;

/// How many places before an acknowledged part a part must have been sent to be taken as
/// lost when it is not acknowledged, once the path has been seen to reorder (room for
/// reordering on the way; TCP's three). Before, none: on a path that keeps the order, a
/// part not held when a part sent after it arrived is lost.
pub const REORDERING: u64 = 3;

/// Bytes of new parts a poll encodes at most (four of 64 KiB on loopback): a write of
/// megabytes has its first parts on their way while the rest wait to be encoded.
pub const ENCODED_PER_POLL: usize = 4 * LARGEST_DATAGRAM_BYTES;

/// Values a write's cutting into parts adds before it asks whether the part still fits.
const SIZED_AT_ONCE: usize = 64;

/// The collector's side: one write in flight per switch stream, the others queued.
pub struct WriteEngine {
    switch: u32,
    epoch: u32,
    stream: u16,
    /// A part not acknowledged this long after it was sent goes again, before any round
    /// trip is measured; after, the timeout is TCP's (RFC 6298: the smoothed round trip
    /// and four times its variation, from parts sent once), between `MIN_RTO_NS` and
    /// `MAX_RTO_NS`.
    pub rto_ns: u64,
    /// The smoothed round trip and its variation, once measured.
    rtt: Option<(u64, u64)>,
    /// Timeouts since the last round trip measured, up to `MAX_BACKOFF`: each doubles the
    /// timeout (Karn's backoff, so that a timeout too short for a queue on the way does
    /// not feed it).
    backoff: u32,
    next_id: u64,
    /// The writes waiting, by id: their parts (values not cut yet), or `None` once
    /// cancelled (the switch still hears of the id, to skip it: it commits writes in
    /// order).
    queue: VecDeque<(u64, Option<WriteParts>)>,
    current: Option<InFlight>,
    /// The last transmission's sending time (see `poll`).
    last_stamp_ns: Option<u64>,
    /// The bytes of a part's datagram, its MAC included: a 1,500-byte path's to begin
    /// with, as large as the stream's own messages have shown the path to carry
    /// ([`WriteEngine::path_carries`]).
    part_bytes: usize,
    /// The share of the parts' datagrams the path to the switch lost, as the latest
    /// acknowledgement that accounts for [`LOSS_SAMPLE`] of them at least showed it (0
    /// until one did): parts sent again go in as many copies as it asks for
    /// ([`copies_for`]). It is the path's, so it stays from one write to the next.
    loss_to_switch: f64,
    /// Whether a part sent once arrived after a part sent later had: from then on a part
    /// is taken as lost only [`REORDERING`] places, and a quarter of a round trip, before
    /// one that arrived (RACK's reordering window, RFC 8985), not at once.
    reordering_seen: bool,
    /// A part's values at most, however few bytes they take ([`WriteEngine::with_values_per_part`]).
    values_per_part: usize,
    /// The key that makes each message's MAC, if the stream has one.
    key: Option<Key>,
    /// How long the switch took to commit a write, from holding it whole to its answer,
    /// in picoseconds a value (the writes' so far, smoothed; 0 before the first): a write
    /// held whole is probed for its answer only after as long again for its values, so
    /// that a large write's commit (3 ms for 851,968 values) is not taken for a lost
    /// answer, and its last part sent in copies each round trip meanwhile.
    commit_ps_per_value: u64,
    /// The room of the values of the last write that ended (emptied), for
    /// [`WriteEngine::take_spent`]: a collector lends a write the room it fills
    /// ([`WriteEngine::open_in`]) and takes it back.
    spent: Vec<u64>,
}

impl WriteEngine {
    pub fn new(switch: u32, epoch: u32, stream: u16, rto_ns: u64) -> WriteEngine {
        WriteEngine {
            switch,
            epoch,
            stream,
            rto_ns: rto_ns.max(MIN_RTO_NS),
            rtt: None,
            backoff: 0,
            next_id: 1,
            queue: VecDeque::new(),
            current: None,
            last_stamp_ns: None,
            part_bytes: SMALL_PATH_BYTES,
            loss_to_switch: 0.0,
            reordering_seen: false,
            values_per_part: MAX_RUN_ENTRIES,
            key: None,
            commit_ps_per_value: 0,
            spent: Vec::new(),
        }
    }

    /// Ends each message with a MAC made with `key` (the key the collector and its switches
    /// share).
    pub fn with_key(mut self, key: Option<Key>) -> WriteEngine {
        self.key = key;
        self
    }

    /// Cuts writes into parts of at most `values` values each (at least 1), however few
    /// bytes they take. Otherwise a write of zeros (a sketch's reset) is one part up to
    /// [`MAX_RUN_ENTRIES`] values, its zeros going as runs with no value bytes. For
    /// experiments that compare with a packetization of so many values a packet
    /// (ApproSync's: a switch's parser reads a fixed number of values); a collector never
    /// sets it.
    pub fn with_values_per_part(mut self, values: usize) -> WriteEngine {
        self.values_per_part = values.clamp(1, MAX_RUN_ENTRIES);
        self
    }

    /// Numbers the writes from `first_id` on (1 by default). A collector numbers its
    /// engines' writes from a random id, as TCP numbers its bytes: a switch that outlived
    /// a collector before it then takes the new one's writes as a new numbering, not as
    /// writes it committed already ([`WriteStage::on_part`]).
    pub fn numbered_from(mut self, first_id: u64) -> WriteEngine {
        self.next_id = first_id.max(1);
        self
    }

    /// A datagram of `bytes` came from the stream whole: the path back carries parts as
    /// large (up to the largest datagram), so writes started from now on are cut into
    /// fewer, larger parts (on loopback about 47 times fewer).
    pub fn path_carries(&mut self, bytes: usize) {
        self.part_bytes = self.part_bytes.max(bytes.min(LARGEST_DATAGRAM_BYTES));
    }

    /// What a part may hold on this stream's path now.
    fn limits(&self) -> PartLimits {
        PartLimits {
            part_bytes: self.part_bytes,
            values_per_part: self.values_per_part,
        }
    }

    /// The header of write `id`'s parts.
    fn header(&self, id: u64) -> Message {
        write_message((self.switch, self.epoch, self.stream), id, 0, 0, Vec::new())
    }

    /// The parts of write `id` of `values`, each encoded (what `poll` sends).
    #[cfg(test)]
    fn encoded_parts(&self, id: u64, values: &WriteValues) -> Vec<Resendable> {
        let mut parts = WriteParts::new(self.header(id), values.clone(), false);
        parts.cut(self.limits());
        (0..parts.len())
            .map(|i| parts.encoded(i, self.key.as_ref()).clone())
            .collect()
    }

    /// Queues a write; its id, or why it cannot go.
    pub fn submit(&mut self, values: impl Into<WriteValues>) -> Result<u64, String> {
        let values = values.into();
        let most = self.max_values();
        if values.len() > most {
            return Err(too_many(most, self.part_bytes, values.len()));
        }
        check_within_state(&values)?;
        Ok(self.queued(values, false))
    }

    /// Queues an open write of values set at `first` and the locations after it, in
    /// `columns` (a table's entries, as [`WriteValues::Stretch`]), with room made for
    /// `capacity` values: its values come with [`WriteEngine::extend`], and its parts go
    /// as they fill, before the last values are known (a migration's, sent as it reads
    /// the copy). It commits once [`WriteEngine::close`]d, never before;
    /// [`WriteEngine::cancel`] drops it.
    pub fn open(&mut self, first: Location, columns: usize, capacity: usize) -> u64 {
        self.open_in(first, columns, capacity, &mut Vec::new())
    }

    /// As [`WriteEngine::open`], the values filling `room` (taken, emptied) where it has
    /// room for `capacity` of them already, so that a large write takes no memory the
    /// kernel has not supplied yet; it comes back with [`WriteEngine::take_spent`] once
    /// the write ends.
    pub fn open_in(
        &mut self,
        first: Location,
        columns: usize,
        capacity: usize,
        room: &mut Vec<u64>,
    ) -> u64 {
        let capacity = capacity.min(self.max_values());
        let values = if room.capacity() >= capacity {
            room.clear();
            std::mem::take(room)
        } else {
            Vec::with_capacity(capacity)
        };
        let values = WriteValues::Stretch {
            first,
            mode: Mode::Set,
            values,
            columns,
        };
        self.queued(values, true)
    }

    /// The room of the values of the writes that ended since the last call, the largest
    /// (empty; none: no room at all).
    pub fn take_spent(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.spent)
    }

    /// The largest room of its writes' values, emptied: of those ended, on their way or
    /// queued. For an engine dropped with its writes (its switch started again), so
    /// that the room a collector lent one of them is not lost with it.
    pub fn into_room(self) -> Vec<u64> {
        let writes = (self.current.map(|w| w.parts))
            .into_iter()
            .chain(self.queue.into_iter().filter_map(|(_, parts)| parts));
        let mut room = self.spent;
        for parts in writes {
            if let WriteValues::Stretch { mut values, .. } = parts.values
                && values.capacity() > room.capacity()
            {
                values.clear();
                room = values;
            }
        }
        room
    }

    /// Adds `more` to open write `id`'s values; why not where it is not an open write of
    /// this engine, or would then hold more than a write may.
    pub fn extend(&mut self, id: u64, more: &[u64]) -> Result<(), String> {
        self.extend_with(id, |values| values.extend_from_slice(more))
    }

    /// Adds to open write `id` the values `fill` appends to its own (what it returns, as
    /// it returns it): a migration reads its copy straight into the write.
    pub fn extend_with<R>(
        &mut self,
        id: u64,
        fill: impl FnOnce(&mut Vec<u64>) -> R,
    ) -> Result<R, String> {
        let (most, part_bytes) = (self.max_values(), self.part_bytes);
        let parts = self.open_write(id)?;
        let WriteValues::Stretch { values, .. } = &mut parts.values else {
            return Err(format!("write {id} is not a stretch of values to extend"));
        };
        let before = values.len();
        let filled = fill(values);
        if values.len() > most {
            let len = values.len();
            values.truncate(before);
            return Err(too_many(most, part_bytes, len));
        }
        check_within_state(&parts.values)?;
        Ok(filled)
    }

    /// Closes open write `id`: it holds the values it has, and commits once they have all
    /// arrived.
    pub fn close(&mut self, id: u64) -> Result<(), String> {
        self.open_write(id)?.open = false;
        Ok(())
    }

    /// The parts of open write `id`, in flight or queued.
    fn open_write(&mut self, id: u64) -> Result<&mut WriteParts, String> {
        let current = (self.current.as_mut())
            .filter(|w| w.id == id && w.abandon.is_none())
            .map(|w| &mut w.parts);
        let parts = match current {
            Some(parts) => Some(parts),
            None => (self.queue.iter_mut())
                .find(|(queued, _)| *queued == id)
                .and_then(|(_, parts)| parts.as_mut()),
        };
        (parts.filter(|parts| parts.open))
            .ok_or_else(|| format!("write {id} is not open (closed, cancelled or unknown)"))
    }

    /// Queues write `values` (`open`: more to come), numbered next.
    fn queued(&mut self, values: WriteValues, open: bool) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let parts = WriteParts::new(self.header(id), values, open);
        self.queue.push_back((id, Some(parts)));
        id
    }

    /// The values a write may hold on this stream's path: as many as [`MAX_PARTS`] of its
    /// datagrams carry as entries (as runs they carry more), and at most
    /// [`MAX_WRITE_VALUES`]; [`MAX_VALUES`] until the path has shown larger datagrams.
    pub fn max_values(&self) -> usize {
        let per_part = (self.part_bytes - HEADER_LEN - MAC_LEN) / ENTRY_LEN;
        (MAX_PARTS * per_part.min(self.values_per_part)).min(MAX_WRITE_VALUES)
    }

    /// The share of the parts' datagrams the path to the switch loses, as the latest
    /// acknowledgement showed it.
    pub fn loss_to_switch(&self) -> f64 {
        self.loss_to_switch
    }

    /// The retransmission timeout now.
    pub fn rto(&self) -> u64 {
        let base = match self.rtt {
            None => self.rto_ns,
            Some((srtt, rttvar)) => (srtt + 4 * rttvar).clamp(MIN_RTO_NS, MAX_RTO_NS),
        };
        base.saturating_mul(1 << self.backoff)
    }

    /// The ids of the writes in flight or queued.
    pub fn pending(&self) -> Vec<u64> {
        let current = self.current.as_ref().map(|w| w.id);
        current
            .into_iter()
            .chain(self.queue.iter().map(|(id, _)| *id))
            .collect()
    }

    /// Whether nothing is in flight or queued.
    pub fn is_idle(&self) -> bool {
        self.current.is_none() && self.queue.is_empty()
    }

    /// Cancels write `id`: it sends no more parts (a queued one none at all), and the
    /// switch is asked to drop what it holds of it until it answers (a switch commits
    /// writes in order, so the next write waits for that answer). The answer completes the
    /// write, `cancelled` or, where the switch had committed it, not.
    pub fn cancel(&mut self, id: u64) -> Cancel {
        if let Some((_, values)) = self.queue.iter_mut().find(|(queued, _)| *queued == id) {
            *values = None;
            return Cancel::Asked;
        }
        match &mut self.current {
            Some(w) if w.id == id => {
                w.abandon.get_or_insert((None, 0));
                Cancel::Asked
            }
            _ => Cancel::Unknown,
        }
    }

    /// As [`WriteEngine::poll_with`] until it leaves nothing due, each message sent
    /// appended to `out` (for the tests, which look at what went).
    #[cfg(test)]
    fn poll(&mut self, now_ns: u64, out: &mut Vec<Message>) {
        let key = self.key.clone();
        let mut more = true;
        while more {
            more = self.poll_with(now_ns, |datagram, copies| {
                let m = Message::decode_with(key.as_ref(), datagram).unwrap();
                out.extend(std::iter::repeat_n(m, copies))
            });
        }
    }

    /// Starts the next write if none is in flight, and sends its parts that were never
    /// sent or not acknowledged within the timeout: each datagram goes to `send` with the
    /// copies of it to send, as the engine holds it, so that a part is neither copied nor
    /// encoded more than once to be sent. A part is encoded as it first goes, and a poll
    /// encodes [`ENCODED_PER_POLL`] bytes of parts at most: whether it left parts due to
    /// the next poll, which the caller makes once it has sent these (a large write's
    /// first parts are then on their way, and the switch taking them, while the rest are
    /// encoded).
    pub fn poll_with(&mut self, now_ns: u64, mut send: impl FnMut(&[u8], usize)) -> bool {
        if self.current.is_none()
            && let Some((id, parts)) = self.queue.pop_front()
        {
            let abandon = parts.is_none().then_some((None, 0));
            let parts = parts.unwrap_or_else(|| WriteParts::none(self.header(id)));
            self.current = Some(InFlight {
                id,
                acked: Vec::new(),
                sent_at: Vec::new(),
                left: 0,
                parts,
                started_ns: now_ns,
                transmissions: 0,
                sent_order: Vec::new(),
                latest_acked_order: 0,
                delivered_sent_ns: 0,
                last_event_ns: now_ns,
                abandon,
                tries: Vec::new(),
                copies: Vec::new(),
                timeout_sent_ns: 0,
                sends: Vec::new(),
                datagrams_taken: 0,
                timed_sent_ns: None,
                held_ns: None,
            });
        }
        let rto = self.rto();
        let probe = self
            .rtt
            .map_or(rto, |(srtt, _)| (2 * srtt).max(MIN_PROBE_NS).min(rto));
        let (reordering_places, reordering_ns) = match self.rtt {
            Some((srtt, _)) if self.reordering_seen => (REORDERING, srtt / 4),
            None if self.reordering_seen => (REORDERING, 0),
            _ => (0, 0),
        };
        let ids = (self.switch, self.epoch, self.stream);
        let part_bytes = self.part_bytes;
        let path_copies = copies_for(self.loss_to_switch);
        let key = self.key.as_ref();
        let limits = self.limits();
        let commit_ps_per_value = self.commit_ps_per_value;
        let Some(w) = &mut self.current else {
            return false;
        };
        if w.abandon.is_none() {
            w.parts.cut(limits);
            w.track_new_parts();
        }
        if let Some((sent_at, tries)) = &mut w.abandon {
            // Parts no more: the abandon (a part of no parts), until it is answered.
            if sent_at.is_none_or(|at| now_ns.saturating_sub(at) >= rto) {
                let abandon = write_message(ids, w.id, now_ns, 0, Vec::new());
                let mut datagram = Vec::new();
                abandon.encode_with(key, &mut datagram);
                send(&datagram, 1 << (*tries).min(MAX_COPIES_LOG2));
                *sent_at = Some(now_ns);
                *tries += 1;
            }
            return false;
        }
        // Lost: sent well before a part since acknowledged (as TCP's SACK reasons), or
        // before a transmission known to have arrived, which an acknowledgement names by
        // echoing when it was sent (as RACK reasons, RFC 8985).
        let seen_lost = |w: &InFlight, i: usize| {
            w.sent_at[i].is_some_and(|at| {
                w.sent_order[i] + reordering_places < w.latest_acked_order
                    || at.saturating_add(reordering_ns) < w.delivered_sent_ns
            })
        };
        // A part times out a timeout after it went, or, where a timeout held parts back,
        // after that timeout: the ones held back go a timeout later, not a poll later.
        let timed_out = |w: &InFlight, i: usize| {
            w.sent_at[i].is_some_and(|at| now_ns.saturating_sub(at.max(w.timeout_sent_ns)) >= rto)
        };
        // The last parts have no later ones to show them lost: when all went and nothing
        // has come back for two round trips, the last one not acknowledged goes again
        // alone (a tail-loss probe, as TCP's), and its acknowledgement shows the others
        // lost. Sending them all again would, on a path slower than the parts come, queue
        // copies of parts still on their way.
        // A timeout sends again the parts not acknowledged that went longest ago, up to
        // `TIMEOUT_BYTES` of them (every timed-out part of a write on a 1,500-byte path;
        // eight of 64 KiB), and their acknowledgements show which others are lost: sending
        // every part again would, where the switch is only slow to answer (committing a
        // large write, or a long pass), queue copies of a whole write behind parts it
        // holds already, and time them out again. The parts left go a timeout later.
        let per_timeout = (TIMEOUT_BYTES / part_bytes).max(1);
        let mut timed_out_parts: Vec<usize> = (0..w.parts.len())
            .filter(|&i| !w.acked[i] && timed_out(w, i))
            .collect();
        timed_out_parts.sort_by_key(|&i| w.sent_at[i]);
        let held_back = timed_out_parts.len() > per_timeout;
        timed_out_parts.truncate(per_timeout);
        let any_timed_out = !timed_out_parts.is_empty();
        let mut goes_on_timeout = vec![false; w.parts.len()];
        for &i in &timed_out_parts {
            goes_on_timeout[i] = true;
        }
        // A part that times out is the probe then. With every part held and no word of
        // the commit (its answer lost, or the switch yet to commit), the last part goes
        // again: the switch answers a part of a committed write with what it refused.
        let all_sent = w.sent_at.iter().all(Option::is_some);
        let values = w.parts.values.len() as u64;
        let committing = (w.held_ns).map_or(0, |_| {
            (values.saturating_mul(commit_ps_per_value) / 1000).min(MAX_COMMIT_WAIT_NS)
        });
        let probe_part = (!any_timed_out
            && !w.parts.open
            && all_sent
            && w.left <= TAIL
            && now_ns.saturating_sub(w.last_event_ns) >= probe + committing)
            .then(|| match (0..w.parts.len()).rev().find(|&i| !w.acked[i]) {
                None => w.parts.len().checked_sub(1),
                last => last,
            })
            .flatten();
        let due = |w: &InFlight, i: usize| {
            probe_part == Some(i)
                || !w.acked[i] && (w.sent_at[i].is_none() || seen_lost(w, i) || goes_on_timeout[i])
        };
        // Copies count: a path that loses datagrams because too many come is sent no more
        // at once for being sent copies.
        let mut outstanding: usize = (0..w.parts.len())
            .filter(|&i| !w.acked[i] && w.sent_at[i].is_some() && !due(w, i))
            .map(|i| w.copies[i] as usize)
            .sum();
        let mut encoded = 0;
        let mut more = false;
        for i in 0..w.parts.len() {
            if outstanding >= WINDOW {
                break;
            }
            if due(w, i) {
                if !w.parts.is_encoded(i) && encoded >= ENCODED_PER_POLL {
                    more = true;
                    break;
                }
                // A part sent again on a timeout or as a probe goes as copies (2, then 4
                // each time after): where a part and its acknowledgement each get through
                // one time in five, a part alone needs 25 tries on average. One seen lost
                // by later acknowledgements goes once: they come. A part sent again goes
                // in as many copies at least as the path's loss asks for; a part's first
                // transmission goes once, so that a path that loses datagrams because
                // too many come (a full queue) is never sent more than a write.
                let copies = match (w.tries[i], seen_lost(w, i)) {
                    (0, _) => 1,
                    (_, true) => path_copies,
                    (tries, false) => path_copies.max(1 << tries.min(MAX_COPIES_LOG2)),
                }
                .min((WINDOW - outstanding) as u32);
                outstanding += copies as usize;
                w.copies[i] = copies;
                // Each transmission's sending time is its own, a nanosecond after the one
                // before at least, so that the time an acknowledgement echoes names it.
                let stamp = (self.last_stamp_ns).map_or(now_ns, |last| now_ns.max(last + 1));
                self.last_stamp_ns = Some(stamp);
                let was_encoded = w.parts.is_encoded(i);
                let datagram = w.parts.encoded(i, key).stamped(stamp);
                if !was_encoded {
                    encoded += datagram.len();
                }
                send(datagram, copies as usize);
                w.sent_at[i] = Some(stamp);
                w.last_event_ns = now_ns;
                w.transmissions += copies as u64;
                w.sent_order[i] = w.transmissions;
                w.sends.push((stamp, w.transmissions));
                w.tries[i] += 1;
            }
        }
        if held_back {
            w.timeout_sent_ns = now_ns;
        }
        if any_timed_out {
            self.backoff = (self.backoff + 1).min(MAX_BACKOFF);
        }
        more
    }

    /// Takes an acknowledgement; the write it completes, if it does.
    pub fn on_ack(&mut self, now_ns: u64, ack: &Message) -> Option<Completed> {
        let ours = (ack.switch, ack.epoch, ack.stream) == (self.switch, self.epoch, self.stream);
        let w = self.current.as_mut()?;
        if ack.kind != Kind::WriteAck || !ours || ack.seq != w.id {
            return None;
        }
        if w.abandon.is_some() {
            // Only the abandon's answer says what became of the write: a bitmap sent
            // before it may show every part held of a write the switch then dropped.
            if !ack.entries.is_empty() {
                return None;
            }
            let cancelled = ack.t_max == ABANDONED;
            let refused = (ack.t_max & COMMITTED != 0).then_some(ack.t_max & !COMMITTED);
            return self.finish(now_ns, cancelled, refused);
        }
        let delivered_before = w.delivered_sent_ns;
        w.delivered_sent_ns = w.delivered_sent_ns.max(ack.sent_ns.min(now_ns));
        w.last_event_ns = now_ns;
        let mut loss_seen = None;
        let mut reordered = false;
        for e in &ack.entries {
            let word = e.location.index as usize;
            for bit in 0..64 {
                let i = word * 64 + bit;
                if e.value >> bit & 1 == 1 && i < w.acked.len() && !w.acked[i] {
                    w.acked[i] = true;
                    w.left -= 1;
                    // Held only now, sent once before a transmission known to have
                    // arrived earlier (whose acknowledgement would have shown it held
                    // had it come first): it was overtaken on the way.
                    let sent_once_before = w.sent_at[i].is_some_and(|at| at < delivered_before);
                    reordered |= w.tries[i] == 1 && sent_once_before;
                    // A part sent once says which transmission arrived, and so dates
                    // the others: what was sent well before it is lost.
                    if w.tries[i] == 1 {
                        w.latest_acked_order = w.latest_acked_order.max(w.sent_order[i]);
                    }
                }
            }
        }
        // So does the transmission that brought the acknowledgement, named by the sending
        // time it echoes, however often its part went: after a round of parts sent again
        // together, the ones of them not held are lost when a later one arrives.
        if let Ok(at) = w
            .sends
            .binary_search_by_key(&ack.sent_ns, |&(stamp, _)| stamp)
        {
            let sent = w.sends[at].1;
            w.latest_acked_order = w.latest_acked_order.max(sent);
            // The switch says how many datagrams of the write it took when that
            // transmission arrived: of those sent up to it, the rest were lost (or are
            // late). An acknowledgement that says less than one before came late itself.
            let taken = ack.entries.first().map_or(0, |e| e.threshold);
            if taken > w.datagrams_taken && sent >= LOSS_SAMPLE {
                w.datagrams_taken = taken;
                loss_seen = Some(1.0 - taken.min(sent) as f64 / sent as f64);
            }
        }
        if w.left == 0 && !w.parts.open && w.held_ns.is_none() {
            w.held_ns = Some(now_ns);
        }
        let timed = ack.sent_ns <= now_ns && ack.t_max & COMMITTED == 0;
        let fresh = w.timed_sent_ns.is_none_or(|t| ack.sent_ns > t);
        let round_trip = (timed && fresh).then(|| {
            w.timed_sent_ns = Some(ack.sent_ns);
            now_ns - ack.sent_ns
        });
        if let Some(loss) = loss_seen {
            self.loss_to_switch = loss;
        }
        self.reordering_seen |= reordered;
        // The acknowledgement carries the sending time of the part that brought it (as TCP's
        // timestamps do): a round trip, whichever transmission that was; not a commit's
        // answer, which waited for the commit, nor a copy, nor one older than the last.
        if let Some(r) = round_trip {
            self.backoff = 0;
            self.rtt = Some(match self.rtt {
                None => (r, r / 2),
                Some((srtt, rttvar)) => ((7 * srtt + r) / 8, (3 * rttvar + srtt.abs_diff(r)) / 4),
            });
        }
        // Done once the switch says the write committed (every part held is not enough:
        // what the commit refused comes with that answer; `poll` asks for it).
        if ack.t_max & COMMITTED == 0 {
            return None;
        }
        self.finish(now_ns, false, Some(ack.t_max & !COMMITTED))
    }

    /// Ends the write in flight: committed (with the entries refused, where the switch
    /// said), or dropped by the switch (`cancelled`).
    fn finish(&mut self, now_ns: u64, cancelled: bool, refused: Option<u64>) -> Option<Completed> {
        let w = self.current.take()?;
        let values = w.parts.values.len() as u64;
        if let (false, Some(held), 1..) = (cancelled, w.held_ns, values) {
            let took = now_ns.saturating_sub(held).saturating_mul(1000) / values;
            self.commit_ps_per_value = match self.commit_ps_per_value {
                0 => took,
                before => (3 * before + took) / 4,
            };
        }
        let completed = Completed {
            id: w.id,
            parts: w.parts.len() as u32,
            latency_ns: now_ns.saturating_sub(w.started_ns),
            transmissions: w.transmissions,
            cancelled,
            refused,
        };
        if let WriteValues::Stretch { mut values, .. } = w.parts.values
            && values.capacity() > self.spent.capacity()
        {
            values.clear();
            self.spent = values;
        }
        Some(completed)
    }
}

/// Why a write of `values` values cannot go on a path of `part_bytes` whose writes hold
/// `most` at most.
fn too_many(most: usize, part_bytes: usize, values: usize) -> String {
    format!(
        "a write holds at most {most} values on this path ({MAX_PARTS} messages of \
         {part_bytes} bytes); this one has {values}: split it"
    )
}

/// Why a stretch cannot go, if it passes its state's last location.
fn check_within_state(values: &WriteValues) -> Result<(), String> {
    match values {
        WriteValues::Stretch { first, values, .. }
            if u64::from(first.index) + values.len() as u64 > 1 << 32 =>
        {
            Err(format!(
                "a stretch of {} values from location {} passes the last location of a \
                 state ({})",
                values.len(),
                first.index,
                u32::MAX
            ))
        }
        _ => Ok(()),
    }
}

/// A part of a write: `range` of its values.
struct Part<'a, E: ?Sized> {
    values: &'a E,
    range: Range<usize>,
}

impl<E: Entries + ?Sized> Entries for Part<'_, E> {
    fn count(&self) -> usize {
        self.range.len()
    }
    #[inline]
    fn entry(&self, i: usize) -> Update {
        self.values.entry(self.range.start + i)
    }
    fn put_values(&self, start: usize, len: usize, width: usize, out: &mut Vec<u8>) {
        (self.values).put_values(self.range.start + start, len, width, out);
    }
    fn stretch(&self) -> Option<Stretch<'_>> {
        (self.values.stretch()).map(|s| s.part(self.range.clone()))
    }
}

/// Locations of a state a write's first part takes as they are, at most (2 MiB of
/// values, read between two bursts, so the pause stays short): a state larger than that
/// keeps changes from each part's own arrival.
pub const MAX_SNAPSHOT: usize = 1 << 18;

/// A message of write `id` on the stream `(switch, epoch, stream)`: a part (`t_max` its
/// index and the write's parts), or an abandon (`t_max` 0, no entries).
fn write_message(
    (switch, epoch, stream): (u32, u32, u16),
    id: u64,
    sent_ns: u64,
    t_max: u64,
    entries: Vec<Update>,
) -> Message {
    Message {
        kind: Kind::Write,
        switch,
        epoch,
        stream,
        seq: id,
        sent_ns,
        t_max,
        more: false,
        entries,
    }
}

/// Writes a stage holds parts of at most, counted from the next to commit: the engine
/// sends one at a time, so a part further ahead is another collector's numbering (one that
/// started again), which the stage takes up, dropping what it held
/// (`WriteStage::of_another_numbering`).
pub const MAX_STAGED: u64 = 16;

/// A write whose parts are arriving.
struct Staging {
    /// As many as the write has once a part said so (`counted`); until then, up to the
    /// furthest part held.
    parts: Vec<Option<HeldPart>>,
    counted: bool,
    received: u64,
    /// The datagrams of the write's parts taken, copies included: each acknowledgement
    /// says it (its first word's threshold), so that the engine sees what its path loses.
    datagrams: u64,
    /// The values of the parts held, at most `MAX_WRITE_VALUES`.
    values: usize,
    /// The value of each location kept-changes when the write's first part arrived (when
    /// its own part did in a state of unknown or too many locations).
    baseline: HashMap<Location, u64>,
    /// The states with locations kept-changes as they were at the first part's arrival.
    snapshots: HashMap<u16, Vec<u64>>,
    /// Once every part is held: the acknowledgement of the last to arrive, which the
    /// commit sends again saying what became of the write.
    whole: Option<Message>,
    /// The parts, from the first, that the state took ahead of the commit
    /// ([`WriteTarget::stage_run`]). Only the next write to commit stages, in the order
    /// of its parts, so that the state takes its values as the commit would.
    staged_ahead: usize,
}

impl Staging {
    /// Makes room for part `index` of a write of `count` parts (`None`: not said yet);
    /// `false` where that cannot be this write's (its count was another, or a part
    /// beyond it is held).
    fn place(&mut self, index: usize, count: Option<usize>) -> bool {
        match count {
            Some(count) if self.counted => self.parts.len() == count,
            Some(count) if self.parts.len() <= count => {
                self.parts.resize(count, None);
                self.counted = true;
                true
            }
            Some(_) => false,
            None if index < self.parts.len() => true,
            None => {
                if !self.counted {
                    self.parts.resize(index + 1, None);
                }
                !self.counted
            }
        }
    }

    /// Every part held, as many as the write has.
    fn is_whole(&self) -> bool {
        self.counted && self.received == self.parts.len() as u64
    }
}

/// A part's place in its write as `t_max` says it (its index, and the write's parts
/// where it says them: not for a part sent before its write's last values were known);
/// `None` for no part's (no parts, an index past the count or past [`MAX_PARTS`]).
fn place_of(t_max: u64) -> Option<(usize, Option<usize>)> {
    let index = (t_max >> 32) as usize;
    let count = (t_max & COUNT_NOT_KNOWN != COUNT_NOT_KNOWN).then_some(t_max as u32 as usize);
    (index < count.unwrap_or(MAX_PARTS) && count.is_none_or(|c| c <= MAX_PARTS))
        .then_some((index, count))
}

/// The count of parts of a part sent before its write's last values were known (the low
/// 32 bits of its `t_max`; a write has at most [`MAX_PARTS`]).
pub const COUNT_NOT_KNOWN: u64 = u32::MAX as u64;

/// What a commit did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Committed {
    pub id: u64,
    pub values: u64,
    /// Locations written with their changes kept whose value had changed since their part
    /// arrived (the updates the paper would have held back and replayed out of order).
    pub changes_kept: u64,
    /// What those locations held when their parts arrived: what the write replaced.
    pub replaced: u64,
    /// Entries the state refused whole ([`WriteTarget::finish`]).
    pub refused: u64,
}

/// The switch's side of one stream: the parts of the writes on their way, acknowledged as
/// they come, and the next write to commit once it is whole.
#[derive(Default)]
pub struct WriteStage {
    staged: BTreeMap<u64, Staging>,
    committed_up_to: u64,
    /// Parts refused as malformed (a write numbered 0, an index past the write's parts, a
    /// count that changed).
    pub refused: u64,
    /// Writes dropped at the collector's request before they committed.
    pub abandoned: u64,
    /// Times a part of another numbering than the writes taken before (a collector that
    /// started again) came, and the stage took it up from that write
    /// (`of_another_numbering`).
    pub renumbered: u64,
    /// The ids of the last `REMEMBERED_ABANDONS` of them, so that a repeated abandon, or
    /// a late part, of one is answered as dropped, not as committed.
    abandoned_ids: VecDeque<u64>,
    /// The last `REMEMBERED_COMMITS` writes committed and the entries each refused, so
    /// that an answer lost on its way is given again as it was.
    commits: VecDeque<(u64, u64)>,
    /// The answers of the writes committed since the last [`WriteStage::take_answers`].
    answers: Vec<Message>,
    /// Whether the last part [`WriteStage::on_part`] took was one not held before.
    last_part_new: bool,
}

/// Writes committed whose refusals a stage remembers (the engine has one in flight).
const REMEMBERED_COMMITS: usize = 64;

/// Copies of a commit's answer at least ([`WriteStage::answer_copies`]): the engine is done only on
/// it, and asks again only after two round trips (at 80% loss each way, one copy alone is
/// lost four times in five; four, two in five).
pub const ANSWER_COPIES: usize = 4;

/// Abandoned writes a stage remembers.
const REMEMBERED_ABANDONS: usize = 64;

impl WriteStage {
    /// Takes a part of a write (reading `state` for the locations whose changes are kept,
    /// and handing it what it stages ahead of the commit); the acknowledgement to send
    /// back. A part given by value is kept without copying its values.
    pub fn on_part<'a>(
        &mut self,
        part: impl Into<Cow<'a, Message>>,
        state: &mut impl WriteTarget,
    ) -> Option<Message> {
        self.on_part_carrying(part, None, state)
    }

    /// As [`WriteStage::on_part`], for a part read as a stretch of values
    /// ([`Message::decode_write_part`]: its entries are empty then).
    pub fn on_part_carrying<'a>(
        &mut self,
        part: impl Into<Cow<'a, Message>>,
        stretch: Option<StretchValues>,
        state: &mut impl WriteTarget,
    ) -> Option<Message> {
        let mut part = part.into();
        self.last_part_new = false;
        if part.kind != Kind::Write {
            return None;
        }
        // Only values set are held as a stretch; a stretch of another mode is its entries.
        let stretch = match stretch {
            Some(s) if Mode::named(s.threshold) == Some(Mode::Set) => Some(s),
            Some(s) => {
                part.to_mut().entries.extend(s.updates());
                None
            }
            None => None,
        };
        let carried = part.entries.len() + stretch.as_ref().map_or(0, |s| s.values.len());
        if part.seq == 0 {
            // No engine numbers a write 0 (`WriteEngine::numbered_from`): malformed.
            self.refused += 1;
            return None;
        }
        if part.t_max == 0 && carried == 0 {
            return self.on_abandon(&part, state);
        }
        let place = place_of(part.t_max);
        let Some((index, count)) =
            place.filter(|_| (part.entries.iter()).all(|e| Mode::named(e.threshold).is_some()))
        else {
            self.refused += 1;
            return None;
        };
        if self.of_another_numbering(part.seq) {
            // Another collector's (one that started again, numbering from a random id),
            // which takes over: what was held of the one before is gone with it.
            if self.committed_up_to > 0 || !self.staged.is_empty() {
                self.renumbered += 1;
            }
            self.drop_next(state);
            self.staged.clear();
            self.commits.clear();
            self.abandoned_ids.clear();
            self.committed_up_to = part.seq - 1;
        }
        if self.abandoned_ids.contains(&part.seq) {
            return Some(Self::abandon_answer(&part, ABANDONED));
        }
        if part.seq <= self.committed_up_to {
            // Committed already: every part is held, as far as the engine is concerned.
            let total = count.unwrap_or(index + 1);
            let all = (0..total.div_ceil(64))
                .map(|word| bitmap_word(word, total, |_| true))
                .collect();
            let mut ack = part.answer(Kind::WriteAck, total as u64, all);
            self.settle(&mut ack);
            return Some(ack);
        }
        let held: usize = self.staged.values().map(|s| s.values).sum();
        let staging = self.staged.entry(part.seq).or_insert_with(|| Staging {
            parts: Vec::new(),
            counted: false,
            received: 0,
            datagrams: 0,
            values: 0,
            baseline: HashMap::new(),
            snapshots: HashMap::new(),
            whole: None,
            staged_ahead: 0,
        });
        if !staging.place(index, count) {
            self.refused += 1;
            return None;
        }
        staging.datagrams += 1;
        if staging.parts[index].is_none() {
            // Parts as runs carry up to 65,535 values each: the write's parts together
            // may not hold more than a write may, nor the writes staged more than two.
            let values = staging.values + carried;
            if values > MAX_WRITE_VALUES || held + carried > MAX_HELD_VALUES {
                self.refused += 1;
                return None;
            }
            staging.values += carried;
            let first = staging.received == 0;
            for e in &part.entries {
                if Mode::of(e.threshold) != Mode::SetKeepingChanges {
                    continue;
                }
                // The first part to arrive takes the states it keeps changes in whole:
                // the changes a counter takes between the first part and its own are
                // kept too (as the paper's held-back updates are, without holding any).
                let at = e.location;
                if first && !staging.snapshots.contains_key(&at.state) {
                    let extent = state.extent(at.state);
                    if extent > 0 && extent as usize <= MAX_SNAPSHOT {
                        let snapshot = (0..extent)
                            .map(|index| state.read(Location { index, ..at }))
                            .collect();
                        staging.snapshots.insert(at.state, snapshot);
                    }
                }
                let then = (staging.snapshots.get(&at.state))
                    .and_then(|s| s.get(at.index as usize).copied());
                staging
                    .baseline
                    .entry(at)
                    .or_insert_with(|| then.unwrap_or_else(|| state.read(at)));
            }
            staging.parts[index] = Some(match stretch {
                Some(s) => HeldPart::Stretch {
                    first: s.first,
                    values: s.values,
                },
                None => HeldPart::of(std::mem::take(&mut part.to_mut().entries)),
            });
            staging.received += 1;
            self.last_part_new = true;
        }
        let total = staging.parts.len();
        let held = |i: usize| staging.parts[i].is_some();
        let mut bits: Vec<Update> = (0..total.div_ceil(64))
            .map(|word| bitmap_word(word, total, held))
            .collect();
        bits[0].threshold = staging.datagrams;
        let ack = part.answer(Kind::WriteAck, staging.received, bits);
        if staging.is_whole() && staging.whole.is_none() {
            staging.whole = Some(ack.clone());
        }
        self.stage_ahead(state);
        Some(ack)
    }

    /// Hands `state` the parts of the next write to commit that it may take ahead of the
    /// commit: those held in order from the first on, each a stretch set (as the commit
    /// would write them, first to last), while the state takes them.
    fn stage_ahead(&mut self, state: &mut impl WriteTarget) {
        let Some(staging) = self.staged.get_mut(&(self.committed_up_to + 1)) else {
            return;
        };
        while let Some(Some(HeldPart::Stretch { first, values })) =
            staging.parts.get(staging.staged_ahead)
        {
            if !state.stage_run(*first, values) {
                return;
            }
            let values = values.len();
            staging.parts[staging.staged_ahead] = Some(HeldPart::Staged { values });
            staging.staged_ahead += 1;
        }
    }

    /// Tells `state` to drop what it took ahead of the next write to commit, which will
    /// not (abandoned, or another collector's numbering takes over).
    fn drop_next(&mut self, state: &mut impl WriteTarget) {
        if (self.staged.get(&(self.committed_up_to + 1))).is_some_and(|s| s.staged_ahead > 0) {
            state.drop_staged();
        }
    }

    /// The collector cancelled write `part.seq`: dropped if it is the next to commit and
    /// not whole; answered with [`ABANDONED`], or [`COMMITTED_ALREADY`] where it committed
    /// or is whole (and commits at once: the collector may have seen it whole).
    fn on_abandon(&mut self, part: &Message, state: &mut impl WriteTarget) -> Option<Message> {
        let next = self.committed_up_to + 1;
        let whole = Staging::is_whole;
        let answer = if self.of_another_numbering(part.seq) {
            // A write of another collector's numbering that never arrived: nothing of it
            // is held, so nothing of it commits.
            ABANDONED
        } else if self.abandoned_ids.contains(&part.seq) {
            ABANDONED
        } else if let Some(refused) = self.refused_by(part.seq) {
            COMMITTED | refused.min(!COMMITTED)
        } else if part.seq < next || self.staged.get(&part.seq).is_some_and(whole) {
            COMMITTED_ALREADY
        } else if part.seq == next {
            self.drop_next(state);
            self.staged.remove(&next);
            self.committed_up_to = next;
            self.abandoned += 1;
            if self.abandoned_ids.len() == REMEMBERED_ABANDONS {
                self.abandoned_ids.pop_front();
            }
            self.abandoned_ids.push_back(next);
            self.stage_ahead(state);
            ABANDONED
        } else {
            self.refused += 1;
            return None;
        };
        Some(Self::abandon_answer(part, answer))
    }

    fn abandon_answer(part: &Message, answer: u64) -> Message {
        part.answer(Kind::WriteAck, answer, Vec::new())
    }

    /// Whether write `id` is outside the numbering of the writes this stage took: more
    /// than [`MAX_STAGED`] past the last commit, or further behind it than the commits and
    /// abandons it remembers. The engine sends one write at a time, after the ones
    /// committed or dropped, so its parts and late copies of them never are: such an id is
    /// another collector's (one that started again, numbering from a random id, above the
    /// last one's or below).
    fn of_another_numbering(&self, id: u64) -> bool {
        let remembered = REMEMBERED_COMMITS.max(REMEMBERED_ABANDONS) as u64;
        id > self.committed_up_to.saturating_add(MAX_STAGED)
            || id.saturating_add(remembered) < self.committed_up_to
    }

    /// The entries committed write `id` refused, if it is one of the last remembered.
    fn refused_by(&self, id: u64) -> Option<u64> {
        (self.commits.iter().rev())
            .find(|&&(committed, _)| committed == id)
            .map(|&(_, refused)| refused)
    }

    /// Marks `ack`, an acknowledgement of parts held, [`COMMITTED`] with the entries its
    /// write refused if that write has committed.
    fn settle(&self, ack: &mut Message) {
        if ack.kind == Kind::WriteAck
            && !ack.entries.is_empty()
            && let Some(refused) = self.refused_by(ack.seq)
        {
            ack.t_max = COMMITTED | refused.min(!COMMITTED);
        }
    }

    /// Appends the answers of the writes committed since the last call, once each (send
    /// each in [`WriteStage::answer_copies`] copies): an acknowledgement of the write's
    /// last part, [`COMMITTED`] with the entries the state refused. (Each part is
    /// acknowledged as it arrives, so that the round trips the engine measures are the
    /// path's, not a commit's.)
    pub fn take_answers(&mut self, out: &mut Vec<Message>) {
        out.append(&mut self.answers);
    }

    /// The copies to send of each answer [`WriteStage::take_answers`] gives, on a path to
    /// the collector that loses `loss_to_collector` of the datagrams (as the collector's
    /// reports show): [`ANSWER_COPIES`], or as many more as that loss asks for
    /// ([`copies_for`]).
    pub fn answer_copies(loss_to_collector: f64) -> usize {
        ANSWER_COPIES.max(copies_for(loss_to_collector) as usize)
    }

    /// The copies to send of the acknowledgement the last [`WriteStage::on_part`] gave, on
    /// a path to the collector that loses `loss_to_collector` of the datagrams (as the
    /// collector's reports show): as many as that asks for where it took a part it did not
    /// hold, the engine learning what arrived from any one of them; one for a copy of a
    /// part held (its acknowledgement says nothing new, and a part sent in copies brings
    /// as many acknowledgements as arrive).
    pub fn ack_copies(&self, loss_to_collector: f64) -> usize {
        if self.last_part_new {
            copies_for(loss_to_collector) as usize
        } else {
            1
        }
    }

    /// Whether `part` (its header: the entries are not looked at) is a part of a write
    /// this stage holds already, or committed, so that taking it again needs none of its
    /// entries ([`Message::decode_unless_held`]): it is acknowledged as held.
    pub fn holds_part(&self, part: &Message) -> bool {
        // A header no part has (an index past the parts; no parts, which with entries is
        // no abandon either) is read whole, and refused.
        let Some((index, count)) = place_of(part.t_max) else {
            return false;
        };
        if part.kind != Kind::Write
            || part.seq == 0
            || self.of_another_numbering(part.seq)
            || self.abandoned_ids.contains(&part.seq)
        {
            return false;
        }
        // A part that says how many parts the write has, to a stage yet to learn it, is
        // read whole: the stage learns it there.
        let staged = (self.staged.get(&part.seq)).is_some_and(|s| {
            let count_known = count.is_none_or(|c| s.counted && s.parts.len() == c);
            count_known && s.parts.get(index).is_some_and(Option::is_some)
        });
        staged || part.seq <= self.committed_up_to
    }

    /// Whether parts of a write not committed yet are held (more are on their way).
    pub fn holds_parts(&self) -> bool {
        !self.staged.is_empty()
    }

    /// Commits the next write into `state` if all of it has arrived (to be called between
    /// bursts).
    pub fn commit(&mut self, state: &mut impl WriteTarget) -> Option<Committed> {
        let next = self.committed_up_to + 1;
        let whole = (self.staged.get(&next)).is_some_and(Staging::is_whole);
        if !whole {
            return None;
        }
        let staging = self.staged.remove(&next)?;
        let mut done = Committed {
            id: next,
            ..Committed::default()
        };
        // Values set in a run of locations go to the state together; a value that reads
        // its location first finds the run before it written.
        let mut run = Run::default();
        for part in staging.parts.iter().flatten() {
            let part = match part {
                HeldPart::Stretch { first, values } => {
                    run.flush(state);
                    state.write_run(*first, values);
                    done.values += values.len() as u64;
                    continue;
                }
                // In the state already, ahead of the parts after it.
                HeldPart::Staged { values } => {
                    done.values += *values as u64;
                    continue;
                }
                HeldPart::Entries(entries) => entries,
            };
            let mut rest = &part[..];
            while let Some(e) = rest.first() {
                let set = set_stretch(rest);
                if set > 0 {
                    run.extend(&rest[..set], state);
                    done.values += set as u64;
                    rest = &rest[set..];
                    continue;
                }
                rest = &rest[1..];
                run.flush(state);
                let value = match (Mode::of(e.threshold), staging.baseline.get(&e.location)) {
                    (Mode::SetKeepingChanges, Some(&then)) => {
                        let now = state.read(e.location);
                        if now != then {
                            done.changes_kept += 1;
                        }
                        done.replaced = done.replaced.wrapping_add(then);
                        e.value.wrapping_add(now.wrapping_sub(then))
                    }
                    (Mode::Subtract, _) => state.read(e.location).saturating_sub(e.value),
                    _ => e.value,
                };
                state.write(e.location, value);
                done.values += 1;
            }
        }
        run.flush(state);
        done.refused = state.finish();
        self.committed_up_to = next;
        if self.commits.len() == REMEMBERED_COMMITS {
            self.commits.pop_front();
        }
        self.commits.push_back((next, done.refused));
        if let Some(mut answer) = staging.whole {
            self.settle(&mut answer);
            self.answers.push(answer);
        }
        self.stage_ahead(state);
        Some(done)
    }
}

/// A part held until its write commits.
#[derive(Clone)]
enum HeldPart {
    /// Values set at `first` and the locations after it in its state (a large write's
    /// parts, a register's or a table's): the values alone, taken as the part arrives so
    /// that the commit, which the worker waits for, writes them on in one go.
    Stretch { first: Location, values: Vec<u64> },
    /// A stretch the state took ahead of the commit ([`WriteTarget::stage_run`]): its
    /// values, counted.
    Staged { values: usize },
    /// Any other part's entries, as they came.
    Entries(Vec<Update>),
}

impl HeldPart {
    fn of(entries: Vec<Update>) -> HeldPart {
        match entries.first() {
            Some(e) if set_stretch(&entries) == entries.len() => HeldPart::Stretch {
                first: e.location,
                values: entries.iter().map(|e| e.value).collect(),
            },
            _ => HeldPart::Entries(entries),
        }
    }
}

/// Values to write at consecutive locations of a state, from `first`: written on when
/// they are `RUN_VALUES`, so that a large write's values pass through a buffer that stays
/// in cache rather than one as large as the write.
#[derive(Default)]
struct Run {
    first: Option<Location>,
    values: Vec<u64>,
}

/// The values a [`Run`] holds at most (32 KiB).
const RUN_VALUES: usize = 4096;

/// How many of `entries`, from the first, are values set at locations one after another
/// of one state (0 where the first is not set).
fn set_stretch(entries: &[Update]) -> usize {
    let Some(first) = entries.first() else {
        return 0;
    };
    let follows = |(i, e): (usize, &Update)| {
        Mode::of(e.threshold) == Mode::Set
            && e.location.state == first.location.state
            && u64::from(e.location.index) == u64::from(first.location.index) + i as u64
    };
    entries
        .iter()
        .enumerate()
        .take_while(|&x| follows(x))
        .count()
}

impl Run {
    /// Adds `stretch` (values set at locations one after another, [`set_stretch`]), after
    /// writing what the run holds if the stretch does not follow it.
    fn extend(&mut self, mut stretch: &[Update], state: &mut impl WriteTarget) {
        while let Some(at) = stretch.first().map(|e| e.location) {
            let follows = self.first.is_some_and(|f| {
                f.state == at.state
                    && u64::from(f.index) + self.values.len() as u64 == u64::from(at.index)
            });
            if !follows || self.values.len() == RUN_VALUES {
                self.flush(state);
                self.first = Some(at);
            }
            let room = RUN_VALUES - self.values.len();
            let (now, after) = stretch.split_at(room.min(stretch.len()));
            self.values.extend(now.iter().map(|e| e.value));
            stretch = after;
        }
    }

    fn flush(&mut self, state: &mut impl WriteTarget) {
        if let Some(first) = self.first.take() {
            state.write_run(first, &self.values);
        }
        self.values.clear();
    }
}

/// Word `word` of a bitmap of `total` bits, bit `i` set where `held(i)`.
fn bitmap_word(word: usize, total: usize, held: impl Fn(usize) -> bool) -> Update {
    let mut bits = 0u64;
    for bit in 0..64 {
        let i = word * 64 + bit;
        if i < total && held(i) {
            bits |= 1 << bit;
        }
    }
    Update {
        location: Location {
            state: 0,
            index: word as u32,
        },
        value: bits,
        threshold: 0,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::wire::{ENTRY_LEN, HEADER_LEN, MAX_DATAGRAM_ENTRIES, RUN_HEADER_LEN};

    const WIDE: u64 = 1 << 40;

    fn at(state: u16, index: u32) -> Location {
        Location { state, index }
    }

    /// State in a map, every location 0 until written.
    #[derive(Default)]
    struct Map(HashMap<Location, u64>);

    impl WriteTarget for Map {
        fn read(&self, l: Location) -> u64 {
            self.0.get(&l).copied().unwrap_or(0)
        }
        fn write(&mut self, l: Location, v: u64) {
            self.0.insert(l, v);
        }
    }

    /// Values of 8 bytes at every other location, so that they go as entries of 24 bytes
    /// (58 to a part on a 1,500-byte path): a run of one would take 28.
    fn values(n: u32, mode: Mode) -> Vec<Written> {
        (0..n)
            .map(|i| Written {
                location: at(1, 2 * i),
                value: WIDE + u64::from(i),
                mode,
            })
            .collect()
    }

    /// Submits a write of one value through `engine`, has `stage` take and commit it, and
    /// gives the engine the commit's answer, which completes the write.
    fn commit_one(engine: &mut WriteEngine, stage: &mut WriteStage, state: &mut Map) {
        engine.submit(values(1, Mode::Set)).unwrap();
        let mut out = Vec::new();
        engine.poll(0, &mut out);
        stage.on_part(&out[0], state).unwrap();
        stage.commit(state).unwrap();
        engine.on_ack(10, &answer_of(stage)).unwrap();
    }

    /// A fresh engine with a write of `n` scattered values submitted and sent once, at 0:
    /// the engine and the parts sent.
    fn sent_values(n: u32) -> (WriteEngine, Vec<Message>) {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000);
        engine.submit(values(n, Mode::Set)).unwrap();
        let mut out = Vec::new();
        engine.poll(0, &mut out);
        (engine, out)
    }

    /// As [`sent_values`], `parts` full parts (of `MAX_ENTRIES` values each).
    fn sent_in_parts(parts: u32) -> (WriteEngine, Vec<Message>) {
        sent_values(parts * MAX_ENTRIES as u32)
    }

    /// A collector that starts again numbers its writes afresh, from a random id: the
    /// switch, which committed writes 1 to 3 of the collector before, commits the new one's
    /// first write (a numbering of 1 again would be answered "committed" and dropped), and
    /// forgets what it held of the old one.
    #[test]
    fn a_restarted_collectors_writes_commit_and_the_old_ones_left_go() {
        let mut stage = WriteStage::default();
        let mut state = Map::default();
        let mut old = WriteEngine::new(1, 1, 0, 1_000_000);
        for _ in 0..3 {
            commit_one(&mut old, &mut stage, &mut state);
        }
        // The old collector's fourth write, half sent when it went away.
        old.submit(values(100, Mode::Set)).unwrap();
        let mut out = Vec::new();
        old.poll(0, &mut out);
        stage.on_part(&out[0], &mut state).unwrap();
        assert!(stage.holds_parts());

        let mut new = WriteEngine::new(1, 1, 0, 1_000_000).numbered_from(1 << 40);
        let id = new.submit(vec![Written {
            location: at(1, 8),
            value: 77,
            mode: Mode::Set,
        }]);
        assert_eq!(id, Ok(1 << 40));
        let mut out = Vec::new();
        new.poll(0, &mut out);
        let ack = stage.on_part(&out[0], &mut state).unwrap();
        assert_eq!(ack.t_max, 1, "held, not taken as committed");
        let done = stage.commit(&mut state).unwrap();
        assert_eq!((done.id, state.read(at(1, 8))), (1 << 40, 77));
        assert!(!stage.holds_parts(), "the old collector's write is gone");
        assert_eq!(
            new.on_ack(20, &answer_of(&mut stage)).map(|d| d.id),
            Some(1 << 40)
        );
        assert_eq!(stage.renumbered, 1);

        // A collector after it numbering below it (random ids fall either side): not
        // answered "committed already", whether its write comes or only its cancel.
        let mut third = WriteEngine::new(1, 1, 0, 1_000_000).numbered_from(5);
        third.submit(values(1, Mode::Set)).unwrap();
        let mut out = Vec::new();
        third.poll(0, &mut out);
        let abandon = Message {
            t_max: 0,
            entries: Vec::new(),
            ..out[0].clone()
        };
        assert_eq!(
            stage.on_part(&abandon, &mut state).unwrap().t_max,
            ABANDONED
        );
        assert_eq!(stage.on_part(&out[0], &mut state).unwrap().t_max, 1, "held");
        assert_eq!(stage.commit(&mut state).map(|c| c.id), Some(5));
        assert_eq!(stage.renumbered, 2);
        // Its own write, committed, sent again: answered as committed.
        assert_eq!(stage.on_part(&out[0], &mut state).unwrap().t_max, COMMITTED);
    }

    /// The answer of the write `stage` committed last.
    pub(crate) fn answer_of(stage: &mut WriteStage) -> Message {
        let mut answers = Vec::new();
        stage.take_answers(&mut answers);
        assert_eq!(answers.len(), 1, "one write's answer");
        answers.remove(0)
    }

    /// State that refuses a write's values past the first `room` (a table that fills).
    struct Full {
        map: Map,
        room: usize,
    }

    impl WriteTarget for Full {
        fn read(&self, l: Location) -> u64 {
            self.map.read(l)
        }
        fn write(&mut self, l: Location, v: u64) {
            self.map.write(l, v);
        }
        fn finish(&mut self) -> u64 {
            self.map.0.len().saturating_sub(self.room) as u64
        }
    }

    /// A write is done when the switch says it committed, with what it refused: every
    /// part held is not enough. An acknowledgement of every part that does not say so
    /// (lost, or sent before the commit) leaves the engine asking with the last part, and
    /// the switch answers that again as often as asked.
    #[test]
    fn a_write_is_done_when_committed_and_says_what_the_switch_refused() {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000);
        let mut stage = WriteStage::default();
        let mut state = Full {
            map: Map::default(),
            room: 100,
        };
        let id = engine.submit(values(150, Mode::Set)).unwrap();
        let mut out = Vec::new();
        engine.poll(0, &mut out);
        assert_eq!(out.len(), 3);
        let acks: Vec<Message> = (out.iter())
            .map(|part| stage.on_part(part, &mut state).unwrap())
            .collect();
        for ack in &acks {
            assert_eq!(engine.on_ack(10_000, ack), None, "held, not committed yet");
        }
        let mut probe = Vec::new();
        engine.poll(29_999, &mut probe);
        assert!(probe.is_empty(), "within the probe's two round trips");
        engine.poll(30_000, &mut probe);
        assert_eq!(probe.len(), 2, "as two copies, as a probe goes");
        assert!(
            probe.iter().all(|m| m.t_max >> 32 == 2),
            "the last part asks"
        );
        let committed = stage.commit(&mut state).unwrap();
        assert_eq!((committed.values, committed.refused), (150, 50));
        let answer = stage.on_part(&probe[0], &mut state).unwrap();
        assert_eq!(answer.t_max, COMMITTED | 50);
        assert_eq!(
            stage.on_part(&out[0], &mut state).unwrap().t_max,
            COMMITTED | 50,
            "as often as asked"
        );
        let done = engine.on_ack(40_000, &answer).unwrap();
        assert_eq!(
            (done.id, done.refused, done.cancelled),
            (id, Some(50), false)
        );
        assert!(engine.is_idle());
    }

    /// Once the stream's messages show the path carrying larger datagrams, writes go in
    /// parts as large (never past the largest datagram's), and still commit whole.
    #[test]
    fn parts_grow_to_what_the_path_has_carried() {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000);
        let carrying = |entries: usize| HEADER_LEN + entries * ENTRY_LEN + MAC_LEN;
        engine.path_carries(carrying(10));
        engine.path_carries(carrying(1_000));
        engine.path_carries(carrying(500));
        engine.submit(values(2_500, Mode::Set)).unwrap();
        let mut out = Vec::new();
        engine.poll(0, &mut out);
        let sizes: Vec<usize> = out.iter().map(|m| m.entries.len()).collect();
        assert_eq!(sizes, [1_000, 1_000, 500]);
        let mut stage = WriteStage::default();
        let mut state = Map::default();
        for part in &out {
            stage.on_part(part, &mut state).unwrap();
        }
        assert_eq!(stage.commit(&mut state).map(|c| c.values), Some(2_500));
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000);
        engine.path_carries(usize::MAX);
        engine.submit(values(2_727, Mode::Set)).unwrap();
        let mut out = Vec::new();
        engine.poll(1, &mut out);
        let sizes: Vec<usize> = out.iter().map(|m| m.entries.len()).collect();
        assert_eq!(
            sizes,
            [MAX_DATAGRAM_ENTRIES, 1],
            "the largest datagram at most"
        );
    }

    /// A stretch may end at a state's last location and not one past it.
    #[test]
    fn a_stretch_past_the_last_location_is_refused() {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000);
        let stretch = |index, n| WriteValues::Stretch {
            first: Location { state: 0, index },
            mode: Mode::Set,
            values: vec![1; n],
            columns: 1,
        };
        assert!(engine.submit(stretch(u32::MAX, 1)).is_ok());
        assert!(engine.submit(stretch(u32::MAX - 9, 10)).is_ok());
        let e = engine.submit(stretch(u32::MAX - 9, 11)).unwrap_err();
        assert!(e.contains("passes the last location"), "{e}");
        assert_eq!(engine.pending().len(), 2);
    }

    /// A write of megabytes is encoded as its parts first go, a few at a time: a poll
    /// encodes `ENCODED_PER_POLL` bytes of new parts and says parts are left, the next
    /// goes on from there, and the parts go once each, in order.
    #[test]
    fn a_large_writes_parts_are_encoded_a_few_a_poll_in_order() {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000);
        engine.path_carries(65_507);
        let values = (0..200_000u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        let first = at(2, 0);
        let mode = Mode::Set;
        let columns = 1;
        engine
            .submit(WriteValues::Stretch {
                first,
                mode,
                values,
                columns,
            })
            .unwrap();
        let mut polls = Vec::new();
        loop {
            let mut sent: Vec<(u64, usize)> = Vec::new();
            let more = engine.poll_with(0, |datagram, _| {
                let part = Message::decode(datagram).unwrap();
                sent.push((part.t_max >> 32, datagram.len()));
            });
            polls.push(sent);
            if !more {
                break;
            }
        }
        assert!(polls.len() > 1, "{} polls", polls.len());
        let parts: Vec<u64> = polls.iter().flatten().map(|&(i, _)| i).collect();
        assert_eq!(
            parts,
            (0..parts.len() as u64).collect::<Vec<_>>(),
            "each once, in order"
        );
        assert_eq!(
            parts.len(),
            200_000usize.div_ceil(8_176),
            "8-byte values, 8,176 a part"
        );
        for sent in &polls[..polls.len() - 1] {
            let bytes: usize = sent.iter().map(|&(_, len)| len).sum();
            let before_last = bytes - sent.last().map_or(0, |&(_, len)| len);
            assert!(
                before_last < ENCODED_PER_POLL && bytes >= ENCODED_PER_POLL,
                "{sent:?}"
            );
        }
        let mut again = Vec::new();
        assert!(!engine.poll_with(1, |d, _| again.push(d.len())));
        assert!(again.is_empty(), "nothing due before its timeout");
    }

    /// A register's values in order go as runs: a part carries as many as fit its
    /// datagram at their width, and the write still commits whole and exact.
    #[test]
    fn a_register_in_order_goes_in_parts_of_as_many_values_as_runs_fit() {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000);
        let register: Vec<Written> = (0..65_536u32)
            .map(|i| Written {
                location: at(2, i),
                value: u64::from(i.wrapping_mul(2_654_435_761)),
                mode: Mode::Set,
            })
            .collect();
        engine.submit(register.clone()).unwrap();
        let mut out = Vec::new();
        engine.poll(0, &mut out);
        let per_part = (1_472 - HEADER_LEN - RUN_HEADER_LEN - MAC_LEN) / 4;
        assert_eq!(
            out[0].entries.len(),
            per_part,
            "4-byte values on a 1,500-byte path"
        );
        assert_eq!(out.len(), WINDOW, "the rest wait for the window");
        let mut bytes = Vec::new();
        out[0].encode_with(Some(&crate::wire::Key::new([1; 32])), &mut bytes);
        assert!(
            bytes.len() <= 1_472 && bytes.len() > 1_472 - 4,
            "{}",
            bytes.len()
        );

        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000);
        engine.path_carries(usize::MAX);
        engine.submit(register.clone()).unwrap();
        out.clear();
        engine.poll(0, &mut out);
        assert_eq!(
            out.len(),
            65_536usize.div_ceil(16_362),
            "four of 16,362 and the rest"
        );
        let (mut stage, mut state) = (WriteStage::default(), Map::default());
        for part in &out {
            bytes.clear();
            part.encode(&mut bytes);
            assert!(bytes.len() + MAC_LEN <= 65_507);
            stage
                .on_part(Message::decode(&bytes).unwrap(), &mut state)
                .unwrap();
        }
        assert_eq!(stage.commit(&mut state).map(|c| c.values), Some(65_536));
        assert!(register.iter().all(|w| state.read(w.location) == w.value));
    }

    /// A reset (a write of zeros) is one part of a few bytes, its zeros a run with no
    /// value bytes, and commits exact; cut by values a part, it goes in as many parts.
    #[test]
    fn a_reset_is_one_part_unless_cut_by_values_a_part() {
        let reset: Vec<Written> = (0..16_384u32)
            .map(|i| Written {
                location: at(0, i),
                value: 0,
                mode: Mode::Set,
            })
            .collect();
        let mut out = Vec::new();
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000);
        engine.submit(reset.clone()).unwrap();
        engine.poll(0, &mut out);
        assert_eq!(out.len(), 1);
        let mut bytes = Vec::new();
        out[0].encode(&mut bytes);
        assert_eq!(bytes.len(), HEADER_LEN + RUN_HEADER_LEN);
        let mut state = Map::default();
        (0..16_384).for_each(|i| state.write(at(0, i), u64::from(i) + 1));
        let mut stage = WriteStage::default();
        stage.on_part(Message::decode(&bytes).unwrap(), &mut state);
        assert_eq!(stage.commit(&mut state).map(|c| c.values), Some(16_384));
        assert!((0..16_384).all(|i| state.read(at(0, i)) == 0));

        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000).with_values_per_part(1_408);
        engine.submit(reset).unwrap();
        out.clear();
        engine.poll(0, &mut out);
        assert_eq!(out.len(), 16_384usize.div_ceil(1_408));
        assert!(out[..11].iter().all(|p| p.entries.len() == 1_408));
        assert_eq!(out[11].entries.len(), 16_384 - 11 * 1_408);
        // What a write may hold counts parts of so many values.
        let few = WriteEngine::new(1, 1, 0, 1_000_000).with_values_per_part(10);
        assert_eq!(few.max_values(), MAX_PARTS * 10);
    }

    /// A write's parts together hold no more values than a write may, and the writes a
    /// stage holds no more than two: parts as runs, 65,535 values each, cannot make a
    /// switch stage gigabytes.
    #[test]
    fn a_stage_holds_no_more_values_of_a_write_than_a_write_may_have() {
        let mut stage = WriteStage::default();
        let mut state = Map::default();
        let part = |seq: u64, index: u64| Message {
            kind: Kind::Write,
            switch: 1,
            epoch: 1,
            stream: 0,
            seq,
            sent_ns: 0,
            t_max: (index << 32) | MAX_PARTS as u64,
            more: false,
            entries: (0..MAX_RUN_ENTRIES as u32)
                .map(|i| Update {
                    location: at(0, i),
                    value: 0,
                    threshold: 0,
                })
                .collect(),
        };
        let fit = MAX_WRITE_VALUES / MAX_RUN_ENTRIES;
        for i in 0..fit as u64 {
            assert!(stage.on_part(part(1, i), &mut state).is_some(), "part {i}");
        }
        assert_eq!(stage.on_part(part(1, fit as u64), &mut state), None);
        assert_eq!(stage.refused, 1);
        // Writes 2 and 3 come while 1 waits for its last parts: 2 fits as 1 did, and
        // 3 finds the stage holding two writes' worth.
        for i in 0..fit as u64 {
            assert!(stage.on_part(part(2, i), &mut state).is_some(), "part {i}");
        }
        assert_eq!(stage.on_part(part(3, 0), &mut state), None);
        assert_eq!(stage.refused, 2);
        assert!(stage.holds_parts());
    }

    /// A write of several parts commits only whole, once, however often its parts and
    /// acknowledgements come; the engine sends again only what was not acknowledged.
    #[test]
    fn a_write_commits_whole_once_and_only_unacknowledged_parts_go_again() {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000);
        let mut stage = WriteStage::default();
        let id = engine.submit(values(150, Mode::Set)).unwrap();
        let mut out = Vec::new();
        engine.poll(0, &mut out);
        assert_eq!(out.len(), 3, "150 values: parts of {MAX_ENTRIES}");
        let mut state = Map::default();
        // Parts 0 and 2 arrive; 1 is lost.
        let ack0 = stage.on_part(&out[0], &mut state).unwrap();
        let ack2 = stage.on_part(&out[2], &mut state).unwrap();
        assert_eq!(ack2.t_max, 2);
        assert_eq!(stage.commit(&mut state), None);
        assert!(state.0.is_empty(), "nothing of a write half arrived");
        assert_eq!(engine.on_ack(10_000, &ack2), None);
        assert_eq!(
            engine.on_ack(10_000, &ack0),
            None,
            "an older acknowledgement too"
        );
        // Part 1, sent before part 2, which arrived, is lost (the path keeps the order):
        // it goes again at once, once.
        let mut again = Vec::new();
        engine.poll(10_000, &mut again);
        assert_eq!(again.len(), 1, "the part not acknowledged");
        assert!(again.iter().all(|m| m.t_max >> 32 == 1), "{again:?}");
        stage.on_part(&again[0], &mut state).unwrap();
        stage.on_part(&out[0], &mut state).unwrap();
        let done = stage.commit(&mut state).unwrap();
        assert_eq!((done.id, done.values), (id, 150));
        assert_eq!(state.0.len(), 150);
        assert_eq!(state.read(at(1, 2 * 149)), WIDE + 149);
        assert_eq!(stage.commit(&mut state), None, "committed once");
        let ack = answer_of(&mut stage);
        assert_eq!(ack.t_max, COMMITTED, "committed, nothing refused");
        // A late duplicate of a committed write is acknowledged whole, not applied.
        let late = stage.on_part(&out[1], &mut state).unwrap();
        assert_eq!(late.t_max, COMMITTED);
        let done = engine.on_ack(60_000, &ack).unwrap();
        assert_eq!(
            (done.id, done.parts, done.transmissions),
            (id, 3, 4),
            "three parts, one again"
        );
        assert_eq!(done.latency_ns, 60_000);
        assert!(engine.is_idle());
    }

    /// Kept changes: a counter reset while its part was on the way keeps what was counted
    /// since the part arrived.
    #[test]
    fn a_reset_keeps_the_counts_made_since_its_part_arrived() {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000);
        let mut stage = WriteStage::default();
        engine
            .submit(vec![Written {
                location: at(0, 7),
                value: 0,
                mode: Mode::SetKeepingChanges,
            }])
            .unwrap();
        let mut out = Vec::new();
        engine.poll(0, &mut out);
        let mut state = Map::default();
        state.write(at(0, 7), 500);
        stage.on_part(&out[0], &mut state).unwrap();
        state.write(at(0, 7), 512);
        let done = stage.commit(&mut state).unwrap();
        assert_eq!(state.read(at(0, 7)), 12);
        assert_eq!((done.changes_kept, done.replaced), (1, 500));
    }

    /// A subtraction takes the value away as the write commits: every count made after
    /// the value read (before the part left, while it was on the way) stays; a counter
    /// below the value ends at 0.
    #[test]
    fn a_subtraction_leaves_what_was_counted_after_the_value_read() {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000);
        let mut stage = WriteStage::default();
        let mut state = Map::default();
        state.write(at(0, 7), 500);
        state.write(at(0, 8), 3);
        // The application read 490 (the copy a little behind) and 5.
        let subtract = |index, value| Written {
            location: at(0, index),
            value,
            mode: Mode::Subtract,
        };
        (engine.submit(vec![subtract(7, 490), subtract(8, 5)])).unwrap();
        let mut out = Vec::new();
        engine.poll(0, &mut out);
        state.write(at(0, 7), 506);
        stage.on_part(&out[0], &mut state).unwrap();
        state.write(at(0, 7), 512);
        stage.commit(&mut state).unwrap();
        assert_eq!(state.read(at(0, 7)), 22, "512 counted, 490 of them read");
        assert_eq!(state.read(at(0, 8)), 0);
    }

    /// A part naming a mode this switch does not know is refused (counted, not
    /// acknowledged), never applied as a plain set.
    #[test]
    fn a_part_of_an_unknown_mode_is_refused() {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000);
        let mut stage = WriteStage::default();
        let mut state = Map::default();
        state.write(at(1, 0), 500);
        (engine.submit(values(1, Mode::Set))).unwrap();
        let mut out = Vec::new();
        engine.poll(0, &mut out);
        for e in &mut out[0].entries {
            e.threshold = 3;
        }
        assert!(stage.on_part(&out[0], &mut state).is_none());
        assert_eq!(stage.refused, 1);
        assert!(stage.commit(&mut state).is_none());
        assert_eq!(state.read(at(1, 0)), 500, "nothing written");
    }

    #[test]
    fn malformed_parts_and_oversized_writes_are_refused() {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000);
        assert!(
            engine.submit(values(0, Mode::Set)).is_ok(),
            "an empty write commits too"
        );
        let too_big = vec![values(1, Mode::Set)[0]; MAX_VALUES + 1];
        assert!(
            engine
                .submit(too_big.clone())
                .unwrap_err()
                .contains("split it")
        );
        // A path of larger datagrams carries a larger write, up to what a switch stages.
        let mut large = WriteEngine::new(1, 1, 0, 1_000);
        large.path_carries(65_507);
        assert_eq!(large.max_values(), MAX_WRITE_VALUES);
        assert!(large.submit(too_big).is_ok());
        let e = (large.submit(vec![values(1, Mode::Set)[0]; MAX_WRITE_VALUES + 1])).unwrap_err();
        assert!(
            e.contains("at most 1048576 values") && e.contains("65507 bytes"),
            "{e}"
        );
        let mut out = Vec::new();
        engine.poll(0, &mut out);
        let mut stage = WriteStage::default();
        let mut bad = out[0].clone();
        bad.t_max = (5 << 32) | 1;
        let mut state = Map::default();
        assert_eq!(stage.on_part(&bad, &mut state), None);
        assert_eq!(stage.refused, 1);
        stage.on_part(&out[0], &mut state).unwrap();
        assert_eq!(stage.commit(&mut state).map(|c| c.values), Some(0));
        let ack = answer_of(&mut stage);
        assert!(engine.on_ack(5, &ack).is_some());
    }

    /// A write numbered 0 (no engine numbers one so) is malformed, part or abandon: refused
    /// and counted, whatever the stage committed before, and nothing it holds is touched.
    #[test]
    fn a_write_numbered_0_is_refused() {
        let mut stage = WriteStage::default();
        let mut state = Map::default();
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000).numbered_from(100);
        for _ in 0..2 {
            commit_one(&mut engine, &mut stage, &mut state);
        }
        engine.submit(values(2, Mode::Set)).unwrap();
        let mut out = Vec::new();
        engine.poll(0, &mut out);
        let zero = Message {
            seq: 0,
            ..out[0].clone()
        };
        let abandon = Message {
            t_max: 0,
            entries: Vec::new(),
            ..zero.clone()
        };
        assert_eq!(stage.on_part(&zero, &mut state), None);
        assert_eq!(stage.on_part(&abandon, &mut state), None);
        assert_eq!((stage.refused, stage.renumbered), (2, 0));
        stage.on_part(&out[0], &mut state).unwrap();
        assert_eq!(stage.commit(&mut state).map(|c| c.id), Some(102));
    }

    /// A part not acknowledged while parts sent more than three places after it are goes
    /// again at once, before its timeout.
    #[test]
    fn a_part_seen_lost_by_later_acknowledgements_goes_again_before_its_timeout() {
        let (mut engine, out) = sent_in_parts(6);
        let mut stage = WriteStage::default();
        assert_eq!(out.len(), 6);
        let mut state = Map::default();
        let mut ack = None;
        for part in &out[2..] {
            ack = stage.on_part(part, &mut state);
        }
        assert_eq!(engine.on_ack(10, &ack.unwrap()), None);
        let mut again = Vec::new();
        engine.poll(20, &mut again);
        let parts: Vec<u64> = again.iter().map(|m| m.t_max >> 32).collect();
        assert_eq!(
            parts,
            [0, 1],
            "parts 3 to 6 places before the last acknowledged"
        );
    }

    /// On a path not seen to reorder, every part sent before one that arrived and not
    /// held is lost at once; once a part sent once arrives after a later one did, the
    /// engine leaves three places of room (TCP's) from then on.
    #[test]
    fn parts_overtaken_are_lost_at_once_until_the_path_is_seen_to_reorder() {
        let sent_again = |reorder: bool| {
            let (mut engine, out) = sent_in_parts(6);
            let mut stage = WriteStage::default();
            let mut state = Map::default();
            let ack = stage.on_part(&out[4], &mut state).unwrap();
            engine.on_ack(10_000, &ack);
            if reorder {
                // Part 1, sent once, before part 4, arrives after it: overtaken.
                let late = stage.on_part(&out[1], &mut state).unwrap();
                engine.on_ack(10_001, &late);
            }
            assert_eq!(engine.reordering_seen, reorder);
            let mut again = Vec::new();
            engine.poll(10_002, &mut again);
            again.iter().map(|m| m.t_max >> 32).collect::<Vec<u64>>()
        };
        assert_eq!(sent_again(false), [0, 1, 2, 3], "sent before part 4: lost");
        assert_eq!(sent_again(true), [0], "three places before part 4 at least");
    }

    /// A switch slow to answer (busy committing a large write) is not sent the whole
    /// write again: a timeout sends again the parts that went longest ago, eight of 64 KiB
    /// a timeout, the rest a timeout later, and the acknowledgement they bring back shows
    /// all held.
    #[test]
    fn a_timeout_sends_a_few_large_parts_again_not_the_whole_write() {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000);
        engine.path_carries(65_507);
        let mut stage = WriteStage::default();
        let mut state = Map::default();
        let n = 12 * crate::wire::MAX_DATAGRAM_ENTRIES as u32;
        engine.submit(values(n, Mode::Set)).unwrap();
        let mut out = Vec::new();
        engine.poll(0, &mut out);
        assert_eq!(out.len(), 12);
        let mut again = Vec::new();
        engine.poll(999_999, &mut again);
        assert!(again.is_empty(), "within the timeout");
        let parts = |m: &[Message]| {
            let mut p: Vec<u64> = m.iter().map(|m| m.t_max >> 32).collect();
            p.dedup();
            p
        };
        // The twelve went a nanosecond apart (see `poll`): all have timed out here.
        engine.poll(1_000_011, &mut again);
        assert_eq!(again.len(), 16, "eight parts, as two copies each");
        assert_eq!(parts(&again), (0..8).collect::<Vec<_>>());
        let mut later = Vec::new();
        engine.poll(1_000_012, &mut later);
        assert!(later.is_empty(), "the four held back wait a timeout");
        engine.poll(3_000_010, &mut later);
        assert!(later.is_empty(), "the next timeout is twice as long");
        // (The eight went again a nanosecond apart too.)
        engine.poll(3_000_018, &mut later);
        assert_eq!(
            parts(&later),
            [0, 1, 2, 3, 8, 9, 10, 11],
            "then the four held back, and four of the eight"
        );
        // The switch was slow, not the path: it took every first transmission.
        for part in &out {
            stage.on_part(part, &mut state).unwrap();
        }
        stage.on_part(&later[0], &mut state).unwrap();
        stage.commit(&mut state).unwrap();
        let ack = answer_of(&mut stage);
        let done = engine.on_ack(3_000_030, &ack).unwrap();
        assert_eq!(done.transmissions, 12 + 16 + 4 * 4 + 4 * 2);
    }

    /// Parts sent again together: the acknowledgement of a later one (named by the
    /// sending time it echoes) shows those sent more than three places before it lost,
    /// with no timeout, however often each went.
    #[test]
    fn an_acknowledged_transmission_shows_those_sent_before_it_lost() {
        let (mut engine, out) = sent_in_parts(12);
        // A path seen to reorder: three places of room (the parts went before any
        // acknowledgement came, so the room applies to all that follows).
        engine.reordering_seen = true;
        let mut stage = WriteStage::default();
        let mut state = Map::default();
        assert_eq!(out.len(), 12);
        let parts = |m: &[Message]| m.iter().map(|m| m.t_max >> 32).collect::<Vec<_>>();
        // Only part 11 arrives: 0 to 7, sent more than three places before it, are lost.
        let ack = stage.on_part(&out[11], &mut state).unwrap();
        assert_eq!(engine.on_ack(10_000, &ack), None);
        let mut again = Vec::new();
        engine.poll(10_000, &mut again);
        assert_eq!(
            parts(&again),
            [0, 1, 2, 3, 4, 5, 6, 7],
            "seen lost: once each"
        );
        // Of those, only the last arrives. Its echo names its transmission: the four sent
        // more than three places before it in the same round are lost (and 8 to 10, sent
        // a round before).
        let ack = stage.on_part(&again[7], &mut state).unwrap();
        assert_eq!(engine.on_ack(20_000, &ack), None);
        let mut third = Vec::new();
        engine.poll(20_000, &mut third);
        let mut seen_lost = parts(&third);
        seen_lost.dedup();
        assert_eq!(seen_lost, [0, 1, 2, 3, 8, 9, 10]);
        // Two of the twenty datagrams sent arrived: a path that loses nine in ten, so
        // they go in as many copies as that asks for.
        let copies = copies_for(engine.loss_to_switch());
        assert_eq!(copies, MAX_PATH_COPIES);
        assert_eq!(third.len(), 7 * copies as usize);
    }

    /// A part not acknowledged in time goes again as two copies, then four each time
    /// after, all counted as transmissions.
    #[test]
    fn a_part_sent_again_goes_as_more_copies() {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000);
        engine.submit(values(1, Mode::Set)).unwrap();
        let mut copies = Vec::new();
        for round in 0..4u64 {
            let mut out = Vec::new();
            engine.poll(round * 1_000_000, &mut out);
            assert!(out.iter().all(|m| m.t_max == 1), "part 0 of 1");
            copies.push(out.len());
        }
        assert_eq!(copies, [1, 2, 4, 4]);
        let mut stage = WriteStage::default();
        let mut out = Vec::new();
        engine.poll(4_000_000, &mut out);
        let mut state = Map::default();
        stage.on_part(&out[0], &mut state).unwrap();
        stage.commit(&mut state).unwrap();
        let ack = answer_of(&mut stage);
        let done = engine.on_ack(4_000_010, &ack).unwrap();
        assert_eq!(done.transmissions, 1 + 2 + 4 + 4 + 4);
    }

    #[test]
    fn copies_make_one_arrive_nine_times_in_ten() {
        let copies: Vec<u32> = [0.0, 0.1, 0.2, 0.5, 0.8, 0.9, 0.99, 1.0, f64::NAN]
            .iter()
            .map(|&loss| copies_for(loss))
            .collect();
        assert_eq!(copies, [1, 1, 2, 4, 11, 16, 16, 16, 1]);
        for loss in [0.15, 0.3, 0.6, 0.8, 0.85] {
            let k = copies_for(loss) as i32;
            assert!(loss.powi(k) <= 0.1 && loss.powi(k - 1) > 0.1, "{loss}: {k}");
        }
    }

    /// The acknowledgements say how many of the write's datagrams the switch took: on a
    /// path that loses half, the parts seen lost go again in three copies each; a write's
    /// acknowledgements that show nothing lost bring the loss back to 0.
    #[test]
    fn parts_go_in_as_many_copies_as_the_paths_loss_asks_for() {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000);
        let mut stage = WriteStage::default();
        let mut state = Map::default();
        let mut now = 0;
        // Delivers what `engine` sends now (every other datagram, where `lossy`) and
        // hands back the acknowledgements; the datagrams sent, per part.
        let mut exchange = |engine: &mut WriteEngine, lossy: bool, now: u64| {
            let mut out = Vec::new();
            engine.poll(now, &mut out);
            let mut sent: BTreeMap<u64, u32> = BTreeMap::new();
            for (n, part) in out.iter().enumerate() {
                *sent.entry(part.t_max >> 32).or_default() += 1;
                if lossy && n % 2 == 1 {
                    continue;
                }
                if let Some(ack) = stage.on_part(part, &mut state) {
                    engine.on_ack(now + 10, &ack);
                }
            }
            if stage.commit(&mut state).is_some() {
                let done = engine.on_ack(now + 20, &answer_of(&mut stage));
                assert!(done.is_some(), "the commit's answer completes the write");
            }
            sent
        };
        // Forty parts, of which every other is lost: the acknowledgements say so.
        engine.submit(values(40 * 58, Mode::Set)).unwrap();
        let first = exchange(&mut engine, true, now);
        assert_eq!(first.len(), 40);
        assert!(first.values().all(|&n| n == 1), "forty parts, once each");
        let loss = engine.loss_to_switch();
        assert!((0.4..0.6).contains(&loss), "half lost: {loss}");
        let copies = copies_for(loss);
        assert!(copies >= 3, "{loss}: {copies}");
        // Later parts' acknowledgements (then a timeout, for the last ones) show the odd
        // parts lost: they go again in as many copies as the loss asks for.
        let mut again = BTreeMap::new();
        while !engine.is_idle() && now < 100_000_000 {
            now += 1_000_000;
            again.extend(exchange(&mut engine, false, now));
        }
        assert!(engine.is_idle(), "the write completed");
        let odd: Vec<u64> = (1..40).step_by(2).collect();
        assert_eq!(again.keys().copied().collect::<Vec<u64>>(), odd);
        assert!(again.values().all(|&n| n == copies), "{again:?}");
        // The next write's first transmissions go once, whatever the loss: a path that
        // lost them to a full queue is not sent more.
        engine.submit(values(40 * 58, Mode::Set)).unwrap();
        let next = exchange(&mut engine, false, now + 1_000_000);
        assert!(
            next.len() == 40 && next.values().all(|&n| n == 1),
            "{next:?}"
        );
        assert_eq!(engine.loss_to_switch(), 0.0, "nothing lost");
        assert!(engine.is_idle());
    }

    /// A switch acknowledges a part it did not hold, and answers a commit, in as many
    /// copies as the loss toward the collector asks for (the answer four at least); a copy
    /// of a part held, once.
    #[test]
    fn a_commits_answer_goes_in_as_many_copies_as_the_paths_loss_asks_for() {
        for (loss, copies) in [(0.0, ANSWER_COPIES), (0.5, ANSWER_COPIES), (0.8, 11)] {
            let (_, out) = sent_values(1);
            let mut stage = WriteStage::default();
            let mut state = Map::default();
            stage.on_part(&out[0], &mut state).unwrap();
            assert_eq!(
                stage.ack_copies(loss),
                copies_for(loss) as usize,
                "a part new"
            );
            stage.on_part(&out[0], &mut state).unwrap();
            assert_eq!(stage.ack_copies(loss), 1, "a copy of one held");
            stage.commit(&mut state).unwrap();
            let mut answers = Vec::new();
            stage.take_answers(&mut answers);
            assert_eq!(answers.len(), 1, "one write's answer");
            assert_eq!(WriteStage::answer_copies(loss), copies, "at {loss}");
        }
    }

    /// When every part went and nothing comes back for two round trips, only the last part
    /// not acknowledged goes again; its acknowledgement, echoing a later sending time,
    /// shows the parts sent before it lost, and they go at once, once each.
    #[test]
    fn a_tail_probe_is_one_part_and_its_acknowledgement_shows_the_rest_lost() {
        let (mut engine, out) = sent_in_parts(4);
        let mut stage = WriteStage::default();
        let mut state = Map::default();
        assert_eq!(out.len(), 4);
        // Part 0 arrives (a round trip of 10 us); 1, 2 and 3 are lost.
        let ack = stage.on_part(&out[0], &mut state).unwrap();
        assert_eq!(engine.on_ack(10_000, &ack), None);
        let mut probe = Vec::new();
        engine.poll(29_999, &mut probe);
        assert!(probe.is_empty());
        engine.poll(30_000, &mut probe);
        let parts: Vec<u64> = probe.iter().map(|m| m.t_max >> 32).collect();
        assert_eq!(parts, [3, 3], "the last part alone, as two copies");
        let ack = stage.on_part(&probe[0], &mut state).unwrap();
        assert_eq!(engine.on_ack(40_000, &ack), None);
        let mut again = Vec::new();
        engine.poll(40_000, &mut again);
        let parts: Vec<u64> = again.iter().map(|m| m.t_max >> 32).collect();
        assert_eq!(parts, [1, 2], "sent before a part that arrived: lost");
    }

    /// A path whose round trips are longer than the first timeout gets a timeout of its
    /// own once they are measured, not the first one as a ceiling.
    #[test]
    fn the_timeout_follows_round_trips_longer_than_the_first_one() {
        let mut engine = WriteEngine::new(1, 1, 0, 200_000);
        let mut stage = WriteStage::default();
        let mut state = Map::default();
        engine.submit(values(1, Mode::Set)).unwrap();
        let mut out = Vec::new();
        engine.poll(0, &mut out);
        let ack = stage.on_part(&out[0], &mut state).unwrap();
        assert_eq!(engine.on_ack(50_000_000, &ack), None, "held, not committed");
        assert!(engine.rto() >= 50_000_000, "{}", engine.rto());
        assert!(engine.rto() <= MAX_RTO_NS);
        // The commit's answer, which waited for the commit, measures no round trip.
        let rto = engine.rto();
        stage.commit(&mut state).unwrap();
        engine.on_ack(900_000_000, &answer_of(&mut stage)).unwrap();
        assert_eq!(engine.rto(), rto);
    }

    /// Copies of an acknowledgement (a switch sends them on a lossy path), and one older
    /// than the last measured, measure no round trip again.
    #[test]
    fn copies_of_an_acknowledgement_measure_one_round_trip() {
        let (mut engine, out) = sent_in_parts(2);
        let mut stage = WriteStage::default();
        let mut state = Map::default();
        let first = stage.on_part(&out[0], &mut state).unwrap();
        let second = stage.on_part(&out[1], &mut state).unwrap();
        engine.on_ack(100_000, &second);
        let rto = engine.rto();
        let r = 100_000 - second.sent_ns;
        assert_eq!(rto, r + 4 * (r / 2), "one round trip of about 100 us");
        for late in [200_000, 5_000_000] {
            engine.on_ack(late, &second);
            engine.on_ack(late, &first);
        }
        assert_eq!(engine.rto(), rto, "copies and an older one: no measure");
    }

    /// An open write of 8 rows of 2 values, 2 rows a part, its values given in `chunks`
    /// (each polled before the next), then closed: the engine and the parts it sent.
    fn open_write_sent(chunks: &[usize]) -> (WriteEngine, Vec<Message>) {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000).with_values_per_part(4);
        let id = engine.open(at(2, 0), 2, 16);
        let values: Vec<u64> = (1..=16).collect();
        let (mut out, mut from) = (Vec::new(), 0);
        for &n in chunks {
            engine.extend(id, &values[from..from + n]).unwrap();
            from += n;
            engine.poll(0, &mut out);
        }
        engine.close(id).unwrap();
        assert!(engine.extend(id, &[1]).is_err(), "closed: no more values");
        engine.poll(0, &mut out);
        (engine, out)
    }

    /// A write opened in room lent to it fills that room (its values move nowhere else)
    /// and gives it back, emptied, once it commits; room too small is not taken.
    #[test]
    fn a_write_opened_in_room_fills_it_and_gives_it_back() {
        let mut small = Vec::with_capacity(8);
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000);
        engine.open_in(at(2, 0), 2, 16, &mut small);
        assert_eq!(small.capacity(), 8, "too small for 16 values: not taken");

        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000).with_values_per_part(4);
        let mut room: Vec<u64> = Vec::with_capacity(64);
        room.push(9);
        let lent = room.as_ptr();
        let id = engine.open_in(at(2, 0), 2, 16, &mut room);
        assert_eq!(room.capacity(), 0, "lent");
        engine.extend(id, &(1..=16).collect::<Vec<u64>>()).unwrap();
        engine.close(id).unwrap();
        let mut out = Vec::new();
        engine.poll(0, &mut out);
        assert_eq!(engine.take_spent().capacity(), 0, "nothing ended yet");
        let (mut stage, mut state) = (WriteStage::default(), Map::default());
        let mut done = None;
        for part in &out {
            if let Some(ack) = stage.on_part(part, &mut state) {
                done = done.or(engine.on_ack(10_000, &ack));
            }
        }
        assert_eq!(stage.commit(&mut state).map(|c| c.id), Some(id));
        assert_eq!(state.read(at(2, 15)), 16, "its values");
        let answer = answer_of(&mut stage);
        let done = done.or(engine.on_ack(20_000, &answer)).unwrap();
        assert_eq!((done.id, done.cancelled), (id, false));
        let spent = engine.take_spent();
        assert_eq!(
            (spent.as_ptr(), spent.capacity(), spent.len()),
            (lent, 64, 0)
        );
        assert_eq!(engine.take_spent().capacity(), 0, "taken once");
    }

    /// A write held whole is probed for its commit's answer only after as long as the
    /// switch took to commit the writes before, for its values, so that a large write's
    /// commit is not taken for a lost answer; before any commit was timed, the probe goes
    /// two round trips after.
    #[test]
    fn a_write_held_whole_waits_for_its_commit_as_long_as_the_last_took() {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000);
        let (mut stage, mut state) = (WriteStage::default(), Map::default());
        // Each write held whole 10 us after it went, and committed 1 ms after that: when
        // its first probe went, after being held.
        let mut probed_after = |engine: &mut WriteEngine, start: u64| {
            engine.submit(values(1000, Mode::Set)).unwrap();
            let mut out = Vec::new();
            engine.poll(start, &mut out);
            let held = start + 10_000;
            for part in &out {
                let ack = stage.on_part(part, &mut state).unwrap();
                assert_eq!(engine.on_ack(held, &ack), None);
            }
            let probe = (1..100).map(|step| held + step * 20_000).find(|&now| {
                let mut again = Vec::new();
                engine.poll(now, &mut again);
                !again.is_empty()
            });
            stage.commit(&mut state).unwrap();
            let done = engine.on_ack(held + 1_000_000, &answer_of(&mut stage));
            assert!(done.is_some_and(|d| !d.cancelled));
            probe.map(|at| at - held)
        };
        assert_eq!(
            probed_after(&mut engine, 0),
            Some(20_000),
            "two round trips"
        );
        assert_eq!(
            engine.commit_ps_per_value, 1_000_000,
            "1 ms for 1,000 values"
        );
        let after = probed_after(&mut engine, 10_000_000);
        assert_eq!(
            after,
            Some(1_020_000),
            "the commit's time, then a round trip's two"
        );
        // However long commits took, the wait is bounded.
        engine.commit_ps_per_value = u64::MAX;
        engine.submit(values(1000, Mode::Set)).unwrap();
        let mut out = Vec::new();
        engine.poll(20_000_000, &mut out);
        let held = 20_010_000;
        for part in &out {
            engine.on_ack(held, &stage.on_part(part, &mut state).unwrap());
        }
        let probe_at = held + MAX_COMMIT_WAIT_NS + 20_000;
        for (now, probed) in [(probe_at - 1, false), (probe_at, true)] {
            let mut again = Vec::new();
            engine.poll(now, &mut again);
            assert_eq!(!again.is_empty(), probed, "at {now}");
        }
    }

    /// An open write's parts sent last are not its tail while more may come: none goes
    /// again as a tail-loss probe (two round trips after the last word of it, before a
    /// timeout) until it is closed, when its last part goes.
    #[test]
    fn an_open_writes_last_parts_sent_are_not_probed_while_it_is_open() {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000).with_values_per_part(4);
        let id = engine.open(at(2, 0), 2, 16);
        engine.extend(id, &(1..=12).collect::<Vec<u64>>()).unwrap();
        let mut out = Vec::new();
        engine.poll(0, &mut out);
        let parts = |out: &[Message]| out.iter().map(|m| m.t_max >> 32).collect::<Vec<_>>();
        assert_eq!(
            parts(&out),
            [0, 1],
            "the rows a part is filling wait for more"
        );
        // Part 0 arrives (a round trip of 10 us); part 1 is lost.
        let (mut stage, mut state) = (WriteStage::default(), Map::default());
        let ack = stage.on_part(&out[0], &mut state).unwrap();
        assert_eq!(engine.on_ack(10_000, &ack), None);
        // A probe would go from 30 us, a timeout from 50 us.
        for now in [30_000, 49_999] {
            let mut again = Vec::new();
            engine.poll(now, &mut again);
            assert_eq!(parts(&again), [0u64; 0], "open at {now} ns: nothing again");
        }
        engine.close(id).unwrap();
        let mut last = Vec::new();
        engine.poll(49_999, &mut last);
        assert_eq!(parts(&last), [2], "closed: its last part");
    }

    /// An open write holds no more than a write may: what would pass it is refused, and
    /// nothing of it taken; a closed or unknown write takes nothing.
    #[test]
    fn an_open_write_takes_no_more_than_a_write_may_hold() {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000);
        let id = engine.open(at(2, 0), 2, 16);
        engine.extend(id, &vec![1; MAX_VALUES - 1]).unwrap();
        let e = engine.extend(id, &[1, 2]).unwrap_err();
        assert!(e.contains(&format!("at most {MAX_VALUES} values")), "{e}");
        engine.extend(id, &[5]).unwrap();
        assert!(engine.extend(id, &[6]).is_err(), "full: nothing more");
        engine.close(id).unwrap();
        assert!(engine.extend(id, &[6]).unwrap_err().contains("not open"));
        assert!(engine.extend(id + 1, &[6]).is_err(), "unknown");
    }

    /// A part sent before its write was closed says no count ([`COUNT_NOT_KNOWN`]); the
    /// stage holds it,
    /// acknowledges what it holds, commits nothing until a part says the count (the last
    /// one at least does), and refuses a part at odds with a count it knows.
    #[test]
    fn a_stage_learns_a_writes_count_from_the_part_that_says_it() {
        let (_, out) = open_write_sent(&[6, 10]);
        let counts: Vec<u64> = out.iter().map(|p| p.t_max).collect();
        let unknown = COUNT_NOT_KNOWN;
        assert_eq!(
            counts,
            [unknown, 1 << 32 | unknown, 2 << 32 | unknown, 3 << 32 | 4],
            "3 parts, then the last"
        );
        let (mut stage, mut state) = (WriteStage::default(), Map::default());
        let header = |m: &Message| Message {
            entries: Vec::new(),
            ..m.clone()
        };
        for part in &out[..3] {
            stage.on_part(part, &mut state).unwrap();
            assert_eq!(stage.commit(&mut state), None, "no count known");
        }
        assert!(stage.holds_part(&header(&out[0])));
        assert!(stage.holds_part(&header(&out[1])));
        let counted = |index: u64, count: u64| Message {
            t_max: index << 32 | count,
            ..out[1].clone()
        };
        assert!(
            !stage.holds_part(&header(&counted(1, 4))),
            "held, but saying a count the stage does not know: read whole"
        );
        // A count below the parts held: refused, and nothing changes.
        assert_eq!(stage.on_part(counted(1, 2), &mut state), None);
        assert_eq!(stage.refused, 1);
        let learnt = stage.on_part(counted(1, 4), &mut state).unwrap();
        assert_eq!(
            (learnt.t_max, learnt.entries[0].value),
            (3, 0b0111),
            "3 of 4 held"
        );
        assert!(stage.holds_part(&header(&counted(1, 4))), "the count known");
        for (index, count) in [(1, 5), (4, unknown), (9, unknown), (1, 0)] {
            assert_eq!(stage.on_part(counted(index, count), &mut state), None);
        }
        assert_eq!(stage.refused, 5);
        let ack = stage.on_part(&out[3], &mut state).unwrap();
        assert_eq!((ack.t_max, ack.entries[0].value), (4, 0b1111));
        let done = stage.commit(&mut state).unwrap();
        assert_eq!(done.values, 16);
        assert_eq!(state.0.get(&at(2, 15)), Some(&16));
    }

    /// A stage holds a part once it took it, and every part of a write it committed; not
    /// a part of another numbering, nor of a write it dropped. A part taken from its header
    /// alone (a copy of one held) is acknowledged as held and changes nothing.
    #[test]
    fn a_part_held_is_known_from_its_header() {
        let (_, out) = sent_in_parts(2);
        let mut stage = WriteStage::default();
        let mut state = Map::default();
        let header = |m: &Message| Message {
            entries: Vec::new(),
            ..m.clone()
        };
        assert!(!stage.holds_part(&header(&out[0])));
        stage.on_part(&out[0], &mut state).unwrap();
        assert!(stage.holds_part(&header(&out[0])));
        assert!(!stage.holds_part(&header(&out[1])));
        let again = stage.on_part(header(&out[0]), &mut state).unwrap();
        assert_eq!(
            (again.t_max, again.entries[0].value),
            (1, 0b01),
            "held: part 0"
        );
        assert_eq!(again.entries[0].threshold, 2, "two datagrams taken");
        stage.on_part(&out[1], &mut state).unwrap();
        let done = stage.commit(&mut state).unwrap();
        assert_eq!(
            done.values,
            2 * MAX_ENTRIES as u64,
            "the copy took nothing from it"
        );
        assert!(stage.holds_part(&header(&out[1])), "committed");
        let far = Message {
            seq: out[0].seq + 1_000,
            ..header(&out[0])
        };
        assert!(!stage.holds_part(&far), "another numbering");
        for t_max in [0, (2 << 32) | 2, (5 << 32) | 2] {
            let malformed = Message {
                t_max,
                ..header(&out[1])
            };
            assert!(
                !stage.holds_part(&malformed),
                "{t_max:x}: read whole, refused"
            );
        }
        let mut abandoned = WriteStage::default();
        abandoned.on_part(&out[0], &mut state).unwrap();
        let abandon = Message {
            t_max: 0,
            ..header(&out[0])
        };
        abandoned.on_part(&abandon, &mut state).unwrap();
        assert!(!abandoned.holds_part(&header(&out[0])), "dropped");
    }

    /// Copies count against the window: on a path that loses nine datagrams in ten, a
    /// timeout sends the parts that went first in sixteen copies each, no more datagrams
    /// than a window, and the others after.
    #[test]
    fn copies_count_against_the_window() {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000);
        engine.loss_to_switch = 0.9;
        engine
            .submit(values(200 * MAX_ENTRIES as u32, Mode::Set))
            .unwrap();
        let mut first = Vec::new();
        engine.poll(0, &mut first);
        assert_eq!(first.len(), WINDOW, "first transmissions go once");
        let mut again = Vec::new();
        engine.poll(1_000_000, &mut again);
        assert_eq!(again.len(), WINDOW);
        let parts: std::collections::BTreeSet<u64> = again.iter().map(|m| m.t_max >> 32).collect();
        let copies = MAX_PATH_COPIES as usize;
        assert_eq!(
            parts,
            (0..(WINDOW / copies) as u64).collect(),
            "{copies} copies each"
        );
    }

    /// A register whose size the stage knows.
    struct Register(Vec<u64>);

    impl WriteTarget for Register {
        fn read(&self, l: Location) -> u64 {
            self.0[l.index as usize]
        }
        fn write(&mut self, l: Location, v: u64) {
            self.0[l.index as usize] = v;
        }
        fn extent(&self, _state: u16) -> u32 {
            self.0.len() as u32
        }
    }

    /// A write whose parts are stretches of values set one after another, scattered sets,
    /// subtractions and values keeping changes, overlapping, commits as its values applied
    /// one by one in order: a part held as a stretch lands in its place among the others.
    #[test]
    fn a_write_of_stretches_and_scattered_values_commits_as_its_values_in_order() {
        let w = |index: u32, value, mode| Written {
            location: at(0, index),
            value,
            mode,
        };
        let mut write: Vec<Written> = (0..100)
            .map(|i| w(i, 1_000 + u64::from(i), Mode::Set))
            .collect();
        write.extend(
            (10..40)
                .step_by(2)
                .map(|i| w(i, 5_000 + u64::from(i), Mode::Set)),
        );
        write.extend((20..30).map(|i| w(i, 7, Mode::Set)));
        write.extend((24..34).step_by(3).map(|i| w(i, 9, Mode::Set)));
        write.extend((50..55).map(|i| w(i, 3, Mode::Subtract)));
        // Where nothing else of the write goes, so that the changes kept are none.
        write.extend((110..113).map(|i| w(i, 11, Mode::SetKeepingChanges)));
        write.extend((90..95).map(|i| w(i, 2_000 + u64::from(i), Mode::Set)));
        let mut expected = vec![4u64; 120];
        for v in &write {
            let at = &mut expected[v.location.index as usize];
            *at = match v.mode {
                Mode::Subtract => at.saturating_sub(v.value),
                Mode::Set | Mode::SetKeepingChanges => v.value,
            };
        }
        for per_part in [1, 7, 64, MAX_RUN_ENTRIES] {
            let mut engine = WriteEngine::new(1, 1, 0, 1_000_000).with_values_per_part(per_part);
            engine.path_carries(65_507);
            engine.submit(write.clone()).unwrap();
            let mut parts = Vec::new();
            let mut stage = WriteStage::default();
            let mut register = Register(vec![4; 120]);
            // Every part, the window's worth at a time, each acknowledged.
            for round in 0..10 {
                parts.clear();
                engine.poll(round, &mut parts);
                for part in parts.drain(..) {
                    if let Some(ack) = stage.on_part(part, &mut register) {
                        engine.on_ack(round, &ack);
                    }
                }
            }
            let done = stage.commit(&mut register).unwrap();
            assert_eq!(done.values, write.len() as u64, "{per_part} a part");
            assert_eq!(register.0, expected, "{per_part} values a part");
        }
        // A part whose last values are set one after another, then a part of a stretch
        // over them: the stretch lands after them.
        let update = |index, value| Update {
            location: at(0, index),
            value,
            threshold: Mode::Set as u64,
        };
        let parts = [
            vec![update(50, 1), update(10, 1), update(11, 1), update(12, 1)],
            (10..13).map(|i| update(i, 99)).collect(),
        ];
        let mut stage = WriteStage::default();
        let mut register = Register(vec![4; 120]);
        for (i, part) in parts.into_iter().enumerate() {
            stage.on_part(
                write_message((1, 1, 0), 1, 0, (i as u64) << 32 | 2, part),
                &mut register,
            );
        }
        stage.commit(&mut register).unwrap();
        assert_eq!(register.0[9..14], [4, 99, 99, 99, 4]);
        assert_eq!(register.0[50], 1);
    }

    /// A reset keeping changes keeps those a counter took after the write's first part
    /// arrived, though its own part came later, where the state's size is known; where it
    /// is not, those after its own part.
    #[test]
    fn changes_are_kept_from_the_first_part_where_the_state_is_known() {
        let resets: Vec<Written> = (0..3 * MAX_ENTRIES as u32)
            .map(|i| Written {
                location: at(0, 2 * i),
                value: 0,
                mode: Mode::SetKeepingChanges,
            })
            .collect();
        let last = resets[resets.len() - 1].location;
        let run = |known: bool| {
            let mut engine = WriteEngine::new(1, 1, 0, 1_000_000);
            engine.submit(resets.clone()).unwrap();
            let mut out = Vec::new();
            engine.poll(0, &mut out);
            assert_eq!(out.len(), 3);
            let mut stage = WriteStage::default();
            let mut register = Register(vec![100; 6 * MAX_ENTRIES]);
            let mut map = Map::default();
            map.write(last, 100);
            let count = |n: u64, register: &mut Register, map: &mut Map| {
                register.0[last.index as usize] += n;
                map.write(last, map.read(last) + n);
            };
            let mut arrive = |part: &Message, register: &mut Register, map: &mut Map| {
                if known {
                    stage.on_part(part, register)
                } else {
                    stage.on_part(part, map)
                }
            };
            arrive(&out[0], &mut register, &mut map);
            count(7, &mut register, &mut map);
            arrive(&out[1], &mut register, &mut map);
            arrive(&out[2], &mut register, &mut map);
            count(5, &mut register, &mut map);
            if known {
                stage.commit(&mut register).unwrap();
                register.0[last.index as usize]
            } else {
                stage.commit(&mut map).unwrap();
                map.read(last)
            }
        };
        assert_eq!(run(true), 12, "7 before its part, 5 after");
        assert_eq!(run(false), 5, "only those after its own part");
    }

    /// A cancelled write's parts stop and the abandon goes until answered; the switch
    /// drops what it holds of it and says so, answers a repeated abandon or a late part of
    /// it the same, and commits the next write; a write already whole is answered as
    /// committed.
    #[test]
    fn a_cancelled_write_is_dropped_by_the_switch_and_the_next_commits() {
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000);
        let mut stage = WriteStage::default();
        let mut state = Map::default();
        let first = engine
            .submit(values(2 * MAX_ENTRIES as u32, Mode::Set))
            .unwrap();
        let second = engine.submit(values(1, Mode::Set)).unwrap();
        let mut out = Vec::new();
        engine.poll(0, &mut out);
        stage.on_part(&out[0], &mut state).unwrap();
        assert_eq!(engine.cancel(first), Cancel::Asked);
        assert_eq!(engine.cancel(99), Cancel::Unknown);
        let mut abandon = Vec::new();
        engine.poll(10, &mut abandon);
        assert_eq!(abandon.len(), 1);
        assert!(abandon[0].entries.is_empty() && abandon[0].t_max == 0);
        let answer = stage.on_part(&abandon[0], &mut state).unwrap();
        assert_eq!((answer.entries.len(), answer.t_max), (0, ABANDONED));
        assert_eq!(stage.abandoned, 1);
        assert_eq!(
            stage.on_part(&abandon[0], &mut state).unwrap().t_max,
            ABANDONED
        );
        let late = stage.on_part(&out[1], &mut state).unwrap();
        assert_eq!(
            (late.entries.len(), late.t_max),
            (0, ABANDONED),
            "a late part"
        );
        assert_eq!(stage.commit(&mut state), None);
        assert!(state.0.is_empty(), "nothing of it committed");
        let done = engine.on_ack(20, &answer).unwrap();
        assert!(done.cancelled && done.id == first);
        // The next write goes, and commits.
        out.clear();
        engine.poll(30, &mut out);
        stage.on_part(&out[0], &mut state).unwrap();
        assert_eq!(stage.commit(&mut state).map(|c| c.id), Some(second));
        let ack = answer_of(&mut stage);
        let done = engine.on_ack(40, &ack).unwrap();
        assert_eq!((done.cancelled, done.refused), (false, Some(0)));
        // Cancelled once whole at the switch: answered as committed.
        let third = engine.submit(values(1, Mode::Set)).unwrap();
        out.clear();
        engine.poll(50, &mut out);
        stage.on_part(&out[0], &mut state).unwrap();
        engine.cancel(third);
        let mut abandon = Vec::new();
        engine.poll(60, &mut abandon);
        let answer = stage.on_part(&abandon[0], &mut state).unwrap();
        assert_eq!(answer.t_max, COMMITTED_ALREADY);
        assert_eq!(stage.commit(&mut state).map(|c| c.id), Some(third));
        let done = engine.on_ack(70, &answer).unwrap();
        assert_eq!(
            (done.cancelled, done.refused),
            (false, None),
            "committed, what it refused not told"
        );
        // An abandon of a write committed since is answered with what it refused.
        let again = stage.on_part(&abandon[0], &mut state).unwrap();
        assert_eq!(again.t_max, COMMITTED);
    }
}

#[cfg(test)]
mod cutting {
    use super::*;
    use proptest::prelude::*;

    /// A write's values: stretches of locations one after another with gaps between, of
    /// zeros and values of every width, in any mode.
    fn write() -> impl Strategy<Value = Vec<Written>> {
        let stretch = (
            0..3u16,
            any::<u16>(),
            0..3u8,
            proptest::collection::vec(value(), 1..3_000),
        );
        proptest::collection::vec(stretch, 1..6).prop_map(|stretches| {
            let mut index = 0u32;
            let mut write = Vec::new();
            for (state, gap, mode, values) in stretches {
                index += u32::from(gap);
                let mode = Mode::of(u64::from(mode));
                for value in values {
                    write.push(Written {
                        location: Location { state, index },
                        value,
                        mode,
                    });
                    index += 1;
                }
            }
            write
        })
    }

    /// The datagrams of write 1 of `values`, each part as it first goes (at time 5), from
    /// an engine with a key on a path of `path` bytes, `per_part` values a part at most.
    fn datagrams(values: &WriteValues, path: usize, per_part: usize) -> Vec<Vec<u8>> {
        let key = crate::wire::Key::new([7; 32]);
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000)
            .with_values_per_part(per_part)
            .with_key(Some(key));
        engine.path_carries(path);
        (engine.encoded_parts(1, values).iter_mut())
            .map(|part| part.stamped(5).to_vec())
            .collect()
    }

    fn value() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0u64),
            0..256u64,
            0..65_536u64,
            any::<u32>().prop_map(u64::from),
            any::<u64>()
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// However the values fall, a write's parts hold them all in order, none empty, and
        /// each, encoded with its MAC, fits the path's datagram (a part of one value aside,
        /// which goes whatever its size), numbered as the write's parts, with the time it
        /// goes at and a MAC made over that time.
        #[test]
        fn every_part_fits_its_datagram_and_the_parts_are_the_write(
            write in write(),
            path in 100..65_507usize,
            per_part in prop_oneof![Just(MAX_RUN_ENTRIES), 1..2_000usize],
        ) {
            let key = crate::wire::Key::new([7; 32]);
            let parts = datagrams(&WriteValues::Each(write.clone()), path, per_part);
            let mut carried = Vec::new();
            for (i, bytes) in parts.iter().enumerate() {
                let part = Message::decode_with(Some(&key), bytes);
                prop_assert!(part.is_ok(), "{:?}", part);
                let part = part.unwrap();
                prop_assert_eq!(part.sent_ns, 5);
                prop_assert_eq!(part.t_max, (i as u64) << 32 | parts.len() as u64);
                prop_assert!(!part.entries.is_empty());
                prop_assert!(part.entries.len() <= per_part.max(1));
                let fits = bytes.len() <= path.max(SMALL_PATH_BYTES);
                prop_assert!(fits || part.entries.len() == 1, "{} bytes", bytes.len());
                carried.extend(part.entries.iter().map(|u| Written {
                    location: u.location,
                    value: u.value,
                    mode: Mode::of(u.threshold),
                }));
            }
            prop_assert_eq!(carried, write);
        }

        /// A stretch of values goes in the very datagrams that the same values as a write
        /// of each would, byte for byte.
        #[test]
        fn a_stretch_goes_as_the_write_of_each_of_its_values(
            state in any::<u16>(),
            first in prop_oneof![Just(0u32), any::<u32>()],
            mode in 0..3u64,
            values in proptest::collection::vec(value(), 0..12_000),
            path in 100..65_507usize,
            per_part in prop_oneof![Just(MAX_RUN_ENTRIES), 1..2_000usize],
        ) {
            let first = Location { state, index: first.min(u32::MAX - values.len() as u32) };
            let mode = Mode::of(mode);
            let each = (first.index..).zip(&values)
                .map(|(index, &value)| Written { location: Location { index, ..first }, value, mode })
                .collect();
            let stretch = WriteValues::Stretch { first, mode, values, columns: 1 };
            prop_assert_eq!(
                datagrams(&stretch, path, per_part),
                datagrams(&WriteValues::Each(each), path, per_part)
            );
        }

        /// An open write goes in the parts the same values would as a write submitted
        /// whole, however they come (the parts cut as rows fill; the last row may be
        /// short), those sent before the close saying no count of parts, those after
        /// saying it; the last is sent after.
        #[test]
        fn an_open_write_goes_in_the_parts_of_the_write_whole(
            columns in 2..=MAX_RUN_COLUMNS,
            values in proptest::collection::vec(value(), 0..8_000),
            cuts in proptest::collection::vec(0..200usize, 0..12),
            path in 100..65_507usize,
            per_part in prop_oneof![Just(MAX_RUN_ENTRIES), 32..2_000usize],
        ) {
            let first = Location { state: 2, index: 0 };
            let engine = || {
                let mut engine = WriteEngine::new(1, 1, 0, 1_000_000).with_values_per_part(per_part);
                engine.path_carries(path);
                engine
            };
            let mut whole = engine();
            whole.submit(WriteValues::Stretch { first, mode: Mode::Set, values: values.clone(), columns }).unwrap();
            let mut want = Vec::new();
            whole.poll(0, &mut want);
            // Parts past the window wait for acknowledgements, which these tests do not give.
            prop_assume!(want.len() < WINDOW);
            let mut open = engine();
            let id = open.open(first, columns, 0);
            let (mut got, mut from) = (Vec::new(), 0);
            // Each cut a number of rows, as the copy is read.
            for rows in cuts {
                let to = (from + rows * columns).min(values.len());
                open.extend(id, &values[from..to]).unwrap();
                from = to;
                open.poll(0, &mut got);
            }
            open.extend(id, &values[from..]).unwrap();
            open.poll(0, &mut got);
            let before_close = got.len();
            open.close(id).unwrap();
            open.poll(0, &mut got);
            prop_assert!(got.len() > before_close, "the last part goes after the close");
            let parts = want.len() as u64;
            prop_assert_eq!(got.len() as u64, parts);
            for (i, (got, want)) in got.iter().zip(&want).enumerate() {
                let count = if i < before_close { COUNT_NOT_KNOWN } else { parts };
                prop_assert_eq!(got.t_max, (i as u64) << 32 | count);
                prop_assert_eq!(&got.entries, &want.entries);
            }
        }

        /// A stretch in columns (a table's entries) goes in parts of whole rows, each
        /// fitting the path's datagram with its MAC and holding no more values than a part
        /// may, each read back as the stretch's values from its first row on; where a
        /// part may not hold a row, the stretch goes as runs, as a register's.
        #[test]
        fn a_stretch_in_columns_goes_in_parts_of_whole_rows_that_fit(
            columns in 2..=MAX_RUN_COLUMNS,
            values in proptest::collection::vec(value(), 0..20_000),
            path in 100..65_507usize,
            per_part in prop_oneof![Just(MAX_RUN_ENTRIES), 1..2_000usize],
        ) {
            let first = Location { state: 2, index: 0 };
            let stretch = WriteValues::Stretch { first, mode: Mode::Set, values: values.clone(), columns };
            let parts = datagrams(&stretch, path, per_part);
            let key = crate::wire::Key::new([7; 32]);
            let in_rows = columns <= per_part
                && columns_message_bytes(&[8; MAX_RUN_COLUMNS][..columns], columns) + MAC_LEN
                    <= path.max(SMALL_PATH_BYTES);
            let mut carried = Vec::new();
            for bytes in &parts {
                let (part, read) = Message::decode_write_part(Some(&key), bytes, |_| false).unwrap();
                let read = read.unwrap_or_else(|| StretchValues {
                    first: part.entries.first().map_or(first, |e| e.location),
                    threshold: 0,
                    values: part.entries.iter().map(|e| e.value).collect(),
                });
                prop_assert!(read.values.len() <= per_part.max(1));
                prop_assert_eq!(read.first.index as usize, carried.len());
                if in_rows {
                    prop_assert_eq!(read.first.index as usize % columns, 0, "whole rows");
                    prop_assert!(bytes.len() <= path.max(SMALL_PATH_BYTES), "{} bytes", bytes.len());
                }
                carried.extend(read.values);
            }
            prop_assert_eq!(carried, values);
        }

        /// A stretch of entries wider than a run's columns (0, 1, or past 64: a width a
        /// user gave for a state no switch announced) goes as runs of one width, in the
        /// very datagrams of a register's values, never cut into rows.
        #[test]
        fn a_stretch_of_columns_no_run_has_goes_as_a_registers_values(
            columns in prop_oneof![Just(0usize), Just(1), MAX_RUN_COLUMNS + 1..1_000],
            values in proptest::collection::vec(value(), 0..3_000),
            path in 100..65_507usize,
        ) {
            let first = Location { state: 2, index: 0 };
            let mode = Mode::Set;
            let stretch = |columns| WriteValues::Stretch { first, mode, values: values.clone(), columns };
            prop_assert_eq!(
                datagrams(&stretch(columns), path, MAX_RUN_ENTRIES),
                datagrams(&stretch(1), path, MAX_RUN_ENTRIES)
            );
        }

        /// A write whose parts a state takes ahead of the commit (as a table does, part
        /// after part from the first, as they arrive) lands as one the state takes at the
        /// commit, whatever order and copies its parts arrive in: the same values, in the
        /// same order, none left over.
        #[test]
        fn a_write_taken_ahead_of_its_commit_lands_as_one_taken_at_it(
            write in write(),
            as_stretch in any::<bool>(),
            columns in prop_oneof![Just(1usize), 2..=MAX_RUN_COLUMNS],
            path in 100..65_507usize,
            per_part in prop_oneof![Just(MAX_RUN_ENTRIES), 1..2_000usize],
            order in proptest::collection::vec(any::<proptest::sample::Index>(), 0..40),
        ) {
            let values = match (as_stretch, write.first()) {
                (true, Some(first)) => WriteValues::Stretch {
                    first: first.location,
                    mode: Mode::Set,
                    values: write.iter().map(|w| w.value).collect(),
                    columns,
                },
                _ => WriteValues::Each(write),
            };
            let parts = datagrams(&values, path, per_part);
            // Each part once at least, some again, in an order of their own.
            let mut arriving: Vec<&Vec<u8>> = parts.iter().collect();
            for i in &order {
                let from = i.index(arriving.len());
                let to = i.index(parts.len());
                arriving.swap(from, to);
                arriving.push(&parts[to]);
            }
            let key = crate::wire::Key::new([7; 32]);
            let landed = |ahead: bool| {
                let mut stage = WriteStage::default();
                let mut state = Staging { ahead, ..Staging::default() };
                for bytes in &arriving {
                    let held = |m: &Message| stage.holds_part(m);
                    let (part, stretch) =
                        Message::decode_write_part(Some(&key), bytes, held).unwrap();
                    stage.on_part_carrying(part, stretch, &mut state);
                }
                let committed = stage.commit(&mut state).map(|c| c.values);
                (state.landed, state.pending.len(), committed, state.taken_ahead)
            };
            let (at_commit, ahead) = (landed(false), landed(true));
            prop_assert_eq!(&ahead.0, &at_commit.0);
            prop_assert_eq!((ahead.1, ahead.2), (0, at_commit.2));
            prop_assert_eq!(at_commit.3, 0);
            if as_stretch && parts.len() > 1 {
                prop_assert!(ahead.3 > 0, "a stretch's parts in order are taken ahead");
            }
        }
    }

    /// State that holds a write's values until its commit, as a table does, and takes a
    /// stretch ahead of the commit where `ahead`: what lands, in order.
    #[derive(Default)]
    struct Staging {
        ahead: bool,
        pending: Vec<(Location, u64)>,
        landed: Vec<(Location, u64)>,
        taken_ahead: usize,
    }

    impl WriteTarget for Staging {
        fn read(&self, location: Location) -> u64 {
            (self.landed.iter().rev())
                .find(|(l, _)| *l == location)
                .map_or(0, |&(_, v)| v)
        }
        fn write(&mut self, location: Location, value: u64) {
            self.pending.push((location, value));
        }
        fn stage_run(&mut self, first: Location, values: &[u64]) -> bool {
            if self.ahead {
                self.taken_ahead += values.len();
                self.write_run(first, values);
            }
            self.ahead
        }
        fn drop_staged(&mut self) {
            self.pending.clear();
        }
        fn finish(&mut self) -> u64 {
            self.landed.append(&mut self.pending);
            0
        }
    }

    /// A write the state took parts of ahead of its commit and that is then abandoned
    /// leaves nothing in the state: what was taken is dropped, and the next write lands
    /// alone.
    #[test]
    fn an_abandoned_write_taken_ahead_leaves_nothing() {
        let stretch = |value| WriteValues::Stretch {
            first: Location { state: 0, index: 0 },
            mode: Mode::Set,
            values: vec![value; 3 * 1_000],
            columns: 1,
        };
        let mut engine = WriteEngine::new(1, 1, 0, 1_000_000).with_values_per_part(1_000);
        engine.path_carries(65_507);
        let first = engine.submit(stretch(5)).unwrap();
        let mut out = Vec::new();
        engine.poll(0, &mut out);
        assert_eq!(out.len(), 3);
        let (mut stage, mut state) = (WriteStage::default(), Staging::default());
        state.ahead = true;
        for part in &out[..2] {
            stage.on_part(part, &mut state).unwrap();
        }
        assert_eq!(
            state.taken_ahead, 2_000,
            "the first two parts, taken as they came"
        );
        engine.cancel(first);
        out.clear();
        engine.poll(1, &mut out);
        let answer = stage.on_part(&out[0], &mut state).unwrap();
        assert_eq!(answer.t_max, ABANDONED);
        assert!(state.pending.is_empty(), "what was taken ahead is dropped");
        engine.on_ack(2, &answer);
        // A write sent whole at `now` and taken, part by part.
        let taken =
            |engine: &mut WriteEngine, values, now, stage: &mut WriteStage, state: &mut Staging| {
                engine.submit(values).unwrap();
                let mut out = Vec::new();
                engine.poll(now, &mut out);
                for part in &out {
                    stage.on_part(part, state).unwrap();
                }
            };
        taken(&mut engine, stretch(9), 3, &mut stage, &mut state);
        assert_eq!(stage.commit(&mut state).map(|c| c.values), Some(3_000));
        assert!(stage.commit(&mut state).is_none());
        assert_eq!(state.landed.len(), 3_000);
        assert!(
            state.landed.iter().all(|&(_, v)| v == 9),
            "the second write alone"
        );
        let mut answers = Vec::new();
        stage.take_answers(&mut answers);
        assert!(engine.on_ack(3, &answers[0]).is_some());

        // A write taken in part ahead, then a collector that started again, numbering
        // anew: the old write's values are dropped with it.
        engine.submit(stretch(13)).unwrap();
        out.clear();
        engine.poll(4, &mut out);
        stage.on_part(&out[0], &mut state).unwrap();
        assert_eq!(state.pending.len(), 1_000);
        let mut restarted = WriteEngine::new(1, 1, 0, 1_000_000).numbered_from(1 << 40);
        taken(&mut restarted, stretch(17), 5, &mut stage, &mut state);
        assert_eq!(stage.commit(&mut state).map(|c| c.values), Some(3_000));
        assert!(state.landed[3_000..].iter().all(|&(_, v)| v == 17));
        assert_eq!(state.landed.len(), 6_000, "nothing of the old write");
    }
}
