//! The classic BPF program a `PACKET_FANOUT_CBPF` group runs to pick each received
//! packet's worker by the remote endpoint's address or by a gateway's subscriber
//! ([`Steering`]); the kernel takes its result modulo the group's members.
//!
//! By subscriber, the program reads what [`Steering::Subscriber`] says: a GTP packet's
//! TEID, a Create Session Request's IMSI (its digits as a number, in 32-bit arithmetic),
//! another packet's destination. By remote
//! endpoint, the remote address is the source or the destination (IPv6: its last 32 bits), or for an
//! ICMP error the other end's address in the packet it quotes, so that a connection's two
//! directions and the errors about it reach one worker. Other frames (ARP, VLAN-tagged
//! frames the kernel did not untag, truncated ones) all go to worker 0. Loads are relative
//! to the network header (`SKF_NET_OFF`), wherever the kernel has the packet's data start.
//! It must never read past what it checked: a load out of the packet ends the program
//! with 0, which is a worker too.

use stateplane_runtime::Steering;

/// `SKF_AD_OFF + SKF_AD_PROTOCOL`: the packet's EtherType, in host order.
const PROTOCOL: u32 = (-0x1000i32) as u32;
/// `SKF_NET_OFF`: loads from here on are relative to the network header.
const NET: u32 = (-0x10_0000i32) as u32;

const LD_IMM: u16 = 0x00;
const LD_MEM: u16 = 0x60;
const ST: u16 = 0x02;
const MUL_K: u16 = 0x24;
const LD_W_ABS: u16 = 0x20;
const LD_H_ABS: u16 = 0x28;
const LD_B_ABS: u16 = 0x30;
const LD_W_IND: u16 = 0x40;
const LD_H_IND: u16 = 0x48;
const LD_B_IND: u16 = 0x50;
const ADD_X: u16 = 0x0c;
const SUB_K: u16 = 0x14;
const AND_K: u16 = 0x54;
const LSH_K: u16 = 0x64;
const RSH_K: u16 = 0x74;
const XOR_X: u16 = 0xac;
const TAX: u16 = 0x07;
const JA: u16 = 0x05;
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;
const RET_K: u16 = 0x06;
const RET_A: u16 = 0x16;

/// Where the remote address lies, from the network header: in IPv4 (the quoted one past
/// the ICMP error's IP header, whose length is in X), in IPv6 (its last 32 bits; the
/// quoted one past a 40-byte header and the 8 bytes of ICMPv6).
struct Offsets {
    v4: u32,
    v4_quoted: u32,
    v6: u32,
    v6_quoted: u32,
}

fn offsets(steering: Steering) -> Option<Offsets> {
    // IPv4 source at 12, destination at 16; IPv6 last words at 20 and 36; an error's quote
    // starts 8 bytes past its IP header.
    match steering {
        Steering::Flow | Steering::Subscriber { .. } => None,
        Steering::RemoteIsSource => Some(Offsets {
            v4: 12,
            v4_quoted: 8 + 16,
            v6: 20,
            v6_quoted: 48 + 36,
        }),
        Steering::RemoteIsDestination => Some(Offsets {
            v4: 16,
            v4_quoted: 8 + 12,
            v6: 36,
            v6_quoted: 48 + 20,
        }),
    }
}

/// One instruction, jumps by label.
#[derive(Clone, Copy)]
enum Op {
    Do(u16, u32),
    Jump(u16, u32, &'static str, &'static str),
    Label(&'static str),
}

use Op::{Do, Jump, Label};

/// The program for `steering`, or `None` for [`Steering::Flow`] (the kernel's hash).
pub fn program(steering: Steering) -> Option<Vec<libc::sock_filter>> {
    if let Steering::Subscriber {
        gateway,
        pool,
        pool6,
    } = steering
    {
        return Some(subscriber(gateway, pool, pool6));
    }
    let at = offsets(steering)?;
    let ops = [
        &BY_FAMILY[..],
        &[
            Label("v4"),
            Do(LD_B_ABS, NET.wrapping_add(9)),
            Jump(JEQ_K, 1, "icmp4", "plain4"),
            Label("icmp4"),
        ],
        // The ICMP type follows the IPv4 header.
        &IPV4_HEADER_LENGTH_TO_X,
        &[
            Do(LD_B_IND, NET),
            // Destination unreachable, time exceeded, parameter problem.
            Jump(JEQ_K, 3, "error4", "not_3"),
            Label("not_3"),
            Jump(JEQ_K, 11, "error4", "not_11"),
            Label("not_11"),
            Jump(JEQ_K, 12, "error4", "plain4"),
            Label("error4"),
            Do(LD_W_IND, NET.wrapping_add(at.v4_quoted)),
            Jump(JA, 0, "fold", "fold"),
            Label("plain4"),
            Do(LD_W_ABS, NET.wrapping_add(at.v4)),
            Jump(JA, 0, "fold", "fold"),
            Label("v6"),
            Do(LD_B_ABS, NET.wrapping_add(6)),
            Jump(JEQ_K, 58, "icmp6", "plain6"),
            Label("icmp6"),
            // ICMPv6 types below 128 are errors.
            Do(LD_B_ABS, NET.wrapping_add(40)),
            Jump(JGE_K, 128, "plain6", "error6"),
            Label("error6"),
            Do(LD_W_ABS, NET.wrapping_add(at.v6_quoted)),
            Jump(JA, 0, "fold", "fold"),
            Label("plain6"),
            Do(LD_W_ABS, NET.wrapping_add(at.v6)),
            Label("fold"),
            // A ^= A >> 16: every byte of the address counts in the low bits.
            Do(TAX, 0),
            Do(RSH_K, 16),
            Do(XOR_X, 0),
            Do(RET_A, 0),
            Label("other"),
            Do(RET_K, 0),
        ],
    ]
    .concat();
    Some(assemble(&ops))
}

/// Goes to `v4`, `v6` or `other` by the EtherType.
const BY_FAMILY: [Op; 4] = [
    Do(LD_H_ABS, PROTOCOL),
    Jump(JEQ_K, 0x0800, "v4", "not_v4"),
    Label("not_v4"),
    Jump(JEQ_K, 0x86dd, "v6", "other"),
];

/// X = the IPv4 header's length.
const IPV4_HEADER_LENGTH_TO_X: [Op; 4] =
    [Do(LD_B_ABS, NET), Do(AND_K, 0x0f), Do(LSH_K, 2), Do(TAX, 0)];

/// [`Steering::Subscriber`]'s program.
fn subscriber(gateway: u32, pool: u32, pool6: u32) -> Vec<libc::sock_filter> {
    use stateplane_runtime::PLACE_MASK;
    // From the UDP header, X its offset: the destination port at 2, GTP's flags at 8,
    // its TEID at 12; GTPv2-C's first element's type at 20, length at 21, value at 24.
    let mut ops = [
        &BY_FAMILY[..],
        &[
            Label("v4"),
            Do(LD_W_ABS, NET.wrapping_add(16)),
            Jump(JEQ_K, gateway, "to_gateway", "pool4"),
            Label("pool4"),
            Do(SUB_K, pool),
            Do(RET_A, 0),
            Label("to_gateway"),
            Do(LD_B_ABS, NET.wrapping_add(9)),
            Jump(JEQ_K, 17, "udp", "other"),
            Label("udp"),
        ],
        &IPV4_HEADER_LENGTH_TO_X,
        &[
            Do(LD_H_IND, NET.wrapping_add(2)),
            Jump(JEQ_K, 2152, "teid", "not_gtpu"),
            Label("not_gtpu"),
            Jump(JEQ_K, 2123, "gtpc", "other"),
            Label("gtpc"),
            // GTPv2-C's T flag: a header without a TEID (an echo) is nobody's.
            Do(LD_B_IND, NET.wrapping_add(8)),
            Do(AND_K, 0x08),
            Jump(JEQ_K, 0, "other", "gtpc_teid"),
            Label("gtpc_teid"),
            Do(LD_W_IND, NET.wrapping_add(12)),
            Jump(JEQ_K, 0, "imsi", "place"),
            Label("teid"),
            Do(LD_W_IND, NET.wrapping_add(12)),
            Label("place"),
            Do(AND_K, PLACE_MASK),
            Do(RET_A, 0),
            Label("v6"),
            // The destination's second 32 bits: a /64 of the pool is a place.
            Do(LD_W_ABS, NET.wrapping_add(28)),
            Do(SUB_K, pool6),
            Do(RET_A, 0),
            Label("other"),
            Do(RET_K, 0),
            // Last, as its jumps reach no further than 255 instructions.
            Label("imsi"),
            Do(LD_B_IND, NET.wrapping_add(20)),
            Jump(JEQ_K, 1, "imsi_length", "not_imsi"),
            Label("imsi_length"),
            Do(LD_H_IND, NET.wrapping_add(21)),
            Jump(JEQ_K, 8, NEXT, "not_imsi"),
        ],
    ]
    .concat();
    ops.extend(imsi_value());
    ops.extend([Label("not_imsi"), Do(RET_K, 0)]);
    assemble(&ops)
}

/// Returns the IMSI whose 8 bytes of TBCD digits start 24 past X (a GTPv2-C element's
/// value) as a number modulo 2^32 (the program's arithmetic is 32 bits), filler nibbles
/// (0xf) skipped; the bytes in scratch words 0 and 2, the number in word 1.
fn imsi_value() -> Vec<Op> {
    // Each byte's low nibble is the earlier digit; in a big-endian word of 4 bytes, the
    // digits lie at these shifts.
    const SHIFTS: [u32; 8] = [24, 28, 16, 20, 8, 12, 0, 4];
    const SKIPS: [&str; 16] = [
        "n0", "n1", "n2", "n3", "n4", "n5", "n6", "n7", "n8", "n9", "n10", "n11", "n12", "n13",
        "n14", "n15",
    ];
    // Both words read first: the digits pass through X.
    let mut ops = vec![
        Do(LD_W_IND, NET.wrapping_add(24)),
        Do(ST, 0),
        Do(LD_W_IND, NET.wrapping_add(28)),
        Do(ST, 2),
        Do(LD_IMM, 0),
        Do(ST, 1),
    ];
    for (word, slot) in [0u32, 2].into_iter().enumerate() {
        for (i, shift) in SHIFTS.into_iter().enumerate() {
            let skip = SKIPS[word * 8 + i];
            ops.extend([
                Do(LD_MEM, slot),
                Do(RSH_K, shift),
                Do(AND_K, 0x0f),
                Jump(JEQ_K, 0x0f, skip, NEXT),
                Do(TAX, 0),
                Do(LD_MEM, 1),
                Do(MUL_K, 10),
                Do(ADD_X, 0),
                Do(ST, 1),
                Label(skip),
            ]);
        }
    }
    ops.extend([Do(LD_MEM, 1), Do(RET_A, 0)]);
    ops
}

/// A jump's target that is the next instruction.
const NEXT: &str = "";

/// Lays the instructions out, each jump's targets resolved to offsets forward.
fn assemble(ops: &[Op]) -> Vec<libc::sock_filter> {
    let mut index = std::collections::HashMap::new();
    // (The programs are built from constants: a label missing or out of reach is this
    // module's bug, found by its tests.)
    let mut n = 0usize;
    for op in ops {
        match op {
            Label(name) => {
                index.insert(*name, n);
            }
            _ => n += 1,
        }
    }
    let mut out = Vec::with_capacity(n);
    for op in ops {
        let here = out.len();
        // Labels only lie ahead, within 255 instructions (each program is laid out so).
        let ahead = |label: &str| {
            let by = if label == NEXT {
                0
            } else {
                index[label] - here - 1
            };
            assert!(by <= 255, "a jump to {label} past 255 instructions");
            by as u8
        };
        match *op {
            Do(code, k) => out.push(insn(code, 0, 0, k)),
            Jump(JA, _, to, _) => out.push(insn(JA, 0, 0, u32::from(ahead(to)))),
            Jump(code, k, yes, no) => out.push(insn(code, ahead(yes), ahead(no), k)),
            Label(_) => {}
        }
    }
    out
}

fn insn(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// Runs a classic BPF program of this module on an untagged Ethernet frame as the kernel
/// does for the ops used here: `NET` loads from the IP header, `PROTOCOL` the EtherType;
/// a load out of the packet ends the program with 0. For the tests here, the live fanout
/// test (which checks the kernel agrees) and the tests of programs that ask for a
/// steering (which check their packets reach the worker holding their state).
pub fn run(program: &[libc::sock_filter], frame: &[u8]) -> u32 {
    let Some(&[hi, lo]) = frame.get(12..14) else {
        return 0;
    };
    run_at(program, frame, 14, u16::from_be_bytes([hi, lo]))
}

/// As [`run`], on a frame whose network header starts at `net` and is of `ethertype`
/// (where a VLAN tag lies between, the kernel takes the tag off before the program runs).
pub fn run_at(program: &[libc::sock_filter], frame: &[u8], net: usize, ethertype: u16) -> u32 {
    let ethertype = u32::from(ethertype);
    let load = |at: u32, size: usize| -> Option<u32> {
        let at = net.checked_add(at.wrapping_sub(NET) as usize)?;
        let bytes = frame.get(at..at + size)?;
        Some(bytes.iter().fold(0, |a, b| a << 8 | u32::from(*b)))
    };
    let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
    let mut memory = [0u32; 16];
    loop {
        // Past the end (no program here ends so): as a load out of the packet.
        let Some(&i) = program.get(pc) else { return 0 };
        pc += 1;
        let loaded = match i.code {
            LD_IMM => Some(i.k),
            LD_MEM => Some(memory[i.k as usize % 16]),
            LD_W_ABS => load(i.k, 4),
            LD_H_ABS if i.k == PROTOCOL => Some(ethertype),
            LD_B_ABS => load(i.k, 1),
            LD_W_IND => load(x.wrapping_add(i.k), 4),
            LD_H_IND => load(x.wrapping_add(i.k), 2),
            LD_B_IND => load(x.wrapping_add(i.k), 1),
            _ => Some(a),
        };
        let Some(loaded) = loaded else { return 0 };
        a = loaded;
        match i.code {
            AND_K => a &= i.k,
            ADD_X => a = a.wrapping_add(x),
            MUL_K => a = a.wrapping_mul(i.k),
            ST => memory[i.k as usize % 16] = a,
            SUB_K => a = a.wrapping_sub(i.k),
            LSH_K => a <<= i.k,
            RSH_K => a >>= i.k,
            XOR_X => a ^= x,
            TAX => x = a,
            JA => pc += i.k as usize,
            JEQ_K | JGE_K => {
                let taken = if i.code == JEQ_K { a == i.k } else { a >= i.k };
                pc += usize::from(if taken { i.jt } else { i.jf });
            }
            RET_A => return a,
            RET_K => return i.k,
            _ => {}
        }
    }
}

/// Frames to run the programs on, for this module's tests and the live fanout test.
#[cfg(test)]
pub(super) mod testing {
    /// An Ethernet frame of IPv4 `proto` from `src` to `dst` with this transport data.
    pub fn v4(src: [u8; 4], dst: [u8; 4], proto: u8, transport: &[u8]) -> Vec<u8> {
        let mut f = MAC.to_vec();
        f.extend([0x08, 0x00, 0x45, 0, 0, 0, 0, 0, 0, 0, 64, proto, 0, 0]);
        f.extend(src);
        f.extend(dst);
        f.extend(transport);
        f
    }

    pub fn v6(src: [u8; 16], dst: [u8; 16], next: u8, transport: &[u8]) -> Vec<u8> {
        let mut f = MAC.to_vec();
        f.extend([0x86, 0xdd, 0x60, 0, 0, 0, 0, 0, next, 64]);
        f.extend(src);
        f.extend(dst);
        f.extend(transport);
        f
    }

    /// An ICMP(v6) error of `kind` about `original` (a frame), quoting its IP header and 8
    /// bytes, from `src` to `dst`.
    pub fn error(original: &[u8], kind: u8, src: &[u8], dst: &[u8]) -> Vec<u8> {
        let quote = &original[14..];
        let quote = &quote[..quote.len().min(if src.len() == 4 { 28 } else { 48 })];
        let mut icmp = vec![kind, 0, 0, 0, 0, 0, 0, 0];
        icmp.extend(quote);
        match (src.try_into(), dst.try_into()) {
            (Ok(s), Ok(d)) => v4(s, d, 1, &icmp),
            _ => v6(src.try_into().unwrap(), dst.try_into().unwrap(), 58, &icmp),
        }
    }

    pub const UDP: [u8; 8] = [0x9c, 0x40, 0, 53, 0, 8, 0, 0];

    /// A UDP header to `dst_port` and `payload`.
    pub fn udp(dst_port: u16, payload: &[u8]) -> Vec<u8> {
        let mut t = vec![0x08, 0x68];
        t.extend(dst_port.to_be_bytes());
        t.extend((8 + payload.len() as u16).to_be_bytes());
        t.extend([0, 0]);
        t.extend(payload);
        t
    }

    /// UDP carrying a GTP-U T-PDU with `teid` (20 bytes of packet inside).
    pub fn gtpu(teid: u32) -> Vec<u8> {
        let mut g = vec![0x30, 0xff, 0, 20];
        g.extend(teid.to_be_bytes());
        g.extend([0x45; 20]);
        udp(2152, &g)
    }

    /// UDP carrying GTPv2-C: flags (version 2, the T flag as asked), a Create Session
    /// Request's type, length, the TEID if `t`, a sequence number, then `ies`.
    pub fn gtpc(t: bool, teid: u32, ies: &[u8]) -> Vec<u8> {
        let mut g = vec![if t { 0x48 } else { 0x40 }, 32, 0, 0];
        if t {
            g.extend(teid.to_be_bytes());
        }
        g.extend([0, 0, 1, 0]);
        g.extend(ies);
        udp(2123, &g)
    }

    /// An IMSI element (type 1, 8 bytes of TBCD digits) of the 15-digit `value`.
    pub fn imsi(value: u64) -> Vec<u8> {
        let mut ie = vec![1u8, 0, 8, 0];
        ie.extend(stateplane_wire::gtp::imsi_tbcd(value));
        ie
    }
    pub const MAC: [u8; 12] = [2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    /// By subscriber: GTP-U and GTPv2-C to the gateway by the place in their TEID, a
    /// Create Session Request by its IMSI's last 4 bytes, downlink by the destination's
    /// place in the pools; echoes, other GTP-C, and what cannot be read go to worker 0.
    #[test]
    fn a_subscriber_s_tunnels_signaling_and_addresses_name_its_place() {
        let (gateway, enb, pool) = ([198, 18, 0, 1], [198, 18, 1, 1], [198, 19, 0, 0]);
        let steering = Steering::Subscriber {
            gateway: u32::from_be_bytes(gateway),
            pool: u32::from_be_bytes(pool),
            pool6: 0x8000_0000,
        };
        let p = program(steering).unwrap();
        let from_enb = |transport: Vec<u8>| v4(enb, gateway, 17, &transport);
        let imsi = imsi(123_456_789_012_345);
        assert_eq!(run(&p, &from_enb(gtpu(0x2000_0005))), 5);
        assert_eq!(run(&p, &from_enb(gtpu(0x2fff_ffff))), 0x0fff_ffff);
        assert_eq!(run(&p, &from_enb(gtpc(true, 0x1000_0005, &imsi))), 5);
        assert_eq!(
            run(&p, &from_enb(gtpc(true, 0, &imsi))),
            (123_456_789_012_345u64 % (1 << 32)) as u32,
            "a Create Session Request: its IMSI modulo 2^32"
        );
        let leading_zeros = from_enb(gtpc(true, 0, &testing::imsi(1_010_000_000_007)));
        assert_eq!(
            run(&p, &leading_zeros),
            (1_010_000_000_007u64 % (1 << 32)) as u32
        );
        let mut apn_first = vec![71u8, 0, 1, 0, 7];
        apn_first.extend(&imsi);
        assert_eq!(run(&p, &from_enb(gtpc(true, 0, &apn_first))), 0);
        assert_eq!(
            run(&p, &from_enb(gtpc(false, 0, &[3, 0, 1, 0, 9]))),
            0,
            "echo"
        );
        // Cut short: within the IMSI, and before the TEID.
        let mut cut = from_enb(gtpc(true, 0, &imsi));
        cut.truncate(cut.len() - 2);
        assert_eq!(run(&p, &cut), 0);
        let mut cut = from_enb(gtpu(0x2000_0005));
        cut.truncate(14 + 20 + 8 + 6);
        assert_eq!(run(&p, &cut), 0);
        // An IPv4 header with options: the UDP header is found past them.
        let mut options = from_enb(gtpu(0x2000_0007));
        options[14] = 0x46;
        options.splice(34..34, [1, 1, 1, 0]);
        assert_eq!(run(&p, &options), 7);
        // Other UDP to the gateway is nobody's; downlink names its place.
        assert_eq!(run(&p, &from_enb(udp(53, &[0; 12]))), 0);
        assert_eq!(run(&p, &v4([198, 51, 100, 1], [198, 19, 0, 9], 6, &UDP)), 9);
        assert_eq!(
            run(&p, &v4([198, 51, 100, 1], [198, 19, 1, 2], 17, &UDP)),
            258
        );
        let mut ue6 = [0u8; 16];
        ue6[..8].copy_from_slice(&[0x20, 0x01, 0, 2, 0x80, 0, 0, 11]);
        ue6[15] = 1;
        assert_eq!(run(&p, &v6([0x20; 16], ue6, 17, &UDP)), 11);
        let mut arp = MAC.to_vec();
        arp.extend([0x08, 0x06]);
        arp.extend([0; 28]);
        assert_eq!(run(&p, &arp), 0);
    }

    /// Every packet of a NAT's connection with one remote host, both ways, and the ICMP
    /// errors about them from routers on either side, reaches one worker; different remote
    /// hosts spread over the workers; ARP goes to worker 0.
    #[test]
    fn a_remote_hosts_packets_and_the_errors_about_them_reach_one_worker() {
        let inside = program(Steering::RemoteIsDestination).unwrap();
        let outside = program(Steering::RemoteIsSource).unwrap();
        let (host, external, router) = ([198, 18, 0, 1], [198, 18, 0, 100], [198, 18, 9, 1]);
        let mut workers = std::collections::BTreeSet::new();
        for i in 0..64u8 {
            let remote = [198, 19, i / 4, i];
            let out = v4(host, remote, 17, &UDP);
            let translated = v4(external, remote, 17, &UDP);
            let answer = v4(remote, external, 17, &UDP);
            let restored = v4(remote, host, 17, &UDP);
            let worker = run(&inside, &out) % 2;
            workers.insert(worker);
            let same = [
                run(&outside, &answer),
                // Fragmentation needed from a router outside, about the packet that left.
                run(&outside, &error(&translated, 3, &router, &external)),
                // Time exceeded from a router outside.
                run(&outside, &error(&translated, 11, &router, &external)),
                // Port unreachable from the inside host, about an answer.
                run(&inside, &error(&restored, 3, &host, &remote)),
            ];
            assert_eq!(same.map(|w| w % 2), [worker; 4], "remote {remote:?}");
            // Ports do not matter.
            let other_ports = v4(host, remote, 6, &[1, 2, 3, 4, 0, 0, 0, 0]);
            assert_eq!(run(&inside, &other_ports) % 2, worker);
        }
        assert_eq!(workers.len(), 2, "remote hosts spread over both workers");
        let mut workers6 = std::collections::BTreeSet::new();
        for i in 0..64u8 {
            let (mut host6, mut remote6, mut router6) = ([0u8; 16], [0u8; 16], [0u8; 16]);
            host6[..2].copy_from_slice(&[0x20, 0x01]);
            host6[15] = 1;
            remote6[..2].copy_from_slice(&[0x20, 0x02]);
            remote6[14..].copy_from_slice(&[i / 3, i]);
            router6[..2].copy_from_slice(&[0x20, 0x03]);
            let out = v6(host6, remote6, 17, &UDP);
            let answer = v6(remote6, host6, 17, &UDP);
            let worker = run(&inside, &out);
            workers6.insert(worker % 2);
            assert_eq!(run(&outside, &answer), worker);
            // Packet too big from a router outside; an echo reply (not an error) is judged
            // by its own source.
            assert_eq!(run(&outside, &error(&out, 2, &router6, &host6)), worker);
            let echo_reply = v6(remote6, host6, 58, &[129, 0, 0, 0, 0, 1, 0, 1]);
            assert_eq!(run(&outside, &echo_reply), worker);
        }
        assert_eq!(workers6.len(), 2);
        let mut arp = MAC.to_vec();
        arp.extend([0x08, 0x06]);
        arp.extend([0; 28]);
        assert_eq!(run(&inside, &arp), 0);
        // A truncated error (no quote) ends the program with 0, as the kernel does.
        let cut = v4(router, external, 1, &[3, 0, 0, 0]);
        assert_eq!(run(&outside, &cut), 0);
        assert!(program(Steering::Flow).is_none());
    }
}
