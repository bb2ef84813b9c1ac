//! State migration through the collector (ApproSync's third application): a switch's
//! synced state, read from the collector's copy of one of its streams, written into
//! another switch. A register or sketch moves value for value; a table (`entry_words`
//! words a slot) moves as its entries, the occupied slots' words, which the target places
//! each by its key wherever its own hash puts it (`stateplane_state::synced_table`). The
//! collector does it where the copy is ([`start`], behind its API's `Migrate`), sending
//! the parts of what it has read while it reads the rest, so that no value crosses the API; `stateplane ctl sync migrate` and
//! `bench-sync-migrate` ask for it with [`migrate`].
//!
//! Must never: move a copy the collector cannot bound (a loss its refresh has not made up
//! yet), or split an entry between two writes.

use crate::collector_api::CollectorClient;
use crate::sync_pb;
use stateplane_sync::Location;
use stateplane_sync::collector::{Collector, WriteTicket};
use stateplane_sync::write::MAX_VALUES;

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

/// What a move read, and the writes that carry it on their way.
#[derive(Clone, Debug, Default)]
pub struct Started {
    /// Locations read from the copy (a table's empty slots by their first word alone), and
    /// the largest bound among them.
    pub read: u64,
    pub largest_bound: u64,
    /// Entries (values, for a register) and values written.
    pub entries: u64,
    pub values: u64,
    /// Each target stream's writes, in the order they commit there.
    pub writes: Vec<(u16, WriteTicket)>,
    /// The writes each target stream takes.
    pub writes_per_stream: u32,
}

/// Locations of the copy read at once, between which the writes' parts go: a fraction of
/// a millisecond's reading, so that the target takes the first parts while the rest are
/// read.
const READ_AT_ONCE: u32 = 32_768;

/// Where a move reads: the source's stream and state, and the words of an entry.
struct Source {
    at: (u32, u16, u16),
    entry_words: u32,
    /// The locations to read.
    length: u32,
}

/// The source's side of `m` in `c`'s copy: refused where the source is unknown, or its
/// width is not known or not agreed.
fn source_of(c: &Collector, m: &Move) -> Result<Source, String> {
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
    Ok(Source {
        at: (m.from_switch, stream, state),
        entry_words,
        length: locations_to_read(extent, entry_words)?,
    })
}

/// Moves what `m` names from `c`'s copy of the source's stream into each of `targets`
/// (streams of `m.to_switch`) as it reads it: the copy is read a few thousand locations
/// at a time, and `between` is called after each, to send the parts they filled (the
/// caller holds `c` throughout, so that what moves is the copy of one instant). The
/// values go in as few writes as `max_values` a write allows, each of whole entries (a
/// register's values keep their places; a table's entries are placed by their keys),
/// each open until the whole state is read: a copy unbounded anywhere in what moves (a
/// loss its refresh has not made up yet) is refused, and its writes cancelled before any
/// can commit. The writes are on their way when this returns; their outcomes come from
/// the collector.
pub fn start(
    c: &mut Collector,
    m: &Move,
    targets: &[u16],
    max_values: usize,
    between: impl FnMut(&mut Collector),
) -> Result<Started, String> {
    start_reading(c, m, targets, (max_values, READ_AT_ONCE), between)
}

/// [`start`], reading `at_once` locations of the copy at a time.
fn start_reading(
    c: &mut Collector,
    m: &Move,
    targets: &[u16],
    (max_values, at_once): (usize, u32),
    mut between: impl FnMut(&mut Collector),
) -> Result<Started, String> {
    let source = source_of(c, m)?;
    let mut started = Started::default();
    let limits = (max_values, at_once);
    let read = read_into_writes(c, m, &source, targets, limits, &mut started, &mut between);
    let closed = read.and_then(|()| {
        (started.writes.iter()).try_for_each(|&(stream, t)| c.close_write(m.to_switch, stream, t))
    });
    if let Err(e) = closed {
        for &(stream, ticket) in &started.writes {
            c.cancel(m.to_switch, stream, ticket);
        }
        between(c);
        return Err(e);
    }
    between(c);
    let stride = u64::from(source.entry_words.max(1));
    started.entries = started.values / stride;
    started.writes_per_stream = (started.writes.len() / targets.len().max(1)) as u32;
    // Each target's writes in the order they commit there.
    started.writes.sort_by_key(|&(stream, _)| stream);
    Ok(started)
}

/// Reads `source` into writes into `targets` (see [`start`]), `at_once` locations at a
/// time, noting them in `started`.
fn read_into_writes(
    c: &mut Collector,
    m: &Move,
    source: &Source,
    targets: &[u16],
    (max_values, at_once): (usize, u32),
    started: &mut Started,
    between: &mut impl FnMut(&mut Collector),
) -> Result<(), String> {
    let (at, words) = (source.at, source.entry_words.max(1));
    let stride = words as usize;
    let per_write = (max_values / stride).max(1) * stride;
    let at_once = (at_once / words).max(1) * words;
    let mut read = Vec::with_capacity(at_once as usize);
    // Locations read unbounded, and the first of them.
    let mut unbounded: Option<(u64, u32)> = None;
    // Values in the writes opened last (one a target).
    let mut filled = per_write;
    let mut first = 0;
    loop {
        let count = at_once.min(source.length - first);
        // Read straight into the write open last where all it reads goes there (one
        // target, the write room enough, nothing unbounded so far).
        let direct = match started.writes[..] {
            [.., (stream, ticket)] if targets.len() == 1 && unbounded.is_none() => {
                Some((stream, ticket)).filter(|_| filled + count as usize <= per_write)
            }
            _ => None,
        };
        read.clear();
        let gathered = match direct {
            Some((stream, ticket)) => {
                c.gather_into_write(at, (first, count, words), (m.to_switch, stream, ticket))?
            }
            None => c.gather_entries(at, first, count, words, &mut read),
        };
        let Some(gathered) = gathered else {
            return Err(format!(
                "switch {} stream {} has applied no message yet",
                at.0, at.1
            ));
        };
        if direct.is_some() {
            filled += gathered.values as usize;
            started.values += gathered.values;
        }
        started.read += gathered.read;
        started.largest_bound = started.largest_bound.max(gathered.largest_bound);
        if let Some(i) = gathered.first_unbounded {
            unbounded.get_or_insert((0, i)).0 += gathered.unbounded;
        }
        // Once unbounded, the rest is read only to say how much is.
        let mut rest = if unbounded.is_none() { &read[..] } else { &[] };
        // Where nothing moves (an empty table), one write of nothing, which commits.
        while unbounded.is_none() && (!rest.is_empty() || started.writes.is_empty()) {
            if filled == per_write {
                let index = if stride == 1 { started.values } else { 0 };
                let first = Location {
                    state: at.2,
                    index: u32::try_from(index).map_err(|_| "a write past a state's end")?,
                };
                for &stream in targets {
                    let ticket = c.open_write(m.to_switch, stream, first, stride, per_write)?;
                    started.writes.push((stream, ticket));
                }
                filled = 0;
            }
            let (these, after) = rest.split_at(rest.len().min(per_write - filled));
            for &(stream, ticket) in &started.writes[started.writes.len() - targets.len()..] {
                c.extend_write(m.to_switch, stream, ticket, these)?;
            }
            filled += these.len();
            started.values += these.len() as u64;
            rest = after;
        }
        between(c);
        first += count;
        if first >= source.length {
            break;
        }
    }
    match unbounded {
        None => Ok(()),
        Some((n, i)) => Err(format!(
            "the copy of switch {} stream {} is unbounded at {n} of the locations read, from \
             {i} (a loss its refresh has not made up yet): try again after the refresh",
            at.0, at.1
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateplane_sync::Update;
    use stateplane_sync::collector::Outgoing;
    use stateplane_sync::wire::{Kind, Message, StretchValues};
    use stateplane_sync::write::{WriteStage, WriteTarget};
    use std::net::SocketAddr;

    /// A table moves its occupied slots' words, read whole; a register every value.
    #[test]
    fn a_table_moves_its_occupied_slots_and_a_register_every_value() {
        let slots = [[0, 9, 9], [1, 2, 3], [0, 0, 0], [2, 5, 6]];
        let c = copy_of(slots.as_flattened(), 3, None);
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
        let unknown = c.gather_entries((3, 0, 0), 0, 12, 3, &mut values);
        assert_eq!(
            (unknown, values),
            (None, vec![]),
            "a stream never heard from"
        );
    }

    /// A copy as a collector holds it: switch 1's stream 0 announces state 0, `words`
    /// locations in entries of `stride` words, and sends them all in message 2; with
    /// `resent: Some(n)`, message 3 is lost and message 4 carries the first `n` entries
    /// again. Switch 2's streams 0 and 1, the target's, have announced themselves.
    fn copy_of(words: &[u64], stride: u32, resent: Option<usize>) -> Collector {
        copy_with_target_at(words, stride, resent, TARGET)
    }

    /// [`copy_of`], the target's streams announced from `target`.
    fn copy_with_target_at(
        words: &[u64],
        stride: u32,
        resent: Option<usize>,
        target: &str,
    ) -> Collector {
        let mut c = Collector::new(None, None);
        let message = |switch, kind, seq, entries: Vec<Update>| Message {
            kind,
            switch,
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
        let layout = vec![update(words.len(), u64::from(stride))];
        let all = words.iter().enumerate();
        let mut messages = vec![
            (SOURCE, message(1, Kind::Layout, 1, layout)),
            (target, message(2, Kind::Layout, 1, Vec::new())),
            (
                target,
                Message {
                    stream: 1,
                    ..message(2, Kind::Layout, 1, Vec::new())
                },
            ),
            (
                SOURCE,
                message(
                    1,
                    Kind::Updates,
                    2,
                    all.map(|(i, &v)| update(i, v)).collect(),
                ),
            ),
        ];
        if let Some(entries) = resent {
            let again = (0..entries * stride as usize).map(|i| update(i, words[i]));
            messages.push((SOURCE, message(1, Kind::Updates, 4, again.collect())));
        }
        for (from, m) in messages {
            let mut bytes = Vec::new();
            m.encode(&mut bytes);
            c.on_datagram(m.sent_ns, &bytes, from.parse().unwrap());
        }
        c
    }

    const SOURCE: &str = "127.0.0.1:9";
    const TARGET: &str = "127.0.0.1:10";

    /// A move from switch 1's copy into switch 2.
    fn a_move() -> Move {
        Move {
            from_switch: 1,
            from_stream: 0,
            to_switch: 2,
            to_stream: Some(0),
            state: 0,
            entry_words: None,
            timeout_ms: 1_000,
        }
    }

    /// The target's state: the runs written into it, in order.
    #[derive(Default)]
    struct Written(Vec<(Location, Vec<u64>)>);

    impl WriteTarget for Written {
        fn read(&self, _: Location) -> u64 {
            0
        }
        fn write(&mut self, location: Location, value: u64) {
            self.0.push((location, vec![value]));
        }
        fn write_run(&mut self, first: Location, values: &[u64]) {
            self.0.push((first, values.to_vec()));
        }
    }

    /// Parts read from datagrams to the target's stream 0, as the switch reads them.
    fn parts_in(out: &[Outgoing]) -> Vec<(Message, Option<StretchValues>)> {
        parts_to(out, 0)
    }

    /// Parts read from datagrams to the target's `stream`.
    fn parts_to(out: &[Outgoing], stream: u16) -> Vec<(Message, Option<StretchValues>)> {
        parts_sent_to(out, TARGET.parse().unwrap(), stream)
    }

    /// Parts read from datagrams to `stream` of the target at `target`.
    fn parts_sent_to(
        out: &[Outgoing],
        target: SocketAddr,
        stream: u16,
    ) -> Vec<(Message, Option<StretchValues>)> {
        (out.iter())
            .filter(|(addr, _, _)| *addr == target)
            .filter_map(|(_, bytes, _)| Message::decode_write_part(None, bytes, |_| false).ok())
            .filter(|(m, _)| m.kind == Kind::Write && m.stream == stream)
            .collect()
    }

    /// Hands the target's stage what the collector sends it, and the collector what the
    /// stage answers, until nothing is left to send: what the stage committed.
    fn delivered(c: &mut Collector, stage: &mut WriteStage, state: &mut Written) -> Vec<u64> {
        let mut committed = Vec::new();
        for round in 1..100 {
            let now = 1_000 * round;
            let mut out = Vec::new();
            while c.poll(now, false, &mut out) {}
            let mut answers = Vec::new();
            for (part, stretch) in parts_in(&out) {
                answers.extend(stage.on_part_carrying(part, stretch, state));
            }
            while let Some(done) = stage.commit(state) {
                committed.push(done.values);
            }
            stage.take_answers(&mut answers);
            if answers.is_empty() {
                break;
            }
            for a in answers {
                let mut bytes = Vec::new();
                a.encode(&mut bytes);
                c.on_datagram(now, &bytes, TARGET.parse().unwrap());
            }
        }
        committed
    }

    /// A table's copy moves its occupied slots whole, reading an empty slot's first word
    /// alone, and the target commits them; an empty slot's other words, which move
    /// nothing, need not be bounded.
    #[test]
    fn a_move_writes_the_occupied_slots_and_reads_an_empty_one_by_its_first_word() {
        let slots = [1, 10, 11, 0, 0, 0, 2, 20, 21, 0, 7, 7];
        let mut c = copy_of(&slots, 3, None);
        let started = start(&mut c, &a_move(), &[0], 1 << 20, |_| {}).unwrap();
        assert_eq!(
            (started.read, started.entries, started.values),
            (8, 2, 6),
            "two empty slots read by their first word"
        );
        assert_eq!((started.writes.len(), started.writes_per_stream), (1, 1));
        let (mut stage, mut state) = (WriteStage::default(), Written::default());
        assert_eq!(delivered(&mut c, &mut stage, &mut state), [6]);
        let at0 = Location { state: 0, index: 0 };
        assert_eq!(state.0, [(at0, vec![1, 10, 11, 2, 20, 21])]);
        let e = start(
            &mut Collector::new(None, None),
            &a_move(),
            &[0],
            1 << 20,
            |_| {},
        );
        assert!(e.unwrap_err().contains("has sent nothing"));
    }

    /// A write's wait wakes when the target's answer that settles the write comes in
    /// (from the receive loop, on another thread), not at the end of its longest look.
    #[test]
    fn a_writes_wait_wakes_when_the_answer_that_settles_it_comes_in() {
        use crate::collector_api::CollectorHandle;
        use std::time::{Duration, Instant};
        let mut c = copy_of(&[1, 10, 11, 2, 20, 21], 3, None);
        let started = start(&mut c, &a_move(), &[0], 1 << 20, |_| {}).unwrap();
        // The target takes and commits the write; its answers wait to be received.
        let (mut stage, mut state) = (WriteStage::default(), Written::default());
        let mut out = Vec::new();
        while c.poll(1_000, false, &mut out) {}
        let mut answers = Vec::new();
        for (part, stretch) in parts_in(&out) {
            answers.extend(stage.on_part_carrying(part, stretch, &mut state));
        }
        while stage.commit(&mut state).is_some() {}
        stage.take_answers(&mut answers);
        let datagrams: Vec<Vec<u8>> = (answers.iter())
            .map(|a| {
                let mut bytes = Vec::new();
                a.encode(&mut bytes);
                bytes
            })
            .collect();
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let handle = std::sync::Arc::new(CollectorHandle::new(c, socket));
        let seen = handle.with(|c| c.outcomes_kept());
        let receiving = {
            let handle = handle.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                for bytes in datagrams {
                    handle.receive(2_000, &bytes, TARGET.parse().unwrap());
                }
            })
        };
        let waited = Instant::now();
        handle.await_outcome(seen, Duration::from_secs(20));
        assert!(
            waited.elapsed() < Duration::from_secs(10),
            "woken by the answer, not the look's end ({:?})",
            waited.elapsed()
        );
        receiving.join().unwrap();
        let (stream, ticket) = started.writes[0];
        let outcome = handle.with(|c| c.take_write(2, stream, ticket));
        assert!(matches!(outcome, Some(Ok(_))), "{outcome:?}");
    }

    /// A move takes its target's answers while it reads the copy, so that the writes
    /// they settle (and the parts they show lost) go on before the read ends; what else
    /// comes meanwhile (the source's updates) waits until the copy is read, so that what
    /// moves is the copy of one instant: here an update after a lost message, which
    /// leaves the copy unbounded and the move refused had it landed between two reads.
    #[test]
    fn a_move_takes_its_targets_answers_while_it_reads_and_holds_the_rest() {
        use crate::collector_api::CollectorHandle;
        use stateplane_sync::write::{Mode, Written as Value};
        let target = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let target_at = target.local_addr().unwrap();
        // Read in two reads (READ_AT_ONCE locations each).
        let words: Vec<u64> = (1..=36_000u64).map(|i| i << 28 | i).collect();
        let late = Location {
            state: 0,
            index: 35_000,
        };
        let mut c = copy_with_target_at(&words, 3, None, &target_at.to_string());
        // A write into the target before the move, taken and committed there: its answer
        // waits on the collector's socket, with an update of the source's first word.
        let at0 = Location { state: 0, index: 0 };
        let value = |value| Value {
            location: at0,
            value,
            mode: Mode::Set,
        };
        let earlier = c.write(2, 0, vec![value(5)]).unwrap();
        let mut out = Vec::new();
        while c.poll(0, false, &mut out) {}
        let (mut stage, mut state) = (WriteStage::default(), Written::default());
        for (part, stretch) in parts_sent_to(&out, target_at, 0) {
            stage.on_part_carrying(part, stretch, &mut state);
        }
        assert!(stage.commit(&mut state).is_some());
        let mut answers = Vec::new();
        stage.take_answers(&mut answers);
        let update = Message {
            kind: Kind::Updates,
            switch: 1,
            epoch: 1,
            stream: 0,
            seq: 4,
            sent_ns: 4,
            t_max: 0,
            more: false,
            entries: vec![Update {
                location: late,
                value: 999,
                threshold: 0,
            }],
        };
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let collector_at = socket.local_addr().unwrap();
        for m in [&update, &answers[0]] {
            let mut bytes = Vec::new();
            m.encode(&mut bytes);
            target.send_to(&bytes, collector_at).unwrap();
        }
        let handle = CollectorHandle::new(c, socket);
        let started = handle.start_move(&a_move()).unwrap();
        // The earlier write settled during the move (nothing else read the socket), so
        // the move's own write went on: its parts reached the target.
        let outcome = handle.with(|c| c.take_write(2, 0, earlier));
        assert!(matches!(outcome, Some(Ok(_))), "{outcome:?}");
        target.set_nonblocking(true).unwrap();
        let mut datagram = vec![0; 65_536];
        let mut moved = Vec::new();
        while let Ok((n, _)) = target.recv_from(&mut datagram) {
            let sent = vec![(target_at, datagram[..n].to_vec(), 1)];
            for (part, stretch) in parts_sent_to(&sent, target_at, 0) {
                if part.seq == started.writes[0].1.id && stretch.as_ref().is_some() {
                    moved.extend(stretch.map(|s| s.values).unwrap_or_default());
                }
            }
        }
        assert!(!moved.is_empty(), "the move's parts went during the read");
        assert_eq!(moved[..3], words[..3]);
        let now = handle.with(|c| c.read(1, 0, 0, late.index, 1).unwrap()[0].value);
        assert_eq!(now, 999, "the update held, then applied");
        assert!(
            handle.start_move(&a_move()).is_err(),
            "the copy is unbounded now"
        );
    }

    /// 1,024 entries of 3 words, values of up to 40 bits: the parts a 1,500-byte path
    /// carries.
    fn wide_table() -> Vec<u64> {
        (1..=3 * 1024u64).map(|i| i << 28 | i).collect()
    }

    /// The copy is read a few locations at a time, and the parts they fill go between
    /// two reads, each saying no count of parts (the write is not closed yet), the last
    /// one read after the copy was read whole saying it; the target commits nothing
    /// until it has the count, and then the whole table.
    #[test]
    fn a_moves_parts_go_as_the_copy_is_read_and_the_last_says_how_many() {
        let words = wide_table();
        let mut c = copy_of(&words, 3, None);
        let (mut stage, mut state) = (WriteStage::default(), Written::default());
        // The parts each read filled, taken as they come (none answered yet).
        let mut sent_per_read = Vec::new();
        let (mut taken, mut committed) = (0, Vec::new());
        let limits = (1 << 20, 96);
        let started = start_reading(&mut c, &a_move(), &[0], limits, |c| {
            let mut out = Vec::new();
            while c.poll(0, false, &mut out) {}
            let parts = parts_in(&out);
            sent_per_read.push(
                parts
                    .iter()
                    .map(|(p, _)| p.t_max as u32)
                    .collect::<Vec<_>>(),
            );
            for (part, stretch) in parts {
                stage.on_part_carrying(part, stretch, &mut state);
                taken += 1;
                committed.extend(stage.commit(&mut state).map(|d| (taken, d.values)));
            }
        })
        .unwrap();
        assert_eq!(sent_per_read.len(), 1024 / 32 + 1, "a call after each read");
        let last = sent_per_read.pop().unwrap();
        let before: Vec<u32> = sent_per_read.concat();
        assert!(
            before.len() > 4,
            "parts went before the copy was read whole"
        );
        let unknown = stateplane_sync::write::COUNT_NOT_KNOWN as u32;
        assert!(before.iter().all(|&count| count == unknown), "{before:?}");
        let count = before.len() as u32 + 1;
        assert_eq!(last, [count], "the last part says the count");
        assert_eq!(taken, count);
        assert_eq!(
            committed,
            [(count, 3 * 1024)],
            "committed on the last part alone"
        );
        let written: Vec<u64> = state.0.iter().flat_map(|(_, v)| v.clone()).collect();
        assert_eq!(written, words);
        assert_eq!(started.values, 3 * 1024);
    }

    /// A move into every stream of the target writes the same values into each, read
    /// once: each stream takes its parts as the copy is read, and commits them all.
    #[test]
    fn a_move_into_two_streams_writes_the_same_values_into_each() {
        let words = wide_table();
        let mut c = copy_of(&words, 3, None);
        let mut stages: Vec<_> = (0..2)
            .map(|_| (WriteStage::default(), Written::default()))
            .collect();
        let mut before_the_last = [0; 2];
        let m = Move {
            to_stream: None,
            ..a_move()
        };
        let started = start_reading(&mut c, &m, &[0, 1], (1 << 20, 96), |c| {
            let mut out = Vec::new();
            while c.poll(0, false, &mut out) {}
            for (stream, (stage, state)) in stages.iter_mut().enumerate() {
                for (part, stretch) in parts_to(&out, stream as u16) {
                    before_the_last[stream] += usize::from(part.t_max as u32 == u32::MAX);
                    stage.on_part_carrying(part, stretch, state);
                }
            }
        })
        .unwrap();
        assert_eq!((started.writes.len(), started.writes_per_stream), (2, 1));
        assert_eq!(started.values, 3 * 1024);
        for (n, (mut stage, mut state)) in before_the_last.into_iter().zip(stages) {
            assert!(n > 4, "parts went before the copy was read whole");
            assert_eq!(stage.commit(&mut state).map(|d| d.values), Some(3 * 1024));
            let written: Vec<u64> = state.0.iter().flat_map(|(_, v)| v.clone()).collect();
            assert_eq!(written, words);
        }
    }

    /// A copy unbounded where it moves is refused (a loss not made up yet), found where
    /// the move reads it: writes opened and parts sent before it are cancelled, and the
    /// target commits nothing.
    #[test]
    fn a_copy_unbounded_where_it_moves_is_refused_and_its_writes_dropped() {
        let slots = [1, 10, 11, 0, 0, 0, 2, 20, 21, 0, 7, 7];
        // Message 3 lost: every slot may have missed an update (an empty one read by its
        // first word).
        let mut c = copy_of(&slots, 3, Some(0));
        let e = start(&mut c, &a_move(), &[0], 1 << 20, |_| {}).unwrap_err();
        assert!(
            e.contains("unbounded at 8 of the locations read, from 0"),
            "{e}"
        );
        // The first 512 entries sent again: the rest unbounded, read after parts went.
        let words = wide_table();
        let mut c = copy_of(&words, 3, Some(512));
        let (mut stage, mut state) = (WriteStage::default(), Written::default());
        let mut sent = 0;
        let e = start_reading(&mut c, &a_move(), &[0], (1 << 20, 96), |c| {
            let mut out = Vec::new();
            while c.poll(0, false, &mut out) {}
            for (part, stretch) in parts_in(&out) {
                sent += 1;
                stage.on_part_carrying(part, stretch, &mut state);
            }
        })
        .unwrap_err();
        assert!(
            e.contains("unbounded at 1536 of the locations read, from 1536"),
            "{e}"
        );
        assert!(sent > 0, "parts went before the loss was read");
        assert_eq!(delivered(&mut c, &mut stage, &mut state), []);
        assert_eq!((stage.abandoned, state.0.len()), (1, 0));
    }

    /// As few writes as the target's path allows, each of whole entries; a register's
    /// values keep their places, a table's entries are numbered from 0 in each write.
    #[test]
    fn a_move_is_as_few_writes_of_whole_entries_as_the_path_allows() {
        let register: Vec<u64> = (1..=250).collect();
        // Read whole at once, and 30 at a time: most reads then go straight into the
        // write open, those that would fill it past its limit through a copy.
        for at_once in [READ_AT_ONCE, 30] {
            let mut c = copy_of(&register, 1, None);
            let started = start_reading(&mut c, &a_move(), &[0], (100, at_once), |_| {});
            let started = started.unwrap();
            assert_eq!((started.writes.len(), started.entries), (3, 250));
            let (mut stage, mut state) = (WriteStage::default(), Written::default());
            assert_eq!(delivered(&mut c, &mut stage, &mut state), [100, 100, 50]);
            let firsts: Vec<u32> = state.0.iter().map(|(at, _)| at.index).collect();
            assert_eq!(firsts, [0, 100, 200]);
            let written: Vec<u64> = state.0.iter().flat_map(|(_, v)| v.clone()).collect();
            assert_eq!(written, register);
        }
        // 4 entries of 3 words, 2 a write (a limit of 7 values: 6 whole).
        let table: Vec<u64> = (1..=12).collect();
        let mut c = copy_of(&table, 3, None);
        let started = start(&mut c, &a_move(), &[0], 7, |_| {}).unwrap();
        assert_eq!(started.writes.len(), 2);
        let (mut stage, mut state) = (WriteStage::default(), Written::default());
        assert_eq!(delivered(&mut c, &mut stage, &mut state), [6, 6]);
        assert!(state.0.iter().all(|(at, _)| at.index == 0));
        // An entry wider than the limit still goes whole, one a write.
        let mut c = copy_of(&table, 3, None);
        let started = start(&mut c, &a_move(), &[0], 2, |_| {}).unwrap();
        assert_eq!(started.writes.len(), 4);
        // An empty table: one write of nothing, which commits.
        let mut c = copy_of(&[0; 12], 3, None);
        let started = start(&mut c, &a_move(), &[0], 7, |_| {}).unwrap();
        assert_eq!((started.writes.len(), started.entries), (1, 0));
        let (mut stage, mut state) = (WriteStage::default(), Written::default());
        assert_eq!(delivered(&mut c, &mut stage, &mut state), [0]);
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
