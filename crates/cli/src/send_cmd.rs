//! `stateplane send`: puts a capture's frames on an interface as fast as the kernel
//! takes them (or looped, or for a time), like tcpreplay's top speed: the traffic source of
//! the live benchmarks.

use crate::summary_output::CliResult;
use stateplane_io::capture::read_all;
use stateplane_io::live::Interface;
use stateplane_io::live::afpacket::PacketTx;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct SendArgs {
    /// The capture to send (pcap or pcapng), e.g. one made by `stateplane gen`.
    pub trace: PathBuf,
    /// The interface to send on.
    #[arg(long = "iface", short = 'I')]
    pub iface: String,
    /// Send the trace this many times.
    #[arg(long, default_value_t = 1)]
    pub loops: u64,
    /// Stop after this many seconds even if loops remain.
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Rewrite every frame's destination MAC to this (like tcprewrite --enet-dmac).
    #[arg(long)]
    pub dst_mac: Option<String>,
    /// Rewrite every frame's source MAC to this.
    #[arg(long)]
    pub src_mac: Option<String>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn main(a: SendArgs) -> CliResult<()> {
    let mut frames = read_all(&a.trace).map_err(|e| format!("{}: {e}", a.trace.display()))?;
    for (flag, value, at) in [("--dst-mac", &a.dst_mac, 0), ("--src-mac", &a.src_mac, 6)] {
        if let Some(text) = value {
            let mac = text
                .parse::<stateplane_wire::MacAddr>()
                .map_err(|_| {
                    format!("{flag}: '{text}' is not a MAC address like 02:00:00:00:01:02")
                })?
                .0;
            for (_, data, _) in frames.iter_mut().filter(|f| f.1.len() >= 14) {
                data[at..at + 6].copy_from_slice(&mac);
            }
        }
    }
    if frames.is_empty() {
        return Err(format!("{}: the capture has no packets", a.trace.display()));
    }
    let limit = crate::flags::seconds(a.seconds, 86_400.0)?;
    let iface = Interface::lookup(&a.iface).map_err(|e| e.to_string())?;
    let mut tx = PacketTx::open(&iface).map_err(|e| e.to_string())?;
    let start = Instant::now();
    let mut attempted = 0u64;
    'loops: for _ in 0..a.loops {
        for chunk in frames.chunks(64) {
            for (_, data, _) in chunk {
                tx.send(data);
            }
            tx.flush();
            attempted += chunk.len() as u64;
            if limit.is_some_and(|l| start.elapsed() >= l) {
                break 'loops;
            }
        }
    }
    tx.flush();
    let secs = start.elapsed().as_secs_f64();
    let c = tx.counters();
    if a.json {
        println!(
            "{}",
            serde_json::json!({"iface": a.iface, "attempted": attempted, "sent_packets": c.tx_packets,
                "sent_bytes": c.tx_bytes, "ring_full": c.tx_ring_full, "oversize": c.tx_oversize,
                "seconds": secs, "mpps": c.tx_packets as f64 / secs / 1e6})
        );
    } else {
        println!(
            "sent {} packets ({} bytes) on {} in {secs:.3} s: {:.3} Mpps; not sent: {} ring full, {} oversize",
            c.tx_packets,
            c.tx_bytes,
            a.iface,
            c.tx_packets as f64 / secs / 1e6,
            c.tx_ring_full,
            c.tx_oversize
        );
    }
    Ok(())
}
