//! State migration through the collector (ApproSync's third application): a switch's
//! synced state, read from the collector's copy of one of its streams, written into
//! another switch. A register or sketch moves value for value; a table (`entry_words`
//! words a slot) moves as its entries, the occupied slots' words, which the target places
//! each by its key wherever its own hash puts it (`stateplane_state::synced_table`). The
//! collector does it where the copy is ([`plan`], [`writes`], behind its API's `Migrate`),
//! so that no value crosses the API; `stateplane ctl sync migrate` and
//! `bench-sync-migrate` ask for it with [`migrate`].
//!
//! Must never: move a copy the collector cannot bound (a loss its refresh has not made up
//! yet), or split an entry between two writes.

use crate::collector_api::CollectorClient;
use crate::sync_pb;
use stateplane_sync::Location;
use stateplane_sync::collector::Collector;
use stateplane_sync::write::{MAX_VALUES, Mode, WriteValues};

/// What to move, from where to where.
#[derive(Clone, Debug)]
pub struct Move {
    pub from_switch: u32,
    pub from_stream: u32,
    pub to_switch: u32,
    /// Every stream of the target when `None`.
    pub to_stream: Option<u32>,
    pub state: u32,
    /// Words per entry: 1 for a register or sketch, a table's slot's words for a table;
    /// `None`: as the source's stream announced (its layout).
    pub entry_words: Option<u32>,
    /// How long each write may take to commit.
    pub timeout_ms: u32,
}

/// What a move did.
#[derive(Clone, Debug, Default)]
pub struct Moved {
    /// Locations read from the copy.
    pub read: u64,
    /// Entries (values, for a register) and values written.
    pub entries: u64,
    pub values: u64,
    /// The largest bound of a value moved (0: the copy was exact).
    pub largest_bound: u64,
    pub done: Vec<sync_pb::WriteDone>,
}

/// The locations a move reads: the copy's extent of the state, which must be whole slots
/// of `entry_words` words (a width that does not divide it is a wrong `--entry-words`, or
/// a copy not yet carried whole by a refresh).
pub fn locations_to_read(extent: u32, entry_words: u32) -> Result<u32, String> {
    if entry_words == 0 || entry_words as usize > MAX_VALUES {
        return Err(format!(
            "--entry-words: {entry_words} is not an entry's width; give 1 for a register \
                 or sketch, a table's slot width (docs/SYNC.md) for a table"
        ));
    }
    if !extent.is_multiple_of(entry_words) {
        return Err(format!(
            "the copy holds {extent} locations of the state, not whole slots of \
             {entry_words} words: check --entry-words against the table's slot width \
             (docs/SYNC.md), or wait for a refresh to carry the whole table"
        ));
    }
    Ok(extent)
}

/// The words of an entry: as the source announced them (`announced`), which a width
/// the user gave must agree with.
fn entry_words(given: Option<u32>, announced: Option<u32>, state: u32) -> Result<u32, String> {
    match (given, announced) {
        (Some(g), Some(a)) if g != a => Err(format!(
            "--entry-words {g}: the source announced entries of {a} words for state {state}; \
             leave --entry-words out"
        )),
        (_, Some(a)) => Ok(a),
        (Some(g), None) => Ok(g),
        (None, None) => Err(format!(
            "the source has not announced state {state} to this collector yet (a stream \
             announces its states within a second of its start): try again, or give \
             --entry-words"
        )),
    }
}

/// Moves state `m.state` of the source's stream into the target (see the module doc),
/// through the collector's API.
pub fn migrate(client: &mut CollectorClient, m: &Move) -> Result<Moved, String> {
    let reply = client
        .migrate(sync_pb::MigrateRequest {
            from_switch: m.from_switch,
            from_stream: m.from_stream,
            to_switch: m.to_switch,
            to_stream: m.to_stream,
            state: m.state,
            entry_words: m.entry_words,
            timeout_ms: m.timeout_ms,
        })
        .map_err(|e| e.to_string())?;
    Ok(Moved {
        read: reply.read,
        entries: reply.entries,
        values: reply.values,
        largest_bound: reply.largest_bound,
        done: reply.done,
    })
}

/// What a move writes, as the collector's copy has it.
#[derive(Clone, Debug)]
pub struct Planned {
    pub entry_words: u32,
    /// Locations read from the copy (a table's empty slots by their first word alone), and
    /// the largest bound among them.
    pub read: u64,
    pub largest_bound: u64,
    /// The values written: every one of a register, the occupied slots' words of a table.
    pub values: Vec<u64>,
}

impl Planned {
    pub fn entries(&self) -> u64 {
        self.values.len() as u64 / u64::from(self.entry_words.max(1))
    }
}

/// Reads what moves from `c`'s copy of the source's stream (`m`'s target fields aside):
/// refused where the source is unknown, its width is not known or not agreed, or the copy
/// is unbounded anywhere in the state.
pub fn plan(c: &Collector, m: &Move) -> Result<Planned, String> {
    let stream = u16::try_from(m.from_stream)
        .ok()
        .filter(|s| c.streams_of(m.from_switch).contains(s))
        .ok_or_else(|| {
            format!(
                "switch {} stream {} has sent nothing to this collector",
                m.from_switch, m.from_stream
            )
        })?;
    let state = u16::try_from(m.state)
        .map_err(|_| format!("state {}: a state id is 0 to 65535", m.state))?;
    let announced = (c.layout(m.from_switch, stream).iter())
        .find(|l| l.id == state)
        .map(|l| l.stride);
    let entry_words = entry_words(m.entry_words, announced, m.state)?;
    let extent = (c.extents(m.from_switch, stream).iter())
        .find(|&&(s, _)| s == state)
        .map_or(0, |&(_, length)| length);
    let length = locations_to_read(extent, entry_words)?;
    // What moves is kept as it is read (a table's occupied slots), not the whole copy.
    let mut values = Vec::with_capacity(length as usize);
    let at = (m.from_switch, stream, state);
    let Some(read) = c.gather_entries(at, 0, length, entry_words, &mut values) else {
        return Err(format!(
            "switch {} stream {stream} has applied no message yet",
            m.from_switch
        ));
    };
    if let Some(i) = read.first_unbounded {
        return Err(format!(
            "the copy of switch {} stream {stream} is unbounded at {} of the \
             locations read, from {i} (a loss its refresh has not made up yet): try again \
             after the refresh",
            m.from_switch, read.unbounded
        ));
    }
    Ok(Planned {
        entry_words,
        read: read.read,
        largest_bound: read.largest_bound,
        values,
    })
}

/// The writes that carry `planned`, in order, each of at most `max_values` values (what the
/// target's path carries in one write, `Collector::max_write_values`): as few as that
/// allows (one, committed whole, where the state fits), each holding whole entries; a
/// register's values keep their places (a table's entries are placed by their keys). Each
/// is a stretch of values, encoded where it is: `planned`'s values are moved, not copied,
/// where one write carries them all.
pub fn writes(planned: Planned, state: u16, max_values: usize) -> Vec<WriteValues> {
    let entry_words = planned.entry_words.max(1) as usize;
    let per_write = (max_values / entry_words).max(1) * entry_words;
    let stretch = |i: usize, values: Vec<u64>| WriteValues::Stretch {
        first: Location {
            state,
            index: if entry_words == 1 {
                (i * per_write) as u32
            } else {
                0
            },
        },
        mode: Mode::Set,
        values,
        // A table's entries go in columns, each word of a slot as narrow as its widest.
        columns: entry_words,
    };
    if planned.values.len() <= per_write {
        return vec![stretch(0, planned.values)];
    }
    (planned.values.chunks(per_write).enumerate())
        .map(|(i, chunk)| stretch(i, chunk.to_vec()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A table moves its occupied slots' words, read whole; a register every value.
    #[test]
    fn a_table_moves_its_occupied_slots_and_a_register_every_value() {
        let slots = [[0, 9, 9], [1, 2, 3], [0, 0, 0], [2, 5, 6]];
        let c = copy_of(slots, false);
        let moved = |count, entry_words| {
            let mut values = Vec::new();
            let read = c.gather_entries((1, 0, 0), 0, count, entry_words, &mut values);
            (values, read.map(|r| r.read))
        };
        assert_eq!(moved(12, 3), (vec![1, 2, 3, 2, 5, 6], Some(8)));
        let every: Vec<u64> = slots.iter().flatten().copied().collect();
        assert_eq!(moved(12, 1), (every, Some(12)));
        assert_eq!(
            moved(11, 3),
            (vec![1, 2, 3], Some(5)),
            "a slot not whole is not read"
        );
        assert_eq!(moved(0, 3), (vec![], Some(0)));
        let mut values = Vec::new();
        let unknown = c.gather_entries((2, 0, 0), 0, 12, 3, &mut values);
        assert_eq!(
            (unknown, values),
            (None, vec![]),
            "a stream never heard from"
        );
    }

    /// A table's copy as a collector holds it: switch 1's stream 0 announces state 0, 4
    /// slots of 3 words, and sends `slots` in message 1 and, where `lost` is false,
    /// nothing else; with `lost`, message 2 is lost and message 3 carries slot 3 again.
    fn copy_of(slots: [[u64; 3]; 4], lost: bool) -> Collector {
        use stateplane_sync::Update;
        use stateplane_sync::wire::{Kind, Message};
        let mut c = Collector::new(None, None);
        let message = |kind, seq, entries: Vec<Update>| Message {
            kind,
            switch: 1,
            epoch: 1,
            stream: 0,
            seq,
            sent_ns: seq,
            t_max: 0,
            more: false,
            entries,
        };
        let update = |index: usize, value| Update {
            location: Location {
                state: 0,
                index: index as u32,
            },
            value,
            threshold: 0,
        };
        let layout = vec![update(12, 3)];
        let words = slots.iter().flatten().enumerate();
        let mut messages = vec![
            message(Kind::Layout, 1, layout),
            message(
                Kind::Updates,
                2,
                words.map(|(i, &v)| update(i, v)).collect(),
            ),
        ];
        if lost {
            let again = (9..12).map(|i| update(i, slots[3][i - 9])).collect();
            messages.push(message(Kind::Updates, 4, again));
        }
        for m in messages {
            let mut bytes = Vec::new();
            m.encode(&mut bytes);
            c.on_datagram(m.sent_ns, &bytes, "127.0.0.1:9".parse().unwrap());
        }
        c
    }

    /// A table's copy moves its occupied slots whole, reading an empty slot's first word
    /// alone; a copy unbounded where it moves is refused (a loss not made up yet), and
    /// an empty slot's other words, which move nothing, need not be bounded.
    #[test]
    fn a_plan_reads_an_empty_slot_by_its_first_word_and_refuses_an_unbounded_copy() {
        let m = Move {
            from_switch: 1,
            from_stream: 0,
            to_switch: 2,
            to_stream: None,
            state: 0,
            entry_words: None,
            timeout_ms: 1_000,
        };
        let slots = [[1, 10, 11], [0, 0, 0], [2, 20, 21], [0, 7, 7]];
        let planned = plan(&copy_of(slots, false), &m).unwrap();
        assert_eq!(planned.values, [1, 10, 11, 2, 20, 21]);
        assert_eq!((planned.entry_words, planned.entries()), (3, 2));
        assert_eq!(planned.read, 8, "two empty slots read by their first word");
        // Message 2 lost: slots 0 to 2 may have missed an update; slot 3 came again.
        let e = plan(&copy_of(slots, true), &m).unwrap_err();
        assert!(
            e.contains("unbounded at 7 of the locations read, from 0"),
            "{e}"
        );
        let e = plan(&Collector::new(None, None), &m).unwrap_err();
        assert!(e.contains("has sent nothing"), "{e}");
    }

    /// As few writes as the target's path allows, each of whole entries; a register's
    /// values keep their places, a table's entries are numbered from 0 in each write.
    #[test]
    fn a_move_is_as_few_writes_of_whole_entries_as_the_path_allows() {
        use stateplane_sync::write::MAX_WRITE_VALUES;
        let planned = |entry_words, n: u64| Planned {
            entry_words,
            read: n,
            largest_bound: 0,
            values: (0..n).collect(),
        };
        // Each write's first location and values, which go in columns of an entry's words
        // (a register's: 1).
        let stretches = |writes: Vec<WriteValues>, entry_words| -> Vec<(Location, Vec<u64>)> {
            (writes.into_iter())
                .map(|w| match w {
                    WriteValues::Stretch {
                        first,
                        mode: Mode::Set,
                        values,
                        columns,
                    } if columns == entry_words => (first, values),
                    other => panic!("not a stretch set in its columns: {other:?}"),
                })
                .collect()
        };
        let at = |state, index| Location { state, index };
        let table = planned(12, 12 * 65_536);
        let one = stretches(writes(table.clone(), 3, MAX_WRITE_VALUES), 12);
        assert_eq!(one.len(), 1, "65,536 entries of 12 words: one write");
        assert_eq!(one[0], (at(3, 0), table.values));
        let split = stretches(writes(planned(12, 12 * 65_536), 3, 100), 12);
        assert_eq!(
            split.len(),
            65_536 * 12 / 96,
            "8 entries of 12 words a write"
        );
        assert!(split.iter().all(|(_, values)| values.len() == 96));
        assert_eq!((split[1].0, split[1].1[0]), (at(3, 0), 96));
        let register = stretches(writes(planned(1, 250), 0, 100), 1);
        assert_eq!(
            register.iter().map(|(_, v)| v.len()).collect::<Vec<_>>(),
            [100, 100, 50]
        );
        assert_eq!((register[2].0, register[2].1[0]), (at(0, 200), 200));
        let wide = writes(planned(12, 24), 0, 5);
        assert_eq!(
            wide.len(),
            2,
            "an entry wider than the limit still goes whole"
        );
    }

    /// A width that does not divide the copy, or none at all, is refused with the fix.
    /// The source's announced width is taken; a width given that disagrees is refused,
    /// and with neither the error says when to try again.
    #[test]
    fn the_entry_width_comes_from_the_sources_layout() {
        assert_eq!(entry_words(None, Some(12), 0), Ok(12));
        assert_eq!(entry_words(Some(12), Some(12), 0), Ok(12));
        assert_eq!(entry_words(Some(3), None, 0), Ok(3));
        let e = entry_words(Some(11), Some(12), 2).unwrap_err();
        assert!(
            e.contains("announced entries of 12 words for state 2"),
            "{e}"
        );
        let e = entry_words(None, None, 1).unwrap_err();
        assert!(e.contains("has not announced state 1"), "{e}");
    }

    #[test]
    fn a_width_that_does_not_make_whole_slots_is_refused() {
        assert_eq!(locations_to_read(131_072 * 12, 12), Ok(131_072 * 12));
        assert_eq!(locations_to_read(65_536, 1), Ok(65_536));
        let e = locations_to_read(131_072 * 12, 11).unwrap_err();
        assert!(
            e.contains("not whole slots of 11 words") && e.contains("--entry-words"),
            "{e}"
        );
        for no_width in [0, MAX_VALUES as u32 + 1] {
            let e = locations_to_read(64, no_width).unwrap_err();
            assert!(e.contains("give 1 for a register"), "{e}");
        }
    }
}
