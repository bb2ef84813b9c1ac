//! Helpers for the programs' tests.

use stateplane_runtime::{Burst, Context, PortId, Program};
use stateplane_wire::FlowHasher;

/// The hasher the tests parse with.
pub fn hasher() -> FlowHasher {
    FlowHasher::with_seed(1)
}

/// The context of worker 0 of 1 at `now_ns`, on a switch of `ports` ports.
pub fn ctx(now_ns: u64, ports: usize) -> Context {
    Context::one_worker(now_ns, hasher(), ports)
}

/// Runs `program` on one burst of `frames`, all arriving on port 0 at time 1, on a switch
/// of `ports` ports; returns the burst with the verdicts.
pub fn run(program: &mut impl Program, frames: &[Vec<u8>], ports: usize) -> Burst {
    let on_port_0: Vec<(&[u8], PortId)> = frames.iter().map(|f| (f.as_slice(), 0)).collect();
    run_on(program, &on_port_0, ports)
}

/// As [`run`], each frame arriving on its own port.
pub fn run_on(program: &mut impl Program, frames: &[(&[u8], PortId)], ports: usize) -> Burst {
    let mut b = Burst::with_capacity(frames.len().max(1));
    for (i, (f, port)) in frames.iter().enumerate() {
        b.push(f, f.len() as u32, 1, *port, i as u64);
    }
    b.parse(&hasher());
    program.process(&mut b, &mut ctx(1, ports));
    b
}

/// The verdict of each packet of a burst.
pub fn verdicts(b: &Burst) -> Vec<stateplane_runtime::Verdict> {
    b.descs().iter().map(|d| d.verdict).collect()
}

/// A UDP frame to `dst` (IPv4 or IPv6) with this TTL or hop limit, from 198.18.0.1 or
/// 2001:2:0:1::1.
pub fn udp_frame(dst: &str, ttl: u8) -> Vec<u8> {
    use stateplane_gen::build::{Hosts, L4, emit_frame};
    let dst: std::net::IpAddr = dst.parse().unwrap();
    let src = if dst.is_ipv4() {
        "198.18.0.1"
    } else {
        "2001:2:0:1::1"
    };
    let hosts = Hosts {
        src_mac: stateplane_wire::MacAddr([2, 0, 0, 0, 0, 0x99]),
        dst_mac: stateplane_wire::MacAddr([2, 0, 0, 0, 0, 1]),
        vlan: 0,
        src: src.parse().unwrap(),
        dst,
        ttl,
    };
    let mut f = Vec::new();
    emit_frame(
        &mut f,
        &hosts,
        &L4::Udp {
            src_port: 1,
            dst_port: 2,
        },
        b"x",
    );
    f
}

/// Whether an IPv4 frame's header checksum and its TCP, UDP or ICMP checksum verify,
/// computed from scratch (the check a receiving host makes).
pub fn ipv4_checksums_valid(frame: &[u8]) -> bool {
    use stateplane_wire::checksum;
    let p = stateplane_wire::parse(frame, 0, &hasher()).unwrap();
    let (l3, l4) = (usize::from(p.l3_offset), usize::from(p.l4_offset));
    let ihl = usize::from(frame[l3] & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes([frame[l3 + 2], frame[l3 + 3]]));
    if checksum::checksum(&frame[l3..l3 + ihl]) != 0 {
        return false;
    }
    let l4_bytes = &frame[l4..l3 + total];
    let sum = match p.key.proto {
        1 => checksum::accumulate(0, l4_bytes),
        proto => {
            let mut s = checksum::accumulate(0, &frame[l3 + 12..l3 + 20]);
            s += l4_bytes.len() as u32 + u32::from(proto);
            checksum::accumulate(s, l4_bytes)
        }
    };
    checksum::finish(sum) == 0
}

/// An IP frame from `src` to `dst` (both IPv4 or both IPv6) carrying `l4` and a few bytes
/// of payload.
pub fn ip_frame(src: &str, dst: &str, l4: stateplane_gen::build::L4) -> Vec<u8> {
    ip_frame_with(src, dst, l4, b"payload!")
}

/// The link and network layers of the tests' frames: from `src` to `dst`, hop limit 64.
fn hosts(src: &str, dst: &str) -> stateplane_gen::build::Hosts {
    stateplane_gen::build::Hosts {
        src_mac: stateplane_wire::MacAddr([2, 0, 0, 0, 0, 1]),
        dst_mac: stateplane_wire::MacAddr([2, 0, 0, 0, 0, 2]),
        vlan: 0,
        src: src.parse().unwrap(),
        dst: dst.parse().unwrap(),
        ttl: 64,
    }
}

/// As [`ip_frame`], with this payload (lengths and checksums made for it).
pub fn ip_frame_with(
    src: &str,
    dst: &str,
    l4: stateplane_gen::build::L4,
    payload: &[u8],
) -> Vec<u8> {
    use stateplane_gen::build::emit_frame;
    let hosts = hosts(src, dst);
    let mut f = Vec::new();
    emit_frame(&mut f, &hosts, &l4, payload);
    f
}

/// A broadcast ARP request from `mac`, `ip` asking for `target`.
pub fn arp_request(mac: [u8; 6], ip: [u8; 4], target: [u8; 4]) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend(mac);
    f.extend([0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 1]);
    f.extend(mac);
    f.extend(ip);
    f.extend([0; 6]);
    f.extend(target);
    f
}

/// An ICMP error of `icmp_type` and `code` (ICMPv6 for IPv6 addresses) from `src` to
/// `dst` about `original` (a frame): its IP header and the first 8 bytes after it, quoted.
pub fn icmp_error(original: &[u8], src: &str, dst: &str, icmp_type: u8, code: u8) -> Vec<u8> {
    icmp_error_quoting(original, 8, src, dst, (icmp_type, code))
}

/// As [`icmp_error`], quoting `quote` bytes past the original's IP header (as many as it
/// has at most: Linux quotes up to 576 bytes of error), its checksum right.
pub fn icmp_error_quoting(
    original: &[u8],
    quote: usize,
    src: &str,
    dst: &str,
    (icmp_type, code): (u8, u8),
) -> Vec<u8> {
    use stateplane_gen::build::{IcmpError, emit_icmp_error};
    let ip = &original[14..];
    let header = if ip[0] >> 4 == 6 {
        40
    } else {
        usize::from(ip[0] & 0x0f) * 4
    };
    let hosts = hosts(src, dst);
    let error = IcmpError {
        icmp_type,
        code,
        mtu: 1280,
    };
    let mut f = Vec::new();
    emit_icmp_error(&mut f, &hosts, error, &ip[..(header + quote).min(ip.len())]);
    f
}

/// An ICMPv6 message of `icmp_type` (code 0) from `src` to `dst` with hop limit
/// `hop_limit`, 8 bytes of body, its checksum right: neighbor discovery's shape.
pub fn icmpv6(src: &str, dst: &str, icmp_type: u8, hop_limit: u8) -> Vec<u8> {
    use stateplane_wire::{checksum, icmp::IcmpPacket};
    let echo = stateplane_gen::build::L4::IcmpEcho {
        request: true,
        ident: 0,
        seq: 0,
    };
    let mut f = ip_frame_with(src, dst, echo, &[0; 8]);
    f[14 + 7] = hop_limit;
    let at = 14 + 40;
    f[at] = icmp_type;
    let pseudo = match (src.parse(), dst.parse()) {
        (Ok(s), Ok(d)) => checksum::pseudo_v6(s, d, 58, (f.len() - at) as u32),
        _ => panic!("{src} and {dst} are IPv6 addresses"),
    };
    IcmpPacket::new_unchecked(&mut f[at..]).fill_checksum(pseudo);
    f
}

/// A TCP segment's header fields with these ports and flags.
pub fn tcp(src_port: u16, dst_port: u16, flags: u8) -> stateplane_gen::build::L4 {
    stateplane_gen::build::L4::Tcp {
        src_port,
        dst_port,
        seq: 7,
        ack: 9,
        flags,
    }
}

/// A TCP segment's header whole: numbers, flags, window, and a window scale option.
pub fn tcp_segment(
    ports: (u16, u16),
    seq: u32,
    ack: u32,
    flags: u8,
    window: u16,
    scale: Option<u8>,
) -> stateplane_gen::build::L4 {
    use stateplane_wire::tcp::{TcpRepr, option};
    let repr = TcpRepr::new(ports.0, ports.1, seq, ack, flags, window);
    let repr = match scale {
        Some(shift) => repr.with_options(&[option::NOP, option::WINDOW_SCALE, 3, shift]),
        None => Ok(repr),
    };
    stateplane_gen::build::L4::TcpSegment(repr.unwrap())
}

/// Runs frames, each on its port, through `program` as worker `worker` of `workers` at
/// time `t` on a switch of `ports` ports; returns each packet's verdict and bytes after.
pub fn run_at(
    program: &mut impl Program,
    t: u64,
    frames: &[(Vec<u8>, PortId)],
    (worker, workers): (usize, usize),
    ports: usize,
) -> Vec<(stateplane_runtime::Verdict, Vec<u8>)> {
    let c = Context {
        worker,
        workers,
        ..ctx(t, ports)
    };
    run_in(program, frames, c)
}

/// As [`run_at`], in the context `c` (its time, worker, and how packets reached it).
pub fn run_in(
    program: &mut impl Program,
    frames: &[(Vec<u8>, PortId)],
    mut c: Context,
) -> Vec<(stateplane_runtime::Verdict, Vec<u8>)> {
    let t = c.now_ns;
    let mut b = Burst::with_capacity(frames.len().max(1));
    for (i, (f, port)) in frames.iter().enumerate() {
        b.push(f, f.len() as u32, t, *port, i as u64);
    }
    b.now_ns = t;
    b.parse(&hasher());
    program.process(&mut b, &mut c);
    (0..b.len())
        .map(|i| (b.descs()[i].verdict, b.data(i).to_vec()))
        .collect()
}

/// Puts `items` in a fixed pseudo-random order (Fisher-Yates over an LCG from `seed`), so
/// that flows interleave the same way on every run.
pub fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut state = seed;
    for i in (1..items.len()).rev() {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        items.swap(i, (state >> 33) as usize % (i + 1));
    }
}

/// The replication stage's view of a frame arriving at `port`: the key of its flow, and
/// its alias (`Program::replicated_key`, `Program::replicated_alias`).
pub fn replicated_names(
    program: &impl Program,
    frame: &[u8],
    port: PortId,
) -> (
    Option<stateplane_runtime::FlowBytes>,
    Option<stateplane_runtime::FlowBytes>,
) {
    let mut b = Burst::with_capacity(1);
    b.push(frame, frame.len() as u32, 1, port, 0);
    b.parse(&hasher());
    let (d, data) = (&b.descs()[0], b.data(0));
    (
        program.replicated_key(d, data),
        program.replicated_alias(d, data),
    )
}

/// The frames of a generated trace, each arriving on port 0.
pub fn generated(cfg: &stateplane_gen::GenConfig) -> Vec<(Vec<u8>, PortId)> {
    let mut frames = Vec::new();
    stateplane_gen::generate(
        cfg,
        |_, f| {
            frames.push((f.to_vec(), 0));
            Ok(())
        },
        |_| {},
    )
    .unwrap();
    frames
}

/// A memory budget of `limit` bytes with the program's state kept `copies` times.
pub fn budget(limit: u64, copies: u64) -> stateplane_mem::budget::Budget {
    stateplane_mem::budget::Budget {
        limit,
        copies,
        setting: "memory_budget",
    }
}

/// Moves a synced table from `from` into `to` (both tracking it as id 0): see
/// [`move_synced_state`].
pub fn move_synced_table(
    from: &mut impl Program,
    to: &mut impl Program,
    stride: u32,
) -> (usize, u64) {
    move_synced_state(from, to, 0, stride)
}

/// Moves synced table `id` from `from` into `to` (both tracking it as `id`) as a
/// collector that took every change would: the words the changes since tracking began
/// leave (checked against `from`'s own words, so they rebuild the table whole), each
/// occupied slot of `stride` words (its action word not 0) written whole, then committed.
/// The slots written, and the entries `to` refused. `from`'s changes of its other states
/// are taken and dropped.
pub fn move_synced_state(
    from: &mut impl Program,
    to: &mut impl Program,
    id: u16,
    stride: u32,
) -> (usize, u64) {
    let mut changes = Vec::new();
    assert!(from.changes(&mut changes, usize::MAX));
    let mut words = std::collections::BTreeMap::new();
    for c in changes.into_iter().filter(|c| c.state == id) {
        assert_eq!(words.get(&c.index).copied().unwrap_or(0), c.old, "{c:?}");
        words.insert(c.index, c.new);
    }
    let word = |index: u32| words.get(&index).copied().unwrap_or(0);
    let length = (from.synced().into_iter())
        .find_map(|(state, length)| (state == id).then_some(length))
        .expect("`from` tracks the state");
    for index in 0..length {
        assert_eq!(
            from.read_synced(id, index),
            Some(word(index)),
            "word {index}"
        );
    }
    let mut written = 0;
    for slot in (0..length).step_by(stride as usize) {
        if word(slot) != 0 {
            for index in slot..slot + stride {
                to.write_synced(id, index, word(index)).unwrap();
            }
            written += 1;
        }
    }
    (written, to.commit_synced_write())
}

/// The page faults the calling thread has taken that needed no disk ("minor": a page first
/// touched), from `/proc/thread-self/stat` (its 10th field).
pub fn page_faults_of_this_thread() -> u64 {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    // The fields after the command's name, which is in parentheses and may hold spaces.
    let after_name = &stat[stat.rfind(')').unwrap() + 1..];
    after_name
        .split_whitespace()
        .nth(7)
        .unwrap()
        .parse()
        .unwrap()
}
