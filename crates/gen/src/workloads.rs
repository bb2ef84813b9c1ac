//! The workloads: flow populations, their sizes, their interleaving in time, and the
//! frames each packet becomes.

use crate::build::{Hosts, L4, TCP_WINDOW, emit_frame, emit_ip, header_len};
use crate::kv;
use crate::rng::{Rng, Zipf};
use crate::{GenConfig, GenError, GenSummary, Workload};
use stateplane_wire::ethernet::MacAddr;
use stateplane_wire::gtp::{
    Fteid, GTPC_PORT, GTPU_PORT, GTPU_T_PDU, GtpuRepr, Gtpv2Repr, emit_gtpv2_ie, fteid_interface,
    gtpv2_ie, gtpv2_type, imsi_tbcd, pdn_type,
};
use stateplane_wire::tcp::flags;
use stateplane_wire::{FlowHasher, ParseFlags, parse};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// The router MACs on the client side and on the server side.
pub const CLIENT_SIDE_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
pub const SERVER_SIDE_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
const SERVERS: usize = 1024;
const VICTIM: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 1);
const SGW: Ipv4Addr = Ipv4Addr::new(198, 19, 255, 2);
const MME: Ipv4Addr = Ipv4Addr::new(198, 18, 255, 1);

/// One flow of the population.
#[derive(Clone, Copy)]
struct Flow {
    id: u32,
    size: u32,
    sent: u32,
    v6: bool,
    tcp: bool,
    /// TCP: end with RST instead of FIN.
    reset: bool,
    server: u16,
    server_port: u16,
    client_seq: u32,
    server_seq: u32,
    /// Bytes each side sent since the other last acknowledged: they stay within
    /// [`TCP_WINDOW`], as a TCP sender's do.
    client_unacked: u32,
    server_unacked: u32,
    vt_gap: u64,
}

fn client_ip(id: u32, v6: bool) -> IpAddr {
    // Scramble the low 16 bits (a bijection: multiply by an odd number) so neighbours in id
    // are not neighbours in address; the high bits come from the port slot.
    let low = (id & 0xffff).wrapping_mul(40_503) & 0xffff;
    if v6 {
        IpAddr::V6(Ipv6Addr::new(
            0x2001,
            0x2,
            0,
            1,
            0,
            0,
            (id >> 16) as u16,
            low as u16,
        ))
    } else {
        IpAddr::V4(Ipv4Addr::new(198, 18, (low >> 8) as u8, low as u8))
    }
}

fn client_port(id: u32, v6: bool) -> u16 {
    if v6 {
        1024 + (id % 60_000) as u16
    } else {
        1024 + ((id >> 16) % 60_000) as u16
    }
}

fn server_ip(server: u16, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(Ipv6Addr::new(0x2001, 0x2, 0, 2, 0, 0, 0, server + 1))
    } else {
        // Host numbers 1 to 254 in each /24, so no server is a network or broadcast address.
        IpAddr::V4(Ipv4Addr::new(
            198,
            19,
            (server / 254) as u8,
            (server % 254) as u8 + 1,
        ))
    }
}

/// Splits `packets` among `flows` with sizes proportional to 1/rank^s (at least 1 each),
/// in random order.
fn flow_sizes(packets: u64, flows: usize, s: f64, rng: &mut Rng) -> Vec<u32> {
    let weights: Vec<f64> = (0..flows).map(|i| 1.0 / ((i + 1) as f64).powf(s)).collect();
    let total: f64 = weights.iter().sum();
    let mut sizes: Vec<u64> = weights
        .iter()
        .map(|w| ((packets as f64 * w / total) as u64).max(1))
        .collect();
    let mut sum: u64 = sizes.iter().sum();
    // Rounding leaves a difference: the largest flows absorb it.
    let mut i = 0;
    while sum < packets {
        sizes[i % flows] += 1;
        sum += 1;
        i += 1;
    }
    i = 0;
    while sum > packets {
        if sizes[i % flows] > 1 {
            sizes[i % flows] -= 1;
            sum -= 1;
        }
        i += 1;
    }
    for j in (1..sizes.len()).rev() {
        sizes.swap(j, rng.below(j as u64 + 1) as usize);
    }
    sizes
        .into_iter()
        .map(|s| s.min(u64::from(u32::MAX)) as u32)
        .collect()
}

/// Frame sizes (as captured) of data packets, as in backbone traces: many small, many full.
fn data_size(rng: &mut Rng, downstream: bool) -> usize {
    let u = rng.unit();
    match (downstream, u) {
        (true, u) if u < 0.65 => 1514,
        (true, _) => rng.range(64, 1514) as usize,
        (false, u) if u < 0.8 => 64,
        (false, _) => rng.range(64, 1514) as usize,
    }
}

/// Everything the packet loop needs, mutable.
struct Gen<'a> {
    cfg: &'a GenConfig,
    out: &'a mut dyn FnMut(u64, &[u8]) -> io::Result<()>,
    progress: &'a mut dyn FnMut(u64),
    /// Classifies each frame for the summary with the parser the data plane uses.
    hasher: FlowHasher,
    rng: Rng,
    frame: Vec<u8>,
    scratch: Vec<u8>,
    payload: Vec<u8>,
    summary: GenSummary,
    index: u64,
    gap_ns: f64,
}

impl Gen<'_> {
    fn vlan(&self, id: u32) -> u16 {
        if self.cfg.vlans == 0 {
            0
        } else {
            1 + (id % u32::from(self.cfg.vlans)) as u16
        }
    }

    /// Frame of `target` bytes (or the configured fixed size) for these headers.
    fn frame_with_size(&mut self, hosts: &Hosts, l4: &L4, target: usize) {
        let payload_len = self.payload_len(hosts, l4, target);
        self.payload.clear();
        self.payload.resize(payload_len, 0);
        emit_frame(&mut self.frame, hosts, l4, &self.payload);
    }

    /// The payload bytes of a frame of `target` bytes (or of the configured packet size).
    fn payload_len(&self, hosts: &Hosts, l4: &L4, target: usize) -> usize {
        let target = self.cfg.packet_size.unwrap_or(target);
        target.saturating_sub(header_len(hosts, l4))
    }

    /// Hands the frame built last to the output, counts it, and reports progress now and then.
    fn emit(&mut self) -> io::Result<()> {
        let ts = self.cfg.start_ns + (self.index as f64 * self.gap_ns) as u64;
        if self.index == 0 {
            self.summary.first_ns = ts;
        }
        self.summary.last_ns = ts;
        self.index += 1;
        self.summary.packets += 1;
        self.summary.bytes += self.frame.len() as u64;
        if let Ok(p) = parse(&self.frame, 0, &self.hasher) {
            self.summary.ipv6_packets += u64::from(p.key.ip_version == 6);
            self.summary.tcp_packets += u64::from(p.flags.has(ParseFlags::TCP));
            self.summary.udp_packets += u64::from(p.flags.has(ParseFlags::UDP));
        }
        (self.out)(ts, &self.frame)?;
        if self.index.is_multiple_of(1 << 16) {
            (self.progress)(self.index);
        }
        Ok(())
    }

    /// The next packet of an internet-like flow.
    fn flow_packet(&mut self, f: &mut Flow) {
        let k = f.sent;
        let last = k + 1 == f.size;
        f.sent += 1;
        let client = client_ip(f.id, f.v6);
        let server = server_ip(f.server, f.v6);
        let cport = client_port(f.id, f.v6);
        let vlan = self.vlan(f.id);
        let up = Hosts {
            src_mac: CLIENT_SIDE_MAC,
            dst_mac: SERVER_SIDE_MAC,
            vlan,
            src: client,
            dst: server,
            ttl: 64,
        };
        let down = Hosts {
            src_mac: SERVER_SIDE_MAC,
            dst_mac: CLIENT_SIDE_MAC,
            vlan,
            src: server,
            dst: client,
            ttl: 56,
        };
        if !f.tcp {
            // UDP: requests upstream, about a third answered.
            let downstream = k > 0 && self.rng.chance(0.35);
            let (hosts, l4) = if downstream {
                (
                    down,
                    L4::Udp {
                        src_port: f.server_port,
                        dst_port: cport,
                    },
                )
            } else {
                (
                    up,
                    L4::Udp {
                        src_port: cport,
                        dst_port: f.server_port,
                    },
                )
            };
            let size = data_size(&mut self.rng, downstream);
            self.frame_with_size(&hosts, &l4, size);
            return;
        }
        // TCP: handshake, data both ways, then FIN (or RST) from the client.
        let tcp = |src_port, dst_port, seq, ack, fl| L4::Tcp {
            src_port,
            dst_port,
            seq,
            ack,
            flags: fl,
        };
        let (hosts, l4, size) = match k {
            0 => (
                up,
                tcp(cport, f.server_port, f.client_seq, 0, flags::SYN),
                64,
            ),
            1 if last && f.reset => (
                down,
                tcp(
                    f.server_port,
                    cport,
                    0,
                    f.client_seq.wrapping_add(1),
                    flags::RST | flags::ACK,
                ),
                64,
            ),
            1 => (
                down,
                tcp(
                    f.server_port,
                    cport,
                    f.server_seq,
                    f.client_seq.wrapping_add(1),
                    flags::SYN | flags::ACK,
                ),
                64,
            ),
            _ if last => {
                let fl = if f.reset {
                    flags::RST | flags::ACK
                } else {
                    flags::FIN | flags::ACK
                };
                (
                    up,
                    tcp(
                        cport,
                        f.server_port,
                        f.client_seq.wrapping_add(1),
                        f.server_seq.wrapping_add(1),
                        fl,
                    ),
                    64,
                )
            }
            2 => (
                up,
                tcp(
                    cport,
                    f.server_port,
                    f.client_seq.wrapping_add(1),
                    f.server_seq.wrapping_add(1),
                    flags::ACK,
                ),
                64,
            ),
            _ => {
                let mut downstream = self.rng.chance(0.7);
                // A side whose window is nearly full waits for the other's
                // acknowledgement: the other side sends next.
                let full = |unacked: u32| unacked + 1_500 > u32::from(TCP_WINDOW);
                if full(if downstream {
                    f.server_unacked
                } else {
                    f.client_unacked
                }) {
                    downstream = !downstream;
                }
                let size = data_size(&mut self.rng, downstream);
                // Each side's sequence numbers move on by the bytes it sent, so that
                // acknowledgements and windows hold as a stateful firewall checks them.
                if downstream {
                    let seq = f.server_seq.wrapping_add(1);
                    let ack = f.client_seq.wrapping_add(1);
                    let l4 = tcp(f.server_port, cport, seq, ack, flags::ACK | flags::PSH);
                    let sent = self.payload_len(&down, &l4, size) as u32;
                    f.server_seq = f.server_seq.wrapping_add(sent);
                    f.server_unacked += sent;
                    f.client_unacked = 0;
                    (down, l4, size)
                } else {
                    let seq = f.client_seq.wrapping_add(1);
                    let ack = f.server_seq.wrapping_add(1);
                    let l4 = tcp(cport, f.server_port, seq, ack, flags::ACK | flags::PSH);
                    let sent = self.payload_len(&up, &l4, size) as u32;
                    f.client_seq = f.client_seq.wrapping_add(sent);
                    f.client_unacked += sent;
                    f.server_unacked = 0;
                    (up, l4, size)
                }
            }
        };
        self.frame_with_size(&hosts, &l4, size);
    }

    /// One spoofed attack packet to the victim.
    fn attack_packet(&mut self, syn: bool) {
        let src = IpAddr::V4(Ipv4Addr::from(
            0xc612_0000u32 | self.rng.below(1 << 16) as u32,
        ));
        let hosts = Hosts {
            src_mac: CLIENT_SIDE_MAC,
            dst_mac: SERVER_SIDE_MAC,
            vlan: self.vlan(0),
            src,
            dst: IpAddr::V4(VICTIM),
            ttl: 64,
        };
        let sport = self.rng.range(1024, 65535) as u16;
        let (l4, size) = if syn {
            (
                L4::Tcp {
                    src_port: sport,
                    dst_port: 80,
                    seq: self.rng.next_u64() as u32,
                    ack: 0,
                    flags: flags::SYN,
                },
                64,
            )
        } else {
            (
                L4::Udp {
                    src_port: sport,
                    dst_port: self.rng.range(1, 65535) as u16,
                },
                if self.rng.chance(0.5) { 64 } else { 512 },
            )
        };
        self.frame_with_size(&hosts, &l4, size);
        self.summary.special_packets += 1;
    }
}

fn new_flow(id: u32, size: u32, cfg: &GenConfig, rng: &mut Rng, servers: &Zipf) -> Flow {
    let tcp = rng.chance(0.8);
    let server_port = if tcp {
        match rng.unit() {
            u if u < 0.6 => 443,
            u if u < 0.9 => 80,
            _ => rng.range(1, 65535) as u16,
        }
    } else {
        match rng.unit() {
            u if u < 0.5 => 53,
            u if u < 0.8 => 443,
            _ => rng.range(1, 65535) as u16,
        }
    };
    Flow {
        id,
        size,
        sent: 0,
        v6: rng.chance(cfg.ipv6_share),
        tcp,
        reset: rng.chance(0.1),
        server: servers.sample(rng) as u16,
        server_port,
        client_seq: rng.next_u64() as u32,
        server_seq: rng.next_u64() as u32,
        client_unacked: 0,
        server_unacked: 0,
        vt_gap: 0,
    }
}

/// Virtual time runs over [0, 2^40); flows start uniformly and spread their packets over a
/// random part of what is left, so short flows come and go while elephants stay.
const VT_END: u64 = 1 << 40;

/// A population of flows interleaved in virtual time.
struct Schedule {
    flows: Vec<Flow>,
    heap: BinaryHeap<Reverse<(u64, u32)>>,
}

impl Schedule {
    fn new(packets: u64, flows: usize, zipf: f64, cfg: &GenConfig, rng: &mut Rng) -> Self {
        let sizes = flow_sizes(packets, flows, zipf, rng);
        let servers = Zipf::new(SERVERS, 1.0);
        let mut heap = BinaryHeap::with_capacity(flows);
        let flows: Vec<Flow> = sizes
            .iter()
            .enumerate()
            .map(|(i, &size)| {
                let mut f = new_flow(i as u32, size, cfg, rng, &servers);
                let start = rng.below(VT_END);
                let span = ((VT_END - start) as f64 * (0.05 + 0.95 * rng.unit())) as u64;
                f.vt_gap = (span / u64::from(size.max(1))).max(1);
                heap.push(Reverse((start, i as u32)));
                f
            })
            .collect();
        Schedule { flows, heap }
    }

    /// The flow whose next packet comes first, rescheduled for the one after.
    fn next(&mut self) -> Option<usize> {
        let Reverse((vt, i)) = self.heap.pop()?;
        let f = &self.flows[i as usize];
        if f.sent + 1 < f.size {
            self.heap.push(Reverse((vt + f.vt_gap, i)));
        }
        Some(i as usize)
    }
}

/// Generates the configured trace, handing each frame and its timestamp to `out`, and
/// calling `progress` with the packet count now and then.
pub fn generate(
    cfg: &GenConfig,
    mut out: impl FnMut(u64, &[u8]) -> io::Result<()>,
    mut progress: impl FnMut(u64),
) -> Result<GenSummary, GenGenerateError> {
    cfg.validate()?;
    let mut g = Gen {
        cfg,
        out: &mut out,
        progress: &mut progress,
        hasher: FlowHasher::with_seed(0),
        rng: Rng::new(cfg.seed),
        frame: Vec::with_capacity(9100),
        scratch: Vec::with_capacity(9100),
        payload: Vec::with_capacity(9100),
        summary: GenSummary::default(),
        index: 0,
        gap_ns: cfg.gap_ns(),
    };
    match cfg.workload {
        Workload::Internet | Workload::Datacenter | Workload::Synflood | Workload::Udpflood => {
            let attack = match cfg.workload {
                Workload::Synflood | Workload::Udpflood => {
                    (cfg.packets as f64 * cfg.attack_share).round() as u64
                }
                _ => 0,
            };
            let background = cfg.packets - attack;
            let (default_flows, default_zipf) = match cfg.workload {
                Workload::Datacenter => (background / 2000, 0.6),
                _ => (background / 20, 1.0),
            };
            let flows = cfg
                .flows
                .unwrap_or(default_flows)
                .clamp(1, background.max(1)) as usize;
            let mut schedule = (background > 0).then(|| {
                Schedule::new(
                    background,
                    flows,
                    cfg.zipf.unwrap_or(default_zipf),
                    cfg,
                    &mut g.rng,
                )
            });
            g.summary.flows = if background > 0 { flows as u64 } else { 0 };
            let (mut attack_left, mut background_left) = (attack, background);
            while attack_left + background_left > 0 {
                // Attack packets spread at random, with exact totals.
                let pick_attack = g.rng.below(attack_left + background_left) < attack_left;
                if pick_attack {
                    g.attack_packet(cfg.workload == Workload::Synflood);
                    attack_left -= 1;
                } else if let Some(s) = schedule.as_mut()
                    && let Some(i) = s.next()
                {
                    let mut f = s.flows[i];
                    g.flow_packet(&mut f);
                    s.flows[i] = f;
                    background_left -= 1;
                } else {
                    break;
                }
                g.emit()?;
            }
        }
        Workload::Kv => kv_workload(&mut g)?,
        Workload::Gtp => gtp_workload(&mut g)?,
    }
    (g.progress)(g.index);
    Ok(g.summary)
}

fn kv_workload(g: &mut Gen) -> io::Result<()> {
    let cfg = g.cfg;
    let clients = cfg.flows.unwrap_or(1000).max(1);
    g.summary.flows = clients;
    let keys = Zipf::new(
        cfg.kv_keys.min(10_000_000) as usize,
        cfg.zipf.unwrap_or(0.99),
    );
    let server = IpAddr::V4(crate::KV_SERVER);
    let value = [0x5au8; 16];
    for request_id in 0..cfg.packets {
        let client = g.rng.below(clients) as u32;
        let v6 = (f64::from(client) / clients as f64) < cfg.ipv6_share;
        let server = if v6 { server_ip(99, true) } else { server };
        let hosts = Hosts {
            src_mac: CLIENT_SIDE_MAC,
            dst_mac: SERVER_SIDE_MAC,
            vlan: g.vlan(client),
            src: client_ip(client, v6),
            dst: server,
            ttl: 64,
        };
        let get = g.rng.chance(cfg.kv_get_share);
        let key = keys.sample(&mut g.rng) as u64;
        let msg = kv::Message {
            op: if get { kv::Op::Get } else { kv::Op::Put },
            request_id: request_id as u32,
            key,
            value: if get { &[] } else { &value },
        };
        msg.emit(&mut g.scratch);
        let l4 = L4::Udp {
            src_port: client_port(client, v6),
            dst_port: kv::PORT,
        };
        if let Some(size) = cfg.packet_size {
            let padded = size
                .saturating_sub(header_len(&hosts, &l4))
                .max(g.scratch.len());
            g.scratch.resize(padded, 0);
        }
        emit_frame(&mut g.frame, &hosts, &l4, &g.scratch);
        g.emit()?;
    }
    Ok(())
}

fn gtp_workload(g: &mut Gen) -> io::Result<()> {
    let cfg = g.cfg;
    let users = cfg.flows.unwrap_or(cfg.packets / 100).clamp(1, cfg.packets) as usize;
    g.summary.flows = users as u64;
    let mut schedule = Schedule::new(cfg.packets, users, cfg.zipf.unwrap_or(0.8), cfg, &mut g.rng);
    // Every user's first packet is its Create Session Request; further signaling (Modify
    // Bearer, as on a handover) brings the total to one message per 18 packets.
    let extra = (cfg.packets / 18).saturating_sub(users as u64) as f64;
    let p_signal = extra / (cfg.packets - users as u64).max(1) as f64;
    let mut sequence = 0u32;
    // Subscribers are numbered as they first appear (each with its Create Session
    // Request), so that the k-th is the one a gateway handing out places in order gives
    // the k-th place: its TEIDs and address below.
    let mut numbers = vec![u32::MAX; users];
    let mut subscribers = 0u32;
    while let Some(i) = schedule.next() {
        let mut f = schedule.flows[i];
        let first = f.sent == 0;
        if first {
            numbers[i] = subscribers;
            subscribers += 1;
        }
        let user = numbers[i];
        f.sent += 1;
        let enb = Ipv4Addr::new(198, 18, 200, (user % 50) as u8 + 1);
        // A share of the subscribers ask for IPv4v6 and move IPv6 (from ::1 in the /64 at
        // their place of 2001:2:0:8000::/49), the rest IPv4 (their place's address in
        // 198.18.128.0/17).
        let v6 = (f64::from(user) / users as f64) < cfg.ipv6_share;
        let ue = if v6 {
            IpAddr::V6(Ipv6Addr::new(
                0x2001,
                2,
                0,
                0x8000 | (user & 0x7fff) as u16,
                0,
                0,
                0,
                1,
            ))
        } else {
            IpAddr::V4(Ipv4Addr::new(
                198,
                18,
                128 + ((user >> 8) & 0x7f) as u8,
                user as u8,
            ))
        };
        if first || g.rng.chance(p_signal) {
            sequence = sequence.wrapping_add(1);
            signaling(g, user, first, v6, enb, sequence);
            g.summary.special_packets += 1;
        } else if g.rng.chance(0.5) {
            // Uplink: the user's packet inside GTP-U from the eNodeB to the gateway.
            let inner = Hosts {
                src_mac: CLIENT_SIDE_MAC,
                dst_mac: SERVER_SIDE_MAC,
                vlan: 0,
                src: ue,
                dst: server_ip(f.server, v6),
                ttl: 64,
            };
            let l4 = L4::Udp {
                src_port: 40_000 + (user % 20_000) as u16,
                dst_port: f.server_port,
            };
            // The outer frame gets the drawn size: Ethernet, IPv4, UDP and GTP-U (50 bytes)
            // around the inner IP and UDP headers.
            let size = g
                .cfg
                .packet_size
                .unwrap_or_else(|| data_size(&mut g.rng, false));
            let payload_len = size.saturating_sub(50 + header_len(&inner, &l4) - 14);
            g.payload.clear();
            g.payload.resize(payload_len, 0);
            g.scratch.clear();
            g.scratch
                .resize(header_len(&inner, &l4) - 14 + payload_len + 8, 0);
            let inner_len = emit_ip(&mut g.scratch[8..], &inner, &l4, &g.payload);
            let gtp = GtpuRepr {
                message_type: GTPU_T_PDU,
                teid: 0x2000_0000 | user,
                sequence: None,
                payload_len: inner_len as u16,
            };
            let _ = gtp.emit(&mut g.scratch);
            g.scratch.truncate(8 + inner_len);
            to_gateway(g, user, enb, GTPU_PORT);
        } else {
            // Downlink: a plain packet towards the user, which the gateway will encapsulate.
            let hosts = Hosts {
                src_mac: SERVER_SIDE_MAC,
                dst_mac: CLIENT_SIDE_MAC,
                vlan: g.vlan(user),
                src: server_ip(f.server, v6),
                dst: ue,
                ttl: 56,
            };
            let l4 = L4::Udp {
                src_port: f.server_port,
                dst_port: 40_000 + (user % 20_000) as u16,
            };
            let size = data_size(&mut g.rng, true);
            g.frame_with_size(&hosts, &l4, size);
        }
        schedule.flows[i] = f;
        g.emit()?;
    }
    Ok(())
}

/// The generator's IMSIs: MCC 001, MNC 01 (a test network), and subscriber `n`'s is
/// `IMSI_BASE + n`, a multiple of 2^32 plus `n`: its number modulo a pool of up to 2^24
/// places, the place a gateway whose sessions are replicated gives it; and modulo 2^32,
/// what live ports steering by subscriber spread Create Session Requests by, so that on
/// `w` workers subscriber `n` meets worker `n % w` and is given place `n` there, as on
/// one worker (the places of worker `k` are `k`, `k + w`, ...): a generated trace replays
/// through a gateway of any number of workers.
pub const IMSI_BASE: u64 = 1_010_000_000_000u64.div_ceil(1 << 32) * (1 << 32);

/// The TEID the MME's end of subscriber `n`'s signaling takes.
pub fn mme_teid(n: u32) -> u32 {
    0x4000_0000 | n
}

/// The TEID subscriber `n`'s eNodeB takes for its downlink.
pub fn enb_teid(n: u32) -> u32 {
    0x3000_0000 | n
}

/// A GTPv2-C Create Session Request (first) or Modify Bearer Request from the MME, laid
/// out as TS 29.274 has them: a Create carries the IMSI, the MME's S11 F-TEID (the
/// Sender F-TEID for Control Plane) and the PDN type (IPv4v6 for a subscriber of IPv6),
/// and both a bearer context with the bearer's id and
/// the eNodeB's S1-U F-TEID (where downlink goes). A Create is sent to TEID 0, a Modify
/// to the gateway's S11 TEID, which carries the subscriber's place.
fn signaling(g: &mut Gen, user: u32, create: bool, v6: bool, enb: Ipv4Addr, sequence: u32) {
    let mut ies = [0u8; 96];
    let mut at = 0;
    let fteid = |interface: u8, teid: u32, address: Ipv4Addr| {
        let mut f = [0u8; 9];
        let end = Fteid {
            interface,
            teid,
            v4: Some(address.octets()),
            v6: None,
        };
        let _ = end.emit(&mut f);
        f
    };
    if create {
        let imsi = imsi_tbcd(IMSI_BASE + u64::from(user));
        at += emit_gtpv2_ie(&mut ies[at..], gtpv2_ie::IMSI, 0, &imsi).unwrap_or(0);
        let mme = fteid(fteid_interface::S11_MME, mme_teid(user), MME);
        at += emit_gtpv2_ie(&mut ies[at..], gtpv2_ie::F_TEID, 0, &mme).unwrap_or(0);
        let pdn = if v6 { pdn_type::IPV4V6 } else { pdn_type::IPV4 };
        at += emit_gtpv2_ie(&mut ies[at..], gtpv2_ie::PDN_TYPE, 0, &[pdn]).unwrap_or(0);
    }
    let mut bearer = [0u8; 32];
    let mut b = emit_gtpv2_ie(&mut bearer, gtpv2_ie::EBI, 0, &[5]).unwrap_or(0);
    let s1u = fteid(fteid_interface::S1U_ENODEB, enb_teid(user), enb);
    b += emit_gtpv2_ie(&mut bearer[b..], gtpv2_ie::F_TEID, 0, &s1u).unwrap_or(0);
    at += emit_gtpv2_ie(&mut ies[at..], gtpv2_ie::BEARER_CONTEXT, 0, &bearer[..b]).unwrap_or(0);
    let header = Gtpv2Repr {
        message_type: if create {
            gtpv2_type::CREATE_SESSION_REQUEST
        } else {
            gtpv2_type::MODIFY_BEARER_REQUEST
        },
        teid: Some(if create { 0 } else { 0x1000_0000 | user }),
        sequence,
        payload_len: at as u16,
    };
    g.scratch.clear();
    g.scratch.resize(header.header_len() + at, 0);
    let _ = header.emit(&mut g.scratch);
    let h = header.header_len();
    g.scratch[h..].copy_from_slice(&ies[..at]);
    to_gateway(g, user, MME, GTPC_PORT);
}

/// Frames `g.scratch` (a GTP message) as UDP from `src` to the gateway, port to port.
fn to_gateway(g: &mut Gen, user: u32, src: Ipv4Addr, port: u16) {
    let hosts = Hosts {
        src_mac: CLIENT_SIDE_MAC,
        dst_mac: SERVER_SIDE_MAC,
        vlan: g.vlan(user),
        src: IpAddr::V4(src),
        dst: IpAddr::V4(SGW),
        ttl: 64,
    };
    let l4 = L4::Udp {
        src_port: port,
        dst_port: port,
    };
    emit_frame(&mut g.frame, &hosts, &l4, &g.scratch);
}

/// Why generation stopped: a bad configuration, or the output failed.
#[derive(Debug)]
pub enum GenGenerateError {
    Config(GenError),
    Io(io::Error),
}

impl std::fmt::Display for GenGenerateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GenGenerateError::Config(e) => write!(f, "{e}"),
            GenGenerateError::Io(e) => write!(f, "writing the trace: {e}"),
        }
    }
}

impl std::error::Error for GenGenerateError {}

impl From<GenError> for GenGenerateError {
    fn from(e: GenError) -> Self {
        GenGenerateError::Config(e)
    }
}

impl From<io::Error> for GenGenerateError {
    fn from(e: io::Error) -> Self {
        GenGenerateError::Io(e)
    }
}
