//! `stateplane bench-flow-model`: TurboFlow's eviction model (section 5.4: Equation 1,
//! Equation 2 and Table 5) beside what our microflow table does on the model's own
//! workload.
//!
//! The model: with `a` flows active and a direct-mapped table of `T` slots, a packet
//! evicts when another active flow shares its slot: P[eviction] = 1 - (1 - 1/T)^a
//! (Equation 1), and with packets at rate E[p] and new flows at rate E[f], the microflow
//! records (mFRs) come at E[m] = E[f] + (E[p] - E[f]) * P[eviction] (Equation 2); Table 5
//! lists P[eviction] and packets per mFR for T = a to 5a.
//!
//! The workload: `a` active flows, each packet from one of them drawn uniformly; for
//! Equation 2, each packet starts a new flow (taking the place of a random active one)
//! with probability E[f] / E[p]. Each row counts the mFRs the table emits while the
//! packets go through (its final flush left out). Equation 1 is a bound: a packet evicts
//! only when the slot's *last* user is another flow, which with `k` others sharing it
//! happens with chance k / (k + 1), so the expected rate is 1 - (T / a) * (1 - (1 - 1/T)^a)
//! (the exact expectation for uniform flows, shown beside the bound).

use crate::BenchResult;
use crate::results::{Csv, ResultFiles, Table};
use stateplane_flows::compact_key::hash_key;
use stateplane_flows::{FlowStats, Microflow, MicroflowTable, Observation, V4Key};
use stateplane_gen::rng::Rng;
use stateplane_switch::units::bounded;

#[derive(clap::Args)]
pub struct BenchFlowModelArgs {
    /// Microflow table slots (a power of two); the active flows are T/1 to T/5.
    #[arg(long, default_value_t = 4096)]
    pub slots: usize,
    /// Packets per row.
    #[arg(long, default_value_t = 2_000_000)]
    pub packets: u64,
    /// New flows per packet for the Equation 2 rows (comma-separated, each below 1).
    #[arg(long, value_delimiter = ',', default_value = "0.01,0.05,0.2")]
    pub flow_shares: Vec<f64>,
    /// Seed of the traces and random draws: the same seed gives the same run.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[command(flatten)]
    pub files: ResultFiles,
}

/// One row: the table and workload, the model's figures and ours.
struct Row {
    slots: usize,
    active: usize,
    /// New flows per packet (E[f] / E[p]).
    flow_share: f64,
    packets: u64,
    records: u64,
}

impl Row {
    /// Equation 1: the chance that another active flow shares a packet's slot.
    fn model_eviction(&self) -> f64 {
        1.0 - (1.0 - 1.0 / self.slots as f64).powf(self.active as f64)
    }

    /// The exact expectation for uniform flows: the slot's last user is another flow.
    fn expected_eviction(&self) -> f64 {
        1.0 - self.slots as f64 / self.active as f64 * self.model_eviction()
    }

    /// Equation 2, per packet: E[m] / E[p].
    fn model_records_per_packet(&self) -> f64 {
        self.flow_share + (1.0 - self.flow_share) * self.model_eviction()
    }

    fn expected_records_per_packet(&self) -> f64 {
        self.flow_share + (1.0 - self.flow_share) * self.expected_eviction()
    }

    fn measured_records_per_packet(&self) -> f64 {
        self.records as f64 / self.packets.max(1) as f64
    }
}

/// Runs `packets` through a table of `slots` with `active` flows, a share `flow_share` of
/// the packets starting new flows; the mFRs it emitted.
fn run(slots: usize, active: usize, flow_share: f64, packets: u64, seed: u64) -> BenchResult<u64> {
    let mut table: MicroflowTable<V4Key, FlowStats> =
        MicroflowTable::new(slots).map_err(|e| format!("--slots: {e}"))?;
    let mut rng = Rng::new(seed);
    let mut next_flow = 0u64;
    let mut flows: Vec<V4Key> = (0..active)
        .map(|_| {
            next_flow += 1;
            V4Key([next_flow, next_flow.wrapping_mul(0x9e37_79b9_7f4a_7c15)])
        })
        .collect();
    let mut out: Vec<Microflow<V4Key, FlowStats>> = Vec::with_capacity(1 << 16);
    let mut records = 0u64;
    for i in 0..packets {
        let pick = rng.below(active as u64) as usize;
        if flow_share > 0.0 && rng.chance(flow_share) {
            next_flow += 1;
            flows[pick] = V4Key([next_flow, next_flow.wrapping_mul(0x9e37_79b9_7f4a_7c15)]);
        }
        let key = flows[pick];
        let o = Observation {
            ts_ns: i,
            ..Observation::default()
        };
        table.observe(key, hash_key(&key, seed), &o, &mut out);
        if out.len() >= 1 << 15 {
            records += out.len() as u64;
            out.clear();
        }
    }
    Ok(records + out.len() as u64)
}

pub fn main(a: BenchFlowModelArgs) -> BenchResult<()> {
    let slots = bounded("--slots", a.slots, 16, 1 << 24)?;
    if !slots.is_power_of_two() {
        return Err(format!(
            "--slots: {slots} is not a power of two (e.g. {})",
            slots.next_power_of_two()
        ));
    }
    if a.packets == 0 {
        return Err("--packets must be above 0".into());
    }
    if let Some(s) = a.flow_shares.iter().find(|s| !(**s > 0.0 && **s < 1.0)) {
        return Err(format!("--flow-shares: {s} is not a share between 0 and 1"));
    }
    let mut rows = Vec::new();
    // Table 5: T = a to 5a, no new flows.
    for k in 1..=5usize {
        let active = slots / k;
        eprintln!("T = {k}a: {active} active flows");
        let records = run(slots, active, 0.0, a.packets, a.seed)?;
        rows.push(Row {
            slots,
            active,
            flow_share: 0.0,
            packets: a.packets,
            records,
        });
    }
    // Equation 2: T = 2a, with new flows.
    for &share in &a.flow_shares {
        let active = slots / 2;
        eprintln!("T = 2a, {share} new flows per packet");
        let records = run(slots, active, share, a.packets, a.seed)?;
        rows.push(Row {
            slots,
            active,
            flow_share: share,
            packets: a.packets,
            records,
        });
    }
    println!(
        "input: {} packets per row, each from one of `a` active flows drawn uniformly (a share \
         E[f]/E[p] starting a new flow); microflow table of T = {slots} slots; model: \
         TurboFlow section 5.4",
        a.packets
    );
    let mut table = Table::new(
        &["T/a", "E[f]/E[p]"],
        &[
            "a",
            "P[ev] model (Eq. 1)",
            "P[ev] exact",
            "mFR/packet model (Eq. 2)",
            "exact",
            "measured",
            "packets:mFR model",
            "measured",
        ],
    );
    let mut csv = Csv::new(
        "slots,active,flow_share,packets,records,model_eviction,exact_eviction,model_records_per_packet,exact_records_per_packet,measured_records_per_packet",
    );
    for r in &rows {
        table.row(vec![
            format!("{:.2}", r.slots as f64 / r.active as f64),
            format!("{}", r.flow_share),
            r.active.to_string(),
            format!("{:.3}", r.model_eviction()),
            format!("{:.3}", r.expected_eviction()),
            format!("{:.4}", r.model_records_per_packet()),
            format!("{:.4}", r.expected_records_per_packet()),
            format!("{:.4}", r.measured_records_per_packet()),
            format!("{:.2}", 1.0 / r.model_records_per_packet()),
            format!("{:.2}", 1.0 / r.measured_records_per_packet().max(1e-12)),
        ]);
        csv.row(format_args!(
            "{},{},{},{},{},{:.5},{:.5},{:.5},{:.5},{:.5}",
            r.slots,
            r.active,
            r.flow_share,
            r.packets,
            r.records,
            r.model_eviction(),
            r.expected_eviction(),
            r.model_records_per_packet(),
            r.expected_records_per_packet(),
            r.measured_records_per_packet()
        ));
    }
    table.print();
    if let Some(path) = &a.files.csv {
        csv.write(path)?;
    }
    if a.files.wants_chart() {
        let label = |r: &Row| {
            format!(
                "T = {:.0}a, E[f]/E[p] = {}",
                r.slots as f64 / r.active as f64,
                r.flow_share
            )
        };
        let panel = crate::chart::Panel {
            title: "mFRs per packet: the model (Eq. 1, 2), the exact expectation, measured".into(),
            unit: "mFR/packet".into(),
            bars: rows
                .iter()
                .flat_map(|r| {
                    [
                        (format!("{}: model", label(r)), r.model_records_per_packet()),
                        (
                            format!("{}: exact", label(r)),
                            r.expected_records_per_packet(),
                        ),
                        (
                            format!("{}: measured", label(r)),
                            r.measured_records_per_packet(),
                        ),
                    ]
                })
                .collect(),
        };
        a.files.write_chart(
            "TurboFlow's eviction model against the microflow table",
            &format!(
                "T = {slots} slots, {} packets per row, uniform flows",
                a.packets
            ),
            &[panel],
        )?;
    }
    Ok(())
}
