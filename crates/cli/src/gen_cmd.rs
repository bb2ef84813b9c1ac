//! `stateplane gen`: write a generated trace to a capture file.

use crate::progress::Progress;
use crate::summary_output::CliResult;
use stateplane_gen::established::{Passes, generate_established};
use stateplane_gen::{GenConfig, Workload, generate};
use stateplane_io::{CaptureFormat, CaptureWriter};
use stateplane_mem::budget::Bytes;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

#[derive(clap::Args)]
pub struct GenArgs {
    /// internet, datacenter, synflood, udpflood, kv or gtp.
    pub workload: String,
    /// The capture to write (`.pcapng` for pcapng; otherwise pcap with ns timestamps).
    #[arg(long, short)]
    pub output: PathBuf,
    /// Packets to write.
    #[arg(long, default_value_t = 1_000_000)]
    pub packets: u64,
    /// Flows (users for gtp, clients for kv); default depends on the workload.
    #[arg(long)]
    pub flows: Option<u64>,
    /// Seed of the generator: the same options and seed give the same bytes on every machine.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Share of flows that are IPv6.
    #[arg(long, default_value_t = 0.2)]
    pub ipv6_share: f64,
    /// Packets per second (default 1,000,000); or give --duration.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Trace length in seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Zipf exponent of flow sizes (kv: of key popularity).
    #[arg(long)]
    pub zipf: Option<f64>,
    /// Every frame this many bytes (as captured, no FCS).
    #[arg(long)]
    pub packet_size: Option<usize>,
    /// Share of attack packets (synflood, udpflood).
    #[arg(long, default_value_t = 0.5)]
    pub attack_share: f64,
    /// Tag flows with VLANs 1..=N (0: untagged).
    #[arg(long, default_value_t = 0)]
    pub vlans: u16,
    /// Distinct keys (kv).
    #[arg(long, default_value_t = 100_000)]
    pub kv_keys: u64,
    /// Share of GETs (kv).
    #[arg(long, default_value_t = 0.9)]
    pub kv_get_share: f64,
    /// Write the trace this many times over as the same flows, established: the first
    /// pass without its TCP FIN and RST segments (connections stay open), each later one
    /// without SYN, FIN or RST, its sequence numbers going on where the last pass ended
    /// (1 to 100; what `bench-replication` times programs on established flows over).
    #[arg(long)]
    pub established_passes: Option<u64>,
    /// Print the summary as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Passes of established flows `--established-passes` takes at most.
const MOST_PASSES: u64 = 100;

pub fn main(a: GenArgs) -> CliResult<()> {
    let workload: Workload = a
        .workload
        .parse()
        .map_err(|e: stateplane_gen::GenError| e.problem)?;
    let cfg = GenConfig {
        workload,
        packets: a.packets,
        flows: a.flows,
        seed: a.seed,
        ipv6_share: a.ipv6_share,
        rate_pps: a.rate,
        duration_s: a.duration,
        zipf: a.zipf,
        packet_size: a.packet_size,
        attack_share: a.attack_share,
        vlans: a.vlans,
        kv_keys: a.kv_keys,
        kv_get_share: a.kv_get_share,
        ..GenConfig::new(workload, a.packets)
    };
    cfg.validate().map_err(|e| e.to_string())?;
    if a.output.as_os_str() == "-" {
        // `-` reads standard input elsewhere (`flows -i -`); here it would be a file of
        // that name, which nobody means.
        return Err(
            "--output -: gen writes a capture file, not standard output; give a file name (e.g. --output trace.pcap)"
                .into(),
        );
    }
    if let Some(passes) = a.established_passes
        && !(1..=MOST_PASSES).contains(&passes)
    {
        return Err(format!(
            "--established-passes {passes}: give 1 to {MOST_PASSES} passes of the trace"
        ));
    }
    let passes = a.established_passes.unwrap_or(1);
    let size = estimated_size(&cfg, CaptureFormat::from_path(&a.output))?.saturating_mul(passes);
    let room = room_for(&a.output);
    if let Some(room) = room.filter(|&room| size > room) {
        return Err(format!(
            "--packets {}: the capture would take about {}, and {} has {} free; give fewer --packets, or an --output on a disk with room",
            a.packets,
            Bytes(size),
            directory_of(&a.output).display(),
            Bytes(room)
        ));
    }
    if size >= LARGE {
        eprintln!("writing about {} to {}", Bytes(size), a.output.display());
    }
    let mut writer = CaptureWriter::create(&a.output).map_err(|e| e.to_string())?;
    let done = Arc::new(AtomicU64::new(0));
    let watched = done.clone();
    let progress = Progress::start(a.packets.saturating_mul(passes), false, move || {
        watched.load(Ordering::Relaxed)
    });
    let start = Instant::now();
    let written = match a.established_passes {
        Some(_) => Written::Passes(
            generate_established(&cfg, passes, |_, ts, frame| {
                done.fetch_add(1, Ordering::Relaxed);
                writer.write(ts, frame, frame.len() as u32)
            })
            .map_err(|e| e.to_string())?,
        ),
        None => Written::Trace(
            generate(
                &cfg,
                |ts, frame| writer.write(ts, frame, frame.len() as u32),
                |n| done.store(n, Ordering::Relaxed),
            )
            .map_err(|e| e.to_string())?,
        ),
    };
    writer
        .flush()
        .map_err(|e| format!("writing {}: {e}", a.output.display()))?;
    drop(progress);
    let secs = start.elapsed().as_secs_f64();
    let summary = match written {
        Written::Trace(summary) => summary,
        Written::Passes(counted) => {
            let packets = counted.first + (passes - 1) * counted.later;
            if a.json {
                return print_json(serde_json::json!({
                    "workload": workload.name(), "output": a.output, "seed": a.seed,
                    "established_passes": passes, "packets": packets,
                    "first_pass_packets": counted.first, "later_pass_packets": counted.later,
                    "wall_seconds": secs,
                }));
            }
            println!(
                "stateplane gen {}: {passes} passes of established flows, {packets} packets \
                 (the first {}, each later one {}) -> {}",
                workload.name(),
                counted.first,
                counted.later,
                a.output.display()
            );
            return Ok(());
        }
    };
    if a.json {
        print_json(serde_json::json!({
            "workload": workload.name(), "output": a.output, "seed": a.seed, "packets": summary.packets,
            "bytes": summary.bytes, "flows": summary.flows, "ipv6_packets": summary.ipv6_packets,
            "tcp_packets": summary.tcp_packets, "udp_packets": summary.udp_packets,
            "special_packets": summary.special_packets, "trace_seconds": (summary.last_ns - summary.first_ns) as f64 / 1e9,
            "wall_seconds": secs,
        }))?;
    } else {
        println!(
            "stateplane gen {}: {} packets, {} bytes, {} flows -> {}",
            workload.name(),
            summary.packets,
            summary.bytes,
            summary.flows,
            a.output.display()
        );
        println!(
            "  IPv6 {} | TCP {} | UDP {} | {} {} | trace {:.3} s | written in {:.2} s ({:.1} Mpps)",
            summary.ipv6_packets,
            summary.tcp_packets,
            summary.udp_packets,
            match workload {
                Workload::Gtp => "signaling",
                _ => "attack",
            },
            summary.special_packets,
            (summary.last_ns - summary.first_ns) as f64 / 1e9,
            secs,
            summary.packets as f64 / secs / 1e6
        );
    }
    Ok(())
}

/// What `gen` wrote: a trace, or passes of it as established flows.
enum Written {
    Trace(stateplane_gen::GenSummary),
    Passes(Passes),
}

fn print_json(v: serde_json::Value) -> CliResult<()> {
    println!(
        "{}",
        serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?
    );
    Ok(())
}

/// A capture this large is announced before it is written.
const LARGE: u64 = 100 << 20;

/// Packets of the sample [`estimated_size`] measures at most.
const SAMPLE_PACKETS: u64 = 100_000;

/// About how many bytes the capture of `cfg` takes in `format`: a trace of the same
/// settings and at most [`SAMPLE_PACKETS`] packets (its flows in proportion), measured
/// (frames and record headers), scaled to the packets asked for.
fn estimated_size(cfg: &GenConfig, format: CaptureFormat) -> Result<u64, String> {
    let packets = cfg.packets.min(SAMPLE_PACKETS);
    // Flows in proportion, so that each keeps its share of the packets.
    let flows = (cfg.flows).map(|f| {
        (u128::from(f) * u128::from(packets) / u128::from(cfg.packets.max(1))).max(1) as u64
    });
    let sample = GenConfig {
        packets,
        flows,
        ..cfg.clone()
    };
    let record = |len: usize| match format {
        CaptureFormat::Pcapng => 32 + len.next_multiple_of(4) as u64,
        _ => 16 + len as u64,
    };
    let mut bytes = 0;
    let measure = |_, frame: &[u8]| {
        bytes += record(frame.len());
        Ok(())
    };
    generate(&sample, measure, |_| {}).map_err(|e| e.to_string())?;
    let scaled = u128::from(bytes) * u128::from(cfg.packets) / u128::from(sample.packets.max(1));
    Ok(u64::try_from(scaled).unwrap_or(u64::MAX))
}

/// The bytes free for `output` on its disk (with what the file holds now, which it
/// replaces), if the system says; none for what is not a file (`/dev/null`, a pipe).
fn room_for(output: &Path) -> Option<u64> {
    let held = match std::fs::metadata(output) {
        Ok(m) if !m.is_file() => return None,
        Ok(m) => m.len(),
        Err(_) => 0,
    };
    let disk = rustix::fs::statvfs(directory_of(output)).ok()?;
    Some(
        disk.f_bavail
            .saturating_mul(disk.f_frsize)
            .saturating_add(held),
    )
}

/// The directory `output` goes into.
fn directory_of(output: &Path) -> &Path {
    match output.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}
