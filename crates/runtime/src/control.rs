//! The control plane's path to the workers' state.
//!
//! Owns: versioning control requests, handing each one to every worker, collecting their
//! answers into one reply, and fanning data-plane notifications out to subscribers.
//!
//! Must never: touch program state from its own thread (a worker applies each request to
//! its own program between two bursts, so the fast path takes no lock), or let a slow
//! subscriber hold up a worker (notifications beyond a subscriber's queue are dropped and
//! counted).
//!
//! The guarantee: a request is checked against the program's declarations first, so a
//! malformed one reaches no worker. A worker applies a request whole between two bursts
//! (all of a write's entries or none of them) and never in the middle of one; `submit`
//! returns once every worker has, with the request's version. So a packet a worker takes
//! after the reply is processed with the change, on every worker.

use crate::program::{Context, Prepared, Running};
pub use crossbeam_channel::{Receiver, RecvTimeoutError};
use crossbeam_channel::{Sender, TrySendError};
use stateplane_api::{self as control, ControlError, Declaration, Entry, Notification, Reply};
use stateplane_api::{FlowChange, FlowStat, Match, Request, Write};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// How long `submit` waits for every worker before it answers `Unavailable`.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Notifications a subscriber may have waiting before newer ones are dropped for it.
const SUBSCRIBER_QUEUE: usize = 65_536;

struct Job {
    version: u64,
    request: Arc<Request>,
    prepared: Option<Prepared>,
    answer: Sender<Result<Reply, ControlError>>,
}

struct Next {
    version: u64,
    preparer: Box<dyn Running>,
}

/// A reply and the version at which it took effect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub version: u64,
    pub reply: Reply,
}

/// The control plane's side: shared by the API server's threads.
pub struct ControlPlane {
    workers: Vec<Sender<Job>>,
    /// What the running program declares: shared, so a request's check copies nothing.
    declarations: Mutex<Arc<[Declaration]>>,
    /// Serializes requests, so versions are applied in order on every worker, and holds
    /// the instance of the program that prepares them.
    next: Mutex<Next>,
    subscribers: Mutex<Vec<Sender<Notification>>>,
    /// Notifications dropped for slow subscribers, and by programs whose outbox was full.
    pub notifications_dropped: AtomicU64,
    applied: Vec<Arc<AtomicU64>>,
}

/// A worker's side: polled by the worker between bursts.
pub struct WorkerControl {
    jobs: Receiver<Job>,
    applied: Arc<AtomicU64>,
    plane: Arc<ControlPlane>,
    notifications: Vec<Notification>,
}

impl ControlPlane {
    /// A control plane for `workers` workers running the program `preparer` is an instance
    /// of (from the same factory); returns each worker's end.
    pub fn new(workers: usize, preparer: Box<dyn Running>) -> (Arc<Self>, Vec<WorkerControl>) {
        let (senders, receivers): (Vec<_>, Vec<_>) = (0..workers)
            .map(|_| crossbeam_channel::bounded::<Job>(64))
            .unzip();
        let applied: Vec<_> = (0..workers).map(|_| Arc::new(AtomicU64::new(0))).collect();
        let plane = Arc::new(ControlPlane {
            workers: senders,
            declarations: Mutex::new(preparer.declarations().into()),
            next: Mutex::new(Next {
                version: 0,
                preparer,
            }),
            subscribers: Mutex::new(Vec::new()),
            notifications_dropped: AtomicU64::new(0),
            applied: applied.clone(),
        });
        let ends = receivers
            .into_iter()
            .zip(applied)
            .map(|(jobs, applied)| WorkerControl {
                jobs,
                applied,
                plane: plane.clone(),
                notifications: Vec::new(),
            })
            .collect();
        (plane, ends)
    }

    /// What the running program declares (a shared list: a reference count, no copy).
    pub fn declarations(&self) -> Arc<[Declaration]> {
        self.declarations
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Takes an instance of a reloaded program: its declarations, and what prepares
    /// requests from now on.
    pub fn set_program(&self, preparer: Box<dyn Running>) {
        let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
        *self
            .declarations
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = preparer.declarations().into();
        next.preparer = preparer;
    }

    /// The version every worker has applied.
    pub fn version(&self) -> u64 {
        self.applied
            .iter()
            .map(|a| a.load(Ordering::Acquire))
            .min()
            .unwrap_or(0)
    }

    /// Checks `request`, has every worker apply it between two bursts, and merges their
    /// answers. Blocks until all have answered (or [`ANSWER_TIMEOUT`]).
    pub fn submit(&self, request: Request) -> Result<Applied, ControlError> {
        control::find(&self.declarations(), request.target())?.check(&request)?;
        let mut next = self.next.lock().unwrap_or_else(PoisonError::into_inner);
        let prepared = next.preparer.prepare(&request)?;
        let version = next.version + 1;
        // Taken even if a worker cannot be reached: some may have the request already.
        next.version = version;
        let request = Arc::new(request);
        let (answer, answers) = crossbeam_channel::bounded(self.workers.len());
        for w in &self.workers {
            let job = Job {
                version,
                request: request.clone(),
                prepared: prepared.clone(),
                answer: answer.clone(),
            };
            w.send_timeout(job, ANSWER_TIMEOUT)
                .map_err(|_| ControlError::Unavailable)?;
        }
        let mut replies = Vec::with_capacity(self.workers.len());
        for _ in &self.workers {
            replies.push(
                answers
                    .recv_timeout(ANSWER_TIMEOUT)
                    .map_err(|_| ControlError::Unavailable)?,
            );
        }
        merge(&request, replies).map(|reply| Applied { version, reply })
    }

    /// Every entry of `table` (or the one with `key`), page by page, so that no worker is
    /// held longer than a page takes; entries merged by key over workers and pages. The
    /// version is the last page's: entries changed by the data plane meanwhile may show as
    /// they were when their page was read.
    pub fn read(&self, table: &str, key: Option<Vec<Match>>) -> Result<Applied, ControlError> {
        let mut from = 0;
        let mut all = Gathered::default();
        loop {
            let request = Request::Read {
                table: table.to_string(),
                key: key.clone(),
                from,
            };
            let done = self.submit(request)?;
            let Reply::Page(entries, next) = done.reply else {
                return Err(ControlError::Unavailable);
            };
            all.add(entries);
            match next {
                Some(n) if n > from => from = n,
                _ => {
                    return Ok(Applied {
                        version: done.version,
                        reply: Reply::Entries(all.entries),
                    });
                }
            }
        }
    }

    /// A stream of the data plane's notifications from now on.
    pub fn subscribe(&self) -> Receiver<Notification> {
        let (tx, rx) = crossbeam_channel::bounded(SUBSCRIBER_QUEUE);
        self.subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(tx);
        rx
    }

    fn publish(&self, notifications: &mut Vec<Notification>) {
        let mut subs = self
            .subscribers
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        for n in notifications.drain(..) {
            subs.retain(|s| match s.try_send(n.clone()) {
                Ok(()) => true,
                Err(TrySendError::Full(_)) => {
                    self.notifications_dropped.fetch_add(1, Ordering::Relaxed);
                    true
                }
                Err(TrySendError::Disconnected(_)) => false,
            });
        }
    }
}

/// Entries from several workers or pages, merged by key with their hits summed.
#[derive(Default)]
struct Gathered {
    entries: Vec<Entry>,
    at: HashMap<Vec<Match>, usize>,
}

impl Gathered {
    fn add(&mut self, entries: Vec<Entry>) {
        for e in entries {
            match self.at.get(&e.key) {
                Some(&i) => self.entries[i].hits += e.hits,
                None => {
                    self.at.insert(e.key.clone(), self.entries.len());
                    self.entries.push(e);
                }
            }
        }
    }
}

/// One answer from the answers of all workers. Each worker holds its own copy of a table
/// (the same entries, for tables the control plane fills) or its own shard (tables the data
/// plane fills), so entries are merged by key with their hits summed, register values are
/// summed, counters are summed by name, meter settings (the same on every worker) taken
/// from the first, and a delete succeeds if some worker held the key.
fn merge(
    request: &Request,
    replies: Vec<Result<Reply, ControlError>>,
) -> Result<Reply, ControlError> {
    let deletes_only = matches!(request, Request::Write { writes, .. }
        if writes.iter().all(|w| matches!(w, Write::Delete(_))));
    let reads_one = matches!(request, Request::Read { key: Some(_), .. });
    let mut first_error = None;
    let mut ok = Vec::new();
    for r in replies {
        match r {
            Ok(reply) => ok.push(reply),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    match first_error {
        Some(e) if ok.is_empty() || !(deletes_only || reads_one) => return Err(e),
        _ => {}
    }
    let mut entries = Gathered::default();
    let mut values: Vec<u128> = Vec::new();
    let mut counters: Vec<(&'static str, u64)> = Vec::new();
    let mut meters = None;
    let mut next = None;
    // Rules by id: every worker holds the same rules under the same ids.
    let mut flows: std::collections::BTreeMap<u64, FlowStat> = Default::default();
    for reply in ok {
        match reply {
            Reply::Done => {}
            Reply::Page(es, n) => {
                next = next.max(n);
                entries.add(es);
            }
            Reply::Entries(es) => entries.add(es),
            // Every worker holds the same settings: the first answer says them.
            Reply::Meters(ms) => {
                meters.get_or_insert(ms);
            }
            Reply::Counters(cs) => {
                for (name, v) in cs {
                    match counters.iter_mut().find(|(n, _)| *n == name) {
                        Some((_, sum)) => *sum += v,
                        None => counters.push((name, v)),
                    }
                }
            }
            Reply::Values(vs) => {
                values.resize(values.len().max(vs.len()), 0);
                for (sum, v) in values.iter_mut().zip(vs) {
                    *sum = sum.wrapping_add(v);
                }
            }
            Reply::Flows(fs) => {
                for f in fs {
                    let (packets, bytes) = (f.packets, f.bytes);
                    let sum = flows.entry(f.id).or_insert(FlowStat {
                        packets: 0,
                        bytes: 0,
                        ..f
                    });
                    sum.packets += packets;
                    sum.bytes += bytes;
                }
            }
        }
    }
    let mut flows: Vec<FlowStat> = flows.into_values().collect();
    flows.sort_by_key(|f| (f.table, std::cmp::Reverse(f.priority), f.id));
    Ok(match request {
        Request::Read { .. } => Reply::Page(entries.entries, next),
        Request::ReadRegister { .. } => Reply::Values(values),
        Request::Stats { .. } => Reply::Counters(counters),
        Request::ReadMeter { .. } => Reply::Meters(meters.unwrap_or_default()),
        Request::Flows {
            change: FlowChange::Add(_),
            ..
        } => Reply::Done,
        Request::Flows { .. } => Reply::Flows(flows),
        _ => Reply::Done,
    })
}

impl WorkerControl {
    /// Hands the control plane an instance of a reloaded program (worker 0 does).
    pub fn reloaded(&self, preparer: Box<dyn Running>) {
        self.plane.set_program(preparer);
    }

    /// Applies waiting requests to `program` and hands its notifications on. Called by the
    /// worker between bursts; costs one atomic load when nothing waits.
    pub fn poll(&mut self, program: &mut dyn Running, ctx: &Context) {
        while let Ok(job) = self.jobs.try_recv() {
            let answer = program.control(&job.request, job.prepared.as_ref(), ctx);
            self.applied.store(job.version, Ordering::Release);
            // The submitter may have given up waiting; the change stands either way.
            let _ = job.answer.send(answer);
        }
        program.notifications(&mut self.notifications);
        if !self.notifications.is_empty() {
            self.plane.publish(&mut self.notifications);
        }
    }
}
