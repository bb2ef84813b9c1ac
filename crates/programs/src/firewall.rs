//! `firewall`: a stateful firewall, `conntrack` behind an `acl` policy.
//!
//! A packet of a connection the tracker knows passes, whichever side sent it (its state
//! moves on as in `conntrack`). A packet of no known connection is judged by where it came
//! from: from the inside port, the policy's outbound rules (an `acl`: first match wins,
//! `default` permit unless said otherwise) decide whether it may open one; from any other
//! port only an inbound rule (`direction = "in"`, as pf's `pass in`) lets it open one, and
//! with none matching it is dropped (`unsolicited`). So the inside reaches out as policy
//! allows, and the outside gets in as answers and where an inbound rule permits.
//!
//! What is tracked is `conntrack`'s: TCP (opened by a SYN), UDP and ICMP echo. Other IP
//! packets are judged on their own: from the inside by the policy, from outside dropped as
//! `unsolicited`, except ICMP errors (destination unreachable, time exceeded, parameter
//! problem; ICMPv6 also packet too big), which path MTU discovery and traceroute need:
//! one from outside passes when the packet it quotes belongs to a tracked connection (as
//! Linux conntrack's RELATED and pf's state match have it; a TCP segment must also lie
//! within the connection's windows, as pf checks), and is dropped as
//! `unrelated_icmp` when it quotes a TCP, UDP or echo packet of none, or a packet it does
//! not quote whole (an IP header and 8 bytes), so forged errors cannot reset or slow a
//! connection; one quoting a protocol the tracker does not follow passes, as there is no
//! state to check it against. The parser hands each error to the worker of the
//! connection it quotes; on live ports with several workers the kernel spreads packets
//! instead, by its own hash, and an error may reach another worker than its connection's:
//! there an error that matches none of its worker's connections passes unchecked, as
//! before (one live worker, and every run over files, check them all). Non-IP frames
//! (ARP) pass, and so does IPv6 neighbor discovery from the link itself (hop limit 255),
//! without which IPv6 hosts on the two sides would not find each other. Forwarding is `forward`'s port map
//! (default port 0 <-> 1).
//!
//! The policy judges the first packet of a connection only; its per-rule counters count
//! connection attempts and its policers (`rule_meters`) limit their rate.
//!
//! State: the policy's `rules` (read-centric, shared, from configuration and the control
//! plane), `rule_packets`/`rule_bytes`/`rule_meters` (per worker), and `connections`
//! (write-centric, per worker) as `conntrack` declares them, which may be `synced` and
//! `replicated` as `conntrack`'s (the policy has nothing derived from them).
//! Configuration: `inside` (default port 0), `rules`, `default`, `capacity` (rules) as
//! `acl`; `connections` (per worker, default 65536) and `timeouts` as `conntrack`; `map`
//! as `forward`.

use crate::acl::{Acl, AclConfig, AclRule, Judgement};
use crate::conntrack::{Conntrack, ConntrackConfig, Refusal, Timeouts, tracked};
use crate::forward::{Forward, ForwardConfig};
use crate::{ConfigError, PortNames};
use serde::Deserialize;
use stateplane_runtime::{Burst, Context, DropReason, PacketDesc, PortId, Program, Verdict};
use stateplane_state::{Carried, ControlError, Declaration, Notification, Reply, Request};
use stateplane_wire::icmp;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FirewallConfig {
    #[serde(default = "default_inside")]
    pub inside: String,
    /// The policy for connections opened from the inside.
    #[serde(default)]
    pub rules: Vec<AclRule>,
    /// "permit" (the default) or "deny" for connections no rule matches.
    #[serde(default = "default_permit")]
    pub default: String,
    /// Rules at most.
    #[serde(default = "default_rules")]
    pub capacity: usize,
    /// Connections per worker.
    #[serde(default = "default_connections")]
    pub connections: usize,
    #[serde(default)]
    pub timeouts: Timeouts,
    /// TCP segments are checked against their connection's windows, as `conntrack`'s.
    #[serde(default = "crate::default_true")]
    pub window_checks: bool,
    #[serde(default)]
    pub map: BTreeMap<String, String>,
}

impl Default for FirewallConfig {
    /// What a `[program.firewall]` table with nothing in it gives.
    fn default() -> Self {
        FirewallConfig {
            inside: default_inside(),
            rules: Vec::new(),
            default: default_permit(),
            capacity: default_rules(),
            connections: default_connections(),
            timeouts: Timeouts::default(),
            window_checks: true,
            map: BTreeMap::new(),
        }
    }
}

fn default_inside() -> String {
    "0".into()
}

fn default_permit() -> String {
    "permit".into()
}

fn default_rules() -> usize {
    4096
}

fn default_connections() -> usize {
    65_536
}

const DENIED: DropReason = DropReason::program(1);
const POLICED: DropReason = DropReason::program(2);
pub(crate) const UNSOLICITED: DropReason = DropReason::program(3);
pub(crate) const INVALID: DropReason = DropReason::program(4);
pub(crate) const TABLE_FULL: DropReason = DropReason::program(5);
pub(crate) const UNRELATED_ICMP: DropReason = DropReason::program(6);
pub(crate) const OUT_OF_WINDOW: DropReason = DropReason::program(7);

/// Why the firewall drops a packet the tracker refused.
fn refused(refusal: Refusal) -> DropReason {
    match refusal {
        Refusal::Unknown | Refusal::Invalid => INVALID,
        Refusal::TableFull => TABLE_FULL,
        Refusal::OutOfWindow => OUT_OF_WINDOW,
        Refusal::NotLeased => DropReason::NOT_LEASED,
    }
}

/// IPv6 neighbor discovery (router and neighbor solicitations and advertisements,
/// redirects) sent with hop limit 255, which no router forwards (RFC 4861 section 7.1):
/// it comes from the link itself, and a transparent firewall lets it cross, since
/// without it no host on one side finds one on the other (RFC 4890 section 4.4.1).
pub(crate) fn neighbor_discovery(parsed: &stateplane_wire::parse::Parsed) -> bool {
    parsed.key.proto == 58
        && parsed.key.ip_version == 6
        && (133..=137).contains(&(parsed.key.dst_port >> 8))
        && parsed.ttl == 255
}

#[derive(Clone)]
pub struct Firewall {
    inside: PortId,
    forward: Forward,
    policy: Acl,
    conntrack: Conntrack,
}

impl Firewall {
    /// The connection a packet belongs to: its replicated key (`conntrack`'s).
    fn connection_of(&self, packet: &PacketDesc, data: &[u8]) -> Option<stateplane_wire::FlowKey> {
        self.conntrack.connection_of(packet, data)
    }

    /// Takes `old`'s connections (a reload), as `conntrack` does.
    pub(crate) fn inherit_connections(&mut self, old: &mut Firewall) -> Carried {
        self.conntrack.inherit_connections(&mut old.conntrack)
    }

    pub fn new(
        cfg: &FirewallConfig,
        ports: &PortNames,
        field: &str,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        crate::check_capacity(
            &format!("{field}.connections"),
            cfg.connections,
            "connections",
        )?;
        let policy = Acl::with_directions(
            &AclConfig {
                rules: cfg.rules.clone(),
                default: Some(cfg.default.clone()),
                map: BTreeMap::new(),
                router: None,
                capacity: cfg.capacity,
            },
            ports,
            field,
        )?;
        let conntrack = Conntrack::new(
            &ConntrackConfig {
                capacity: cfg.connections,
                drop_invalid: true,
                early_drop: true,
                window_checks: cfg.window_checks,
                timeouts: cfg.timeouts.clone(),
                map: BTreeMap::new(),
            },
            ports,
            field,
            seed,
        )?;
        Ok(Firewall {
            inside: ports.resolve(&format!("{field}.inside"), &cfg.inside)?,
            forward: Forward::new(
                &ForwardConfig {
                    map: cfg.map.clone(),
                },
                ports,
                field,
            )?,
            policy,
            conntrack,
        })
    }

    pub fn connections(&self) -> usize {
        self.conntrack.connections()
    }

    /// Why to drop an ICMP error from outside (`d`, its frame `data`): `None` if the
    /// packet it quotes belongs to a tracked connection (a TCP one within its windows, as
    /// pf checks) or to a protocol not tracked, or
    /// the worker cannot know (`by_hash` false: the kernel may have handed the error to
    /// another worker than its connection's, [`Context::by_hash`]).
    fn related(&mut self, d: &PacketDesc, data: &[u8], by_hash: bool) -> Option<DropReason> {
        let Ok(quoted) = icmp::quoted_by(data, &d.parsed) else {
            return Some(UNRELATED_ICMP);
        };
        let key = quoted.key;
        // A TCP quote's sequence number (the 8 bytes quoted are its ports and it).
        let at = usize::from(d.parsed.payload_offset) + quoted.l4_at;
        let seq = (data.get(at + 4..at + 8)).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        let known = match tracked(&key) {
            true => self.conntrack.knows(&key, seq, d.ts_ns, d.lease_check),
            false => Ok(true),
        };
        match known {
            Ok(known) => (!known && by_hash).then_some(UNRELATED_ICMP),
            Err(_) => Some(DropReason::NOT_LEASED),
        }
    }

    /// Why to drop packet `d` (`None`: it passes), its connection's state moved on; its
    /// bytes, `data`, are read only where they must be (a TCP segment's windows, an ICMP
    /// error's quote). `by_hash` as [`Context::by_hash`].
    pub(crate) fn judge_packet<'a>(
        &mut self,
        d: &PacketDesc,
        data: impl Fn() -> &'a [u8],
        by_hash: bool,
    ) -> Option<DropReason> {
        let key = d.parsed.key;
        let from_inside = d.in_port == self.inside;
        if key.ip_version == 0 {
            None
        } else if !tracked(&key) {
            if from_inside {
                self.judge(d)
            } else if icmp::is_error_key(&key) {
                self.related(d, data(), by_hash)
            } else if neighbor_discovery(&d.parsed) {
                None
            } else {
                self.judge_inbound(d)
            }
        } else {
            let (flags, now) = (d.parsed.tcp_flags, d.ts_ns);
            let segment = self.conntrack.segment(d, data());
            let segment = segment.as_ref();
            match (self.conntrack).track(&key, flags, segment, now, false, d.lease_check) {
                Ok(()) => None,
                Err(Refusal::Unknown) => {
                    let judged = if from_inside {
                        self.judge(d)
                    } else {
                        self.judge_inbound(d)
                    };
                    judged.or_else(|| {
                        match (self.conntrack).track(&key, flags, segment, now, true, d.lease_check)
                        {
                            Ok(()) => None,
                            Err(refusal) => Some(refused(refusal)),
                        }
                    })
                }
                Err(refusal) => Some(refused(refusal)),
            }
        }
    }

    /// Looks at `budget` slots for connections idle past their state's timeout.
    pub(crate) fn expire(&mut self, now: u64, budget: usize) {
        self.conntrack.expire(now, budget);
    }

    /// Why to drop a packet from the inside of no known connection that may not open
    /// one: `None` to let it on.
    fn judge(&mut self, d: &PacketDesc) -> Option<DropReason> {
        dropped(self.policy.judge(d))
    }

    /// As [`Firewall::judge`], for a packet from outside: only an inbound rule lets it
    /// open a connection; none matching, it is `unsolicited`.
    fn judge_inbound(&mut self, d: &PacketDesc) -> Option<DropReason> {
        self.policy
            .judge_inbound(d)
            .map_or(Some(UNSOLICITED), dropped)
    }
}

/// Why to drop a packet the policy judged: `None` to let it on.
fn dropped(judgement: Judgement) -> Option<DropReason> {
    match judgement {
        Judgement::Permit => None,
        Judgement::Deny => Some(DENIED),
        Judgement::Policed => Some(POLICED),
    }
}

/// What may be synced: the connections, and the policy's rule counters.
impl crate::synced_parts::SyncedParts for Firewall {
    fn synced_views(&self, f: &mut dyn FnMut(&dyn crate::synced_parts::SyncedView)) {
        f(&self.conntrack.table);
        self.policy.synced_views(f);
    }

    fn synced_parts(&mut self, f: &mut dyn FnMut(&mut dyn crate::synced_parts::SyncedPart)) {
        f(&mut self.conntrack.table);
        self.policy.synced_parts(f);
    }
}

impl Program for Firewall {
    /// What the policy prepares (the connections table prepares nothing).
    type Prepared = <Acl as Program>::Prepared;

    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        self.forward.process(burst, ctx);
        let n = burst.len();
        // By index: only a TCP segment's or an ICMP error's bytes are read
        // (`Burst::data`), so no other packet pays for slicing the burst.
        for i in 0..n {
            let d = &burst.descs()[i];
            if matches!(d.verdict, Verdict::Drop(_)) {
                continue;
            }
            if let Some(reason) = self.judge_packet(d, || burst.data(i), ctx.by_hash) {
                burst.descs_mut()[i].verdict = Verdict::Drop(reason);
            }
        }
        self.expire(ctx.now_ns, crate::sweep_budget(n));
    }

    fn poll(&mut self, _out: &mut Burst, ctx: &mut Context) {
        self.expire(ctx.now_ns, crate::IDLE_SWEEP);
    }

    crate::synced_parts::synced_parts_methods!();

    crate::replicated_tables::replicated_table_methods!(
        conntrack.table,
        with_counts: false,
        key: connection_of,
        leases_checked
    );

    /// Connections stay (as `conntrack`'s do), each as it was permitted: the new policy
    /// judges the connections opened from now on, as in Linux, whose tracked connections
    /// outlive a ruleset reloaded, and pf, which keeps its states unless flushed. The
    /// rules are the configuration's: rules written through the control API since the
    /// last start or reload give way to them.
    fn inherit(&mut self, mut old: Self, now_ns: u64) -> Vec<Carried> {
        let connections = self.inherit_connections(&mut old);
        let mut carried = self.policy.inherit(old.policy, now_ns);
        carried.push(connections);
        carried
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        &[
            "no_mapping",
            "denied",
            "policed",
            "unsolicited",
            "invalid",
            "table_full",
            "unrelated_icmp",
            "out_of_window",
        ]
    }

    fn declarations(&self) -> Vec<Declaration> {
        let mut d = self.policy.declarations();
        d.extend(self.conntrack.declarations());
        d
    }

    fn prepare(&self, request: &Request) -> Result<Option<Arc<Self::Prepared>>, ControlError> {
        self.policy.prepare(request)
    }

    fn control(
        &mut self,
        request: &Request,
        prepared: Option<&Arc<Self::Prepared>>,
        ctx: &Context,
    ) -> Result<Reply, ControlError> {
        if request.target() == "connections" {
            self.conntrack.control(request, None, ctx)
        } else {
            self.policy.control(request, prepared, ctx)
        }
    }

    fn notifications(&mut self, out: &mut Vec<Notification>) {
        self.conntrack.notifications(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{hasher, tcp, verdicts};
    use stateplane_gen::build::L4;
    use stateplane_wire::tcp::flags;

    const INSIDE: &str = "198.18.0.1";
    const REMOTE: &str = "198.19.0.2";

    fn firewall(extra: &str) -> Firewall {
        let names = PortNames(vec!["inside".into(), "outside".into()]);
        let cfg: FirewallConfig = toml::from_str(&format!("inside = \"inside\"\n{extra}")).unwrap();
        Firewall::new(&cfg, &names, "program.firewall", 5).unwrap()
    }

    fn frame(src: &str, dst: &str, l4: L4) -> Vec<u8> {
        crate::testutil::ip_frame(src, dst, l4)
    }

    /// Frames from the inside (`true`) or the outside, in one burst; their verdicts.
    fn run(fw: &mut Firewall, frames: &[(Vec<u8>, bool)]) -> Vec<Verdict> {
        run_in(fw, frames, crate::testutil::ctx(1, 2))
    }

    /// As [`run`], in the worker `ctx` says.
    fn run_in(fw: &mut Firewall, frames: &[(Vec<u8>, bool)], mut ctx: Context) -> Vec<Verdict> {
        let mut b = Burst::with_capacity(frames.len());
        for (i, (f, inside)) in frames.iter().enumerate() {
            b.push(f, f.len() as u32, 1, if *inside { 0 } else { 1 }, i as u64);
        }
        b.parse(&hasher());
        fw.process(&mut b, &mut ctx);
        verdicts(&b)
    }

    const OUT: Verdict = Verdict::Forward(1);
    const IN: Verdict = Verdict::Forward(0);

    #[test]
    fn the_inside_opens_connections_and_the_outside_only_answers() {
        let mut fw = firewall("");
        let out = |l4| (frame(INSIDE, REMOTE, l4), true);
        let back = |l4| (frame(REMOTE, INSIDE, l4), false);
        let echo = |request, ident| L4::IcmpEcho {
            request,
            ident,
            seq: 1,
        };
        let udp = |src_port, dst_port| L4::Udp { src_port, dst_port };
        let got = run(
            &mut fw,
            &[
                // Unsolicited, before anything was opened.
                back(tcp(80, 40_000, flags::SYN | flags::ACK)),
                back(tcp(22, 40_001, flags::SYN)),
                back(echo(true, 5)),
                back(udp(53, 5353)),
                back(tcp(80, 40_000, flags::RST)),
                // Opened from the inside, then answered.
                out(tcp(40_000, 80, flags::SYN)),
                back(tcp(80, 40_000, flags::SYN | flags::ACK)),
                out(tcp(40_000, 80, flags::ACK)),
                out(echo(true, 6)),
                back(echo(false, 6)),
                out(udp(5353, 53)),
                back(udp(53, 5353)),
                // Mid-stream from the inside with no connection: invalid.
                out(tcp(40_002, 80, flags::ACK)),
            ],
        );
        let drop = Verdict::Drop;
        assert_eq!(
            got,
            [
                drop(UNSOLICITED),
                drop(UNSOLICITED),
                drop(UNSOLICITED),
                drop(UNSOLICITED),
                drop(UNSOLICITED),
                OUT,
                IN,
                OUT,
                OUT,
                IN,
                OUT,
                IN,
                drop(INVALID),
            ]
        );
        assert_eq!(fw.connections(), 3);
    }

    /// Synced, a firewall's connections move into another switch (another hash seed, so
    /// other slots): there the answers of the connections opened on the first pass, an
    /// unsolicited packet is still dropped, and the second's own connection stays.
    #[test]
    fn connections_move_to_another_switch_through_their_synced_words() {
        let out = |l4| (frame(INSIDE, REMOTE, l4), true);
        let back = |l4| (frame(REMOTE, INSIDE, l4), false);
        let udp = |src_port, dst_port| L4::Udp { src_port, dst_port };
        let (syn, ack) = (flags::SYN, flags::ACK);
        // A slot: action, key (two addresses of two words, proto, ports, vlan), packets,
        // answered, originator, FINs.
        let stride = 1 + 8 + 4;
        let mut a = firewall("");
        let slots = a.conntrack.table.slot_count() as u32;
        assert_eq!(a.track("connections", 0), Some(slots * stride));
        let opened = [
            out(tcp(40_000, 80, syn)),
            back(tcp(80, 40_000, syn | ack)),
            out(tcp(40_000, 80, ack)),
            out(udp(5353, 53)),
        ];
        assert!(
            run(&mut a, &opened)
                .iter()
                .all(|v| matches!(v, Verdict::Forward(_)))
        );
        let names = PortNames(vec!["inside".into(), "outside".into()]);
        let cfg: FirewallConfig = toml::from_str("inside = \"inside\"").unwrap();
        let mut b = Firewall::new(&cfg, &names, "program.firewall", 77).unwrap();
        assert_eq!(b.track("connections", 0), Some(slots * stride));
        assert_eq!(run(&mut b, &[out(tcp(41_000, 80, syn))]), [OUT]);
        assert_eq!(
            crate::testutil::move_synced_table(&mut a, &mut b, stride),
            (2, 0)
        );
        assert_eq!(b.connections(), 3);
        let got = run(
            &mut b,
            &[
                back(tcp(80, 40_000, ack)),
                back(udp(53, 5353)),
                back(tcp(80, 41_000, syn | ack)),
                back(tcp(80, 40_001, syn | ack)),
            ],
        );
        assert_eq!(got, [IN, IN, IN, Verdict::Drop(UNSOLICITED)]);
    }

    /// The connections and the policy's rule counters, packets and bytes, synced side by
    /// side: each state answers under its own id, a connection attempt changes its rule's
    /// counters in both, the copy reads what the control API reads, and a write into one
    /// counter's packets changes that counter alone.
    #[test]
    fn connections_and_rule_counters_sync_side_by_side() {
        use stateplane_state::{Reply, Request};
        let mut fw = firewall("");
        let slots = fw.conntrack.table.slot_count() as u32;
        let rules = fw.policy.declarations()[1].capacity as u32; // and the default
        assert_eq!(fw.track("connections", 0), Some(slots * 13));
        assert_eq!(fw.track("rule_bytes", 1), Some(rules));
        assert_eq!(fw.track("rule_packets", 2), Some(rules));
        assert_eq!(
            fw.track("rules", 3),
            None,
            "the control plane's rules are not"
        );
        assert_eq!(fw.synced(), [(0, slots * 13), (1, rules), (2, rules)]);
        let syn = frame(INSIDE, REMOTE, tcp(40_000, 80, flags::SYN));
        let len = syn.len() as u64;
        let back = frame(REMOTE, INSIDE, tcp(80, 40_000, flags::SYN | flags::ACK));
        assert_eq!(run(&mut fw, &[(syn, true), (back, false)]), [OUT, IN]);
        let mut changes = Vec::new();
        assert!(fw.changes(&mut changes, usize::MAX));
        let default = rules - 1;
        let of = |state| changes.iter().filter(move |c| c.state == state);
        let slot_of = |c: &stateplane_state::changes::Change| c.index / 13;
        let first = changes.first().map(slot_of);
        assert!(
            of(0).count() >= 5 && of(0).all(|c| Some(slot_of(c)) == first),
            "the words of one connection's slot: {changes:?}"
        );
        let counted = |state| {
            of(state)
                .map(|c| (c.index, c.old, c.new))
                .collect::<Vec<_>>()
        };
        assert_eq!(counted(2), [(default, 0, 1)], "one attempt, by the default");
        assert_eq!(counted(1), [(default, 0, len)], "of its bytes");
        let read = |fw: &mut Firewall, name: &str| {
            let request = Request::ReadRegister {
                name: name.into(),
                first: default as usize,
                count: 1,
            };
            match fw.control(&request, None, &crate::testutil::ctx(2, 2)) {
                Ok(Reply::Values(v)) => v[0] as u64,
                other => panic!("{other:?}"),
            }
        };
        assert_eq!(
            fw.read_synced(2, default),
            Some(read(&mut fw, "rule_packets"))
        );
        assert_eq!(
            fw.read_synced(1, default),
            Some(read(&mut fw, "rule_bytes"))
        );
        let mut run_of = [0; 3];
        assert_eq!(
            fw.read_synced_run(2, default - 1, &mut run_of),
            2,
            "to the end"
        );
        assert_eq!(run_of[..2], [0, 1]);
        assert_eq!(fw.read_synced(2, rules), None, "past the end");
        assert_eq!(fw.read_synced(4, 0), None, "no such state");
        // A write (a collector resetting the packets) and its change; bytes stay.
        assert_eq!(fw.write_synced(2, default, 0), Some(1));
        assert_eq!(fw.write_synced(4, 0, 1), None);
        assert_eq!(fw.commit_synced_write(), 0);
        assert_eq!(read(&mut fw, "rule_packets"), 0);
        assert_eq!(read(&mut fw, "rule_bytes"), len);
        changes.clear();
        assert!(fw.changes(&mut changes, usize::MAX));
        let taken: Vec<_> = changes.iter().map(|c| (c.state, c.index, c.new)).collect();
        assert_eq!(taken, [(2, default, 0)]);
    }

    /// A reload keeps the connections, each as it was permitted (as Linux's tracked
    /// connections outlive a ruleset reloaded, and pf keeps its states): under a new
    /// policy that denies everything, an open connection goes on both ways, a new one is
    /// denied. A smaller table keeps as many as it holds, and says so.
    #[test]
    fn a_reload_keeps_connections_and_judges_new_ones_by_the_new_policy() {
        let out = |port: u16, f: u8| (frame(INSIDE, REMOTE, tcp(port, 443, f)), true);
        let back = |port: u16, f: u8| (frame(REMOTE, INSIDE, tcp(443, port, f)), false);
        let (syn, ack) = (flags::SYN, flags::ACK);
        let mut old = firewall("");
        let opened: Vec<(Vec<u8>, bool)> = (40_000..40_004)
            .flat_map(|p| [out(p, syn), back(p, syn | ack), out(p, ack)])
            .collect();
        assert!(
            run(&mut old, &opened)
                .iter()
                .all(|v| matches!(v, Verdict::Forward(_)))
        );
        let mut new = firewall("default = \"deny\"");
        let carried = Program::inherit(&mut new, old, 0);
        let said: Vec<String> = carried.iter().map(|c| c.to_string()).collect();
        assert_eq!(
            said,
            [
                "rules: made again from the configuration",
                "rule_packets: starts afresh (rule counts start again with the configuration's \
                 rules)",
                "rule_bytes: starts afresh (rule counts start again with the configuration's \
                 rules)",
                "rule_meters: made again from the configuration",
                "connections: kept 4 entries",
            ]
        );
        assert_eq!(
            run(
                &mut new,
                &[back(40_000, ack), out(40_000, ack), out(40_009, syn)]
            ),
            [IN, OUT, Verdict::Drop(DENIED)]
        );
        let mut old = firewall("");
        run(&mut old, &opened);
        let mut small = firewall("connections = 2");
        let carried = Program::inherit(&mut small, old, 0);
        assert_eq!(
            (carried[4].kept, carried[4].dropped),
            (2, 2),
            "{}",
            carried[4]
        );
        assert_eq!(small.connections(), 2);
    }

    #[test]
    fn the_policy_decides_which_connections_the_inside_may_open() {
        let mut fw = firewall(
            "rules = [{ action = \"deny\", proto = \"tcp\", dst_ports = \"25\" }, \
             { action = \"permit\", dst = \"198.19.0.0/16\" }]",
        );
        let mut denied_default = firewall("default = \"deny\"");
        let smtp = frame(INSIDE, REMOTE, tcp(40_000, 25, flags::SYN));
        let web = frame(INSIDE, REMOTE, tcp(40_000, 443, flags::SYN));
        let elsewhere = frame(INSIDE, "198.18.9.9", tcp(40_000, 443, flags::SYN));
        let got = run(
            &mut fw,
            &[(smtp, true), (web.clone(), true), (elsewhere.clone(), true)],
        );
        // The last matches no rule: the default, permit.
        assert_eq!(got, [Verdict::Drop(DENIED), OUT, OUT]);
        assert_eq!(fw.connections(), 2, "a denied attempt leaves no state");
        let answer = frame(REMOTE, INSIDE, tcp(25, 40_000, flags::SYN | flags::ACK));
        assert_eq!(
            run(&mut fw, &[(answer, false)]),
            [Verdict::Drop(UNSOLICITED)]
        );
        assert_eq!(
            run(&mut denied_default, &[(web, true), (elsewhere, true)]),
            [Verdict::Drop(DENIED), Verdict::Drop(DENIED)]
        );
    }

    /// A policy written in the pipeline's rule text judges as the same policy written in
    /// fields (an empty match as every field `any`), and each rule counts the connections
    /// it judged.
    #[test]
    fn a_policy_in_the_pipelines_rule_text_judges_as_in_fields_and_counts_per_rule() {
        let mut in_text = firewall(
            "default = \"permit\"\n\
             rules = [{ action = \"deny\", match = \"tcp,tp_dst=25\" }, \
             { action = \"permit\", match = \"ip,nw_dst=198.19.0.0/16\" }, \
             { action = \"permit\", match = \"udp,nw_src=198.18.0.0/24,tp_dst=1000-2000\" }, \
             { action = \"deny\", match = \"\" }]",
        );
        let mut in_fields = firewall(
            "default = \"permit\"\n\
             rules = [{ action = \"deny\", proto = \"tcp\", dst_ports = \"25\" }, \
             { action = \"permit\", dst = \"198.19.0.0/16\" }, \
             { action = \"permit\", proto = \"udp\", src = \"198.18.0.0/24\", \
             dst_ports = \"1000-2000\" }, { action = \"deny\" }]",
        );
        let udp = |dst_port| L4::Udp {
            src_port: 4000,
            dst_port,
        };
        let frames = [
            (frame(INSIDE, REMOTE, tcp(40_000, 25, flags::SYN)), true),
            (frame(INSIDE, REMOTE, tcp(40_001, 443, flags::SYN)), true),
            (
                frame(INSIDE, "198.18.9.9", tcp(40_002, 443, flags::SYN)),
                true,
            ),
            (frame(INSIDE, "198.18.9.9", udp(1500)), true),
            (frame(INSIDE, "198.18.9.9", udp(2001)), true),
        ];
        let denied = Verdict::Drop(DENIED);
        let judged = run(&mut in_text, &frames);
        assert_eq!(judged, [denied, OUT, denied, OUT, denied]);
        assert_eq!(run(&mut in_fields, &frames), judged);
        let read = Request::Read {
            table: "rules".into(),
            key: None,
            from: 0,
        };
        let hits = |fw: &mut Firewall| match fw.control(&read, None, &crate::testutil::ctx(1, 2)) {
            Ok(Reply::Page(entries, _)) => entries.iter().map(|e| e.hits).collect::<Vec<_>>(),
            other => panic!("{other:?}"),
        };
        // The last rule, an empty match as every field `any`, judged what the others left.
        assert_eq!(hits(&mut in_text), [1, 1, 1, 2]);
        assert_eq!(hits(&mut in_fields), hits(&mut in_text));
    }

    /// Inbound rules (`direction = "in"`, pf's `pass in`) let the outside open the
    /// connections they permit, first match wins among them: answered from the inside,
    /// tracked as any other. What no inbound rule permits stays `unsolicited` (a deny
    /// says `denied`); outbound rules judge only what the inside opens, and inbound ones
    /// nothing of it. Each rule counts the connections it judged.
    #[test]
    fn inbound_rules_let_the_outside_open_what_they_permit() {
        let mut fw = firewall(
            "default = \"permit\"\n\
             rules = [{ action = \"deny\", direction = \"in\", match = \"tcp,nw_src=198.19.0.66\" }, \
             { action = \"permit\", direction = \"in\", match = \"tcp,nw_dst=198.18.0.1,tp_dst=22\" }, \
             { action = \"permit\", direction = \"in\", match = \"udp,tp_dst=53\" }, \
             { action = \"deny\", direction = \"in\", match = \"udp,tp_dst=123\" }, \
             { action = \"permit\", direction = \"in\", match = \"nw_proto=47\" }, \
             { action = \"deny\", direction = \"out\", match = \"tcp,tp_dst=22\" }]",
        );
        // A GRE packet (protocol 47, which is not tracked): a UDP one relabelled.
        let gre = |src: &str, dst: &str| {
            let mut f = frame(
                src,
                dst,
                L4::Udp {
                    src_port: 1,
                    dst_port: 2,
                },
            );
            f[14 + 9] = 47;
            f[14 + 10..14 + 12].fill(0);
            let sum = stateplane_wire::checksum::checksum(&f[14..34]);
            f[14 + 10..14 + 12].copy_from_slice(&sum.to_be_bytes());
            f
        };
        let out = |l4| (frame(INSIDE, REMOTE, l4), true);
        let back = |l4| (frame(REMOTE, INSIDE, l4), false);
        let udp = |src_port, dst_port| L4::Udp { src_port, dst_port };
        let drop = Verdict::Drop;
        let got = run(
            &mut fw,
            &[
                // Opened from outside to port 22, answered, and on.
                back(tcp(50_000, 22, flags::SYN)),
                out(tcp(22, 50_000, flags::SYN | flags::ACK)),
                back(tcp(50_000, 22, flags::ACK)),
                out(tcp(22, 50_000, flags::ACK)),
                // Port 23: no inbound rule.
                back(tcp(50_001, 23, flags::SYN)),
                // Mid-stream to port 22 with no connection: permitted, opens nothing.
                back(tcp(50_002, 22, flags::ACK)),
                // A denied source, before the rule that would permit it.
                (
                    frame("198.19.0.66", INSIDE, tcp(50_003, 22, flags::SYN)),
                    false,
                ),
                // UDP to 53 from outside, answered.
                back(udp(5000, 53)),
                out(udp(53, 5000)),
                // The inside's own connections are the outbound rules' to judge: port 22
                // denied, and port 123 permitted by default, the inbound deny aside.
                out(tcp(40_000, 22, flags::SYN)),
                out(udp(5001, 123)),
                // Not tracked, judged packet by packet: GRE in as its rule permits.
                (gre(REMOTE, INSIDE), false),
                // An echo request from outside: no rule for it.
                back(L4::IcmpEcho {
                    request: true,
                    ident: 3,
                    seq: 1,
                }),
            ],
        );
        assert_eq!(
            got,
            [
                IN,
                OUT,
                IN,
                OUT,
                drop(UNSOLICITED),
                drop(INVALID),
                drop(DENIED),
                IN,
                OUT,
                drop(DENIED),
                OUT,
                IN,
                drop(UNSOLICITED),
            ]
        );
        assert_eq!(fw.connections(), 3);
        let read = Request::Read {
            table: "rules".into(),
            key: None,
            from: 0,
        };
        let ctx = crate::testutil::ctx(1, 2);
        let Ok(Reply::Page(entries, _)) = fw.control(&read, None, &ctx) else {
            panic!("rules unread");
        };
        let seen: Vec<(&str, u64)> = entries
            .iter()
            .map(|e| (e.action.as_str(), e.hits))
            .collect();
        assert_eq!(
            seen,
            [
                ("deny_in", 1),
                ("permit_in", 2),
                ("permit_in", 1),
                ("deny_in", 0),
                ("permit_in", 1),
                ("deny", 1)
            ]
        );
    }

    /// The control plane writes inbound rules as `permit_in` and `deny_in`, which an
    /// `acl`'s rules table does not declare; a modify may turn a rule's direction.
    #[test]
    fn inbound_rules_are_written_by_the_control_plane() {
        let mut fw = firewall("");
        let ctx = crate::testutil::ctx(1, 2);
        let ssh_in = || (frame(REMOTE, INSIDE, tcp(50_000, 22, flags::SYN)), false);
        assert_eq!(run(&mut fw, &[ssh_in()]), [Verdict::Drop(UNSOLICITED)]);
        let rule = |action: &str| stateplane_state::Entry {
            key: vec![
                stateplane_state::Match::Prefix { value: 0, len: 0 },
                stateplane_state::Match::Prefix {
                    value: 0xc612_0001,
                    len: 32,
                },
                stateplane_state::Match::Ternary {
                    value: 6,
                    mask: 0xff,
                },
                stateplane_state::Match::Range {
                    low: 0,
                    high: 65535,
                },
                stateplane_state::Match::Range { low: 22, high: 22 },
            ],
            action: action.into(),
            params: vec![],
            priority: 5,
            hits: 0,
        };
        let write = |fw: &mut Firewall, w: stateplane_state::Write| {
            let request = Request::Write {
                table: "rules".into(),
                writes: vec![w],
            };
            let prepared = fw.prepare(&request).unwrap();
            fw.control(&request, prepared.as_ref(), &ctx).unwrap();
        };
        write(&mut fw, stateplane_state::Write::Insert(rule("permit_in")));
        assert_eq!(run(&mut fw, &[ssh_in()]), [IN]);
        // Turned outbound, the rule lets no one in.
        write(&mut fw, stateplane_state::Write::Modify(rule("permit")));
        let other = (frame(REMOTE, INSIDE, tcp(50_001, 22, flags::SYN)), false);
        assert_eq!(run(&mut fw, &[other]), [Verdict::Drop(UNSOLICITED)]);
        let actions = |d: &[Declaration]| match &d[0].kind {
            stateplane_state::Kind::Table { actions, .. } => {
                actions.iter().map(|a| a.name.clone()).collect::<Vec<_>>()
            }
            _ => vec![],
        };
        assert_eq!(
            actions(&fw.declarations()),
            ["permit", "deny", "permit_in", "deny_in"]
        );
        let names = PortNames(vec!["a".into(), "b".into()]);
        let cfg: AclConfig = toml::from_str("").unwrap();
        let acl = Acl::new(&cfg, &names, "program.acl").unwrap();
        assert_eq!(actions(&acl.declarations()), ["permit", "deny"]);
    }

    /// From outside, an ICMP error passes only when the packet it quotes belongs to a
    /// tracked connection (or to a protocol not tracked); forged ones, and ones that quote
    /// nothing whole, are dropped and counted. ARP passes; other protocols do not come in.
    #[test]
    fn icmp_errors_come_in_only_for_known_connections() {
        use crate::testutil::icmp_error;
        let mut fw = firewall("");
        let (router, router6) = ("198.19.0.254", "2001:db8:1::fe");
        let (inside6, remote6) = ("2001:db8::1", "2001:db8:1::2");
        let syn = frame(INSIDE, REMOTE, tcp(1000, 80, flags::SYN));
        let other_syn = frame(INSIDE, REMOTE, tcp(1001, 80, flags::SYN));
        let udp6 = frame(
            inside6,
            remote6,
            L4::Udp {
                src_port: 5000,
                dst_port: 53,
            },
        );
        let other_udp6 = frame(
            inside6,
            remote6,
            L4::Udp {
                src_port: 5001,
                dst_port: 53,
            },
        );
        let echo = |ident| L4::IcmpEcho {
            request: true,
            ident,
            seq: 1,
        };
        let ping = frame(INSIDE, REMOTE, echo(7));
        let mut gre = frame(
            INSIDE,
            REMOTE,
            L4::Udp {
                src_port: 1,
                dst_port: 2,
            },
        );
        gre[14 + 9] = 47; // IP protocol: GRE (the checksum does not matter here)
        let arp =
            crate::testutil::arp_request([2, 0, 0, 0, 0, 2], [198, 19, 0, 2], [198, 18, 0, 1]);
        // The connections are opened first: a burst's packets are judged in order.
        let opened = run(
            &mut fw,
            &[
                (syn.clone(), true),
                (udp6.clone(), true),
                (ping.clone(), true),
            ],
        );
        assert_eq!(opened, [OUT, OUT, OUT]);
        // A quote of the SYN's IP header and 4 bytes: too short to tell its ports.
        let mut garbled = crate::testutil::ip_frame_with(router, INSIDE, echo(0), &syn[14..38]);
        garbled[14 + 20] = 3;
        let got = run(
            &mut fw,
            &[
                // Fragmentation needed, for the connection: path MTU discovery works.
                (icmp_error(&syn, router, INSIDE, 3, 4), false),
                (icmp_error(&udp6, router6, inside6, 2, 0), false),
                (icmp_error(&ping, router, INSIDE, 11, 0), false),
                // The same, about connections that do not exist: forged.
                (icmp_error(&other_syn, router, INSIDE, 3, 1), false),
                (icmp_error(&other_udp6, router6, inside6, 1, 4), false),
                (garbled, false),
                // About a protocol not tracked: nothing to check, it passes.
                (icmp_error(&gre, router, INSIDE, 3, 2), false),
                (gre.clone(), false),
                (arp, false),
                (gre, true),
            ],
        );
        let unrelated = Verdict::Drop(UNRELATED_ICMP);
        assert_eq!(
            got,
            [
                IN,
                IN,
                IN,
                unrelated,
                unrelated,
                unrelated,
                IN,
                Verdict::Drop(UNSOLICITED),
                IN,
                OUT
            ]
        );
        // A worker the kernel handed packets to by its own hash cannot tell a forged error
        // from one about another worker's connection: it lets both on.
        let spread_by_kernel = Context {
            worker: 1,
            workers: 2,
            by_hash: false,
            ..crate::testutil::ctx(1, 2)
        };
        let got = run_in(
            &mut fw,
            &[(icmp_error(&other_syn, router, INSIDE, 3, 1), false)],
            spread_by_kernel,
        );
        assert_eq!(got, [IN]);
    }

    #[test]
    fn ipv6_connections_are_tracked_too() {
        let mut fw = firewall("");
        let got = run(
            &mut fw,
            &[
                (
                    frame(
                        "2001:2::2",
                        "2001:2::1",
                        tcp(80, 4000, flags::SYN | flags::ACK),
                    ),
                    false,
                ),
                (
                    frame("2001:2::1", "2001:2::2", tcp(4000, 80, flags::SYN)),
                    true,
                ),
                (
                    frame(
                        "2001:2::2",
                        "2001:2::1",
                        tcp(80, 4000, flags::SYN | flags::ACK),
                    ),
                    false,
                ),
            ],
        );
        assert_eq!(got, [Verdict::Drop(UNSOLICITED), OUT, IN]);
    }

    /// Neighbor discovery crosses both ways, so that IPv6 hosts on the two sides find
    /// each other; only with hop limit 255, so none comes from beyond the link.
    #[test]
    fn neighbor_discovery_crosses_from_the_link_only() {
        use crate::testutil::icmpv6;
        let mut fw = firewall("");
        let (inside, outside) = ("2001:2::1", "2001:2::2");
        let got = run(
            &mut fw,
            &[
                (icmpv6(inside, "ff02::1:ff00:2", 135, 255), true),
                (icmpv6(outside, inside, 136, 255), false),
                (icmpv6(outside, "ff02::1:ff00:1", 135, 255), false),
                (icmpv6("fe80::1", "ff02::1", 134, 255), false),
                (icmpv6(outside, inside, 136, 64), false),
                (icmpv6(outside, inside, 138, 255), false),
            ],
        );
        let unsolicited = Verdict::Drop(UNSOLICITED);
        assert_eq!(got, [OUT, IN, IN, IN, unsolicited, unsolicited]);
    }

    #[test]
    fn configuration_errors_name_the_field() {
        let names = PortNames(vec!["inside".into(), "outside".into()]);
        for (text, field) in [
            ("connections = 0", "program.firewall.connections"),
            ("inside = \"eth7\"", "program.firewall.inside"),
            ("default = \"maybe\"", "program.firewall.default"),
            (
                "rules = [{ action = \"permit\", dst = \"300.1.1.1/8\" }]",
                "program.firewall.rules[0].dst",
            ),
            (
                "rules = [{ action = \"permit\", match = \"tcp,dl_vlan=3\" }]",
                "program.firewall.rules[0].match",
            ),
            (
                "rules = [{ action = \"permit\", match = \"ip,nw_dst=300.0.0.0/8\" }]",
                "program.firewall.rules[0].match",
            ),
            (
                "rules = [{ action = \"permit\", match = \"tcp\", dst = \"198.19.0.0/16\" }]",
                "program.firewall.rules[0].match",
            ),
            (
                "rules = [{ action = \"permit\", match = \"tcp,tp_dst=80,actions=drop\" }]",
                "program.firewall.rules[0].match",
            ),
            ("[timeouts]\nicmp = -1.0", "program.firewall.timeouts.icmp"),
            (
                "rules = [{ action = \"permit\", direction = \"both\" }]",
                "program.firewall.rules[0].direction",
            ),
        ] {
            let cfg: FirewallConfig = toml::from_str(text).unwrap();
            let err = Firewall::new(&cfg, &names, "program.firewall", 1)
                .err()
                .unwrap();
            assert_eq!(err.field, field, "{text}: {err}");
        }
    }

    /// A connection's segments are checked against its windows (IPv6 here, windows
    /// scaled by 2^7): an ICMP error quoting a segment the inside could not have sent is
    /// dropped as `unrelated_icmp`, a reset or data forged from outside with numbers off
    /// the windows as `out_of_window`, and the connection goes on; a reset in the window
    /// closes it. With `window_checks = false` the forged reset passes and closes it.
    #[test]
    fn segments_off_their_connection_s_windows_are_dropped() {
        assert_eq!(
            OUT_OF_WINDOW.name(firewall("").drop_reasons()),
            "out_of_window"
        );
        use crate::testutil::{ip_frame_with, tcp_segment};
        const IN6: &str = "2001:2::1";
        const OUT6: &str = "2001:2:0:1::2";
        let segment = |inside: bool, seq, ack, f, len: usize| {
            let (src, dst, ports) = if inside {
                (IN6, OUT6, (40_000, 443))
            } else {
                (OUT6, IN6, (443, 40_000))
            };
            let scale = (f & flags::SYN != 0).then_some(7);
            let l4 = tcp_segment(ports, seq, ack, f, 512, scale);
            (ip_frame_with(src, dst, l4, &vec![0; len]), inside)
        };
        let (out, back) = (
            |s, a, f, n| segment(true, s, a, f, n),
            |s, a, f, n| segment(false, s, a, f, n),
        );
        let ack = flags::ACK;
        let opening = [
            out(100, 0, flags::SYN, 0),
            back(5_000, 101, flags::SYN | ack, 0),
            out(101, 5_001, ack, 0),
            back(5_001, 101, ack, 1_000),
            out(101, 6_001, ack, 1_000),
        ];
        let forged_reset = back(1_000_000, 0, flags::RST, 0);
        // Packet too big, from a router outside, about a segment the inside sent (within
        // the windows) or one it could not have sent.
        let too_big = |seq| {
            let quoted = out(seq, 6_001, ack, 1_000).0;
            let error = crate::testutil::icmp_error(&quoted, "2001:2:0:1::9", IN6, 2, 0);
            (error, false)
        };
        let mut fw = firewall("");
        let got = run(
            &mut fw,
            &[
                opening.to_vec(),
                vec![
                    too_big(101),
                    too_big(900_000_000),
                    forged_reset.clone(),
                    // Acknowledging bytes the inside never sent.
                    back(6_001, 50_000, ack, 100),
                    // 60000 bytes ahead: within 512 << 7.
                    back(66_001, 1_101, ack, 100),
                    back(6_001, 1_101, flags::RST, 0),
                    out(1_101, 6_001, ack, 0),
                ],
            ]
            .concat(),
        );
        let drop = Verdict::Drop;
        assert_eq!(
            got,
            [
                [OUT, IN, OUT, IN, OUT].as_slice(),
                &[IN, drop(UNRELATED_ICMP)],
                &[
                    drop(OUT_OF_WINDOW),
                    drop(OUT_OF_WINDOW),
                    IN,
                    IN,
                    drop(INVALID)
                ],
            ]
            .concat()
        );
        assert_eq!(fw.connections(), 0);

        let mut liberal = firewall("window_checks = false");
        let got = run(
            &mut liberal,
            &[opening.to_vec(), vec![forged_reset]].concat(),
        );
        assert_eq!(got, [OUT, IN, OUT, IN, OUT, IN]);
        assert_eq!(liberal.connections(), 0, "the forged reset closed it");
    }

    /// Once both sides sent their FIN, the inside may open the same ports again with a
    /// new initial sequence number, as a client reusing its port does.
    #[test]
    fn a_closed_connection_s_ports_open_again() {
        use crate::testutil::{ip_frame_with, tcp_segment};
        let segment = |inside: bool, seq, ack, f| {
            let (src, dst, ports) = if inside {
                (INSIDE, REMOTE, (40_000, 80))
            } else {
                (REMOTE, INSIDE, (80, 40_000))
            };
            (
                ip_frame_with(src, dst, tcp_segment(ports, seq, ack, f, 65_535, None), &[]),
                inside,
            )
        };
        let (ack, fin, syn) = (flags::ACK, flags::FIN, flags::SYN);
        let mut fw = firewall("");
        let got = run(
            &mut fw,
            &[
                segment(true, 100, 0, syn),
                segment(false, 5_000, 101, syn | ack),
                segment(true, 101, 5_001, ack),
                segment(true, 101, 5_001, fin | ack),
                segment(false, 5_001, 102, fin | ack),
                segment(true, 102, 5_002, ack),
                segment(true, 3_000_000_000, 0, syn),
                segment(false, 9_000, 3_000_000_001, syn | ack),
                segment(true, 3_000_000_001, 9_001, ack),
            ],
        );
        assert_eq!(got, [OUT, IN, OUT, OUT, IN, OUT, OUT, IN, OUT]);
    }
}
