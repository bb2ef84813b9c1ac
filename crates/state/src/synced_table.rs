//! An exact table's entries as synced state. Each slot of the table is `stride` words of
//! one state, laid out by the table's declaration:
//!
//! - word 0: the entry's action, as 1 + its index among the declared actions (0: the slot
//!   is empty);
//! - then each key field, in declared order;
//! - then the action's parameters, by position: position `p` takes the words of the widest
//!   `p`-th parameter of any action (unused by an action with fewer, and left 0).
//!
//! A field is one word, or two (high word first) when wider than 64 bits. The action and
//! key words, and every parameter the codec does not name as counting, are *exact*: sent
//! at each change whatever the threshold, since a key or an address near the right one is
//! a wrong one; counting parameters (packets, bytes) are sent within the threshold, as a
//! register's cells are.
//!
//! A write into a table is a list of entries, not of slots: each group of `stride` words
//! (the group is the written index divided by `stride`; which group says nothing of where
//! the entry lands) is decoded and placed by its key, wherever this table's hash puts it.
//! A group whose action word is 0 deletes its key; one with words missing, or that does
//! not decode against the declaration, is refused and counted, never half applied. A
//! write's words are staged until its commit; those staged in order as one run are
//! decoded as they come ([`TableSync::decode_ahead`]), so that the commit only places the
//! entries.
//!
//! Must never: report a slot that did not change, miss one that did, or place an entry whose
//! fields do not fit the declaration.

use crate::changes::Change;
use crate::exact::{ExactTable, SlotWrite};
use crate::table_key::TableKey;
use stateplane_api::{Declaration, Field, Kind};
use std::ops::ControlFlow;

/// Words a slot may take at most (a read of one word encodes its slot on the stack).
pub const MAX_STRIDE: usize = 64;

/// Key fields, and parameters of an action, a synced table may have at most (an entry's
/// encoding holds their values on the stack, zeroed at each: a slot's worth of 128-bit
/// values would be 1 KiB to clear per entry taken).
pub const MAX_FIELDS: usize = 16;

/// Words of a write a synced table stages in memory the kernel supplied when the worker
/// that runs it made it resident ([`TableSync::make_resident`]), with as many slots'
/// saves of the entries before and the whole table ([`ExactTable::populate`]): a write of
/// up to these many words (the sync channel's largest,
/// `stateplane_sync::write::MAX_WRITE_VALUES`, held equal where the switch uses both) is
/// staged and committed with no page fault, where the first write into a table took one
/// for each 4 KiB it filled (3,585 for 30,000 connections, conntrack's test
/// `a_large_write_into_a_synced_table_takes_no_page_fault` without the table populated).
/// That memory is resident from its worker's start (the sync stage's first pass, at the
/// worker's first tick), and claimed from the run's
/// memory budget ([`TableSync::room_bytes`]): 8 MiB of words and about 200 bytes a slot
/// of a write's entries (some 24 MiB for `conntrack`, 13 words a slot), less for a
/// smaller table.
pub const STAGED_WORDS: usize = 1 << 20;

/// Words a field takes.
fn words_of(field: &Field) -> usize {
    if field.bits > 64 { 2 } else { 1 }
}

/// How a declared table's slot lies in its words (see the module documentation).
#[derive(Clone, Debug)]
pub struct SlotWords {
    /// Words per key field.
    key: Vec<usize>,
    /// Per parameter position: the offset of its first word (from word 0) and its words.
    params: Vec<(usize, usize)>,
    /// Per action: its parameters.
    actions: Vec<Vec<Field>>,
    key_fields: Vec<Field>,
    /// Per word of a slot: whether it is sent within the threshold (a counting parameter).
    counting: Vec<bool>,
    /// Where each key field lies, and per action where each of its parameters does: what
    /// decoding reads, with no walk through the declaration (a migration decodes tens of
    /// thousands of entries in the worker's pause).
    key_at: Vec<FieldAt>,
    params_at: Vec<Vec<FieldAt>>,
}

/// A field's place in a slot: the word that holds it (its low word, for a field of two
/// words), and the bits of its high and low words that a value fitting its declared width
/// leaves 0.
#[derive(Clone, Copy, Debug)]
struct FieldAt {
    low: usize,
    wide: bool,
    over_high: u64,
    over_low: u64,
}

impl FieldAt {
    fn new(at: usize, field: &Field) -> FieldAt {
        let wide = words_of(field) == 2;
        let fits = |bits: u32| {
            if bits >= 64 {
                u64::MAX
            } else {
                (1 << bits) - 1
            }
        };
        let bits = u32::from(field.bits);
        FieldAt {
            low: at + usize::from(wide),
            wide,
            over_high: !fits(bits.saturating_sub(64)) * u64::from(wide),
            over_low: !fits(bits),
        }
    }
}

/// The values of the fields `at` names in `words` (a whole slot's) into `out`, or the
/// error of the first that does not fit its field (`fields`, in the same order).
fn read_fields(
    at: &[FieldAt],
    fields: &[Field],
    words: &[u64],
    out: &mut FieldValues,
) -> Result<(), String> {
    let mut over = false;
    for (value, f) in out.values.iter_mut().zip(at) {
        let (high, low) = (if f.wide { words[f.low - 1] } else { 0 }, words[f.low]);
        over |= high & f.over_high != 0 || low & f.over_low != 0;
        *value = (u128::from(high) << 64) | u128::from(low);
    }
    out.len = at.len().min(MAX_FIELDS);
    if !over {
        return Ok(());
    }
    let bad = (fields.iter().zip(out.get())).find_map(|(field, &v)| checked(field, v).err());
    bad.map_or(Ok(()), Err)
}

impl SlotWords {
    /// The layout of a table's slots; `None` if the declaration is not a table's. Parameters
    /// named in `counting` (at every position they hold) are sent within the threshold.
    pub fn of(decl: &Declaration, counting: &[&str]) -> Option<SlotWords> {
        let Kind::Table { key, actions, .. } = &decl.kind else {
            return None;
        };
        let key_words: Vec<usize> = key.iter().map(words_of).collect();
        let positions = actions.iter().map(|a| a.params.len()).max().unwrap_or(0);
        let mut next = 1 + key_words.iter().sum::<usize>();
        let mut counting_words = vec![false; next];
        let mut params = Vec::with_capacity(positions);
        for p in 0..positions {
            let at = actions.iter().filter_map(|a| a.params.get(p));
            let words = at.clone().map(words_of).max().unwrap_or(1);
            let counts = at.clone().all(|f| counting.contains(&f.name.as_str()));
            params.push((next, words));
            counting_words.extend(std::iter::repeat_n(counts, words));
            next += words;
        }
        let key_at = (key.iter())
            .scan(1, |at, field| {
                let here = *at;
                *at += words_of(field);
                Some(FieldAt::new(here, field))
            })
            .collect();
        let params_at = (actions.iter())
            .map(|a| {
                (a.params.iter().zip(&params))
                    .map(|(field, &(at, _))| FieldAt::new(at, field))
                    .collect()
            })
            .collect();
        Some(SlotWords {
            key: key_words,
            params,
            actions: actions.iter().map(|a| a.params.clone()).collect(),
            key_fields: key.clone(),
            counting: counting_words,
            key_at,
            params_at,
        })
    }

    /// Words per slot.
    pub fn stride(&self) -> usize {
        self.counting.len()
    }

    /// The first word of key field `field` in a slot.
    pub fn key_word(&self, field: usize) -> Option<usize> {
        (field < self.key.len()).then(|| 1 + self.key[..field].iter().sum::<usize>())
    }

    /// The first word of the parameters at `position` in a slot.
    pub fn param_word(&self, position: usize) -> Option<usize> {
        self.params.get(position).map(|&(at, _)| at)
    }

    /// Key fields per slot.
    pub fn key_fields(&self) -> usize {
        self.key.len()
    }

    /// The words of a slot's key: `1..1 + key_words`.
    pub fn key_words(&self) -> usize {
        self.key.iter().sum()
    }

    /// Writes an entry's words (`action` its index, `key` its fields' values and `params`
    /// its parameters, as the control API has them) into `out`, `stride` words. With no
    /// `key`, the key's words are left as they are (a value changed in place).
    pub fn encode(&self, action: usize, key: Option<&[u128]>, params: &[u128], out: &mut [u64]) {
        out[0] = action as u64 + 1;
        if let Some(key) = key {
            let mut at = 1;
            for (&value, &words) in key.iter().zip(&self.key) {
                put(value, &mut out[at..at + words]);
                at += words;
            }
        }
        let first_param = 1 + self.key_words();
        out[first_param..].fill(0);
        for (value, &(at, words)) in params.iter().zip(&self.params) {
            put(*value, &mut out[at..at + words]);
        }
    }

    /// An entry from its words: the action's index, key fields and parameters, each checked
    /// against the declared widths. No action for a slot whose action word is 0 (with its
    /// key, which a write deletes).
    pub fn decode(&self, words: &[u64]) -> Result<Decoded, String> {
        let mut decoded = Decoded::default();
        self.decode_into(words, &mut decoded)?;
        Ok(decoded)
    }

    /// As [`SlotWords::decode`], into `out`'s buffers (a write's entries, one after
    /// another, allocate nothing); `out` is not whole after an error.
    pub fn decode_into(&self, words: &[u64], out: &mut Decoded) -> Result<(), String> {
        if words.len() != self.stride() {
            return Err(format!(
                "{} words where a slot has {}",
                words.len(),
                self.stride()
            ));
        }
        read_fields(&self.key_at, &self.key_fields, words, &mut out.key)?;
        let Some(action) = words[0].checked_sub(1) else {
            out.params.len = 0;
            out.action = None;
            return Ok(());
        };
        let (Some(at), Some(params)) = (
            self.params_at.get(action as usize),
            self.actions.get(action as usize),
        ) else {
            return Err(format!("action word {} names no action", words[0]));
        };
        read_fields(at, params, words, &mut out.params)?;
        out.action = Some(action as usize);
        Ok(())
    }
}

/// A slot's words, read back: its action (none: the slot is empty, or a write deletes the
/// key), key fields' values (a synced table's keys match exactly) and the action's
/// parameters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decoded {
    pub action: Option<usize>,
    key: FieldValues,
    params: FieldValues,
}

impl Decoded {
    #[cfg(test)]
    fn new(action: Option<usize>, key: &[u128], params: &[u128]) -> Decoded {
        Decoded {
            action,
            key: FieldValues::of(key),
            params: FieldValues::of(params),
        }
    }

    pub fn key(&self) -> &[u128] {
        self.key.get()
    }

    pub fn params(&self) -> &[u128] {
        self.params.get()
    }
}

/// The values of a slot's fields, at most [`MAX_FIELDS`], where a decoding writes them
/// with no allocation or length check each (a migration decodes tens of thousands of
/// entries as they arrive). Equal where the values are: the room past them is not
/// compared.
#[derive(Clone, Debug, Default)]
struct FieldValues {
    values: [u128; MAX_FIELDS],
    len: usize,
}

impl FieldValues {
    #[cfg(test)]
    fn of(values: &[u128]) -> FieldValues {
        let mut out = FieldValues::default();
        let len = values.len().min(MAX_FIELDS);
        out.values[..len].copy_from_slice(&values[..len]);
        out.len = len;
        out
    }

    fn get(&self) -> &[u128] {
        &self.values[..self.len]
    }
}

impl PartialEq for FieldValues {
    fn eq(&self, other: &FieldValues) -> bool {
        self.get() == other.get()
    }
}

impl Eq for FieldValues {}

fn put(value: u128, out: &mut [u64]) {
    match out {
        [one] => *one = value as u64,
        [high, low] => {
            *high = (value >> 64) as u64;
            *low = value as u64;
        }
        _ => {}
    }
}

fn checked(field: &Field, value: u128) -> Result<u128, String> {
    if field.bits < 128 && value >> field.bits != 0 {
        return Err(format!(
            "{value} does not fit `{}` ({} bits)",
            field.name, field.bits
        ));
    }
    Ok(value)
}

/// A synced table's side of the sync stage: its state id, layout, and the words of a write
/// on its way to commit. The table itself keeps what the take compares with (each written
/// slot's entry before its first write: [`ExactTable::take_written_slots`]).
#[derive(Clone, Debug)]
pub struct TableSync {
    pub id: u16,
    pub words: SlotWords,
    /// Slots.
    slots: usize,
    /// A slot's words as they were, and as they are now.
    then: Vec<u64>,
    now: Vec<u64>,
    /// A write's words as they came, until it commits: runs of consecutive indexes, each
    /// `(its first index, where its words start in staged_words)`, a run's words ending
    /// where the next run's start; and whether the runs came in order of index, none
    /// overlapping (a write's parts mostly come as one run), so that the commit need not
    /// sort them. Invariant, once in order: no run starts where the one before ends (it
    /// is merged into it).
    staged_runs: Vec<(u32, usize)>,
    staged_words: Vec<u64>,
    staged_in_order: bool,
    /// The words of the one staged run, from its first, decoded already
    /// ([`TableSync::decode_ahead`]): whole slots.
    decoded_ahead: usize,
}

/// What committing a write into a table did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Placed {
    pub entries: u64,
    pub deleted: u64,
    /// Groups with words missing, that did not decode, or that found the table full.
    pub refused: u64,
}

impl std::ops::AddAssign for Placed {
    fn add_assign(&mut self, other: Placed) {
        self.entries += other.entries;
        self.deleted += other.deleted;
        self.refused += other.refused;
    }
}

/// Decodes a slot's words of a write (`group`) for `place`, counting what became of it
/// in `placed`: a slot with no action and no key is nothing to place.
fn place_group(
    words: &SlotWords,
    group: &[u64],
    decoded: &mut Decoded,
    place: &mut impl FnMut(&Decoded) -> bool,
    placed: &mut Placed,
) {
    if words.decode_into(group, decoded).is_err() {
        placed.refused += 1;
        return;
    }
    let nothing = decoded.action.is_none() && decoded.key().iter().all(|&v| v == 0);
    if nothing {
        return;
    }
    match (place(decoded), decoded.action) {
        (true, None) => placed.deleted += 1,
        (true, Some(_)) => placed.entries += 1,
        (false, _) => placed.refused += 1,
    }
}

impl TableSync {
    /// Tracks `table` as state `id`: its slots marked when written. `None` if a slot is
    /// wider than [`MAX_STRIDE`] words, has more than [`MAX_FIELDS`] key fields or
    /// parameters, or its locations would not fit 32 bits.
    pub fn start<K: TableKey, V: Copy + Default + bytemuck::Zeroable>(
        id: u16,
        words: SlotWords,
        table: &mut ExactTable<K, V>,
    ) -> Option<TableSync> {
        let stride = words.stride();
        if stride > MAX_STRIDE || words.key_fields() > MAX_FIELDS || words.params.len() > MAX_FIELDS
        {
            return None;
        }
        let slots = table.slot_count();
        u32::try_from(slots.checked_mul(stride)?).ok()?;
        table.mark_written_slots();
        Some(TableSync {
            id,
            words,
            slots,
            then: vec![0; stride],
            now: vec![0; stride],
            staged_runs: Vec::new(),
            staged_words: Vec::new(),
            staged_in_order: true,
            decoded_ahead: 0,
        })
    }

    /// The slots whose words a write of [`STAGED_WORDS`] holds at most (all of them, in a
    /// table smaller than that).
    pub fn staged_slots(&self) -> usize {
        STAGED_WORDS.min(self.slots * self.words.stride()) / self.words.stride()
    }

    /// The bytes [`TableSync::make_resident`] has the kernel supply besides the table:
    /// the staging of a write's words and the saves of as many slots' entries.
    pub fn room_bytes<K: TableKey, V: Copy + Default + bytemuck::Zeroable>(&self) -> u64 {
        let slots = self.staged_slots();
        let words = slots * self.words.stride();
        (words * std::mem::size_of::<u64>()) as u64 + ExactTable::<K, V>::saves_bytes(slots)
    }

    /// Has the kernel supply now the pages of the staging of a write of [`STAGED_WORDS`]
    /// and of `table` with the saves of as many slots' entries.
    pub fn make_resident<K: TableKey, V: Copy + Default + bytemuck::Zeroable>(
        &mut self,
        table: &mut ExactTable<K, V>,
    ) {
        let slots = self.staged_slots();
        let room = (slots * self.words.stride()).saturating_sub(self.staged_words.len());
        stateplane_mem::reserve_populated(&mut self.staged_words, room);
        table.populate(slots);
    }

    /// Locations: every slot's words.
    pub fn length(&self) -> u32 {
        (self.slots * self.words.stride()) as u32
    }

    /// Appends each word of a slot written since the last take that differs from then
    /// (the write's, `Change::by_write`, where a top-down write placed anything in the
    /// slot), slot after slot until `budget` words are appended (the slots left are taken by the
    /// next call, first); whether every written slot was taken.
    pub fn take_changes<K: TableKey, V: Copy + Default + bytemuck::Zeroable>(
        &mut self,
        table: &mut ExactTable<K, V>,
        encode: impl Fn(&SlotWords, Option<&K>, &V, &mut [u64]),
        out: &mut Vec<Change>,
        budget: usize,
    ) -> bool {
        let enough = out.len().saturating_add(budget);
        let TableSync {
            id,
            words,
            then,
            now,
            ..
        } = self;
        let stride = words.stride();
        table.take_written_slots(|table, slot, how, by_write, before| {
            // A value changed in place has its entry there still (a slot an entry left is
            // marked moved): only the value is read, one line of the slot, and only its
            // action and parameter words can differ (the key's are left as they are).
            let in_place = match (how, before) {
                (SlotWrite::Value, Some((_, was))) => table.value_in(slot).map(|is| (was, is)),
                _ => None,
            };
            let moved = match in_place {
                Some((was, is)) => {
                    encode(words, None, was, then);
                    encode(words, None, is, now);
                    false
                }
                None => {
                    let entry = table.slot(slot);
                    let moved = how == SlotWrite::Moved || entry.is_none() || before.is_none();
                    let encoded = |entry: Option<(&K, &V)>, out: &mut [u64]| match entry {
                        Some((k, v)) => encode(words, moved.then_some(k), v, out),
                        None => out.fill(0),
                    };
                    encoded(before.map(|(k, v)| (k, v)), then);
                    encoded(entry.map(|(k, v, _)| (k, v)), now);
                    moved
                }
            };
            let key_words = 1..=words.key_words();
            for (w, (&then, &now)) in then.iter().zip(now.iter()).enumerate() {
                if then != now && (moved || !key_words.contains(&w)) {
                    out.push(Change {
                        state: *id,
                        index: (slot * stride + w) as u32,
                        old: then,
                        new: now,
                        exact: !words.counting[w],
                        by_write,
                    });
                }
            }
            if out.len() < enough {
                ControlFlow::Continue(())
            } else {
                ControlFlow::Break(())
            }
        })
    }

    /// The words from `first` on into `out`, as the slots hold them now, each slot encoded
    /// once; how many (fewer past the state's end).
    pub fn read_run<K: TableKey, V: Copy + Default + bytemuck::Zeroable>(
        &self,
        table: &ExactTable<K, V>,
        encode: impl Fn(&SlotWords, Option<&K>, &V, &mut [u64]),
        first: u32,
        out: &mut [u64],
    ) -> usize {
        let stride = self.words.stride();
        let room = self.length().saturating_sub(first) as usize;
        let len = room.min(out.len());
        let out = &mut out[..len];
        let mut words = [0; MAX_STRIDE];
        let mut index = first as usize;
        let mut rest = &mut out[..];
        while !rest.is_empty() {
            let (slot, word) = (index / stride, index % stride);
            match table.slot(slot) {
                Some((k, v, _)) => encode(&self.words, Some(k), v, &mut words[..stride]),
                None => words[..stride].fill(0),
            }
            let n = (stride - word).min(rest.len());
            let (now, after) = rest.split_at_mut(n);
            now.copy_from_slice(&words[word..word + n]);
            rest = after;
            index += n;
        }
        out.len()
    }

    /// Holds word `index` of a write until [`TableSync::commit`]; `false` past the state's
    /// end. A word staged again replaces the one before.
    pub fn stage(&mut self, index: u32, value: u64) -> bool {
        self.stage_run(index, &[value]);
        index < self.length()
    }

    /// As [`TableSync::stage`] for `values` at `first`, `first + 1`, ...: those past the
    /// state's end are not held.
    pub fn stage_run(&mut self, first: u32, values: &[u64]) {
        let room = self.length().saturating_sub(first) as usize;
        let values = &values[..values.len().min(room)];
        if values.is_empty() {
            return;
        }
        if let Some(&(last_first, from)) = self.staged_runs.last() {
            // One past the last run's last index (within the state: no overflow).
            let end = last_first + (self.staged_words.len() - from) as u32;
            if first == end {
                self.staged_words.extend_from_slice(values);
                return;
            }
            self.staged_in_order &= end < first;
        }
        self.staged_runs.push((first, self.staged_words.len()));
        self.staged_words.extend_from_slice(values);
    }

    /// Words of the staged write decoded ahead of its commit, from its first
    /// ([`TableSync::decode_ahead`]), that the commit does not decode again: 0 once the
    /// write is no longer the one run it was (a word staged out of order, or apart).
    pub fn decoded_ahead(&self) -> usize {
        match self.staged_runs[..] {
            [_] => self.decoded_ahead,
            _ => 0,
        }
    }

    /// Decodes the slots staged whole since the last call for `place`, as the commit
    /// would, ahead of it, while the write is one run from a slot's first word (a large
    /// write's parts, staged in order as they arrive): its commit then only places the
    /// entries. Nothing is decoded otherwise, and the commit decodes the write whole.
    pub fn decode_ahead(&mut self, mut place: impl FnMut(&Decoded) -> bool) -> Placed {
        let stride = self.words.stride();
        let mut placed = Placed::default();
        let [(first, _)] = self.staged_runs[..] else {
            return placed;
        };
        if !(first as usize).is_multiple_of(stride) {
            return placed;
        }
        let whole = self.staged_words.len() / stride * stride;
        let mut decoded = Decoded::default();
        for group in self.staged_words[self.decoded_ahead..whole].chunks_exact(stride) {
            place_group(&self.words, group, &mut decoded, &mut place, &mut placed);
        }
        self.decoded_ahead = whole;
        placed
    }

    /// Drops the staged write (one that will not commit).
    pub fn drop_staged(&mut self) {
        self.staged_runs.clear();
        self.staged_words.clear();
        self.staged_in_order = true;
        self.decoded_ahead = 0;
    }

    /// The staged write's entries, whole groups decoded, for `place` (which puts an
    /// entry in or takes its key out, and says whether it could); the rest refused. The
    /// words [`TableSync::decoded_ahead`] counts are not decoded again.
    pub fn commit(&mut self, mut place: impl FnMut(&Decoded) -> bool) -> Placed {
        let mut skip = self.decoded_ahead();
        self.decoded_ahead = 0;
        let mut runs = std::mem::take(&mut self.staged_runs);
        let mut words = std::mem::take(&mut self.staged_words);
        if !std::mem::replace(&mut self.staged_in_order, true) {
            in_order(&mut runs, &mut words);
        }
        let stride = self.words.stride();
        let mut placed = Placed::default();
        let mut decoded = Decoded::default();
        // A slot a run holds whole is decoded where its words are. Runs are maximal (one
        // that continues the last is merged into it), so a slot a run holds only part of
        // has a word missing: refused, once, however many runs hold parts of it.
        let mut cut = None;
        for (r, &(first, from)) in runs.iter().enumerate() {
            let to = runs.get(r + 1).map_or(words.len(), |&(_, next)| next);
            // The first run's words decoded ahead are passed over.
            let ahead = std::mem::take(&mut skip);
            let (mut index, mut rest) = (first as usize + ahead, &words[from + ahead..to]);
            while !rest.is_empty() {
                let (slot, word) = (index / stride, index % stride);
                let n = (stride - word).min(rest.len());
                if n == stride {
                    place_group(
                        &self.words,
                        &rest[..n],
                        &mut decoded,
                        &mut place,
                        &mut placed,
                    );
                } else if cut.replace(slot) != Some(slot) {
                    placed.refused += 1;
                }
                (index, rest) = (index + n, &rest[n..]);
            }
        }
        // The lists' room is kept for the next write.
        runs.clear();
        words.clear();
        (self.staged_runs, self.staged_words) = (runs, words);
        placed
    }
}

/// Puts staged runs that came out of order, or overlapping, in order of index, a word
/// staged twice as its later value, consecutive indexes one run.
fn in_order(runs: &mut Vec<(u32, usize)>, words: &mut Vec<u64>) {
    let mut pairs: Vec<(u32, u64)> = Vec::with_capacity(words.len());
    for (r, &(first, from)) in runs.iter().enumerate() {
        let to = runs.get(r + 1).map_or(words.len(), |&(_, next)| next);
        pairs.extend((first..).zip(words[from..to].iter().copied()));
    }
    // Stable: of a word staged twice, the later comes last.
    pairs.sort_by_key(|&(index, _)| index);
    runs.clear();
    words.clear();
    for (i, &(index, value)) in pairs.iter().enumerate() {
        if pairs.get(i + 1).is_some_and(|&(next, _)| next == index) {
            continue;
        }
        let continues = (runs.last())
            .is_some_and(|&(first, from)| first as usize + (words.len() - from) == index as usize);
        if !continues {
            runs.push((index, words.len()));
        }
        words.push(value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateplane_api::{Action, Format, Guarantee, MatchKind};

    fn decl() -> Declaration {
        let f = |name: &str, bits| Field::new(name, bits, Format::Int, MatchKind::Exact);
        Declaration {
            name: "t".into(),
            capacity: 8,
            guarantees: vec![Guarantee::Local],
            kind: Kind::Table {
                key: vec![f("addr", 128), f("port", 16)],
                actions: vec![
                    Action {
                        name: "a".into(),
                        params: vec![f("packets", 64)],
                    },
                    Action {
                        name: "b".into(),
                        params: vec![f("to", 128), f("port", 16)],
                    },
                ],
                writable: false,
            },
        }
    }

    /// A key or parameter decodes when it fits its declared width and is refused, named,
    /// one past it, for every width of one word or two (the edges of each word).
    #[test]
    fn a_field_decodes_up_to_its_width_and_not_one_past() {
        let f = |name: &str, bits| Field::new(name, bits, Format::Int, MatchKind::Exact);
        for bits in [1u8, 7, 8, 16, 32, 63, 64, 65, 96, 127, 128] {
            let decl = Declaration {
                kind: Kind::Table {
                    key: vec![f("k", bits)],
                    actions: vec![Action {
                        name: "a".into(),
                        params: vec![f("p", bits)],
                    }],
                    writable: false,
                },
                ..decl()
            };
            let words = SlotWords::of(&decl, &[]).unwrap();
            let mut out = vec![0; words.stride()];
            let most = if bits == 128 {
                u128::MAX
            } else {
                (1 << bits) - 1
            };
            for (key, param) in [(most, 0), (0, most), (most, most)] {
                words.encode(0, Some(&[key]), &[param], &mut out);
                assert_eq!(
                    words
                        .decode(&out)
                        .map(|d| (d.key().to_vec(), d.params().to_vec())),
                    Ok((vec![key], vec![param])),
                    "{bits} bits"
                );
            }
            // One past 64 bits takes a word more than the field has; past 128, any word.
            if bits == 64 || bits == 128 {
                continue;
            }
            for (key, param, named) in [(most + 1, 0, "`k`"), (0, most + 1, "`p`")] {
                words.encode(0, Some(&[key]), &[param], &mut out);
                let e = words.decode(&out).unwrap_err();
                assert!(
                    e.contains(named) && e.contains(&format!("({bits} bits)")),
                    "{e}"
                );
            }
        }
    }

    /// Action word, key words (an address takes two), then the widest parameter at each
    /// position; only what the codec calls counting is sent within the threshold.
    #[test]
    fn a_slot_lays_out_key_then_params_and_reads_back() {
        let words = SlotWords::of(&decl(), &["packets"]).unwrap();
        assert_eq!(words.stride(), 1 + 3 + 2 + 1);
        assert_eq!((words.key_word(1), words.key_word(2)), (Some(3), None));
        assert_eq!((words.param_word(1), words.param_word(2)), (Some(6), None));
        assert_eq!(
            words.counting,
            [false, false, false, false, false, false, false],
            "position 0 is `packets` in a and `to` in b: not counting"
        );
        let mut out = vec![9; 7];
        let key = [u128::MAX, 65_535];
        words.encode(1, Some(&[u128::MAX, 65_535]), &[1 << 64 | 5, 80], &mut out);
        assert_eq!(out, [2, u64::MAX, u64::MAX, 65_535, 1, 5, 80]);
        assert_eq!(
            words.decode(&out),
            Ok(Decoded::new(Some(1), &key, &[1 << 64 | 5, 80]))
        );
        out[3] = 65_536;
        assert!(words.decode(&out).unwrap_err().contains("`port` (16 bits)"));
        out[3] = 1;
        out[0] = 3;
        assert!(words.decode(&out).unwrap_err().contains("names no action"));
        out[0] = 0;
        assert!(matches!(
            words.decode(&out),
            Ok(Decoded { action: None, .. })
        ));
        assert!(words.decode(&out[..6]).is_err());
        let only_a = Declaration {
            kind: Kind::Table {
                key: vec![],
                actions: vec![Action {
                    name: "a".into(),
                    params: vec![Field::new("packets", 64, Format::Int, MatchKind::Exact)],
                }],
                writable: false,
            },
            ..decl()
        };
        let words = SlotWords::of(&only_a, &["packets"]).unwrap();
        assert_eq!(words.counting, [false, true]);
    }

    /// A run of words reads what the slots hold, across slots, whole or empty, and stops
    /// at the state's end.
    #[test]
    fn a_run_reads_the_slots_as_they_are_and_stops_at_the_end() {
        let mut table: ExactTable<u64, u64> =
            ExactTable::new(8, &[crate::exact::ExpireProfile::NEVER], 1);
        let sync = TableSync::start(3, SlotWords::of(&decl(), &[]).unwrap(), &mut table).unwrap();
        for k in [11, 12, 13] {
            table.add_entry(k, 0, 0, 0).unwrap();
        }
        // Word `w` of a slot holding key `k` is `100 * k + w`.
        let encode = |_: &SlotWords, k: Option<&u64>, _: &u64, out: &mut [u64]| {
            let k = k.copied().unwrap_or(0);
            (out.iter_mut().enumerate()).for_each(|(w, o)| *o = 100 * k + w as u64);
        };
        let stride = sync.words.stride() as u32;
        let word = |index: u32| match table.slot((index / stride) as usize) {
            Some((k, _, _)) => 100 * k + u64::from(index % stride),
            None => 0,
        };
        let length = sync.length();
        let mut out = [7; 40];
        for first in [0, 5, stride - 1, length - 40, length - 3, length, u32::MAX] {
            let read = sync.read_run(&table, encode, first, &mut out);
            assert_eq!(read, (length.saturating_sub(first) as usize).min(40));
            for (i, &value) in out[..read].iter().enumerate() {
                assert_eq!(value, word(first + i as u32), "word {}", first + i as u32);
            }
        }
    }

    /// A take reports exactly the words that differ between the table's words before and
    /// after: values changed in place (a count, the action), changed to what they were,
    /// changed and then removed, entries added; read whole by `read_run` as the oracle.
    /// Each step's take is cut short after every word and goes on until it is whole.
    #[test]
    fn a_take_reports_exactly_the_words_that_changed() {
        let mut table: ExactTable<u64, [u64; 2]> =
            ExactTable::new(8, &[crate::exact::ExpireProfile::NEVER], 1);
        let mut sync =
            TableSync::start(3, SlotWords::of(&decl(), &["packets"]).unwrap(), &mut table).unwrap();
        // The value's first number is its action, the second its first parameter.
        let encode = |words: &SlotWords, k: Option<&u64>, v: &[u64; 2], out: &mut [u64]| {
            let key = k.map(|&k| [u128::from(k), 9]);
            words.encode(
                v[0] as usize,
                key.as_ref().map(|k| &k[..]),
                &[v[1].into()],
                out,
            );
        };
        let all = |sync: &TableSync, table: &ExactTable<u64, [u64; 2]>| {
            let mut words = vec![0; sync.length() as usize];
            sync.read_run(table, encode, 0, &mut words);
            words
        };
        type Step = fn(&mut ExactTable<u64, [u64; 2]>);
        let steps: [(&str, Step); 5] = [
            ("added", |t| {
                for k in [11, 12, 13] {
                    t.add_entry(k, [0, k], 0, 0).unwrap();
                }
            }),
            ("counts changed in place", |t| {
                let id = t.find_id(&11).unwrap();
                t.value_mut(id)[1] += 5;
                let id = t.find_id(&12).unwrap();
                t.value_mut(id)[1] += 1;
            }),
            (
                "a value changed and changed back, and the action changed",
                |t| {
                    let id = t.find_id(&11).unwrap();
                    t.value_mut(id)[1] += 1;
                    t.value_mut(id)[1] -= 1;
                    let id = t.find_id(&13).unwrap();
                    *t.value_mut(id) = [1, 13];
                },
            ),
            ("a count changed, then its entry deleted", |t| {
                let id = t.find_id(&12).unwrap();
                t.value_mut(id)[1] += 1;
                assert!(t.delete(&12));
            }),
            ("nothing", |_| {}),
        ];
        let mut cut_short = false;
        for (what, step) in steps {
            let before = all(&sync, &table);
            step(&mut table);
            let after = all(&sync, &table);
            // A word at a time, as a pass's budget cuts a take short: the takes go on
            // where the last one stopped until every slot is taken.
            let mut got = Vec::new();
            let mut takes = 1;
            while !sync.take_changes(&mut table, encode, &mut got, 1) {
                takes += 1;
            }
            cut_short |= takes > 1;
            let mut got: Vec<_> = got.iter().map(|c| (c.index, c.old, c.new)).collect();
            let mut want: Vec<_> = (before.iter().zip(&after).enumerate())
                .filter(|(_, (b, a))| b != a)
                .map(|(i, (&b, &a))| (i as u32, b, a))
                .collect();
            got.sort_unstable();
            want.sort_unstable();
            assert_eq!(got, want, "{what}");
            assert!(
                what == "nothing" || !want.is_empty(),
                "{what} changes a word"
            );
        }
        assert!(cut_short, "some step's take was cut short");
    }

    /// A write's groups are placed whole or refused: missing words, bad fields; an empty
    /// group is nothing, an action word of 0 with a key deletes it.
    #[test]
    fn a_write_places_whole_groups_and_refuses_the_rest() {
        let mut table: ExactTable<u64, u64> =
            ExactTable::new(8, &[crate::exact::ExpireProfile::NEVER], 1);
        let words = SlotWords::of(&decl(), &[]).unwrap();
        let mut sync = TableSync::start(3, words, &mut table).unwrap();
        let stride = sync.words.stride() as u32;
        assert_eq!(sync.length(), table.slot_count() as u32 * stride);
        let group = |g: u32, w: [u64; 7], sync: &mut TableSync| {
            for (i, v) in w.iter().enumerate() {
                assert!(sync.stage(g * stride + i as u32, *v));
            }
        };
        group(0, [1, 0, 7, 80, 0, 0, 0], &mut sync);
        group(1, [0, 0, 7, 81, 0, 0, 0], &mut sync);
        group(2, [0; 7], &mut sync);
        group(3, [1, 0, 7, 1 << 20, 0, 0, 0], &mut sync);
        assert!(
            sync.stage(4 * stride, 1),
            "group 4 is one word short of whole"
        );
        assert!(!sync.stage(sync.length(), 1), "past the end");
        let mut seen = Vec::new();
        let placed = sync.commit(|d| {
            seen.push(d.clone());
            true
        });
        assert_eq!(
            placed,
            Placed {
                entries: 1,
                deleted: 1,
                refused: 2
            }
        );
        assert_eq!(seen.len(), 2);
        assert_eq!(
            sync.commit(|_| true),
            Placed::default(),
            "nothing left staged"
        );

        // Words out of order (a part sent again, parts reordered) make the same groups,
        // and a word staged twice counts as its later value.
        let words = [[1, 0, 7, 80, 0, 0, 0], [1, 0, 7, 90, 0, 0, 0]];
        for w in (0..7).rev() {
            assert!(sync.stage(5 * stride + w, words[1][w as usize]));
            assert!(sync.stage(2 * stride + w, 99));
            assert!(sync.stage(2 * stride + w, words[0][w as usize]));
        }
        let mut seen = Vec::new();
        let placed = sync.commit(|d| {
            seen.push(d.clone());
            true
        });
        assert_eq!(placed.entries, 2, "{seen:?}");
        let decoded = |w: &[u64; 7]| sync.words.decode(w).unwrap();

        // Runs stage as their words one at a time would: in order or not, a run cut at
        // the state's end, a run of nothing staging nothing.
        assert_eq!(seen, [decoded(&words[0]), decoded(&words[1])]);
        let entries: Vec<u64> = [[1, 0, 7, 80, 0, 0, 0], [1, 0, 7, 81, 0, 0, 0]].concat();
        let last = sync.length() - stride;
        sync.stage_run(last, &entries);
        sync.stage_run(stride, &entries[..7]);
        sync.stage_run(sync.length(), &entries);
        sync.stage_run(0, &[]);
        let mut seen = Vec::new();
        let placed = sync.commit(|d| {
            seen.push(d.clone());
            true
        });
        assert_eq!(placed.entries, 2, "the group past the end was not held");
        let entry = sync.words.decode(&entries[..7]).unwrap();
        assert_eq!(seen, [entry.clone(), entry]);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

        /// However a write's words are staged (runs in order or not, overlapping, a word
        /// staged twice, slots cut between runs), the commit places what a plain model
        /// does: each slot whose words all came, as its words last staged, in order of
        /// slot; a slot with words missing refused; an empty one nothing. So it does with
        /// slots decoded ahead of it as the words come, those decoded ahead and then by
        /// the commit together.
        #[test]
        fn a_commit_places_what_the_words_last_staged_make(
            runs in proptest::collection::vec(
                (0u32..40, proptest::collection::vec(0u64..3, 0..20), proptest::bool::ANY), 0..12),
        ) {
            let mut table: ExactTable<u64, u64> =
                ExactTable::new(8, &[crate::exact::ExpireProfile::NEVER], 1);
            let words = SlotWords::of(&decl(), &[]).unwrap();
            let mut sync = TableSync::start(3, words, &mut table).unwrap();
            let stride = sync.words.stride();
            let mut model = std::collections::BTreeMap::new();
            // What runs decoded ahead of the commit gave, kept as a table keeps it: while
            // `decoded_ahead` says it holds.
            let (mut seen, mut placed) = (Vec::new(), Placed::default());
            for (first, values, ahead) in &runs {
                sync.stage_run(*first, values);
                for (index, &value) in (*first..sync.length()).zip(values) {
                    model.insert(index as usize, value);
                }
                if sync.decoded_ahead() == 0 {
                    (seen, placed) = (Vec::new(), Placed::default());
                }
                if *ahead {
                    placed += sync.decode_ahead(|d| {
                        seen.push(d.clone());
                        true
                    });
                }
            }
            let (mut want_seen, mut want) = (Vec::new(), Placed::default());
            let slots: std::collections::BTreeSet<usize> =
                model.keys().map(|i| i / stride).collect();
            for slot in slots {
                let group: Option<Vec<u64>> = (slot * stride..(slot + 1) * stride)
                    .map(|i| model.get(&i).copied())
                    .collect();
                let Some(decoded) = group.and_then(|g| sync.words.decode(&g).ok()) else {
                    want.refused += 1;
                    continue;
                };
                if decoded.action.is_none() && decoded.key().iter().all(|&v| v == 0) {
                    continue;
                }
                match decoded.action {
                    None => want.deleted += 1,
                    Some(_) => want.entries += 1,
                }
                want_seen.push(decoded);
            }
            if sync.decoded_ahead() == 0 {
                (seen, placed) = (Vec::new(), Placed::default());
            }
            placed += sync.commit(|d| {
                seen.push(d.clone());
                true
            });
            proptest::prop_assert_eq!(placed, want);
            proptest::prop_assert_eq!(seen, want_seen);
            proptest::prop_assert_eq!(sync.commit(|_| true), Placed::default());
        }
    }
}
