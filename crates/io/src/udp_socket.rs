//! Sending datagrams cheaply: as large as the path to the receiver carries whole (its path
//! MTU, as the kernel knows it), and with UDP generic segmentation offload (GSO), one send
//! of many equal-size datagrams, which the kernel (or the network card) cuts apart, so
//! that the stack is walked once per send rather than once per datagram. Flow exporters
//! send IPFIX this way.
//!
//! Must never: change how a receiver sees the datagrams (it gets each one on its own, of
//! the size the sender chose).

use crate::live::sys;
use std::io;
use std::net::{SocketAddr, UdpSocket};

/// The largest datagram payload that reaches the peer of the connected `socket` in one IP
/// packet: the path MTU the kernel holds for it (the route's MTU, until path MTU discovery
/// learns of a smaller one on the way), less the IP and UDP headers. 65,507 bytes at most
/// (what a UDP datagram can carry); on loopback, whose MTU is 64 KiB, that.
pub fn max_payload(socket: &UdpSocket) -> io::Result<usize> {
    let (level, name, headers) = match socket.peer_addr()? {
        SocketAddr::V4(_) => (libc::IPPROTO_IP, libc::IP_MTU, 20 + 8),
        SocketAddr::V6(_) => (libc::IPPROTO_IPV6, libc::IPV6_MTU, 40 + 8),
    };
    let mtu = sys::getsockopt_int(socket, level, name)?;
    let payload = usize::try_from(mtu).unwrap_or(0).saturating_sub(headers);
    Ok(payload.min(MAX_DATAGRAM))
}

/// The most payload one UDP datagram over IPv4 can carry (65,535 less 20 and 8 bytes of
/// headers).
pub const MAX_DATAGRAM: usize = 65_507;

/// The most datagrams one send may carry (the kernel's `UDP_MAX_SEGMENTS`).
pub const MAX_SEGMENTS: usize = 64;

/// The most payload bytes one send may carry: what one IP packet can hold.
pub const MAX_SEND_BYTES: usize = 65_000;

/// `UDP_SEGMENT` (linux/udp.h), which the libc crate does not name.
const UDP_SEGMENT: i32 = 103;

/// Makes every later send on `socket` of more than `size` bytes go out as datagrams of
/// `size` bytes (the last may be shorter), or turns that off (0); an error where the
/// kernel has no UDP GSO.
pub fn set_segment_size(socket: &UdpSocket, size: u16) -> io::Result<()> {
    sys::setsockopt(socket, libc::SOL_UDP, UDP_SEGMENT, &libc::c_int::from(size))
}

/// Whether `e`, from a send of several segments, says the route cannot segment (its device
/// offloads no checksums): then send one datagram at a time, with the size set to 0.
pub fn cannot_segment(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EIO)
}

/// Asks for `bytes` of receive buffer on `socket` (the kernel doubles what it grants, and
/// caps it at `net.core.rmem_max` unless the process may pass that, as root may); the
/// bytes granted.
pub fn set_receive_buffer(socket: &UdpSocket, bytes: usize) -> io::Result<usize> {
    let want = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SO_RCVBUFFORCE passes rmem_max where the process may; where it may not, the plain
    // option gives what the limit allows.
    if sys::setsockopt(socket, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &want).is_err() {
        sys::setsockopt(socket, libc::SOL_SOCKET, libc::SO_RCVBUF, &want)?;
    }
    let granted = sys::getsockopt_int(socket, libc::SOL_SOCKET, libc::SO_RCVBUF)?;
    Ok(usize::try_from(granted).unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// On loopback, what one packet carries is the interface's MTU less the headers, for
    /// both families; a socket with no peer has no path.
    #[test]
    fn the_largest_payload_follows_the_routes_mtu() {
        let lo_mtu: usize = std::fs::read_to_string("/sys/class/net/lo/mtu")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let v4 = UdpSocket::bind("127.0.0.1:0").unwrap();
        v4.connect("127.0.0.1:9").unwrap();
        assert_eq!(max_payload(&v4).unwrap(), (lo_mtu - 28).min(MAX_DATAGRAM));
        if let Ok(v6) = UdpSocket::bind("[::1]:0") {
            v6.connect("[::1]:9").unwrap();
            assert_eq!(max_payload(&v6).unwrap(), (lo_mtu - 48).min(MAX_DATAGRAM));
        }
        let unconnected = UdpSocket::bind("127.0.0.1:0").unwrap();
        assert!(max_payload(&unconnected).is_err());
    }

    /// One send of three messages and a shorter fourth arrives as four datagrams.
    #[test]
    fn one_send_arrives_as_datagrams_of_the_segment_size() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        set_segment_size(&tx, 100).unwrap();
        let payload: Vec<u8> = (0..350u32).map(|i| (i / 100) as u8).collect();
        assert_eq!(tx.send(&payload).unwrap(), 350);
        let mut buf = [0u8; 1000];
        for (i, len) in [100, 100, 100, 50].into_iter().enumerate() {
            let n = rx.recv(&mut buf).unwrap();
            assert_eq!(n, len, "datagram {i}");
            assert!(buf[..n].iter().all(|&b| b == i as u8), "datagram {i}");
        }
    }
}
