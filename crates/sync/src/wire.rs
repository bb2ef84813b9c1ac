//! The sync messages, as docs/SYNC.md lays them out: a 40-byte header, then 24 bytes per
//! entry, or the entries as runs of consecutive locations where that is shorter
//! ([`FLAG_RUNS`]), every field big-endian, then with a configured [`Key`] a 32-byte MAC
//! (keyed BLAKE3 of everything before it). [`Message::decode`] checks the MAC, every length and
//! every field before it returns anything, so a malformed or spoofed message touches no
//! state; its errors are split by cause, for counting.

use crate::{Location, Update};

pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 40;
pub const ENTRY_LEN: usize = 24;
pub const MAC_LEN: usize = 32;
/// Entries that fit one UDP datagram on a 1,500-byte MTU (1,472 bytes of payload), with a
/// MAC.
pub const MAX_ENTRIES: usize = (1472 - HEADER_LEN - MAC_LEN) / ENTRY_LEN;
/// Entries that fit the largest UDP datagram (65,507 bytes of payload), with a MAC: what
/// a message may carry on a path that takes it whole (loopback's 64 KiB MTU).
pub const MAX_DATAGRAM_ENTRIES: usize = (65_507 - HEADER_LEN - MAC_LEN) / ENTRY_LEN;
/// A run's header: state (2 bytes), width (1), columns (1), first index (4), length (4),
/// threshold (8); a run in columns then has a byte for each column's width.
pub const RUN_HEADER_LEN: usize = 20;
/// Columns a run may have at most: a table's slot's words (64 at most).
pub const MAX_RUN_COLUMNS: usize = 64;
/// Entries a message carries at most as runs: what its count field holds.
pub const MAX_RUN_ENTRIES: usize = u16::MAX as usize;

/// What a message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Values the read handler sent: each was the data plane's when it was sent.
    Updates = 1,
    /// Values of the anti-entropy refresh: the same, for every location in turn.
    Refresh = 2,
    /// No entries: the stream is alive, and its threshold is the header's.
    Heartbeat = 3,
    /// From the collector to the switch, no entries: `seq` is the stream's last message
    /// the collector has seen, `t_max` the messages of the stream it found missing so far.
    Report = 4,
    /// From the collector to the switch, a part of a write: `seq` is the write's id,
    /// `t_max` the part's index (high 32 bits) and the write's parts (low 32 bits); each
    /// entry's `threshold` is its mode (`write::Mode`).
    Write = 5,
    /// From the switch to the collector: `seq` is the write's id, `t_max` the parts it holds
    /// of it, and the entries a bitmap of them (`index` the word, `value` its bits).
    WriteAck = 6,
    /// From the switch to the collector: what its synced states are. Each entry is one
    /// state: `state` its id, `index` its length in locations, `value` the words of one
    /// of its entries (1 for a register's cells, a slot's words for a table).
    Layout = 7,
    /// From the collector to the switch: the messages of the stream it lost and asks for
    /// again, each entry's `value` one's seq; `seq` is the last message it has seen.
    Nack = 8,
}

impl Kind {
    fn from_byte(b: u8) -> Option<Kind> {
        match b {
            1 => Some(Kind::Updates),
            2 => Some(Kind::Refresh),
            3 => Some(Kind::Heartbeat),
            4 => Some(Kind::Report),
            5 => Some(Kind::Write),
            6 => Some(Kind::WriteAck),
            7 => Some(Kind::Layout),
            8 => Some(Kind::Nack),
            _ => None,
        }
    }
}

/// The flag of a message that more of its batch follow: the messages a worker sends at
/// one instant are applied together, so that the collector's copy is always the data
/// plane's as of one instant.
pub const FLAG_MORE: u8 = 0x01;
/// The flag of a message that ends with a MAC.
pub const FLAG_MAC: u8 = 0x02;
/// The flag of a message whose entries go as runs: consecutive locations of one state
/// with one threshold, a run's values as narrow as its largest needs. The encoder sets it
/// where that is shorter (a refresh's, a write's: a register in order), so a write of
/// 65,536 small values is four datagrams on loopback, not 25.
pub const FLAG_RUNS: u8 = 0x04;

/// The bytes, 1, 2, 4 or 8, that `value` needs as an unsigned word.
pub fn narrowest_width(value: u64) -> usize {
    match value {
        0..=0xff => 1,
        0x100..=0xffff => 2,
        0x1_0000..=0xffff_ffff => 4,
        _ => 8,
    }
}

/// Appends each value of `run` in `width` bytes (one of [`narrowest_width`]'s, or 0 for a
/// run of zeros), big-endian: a copy of a fixed size per value, where a slice of the
/// value's bytes would be a call to copy a length known only then (a run's values are most
/// of a message's encoding).
pub(crate) fn put_values(values: impl Iterator<Item = u64>, width: usize, out: &mut Vec<u8>) {
    match width {
        0 => {}
        1 => out.extend(values.map(|v| v as u8)),
        2 => values.for_each(|v| out.extend_from_slice(&(v as u16).to_be_bytes())),
        4 => values.for_each(|v| out.extend_from_slice(&(v as u32).to_be_bytes())),
        _ => values.for_each(|v| out.extend_from_slice(&v.to_be_bytes())),
    }
}

/// The bytes, 0 to 8, that `value` takes in a column of a run: its bytes from the
/// highest that is not 0.
pub(crate) fn bytes_needed(value: u64) -> usize {
    (64 - value.leading_zeros() as usize).div_ceil(8)
}

/// The width of each column of a run in `widths.len()` columns that holds `values`: the
/// bytes its largest value needs. Each column's values or-ed, with no branch a value (a
/// fifth of the instructions of taking them row by row as [`RowWidths`] does, which a
/// run's encoding has no need of).
fn column_widths(values: &[u64], widths: &mut [u8]) {
    let mut any = [0u64; MAX_RUN_COLUMNS];
    let any = &mut any[..widths.len()];
    for row in values.chunks(widths.len()) {
        for (column, &value) in any.iter_mut().zip(row) {
            *column |= value;
        }
    }
    for (w, &column) in widths.iter_mut().zip(any.iter()) {
        *w = bytes_needed(column) as u8;
    }
}

/// The widths of a part's columns as its rows are taken: each column's values or-ed, the
/// bytes each then takes, and a row's. A column widens a few times a part, so that a row
/// costs its values' ors.
pub(crate) struct RowWidths {
    any: [u64; MAX_RUN_COLUMNS],
    widths: [usize; MAX_RUN_COLUMNS],
    row_bytes: usize,
}

impl Default for RowWidths {
    fn default() -> Self {
        RowWidths {
            any: [0; MAX_RUN_COLUMNS],
            widths: [0; MAX_RUN_COLUMNS],
            row_bytes: 0,
        }
    }
}

impl RowWidths {
    /// Takes a row (or the short last one); a row's bytes now.
    #[inline]
    pub(crate) fn take(&mut self, row: &[u64]) -> usize {
        for ((any, width), &value) in self.any.iter_mut().zip(&mut self.widths).zip(row) {
            if *any | value != *any {
                *any |= value;
                let wider = bytes_needed(*any);
                self.row_bytes += wider - *width;
                *width = wider;
            }
        }
        self.row_bytes
    }
}

/// The bytes of `len` values in columns of `widths`: value `i` takes column `i % columns`'s.
pub(crate) fn columns_bytes(widths: &[u8], len: usize) -> usize {
    let row: usize = widths.iter().map(|&w| usize::from(w)).sum();
    let rest = widths.iter().take(len % widths.len().max(1));
    (len / widths.len().max(1)) * row + rest.map(|&w| usize::from(w)).sum::<usize>()
}

/// Appends `values` in columns of `widths` (each 0 to 8 bytes; value `i` in column `i %
/// columns`), each value its column's width of low bytes, big-endian. Each value is
/// written as a whole word and the next written over its unused bytes, so that no value
/// is a copy of a length known only then.
pub(crate) fn put_in_columns(values: &[u64], widths: &[u8], out: &mut Vec<u8>) {
    let start = out.len();
    // Room for the last value's whole word.
    out.resize(start + columns_bytes(widths, values.len()) + 8, 0);
    let mut shifts = [0u32; MAX_RUN_COLUMNS];
    for (shift, &width) in shifts.iter_mut().zip(widths) {
        *shift = 64 - 8 * u32::from(width);
    }
    let columns = widths.len();
    let mut at = start;
    for row in values.chunks(columns) {
        for ((&value, &width), &shift) in row.iter().zip(widths).zip(&shifts[..columns]) {
            // A width of 0 (a shift of 64, taken as 0) writes the value whole where the
            // next one goes, or past the end: nothing of it stays.
            let high = value.wrapping_shl(shift);
            out[at..at + 8].copy_from_slice(&high.to_be_bytes());
            at += usize::from(width);
        }
    }
    out.truncate(at);
}

/// The entries a message's encoding reads: a message's own, or a write's values where
/// they are (a stretch of a register or a table's entries, never made into entries of 24
/// bytes each to be encoded).
pub trait Entries {
    fn count(&self) -> usize;
    /// Entry `i`, below [`Entries::count`].
    fn entry(&self, i: usize) -> Update;
    /// Appends the values of entries `start..start + len` in `width` bytes each (see
    /// [`narrowest_width`]; 0 writes nothing).
    fn put_values(&self, start: usize, len: usize, width: usize, out: &mut Vec<u8>);
    /// The entries as a stretch, if they are one (which is cut into runs by its values
    /// alone).
    fn stretch(&self) -> Option<Stretch<'_>> {
        None
    }
}

impl Entries for [Update] {
    fn count(&self) -> usize {
        self.len()
    }
    #[inline]
    fn entry(&self, i: usize) -> Update {
        self[i]
    }
    fn put_values(&self, start: usize, len: usize, width: usize, out: &mut Vec<u8>) {
        put_values(self[start..start + len].iter().map(|e| e.value), width, out);
    }
}

/// Values at `first` and the locations after it in its state, each with `threshold`: a
/// write of a register's values or of a table's entries as a migration moves them.
/// `columns` above 1 (and at most [`MAX_RUN_COLUMNS`]): the values are rows of that many
/// words (a table's slots), each word of a row as unlike the others as a key's address
/// and its flags, so that they go as a run in columns ([`put_in_columns`]).
#[derive(Clone, Copy, Debug)]
pub struct Stretch<'a> {
    pub first: Location,
    pub threshold: u64,
    pub values: &'a [u64],
    pub columns: usize,
}

impl Entries for Stretch<'_> {
    fn count(&self) -> usize {
        self.values.len()
    }
    #[inline]
    fn entry(&self, i: usize) -> Update {
        Update {
            location: Location {
                index: self.first.index.wrapping_add(i as u32),
                ..self.first
            },
            value: self.values[i],
            threshold: self.threshold,
        }
    }
    fn put_values(&self, start: usize, len: usize, width: usize, out: &mut Vec<u8>) {
        put_values(self.values[start..start + len].iter().copied(), width, out);
    }
    fn stretch(&self) -> Option<Stretch<'_>> {
        Some(*self)
    }
}

impl<'a> Stretch<'a> {
    /// Whether it goes as a run in columns: rows of 2 to [`MAX_RUN_COLUMNS`] words (the
    /// encoder's choice, which a write's cutting into parts follows).
    pub(crate) fn in_columns(&self) -> bool {
        (2..=MAX_RUN_COLUMNS).contains(&self.columns)
    }

    /// Its entries `range`, a stretch themselves.
    pub fn part(&self, range: std::ops::Range<usize>) -> Stretch<'a> {
        Stretch {
            first: Location {
                index: self.first.index.wrapping_add(range.start as u32),
                ..self.first
            },
            threshold: self.threshold,
            values: &self.values[range],
            columns: self.columns,
        }
    }
}

/// Whether `next` goes on the run that `last` ends: the next location of the same state,
/// with the same threshold.
fn continues_run(last: &Update, next: &Update) -> bool {
    next.location.state == last.location.state
        && last.location.index.checked_add(1) == Some(next.location.index)
        && next.threshold == last.threshold
}

/// A run of a message's entries: `len` of them from the `start`-th, each value in `width`
/// bytes (0: every value is 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Run {
    start: usize,
    len: usize,
    width: usize,
}

impl Run {
    fn bytes(&self) -> usize {
        RUN_HEADER_LEN + self.len * self.width
    }
}

/// Cuts entries, pushed one by one, into runs: consecutive locations of one state with one
/// threshold, and within them zeros in a row as runs of width 0 (no value bytes: a
/// table's empty slots, most of a refresh of a large table) wherever that saves more
/// bytes than the run headers the cut adds. The one cutting that both the encoder and
/// [`EncodedSize`] follow, so that the size is the encoding's.
#[derive(Clone, Debug, Default)]
struct RunCutter {
    pushed: usize,
    open: Option<OpenRun>,
}

/// The run a [`RunCutter`] has not closed yet.
#[derive(Clone, Copy, Debug)]
struct OpenRun {
    last: Update,
    len: usize,
    /// The width its values take but for the zeros that end it (0: none but them).
    width: usize,
    /// The zeros that end it.
    zeros: usize,
}

/// Whether `zeros` zeros go as a run of their own rather than as values `width` bytes
/// wide, the cut adding `headers` run headers.
fn cut_zeros(zeros: usize, width: usize, headers: usize) -> bool {
    zeros * width.max(1) > headers * RUN_HEADER_LEN
}

impl RunCutter {
    /// Takes the next entry; `closed` gets each run it ends. The run going on is changed
    /// in place: a write's or a refresh's entries are mostly that.
    #[inline]
    fn push(&mut self, e: &Update, closed: impl FnMut(Run)) {
        match &self.open {
            Some(open) if continues_run(&open.last, e) => self.push_next(e.value, closed),
            _ => {
                if let Some(open) = &self.open {
                    Self::close_at_end(self.pushed, open, closed);
                }
                self.pushed += 1;
                self.open = Some(OpenRun::fresh(e, e.value == 0));
            }
        }
    }

    /// Takes a stretch's entries, as [`RunCutter::push`] each: all but the first continue
    /// the run the first opens or goes on, and are taken by their values alone.
    #[inline]
    fn push_stretch(&mut self, stretch: &Stretch, mut closed: impl FnMut(Run)) {
        if let Some(rest) = stretch.values.get(1..) {
            // The first opens a run or goes on the open one: a run is open for the rest.
            self.push(&stretch.entry(0), &mut closed);
            rest.iter()
                .for_each(|&value| self.push_next(value, &mut closed));
        }
    }

    /// Takes the value of the next entry, which continues the open run (the next location
    /// of its state, with its threshold). Callers push it only where a run is open.
    #[inline]
    fn push_next(&mut self, value: u64, mut closed: impl FnMut(Run)) {
        let at = self.pushed;
        self.pushed += 1;
        let Some(open) = &mut self.open else {
            return;
        };
        open.last.location.index = open.last.location.index.wrapping_add(1);
        open.last.value = value;
        if value == 0 {
            open.zeros += 1;
        } else if open.zeros == 0 {
            open.width = open.width.max(narrowest_width(value));
        } else {
            let kept = open.width.max(narrowest_width(value));
            // Zeros between values: cut out, the run goes on after them as a new one
            // (two headers more; one if they began it).
            let headers = if open.len > open.zeros { 2 } else { 1 };
            if cut_zeros(open.zeros, kept, headers) {
                Self::close(at, open, true, &mut closed);
                let next = open.last;
                *open = OpenRun::fresh(&next, false);
                return;
            }
            // The zeros stay values of this run, a byte each at least.
            open.width = kept;
            open.zeros = 0;
        }
        open.len += 1;
    }

    /// Ends the open run.
    fn finish(&mut self, closed: impl FnMut(Run)) {
        if let Some(open) = self.open.take() {
            Self::close_at_end(self.pushed, &open, closed);
        }
    }

    /// `open`, ended by the end of its locations (see [`OpenRun::runs_at_end`]).
    fn close_at_end(end: usize, open: &OpenRun, mut closed: impl FnMut(Run)) {
        open.runs_at_end(end)
            .into_iter()
            .flatten()
            .for_each(&mut closed);
    }

    /// `open`, whose last entry is the one before entry `end` (see [`OpenRun::runs`]).
    fn close(end: usize, open: &OpenRun, cut: bool, mut closed: impl FnMut(Run)) {
        open.runs(end, cut)
            .into_iter()
            .flatten()
            .for_each(&mut closed);
    }
}

impl OpenRun {
    /// A run of `e` alone (`zero`: a zero that may go as a run of width 0).
    fn fresh(e: &Update, zero: bool) -> OpenRun {
        OpenRun {
            last: *e,
            len: 1,
            width: if zero { 0 } else { narrowest_width(e.value) },
            zeros: usize::from(zero),
        }
    }

    /// The runs it makes, its last entry the one before entry `end`: one run, or with
    /// `cut` its values (if any) and then its zeros as a run of width 0.
    fn runs(&self, end: usize, cut: bool) -> [Option<Run>; 2] {
        let OpenRun {
            len, width, zeros, ..
        } = *self;
        let start = end - len;
        let head = len - zeros;
        if cut {
            let values = (head > 0).then_some(Run {
                start,
                len: head,
                width,
            });
            let zeros = Run {
                start: end - zeros,
                len: zeros,
                width: 0,
            };
            [values, Some(zeros)]
        } else {
            let width = if zeros > 0 { width.max(1) } else { width };
            [Some(Run { start, len, width }), None]
        }
    }

    /// As [`OpenRun::runs`], ended by the end of its locations: its zeros cut out when that
    /// is shorter (always, when the run is all zeros).
    fn runs_at_end(&self, end: usize) -> [Option<Run>; 2] {
        let cut =
            self.zeros > 0 && (self.len == self.zeros || cut_zeros(self.zeros, self.width, 1));
        self.runs(end, cut)
    }
}

/// The size of a message of entries pushed one by one, as [`Message::encode`] writes it
/// (runs where they are shorter): what lets a write be cut into parts of the most values
/// a datagram carries. `default()`: a message with no entries yet.
#[derive(Clone, Debug, Default)]
pub struct EncodedSize {
    count: usize,
    cutter: RunCutter,
    /// The runs closed so far, in bytes.
    closed_runs: usize,
}

impl EncodedSize {
    #[inline]
    pub fn push(&mut self, e: &Update) {
        self.count += 1;
        let closed_runs = &mut self.closed_runs;
        self.cutter.push(e, |run| *closed_runs += run.bytes());
    }

    /// As [`EncodedSize::push`] each of `entries`, a stretch's by their values alone.
    pub fn push_all(&mut self, entries: &(impl Entries + ?Sized)) {
        self.count += entries.count();
        let closed_runs = &mut self.closed_runs;
        let mut closed = |run: Run| *closed_runs += run.bytes();
        match entries.stretch() {
            Some(stretch) => self.cutter.push_stretch(&stretch, closed),
            None => {
                (0..entries.count()).for_each(|i| self.cutter.push(&entries.entry(i), &mut closed))
            }
        }
    }

    pub fn count(&self) -> usize {
        self.count
    }

    /// The entries' bytes as runs, the open one ended here. A few sums, no copy: a
    /// write's parts are cut by asking it after every value.
    #[inline]
    fn runs_bytes(&self) -> usize {
        let open = (self.cutter.open.iter())
            .flat_map(|open| open.runs_at_end(self.cutter.pushed))
            .flatten()
            .map(|run| run.bytes())
            .sum::<usize>();
        self.closed_runs + open
    }

    /// The entries' bytes, and whether they go as runs (where that is shorter).
    #[inline]
    fn entries_bytes(&self) -> (usize, bool) {
        let runs = self.runs_bytes();
        let entries = self.count * ENTRY_LEN;
        match self.count <= MAX_RUN_ENTRIES && runs < entries {
            true => (runs, true),
            false => (entries, false),
        }
    }

    /// The message's bytes, its header included, its MAC not.
    #[inline]
    pub fn bytes(&self) -> usize {
        HEADER_LEN + self.entries_bytes().0
    }
}

/// Appends `stretch` as one run in its columns, each column as narrow as its largest
/// value.
fn put_columns_run(stretch: &Stretch, out: &mut Vec<u8>) {
    let mut widths = [0; MAX_RUN_COLUMNS];
    let widths = &mut widths[..stretch.columns];
    column_widths(stretch.values, widths);
    out.extend_from_slice(&stretch.first.state.to_be_bytes());
    out.extend_from_slice(&[0, stretch.columns as u8]);
    out.extend_from_slice(&stretch.first.index.to_be_bytes());
    out.extend_from_slice(&(stretch.values.len() as u32).to_be_bytes());
    out.extend_from_slice(&stretch.threshold.to_be_bytes());
    out.extend_from_slice(widths);
    put_in_columns(stretch.values, widths, out);
}

/// The bytes of a message carrying `len` values in columns of `widths` as one run, its
/// header included, its MAC not (what [`Message::encode_carrying`] writes for a stretch in
/// columns, but where 24-byte entries are shorter).
pub(crate) fn columns_message_bytes(widths: &[u8], len: usize) -> usize {
    HEADER_LEN + RUN_HEADER_LEN + widths.len() + columns_bytes(widths, len)
}

/// Where a message's kind and sending time lie in its header.
const KIND_AT: usize = 1;
const SENT_NS_AT: usize = 24;

/// A message encoded once to go many times, each time with its own sending time: a
/// write's part, sent until it is acknowledged, is not encoded again for each
/// transmission.
#[derive(Clone, Debug)]
pub struct Resendable {
    bytes: Vec<u8>,
    /// The key it was encoded with, which makes its MAC again at each sending.
    key: Option<Key>,
}

impl Resendable {
    /// `header`'s message carrying `entries` ([`Message::encode_carrying`]).
    pub fn new(header: &Message, entries: &(impl Entries + ?Sized), key: Option<&Key>) -> Self {
        let mut bytes = Vec::new();
        header.encode_carrying(entries, key, &mut bytes);
        Resendable {
            bytes,
            key: key.cloned(),
        }
    }

    /// The datagram to send at `sent_ns`: its sending time set, and its MAC made again.
    pub fn stamped(&mut self, sent_ns: u64) -> &[u8] {
        self.bytes[SENT_NS_AT..SENT_NS_AT + 8].copy_from_slice(&sent_ns.to_be_bytes());
        if let Some(key) = &self.key {
            let end = self.bytes.len() - MAC_LEN;
            let mac = key.mac(&self.bytes[..end]);
            self.bytes[end..].copy_from_slice(mac.as_bytes());
        }
        &self.bytes
    }
}

/// The key switches and collector share: every message carries a MAC made with it, and
/// one without, or with a wrong one, is refused.
#[derive(Clone)]
pub struct Key([u8; 32]);

impl Key {
    pub fn new(bytes: [u8; 32]) -> Key {
        Key(bytes)
    }

    /// A key from its 64 hexadecimal digits (as a configuration gives it).
    pub fn from_hex(text: &str) -> Result<Key, String> {
        let text = text.trim();
        if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "a key is 64 hexadecimal digits (32 bytes), not {} characters",
                text.len()
            ));
        }
        let mut bytes = [0; 32];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
        }
        Ok(Key(bytes))
    }

    fn mac(&self, bytes: &[u8]) -> blake3::Hash {
        blake3::keyed_hash(&self.0, bytes)
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

/// One message of one stream (a worker's) of one switch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub kind: Kind,
    pub switch: u32,
    /// Changes when the switch starts again: its streams start over.
    pub epoch: u32,
    pub stream: u16,
    /// 1 for the stream's first message, one more for each after it.
    pub seq: u64,
    /// The sender's clock when it sent the message.
    pub sent_ns: u64,
    /// The largest threshold in force since the stream's message before this one (since
    /// the stream began, for its first): every location not in this message or a later one
    /// is within `divergence_bound(t_max)` of what the collector holds.
    pub t_max: u64,
    /// More messages of the same batch follow this one (`FLAG_MORE`).
    pub more: bool,
    pub entries: Vec<Update>,
}

/// Why a message was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than its header, or than the entries its header counts.
    Truncated {
        need: usize,
        have: usize,
    },
    /// Longer than the entries its header counts.
    Trailing {
        expected: usize,
        have: usize,
    },
    Version(u8),
    Kind(u8),
    /// Flags this version does not know (`FLAG_MORE` and `FLAG_MAC` are the ones).
    Flags(u8),
    /// No MAC where the collector has a key, or one where it has none.
    MissingMac,
    UnexpectedMac,
    /// A MAC that the key did not make: spoofed, or damaged on the way.
    BadMac,
    /// A reserved byte not zero.
    Reserved,
    /// More entries than fit one message, or entries in a heartbeat.
    Count(u16),
    /// A run of no entries, of a width not 1, 2, 4 or 8, past the last index, or past the
    /// entries the header counts.
    Run,
}

impl DecodeError {
    /// The reason's name, for counters.
    pub fn reason(&self) -> &'static str {
        match self {
            DecodeError::Truncated { .. } => "truncated",
            DecodeError::Trailing { .. } => "trailing_bytes",
            DecodeError::Version(_) => "bad_version",
            DecodeError::Kind(_) => "unknown_kind",
            DecodeError::Flags(_) => "unknown_flags",
            DecodeError::Reserved => "reserved_not_zero",
            DecodeError::Count(_) => "bad_count",
            DecodeError::MissingMac => "missing_mac",
            DecodeError::UnexpectedMac => "unexpected_mac",
            DecodeError::BadMac => "bad_mac",
            DecodeError::Run => "bad_run",
        }
    }
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Truncated { need, have } => {
                write!(f, "truncated: {have} bytes where {need} are needed")
            }
            DecodeError::Trailing { expected, have } => {
                write!(f, "{have} bytes where the entries end at {expected}")
            }
            DecodeError::Version(v) => write!(f, "version {v}, where {VERSION} is known"),
            DecodeError::Kind(k) => write!(f, "unknown message kind {k}"),
            DecodeError::Flags(x) => write!(f, "unknown flags {x:#04x}"),
            DecodeError::Reserved => write!(f, "a reserved byte is not zero"),
            DecodeError::Count(n) => write!(f, "{n} entries, which this kind cannot carry"),
            DecodeError::MissingMac => write!(f, "no MAC, and a key is configured"),
            DecodeError::UnexpectedMac => write!(f, "a MAC, and no key is configured"),
            DecodeError::BadMac => write!(f, "a MAC that the configured key did not make"),
            DecodeError::Run => write!(
                f,
                "a run that is empty, of a width not 0, 1, 2, 4 or 8, in more than 64 \
                 columns or columns wider than 8 bytes, past the last index or past the \
                 entries counted"
            ),
        }
    }
}

impl std::error::Error for DecodeError {}

/// A reader that cannot read past its buffer: each read is of a length checked before.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0; N];
        // The caller checked the length of everything it reads.
        if let Some(b) = self.bytes.get(self.at..self.at + N) {
            out.copy_from_slice(b);
        }
        self.at += N;
        out
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.take())
    }
    fn left(&self) -> usize {
        self.bytes.len().saturating_sub(self.at)
    }
}

/// The big-endian words of `N` bytes that `bytes` holds (whole ones).
fn words<const N: usize>(bytes: &[u8]) -> impl Iterator<Item = u64> + '_ {
    bytes.chunks_exact(N).map(|b| {
        let mut word = [0; 8];
        word[8 - N..].copy_from_slice(b);
        u64::from_be_bytes(word)
    })
}

/// A message borrowed, for a taker that copies what it keeps ([`crate::write::WriteStage::on_part`]).
impl<'a> From<&'a Message> for std::borrow::Cow<'a, Message> {
    fn from(message: &'a Message) -> Self {
        std::borrow::Cow::Borrowed(message)
    }
}

/// A message given, for a taker that keeps its entries without copying them.
impl From<Message> for std::borrow::Cow<'_, Message> {
    fn from(message: Message) -> Self {
        std::borrow::Cow::Owned(message)
    }
}

impl Message {
    /// A message of `kind` with this one's switch, epoch, stream, sequence and sending
    /// time (an answer to it), and the given `t_max` and entries: never a copy of this
    /// one's entries, which a write's part holds thousands of.
    pub fn answer(&self, kind: Kind, t_max: u64, entries: Vec<Update>) -> Message {
        Message {
            kind,
            switch: self.switch,
            epoch: self.epoch,
            stream: self.stream,
            seq: self.seq,
            sent_ns: self.sent_ns,
            t_max,
            more: false,
            entries,
        }
    }

    /// Appends the message's bytes to `out`, with no MAC.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.encode_with(None, out);
    }

    /// Appends the message's bytes to `out`, ending with a MAC made with `key` if given.
    pub fn encode_with(&self, key: Option<&Key>, out: &mut Vec<u8>) {
        self.encode_carrying(&self.entries[..], key, out);
    }

    /// As [`Message::encode_with`], carrying `entries` in place of the message's own (which
    /// are not read): a write's part is encoded from the write's values where they are.
    pub fn encode_carrying(
        &self,
        entries: &(impl Entries + ?Sized),
        key: Option<&Key>,
        out: &mut Vec<u8>,
    ) {
        let start = out.len();
        let count = entries.count();
        // Room for a message of values 8 bytes wide in one run (a write's part, the most
        // bytes its runs take): what `out` need not grow past.
        out.reserve(HEADER_LEN + RUN_HEADER_LEN + count * 8 + MAC_LEN);
        let mut flags = if self.more { FLAG_MORE } else { 0 };
        if key.is_some() {
            flags |= FLAG_MAC;
        }
        out.extend_from_slice(&[VERSION, self.kind as u8, flags, 0]);
        out.extend_from_slice(&self.switch.to_be_bytes());
        out.extend_from_slice(&self.epoch.to_be_bytes());
        out.extend_from_slice(&self.stream.to_be_bytes());
        out.extend_from_slice(&(count as u16).to_be_bytes());
        out.extend_from_slice(&self.seq.to_be_bytes());
        debug_assert_eq!(out.len() - start, SENT_NS_AT);
        out.extend_from_slice(&self.sent_ns.to_be_bytes());
        out.extend_from_slice(&self.t_max.to_be_bytes());
        // The entries go as runs where that is shorter ([`EncodedSize`]'s rule): written as
        // runs first (a write's are a few bytes a value), and again as entries where the
        // runs come out no shorter, so that they are cut once, not measured first. The
        // runs' bytes only grow as they are cut: once those written reach the entries'
        // (scattered locations, wide values), the cutting stops.
        let body = out.len();
        let entries_bytes = count * ENTRY_LEN;
        let runs = count <= MAX_RUN_ENTRIES && {
            let put = |run: Run, out: &mut Vec<u8>| {
                let first = entries.entry(run.start);
                out.extend_from_slice(&first.location.state.to_be_bytes());
                out.extend_from_slice(&[run.width as u8, 0]);
                out.extend_from_slice(&first.location.index.to_be_bytes());
                out.extend_from_slice(&(run.len as u32).to_be_bytes());
                out.extend_from_slice(&first.threshold.to_be_bytes());
                entries.put_values(run.start, run.len, run.width, out);
            };
            let mut cutter = RunCutter::default();
            let shorter = |out: &Vec<u8>| out.len() - body < entries_bytes;
            match entries.stretch() {
                Some(stretch) if stretch.in_columns() => put_columns_run(&stretch, out),
                // Shorter as runs, two entries or more: a run's header and 8 bytes a value
                // at most, where a cut of zeros only saves bytes.
                Some(stretch) => cutter.push_stretch(&stretch, |run| put(run, out)),
                None => {
                    for i in 0..count {
                        cutter.push(&entries.entry(i), |run| put(run, out));
                        if !shorter(out) {
                            break;
                        }
                    }
                }
            }
            shorter(out) && {
                cutter.finish(|run| put(run, out));
                shorter(out)
            }
        };
        if runs {
            out[start + 2] |= FLAG_RUNS;
        } else {
            out.truncate(body);
            out.reserve(entries_bytes + MAC_LEN);
            for e in (0..count).map(|i| entries.entry(i)) {
                out.extend_from_slice(&e.location.state.to_be_bytes());
                out.extend_from_slice(&[0, 0]);
                out.extend_from_slice(&e.location.index.to_be_bytes());
                out.extend_from_slice(&e.value.to_be_bytes());
                out.extend_from_slice(&e.threshold.to_be_bytes());
            }
        }
        if let Some(key) = key {
            let mac = key.mac(&out[start..]);
            out.extend_from_slice(mac.as_bytes());
        }
    }

    /// Reads one message with no MAC, all of `bytes`, or says why not.
    pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
        Message::decode_with(None, bytes)
    }

    /// The kind a datagram's header names, from that byte alone, nothing checked (the
    /// datagram may still be refused whole): for a reader that passes over the other
    /// kinds without decoding them.
    pub fn kind_named(bytes: &[u8]) -> Option<Kind> {
        Kind::from_byte(*bytes.get(KIND_AT)?)
    }

    /// Reads one message, all of `bytes`, whose MAC `key` must have made (and which must
    /// have none where `key` is `None`), or says why not.
    pub fn decode_with(key: Option<&Key>, bytes: &[u8]) -> Result<Message, DecodeError> {
        Message::decode_unless_held(key, bytes, |_| false)
    }

    /// As [`Message::decode_with`], but a message whose header (the message with no
    /// entries) `held` says is held already comes back with no entries, which are not
    /// read: a switch takes a copy of a write part it holds from its header alone (its
    /// MAC checked), where reading a 64 KB part's values writes 8,000 entries of 24 bytes.
    pub fn decode_unless_held(
        key: Option<&Key>,
        bytes: &[u8],
        held: impl FnOnce(&Message) -> bool,
    ) -> Result<Message, DecodeError> {
        Message::decode_body(key, bytes, held, false).map(|(message, _)| message)
    }

    /// As [`Message::decode_unless_held`], but a write's part whose runs make one stretch
    /// (consecutive locations of one state with one threshold: a large write's parts, a
    /// register's or a table's) comes back as the stretch's values, its entries left
    /// empty: a switch keeps a part's values, never 24 bytes an entry.
    pub fn decode_write_part(
        key: Option<&Key>,
        bytes: &[u8],
        held: impl FnOnce(&Message) -> bool,
    ) -> Result<(Message, Option<StretchValues>), DecodeError> {
        Message::decode_body(key, bytes, held, true)
    }

    fn decode_body(
        key: Option<&Key>,
        bytes: &[u8],
        held: impl FnOnce(&Message) -> bool,
        write_as_stretch: bool,
    ) -> Result<(Message, Option<StretchValues>), DecodeError> {
        let bytes = match (key, bytes.get(2).map(|f| f & FLAG_MAC != 0)) {
            (Some(key), Some(true)) => {
                let Some(body_len) = bytes.len().checked_sub(MAC_LEN) else {
                    return Err(DecodeError::Truncated {
                        need: HEADER_LEN + MAC_LEN,
                        have: bytes.len(),
                    });
                };
                let (body, mac) = bytes.split_at(body_len);
                let mut given = [0; MAC_LEN];
                given.copy_from_slice(mac);
                // blake3::Hash compares in constant time.
                if key.mac(body) != blake3::Hash::from_bytes(given) {
                    return Err(DecodeError::BadMac);
                }
                body
            }
            (Some(_), Some(false)) => return Err(DecodeError::MissingMac),
            (None, Some(true)) => return Err(DecodeError::UnexpectedMac),
            _ => bytes,
        };
        let have = bytes.len();
        if have < HEADER_LEN {
            return Err(DecodeError::Truncated {
                need: HEADER_LEN,
                have,
            });
        }
        let mut r = Reader { bytes, at: 0 };
        let version = r.u8();
        if version != VERSION {
            return Err(DecodeError::Version(version));
        }
        let kind_byte = r.u8();
        let kind = Kind::from_byte(kind_byte).ok_or(DecodeError::Kind(kind_byte))?;
        let flags = r.u8();
        if flags & !(FLAG_MORE | FLAG_MAC | FLAG_RUNS) != 0 {
            return Err(DecodeError::Flags(flags));
        }
        if r.u8() != 0 {
            return Err(DecodeError::Reserved);
        }
        let (switch, epoch, stream, count) = (r.u32(), r.u32(), r.u16(), r.u16());
        let (seq, sent_ns, t_max) = (r.u64(), r.u64(), r.u64());
        let n = usize::from(count);
        let entries_allowed = !matches!(kind, Kind::Heartbeat | Kind::Report);
        let runs = flags & FLAG_RUNS != 0;
        if (!runs && n > MAX_DATAGRAM_ENTRIES) || (!entries_allowed && n > 0) {
            return Err(DecodeError::Count(count));
        }
        let mut message = Message {
            kind,
            switch,
            epoch,
            stream,
            seq,
            sent_ns,
            t_max,
            more: flags & FLAG_MORE != 0,
            entries: Vec::new(),
        };
        if n > 0 && held(&message) {
            return Ok((message, None));
        }
        let body = r.at;
        let stretch = match write_as_stretch && runs && kind == Kind::Write && n > 0 {
            true => Self::decode_stretch(&mut r, n)?,
            false => None,
        };
        if stretch.is_none() {
            r.at = body;
            message.entries = if runs {
                Self::decode_runs(&mut r, n)?
            } else {
                Self::decode_entries(&mut r, n)?
            };
        }
        if r.left() > 0 {
            return Err(DecodeError::Trailing {
                expected: r.at,
                have,
            });
        }
        Ok((message, stretch))
    }

    /// `n` entries of 24 bytes each.
    fn decode_entries(r: &mut Reader, n: usize) -> Result<Vec<Update>, DecodeError> {
        let need = r.at + n * ENTRY_LEN;
        if r.bytes.len() < need {
            return Err(DecodeError::Truncated {
                need,
                have: r.bytes.len(),
            });
        }
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let state = r.u16();
            if r.u16() != 0 {
                return Err(DecodeError::Reserved);
            }
            let index = r.u32();
            let (value, threshold) = (r.u64(), r.u64());
            entries.push(Update {
                location: Location { state, index },
                value,
                threshold,
            });
        }
        Ok(entries)
    }

    /// `n` entries as runs, each checked before its values are read.
    fn decode_runs(r: &mut Reader, n: usize) -> Result<Vec<Update>, DecodeError> {
        // Room for as many entries as the bytes could hold as values (a run of zeros holds
        // any number in its header alone; `n` is 65,535 at most).
        let mut entries = Vec::with_capacity(n.min(r.left()));
        read_runs(r, n, |run, values| {
            let RunHeader {
                state,
                first,
                threshold,
                ..
            } = run;
            run.values_into(values, &mut entries, |i, value| Update {
                location: Location {
                    state,
                    index: first + i as u32,
                },
                value,
                threshold,
            });
            true
        })?;
        Ok(entries)
    }

    /// `n` entries as runs, read as one stretch's values; `None` where the runs do not
    /// make one (each checked as [`Message::decode_runs`] checks it, up to the first that
    /// does not continue the one before).
    fn decode_stretch(r: &mut Reader, n: usize) -> Result<Option<StretchValues>, DecodeError> {
        let mut stretch: Option<StretchValues> = None;
        read_runs(r, n, |run, values| {
            let s = stretch.get_or_insert_with(|| StretchValues {
                first: Location {
                    state: run.state,
                    index: run.first,
                },
                threshold: run.threshold,
                values: Vec::with_capacity(n),
            });
            let continues = run.state == s.first.state
                && run.threshold == s.threshold
                && u64::from(s.first.index) + s.values.len() as u64 == u64::from(run.first);
            if continues {
                run.values_onto(values, &mut s.values);
            }
            continues
        })
        .map(|whole| stretch.filter(|_| whole))
    }
}

/// A write's part as one stretch of values ([`Message::decode_write_part`]): `values` set
/// at `first` and the locations after it in its state, each with `threshold`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StretchValues {
    pub first: Location,
    pub threshold: u64,
    pub values: Vec<u64>,
}

impl StretchValues {
    /// Its values as entries.
    pub fn updates(&self) -> impl Iterator<Item = Update> + '_ {
        let stretch = Stretch {
            first: self.first,
            threshold: self.threshold,
            values: &self.values,
            columns: 1,
        };
        (0..self.values.len()).map(move |i| stretch.entry(i))
    }
}

/// A run's header, as read.
#[derive(Clone, Copy, Debug)]
struct RunHeader<'a> {
    state: u16,
    first: u32,
    len: usize,
    width: usize,
    /// A run in columns: each one's width (empty: one width, `width`, for every value).
    widths: &'a [u8],
    threshold: u64,
}

impl RunHeader<'_> {
    /// Appends `make(i, value)` for each of the run's values (`bytes`, checked to be its
    /// `len` values of its width): one loop a width, each value read as a fixed-size array,
    /// so that a part's thousands of values are read with no bounds check or width's
    /// shift each.
    #[inline]
    fn values_into<T>(&self, bytes: &[u8], out: &mut Vec<T>, make: impl Fn(usize, u64) -> T) {
        if !self.widths.is_empty() {
            return self.values_in_columns_into(bytes, out, make);
        }
        match self.width {
            0 => out.extend((0..self.len).map(|i| make(i, 0))),
            1 => out.extend((bytes.iter().enumerate()).map(|(i, &b)| make(i, u64::from(b)))),
            2 => out.extend(words::<2>(bytes).enumerate().map(|(i, v)| make(i, v))),
            4 => out.extend(words::<4>(bytes).enumerate().map(|(i, v)| make(i, v))),
            _ => out.extend(words::<8>(bytes).enumerate().map(|(i, v)| make(i, v))),
        }
    }

    /// As [`RunHeader::values_into`], for a run in columns.
    fn values_in_columns_into<T>(
        &self,
        bytes: &[u8],
        out: &mut Vec<T>,
        make: impl Fn(usize, u64) -> T,
    ) {
        let mut values = vec![0; self.len];
        self.values_in_columns(bytes, &mut values);
        out.extend(values.into_iter().enumerate().map(|(i, v)| make(i, v)));
    }

    /// Appends the run's values to `out` (a write's part read as a stretch).
    fn values_onto(&self, bytes: &[u8], out: &mut Vec<u64>) {
        if self.widths.is_empty() {
            return self.values_into(bytes, out, |_, value| value);
        }
        let start = out.len();
        out.resize(start + self.len, 0);
        self.values_in_columns(bytes, &mut out[start..]);
    }

    /// A run in columns' values (`bytes`, checked to be its `len` values in its columns)
    /// into `out` (`len` of them): column by column over the whole rows, each read at its
    /// constant width (a part's tens of thousands of values, with no branch on widths),
    /// then the short last row.
    fn values_in_columns(&self, bytes: &[u8], out: &mut [u64]) {
        let columns = self.widths.len();
        let row_bytes = columns_bytes(self.widths, columns);
        let rows = self.len / columns;
        let (whole, short) = out.split_at_mut(rows * columns);
        let mut offset = 0;
        for (j, &width) in self.widths.iter().enumerate() {
            let column = Column {
                bytes,
                row_bytes,
                offset,
            };
            let values = whole.iter_mut().skip(j).step_by(columns);
            match width {
                0 => values.for_each(|v| *v = 0),
                1 => column.read::<1>(values),
                2 => column.read::<2>(values),
                3 => column.read::<3>(values),
                4 => column.read::<4>(values),
                5 => column.read::<5>(values),
                6 => column.read::<6>(values),
                7 => column.read::<7>(values),
                _ => column.read::<8>(values),
            }
            offset += usize::from(width);
        }
        let mut at = rows * row_bytes;
        for (value, &width) in short.iter_mut().zip(self.widths) {
            let width = usize::from(width);
            *value = (u128::from(word_at(bytes, at)) >> (64 - 8 * width)) as u64;
            at += width;
        }
    }
}

/// A column of a run's whole rows: its values lie `offset` bytes into each row of
/// `row_bytes`.
struct Column<'a> {
    bytes: &'a [u8],
    row_bytes: usize,
    offset: usize,
}

impl Column<'_> {
    /// Its values, each `W` bytes big-endian, into `out` (one a row).
    #[inline]
    fn read<'v, const W: usize>(&self, out: impl Iterator<Item = &'v mut u64>) {
        for (row, value) in out.enumerate() {
            let at = row * self.row_bytes + self.offset;
            let mut word = [0; 8];
            if let Some(b) = self.bytes.get(at..at + W) {
                word[8 - W..].copy_from_slice(b);
            }
            *value = u64::from_be_bytes(word);
        }
    }
}

/// The big-endian word of the 8 bytes at `at` (those past the end of `bytes` taken as 0:
/// a run's last values).
#[inline]
fn word_at(bytes: &[u8], at: usize) -> u64 {
    match bytes.get(at..at + 8) {
        Some(word) => u64::from_be_bytes(word.try_into().unwrap_or_default()),
        None => {
            let mut word = [0; 8];
            let have = bytes.get(at..).unwrap_or_default();
            let n = have.len().min(8);
            word[..n].copy_from_slice(&have[..n]);
            u64::from_be_bytes(word)
        }
    }
}

/// Reads `n` entries' runs, each checked before its values are read, handing each with
/// its values' bytes to `each` until it says to stop; whether it never did.
fn read_runs(
    r: &mut Reader,
    n: usize,
    mut each: impl FnMut(RunHeader, &[u8]) -> bool,
) -> Result<bool, DecodeError> {
    let truncated = |r: &Reader, len: usize| DecodeError::Truncated {
        need: r.at + len,
        have: r.bytes.len(),
    };
    let mut read = 0;
    while read < n {
        if r.left() < RUN_HEADER_LEN {
            return Err(truncated(r, RUN_HEADER_LEN));
        }
        let (state, width, columns) = (r.u16(), usize::from(r.u8()), usize::from(r.u8()));
        let (first, len, threshold) = (r.u32(), r.u32() as usize, r.u64());
        let widths_fit = match columns {
            0 => matches!(width, 0 | 1 | 2 | 4 | 8),
            _ => width == 0 && columns <= MAX_RUN_COLUMNS,
        };
        let fits =
            len > 0 && len <= n - read && first.checked_add(len as u32 - 1).is_some() && widths_fit;
        if !fits {
            return Err(DecodeError::Run);
        }
        let Some(widths) = r.bytes.get(r.at..r.at + columns) else {
            return Err(truncated(r, columns));
        };
        if widths.iter().any(|&w| w > 8) {
            return Err(DecodeError::Run);
        }
        r.at += columns;
        let bytes = match columns {
            0 => len * width,
            _ => columns_bytes(widths, len),
        };
        let Some(values) = r.bytes.get(r.at..r.at + bytes) else {
            return Err(truncated(r, bytes));
        };
        r.at += bytes;
        read += len;
        let run = RunHeader {
            state,
            first,
            len,
            width,
            widths,
            threshold,
        };
        if !each(run, values) {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn message(entries: usize) -> Message {
        Message {
            kind: Kind::Updates,
            switch: 7,
            epoch: 3,
            stream: 1,
            seq: u64::MAX,
            sent_ns: 123,
            t_max: 9,
            more: true,
            entries: (0..entries as u32)
                .map(|i| Update {
                    location: Location {
                        state: u16::MAX,
                        index: u32::MAX - i,
                    },
                    value: u64::MAX - u64::from(i),
                    threshold: 4,
                })
                .collect(),
        }
    }

    #[test]
    fn the_largest_message_round_trips_and_fits_a_datagram() {
        let m = message(MAX_ENTRIES);
        let mut bytes = Vec::new();
        m.encode(&mut bytes);
        assert!(bytes.len() <= 1472);
        assert_eq!(Message::decode(&bytes), Ok(m));
    }

    /// The most entries a message may carry, with a MAC, fit one UDP datagram, and come
    /// back whole; one more is refused.
    #[test]
    fn the_largest_message_fits_a_datagram() {
        let key = Key::new([3; 32]);
        let mut bytes = Vec::new();
        message(MAX_DATAGRAM_ENTRIES).encode_with(Some(&key), &mut bytes);
        assert!(bytes.len() <= 65_507, "{}", bytes.len());
        let back = Message::decode_with(Some(&key), &bytes).unwrap();
        assert_eq!(back.entries.len(), MAX_DATAGRAM_ENTRIES);
        let mut over = Vec::new();
        message(MAX_DATAGRAM_ENTRIES + 1).encode(&mut over);
        assert_eq!(
            Message::decode(&over).map_err(|e| e.reason()),
            Err("bad_count")
        );
    }

    /// Each field's fault is refused with its own reason, and every cut is refused.
    #[test]
    fn malformed_messages_are_refused_by_reason() {
        let mut good = Vec::new();
        message(2).encode(&mut good);
        let with = |at: usize, b: u8| {
            let mut bad = good.clone();
            bad[at] = b;
            Message::decode(&bad).map_err(|e| e.reason())
        };
        assert_eq!(with(0, 2), Err("bad_version"));
        assert_eq!(with(1, 9), Err("unknown_kind"));
        assert_eq!(with(2, 8), Err("unknown_flags"));
        assert_eq!(with(3, 1), Err("reserved_not_zero"));
        assert_eq!(with(HEADER_LEN + 2, 1), Err("reserved_not_zero"));
        assert_eq!(with(15, 3), Err("truncated"));
        assert_eq!(with(15, 1), Err("trailing_bytes"));
        assert_eq!(
            with(14, 1),
            Err("truncated"),
            "258 entries may be, but are not there"
        );
        assert_eq!(
            with(14, 0xff),
            Err("bad_count"),
            "more than MAX_DATAGRAM_ENTRIES"
        );
        assert_eq!(with(1, Kind::Heartbeat as u8), Err("bad_count"));
        for cut in 0..good.len() {
            assert!(Message::decode(&good[..cut]).is_err(), "cut at {cut}");
        }
    }

    /// A register's values in order go as one run, as narrow as the largest; a run broken
    /// by a gap, another state or another threshold starts another.
    #[test]
    fn consecutive_locations_go_as_runs_as_narrow_as_their_largest_value() {
        let at = |state, index, value, threshold| Update {
            location: Location { state, index },
            value,
            threshold,
        };
        let mut m = message(0);
        m.entries = (0..1000).map(|i| at(2, i, u64::from(i % 300), 0)).collect();
        let mut bytes = Vec::new();
        m.encode(&mut bytes);
        assert_eq!(bytes[2] & FLAG_RUNS, FLAG_RUNS);
        assert_eq!(bytes.len(), HEADER_LEN + RUN_HEADER_LEN + 2 * 1000);
        assert_eq!(Message::decode(&bytes), Ok(m.clone()));
        // Each width, at both its ends: a run of a state each.
        let edges = [
            0xff,
            0x100,
            0xffff,
            0x1_0000,
            0xffff_ffff,
            1 << 32,
            u64::MAX,
        ];
        m.entries = (edges.iter().enumerate())
            .flat_map(|(s, &v)| (0..3).map(move |i| at(s as u16, i, v, 0)))
            .collect();
        bytes.clear();
        m.encode(&mut bytes);
        let values: usize = [1, 2, 2, 4, 4, 8, 8].iter().map(|w| 3 * w).sum();
        assert_eq!(bytes.len(), HEADER_LEN + 7 * RUN_HEADER_LEN + values);
        assert_eq!(Message::decode(&bytes), Ok(m.clone()));
        m.entries = vec![
            at(1, 7, 1, 0),
            at(1, 8, u64::MAX, 0),
            at(1, 10, 3, 0),
            at(2, 11, 4, 0),
            at(2, 12, 5, 9),
            at(2, 13, 6, 9),
        ];
        let size = |entries: &[Update]| {
            let mut size = EncodedSize::default();
            entries.iter().for_each(|e| size.push(e));
            size.bytes()
        };
        assert_eq!(
            size(&m.entries),
            HEADER_LEN + (20 + 16) + 21 + 21 + (20 + 2),
            "a gap, a state, a threshold: four runs"
        );
        let scattered: Vec<Update> = (0..6).map(|i| at(0, 2 * i, u64::MAX, 0)).collect();
        assert_eq!(
            size(&scattered),
            HEADER_LEN + 6 * ENTRY_LEN,
            "six runs of one wide value each are longer than six entries"
        );
        m.entries = (0..3).map(|i| at(0, u32::MAX - 2 + i, 1, 0)).collect();
        m.entries.push(at(0, 0, 1, 0));
        m.entries.extend((1..9).map(|i| at(0, i, 1, 0)));
        bytes.clear();
        m.encode(&mut bytes);
        assert_eq!(
            bytes.len(),
            HEADER_LEN + 2 * RUN_HEADER_LEN + 12,
            "a run ends at the last index"
        );
        assert_eq!(Message::decode(&bytes), Ok(m));
    }

    /// Zeros between values go as a run of their own, with no value bytes, where that is
    /// shorter; in a write, and where a cut costs more than it saves, as values.
    #[test]
    fn zeros_between_values_go_as_a_run_of_no_value_bytes() {
        let mut m = message(0);
        m.entries = (0..100u32)
            .map(|i| Update {
                location: Location { state: 1, index: i },
                value: match i {
                    0..10 => u64::from(i) + 1,
                    10..90 => 0,
                    _ => u64::MAX,
                },
                threshold: 0,
            })
            .collect();
        let mut bytes = Vec::new();
        m.encode(&mut bytes);
        // Ten values of a byte, eighty zeros in a header alone, ten of eight bytes (one
        // run of 100 eight-byte values took 820 bytes).
        let runs = (RUN_HEADER_LEN + 10) + RUN_HEADER_LEN + (RUN_HEADER_LEN + 80);
        assert_eq!(bytes.len(), HEADER_LEN + runs);
        assert_eq!(
            bytes[HEADER_LEN + RUN_HEADER_LEN + 10 + 2],
            0,
            "the zeros' width"
        );
        assert_eq!(Message::decode(&bytes), Ok(m.clone()));
        // A write's zeros as well (a reset of a sketch is a header a run of zeros).
        let write = Message {
            kind: Kind::Write,
            ..m.clone()
        };
        bytes.clear();
        write.encode(&mut bytes);
        assert_eq!(bytes.len(), HEADER_LEN + runs);
        assert_eq!(Message::decode(&bytes), Ok(write));
        // A few zeros stay values of their run: a cut would cost more headers than they.
        m.entries[10..90].iter_mut().for_each(|e| e.value = 1);
        m.entries[40..44].iter_mut().for_each(|e| e.value = 0);
        bytes.clear();
        m.encode(&mut bytes);
        assert_eq!(
            bytes.len(),
            HEADER_LEN + RUN_HEADER_LEN + 100 * 8,
            "one run"
        );
        assert_eq!(Message::decode(&bytes), Ok(m));
    }

    /// Each fault of a run is refused by reason, and every cut is refused.
    #[test]
    fn malformed_runs_are_refused_by_reason() {
        let mut m = message(0);
        m.entries = (0..30)
            .map(|i| Update {
                location: Location {
                    state: 1,
                    index: 100 + i,
                },
                value: 300,
                threshold: 0,
            })
            .collect();
        let mut good = Vec::new();
        m.encode(&mut good);
        assert_eq!(good.len(), HEADER_LEN + RUN_HEADER_LEN + 60);
        let run = HEADER_LEN;
        let with = |at: usize, bytes: &[u8]| {
            let mut bad = good.clone();
            bad[at..at + bytes.len()].copy_from_slice(bytes);
            Message::decode(&bad).map_err(|e| e.reason())
        };
        assert_eq!(with(run + 2, &[3]), Err("bad_run"), "width 3");
        assert_eq!(with(run + 2, &[5]), Err("bad_run"), "width 5");
        // Width 0 is a run of zeros, with no value bytes: the values are then left over.
        assert_eq!(with(run + 2, &[0]), Err("trailing_bytes"), "width 0");
        assert_eq!(
            with(run + 3, &[1]),
            Err("bad_run"),
            "in columns, with a width of its own"
        );
        assert_eq!(with(run + 8, &[0, 0, 0, 0]), Err("bad_run"), "length 0");
        assert_eq!(
            with(run + 8, &[0, 0, 0, 31]),
            Err("bad_run"),
            "past the count"
        );
        assert_eq!(
            with(run + 4, &[0xff, 0xff, 0xff, 0xf0]),
            Err("bad_run"),
            "past the last index"
        );
        assert_eq!(
            with(run + 8, &[0, 0, 0, 29]),
            Err("truncated"),
            "a second run's header"
        );
        let mut short = good.clone();
        short[15] = 29;
        short[run + 11] = 29;
        assert_eq!(
            Message::decode(&short).map_err(|e| e.reason()),
            Err("trailing_bytes"),
            "a value left over"
        );
        assert_eq!(
            with(run + 2, &[1]),
            Err("trailing_bytes"),
            "narrower than sent"
        );
        assert_eq!(with(run + 2, &[4]), Err("truncated"), "wider than sent");
        assert_eq!(with(1, &[Kind::Heartbeat as u8]), Err("bad_count"));
        for cut in 0..good.len() {
            assert!(Message::decode(&good[..cut]).is_err(), "cut at {cut}");
        }
    }

    /// A run in columns that is malformed is refused by reason: a column wider than 8
    /// bytes, more columns than a slot has words, a width of the run's own besides, its
    /// widths or values cut short or left over; and every cut is refused.
    #[test]
    fn malformed_runs_in_columns_are_refused_by_reason() {
        let values: Vec<u64> = (0..30).map(|i| [1 << 40, 7, 300][i % 3]).collect();
        let stretch = Stretch {
            first: Location { state: 1, index: 5 },
            threshold: 0,
            values: &values,
            columns: 3,
        };
        let mut m = message(0);
        m.kind = Kind::Write;
        let mut good = Vec::new();
        m.encode_carrying(&stretch, None, &mut good);
        assert_eq!(
            good.len(),
            HEADER_LEN + RUN_HEADER_LEN + 3 + 10 * (6 + 1 + 2)
        );
        m.entries = (0..30).map(|i| stretch.entry(i)).collect();
        assert_eq!(Message::decode(&good), Ok(m));
        let run = HEADER_LEN;
        let widths = run + RUN_HEADER_LEN;
        let with = |at: usize, bytes: &[u8]| {
            let mut bad = good.clone();
            bad[at..at + bytes.len()].copy_from_slice(bytes);
            Message::decode(&bad).map_err(|e| e.reason())
        };
        assert_eq!(with(widths, &[9]), Err("bad_run"), "a column of 9 bytes");
        assert_eq!(with(run + 3, &[65]), Err("bad_run"), "65 columns");
        assert_eq!(with(run + 2, &[8]), Err("bad_run"), "a width besides");
        assert_eq!(with(widths, &[7]), Err("truncated"), "wider than sent");
        assert_eq!(with(widths, &[5]), Err("trailing_bytes"), "narrower");
        // Two columns, the third's width read as a value: 15 rows of 7 bytes asked for.
        assert_eq!(with(run + 3, &[2]), Err("truncated"), "fewer columns");
        // Four, the first value's first byte read as a width (1): 77 bytes of the 89.
        assert_eq!(with(run + 3, &[4]), Err("trailing_bytes"), "more columns");
        for cut in 0..good.len() {
            assert!(Message::decode(&good[..cut]).is_err(), "cut at {cut}");
        }
    }

    /// With a key, a message round-trips; one without a MAC, with another key's, or with
    /// any byte changed is refused, and a keyless collector refuses a MAC.
    #[test]
    fn macs_keep_spoofed_and_damaged_messages_out() {
        let key = Key::from_hex(&"ab".repeat(32)).unwrap();
        let other = Key::new([7; 32]);
        let m = message(MAX_ENTRIES);
        let mut signed = Vec::new();
        m.encode_with(Some(&key), &mut signed);
        assert!(
            signed.len() <= 1472,
            "the largest message with its MAC fits a datagram"
        );
        assert_eq!(Message::decode_with(Some(&key), &signed), Ok(m.clone()));
        let reason = |k: Option<&Key>, b: &[u8]| Message::decode_with(k, b).map_err(|e| e.reason());
        assert_eq!(reason(Some(&other), &signed), Err("bad_mac"));
        assert_eq!(reason(None, &signed), Err("unexpected_mac"));
        let mut plain = Vec::new();
        m.encode(&mut plain);
        assert_eq!(reason(Some(&key), &plain), Err("missing_mac"));
        for at in (0..signed.len()).step_by(7) {
            let mut damaged = signed.clone();
            damaged[at] ^= 0x10;
            assert!(
                Message::decode_with(Some(&key), &damaged).is_err(),
                "byte {at}"
            );
        }
        for cut in 0..signed.len() {
            assert!(
                Message::decode_with(Some(&key), &signed[..cut]).is_err(),
                "cut {cut}"
            );
        }
        assert!(Key::from_hex("abc").is_err());
        assert!(Key::from_hex(&"zz".repeat(32)).is_err());
    }

    /// A message its header says is held comes back with no entries, read no further,
    /// but its MAC and header are checked all the same; one not held is read whole, and
    /// refused where its entries are malformed.
    #[test]
    fn a_message_held_already_is_taken_from_its_header() {
        let key = Key::new([5; 32]);
        let m = message(MAX_ENTRIES);
        let mut signed = Vec::new();
        m.encode_with(Some(&key), &mut signed);
        let header = Message {
            entries: Vec::new(),
            ..m.clone()
        };
        let held = |h: &Message| *h == header;
        assert_eq!(
            Message::decode_unless_held(Some(&key), &signed, held),
            Ok(header.clone())
        );
        let none = |_: &Message| false;
        assert_eq!(
            Message::decode_unless_held(Some(&key), &signed, none),
            Ok(m.clone())
        );
        let mut damaged = signed.clone();
        damaged[HEADER_LEN + 3] ^= 1;
        let decoded = Message::decode_unless_held(Some(&key), &damaged, held);
        assert_eq!(decoded.map_err(|e| e.reason()), Err("bad_mac"));
        let mut plain = Vec::new();
        m.encode(&mut plain);
        let cut = &plain[..plain.len() - 1];
        assert!(Message::decode_unless_held(None, cut, none).is_err());
        let held_header = Message::decode_unless_held(None, cut, held);
        assert_eq!(held_header, Ok(header), "its entries are not read");
    }

    proptest! {
        /// Any bytes: decoded or refused, never a panic; what decodes encodes to bytes that
        /// decode to it again (not always the same bytes: the encoder picks the shorter of
        /// entries and runs, and the longest runs; a message's entries, not a stretch, are
        /// never put in columns, which may be shorter).
        #[test]
        fn any_bytes_decode_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(m) = Message::decode(&bytes) {
                let mut again = Vec::new();
                m.encode(&mut again);
                prop_assert!(again.len() <= HEADER_LEN + m.entries.len() * ENTRY_LEN);
                prop_assert_eq!(Message::decode(&again), Ok(m));
            }
        }

        /// A stretch in columns (a table's slots: rows of words as unlike as an address and
        /// a flag) goes as one run, each column as wide as the bytes its largest value
        /// needs, at the size `columns_message_bytes` counts; it reads back as its entries,
        /// and as the part's stretch of values, whatever its length against its rows.
        #[test]
        fn a_stretch_in_columns_round_trips_each_column_as_narrow_as_its_widest(
            columns in 2..=MAX_RUN_COLUMNS,
            bytes_of_column in proptest::collection::vec(0..=8u32, MAX_RUN_COLUMNS),
            seeds in proptest::collection::vec(any::<u64>(), 1..2_000),
            first in prop_oneof![Just(0u32), any::<u32>()],
            threshold in any::<u64>(),
        ) {
            // Column j's values take up to `bytes_of_column[j]` bytes.
            let values: Vec<u64> = (seeds.iter().enumerate())
                .map(|(i, &v)| v.checked_shr(64 - 8 * bytes_of_column[i % columns]).unwrap_or(0))
                .collect();
            let first = Location { state: 3, index: first.min(u32::MAX - values.len() as u32) };
            let stretch = Stretch { first, threshold, values: &values, columns };
            let mut m = message(0);
            m.kind = Kind::Write;
            let mut bytes = Vec::new();
            m.encode_carrying(&stretch, None, &mut bytes);
            let mut widths = vec![0u8; columns];
            for (i, &v) in values.iter().enumerate() {
                widths[i % columns] = widths[i % columns].max(bytes_needed(v) as u8);
            }
            let in_columns = columns_message_bytes(&widths, values.len());
            if in_columns < HEADER_LEN + values.len() * ENTRY_LEN {
                prop_assert_eq!(bytes.len(), in_columns);
                prop_assert_eq!(&bytes[HEADER_LEN + RUN_HEADER_LEN..][..columns], &widths[..]);
            }
            m.entries = (0..values.len()).map(|i| stretch.entry(i)).collect();
            prop_assert_eq!(Message::decode(&bytes), Ok(m.clone()));
            let (part, read) = Message::decode_write_part(None, &bytes, |_| false).unwrap();
            let read = read.map_or_else(|| part.entries.clone(), |s| s.updates().collect());
            prop_assert_eq!(read, m.entries);
        }

        /// Runs of values and zeros, as a refresh of a table reads them, round-trip at the
        /// size counted, and take no more bytes than maximal runs each as wide as its
        /// widest value (the encoding before zeros could go as runs of width 0).
        #[test]
        fn zeros_cut_out_of_runs_round_trip_and_only_ever_save_bytes(
            pieces in proptest::collection::vec((0..4u8, 1..40usize, 0..3u32), 1..30)
        ) {
            let mut m = message(0);
            let mut index = 0u32;
            for (i, &(kind, len, gap)) in pieces.iter().enumerate() {
                index += gap;
                for j in 0..len {
                    let value = match kind {
                        0 => 0,
                        1 => (i + j) as u64 % 3,
                        2 => 200 + j as u64,
                        _ => u64::MAX - j as u64,
                    };
                    m.entries.push(Update {
                        location: Location { state: 1, index },
                        value,
                        threshold: 0,
                    });
                    index += 1;
                }
            }
            let mut size = EncodedSize::default();
            m.entries.iter().for_each(|e| size.push(e));
            let mut bytes = Vec::new();
            m.encode(&mut bytes);
            prop_assert_eq!(bytes.len(), size.bytes());
            let mut widest_runs = HEADER_LEN;
            for run in m.entries.chunk_by(continues_run) {
                let width = run.iter().map(|e| narrowest_width(e.value)).max().unwrap_or(1);
                widest_runs += RUN_HEADER_LEN + run.len() * width;
            }
            prop_assert!(bytes.len() <= widest_runs.min(HEADER_LEN + m.entries.len() * ENTRY_LEN));
            prop_assert_eq!(Message::decode(&bytes), Ok(m));
        }

        /// Any entries round-trip, in the encoding `EncodedSize` says, of the size it says.
        #[test]
        fn any_entries_round_trip_at_the_size_counted(
            entries in proptest::collection::vec((0..3u16, 0..40u32, any::<u64>(), 0..2u64, 0..4u32), 0..200)
        ) {
            let mut m = message(0);
            m.entries = (entries.iter())
                .map(|&(state, index, value, threshold, shift)| Update {
                    location: Location { state, index: u32::MAX - 40 + index },
                    value: value >> (16 * shift),
                    threshold,
                })
                .collect();
            let mut size = EncodedSize::default();
            m.entries.iter().for_each(|e| size.push(e));
            let mut bytes = Vec::new();
            m.encode(&mut bytes);
            prop_assert_eq!(bytes.len(), size.bytes());
            prop_assert_eq!(size.count(), m.entries.len());
            prop_assert_eq!(Message::decode(&bytes), Ok(m));
        }

        /// A write's part reads as a stretch of values where its runs make one (its
        /// entries left empty), and otherwise as its entries; either way as `decode` reads
        /// it, or refused as `decode` refuses it (the part's bytes damaged).
        #[test]
        fn a_part_reads_as_a_stretch_where_it_is_one_and_as_decode_reads_it(
            pieces in proptest::collection::vec(
                (0..2u16, 0..2u64, 0..3u32, proptest::collection::vec(0..300u64, 1..30)), 1..5),
            stretch in any::<bool>(),
            damage in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 0..3),
        ) {
            // Pieces of consecutive locations, each of a state and threshold, a gap (or
            // none) before each; as one stretch, every piece of state 1 and threshold 0
            // with no gap.
            let mut m = message(0);
            m.kind = Kind::Write;
            let mut index = 1_000u32;
            for (state, threshold, gap, values) in &pieces {
                let (state, threshold, gap) =
                    if stretch { (1, 0, 0) } else { (*state, *threshold, *gap) };
                index += gap;
                for &value in values {
                    m.entries.push(Update { location: Location { state, index }, value, threshold });
                    index += 1;
                }
            }
            let mut bytes = Vec::new();
            m.encode(&mut bytes);
            if damage.is_empty() && stretch && m.entries.len() > 1 {
                let (part, values) = Message::decode_write_part(None, &bytes, |_| false).unwrap();
                prop_assert!(part.entries.is_empty());
                prop_assert_eq!(values.map(|s| s.updates().collect::<Vec<_>>()), Some(m.entries.clone()));
            }
            for (at, byte) in &damage {
                let at = at.index(bytes.len());
                bytes[at] = *byte;
            }
            let plain = Message::decode(&bytes);
            let part = Message::decode_write_part(None, &bytes, |_| false);
            match (plain, part) {
                (Err(a), Err(b)) => prop_assert_eq!(a, b),
                (Ok(plain), Ok((mut part, values))) => {
                    if let Some(values) = values {
                        prop_assert!(part.entries.is_empty());
                        part.entries = values.updates().collect();
                    }
                    prop_assert_eq!(part, plain);
                }
                (plain, part) => prop_assert!(false, "{:?} against {:?}", plain, part),
            }
        }
    }
}
