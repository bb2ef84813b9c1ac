//! AF_XDP ports: an XDP program on the interface steers every frame of a queue into an
//! AF_XDP socket, whose rings share a packet area (the UMEM) with the kernel.
//!
//! On a veth the kernel copies each frame into the UMEM (copy mode; veth has no zero-copy),
//! but skips the socket-buffer path of AF_PACKET. The XDP program is attached through a
//! BPF link owned by the port, so it is detached when the port is dropped or the process
//! dies; nothing is left on the interface.
//!
//! Rings (each single-producer, single-consumer, indices free-running u32):
//! * fill: frames this process lends the kernel to receive into;
//! * rx: frames the kernel filled, which [`XdpQueue::recv`] copies into a burst and lends
//!   back through the fill ring at once;
//! * tx: frames to send, from the transmit half of the UMEM;
//! * completion: transmit frames the kernel is done with, back to the free list.

use super::sys::{self, SharedRing};
use super::{Interface, LiveError};
use stateplane_runtime::port::{LiveQueue, PortCounters};
use stateplane_runtime::{Burst, PortId};
use stateplane_wire::offload;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

/// How long a bind waits for a queue the kernel still holds. A socket of a process that
/// was killed is torn down after the process is gone: a switch restarted at once after
/// `kill -9` found its queue busy in 3 tries of 17, each bound 10 ms later.
const BUSY_WAIT: Duration = Duration::from_secs(1);

/// Bytes per UMEM frame (one packet each).
const FRAME: usize = 2048;
/// In copy mode the kernel puts packet data after this much headroom in a frame.
const XDP_PACKET_HEADROOM: usize = 256;
/// Frames per queue: half lent for receiving, half for sending. 1024 x 2 KiB = 2 MiB, so
/// a two-port switch stays well inside an 8 MiB locked-memory limit.
const FRAMES: usize = 1024;
const RING: u32 = 512;

/// What one queue takes: its UMEM (its rings are a few pages more).
pub const QUEUE_BYTES: usize = FRAMES * FRAME;

/// Runs `attempt` until it succeeds, fails otherwise than with EBUSY, or `limit` has
/// passed, waiting 5 ms, then twice as long each time (at most 100 ms) between tries;
/// returns its last result and how long it waited in all.
fn while_busy<T>(
    limit: Duration,
    mut attempt: impl FnMut() -> io::Result<T>,
) -> (io::Result<T>, Duration) {
    let start = Instant::now();
    let mut pause = Duration::from_millis(5);
    let mut waited = Duration::ZERO;
    loop {
        let result = attempt();
        let busy = matches!(&result, Err(e) if e.raw_os_error() == Some(libc::EBUSY));
        if !busy || start.elapsed() >= limit {
            return (result, waited);
        }
        std::thread::sleep(pause.min(limit.saturating_sub(start.elapsed())));
        waited = start.elapsed();
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// The XDP program, in eBPF instructions:
/// `return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);`
/// (frames of a queue with no socket go on to the kernel's stack).
fn redirect_program(map_fd: i32) -> [u64; 6] {
    // An instruction is op:8, dst:4, src:4, offset:16, immediate:32, little-endian.
    fn insn(op: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
        u64::from(op)
            | u64::from(dst | (src << 4)) << 8
            | u64::from(off as u16) << 16
            | u64::from(imm as u32) << 32
    }
    const BPF_PSEUDO_MAP_FD: u8 = 1;
    const XDP_PASS: i32 = 2;
    const BPF_FUNC_REDIRECT_MAP: i32 = 51;
    [
        insn(0x61, 2, 1, 16, 0), // r2 = *(u32 *)(r1 + 16): rx_queue_index
        insn(0x18, 1, BPF_PSEUDO_MAP_FD, 0, map_fd), // r1 = map (64-bit immediate, ...
        insn(0, 0, 0, 0, 0),     // ... second half)
        insn(0xb7, 3, 0, 0, XDP_PASS), // r3 = XDP_PASS (when no socket)
        insn(0x85, 0, 0, 0, BPF_FUNC_REDIRECT_MAP), // call bpf_redirect_map
        insn(0x95, 0, 0, 0, 0),  // exit
    ]
}

/// One of the four rings, mapped.
struct Ring {
    map: SharedRing,
    producer: usize,
    consumer: usize,
    flags: usize,
    desc: usize,
    /// Entry size: 8 (fill, completion: a frame address) or 16 (rx, tx: `xdp_desc`).
    entry: usize,
    mask: u32,
    /// This side's own index, published to the ring when a batch is done.
    cached: u32,
}

impl Ring {
    fn map(
        fd: &OwnedFd,
        offsets: &libc::xdp_ring_offset,
        page: u64,
        entry: usize,
    ) -> std::io::Result<Ring> {
        let desc = offsets.desc as usize;
        let map = SharedRing::map_at(Some(fd), desc + RING as usize * entry, page)?;
        Ok(Ring {
            map,
            producer: offsets.producer as usize,
            consumer: offsets.consumer as usize,
            flags: offsets.flags as usize,
            desc,
            entry,
            mask: RING - 1,
            cached: 0,
        })
    }

    fn slot(&self, index: u32) -> usize {
        self.desc + (index & self.mask) as usize * self.entry
    }

    fn needs_wakeup(&self) -> bool {
        self.map.status(self.flags) & libc::XDP_RING_NEED_WAKEUP != 0
    }

    // Producer side (fill, tx): `cached` is the next index to write.
    fn free_slots(&self) -> u32 {
        RING - self.cached.wrapping_sub(self.map.status(self.consumer))
    }

    fn publish(&self) {
        self.map.set_status(self.producer, self.cached);
    }

    fn put_addr(&mut self, addr: u64) {
        let at = self.slot(self.cached);
        if let Some(b) = self.map.bytes_mut(at, 8) {
            b.copy_from_slice(&addr.to_ne_bytes());
        }
        self.cached = self.cached.wrapping_add(1);
    }

    fn put_desc(&mut self, addr: u64, len: u32) {
        let at = self.slot(self.cached);
        if let Some(b) = self.map.bytes_mut(at, 16) {
            b[..8].copy_from_slice(&addr.to_ne_bytes());
            b[8..12].copy_from_slice(&len.to_ne_bytes());
            b[12..16].copy_from_slice(&0u32.to_ne_bytes());
        }
        self.cached = self.cached.wrapping_add(1);
    }

    // Consumer side (rx, completion): `cached` is the next index to read.
    fn available(&self) -> u32 {
        self.map.status(self.producer).wrapping_sub(self.cached)
    }

    fn release(&self) {
        self.map.set_status(self.consumer, self.cached);
    }

    fn addr_at(&self, index: u32) -> u64 {
        self.map
            .bytes(self.slot(index), 8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_ne_bytes)
    }

    fn desc_at(&self, index: u32) -> (u64, u32) {
        match self.map.bytes(self.slot(index), 16) {
            Some(b) => (
                u64::from_ne_bytes(b[..8].try_into().unwrap_or_default()),
                u32::from_ne_bytes(b[8..12].try_into().unwrap_or_default()),
            ),
            None => (0, 0),
        }
    }
}

/// How the XDP program runs on the interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XdpMode {
    /// In the driver (veth supports it), before any socket buffer is made.
    Native,
    /// In the generic hook, after the socket buffer (any interface).
    Generic,
}

/// The XDP program and its socket map on one interface, shared by its queues.
pub struct XdpAttachment {
    map: OwnedFd,
    _program: OwnedFd,
    _link: OwnedFd,
    pub mode: XdpMode,
}

impl XdpAttachment {
    /// Loads and attaches the redirect program, natively if the driver allows, for
    /// `queues` queues.
    pub fn attach(iface: &Interface, queues: u32) -> Result<XdpAttachment, LiveError> {
        let io = |what, e| LiveError::from_io(iface, what, e);
        let map = sys::bpf_xsk_map(queues).map_err(|e| io("creating the XSKMAP", e))?;
        let program = sys::bpf_load_xdp(&redirect_program(map.as_raw_fd()))
            .map_err(|e| io("loading the XDP program", e))?;
        let (link, mode) = match sys::bpf_attach_xdp(&program, iface.index, true) {
            Ok(link) => (link, XdpMode::Native),
            Err(_) => (
                sys::bpf_attach_xdp(&program, iface.index, false)
                    .map_err(|e| io("attaching the XDP program", e))?,
                XdpMode::Generic,
            ),
        };
        Ok(XdpAttachment {
            map,
            _program: program,
            _link: link,
            mode,
        })
    }
}

/// One worker's AF_XDP socket on queue `queue` of an interface.
pub struct XdpQueue {
    name: String,
    fd: OwnedFd,
    umem: SharedRing,
    fill: Ring,
    completion: Ring,
    rx: Ring,
    tx: Ring,
    /// Transmit frames not in use.
    free: Vec<u64>,
    pending: u32,
    max_len: usize,
    counters: PortCounters,
    /// Keeps the program attached while any queue lives.
    _attachment: std::sync::Arc<XdpAttachment>,
}

impl XdpQueue {
    pub fn open(
        iface: &Interface,
        queue: u32,
        attachment: std::sync::Arc<XdpAttachment>,
    ) -> Result<XdpQueue, LiveError> {
        let io = |what, e| LiveError::from_io(iface, what, e);
        let max_len = iface.max_frame_len();
        if max_len + 4 > FRAME - XDP_PACKET_HEADROOM {
            return Err(LiveError::Io {
                interface: iface.name.clone(),
                what: "checking the MTU for AF_XDP",
                source: std::io::Error::other(format!(
                    "MTU {} does not fit a {FRAME}-byte AF_XDP frame; use io = \"afpacket\"",
                    iface.mtu
                )),
            });
        }
        let fd = sys::socket(libc::AF_XDP, libc::SOCK_RAW, 0)
            .map_err(|e| io("opening an AF_XDP socket", e))?;
        let umem = SharedRing::map_at(None, FRAMES * FRAME, 0)
            .map_err(|e| io("allocating the UMEM", e))?;
        let reg = libc::xdp_umem_reg {
            addr: umem.address(),
            len: (FRAMES * FRAME) as u64,
            chunk_size: FRAME as u32,
            headroom: 0,
            flags: 0,
            tx_metadata_len: 0,
        };
        let xdp = |name, value: &u32, what| {
            sys::setsockopt(&fd, libc::SOL_XDP, name, value).map_err(|e| io(what, e))
        };
        sys::setsockopt(&fd, libc::SOL_XDP, libc::XDP_UMEM_REG, &reg)
            .map_err(|e| io("registering the UMEM (locked memory)", e))?;
        xdp(libc::XDP_UMEM_FILL_RING, &RING, "sizing the fill ring")?;
        xdp(
            libc::XDP_UMEM_COMPLETION_RING,
            &RING,
            "sizing the completion ring",
        )?;
        xdp(libc::XDP_RX_RING, &RING, "sizing the receive ring")?;
        xdp(libc::XDP_TX_RING, &RING, "sizing the transmit ring")?;
        let off = sys::xdp_mmap_offsets(&fd).map_err(|e| io("reading the ring offsets", e))?;
        let map = |o, page, entry, what| Ring::map(&fd, o, page, entry).map_err(|e| io(what, e));
        let mut fill = map(
            &off.fr,
            libc::XDP_UMEM_PGOFF_FILL_RING,
            8,
            "mapping the fill ring",
        )?;
        let completion = map(
            &off.cr,
            libc::XDP_UMEM_PGOFF_COMPLETION_RING,
            8,
            "mapping the completion ring",
        )?;
        let rx = map(
            &off.rx,
            libc::XDP_PGOFF_RX_RING as u64,
            16,
            "mapping the receive ring",
        )?;
        let tx = map(
            &off.tx,
            libc::XDP_PGOFF_TX_RING as u64,
            16,
            "mapping the transmit ring",
        )?;
        // The first half of the frames receive, the second half send.
        for i in 0..FRAMES / 2 {
            fill.put_addr((i * FRAME) as u64);
        }
        fill.publish();
        let free = (FRAMES / 2..FRAMES).map(|i| (i * FRAME) as u64).collect();
        let flags = libc::XDP_COPY | libc::XDP_USE_NEED_WAKEUP;
        let (bound, waited) =
            while_busy(BUSY_WAIT, || sys::bind_xdp(&fd, iface.index, queue, flags));
        let ms = waited.as_millis();
        bound.map_err(|e| {
            let e = if waited.is_zero() {
                e
            } else {
                io::Error::new(
                    e.kind(),
                    format!("{e}, still after {ms} ms of waiting for the kernel to let go of a socket of a process gone"),
                )
            };
            io("binding the AF_XDP socket", e)
        })?;
        if !waited.is_zero() {
            log::info!(
                "{}: queue {queue} was busy (the kernel still tearing down a socket of a process gone); bound after {ms} ms",
                iface.name
            );
        }
        sys::bpf_map_set(&attachment.map, queue, fd.as_raw_fd() as u32)
            .map_err(|e| io("adding the socket to the XSKMAP", e))?;
        Ok(XdpQueue {
            name: iface.name.clone(),
            fd,
            umem,
            fill,
            completion,
            rx,
            tx,
            free,
            pending: 0,
            max_len,
            counters: PortCounters::default(),
            _attachment: attachment,
        })
    }

    /// Takes back the transmit frames the kernel has finished with.
    fn reclaim(&mut self) {
        let n = self.completion.available();
        for i in 0..n {
            let addr = self
                .completion
                .addr_at(self.completion.cached.wrapping_add(i));
            self.free.push(addr);
        }
        self.completion.cached = self.completion.cached.wrapping_add(n);
        self.completion.release();
    }

    /// Publishes the queued descriptors and asks the kernel to send them.
    fn kick_transmit(&mut self) {
        self.tx.publish();
        self.pending = 0;
        if let Err(e) = sys::kick_send(&self.fd, false) {
            self.counters.tx_errors += 1;
            log::debug!("{}: AF_XDP transmit: {e}", self.name);
        }
    }
}

impl LiveQueue for XdpQueue {
    fn name(&self) -> &str {
        &self.name
    }

    fn recv(&mut self, burst: &mut Burst, port: PortId) -> usize {
        let available = self.rx.available();
        let mut taken = 0u32;
        let now = stateplane_runtime::live::wall_clock_ns();
        while taken < available {
            let (addr, len) = self.rx.desc_at(self.rx.cached.wrapping_add(taken));
            let len = len as usize;
            if !burst.has_room(len) {
                break;
            }
            match self.umem.bytes_mut(addr as usize, len) {
                Some(data) => {
                    // AF_XDP does not say which checksums a sending host left partial (a
                    // veth with checksum offload on, its default): recognise and finish them.
                    if offload::finish_partial_checksum(data) {
                        self.counters.rx_partial_checksum += 1;
                    }
                    burst.push(data, len as u32, now, port, 0);
                    self.counters.rx_packets += 1;
                    self.counters.rx_bytes += len as u64;
                }
                None => self.counters.rx_errors += 1,
            }
            // The frame goes straight back to the kernel: its bytes are in the burst now.
            self.fill.put_addr(addr & !(FRAME as u64 - 1));
            taken += 1;
        }
        if taken > 0 {
            self.rx.cached = self.rx.cached.wrapping_add(taken);
            self.rx.release();
            self.fill.publish();
        }
        if self.fill.needs_wakeup() {
            sys::kick_receive(&self.fd);
        }
        taken as usize
    }

    fn send(&mut self, frame: &[u8], segment_size: u16) -> bool {
        // AF_XDP cannot have a large segment cut (nor its partial checksum finished):
        // only an AF_PACKET port receives them, and only one sends them.
        if segment_size > 0 || frame.len() > self.max_len + 4 {
            self.counters.tx_oversize += 1;
            return false;
        }
        if self.free.is_empty() || self.tx.free_slots() == 0 {
            self.kick_transmit();
            self.reclaim();
        }
        if self.tx.free_slots() == 0 {
            self.counters.tx_ring_full += 1;
            return false;
        }
        let Some(addr) = self.free.pop() else {
            self.counters.tx_ring_full += 1;
            return false;
        };
        match self.umem.bytes_mut(addr as usize, frame.len()) {
            Some(dst) => dst.copy_from_slice(frame),
            None => {
                self.counters.tx_errors += 1;
                return false;
            }
        }
        self.tx.put_desc(addr, frame.len() as u32);
        self.pending += 1;
        self.counters.tx_packets += 1;
        self.counters.tx_bytes += frame.len() as u64;
        true
    }

    fn flush(&mut self) {
        if self.pending > 0 {
            // Copy mode sends only inside this system call.
            self.kick_transmit();
        }
        self.reclaim();
    }

    fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn counters(&mut self) -> PortCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn busy() -> io::Error {
        io::Error::from_raw_os_error(libc::EBUSY)
    }

    /// A queue busy for a few tries is bound once free, and the wait is told; one that
    /// stays busy fails after the limit, not before and not long after; any other error
    /// fails at once, waiting nothing.
    #[test]
    fn a_busy_queue_is_waited_for_within_a_bound() {
        let mut tries = 0;
        let (result, waited) = while_busy(BUSY_WAIT, || {
            tries += 1;
            if tries < 4 { Err(busy()) } else { Ok(tries) }
        });
        assert_eq!(result.unwrap(), 4);
        // 5 + 10 + 20 ms of pauses.
        assert!(waited >= Duration::from_millis(35), "{waited:?}");

        let (result, waited) = while_busy(Duration::ZERO, || Ok::<_, io::Error>(1));
        assert_eq!((result.unwrap(), waited), (1, Duration::ZERO));

        let mut tries = 0;
        let limit = Duration::from_millis(300);
        let (result, waited) = while_busy(limit, || {
            tries += 1;
            Err::<(), _>(busy())
        });
        assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::EBUSY));
        assert!(
            waited >= limit && waited < limit + Duration::from_millis(200),
            "{waited:?}"
        );
        // 5, 10, 20, 40, 80, 100, then what is left: a handful of tries, not a spin.
        assert!((6..=9).contains(&tries), "{tries}");

        let mut tries = 0;
        let (result, waited) = while_busy(BUSY_WAIT, || {
            tries += 1;
            Err::<(), _>(io::Error::from_raw_os_error(libc::ENODEV))
        });
        assert_eq!(result.unwrap_err().raw_os_error(), Some(libc::ENODEV));
        assert_eq!((tries, waited), (1, Duration::ZERO));
    }
}
