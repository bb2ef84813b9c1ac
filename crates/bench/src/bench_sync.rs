//! State sync's experiments on the sync cores in virtual time, `bench-sync-rate` and
//! `bench-sync-write`, and what tracking synced state costs, `bench-sync-track` (below).
//!
//! `stateplane bench-sync-rate`: the paper's rate experiment (ApproSync Exp#3) on the sync
//! cores in virtual time. Counters change far faster than the channel carries one update
//! per change; each threshold mode is run on the same changes through a channel of the
//! given capacity and buffer, which drops what does not fit. The table shows the updates
//! sent and lost, the threshold, and how far the collector's copy is from the data plane.
//!
//! Every 10 ms of virtual time the run checks that every location the collector calls
//! bounded is within its bound of the data plane's value as of the collector's last
//! message, and it fails if one is not: the figures are of a run that kept its promise.

use crate::BenchResult;
use crate::chart::Panel;
use crate::results::{Csv, ResultFiles, Table};
use stateplane_gen::rng::{Rng, Zipf};
use stateplane_sync::Location;
use stateplane_sync::channel::{Channel, ChannelConfig, Fate, Faults, WriteLink};
use stateplane_sync::mirror::Mirror;
use stateplane_sync::rate::RateController;
use stateplane_sync::sender::{Sender, SenderConfig, SyncedState, Threshold};
use stateplane_sync::wire::{ENTRY_LEN, HEADER_LEN, Kind, MAC_LEN, MAX_ENTRIES, Message};
use stateplane_sync::write::{
    MAX_VALUES, Mode as WriteMode, WriteEngine, WriteStage, WriteTarget, Written,
};
use std::collections::BTreeMap;

#[derive(clap::Args)]
pub struct BenchSyncRateArgs {
    /// Counters, changed with Zipf-distributed popularity (s = 1).
    #[arg(long, default_value_t = 4096)]
    pub locations: u32,
    /// The channel's capacity, bytes a second.
    #[arg(long, default_value_t = 1_000_000)]
    pub capacity: u64,
    /// Changes a second, as multiples of the channel's updates a second.
    #[arg(long, value_delimiter = ',', default_value = "0.5,2,10")]
    pub loads: Vec<f64>,
    /// Virtual seconds of changes per run.
    #[arg(long, default_value_t = 1.0)]
    pub seconds: f64,
    /// Seed of the traces and random draws: the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub files: ResultFiles,
}

/// How a run sets its threshold.
#[derive(Clone, Copy)]
enum Mode {
    Fixed(u64),
    /// The rate controller, told a capacity `over` times the channel's, with the
    /// collector's reports or not.
    Adaptive {
        over: u64,
        reports: bool,
    },
}

impl Mode {
    fn name(self) -> String {
        match self {
            Mode::Fixed(0) => "mirror (t = 0)".into(),
            Mode::Fixed(t) => format!("fixed t = {t}"),
            Mode::Adaptive {
                over: 1,
                reports: false,
            } => "adaptive".into(),
            Mode::Adaptive {
                over: 1,
                reports: true,
            } => "adaptive, reports".into(),
            Mode::Adaptive {
                over,
                reports: false,
            } => format!("adaptive, M {over}x too high"),
            Mode::Adaptive {
                over,
                reports: true,
            } => {
                format!("adaptive, M {over}x too high, reports")
            }
        }
    }
}

const MODES: [Mode; 9] = [
    Mode::Fixed(0),
    Mode::Fixed(2),
    Mode::Fixed(8),
    Mode::Fixed(32),
    Mode::Fixed(128),
    Mode::Adaptive {
        over: 1,
        reports: false,
    },
    Mode::Adaptive {
        over: 1,
        reports: true,
    },
    Mode::Adaptive {
        over: 4,
        reports: false,
    },
    Mode::Adaptive {
        over: 4,
        reports: true,
    },
];

struct Row {
    load: f64,
    mode: String,
    changes: u64,
    updates: u64,
    updates_lost: u64,
    messages: u64,
    messages_dropped: u64,
    mean_threshold: f64,
    /// Mean over the samples of the mean |collector - data plane| over the locations.
    mean_error: f64,
    max_error: u64,
    /// Share of the sampled readings with no bound (after a loss).
    unbounded: f64,
}

const STEP_NS: u64 = 10_000;
const SAMPLE_NS: u64 = 10_000_000;

/// A sender's messages on their way to a collector's mirror through a channel, in virtual
/// time (64 KiB of buffer, 50 µs of latency, no faults), with the data plane as it was when
/// each message that got onto the channel was sent: what the collector's bounds are checked
/// against.
pub(crate) struct VirtualLink<S> {
    pub channel: Channel,
    pub mirror: Mirror,
    snapshots: BTreeMap<u64, S>,
    arrived: Vec<Vec<u8>>,
    pub messages: u64,
    pub updates: u64,
    pub updates_lost: u64,
}

impl<S> VirtualLink<S> {
    /// A channel of `bytes_per_second` to a mirror of switch 1.
    pub fn new(bytes_per_second: u64, seed: u64) -> Self {
        VirtualLink {
            channel: Channel::new(ChannelConfig {
                bytes_per_second,
                buffer_bytes: 64 << 10,
                latency_ns: 50_000,
                faults: Faults::default(),
                seed,
            }),
            mirror: Mirror::new(Some(vec![1])),
            snapshots: BTreeMap::new(),
            arrived: Vec::new(),
            messages: 0,
            updates: 0,
            updates_lost: 0,
        }
    }

    /// Puts `out`'s messages on the channel at `now`, taking `snapshot` of the data plane
    /// for each that got on.
    pub fn send(&mut self, now: u64, out: &mut Vec<Message>, snapshot: impl Fn() -> S) {
        for m in out.drain(..) {
            // A layout's entries describe the states: no updates.
            let entries = match m.kind {
                Kind::Layout => 0,
                _ => m.entries.len() as u64,
            };
            let seq = m.seq;
            let mut bytes = Vec::new();
            m.encode(&mut bytes);
            self.messages += 1;
            self.updates += entries;
            match self.channel.send(now, bytes) {
                Fate::Sent { .. } => {
                    self.snapshots.insert(seq, snapshot());
                }
                Fate::Dropped | Fate::Lost => self.updates_lost += entries,
            }
        }
    }

    /// Applies to the mirror what has arrived by `now`.
    pub fn deliver(&mut self, now: u64) -> BenchResult<()> {
        self.channel.deliver(now, &mut self.arrived);
        for bytes in self.arrived.drain(..) {
            let m = Message::decode(&bytes).map_err(|e| format!("decoding our own: {e}"))?;
            let _ = self.mirror.apply(&m);
        }
        Ok(())
    }

    /// The data plane as it was when the last message the mirror applied of switch 1's
    /// stream 0 was sent (older snapshots are forgotten), and the mirror; `None` before any.
    pub fn as_of_copy(&mut self) -> BenchResult<Option<(&S, &Mirror)>> {
        let Some(k) = self.mirror.last_seq(1, 0) else {
            return Ok(None);
        };
        self.snapshots.retain(|&seq, _| seq >= k);
        let then = self
            .snapshots
            .get(&k)
            .ok_or("no snapshot of the last message")?;
        Ok(Some((then, &self.mirror)))
    }
}

fn run(a: &BenchSyncRateArgs, load: f64, mode: Mode, updates_per_second: u64) -> BenchResult<Row> {
    let threshold = match mode {
        Mode::Fixed(t) => Threshold::Fixed(t),
        Mode::Adaptive { over, .. } => {
            Threshold::Adaptive(RateController::new(updates_per_second * over))
        }
    };
    let mut sender = Sender::new(SenderConfig {
        switch: 1,
        epoch: 1,
        stream: 0,
        slots: 1 << 16,
        threshold,
        max_age_ns: 1_000_000_000,
        heartbeat_ns: 10_000_000,
        batch_ns: 1_000_000,
        refresh_ns: 0,
        states: vec![SyncedState::register(0, a.locations)],
    });
    let mut link: VirtualLink<Vec<u64>> = VirtualLink::new(a.capacity, a.seed);
    let mut rng = Rng::new(a.seed);
    let zipf = Zipf::new(a.locations as usize, 1.0);
    let mut plane = vec![0u64; a.locations as usize];
    let end_ns = (a.seconds * 1e9) as u64;
    let per_step = load * updates_per_second as f64 * STEP_NS as f64 / 1e9;
    let (mut owed, mut changes) = (0.0, 0u64);
    let (mut threshold_sum, mut windows) = (0u128, 0u64);
    let (mut error_sum, mut max_error, mut samples) = (0.0, 0u64, 0u64);
    let (mut readings, mut unbounded) = (0u64, 0u64);
    let mut out = Vec::new();
    let mut now = 0;
    while now <= end_ns {
        owed += per_step;
        while owed >= 1.0 {
            owed -= 1.0;
            let i = zipf.sample(&mut rng);
            let location = Location {
                state: 0,
                index: i as u32,
            };
            sender.change(now, location, plane[i], plane[i] + 1);
            plane[i] += 1;
            changes += 1;
        }
        sender.poll(now, |l| plane[l.index as usize], &mut out);
        if now % 1_000_000 == 0 {
            threshold_sum += u128::from(sender.threshold());
            windows += 1;
        }
        link.send(now, &mut out, || plane.clone());
        link.deliver(now)?;
        if now % SAMPLE_NS == 0 {
            if matches!(mode, Mode::Adaptive { reports: true, .. })
                && let Some(report) = link.mirror.report(1, 0, now)
            {
                sender.on_report(now, &report);
            }
            if let Some((truth, mirror)) = link.as_of_copy()? {
                let k = mirror.last_seq(1, 0).unwrap_or(0);
                let mut sum = 0u64;
                for (i, &value) in truth.iter().enumerate() {
                    let l = Location {
                        state: 0,
                        index: i as u32,
                    };
                    let r = mirror.read(1, 0, l).ok_or("a stream with no reading")?;
                    let error = value.abs_diff(r.value);
                    readings += 1;
                    match r.bound {
                        Some(b) if error > b => {
                            return Err(format!(
                                "{}, load {load}: location {i} is {value} as of message {k} and \
                                 the collector holds {} within {b}: a broken bound",
                                mode.name(),
                                r.value
                            ));
                        }
                        Some(_) => {}
                        None => unbounded += 1,
                    }
                    sum += error;
                    max_error = max_error.max(error);
                }
                error_sum += sum as f64 / truth.len().max(1) as f64;
                samples += 1;
            }
        }
        now += STEP_NS;
    }
    Ok(Row {
        load,
        mode: mode.name(),
        changes,
        updates: link.updates,
        updates_lost: link.updates_lost,
        messages: link.messages,
        messages_dropped: link.channel.counters.dropped_full,
        mean_threshold: threshold_sum as f64 / windows.max(1) as f64,
        mean_error: error_sum / samples.max(1) as f64,
        max_error,
        unbounded: unbounded as f64 / readings.max(1) as f64,
    })
}

pub fn main(a: BenchSyncRateArgs) -> BenchResult<()> {
    if a.locations == 0 {
        return Err("--locations must be above 0".into());
    }
    if a.capacity < 10_000 {
        return Err("--capacity: at least 10000 bytes a second (a few messages a second)".into());
    }
    if !(a.seconds > 0.0 && a.seconds <= 100.0) {
        return Err("--seconds: between 0 and 100 virtual seconds".into());
    }
    if let Some(l) = a.loads.iter().find(|l| !(**l > 0.0 && **l <= 1000.0)) {
        return Err(format!("--loads: {l} is not a multiple between 0 and 1000"));
    }
    // An update's share of a full message: its entry and its part of the header and MAC.
    let update_bytes = (ENTRY_LEN + (HEADER_LEN + MAC_LEN).div_ceil(MAX_ENTRIES)) as u64;
    let updates_per_second = a.capacity / update_bytes;
    let mut rows = Vec::new();
    for &load in &a.loads {
        for mode in &MODES {
            eprintln!("load {load}x: {}", mode.name());
            rows.push(run(&a, load, *mode, updates_per_second)?);
        }
    }
    println!(
        "input: {} counters changed +1 at a time, Zipf (s = 1), for {} virtual s; a channel of {} \
         bytes/s ({updates_per_second} updates/s at {update_bytes} bytes each), 64 KiB of \
         buffer, 50 us latency, no other loss; read handler of 65,536 slots, window 1 ms, \
         timeout 1 s, updates wait up to 1 ms to fill a message, no refresh; reports every 10 ms where used; seed {}",
        a.locations, a.seconds, a.capacity, a.seed
    );
    let mut table = Table::new(
        &["load", "threshold"],
        &[
            "changes/s",
            "updates/s",
            "of capacity",
            "updates lost",
            "mean t",
            "mean error",
            "max error",
            "unbounded",
        ],
    );
    let mut csv = Csv::new(
        "load,mode,changes,updates,updates_lost,messages,messages_dropped,mean_threshold,mean_error,max_error,unbounded_share",
    );
    for r in &rows {
        table.row(vec![
            format!("{}x", r.load),
            r.mode.clone(),
            format!("{:.0}", r.changes as f64 / a.seconds),
            format!("{:.0}", r.updates as f64 / a.seconds),
            format!(
                "{:.2}",
                r.updates as f64 / a.seconds / updates_per_second as f64
            ),
            format!(
                "{} ({:.1}%)",
                r.updates_lost,
                100.0 * r.updates_lost as f64 / r.updates.max(1) as f64
            ),
            format!("{:.1}", r.mean_threshold),
            format!("{:.2}", r.mean_error),
            r.max_error.to_string(),
            format!("{:.1}%", 100.0 * r.unbounded),
        ]);
        csv.row(format_args!(
            "{},\"{}\",{},{},{},{},{},{:.3},{:.4},{},{:.5}",
            r.load,
            r.mode,
            r.changes,
            r.updates,
            r.updates_lost,
            r.messages,
            r.messages_dropped,
            r.mean_threshold,
            r.mean_error,
            r.max_error,
            r.unbounded
        ));
    }
    table.print();
    if let Some(path) = &a.files.csv {
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let panel = |title: &str, unit: &str, f: &dyn Fn(&Row) -> f64| Panel {
            title: title.into(),
            unit: unit.into(),
            bars: (rows.iter())
                .map(|r| (format!("{}x, {}", r.load, r.mode), f(r)))
                .collect(),
        };
        a.files.write_chart(
            "Sync: updates lost and divergence by threshold mode",
            &format!(
                "{} counters, channel {} bytes/s, loads as multiples of its updates/s",
                a.locations, a.capacity
            ),
            &[
                panel("updates lost", "%", &|r| {
                    100.0 * r.updates_lost as f64 / r.updates.max(1) as f64
                }),
                panel("mean |collector - data plane|", "per counter", &|r| {
                    r.mean_error
                }),
            ],
        )?;
    }
    Ok(())
}

/// `stateplane bench-sync-write`: the paper's write experiment (ApproSync Exp#4) on the
/// write engine and stage in virtual time: how long a write of 2^8 to 2^16 values takes
/// until the engine has it acknowledged whole, through a channel that loses 0 to 80% of
/// the messages each way, and how many parts it sent. Every write is checked committed
/// whole on the switch's side.
#[derive(clap::Args)]
pub struct BenchSyncWriteArgs {
    /// Values per write (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "256,1024,4096,16384,65536"
    )]
    pub sizes: Vec<usize>,
    /// Chances of loss, each way (comma-separated, below 1).
    #[arg(long, value_delimiter = ',', default_value = "0,0.2,0.4,0.6,0.8")]
    pub losses: Vec<f64>,
    /// The channel's capacity each way, bytes a second (10 Gb/s by default).
    #[arg(long, default_value_t = 1_250_000_000)]
    pub capacity: u64,
    /// Writes per cell (the median is shown).
    #[arg(long, default_value_t = 9)]
    pub writes: usize,
    /// Seed of the traces and random draws: the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub files: ResultFiles,
}

struct WriteRow {
    size: usize,
    loss: f64,
    median_ns: u64,
    max_ns: u64,
    /// Parts sent per part of a write.
    sent_per_part: f64,
}

/// The switch's side of the write experiment: a register of the written locations.
struct Registers(Vec<u64>);

impl WriteTarget for Registers {
    fn read(&self, l: Location) -> u64 {
        self.0.get(l.index as usize).copied().unwrap_or(0)
    }
    fn write(&mut self, l: Location, v: u64) {
        if let Some(cell) = self.0.get_mut(l.index as usize) {
            *cell = v;
        }
    }
}

/// One write of `size` values through channels losing `loss` each way: its latency and
/// the parts sent.
fn one_write(
    a: &BenchSyncWriteArgs,
    size: usize,
    loss: f64,
    seed: u64,
) -> BenchResult<(u64, u64, u32)> {
    let channel = |seed| {
        Channel::new(ChannelConfig {
            bytes_per_second: a.capacity,
            buffer_bytes: 16 << 20,
            latency_ns: 5_000,
            faults: Faults {
                loss,
                ..Faults::default()
            },
            seed,
        })
    };
    let mut link = WriteLink::new(channel(seed), channel(seed ^ 0x5555));
    let mut engine = WriteEngine::new(1, 1, 0, 200_000);
    let mut stage = WriteStage::default();
    let mut registers = Registers(vec![0; size]);
    let values: Vec<Written> = (0..size as u32)
        .map(|index| Written {
            location: Location { state: 0, index },
            value: u64::from(index) + 1,
            mode: WriteMode::Set,
        })
        .collect();
    engine.submit(values)?;
    let mut now = 0u64;
    loop {
        if now > 10_000_000_000 {
            return Err(format!(
                "a write of {size} at {loss} loss still not through after 10 s"
            ));
        }
        let completed = (link.step(now, &mut engine, &mut stage, &mut registers))
            .map_err(|e| format!("decoding our own: {e}"))?;
        stage.commit(&mut registers);
        if let Some(done) = completed {
            let whole = (registers.0.iter().enumerate()).all(|(i, &v)| v == i as u64 + 1);
            if !whole {
                return Err(format!(
                    "a write of {size} acknowledged and not committed whole"
                ));
            }
            return Ok((done.latency_ns, done.transmissions, done.parts));
        }
        now += 2_000;
    }
}

pub fn main_write(a: BenchSyncWriteArgs) -> BenchResult<()> {
    if let Some(s) = a.sizes.iter().find(|s| **s == 0 || **s > MAX_VALUES) {
        return Err(format!("--sizes: {s} is not between 1 and {MAX_VALUES}"));
    }
    if let Some(l) = a.losses.iter().find(|l| !(**l >= 0.0 && **l < 1.0)) {
        return Err(format!(
            "--losses: {l} is not a chance between 0 and 1 (1 excluded)"
        ));
    }
    if a.capacity < 1_000_000 || a.writes == 0 {
        return Err("--capacity at least 1000000 bytes a second, --writes at least 1".into());
    }
    let mut rows = Vec::new();
    for &size in &a.sizes {
        for &loss in &a.losses {
            eprintln!("{size} values, {:.0}% loss each way", loss * 100.0);
            let mut latencies = Vec::new();
            let (mut sent, mut parts) = (0u64, 0u64);
            for w in 0..a.writes {
                let (latency, transmissions, n) = one_write(&a, size, loss, a.seed + w as u64)?;
                latencies.push(latency);
                sent += transmissions;
                parts += u64::from(n);
            }
            let median_ns =
                crate::statistics::median(latencies.iter().map(|&l| l as f64).collect());
            rows.push(WriteRow {
                size,
                loss,
                median_ns: median_ns as u64,
                max_ns: crate::statistics::percentile(&mut latencies, 1.0),
                sent_per_part: sent as f64 / parts.max(1) as f64,
            });
        }
    }
    println!(
        "input: writes of {} to {} values at consecutive locations (each location's index + \
         1), cut into parts of one 1,500-byte datagram each, as runs (2 bytes a value up to \
         65,535, 4 past it), {} writes a cell; channel of {} bytes/s each way, 16 MiB of \
         buffer, 5 us latency, losing the chance given each way; retransmission timeout 200 \
         us until a round trip is measured, then TCP's (at least 50 us), a part also sent \
         again once a part sent after it is acknowledged (3 places after it once the path \
         is seen to reorder), the last 32 after two round trips, a part sent again on a \
         timeout as 2 copies, then 4, and any part sent again in as many copies as make one \
         arrive 9 times in 10 at the loss the acknowledgements show (at most 16); each \
         acknowledgement sent once; 128 datagrams on the way at most, copies counted; \
         virtual time in steps of 2 us; seed {}",
        a.sizes.iter().min().copied().unwrap_or(0),
        a.sizes.iter().max().copied().unwrap_or(0),
        a.writes,
        a.capacity,
        a.seed
    );
    let mut table = Table::new(
        &["values", "loss each way"],
        &["median ms", "max ms", "parts sent per part"],
    );
    let mut csv = Csv::new("values,loss,median_ns,max_ns,sent_per_part");
    for r in &rows {
        table.row(vec![
            r.size.to_string(),
            format!("{:.0}%", r.loss * 100.0),
            format!("{:.3}", r.median_ns as f64 / 1e6),
            format!("{:.3}", r.max_ns as f64 / 1e6),
            format!("{:.2}", r.sent_per_part),
        ]);
        csv.row(format_args!(
            "{},{},{},{},{:.4}",
            r.size, r.loss, r.median_ns, r.max_ns, r.sent_per_part
        ));
    }
    table.print();
    if let Some(path) = &a.files.csv {
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let panel = Panel {
            title: "write latency, median".into(),
            unit: "ms".into(),
            bars: (rows.iter())
                .map(|r| {
                    let label = format!("{} values, {:.0}% loss", r.size, r.loss * 100.0);
                    (label, r.median_ns as f64 / 1e6)
                })
                .collect(),
        };
        a.files.write_chart(
            "Sync: top-down writes through a lossy channel",
            &format!("{} bytes/s each way, loss each way", a.capacity),
            &[panel],
        )?;
    }
    Ok(())
}

/// `stateplane bench-sync-track`: what tracking synced state costs a register's update,
/// against the same updates on a plain array and on a register not tracked (which must
/// cost nothing more), in one run. The tracked run takes the changes every `--take-every`
/// updates, as the sync stage's passes do, and checks that the changes it took add up to
/// every update.
#[derive(clap::Args)]
pub struct BenchSyncTrackArgs {
    /// Cells of the register.
    #[arg(long, default_value_t = 65_536)]
    pub cells: usize,
    /// Updates per round.
    #[arg(long, default_value_t = 20_000_000)]
    pub updates: usize,
    /// Rounds of the measurement; the median is reported.
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// Updates between two takes of the tracked register's changes (65,536: about a
    /// millisecond of a busy worker's, which is how often its sync stage takes them).
    #[arg(long, default_value_t = 65_536)]
    pub take_every: usize,
    /// Seed of the traces and random draws: the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub files: ResultFiles,
}

pub fn main_track(a: BenchSyncTrackArgs) -> BenchResult<()> {
    use stateplane_state::Register;
    use stateplane_state::changes::Change;
    use std::time::Instant;
    if a.cells == 0 || a.updates == 0 || a.rounds == 0 || a.take_every == 0 {
        return Err("--cells, --updates, --rounds and --take-every must be above 0".into());
    }
    let mut rng = Rng::new(a.seed);
    let indexes: Vec<u32> = (0..a.updates)
        .map(|_| rng.below(a.cells as u64) as u32)
        .collect();
    let (mut plain_ns, mut quiet_ns, mut tracked_ns) = (Vec::new(), Vec::new(), Vec::new());
    let mut taken: Vec<Change> = Vec::new();
    for round in 0..a.rounds {
        eprintln!("round {} of {}", round + 1, a.rounds);
        let mut plain = vec![0u64; a.cells];
        let t = Instant::now();
        for &i in &indexes {
            plain[i as usize % a.cells] += 1;
        }
        plain_ns.push(t.elapsed().as_nanos() as f64 / a.updates as f64);
        let mut quiet: Register<u64> = Register::new(a.cells);
        let t = Instant::now();
        for &i in &indexes {
            quiet.update(i as usize, |x| *x += 1);
        }
        quiet_ns.push(t.elapsed().as_nanos() as f64 / a.updates as f64);
        let mut tracked: Register<u64> = Register::new(a.cells);
        tracked.track(0, 0);
        let mut changed = 0u64;
        let t = Instant::now();
        for burst in indexes.chunks(a.take_every) {
            for &i in burst {
                tracked.update(i as usize, |x| *x += 1);
            }
            tracked.take_changes(&mut taken);
            changed += taken.iter().map(|c| c.new - c.old).sum::<u64>();
            taken.clear();
        }
        tracked_ns.push(t.elapsed().as_nanos() as f64 / a.updates as f64);
        let same = plain.iter().sum::<u64>() == a.updates as u64
            && quiet.as_slice() == plain.as_slice()
            && tracked.as_slice() == plain.as_slice();
        if !same || changed != a.updates as u64 {
            return Err(format!(
                "round {round}: the registers differ from the plain array, or the changes \
                 taken add up to {changed} of {} updates",
                a.updates
            ));
        }
    }
    let median = crate::statistics::median;
    let (plain, quiet, tracked) = (median(plain_ns), median(quiet_ns), median(tracked_ns));
    println!(
        "input: {} updates (+1) of a register of {} cells at uniform random indexes, seed {}; \
         median of {} rounds; the tracked register's changes taken every {} updates, their \
         sum checked against the updates",
        a.updates, a.cells, a.seed, a.rounds, a.take_every
    );
    let mut table = Table::new(&["updates on"], &["ns/update", "vs plain array"]);
    let mut csv = Csv::new("target,ns_per_update,vs_plain");
    for (name, ns) in [
        ("a plain array", plain),
        ("a register, not tracked", quiet),
        ("a register, tracked", tracked),
    ] {
        table.row(vec![
            name.into(),
            format!("{ns:.2}"),
            format!("{:.2}x", ns / plain),
        ]);
        csv.row(format_args!("\"{name}\",{ns:.4},{:.4}", ns / plain));
    }
    table.print();
    if let Some(path) = &a.files.csv {
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let panel = Panel {
            title: "a register's update".into(),
            unit: "ns".into(),
            bars: vec![
                ("plain array".into(), plain),
                ("register, not tracked".into(), quiet),
                ("register, tracked".into(), tracked),
            ],
        };
        a.files.write_chart(
            "Sync: what tracking costs an update",
            &format!("{} cells, {} updates a round", a.cells, a.updates),
            &[panel],
        )?;
    }
    Ok(())
}

/// `stateplane bench-sync-cost`: what syncing a program's state costs its forwarding, in
/// one run: `hh` (or `counter`) replayed from memory with sync off, then with its sketch
/// (its flow table) synced to a collector in the same process over UDP on loopback, at each
/// threshold asked for. The run checks the work was done: once the last run of each mode
/// has ended, the collector's copy counts as many packets as were forwarded (in each
/// worker's first row of the sketch; in the packets of the flows it holds), every value
/// with bound 0, and nothing was refused or missing.
#[derive(clap::Args)]
pub struct BenchSyncCostArgs {
    /// The program measured.
    #[arg(long, value_enum, default_value_t = CostProgram::Hh)]
    pub program: CostProgram,
    /// counter's flows per worker (262,144; its table must hold every flow of the trace,
    /// or the check fails). Refused with `--program hh`.
    #[arg(long)]
    pub capacity: Option<usize>,
    /// Packets in the generated trace (internet workload).
    #[arg(long, default_value_t = 1_000_000)]
    pub packets: u64,
    /// Every frame this many bytes (as captured).
    #[arg(long, default_value_t = 64)]
    pub packet_size: usize,
    /// Seed of the traces and random draws: the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Times each worker replays its share of the trace.
    #[arg(long, default_value_t = 10)]
    pub loops: u64,
    /// Worker threads, each with its own share of the flows.
    #[arg(long, default_value_t = 1)]
    pub workers: usize,
    /// Packets a worker takes at a time.
    #[arg(long, default_value_t = 64)]
    pub burst: usize,
    /// Rounds of every mode in turn; the medians are reported.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    /// The sketch's width and depth (hh's settings, 4,096 and 4). Refused with
    /// `--program counter`.
    #[arg(long)]
    pub width: Option<usize>,
    /// Rows of the count-min sketch.
    #[arg(long)]
    pub depth: Option<usize>,
    /// The thresholds synced with: "adaptive" or numbers (0: every change).
    #[arg(long, value_delimiter = ',', default_value = "adaptive,0,64")]
    pub thresholds: Vec<String>,
    /// The read handler's slots.
    #[arg(long, default_value_t = 65_536)]
    pub slots: usize,
    /// `[sync] max_age_ms` of every synced mode: how long a change may wait unsent, and
    /// so how far apart the passes that take the changes may be.
    #[arg(long, default_value_t = 10)]
    pub max_age_ms: u64,
    /// One more mode, `t` adaptive with a write every this many milliseconds (0: none): of
    /// 4,096 values into hh's sketch, or of 64 entries into counter's table.
    #[arg(long, default_value_t = 10)]
    pub writes_every_ms: u64,
    #[command(flatten)]
    pub files: ResultFiles,
}

/// What `bench-sync-cost` measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum CostProgram {
    /// hh with one tenant, its sketch synced.
    Hh,
    /// counter, its flow table synced.
    Counter,
}

impl CostProgram {
    fn name(self) -> &'static str {
        match self {
            CostProgram::Hh => "hh",
            CostProgram::Counter => "counter",
        }
    }

    fn synced_state(self) -> &'static str {
        match self {
            CostProgram::Hh => "sketch",
            CostProgram::Counter => "flows",
        }
    }
}

/// counter's flow table as synced words: its layout, and where a slot keeps what the
/// check and the writes need.
struct FlowWords {
    words: stateplane_state::synced_table::SlotWords,
    vlan: usize,
    packets: usize,
}

impl FlowWords {
    /// VLAN of the entries the writes place, which no packet of the trace has.
    const WRITTEN_VLAN: u128 = 4095;

    fn of(program: &stateplane_runtime::ProgramFactory) -> BenchResult<FlowWords> {
        let declared = program(0).declarations();
        let flows =
            (declared.iter().find(|d| d.name == "flows")).ok_or("counter declares flows")?;
        let words = stateplane_state::synced_table::SlotWords::of(flows, &[])
            .ok_or("counter's flows are a table")?;
        Ok(FlowWords {
            vlan: words.key_word(5).ok_or("a flow key has a VLAN")?,
            packets: words.param_word(0).ok_or("a flow counts packets")?,
            words,
        })
    }

    /// 64 entries of flows on `WRITTEN_VLAN`, as a write's values.
    fn written(&self) -> Vec<stateplane_sync::write::Written> {
        let stride = self.words.stride();
        let mut out = Vec::new();
        let mut slot = vec![0; stride];
        for i in 0..64u32 {
            let key = [1, 2, 17, u128::from(i), 9, Self::WRITTEN_VLAN];
            self.words.encode(0, Some(&key), &[0, 0], &mut slot);
            for (w, &value) in slot.iter().enumerate() {
                out.push(stateplane_sync::write::Written {
                    location: Location {
                        state: 0,
                        index: i * stride as u32 + w as u32,
                    },
                    value,
                    mode: stateplane_sync::write::Mode::Set,
                });
            }
        }
        out
    }

    /// The packets counted by the flows a copy holds, past the written ones.
    fn packets(&self, held: &[(Location, stateplane_sync::mirror::Reading)]) -> u64 {
        let stride = self.words.stride() as u32;
        let mut slots: std::collections::HashMap<u32, Vec<u64>> = Default::default();
        for (l, reading) in held {
            let slot = slots
                .entry(l.index / stride)
                .or_insert_with(|| vec![0; stride as usize]);
            slot[(l.index % stride) as usize] = reading.value;
        }
        (slots.values())
            .filter(|w| w[0] != 0 && u128::from(w[self.vlan]) != Self::WRITTEN_VLAN)
            .map(|w| w[self.packets])
            .sum()
    }
}

pub fn main_cost(a: BenchSyncCostArgs) -> BenchResult<()> {
    use crate::bench::{generated_trace, rates, replay_runtime};
    use stateplane_programs::PortNames;
    use stateplane_switch::collector::{self, CollectorSettings};
    use stateplane_switch::sync_stage::{SyncSettings, ThresholdSetting};
    use stateplane_switch::units::bounded;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let workers = bounded("--workers", a.workers, 1, 64)?;
    let burst = bounded("--burst", a.burst, 1, 1024)?;
    let repeat = bounded("--repeat", a.repeat, 1, 101)?;
    // A setting of the other program would be ignored: it is refused instead.
    let (width, depth, capacity) = match (a.program, a.width, a.depth, a.capacity) {
        (CostProgram::Hh, width, depth, None) => (width.unwrap_or(4096), depth.unwrap_or(4), 0),
        (CostProgram::Counter, None, None, capacity) => (0, 0, capacity.unwrap_or(262_144)),
        (CostProgram::Hh, ..) => {
            return Err("--capacity is counter's table; hh's sketch is --width and --depth".into());
        }
        (CostProgram::Counter, ..) => {
            return Err(
                "--width and --depth are hh's sketch; counter's table is --capacity".into(),
            );
        }
    };
    let width = width.max(1).next_power_of_two();
    let names = PortNames(vec!["p0".into(), "p1".into()]);
    let map = "map = { p0 = \"p1\", p1 = \"p0\" }";
    let settings = match a.program {
        CostProgram::Hh => format!(
            "tenants = 1\nwidth = {width}\ndepth = {}\ninterval_ms = 3600000\n{map}",
            depth
        ),
        CostProgram::Counter => format!("capacity = {capacity}\nidle = 86400\n{map}"),
    };
    let table_value: toml::Value = toml::from_str(&settings).map_err(|e| e.to_string())?;
    let plain = stateplane_programs::build(a.program.name(), Some(&table_value), &names)
        .map_err(|e| e.to_string())?;
    let wanted = [(
        a.program.synced_state().to_string(),
        vec!["synced".to_string()],
    )]
    .into();
    let synced = stateplane_programs::with_guarantees(plain.clone(), &wanted, Default::default())
        .map_err(|e| e.to_string())?;
    let thresholds = (a.thresholds.iter())
        .map(|t| match t.trim() {
            "adaptive" => Ok(ThresholdSetting::Named("adaptive".into())),
            n => n
                .parse()
                .map(ThresholdSetting::Fixed)
                .map_err(|_| format!("--thresholds: '{n}' is neither adaptive nor a number")),
        })
        .collect::<BenchResult<Vec<_>>>()?;

    let collector_settings = CollectorSettings {
        max_locations: stateplane_sync::mirror::DEFAULT_MAX_LOCATIONS,
        listen: "127.0.0.1:0".parse().map_err(|_| "an address")?,
        key_file: None,
        switches: None,
        report_every: std::time::Duration::from_millis(10),
        duration: None,
        dump: None,
        api: None,
        redis: None,
        redis_tls: None,
        metrics: None,
    };
    let bound = collector::bind(&collector_settings)?;
    let addr = bound.addr;
    let handle = bound.handle();
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let collector_thread =
        std::thread::spawn(move || collector::run(&collector_settings, bound, stopping));

    eprintln!("generating {} packets of internet", a.packets);
    let (trace, input) = generated_trace("internet", a.packets, None, a.packet_size, 0.2, a.seed)?;
    let runtime = replay_runtime(workers, burst);
    // Every mode once a round, in turn, so that the machine's drifts fall on all of them.
    let mut modes = vec![("sync off".to_string(), plain.clone(), runtime.clone(), None)];
    let mut synced_modes: Vec<(String, ThresholdSetting, bool)> = (thresholds.iter())
        .map(|t| {
            let name = match t {
                ThresholdSetting::Fixed(0) => "sync on, t = 0 (every change)".to_string(),
                ThresholdSetting::Fixed(n) => format!("sync on, t = {n}"),
                ThresholdSetting::Named(_) => "sync on, t adaptive".to_string(),
            };
            (name, t.clone(), false)
        })
        .collect();
    if a.writes_every_ms > 0 {
        synced_modes.push((
            format!("sync on, t adaptive, writes every {} ms", a.writes_every_ms),
            ThresholdSetting::Named("adaptive".into()),
            true,
        ));
    }
    let mut writes_to = None;
    for (i, (name, t, writes)) in synced_modes.into_iter().enumerate() {
        let switch = i as u32 + 1;
        if writes {
            writes_to = Some(switch);
        }
        let plan = SyncSettings {
            collector: addr.to_string(),
            switch: Some(switch),
            channel_mbps: None,
            threshold: Some(t.clone()),
            refresh_ms: None,
            max_age_ms: Some(a.max_age_ms),
            slots: Some(a.slots),
            key_file: None,
        }
        .plan(workers)?;
        let mut on_runtime = runtime.clone();
        on_runtime.state_stages = vec![plan.factory()?];
        modes.push((name, synced.clone(), on_runtime, Some((switch, plan))));
    }
    // The writes: every `writes_every_ms`, into hh, 4,096 values set to 0 in the second
    // sketch, which the tenants past the first share and this trace (all of VLAN 0, the
    // first tenant) never touches: so the writes change neither hh's work nor the first
    // row, which the check below counts; into counter, 64 entries of flows on a VLAN no
    // packet has, which the check leaves out.
    let flow_words = match a.program {
        CostProgram::Counter => Some(FlowWords::of(&synced)?),
        CostProgram::Hh => None,
    };
    let reset: Vec<stateplane_sync::write::Written> = match &flow_words {
        Some(flows) => flows.written(),
        None => {
            let shared_sketch = (depth * width) as u32;
            (0..4096.min(depth * width) as u32)
                .map(|i| stateplane_sync::write::Written {
                    location: Location {
                        state: 0,
                        index: shared_sketch + i,
                    },
                    value: 0,
                    mode: stateplane_sync::write::Mode::Set,
                })
                .collect()
        }
    };
    let mut measured: Vec<Vec<crate::bench::Rates>> = modes.iter().map(|_| Vec::new()).collect();
    for round in 0..repeat {
        eprintln!("round {} of {repeat}", round + 1);
        for ((_, factory, runtime, synced), m) in modes.iter().zip(&mut measured) {
            let writing = Arc::new(AtomicBool::new(false));
            let writer = (synced.as_ref())
                .filter(|(switch, _)| Some(*switch) == writes_to)
                .map(|&(switch, _)| {
                    writing.store(true, Ordering::Relaxed);
                    let (writing, handle, reset) = (writing.clone(), handle.clone(), reset.clone());
                    let every = std::time::Duration::from_millis(a.writes_every_ms);
                    std::thread::spawn(move || {
                        while writing.load(Ordering::Relaxed) {
                            // Before the run's stream has sent anything there is nowhere
                            // to write: the next look tries again.
                            let _ = handle.with(|c| c.write(switch, 0, reset.clone()));
                            std::thread::sleep(every);
                        }
                    })
                });
            let measured = rates(Some(factory), &trace, runtime, (a.loops, 1, true));
            writing.store(false, Ordering::Relaxed);
            if let Some(w) = writer {
                w.join().map_err(|_| "the writer's thread failed")?;
            }
            m.push(measured?.0);
        }
    }
    let mut rows = Vec::new();
    for ((name, _, _, synced), m) in modes.iter().zip(measured) {
        let median = |f: fn(&crate::bench::Rates) -> f64| {
            crate::statistics::median(m.iter().map(f).collect())
        };
        let (mpps, ns) = (median(|r| r.mpps_per_core), median(|r| r.ns_per_packet));
        let forwarded = m.last().map_or(0, |r| r.forwarded);
        if let Some((switch, plan)) = synced {
            let sent = plan.report();
            if Some(*switch) == writes_to && sent.writes_committed == 0 {
                return Err(format!(
                    "{name}: no write committed, so nothing was measured"
                ));
            }
            if sent.writes_committed > 0 {
                eprintln!(
                    "{name}: {} writes committed ({} values)",
                    sent.writes_committed, sent.values_written
                );
            }
            // The workers' time in all (each round's packets at its time a packet per
            // core): the passes' share of it moves far less with the host's speed than
            // the rates do.
            let worked_s: f64 = (m.iter())
                .map(|r| r.packets as f64 * r.ns_per_packet * 1e-9)
                .sum();
            let share = match worked_s > 0.0 {
                true => 100.0 * sent.pass_seconds / worked_s,
                false => 0.0,
            };
            eprintln!(
                "{name}: over every round, {} changes taken in {} passes ({} left changes to \
                 the next; the longest held its worker {:.3} ms; {:.3} s, {share:.1}% of the \
                 workers' time: {:.3} s taking them from the state, {:.3} s in the read \
                 handler), {} messages ({} B), threshold carried: mean {:.1}, largest {}",
                sent.changes,
                sent.passes,
                sent.passes_cut,
                sent.longest_pause_seconds * 1e3,
                sent.pass_seconds,
                sent.take_seconds,
                sent.handle_seconds,
                sent.messages,
                sent.bytes,
                sent.mean_threshold,
                sent.largest_threshold
            );
            // Over the mode's own rounds (a stream's first and last messages span the
            // other modes' rounds too).
            let forwarding_bytes = sent.bytes.saturating_sub(sent.bytes_at_end);
            let mbps = match worked_s > 0.0 {
                true => forwarding_bytes as f64 * 8.0 / worked_s / 1e6,
                false => 0.0,
            };
            let c = &sent.sent;
            eprintln!(
                "{name}: updates sent as the worker forwarded: {} at the threshold, {} \
                 displaced, {} timed out, {} exact, {} by the refresh ({} B, {mbps:.1} Mbit/s, \
                 of a channel of {}); {} as each round ended",
                c.threshold,
                c.displaced,
                c.timed_out,
                c.exact,
                c.refresh,
                forwarding_bytes,
                sent.channel_mbps
                    .map_or("none (a fixed threshold)".to_string(), |m| format!(
                        "{m} Mbit/s"
                    )),
                sent.sent_at_end
            );
        }
        let switch = synced.as_ref().map_or(0, |(s, _)| *s);
        rows.push((name.clone(), mpps, ns, forwarded, switch));
    }
    // The last messages are on their way; then the copy is checked against the counts.
    std::thread::sleep(std::time::Duration::from_millis(300));
    stop.store(true, Ordering::Relaxed);
    let outcome = collector_thread
        .join()
        .map_err(|_| "the collector's thread failed")??;
    if !outcome.refused.is_empty() || outcome.mirror.missing > 0 {
        return Err(format!(
            "the collector refused {:?} and missed {} messages: the figures would not count",
            outcome.refused, outcome.mirror.missing
        ));
    }
    for (name, _, _, forwarded, switch) in rows.iter().filter(|r| r.4 > 0) {
        let mut counted = 0u64;
        for stream in 0..workers as u16 {
            let held = handle.with(|c| c.held(*switch, stream));
            if let Some((l, _)) = held.iter().find(|(_, r)| r.bound != Some(0)) {
                return Err(format!("{name}: location {l:?} is not exact at the end"));
            }
            counted += match &flow_words {
                Some(flows) => flows.packets(&held),
                None => (held.iter())
                    .filter(|(l, _)| (l.index as usize) < width)
                    .map(|(_, r)| r.value)
                    .sum(),
            };
        }
        if counted != *forwarded {
            return Err(format!(
                "{name}: the collector's copy counts {counted} packets where {forwarded} were \
                 forwarded in its last round"
            ));
        }
    }
    let program = match a.program {
        CostProgram::Hh => format!("hh with one tenant, a sketch of {} x {width}", depth),
        CostProgram::Counter => format!(
            "counter, its flows synced ({} per worker at most, {} words a slot)",
            capacity,
            flow_words.as_ref().map_or(0, |f| f.words.stride())
        ),
    };
    println!(
        "input: {input}; {program}; {workers} worker(s), \
         burst {burst}, loops {}, median of {repeat} rounds of every mode in turn; sync to a \
         collector in this process on \
         loopback, {} slots, max_age_ms {}; checked: every mode's last copy counts every \
         packet forwarded, exactly, nothing refused or missing",
        a.loops, a.slots, a.max_age_ms
    );
    let off_mpps = rows[0].1;
    let mut table = Table::new(&[a.program.name()], &["Mpps/core", "vs off", "ns/packet"]);
    let mut csv = Csv::new("mode,mpps_per_core,vs_off,ns_per_packet,packets_forwarded");
    for (name, mpps, ns, forwarded, _) in &rows {
        table.row(vec![
            name.clone(),
            format!("{mpps:.2}"),
            format!("{:.2}", mpps / off_mpps),
            format!("{ns:.1}"),
        ]);
        csv.row(format_args!(
            "\"{name}\",{mpps:.3},{:.3},{ns:.2},{forwarded}",
            mpps / off_mpps
        ));
    }
    table.print();
    if let Some(path) = &a.files.csv {
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let panel = Panel {
            title: format!("{}, Mpps per core", a.program.name()),
            unit: "Mpps".into(),
            bars: rows
                .iter()
                .map(|(n, mpps, ..)| (n.clone(), *mpps))
                .collect(),
        };
        a.files.write_chart(
            "Sync: what syncing state costs forwarding",
            &format!("{} packets; {program}", a.packets),
            &[panel],
        )?;
    }
    Ok(())
}

/// `stateplane bench-sync-read`: how long a control-plane application waits to read N
/// values of a switch's sketch, 256 to 65,536, two ways, in one run: from the collector's
/// copy through its API (`sync`), and from the switch's workers through its control API
/// (`poll`, the switch-OS way: the request crosses to the worker, which answers between
/// two bursts). Both over gRPC on loopback, in this process, the worker busy polling as
/// under traffic. Every read of both is checked against the values written.
#[derive(clap::Args)]
pub struct BenchSyncReadArgs {
    /// Comma-separated numbers of values read (at most 65,536).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "256,1024,4096,16384,65536"
    )]
    pub sizes: Vec<u32>,
    /// Reads of each size, each way.
    #[arg(long, default_value_t = 30)]
    pub reads: usize,
    /// Seed of the traces and random draws: the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub files: ResultFiles,
}

/// `hh` with one tenant, its sketch register synced: two sketches (the tenant's, the
/// others') of 4 x 8,192, 65,536 counters.
pub(crate) fn synced_hh_65536() -> BenchResult<stateplane_runtime::ProgramFactory> {
    let names = stateplane_programs::PortNames(vec!["p0".into(), "p1".into()]);
    let settings: toml::Value = toml::from_str(
        "tenants = 1\nwidth = 8192\ndepth = 4\ninterval_ms = 3600000\nmap = { p0 = \"p1\" }",
    )
    .map_err(|e| e.to_string())?;
    stateplane_programs::build("hh", Some(&settings), &names)
        .and_then(|f| {
            let wanted = [("sketch".to_string(), vec!["synced".to_string()])].into();
            stateplane_programs::with_guarantees(f, &wanted, Default::default())
        })
        .map_err(|e| e.to_string())
}

pub fn main_read(a: BenchSyncReadArgs) -> BenchResult<()> {
    use stateplane_control::collector_api::{self, CollectorClient, CollectorHandle};
    use stateplane_control::server::{ControlService, Server};
    use stateplane_control::sync_pb::ReadRequest;
    use stateplane_runtime::{Burst, ControlPlane, Worker};
    use stateplane_sync::collector::Collector;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::time::Instant;
    const CELLS: u32 = 65_536;
    if a.reads == 0 || a.sizes.iter().any(|&n| n == 0 || n > CELLS) {
        return Err("--sizes: 1 to 65536 values; --reads above 0".into());
    }
    let factory = synced_hh_65536()?;
    let mut rng = Rng::new(a.seed);
    let values: Vec<u64> = (0..CELLS).map(|_| rng.below(1 << 31)).collect();

    // The switch: one worker, its sketch holding the values, behind its control API.
    let mut program = factory(0);
    for (i, &v) in values.iter().enumerate() {
        program.write_synced(0, i as u32, v);
    }
    let (plane, ends) = ControlPlane::new(1, factory(0));
    let stop = Arc::new(AtomicBool::new(false));
    let worker_stop = stop.clone();
    let end = ends.into_iter().next().ok_or("no worker end")?;
    let worker = std::thread::spawn(move || {
        let hasher = stateplane_wire::FlowHasher::with_seed(1);
        let mut worker = Worker::new(program, 0, 1, 2, hasher).with_control(end);
        let mut idle = Burst::with_capacity(1);
        while !worker_stop.load(Ordering::Relaxed) {
            worker.poll(&mut idle);
        }
    });
    let service = ControlService::new(plane, "hh", Arc::new(Vec::new));
    let loopback = &stateplane_control::endpoint::Listen::loopback(0);
    let switch_api = Server::start(loopback, service)?;

    // The collector: its copy of the same sketch, as the switch's refresh would leave it.
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    let handle = Arc::new(CollectorHandle::new(Collector::new(None, None), socket));
    let mut sender = Sender::new(SenderConfig {
        switch: 1,
        epoch: 1,
        stream: 0,
        slots: 16,
        threshold: Threshold::Fixed(0),
        max_age_ns: 1_000_000,
        heartbeat_ns: 1_000_000,
        batch_ns: 0,
        refresh_ns: 0,
        states: vec![SyncedState::register(0, CELLS)],
    });
    let mut messages = Vec::new();
    sender.finish(1, |l| values[l.index as usize], &mut messages, |_| {});
    let from = "127.0.0.1:9".parse().map_err(|_| "an address")?;
    for m in messages {
        let mut bytes = Vec::new();
        m.encode(&mut bytes);
        handle.receive(1, &bytes, from);
    }
    let collector_api =
        collector_api::serve("127.0.0.1:0".parse().map_err(|_| "an address")?, handle)?;

    let mut poll = stateplane_control::client::Client::connect(&switch_api.endpoint.to_string())
        .map_err(|e| e.to_string())?;
    let mut sync =
        CollectorClient::connect(&collector_api.endpoint.to_string()).map_err(|e| e.to_string())?;
    let mut rows = Vec::new();
    for &n in &a.sizes {
        eprintln!("reading {n} values {} times each way", a.reads);
        let want = &values[..n as usize];
        let (mut sync_ms, mut poll_ms) = (Vec::new(), Vec::new());
        for _ in 0..a.reads {
            let t = Instant::now();
            let r = sync
                .read(ReadRequest {
                    switch_id: 1,
                    stream: Some(0),
                    state: 0,
                    first: 0,
                    count: n,
                })
                .map_err(|e| e.to_string())?;
            sync_ms.push(t.elapsed().as_secs_f64() * 1e3);
            if r.values != want || !r.unbounded.is_empty() || r.bounds.iter().any(|&b| b != 0) {
                return Err(format!(
                    "sync: a read of {n} values is not the values written"
                ));
            }
            let t = Instant::now();
            let r = poll
                .read_register("sketch", 0, u64::from(n))
                .map_err(|e| e.to_string())?;
            poll_ms.push(t.elapsed().as_secs_f64() * 1e3);
            let got: Vec<u64> = (r.iter())
                .map(|b| b.iter().fold(0u64, |acc, &x| acc << 8 | u64::from(x)))
                .collect();
            if got != want {
                return Err(format!(
                    "poll: a read of {n} values is not the values written"
                ));
            }
        }
        let stats = |ms: Vec<f64>| {
            let max = ms.iter().copied().fold(0.0, f64::max);
            (crate::statistics::median(ms), max)
        };
        rows.push((n, stats(sync_ms), stats(poll_ms)));
    }
    stop.store(true, Ordering::Relaxed);
    let _ = worker.join();
    println!(
        "input: hh's sketch of 65,536 counters holding random values (seed {}), read from \
         index 0; {} reads of each size each way, in this process over gRPC on loopback; \
         every read checked against the values written",
        a.seed, a.reads
    );
    let mut table = Table::new(
        &["values"],
        &[
            "sync median ms",
            "sync max",
            "poll median ms",
            "poll max",
            "poll / sync",
        ],
    );
    let mut csv = Csv::new("values,sync_median_ms,sync_max_ms,poll_median_ms,poll_max_ms");
    for (n, (sm, sx), (pm, px)) in &rows {
        table.row(vec![
            n.to_string(),
            format!("{sm:.3}"),
            format!("{sx:.3}"),
            format!("{pm:.3}"),
            format!("{px:.3}"),
            format!("{:.2}x", pm / sm),
        ]);
        csv.row(format_args!("{n},{sm:.4},{sx:.4},{pm:.4},{px:.4}"));
    }
    table.print();
    if let Some(path) = &a.files.csv {
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let mut bars = Vec::new();
        for (n, (sm, _), (pm, _)) in &rows {
            bars.push((format!("{n}: sync"), *sm));
            bars.push((format!("{n}: poll"), *pm));
        }
        let panel = Panel {
            title: "a read of N values, median".into(),
            unit: "ms".into(),
            bars,
        };
        a.files.write_chart(
            "Sync: reading a switch's sketch from the collector and by polling",
            &format!("{} reads of each size each way, gRPC on loopback", a.reads),
            &[panel],
        )?;
    }
    Ok(())
}
