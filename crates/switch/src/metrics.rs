//! A Prometheus text endpoint on loopback: `GET /metrics` returns every counter, totals and
//! per worker, encoded by `prometheus-client` (names, help, escaping and the `_total`
//! suffix as Prometheus expects them). One small thread, one connection at a time; nothing
//! on the packet path: a scrape reads the counters the workers publish.

use crate::redis_mirror::RedisCounters;
use crate::replication_stage::ReplicationCounters;
use crate::sync_stage::SyncCounters;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, prometheus_text};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use stateplane_control::collector_api::CollectorHandle;
use stateplane_runtime::RunHandle;
use stateplane_runtime::{Counter, Stats};
use std::fmt;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

/// Parses and checks the address: loopback only, so that nothing is exposed beyond the host.
/// A loopback address and port given to `flag` (an endpoint with no authentication), e.g.
/// `example`.
pub fn parse_addr(flag: &str, text: &str, example: &str) -> Result<SocketAddr, String> {
    let addr: SocketAddr = text.parse().map_err(|_| {
        format!("{flag}: '{text}' is not an address and port; write it like {example}")
    })?;
    if !addr.ip().is_loopback() {
        return Err(format!(
            "{flag}: {addr} is not a loopback address; the endpoint serves on 127.0.0.1 or [::1] only"
        ));
    }
    Ok(addr)
}

/// What one scrape reads: the run's shared counters, read as they are at that moment, and
/// the bounds it runs within.
pub struct Scrape {
    pub handle: Arc<RunHandle>,
    pub drop_names: &'static [&'static str],
    pub ports: Vec<String>,
    /// The sync stages' counters, where state is synced.
    pub sync: Option<Arc<SyncCounters>>,
    /// The replication stages' counters, where state is replicated.
    pub replication: Option<Arc<ReplicationCounters>>,
    /// The flow exporter's counts, where a `[flows]` section exports records.
    pub flows: Option<Arc<crate::export::ExportProgress>>,
    pub bounds: Vec<Bound>,
    /// What the run holds of its memory budget, by setting.
    pub memory: stateplane_mem::budget::Growth,
    /// A live run's control plane: its tables' entries against their capacity, asked of
    /// the workers at each scrape.
    pub plane: Option<Arc<stateplane_runtime::ControlPlane>>,
    /// A live run's control API: its requests by method.
    pub control_requests: Option<Arc<stateplane_control::server::RequestCounts>>,
}

/// A bound the run was set up with (a memory budget, a queue's depth), served as a gauge
/// so that what fills it can be read against it.
#[derive(Clone, Debug)]
pub struct Bound {
    pub name: &'static str,
    pub help: &'static str,
    pub value: Level,
}

/// What a bound's gauge reads at a scrape.
#[derive(Clone, Debug)]
pub enum Level {
    Fixed(u64),
    /// What the run has claimed of its memory budget by now: at loading, and since, as
    /// routes, rules and parked packets grew.
    Claimed(stateplane_mem::budget::Growth),
}

impl Level {
    fn now(&self) -> u64 {
        match self {
            Level::Fixed(v) => *v,
            Level::Claimed(growth) => growth.claimed(),
        }
    }
}

impl fmt::Debug for Scrape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Scrape")
            .field("ports", &self.ports)
            .finish()
    }
}

/// A counter's series, each its labels and its value.
type Series = Vec<(Vec<(&'static str, String)>, u64)>;

/// The bounds of a run: its memory budget and what its sizes claimed of it, and the queue
/// and burst of each worker.
pub fn run_bounds(
    claimed: &stateplane_mem::budget::Claimed,
    growth: stateplane_mem::budget::Growth,
    burst: usize,
    queue: usize,
) -> Vec<Bound> {
    vec![
        Bound {
            name: "memory_budget_bytes",
            help: "The memory the run may take (--memory-budget, memory_budget)",
            value: Level::Fixed(claimed.limit),
        },
        Bound {
            name: "memory_claimed_bytes",
            help: "What the run has claimed of the budget, in all copies: the settings' sizes (tables, sketches, flow tables, caches, rings) at the start, and since then what grew (routes, rules, parked packets)",
            value: Level::Claimed(growth),
        },
        Bound {
            name: "burst_packets",
            help: "Packets a worker takes at most at a time (--burst)",
            value: Level::Fixed(burst as u64),
        },
        Bound {
            name: "queue_depth_bursts",
            help: "Bursts that may wait in each worker's queue (queue_depth)",
            value: Level::Fixed(queue as u64),
        },
    ]
}

/// Each declared table's entries, capacity and bytes (gauges) and every count its workers
/// keep (lookups, hits, adds, adds refused by reason, deletes, expiries by what they did),
/// and a rule pipeline's rules and microflow cache (hits, misses, inserts, evictions,
/// collisions), as the workers answer a stats request, summed over them; a table whose
/// workers do not answer in time (a run over files that has ended) is left out of this
/// scrape.
fn encode_tables(
    e: &mut DescriptorEncoder,
    plane: &stateplane_runtime::ControlPlane,
) -> fmt::Result {
    use stateplane_state::{Kind, Reply, Request};
    let mut gauges: Vec<(&'static str, Series)> = Vec::new();
    // Counter families in the order they first come, each with its series.
    let mut families: Vec<(&'static str, Series)> = Vec::new();
    let add = |to: &mut Vec<(&'static str, Series)>, family, labels, value| match (to.iter_mut())
        .find(|(f, _)| *f == family)
    {
        Some((_, series)) => series.push((labels, value)),
        None => to.push((family, vec![(labels, value)])),
    };
    for d in plane.declarations().iter() {
        let capacity = match d.kind {
            Kind::Table { .. } => "table_capacity",
            Kind::Rules { .. } => "rules_capacity",
            _ => continue,
        };
        let asked = plane.submit(Request::Stats {
            table: d.name.clone(),
        });
        let Ok(stateplane_runtime::Applied {
            reply: Reply::Counters(counters),
            ..
        }) = asked
        else {
            continue;
        };
        let table = ("table", d.name.clone());
        add(
            &mut gauges,
            capacity,
            vec![table.clone()],
            d.capacity as u64,
        );
        for (name, value) in counters {
            match name {
                "entries" => add(&mut gauges, "table_entries", vec![table.clone()], value),
                "bytes" => add(&mut gauges, "table_bytes", vec![table.clone()], value),
                "rules" => add(&mut gauges, "rules", vec![table.clone()], value),
                _ => {
                    let (family, label) = table_family(name);
                    let labels = std::iter::once(table.clone()).chain(label).collect();
                    add(&mut families, family, labels, value);
                }
            }
        }
    }
    for (family, series) in gauges {
        let help = match family {
            "table_entries" => "Entries a declared table holds, over all workers",
            "table_capacity" => "Entries a declared table may hold (per worker)",
            "table_bytes" => {
                "Bytes a declared table allocates, over all workers (touched as entries arrive)"
            }
            "rules" => "Rules a rule pipeline holds (every worker holds them all)",
            "rules_capacity" => "Rules a rule pipeline may hold",
            _ => "A declared table's level",
        };
        gauge(e, &format!("stateplane_{family}"), help, series)?;
    }
    for (family, series) in families {
        let help = match family {
            "lookups" => "Lookups in a declared table, over all workers",
            "hits" => "Lookups that found their entry",
            "adds" => "Entries added",
            "adds_refused" => {
                "Adds refused, by reason: full (no slot left) or rate (the source over its insert limit)"
            }
            "deletes" => "Entries deleted by the program or the control plane",
            "early_dropped" => {
                "Entries of an early-drop profile removed to make room for a new one"
            }
            "expired" => {
                "Entries past their timeout, by what was done: deleted, or kept and notified to the control plane"
            }
            "notifications_dropped" => "Expiry notifications lost because nobody drained them",
            "cache_hits" => "Packets a rule pipeline's microflow caches answered, over all workers",
            "cache_misses" => {
                "Packets a rule pipeline's microflow caches did not hold (classified by the rules)"
            }
            "cache_inserts" => "Microflows put in a rule pipeline's caches",
            "cache_evictions" => "Microflows pushed out of a rule pipeline's caches to make room",
            "cache_collisions" => {
                "Cache lookups that met their signature with another key (counted as misses)"
            }
            _ => "A declared table's count, over all workers",
        };
        // A pipeline's cache is its own family; a table's counts are the table's.
        let name = match family.strip_prefix("cache_") {
            Some(_) => format!("stateplane_{family}"),
            None => format!("stateplane_table_{family}"),
        };
        counter(e, &name, help, series)?;
    }
    Ok(())
}

/// Each port's own counts: a live port's from its socket, ring and the kernel (drops before
/// any worker saw them); a file port's packets and bytes read from its capture and written
/// to its output.
fn encode_ports(e: &mut DescriptorEncoder, handle: &RunHandle, names: &[String]) -> fmt::Result {
    let port = |p: usize| names.get(p).map_or_else(|| p.to_string(), Clone::clone);
    let live = handle.port_totals();
    // Each family's name and its value on each port.
    let families: Vec<(&'static str, &'static str, Vec<u64>)> = match live.first() {
        Some(first) => (first.named().iter().enumerate())
            .map(|(i, (name, _))| {
                let help = "A live port's own count (its socket, ring or the kernel)";
                (*name, help, live.iter().map(|c| c.named()[i].1).collect())
            })
            .collect(),
        // Neither yet: a live port before its first count, a file run before its first round.
        None if handle.file_ports().rx.is_empty() => Vec::new(),
        None => {
            let files = handle.file_ports();
            // Each port's packets (`.0`) or bytes (`.1`) on one side; 0 for a port that
            // has none on it (an output only, an input only).
            let column = |side: &[(u64, u64)], pick: fn(&(u64, u64)) -> u64| -> Vec<u64> {
                (0..names.len())
                    .map(|p| side.get(p).map_or(0, pick))
                    .collect()
            };
            let (read, written) = (&files.rx, &files.tx);
            vec![
                (
                    "rx_packets",
                    "Packets a file port read from its capture",
                    column(read, |c| c.0),
                ),
                (
                    "rx_bytes",
                    "Bytes (as captured) a file port read from its capture",
                    column(read, |c| c.1),
                ),
                (
                    "tx_packets",
                    "Packets a file port wrote to its output (or counted, with no output)",
                    column(written, |c| c.0),
                ),
                (
                    "tx_bytes",
                    "Bytes a file port wrote to its output (or counted, with no output)",
                    column(written, |c| c.1),
                ),
            ]
        }
    };
    for (name, help, values) in families {
        let series = (values.into_iter().enumerate())
            .map(|(p, v)| (vec![("port", port(p))], v))
            .collect();
        counter(e, &format!("stateplane_port_{name}"), help, series)?;
    }
    Ok(())
}

/// The control API's requests by method, and those refused; nothing before the first.
fn encode_control_requests(
    e: &mut DescriptorEncoder,
    requests: &stateplane_control::server::RequestCounts,
) -> fmt::Result {
    let by_method = requests.by_method();
    if by_method.is_empty() {
        return Ok(());
    }
    let series = |f: fn(&stateplane_control::server::MethodCounts) -> u64| -> Series {
        (by_method.iter())
            .map(|(method, c)| (vec![("method", method.clone())], f(c)))
            .collect()
    };
    counter(
        e,
        "stateplane_control_requests",
        "Requests to the control API (stateplane ctl), by gRPC method",
        series(|c| c.requests),
    )?;
    counter(
        e,
        "stateplane_control_refused",
        "Requests to the control API answered with an error (refused, invalid, unauthenticated), by gRPC method",
        series(|c| c.refused),
    )
}

/// The family a table's stats counter belongs to, and the label that tells it apart there
/// (a refused add's reason, what an expiry did).
fn table_family(name: &'static str) -> (&'static str, Option<(&'static str, String)>) {
    let split = |family, key, value: &str| (family, Some((key, value.to_string())));
    match name {
        "adds_refused_full" => split("adds_refused", "reason", "full"),
        "adds_refused_rate" => split("adds_refused", "reason", "rate"),
        "expired_deleted" => split("expired", "action", "deleted"),
        "expired_notified" => split("expired", "action", "notified"),
        other => (other, None),
    }
}

/// Encodes one counter family (the exposition names it `NAME_total`).
fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, series: Series) -> fmt::Result {
    let mut family = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in &series {
        ConstCounter::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// Encodes one gauge family (integers as integers, seconds as `f64`).
fn gauge<T: Copy>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: Vec<(Vec<(&'static str, String)>, T)>,
) -> fmt::Result
where
    ConstGauge<T>: EncodeMetric,
{
    let mut family = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in &series {
        ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// One counter with no labels.
fn single(e: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> fmt::Result {
    counter(e, name, help, vec![(Vec::new(), value)])
}

/// The sync stages' counters of a switch (`[sync]`).
fn encode_sync(e: &mut DescriptorEncoder, c: &SyncCounters) -> fmt::Result {
    let get = SyncCounters::get;
    for (name, help, value) in [
        (
            "changes",
            "Cells of synced state found changed by the sync stages' passes (a cell changed many times between two passes counts once)",
            get(&c.changes),
        ),
        (
            "passes",
            "Passes of the sync stages (each takes the changes since the one before)",
            get(&c.passes),
        ),
        (
            "threshold_carried",
            "The thresholds the messages of changes carried (what the collector bounds their values by), summed; over stateplane_sync_threshold_messages_total, their mean",
            get(&c.threshold_sum),
        ),
        (
            "threshold_messages",
            "Messages of changes whose thresholds stateplane_sync_threshold_carried_total sums",
            get(&c.threshold_messages),
        ),
        (
            "messages",
            "Sync messages sent to the collector",
            get(&c.messages),
        ),
        ("bytes", "Bytes of sync messages sent", get(&c.bytes)),
        (
            "send_errors",
            "Sync messages that could not be sent",
            get(&c.send_errors),
        ),
        (
            "reports",
            "Reports taken from the collector",
            get(&c.reports),
        ),
        (
            "refused",
            "Datagrams from the collector refused",
            get(&c.refused),
        ),
        (
            "resent",
            "Messages the collector lost and asked for again, sent again",
            get(&c.resent),
        ),
        (
            "passes_cut",
            "Sync passes that left a table's changes to the next, their take over its budget",
            get(&c.passes_cut),
        ),
        (
            "write_parts",
            "Parts of top-down writes taken",
            get(&c.write_parts),
        ),
        (
            "writes_committed",
            "Top-down writes committed whole",
            get(&c.writes_committed),
        ),
        (
            "writes_abandoned",
            "Top-down writes dropped before they committed, at the collector's request",
            get(&c.writes_abandoned),
        ),
        (
            "writes_renumbered",
            "Times a collector's writes came numbered anew (a collector that started again) and were taken up from there",
            get(&c.writes_renumbered),
        ),
        (
            "streams_over_channel",
            "Worker streams whose messages took more than their share of sync.channel_mbps over a second (each says so once in the log, with the cause that sent the most)",
            get(&c.streams_over_channel),
        ),
        (
            "entries_refused",
            "Table entries of top-down writes refused whole (words missing, fields that do not fit, a full table), and register values wider than their cells",
            get(&c.entries_refused),
        ),
    ] {
        single(e, &format!("stateplane_sync_{name}"), help, value)?;
    }
    let by_cause = [
        ("threshold", &c.sent_at_threshold),
        ("displaced", &c.sent_displaced),
        ("timed_out", &c.sent_timed_out),
        ("exact", &c.sent_exact),
        ("refresh", &c.sent_by_refresh),
    ];
    counter(
        e,
        "stateplane_sync_updates_sent",
        "Updates of synced state sent, by why they went: the threshold holds back only those at the threshold; displaced ones left the read handler's table for another location, timed_out ones waited max_age_ms, exact ones go at each change (a table's keys and actions, writes), refresh ones are the anti-entropy refresh",
        (by_cause.iter())
            .map(|&(cause, n)| (vec![("cause", cause.to_string())], get(n)))
            .collect(),
    )?;
    let seconds = |ns: &std::sync::atomic::AtomicU64| get(ns) as f64 / 1e9;
    let help = "Seconds the workers spent committing top-down writes (a worker forwards nothing while it commits)";
    let mut family = e.encode_descriptor(
        "stateplane_sync_commit_seconds",
        help,
        None,
        MetricType::Counter,
    )?;
    let no_labels: Vec<(&'static str, String)> = Vec::new();
    ConstCounter::new(seconds(&c.commit_ns)).encode(family.encode_family(&no_labels)?)?;
    gauge(
        e,
        "stateplane_sync_largest_threshold",
        "The largest threshold a message of changes carried",
        vec![(no_labels.clone(), get(&c.largest_threshold))],
    )?;
    gauge(
        e,
        "stateplane_sync_longest_pause_seconds",
        "The longest a sync stage held its worker in one go (a pass, or writes committed between two bursts), when the worker forwards nothing",
        vec![(no_labels, seconds(&c.longest_pause_ns))],
    )
}

/// The flow exporter's counts: records taken and dropped, and each sink's messages, bytes,
/// records and losses.
fn encode_flows(e: &mut DescriptorEncoder, p: &crate::export::ExportProgress) -> fmt::Result {
    use std::sync::atomic::Ordering::Relaxed;
    single(
        e,
        "stateplane_flow_records",
        "Flow records the exporter took from the workers' flow stages",
        p.records.load(Relaxed),
    )?;
    single(
        e,
        "stateplane_flow_records_dropped",
        "Flow records dropped because the exporter's queue was full (live runs; a run over files waits instead)",
        p.dropped.load(Relaxed),
    )?;
    let sinks = p.sinks();
    let per_sink = |f: &dyn Fn(&crate::export::SinkProgress) -> u64| -> Series {
        (sinks.iter())
            .map(|s| (vec![("sink", s.name.clone())], f(s)))
            .collect()
    };
    for (name, help, series) in [
        (
            "stateplane_flow_export_messages",
            "Messages (IPFIX, NetFlow v9) or lines (CSV, JSON) a sink wrote",
            per_sink(&|s| s.units),
        ),
        (
            "stateplane_flow_export_bytes",
            "Bytes a sink wrote",
            per_sink(&|s| s.bytes),
        ),
        (
            "stateplane_flow_export_records",
            "Flow records in what a sink wrote (over TCP, less those unconfirmed)",
            per_sink(&|s| s.records),
        ),
        (
            "stateplane_flow_export_lost_messages",
            "Messages a sink lost: refused by a UDP collector's host, written while a TCP collector's connection was down, or finding no room on a full disk",
            per_sink(&|s| s.lost),
        ),
    ] {
        counter(e, name, help, series)?;
    }
    Ok(())
}

/// The replication stages' counters of a switch (`replicated` state).
fn encode_replication(e: &mut DescriptorEncoder, c: &ReplicationCounters) -> fmt::Result {
    let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    for (name, help, value) in [
        (
            "packets",
            "Packets of replicated flows processed",
            &c.processed,
        ),
        (
            "waited_for_lease",
            "Packets held for their flow's lease",
            &c.waited_for_lease,
        ),
        (
            "waited_for_store",
            "Outputs held until the store acknowledged their writes",
            &c.waited_for_store,
        ),
        (
            "dropped",
            "Packets of replicated flows dropped as unreplicated (held too long or too many, their flow's lease lost)",
            &c.dropped,
        ),
        (
            "writes",
            "Writes sent to the store (one a flow while none is on its way)",
            &c.writes,
        ),
        (
            "coalesced",
            "Changes folded into a flow's waiting write",
            &c.coalesced,
        ),
        ("acquires", "Leases asked for", &c.acquires),
        (
            "migrated",
            "Leases granted with state from the store (not this switch's own, asked again)",
            &c.migrated,
        ),
        (
            "waited",
            "Leases granted after another holder's had passed",
            &c.waited,
        ),
        ("renewals", "Leases renewed", &c.renewals),
        (
            "fenced",
            "Requests refused by the store as from a former holder",
            &c.fenced,
        ),
        (
            "retaken",
            "Fenced writes written under the lease taken again, nobody having written since",
            &c.retaken,
        ),
        (
            "retransmits",
            "Requests sent again, unanswered",
            &c.retransmits,
        ),
        (
            "resolves",
            "Aliases asked of the store (packets that named their flow only by one)",
            &c.resolves,
        ),
        (
            "resolved",
            "Aliases the store resolved to a flow",
            &c.resolved,
        ),
        (
            "repeats_held",
            "Requests sent again not sent twice: the first was still on its way to the store",
            &c.repeats_held,
        ),
        ("round_trips", "Round trips to the store", &c.round_trips),
        (
            "store_errors",
            "Errors of the links to the store (a lost server)",
            &c.store_errors,
        ),
        (
            "reconnects",
            "Times a link to the store connected again",
            &c.reconnects,
        ),
        (
            "states_refused",
            "States from the store the program refused to install",
            &c.install_refused,
        ),
        (
            "snapshots",
            "Bounded mode: snapshots the store acknowledged",
            &c.snapshots,
        ),
        (
            "snapshot_bytes",
            "Bounded mode: bytes of the snapshots the store acknowledged",
            &c.snapshot_bytes,
        ),
        (
            "images_installed",
            "Bounded mode: snapshot images installed from the store (recovery)",
            &c.installed,
        ),
        (
            "stale_packets",
            "Bounded mode: packets processed while the store's snapshot was older than the bound",
            &c.stale,
        ),
    ] {
        single(
            e,
            &format!("stateplane_replication_{name}"),
            help,
            get(value),
        )?;
    }
    let no_labels: Vec<(&'static str, String)> = Vec::new();
    gauge(
        e,
        "stateplane_replication_held",
        "Packets the workers hold across bursts now (for a lease, or for the store)",
        vec![(no_labels.clone(), get(&c.held))],
    )?;
    gauge(
        e,
        "stateplane_replication_held_most",
        "The most packets one worker held at once",
        vec![(no_labels.clone(), get(&c.held_most))],
    )?;
    gauge(
        e,
        "stateplane_replication_staleness_most_seconds",
        "Bounded mode: the most staleness seen: the age of the store's snapshot",
        vec![(no_labels, get(&c.staleness_most_ns) as f64 / 1e9)],
    )
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let total = self.handle.totals();
        // One series per thread and none for the total, so that `sum()` over a family is
        // the total: entry 0 is the dispatcher (its drops belong to no worker), then the
        // workers.
        let by_thread: Vec<(String, Stats)> = (self.handle.stats.iter().enumerate())
            .map(|(i, s)| {
                let thread = match i {
                    0 => "dispatcher".to_string(),
                    w => (w - 1).to_string(),
                };
                (thread, s.snapshot())
            })
            .collect();
        for c in Counter::ALL {
            let series: Series = (by_thread.iter())
                .map(|(thread, s)| (vec![("worker", thread.clone())], s.get(c)))
                .collect();
            counter(
                &mut e,
                &format!("stateplane_{}", c.name()),
                c.help(),
                series,
            )?;
        }
        let by_reason = |counts: Vec<(&'static str, u64)>| -> Series {
            (counts.into_iter())
                .map(|(reason, v)| (vec![("reason", reason.to_string())], v))
                .collect()
        };
        let drops = by_reason(total.drops_by_every_reason(self.drop_names));
        counter(
            &mut e,
            "stateplane_drops",
            "Packets dropped, by reason",
            drops,
        )?;
        let malformed = by_reason(total.malformed_by_every_reason());
        let help = "Packets that failed to parse, by reason";
        counter(&mut e, "stateplane_malformed_packets", help, malformed)?;
        encode_ports(&mut e, &self.handle, &self.ports)?;
        if let Some(sync) = &self.sync {
            encode_sync(&mut e, sync)?;
        }
        if let Some(replication) = &self.replication {
            encode_replication(&mut e, replication)?;
        }
        if let Some(flows) = &self.flows {
            encode_flows(&mut e, flows)?;
        }
        if let Some(plane) = &self.plane {
            encode_tables(&mut e, plane)?;
        }
        if let Some(requests) = &self.control_requests {
            encode_control_requests(&mut e, requests)?;
        }
        for b in &self.bounds {
            gauge(
                &mut e,
                &format!("stateplane_{}", b.name),
                b.help,
                vec![(Vec::new(), b.value.now())],
            )?;
        }
        let shares = (self.memory.shares().into_iter())
            .map(|s| (vec![("setting", s.setting.clone())], s.bytes()))
            .collect();
        gauge(
            &mut e,
            "stateplane_memory_share_bytes",
            "What each setting holds of the memory budget, in all copies (a table's capacity, a sketch's width, the bursts; and what grows: routes, rules, an interface's rings); they add up to stateplane_memory_claimed_bytes",
            shares,
        )
    }
}

/// What one scrape of `stateplane collector --metrics` reads.
struct CollectorScrape {
    handle: Arc<CollectorHandle>,
    redis: Option<Arc<RedisCounters>>,
}

impl fmt::Debug for CollectorScrape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CollectorScrape")
    }
}

impl Collector for CollectorScrape {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let now = self.handle.now_ns();
        let (counters, datagrams, reports, refused, streams) = self.handle.with(|c| {
            let refused: Series = (c.refused.iter())
                .map(|(r, n)| (vec![("reason", r.to_string())], *n))
                .collect();
            (
                c.counters(),
                c.datagrams,
                c.reports_sent,
                refused,
                c.streams(),
            )
        });
        for (name, help, value) in [
            ("datagrams", "Datagrams received", datagrams),
            ("applied", "Sync messages applied", counters.applied),
            ("entries", "Values applied", counters.entries),
            (
                "gaps",
                "Gaps found in the streams' sequence numbers",
                counters.gaps,
            ),
            (
                "missing_messages",
                "Messages found missing",
                counters.missing,
            ),
            (
                "repaired_messages",
                "Messages found missing that came again, asked for or late",
                counters.repaired,
            ),
            (
                "given_up_messages",
                "Messages found missing and asked for in vain",
                counters.given_up,
            ),
            (
                "restarts",
                "Streams started over by a new epoch",
                counters.restarts,
            ),
            ("reports_sent", "Reports sent to the streams", reports),
        ] {
            single(&mut e, &format!("stateplane_collector_{name}"), help, value)?;
        }
        let help = "Datagrams refused, by reason";
        counter(&mut e, "stateplane_collector_refused", help, refused)?;
        let labels = |s: &stateplane_sync::collector::StreamInfo| {
            vec![
                ("switch", s.switch.to_string()),
                ("stream", s.stream.to_string()),
            ]
        };
        let age = (streams.iter())
            .map(|s| (labels(s), now.saturating_sub(s.applied_ns) as f64 / 1e9))
            .collect();
        gauge(
            &mut e,
            "stateplane_collector_stream_age_seconds",
            "Since the stream's last message was applied",
            age,
        )?;
        let per_stream = |f: &dyn Fn(&stateplane_sync::collector::StreamInfo) -> u64| {
            (streams.iter())
                .map(|s| (labels(s), i64::try_from(f(s)).unwrap_or(i64::MAX)))
                .collect()
        };
        let t = per_stream(&|s| s.threshold);
        gauge(
            &mut e,
            "stateplane_collector_stream_threshold",
            "The threshold the stream's worker works with",
            t,
        )?;
        let held = per_stream(&|s| s.locations as u64);
        gauge(
            &mut e,
            "stateplane_collector_stream_locations",
            "Locations held of the stream",
            held,
        )?;
        let missing = (streams.iter()).map(|s| (labels(s), s.missing)).collect();
        counter(
            &mut e,
            "stateplane_collector_stream_missing_messages",
            "Messages of the stream found missing",
            missing,
        )?;
        if let Some(r) = &self.redis {
            let get =
                |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
            single(
                &mut e,
                "stateplane_collector_redis_values",
                "Values written to Redis",
                get(&r.values),
            )?;
            single(
                &mut e,
                "stateplane_collector_redis_errors",
                "Failed writes to Redis",
                get(&r.errors),
            )?;
            single(
                &mut e,
                "stateplane_collector_redis_resyncs",
                "Whole copies written to Redis",
                get(&r.resyncs),
            )?;
        }
        Ok(())
    }
}

/// Serves a collector's metrics on `addr` (loopback) for as long as the process lives.
pub fn serve_collector(
    addr: SocketAddr,
    handle: Arc<CollectorHandle>,
    redis: Option<Arc<RedisCounters>>,
) -> Result<(), String> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(CollectorScrape { handle, redis }));
    serve_registry(addr, registry)
}

fn render(registry: &Registry) -> String {
    let mut body = String::new();
    // Writing into a String fails only if a collector does, and ours do not.
    let _ = prometheus_text::encode(&mut body, registry);
    body
}

/// Starts serving on a thread that lives as long as the process (so the totals stay
/// readable after the run, see `--hold-metrics`).
pub fn serve(addr: SocketAddr, scrape: Scrape) -> Result<(), String> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(scrape));
    serve_registry(addr, registry)
}

/// Serves `registry` on `addr` from a thread of its own.
fn serve_registry(addr: SocketAddr, registry: Registry) -> Result<(), String> {
    let listener =
        TcpListener::bind(addr).map_err(|e| format!("--metrics: cannot listen on {addr}: {e}"))?;
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
            let mut req = [0u8; 1024];
            let n = stream.read(&mut req).unwrap_or(0);
            let ok = req[..n].starts_with(b"GET /metrics");
            let (status, body) = if ok {
                ("200 OK", render(&registry))
            } else {
                ("404 Not Found", "try /metrics\n".to_owned())
            };
            let _ = write!(
                stream,
                "HTTP/1.0 {status}\r\nContent-Type: {}\r\nContent-Length: {}\r\n\r\n{body}",
                prometheus_text::CONTENT_TYPE,
                body.len()
            );
        }
    });
    log::info!("metrics on http://{addr}/metrics");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateplane_runtime::DropReason;

    #[test]
    fn a_scrape_has_every_counter_per_thread_and_drops_by_reason() {
        let handle = Arc::new(RunHandle::new(2));
        let mut worker1 = Stats::default();
        worker1.add(Counter::RxPackets, 7);
        worker1.drops[DropReason::program(0).0 as usize] = 3;
        handle.stats[2].publish(&worker1);
        let budget = stateplane_mem::budget::Budget {
            limit: 1 << 30,
            copies: 3,
            setting: "memory_budget",
        };
        let (growth, _) = stateplane_mem::budget::scope(budget, || {
            stateplane_mem::budget::claim_once("burst", String::new, 1000).unwrap();
            stateplane_mem::budget::Growth::of_scope()
        });
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Scrape {
            handle,
            drop_names: &["say \"no\""],
            ports: Vec::new(),
            sync: Some(Arc::new(SyncCounters::default())),
            replication: Some(Arc::new(ReplicationCounters {
                writes: 5.into(),
                held: 2.into(),
                ..ReplicationCounters::default()
            })),
            flows: None,
            plane: None,
            control_requests: None,
            memory: growth.clone(),
            bounds: vec![
                Bound {
                    name: "memory_budget_bytes",
                    help: "The memory the run may take",
                    value: Level::Fixed(1 << 30),
                },
                Bound {
                    name: "memory_claimed_bytes",
                    help: "What the run has claimed",
                    value: Level::Claimed(growth.clone()),
                },
            ],
        }));
        let body = render(&registry);
        assert!(
            body.contains("\nstateplane_memory_claimed_bytes 1000\n"),
            "{body}"
        );
        // What grows after loading is in the next scrape.
        growth.take("routes", String::new, 24).unwrap();
        let body = render(&registry);
        assert!(body.contains("\nstateplane_memory_claimed_bytes 1024\n"));
        for share in [
            "stateplane_memory_share_bytes{setting=\"burst\"} 1000",
            "stateplane_memory_share_bytes{setting=\"routes\"} 24",
        ] {
            assert!(body.lines().any(|l| l == share), "{share}: {body}");
        }
        let body = render(&registry);
        assert!(
            body.lines()
                .any(|l| l == "stateplane_sync_messages_total 0"),
            "{body}"
        );
        for line in [
            "# TYPE stateplane_memory_budget_bytes gauge",
            "stateplane_memory_budget_bytes 1073741824",
            "stateplane_replication_writes_total 5",
            "stateplane_replication_dropped_total 0",
            "# TYPE stateplane_replication_held gauge",
            "stateplane_replication_held 2",
        ] {
            assert!(body.lines().any(|l| l == line), "{line}: {body}");
        }
        for line in [
            "# HELP stateplane_rx_packets_total Packets received by the workers",
            "# TYPE stateplane_rx_packets_total counter",
            "stateplane_rx_packets_total{worker=\"dispatcher\"} 0",
            "stateplane_rx_packets_total{worker=\"0\"} 0",
            "stateplane_rx_packets_total{worker=\"1\"} 7",
            "stateplane_bursts_total{worker=\"1\"} 0",
            // A program's reason is a label value, escaped as Prometheus reads it.
            "stateplane_drops_total{reason=\"say \\\"no\\\"\"} 3",
        ] {
            assert!(body.lines().any(|l| l == line), "{line} missing:\n{body}");
        }
        // One series per thread and none for the total: a sum over a family is the total.
        assert!(
            !body
                .lines()
                .any(|l| l.starts_with("stateplane_rx_packets_total ")),
            "{body}"
        );
        assert!(!body.contains("stateplane_port_"), "no live ports: {body}");
    }
}
