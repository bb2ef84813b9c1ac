//! `stateplane ctl`: the control API's command-line client.
//!
//! Entries are written and printed in the text form of `stateplane_control::entry_text`
//! (`FIELD=VALUE ... ACTION PARAM=VALUE ...`), so `read` output can be edited and fed back
//! with `insert --file`.

use crate::summary_output::CliResult;
use clap::{Args, Subcommand};
use stateplane_control::client::Client;
use stateplane_control::endpoint::{self, ClientFiles};
use stateplane_control::entry_text as text;
use stateplane_state::control::{Field, Format, Kind};
use stateplane_state::{Declaration, FlowChange, FlowFilter, MeterConfig, Write};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Args)]
pub struct CtlArgs {
    /// The control API of a running `stateplane run`: unix:PATH (default: control.sock in
    /// the run directory, $STATEPLANE_RUN_DIR or /run/stateplane), HOST:PORT, or
    /// https://HOST:PORT. For `ctl sync`, the collector's --api address.
    #[arg(long, short = 's', value_name = "ENDPOINT")]
    pub server: Option<String>,
    #[command(flatten)]
    pub auth: AuthArgs,
    #[command(subcommand)]
    pub command: CtlCommand,
}

/// How `ctl` proves itself to a switch whose control API is guarded by TLS. (Their ids are
/// their own: global flags share the id space of every subcommand's, where `key` is taken.)
#[derive(Debug, Args)]
pub struct AuthArgs {
    /// TLS: the CA (or the switch's own certificate) that the switch's certificate is
    /// checked against (PEM).
    #[arg(long = "ca", id = "tls_ca", value_name = "FILE", global = true)]
    pub tls_ca: Option<PathBuf>,
    /// TLS: this client's certificate, for a switch run with --control-client-ca (PEM).
    #[arg(long = "cert", id = "tls_cert", value_name = "FILE", global = true)]
    pub tls_cert: Option<PathBuf>,
    /// TLS: this client's private key (PEM).
    #[arg(long = "key", id = "tls_key", value_name = "FILE", global = true)]
    pub tls_key: Option<PathBuf>,
    /// Send the token this file holds, for a switch run with --control-token-file.
    #[arg(long, value_name = "FILE", global = true)]
    pub token_file: Option<PathBuf>,
}

impl AuthArgs {
    fn files(&self) -> ClientFiles {
        ClientFiles {
            ca: self.tls_ca.clone(),
            cert: self.tls_cert.clone(),
            key: self.tls_key.clone(),
            token_file: self.token_file.clone(),
        }
    }
}

/// The switch's control API at `server`, or at the default socket.
fn connect_switch(server: Option<&str>, auth: &AuthArgs) -> CliResult<Client> {
    let default = || format!("unix:{}", endpoint::default_socket().display());
    let server = server.map_or_else(default, str::to_string);
    Client::connect_with(&server, &auth.files()).map_err(|e| e.to_string())
}

#[derive(Debug, Subcommand)]
pub enum CtlCommand {
    /// The program's tables and registers: key fields, actions, capacity, guarantees.
    Describe,
    /// Insert entries, all or none: one on the command line, or one per line of --file.
    Insert(WriteArgs),
    /// Change the action of existing entries, all or none.
    Modify(WriteArgs),
    /// Delete entries by key (FIELD=VALUE ...), all or none.
    Delete(WriteArgs),
    /// Print a table's entries (or the one with the key given) with their hit counts.
    Read {
        /// The table's name, as `describe` lists it.
        table: String,
        /// FIELD=VALUE words of a key.
        key: Vec<String>,
    },
    /// Read a register (one index, a range FIRST..END, or all), or set values with --set.
    Register {
        /// The register's name, as `describe` lists it.
        name: String,
        /// An index or a range FIRST..END (end excluded); all of it when left out.
        range: Option<String>,
        /// Set every index of the range to this value instead of reading it.
        #[arg(long)]
        set: Option<String>,
    },
    /// Read meters' settings (one index, a range FIRST..END, or all), or set them: rates in
    /// bytes per second, bursts in bytes.
    Meter {
        /// The meter array's name, as `describe` lists it.
        name: String,
        /// An index or a range FIRST..END (end excluded); all of them when left out.
        range: Option<String>,
        /// RFC 2697 single-rate three-colour marker: CIR,CBS,EBS.
        #[arg(long, value_delimiter = ',', value_name = "CIR,CBS,EBS", conflicts_with_all = ["trtcm", "off"])]
        srtcm: Option<Vec<u64>>,
        /// RFC 2698 two-rate three-colour marker: CIR,CBS,PIR,PBS.
        #[arg(
            long,
            value_delimiter = ',',
            value_name = "CIR,CBS,PIR,PBS",
            conflicts_with = "off"
        )]
        trtcm: Option<Vec<u64>>,
        /// Turn the meters off (every packet passes green).
        #[arg(long)]
        off: bool,
    },
    /// Print notifications as they come: idle timeouts, digests, and rules removed from a
    /// rule pipeline (by a timeout or a delete).
    Watch {
        /// Stop after this many.
        #[arg(long)]
        count: Option<u64>,
        /// Stop after this many seconds without one.
        #[arg(long)]
        timeout: Option<f64>,
    },
    /// The pipeline's counters, and a table's.
    Stats {
        /// The table whose counters to add (the pipeline's alone when left out).
        table: Option<String>,
    },
    /// Read the switch's configuration again and run the program it gives (as SIGHUP
    /// does), printing what each worker's program kept of the running one's state.
    Reload,
    /// Where each worker counts a key of TABLE (a table the program reports a sketch's
    /// keys in: `hh`'s heavy_hitters, the floods' victims): the indexes of its counters in
    /// the sketch register, what a sync collector's copy estimates the key from.
    CountersOf {
        /// The table's name, as `describe` lists it.
        table: String,
        /// FIELD=VALUE words of the key.
        key: Vec<String>,
    },
    /// Add one rule of a rule pipeline (the `pipeline` program), in the rule format.
    AddFlow {
        /// The rule, e.g. table=0,priority=10,tcp,tp_dst=80,actions=output:1
        rule: Vec<String>,
        /// A rule that replaces one (the same table, priority and match) keeps its
        /// counters instead of starting from zero.
        #[arg(long)]
        keep_counters: bool,
        #[command(flatten)]
        target: FlowTarget,
    },
    /// Add the rules of a file (one per line, '#' comments), all or none.
    AddFlows {
        /// The file of rules.
        file: PathBuf,
        /// Rules that replace others keep their counters.
        #[arg(long)]
        keep_counters: bool,
        #[command(flatten)]
        target: FlowTarget,
    },
    /// Make the rules of a file (one per line, '#' comments) the pipeline's, or one
    /// table's (table=N), at once and all or none: rules identical in everything stay with
    /// their counters, the others are deleted (and printed), the new ones added.
    ReplaceFlows {
        /// The file of rules.
        file: PathBuf,
        /// table=N: replace only that table's rules (the file's must all be in it).
        table: Option<String>,
        #[command(flatten)]
        target: FlowTarget,
    },
    /// Give the rules that match FILTER (table=N,cookie=VALUE/MASK) these actions.
    ModFlows {
        /// Which rules: table=N,cookie=VALUE/MASK.
        filter: String,
        /// The actions, as after actions= (e.g. mod_dl_dst:02:00:00:00:0b:01,output:2).
        actions: String,
        #[command(flatten)]
        target: FlowTarget,
    },
    /// Delete the rules that match FILTER (all of them when left out).
    DelFlows {
        /// Which rules: table=N,cookie=VALUE/MASK (all when left out).
        filter: Option<String>,
        #[command(flatten)]
        target: FlowTarget,
    },
    /// Print the rules that match FILTER with their packet and byte counters.
    DumpFlows {
        /// Which rules: table=N,cookie=VALUE/MASK (all when left out).
        filter: Option<String>,
        #[command(flatten)]
        target: FlowTarget,
    },
    /// Talk to a `stateplane collector --api ADDR` (give --server ADDR): its streams,
    /// reads with their bounds, writes into switches, changes as they come.
    #[command(subcommand)]
    Sync(SyncCommand),
}

#[derive(Debug, Subcommand)]
pub enum SyncCommand {
    /// Every stream heard from (a worker of a switch): freshness, loss, threshold; and
    /// what the collector refused, by reason.
    Streams,
    /// Read locations of a synced state, each with its bound.
    Read {
        #[command(flatten)]
        at: SyncTarget,
        /// An index or a range FIRST..END (end excluded).
        range: String,
    },
    /// Write values into a switch's synced state (committed whole between two bursts):
    /// --values V,V,... from the first index, or --fill V over the range.
    Write {
        #[command(flatten)]
        at: SyncTarget,
        /// An index or a range FIRST..END (end excluded).
        range: String,
        /// The values, comma-separated, from the range's first index on.
        #[arg(long, value_delimiter = ',', conflicts_with = "fill")]
        values: Option<Vec<u64>>,
        /// One value for every index of the range.
        #[arg(long)]
        fill: Option<u64>,
        /// Each location becomes the value plus the changes made while the write was on
        /// its way (a counter reset that loses no count).
        #[arg(long, conflicts_with = "subtract")]
        keep_changes: bool,
        /// Each location loses the value (down to 0 at most) as the write commits: a
        /// counter less what was read of it, every count made since kept.
        #[arg(long)]
        subtract: bool,
        /// How long to wait for the commits, in milliseconds; then the write is
        /// cancelled where it has not committed, and the error says what became of it.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
        timeout_ms: u32,
    },
    /// Move a switch's synced state into another switch through the collector's copy of
    /// one of its streams: a register's values, or a table's entries (--entry-words, its
    /// slot's words), each placed by its key in the target.
    Migrate {
        /// The source switch and stream (a worker: a table is each worker's own).
        #[arg(long, default_value_t = 1)]
        from_switch: u32,
        /// The source's stream (a worker's).
        #[arg(long, default_value_t = 0)]
        from_stream: u32,
        /// The target switch (its sync `switch` id).
        #[arg(long)]
        to_switch: u32,
        /// One stream of the target; every stream when left out.
        #[arg(long)]
        to_stream: Option<u32>,
        /// The state's id (the run's summary gives each synced name's: they number the names
        /// in their order, after any state replicated in bounded mode).
        #[arg(long, default_value_t = 0)]
        state: u32,
        /// Words per entry: 1 for a register or sketch; for a table, its slot's words
        /// (docs/SYNC.md: 1 + the key's words + the parameters' words). Left out: as the
        /// source announced it (each stream announces its states' layout).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        entry_words: Option<u32>,
        /// How long to wait for each write's commits, in milliseconds (then it is
        /// cancelled, as `write`'s).
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
        timeout_ms: u32,
    },
    /// Heavy hitters per interval from a switch's synced sketch (program `hh`), each with
    /// the bounds the copy gives its count; the sketch is reset on every worker at each
    /// interval's end (one atomic write each, keeping what was counted meanwhile).
    Hh {
        #[command(flatten)]
        app: SketchAppArgs,
        /// Flows to watch beside those the switch files in `heavy_hitters` (its data plane
        /// files each flow whose count reaches hh's own `threshold`: give it at most
        /// `--threshold`), one per line, as `heavy_hitters`' key: src=A dst=B proto=P
        /// src_port=S dst_port=D vlan=V ('#' starts a comment).
        #[arg(long)]
        keys: Option<PathBuf>,
    },
    /// UDP flood prevention from a switch's synced sketch (program `udpflood` or
    /// `synflood`): each interval, the protected destinations whose count surely reached
    /// the threshold are pushed into the switch's `victims` table, which its data plane
    /// mitigates; the sketch is reset on every worker as `hh`'s.
    Udpflood {
        #[command(flatten)]
        app: SketchAppArgs,
        /// The destinations to protect: addresses and prefixes (198.18.0.0/24),
        /// comma-separated, at most 65,536 addresses in all.
        #[arg(long, value_delimiter = ',', required = true)]
        protect: Vec<String>,
        /// Report victims without pushing them.
        #[arg(long)]
        detect_only: bool,
    },
    /// Print changes as the collector applies them.
    Watch {
        /// Only this switch's changes (its sync `switch` id).
        #[arg(long)]
        switch: Option<u32>,
        /// Only this state's changes (its id, as the run's summary gives it).
        #[arg(long)]
        state: Option<u32>,
        /// Stop after this many.
        #[arg(long)]
        count: Option<u64>,
        /// Stop after this many seconds without one.
        #[arg(long)]
        timeout: Option<f64>,
    },
}

#[derive(Debug, Args)]
pub struct SyncTarget {
    /// The switch's id (its [sync] switch).
    #[arg(long, default_value_t = 1)]
    pub switch: u32,
    /// One stream (a worker); every stream of the switch when left out (a read sums
    /// them).
    #[arg(long)]
    pub stream: Option<u32>,
    /// The state's id (the run's summary gives each synced name's: they number the names
    /// in their order, after any state replicated in bounded mode).
    #[arg(long, default_value_t = 0)]
    pub state: u32,
}

#[derive(Debug, Args)]
pub struct SketchAppArgs {
    /// The switch's control API (`stateplane run`'s `control` endpoint; default its Unix
    /// socket in the run directory): it says where each key is counted, and takes the
    /// victims.
    #[arg(long, value_name = "ENDPOINT")]
    pub control: Option<String>,
    /// The switch's id (its [sync] switch).
    #[arg(long, default_value_t = 1)]
    pub switch: u32,
    /// The sketch register's state id (the run's summary gives each synced name's: they
    /// number the names in their order, after any state replicated in bounded mode).
    #[arg(long, default_value_t = 0)]
    pub state: u32,
    /// The count in an interval that makes a key heavy (a victim).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub threshold: u64,
    /// The interval's length, in milliseconds. Give the switch's own `interval_ms` a
    /// longer one (3600000) so that these resets are the only ones.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=3_600_000))]
    pub interval_ms: u32,
    /// Stop after this many intervals (none: until interrupted).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub intervals: Option<u32>,
    /// How long each reset may take to commit, in milliseconds.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    pub timeout_ms: u32,
    /// Intervals in a row that may fail (the collector or the switch gone, a reset not
    /// committed) before the application gives up; after each, it starts counting afresh.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub give_up_after: u32,
}

#[derive(Debug, Args)]
pub struct FlowTarget {
    /// The rule pipeline (default: the program's first).
    #[arg(long)]
    pub pipeline: Option<String>,
}

#[derive(Debug, Args)]
pub struct WriteArgs {
    /// The table's name, as `describe` lists it.
    pub table: String,
    /// The entry (or, for delete, the key) as words: FIELD=VALUE ... ACTION PARAM=VALUE.
    pub entry: Vec<String>,
    /// One entry per line ('#' starts a comment), applied as one all-or-nothing batch.
    #[arg(long)]
    pub file: Option<PathBuf>,
}

pub fn main(args: CtlArgs) -> CliResult<()> {
    let command = match args.command {
        CtlCommand::Sync(command) => {
            let Some(server) = &args.server else {
                return Err(
                    "ctl sync talks to a collector: give --server ADDR, the address of its --api"
                        .into(),
                );
            };
            return sync(server, &args.auth, command);
        }
        other => other,
    };
    // Each command connects once the arguments it can check alone are checked: a wrong one
    // is said as such, not as a switch out of reach.
    let connect = || connect_switch(args.server.as_deref(), &args.auth);
    match command {
        // Answered by the collector, before any connection to a switch.
        CtlCommand::Sync(_) => return Err("ctl sync talks to a collector".into()),
        CtlCommand::Describe => {
            let client = connect()?;
            println!("program {}", client.program());
            for d in client.declarations() {
                println!("{}", describe(d));
            }
        }
        CtlCommand::Insert(w) => write(connect, w, Op::Insert)?,
        CtlCommand::Modify(w) => write(connect, w, Op::Modify)?,
        CtlCommand::Delete(w) => write(connect, w, Op::Delete)?,
        CtlCommand::Read { table, key } => {
            let mut client = connect()?;
            let d = client
                .declaration(&table)
                .map_err(|e| e.to_string())?
                .clone();
            let key = if key.is_empty() {
                None
            } else {
                let words: Vec<&str> = key.iter().map(String::as_str).collect();
                Some(text::parse_key(&d, &words)?)
            };
            // Printed a piece at a time as they come: a table of any size in little memory.
            let mut count = 0;
            let version = client
                .read_each(&table, key.as_deref(), |piece| {
                    for e in &piece {
                        println!("{}", text::print_entry(&d, e));
                    }
                    count += piece.len();
                    Ok(())
                })
                .map_err(|e| e.to_string())?;
            eprintln!("{count} entries of {table} at version {version}");
        }
        CtlCommand::Register { name, range, set } => {
            let (first, count) = parse_range(range.as_deref())?;
            register(&mut connect()?, &name, (first, count), set)?
        }
        CtlCommand::Meter {
            name,
            range,
            srtcm,
            trtcm,
            off,
        } => {
            let (first, count) = parse_range(range.as_deref())?;
            let config = match (srtcm.as_deref(), trtcm.as_deref(), off) {
                (Some(&[cir, cbs, ebs]), _, _) => Some(MeterConfig::SrTcm { cir, cbs, ebs }),
                (Some(other), _, _) => {
                    return Err(format!(
                        "--srtcm takes three numbers, CIR,CBS,EBS (bytes a second, bytes, bytes), not {}",
                        other.len()
                    ));
                }
                (_, Some(&[cir, cbs, pir, pbs]), _) => {
                    Some(MeterConfig::TrTcm { cir, cbs, pir, pbs })
                }
                (_, Some(other), _) => {
                    return Err(format!(
                        "--trtcm takes four numbers, CIR,CBS,PIR,PBS (bytes a second, bytes, bytes a second, bytes), not {}",
                        other.len()
                    ));
                }
                (_, _, true) => Some(MeterConfig::Off),
                (None, None, false) => None,
            };
            let mut client = connect()?;
            match config {
                Some(c) => {
                    let version = client
                        .set_meter(&name, first, count, &c)
                        .map_err(|e| e.to_string())?;
                    println!("set {name} at version {version}");
                }
                None => {
                    let configs = client
                        .read_meter(&name, first, count)
                        .map_err(|e| e.to_string())?;
                    for (i, c) in configs.iter().enumerate() {
                        println!("{name}[{}] {}", first + i as u64, meter_text(c));
                    }
                }
            }
        }
        CtlCommand::Watch { count, timeout } => {
            let timeout = crate::flags::timeout(timeout)?;
            let mut client = connect()?;
            let declarations = client.declarations().to_vec();
            let seen = client
                .watch(count, timeout, |n| {
                    println!("{}", notification(&declarations, n));
                    true
                })
                .map_err(|e| e.to_string())?;
            eprintln!("{seen} notifications");
        }
        CtlCommand::CountersOf { table, key } => {
            let mut client = connect()?;
            let d = client
                .declaration(&table)
                .map_err(|e| e.to_string())?
                .clone();
            let words: Vec<&str> = key.iter().map(String::as_str).collect();
            let key = text::parse_key(&d, &words)?;
            let workers = client
                .counters_of(&table, &[key])
                .map_err(|e| e.to_string())?;
            for w in &workers {
                let cells: Vec<String> = (w.cells.iter().flatten()).map(u32::to_string).collect();
                println!(
                    "worker {}: {}",
                    w.worker,
                    if cells.is_empty() {
                        "nowhere yet".to_string()
                    } else {
                        cells.join(" ")
                    }
                );
            }
        }
        CtlCommand::Reload => {
            let reloaded = connect()?.reload().map_err(|e| e.to_string())?;
            let generation = reloaded.generation;
            println!("reloaded the program (generation {generation})");
            for taken in &reloaded.taken {
                for c in &taken.carried {
                    println!("worker {}: {c}", taken.worker);
                }
            }
            for worker in reloaded.not_taken() {
                println!(
                    "worker {worker}: had not taken generation {generation} when the switch \
                     answered (it does between two bursts; its log says what it kept)"
                );
            }
        }
        CtlCommand::Stats { table } => {
            let reply = connect()?
                .stats(table.as_deref().unwrap_or(""))
                .map_err(|e| e.to_string())?;
            for c in &reply.pipeline {
                println!("pipeline.{} {}", c.name, c.value);
            }
            for c in &reply.table {
                println!("{}.{} {}", table.as_deref().unwrap_or(""), c.name, c.value);
            }
        }
        CtlCommand::AddFlow {
            rule,
            keep_counters,
            target,
        } => add_flows(
            &mut connect()?,
            &target,
            vec![rule.join(",")],
            keep_counters,
        )?,
        CtlCommand::AddFlows {
            file,
            keep_counters,
            target,
        } => {
            let lines = rule_lines(&file)?;
            add_flows(&mut connect()?, &target, lines, keep_counters)?
        }
        CtlCommand::ReplaceFlows {
            file,
            table,
            target,
        } => {
            let filter = parse_flow_filter(table.as_deref().unwrap_or(""))?;
            if filter.cookie_mask != 0 {
                return Err("replace-flows takes table=N only, not a cookie".into());
            }
            let change = FlowChange::Replace {
                table: filter.table,
                lines: rule_lines(&file)?,
            };
            flows(&mut connect()?, &target, change)?
        }
        CtlCommand::ModFlows {
            filter,
            actions,
            target,
        } => {
            let filter = parse_flow_filter(&filter)?;
            flows(
                &mut connect()?,
                &target,
                FlowChange::Modify { filter, actions },
            )?
        }
        CtlCommand::DelFlows { filter, target } => {
            let filter = parse_flow_filter(filter.as_deref().unwrap_or(""))?;
            flows(&mut connect()?, &target, FlowChange::Delete(filter))?
        }
        CtlCommand::DumpFlows { filter, target } => {
            let filter = parse_flow_filter(filter.as_deref().unwrap_or(""))?;
            flows(&mut connect()?, &target, FlowChange::Dump(filter))?
        }
    }
    Ok(())
}

#[derive(Clone, Copy)]
enum Op {
    Insert,
    Modify,
    Delete,
}

/// Connects (`connect`) once the entry or the file is known to be given, and the file to
/// be readable.
fn write(connect: impl FnOnce() -> CliResult<Client>, args: WriteArgs, op: Op) -> CliResult<()> {
    if args.entry.is_empty() && args.file.is_none() {
        return Err("give an entry (FIELD=VALUE ... ACTION PARAM=VALUE) or --file".into());
    }
    if let Some(path) = &args.file {
        std::fs::File::open(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    }
    let client = &mut connect()?;
    let d = client
        .declaration(&args.table)
        .map_err(|e| e.to_string())?
        .clone();
    let mut command_line = (!args.entry.is_empty()).then(|| args.entry.join(" "));
    if let (Op::Modify, Some(line)) = (op, &command_line) {
        command_line = Some(keeping_params(client, &d, &args.table, line)?);
    }
    let writes = || -> CliResult<_> {
        let file = match &args.file {
            Some(path) => Some((
                path.clone(),
                std::fs::File::open(path)
                    .map_err(|e| format!("cannot read {}: {e}", path.display()))?,
            )),
            None => None,
        };
        Ok(parsed_writes(d.clone(), op, command_line.clone(), file))
    };
    // Every line is read and checked first, so that a mistake is reported before anything
    // is sent; then read again as the writes go out, so that no batch sits whole in memory.
    let mut count = 0u64;
    for w in writes()? {
        w?;
        count += 1;
    }
    if count == 0 {
        return Err("give an entry (FIELD=VALUE ... ACTION PARAM=VALUE) or --file".into());
    }
    let (version, sent) = client
        .write_each(&args.table, writes()?)
        .map_err(|e| e.to_string())?;
    println!(
        "{} {sent} entr{} of {} at version {version}",
        match op {
            Op::Insert => "inserted",
            Op::Modify => "modified",
            Op::Delete => "deleted",
        },
        if sent == 1 { "y" } else { "ies" },
        args.table
    );
    Ok(())
}

/// An entry given on the command line to `modify`, with the parameters it leaves out
/// taken from the entry as the switch has it (so `modify backends ... down` keeps the
/// backend's weight); a file gives every parameter.
fn keeping_params(
    client: &mut Client,
    d: &Declaration,
    table: &str,
    line: &str,
) -> CliResult<String> {
    if text::parse_entry(d, line).is_ok() {
        return Ok(line.to_string());
    }
    let key = text::parse_entry_key(d, line)?;
    let (_, entries) = client.read(table, Some(&key)).map_err(|e| e.to_string())?;
    let Some(current) = entries.first() else {
        return Err(format!("{table} has no entry {}", text::print_key(d, &key)));
    };
    let entry = text::parse_entry_keeping(d, line, Some(current))?;
    Ok(text::print_entry(d, &entry))
}

/// The writes an entry on the command line and a file of entries (one per line, `#`
/// comments) ask for, parsed one at a time as they are taken; an error names where.
fn parsed_writes(
    d: Declaration,
    op: Op,
    command_line: Option<String>,
    file: Option<(PathBuf, std::fs::File)>,
) -> impl Iterator<Item = Result<Write, String>> + Send + 'static {
    use std::io::BufRead;
    let given = command_line.map(|line| ("the command line".to_string(), Ok(line)));
    let from_file = file.into_iter().flat_map(|(path, f)| {
        (std::io::BufReader::new(f).lines().enumerate())
            .map(move |(i, line)| (format!("{}:{}", path.display(), i + 1), line))
    });
    given
        .into_iter()
        .chain(from_file)
        .filter_map(move |(at, line)| {
            let line = match line {
                Ok(l) => l,
                Err(e) => return Some(Err(format!("{at}: {e}"))),
            };
            let line = line.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                return None;
            }
            let parsed = match op {
                Op::Insert => text::parse_entry(&d, line).map(Write::Insert),
                Op::Modify => text::parse_entry(&d, line).map(Write::Modify),
                // A key, or a whole entry as `read` prints it (the key is taken).
                Op::Delete => text::parse_entry_key(&d, line).map(Write::Delete),
            };
            Some(parsed.map_err(|e| format!("{at}: {e}")))
        })
}

/// Register `name`'s cells `first..first + count` (all of them, `count` 0): read, or `set`.
fn register(
    client: &mut Client,
    name: &str,
    (first, count): (u64, u64),
    set: Option<String>,
) -> CliResult<()> {
    let d = client.declaration(name).map_err(|e| e.to_string())?.clone();
    let Kind::Register { bits } = d.kind else {
        return Err(format!(
            "`{name}` is not a register; `ctl describe` says what it is"
        ));
    };
    let field = Field::exact("value", bits, Format::Int);
    match set {
        Some(v) => {
            let value = text::parse_value(&field, &v)?;
            let bytes = stateplane_control::convert::to_bytes(value, bits);
            let version = client
                .write_register(name, first, count, bytes)
                .map_err(|e| e.to_string())?;
            println!("set {name} at version {version}");
        }
        None => {
            let values = client
                .read_register(name, first, count)
                .map_err(|e| e.to_string())?;
            for (i, v) in values.iter().enumerate() {
                let v = v.iter().fold(0u128, |a, &b| a << 8 | u128::from(b));
                println!("{name}[{}] {v}", first + i as u64);
            }
        }
    }
    Ok(())
}

/// An index or a range `FIRST..END` as (first, count); all of an array (count 0) when absent.
fn sync(server: &str, auth: &AuthArgs, command: SyncCommand) -> CliResult<()> {
    use stateplane_control::collector_api::CollectorClient;
    use stateplane_control::sync_pb;
    // Each command connects once its own arguments are checked: a wrong one is said
    // whether or not a collector is there.
    let connect = || CollectorClient::connect(server).map_err(|e| e.to_string());
    let located = |range: &str| -> CliResult<(u32, u32)> {
        let (first, count) = parse_range(Some(range))?;
        let first = u32::try_from(first).map_err(|_| format!("{range}: past the last index"))?;
        let count = u32::try_from(count).map_err(|_| {
            format!("{range}: {count} locations, past what a state's 32-bit indexes reach")
        })?;
        Ok((first, count))
    };
    match command {
        SyncCommand::Streams => {
            let r = connect()?.streams().map_err(|e| e.to_string())?;
            println!(
                "{:>6} {:>6} {:>10} {:>10} {:>12} {:>8} {:>9} {:>9}  states (ID=LOCATIONSxWORDS)",
                "switch", "stream", "epoch", "last", "age_ms", "missing", "threshold", "locations",
            );
            for s in &r.streams {
                let layout: Vec<String> = (s.layout.iter())
                    .map(|l| format!("{}={}x{}", l.state, l.length, l.stride))
                    .collect();
                println!(
                    "{:>6} {:>6} {:>10} {:>10} {:>12.3} {:>8} {:>9} {:>9}  {}{}",
                    s.switch_id,
                    s.stream,
                    s.epoch,
                    s.last_seq,
                    s.age_ns as f64 / 1e6,
                    s.missing,
                    s.threshold,
                    s.locations,
                    if layout.is_empty() {
                        "-".to_string()
                    } else {
                        layout.join(",")
                    },
                    if s.writes_in_flight {
                        "  (writing)"
                    } else {
                        ""
                    }
                );
            }
            let refused: Vec<String> = (r.refused.iter())
                .map(|x| format!("{} {}", x.reason, x.count))
                .collect();
            eprintln!(
                "datagrams {}, applied {}, gaps {} ({} missing, {} sent again, {} given up), \
                 restarts {}; refused: {}",
                r.datagrams,
                r.applied,
                r.gaps,
                r.missing,
                r.repaired,
                r.given_up,
                r.restarts,
                if refused.is_empty() {
                    "none".to_string()
                } else {
                    refused.join(", ")
                }
            );
        }
        SyncCommand::Read { at, range } => {
            let (first, count) = located(&range)?;
            let r = connect()?
                .read(sync_pb::ReadRequest {
                    switch_id: at.switch,
                    stream: at.stream,
                    state: at.state,
                    first,
                    count,
                })
                .map_err(|e| e.to_string())?;
            let unbounded: std::collections::HashSet<u32> = r.unbounded.iter().copied().collect();
            for (i, (value, bound)) in r.values.iter().zip(&r.bounds).enumerate() {
                let bound = if unbounded.contains(&(i as u32)) {
                    "unbounded".to_string()
                } else {
                    format!("±{bound}")
                };
                println!("{} {value} {bound}", u64::from(r.first) + i as u64);
            }
            eprintln!("as of the switch's {} ns", r.as_of_ns);
        }
        SyncCommand::Write {
            at,
            range,
            values,
            fill,
            keep_changes,
            subtract,
            timeout_ms,
        } => {
            let (first, count) = located(&range)?;
            let most = stateplane_sync::write::MAX_WRITE_VALUES;
            if count as usize > most {
                return Err(format!(
                    "{range}: {count} locations; a write holds at most {most} values (write the range in parts of {most} at most)"
                ));
            }
            let values = match (values, fill) {
                (Some(v), None) if v.len() as u64 == u64::from(count) => v,
                (Some(v), None) => {
                    return Err(format!(
                        "--values: {} values for the {count} locations of {range}",
                        v.len()
                    ));
                }
                (None, Some(_)) => Vec::new(),
                _ => return Err("give --values V,V,... or --fill V".into()),
            };
            let r = connect()?
                .write(sync_pb::WriteRequest {
                    switch_id: at.switch,
                    stream: at.stream,
                    state: at.state,
                    first,
                    values,
                    fill: fill.unwrap_or(0),
                    count,
                    keep_changes,
                    subtract,
                    timeout_ms,
                })
                .map_err(|e| e.to_string())?;
            print_writes_done(&r.done, at.switch)?;
        }
        SyncCommand::Migrate {
            from_switch,
            from_stream,
            to_switch,
            to_stream,
            state,
            entry_words,
            timeout_ms,
        } => {
            let moved = stateplane_control::migrate::migrate(
                &mut connect()?,
                &stateplane_control::migrate::Move {
                    from_switch,
                    from_stream,
                    to_switch,
                    to_stream,
                    state,
                    entry_words,
                    timeout_ms,
                },
            )?;
            println!(
                "moved {} entries ({} values) of switch {from_switch} stream {from_stream} \
                 state {state} ({} locations read, largest bound ±{}) into switch {to_switch}",
                moved.entries, moved.values, moved.read, moved.largest_bound
            );
            print_writes_done(&moved.done, to_switch)?;
        }
        SyncCommand::Hh { app, keys } => {
            let text = match &keys {
                Some(keys) => std::fs::read_to_string(keys)
                    .map_err(|e| format!("--keys {}: {e}", keys.display()))?,
                None => String::new(),
            };
            let table = "heavy_hitters";
            let parse = |d: &Declaration| -> CliResult<Vec<Vec<stateplane_state::Match>>> {
                let mut parsed = Vec::new();
                let shown = keys
                    .as_deref()
                    .unwrap_or(std::path::Path::new(""))
                    .display();
                for (n, line) in text.lines().enumerate() {
                    let line = line.split('#').next().unwrap_or("").trim();
                    if line.is_empty() {
                        continue;
                    }
                    let words: Vec<&str> = line.split_whitespace().collect();
                    parsed.push(
                        text::parse_key(d, &words)
                            .map_err(|e| format!("--keys {shown} line {}: {e}", n + 1))?,
                    );
                }
                Ok(parsed)
            };
            sketch_app(&mut connect()?, &app, auth, table, parse, Keys::AndTables)?;
        }
        SyncCommand::Udpflood {
            app,
            protect,
            detect_only,
        } => {
            let protected = protected(&protect)?;
            let parse = |d: &Declaration| -> CliResult<Vec<Vec<stateplane_state::Match>>> {
                (protected.iter())
                    .map(|a| text::parse_key(d, &[format!("dst={a}").as_str()]))
                    .collect::<Result<_, _>>()
                    .map_err(|e| format!("--protect: {e}"))
            };
            let pushed = if detect_only {
                Keys::Given
            } else {
                Keys::GivenPushingVictims
            };
            sketch_app(&mut connect()?, &app, auth, "victims", parse, pushed)?;
        }
        SyncCommand::Watch {
            switch,
            state,
            count,
            timeout,
        } => {
            let quiet = crate::flags::timeout(timeout)?;
            let mut seen = 0u64;
            connect()?
                .subscribe(
                    sync_pb::SubscribeRequest {
                        switch_id: switch,
                        state,
                    },
                    quiet,
                    |c| {
                        if c.missed > 0 {
                            println!("({} changes missed: this watch fell behind)", c.missed);
                        }
                        println!(
                            "switch {} stream {} state {} index {} = {} (as of {} ns)",
                            c.switch_id, c.stream, c.state, c.index, c.value, c.as_of_ns
                        );
                        seen += 1;
                        count.is_none_or(|n| seen < n)
                    },
                )
                .map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Which keys a sketch application watches, and what it does with those it is sure of.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// The keys given, and every key the switch holds in the table (`hh`).
    AndTables,
    /// The keys given.
    Given,
    /// The keys given; the sure ones are pushed into the table (`udpflood`).
    GivenPushingVictims,
}

/// Runs a sketch application (`ctl sync hh`, `ctl sync udpflood`) on the keys `parse`
/// makes of `table`'s key, interval after interval, as `keys` says.
fn sketch_app(
    collector: &mut stateplane_control::collector_api::CollectorClient,
    args: &SketchAppArgs,
    auth: &AuthArgs,
    table: &str,
    parse: impl Fn(&Declaration) -> CliResult<Vec<Vec<stateplane_state::Match>>>,
    keys_watched: Keys,
) -> CliResult<()> {
    use stateplane_control::sketch_app::{SketchApp, Watch};
    let mut switch = connect_switch(args.control.as_deref(), auth)?;
    let d = switch
        .declaration(table)
        .map_err(|e| format!("--control: {e}"))?
        .clone();
    let keys = parse(&d)?;
    let learn = keys_watched == Keys::AndTables;
    if keys.is_empty() && !learn {
        return Err("no keys to watch".into());
    }
    let mut app = SketchApp::new(Watch {
        switch_id: args.switch,
        state: args.state,
        table: table.to_string(),
        keys,
        learn,
        threshold: args.threshold,
        push: keys_watched == Keys::GivenPushingVictims,
        timeout_ms: args.timeout_ms,
    });
    app.start(collector)?;
    eprintln!(
        "watching {} keys{} of switch {} from now, in intervals of {} ms",
        app.watch.keys.len(),
        if learn {
            format!(" and each the switch files in {table}")
        } else {
            String::new()
        },
        args.switch,
        args.interval_ms
    );
    let every = Duration::from_millis(u64::from(args.interval_ms));
    let mut end = std::time::Instant::now() + every;
    // Failed intervals in a row; after one, the next starts the counting afresh (a reset
    // that did not commit leaves counts of more than one interval).
    let mut failed = 0;
    for number in 1..=args.intervals.unwrap_or(u32::MAX) {
        std::thread::sleep(end.saturating_duration_since(std::time::Instant::now()));
        end += every;
        // A slow interval (a collector or switch that answered late) starts the next afresh.
        end = end.max(std::time::Instant::now());
        let result = if failed > 0 {
            app.start(collector).map(|()| None)
        } else {
            app.interval(collector, &mut switch, number).map(Some)
        };
        let i = match result {
            Ok(Some(i)) => i,
            Ok(None) => {
                eprintln!("interval {number}: started again: counting afresh from now");
                failed = 0;
                continue;
            }
            Err(e) => {
                failed += 1;
                if failed >= args.give_up_after {
                    return Err(format!(
                        "gave up after {failed} failed intervals in a row (--give-up-after): {e}"
                    ));
                }
                eprintln!(
                    "interval {number}: failed, nothing found in it: {e}; starting again at \
                     the next ({failed} failed in a row, --give-up-after {})",
                    args.give_up_after
                );
                continue;
            }
        };
        for f in &i.found {
            let e = &f.estimate;
            let high = e.high.map_or("unbounded".to_string(), |h| h.to_string());
            println!(
                "interval {number}: {} estimate {} ({}..{}) {}{}",
                text::print_key(&d, &app.watch.keys[f.key]),
                e.value,
                e.low,
                high,
                if e.reaches(args.threshold) {
                    "sure"
                } else {
                    "possible"
                },
                if f.pushed { ", pushed" } else { "" }
            );
        }
        eprintln!(
            "interval {number}: {} of {} keys found; {} counters read ({} unbounded) in {:.3} ms, \
             reset in {:.3} ms",
            i.found.len(),
            app.watch.keys.len(),
            i.read,
            i.unbounded,
            i.read_ns as f64 / 1e6,
            i.reset_ns as f64 / 1e6
        );
    }
    Ok(())
}

/// Every address of `protect` (addresses and prefixes), at most [`MAX_PROTECTED`].
fn protected(protect: &[String]) -> CliResult<Vec<std::net::IpAddr>> {
    use std::net::IpAddr;
    let mut all = Vec::new();
    for item in protect {
        let (addr, len) = match item.split_once('/') {
            Some((a, l)) => (a, Some(l)),
            None => (item.as_str(), None),
        };
        let bad = || format!("--protect: '{item}' is not an address or a prefix ADDRESS/LENGTH");
        let addr: IpAddr = addr.trim().parse().map_err(|_| bad())?;
        let bits: u32 = if addr.is_ipv4() { 32 } else { 128 };
        let len: u32 = match len {
            Some(l) => l
                .trim()
                .parse()
                .ok()
                .filter(|&l| l <= bits)
                .ok_or_else(bad)?,
            None => bits,
        };
        let count = 1u128 << (bits - len).min(127);
        if all.len() as u128 + count > MAX_PROTECTED as u128 {
            return Err(format!(
                "--protect: more than {MAX_PROTECTED} addresses; give longer prefixes"
            ));
        }
        let base = match addr {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        } & !(count - 1);
        all.extend((0..count).map(|i| match addr {
            IpAddr::V4(_) => IpAddr::from(std::net::Ipv4Addr::from((base + i) as u32)),
            IpAddr::V6(_) => IpAddr::from(std::net::Ipv6Addr::from(base + i)),
        }));
    }
    Ok(all)
}

/// The most destinations `ctl sync udpflood` protects.
const MAX_PROTECTED: usize = 65_536;

fn parse_range(range: Option<&str>) -> CliResult<(u64, u64)> {
    let bad = |t: &str| format!("'{t}' is not an index or a range FIRST..END");
    Ok(match range {
        None => (0, 0),
        Some(r) => match r.split_once("..") {
            Some((a, b)) => {
                let a: u64 = a.parse().map_err(|_| bad(r))?;
                let b: u64 = b.parse().map_err(|_| bad(r))?;
                if b <= a {
                    return Err(format!("the range {r} is empty"));
                }
                (a, b - a)
            }
            None => (r.parse().map_err(|_| bad(r))?, 1),
        },
    })
}

fn meter_text(c: &MeterConfig) -> String {
    match *c {
        MeterConfig::Off => "off".into(),
        MeterConfig::SrTcm { cir, cbs, ebs } => format!("srtcm cir={cir} cbs={cbs} ebs={ebs}"),
        MeterConfig::TrTcm { cir, cbs, pir, pbs } => {
            format!("trtcm cir={cir} cbs={cbs} pir={pir} pbs={pbs}")
        }
    }
}

fn describe(d: &Declaration) -> String {
    let guarantees: Vec<&str> = d.guarantees.iter().map(|g| g.name()).collect();
    let field = |f: &Field| format!("{}:{}/{:?}", f.name, f.bits, f.kind).to_lowercase();
    match &d.kind {
        Kind::Table {
            key,
            actions,
            writable,
        } => {
            let mut s = format!(
                "table {} capacity={} guarantees={} {}\n  key: {}",
                d.name,
                d.capacity,
                guarantees.join(","),
                if *writable {
                    "read-write"
                } else {
                    "filled by the data plane (read, delete)"
                },
                key.iter().map(field).collect::<Vec<_>>().join(" ")
            );
            for a in actions {
                let params: Vec<String> = a
                    .params
                    .iter()
                    .map(|p| format!("{}:{}", p.name, p.bits))
                    .collect();
                s.push_str(&format!("\n  action: {} {}", a.name, params.join(" ")));
            }
            s
        }
        Kind::Register { bits } => format!(
            "register {} size={} bits={bits} guarantees={}",
            d.name,
            d.capacity,
            guarantees.join(",")
        ),
        Kind::Meters => format!(
            "meters {} size={} guarantees={}",
            d.name,
            d.capacity,
            guarantees.join(",")
        ),
        Kind::Rules { tables } => format!(
            "rules {} tables={tables} capacity={} guarantees={}\n  written as rule text: ctl add-flow, mod-flows, del-flows, dump-flows",
            d.name,
            d.capacity,
            guarantees.join(",")
        ),
    }
}

/// Reads a flow filter: `table=N`, `cookie=VALUE` (all bits) or `cookie=VALUE/MASK`,
/// separated by commas; empty: every rule.
pub fn parse_flow_filter(text: &str) -> Result<FlowFilter, String> {
    let mut f = FlowFilter::default();
    let number = |word: &str, t: &str| -> Result<u64, String> {
        match t.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => t.parse(),
        }
        .map_err(|_| format!("'{word}': '{t}' is not a number"))
    };
    for word in text.split([',', ' ']).filter(|w| !w.is_empty()) {
        match word.split_once('=') {
            Some(("table", t)) => {
                f.table = Some(
                    u8::try_from(number(word, t)?)
                        .map_err(|_| format!("'{word}': tables are numbered 0 to 255"))?,
                );
            }
            Some(("cookie", c)) => {
                let (v, m) = c.split_once('/').unwrap_or((c, "0xffffffffffffffff"));
                (f.cookie, f.cookie_mask) = (number(word, v)?, number(word, m)?);
            }
            _ => {
                return Err(format!(
                    "'{word}' is not a filter word: use table=N and cookie=VALUE[/MASK]"
                ));
            }
        }
    }
    Ok(f)
}

/// The rule pipeline a flow command is about: the one named, or the program's first.
fn pipeline_name(client: &Client, target: &FlowTarget) -> Result<String, String> {
    if let Some(name) = &target.pipeline {
        return Ok(name.clone());
    }
    (client.declarations().iter())
        .find(|d| matches!(d.kind, Kind::Rules { .. }))
        .map(|d| d.name.clone())
        .ok_or_else(|| {
            format!(
                "the running program ({}) has no rule pipeline; run the `pipeline` program",
                client.program()
            )
        })
}

fn add_flows(
    client: &mut Client,
    target: &FlowTarget,
    lines: Vec<String>,
    keep_counters: bool,
) -> CliResult<()> {
    let add = FlowChange::Add {
        lines,
        keep_counters,
    };
    flows(client, target, add)
}

/// The lines of a rule file; comments and blank lines are kept, so that errors give the
/// file's line numbers.
fn rule_lines(file: &std::path::Path) -> CliResult<Vec<String>> {
    let text = std::fs::read_to_string(file)
        .map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    Ok(text.lines().map(String::from).collect())
}

fn flows(client: &mut Client, target: &FlowTarget, change: FlowChange) -> CliResult<()> {
    if let FlowChange::Add { lines, .. } | FlowChange::Replace { lines, .. } = &change {
        for w in stateplane_programs::pipeline::rule_warnings(lines.iter().map(String::as_str)) {
            eprintln!("warning: {w}");
        }
    }
    let name = pipeline_name(client, target)?;
    let dump = matches!(change, FlowChange::Dump(_));
    let what = match &change {
        FlowChange::Add { lines, .. } => format!(
            "added {} rules",
            (lines.iter().map(|l| l.trim()))
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .count()
        ),
        FlowChange::Modify { .. } => "modified".into(),
        FlowChange::Delete(_) => "deleted".into(),
        FlowChange::Dump(_) => "dumped".into(),
        FlowChange::Replace { .. } => "replaced".into(),
        FlowChange::Expire(_) => "expired".into(),
    };
    // Printed piece by piece as they come: a dump of any size holds one piece at a time.
    let mut answered = 0;
    let reply = client
        .flows_each(&name, &change, |piece| {
            for r in &piece {
                if dump {
                    println!("{}", dumped_flow(r));
                } else {
                    println!("{}", r.rule);
                }
            }
            answered += piece.len();
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    let version = reply.version;
    match change {
        FlowChange::Add { .. } => eprintln!("{what} at version {version}"),
        FlowChange::Replace { table, .. } => eprintln!(
            "replaced the rules of {name}{} at version {version}: {answered} deleted (above), {} added, {} kept",
            table.map_or(String::new(), |t| format!(" table {t}")),
            reply.added,
            reply.kept
        ),
        _ => eprintln!("{what} {answered} rules of {name} at version {version}"),
    }
    Ok(())
}

/// A rule as `ovs-ofctl dump-flows` shows one: its age, counters and time since its last
/// packet, then the rule.
fn dumped_flow(r: &stateplane_control::pb::Flow) -> String {
    format!(
        " duration={:.3}s, n_packets={}, n_bytes={}, idle_age={}, {}",
        r.duration_ns as f64 / 1e9,
        r.packets,
        r.bytes,
        r.idle_ns / 1_000_000_000,
        r.rule
    )
}

fn notification(declarations: &[Declaration], n: &stateplane_control::pb::Notification) -> String {
    if let Some(flow) = &n.flow {
        return format!(
            "{} flow_removed {} reason={}{}",
            n.at_ns,
            n.table,
            n.reason,
            dumped_flow(flow)
        );
    }
    let entry = declarations
        .iter()
        .find(|d| d.name == n.table)
        .and_then(|d| {
            let e = n.entry.as_ref()?;
            let mut entry = stateplane_control::convert::entry_from_pb(e, d).ok()?;
            entry.hits = e.hits;
            Some(text::print_entry(d, &entry))
        })
        .unwrap_or_default();
    let what = match (n.kind.as_str(), n.deleted) {
        ("idle_timeout", true) => "aged-out",
        ("idle_timeout", false) => "idle",
        (k, _) => k,
    };
    format!("{} {what} {} {entry}", n.at_ns, n.table)
}

/// Prints each write committed, with what the switch refused of it; an error if it refused
/// any (the write committed, and those entries are not in the switch).
fn print_writes_done(
    done: &[stateplane_control::sync_pb::WriteDone],
    switch: u32,
) -> CliResult<()> {
    let mut refused = 0;
    for d in done {
        let said = match d.refused {
            Some(0) => String::new(),
            Some(n) => format!(", {n} refused"),
            None => ", refusals not told (committed before its cancel)".to_string(),
        };
        println!(
            "stream {}: write {} committed, {} parts ({} sent) in {:.3} ms{said}",
            d.stream,
            d.id,
            d.parts,
            d.transmissions,
            d.latency_ns as f64 / 1e6
        );
        refused += d.refused.unwrap_or(0);
    }
    if refused > 0 {
        return Err(format!(
            "switch {switch} refused {refused} entries or values of the write whole (a full \
             table, fields that do not fit its declaration, or a value wider than its \
             register's cells; its log says which write): they are not in the switch"
        ));
    }
    Ok(())
}
