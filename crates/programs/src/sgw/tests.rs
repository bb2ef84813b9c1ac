use super::*;
use crate::testutil::{hasher, ip_frame, run_at};
use stateplane_gen::build::L4;
use stateplane_gen::{GenConfig, Workload};
use stateplane_wire::checksum;
use stateplane_wire::gtp::emit_gtpv2_ie;

const SGW: &str = "198.19.255.2";

fn sgw() -> Sgw {
    sgw_at(SGW, "")
}

fn sgw_at(address: &str, extra: &str) -> Sgw {
    let names = PortNames(vec!["access".into(), "core".into()]);
    let cfg: SgwConfig = toml::from_str(&format!(
        "address = \"{address}\"\nue_pool = \"198.18.128.0/17\"\naccess = \"access\"\n\
         core = \"core\"\n{extra}"
    ))
    .unwrap();
    Sgw::new(&cfg, &names, "program.sgw", 3).unwrap()
}

/// The generator's subscriber `u`: its eNodeB, the TEID its downlink carries, its address.
fn generated_subscriber(u: u32) -> ([u8; 4], u32, [u8; 4]) {
    (
        [198, 18, 200, (u % 50) as u8 + 1],
        0x3000_0000 | u,
        [198, 18, 128 + ((u >> 8) & 0x7f) as u8, u as u8],
    )
}

#[test]
fn the_gtp_workload_is_tunneled_both_ways_with_each_subscribers_teid() {
    let mut cfg = GenConfig::new(Workload::Gtp, 20_000);
    cfg.ipv6_share = 0.0;
    let frames = crate::testutil::generated(&cfg);
    let mut p = sgw();
    let (mut signaling, mut uplink, mut downlink) = (0, 0, 0);
    for chunk in frames.chunks(32) {
        let out = run_at(&mut p, 1, chunk, (0, 1), 2);
        for ((before, _), (verdict, after)) in chunk.iter().zip(out) {
            let b = stateplane_wire::parse(before, 0, &hasher()).unwrap();
            if b.flags.has(ParseFlags::GTPC) {
                // Answered, back to the MME the way the request came.
                assert_eq!(verdict, Verdict::Forward(0));
                let gtp = &before[usize::from(b.gtp_offset)..];
                let request = Gtpv2Repr::parse(gtp).unwrap();
                let n = Signal::read(gtp).unwrap().subscriber().unwrap();
                assert_eq!(
                    response(&after),
                    accepted(request.message_type, request.sequence, n)
                );
                let a = stateplane_wire::parse(&after, 0, &hasher()).unwrap();
                assert_eq!(
                    (a.key.dst, a.key.dst_port, a.key.src),
                    (b.key.src, b.key.src_port, b.key.dst),
                    "from the gateway to the MME"
                );
                assert_eq!(
                    (&after[..6], &after[6..12]),
                    (&before[6..12], &before[..6]),
                    "MACs swapped"
                );
                signaling += 1;
            } else if b.flags.has(ParseFlags::GTPU) {
                // Out of the tunnel: the user's packet, byte for byte, behind the link header.
                assert_eq!(verdict, Verdict::Forward(1), "uplink to the core");
                let inner = usize::from(b.gtp_offset) + 8;
                assert_eq!(
                    &after[14..],
                    &before[inner..],
                    "the user's packet, unchanged"
                );
                assert_eq!(&after[..12], &before[..12], "the link header kept");
                let a = stateplane_wire::parse(&after, 0, &hasher()).unwrap();
                let u = b.teid & 0x0fff_ffff;
                assert_eq!(
                    a.key.src[..4],
                    generated_subscriber(u).2,
                    "from its address"
                );
                uplink += 1;
            } else {
                // Into the tunnel: to the subscriber's eNodeB, with its TEID.
                assert_eq!(verdict, Verdict::Forward(0), "downlink to the access side");
                let a = stateplane_wire::parse(&after, 0, &hasher()).unwrap();
                assert!(a.flags.has(ParseFlags::GTPU), "a GTP-U packet");
                let ue = &b.key.dst[..4];
                let u = (u32::from(ue[2] - 128) << 8) | u32::from(ue[3]);
                let (enb, teid, _) = generated_subscriber(u);
                assert_eq!((a.key.dst[..4].to_vec(), a.teid), (enb.to_vec(), teid));
                assert_eq!(a.key.src[..4], [198, 19, 255, 2], "from the gateway");
                assert_eq!(checksum::checksum(&after[14..34]), 0, "outer IPv4 checksum");
                let inner = usize::from(a.gtp_offset) + 8;
                assert_eq!(&after[inner..], &before[14..], "the user's packet, whole");
                downlink += 1;
            }
        }
    }
    // About one signaling message per 18 packets, the rest split between the directions.
    assert!((800..=1500).contains(&signaling), "{signaling}");
    assert!(uplink > 5000 && downlink > 5000, "{uplink} {downlink}");
}

/// A GTPv2-C message from the MME to the gateway.
fn signal(message_type: u8, teid: u32, imsi: Option<u32>, enb: [u8; 4], enb_teid: u32) -> Vec<u8> {
    let mut ies = [0u8; 64];
    let mut at = 0;
    if let Some(n) = imsi {
        let b = n.to_be_bytes();
        let imsi = [0x00, 0xf1, 0x10, b[0], b[1], b[2], b[3], 0xf0];
        at += emit_gtpv2_ie(&mut ies[at..], gtpv2_ie::IMSI, 0, &imsi).unwrap();
    }
    let mut fteid = [0x80u8; 9];
    fteid[1..5].copy_from_slice(&enb_teid.to_be_bytes());
    fteid[5..9].copy_from_slice(&enb);
    at += emit_gtpv2_ie(&mut ies[at..], gtpv2_ie::F_TEID, 0, &fteid).unwrap();
    let header = Gtpv2Repr {
        message_type,
        teid: Some(teid),
        sequence: 1,
        payload_len: at as u16,
    };
    let mut payload = vec![0u8; header.header_len() + at];
    header.emit(&mut payload).unwrap();
    payload[header.header_len()..].copy_from_slice(&ies[..at]);
    udp_frame("198.18.255.1", SGW, GTPC_PORT, &payload)
}

/// A GTPv2-C response as the MME reads it: type, sequence, cause, and for a Create
/// Session Response the gateway's S11 F-TEID, the subscriber's address (PAA), and in the
/// bearer context its id, cause and the gateway's S1-U F-TEID.
#[derive(Debug, Default, PartialEq, Eq)]
struct Response {
    message_type: u8,
    teid: Option<u32>,
    sequence: u32,
    cause: Option<u8>,
    /// (instance, interface type, TEID, address) of each F-TEID, the bearer context's
    /// last.
    fteids: Vec<(u8, u8, u32, [u8; 4])>,
    paa: Option<[u8; 4]>,
    bearer: Option<(u8, u8)>,
}

/// Reads a response frame: its IPv4 and UDP headers must be whole and checked, from the
/// gateway's GTP-C port.
fn response(frame: &[u8]) -> Response {
    let parsed = stateplane_wire::parse(frame, 0, &hasher()).unwrap();
    assert!(parsed.flags.has(ParseFlags::GTPC), "a GTP-C message");
    assert_eq!(
        checksum::checksum(&frame[14..34]),
        0,
        "IPv4 header checksum"
    );
    assert_eq!(
        usize::from(u16::from_be_bytes([frame[16], frame[17]])),
        frame.len() - 14,
        "IPv4 total length"
    );
    assert_eq!(
        usize::from(u16::from_be_bytes([frame[38], frame[39]])),
        frame.len() - 34,
        "UDP length"
    );
    assert_eq!(parsed.key.src_port, GTPC_PORT);
    let gtp = &frame[usize::from(parsed.gtp_offset)..];
    let header = Gtpv2Repr::parse(gtp).unwrap();
    let ies = &gtp[header.header_len()..];
    assert_eq!(ies.len(), usize::from(header.payload_len), "GTP length");
    let mut r = Response {
        message_type: header.message_type,
        teid: header.teid,
        sequence: header.sequence,
        ..Response::default()
    };
    let fteid = |instance: u8, d: &[u8]| {
        (
            instance,
            d[0] & 0x3f,
            u32::from_be_bytes([d[1], d[2], d[3], d[4]]),
            [d[5], d[6], d[7], d[8]],
        )
    };
    for ie in gtpv2_ies(ies) {
        let ie = ie.unwrap();
        match ie.ie_type {
            gtpv2_ie::CAUSE => r.cause = Some(ie.data[0]),
            gtpv2_ie::F_TEID => r.fteids.push(fteid(ie.instance, ie.data)),
            gtpv2_ie::PAA => {
                assert_eq!(ie.data[0], 1, "PDN type IPv4");
                r.paa = Some([ie.data[1], ie.data[2], ie.data[3], ie.data[4]]);
            }
            gtpv2_ie::BEARER_CONTEXT => {
                let (mut ebi, mut cause) = (0, 0);
                for inner in gtpv2_ies(ie.data) {
                    let inner = inner.unwrap();
                    match inner.ie_type {
                        gtpv2_ie::EBI => ebi = inner.data[0],
                        gtpv2_ie::CAUSE => cause = inner.data[0],
                        gtpv2_ie::F_TEID => r.fteids.push(fteid(inner.instance, inner.data)),
                        other => panic!("IE {other} in the bearer context"),
                    }
                }
                r.bearer = Some((ebi, cause));
            }
            other => panic!("IE {other} in a response"),
        }
    }
    r
}

/// The response the gateway gives an accepted request of `message_type` about subscriber
/// `n`, sequence `sequence`.
fn accepted(message_type: u8, sequence: u32, n: u32) -> Response {
    let gateway = [198, 19, 255, 2];
    let mut r = Response {
        message_type: message_type + 1,
        teid: Some(0),
        sequence,
        cause: Some(gtpv2_cause::REQUEST_ACCEPTED),
        ..Response::default()
    };
    if message_type == gtpv2_type::CREATE_SESSION_REQUEST {
        r.fteids = vec![
            (0, 11, S11_TEIDS | n, gateway),
            (0, 1, S1U_TEIDS | n, gateway),
        ];
        r.paa = Some(generated_subscriber(n).2);
        r.bearer = Some((5, gtpv2_cause::REQUEST_ACCEPTED));
    }
    r
}

fn udp_frame(src: &str, dst: &str, port: u16, payload: &[u8]) -> Vec<u8> {
    let l4 = L4::Udp {
        src_port: port,
        dst_port: port,
    };
    crate::testutil::ip_frame_with(src, dst, l4, payload)
}

fn downlink_to(ue: &str) -> Vec<u8> {
    ip_frame(
        "198.19.0.9",
        ue,
        L4::Udp {
            src_port: 53,
            dst_port: 4000,
        },
    )
}

#[test]
fn signaling_creates_moves_and_deletes_a_session() {
    let mut p = sgw();
    let one = |p: &mut Sgw, f: Vec<u8>| run_at(p, 1, &[(f, 0)], (0, 1), 2).remove(0);
    let reason = |p: &Sgw, v: Verdict| match v {
        Verdict::Drop(r) => r.name(p.drop_reasons()),
        _ => "pass",
    };
    // Subscriber 7 gets 198.18.128.7; no session yet, so its downlink is dropped.
    let v = one(&mut p, downlink_to("198.18.128.7")).0;
    assert_eq!(reason(&p, v), "no_session");
    let create = signal(
        gtpv2_type::CREATE_SESSION_REQUEST,
        0,
        Some(7),
        [198, 18, 200, 1],
        0xaaaa,
    );
    let (v, answer) = one(&mut p, create);
    assert_eq!(v, Verdict::Forward(0));
    assert_eq!(
        response(&answer),
        accepted(gtpv2_type::CREATE_SESSION_REQUEST, 1, 7)
    );
    let s = p.session(7).unwrap();
    assert_eq!(
        (s.enb, s.enb_teid, s.ue),
        ([198, 18, 200, 1], 0xaaaa, [198, 18, 128, 7])
    );
    let (v, bytes) = one(&mut p, downlink_to("198.18.128.7"));
    assert_eq!(v, Verdict::Forward(0));
    let a = stateplane_wire::parse(&bytes, 0, &hasher()).unwrap();
    assert_eq!(
        (a.key.dst[..4].to_vec(), a.teid),
        (vec![198, 18, 200, 1], 0xaaaa)
    );
    // A handover: the downlink follows the new eNodeB and TEID.
    let modify = signal(
        gtpv2_type::MODIFY_BEARER_REQUEST,
        S11_TEIDS | 7,
        None,
        [198, 18, 200, 9],
        0xbbbb,
    );
    let (v, answer) = one(&mut p, modify);
    assert_eq!(v, Verdict::Forward(0));
    assert_eq!(
        response(&answer),
        accepted(gtpv2_type::MODIFY_BEARER_REQUEST, 1, 7)
    );
    let (_, bytes) = one(&mut p, downlink_to("198.18.128.7"));
    let a = stateplane_wire::parse(&bytes, 0, &hasher()).unwrap();
    assert_eq!(
        (a.key.dst[..4].to_vec(), a.teid),
        (vec![198, 18, 200, 9], 0xbbbb)
    );
    // Uplink with another subscriber's TEID, or a TEID outside the S1-U space, is dropped;
    // so is one from another eNodeB than the session's (its eNodeB before the handover),
    // and one whose packet is not from the subscriber's address.
    let uplink_from = |enb: &str, teid: u32, source: &str| {
        let mut gtp = vec![0u8; 8];
        let inner = ip_frame(
            source,
            "198.19.0.9",
            L4::Udp {
                src_port: 4000,
                dst_port: 53,
            },
        )[14..]
            .to_vec();
        GtpuRepr {
            message_type: GTPU_T_PDU,
            teid,
            sequence: None,
            payload_len: inner.len() as u16,
        }
        .emit(&mut gtp)
        .unwrap();
        gtp.extend_from_slice(&inner);
        udp_frame(enb, SGW, GTPU_PORT, &gtp)
    };
    let uplink = |teid: u32| uplink_from("198.18.200.9", teid, "198.18.128.7");
    assert_eq!(one(&mut p, uplink(S1U_TEIDS | 7)).0, Verdict::Forward(1));
    let v = one(
        &mut p,
        uplink_from("198.18.200.1", S1U_TEIDS | 7, "198.18.128.7"),
    )
    .0;
    assert_eq!(reason(&p, v), "wrong_enb");
    let v = one(
        &mut p,
        uplink_from("198.18.200.9", S1U_TEIDS | 7, "198.18.128.8"),
    )
    .0;
    assert_eq!(reason(&p, v), "spoofed");
    let v = one(&mut p, uplink(S1U_TEIDS | 8)).0;
    assert_eq!(reason(&p, v), "no_session");
    let v = one(&mut p, uplink(0x3000_0007)).0;
    assert_eq!(reason(&p, v), "no_session");
    // Broken signaling is counted and changes nothing.
    let mut broken = signal(
        gtpv2_type::MODIFY_BEARER_REQUEST,
        S11_TEIDS | 7,
        None,
        [1, 1, 1, 1],
        1,
    );
    // Its F-TEID claims more bytes than the message has.
    let ie = 14 + 20 + 8 + 12;
    broken[ie + 1..ie + 3].copy_from_slice(&[0, 0xff]);
    let v = one(&mut p, broken).0;
    assert_eq!(reason(&p, v), "bad_signaling");
    assert_eq!(p.session(7).unwrap().enb_teid, 0xbbbb);
    // Delete: the session and its address go.
    let delete = signal(
        gtpv2_type::DELETE_SESSION_REQUEST,
        S11_TEIDS | 7,
        None,
        [0; 4],
        0,
    );
    let (v, answer) = one(&mut p, delete);
    assert_eq!(v, Verdict::Forward(0));
    assert_eq!(
        response(&answer),
        accepted(gtpv2_type::DELETE_SESSION_REQUEST, 1, 7)
    );
    assert_eq!(p.session(7), None);
    let v = one(&mut p, downlink_to("198.18.128.7")).0;
    assert_eq!(reason(&p, v), "no_session");
    // Not for a subscriber at all.
    let v = one(&mut p, downlink_to("198.19.0.1")).0;
    assert_eq!(reason(&p, v), "not_routed");
}

#[test]
fn bad_settings_name_the_field() {
    let names = PortNames(vec!["a".into(), "b".into()]);
    let err = |text: &str| {
        let cfg: SgwConfig = toml::from_str(text).unwrap();
        Sgw::new(&cfg, &names, "program.sgw", 1)
            .err()
            .map(|e| e.field)
    };
    let ok = "address = \"198.19.255.2\"\n";
    assert_eq!(
        err(&format!("{ok}ue_pool = \"2001:2::/64\"")).as_deref(),
        Some("program.sgw.ue_pool")
    );
    assert_eq!(
        err(&format!("{ok}ue_pool = \"198.18.0.0/4\"")).as_deref(),
        Some("program.sgw.ue_pool")
    );
    assert_eq!(
        err("address = \"x\"\nue_pool = \"198.18.128.0/17\"").as_deref(),
        Some("program.sgw.address")
    );
    assert_eq!(
        err(&format!("{ok}ue_pool = \"198.18.128.0/17\"\ncore = \"a\"")).as_deref(),
        Some("program.sgw.core")
    );
}

/// Replicated, sessions move to a switch that saw none of their signaling: switch A takes
/// the signaling of the `gtp` workload, switch B only its users' packets. Each of B's
/// packets names its subscriber (uplink by TEID) or, downlink, only an address B knows
/// nothing of: its alias, which A wrote with the session. Installed from what A would have
/// written, B tunnels every packet as one switch that saw all the signaling first does,
/// byte for byte. A session whose address another subscriber has here is refused.
#[test]
fn replicated_sessions_move_to_a_switch_that_sees_only_users_packets() {
    use crate::testutil::replicated_names;
    use std::collections::HashMap;
    let mut cfg = GenConfig::new(Workload::Gtp, 20_000);
    cfg.ipv6_share = 0.0;
    let (signaling, data): (Vec<_>, Vec<_>) = (crate::testutil::generated(&cfg).into_iter())
        .partition(|(f, _)| {
            let parsed = stateplane_wire::parse(f, 0, &hasher()).unwrap();
            parsed.flags.has(ParseFlags::GTPC)
        });
    let (mut a, mut b, mut one) = (sgw(), sgw(), sgw());
    assert!(a.replicate("sessions") && b.replicate("sessions"));
    assert!(!sgw().replicate("by_ue"));
    // The store, as A's writes leave it: each subscriber's last state, and its alias.
    let mut flows = Vec::new();
    for (frame, port) in &signaling {
        let (flow, alias) = replicated_names(&a, frame, *port);
        assert_eq!(alias, None);
        flows.push(flow.expect("signaling names its subscriber"));
        run_at(&mut a, 1, &[(frame.clone(), *port)], (0, 1), 2);
        run_at(&mut one, 1, &[(frame.clone(), *port)], (0, 1), 2);
    }
    let mut store = HashMap::new();
    let mut aliases = HashMap::new();
    for flow in flows {
        if let Some(state) = a.replicated_state(&flow) {
            let alias = a.replicated_alias_of(&flow).unwrap();
            assert_eq!(alias.tag(), flow.tag(), "one slot for both");
            aliases.insert(alias, flow);
            store.insert(flow, state);
        }
    }
    assert!(store.len() > 100, "{} sessions", store.len());
    let (mut by_alias, mut installed) = (0, 0);
    for (frame, port) in &data {
        let flow = match replicated_names(&b, frame, *port) {
            (Some(flow), None) => Some(flow),
            (None, Some(alias)) => {
                by_alias += 1;
                aliases.get(&alias).copied()
            }
            (None, None) => None,
            both => panic!("a packet named twice: {both:?}"),
        };
        if let Some(flow) = flow
            && b.replicated_state(&flow).is_none()
            && let Some(state) = store.get(&flow)
        {
            assert!(b.install_replicated(&flow, Some(state), 1));
            installed += 1;
        }
        let out = run_at(&mut b, 1, &[(frame.clone(), *port)], (0, 1), 2);
        assert_eq!(
            out,
            run_at(&mut one, 1, &[(frame.clone(), *port)], (0, 1), 2)
        );
    }
    assert!(
        by_alias > 50 && installed == store.len(),
        "{by_alias} {installed}"
    );

    // Withdrawn, a session takes its address entry with it; one whose address another
    // subscriber has here is refused, nothing changed.
    let (&flow, state) = store.iter().next().unwrap();
    let alias = a.replicated_alias_of(&flow).unwrap();
    assert!(b.install_replicated(&flow, None, 1));
    let downlink = data.iter().find(|(f, p)| {
        replicated_names(&a, f, *p) == (Some(flow), None)
            && stateplane_wire::parse(f, 0, &hasher()).is_ok_and(|p| !p.flags.has(ParseFlags::GTPU))
    });
    if let Some((f, p)) = downlink {
        assert_eq!(replicated_names(&b, f, *p), (None, Some(alias)));
    }
    let mut c = sgw();
    assert!(c.replicate("sessions"));
    let n = u32::from_be_bytes(flow.as_bytes()[4..8].try_into().unwrap());
    let other = n + (1 << 15); // the same address: the pool holds 2^15
    let create = signal(
        gtpv2_type::CREATE_SESSION_REQUEST,
        0,
        Some(other),
        [198, 18, 200, 1],
        9,
    );
    run_at(&mut c, 1, &[(create, 0)], (0, 1), 2);
    assert!(c.session(other).is_some());
    assert!(!c.install_replicated(&flow, Some(state), 1));
    assert_eq!((c.session(n), c.session(other).is_some()), (None, true));
    assert!(
        !c.install_replicated(&alias, Some(state), 1),
        "an alias holds no state"
    );
}

/// A reload keeps the sessions while the gateway's address stays: a subscriber's downlink
/// still reaches its eNodeB; a smaller capacity keeps as many as it holds; a new address
/// starts afresh, and says why.
#[test]
fn a_reload_keeps_sessions_while_the_gateways_address_stays() {
    let create = |n: u32| {
        let enb = [198, 18, 200, n as u8];
        signal(
            gtpv2_type::CREATE_SESSION_REQUEST,
            0,
            Some(n),
            enb,
            0xa000 + n,
        )
    };
    let opened = || {
        let mut p = sgw();
        let signals: Vec<(Vec<u8>, PortId)> = (1..=6).map(|n| (create(n), 0)).collect();
        run_at(&mut p, 1, &signals, (0, 1), 2);
        p
    };
    let reached = |p: &mut Sgw| {
        let down: Vec<(Vec<u8>, PortId)> = (1..=6)
            .map(|n| (downlink_to(&format!("198.18.128.{n}")), 1))
            .collect();
        let sent = run_at(p, 2, &down, (0, 1), 2);
        (sent.iter().zip(1..))
            .filter(|((v, bytes), n)| {
                *v == Verdict::Forward(0)
                    && stateplane_wire::parse(bytes, 0, &hasher()).unwrap().teid == 0xa000 + n
            })
            .count() as u64
    };
    for (extra, kept) in [("", 6), ("capacity = 4", 4)] {
        let mut new = sgw_at(SGW, extra);
        let carried = Program::inherit(&mut new, opened(), 2);
        assert_eq!(
            (carried[0].kept, carried[0].dropped),
            (kept, 6 - kept),
            "{extra}"
        );
        assert_eq!(reached(&mut new), kept, "{extra}");
    }
    let mut moved = sgw_at("198.19.255.3", "");
    let carried = Program::inherit(&mut moved, opened(), 2);
    assert_eq!(
        carried[0].to_string(),
        "sessions: starts afresh (the gateway's address changed from 198.19.255.2 to \
         198.19.255.3)"
    );
    assert_eq!(reached(&mut moved), 0);
}
