//! The system calls of live ports, each wrapped once with its safety argument.
//!
//! Everything `unsafe` about live ports is here: sockets and their options, interface
//! ioctls, `poll`, and the shared memory of packet rings ([`SharedRing`]). The ring modules
//! above it are safe code that follows the kernel's ownership protocol through this API.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

/// `errno` of the last failed call, as an `io::Error`.
fn last_error() -> io::Error {
    io::Error::last_os_error()
}

/// A new socket of `domain`/`kind`/`protocol`, closed on exec.
pub fn socket(domain: i32, kind: i32, protocol: i32) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes plain integers; a non-negative result is a new descriptor that
    // nothing else owns, so OwnedFd may take it.
    let fd = unsafe { libc::socket(domain, kind | libc::SOCK_CLOEXEC, protocol) };
    if fd < 0 {
        return Err(last_error());
    }
    // SAFETY: see above: `fd` is open and owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Sets a socket option whose value is the plain-data `value`.
pub fn setsockopt<T: Copy>(fd: &impl AsRawFd, level: i32, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: the pointer and length describe `value`, a live `Copy` (plain data) value that
    // the kernel only reads.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            size_of::<T>() as libc::socklen_t,
        )
    };
    if rc < 0 { Err(last_error()) } else { Ok(()) }
}

/// Reads a socket option of plain-data type `T`.
///
/// # Safety
/// `T` must be plain data: integers only, so that all-zero and any bytes the kernel writes
/// are valid values.
unsafe fn getsockopt_plain<T: Copy>(fd: &impl AsRawFd, level: i32, name: i32) -> io::Result<T> {
    // SAFETY: the caller guarantees `T` is plain data, for which all-zero is valid.
    let mut value: T = unsafe { std::mem::zeroed() };
    let mut len = size_of::<T>() as libc::socklen_t;
    // SAFETY: the pointer and length describe `value`, which the kernel writes at most
    // `len` bytes of.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut value as *mut T).cast(),
            &mut len,
        )
    };
    if rc < 0 { Err(last_error()) } else { Ok(value) }
}

/// Reads a socket option whose value is one `int`.
pub fn getsockopt_int(fd: &impl AsRawFd, level: i32, name: i32) -> io::Result<libc::c_int> {
    // SAFETY: c_int is plain data.
    unsafe { getsockopt_plain(fd, level, name) }
}

/// Bytes written to a connected TCP socket that its peer has not acknowledged yet, sent
/// or not (SIOCOUTQ); still answered after the connection was reset.
pub fn unacknowledged_bytes(fd: &impl AsRawFd) -> io::Result<usize> {
    let mut bytes: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ's number) writes one c_int through the pointer, which
    // points at `bytes`, alive for the call.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &mut bytes) };
    if rc < 0 {
        return Err(last_error());
    }
    Ok(usize::try_from(bytes).unwrap_or(0))
}

/// The packet socket's counts since the last call (the kernel resets them on read):
/// packets received and packets dropped because the ring was full.
pub fn packet_statistics(fd: &OwnedFd) -> io::Result<(u32, u32)> {
    // SAFETY: tpacket_stats_v3 is three u32 counters.
    let stats: libc::tpacket_stats_v3 =
        unsafe { getsockopt_plain(fd, libc::SOL_PACKET, libc::PACKET_STATISTICS)? };
    Ok((stats.tp_packets, stats.tp_drops))
}

/// Binds a packet socket to interface `ifindex` for `protocol` (host order; 0 = none).
pub fn bind_packet(fd: &OwnedFd, ifindex: i32, protocol: u16) -> io::Result<()> {
    // SAFETY: sockaddr_ll is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = protocol.to_be();
    addr.sll_ifindex = ifindex;
    // SAFETY: the pointer and length describe `addr`, which the kernel only reads.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if rc < 0 { Err(last_error()) } else { Ok(()) }
}

/// Asks the kernel to send what a transmit ring holds; `wait` blocks until it is sent
/// (bounded by the socket's send timeout).
pub fn kick_send(fd: &OwnedFd, wait: bool) -> io::Result<()> {
    let flags = if wait { 0 } else { libc::MSG_DONTWAIT };
    // SAFETY: a zero-length send with a null buffer is how a mapped ring is flushed; the
    // kernel reads no user buffer.
    let rc = unsafe { libc::send(fd.as_raw_fd(), std::ptr::null(), 0, flags) };
    if rc < 0 {
        let e = last_error();
        if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::ENOBUFS)) {
            return Ok(());
        }
        return Err(e);
    }
    Ok(())
}

/// The most messages [`send_messages`] sends in one system call.
pub const MESSAGES_PER_CALL: usize = 64;

/// Sends frames `first..` of `frames` (frame `i` is `frames.0[ends[i-1]..ends[i]]`), each
/// as one message, in one `sendmmsg` call of at most [`MESSAGES_PER_CALL`], waiting while
/// the socket's buffer is full (bounded by its send timeout): how many went. An error is
/// about frame `first`: none of this call's went.
pub fn send_messages(fd: &OwnedFd, frames: (&[u8], &[usize]), first: usize) -> io::Result<usize> {
    let (bytes, ends) = frames;
    let count = ends.len().saturating_sub(first).min(MESSAGES_PER_CALL);
    // SAFETY: iovec and mmsghdr are plain data; all-zero is a valid value of each.
    let mut iovecs: [libc::iovec; MESSAGES_PER_CALL] = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut messages: [libc::mmsghdr; MESSAGES_PER_CALL] = unsafe { std::mem::zeroed() };
    for (k, (iov, message)) in iovecs.iter_mut().zip(&mut messages).take(count).enumerate() {
        let i = first + k;
        let start = if i == 0 { 0 } else { ends[i - 1] };
        let frame = &bytes[start..ends[i]];
        iov.iov_base = frame.as_ptr().cast_mut().cast();
        iov.iov_len = frame.len();
        message.msg_hdr.msg_iov = iov;
        message.msg_hdr.msg_iovlen = 1;
    }
    // SAFETY: `messages[..count]` each point at one iovec of `iovecs`, which describes a
    // slice of `bytes`; all outlive the call, and the kernel only reads the frames and
    // writes each message's `msg_len`.
    let rc = unsafe {
        libc::sendmmsg(
            fd.as_raw_fd(),
            messages.as_mut_ptr(),
            count as libc::c_uint,
            0,
        )
    };
    usize::try_from(rc).map_err(|_| last_error())
}

/// Sends `bytes` as one message on a socket that has its peer (a netlink socket's is the
/// kernel): how many went.
pub fn send(fd: &OwnedFd, bytes: &[u8]) -> io::Result<usize> {
    // SAFETY: the pointer and length describe `bytes`, which the kernel only reads.
    let rc = unsafe { libc::send(fd.as_raw_fd(), bytes.as_ptr().cast(), bytes.len(), 0) };
    usize::try_from(rc).map_err(|_| last_error())
}

/// Receives one message into `buf` as `flags` say (0: waiting for it): how many bytes it
/// filled (a message longer than `buf` is cut short; with `MSG_TRUNC`, a packet socket
/// says how long it was).
pub fn recv(fd: &OwnedFd, buf: &mut [u8], flags: i32) -> io::Result<usize> {
    // SAFETY: the pointer and length describe `buf`, which the kernel writes at most
    // `buf.len()` bytes of.
    let rc = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) };
    usize::try_from(rc).map_err(|_| last_error())
}

/// Waits until one of `fds` is readable or `timeout_ms` passes; returns whether any is.
pub fn poll_readable(fds: &[RawFd], timeout_ms: i32) -> io::Result<bool> {
    let mut polls: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: the pointer and count describe `polls`, which the kernel writes `revents` of.
    let rc = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, timeout_ms) };
    if rc < 0 {
        let e = last_error();
        return if e.kind() == io::ErrorKind::Interrupted {
            Ok(false)
        } else {
            Err(e)
        };
    }
    Ok(rc > 0)
}

/// The index of interface `name` in this network namespace, or `None` if there is none.
pub fn interface_index(name: &str) -> Option<i32> {
    let cname = CString::new(name).ok()?;
    // SAFETY: `cname` is a valid NUL-terminated string for the duration of the call.
    let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
    (index != 0).then_some(index as i32)
}

/// An `ifreq` naming interface `name`.
fn ifreq(name: &str) -> io::Result<libc::ifreq> {
    // SAFETY: ifreq is plain data; all-zero is a valid value.
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= req.ifr_name.len() || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "interface names are at most 15 bytes",
        ));
    }
    for (dst, src) in req.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    Ok(req)
}

/// The MTU of interface `name`.
pub fn interface_mtu(name: &str) -> io::Result<u32> {
    let fd = socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    let mut req = ifreq(name)?;
    // SAFETY: SIOCGIFMTU reads the name in `req` and writes `ifru_mtu`, both inside it.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFMTU, &mut req) };
    if rc < 0 {
        return Err(last_error());
    }
    // SAFETY: SIOCGIFMTU succeeded, so the union holds the MTU.
    Ok(unsafe { req.ifr_ifru.ifru_mtu }.max(0) as u32)
}

/// Runs the ethtool command at the start of `request` (its first 32-bit word, in the
/// host's byte order) on interface `name`; the kernel writes its answer into `request`.
fn ethtool(name: &str, request: &mut [u8]) -> io::Result<()> {
    let fd = socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_data = request.as_mut_ptr().cast();
    // SAFETY: SIOCETHTOOL reads the name in `req` and the command at `ifru_data`, and
    // writes at most the command's own structure there: each caller's `request` is the
    // size of the structure its command takes.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCETHTOOL, &mut req) } < 0 {
        return Err(last_error());
    }
    Ok(())
}

/// The name of the driver of interface `name` (`veth`, `mlx5_core`, ...).
pub fn interface_driver(name: &str) -> io::Result<String> {
    const ETHTOOL_GDRVINFO: u32 = 0x03;
    // `struct ethtool_drvinfo`: the command, then the driver's name in 32 bytes, ...
    let mut info = [0u8; 196];
    info[..4].copy_from_slice(&ETHTOOL_GDRVINFO.to_ne_bytes());
    ethtool(name, &mut info)?;
    let driver = &info[4..36];
    let end = driver.iter().position(|&b| b == 0).unwrap_or(driver.len());
    Ok(String::from_utf8_lossy(&driver[..end]).into_owned())
}

/// Whether interface `name` has TCP segmentation offload (TSO) on.
pub fn interface_tso(name: &str) -> io::Result<bool> {
    const ETHTOOL_GTSO: u32 = 0x1e;
    // `struct ethtool_value`: the command, then the answer.
    let mut value = [0u8; 8];
    value[..4].copy_from_slice(&ETHTOOL_GTSO.to_ne_bytes());
    ethtool(name, &mut value)?;
    Ok(value[4..8] != [0; 4])
}

/// Sets the MTU of interface `name` (tests: loopback down to an Ethernet MTU).
#[cfg(test)]
pub fn set_interface_mtu(name: &str, mtu: u32) -> io::Result<()> {
    let fd = socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_mtu = mtu as libc::c_int;
    // SAFETY: SIOCSIFMTU reads the name and MTU in `req`.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFMTU, &mut req) } < 0 {
        return Err(last_error());
    }
    Ok(())
}

/// The flags of interface `name` (`IFF_UP`, `IFF_LOOPBACK`, ...).
pub fn interface_flags(name: &str) -> io::Result<libc::c_short> {
    let fd = socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    let mut req = ifreq(name)?;
    // SAFETY: SIOCGIFFLAGS reads the name in `req` and writes `ifru_flags`, both inside it.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) } < 0 {
        return Err(last_error());
    }
    // SAFETY: SIOCGIFFLAGS succeeded, so the union holds the flags.
    Ok(unsafe { req.ifr_ifru.ifru_flags })
}

/// Whether interface `name` is up, and brings it up when `bring_up` is set.
pub fn interface_up(name: &str, bring_up: bool) -> io::Result<bool> {
    let flags = interface_flags(name)?;
    let up = flags & libc::IFF_UP as libc::c_short != 0;
    if up || !bring_up {
        return Ok(up);
    }
    let fd = socket(libc::AF_INET, libc::SOCK_DGRAM, 0)?;
    let mut req = ifreq(name)?;
    req.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads the name and flags in `req`.
    if unsafe { libc::ioctl(fd.as_raw_fd(), libc::SIOCSIFFLAGS, &mut req) } < 0 {
        return Err(last_error());
    }
    Ok(true)
}

/// A packet ring shared with the kernel through `mmap`.
///
/// Ownership of each part of the ring passes between the kernel and this process through a
/// 32-bit status word at the start of that part, as the packet-mmap protocol defines it.
/// [`SharedRing::status`] and [`SharedRing::set_status`] are the only accesses that may race
/// with the kernel, and they are atomic. The bytes of a part are read or written only while
/// its status says this process owns it; the ring modules keep that rule.
pub struct SharedRing {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this value; nothing in it is tied to a thread.
unsafe impl Send for SharedRing {}

impl SharedRing {
    /// Maps `len` bytes of the ring configured on `fd`.
    pub fn map(fd: &OwnedFd, len: usize) -> io::Result<SharedRing> {
        Self::map_at(Some(fd), len, 0)
    }

    /// Maps `len` bytes at page offset `offset` of `fd` (the kernel's selector of which
    /// ring), or anonymous zeroed memory without `fd` (an AF_XDP packet area).
    pub fn map_at(fd: Option<&OwnedFd>, len: usize, offset: u64) -> io::Result<SharedRing> {
        let (flags, raw) = match fd {
            Some(fd) => (libc::MAP_SHARED, fd.as_raw_fd()),
            None => (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1),
        };
        // SAFETY: a fresh mapping, not aliased by any Rust value; for a socket the kernel
        // checks `len` and `offset` against the ring it configured.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                raw,
                offset as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(last_error());
        }
        Ok(SharedRing {
            ptr: ptr.cast(),
            len,
        })
    }

    /// The start address, for registering the area with the kernel.
    pub fn address(&self) -> u64 {
        self.ptr as u64
    }

    fn word(&self, offset: usize) -> &AtomicU32 {
        assert!(
            offset.is_multiple_of(4) && offset + 4 <= self.len,
            "ring status word out of bounds"
        );
        // SAFETY: in bounds and 4-byte aligned (mmap is page aligned), checked above; an
        // AtomicU32 has the layout of a u32, and the kernel accesses the word atomically too.
        unsafe { &*self.ptr.add(offset).cast::<AtomicU32>() }
    }

    /// The status word at `offset`, read with acquire order: if it hands the part to this
    /// process, everything the kernel wrote into the part before is visible.
    pub fn status(&self, offset: usize) -> u32 {
        self.word(offset).load(Ordering::Acquire)
    }

    /// Writes the status word at `offset` with release order, handing the part over after
    /// every write this process made into it.
    pub fn set_status(&self, offset: usize, value: u32) {
        self.word(offset).store(value, Ordering::Release)
    }

    /// The bytes `[offset, offset + len)`, or `None` if out of bounds. The caller must own
    /// that range by the ring protocol (its status word says so) for as long as it is used.
    pub fn bytes(&self, offset: usize, len: usize) -> Option<&[u8]> {
        if offset.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: in bounds (checked); the kernel does not write a part that this process
        // owns, so the bytes do not change while the shared borrow of `self` lives.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.add(offset), len) })
    }

    /// The bytes `[offset, offset + len)` for writing, or `None` if out of bounds. As for
    /// [`SharedRing::bytes`], the caller must own the range.
    pub fn bytes_mut(&mut self, offset: usize, len: usize) -> Option<&mut [u8]> {
        if offset.checked_add(len)? > self.len {
            return None;
        }
        // SAFETY: in bounds (checked); `&mut self` excludes other Rust borrows, and the
        // kernel does not read a part until its status hands it over.
        Some(unsafe { std::slice::from_raw_parts_mut(self.ptr.add(offset), len) })
    }
}

impl Drop for SharedRing {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly the mapping made in `map`, unmapped once, here.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// `bpf(2)` with an attribute block; returns the new descriptor (or 0) on success.
fn bpf(command: i32, attr: &mut [u64; 16]) -> io::Result<i64> {
    // SAFETY: `attr` is a 128-byte, 8-aligned block laid out as `union bpf_attr` for
    // `command`; any pointers in it were set by the callers below to live buffers.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attr.as_mut_ptr(),
            size_of::<[u64; 16]>(),
        )
    };
    if rc < 0 { Err(last_error()) } else { Ok(rc) }
}

fn put_u32(attr: &mut [u64; 16], byte: usize, value: u32) {
    let word = &mut attr[byte / 8];
    let shift = (byte % 8) * 8;
    *word = (*word & !(0xffff_ffffu64 << shift)) | (u64::from(value) << shift);
}

/// Takes ownership of a descriptor `bpf(2)` returned.
fn owned(fd: i64) -> OwnedFd {
    // SAFETY: the kernel just returned this descriptor; nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd as RawFd) }
}

/// A new XSKMAP (queue index -> AF_XDP socket) of `entries` entries.
pub fn bpf_xsk_map(entries: u32) -> io::Result<OwnedFd> {
    const BPF_MAP_CREATE: i32 = 0;
    const BPF_MAP_TYPE_XSKMAP: u32 = 17;
    let mut attr = [0u64; 16];
    put_u32(&mut attr, 0, BPF_MAP_TYPE_XSKMAP);
    put_u32(&mut attr, 4, 4); // key: u32 queue index
    put_u32(&mut attr, 8, 4); // value: u32 socket descriptor
    put_u32(&mut attr, 12, entries);
    bpf(BPF_MAP_CREATE, &mut attr).map(owned)
}

/// Sets `map[key] = value` for a map of u32 keys and values.
pub fn bpf_map_set(map: &OwnedFd, key: u32, value: u32) -> io::Result<()> {
    const BPF_MAP_UPDATE_ELEM: i32 = 2;
    let mut attr = [0u64; 16];
    put_u32(&mut attr, 0, map.as_raw_fd() as u32);
    attr[1] = (&key as *const u32) as u64;
    attr[2] = (&value as *const u32) as u64;
    bpf(BPF_MAP_UPDATE_ELEM, &mut attr).map(|_| ())
}

/// Loads an XDP program of raw instructions; on refusal, the verifier's log is the error.
pub fn bpf_load_xdp(instructions: &[u64]) -> io::Result<OwnedFd> {
    const BPF_PROG_LOAD: i32 = 5;
    const BPF_PROG_TYPE_XDP: u32 = 6;
    let license = c"Dual MIT/GPL";
    let mut log = vec![0u8; 16 << 10];
    let mut attr = [0u64; 16];
    put_u32(&mut attr, 0, BPF_PROG_TYPE_XDP);
    put_u32(&mut attr, 4, instructions.len() as u32);
    attr[1] = instructions.as_ptr() as u64;
    attr[2] = license.as_ptr() as u64;
    put_u32(&mut attr, 24, 1); // log level
    put_u32(&mut attr, 28, log.len() as u32);
    attr[4] = log.as_mut_ptr() as u64;
    bpf(BPF_PROG_LOAD, &mut attr).map(owned).map_err(|e| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        io::Error::new(
            e.kind(),
            format!("{e}: {}", String::from_utf8_lossy(&log[..end]).trim()),
        )
    })
}

/// Attaches an XDP program to interface `ifindex` through a BPF link: the program stays
/// attached exactly as long as the returned descriptor is open, so it goes away with the
/// process, however that ends.
pub fn bpf_attach_xdp(program: &OwnedFd, ifindex: i32, native: bool) -> io::Result<OwnedFd> {
    const BPF_LINK_CREATE: i32 = 28;
    const BPF_XDP: u32 = 37;
    const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
    const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
    let mut attr = [0u64; 16];
    put_u32(&mut attr, 0, program.as_raw_fd() as u32);
    put_u32(&mut attr, 4, ifindex as u32);
    put_u32(&mut attr, 8, BPF_XDP);
    put_u32(
        &mut attr,
        12,
        if native {
            XDP_FLAGS_DRV_MODE
        } else {
            XDP_FLAGS_SKB_MODE
        },
    );
    bpf(BPF_LINK_CREATE, &mut attr).map(owned)
}

/// The ring offsets of an AF_XDP socket.
pub fn xdp_mmap_offsets(fd: &OwnedFd) -> io::Result<libc::xdp_mmap_offsets> {
    // SAFETY: xdp_mmap_offsets is four sets of u64 offsets.
    unsafe { getsockopt_plain(fd, libc::SOL_XDP, libc::XDP_MMAP_OFFSETS) }
}

/// Binds an AF_XDP socket to queue `queue` of interface `ifindex`.
pub fn bind_xdp(fd: &OwnedFd, ifindex: i32, queue: u32, flags: u16) -> io::Result<()> {
    // SAFETY: sockaddr_xdp is plain data; all-zero is a valid value.
    let mut addr: libc::sockaddr_xdp = unsafe { std::mem::zeroed() };
    addr.sxdp_family = libc::AF_XDP as u16;
    addr.sxdp_flags = flags;
    addr.sxdp_ifindex = ifindex as u32;
    addr.sxdp_queue_id = queue;
    // SAFETY: the pointer and length describe `addr`, which the kernel only reads.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_xdp).cast(),
            size_of::<libc::sockaddr_xdp>() as libc::socklen_t,
        )
    };
    if rc < 0 { Err(last_error()) } else { Ok(()) }
}

/// Wakes the kernel to refill an AF_XDP socket's receive side (a zero-length receive).
pub fn kick_receive(fd: &OwnedFd) {
    // SAFETY: a zero-length, non-blocking receive with a null buffer reads no user memory.
    unsafe {
        libc::recvfrom(
            fd.as_raw_fd(),
            std::ptr::null_mut(),
            0,
            libc::MSG_DONTWAIT,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
        );
    }
}

/// Moves the calling thread into a new, empty network namespace (tests: a private loopback
/// to send real packets on without touching the host's interfaces).
#[cfg(test)]
pub fn enter_new_network_namespace() -> io::Result<()> {
    // SAFETY: unshare(2) with CLONE_NEWNET changes only this thread's network namespace.
    if unsafe { libc::unshare(libc::CLONE_NEWNET) } < 0 {
        return Err(last_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::io::{Read, Write};

    /// Bytes a peer has not read stay unacknowledged only while its window is shut; what
    /// it acknowledged leaves the count, and an aborted connection's peer sees a reset
    /// after the bytes it had taken.
    #[test]
    fn unacknowledged_bytes_follow_the_peer_and_an_abort_resets() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut sender = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut peer, _) = listener.accept().unwrap();
        sender.write_all(&[7; 1000]).unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while unacknowledged_bytes(&sender).unwrap() > 0 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert_eq!(
            unacknowledged_bytes(&sender).unwrap(),
            0,
            "loopback acknowledges"
        );
        crate::tcp_abort_on_close(&sender).unwrap();
        drop(sender);
        let mut got = Vec::new();
        let end = peer.read_to_end(&mut got);
        assert_eq!(got.len(), 1000);
        assert_eq!(
            end.map_err(|e| e.kind()),
            Err(io::ErrorKind::ConnectionReset)
        );
    }
}
