//! The control plane's path to the workers' state.
//!
//! Owns: versioning control requests (a client's, and those a program makes of it, such as
//! a rule's expiry), handing each one to every worker, collecting their answers into one
//! reply, and fanning data-plane notifications out to subscribers, with one flow-removed
//! notification for each rule a request removed, its counters summed over workers.
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
//! after the reply is processed with the change, on every worker. A program's own
//! requests are versioned the same way, in the same order, but nobody waits for them: the
//! last worker to apply one merges the answers.

use crate::program::{Context, Prepared, Running};
pub use crossbeam_channel::{Receiver, RecvTimeoutError};
use crossbeam_channel::{Sender, TrySendError};
use stateplane_api::{self as control, ControlError, Declaration, Entry, Notification, Reply};
use stateplane_api::{FlowChange, FlowStat, Match, NotificationKind, RemovedReason, Request};
use stateplane_api::{Kind, WorkerCounters, Write};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, TryLockError, Weak};
use std::time::Duration;

/// How long `submit` waits for every worker before it answers `Unavailable`.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// Notifications a subscriber may have waiting before newer ones are dropped for it.
const SUBSCRIBER_QUEUE: usize = 65_536;

struct Job {
    version: u64,
    request: Arc<Request>,
    prepared: Option<Prepared>,
    answer: Answer,
}

/// Where a worker's answer goes.
enum Answer {
    /// To a client's `submit`, waiting for every worker's.
    Waiting(Sender<Result<Reply, ControlError>>),
    /// Into the answers to a program's own request, which nobody waits for.
    Gathered(Arc<Gather>),
}

/// The answers to a program's own request, merged by the last worker to apply it.
struct Gather {
    request: Arc<Request>,
    replies: Mutex<Vec<Result<Reply, ControlError>>>,
    remaining: AtomicUsize,
    plane: Weak<ControlPlane>,
}

impl Gather {
    fn add(&self, answer: Result<Reply, ControlError>) {
        let mut replies = self.replies.lock().unwrap_or_else(PoisonError::into_inner);
        replies.push(answer);
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1
            && let Some(plane) = self.plane.upgrade()
            && let Ok(reply) = merge(&self.request, std::mem::take(&mut *replies))
        {
            plane.publish(&mut removals(&self.request, &reply));
        }
    }
}

/// One flow-removed notification for each rule `reply` says `request` removed.
fn removals(request: &Request, reply: &Reply) -> Vec<Notification> {
    let (Request::Flows { name, change }, flows) = (request, reply) else {
        return Vec::new();
    };
    let flows = match flows {
        Reply::Flows(flows) | Reply::Replaced { removed: flows, .. } => flows,
        _ => return Vec::new(),
    };
    // By id, so that a mass expiry costs one pass, not one search per rule.
    let expired: HashMap<u64, RemovedReason> = match change {
        FlowChange::Expire(expired) => expired.iter().map(|e| (e.id, e.reason)).collect(),
        _ => HashMap::new(),
    };
    let reason = |id| match change {
        FlowChange::Delete(_) | FlowChange::Replace { .. } => Some(RemovedReason::Delete),
        FlowChange::Expire(_) => expired.get(&id).copied(),
        _ => None,
    };
    (flows.iter())
        .filter_map(|f| {
            Some(Notification {
                table: name.clone(),
                kind: NotificationKind::FlowRemoved {
                    reason: reason(f.id)?,
                    flow: f.clone(),
                },
                entry: Entry {
                    key: Vec::new(),
                    action: String::new(),
                    params: Vec::new(),
                    priority: 0,
                    hits: f.packets,
                },
                at_ns: f.at_ns,
            })
        })
        .collect()
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
    /// A program's own requests that its declarations refused.
    pub requests_refused: AtomicU64,
    applied: Vec<Arc<AtomicU64>>,
    /// Each ended worker's last answers to a stats request, by table: what a scrape that
    /// comes after the workers (a run over files that has ended) is answered from.
    last_stats: Mutex<Vec<(String, Result<Reply, ControlError>)>>,
    ended: AtomicU64,
}

/// A worker's side: polled by the worker between bursts.
pub struct WorkerControl {
    jobs: Receiver<Job>,
    applied: Arc<AtomicU64>,
    plane: Arc<ControlPlane>,
    notifications: Vec<Notification>,
    /// The program's own requests not sent yet.
    requests: Vec<Request>,
}

impl ControlPlane {
    /// A control plane for `workers` workers running the program `preparer` is an instance
    /// of (from the same factory); returns each worker's end.
    /// How many workers the control plane reaches.
    pub fn worker_count(&self) -> usize {
        self.workers.len()
    }

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
            requests_refused: AtomicU64::new(0),
            applied: applied.clone(),
            last_stats: Mutex::new(Vec::new()),
            ended: AtomicU64::new(0),
        });
        let ends = receivers
            .into_iter()
            .zip(applied)
            .map(|(jobs, applied)| WorkerControl {
                jobs,
                applied,
                plane: plane.clone(),
                notifications: Vec::new(),
                requests: Vec::new(),
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
        if let Request::Stats { table } = &request
            && self.ended.load(Ordering::Acquire) == self.workers.len() as u64
        {
            return self.last_stats_of(&request, table);
        }
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
                answer: Answer::Waiting(answer.clone()),
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
        let reply = merge(&request, replies)?;
        self.publish(&mut removals(&request, &reply));
        Ok(Applied { version, reply })
    }

    /// Every worker's last answer to a stats request on `table`, merged, at the version
    /// they ended with.
    fn last_stats_of(&self, request: &Request, table: &str) -> Result<Applied, ControlError> {
        let last = self
            .last_stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let replies = (last.iter())
            .filter(|(name, _)| name == table)
            .map(|(_, reply)| reply.clone())
            .collect();
        let reply = merge(request, replies)?;
        Ok(Applied {
            version: self.version(),
            reply,
        })
    }

    /// Sends a program's own requests to every worker, each at the next version, without
    /// waiting for them; takes those it sent out of `requests`. It sends none while a
    /// client's request is being applied (the worker asking may be the one that client
    /// waits for) or while a worker's queue is full: those wait for the next call.
    /// A request the program's declarations refuse is dropped (a program's mistake:
    /// counted in `requests_refused`).
    fn submit_detached(self: &Arc<Self>, requests: &mut Vec<Request>) {
        let mut next = match self.next.try_lock() {
            Ok(next) => next,
            Err(TryLockError::Poisoned(p)) => p.into_inner(),
            Err(TryLockError::WouldBlock) => return,
        };
        while !requests.is_empty() {
            let full = (self.workers.iter()).any(|w| w.capacity().is_some_and(|c| w.len() >= c));
            if full {
                return;
            }
            let request = requests.remove(0);
            let checked = control::find(&self.declarations(), request.target())
                .and_then(|d| d.check(&request))
                .and_then(|()| next.preparer.prepare(&request));
            let Ok(prepared) = checked else {
                self.requests_refused.fetch_add(1, Ordering::Relaxed);
                continue;
            };
            next.version += 1;
            let request = Arc::new(request);
            let gather = Arc::new(Gather {
                request: request.clone(),
                replies: Mutex::new(Vec::with_capacity(self.workers.len())),
                remaining: AtomicUsize::new(self.workers.len()),
                plane: Arc::downgrade(self),
            });
            for w in &self.workers {
                let job = Job {
                    version: next.version,
                    request: request.clone(),
                    prepared: prepared.clone(),
                    answer: Answer::Gathered(gather.clone()),
                };
                // Room was checked above, and only this lock's holder sends.
                if w.try_send(job).is_err() {
                    gather.add(Err(ControlError::Unavailable));
                }
            }
        }
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
    let mut counted = Vec::new();
    let mut next = None;
    // Rules by id: every worker holds the same rules under the same ids.
    let mut flows: std::collections::BTreeMap<u64, FlowStat> = Default::default();
    let mut add_flows = |fs: Vec<FlowStat>| {
        for f in fs {
            match flows.entry(f.id) {
                std::collections::btree_map::Entry::Occupied(mut o) => o.get_mut().merge(&f),
                std::collections::btree_map::Entry::Vacant(v) => {
                    v.insert(f);
                }
            }
        }
    };
    // Every worker replaced the same rules.
    let mut replaced = None;
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
            Reply::Flows(fs) => add_flows(fs),
            Reply::CountersOf(ws) => counted.extend(ws),
            Reply::Replaced {
                removed,
                added,
                kept,
            } => {
                add_flows(removed);
                replaced.get_or_insert((added, kept));
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
        Request::CountersOf { .. } => {
            counted.sort_by_key(|w: &WorkerCounters| w.worker);
            Reply::CountersOf(counted)
        }
        Request::Flows {
            change: FlowChange::Add { .. },
            ..
        } => Reply::Done,
        Request::Flows {
            change: FlowChange::Replace { .. },
            ..
        } => {
            let (added, kept) = replaced.unwrap_or_default();
            Reply::Replaced {
                removed: flows,
                added,
                kept,
            }
        }
        Request::Flows { .. } => Reply::Flows(flows),
        _ => Reply::Done,
    })
}

impl WorkerControl {
    /// Hands the control plane an instance of a reloaded program (worker 0 does).
    pub fn reloaded(&self, preparer: Box<dyn Running>) {
        self.plane.set_program(preparer);
    }

    /// Sends the program's own requests, applies waiting requests to it (its own among
    /// them, so that with one worker a rule found expired is gone before the next burst)
    /// and hands its notifications on. Called by the worker between bursts; costs an
    /// atomic load and two calls when nothing waits.
    pub fn poll(&mut self, program: &mut dyn Running, ctx: &Context) {
        program.requests(&mut self.requests);
        if !self.requests.is_empty() {
            self.plane.submit_detached(&mut self.requests);
        }
        while let Ok(job) = self.jobs.try_recv() {
            let answer = program.control(&job.request, job.prepared.as_ref(), ctx);
            self.applied.store(job.version, Ordering::Release);
            match job.answer {
                // The submitter may have given up waiting; the change stands either way.
                Answer::Waiting(to) => {
                    let _ = to.send(answer);
                }
                Answer::Gathered(gather) => gather.add(answer),
            }
        }
        program.notifications(&mut self.notifications);
        if !self.notifications.is_empty() {
            self.plane.publish(&mut self.notifications);
        }
    }

    /// The worker has ended: applies what was asked of it meanwhile, and leaves its
    /// tables' last counts with the control plane, which answers stats requests from them
    /// once every worker has ended.
    pub fn finish(&mut self, program: &mut dyn Running, ctx: &Context) {
        self.poll(program, ctx);
        let declared = self.plane.declarations();
        let answers: Vec<_> = (declared.iter())
            .filter(|d| matches!(d.kind, Kind::Table { .. } | Kind::Rules { .. }))
            .map(|d| {
                let request = Request::Stats {
                    table: d.name.clone(),
                };
                (d.name.clone(), program.control(&request, None, ctx))
            })
            .collect();
        let mut last = (self.plane.last_stats.lock()).unwrap_or_else(PoisonError::into_inner);
        last.extend(answers);
        self.plane.ended.fetch_add(1, Ordering::Release);
    }
}
