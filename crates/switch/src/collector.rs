//! `stateplane collector`: the control plane's side of the `synced` guarantee, a shell of
//! sockets around the collector core (`stateplane_sync::collector`): it takes the
//! switches' sync messages on a UDP socket, sends each stream its report every
//! `report_every` (the rate controller's feedback) and the parts of writes, serves the
//! collector's API (`stateplane_control::collector_api`) where asked, and at the end can
//! write every location it holds, with its bound, to a CSV file.
//!
//! Must never: decide what a datagram means (the core does), or block the receive loop
//! on the API (they share the core through a lock held only to apply or read).

use crate::out_file::OutFile;
use crate::redis_mirror::{self, RedisWriter};
use crate::sync_stage::read_key;
use stateplane_control::collector_api::{self, CollectorHandle};
use stateplane_stores::redis_client::RedisTls;
use stateplane_sync::collector::{Collector, StreamInfo};
use stateplane_sync::mirror::MirrorCounters;
use std::collections::BTreeMap;
use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
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
    /// Serve the collector's API here (loopback).
    pub api: Option<SocketAddr>,
    /// Write the copy through to the Redis server at this URL (`redis://127.0.0.1:6379`).
    pub redis: Option<String>,
    /// With a `rediss://` URL: the certificates the connection trusts and shows.
    pub redis_tls: Option<RedisTls>,
    /// Serve Prometheus metrics here (loopback).
    pub metrics: Option<SocketAddr>,
    /// The locations the copy holds at most, over every stream (see
    /// `stateplane_sync::mirror::DEFAULT_MAX_LOCATIONS`): messages that would add more are
    /// refused as `full`, counted.
    pub max_locations: usize,
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
    /// Every stream heard from, as the core knows it at the end.
    pub streams: Vec<StreamInfo>,
    /// With `--redis`: values written, errors, whole copies written.
    pub redis: Option<(u64, u64, u64)>,
}

impl CollectorOutcome {
    /// The summary a person reads.
    pub fn table(&self) -> String {
        let mut s = format!(
            "datagrams {}  applied {}  entries {}  gaps {} ({} messages missing, {} sent again, {} given up)  restarts {}  reports sent {}\n",
            self.datagrams,
            self.mirror.applied,
            self.mirror.entries,
            self.mirror.gaps,
            self.mirror.missing,
            self.mirror.repaired,
            self.mirror.given_up,
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
        if let Some((values, errors, resyncs)) = self.redis {
            s.push_str(&format!(
                "redis: {values} values written, {resyncs} whole copies, {errors} errors\n"
            ));
        }
        for i in &self.streams {
            s.push_str(&format!(
                "switch {} stream {}: epoch {}, last message {}, missing {}, locations held {}\n",
                i.switch, i.stream, i.epoch, i.last_seq, i.missing, i.locations
            ));
        }
        s
    }
}

/// A collector bound to its socket (before anything runs, so that a bad address is
/// refused at once), with its API served if asked.
pub struct Bound {
    handle: Arc<CollectorHandle>,
    pub addr: SocketAddr,
    /// The API's server, if asked for; stops when dropped.
    pub api: Option<stateplane_control::server::Server>,
    redis: Option<RedisWriter>,
    /// Where the copy is dumped at the end, its folder checked as the collector starts.
    dump: Option<OutFile>,
}

impl Bound {
    /// The collector's core as its API sees it (for reads in the same process).
    pub fn handle(&self) -> Arc<CollectorHandle> {
        self.handle.clone()
    }
}

/// Binds the collector's socket, reads its key, starts its API.
pub fn bind(settings: &CollectorSettings) -> Result<Bound, String> {
    let key = (settings.key_file.as_deref())
        .map(read_key)
        .transpose()
        .map_err(|e| format!("--key-file: {e}"))?;
    // Before anything runs: a dump that cannot be written would be found only at the end.
    let dump = (settings.dump.as_deref())
        .map(|path| OutFile::checked("--dump", path))
        .transpose()?;
    let socket = UdpSocket::bind(settings.listen)
        .map_err(|e| format!("--listen {}: {e}", settings.listen))?;
    if let Err(e) = stateplane_io::udp_socket::set_receive_buffer(&socket, RECEIVE_BUFFER) {
        log::warn!("collector: could not enlarge the receive buffer: {e}");
    }
    // Not blocking: the loop waits with poll(2), whose timeout the kernel keeps to the
    // microsecond, where a socket's receive timeout is kept in ticks (4 ms at 250 Hz).
    socket
        .set_nonblocking(true)
        .map_err(|e| format!("--listen: {e}"))?;
    let addr = socket.local_addr().map_err(|e| format!("--listen: {e}"))?;
    let redis = settings
        .redis
        .as_deref()
        .map(|url| redis_mirror::check(url, settings.redis_tls.clone()))
        .transpose()?;
    let core = Collector::new(settings.switches.clone(), key)
        .with_max_locations(settings.max_locations)
        .with_write_room();
    let handle = Arc::new(CollectorHandle::new(core, socket));
    let api = (settings.api)
        .map(|a| collector_api::serve(a, handle.clone()).map_err(|e| format!("--api: {e}")))
        .transpose()?;
    let redis = redis.map(|connector| RedisWriter::start(connector, handle.clone()));
    if let Some(addr) = settings.metrics {
        let counters = redis.as_ref().map(|r| r.counters.clone());
        crate::metrics::serve_collector(addr, handle.clone(), counters)?;
    }
    Ok(Bound {
        handle,
        addr,
        api,
        redis,
        dump,
    })
}

/// Runs the collector until `stop` is raised or the duration ends.
pub fn run(
    settings: &CollectorSettings,
    bound: Bound,
    stop: Arc<AtomicBool>,
) -> Result<CollectorOutcome, String> {
    let handle = &bound.handle;
    let start = Instant::now();
    let mut last_report = start;
    let mut datagram = vec![0u8; 65_536];
    while !stop.load(Ordering::Relaxed) && settings.duration.is_none_or(|d| start.elapsed() < d) {
        let _ = stateplane_io::live::poll_readable(&[handle.socket().as_raw_fd()], 1);
        match handle.receive_next(&mut datagram) {
            Ok(()) => {}
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
        let report = last_report.elapsed() >= settings.report_every;
        if report {
            last_report = Instant::now();
        }
        handle.pump(report);
    }
    // What is already in the socket's buffer is taken before the end.
    while handle.receive_next(&mut datagram).is_ok() {}
    let redis = bound.redis.map(|writer| {
        let counters = writer.counters.clone();
        writer.finish();
        let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        (
            get(&counters.values),
            get(&counters.errors),
            get(&counters.resyncs),
        )
    });
    handle.with(|c| {
        let outcome = CollectorOutcome {
            datagrams: c.datagrams,
            mirror: c.counters(),
            refused: c.refused.clone(),
            reports_sent: c.reports_sent,
            streams: c.streams(),
            redis,
        };
        if let Some(file) = bound.dump {
            file.write(|out| dump(c, out))?;
        }
        Ok(outcome)
    })
}

/// Writes every location held: `switch,stream,state,index,value,bound,as_of_ns` (the
/// bound empty where there is none, after a loss until the location arrives again).
fn dump(c: &Collector, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(out, "switch,stream,state,index,value,bound,as_of_ns")?;
    for s in c.streams() {
        for (l, r) in c.held(s.switch, s.stream) {
            let bound = r.bound.map(|b| b.to_string()).unwrap_or_default();
            writeln!(
                out,
                "{},{},{},{},{},{bound},{}",
                s.switch, s.stream, l.state, l.index, r.value, r.as_of_ns
            )?;
        }
    }
    Ok(())
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
