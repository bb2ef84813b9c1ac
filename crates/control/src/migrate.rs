//! State migration through the collector (ApproSync's third application): a switch's
//! synced state, read from the collector's copy of one of its streams, written into
//! another switch. A register or sketch moves value for value; a table (`entry_words`
//! words a slot) moves as its entries, the occupied slots' words, which the target places
//! each by its key wherever its own hash puts it (`stateplane_state::synced_table`). A client
//! of the collector's API: `stateplane ctl sync migrate` and `bench-sync-migrate` share it.
//!
//! Must never: move a copy the collector cannot bound (a loss its refresh has not made up
//! yet), or split an entry between two writes.

use crate::collector_api::CollectorClient;
use crate::sync_pb;
use stateplane_sync::write::MAX_VALUES;

/// Locations read from the copy per call.
const READ_CHUNK: u32 = 65_536;

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

/// The values a move writes, from the source's `values`: all of them for a register
/// (`entry_words` 1), else the entries of the occupied slots (word 0 not 0), one after
/// another. An error if the values are not whole slots.
pub fn what_moves(values: &[u64], entry_words: usize) -> Result<Vec<u64>, String> {
    if entry_words <= 1 {
        return Ok(values.to_vec());
    }
    if !values.len().is_multiple_of(entry_words) {
        return Err(format!(
            "{} locations are not whole slots of {entry_words} words",
            values.len()
        ));
    }
    Ok(values
        .chunks_exact(entry_words)
        .filter(|slot| slot[0] != 0)
        .flatten()
        .copied()
        .collect())
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

/// Moves state `m.state` of the source's stream into the target (see the module doc).
pub fn migrate(client: &mut CollectorClient, m: &Move) -> Result<Moved, String> {
    let streams = client.streams().map_err(|e| e.to_string())?;
    let source = (streams.streams.iter())
        .find(|s| s.switch_id == m.from_switch && s.stream == m.from_stream)
        .ok_or_else(|| {
            format!(
                "switch {} stream {} has sent nothing to this collector",
                m.from_switch, m.from_stream
            )
        })?;
    let announced = (source.layout.iter())
        .find(|l| l.state == m.state)
        .map(|l| l.stride);
    let entry_words = entry_words(m.entry_words, announced, m.state)?;
    let extent = (source.extents.iter())
        .find(|e| e.state == m.state)
        .map_or(0, |e| e.length);
    let length = locations_to_read(extent, entry_words)?;
    let mut moved = Moved::default();
    let mut values = Vec::with_capacity(length as usize);
    for first in (0..length).step_by(READ_CHUNK as usize) {
        let r = client
            .read(sync_pb::ReadRequest {
                switch_id: m.from_switch,
                stream: Some(m.from_stream),
                state: m.state,
                first,
                count: READ_CHUNK.min(length - first),
            })
            .map_err(|e| e.to_string())?;
        if let Some(&i) = r.unbounded.first() {
            return Err(format!(
                "the copy of switch {} stream {} is unbounded at {} locations from {} (a \
                 loss its refresh has not made up yet): try again after the refresh",
                m.from_switch,
                m.from_stream,
                r.unbounded.len(),
                u64::from(first) + u64::from(i)
            ));
        }
        moved.largest_bound = (r.bounds.iter().copied()).fold(moved.largest_bound, u64::max);
        values.extend_from_slice(&r.values);
    }
    moved.read = values.len() as u64;
    let written = what_moves(&values, entry_words as usize)?;
    moved.values = written.len() as u64;
    moved.entries = moved.values / u64::from(entry_words);
    // Each write holds whole entries; a register's values keep their places.
    let per_write = MAX_VALUES / entry_words as usize * entry_words as usize;
    for (i, chunk) in written.chunks(per_write).enumerate() {
        let first = if entry_words == 1 { i * per_write } else { 0 };
        let reply = client
            .write(sync_pb::WriteRequest {
                switch_id: m.to_switch,
                stream: m.to_stream,
                state: m.state,
                first: first as u32,
                values: chunk.to_vec(),
                fill: 0,
                count: chunk.len() as u32,
                keep_changes: false,
                timeout_ms: m.timeout_ms,
            })
            .map_err(|e| e.to_string())?;
        moved.done.extend(reply.done);
    }
    Ok(moved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_moves_its_occupied_slots_and_a_register_every_value() {
        let slots = [0, 9, 9, 1, 2, 3, 0, 0, 0, 2, 5, 6];
        assert_eq!(what_moves(&slots, 3), Ok(vec![1, 2, 3, 2, 5, 6]));
        assert_eq!(what_moves(&slots, 1), Ok(slots.to_vec()));
        assert!(what_moves(&slots[..11], 3).is_err(), "not whole slots");
        assert_eq!(what_moves(&[], 3), Ok(vec![]));
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
