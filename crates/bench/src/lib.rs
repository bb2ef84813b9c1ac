//! The experiments and benchmarks of the `stateplane` command: each takes its arguments
//! (`clap`), runs, and prints a table, with CSV and a chart when asked.
//!
//! Owns: `bench` (Mpps per core on an in-memory replay), `bench_addonmiss`,
//! `bench_cache`, `bench_catalog`, `bench_flows`, `bench_lb` (what run-time backend
//! changes move), `bench_pipeline`, `bench_reload` (a reload's pause), `bench_sync` (the sync
//! cores' rate experiment, in virtual time), `bench_tables`,
//! `lab_bench` (real TCP through a lab), `draw` (`stateplane chart`: a script's CSV as
//! a chart); what they share: [`statistics`] (median, percentiles), [`results`] (the CSV
//! and chart files), `chart` (SVG bar charts) and [`classbench`] (rules and keys in
//! ClassBench's formats, for DPDK's classifier).
//!
//! Must never: be on a packet path (it drives the runtime and the programs as a user
//! would), or report a figure without the input it used.

pub mod bench;
pub mod bench_addonmiss;
pub mod bench_cache;
pub mod bench_catalog;
pub mod bench_flood;
pub mod bench_flow_model;
pub mod bench_flows;
pub mod bench_lb;
pub mod bench_pipeline;
pub mod bench_reload;
pub mod bench_replication;
pub mod bench_replication_store;
pub mod bench_snapshots;
pub mod bench_sync;
pub mod bench_sync_hh;
pub mod bench_sync_migrate;
pub mod bench_sync_reorder;
pub mod bench_tables;
pub mod chart;
pub mod classbench;
pub mod draw;
pub mod lab_bench;
pub mod lab_replication;
pub mod results;
pub mod statistics;

use stateplane_gen::{GenConfig, Workload, generate};

/// The error type of every experiment: a message a user can act on.
pub type BenchResult<T> = Result<T, String>;

/// A connection to the Redis server at `url` (an experiment's own, on loopback), to read
/// what a run left there.
pub(crate) fn redis_connection(url: &str) -> BenchResult<redis::Connection> {
    (redis::Client::open(url).and_then(|c| c.get_connection()))
        .map_err(|e| format!("the Redis server at {url}: {e}"))
}

/// A directory of a run's own under the system's temporary directory (traces, configs,
/// captures), removed when dropped: at the end of the run, and also when it returns early
/// with an error, so that no run leaves its gigabytes behind.
pub struct Scratch {
    path: std::path::PathBuf,
}

impl Scratch {
    /// `stateplane-NAME-PID`, made afresh.
    pub fn new(name: &str) -> BenchResult<Scratch> {
        let path = std::env::temp_dir().join(format!("stateplane-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Scratch { path })
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Generates `packets` of `workload` (a name, checked: errors name `--workloads`) with
/// `seed`, in memory, and hands each one that parses to `each` with its time and bytes:
/// the benchmarks' traces.
pub fn each_parsed(
    workload: &str,
    packets: u64,
    seed: u64,
    mut each: impl FnMut(u64, &stateplane_wire::Parsed, &[u8]),
) -> BenchResult<()> {
    let w: Workload = workload
        .parse()
        .map_err(|e: stateplane_gen::GenError| format!("--workloads: {}", e.problem))?;
    let mut cfg = GenConfig::new(w, packets);
    cfg.seed = seed;
    let hasher = stateplane_wire::FlowHasher::with_seed(seed);
    let frame_parsed = |ts_ns, frame: &[u8]| {
        if let Ok(p) = stateplane_wire::parse(frame, 0, &hasher) {
            each(ts_ns, &p, frame);
        }
        Ok(())
    };
    generate(&cfg, frame_parsed, |_| {}).map_err(|e| e.to_string())?;
    Ok(())
}

/// Runs `frames`, arriving on `port`, through `program` 64 at a time (one worker's
/// bursts): each one's verdict and bytes as the program left them.
pub(crate) fn run_frames(
    program: &mut dyn stateplane_runtime::Running,
    frames: &[Vec<u8>],
    port: u16,
) -> Vec<(stateplane_runtime::Verdict, Vec<u8>)> {
    use stateplane_runtime::{Burst, Context};
    let hasher = stateplane_wire::FlowHasher::with_seed(1);
    let mut out = Vec::with_capacity(frames.len());
    for chunk in frames.chunks(64) {
        let mut burst = Burst::with_capacity(chunk.len());
        for (i, f) in chunk.iter().enumerate() {
            burst.push(f, f.len() as u32, 1, port, i as u64);
        }
        burst.parse(&hasher);
        let mut ctx = Context::one_worker(1, hasher, 2);
        program.process(&mut burst, &mut ctx);
        for i in 0..burst.len() {
            out.push((burst.descs()[i].verdict, burst.data(i).to_vec()));
        }
    }
    out
}
