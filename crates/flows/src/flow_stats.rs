//! A flow's features: what one packet contributes and how two parts of a flow combine.

/// What the flow stage takes from one packet.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    pub ts_ns: u64,
    /// IP total length (IPv6: payload length plus 40), the bytes nfpcapd and pmacct count;
    /// above 64 KiB for a segment whose IP header gives no length (`Parsed::ip_bytes`).
    pub ip_len: u32,
    pub ttl: u8,
    pub tos: u8,
    pub tcp_flags: u8,
    pub in_port: u16,
    /// The port the packet left by, or what became of it instead ([`Fate`]).
    pub out_port: u16,
}

/// An egress port for packets whose fate is not known (an observer's).
pub const NO_PORT: u16 = u16::MAX;

/// The ports a flow keeps as its later packets come (`later_in`, `later_out`): the first
/// way in any packet had, and the last way out. A packet with none ([`NO_PORT`]: an
/// observer's, captured on its way in or on its way out) leaves what is kept, so a flow
/// a capture saw both arrive and leave a host has both.
#[inline]
fn keep_ports(kept: (&mut u16, &mut u16), later_in: u16, later_out: u16) {
    if *kept.0 == NO_PORT {
        *kept.0 = later_in;
    }
    if later_out != NO_PORT {
        *kept.1 = later_out;
    }
}

/// What became of a flow's last packet, kept in the `out_port` of its features: the port
/// it left by, or above every port a switch can have, what happened instead. So a
/// record's fate costs no byte of its flow's slot.
///
/// Invariant: ports are below [`Fate::FIRST_CODE`] (a switch has at most a few hundred);
/// a drop reason's code is below 64 (`DropReason::COUNT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    Port(u16),
    Flooded,
    /// Dropped, for the runtime's or the program's reason of this code.
    Dropped(u8),
    ToControl,
    Unknown,
}

impl Fate {
    const FIRST_CODE: u16 = 0xFF00;
    const DROPPED: u16 = 0xFF00;
    const FLOODED: u16 = 0xFFFD;
    const TO_CONTROL: u16 = 0xFFFE;

    /// The fate an `out_port` holds.
    pub fn of(out_port: u16) -> Fate {
        match out_port {
            p if p < Self::FIRST_CODE => Fate::Port(p),
            Self::FLOODED => Fate::Flooded,
            Self::TO_CONTROL => Fate::ToControl,
            NO_PORT => Fate::Unknown,
            code => Fate::Dropped((code - Self::DROPPED) as u8),
        }
    }

    /// The `out_port` that holds this fate.
    pub fn code(self) -> u16 {
        match self {
            Fate::Port(p) if p < Self::FIRST_CODE => p,
            Fate::Port(_) | Fate::Unknown => NO_PORT,
            Fate::Flooded => Self::FLOODED,
            Fate::ToControl => Self::TO_CONTROL,
            Fate::Dropped(reason) => Self::DROPPED + u16::from(reason.min(0xFC)),
        }
    }

    /// The port it left by, if one.
    pub fn port(self) -> Option<u16> {
        match self {
            Fate::Port(p) => Some(p),
            _ => None,
        }
    }

    /// IPFIX's forwardingStatus (IE 89, RFC 7270 4.12): the two high bits say forwarded,
    /// dropped or consumed, the rest a reason: a verdict naming no port the switch has is
    /// "bad output interface" (0x8E); other drops "unknown" (0x80), their exact reason in
    /// our own element; a packet handed to the control plane is consumed, "punt
    /// adjacency" (0xC1, a packet sent to the control processor); a fate not known, 0.
    pub fn forwarding_status(self) -> u8 {
        match self {
            Fate::Port(_) | Fate::Flooded => 0x40,
            Fate::Dropped(r) if r == stateplane_runtime::DropReason::NO_SUCH_PORT.0 => 0x8E,
            Fate::Dropped(_) => 0x80,
            Fate::ToControl => 0xC1,
            Fate::Unknown => 0,
        }
    }

    /// Its name in text records.
    pub fn name(self) -> Option<&'static str> {
        match self {
            Fate::Port(_) => Some("forwarded"),
            Fate::Flooded => Some("flooded"),
            Fate::Dropped(_) => Some("dropped"),
            Fate::ToControl => Some("to_control"),
            Fate::Unknown => None,
        }
    }
}

impl Observation {
    /// What parsed packet `p`, of `orig_len` bytes on the wire, seen at `ts_ns` on
    /// `in_port` and sent to `out_port` (a [`Fate::code`]), adds to its flow.
    #[inline]
    pub fn of(
        p: &stateplane_wire::Parsed,
        orig_len: u32,
        ts_ns: u64,
        in_port: u16,
        out_port: u16,
    ) -> Self {
        Observation {
            ts_ns,
            ip_len: p.ip_bytes(orig_len),
            ttl: p.ttl,
            tos: p.tos,
            tcp_flags: p.tcp_flags,
            in_port,
            out_port,
        }
    }

    /// The IP length as the length extremes keep it: 16 bits, a segment above 64 KiB as
    /// 65,535 (its bytes are counted whole).
    #[inline]
    fn len_u16(&self) -> u16 {
        self.ip_len.min(u32::from(u16::MAX)) as u16
    }
}

/// A flow's features over a run of its packets (a microflow, or a whole flow). Every
/// feature is kept; a run chooses which ones it exports.
///
/// Invariant: `packets >= 1`; `first_ns <= last_ns`; with one packet the inter-arrival
/// extremes are `iat_min_ns == u64::MAX` and `iat_max_ns == 0` (none seen).
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Zeroable)]
pub struct FlowStats {
    pub packets: u64,
    pub bytes: u64,
    pub first_ns: u64,
    pub last_ns: u64,
    pub iat_min_ns: u64,
    pub iat_max_ns: u64,
    pub len_min: u16,
    pub len_max: u16,
    /// The ingress port of the first packet.
    pub in_port: u16,
    /// The egress port of the last packet, or what became of it instead ([`Fate`]).
    pub out_port: u16,
    pub ttl_min: u8,
    pub ttl_max: u8,
    /// TCP flags of every packet, ORed.
    pub tcp_flags: u8,
    /// The first packet's TOS / traffic class.
    pub tos: u8,
}

pub const TCP_FIN: u8 = 0x01;
pub const TCP_SYN: u8 = 0x02;
pub const TCP_RST: u8 = 0x04;

impl FlowStats {
    /// All zero: no packets (an empty slot, a direction that sent nothing).
    pub const ZERO: FlowStats = FlowStats {
        packets: 0,
        bytes: 0,
        first_ns: 0,
        last_ns: 0,
        iat_min_ns: 0,
        iat_max_ns: 0,
        len_min: 0,
        len_max: 0,
        in_port: 0,
        out_port: 0,
        ttl_min: 0,
        ttl_max: 0,
        tcp_flags: 0,
        tos: 0,
    };

    /// The features of a flow's first packet.
    #[inline]
    pub fn start(o: &Observation) -> FlowStats {
        FlowStats {
            packets: 1,
            bytes: u64::from(o.ip_len),
            first_ns: o.ts_ns,
            last_ns: o.ts_ns,
            iat_min_ns: u64::MAX,
            iat_max_ns: 0,
            len_min: o.len_u16(),
            len_max: o.len_u16(),
            in_port: o.in_port,
            out_port: o.out_port,
            ttl_min: o.ttl,
            ttl_max: o.ttl,
            tcp_flags: o.tcp_flags,
            tos: o.tos,
        }
    }

    /// Adds the flow's next packet.
    #[inline]
    pub fn add(&mut self, o: &Observation) {
        let gap = o.ts_ns.saturating_sub(self.last_ns);
        self.packets += 1;
        self.bytes += u64::from(o.ip_len);
        self.last_ns = self.last_ns.max(o.ts_ns);
        self.iat_min_ns = self.iat_min_ns.min(gap);
        self.iat_max_ns = self.iat_max_ns.max(gap);
        self.len_min = self.len_min.min(o.len_u16());
        self.len_max = self.len_max.max(o.len_u16());
        keep_ports(
            (&mut self.in_port, &mut self.out_port),
            o.in_port,
            o.out_port,
        );
        self.ttl_min = self.ttl_min.min(o.ttl);
        self.ttl_max = self.ttl_max.max(o.ttl);
        self.tcp_flags |= o.tcp_flags;
    }

    /// Adds `later`, the features of the packets that came after this part's (a later
    /// microflow of the same flow): the gap between the two parts is an inter-arrival
    /// time like any other, so the result equals the features of all the packets at once.
    #[inline]
    pub fn merge(&mut self, later: &FlowStats) {
        let gap = later.first_ns.saturating_sub(self.last_ns);
        self.packets += later.packets;
        self.bytes += later.bytes;
        self.iat_min_ns = self.iat_min_ns.min(later.iat_min_ns).min(gap);
        self.iat_max_ns = self.iat_max_ns.max(later.iat_max_ns).max(gap);
        self.first_ns = self.first_ns.min(later.first_ns);
        self.last_ns = self.last_ns.max(later.last_ns);
        self.len_min = self.len_min.min(later.len_min);
        self.len_max = self.len_max.max(later.len_max);
        keep_ports(
            (&mut self.in_port, &mut self.out_port),
            later.in_port,
            later.out_port,
        );
        self.ttl_min = self.ttl_min.min(later.ttl_min);
        self.ttl_max = self.ttl_max.max(later.ttl_max);
        self.tcp_flags |= later.tcp_flags;
    }

    /// Mean IP length, rounded down.
    pub fn len_mean(&self) -> u64 {
        self.bytes / self.packets.max(1)
    }

    /// Mean inter-arrival time in ns, or `None` with a single packet.
    pub fn iat_mean_ns(&self) -> Option<u64> {
        (self.packets > 1).then(|| (self.last_ns - self.first_ns) / (self.packets - 1))
    }

    /// The smallest inter-arrival time, or `None` with a single packet.
    pub fn iat_min(&self) -> Option<u64> {
        (self.packets > 1).then_some(self.iat_min_ns)
    }

    pub fn ended_by_tcp(&self) -> bool {
        self.tcp_flags & (TCP_FIN | TCP_RST) != 0
    }
}

/// What the tables keep of a flow's features: all of them ([`FlowStats`]), or only the
/// totals ([`FlowTotals`]) when a run exports none of the extremes. Both tables of a run,
/// the microflow table and the aggregator, keep the same.
pub trait KeptStats: Copy + std::fmt::Debug + Send + bytemuck::Zeroable + 'static {
    /// The features of a flow's first packet.
    fn start(o: &Observation) -> Self;
    /// Adds the flow's next packet.
    fn add(&mut self, o: &Observation);
    /// Adds `later`, a later part of the same flow (see [`FlowStats::merge`]).
    fn merge(&mut self, later: &Self);
    /// The features kept, as a record carries them.
    fn stats(&self) -> FlowStats;
    /// 0 for no packets (an empty slot, a direction that sent nothing: all zero bytes).
    fn packets(&self) -> u64;
    fn first_ns(&self) -> u64;
    fn last_ns(&self) -> u64;
    fn tcp_flags(&self) -> u8;
}

/// The [`KeptStats`] methods that read a field of the same name, which both kinds have.
macro_rules! kept_fields {
    () => {
        #[inline]
        fn packets(&self) -> u64 {
            self.packets
        }
        #[inline]
        fn first_ns(&self) -> u64 {
            self.first_ns
        }
        #[inline]
        fn last_ns(&self) -> u64 {
            self.last_ns
        }
        #[inline]
        fn tcp_flags(&self) -> u8 {
            self.tcp_flags
        }
    };
}

impl KeptStats for FlowStats {
    #[inline]
    fn start(o: &Observation) -> Self {
        FlowStats::start(o)
    }
    #[inline]
    fn add(&mut self, o: &Observation) {
        FlowStats::add(self, o)
    }
    #[inline]
    fn merge(&mut self, later: &Self) {
        FlowStats::merge(self, later)
    }
    fn stats(&self) -> FlowStats {
        *self
    }
    kept_fields!();
}

/// The features NetFlow-style records carry, the default set: counts, times, TCP flags,
/// TOS and ports, without the extremes (sizes, TTLs, inter-arrival times). 40 bytes
/// against [`FlowStats`]' 64, so that an IPv4 flow-table slot is one cache line: the
/// tables of a run touch a quarter less memory, which the kernel zeroes page by page
/// (`docs/BENCHMARKS.md`, measured at 6a54307).
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Zeroable)]
pub struct FlowTotals {
    pub packets: u64,
    pub bytes: u64,
    pub first_ns: u64,
    pub last_ns: u64,
    pub in_port: u16,
    pub out_port: u16,
    pub tcp_flags: u8,
    pub tos: u8,
}

/// The totals of a flow's features.
impl From<&FlowStats> for FlowTotals {
    fn from(s: &FlowStats) -> Self {
        FlowTotals {
            packets: s.packets,
            bytes: s.bytes,
            first_ns: s.first_ns,
            last_ns: s.last_ns,
            in_port: s.in_port,
            out_port: s.out_port,
            tcp_flags: s.tcp_flags,
            tos: s.tos,
        }
    }
}

/// The same rules as [`FlowStats`]' for the fields kept.
impl KeptStats for FlowTotals {
    #[inline]
    fn start(o: &Observation) -> Self {
        FlowTotals {
            packets: 1,
            bytes: u64::from(o.ip_len),
            first_ns: o.ts_ns,
            last_ns: o.ts_ns,
            in_port: o.in_port,
            out_port: o.out_port,
            tcp_flags: o.tcp_flags,
            tos: o.tos,
        }
    }
    #[inline]
    fn add(&mut self, o: &Observation) {
        self.packets += 1;
        self.bytes += u64::from(o.ip_len);
        self.last_ns = self.last_ns.max(o.ts_ns);
        keep_ports(
            (&mut self.in_port, &mut self.out_port),
            o.in_port,
            o.out_port,
        );
        self.tcp_flags |= o.tcp_flags;
    }
    #[inline]
    fn merge(&mut self, later: &Self) {
        self.packets += later.packets;
        self.bytes += later.bytes;
        self.first_ns = self.first_ns.min(later.first_ns);
        self.last_ns = self.last_ns.max(later.last_ns);
        keep_ports(
            (&mut self.in_port, &mut self.out_port),
            later.in_port,
            later.out_port,
        );
        self.tcp_flags |= later.tcp_flags;
    }
    /// The extremes, not kept, read as none seen: lengths and TTLs 0, inter-arrival
    /// minimum `u64::MAX` and maximum 0. A run that keeps totals exports none of them.
    fn stats(&self) -> FlowStats {
        FlowStats {
            packets: self.packets,
            bytes: self.bytes,
            first_ns: self.first_ns,
            last_ns: self.last_ns,
            iat_min_ns: u64::MAX,
            in_port: self.in_port,
            out_port: self.out_port,
            tcp_flags: self.tcp_flags,
            tos: self.tos,
            ..FlowStats::ZERO
        }
    }
    kept_fields!();
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn obs(ts_ns: u64, ip_len: u16, ttl: u8, flags: u8) -> Observation {
        Observation {
            ts_ns,
            ip_len: ip_len.into(),
            ttl,
            tcp_flags: flags,
            ..Observation::default()
        }
    }

    /// `packets` added one by one, and as consecutive parts cut before each packet whose
    /// `cuts` entry is set, merged: the whole and the merged parts.
    fn whole_and_merged<S: KeptStats>(packets: &[Observation], cuts: &[bool]) -> (S, S) {
        let mut whole = S::start(&packets[0]);
        for p in &packets[1..] {
            whole.add(p);
        }
        let mut merged: Option<S> = None;
        let mut part = S::start(&packets[0]);
        for (i, p) in packets.iter().enumerate().skip(1) {
            if cuts[i] {
                match &mut merged {
                    Some(m) => m.merge(&part),
                    None => merged = Some(part),
                }
                part = S::start(p);
            } else {
                part.add(p);
            }
        }
        match &mut merged {
            Some(m) => m.merge(&part),
            None => merged = Some(part),
        }
        (whole, merged.unwrap_or(part))
    }

    proptest! {
        /// Splitting a flow's packets into consecutive microflows and merging them gives
        /// the features of the whole flow, all of them or the totals; the totals are those
        /// of all the features.
        #[test]
        fn merging_parts_equals_the_whole(
            gaps in prop::collection::vec(
                (0u64..1_000_000, 40u16..1500, 1u8..255, 0u8..64, 0u16..4),
                1..40,
            ),
            cuts in prop::collection::vec(any::<bool>(), 40),
        ) {
            let mut ts = 1_000;
            let packets: Vec<Observation> = gaps.iter().map(|&(g, len, ttl, f, port)| {
                ts += g;
                // An observer's packets may have no way in (3) or no way out (2).
                let (in_port, out_port) = match port {
                    3 => (NO_PORT, port),
                    2 => (port, NO_PORT),
                    _ => (port, port + 1),
                };
                Observation { in_port, out_port, ..obs(ts, len, ttl, f) }
            }).collect();
            let (whole, merged) = whole_and_merged::<FlowStats>(&packets, &cuts);
            prop_assert_eq!(merged, whole);
            let (totals, merged_totals) = whole_and_merged::<FlowTotals>(&packets, &cuts);
            prop_assert_eq!(merged_totals, totals);
            prop_assert_eq!(totals, FlowTotals::from(&whole));
        }
    }

    /// A flow keeps the first way in any packet had and the last way out: a capture that
    /// saw a packet only leave, or only arrive, says nothing of the other.
    #[test]
    fn a_flow_keeps_its_first_way_in_and_last_way_out_that_were_seen() {
        let seen = |in_port, out_port| Observation {
            in_port,
            out_port,
            ..obs(1, 60, 64, 0)
        };
        let mut flow = FlowStats::start(&seen(NO_PORT, 4));
        flow.add(&seen(1, NO_PORT));
        flow.add(&seen(2, NO_PORT));
        assert_eq!((flow.in_port, flow.out_port), (1, 4));
        flow.add(&seen(NO_PORT, 6));
        assert_eq!((flow.in_port, flow.out_port), (1, 6));
        let mut totals = FlowTotals::start(&seen(NO_PORT, NO_PORT));
        totals.merge(&FlowTotals::start(&seen(3, 5)));
        assert_eq!((totals.in_port, totals.out_port), (3, 5));
    }

    /// Every fate is held by its own `out_port` and read back; ports past the codes'
    /// start, which no switch has, read as unknown rather than as a drop.
    #[test]
    fn each_fate_is_read_back_from_the_out_port_that_holds_it() {
        let mut fates = vec![Fate::Flooded, Fate::ToControl, Fate::Unknown];
        fates.extend([0, 1, 300, Fate::FIRST_CODE - 1].map(Fate::Port));
        fates.extend((0..64).map(Fate::Dropped));
        let mut codes = std::collections::HashSet::new();
        for f in fates {
            assert_eq!(Fate::of(f.code()), f);
            assert!(codes.insert(f.code()), "{f:?} shares its code");
        }
        assert_eq!(Fate::of(Fate::Port(0xFF05).code()), Fate::Unknown);
        assert_eq!(Fate::Port(3).forwarding_status(), 0x40);
        assert_eq!(Fate::Dropped(17).forwarding_status(), 0x80);
        let no_such_port = stateplane_runtime::DropReason::NO_SUCH_PORT.0;
        assert_eq!(Fate::Dropped(no_such_port).forwarding_status(), 0x8E);
        assert_eq!(Fate::ToControl.forwarding_status(), 0xC1);
        assert_eq!(Fate::Unknown.forwarding_status(), 0);
    }

    #[test]
    fn means_and_single_packets() {
        let mut s = FlowStats::start(&obs(10, 100, 64, TCP_SYN));
        assert_eq!(s.iat_mean_ns(), None);
        assert_eq!(s.iat_min(), None);
        s.add(&obs(30, 200, 60, TCP_FIN));
        s.add(&obs(70, 60, 61, 0));
        assert_eq!(s.len_mean(), 120);
        assert_eq!(s.iat_mean_ns(), Some(30));
        assert_eq!((s.iat_min(), s.iat_max_ns), (Some(20), 40));
        assert_eq!((s.ttl_min, s.ttl_max), (60, 64));
        assert!(s.ended_by_tcp());
    }
}
