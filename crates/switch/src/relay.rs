//! `stateplane relay`: a UDP relay that does to datagrams what a bad network does, at
//! configured rates: loses, duplicates and delays them (delay reorders), both ways. Put
//! between switches and a collector, it is the sync channel's fault injection for tests
//! and experiments with real processes. The faults are `stateplane_sync::channel`'s, on
//! the wall clock.
//!
//! Each client (a source address) gets a socket of its own toward the target, so that the
//! target's answers come back to the relay and go on to that client.
//!
//! Must never: relay for more than `MAX_CLIENTS` sources, or hold a datagram past its time
//! by more than the loop's tick (a millisecond).

use stateplane_sync::channel::{Channel, ChannelConfig, Faults};
use std::collections::HashMap;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Sources a relay serves at most.
const MAX_CLIENTS: usize = 1024;

#[derive(Clone, Debug)]
pub struct RelaySettings {
    pub listen: SocketAddr,
    pub target: SocketAddr,
    pub faults: Faults,
    pub seed: u64,
    pub duration: Option<Duration>,
}

/// What a relay did, each way.
#[derive(Debug, Default, Clone, Copy)]
pub struct RelayOutcome {
    pub to_target: Way,
    pub from_target: Way,
}

#[derive(Debug, Default, Clone, Copy)]
pub struct Way {
    pub received: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub delivered: u64,
}

impl RelayOutcome {
    pub fn table(&self) -> String {
        let line = |name: &str, w: &Way| {
            format!(
                "{name}: received {}, lost {}, duplicated {}, delivered {}\n",
                w.received, w.lost, w.duplicated, w.delivered
            )
        };
        line("to the target", &self.to_target) + &line("from the target", &self.from_target)
    }
}

struct Client {
    upstream: UdpSocket,
    to_target: Channel,
    from_target: Channel,
}

fn channel(faults: Faults, seed: u64) -> Channel {
    Channel::new(ChannelConfig {
        bytes_per_second: 0,
        buffer_bytes: u64::MAX,
        latency_ns: 0,
        faults,
        seed,
    })
}

fn add(way: &mut Way, c: &Channel) {
    way.received += c.counters.sent;
    way.lost += c.counters.lost;
    way.duplicated += c.counters.duplicated;
    way.delivered += c.counters.delivered;
}

/// Gives `socket` a receive buffer that a burst of large datagrams (a write's parts)
/// fits in: the relay loses only what its faults say.
fn roomy(socket: &UdpSocket) {
    if let Err(e) = stateplane_io::udp_socket::set_receive_buffer(socket, 8 << 20) {
        log::warn!("relay: could not enlarge a socket's receive buffer: {e}");
    }
}

/// Binds the relay's socket (so that a bad address is refused at once); its address.
pub fn bind(settings: &RelaySettings) -> Result<(UdpSocket, SocketAddr), String> {
    let socket = UdpSocket::bind(settings.listen)
        .map_err(|e| format!("--listen {}: {e}", settings.listen))?;
    socket
        .set_nonblocking(true)
        .map_err(|e| format!("--listen: {e}"))?;
    roomy(&socket);
    let addr = socket.local_addr().map_err(|e| format!("--listen: {e}"))?;
    // What the relay sent to itself would come back as from a client, and go again.
    if reaches_itself(addr, settings.target) {
        return Err(format!(
            "--to {}: the relay's own address (--listen {} takes what is sent there); give the collector's (or the switch's) address, another than --listen",
            settings.target, settings.listen
        ));
    }
    Ok((socket, addr))
}

/// Whether datagrams sent to `target` come to a socket bound to `listen`: its address, or,
/// for a socket bound to every address of the host (`0.0.0.0`, `[::]`, which takes IPv4
/// too), the same port at an address of this host (one a socket can be bound to).
fn reaches_itself(listen: SocketAddr, target: SocketAddr) -> bool {
    target == listen
        || listen.ip().is_unspecified()
            && target.port() == listen.port()
            && (listen.is_ipv6() || target.is_ipv4())
            && UdpSocket::bind((target.ip(), 0)).is_ok()
}

/// Relays until `stop` is raised or the duration ends.
pub fn run(
    settings: &RelaySettings,
    socket: UdpSocket,
    stop: Arc<AtomicBool>,
) -> Result<RelayOutcome, String> {
    let start = Instant::now();
    let now = || start.elapsed().as_nanos() as u64;
    let mut clients: HashMap<SocketAddr, Client> = HashMap::new();
    let mut datagram = vec![0u8; 65_536];
    let mut arrived = Vec::new();
    let local = match settings.target {
        SocketAddr::V4(_) => SocketAddr::from(([0, 0, 0, 0], 0)),
        SocketAddr::V6(_) => SocketAddr::from(([0u16; 8], 0)),
    };
    while !stop.load(Ordering::Relaxed) && settings.duration.is_none_or(|d| start.elapsed() < d) {
        // Until a datagram comes either way, or a millisecond passes (delayed datagrams
        // wait their time): poll(2)'s timeout is kept to the microsecond, where a socket's
        // receive timeout is kept in ticks (4 ms at 250 Hz).
        let mut fds = vec![socket.as_raw_fd()];
        fds.extend(clients.values().map(|c| c.upstream.as_raw_fd()));
        let _ = stateplane_io::live::poll_readable(&fds, 1);
        while let Ok((n, from)) = socket.recv_from(&mut datagram) {
            if !clients.contains_key(&from) && clients.len() < MAX_CLIENTS {
                let upstream = UdpSocket::bind(local)
                    .and_then(|u| u.connect(settings.target).map(|()| u))
                    .and_then(|u| u.set_nonblocking(true).map(|()| u))
                    .map_err(|e| format!("relay: a socket toward {}: {e}", settings.target))?;
                roomy(&upstream);
                let seed = settings.seed ^ (clients.len() as u64).wrapping_mul(0x9e37_79b9);
                clients.insert(
                    from,
                    Client {
                        upstream,
                        to_target: channel(settings.faults, seed),
                        from_target: channel(settings.faults, !seed),
                    },
                );
            }
            if let Some(c) = clients.get_mut(&from) {
                c.to_target.send(now(), datagram[..n].to_vec());
            }
        }
        for (addr, c) in &mut clients {
            while let Ok(n) = c.upstream.recv(&mut datagram) {
                c.from_target.send(now(), datagram[..n].to_vec());
            }
            let t = now();
            c.to_target.deliver(t, &mut arrived);
            for bytes in arrived.drain(..) {
                let _ = c.upstream.send(&bytes);
            }
            c.from_target.deliver(t, &mut arrived);
            for bytes in arrived.drain(..) {
                let _ = socket.send_to(&bytes, *addr);
            }
        }
    }
    let mut outcome = RelayOutcome::default();
    for c in clients.values() {
        add(&mut outcome.to_target, &c.to_target);
        add(&mut outcome.from_target, &c.from_target);
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::reaches_itself;

    /// A relay listening at every address reaches itself at its port on any address of
    /// this host, and at no other port or host; one listening at one address, there alone.
    #[test]
    fn a_relay_knows_the_targets_that_are_itself() {
        let at = |text: &str| text.parse().unwrap();
        for (listen, target, itself) in [
            ("127.0.0.1:5000", "127.0.0.1:5000", true),
            ("127.0.0.1:5000", "127.0.0.2:5000", false),
            ("0.0.0.0:5000", "127.0.0.1:5000", true),
            ("0.0.0.0:5000", "127.0.0.1:5001", false),
            // An address of no host here (TEST-NET-1): the datagrams leave.
            ("0.0.0.0:5000", "192.0.2.1:5000", false),
            ("[::]:5000", "127.0.0.1:5000", true),
            ("[::]:5000", "[::1]:5000", true),
            ("0.0.0.0:5000", "[::1]:5000", false),
        ] {
            assert_eq!(
                reaches_itself(at(listen), at(target)),
                itself,
                "{listen} -> {target}"
            );
        }
    }
}
