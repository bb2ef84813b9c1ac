//! Flow records of a run: the flow stage in every worker (a tap behind its program) and
//! the exporter they feed, from the flags of `stateplane flows` or a run's `[flows]`
//! section ([`FlowSettings`]), and what they did ([`FlowReport`]).

use crate::SetupResult;
use crate::export::{ExportConfig, ExportReport, Exporter, Naming, SinkSpec};
use crate::units::{MessageSize, Pace, SpoolSize, bounded};
use stateplane_flows::aggregator::Timeouts;
use stateplane_flows::ipfix::{Dialect, Features};
use stateplane_flows::stage::{FlowStage, FlowTap, StageConfig, StageCounters};
use stateplane_runtime::{Burst, Context, Tap, TapFactory};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// The flow stage's and the exporter's settings: the flags of `stateplane flows`, and the
/// keys of the `[flows]` section with which `stateplane run` gives any program flow
/// records of what it forwarded. Defaults as mature exporters (15 s inactive, 30 min active).
#[derive(clap::Args, serde::Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields, default)]
pub struct FlowSettings {
    /// Send IPFIX over UDP to this collector (repeatable), e.g. 127.0.0.1:4739.
    #[arg(long)]
    pub ipfix: Vec<SocketAddr>,
    /// Send IPFIX over TCP to this collector (a connection lost later is made again, a
    /// second later and then at waits doubling up to 30 s, as a new stream; what is
    /// exported meanwhile is lost and counted, or spooled with --ipfix-spool).
    #[arg(long)]
    pub ipfix_tcp: Vec<SocketAddr>,
    /// Keep what a TCP collector misses (exported while its connection is down, or never
    /// acknowledged when it ends) in this directory, one IPFIX file per collector, and
    /// send it first once the collector is back, in this run or the next one that spools
    /// there. With a spool, a collector not reachable at the start is waited for.
    #[arg(long, value_name = "DIR")]
    pub ipfix_spool: Option<PathBuf>,
    /// The bytes each TCP collector's spool may hold (k, M, G or T); past it, messages
    /// are lost and counted.
    #[arg(long, value_name = "BYTES", default_value_t = DEFAULT.ipfix_spool_max)]
    pub ipfix_spool_max: SpoolSize,
    /// Write IPFIX to this file (RFC 5655).
    #[arg(long)]
    pub ipfix_file: Vec<PathBuf>,
    /// Send NetFlow version 9 (RFC 3954) over UDP to this collector (repeatable), for
    /// collectors that take no IPFIX, e.g. 127.0.0.1:2055: the same records, paced and
    /// sized as IPFIX over UDP, with three differences: no iat (NetFlow v9 has no
    /// enterprise elements; refused), a biflow goes out as two one-way records, and UDP
    /// only (its messages carry no length to frame them in a stream or a file).
    #[arg(long, value_name = "HOST:PORT")]
    pub netflow9: Vec<SocketAddr>,
    /// Write CSV to this file, or - for standard output.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write JSON lines to this file, or - for standard output.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Features to export: default, all, or a list of counts, times, tcp_flags, tos, ttl,
    /// sizes, iat, ports, vlan, icmp, end_reason, forwarding (what the program did with
    /// the flow's last packet: forwarded, dropped and why, to the control plane; runs
    /// only).
    #[arg(long, default_value = "default")]
    pub features: String,
    /// Biflow records (RFC 5103): both directions of a connection in one record, the side
    /// that sent first as forward.
    #[arg(long)]
    pub biflow: bool,
    /// Seconds without a packet after which a flow is exported.
    #[arg(long, default_value_t = DEFAULT.inactive_timeout)]
    pub inactive_timeout: f64,
    /// Seconds after which a long flow is exported (and goes on in a new record).
    #[arg(long, default_value_t = DEFAULT.active_timeout)]
    pub active_timeout: f64,
    /// Seconds a TCP flow closed by FIN (both directions' for --biflow) must be quiet
    /// before it is exported, so that the final ACK of the close joins it; 0 exports it
    /// at the FIN (the final ACK then makes a one-packet record). An RST ends a flow at
    /// once.
    #[arg(long, default_value_t = DEFAULT.fin_timeout)]
    pub fin_timeout: f64,
    /// Microflow table slots per worker and family (a power of two); 0 sends every packet
    /// straight to the flow table (one level).
    #[arg(long, default_value_t = DEFAULT.microflow_slots)]
    pub microflow_slots: usize,
    /// Flows each worker holds per address family; when full, the least recently active
    /// of a sample is exported early (counted).
    #[arg(long, default_value_t = DEFAULT.max_flows)]
    pub max_flows: usize,
    /// Make each flow table its full size (--max-flows) at the start, so that it never
    /// doubles while running: the last doubling holds a worker about 2 ms at the default
    /// size, which a live port at line rate must hold in its rings. Memory is still touched
    /// only as flows arrive (but fills toward the budget sooner).
    #[arg(long)]
    pub presize_flows: bool,
    /// How fast IPFIX goes to each UDP collector: auto, as fast as a collector on this
    /// host reads (its socket's queue, which the kernel shows, is kept below three
    /// quarters of its buffer, so nothing is dropped) and 28M to one on another host; or
    /// bytes per second, in bursts of at most 22,400 bytes (or one larger message), with
    /// k, M and G for thousands, millions, billions; 0 unpaced.
    #[arg(long, default_value_t = DEFAULT.ipfix_rate)]
    pub ipfix_rate: Pace,
    /// Largest IPFIX message over UDP, in bytes (512 to 65535), or auto: what one packet
    /// on the route to the collector carries (its MTU less the IP and UDP headers: 64 KiB
    /// on loopback, 1,472 bytes on Ethernet, read when the socket opens), or 1,400 where
    /// the kernel does not say.
    #[arg(long, default_value_t = DEFAULT.mtu)]
    pub mtu: MessageSize,
    /// Hand the kernel runs of equal-size IPFIX messages in one send, to cut into datagrams
    /// (UDP generic segmentation offload): about a quarter of the time per message on
    /// loopback. One send holds 64 KiB, so this joins messages only with a --mtu of a few
    /// thousand bytes or less (not --mtu auto on loopback). Collectors receive the same
    /// datagrams, but a capture taken on this host (tcpdump on the sending side, or on
    /// loopback) shows each send as one oversized packet, which tshark calls malformed;
    /// hence off unless asked for.
    #[arg(long)]
    pub ipfix_gso: bool,
    /// IPFIX observation domain id.
    #[arg(long, default_value_t = DEFAULT.domain)]
    pub domain: u32,
}

/// The defaults of [`FlowSettings`], for the flags and the config alike.
const DEFAULT: FlowSettings = FlowSettings {
    ipfix: Vec::new(),
    ipfix_tcp: Vec::new(),
    ipfix_spool: None,
    ipfix_spool_max: SpoolSize(1_000_000_000),
    ipfix_file: Vec::new(),
    netflow9: Vec::new(),
    csv: None,
    json: None,
    features: String::new(),
    biflow: false,
    inactive_timeout: 15.0,
    active_timeout: 1800.0,
    fin_timeout: 2.0,
    microflow_slots: 4096,
    max_flows: 1 << 18,
    presize_flows: false,
    ipfix_rate: Pace::Auto,
    mtu: MessageSize::Auto,
    ipfix_gso: false,
    domain: 1,
};

impl Default for FlowSettings {
    fn default() -> Self {
        FlowSettings {
            features: "default".into(),
            ..DEFAULT
        }
    }
}

/// What a worker gets if it asks twice for its stage (never in one run).
struct NoTap;

impl Tap for NoTap {
    fn observe(&mut self, _burst: &Burst, _ctx: &Context) {}
}

fn seconds(name: &str, s: f64) -> SetupResult<u64> {
    if s.is_finite() && s > 0.0 && s < 1e9 {
        Ok((s * 1e9) as u64)
    } else {
        Err(format!("{name}: {s} is not a positive number of seconds"))
    }
}

/// [`seconds`], or 0 for none.
fn seconds_or_zero(name: &str, s: f64) -> SetupResult<u64> {
    if s == 0.0 {
        Ok(0)
    } else {
        seconds(name, s).map_err(|e| format!("{e} (or 0 for none)"))
    }
}

/// A text sink's file, or `None` for `-` (standard output).
fn file_or_stdout(path: &std::path::Path) -> Option<PathBuf> {
    (path.as_os_str() != "-").then(|| path.to_path_buf())
}

/// A flow stage in every worker and the exporter they feed: what `stateplane flows` runs
/// behind an observer, and what a `[flows]` section adds to `stateplane run`.
pub struct FlowExport {
    exporter: Exporter,
    counters: Arc<Mutex<Vec<StageCounters>>>,
}

/// What a run's flow stages and exporter did.
pub struct FlowReport {
    pub stages: StageCounters,
    pub export: ExportReport,
}

impl FlowSettings {
    /// Checks the settings (errors name the flag or key, as `naming` says), opens every
    /// sink and builds a stage for each of `workers`, hashing with `seed`. `live`: a full
    /// exporter queue drops records (counted) instead of holding the workers.
    /// `drop_names`: the program's drop reasons, or `None` behind an observer, whose
    /// verdicts say nothing of the packets' fate (`forwarding` is then refused).
    pub fn start(
        &self,
        naming: Naming,
        workers: usize,
        seed: u64,
        live: bool,
        drop_names: Option<&'static [&'static str]>,
    ) -> SetupResult<(FlowExport, TapFactory)> {
        let name = |key| naming.name(key);
        let mut features =
            Features::parse(&self.features).map_err(|e| format!("{}: {e}", name("features")))?;
        // Features that cannot be exported here are refused when named; `all` is all that
        // can be.
        let named = Features::named(&self.features);
        if drop_names.is_none() {
            if named.has(Features::FORWARDING) {
                return Err(format!(
                    "{}: `forwarding` is what a program did with each flow's packets, and \
                     this command only watches them: leave it out, or export from \
                     `stateplane run` with a [flows] section",
                    name("features")
                ));
            }
            features.0 &= !Features::FORWARDING;
        }
        let stage = StageConfig {
            microflow_slots: self.microflow_slots,
            max_flows: bounded(&name("max_flows"), self.max_flows, 1, 1 << 28)?,
            timeouts: Timeouts {
                inactive_ns: seconds(&name("inactive_timeout"), self.inactive_timeout)?,
                active_ns: seconds(&name("active_timeout"), self.active_timeout)?,
                fin_ns: seconds_or_zero(&name("fin_timeout"), self.fin_timeout)?,
            },
            biflow: self.biflow,
            presize: self.presize_flows,
            extremes: features.needs_extremes(),
            ..StageConfig::default()
        };
        if self.ipfix_spool.is_some() && self.ipfix_tcp.is_empty() {
            return Err(format!(
                "{}: a spool keeps what TCP collectors miss; give {} too (a UDP collector's \
                 losses are counted, a file's writes are checked)",
                name("ipfix_spool"),
                name("ipfix_tcp")
            ));
        }
        if !self.netflow9.is_empty()
            && let Some(why) = Dialect::Netflow9.refuses(named)
        {
            return Err(format!(
                "{}: {why} (a {} collector is given)",
                name("features"),
                name("netflow9")
            ));
        }
        let mut sinks: Vec<SinkSpec> = self.ipfix.iter().map(|a| SinkSpec::IpfixUdp(*a)).collect();
        sinks.extend(self.ipfix_tcp.iter().map(|a| SinkSpec::IpfixTcp(*a)));
        sinks.extend(
            self.ipfix_file
                .iter()
                .map(|p| SinkSpec::IpfixFile(p.clone())),
        );
        sinks.extend(self.netflow9.iter().map(|a| SinkSpec::Netflow9Udp(*a)));
        if let Some(p) = &self.csv {
            sinks.push(SinkSpec::Csv(file_or_stdout(p)));
        }
        if let Some(p) = &self.json {
            sinks.push(SinkSpec::Json(file_or_stdout(p)));
        }
        // Every worker's tables at their budget, claimed before any is made.
        let per_worker = FlowStage::budget_for(&stage);
        let setting = name("max_flows");
        stateplane_mem::budget::claim_once(
            &setting,
            || {
                format!(
                    "flow tables of {} flows for {workers} workers",
                    stage.max_flows
                )
            },
            per_worker.saturating_mul(workers as u64),
        )
        .map_err(|e| format!("{setting}: {e}"))?;
        // Stages first, so that a bad size is an error before any sink is opened.
        let stages = (0..workers)
            .map(|w| {
                FlowStage::new(
                    stage,
                    seed ^ (w as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                )
                .map_err(|e| format!("{} / {}: {e}", name("microflow_slots"), name("max_flows")))
            })
            .collect::<SetupResult<Vec<_>>>()?;
        let exporter = Exporter::start(
            ExportConfig {
                naming,
                sinks,
                features,
                biflow: self.biflow,
                domain: self.domain,
                mtu: self.mtu,
                pace: self.ipfix_rate,
                gso: self.ipfix_gso,
                spool: (self.ipfix_spool.clone()).map(|dir| (dir, self.ipfix_spool_max.0)),
                drop_names: drop_names.unwrap_or_default(),
            },
            live,
        )?;
        let counters = Arc::new(Mutex::new(Vec::new()));
        let observer = drop_names.is_none();
        let taps: Vec<Option<FlowTap>> = (stages.into_iter())
            .map(|stage| {
                let sink = Box::new(exporter.sink());
                let tap = FlowTap::new(stage, sink).reporting_to(counters.clone());
                Some(if observer { tap.observing() } else { tap })
            })
            .collect();
        let taps = Mutex::new(taps);
        let factory: TapFactory = Arc::new(move |w| {
            let mut taken = taps
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Each worker asks once (a live reload replaces the program, not the tap).
            match taken.get_mut(w).and_then(Option::take) {
                Some(tap) => Box::new(tap) as Box<dyn Tap>,
                None => Box::new(NoTap),
            }
        });
        Ok((FlowExport { exporter, counters }, factory))
    }
}

impl FlowExport {
    /// Whether records go to standard output.
    pub fn writes_to_stdout(&self) -> bool {
        self.exporter.writes_to_stdout()
    }

    /// What the exporter has done so far (for the metrics).
    pub fn progress(&self) -> Arc<crate::export::ExportProgress> {
        self.exporter.progress()
    }

    /// Waits until every record is written. The run and its tap factory must be gone
    /// (stages no worker took hold sinks too, and the exporter's queue ends with them).
    pub fn finish(self) -> FlowReport {
        let export = self.exporter.finish();
        let mut stages = StageCounters::default();
        let counters = self.counters.lock();
        for s in counters
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
        {
            stages.merge(s);
        }
        FlowReport { stages, export }
    }
}

impl FlowReport {
    /// The first sink that failed, as an error.
    pub fn error(&self) -> Option<String> {
        (self.export.sinks.iter())
            .find_map(|s| (s.error.as_ref()).map(|e| format!("export failed: {}: {e}", s.name)))
    }

    pub fn to_json(&self, wall: std::time::Duration) -> serde_json::Value {
        let t = &self.stages;
        let sinks: Vec<_> = (self.export.sinks.iter())
            .map(|s| {
                let collector = (s.collector.as_ref()).map(|c| {
                    serde_json::json!({"buffer_bytes": c.capacity, "drops": c.drops,
                    "waited_seconds": c.waited.as_secs_f64(), "stalls": c.stalls,
                    "error": c.error})
                });
                serde_json::json!({"sink": s.name, "messages": s.units, "bytes": s.bytes,
                "records": s.records, "lost_messages": s.lost, "records_lost": s.records_lost,
                "unconfirmed_messages": s.unconfirmed, "reconnects": s.reconnects,
                "spooled_messages": s.spooled, "disk_recovered": s.recovered,
                "spool": (s.spool.as_ref()).map(|(path, records)| serde_json::json!({
                    "file": path, "records_waiting": records})),
                "unreachable": s.unreachable, "error": s.error, "reader_gone": s.reader_gone,
                "collector_queue": collector})
            })
            .collect();
        serde_json::json!({
            "packets": t.packets, "bytes": t.bytes, "not_ip": t.not_ip,
            "flows": t.flows_created, "records": t.records_out,
            "microflow_records": t.microflow_records, "evicted_full": t.evicted_full,
            "records_taken": self.export.records, "records_exported": self.export.delivered(),
            "records_dropped": self.export.dropped,
            "seconds": wall.as_secs_f64(), "mpps": mpps(t.packets, wall), "sinks": sinks,
        })
    }

    /// The summary as a table.
    pub fn table(&self, wall: std::time::Duration) -> String {
        use std::fmt::Write;
        let t = &self.stages;
        let ratio = t.packets as f64 / t.microflow_records.max(1) as f64;
        let mut s = String::new();
        let rate = mpps(t.packets, wall);
        let secs = wall.as_secs_f64();
        let _ = writeln!(
            s,
            "packets        {:>14}   ({rate:.2} Mpps over {secs:.2} s)",
            t.packets
        );
        let _ = writeln!(s, "bytes (IP)     {:>14}", t.bytes);
        let _ = writeln!(s, "not IP         {:>14}   (in no flow)", t.not_ip);
        let _ = writeln!(s, "flows          {:>14}", t.flows_created);
        let _ = writeln!(s, "records        {:>14}", t.records_out);
        let recs = t.microflow_records;
        let _ = writeln!(
            s,
            "microflow recs {recs:>14}   ({ratio:.2} packets per record)"
        );
        let _ = match t.evicted_full {
            0 => writeln!(s, "evicted (full) {:>14}", 0),
            // Each of those flows goes on in another record: the user's fix is a larger table.
            n => writeln!(
                s,
                "evicted (full) {n:>14}   (exported early, the flow table was full: \
                 --max-flows, or max_flows in a [flows] section, makes it larger)"
            ),
        };
        if self.export.dropped > 0 {
            let dropped = self.export.dropped;
            let _ = writeln!(
                s,
                "DROPPED        {dropped:>14}   records: the exporter fell behind"
            );
        }
        for sink in &self.export.sinks {
            let (name, units, bytes) = (&sink.name, sink.units, sink.bytes);
            let records = sink.records;
            let _ = match &sink.error {
                None => write!(
                    s,
                    "{name}: {units} messages/lines, {records} records, {bytes} bytes{}",
                    if sink.reader_gone {
                        ", then its reader closed the pipe"
                    } else {
                        ""
                    }
                ),
                Some(e) => write!(s, "{name}: FAILED after {units} messages: {e}"),
            };
            if sink.spool.is_some() && (sink.spooled > 0 || sink.reconnects > 0) {
                let (spooled, again) = (sink.spooled, sink.reconnects);
                let _ = write!(
                    s,
                    "; {spooled} messages spooled while the collector was away or before it \
                     acknowledged them ({} unconfirmed; connected again {again} times)",
                    sink.unconfirmed
                );
                if sink.lost > 0 {
                    let _ = write!(
                        s,
                        "; LOST {} messages ({} records): the spool was full",
                        sink.lost, sink.records_lost
                    );
                }
            } else if sink.reconnects > 0 || sink.unconfirmed > 0 {
                let (lost, again) = (sink.lost, sink.reconnects);
                let _ = write!(
                    s,
                    "; LOST {lost} messages ({} records) while the collector was away or \
                     before it acknowledged them ({} unconfirmed; connected again {again} times)",
                    sink.records_lost, sink.unconfirmed
                );
            } else if sink.file {
                if sink.recovered > 0 && sink.error.is_none() {
                    let _ = write!(
                        s,
                        "; the disk refused writes and took them again {} times",
                        sink.recovered
                    );
                }
                if sink.lost > 0 && sink.error.is_none() {
                    let _ = write!(
                        s,
                        "; LOST {} units ({} records) while the disk refused writes",
                        sink.lost, sink.records_lost
                    );
                }
            } else if sink.lost > 0 && !sink.unreachable {
                let _ = write!(
                    s,
                    "; REFUSED at least {} messages while the collector was unreachable \
                     (ICMP port unreachable)",
                    sink.lost
                );
            }
            if let Some(c) = &sink.collector {
                let waited = c.waited.as_secs_f64() * 1e3;
                let _ = write!(
                    s,
                    "; the collector's socket: {} byte buffer, waited {waited:.1} ms for room",
                    c.capacity
                );
                if c.drops > 0 {
                    let _ = write!(s, ", DROPPED {} datagrams while this ran", c.drops);
                }
                if c.stalls > 0 {
                    let _ = write!(
                        s,
                        ", STALLED {} times (took nothing for {} s; messages went regardless)",
                        c.stalls,
                        crate::export::STALL.as_secs()
                    );
                }
                if let Some(e) = &c.error {
                    let _ = write!(s, ", {e}");
                }
            }
            s.push('\n');
        }
        s
    }
}

fn mpps(packets: u64, wall: std::time::Duration) -> f64 {
    packets as f64 / wall.as_secs_f64().max(1e-9) / 1e6
}
