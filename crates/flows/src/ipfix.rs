//! IPFIX (RFC 7011) encoding of flow records, biflows as RFC 5103 has them, and a decoder
//! for what we encode (round-trip tests, and a check of what a collector would see).
//!
//! One template per address family. Fields (IANA information elements): the 5-tuple
//! (8/12 or 27/28, 7, 11, 4), then the chosen [`Features`]: packetDeltaCount 2,
//! octetDeltaCount 1, flowStartMilliseconds 152 / flowEndMilliseconds 153 (absolute, as
//! nfdump reads them), tcpControlBits 6, ipClassOfService 5, minimumTTL 52 / maximumTTL 53,
//! minimumIpTotalLength 25 / maximumIpTotalLength 26, ingressInterface 10 /
//! egressInterface 14, vlanId 58, icmpTypeCodeIPv4 32 / icmpTypeCodeIPv6 139,
//! flowEndReason 136, forwardingStatus 89 (what became of the flow's last packet, RFC
//! 7270). Inter-arrival times have no IANA element: they go out as enterprise-specific
//! elements 1 (minimum) and 2 (maximum), in ns, under the documentation enterprise number
//! 32473 (RFC 5612) until the project has its own; so does the exact reason a dropped
//! flow's last packet was dropped (element 3, the `DropReason` code). A biflow adds the
//! reverse of each per-direction element (enterprise 29305, RFC 5103).
//!
//! Sequence numbers count the data records sent before each message (RFC 7011 §3.1), per
//! observation domain. Over UDP the templates go out again every `refresh_messages`
//! messages or `refresh_s` seconds; over TCP and to files, once at the start.
//!
//! The same encoder writes NetFlow version 9 (RFC 3954, [`Dialect::Netflow9`]), IPFIX's
//! predecessor, which many deployed collectors still take alone. Its messages differ in
//! the header (a record count and the exporter's uptime instead of a length; a sequence
//! number counting messages, not records), the template set's id (0), and three fields:
//! flow times are milliseconds of uptime (FIRST_SWITCHED 22, LAST_SWITCHED 21, 4 bytes)
//! rather than absolute, and TCP flags take one byte. It has no enterprise elements: no
//! inter-arrival times (a run refuses `iat` with a NetFlow v9 sink, [`Dialect::refuses`])
//! and no reverse elements, so a biflow goes out as two one-way records, as softflowd
//! does. It has no length field either, so it travels over UDP only.

use crate::flow_stats::{Fate, FlowStats};
use crate::record::{EndReason, FlowRecord};
use stateplane_wire::FlowKey;
use std::collections::HashMap;

pub const VERSION: u16 = 10;
pub const VERSION_NETFLOW9: u16 = 9;
const HEADER_LEN: usize = 16;
const HEADER_LEN_NETFLOW9: usize = 20;
const SET_HEADER_LEN: usize = 4;
pub const TEMPLATE_SET_ID: u16 = 2;
pub const TEMPLATE_SET_ID_NETFLOW9: u16 = 0;
pub const TEMPLATE_V4: u16 = 256;
pub const TEMPLATE_V6: u16 = 257;
/// RFC 5103's enterprise number for reverse elements.
pub const REVERSE_PEN: u32 = 29305;
/// RFC 5612's documentation enterprise number (our inter-arrival elements).
pub const STATEPLANE_PEN: u32 = 32473;

/// Optional features, chosen per run (the 5-tuple is always there).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features(pub u16);

impl Features {
    pub const COUNTS: u16 = 1 << 0;
    pub const TIMES: u16 = 1 << 1;
    pub const TCP_FLAGS: u16 = 1 << 2;
    pub const TOS: u16 = 1 << 3;
    pub const TTL: u16 = 1 << 4;
    pub const SIZES: u16 = 1 << 5;
    pub const IAT: u16 = 1 << 6;
    pub const PORTS: u16 = 1 << 7;
    pub const VLAN: u16 = 1 << 8;
    pub const ICMP: u16 = 1 << 9;
    pub const END_REASON: u16 = 1 << 10;
    pub const FORWARDING: u16 = 1 << 11;

    /// Names as the command line takes them.
    pub const NAMES: [(&'static str, u16); 12] = [
        ("counts", Self::COUNTS),
        ("times", Self::TIMES),
        ("tcp_flags", Self::TCP_FLAGS),
        ("tos", Self::TOS),
        ("ttl", Self::TTL),
        ("sizes", Self::SIZES),
        ("iat", Self::IAT),
        ("ports", Self::PORTS),
        ("vlan", Self::VLAN),
        ("icmp", Self::ICMP),
        ("end_reason", Self::END_REASON),
        ("forwarding", Self::FORWARDING),
    ];

    pub const ALL: Features = Features((1 << 12) - 1);
    /// What NetFlow-style exporters send by default, with the ICMP type and code (IE 32 or
    /// 139), without which collectors show ICMP flows as `0.0`.
    pub const DEFAULT: Features = Features(
        Self::COUNTS
            | Self::TIMES
            | Self::TCP_FLAGS
            | Self::TOS
            | Self::PORTS
            | Self::ICMP
            | Self::END_REASON,
    );

    pub fn has(self, bit: u16) -> bool {
        self.0 & bit != 0
    }

    /// Whether records need a flow's extremes (smallest and largest sizes, TTLs and
    /// inter-arrival times), which flow tables keep only when asked to
    /// (`StageConfig::extremes`).
    pub fn needs_extremes(self) -> bool {
        self.has(Self::TTL | Self::SIZES | Self::IAT)
    }

    /// The features `text` names one by one (not through `all` or `default`): those a
    /// run refuses when it cannot export them, where `all` means all it can.
    pub fn named(text: &str) -> Features {
        let bits = (text.split(',').map(str::trim))
            .filter_map(|name| Self::NAMES.iter().find(|(n, _)| *n == name))
            .fold(0, |bits, (_, b)| bits | b);
        Features(bits)
    }

    /// Parses a comma-separated list of names, `all` or `default`.
    pub fn parse(text: &str) -> Result<Features, String> {
        let mut bits = 0;
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            bits |= match name {
                "all" => Self::ALL.0,
                "default" => Self::DEFAULT.0,
                _ => Self::NAMES
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, b)| *b)
                    .ok_or_else(|| {
                        let known: Vec<_> = Self::NAMES.iter().map(|(n, _)| *n).collect();
                        format!(
                            "unknown feature {name:?}: use all, default, or some of {}",
                            known.join(", ")
                        )
                    })?,
            };
        }
        Ok(Features(bits))
    }
}

/// The wire format an [`Encoder`] writes (see the module documentation).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Ipfix,
    Netflow9,
}

impl Dialect {
    pub fn version(self) -> u16 {
        match self {
            Dialect::Ipfix => VERSION,
            Dialect::Netflow9 => VERSION_NETFLOW9,
        }
    }

    fn header_len(self) -> usize {
        match self {
            Dialect::Ipfix => HEADER_LEN,
            Dialect::Netflow9 => HEADER_LEN_NETFLOW9,
        }
    }

    pub fn template_set_id(self) -> u16 {
        match self {
            Dialect::Ipfix => TEMPLATE_SET_ID,
            Dialect::Netflow9 => TEMPLATE_SET_ID_NETFLOW9,
        }
    }

    /// What in `features` this dialect has no field for, as the reason a run refuses it
    /// when named (`all` takes what the dialect carries: its template leaves the rest out).
    pub fn refuses(self, features: Features) -> Option<&'static str> {
        (self == Dialect::Netflow9 && features.has(Features::IAT)).then_some(
            "`iat` has no NetFlow v9 field (inter-arrival times are enterprise elements, which \
             only IPFIX has): leave it out of the features, or export IPFIX",
        )
    }

    /// How a direction's element goes out: NetFlow v9 has its flow times as uptime
    /// milliseconds in 4 bytes under their own ids, and TCP flags in one byte.
    fn direction_field(self, e: &DirectionElement, pen: u32) -> Field {
        let (id, len) = match (self, e.id) {
            (Dialect::Ipfix, _) => (e.id, e.len),
            (Dialect::Netflow9, ie::START_MS) => (ie::FIRST_SWITCHED, 4),
            (Dialect::Netflow9, ie::END_MS) => (ie::LAST_SWITCHED, 4),
            (Dialect::Netflow9, ie::TCP_FLAGS) => (ie::TCP_FLAGS, 1),
            (Dialect::Netflow9, id) => (id, e.len),
        };
        Field { id, len, pen }
    }
}

/// One field of a template.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Field {
    pub id: u16,
    pub len: u16,
    /// Enterprise number, 0 for IANA elements.
    pub pen: u32,
}

const fn iana(id: u16, len: u16) -> Field {
    Field { id, len, pen: 0 }
}

pub mod ie {
    pub const OCTETS: u16 = 1;
    pub const PACKETS: u16 = 2;
    pub const PROTOCOL: u16 = 4;
    pub const TOS: u16 = 5;
    pub const TCP_FLAGS: u16 = 6;
    pub const SRC_PORT: u16 = 7;
    pub const SRC_V4: u16 = 8;
    pub const INGRESS: u16 = 10;
    pub const DST_PORT: u16 = 11;
    pub const DST_V4: u16 = 12;
    pub const EGRESS: u16 = 14;
    /// NetFlow v9's flow times, in milliseconds of the exporter's uptime.
    pub const LAST_SWITCHED: u16 = 21;
    pub const FIRST_SWITCHED: u16 = 22;
    pub const LEN_MIN: u16 = 25;
    pub const LEN_MAX: u16 = 26;
    pub const SRC_V6: u16 = 27;
    pub const DST_V6: u16 = 28;
    pub const ICMP_V4: u16 = 32;
    pub const TTL_MIN: u16 = 52;
    pub const TTL_MAX: u16 = 53;
    pub const VLAN: u16 = 58;
    pub const FORWARDING_STATUS: u16 = 89;
    pub const END_REASON: u16 = 136;
    pub const ICMP_V6: u16 = 139;
    pub const START_MS: u16 = 152;
    pub const END_MS: u16 = 153;
    /// Enterprise elements under `STATEPLANE_PEN`.
    pub const IAT_MIN: u16 = 1;
    pub const IAT_MAX: u16 = 2;
    /// The exact reason a flow's last packet was dropped (`DropReason`'s code).
    pub const DROP_REASON: u16 = 3;
}

/// A per-direction element: the feature that brings it, its IANA id and length, and how it
/// is read from and written to a direction's features. The template, the encoder and the
/// decoder all walk this one list, so they cannot disagree on order or size.
struct DirectionElement {
    feature: u16,
    id: u16,
    len: u16,
    get: fn(&FlowStats) -> u64,
    set: fn(&mut FlowStats, u64),
}

const MS: u64 = 1_000_000;

#[rustfmt::skip]
const DIRECTION: [DirectionElement; 10] = [
    DirectionElement { feature: Features::COUNTS, id: ie::PACKETS, len: 8, get: |s| s.packets, set: |s, n| s.packets = n },
    DirectionElement { feature: Features::COUNTS, id: ie::OCTETS, len: 8, get: |s| s.bytes, set: |s, n| s.bytes = n },
    DirectionElement { feature: Features::TIMES, id: ie::START_MS, len: 8, get: |s| s.first_ns / MS, set: |s, n| s.first_ns = n.saturating_mul(MS) },
    DirectionElement { feature: Features::TIMES, id: ie::END_MS, len: 8, get: |s| s.last_ns / MS, set: |s, n| s.last_ns = n.saturating_mul(MS) },
    DirectionElement { feature: Features::TCP_FLAGS, id: ie::TCP_FLAGS, len: 2, get: |s| s.tcp_flags.into(), set: |s, n| s.tcp_flags = n as u8 },
    DirectionElement { feature: Features::TOS, id: ie::TOS, len: 1, get: |s| s.tos.into(), set: |s, n| s.tos = n as u8 },
    DirectionElement { feature: Features::TTL, id: ie::TTL_MIN, len: 1, get: |s| s.ttl_min.into(), set: |s, n| s.ttl_min = n as u8 },
    DirectionElement { feature: Features::TTL, id: ie::TTL_MAX, len: 1, get: |s| s.ttl_max.into(), set: |s, n| s.ttl_max = n as u8 },
    DirectionElement { feature: Features::SIZES, id: ie::LEN_MIN, len: 2, get: |s| s.len_min.into(), set: |s, n| s.len_min = n as u16 },
    DirectionElement { feature: Features::SIZES, id: ie::LEN_MAX, len: 2, get: |s| s.len_max.into(), set: |s, n| s.len_max = n as u16 },
];

fn direction_elements(features: Features) -> impl Iterator<Item = &'static DirectionElement> {
    DIRECTION.iter().filter(move |e| features.has(e.feature))
}

/// The per-direction fields of `features` as `dialect` writes them (reversed for a
/// biflow's other direction).
fn direction_fields(dialect: Dialect, features: Features, pen: u32) -> Vec<Field> {
    direction_elements(features)
        .map(|e| dialect.direction_field(e, pen))
        .collect()
}

/// The fields of the template for one family, in IPFIX.
pub fn template_fields(features: Features, v6: bool, biflow: bool) -> Vec<Field> {
    dialect_template_fields(Dialect::Ipfix, features, v6, biflow)
}

/// The fields of the template for one family in `dialect`: NetFlow v9 has no enterprise
/// elements, so neither inter-arrival times nor a biflow's reverse elements (it sends a
/// biflow as two records).
fn dialect_template_fields(
    dialect: Dialect,
    features: Features,
    v6: bool,
    biflow: bool,
) -> Vec<Field> {
    let mut f = if v6 {
        vec![iana(ie::SRC_V6, 16), iana(ie::DST_V6, 16)]
    } else {
        vec![iana(ie::SRC_V4, 4), iana(ie::DST_V4, 4)]
    };
    f.extend([
        iana(ie::SRC_PORT, 2),
        iana(ie::DST_PORT, 2),
        iana(ie::PROTOCOL, 1),
    ]);
    f.extend(direction_fields(dialect, features, 0));
    let enterprise = dialect == Dialect::Ipfix;
    if features.has(Features::IAT) && enterprise {
        f.push(Field {
            id: ie::IAT_MIN,
            len: 8,
            pen: STATEPLANE_PEN,
        });
        f.push(Field {
            id: ie::IAT_MAX,
            len: 8,
            pen: STATEPLANE_PEN,
        });
    }
    if features.has(Features::PORTS) {
        f.extend([iana(ie::INGRESS, 4), iana(ie::EGRESS, 4)]);
    }
    if features.has(Features::VLAN) {
        f.push(iana(ie::VLAN, 2));
    }
    if features.has(Features::ICMP) {
        f.push(iana(if v6 { ie::ICMP_V6 } else { ie::ICMP_V4 }, 2));
    }
    if features.has(Features::END_REASON) {
        f.push(iana(ie::END_REASON, 1));
    }
    if features.has(Features::FORWARDING) {
        f.push(iana(ie::FORWARDING_STATUS, 1));
        if enterprise {
            f.push(Field {
                id: ie::DROP_REASON,
                len: 1,
                pen: STATEPLANE_PEN,
            });
        }
    }
    if biflow && enterprise {
        f.extend(direction_fields(dialect, features, REVERSE_PEN));
    }
    f
}

/// When templates are sent again (UDP: a collector may start after the exporter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TemplateRefresh {
    pub every_messages: Option<u32>,
    pub every_s: Option<u64>,
}

impl TemplateRefresh {
    /// UDP defaults: every 4,096 messages or 60 s, whichever comes first.
    pub const UDP: TemplateRefresh = TemplateRefresh {
        every_messages: Some(4096),
        every_s: Some(60),
    };
    /// Reliable transports and files: once.
    pub const ONCE: TemplateRefresh = TemplateRefresh {
        every_messages: None,
        every_s: None,
    };
}

/// The lengths an IPFIX message may have here: what the header's 16-bit length field
/// allows, and no less than the 512 bytes RFC 7011 lets an exporter assume a path carries.
pub const MESSAGE_LEN: std::ops::RangeInclusive<usize> = 512..=65_535;

/// Turns flow records into IPFIX (or NetFlow v9) messages for one observation domain.
///
/// Each message holds the records of one address family, or the templates alone, so that
/// full messages of a family are all the same size: a UDP sender can then hand the kernel
/// many at once to cut into datagrams (generic segmentation offload).
pub struct Encoder {
    dialect: Dialect,
    domain: u32,
    max_message: usize,
    /// IPFIX: data records sent in earlier messages (RFC 7011's sequence number); NetFlow
    /// v9: messages sent before (RFC 3954's). Mod 2^32.
    sequence: u32,
    /// The message of the templates alone, made once; its export time and sequence number
    /// are filled in each time it is sent.
    templates: Vec<u8>,
    record_len: [usize; 2],
    features: Features,
    /// The per-direction elements of `features`, picked once, each with the length it
    /// goes out in.
    direction: Vec<(&'static DirectionElement, u16)>,
    /// IPFIX biflows: both directions in one record (RFC 5103). NetFlow v9 has no reverse
    /// elements: its biflows go out as two one-way records (`split_biflows`).
    biflow: bool,
    split_biflows: bool,
    /// NetFlow v9: when the exporter "booted", in ms since the epoch: flow times and the
    /// header's uptime count from it (see [`Encoder::boot_for`]).
    boot_ms: Option<u64>,
    refresh: TemplateRefresh,
    messages_since_templates: Option<u32>,
    templates_sent_s: u64,
    /// The message being filled for each family (IPv4, IPv6), the full ones waiting to go
    /// out at the end of the `encode` call, and emptied ones to fill again.
    open: [Message; 2],
    full: [Vec<Message>; 2],
    spare: Vec<Message>,
    export_s: u32,
    pub messages: u64,
    /// Records sent (a NetFlow v9 biflow is two).
    pub records: u64,
}

/// A message being filled: empty, or its header and one data set (whose header is at
/// the dialect's header length) with `records` records.
#[derive(Default)]
struct Message {
    buf: Vec<u8>,
    records: u32,
    /// NetFlow v9: the boot time its records' times count from.
    boot_ms: u64,
}

impl Message {
    fn new(capacity: usize) -> Message {
        Message {
            buf: Vec::with_capacity(capacity),
            records: 0,
            boot_ms: 0,
        }
    }
}

/// NetFlow v9's uptime, a u32 of milliseconds, wraps after 49.7 days. The encoder's boot
/// is put this far before its first message, so that flows that began up to 24.8 days
/// earlier have times in range...
const UPTIME_AT_START_MS: u64 = 1 << 31;
/// ...and moved forward again (to the same distance) when a message would start this far
/// from it, which leaves 12 days for a message to stay open before its uptime could wrap.
const UPTIME_REBASE_MS: u64 = (1 << 32) - (1 << 30);

/// A message header of `domain` in `dialect`; its length or record count, times and
/// sequence number are filled in when it is sent.
fn write_header(b: &mut Vec<u8>, dialect: Dialect, domain: u32) {
    b.extend_from_slice(&dialect.version().to_be_bytes());
    b.resize(b.len() + dialect.header_len() - 6, 0);
    b.extend_from_slice(&domain.to_be_bytes());
}

/// A message of `domain`'s two templates (IPv4, IPv6) alone, in one template set.
fn templates_message(dialect: Dialect, domain: u32, templates: &[Vec<Field>; 2]) -> Vec<u8> {
    let mut b = Vec::new();
    write_header(&mut b, dialect, domain);
    b.extend_from_slice(&dialect.template_set_id().to_be_bytes());
    b.extend_from_slice(&[0, 0]);
    for (id, fields) in [TEMPLATE_V4, TEMPLATE_V6].iter().zip(templates) {
        b.extend_from_slice(&id.to_be_bytes());
        b.extend_from_slice(&(fields.len() as u16).to_be_bytes());
        for f in fields {
            let id = if f.pen != 0 { f.id | 0x8000 } else { f.id };
            b.extend_from_slice(&id.to_be_bytes());
            b.extend_from_slice(&f.len.to_be_bytes());
            if f.pen != 0 {
                b.extend_from_slice(&f.pen.to_be_bytes());
            }
        }
    }
    b
}

impl Encoder {
    /// An IPFIX encoder whose messages are at most `max_message` bytes (e.g. 1,400 for UDP
    /// on an Ethernet path), brought into [`MESSAGE_LEN`].
    pub fn new(
        domain: u32,
        features: Features,
        biflow: bool,
        max_message: usize,
        refresh: TemplateRefresh,
    ) -> Encoder {
        Self::in_dialect(
            Dialect::Ipfix,
            domain,
            features,
            biflow,
            max_message,
            refresh,
        )
    }

    /// An encoder of `dialect`, as [`Encoder::new`]. The caller refuses what the dialect
    /// cannot carry ([`Dialect::refuses`]); NetFlow v9 leaves it out of its template.
    pub fn in_dialect(
        dialect: Dialect,
        domain: u32,
        features: Features,
        biflow: bool,
        max_message: usize,
        refresh: TemplateRefresh,
    ) -> Encoder {
        let templates = [
            dialect_template_fields(dialect, features, false, biflow),
            dialect_template_fields(dialect, features, true, biflow),
        ];
        let len = |t: &[Field]| t.iter().map(|f| usize::from(f.len)).sum();
        let max_message = max_message.clamp(*MESSAGE_LEN.start(), *MESSAGE_LEN.end());
        Encoder {
            dialect,
            domain,
            max_message,
            sequence: 0,
            record_len: [len(&templates[0]), len(&templates[1])],
            templates: templates_message(dialect, domain, &templates),
            features,
            direction: direction_elements(features)
                .map(|e| (e, dialect.direction_field(e, 0).len))
                .collect(),
            biflow: biflow && dialect == Dialect::Ipfix,
            split_biflows: biflow && dialect == Dialect::Netflow9,
            boot_ms: None,
            refresh,
            messages_since_templates: None,
            templates_sent_s: 0,
            open: [Message::new(max_message), Message::new(max_message)],
            full: [Vec::new(), Vec::new()],
            spare: Vec::new(),
            export_s: 0,
            messages: 0,
            records: 0,
        }
    }

    /// The sequence number the next message will carry.
    pub fn sequence(&self) -> u32 {
        self.sequence
    }

    /// Starts a new stream (a new TCP connection to the collector): its sequence numbers
    /// count from 0 again (RFC 7011 3.1 counts "in the current stream"), and its first
    /// message holds the templates. Records already encoded but not yet sent go in it.
    pub fn new_stream(&mut self) {
        self.sequence = 0;
        self.messages_since_templates = None;
    }

    /// Encodes `records` exported at `export_s` (seconds since the epoch), handing each
    /// finished message to `emit`: those of IPv4, then those of IPv6, so that a sender
    /// meets long runs of one size. The last, partly filled message of each family waits
    /// for more records or [`Encoder::finish`].
    pub fn encode(&mut self, records: &[FlowRecord], export_s: u32, emit: &mut dyn FnMut(&[u8])) {
        self.encode_counted(records, export_s, &mut |m, _| emit(m));
    }

    /// As [`Encoder::encode`], handing `emit` each message with the data records it holds
    /// (0 for templates): what a transport that loses messages counts as lost.
    pub fn encode_counted(
        &mut self,
        records: &[FlowRecord],
        export_s: u32,
        emit: &mut dyn FnMut(&[u8], u32),
    ) {
        self.export_s = export_s;
        for r in records {
            if self.split_biflows {
                self.add(&FlowRecord {
                    reverse: None,
                    ..*r
                });
                if let Some(reverse) = r.reverse.filter(|s| s.packets > 0) {
                    self.add(&FlowRecord {
                        key: r.key.reversed(),
                        forward: reverse,
                        reverse: None,
                        end: r.end,
                    });
                }
            } else {
                self.add(r);
            }
        }
        for family in 0..2 {
            let mut full = std::mem::take(&mut self.full[family]);
            for mut m in full.drain(..) {
                self.send(&mut m, emit);
                self.spare.push(m);
            }
            self.full[family] = full;
        }
    }

    /// Appends `r` to the open message of its family, putting that message aside as full
    /// first if `r` would not fit (with NetFlow v9's padding to 4 bytes).
    fn add(&mut self, r: &FlowRecord) {
        let v6 = usize::from(r.key.ip_version == 6);
        let padding = match self.dialect {
            Dialect::Ipfix => 0,
            Dialect::Netflow9 => 3,
        };
        let open = &self.open[v6].buf;
        if !open.is_empty() && open.len() + self.record_len[v6] + padding > self.max_message {
            let spare = self
                .spare
                .pop()
                .unwrap_or_else(|| Message::new(self.max_message));
            let full = std::mem::replace(&mut self.open[v6], spare);
            self.full[v6].push(full);
        }
        if self.open[v6].buf.is_empty() {
            self.start_message(v6);
        }
        self.write_record(r, v6);
    }

    /// Sends the partly filled messages, if any.
    pub fn finish(&mut self, emit: &mut dyn FnMut(&[u8])) {
        self.finish_counted(&mut |m, _| emit(m));
    }

    /// As [`Encoder::finish`], with each message's data records (see
    /// [`Encoder::encode_counted`]).
    pub fn finish_counted(&mut self, emit: &mut dyn FnMut(&[u8], u32)) {
        for family in 0..2 {
            let mut m = std::mem::take(&mut self.open[family]);
            self.send(&mut m, emit);
            self.open[family] = m;
        }
    }

    /// Sends `m` if it holds anything (and empties it), after the templates if they are
    /// due (in a message of their own, so that they go out before any data that uses
    /// them, whichever family's message fills first). Its sequence number is filled in
    /// here, so that the numbers follow the order messages go out in.
    fn send(&mut self, m: &mut Message, emit: &mut dyn FnMut(&[u8], u32)) {
        if m.buf.is_empty() {
            return;
        }
        if self.templates_due() {
            self.send_templates(emit);
        }
        if let Some(n) = &mut self.messages_since_templates {
            *n += 1;
        }
        let seal = self.seal_of(m.records, m.boot_ms);
        seal.apply(&mut m.buf);
        emit(&m.buf, m.records);
        self.sent(m.records);
        m.records = 0;
        m.buf.clear();
    }

    /// Counts a message of `records` data records as sent: its records, and the next
    /// message's sequence number.
    fn sent(&mut self, records: u32) {
        self.messages += 1;
        self.records += u64::from(records);
        let step = match self.dialect {
            Dialect::Ipfix => records,
            Dialect::Netflow9 => 1,
        };
        self.sequence = self.sequence.wrapping_add(step);
    }

    /// What a message of `records` records (templates: 0) whose times count from
    /// `boot_ms` carries in its header, were it sent now.
    fn seal_of(&self, records: u32, boot_ms: u64) -> Seal {
        Seal {
            dialect: self.dialect,
            sequence: self.sequence,
            export_s: self.export_s,
            records,
            boot_ms,
        }
    }

    fn templates_due(&self) -> bool {
        match self.messages_since_templates {
            None => true,
            Some(n) => {
                self.refresh.every_messages.is_some_and(|m| n >= m)
                    || self
                        .refresh
                        .every_s
                        .is_some_and(|s| u64::from(self.export_s) >= self.templates_sent_s + s)
            }
        }
    }

    /// Sends a message of the templates alone (NetFlow v9 counts its two template records
    /// in its header).
    fn send_templates(&mut self, emit: &mut dyn FnMut(&[u8], u32)) {
        let boot_ms = self.boot_for(u64::from(self.export_s) * 1000);
        let mut seal = self.seal_of(0, boot_ms);
        if self.dialect == Dialect::Netflow9 {
            seal.records = 2;
        }
        seal.apply(&mut self.templates);
        emit(&self.templates, 0);
        self.sent(0);
        self.messages_since_templates = Some(0);
        self.templates_sent_s = u64::from(self.export_s);
    }

    /// NetFlow v9's boot time for a message started at `now_ms`: fixed at the first
    /// message, `UPTIME_AT_START_MS` before it, and moved forward as the uptime nears its
    /// wrap (a message keeps the boot it started with).
    fn boot_for(&mut self, now_ms: u64) -> u64 {
        let rebase = now_ms.saturating_sub(UPTIME_AT_START_MS);
        let boot = match self.boot_ms {
            Some(b) if now_ms.saturating_sub(b) < UPTIME_REBASE_MS => b,
            _ => rebase,
        };
        self.boot_ms = Some(boot);
        boot
    }

    /// Starts the message of `family`: the header and the family's data set header.
    fn start_message(&mut self, family: usize) {
        let mut b = std::mem::take(&mut self.open[family].buf);
        write_header(&mut b, self.dialect, self.domain);
        let template = TEMPLATE_V4 + family as u16;
        b.extend_from_slice(&template.to_be_bytes());
        b.extend_from_slice(&[0, 0]);
        self.open[family].buf = b;
        if self.dialect == Dialect::Netflow9 {
            self.open[family].boot_ms = self.boot_for(u64::from(self.export_s) * 1000);
        }
    }

    /// Appends `r` to the open data set of its family (`v6`: 0 or 1).
    fn write_record(&mut self, r: &FlowRecord, v6: usize) {
        let f = self.features;
        self.open[v6].records += 1;
        // NetFlow v9's flow times count from the message's boot; IPFIX's from the epoch.
        let time_base_ms = self.open[v6].boot_ms;
        let b = &mut self.open[v6].buf;
        // The record's place is made first, at its template's length, and each field is
        // then a store at a known place: pushing field by field onto the growing message
        // took 400 instructions a record.
        let start = b.len();
        b.resize(start + self.record_len[v6], 0);
        let mut w = RecordWriter {
            out: &mut b[start..],
            at: 0,
            time_base_ms,
        };
        let k = &r.key;
        if v6 == 1 {
            w.put(k.src);
            w.put(k.dst);
        } else {
            w.put([k.src[0], k.src[1], k.src[2], k.src[3]]);
            w.put([k.dst[0], k.dst[1], k.dst[2], k.dst[3]]);
        }
        let icmp = matches!(k.proto, 1 | 58);
        // ICMP's type and code ride in the key's destination port; IPFIX has them apart.
        let (sport, dport) = if icmp {
            (0, 0)
        } else {
            (k.src_port, k.dst_port)
        };
        w.put(sport.to_be_bytes());
        w.put(dport.to_be_bytes());
        w.put([k.proto]);
        w.direction(&self.direction, &r.forward);
        if f.has(Features::IAT) && self.dialect == Dialect::Ipfix {
            let s = &r.forward;
            w.put(s.iat_min().unwrap_or(0).to_be_bytes());
            w.put(s.iat_max_ns.to_be_bytes());
        }
        let fate = Fate::of(r.forward.out_port);
        if f.has(Features::PORTS) {
            let port = |p: Option<u16>| p.map_or(0, |p| u32::from(p) + 1);
            w.put(port(Fate::of(r.forward.in_port).port()).to_be_bytes());
            w.put(port(fate.port()).to_be_bytes());
        }
        if f.has(Features::VLAN) {
            w.put(k.vlan.to_be_bytes());
        }
        if f.has(Features::ICMP) {
            w.put((if icmp { k.dst_port } else { 0 }).to_be_bytes());
        }
        if f.has(Features::END_REASON) {
            w.put([r.end as u8]);
        }
        if f.has(Features::FORWARDING) {
            w.put([fate.forwarding_status()]);
            if self.dialect == Dialect::Ipfix {
                let reason = match fate {
                    Fate::Dropped(r) => r,
                    _ => 0,
                };
                w.put([reason]);
            }
        }
        if self.biflow {
            let none = FlowStats::ZERO;
            w.direction(&self.direction, r.reverse.as_ref().unwrap_or(&none));
        }
        debug_assert_eq!(w.at, self.record_len[v6], "the record fills its template");
    }
}

/// What a message's header carries, filled in as it leaves.
struct Seal {
    dialect: Dialect,
    sequence: u32,
    /// When it leaves (RFC 7011 3.1): for a message filled across several batches, the
    /// last one's time, not the first.
    export_s: u32,
    /// NetFlow v9's record count (IPFIX has a length instead).
    records: u32,
    boot_ms: u64,
}

impl Seal {
    /// Fills in a finished message's header and its one set's length (the set runs to the
    /// message's end; NetFlow v9 pads it to 4 bytes first, RFC 3954 5.3).
    fn apply(&self, message: &mut Vec<u8>) {
        let set_at = self.dialect.header_len();
        let (seq_at, export_at) = match self.dialect {
            Dialect::Ipfix => {
                let len = message.len() as u16;
                message[2..4].copy_from_slice(&len.to_be_bytes());
                (8, 4)
            }
            Dialect::Netflow9 => {
                let padded = set_at + (message.len() - set_at).next_multiple_of(4);
                message.resize(padded, 0);
                let uptime = (u64::from(self.export_s) * 1000).saturating_sub(self.boot_ms);
                let uptime = u32::try_from(uptime).unwrap_or(u32::MAX);
                message[2..4].copy_from_slice(&(self.records as u16).to_be_bytes());
                message[4..8].copy_from_slice(&uptime.to_be_bytes());
                (12, 8)
            }
        };
        message[export_at..export_at + 4].copy_from_slice(&self.export_s.to_be_bytes());
        message[seq_at..seq_at + 4].copy_from_slice(&self.sequence.to_be_bytes());
        let set_len = (message.len() - set_at) as u16;
        message[set_at + 2..set_at + 4].copy_from_slice(&set_len.to_be_bytes());
    }
}

/// Writes one record's fields in order into the place made for it.
///
/// Invariant: the place is the template's record length, which the same features give
/// (`template_fields`), so no write runs past it.
struct RecordWriter<'a> {
    out: &'a mut [u8],
    at: usize,
    /// Subtracted from flow times (ms): NetFlow v9's boot, 0 for IPFIX.
    time_base_ms: u64,
}

impl RecordWriter<'_> {
    fn put<const N: usize>(&mut self, bytes: [u8; N]) {
        self.out[self.at..self.at + N].copy_from_slice(&bytes);
        self.at += N;
    }

    /// A direction's `elements`, each in its length (the low bytes of its value; a flow
    /// time from the time base, brought into its length: a NetFlow v9 flow that began
    /// before its exporter's boot reads as beginning at it).
    fn direction(&mut self, elements: &[(&DirectionElement, u16)], s: &FlowStats) {
        for &(e, len) in elements {
            let mut v = (e.get)(s);
            if e.feature == Features::TIMES {
                v = v.saturating_sub(self.time_base_ms);
                if len == 4 {
                    v = v.min(u64::from(u32::MAX));
                }
            }
            match len {
                1 => self.put([v as u8]),
                2 => self.put((v as u16).to_be_bytes()),
                4 => self.put((v as u32).to_be_bytes()),
                _ => self.put(v.to_be_bytes()),
            }
        }
    }
}

/// Why a message could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than its header, or than the length it declares.
    Truncated,
    BadVersion(u16),
    /// A set whose length runs past the message or is below a set header.
    BadSetLength,
    /// A template with a field count or a length the set cannot hold.
    BadTemplate,
    /// A data set for a template not seen (yet) in this domain.
    UnknownTemplate(u16),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Truncated => f.write_str("message truncated"),
            DecodeError::BadVersion(v) => {
                write!(f, "version {v}, not 10 (IPFIX) or 9 (NetFlow v9)")
            }
            DecodeError::BadSetLength => f.write_str("set length runs past the message"),
            DecodeError::BadTemplate => f.write_str("malformed template"),
            DecodeError::UnknownTemplate(t) => write!(f, "data set for unknown template {t}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// A bounds-checked reader over a byte slice.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
}

/// A decoded message's header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// 10 (IPFIX) or 9 (NetFlow v9).
    pub version: u16,
    pub export_s: u32,
    pub sequence: u32,
    pub domain: u32,
}

/// Reads IPFIX and NetFlow v9 messages back into records (the elements this module
/// writes; others skipped).
#[derive(Default)]
pub struct Decoder {
    templates: HashMap<(u16, u32, u16), Vec<Field>>,
}

fn uint(b: &[u8]) -> u64 {
    b.iter().fold(0, |acc, &x| acc << 8 | u64::from(x))
}

impl Decoder {
    /// Decodes one message (IPFIX, or NetFlow v9 in a datagram of its own); returns its
    /// header and records.
    pub fn decode(&mut self, msg: &[u8]) -> Result<(Header, Vec<FlowRecord>), DecodeError> {
        let mut r = Reader(msg);
        let version = r.u16().ok_or(DecodeError::Truncated)?;
        let (dialect, header, len, boot_ms) = match version {
            VERSION => {
                let len = usize::from(r.u16().ok_or(DecodeError::Truncated)?);
                if len < HEADER_LEN || len > msg.len() {
                    return Err(DecodeError::Truncated);
                }
                let header = Header {
                    version,
                    export_s: r.u32().ok_or(DecodeError::Truncated)?,
                    sequence: r.u32().ok_or(DecodeError::Truncated)?,
                    domain: r.u32().ok_or(DecodeError::Truncated)?,
                };
                (Dialect::Ipfix, header, len, 0)
            }
            VERSION_NETFLOW9 => {
                // The record count is not needed to read the sets, which run to the end.
                r.u16().ok_or(DecodeError::Truncated)?;
                let uptime_ms = r.u32().ok_or(DecodeError::Truncated)?;
                let header = Header {
                    version,
                    export_s: r.u32().ok_or(DecodeError::Truncated)?,
                    sequence: r.u32().ok_or(DecodeError::Truncated)?,
                    domain: r.u32().ok_or(DecodeError::Truncated)?,
                };
                let boot_ms =
                    (u64::from(header.export_s) * 1000).saturating_sub(u64::from(uptime_ms));
                (Dialect::Netflow9, header, msg.len(), boot_ms)
            }
            _ => return Err(DecodeError::BadVersion(version)),
        };
        let mut body = Reader(&msg[dialect.header_len()..len]);
        let mut records = Vec::new();
        while !body.0.is_empty() {
            let id = body.u16().ok_or(DecodeError::BadSetLength)?;
            let set_len = usize::from(body.u16().ok_or(DecodeError::BadSetLength)?);
            let content = set_len
                .checked_sub(SET_HEADER_LEN)
                .and_then(|n| body.take(n))
                .ok_or(DecodeError::BadSetLength)?;
            if id == dialect.template_set_id() {
                self.read_templates(version, header.domain, content)?;
                continue;
            }
            if id <= 255 {
                continue; // options templates and reserved sets: not ours
            }
            let fields = self
                .templates
                .get(&(version, header.domain, id))
                .ok_or(DecodeError::UnknownTemplate(id))?;
            let rec_len: usize = fields.iter().map(|f| usize::from(f.len)).sum();
            // A record is at least a byte, and what is left shorter than one is padding.
            let mut data = Reader(content);
            while rec_len > 0 && data.0.len() >= rec_len {
                let rec = data.take(rec_len).ok_or(DecodeError::Truncated)?;
                records.push(record_of(fields, rec, boot_ms));
            }
        }
        Ok((header, records))
    }

    fn read_templates(
        &mut self,
        version: u16,
        domain: u32,
        content: &[u8],
    ) -> Result<(), DecodeError> {
        let mut r = Reader(content);
        while r.0.len() >= 4 {
            let id = r.u16().ok_or(DecodeError::BadTemplate)?;
            let count = r.u16().ok_or(DecodeError::BadTemplate)?;
            let mut fields = Vec::with_capacity(usize::from(count).min(256));
            for _ in 0..count {
                let raw = r.u16().ok_or(DecodeError::BadTemplate)?;
                let len = r.u16().ok_or(DecodeError::BadTemplate)?;
                // NetFlow v9 has no enterprise bit: its ids run to 65,535.
                let pen = if raw & 0x8000 != 0 && version == VERSION {
                    r.u32().ok_or(DecodeError::BadTemplate)?
                } else {
                    0
                };
                if len == 0xffff {
                    return Err(DecodeError::BadTemplate); // variable length: we never send it
                }
                fields.push(Field {
                    id: if version == VERSION {
                        raw & 0x7fff
                    } else {
                        raw
                    },
                    len,
                    pen,
                });
            }
            self.templates.insert((version, domain, id), fields);
        }
        Ok(())
    }
}

/// The record `rec` of template `fields`; NetFlow v9's flow times count from `boot_ms`.
fn record_of(fields: &[Field], mut rec: &[u8], boot_ms: u64) -> FlowRecord {
    let mut key = FlowKey::EMPTY;
    let (mut fwd, mut rev) = (FlowStats::ZERO, FlowStats::ZERO);
    let mut end = EndReason::Forced;
    let mut icmp = 0;
    let (mut status, mut drop_reason) = (None, 0);
    for f in fields {
        let (v, rest) = rec.split_at(usize::from(f.len));
        rec = rest;
        let n = uint(v);
        let s = match f.pen {
            0 => &mut fwd,
            REVERSE_PEN => &mut rev,
            _ => {
                match f.id {
                    ie::IAT_MIN => fwd.iat_min_ns = n,
                    ie::IAT_MAX => fwd.iat_max_ns = n,
                    ie::DROP_REASON => drop_reason = n as u8,
                    _ => {}
                }
                continue;
            }
        };
        if let Some(e) = DIRECTION.iter().find(|e| e.id == f.id) {
            (e.set)(s, n);
            continue;
        }
        match f.id {
            ie::SRC_V4 | ie::SRC_V6 => {
                key.ip_version = if f.id == ie::SRC_V4 { 4 } else { 6 };
                key.src[..v.len().min(16)].copy_from_slice(&v[..v.len().min(16)]);
            }
            ie::DST_V4 | ie::DST_V6 => {
                key.dst[..v.len().min(16)].copy_from_slice(&v[..v.len().min(16)])
            }
            ie::SRC_PORT => key.src_port = n as u16,
            ie::DST_PORT => key.dst_port = n as u16,
            ie::PROTOCOL => key.proto = n as u8,
            ie::VLAN => key.vlan = n as u16,
            ie::ICMP_V4 | ie::ICMP_V6 => icmp = n as u16,
            ie::INGRESS => s.in_port = (n as u16).wrapping_sub(1),
            ie::EGRESS => s.out_port = (n as u16).wrapping_sub(1),
            ie::FORWARDING_STATUS => status = Some(n),
            ie::FIRST_SWITCHED => s.first_ns = (boot_ms + n).saturating_mul(MS),
            ie::LAST_SWITCHED => s.last_ns = (boot_ms + n).saturating_mul(MS),
            ie::END_REASON => {
                end = EndReason::ALL
                    .into_iter()
                    .find(|e| *e as u64 == n)
                    .unwrap_or(EndReason::Forced)
            }
            _ => {}
        }
    }
    if matches!(key.proto, 1 | 58) {
        key.dst_port = icmp;
    }
    // What did not leave by a port has an egress of 0; its status says what it met.
    match status.map(|s| s >> 6) {
        Some(2) => fwd.out_port = Fate::Dropped(drop_reason).code(),
        Some(3) => fwd.out_port = Fate::ToControl.code(),
        _ => {}
    }
    FlowRecord {
        key,
        forward: fwd,
        reverse: (rev.packets != 0).then_some(rev),
        end,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow_stats::Observation;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn record(key: FlowKey, packets: u64, reverse: bool) -> FlowRecord {
        let o = Observation {
            ts_ns: 1_700_000_000_123_000_000,
            ip_len: 1500,
            ttl: 63,
            tos: 0x20,
            tcp_flags: 0x12,
            in_port: 0,
            out_port: 1,
        };
        let mut s = FlowStats::start(&o);
        for i in 1..packets {
            s.add(&Observation {
                ts_ns: o.ts_ns + i * 2_000_000,
                ip_len: 40,
                ..o
            });
        }
        FlowRecord {
            key,
            forward: s,
            reverse: reverse.then_some(s),
            end: EndReason::Idle,
        }
    }

    /// The records of IP version `v`, in order.
    fn family(rs: &[FlowRecord], v: u8) -> Vec<FlowRecord> {
        rs.iter()
            .filter(|r| r.key.ip_version == v)
            .cloned()
            .collect()
    }

    fn round_trip(features: Features, biflow: bool, records: &[FlowRecord]) -> Vec<FlowRecord> {
        round_trip_in(Dialect::Ipfix, features, biflow, records)
    }

    /// Encodes `records` in `dialect` and decodes them back, checking each message's
    /// header as the dialect defines it.
    fn round_trip_in(
        dialect: Dialect,
        features: Features,
        biflow: bool,
        records: &[FlowRecord],
    ) -> Vec<FlowRecord> {
        let mut enc = Encoder::in_dialect(dialect, 7, features, biflow, 1400, TemplateRefresh::UDP);
        let mut msgs = Vec::new();
        enc.encode(records, 1_700_000_000, &mut |m| msgs.push(m.to_vec()));
        enc.finish(&mut |m| msgs.push(m.to_vec()));
        let mut dec = Decoder::default();
        let mut out = Vec::new();
        let mut expected_seq = 0u32;
        for (i, m) in msgs.iter().enumerate() {
            assert!(m.len() <= 1400);
            let (h, recs) = dec.decode(m).unwrap();
            assert_eq!(h.version, dialect.version());
            assert_eq!(h.domain, 7);
            assert_eq!(h.sequence, expected_seq, "message {i}");
            match dialect {
                // Records sent before this message.
                Dialect::Ipfix => expected_seq += recs.len() as u32,
                // Messages sent before it; its record count (the templates message's two
                // template records), its set's length a multiple of 4 running to its end.
                Dialect::Netflow9 => {
                    expected_seq += 1;
                    let count = u16::from_be_bytes([m[2], m[3]]);
                    let want = if i == 0 { 2 } else { recs.len() };
                    assert_eq!(usize::from(count), want, "message {i}");
                    let set_len = u16::from_be_bytes([m[22], m[23]]);
                    assert_eq!(usize::from(set_len), m.len() - 20);
                    assert_eq!(set_len % 4, 0);
                }
            }
            out.extend(recs);
        }
        assert_eq!(enc.records, out.len() as u64);
        out
    }

    #[test]
    fn records_round_trip_in_both_families() {
        let v4 = FlowKey::v4(
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 18, 0, 2),
            6,
            1234,
            80,
        );
        let v6 = FlowKey::v6(
            "2001:db8::1".parse::<Ipv6Addr>().unwrap(),
            "2001:db8::2".parse::<Ipv6Addr>().unwrap(),
            17,
            53,
            5353,
        );
        let records: Vec<FlowRecord> = (0..200u64)
            .map(|i| record(if i % 3 == 0 { v6 } else { v4 }, 1 + i % 5, false))
            .collect();
        let back = round_trip(Features::ALL, false, &records);
        assert_eq!(back.len(), records.len());
        // Each message holds one family: within a family, records keep their order.
        let pairs = [4, 6].map(|v| (family(&records, v), family(&back, v)));
        for (a, b) in pairs.iter().flat_map(|(a, b)| a.iter().zip(b)) {
            assert_eq!(a.key, b.key);
            let (x, y) = (&a.forward, &b.forward);
            assert_eq!(
                (x.packets, x.bytes, x.tcp_flags, x.tos),
                (y.packets, y.bytes, y.tcp_flags, y.tos)
            );
            assert_eq!(
                (x.first_ns / 1_000_000, x.last_ns / 1_000_000),
                (y.first_ns / 1_000_000, y.last_ns / 1_000_000)
            );
            assert_eq!(
                (x.ttl_min, x.ttl_max, x.len_min, x.len_max),
                (y.ttl_min, y.ttl_max, y.len_min, y.len_max)
            );
            assert_eq!(
                (x.iat_max_ns, x.in_port, x.out_port),
                (y.iat_max_ns, y.in_port, y.out_port)
            );
            assert_eq!(b.end, EndReason::Idle);
        }
        let bi = round_trip(
            Features::DEFAULT,
            true,
            &[record(v4, 3, true), record(v6, 2, false)],
        );
        assert_eq!(bi[0].reverse.map(|r| r.packets), Some(3));
        assert_eq!(bi[1].reverse, None);
    }

    /// Each message holds one family; the full ones of a family are all the same size, and
    /// one `encode` call hands out its IPv4 messages, then its IPv6 ones: long runs of one
    /// size for a sender to hand the kernel at once.
    #[test]
    fn full_messages_of_a_family_are_one_size_and_come_in_runs() {
        let v4 = FlowKey::v4(
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 18, 0, 2),
            6,
            1,
            2,
        );
        let v6 = FlowKey::v6(
            "2001:db8::1".parse::<Ipv6Addr>().unwrap(),
            "2001:db8::2".parse::<Ipv6Addr>().unwrap(),
            6,
            1,
            2,
        );
        let records: Vec<FlowRecord> = (0..5_000u64)
            .map(|i| record(if i % 5 == 0 { v6 } else { v4 }, 1, false))
            .collect();
        let mut enc = Encoder::new(7, Features::DEFAULT, false, 1400, TemplateRefresh::UDP);
        let mut msgs = Vec::new();
        enc.encode(&records, 1, &mut |m| msgs.push(m.to_vec()));
        let set_id = |m: &Vec<u8>| u16::from_be_bytes([m[16], m[17]]);
        let ids: Vec<u16> = msgs.iter().map(set_id).collect();
        let runs = ids.windows(2).filter(|w| w[0] != w[1]).count();
        assert_eq!(ids[0], TEMPLATE_SET_ID);
        assert_eq!(runs, 2, "templates, then IPv4, then IPv6: {ids:?}");
        for template in [TEMPLATE_V4, TEMPLATE_V6] {
            let sizes: Vec<usize> = (msgs.iter())
                .filter(|m| set_id(m) == template)
                .map(Vec::len)
                .collect();
            assert!(sizes.len() > 5, "{sizes:?}");
            assert!(
                sizes.iter().all(|&n| n == sizes[0] && n <= 1400),
                "{sizes:?}"
            );
        }
    }

    #[test]
    fn templates_are_refreshed_and_errors_named() {
        let key = FlowKey::v4(
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 18, 0, 2),
            17,
            1,
            2,
        );
        let refresh = TemplateRefresh {
            every_messages: Some(3),
            every_s: None,
        };
        let mut enc = Encoder::new(1, Features::DEFAULT, false, 512, refresh);
        let mut msgs = Vec::new();
        enc.encode(&vec![record(key, 1, false); 100], 5, &mut |m| {
            msgs.push(m.to_vec())
        });
        // The templates in messages of their own, first, then again after every third
        // data message.
        let kinds: String = (msgs.iter())
            .map(|m| match m[16..18] == TEMPLATE_SET_ID.to_be_bytes() {
                true => 'T',
                false => 'D',
            })
            .collect();
        assert!(kinds.len() > 10, "{kinds}");
        assert!(
            kinds.starts_with("TDDDTDDDT") && !kinds.contains("DDDD") && !kinds.contains("TT"),
            "{kinds}"
        );
        // The template message is made once and sent again and again: each time with the
        // time of its sending and the sequence number of the records sent before it, as
        // every message (the data message left partly filled by the first batch leaves in
        // the second, with the second's time).
        let batch = msgs.len();
        enc.encode(&vec![record(key, 1, false); 30], 9, &mut |m| {
            msgs.push(m.to_vec())
        });
        enc.finish(&mut |m| msgs.push(m.to_vec()));
        assert!(
            msgs[batch..]
                .iter()
                .any(|m| m[16..18] == TEMPLATE_SET_ID.to_be_bytes())
        );
        let mut reader = Decoder::default();
        let mut records_before = 0;
        for (i, m) in msgs.iter().enumerate() {
            let (header, records) = reader.decode(m).unwrap();
            assert_eq!(header.sequence, records_before, "message {i}");
            let export_s = if i < batch { 5 } else { 9 };
            assert_eq!(header.export_s, export_s, "message {i}");
            records_before += records.len() as u32;
        }
        assert_eq!(records_before, 130);
        let mut dec = Decoder::default();
        assert_eq!(
            dec.decode(&msgs[1]).unwrap_err(),
            DecodeError::UnknownTemplate(TEMPLATE_V4)
        );
        assert_eq!(
            dec.decode(&msgs[0][..10]).unwrap_err(),
            DecodeError::Truncated
        );
        let mut bad = msgs[0].clone();
        bad[1] = 5; // NetFlow v5: no templates, not ours
        assert_eq!(dec.decode(&bad).unwrap_err(), DecodeError::BadVersion(5));
        bad = msgs[0].clone();
        bad[18] = 0xff;
        assert_eq!(dec.decode(&bad).unwrap_err(), DecodeError::BadSetLength);
    }

    fn v4_key(proto: u8) -> FlowKey {
        FlowKey::v4(
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::new(198, 18, 0, 2),
            proto,
            1234,
            80,
        )
    }

    /// NetFlow v9 carries what IPFIX does but the inter-arrival times (refused before any
    /// encoder is made) and writes a biflow as two one-way records, the second with the
    /// key turned round.
    #[test]
    fn netflow9_records_round_trip_and_biflows_go_out_as_two() {
        let v6 = FlowKey::v6(
            "2001:db8::1".parse::<Ipv6Addr>().unwrap(),
            "2001:db8::2".parse::<Ipv6Addr>().unwrap(),
            58,
            0,
            0x8000,
        );
        let all_but_iat = Features(Features::ALL.0 & !Features::IAT);
        assert!(
            Dialect::Netflow9
                .refuses(Features::ALL)
                .unwrap()
                .contains("iat")
        );
        assert_eq!(Dialect::Netflow9.refuses(all_but_iat), None);
        assert_eq!(Dialect::Ipfix.refuses(Features::ALL), None);
        let records: Vec<FlowRecord> = (0..300u64)
            .map(|i| record(if i % 3 == 0 { v6 } else { v4_key(6) }, 1 + i % 5, false))
            .collect();
        let back = round_trip_in(Dialect::Netflow9, all_but_iat, false, &records);
        assert_eq!(back.len(), records.len());
        for v in [4, 6] {
            for (a, b) in family(&records, v).iter().zip(&family(&back, v)) {
                assert_eq!(a.key, b.key);
                let (x, y) = (&a.forward, &b.forward);
                assert_eq!(
                    (x.packets, x.bytes, x.tcp_flags, x.tos, x.ttl_min, x.ttl_max),
                    (y.packets, y.bytes, y.tcp_flags, y.tos, y.ttl_min, y.ttl_max)
                );
                assert_eq!((x.len_min, x.len_max), (y.len_min, y.len_max));
                assert_eq!((x.in_port, x.out_port), (y.in_port, y.out_port));
                // Times to the millisecond, through the uptime.
                assert_eq!(
                    (x.first_ns / MS, x.last_ns / MS),
                    (y.first_ns / MS, y.last_ns / MS)
                );
                assert_eq!(b.end, EndReason::Idle);
            }
        }
        let bi = round_trip_in(
            Dialect::Netflow9,
            Features::DEFAULT,
            true,
            &[record(v4_key(17), 3, true), record(v4_key(6), 2, false)],
        );
        let keys: Vec<FlowKey> = bi.iter().map(|r| r.key).collect();
        assert_eq!(keys, [v4_key(17), v4_key(17).reversed(), v4_key(6)]);
        assert!(bi.iter().all(|r| r.reverse.is_none()));
        assert_eq!(bi.iter().map(|r| r.forward.packets).sum::<u64>(), 8);
    }

    /// A flow's fate goes out as forwardingStatus (both dialects) and, in IPFIX, the
    /// exact drop reason; it comes back as the record had it (NetFlow v9: dropped, for a
    /// reason it cannot say).
    #[test]
    fn a_flows_fate_goes_out_and_comes_back() {
        let fates = [Fate::Port(2), Fate::Dropped(17), Fate::ToControl];
        let records: Vec<FlowRecord> = (fates.iter())
            .map(|f| {
                let mut r = record(v4_key(6), 2, false);
                r.forward.out_port = f.code();
                r
            })
            .collect();
        let features = Features(Features::DEFAULT.0 | Features::FORWARDING);
        let back = round_trip(features, false, &records);
        let got: Vec<Fate> = back.iter().map(|r| Fate::of(r.forward.out_port)).collect();
        assert_eq!(got, fates);
        let back = round_trip_in(Dialect::Netflow9, features, false, &records);
        let got: Vec<Fate> = back.iter().map(|r| Fate::of(r.forward.out_port)).collect();
        assert_eq!(got, [Fate::Port(2), Fate::Dropped(0), Fate::ToControl]);
    }

    /// NetFlow v9's times are uptime milliseconds in 32 bits, which wrap after 49.7 days:
    /// flows that began up to 24 days before the first message read true, the boot moves
    /// forward before the uptime can wrap, and a flow older than the boot reads as
    /// beginning at it rather than wrapping.
    #[test]
    fn netflow9_times_hold_across_the_uptimes_wrap() {
        let day_ms = 86_400_000u64;
        let start_s = 1_700_000_000u32;
        let mut enc = Encoder::in_dialect(
            Dialect::Netflow9,
            1,
            Features::DEFAULT,
            false,
            1400,
            TemplateRefresh::UDP,
        );
        let mut dec = Decoder::default();
        let mut uptimes = Vec::new();
        let mut check = |enc: &mut Encoder, export_s: u32, first_ms: u64, want_first_ms: u64| {
            let mut r = record(v4_key(6), 1, false);
            r.forward.first_ns = first_ms * MS;
            r.forward.last_ns = u64::from(export_s) * 1000 * MS;
            let mut msgs = Vec::new();
            enc.encode(&[r], export_s, &mut |m| msgs.push(m.to_vec()));
            enc.finish(&mut |m| msgs.push(m.to_vec()));
            let mut got = Vec::new();
            for m in &msgs {
                uptimes.push(u32::from_be_bytes([m[4], m[5], m[6], m[7]]));
                got.extend(dec.decode(m).unwrap().1);
            }
            assert_eq!(got.len(), 1, "at {export_s}");
            assert_eq!(got[0].forward.first_ns / MS, want_first_ms, "at {export_s}");
            assert_eq!(got[0].forward.last_ns / MS, u64::from(export_s) * 1000);
        };
        let start_ms = u64::from(start_s) * 1000;
        // Began 20 days before the first message.
        check(
            &mut enc,
            start_s,
            start_ms - 20 * day_ms,
            start_ms - 20 * day_ms,
        );
        // 30 and 60 days on: past where the first boot's uptime would have wrapped.
        for days in [30, 45, 60, 200] {
            let now_s = start_s + (days * 86_400) as u32;
            let now_ms = u64::from(now_s) * 1000;
            check(&mut enc, now_s, now_ms - day_ms, now_ms - day_ms);
        }
        // Older than the boot (which is 24.8 days before the message at most): at it.
        let now_s = start_s + 300 * 86_400;
        let now_ms = u64::from(now_s) * 1000;
        let boot_ms = enc.boot_for(now_ms);
        assert!(boot_ms <= now_ms && now_ms - boot_ms < UPTIME_REBASE_MS);
        assert!(now_ms - 40 * day_ms < boot_ms);
        check(&mut enc, now_s, now_ms - 40 * day_ms, boot_ms);
        assert!(
            uptimes.iter().all(|&u| u64::from(u) < UPTIME_REBASE_MS),
            "{uptimes:?}"
        );
    }
}
