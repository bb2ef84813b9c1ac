//! The collector's API (`proto/stateplane/sync/v1/collector.proto`): reads of the copy
//! with their bounds, the streams' freshness and loss, writes into switches, and a stream
//! of the changes as applied; served over a [`CollectorHandle`], the collector core the
//! receive loop of `stateplane collector` shares with it.
//!
//! Must never: hold the core's lock across a wait (a write's wait lets it go between
//! looks), or listen beyond loopback.

use crate::server::Server;
use crate::sync_pb::{self, collector_server};
use stateplane_sync::Location;
use stateplane_sync::collector::{Collector, Outgoing, WriteTicket};
use stateplane_sync::write::{Mode, Written};
use std::net::{SocketAddr, UdpSocket};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, TryLockError};
use std::time::{Duration, Instant};
use tokio_stream::Stream;
use tonic::{Response, Status};

/// The collector as its receive loop and its API share it: the core behind a lock, and
/// the socket its datagrams go out on.
pub struct CollectorHandle {
    core: Mutex<Collector>,
    /// Held while a thread polls the core and sends what it gave: the receive loop and a
    /// write's call both pump, and a write's parts must leave in the order they were
    /// polled (a part overtaken on the way is taken as lost).
    sending: Mutex<()>,
    /// A pump asked for (with a report): the thread sending takes it on, so that a pump
    /// never waits for another.
    pump_asked: AtomicBool,
    report_asked: AtomicBool,
    /// Signalled when the core keeps a write's outcome ([`Collector::outcomes_kept`]): a
    /// write's wait wakes then, not at its next look.
    settled: Condvar,
    socket: UdpSocket,
    /// Whether `socket` is non-blocking (as the receive loop has it), so that a move may
    /// look for its target's answers on it without waiting.
    nonblocking: bool,
    start: Instant,
}

/// Datagrams other than a write's answers a move holds at most, taken off the socket
/// while it reads the copy and applied once it has read it: past them, the rest wait on
/// the socket (and the answers behind them) as they did before.
const HELD_DURING_MOVE: usize = 4096;

impl CollectorHandle {
    pub fn new(core: Collector, socket: UdpSocket) -> CollectorHandle {
        let nonblocking = match socket.set_nonblocking(true) {
            Ok(()) => true,
            Err(e) => {
                log::warn!(
                    "collector: its socket stays blocking ({e}): a move takes its target's \
                     answers only once it has read the copy"
                );
                false
            }
        };
        CollectorHandle {
            nonblocking,
            core: Mutex::new(core),
            sending: Mutex::new(()),
            pump_asked: AtomicBool::new(false),
            report_asked: AtomicBool::new(false),
            settled: Condvar::new(),
            socket,
            start: Instant::now(),
        }
    }

    /// The collector's clock: nanoseconds since it started.
    pub fn now_ns(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    pub fn socket(&self) -> &UdpSocket {
        &self.socket
    }

    /// Runs `f` on the core.
    pub fn with<R>(&self, f: impl FnOnce(&mut Collector) -> R) -> R {
        f(&mut self.core.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Takes a datagram from `from` into the core, and wakes the writes' waits if it
    /// settled a write.
    pub fn receive(&self, now_ns: u64, datagram: &[u8], from: SocketAddr) {
        self.settling(|c| c.on_datagram(now_ns, datagram, from));
    }

    /// Runs `f` on the core, and wakes the writes' waits if it settled a write; what `f`
    /// gave.
    fn settling<R>(&self, f: impl FnOnce(&mut Collector) -> R) -> R {
        let (r, settled) = self.with(|c| {
            let kept = c.outcomes_kept();
            let r = f(c);
            (r, c.outcomes_kept() != kept)
        });
        if settled {
            self.settled.notify_all();
        }
        r
    }

    /// Takes the next datagram waiting on the socket into the core, as
    /// [`CollectorHandle::receive`] does, the core held from the socket's read on: a move
    /// holds the core while it takes its target's answers off the socket, and a datagram
    /// read here meanwhile would reach the core after the answers that came behind it (a
    /// part answered later taken as lost). The socket's error where nothing was read
    /// (`WouldBlock`: nothing waiting).
    pub fn receive_next(&self, datagram: &mut [u8]) -> std::io::Result<()> {
        self.settling(|c| {
            let (n, from) = self.socket.recv_from(datagram)?;
            c.on_datagram(self.now_ns(), &datagram[..n], from);
            Ok(())
        })
    }

    /// Waits until the core has kept more than `seen` outcomes of writes, or `at_most`
    /// has passed, its lock let go meanwhile.
    pub(crate) fn await_outcome(&self, seen: u64, at_most: Duration) {
        let core = self.core.lock().unwrap_or_else(PoisonError::into_inner);
        let waited = self
            .settled
            .wait_timeout_while(core, at_most, |c| c.outcomes_kept() == seen);
        drop(waited.unwrap_or_else(PoisonError::into_inner));
    }

    /// Sends what the core has to send now (the parts of writes due, and reports if
    /// `report`); a send that fails is the next poll's to retry, as a lost datagram is.
    /// The core is let go between polls: a large write's parts are encoded a few at a
    /// time, each few sent before the next are encoded. One thread sends at a time; a
    /// pump that finds another thread sending leaves the pump to it, and returns.
    pub fn pump(&self, report: bool) {
        self.report_asked.fetch_or(report, Ordering::SeqCst);
        self.pump_asked.store(true, Ordering::SeqCst);
        let mut out = Vec::new();
        // An ask made after the sender's last look and before it let go is looked at
        // again here.
        while self.pump_asked.load(Ordering::SeqCst) {
            let _sending = match self.sending.try_lock() {
                Ok(guard) => guard,
                Err(TryLockError::Poisoned(guard)) => guard.into_inner(),
                Err(TryLockError::WouldBlock) => return,
            };
            while self.pump_asked.swap(false, Ordering::SeqCst) {
                self.send_due(&mut out);
            }
        }
    }

    /// Polls the core and sends what it gives until nothing is left to send now (the
    /// caller holds `sending`); `out` is the room the datagrams pass through.
    fn send_due(&self, out: &mut Vec<Outgoing>) {
        self.send_polled(out, |now, out| {
            let report = self.report_asked.swap(false, Ordering::SeqCst);
            self.with(|c| c.poll(now, report, out))
        });
    }

    /// As [`CollectorHandle::send_due`] without reports, for a caller that holds both
    /// `sending` and the core `c` (a move, sending its parts as it reads them).
    fn send_due_from(&self, c: &mut Collector, out: &mut Vec<Outgoing>) {
        self.send_polled(out, |now, out| c.poll(now, false, out));
    }

    /// Sends what `poll` (given the time) puts in `out`, again while it says more is due.
    fn send_polled(
        &self,
        out: &mut Vec<Outgoing>,
        mut poll: impl FnMut(u64, &mut Vec<Outgoing>) -> bool,
    ) {
        loop {
            let more = poll(self.now_ns(), out);
            self.send(out);
            if !more {
                return;
            }
        }
    }

    /// Starts move `m` (`migrate::start`): the copy read with the core held throughout, so
    /// that what moves is the copy of one instant, and its parts sent as it is read, so
    /// that the target takes the first while the rest are read; `sending` is taken first,
    /// as a pump takes it.
    pub(crate) fn start_move(
        &self,
        m: &crate::migrate::Move,
    ) -> Result<crate::migrate::Started, Status> {
        let _sending = (self.sending.lock()).unwrap_or_else(PoisonError::into_inner);
        self.settling(|c| {
            let targets = streams_of(c, m.to_switch, m.to_stream)?;
            let max_values = (targets.iter())
                .map(|&stream| c.max_write_values(m.to_switch, stream))
                .min()
                .unwrap_or(stateplane_sync::write::MAX_VALUES);
            let (mut out, mut held) = (Vec::new(), Vec::new());
            let mut datagram = vec![0u8; 65_536];
            // Between reads: the parts due sent, the target's answers taken (the rest
            // held), and the parts those show lost sent again.
            let between = |c: &mut Collector| {
                self.send_due_from(c, &mut out);
                self.take_answers(c, &mut datagram, &mut held, HELD_DURING_MOVE);
                self.send_due_from(c, &mut out);
            };
            let started = crate::migrate::start(c, m, &targets, max_values, between);
            for (bytes, from) in held.drain(..) {
                c.on_datagram(self.now_ns(), &bytes, from);
            }
            started.map_err(Status::failed_precondition)
        })
    }

    /// Takes what waits on the socket, while `c` is held by a move: a write's answers
    /// into `c` at once, the rest into `held` in the order it came, to be applied once the
    /// copy is read; once `held` has `most` ([`HELD_DURING_MOVE`]), nothing more is read.
    fn take_answers(
        &self,
        c: &mut Collector,
        datagram: &mut [u8],
        held: &mut Vec<(Vec<u8>, SocketAddr)>,
        most: usize,
    ) {
        while self.nonblocking && held.len() < most {
            // Nothing waiting, or an error the receive loop reports when it looks.
            let Ok((n, from)) = self.socket.recv_from(datagram) else {
                return;
            };
            if !c.on_answer_datagram(self.now_ns(), &datagram[..n], from) {
                held.push((datagram[..n].to_vec(), from));
            }
        }
    }

    /// Sends the datagrams in `out`, each in its copies.
    fn send(&self, out: &mut Vec<Outgoing>) {
        for (addr, bytes, copies) in out.drain(..) {
            for _ in 0..copies {
                if let Err(e) = self.socket.send_to(&bytes, addr) {
                    log::debug!("collector: sending to {addr}: {e}");
                }
            }
        }
    }
}

pub struct CollectorService {
    handle: Arc<CollectorHandle>,
}

/// The longest a write's wait goes between looks at the core, each of which sends what
/// is due again; it wakes sooner when a write settles.
const WRITE_LOOK: Duration = Duration::from_micros(100);
/// Changes a subscription takes per look.
const SUBSCRIPTION_BATCH: usize = 4096;

type ChangeStream = Pin<Box<dyn Stream<Item = Result<sync_pb::Change, Status>> + Send>>;

impl CollectorService {
    /// Sends the writes `ids` of `switch` submitted to the core, and waits for them all:
    /// `timeout_ms` (0: 1000) for each of a stream's `writes_per_stream`, as
    /// [`wait_for_writes`] does, on a thread of its own.
    async fn sent_and_awaited(
        &self,
        switch: u32,
        ids: Vec<(u16, WriteTicket)>,
        timeout_ms: u32,
        writes_per_stream: u32,
    ) -> Result<Vec<sync_pb::WriteDone>, Status> {
        self.handle.pump(false);
        let handle = self.handle.clone();
        let timeout = writes_timeout(timeout_ms, writes_per_stream);
        tokio::task::spawn_blocking(move || wait_for_writes(&handle, switch, &ids, timeout))
            .await
            .map_err(|e| Status::internal(format!("the writes' thread failed: {e}")))?
    }
}

#[tonic::async_trait]
impl collector_server::Collector for CollectorService {
    async fn streams(
        &self,
        _: tonic::Request<sync_pb::StreamsRequest>,
    ) -> Result<Response<sync_pb::StreamsReply>, Status> {
        let now = self.handle.now_ns();
        let reply = self.handle.with(|c| {
            let counters = c.counters();
            sync_pb::StreamsReply {
                streams: (c.streams().into_iter())
                    .map(|s| sync_pb::Stream {
                        switch_id: s.switch,
                        stream: u32::from(s.stream),
                        epoch: s.epoch,
                        last_seq: s.last_seq,
                        as_of_ns: s.as_of_ns,
                        age_ns: now.saturating_sub(s.applied_ns),
                        missing: s.missing,
                        threshold: s.threshold,
                        locations: s.locations as u64,
                        writes_in_flight: s.writes_in_flight,
                        extents: (s.extents.iter())
                            .map(|&(state, length)| sync_pb::StateExtent {
                                state: u32::from(state),
                                length,
                            })
                            .collect(),
                        layout: (s.layout.iter())
                            .map(|l| sync_pb::StateLayout {
                                state: u32::from(l.id),
                                length: l.length,
                                stride: l.stride,
                            })
                            .collect(),
                    })
                    .collect(),
                datagrams: c.datagrams,
                applied: counters.applied,
                gaps: counters.gaps,
                missing: counters.missing,
                restarts: counters.restarts,
                repaired: counters.repaired,
                given_up: counters.given_up,
                refused: (c.refused.iter())
                    .map(|(reason, count)| sync_pb::Refusal {
                        reason: reason.to_string(),
                        count: *count,
                    })
                    .collect(),
            }
        });
        Ok(Response::new(reply))
    }

    async fn read(
        &self,
        request: tonic::Request<sync_pb::ReadRequest>,
    ) -> Result<Response<sync_pb::ReadReply>, Status> {
        let r = request.into_inner();
        let state = state_id(r.state)?;
        if r.count > 1 << 20 {
            return Err(Status::invalid_argument(
                "count: read at most 1048576 locations at a time",
            ));
        }
        let not_yet = || Status::not_found("the stream has applied no message yet");
        let (values, bounds, unbounded, as_of_ns) = self.handle.with(|c| {
            let streams = streams_of(c, r.switch_id, r.stream)?;
            if streams.len() > 1
                && let Some(stride) = table_stride(c, r.switch_id, &streams, state)
            {
                return Err(Status::invalid_argument(format!(
                    "state {state} of switch {} is a table (entries of {stride} words), \
                     each worker's own: summed over its streams it means nothing; read one \
                     (--stream N)",
                    r.switch_id
                )));
            }
            let n = r.count as usize;
            // A switch's streams summed: a location is bounded if it is on every one.
            let mut values = vec![0u64; n];
            let mut bounds = Bounds::Unseen;
            let mut unbounded: Vec<u32> = Vec::new();
            let mut as_of_ns = u64::MAX;
            for &stream in &streams {
                let mut stream_bounds = Bounds::Unseen;
                c.visit(
                    (r.switch_id, stream, state),
                    r.first,
                    r.count,
                    |i, reading| {
                        values[i] = values[i].saturating_add(reading.value);
                        match reading.bound {
                            Some(b) => stream_bounds.set(i, b, n),
                            None => unbounded.push(i as u32),
                        }
                        as_of_ns = as_of_ns.min(reading.as_of_ns);
                    },
                )
                .ok_or_else(not_yet)?;
                bounds.add(stream_bounds);
            }
            if streams.len() > 1 {
                unbounded.sort_unstable();
                unbounded.dedup();
            }
            Ok::<_, Status>((values, bounds, unbounded, as_of_ns))
        })?;
        // Built once the lock is let go: the collector's datagrams need not wait for it.
        let (values_le, value_bytes) = packed_le(&values);
        let (bounds_le, every_bound) = match bounds {
            Bounds::Unseen => (prost::bytes::Bytes::new(), Some(0)),
            Bounds::Every(b) => (prost::bytes::Bytes::new(), Some(b)),
            Bounds::Each(mut bounds) => {
                for &i in &unbounded {
                    bounds[i as usize] = 0;
                }
                (packed_le_as(&bounds, 8), None)
            }
        };
        Ok(Response::new(sync_pb::ReadReply {
            first: r.first,
            values_le,
            value_bytes,
            bounds_le,
            every_bound,
            unbounded,
            as_of_ns: if as_of_ns == u64::MAX { 0 } else { as_of_ns },
        }))
    }

    async fn write(
        &self,
        request: tonic::Request<sync_pb::WriteRequest>,
    ) -> Result<Response<sync_pb::WriteReply>, Status> {
        let r = request.into_inner();
        let state = state_id(r.state)?;
        let values: Vec<u64> = if r.values.is_empty() {
            // What any switch stages of one write; the stream's path may allow fewer,
            // which the write engine says.
            let most = stateplane_sync::write::MAX_WRITE_VALUES;
            if r.count as usize > most {
                return Err(Status::invalid_argument(format!(
                    "count: a write holds at most {most} values"
                )));
            }
            vec![r.fill; r.count as usize]
        } else {
            r.values
        };
        if u64::from(r.first) + values.len() as u64 > u64::from(u32::MAX) + 1 {
            return Err(Status::invalid_argument(
                "first + the values: past the last location",
            ));
        }
        let mode = match (r.keep_changes, r.subtract) {
            (true, true) => {
                return Err(Status::invalid_argument(
                    "keep_changes and subtract: a write does one or the other",
                ));
            }
            (true, false) => Mode::SetKeepingChanges,
            (false, true) => Mode::Subtract,
            (false, false) => Mode::Set,
        };
        let mut written: Vec<Written> = (values.iter().enumerate())
            .map(|(i, &value)| Written {
                location: Location {
                    state,
                    index: r.first + i as u32,
                },
                value,
                mode,
            })
            .collect();
        let ids = self.handle.with(|c| {
            let streams = streams_of(c, r.switch_id, r.stream)?;
            let last = streams.len().saturating_sub(1);
            (streams.into_iter().enumerate())
                .map(|(n, stream)| {
                    // Each stream's write its own values: the last takes them, not a copy.
                    let values = if n == last {
                        std::mem::take(&mut written)
                    } else {
                        written.clone()
                    };
                    let id =
                        (c.write(r.switch_id, stream, values)).map_err(Status::invalid_argument)?;
                    Ok((stream, id))
                })
                .collect::<Result<Vec<_>, Status>>()
        })?;
        let done = self
            .sent_and_awaited(r.switch_id, ids, r.timeout_ms, 1)
            .await?;
        Ok(Response::new(sync_pb::WriteReply { done }))
    }

    async fn migrate(
        &self,
        request: tonic::Request<sync_pb::MigrateRequest>,
    ) -> Result<Response<sync_pb::MigrateReply>, Status> {
        let r = request.into_inner();
        let m = crate::migrate::Move {
            from_switch: r.from_switch,
            from_stream: r.from_stream,
            to_switch: r.to_switch,
            to_stream: r.to_stream,
            state: r.state,
            entry_words: r.entry_words,
            timeout_ms: r.timeout_ms,
        };
        // Reading a large copy takes milliseconds, and its writes are waited for: on a
        // thread of its own, so that the API's other calls go on meanwhile (one thread for
        // both: each hand-over between threads is a wake-up, tenths of a millisecond on a
        // busy host).
        let handle = self.handle.clone();
        let (started, done) = tokio::task::spawn_blocking(move || {
            let started = handle.start_move(&m)?;
            handle.pump(false);
            // Each write its own time, as a stream commits them one after another.
            let timeout = writes_timeout(r.timeout_ms, started.writes_per_stream);
            let done = wait_for_writes(&handle, r.to_switch, &started.writes, timeout)?;
            Ok::<_, Status>((started, done))
        })
        .await
        .map_err(|e| Status::internal(format!("the move's thread failed: {e}")))??;
        Ok(Response::new(sync_pb::MigrateReply {
            read: started.read,
            entries: started.entries,
            values: started.values,
            largest_bound: started.largest_bound,
            done,
        }))
    }

    type SubscribeStream = ChangeStream;

    async fn subscribe(
        &self,
        request: tonic::Request<sync_pb::SubscribeRequest>,
    ) -> Result<Response<ChangeStream>, Status> {
        let r = request.into_inner();
        let handle = self.handle.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        tokio::spawn(async move {
            let mut cursor = handle.with(|c| c.next_change()) - 1;
            loop {
                let (changes, missed) =
                    handle.with(|c| c.changes_after(cursor, SUBSCRIPTION_BATCH));
                let mut missed = missed;
                if changes.is_empty() {
                    if tx.is_closed() {
                        return;
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                for a in changes {
                    cursor = a.number;
                    let wanted = r.switch_id.is_none_or(|s| s == a.switch)
                        && r.state.is_none_or(|s| s == u32::from(a.location.state));
                    if !wanted {
                        continue;
                    }
                    let change = sync_pb::Change {
                        number: a.number,
                        switch_id: a.switch,
                        stream: u32::from(a.stream),
                        state: u32::from(a.location.state),
                        index: a.location.index,
                        value: a.value,
                        as_of_ns: a.as_of_ns,
                        missed: std::mem::take(&mut missed),
                    };
                    if tx.send(Ok(change)).await.is_err() {
                        return;
                    }
                }
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }
}

fn state_id(state: u32) -> Result<u16, Status> {
    u16::try_from(state).map_err(|_| Status::invalid_argument("state: a state id is 0 to 65535"))
}

/// The streams a request names: `stream`, or every stream of `switch`.
/// The words of an entry of `state` where any of `streams` announced it a table (more
/// than one word an entry).
fn table_stride(c: &Collector, switch: u32, streams: &[u16], state: u16) -> Option<u32> {
    (streams.iter())
        .flat_map(|&stream| c.layout(switch, stream))
        .find(|l| l.id == state && l.stride > 1)
        .map(|l| l.stride)
}

fn streams_of(c: &Collector, switch: u32, stream: Option<u32>) -> Result<Vec<u16>, Status> {
    let known = c.streams_of(switch);
    if known.is_empty() {
        return Err(Status::not_found(format!(
            "switch {switch} has sent nothing to this collector"
        )));
    }
    match stream {
        None => Ok(known),
        Some(s) => match u16::try_from(s).ok().filter(|s| known.contains(s)) {
            Some(s) => Ok(vec![s]),
            None => Err(Status::not_found(format!(
                "switch {switch} has no stream {s} (it has {known:?})"
            ))),
        },
    }
}

/// How long writes wait for their stream to commit them: `timeout_ms` each (1 s for 0),
/// `writes_per_stream` one after another.
fn writes_timeout(timeout_ms: u32, writes_per_stream: u32) -> Duration {
    let per_write = Duration::from_millis(match timeout_ms {
        0 => 1000,
        t => u64::from(t),
    });
    per_write * writes_per_stream.max(1)
}

/// Waits until every write `ids` names has committed, sending their parts again as they
/// fall due. Past `timeout` the writes not committed are cancelled (so that none lands
/// later unseen) and their answers awaited a while; a write given up, or cancelled, is an
/// error that says which streams committed and what became of the others.
fn wait_for_writes(
    handle: &CollectorHandle,
    switch: u32,
    ids: &[(u16, WriteTicket)],
    timeout: Duration,
) -> Result<Vec<sync_pb::WriteDone>, Status> {
    let start = Instant::now();
    let mut done = Vec::new();
    let mut failed: Vec<String> = Vec::new();
    let mut waiting: Vec<(u16, WriteTicket)> = ids.to_vec();
    // When the writes still waiting were cancelled, and which streams they were.
    let mut cancelled: Option<(Instant, Vec<u16>)> = None;
    let answer_wait = timeout.clamp(Duration::from_millis(100), Duration::from_secs(1));
    while !waiting.is_empty() {
        let seen = handle.with(|c| {
            waiting.retain(
                |&(stream, write)| match c.take_write(switch, stream, write) {
                    None => true,
                    Some(Ok(d)) => {
                        done.push(sync_pb::WriteDone {
                            stream: u32::from(stream),
                            id: write.id,
                            parts: d.parts,
                            latency_ns: d.latency_ns,
                            transmissions: d.transmissions,
                            refused: d.refused,
                        });
                        false
                    }
                    Some(Err(why)) => {
                        failed.push(format!("stream {stream}: {why}"));
                        false
                    }
                },
            );
            c.outcomes_kept()
        });
        if waiting.is_empty() {
            break;
        }
        match &cancelled {
            None if start.elapsed() >= timeout => {
                handle.with(|c| {
                    for &(stream, write) in &waiting {
                        c.cancel(switch, stream, write);
                    }
                });
                let streams = waiting.iter().map(|w| w.0).collect();
                cancelled = Some((Instant::now(), streams));
            }
            Some((at, _)) if at.elapsed() >= answer_wait => {
                for &(stream, _) in &waiting {
                    failed.push(format!(
                        "stream {stream}: the cancel is unanswered (the switch may be gone): \
                         none of the write is sent again, and it committed only if the \
                         switch held all of it already"
                    ));
                }
                break;
            }
            _ => {}
        }
        handle.await_outcome(seen, WRITE_LOOK);
        handle.pump(false);
    }
    done.sort_by_key(|d| d.stream);
    if failed.is_empty() {
        return Ok(done);
    }
    let committed: Vec<u32> = done.iter().map(|d| d.stream).collect();
    let what = format!("{}; committed on streams {committed:?}", failed.join("; "));
    Err(match cancelled {
        Some((_, streams)) => Status::deadline_exceeded(format!(
            "streams {streams:?} had not committed the write after {} ms, so it was \
             cancelled: {what}",
            timeout.as_millis()
        )),
        None => Status::aborted(format!("the write was given up: {what}")),
    })
}

/// The bounds of a read's locations: one for all while they are the same, each once they
/// differ. Where a location is unbounded its entry means nothing.
enum Bounds {
    /// No bounded location seen yet.
    Unseen,
    Every(u64),
    Each(Vec<u64>),
}

impl Bounds {
    /// Location `i` of `n` is within `bound` (locations are set in order, from 0).
    fn set(&mut self, i: usize, bound: u64, n: usize) {
        match self {
            Bounds::Unseen => *self = Bounds::Every(bound),
            Bounds::Every(b) if *b == bound => {}
            Bounds::Every(b) => {
                // Up to i all bounded locations had `b`; the unbounded ones' do not matter.
                let mut each = vec![*b; n];
                each[i] = bound;
                *self = Bounds::Each(each);
            }
            Bounds::Each(each) => each[i] = bound,
        }
    }

    /// The sum of `self` and `other`, location by location.
    fn add(&mut self, other: Bounds) {
        *self = match (std::mem::replace(self, Bounds::Unseen), other) {
            (a, Bounds::Unseen) => a,
            (Bounds::Unseen, b) => b,
            (Bounds::Every(a), Bounds::Every(b)) => Bounds::Every(a.saturating_add(b)),
            (Bounds::Every(a), Bounds::Each(mut each))
            | (Bounds::Each(mut each), Bounds::Every(a)) => {
                each.iter_mut().for_each(|b| *b = b.saturating_add(a));
                Bounds::Each(each)
            }
            (Bounds::Each(mut each), Bounds::Each(other)) => {
                (each.iter_mut().zip(other)).for_each(|(b, o)| *b = b.saturating_add(o));
                Bounds::Each(each)
            }
        }
    }
}

/// `words` as little-endian words of as few bytes as the largest needs (1, 2, 4 or 8),
/// one after another; and that width.
fn packed_le(words: &[u64]) -> (prost::bytes::Bytes, u32) {
    let largest = words.iter().copied().max().unwrap_or(0);
    let width = match largest {
        0..=0xff => 1,
        0x100..=0xffff => 2,
        0x1_0000..=0xffff_ffff => 4,
        _ => 8,
    };
    (packed_le_as(words, width), width as u32)
}

/// `words` as little-endian words of `width` bytes (each fits).
fn packed_le_as(words: &[u64], width: usize) -> prost::bytes::Bytes {
    /// One width a loop, so that each word's bytes are copied by a fixed-size move (a
    /// width known only at run time made a call to memcpy of each word).
    fn packed<const W: usize>(words: &[u64]) -> Vec<u8> {
        let mut bytes = vec![0u8; words.len() * W];
        for (to, w) in bytes.chunks_exact_mut(W).zip(words) {
            to.copy_from_slice(&w.to_le_bytes()[..W]);
        }
        bytes
    }
    match width {
        1 => packed::<1>(words),
        2 => packed::<2>(words),
        4 => packed::<4>(words),
        _ => packed::<8>(words),
    }
    .into()
}

/// The words of `bytes`, little-endian, `width` bytes each (1, 2, 4 or 8); `None` if the
/// width is none of those or the length is not a multiple of it.
fn words_of_le(bytes: &[u8], width: u32) -> Option<Vec<u64>> {
    fn words<const W: usize>(bytes: &[u8]) -> Vec<u64> {
        (bytes.chunks_exact(W))
            .map(|w| {
                let mut word = [0; 8];
                word[..W].copy_from_slice(w);
                u64::from_le_bytes(word)
            })
            .collect()
    }
    if !bytes.len().is_multiple_of(width.max(1) as usize) {
        return None;
    }
    match width {
        1 => Some(words::<1>(bytes)),
        2 => Some(words::<2>(bytes)),
        4 => Some(words::<4>(bytes)),
        8 => Some(words::<8>(bytes)),
        _ => None,
    }
}

/// A read as the client returns it: `values[i]` is location `first + i`'s, within
/// `bounds[i]` of the data plane's unless `i` is in `unbounded`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadValues {
    pub first: u32,
    pub values: Vec<u64>,
    pub bounds: Vec<u64>,
    pub unbounded: Vec<u32>,
    pub as_of_ns: u64,
}

/// Serves the collector's API on `addr` (loopback only: it takes no TLS settings).
pub fn serve(addr: SocketAddr, handle: Arc<CollectorHandle>) -> Result<Server, String> {
    if !addr.ip().is_loopback() {
        return Err(format!(
            "the collector API has no authentication (it takes no TLS settings), so it \
             listens on loopback only; give 127.0.0.1:{} instead of {addr}",
            addr.port()
        ));
    }
    let listen = crate::endpoint::Listen::Tcp { addr, guard: None };
    Server::serve(&listen, "collector API", move |mut builder, token| {
        builder.add_service(collector_server::CollectorServer::with_interceptor(
            CollectorService { handle },
            token,
        ))
    })
}

/// A blocking client of the collector's API (what `stateplane ctl sync` and tests use).
pub struct CollectorClient {
    runtime: tokio::runtime::Runtime,
    inner: collector_client::CollectorClient<tonic::transport::Channel>,
}

use crate::client::ClientError;
use crate::sync_pb::collector_client;

impl CollectorClient {
    /// Connects to the collector's API at `addr` (`host:port`).
    pub fn connect(addr: &str) -> Result<CollectorClient, ClientError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| ClientError {
                code: tonic::Code::Internal,
                message: format!("cannot start a runtime: {e}"),
            })?;
        let hint = format!("is `stateplane collector` running with --api {addr}?");
        let files = crate::endpoint::ClientFiles::default();
        let (channel, _no_token) = runtime.block_on(crate::endpoint::connect(
            addr,
            &files,
            "collector's API",
            &hint,
        ))?;
        let inner = collector_client::CollectorClient::new(channel);
        Ok(CollectorClient { runtime, inner })
    }

    pub fn streams(&mut self) -> Result<sync_pb::StreamsReply, ClientError> {
        let call = self.inner.streams(sync_pb::StreamsRequest {});
        Ok(self.runtime.block_on(call)?.into_inner())
    }

    pub fn read(&mut self, request: sync_pb::ReadRequest) -> Result<ReadValues, ClientError> {
        let call = self.inner.read(request);
        let reply = self.runtime.block_on(call)?.into_inner();
        let malformed = |what: &str| ClientError {
            code: tonic::Code::Internal,
            message: format!("the collector's read reply is malformed: {what}"),
        };
        let values = words_of_le(&reply.values_le, reply.value_bytes)
            .ok_or_else(|| malformed("its values are not whole words of 1, 2, 4 or 8 bytes"))?;
        let bounds = match reply.every_bound {
            Some(b) if reply.bounds_le.is_empty() => {
                let mut bounds = vec![b; values.len()];
                for &i in &reply.unbounded {
                    if let Some(bound) = bounds.get_mut(i as usize) {
                        *bound = 0;
                    }
                }
                bounds
            }
            _ => words_of_le(&reply.bounds_le, 8)
                .ok_or_else(|| malformed("its bounds are not whole 8-byte words"))?,
        };
        if values.len() != bounds.len() {
            return Err(malformed("it has not as many bounds as values"));
        }
        Ok(ReadValues {
            first: reply.first,
            values,
            bounds,
            unbounded: reply.unbounded,
            as_of_ns: reply.as_of_ns,
        })
    }

    pub fn write(
        &mut self,
        request: sync_pb::WriteRequest,
    ) -> Result<sync_pb::WriteReply, ClientError> {
        let call = self.inner.write(request);
        Ok(self.runtime.block_on(call)?.into_inner())
    }

    pub fn migrate(
        &mut self,
        request: sync_pb::MigrateRequest,
    ) -> Result<sync_pb::MigrateReply, ClientError> {
        let call = self.inner.migrate(request);
        Ok(self.runtime.block_on(call)?.into_inner())
    }

    /// Calls `each` with every change applied from now on, until it returns false or
    /// `quiet` passes without one.
    pub fn subscribe(
        &mut self,
        request: sync_pb::SubscribeRequest,
        quiet: Option<Duration>,
        mut each: impl FnMut(&sync_pb::Change) -> bool,
    ) -> Result<(), ClientError> {
        let inner = &mut self.inner;
        self.runtime.block_on(async move {
            let mut stream = inner.subscribe(request).await?.into_inner();
            loop {
                let next = match quiet {
                    Some(q) => match tokio::time::timeout(q, stream.message()).await {
                        Ok(m) => m?,
                        Err(_) => return Ok(()),
                    },
                    None => stream.message().await?,
                };
                match next {
                    Some(change) if each(&change) => {}
                    _ => return Ok(()),
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A move holds what is not an answer in the order it came, up to its bound, and
    /// leaves the rest on the socket, where the receive loop takes it after the move.
    #[test]
    fn a_move_holds_no_more_than_its_bound_and_leaves_the_rest_waiting() {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        let at = socket.local_addr().unwrap();
        let handle = CollectorHandle::new(Collector::new(None, None), socket);
        let peer = UdpSocket::bind("127.0.0.1:0").unwrap();
        for bytes in [b"one", b"two", b"3rd"] {
            peer.send_to(bytes, at).unwrap();
        }
        let (mut datagram, mut held) = (vec![0; 64], Vec::new());
        handle.with(|c| handle.take_answers(c, &mut datagram, &mut held, 2));
        let kept: Vec<&[u8]> = held.iter().map(|(bytes, _)| &bytes[..]).collect();
        assert_eq!(kept, [b"one", b"two"]);
        assert!(
            held.iter()
                .all(|&(_, from)| from == peer.local_addr().unwrap())
        );
        handle.with(|c| handle.take_answers(c, &mut datagram, &mut held, 2));
        assert_eq!(held.len(), 2, "full: nothing more read");
        let (n, _) = handle.socket().recv_from(&mut datagram).unwrap();
        assert_eq!(&datagram[..n], b"3rd", "left waiting");
        assert!(handle.receive_next(&mut datagram).is_err(), "nothing more");
        assert_eq!(handle.with(|c| c.datagrams), 0, "none taken into the core");
    }

    #[test]
    fn words_go_as_little_endian_bytes_as_narrow_as_the_largest_and_torn_ones_are_refused() {
        let words = [0, 1, u64::MAX, 0x0102_0304_0506_0708];
        let (bytes, width) = packed_le(&words);
        assert_eq!((bytes.len(), width), (32, 8));
        assert_eq!(&bytes[24..32], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(words_of_le(&bytes, 8), Some(words.to_vec()));
        assert_eq!(words_of_le(&bytes[..31], 8), None);
        assert_eq!(words_of_le(&bytes, 3), None);
        assert_eq!(words_of_le(&[], 8), Some(Vec::new()));
        for (words, want) in [
            (vec![0, 255], 1),
            (vec![256, 7], 2),
            (vec![65_536], 4),
            (vec![u64::from(u32::MAX)], 4),
            (vec![1 << 32], 8),
            (vec![], 1),
        ] {
            let (bytes, width) = packed_le(&words);
            assert_eq!(width, want, "{words:?}");
            assert_eq!(bytes.len(), words.len() * want as usize);
            assert_eq!(words_of_le(&bytes, width), Some(words));
        }
    }

    /// The bounds of one stream's locations, as a read's walk sets them.
    fn walked(bounds: &[Option<u64>]) -> Bounds {
        let mut walked = Bounds::Unseen;
        for (i, b) in bounds.iter().enumerate() {
            if let Some(b) = b {
                walked.set(i, *b, bounds.len());
            }
        }
        walked
    }

    fn each(bounds: Bounds, n: usize) -> Vec<u64> {
        match bounds {
            Bounds::Unseen => vec![0; n],
            Bounds::Every(b) => vec![b; n],
            Bounds::Each(each) => each,
        }
    }

    #[test]
    fn bounds_stay_one_while_they_agree_and_sum_location_by_location_across_streams() {
        assert!(matches!(
            walked(&[None, Some(4), None, Some(4)]),
            Bounds::Every(4)
        ));
        assert!(matches!(walked(&[None, None]), Bounds::Unseen));
        let mut sum = walked(&[Some(4), None, Some(9), Some(4)]);
        assert_eq!(
            each(walked(&[Some(4), None, Some(9), Some(4)]), 4)[2..],
            [9, 4]
        );
        sum.add(walked(&[Some(1), Some(1), Some(1), Some(1)]));
        assert_eq!(
            each(sum, 4)
                .iter()
                .enumerate()
                .filter(|&(i, _)| i != 1)
                .map(|(_, b)| *b)
                .collect::<Vec<_>>(),
            [5, 10, 5]
        );
        let mut sum = walked(&[Some(2), Some(2)]);
        sum.add(walked(&[Some(u64::MAX), Some(3)]));
        assert_eq!(each(sum, 2), [u64::MAX, 5], "sums saturate");
        let mut sum = walked(&[Some(2), Some(2)]);
        sum.add(Bounds::Unseen);
        assert!(matches!(sum, Bounds::Every(2)));
    }
}
