//! The classic BPF program a `PACKET_FANOUT_CBPF` group runs to pick each received
//! packet's worker by the remote endpoint's address ([`Steering`]); the kernel takes its
//! result modulo the group's members.
//!
//! The remote address is the source or the destination (IPv6: its last 32 bits), or for an
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

const LD_W_ABS: u16 = 0x20;
const LD_H_ABS: u16 = 0x28;
const LD_B_ABS: u16 = 0x30;
const LD_W_IND: u16 = 0x40;
const LD_B_IND: u16 = 0x50;
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
        Steering::Flow => None,
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
enum Op {
    Do(u16, u32),
    Jump(u16, u32, &'static str, &'static str),
    Label(&'static str),
}

use Op::{Do, Jump, Label};

/// The program for `steering`, or `None` for [`Steering::Flow`] (the kernel's hash).
pub fn program(steering: Steering) -> Option<Vec<libc::sock_filter>> {
    let at = offsets(steering)?;
    let ops = [
        Do(LD_H_ABS, PROTOCOL),
        Jump(JEQ_K, 0x0800, "v4", "not_v4"),
        Label("not_v4"),
        Jump(JEQ_K, 0x86dd, "v6", "other"),
        Label("v4"),
        Do(LD_B_ABS, NET.wrapping_add(9)),
        Jump(JEQ_K, 1, "icmp4", "plain4"),
        Label("icmp4"),
        // X = the IPv4 header's length; the ICMP type follows it.
        Do(LD_B_ABS, NET),
        Do(AND_K, 0x0f),
        Do(LSH_K, 2),
        Do(TAX, 0),
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
    ];
    Some(assemble(&ops))
}

/// Lays the instructions out, each jump's targets resolved to offsets forward.
fn assemble(ops: &[Op]) -> Vec<libc::sock_filter> {
    let mut index = std::collections::HashMap::new();
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
        // Labels only lie ahead, within 255 instructions (the program is short).
        let ahead = |label: &str| (index[label] - here - 1) as u8;
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

/// A classic BPF interpreter and frames to run it on, for this module's tests and the
/// live fanout test (which checks the kernel agrees).
#[cfg(test)]
pub(super) mod testing {
    use super::*;

    /// Runs a classic BPF program on an Ethernet frame as the kernel does for the ops
    /// used here: `NET` loads from the IP header, `PROTOCOL` the EtherType; a load out of
    /// the packet returns 0.
    pub fn run(program: &[libc::sock_filter], frame: &[u8]) -> u32 {
        let ethertype = u32::from(u16::from_be_bytes([frame[12], frame[13]]));
        let load = |at: u32, size: usize| -> Option<u32> {
            let at = 14 + at.wrapping_sub(NET) as usize;
            let bytes = frame.get(at..at + size)?;
            Some(bytes.iter().fold(0, |a, b| a << 8 | u32::from(*b)))
        };
        let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
        loop {
            let i = program[pc];
            pc += 1;
            let loaded = match i.code {
                LD_W_ABS => load(i.k, 4),
                LD_H_ABS if i.k == PROTOCOL => Some(ethertype),
                LD_B_ABS => load(i.k, 1),
                LD_W_IND => load(x.wrapping_add(i.k), 4),
                LD_B_IND => load(x.wrapping_add(i.k), 1),
                _ => Some(a),
            };
            let Some(loaded) = loaded else { return 0 };
            a = loaded;
            match i.code {
                AND_K => a &= i.k,
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
    pub const MAC: [u8; 12] = [2, 0, 0, 0, 0, 2, 2, 0, 0, 0, 0, 1];
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

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
