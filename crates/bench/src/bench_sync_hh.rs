//! `stateplane bench-sync-hh`: heavy hitters found from a collector's copy of a count-min
//! sketch (ApproSync's sketch collector, its Lemma 1 and Exp#8), in virtual time on the
//! sync cores: a Zipf stream of flows counted in a sketch on the data plane, its changes
//! synced through a channel far narrower than they are, and the heavy hitters found from
//! the copy with the rate controller's threshold (`sync`), from a copy kept by mirroring
//! every change (`mirror`, no threshold, no refresh), and from the data plane's own sketch
//! (`ideal`), each against the exact counts. From the copy two ways: its estimates, and
//! its estimates plus their bounds (every key that may be a heavy hitter, which misses
//! none that the data plane's sketch would have found as of the copy's instant).
//!
//! Lemma 1, checked at every sample: a key's estimate from the copy is within the largest
//! bound of its counters of the data plane's estimate as of the copy's instant (the
//! smallest of several values moves no more than the most any of them moves). The run
//! fails if it is not.

use crate::BenchResult;
use crate::bench_sync::VirtualLink;
use crate::chart::Panel;
use crate::results::{Csv, ResultFiles, Table};
use stateplane_gen::rng::{Rng, Zipf};
use stateplane_state::CountMin;
use stateplane_sync::Location;
use stateplane_sync::mirror::Mirror;
use stateplane_sync::rate::RateController;
use stateplane_sync::sender::{Sender, SenderConfig, SyncedState, Threshold};
use stateplane_sync::wire::ENTRY_LEN;

/// A Zipf stream of flows counted in a count-min sketch, and what makes a heavy hitter:
/// the workload of the sketch experiments (`bench-sync-hh`, `bench-sync-reorder`).
#[derive(clap::Args)]
pub struct SketchStream {
    /// Flows, with Zipf-distributed popularity.
    #[arg(long, default_value_t = 100_000)]
    pub flows: usize,
    /// The Zipf exponent.
    #[arg(long, default_value_t = 1.1)]
    pub zipf: f64,
    /// Packets a second (each changes one counter a row).
    #[arg(long, default_value_t = 1_000_000)]
    pub rate: u64,
    /// Counters in each row of the count-min sketch.
    #[arg(long, default_value_t = 4096)]
    pub width: usize,
    /// Rows of the count-min sketch.
    #[arg(long, default_value_t = 4)]
    pub depth: usize,
    /// A heavy hitter has at least this share of the packets (so far, or of an interval).
    #[arg(long, default_value_t = 0.001)]
    pub share: f64,
}

impl SketchStream {
    /// Refuses a stream that cannot run, naming the flag.
    pub(crate) fn check(&self) -> BenchResult<()> {
        if self.flows == 0 || self.rate == 0 || self.width == 0 || self.depth == 0 {
            return Err("--flows, --rate, --width and --depth must be above 0".into());
        }
        if !(self.share > 0.0 && self.share < 1.0) {
            return Err(format!(
                "--share: {} is not above 0 and below 1",
                self.share
            ));
        }
        Ok(())
    }

    /// The stream, for a run's input line.
    pub(crate) fn describe(&self, seed: u64) -> String {
        format!(
            "{} flows, Zipf {}, {} packets a second into a count-min sketch of {} x {} (seed \
             {seed})",
            self.flows, self.zipf, self.rate, self.depth, self.width
        )
    }
}

/// The stream's packets as they arrive, a virtual step at a time.
pub(crate) struct Arrivals {
    zipf: Zipf,
    per_step: f64,
    owed: f64,
}

impl Arrivals {
    pub(crate) fn new(s: &SketchStream, step_ns: u64) -> Arrivals {
        Arrivals {
            zipf: Zipf::new(s.flows, s.zipf),
            per_step: s.rate as f64 * step_ns as f64 / 1e9,
            owed: 0.0,
        }
    }

    /// Calls `each` with the flow of every packet that arrives in the next step.
    pub(crate) fn step(&mut self, rng: &mut Rng, mut each: impl FnMut(usize)) {
        self.owed += self.per_step;
        while self.owed >= 1.0 {
            self.owed -= 1.0;
            each(self.zipf.sample(rng));
        }
    }
}

#[derive(clap::Args)]
pub struct BenchSyncHhArgs {
    #[command(flatten)]
    pub stream: SketchStream,
    /// The channel's capacity, bytes a second.
    #[arg(long, default_value_t = 1_000_000)]
    pub capacity: u64,
    /// Virtual seconds per run.
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Seed of the traces and random draws: the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub files: ResultFiles,
}

/// Virtual time between packets' arrivals looked at, between passes, between samples.
const STEP_NS: u64 = 10_000;
const PASS_NS: u64 = 1_000_000;
const SAMPLE_NS: u64 = 100_000_000;

/// Heavy-hitter accuracy over every sample of a run.
#[derive(Default)]
pub(crate) struct Accuracy {
    pub(crate) true_hitters: u64,
    pub(crate) false_positives: u64,
    pub(crate) false_negatives: u64,
    relative_error_sum: f64,
}

impl Accuracy {
    /// One sample: the keys' exact counts and estimates, the total so far.
    pub(crate) fn add(
        &mut self,
        truth: &[u64],
        estimate: impl Fn(usize) -> u64,
        total: u64,
        share: f64,
    ) {
        let floor = (share * total as f64).ceil() as u64;
        for (key, &count) in truth.iter().enumerate() {
            if count == 0 {
                continue;
            }
            let est = estimate(key);
            match (count >= floor, est >= floor) {
                (true, true) => {}
                (true, false) => self.false_negatives += 1,
                (false, true) => self.false_positives += 1,
                (false, false) => continue,
            }
            if count >= floor {
                self.true_hitters += 1;
                self.relative_error_sum += est.abs_diff(count) as f64 / count as f64;
            }
        }
    }

    pub(crate) fn mean_relative_error(&self) -> f64 {
        self.relative_error_sum / self.true_hitters.max(1) as f64
    }
}

struct Outcome {
    sync: Accuracy,
    /// Keys counted by the copy's estimate plus its bound: what may be a heavy hitter.
    sync_upper: Accuracy,
    ideal: Accuracy,
    updates: u64,
    updates_lost: u64,
    /// Keys whose counters were all bounded, the largest such bound, and the largest gap
    /// between the copy's estimate and the data plane's as of the copy's instant.
    bounded: u64,
    unbounded: u64,
    max_bound: u64,
    max_gap: u64,
}

fn run(a: &BenchSyncHhArgs, mirror_mode: bool) -> BenchResult<Outcome> {
    let cells = (a.stream.depth * a.stream.width.next_power_of_two()) as u32;
    let updates_per_second = RateController::capacity_of(a.capacity, ENTRY_LEN as u64);
    let mut sender = Sender::new(SenderConfig {
        switch: 1,
        epoch: 1,
        stream: 0,
        slots: 1 << 16,
        threshold: if mirror_mode {
            Threshold::Fixed(0)
        } else {
            Threshold::Adaptive(RateController::new(updates_per_second))
        },
        max_age_ns: 10_000_000,
        heartbeat_ns: 10_000_000,
        batch_ns: 1_000_000,
        refresh_ns: if mirror_mode { 0 } else { 1_000_000_000 },
        states: vec![SyncedState::register(0, cells)],
    });
    let mut link: VirtualLink<Vec<u32>> = VirtualLink::new(a.capacity, a.seed);
    let mut sketch = CountMin::new(a.stream.depth, a.stream.width, a.seed);
    sketch.counters_mut().track(0, 0);
    let mut rng = Rng::new(a.seed);
    let mut arrivals = Arrivals::new(&a.stream, STEP_NS);
    let mut truth = vec![0u64; a.stream.flows];
    let mut total = 0u64;
    let (mut changes, mut out) = (Vec::new(), Vec::new());
    let mut outcome = Outcome {
        sync: Accuracy::default(),
        sync_upper: Accuracy::default(),
        ideal: Accuracy::default(),
        updates: 0,
        updates_lost: 0,
        bounded: 0,
        unbounded: 0,
        max_bound: 0,
        max_gap: 0,
    };
    let end_ns = (a.seconds * 1e9) as u64;
    let mut now = 0;
    while now <= end_ns {
        arrivals.step(&mut rng, |key| {
            sketch.add(&(key as u64), 1);
            truth[key] += 1;
            total += 1;
        });
        if now % PASS_NS == 0 {
            sketch.counters_mut().take_changes(&mut changes);
            sender.expect_change(now, changes.iter().map(|c| c.new - c.old).sum());
            for c in changes.drain(..) {
                let at = Location {
                    state: c.state,
                    index: c.index,
                };
                sender.change(now, at, c.old, c.new);
            }
            let counters = sketch.counters().as_slice();
            sender.poll(now, |l| u64::from(counters[l.index as usize]), &mut out);
            link.send(now, &mut out, || counters.to_vec());
        }
        link.deliver(now)?;
        if now > 0
            && now % SAMPLE_NS == 0
            && let Some((then, mirror)) = link.as_of_copy()?
        {
            sample(&mut outcome, mirror, then, &sketch, &truth, total, a)?;
        }
        now += STEP_NS;
    }
    outcome.updates = link.updates;
    outcome.updates_lost = link.updates_lost;
    Ok(outcome)
}

/// Checks Lemma 1 for every key and adds the sample's accuracy; `then` is the data
/// plane's counters as of the copy's instant.
fn sample(
    outcome: &mut Outcome,
    mirror: &Mirror,
    then: &[u32],
    sketch: &CountMin,
    truth: &[u64],
    total: u64,
    a: &BenchSyncHhArgs,
) -> BenchResult<()> {
    let cells = sketch.counters().len() as u32;
    let copy = mirror
        .read_range(1, 0, 0, 0, cells)
        .ok_or("the collector has no copy")?;
    let mut from_copy = vec![0u64; truth.len()];
    let mut upper = vec![0u64; truth.len()];
    for (key, &count) in truth.iter().enumerate() {
        if count == 0 {
            continue;
        }
        let at = sketch.cells_of(&(key as u64));
        let estimate = at.iter().map(|&c| copy[c].value).min().unwrap_or(0);
        let ideal_then = at.iter().map(|&c| u64::from(then[c])).min().unwrap_or(0);
        from_copy[key] = estimate;
        let bounds: Option<Vec<u64>> = at.iter().map(|&c| copy[c].bound).collect();
        let bound = bounds.and_then(|b| b.into_iter().max());
        upper[key] = bound.map_or(u64::MAX, |b| estimate.saturating_add(b));
        match bound {
            Some(bound) => {
                let gap = estimate.abs_diff(ideal_then);
                if gap > bound {
                    return Err(format!(
                        "key {key}: the copy estimates {estimate}, the data plane {ideal_then} \
                         as of the copy, and the copy's bound is {bound}: Lemma 1 broken"
                    ));
                }
                outcome.bounded += 1;
                outcome.max_bound = outcome.max_bound.max(bound);
                outcome.max_gap = outcome.max_gap.max(gap);
            }
            None => outcome.unbounded += 1,
        }
    }
    outcome
        .sync
        .add(truth, |k| from_copy[k], total, a.stream.share);
    outcome
        .sync_upper
        .add(truth, |k| upper[k], total, a.stream.share);
    let ideal = |k: usize| u64::from(sketch.estimate(&(k as u64)));
    outcome.ideal.add(truth, ideal, total, a.stream.share);
    Ok(())
}

pub fn main_hh(a: BenchSyncHhArgs) -> BenchResult<()> {
    a.stream.check()?;
    if a.capacity == 0 {
        return Err("--capacity must be above 0".into());
    }
    let seconds_ok = a.seconds > 0.0 && a.seconds <= 60.0;
    if !seconds_ok {
        return Err(format!(
            "--seconds: {} is not above 0 and at most 60",
            a.seconds
        ));
    }
    eprintln!("sync, t adaptive");
    let sync = run(&a, false)?;
    eprintln!("mirror, every change");
    let mirror = run(&a, true)?;
    println!(
        "input: {}; a channel of {} bytes a second; {} virtual seconds, sampled every 100 ms; \
         a heavy hitter has {} of the packets so far; checked: Lemma 1 at every sample for \
         every key",
        a.stream.describe(a.seed),
        a.capacity,
        a.seconds,
        a.stream.share
    );
    let mut table = Table::new(
        &["heavy hitters from"],
        &[
            "true",
            "false pos",
            "false neg",
            "mean rel error",
            "updates lost",
            "keys unbounded",
        ],
    );
    let mut csv = Csv::new(
        "from,true_hitters,false_positives,false_negatives,mean_relative_error,updates,updates_lost,keys_bounded,keys_unbounded,max_bound,max_gap",
    );
    let rows = [
        ("the data plane's sketch (ideal)", &sync.ideal, None),
        ("sync, t adaptive", &sync.sync, Some(&sync)),
        (
            "sync, t adaptive, estimate + bound",
            &sync.sync_upper,
            Some(&sync),
        ),
        ("mirror, every change", &mirror.sync, Some(&mirror)),
    ];
    for (name, acc, run) in rows {
        let (updates, lost, bounded, unbounded, max_bound, max_gap) =
            run.map_or((0, 0, 0, 0, 0, 0), |r| {
                (
                    r.updates,
                    r.updates_lost,
                    r.bounded,
                    r.unbounded,
                    r.max_bound,
                    r.max_gap,
                )
            });
        let share = |n: u64, of: u64| format!("{:.1}%", 100.0 * n as f64 / of.max(1) as f64);
        table.row(vec![
            name.into(),
            acc.true_hitters.to_string(),
            acc.false_positives.to_string(),
            acc.false_negatives.to_string(),
            format!("{:.4}", acc.mean_relative_error()),
            run.map_or("-".into(), |_| share(lost, updates)),
            run.map_or("-".into(), |_| share(unbounded, bounded + unbounded)),
        ]);
        csv.row(format_args!(
            "\"{name}\",{},{},{},{:.6},{updates},{lost},{bounded},{unbounded},{max_bound},{max_gap}",
            acc.true_hitters,
            acc.false_positives,
            acc.false_negatives,
            acc.mean_relative_error()
        ));
    }
    table.print();
    println!(
        "sync: the copy's estimates were within {} (their largest bound) of the data plane's \
         as of the copy; the largest gap seen was {}",
        sync.max_bound, sync.max_gap
    );
    if let Some(path) = &a.files.csv {
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let panel = |title: &str, f: &dyn Fn(&Accuracy) -> f64| Panel {
            title: title.into(),
            unit: String::new(),
            bars: vec![
                ("ideal".into(), f(&sync.ideal)),
                ("sync".into(), f(&sync.sync)),
                ("sync + bound".into(), f(&sync.sync_upper)),
                ("mirror".into(), f(&mirror.sync)),
            ],
        };
        a.files.write_chart(
            "Sync: heavy hitters from the collector's copy of a sketch",
            &format!(
                "{} packets/s, a channel of {} bytes/s, every 100 ms for {} s",
                a.stream.rate, a.capacity, a.seconds
            ),
            &[
                panel("false negatives", &|x| x.false_negatives as f64),
                panel("false positives", &|x| x.false_positives as f64),
                panel("mean relative error", &|x| x.mean_relative_error()),
            ],
        )?;
    }
    Ok(())
}
