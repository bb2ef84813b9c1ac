//! `stateplane bench-sync-migrate`: state migration through the collector on real
//! sockets (ApproSync Exp#4 and #9): a switch's sketch is read from the collector's copy
//! and written into another switch, 256 to 65,536 values at a time, with the second
//! switch's sync channel losing 0 to 80% of the datagrams each way (`stateplane relay`'s
//! faults, in this process; at 0% the target sends to the collector directly). Every part
//! of the run is real: the switches are workers with their sync stages (the target
//! polling as under traffic), the collector is `stateplane collector`'s, the calls are
//! gRPC on loopback. A move's time ends when the target's sync stage has committed its
//! writes (its counters say so), not when the collector has their acknowledgements: a
//! switch acknowledges a write's parts as it takes them and commits the write whole at
//! its next pass. The run checks the work was done: every write says it committed, and at
//! the end each target switch's register (or table) holds the source's values, read from
//! the program.

use crate::BenchResult;
use crate::bench_sync::synced_hh_65536;
use crate::chart::Panel;
use crate::results::{Csv, ResultFiles, Table};
use stateplane_control::collector_api::{self, CollectorClient};
use stateplane_control::migrate::{Move, migrate};
use stateplane_control::sync_pb::{ReadRequest, WriteDone, WriteRequest};
use stateplane_gen::rng::Rng;
use stateplane_runtime::{Burst, Running, Worker};
use stateplane_switch::collector::{self, CollectorSettings};
use stateplane_switch::relay::{self, RelaySettings};
use stateplane_switch::sync_stage::{SyncCounters, SyncSettings};
use stateplane_sync::channel::Faults;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const CELLS: u32 = 65_536;

/// A sketch's switches refresh every 100 ms: the copy is exact again soon after any loss.
const SKETCH_REFRESH_MS: u64 = 100;
/// A table's refresh carries 13 words a slot (1.7 million for 65,536 connections): the
/// run's default of once a second, not to keep the collector busy with refreshes.
const TABLE_REFRESH_MS: u64 = 1000;
/// The pause before each move (not timed): a move's commit sends the changes it made to
/// the collector (all of a table's moved words), and the next move starts once they are
/// taken, as one migration after another would.
const BETWEEN_MOVES: Duration = Duration::from_millis(200);

#[derive(clap::Args)]
pub struct BenchSyncMigrateArgs {
    /// Comma-separated numbers of values moved at a time (at most 65,536).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "256,1024,4096,16384,65536"
    )]
    pub sizes: Vec<u32>,
    /// Comma-separated shares of the datagrams the target's sync channel loses each way
    /// (as `bench-sync-write`'s `--losses`).
    #[arg(long, value_delimiter = ',', default_value = "0,0.2,0.5,0.8")]
    pub losses: Vec<f64>,
    /// Moves of each size at each loss.
    #[arg(long, default_value_t = 10)]
    pub moves: usize,
    /// Move the whole sketch (`--sizes 65536` only) with `ctl sync migrate`'s call, read
    /// and written inside the collector, rather than read from its copy and written back
    /// through its API (which moves any number of values, each crossing the API twice).
    #[arg(long, conflicts_with = "table")]
    pub migrate: bool,
    /// Move conntrack tables of `--sizes` connections (entries, each placed by its key in
    /// the target) instead of hh's sketch values, with `ctl sync migrate`'s code.
    #[arg(long)]
    pub table: bool,
    /// Seed of the traces and random draws: the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub files: ResultFiles,
}

/// A switch of one worker running `hh` with its sketch synced, until stopped; its program
/// comes back when it stops. A `busy` one polls without a pause, as under traffic; the
/// others tick once a millisecond, as an idle live switch does (two busy ones would take
/// both of this machine's cores from the collector).
struct Switch {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Box<dyn Running>>,
    counters: Arc<SyncCounters>,
}

impl Switch {
    fn start(
        id: u32,
        collector: SocketAddr,
        values: Option<&[u64]>,
        busy: bool,
    ) -> BenchResult<Switch> {
        let mut program = synced_hh_65536()?(0);
        for (i, &v) in values.unwrap_or_default().iter().enumerate() {
            program.write_synced(0, i as u32, v);
        }
        Switch::running(id, collector, program, busy, SKETCH_REFRESH_MS)
    }

    /// A switch running `program`, whose synced state is id 0.
    fn running(
        id: u32,
        collector: SocketAddr,
        program: Box<dyn Running>,
        busy: bool,
        refresh_ms: u64,
    ) -> BenchResult<Switch> {
        let plan = SyncSettings {
            collector: collector.to_string(),
            switch: Some(id),
            channel_mbps: None,
            threshold: None,
            refresh_ms: Some(refresh_ms),
            max_age_ms: None,
            slots: None,
            key_file: None,
        }
        .plan(1)?;
        let stage = plan.factory()?(0);
        let counters = plan.counters.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = named(&format!("switch-{id}"), move || {
            let hasher = stateplane_wire::FlowHasher::with_seed(1);
            let mut worker = Worker::new(program, 0, 1, 2, hasher).with_state_stages(vec![stage]);
            let mut idle = Burst::with_capacity(1);
            while !stopping.load(Ordering::Relaxed) {
                worker.poll(&mut idle);
                if !busy {
                    std::thread::sleep(Duration::from_millis(1));
                }
            }
            worker.finish();
            worker.into_program()
        })?;
        Ok(Switch {
            stop,
            thread,
            counters,
        })
    }

    /// The writes it has committed.
    fn committed(&self) -> u64 {
        SyncCounters::get(&self.counters.writes_committed)
    }

    /// The time its worker has spent committing writes (forwarding nothing meanwhile).
    fn commit_ns(&self) -> u64 {
        SyncCounters::get(&self.counters.commit_ns)
    }

    /// The longest its sync stage has held its worker in one go since the last call, in
    /// milliseconds.
    fn longest_pause_ms(&self) -> f64 {
        let ns = self.counters.longest_pause_ns.swap(0, Ordering::Relaxed);
        ns as f64 / 1e6
    }

    /// The largest threshold its messages of changes have carried (what the collector's
    /// copy of it is bounded by).
    fn largest_threshold(&self) -> u64 {
        SyncCounters::get(&self.counters.largest_threshold)
    }

    /// Waits until it has committed `writes` writes in all: a write is acknowledged once
    /// the switch holds all of it, and lands in its state at the switch's next pass.
    fn await_committed(&self, writes: u64) -> BenchResult<()> {
        let start = Instant::now();
        while self.committed() < writes {
            if start.elapsed() > Duration::from_secs(20) {
                return Err(format!(
                    "the target committed {} writes of {writes} in 20 s",
                    self.committed()
                ));
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        Ok(())
    }

    /// Stops it; its register, read from the program.
    fn stop(self) -> BenchResult<Vec<u64>> {
        let program = self.stop_program()?;
        Ok((0..CELLS)
            .map(|i| program.read_synced(0, i).unwrap_or(u64::MAX))
            .collect())
    }

    fn stop_program(self) -> BenchResult<Box<dyn Running>> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .join()
            .map_err(|_| "a switch's thread failed".into())
    }
}

/// A relay in this process from `loopback` to the collector, losing `loss` each way; its
/// address, and what stops it. None stands on a channel that loses nothing: a relay
/// losing nothing is only one more hop, whose copies of every datagram share the
/// collector's core (0.8-1.5 ms of a 65,536-connection move).
struct LossyRelay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<relay::RelayOutcome, String>>,
}

impl LossyRelay {
    /// Where a target sends its sync to reach the collector through a channel losing
    /// `loss` each way, and the relay that loses it (none at 0).
    fn channel(
        collector: SocketAddr,
        loss: f64,
        seed: u64,
    ) -> BenchResult<(SocketAddr, Option<LossyRelay>)> {
        if loss == 0.0 {
            return Ok((collector, None));
        }
        let relay = LossyRelay::start(collector, loss, seed)?;
        Ok((relay.addr, Some(relay)))
    }

    fn start(collector: SocketAddr, loss: f64, seed: u64) -> BenchResult<LossyRelay> {
        let settings = RelaySettings {
            listen: "127.0.0.1:0".parse().map_err(|_| "an address")?,
            target: collector,
            faults: Faults {
                loss,
                duplicate: 0.0,
                max_delay_ns: 0,
            },
            seed,
            duration: None,
        };
        let (socket, addr) = relay::bind(&settings)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = named("relay", move || relay::run(&settings, socket, stopping))?;
        Ok(LossyRelay { addr, stop, thread })
    }

    /// Stops `relay`; what it did, as a line.
    fn stop(relay: Option<LossyRelay>) -> BenchResult<String> {
        let Some(relay) = relay else {
            return Ok("no relay: the target sends to the collector directly".into());
        };
        relay.stop.store(true, Ordering::Relaxed);
        let relayed = (relay.thread.join()).map_err(|_| "the relay's thread failed")??;
        Ok(relayed.table().replace('\n', "; "))
    }
}

/// Waits until the collector's copy of `switch` is `want`, exactly and with every bound 0.
fn await_copy(client: &mut CollectorClient, switch: u32, want: &[u64]) -> BenchResult<()> {
    let start = Instant::now();
    loop {
        let read = client.read(ReadRequest {
            switch_id: switch,
            stream: Some(0),
            state: 0,
            first: 0,
            count: want.len() as u32,
        });
        if let Ok(r) = read
            && r.values == want
            && r.unbounded.is_empty()
            && r.bounds.iter().all(|&b| b == 0)
        {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(20) {
            return Err(format!(
                "switch {switch}'s copy at the collector is not its values after 20 s"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the collector has heard from `switch` (it sends writes where the stream's
/// messages come from). Its copy need not be whole: under steady loss a gap comes before
/// each refresh ends, and the writes do not need it.
fn await_stream(client: &mut CollectorClient, switch: u32) -> BenchResult<()> {
    let start = Instant::now();
    loop {
        let streams = client.streams().map_err(|e| e.to_string())?;
        if streams.streams.iter().any(|s| s.switch_id == switch) {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(20) {
            return Err(format!(
                "switch {switch} never reached the collector in 20 s"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One row: a size at a loss, each move's time (read and write), the write's own, the
/// target's commit of it and the longest its worker paused forwarding meanwhile, and the
/// transmissions per part.
struct Row {
    loss: f64,
    values: u32,
    move_ms: Vec<f64>,
    write_ms: Vec<f64>,
    commit_ms: Vec<f64>,
    pause_ms: Vec<f64>,
    sent_per_part: Vec<f64>,
}

impl Row {
    fn new(loss: f64, values: u32) -> Row {
        Row {
            loss,
            values,
            move_ms: Vec::new(),
            write_ms: Vec::new(),
            commit_ms: Vec::new(),
            pause_ms: Vec::new(),
            sent_per_part: Vec::new(),
        }
    }

    /// Waits the time between two moves, then takes the target's longest pause since the
    /// last call as the last move's: the pass that commits a write goes on past the
    /// commit that ends the move, sending the write's changes back. Before each move, and
    /// once after the last.
    fn between_moves(&mut self, target: &Switch) {
        std::thread::sleep(BETWEEN_MOVES);
        let pause_ms = target.longest_pause_ms();
        if self.pause_ms.len() < self.move_ms.len() {
            self.pause_ms.push(pause_ms);
        }
    }

    /// A move begun at `started` and committed now, by the writes `done`, which the
    /// target's worker took `commit_ns` to commit.
    fn record(&mut self, started: Instant, done: &[WriteDone], commit_ns: u64) {
        self.move_ms.push(started.elapsed().as_secs_f64() * 1e3);
        self.commit_ms.push(commit_ns as f64 / 1e6);
        let latency_ns: u64 = done.iter().map(|d| d.latency_ns).sum();
        self.write_ms.push(latency_ns as f64 / 1e6);
        let sent: u64 = done.iter().map(|d| d.transmissions).sum();
        let parts: u32 = done.iter().map(|d| d.parts).sum();
        self.sent_per_part
            .push(sent as f64 / f64::from(parts.max(1)));
    }
}

/// Moves `a.sizes` values of hh's sketch from switch 1 into a target switch per loss.
fn move_values(
    a: &BenchSyncMigrateArgs,
    client: &mut CollectorClient,
    collector_addr: SocketAddr,
) -> BenchResult<Vec<Row>> {
    // The source: switch 1, straight to the collector, its sketch holding random values.
    let mut rng = Rng::new(a.seed);
    let values: Vec<u64> = (0..CELLS).map(|_| rng.below(1 << 31)).collect();
    let source = Switch::start(1, collector_addr, Some(&values), false)?;
    eprintln!("waiting for the source's copy at the collector to be exact");
    await_copy(client, 1, &values)?;

    let mut rows = Vec::new();
    for (l, &loss) in a.losses.iter().enumerate() {
        // The target: its own switch id, its sync through a relay losing `loss` each way.
        let target_id = 10 + l as u32;
        let (sync_to, relay) = LossyRelay::channel(collector_addr, loss, a.seed ^ l as u64)?;
        let target = Switch::start(target_id, sync_to, None, true)?;
        eprintln!("loss {loss}: waiting for switch {target_id} to reach the collector");
        await_stream(client, target_id)?;
        let mut committed = target.committed();
        for &n in &a.sizes {
            eprintln!("loss {loss}: moving {n} values {} times", a.moves);
            let mut row = Row::new(loss, n);
            for _ in 0..a.moves {
                row.between_moves(&target);
                let t = Instant::now();
                let commit_before = target.commit_ns();
                if a.migrate {
                    let moved = migrate(
                        client,
                        &Move {
                            from_switch: 1,
                            from_stream: 0,
                            to_switch: target_id,
                            to_stream: Some(0),
                            state: 0,
                            entry_words: Some(1),
                            timeout_ms: 10_000,
                        },
                    )?;
                    if moved.values != u64::from(CELLS) || moved.largest_bound != 0 {
                        return Err(format!(
                            "a migration moved {} values (bound {}), not the exact {CELLS}",
                            moved.values, moved.largest_bound
                        ));
                    }
                    committed += moved.done.len() as u64;
                    target.await_committed(committed)?;
                    row.record(t, &moved.done, target.commit_ns() - commit_before);
                    continue;
                }
                let read = (client.read(ReadRequest {
                    switch_id: 1,
                    stream: Some(0),
                    state: 0,
                    first: 0,
                    count: n,
                }))
                .map_err(|e| e.to_string())?;
                if read.values[..] != values[..n as usize] {
                    return Err("the source's copy changed under the move".into());
                }
                let written = (client.write(WriteRequest {
                    switch_id: target_id,
                    stream: Some(0),
                    state: 0,
                    first: 0,
                    values: read.values,
                    fill: 0,
                    count: n,
                    keep_changes: false,
                    subtract: false,
                    timeout_ms: 10_000,
                }))
                .map_err(|e| e.to_string())?;
                if written.done.len() != 1 {
                    return Err(format!("a write of {n} values did not commit once"));
                }
                committed += 1;
                target.await_committed(committed)?;
                row.record(t, &written.done, target.commit_ns() - commit_before);
            }
            row.between_moves(&target);
            rows.push(row);
        }
        let held = target.stop()?;
        let relayed = LossyRelay::stop(relay)?;
        let largest = a.sizes.iter().copied().max().unwrap_or(0) as usize;
        if held[..largest] != values[..largest] {
            return Err(format!(
                "loss {loss}: switch {target_id}'s register is not the source's values"
            ));
        }
        eprintln!("loss {loss}: {relayed}");
    }
    source.stop()?;
    Ok(rows)
}

/// conntrack with its connection table synced, holding `entries` established connections
/// (written through the program's own synced write, as a migration lands them), or none.
fn conntrack_switch(capacity: u32, entries: u32) -> BenchResult<Box<dyn Running>> {
    use stateplane_state::synced_table::SlotWords;
    let names = stateplane_programs::PortNames(vec!["p0".into(), "p1".into()]);
    let settings: toml::Value =
        toml::from_str(&format!("capacity = {capacity}\nmap = {{ p0 = \"p1\" }}"))
            .map_err(|e| e.to_string())?;
    let plain = stateplane_programs::build("conntrack", Some(&settings), &names)
        .map_err(|e| e.to_string())?;
    let wanted = [("connections".to_string(), vec!["synced".to_string()])].into();
    let synced = stateplane_programs::with_guarantees(plain, &wanted, Default::default())
        .map_err(|e| e.to_string())?;
    let mut program = synced(0);
    let declared = program.declarations();
    let table = (declared.iter())
        .find(|d| d.name == "connections")
        .ok_or("conntrack declares connections")?;
    let words = SlotWords::of(table, &[]).ok_or("connections is a table")?;
    let stride = words.stride() as u32;
    let mut slot = vec![0; words.stride()];
    for i in 0..entries {
        let src = std::net::Ipv4Addr::new(198, 18, (i >> 8) as u8, i as u8);
        let dst = std::net::Ipv4Addr::new(198, 19, 0, 1);
        let ip = |a| stateplane_state::control::ip_value(std::net::IpAddr::V4(a));
        let key = [ip(src), ip(dst), 6, 1024 + u128::from(i % 50_000), 80, 0];
        // `established`, its packets, answered, the originator the key's source.
        words.encode(1, Some(&key), &[u128::from(i), 1, 1], &mut slot);
        program.write_synced_run(0, i * stride, &slot);
    }
    let refused = program.commit_synced_write();
    if refused > 0 {
        return Err("the source's connections did not all fit its table".into());
    }
    Ok(program)
}

/// The occupied slots of a program's synced table (`stride` words each), sorted: what a
/// move must carry over whole, wherever the slots are.
fn table_entries(program: &dyn Running, stride: u32) -> Vec<Vec<u64>> {
    let length = program.synced().first().map_or(0, |&(_, l)| l);
    let mut entries: Vec<Vec<u64>> = (0..length / stride)
        .map(|slot| {
            (0..stride)
                .map(|w| program.read_synced(0, slot * stride + w).unwrap_or(0))
                .collect::<Vec<u64>>()
        })
        .filter(|words| words[0] != 0)
        .collect();
    entries.sort_unstable();
    entries
}

/// Moves conntrack tables of each of `a.sizes` connections from a source switch into a
/// target switch per loss, with `ctl sync migrate`'s code, and checks that the target ends
/// with every connection, each word of it.
fn move_tables(
    a: &BenchSyncMigrateArgs,
    client: &mut CollectorClient,
    collector_addr: SocketAddr,
) -> BenchResult<Vec<Row>> {
    let mut rows = Vec::new();
    for (s, &n) in a.sizes.iter().enumerate() {
        let program = conntrack_switch(n, n)?;
        let stride = {
            let declared = program.declarations();
            let table = (declared.iter()).find(|d| d.name == "connections");
            (table.and_then(|t| stateplane_state::synced_table::SlotWords::of(t, &[])))
                .map_or(1, |w| w.stride() as u32)
        };
        let want = table_entries(program.as_ref(), stride);
        let length = program.synced().first().map_or(0, |&(_, l)| l);
        let source_id = 100 + s as u32;
        let source = Switch::running(source_id, collector_addr, program, false, TABLE_REFRESH_MS)?;
        eprintln!("{n} connections: waiting for the source's copy to be whole");
        await_extent(client, source_id, length)?;
        for (l, &loss) in a.losses.iter().enumerate() {
            let target_id = 1000 + (s * a.losses.len() + l) as u32;
            let (sync_to, relay) =
                LossyRelay::channel(collector_addr, loss, a.seed ^ target_id as u64)?;
            let target = Switch::running(
                target_id,
                sync_to,
                conntrack_switch(n, 0)?,
                true,
                TABLE_REFRESH_MS,
            )?;
            await_stream(client, target_id)?;
            eprintln!("loss {loss}: moving {n} connections {} times", a.moves);
            let mut row = Row::new(loss, n);
            let mut committed = target.committed();
            // How the moves went: writes a move, parts a write (the last move's).
            let mut shape = (0, 0);
            for _ in 0..a.moves {
                row.between_moves(&target);
                let t = Instant::now();
                let commit_before = target.commit_ns();
                let moved = migrate(
                    client,
                    &Move {
                        from_switch: source_id,
                        from_stream: 0,
                        to_switch: target_id,
                        to_stream: Some(0),
                        state: 0,
                        // As the source announces it (checked: the target must hold
                        // every connection, word for word).
                        entry_words: None,
                        timeout_ms: 10_000,
                    },
                )?;
                committed += moved.done.len() as u64;
                target.await_committed(committed)?;
                row.record(t, &moved.done, target.commit_ns() - commit_before);
                if moved.entries != u64::from(n) {
                    return Err(format!("{} connections moved of {n}", moved.entries));
                }
                let parts = (moved.done.iter()).map(|d| d.parts).sum::<u32>();
                shape = (moved.done.len(), parts);
            }
            row.between_moves(&target);
            rows.push(row);
            eprintln!(
                "loss {loss}: each move {} write(s), {} parts in all; the target's messages \
                 carried a threshold of {} at most",
                shape.0,
                shape.1,
                target.largest_threshold()
            );
            let held = table_entries(target.stop_program()?.as_ref(), stride);
            let relayed = LossyRelay::stop(relay)?;
            if held != want {
                return Err(format!(
                    "loss {loss}: switch {target_id} holds {} connections, not the source's {n}",
                    held.len()
                ));
            }
            eprintln!("loss {loss}: {relayed}");
        }
        source.stop_program()?;
    }
    Ok(rows)
}

/// A thread named `name` (what `perf report --sort comm` and `top -H` show) running `f`.
fn named<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> BenchResult<std::thread::JoinHandle<T>> {
    (std::thread::Builder::new().name(name.to_string()).spawn(f))
        .map_err(|e| format!("starting the {name} thread: {e}"))
}

/// Waits until the collector's copy of `switch`'s stream 0 has carried state 0 to its
/// end (`length` locations: the source's first refresh has gone by).
fn await_extent(client: &mut CollectorClient, switch: u32, length: u32) -> BenchResult<()> {
    let start = Instant::now();
    loop {
        let streams = client.streams().map_err(|e| e.to_string())?;
        let extent = (streams.streams.iter())
            .filter(|s| s.switch_id == switch && s.stream == 0)
            .flat_map(|s| &s.extents)
            .find(|e| e.state == 0)
            .map_or(0, |e| e.length);
        if extent >= length {
            return Ok(());
        }
        if start.elapsed() > Duration::from_secs(60) {
            return Err(format!(
                "switch {switch}'s copy reached {extent} of {length} locations in 60 s"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub fn main_migrate(a: BenchSyncMigrateArgs) -> BenchResult<()> {
    if a.moves == 0 || a.sizes.iter().any(|&n| n == 0 || n > CELLS) {
        return Err("--sizes: 1 to 65536 values; --moves above 0".into());
    }
    if a.migrate && a.sizes.iter().any(|&n| n != CELLS) {
        return Err(format!(
            "--migrate moves the whole sketch, {CELLS} values: give --sizes {CELLS}"
        ));
    }
    if let Some(l) = a.losses.iter().find(|l| !(0.0..=0.95).contains(*l)) {
        return Err(format!("--losses: {l} is not a share from 0 to 0.95"));
    }
    let loopback: SocketAddr = "127.0.0.1:0".parse().map_err(|_| "an address")?;
    let settings = CollectorSettings {
        max_locations: stateplane_sync::mirror::DEFAULT_MAX_LOCATIONS,
        listen: loopback,
        key_file: None,
        switches: None,
        report_every: Duration::from_millis(10),
        duration: None,
        dump: None,
        api: None,
        redis: None,
        redis_tls: None,
        metrics: None,
    };
    let bound = collector::bind(&settings)?;
    let collector_addr = bound.addr;
    let api = collector_api::serve(loopback, bound.handle())?;
    let stop = Arc::new(AtomicBool::new(false));
    let stopping = stop.clone();
    let collector_thread = named("collector", move || {
        collector::run(&settings, bound, stopping)
    })?;
    let mut client =
        CollectorClient::connect(&api.endpoint.to_string()).map_err(|e| e.to_string())?;

    let rows = if a.table {
        move_tables(&a, &mut client, collector_addr)?
    } else {
        move_values(&a, &mut client, collector_addr)?
    };
    stop.store(true, Ordering::Relaxed);
    collector_thread
        .join()
        .map_err(|_| "the collector's thread failed")??;

    if a.table {
        println!(
            "input: conntrack tables of each size's established connections on a source \
             switch, read from the collector's copy and written as entries (ctl sync \
             migrate's code) into another switch whose sync channel loses the share given \
             each way (a relay in this process; none at 0%); {} moves of each size, 0.2 s apart; a \
             move ends when the target has committed it; gRPC and UDP on loopback; checked: \
             every write committed, and each target's table holds every connection of the \
             source, word for word",
            a.moves
        );
    } else {
        println!(
            "input: hh's sketch of 65,536 counters holding random values (seed {}) on switch \
             1, {} into another switch whose sync channel loses the share given each way (a \
             relay in this process; none at 0%); {} moves of each size, 0.2 s apart; a move ends when \
             the target has committed it; gRPC and UDP on loopback; checked: every write \
             committed, and each target's register is the source's values",
            a.seed,
            if a.migrate {
                "moved whole by ctl sync migrate's call (read from the collector's copy and \
                 written inside the collector)"
            } else {
                "read from the collector's copy and written back through its API"
            },
            a.moves
        );
    }
    println!(
        "write: the collector's call to the target's answer that it committed; commit: the \
         target's worker placing the write; first: the first move's (for a table, the one \
         into a target without the entries, as a migration's is: the later moves replace \
         each entry's value where it is); pause: the longest its sync stage held the \
         target's worker in one go during the move (the commit, or the pass that sends the \
         write's changes back); the worker forwards nothing meanwhile"
    );
    let median = |v: &[f64]| crate::statistics::median(v.to_vec());
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let first = |v: &[f64]| v.first().copied().unwrap_or(0.0);
    let mut table = Table::new(
        &["loss", if a.table { "entries" } else { "values" }],
        &[
            "move median ms",
            "move max",
            "first move ms",
            "write median ms",
            "commit median ms",
            "first commit ms",
            "pause median ms",
            "sent/part",
        ],
    );
    let mut csv = Csv::new(if a.table {
        "loss,entries,move_median_ms,move_max_ms,first_move_ms,write_median_ms,write_max_ms,commit_median_ms,commit_max_ms,first_commit_ms,pause_median_ms,pause_max_ms,sent_per_part"
    } else {
        "loss,values,move_median_ms,move_max_ms,first_move_ms,write_median_ms,write_max_ms,commit_median_ms,commit_max_ms,first_commit_ms,pause_median_ms,pause_max_ms,sent_per_part"
    });
    for r in &rows {
        table.row(vec![
            format!("{:.0}%", r.loss * 100.0),
            r.values.to_string(),
            format!("{:.3}", median(&r.move_ms)),
            format!("{:.3}", max(&r.move_ms)),
            format!("{:.3}", first(&r.move_ms)),
            format!("{:.3}", median(&r.write_ms)),
            format!("{:.3}", median(&r.commit_ms)),
            format!("{:.3}", first(&r.commit_ms)),
            format!("{:.3}", median(&r.pause_ms)),
            format!("{:.2}", median(&r.sent_per_part)),
        ]);
        csv.row(format_args!(
            "{},{},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.3}",
            r.loss,
            r.values,
            median(&r.move_ms),
            max(&r.move_ms),
            first(&r.move_ms),
            median(&r.write_ms),
            max(&r.write_ms),
            median(&r.commit_ms),
            max(&r.commit_ms),
            first(&r.commit_ms),
            median(&r.pause_ms),
            max(&r.pause_ms),
            median(&r.sent_per_part)
        ));
    }
    table.print();
    if let Some(path) = &a.files.csv {
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let panels: Vec<Panel> = (a.losses.iter())
            .map(|&loss| Panel {
                title: format!("{:.0}% loss each way: a move, median", loss * 100.0),
                unit: "ms".into(),
                bars: (rows.iter().filter(|r| r.loss == loss))
                    .map(|r| (r.values.to_string(), median(&r.move_ms)))
                    .collect(),
            })
            .collect();
        a.files.write_chart(
            if a.table {
                "Sync: moving a connection table from one switch to another through the collector"
            } else {
                "Sync: moving a sketch from one switch to another through the collector"
            },
            &format!("{} moves of each size, real sockets on loopback", a.moves),
            &panels,
        )?;
    }
    Ok(())
}
