//! `steer`: the steering point in front of parallel switches, like ECMP routers on both
//! sides of them. Each flow goes through one switch (both directions through the same
//! one), and when a switch stops answering, its flows move to the survivors while every
//! other flow stays where it is.
//!
//! Ports: `left` and `right` face the hosts; each path `i` is a pair of ports, `out` (to
//! the switch's left side) and `back` (from its right side). A packet from `left` leaves by
//! the chosen path's `out`, one from `right` by its `back`; what comes back from a path's
//! `out` goes to `left`, from its `back` to `right`.
//!
//! Liveness is probed like BFD's echo mode: every `probe_interval_ms` a probe frame leaves
//! by each path's `out`, crosses the switch, and must come back on the same path's `back`;
//! a path whose probes stopped for `dead_after_ms` is down. The choice among live paths is
//! rendezvous hashing of the flow's symmetric hash, so removing a path moves only its flows.
//! While no path has answered yet (start-up), every path counts as live. With
//! `by = "outside"` the hash is of the flow's end on the right (its address, port and
//! protocol: the destination of a packet from the left, the source of one from the
//! right) instead: a NAT between rewrites the left end, so a connection's two directions
//! share only the right one, and both must take the switch that holds the translation.
//!
//! State: the last time each path's probe came back, shared by the workers (atomics).
//! Counters: drops `probe` (probes taken off the wire), `no_path` (no such port).

use crate::{ConfigError, PortNames};
use serde::Deserialize;
use stateplane_runtime::{Burst, Context, DropReason, PortId, Program, Verdict};
use stateplane_wire::FlowKey;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The EtherType of probe frames: IEEE 802 local experimental 1.
pub const PROBE_ETHERTYPE: u16 = 0x88b5;
/// The first payload bytes of a probe frame.
const PROBE_MAGIC: &[u8; 4] = b"SPpr";
const PROBE_LEN: usize = 60;

const PROBE: DropReason = DropReason::program(0);
const NO_PATH: DropReason = DropReason::program(1);

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathConfig {
    pub out: String,
    pub back: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SteerConfig {
    pub left: String,
    pub right: String,
    pub paths: Vec<PathConfig>,
    #[serde(default = "default_probe_interval")]
    pub probe_interval_ms: u64,
    #[serde(default = "default_dead_after")]
    pub dead_after_ms: u64,
    /// What chooses a flow's path: "connection" (the default) or "outside".
    pub by: Option<String>,
}

fn default_probe_interval() -> u64 {
    20
}

fn default_dead_after() -> u64 {
    150
}

/// What each port is to the steering point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Left,
    Right,
    /// Path `i`'s port towards the switch's left side.
    Out(usize),
    /// Path `i`'s port from the switch's right side.
    Back(usize),
    None,
}

#[derive(Clone)]
pub struct Steer {
    roles: Vec<Role>,
    left: PortId,
    right: PortId,
    paths: Vec<(PortId, PortId)>,
    /// When each path's last probe came back (ns; 0: never).
    seen: Arc<[AtomicU64]>,
    probe_interval_ns: u64,
    dead_after_ns: u64,
    last_probe_ns: u64,
    probe_seq: u32,
    /// Paths are chosen by the flow's right end (`by = "outside"`), not its connection.
    by_outside: bool,
}

impl Steer {
    pub fn new(cfg: &SteerConfig, ports: &PortNames, field: &str) -> Result<Self, ConfigError> {
        if cfg.paths.is_empty() || cfg.paths.len() > 64 {
            return Err(ConfigError::new(
                format!("{field}.paths"),
                "give 1 to 64 paths, each { out = PORT, back = PORT }",
            ));
        }
        if cfg.probe_interval_ms == 0 || cfg.dead_after_ms < 2 * cfg.probe_interval_ms {
            return Err(ConfigError::new(
                format!("{field}.dead_after_ms"),
                format!(
                    "must be at least twice probe_interval_ms ({}), and the interval above 0",
                    cfg.probe_interval_ms
                ),
            ));
        }
        let mut roles = vec![Role::None; ports.0.len()];
        let mut assign = |name: &str, sub: String, role: Role| -> Result<PortId, ConfigError> {
            let p = ports.resolve(&format!("{field}.{sub}"), name)?;
            let slot = &mut roles[usize::from(p)];
            if *slot != Role::None {
                return Err(ConfigError::new(
                    format!("{field}.{sub}"),
                    format!("port '{name}' already has another role; each port has one"),
                ));
            }
            *slot = role;
            Ok(p)
        };
        let by_outside = match cfg.by.as_deref() {
            None | Some("connection") => false,
            Some("outside") => true,
            Some(other) => {
                return Err(ConfigError::new(
                    format!("{field}.by"),
                    format!(
                        "'{other}' is not \"connection\" (both ends, the default) or \"outside\" \
                         (the right end alone, for NATs between)"
                    ),
                ));
            }
        };
        let left = assign(&cfg.left, "left".into(), Role::Left)?;
        let right = assign(&cfg.right, "right".into(), Role::Right)?;
        let mut paths = Vec::new();
        for (i, p) in cfg.paths.iter().enumerate() {
            let out = assign(&p.out, format!("paths[{i}].out"), Role::Out(i))?;
            let back = assign(&p.back, format!("paths[{i}].back"), Role::Back(i))?;
            paths.push((out, back));
        }
        Ok(Steer {
            roles,
            left,
            right,
            seen: (0..paths.len()).map(|_| AtomicU64::new(0)).collect(),
            paths,
            probe_interval_ns: cfg.probe_interval_ms * 1_000_000,
            dead_after_ns: cfg.dead_after_ms * 1_000_000,
            last_probe_ns: 0,
            probe_seq: 0,
            by_outside,
        })
    }

    /// Whether path `i` answered recently, as of `now_ns`.
    fn alive(&self, i: usize, now_ns: u64) -> bool {
        let seen = self.seen[i].load(Ordering::Relaxed);
        seen != 0 && now_ns.saturating_sub(seen) < self.dead_after_ns
    }

    /// The path of a flow with symmetric hash `hash`: the live path with the highest
    /// rendezvous score (every path while none is live).
    fn choose(&self, hash: u64, now_ns: u64) -> usize {
        let any_alive = (0..self.paths.len()).any(|i| self.alive(i, now_ns));
        (0..self.paths.len())
            .filter(|&i| !any_alive || self.alive(i, now_ns))
            .max_by_key(|&i| score(hash, i))
            .unwrap_or(0)
    }

    /// The paths that are live now (for status and tests).
    pub fn live_paths(&self, now_ns: u64) -> Vec<bool> {
        (0..self.paths.len())
            .map(|i| self.alive(i, now_ns))
            .collect()
    }
}

/// Rendezvous score of path `i` for a flow: a strong mix, so every path wins equally often.
/// The hash of a packet's right end (`from_left`: its destination), for `by = "outside"`.
fn outside_hash(key: &FlowKey, from_left: bool, ctx: &Context) -> u64 {
    let (addr, port) = if from_left {
        (key.dst, key.dst_port)
    } else {
        (key.src, key.src_port)
    };
    // An ICMP key's ports are its type and identifier, not an end's.
    let port = if matches!(key.proto, 1 | 58) { 0 } else { port };
    ctx.hasher.hash(&FlowKey {
        src: addr,
        src_port: port,
        proto: key.proto,
        ip_version: key.ip_version,
        ..FlowKey::EMPTY
    })
}

fn score(hash: u64, i: usize) -> u64 {
    let mut x = hash ^ (i as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^ (x >> 33)
}

/// The path index a probe frame names, if `frame` is one of ours.
fn probe_path(frame: &[u8]) -> Option<usize> {
    if frame.len() < 20 || frame[12..14] != PROBE_ETHERTYPE.to_be_bytes() {
        return None;
    }
    (&frame[14..18] == PROBE_MAGIC).then(|| usize::from(frame[18]))
}

fn probe_frame(path: usize, seq: u32) -> [u8; PROBE_LEN] {
    let mut f = [0u8; PROBE_LEN];
    f[..6].copy_from_slice(&[0xff; 6]);
    f[6..12].copy_from_slice(&[0x02, 0x53, 0x50, 0, 0, path as u8]);
    f[12..14].copy_from_slice(&PROBE_ETHERTYPE.to_be_bytes());
    f[14..18].copy_from_slice(PROBE_MAGIC);
    f[18] = path as u8;
    f[19..23].copy_from_slice(&seq.to_be_bytes());
    f
}

impl Program for Steer {
    type Prepared = ();

    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        let now = ctx.now_ns;
        for p in burst.iter_mut() {
            let d = p.desc;
            let role = self.roles.get(usize::from(d.in_port)).copied();
            d.verdict = match role {
                Some(Role::Back(i)) if probe_path(p.data) == Some(i) => {
                    self.seen[i].fetch_max(now, Ordering::Relaxed);
                    Verdict::Drop(PROBE)
                }
                Some(Role::Out(_) | Role::Back(_)) if probe_path(p.data).is_some() => {
                    Verdict::Drop(PROBE)
                }
                Some(Role::Out(_)) => Verdict::Forward(self.left),
                Some(Role::Back(_)) => Verdict::Forward(self.right),
                Some(side @ (Role::Left | Role::Right)) => {
                    // Both directions choose the same path.
                    let hash = match self.by_outside {
                        true => outside_hash(&d.parsed.key, side == Role::Left, ctx),
                        false => d.parsed.hash,
                    };
                    let i = self.choose(hash, now);
                    let (out, back) = self.paths[i];
                    Verdict::Forward(if side == Role::Left { out } else { back })
                }
                Some(Role::None) | None => Verdict::Drop(NO_PATH),
            };
        }
    }

    fn poll(&mut self, out: &mut Burst, ctx: &mut Context) {
        // One worker probes; any worker may see the probe come back.
        if ctx.worker != 0 || ctx.now_ns < self.last_probe_ns + self.probe_interval_ns {
            return;
        }
        self.last_probe_ns = ctx.now_ns;
        self.probe_seq = self.probe_seq.wrapping_add(1);
        for (i, &(port, _)) in self.paths.iter().enumerate() {
            let frame = probe_frame(i, self.probe_seq);
            if out.push(&frame, PROBE_LEN as u32, ctx.now_ns, port, 0)
                && let Some(d) = out.descs_mut().last_mut()
            {
                d.verdict = Verdict::Forward(port);
            }
        }
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        &["probe", "no_path"]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateplane_wire::FlowHasher;
    use stateplane_wire::ethernet::MacAddr;

    fn steer() -> Steer {
        steer_by("")
    }

    /// A steering point with two paths and `extra` settings.
    fn steer_by(extra: &str) -> Steer {
        let names = PortNames(
            ["left", "right", "a1", "b1", "a2", "b2"]
                .map(String::from)
                .to_vec(),
        );
        let cfg: SteerConfig = toml::from_str(&format!(
            r#"left = "left"
               right = "right"
               paths = [{{ out = "a1", back = "b1" }}, {{ out = "a2", back = "b2" }}]
               {extra}"#
        ))
        .unwrap();
        Steer::new(&cfg, &names, "program.steer").unwrap()
    }

    fn ctx(now_ns: u64, worker: usize) -> Context {
        Context {
            now_ns,
            worker,
            workers: 1,
            hasher: FlowHasher::with_seed(7),
            ports: 6,
            by_hash: true,
        }
    }

    /// Frames from h1 (198.18.0.1, left) to h2 (198.18.0.2, right).
    fn h1_to_h2() -> stateplane_gen::build::Hosts {
        stateplane_gen::build::Hosts {
            src_mac: MacAddr([2, 0, 0, 0, 0, 1]),
            dst_mac: MacAddr([2, 0, 0, 0, 0, 2]),
            vlan: 0,
            src: "198.18.0.1".parse().unwrap(),
            dst: "198.18.0.2".parse().unwrap(),
            ttl: 64,
        }
    }

    /// A virtual clock drives probes and their answers: both paths live, then path 0
    /// stops answering and every flow on it moves to path 1, while flows already on path
    /// 1 stay; when path 0 answers again, its flows come back.
    #[test]
    fn flows_move_only_off_a_dead_path() {
        let mut s = steer();
        let ms = 1_000_000u64;
        let answer = |s: &mut Steer, now: u64, paths: &[usize]| {
            let mut out = Burst::with_capacity(8);
            s.poll(&mut out, &mut ctx(now, 0));
            let mut back = Burst::with_capacity(8);
            for (d, data) in out.iter() {
                let path = s.paths.iter().position(|p| p.0 == d.in_port).unwrap();
                if paths.contains(&path) {
                    back.push(data, data.len() as u32, now, s.paths[path].1, 0);
                }
            }
            back.parse(&FlowHasher::with_seed(7));
            s.process(&mut back, &mut ctx(now, 0));
            assert!(
                back.descs()
                    .iter()
                    .all(|d| d.verdict == Verdict::Drop(PROBE))
            );
        };
        let hashes: Vec<u64> = (0..1000u64).map(|i| score(i, 99)).collect();
        let mut now = 1_000 * ms;
        for _ in 0..5 {
            answer(&mut s, now, &[0, 1]);
            now += 20 * ms;
        }
        assert_eq!(s.live_paths(now), [true, true]);
        let before: Vec<usize> = hashes.iter().map(|&h| s.choose(h, now)).collect();
        let on0 = before.iter().filter(|&&p| p == 0).count();
        assert!(
            (350..650).contains(&on0),
            "flows spread over both paths: {on0}"
        );
        for _ in 0..10 {
            answer(&mut s, now, &[1]);
            now += 20 * ms;
        }
        assert_eq!(s.live_paths(now), [false, true]);
        for &h in &hashes {
            assert_eq!(s.choose(h, now), 1, "every flow is on the survivor");
        }
        for _ in 0..3 {
            answer(&mut s, now, &[0, 1]);
            now += 20 * ms;
        }
        let after: Vec<usize> = hashes.iter().map(|&h| s.choose(h, now)).collect();
        assert_eq!(before, after, "flows return to where they were");
    }

    /// A connection's packets from the left and its replies from the right leave by the
    /// same path, for many connections.
    #[test]
    fn both_directions_of_a_flow_take_one_path() {
        use stateplane_gen::build::{Hosts, L4, emit_frame};
        let mut s = steer();
        let mut burst = Burst::with_capacity(256);
        for i in 0..100u16 {
            let a = h1_to_h2();
            let b = Hosts {
                src_mac: a.dst_mac,
                dst_mac: a.src_mac,
                src: a.dst,
                dst: a.src,
                ..a
            };
            let (sp, dp) = (10_000 + i, 5201);
            let mut f = Vec::new();
            emit_frame(
                &mut f,
                &a,
                &L4::Udp {
                    src_port: sp,
                    dst_port: dp,
                },
                b"x",
            );
            burst.push(&f, f.len() as u32, 1, s.left, 0);
            let mut f = Vec::new();
            emit_frame(
                &mut f,
                &b,
                &L4::Udp {
                    src_port: dp,
                    dst_port: sp,
                },
                b"y",
            );
            burst.push(&f, f.len() as u32, 1, s.right, 0);
        }
        burst.parse(&FlowHasher::with_seed(7));
        s.process(&mut burst, &mut ctx(1, 0));
        let mut used = [0usize; 2];
        for pair in burst.descs().chunks(2) {
            let path_of = |v: Verdict, pick: fn(&(PortId, PortId)) -> PortId| match v {
                Verdict::Forward(p) => s.paths.iter().position(|x| pick(x) == p).unwrap(),
                other => panic!("{other:?}"),
            };
            let there = path_of(pair[0].verdict, |p| p.0);
            let back = path_of(pair[1].verdict, |p| p.1);
            assert_eq!(there, back);
            used[there] += 1;
        }
        assert!(used[0] > 20 && used[1] > 20, "both paths used: {used:?}");
    }

    /// With a NAT between, a connection's replies come back to the external address and
    /// port: chosen by the outside end, both directions still take one path (by the
    /// connection, many would not), and connections to many servers spread.
    #[test]
    fn by_the_outside_end_a_nat_between_keeps_both_directions_on_one_path() {
        use stateplane_gen::build::{Hosts, L4, emit_frame};
        let (mut by_outside, mut by_connection) = (steer_by("by = \"outside\""), steer());
        let mut frames = Vec::new();
        let inside = h1_to_h2();
        let answer = Hosts {
            src: inside.dst,
            dst: "198.18.0.100".parse().unwrap(),
            ..inside
        };
        for i in 0..100u16 {
            let server_port = 5201 + i;
            let mut f = Vec::new();
            let l4 = L4::Tcp {
                src_port: 10_000 + i,
                dst_port: server_port,
                seq: 1,
                ack: 0,
                flags: 2,
            };
            emit_frame(&mut f, &inside, &l4, b"x");
            frames.push((f, 0));
            let mut f = Vec::new();
            let l4 = L4::Tcp {
                src_port: server_port,
                dst_port: 30_000 + i,
                seq: 1,
                ack: 2,
                flags: 0x12,
            };
            emit_frame(&mut f, &answer, &l4, b"y");
            frames.push((f, 1));
        }
        let mut split = [0usize; 2];
        for (k, s) in [&mut by_outside, &mut by_connection]
            .into_iter()
            .enumerate()
        {
            let mut b = Burst::with_capacity(256);
            for (f, port) in &frames {
                b.push(f, f.len() as u32, 1, *port, 0);
            }
            b.parse(&FlowHasher::with_seed(7));
            s.process(&mut b, &mut ctx(1, 0));
            let mut used = [0usize; 2];
            for pair in b.descs().chunks(2) {
                let path_of = |v: Verdict, pick: fn(&(PortId, PortId)) -> PortId| match v {
                    Verdict::Forward(p) => s.paths.iter().position(|x| pick(x) == p).unwrap(),
                    other => panic!("{other:?}"),
                };
                let (there, back) = (
                    path_of(pair[0].verdict, |p| p.0),
                    path_of(pair[1].verdict, |p| p.1),
                );
                split[k] += usize::from(there != back);
                used[there] += 1;
            }
            assert!(used[0] > 20 && used[1] > 20, "both paths used: {used:?}");
        }
        assert_eq!(split[0], 0, "by the outside end, none split");
        assert!(
            split[1] > 20,
            "by the connection, {} of 100 split",
            split[1]
        );
        let names = PortNames(["l", "r", "a", "b"].map(String::from).to_vec());
        let cfg: SteerConfig = toml::from_str(
            "left = 'l'\nright = 'r'\npaths = [{ out = 'a', back = 'b' }]\nby = 'inside'",
        )
        .unwrap();
        let e = Steer::new(&cfg, &names, "program.steer").err().unwrap();
        assert_eq!(e.field, "program.steer.by");
    }

    #[test]
    fn bad_settings_name_the_field() {
        let names = PortNames(["l", "r", "a"].map(String::from).to_vec());
        let cfg: SteerConfig =
            toml::from_str("left = 'l'\nright = 'r'\npaths = [{ out = 'a', back = 'l' }]").unwrap();
        let e = Steer::new(&cfg, &names, "program.steer").err().unwrap();
        assert_eq!(e.field, "program.steer.paths[0].back");
    }
}
