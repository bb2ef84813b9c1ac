//! Count-min sketches as declared state: a program's sketches (one per tenant in `hh`, one
//! in the flood detectors) are one register in the control API, sketch `k`'s counters
//! after sketch `k - 1`'s, row after row. The control plane reads and writes it by index
//! (which is also how the sync experiments' `poll` baseline reads it), and a configuration
//! may ask for it `synced`: every counter's change then goes to the worker's sync stage.
//!
//! Must never: answer for a register it does not own, or hand out a location past the
//! sketches' end.

use stateplane_state::changes::Change;
use stateplane_state::{
    Carried, ControlError, CountMin, Declaration, Guarantee, KeyFields, Kind, Match, Reply,
    Request, WorkerCounters,
};

/// A program whose sketches are one [`SketchRegister`]: its register and sketches, for
/// [`sketch_snapshot_methods!`].
pub(crate) trait Sketched {
    fn sketches_mut(&mut self) -> (&mut SketchRegister, &mut [CountMin]);
    fn sketches(&self) -> (&SketchRegister, &[CountMin]);
}

/// Inside a program's `impl Program`: the snapshots of bounded replication of a program
/// that is [`Sketched`], answered by its sketch register (its sync is a part of the
/// program's synced state: `crate::synced_parts::SketchesPart`).
macro_rules! sketch_snapshot_methods {
    () => {
        fn snapshot_begin(&mut self, id: u16) -> bool {
            let (register, sketches) = $crate::sketches::Sketched::sketches_mut(self);
            register.snapshot_begin(sketches, id)
        }

        fn snapshot_read(&mut self, id: u16, first: u32, out: &mut [u64]) -> usize {
            let (register, sketches) = $crate::sketches::Sketched::sketches_mut(self);
            register.snapshot_read(sketches, id, first, out)
        }

        fn snapshot_changed(&self, id: u16, first: u32, len: u32) -> bool {
            let (register, sketches) = $crate::sketches::Sketched::sketches(self);
            register.snapshot_changed(sketches, id, first, len)
        }
    };
}
pub(crate) use sketch_snapshot_methods;

/// What a reload does with a measurement's counts (`name`): `old`'s counters taken into
/// `new`, sketch by sketch, when the measurement still counts the same thing over the same
/// interval (`measure`, else why not) and the sketches are as many and hashed alike (the
/// same width, depth and seed); else the counts start afresh, and the `Carried` says why.
pub(crate) fn inherit_counts(
    name: &str,
    new: &mut [CountMin],
    old: &[CountMin],
    measure: Result<(), &str>,
) -> Carried {
    if let Err(why) = measure {
        return Carried::afresh(name, why);
    }
    if new.len() != old.len() || !new.iter().zip(old).all(|(n, o)| n.hashed_alike(o)) {
        return Carried::afresh(name, "the sketches' width, depth or number changed");
    }
    let kept = new.iter_mut().zip(old).map(|(n, o)| n.adopt(o)).sum();
    Carried::entries(name, kept, 0, "")
}

/// The register's name, its synced state id once tracked, and whether it is tracked for
/// snapshots alone (its changes are then never taken).
#[derive(Clone, Debug)]
pub(crate) struct SketchRegister {
    name: &'static str,
    synced: Option<u16>,
    snapshots_only: bool,
}

impl SketchRegister {
    pub fn new(name: &'static str) -> SketchRegister {
        SketchRegister {
            name,
            synced: None,
            snapshots_only: false,
        }
    }

    pub fn name(&self) -> &'static str {
        self.name
    }

    fn cells(sketches: &[CountMin]) -> usize {
        sketches.iter().map(|s| s.counters().len()).sum()
    }

    pub fn declaration(&self, sketches: &[CountMin]) -> Declaration {
        Declaration {
            name: self.name.to_string(),
            capacity: Self::cells(sketches),
            guarantees: vec![Guarantee::Local],
            kind: Kind::Register { bits: 32 },
        }
    }

    /// The sketch holding counter `index`, and the counter's index in it.
    fn locate(sketches: &[CountMin], mut index: usize) -> Option<(usize, usize)> {
        for (k, s) in sketches.iter().enumerate() {
            let n = s.counters().len();
            if index < n {
                return Some((k, index));
            }
            index -= n;
        }
        None
    }

    /// Answers a read or write of this register (checked against the declaration: the
    /// range is inside it, a written value fits 32 bits).
    pub fn answer(
        &self,
        sketches: &mut [CountMin],
        request: &Request,
    ) -> Result<Reply, ControlError> {
        let out_of_range = |index| ControlError::OutOfRange {
            name: self.name.to_string(),
            index,
            size: Self::cells(sketches),
        };
        match request {
            Request::ReadRegister { first, count, .. } => (*first..first + count)
                .map(|i| {
                    let (k, j) = Self::locate(sketches, i).ok_or_else(|| out_of_range(i))?;
                    Ok(u128::from(sketches[k].counters().as_slice()[j]))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Reply::Values),
            Request::WriteRegister {
                first,
                count,
                value,
                ..
            } => {
                let end = first + count;
                if end > Self::cells(sketches) {
                    return Err(out_of_range(end));
                }
                let value = u32::try_from(*value).unwrap_or(u32::MAX);
                for i in *first..end {
                    if let Some((k, j)) = Self::locate(sketches, i) {
                        let _ = sketches[k].counters_mut().write(j, value);
                    }
                }
                Ok(Reply::Done)
            }
            _ => Err(ControlError::Unavailable),
        }
    }

    /// The answer to [`Request::CountersOf`] on worker `worker`: where each of `keys` (the
    /// fields of the table the program reports them in, checked) is counted, as indexes
    /// into this register; `sketch_of` says which sketch counts a key (`None`: none yet).
    pub fn counters_of<K: KeyFields>(
        sketches: &[CountMin],
        keys: &[Vec<Match>],
        worker: usize,
        sketch_of: impl Fn(&K) -> Option<usize>,
    ) -> Reply {
        let cells = (keys.iter())
            .map(|fields| {
                let key = K::of(fields);
                let Some(k) = sketch_of(&key).filter(|&k| k < sketches.len()) else {
                    return Vec::new();
                };
                let before = Self::cells(&sketches[..k]);
                (sketches[k].cells_of(&key).into_iter())
                    .map(|c| (before + c) as u32)
                    .collect()
            })
            .collect();
        Reply::CountersOf(vec![WorkerCounters {
            worker: worker as u32,
            cells,
        }])
    }

    /// Tracks every sketch as synced state `id` (see `Program::track`); `None` if `name`
    /// is not this register, or it has more counters than a location can name.
    pub fn track(&mut self, sketches: &mut [CountMin], name: &str, id: u16) -> Option<u32> {
        if name != self.name {
            return None;
        }
        let cells = u32::try_from(Self::cells(sketches)).ok()?;
        let mut first = 0;
        for s in sketches.iter_mut() {
            s.track(id, first);
            first += s.counters().len() as u32;
        }
        self.synced = Some(id);
        Some(cells)
    }

    /// As [`SketchRegister::track`], for snapshots alone (see
    /// `Program::track_snapshots`).
    pub fn track_snapshots(
        &mut self,
        sketches: &mut [CountMin],
        name: &str,
        id: u16,
    ) -> Option<u32> {
        let cells = self.track(sketches, name, id)?;
        self.snapshots_only = true;
        Some(cells)
    }

    /// The counters changed since the last take (see `Program::changes`); none when
    /// tracked for snapshots alone, whose marks the snapshots read.
    pub fn changes(&self, sketches: &mut [CountMin], out: &mut Vec<Change>) {
        if self.snapshots_only {
            return;
        }
        for s in sketches {
            s.counters_mut().take_changes(out);
        }
    }

    pub fn synced(&self, sketches: &[CountMin]) -> Vec<(u16, u32)> {
        self.synced
            .map(|id| (id, Self::cells(sketches) as u32))
            .into_iter()
            .collect()
    }

    /// The counters from `first` on into `out`, sketch after sketch (see
    /// `Program::read_synced_run`: what a refresh reads); how many (fewer past the end,
    /// none for another id).
    pub fn read_synced_run(
        &self,
        sketches: &[CountMin],
        id: u16,
        first: u32,
        out: &mut [u64],
    ) -> usize {
        if self.synced != Some(id) {
            return 0;
        }
        let Some((mut k, mut j)) = Self::locate(sketches, first as usize) else {
            return 0;
        };
        let mut read = 0;
        while read < out.len() && k < sketches.len() {
            let cells = &sketches[k].counters().as_slice()[j..];
            let n = cells.len().min(out.len() - read);
            for (o, &c) in out[read..read + n].iter_mut().zip(cells) {
                *o = u64::from(c);
            }
            (read, k, j) = (read + n, k + 1, 0);
        }
        read
    }

    /// Starts a snapshot of every sketch at once (see `Program::snapshot_begin`).
    pub fn snapshot_begin(&self, sketches: &mut [CountMin], id: u16) -> bool {
        self.synced == Some(id) && (sketches.iter_mut()).all(|s| s.counters_mut().snapshot_begin())
    }

    /// The snapshot's counters from `first` on (see `Program::snapshot_read`).
    pub fn snapshot_read(
        &self,
        sketches: &mut [CountMin],
        id: u16,
        first: u32,
        out: &mut [u64],
    ) -> usize {
        if self.synced != Some(id) {
            return 0;
        }
        let mut read = 0;
        while read < out.len() {
            let Some((k, j)) = Self::locate(sketches, first as usize + read) else {
                break;
            };
            read += sketches[k]
                .counters_mut()
                .snapshot_read(j, &mut out[read..]);
        }
        read
    }

    /// Whether the snapshot's counters `first .. first + len` may have changed since the
    /// snapshot before (see `Program::snapshot_changed`).
    pub fn snapshot_changed(&self, sketches: &[CountMin], id: u16, first: u32, len: u32) -> bool {
        if self.synced != Some(id) {
            return true;
        }
        let (mut at, end) = (first as usize, first as usize + len as usize);
        while at < end {
            let Some((k, j)) = Self::locate(sketches, at) else {
                return false;
            };
            let counters = sketches[k].counters();
            let n = (counters.len() - j).min(end - at);
            if counters.snapshot_changed(j, n) {
                return true;
            }
            at += n;
        }
        false
    }

    /// Writes a counter, capped at its maximum as the sketch's own additions are.
    pub fn write_synced(
        &self,
        sketches: &mut [CountMin],
        id: u16,
        index: u32,
        value: u64,
    ) -> Option<u64> {
        if self.synced != Some(id) {
            return None;
        }
        let (k, j) = Self::locate(sketches, index as usize)?;
        let counters = sketches[k].counters_mut();
        let old = counters.as_slice()[j];
        counters
            .write(j, u32::try_from(value).unwrap_or(u32::MAX))
            .ok()?;
        Some(u64::from(old))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sketches() -> Vec<CountMin> {
        vec![CountMin::new(2, 4, 1), CountMin::new(2, 4, 2)]
    }

    #[test]
    fn one_register_over_every_sketch_in_order() {
        let mut s = sketches();
        let r = SketchRegister::new("sketch");
        assert_eq!(r.declaration(&s).capacity, 16);
        s[1].counters_mut().write(3, 7).unwrap();
        let read = Request::ReadRegister {
            name: "sketch".into(),
            first: 10,
            count: 2,
        };
        assert_eq!(r.answer(&mut s, &read), Ok(Reply::Values(vec![0, 7])));
        let write = Request::WriteRegister {
            name: "sketch".into(),
            first: 7,
            count: 2,
            value: u128::from(u64::MAX),
        };
        assert_eq!(r.answer(&mut s, &write), Ok(Reply::Done));
        assert_eq!(s[0].counters().as_slice()[7], u32::MAX);
        assert_eq!(s[1].counters().as_slice()[0], u32::MAX);
        let past = Request::ReadRegister {
            name: "sketch".into(),
            first: 15,
            count: 2,
        };
        assert!(matches!(
            r.answer(&mut s, &past),
            Err(ControlError::OutOfRange { index: 16, .. })
        ));
    }

    /// Counter `index` of state `id`, read as a run of one.
    fn read_one(r: &SketchRegister, s: &[CountMin], id: u16, index: u32) -> Option<u64> {
        let mut one = [0];
        (r.read_synced_run(s, id, index, &mut one) == 1).then_some(one[0])
    }

    #[test]
    fn synced_only_once_tracked_and_only_inside() {
        let mut s = sketches();
        let mut r = SketchRegister::new("sketch");
        assert_eq!(read_one(&r, &s, 0, 0), None);
        assert_eq!(r.track(&mut s, "other", 0), None);
        assert_eq!(r.track(&mut s, "sketch", 3), Some(16));
        assert_eq!(r.synced(&s), [(3, 16)]);
        let mut taken = Vec::new();
        assert_eq!(r.write_synced(&mut s, 3, 9, 1 << 40), Some(0));
        assert_eq!(read_one(&r, &s, 3, 9), Some(u64::from(u32::MAX)));
        assert_eq!(r.write_synced(&mut s, 3, 16, 1), None);
        assert_eq!(read_one(&r, &s, 3, 16), None);
        assert_eq!(read_one(&r, &s, 2, 9), None);
        // A run reads across the sketches as the values one by one do.
        let mut run = [7; 20];
        assert_eq!(r.read_synced_run(&s, 3, 2, &mut run), 14, "to the end");
        // Counter by counter as the sketches hold them: 8 in each, two rows of 4.
        let one_by_one: Vec<u64> = (2..16)
            .map(|i| u64::from(s[i as usize / 8].counters().as_slice()[i as usize % 8]))
            .collect();
        assert_eq!(run[..14], one_by_one[..]);
        assert_eq!(run[14..], [7; 6], "nothing past the end");
        assert_eq!(r.read_synced_run(&s, 3, 16, &mut run), 0);
        assert_eq!(r.read_synced_run(&s, 2, 0, &mut run), 0, "another id");
        s[0].add(&7u32, 2);
        r.changes(&mut s, &mut taken);
        let mut changed: Vec<(u16, u32)> = taken.iter().map(|c| (c.state, c.index)).collect();
        changed.sort();
        assert_eq!(
            changed.len(),
            3,
            "the add's two rows, then the write: {changed:?}"
        );
        assert!(changed.iter().all(|&(state, _)| state == 3));
        assert!(changed.contains(&(3, 9)));
        assert!(changed.iter().any(|&(_, i)| i < 4) && changed.iter().any(|&(_, i)| i >= 4));
    }
}
