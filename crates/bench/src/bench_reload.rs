//! `stateplane bench-reload`: how long a reload holds a worker while `nat`'s new instance
//! takes the old one's translations (`Program::inherit`, the old instance dropped with
//! it): whole, under an unchanged capacity, and one by one into twice the capacity. Each
//! measurement is checked: every translation kept, and the answers of a sample of them
//! come back to their inside hosts.

use crate::chart::Panel;
use crate::results::{Csv, ResultFiles, Table};
use crate::statistics::median;
use crate::{BenchResult, run_frames};
use stateplane_gen::build::{Hosts, L4, emit_frame};
use stateplane_programs::PortNames;
use stateplane_runtime::{Running, Verdict};
use stateplane_wire::MacAddr;
use std::net::{IpAddr, Ipv4Addr};
use std::time::Instant;

#[derive(clap::Args)]
pub struct BenchReloadArgs {
    /// Comma-separated numbers of translations the NAT holds when the reload comes (its
    /// capacity).
    #[arg(long, default_value = "10000,100000,1000000")]
    pub translations: String,
    /// Repeat each measurement and report the median.
    #[arg(long, default_value_t = 5)]
    pub repeat: usize,
    #[command(flatten)]
    pub files: ResultFiles,
}

const EXTERNAL: Ipv4Addr = Ipv4Addr::new(198, 18, 255, 1);
const REMOTE: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
/// Connections to each remote port (the pool's 64,512 ports serve each destination).
const PER_DESTINATION: u32 = 50_000;
/// Translations whose answers are sent through the new instance.
const SAMPLE: u32 = 1_000;
const INSIDE: u16 = 0;
const OUTSIDE: u16 = 1;

/// Connection `i`: an inside host and port, to the remote port it talks to.
fn connection(i: u32) -> (Ipv4Addr, u16, u16) {
    let host = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + i / 60_000);
    (
        host,
        1024 + (i % 60_000) as u16,
        1 + (i / PER_DESTINATION) as u16,
    )
}

fn frame(src: Ipv4Addr, dst: Ipv4Addr, src_port: u16, dst_port: u16) -> Vec<u8> {
    let hosts = Hosts {
        src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
        dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
        vlan: 0,
        src: IpAddr::V4(src),
        dst: IpAddr::V4(dst),
        ttl: 64,
    };
    let mut f = Vec::new();
    emit_frame(&mut f, &hosts, &L4::Udp { src_port, dst_port }, b"x");
    f
}

fn nat(capacity: u32) -> BenchResult<Box<dyn Running>> {
    let config = format!(
        "external = \"{EXTERNAL}\"\ninside = \"0\"\noutside = \"1\"\ncapacity = {capacity}"
    );
    let table: toml::Value = toml::from_str(&config).map_err(|e| e.to_string())?;
    let names = PortNames(vec!["0".into(), "1".into()]);
    let factory =
        stateplane_programs::build("nat", Some(&table), &names).map_err(|e| e.to_string())?;
    Ok(factory(0))
}

/// Sampled connections, each with its external port.
type Sampled = Vec<(u32, u16)>;

/// A NAT holding `n` translations, and the external ports of the sampled ones.
fn filled(n: u32) -> BenchResult<(Box<dyn Running>, Sampled)> {
    let mut program = nat(n)?;
    let step = (n / SAMPLE).max(1);
    let mut sampled = Vec::new();
    for first in (0..n).step_by(65_536) {
        let ids: Vec<u32> = (first..n.min(first + 65_536)).collect();
        let frames: Vec<Vec<u8>> = (ids.iter())
            .map(|&i| {
                let (host, port, remote_port) = connection(i);
                frame(host, REMOTE, port, remote_port)
            })
            .collect();
        for (&i, (verdict, bytes)) in ids
            .iter()
            .zip(run_frames(program.as_mut(), &frames, INSIDE))
        {
            if verdict != Verdict::Forward(OUTSIDE) {
                return Err(format!("connection {i} was not translated: {verdict:?}"));
            }
            if i % step == 0 {
                // The UDP source port, after a 14-byte Ethernet and 20-byte IPv4 header.
                sampled.push((i, u16::from_be_bytes([bytes[34], bytes[35]])));
            }
        }
    }
    Ok((program, sampled))
}

/// Sends the sampled translations' answers through `program`: how many reached their
/// inside host and port.
fn answered(program: &mut dyn Running, sampled: &[(u32, u16)]) -> usize {
    let frames: Vec<Vec<u8>> = (sampled.iter())
        .map(|&(i, external_port)| frame(REMOTE, EXTERNAL, connection(i).2, external_port))
        .collect();
    let out = run_frames(program, &frames, OUTSIDE);
    (sampled.iter().zip(out))
        .filter(|((i, _), (verdict, bytes))| {
            let (host, port, _) = connection(*i);
            *verdict == Verdict::Forward(INSIDE)
                && bytes[30..34] == host.octets()
                && bytes[36..38] == port.to_be_bytes()
        })
        .count()
}

/// One reload of a NAT holding `n` translations into one of `capacity`: the pause in
/// milliseconds, checked.
fn pause_ms(n: u32, capacity: u32) -> BenchResult<f64> {
    let (old, sampled) = filled(n)?;
    let mut new = nat(capacity)?;
    let start = Instant::now();
    let carried = new.inherit(old, 2);
    let pause = start.elapsed().as_secs_f64() * 1e3;
    let kept = carried.first().map_or(0, |c| c.kept);
    if kept != u64::from(n) || carried.iter().any(|c| c.lost()) {
        return Err(format!(
            "{n} translations, reloaded into {capacity}: {carried:?}"
        ));
    }
    let back = answered(new.as_mut(), &sampled);
    if back != sampled.len() {
        return Err(format!(
            "{n} translations, reloaded into {capacity}: {back} of {} sampled answers came back",
            sampled.len()
        ));
    }
    Ok(pause)
}

pub fn main(args: BenchReloadArgs) -> BenchResult<()> {
    let sizes: Vec<u32> = (args.translations.split(','))
        .map(|s| s.trim().parse::<u32>().ok().filter(|&n| n > 0))
        .collect::<Option<_>>()
        .ok_or("--translations: give positive numbers, comma-separated, like 10000,100000")?;
    if args.repeat == 0 {
        return Err("--repeat: give at least 1".into());
    }
    println!(
        "nat: translations held (UDP, {PER_DESTINATION} per destination) when a reload comes; \
         the pause is Program::inherit with the old instance's drop, median of {}; every \
         translation kept and {SAMPLE} answers checked each time",
        args.repeat
    );
    let mut table = Table::new(&["translations"], &["whole ms", "migrated ms", "ratio"]);
    let mut csv = Csv::new("translations,whole_ms,migrated_ms");
    let (mut whole_bars, mut migrated_bars) = (Vec::new(), Vec::new());
    for &n in &sizes {
        let mut whole = Vec::new();
        let mut migrated = Vec::new();
        for round in 0..args.repeat {
            eprintln!("  {n} translations: round {} of {}", round + 1, args.repeat);
            whole.push(pause_ms(n, n)?);
            migrated.push(pause_ms(n, n.saturating_mul(2))?);
        }
        let (whole, migrated) = (median(whole), median(migrated));
        table.row(vec![
            n.to_string(),
            format!("{whole:.3}"),
            format!("{migrated:.1}"),
            format!("{:.0}", migrated / whole),
        ]);
        csv.row(format_args!("{n},{whole:.4},{migrated:.3}"));
        whole_bars.push((format!("{n}"), whole));
        migrated_bars.push((format!("{n}"), migrated));
    }
    table.print();
    if let Some(path) = &args.files.csv {
        csv.write(path)?;
    }
    if args.files.wants_chart() {
        let panels = [
            Panel {
                title: "Same capacity: the table moves whole".into(),
                unit: "ms".into(),
                bars: whole_bars,
            },
            Panel {
                title: "Twice the capacity: translations moved one by one".into(),
                unit: "ms".into(),
                bars: migrated_bars,
            },
        ];
        args.files.write_chart(
            "How long a reload holds a worker: nat's translations",
            "by translations held; median of the repeats",
            &panels,
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both reloads keep every translation and its answers (the check each measurement
    /// makes), and a sample answer to a port never given is not let in.
    #[test]
    fn each_measured_reload_is_checked() {
        assert!(pause_ms(3_000, 3_000).is_ok());
        assert!(pause_ms(3_000, 6_000).is_ok());
        let (mut program, mut sampled) = filled(3_000).unwrap();
        assert_eq!(answered(program.as_mut(), &sampled), sampled.len());
        sampled[0].1 = sampled[0].1.wrapping_add(1);
        assert_eq!(answered(program.as_mut(), &sampled), sampled.len() - 1);
    }
}
