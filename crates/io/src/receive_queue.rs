//! How full the receiving socket of a UDP peer on this host is, read from the kernel
//! (sock_diag netlink, what `ss -u -m` shows): the bytes queued for the receiver, the most
//! its buffer holds, and the datagrams it has dropped. An exporter sending to a collector
//! on the same host paces itself by it: as fast as the collector reads, never faster than
//! its buffer holds.
//!
//! Must never: change the socket it reads, or report on a socket for a peer that is not
//! on this host (a socket here bound to the same port is not a remote collector's).

use crate::live::sys;
use std::io;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::OwnedFd;

/// A receiving socket's queue, as the kernel counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueState {
    /// Bytes the queued datagrams take (each its payload and the kernel's overhead: see
    /// [`truesize`]).
    pub queued: u64,
    /// The receive buffer: a datagram arriving while `queued` is above it is dropped.
    pub capacity: u64,
    /// Datagrams the socket has dropped since it was opened.
    pub drops: u64,
}

/// Reads the queue of the socket that receives what a connected UDP socket sends.
pub struct QueueProbe {
    netlink: OwnedFd,
    request: Vec<u8>,
    reply: Vec<u8>,
}

// sock_diag's constants (linux/sock_diag.h, inet_diag.h, netlink.h), which the libc crate
// does not all name.
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLM_F_REQUEST: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_HEADER: usize = 16;
const INET_DIAG_SKMEMINFO: u16 = 7;
/// `inet_diag_req_v2`: family, protocol, extensions, pad, states, then the socket id.
const REQUEST_LEN: usize = 8 + SOCKET_ID_LEN;
/// `inet_diag_sockid`: ports, source and destination addresses, interface, cookie.
const SOCKET_ID_LEN: usize = 48;
/// `inet_diag_msg`: family, state, timer, retransmits, the socket id, then expires,
/// rqueue, wqueue, uid and inode; its attributes follow.
const REPLY_MSG_LEN: usize = 4 + SOCKET_ID_LEN + 20;
/// Indexes into the `SK_MEMINFO` array.
const MEMINFO_RMEM_ALLOC: usize = 0;
const MEMINFO_RCVBUF: usize = 1;
const MEMINFO_DROPS: usize = 8;

impl QueueProbe {
    /// A probe for the socket that receives what `socket` (connected) sends, if its peer
    /// is on this host and in this network namespace: `Ok(None)` when it is not (a remote
    /// collector, or none listening now).
    pub fn for_peer(socket: &UdpSocket) -> io::Result<Option<QueueProbe>> {
        let (local, peer) = (socket.local_addr()?, socket.peer_addr()?);
        if !on_this_host(peer.ip()) {
            return Ok(None);
        }
        let netlink = sys::socket(libc::AF_NETLINK, libc::SOCK_DGRAM, libc::NETLINK_SOCK_DIAG)?;
        let mut probe = QueueProbe {
            netlink,
            request: request(local, peer),
            reply: vec![0; 8192],
        };
        Ok(probe.read()?.map(|_| probe))
    }

    /// The receiving socket's queue now, or `None` once no socket receives there (the
    /// collector has gone).
    pub fn read(&mut self) -> io::Result<Option<QueueState>> {
        sys::send(&self.netlink, &self.request)?;
        let len = sys::recv(&self.netlink, &mut self.reply, 0)?;
        parse_reply(&self.reply[..len.min(self.reply.len())])
    }
}

/// Whether `ip` is an address of this host (in this network namespace): those can be
/// bound, another host's cannot.
fn on_this_host(ip: IpAddr) -> bool {
    UdpSocket::bind(SocketAddr::new(ip, 0)).is_ok()
}

/// A lookup (not a dump) of the one socket the kernel delivers to for a datagram from
/// `local` to `peer`: the same choice it makes for our datagrams, wildcard and dual-stack
/// sockets included.
fn request(local: SocketAddr, peer: SocketAddr) -> Vec<u8> {
    let (family, local_ip, peer_ip) = match (local.ip(), peer.ip()) {
        (IpAddr::V4(l), IpAddr::V4(p)) => (libc::AF_INET, pad16(&l.octets()), pad16(&p.octets())),
        (l, p) => (libc::AF_INET6, v6_octets(l), v6_octets(p)),
    };
    let len = NLMSG_HEADER + REQUEST_LEN;
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    m.extend_from_slice(&NLM_F_REQUEST.to_ne_bytes());
    m.extend_from_slice(&[0; 8]); // sequence and port id: one request at a time
    m.push(family as u8);
    m.push(libc::IPPROTO_UDP as u8);
    m.push(1 << (INET_DIAG_SKMEMINFO - 1));
    m.push(0);
    m.extend_from_slice(&u32::MAX.to_ne_bytes()); // any state
    // The id is as the lookup sees an arriving datagram: we are its source.
    m.extend_from_slice(&local.port().to_be_bytes());
    m.extend_from_slice(&peer.port().to_be_bytes());
    m.extend_from_slice(&local_ip);
    m.extend_from_slice(&peer_ip);
    m.extend_from_slice(&0u32.to_ne_bytes()); // any interface
    m.extend_from_slice(&[0xff; 8]); // INET_DIAG_NOCOOKIE
    m
}

fn pad16(v4: &[u8; 4]) -> [u8; 16] {
    let mut a = [0; 16];
    a[..4].copy_from_slice(v4);
    a
}

fn v6_octets(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn malformed(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("sock_diag reply: {what}"),
    )
}

/// The queue in the kernel's reply: `None` for "no such socket" (ENOENT), an error for any
/// other refusal or a reply too short for what it claims.
fn parse_reply(b: &[u8]) -> io::Result<Option<QueueState>> {
    let len = u32_at(b, 0).ok_or_else(|| malformed("no header"))? as usize;
    let kind = u16_at(b, 4).ok_or_else(|| malformed("no header"))?;
    let b = b
        .get(..len)
        .filter(|_| len >= NLMSG_HEADER)
        .ok_or_else(|| malformed("shorter than its length"))?;
    if kind == NLMSG_ERROR {
        let errno = u32_at(b, NLMSG_HEADER).ok_or_else(|| malformed("error without a code"))?;
        return match -(errno as i32) {
            libc::ENOENT => Ok(None),
            e => Err(io::Error::from_raw_os_error(e)),
        };
    }
    if kind != SOCK_DIAG_BY_FAMILY {
        return Err(malformed(&format!("message type {kind}")));
    }
    // The attributes after the socket's fixed part, each 4-byte aligned.
    let mut at = NLMSG_HEADER + REPLY_MSG_LEN;
    while let (Some(attr_len), Some(attr_kind)) = (u16_at(b, at), u16_at(b, at + 2)) {
        let attr_len = attr_len as usize;
        if attr_len < 4 {
            return Err(malformed("attribute shorter than its header"));
        }
        if attr_kind == INET_DIAG_SKMEMINFO {
            let field = |i: usize| {
                u32_at(b, at + 4 + 4 * i)
                    .filter(|_| 4 + 4 * (i + 1) <= attr_len)
                    .map(u64::from)
                    .ok_or_else(|| malformed("memory info too short"))
            };
            return Ok(Some(QueueState {
                queued: field(MEMINFO_RMEM_ALLOC)?,
                capacity: field(MEMINFO_RCVBUF)?,
                drops: field(MEMINFO_DROPS)?,
            }));
        }
        at += attr_len.next_multiple_of(4);
    }
    Err(malformed("no memory info"))
}

/// What a datagram of `payload` bytes takes in a receiver's queue on Linux (payload,
/// headers, and the buffer's rounding and bookkeeping), rounded up: on loopback, measured
/// on Linux 6.x, 832 bytes for 100, 2,304 for 1,400, 16,640 for 9,000 and 66,339 for
/// 65,507.
pub fn truesize(payload: usize) -> u64 {
    let bytes = if payload < 16_384 {
        (payload + 512).next_power_of_two() + 768
    } else {
        payload + 1024
    };
    bytes as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// The probe finds the socket our datagrams reach on loopback (bound to its address,
    /// or to the wildcard), sees datagrams queue up in it, then drops past its buffer, and
    /// the queue empty again once they are read; a port with no socket and an address of
    /// no interface here have no probe.
    #[test]
    fn the_probe_follows_a_local_receivers_queue_and_drops() {
        for bind in ["127.0.0.1:0", "0.0.0.0:0"] {
            let receiver = UdpSocket::bind(bind).unwrap();
            let port = receiver.local_addr().unwrap().port();
            let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
            sender.connect(("127.0.0.1", port)).unwrap();
            let mut probe = QueueProbe::for_peer(&sender).unwrap().expect(bind);
            let empty = probe.read().unwrap().unwrap();
            assert_eq!((empty.queued, empty.drops), (0, 0), "{bind}");
            assert!(empty.capacity >= 4096, "{empty:?}");
            sender.send(&[7; 1400]).unwrap();
            let one = probe.read().unwrap().unwrap();
            assert!(one.queued > 1400 && one.queued <= truesize(1400), "{one:?}");
            // Past the buffer: the rest are dropped, and counted.
            let sends = 2 * (empty.capacity / 1400 + 1);
            (0..sends).for_each(|_| drop(sender.send(&[7; 1400])));
            let full = probe.read().unwrap().unwrap();
            assert!(
                full.drops > 0 && full.queued >= full.capacity / 2,
                "{full:?}"
            );
            receiver.set_nonblocking(true).unwrap();
            let mut buf = [0; 2048];
            while receiver.recv(&mut buf).is_ok() {}
            let drained = probe.read().unwrap().unwrap();
            assert_eq!(drained.queued, 0);
            assert_eq!(drained.drops, full.drops);
            drop(receiver);
            let deadline = Instant::now() + Duration::from_secs(2);
            while probe.read().unwrap().is_some() && Instant::now() < deadline {}
            assert_eq!(probe.read().unwrap(), None, "the receiver has gone");
        }
        let nobody = UdpSocket::bind("127.0.0.1:0").unwrap();
        let free_port = nobody.local_addr().unwrap().port();
        drop(nobody);
        let sender = UdpSocket::bind("127.0.0.1:0").unwrap();
        sender.connect(("127.0.0.1", free_port)).unwrap();
        assert!(QueueProbe::for_peer(&sender).unwrap().is_none());
    }

    /// Over IPv6 too, and an IPv4 sender reaches a dual-stack socket bound to `[::]`: the
    /// lookup finds the socket the kernel delivers to. (Skipped where the host has no IPv6
    /// loopback.)
    #[test]
    fn the_probe_finds_ipv6_and_dual_stack_receivers() {
        let Ok(receiver) = UdpSocket::bind("[::]:0") else {
            return;
        };
        let port = receiver.local_addr().unwrap().port();
        for peer in ["[::1]", "127.0.0.1"] {
            let local = if peer.starts_with('[') {
                "[::1]:0"
            } else {
                "127.0.0.1:0"
            };
            let sender = UdpSocket::bind(local).unwrap();
            sender.connect(format!("{peer}:{port}")).unwrap();
            let mut probe = QueueProbe::for_peer(&sender).unwrap().expect(peer);
            assert_eq!(probe.read().unwrap().unwrap().queued, 0, "{peer}");
            sender.send(&[1; 100]).unwrap();
            let one = probe.read().unwrap().unwrap();
            assert!(one.queued > 100, "{peer}: {one:?}");
            let mut buf = [0; 200];
            receiver.recv(&mut buf).unwrap();
        }
    }

    /// Only this host's addresses are read: 198.18.0.1 (benchmarking space, on no
    /// interface of a test machine) is another host's, even if a wildcard socket here has
    /// the port its collector listens on.
    #[test]
    fn only_this_hosts_addresses_are_probed() {
        assert!(on_this_host("127.0.0.1".parse().unwrap()));
        assert!(on_this_host("0.0.0.0".parse().unwrap()));
        assert!(!on_this_host("198.18.0.1".parse().unwrap()));
        assert!(!on_this_host("2001:db8::1".parse().unwrap()));
    }

    /// Replies cut short, or naming another message type, are errors and never panics;
    /// "no such socket" is `None`.
    #[test]
    fn malformed_replies_are_errors() {
        assert!(parse_reply(&[]).is_err());
        assert!(parse_reply(&[0; 10]).is_err());
        let mut header = Vec::new();
        header.extend_from_slice(&20u32.to_ne_bytes());
        header.extend_from_slice(&NLMSG_ERROR.to_ne_bytes());
        header.extend_from_slice(&[0; 10]);
        header.extend_from_slice(&(-libc::ENOENT).to_ne_bytes());
        assert_eq!(parse_reply(&header).unwrap(), None);
        header[16..20].copy_from_slice(&(-libc::EPERM).to_ne_bytes());
        assert!(parse_reply(&header).is_err());
        // A socket message with no attributes, and one whose attribute claims too little.
        let mut msg = vec![0; NLMSG_HEADER + REPLY_MSG_LEN];
        let len = msg.len() as u32;
        msg[..4].copy_from_slice(&len.to_ne_bytes());
        msg[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
        assert!(parse_reply(&msg).is_err());
        msg.extend_from_slice(&2u16.to_ne_bytes());
        msg.extend_from_slice(&INET_DIAG_SKMEMINFO.to_ne_bytes());
        let len = msg.len() as u32;
        msg[..4].copy_from_slice(&len.to_ne_bytes());
        assert!(parse_reply(&msg).is_err());
        // Memory info of 8 fields, one short of the drops.
        let n = msg.len();
        msg[n - 4..n - 2].copy_from_slice(&36u16.to_ne_bytes());
        msg.extend_from_slice(&[0; 32]);
        let len = msg.len() as u32;
        msg[..4].copy_from_slice(&len.to_ne_bytes());
        assert!(parse_reply(&msg).is_err());
        // Claiming more than was received.
        msg[..4].copy_from_slice(&(len + 100).to_ne_bytes());
        assert!(parse_reply(&msg).is_err());
    }
}
