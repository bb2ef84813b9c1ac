//! `stateplane collector`: the control plane's side of the `synced` guarantee. It takes the
//! switches' sync messages on a UDP socket into a `Mirror` (the protocol core of
//! `stateplane-sync`, in memory), sends each stream its report every `report_ms` (the rate
//! controller's feedback), and at the end can write every location it holds, with its
//! bound, to a CSV file.
//!
//! Must never: apply a message the decoder or the mirror refused (each is counted by
//! reason), or send a report to an address no accepted message came from (a spoofed
//! datagram cannot turn the collector on someone else).

use crate::sync_stage::read_key;
use stateplane_sync::mirror::{Mirror, MirrorCounters};
use stateplane_sync::wire::{Key, Kind, Message};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// What `stateplane collector` is asked to do.
#[derive(Clone, Debug)]
pub struct CollectorSettings {
    pub listen: SocketAddr,
    pub key_file: Option<PathBuf>,
    /// The switches taken (any, where `None`); others are refused as `unknown_switch`.
    pub switches: Option<Vec<u32>>,
    pub report_every: Duration,
    /// Stop after this long (else at SIGINT or SIGTERM).
    pub duration: Option<Duration>,
    /// Write every location held, with its bound, here at the end (CSV).
    pub dump: Option<PathBuf>,
}

/// The receive buffer asked for: a switch's end-of-run refresh arrives all at once.
const RECEIVE_BUFFER: usize = 64 << 20;

/// What a collector's run saw.
#[derive(Debug, Default)]
pub struct CollectorOutcome {
    pub datagrams: u64,
    pub mirror: MirrorCounters,
    /// Datagrams refused, by reason (the decoder's and the mirror's).
    pub refused: BTreeMap<&'static str, u64>,
    pub reports_sent: u64,
    /// Per stream: `(switch, stream, epoch, last message applied, messages missing,
    /// locations held)`.
    pub streams: Vec<(u32, u16, u32, u64, u64, usize)>,
}

impl CollectorOutcome {
    /// The summary a person reads.
    pub fn table(&self) -> String {
        let mut s = format!(
            "datagrams {}  applied {}  entries {}  gaps {} ({} messages missing)  restarts {}  reports sent {}\n",
            self.datagrams,
            self.mirror.applied,
            self.mirror.entries,
            self.mirror.gaps,
            self.mirror.missing,
            self.mirror.restarts,
            self.reports_sent
        );
        if self.refused.is_empty() {
            s.push_str("refused 0\n");
        } else {
            let reasons: Vec<String> = (self.refused.iter())
                .map(|(r, n)| format!("{r} {n}"))
                .collect();
            s.push_str(&format!("refused: {}\n", reasons.join(", ")));
        }
        for (switch, stream, epoch, seq, missing, held) in &self.streams {
            s.push_str(&format!(
                "switch {switch} stream {stream}: epoch {epoch}, last message {seq}, missing {missing}, locations held {held}\n"
            ));
        }
        s
    }
}

/// Binds the collector's socket (before anything runs, so that a bad address is refused
/// at once); the address it listens on.
pub fn bind(settings: &CollectorSettings) -> Result<(UdpSocket, SocketAddr), String> {
    let socket = UdpSocket::bind(settings.listen)
        .map_err(|e| format!("--listen {}: {e}", settings.listen))?;
    if let Err(e) = stateplane_io::udp_socket::set_receive_buffer(&socket, RECEIVE_BUFFER) {
        log::warn!("collector: could not enlarge the receive buffer: {e}");
    }
    socket
        .set_read_timeout(Some(Duration::from_millis(1)))
        .map_err(|e| format!("--listen: {e}"))?;
    let addr = socket.local_addr().map_err(|e| format!("--listen: {e}"))?;
    Ok((socket, addr))
}

/// Runs the collector on `socket` until `stop` is raised or the duration ends.
pub fn run(
    settings: &CollectorSettings,
    socket: UdpSocket,
    stop: Arc<AtomicBool>,
) -> Result<CollectorOutcome, String> {
    let key = (settings.key_file.as_deref())
        .map(read_key)
        .transpose()
        .map_err(|e| format!("--key-file: {e}"))?;
    let mut collector = Collector {
        mirror: Mirror::new(settings.switches.clone()),
        key,
        peers: HashMap::new(),
        outcome: CollectorOutcome::default(),
    };
    let start = Instant::now();
    let mut last_report = start;
    let mut datagram = vec![0u8; 65_536];
    let mut bytes = Vec::new();
    while !stop.load(Ordering::Relaxed) && settings.duration.is_none_or(|d| start.elapsed() < d) {
        match socket.recv_from(&mut datagram) {
            Ok((n, from)) => collector.take(&datagram[..n], from),
            // Nothing yet; a signal (the stop, checked next); an ICMP error of a report
            // to a switch that has gone (its stream stays, to be read).
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                        | std::io::ErrorKind::ConnectionRefused
                ) => {}
            Err(e) => return Err(format!("collector: receiving: {e}")),
        }
        if last_report.elapsed() >= settings.report_every {
            last_report = Instant::now();
            let now_ns = start.elapsed().as_nanos() as u64;
            collector.report(&socket, now_ns, &mut bytes);
        }
    }
    // What is already in the socket's buffer is taken before the end.
    socket
        .set_nonblocking(true)
        .map_err(|e| format!("collector: {e}"))?;
    while let Ok((n, from)) = socket.recv_from(&mut datagram) {
        collector.take(&datagram[..n], from);
    }
    let mut outcome = collector.outcome;
    outcome.mirror = collector.mirror.counters;
    for (switch, stream) in collector.mirror.streams() {
        let (epoch, missing) = collector
            .mirror
            .stream_state(switch, stream)
            .unwrap_or((0, 0));
        let seq = collector.mirror.last_seq(switch, stream).unwrap_or(0);
        let held = collector.mirror.held(switch, stream).len();
        outcome
            .streams
            .push((switch, stream, epoch, seq, missing, held));
    }
    if let Some(path) = &settings.dump {
        dump(&collector.mirror, path).map_err(|e| format!("--dump {}: {e}", path.display()))?;
    }
    Ok(outcome)
}

struct Collector {
    mirror: Mirror,
    key: Option<Key>,
    /// Where each stream's accepted messages came from: its reports go there.
    peers: HashMap<(u32, u16), SocketAddr>,
    outcome: CollectorOutcome,
}

impl Collector {
    fn refuse(&mut self, reason: &'static str) {
        *self.outcome.refused.entry(reason).or_default() += 1;
    }

    fn take(&mut self, datagram: &[u8], from: SocketAddr) {
        self.outcome.datagrams += 1;
        let message = match Message::decode_with(self.key.as_ref(), datagram) {
            Ok(m) => m,
            Err(e) => return self.refuse(e.reason()),
        };
        if !matches!(
            message.kind,
            Kind::Updates | Kind::Refresh | Kind::Heartbeat
        ) {
            return self.refuse("unexpected_kind");
        }
        match self.mirror.apply(&message) {
            Ok(()) => {
                self.peers.insert((message.switch, message.stream), from);
            }
            Err(why) => self.refuse(why.reason()),
        }
    }

    fn report(&mut self, socket: &UdpSocket, now_ns: u64, bytes: &mut Vec<u8>) {
        for (&(switch, stream), &addr) in &self.peers {
            let Some(report) = self.mirror.report(switch, stream, now_ns) else {
                continue;
            };
            bytes.clear();
            report.encode_with(self.key.as_ref(), bytes);
            if socket.send_to(bytes, addr).is_ok() {
                self.outcome.reports_sent += 1;
            }
        }
    }
}

/// Writes every location held: `switch,stream,state,index,value,bound` (the bound empty
/// where there is none, after a loss until the location arrives again).
fn dump(mirror: &Mirror, path: &std::path::Path) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    writeln!(out, "switch,stream,state,index,value,bound,as_of_ns")?;
    for (switch, stream) in mirror.streams() {
        for (l, r) in mirror.held(switch, stream) {
            let bound = r.bound.map(|b| b.to_string()).unwrap_or_default();
            writeln!(
                out,
                "{switch},{stream},{},{},{},{bound},{}",
                l.state, l.index, r.value, r.as_of_ns
            )?;
        }
    }
    out.flush()
}

/// A flag raised by SIGINT or SIGTERM, for a collector run from the command line.
pub fn stop_on_signals() -> Result<Arc<AtomicBool>, String> {
    let stop = Arc::new(AtomicBool::new(false));
    for signal in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(signal, stop.clone())
            .map_err(|e| format!("collector: catching signal {signal}: {e}"))?;
    }
    Ok(stop)
}
