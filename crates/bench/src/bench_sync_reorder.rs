//! `stateplane bench-sync-reorder`: what becomes of the data plane's updates made while a
//! write is on its way, and what that does to heavy hitters (ApproSync's reordered
//! updates), in virtual time on the sync cores. A count-min sketch counts a Zipf stream;
//! every interval the control plane resets it, a write of every counter to 0 through the
//! write engine over a channel that loses a share of its datagrams each way, and the heavy
//! hitters of the interval are read from the data plane's sketch just before the next
//! reset is issued, against the exact counts since the last one was.
//!
//! The updates a counter takes between its part's arrival and the commit, four ways:
//! - `ideal`: none; the reset lands the instant it is issued;
//! - `set` (`Mode::Set`): the commit overwrites them (lost);
//! - `defer` (the paper's): from the first part's arrival every update is held back, and
//!   replayed after the commit (each one reordered: applied after a write issued after it);
//! - `keep` (`Mode::SetKeepingChanges`, this project's): applied at once, and the commit
//!   sets each counter to 0 plus the changes made since its part arrived;
//! - `subtract` (`Mode::Subtract`, this project's, what the sketch applications do): the
//!   write carries the counters as read when it is issued, and the commit takes them
//!   away, so every update made after the read stays, for the next interval.
//!
//! Every way but `subtract` loses the updates made between the issue and a part's
//! arrival (the reset is not there yet to keep them). `set`, `defer` and `keep` run twice:
//! the reset as the write engine sends it (its zeros a run with no value bytes: one part),
//! and cut into parts of `--values-per-part` values (the paper's packetization, a switch's
//! parser reading so many values a packet), where updates come while parts are on their
//! way. The run checks its books: every increment is in the final counters or was erased
//! by a commit, the way says so; and each commit in `set` and `defer` leaves every
//! counter 0.

use crate::BenchResult;
use crate::bench_sync_hh::{Accuracy, Arrivals, SketchStream};
use crate::chart::Panel;
use crate::results::{Csv, ResultFiles, Table};
use stateplane_gen::rng::Rng;
use stateplane_state::CountMin;
use stateplane_sync::Location;
use stateplane_sync::channel::{Channel, ChannelConfig, Faults, WriteLink};
use stateplane_sync::write::{Mode, WriteEngine, WriteStage, WriteTarget, Written};

#[derive(clap::Args)]
pub struct BenchSyncReorderArgs {
    #[command(flatten)]
    pub stream: SketchStream,
    /// The reset's period, milliseconds.
    #[arg(long, default_value_t = 100)]
    pub interval_ms: u64,
    /// The write channel's capacity each way, bytes a second.
    #[arg(long, default_value_t = 12_500_000)]
    pub capacity: u64,
    /// The paper's packetization: `set`, `defer` and `keep` also run with the reset cut
    /// into parts of this many values (by default, as many as a 1,500-byte datagram
    /// carries at a byte each).
    #[arg(long, default_value_t = 1_408)]
    pub values_per_part: usize,
    /// The write channel's one-way latency, microseconds.
    #[arg(long, default_value_t = 100)]
    pub latency_us: u64,
    /// Comma-separated shares of the datagrams lost each way.
    #[arg(long, value_delimiter = ',', default_value = "0,0.2,0.5")]
    pub losses: Vec<f64>,
    /// Virtual seconds per run.
    #[arg(long, default_value_t = 2.0)]
    pub seconds: f64,
    /// Seed of the traces and random draws: the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub files: ResultFiles,
}

/// Virtual time between packets' arrivals looked at.
const STEP_NS: u64 = 10_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Way {
    Ideal,
    Set,
    Defer,
    Keep,
    Subtract,
}

impl Way {
    /// The ways run, each with the reset cut as it is: by values a part (`Some(n)`) or as
    /// the engine cuts it.
    fn all(values_per_part: usize) -> [(Way, Option<usize>); 8] {
        let cut = Some(values_per_part);
        [
            (Way::Ideal, None),
            (Way::Set, cut),
            (Way::Defer, cut),
            (Way::Keep, cut),
            (Way::Set, None),
            (Way::Defer, None),
            (Way::Keep, None),
            (Way::Subtract, None),
        ]
    }

    fn name(self) -> &'static str {
        match self {
            Way::Ideal => "ideal",
            Way::Set => "set",
            Way::Defer => "defer",
            Way::Keep => "keep",
            Way::Subtract => "subtract",
        }
    }
}

/// The sketch as the write stage reads and writes it: counter `index` of all its rows.
struct Counters<'a>(&'a mut CountMin);

impl WriteTarget for Counters<'_> {
    fn read(&self, l: Location) -> u64 {
        u64::from(self.0.counters().as_slice()[l.index as usize])
    }
    fn write(&mut self, l: Location, v: u64) {
        let _ =
            (self.0.counters_mut()).write(l.index as usize, u32::try_from(v).unwrap_or(u32::MAX));
    }
    fn extent(&self, _state: u16) -> u32 {
        self.0.counters().as_slice().len() as u32
    }
}

fn total(sketch: &CountMin) -> u64 {
    sketch
        .counters()
        .as_slice()
        .iter()
        .map(|&c| u64::from(c))
        .sum()
}

#[derive(Default)]
struct Outcome {
    intervals: u64,
    /// Packets that came between a reset's issue and its commit.
    made_while_writing: u64,
    /// Packets' worth of increments (a packet is one a row) a commit erased that came
    /// after its reset was issued.
    lost: u64,
    /// Packets held back and applied after a commit issued after them.
    reordered: u64,
    /// Commit latency (issue to commit), summed, and the writes' parts sent.
    commit_ns: u64,
    parts_sent: u64,
    hitters: Accuracy,
}

/// How a run's reset is cut, for its rows.
fn cut_name(way: Way, cut: Option<usize>) -> String {
    match (way, cut) {
        (Way::Ideal, _) => "-".into(),
        (_, Some(n)) => format!("{n} a part"),
        (_, None) => "runs".into(),
    }
}

fn run(a: &BenchSyncReorderArgs, way: Way, cut: Option<usize>, loss: f64) -> BenchResult<Outcome> {
    let channel = |seed| {
        Channel::new(ChannelConfig {
            bytes_per_second: a.capacity,
            buffer_bytes: 4 << 20,
            latency_ns: a.latency_us * 1_000,
            faults: Faults {
                loss,
                ..Faults::default()
            },
            seed,
        })
    };
    let mut link = WriteLink::new(channel(a.seed), channel(a.seed ^ 0x5555));
    let mut engine = WriteEngine::new(1, 1, 0, 200_000);
    if let Some(values) = cut {
        engine = engine.with_values_per_part(values);
    }
    let mut stage = WriteStage::default();
    let mut sketch = CountMin::new(a.stream.depth, a.stream.width, a.seed);
    let cells = sketch.counters().as_slice().len() as u32;
    let mode = match way {
        Way::Keep => Mode::SetKeepingChanges,
        Way::Subtract => Mode::Subtract,
        _ => Mode::Set,
    };
    // The reset's values: 0, or the counters as read at its issue (`subtract`).
    let reset = |sketch: &CountMin| -> Vec<Written> {
        (0..cells)
            .map(|index| Written {
                location: Location { state: 0, index },
                value: match way {
                    Way::Subtract => u64::from(sketch.counters().as_slice()[index as usize]),
                    _ => 0,
                },
                mode,
            })
            .collect()
    };
    let mut rng = Rng::new(a.seed);
    let mut arrivals = Arrivals::new(&a.stream, STEP_NS);
    let mut truth = vec![0u64; a.stream.flows];
    let (mut interval_packets, mut increments) = (0u64, 0u64);
    let mut erased = 0u64;
    let mut deferred: Vec<usize> = Vec::new();
    // A reset on its way: when it was issued, and the counters' total then.
    let mut writing: Option<(u64, u64)> = None;
    let mut outcome = Outcome::default();
    let interval_ns = a.interval_ms * 1_000_000;
    let end_ns = (a.seconds * 1e9) as u64;
    let mut now = 0;
    while now <= end_ns {
        if now > 0 && now % interval_ns == 0 {
            if writing.is_some() {
                return Err(format!(
                    "{}: a reset was still on its way after {} ms at {loss} loss ({} parts \
                     sent, {} lost): give a longer --interval-ms",
                    way.name(),
                    a.interval_ms,
                    link.down.counters.sent,
                    link.down.counters.lost
                ));
            }
            outcome.intervals += 1;
            let estimate = |key: usize| u64::from(sketch.estimate(&(key as u64)));
            (outcome.hitters).add(&truth, estimate, interval_packets, a.stream.share);
            truth.iter_mut().for_each(|t| *t = 0);
            interval_packets = 0;
            if way == Way::Ideal {
                erased += total(&sketch);
                sketch.clear();
            } else {
                engine.submit(reset(&sketch))?;
                writing = Some((now, total(&sketch)));
            }
        }
        arrivals.step(&mut rng, |key| {
            truth[key] += 1;
            interval_packets += 1;
            increments += a.stream.depth as u64;
            if writing.is_some() {
                outcome.made_while_writing += 1;
            }
            if way == Way::Defer && stage.holds_parts() {
                deferred.push(key);
            } else {
                sketch.add(&(key as u64), 1);
            }
        });
        let completed = (link.step(now, &mut engine, &mut stage, &mut Counters(&mut sketch)))
            .map_err(|e| format!("decoding our own: {e}"))?;
        if let Some(done) = completed {
            outcome.parts_sent += done.transmissions;
        }
        let before = total(&sketch);
        if let Some(c) = stage.commit(&mut Counters(&mut sketch)) {
            let Some((issued_ns, total_at_issue)) = writing.take() else {
                return Err("a commit with no reset on its way".into());
            };
            outcome.commit_ns += now - issued_ns;
            // What the commit took away, of which what came after the issue.
            let took = match way {
                Way::Keep => c.replaced,
                Way::Subtract => before - total(&sketch),
                _ => before,
            };
            erased += took;
            outcome.lost += took.saturating_sub(total_at_issue) / a.stream.depth as u64;
            if matches!(way, Way::Set | Way::Defer) && total(&sketch) != 0 {
                return Err(format!("{}: a commit left counters not 0", way.name()));
            }
            outcome.reordered += deferred.len() as u64;
            for key in deferred.drain(..) {
                sketch.add(&(key as u64), 1);
            }
        }
        now += STEP_NS;
    }
    if increments != total(&sketch) + erased + deferred.len() as u64 * a.stream.depth as u64 {
        return Err(format!(
            "{}: {increments} increments, but {} in the counters and {erased} erased",
            way.name(),
            total(&sketch)
        ));
    }
    Ok(outcome)
}

pub fn main_reorder(a: BenchSyncReorderArgs) -> BenchResult<()> {
    if let Some(l) = a.losses.iter().find(|l| !(**l >= 0.0 && **l < 1.0)) {
        return Err(format!(
            "--losses: {l} is not a chance between 0 and 1 (1 excluded)"
        ));
    }
    a.stream.check()?;
    // A channel of 0 bytes a second would be one with no limit at all.
    if a.interval_ms == 0 || a.capacity == 0 {
        return Err("--interval-ms and --capacity must be above 0".into());
    }
    if !(a.seconds > 0.0 && a.seconds <= 60.0) {
        return Err(format!(
            "--seconds: {} is not above 0 and at most 60",
            a.seconds
        ));
    }
    let most = stateplane_sync::wire::MAX_RUN_ENTRIES;
    if !(1..=most).contains(&a.values_per_part) {
        return Err(format!(
            "--values-per-part: {} is not from 1 to {most} (what a part's count field holds)",
            a.values_per_part
        ));
    }
    let mut table = Table::new(
        &["loss each way", "updates", "reset cut"],
        &[
            "parts sent",
            "made while writing",
            "lost",
            "reordered",
            "reset ms",
            "false neg",
            "false pos",
            "mean rel error",
        ],
    );
    let mut csv = Csv::new(
        "loss,way,cut,intervals,made_while_writing,lost,reordered,mean_reset_ms,parts_sent,true_hitters,false_negatives,false_positives,mean_relative_error",
    );
    let mut outcomes = Vec::new();
    for &loss in &a.losses {
        for (way, cut) in Way::all(a.values_per_part) {
            let cut_name = cut_name(way, cut);
            eprintln!("loss {loss}: {}, reset cut {cut_name}", way.name());
            let o = run(&a, way, cut, loss)?;
            let writes = o.intervals.max(1);
            let reset_ms = o.commit_ns as f64 / writes as f64 / 1e6;
            table.row(vec![
                format!("{:.0}%", loss * 100.0),
                way.name().into(),
                cut_name.clone(),
                format!("{:.1}", o.parts_sent as f64 / writes as f64),
                o.made_while_writing.to_string(),
                o.lost.to_string(),
                o.reordered.to_string(),
                format!("{reset_ms:.3}"),
                o.hitters.false_negatives.to_string(),
                o.hitters.false_positives.to_string(),
                format!("{:.4}", o.hitters.mean_relative_error()),
            ]);
            csv.row(format_args!(
                "{loss},{},{cut_name},{},{},{},{},{reset_ms:.4},{},{},{},{},{:.6}",
                way.name(),
                o.intervals,
                o.made_while_writing,
                o.lost,
                o.reordered,
                o.parts_sent,
                o.hitters.true_hitters,
                o.hitters.false_negatives,
                o.hitters.false_positives,
                o.hitters.mean_relative_error()
            ));
            outcomes.push((loss, way, cut_name, o));
        }
    }
    println!(
        "input: {}, reset every {} ms by a write of all its counters (to 0, or less their \
         values at the issue with subtract), cut as the write engine cuts it (its zeros a \
         run) or into parts of {} values, over a channel of {} bytes/s and {} us each \
         way, losing the share given each way; heavy hitters: {} of an interval's packets, \
         read from the data plane's sketch before each reset, against the exact counts since \
         the last reset was issued; {} virtual seconds; checked: every increment is in the \
         counters or was erased by a commit, and a set or defer commit leaves every counter 0",
        a.stream.describe(a.seed),
        a.interval_ms,
        a.values_per_part,
        a.capacity,
        a.latency_us,
        a.stream.share,
        a.seconds
    );
    table.print();
    if let Some(path) = &a.files.csv {
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let panel = |title: &str, f: &dyn Fn(&Outcome) -> f64| Panel {
            title: title.into(),
            unit: String::new(),
            bars: (outcomes.iter())
                .map(|(loss, way, cut, o)| {
                    let label = format!("{} ({cut}) {:.0}%", way.name(), loss * 100.0);
                    (label, f(o))
                })
                .collect(),
        };
        a.files.write_chart(
            "Sync: updates made while a reset is on its way",
            &format!(
                "{} packets/s, a reset every {} ms, heavy hitters at {} of an interval",
                a.stream.rate, a.interval_ms, a.stream.share
            ),
            &[
                panel("updates lost", &|o| o.lost as f64),
                panel("updates reordered", &|o| o.reordered as f64),
                panel("heavy hitters missed", &|o| {
                    o.hitters.false_negatives as f64
                }),
            ],
        )?;
    }
    Ok(())
}
