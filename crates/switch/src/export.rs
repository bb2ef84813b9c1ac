//! The flow exporter: the thread that takes finished flow records from the workers' flow
//! stages and writes them to every sink (IPFIX over UDP or TCP, IPFIX files, NetFlow v9
//! over UDP, CSV, JSON lines). Offline, workers wait for it when it falls behind (nothing is lost); live, a
//! full queue drops records and counts them.

use crate::SetupResult;
use crate::units::{MessageSize, Pace};
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError, bounded};
use stateplane_flows::FlowRecord;
use stateplane_flows::exporter::{ExportCore, FLUSH_EVERY, Format, Output};
use stateplane_flows::ipfix::{Features, MESSAGE_LEN, TemplateRefresh};
use stateplane_flows::stage::RecordSink;
use stateplane_io::udp_socket as udp;
use std::io::Write;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod file_out;
mod pace;
mod spool;
use file_out::FileOut;
use pace::Spacing;
pub use pace::{CollectorQueue, STALL};
use spool::Spool;

/// Where records go.
#[derive(Clone, Debug)]
pub enum SinkSpec {
    IpfixUdp(SocketAddr),
    Netflow9Udp(SocketAddr),
    IpfixTcp(SocketAddr),
    IpfixFile(PathBuf),
    /// `None`: standard output.
    Csv(Option<PathBuf>),
    Json(Option<PathBuf>),
}

/// How a setting is named in errors: as a flag of `stateplane flows`, or as a key of the
/// `[flows]` section of a run's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Naming {
    Flags,
    Config,
}

impl Naming {
    /// `key` (written as in the config, `max_flows`) as the user gave it.
    pub fn name(self, key: &str) -> String {
        match self {
            Naming::Flags => format!("--{}", key.replace('_', "-")),
            Naming::Config => format!("flows.{key}"),
        }
    }
}

/// How records are written.
#[derive(Clone, Debug)]
pub struct ExportConfig {
    pub naming: Naming,
    pub sinks: Vec<SinkSpec>,
    pub features: Features,
    pub biflow: bool,
    pub domain: u32,
    /// Largest IPFIX message over UDP.
    pub mtu: MessageSize,
    /// How messages to each UDP collector are spaced.
    pub pace: Pace,
    /// Send runs of equal-size UDP messages at once (UDP generic segmentation offload).
    pub gso: bool,
    /// Where TCP collectors' spools go, and the bytes each may hold.
    pub spool: Option<(PathBuf, u64)>,
    /// The program's drop reasons, by which text records name them.
    pub drop_names: &'static [&'static str],
}

/// What the exporter did.
#[derive(Clone, Debug, Default)]
pub struct ExportReport {
    pub records: u64,
    /// Records dropped because the exporter's queue was full (live runs only).
    pub dropped: u64,
    pub sinks: Vec<SinkReport>,
}

impl ExportReport {
    /// The flow records every sink delivered: the fewest any one did (for TCP, those its
    /// collector acknowledged; for UDP, those sent and not known refused).
    pub fn delivered(&self) -> u64 {
        (self.sinks.iter())
            .map(|s| if s.unreachable { 0 } else { s.records })
            .min()
            .unwrap_or(0)
    }
}

/// What the exporter has done so far, published by its thread after each batch and timeout
/// (never by the workers) for the metrics endpoint to read.
#[derive(Debug, Default)]
pub struct ExportProgress {
    /// Flow records taken from the workers.
    pub records: AtomicU64,
    /// Records dropped because the exporter's queue was full (live runs).
    pub dropped: Arc<AtomicU64>,
    sinks: std::sync::Mutex<Vec<SinkProgress>>,
    /// Raised once no sink has a reader left ([`ExportProgress::stop_when_unread`]).
    stop_when_unread: std::sync::OnceLock<Arc<AtomicBool>>,
}

/// One sink's counts so far.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SinkProgress {
    pub name: String,
    /// Messages (or lines) and bytes written, the flow records in them, and messages lost
    /// (for UDP, those the collector's host refused; for TCP, those written while its
    /// connection was down; for a file, those that found no room).
    pub units: u64,
    pub bytes: u64,
    pub records: u64,
    pub lost: u64,
}

impl ExportProgress {
    /// Each sink's counts as last published.
    pub fn sinks(&self) -> Vec<SinkProgress> {
        (self.sinks.lock())
            .map(|s| s.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// Raises `stop` once every sink is standard output whose reader closed the pipe: a
    /// run whose records are its only output (`flows`) then has nothing left to do, and
    /// ends as a shell pipeline's writer does (`flows -I eth0 --csv - | head`). A run that
    /// forwards must not ask for this: its packets still go.
    pub fn stop_when_unread(&self, stop: Arc<AtomicBool>) {
        let _ = self.stop_when_unread.set(stop);
    }

    fn publish(&self, records: u64, sinks: &[Sink]) {
        self.set(records, sinks.iter().map(Sink::so_far));
        if !sinks.is_empty()
            && sinks.iter().all(|s| s.reader_gone)
            && let Some(stop) = self.stop_when_unread.get()
        {
            stop.store(true, Ordering::Relaxed);
        }
    }

    /// The sinks' counts at the end, once each has sent what it held.
    fn publish_final(&self, records: u64, sinks: &[SinkReport]) {
        self.set(
            records,
            sinks.iter().map(|s| SinkProgress {
                name: s.name.clone(),
                units: s.units,
                bytes: s.bytes,
                records: s.records,
                lost: s.lost,
            }),
        );
    }

    fn set(&self, records: u64, sinks: impl Iterator<Item = SinkProgress>) {
        self.records.store(records, Ordering::Relaxed);
        let mut held = self
            .sinks
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.clear();
        held.extend(sinks);
    }
}

/// What one sink did.
#[derive(Clone, Debug, Default)]
pub struct SinkReport {
    pub name: String,
    /// Messages (or lines) and bytes written.
    pub units: u64,
    pub bytes: u64,
    /// Flow records in what was written (for TCP, less those unconfirmed).
    pub records: u64,
    /// Messages lost, and the flow records in them where known: IPFIX over TCP, those
    /// written while the collector's connection was down and those unconfirmed (see
    /// `unconfirmed`); over UDP, those the collector's host refused (ICMP port
    /// unreachable), a lower bound since the kernel keeps one such error at a time.
    pub lost: u64,
    pub records_lost: u64,
    /// IPFIX over TCP: of `lost`, messages written into a connection that ended (or that
    /// the run ended with) before the collector acknowledged them; what it acknowledged
    /// it received, what it received and never read cannot be known.
    pub unconfirmed: u64,
    /// IPFIX over TCP: times the connection was made again.
    pub reconnects: u64,
    /// IPFIX over TCP with a spool: messages that went into it, and what is left in it at
    /// the end (its file, and the flow records waiting there for the next run).
    pub spooled: u64,
    pub spool: Option<(PathBuf, u64)>,
    /// IPFIX over UDP: the collector's host refused the messages when the run ended.
    pub unreachable: bool,
    /// A file sink; and the times its disk took writes again after refusing them (a full
    /// disk).
    pub file: bool,
    pub recovered: u64,
    /// The first error, after which the sink wrote nothing more.
    pub error: Option<String>,
    /// Standard output: its reader closed the pipe (as `head` does once it has its
    /// lines), after which the sink wrote nothing more. Not an error: the reader has
    /// what it wanted.
    pub reader_gone: bool,
    /// IPFIX over UDP paced by its collector's socket queue: what it saw of it.
    pub collector: Option<CollectorQueue>,
}

enum Out {
    /// Each UDP collector is paced on its own.
    Udp(UdpOut),
    Tcp(TcpOut),
    File(FileOut),
    /// Standard output.
    Stream(Box<dyn Write + Send>),
}

/// A TCP collector's connection, made again when it is lost (a collector restarts; RFC
/// 7011 10.4.2 has the exporter re-establish the connection and send its templates
/// again): a second after, then at waits that double up to 30 s while it fails. Of what
/// was written into a connection, what the collector's TCP acknowledged it received; the
/// rest (`in_flight`, from the kernel's count of unacknowledged bytes) is taken back when
/// the connection ends (IPFIX has no acknowledgements of its own: what was received and
/// never read cannot be known). What is taken back, and what is exported while the
/// connection is down, waits in the spool when there is one ([`Spool`]: sent first once
/// the collector is back, in the order it came, and kept for the next run if the
/// collector is not) and is lost and counted when there is none or it is full.
///
/// It numbers the messages of each connection itself (a message's sequence number is the
/// data records sent before it in the connection, RFC 7011 3.1), since a message from the
/// spool goes out in a later connection than it was made for.
struct TcpOut {
    addr: SocketAddr,
    stream: Option<std::io::BufWriter<TcpStream>>,
    /// Bytes handed to the current connection, and the messages not known to be
    /// acknowledged, oldest first.
    written: u64,
    in_flight: std::collections::VecDeque<InFlight>,
    /// Data records sent in the current connection: the next message's sequence number.
    sequence: u32,
    /// The last templates message the encoder made: what a new connection, and a spool
    /// file, begins with.
    templates: Vec<u8>,
    spool: Option<Spool>,
    /// Flow records in messages written and not taken back.
    records: u64,
    /// Messages taken back unacknowledged (spooled, or lost without a spool), messages
    /// that went into the spool, and flow records in lost messages.
    unconfirmed: u64,
    spooled: u64,
    records_lost: u64,
    /// While it is down: when to try again, and the wait after a failed try, which
    /// doubles from a second up to `MAX_BACKOFF` (a try may wait up to a second itself
    /// and holds the exporter meanwhile, so a collector that is gone for good must not
    /// take the exporter's time from the other sinks).
    retry_at: Instant,
    backoff: Duration,
    /// Messages lost (written while it was down without room in a spool, or taken back
    /// without one), and the connections made again.
    lost: u64,
    reconnects: u64,
    /// Why it was last lost, or last failed to connect.
    cause: Option<String>,
}

/// A message written into the connection and not yet known to be acknowledged: where it
/// ends in the connection's bytes, its records, and (with a spool) the message itself, to
/// be spooled if the connection ends first.
struct InFlight {
    end: u64,
    records: u32,
    message: Option<Vec<u8>>,
}

impl TcpOut {
    const RETRY: Duration = Duration::from_secs(1);
    const MAX_BACKOFF: Duration = Duration::from_secs(30);

    /// A collector that takes nothing for this long is taken as lost (else the exporter,
    /// and with it the end of the run, would wait on it for ever).
    const WRITE_TIMEOUT: Duration = Duration::from_secs(10);

    /// How long the end of a run waits for the collector to acknowledge what it was sent.
    const ACK_WAIT: Duration = Duration::from_secs(2);

    /// Bytes of the spool sent at a time while the run goes on (the exporter has other
    /// sinks and new records to see to); the end of a run sends it all.
    const PUMP: usize = 4 << 20;

    fn open(
        addr: &SocketAddr,
        timeout: Duration,
    ) -> std::io::Result<std::io::BufWriter<TcpStream>> {
        let stream = TcpStream::connect_timeout(addr, timeout)?;
        stream.set_write_timeout(Some(Self::WRITE_TIMEOUT))?;
        // Room for two messages of the largest size, so that a message is always copied
        // whole into the buffer: the bytes the kernel took are then what the buffer let go.
        Ok(std::io::BufWriter::with_capacity(2 << 16, stream))
    }

    /// Connects to `addr` at `now`. With a spool, a collector that cannot be reached is
    /// tried again later, what is exported meanwhile spooled; without one, it is an error.
    fn connect(
        addr: &SocketAddr,
        timeout: Duration,
        now: Instant,
        spool: Option<Spool>,
    ) -> std::io::Result<TcpOut> {
        let stream = match Self::open(addr, timeout) {
            Ok(s) => Some(s),
            Err(e) if spool.is_some() => {
                log::warn!("ipfix tcp {addr}: {e}; exported records are spooled until it answers");
                None
            }
            Err(e) => return Err(e),
        };
        let mut tcp = TcpOut {
            addr: *addr,
            cause: stream
                .is_none()
                .then(|| "not reached at the start".to_string()),
            stream,
            retry_at: now + Self::RETRY,
            backoff: Self::RETRY,
            lost: 0,
            reconnects: 0,
            written: 0,
            in_flight: std::collections::VecDeque::new(),
            sequence: 0,
            templates: Vec::new(),
            spool,
            records: 0,
            unconfirmed: 0,
            spooled: 0,
            records_lost: 0,
        };
        tcp.pump(now, Self::PUMP);
        Ok(tcp)
    }

    /// Whether messages wait in the spool (a newer one then waits behind them).
    fn spooling(&self) -> bool {
        self.spool.as_ref().is_some_and(|s| !s.is_empty())
    }

    fn write(&mut self, now: Instant, message: &[u8], records: u32) -> Sent {
        if records == 0 {
            self.templates = message.to_vec();
        }
        if self.stream.is_none() || self.spooling() {
            self.keep(message, records);
            return (0, 0);
        }
        match self.put(message, records) {
            Ok(()) => (1, message.len()),
            Err(e) => {
                self.lose(now, e);
                self.keep(message, records);
                (0, 0)
            }
        }
    }

    /// Keeps a message that cannot be written now in the spool, or counts it lost.
    fn keep(&mut self, message: &[u8], records: u32) {
        let kept = match &mut self.spool {
            // Templates go to a spool only behind data that will use them.
            Some(spool) if records == 0 && spool.is_empty() => return,
            Some(spool) => spool.push(&self.templates, message, records),
            None => false,
        };
        if kept {
            self.spooled += 1;
        } else {
            self.lost += 1;
            self.records_lost += u64::from(records);
        }
    }

    /// Writes one message into the connection, numbered in it.
    fn put(&mut self, message: &[u8], records: u32) -> std::io::Result<()> {
        let Some(stream) = &mut self.stream else {
            return Err(std::io::ErrorKind::NotConnected.into());
        };
        let (Some(head), Some(tail)) = (message.get(..8), message.get(12..)) else {
            return Err(std::io::Error::other("a message shorter than its header"));
        };
        stream.write_all(head)?;
        stream.write_all(&self.sequence.to_be_bytes())?;
        stream.write_all(tail)?;
        self.sequence = self.sequence.wrapping_add(records);
        self.written += message.len() as u64;
        self.in_flight.push_back(InFlight {
            end: self.written,
            records,
            message: self.spool.is_some().then(|| message.to_vec()),
        });
        self.records += u64::from(records);
        Ok(())
    }

    /// Sends up to about `budget` bytes of what waits in the spool, oldest first, while
    /// the connection holds; once it is empty, the current templates follow (the spool's
    /// may be an earlier run's).
    fn pump(&mut self, now: Instant, budget: usize) {
        // A connection that has sent nothing yet needs the spool's templates before its
        // data (sending may resume from the middle of the file).
        if self.written == 0
            && self.spooling()
            && let Some(spool) = &self.spool
        {
            let templates = spool.templates().to_vec();
            if !templates.is_empty()
                && let Err(e) = self.put(&templates, 0)
            {
                self.lose(now, e);
                return;
            }
        }
        let mut sent = 0;
        while self.stream.is_some() && sent < budget {
            let Some(spool) = &mut self.spool else {
                return;
            };
            let (message, records) = match spool.front() {
                Ok(Some(m)) => m,
                Ok(None) => return,
                Err(e) => {
                    log::warn!("ipfix tcp {}: reading the spool: {e}", self.addr);
                    return;
                }
            };
            if let Err(e) = self.put(&message, records) {
                self.lose(now, e);
                return;
            }
            sent += message.len();
            let Some(spool) = &mut self.spool else {
                return;
            };
            if let Err(e) = spool.pop() {
                log::warn!("ipfix tcp {}: the spool: {e}", self.addr);
            }
            if spool.is_empty() && !self.templates.is_empty() {
                let templates = std::mem::take(&mut self.templates);
                if let Err(e) = self.put(&templates, 0) {
                    self.lose(now, e);
                }
                self.templates = templates;
            }
        }
    }

    fn flush(&mut self, now: Instant) {
        self.pump(now, Self::PUMP);
        match self.stream.as_mut().map(std::io::BufWriter::flush) {
            Some(Err(e)) => self.lose(now, e),
            Some(Ok(())) => {
                self.acknowledged();
            }
            None => {}
        }
    }

    /// Forgets the messages the collector has acknowledged: whether any are left.
    fn acknowledged(&mut self) -> bool {
        let Some(stream) = &self.stream else {
            return false;
        };
        let held = stream.buffer().len() as u64;
        // Unreadable (never on a connected socket): nothing is taken as acknowledged.
        let unacked =
            stateplane_io::tcp_unacknowledged(stream.get_ref()).map_or(u64::MAX, |n| n as u64);
        let acked_up_to = self.written.saturating_sub(held).saturating_sub(unacked);
        while (self.in_flight.front()).is_some_and(|m| m.end <= acked_up_to) {
            self.in_flight.pop_front();
        }
        !self.in_flight.is_empty()
    }

    /// The messages not acknowledged when the connection ends are taken back (spooled,
    /// or counted lost), and made so: the connection is aborted when dropped, not drained
    /// to the collector.
    fn take_back_unconfirmed(&mut self) {
        if self.acknowledged()
            && let Some(stream) = &self.stream
            && let Err(e) = stateplane_io::tcp_abort_on_close(stream.get_ref())
        {
            log::warn!("ipfix tcp {}: cannot abort the connection: {e}", self.addr);
        }
        let unconfirmed = std::mem::take(&mut self.in_flight);
        for m in unconfirmed {
            self.unconfirmed += 1;
            self.records -= u64::from(m.records);
            match m.message {
                Some(message) => self.keep(&message, m.records),
                None => {
                    self.lost += 1;
                    self.records_lost += u64::from(m.records);
                }
            }
        }
        self.written = 0;
    }

    /// The end of the run: the spool and what was written go out, and the collector has a
    /// moment (`ACK_WAIT`) to acknowledge it; what it has not is taken back.
    fn settle(&mut self, now: Instant) {
        self.pump(now, usize::MAX);
        self.flush(now);
        let deadline = Instant::now() + Self::ACK_WAIT;
        while self.acknowledged() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if self.stream.is_some() {
            self.take_back_unconfirmed();
        }
        if let Some(spool) = &mut self.spool
            && let Err(e) = spool.close()
        {
            log::warn!("ipfix tcp {}: the spool: {e}", self.addr);
        }
    }

    /// The connection failed at `now` with `e`: it is dropped, and a new one tried later.
    fn lose(&mut self, now: Instant, e: std::io::Error) {
        self.take_back_unconfirmed();
        // A write that timed out says only "Resource temporarily unavailable".
        let cause = match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                "the collector took nothing for a while (a send timed out)".to_string()
            }
            _ => e.to_string(),
        };
        let meanwhile = if self.spool.is_some() {
            "spooled"
        } else {
            "lost"
        };
        log::warn!(
            "ipfix tcp {}: {cause}; connecting again, what is exported until then is {meanwhile}",
            self.addr
        );
        self.stream = None;
        self.cause = Some(cause);
        self.retry_at = now + Self::RETRY;
    }

    /// Connects again if the connection is down and it is time to try (at `now`): whether
    /// it did, so that a new IPFIX stream begins (the templates first, then what waits in
    /// the spool).
    fn reconnect(&mut self, now: Instant) -> bool {
        if self.stream.is_some() || now < self.retry_at {
            return false;
        }
        match Self::open(&self.addr, Self::RETRY) {
            Ok(stream) => {
                self.stream = Some(stream);
                self.sequence = 0;
                self.backoff = Self::RETRY;
                self.reconnects += 1;
                let waiting = self.spool.as_ref().map_or(0, Spool::records);
                log::info!(
                    "ipfix tcp {}: connected again ({} messages lost while it was down, \
                     {waiting} records in the spool to send first)",
                    self.addr,
                    self.lost
                );
                self.pump(now, Self::PUMP);
                true
            }
            Err(e) => {
                self.cause = Some(e.to_string());
                // From the try's end: a try that timed out took its second already. The
                // shell's one reading of the clock, since the try itself takes time.
                self.retry_at = Instant::now().max(now) + self.backoff;
                self.backoff = (self.backoff * 2).min(Self::MAX_BACKOFF);
                false
            }
        }
    }
}

/// One sink's transport, with what it wrote: the shell that writes what the exporter's
/// core ([`ExportCore`]) hands it.
struct Sink {
    name: String,
    out: Out,
    units: u64,
    bytes: u64,
    /// Flow records written to a file or standard output (the network transports count
    /// their own, since they may lose what was written).
    records: u64,
    error: Option<String>,
    /// Standard output's reader closed the pipe (see [`SinkReport::reader_gone`]).
    reader_gone: bool,
}

/// A file sink, or standard output (`None`).
fn file_or_stdout(path: &Option<PathBuf>) -> SetupResult<Out> {
    Ok(match path {
        None => Out::Stream(Box::new(std::io::BufWriter::new(std::io::stdout()))),
        Some(p) => Out::File(FileOut::create(p).map_err(|e| format!("{}: {e}", p.display()))?),
    })
}

impl Sink {
    /// Opens the sink `spec` names at `now`: its transport, and the format its records are
    /// written in.
    fn open(spec: &SinkSpec, c: &ExportConfig, now: Instant) -> SetupResult<(Sink, Format)> {
        let ipfix = |message_len, refresh| Format::Ipfix {
            message_len,
            refresh,
        };
        let (name, out, format) = match spec {
            SinkSpec::IpfixUdp(addr) | SinkSpec::Netflow9Udp(addr) => {
                let (protocol, key) = match spec {
                    SinkSpec::Netflow9Udp(_) => ("netflow9", "netflow9"),
                    _ => ("ipfix", "ipfix"),
                };
                let bind: SocketAddr = if addr.is_ipv4() {
                    "0.0.0.0:0"
                } else {
                    "[::]:0"
                }
                .parse()
                .map_err(|e| format!("{e}"))?;
                let flag = c.naming.name(key);
                let s = UdpSocket::bind(bind).map_err(|e| format!("{flag} {addr}: {e}"))?;
                s.connect(addr).map_err(|e| format!("{flag} {addr}: {e}"))?;
                let size = match c.mtu {
                    MessageSize::Bytes(n) => n,
                    // Fewer, larger datagrams where the path carries them (64 KiB on
                    // loopback): less work per record for the exporter and the collector.
                    MessageSize::Auto => (udp::max_payload(&s).ok())
                        .filter(|n| MESSAGE_LEN.contains(n))
                        .unwrap_or(MessageSize::FALLBACK),
                };
                let udp = UdpOut::new(s, c.pace, c.gso, now);
                let format = match spec {
                    SinkSpec::Netflow9Udp(_) => Format::Netflow9 {
                        message_len: size,
                        refresh: TemplateRefresh::UDP,
                    },
                    _ => ipfix(size, TemplateRefresh::UDP),
                };
                (
                    // The size and the pace show in the summary: what `auto` found.
                    format!(
                        "{protocol} udp {addr} (messages of up to {size} bytes, {})",
                        udp.spacing.describe()
                    ),
                    Out::Udp(udp),
                    format,
                )
            }
            SinkSpec::IpfixTcp(addr) => {
                let spool = match &c.spool {
                    Some((dir, max)) => {
                        let flag = c.naming.name("ipfix_spool");
                        let (spool, found) = Spool::open(dir, addr, *max)
                            .map_err(|e| format!("{flag} {}: {e}", dir.display()))?;
                        if found.records > 0 {
                            log::info!(
                                "ipfix tcp {addr}: {} records of an earlier run wait in {}; \
                                 they go first",
                                found.records,
                                spool.path().display()
                            );
                        }
                        if found.dropped_bytes > 0 {
                            log::warn!(
                                "ipfix tcp {addr}: {} bytes at the end of {} were not a whole \
                                 message (a run that ended mid-write); dropped",
                                found.dropped_bytes,
                                spool.path().display()
                            );
                        }
                        Some(spool)
                    }
                    None => None,
                };
                // Without a spool the first connection must be made: a wrong address is
                // the user's to fix.
                let tcp =
                    TcpOut::connect(addr, Duration::from_secs(5), now, spool).map_err(|e| {
                        let flag = c.naming.name("ipfix_tcp");
                        format!("{flag} {addr}: {e} (is a collector listening there?)")
                    })?;
                (
                    format!("ipfix tcp {addr}"),
                    Out::Tcp(tcp),
                    ipfix(65_535, TemplateRefresh::ONCE),
                )
            }
            SinkSpec::IpfixFile(p) => (
                format!("ipfix file {}", p.display()),
                file_or_stdout(&Some(p.clone()))
                    .map_err(|e| format!("{} {e}", c.naming.name("ipfix_file")))?,
                ipfix(65_535, TemplateRefresh::ONCE),
            ),
            SinkSpec::Csv(p) => (
                "csv".to_string(),
                file_or_stdout(p).map_err(|e| format!("{} {e}", c.naming.name("csv")))?,
                Format::Csv,
            ),
            SinkSpec::Json(p) => (
                "json".to_string(),
                file_or_stdout(p).map_err(|e| format!("{} {e}", c.naming.name("json")))?,
                Format::Json,
            ),
        };
        let sink = Sink {
            name,
            out,
            units: 0,
            bytes: 0,
            records: 0,
            error: None,
            reader_gone: false,
        };
        Ok((sink, format))
    }

    /// Writes bytes (a UDP sink may hold them for its next send), keeping the first error
    /// (a sink that fails stops; the others go on).
    fn write(&mut self, now: Instant, bytes: &[u8], records: u32) {
        if self.error.is_some() || self.reader_gone {
            return;
        }
        let r = match &mut self.out {
            Out::Udp(udp) => udp.push(now, bytes, records),
            Out::Tcp(tcp) => Ok(tcp.write(now, bytes, records)),
            // It counts what reaches the file itself.
            Out::File(f) => {
                f.write(bytes, records);
                Ok((0, 0))
            }
            Out::Stream(w) => {
                let r = w.write_all(bytes).map(|()| (1, bytes.len()));
                if r.is_ok() {
                    self.records += u64::from(records);
                }
                r
            }
        };
        self.count(r);
    }

    /// Sends what a UDP sink holds (at the end of a batch).
    fn flush_udp(&mut self) {
        if let Out::Udp(udp) = &mut self.out
            && self.error.is_none()
        {
            let r = udp.flush();
            self.count(r);
        }
    }

    /// Counts what went out (messages or lines, and bytes), or keeps the first error.
    fn count(&mut self, r: std::io::Result<Sent>) {
        match r {
            Ok((units, bytes)) => {
                self.units += units as u64;
                self.bytes += bytes as u64;
            }
            Err(e) => self.failed(e),
        }
    }

    /// Keeps the first error; standard output's reader going away (`flows --csv - |
    /// head`) is none: the sink stops, as a shell pipeline's writer does, and says so.
    fn failed(&mut self, e: std::io::Error) {
        if self.error.is_some() || self.reader_gone {
            return;
        }
        if matches!(self.out, Out::Stream(_)) && e.kind() == std::io::ErrorKind::BrokenPipe {
            self.reader_gone = true;
        } else {
            self.error = Some(e.to_string());
        }
    }

    /// A TCP collector's lost connection made again when a try is due at `now` (or,
    /// `at_end`, one last try whenever the last was): whether it was, since a new
    /// connection begins a new IPFIX stream.
    fn reconnect(&mut self, now: Instant, at_end: bool) -> bool {
        match &mut self.out {
            Out::Tcp(tcp) => tcp.reconnect(if at_end { now.max(tcp.retry_at) } else { now }),
            _ => false,
        }
    }

    /// Sends what the transport holds: buffered bytes, UDP messages held.
    fn flush(&mut self, now: Instant) {
        self.flush_udp();
        match &mut self.out {
            Out::Tcp(tcp) => tcp.flush(now),
            Out::File(f) => f.flush(),
            Out::Stream(w) => {
                if let Err(e) = w.flush() {
                    self.failed(e);
                }
            }
            Out::Udp(_) => {}
        }
    }

    /// Its counts so far, as the metrics read them while the run goes on.
    fn so_far(&self) -> SinkProgress {
        let (units, bytes, records, lost) = match &self.out {
            Out::Udp(udp) => (self.units, self.bytes, udp.records, udp.refused),
            Out::Tcp(tcp) => (self.units, self.bytes, tcp.records, tcp.lost),
            Out::File(f) => (f.units, f.bytes, f.records, f.lost),
            Out::Stream(_) => (self.units, self.bytes, self.records, 0),
        };
        SinkProgress {
            name: self.name.clone(),
            units,
            bytes,
            records,
            lost,
        }
    }

    /// What it did, at `now` (a TCP collector still away at the end, or a UDP collector's
    /// host refusing its messages, is an error).
    fn finish(self, now: Instant) -> SinkReport {
        let Sink {
            name,
            out,
            units,
            bytes,
            records,
            mut error,
            reader_gone,
        } = self;
        let mut report = SinkReport {
            records,
            reader_gone,
            ..SinkReport::default()
        };
        match out {
            Out::Udp(mut udp) => {
                udp.settle();
                (report.records, report.lost) = (udp.records, udp.refused);
                report.unreachable = udp.unreachable;
                if udp.unreachable && error.is_none() {
                    error = Some(format!(
                        "the collector is unreachable: its host refuses the messages (ICMP \
                         port unreachable), {} refused (is a collector listening there?)",
                        udp.refused
                    ));
                }
                report.collector = udp.spacing.finish();
            }
            Out::Tcp(mut tcp) => {
                tcp.settle(now);
                report.records = tcp.records;
                (report.lost, report.records_lost) = (tcp.lost, tcp.records_lost);
                (report.unconfirmed, report.reconnects) = (tcp.unconfirmed, tcp.reconnects);
                report.spooled = tcp.spooled;
                report.spool = (tcp.spool.as_ref()).map(|s| (s.path().to_path_buf(), s.records()));
                if tcp.stream.is_none() && error.is_none() {
                    let cause = tcp.cause.as_deref().unwrap_or("lost");
                    let waiting = match &report.spool {
                        Some((path, n @ 1..)) => {
                            format!("; {n} records wait in {} for the next run", path.display())
                        }
                        _ => String::new(),
                    };
                    error = Some(format!(
                        "the connection is down ({cause}), {} messages lost{waiting} (is the \
                         collector running and listening there?)",
                        tcp.lost
                    ));
                }
            }
            Out::File(mut f) => {
                let failed = f.finish();
                error = error.or(failed);
                (report.records, report.lost, report.records_lost) =
                    (f.records, f.lost, f.records_lost);
                (report.file, report.recovered) = (true, f.recovered);
                return SinkReport {
                    name,
                    units: f.units,
                    bytes: f.bytes,
                    error,
                    ..report
                };
            }
            Out::Stream(_) => {}
        }
        SinkReport {
            name,
            units,
            bytes,
            error,
            ..report
        }
    }
}

/// The exporter's core and its sinks' transports: each batch, timeout and the end go
/// through the core, and what it hands out is written to the sinks.
struct Exporting {
    core: ExportCore,
    sinks: Vec<Sink>,
}

impl Exporting {
    /// Opens every sink (an error names the one that failed) at `now`, and writes what
    /// they begin with.
    fn open(config: &ExportConfig, now: Instant) -> SetupResult<Exporting> {
        let (sinks, formats): (Vec<Sink>, Vec<Format>) = (config.sinks.iter())
            .map(|s| Sink::open(s, config, now))
            .collect::<SetupResult<Vec<_>>>()?
            .into_iter()
            .unzip();
        let core = ExportCore::new(&formats, config.features, config.biflow, config.domain)
            .with_drop_names(config.drop_names);
        let mut exporting = Exporting { core, sinks };
        let Exporting { core, sinks } = &mut exporting;
        core.start(now, &mut |o| deliver(sinks, now, o));
        Ok(exporting)
    }

    /// A batch of records at `now`: lost TCP collectors tried again if due, then the
    /// records written, and what UDP sinks hold sent.
    fn records(&mut self, now: Instant, batch: &[FlowRecord]) {
        let Exporting { core, sinks } = self;
        for (i, sink) in sinks.iter_mut().enumerate() {
            if sink.reconnect(now, false) {
                core.new_stream(i);
            }
        }
        core.records(now, batch, &mut |o| deliver(sinks, now, o));
        sinks.iter_mut().for_each(Sink::flush_udp);
    }

    /// At `now`: everything held goes out, due or not.
    #[cfg(test)]
    fn flush(&mut self, now: Instant) {
        let Exporting { core, sinks } = self;
        core.flush(&mut |o| deliver(sinks, now, o));
    }

    /// At `now`: what the core has due (a flush).
    fn timeout(&mut self, now: Instant) {
        let Exporting { core, sinks } = self;
        core.timeout(now, &mut |o| deliver(sinks, now, o));
    }

    /// The end at `now`: a lost TCP collector is tried once more, everything held goes out.
    fn finish(mut self, now: Instant) -> Vec<SinkReport> {
        let Exporting { core, sinks } = &mut self;
        for (i, sink) in sinks.iter_mut().enumerate() {
            if sink.reconnect(now, true) {
                core.new_stream(i);
            }
        }
        core.finish(&mut |o| deliver(sinks, now, o));
        self.sinks.into_iter().map(|s| s.finish(now)).collect()
    }
}

/// Carries out one of the core's outputs on the sinks.
fn deliver(sinks: &mut [Sink], now: Instant, output: Output) {
    match output {
        Output::Write {
            sink,
            bytes,
            records,
        } => sinks[sink].write(now, bytes, records),
        Output::Flush { sink } => sinks[sink].flush(now),
    }
}

/// A UDP collector's socket. With segmentation offload asked for, runs of equal-size
/// messages (the encoder fills each family's messages to the same size) go out in one
/// send, which the kernel cuts into datagrams (on loopback about a quarter of the time
/// per message: `stateplane-io`'s `udp_gso` example); else, or where the kernel cannot, one send per message.
struct UdpOut {
    socket: UdpSocket,
    spacing: Spacing,
    /// Messages held for the next send: `segments` of `segment` bytes, the last of which
    /// may be shorter (`tail`), and then nothing more may join.
    pending: Vec<u8>,
    segment: usize,
    segments: usize,
    tail: bool,
    /// The segment size the socket is set to, and whether the kernel takes one at all.
    socket_segment: Option<usize>,
    gso: bool,
    /// Flow records in the messages held, and in those sent.
    pending_records: u64,
    records: u64,
    /// Sends the kernel refused because the collector's host had refused an earlier
    /// datagram (ICMP port unreachable), and whether it still did at the end.
    refused: u64,
    unreachable: bool,
}

/// Messages (or lines) and bytes a sink sent by one call.
type Sent = (usize, usize);

impl UdpOut {
    /// `gso`: send runs of messages at once where the kernel can; else one per send.
    fn new(socket: UdpSocket, pace: Pace, gso: bool, now: Instant) -> UdpOut {
        UdpOut {
            spacing: Spacing::new(pace, &socket, now),
            socket,
            pending: Vec::with_capacity(udp::MAX_SEND_BYTES),
            segment: 0,
            segments: 0,
            tail: false,
            socket_segment: None,
            gso,
            pending_records: 0,
            records: 0,
            refused: 0,
            unreachable: false,
        }
    }

    /// How long the end of a run waits for a refusal of the last messages to come back.
    const REFUSAL_WAIT: Duration = Duration::from_millis(20);

    /// The end of the run: whether the collector's host refused the last messages.
    fn settle(&mut self) {
        if self.records == 0 && self.refused == 0 {
            return;
        }
        std::thread::sleep(Self::REFUSAL_WAIT);
        self.unreachable = matches!(self.socket.take_error(), Ok(Some(e))
            if e.kind() == std::io::ErrorKind::ConnectionRefused);
        self.refused += u64::from(self.unreachable);
    }

    /// Sends `message`, or with segmentation offload holds it for the next send (sending
    /// what is held first if it cannot join): what went out.
    fn push(&mut self, now: Instant, message: &[u8], records: u32) -> std::io::Result<Sent> {
        let mut sent = (0, 0);
        if let Some(wait) = self.spacing.before_send(now, message.len()) {
            sent = self.flush()?;
            self.spacing.wait(wait);
        }
        if !self.gso {
            self.send(message)?;
            self.records += u64::from(records);
            return Ok((sent.0 + 1, sent.1 + message.len()));
        }
        let joins = self.segments > 0
            && !self.tail
            && message.len() <= self.segment
            && self.segments < udp::MAX_SEGMENTS
            && self.pending.len() + message.len() <= udp::MAX_SEND_BYTES;
        if !joins {
            let flushed = self.flush()?;
            sent = (sent.0 + flushed.0, sent.1 + flushed.1);
            self.segment = message.len();
        }
        self.pending.extend_from_slice(message);
        self.pending_records += u64::from(records);
        self.segments += 1;
        self.tail = message.len() < self.segment;
        Ok(sent)
    }

    /// Sends the messages held, in one send where the kernel takes it: what went out.
    fn flush(&mut self) -> std::io::Result<Sent> {
        if self.segments == 0 {
            return Ok((0, 0));
        }
        let sent = if self.gso && self.segment_for_send() {
            let pending = std::mem::take(&mut self.pending);
            let sent = self.send(&pending);
            self.pending = pending;
            match sent {
                // The route cannot take segmentation (its device offloads no checksums):
                // one message per send from now on.
                Err(e) if udp::cannot_segment(&e) => {
                    self.gso = false;
                    self.send_each()
                }
                r => r,
            }
        } else {
            self.send_each()
        };
        let sent = sent.map(|()| (self.segments, self.pending.len()));
        if sent.is_ok() {
            self.records += self.pending_records;
        }
        self.pending.clear();
        self.pending_records = 0;
        self.segments = 0;
        sent
    }

    /// Sets the socket's segment size for the messages held: theirs for several, and for
    /// one, any size not below its length (the kernel would cut it at a smaller one).
    /// `false` where the kernel has no UDP segmentation.
    fn segment_for_send(&mut self) -> bool {
        let fits = match self.socket_segment {
            Some(size) if self.segments == 1 => size >= self.segment,
            Some(size) => size == self.segment,
            None => self.segments == 1,
        };
        if !fits {
            let size = u16::try_from(self.segment).unwrap_or(u16::MAX);
            self.gso = udp::set_segment_size(&self.socket, size).is_ok();
            self.socket_segment = self.gso.then_some(self.segment);
        }
        self.gso
    }

    /// Sends the messages held one per send, with segmentation off.
    fn send_each(&mut self) -> std::io::Result<()> {
        if self.socket_segment.take().is_some() {
            udp::set_segment_size(&self.socket, 0)?;
        }
        let pending = std::mem::take(&mut self.pending);
        let sent = (pending.chunks(self.segment)).try_for_each(|m| self.send(m));
        self.pending = pending;
        sent
    }

    /// Sends `bytes`. A collector that is not listening (yet) has its host answer ICMP port
    /// unreachable, and the kernel refuses the next send with it: that is counted (an
    /// earlier message was refused) and the send made again, since the error is taken by
    /// the refusal. A flow exporter keeps going, as softflowd and nfprobe do, and says at
    /// the end what was refused.
    fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        let refused = |r: &std::io::Result<usize>| matches!(r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused);
        let mut sent = self.socket.send(bytes);
        if refused(&sent) {
            self.refused += 1;
            sent = self.socket.send(bytes);
            if refused(&sent) {
                // Refused again at once: this one is not sent either.
                self.refused += 1;
                return Ok(());
            }
        }
        sent.map(|_| ())
    }
}

/// The workers' end of the exporter's queue.
#[derive(Clone)]
pub struct ChannelSink {
    tx: Sender<Vec<FlowRecord>>,
    /// Emptied vectors coming back, so delivering does not allocate.
    spare: Receiver<Vec<FlowRecord>>,
    /// Live runs: drop rather than wait when the queue is full.
    lossy: bool,
    dropped: Arc<AtomicU64>,
}

impl RecordSink for ChannelSink {
    fn deliver(&mut self, records: &mut Vec<FlowRecord>) {
        let mut batch = self.spare.try_recv().unwrap_or_default();
        batch.clear();
        std::mem::swap(&mut batch, records);
        if self.lossy {
            if let Err(TrySendError::Full(b) | TrySendError::Disconnected(b)) =
                self.tx.try_send(batch)
            {
                self.dropped.fetch_add(b.len() as u64, Ordering::Relaxed);
            }
        } else if let Err(e) = self.tx.send(batch) {
            self.dropped.fetch_add(e.0.len() as u64, Ordering::Relaxed);
        }
    }
}

/// A running exporter: make a [`ChannelSink`] per worker, then `finish` after the run.
pub struct Exporter {
    tx: Sender<Vec<FlowRecord>>,
    spare_rx: Receiver<Vec<FlowRecord>>,
    dropped: Arc<AtomicU64>,
    progress: Arc<ExportProgress>,
    thread: std::thread::JoinHandle<ExportReport>,
    lossy: bool,
    stdout: bool,
}

impl Exporter {
    /// Opens every sink (an error names the one that failed) and starts the thread.
    pub fn start(config: ExportConfig, lossy: bool) -> SetupResult<Exporter> {
        if config.sinks.is_empty() {
            let n = |k| config.naming.name(k);
            return Err(format!(
                "no sink: give {} HOST:PORT, {} HOST:PORT, {} FILE, {} HOST:PORT, {} FILE|- \
                 or {} FILE|-",
                n("ipfix"),
                n("ipfix_tcp"),
                n("ipfix_file"),
                n("netflow9"),
                n("csv"),
                n("json")
            ));
        }
        let udp = |s: &SinkSpec| matches!(s, SinkSpec::IpfixUdp(_) | SinkSpec::Netflow9Udp(_));
        if config.gso && !config.sinks.iter().any(udp) {
            let n = |k| config.naming.name(k);
            return Err(format!(
                "{}: segmentation offload is for IPFIX or NetFlow v9 over UDP, and no {} or \
                 {} HOST:PORT is given: add one, or leave it out",
                n("ipfix_gso"),
                n("ipfix"),
                n("netflow9")
            ));
        }
        let stdout =
            (config.sinks.iter()).any(|s| matches!(s, SinkSpec::Csv(None) | SinkSpec::Json(None)));
        let mut exporting = Exporting::open(&config, Instant::now())?;
        let dropped = Arc::new(AtomicU64::new(0));
        let progress = Arc::new(ExportProgress {
            dropped: dropped.clone(),
            ..ExportProgress::default()
        });
        let published = progress.clone();
        let (tx, rx) = bounded::<Vec<FlowRecord>>(256);
        let (spare_tx, spare_rx) = bounded::<Vec<FlowRecord>>(256);
        let thread = std::thread::Builder::new()
            .name("exporter".into())
            .spawn(move || {
                loop {
                    // Wait for records until the core's next timeout (a flush) is due.
                    let due = exporting.core.poll_timeout();
                    let wait =
                        due.map_or(FLUSH_EVERY, |d| d.saturating_duration_since(Instant::now()));
                    let batch = match rx.recv_timeout(wait) {
                        Ok(batch) => Some(batch),
                        Err(RecvTimeoutError::Timeout) => None,
                        Err(RecvTimeoutError::Disconnected) => break,
                    };
                    let now = Instant::now();
                    exporting.timeout(now);
                    if let Some(batch) = batch {
                        exporting.records(now, &batch);
                        let _ = spare_tx.try_send(batch);
                    }
                    published.publish(exporting.core.records_taken(), &exporting.sinks);
                }
                let records = exporting.core.records_taken();
                let sinks = exporting.finish(Instant::now());
                published.publish_final(records, &sinks);
                ExportReport {
                    records,
                    dropped: 0,
                    sinks,
                }
            })
            .map_err(|e| format!("cannot start the exporter thread: {e}"))?;
        Ok(Exporter {
            tx,
            spare_rx,
            dropped,
            progress,
            thread,
            lossy,
            stdout,
        })
    }

    /// Whether records go to standard output (so that a summary goes elsewhere).
    pub fn writes_to_stdout(&self) -> bool {
        self.stdout
    }

    /// What it has done so far, as its thread publishes it.
    pub fn progress(&self) -> Arc<ExportProgress> {
        self.progress.clone()
    }

    pub fn sink(&self) -> ChannelSink {
        ChannelSink {
            tx: self.tx.clone(),
            spare: self.spare_rx.clone(),
            lossy: self.lossy,
            dropped: self.dropped.clone(),
        }
    }

    /// Waits for every record to be written (all [`ChannelSink`]s must be dropped first).
    pub fn finish(self) -> ExportReport {
        drop(self.tx);
        let mut report = self.thread.join().unwrap_or_else(|_| ExportReport {
            sinks: vec![SinkReport {
                name: "exporter".into(),
                error: Some("the exporter thread panicked".into()),
                ..SinkReport::default()
            }],
            ..ExportReport::default()
        });
        report.dropped = self.dropped.load(Ordering::Relaxed);
        report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::units::ByteRate;

    /// One sink behind the core, driven as the exporter thread drives it, on the clock.
    struct Driven(Exporting);

    impl Driven {
        fn open(config: &ExportConfig) -> Driven {
            Driven(Exporting::open(config, Instant::now()).unwrap())
        }
        fn records(&mut self, records: &[FlowRecord]) {
            self.0.records(Instant::now(), records);
        }
        /// Everything held goes out, due or not.
        fn flush(&mut self) {
            self.0.flush(Instant::now());
        }
        fn out(&self) -> &Out {
            &self.0.sinks[0].out
        }
        fn out_mut(&mut self) -> &mut Out {
            &mut self.0.sinks[0].out
        }
        fn finish(self) -> SinkReport {
            self.0.finish(Instant::now()).remove(0)
        }
    }

    /// Messages of changing sizes, with and without segmentation offload, reach a
    /// receiver as the same datagrams in the same order: runs of one size go out together,
    /// a shorter message ends a run, and a single message longer than the socket's last
    /// segment size is never cut.
    #[test]
    fn udp_messages_arrive_whole_and_in_order_however_they_are_sent() {
        let sizes = [100, 100, 100, 50, 120, 120, 30, 400, 64, 64, 64, 64, 200];
        let messages: Vec<Vec<u8>> = (sizes.iter().enumerate())
            .map(|(i, &n)| vec![i as u8; n])
            .collect();
        for gso in [false, true] {
            let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
            rx.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
            tx.connect(rx.local_addr().unwrap()).unwrap();
            let mut out = UdpOut::new(tx, Pace::Rate(ByteRate(0)), gso, Instant::now());
            let mut sent = 0;
            for (i, m) in messages.iter().enumerate() {
                sent += out.push(Instant::now(), m, 1).unwrap().0;
                // A flush mid-way, as at the end of a batch of records.
                if i == 8 {
                    sent += out.flush().unwrap().0;
                }
            }
            sent += out.flush().unwrap().0;
            assert_eq!(sent, messages.len());
            let mut buf = [0u8; 2000];
            for (i, m) in messages.iter().enumerate() {
                let n = rx.recv(&mut buf).unwrap();
                assert_eq!(&buf[..n], &m[..], "message {i}, gso {gso}");
            }
        }
    }

    /// Sends `count` messages of 1,400 bytes with `pace` to a receiver on loopback that
    /// reads `per_pause` datagrams between pauses of `pause` (none: it never reads): how
    /// many it received, and what the sink saw of its queue.
    fn send_to_a_slow_reader(
        pace: Pace,
        count: usize,
        per_pause: Option<usize>,
    ) -> (usize, Option<CollectorQueue>) {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        let mut out = UdpOut::new(tx, pace, false, Instant::now());
        let reader = std::thread::spawn(move || {
            let Some(per_pause) = per_pause else {
                return (rx, 0);
            };
            rx.set_read_timeout(Some(Duration::from_millis(300)))
                .unwrap();
            let mut buf = [0u8; 2048];
            let mut got = 0;
            while rx.recv(&mut buf).is_ok() {
                got += 1;
                if got % per_pause == 0 {
                    std::thread::sleep(Duration::from_micros(500));
                }
            }
            (rx, got)
        });
        for _ in 0..count {
            out.push(Instant::now(), &[9; 1400], 1).unwrap();
        }
        out.flush().unwrap();
        let (rx, got) = reader.join().unwrap();
        let seen = out.spacing.finish();
        drop(rx);
        (got, seen)
    }

    /// Paced by the queue of a collector on this host, every message reaches a reader
    /// slower than the sender, with no drop seen and the wait counted; unpaced, the same
    /// reader drops most of them (the sender outruns it).
    #[test]
    fn pacing_by_the_collectors_queue_loses_nothing_to_a_slow_reader() {
        let (got, seen) = send_to_a_slow_reader(Pace::Auto, 3000, Some(20));
        let seen = seen.expect("a collector on loopback is paced by its queue");
        assert_eq!(got, 3000, "{seen:?}");
        assert_eq!((seen.drops, seen.stalls, seen.error), (0, 0, None));
        assert!(seen.capacity > 0 && !seen.waited.is_zero());
        let (got, seen) = send_to_a_slow_reader(Pace::Rate(ByteRate(0)), 3000, Some(20));
        assert!(got < 3000, "unpaced, the slow reader kept up: {got}");
        assert_eq!(seen, None);
    }

    /// A collector that has gone (its socket closed) is not waited for: each message reads
    /// the queue, finds none, and goes (the kernel refuses it, which is not an error).
    #[test]
    fn a_collector_gone_is_not_waited_for() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        tx.connect(rx.local_addr().unwrap()).unwrap();
        let mut out = UdpOut::new(tx, Pace::Auto, false, Instant::now());
        out.push(Instant::now(), &[1; 1400], 1).unwrap();
        drop(rx);
        let start = Instant::now();
        for _ in 0..500 {
            out.push(Instant::now(), &[1; 1400], 1).unwrap();
        }
        out.flush().unwrap();
        let seen = out.spacing.finish().unwrap();
        assert!(start.elapsed() < STALL / 2, "{:?}", start.elapsed());
        assert_eq!((seen.stalls, seen.error), (0, None));
    }

    /// A collector that reads nothing holds the sender up once for `STALL`, not for ever:
    /// what its queue takes goes, then the rest goes regardless, and the stall and the
    /// drops are reported.
    #[test]
    fn a_collector_that_stops_reading_is_waited_for_once_and_its_drops_reported() {
        let start = Instant::now();
        let (_, seen) = send_to_a_slow_reader(Pace::Auto, 400, None);
        let seen = seen.unwrap();
        assert_eq!(seen.stalls, 1, "{seen:?}");
        assert!(seen.drops > 0, "{seen:?}");
        assert!(
            seen.waited >= STALL && start.elapsed() < STALL * 3,
            "{seen:?}"
        );
    }

    /// `n` IPv4 records of one packet each, told apart by their source port from `first`.
    pub(super) fn records(first: u16, n: u16) -> Vec<FlowRecord> {
        use stateplane_flows::flow_stats::{FlowStats, Observation};
        let o = Observation {
            ts_ns: 1_700_000_000_000_000_000,
            ip_len: 100,
            ..Observation::default()
        };
        (first..first + n)
            .map(|port| FlowRecord {
                key: stateplane_wire::FlowKey::v4(
                    [198, 18, 0, 1].into(),
                    [198, 18, 0, 2].into(),
                    17,
                    port,
                    53,
                ),
                forward: FlowStats::start(&o),
                reverse: None,
                end: stateplane_flows::EndReason::Idle,
            })
            .collect()
    }

    fn tcp_config(addr: SocketAddr) -> ExportConfig {
        ExportConfig {
            naming: Naming::Flags,
            sinks: vec![SinkSpec::IpfixTcp(addr)],
            features: Features::DEFAULT,
            biflow: false,
            domain: 7,
            mtu: MessageSize::Auto,
            pace: Pace::Rate(ByteRate(0)),
            gso: false,
            spool: None,
            drop_names: &[],
        }
    }

    /// Reads IPFIX messages from `conn` until `records` records have come (or 5 s pass):
    /// each message's sequence number, and the records' source ports.
    fn read_messages(conn: &mut TcpStream, records: usize) -> (Vec<u32>, Vec<u16>) {
        let messages = read_stream(conn, records);
        let sequences = messages.iter().map(|(s, _)| *s).collect();
        (
            sequences,
            messages.into_iter().flat_map(|(_, p)| p).collect(),
        )
    }

    /// Reads IPFIX messages from `conn` until `records` records have come (or 5 s pass):
    /// each message's sequence number and its records' source ports.
    fn read_stream(conn: &mut TcpStream, records: usize) -> Vec<(u32, Vec<u16>)> {
        use std::io::Read;
        conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut decoder = stateplane_flows::ipfix::Decoder::default();
        let (mut messages, mut got) = (Vec::new(), 0);
        let mut header = [0u8; 16];
        while got < records {
            conn.read_exact(&mut header).unwrap();
            let len = usize::from(u16::from_be_bytes([header[2], header[3]]));
            let mut message = header.to_vec();
            message.resize(len, 0);
            conn.read_exact(&mut message[16..]).unwrap();
            let (header, records) = decoder.decode(&message).unwrap();
            got += records.len();
            messages.push((
                header.sequence,
                records.iter().map(|r| r.key.src_port).collect(),
            ));
        }
        messages
    }

    /// Whether each message's sequence number counts the data records before it in the
    /// connection (RFC 7011 3.1).
    fn numbered_in_order(messages: &[(u32, Vec<u16>)]) -> bool {
        let mut before = 0;
        messages.iter().all(|(sequence, ports)| {
            let ok = *sequence == before;
            before += ports.len() as u32;
            ok
        })
    }

    /// A spool directory for one test, emptied first.
    fn spool_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "stateplane-test-export-spool-{}-{name}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// With a spool, a collector that goes away and comes back misses nothing: what was
    /// exported while it was away, and what it never acknowledged, goes to it first on the
    /// new connection, in the order it was exported, numbered in that connection; nothing
    /// is lost and no record comes twice.
    #[test]
    fn with_a_spool_a_tcp_collector_that_comes_back_misses_nothing() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dir = spool_dir("back");
        let config = ExportConfig {
            spool: Some((dir.clone(), 1 << 30)),
            ..tcp_config(listener.local_addr().unwrap())
        };
        let mut sink = Driven::open(&config);
        let (mut first, _) = listener.accept().unwrap();
        sink.records(&records(1000, 10));
        sink.flush();
        let (_, ports) = read_messages(&mut first, 10);
        assert_eq!(ports, (1000..1010).collect::<Vec<_>>());

        // The collector goes: what the exporter writes until it notices, and after, is
        // spooled.
        drop(first);
        let down = |sink: &Driven| matches!(sink.out(), Out::Tcp(t) if t.stream.is_none());
        let mut sent: Vec<u16> = Vec::new();
        for i in 0..100 {
            if down(&sink) {
                break;
            }
            sink.records(&records(2000 + i * 10, 10));
            sent.extend(2000 + i * 10..2010 + i * 10);
            sink.flush();
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(down(&sink), "the lost connection was never noticed");
        sink.records(&records(3000, 10));
        sent.extend(3000..3010);
        sink.flush();
        if let Out::Tcp(t) = sink.out_mut() {
            assert!(t.spool.as_ref().is_some_and(|s| s.records() >= 10));
            assert_eq!(t.lost, 0);
            t.retry_at = Instant::now();
        }
        // Back: the spool first, then what comes after.
        sink.records(&records(4000, 20));
        sent.extend(4000..4020);
        sink.flush();
        let (mut second, _) = listener.accept().unwrap();
        let messages = read_stream(&mut second, sent.len());
        let received: Vec<u16> = messages.iter().flat_map(|(_, p)| p.clone()).collect();
        assert_eq!(received, sent, "every record once, in the order exported");
        assert!(numbered_in_order(&messages), "{messages:?}");
        let report = sink.finish();
        assert_eq!((report.lost, report.records_lost), (0, 0), "{report:?}");
        assert_eq!((report.reconnects, &report.error), (1, &None), "{report:?}");
        assert!(report.spooled >= 1, "{report:?}");
        assert_eq!(report.records, 10 + sent.len() as u64, "{report:?}");
        assert_eq!(report.spool.as_ref().map(|s| s.1), Some(0));
        let _ = std::fs::remove_dir_all(dir);
    }

    /// With a spool, a collector not reachable at the start is waited for; what a run
    /// could not deliver is left in the spool (an error says where), and the next run that
    /// spools there sends it first, before its own records.
    #[test]
    fn what_a_spool_holds_at_the_end_goes_first_in_the_next_run() {
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let dir = spool_dir("next");
        let config = ExportConfig {
            spool: Some((dir.clone(), 1 << 30)),
            ..tcp_config(addr)
        };
        let mut sink = Driven::open(&config);
        sink.records(&records(100, 50));
        let report = sink.finish();
        assert_eq!((report.lost, report.records), (0, 0), "{report:?}");
        let (file, waiting) = report.spool.clone().unwrap();
        assert_eq!(waiting, 50);
        let error = report.error.unwrap_or_default();
        assert!(
            error.contains("the connection is down") && error.contains("50 records wait in"),
            "{error}"
        );
        // The spool is an IPFIX file of its own: templates, then the records.
        let bytes = std::fs::read(&file).unwrap();
        let mut decoder = stateplane_flows::ipfix::Decoder::default();
        let (mut at, mut kept) = (0, 0);
        while at < bytes.len() {
            let len = usize::from(u16::from_be_bytes([bytes[at + 2], bytes[at + 3]]));
            kept += decoder.decode(&bytes[at..at + len]).unwrap().1.len();
            at += len;
        }
        assert_eq!(kept, 50);

        let listener = std::net::TcpListener::bind(addr).unwrap();
        let mut sink = Driven::open(&config);
        let (mut conn, _) = listener.accept().unwrap();
        sink.records(&records(200, 5));
        sink.flush();
        let messages = read_stream(&mut conn, 55);
        let received: Vec<u16> = messages.iter().flat_map(|(_, p)| p.clone()).collect();
        let expected: Vec<u16> = (100..150).chain(200..205).collect();
        assert_eq!(received, expected);
        assert!(numbered_in_order(&messages), "{messages:?}");
        let report = sink.finish();
        assert_eq!((report.records, &report.error), (55, &None), "{report:?}");
        assert_eq!(
            std::fs::metadata(&file).unwrap().len(),
            0,
            "the spool is empty"
        );
        let _ = std::fs::remove_dir_all(dir);
    }

    /// A collector that goes away and comes back gets a new connection, which is a new
    /// IPFIX stream: the templates first, sequence numbers from 0, and the records of
    /// after; what was written while it was down is counted as lost, and the run ends
    /// without an error. One that never comes back is an error at the end.
    #[test]
    fn a_tcp_collector_that_comes_back_gets_a_new_stream() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let config = tcp_config(listener.local_addr().unwrap());
        let mut sink = Driven::open(&config);
        let (mut first, _) = listener.accept().unwrap();
        sink.records(&records(1000, 10));
        sink.flush();
        let (sequences, ports) = read_messages(&mut first, 10);
        assert_eq!((sequences, ports), (vec![0, 0], (1000..1010).collect()));

        // The collector goes; the exporter finds out on a later write (bounded).
        drop(first);
        let down = |sink: &Driven| matches!(sink.out(), Out::Tcp(t) if t.stream.is_none());
        for i in 0..100 {
            if down(&sink) {
                break;
            }
            sink.records(&records(2000 + i * 10, 10));
            sink.flush();
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(down(&sink), "the lost connection was never noticed");
        // Before a retry is due, records are lost; then it connects again.
        sink.records(&records(3000, 10));
        sink.flush();
        if let Out::Tcp(t) = sink.out_mut() {
            assert!(t.lost > 0);
            t.retry_at = Instant::now();
        }
        sink.records(&records(4000, 20));
        sink.flush();
        let (mut second, _) = listener.accept().unwrap();
        let (sequences, ports) = read_messages(&mut second, 20);
        assert_eq!((sequences, ports), (vec![0, 0], (4000..4020).collect()));
        let report = sink.finish();
        assert_eq!((report.reconnects, &report.error), (1, &None));
        assert!(report.lost >= 1, "{report:?}");

        // A collector that does not come back: an error at the end that says so.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let config = tcp_config(listener.local_addr().unwrap());
        let mut sink = Driven::open(&config);
        drop(listener.accept().unwrap());
        drop(listener);
        for i in 0..100 {
            if down(&sink) {
                break;
            }
            sink.records(&records(i * 10, 10));
            sink.flush();
            std::thread::sleep(Duration::from_millis(10));
        }
        // Each failed try doubles the wait before the next, up to 30 s.
        let mut waits = Vec::new();
        for _ in 0..7 {
            if let Out::Tcp(t) = sink.out_mut() {
                t.retry_at = Instant::now();
            }
            let before = Instant::now();
            sink.records(&records(9000, 1));
            if let Out::Tcp(t) = sink.out() {
                waits.push((t.retry_at - before).as_secs());
            }
        }
        assert_eq!(waits, [1, 2, 4, 8, 16, 30, 30]);
        let report = sink.finish();
        let error = report.error.unwrap_or_default();
        assert!(error.contains("the connection is down"), "{error}");
    }

    /// A collector that accepts but never reads is taken as lost once a send has waited
    /// its timeout, so the exporter (and the end of the run) never waits on it for ever.
    #[test]
    fn a_tcp_collector_that_reads_nothing_is_taken_as_lost() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let config = tcp_config(listener.local_addr().unwrap());
        let mut sink = Driven::open(&config);
        let (_silent, _) = listener.accept().unwrap();
        if let Out::Tcp(t) = sink.out()
            && let Some(stream) = &t.stream
        {
            let timeout = stream.get_ref().write_timeout().unwrap();
            assert_eq!(timeout, Some(TcpOut::WRITE_TIMEOUT));
            // The test's own timeout, not the 10 s a real run waits.
            (stream.get_ref())
                .set_write_timeout(Some(Duration::from_millis(200)))
                .unwrap();
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        let down = |sink: &Driven| matches!(sink.out(), Out::Tcp(t) if t.stream.is_none());
        while !down(&sink) && Instant::now() < deadline {
            sink.records(&records(0, 1000));
            sink.flush();
        }
        let Out::Tcp(t) = sink.out() else {
            unreachable!("a TCP sink")
        };
        assert!(down(&sink), "the silent collector was never given up");
        let cause = t.cause.clone().unwrap_or_default();
        assert!(cause.contains("took nothing"), "{cause}");
    }

    /// Every record a collector's socket holds, read from whole messages until the
    /// connection ends or is quiet for a second.
    fn records_received(conn: &mut TcpStream) -> u64 {
        use std::io::Read;
        conn.set_read_timeout(Some(Duration::from_secs(1))).unwrap();
        let mut bytes = Vec::new();
        let mut buf = [0u8; 1 << 16];
        while let Ok(n @ 1..) = conn.read(&mut buf) {
            bytes.extend_from_slice(&buf[..n]);
        }
        let mut decoder = stateplane_flows::ipfix::Decoder::default();
        let mut records = 0;
        let mut rest = &bytes[..];
        while rest.len() >= 16 {
            let len = usize::from(u16::from_be_bytes([rest[2], rest[3]]));
            if rest.len() < len {
                break;
            }
            records += decoder.decode(&rest[..len]).unwrap().1.len() as u64;
            rest = &rest[len..];
        }
        records
    }

    /// A collector that stops reading: what its TCP acknowledged counts as delivered, the
    /// messages it never acknowledged (in the exporter's socket when the connection was
    /// given up) and those written after are lost, with their records; the records the
    /// collector's socket holds are exactly those reported delivered.
    #[test]
    fn records_a_tcp_collector_never_acknowledged_are_counted_lost() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let config = tcp_config(listener.local_addr().unwrap());
        let mut sink = Driven::open(&config);
        let (mut silent, _) = listener.accept().unwrap();
        if let Out::Tcp(t) = sink.out()
            && let Some(stream) = &t.stream
        {
            (stream.get_ref())
                .set_write_timeout(Some(Duration::from_millis(200)))
                .unwrap();
        }
        let down = |sink: &Driven| matches!(sink.out(), Out::Tcp(t) if t.stream.is_none());
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut taken = 0;
        while !down(&sink) && Instant::now() < deadline {
            sink.records(&records(0, 1000));
            sink.flush();
            taken += 1000;
        }
        assert!(down(&sink), "the silent collector was never given up");
        // Written while it is down (no retry due yet): lost as well.
        sink.records(&records(0, 10));
        taken += 10;
        drop(listener);
        let report = sink.finish();
        assert!(report.unconfirmed > 0, "{report:?}");
        assert!(report.lost > report.unconfirmed, "{report:?}");
        assert_eq!(report.records + report.records_lost, taken, "{report:?}");
        assert_eq!(records_received(&mut silent), report.records, "{report:?}");
    }

    /// IPFIX over UDP to a port nobody listens on: the host's refusals (ICMP port
    /// unreachable) are counted, and the end says the collector is unreachable and that
    /// nothing was delivered. A collector that starts listening mid-run gets what follows,
    /// and the end reports the refusals without an error.
    #[test]
    fn a_udp_collector_that_is_not_listening_is_reported_unreachable() {
        let addr = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let config = ExportConfig {
            sinks: vec![SinkSpec::IpfixUdp(addr)],
            mtu: MessageSize::Bytes(1400),
            ..tcp_config(addr)
        };
        let mut sink = Driven::open(&config);
        for i in 0..5 {
            sink.records(&records(i * 100, 100));
            sink.flush();
        }
        let report = sink.finish();
        assert!(report.unreachable, "{report:?}");
        assert!(report.lost >= 5, "{report:?}");
        let error = report.error.clone().unwrap_or_default();
        assert!(error.contains("unreachable"), "{error}");
        let all = ExportReport {
            sinks: vec![report],
            ..ExportReport::default()
        };
        assert_eq!(all.delivered(), 0);

        let mut sink = Driven::open(&config);
        sink.records(&records(0, 100));
        sink.flush();
        std::thread::sleep(Duration::from_millis(20));
        let collector = UdpSocket::bind(addr).unwrap();
        collector
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        sink.records(&records(1000, 100));
        sink.flush();
        let report = sink.finish();
        assert!(!report.unreachable && report.error.is_none(), "{report:?}");
        assert!(report.lost >= 1, "{report:?}");
        // The templates went before it listened: the messages arrive, not yet readable.
        let mut buf = [0u8; 2000];
        let mut got = 0;
        while collector.recv(&mut buf).is_ok() {
            got += 1;
            collector
                .set_read_timeout(Some(Duration::from_millis(200)))
                .unwrap();
        }
        assert!(got >= 1, "the messages after it listened arrive");
    }

    /// What a live run exports reaches its collector within moments, not when a message
    /// or a buffer fills: the exporter sends what it holds when it has been idle.
    #[test]
    fn records_reach_the_collector_while_the_run_goes_on() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let config = tcp_config(listener.local_addr().unwrap());
        let exporter = Exporter::start(config, true).unwrap();
        let (mut conn, _) = listener.accept().unwrap();
        let mut sink = exporter.sink();
        sink.deliver(&mut records(500, 3));
        // Three records fill neither a message nor a buffer: only the idle flush sends them.
        let (_, ports) = read_messages(&mut conn, 3);
        assert_eq!(ports, vec![500, 501, 502]);
        drop(sink);
        let report = exporter.finish();
        assert_eq!(report.sinks[0].error, None);
    }
}
