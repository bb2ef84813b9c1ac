//! UDP generic segmentation offload (GSO): one send of many equal-size datagrams, which
//! the kernel (or the network card) cuts apart, so that the stack is walked once per send
//! rather than once per datagram. Flow exporters send IPFIX this way.
//!
//! Must never: change how a receiver sees the datagrams (it gets each one on its own, of
//! the size the sender chose).

use crate::live::sys;
use std::io;
use std::net::UdpSocket;

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
