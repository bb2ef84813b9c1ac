//! `stateplane bench-pipeline`: the `pipeline` program on one core, replaying a generated
//! trace from memory through an ACL of ClassBench-like rules and an Internet-sized FIB
//! (FlowShadow's section IV on our software). Three experiments, in one run:
//!
//! * speed-up: Mpps with the cache in each consistency mode against the same rules with
//!   no cache (`off`), on the two-table pipeline;
//! * update rate: Mpps of each mode while a share of all rules (0 to 10% per second) is
//!   modified between bursts, with the longest single update against a burst's time;
//! * tables: Mpps of each mode with 1 to 4 tables;
//! * lookup: the cache's lookup speed alone (the paper's), classifications of the trace's
//!   keys per second with a warm cache, no packet handling; and with two workers, each
//!   with its own cache over its shard of the flows (split by the flow hash, as a NIC's
//!   RSS would), against the shards' balance: the keys over the larger shard, which two
//!   workers each as fast as one would give (`lookup2`, with `--two-workers`).
//!
//! Each run replays the trace through real packet handling: frames copied into bursts,
//! parsed, classified, rewritten (dec_ttl, MACs) and given a verdict, as the runtime's
//! workers do. With no updates, every mode's verdicts and output bytes must equal `off`'s
//! (a digest of them is compared), so a fast wrong cache cannot pass.

use crate::BenchResult;
use crate::classbench;
use crate::results::{Csv, ResultFiles, Table};
use crate::statistics::{median, percentile};
use stateplane_classifier::{
    Action, CachedPipeline, Consistency, Fields, Rule, RuleId, RuleSet, parse_rule,
};
use stateplane_gen::rng::Rng;
use stateplane_gen::{GenConfig, Workload, generate};
use stateplane_programs::pipeline::{Pipeline, consistency};
use stateplane_runtime::{Burst, Context, Program, Verdict};
use stateplane_wire::FlowHasher;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct BenchPipelineArgs {
    /// Workloads of the generated traces (internet, datacenter).
    #[arg(long, value_delimiter = ',', default_value = "internet,datacenter")]
    pub workloads: Vec<String>,
    /// Packets in the trace.
    #[arg(long, default_value_t = 2_000_000)]
    pub packets: u64,
    /// Times each run replays the trace (the cache stays warm from one to the next).
    #[arg(long, default_value_t = 1)]
    pub loops: usize,
    /// ClassBench-like ACL rules in table 0 (stateplane_state::ternary::acl_rules).
    #[arg(long, default_value_t = 750)]
    pub acl_rules: usize,
    /// Generated Internet-like IPv4 prefixes in table 1 (stateplane_state::prefixes), besides
    /// the routes of the trace's own addresses.
    #[arg(long, default_value_t = 400_000)]
    pub fib_prefixes: usize,
    /// Microflow cache entries (a power of two) and ways (the pipeline program's defaults).
    #[arg(long, default_value_t = stateplane_programs::pipeline::DEFAULT_CACHE_ENTRIES)]
    pub cache_entries: usize,
    /// Ways of each set of the flow cache: 1, 2 or 4.
    #[arg(long, default_value_t = stateplane_programs::pipeline::DEFAULT_CACHE_WAYS)]
    pub cache_ways: usize,
    /// Consistency modes to measure (off is always measured: it is the reference).
    #[arg(long, value_delimiter = ',', default_value = "action,cookie,strong")]
    pub modes: Vec<String>,
    /// Rules modified per second, as percentages of all rules (internet trace only).
    #[arg(long, value_delimiter = ',', default_value = "0,0.1,1,10")]
    pub update_rates: Vec<f64>,
    /// What an update does: `modify` gives a rule new actions; `reinsert` deletes a rule
    /// and adds it again with them (the classifier's inserts and removes, and the cache's
    /// invalidation of both).
    #[arg(long, value_enum, default_value_t = UpdateKind::Modify)]
    pub update_kind: UpdateKind,
    /// Table counts of the tables experiment (internet trace only, no updates).
    #[arg(long, value_delimiter = ',', default_value = "1,2,3,4")]
    pub tables: Vec<usize>,
    /// Packets a worker takes at a time.
    #[arg(long, default_value_t = 64)]
    pub burst: usize,
    /// Repeat each measurement and report the median.
    #[arg(long, default_value_t = 3)]
    pub repeat: usize,
    /// Seed of the traces and random draws: the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Measure only the modes given, without `off` (for profiling one mode): results are
    /// then not checked against the tables alone.
    #[arg(long, hide = true)]
    pub no_reference: bool,
    /// Replay this capture instead of generating traces.
    #[arg(long, conflicts_with = "workloads")]
    pub trace: Option<PathBuf>,
    /// Take the pipeline's rules from this file (one per line) instead of generating them;
    /// the table-count experiment is then skipped.
    #[arg(long)]
    pub rules_file: Option<PathBuf>,
    /// Write the generated two-table rules to this file and stop (to run the same rules
    /// elsewhere, as scripts/compare-ovs.sh does).
    #[arg(long)]
    pub write_rules: Option<PathBuf>,
    /// Write the rules (one table's, IPv4 5-tuple rules only) and the trace's keys in
    /// ClassBench's formats to this directory, with the rule each key matches here, and
    /// stop (for dpdk-test-acl, as scripts/compare-dpdk.sh does).
    #[arg(long, requires = "trace")]
    pub write_classbench: Option<PathBuf>,
    /// Generate only rules Open vSwitch also takes: ports matched exactly and only under
    /// TCP or UDP (no ranges).
    #[arg(long)]
    pub ovs_compatible: bool,
    /// Also measure the lookups with two workers, each with its own cache over its shard
    /// of the flows, against the shards' balance (experiment `lookup2`).
    #[arg(long)]
    pub two_workers: bool,
    #[command(flatten)]
    pub files: ResultFiles,
}

/// What the update experiment does to a rule.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum UpdateKind {
    Modify,
    Reinsert,
}

/// One measurement's result.
struct Row {
    experiment: &'static str,
    workload: String,
    mode: Consistency,
    tables: usize,
    /// Rules modified per second, in percent of all rules.
    update_pct: f64,
    mpps: f64,
    /// Against `off` in the same rounds (median of the rounds' ratios).
    speedup: f64,
    /// With updates: against the same mode with none in the same rounds (median ratio).
    vs_still: f64,
    /// The share of packets given an output port.
    forwarded: f64,
    hit_rate: f64,
    updates: u64,
    /// Single updates' 99th and 99.9th percentiles and longest (which a shared machine's
    /// preemptions dominate), and the median burst, in microseconds.
    p99_update_us: f64,
    p999_update_us: f64,
    max_update_us: f64,
    median_burst_us: f64,
    /// `lookup2`: against one worker in the same rounds (median of the rounds' ratios),
    /// and the shards' balance, the bound of that ratio.
    vs_one_worker: f64,
    balance: f64,
    /// With updates: packets whose verdict and bytes were checked against the tables
    /// alone given the same updates (any other, and the run fails).
    checked: u64,
}

/// A trace in memory: frames back to back, and where each one is.
struct Trace {
    bytes: Vec<u8>,
    frames: Vec<(usize, usize)>,
}

impl Trace {
    /// Each frame's fields as the pipeline reads them and its flow hash; none for a frame
    /// that does not parse.
    fn keys(&self) -> impl Iterator<Item = Option<(Fields, u64)>> + '_ {
        let hasher = FlowHasher::with_seed(7);
        self.frames.iter().map(move |&(at, len)| {
            let frame = &self.bytes[at..at + len];
            let parsed = stateplane_wire::parse(frame, 0, &hasher).ok()?;
            Some((Fields::of(&parsed, frame, 0), parsed.hash))
        })
    }
}

/// A capture file's frames, in memory.
fn read_trace(path: &std::path::Path) -> BenchResult<Trace> {
    let file = std::fs::File::open(path).map_err(|e| format!("--trace {}: {e}", path.display()))?;
    let mut reader = stateplane_io::CaptureReader::new(std::io::BufReader::new(file))
        .map_err(|e| format!("--trace {}: {e}", path.display()))?;
    let mut t = Trace {
        bytes: Vec::new(),
        frames: Vec::new(),
    };
    while let Some(r) = reader
        .next_record()
        .map_err(|e| format!("--trace {}: {e}", path.display()))?
    {
        t.frames.push((t.bytes.len(), r.data.len()));
        t.bytes.extend_from_slice(r.data);
    }
    Ok(t)
}

fn load_trace(workload: &str, a: &BenchPipelineArgs) -> BenchResult<Trace> {
    if let Some(path) = &a.trace {
        return read_trace(path);
    }
    let w: Workload = workload
        .parse()
        .map_err(|e: stateplane_gen::GenError| format!("--workloads: {}", e.problem))?;
    let mut cfg = GenConfig::new(w, a.packets);
    cfg.seed = a.seed;
    cfg.packet_size = Some(64);
    cfg.ipv6_share = 0.0;
    let mut t = Trace {
        bytes: Vec::new(),
        frames: Vec::new(),
    };
    generate(
        &cfg,
        |_, f| {
            t.frames.push((t.bytes.len(), f.len()));
            t.bytes.extend_from_slice(f);
            Ok(())
        },
        |_| {},
    )
    .map_err(|e| e.to_string())?;
    Ok(t)
}

/// The rule text of a pipeline of `tables` tables: the ACL (permit: on to the FIB, deny:
/// drop), the FIB (routes for the trace's /24s and a default, over the generated
/// prefixes; dec_ttl, next hop's MAC, output), and policy tables of port-range rules that
/// rewrite the source MAC.
fn rule_lines(a: &BenchPipelineArgs, tables: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let last = tables - 1;
    let on = |from: usize| {
        if from < last {
            format!(",goto_table:{}", from + 1)
        } else {
            String::new()
        }
    };
    let permit = if tables == 1 {
        "output:1".to_string()
    } else {
        "goto_table:1".to_string()
    };
    for r in stateplane_state::ternary::acl_rules(a.acl_rules, a.seed) {
        let mut words = vec![format!("table=0,priority={},ip", 100 + r.priority)];
        if let Some(p) = r.proto {
            words.push(format!("nw_proto={p}"));
        }
        for (name, addr, len) in [("nw_src", r.src, r.src_len), ("nw_dst", r.dst, r.dst_len)] {
            if len > 0 {
                words.push(format!("{name}={}/{len}", std::net::Ipv4Addr::from(addr)));
            }
        }
        for (name, (lo, hi)) in [("tp_src", r.src_ports), ("tp_dst", r.dst_ports)] {
            if (lo, hi) == (0, u16::MAX) {
                continue;
            }
            if !a.ovs_compatible {
                words.push(format!("{name}={lo}-{hi}"));
            } else if lo == hi && matches!(r.proto, Some(6 | 17)) {
                // Open vSwitch matches a port only under TCP or UDP, and has no ranges.
                words.push(format!("{name}={lo}"));
            }
        }
        // One rule in eight denies, as an ACL's exceptions do.
        let action = if r.action % 8 == 7 { "drop" } else { &permit };
        lines.push(format!("{},actions={action}", words.join(",")));
    }
    lines.push(format!("table=0,priority=0,ip,actions={permit}"));
    if tables >= 2 {
        let route = |prefix: String, len: u8, port: u8| {
            format!(
                "table=1,priority={len},ip,nw_dst={prefix}/{len},actions=dec_ttl,mod_dl_dst:02:00:00:00:0b:{port:02x},output:{port}{}",
                on(1)
            )
        };
        // The trace's /24s, and the generated prefixes that are not one of them (a rule
        // file holds one rule of a table, priority and match).
        let mut routes = std::collections::BTreeMap::new();
        for (p, len, v) in stateplane_state::prefixes::ipv4(a.fib_prefixes, a.seed) {
            routes.insert((p, len), 1 + (v % 2) as u8);
        }
        for third in 0..=255u32 {
            for second in [18u32, 19] {
                let port = 1 + ((third + second) % 2) as u8;
                let p = std::net::Ipv4Addr::from(198 << 24 | second << 16 | third << 8);
                routes.insert((p, 24), port);
            }
        }
        for ((p, len), port) in routes {
            lines.push(route(p.to_string(), len, port));
        }
        lines.push(route("0.0.0.0".into(), 0, 1));
    }
    for t in 2..tables {
        let mut rng = Rng::new(a.seed + t as u64);
        for i in 0..100 {
            let lo = rng.below(60_000) as u16;
            let hi = lo + rng.below(5_000) as u16;
            lines.push(format!(
                "table={t},priority={},tcp,tp_dst={lo}-{hi},actions=mod_dl_src:02:00:00:00:{t:02x}:{i:02x}{}",
                200 - i,
                on(t)
            ));
        }
        lines.push(format!(
            "table={t},priority=0,actions=mod_dl_src:02:00:00:00:{t:02x}:ff{}",
            on(t)
        ));
    }
    lines
}

fn rule_set(a: &BenchPipelineArgs, tables: usize) -> BenchResult<RuleSet> {
    let mut rules = RuleSet::new(tables);
    for line in rule_lines(a, tables) {
        let rule = parse_rule(&line).map_err(|e| format!("generated rule {line}: {e}"))?;
        rules
            .insert(rule)
            .map_err(|e| format!("generated rule {line}: {e}"))?;
    }
    Ok(rules)
}

/// Changes a random rule between bursts at a steady rate, by a modify or by deleting it
/// and adding it again: a FIB route moves to the other next hop, any other rule gets its
/// own actions again (which invalidates all the same).
struct Updater {
    ids: Vec<RuleId>,
    per_second: f64,
    kind: UpdateKind,
    done: u64,
    /// How long each update held the worker.
    took_ns: Vec<u64>,
    rng: Rng,
}

impl Updater {
    fn new(flows: &CachedPipeline, pct: f64, seed: u64) -> Updater {
        let ids: Vec<RuleId> = flows.rules().rules().map(|(id, _)| id).collect();
        Updater {
            per_second: ids.len() as f64 * pct / 100.0,
            kind: UpdateKind::Modify,
            ids,
            done: 0,
            took_ns: Vec::new(),
            rng: Rng::new(seed),
        }
    }

    /// Makes the updates due by `elapsed_s` seconds of the worker's time, at most as many
    /// as there are rules; what it changed, for a reference to change alike. The worker's
    /// time includes its updates, so a worker slower at them than the rate asks would
    /// owe more after each catch-up than before, without end: the bound keeps a slow or
    /// busy machine to fewer updates (`done` says how many) instead of a runaway.
    fn catch_up(&mut self, flows: &mut CachedPipeline, elapsed_s: f64) -> Vec<Change> {
        let due = ((elapsed_s * self.per_second) as u64).min(self.done + self.ids.len() as u64);
        let mut made = Vec::new();
        while self.done < due && !self.ids.is_empty() {
            let at = self.rng.below(self.ids.len() as u64) as usize;
            let id = self.ids[at];
            let t = Instant::now();
            if let Some(rule) = flows.rules().get(id) {
                let actions: Vec<Action> = (rule.actions.iter())
                    .map(|a| match *a {
                        Action::Output(p @ 1..=2) => Action::Output(3 - p),
                        other => other,
                    })
                    .collect();
                if self.kind == UpdateKind::Reinsert {
                    let rule = Rule {
                        actions,
                        ..rule.clone()
                    };
                    flows.remove(id);
                    if let Ok(new) = flows.insert(rule.clone()) {
                        self.ids[at] = new;
                        made.push(Change::Reinsert(id, rule));
                    }
                } else {
                    let goto = rule.goto;
                    let _ = flows.modify(id, actions.clone(), goto);
                    made.push(Change::Modify(id, actions, goto));
                }
            }
            self.took_ns.push(t.elapsed().as_nanos() as u64);
            self.done += 1;
        }
        made
    }
}

/// An update as the reference makes it again: a rule's new actions and goto, or a rule
/// deleted and added again (with new actions).
enum Change {
    Modify(RuleId, Vec<Action>, Option<u8>),
    Reinsert(RuleId, Rule),
}

impl Change {
    fn make(&self, flows: &mut CachedPipeline) {
        match self {
            Change::Modify(id, actions, goto) => {
                let _ = flows.modify(*id, actions.clone(), *goto);
            }
            Change::Reinsert(id, rule) => {
                flows.remove(*id);
                let _ = flows.insert(rule.clone());
            }
        }
    }
}

/// The tables alone (`off`), fed the bursts a timed run was fed with the updates it made
/// after each, in a pass of its own after that run (so that its work shares no cache
/// with the run's): every burst must come out as the run's did.
struct Reference {
    pipeline: Pipeline,
    /// Bursts whose packets' verdicts or rewritten bytes differed from the reference's.
    stale: u64,
}

impl Reference {
    fn new(rules: &RuleSet) -> BenchResult<Reference> {
        Ok(Reference {
            pipeline: Pipeline::with_rules(rules.clone(), Consistency::Off, 1, 1)
                .map_err(|e| format!("the reference pipeline: {e}"))?,
            stale: 0,
        })
    }

    /// Replays what `run` replayed, burst by burst, making its updates where it made
    /// them; counts the bursts that come out otherwise.
    fn check(&mut self, trace: &Trace, loops: usize, burst_size: usize, run: &Replay) {
        let mut ctx = Context::one_worker(0, FlowHasher::with_seed(7), 4);
        let mut burst = Burst::with_capacity(burst_size);
        let mut changes = run.changes.iter().peekable();
        let chunks = std::iter::repeat_n(&trace.frames, loops).flat_map(|f| f.chunks(burst_size));
        for (i, chunk) in chunks.enumerate() {
            let (digest, _) = run_burst(&mut self.pipeline, &mut ctx, &mut burst, trace, chunk);
            if run.bursts.get(i) != Some(&digest) {
                self.stale += 1;
            }
            while let Some((_, made)) = changes.next_if(|(at, _)| *at == i) {
                for change in made {
                    change.make(self.pipeline.flows_mut());
                }
            }
        }
    }
}

/// What one replay of the trace gave.
struct Replay {
    seconds: f64,
    packets: u64,
    /// A digest of every packet's verdict and output bytes, in order.
    digest: u64,
    /// Packets given an output port.
    forwarded: u64,
    burst_ns: Vec<u64>,
    /// Each burst's digest, and the updates made after a burst (by its index).
    bursts: Vec<u64>,
    changes: Vec<(usize, Vec<Change>)>,
}

/// Copies `chunk` of `trace` into `burst` and has `pipeline` parse and process it: a
/// digest of its packets' verdicts and of the bytes their actions rewrite (the next hop's
/// MAC, the TTL), and the packets forwarded.
fn run_burst(
    pipeline: &mut Pipeline,
    ctx: &mut Context,
    burst: &mut Burst,
    trace: &Trace,
    chunk: &[(usize, usize)],
) -> (u64, u64) {
    let hasher = FlowHasher::with_seed(7);
    burst.clear();
    for (i, &(at, len)) in chunk.iter().enumerate() {
        burst.push(&trace.bytes[at..at + len], len as u32, 0, 0, i as u64);
    }
    burst.parse(&hasher);
    pipeline.process(burst, ctx);
    let (mut digest, mut forwarded) = (0xcbf2_9ce4_8422_2325u64, 0);
    for (d, data) in burst.iter() {
        let v = match d.verdict {
            Verdict::Forward(p) => {
                forwarded += 1;
                u64::from(p)
            }
            Verdict::Drop(r) => 0x100 | u64::from(r.0),
            _ => 0x200,
        };
        digest = (digest ^ v ^ u64::from(data[5]) ^ u64::from(data[22]) << 8)
            .wrapping_mul(0x0100_0000_01b3);
    }
    (digest, forwarded)
}

/// Replays `trace` `loops` times through `pipeline`, making `updater`'s updates between
/// bursts (the time measured is the bursts' and the updates').
fn replay(
    pipeline: &mut Pipeline,
    trace: &Trace,
    loops: usize,
    burst_size: usize,
    updater: &mut Updater,
) -> Replay {
    let mut ctx = Context::one_worker(0, FlowHasher::with_seed(7), 4);
    let mut burst = Burst::with_capacity(burst_size);
    let mut digest = 0xcbf2_9ce4_8422_2325u64;
    let mut forwarded = 0;
    let mut burst_ns = Vec::with_capacity(trace.frames.len() / burst_size + 1);
    let mut bursts = Vec::with_capacity(trace.frames.len() / burst_size + 1);
    let mut changes = Vec::new();
    let mut timed = std::time::Duration::ZERO;
    let chunks = std::iter::repeat_n(&trace.frames, loops).flat_map(|f| f.chunks(burst_size));
    for (i, chunk) in chunks.enumerate() {
        let t = Instant::now();
        ctx.now_ns = timed.as_nanos() as u64;
        let (d, f) = run_burst(pipeline, &mut ctx, &mut burst, trace, chunk);
        (digest, forwarded) = ((digest ^ d).wrapping_mul(0x0100_0000_01b3), forwarded + f);
        burst_ns.push(t.elapsed().as_nanos() as u64);
        let made = updater.catch_up(pipeline.flows_mut(), (timed + t.elapsed()).as_secs_f64());
        timed += t.elapsed();
        bursts.push(d);
        if !made.is_empty() {
            changes.push((i, made));
        }
    }
    Replay {
        seconds: timed.as_secs_f64(),
        packets: (trace.frames.len() * loops) as u64,
        digest,
        forwarded,
        burst_ns,
        bursts,
        changes,
    }
}

/// Writes `rules` (rule lines in rank order), `trace` (the trace's IPv4 keys) and
/// `expected` (for each key, the line of `rules` it matches here from 0, or 4294967295
/// for none, as dpdk-test-acl prints its results) in ClassBench's formats to `dir`.
fn write_classbench(dir: &std::path::Path, trace: &Trace, rules: &RuleSet) -> BenchResult<()> {
    let fail = |e: std::io::Error| format!("--write-classbench {}: {e}", dir.display());
    std::fs::create_dir_all(dir).map_err(fail)?;
    let mut rule_text = String::new();
    let mut line_of = std::collections::HashMap::new();
    for (at, (id, rule)) in rules.rules().enumerate() {
        let line = classbench::rule_line(rule).map_err(|e| format!("--write-classbench: {e}"))?;
        rule_text += &line;
        rule_text.push('\n');
        line_of.insert(id, at as u32);
    }
    let (mut trace_text, mut expected) = (String::new(), String::new());
    let (mut keys, mut left_out) = (0u64, 0u64);
    for key in trace.keys() {
        let line = key.and_then(|(k, _)| Some((classbench::trace_line(&k)?, k)));
        let Some((line, k)) = line else {
            left_out += 1;
            continue;
        };
        let matched = rules
            .classify(&k)
            .rules
            .first()
            .map_or(u32::MAX, |id| line_of[id]);
        trace_text += &line;
        trace_text.push('\n');
        expected += &format!("{matched}\n");
        keys += 1;
    }
    for (name, text) in [
        ("rules", rule_text),
        ("trace", trace_text),
        ("expected", expected),
    ] {
        std::fs::write(dir.join(name), text).map_err(fail)?;
    }
    eprintln!(
        "wrote {} rules and {keys} keys ({left_out} packets not IPv4 left out) to {}",
        rules.len(),
        dir.display()
    );
    Ok(())
}

/// The paper's lookup speed: classifications per second of the trace's keys alone (no
/// packet copy, parse or rewrite), counters included, after one pass that warms the
/// cache; every mode in each round, as [`measure`] does.
fn lookups(
    a: &BenchPipelineArgs,
    workload: &str,
    trace: &Trace,
    rules: &RuleSet,
    modes: &[Consistency],
) -> BenchResult<Vec<Row>> {
    let mut keys: Vec<Fields> = Vec::new();
    let mut shards: [Vec<Fields>; 2] = [Vec::new(), Vec::new()];
    for (k, hash) in trace.keys().flatten() {
        keys.push(k);
        shards[stateplane_wire::flow::shard_of(hash, 2)].push(k);
    }
    let balance = keys.len() as f64 / shards.iter().map(Vec::len).max().unwrap_or(1).max(1) as f64;
    let fresh = |mode| {
        CachedPipeline::new(rules.clone(), mode, a.cache_entries, a.cache_ways, a.seed)
            .map_err(|e| format!("--cache-entries/--cache-ways: {e}"))
    };
    // Classifies `keys` once to warm the cache, then again timed: seconds, and hits then.
    let timed = |p: &mut CachedPipeline, keys: &[Fields], start: &std::sync::Barrier| {
        for k in keys {
            p.classify(k, 64, 0);
        }
        let before = p.cache_stats().hits;
        start.wait();
        let t = Instant::now();
        let mut outputs = 0usize;
        for k in keys {
            outputs += p.classify(k, 64, 0).actions.len();
        }
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(outputs);
        (secs, p.cache_stats().hits - before)
    };
    let mut runs: Vec<Runs> = modes.iter().map(|_| Runs::default()).collect();
    // Per mode, two workers' rounds: M lookups/s, ratio to one worker, hit rate.
    let mut two: Vec<(Vec<f64>, Vec<f64>, Vec<f64>)> =
        modes.iter().map(|_| Default::default()).collect();
    for _ in 0..a.repeat {
        for (m, &mode) in modes.iter().enumerate() {
            let mut p = fresh(mode)?;
            let (secs, hits) = timed(&mut p, &keys, &std::sync::Barrier::new(1));
            let one = keys.len() as f64 / secs / 1e6;
            runs[m].mpps.push(one);
            runs[m].hits.push(hits as f64 / keys.len().max(1) as f64);
            if !a.two_workers {
                eprintln!(
                    "  lookup   {workload:<10} {:<6}: {one:.2} M lookups/s",
                    mode_name(mode)
                );
                continue;
            }
            // Two workers, each its own cache and shard, started together; done when the
            // slower is.
            let mut caches = [fresh(mode)?, fresh(mode)?];
            let start = std::sync::Barrier::new(2);
            let (slowest, hits) = std::thread::scope(|scope| {
                let runs: Vec<_> = (caches.iter_mut().zip(&shards))
                    .map(|(p, shard)| scope.spawn(|| timed(p, shard, &start)))
                    .collect();
                runs.into_iter()
                    .map(|r| r.join().unwrap_or((f64::INFINITY, 0)))
                    .fold((0.0, 0), |(t, h), (secs, hits)| (secs.max(t), h + hits))
            });
            let both = keys.len() as f64 / slowest / 1e6;
            two[m].0.push(both);
            two[m].1.push(both / one);
            two[m].2.push(hits as f64 / keys.len().max(1) as f64);
            eprintln!(
                "  lookup   {workload:<10} {:<6}: {one:.2} M lookups/s, two workers {both:.2} ({:.2}x; shards' balance {balance:.2}x)",
                mode_name(mode),
                both / one
            );
        }
    }
    let off = modes.iter().position(|&m| m == Consistency::Off);
    Ok(modes
        .iter()
        .zip(&runs)
        .map(|(&mode, run)| Row {
            experiment: "lookup",
            workload: workload.to_string(),
            mode,
            tables: rules.tables(),
            update_pct: 0.0,
            mpps: median(run.mpps.clone()),
            speedup: off.map_or(f64::NAN, |o| {
                median(
                    run.mpps
                        .iter()
                        .zip(&runs[o].mpps)
                        .map(|(m, b)| m / b)
                        .collect(),
                )
            }),
            vs_still: f64::NAN,
            forwarded: f64::NAN,
            hit_rate: median(run.hits.clone()),
            updates: 0,
            p99_update_us: 0.0,
            p999_update_us: 0.0,
            max_update_us: 0.0,
            median_burst_us: 0.0,
            vs_one_worker: f64::NAN,
            balance: f64::NAN,
            checked: 0,
        })
        .chain((modes.iter().zip(&two)).filter(|_| a.two_workers).map(
            |(&mode, (mpps, ratios, hits))| Row {
                experiment: "lookup2",
                workload: workload.to_string(),
                mode,
                tables: rules.tables(),
                update_pct: 0.0,
                mpps: median(mpps.clone()),
                speedup: f64::NAN,
                vs_still: f64::NAN,
                forwarded: f64::NAN,
                hit_rate: median(hits.clone()),
                updates: 0,
                p99_update_us: 0.0,
                p999_update_us: 0.0,
                max_update_us: 0.0,
                median_burst_us: 0.0,
                vs_one_worker: median(ratios.clone()),
                balance,
                checked: 0,
            },
        ))
        .collect())
}

/// Updates the update experiment times in each mode, over its rounds, at least: its
/// p99.9 then rests on two or more of them.
const UPDATE_SAMPLES: f64 = 2_000.0;
/// Loops a run makes at most to reach them (at low rates the samples are then fewer, and
/// the row says how many there were).
const MAX_LOOPS: usize = 100;

/// The loops of a run at `per_loop` updates a loop for its rounds to make
/// [`UPDATE_SAMPLES`] updates, from `--loops` to [`MAX_LOOPS`].
fn loops_for_samples(per_loop: f64, a: &BenchPipelineArgs) -> usize {
    let per_round = UPDATE_SAMPLES / a.repeat as f64;
    let loops = (per_round / per_loop.max(1e-9)).ceil();
    (loops.min(MAX_LOOPS as f64) as usize).max(a.loops)
}

/// One mode's runs of a configuration.
#[derive(Default)]
struct Runs {
    mpps: Vec<f64>,
    /// With updates: the same mode's Mpps with none, in the same round.
    still: Vec<f64>,
    forwarded: f64,
    hits: Vec<f64>,
    bursts: Vec<f64>,
    took: Vec<u64>,
    updates: u64,
    /// Packets checked against the tables alone while updates ran (none stale, or the
    /// run fails).
    checked: u64,
}

/// Measures a configuration in every mode, `repeat` rounds of one run per mode (a fresh
/// pipeline each time: a cold cache), the modes interleaved so that the machine's noise
/// falls on all of them alike. A mode's speed-up is the median over rounds of its Mpps
/// over `off`'s in the same round. With no updates, each run's verdicts and bytes must
/// equal `off`'s.
#[allow(clippy::too_many_arguments)]
fn measure(
    a: &BenchPipelineArgs,
    experiment: &'static str,
    workload: &str,
    trace: &Trace,
    rules: &RuleSet,
    modes: &[Consistency],
    update_pct: f64,
) -> BenchResult<Vec<Row>> {
    let mut runs: Vec<Runs> = modes.iter().map(|_| Runs::default()).collect();
    for r in 0..a.repeat {
        let mut reference = None;
        for (m, &mode) in modes.iter().enumerate() {
            let fresh = || {
                Pipeline::with_rules(rules.clone(), mode, a.cache_entries, a.cache_ways)
                    .map_err(|e| format!("--cache-entries/--cache-ways: {e}"))
            };
            let mut loops = a.loops;
            if update_pct > 0.0 {
                let mut p = fresh()?;
                let mut none = Updater::new(p.flows(), 0.0, 0);
                let mut still = replay(&mut p, trace, a.loops, a.burst, &mut none);
                let per_second = Updater::new(p.flows(), update_pct, 0).per_second;
                loops = loops_for_samples(per_second * still.seconds / a.loops as f64, a);
                if loops > a.loops {
                    // The same loops as the run with updates: the cache warms over loops.
                    let mut p = fresh()?;
                    still = replay(&mut p, trace, loops, a.burst, &mut none);
                }
                runs[m]
                    .still
                    .push(still.packets as f64 / still.seconds / 1e6);
            }
            let mut p = fresh()?;
            let mut updater = Updater::new(p.flows(), update_pct, a.seed + r as u64);
            updater.kind = a.update_kind;
            let run = replay(&mut p, trace, loops, a.burst, &mut updater);
            if update_pct > 0.0 {
                let mut check = Reference::new(rules)?;
                check.check(trace, loops, a.burst, &run);
                if check.stale > 0 {
                    return Err(format!(
                        "{workload}, {} cache, {update_pct}% of rules modified a second: {} of {} bursts gave other verdicts or bytes than the tables alone given the same updates",
                        mode_name(mode),
                        check.stale,
                        run.bursts.len()
                    ));
                }
                runs[m].checked += run.packets;
            }
            if update_pct == 0.0 && run.digest != *reference.get_or_insert(run.digest) {
                return Err(format!(
                    "{workload}, {} tables: the {} cache gave other verdicts or bytes than the tables alone",
                    rules.tables(),
                    mode_name(mode)
                ));
            }
            let out = &mut runs[m];
            out.mpps.push(run.packets as f64 / run.seconds / 1e6);
            out.hits
                .push(p.flows().cache_stats().hits as f64 / run.packets.max(1) as f64);
            out.took.extend(&updater.took_ns);
            let mut b = run.burst_ns;
            b.sort_unstable();
            out.bursts
                .push(b.get(b.len() / 2).copied().unwrap_or(0) as f64 / 1e3);
            // Over every round.
            out.updates += updater.done;
            out.forwarded = run.forwarded as f64 / run.packets.max(1) as f64;
            eprintln!(
                "  {experiment:<8} {workload:<10} {:<6} tables={} updates={update_pct}%/s, round {}: {:.2} Mpps",
                mode_name(mode),
                rules.tables(),
                r + 1,
                out.mpps[r]
            );
        }
    }
    let off = modes.iter().position(|&m| m == Consistency::Off);
    Ok(modes
        .iter()
        .zip(&runs)
        .map(|(&mode, run)| {
            let speedup = off.map_or(f64::NAN, |o| {
                median(
                    (run.mpps.iter().zip(&runs[o].mpps))
                        .map(|(m, b)| m / b)
                        .collect(),
                )
            });
            let mut took = run.took.clone();
            let vs_still = if run.still.is_empty() {
                f64::NAN
            } else {
                median(
                    run.mpps
                        .iter()
                        .zip(&run.still)
                        .map(|(m, b)| m / b)
                        .collect(),
                )
            };
            Row {
                experiment,
                workload: workload.to_string(),
                mode,
                tables: rules.tables(),
                update_pct,
                mpps: median(run.mpps.clone()),
                speedup,
                vs_still,
                forwarded: run.forwarded,
                hit_rate: median(run.hits.clone()),
                updates: run.updates,
                p99_update_us: percentile(&mut took, 0.99) as f64 / 1e3,
                p999_update_us: percentile(&mut took, 0.999) as f64 / 1e3,
                max_update_us: took.iter().copied().max().unwrap_or(0) as f64 / 1e3,
                median_burst_us: median(run.bursts.clone()),
                vs_one_worker: f64::NAN,
                balance: f64::NAN,
                checked: run.checked,
            }
        })
        .collect())
}

fn mode_name(m: Consistency) -> &'static str {
    match m {
        Consistency::Off => "off",
        Consistency::Action => "action",
        Consistency::Cookie => "cookie",
        Consistency::Strong => "strong",
    }
}

pub fn main(a: BenchPipelineArgs) -> BenchResult<()> {
    if a.repeat == 0 || a.loops == 0 || a.burst == 0 || a.burst > 1024 {
        return Err("--repeat and --loops must be above 0, and --burst 1 to 1024".into());
    }
    if let Some(t) = a.tables.iter().find(|&&t| !(1..=4).contains(&t)) {
        return Err(format!("--tables: {t} is not 1 to 4"));
    }
    if let Some(r) = a
        .update_rates
        .iter()
        .find(|&&r| !(0.0..=100.0).contains(&r))
    {
        return Err(format!(
            "--update-rates: {r} is not a percentage (0 to 100)"
        ));
    }
    let mut modes = if a.no_reference {
        eprintln!("--no-reference: no off run, so the caches' verdicts are not checked");
        vec![]
    } else {
        vec![Consistency::Off]
    };
    for m in &a.modes {
        let mode = consistency(m)
            .ok_or_else(|| format!("--modes: '{m}' is not one of action, cookie, strong, off"))?;
        if !modes.contains(&mode) {
            modes.push(mode);
        }
    }
    if let Some(path) = &a.write_rules {
        let mut text = rule_lines(&a, 2).join("\n");
        text.push('\n');
        std::fs::write(path, text).map_err(|e| format!("--write-rules {}: {e}", path.display()))?;
        return Ok(());
    }
    let mut rows = Vec::new();
    let t = Instant::now();
    let two = match &a.rules_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| format!("--rules-file {}: {e}", path.display()))?;
            let lines: Vec<&str> = text.lines().collect();
            let tables = (lines.iter())
                .filter_map(|l| parse_rule(l).ok())
                .map(|r| usize::from(r.table.max(r.goto.unwrap_or(0))) + 1)
                .max()
                .unwrap_or(1);
            let mut rules = RuleSet::new(tables);
            let parsed = stateplane_programs::pipeline::parse_rules(&rules, lines, 4)
                .map_err(|e| format!("--rules-file {}: {e}", path.display()))?;
            for rule in parsed.rules {
                rules
                    .insert(rule)
                    .map_err(|e| format!("--rules-file {}: {e}", path.display()))?;
            }
            rules
        }
        None => rule_set(&a, 2)?,
    };
    if let Some(dir) = &a.write_classbench {
        return write_classbench(dir, &load_trace("", &a)?, &two);
    }
    let tuples: Vec<String> = (0..two.tables() as u8)
        .map(|t| match two.tree_shape(t) {
            Some(shape) => format!("{} tuples and a tree: {shape}", two.tuples(t)),
            None => format!("{} tuples", two.tuples(t)),
        })
        .collect();
    let plural =
        |n: usize, one: &str, many: &str| format!("{n} {}", [many, one][usize::from(n == 1)]);
    eprintln!(
        "built {} in {} ({}) in {:.1} s",
        plural(two.len(), "rule", "rules"),
        plural(two.tables(), "table", "tables"),
        tuples.join(" + "),
        t.elapsed().as_secs_f64()
    );
    let workloads = match &a.trace {
        Some(path) => vec![(path.file_name()).map_or_else(
            || path.display().to_string(),
            |n| n.to_string_lossy().into(),
        )],
        None => a.workloads.clone(),
    };
    for (w, workload) in workloads.iter().enumerate() {
        let doing = if a.trace.is_some() {
            "reading"
        } else {
            "generating"
        };
        eprintln!("{doing} {workload}");
        let trace = load_trace(workload, &a)?;
        // Speed-up, and (first workload) the update-rate experiment.
        let rates: Vec<f64> = if w == 0 {
            a.update_rates.clone()
        } else {
            vec![0.0]
        };
        for &rate in &rates {
            let experiment = match (rate == 0.0, a.update_kind) {
                (true, _) => "speedup",
                (false, UpdateKind::Reinsert) => "reinserts",
                (false, UpdateKind::Modify) => "updates",
            };
            rows.extend(measure(
                &a, experiment, workload, &trace, &two, &modes, rate,
            )?);
        }
        rows.extend(lookups(&a, workload, &trace, &two, &modes)?);
        if w == 0 && a.rules_file.is_none() {
            for &tables in a.tables.iter().filter(|&&t| t != 2) {
                let rules = rule_set(&a, tables)?;
                rows.extend(measure(
                    &a, "tables", workload, &trace, &rules, &modes, 0.0,
                )?);
            }
        }
    }
    report(&a, &two, &rows, &workloads)
}

fn report(
    a: &BenchPipelineArgs,
    two: &RuleSet,
    rows: &[Row],
    workloads: &[String],
) -> BenchResult<()> {
    let trace = match &a.trace {
        Some(path) => format!("trace {}", path.display()),
        None => format!(
            "stateplane gen WORKLOAD --packets {} --packet-size 64 --ipv6-share 0 --seed {}",
            a.packets, a.seed
        ),
    };
    let rules = match &a.rules_file {
        Some(path) => format!(
            "rules from {} ({} in {} tables)",
            path.display(),
            two.len(),
            two.tables()
        ),
        None => format!(
            "table 0: {} ClassBench-like ACL rules (1 in 8 deny{}) and a default; table 1: {} generated prefixes, 512 /24s of the trace and a default ({} rules in all); tables 2-3: 100 port-range rules each",
            a.acl_rules,
            if a.ovs_compatible {
                "; ports exact, under TCP or UDP only"
            } else {
                ""
            },
            a.fib_prefixes,
            two.len()
        ),
    };
    println!(
        "input: {trace}, replayed from memory on one core in bursts of {}; {rules}; cache {} entries, {} way(s); median of {} rounds (modes interleaved in each)",
        a.burst, a.cache_entries, a.cache_ways, a.repeat
    );
    let mut table = Table::new(
        &["exp", "workload", "mode"],
        &[
            "tables",
            "updates",
            "Mpps",
            "vs off",
            "vs none",
            "hit rate",
            "update p99",
            "update p99.9",
            "median burst",
            "vs 1 worker",
            "balance",
            "checked",
        ],
    );
    let ratio_or_dash = |x: f64| {
        if x.is_nan() {
            "-".to_string()
        } else {
            format!("{x:.2}x")
        }
    };
    let mut csv = Csv::new(
        "experiment,workload,mode,tables,update_pct_per_s,updates,mpps,speedup_vs_off,vs_no_updates,forwarded_share,hit_rate,p99_update_us,p999_update_us,max_update_us,median_burst_us,vs_one_worker,shards_balance,checked_packets",
    );
    for r in rows {
        let ratio = r.speedup;
        table.row(vec![
            r.experiment.to_string(),
            r.workload.to_string(),
            mode_name(r.mode).to_string(),
            r.tables.to_string(),
            match r.updates {
                0 => format!("{}%", r.update_pct),
                n => format!("{}% ({n})", r.update_pct),
            },
            format!("{:.2}", r.mpps),
            ratio_or_dash(ratio),
            ratio_or_dash(r.vs_still),
            if r.hit_rate.is_nan() {
                "-".to_string()
            } else {
                format!("{:.1}%", r.hit_rate * 100.0)
            },
            format!("{:.1} µs", r.p99_update_us),
            format!("{:.1} µs", r.p999_update_us),
            format!("{:.1} µs", r.median_burst_us),
            ratio_or_dash(r.vs_one_worker),
            ratio_or_dash(r.balance),
            match r.checked {
                0 => "-".to_string(),
                n => n.to_string(),
            },
        ]);
        csv.row(format_args!(
            "{},{},{},{},{},{},{:.3},{:.3},{:.3},{:.4},{:.4},{:.2},{:.2},{:.2},{:.2},{:.3},{:.3},{}",
            r.experiment,
            r.workload,
            mode_name(r.mode),
            r.tables,
            r.update_pct,
            r.updates,
            r.mpps,
            ratio,
            r.vs_still,
            r.forwarded,
            r.hit_rate,
            r.p99_update_us,
            r.p999_update_us,
            r.max_update_us,
            r.median_burst_us,
            r.vs_one_worker,
            r.balance,
            r.checked
        ));
    }
    table.print();
    if let Some(path) = &a.files.csv {
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let panel = |title: String, pick: &dyn Fn(&Row) -> Option<String>| crate::chart::Panel {
            title,
            unit: "Mpps".into(),
            bars: rows
                .iter()
                .filter_map(|r| pick(r).map(|label| (label, r.mpps)))
                .collect(),
        };
        let mut panels = Vec::new();
        for w in workloads {
            panels.push(panel(format!("{w}: ACL + FIB, no updates"), &|r: &Row| {
                (r.experiment == "speedup" && &r.workload == w).then(|| mode_name(r.mode).into())
            }));
        }
        let first = &workloads[0];
        panels.push(panel(
            format!("{first}: rules modified per second (% of all)"),
            &|r: &Row| {
                (&r.workload == first && ["speedup", "updates"].contains(&r.experiment))
                    .then(|| format!("{} at {}%/s", mode_name(r.mode), r.update_pct))
            },
        ));
        panels.push(panel(format!("{first}: tables"), &|r: &Row| {
            (&r.workload == first && ["speedup", "tables"].contains(&r.experiment))
                .then(|| format!("{} with {} table(s)", mode_name(r.mode), r.tables))
        }));
        for w in workloads {
            panels.push(panel(
                format!("{w}: lookups alone (M/s, warm cache)"),
                &|r: &Row| {
                    (&r.workload == w).then_some(())?;
                    match r.experiment {
                        "lookup" => Some(mode_name(r.mode).into()),
                        "lookup2" => Some(format!("{}, two workers", mode_name(r.mode))),
                        _ => None,
                    }
                },
            ));
        }
        a.files.write_chart(
            "The rule pipeline with and without its microflow cache",
            &format!(
                "one core; {} packets per trace; cache {} entries",
                a.packets, a.cache_entries
            ),
            &panels,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        a: BenchPipelineArgs,
    }

    fn args() -> BenchPipelineArgs {
        let words = ["bench-pipeline", "--packets", "4000", "--acl-rules", "40"];
        Cli::parse_from(words.into_iter().chain(["--fib-prefixes", "200"])).a
    }

    /// What `--write-rules` writes, `--rules-file` reads back (as compare-ovs.sh has both
    /// do): no rule twice, whatever prefixes the generator draws.
    #[test]
    fn written_rules_read_back_as_a_rules_file() {
        for (fib, ovs) in [("200", false), ("20000", true)] {
            let mut a = Cli::parse_from(["bench-pipeline", "--fib-prefixes", fib]).a;
            a.ovs_compatible = ovs;
            let lines = rule_lines(&a, 2);
            let rules = RuleSet::new(2);
            let read = stateplane_programs::pipeline::parse_rules(
                &rules,
                lines.iter().map(String::as_str),
                4,
            );
            assert_eq!(read.map(|r| r.rules.len()).unwrap(), lines.len(), "{fib}");
        }
    }

    /// `--write-classbench` writes every rule and every IPv4 key, each key with the line of
    /// the rule it matches here; rules of more than one table are refused, named.
    #[test]
    fn classbench_files_hold_every_rule_and_key_with_its_verdict() {
        let a = args();
        let trace = load_trace("internet", &a).unwrap();
        let dir = std::env::temp_dir().join(format!("stateplane-cb-{}", std::process::id()));
        let rules = rule_set(&a, 1).unwrap();
        write_classbench(&dir, &trace, &rules).unwrap();
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap();
        let (rule_text, keys, expected) = (read("rules"), read("trace"), read("expected"));
        assert_eq!(rule_text.lines().count(), rules.len());
        assert!(rule_text.lines().all(|l| l.starts_with('@')));
        let ipv4: Vec<Fields> = (trace.keys().flatten())
            .map(|(k, _)| k)
            .filter(|k| k.eth_type == 0x0800)
            .collect();
        assert_eq!(keys.lines().count(), ipv4.len());
        assert_eq!(expected.lines().count(), ipv4.len());
        let lines: Vec<(RuleId, &Rule)> = rules.rules().collect();
        for (k, line) in ipv4.into_iter().zip(expected.lines()) {
            let want = rules.classify(&k).rules.first().copied();
            let at: u32 = line.parse().unwrap();
            assert_eq!(lines.get(at as usize).map(|(id, _)| *id), want, "{k:?}");
        }
        let e = write_classbench(&dir, &trace, &rule_set(&a, 2).unwrap()).unwrap_err();
        assert!(
            e.contains("--write-classbench") && e.contains("no tables"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A worker far behind its update rate (here a thousand seconds of it due at once)
    /// makes at most one update a rule per catch-up, never the whole backlog: on a busy
    /// machine the updates' own time used to make the next backlog larger, without end.
    #[test]
    fn an_updater_behind_its_rate_makes_at_most_one_update_a_rule_at_a_time() {
        let a = args();
        let rules = rule_set(&a, 2).unwrap();
        let mut p = Pipeline::with_rules(rules.clone(), Consistency::Action, 1 << 12, 1).unwrap();
        let mut updater = Updater::new(p.flows(), 50_000.0, 3);
        let n = updater.ids.len();
        assert!(n > 0);
        assert_eq!(updater.catch_up(p.flows_mut(), 1000.0).len(), n);
        assert_eq!(updater.catch_up(p.flows_mut(), 1000.0).len(), n);
        assert_eq!(updater.done, 2 * n as u64);
    }

    /// The update experiment's check finds no stale burst where the cache followed every
    /// update, modified or reinserted, and finds them where the reference is not told of
    /// the updates (as a cache that missed them would look).
    #[test]
    fn the_update_check_catches_a_verdict_the_tables_alone_would_not_give() {
        let a = args();
        let trace = load_trace("internet", &a).unwrap();
        let rules = rule_set(&a, 2).unwrap();
        for kind in [UpdateKind::Modify, UpdateKind::Reinsert] {
            let mut p =
                Pipeline::with_rules(rules.clone(), Consistency::Action, 1 << 12, 1).unwrap();
            // Five hundred times the rules a second: about one update a burst or more.
            let mut updater = Updater::new(p.flows(), 50_000.0, 3);
            updater.kind = kind;
            let mut run = replay(&mut p, &trace, 2, 64, &mut updater);
            assert!(updater.done > 125, "{}", updater.done);
            let reinserts = kind == UpdateKind::Reinsert;
            let mut made = run.changes.iter().flat_map(|(_, c)| c);
            assert!(made.all(|c| matches!(c, Change::Reinsert(..)) == reinserts));
            let mut check = Reference::new(&rules).unwrap();
            check.check(&trace, 2, 64, &run);
            assert_eq!((check.stale, run.bursts.len()), (0, 8000 / 64 + 1));
            run.changes.clear();
            let mut check = Reference::new(&rules).unwrap();
            check.check(&trace, 2, 64, &run);
            assert!(check.stale > 10, "{kind:?}: {}", check.stale);
        }
    }
}
