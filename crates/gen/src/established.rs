//! A generated trace played again and again as the same flows, established: what a
//! program's rate "on established flows" is measured over.
//!
//! Playing a trace again as it is would open and close each TCP connection again in every
//! pass (its SYN, FIN and RST segments: state changes, not established flows), and its
//! segments' sequence numbers, from before the last pass's end, would be out of every
//! window. So the first pass is the trace without its FIN and RST segments (each
//! connection opens and stays open), and each later pass is the trace's other segments
//! with neither SYN, FIN nor RST, each direction's sequence numbers (and the other
//! direction's acknowledgments) moved on by what the direction sent in a pass, so that
//! each pass goes on where the last one ended. UDP and other packets go as they are. Each
//! pass starts 1 ms after the last one's end (the trace's times are the clock's).
//!
//! Must never: start a direction's segments in a later pass anywhere but where the pass
//! before ended them (what a pass moves a direction on by is the span of the sequence
//! numbers its segments of the direction take, in the segments a pass carries).

use crate::{GenConfig, GenGenerateError, generate};
use stateplane_wire::tcp::{TcpPacket, flags};
use stateplane_wire::{FlowHasher, FlowKey, ParseFlags, parse};
use std::collections::HashMap;
use std::io;

/// What [`generate_established`] gave: the packets of its first pass and of each later one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Passes {
    pub first: u64,
    pub later: u64,
}

/// A TCP direction's sequence numbers over one pass, relative to the first one seen.
struct Span {
    base: u32,
    low: i64,
    high: i64,
}

/// A TCP segment of the trace: its direction, place in it and length in sequence space.
struct Segment {
    key: FlowKey,
    seq: u32,
    ack: u32,
    flags: u8,
    /// Sequence numbers it takes: its payload, and one for a SYN.
    takes: i64,
    l4: usize,
}

fn segment(frame: &[u8], hasher: &FlowHasher) -> Option<Segment> {
    let p = parse(frame, 0, hasher).ok()?;
    if !p.flags.has(ParseFlags::TCP) {
        return None;
    }
    let l4 = usize::from(p.l4_offset);
    let tcp = TcpPacket::new_checked(frame.get(l4..)?).ok()?;
    let ip_end = usize::from(p.l3_offset) + p.ip_bytes(frame.len() as u32) as usize;
    let payload = ip_end.saturating_sub(usize::from(p.payload_offset));
    let syn = i64::from(tcp.flags() & flags::SYN != 0);
    Some(Segment {
        key: p.key,
        seq: tcp.seq(),
        ack: tcp.ack(),
        flags: tcp.flags(),
        takes: payload as i64 + syn,
        l4,
    })
}

/// Generates `cfg`'s trace as `passes` passes of established flows (the module's doc),
/// handing each packet to `each` with its pass (from 0), time and bytes.
pub fn generate_established(
    cfg: &GenConfig,
    passes: u64,
    mut each: impl FnMut(u64, u64, &[u8]) -> io::Result<()>,
) -> Result<Passes, GenGenerateError> {
    let hasher = FlowHasher::with_seed(1);
    let mut spans: HashMap<FlowKey, Span> = HashMap::new();
    let (mut first_ns, mut last_ns) = (u64::MAX, 0);
    let mut counted = Passes { first: 0, later: 0 };
    generate(
        cfg,
        |ts, f| {
            (first_ns, last_ns) = (first_ns.min(ts), last_ns.max(ts));
            if let Some(s) = segment(f, &hasher) {
                if s.flags & (flags::FIN | flags::RST) != 0 {
                    return Ok(());
                }
                let span = spans.entry(s.key).or_insert(Span {
                    base: s.seq,
                    low: i64::MAX,
                    high: i64::MIN,
                });
                // The segment's place as a signed distance from the first seen: a
                // connection's sequence numbers may wrap within the pass.
                let at = i64::from(s.seq.wrapping_sub(span.base) as i32);
                let data = at + i64::from(s.flags & flags::SYN != 0);
                (span.low, span.high) = (span.low.min(data), span.high.max(at + s.takes));
            }
            counted.first += 1;
            each(0, ts, f)
        },
        |_| {},
    )?;
    // What each direction sends in a pass: its sequence numbers' span.
    let sent: HashMap<FlowKey, u32> = (spans.into_iter())
        .map(|(key, s)| (key, (s.high - s.low).max(0) as u32))
        .collect();
    let pass_ns = last_ns.saturating_sub(first_ns) + 1_000_000;
    let mut frame = Vec::new();
    for pass in 1..passes {
        let later = pass * pass_ns;
        let mut count = 0;
        generate(
            cfg,
            |ts, f| {
                frame.clear();
                frame.extend_from_slice(f);
                if let Some(s) = segment(f, &hasher) {
                    if s.flags & (flags::SYN | flags::FIN | flags::RST) != 0 {
                        return Ok(());
                    }
                    let moved = |key: &FlowKey, n: u32| {
                        let by = sent.get(key).copied().unwrap_or(0);
                        n.wrapping_add(by.wrapping_mul(pass as u32))
                    };
                    let mut tcp = TcpPacket::new_unchecked(&mut frame[s.l4..]);
                    tcp.set_seq(moved(&s.key, s.seq));
                    if s.flags & flags::ACK != 0 {
                        tcp.set_ack(moved(&s.key.reversed(), s.ack));
                    }
                }
                count += 1;
                each(pass, ts + later, &frame)
            },
            |_| {},
        )?;
        counted.later = count;
    }
    Ok(counted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Workload;
    use stateplane_wire::checksum;
    use std::net::IpAddr;

    /// Whether the frame's TCP checksum holds.
    fn checksum_holds(f: &[u8]) -> bool {
        let p = parse(f, 0, &FlowHasher::with_seed(1)).unwrap();
        let l4 = usize::from(p.l4_offset);
        let end = usize::from(p.l3_offset) + p.ip_bytes(f.len() as u32) as usize;
        let len = end - l4;
        let pseudo = match (p.key.src_ip(), p.key.dst_ip()) {
            (Some(IpAddr::V4(a)), Some(IpAddr::V4(b))) => checksum::pseudo_v4(a, b, 6, len as u16),
            (Some(IpAddr::V6(a)), Some(IpAddr::V6(b))) => checksum::pseudo_v6(a, b, 6, len as u32),
            _ => return false,
        };
        TcpPacket::new_unchecked(&f[l4..end]).verify_checksum(pseudo)
    }

    /// Each later pass is the trace's segments with no SYN, FIN or RST, and its other
    /// packets, from 1 ms after the last pass's end; each direction's segments go on
    /// exactly where that direction's last pass ended (its next sequence number), their
    /// acknowledgments as far as the other direction's, checksums whole.
    #[test]
    fn each_pass_goes_on_where_the_last_ended_with_no_connection_opened_or_closed() {
        const PASSES: u64 = 4;
        let mut cfg = GenConfig::new(Workload::Datacenter, 3_000);
        cfg.flows = Some(20);
        let mut trace = Vec::new();
        let keep = |ts, f: &[u8]| {
            trace.push((ts, f.to_vec()));
            Ok(())
        };
        generate(&cfg, keep, |_| {}).unwrap();
        let mut passes: Vec<(u64, u64, Vec<u8>)> = Vec::new();
        let counted = generate_established(&cfg, PASSES, |pass, ts, f| {
            passes.push((pass, ts, f.to_vec()));
            Ok(())
        })
        .unwrap();
        let hasher = FlowHasher::with_seed(1);
        let closes = |f: &[u8]| {
            segment(f, &hasher).is_some_and(|s| s.flags & (flags::FIN | flags::RST) != 0)
        };
        let opens = |f: &[u8]| segment(f, &hasher).is_some_and(|s| s.flags & flags::SYN != 0);
        assert!(trace.iter().any(|(_, f)| closes(f)) && trace.iter().any(|(_, f)| opens(f)));
        let first: Vec<_> = (passes.iter())
            .filter(|(pass, ..)| *pass == 0)
            .map(|(_, ts, f)| (*ts, f.clone()))
            .collect();
        let expected_first: Vec<_> = trace.iter().filter(|(_, f)| !closes(f)).cloned().collect();
        assert_eq!(first, expected_first);
        let later = trace
            .iter()
            .filter(|(_, f)| !closes(f) && !opens(f))
            .count() as u64;
        assert_eq!(
            counted,
            Passes {
                first: first.len() as u64,
                later
            }
        );
        assert_eq!(passes.len() as u64, counted.first + (PASSES - 1) * later);
        // The passes come in order, each whole.
        for (i, (pass, ..)) in passes.iter().enumerate() {
            let expected = match i.checked_sub(first.len()) {
                None => 0,
                Some(n) => n as u64 / later + 1,
            };
            assert_eq!(*pass, expected, "packet {i}");
        }
        // Per pass and direction: the lowest sequence number its data starts at and the
        // highest its data reaches (as distances from the direction's first seen).
        let mut base: HashMap<FlowKey, u32> = HashMap::new();
        let mut extents: Vec<HashMap<FlowKey, (i64, i64)>> = vec![HashMap::new(); PASSES as usize];
        let pass_ns = trace[trace.len() - 1].0 - trace[0].0 + 1_000_000;
        for (i, (pass, ts, f)) in passes.iter().enumerate() {
            let pass = *pass as usize;
            assert!(*ts >= trace[0].0 + pass as u64 * pass_ns, "packet {i}");
            let Some(s) = segment(f, &hasher) else {
                continue;
            };
            assert!(checksum_holds(f), "packet {i}");
            let tcp = TcpPacket::new_unchecked(&f[s.l4..]);
            let from = *base.entry(s.key).or_insert(tcp.seq());
            let at = i64::from(tcp.seq().wrapping_sub(from) as i32);
            let syn = i64::from(s.flags & flags::SYN != 0);
            let e = extents[pass].entry(s.key).or_insert((i64::MAX, i64::MIN));
            *e = (e.0.min(at + syn), e.1.max(at + s.takes));
            // An acknowledgment is never of more than the other direction has sent.
            if s.flags & flags::ACK != 0
                && let Some(&other) = base.get(&s.key.reversed())
            {
                let acked = i64::from(tcp.ack().wrapping_sub(other) as i32);
                let sent = (extents[..=pass].iter())
                    .filter_map(|x| x.get(&s.key.reversed()).map(|e| e.1))
                    .max();
                assert!(
                    sent.is_some_and(|sent| acked <= sent),
                    "packet {i}: ack {acked} of {sent:?}"
                );
            }
        }
        // Each later pass starts each direction where the pass before ended it.
        let mut went_on = 0;
        for pass in 1..PASSES as usize {
            for (key, (low, _)) in &extents[pass] {
                let before = extents[pass - 1][key];
                assert_eq!(*low, before.1, "pass {pass}, {key:?}");
                went_on += 1;
            }
        }
        assert!(went_on > 20);
    }

    /// One pass is the trace with no FIN or RST: its connections opened, none closed.
    #[test]
    fn one_pass_is_the_trace_with_every_connection_left_open() {
        let cfg = GenConfig::new(Workload::Datacenter, 2_000);
        let mut trace = Vec::new();
        generate(
            &cfg,
            |ts, f| {
                trace.push((ts, f.to_vec()));
                Ok(())
            },
            |_| {},
        )
        .unwrap();
        let mut passes = Vec::new();
        let counted = generate_established(&cfg, 1, |pass, ts, f| {
            assert_eq!(pass, 0);
            passes.push((ts, f.to_vec()));
            Ok(())
        })
        .unwrap();
        let hasher = FlowHasher::with_seed(1);
        let closes = |f: &[u8]| {
            segment(f, &hasher).is_some_and(|s| s.flags & (flags::FIN | flags::RST) != 0)
        };
        let open: Vec<_> = trace.iter().filter(|(_, f)| !closes(f)).cloned().collect();
        assert!(open.len() < trace.len(), "the trace closes connections");
        assert_eq!(passes, open);
        let first = open.len() as u64;
        assert_eq!(counted, Passes { first, later: 0 });
    }
}
