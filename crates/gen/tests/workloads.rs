//! Properties of every workload: exact counts, determinism, parseable frames, and the
//! shape each workload promises.
#![allow(clippy::unwrap_used)]

use stateplane_gen::{GenConfig, Workload, generate, kv};
use stateplane_wire::{FlowHasher, FlowKey, ParseFlags, parse};
use std::collections::HashMap;

fn run(cfg: &GenConfig) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    let summary = generate(
        cfg,
        |ts, f| {
            out.push((ts, f.to_vec()));
            Ok(())
        },
        |_| {},
    )
    .unwrap();
    assert_eq!(summary.packets, cfg.packets);
    assert_eq!(out.len() as u64, cfg.packets);
    assert_eq!(
        summary.bytes,
        out.iter().map(|p| p.1.len() as u64).sum::<u64>()
    );
    out
}

fn canonical(k: &FlowKey) -> FlowKey {
    let mut k = *k;
    k.in_port = 0;
    if (k.src, k.src_port) > (k.dst, k.dst_port) {
        k.reversed()
    } else {
        k
    }
}

#[test]
fn every_workload_parses_is_exact_and_deterministic() {
    let h = FlowHasher::with_seed(1);
    for (name, w) in Workload::ALL {
        let mut cfg = GenConfig::new(w, 20_000);
        cfg.seed = 11;
        cfg.vlans = 3;
        let a = run(&cfg);
        assert_eq!(a, run(&cfg), "{name}: same seed, different trace");
        cfg.seed = 12;
        assert_ne!(a, run(&cfg), "{name}: different seed, same trace");
        let mut last = 0;
        for (ts, f) in &a {
            let p = parse(f, 0, &h)
                .unwrap_or_else(|e| panic!("{name}: generated frame does not parse: {e}"));
            assert!(p.flags.has(ParseFlags::IPV4) || p.flags.has(ParseFlags::IPV6));
            assert!(
                (60..=1518).contains(&f.len()),
                "{name}: frame of {} bytes",
                f.len()
            );
            assert!(*ts >= last);
            last = *ts;
        }
    }
}

#[test]
fn internet_flows_are_heavy_tailed() {
    let cfg = GenConfig::new(Workload::Internet, 200_000);
    let h = FlowHasher::with_seed(1);
    let mut flows: HashMap<FlowKey, (u64, u64)> = HashMap::new();
    let mut syn = 0;
    let mut fin_or_rst = 0;
    for (_, f) in run(&cfg) {
        let p = parse(&f, 0, &h).unwrap();
        let e = flows.entry(canonical(&p.key)).or_default();
        e.0 += 1;
        e.1 += f.len() as u64;
        syn += u64::from(p.tcp_flags & 0x02 != 0 && p.tcp_flags & 0x10 == 0);
        fin_or_rst += u64::from(p.tcp_flags & 0x05 != 0);
    }
    assert_eq!(flows.len() as u64, 200_000 / 20, "every flow distinct");
    let small = flows.values().filter(|f| f.0 < 10).count();
    assert!(
        small * 100 / flows.len() > 60,
        "most flows under 10 packets: {small} of {}",
        flows.len()
    );
    let mut bytes: Vec<u64> = flows.values().map(|f| f.1).collect();
    bytes.sort_unstable_by(|a, b| b.cmp(a));
    let top = bytes.len() / 100;
    let top_share = bytes[..top].iter().sum::<u64>() as f64 / bytes.iter().sum::<u64>() as f64;
    assert!(
        top_share > 0.4,
        "the largest 1% of flows carry {top_share:.2} of bytes"
    );
    assert!(
        syn > 5000 && fin_or_rst > 3000,
        "TCP opens ({syn}) and closes ({fin_or_rst})"
    );
}

#[test]
fn ipv6_share_rate_and_fixed_size_hold() {
    let mut cfg = GenConfig::new(Workload::Datacenter, 50_000);
    cfg.ipv6_share = 0.5;
    cfg.rate_pps = Some(2_000_000.0);
    cfg.packet_size = Some(64);
    let h = FlowHasher::with_seed(1);
    let trace = run(&cfg);
    let v6 = trace
        .iter()
        .filter(|p| parse(&p.1, 0, &h).unwrap().key.ip_version == 6)
        .count();
    assert!((15_000..35_000).contains(&v6), "{v6} IPv6 packets of 50000");
    // IPv6 TCP needs 74 bytes of headers; everything else is exactly 64.
    assert!(trace.iter().all(|p| p.1.len() == 64 || p.1.len() == 74));
    assert_eq!(trace[1].0 - trace[0].0, 500);
    assert_eq!(trace.last().unwrap().0 - trace[0].0, 49_999 * 500);
}

#[test]
fn floods_mix_attack_at_the_requested_share() {
    for (w, victim_proto) in [(Workload::Synflood, 6u8), (Workload::Udpflood, 17)] {
        let mut cfg = GenConfig::new(w, 40_000);
        cfg.attack_share = 0.25;
        let h = FlowHasher::with_seed(1);
        let attack = run(&cfg)
            .iter()
            .filter(|p| {
                let k = parse(&p.1, 0, &h).unwrap().key;
                k.dst[..4] == [198, 19, 255, 1] && k.proto == victim_proto
            })
            .count();
        assert_eq!(attack, 10_000);
    }
}

#[test]
fn kv_requests_decode_and_follow_the_get_share() {
    let cfg = GenConfig::new(Workload::Kv, 20_000);
    let h = FlowHasher::with_seed(1);
    let mut gets = 0;
    let mut keys: HashMap<u64, u32> = HashMap::new();
    for (_, f) in run(&cfg) {
        let p = parse(&f, 0, &h).unwrap();
        assert_eq!(p.key.dst_port, kv::PORT);
        let m = kv::Message::parse(&f[usize::from(p.payload_offset)..]).unwrap();
        gets += u32::from(m.op == kv::Op::Get);
        *keys.entry(m.key).or_default() += 1;
    }
    assert!((17_500..18_500).contains(&gets), "{gets} GETs");
    assert!(keys.get(&0).copied().unwrap_or(0) > keys.get(&1000).copied().unwrap_or(0));
}

#[test]
fn gtp_has_one_signaling_message_per_17_data_packets() {
    let cfg = GenConfig::new(Workload::Gtp, 36_000);
    let h = FlowHasher::with_seed(1);
    let (mut signaling, mut tunneled) = (0, 0);
    for (_, f) in run(&cfg) {
        let p = parse(&f, 0, &h).unwrap();
        signaling += u32::from(p.flags.has(ParseFlags::GTPC));
        tunneled += u32::from(p.flags.has(ParseFlags::GTPU));
    }
    assert!(
        (1_900..2_100).contains(&signaling),
        "{signaling} signaling of 36000"
    );
    assert!(tunneled > 12_000, "{tunneled} uplink packets in GTP-U");
}

#[test]
fn bad_configs_name_the_field() {
    let mut cfg = GenConfig::new(Workload::Internet, 10);
    cfg.flows = Some(11);
    assert_eq!(cfg.validate().unwrap_err().field, "flows");
    let mut cfg = GenConfig::new(Workload::Internet, 10);
    cfg.ipv6_share = 1.5;
    assert!(
        cfg.validate()
            .unwrap_err()
            .to_string()
            .starts_with("--ipv6-share")
    );
    let mut cfg = GenConfig::new(Workload::Internet, 10);
    cfg.rate_pps = Some(1.0);
    cfg.duration_s = Some(1.0);
    assert_eq!(cfg.validate().unwrap_err().field, "rate");
    assert!(
        "nope"
            .parse::<Workload>()
            .unwrap_err()
            .to_string()
            .contains("internet, datacenter")
    );
}
