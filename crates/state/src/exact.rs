//! Exact-match tables with PNA add-on-miss semantics.
//!
//! A table has a fixed capacity chosen at creation and all its memory is allocated then:
//! Robin Hood open addressing over a power-of-two slot array at most 7/8 full, with
//! backward-shift deletion, so there are no tombstones to clean, no rehash, and a full
//! table refuses an insert (counted) instead of growing.
//!
//! PNA semantics, as the seed slides and the PNA specification give them:
//! * `add_entry` (from a miss, with action data and an expiry profile) makes the entry
//!   visible to the very next lookup; it fails with a reason (full, rate limited: with an
//!   [`InsertLimit`], each source, such as an ingress port, adds at most its rate of new
//!   entries, so that one source flooding new keys cannot fill the table for the others).
//! * Action data is updatable in place by the data plane ([`ExactTable::value_mut`]).
//! * Idle timeouts: each entry has a profile (`Never`, `NotifyControl`, `AutoDelete`) and a
//!   deadline set when it is added. A hit does not restart the timer unless the action asks
//!   ([`ExactTable::restart_timer`]): that one timestamp write is the only per-packet cost.
//!   Expiry is found by [`ExactTable::sweep`], which looks at a bounded number of slots per
//!   call (once per burst), and is reported as [`Expired`] notifications.
//! * The data plane may delete (e.g. on a TCP RST); every entry counts its hits.
//! * A full table makes room for a new entry where it can (Linux conntrack's early drop):
//!   among the 16 entries from the new key's home on, an entry whose idle time has run out goes
//!   first (expired, as the sweep would have), else the entry of an *early-drop* profile
//!   (state not yet established, [`ExactTable::set_early_drop`]) closest to expiry. Only
//!   when none is there is the add refused as full. So a flood of new keys cannot lock
//!   established entries' peers out: it only displaces its own kind.
//!
//! Invariant (Robin Hood): an occupied slot's `dist` is 1 + its distance from the slot its
//! hash prefers, and along any probe sequence `dist` never rises by more than one from one
//! slot to the next; an empty slot has `meta == 0`, and a slot's bit in `occupied` is set
//! exactly when its `meta` is not 0.

use crate::table_key::TableKey;
use std::ops::ControlFlow;

/// How a slot was written since the last take, as a marked table tells it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotWrite {
    /// Its entry's value may have changed in place (`value_mut`); the key is the one taken.
    Value,
    /// An entry came, left or moved through: anything in it may have changed.
    Moved,
}

/// The marks of [`SlotWrite`]s, and of a write made while a top-down write is placed
/// ([`ExactTable::placing_a_write`]).
const VALUE: u8 = 1;
const MOVED: u8 = 2;
const BY_WRITE: u8 = 4;

/// The slots of a synced table written since the sync stage last took them: each marked
/// slot's entry as it was before its first write (the marks themselves are in the slots,
/// [`Slot::mark`]). The data plane saves that entry while it has the slot in its cache,
/// so the take compares each slot with what it was without keeping a copy of the whole
/// table (and reading it: a cache miss a slot).
///
/// Invariant: a slot is in `before[taken..]` once, and only if its mark is set; every
/// write to a slot's entry is preceded by [`ExactTable::written`] or
/// [`ExactTable::value_mut`].
#[derive(Clone, Debug)]
struct Written<K, V> {
    /// In the order first written.
    before: Vec<Before<K, V>>,
    /// How many of `before` a take cut short has taken (their marks cleared): the next
    /// take goes on from there. A slot written again after it was taken comes again at
    /// the end.
    taken: usize,
    /// Marked on every write besides its own marks: `BY_WRITE` while a top-down write is
    /// placed, 0 otherwise.
    also: u8,
}

/// A slot written since the last take, and its entry before then (none: it was empty).
#[derive(Clone, Copy, Debug)]
pub struct Before<K, V> {
    pub slot: usize,
    pub entry: Option<(K, V)>,
}

/// What happens when an entry's idle time runs out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpireMode {
    /// The entry never expires.
    Never,
    /// The control plane is told (once); the entry stays until someone deletes it.
    NotifyControl,
    /// The entry is deleted (and the control plane told).
    AutoDelete,
}

/// An idle-timeout profile; entries refer to profiles by index (PNA's
/// `expire_time_profile_id`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpireProfile {
    pub timeout_ns: u64,
    pub mode: ExpireMode,
}

impl ExpireProfile {
    pub const NEVER: ExpireProfile = ExpireProfile {
        timeout_ns: 0,
        mode: ExpireMode::Never,
    };
}

/// Why `add_entry` did not add.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddError {
    /// The table holds its capacity.
    TableFull,
    /// The key is already there (the caller should have hit it).
    Exists,
    /// No such expiry profile.
    NoSuchProfile,
    /// The source has added its share of new entries for now ([`InsertLimit`]).
    RateLimited,
}

/// How fast one source may add new entries: a token bucket per source, `per_second`
/// tokens a second up to `burst`; each new entry takes one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InsertLimit {
    pub per_second: u64,
    pub burst: u64,
}

/// A source's bucket, in billionths of a token.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    nano_tokens: u64,
    at_ns: u64,
}

const NANO: u64 = 1_000_000_000;

/// What [`ExactTable::adopt`] took of the table it replaces.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Adopted {
    pub kept: u64,
    /// Entries that did not fit (the new table is smaller, or lacks their profile).
    pub dropped: u64,
}

/// An entry whose idle time ran out, for the control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Expired<K, V> {
    pub key: K,
    pub value: V,
    pub hits: u64,
    /// Whether the table deleted it (`AutoDelete`) or kept it (`NotifyControl`).
    pub deleted: bool,
    pub at_ns: u64,
}

/// A table's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableStats {
    pub lookups: u64,
    pub hits: u64,
    pub adds: u64,
    pub add_full: u64,
    pub deletes: u64,
    /// Entries of an early-drop profile removed to make room for a new one.
    pub early_dropped: u64,
    /// New entries refused because their source was over its [`InsertLimit`].
    pub add_rate_limited: u64,
    pub expired_deleted: u64,
    pub expired_notified: u64,
    /// `AutoDelete` notifications lost because nobody drained them (the queue holds
    /// `capacity / 8 + 64`; `NotifyControl` expiries wait for room instead).
    pub notifications_dropped: u64,
}

const NO_DEADLINE: u64 = u64::MAX;
const TAG_BITS: u32 = 24;
const TAG_MASK: u32 = (1 << TAG_BITS) - 1;
/// Probe distances are kept in 8 bits; a longer probe counts as full (practically never
/// at 7/8 load).
const MAX_DIST: u32 = 255;
/// Entries a full table looks at, from a new key's home on, for one to make room with,
/// and the slots it walks at most to find them: a full table is at least 7/16 of its
/// slots, so 128 slots hold 16 entries but in clusters far rarer than a flood's keys.
const EARLY_DROP_WINDOW: usize = 16;
const EARLY_DROP_SLOTS: usize = 128;

/// Where a key hashes in a table: its home slot and tag ([`ExactTable::hashed`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct Hashed {
    home: usize,
    tag: u32,
}

/// Meaningful only where its `meta` is not 0 (but for its `mark`, the place's): a slot never
/// used is zeroed memory.
#[derive(Clone, Copy, bytemuck::Zeroable)]
struct Slot<K, V> {
    key: K,
    value: V,
    deadline_ns: u64,
    hits: u64,
    profile: u8,
    notified: bool,
    /// While the table marks its written slots: the [`SlotWrite`] marks of this slot (of
    /// the place, not of the entry in it: [`ExactTable::put`] keeps them when an entry
    /// moves in) since it was last taken, 0 if not written. In the slot's padding, among
    /// the lines the data plane's lookup and write have in their cache already, where a
    /// mark in an array beside the table was a cache miss at most first writes of a pass.
    mark: u8,
    /// Until when (on the [`LeaseClock`]) the replication stage lets the data plane process
    /// this entry's packets with nothing asked of it (its flow's lease held, nothing of it
    /// waiting); 0: not now. The entry's own (it moves with the entry; a new entry, or one
    /// put in place of another, has none). In the slot's padding, as `mark` is.
    leased_until: u32,
}

/// An exact-match table of at most `capacity` entries. See the module documentation.
pub struct ExactTable<K: TableKey, V: Copy + Default + bytemuck::Zeroable> {
    /// Per slot: 0 empty, else `dist << 24 | tag` (tag: 24 hash bits).
    meta: Box<[u32]>,
    slots: Box<[Slot<K, V>]>,
    /// A bit per slot, set while it holds an entry (`meta != 0`): what the sweep reads
    /// (a 32nd of `meta`), so that walking a large table that holds few entries reads
    /// little more than those entries.
    occupied: Box<[u64]>,
    mask: usize,
    len: usize,
    capacity: usize,
    seed: u64,
    profiles: Vec<ExpireProfile>,
    /// Bit `p`: entries of profile `p` may be dropped to make room (see the module doc).
    early_drop: u64,
    insert_limit: Option<InsertLimit>,
    /// Per source, for `insert_limit`, indexed by it (sources are ports: a few small
    /// numbers); `None` for a source not seen yet.
    buckets: Vec<Option<Bucket>>,
    sweep_cursor: usize,
    notifications: Vec<Expired<K, V>>,
    notification_limit: usize,
    /// With the table synced: the slots written since the sync stage last took them
    /// (entries added, moved, removed, or handed out to be updated in place).
    written: Option<Box<Written<K, V>>>,
    /// The time the entries' lease marks are read against ([`ExactTable::leased`]).
    lease_clock: LeaseClock,
    /// Entries put in, taken out or moved so far ([`ExactTable::moved`]).
    moved: u64,
    pub stats: TableStats,
}

/// The replication stage's time as lease marks hold it: units of 2^20 ns (about 1 ms),
/// plus one, in 32 bits, so that a mark fits a slot's padding. Units are taken rounded
/// down, so a mark read against the clock never outlasts the time it was made for.
///
/// Invariant: every mark is within 2^31 units of the clock's time, so that a wrapping
/// comparison orders them: a mark is made at most 2^29 units ahead
/// ([`LeaseClock::FURTHEST_NS`]; a lease lasts a minute at most), and the clock takes
/// every mark away each time it passes a multiple of 2^30 units, about 13 days
/// ([`ExactTable::set_lease_clock`]).
#[derive(Clone, Copy, Debug, Default)]
struct LeaseClock {
    now_ns: u64,
    now: u32,
    /// `now >> 30` when the marks were last all taken away.
    era: u32,
}

impl LeaseClock {
    /// The furthest a mark may be from the clock's time: 2^29 units (about 6.5 days).
    const FURTHEST_NS: u64 = 1 << (29 + 20);

    fn units(ns: u64) -> u32 {
        ((ns >> 20) as u32).wrapping_add(1).max(1)
    }
}

impl<K: TableKey, V: Copy + Default + bytemuck::Zeroable> ExactTable<K, V> {
    /// A table for `capacity` entries with these expiry profiles, hashing with `seed`
    /// (random per process in production, fixed in tests). On 4 KiB pages: its memory is
    /// touched as entries arrive, and a huge page's first touch zeroes 2 MiB and may have
    /// the kernel compact memory to find one (1.06 s of system time for the 13,303 faults
    /// of `bench --programs conntrack --flows 1000 --capacity 2097152` on 87dc15e), for a
    /// gain in lookups no run on this machine has shown (docs/BENCHMARKS.md).
    pub fn new(capacity: usize, profiles: &[ExpireProfile], seed: u64) -> Self {
        Self::with_pages(capacity, profiles, seed, false)
    }

    /// The bytes a table for `capacity` entries allocates (its slots and their metadata at
    /// the 7/8 load it is sized for, and its queue of expiry notifications), for a run's
    /// memory budget to check before it is made.
    pub fn bytes_for(capacity: usize) -> u64 {
        let capacity = capacity.max(1);
        let slots = (capacity + capacity / 7 + 1).next_power_of_two() as u64;
        let slot = (std::mem::size_of::<Slot<K, V>>() + std::mem::size_of::<u32>()) as u64;
        let notifications = (capacity / 8 + 64) as u64;
        slots * slot
            + slots.div_ceil(64) * 8
            + notifications * std::mem::size_of::<Expired<K, V>>() as u64
    }

    /// As [`ExactTable::new`]; `huge_pages` true asks for huge pages (for comparisons).
    pub fn with_pages(
        capacity: usize,
        profiles: &[ExpireProfile],
        seed: u64,
        huge_pages: bool,
    ) -> Self {
        let capacity = capacity.max(1);
        let slots = (capacity + capacity / 7 + 1).next_power_of_two();
        // Zeroed memory straight from the kernel, touched as entries arrive: a table costs
        // the memory its entries use, not its capacity (every slot is empty while its meta
        // is 0, whatever it holds).
        ExactTable {
            meta: stateplane_mem::lazy_zeroed_vec(slots, huge_pages)
                .0
                .into_boxed_slice(),
            slots: stateplane_mem::lazy_zeroed_vec(slots, huge_pages)
                .0
                .into_boxed_slice(),
            occupied: stateplane_mem::lazy_zeroed_vec(slots.div_ceil(64), false)
                .0
                .into_boxed_slice(),
            mask: slots - 1,
            len: 0,
            capacity,
            seed,
            profiles: profiles.to_vec(),
            early_drop: 0,
            insert_limit: None,
            buckets: Vec::new(),
            sweep_cursor: 0,
            notifications: Vec::with_capacity(capacity / 8 + 64),
            notification_limit: capacity / 8 + 64,
            written: None,
            lease_clock: LeaseClock::default(),
            moved: 0,
            stats: TableStats::default(),
        }
    }

    /// Marks every slot written from now on, for [`ExactTable::take_written_slots`].
    pub fn mark_written_slots(&mut self) {
        // Marks are set only while marking: only a table marking already has any.
        if let Some(old) = self.written.take() {
            for before in &old.before[old.taken..] {
                self.slots[before.slot].mark = 0;
            }
        }
        self.written = Some(Box::new(Written {
            before: Vec::new(),
            taken: 0,
            also: 0,
        }));
    }

    /// Has the kernel supply now the pages of every slot, and those of the saves of the
    /// first `written` slots written between two takes (when marking), so that filling
    /// them later (a synced write's commit, placing its entries between bursts) takes no
    /// page fault (3,585 of them for 30,000 connections placed into conntrack's table of
    /// 131,072 slots, its test `a_large_write_into_a_synced_table_takes_no_page_fault`
    /// with this call left out). The table's memory becomes resident
    /// (its whole claim, [`ExactTable::bytes_for`]); its entries are unchanged.
    pub fn populate(&mut self, written: usize) {
        stateplane_mem::populate(&mut self.meta);
        stateplane_mem::populate(&mut self.slots);
        stateplane_mem::populate(&mut self.occupied);
        if let Some(marked) = &mut self.written {
            let room = written.saturating_sub(marked.before.len());
            stateplane_mem::reserve_populated(&mut marked.before, room);
        }
    }

    /// The bytes [`ExactTable::populate`] has the kernel supply for the saves of `written`
    /// slots' entries.
    pub fn saves_bytes(written: usize) -> u64 {
        (written * std::mem::size_of::<Before<K, V>>()) as u64
    }

    /// Calls `each` with every slot written since the last call (or since marking began),
    /// once, in the order first written: the table, the slot, whether an entry came, went
    /// or moved there ([`SlotWrite::Moved`]) or only its value may have changed in place,
    /// whether a top-down write's placing wrote it ([`ExactTable::placing_a_write`]), and
    /// its entry before (none: it was empty); forgets them. `each` may cut the take
    /// short ([`ControlFlow::Break`]) after the slot it was given: the slots not taken
    /// stay written, and the next call starts with them. Whether every written slot was
    /// taken (true if the table does not mark them).
    pub fn take_written_slots(
        &mut self,
        mut each: impl FnMut(&Self, usize, SlotWrite, bool, Option<&(K, V)>) -> ControlFlow<()>,
    ) -> bool {
        /// Slots looked ahead: the written slots of a large table are far apart, each a
        /// cache miss, which the look ahead overlaps.
        const AHEAD: usize = 8;
        let Some(mut written) = self.written.take() else {
            return true;
        };
        let mut all = true;
        let first = written.taken;
        for (n, before) in written.before.iter().enumerate().skip(first) {
            // The marks first (a large table's are far apart as well), so that what a slot
            // needs read is known by the time it is asked for: a value changed in place is
            // read alone, one line of the slot's two or three, and not its metadata.
            if let Some(next) = written.before.get(n + 2 * AHEAD) {
                stateplane_mem::prefetch(&self.slots[next.slot].mark);
            }
            if let Some(next) = written.before.get(n + AHEAD) {
                if self.slots[next.slot].mark == VALUE && next.entry.is_some() {
                    stateplane_mem::prefetch(&self.slots[next.slot].value);
                } else {
                    self.prefetch_slot(next.slot);
                }
            }
            let bits = std::mem::take(&mut self.slots[before.slot].mark);
            let how = match bits & MOVED {
                0 => SlotWrite::Value,
                _ => SlotWrite::Moved,
            };
            written.taken = n + 1;
            let by_write = bits & BY_WRITE != 0;
            if each(self, before.slot, how, by_write, before.entry.as_ref()).is_break() {
                all = written.taken == written.before.len();
                break;
            }
        }
        if all {
            written.before.clear();
            written.taken = 0;
        }
        self.written = Some(written);
        all
    }

    /// Hints that slot `i` will be read soon.
    #[inline]
    fn prefetch_slot(&self, i: usize) {
        if let Some(slot) = self.slots.get(i) {
            stateplane_mem::prefetch_whole(slot);
            stateplane_mem::prefetch(&self.meta[i]);
        }
    }

    /// The value slot `i` holds, without its metadata: for a slot known to hold an entry
    /// (one whose value alone was written since it last had one, [`SlotWrite::Value`]).
    /// An empty slot's reads as zero bytes.
    #[inline]
    pub fn value_in(&self, i: usize) -> Option<&V> {
        self.slots.get(i).map(|s| &s.value)
    }

    /// Whether slot `i` holds an entry, from the `occupied` bits (tests check them).
    #[cfg(test)]
    fn is_occupied(&self, i: usize) -> bool {
        self.occupied[i / 64] & (1 << (i % 64)) != 0
    }

    /// Sets slot `i`'s metadata, and its `occupied` bit to match.
    #[inline]
    fn set_meta(&mut self, i: usize, meta: u32) {
        self.meta[i] = meta;
        let bit = 1 << (i % 64);
        if meta != 0 {
            self.occupied[i / 64] |= bit;
        } else {
            self.occupied[i / 64] &= !bit;
        }
    }

    /// Slot `i`'s entry, if it holds one (expired or not): key, value and expiry profile.
    pub fn slot(&self, i: usize) -> Option<(&K, &V, u8)> {
        let s = self.slots.get(i)?;
        (self.meta[i] != 0).then_some((&s.key, &s.value, s.profile))
    }

    /// Slot `i` is about to be written in the ways of `bits`: marked, and on its first
    /// write since the last take, its entry saved as it is.
    #[inline]
    fn written(&mut self, i: usize, bits: u8) {
        if bits & MOVED != 0 {
            self.moved = self.moved.wrapping_add(1);
        }
        if let Some(written) = &mut self.written {
            let slot = &mut self.slots[i];
            if slot.mark == 0 {
                let entry = (self.meta[i] != 0).then_some((slot.key, slot.value));
                written.before.push(Before { slot: i, entry });
            }
            slot.mark |= bits | written.also;
        }
    }

    /// Puts `entry` into slot `i` with the slot's marks (they are the place's), and gives
    /// back what the slot held.
    #[inline]
    fn put(&mut self, i: usize, entry: Slot<K, V>) -> Slot<K, V> {
        let mark = self.slots[i].mark;
        std::mem::replace(&mut self.slots[i], Slot { mark, ..entry })
    }

    /// While `on`, every slot written is marked as a top-down write's too (its changes go
    /// to the collector as the write's: [`ExactTable::take_written_slots`]); nothing if
    /// the table does not mark its slots.
    pub fn placing_a_write(&mut self, on: bool) {
        if let Some(written) = &mut self.written {
            written.also = if on { BY_WRITE } else { 0 };
        }
    }

    /// Lets a full table drop entries of these profiles (state not yet established) to
    /// make room for a new entry; profiles outside `0..64` are ignored.
    pub fn set_early_drop(&mut self, profiles: &[u8]) {
        self.early_drop = (profiles.iter())
            .filter(|&&p| p < 64)
            .fold(0, |m, &p| m | 1 << p);
    }

    /// Limits how fast each source adds new entries through
    /// [`ExactTable::add_entry_from`] (`None`: no limit).
    pub fn set_insert_limit(&mut self, limit: Option<InsertLimit>) {
        self.insert_limit = limit;
        self.buckets.clear();
    }

    /// [`ExactTable::add_entry`] for a new key that `source` (an ingress port) brought:
    /// refused as [`AddError::RateLimited`] (counted) when the source is over its
    /// [`InsertLimit`]. A refused add takes no token.
    pub fn add_entry_from(
        &mut self,
        source: u16,
        key: K,
        value: V,
        profile: u8,
        now_ns: u64,
    ) -> Result<EntryId, AddError> {
        let Some(limit) = self.insert_limit else {
            return self.add_entry(key, value, profile, now_ns);
        };
        let cap = limit.burst.max(1).saturating_mul(NANO);
        let index = usize::from(source);
        if self.buckets.len() <= index {
            self.buckets.resize(index + 1, None);
        }
        // A new source starts with a full bucket.
        let bucket = self.buckets[index].get_or_insert(Bucket {
            nano_tokens: cap,
            at_ns: now_ns,
        });
        let earned = now_ns
            .saturating_sub(bucket.at_ns)
            .saturating_mul(limit.per_second);
        bucket.nano_tokens = bucket.nano_tokens.saturating_add(earned).min(cap);
        bucket.at_ns = bucket.at_ns.max(now_ns);
        if bucket.nano_tokens < NANO {
            self.stats.add_rate_limited += 1;
            return Err(AddError::RateLimited);
        }
        // The token is taken only if the add succeeds (a full table costs the source none).
        bucket.nano_tokens -= NANO;
        let added = self.add_entry(key, value, profile, now_ns);
        if added.is_err()
            && let Some(bucket) = &mut self.buckets[index]
        {
            bucket.nano_tokens += NANO;
        }
        added
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    #[inline(always)]
    fn split(&self, key: &K) -> (usize, u32) {
        let h = key.hash_with(self.seed);
        ((h as usize) & self.mask, ((h >> 40) as u32) & TAG_MASK)
    }

    /// The slot holding `key`, if any.
    #[inline]
    fn find(&self, key: &K) -> Option<usize> {
        let (home, tag) = self.split(key);
        self.find_from(key, home, tag)
    }

    /// As [`ExactTable::find`], `key` hashed to `home` and `tag`.
    #[inline]
    fn find_from(&self, key: &K, home: usize, tag: u32) -> Option<usize> {
        let mut i = home;
        let mut dist = 1u32;
        loop {
            let m = self.meta[i];
            // Robin Hood: once the resident is closer to home than we would be, the key is
            // not in the table.
            if m == 0 || (m >> TAG_BITS) < dist {
                return None;
            }
            if m & TAG_MASK == tag && self.slots[i].key == *key {
                return Some(i);
            }
            i = (i + 1) & self.mask;
            dist += 1;
        }
    }

    /// Looks `key` up as a packet at `now_ns` would: counts the lookup, and on a hit the
    /// entry's hit counter; returns the entry's handle (valid until the next add or delete).
    /// An entry whose idle time has run out by `now_ns` is a miss, whether or not the sweep
    /// has reached it yet (the sweep only reclaims its slot and tells the control plane).
    #[inline]
    pub fn lookup(&mut self, key: &K, now_ns: u64) -> Option<EntryId> {
        self.stats.lookups += 1;
        let i = self.find(key)?;
        if self.slots[i].deadline_ns <= now_ns {
            return None;
        }
        self.stats.hits += 1;
        self.slots[i].hits += 1;
        Some(EntryId(i as u32))
    }

    /// Looks up a burst of keys at `now_ns`; `out[i]` gets `keys[i]`'s handle. The slots of
    /// the whole burst are touched first, so their cache misses overlap instead of queueing.
    pub fn lookup_burst(&mut self, keys: &[K], out: &mut [Option<EntryId>], now_ns: u64) {
        for (keys, out) in keys.chunks(64).zip(out.chunks_mut(64)) {
            for k in keys {
                let home = self.split(k).0;
                stateplane_mem::prefetch(&self.meta[home]);
                stateplane_mem::prefetch(&self.slots[home]);
            }
            for (k, o) in keys.iter().zip(out.iter_mut()) {
                *o = self.lookup(k, now_ns);
            }
        }
    }

    /// Whether a burst's lookups gain by asking for their slots first
    /// ([`ExactTable::prefetch_key`]): only once the entries outgrow the cache. Below that
    /// their slots are there already, and asking costs each packet a second hash of its key
    /// for nothing (conntrack's pass over a burst is most of the 85 instructions a packet
    /// it adds at 100,000 connections, docs/BENCHMARKS.md).
    #[inline]
    pub fn worth_prefetching(&self) -> bool {
        /// About what a core's share of the last-level cache holds.
        const CACHED_BYTES: usize = 4 << 20;
        self.len * std::mem::size_of::<Slot<K, V>>() > CACHED_BYTES
    }

    /// Hints that the slots of `keys` (a burst's, made only if it is worth it) will be
    /// looked at soon, so that their cache misses overlap instead of each lookup waiting
    /// for its own; nothing while the entries fit the cache ([`worth_prefetching`]).
    ///
    /// [`worth_prefetching`]: ExactTable::worth_prefetching
    #[inline]
    pub fn prefetch_keys(&self, keys: impl IntoIterator<Item = K>) {
        if self.worth_prefetching() {
            keys.into_iter().for_each(|key| self.prefetch_key(&key));
        }
    }

    /// Hints that `key`'s home slot will be looked at soon (a write placing many entries
    /// looks ahead by this, as [`ExactTable::lookup_burst`] does).
    #[inline]
    pub fn prefetch_key(&self, key: &K) {
        self.prefetch_slot(self.split(key).0);
    }

    /// Where `key` hashes (its home slot and tag), for [`ExactTable::prefetch_hashed`] and
    /// [`ExactTable::find_id_hashed`]: a batch that looks ahead hashes each key once.
    #[inline]
    pub fn hashed(&self, key: &K) -> Hashed {
        let (home, tag) = self.split(key);
        Hashed { home, tag }
    }

    /// Hints that the slot `hashed` names will be looked at soon.
    #[inline]
    pub fn prefetch_hashed(&self, hashed: Hashed) {
        self.prefetch_slot(hashed.home);
    }

    /// As [`ExactTable::find_id`], `key` hashed already (`hashed`, by this table: another
    /// table's hash finds nothing, or the wrong entry's place).
    #[inline]
    pub fn find_id_hashed(&self, key: &K, hashed: Hashed) -> Option<EntryId> {
        // Masked: a hash of another table looks in the wrong place, never out of bounds.
        self.find_from(key, hashed.home & self.mask, hashed.tag)
            .map(|i| EntryId(i as u32))
    }

    /// Finds `key` without counting anything (control plane, tests), expired or not.
    pub fn find_id(&self, key: &K) -> Option<EntryId> {
        self.find(key).map(|i| EntryId(i as u32))
    }

    /// As [`ExactTable::find_id`], looking first at `hint`, where the caller last found
    /// `key` (a key is in one slot at most, so a slot holding it is its entry): one key
    /// compared, not hashed and probed for, while the entry has not moved. Any `hint` is
    /// safe: one that names no slot, or another key's, costs only the lookup.
    #[inline]
    pub fn find_id_hinted(&self, key: &K, hint: u32) -> Option<EntryId> {
        let at = hint as usize;
        match self.meta.get(at) {
            Some(&m) if m != 0 && self.slots[at].key == *key => Some(EntryId(hint)),
            _ => self.find_id(key),
        }
    }

    /// The expiry profile an entry was added with.
    pub fn profile(&self, id: EntryId) -> u8 {
        self.slots[id.0 as usize].profile
    }

    /// When the entry's idle time runs out unless it is hit or its timer restarted
    /// (`u64::MAX`: never).
    pub fn deadline_ns(&self, id: EntryId) -> u64 {
        self.slots[id.0 as usize].deadline_ns
    }

    /// A read-only lookup (control plane, tests): no counters change.
    pub fn get(&self, key: &K) -> Option<&V> {
        self.find(key).map(|i| &self.slots[i].value)
    }

    /// The action data of an entry, for the data plane to update in place (PNA's
    /// updatable entries, the slides' `@__ref`).
    #[inline]
    pub fn value_mut(&mut self, id: EntryId) -> &mut V {
        self.written(id.0 as usize, VALUE);
        &mut self.slots[id.0 as usize].value
    }

    #[inline]
    pub fn value(&self, id: EntryId) -> &V {
        &self.slots[id.0 as usize].value
    }

    /// How many times an entry was put in, taken out or moved so far (wrapping): while
    /// it is unchanged, every [`EntryId`] found before still names the entry it named.
    #[inline]
    pub fn moved(&self) -> u64 {
        self.moved
    }

    /// Whether entry `id`'s lease mark holds at the lease clock's time
    /// ([`ExactTable::mark_leased`]).
    #[inline]
    pub fn leased(&self, id: EntryId) -> bool {
        let until = self.slots[id.0 as usize].leased_until;
        until != 0 && (until.wrapping_sub(self.lease_clock.now) as i32) > 0
    }

    /// Marks `key`'s entry leased until `until_ns` (the replication stage's time; `None`:
    /// not leased), for [`ExactTable::leased`]; whether the table holds the key.
    pub fn mark_leased(&mut self, key: &K, until_ns: Option<u64>) -> bool {
        let Some(i) = self.find(key) else {
            return false;
        };
        // Both times rounded down to the unit: the mark holds while the clock's unit is
        // before `until_ns`'s, so it ends within a unit before `until_ns`, never after;
        // and no later than 2^29 units from the clock's time (the invariant of
        // `LeaseClock`, for a time given too far ahead).
        let latest = self
            .lease_clock
            .now_ns
            .saturating_add(LeaseClock::FURTHEST_NS);
        let until = until_ns.map_or(0, |ns| LeaseClock::units(ns.min(latest)));
        self.slots[i].leased_until = until;
        true
    }

    /// Sets the time lease marks are read against (the replication stage's, in
    /// nanoseconds; it only goes forward). Every 2^30 units the marks are all taken away
    /// (see [`LeaseClock`]).
    pub fn set_lease_clock(&mut self, now_ns: u64) {
        let now = LeaseClock::units(now_ns);
        self.lease_clock.now_ns = now_ns;
        self.lease_clock.now = now;
        if now >> 30 != self.lease_clock.era {
            self.lease_clock.era = now >> 30;
            self.clear_leases();
        }
    }

    /// Takes every entry's lease mark away.
    pub fn clear_leases(&mut self) {
        for (i, slot) in self.slots.iter_mut().enumerate() {
            if self.meta[i] != 0 {
                slot.leased_until = 0;
            }
        }
    }

    /// Hits counted on an entry so far.
    pub fn hits(&self, id: EntryId) -> u64 {
        self.slots[id.0 as usize].hits
    }

    /// Restarts the entry's idle timer from `now_ns` (PNA `restart_expire_timer`).
    #[inline]
    pub fn restart_timer(&mut self, id: EntryId, now_ns: u64) {
        let slot = &mut self.slots[id.0 as usize];
        if let Some(p) = self.profiles.get(usize::from(slot.profile))
            && p.mode != ExpireMode::Never
        {
            slot.deadline_ns = now_ns.saturating_add(p.timeout_ns);
            slot.notified = false;
        }
    }

    /// Moves the entry to another expiry profile and restarts its timer (PNA
    /// `set_entry_expire_time`).
    pub fn set_profile(&mut self, id: EntryId, profile: u8, now_ns: u64) -> Result<(), AddError> {
        if usize::from(profile) >= self.profiles.len() {
            return Err(AddError::NoSuchProfile);
        }
        self.slots[id.0 as usize].profile = profile;
        self.restart_timer(id, now_ns);
        Ok(())
    }

    /// Adds `key` with action data `value` and expiry `profile` (PNA `add_entry`, from the
    /// default action of a miss). The next lookup of `key` hits it. An entry of `key` whose
    /// idle time has run out by `now_ns` gives way to the new one in its slot, told and
    /// counted as the sweep would have. A full table first makes room where it can (see
    /// the module documentation).
    pub fn add_entry(
        &mut self,
        key: K,
        value: V,
        profile: u8,
        now_ns: u64,
    ) -> Result<EntryId, AddError> {
        self.add_entry_evicting(key, value, profile, now_ns)
            .map(|(id, _)| id)
    }

    /// [`ExactTable::add_entry`] that never makes room in a full table (nor evicts anything
    /// but an expired entry of the same key): for the control plane, whose batches undo
    /// their adds when one fails and could not bring an evicted entry back.
    pub fn add_entry_keeping_others(
        &mut self,
        key: K,
        value: V,
        profile: u8,
        now_ns: u64,
    ) -> Result<EntryId, AddError> {
        self.try_add(key, value, profile, now_ns).map(|(id, _)| id)
    }

    /// [`ExactTable::add_entry_keeping_others`] of a key already `hashed`
    /// ([`ExactTable::hashed`]): a synced write's commit hashes each key once, to look it
    /// up and place it.
    pub fn add_hashed_keeping_others(
        &mut self,
        key: K,
        hashed: Hashed,
        value: V,
        profile: u8,
        now_ns: u64,
    ) -> Result<EntryId, AddError> {
        self.try_add_hashed(key, hashed, value, profile, now_ns)
            .map(|(id, _)| id)
    }

    /// [`ExactTable::add_entry`], telling which entry left to make way: an expired entry
    /// of the same key, or the one a full table removed to make room. For a caller that
    /// keeps state beside the table (a NAT's reverse mapping and port).
    pub fn add_entry_evicting(
        &mut self,
        key: K,
        value: V,
        profile: u8,
        now_ns: u64,
    ) -> Result<(EntryId, Option<(K, V)>), AddError> {
        match self.try_add(key, value, profile, now_ns) {
            Err(AddError::TableFull) => {
                let Some(gone) = self.make_room(&key, now_ns) else {
                    return Err(AddError::TableFull);
                };
                self.stats.add_full -= 1;
                let (id, _) = self.try_add(key, value, profile, now_ns)?;
                Ok((id, Some(gone)))
            }
            other => other,
        }
    }

    /// Removes one entry among the [`EARLY_DROP_WINDOW`] entries from `key`'s home on: an
    /// expired one (as the sweep would), else the early-drop one closest to expiry; the
    /// entry removed.
    #[cold]
    fn make_room(&mut self, key: &K, now_ns: u64) -> Option<(K, V)> {
        let home = self.split(key).0;
        let mut best: Option<(u64, usize)> = None;
        let mut seen = 0;
        for step in 0..EARLY_DROP_SLOTS {
            let i = (home + step) & self.mask;
            if self.meta[i] == 0 {
                continue;
            }
            seen += 1;
            if seen > EARLY_DROP_WINDOW {
                break;
            }
            let slot = &self.slots[i];
            if slot.deadline_ns <= now_ns {
                let gone = (slot.key, slot.value);
                self.retire_expired(i, now_ns);
                self.remove_at(i);
                return Some(gone);
            }
            if self.early_drop & (1 << slot.profile) != 0
                && best.is_none_or(|(deadline, _)| slot.deadline_ns < deadline)
            {
                best = Some((slot.deadline_ns, i));
            }
        }
        let (_, i) = best?;
        let gone = (self.slots[i].key, self.slots[i].value);
        self.remove_at(i);
        self.stats.early_dropped += 1;
        Some(gone)
    }

    /// One attempt at an add, and the expired entry of the same key it replaced.
    ///
    /// One walk does both the check and the insertion: along a key's probe sequence, the
    /// key can only sit before the first resident that is closer to its home than the key
    /// would be, which is exactly where Robin Hood inserts it.
    fn try_add(
        &mut self,
        key: K,
        value: V,
        profile: u8,
        now_ns: u64,
    ) -> Result<(EntryId, Option<(K, V)>), AddError> {
        let hashed = self.hashed(&key);
        self.try_add_hashed(key, hashed, value, profile, now_ns)
    }

    /// [`ExactTable::try_add`] of `key`, `hashed` ([`ExactTable::hashed`]).
    fn try_add_hashed(
        &mut self,
        key: K,
        Hashed { home, tag }: Hashed,
        value: V,
        profile: u8,
        now_ns: u64,
    ) -> Result<(EntryId, Option<(K, V)>), AddError> {
        let Some(p) = self.profiles.get(usize::from(profile)).copied() else {
            return Err(AddError::NoSuchProfile);
        };
        let deadline_ns = match p.mode {
            ExpireMode::Never => NO_DEADLINE,
            _ => now_ns.saturating_add(p.timeout_ns),
        };
        let entry = Slot {
            key,
            value,
            deadline_ns,
            hits: 0,
            profile,
            notified: false,
            mark: 0,
            leased_until: 0,
        };
        // A hash of this table's (`ExactTable::hashed`); another's stays within bounds.
        debug_assert!(home <= self.mask, "a hash made by another table");
        let mut i = home & self.mask;
        let mut meta = (1 << TAG_BITS) | tag;
        // First part: look for the key up to its insertion point; nothing changes yet.
        loop {
            let m = self.meta[i];
            if m == 0 || (m >> TAG_BITS) < (meta >> TAG_BITS) {
                break;
            }
            if m == meta && self.slots[i].key == key {
                if self.slots[i].deadline_ns > now_ns {
                    return Err(AddError::Exists);
                }
                let gone = (self.slots[i].key, self.slots[i].value);
                self.retire_expired(i, now_ns);
                self.written(i, MOVED);
                self.put(i, entry);
                self.stats.adds += 1;
                return Ok((EntryId(i as u32), Some(gone)));
            }
            if (meta >> TAG_BITS) >= MAX_DIST {
                self.stats.add_full += 1;
                return Err(AddError::TableFull);
            }
            meta += 1 << TAG_BITS;
            i = (i + 1) & self.mask;
        }
        if self.len >= self.capacity {
            self.stats.add_full += 1;
            return Err(AddError::TableFull);
        }
        let mut carry = entry;
        let placed = i;
        // Second part: place it, and carry each displaced resident on to its own place.
        // Below 7/8 load a cluster never reaches MAX_DIST in practice; the distance
        // saturates there rather than overflowing into the tag.
        loop {
            let m = self.meta[i];
            if m == 0 {
                self.written(i, MOVED);
                self.set_meta(i, meta);
                self.put(i, carry);
                self.len += 1;
                self.stats.adds += 1;
                return Ok((EntryId(placed as u32), None));
            }
            if (m >> TAG_BITS) < (meta >> TAG_BITS) {
                self.written(i, MOVED);
                std::mem::swap(&mut self.meta[i], &mut meta);
                carry = self.put(i, carry);
            }
            if (meta >> TAG_BITS) < MAX_DIST {
                meta += 1 << TAG_BITS;
            }
            i = (i + 1) & self.mask;
        }
    }

    /// Slot `i`'s entry, expired by `now_ns`, gives way to a new entry of its key: the
    /// control plane is told (unless it was already) and the expiry counted as a deletion.
    fn retire_expired(&mut self, i: usize, now_ns: u64) {
        let old = self.slots[i];
        if !old.notified {
            self.notify(Expired {
                key: old.key,
                value: old.value,
                hits: old.hits,
                deleted: true,
                at_ns: now_ns,
            });
        }
        self.stats.expired_deleted += 1;
    }

    /// Deletes `key` (control plane or data plane, e.g. on a TCP RST); whether it was there.
    pub fn delete(&mut self, key: &K) -> bool {
        match self.find(key) {
            Some(i) => {
                self.remove_at(i);
                self.stats.deletes += 1;
                true
            }
            None => false,
        }
    }

    /// Takes every entry of `old`, the table this one replaces (a reload), each with its
    /// value, expiry deadline, profile and hits, in place of this table's own; `old` is
    /// left empty. Whole, with no walk, when both tables hash alike into as many slots and
    /// this one has every profile `old`'s entries name; else one by one, as many as fit
    /// (the rest are dropped, counted in what it returns). An entry whose profile this
    /// table lacks is dropped. Each entry keeps its deadline: a changed timeout applies
    /// from the entry's next restart. The table's counts go on from `old`'s.
    pub fn adopt(&mut self, old: &mut Self) -> Adopted {
        // A new table's slots are untouched: looking through them would cost a walk.
        if self.len > 0 {
            self.clear();
        }
        self.stats = std::mem::take(&mut old.stats);
        let same_layout = self.meta.len() == old.meta.len()
            && self.seed == old.seed
            && old.profiles.len() <= self.profiles.len()
            && old.len <= self.capacity;
        if same_layout {
            if self.written.is_some() {
                for i in 0..old.meta.len() {
                    if old.meta[i] != 0 {
                        self.written(i, MOVED);
                    }
                }
            }
            std::mem::swap(&mut self.meta, &mut old.meta);
            std::mem::swap(&mut self.slots, &mut old.slots);
            std::mem::swap(&mut self.occupied, &mut old.occupied);
            // The marks are each table's own, of its places: they go back.
            if self.written.is_some() || old.written.is_some() {
                for (mine, theirs) in self.slots.iter_mut().zip(old.slots.iter_mut()) {
                    std::mem::swap(&mut mine.mark, &mut theirs.mark);
                }
            }
            self.len = std::mem::take(&mut old.len);
            self.sweep_cursor = old.sweep_cursor;
            self.take_notifications_of(old);
            return Adopted {
                kept: self.len as u64,
                dropped: 0,
            };
        }
        let stats = self.stats;
        let mut adopted = Adopted::default();
        for i in 0..old.meta.len() {
            if old.meta[i] == 0 {
                continue;
            }
            let entry = old.slots[i];
            match self.try_add(entry.key, entry.value, entry.profile, 0) {
                Ok((id, _)) => {
                    let slot = &mut self.slots[id.0 as usize];
                    (slot.deadline_ns, slot.hits, slot.notified) =
                        (entry.deadline_ns, entry.hits, entry.notified);
                    adopted.kept += 1;
                }
                Err(_) => adopted.dropped += 1,
            }
        }
        // Moved, not added: the counts stay as they were.
        self.stats = stats;
        self.take_notifications_of(old);
        old.clear();
        adopted
    }

    /// The expiries `old` has not handed out yet, as many as the queue has room for (the
    /// rest counted as dropped notifications).
    fn take_notifications_of(&mut self, old: &mut Self) {
        let room = self
            .notification_limit
            .saturating_sub(self.notifications.len());
        let taken = old.notifications.len().min(room);
        self.notifications.extend(old.notifications.drain(..taken));
        self.stats.notifications_dropped += old.notifications.drain(..).count() as u64;
    }

    /// Empties the table (its statistics stay).
    pub fn clear(&mut self) {
        for i in 0..self.meta.len() {
            if self.meta[i] != 0 {
                self.written(i, MOVED);
                self.set_meta(i, 0);
            }
        }
        self.len = 0;
    }

    /// Removes slot `i` and shifts the rest of its cluster back (no tombstones).
    fn remove_at(&mut self, mut i: usize) {
        self.len -= 1;
        loop {
            self.written(i, MOVED);
            let next = (i + 1) & self.mask;
            let m = self.meta[next];
            if m == 0 || (m >> TAG_BITS) == 1 {
                self.set_meta(i, 0);
                return;
            }
            self.meta[i] = m - (1 << TAG_BITS);
            self.put(i, self.slots[next]);
            i = next;
        }
    }

    /// Looks at up to `budget` slots for entries whose idle time has run out by `now_ns`:
    /// `AutoDelete` entries are deleted, `NotifyControl` ones marked; both are queued as
    /// [`Expired`]. Called once per burst with a small budget, it visits the whole table
    /// every `slots / budget` bursts. Returns how many expired.
    pub fn sweep(&mut self, now_ns: u64, budget: usize) -> usize {
        let mut expired = 0;
        let mut visited = 0;
        // `visited` counts slots moved past; a deletion shifts the next entry into the
        // current slot, which is then looked at again without counting.
        let budget = budget.min(self.meta.len());
        while visited < budget {
            let i = self.sweep_cursor;
            // A run of empty slots is passed over a word of bits at a time; only occupied
            // slots touch their entry.
            let empty_ahead = ((self.occupied[i / 64] >> (i % 64)).trailing_zeros() as usize)
                .min(64 - i % 64)
                .min(self.meta.len() - i);
            if empty_ahead > 0 {
                let skip = empty_ahead.min(budget - visited);
                self.sweep_cursor = (i + skip) & self.mask;
                visited += skip;
                continue;
            }
            if self.slots[i].deadline_ns <= now_ns && !self.slots[i].notified {
                let slot = self.slots[i];
                let mode = self
                    .profiles
                    .get(usize::from(slot.profile))
                    .map_or(ExpireMode::Never, |p| p.mode);
                let deleted = mode == ExpireMode::AutoDelete;
                if mode == ExpireMode::NotifyControl && self.notifications_full() {
                    // Told nobody yet: leave it for a later sweep rather than lose it.
                    self.sweep_cursor = (i + 1) & self.mask;
                    visited += 1;
                    continue;
                }
                if mode != ExpireMode::Never {
                    expired += 1;
                    self.notify(Expired {
                        key: slot.key,
                        value: slot.value,
                        hits: slot.hits,
                        deleted,
                        at_ns: now_ns,
                    });
                }
                if deleted {
                    self.stats.expired_deleted += 1;
                    // The cluster shifts back into slot i: look at it again.
                    self.remove_at(i);
                    continue;
                }
                if mode == ExpireMode::NotifyControl {
                    self.stats.expired_notified += 1;
                    self.slots[i].notified = true;
                }
            }
            self.sweep_cursor = (i + 1) & self.mask;
            visited += 1;
        }
        expired
    }

    fn notifications_full(&self) -> bool {
        self.notifications.len() >= self.notification_limit
    }

    /// Queues a notification; when the queue is full (nobody drains it) an `AutoDelete`
    /// expiry still deletes, and the lost notification is counted.
    fn notify(&mut self, e: Expired<K, V>) {
        if self.notifications.len() < self.notification_limit {
            self.notifications.push(e);
        } else {
            self.stats.notifications_dropped += 1;
        }
    }

    /// Takes the queued expiry notifications.
    pub fn drain_notifications(&mut self) -> std::vec::Drain<'_, Expired<K, V>> {
        self.notifications.drain(..)
    }

    /// How many slots the table has (at least `capacity / 7 * 8`): the range of the
    /// cursor [`ExactTable::iter_slots`] takes.
    pub fn slot_count(&self) -> usize {
        self.meta.len()
    }

    /// The entries in slots `from..from + count` (a page of a control-plane read, so that
    /// reading a big table never holds a worker for long): key, value, hits.
    pub fn iter_slots(&self, from: usize, count: usize) -> impl Iterator<Item = (&K, &V, u64)> {
        let end = from.saturating_add(count).min(self.meta.len());
        let from = from.min(end);
        self.meta[from..end]
            .iter()
            .zip(self.slots[from..end].iter())
            .filter(|(m, _)| **m != 0)
            .map(|(_, s)| (&s.key, &s.value, s.hits))
    }

    /// Every entry (control-plane reads): key, value, hits.
    pub fn iter(&self) -> impl Iterator<Item = (&K, &V, u64)> {
        self.meta
            .iter()
            .zip(self.slots.iter())
            .filter(|(m, _)| **m != 0)
            .map(|(_, s)| (&s.key, &s.value, s.hits))
    }

    /// Checks the Robin Hood invariant (tests).
    #[cfg(test)]
    fn check_invariant(&self) {
        let mut count = 0;
        for i in 0..self.meta.len() {
            let m = self.meta[i];
            assert_eq!(self.is_occupied(i), m != 0, "slot {i}: occupied bit");
            if m == 0 {
                continue;
            }
            count += 1;
            let (home, tag) = self.split(&self.slots[i].key);
            assert_eq!(m & TAG_MASK, tag, "slot {i}: tag");
            let dist = ((i + self.meta.len() - home) & self.mask) as u32 + 1;
            assert_eq!(m >> TAG_BITS, dist, "slot {i}: distance");
        }
        assert_eq!(count, self.len);
    }
}

/// A copy in memory of its own (each worker's table is a clone of a template). The copy of
/// an empty table is left untouched, as a new table is, so a worker's table costs what
/// its entries use.
impl<K: TableKey, V: Copy + Default + bytemuck::Zeroable> Clone for ExactTable<K, V> {
    fn clone(&self) -> Self {
        fn copy<T: Copy + bytemuck::Zeroable>(from: &[T], empty: bool) -> Box<[T]> {
            let mut to = stateplane_mem::lazy_zeroed_vec(from.len(), false).0;
            if !empty {
                to.copy_from_slice(from);
            }
            to.into_boxed_slice()
        }
        // An empty table's slots may still hold marks (of entries since removed).
        let empty = self.len == 0 && self.written.is_none();
        ExactTable {
            meta: copy(&self.meta, empty),
            slots: copy(&self.slots, empty),
            occupied: copy(&self.occupied, empty),
            mask: self.mask,
            len: self.len,
            capacity: self.capacity,
            seed: self.seed,
            profiles: self.profiles.clone(),
            early_drop: self.early_drop,
            insert_limit: self.insert_limit,
            buckets: self.buckets.clone(),
            sweep_cursor: self.sweep_cursor,
            notifications: self.notifications.clone(),
            notification_limit: self.notification_limit,
            written: self.written.clone(),
            lease_clock: self.lease_clock,
            moved: self.moved,
            stats: self.stats,
        }
    }
}

/// A handle on an entry, valid until the table's next add or delete (they move entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryId(u32);

impl EntryId {
    /// Where the entry is, as [`ExactTable::find_id_hinted`] takes it back.
    pub fn place(self) -> u32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::HashMap;

    const MS: u64 = 1_000_000;

    fn profiles() -> Vec<ExpireProfile> {
        vec![
            ExpireProfile::NEVER,
            ExpireProfile {
                timeout_ns: 10 * MS,
                mode: ExpireMode::NotifyControl,
            },
            ExpireProfile {
                timeout_ns: 5 * MS,
                mode: ExpireMode::AutoDelete,
            },
        ]
    }

    /// A table of 64 that entries come into, go from and move in, 4,000 rounds from
    /// `seed`: after each, `probe` is called with the round, its random draw and the keys
    /// to look for (the one just added or deleted, and another, held or not).
    fn churned(seed: u64, mut probe: impl FnMut(&ExactTable<u64, u32>, u64, u64, [u64; 2])) {
        let mut t: ExactTable<u64, u32> = ExactTable::new(64, &profiles(), 7);
        let mut rng = seed;
        for round in 0..4_000u64 {
            rng = rng.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            let key = (rng >> 33) % 200;
            if rng >> 62 == 0 {
                t.delete(&key);
            } else {
                let _ = t.add_entry(key, round as u32, 0, 0);
            }
            probe(&t, round, rng, [key, (rng >> 40) % 200]);
        }
    }

    /// A lease mark holds until its time, never past it (a time rounded down to the
    /// clock's unit), moves with its entry as others come and go, is not an entry's that
    /// takes its place, and every mark goes when the clock passes a multiple of 2^30
    /// units (the marks then stay within half the 32 bits' range of the clock).
    #[test]
    fn a_lease_mark_holds_until_its_time_with_its_entry() {
        const UNIT: u64 = 1 << 20;
        let mut t: ExactTable<u64, u32> = ExactTable::new(64, &profiles(), 7);
        t.add_entry(1, 10, 0, 0).unwrap();
        t.set_lease_clock(10 * UNIT);
        assert!(t.mark_leased(&1, Some(20 * UNIT + UNIT / 2)));
        assert!(!t.mark_leased(&2, Some(20 * UNIT)), "no such entry");
        let leased = |t: &ExactTable<u64, u32>, key| t.find_id(&key).is_some_and(|id| t.leased(id));
        assert!(leased(&t, 1));
        t.set_lease_clock(19 * UNIT);
        assert!(leased(&t, 1));
        t.set_lease_clock(20 * UNIT);
        assert!(!leased(&t, 1), "within its last unit: gone");
        t.set_lease_clock(10 * UNIT);
        let moved = t.moved();
        for key in 2..40 {
            t.add_entry(key, 0, 0, 0).unwrap();
        }
        for key in 2..40 {
            assert!(t.delete(&key));
        }
        assert!(t.moved() > moved, "entries came and went");
        assert!(leased(&t, 1), "the mark moves with its entry");
        assert!(!leased(&t, 2), "another entry has none");
        t.delete(&1);
        t.add_entry(1, 10, 0, 0).unwrap();
        assert!(!leased(&t, 1), "a new entry of its key has none");
        t.set_lease_clock(((1 << 30) - 3) * UNIT);
        t.mark_leased(&1, Some(u64::MAX));
        t.set_lease_clock(((1 << 30) - 2) * UNIT);
        assert!(leased(&t, 1), "a time too far ahead held to the furthest");
        t.set_lease_clock((1 << 30) * UNIT);
        assert!(!leased(&t, 1), "the clock's era passed");
        t.mark_leased(&1, Some((1 << 30) * UNIT + 5 * UNIT));
        assert!(leased(&t, 1));
        t.clear_leases();
        assert!(!leased(&t, 1), "all taken away");
    }

    /// A key hashed ahead is found where a find finds it, present or not, as entries come,
    /// go and move; another table's hash (of more slots) looks in the wrong place and
    /// finds nothing, never out of bounds.
    #[test]
    fn a_find_of_a_key_hashed_ahead_is_a_find() {
        let larger: ExactTable<u64, u32> = ExactTable::new(4_096, &profiles(), 8);
        churned(3, |t, _, _, probes| {
            for probe in probes {
                let hashed = t.hashed(&probe);
                assert_eq!(t.find_id_hashed(&probe, hashed), t.find_id(&probe));
                let elsewhere = t.find_id_hashed(&probe, larger.hashed(&probe));
                assert!(elsewhere.is_none_or(|id| Some(id) == t.find_id(&probe)));
            }
        });
    }

    /// A hinted find answers what a find does, whatever the hint: its own entry's place,
    /// a place gone stale as entries moved, another key's, an empty slot's, or none.
    #[test]
    fn a_hinted_find_is_a_find_whatever_the_hint() {
        let mut hints = vec![0u32; 200];
        churned(1, |t, round, rng, probes| {
            for probe in probes {
                let hint = match round % 3 {
                    0 => hints[probe as usize],
                    1 => (rng >> 20) as u32 % 80, // past the slots too
                    _ => u32::MAX,
                };
                let found = t.find_id_hinted(&probe, hint);
                assert_eq!(found, t.find_id(&probe), "key {probe}, hint {hint}");
                if let Some(id) = found {
                    hints[probe as usize] = id.place();
                }
            }
        });
    }

    /// What a run's memory budget is told a table takes is what it allocates.
    #[test]
    fn bytes_for_is_what_a_table_allocates() {
        for capacity in [1, 7, 1000, 65_536, 1 << 20] {
            let t: ExactTable<u64, [u64; 3]> = ExactTable::new(capacity, &profiles(), 1);
            let allocated = t.meta.len() * size_of::<u32>()
                + t.occupied.len() * size_of::<u64>()
                + t.slots.len() * size_of::<Slot<u64, [u64; 3]>>()
                + t.notifications.capacity() * size_of::<Expired<u64, [u64; 3]>>();
            assert_eq!(
                ExactTable::<u64, [u64; 3]>::bytes_for(capacity),
                allocated as u64,
                "{capacity}"
            );
        }
    }

    /// A reload's table takes the old one's entries: whole when laid out alike (values,
    /// deadlines, hits and counts as they were, the old table left empty), one by one
    /// into a table of another size or seed (as many as fit, the rest counted), and never
    /// an entry of a profile the new table lacks.
    #[test]
    fn adopt_takes_the_old_tables_entries() {
        let filled = |capacity: usize, seed: u64| {
            let mut t: ExactTable<u64, u64> = ExactTable::new(capacity, &profiles(), seed);
            for key in 0..100u64 {
                t.add_entry(key, key * 10, (key % 3) as u8, 0).unwrap();
            }
            let id = t.lookup(&8, MS).unwrap();
            t.restart_timer(id, MS);
            t
        };
        let check = |t: &mut ExactTable<u64, u64>, keys: std::ops::Range<u64>| {
            t.check_invariant();
            for key in keys {
                assert_eq!(t.get(&key), Some(&(key * 10)), "{key}");
            }
        };
        for (capacity, seed) in [(100, 1), (100, 2), (1000, 1), (60, 1)] {
            let mut old = filled(100, 1);
            let mut new = ExactTable::new(capacity, &profiles(), seed);
            new.add_entry(5000, 1, 0, 0).unwrap();
            let adopted = new.adopt(&mut old);
            assert_eq!(adopted.kept + adopted.dropped, 100, "{capacity}, {seed}");
            assert_eq!(adopted.kept, capacity.min(100) as u64, "{capacity}, {seed}");
            assert_eq!(new.len(), adopted.kept as usize);
            assert_eq!(new.get(&5000), None, "its own entries gave way");
            assert!(old.is_empty() && old.iter().next().is_none());
            assert_eq!(new.stats.adds, 100, "the counts go on from the old table's");
            if capacity < 100 {
                new.check_invariant();
                continue;
            }
            check(&mut new, 0..100);
            assert_eq!(new.hits(new.find_id(&8).unwrap()), 1);
            // Deadlines as they were: of the 33 keys that expire after 5 ms, key 8's
            // timer restarted a millisecond later.
            assert_eq!(new.sweep(5 * MS + 1, usize::MAX), 32);
            assert!(new.get(&5).is_none() && new.get(&8).is_some());
        }
        // Profile 2 (every third key) is gone from the new table's profiles.
        let mut old = filled(100, 1);
        let mut new = ExactTable::new(100, &profiles()[..2], 1);
        let adopted = new.adopt(&mut old);
        assert_eq!((adopted.kept, adopted.dropped), (67, 33));
        assert_eq!(new.get(&2), None);
        assert_eq!(new.get(&3), Some(&30));
        // A table whose writes are marked sees every adopted entry as come.
        let mut old = filled(100, 1);
        let mut new = ExactTable::new(100, &profiles(), 1);
        new.mark_written_slots();
        new.adopt(&mut old);
        let mut came = 0;
        new.take_written_slots(|t, slot, how, _, before| {
            assert!(before.is_none() && how == SlotWrite::Moved);
            came += usize::from(t.slot(slot).is_some());
            ControlFlow::Continue(())
        });
        assert_eq!(came, 100);
    }

    /// A slot's marks are of its place in its table: an adoption between two tables that
    /// both mark their slots leaves each with its own, so the new table reports every
    /// entry that came as come (none as a value changed in place, which the old table's
    /// marks of its own writes would say), and its next write as a first one.
    #[test]
    fn marks_stay_with_their_table_when_entries_are_adopted() {
        let mut old: ExactTable<u64, u64> = ExactTable::new(100, &profiles(), 1);
        for key in 0..100u64 {
            old.add_entry(key, key * 10, 0, 0).unwrap();
        }
        old.mark_written_slots();
        for key in 0..10u64 {
            let id = old.find_id(&key).unwrap();
            *old.value_mut(id) += 1;
        }
        let mut new = ExactTable::new(100, &profiles(), 1);
        new.mark_written_slots();
        new.adopt(&mut old);
        let mut came = 0;
        new.take_written_slots(|t, slot, how, _, before| {
            assert_eq!((how, before), (SlotWrite::Moved, None), "slot {slot}");
            came += usize::from(t.slot(slot).is_some());
            ControlFlow::Continue(())
        });
        assert_eq!(came, 100);
        let id = new.find_id(&50).unwrap();
        *new.value_mut(id) = 7;
        let mut seen = Vec::new();
        new.take_written_slots(|_, slot, how, _, before| {
            seen.push((slot, how, before.copied()));
            ControlFlow::Continue(())
        });
        assert_eq!(seen, [(id.0 as usize, SlotWrite::Value, Some((50, 500)))]);
        // A copy of a marking table keeps its marks, emptied or not.
        let mut emptied = new.clone();
        emptied.clear();
        let mut copy = emptied.clone();
        let mut gone = 0;
        copy.take_written_slots(|t, slot, how, _, before| {
            assert!(how == SlotWrite::Moved && before.is_some() && t.slot(slot).is_none());
            gone += 1;
            ControlFlow::Continue(())
        });
        assert_eq!(gone, 100);
    }

    /// Each source has its own bucket, which starts full, refills at the rate up to the
    /// burst and no further, takes no token for an add the table refuses (full, or the
    /// key there already), and survives a clock that steps back.
    #[test]
    fn insert_limits_are_per_source_buckets_that_refused_adds_do_not_drain() {
        let mut t: ExactTable<u64, u64> = ExactTable::new(8, &[ExpireProfile::NEVER], 1);
        t.set_insert_limit(Some(InsertLimit {
            per_second: 1,
            burst: 2,
        }));
        let s = 1_000 * MS;
        assert!(t.add_entry_from(0, 1, 0, 0, s).is_ok());
        assert_eq!(t.add_entry_from(0, 1, 0, 0, s), Err(AddError::Exists));
        assert!(
            t.add_entry_from(0, 2, 0, 0, s).is_ok(),
            "the refusal took no token"
        );
        assert_eq!(t.add_entry_from(0, 3, 0, 0, s), Err(AddError::RateLimited));
        // Another source, and a port number far past the others.
        assert!(t.add_entry_from(7, 3, 0, 0, s).is_ok());
        assert!(t.add_entry_from(u16::MAX, 4, 0, 0, s).is_ok());
        // Ten seconds earn the burst, not ten tokens; a clock a second back earns nothing.
        assert!(t.add_entry_from(0, 5, 0, 0, 11 * s).is_ok());
        assert!(t.add_entry_from(0, 6, 0, 0, 10 * s).is_ok());
        assert_eq!(
            t.add_entry_from(0, 7, 0, 0, 11 * s),
            Err(AddError::RateLimited)
        );
        assert_eq!(t.stats.add_rate_limited, 2);
        // A full table refuses without taking the source's token.
        let mut key = 100;
        while t.len() < t.capacity() {
            t.add_entry(key, 0, 0, 0).unwrap();
            key += 1;
        }
        assert_eq!(t.add_entry_from(9, key, 0, 0, s), Err(AddError::TableFull));
        assert_eq!(t.add_entry_from(9, key, 0, 0, s), Err(AddError::TableFull));
        t.delete(&100);
        assert!(t.add_entry_from(9, key, 0, 0, s).is_ok());
        assert!(
            t.add_entry_from(9, key + 1, 0, 0, s).is_err(),
            "table full again"
        );
        t.delete(&101);
        assert!(
            t.add_entry_from(9, key + 1, 0, 0, s).is_ok(),
            "the second token"
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Lookup(u16),
        Add(u16, u32, u8),
        Delete(u16),
        Restart(u16),
        Update(u16, u32),
        Tick(u64),
        Sweep,
        /// The sync stage takes the slots written since it last did, all of them or
        /// (`Some(n)`) cut short after `n + 1` slots, as a pass with a budget does.
        Take(Option<u8>),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few distinct keys, so hits, collisions, deletes and a full table all happen.
        let key = 0u16..300;
        prop_oneof![
            4 => key.clone().prop_map(Op::Lookup),
            4 => (key.clone(), any::<u32>(), 0u8..3).prop_map(|(k, v, p)| Op::Add(k, v, p)),
            2 => key.clone().prop_map(Op::Delete),
            1 => key.clone().prop_map(Op::Restart),
            1 => (key, any::<u32>()).prop_map(|(k, v)| Op::Update(k, v)),
            1 => (0u64..4 * MS).prop_map(Op::Tick),
            1 => Just(Op::Sweep),
            1 => proptest::option::of(0u8..4).prop_map(Op::Take),
        ]
    }

    /// The sync stage's side of a marked table: every slot's entry as of the last take.
    struct Taken(Vec<Option<(u64, u32)>>);

    impl Taken {
        /// Takes the written slots, up to `cut + 1` of them if cut, checking each is
        /// reported once with its entry as taken last; then, if the take went to the
        /// end, that every slot not reported is as taken last (none missed, the slots a
        /// take cut short left behind included).
        fn take(
            &mut self,
            t: &mut ExactTable<u64, u32>,
            cut: Option<u8>,
        ) -> Result<(), TestCaseError> {
            let mut reported = vec![false; self.0.len()];
            let mut checked = Ok(());
            let mut left = cut.map_or(usize::MAX, usize::from);
            let all = t.take_written_slots(|t, slot, how, _, before| {
                let now = t.slot(slot).map(|(k, v, _)| (*k, *v));
                let then = std::mem::replace(&mut self.0[slot], now);
                let once = !std::mem::replace(&mut reported[slot], true);
                // Only a value changed in place: the same key there, before and after.
                let in_place = how == SlotWrite::Value;
                let same_key = then.map(|e| e.0) == now.map(|e| e.0) && now.is_some();
                if checked.is_ok() && (!once || before.copied() != then || in_place && !same_key) {
                    checked = Err(TestCaseError::fail(format!(
                        "slot {slot}: once {once}, {how:?}, before {before:?}, taken {then:?}"
                    )));
                }
                match left.checked_sub(1) {
                    Some(l) => {
                        left = l;
                        ControlFlow::Continue(())
                    }
                    None => ControlFlow::Break(()),
                }
            });
            checked?;
            prop_assert!(all || cut.is_some(), "a take not cut takes everything");
            if all {
                for (slot, taken) in self.0.iter().enumerate() {
                    let now = t.slot(slot).map(|(k, v, _)| (*k, *v));
                    prop_assert_eq!(now, *taken, "slot {} changed unreported", slot);
                }
            }
            Ok(())
        }
    }

    /// The reference: a map with the same semantics, no layout at all.
    #[derive(Default)]
    struct Model {
        map: HashMap<u64, (u32, u64, u8, bool, u64)>, // value, deadline, profile, notified, hits
        /// Expiries told by an add that took an expired entry's place, not yet drained.
        pending: Vec<(u64, bool)>,
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Random sequences of adds, lookups, in-place updates, deletes, timer restarts,
        /// clock ticks and sweeps give the same results as a plain map, and the Robin Hood
        /// invariant holds after every step; the slots written between two takes are
        /// reported once each, with their entries as the take before left them.
        #[test]
        fn behaves_like_a_map_with_timeouts(ops in proptest::collection::vec(op(), 1..400), seed in any::<u64>()) {
            let capacity = 200;
            let mut t: ExactTable<u64, u32> = ExactTable::new(capacity, &profiles(), seed);
            t.mark_written_slots();
            let mut taken = Taken(vec![None; t.slot_count()]);
            let mut m = Model::default();
            let mut now = 1_000 * MS;
            for op in ops {
                match op {
                    Op::Lookup(k) => {
                        let k = u64::from(k);
                        let got = t.lookup(&k, now).map(|id| *t.value(id));
                        // An entry past its deadline is a miss, swept or not.
                        let live = m.map.get_mut(&k).filter(|e| e.1 > now);
                        let want = live.map(|e| { e.4 += 1; e.0 });
                        prop_assert_eq!(got, want);
                    }
                    Op::Add(k, v, p) => {
                        let k = u64::from(k);
                        let got = t.add_entry(k, v, p, now).map(|_| ());
                        let deadline = match profiles()[usize::from(p)].mode {
                            ExpireMode::Never => NO_DEADLINE,
                            _ => now + profiles()[usize::from(p)].timeout_ns,
                        };
                        let want = match m.map.get(&k) {
                            Some(e) if e.1 > now => Err(AddError::Exists),
                            // An expired entry gives way, told once as deleted.
                            Some(e) => {
                                if !e.3 {
                                    m.pending.push((k, true));
                                }
                                m.map.insert(k, (v, deadline, p, false, 0));
                                Ok(())
                            }
                            None if m.map.len() >= capacity => Err(AddError::TableFull),
                            None => {
                                m.map.insert(k, (v, deadline, p, false, 0));
                                Ok(())
                            }
                        };
                        prop_assert_eq!(got, want);
                        // Visible to the very next lookup.
                        if got.is_ok() {
                            prop_assert_eq!(t.get(&k), Some(&v));
                        }
                    }
                    Op::Delete(k) => {
                        let k = u64::from(k);
                        prop_assert_eq!(t.delete(&k), m.map.remove(&k).is_some());
                    }
                    Op::Restart(k) => {
                        let k = u64::from(k);
                        if let Some(id) = t.lookup(&k, now) {
                            t.restart_timer(id, now);
                        }
                        if let Some(e) = m.map.get_mut(&k).filter(|e| e.1 > now) {
                            e.4 += 1;
                            let p = profiles()[usize::from(e.2)];
                            if p.mode != ExpireMode::Never {
                                e.1 = now + p.timeout_ns;
                                e.3 = false;
                            }
                        }
                    }
                    Op::Update(k, v) => {
                        let k = u64::from(k);
                        if let Some(id) = t.lookup(&k, now) {
                            *t.value_mut(id) = v;
                        }
                        if let Some(e) = m.map.get_mut(&k).filter(|e| e.1 > now) {
                            e.4 += 1;
                            e.0 = v;
                        }
                    }
                    Op::Tick(d) => now += d,
                    Op::Take(cut) => taken.take(&mut t, cut)?,
                    Op::Sweep => {
                        // A full sweep (budget = every slot) against the model's expiry.
                        t.sweep(now, usize::MAX);
                        let mut want: Vec<(u64, bool)> = std::mem::take(&mut m.pending);
                        m.map.retain(|k, e| {
                            if e.1 <= now && !e.3 {
                                let mode = profiles()[usize::from(e.2)].mode;
                                if mode == ExpireMode::AutoDelete {
                                    want.push((*k, true));
                                    return false;
                                }
                                want.push((*k, false));
                                e.3 = true;
                            }
                            true
                        });
                        let mut got: Vec<(u64, bool)> =
                            t.drain_notifications().map(|e| (e.key, e.deleted)).collect();
                        got.sort_unstable();
                        want.sort_unstable();
                        prop_assert_eq!(got, want);
                    }
                }
                t.check_invariant();
                prop_assert_eq!(t.len(), m.map.len());
            }
            taken.take(&mut t, None)?;
            for (k, e) in &m.map {
                let id = t.find(k).map(|i| EntryId(i as u32));
                prop_assert_eq!(id.map(|id| (*t.value(id), t.hits(id))), Some((e.0, e.4)));
            }
        }
    }

    #[test]
    fn a_full_table_refuses_and_counts_then_takes_again_after_a_delete() {
        let mut t: ExactTable<u64, u64> = ExactTable::new(1000, &[ExpireProfile::NEVER], 7);
        for k in 0..1000u64 {
            t.add_entry(k, k * 2, 0, 0).unwrap();
        }
        assert_eq!(t.add_entry(5000, 1, 0, 0), Err(AddError::TableFull));
        assert_eq!(t.stats.add_full, 1);
        assert!(t.delete(&17));
        t.add_entry(5000, 1, 0, 0).unwrap();
        for k in (0..1000u64).filter(|&k| k != 17) {
            assert_eq!(t.get(&k), Some(&(k * 2)));
        }
        assert_eq!(t.get(&5000), Some(&1));
    }

    /// A full table makes room: an expired entry in the new key's window gives way
    /// without any sweep, and with early drop an entry of an unestablished profile does,
    /// never an established one. A flood of new keys then displaces only its own kind.
    #[test]
    fn a_full_table_makes_room_with_expired_or_unestablished_entries_only() {
        let profiles = [
            // 0: established, long; 1: unestablished, short.
            ExpireProfile {
                timeout_ns: 300_000 * MS,
                mode: ExpireMode::AutoDelete,
            },
            ExpireProfile {
                timeout_ns: 30_000 * MS,
                mode: ExpireMode::AutoDelete,
            },
        ];
        let established = 0..400u64;
        let fill = |early: bool| {
            let mut t: ExactTable<u64, u64> = ExactTable::new(800, &profiles, 3);
            if early {
                t.set_early_drop(&[1]);
            }
            for k in established.clone() {
                t.add_entry(k, k, 0, 0).unwrap();
            }
            for k in 1_000..1_400u64 {
                t.add_entry(k, k, 1, 0).unwrap();
            }
            t
        };
        // A flood of 8,000 new unestablished keys, 10x the table.
        let flood = |t: &mut ExactTable<u64, u64>| {
            (10_000..18_000u64)
                .filter(|&k| t.add_entry(k, k, 1, MS).is_ok())
                .count()
        };
        let mut plain = fill(false);
        assert_eq!(
            flood(&mut plain),
            0,
            "no early drop: the full table refuses"
        );
        assert_eq!(plain.stats.add_full, 8_000);
        let mut t = fill(true);
        let taken = flood(&mut t);
        assert!(taken > 7_900, "{taken} of 8,000 flood keys taken");
        assert_eq!(t.stats.early_dropped, taken as u64);
        assert_eq!(t.stats.add_full, 8_000 - taken as u64);
        assert_eq!(t.len(), 800);
        for k in established.clone() {
            assert!(t.lookup(&k, 2 * MS).is_some(), "established {k} kept");
        }
        t.check_invariant();
        // Expired entries give way with or without early drop, before any sweep.
        let late = 30_001 * MS;
        let mut t = fill(false);
        let taken = (20_000..20_400u64)
            .filter(|&k| t.add_entry(k, k, 0, late).is_ok())
            .count();
        // Most: the last ones find no expired entry left in their window (the sweep
        // reclaims the rest).
        assert!(taken > 300, "{taken} of 400 took expired entries' room");
        assert_eq!(t.stats.expired_deleted, taken as u64);
        for k in established {
            assert!(t.lookup(&k, late).is_some(), "established {k} kept");
        }
        t.check_invariant();
    }

    /// PNA: a hit does not restart the timer; only the action's restart does. The sweep
    /// with a small budget finds every expired entry within `slots / budget` calls.
    #[test]
    fn hits_do_not_restart_timers_and_a_bounded_sweep_finds_every_expiry() {
        let mut t: ExactTable<u32, u8> = ExactTable::new(1000, &profiles(), 1);
        for k in 0..500u32 {
            t.add_entry(k, 0, 2, 0).unwrap(); // AutoDelete after 5 ms
        }
        // Keys below 100 are hit all along but never restarted; 100..200 are restarted.
        let mut now = 0;
        while now < 4 * MS {
            for k in 0..200u32 {
                let id = t.lookup(&k, now).unwrap();
                if k >= 100 {
                    t.restart_timer(id, now);
                }
            }
            now += MS;
        }
        now = 6 * MS;
        let slots = t.meta.len();
        let mut calls = 0;
        let mut expired: Vec<u32> = Vec::new();
        while calls * 64 < slots {
            t.sweep(now, 64);
            expired.extend(t.drain_notifications().map(|e| e.key));
            calls += 1;
        }
        assert_eq!(expired.len(), 400, "all but the restarted 100 expired");
        assert!(expired.iter().all(|k| !(100..200).contains(k)));
        assert_eq!(t.len(), 100);
        assert_eq!(t.stats.expired_deleted, 400);
        assert_eq!(t.stats.notifications_dropped, 0);
    }

    /// Nobody drains: `AutoDelete` still deletes (the lost notices are counted), while
    /// `NotifyControl` expiries wait until there is room, so none is lost.
    #[test]
    fn an_undrained_queue_loses_no_notify_control_expiry() {
        let mut t: ExactTable<u32, u8> = ExactTable::new(1000, &profiles(), 1);
        for k in 0..400u32 {
            t.add_entry(k, 0, 1, 0).unwrap(); // NotifyControl after 10 ms
        }
        for k in 400..800u32 {
            t.add_entry(k, 0, 2, 0).unwrap(); // AutoDelete after 5 ms
        }
        t.sweep(20 * MS, usize::MAX);
        let first: Vec<Expired<u32, u8>> = t.drain_notifications().collect();
        assert_eq!(first.len(), t.notification_limit, "the queue filled up");
        assert_eq!(t.len(), 400, "every AutoDelete entry is gone");
        let mut told = first.iter().filter(|e| !e.deleted).count();
        for _ in 0..10 {
            t.sweep(20 * MS, usize::MAX);
            told += t.drain_notifications().filter(|e| !e.deleted).count();
        }
        assert_eq!(told, 400, "every NotifyControl expiry was told, once");
        assert_eq!(t.stats.expired_notified, 400);
        assert_eq!(t.len(), 400, "NotifyControl entries stay");
        assert!(t.stats.notifications_dropped > 0);
    }

    #[test]
    fn burst_lookup_equals_single_lookups() {
        let mut t: ExactTable<u64, u64> = ExactTable::new(5000, &[ExpireProfile::NEVER], 3);
        for k in (0..10_000u64).step_by(2) {
            t.add_entry(k, k + 1, 0, 0).unwrap();
        }
        let keys: Vec<u64> = (0..200).map(|i| i * 37 % 10_000).collect();
        let mut out = vec![None; keys.len()];
        t.lookup_burst(&keys, &mut out, 0);
        for (k, id) in keys.iter().zip(out) {
            assert_eq!(id.map(|id| *t.value(id)), t.get(k).copied());
        }
    }
}
