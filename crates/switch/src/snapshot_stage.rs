//! The `replicated` guarantee in bounded mode (`replication.mode = "bounded"`,
//! docs/REPLICATION.md): each worker's replicated state goes to the store as consistent
//! snapshots, one every `snapshot_ms`, while packets go on and leave without waiting for
//! the store; past the staleness bound `staleness_ms` (ε), the run's `on_stale` action.
//!
//! A snapshot is begun between two bursts (the state primitives' lazy snapshot: it reads
//! the state as it was then, while later packets change it) and read a share at a time,
//! after each burst and on the idle clock, so that no burst waits for the whole state to
//! be copied; the image goes to the store under the worker's lease ([`Snapshots`]).
//!
//! A worker serves only once it holds its lease and has installed the store's latest
//! image: until then its packets are held (bounded by `park_limit` and `park_timeout_ms`,
//! past which they are dropped as `unreplicated`, counted).
//!
//! Must never: call the state fresh before the store acknowledged it; let an output
//! leave while stale under `on_stale = "drop"` or after `"stop"`; block on the store.

use crate::replication_stage::{Reach, ReplicationCounters, add_since};
use stateplane_replication::snapshot::{
    Chunk, ImageError, ImageWriter, Installed, SnapshotReply, SnapshotRequest, SnapshotStats,
    Snapshots, read_image,
};
use stateplane_replication::{FlowBytes, Holder};
use stateplane_runtime::{Burst, Context, DropReason, Held, Running, StateStage, Verdict};
use stateplane_stores::{LinkCounters, StoreLink};
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// What a worker does with its packets while the store's snapshot is older than the bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnStale {
    /// Count them (`stale` in the summary and metrics), warn, and go on.
    Report,
    /// Drop their outputs (reason `stale`) until a snapshot is acknowledged again.
    Drop,
    /// Stop serving for good: every output from then on is dropped (reason `stale`), so
    /// that the network takes the traffic elsewhere; the state is still snapshotted.
    Stop,
}

impl OnStale {
    /// The action as a configuration names it.
    pub fn name(self) -> &'static str {
        match self {
            OnStale::Report => "report",
            OnStale::Drop => "drop",
            OnStale::Stop => "stop",
        }
    }

    pub fn parse(text: &str) -> Result<OnStale, String> {
        match text {
            "report" => Ok(OnStale::Report),
            "drop" => Ok(OnStale::Drop),
            "stop" => Ok(OnStale::Stop),
            other => Err(format!(
                "replication.on_stale: '{other}' is not an action; use \"report\" (count and \
                 go on), \"drop\" (drop outputs while stale) or \"stop\" (stop serving)"
            )),
        }
    }
}

/// Cells read into a snapshot after each burst (and each idle tick): a few microseconds'
/// copy, so that a large state is read over many bursts rather than stall one.
const READ_SHARE: usize = 4_096;

/// Shares read on an idle tick (about once a millisecond): a quarter of a millisecond's
/// copy at most.
const IDLE_SHARES: usize = 16;

/// The image's section of the words a program keeps beside its snapshotted state
/// (`Program::snapshot_aside`).
const ASIDE: u16 = u16::MAX;

/// What a worker's packets wait in before it serves: the packet's arrival on the stage's
/// clock.
type Waiting = u64;

pub struct SnapshotStage {
    snapshots: Snapshots,
    holder: Holder,
    link: Box<dyn StoreLink<FlowBytes>>,
    on_stale: OnStale,
    park_limit: usize,
    park_timeout_ns: u64,
    reach: Reach,
    /// The replicated states, as `(id, cells)`.
    states: Vec<(u16, u32)>,
    /// The snapshot being read: its image so far, and the state and cell it is at.
    image: Option<(ImageWriter, usize, u32)>,
    /// Each state's chunks as the last snapshot encoded them (`READ_SHARE` cells each).
    chunks: Vec<Vec<Option<Chunk>>>,
    words: Vec<u64>,
    held: Held<Waiting>,
    waiting: VecDeque<u64>,
    /// Held packets dropped, to leave as drops behind a later burst.
    leaving: VecDeque<u64>,
    next_token: u64,
    spare: Burst,
    stopped: bool,
    stale_since: Option<u64>,
    requests: Vec<SnapshotRequest>,
    replies: Vec<SnapshotReply>,
    counters: Arc<ReplicationCounters>,
    published: (SnapshotStats, LinkCounters, usize),
    /// The most staleness this worker published.
    staleness_most: u64,
    epoch: Instant,
}

/// A bounded stage's settings (checked by the plan).
#[derive(Clone, Copy, Debug)]
pub struct SnapshotSettings {
    pub config: stateplane_replication::snapshot::SnapshotConfig,
    pub on_stale: OnStale,
    pub park_limit: usize,
    pub park_timeout_ns: u64,
}

impl SnapshotStage {
    pub fn new(
        key: FlowBytes,
        holder: Holder,
        settings: SnapshotSettings,
        link: Box<dyn StoreLink<FlowBytes>>,
        counters: Arc<ReplicationCounters>,
    ) -> SnapshotStage {
        SnapshotStage {
            snapshots: Snapshots::new(key, settings.config, 0),
            holder,
            link,
            on_stale: settings.on_stale,
            park_limit: settings.park_limit,
            park_timeout_ns: settings.park_timeout_ns,
            reach: Reach::default(),
            states: Vec::new(),
            image: None,
            chunks: Vec::new(),
            words: vec![0; READ_SHARE],
            held: Held::with_limit(crate::replication_stage::parked_bytes(settings.park_limit)),
            waiting: VecDeque::new(),
            leaving: VecDeque::new(),
            next_token: 0,
            spare: Burst::with_capacity(0),
            stopped: false,
            stale_since: None,
            requests: Vec::new(),
            replies: Vec::new(),
            counters,
            published: Default::default(),
            staleness_most: 0,
            epoch: Instant::now(),
        }
    }

    fn now(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// Answers in, images installed, requests out; then the snapshot's next `shares`
    /// shares.
    fn pump(&mut self, program: &mut dyn Running, shares: usize) {
        if self.states.is_empty() {
            self.states = program.snapshotted();
            self.chunks = vec![Vec::new(); self.states.len()];
        }
        let now = self.now();
        self.reach.saw(self.link.counters().connected > 0, now);
        self.link.receive(&mut self.replies);
        for reply in std::mem::take(&mut self.replies) {
            if let Some(Installed(image)) = self.snapshots.handle_reply(now, reply) {
                // A snapshot of the state replaced is no more, nor what it encoded.
                self.image = None;
                self.chunks.iter_mut().for_each(Vec::clear);
                if let Some(image) = image
                    && let Err(e) = self.install(program, &image)
                {
                    log::error!(
                        "replication: the store's snapshot for this worker cannot be \
                         installed: {e}; the state starts afresh and the next snapshot \
                         replaces it"
                    );
                    (self.counters.install_refused).fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        self.read_share(program, now, shares);
        self.snapshots.poll_transmit(now, &mut self.requests);
        if !self.requests.is_empty() {
            self.link.send(self.holder, &mut self.requests);
            self.requests.clear();
        }
        self.publish(now);
    }

    /// Begins a snapshot when one is due, and reads the next share of the one being read.
    fn read_share(&mut self, program: &mut dyn Running, now: u64, shares: usize) {
        if self.image.is_none() && self.snapshots.snapshot_due(now) {
            let Some(image) = self.begin_image(program) else {
                return;
            };
            self.snapshots.began(now);
            self.image = Some((image, 0, 0));
        }
        let Some((image, state, cell)) = &mut self.image else {
            return;
        };
        let mut budget = READ_SHARE.saturating_mul(shares);
        while budget > 0 && *state < self.states.len() {
            let (id, cells) = self.states[*state];
            if *cell == 0 {
                image.state(id, cells);
            }
            // A chunk (whole: `cell` stays a multiple of READ_SHARE) unchanged since the
            // last snapshot is written as it was encoded then, for a glance's cost.
            let n = READ_SHARE.min((cells - *cell) as usize);
            let chunks = &mut self.chunks[*state];
            let slot = *cell as usize / READ_SHARE;
            if chunks.len() <= slot {
                chunks.resize(slot + 1, None);
            }
            let (read, cost) = match &chunks[slot] {
                Some(chunk) if !program.snapshot_changed(id, *cell, n as u32) => {
                    image.encoded(chunk);
                    (n, READ_SHARE / 64)
                }
                _ => {
                    let (chunk, read) = read_chunk(program, &mut self.words, id, *cell, n);
                    image.encoded(&chunk);
                    chunks[slot] = Some(chunk);
                    (read, READ_SHARE)
                }
            };
            *cell += read as u32;
            budget = budget.saturating_sub(cost);
            if read < n || *cell >= cells {
                *state += 1;
                *cell = 0;
            }
        }
        if *state >= self.states.len()
            && let Some((image, _, _)) = self.image.take()
        {
            self.snapshots.read(image.finish());
        }
    }

    /// A snapshot begun of every state, its words aside written (`None`, said: a state
    /// took none).
    fn begin_image(&self, program: &mut dyn Running) -> Option<ImageWriter> {
        for &(id, _) in &self.states {
            if !program.snapshot_begin(id) {
                // `with_guarantees` made sure the program snapshots the state.
                log::error!("replication: state {id} took no snapshot; none is written");
                return None;
            }
        }
        let mut image = ImageWriter::default();
        let aside = program.snapshot_aside();
        if !aside.is_empty() {
            image.state(ASIDE, aside.len() as u32);
            image.encoded(&Chunk::encode(0, &aside));
        }
        Some(image)
    }

    /// The whole state as an image, read at once (a program that takes no packets
    /// meanwhile).
    fn whole_image(&mut self, program: &mut dyn Running) -> Option<Vec<u8>> {
        let mut image = self.begin_image(program)?;
        for &(id, cells) in &self.states {
            image.state(id, cells);
            let mut cell = 0;
            while cell < cells {
                let n = READ_SHARE.min((cells - cell) as usize);
                let (chunk, read) = read_chunk(program, &mut self.words, id, cell, n);
                image.encoded(&chunk);
                cell += read as u32;
                if read < n {
                    break;
                }
            }
        }
        Some(image.finish())
    }

    /// Puts `image` in place of the state (all of it: cells the image has not are zero);
    /// an image that does not fit the state installs nothing.
    fn install(&mut self, program: &mut dyn Running, image: &[u8]) -> Result<(), ImageError> {
        let states = self.states.clone();
        let mut aside = program.snapshot_aside();
        let aside_cells = aside.len() as u32;
        let cells_of = |id| match id {
            ASIDE => (aside_cells > 0).then_some(aside_cells),
            id => states.iter().find(|s| s.0 == id).map(|s| s.1),
        };
        // Checked whole first.
        read_image(image, cells_of, |_, _, _| {})?;
        for &(id, cells) in &states {
            let zeros = [0u64; 1024];
            for first in (0..cells).step_by(zeros.len()) {
                let n = (cells - first).min(zeros.len() as u32) as usize;
                program.write_synced_run(id, first, &zeros[..n]);
            }
        }
        aside.fill(0);
        read_image(image, cells_of, |id, first, words| match id {
            ASIDE => aside[first as usize..][..words.len()].copy_from_slice(words),
            id => program.write_synced_run(id, first, words),
        })?;
        if aside_cells > 0 {
            program.install_aside(&aside);
        }
        Ok(())
    }

    /// Holds packet `i` of the burst until the worker serves.
    fn hold(&mut self, burst: &Burst, i: usize, now: u64) {
        let token = self.next_token;
        self.next_token += 1;
        self.held.hold(token, &burst.descs()[i], burst.data(i), now);
        self.waiting.push_back(token);
        self.counters
            .waited_for_lease
            .fetch_add(1, Ordering::Relaxed);
    }

    /// Held packet `token` leaves as a drop (`unreplicated`).
    fn drop_held(&mut self, token: u64) {
        if let Some(p) = self.held.get_mut(token) {
            p.desc.verdict = Verdict::Drop(DropReason::UNREPLICATED);
            self.counters.dropped.fetch_add(1, Ordering::Relaxed);
            self.leaving.push_back(token);
        }
    }

    /// Held packets waited past the timeout are dropped.
    fn expire(&mut self, now: u64) {
        while let Some(&token) = self.waiting.front() {
            match self.held.get(token) {
                Some(p) if now.saturating_sub(p.meta) > self.park_timeout_ns => {
                    self.waiting.pop_front();
                    self.drop_held(token);
                }
                Some(_) => break,
                None => {
                    self.waiting.pop_front();
                }
            }
        }
    }

    fn publish(&mut self, now: u64) {
        let (s, l, held) = (self.snapshots.stats, self.link.counters(), self.held.len());
        let (ps, pl, pheld) = self.published;
        let c = &*self.counters;
        let add = add_since;
        add(&c.snapshots, s.written, ps.written);
        add(&c.snapshot_bytes, s.bytes, ps.bytes);
        add(&c.installed, s.installed, ps.installed);
        add(&c.writes, s.begun, ps.begun);
        add(&c.acquires, s.acquires, ps.acquires);
        add(&c.renewals, s.renewals, ps.renewals);
        add(&c.retransmits, s.retransmits, ps.retransmits);
        add(&c.fenced, s.fenced, ps.fenced);
        c.publish_link_and_held((l, held, self.held.most()), (pl, pheld));
        let staleness = self.snapshots.staleness(now);
        if self.snapshots.serving() && staleness > self.staleness_most {
            self.staleness_most = staleness;
            c.staleness_most_ns.fetch_max(staleness, Ordering::Relaxed);
        }
        self.published = (s, l, held);
    }

    /// Whether outputs must not leave now (and says so once an episode).
    fn withheld(&mut self, now: u64) -> bool {
        let stale = self.snapshots.serving() && self.snapshots.stale(now);
        match (stale, self.stale_since) {
            (true, None) => {
                self.stale_since = Some(now);
                log::warn!(
                    "replication: the store's snapshot is {} ms old, past the bound \
                     (on_stale = \"{}\")",
                    self.snapshots.staleness(now) / 1_000_000,
                    self.on_stale.name()
                );
                if self.on_stale == OnStale::Stop {
                    log::error!(
                        "replication: this worker stops serving (on_stale = \"stop\"): its \
                         outputs are dropped from now on"
                    );
                    self.stopped = true;
                }
            }
            (false, Some(since)) => {
                self.stale_since = None;
                log::info!(
                    "replication: the store's snapshot is fresh again after {} ms stale",
                    (now - since) / 1_000_000
                );
            }
            _ => {}
        }
        self.stopped || (stale && self.on_stale == OnStale::Drop)
    }
}

/// Reads `n` cells of state `id` from `cell` on (fewer at its end) as a chunk, through
/// `words`; the chunk and the cells read.
fn read_chunk(
    program: &mut dyn Running,
    words: &mut [u64],
    id: u16,
    cell: u32,
    n: usize,
) -> (Chunk, usize) {
    let read = program.snapshot_read(id, cell, &mut words[..n]);
    (Chunk::encode(cell, &words[..read]), read)
}

impl StateStage for SnapshotStage {
    fn after_burst(&mut self, program: &mut dyn Running, _ctx: &Context) {
        self.pump(program, 1);
    }

    /// With no packets waiting, a snapshot is read many shares at a time.
    fn tick(&mut self, program: &mut dyn Running, _ctx: &Context) {
        self.pump(program, IDLE_SHARES);
        self.expire(self.now());
    }

    /// The new instance goes on from the old one's state, as a successor goes on from
    /// the store's image: a snapshot being read is read whole from the instance it began
    /// on (which takes no packet any more) and written as begun, and the old instance's
    /// state is installed into the new one (which then takes what else it can of the old
    /// one itself, `Program::inherit`). A reload that changes the state's shape is said
    /// and counted as an image refused; the lease stays this worker's, and the next
    /// snapshot writes what the new instance holds.
    fn reloaded(&mut self, old: &mut dyn Running, program: &mut dyn Running, _ctx: &Context) {
        if self.image.is_some() {
            let now = self.now();
            self.read_share(old, now, usize::MAX / READ_SHARE);
        }
        let image = match self.states.is_empty() {
            true => None,
            false => self.whole_image(old),
        };
        self.states = program.snapshotted();
        self.chunks = vec![Vec::new(); self.states.len()];
        if let Some(image) = image
            && let Err(e) = self.install(program, &image)
        {
            log::error!(
                "replication: the reload changed the replicated state's shape ({e}): the \
                 next snapshot replaces the store's with what the new program kept"
            );
            (self.counters.install_refused).fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A last snapshot of the state as the run ends, once the one on its way is
    /// acknowledged, waiting for the store at most `park_timeout_ms` (at most 5 s): a run
    /// that ends loses nothing of its state.
    fn finish(&mut self, program: &mut dyn Running, _ctx: &Context) {
        let deadline = self.now() + self.park_timeout_ns.min(5_000_000_000);
        let mut last = None;
        loop {
            self.pump(program, usize::MAX / READ_SHARE);
            if !self.snapshots.serving() || self.now() > deadline {
                break;
            }
            match last {
                Some(written) if self.snapshots.stats.written > written => break,
                None if self.snapshots.idle() && self.image.is_none() => {
                    last = Some(self.snapshots.stats.written);
                    self.snapshots.hurry();
                    continue;
                }
                _ => {}
            }
            if self.image.is_none() {
                // Reading goes on at once; the store is waited for.
                std::thread::sleep(std::time::Duration::from_micros(200));
            }
        }
        if last.is_none_or(|written| self.snapshots.stats.written <= written)
            && self.snapshots.serving()
        {
            log::warn!(
                "replication: the store did not acknowledge the run's last snapshot in time; \
                 it has the state as of {} ms before the end",
                self.snapshots.staleness(self.now()) / 1_000_000
            );
        }
        let tokens: Vec<u64> = self.waiting.drain(..).collect();
        for token in tokens {
            self.drop_held(token);
        }
    }

    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        self.link.wake_fd()
    }

    fn before_program(&mut self, burst: &mut Burst, program: &mut dyn Running, _ctx: &Context) {
        self.pump(program, 0);
        let now = self.now();
        self.expire(now);
        if !self.snapshots.serving() {
            for i in 0..burst.len() {
                let full =
                    self.held.len() >= self.park_limit || !self.held.has_room(burst.data(i).len());
                if full {
                    let token = self.next_token;
                    self.next_token += 1;
                    self.held.hold(token, &burst.descs()[i], burst.data(i), now);
                    self.drop_held(token);
                } else {
                    self.hold(burst, i, now);
                }
            }
            burst.retain(|_| false);
            return;
        }
        // Packets held while the image was on its way go first, in their order.
        if !self.waiting.is_empty() {
            if self.spare.capacity() != burst.capacity() {
                self.spare = Burst::with_capacity(burst.capacity());
            }
            let (held, waiting) = (&self.held, &self.waiting);
            let front = (waiting.iter())
                .filter_map(|&t| held.get(t))
                .map(|p| (&p.desc, p.data.as_slice()));
            let put = burst.put_in_front(&mut self.spare, front);
            for token in self.waiting.drain(..put) {
                if let Some(p) = self.held.take(token) {
                    self.held.recycle(p);
                }
            }
        }
        self.counters
            .processed
            .fetch_add(burst.len() as u64, Ordering::Relaxed);
    }

    fn after_program(&mut self, burst: &mut Burst, _program: &mut dyn Running, _ctx: &Context) {
        let now = self.now();
        if self.snapshots.serving() && self.snapshots.stale(now) {
            self.counters
                .stale
                .fetch_add(burst.len() as u64, Ordering::Relaxed);
        }
        if self.withheld(now) {
            for d in burst.descs_mut() {
                d.verdict = Verdict::Drop(DropReason::STALE);
            }
        }
        // Held packets dropped go behind the burst's own, as many as fit.
        while let Some(&token) = self.leaving.front() {
            let Some(p) = self.held.get(token) else {
                self.leaving.pop_front();
                continue;
            };
            if !burst.push_desc(&p.desc, &p.data) {
                break;
            }
            self.leaving.pop_front();
            if let Some(p) = self.held.take(token) {
                self.held.recycle(p);
            }
        }
    }

    fn holding(&self) -> usize {
        self.held.len()
    }

    fn releasable(&self) -> bool {
        !self.leaving.is_empty() || (self.snapshots.serving() && !self.waiting.is_empty())
    }

    /// A run on packet time waits for the store's image rather than hold what comes
    /// faster than it; not once the store has been out of reach for the park timeout
    /// (what waits is dropped then anyway).
    fn backlogged(&self) -> bool {
        !self.snapshots.serving()
            && !self.waiting.is_empty()
            && !self.reach.lost_for(self.park_timeout_ns, || self.now())
    }
}

/// The stage in a worker running `hh` with its sketches in bounded mode, on a memory store
/// whose answers the test lets through when it likes (real time, short periods).
#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_packets::udp_burst;
    use crate::test_store::Gated;
    use stateplane_programs::{PortNames, ReplicationMode};
    use stateplane_replication::snapshot::SnapshotConfig;
    use stateplane_replication::store::StoreConfig;
    use stateplane_runtime::Worker;
    use stateplane_stores::memory::MemoryStore;
    use stateplane_wire::FlowHasher;
    use std::sync::atomic::AtomicBool;
    use std::time::Duration;

    const MS: u64 = 1_000_000;

    fn store() -> MemoryStore<FlowBytes> {
        MemoryStore::new(StoreConfig {
            min_lease_ns: 100 * MS,
            max_lease_ns: 60_000 * MS,
            fencing: true,
            ..StoreConfig::default()
        })
    }

    fn hh() -> Box<dyn Running> {
        hh_of_width(4096)
    }

    fn hh_of_width(width: usize) -> Box<dyn Running> {
        let names = PortNames(vec!["a".into(), "b".into()]);
        let cfg: toml::Value = toml::from_str(&format!(
            "threshold = 1000000\ninterval_ms = 600000\nwidth = {width}\nmap = {{ a = \"b\" }}"
        ))
        .unwrap();
        let factory = stateplane_programs::build("hh", Some(&cfg), &names).unwrap();
        let wanted = [("sketch".to_string(), vec!["replicated".to_string()])].into();
        stateplane_programs::with_guarantees(factory, &wanted, ReplicationMode::Bounded).unwrap()(0)
    }

    /// A worker running `hh` in bounded mode on `store` as holder `incarnation`, the gate
    /// of its link, and its counters.
    fn worker(
        store: &MemoryStore<FlowBytes>,
        incarnation: u32,
        on_stale: OnStale,
    ) -> (Worker, Arc<AtomicBool>, Arc<ReplicationCounters>) {
        let (worker, open, counters, _) = worker_parking(store, incarnation, on_stale, 10_000 * MS);
        (worker, open, counters)
    }

    /// As [`worker`], packets held at most `park_timeout_ns`; and the flag the link's
    /// `connected` follows.
    fn worker_parking(
        store: &MemoryStore<FlowBytes>,
        incarnation: u32,
        on_stale: OnStale,
        park_timeout_ns: u64,
    ) -> (
        Worker,
        Arc<AtomicBool>,
        Arc<ReplicationCounters>,
        Arc<AtomicBool>,
    ) {
        let (link, open, _) = Gated::on(store);
        let connected = link.connection();
        let counters = Arc::new(ReplicationCounters::default());
        let settings = SnapshotSettings {
            config: SnapshotConfig {
                period_ns: 2 * MS,
                bound_ns: 30 * MS,
                lease_ns: 100 * MS,
                margin_ns: MS,
                retransmit_ns: 2 * MS,
            },
            on_stale,
            park_limit: 1_000,
            park_timeout_ns,
        };
        let stage = SnapshotStage::new(
            Snapshots::key_of(1, 0),
            Holder {
                switch: 1 << 8,
                incarnation,
            },
            settings,
            Box::new(link),
            Arc::clone(&counters),
        );
        let worker = Worker::new(hh(), 0, 1, 2, FlowHasher::with_seed(7))
            .with_state_stages(vec![Box::new(stage)]);
        (worker, open, counters, connected)
    }

    /// `n` packets of UDP flow `flow` from port a, untagged.
    fn burst(flow: u8, n: usize) -> Burst {
        udp_burst(0, flow, n)
    }

    fn forwarded(b: &Burst) -> usize {
        (b.descs().iter())
            .filter(|d| d.verdict == Verdict::Forward(1))
            .count()
    }

    fn stale_drops(b: &Burst) -> usize {
        (b.descs().iter())
            .filter(|d| d.verdict == Verdict::Drop(DropReason::STALE))
            .count()
    }

    /// Ticks the worker every half millisecond until `done` or `limit_ms` pass.
    fn tick_until(w: &mut Worker, limit_ms: u64, mut done: impl FnMut(&mut Worker) -> bool) {
        let start = Instant::now();
        while !done(w) {
            assert!(
                start.elapsed() < Duration::from_millis(limit_ms),
                "not within {limit_ms} ms"
            );
            w.tick_stages();
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    /// The row sums of sketch 0 in the store's image (each row of a count-min sketch
    /// sums to the packets it counted).
    fn stored_rows(store: &MemoryStore<FlowBytes>) -> Vec<u64> {
        stored_rows_of(store, 0)
    }

    /// The row sums of sketch `sketch` in the store's image.
    fn stored_rows_of(store: &MemoryStore<FlowBytes>, sketch: usize) -> Vec<u64> {
        let (_, value) = store.read(&Snapshots::key_of(1, 0)).unwrap();
        let image = value.unwrap();
        let mut rows = vec![0u64; 4];
        let cells = 65 * 4 * 4096;
        read_image(
            &image,
            |id| match id {
                0 => Some(cells),
                ASIDE => Some(2 + 65 + 4096),
                _ => None,
            },
            |id, first, words| {
                if id == 0 {
                    for (k, w) in words.iter().enumerate() {
                        let cell = first as usize + k;
                        if (sketch * 4 * 4096..(sketch + 1) * 4 * 4096).contains(&cell) {
                            rows[cell / 4096 % 4] += w;
                        }
                    }
                }
            },
        )
        .unwrap();
        rows
    }

    #[test]
    fn packets_wait_for_the_image_then_snapshots_follow_and_a_successor_installs_them() {
        let store = store();
        let (mut w, open, counters) = worker(&store, 1, OnStale::Report);
        // No lease yet: held, not processed.
        let mut b = burst(1, 10);
        w.handle(&mut b);
        assert!(b.is_empty());
        assert_eq!(w.holding(), 10);
        open.store(true, Ordering::Relaxed);
        tick_until(&mut w, 2_000, |w| w.releasable());
        let mut b = burst(1, 20);
        w.handle(&mut b);
        assert_eq!(
            forwarded(&b),
            30,
            "the ten held go first, then the burst's own"
        );
        assert_eq!(w.holding(), 0);
        let seqs: Vec<u64> = b.descs().iter().map(|d| d.seq).collect();
        assert_eq!(&seqs[..10], (0..10).collect::<Vec<_>>());
        // A snapshot taken after the packets has them all.
        let written = counters.snapshots.load(Ordering::Relaxed);
        tick_until(&mut w, 2_000, |_| {
            counters.snapshots.load(Ordering::Relaxed) >= written + 2
        });
        assert_eq!(stored_rows(&store), [30; 4]);
        // More packets, and the run ends: its last snapshot has them.
        let mut b = burst(1, 5);
        w.handle(&mut b);
        w.finish();
        assert_eq!(stored_rows(&store), [35; 4]);
        // A successor (a new incarnation) waits for the lease, installs the image, and
        // counts on from it.
        let (mut next, open, counters) = worker(&store, 2, OnStale::Report);
        open.store(true, Ordering::Relaxed);
        let mut b = burst(1, 5);
        next.handle(&mut b);
        assert!(b.is_empty(), "the former holder's lease runs");
        tick_until(&mut next, 2_000, |w| w.releasable());
        assert_eq!(counters.installed.load(Ordering::Relaxed), 1);
        let mut b = burst(1, 0);
        next.handle(&mut b);
        assert_eq!(forwarded(&b), 5);
        next.finish();
        assert_eq!(stored_rows(&store), [40; 4]);
    }

    /// A worker of `store` serving (its lease held, the store's image installed) with
    /// `n` packets of flow 1 processed.
    fn serving_with(
        store: &MemoryStore<FlowBytes>,
        n: usize,
    ) -> (Worker, Arc<ReplicationCounters>) {
        let (mut w, open, counters) = worker(store, 1, OnStale::Report);
        let mut b = burst(1, n);
        w.handle(&mut b);
        open.store(true, Ordering::Relaxed);
        tick_until(&mut w, 2_000, |w| w.releasable());
        let mut b = burst(1, 0);
        w.handle(&mut b);
        assert_eq!(forwarded(&b), n);
        (w, counters)
    }

    #[test]
    fn a_reload_carries_the_state_into_the_new_instance_and_snapshots_go_on_from_it() {
        let store = store();
        let (mut w, counters) = serving_with(&store, 10);
        // Mid-snapshot: one begun and not yet written (the state is read 4,096 cells a
        // burst, and it has a million).
        tick_until(&mut w, 2_000, |_| {
            counters.writes.load(Ordering::Relaxed) > counters.snapshots.load(Ordering::Relaxed)
        });
        w.replace_program(hh(), hh);
        let mut b = burst(1, 5);
        w.handle(&mut b);
        assert_eq!(forwarded(&b), 5);
        w.finish();
        assert_eq!(
            stored_rows(&store),
            [15; 4],
            "nothing counted before the reload is lost"
        );
        assert_eq!(counters.install_refused.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_snapshot_begun_before_a_reload_is_written_as_it_began() {
        let store = store();
        // Four tenants take sketches 0 to 3 (untagged, then VLANs 1 to 3); the fifth's,
        // sketch 4, is read after the first share of a snapshot (16 shares of 4,096
        // cells: four sketches).
        let (mut w, counters) = serving_with(&store, 1);
        for vlan in 1..=3 {
            w.handle(&mut udp_burst(vlan, 1, 1));
        }
        w.handle(&mut udp_burst(4, 1, 10));
        // The next snapshot begins (and reads its first share) after them.
        let begun = counters.writes.load(Ordering::Relaxed);
        tick_until(&mut w, 2_000, |_| {
            counters.writes.load(Ordering::Relaxed) > begun
        });
        // Counted after the snapshot began: not in it.
        let mut b = udp_burst(4, 1, 3);
        w.handle(&mut b);
        assert_eq!(forwarded(&b), 3);
        w.replace_program(hh(), hh);
        tick_until(&mut w, 2_000, |_| {
            counters.snapshots.load(Ordering::Relaxed) > begun
        });
        assert_eq!(
            stored_rows_of(&store, 4),
            [10; 4],
            "every row as the snapshot began"
        );
        w.finish();
        assert_eq!(stored_rows_of(&store, 4), [13; 4]);
    }

    /// A run over a capture waits for the store's image, but not for a store out of reach
    /// for the park timeout: what waits is dropped then anyway.
    #[test]
    fn packets_wait_for_the_image_until_the_store_is_out_of_reach_for_the_park_timeout() {
        let store = store();
        let (mut w, _open, _, connected) = worker_parking(&store, 1, OnStale::Report, 50 * MS);
        w.handle(&mut burst(1, 10));
        assert!(w.backlogged(), "the image is waited for");
        connected.store(false, Ordering::Relaxed);
        w.tick_stages();
        assert!(w.backlogged(), "not yet the park timeout out of reach");
        std::thread::sleep(Duration::from_millis(60));
        w.handle(&mut burst(1, 10));
        assert!(w.holding() > 0);
        assert!(!w.backlogged(), "out of reach for the park timeout");
        connected.store(true, Ordering::Relaxed);
        w.handle(&mut burst(1, 10));
        assert!(w.backlogged(), "back: waited for again");
    }

    #[test]
    fn a_reload_that_reshapes_the_state_starts_it_afresh_and_says_so() {
        let store = store();
        let (mut w, counters) = serving_with(&store, 10);
        w.replace_program(hh_of_width(2048), || hh_of_width(2048));
        assert_eq!(counters.install_refused.load(Ordering::Relaxed), 1);
        let mut b = burst(1, 5);
        w.handle(&mut b);
        assert_eq!(forwarded(&b), 5, "the new instance serves, from nothing");
    }

    #[test]
    fn past_the_bound_outputs_are_dropped_until_fresh_or_for_good_when_stopped() {
        for on_stale in [OnStale::Drop, OnStale::Stop, OnStale::Report] {
            let store = store();
            let (mut w, open, counters) = worker(&store, 1, on_stale);
            open.store(true, Ordering::Relaxed);
            tick_until(&mut w, 2_000, |_| {
                counters.snapshots.load(Ordering::Relaxed) > 0
            });
            let mut b = burst(2, 4);
            w.handle(&mut b);
            assert_eq!(forwarded(&b), 4, "{on_stale:?}: fresh");
            // The store goes quiet past the bound (30 ms).
            open.store(false, Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(60));
            let mut b = burst(2, 4);
            w.handle(&mut b);
            let (out, dropped) = (forwarded(&b), stale_drops(&b));
            match on_stale {
                OnStale::Report => assert_eq!((out, dropped), (4, 0)),
                _ => assert_eq!((out, dropped), (0, 4), "{on_stale:?}"),
            }
            assert_eq!(counters.stale.load(Ordering::Relaxed), 4);
            // Back: a snapshot is acknowledged, and the state is fresh again.
            open.store(true, Ordering::Relaxed);
            let written = counters.snapshots.load(Ordering::Relaxed);
            tick_until(&mut w, 2_000, |_| {
                counters.snapshots.load(Ordering::Relaxed) >= written + 2
            });
            let mut b = burst(2, 4);
            w.handle(&mut b);
            match on_stale {
                OnStale::Stop => assert_eq!(stale_drops(&b), 4, "stopped for good"),
                _ => assert_eq!(forwarded(&b), 4, "{on_stale:?}: fresh again"),
            }
            let most = counters.staleness_most_ns.load(Ordering::Relaxed);
            assert!(most >= 60 * MS, "{most}");
        }
    }
}
