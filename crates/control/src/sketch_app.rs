//! The paper's sketch applications on a sync collector: heavy hitters per interval
//! (`stateplane ctl sync hh`) and UDP flood prevention (`stateplane ctl sync udpflood`).
//! Each interval they read a switch's synced sketch from the collector's copy, estimate
//! their keys' counts with bounds, take what they read away from the sketch with one
//! atomic write per worker (what was counted since stays for the next interval), and
//! (flood prevention) push the victims into the switch's `victims` table, where its data
//! plane mitigates them.
//!
//! The bounds are the paper's Lemma 1 carried through the count-min sketch: every counter
//! of the copy is within its bound `b` of the switch's own (the collector never claims a
//! bound that does not hold), so the switch's estimate of a key, the least of its
//! counters, lies between the least `c - b` and the least `c + b` over them. A key is
//! reported when that upper end reaches the threshold (so the sketch's own answer is never
//! missed) and said to be sure when the lower end does; only sure victims are pushed.
//!
//! Where a key is counted comes from the switch (the control API's `CountersOf`: its
//! hashes are seeded per process), once, and again for keys a worker had not placed yet.
//!
//! The keys are the user's, and (with [`Watch::learn`]) every key the switch holds in its
//! table at an interval's end: `hh`'s data plane files each flow whose count reaches its own
//! threshold in `heavy_hitters`, so with that threshold at most the application's, every
//! flow the copy shows reaching the application's was filed before the copy was read (the
//! table is read after it: the switch's counters are never below the copy's values).
//!
//! Must never: call a key found on a counter it has no bound for, or reset a sketch it
//! has not read in the same interval.

use crate::client::Client;
use crate::collector_api::CollectorClient;
use crate::sync_pb;
use stateplane_state::{Entry, Match, WorkerCounters, Write};
use stateplane_sync::write::MAX_VALUES;
use std::collections::HashSet;

/// A key's count on the switch, as the copy bounds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Estimate {
    /// The copy's own estimate (the least of the key's counters in the copy).
    pub value: u64,
    /// The switch's estimate is at least this ...
    pub low: u64,
    /// ... and at most this (`None`: every counter of the key is unbounded in the copy).
    pub high: Option<u64>,
}

impl Estimate {
    /// Nothing counted: a key no worker has placed yet.
    pub const ZERO: Estimate = Estimate {
        value: 0,
        low: 0,
        high: Some(0),
    };

    /// The estimate from one worker's counters `cells` of its copy; `None` if a cell is
    /// past the copy's end (the switch answered for another layout).
    pub fn of(copy: &StreamCopy, cells: &[u32]) -> Option<Estimate> {
        if cells.is_empty() {
            return Some(Estimate::ZERO);
        }
        let mut e = Estimate {
            value: u64::MAX,
            low: u64::MAX,
            high: None,
        };
        for &c in cells {
            let c = c as usize;
            let value = *copy.values.get(c)?;
            e.value = e.value.min(value);
            match copy.bounds.get(c)? {
                Some(b) => {
                    e.low = e.low.min(value.saturating_sub(*b));
                    let high = value.saturating_add(*b);
                    e.high = Some(e.high.map_or(high, |h| h.min(high)));
                }
                // The switch's counter may be anything: so may the least of them.
                None => e.low = 0,
            }
        }
        Some(e)
    }

    /// The estimate of a key counted on several workers: the sum of theirs.
    pub fn plus(self, other: Estimate) -> Estimate {
        Estimate {
            value: self.value.saturating_add(other.value),
            low: self.low.saturating_add(other.low),
            high: self.high.zip(other.high).map(|(a, b)| a.saturating_add(b)),
        }
    }

    /// Whether the switch's estimate may reach `threshold` (every key it would report is).
    pub fn may_reach(&self, threshold: u64) -> bool {
        self.high.is_none_or(|h| h >= threshold)
    }

    /// Whether it surely does.
    pub fn reaches(&self, threshold: u64) -> bool {
        self.low >= threshold
    }
}

/// One stream's (worker's) copy of the sketch register: each counter's value and bound
/// (`None`: unbounded, a loss the refresh has not made up yet).
#[derive(Debug, Clone, Default)]
pub struct StreamCopy {
    pub values: Vec<u64>,
    pub bounds: Vec<Option<u64>>,
}

impl StreamCopy {
    fn of(read: crate::collector_api::ReadValues) -> StreamCopy {
        let mut bounds: Vec<Option<u64>> = read.bounds.into_iter().map(Some).collect();
        for &i in &read.unbounded {
            if let Some(b) = bounds.get_mut(i as usize) {
                *b = None;
            }
        }
        StreamCopy {
            values: read.values,
            bounds,
        }
    }
}

/// What an application watches, and where.
#[derive(Debug, Clone)]
pub struct Watch {
    pub switch_id: u32,
    /// The sketch register's state id in the run's `[guarantees]`.
    pub state: u32,
    /// The table the program reports the sketch's keys in (`heavy_hitters`, `victims`):
    /// its key fields are the keys'.
    pub table: String,
    pub keys: Vec<Vec<Match>>,
    /// Also watch, from each interval's end on, every key the switch holds in `table`.
    pub learn: bool,
    pub threshold: u64,
    /// Push the sure keys into `table` (flood prevention's mitigation).
    pub push: bool,
    /// How long the reset may take to commit.
    pub timeout_ms: u32,
}

/// A key found in an interval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// Its index in [`Watch::keys`].
    pub key: usize,
    pub estimate: Estimate,
    pub pushed: bool,
}

/// What one interval found and did.
#[derive(Debug, Clone, Default)]
pub struct Interval {
    pub number: u32,
    pub found: Vec<Found>,
    /// Counters read, and how many of them were unbounded.
    pub read: usize,
    pub unbounded: usize,
    /// The keys' total, as the copy has it.
    pub total: u64,
    /// How long the read and the reset took.
    pub read_ns: u64,
    pub reset_ns: u64,
}

/// A sketch application against one switch: call [`SketchApp::interval`] at the end of
/// each interval.
pub struct SketchApp {
    pub watch: Watch,
    /// Where each worker counts each key, as the switch last said, and the epochs of
    /// its streams then (a switch that starts again, or reloads, draws new hash seeds).
    counters: Vec<WorkerCounters>,
    epochs: Vec<(u32, u32)>,
    /// The keys watched, to learn each once.
    known: HashSet<Vec<Match>>,
}

/// Whether where the keys are counted must be asked again: never asked, a stream of
/// another epoch (new hash seeds) or a new stream, or a key some worker had not placed.
fn ask_again(counters: &[WorkerCounters], asked: &[(u32, u32)], now: &[(u32, u32)]) -> bool {
    counters.is_empty()
        || now.iter().any(|s| !asked.contains(s))
        || (counters.iter()).any(|c| c.cells.iter().any(Vec::is_empty))
}

impl SketchApp {
    pub fn new(watch: Watch) -> SketchApp {
        SketchApp {
            known: watch.keys.iter().cloned().collect(),
            watch,
            counters: Vec::new(),
            epochs: Vec::new(),
        }
    }

    /// Watches the keys the switch holds in the watch's table that it does not watch yet;
    /// whether there were any.
    fn learn(&mut self, switch: &mut Client) -> Result<bool, String> {
        let (_, entries) = (switch.read(&self.watch.table, None))
            .map_err(|e| format!("reading the keys the switch holds: {e}"))?;
        let before = self.watch.keys.len();
        for entry in entries {
            if self.known.insert(entry.key.clone()) {
                self.watch.keys.push(entry.key);
            }
        }
        Ok(self.watch.keys.len() > before)
    }

    /// Starts the first interval: resets the sketch on every worker, so that it counts
    /// from now (what it held before belongs to no interval of the application's).
    pub fn start(&mut self, collector: &mut CollectorClient) -> Result<(), String> {
        let streams = self.streams(collector)?;
        let length = (streams.iter())
            .flat_map(|s| &s.extents)
            .filter(|e| e.state == self.watch.state)
            .map(|e| e.length as usize)
            .max()
            .unwrap_or(0);
        if length == 0 {
            return Err(format!(
                "the collector holds nothing of switch {}'s state {} yet: is it synced \
                 ([guarantees] sketch = [\"synced\"])?",
                self.watch.switch_id, self.watch.state
            ));
        }
        self.reset(collector, length)
    }

    /// The streams of the switch the collector has heard from (an error if none).
    fn streams(&self, collector: &mut CollectorClient) -> Result<Vec<sync_pb::Stream>, String> {
        let streams = collector.streams().map_err(|e| e.to_string())?;
        let ours: Vec<sync_pb::Stream> = (streams.streams.into_iter())
            .filter(|s| s.switch_id == self.watch.switch_id)
            .collect();
        if ours.is_empty() {
            return Err(format!(
                "switch {} has sent nothing to this collector",
                self.watch.switch_id
            ));
        }
        Ok(ours)
    }

    /// Ends an interval: reads the copy, judges every key, takes what it read away from
    /// the sketch on every worker (what was counted since stays, for the next interval),
    /// and pushes the sure keys if asked, as found in interval `number` (the caller's
    /// count, failed intervals included).
    pub fn interval(
        &mut self,
        collector: &mut CollectorClient,
        switch: &mut Client,
        number: u32,
    ) -> Result<Interval, String> {
        let ours = self.streams(collector)?;
        let started = std::time::Instant::now();
        let mut out = Interval {
            number,
            ..Interval::default()
        };
        // Each stream's copy, read first: the keys learned after it include every key it
        // shows reaching the threshold (see the module doc).
        let mut copies = Vec::with_capacity(ours.len());
        for s in &ours {
            let extent = (s.extents.iter())
                .find(|e| e.state == self.watch.state)
                .map_or(0, |e| e.length);
            let read = collector
                .read(sync_pb::ReadRequest {
                    switch_id: self.watch.switch_id,
                    stream: Some(s.stream),
                    state: self.watch.state,
                    first: 0,
                    count: extent,
                })
                .map_err(|e| e.to_string())?;
            out.read += read.values.len();
            out.unbounded += read.unbounded.len();
            copies.push((s.stream, StreamCopy::of(read)));
        }
        let learned = self.watch.learn && self.learn(switch)?;
        let w = &self.watch;
        let epochs: Vec<(u32, u32)> = ours.iter().map(|s| (s.stream, s.epoch)).collect();
        if learned || ask_again(&self.counters, &self.epochs, &epochs) {
            self.counters = switch
                .counters_of(&w.table, &w.keys)
                .map_err(|e| format!("asking the switch where its keys are counted: {e}"))?;
            self.epochs = epochs;
        }
        let mut estimates = vec![Estimate::ZERO; w.keys.len()];
        // What each stream's copy held, to be taken away at the interval's end.
        let mut read_back = Vec::with_capacity(copies.len());
        for (stream, copy) in copies {
            let cells = (self.counters.iter())
                .find(|c| c.worker == stream)
                .ok_or_else(|| {
                    format!(
                        "the switch has no worker {stream} (its stream {stream}): is the \
                         collector's switch {} the switch at the control address?",
                        w.switch_id
                    )
                })?;
            for (e, key_cells) in estimates.iter_mut().zip(&cells.cells) {
                let here = Estimate::of(&copy, key_cells).ok_or_else(|| {
                    format!(
                        "the switch counts a key past the {} counters of state {}: is \
                         state {} its sketch register?",
                        copy.values.len(),
                        w.state,
                        w.state
                    )
                })?;
                *e = e.plus(here);
            }
            read_back.push((stream, copy.values));
        }
        out.read_ns = started.elapsed().as_nanos() as u64;
        out.total = estimates.iter().map(|e| e.value).sum();
        out.found = (estimates.iter().enumerate())
            .filter(|(_, e)| e.may_reach(w.threshold))
            .map(|(key, e)| Found {
                key,
                estimate: *e,
                pushed: false,
            })
            .collect();
        let started = std::time::Instant::now();
        self.take_away(collector, &read_back)?;
        out.reset_ns = started.elapsed().as_nanos() as u64;
        if w.push {
            for f in &mut out.found {
                if f.estimate.reaches(w.threshold) {
                    push(switch, &w.table, &w.keys[f.key], number, f.estimate.value)?;
                    f.pushed = true;
                }
            }
        }
        Ok(out)
    }

    /// Takes what the interval read of each stream's counters away from them, each write
    /// committed whole between two bursts: what the data plane counted after the copy's
    /// values (not yet in the copy when it was read, or since) stays for the next
    /// interval. (A reset to 0 that keeps the changes made from its arrival on would lose
    /// the counts between the copy's values and that arrival.) A value the copy holds is
    /// one the counter had, so it is not larger than the counter, unless a reset came
    /// between (the first interval's, or the switch's own `interval_ms`): then that
    /// counter ends at 0.
    fn take_away(
        &self,
        collector: &mut CollectorClient,
        read_back: &[(u32, Vec<u64>)],
    ) -> Result<(), String> {
        for (stream, values) in read_back {
            for (i, chunk) in values.chunks(MAX_VALUES).enumerate() {
                let request = sync_pb::WriteRequest {
                    values: chunk.to_vec(),
                    subtract: true,
                    ..self.write_of(Some(*stream), i * MAX_VALUES, chunk.len())
                };
                (collector.write(request))
                    .map_err(|e| format!("taking the interval's counts away: {e}"))?;
            }
        }
        Ok(())
    }

    /// Writes 0 over the sketch's `length` counters on every worker, each write committed
    /// whole between two bursts; what the data plane counted since the part arrived is
    /// kept (what it counted before belongs to no interval of the application's).
    fn reset(&self, collector: &mut CollectorClient, length: usize) -> Result<(), String> {
        for first in (0..length).step_by(MAX_VALUES) {
            let count = MAX_VALUES.min(length - first);
            let request = sync_pb::WriteRequest {
                keep_changes: true,
                ..self.write_of(None, first, count)
            };
            (collector.write(request)).map_err(|e| format!("resetting the sketch: {e}"))?;
        }
        Ok(())
    }

    /// A write of 0 into `count` counters of the sketch from `first`, on `stream` (every
    /// stream if `None`), committed within the watch's timeout.
    fn write_of(&self, stream: Option<u32>, first: usize, count: usize) -> sync_pb::WriteRequest {
        let w = &self.watch;
        sync_pb::WriteRequest {
            switch_id: w.switch_id,
            stream,
            state: w.state,
            first: first as u32,
            values: Vec::new(),
            fill: 0,
            count: count as u32,
            keep_changes: false,
            subtract: false,
            timeout_ms: w.timeout_ms,
        }
    }
}

/// Files `key` in the switch's `table` as found in `interval` with `estimate`: added, or
/// its report replaced.
fn push(
    switch: &mut Client,
    table: &str,
    key: &[Match],
    interval: u32,
    estimate: u64,
) -> Result<(), String> {
    let entry = Entry {
        key: key.to_vec(),
        action: "found".into(),
        params: vec![
            u128::from(interval),
            u128::from(estimate.min(u64::from(u32::MAX))),
        ],
        priority: 0,
        hits: 0,
    };
    let pushed = match switch.write(table, &[Write::Insert(entry.clone())]) {
        Err(e) if e.code == tonic::Code::AlreadyExists => {
            switch.write(table, &[Write::Modify(entry)])
        }
        other => other,
    };
    pushed
        .map(|_| ())
        .map_err(|e| format!("pushing a key into {table}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(cells: &[(u64, Option<u64>)]) -> StreamCopy {
        StreamCopy {
            values: cells.iter().map(|c| c.0).collect(),
            bounds: cells.iter().map(|c| c.1).collect(),
        }
    }

    /// The switch's estimate is the least of its counters; each lies within its bound of
    /// the copy's, so the least lies between the least lows and the least highs.
    #[test]
    fn an_estimate_holds_the_switchs_least_counter_between_its_ends() {
        let c = copy(&[(100, Some(5)), (90, Some(20)), (300, None), (7, Some(0))]);
        let e = Estimate::of(&c, &[0, 1]).unwrap();
        assert_eq!(
            e,
            Estimate {
                value: 90,
                low: 70,
                high: Some(105)
            }
        );
        // Brute force: every switch consistent with the copy has its least counter inside.
        for a in 95..=105 {
            for b in 70..=110 {
                let least = u64::min(a, b);
                assert!(e.low <= least && least <= e.high.unwrap());
            }
        }
        // An unbounded counter may be anything, so the least may be 0; the bounded one
        // still caps it.
        let e = Estimate::of(&c, &[0, 2]).unwrap();
        assert_eq!((e.value, e.low, e.high), (100, 0, Some(105)));
        assert!(e.may_reach(105) && !e.may_reach(106) && !e.reaches(1));
        let e = Estimate::of(&c, &[2]).unwrap();
        assert_eq!(e.high, None, "nothing bounds it");
        assert!(e.may_reach(u64::MAX), "so it may be anything");
        assert_eq!(Estimate::of(&c, &[]), Some(Estimate::ZERO));
        assert_eq!(Estimate::of(&c, &[4]), None, "past the copy");
    }

    /// The counters are asked for again after the switch starts again (a new epoch: new
    /// hash seeds), for a new stream, and while a key is placed nowhere; else not.
    #[test]
    fn where_keys_are_counted_is_asked_again_when_it_may_have_changed() {
        let placed = vec![WorkerCounters {
            worker: 0,
            cells: vec![vec![1, 9]],
        }];
        let asked = [(0, 7)];
        assert!(ask_again(&[], &[], &asked), "never asked");
        assert!(!ask_again(&placed, &asked, &asked));
        assert!(ask_again(&placed, &asked, &[(0, 8)]), "started again");
        assert!(
            ask_again(&placed, &asked, &[(0, 7), (1, 3)]),
            "a new stream"
        );
        let nowhere = vec![WorkerCounters {
            worker: 0,
            cells: vec![vec![]],
        }];
        assert!(ask_again(&nowhere, &asked, &asked), "not placed yet");
    }

    #[test]
    fn workers_estimates_add_and_an_unbounded_one_leaves_the_sum_unbounded() {
        let a = Estimate {
            value: 10,
            low: 8,
            high: Some(12),
        };
        let b = Estimate {
            value: 5,
            low: 5,
            high: Some(5),
        };
        assert_eq!(
            a.plus(b),
            Estimate {
                value: 15,
                low: 13,
                high: Some(17)
            }
        );
        let open = Estimate { high: None, ..b };
        assert_eq!(a.plus(open).high, None);
        assert!(a.plus(b).reaches(13) && !a.plus(b).reaches(14));
        let top = Estimate {
            value: u64::MAX,
            low: u64::MAX,
            high: Some(u64::MAX),
        };
        assert_eq!(top.plus(top).high, Some(u64::MAX), "saturates");
    }
}
