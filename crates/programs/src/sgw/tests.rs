use super::*;
use crate::testutil::{hasher, ip_frame, run_at};
use stateplane_gen::build::L4;
use stateplane_gen::gtp::{IMSI_BASE, enb_teid, mme_teid};
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

/// The generator's subscriber `u`: its eNodeB, the TEID its downlink carries, its address
/// (its place in the pool is its number: it is the `u`-th to appear).
fn generated_subscriber(u: u32) -> ([u8; 4], u32, [u8; 4]) {
    (
        [198, 18, 200, (u % 50) as u8 + 1],
        enb_teid(u),
        [198, 18, 128 + ((u >> 8) & 0x7f) as u8, u as u8],
    )
}

/// The generator's IPv6 subscriber `u`'s /64, the first 8 bytes: 2001:2:0:8000::/49 at
/// its place.
fn generated_prefix(u: u32) -> [u8; 8] {
    let [hi, lo] = (0x8000 | u as u16).to_be_bytes();
    [0x20, 0x01, 0, 2, 0, 0, hi, lo]
}

/// The generator's subscriber a request of its names: a Create by its IMSI, others by
/// the S11 TEID, whose low bits are its place.
fn generated_signaler(gtp: &[u8]) -> u32 {
    let signal = Signal::read(gtp).unwrap();
    match signal.header.message_type {
        gtpv2_type::CREATE_SESSION_REQUEST => (signal.imsi.flatten().unwrap() - IMSI_BASE) as u32,
        _ => signal.header.teid.unwrap() & !TEID_SPACE,
    }
}

#[test]
fn the_gtp_workload_is_tunneled_both_ways_with_each_subscribers_teid() {
    tunnels_the_gtp_workload(0.0, "", 1);
}

/// The same with a third of the subscribers on IPv6 (IPv4v6 sessions, each with a /64 of
/// `ue_pool6` at its place): their Create Session Responses give both, and their IPv6
/// packets tunnel both ways as the IPv4 ones do.
#[test]
fn ipv6_subscribers_get_a_64_and_tunnel_both_ways() {
    tunnels_the_gtp_workload(0.3, "ue_pool6 = \"2001:2:0:8000::/49\"", 1);
}

/// On two and on three workers, each packet reaching the worker the steering program of
/// live ports names (run here by its interpreter, as the kernel runs it): every request
/// is answered and every packet tunneled as on one worker, each subscriber given the
/// same place by the worker whose share it is.
#[test]
fn workers_steered_by_subscriber_serve_the_workload_between_them() {
    for workers in [2, 3] {
        tunnels_the_gtp_workload(0.3, "ue_pool6 = \"2001:2:0:8000::/49\"", workers);
    }
}

/// Several workers, over files and live: yes, unless the sessions are replicated
/// (refused with the reason and the fix).
#[test]
fn several_workers_serve_unless_replicated() {
    let p = sgw();
    assert_eq!(p.check_workers(1, false), Ok(()));
    assert_eq!(p.check_workers(4, true), Ok(()));
    assert_eq!(p.check_workers(2, false), Ok(()));
    let mut replicated = sgw();
    assert!(replicated.replicate("sessions"));
    let e = replicated.check_workers(2, true).unwrap_err();
    assert!(e.contains("replicated") && e.contains("--workers 1"), "{e}");
    assert_eq!(replicated.check_workers(1, true), Ok(()));
}

/// Worker 1 of 2 hands out places 1, 3, 5...: first never used, then freed; a reload
/// keeps its share.
#[test]
fn a_worker_hands_out_its_share_of_the_places_and_keeps_it_across_a_reload() {
    let second = |p: &mut Sgw, frame: Vec<u8>| run_at(p, 1, &[(frame, 0)], (1, 2), 2).remove(0);
    let place = |p: &mut Sgw, n: u64| {
        let r = response(&second(p, create(imsi(n), [198, 18, 200, 1], 1)).1);
        r.paa.map(|paa| paa[4])
    };
    let mut p = sgw_at(SGW, "");
    assert_eq!(
        [1, 2, 3].map(|n| place(&mut p, n)),
        [Some(1), Some(3), Some(5)]
    );
    assert_eq!(response(&second(&mut p, delete(3)).1).cause, Some(16));
    let mut reloaded = sgw_at(SGW, "");
    let carried = Program::inherit(&mut reloaded, p, 2);
    assert_eq!(carried[0].kept, 2);
    assert_eq!(place(&mut reloaded, 4), Some(7), "never used first");
    assert_eq!(
        place(&mut reloaded, 1),
        Some(1),
        "a subscriber keeps its place"
    );
}

/// More workers than places: a worker whose share is empty answers every Create Session
/// Request "all dynamic addresses occupied"; one with a place gives it, once.
#[test]
fn a_worker_beyond_the_pool_has_no_place_to_give() {
    let names = PortNames(vec!["access".into(), "core".into()]);
    let cfg: SgwConfig =
        toml::from_str("address = \"198.19.255.2\"\nue_pool = \"198.18.128.0/30\"").unwrap();
    let cause_on = |worker: usize, n: u64| {
        let mut p = Sgw::new(&cfg, &names, "program.sgw", 3).unwrap();
        let create = create(imsi(n), [198, 18, 200, 1], 1);
        let r = response(
            &run_at(&mut p, 1, &[(create, 0)], (worker, 6), 2)
                .remove(0)
                .1,
        );
        (r.cause, r.paa.map(|paa| paa[4]))
    };
    let occupied = Some(gtpv2_cause::ALL_DYNAMIC_ADDRESSES_OCCUPIED);
    assert_eq!(
        cause_on(5, 1),
        (occupied, None),
        "worker 5 of 6, places 0-3"
    );
    assert_eq!(
        cause_on(3, 1),
        (Some(gtpv2_cause::REQUEST_ACCEPTED), Some(3))
    );
}

/// Runs the generated workload through `workers` gateways (worker `w` of them each), each
/// packet to the one live ports' steering sends it to, and checks every packet's fate.
fn tunnels_the_gtp_workload(ipv6_share: f64, pool6: &str, workers: usize) {
    let mut cfg = GenConfig::new(Workload::Gtp, 20_000);
    cfg.ipv6_share = ipv6_share;
    let users = (20_000 / 100) as f64;
    let v6 = |u: u32| f64::from(u) / users < ipv6_share;
    let frames = crate::testutil::generated(&cfg);
    let mut gateways: Vec<Sgw> = (0..workers).map(|_| sgw_at(SGW, pool6)).collect();
    let steering = stateplane_io::live::steer::program(gateways[0].steering(0)).unwrap();
    let mut ipv6 = 0;
    let (mut signaling, mut uplink, mut downlink) = (0, 0, 0);
    for chunk in frames.chunks(32) {
        // Each packet to its worker, the chunk's packets of one worker in one burst.
        let worker_of = |f: &[u8]| stateplane_io::live::steer::run(&steering, f) as usize % workers;
        let mut out = vec![None; chunk.len()];
        for (w, gateway) in gateways.iter_mut().enumerate() {
            let (at, mine): (Vec<usize>, Vec<_>) = (chunk.iter().enumerate())
                .filter(|(_, (f, _))| worker_of(f) == w)
                .map(|(i, f)| (i, f.clone()))
                .unzip();
            for (i, o) in at
                .into_iter()
                .zip(run_at(gateway, 1, &mine, (w, workers), 2))
            {
                out[i] = Some(o);
            }
        }
        for ((before, _), o) in chunk.iter().zip(out) {
            let (verdict, after) = o.unwrap();
            let b = stateplane_wire::parse(before, 0, &hasher()).unwrap();
            if b.flags.has(ParseFlags::GTPC) {
                // Answered, back to the MME the way the request came.
                assert_eq!(verdict, Verdict::Forward(0));
                let gtp = &before[usize::from(b.gtp_offset)..];
                let request = Gtpv2Repr::parse(gtp).unwrap();
                let n = generated_signaler(gtp);
                let mut expected = accepted(request.message_type, request.sequence, n, mme_teid(n));
                if expected.paa.is_some() && v6(n) {
                    let v4 = generated_subscriber(n).2;
                    let paa = [&[3, 64][..], &generated_prefix(n), &[0; 8], &v4].concat();
                    expected.paa = Some(paa);
                }
                assert_eq!(response(&after), expected);
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
                match a.key.ip_version {
                    6 => {
                        assert_eq!(a.key.src[..8], generated_prefix(u), "from its /64");
                        ipv6 += 1;
                    }
                    _ => assert_eq!(
                        a.key.src[..4],
                        generated_subscriber(u).2,
                        "from its address"
                    ),
                }
                uplink += 1;
            } else {
                // Into the tunnel: to the subscriber's eNodeB, with its TEID.
                assert_eq!(verdict, Verdict::Forward(0), "downlink to the access side");
                let a = stateplane_wire::parse(&after, 0, &hasher()).unwrap();
                assert!(a.flags.has(ParseFlags::GTPU), "a GTP-U packet");
                let ue = &b.key.dst;
                let u = match b.key.ip_version {
                    6 => u32::from(u16::from_be_bytes([ue[6], ue[7]]) & 0x7fff),
                    _ => (u32::from(ue[2] - 128) << 8) | u32::from(ue[3]),
                };
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
    let share = f64::from(ipv6) / f64::from(uplink);
    assert!(
        (share - ipv6_share).abs() < 0.15,
        "{ipv6} of {uplink} uplink on IPv6"
    );
    for (w, gateway) in gateways.iter().enumerate() {
        let places: Vec<u32> = (gateway.sessions.iter())
            .map(|(_, s, _)| gateway.place_of(s.ue))
            .collect();
        assert!(places.len() >= 40, "worker {w} of {workers}: {places:?}");
        assert!(
            places.iter().all(|p| *p as usize % workers == w),
            "worker {w} of {workers} holds its share only: {places:?}"
        );
    }
}

/// The MME's S11 TEID in the tests' requests.
const MME_TEID: u32 = 0x4444;

/// The IMSI 001 01 and `n` in the MSIN's last digits.
fn imsi(n: u64) -> u64 {
    1_010_000_000_000 + n
}

fn ie(ie_type: u8, instance: u8, data: &[u8]) -> Vec<u8> {
    let mut buf = vec![0u8; 4 + data.len()];
    emit_gtpv2_ie(&mut buf, ie_type, instance, data).unwrap();
    buf
}

fn fteid_ie(interface: u8, teid: u32, address: [u8; 4]) -> Vec<u8> {
    let mut f = [0u8; 9];
    let end = stateplane_wire::gtp::Fteid {
        interface,
        teid,
        v4: Some(address),
        v6: None,
    };
    end.emit(&mut f).unwrap();
    ie(gtpv2_ie::F_TEID, 0, &f)
}

/// The IMSI element of `imsi`.
fn imsi_ie(imsi: u64) -> Vec<u8> {
    ie(gtpv2_ie::IMSI, 0, &stateplane_wire::gtp::imsi_tbcd(imsi))
}

/// The MME's S11 F-TEID (the Sender F-TEID for Control Plane).
fn mme_ie() -> Vec<u8> {
    fteid_ie(fteid_interface::S11_MME, MME_TEID, [198, 18, 255, 1])
}

/// A bearer context: the default bearer, and the eNodeB's S1-U F-TEID.
fn bearer_ie(enb: [u8; 4], teid: u32) -> Vec<u8> {
    let mut inner = ie(gtpv2_ie::EBI, 0, &[5]);
    inner.extend(fteid_ie(fteid_interface::S1U_ENODEB, teid, enb));
    ie(gtpv2_ie::BEARER_CONTEXT, 0, &inner)
}

/// A GTPv2-C message from the MME to the gateway: header TEID `teid`, sequence 1.
fn message(message_type: u8, teid: Option<u32>, ies: &[Vec<u8>]) -> Vec<u8> {
    let ies = ies.concat();
    let header = Gtpv2Repr {
        message_type,
        teid,
        sequence: 1,
        payload_len: ies.len() as u16,
    };
    let mut payload = vec![0u8; header.header_len()];
    header.emit(&mut payload).unwrap();
    payload.extend(ies);
    udp_frame("198.18.255.1", SGW, GTPC_PORT, &payload)
}

/// A Create Session Request for `imsi`, with the eNodeB's S1-U F-TEID.
fn create(imsi: u64, enb: [u8; 4], enb_teid: u32) -> Vec<u8> {
    let ies = [imsi_ie(imsi), mme_ie(), bearer_ie(enb, enb_teid)];
    message(gtpv2_type::CREATE_SESSION_REQUEST, Some(0), &ies)
}

/// A Modify Bearer Request to the session at `place`: its eNodeB's S1-U F-TEID.
fn modify(place: u32, enb: [u8; 4], enb_teid: u32) -> Vec<u8> {
    let ies = [bearer_ie(enb, enb_teid)];
    message(
        gtpv2_type::MODIFY_BEARER_REQUEST,
        Some(S11_TEIDS | place),
        &ies,
    )
}

/// A Delete Session Request to the session at `place`.
fn delete(place: u32) -> Vec<u8> {
    message(
        gtpv2_type::DELETE_SESSION_REQUEST,
        Some(S11_TEIDS | place),
        &[],
    )
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
    /// The offending element (type, instance) a rejection names.
    offending: Option<(u8, u8)>,
    /// An Echo Response's restart counter.
    recovery: Option<u8>,
    /// (instance, interface type, TEID, address) of each F-TEID, the bearer context's
    /// last.
    fteids: Vec<(u8, u8, u32, [u8; 4])>,
    /// The PAA's data: the PDN type, then the addresses.
    paa: Option<Vec<u8>>,
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
            gtpv2_ie::CAUSE => {
                r.cause = Some(ie.data[0]);
                if ie.data.len() == 6 {
                    assert_eq!(&ie.data[3..5], [0, 0], "the offending element's length");
                    r.offending = Some((ie.data[2], ie.data[5]));
                } else {
                    assert_eq!(ie.data.len(), 2, "a cause and its flags");
                }
            }
            gtpv2_ie::RECOVERY => r.recovery = Some(ie.data[0]),
            gtpv2_ie::F_TEID => r.fteids.push(fteid(ie.instance, ie.data)),
            gtpv2_ie::PAA => r.paa = Some(ie.data.to_vec()),
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

/// The response the gateway gives an accepted request of `message_type` about the
/// session at `place` whose MME end is `mme`, sequence `sequence`.
fn accepted(message_type: u8, sequence: u32, place: u32, mme: u32) -> Response {
    let gateway = [198, 19, 255, 2];
    let mut r = Response {
        message_type: message_type + 1,
        teid: Some(mme),
        sequence,
        cause: Some(gtpv2_cause::REQUEST_ACCEPTED),
        ..Response::default()
    };
    if message_type == gtpv2_type::CREATE_SESSION_REQUEST {
        r.fteids = vec![
            (0, 11, S11_TEIDS | place, gateway),
            (0, 1, S1U_TEIDS | place, gateway),
        ];
        r.paa = Some([&[1][..], &generated_subscriber(place).2].concat());
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

/// A server's address of the family of `address`.
fn server_for(address: &str) -> &'static str {
    if address.contains(':') {
        "2001:2:0:2::9"
    } else {
        "198.19.0.9"
    }
}

fn downlink_to(ue: &str) -> Vec<u8> {
    ip_frame(
        server_for(ue),
        ue,
        L4::Udp {
            src_port: 53,
            dst_port: 4000,
        },
    )
}

fn one(p: &mut Sgw, frame: Vec<u8>) -> (Verdict, Vec<u8>) {
    run_at(p, 1, &[(frame, 0)], (0, 1), 2).remove(0)
}

fn reason(p: &Sgw, v: Verdict) -> &'static str {
    match v {
        Verdict::Drop(r) => r.name(p.drop_reasons()),
        _ => "pass",
    }
}

/// A GTP-U T-PDU from `enb` with `teid`, the user's packet inside from `source`.
fn uplink_from(enb: &str, teid: u32, source: &str) -> Vec<u8> {
    let mut gtp = vec![0u8; 8];
    let l4 = L4::Udp {
        src_port: 4000,
        dst_port: 53,
    };
    let inner = ip_frame(source, server_for(source), l4)[14..].to_vec();
    let header = GtpuRepr {
        message_type: GTPU_T_PDU,
        teid,
        sequence: None,
        payload_len: inner.len() as u16,
    };
    header.emit(&mut gtp).unwrap();
    gtp.extend_from_slice(&inner);
    udp_frame(enb, SGW, GTPU_PORT, &gtp)
}

#[test]
fn signaling_creates_moves_and_deletes_a_session() {
    let mut p = sgw();
    // The first subscriber gets the pool's first place, 198.18.128.0; before its session,
    // its downlink is dropped.
    let v = one(&mut p, downlink_to("198.18.128.0")).0;
    assert_eq!(reason(&p, v), "no_session");
    let (v, answer) = one(&mut p, create(imsi(7), [198, 18, 200, 1], 0xaaaa));
    assert_eq!(v, Verdict::Forward(0));
    assert_eq!(
        response(&answer),
        accepted(gtpv2_type::CREATE_SESSION_REQUEST, 1, 0, MME_TEID)
    );
    let s = p.session(imsi(7)).unwrap();
    assert_eq!(
        (s.enb, s.enb_teid, s.ue, s.mme_teid),
        ([198, 18, 200, 1], 0xaaaa, [198, 18, 128, 0], MME_TEID)
    );
    let (v, bytes) = one(&mut p, downlink_to("198.18.128.0"));
    assert_eq!(v, Verdict::Forward(0));
    let a = stateplane_wire::parse(&bytes, 0, &hasher()).unwrap();
    assert_eq!(
        (a.key.dst[..4].to_vec(), a.teid),
        (vec![198, 18, 200, 1], 0xaaaa)
    );
    // A handover: the downlink follows the new eNodeB and TEID.
    let (v, answer) = one(&mut p, modify(0, [198, 18, 200, 9], 0xbbbb));
    assert_eq!(v, Verdict::Forward(0));
    assert_eq!(
        response(&answer),
        accepted(gtpv2_type::MODIFY_BEARER_REQUEST, 1, 0, MME_TEID)
    );
    let (_, bytes) = one(&mut p, downlink_to("198.18.128.0"));
    let a = stateplane_wire::parse(&bytes, 0, &hasher()).unwrap();
    assert_eq!(
        (a.key.dst[..4].to_vec(), a.teid),
        (vec![198, 18, 200, 9], 0xbbbb)
    );
    // Uplink with a TEID of no session, or outside the S1-U space, is dropped; so is one
    // from another eNodeB than the session's (its eNodeB before the handover), and one
    // whose packet is not from the subscriber's address.
    let uplink = |teid: u32| uplink_from("198.18.200.9", teid, "198.18.128.0");
    assert_eq!(one(&mut p, uplink(S1U_TEIDS)).0, Verdict::Forward(1));
    let v = one(
        &mut p,
        uplink_from("198.18.200.1", S1U_TEIDS, "198.18.128.0"),
    )
    .0;
    assert_eq!(reason(&p, v), "wrong_enb");
    let v = one(
        &mut p,
        uplink_from("198.18.200.9", S1U_TEIDS, "198.18.128.8"),
    )
    .0;
    assert_eq!(reason(&p, v), "spoofed");
    let v = one(&mut p, uplink(S1U_TEIDS | 8)).0;
    assert_eq!(
        v,
        Verdict::Forward(0),
        "an Error Indication back to the eNodeB"
    );
    // The next may go only 10 ms later: until then, counted and dropped.
    for teid in [
        S1U_TEIDS | 8,
        S11_TEIDS,
        0x3000_0000,
        S1U_TEIDS | 0x0fff_ffff,
    ] {
        let v = one(&mut p, uplink(teid)).0;
        assert_eq!(reason(&p, v), "no_session", "{teid:#x}");
    }
    // Broken signaling is counted and changes nothing.
    let mut broken = modify(0, [1, 1, 1, 1], 1);
    // Its bearer context claims more bytes than the message has.
    let ie = 14 + 20 + 8 + 12;
    broken[ie + 1..ie + 3].copy_from_slice(&[0, 0xff]);
    let v = one(&mut p, broken).0;
    assert_eq!(reason(&p, v), "bad_signaling");
    assert_eq!(p.session(imsi(7)).unwrap().enb_teid, 0xbbbb);
    // Delete: the session and its address go.
    let (v, answer) = one(&mut p, delete(0));
    assert_eq!(v, Verdict::Forward(0));
    assert_eq!(
        response(&answer),
        accepted(gtpv2_type::DELETE_SESSION_REQUEST, 1, 0, MME_TEID)
    );
    assert_eq!(p.session(imsi(7)), None);
    let v = one(&mut p, downlink_to("198.18.128.0")).0;
    assert_eq!(reason(&p, v), "no_session");
    let v = one(&mut p, uplink(S1U_TEIDS)).0;
    assert_eq!(reason(&p, v), "no_session", "a deleted session's TEID");
    // Not for a subscriber at all.
    let v = one(&mut p, downlink_to("198.19.0.1")).0;
    assert_eq!(reason(&p, v), "not_routed");
}

/// The response to a refused request: its type, the MME's TEID where the session is
/// known (else 0), the cause, and the offending element.
fn refused(message_type: u8, teid: u32, cause: u8, offending: Option<(u8, u8)>) -> Response {
    Response {
        message_type: message_type + 1,
        teid: Some(teid),
        sequence: 1,
        cause: Some(cause),
        offending,
        ..Response::default()
    }
}

/// Every request the gateway reads but cannot apply is answered with why (TS 29.274
/// 8.4), changes nothing, and is counted by cause in the sessions' stats.
#[test]
fn refused_requests_are_answered_with_their_cause() {
    use gtpv2_cause::*;
    use gtpv2_type::*;
    let mut p = sgw_at(SGW, "capacity = 2");
    let enb = [198, 18, 200, 1];
    let answered = |p: &mut Sgw, frame: Vec<u8>| {
        let (v, bytes) = one(p, frame);
        assert_eq!(v, Verdict::Forward(0), "answered");
        response(&bytes)
    };
    // No session has the TEID: context not found, to TEID 0.
    let r = answered(&mut p, modify(3, enb, 1));
    assert_eq!(
        r,
        refused(MODIFY_BEARER_REQUEST, 0, CONTEXT_NOT_FOUND, None)
    );
    let r = answered(&mut p, delete(3));
    assert_eq!(
        r,
        refused(DELETE_SESSION_REQUEST, 0, CONTEXT_NOT_FOUND, None)
    );
    // A Create with no IMSI, an IMSI that is no IMSI, no MME F-TEID, a broken F-TEID.
    let bearer = bearer_ie(enb, 1);
    let cases = [
        (
            vec![mme_ie(), bearer.clone()],
            MANDATORY_IE_MISSING,
            (gtpv2_ie::IMSI, 0),
        ),
        (
            vec![
                ie(gtpv2_ie::IMSI, 0, &[0x21, 0xab]),
                mme_ie(),
                bearer.clone(),
            ],
            MANDATORY_IE_INCORRECT,
            (gtpv2_ie::IMSI, 0),
        ),
        (
            vec![imsi_ie(imsi(1)), bearer.clone()],
            MANDATORY_IE_MISSING,
            (gtpv2_ie::F_TEID, 0),
        ),
        (
            vec![
                imsi_ie(imsi(1)),
                ie(gtpv2_ie::F_TEID, 0, &[0x8a, 0, 0, 0, 1, 198]),
            ],
            MANDATORY_IE_INCORRECT,
            (gtpv2_ie::F_TEID, 0),
        ),
    ];
    // An F-TEID in the bearer context shorter than its flags say (IPv6, no address): the
    // bearer context, the element the MME wrote at the top, is the offending one.
    let mut inner = ie(gtpv2_ie::EBI, 0, &[5]);
    inner.extend(ie(gtpv2_ie::F_TEID, 0, &[0x40, 0, 0, 0, 1]));
    let broken_bearer = ie(gtpv2_ie::BEARER_CONTEXT, 0, &inner);
    let cases = cases.into_iter().chain([(
        vec![imsi_ie(imsi(1)), mme_ie(), broken_bearer],
        MANDATORY_IE_INCORRECT,
        (gtpv2_ie::BEARER_CONTEXT, 0),
    )]);
    for (ies, cause, offending) in cases {
        let r = answered(&mut p, message(CREATE_SESSION_REQUEST, Some(0), &ies));
        let teid = if ies.contains(&mme_ie()) { MME_TEID } else { 0 };
        assert_eq!(
            r,
            refused(CREATE_SESSION_REQUEST, teid, cause, Some(offending))
        );
    }
    assert_eq!(p.sessions.iter().count(), 0, "nothing made");
    // Two sessions fill the table: a third is refused for want of resources.
    for n in 1..=2 {
        let r = answered(&mut p, create(imsi(n), enb, 1));
        assert_eq!(r.cause, Some(REQUEST_ACCEPTED));
    }
    let r = answered(&mut p, create(imsi(3), enb, 1));
    assert_eq!(
        r,
        refused(
            CREATE_SESSION_REQUEST,
            MME_TEID,
            NO_RESOURCES_AVAILABLE,
            None
        )
    );
    // A Modify Bearer with no bearer context names it, to the session's MME end.
    let r = answered(&mut p, message(MODIFY_BEARER_REQUEST, Some(S11_TEIDS), &[]));
    let missing = Some((gtpv2_ie::BEARER_CONTEXT, 0));
    assert_eq!(
        r,
        refused(
            MODIFY_BEARER_REQUEST,
            MME_TEID,
            MANDATORY_IE_MISSING,
            missing
        )
    );
    // Unreadable, or of a type the gateway does not take: dropped, unanswered.
    let v = one(&mut p, message(200, Some(0), &[])).0;
    assert_eq!(reason(&p, v), "bad_signaling");
    let ctx = Context::one_worker(1, hasher(), 2);
    let stats = Request::Stats {
        table: "sessions".into(),
    };
    let Ok(Reply::Counters(counters)) = p.control(&stats, None, &ctx) else {
        panic!("the sessions' stats");
    };
    let count = |name: &str| counters.iter().find(|(n, _)| *n == name).map(|c| c.1);
    assert_eq!(count("entries"), Some(2));
    assert_eq!(count("requests_accepted"), Some(2));
    assert_eq!(count("rejected_context_not_found"), Some(2));
    assert_eq!(count("rejected_ie_missing"), Some(3));
    assert_eq!(count("rejected_ie_incorrect"), Some(3));
    assert_eq!(count("rejected_no_resources"), Some(1));
    assert_eq!(count("rejected_addresses_occupied"), Some(0));
}

/// The gateway hands out the pool's places (addresses, and the TEIDs that carry them)
/// never used first, then those freed, the longest free first; a pool with none left
/// refuses a Create with "all dynamic addresses are occupied". A subscriber that asks
/// again keeps its place.
#[test]
fn places_go_in_order_and_come_back_longest_free_first() {
    let names = PortNames(vec!["access".into(), "core".into()]);
    let cfg: SgwConfig =
        toml::from_str("address = \"198.19.255.2\"\nue_pool = \"198.18.128.0/30\"").unwrap();
    let mut p = Sgw::new(&cfg, &names, "program.sgw", 3).unwrap();
    let enb = [198, 18, 200, 1];
    let place = |p: &mut Sgw, n: u64| {
        let r = response(&one(p, create(imsi(n), enb, 1)).1);
        match r.cause {
            Some(gtpv2_cause::REQUEST_ACCEPTED) => Ok(r.paa.unwrap()[4]),
            cause => Err(cause),
        }
    };
    assert_eq!([1, 2, 3].map(|n| place(&mut p, n)), [Ok(0), Ok(1), Ok(2)]);
    for at in [1, 0] {
        assert_eq!(response(&one(&mut p, delete(at)).1).cause, Some(16));
    }
    assert_eq!(place(&mut p, 4), Ok(3), "never used first");
    assert_eq!(place(&mut p, 5), Ok(1), "then the longest free");
    assert_eq!(
        place(&mut p, 3),
        Ok(2),
        "a subscriber asking again keeps its place"
    );
    assert_eq!(place(&mut p, 6), Ok(0));
    let occupied = Some(gtpv2_cause::ALL_DYNAMIC_ADDRESSES_OCCUPIED);
    assert_eq!(place(&mut p, 7), Err(occupied));
    // The TEIDs name the places: uplink of the subscriber at place 1, from its address.
    let v = one(
        &mut p,
        uplink_from("198.18.200.1", S1U_TEIDS | 1, "198.18.128.1"),
    )
    .0;
    assert_eq!(v, Verdict::Forward(1));
    // Freed by the control plane, a place is handed out again.
    let delete = Request::Write {
        table: "sessions".into(),
        writes: vec![stateplane_state::Write::Delete(vec![
            stateplane_state::Match::Exact(u128::from(imsi(5))),
        ])],
    };
    let ctx = Context::one_worker(1, hasher(), 2);
    p.control(&delete, None, &ctx).unwrap();
    assert_eq!(place(&mut p, 7), Ok(1));
    // The control plane makes no session (it would hand out no place and index no
    // address): an insert or a modify is refused and changes nothing.
    let entry = stateplane_state::Entry {
        key: vec![stateplane_state::Match::Exact(u128::from(imsi(9)))],
        action: "session".into(),
        params: vec![0xc612_c801, 7, 0xc612_8002, 8, 1],
        priority: 0,
        hits: 0,
    };
    for write in [
        stateplane_state::Write::Insert(entry.clone()),
        stateplane_state::Write::Modify(entry),
    ] {
        let request = Request::Write {
            table: "sessions".into(),
            writes: vec![write],
        };
        let refused = p.control(&request, None, &ctx).unwrap_err().to_string();
        assert!(refused.contains("signaling"), "{refused}");
    }
    assert_eq!(p.session(imsi(9)), None);
    assert_eq!(
        p.sessions.iter().count(),
        4,
        "the pool's four, as they were"
    );
}

/// A session whose eNodeB the MME has not named yet (a Create Session Request without
/// one, as the MME sends it before the radio bearer is up) takes uplink from any eNodeB,
/// and drops its downlink (`no_bearer`) until a Modify Bearer Request names the eNodeB.
#[test]
fn a_session_takes_its_enodeb_from_the_modify_bearer_request() {
    let mut p = sgw();
    let ies = [imsi_ie(imsi(1)), mme_ie()];
    let r = response(
        &one(
            &mut p,
            message(gtpv2_type::CREATE_SESSION_REQUEST, Some(0), &ies),
        )
        .1,
    );
    assert_eq!(
        r,
        accepted(gtpv2_type::CREATE_SESSION_REQUEST, 1, 0, MME_TEID)
    );
    let v = one(&mut p, downlink_to("198.18.128.0")).0;
    assert_eq!(reason(&p, v), "no_bearer");
    let v = one(
        &mut p,
        uplink_from("198.18.200.4", S1U_TEIDS, "198.18.128.0"),
    )
    .0;
    assert_eq!(
        v,
        Verdict::Forward(1),
        "uplink before the Modify Bearer Request"
    );
    one(&mut p, modify(0, [198, 18, 200, 5], 0x55));
    let (v, bytes) = one(&mut p, downlink_to("198.18.128.0"));
    assert_eq!(v, Verdict::Forward(0));
    assert_eq!(
        stateplane_wire::parse(&bytes, 0, &hasher()).unwrap().teid,
        0x55
    );
    let v = one(
        &mut p,
        uplink_from("198.18.200.4", S1U_TEIDS, "198.18.128.0"),
    )
    .0;
    assert_eq!(reason(&p, v), "wrong_enb");
}

/// An Echo Request (path management: an MME declares a gateway that does not answer
/// dead) gets an Echo Response: no TEID, its sequence number, a restart counter.
#[test]
fn echo_requests_are_answered() {
    let mut p = sgw();
    let (v, bytes) = one(&mut p, message(gtpv2_type::ECHO_REQUEST, None, &[]));
    assert_eq!(v, Verdict::Forward(0));
    let r = response(&bytes);
    assert_eq!(
        r,
        Response {
            message_type: gtpv2_type::ECHO_RESPONSE,
            teid: None,
            sequence: 1,
            recovery: Some(0),
            ..Response::default()
        }
    );
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
/// the signaling of the `gtp` workload (a third of its subscribers on IPv6), switch B only
/// its users' packets. None of B's packets names its subscriber: each carries only its
/// place (uplink in its TEID, downlink in its address or /64), the alias A wrote with the
/// session. Installed from what A would have written, B tunnels every packet as one switch
/// that saw all the signaling first does, byte for byte. A session whose address another
/// subscriber has here is refused.
#[test]
fn replicated_sessions_move_to_a_switch_that_sees_only_users_packets() {
    use crate::testutil::replicated_names;
    use std::collections::HashMap;
    let mut cfg = GenConfig::new(Workload::Gtp, 20_000);
    cfg.ipv6_share = 0.3;
    let (signaling, data): (Vec<_>, Vec<_>) = (crate::testutil::generated(&cfg).into_iter())
        .partition(|(f, _)| {
            let parsed = stateplane_wire::parse(f, 0, &hasher()).unwrap();
            parsed.flags.has(ParseFlags::GTPC)
        });
    let dual = || sgw_at(SGW, "ue_pool6 = \"2001:2:0:8000::/49\"");
    let (mut a, mut b, mut whole) = (dual(), dual(), dual());
    assert!(a.replicate("sessions") && b.replicate("sessions"));
    assert!(!sgw().replicate("by_ue"));
    // The store, as A's writes leave it: each subscriber's last state, and its alias.
    let mut flows = Vec::new();
    for (frame, port) in &signaling {
        let (flow, alias) = replicated_names(&a, frame, *port);
        assert_eq!(alias, None);
        flows.push(flow.expect("signaling names its subscriber"));
        run_at(&mut a, 1, &[(frame.clone(), *port)], (0, 1), 2);
        run_at(&mut whole, 1, &[(frame.clone(), *port)], (0, 1), 2);
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
            run_at(&mut whole, 1, &[(frame.clone(), *port)], (0, 1), 2)
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
    let n = u64::from_be_bytes(flow.as_bytes()[4..12].try_into().unwrap());
    let other = n + (1 << 15); // the same place: the pool holds 2^15
    run_at(
        &mut c,
        1,
        &[(create(other, [198, 18, 200, 1], 9), 0)],
        (0, 1),
        2,
    );
    assert!(c.session(other).is_some());
    assert!(!c.install_replicated(&flow, Some(state), 1));
    assert_eq!((c.session(n), c.session(other).is_some()), (None, true));
    // A third subscriber of that place is refused it: no address is left for it.
    let r = response(&one(&mut c, create(n + (2 << 15), [198, 18, 200, 1], 9)).1);
    assert_eq!(r.cause, Some(gtpv2_cause::ALL_DYNAMIC_ADDRESSES_OCCUPIED));
    assert!(
        !c.install_replicated(&alias, Some(state), 1),
        "an alias holds no state"
    );
}

/// Synced, the sessions move into another gateway (another hash seed) with their
/// places: there every packet of the users' traffic goes out as on a gateway that saw
/// the signaling itself, and a new subscriber takes a place none of them holds. Moved
/// into a gateway whose own subscriber holds a moved one's address, that one is refused
/// and its own stays.
#[test]
fn synced_sessions_move_to_another_gateway_with_their_places() {
    let cfg = GenConfig::new(Workload::Gtp, 20_000);
    let (signaling, data): (Vec<_>, Vec<_>) = (crate::testutil::generated(&cfg).into_iter())
        .partition(|(f, _)| {
            let parsed = stateplane_wire::parse(f, 0, &hasher()).unwrap();
            parsed.flags.has(ParseFlags::GTPC)
        });
    let (mut a, mut whole) = (sgw(), sgw());
    let slots = a.sessions.slot_count() as u32;
    let length = a.track("sessions", 0).unwrap();
    // A slot: action, IMSI, then `enb enb_teid ue mme_teid pdn_type` a word each.
    let stride = 1 + 1 + 5;
    assert_eq!(length, slots * stride);
    run_at(&mut a, 1, &signaling, (0, 1), 2);
    run_at(&mut whole, 1, &signaling, (0, 1), 2);
    let other = || {
        let names = PortNames(vec!["access".into(), "core".into()]);
        let cfg: SgwConfig = toml::from_str(&format!(
            "address = \"{SGW}\"\nue_pool = \"198.18.128.0/17\"\naccess = \"access\"\n\
             core = \"core\""
        ))
        .unwrap();
        let mut gateway = Sgw::new(&cfg, &names, "program.sgw", 77).unwrap();
        assert_eq!(gateway.track("sessions", 0), Some(length));
        gateway
    };
    let mut b = other();
    let (moved, refused) = crate::testutil::move_synced_table(&mut a, &mut b, stride);
    assert!(
        moved > 100 && refused == 0,
        "{moved} sessions, {refused} refused"
    );
    assert_eq!(
        run_at(&mut b, 1, &data, (0, 1), 2),
        run_at(&mut whole, 1, &data, (0, 1), 2)
    );
    let fresh = response(&one(&mut b, create(imsi(900_000), [198, 18, 200, 1], 9)).1);
    let theirs = response(&one(&mut whole, create(imsi(900_000), [198, 18, 200, 1], 9)).1);
    assert_eq!(fresh, theirs, "the next free place, as where they began");

    let mut c = other();
    let own = imsi(800_000);
    run_at(
        &mut c,
        1,
        &[(create(own, [198, 18, 200, 1], 9), 0)],
        (0, 1),
        2,
    );
    let mut a = sgw();
    a.track("sessions", 0);
    run_at(&mut a, 1, &signaling, (0, 1), 2);
    assert_eq!(
        crate::testutil::move_synced_table(&mut a, &mut c, stride),
        (moved, 1),
        "the subscriber of the first place is refused"
    );
    assert!(c.session(own).is_some());
    assert_eq!(c.sessions.len(), moved);
}

/// A reload keeps the sessions while the gateway's address and pool stay: a subscriber's
/// downlink still reaches its eNodeB, the places kept stay taken; a smaller capacity keeps
/// as many as it holds; a new address or pool starts afresh, and says why.
#[test]
fn a_reload_keeps_sessions_while_the_gateways_address_and_pool_stay() {
    let opened = || {
        let mut p = sgw();
        let signals: Vec<(Vec<u8>, PortId)> = (1..=6u32)
            .map(|n| {
                (
                    create(imsi(n.into()), [198, 18, 200, n as u8], 0xa000 + n),
                    0,
                )
            })
            .collect();
        run_at(&mut p, 1, &signals, (0, 1), 2);
        p
    };
    let reached = |p: &mut Sgw| {
        let down: Vec<(Vec<u8>, PortId)> = (0..6)
            .map(|place| (downlink_to(&format!("198.18.128.{place}")), 1))
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
        if kept == 6 {
            let r = response(&one(&mut new, create(imsi(7), [198, 18, 200, 7], 7)).1);
            assert_eq!(r.paa, Some(vec![1, 198, 18, 128, 6]), "the next place free");
        }
    }
    let mut moved = sgw_at("198.19.255.3", "");
    let carried = Program::inherit(&mut moved, opened(), 2);
    assert_eq!(
        carried[0].to_string(),
        "sessions: starts afresh (the gateway's address changed from 198.19.255.2 to \
         198.19.255.3)"
    );
    assert_eq!(reached(&mut moved), 0);
    let names = PortNames(vec!["access".into(), "core".into()]);
    let cfg: SgwConfig =
        toml::from_str("address = \"198.19.255.2\"\nue_pool = \"198.18.0.0/17\"").unwrap();
    let mut repooled = Sgw::new(&cfg, &names, "program.sgw", 3).unwrap();
    let carried = Program::inherit(&mut repooled, opened(), 2);
    assert_eq!(
        carried[0].to_string(),
        "sessions: starts afresh (the subscriber pools changed from 198.18.128.0/17 to \
         198.18.0.0/17 (a session's addresses and TEIDs are its place in the pools))"
    );
    let mut dual = sgw_at(SGW, "ue_pool6 = \"2001:2:0:8000::/49\"");
    let carried = Program::inherit(&mut dual, opened(), 2);
    assert!(
        carried[0]
            .to_string()
            .contains("changed from 198.18.128.0/17 to 198.18.128.0/17 and 2001:2:0:8000::/49"),
        "{}",
        carried[0]
    );
}

/// A GTP-U Echo Request from an eNodeB (its path supervision) gets an Echo Response from
/// the gateway's GTP-U port: TEID 0, the request's sequence number, Recovery (type 14)
/// with the restart counter.
#[test]
fn user_plane_echo_requests_are_answered() {
    let mut p = sgw();
    let mut request = [0u8; 12];
    let header = GtpuRepr {
        message_type: 1,
        teid: 0,
        sequence: Some(0x1234),
        payload_len: 0,
    };
    header.emit(&mut request).unwrap();
    let frame = udp_frame("198.18.200.1", SGW, GTPU_PORT, &request);
    let (v, bytes) = one(&mut p, frame.clone());
    assert_eq!(v, Verdict::Forward(0), "back out of the access port");
    let a = stateplane_wire::parse(&bytes, 0, &hasher()).unwrap();
    assert_eq!(
        (a.key.src[..4].to_vec(), a.key.dst[..4].to_vec()),
        (vec![198, 19, 255, 2], vec![198, 18, 200, 1])
    );
    assert_eq!((a.key.src_port, a.key.dst_port), (GTPU_PORT, GTPU_PORT));
    assert_eq!(
        checksum::checksum(&bytes[14..34]),
        0,
        "IPv4 header checksum"
    );
    let gtp = GtpuPacket::new_checked(&bytes[usize::from(a.gtp_offset)..]).unwrap();
    let response = GtpuRepr::parse(&gtp).unwrap();
    assert_eq!(
        (response.message_type, response.teid, response.sequence),
        (2, 0, Some(0x1234))
    );
    assert_eq!(gtp.payload(), [14, 0]);
    assert_eq!(bytes.len(), 14 + 20 + 8 + 12 + 2);
}

/// A T-PDU whose TEID names no session (the gateway lost it, or never had it) gets an
/// Error Indication back to its eNodeB (TS 29.281 7.3.1: TEID 0, the S flag, TEID Data I
/// with the TEID, the gateway's address as GTP-U Peer Address), at most one every 10 ms:
/// the rest are dropped as `no_session`, and the count is in the sessions' stats.
#[test]
fn unknown_teids_get_an_error_indication_at_most_every_10_ms() {
    let mut p = sgw();
    let unknown = || uplink_from("198.18.200.3", S1U_TEIDS | 9, "198.18.128.9");
    let at = |p: &mut Sgw, t: u64| run_at(p, t, &[(unknown(), 0)], (0, 1), 2).remove(0);
    let (v, bytes) = at(&mut p, 5_000_000);
    assert_eq!(v, Verdict::Forward(0));
    let a = stateplane_wire::parse(&bytes, 0, &hasher()).unwrap();
    assert_eq!(
        (
            a.key.src[..4].to_vec(),
            a.key.dst[..4].to_vec(),
            a.key.dst_port
        ),
        (vec![198, 19, 255, 2], vec![198, 18, 200, 3], GTPU_PORT)
    );
    let gtp = &bytes[usize::from(a.gtp_offset)..];
    assert_eq!(
        gtp,
        [
            &[0x32, 26, 0, 16, 0, 0, 0, 0, 0, 0, 0, 0][..],
            &[16, 0x20, 0, 0, 9],
            &[133, 0, 4, 198, 19, 255, 2],
        ]
        .concat()
    );
    let names = p.drop_reasons();
    let verdicts = [5_000_001, 14_999_999, 15_000_000, 15_000_001].map(|t| match at(&mut p, t).0 {
        Verdict::Drop(r) => r.name(names),
        _ => "pass",
    });
    assert_eq!(verdicts, ["no_session", "no_session", "pass", "no_session"]);
    let ctx = Context::one_worker(1, hasher(), 2);
    let stats = Request::Stats {
        table: "sessions".into(),
    };
    let Ok(Reply::Counters(counters)) = p.control(&stats, None, &ctx) else {
        panic!("the sessions' stats");
    };
    assert!(counters.contains(&("error_indications", 2)), "{counters:?}");
}

/// The PDN type asked for is served where the pools allow: IPv4v6 with no IPv6 pool is
/// IPv4 (cause 18, "new PDN type due to network preference"), IPv6 alone is refused (83);
/// with one, an IPv6 session gets its /64 alone, carries no IPv4, and takes IPv6 uplink
/// only from its /64.
#[test]
fn sessions_carry_the_pdn_types_the_pools_allow() {
    use gtpv2_type::CREATE_SESSION_REQUEST;
    let enb = [198, 18, 200, 1];
    let asking = |imsi: u64, pdn: u8| {
        let ies = [
            imsi_ie(imsi),
            mme_ie(),
            ie(gtpv2_ie::PDN_TYPE, 0, &[pdn]),
            bearer_ie(enb, 1),
        ];
        message(CREATE_SESSION_REQUEST, Some(0), &ies)
    };
    let mut v4_only = sgw();
    let r = response(&one(&mut v4_only, asking(imsi(1), 3)).1);
    assert_eq!(r.cause, Some(gtpv2_cause::NEW_PDN_TYPE_NETWORK_PREFERENCE));
    assert_eq!(r.paa, Some(vec![1, 198, 18, 128, 0]));
    let r = response(&one(&mut v4_only, asking(imsi(2), 2)).1);
    let refused_v6 = refused(
        CREATE_SESSION_REQUEST,
        MME_TEID,
        gtpv2_cause::PREFERRED_PDN_TYPE_NOT_SUPPORTED,
        None,
    );
    assert_eq!(r, refused_v6);
    let r = response(&one(&mut v4_only, asking(imsi(2), 5)).1);
    assert_eq!(r.offending, Some((gtpv2_ie::PDN_TYPE, 0)), "no PDN type 5");

    let mut dual = sgw_at(SGW, "ue_pool6 = \"2001:2:0:8000::/49\"");
    let r = response(&one(&mut dual, asking(imsi(1), 2)).1);
    let prefix = [0x20, 0x01, 0, 2, 0, 0, 0x80, 0];
    assert_eq!(r.paa, Some([&[2, 64][..], &prefix, &[0; 8]].concat()));
    let v = one(&mut dual, downlink_to("198.18.128.0")).0;
    assert_eq!(
        reason(&dual, v),
        "no_session",
        "an IPv6 session carries no IPv4"
    );
    let (v, _) = one(&mut dual, downlink_to("2001:2:0:8000::99"));
    assert_eq!(v, Verdict::Forward(0), "any address of its /64");
    let v = one(&mut dual, downlink_to("2001:2:0:8001::1")).0;
    assert_eq!(reason(&dual, v), "no_session", "the next place's /64");
    let v = one(&mut dual, downlink_to("2001:2:0:7fff::1")).0;
    assert_eq!(reason(&dual, v), "not_routed");
    let up = |source: &str| uplink_from("198.18.200.1", S1U_TEIDS, source);
    assert_eq!(
        one(&mut dual, up("2001:2:0:8000::5")).0,
        Verdict::Forward(1)
    );
    for spoofed in ["2001:2:0:8001::5", "198.18.128.0"] {
        let v = one(&mut dual, up(spoofed)).0;
        assert_eq!(reason(&dual, v), "spoofed", "{spoofed}");
    }
}

/// The queue of free places is claimed from the memory budget at its largest (every
/// place of the pool, 4 bytes each): a /8 pool's 64 MiB does not fit in 32 MiB, and the
/// refusal names the pool.
#[test]
fn the_free_places_are_claimed_from_the_memory_budget() {
    let names = PortNames(vec!["a".into(), "b".into()]);
    let build = |pool: &str| {
        let text = format!("address = \"198.19.255.2\"\nue_pool = \"{pool}\"\ncapacity = 1024");
        let cfg: SgwConfig = toml::from_str(&text).unwrap();
        let budget = crate::testutil::budget(32 << 20, 1);
        let (built, claimed) =
            stateplane_mem::budget::scope(budget, || Sgw::new(&cfg, &names, "program.sgw", 1));
        (built.err().map(|e| e.to_string()), claimed.bytes)
    };
    let (ok, small) = build("198.18.128.0/17");
    assert_eq!(ok, None);
    let (ok, twice) = build("198.18.0.0/16");
    assert_eq!((ok, twice - small), (None, 4 << 15), "4 bytes more a place");
    let (refused, _) = build("198.0.0.0/8");
    let refused = refused.unwrap();
    assert!(
        refused.contains("program.sgw.ue_pool") && refused.contains("free places"),
        "{refused}"
    );
}

#[test]
fn an_ipv6_pool_must_hold_a_64_a_place() {
    let names = PortNames(vec!["a".into(), "b".into()]);
    let err = |pool6: &str| {
        let text = format!(
            "address = \"198.19.255.2\"\nue_pool = \"198.18.128.0/17\"\nue_pool6 = \"{pool6}\""
        );
        let cfg: SgwConfig = toml::from_str(&text).unwrap();
        Sgw::new(&cfg, &names, "program.sgw", 1)
            .err()
            .map(|e| e.to_string())
    };
    assert_eq!(err("2001:2:0:8000::/49"), None);
    assert_eq!(err("::/0"), None, "the whole space");
    let small = err("2001:2:0:8000::/50").unwrap();
    assert!(
        small.contains("program.sgw.ue_pool6") && small.contains("give a /49 or shorter"),
        "{small}"
    );
    let v4 = err("198.18.0.0/16").unwrap();
    assert!(v4.contains("give an IPv6 prefix"), "{v4}");
}
