//! `kv`: an in-network key-value cache in front of a key-value server speaking the
//! protocol of docs/kv-protocol.md (UDP port 9000).
//!
//! A GET for a cached key is answered by the data plane: the request is turned around
//! into a GET_REPLY carrying the value (addresses, ports and MACs swapped, lengths and
//! checksums made right) and sent back out of the port it came in by; the server never
//! sees it. A GET for any other key goes on to the server. A PUT goes on to the server
//! (which stays the authority and acknowledges it) and updates the cache on its way: a
//! value of up to 16 bytes is cached, a longer one removes the key, so the cache never
//! answers with a value older than the last PUT it saw. The server's GET_REPLYs fill the
//! cache on their way back (look-aside). Entries idle for `idle` seconds leave; a full
//! cache refuses new keys (`ctl stats cache` counts refusals, lookups and hits).
//!
//! Workers: each worker caches the requests the runtime sends it, and requests for one
//! key come from many clients (many flows): a PUT updates only its worker's cache, so with
//! several workers another may answer with the value before it until that entry idles
//! out. A run of `kv` on more workers is refused at start: its cache would have to be
//! kept in step across workers, which nothing does yet (`synced` copies a worker's
//! table to a collector, not a table between workers).
//!
//! State: `cache` (declared; key `key`; action `value` with `len` and `value`, the value's
//! bytes as a big-endian number; read-centric: GETs read it, PUTs write it); it may be
//! `synced` (a slot's five words: action, key, `len`, `value`'s two), and `replicated`,
//! each key a flow of its own.
//! Configuration: `server` (its address, required), `clients` and `backend` (ports,
//! default 0 and 1), `capacity` (keys per worker, default 65536), `idle` (seconds, default
//! 60). Drop reasons: none of its own (malformed requests go on to the server, which
//! answers them or not).

use crate::keys::filled_table;
use crate::{ConfigError, PortNames, answer_by_table};
use serde::Deserialize;
use stateplane_runtime::{Burst, Context, PacketDesc, PortId, Program, Verdict};
use stateplane_state::control::{Field, Format};
use stateplane_state::{DeclaredTable, ValueCodec, params_into};
use stateplane_wire::checksum;
use stateplane_wire::kv_proto::{self as kv, Message, Op};
use stateplane_wire::parse::{ParseFlags, Parsed};
use std::net::IpAddr;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvConfig {
    pub server: String,
    #[serde(default = "default_clients")]
    pub clients: String,
    #[serde(default = "default_backend")]
    pub backend: String,
    #[serde(default = "default_capacity")]
    pub capacity: usize,
    #[serde(default = "default_idle")]
    pub idle: f64,
}

fn default_clients() -> String {
    "0".into()
}

fn default_backend() -> String {
    "1".into()
}

fn default_capacity() -> usize {
    65_536
}

fn default_idle() -> f64 {
    60.0
}

/// The longest value the cache holds.
pub const MAX_CACHED: usize = 16;

/// A cached value: its length and bytes (big-endian in the number, left-aligned).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Zeroable)]
pub struct Cached {
    pub len: u8,
    pub value: u128,
}

impl Cached {
    fn of(bytes: &[u8]) -> Option<Cached> {
        if bytes.len() > MAX_CACHED {
            return None;
        }
        let mut b = [0u8; MAX_CACHED];
        b[..bytes.len()].copy_from_slice(bytes);
        Some(Cached {
            len: bytes.len() as u8,
            value: u128::from_be_bytes(b),
        })
    }

    fn bytes(&self) -> [u8; MAX_CACHED] {
        self.value.to_be_bytes()
    }
}

struct CacheCodec;

impl ValueCodec for CacheCodec {
    type Key = u64;
    type Value = Cached;

    fn value(_action: usize, params: &[u128]) -> Cached {
        Cached {
            len: params.first().copied().unwrap_or(0).min(MAX_CACHED as u128) as u8,
            value: params.get(1).copied().unwrap_or(0),
        }
    }

    fn action_values(c: &Cached, out: &mut [u128]) -> (usize, usize) {
        (0, params_into([u128::from(c.len), c.value], out))
    }
}

/// What a client's packet is to the cache.
enum Request {
    /// A GET this cache answers, with the value.
    Hit(Cached),
    /// Anything else: on to the server.
    Pass,
}

#[derive(Clone)]
pub struct Kv {
    server: IpAddr,
    clients: PortId,
    backend: PortId,
    cache: DeclaredTable<CacheCodec>,
    /// GETs answered by the data plane.
    pub answered: u64,
}

impl Kv {
    pub fn new(
        cfg: &KvConfig,
        ports: &PortNames,
        field: &str,
        seed: u64,
    ) -> Result<Self, ConfigError> {
        let server: IpAddr = cfg.server.parse().map_err(|_| {
            ConfigError::new(
                format!("{field}.server"),
                format!("'{}' is not an address like 198.19.0.100", cfg.server),
            )
        })?;
        crate::check_capacity(&format!("{field}.capacity"), cfg.capacity, "keys")?;
        let profiles = crate::idle_profiles(field, &[("idle", cfg.idle)])?;
        let clients = ports.resolve(&format!("{field}.clients"), &cfg.clients)?;
        let backend = ports.resolve(&format!("{field}.backend"), &cfg.backend)?;
        let value = vec![
            Field::exact("len", 8, Format::Int),
            Field::exact("value", 128, Format::Int),
        ];
        let declaration = filled_table::<u64>("cache", "key", cfg.capacity, &["value"], value);
        Ok(Kv {
            server,
            clients,
            backend,
            cache: DeclaredTable::new(
                crate::budgeted_table(&format!("{field}.capacity"), cfg.capacity, &profiles, seed)?,
                declaration,
            ),
            answered: 0,
        })
    }

    /// The cached value of `key`.
    pub fn cached(&self, key: u64) -> Option<Vec<u8>> {
        let c = self.cache.get(&key)?;
        Some(c.bytes()[..usize::from(c.len)].to_vec())
    }

    /// The key-value message a packet carries between a client and the server, if any.
    fn message<'a>(&self, data: &'a [u8], parsed: &Parsed, to_server: bool) -> Option<Message<'a>> {
        let k = &parsed.key;
        let (addr, port) = if to_server {
            (k.dst_ip(), k.dst_port)
        } else {
            (k.src_ip(), k.src_port)
        };
        if !parsed.flags.has(ParseFlags::UDP) || port != kv::PORT || addr != Some(self.server) {
            return None;
        }
        Message::parse(data.get(usize::from(parsed.payload_offset)..)?).ok()
    }

    /// The key a GET, PUT or GET_REPLY is about (its replicated key): what the cache reads
    /// or writes for it.
    fn key_of(&self, packet: &PacketDesc, data: &[u8]) -> Option<u64> {
        let to_server = packet.in_port != self.backend;
        let m = self.message(data, &packet.parsed, to_server)?;
        let about_cache = match m.op {
            Op::Get | Op::Put => to_server,
            Op::GetReply => !to_server,
            _ => false,
        };
        about_cache.then_some(m.key)
    }

    /// Stores `value` for `key`, or forgets the key if the value is too long to cache.
    fn store(&mut self, key: u64, value: &[u8], now: u64) {
        match Cached::of(value) {
            Some(c) => match self.cache.lookup(&key, now) {
                Some(id) => {
                    *self.cache.value_mut(id) = c;
                    self.cache.restart_timer(id, now);
                }
                // A full cache refuses the key (counted by the table); the server has it.
                None => {
                    let _ = self.cache.add_entry(key, c, 0, now);
                }
            },
            None => {
                self.cache.delete(&key);
            }
        }
    }

    /// Reads a client's packet: a GET to answer, or one to pass on (updating the cache for
    /// a PUT).
    fn read_request(&mut self, data: &[u8], parsed: &Parsed, now: u64) -> Request {
        // Requests whose headers `answer` cannot turn around go on to the server.
        let simple = !parsed.flags.has(ParseFlags::IPV4_OPTIONS)
            && !parsed.flags.has(ParseFlags::IPV6_EXTENSIONS);
        let Some(m) = self.message(data, parsed, true) else {
            return Request::Pass;
        };
        match m.op {
            Op::Get if simple && m.value.is_empty() => match self.cache.lookup(&m.key, now) {
                Some(id) => {
                    self.cache.restart_timer(id, now);
                    Request::Hit(*self.cache.value(id))
                }
                None => Request::Pass,
            },
            Op::Put => {
                self.store(m.key, m.value, now);
                Request::Pass
            }
            _ => Request::Pass,
        }
    }

    /// Turns GET request `i` around into the reply carrying `value`.
    fn answer(&mut self, burst: &mut Burst, i: usize, value: Cached) -> Verdict {
        let d = burst.descs()[i];
        let p = &d.parsed;
        let (l3, l4, kv_at) = (
            usize::from(p.l3_offset),
            usize::from(p.l4_offset),
            usize::from(p.payload_offset),
        );
        let n = usize::from(value.len);
        let reply_len = kv_at + kv::HEADER_LEN;
        let back = Verdict::Forward(d.in_port);
        let Some(packet) = burst.grow_front(i, n) else {
            return Verdict::Forward(self.backend);
        };
        let data = packet.data;
        if data.len() < n + reply_len {
            return Verdict::Forward(self.backend);
        }
        // The headers move to the new front; the value goes right after them.
        data.copy_within(n..n + reply_len, 0);
        data[reply_len..reply_len + n].copy_from_slice(&value.bytes()[..n]);
        let swap = |data: &mut [u8], a: usize, b: usize, len: usize| {
            for k in 0..len {
                data.swap(a + k, b + k);
            }
        };
        swap(data, 0, 6, 6);
        swap(data, l4, l4 + 2, 2);
        data[kv_at + 3] = Op::GetReply as u8;
        data[kv_at + 16..kv_at + 18].copy_from_slice(&(n as u16).to_be_bytes());
        let udp_len = (reply_len - l4 + n) as u16;
        data[l4 + 4..l4 + 6].copy_from_slice(&udp_len.to_be_bytes());
        data[l4 + 6..l4 + 8].copy_from_slice(&[0, 0]);
        let sum = if p.key.ip_version == 4 {
            swap(data, l3 + 12, l3 + 16, 4);
            let total = (l4 - l3) as u16 + udp_len;
            data[l3 + 2..l3 + 4].copy_from_slice(&total.to_be_bytes());
            data[l3 + 10..l3 + 12].copy_from_slice(&[0, 0]);
            let c = checksum::checksum(&data[l3..l4]);
            data[l3 + 10..l3 + 12].copy_from_slice(&c.to_be_bytes());
            let pseudo = checksum::accumulate(0, &data[l3 + 12..l3 + 20]) + 17 + u32::from(udp_len);
            checksum::accumulate(pseudo, &data[l4..l4 + usize::from(udp_len)])
        } else {
            swap(data, l3 + 8, l3 + 24, 16);
            data[l3 + 4..l3 + 6].copy_from_slice(&udp_len.to_be_bytes());
            let pseudo = checksum::accumulate(0, &data[l3 + 8..l3 + 40]) + 17 + u32::from(udp_len);
            checksum::accumulate(pseudo, &data[l4..l4 + usize::from(udp_len)])
        };
        // A UDP checksum of zero is sent as all ones (RFC 768).
        let c = match checksum::finish(sum) {
            0 => 0xffff,
            c => c,
        };
        data[l4 + 6..l4 + 8].copy_from_slice(&c.to_be_bytes());
        self.answered += 1;
        back
    }
}

impl Program for Kv {
    type Prepared = ();

    /// A PUT updates only its own worker's cache: on several workers another would answer
    /// GETs with the value before it until its entry idles out.
    fn check_workers(&self, workers: usize, _live: bool) -> Result<(), String> {
        if workers > 1 {
            return Err(format!(
                "kv runs on one worker until its cache can be kept in step across workers (nothing does that yet): with {workers}, a worker could answer a GET with a value another worker's PUT replaced; set workers = 1 (--workers 1)"
            ));
        }
        Ok(())
    }

    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        for i in 0..burst.len() {
            let (in_port, now) = (burst.descs()[i].in_port, burst.descs()[i].ts_ns);
            let verdict = if in_port == self.backend {
                let p = burst.packet_mut(i);
                if let Some(m) = self.message(p.data, &p.desc.parsed, false)
                    && m.op == Op::GetReply
                {
                    self.store(m.key, m.value, now);
                }
                Verdict::Forward(self.clients)
            } else {
                let p = burst.packet_mut(i);
                match self.read_request(p.data, &p.desc.parsed, now) {
                    Request::Hit(value) => self.answer(burst, i, value),
                    Request::Pass => Verdict::Forward(self.backend),
                }
            };
            burst.descs_mut()[i].verdict = verdict;
        }
        self.cache
            .expire(ctx.now_ns, crate::sweep_budget(burst.len()), |_, _| {});
    }

    fn poll(&mut self, _out: &mut Burst, ctx: &mut Context) {
        self.cache.expire(ctx.now_ns, crate::IDLE_SWEEP, |_, _| {});
    }

    answer_by_table!(cache);

    crate::synced_tables::synced_table_methods!(cache);

    crate::replicated_tables::replicated_table_methods!(cache, with_counts: false, key: key_of);

    /// The cache stays while it caches the same server, which its values came from.
    fn inherit(&mut self, mut old: Self, _now_ns: u64) -> Vec<stateplane_state::Carried> {
        self.answered += old.answered;
        if old.server != self.server {
            let why = format!("the server changed from {} to {}", old.server, self.server);
            return vec![stateplane_state::Carried::afresh("cache", why)];
        }
        vec![self.cache.adopt(&mut old.cache)]
    }
}

#[cfg(test)]
mod tests;
