//! `sgw`: a simplified mobile serving gateway (the user plane of an EPC S-GW/P-GW, with
//! the session signaling it needs handled in the data plane).
//!
//! Signaling (GTPv2-C to the gateway's address, port 2123) creates and updates each
//! subscriber's session; data packets read it:
//! - Create Session Request: the IMSI, the MME's S11 F-TEID (the TEID the gateway's
//!   messages to the MME carry) and, where the MME has it already, the eNodeB's S1-U
//!   F-TEID (its address and the TEID downlink must carry) make a session. The gateway
//!   allocates the subscriber a place in `ue_pool`: its address, and its TEIDs, which
//!   carry the place (`0x1000_0000 | place` for S11, `0x2000_0000 | place` for S1-U
//!   uplink), so that every packet finds its session through the index by address.
//!   Places never used go first, in order; then those freed, the longest free first, so a
//!   deleted session's TEIDs go unused for as long as the pool allows. Replicated
//!   sessions are the exception: switches sharing a store share no allocator, so a
//!   subscriber's place there is its IMSI modulo the pool's size, the same at every
//!   switch.
//! - The PDN type asked for is served where the pools allow: with `ue_pool6`, IPv4, IPv6
//!   (the /64 at the session's place) or both; without, IPv4v6 is answered IPv4 alone
//!   (cause 18) and IPv6 alone refused (83). A session carries only its families.
//! - Modify Bearer Request (to the session's S11 TEID): the eNodeB's S1-U F-TEID (the
//!   bearer set up, or a handover).
//! - Delete Session Request: the session goes, and its place is free.
//! - Echo Request, GTPv2-C or GTP-U: answered (path management).
//!
//! Every request the gateway can read is answered in the data plane: the packet becomes
//! its response (TS 29.274: the request's type plus one, its sequence number, the MME's
//! TEID, a cause), sent back out of the port it came in by to the MME's address and port.
//! A Create Session Response that accepts also carries the gateway's S11 and S1-U F-TEIDs,
//! the bearer's id and the subscriber's address. A request refused is answered with its
//! cause: no such session ("Context not found"), an element missing or unreadable (with
//! the offending element), no room ("No resources available"), no address ("All dynamic
//! addresses are occupied"); counted by cause in the `sessions` table's stats. A message
//! that cannot be read as GTPv2-C, or of a type the gateway does not take, is dropped
//! and counted (`bad_signaling`).
//!
//! A T-PDU whose TEID names no session gets an Error Indication back (TS 29.281 7.3.1),
//! at most one every 10 ms; the rest are dropped (`no_session`).
//!
//! Uplink (GTP-U T-PDUs to the gateway with a session's S1-U TEID, from the session's
//! eNodeB once it is known, the packet inside from the subscriber's address) is
//! decapsulated and sent to `core`; downlink (IP packets to a pool address with a session
//! whose eNodeB is known) is encapsulated in IPv4, UDP and GTP-U with the eNodeB's TEID,
//! from the gateway's address to the eNodeB's, and sent to `access`. Direction is read
//! from the packet, not the port it came in by. Non-IP frames pass to the other port.
//!
//! Workers: each worker holds the sessions of its share of the places (worker `w` of `n`
//! hands out `w`, `w + n`, ...), and live ports spread packets by subscriber
//! (`Steering::Subscriber`: GTP by the place in its TEID, downlink by the destination's
//! place, a Create Session Request by its IMSI), so every packet of a subscriber reaches
//! the worker that gave it its place; runs over files spread packets the same way. A
//! replicated subscriber's place is its IMSI's at every switch: there a run on more than
//! one worker is refused at start.
//!
//! State: `sessions` (declared; key the IMSI, as the number its digits spell; action
//! `session` with `enb enb_teid ue mme_teid`; read-centric: written by about one packet
//! in 18, read by the rest), the index from subscriber address to IMSI, derived from it,
//! and the free places (both made again after a synced write: `sessions` may be
//! `synced`). `sessions` may be `replicated` (docs/REPLICATION.md): each
//! subscriber is a flow, named by its IMSI (a Create Session Request carries it), and the
//! packets that name it by its place (other signaling and uplink by TEID, downlink by
//! address) find it at another switch by the place, the alias written with its session.
//! Configuration: `address` (the gateway's IPv4 address, required), `ue_pool` (required),
//! `ue_pool6` (optional: IPv6 subscribers),
//! `access` and `core` (ports, default 0 and 1), `capacity` (sessions, default 65536).

use crate::keys::filled_table;
use crate::{ConfigError, PortNames, parse_ipv4, parse_prefix};
use serde::Deserialize;
use stateplane_runtime::{
    Burst, Context, DropReason, FlowBytes, PacketDesc, PortId, Program, Steering, Verdict,
};
use stateplane_state::control::{Field, Format};
use stateplane_state::{
    Carried, ControlError, Declaration, DeclaredTable, ExactTable, ExpireProfile, Notification,
    Reply, Request, ValueCodec, Write, params_into,
};
use stateplane_wire::gtp::{
    Fteid, GTPC_PORT, GTPU_ECHO_REQUEST, GTPU_ECHO_RESPONSE, GTPU_ERROR_INDICATION,
    GTPU_PEER_ADDRESS, GTPU_PORT, GTPU_RECOVERY, GTPU_T_PDU, GTPU_TEID_DATA_I, GtpuPacket,
    GtpuRepr, Gtpv2Repr, emit_gtpv2_ie, fteid_interface, gtpv2_cause, gtpv2_ie, gtpv2_ies,
    gtpv2_type, imsi_value, pdn_type,
};
use stateplane_wire::ipv4::{Ipv4Options, Ipv4Repr};
use stateplane_wire::parse::{ParseFlags, Parsed};
use stateplane_wire::udp::UdpRepr;
use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SgwConfig {
    pub address: String,
    pub ue_pool: String,
    /// Subscribers' IPv6 prefixes: one /64 a place.
    #[serde(default)]
    pub ue_pool6: Option<String>,
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

/// TEID spaces of the gateway's own tunnel ends: the session's place in the pool in the
/// low bits (a /8 pool's places take 24 of the 28).
pub const S11_TEIDS: u32 = 0x1000_0000;
pub const S1U_TEIDS: u32 = 0x2000_0000;
const TEID_SPACE: u32 = !stateplane_runtime::PLACE_MASK;

/// The EPS bearer id of a subscriber's one (default) bearer.
const DEFAULT_BEARER: u8 = 5;

/// Error Indications go out at most once every this long (100 a second), so that a spray
/// of guessed TEIDs cannot make the gateway a reflector.
const ERROR_INDICATION_GAP_NS: u64 = 10_000_000;

/// Outer IPv4, UDP and GTP-U headers: what encapsulation adds.
const TUNNEL_HEADERS: usize = 20 + 8 + 8;

/// A subscriber's session: where its downlink goes (no eNodeB yet: `enb` 0.0.0.0), its
/// IPv4 address (its place in the pool, which also gives its IPv6 /64), the TEID the MME's
/// end of its signaling takes, and the address families it carries ([`pdn_type`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Zeroable)]
pub struct Session {
    pub enb: [u8; 4],
    pub enb_teid: u32,
    pub ue: [u8; 4],
    pub mme_teid: u32,
    pub pdn: u8,
}

impl Session {
    /// Whether the eNodeB that serves it is known (a Create Session Request may not say).
    fn has_enb(&self) -> bool {
        self.enb != [0; 4]
    }

    /// Whether it carries IPv4 (`v6` false) or IPv6 packets.
    fn carries(&self, v6: bool) -> bool {
        let family = if v6 { pdn_type::IPV6 } else { pdn_type::IPV4 };
        self.pdn & family != 0
    }
}

struct SessionCodec;

impl ValueCodec for SessionCodec {
    type Key = u64;
    type Value = Session;

    fn value(_action: usize, params: &[u128]) -> Session {
        let p = |i: usize| params.get(i).copied().unwrap_or(0) as u32;
        Session {
            enb: p(0).to_be_bytes(),
            enb_teid: p(1),
            ue: p(2).to_be_bytes(),
            mme_teid: p(3),
            pdn: p(4) as u8,
        }
    }

    fn action_values(s: &Session, out: &mut [u128]) -> (usize, usize) {
        let params = [
            u128::from(u32::from_be_bytes(s.enb)),
            u128::from(s.enb_teid),
            u128::from(u32::from_be_bytes(s.ue)),
            u128::from(s.mme_teid),
            u128::from(s.pdn),
        ];
        (0, params_into(params, out))
    }
}

const NO_SESSION: DropReason = DropReason::program(0);
const BAD_SIGNALING: DropReason = DropReason::program(1);
const NOT_ROUTED: DropReason = DropReason::program(2);
const NO_ROOM: DropReason = DropReason::program(3);
const WRONG_ENB: DropReason = DropReason::program(4);
const SPOOFED: DropReason = DropReason::program(5);
const NO_BEARER: DropReason = DropReason::program(6);

/// The places of the pool a worker hands out: its share (worker `w` of `n` has the places
/// `w`, `w + n`, `w + 2n`..., as the runtime's [`Steering::Subscriber`] sends a place's
/// packets to worker `place % n`); those never used first, in order, then those freed,
/// the longest free first.
#[derive(Clone, Debug)]
struct Places {
    size: u32,
    /// The workers sharing the pool: the distance between two places of this share.
    stride: u32,
    /// Places from here on were never handed out.
    fresh: u32,
    freed: VecDeque<u32>,
}

impl Places {
    fn new(size: u32) -> Places {
        Places::share(size, 0, 1, [])
    }

    /// Worker `worker`'s (of `workers`) share of a pool of `size` of which `used` are
    /// taken: the rest free, in order.
    fn share(size: u32, worker: u32, workers: u32, used: impl IntoIterator<Item = u32>) -> Places {
        let stride = workers.max(1);
        let ours = |p: &u32| *p < size && *p % stride == worker;
        let mut used: Vec<u32> = used.into_iter().filter(ours).collect();
        used.sort_unstable();
        let fresh = used.last().map_or(worker, |&p| p + stride);
        let mut taken = used.into_iter().peekable();
        let freed = (worker..fresh)
            .step_by(stride as usize)
            .filter(|&p| taken.next_if_eq(&p).is_none())
            .collect();
        Places {
            size,
            stride,
            fresh,
            freed,
        }
    }

    fn take(&mut self) -> Option<u32> {
        if self.fresh < self.size {
            self.fresh += self.stride;
            return Some(self.fresh - self.stride);
        }
        self.freed.pop_front()
    }

    fn give_back(&mut self, place: u32) {
        self.freed.push_back(place);
    }
}

/// The answers the gateway gives, by cause, as `ctl stats sessions` names them.
const ANSWERS: [(u8, &str); 8] = [
    (gtpv2_cause::REQUEST_ACCEPTED, "requests_accepted"),
    (
        gtpv2_cause::NEW_PDN_TYPE_NETWORK_PREFERENCE,
        "accepted_ipv4_only",
    ),
    (gtpv2_cause::CONTEXT_NOT_FOUND, "rejected_context_not_found"),
    (gtpv2_cause::MANDATORY_IE_INCORRECT, "rejected_ie_incorrect"),
    (gtpv2_cause::MANDATORY_IE_MISSING, "rejected_ie_missing"),
    (gtpv2_cause::NO_RESOURCES_AVAILABLE, "rejected_no_resources"),
    (
        gtpv2_cause::ALL_DYNAMIC_ADDRESSES_OCCUPIED,
        "rejected_addresses_occupied",
    ),
    (
        gtpv2_cause::PREFERRED_PDN_TYPE_NOT_SUPPORTED,
        "rejected_pdn_type_not_supported",
    ),
];

/// Replicated sessions: a subscriber's flow is named by its IMSI, its alias by its place
/// in the pool; both start with the place, their hash tag, so that a Redis Cluster keeps
/// them in one slot.
mod replicated {
    use stateplane_runtime::FlowBytes;

    const SUBSCRIBER: u8 = 0;
    const PLACE: u8 = 1;

    /// The flow of the subscriber `imsi`, at `place` in the pool.
    pub(super) fn subscriber(imsi: u64, place: u32) -> Option<FlowBytes> {
        let mut b = [0u8; 13];
        b[..4].copy_from_slice(&place.to_be_bytes());
        b[4..12].copy_from_slice(&imsi.to_be_bytes());
        b[12] = SUBSCRIBER;
        FlowBytes::tagged(&b, 4)
    }

    /// The alias of the subscriber at `place` in the pool.
    pub(super) fn place(place: u32) -> Option<FlowBytes> {
        let mut b = [0u8; 5];
        b[..4].copy_from_slice(&place.to_be_bytes());
        b[4] = PLACE;
        FlowBytes::tagged(&b, 4)
    }

    /// The IMSI a flow names; `None` for an alias or bytes of no flow.
    pub(super) fn imsi_of(flow: &FlowBytes) -> Option<u64> {
        match flow.as_bytes() {
            [_, _, _, _, imsi @ .., SUBSCRIBER] => Some(u64::from_be_bytes(imsi.try_into().ok()?)),
            _ => None,
        }
    }
}

/// What to do with a packet once it has been read.
enum Step {
    Done(Verdict),
    /// Turn the signaling request it is into this answer.
    Answer(Answer),
    /// Put it in a tunnel to this session's eNodeB.
    Encapsulate(Session),
    /// Take the user's packet out of its tunnel: it starts at this offset.
    Decapsulate(usize),
    /// Answer the GTP-U Echo Request it is (its sequence number).
    EchoUserPlane(Option<u16>),
    /// Tell the sender of this T-PDU that its TEID names no session here.
    ErrorIndication(u32),
}

/// The response a signaling request gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Answer {
    request: u8,
    sequence: u32,
    /// The TEID of the response's header (the MME's S11 TEID, 0 when the request names no
    /// session of the gateway's); `None` for an Echo Response, whose header has none.
    teid: Option<u32>,
    cause: u8,
    /// The element (type, instance) the cause is about, for a missing or unreadable one.
    offending: Option<(u8, u8)>,
    /// A session created: its place, whose tunnel ends and addresses the response gives,
    /// and its PDN type.
    created: Option<(u32, u8)>,
}

/// A GTPv2-C message as the gateway reads it: its header, and the IMSI and the F-TEIDs
/// it carries (at the top or in a bearer context: the MME's S11 end, the eNodeB's S1-U
/// end over IPv4).
struct Signal {
    header: Gtpv2Repr,
    /// `Some(None)`: an IMSI element whose digits are not an IMSI.
    imsi: Option<Option<u64>>,
    mme_teid: Option<u32>,
    enb: Option<([u8; 4], u32)>,
    /// The PDN type asked for: the PDN Type element's, else the PAA's.
    pdn: Option<u8>,
    /// The top-level element (type, instance) holding an F-TEID that could not be read,
    /// or an eNodeB's with no IPv4 address: the F-TEID itself, or its bearer context.
    bad_fteid: Option<(u8, u8)>,
}

impl Signal {
    fn read(gtp: &[u8]) -> Result<Signal, DropReason> {
        let header = Gtpv2Repr::parse(gtp).map_err(|_| BAD_SIGNALING)?;
        let ies_at = header.header_len();
        let ies = gtp
            .get(ies_at..ies_at + usize::from(header.payload_len))
            .ok_or(BAD_SIGNALING)?;
        let mut signal = Signal {
            header,
            imsi: None,
            mme_teid: None,
            enb: None,
            pdn: None,
            bad_fteid: None,
        };
        let mut paa = None;
        for ie in gtpv2_ies(ies) {
            let ie = ie.map_err(|_| BAD_SIGNALING)?;
            match ie.ie_type {
                gtpv2_ie::IMSI => signal.imsi = Some(imsi_value(ie.data)),
                gtpv2_ie::F_TEID => signal.take_fteid(ie.data, (ie.ie_type, ie.instance)),
                gtpv2_ie::PDN_TYPE => signal.pdn = ie.data.first().map(|t| t & 0x07),
                gtpv2_ie::PAA => paa = ie.data.first().map(|t| t & 0x07),
                gtpv2_ie::BEARER_CONTEXT if ie.instance == 0 => {
                    for inner in gtpv2_ies(ie.data) {
                        let inner = inner.map_err(|_| BAD_SIGNALING)?;
                        if inner.ie_type == gtpv2_ie::F_TEID {
                            signal.take_fteid(inner.data, (ie.ie_type, ie.instance));
                        }
                    }
                }
                _ => {}
            }
        }
        signal.pdn = signal.pdn.or(paa);
        Ok(signal)
    }

    fn take_fteid(&mut self, data: &[u8], holder: (u8, u8)) {
        match Fteid::parse(data) {
            Ok(f) if f.interface == fteid_interface::S11_MME => self.mme_teid = Some(f.teid),
            Ok(f) if f.interface == fteid_interface::S1U_ENODEB => match f.v4 {
                Some(enb) => self.enb = Some((enb, f.teid)),
                None => self.bad_fteid = Some(holder),
            },
            Ok(_) => {}
            Err(_) => self.bad_fteid = Some(holder),
        }
    }
}

/// The IPv6 pool `text`: its first /64's upper 64 bits. It must hold a /64 for each of
/// the IPv4 pool's `places`.
fn pool6(field: &str, text: &str, places: u32) -> Result<u64, ConfigError> {
    let (prefix, len) = parse_prefix(field, text)?;
    let IpAddr::V6(prefix) = prefix else {
        return Err(ConfigError::new(
            field,
            "give an IPv6 prefix like 2001:2:0:8000::/49",
        ));
    };
    let longest = 64 - places.trailing_zeros() as u8;
    if len > longest {
        return Err(ConfigError::new(
            field,
            format!(
                "a /{len} holds fewer /64s than ue_pool has addresses ({places}): give a /{longest} or shorter"
            ),
        ));
    }
    let upper = (u128::from(prefix) >> 64) as u64;
    Ok(upper & u64::MAX.checked_shl(u32::from(64 - len)).unwrap_or(0))
}

#[derive(Clone)]
pub struct Sgw {
    address: [u8; 4],
    access: PortId,
    core: PortId,
    pool_base: u32,
    pool_size: u32,
    /// The IPv6 pool's first /64, as its upper 64 bits: place `p` has the /64 `p` past it.
    pool6: Option<u64>,
    sessions: DeclaredTable<SessionCodec>,
    /// Subscriber address -> IMSI, for every session.
    by_ue: ExactTable<u32, u64>,
    /// The places not taken of this worker's share (unused while `sessions` is
    /// replicated).
    places: Places,
    /// Which share `places` is: this worker's number and the workers' (a worker learns
    /// them from its first burst).
    share: (usize, usize),
    /// Signaling answered, by cause (in [`ANSWERS`]' order), and echo requests.
    answered: [u64; ANSWERS.len()],
    echoes: u64,
    /// Error Indications sent, and when the next may go.
    error_indications: u64,
    next_error_indication_ns: u64,
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
        let size = 1u32 << (32 - len);
        let pool6 = match &cfg.ue_pool6 {
            Some(text) => Some(pool6(&format!("{field}.ue_pool6"), text, size)?),
            None => None,
        };
        crate::check_capacity(&format!("{field}.capacity"), cfg.capacity, "sessions")?;
        // The free places: each may come to wait in the queue once (4 bytes a place).
        crate::claim_bytes(
            &pool_field,
            || format!("a queue of {size} free places"),
            u64::from(size) * 4,
        )?;
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
            Field::exact("mme_teid", 32, Format::Int),
            Field::exact("pdn_type", 8, Format::Int),
        ];
        let declaration =
            filled_table::<u64>("sessions", "imsi", cfg.capacity, &["session"], session);
        let never = [ExpireProfile::NEVER];
        Ok(Sgw {
            address,
            access,
            core,
            pool_base: u32::from(pool) & !(size - 1),
            pool_size: size,
            pool6,
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
            places: Places::new(size),
            share: (0, 1),
            answered: [0; ANSWERS.len()],
            echoes: 0,
            error_indications: 0,
            next_error_indication_ns: 0,
        })
    }

    /// The session of the subscriber `imsi`.
    pub fn session(&self, imsi: u64) -> Option<Session> {
        self.sessions.get(&imsi).copied()
    }

    /// The address at `place` in the pool.
    fn address_at(&self, place: u32) -> [u8; 4] {
        (self.pool_base + place).to_be_bytes()
    }

    /// The place of an address of the pool.
    fn place_of(&self, ue: [u8; 4]) -> u32 {
        u32::from_be_bytes(ue).wrapping_sub(self.pool_base)
    }

    /// The IPv6 /64 at `place`, as its first 8 bytes (`None`: no IPv6 pool).
    fn prefix_at(&self, place: u32) -> Option<[u8; 8]> {
        self.pool6
            .map(|first| (first + u64::from(place)).to_be_bytes())
    }

    /// The place in the pool of a packet's destination: an IPv4 address of the pool, or an
    /// address in a /64 of the IPv6 pool; `None` for others.
    fn place_of_destination(&self, parsed: &Parsed) -> Option<u32> {
        let d = &parsed.key.dst;
        let place = match parsed.key.ip_version {
            4 => u32::from_be_bytes([d[0], d[1], d[2], d[3]]).wrapping_sub(self.pool_base),
            6 => {
                let upper = u64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]);
                let place = upper.wrapping_sub(self.pool6?);
                u32::try_from(place).ok()?
            }
            _ => return None,
        };
        (place < self.pool_size).then_some(place)
    }

    /// Makes the address index and this worker's free places again from `sessions`
    /// (every one the table holds), in their order: one whose address an earlier one
    /// already has is deleted, as is one the index has no room for. How many were
    /// deleted.
    fn index_again(&mut self, sessions: Vec<(u64, Session)>, now_ns: u64) -> u64 {
        self.by_ue.clear();
        let mut deleted = 0;
        for (imsi, session) in sessions {
            let ue = u32::from_be_bytes(session.ue);
            if self.by_ue.get(&ue).is_some() || self.by_ue.add_entry(ue, imsi, 0, now_ns).is_err() {
                self.sessions.delete(&imsi);
                deleted += 1;
            }
        }
        self.places = self.free_places();
        deleted
    }

    /// This worker's share of the places, less those its sessions hold.
    fn free_places(&self) -> Places {
        let (worker, workers) = self.share;
        let used = (self.sessions.iter()).map(|(_, s, _)| self.place_of(s.ue));
        Places::share(self.pool_size, worker as u32, workers as u32, used)
    }

    /// The place a replicated subscriber has at every switch.
    fn fixed_place(&self, imsi: u64) -> u32 {
        (imsi % u64::from(self.pool_size)) as u32
    }

    fn to_gateway(&self, parsed: &Parsed, port: u16) -> bool {
        parsed.key.ip_version == 4
            && parsed.key.dst[..4] == self.address
            && parsed.key.dst_port == port
    }

    /// The subscriber whose tunnel end in `space` (S11 or S1-U) is `teid`: `Ok(imsi)`;
    /// `Err(Some(place))`, a place of the pool with no session here; `Err(None)`, no
    /// place.
    fn subscriber_at(&self, teid: u32, space: u32) -> Result<u64, Option<u32>> {
        let place = teid & !TEID_SPACE;
        if teid & TEID_SPACE != space || place >= self.pool_size {
            return Err(None);
        }
        self.by_ue
            .get(&(self.pool_base + place))
            .copied()
            .ok_or(Some(place))
    }

    /// Where a packet to the gateway or a subscriber stands: `Ok(imsi)`, the subscriber
    /// it reads or writes (a Create Session Request names it by IMSI, other signaling and
    /// uplink by TEID, downlink by address); `Err(Some(place))`, a place in the pool with
    /// no session here; `Err(None)`, neither (it makes no state).
    fn subscriber_of(&self, data: &[u8], parsed: &Parsed) -> Result<u64, Option<u32>> {
        let f = parsed.flags;
        if parsed.key.ip_version == 0 {
            return Err(None);
        }
        if f.has(ParseFlags::GTPC) && self.to_gateway(parsed, GTPC_PORT) {
            let gtp = data.get(usize::from(parsed.gtp_offset)..).unwrap_or(&[]);
            let signal = Signal::read(gtp).map_err(|_| None)?;
            let header = signal.header;
            return match header.message_type {
                gtpv2_type::CREATE_SESSION_REQUEST => signal.imsi.flatten().ok_or(None),
                gtpv2_type::MODIFY_BEARER_REQUEST | gtpv2_type::DELETE_SESSION_REQUEST => {
                    self.subscriber_at(header.teid.unwrap_or(0), S11_TEIDS)
                }
                _ => Err(None),
            };
        }
        if f.has(ParseFlags::GTPU) && self.to_gateway(parsed, GTPU_PORT) {
            return self.subscriber_at(parsed.teid, S1U_TEIDS);
        }
        let place = self.place_of_destination(parsed).ok_or(None)?;
        self.by_ue
            .get(&(self.pool_base + place))
            .copied()
            .ok_or(Some(place))
    }

    /// Makes the session of the subscriber `imsi` the one the store holds (`None`: none),
    /// with its address entry. Refused (`false`, nothing changed) when a table has no
    /// room, or when the address is another subscriber's here.
    fn install(&mut self, imsi: u64, state: Option<&[u8]>, now: u64) -> bool {
        let before = self.sessions.get(&imsi).copied();
        let Some(state) = state.filter(|s| !s.is_empty()) else {
            if let Some(old) = before {
                self.sessions.delete(&imsi);
                self.by_ue.delete(&u32::from_be_bytes(old.ue));
            }
            return true;
        };
        if !self.sessions.install_replicated(imsi, Some(state), now) {
            return false;
        }
        let Some(session) = self.sessions.get(&imsi).copied() else {
            return false;
        };
        let ue = u32::from_be_bytes(session.ue);
        let restore = |sgw: &mut Sgw| match before {
            Some(b) => {
                if let Some(id) = sgw.sessions.find_id(&imsi) {
                    *sgw.sessions.value_mut(id) = b;
                }
            }
            None => {
                sgw.sessions.delete(&imsi);
            }
        };
        if self.by_ue.get(&ue).is_some_and(|&other| other != imsi) {
            restore(self);
            return false;
        }
        if let Some(old) = before.filter(|b| b.ue != session.ue) {
            self.by_ue.delete(&u32::from_be_bytes(old.ue));
        }
        if self.by_ue.get(&ue).is_none() && self.by_ue.add_entry(ue, imsi, 0, now).is_err() {
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
                Ok(answer) => Step::Answer(answer),
                Err(reason) => Step::Done(Verdict::Drop(reason)),
            };
        }
        if f.has(ParseFlags::GTPU) && self.to_gateway(parsed, GTPU_PORT) {
            let at = usize::from(parsed.gtp_offset);
            let Some(gtp) = data.get(at..).map(GtpuPacket::new_unchecked) else {
                return Step::Done(Verdict::Drop(NO_ROOM));
            };
            if gtp.message_type() == GTPU_ECHO_REQUEST {
                return Step::EchoUserPlane(gtp.sequence());
            }
            let session = (self.subscriber_at(parsed.teid, S1U_TEIDS).ok())
                .and_then(|imsi| self.sessions.get(&imsi));
            if gtp.message_type() != GTPU_T_PDU {
                return Step::Done(Verdict::Drop(NO_SESSION));
            }
            let Some(s) = session else {
                // TS 29.281 7.3.1: the eNodeB learns the bearer is gone and releases it.
                if now < self.next_error_indication_ns {
                    return Step::Done(Verdict::Drop(NO_SESSION));
                }
                self.next_error_indication_ns = now.saturating_add(ERROR_INDICATION_GAP_NS);
                self.error_indications += 1;
                return Step::ErrorIndication(parsed.teid);
            };
            // A session's TEID is good only from its eNodeB (any, until the MME names
            // one: the eNodeB may send before the MME's Modify Bearer Request arrives),
            // and its packets only from its subscriber's address (a P-GW's source address
            // check): a guessed TEID or a subscriber sending as another is not let into
            // the core.
            let outer = &parsed.key.src;
            if s.has_enb() && [outer[0], outer[1], outer[2], outer[3]] != s.enb {
                return Step::Done(Verdict::Drop(WRONG_ENB));
            }
            let inner = at + gtp.header_len();
            let from_subscriber = match data.get(inner).map(|b| b >> 4) {
                Some(4) => s.carries(false) && data.get(inner + 12..inner + 16) == Some(&s.ue),
                Some(6) => {
                    let prefix = self.prefix_at(self.place_of(s.ue));
                    s.carries(true)
                        && prefix.is_some_and(|p| data.get(inner + 8..inner + 16) == Some(&p))
                }
                _ => false,
            };
            if !from_subscriber {
                return Step::Done(Verdict::Drop(SPOOFED));
            }
            return Step::Decapsulate(inner);
        }
        let Some(place) = self.place_of_destination(parsed) else {
            return Step::Done(Verdict::Drop(NOT_ROUTED));
        };
        let v6 = parsed.key.ip_version == 6;
        let session = (self.by_ue.get(&(self.pool_base + place)))
            .and_then(|imsi| self.sessions.get(imsi))
            .filter(|s| s.carries(v6));
        match session {
            Some(s) if s.has_enb() => Step::Encapsulate(*s),
            Some(_) => Step::Done(Verdict::Drop(NO_BEARER)),
            None => Step::Done(Verdict::Drop(NO_SESSION)),
        }
    }

    /// Applies a GTPv2-C request to the sessions: the answer it gets, counted.
    fn signal(&mut self, gtp: &[u8], now: u64) -> Result<Answer, DropReason> {
        let answer = self.apply(gtp, now)?;
        if answer.request == gtpv2_type::ECHO_REQUEST {
            self.echoes += 1;
        } else if let Some(i) = ANSWERS.iter().position(|(c, _)| *c == answer.cause) {
            self.answered[i] += 1;
        }
        Ok(answer)
    }

    /// What a GTPv2-C message does to the sessions: the answer it gets, accepting or
    /// refusing (`Err`: unreadable, or of a type the gateway does not take; unanswered).
    fn apply(&mut self, gtp: &[u8], now: u64) -> Result<Answer, DropReason> {
        let signal = Signal::read(gtp)?;
        let h = signal.header;
        let answer = |teid: u32, cause: u8| Answer {
            request: h.message_type,
            sequence: h.sequence,
            teid: Some(teid),
            cause,
            offending: None,
            created: None,
        };
        let missing = |teid: u32, ie: (u8, u8)| Answer {
            offending: Some(ie),
            ..answer(teid, gtpv2_cause::MANDATORY_IE_MISSING)
        };
        let incorrect = |teid: u32, ie: (u8, u8)| Answer {
            offending: Some(ie),
            ..answer(teid, gtpv2_cause::MANDATORY_IE_INCORRECT)
        };
        match h.message_type {
            gtpv2_type::ECHO_REQUEST => Ok(Answer {
                teid: None,
                ..answer(0, gtpv2_cause::REQUEST_ACCEPTED)
            }),
            gtpv2_type::CREATE_SESSION_REQUEST => {
                let mme = signal.mme_teid.unwrap_or(0);
                let imsi = match signal.imsi {
                    None => return Ok(missing(mme, (gtpv2_ie::IMSI, 0))),
                    Some(None) => return Ok(incorrect(mme, (gtpv2_ie::IMSI, 0))),
                    Some(Some(imsi)) => imsi,
                };
                if let Some(holder) = signal.bad_fteid {
                    return Ok(incorrect(mme, holder));
                }
                let Some(mme_teid) = signal.mme_teid else {
                    return Ok(missing(mme, (gtpv2_ie::F_TEID, 0)));
                };
                let (pdn, accepted) = match (signal.pdn.unwrap_or(pdn_type::IPV4), self.pool6) {
                    (pdn_type::IPV4, _) => (pdn_type::IPV4, gtpv2_cause::REQUEST_ACCEPTED),
                    (pdn @ (pdn_type::IPV6 | pdn_type::IPV4V6), Some(_)) => {
                        (pdn, gtpv2_cause::REQUEST_ACCEPTED)
                    }
                    (pdn_type::IPV4V6, None) => {
                        (pdn_type::IPV4, gtpv2_cause::NEW_PDN_TYPE_NETWORK_PREFERENCE)
                    }
                    (pdn_type::IPV6, None) => {
                        return Ok(answer(mme, gtpv2_cause::PREFERRED_PDN_TYPE_NOT_SUPPORTED));
                    }
                    _ => return Ok(incorrect(mme, (gtpv2_ie::PDN_TYPE, 0))),
                };
                let (enb, enb_teid) = signal.enb.unwrap_or_default();
                let session = Session {
                    enb,
                    enb_teid,
                    ue: [0; 4],
                    mme_teid,
                    pdn,
                };
                Ok(match self.create(imsi, session, now) {
                    Ok(place) => Answer {
                        created: Some((place, pdn)),
                        ..answer(mme, accepted)
                    },
                    Err(cause) => answer(mme, cause),
                })
            }
            gtpv2_type::MODIFY_BEARER_REQUEST => {
                let teid = h.teid.unwrap_or(0);
                let Some(id) = (self.subscriber_at(teid, S11_TEIDS).ok())
                    .and_then(|imsi| self.sessions.lookup(&imsi, now))
                else {
                    return Ok(answer(0, gtpv2_cause::CONTEXT_NOT_FOUND));
                };
                let s = self.sessions.value_mut(id);
                let mme = signal.mme_teid.unwrap_or(s.mme_teid);
                if let Some(holder) = signal.bad_fteid {
                    return Ok(incorrect(mme, holder));
                }
                let Some((enb, enb_teid)) = signal.enb else {
                    return Ok(missing(mme, (gtpv2_ie::BEARER_CONTEXT, 0)));
                };
                (s.enb, s.enb_teid, s.mme_teid) = (enb, enb_teid, mme);
                Ok(answer(mme, gtpv2_cause::REQUEST_ACCEPTED))
            }
            gtpv2_type::DELETE_SESSION_REQUEST => {
                let teid = h.teid.unwrap_or(0);
                let Some((imsi, old)) = (self.subscriber_at(teid, S11_TEIDS).ok())
                    .and_then(|imsi| Some((imsi, *self.sessions.get(&imsi)?)))
                else {
                    return Ok(answer(0, gtpv2_cause::CONTEXT_NOT_FOUND));
                };
                self.remove(imsi, old);
                Ok(answer(old.mme_teid, gtpv2_cause::REQUEST_ACCEPTED))
            }
            _ => Err(BAD_SIGNALING),
        }
    }

    /// Makes `session` (its address aside) the session of the subscriber `imsi`: its
    /// place in the pool, or why not (a cause). A subscriber that has one keeps its place.
    fn create(&mut self, imsi: u64, mut session: Session, now: u64) -> Result<u32, u8> {
        if let Some(id) = self.sessions.lookup(&imsi, now) {
            let s = self.sessions.value_mut(id);
            *s = Session {
                ue: s.ue,
                ..session
            };
            let ue = s.ue;
            return Ok(self.place_of(ue));
        }
        let occupied = gtpv2_cause::ALL_DYNAMIC_ADDRESSES_OCCUPIED;
        let place = if self.sessions.replicated() {
            let place = self.fixed_place(imsi);
            if self.by_ue.get(&(self.pool_base + place)).is_some() {
                return Err(occupied);
            }
            place
        } else {
            self.places.take().ok_or(occupied)?
        };
        let ue = self.address_at(place);
        session.ue = ue;
        if self.sessions.add_entry(imsi, session, 0, 0).is_err() {
            self.free(place);
            return Err(gtpv2_cause::NO_RESOURCES_AVAILABLE);
        }
        if self
            .by_ue
            .add_entry(u32::from_be_bytes(ue), imsi, 0, 0)
            .is_err()
        {
            self.sessions.delete(&imsi);
            self.free(place);
            return Err(gtpv2_cause::NO_RESOURCES_AVAILABLE);
        }
        Ok(place)
    }

    /// Ends the session `old` of the subscriber `imsi`.
    fn remove(&mut self, imsi: u64, old: Session) {
        self.sessions.delete(&imsi);
        self.by_ue.delete(&u32::from_be_bytes(old.ue));
        self.free(self.place_of(old.ue));
    }

    /// A place no longer taken (replicated places are nobody's to hand out).
    fn free(&mut self, place: u32) {
        if !self.sessions.replicated() && place < self.pool_size {
            self.places.give_back(place);
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

    /// The information elements of `answer`, written to `buf`: their length. An Echo
    /// Response carries the restart counter (0: the gateway keeps no count of its
    /// restarts); every other response its cause, with the offending element for one
    /// missing or unreadable; a Create Session Response that accepts also gives the
    /// gateway's tunnel ends (its S11 F-TEID for the MME's signaling, and in the bearer
    /// context, with the bearer's id, its S1-U F-TEID for the eNodeB's uplink) and the
    /// subscriber's address (PAA), as TS 29.274 7.2.2 lays them out.
    fn response_ies(&self, answer: &Answer, buf: &mut [u8]) -> stateplane_wire::Result<usize> {
        if answer.request == gtpv2_type::ECHO_REQUEST {
            return emit_gtpv2_ie(buf, gtpv2_ie::RECOVERY, 0, &[0]);
        }
        let cause = match answer.offending {
            // The offending element's type, a length of 0 and its instance (TS 29.274 8.4).
            Some((ie, instance)) => &[answer.cause, 0, ie, 0, 0, instance][..],
            None => &[answer.cause, 0][..],
        };
        let mut at = emit_gtpv2_ie(buf, gtpv2_ie::CAUSE, 0, cause)?;
        let Some((place, pdn)) = answer.created else {
            return Ok(at);
        };
        let fteid = |interface: u8, space: u32| {
            let mut f = [0u8; 9];
            let end = Fteid {
                interface,
                teid: space | place,
                v4: Some(self.address),
                v6: None,
            };
            end.emit(&mut f).map(|_| f)
        };
        let s11 = fteid(fteid_interface::S11_SGW, S11_TEIDS)?;
        // The Sender F-TEID for Control Plane: instance 0 (TS 29.274 table 7.2.2-1).
        at += emit_gtpv2_ie(&mut buf[at..], gtpv2_ie::F_TEID, 0, &s11)?;
        // The PDN type; for IPv6, the prefix length and the /64; for IPv4, the address.
        let mut paa = [0u8; 22];
        paa[0] = pdn;
        let mut p = 1;
        if pdn & pdn_type::IPV6 != 0 {
            let prefix = self
                .prefix_at(place)
                .ok_or(stateplane_wire::Error::Malformed)?;
            paa[1] = 64;
            paa[2..10].copy_from_slice(&prefix);
            p = 18;
        }
        if pdn & pdn_type::IPV4 != 0 {
            paa[p..p + 4].copy_from_slice(&self.address_at(place));
            p += 4;
        }
        at += emit_gtpv2_ie(&mut buf[at..], gtpv2_ie::PAA, 0, &paa[..p])?;
        let mut bearer = [0u8; 32];
        let accepted = [gtpv2_cause::REQUEST_ACCEPTED, 0];
        let mut b = emit_gtpv2_ie(&mut bearer, gtpv2_ie::EBI, 0, &[DEFAULT_BEARER])?;
        b += emit_gtpv2_ie(&mut bearer[b..], gtpv2_ie::CAUSE, 0, &accepted)?;
        let s1u = fteid(fteid_interface::S1U_SGW, S1U_TEIDS)?;
        b += emit_gtpv2_ie(&mut bearer[b..], gtpv2_ie::F_TEID, 0, &s1u)?;
        at += emit_gtpv2_ie(&mut buf[at..], gtpv2_ie::BEARER_CONTEXT, 0, &bearer[..b])?;
        Ok(at)
    }

    /// Turns packet `i`, a signaling request, into its `answer`, with the information
    /// elements of [`Sgw::response_ies`] ([`Sgw::reply`]).
    fn answer(&self, burst: &mut Burst, i: usize, answer: &Answer) -> Verdict {
        let mut message = [0u8; 160];
        let header = Gtpv2Repr {
            message_type: answer.request + 1,
            teid: answer.teid,
            sequence: answer.sequence,
            payload_len: 0,
        };
        let at = header.header_len();
        let written = self
            .response_ies(answer, &mut message[at..])
            .and_then(|ies| {
                let header = Gtpv2Repr {
                    payload_len: ies as u16,
                    ..header
                };
                header.emit(&mut message).map(|()| at + ies)
            });
        match written {
            Ok(len) => self.reply(burst, i, GTPC_PORT, &message[..len]),
            Err(_) => Verdict::Drop(NO_ROOM),
        }
    }

    /// Turns packet `i`, a GTP-U Echo Request, into its Echo Response (TS 29.281 7.2.2):
    /// TEID 0, the request's sequence number, the restart counter (Recovery, 0).
    fn echo_user_plane(&self, burst: &mut Burst, i: usize, sequence: Option<u16>) -> Verdict {
        let mut message = [0u8; 14];
        let header = GtpuRepr {
            message_type: GTPU_ECHO_RESPONSE,
            teid: 0,
            sequence: Some(sequence.unwrap_or(0)),
            payload_len: 2,
        };
        let at = header.header_len();
        message[at..at + 2].copy_from_slice(&[GTPU_RECOVERY, 0]);
        match header.emit(&mut message) {
            Ok(()) => self.reply(burst, i, GTPU_PORT, &message[..at + 2]),
            Err(_) => Verdict::Drop(NO_ROOM),
        }
    }

    /// Turns packet `i`, a T-PDU whose TEID `teid` names no session, into an Error
    /// Indication (TS 29.281 7.3.1) to its sender: TEID 0, sequence 0, the TEID (TEID Data
    /// I) and the gateway's address (GTP-U Peer Address).
    fn error_indication(&self, burst: &mut Burst, i: usize, teid: u32) -> Verdict {
        let mut message = [0u8; 24];
        let header = GtpuRepr {
            message_type: GTPU_ERROR_INDICATION,
            teid: 0,
            sequence: Some(0),
            payload_len: 12,
        };
        let at = header.header_len();
        message[at] = GTPU_TEID_DATA_I;
        message[at + 1..at + 5].copy_from_slice(&teid.to_be_bytes());
        message[at + 5..at + 8].copy_from_slice(&[GTPU_PEER_ADDRESS, 0, 4]);
        message[at + 8..at + 12].copy_from_slice(&self.address);
        match header.emit(&mut message) {
            Ok(()) => self.reply(burst, i, GTPU_PORT, &message[..at + 12]),
            Err(_) => Verdict::Drop(NO_ROOM),
        }
    }

    /// Makes packet `i` a datagram carrying `message` from the gateway's `port` back to
    /// the address and port it came from, out of the port it came in by, the MAC
    /// addresses swapped.
    fn reply(&self, burst: &mut Burst, i: usize, port: u16, message: &[u8]) -> Verdict {
        let d = burst.descs()[i];
        let (l2, old_len) = (usize::from(d.parsed.l3_offset), d.len as usize);
        let mut frame = [0u8; 256];
        // An Ethernet header (and VLAN tags), as the parser gave it.
        let fits = (12..frame.len().saturating_sub(28 + message.len())).contains(&l2);
        let Some(link) = burst.data(i).get(..l2).filter(|_| fits) else {
            return Verdict::Drop(NO_ROOM);
        };
        frame[..l2].copy_from_slice(link);
        frame[..6].copy_from_slice(&link[6..12]);
        frame[6..12].copy_from_slice(&link[..6]);
        let k = &d.parsed.key;
        let peer = [k.src[0], k.src[1], k.src[2], k.src[3]];
        let at = l2 + 28;
        let len = at + message.len();
        frame[at..len].copy_from_slice(message);
        let written = self.emit_udp(&mut frame[l2..], peer, (port, k.src_port), message.len());
        // Written from the packet's start: a longer reply takes headroom, a shorter one
        // leaves the packet's tail behind.
        let resized = written.is_ok()
            && if len >= old_len {
                burst.grow_front(i, len - old_len).is_some()
            } else {
                burst.truncate(i, len)
            };
        if !resized {
            return Verdict::Drop(NO_ROOM);
        }
        let p = burst.packet_mut(i);
        p.data[..len].copy_from_slice(&frame[..len]);
        // All of the reply is there, whatever the capture cut of the request.
        p.desc.orig_len = len as u32;
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
        if self.share != (ctx.worker, ctx.workers) {
            self.share = (ctx.worker, ctx.workers);
            self.places = self.free_places();
        }
        for i in 0..burst.len() {
            let step = {
                let p = burst.packet_mut(i);
                self.step(p.data, &p.desc.parsed, ctx.now_ns)
            };
            let verdict = match step {
                Step::Done(v) => v,
                Step::Encapsulate(s) => self.encapsulate(burst, i, s),
                Step::Decapsulate(inner) => self.decapsulate(burst, i, inner),
                Step::Answer(answer) => self.answer(burst, i, &answer),
                Step::EchoUserPlane(sequence) => self.echo_user_plane(burst, i, sequence),
                Step::ErrorIndication(teid) => self.error_indication(burst, i, teid),
            };
            burst.descs_mut()[i].verdict = verdict;
        }
    }

    /// Each worker holds the sessions of its own places, and packets reach it by
    /// subscriber ([`Sgw::steering`]), on live ports and over files alike. But a
    /// replicated subscriber's place is its IMSI's at every switch, not one its worker
    /// handed out.
    fn check_workers(&self, workers: usize, _live: bool) -> Result<(), String> {
        if workers > 1 && self.sessions.replicated() {
            return Err(format!(
                "a replicated sgw runs on one worker: a subscriber's place is its IMSI modulo the pool at every switch, so its packets would reach a worker other than the one holding its session (with {workers}, dropped as no_session); set workers = 1 (--workers 1)"
            ));
        }
        Ok(())
    }

    /// Packets are spread by subscriber: each place's packets (its GTP by TEID, downlink
    /// by address) reach worker `place % workers`, whose share of the pools it is; a
    /// Create Session Request goes by its IMSI, so a subscriber asking again finds its
    /// session.
    fn steering(&self, _port: PortId) -> Steering {
        Steering::Subscriber {
            gateway: u32::from_be_bytes(self.address),
            pool: self.pool_base,
            pool6: self.pool6.map_or(0, |first| first as u32),
        }
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        &[
            "no_session",
            "bad_signaling",
            "not_routed",
            "no_room",
            "wrong_enb",
            "spoofed",
            "no_bearer",
        ]
    }

    fn declarations(&self) -> Vec<Declaration> {
        vec![self.sessions.declaration().clone()]
    }

    /// As `answer_by_table!`, but for inserts and modifies, which are refused; a session
    /// the control plane deletes takes its address entry with it and frees its place. The table's stats add the signaling answered,
    /// by cause, and the echo requests.
    fn control(
        &mut self,
        request: &Request,
        _prepared: Option<&std::sync::Arc<Self::Prepared>>,
        ctx: &Context,
    ) -> Result<Reply, ControlError> {
        // A session is a place handed out with its address indexed, on the worker whose
        // share the place is: only signaling makes one.
        if let Request::Write { table, writes } = request
            && *table == self.sessions.declaration().name
            && writes.iter().any(|w| !matches!(w, Write::Delete(_)))
        {
            return Err(ControlError::Invalid {
                what: format!("a write of {table}"),
                why: "sessions are made and changed by the MME's signaling (Create Session, \
                      Modify Bearer Request), which gives each its place, address and TEIDs; \
                      the control plane reads and deletes them"
                    .into(),
            });
        }
        let mut gone = Vec::new();
        let reply =
            (self.sessions).answer_seeing_deletes(request, ctx.now_ns, |_, s| gone.push(*s))?;
        for s in gone {
            self.by_ue.delete(&u32::from_be_bytes(s.ue));
            self.free(self.place_of(s.ue));
        }
        Ok(match reply {
            Reply::Counters(mut counters) => {
                let answered = ANSWERS.iter().zip(self.answered);
                counters.extend(answered.map(|((_, name), n)| (*name, n)));
                counters.push(("echo_requests", self.echoes));
                counters.push(("error_indications", self.error_indications));
                Reply::Counters(counters)
            }
            other => other,
        })
    }

    fn notifications(&mut self, out: &mut Vec<Notification>) {
        self.sessions.take_notifications(out);
    }

    crate::synced_tables::synced_table_methods!(sessions, after_commit: index_again);

    /// `sessions` replicated, each subscriber a flow with its address as alias.
    fn replicate(&mut self, name: &str) -> bool {
        self.sessions.replicate(name, false)
    }

    fn replicated_key(&self, d: &PacketDesc, data: &[u8]) -> Option<FlowBytes> {
        if !self.sessions.replicated() {
            return None;
        }
        let imsi = self.subscriber_of(data, &d.parsed).ok()?;
        replicated::subscriber(imsi, self.fixed_place(imsi))
    }

    fn replicated_alias(&self, d: &PacketDesc, data: &[u8]) -> Option<FlowBytes> {
        if !self.sessions.replicated() {
            return None;
        }
        match self.subscriber_of(data, &d.parsed) {
            Err(Some(place)) => replicated::place(place),
            _ => None,
        }
    }

    fn replicated_alias_of(&self, flow: &FlowBytes) -> Option<FlowBytes> {
        let session = self.sessions.get(&replicated::imsi_of(flow)?)?;
        replicated::place(self.place_of(session.ue))
    }

    fn replicated_state(&self, flow: &FlowBytes) -> Option<Vec<u8>> {
        stateplane_runtime::state_alone(|out, hint| self.replicated_state_into(flow, out, hint))
    }

    fn replicated_state_into(
        &self,
        flow: &FlowBytes,
        out: &mut Vec<u8>,
        hint: &mut u32,
    ) -> Option<u64> {
        let imsi = replicated::imsi_of(flow)?;
        self.sessions.replicated_state_into(&imsi, out, hint)
    }

    fn install_replicated(&mut self, flow: &FlowBytes, state: Option<&[u8]>, now_ns: u64) -> bool {
        replicated::imsi_of(flow).is_some_and(|imsi| self.install(imsi, state, now_ns))
    }

    /// Sessions stay while the gateway's address and the pool do (their eNodeBs send to
    /// the one, their addresses and TEIDs are places in the other), as many as the new
    /// capacity holds; the index by subscriber address and the free places are made again
    /// from the sessions kept, and the signaling counts go on.
    fn inherit(&mut self, mut old: Self, now_ns: u64) -> Vec<Carried> {
        let pool = |s: &Sgw| {
            let v4 = format!(
                "{}/{}",
                Ipv4Addr::from(s.pool_base),
                32 - s.pool_size.trailing_zeros()
            );
            match s.pool6 {
                Some(first) => {
                    let v6 = std::net::Ipv6Addr::from(u128::from(first) << 64);
                    format!("{v4} and {v6}/{}", 64 - s.pool_size.trailing_zeros())
                }
                None => v4,
            }
        };
        let why = if old.address != self.address {
            format!(
                "the gateway's address changed from {} to {}",
                Ipv4Addr::from(old.address),
                Ipv4Addr::from(self.address)
            )
        } else if (old.pool_base, old.pool_size, old.pool6)
            != (self.pool_base, self.pool_size, self.pool6)
        {
            format!(
                "the subscriber pools changed from {} to {} (a session's addresses and TEIDs are its place in the pools)",
                pool(&old),
                pool(self)
            )
        } else {
            String::new()
        };
        (self.answered, self.echoes) = (old.answered, old.echoes);
        self.error_indications = old.error_indications;
        if !why.is_empty() {
            return vec![Carried::afresh("sessions", why)];
        }
        let carried = self.sessions.adopt(&mut old.sessions);
        self.share = old.share;
        // The tables are the same size and the old one's addresses were each one's.
        let kept = (self.sessions.iter())
            .map(|(imsi, s, _)| (*imsi, *s))
            .collect();
        self.index_again(kept, now_ns);
        vec![carried]
    }
}

#[cfg(test)]
mod tests;
