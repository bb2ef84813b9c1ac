//! AF_PACKET ports on memory-mapped rings: TPACKET_V3 to receive, TPACKET_V2 to transmit.
//!
//! Receive: the kernel fills fixed-size blocks with packets and hands a whole block over by
//! its status word; [`PacketRx`] copies the packets into a burst and gives the block back.
//! Several workers share an interface through a `PACKET_FANOUT` group in hash mode: the
//! kernel's flow hash is symmetric, so both directions of a flow reach the same worker.
//!
//! Transmit: [`PacketTx`] writes frames into free slots of a mapped ring, marks them for
//! sending, and kicks the kernel once per burst (one system call per burst, not per packet).
//!
//! Each socket is bound to one interface, so nothing from other interfaces is seen, and the
//! receive socket ignores what this host sends (`PACKET_IGNORE_OUTGOING`), so the switch
//! never receives its own output; a monitor ([`RingConfig::outgoing`]) receives both.

use super::steer;
use super::sys::{self, SharedRing};
use super::{Interface, LiveError, RingConfig};
use stateplane_runtime::Steering;
use stateplane_runtime::port::{LiveQueue, PortCounters};
use stateplane_runtime::{Burst, MAX_FRAME, PortId};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

const ETH_P_ALL: u16 = 0x0003;
const TPACKET_V2: i32 = 1;
const TPACKET_V3: i32 = 2;

/// Offsets in `struct tpacket_block_desc` (the block header of a V3 ring).
mod block {
    pub const STATUS: usize = 8;
    pub const NUM_PKTS: usize = 12;
    pub const FIRST_PKT: usize = 16;
}

/// Offsets in `struct tpacket3_hdr` (each received packet's header).
mod v3 {
    pub const NEXT_OFFSET: usize = 0;
    pub const SEC: usize = 4;
    pub const NSEC: usize = 8;
    pub const SNAPLEN: usize = 12;
    pub const LEN: usize = 16;
    pub const STATUS: usize = 20;
    pub const MAC: usize = 24;
    pub const VLAN_TCI: usize = 32;
    pub const VLAN_TPID: usize = 36;
    pub const SIZE: usize = 48;
}

/// Offsets in `struct tpacket2_hdr` (each transmit slot's header); frame data follows it at
/// `TPACKET2_HDRLEN - sizeof(sockaddr_ll)`.
mod v2 {
    pub const LEN: usize = 4;
    pub const SNAPLEN: usize = 8;
    pub const DATA: usize = 32;
}

fn read_u32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

fn read_u16(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u16::from_ne_bytes)
}

/// A packet socket bound to `iface`, with the errors a user can act on.
fn packet_socket(iface: &Interface) -> Result<OwnedFd, LiveError> {
    // Protocol 0 until bound: an unbound ETH_P_ALL socket would see every interface.
    sys::socket(libc::AF_PACKET, libc::SOCK_RAW, 0)
        .map_err(|e| LiveError::from_io(iface, "opening an AF_PACKET socket", e))
}

fn set_option<T: Copy>(
    fd: &OwnedFd,
    iface: &Interface,
    what: &'static str,
    name: i32,
    value: &T,
) -> Result<(), LiveError> {
    sys::setsockopt(fd, libc::SOL_PACKET, name, value)
        .map_err(|e| LiveError::from_io(iface, what, e))
}

/// One worker's receive queue on an interface: a TPACKET_V3 ring in a fanout group.
pub struct PacketRx {
    name: String,
    fd: OwnedFd,
    ring: SharedRing,
    block_size: usize,
    blocks: usize,
    /// The block being read, and how far: packets left in it and the next one's offset.
    block: usize,
    in_block: bool,
    left: u32,
    next: usize,
    counters: PortCounters,
    /// Room to put a VLAN tag back into a frame the kernel took it out of.
    scratch: Vec<u8>,
}

impl PacketRx {
    /// Opens a receive ring on `iface`; with `fanout`, joins that fanout group, which
    /// spreads packets as its steering says (every member of one group must be opened on
    /// the same interface, with the same steering).
    pub fn open(
        iface: &Interface,
        fanout: Option<(u16, Steering)>,
        rings: &RingConfig,
    ) -> Result<PacketRx, LiveError> {
        let fd = packet_socket(iface)?;
        set_option(
            &fd,
            iface,
            "choosing TPACKET_V3",
            libc::PACKET_VERSION,
            &TPACKET_V3,
        )?;
        let block_size = rings.rx_block_bytes;
        let frame_size = 2048u32;
        let req = libc::tpacket_req3 {
            tp_block_size: block_size as u32,
            tp_block_nr: rings.rx_blocks as u32,
            tp_frame_size: frame_size,
            tp_frame_nr: rings.rx_bytes() as u32 / frame_size,
            tp_retire_blk_tov: rings.rx_block_timeout_ms,
            tp_sizeof_priv: 0,
            tp_feature_req_word: 0,
        };
        set_option(
            &fd,
            iface,
            "setting up the receive ring",
            libc::PACKET_RX_RING,
            &req,
        )?;
        let ring = SharedRing::map(&fd, rings.rx_bytes())
            .map_err(|e| LiveError::from_io(iface, "mapping the receive ring", e))?;
        // A loopback device receives all it sends: the outgoing copy would count each
        // packet twice (libpcap drops it too).
        let outgoing = rings.outgoing && !iface.loopback;
        if !outgoing {
            set_option(
                &fd,
                iface,
                "ignoring outgoing packets",
                libc::PACKET_IGNORE_OUTGOING,
                &1i32,
            )?;
        }
        sys::bind_packet(&fd, iface.index, ETH_P_ALL)
            .map_err(|e| LiveError::from_io(iface, "binding to the interface", e))?;
        if rings.promiscuous {
            let mreq = libc::packet_mreq {
                mr_ifindex: iface.index,
                mr_type: libc::PACKET_MR_PROMISC as u16,
                mr_alen: 0,
                mr_address: [0; 8],
            };
            set_option(
                &fd,
                iface,
                "entering promiscuous mode",
                libc::PACKET_ADD_MEMBERSHIP,
                &mreq,
            )?;
        }
        if let Some((group, steering)) = fanout {
            let program = steer::program(steering);
            let kind = match program {
                Some(_) => libc::PACKET_FANOUT_CBPF,
                None => libc::PACKET_FANOUT_HASH,
            };
            // A fanout group ignores outgoing packets only by its own flag, not by the socket option.
            let mut mode = kind | libc::PACKET_FANOUT_FLAG_DEFRAG;
            if !outgoing {
                mode |= libc::PACKET_FANOUT_FLAG_IGNORE_OUTGOING;
            }
            let arg: i32 = i32::from(group) | ((mode as i32) << 16);
            set_option(
                &fd,
                iface,
                "joining the fanout group",
                libc::PACKET_FANOUT,
                &arg,
            )?;
            if let Some(program) = program {
                // The group's program: each member sets the same one. Until the first has,
                // the kernel sends every packet to member 0.
                let code = libc::sock_fprog {
                    len: program.len() as u16,
                    filter: program.as_ptr().cast_mut(),
                };
                set_option(
                    &fd,
                    iface,
                    "setting the fanout group's steering program",
                    libc::PACKET_FANOUT_DATA,
                    &code,
                )?;
            }
        }
        Ok(PacketRx {
            name: iface.name.clone(),
            fd,
            ring,
            block_size,
            blocks: rings.rx_blocks,
            block: 0,
            in_block: false,
            left: 0,
            next: 0,
            counters: PortCounters::default(),
            scratch: Vec::with_capacity(MAX_FRAME),
        })
    }

    /// Gives the current block back to the kernel and moves to the next.
    fn release_block(&mut self) {
        self.ring
            .set_status(self.block * self.block_size + block::STATUS, 0);
        self.block = (self.block + 1) % self.blocks;
        self.in_block = false;
        self.left = 0;
    }

    /// Opens the next block if the kernel has handed it over.
    fn open_block(&mut self) -> bool {
        let base = self.block * self.block_size;
        if self.ring.status(base + block::STATUS) & libc::TP_STATUS_USER == 0 {
            return false;
        }
        let Some(header) = self.ring.bytes(base, 24) else {
            return false;
        };
        self.left = read_u32(header, block::NUM_PKTS);
        self.next = base + read_u32(header, block::FIRST_PKT) as usize;
        self.in_block = true;
        true
    }
}

impl PacketRx {
    /// Moves waiting packets into `burst` as arriving on `port` until the burst is full or
    /// none wait; never blocks. Returns how many it moved.
    pub fn recv(&mut self, burst: &mut Burst, port: PortId) -> usize {
        let mut taken = 0;
        loop {
            if self.in_block && self.left == 0 {
                self.release_block();
            }
            if !self.in_block && !self.open_block() {
                return taken;
            }
            if self.left == 0 {
                continue;
            }
            let block_end = (self.block + 1) * self.block_size;
            let Some(hdr) = self
                .ring
                .bytes(self.next, v3::SIZE)
                .filter(|_| self.next + v3::SIZE <= block_end)
            else {
                // A header outside its block would be a kernel bug; give the block back
                // rather than read out of it.
                self.counters.rx_errors += u64::from(self.left);
                self.left = 0;
                continue;
            };
            let snaplen = read_u32(hdr, v3::SNAPLEN) as usize;
            let wire_len = read_u32(hdr, v3::LEN);
            let status = read_u32(hdr, v3::STATUS);
            let ts_ns = u64::from(read_u32(hdr, v3::SEC)) * 1_000_000_000
                + u64::from(read_u32(hdr, v3::NSEC));
            let mac = self.next + usize::from(read_u16(hdr, v3::MAC));
            let next_offset = read_u32(hdr, v3::NEXT_OFFSET) as usize;
            let vlan = (status & libc::TP_STATUS_VLAN_VALID != 0).then(|| {
                let tpid = if status & libc::TP_STATUS_VLAN_TPID_VALID != 0 {
                    read_u16(hdr, v3::VLAN_TPID)
                } else {
                    0x8100
                };
                (tpid, read_u32(hdr, v3::VLAN_TCI) as u16)
            });
            let frame_len = snaplen + if vlan.is_some() { 4 } else { 0 };
            if frame_len > MAX_FRAME {
                self.counters.rx_oversize += 1;
            } else if !burst.has_room(frame_len) {
                // Full: this packet opens the next burst.
                return taken;
            } else if let Some(data) = self
                .ring
                .bytes(mac, snaplen)
                .filter(|_| mac + snaplen <= block_end)
            {
                if status & libc::TP_STATUS_CSUMNOTREADY != 0 {
                    self.counters.rx_partial_checksum += 1;
                }
                let orig_len = wire_len + if vlan.is_some() { 4 } else { 0 };
                let pushed = match vlan {
                    None => burst.push(data, orig_len, ts_ns, port, 0),
                    Some((tpid, tci)) if data.len() >= 12 => {
                        // The kernel moved the tag into the header; put it back where it was.
                        self.scratch.clear();
                        self.scratch.extend_from_slice(&data[..12]);
                        self.scratch.extend_from_slice(&tpid.to_be_bytes());
                        self.scratch.extend_from_slice(&tci.to_be_bytes());
                        self.scratch.extend_from_slice(&data[12..]);
                        burst.push(&self.scratch, orig_len, ts_ns, port, 0)
                    }
                    Some(_) => burst.push(data, orig_len, ts_ns, port, 0),
                };
                if pushed {
                    taken += 1;
                    self.counters.rx_packets += 1;
                    self.counters.rx_bytes += frame_len as u64;
                }
            } else {
                self.counters.rx_errors += 1;
            }
            self.left -= 1;
            self.next += next_offset;
        }
    }

    pub fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub fn counters(&mut self) -> PortCounters {
        // The kernel's counts reset when read, so they are added up here.
        if let Ok((_, drops)) = sys::packet_statistics(&self.fd) {
            self.counters.rx_kernel_drops += u64::from(drops);
        }
        self.counters
    }
}

/// One worker's transmit ring on an interface.
pub struct PacketTx {
    fd: OwnedFd,
    ring: SharedRing,
    frame_size: usize,
    frames: usize,
    next: usize,
    pending: usize,
    /// The longest frame the interface takes: its MTU plus the Ethernet header.
    max_len: usize,
    counters: PortCounters,
}

/// The shape of a transmit ring on an interface: frames that hold its largest frame and
/// a VLAN tag, in blocks of at least a page.
struct TxRing {
    frame_size: usize,
    block_size: usize,
    blocks: usize,
    frames: usize,
}

impl TxRing {
    fn of(rings: &RingConfig, iface: &Interface) -> TxRing {
        let max_len = iface.mtu as usize + 14;
        // Room for a VLAN tag, rounded to a power of two the kernel accepts.
        let frame_size = (v2::DATA + max_len + 4).next_power_of_two().max(2048);
        let block_size = frame_size.max(4096);
        let frames = rings.tx_frames.max(block_size / frame_size);
        let blocks = (frames * frame_size).div_ceil(block_size);
        TxRing {
            frame_size,
            block_size,
            blocks,
            frames: blocks * block_size / frame_size,
        }
    }
}

/// What one queue's rings take on `iface`: its receive ring and its transmit ring.
pub fn queue_bytes(rings: &RingConfig, iface: &Interface) -> usize {
    let tx = TxRing::of(rings, iface);
    rings.rx_bytes() + tx.blocks * tx.block_size
}

impl PacketTx {
    pub fn open(iface: &Interface, rings: &RingConfig) -> Result<PacketTx, LiveError> {
        let fd = packet_socket(iface)?;
        set_option(
            &fd,
            iface,
            "choosing TPACKET_V2",
            libc::PACKET_VERSION,
            &TPACKET_V2,
        )?;
        // Skip a frame the kernel refuses (marked WRONG_FORMAT) instead of stalling the ring.
        set_option(&fd, iface, "setting PACKET_LOSS", libc::PACKET_LOSS, &1i32)?;
        let max_len = iface.mtu as usize + 14;
        let TxRing {
            frame_size,
            block_size,
            blocks,
            frames,
        } = TxRing::of(rings, iface);
        let req = libc::tpacket_req {
            tp_block_size: block_size as u32,
            tp_block_nr: blocks as u32,
            tp_frame_size: frame_size as u32,
            tp_frame_nr: frames as u32,
        };
        set_option(
            &fd,
            iface,
            "setting up the transmit ring",
            libc::PACKET_TX_RING,
            &req,
        )?;
        let ring = SharedRing::map(&fd, blocks * block_size)
            .map_err(|e| LiveError::from_io(iface, "mapping the transmit ring", e))?;
        // A blocking kick (ring full) waits at most this long.
        let timeout = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        sys::setsockopt(&fd, libc::SOL_SOCKET, libc::SO_SNDTIMEO, &timeout)
            .map_err(|e| LiveError::from_io(iface, "setting the send timeout", e))?;
        sys::bind_packet(&fd, iface.index, 0)
            .map_err(|e| LiveError::from_io(iface, "binding to the interface", e))?;
        Ok(PacketTx {
            fd,
            ring,
            frame_size,
            frames,
            next: 0,
            pending: 0,
            max_len,
            counters: PortCounters::default(),
        })
    }

    /// Claims the next slot: free, or freed by waiting for the kernel to send.
    fn claim_slot(&mut self) -> Option<usize> {
        let offset = self.next * self.frame_size;
        for attempt in 0..2 {
            let status = self.ring.status(offset);
            if status == libc::TP_STATUS_AVAILABLE {
                return Some(offset);
            }
            if status & libc::TP_STATUS_WRONG_FORMAT != 0 {
                self.counters.tx_errors += 1;
                self.ring.set_status(offset, libc::TP_STATUS_AVAILABLE);
                return Some(offset);
            }
            if attempt == 0 {
                self.pending = 0;
                if let Err(e) = sys::kick_send(&self.fd, true) {
                    log::debug!("sending the transmit ring: {e}");
                }
            }
        }
        None
    }
}

impl PacketTx {
    /// Queues one frame; `false` if it was dropped (counted by reason).
    pub fn send(&mut self, frame: &[u8]) -> bool {
        let tagged = frame.len() >= 14 && matches!(read_be16(frame, 12), 0x8100 | 0x88a8);
        if frame.len() > self.max_len + if tagged { 4 } else { 0 } {
            self.counters.tx_oversize += 1;
            return false;
        }
        let Some(offset) = self.claim_slot() else {
            self.counters.tx_ring_full += 1;
            return false;
        };
        let Some(slot) = self.ring.bytes_mut(offset, self.frame_size) else {
            self.counters.tx_errors += 1;
            return false;
        };
        slot[v2::DATA..v2::DATA + frame.len()].copy_from_slice(frame);
        let len = (frame.len() as u32).to_ne_bytes();
        slot[v2::LEN..v2::LEN + 4].copy_from_slice(&len);
        slot[v2::SNAPLEN..v2::SNAPLEN + 4].copy_from_slice(&len);
        self.ring.set_status(offset, libc::TP_STATUS_SEND_REQUEST);
        self.next = (self.next + 1) % self.frames;
        self.pending += 1;
        self.counters.tx_packets += 1;
        self.counters.tx_bytes += frame.len() as u64;
        if self.pending >= self.frames / 2 {
            self.flush();
        }
        true
    }

    /// Hands everything queued to the kernel.
    pub fn flush(&mut self) {
        if self.pending == 0 {
            return;
        }
        self.pending = 0;
        if let Err(e) = sys::kick_send(&self.fd, false) {
            self.counters.tx_errors += 1;
            log::debug!("sending the transmit ring: {e}");
        }
    }

    pub fn counters(&mut self) -> PortCounters {
        self.counters
    }
}

/// One worker's queue pair on an interface: a receive ring in the fanout group and a
/// transmit ring.
pub struct PacketQueue {
    pub rx: PacketRx,
    pub tx: PacketTx,
}

impl LiveQueue for PacketQueue {
    fn name(&self) -> &str {
        &self.rx.name
    }

    fn recv(&mut self, burst: &mut Burst, port: PortId) -> usize {
        self.rx.recv(burst, port)
    }

    fn send(&mut self, frame: &[u8]) -> bool {
        self.tx.send(frame)
    }

    fn flush(&mut self) {
        self.tx.flush()
    }

    fn fd(&self) -> RawFd {
        self.rx.fd()
    }

    fn counters(&mut self) -> PortCounters {
        let mut c = self.rx.counters();
        c.merge(&self.tx.counters());
        c
    }
}

fn read_be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
