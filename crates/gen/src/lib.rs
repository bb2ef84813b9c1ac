//! The traffic generator behind `stateplane gen`.
//!
//! Owns: workloads that later capabilities and their experiments need, each a
//! deterministic function of its configuration and seed (the same seed gives the same bytes
//! on every machine), written as whole frames with valid lengths and checksums.
//!
//! Must never: read the clock or the environment (timestamps come from the configured
//! start and rate), or send anything anywhere (it hands frames to a callback).
//!
//! Addresses come from the benchmarking ranges: IPv4 198.18.0.0/15 (clients in
//! 198.18.0.0/16, servers in 198.19.0.0/16) and IPv6 2001:2::/48 (RFC 5180).

pub mod build;
pub mod established;
pub use stateplane_wire::kv_proto as kv;
pub mod rng;
mod workloads;

pub use workloads::{GenGenerateError, generate};

/// What the `gtp` workload's subscriber `n` is made of, for those who check a gateway's
/// work on it: its IMSI, and the TEIDs of the MME's and the eNodeB's ends.
pub mod gtp {
    pub use crate::workloads::{IMSI_BASE, enb_teid, mme_teid};
}

use std::fmt;
use std::str::FromStr;

/// The key-value server's address in the `kv` workload (IPv4 clients).
pub const KV_SERVER: std::net::Ipv4Addr = std::net::Ipv4Addr::new(198, 19, 0, 100);

/// The kinds of traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Backbone-like: heavy-tailed (Zipf) flow sizes, most flows under 10 packets and a few
    /// elephants carrying most bytes; TCP with handshakes, FIN and RST, and UDP.
    Internet,
    /// Fewer, larger flows, less skewed.
    Datacenter,
    /// Internet background with spoofed TCP SYNs to one victim mixed in.
    Synflood,
    /// Internet background with spoofed UDP packets to one victim mixed in.
    Udpflood,
    /// Requests of the key-value protocol (see `kv`) with Zipf key popularity.
    Kv,
    /// Mobile user plane: GTP-U uplink, plain downlink, and GTPv2-C signaling, about one
    /// signaling message per 17 data packets.
    Gtp,
}

impl Workload {
    pub const ALL: [(&'static str, Workload); 6] = [
        ("internet", Workload::Internet),
        ("datacenter", Workload::Datacenter),
        ("synflood", Workload::Synflood),
        ("udpflood", Workload::Udpflood),
        ("kv", Workload::Kv),
        ("gtp", Workload::Gtp),
    ];

    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(_, w)| *w == self)
            .map_or("?", |(n, _)| n)
    }
}

impl FromStr for Workload {
    type Err = GenError;
    fn from_str(s: &str) -> Result<Self, GenError> {
        Self::ALL
            .iter()
            .find(|(n, _)| *n == s)
            .map(|(_, w)| *w)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::ALL.iter().map(|(n, _)| *n).collect();
                GenError::new(
                    "workload",
                    format!(
                        "there is no workload '{s}'; choose one of: {}",
                        names.join(", ")
                    ),
                )
            })
    }
}

/// What to generate.
#[derive(Clone, Debug)]
pub struct GenConfig {
    pub workload: Workload,
    pub packets: u64,
    /// Flows (users for `gtp`, clients for `kv`); `None` picks the workload's default.
    pub flows: Option<u64>,
    pub seed: u64,
    /// Share of flows that are IPv6, 0 to 1.
    pub ipv6_share: f64,
    /// Packets per second; give this or `duration_s`, not both. Default 1,000,000.
    pub rate_pps: Option<f64>,
    /// Length of the trace in seconds (sets the rate to packets / duration).
    pub duration_s: Option<f64>,
    /// Zipf exponent of flow sizes (and of key popularity for `kv`).
    pub zipf: Option<f64>,
    /// Every frame this many bytes (as captured, without FCS), raised to the headers' size
    /// where they need more. `None`: sizes from the workload's distribution, 64 to 1514.
    pub packet_size: Option<usize>,
    /// Share of packets that are attack traffic, for the floods.
    pub attack_share: f64,
    /// 0: untagged; N: flows tagged with VLANs 1..=N.
    pub vlans: u16,
    /// Distinct keys, for `kv`.
    pub kv_keys: u64,
    /// Share of GET among `kv` requests (the rest are PUT).
    pub kv_get_share: f64,
    /// Timestamp of the first packet, ns since the Unix epoch.
    pub start_ns: u64,
}

impl GenConfig {
    pub fn new(workload: Workload, packets: u64) -> Self {
        GenConfig {
            workload,
            packets,
            flows: None,
            seed: 1,
            ipv6_share: 0.2,
            rate_pps: None,
            duration_s: None,
            zipf: None,
            packet_size: None,
            attack_share: 0.5,
            vlans: 0,
            kv_keys: 100_000,
            kv_get_share: 0.9,
            start_ns: 1_700_000_000_000_000_000,
        }
    }

    /// Checks every field; the error names the one at fault and the fix.
    pub fn validate(&self) -> Result<(), GenError> {
        if self.packets == 0 {
            return Err(GenError::new("packets", "must be at least 1"));
        }
        if let Some(f) = self.flows {
            if f == 0 {
                return Err(GenError::new("flows", "must be at least 1"));
            }
            if f > self.packets
                && matches!(
                    self.workload,
                    Workload::Internet | Workload::Datacenter | Workload::Gtp
                )
            {
                return Err(GenError::new(
                    "flows",
                    format!(
                        "{f} flows cannot fit in {} packets: give at most as many flows as packets",
                        self.packets
                    ),
                ));
            }
        }
        for (name, v) in [
            ("ipv6-share", self.ipv6_share),
            ("attack-share", self.attack_share),
            ("kv-get-share", self.kv_get_share),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(GenError::new(
                    name,
                    format!("{v} is not a share: give a number from 0 to 1"),
                ));
            }
        }
        match (self.rate_pps, self.duration_s) {
            (Some(_), Some(_)) => {
                return Err(GenError::new(
                    "rate",
                    "give --rate or --duration, not both (each sets the other)",
                ));
            }
            (Some(r), None) if !(r > 0.0 && r.is_finite()) => {
                return Err(GenError::new(
                    "rate",
                    "must be a positive number of packets per second",
                ));
            }
            (None, Some(d)) if !(d > 0.0 && d.is_finite()) => {
                return Err(GenError::new(
                    "duration",
                    "must be a positive number of seconds",
                ));
            }
            _ => {}
        }
        if let Some(z) = self.zipf
            && !(z >= 0.0 && z.is_finite())
        {
            return Err(GenError::new(
                "zipf",
                "must be a number of 0 or more (1.0 is classic Zipf)",
            ));
        }
        if let Some(s) = self.packet_size
            && !(60..=9018).contains(&s)
        {
            return Err(GenError::new(
                "packet-size",
                format!(
                    "{s} bytes is outside 60 to 9018 (an Ethernet frame without FCS, jumbo allowed)"
                ),
            ));
        }
        if self.vlans > 4094 {
            return Err(GenError::new("vlans", "at most 4094 VLANs"));
        }
        if self.kv_keys == 0 {
            return Err(GenError::new("kv-keys", "must be at least 1"));
        }
        Ok(())
    }

    /// Nanoseconds between packets.
    pub fn gap_ns(&self) -> f64 {
        match (self.rate_pps, self.duration_s) {
            (Some(r), _) => 1e9 / r,
            (None, Some(d)) => d * 1e9 / self.packets as f64,
            (None, None) => 1_000.0,
        }
    }
}

/// A configuration problem: the field, and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GenError {
    pub field: &'static str,
    pub problem: String,
}

impl GenError {
    fn new(field: &'static str, problem: impl Into<String>) -> Self {
        GenError {
            field,
            problem: problem.into(),
        }
    }
}

impl fmt::Display for GenError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "--{}: {}", self.field, self.problem)
    }
}

impl std::error::Error for GenError {}

/// What was generated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GenSummary {
    pub packets: u64,
    /// Captured bytes of all frames.
    pub bytes: u64,
    pub flows: u64,
    pub ipv6_packets: u64,
    pub tcp_packets: u64,
    pub udp_packets: u64,
    /// Flood packets (for `synflood` and `udpflood`), signaling messages (for `gtp`).
    pub special_packets: u64,
    pub first_ns: u64,
    pub last_ns: u64,
}
