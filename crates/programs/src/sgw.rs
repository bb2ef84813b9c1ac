//! `sgw`: a simplified mobile serving gateway (the user plane of an EPC S-GW/P-GW, with
//! the session signaling it needs handled in the data plane).
//!
//! Signaling (GTPv2-C to the gateway's address, port 2123) creates and updates each
//! subscriber's session; data packets read it:
//! - Create Session Request: IMSI and the eNodeB's S1-U F-TEID (its address and the TEID
//!   downlink must carry) make a session. The subscriber's number `n` is the IMSI's 32 bits
//!   after its MCC/MNC bytes (as the `gtp` workload encodes it); the gateway gives the
//!   subscriber the address at position `n` of `ue_pool` (modulo its size: a pool at least
//!   as large as the subscribers keeps them apart) and takes the TEIDs `0x1000_0000 | n`
//!   (S11, signaling) and `0x2000_0000 | n` (S1-U, uplink), which its Create Session
//!   Response tells the MME (the generator's traces assume them).
//! - Modify Bearer Request (to the session's S11 TEID): a new eNodeB F-TEID (a handover).
//! - Delete Session Request: the session goes.
//!
//! An applied request is answered in the data plane: the packet becomes its response
//! (TS 29.274: the request's type plus one, its sequence number, cause "Request
//! accepted"; a Create Session Response also carries the gateway's S11 and S1-U F-TEIDs,
//! the bearer's id and the subscriber's address), sent back out of the port it came in
//! by to the MME's address and port. A refused request is dropped and counted by reason,
//! unanswered. Uplink (GTP-U T-PDUs to the gateway with a session's S1-U TEID,
//! from the session's eNodeB, the packet inside from the subscriber's address) is
//! decapsulated and sent to `core`; downlink (IP packets to a pool address with a session)
//! is encapsulated in IPv4, UDP and GTP-U with the eNodeB's TEID, from the gateway's
//! address to the eNodeB's, and sent to `access`. Direction is read from the packet, not
//! the port it came in by. Non-IP frames pass to the other port.
//!
//! Workers: sessions are written by signaling, which comes from one MME (one flow, one
//! worker), and read by every user's data (spread over workers): with several workers,
//! sessions would have to be kept in step across workers, which nothing does yet
//! (`synced` copies a program's sketch to a collector, not a table between workers), so a
//! run on more than one worker is refused at start (the others would count `no_session`).
//!
//! State: `sessions` (declared; key the subscriber number `n`; action `session` with `enb
//! enb_teid ue`; read-centric: written by about one packet in 18, read by the rest) and
//! the index from subscriber address to number, derived from it. `sessions` may be
//! `replicated` (docs/REPLICATION.md): each subscriber is a flow, named by its number
//! (signaling and uplink carry it), and its downlink, which carries only its address,
//! finds it at another switch by that address, the alias written with its session. Configuration: `address`
//! (the gateway's IPv4 address, required), `ue_pool` (required), `access` and `core`
//! (ports, default 0 and 1), `capacity` (sessions, default 65536).

use crate::keys::filled_table;
use crate::{ConfigError, PortNames, parse_ipv4, parse_prefix};
use serde::Deserialize;
use stateplane_runtime::{
    Burst, Context, DropReason, FlowBytes, PacketDesc, PortId, Program, Verdict,
};
use stateplane_state::control::{Field, Format};
use stateplane_state::{
    Carried, ControlError, Declaration, DeclaredTable, ExactTable, ExpireProfile, Notification,
    Reply, Request, ValueCodec,
};
use stateplane_wire::gtp::{
    GTPC_PORT, GTPU_PORT, GTPU_T_PDU, GtpuPacket, GtpuRepr, Gtpv2Repr, emit_gtpv2_ie,
    fteid_interface, gtpv2_cause, gtpv2_ie, gtpv2_ies, gtpv2_type,
};
use stateplane_wire::ipv4::{Ipv4Options, Ipv4Repr};
use stateplane_wire::parse::{ParseFlags, Parsed};
use stateplane_wire::udp::UdpRepr;
use std::net::{IpAddr, Ipv4Addr};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SgwConfig {
    pub address: String,
    pub ue_pool: String,
    #[serde(default = "default_access")]
    pub access: String,
    #[serde(default = "default_core")]
    pub core: String,
    #[serde(default = "default_capacity")]
    pub capacity: usize,
}

fn default_access() -> String {
    "0".into()
}

fn default_core() -> String {
    "1".into()
}

fn default_capacity() -> usize {
    65_536
}

/// TEID spaces of the gateway's own tunnel ends: the subscriber number in the low bits.
pub const S11_TEIDS: u32 = 0x1000_0000;
pub const S1U_TEIDS: u32 = 0x2000_0000;
const TEID_SPACE: u32 = 0xf000_0000;

/// The EPS bearer id of a subscriber's one (default) bearer.
const DEFAULT_BEARER: u8 = 5;

/// Outer IPv4, UDP and GTP-U headers: what encapsulation adds.
const TUNNEL_HEADERS: usize = 20 + 8 + 8;

/// A subscriber's session: where its downlink goes, and its address.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Session {
    pub enb: [u8; 4],
    pub enb_teid: u32,
    pub ue: [u8; 4],
}

struct SessionCodec;

impl ValueCodec for SessionCodec {
    type Key = u32;
    type Value = Session;

    fn value(_action: usize, params: &[u128]) -> Session {
        let p = |i: usize| params.get(i).copied().unwrap_or(0) as u32;
        Session {
            enb: p(0).to_be_bytes(),
            enb_teid: p(1),
            ue: p(2).to_be_bytes(),
        }
    }

    fn action(s: &Session) -> (usize, Vec<u128>) {
        (
            0,
            vec![
                u128::from(u32::from_be_bytes(s.enb)),
                u128::from(s.enb_teid),
                u128::from(u32::from_be_bytes(s.ue)),
            ],
        )
    }
}

const NO_SESSION: DropReason = DropReason::program(0);
const BAD_SIGNALING: DropReason = DropReason::program(1);
const TABLE_FULL: DropReason = DropReason::program(2);
const NOT_ROUTED: DropReason = DropReason::program(3);
const NO_ROOM: DropReason = DropReason::program(4);
const WRONG_ENB: DropReason = DropReason::program(5);
const SPOOFED: DropReason = DropReason::program(6);

/// Replicated sessions: a subscriber's flow is named by its number, its alias by its
/// address; both start with the address's place in the pool (the number modulo the
/// pool's size), their hash tag, so that a Redis Cluster keeps them in one slot.
mod replicated {
    use stateplane_runtime::FlowBytes;

    const SUBSCRIBER: u8 = 0;
    const ADDRESS: u8 = 1;

    /// Subscriber `n`'s flow, its address being at `place` in the pool.
    pub(super) fn subscriber(n: u32, place: u32) -> Option<FlowBytes> {
        let mut b = [0u8; 9];
        b[..4].copy_from_slice(&place.to_be_bytes());
        b[4..8].copy_from_slice(&n.to_be_bytes());
        b[8] = SUBSCRIBER;
        FlowBytes::tagged(&b, 4)
    }

    /// The alias of the subscriber whose address is at `place` in the pool.
    pub(super) fn address(place: u32) -> Option<FlowBytes> {
        let mut b = [0u8; 5];
        b[..4].copy_from_slice(&place.to_be_bytes());
        b[4] = ADDRESS;
        FlowBytes::tagged(&b, 4)
    }

    /// The subscriber a flow names; `None` for an alias or bytes of no flow.
    pub(super) fn number_of(flow: &FlowBytes) -> Option<u32> {
        match flow.as_bytes() {
            [_, _, _, _, n @ .., SUBSCRIBER] => Some(u32::from_be_bytes(n.try_into().ok()?)),
            _ => None,
        }
    }
}

/// What to do with a packet once it has been read.
enum Step {
    Done(Verdict),
    /// Answer the signaling request it is (its type and sequence number), about
    /// subscriber `n`, which the gateway applied.
    Answer {
        request: u8,
        sequence: u32,
        n: u32,
    },
    /// Put it in a tunnel to this session's eNodeB.
    Encapsulate(Session),
    /// Take the user's packet out of its tunnel: it starts at this offset.
    Decapsulate(usize),
}

/// A GTPv2-C message as the gateway reads it: its header, and the IMSI's subscriber and
/// the (IPv4) F-TEID it carries.
struct Signal {
    header: Gtpv2Repr,
    imsi: Option<u32>,
    fteid: Option<([u8; 4], u32)>,
}

impl Signal {
    fn read(gtp: &[u8]) -> Result<Signal, DropReason> {
        let header = Gtpv2Repr::parse(gtp).map_err(|_| BAD_SIGNALING)?;
        let ies_at = header.header_len();
        let ies = gtp
            .get(ies_at..ies_at + usize::from(header.payload_len))
            .ok_or(BAD_SIGNALING)?;
        let (mut imsi, mut fteid) = (None, None);
        for ie in gtpv2_ies(ies) {
            let ie = ie.map_err(|_| BAD_SIGNALING)?;
            match ie.ie_type {
                gtpv2_ie::IMSI if ie.data.len() >= 7 => {
                    imsi = Some(u32::from_be_bytes([
                        ie.data[3], ie.data[4], ie.data[5], ie.data[6],
                    ]));
                }
                // IPv4 F-TEIDs only: flags, TEID, address.
                gtpv2_ie::F_TEID if ie.data.len() >= 9 && ie.data[0] & 0x80 != 0 => {
                    let teid = u32::from_be_bytes([ie.data[1], ie.data[2], ie.data[3], ie.data[4]]);
                    let enb = [ie.data[5], ie.data[6], ie.data[7], ie.data[8]];
                    fteid = Some((enb, teid));
                }
                _ => {}
            }
        }
        Ok(Signal {
            header,
            imsi,
            fteid,
        })
    }

    /// The subscriber the message is about: a Create Session Request's IMSI, another
    /// message's S11 TEID.
    fn subscriber(&self) -> Option<u32> {
        if self.header.message_type == gtpv2_type::CREATE_SESSION_REQUEST {
            return self.imsi;
        }
        (self.header.teid)
            .filter(|t| t & TEID_SPACE == S11_TEIDS)
            .map(|t| t & !TEID_SPACE)
    }
}

#[derive(Clone)]
pub struct Sgw {
    address: [u8; 4],
    access: PortId,
    core: PortId,
    pool_base: u32,
    pool_size: u32,
    sessions: DeclaredTable<SessionCodec>,
    /// Subscriber address -> number, for every session.
    by_ue: ExactTable<u32, u32>,
}

impl Sgw {
    pub fn new(
        cfg: &SgwConfig,
        ports: &PortNames,
        field: &str,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        let address = parse_ipv4(&format!("{field}.address"), &cfg.address)?;
        let pool_field = format!("{field}.ue_pool");
        let (pool, len) = parse_prefix(&pool_field, &cfg.ue_pool)?;
        let IpAddr::V4(pool) = pool else {
            return Err(ConfigError::new(
                pool_field,
                "give an IPv4 prefix like 198.18.128.0/17",
            ));
        };
        if !(8..=30).contains(&len) {
            return Err(ConfigError::new(
                pool_field,
                "give a prefix length from 8 to 30",
            ));
        }
        crate::check_capacity(&format!("{field}.capacity"), cfg.capacity, "sessions")?;
        let access = ports.resolve(&format!("{field}.access"), &cfg.access)?;
        let core = ports.resolve(&format!("{field}.core"), &cfg.core)?;
        if access == core {
            return Err(ConfigError::new(
                format!("{field}.core"),
                "the core port must differ from the access port",
            ));
        }
        let session = vec![
            Field::exact("enb", 32, Format::Ipv4),
            Field::exact("enb_teid", 32, Format::Int),
            Field::exact("ue", 32, Format::Ipv4),
        ];
        let declaration = filled_table::<u32>(
            "sessions",
            "subscriber",
            cfg.capacity,
            &["session"],
            session,
        );
        let never = [ExpireProfile::NEVER];
        let size = 1u32 << (32 - len);
        Ok(Sgw {
            address,
            access,
            core,
            pool_base: u32::from(pool) & !(size - 1),
            pool_size: size,
            sessions: DeclaredTable::new(
                crate::budgeted_table(&format!("{field}.capacity"), cfg.capacity, &never, seed)?,
                declaration,
            ),
            by_ue: crate::budgeted_table(
                &format!("{field}.capacity"),
                cfg.capacity,
                &never,
                seed.rotate_left(9),
            )?,
        })
    }

    /// Subscriber `n`'s session.
    pub fn session(&self, n: u32) -> Option<Session> {
        self.sessions.get(&n).copied()
    }

    /// The address the pool gives subscriber `n`.
    fn ue_address(&self, n: u32) -> [u8; 4] {
        (self.pool_base + n % self.pool_size).to_be_bytes()
    }

    fn to_gateway(&self, parsed: &Parsed, port: u16) -> bool {
        parsed.key.ip_version == 4
            && parsed.key.dst[..4] == self.address
            && parsed.key.dst_port == port
    }

    /// Where a packet to the gateway or a subscriber stands: `Ok(n)`, the subscriber it
    /// reads or writes (signaling names it by IMSI or S11 TEID, uplink by S1-U TEID,
    /// downlink through the address index); `Err(Some(place))`, downlink to the address at
    /// `place` in the pool with no session here; `Err(None)`, neither (it makes no state).
    fn subscriber_of(&self, data: &[u8], parsed: &Parsed) -> Result<u32, Option<u32>> {
        let f = parsed.flags;
        if parsed.key.ip_version == 0 {
            return Err(None);
        }
        if f.has(ParseFlags::GTPC) && self.to_gateway(parsed, GTPC_PORT) {
            let gtp = data.get(usize::from(parsed.gtp_offset)..).unwrap_or(&[]);
            let signal = Signal::read(gtp).map_err(|_| None)?;
            return signal.subscriber().ok_or(None);
        }
        if f.has(ParseFlags::GTPU) && self.to_gateway(parsed, GTPU_PORT) {
            return match parsed.teid & TEID_SPACE == S1U_TEIDS {
                true => Ok(parsed.teid & !TEID_SPACE),
                false => Err(None),
            };
        }
        if parsed.key.ip_version == 4 {
            let d = &parsed.key.dst;
            let dst = u32::from_be_bytes([d[0], d[1], d[2], d[3]]);
            let place = dst.wrapping_sub(self.pool_base);
            if place < self.pool_size {
                return self.by_ue.get(&dst).copied().ok_or(Some(place));
            }
        }
        Err(None)
    }

    /// Makes subscriber `n`'s session the one the store holds (`None`: none), with its
    /// address entry. Refused (`false`, nothing changed) when a table has no room, or when
    /// the address is another subscriber's here.
    fn install(&mut self, n: u32, state: Option<&[u8]>, now: u64) -> bool {
        let before = self.sessions.get(&n).copied();
        let Some(state) = state.filter(|s| !s.is_empty()) else {
            if let Some(old) = before {
                self.sessions.delete(&n);
                self.by_ue.delete(&u32::from_be_bytes(old.ue));
            }
            return true;
        };
        if !self.sessions.install_replicated(n, Some(state), now) {
            return false;
        }
        let Some(session) = self.sessions.get(&n).copied() else {
            return false;
        };
        let ue = u32::from_be_bytes(session.ue);
        let restore = |sgw: &mut Sgw| match before {
            Some(b) => {
                if let Some(id) = sgw.sessions.find_id(&n) {
                    *sgw.sessions.value_mut(id) = b;
                }
            }
            None => {
                sgw.sessions.delete(&n);
            }
        };
        if self.by_ue.get(&ue).is_some_and(|&other| other != n) {
            restore(self);
            return false;
        }
        if let Some(old) = before.filter(|b| b.ue != session.ue) {
            self.by_ue.delete(&u32::from_be_bytes(old.ue));
        }
        if self.by_ue.get(&ue).is_none() && self.by_ue.add_entry(ue, n, 0, now).is_err() {
            restore(self);
            return false;
        }
        true
    }

    /// Reads one packet: what to do with it.
    fn step(&mut self, data: &[u8], parsed: &Parsed, now: u64) -> Step {
        let f = parsed.flags;
        if parsed.key.ip_version == 0 {
            let other = if parsed.key.in_port == self.access {
                self.core
            } else {
                self.access
            };
            return Step::Done(Verdict::Forward(other));
        }
        if f.has(ParseFlags::GTPC) && self.to_gateway(parsed, GTPC_PORT) {
            let gtp = data.get(usize::from(parsed.gtp_offset)..).unwrap_or(&[]);
            return match self.signal(gtp, now) {
                Ok((header, n)) => Step::Answer {
                    request: header.message_type,
                    sequence: header.sequence,
                    n,
                },
                Err(reason) => Step::Done(Verdict::Drop(reason)),
            };
        }
        if f.has(ParseFlags::GTPU) && self.to_gateway(parsed, GTPU_PORT) {
            let at = usize::from(parsed.gtp_offset);
            let Some(gtp) = data.get(at..).map(GtpuPacket::new_unchecked) else {
                return Step::Done(Verdict::Drop(NO_ROOM));
            };
            let n = parsed.teid & !TEID_SPACE;
            let session = self.sessions.get(&n);
            let Some(s) = session.filter(|_| {
                parsed.teid & TEID_SPACE == S1U_TEIDS && gtp.message_type() == GTPU_T_PDU
            }) else {
                return Step::Done(Verdict::Drop(NO_SESSION));
            };
            // A session's TEID is good only from its eNodeB, and its packets only from its
            // subscriber's address (a P-GW's source address check): a guessed TEID or a
            // subscriber sending as another is not let into the core.
            let outer = &parsed.key.src;
            if [outer[0], outer[1], outer[2], outer[3]] != s.enb {
                return Step::Done(Verdict::Drop(WRONG_ENB));
            }
            let inner = at + gtp.header_len();
            let ipv4 = data.get(inner).is_some_and(|b| b >> 4 == 4);
            let source = data
                .get(inner + 12..inner + 16)
                .and_then(|b| <[u8; 4]>::try_from(b).ok());
            if !ipv4 || source != Some(s.ue) {
                return Step::Done(Verdict::Drop(SPOOFED));
            }
            return Step::Decapsulate(inner);
        }
        if parsed.key.ip_version == 4 {
            let dst = u32::from_be_bytes([
                parsed.key.dst[0],
                parsed.key.dst[1],
                parsed.key.dst[2],
                parsed.key.dst[3],
            ]);
            if dst.wrapping_sub(self.pool_base) < self.pool_size {
                let session = self.by_ue.get(&dst).and_then(|n| self.sessions.get(n));
                return match session {
                    Some(s) => Step::Encapsulate(*s),
                    None => Step::Done(Verdict::Drop(NO_SESSION)),
                };
            }
        }
        Step::Done(Verdict::Drop(NOT_ROUTED))
    }

    /// Applies a GTPv2-C request to the sessions: its header and subscriber.
    fn signal(&mut self, gtp: &[u8], now: u64) -> Result<(Gtpv2Repr, u32), DropReason> {
        let signal = Signal::read(gtp)?;
        let subscriber = signal.subscriber().ok_or(BAD_SIGNALING);
        match signal.header.message_type {
            gtpv2_type::CREATE_SESSION_REQUEST => {
                let n = subscriber?;
                let (enb, enb_teid) = signal.fteid.ok_or(BAD_SIGNALING)?;
                let ue = self.ue_address(n);
                let session = Session { enb, enb_teid, ue };
                if let Some(old) = self.sessions.get(&n).copied() {
                    self.by_ue.delete(&u32::from_be_bytes(old.ue));
                    self.sessions.delete(&n);
                }
                if self.sessions.add_entry(n, session, 0, 0).is_err() {
                    return Err(TABLE_FULL);
                }
                if self
                    .by_ue
                    .add_entry(u32::from_be_bytes(ue), n, 0, 0)
                    .is_err()
                {
                    self.sessions.delete(&n);
                    return Err(TABLE_FULL);
                }
                Ok((signal.header, n))
            }
            gtpv2_type::MODIFY_BEARER_REQUEST => {
                let n = subscriber?;
                let (enb, enb_teid) = signal.fteid.ok_or(BAD_SIGNALING)?;
                let id = self.sessions.lookup(&n, now).ok_or(NO_SESSION)?;
                let s = self.sessions.value_mut(id);
                (s.enb, s.enb_teid) = (enb, enb_teid);
                Ok((signal.header, n))
            }
            gtpv2_type::DELETE_SESSION_REQUEST => {
                let n = subscriber?;
                let old = self.sessions.get(&n).copied().ok_or(NO_SESSION)?;
                self.sessions.delete(&n);
                self.by_ue.delete(&u32::from_be_bytes(old.ue));
                Ok((signal.header, n))
            }
            _ => Err(BAD_SIGNALING),
        }
    }

    /// Puts packet `i` (an IP packet after its link header) in a GTP-U tunnel to the
    /// session's eNodeB.
    fn encapsulate(&self, burst: &mut Burst, i: usize, s: Session) -> Verdict {
        let d = burst.descs()[i];
        let l2 = usize::from(d.parsed.l3_offset);
        let inner_len = usize::from(d.parsed.ip_len);
        let Some(p) = burst.grow_front(i, TUNNEL_HEADERS) else {
            return Verdict::Drop(NO_ROOM);
        };
        let data = p.data;
        if data.len() < TUNNEL_HEADERS + l2 + inner_len || inner_len + TUNNEL_HEADERS > 0xffff {
            return Verdict::Drop(NO_ROOM);
        }
        // The link header moves to the new front; the tunnel's headers go between it and
        // the user's packet.
        data.copy_within(TUNNEL_HEADERS..TUNNEL_HEADERS + l2, 0);
        data[l2 - 2..l2].copy_from_slice(&0x0800u16.to_be_bytes());
        let gtp = GtpuRepr {
            message_type: GTPU_T_PDU,
            teid: s.enb_teid,
            sequence: None,
            payload_len: inner_len as u16,
        };
        let headers = &mut data[l2..l2 + TUNNEL_HEADERS];
        let written = self
            .emit_udp(headers, s.enb, (GTPU_PORT, GTPU_PORT), 8 + inner_len)
            .and_then(|()| gtp.emit(&mut headers[28..]));
        match written {
            Ok(()) => Verdict::Forward(self.access),
            Err(_) => Verdict::Drop(NO_ROOM),
        }
    }

    /// The information elements of the response to a `request` about subscriber `n`,
    /// written to `buf`: their length. Every response says the request was accepted; a
    /// Create Session Response also gives the gateway's tunnel ends (its S11 F-TEID for
    /// the MME's signaling, and in the bearer context, with the bearer's id, its S1-U
    /// F-TEID for the eNodeB's uplink) and the subscriber's address (PAA), as TS 29.274
    /// 7.2.2 lays them out.
    fn response_ies(&self, request: u8, n: u32, buf: &mut [u8]) -> stateplane_wire::Result<usize> {
        let accepted = [gtpv2_cause::REQUEST_ACCEPTED, 0];
        let mut at = emit_gtpv2_ie(buf, gtpv2_ie::CAUSE, 0, &accepted)?;
        if request != gtpv2_type::CREATE_SESSION_REQUEST {
            return Ok(at);
        }
        let fteid = |interface: u8, teid: u32| {
            let mut f = [0u8; 9];
            f[0] = 0x80 | interface;
            f[1..5].copy_from_slice(&teid.to_be_bytes());
            f[5..9].copy_from_slice(&self.address);
            f
        };
        let s11 = fteid(fteid_interface::S11_SGW, S11_TEIDS | n);
        // The Sender F-TEID for Control Plane: instance 0 (TS 29.274 table 7.2.2-1).
        at += emit_gtpv2_ie(&mut buf[at..], gtpv2_ie::F_TEID, 0, &s11)?;
        let mut paa = [1u8; 5];
        paa[1..].copy_from_slice(&self.ue_address(n));
        at += emit_gtpv2_ie(&mut buf[at..], gtpv2_ie::PAA, 0, &paa)?;
        let mut bearer = [0u8; 32];
        let mut b = emit_gtpv2_ie(&mut bearer, gtpv2_ie::EBI, 0, &[DEFAULT_BEARER])?;
        b += emit_gtpv2_ie(&mut bearer[b..], gtpv2_ie::CAUSE, 0, &accepted)?;
        let s1u = fteid(fteid_interface::S1U_SGW, S1U_TEIDS | n);
        b += emit_gtpv2_ie(&mut bearer[b..], gtpv2_ie::F_TEID, 0, &s1u)?;
        at += emit_gtpv2_ie(&mut buf[at..], gtpv2_ie::BEARER_CONTEXT, 0, &bearer[..b])?;
        Ok(at)
    }

    /// Turns packet `i`, a signaling `request` the gateway applied, into its response,
    /// sent back out of the port it came in by to the address and port it came from:
    /// the same sequence number, TEID 0 (the requests name no tunnel end of the MME's,
    /// TS 29.274 5.5.2), the information elements of [`Sgw::response_ies`].
    fn answer(&self, burst: &mut Burst, i: usize, request: u8, sequence: u32, n: u32) -> Verdict {
        let d = burst.descs()[i];
        let (l2, old_len) = (usize::from(d.parsed.l3_offset), d.len as usize);
        let mut frame = [0u8; 192];
        // An Ethernet header (and VLAN tags), as the parser gave it.
        let fits = (12..frame.len() - 28).contains(&l2);
        let Some(link) = burst.data(i).get(..l2).filter(|_| fits) else {
            return Verdict::Drop(NO_ROOM);
        };
        // The link header back the way it came: the MAC addresses swapped.
        frame[..l2].copy_from_slice(link);
        frame[..6].copy_from_slice(&link[6..12]);
        frame[6..12].copy_from_slice(&link[..6]);
        let gtp_at = l2 + 28;
        let header = Gtpv2Repr {
            message_type: request + 1,
            teid: Some(0),
            sequence,
            payload_len: 0,
        };
        let ies_at = gtp_at + header.header_len();
        let Ok(ies) = self.response_ies(request, n, &mut frame[ies_at..]) else {
            return Verdict::Drop(NO_ROOM);
        };
        let gtp_len = header.header_len() + ies;
        let k = &d.parsed.key;
        let mme = [k.src[0], k.src[1], k.src[2], k.src[3]];
        let header = Gtpv2Repr {
            payload_len: ies as u16,
            ..header
        };
        let written = self
            .emit_udp(&mut frame[l2..], mme, (GTPC_PORT, k.src_port), gtp_len)
            .and_then(|()| header.emit(&mut frame[gtp_at..]));
        let len = gtp_at + gtp_len;
        let resized = written.is_ok()
            && if len >= old_len {
                burst.grow_front(i, len - old_len).is_some()
            } else {
                burst.shrink_front(i, old_len - len)
            };
        if !resized {
            return Verdict::Drop(NO_ROOM);
        }
        burst.packet_mut(i).data[..len].copy_from_slice(&frame[..len]);
        Verdict::Forward(d.in_port)
    }

    /// Writes the IPv4 and UDP headers of a datagram of `payload_len` bytes from the
    /// gateway to `dst`, `ports` (source, destination), at the start of `buf`.
    fn emit_udp(
        &self,
        buf: &mut [u8],
        dst: [u8; 4],
        (src_port, dst_port): (u16, u16),
        payload_len: usize,
    ) -> stateplane_wire::Result<()> {
        let ip = Ipv4Repr {
            src: Ipv4Addr::from(self.address),
            dst: Ipv4Addr::from(dst),
            protocol: 17,
            ttl: 64,
            tos: 0,
            ident: 0,
            dont_frag: false,
            more_frags: false,
            frag_offset: 0,
            options: Ipv4Options::default(),
            payload_len: (8 + payload_len) as u16,
        };
        let udp = UdpRepr {
            src_port,
            dst_port,
            payload_len: payload_len as u16,
        };
        ip.emit(buf)?;
        udp.emit(buf.get_mut(20..).ok_or(stateplane_wire::Error::Truncated)?)
    }

    /// Takes the user's packet, at `inner` in packet `i`, out of its tunnel.
    fn decapsulate(&self, burst: &mut Burst, i: usize, inner: usize) -> Verdict {
        let l2 = usize::from(burst.descs()[i].parsed.l3_offset);
        let p = burst.packet_mut(i);
        let Some(&first) = p.data.get(inner) else {
            return Verdict::Drop(NO_ROOM);
        };
        let ethertype: u16 = if first >> 4 == 6 { 0x86dd } else { 0x0800 };
        let start = inner - l2;
        p.data.copy_within(..l2, start);
        p.data[inner - 2..inner].copy_from_slice(&ethertype.to_be_bytes());
        if burst.shrink_front(i, start) {
            Verdict::Forward(self.core)
        } else {
            Verdict::Drop(NO_ROOM)
        }
    }
}

impl Program for Sgw {
    type Prepared = ();

    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        for i in 0..burst.len() {
            let step = {
                let p = burst.packet_mut(i);
                self.step(p.data, &p.desc.parsed, ctx.now_ns)
            };
            let verdict = match step {
                Step::Done(v) => v,
                Step::Encapsulate(s) => self.encapsulate(burst, i, s),
                Step::Decapsulate(inner) => self.decapsulate(burst, i, inner),
                Step::Answer {
                    request,
                    sequence,
                    n,
                } => self.answer(burst, i, request, sequence, n),
            };
            burst.descs_mut()[i].verdict = verdict;
        }
    }

    /// Sessions are written by the one worker that takes the signaling and read by all:
    /// until they are `synced`, the others would drop every user's packets.
    fn check_workers(&self, workers: usize, _live: bool) -> Result<(), String> {
        if workers > 1 {
            return Err(format!(
                "sgw runs on one worker until its sessions can be kept in step across workers (nothing does that yet): with {workers}, every worker but the signaling's would drop users' packets as no_session; set workers = 1 (--workers 1)"
            ));
        }
        Ok(())
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        &[
            "no_session",
            "bad_signaling",
            "table_full",
            "not_routed",
            "no_room",
            "wrong_enb",
            "spoofed",
        ]
    }

    fn declarations(&self) -> Vec<Declaration> {
        vec![self.sessions.declaration().clone()]
    }

    /// As `answer_by_table!`; a session the control plane deletes takes its address
    /// entry with it.
    fn control(
        &mut self,
        request: &Request,
        _prepared: Option<&std::sync::Arc<Self::Prepared>>,
        ctx: &Context,
    ) -> Result<Reply, ControlError> {
        let by_ue = &mut self.by_ue;
        self.sessions
            .answer_seeing_deletes(request, ctx.now_ns, |_, s| {
                by_ue.delete(&u32::from_be_bytes(s.ue));
            })
    }

    fn notifications(&mut self, out: &mut Vec<Notification>) {
        self.sessions.take_notifications(out);
    }

    /// `sessions` replicated, each subscriber a flow with its address as alias.
    fn replicate(&mut self, name: &str) -> bool {
        self.sessions.replicate(name, false)
    }

    fn replicated_key(&self, d: &PacketDesc, data: &[u8]) -> Option<FlowBytes> {
        if !self.sessions.replicated() {
            return None;
        }
        let n = self.subscriber_of(data, &d.parsed).ok()?;
        replicated::subscriber(n, n % self.pool_size)
    }

    fn replicated_alias(&self, d: &PacketDesc, data: &[u8]) -> Option<FlowBytes> {
        if !self.sessions.replicated() {
            return None;
        }
        match self.subscriber_of(data, &d.parsed) {
            Err(Some(place)) => replicated::address(place),
            _ => None,
        }
    }

    fn replicated_alias_of(&self, flow: &FlowBytes) -> Option<FlowBytes> {
        let session = self.sessions.get(&replicated::number_of(flow)?)?;
        let ue = u32::from_be_bytes(session.ue);
        replicated::address(ue.wrapping_sub(self.pool_base))
    }

    fn replicated_state(&self, flow: &FlowBytes) -> Option<Vec<u8>> {
        let mut state = Vec::new();
        self.replicated_state_into(flow, &mut state).map(|_| state)
    }

    fn replicated_state_into(&self, flow: &FlowBytes, out: &mut Vec<u8>) -> Option<u64> {
        let n = replicated::number_of(flow)?;
        self.sessions.replicated_state_into(&n, out)
    }

    fn install_replicated(&mut self, flow: &FlowBytes, state: Option<&[u8]>, now_ns: u64) -> bool {
        replicated::number_of(flow).is_some_and(|n| self.install(n, state, now_ns))
    }

    /// Sessions stay while the gateway's address does (their eNodeBs send to it), each
    /// with the subscriber address it was given, as many as the new capacity holds; the
    /// index by subscriber address is made again from the sessions kept.
    fn inherit(&mut self, mut old: Self, now_ns: u64) -> Vec<Carried> {
        if old.address != self.address {
            let why = format!(
                "the gateway's address changed from {} to {}",
                Ipv4Addr::from(old.address),
                Ipv4Addr::from(self.address)
            );
            return vec![Carried::afresh("sessions", why)];
        }
        let carried = self.sessions.adopt(&mut old.sessions);
        self.by_ue.clear();
        let kept: Vec<(u32, u32)> = (self.sessions.iter())
            .map(|(&n, s, _)| (u32::from_be_bytes(s.ue), n))
            .collect();
        for (ue, n) in kept {
            // As many as sessions: the tables are the same size.
            let _ = self.by_ue.add_entry(ue, n, 0, now_ns);
        }
        vec![carried]
    }
}

#[cfg(test)]
mod tests;
