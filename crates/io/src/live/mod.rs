//! Live ports: packets from and to network interfaces.
//!
//! Owns: opening an interface's queues for a number of workers (one receive queue and one
//! transmit ring per worker and interface), promiscuous mode, MTU, per-port counters, and
//! the errors a user can act on (no such interface, not permitted).
//!
//! Must never: block a worker except in the runtime's idle wait, or panic on what the
//! kernel hands over; `unsafe` lives in [`sys`] only.

pub mod afpacket;
mod sys;

pub use sys::{interface_up, poll_readable};

use stateplane_runtime::port::LiveQueue;
use std::fmt;
use std::io;

/// A network interface in this process's network namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    pub name: String,
    pub index: i32,
    pub mtu: u32,
}

impl Interface {
    pub fn lookup(name: &str) -> Result<Interface, LiveError> {
        let index = sys::interface_index(name).ok_or_else(|| LiveError::NoSuchInterface {
            name: name.to_owned(),
            available: interface_names(),
        })?;
        let mtu = sys::interface_mtu(name).map_err(|e| LiveError::Io {
            interface: name.to_owned(),
            what: "reading the MTU",
            source: e,
        })?;
        Ok(Interface {
            name: name.to_owned(),
            index,
            mtu,
        })
    }
}

/// The interfaces of this network namespace, by name.
pub fn interface_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir("/sys/class/net")
        .map(|dir| {
            dir.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Why a live port could not be opened.
#[derive(Debug)]
pub enum LiveError {
    NoSuchInterface {
        name: String,
        available: Vec<String>,
    },
    /// The process lacks the privilege (CAP_NET_RAW, CAP_NET_ADMIN for some options).
    NotPermitted {
        interface: String,
        what: &'static str,
    },
    Io {
        interface: String,
        what: &'static str,
        source: io::Error,
    },
}

impl LiveError {
    pub fn from_io(iface: &Interface, what: &'static str, source: io::Error) -> LiveError {
        if matches!(
            source.raw_os_error(),
            Some(libc::EPERM) | Some(libc::EACCES)
        ) {
            LiveError::NotPermitted {
                interface: iface.name.clone(),
                what,
            }
        } else {
            LiveError::Io {
                interface: iface.name.clone(),
                what,
                source,
            }
        }
    }
}

impl fmt::Display for LiveError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LiveError::NoSuchInterface { name, available } => write!(
                f,
                "there is no interface '{name}' in this network namespace; it has: {} (for one in another namespace, run stateplane there: ip netns exec NS stateplane ...)",
                available.join(", ")
            ),
            LiveError::NotPermitted { interface, what } => write!(
                f,
                "{interface}: {what} is not permitted: live ports need CAP_NET_RAW and CAP_NET_ADMIN; run as root, or grant them with `setcap cap_net_raw,cap_net_admin+ep $(command -v stateplane)`"
            ),
            LiveError::Io {
                interface,
                what,
                source,
            } => write!(f, "{interface}: {what}: {source}"),
        }
    }
}

impl std::error::Error for LiveError {}

/// Sizes of the rings of one queue. The defaults hold a few milliseconds of line rate on a
/// veth and cost about 3 MiB per worker and interface.
#[derive(Debug, Clone)]
pub struct RingConfig {
    pub rx_block_bytes: usize,
    pub rx_blocks: usize,
    /// How long the kernel fills a block before handing it over anyway (latency at low
    /// rates).
    pub rx_block_timeout_ms: u32,
    pub tx_frames: usize,
    pub promiscuous: bool,
}

impl Default for RingConfig {
    fn default() -> Self {
        RingConfig {
            rx_block_bytes: 256 << 10,
            rx_blocks: 8,
            rx_block_timeout_ms: 1,
            tx_frames: 512,
            promiscuous: true,
        }
    }
}

/// The queues of one interface, one per worker.
pub struct InterfaceQueues {
    pub interface: Interface,
    pub queues: Vec<Box<dyn LiveQueue>>,
}

/// Opens `name` for `workers` workers over AF_PACKET; with more than one worker, the receive
/// queues form a fanout group so each flow (both directions) stays on one worker.
pub fn open_afpacket(
    name: &str,
    workers: usize,
    rings: &RingConfig,
) -> Result<InterfaceQueues, LiveError> {
    let iface = Interface::lookup(name)?;
    if !sys::interface_up(name, true)
        .map_err(|e| LiveError::from_io(&iface, "bringing it up", e))?
    {
        log::warn!("{name}: the interface is down");
    }
    // Fanout group ids are per network namespace; process id and interface index keep two
    // switches in one namespace apart.
    let group = ((std::process::id() as u16) ^ (iface.index as u16).rotate_left(8)).max(1);
    let mut queues: Vec<Box<dyn LiveQueue>> = Vec::with_capacity(workers);
    for _ in 0..workers {
        let fanout = (workers > 1).then_some(group);
        queues.push(Box::new(afpacket::PacketQueue {
            rx: afpacket::PacketRx::open(&iface, fanout, rings)?,
            tx: afpacket::PacketTx::open(&iface, rings)?,
        }));
    }
    log::info!(
        "{name}: AF_PACKET, {workers} queue(s), MTU {}, TPACKET_V3 receive, mapped transmit ring",
        iface.mtu
    );
    Ok(InterfaceQueues {
        interface: iface,
        queues,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateplane_runtime::Burst;
    use std::time::{Duration, Instant};

    /// A frame of `len` bytes whose payload carries `i`.
    fn frame(i: u32, len: usize) -> Vec<u8> {
        let mut f = vec![0u8; len];
        f[..6].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
        f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 1]);
        f[12..14].copy_from_slice(&0x88b5u16.to_be_bytes()); // local experimental
        f[14..18].copy_from_slice(&i.to_be_bytes());
        f
    }

    /// Real packets through the kernel: frames sent on the transmit ring of a private
    /// namespace's loopback come back on the receive ring, in order, whole, and counted;
    /// an oversize frame is refused and counted, never sent.
    #[test]
    fn afpacket_rings_carry_frames_through_the_kernel() {
        let result = std::thread::spawn(|| {
            sys::enter_new_network_namespace().expect("unshare(CLONE_NEWNET): run tests as root");
            sys::interface_up("lo", true).expect("bring lo up");
            let rings = RingConfig {
                rx_block_bytes: 64 << 10,
                rx_blocks: 4,
                tx_frames: 64,
                ..RingConfig::default()
            };
            let mut opened = open_afpacket("lo", 1, &rings).expect("open lo");
            let q = &mut opened.queues[0];
            let count = 1000u32;
            let mut received = Vec::new();
            let mut burst = Burst::with_capacity(64);
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut sent = 0u32;
            while received.len() < count as usize && Instant::now() < deadline {
                // Send in bursts no bigger than the receive side can hold between reads.
                for _ in 0..32 {
                    if sent < count && q.send(&frame(sent, 60 + (sent as usize % 1400))) {
                        sent += 1;
                    }
                }
                q.flush();
                poll_readable(&[q.fd()], 5).expect("poll");
                burst.clear();
                q.recv(&mut burst, 3);
                for (d, data) in burst.iter() {
                    assert_eq!(d.in_port, 3);
                    assert!(d.ts_ns > 0);
                    received.push(data.to_vec());
                }
            }
            let too_big = frame(0, 65_536 + 14 + 1);
            assert!(!q.send(&too_big), "a frame over the MTU must be refused");
            (received, sent, q.counters())
        })
        .join()
        .expect("test thread");
        let (received, sent, counts) = result;
        assert_eq!(sent, 1000);
        assert_eq!(received.len(), 1000, "every frame sent comes back");
        for (i, data) in received.iter().enumerate() {
            assert_eq!(data, &frame(i as u32, 60 + (i % 1400)), "frame {i}");
        }
        assert_eq!(counts.rx_packets, 1000);
        assert_eq!(counts.rx_kernel_drops, 0);
        assert_eq!(counts.tx_packets, 1000);
        assert_eq!(counts.tx_oversize, 1);
    }

    #[test]
    fn a_missing_interface_is_named_with_the_ones_there_are() {
        let e = open_afpacket("nosuch0", 1, &RingConfig::default())
            .err()
            .expect("must fail");
        let text = e.to_string();
        assert!(text.contains("no interface 'nosuch0'"), "{text}");
        assert!(
            text.contains("lo"),
            "lists the interfaces there are: {text}"
        );
    }
}
