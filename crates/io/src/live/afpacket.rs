//! AF_PACKET ports: a memory-mapped ring to receive, TPACKET_V2 (a switch) or TPACKET_V3 (a
//! monitor), and batches of messages to transmit.
//!
//! Receive ([`RxHandover`]): a switch's kernel puts each packet in a slot of its own and
//! hands it over at once by the slot's status word, waking a waiting worker; a monitor's
//! packs packets into blocks and hands a whole block over when it is full or timed out.
//! [`PacketRx`] copies the packets into a burst and gives the slot or block back. A frame
//! too large for a switch's slot (a TCP segment its sender left for a device to cut: TSO,
//! GSO, GRO) is queued whole on the socket as well, and read from there in its turn.
//! Several workers share an interface through a `PACKET_FANOUT` group in hash mode: the
//! kernel's flow hash is symmetric, so both directions of a flow reach the same worker.
//!
//! Transmit: [`PacketTx`] gathers the frames a worker sends and hands them to the kernel in
//! one `sendmmsg` per burst (one system call per burst, not per packet), each after a
//! `virtio_net_hdr` that has the kernel cut a large segment into pieces (or hand it whole
//! to a peer that takes it so, as a veth does).
//!
//! Each socket is bound to one interface, so nothing from other interfaces is seen, and the
//! receive socket ignores what this host sends (`PACKET_IGNORE_OUTGOING`), so the switch
//! never receives its own output; a monitor ([`RingConfig::outgoing`]) receives both.

use super::steer;
use super::sys::{self, SharedRing};
use super::{Interface, LiveError, RingConfig, RxHandover};
use stateplane_runtime::Steering;
use stateplane_runtime::port::{LiveQueue, PortCounters};
use stateplane_runtime::{Burst, MAX_FRAME, PortId};
use stateplane_wire::checksum;
use stateplane_wire::offload::{self, Segmentation};
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

/// Where a received packet's header keeps each field: `struct tpacket2_hdr` and
/// `struct tpacket3_hdr` hold the same ones in different places.
struct RxHeaderLayout {
    sec: usize,
    nsec: usize,
    snaplen: usize,
    len: usize,
    status: usize,
    mac: usize,
    vlan_tci: usize,
    vlan_tpid: usize,
    size: usize,
}

/// `struct tpacket3_hdr` (a block's packets).
const V3_HEADER: RxHeaderLayout = RxHeaderLayout {
    sec: 4,
    nsec: 8,
    snaplen: 12,
    len: 16,
    status: 20,
    mac: 24,
    vlan_tci: 32,
    vlan_tpid: 36,
    size: 48,
};
/// Offset of `tp_next_offset` in `struct tpacket3_hdr`.
const V3_NEXT_OFFSET: usize = 0;

/// `struct tpacket2_hdr` (a slot's packet; its status word is at 0).
const V2_HEADER: RxHeaderLayout = RxHeaderLayout {
    sec: 16,
    nsec: 20,
    snaplen: 8,
    len: 4,
    status: 0,
    mac: 12,
    vlan_tci: 24,
    vlan_tpid: 26,
    size: 32,
};

/// Where the kernel puts a received frame's network header in a TPACKET_V2 slot: after the
/// slot's header and address (`TPACKET2_HDRLEN`, 52 bytes) and at least 16 bytes of link
/// header, aligned to 16, and the `virtio_net_hdr` before the frame. A slot holds this and
/// the frame's link header.
const V2_NETWORK_OFFSET: usize = 80 + VNET_HEADER_LEN;

/// `struct virtio_net_hdr`, which the kernel writes just before each frame of a switch's
/// ring and reads before each frame a switch sends (`PACKET_VNET_HDR`), in the host's
/// byte order: what the sender's stack left for a device to do.
const VNET_HEADER_LEN: usize = 10;
mod vnet {
    pub const FLAGS: usize = 0;
    pub const GSO_TYPE: usize = 1;
    pub const HDR_LEN: usize = 2;
    pub const GSO_SIZE: usize = 4;
    pub const CSUM_START: usize = 6;
    pub const CSUM_OFFSET: usize = 8;
    /// The frame's transport checksum is partial: finish it from `CSUM_START`.
    pub const NEEDS_CSUM: u8 = 1;
    /// `GSO_TYPE`: a TCP segment over IPv4 or IPv6 to be cut into pieces of `GSO_SIZE`
    /// payload bytes; with `GSO_ECN`, its first piece alone keeps CWR.
    pub const GSO_TCPV4: u8 = 1;
    pub const GSO_TCPV6: u8 = 4;
    pub const GSO_ECN: u8 = 0x80;
}

/// The socket buffer in which the kernel queues a switch's frames too large for a slot,
/// until the worker reads them (about a hundred segments of 64 KiB). The kernel counts
/// twice what it is asked for (its bookkeeping), so half is asked.
const LARGE_FRAME_BUFFER: usize = 8 << 20;

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

/// The shape of a receive ring on an interface: `blocks` blocks of `block_size` bytes; with
/// [`RxHandover::Frames`], each cut into slots of `frame_size` that hold the interface's
/// largest frame and a VLAN tag.
struct RxRing {
    block_size: usize,
    blocks: usize,
    frame_size: usize,
}

impl RxRing {
    fn of(rings: &RingConfig, iface: &Interface) -> RxRing {
        match rings.rx_handover {
            // The kernel wants a frame size even for blocks; it only checks it.
            RxHandover::Blocks { .. } => RxRing {
                block_size: rings.rx_block_bytes,
                blocks: rings.rx_blocks,
                frame_size: 2048,
            },
            RxHandover::Frames => {
                // Room for a VLAN tag; a power of two, so that whole slots fill each block.
                let frame_size = (V2_NETWORK_OFFSET + iface.max_frame_len() + 4)
                    .next_power_of_two()
                    .max(2048);
                let block_size = rings.rx_block_bytes.max(frame_size);
                RxRing {
                    block_size,
                    blocks: rings.rx_bytes().div_ceil(block_size),
                    frame_size,
                }
            }
        }
    }

    fn bytes(&self) -> usize {
        self.block_size * self.blocks
    }

    fn frames(&self) -> usize {
        self.bytes() / self.frame_size
    }
}

/// How far the reader is in the ring.
enum Cursor {
    /// TPACKET_V2: the slot read next (it is the reader's when its status says so).
    Frames {
        frame_size: usize,
        frames: usize,
        slot: usize,
    },
    /// TPACKET_V3: the block being read, and how far: packets left in it and the next
    /// one's offset.
    Blocks {
        block_size: usize,
        blocks: usize,
        block: usize,
        in_block: bool,
        left: u32,
        next: usize,
    },
}

/// What became of the packet the reader stood at.
enum Taken {
    Pushed,
    /// Counted as dropped (too big, or out of its slot).
    Dropped,
    /// The burst has no room: the packet opens the next burst.
    BurstFull,
}

/// One worker's receive queue on an interface: a TPACKET_V2 or V3 ring, alone or in a
/// fanout group.
pub struct PacketRx {
    name: String,
    mtu: u32,
    /// Each frame comes after a `virtio_net_hdr` (a switch's ring).
    vnet: bool,
    fd: OwnedFd,
    ring: SharedRing,
    cursor: Cursor,
    counters: PortCounters,
    /// Room to put a VLAN tag back into a frame the kernel took it out of.
    scratch: Vec<u8>,
    /// Room for a frame too large for its slot, read whole from the socket after its
    /// `virtio_net_hdr` (a switch's ring; empty otherwise).
    large: Vec<u8>,
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
        let shape = RxRing::of(rings, iface);
        let (block_size, blocks, frame_size) = (shape.block_size, shape.blocks, shape.frame_size);
        let (version, choosing, timeout_ms) = match rings.rx_handover {
            RxHandover::Frames => (TPACKET_V2, "choosing TPACKET_V2", 0),
            RxHandover::Blocks { timeout_ms } => (TPACKET_V3, "choosing TPACKET_V3", timeout_ms),
        };
        set_option(&fd, iface, choosing, libc::PACKET_VERSION, &version)?;
        let vnet = rings.rx_handover == RxHandover::Frames;
        if vnet {
            // A sender's stack may leave a checksum for the device to finish (a veth with
            // checksum offload on, its default); the header says where, and the switch
            // finishes it before the packet goes on.
            set_option(
                &fd,
                iface,
                "asking for virtio-net headers",
                libc::PACKET_VNET_HDR,
                &1i32,
            )?;
            // A frame too large for a slot is queued whole on the socket as well, and its
            // slot says so: a TCP segment its sender left for a device to cut is carried.
            set_option(
                &fd,
                iface,
                "keeping frames larger than a slot whole",
                libc::PACKET_COPY_THRESH,
                &1i32,
            )?;
            let buffer = (LARGE_FRAME_BUFFER / 2) as i32;
            sys::setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &buffer)
                .or_else(|_| sys::setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUF, &buffer))
                .map_err(|e| LiveError::from_io(iface, "sizing the socket's buffer", e))?;
        }
        // TPACKET_V2 reads the first four fields alone (its `tpacket_req`).
        let req = libc::tpacket_req3 {
            tp_block_size: block_size as u32,
            tp_block_nr: blocks as u32,
            tp_frame_size: frame_size as u32,
            tp_frame_nr: shape.frames() as u32,
            tp_retire_blk_tov: timeout_ms,
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
        let cursor = match rings.rx_handover {
            RxHandover::Frames => Cursor::Frames {
                frame_size,
                frames: shape.frames(),
                slot: 0,
            },
            RxHandover::Blocks { .. } => Cursor::Blocks {
                block_size,
                blocks,
                block: 0,
                in_block: false,
                left: 0,
                next: 0,
            },
        };
        let ring = SharedRing::map(&fd, shape.bytes())
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
                let code = filter_program(&program);
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
            mtu: iface.mtu,
            vnet,
            fd,
            ring,
            cursor,
            counters: PortCounters::default(),
            scratch: Vec::with_capacity(MAX_FRAME),
            large: if vnet {
                vec![0; VNET_HEADER_LEN + MAX_FRAME]
            } else {
                Vec::new()
            },
        })
    }

    /// The packet the reader stands at, as the offset of its header and the end of its
    /// slot or block; `None` while the kernel has handed nothing over. Gives back each
    /// block read to the end on the way.
    fn current(&mut self) -> Option<(usize, usize, &'static RxHeaderLayout)> {
        match &mut self.cursor {
            Cursor::Frames {
                frame_size, slot, ..
            } => {
                let at = *slot * *frame_size;
                (self.ring.status(at) & libc::TP_STATUS_USER != 0).then_some((
                    at,
                    at + *frame_size,
                    &V2_HEADER,
                ))
            }
            Cursor::Blocks {
                block_size,
                blocks,
                block,
                in_block,
                left,
                next,
            } => loop {
                let base = *block * *block_size;
                if *in_block && *left == 0 {
                    self.ring.set_status(base + block::STATUS, 0);
                    *block = (*block + 1) % *blocks;
                    *in_block = false;
                    continue;
                }
                if !*in_block {
                    if self.ring.status(base + block::STATUS) & libc::TP_STATUS_USER == 0 {
                        return None;
                    }
                    let header = self.ring.bytes(base, 24)?;
                    *left = read_u32(header, block::NUM_PKTS);
                    *next = base + read_u32(header, block::FIRST_PKT) as usize;
                    *in_block = true;
                    continue;
                }
                return Some((*next, base + *block_size, &V3_HEADER));
            },
        }
    }

    /// The `virtio_net_hdr` before the frame at `mac` in its slot (a switch's ring).
    fn vnet_header(&self, mac: usize) -> Option<[u8; VNET_HEADER_LEN]> {
        (mac.checked_sub(VNET_HEADER_LEN))
            .filter(|_| self.vnet)
            .and_then(|at| self.ring.bytes(at, VNET_HEADER_LEN))
            .and_then(|header| header.try_into().ok())
    }

    /// Finishes, in its slot, the transport checksum of the `len`-byte frame at `mac` if
    /// its `virtio_net_hdr` (`header`) says the sender left it partial. The header's
    /// offsets count the VLAN tag (`tag` bytes) the kernel took out of the frame. `false`
    /// if they lie outside it.
    fn finish_partial_checksum(
        &mut self,
        (mac, len, tag): (usize, usize, usize),
        header: Option<&[u8; VNET_HEADER_LEN]>,
    ) -> bool {
        let Some(header) = header else {
            return true;
        };
        if header[vnet::FLAGS] & vnet::NEEDS_CSUM == 0 {
            return true;
        }
        let start = usize::from(read_u16(header, vnet::CSUM_START));
        let field = start + usize::from(read_u16(header, vnet::CSUM_OFFSET));
        let (Some(start), Some(field)) = (start.checked_sub(tag), field.checked_sub(tag)) else {
            return false;
        };
        (self.ring.bytes_mut(mac, len))
            .is_some_and(|frame| checksum::complete_partial(frame, start, field))
    }

    /// Says once, when the first comes, why a frame above the MTU is dropped and what
    /// makes them stop: a switch carries TCP segments left for a device to cut, but not
    /// other large frames (UDP handed over unsegmented, a sender with a larger MTU), and a
    /// flow whose every large frame is dropped stalls without another word.
    fn warn_oversize(&self, wire_len: u32) {
        let carried = if self.vnet {
            "the switch carries TCP segments left for a device to cut (TSO, GSO, GRO), but not this one"
        } else {
            "a monitor does not take such frames"
        };
        log::warn!(
            "{}: dropped a {wire_len}-byte frame, larger than its MTU ({}) allows; {carried}. The sender has a larger MTU, hands UDP over unsegmented (UDP GSO), or TCP in segments above 64 KiB (BIG TCP): turn segmentation off where the frames come from, e.g. `ethtool -K <the veth's other end> tso off gso off gro off tx off`, keep its segments to 64 KiB (`ip link set <dev> gso_max_size 65536`), or match the MTUs. Further ones are counted (rx_oversize).",
            self.name,
            self.mtu
        );
    }

    /// Counts a frame above the MTU that is not carried, saying why the first time.
    fn drop_oversize(&mut self, wire_len: u32) -> Taken {
        if self.counters.rx_oversize == 0 {
            self.warn_oversize(wire_len);
        }
        self.counters.rx_oversize += 1;
        Taken::Dropped
    }

    /// Takes the whole of a frame whose slot holds only its start: the kernel queued it
    /// on the socket too, in slot order, after its `virtio_net_hdr`. A TCP segment its
    /// sender left for a device to cut goes into the burst whole, to be cut when it is
    /// sent; any other frame that large is dropped as oversize.
    fn take_large(
        &mut self,
        wire_len: u32,
        ts_ns: u64,
        vlan: Option<(u16, u16)>,
        burst: &mut Burst,
        port: PortId,
    ) -> Taken {
        let flags = libc::MSG_DONTWAIT | libc::MSG_TRUNC;
        let len = match sys::recv(&self.fd, &mut self.large, flags) {
            Ok(len) if (VNET_HEADER_LEN..=self.large.len()).contains(&len) => len,
            Ok(_) => return self.drop_oversize(wire_len),
            Err(e) => {
                log::debug!("{}: reading a large frame: {e}", self.name);
                self.counters.rx_errors += 1;
                return Taken::Dropped;
            }
        };
        let (header, frame) = self.large[..len].split_at(VNET_HEADER_LEN);
        let Some(segment_size) = tcp_segment_size(header) else {
            return self.drop_oversize(wire_len);
        };
        let data = with_tag(frame, vlan, &mut self.scratch);
        push_large_segment(&mut self.counters, burst, data, (ts_ns, port, segment_size))
    }

    /// Moves past the packet the reader stands at: gives its slot back, or steps to the
    /// next packet of the block.
    fn advance(&mut self) {
        match &mut self.cursor {
            Cursor::Frames {
                frame_size,
                frames,
                slot,
            } => {
                self.ring
                    .set_status(*slot * *frame_size, libc::TP_STATUS_KERNEL);
                *slot = (*slot + 1) % *frames;
            }
            Cursor::Blocks { left, next, .. } => {
                *left -= 1;
                match self.ring.bytes(*next + V3_NEXT_OFFSET, 4) {
                    Some(word) => *next += read_u32(word, 0) as usize,
                    // A header outside the ring would be a kernel bug; end the block
                    // rather than read out of it.
                    None => *left = 0,
                }
            }
        }
    }

    /// Copies the packet whose header is at `at` (its slot or block ending at `end`) into
    /// `burst`, putting back a VLAN tag the kernel took out.
    fn take(
        &mut self,
        at: usize,
        end: usize,
        layout: &RxHeaderLayout,
        burst: &mut Burst,
        port: PortId,
    ) -> Taken {
        let Some(hdr) = self
            .ring
            .bytes(at, layout.size)
            .filter(|_| at + layout.size <= end)
        else {
            self.counters.rx_errors += 1;
            return Taken::Dropped;
        };
        let snaplen = read_u32(hdr, layout.snaplen) as usize;
        let wire_len = read_u32(hdr, layout.len);
        let status = read_u32(hdr, layout.status);
        let ts_ns = u64::from(read_u32(hdr, layout.sec)) * 1_000_000_000
            + u64::from(read_u32(hdr, layout.nsec));
        let mac = at + usize::from(read_u16(hdr, layout.mac));
        let vlan = (status & libc::TP_STATUS_VLAN_VALID != 0).then(|| {
            let tpid = if status & libc::TP_STATUS_VLAN_TPID_VALID != 0 {
                read_u16(hdr, layout.vlan_tpid)
            } else {
                0x8100
            };
            (tpid, read_u16(hdr, layout.vlan_tci))
        });
        let tag = if vlan.is_some() { 4 } else { 0 };
        let frame_len = snaplen + tag;
        if status & libc::TP_STATUS_COPY != 0 {
            // One larger than any burst holds is read and dropped here: waiting for room
            // for it would stop the port for good.
            let fits = wire_len as usize + tag <= MAX_FRAME;
            if fits && !burst.has_room(wire_len as usize + tag) {
                return Taken::BurstFull;
            }
            return self.take_large(wire_len, ts_ns, vlan, burst, port);
        }
        // A frame cut to its slot is dropped whole rather than forwarded cut. A switch's
        // ring cuts one only when its copy found the socket's buffer full: lost for want
        // of room, as when the ring is full.
        if snaplen < wire_len as usize && self.vnet {
            self.counters.rx_kernel_drops += 1;
            return Taken::Dropped;
        }
        if frame_len > MAX_FRAME || snaplen < wire_len as usize {
            return self.drop_oversize(wire_len);
        }
        if !burst.has_room(frame_len) {
            return Taken::BurstFull;
        }
        if mac + snaplen > end {
            self.counters.rx_errors += 1;
            return Taken::Dropped;
        }
        let header = self.vnet_header(mac);
        if let Some(segment_size) = header.as_ref().and_then(|h| tcp_segment_size(h)) {
            // A large segment small enough for its slot (GRO joins what arrives).
            let Some(data) = self.ring.bytes(mac, snaplen) else {
                self.counters.rx_errors += 1;
                return Taken::Dropped;
            };
            let data = with_tag(data, vlan, &mut self.scratch);
            return push_large_segment(
                &mut self.counters,
                burst,
                data,
                (ts_ns, port, segment_size),
            );
        }
        if status & libc::TP_STATUS_CSUMNOTREADY != 0 {
            self.counters.rx_partial_checksum += 1;
        }
        if !self.finish_partial_checksum((mac, snaplen, tag), header.as_ref()) {
            self.counters.rx_errors += 1;
            return Taken::Dropped;
        }
        let Some(data) = self.ring.bytes(mac, snaplen) else {
            self.counters.rx_errors += 1;
            return Taken::Dropped;
        };
        let orig_len = wire_len + tag as u32;
        if !burst.push(
            with_tag(data, vlan, &mut self.scratch),
            orig_len,
            ts_ns,
            port,
            0,
        ) {
            return Taken::Dropped;
        }
        self.counters.rx_packets += 1;
        self.counters.rx_bytes += frame_len as u64;
        Taken::Pushed
    }
}

/// A `struct sock_fprog` naming `program`, as bytes: the struct has padding after its
/// 16-bit length, which the kernel reads with the rest and which must be initialised.
fn filter_program(program: &[libc::sock_filter]) -> [u8; std::mem::size_of::<libc::sock_fprog>()] {
    let mut code = [0u8; std::mem::size_of::<libc::sock_fprog>()];
    let len = std::mem::offset_of!(libc::sock_fprog, len);
    let filter = std::mem::offset_of!(libc::sock_fprog, filter);
    // A classic BPF program has at most BPF_MAXINSNS (4096) instructions.
    let count = u16::try_from(program.len()).unwrap_or(u16::MAX);
    code[len..len + 2].copy_from_slice(&count.to_ne_bytes());
    let address = program.as_ptr() as usize;
    code[filter..filter + std::mem::size_of::<usize>()].copy_from_slice(&address.to_ne_bytes());
    code
}

/// The piece size of a large TCP segment, if `header` (its `virtio_net_hdr`) says the
/// frame is one.
fn tcp_segment_size(header: &[u8]) -> Option<u16> {
    let kind = header.get(vnet::GSO_TYPE)? & !vnet::GSO_ECN;
    let size = read_u16(header, vnet::GSO_SIZE);
    (matches!(kind, vnet::GSO_TCPV4 | vnet::GSO_TCPV6) && size > 0).then_some(size)
}

/// Pushes the large segment `data` into `burst` as received at `ts_ns` on `port`, to be
/// cut into pieces of `segment_size` when sent, and counts it.
fn push_large_segment(
    counters: &mut PortCounters,
    burst: &mut Burst,
    data: &[u8],
    (ts_ns, port, segment_size): (u64, PortId, u16),
) -> Taken {
    if !burst.push_large_segment(data, ts_ns, port, segment_size) {
        counters.rx_errors += 1;
        return Taken::Dropped;
    }
    counters.rx_packets += 1;
    counters.rx_large_segments += 1;
    counters.rx_bytes += data.len() as u64;
    Taken::Pushed
}

/// `data` with the VLAN tag the kernel took out of it (into the packet's header) put back
/// where it was, in `scratch`; `data` itself when it had none.
fn with_tag<'a>(data: &'a [u8], vlan: Option<(u16, u16)>, scratch: &'a mut Vec<u8>) -> &'a [u8] {
    match vlan {
        Some((tpid, tci)) if data.len() >= 12 => {
            scratch.clear();
            scratch.extend_from_slice(&data[..12]);
            scratch.extend_from_slice(&tpid.to_be_bytes());
            scratch.extend_from_slice(&tci.to_be_bytes());
            scratch.extend_from_slice(&data[12..]);
            scratch
        }
        _ => data,
    }
}

impl PacketRx {
    /// Moves waiting packets into `burst` as arriving on `port` until the burst is full or
    /// none wait; never blocks. Returns how many it moved.
    pub fn recv(&mut self, burst: &mut Burst, port: PortId) -> usize {
        let mut taken = 0;
        while let Some((at, end, layout)) = self.current() {
            match self.take(at, end, layout, burst, port) {
                Taken::BurstFull => break,
                Taken::Pushed => taken += 1,
                Taken::Dropped => {}
            }
            self.advance();
        }
        taken
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

/// One worker's transmit queue on an interface: frames gathered as the worker sends them,
/// each after its `virtio_net_hdr`, handed to the kernel in `sendmmsg` calls of up to
/// [`sys::MESSAGES_PER_CALL`].
///
/// Not a mapped ring: the kernel builds a ring frame's packet on the ring's own pages and
/// marks it zero-copy, so that a packet delivered inside the host (a veth's peer) is
/// copied again into fresh pages (`skb_copy_ubufs`). On the lab's veths that copy and its
/// page allocations took 30% of the switch's core under TCP; a message is copied once, into
/// the packet, as it is sent.
pub struct PacketTx {
    fd: OwnedFd,
    /// The frames gathered since the last flush, each after its `virtio_net_hdr`, back to
    /// back, and where each ends.
    frames: Vec<u8>,
    ends: Vec<usize>,
    /// The longest frame the interface takes: its MTU plus the Ethernet header.
    max_len: usize,
    counters: PortCounters,
}

/// What one queue takes on `iface` at most: its receive ring, a switch's socket buffer
/// for large frames and the room to read one, and the frames its transmit queue gathers
/// (large segments at most).
pub fn queue_bytes(rings: &RingConfig, iface: &Interface) -> usize {
    let large = match rings.rx_handover {
        RxHandover::Frames => LARGE_FRAME_BUFFER + VNET_HEADER_LEN + MAX_FRAME,
        RxHandover::Blocks { .. } => 0,
    };
    let frame = VNET_HEADER_LEN + MAX_FRAME.max(iface.max_frame_len() + 4);
    RxRing::of(rings, iface).bytes() + large + sys::MESSAGES_PER_CALL * frame
}

impl PacketTx {
    pub fn open(iface: &Interface) -> Result<PacketTx, LiveError> {
        let fd = packet_socket(iface)?;
        // A send that waits for room in the socket's buffer waits at most this long.
        let timeout = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        sys::setsockopt(&fd, libc::SOL_SOCKET, libc::SO_SNDTIMEO, &timeout)
            .map_err(|e| LiveError::from_io(iface, "setting the send timeout", e))?;
        // Each frame goes after a header that says what is left to do with it.
        set_option(
            &fd,
            iface,
            "giving virtio-net headers",
            libc::PACKET_VNET_HDR,
            &1i32,
        )?;
        sys::bind_packet(&fd, iface.index, 0)
            .map_err(|e| LiveError::from_io(iface, "binding to the interface", e))?;
        Ok(PacketTx {
            fd,
            frames: Vec::new(),
            ends: Vec::with_capacity(sys::MESSAGES_PER_CALL),
            max_len: iface.max_frame_len(),
            counters: PortCounters::default(),
        })
    }

    /// Queues one frame; `false` if it was dropped (counted by reason). A frame the kernel
    /// refuses when the queue is flushed is counted then.
    pub fn send(&mut self, frame: &[u8]) -> bool {
        self.send_segment(frame, 0)
    }

    /// [`PacketTx::send`] for a frame that may be a large segment (`segment_size` above 0,
    /// [`stateplane_runtime::PacketDesc::segment_size`]): the kernel finishes its checksum
    /// and cuts it into pieces of that size, or hands it whole to a peer that takes it so.
    /// One a program made into something other than TCP over IP cannot be cut: dropped
    /// and counted as oversize.
    pub fn send_segment(&mut self, frame: &[u8], segment_size: u16) -> bool {
        let tagged = frame.len() >= 14 && matches!(read_be16(frame, 12), 0x8100 | 0x88a8);
        if segment_size == 0 && frame.len() > self.max_len + if tagged { 4 } else { 0 } {
            self.counters.tx_oversize += 1;
            return false;
        }
        if self.ends.len() == sys::MESSAGES_PER_CALL {
            self.flush();
        }
        let start = self.frames.len();
        self.frames.extend_from_slice(&[0; VNET_HEADER_LEN]);
        self.frames.extend_from_slice(frame);
        if segment_size > 0 {
            let (header, frame) = self.frames[start..].split_at_mut(VNET_HEADER_LEN);
            let Some(cut) = offload::ready_for_cutting(frame) else {
                self.frames.truncate(start);
                self.counters.tx_oversize += 1;
                return false;
            };
            header.copy_from_slice(&header_for_cutting(&cut, segment_size));
        }
        self.ends.push(self.frames.len());
        true
    }

    /// Hands every gathered frame to the kernel. A frame it refuses is counted by reason
    /// and the rest go on; when its buffer stays full past the send timeout, the frames
    /// left are dropped and counted (`tx_ring_full`) rather than wait again for each.
    pub fn flush(&mut self) {
        let mut next = 0;
        while next < self.ends.len() {
            match sys::send_messages(&self.fd, (&self.frames, &self.ends), next) {
                Ok(0) => {
                    // sendmmsg sends at least one or fails; never seen, never looped on.
                    self.counters.tx_errors += (self.ends.len() - next) as u64;
                    next = self.ends.len();
                }
                Ok(sent) => {
                    let start = if next == 0 { 0 } else { self.ends[next - 1] };
                    let with_headers = self.ends[next + sent - 1] - start;
                    self.counters.tx_packets += sent as u64;
                    self.counters.tx_bytes += (with_headers - sent * VNET_HEADER_LEN) as u64;
                    next += sent.max(1);
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::ENOBUFS)) => {
                    self.counters.tx_ring_full += (self.ends.len() - next) as u64;
                    next = self.ends.len();
                }
                Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => {
                    self.counters.tx_oversize += 1;
                    next += 1;
                }
                Err(e) => {
                    log::debug!("sending on the interface: {e}");
                    self.counters.tx_errors += 1;
                    next += 1;
                }
            }
        }
        self.frames.clear();
        self.ends.clear();
    }

    pub fn counters(&mut self) -> PortCounters {
        self.counters
    }
}

/// One worker's queue pair on an interface: a receive ring in the fanout group and a
/// transmit queue.
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

    fn send(&mut self, frame: &[u8], segment_size: u16) -> bool {
        self.tx.send_segment(frame, segment_size)
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

/// The `virtio_net_hdr` that has the kernel finish a large segment's checksum and cut it
/// into pieces of `segment_size` payload bytes (one that fits in a piece is left whole).
fn header_for_cutting(cut: &Segmentation, segment_size: u16) -> [u8; VNET_HEADER_LEN] {
    let mut header = [0; VNET_HEADER_LEN];
    header[vnet::FLAGS] = vnet::NEEDS_CSUM;
    header[vnet::GSO_TYPE] = match cut.ipv6 {
        false => vnet::GSO_TCPV4,
        true => vnet::GSO_TCPV6,
    } | if cut.cwr { vnet::GSO_ECN } else { 0 };
    let fields = [
        (vnet::HDR_LEN, cut.headers_len),
        (vnet::GSO_SIZE, usize::from(segment_size)),
        (vnet::CSUM_START, cut.transport_start),
        (vnet::CSUM_OFFSET, offload::TCP_CHECKSUM_OFFSET),
    ];
    for (at, value) in fields {
        // Each lies within a frame of at most 64 KiB and some.
        let value = u16::try_from(value).unwrap_or(u16::MAX);
        header[at..at + 2].copy_from_slice(&value.to_ne_bytes());
    }
    header
}

fn read_be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
