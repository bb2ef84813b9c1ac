//! The end-of-run summary, as a table for people and as JSON for scripts ([`Outcome`]:
//! what a run did, with its flow records' report if it had any).

use crate::flow_export::FlowReport;
use serde_json::json;
use stateplane_mem::budget::{Bytes, Growth, Resident};
use stateplane_runtime::RunReport;
use stateplane_runtime::{Counter, PortCounters};

/// Packets per second over the wall time.
fn mpps(packets: u64, secs: f64) -> f64 {
    if secs > 0.0 {
        packets as f64 / secs / 1e6
    } else {
        0.0
    }
}

pub fn to_json(report: &RunReport, program: &str, port_names: &[String]) -> serde_json::Value {
    let t = &report.total;
    let secs = report.wall.as_secs_f64();
    let counters: serde_json::Map<String, serde_json::Value> = Counter::ALL
        .iter()
        .map(|c| (c.name().to_owned(), json!(t.get(*c))))
        .collect();
    let drops: serde_json::Map<String, serde_json::Value> = t
        .drops_by_reason(report.drop_reason_names)
        .into_iter()
        .map(|(n, v)| (n.to_owned(), json!(v)))
        .collect();
    let malformed: serde_json::Map<String, serde_json::Value> = t
        .malformed_by_reason()
        .into_iter()
        .map(|(n, v)| (n.to_owned(), json!(v)))
        .collect();
    let ports: Vec<serde_json::Value> = report
        .tx_per_port
        .iter()
        .enumerate()
        .map(|(i, (p, b))| json!({"port": port_names.get(i).cloned().unwrap_or_else(|| i.to_string()), "tx_packets": p, "tx_bytes": b}))
        .collect();
    json!({
        "program": program,
        "workers": report.per_worker.len(),
        "wall_seconds": secs,
        "mpps": mpps(t.get(Counter::RxPackets), secs),
        "counters": counters,
        "drops": drops,
        "malformed": malformed,
        "ports": ports,
        "per_worker_rx_packets": report.per_worker.iter().map(|s| s.get(Counter::RxPackets)).collect::<Vec<_>>(),
        "errors": report.errors,
    })
}

/// The run's summary as a table, for people.
pub fn table(report: &RunReport, program: &str, port_names: &[String]) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let t = &report.total;
    let secs = report.wall.as_secs_f64();
    let _ = writeln!(
        out,
        "stateplane run: {program}, {} worker(s)",
        report.per_worker.len()
    );
    row(
        &mut out,
        "packets in",
        t.get(Counter::RxPackets).to_string(),
    );
    row(
        &mut out,
        "packets out",
        t.get(Counter::TxPackets).to_string(),
    );
    row(
        &mut out,
        "to control plane",
        t.get(Counter::ToControl).to_string(),
    );
    row(&mut out, "dropped", t.get(Counter::Dropped).to_string());
    row(&mut out, "wall time (s)", format!("{secs:.3}"));
    row(
        &mut out,
        "rate (Mpps, wall)",
        format!("{:.3}", mpps(t.get(Counter::RxPackets), secs)),
    );
    let drops = t.drops_by_reason(report.drop_reason_names);
    if !drops.is_empty() {
        out.push_str("  drops by reason:\n");
        for (n, v) in drops {
            row(&mut out, &format!("  {n}"), v.to_string());
        }
    }
    let malformed = t.malformed_by_reason();
    if !malformed.is_empty() {
        out.push_str("  malformed by reason:\n");
        for (n, v) in malformed {
            row(&mut out, &format!("  {n}"), v.to_string());
        }
    }
    out.push_str("  out by port:\n");
    for (i, (p, b)) in report.tx_per_port.iter().enumerate() {
        let name = port_names.get(i).cloned().unwrap_or_else(|| i.to_string());
        row(&mut out, &format!("  {name}"), format!("{p} pkts {b} B"));
    }
    for e in &report.errors {
        let _ = writeln!(out, "  error: {e}");
    }
    out
}

/// One line of the summary table: a name and its value.
fn row(out: &mut String, name: &str, value: String) {
    use std::fmt::Write;
    let _ = writeln!(out, "  {name:<28} {value:>16}");
}

/// Live ports' own counts (kernel drops, ring full, oversize), per port.
pub fn port_counters_json(ports: &[PortCounters], names: &[String]) -> serde_json::Value {
    let map: serde_json::Map<String, serde_json::Value> = ports
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let name = names.get(i).cloned().unwrap_or_else(|| i.to_string());
            let counts: serde_json::Map<String, serde_json::Value> = c
                .named()
                .iter()
                .map(|(k, v)| ((*k).to_owned(), json!(v)))
                .collect();
            (name, serde_json::Value::Object(counts))
        })
        .collect();
    serde_json::Value::Object(map)
}

/// Live ports' own counts as lines of the summary table.
pub fn port_counters_table(ports: &[PortCounters], names: &[String]) -> String {
    let mut out = String::from("  live ports:\n");
    for (i, c) in ports.iter().enumerate() {
        let name = names.get(i).cloned().unwrap_or_else(|| i.to_string());
        let nonzero: Vec<String> = c
            .named()
            .iter()
            .filter(|(_, v)| *v > 0)
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        out.push_str(&format!("    {name}: {}\n", nonzero.join(" ")));
    }
    out
}

/// What a run holds of its memory budget, by setting, at the end (what grew and shrank as
/// it went, as it stands then), and the most it held resident: the budget counts every
/// table whole, the kernel only the pages touched.
pub fn memory_json(memory: &Growth) -> serde_json::Value {
    let shares: Vec<serde_json::Value> = (memory.shares().iter())
        .map(|s| {
            json!({"setting": s.setting, "bytes": s.bytes(), "each": s.each, "copies": s.copies})
        })
        .collect();
    json!({
        "budget_bytes": memory.limit(),
        "claimed_bytes": memory.claimed(),
        "by_setting": shares,
        "resident_peak_bytes": stateplane_mem::budget::resident(Resident::Peak),
    })
}

/// [`memory_json`] as lines of the summary table.
pub fn memory_table(memory: &Growth) -> String {
    let mut out = String::new();
    if let Some(limit) = memory.limit() {
        row(&mut out, "memory budget", Bytes(limit).to_string());
        row(&mut out, "claimed", Bytes(memory.claimed()).to_string());
        for s in memory.shares() {
            let copies = match s.copies {
                1 => String::new(),
                n => format!(" ({n} x {})", Bytes(s.each)),
            };
            row(
                &mut out,
                &format!("  {}", s.setting),
                format!("{}{copies}", Bytes(s.bytes())),
            );
        }
    }
    if let Some(peak) = stateplane_mem::budget::resident(Resident::Peak) {
        row(&mut out, "resident at peak", Bytes(peak).to_string());
    }
    out
}

/// What a run did: the runtime's report, and its flow records' if it exported any.
pub struct Outcome {
    pub program: String,
    pub port_names: Vec<String>,
    pub report: RunReport,
    pub flows: Option<FlowReport>,
    /// What the sync stages sent, where state is `synced`.
    pub sync: Option<crate::sync_stage::SyncReport>,
    /// What the replication stages did, where state is `replicated`.
    pub replication: Option<crate::replication_stage::ReplicationReport>,
    /// Live ports: the summary adds their own counts and the program generations.
    pub live: bool,
    /// Flow records went to standard output, so the summary must not.
    pub records_to_stdout: bool,
    /// Over capture files: the signal (SIGINT or SIGTERM) that ended the run before its
    /// inputs did, after what was read went through (a live run's stop is its normal end).
    pub interrupted: Option<i32>,
    /// What it holds of its memory budget, by setting.
    pub memory: Growth,
}

impl Outcome {
    /// The summary as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        let mut value = to_json(&self.report, &self.program, &self.port_names);
        if self.live {
            value["port_counters"] =
                port_counters_json(&self.report.port_counters, &self.port_names);
            value["program_generation"] = json!(self.report.generations);
        }
        if let Some(f) = &self.flows {
            value["flows"] = f.to_json(self.report.wall);
        }
        if let Some(s) = &self.sync {
            value["sync"] = json!(s);
        }
        if let Some(r) = &self.replication {
            value["replication"] = json!(r);
        }
        value["memory"] = memory_json(&self.memory);
        value
    }

    /// The summary as a table.
    pub fn table(&self) -> String {
        let mut table = table(&self.report, &self.program, &self.port_names);
        if self.live {
            table += &port_counters_table(&self.report.port_counters, &self.port_names);
        }
        if let Some(f) = &self.flows {
            table += &format!("flow records:\n{}", f.table(self.report.wall));
        }
        if let Some(s) = &self.sync {
            table += &s.table();
        }
        if let Some(r) = &self.replication {
            table += &r.table();
        }
        table + &memory_table(&self.memory)
    }

    /// The run's failure, if it had one: an export that failed, then errors of the run.
    pub fn error(&self) -> Option<String> {
        if let Some(e) = self.flows.as_ref().and_then(FlowReport::error) {
            return Some(e);
        }
        (!self.report.errors.is_empty()).then(|| {
            format!(
                "the run had {} error(s), listed above",
                self.report.errors.len()
            )
        })
    }
}
