//! Control requests applied next to the tables: [`DeclaredTable`] holds an [`ExactTable`]
//! with its declaration and answers requests about it, writes all-or-nothing (an undo log);
//! [`Outbox`] holds a program's notifications until the runtime collects them.
//!
//! Must never: change any state when a request fails.

use crate::changes::Change;
use crate::exact::{AddError, EntryId, ExactTable, Hashed};
use crate::key_fields::KeyFields;
use crate::synced_table::{Decoded, MAX_FIELDS, Placed, SlotWords, TableSync};
use crate::table_key::TableKey;
use stateplane_api::{
    Action, Carried, ControlError, Declaration, Entry, Kind, Match, Notification, NotificationKind,
    READ_PAGE, Reply, Request, Write,
};

/// What a codec says when its key speaks for itself ([`KeyFields`]): its values only. Every
/// `ValueCodec` is an [`ExactCodec`].
pub trait ValueCodec {
    type Key: KeyFields;
    type Value: Copy + Default + bytemuck::Zeroable;
    /// The value of an entry whose action is `actions[action]`.
    fn value(action: usize, params: &[u128]) -> Self::Value;
    /// A value's action index, and its parameters written into `out` (room for every
    /// declared one, at most [`MAX_FIELDS`]: [`params_into`] writes them); the action and
    /// how many. With no allocation: a replicated table compares two values' parameters
    /// at each packet it looks up under a lease, a synced table encodes them per slot.
    fn action_values(value: &Self::Value, out: &mut [u128]) -> (usize, usize);
    /// The action index and parameters of a value, collected (requests, replies).
    fn action(value: &Self::Value) -> (usize, Vec<u128>) {
        collect_action(|out| Self::action_values(value, out))
    }
    /// The parameters that count (packets, bytes): synced within the threshold, where
    /// every other field is sent exactly ([`crate::synced_table`]).
    const COUNTING: &'static [&'static str] = &[];
    /// The expiry profile of an entry placed by a synced write.
    fn profile(_value: &Self::Value) -> u8 {
        0
    }
}

/// An action's parameters `params` written into `out`, as many as fit; how many
/// ([`ValueCodec::action_values`]).
pub fn params_into<const N: usize>(params: [u128; N], out: &mut [u128]) -> usize {
    let n = N.min(out.len());
    out[..n].copy_from_slice(&params[..n]);
    n
}

/// The action and parameters `action_values` writes, collected.
fn collect_action(action_values: impl FnOnce(&mut [u128]) -> (usize, usize)) -> (usize, Vec<u128>) {
    let mut params = [0; MAX_FIELDS];
    let (action, n) = action_values(&mut params);
    (action, params[..n].to_vec())
}

impl<C: ValueCodec> ExactCodec for C {
    type Key = C::Key;
    type Value = C::Value;
    fn key(fields: &[Match]) -> C::Key {
        C::Key::of(fields)
    }
    fn key_of_values(values: &[u128]) -> C::Key {
        C::Key::of_values(values)
    }
    fn fields(key: &C::Key) -> Vec<Match> {
        key.fields()
    }
    fn value(action: usize, params: &[u128]) -> C::Value {
        C::value(action, params)
    }
    const COUNTING: &'static [&'static str] = C::COUNTING;
    fn profile(value: &C::Value) -> u8 {
        C::profile(value)
    }
    fn key_values(key: &C::Key, out: &mut [u128]) {
        key.values(out);
    }
    fn action_values(value: &C::Value, out: &mut [u128]) -> (usize, usize) {
        C::action_values(value, out)
    }
}

/// How a program's exact table turns keys and values into entries and back (implement
/// [`ValueCodec`] instead where the key's own fields will do).
pub trait ExactCodec {
    type Key: TableKey;
    type Value: Copy + Default + bytemuck::Zeroable;
    fn key(fields: &[Match]) -> Self::Key;
    /// The key of its fields' exact values, in order (a synced table's slot decoded); as
    /// [`ExactCodec::key`] takes them unless the codec knows a way with no `Match` made.
    fn key_of_values(values: &[u128]) -> Self::Key {
        let fields: Vec<Match> = values.iter().map(|&v| Match::Exact(v)).collect();
        Self::key(&fields)
    }
    fn fields(key: &Self::Key) -> Vec<Match>;
    /// The value of an entry whose action is `actions[action]`.
    fn value(action: usize, params: &[u128]) -> Self::Value;
    /// As [`ValueCodec::action_values`].
    fn action_values(value: &Self::Value, out: &mut [u128]) -> (usize, usize);
    /// As [`ValueCodec::action`].
    fn action(value: &Self::Value) -> (usize, Vec<u128>) {
        collect_action(|out| Self::action_values(value, out))
    }
    /// As [`ValueCodec::COUNTING`].
    const COUNTING: &'static [&'static str] = &[];
    /// As [`ValueCodec::profile`].
    fn profile(_value: &Self::Value) -> u8 {
        0
    }
    /// The key's field values into `out`, as `fields` has them.
    fn key_values(key: &Self::Key, out: &mut [u128]) {
        for (o, m) in out.iter_mut().zip(Self::fields(key)) {
            *o = match m {
                Match::Exact(v) => v,
                _ => 0,
            };
        }
    }
}

/// Forgets the entries of a synced write decoded ahead of its commit (`placing`, and
/// what became of them) once they no longer hold: `sync` says none were decoded ahead, or
/// the write is no longer the one run they were decoded from. The one place that keeps
/// them in step with `sync`.
fn forget_stale_ahead<T>(sync: &TableSync, placing: &mut Vec<T>, ahead: &mut Placed) {
    if sync.decoded_ahead() == 0 {
        placing.clear();
        *ahead = Placed::default();
    }
}

/// What a synced write does with one of its entries.
#[derive(Clone)]
enum Place<K, V> {
    Delete(K),
    /// The key's entry becomes the value, with the expiry profile.
    Put(K, V, u8),
}

/// A synced write's entry, with where its key hashes in the table it goes into.
type Placing<K, V> = (Place<K, V>, Hashed);

impl<K, V> Place<K, V> {
    fn key(&self) -> &K {
        match self {
            Place::Delete(key) | Place::Put(key, ..) => key,
        }
    }
}

/// An exact table as a program keeps it when the control plane may see it: the table
/// (reached through `Deref` on the fast path, unchanged), its declaration, and the
/// notifications it holds for the control plane. One piece of code answers every program's
/// requests about its exact tables.
pub struct DeclaredTable<C: ExactCodec> {
    table: ExactTable<C::Key, C::Value>,
    decl: Declaration,
    outbox: Outbox,
    /// With the table `synced`: its layout as synced state, and a write on its way.
    sync: Option<Box<TableSync>>,
    /// A synced write's entries on their way into the table, those decoded ahead of its
    /// commit ([`DeclaredTable::stage_synced_run`]) among them while `sync` says they
    /// hold, with what became of those; after the commit, the write's entries
    /// ([`DeclaredTable::entries_written_last`]) until the next write. Each with where
    /// its key hashes in `table`, worked out as it is decoded: most are decoded ahead,
    /// while the worker waits for the write's next part, not in the commit it waits for.
    placing: Vec<Placing<C::Key, C::Value>>,
    placed_ahead: Placed,
    /// The data plane's clock at the last sweep: when a synced write's entries are placed
    /// (between bursts, where no packet brings the time).
    now_ns: u64,
    /// With the table `replicated`: per action, the parameters its replicated state
    /// leaves out (bit i: parameter i), see [`DeclaredTable::replicate`].
    replicated: Option<Vec<u32>>,
    /// With leases checked where the program looks its entries up
    /// ([`DeclaredTable::check_leases`]): the entries found under their lease mark since
    /// the replication stage last took their changes.
    leased_reads: Option<Box<LeasedReads<C::Key, C::Value>>>,
}

/// The entries found under their lease mark, each as it was then, and (while they are
/// taken) the places of those changed since.
#[derive(Clone)]
struct LeasedReads<K, V> {
    reads: Vec<LeasedRead<K, V>>,
    changed: Vec<EntryId>,
    /// The table's [`ExactTable::moved`] at the first of `reads`.
    moved: u64,
}

/// An entry a packet found under its lease mark, and its value then.
#[derive(Clone, Copy)]
struct LeasedRead<K, V> {
    id: EntryId,
    key: K,
    value: V,
    /// The packet's place in its burst (as its lookup was told).
    packet: u16,
}

/// A packet's entry is not marked leased, and the replication stage did not admit the
/// packet: the program must leave the packet unprocessed, for the stage to admit
/// ([`DeclaredTable::lookup_leased`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotLeased;

impl<C: ExactCodec> DeclaredTable<C> {
    pub fn new(table: ExactTable<C::Key, C::Value>, decl: Declaration) -> Self {
        DeclaredTable {
            table,
            decl,
            outbox: Outbox::new(Outbox::DEFAULT_LIMIT),
            sync: None,
            placing: Vec::new(),
            placed_ahead: Placed::default(),
            now_ns: 0,
            replicated: None,
            leased_reads: None,
        }
    }

    /// An entry's words as synced state (with no key, its value's words only).
    fn encode(words: &SlotWords, key: Option<&C::Key>, value: &C::Value, out: &mut [u64]) {
        let mut key_values = [0; MAX_FIELDS];
        let mut params = [0; MAX_FIELDS];
        let key_values = &mut key_values[..words.key_fields()];
        if let Some(key) = key {
            C::key_values(key, key_values);
        }
        let (action, n) = C::action_values(value, &mut params);
        words.encode(action, key.map(|_| &*key_values), &params[..n], out);
    }

    /// Tracks the table's entries as synced state `id` if `name` is its own; the
    /// locations it has (`stride` words a slot), or `None` (another name, or too many).
    pub fn track(&mut self, name: &str, id: u16) -> Option<u32> {
        if name != self.decl.name {
            return None;
        }
        let words = SlotWords::of(&self.decl, C::COUNTING)?;
        let sync = TableSync::start(id, words, &mut self.table)?;
        let length = sync.length();
        self.sync = Some(Box::new(sync));
        Some(length)
    }

    /// The bytes [`DeclaredTable::make_synced_resident`] has the kernel supply besides
    /// the table (0 if not synced).
    pub fn synced_room_bytes(&self) -> u64 {
        self.sync.as_ref().map_or(0, |sync| {
            let placing = sync.staged_slots() * std::mem::size_of::<Placing<C::Key, C::Value>>();
            sync.room_bytes::<C::Key, C::Value>() + placing as u64
        })
    }

    /// Has the kernel supply now the pages of the synced table, of a write's staging and
    /// of its entries decoded ahead (nothing if not synced): see
    /// [`TableSync::make_resident`].
    pub fn make_synced_resident(&mut self) {
        if let Some(sync) = &mut self.sync {
            sync.make_resident(&mut self.table);
            let room = sync.staged_slots().saturating_sub(self.placing.len());
            stateplane_mem::reserve_populated(&mut self.placing, room);
        }
    }

    /// Appends the words of its slots changed since the last call (nothing if not
    /// synced), slot after slot until `budget` words are appended; whether every changed
    /// slot was taken ([`TableSync::take_changes`]).
    pub fn changes(&mut self, out: &mut Vec<Change>, budget: usize) -> bool {
        match &mut self.sync {
            Some(sync) => sync.take_changes(&mut self.table, Self::encode, out, budget),
            None => true,
        }
    }

    /// `(id, locations)` if synced.
    pub fn synced(&self) -> Option<(u16, u32)> {
        self.sync.as_ref().map(|s| (s.id, s.length()))
    }

    /// Word `index` of synced state `id`, if it is this table's.
    pub fn read_synced(&self, id: u16, index: u32) -> Option<u64> {
        let mut word = [0];
        (self.read_synced_run(id, index, &mut word) == 1).then_some(word[0])
    }

    /// Words `first..` of synced state `id` into `out`, each slot encoded once; how many
    /// (none if the state is not this table's, fewer past its end).
    pub fn read_synced_run(&self, id: u16, first: u32, out: &mut [u64]) -> usize {
        match self.sync.as_ref().filter(|s| s.id == id) {
            Some(sync) => sync.read_run(&self.table, Self::encode, first, out),
            None => 0,
        }
    }

    /// Holds word `index` of a write into synced state `id` until
    /// [`DeclaredTable::commit_synced_write`] places the write's entries; `Some(0)`, or
    /// `None` past the end or for another id. A table's write replaces nothing where its
    /// words are numbered: its entries land wherever their keys hash.
    pub fn write_synced(&mut self, id: u16, index: u32, value: u64) -> Option<u64> {
        let sync = self.sync.as_mut().filter(|s| s.id == id)?;
        sync.stage(index, value).then_some(0)
    }

    /// As [`DeclaredTable::write_synced`] for `values` at `first`, `first + 1`, ...
    pub fn write_synced_run(&mut self, id: u16, first: u32, values: &[u64]) {
        if let Some(sync) = self.sync.as_mut().filter(|s| s.id == id) {
            sync.stage_run(first, values);
        }
    }

    /// As [`DeclaredTable::write_synced_run`], ahead of the write's commit (its parts as
    /// they arrive): the entries whole so far are decoded now, so that the commit, which
    /// the worker waits for, only places them. `false`, nothing taken, for another id or
    /// a replicated table (whose commit refuses every entry).
    pub fn stage_synced_run(&mut self, id: u16, first: u32, values: &[u64]) -> bool {
        let Some(sync) = self.sync.as_mut().filter(|s| s.id == id) else {
            return false;
        };
        if self.replicated.is_some() {
            return false;
        }
        sync.stage_run(first, values);
        let (placing, table) = (&mut self.placing, &self.table);
        forget_stale_ahead(sync, placing, &mut self.placed_ahead);
        self.placed_ahead += sync.decode_ahead(|decoded| {
            placing.push(Self::place_of(table, decoded));
            true
        });
        true
    }

    /// Drops the synced write staged, which will not commit.
    pub fn drop_synced_write(&mut self) {
        if let Some(sync) = &mut self.sync {
            sync.drop_staged();
        }
        self.placing.clear();
        self.placed_ahead = Placed::default();
    }

    /// What a decoded entry of a synced write does, and where its key hashes in `table`.
    fn place_of(
        table: &ExactTable<C::Key, C::Value>,
        decoded: &Decoded,
    ) -> Placing<C::Key, C::Value> {
        let key = C::key_of_values(decoded.key());
        let hashed = table.hashed(&key);
        let place = match decoded.action {
            None => Place::Delete(key),
            Some(action) => {
                let value = C::value(action, decoded.params());
                Place::Put(key, value, C::profile(&value))
            }
        };
        (place, hashed)
    }

    /// Places the entries of the write staged by [`DeclaredTable::write_synced`], each by
    /// its key (see [`crate::synced_table`]): added, or its value and expiry profile
    /// replaced, or deleted. A replicated table refuses every entry: its entries change
    /// through the store alone, which a synced write would go around (the store, and the
    /// switch that takes a flow's lease next, would never see it).
    pub fn commit_synced_write(&mut self) -> Placed {
        let Some(sync) = &mut self.sync else {
            return Placed::default();
        };
        if self.replicated.is_some() {
            return sync.commit(|_| false);
        }
        // The entries first (those decoded ahead of the commit are), then their places:
        // each place is a cache miss in a large table, which looking ahead of the placing
        // overlaps.
        let (placing, table) = (&mut self.placing, &self.table);
        forget_stale_ahead(sync, placing, &mut self.placed_ahead);
        let mut placed = std::mem::take(&mut self.placed_ahead);
        placed += sync.commit(|decoded| {
            placing.push(Self::place_of(table, decoded));
            true
        });
        /// Entries looked ahead.
        const AHEAD: usize = 8;
        let (table, now_ns) = (&mut self.table, self.now_ns);
        // What the placing changes goes to the collector as the write's (whatever the
        // values, one update each to the rate controller), entries it moves aside too.
        table.placing_a_write(true);
        for (_, hashed) in placing.iter().take(AHEAD) {
            table.prefetch_hashed(*hashed);
        }
        for i in 0..placing.len() {
            if let Some((_, ahead)) = placing.get(i + AHEAD) {
                table.prefetch_hashed(*ahead);
            }
            let (place, hashed) = &placing[i];
            let ok = match place {
                // A key not held is deleted already: nothing to refuse.
                Place::Delete(key) => {
                    table.delete(key);
                    true
                }
                // The profile first: one that does not exist changes nothing.
                Place::Put(key, value, profile) => match table.find_id_hashed(key, *hashed) {
                    Some(id) => {
                        let ok = table.set_profile(id, *profile, now_ns).is_ok();
                        if ok {
                            *table.value_mut(id) = *value;
                        }
                        ok
                    }
                    None => (table
                        .add_hashed_keeping_others(*key, *hashed, *value, *profile, now_ns))
                    .is_ok(),
                },
            };
            if !ok {
                placed.entries -= 1;
                placed.refused += 1;
            }
        }
        table.placing_a_write(false);
        placed
    }

    /// Every entry, those the last committed synced write placed after the others: the
    /// order in which a program makes again the state it keeps beside the table, so that
    /// where two entries clash there, the one written loses to the one that was here.
    pub fn entries_written_last(&self) -> Vec<(C::Key, C::Value)> {
        // Keys are not `Hash`: the written ones by their table hash (any seed), then equal.
        let mut written: std::collections::HashMap<u64, Vec<C::Key>> = Default::default();
        for (place, _) in &self.placing {
            let key = place.key();
            written.entry(key.hash_with(0)).or_default().push(*key);
        }
        let is_written =
            |key: &C::Key| (written.get(&key.hash_with(0))).is_some_and(|keys| keys.contains(key));
        let (mut here, mut moved) = (Vec::new(), Vec::new());
        for (key, value, _) in self.table.iter() {
            let to = if is_written(key) {
                &mut moved
            } else {
                &mut here
            };
            to.push((*key, *value));
        }
        here.append(&mut moved);
        here
    }

    /// The data plane's clock at the last sweep (when a synced write's entries were placed).
    pub fn swept_at_ns(&self) -> u64 {
        self.now_ns
    }

    /// Keeps the table's entries as replicated state if `name` is its own (`false`
    /// otherwise). The counting parameters ([`ValueCodec::COUNTING`]) are part of it only
    /// `with_counts`: where the counts are the state itself (`counter`). Where they are
    /// statistics beside hard state (a connection's packets), they stay local, so that a
    /// packet that only counts changes nothing the store keeps (read-centric programs).
    pub fn replicate(&mut self, name: &str, with_counts: bool) -> bool {
        let Kind::Table { actions, .. } = &self.decl.kind else {
            return false;
        };
        if name != self.decl.name {
            return false;
        }
        let left_out = |action: &Action| {
            (action.params.iter().enumerate())
                .filter(|(i, p)| *i < 32 && !with_counts && C::COUNTING.contains(&p.name.as_str()))
                .fold(0u32, |mask, (i, _)| mask | 1 << i)
        };
        self.replicated = Some(actions.iter().map(left_out).collect());
        true
    }

    /// Whether the table is replicated ([`DeclaredTable::replicate`]).
    pub fn replicated(&self) -> bool {
        self.replicated.is_some()
    }

    /// Whether the program's lookups check each entry's lease mark
    /// ([`DeclaredTable::check_leases`]).
    pub fn leases_checked(&self) -> bool {
        self.leased_reads.is_some()
    }

    /// Has the program's lookups ([`DeclaredTable::lookup_leased`]) check each entry's
    /// lease mark, for a replicated table; whether they do.
    pub fn check_leases(&mut self) -> bool {
        if self.replicated.is_some() && self.leased_reads.is_none() {
            self.leased_reads = Some(Box::new(LeasedReads {
                reads: Vec::new(),
                changed: Vec::new(),
                moved: 0,
            }));
        }
        self.leased_reads.is_some()
    }

    /// For a packet whose lease is to be checked at `check` that names no key of this
    /// table where its program looked (an index beside the table found nothing, as
    /// `nat`'s answers for an answer whose translation is elsewhere): [`NotLeased`] where
    /// the table checks leases, so that the replication stage finds the packet's flow
    /// (by its alias) and admits it; else nothing (the program goes on without an entry).
    pub fn no_key_leased(&self, check: Option<u16>) -> Result<(), NotLeased> {
        match check {
            Some(_) if self.leases_checked() => Err(NotLeased),
            _ => Ok(()),
        }
    }

    /// The entry of `key` at `now_ns` as [`ExactTable::lookup`] finds it, for a packet
    /// whose lease is to be checked at `check` (its place in its burst;
    /// `PacketDesc::lease_check`), where the table checks leases: only an entry marked
    /// leased ([`ExactTable::mark_leased`]), kept with its value and the packet's place to
    /// compare after the program ([`DeclaredTable::take_leased_changes`]). For a packet
    /// the replication stage admitted (`None`: it accounts for that packet itself), or
    /// where the table does not check leases, any entry or none. [`NotLeased`]
    /// otherwise: the packet is to be left as it is.
    #[inline]
    pub fn lookup_leased(
        &mut self,
        key: &C::Key,
        now_ns: u64,
        check: Option<u16>,
    ) -> Result<Option<EntryId>, NotLeased> {
        let (Some(reads), Some(packet)) = (&mut self.leased_reads, check) else {
            return Ok(self.table.lookup(key, now_ns));
        };
        match self.table.lookup(key, now_ns) {
            Some(id) if self.table.leased(id) => {
                if reads.reads.is_empty() {
                    reads.moved = self.table.moved();
                }
                reads.reads.push(LeasedRead {
                    id,
                    key: *key,
                    value: *self.table.value(id),
                    packet,
                });
                Ok(Some(id))
            }
            _ => Err(NotLeased),
        }
    }

    /// The lookups that found an entry under its lease mark since the last call, in
    /// order: each of an entry whose replicated state may have changed since (its action,
    /// or a parameter the state keeps; an entry gone or moved counts as changed), or with
    /// `every`, each, given to `found` with its key, its packet's place and whether its
    /// entry changed; how many there were.
    pub fn take_leased_changes(
        &mut self,
        every: bool,
        mut found: impl FnMut(&C::Key, u16, bool),
    ) -> u64 {
        let Some(mut leased) = self.leased_reads.take() else {
            return 0;
        };
        let LeasedReads {
            reads,
            changed,
            moved,
        } = &mut *leased;
        let looked = reads.len() as u64;
        // With no entry moved since, each is where it was found, and looked at there alone.
        let unmoved = *moved == self.table.moved();
        // Entries changed, by their place when found (a burst's few).
        for read in reads.iter() {
            let same = match unmoved {
                true => self.same_replicated(&read.value, self.table.value(read.id)),
                false => {
                    (self.table.slot(read.id.place() as usize)).is_some_and(|(key, value, _)| {
                        *key == read.key && self.same_replicated(&read.value, value)
                    })
                }
            };
            if !same && !changed.contains(&read.id) {
                changed.push(read.id);
            }
        }
        if every || !changed.is_empty() {
            for read in reads.iter() {
                let change = changed.contains(&read.id);
                if every || change {
                    found(&read.key, read.packet, change);
                }
            }
        }
        reads.clear();
        changed.clear();
        self.leased_reads = Some(leased);
        looked
    }

    /// Whether two values hold the same replicated state (the counts left out of it may
    /// differ).
    fn same_replicated(&self, a: &C::Value, b: &C::Value) -> bool {
        /// Most tables' actions have this many parameters or fewer: read into arrays this
        /// small, they are compared with no more zeroed.
        const FEW: usize = 4;
        let (mut pa, mut pb) = ([0u128; FEW], [0u128; FEW]);
        let (action, n) = C::action_values(a, &mut pa);
        if n > FEW {
            let (mut pa, mut pb) = ([0u128; MAX_FIELDS], [0u128; MAX_FIELDS]);
            return C::action_values(b, &mut pb) == (action, n)
                && C::action_values(a, &mut pa) == (action, n)
                && self.same_kept(action, &pa[..n], &pb[..n]);
        }
        C::action_values(b, &mut pb) == (action, n) && self.same_kept(action, &pa[..n], &pb[..n])
    }

    /// Whether two parameter lists of `action` agree on those its replicated state keeps.
    fn same_kept(&self, action: usize, a: &[u128], b: &[u128]) -> bool {
        let left_out = self.replicated_params(action).map_or(0, |(mask, _)| mask);
        (a.iter().zip(b).enumerate()).all(|(i, (x, y))| x == y || left_out & (1 << i) != 0)
    }

    /// The parameters action `action`'s replicated state leaves out, and how many it has.
    fn replicated_params(&self, action: usize) -> Option<(u32, usize)> {
        let left_out = *self.replicated.as_ref()?.get(action)?;
        match &self.decl.kind {
            Kind::Table { actions, .. } => Some((left_out, actions.get(action)?.params.len())),
            _ => None,
        }
    }

    /// A replicated flow's state (docs/REPLICATION.md): the entry of `key` as bytes, its
    /// action (one byte) then each parameter it keeps (16 bytes, little-endian), appended
    /// to `out`, and when the entry's idle time runs out (`u64::MAX`: never); `None`
    /// (nothing appended) without an entry, or when the table is not replicated. `hint`:
    /// where the entry was found last (any value will do: [`ExactTable::find_id_hinted`]),
    /// made where it is found now.
    pub fn replicated_state_into(
        &self,
        key: &C::Key,
        out: &mut Vec<u8>,
        hint: &mut u32,
    ) -> Option<u64> {
        let id = self.table.find_id_hinted(key, *hint)?;
        *hint = id.place();
        let mut params = [0u128; MAX_FIELDS];
        let (action, n) = C::action_values(self.table.value(id), &mut params);
        let (Some((left_out, _)), Ok(action)) =
            (self.replicated_params(action), u8::try_from(action))
        else {
            return None;
        };
        out.push(action);
        for (i, p) in params[..n].iter().enumerate() {
            if left_out & (1 << i) == 0 {
                out.extend_from_slice(&p.to_le_bytes());
            }
        }
        Some(self.table.deadline_ns(id))
    }

    /// Makes `key`'s entry the one `state` holds ([`DeclaredTable::replicated_state_into`]'s
    /// form; `None` or no bytes: no entry), in place of what the table has; the parameters
    /// left out of it keep their values here (zero in a new entry). Never makes room by
    /// removing another entry (whose flow's state this worker must keep); `false` if
    /// `state` is not an entry of this table or the table is full (nothing changed).
    pub fn install_replicated(&mut self, key: C::Key, state: Option<&[u8]>, now_ns: u64) -> bool {
        // An entry installed is one the stage marks again when its flow is steady.
        self.table.mark_leased(&key, None);
        let Some((&action, kept)) = state.and_then(<[u8]>::split_first) else {
            self.table.delete(&key);
            return true;
        };
        let action = usize::from(action);
        let Some((left_out, n)) = self.replicated_params(action) else {
            return false;
        };
        let n = n.min(MAX_FIELDS);
        if kept.len() != 16 * (n - (left_out.count_ones() as usize).min(n)) {
            return false;
        }
        let id = self.table.find_id(&key);
        let mut values = [0u128; MAX_FIELDS];
        if let Some(id) = id {
            C::action_values(self.table.value(id), &mut values);
        }
        let mut kept = kept.chunks_exact(16);
        for (i, v) in values[..n].iter_mut().enumerate() {
            if left_out & (1 << i) != 0 {
                continue;
            }
            let mut b = [0; 16];
            b.copy_from_slice(kept.next().unwrap_or(&[0; 16]));
            *v = u128::from_le_bytes(b);
        }
        let value = C::value(action, &values[..n]);
        if let Some(id) = id {
            if self
                .table
                .set_profile(id, C::profile(&value), now_ns)
                .is_err()
            {
                return false;
            }
            *self.table.value_mut(id) = value;
            return true;
        }
        self.table
            .add_entry_keeping_others(key, value, C::profile(&value), now_ns)
            .is_ok()
    }

    pub fn declaration(&self) -> &Declaration {
        &self.decl
    }

    /// Takes the entries of `old`, the table this one replaces (a reload), when they mean
    /// the same here (the same key and value fields), as [`ExactTable::adopt`] does, and
    /// the notifications `old` had not handed out yet.
    pub fn adopt(&mut self, old: &mut Self) -> Carried {
        let name = &self.decl.name;
        if self.decl.kind != old.decl.kind {
            return Carried::afresh(name, "its key or value fields changed");
        }
        let adopted = self.table.adopt(&mut old.table);
        std::mem::swap(&mut self.outbox, &mut old.outbox);
        self.now_ns = old.now_ns;
        Carried::entries(
            name,
            adopted.kept,
            adopted.dropped,
            "past the new capacity, or of a timeout no longer declared",
        )
    }

    /// Answers a request about this table (checked against its declaration); entries the
    /// control plane inserts get expiry profile 0.
    pub fn answer(&mut self, request: &Request, now_ns: u64) -> Result<Reply, ControlError> {
        ExactControl::<C> {
            decl: &self.decl,
            table: &mut self.table,
            profile: 0,
            now_ns,
        }
        .answer(request)
    }

    /// As [`answer`](Self::answer), and shows each entry a write deleted to `deleted`
    /// (for state derived from the table, such as a reverse index). A refused request
    /// deleted nothing.
    pub fn answer_seeing_deletes(
        &mut self,
        request: &Request,
        now_ns: u64,
        mut deleted: impl FnMut(&C::Key, &C::Value),
    ) -> Result<Reply, ControlError> {
        let doomed: Vec<(C::Key, C::Value)> = match request {
            Request::Write { writes, .. } => writes
                .iter()
                .filter_map(|w| match w {
                    Write::Delete(fields) => {
                        let key = C::key(fields);
                        self.table.get(&key).map(|v| (key, *v))
                    }
                    _ => None,
                })
                .collect(),
            _ => Vec::new(),
        };
        let reply = self.answer(request, now_ns)?;
        for (key, value) in &doomed {
            if self.table.get(key).is_none() {
                deleted(key, value);
            }
        }
        Ok(reply)
    }

    /// Sweeps up to `budget` slots for expired entries and queues their notifications,
    /// showing each expired entry to `seen` first (a program may keep state derived from
    /// it, such as a reverse index).
    pub fn expire(&mut self, now_ns: u64, budget: usize, seen: impl FnMut(&C::Key, &C::Value)) {
        self.now_ns = now_ns;
        self.table.sweep(now_ns, budget);
        self.outbox.expired::<C>(&self.decl, &mut self.table, seen);
    }

    /// Queues a notification of the program's own (a digest).
    pub fn notify(&mut self, n: Notification) {
        self.outbox.push(n);
    }

    /// Queues a digest of an entry (e.g. one the data plane just added), for a control
    /// plane that follows the table.
    pub fn digest(&mut self, key: &C::Key, value: &C::Value, at_ns: u64) {
        let Kind::Table { actions, .. } = &self.decl.kind else {
            return;
        };
        if self.outbox.pending.len() >= self.outbox.limit {
            self.outbox.dropped += 1;
            return;
        }
        let entry = entry_of::<C>(actions, key, value, 0);
        self.outbox.push(Notification {
            table: self.decl.name.clone(),
            kind: NotificationKind::Digest,
            entry,
            at_ns,
        });
    }

    /// Notifications lost because the outbox was full.
    pub fn notifications_dropped(&self) -> u64 {
        self.outbox.dropped
    }

    /// Moves the queued notifications into `out` (for `Program::notifications`).
    pub fn take_notifications(&mut self, out: &mut Vec<Notification>) {
        out.append(&mut self.outbox.pending);
    }
}

impl<C: ExactCodec> std::ops::Deref for DeclaredTable<C> {
    type Target = ExactTable<C::Key, C::Value>;
    fn deref(&self) -> &Self::Target {
        &self.table
    }
}

impl<C: ExactCodec> std::ops::DerefMut for DeclaredTable<C> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.table
    }
}

impl<C: ExactCodec> Clone for DeclaredTable<C> {
    fn clone(&self) -> Self {
        DeclaredTable {
            table: self.table.clone(),
            decl: self.decl.clone(),
            outbox: self.outbox.clone(),
            sync: self.sync.clone(),
            placing: self.placing.clone(),
            placed_ahead: self.placed_ahead,
            now_ns: self.now_ns,
            replicated: self.replicated.clone(),
            leased_reads: self.leased_reads.clone(),
        }
    }
}

/// An exact table's entry as the control plane sees it.
fn entry_of<C: ExactCodec>(actions: &[Action], key: &C::Key, value: &C::Value, hits: u64) -> Entry {
    let (a, params) = C::action(value);
    Entry {
        key: C::fields(key),
        action: actions.get(a).map_or("?", |a| a.name.as_str()).to_string(),
        params,
        priority: 0,
        hits,
    }
}

/// Control-plane access to an exact table: writes all-or-nothing, reads with hit counts.
struct ExactControl<'a, C: ExactCodec> {
    decl: &'a Declaration,
    table: &'a mut ExactTable<C::Key, C::Value>,
    /// The expiry profile control-plane inserts get.
    profile: u8,
    now_ns: u64,
}

enum Undo<K, V> {
    Remove(K),
    Restore(K, V),
    Reinsert(K, V, u8),
}

impl<C: ExactCodec> ExactControl<'_, C> {
    /// Answers a request that [`Declaration::check`] passed.
    pub fn answer(mut self, req: &Request) -> Result<Reply, ControlError> {
        let Kind::Table { actions, .. } = &self.decl.kind else {
            return Err(ControlError::Unavailable);
        };
        match req {
            Request::Write { writes, .. } => {
                let mut undo = Vec::with_capacity(writes.len());
                for w in writes {
                    if let Err(e) = self.write(actions, w, &mut undo) {
                        self.roll_back(undo);
                        return Err(e);
                    }
                }
                Ok(Reply::Done)
            }
            Request::Read { key, from, .. } => {
                let entry = |k: &C::Key, v: &C::Value, hits| entry_of::<C>(actions, k, v, hits);
                if let Some(key) = key {
                    let k = C::key(key);
                    let id = self.table.find_id(&k).ok_or_else(|| self.no_such_entry())?;
                    let found = entry(&k, self.table.value(id), self.table.hits(id));
                    return Ok(Reply::Page(vec![found], None));
                }
                let entries = self
                    .table
                    .iter_slots(*from, READ_PAGE)
                    .map(|(k, v, hits)| entry(k, v, hits))
                    .collect();
                let end = from.saturating_add(READ_PAGE);
                Ok(Reply::Page(
                    entries,
                    (end < self.table.slot_count()).then_some(end),
                ))
            }
            Request::Stats { .. } => {
                let s = &self.table.stats;
                Ok(Reply::Counters(vec![
                    ("entries", self.table.len() as u64),
                    (
                        "bytes",
                        ExactTable::<C::Key, C::Value>::bytes_for(self.table.capacity()),
                    ),
                    ("lookups", s.lookups),
                    ("hits", s.hits),
                    ("adds", s.adds),
                    ("adds_refused_full", s.add_full),
                    ("adds_refused_rate", s.add_rate_limited),
                    ("deletes", s.deletes),
                    ("early_dropped", s.early_dropped),
                    ("expired_deleted", s.expired_deleted),
                    ("expired_notified", s.expired_notified),
                    ("notifications_dropped", s.notifications_dropped),
                ]))
            }
            _ => Err(ControlError::Unavailable),
        }
    }

    fn write(
        &mut self,
        actions: &[Action],
        w: &Write,
        undo: &mut Vec<Undo<C::Key, C::Value>>,
    ) -> Result<(), ControlError> {
        match w {
            Write::Insert(e) => {
                let key = C::key(&e.key);
                let value = C::value(self.decl.action_index(actions, e)?, &e.params);
                let added =
                    (self.table).add_entry_keeping_others(key, value, self.profile, self.now_ns);
                match added {
                    Ok(_) => undo.push(Undo::Remove(key)),
                    Err(AddError::Exists) => {
                        return Err(ControlError::Exists {
                            table: self.decl.name.clone(),
                        });
                    }
                    Err(AddError::TableFull | AddError::NoSuchProfile | AddError::RateLimited) => {
                        return Err(ControlError::TableFull {
                            table: self.decl.name.clone(),
                            capacity: self.table.capacity(),
                        });
                    }
                }
            }
            Write::Modify(e) => {
                let key = C::key(&e.key);
                let value = C::value(self.decl.action_index(actions, e)?, &e.params);
                let id = self
                    .table
                    .find_id(&key)
                    .ok_or_else(|| self.no_such_entry())?;
                let old = std::mem::replace(self.table.value_mut(id), value);
                undo.push(Undo::Restore(key, old));
            }
            Write::Delete(k) => {
                let key = C::key(k);
                let id = self
                    .table
                    .find_id(&key)
                    .ok_or_else(|| self.no_such_entry())?;
                let (old, profile) = (*self.table.value(id), self.table.profile(id));
                self.table.delete(&key);
                undo.push(Undo::Reinsert(key, old, profile));
            }
        }
        Ok(())
    }

    /// Undoes applied writes, newest first, so each step finds the table as it left it
    /// (a reinsert takes back the slot its delete freed).
    fn roll_back(&mut self, undo: Vec<Undo<C::Key, C::Value>>) {
        for u in undo.into_iter().rev() {
            match u {
                Undo::Remove(k) => {
                    self.table.delete(&k);
                }
                Undo::Restore(k, v) => {
                    if let Some(id) = self.table.find_id(&k) {
                        *self.table.value_mut(id) = v;
                    }
                }
                Undo::Reinsert(k, v, p) => {
                    // Cannot fail: the delete being undone freed room and the key.
                    let _ = self.table.add_entry(k, v, p, self.now_ns);
                }
            }
        }
    }

    fn no_such_entry(&self) -> ControlError {
        ControlError::NoSuchEntry {
            table: self.decl.name.clone(),
        }
    }
}

/// Notifications a program holds until the runtime collects them between bursts: at most
/// `limit`, the rest counted as dropped (a slow subscriber never holds up the data plane).
#[derive(Debug, Clone, Default)]
pub struct Outbox {
    pub pending: Vec<Notification>,
    pub dropped: u64,
    limit: usize,
}

impl Outbox {
    /// What a worker holds between two collections unless a program says otherwise.
    pub const DEFAULT_LIMIT: usize = 4096;

    pub fn new(limit: usize) -> Self {
        Outbox {
            pending: Vec::new(),
            dropped: 0,
            limit,
        }
    }

    pub fn push(&mut self, n: Notification) {
        if self.pending.len() < self.limit {
            self.pending.push(n);
        } else {
            self.dropped += 1;
        }
    }

    /// Queues the table's expiry notifications as entries of `decl`'s table, showing each
    /// expired key and value to `seen` first (queued or not).
    pub fn expired<C: ExactCodec>(
        &mut self,
        decl: &Declaration,
        table: &mut ExactTable<C::Key, C::Value>,
        mut seen: impl FnMut(&C::Key, &C::Value),
    ) {
        let Kind::Table { actions, .. } = &decl.kind else {
            return;
        };
        for e in table.drain_notifications() {
            seen(&e.key, &e.value);
            if self.pending.len() >= self.limit {
                // Nobody is collecting (an offline run) or they are behind: count it
                // without building it.
                self.dropped += 1;
                continue;
            }
            let entry = entry_of::<C>(actions, &e.key, &e.value, e.hits);
            self.push(Notification {
                table: decl.name.clone(),
                kind: NotificationKind::IdleTimeout { deleted: e.deleted },
                entry,
                at_ns: e.at_ns,
            });
        }
    }
}
