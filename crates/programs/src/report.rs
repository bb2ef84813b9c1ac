//! What the measurement programs (`hh`, `superspreader`, `udpflood`, `synflood`) share:
//! measurement intervals on the packets' clock, and a table of what an interval found.
//!
//! Owns: interval numbering and the declared `Reports` table (the key, the interval it was
//! found in, the estimate), whose first entry per key and interval is also sent to the
//! control plane as a digest (`ctl watch`). Must never: decide what is worth reporting
//! (the programs do).

use crate::keys::{KeyFields, filled_table};
use crate::sketches::SketchRegister;
use serde::Deserialize;
use stateplane_runtime::Context;
use stateplane_state::control::{Field, Format};
use stateplane_state::{
    ControlError, CountMin, Declaration, DeclaredTable, ExpireMode, ExpireProfile, Kind, Reply,
    Request, ValueCodec, params_into,
};
use std::marker::PhantomData;

/// Inside the `impl Program` of a measurement that counts in one sketch (`self.$sketch`,
/// declared by `self.$register`) and files what it finds, by address, in `self.$reports`:
/// its control API ([`Reports::declarations_with`], [`Reports::answer_with`]) and its
/// digests.
macro_rules! answer_by_measurement {
    ($reports:ident, $register:ident, $sketch:ident) => {
        fn declarations(&self) -> Vec<stateplane_state::Declaration> {
            let sketch = std::slice::from_ref(&self.$sketch);
            self.$reports.declarations_with(&self.$register, sketch)
        }

        fn control(
            &mut self,
            request: &stateplane_state::Request,
            _prepared: Option<&std::sync::Arc<()>>,
            ctx: &stateplane_runtime::Context,
        ) -> Result<stateplane_state::Reply, stateplane_state::ControlError> {
            let sketch = (&self.$register, std::slice::from_mut(&mut self.$sketch));
            (self.$reports).answer_with(sketch, request, ctx, |_: &u128| Some(0))
        }

        fn notifications(&mut self, out: &mut Vec<stateplane_state::Notification>) {
            self.$reports.table.take_notifications(out);
        }
    };
}
pub(crate) use answer_by_measurement;

/// The settings every measurement program has.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Measurement {
    /// Interval length in milliseconds: counts start again at each one.
    #[serde(default = "default_interval")]
    pub interval_ms: u64,
    /// Count-min sketch columns per row (rounded up to a power of two) and rows.
    #[serde(default = "default_width")]
    pub width: usize,
    #[serde(default = "default_depth")]
    pub depth: usize,
    /// Reports kept per worker.
    #[serde(default = "default_reports")]
    pub reports: usize,
}

impl Default for Measurement {
    fn default() -> Self {
        Measurement {
            interval_ms: default_interval(),
            width: default_width(),
            depth: default_depth(),
            reports: default_reports(),
        }
    }
}

fn default_interval() -> u64 {
    1000
}

fn default_width() -> usize {
    4096
}

fn default_depth() -> usize {
    4
}

fn default_reports() -> usize {
    4096
}

impl Measurement {
    /// Checks the settings (under `field`).
    pub(crate) fn check(&self, field: &str) -> Result<(), crate::ConfigError> {
        use crate::ConfigError;
        if !(1..=3_600_000).contains(&self.interval_ms) {
            return Err(ConfigError::new(
                format!("{field}.interval_ms"),
                "give 1 to 3600000 milliseconds",
            ));
        }
        if !(16..=1 << 24).contains(&self.width) {
            return Err(ConfigError::new(
                format!("{field}.width"),
                "give 16 to 16777216 counters per row",
            ));
        }
        if !(1..=8).contains(&self.depth) {
            return Err(ConfigError::new(
                format!("{field}.depth"),
                "give 1 to 8 rows",
            ));
        }
        crate::check_capacity(&format!("{field}.reports"), self.reports, "reports")?;
        crate::claim_bytes(
            &format!("{field}.width"),
            || format!("a sketch of {} rows of {} counters", self.depth, self.width),
            stateplane_state::CountMin::bytes_for(self.depth, self.width),
        )
    }

    pub(crate) fn interval_ns(&self) -> u64 {
        self.interval_ms * 1_000_000
    }
}

/// Which interval a time falls in, and whether time has moved into a later one.
#[derive(Debug, Clone)]
pub(crate) struct Intervals {
    length_ns: u64,
    current: Option<u64>,
}

impl Intervals {
    pub fn new(length_ns: u64) -> Self {
        Intervals {
            length_ns: length_ns.max(1),
            current: None,
        }
    }

    /// The interval counted now (`None` before the first call).
    pub fn current(&self) -> Option<u64> {
        self.current
    }

    /// Takes `old`'s current interval when it counts intervals of the same length (a
    /// reload); whether it did.
    pub fn inherit(&mut self, old: &Intervals) -> bool {
        let same = self.length_ns == old.length_ns;
        if same {
            self.current = old.current;
        }
        same
    }

    /// Counts in interval `current` from now on (a snapshot's, installed).
    pub fn set_current(&mut self, current: Option<u64>) {
        self.current = current;
    }

    /// The interval `now_ns` falls in, and whether it is a later one than the last call's
    /// (the first call's is not: nothing was counted before it).
    #[inline]
    pub fn at(&mut self, now_ns: u64) -> (u32, bool) {
        let i = now_ns / self.length_ns;
        let later = self.current.is_some_and(|c| i > c);
        if later || self.current.is_none() {
            self.current = Some(i);
        }
        (self.current.unwrap_or(i) as u32, later)
    }
}

/// What an interval found about a key.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Zeroable)]
pub struct Report {
    /// The interval's number (time / interval length).
    pub interval: u32,
    /// The measured count when last updated.
    pub estimate: u32,
}

pub(crate) struct ReportCodec<K>(PhantomData<K>);

impl<K: KeyFields> ValueCodec for ReportCodec<K> {
    type Key = K;
    type Value = Report;

    fn value(_action: usize, params: &[u128]) -> Report {
        let p = |i: usize| params.get(i).copied().unwrap_or(0) as u32;
        Report {
            interval: p(0),
            estimate: p(1),
        }
    }

    fn action_values(r: &Report, out: &mut [u128]) -> (usize, usize) {
        (
            0,
            params_into([u128::from(r.interval), u128::from(r.estimate)], out),
        )
    }
}

/// Who files reports: the data plane alone (the control plane reads and deletes them), or
/// the control plane too (a controller's own findings, which the data plane then acts on
/// as its own: a flood victim found from a sync collector's copy).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Writers {
    DataPlane,
    DataPlaneAndControl,
}

/// The reports of the last intervals: an entry leaves once it has not been reported for
/// a while (`keep_ns`).
pub(crate) struct Reports<K: KeyFields> {
    pub table: DeclaredTable<ReportCodec<K>>,
}

impl<K: KeyFields> Clone for Reports<K> {
    fn clone(&self) -> Self {
        Reports {
            table: self.table.clone(),
        }
    }
}

impl<K: KeyFields> Reports<K> {
    /// A table `name` of reports keyed by a field `key_name` (for address keys), each
    /// naming the measured count `what`, kept `keep_ns` after their last report, filed by
    /// `writers`.
    /// `field` is the measurement's settings (`reports` under it sizes the table, from the
    /// run's memory budget).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        field: &str,
        name: &str,
        key_name: &str,
        what: &str,
        m: &Measurement,
        keep_ns: u64,
        seed: u64,
        writers: Writers,
    ) -> Result<Reports<K>, crate::ConfigError> {
        let found = vec![
            Field::exact("interval", 32, Format::Int),
            Field::exact(what, 32, Format::Int),
        ];
        let mut declaration = filled_table::<K>(name, key_name, m.reports, &["found"], found);
        if let Kind::Table { writable, .. } = &mut declaration.kind {
            *writable = writers == Writers::DataPlaneAndControl;
        }
        let keep = ExpireProfile {
            timeout_ns: keep_ns,
            mode: ExpireMode::AutoDelete,
        };
        let table = crate::budgeted_table(&format!("{field}.reports"), m.reports, &[keep], seed)?;
        Ok(Reports {
            table: DeclaredTable::new(table, declaration),
        })
    }

    /// Files `estimate` for `key` in `interval`; the first report of a key in an interval
    /// is also a digest. Returns whether it was the first, or `None` if the key is not in
    /// the table (a full table keeps what it has; `ctl stats` counts the refusals).
    pub fn file(&mut self, key: K, estimate: u32, interval: u32, now_ns: u64) -> Option<bool> {
        let report = Report { interval, estimate };
        let first = match self.table.lookup(&key, now_ns) {
            Some(id) => {
                let r = self.table.value_mut(id);
                let first = r.interval != interval;
                *r = report;
                self.table.restart_timer(id, now_ns);
                first
            }
            None => {
                self.table.add_entry(key, report, 0, now_ns).ok()?;
                true
            }
        };
        if first {
            self.table.digest(&key, &report, now_ns);
        }
        Some(first)
    }

    pub fn get(&self, key: &K) -> Option<Report> {
        self.table.get(key).copied()
    }

    pub fn expire(&mut self, now_ns: u64, budget: usize) {
        self.table.expire(now_ns, budget, |_, _| {});
    }

    /// The declarations of a measurement that counts in `sketches`, declared by
    /// `register`, and files what it finds here: this table, then the sketch.
    pub fn declarations_with(
        &self,
        register: &SketchRegister,
        sketches: &[CountMin],
    ) -> Vec<Declaration> {
        vec![
            self.table.declaration().clone(),
            register.declaration(sketches),
        ]
    }

    /// Answers the control plane for such a measurement: where keys are counted
    /// (`sketch_of` says in which sketch), the sketch's register, else this table.
    pub fn answer_with(
        &mut self,
        (register, sketches): (&SketchRegister, &mut [CountMin]),
        request: &Request,
        ctx: &Context,
        sketch_of: impl Fn(&K) -> Option<usize>,
    ) -> Result<Reply, ControlError> {
        if let Request::CountersOf { keys, .. } = request {
            return Ok(SketchRegister::counters_of(
                sketches, keys, ctx.worker, sketch_of,
            ));
        }
        if request.target() == register.name() {
            register.answer(sketches, request)
        } else {
            self.table.answer(request, ctx.now_ns)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_number_time_and_say_when_a_later_one_begins() {
        let mut i = Intervals::new(10);
        assert_eq!(i.at(25), (2, false), "the first is no change");
        assert_eq!(i.at(29), (2, false));
        assert_eq!(i.at(31), (3, true));
        assert_eq!(
            i.at(28),
            (3, false),
            "a late packet stays in the current one"
        );
        assert_eq!(i.at(75), (7, true));
    }

    #[test]
    fn a_key_is_first_once_per_interval_and_each_first_is_a_digest() {
        let m = Measurement {
            interval_ms: 1,
            ..Measurement::default()
        };
        let mut r: Reports<u128> = Reports::new(
            "program.test",
            "found",
            "dst",
            "packets",
            &m,
            2_000_000,
            1,
            Writers::DataPlane,
        )
        .unwrap();
        assert_eq!(r.file(7, 100, 1, 0), Some(true));
        assert_eq!(r.file(7, 150, 1, 0), Some(false));
        assert_eq!(
            r.get(&7),
            Some(Report {
                interval: 1,
                estimate: 150
            })
        );
        assert_eq!(r.file(7, 120, 2, 1_000_000), Some(true));
        let mut out = Vec::new();
        r.table.take_notifications(&mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[1].entry.params, [2, 120]);
        for _ in 0..8 {
            r.expire(3_000_001, 4096);
        }
        assert_eq!(r.get(&7), None, "gone two intervals after its last report");
    }
}
