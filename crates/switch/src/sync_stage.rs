//! The sync stage: what keeps the `synced` guarantee, one per worker, run by the worker
//! loop between bursts (`runtime::StateStage`). Each pass takes the cells of synced state
//! changed since the last one (`Program::changes`) into the worker's `Sender` (the
//! protocol core of `stateplane-sync`), and sends the messages it makes to the collector
//! over UDP, as the worker's stream (stream = worker index). On the same socket it takes
//! the collector's reports (to the rate controller) and the parts of top-down writes, which
//! it acknowledges and commits whole between two bursts.
//!
//! The stage keeps time by the system's clock, whatever the data plane's clock is (a
//! replay's is its capture's): the channel's capacity, the timeout monitor and the refresh
//! are about the real channel, and a message's sending time is the instant the collector's
//! copy is as of. It reads the clock as the Unix time at the stage's start plus a monotonic
//! clock's time since, so that it never goes back. Under traffic a pass runs after a burst only once
//! `PASS_SHARE` times the last pass's length has gone by since it began, and at most
//! `max_age_ms` after it, so a busy worker gives the stage about 1/`PASS_SHARE` of its time
//! unless its passes are so long that the configured freshness costs more, and the changes
//! a cell makes meanwhile reach the sender as one. A pass takes a table's changed slots
//! up to `CHANGES_PER_PASS` words (a write that lands a migration's connections changes
//! hundreds of thousands at once); the passes that take the rest follow after as much
//! forwarding as each took (after one burst once the batch has been open `max_age_ms`),
//! and their messages make one batch with it, which the collector applies whole once the
//! last is taken.
//!
//! Configured by a run's `[sync]` section ([`SyncSettings`]); docs/SYNC.md has the
//! protocol.
//!
//! Must never: block the worker (the socket does not block; a send that fails is counted
//! and the anti-entropy refresh makes up for it), or commit part of a write.

use serde::Deserialize;
use stateplane_runtime::{Context, Running, StateStage, StateStageFactory};
use stateplane_state::changes::Change;
use stateplane_state::synced_table::MAX_STRIDE;
use stateplane_sync::Location;
use stateplane_sync::rate::RateController;
use stateplane_sync::sender::{Sender, SenderConfig, SyncedState, Threshold};
use stateplane_sync::wire::{
    ENTRY_LEN, HEADER_LEN, Key, Kind, MAC_LEN, MAX_DATAGRAM_ENTRIES, Message,
};
use stateplane_sync::write::{WriteStage, WriteTarget};
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

// A synced table stages, in pages supplied ahead, a write as large as the channel takes.
const _: () = assert!(
    stateplane_state::synced_table::STAGED_WORDS == stateplane_sync::write::MAX_WRITE_VALUES
);

/// A run's `[sync]` section.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SyncSettings {
    /// The collector's UDP address (`stateplane collector --listen`).
    pub collector: String,
    /// This switch's id among the collector's switches (default 1).
    pub switch: Option<u32>,
    /// What the channel to the collector carries, in Mbit/s (default 100): the rate
    /// controller keeps the updates of all workers within it.
    pub channel_mbps: Option<f64>,
    /// `"adaptive"` (the default: the rate controller sets it every millisecond), or a
    /// fixed threshold (0: every change, the mirroring baseline).
    pub threshold: Option<ThresholdSetting>,
    /// Every location is sent whole at least this often (anti-entropy; default 1000).
    pub refresh_ms: Option<u64>,
    /// A change waits unsent at most this long (the timeout monitor; default 10), and the
    /// passes that take the changes are at most this far apart.
    pub max_age_ms: Option<u64>,
    /// Slots of each worker's read handler, at most (default 65536; never more than the
    /// synced locations).
    pub slots: Option<usize>,
    /// A file holding the key (64 hexadecimal digits) that signs every message; the
    /// collector must be given the same one.
    pub key_file: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ThresholdSetting {
    Fixed(u64),
    Named(String),
}

/// A number of 0 or more, or a name: anything else is refused with the setting's fix (an
/// untagged enum would say only that no variant matched).
impl<'de> Deserialize<'de> for ThresholdSetting {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Either;
        impl serde::de::Visitor<'_> for Either {
            type Value = ThresholdSetting;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("\"adaptive\" or a threshold of 0 or more (0 sends every change)")
            }
            fn visit_u64<E: serde::de::Error>(self, t: u64) -> Result<ThresholdSetting, E> {
                Ok(ThresholdSetting::Fixed(t))
            }
            fn visit_i64<E: serde::de::Error>(self, t: i64) -> Result<ThresholdSetting, E> {
                u64::try_from(t).map(ThresholdSetting::Fixed).map_err(|_| {
                    E::custom(format!(
                        "sync.threshold: {t} is below 0; give \"adaptive\" or a threshold of 0 or more (0 sends every change)"
                    ))
                })
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<ThresholdSetting, E> {
                Ok(ThresholdSetting::Named(name.to_string()))
            }
        }
        d.deserialize_any(Either)
    }
}

/// Updates wait at most this long to fill a message.
const BATCH_NS: u64 = 1_000_000;
/// A message at least this often, so the collector sees a quiet stream alive.
const HEARTBEAT_NS: u64 = 10_000_000;
/// The receive buffer asked for each stage's socket.
const RECEIVE_BUFFER: usize = 8 << 20;
/// Datagrams a worker takes from its socket per pass at most (reports, write parts); a
/// part that carries values ends the pass's taking (see `receive`).
const RECEIVE_PER_PASS: usize = 64;
/// A busy worker gives its sync stage about one part in this many of its time (see the
/// module doc).
const PASS_SHARE: u64 = 50;
/// The collector's datagrams (reports, write parts) are taken at least this often, between
/// passes too: a `recv` that finds nothing costs about a microsecond.
const RECEIVE_EVERY_NS: u64 = 1_000_000;
/// A pass takes a table's changed slots until it has this many changed words (its slot's
/// words whole), and leaves the rest to the next pass: taken, handed to the read handler
/// and sent in one go, the 851,968 words that a write of 65,536 connections lands held
/// the worker for 30-34 ms (`bench-sync-migrate --table --sizes 65536 --losses 0 --moves
/// 1` on 133c9ec; docs/BENCHMARKS.md). A busy `counter` pass takes 20,000 to 40,000.
const CHANGES_PER_PASS: usize = 1 << 16;
/// A batch left open this long is ended by the next pass, which takes every change left
/// whatever the budget: a data plane that writes new slots faster than the passes take
/// them would otherwise keep the collector's copy waiting for the batch's end for ever.
const MAX_OPEN_NS: u64 = 100_000_000;
/// Under traffic the clock is read after one burst in this many (a read costs about a
/// third of a 64-packet burst's marking of its changes).
const CLOCK_EVERY_BURSTS: u32 = 4;

/// The settings, checked, for every worker's stage.
#[derive(Clone, Debug)]
pub struct SyncPlan {
    pub collector: SocketAddr,
    pub key: Option<Key>,
    sender: SenderConfig,
    pub counters: Arc<SyncCounters>,
    /// The names synced, each at its state id, `first_id` on (see [`SyncPlan::naming`]).
    pub states: Vec<String>,
    pub first_id: u16,
    /// The channel the rate controller keeps the updates within (with `t` adaptive), and
    /// each worker's share of it.
    pub channel_mbps: Option<f64>,
    share_mbps: Option<f64>,
}

/// What the sync stages of a run did, summed over workers.
#[derive(Debug, Default)]
pub struct SyncCounters {
    /// Cells found changed by the passes (a cell changed many times between two counts
    /// once).
    pub changes: AtomicU64,
    /// Passes, and the time the workers spent in them; of that time, what taking the
    /// changes from the state took, and handing them to the read handler.
    pub passes: AtomicU64,
    pub pass_ns: AtomicU64,
    /// Passes that left changes to the next, their take over `CHANGES_PER_PASS` words.
    pub passes_cut: AtomicU64,
    /// The thresholds the messages of changes carried (`t_max`, what the collector bounds
    /// their values by), summed over those messages, which are counted, and the largest.
    pub threshold_sum: AtomicU64,
    pub threshold_messages: AtomicU64,
    pub largest_threshold: AtomicU64,
    pub take_ns: AtomicU64,
    pub handle_ns: AtomicU64,
    pub messages: AtomicU64,
    pub bytes: AtomicU64,
    /// Sends that failed (no collector listening, a full buffer).
    pub send_errors: AtomicU64,
    pub reports: AtomicU64,
    /// Messages the collector lost and asked for again, sent again.
    pub resent: AtomicU64,
    /// Datagrams refused (malformed, wrong key, not for this switch).
    pub refused: AtomicU64,
    pub write_parts: AtomicU64,
    pub writes_committed: AtomicU64,
    /// Writes dropped before they committed, at the collector's request.
    pub writes_abandoned: AtomicU64,
    /// Times a collector's writes came numbered apart from the ones taken before (a
    /// collector that started again), and were taken up from there.
    pub writes_renumbered: AtomicU64,
    pub values_written: AtomicU64,
    /// Time the workers spent committing writes (a write is placed whole between two
    /// bursts).
    pub commit_ns: AtomicU64,
    /// The longest time a sync stage held its worker in one go (a pass, or writes taken
    /// and committed between two bursts), when the worker forwards nothing: a large
    /// write's commit and the pass that then sends its changes, or a large table's take.
    pub longest_pause_ns: AtomicU64,
    /// Written locations whose changes since their part arrived were kept.
    pub changes_kept: AtomicU64,
    /// Entries of writes into tables refused whole (words missing, fields that do not fit,
    /// a full table), and register values wider than their cells.
    pub entries_refused: AtomicU64,
    /// Updates sent, by why they went ([`SentByCause`]).
    pub sent_at_threshold: AtomicU64,
    pub sent_displaced: AtomicU64,
    pub sent_timed_out: AtomicU64,
    pub sent_exact: AtomicU64,
    pub sent_by_refresh: AtomicU64,
    /// When the first message and the last were sent (the stages' clock, Unix ns; 0:
    /// none yet) as the run went: what the messages' mean rate is over.
    pub first_sent_ns: AtomicU64,
    pub last_sent_ns: AtomicU64,
    /// What the stages sent as the run ended (every change left, and every location once
    /// more), apart from the rest: entries and bytes (also in `bytes`).
    pub final_entries: AtomicU64,
    pub final_bytes: AtomicU64,
    /// Streams that found their messages past their share of the channel over
    /// `RATE_LOOK_NS` (each says so once in the log).
    pub streams_over_channel: AtomicU64,
    /// The synced locations of a worker's stream, the most of any: what `slots` is
    /// worth raising to.
    pub locations: AtomicU64,
}

impl SyncCounters {
    fn add(counter: &AtomicU64, n: u64) {
        if n > 0 {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}

impl SyncSettings {
    /// Checks the settings for a run of `workers` workers; errors name the key and the fix.
    pub fn plan(&self, workers: usize) -> Result<SyncPlan, String> {
        let collector = crate::units::destination("sync.collector", &self.collector)
            .map_err(|e| format!("{e}; where `stateplane collector` listens"))?;
        let mbps = self.channel_mbps.unwrap_or(100.0);
        if !(mbps.is_finite() && (0.001..=1_000_000.0).contains(&mbps)) {
            return Err(format!(
                "sync.channel_mbps: {mbps} is not a rate; give the channel's Mbit/s, 0.001 to 1000000"
            ));
        }
        let bytes_per_second = (mbps * 125_000.0) as u64;
        let capacity = RateController::capacity_of(bytes_per_second, ENTRY_LEN as u64);
        // The channel is the switch's; each worker's stream gets its share.
        let capacity = (capacity / workers as u64).max(1);
        let threshold_kind = match &self.threshold {
            None => Threshold::Adaptive(RateController::new(capacity)),
            Some(ThresholdSetting::Named(n)) if n == "adaptive" => {
                Threshold::Adaptive(RateController::new(capacity))
            }
            // The channel's rate is the rate controller's alone: with a fixed threshold
            // it would be accepted and do nothing.
            Some(ThresholdSetting::Fixed(t)) if self.channel_mbps.is_some() => {
                return Err(format!(
                    "sync.channel_mbps: with threshold = {t} nothing uses it (it sets the adaptive threshold's capacity); remove channel_mbps, or set threshold = \"adaptive\""
                ));
            }
            Some(ThresholdSetting::Fixed(t)) => Threshold::Fixed(*t),
            Some(ThresholdSetting::Named(other)) => {
                return Err(format!(
                    "sync.threshold: '{other}' is neither \"adaptive\" nor a number (0 sends every change)"
                ));
            }
        };
        let refresh_ms = self.refresh_ms.unwrap_or(1000);
        if !(10..=3_600_000).contains(&refresh_ms) {
            return Err(format!(
                "sync.refresh_ms: {refresh_ms} is out of range; give 10 to 3600000 (the refresh is what makes the collector's copy exact again after a loss)"
            ));
        }
        let max_age_ms = self.max_age_ms.unwrap_or(10);
        if !(1..=3_600_000).contains(&max_age_ms) {
            return Err(format!(
                "sync.max_age_ms: {max_age_ms} is out of range; give 1 to 3600000"
            ));
        }
        let slots = self.slots.unwrap_or(1 << 16);
        if !(1..=1 << 24).contains(&slots) {
            return Err(format!(
                "sync.slots: {slots} is out of range; give 1 to 16777216"
            ));
        }
        // Each worker's read handler keeps a table of that many slots.
        stateplane_mem::budget::claim_once(
            "sync.slots",
            || format!("sync tables of {slots} slots for {workers} workers"),
            stateplane_sync::read_handler::ReadHandler::bytes_for(slots)
                .saturating_mul(workers as u64),
        )
        .map_err(|e| format!("sync.slots: {e}"))?;
        stateplane_mem::budget::claim_once(
            "sync",
            || {
                let kept = stateplane_sync::sender::KEPT_MESSAGES;
                format!("the last {kept} messages each of {workers} workers keeps to send again")
            },
            stateplane_sync::sender::KEPT_BYTES_MOST.saturating_mul(workers as u64),
        )
        .map_err(|e| format!("sync: {e}"))?;
        let key = match &self.key_file {
            None => None,
            Some(path) => Some(read_key(path).map_err(|e| format!("sync.key_file: {e}"))?),
        };
        let adaptive = matches!(threshold_kind, Threshold::Adaptive(_));
        Ok(SyncPlan {
            collector,
            key,
            sender: SenderConfig {
                switch: self.switch.unwrap_or(1),
                epoch: 0,
                stream: 0,
                slots,
                threshold: threshold_kind,
                max_age_ns: max_age_ms * 1_000_000,
                heartbeat_ns: HEARTBEAT_NS,
                batch_ns: BATCH_NS,
                refresh_ns: refresh_ms * 1_000_000,
                states: Vec::new(),
            },
            counters: Arc::new(SyncCounters::default()),
            states: Vec::new(),
            first_id: 0,
            // The channel's capacity, and each worker's share of it, where a rate
            // controller keeps to them.
            channel_mbps: adaptive.then_some(mbps),
            share_mbps: adaptive.then_some(mbps / workers as f64),
        })
    }
}

/// The key in `path`: 64 hexadecimal digits (surrounding white space is ignored).
pub fn read_key(path: &std::path::Path) -> Result<Key, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    Key::from_hex(&text).map_err(|e| format!("{}: {e}", path.display()))
}

impl SyncPlan {
    /// Slots of each worker's read handler (`sync.slots`).
    pub fn slots(&self) -> usize {
        self.sender.slots
    }

    /// One stage per worker, each with a socket of its own toward the collector. Each
    /// stage draws its epoch at random, which tells the collector that its stream starts
    /// over (a clock's seconds would repeat for a switch restarted within one, and a
    /// factory may make the stages of several runs).
    pub fn factory(&self) -> Result<StateStageFactory, String> {
        // Opened here, so that a collector address no socket can reach is refused before
        // the run starts.
        open_socket(self.collector).map_err(|e| format!("sync.collector: {e}"))?;
        let plan = self.clone();
        Ok(Arc::new(move |w| {
            let socket = open_socket(plan.collector).ok();
            if socket.is_none() {
                log::warn!(
                    "sync: worker {w} could not open its socket to {}",
                    plan.collector
                );
            }
            Box::new(SyncStage {
                message_entries: message_entries(socket.as_ref()),
                clock: std::time::Instant::now(),
                started_unix_ns: unix_now_ns(),
                next_pass_ns: 0,
                next_receive_ns: 0,
                bursts_unclocked: 0,
                resident: false,
                open_since_ns: None,
                counted: SentByCause::default(),
                finishing: false,
                share_mbps: plan.share_mbps,
                sent_bytes: 0,
                rate_look: None,
                warned_over_channel: false,
                config: SenderConfig {
                    epoch: new_epoch(),
                    stream: w as u16,
                    ..plan.sender.clone()
                },
                key: plan.key.clone(),
                socket,
                sender: None,
                writes: WriteStage::default(),
                answers: Vec::new(),
                changes: Vec::new(),
                written: Vec::new(),
                out: Vec::new(),
                bytes: Vec::new(),
                datagram: vec![0; 65_536],
                counters: plan.counters.clone(),
                warned: false,
            })
        }))
    }
}

/// Nanoseconds since the Unix epoch (0 for a clock set before it).
fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// A random epoch (never 0).
fn new_epoch() -> u32 {
    (stateplane_wire::flow::random_seed() as u32).max(1)
}

/// A socket connected to `collector`, not blocking.
fn open_socket(collector: SocketAddr) -> std::io::Result<UdpSocket> {
    let local: SocketAddr = match collector {
        SocketAddr::V4(_) => "0.0.0.0:0".parse().unwrap_or(collector),
        SocketAddr::V6(_) => "[::]:0".parse().unwrap_or(collector),
    };
    let socket = UdpSocket::bind(local)?;
    socket.connect(collector)?;
    socket.set_nonblocking(true)?;
    // Room for a write's parts in flight (up to 128 datagrams of up to 64 KiB): the
    // default buffer holds three, and the rest would be dropped and sent again.
    if let Err(e) = stateplane_io::udp_socket::set_receive_buffer(&socket, RECEIVE_BUFFER) {
        log::warn!("sync: could not enlarge the socket's receive buffer: {e}");
    }
    Ok(socket)
}

struct SyncStage {
    config: SenderConfig,
    key: Option<Key>,
    socket: Option<UdpSocket>,
    /// Made at the first pass, from the state the program tracks.
    sender: Option<Sender>,
    writes: WriteStage,
    /// The committed writes' answers on their way out (kept for the next).
    answers: Vec<Message>,
    changes: Vec<Change>,
    /// Registers' locations the writes committed since the last pass wrote: their changes
    /// go as a write's (`Sender::change_written`), as a table's do that say so.
    written: Vec<Location>,
    out: Vec<Message>,
    bytes: Vec<u8>,
    datagram: Vec<u8>,
    counters: Arc<SyncCounters>,
    warned: bool,
    /// Entries a message carries: as many as one datagram on the path to the collector
    /// holds (its MTU, as the kernel knows it; all of 64 KiB on loopback).
    message_entries: usize,
    /// The stage's clock: `started_unix_ns` plus the time since `clock`.
    clock: std::time::Instant,
    started_unix_ns: u64,
    /// No pass after a burst before this (see `PASS_SHARE`).
    next_pass_ns: u64,
    /// No datagrams taken between passes before this, unless a write's parts are arriving.
    next_receive_ns: u64,
    /// Bursts since the clock was last read.
    bursts_unclocked: u32,
    /// The program's synced state has its pages ([`Running::make_synced_resident`]).
    resident: bool,
    /// When the first pass whose take was cut short (`CHANGES_PER_PASS`) began, while
    /// the passes after it have not taken every change: their messages' batch is open.
    open_since_ns: Option<u64>,
    /// What the sender had sent, by cause, when the counters last took it.
    counted: SentByCause,
    /// The run is ending ([`StateStage::finish`]): what goes now is counted apart.
    finishing: bool,
    /// This stream's share of the channel (with `t` adaptive), the bytes it has sent as
    /// the run went, its last look at its rate (when, its bytes then, and what it had sent
    /// by cause), and whether it has said it went past its share.
    share_mbps: Option<f64>,
    sent_bytes: u64,
    rate_look: Option<(u64, u64, SentByCause)>,
    warned_over_channel: bool,
}

/// The changed words a pass at `now_ns` takes from a table, its batch open since
/// `open_since_ns` if the passes before it left changes: `CHANGES_PER_PASS`, or every
/// change left once the batch has been open `MAX_OPEN_NS`.
fn take_budget(now_ns: u64, open_since_ns: Option<u64>) -> usize {
    match open_since_ns {
        Some(since) if now_ns.saturating_sub(since) >= MAX_OPEN_NS => usize::MAX,
        _ => CHANGES_PER_PASS,
    }
}

/// When the pass after one that began at `now_ns` and took `took` is due, its batch open
/// since `open_since_ns` if it left changes to take:
/// - with every change taken, `PASS_SHARE` times `took` later, and never further apart
///   than a change may wait unsent (`max_age_ns`): the user's choice between freshness and
///   what the passes cost a worker whose synced state changes all over (a large table's
///   flows);
/// - with changes left, after as long again of forwarding (half the worker's time) while
///   the batch is younger than `max_age_ns`, and then at once, after one burst: a data
///   plane that changes more between two passes than a pass takes (a flood of new flows)
///   would otherwise keep the batch open until `MAX_OPEN_NS` and its take of everything
///   left, one long pause.
fn next_pass_due(now_ns: u64, took: u64, open_since_ns: Option<u64>, max_age_ns: u64) -> u64 {
    match open_since_ns {
        None => now_ns + (took * PASS_SHARE).min(max_age_ns),
        Some(since) if now_ns.saturating_sub(since) < max_age_ns => now_ns + took,
        Some(_) => now_ns,
    }
}

/// The entries one datagram to the socket's peer carries whole, with a MAC.
fn message_entries(socket: Option<&UdpSocket>) -> usize {
    let payload = socket
        .and_then(|s| stateplane_io::udp_socket::max_payload(s).ok())
        .unwrap_or(1472);
    (payload.saturating_sub(HEADER_LEN + MAC_LEN) / ENTRY_LEN).clamp(1, MAX_DATAGRAM_ENTRIES)
}

/// The program's synced state read a location at a time (as the refresh reads it) and whole
/// entries at a time underneath: a table encodes a whole slot to read one of its words. Lives
/// for one poll of the sender, during which the state does not change.
struct EntryReader<'a> {
    program: &'a dyn Running,
    state: u16,
    /// The locations `words` holds: `first..first + len`.
    first: u32,
    len: u32,
    words: [u64; MAX_STRIDE],
}

impl<'a> EntryReader<'a> {
    fn new(program: &'a dyn Running) -> Self {
        EntryReader {
            program,
            state: 0,
            first: 0,
            len: 0,
            words: [0; MAX_STRIDE],
        }
    }

    /// The value at `location` (0 past its state's end).
    fn read(&mut self, location: Location) -> u64 {
        if self.held(location).is_none() {
            // As many whole entries as the buffer holds: the refresh reads on from here.
            let Location { state, index } = location;
            let stride = (self.program.synced_stride(state)).clamp(1, MAX_STRIDE as u32);
            let first = index - index % stride;
            let words = &mut self.words[..(MAX_STRIDE as u32 / stride * stride) as usize];
            let read = self.program.read_synced_run(state, first, words);
            (self.state, self.first, self.len) = (state, first, read as u32);
        }
        self.held(location).map_or(0, |at| self.words[at])
    }

    /// Where `words` holds `location`, if it does.
    fn held(&self, Location { state, index }: Location) -> Option<usize> {
        let at = index.checked_sub(self.first).filter(|&at| at < self.len)?;
        (state == self.state).then_some(at as usize)
    }
}

/// The program's synced state, as the write stage reads and writes it, noting the
/// locations written where given a set: a register's (a table's words are numbered by
/// entry, not by slot: its entries land where their keys hash, and the table marks the
/// slots its placing writes, whose changes say so: `Change::by_write`).
struct ProgramState<'a>(&'a mut dyn Running, Option<&'a mut Vec<Location>>);

impl WriteTarget for ProgramState<'_> {
    fn read(&self, location: Location) -> u64 {
        self.0
            .read_synced(location.state, location.index)
            .unwrap_or(0)
    }

    fn write(&mut self, location: Location, value: u64) {
        self.write_run(location, &[value]);
    }

    fn write_run(&mut self, first: Location, values: &[u64]) {
        // A location past the state's end writes nothing; the collector's copy, sent
        // back by the refresh, shows it.
        self.0.write_synced_run(first.state, first.index, values);
        if let Some(written) = &mut self.1
            && self.0.synced_stride(first.state) == 1
        {
            let indexes = (first.index..).take(values.len());
            written.extend(indexes.map(|index| Location { index, ..first }));
        }
    }

    fn finish(&mut self) -> u64 {
        self.0.commit_synced_write()
    }

    fn stage_run(&mut self, first: Location, values: &[u64]) -> bool {
        self.0.stage_synced_run(first.state, first.index, values)
    }

    fn drop_staged(&mut self) {
        self.0.drop_synced_write();
    }

    fn extent(&self, state: u16) -> u32 {
        (self.0.synced().into_iter())
            .find(|&(id, _)| id == state)
            .map_or(0, |(_, locations)| locations)
    }
}

impl SyncStage {
    fn sender(&mut self, program: &dyn Running) -> &mut Sender {
        let (config, counters) = (&self.config, &self.counters);
        let entries = self.message_entries;
        self.sender.get_or_insert_with(|| {
            let states: Vec<SyncedState> = (program.synced().into_iter())
                .map(|(id, length)| SyncedState {
                    id,
                    length,
                    stride: program.synced_stride(id),
                })
                .collect();
            let locations = states.iter().map(|s| u64::from(s.length)).sum();
            (counters.locations).fetch_max(locations, Ordering::Relaxed);
            Sender::new(SenderConfig {
                states,
                ..config.clone()
            })
            .with_message_entries(entries)
        })
    }

    fn now_ns(&self) -> u64 {
        self.started_unix_ns + self.clock.elapsed().as_nanos() as u64
    }

    /// Takes the changes since the last pass into the sender, up to `budget` of a
    /// table's; whether every change was taken.
    fn take_changes(&mut self, program: &mut dyn Running, now_ns: u64, budget: usize) -> bool {
        let started_ns = self.now_ns();
        let whole = program.changes(&mut self.changes, budget);
        let taken_ns = self.now_ns();
        SyncCounters::add(&self.counters.take_ns, taken_ns.saturating_sub(started_ns));
        SyncCounters::add(&self.counters.changes, self.changes.len() as u64);
        let mut changes = std::mem::take(&mut self.changes);
        let mut written = std::mem::take(&mut self.written);
        written.sort_unstable();
        written.dedup();
        let at = |c: &Change| Location {
            state: c.state,
            index: c.index,
        };
        // A write is mostly a range: most changes fall outside it at one comparison.
        let span = written.first().copied().zip(written.last().copied());
        // A table's change says so itself; a register's location is in `written`.
        let by_write = |c: &Change| {
            let l = at(c);
            c.by_write
                || span.is_some_and(|(low, high)| low <= l && l <= high)
                    && written.binary_search(&l).is_ok()
        };
        let sender = self.sender(program);
        let total = (changes.iter()).fold(0u64, |sum, c| {
            sum.saturating_add(if by_write(c) { 1 } else { c.cost() })
        });
        sender.expect_change(now_ns, total);
        /// Changes looked ahead (see [`Sender::prefetch`]): on `counter`'s table of 5.8 M
        /// words, 16 take a fifth off the read handler's time against 8, and 32 no more
        /// (docs/BENCHMARKS.md, "A flow table: counter").
        const AHEAD: usize = 16;
        for (i, c) in changes.iter().enumerate() {
            if let Some(next) = changes.get(i + AHEAD) {
                sender.prefetch(at(next));
            }
            if c.exact {
                sender.change_exact(at(c), c.old, c.new);
            } else if by_write(c) {
                sender.change_written(now_ns, at(c), c.old, c.new);
            } else {
                sender.change(now_ns, at(c), c.old, c.new);
            }
        }
        changes.clear();
        self.changes = changes;
        let handled_ns = self.now_ns().saturating_sub(taken_ns);
        SyncCounters::add(&self.counters.handle_ns, handled_ns);
        whole
    }

    /// Takes what the collector sent: reports, and parts of writes (acknowledged). A part
    /// that carries values is the last datagram taken: a table decodes a part's
    /// thousands of entries as it takes it, and parts come faster than that, so that
    /// taking every one waiting would hold the worker for a whole write; the worker comes
    /// back for the next after its next burst (or at once, woken by the socket, when
    /// idle).
    fn receive(&mut self, program: &mut dyn Running, now_ns: u64) {
        for _ in 0..RECEIVE_PER_PASS {
            let Some(socket) = &self.socket else { return };
            let n = match socket.recv(&mut self.datagram) {
                Ok(n) => n,
                // Would block, or an ICMP error of an earlier send: nothing (more) to take.
                Err(_) => break,
            };
            let writes = &self.writes;
            let datagram = &self.datagram[..n];
            let held = |m: &Message| writes.holds_part(m);
            let decoded = Message::decode_write_part(self.key.as_ref(), datagram, held);
            let (message, stretch) = match decoded {
                Ok(m) => m,
                Err(e) => {
                    SyncCounters::add(&self.counters.refused, 1);
                    log::debug!(
                        "sync: refused a datagram from the collector: {}",
                        e.reason()
                    );
                    continue;
                }
            };
            let ours = (message.switch, message.epoch, message.stream)
                == (self.config.switch, self.config.epoch, self.config.stream);
            match message.kind {
                Kind::Report if ours => {
                    SyncCounters::add(&self.counters.reports, 1);
                    if let Some(sender) = &mut self.sender {
                        sender.on_report(now_ns, &message);
                    }
                }
                Kind::Nack if ours => {
                    let mut again = Vec::new();
                    if let Some(sender) = &mut self.sender {
                        sender.on_nack(&message, &mut again);
                    }
                    SyncCounters::add(&self.counters.resent, again.len() as u64);
                    for m in again {
                        self.send(&m, 1);
                    }
                }
                Kind::Write if ours => {
                    let carried = stretch.is_some() || !message.entries.is_empty();
                    SyncCounters::add(&self.counters.write_parts, 1);
                    let w = &self.writes;
                    let (abandoned, renumbered, refused) = (w.abandoned, w.renumbered, w.refused);
                    let state = &mut ProgramState(program, None);
                    let answer = self.writes.on_part_carrying(message, stretch, state);
                    let dropped = self.writes.abandoned - abandoned;
                    SyncCounters::add(&self.counters.writes_abandoned, dropped);
                    // A malformed part is a datagram refused, as one that does not decode.
                    let malformed = self.writes.refused - refused;
                    SyncCounters::add(&self.counters.refused, malformed);
                    if self.writes.renumbered > renumbered {
                        SyncCounters::add(&self.counters.writes_renumbered, 1);
                        log::info!(
                            "sync: stream {}: the collector's writes come numbered anew (it \
                             started again); what was staged of the old numbering is dropped",
                            self.config.stream
                        );
                    }
                    if let Some(ack) = answer {
                        let copies = self.writes.ack_copies(self.loss_to_collector());
                        self.send(&ack, copies);
                    }
                    if carried {
                        return;
                    }
                }
                _ => SyncCounters::add(&self.counters.refused, 1),
            }
        }
    }

    /// The share of this stream's messages the path to the collector loses, as the
    /// collector's reports show (0 before any): the acknowledgements of writes take the
    /// same path back, in as many copies as it asks for.
    fn loss_to_collector(&self) -> f64 {
        self.sender.as_ref().map_or(0.0, Sender::loss_to_collector)
    }

    /// Encodes `m` (with the MAC, where keyed) once and sends it to the collector in
    /// `copies` datagrams.
    fn send(&mut self, m: &Message, copies: usize) {
        let Some(socket) = &self.socket else { return };
        self.bytes.clear();
        m.encode_with(self.key.as_ref(), &mut self.bytes);
        for _ in 0..copies {
            match socket.send(&self.bytes) {
                Ok(n) => {
                    SyncCounters::add(&self.counters.messages, 1);
                    SyncCounters::add(&self.counters.bytes, n as u64);
                    if self.finishing {
                        SyncCounters::add(&self.counters.final_bytes, n as u64);
                    } else {
                        self.sent_bytes += n as u64;
                        let now_ns = self.now_ns();
                        let _ = (self.counters.first_sent_ns).compare_exchange(
                            0,
                            now_ns,
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        );
                        (self.counters.last_sent_ns).fetch_max(now_ns, Ordering::Relaxed);
                    }
                }
                Err(e) => {
                    SyncCounters::add(&self.counters.send_errors, 1);
                    if !self.warned {
                        self.warned = true;
                        log::warn!(
                            "sync: stream {}: sending to the collector failed ({e}); counting the failures, the refresh makes up for them",
                            self.config.stream
                        );
                    }
                }
            }
        }
    }

    fn send_out(&mut self) {
        let mut out = std::mem::take(&mut self.out);
        // The bound the collector gives values is the `t_max` of the message of changes
        // that carried them (a layout's entries are no values).
        let of_changes = |m: &&Message| matches!(m.kind, Kind::Updates | Kind::Refresh);
        for m in out
            .iter()
            .filter(of_changes)
            .filter(|m| !m.entries.is_empty())
        {
            SyncCounters::add(&self.counters.threshold_sum, m.t_max);
            SyncCounters::add(&self.counters.threshold_messages, 1);
            (self.counters.largest_threshold).fetch_max(m.t_max, Ordering::Relaxed);
        }
        for m in out.drain(..) {
            self.send(&m, 1);
        }
        self.out = out;
        self.count_sent();
    }

    /// Adds what the sender sent since the last count to the counters, by cause (as the
    /// run ends, to what it sent then).
    fn count_sent(&mut self) {
        let Some(sender) = &self.sender else { return };
        let now = SentByCause::of(sender);
        let c = &self.counters;
        let before = std::mem::replace(&mut self.counted, now);
        let new = now.since(&before);
        if self.finishing {
            SyncCounters::add(&c.final_entries, new.total());
            return;
        }
        for (counter, n) in [
            (&c.sent_at_threshold, new.threshold),
            (&c.sent_displaced, new.displaced),
            (&c.sent_timed_out, new.timed_out),
            (&c.sent_exact, new.exact),
            (&c.sent_by_refresh, new.refresh),
        ] {
            SyncCounters::add(counter, n);
        }
        self.look_at_rate(now);
    }

    /// Once every `RATE_LOOK_NS`, until it has said so once: whether the stream's messages
    /// took more than its share of the channel over that time, said in the log with the
    /// cause that sent the most (`sent`: what the sender has sent so far, by cause), so
    /// that a switch that runs for days does not keep it to its summary.
    fn look_at_rate(&mut self, sent: SentByCause) {
        let Some(share) = self.share_mbps.filter(|_| !self.warned_over_channel) else {
            return;
        };
        let now_ns = self.now_ns();
        let (since_ns, bytes, before) =
            *(self.rate_look).get_or_insert((now_ns, self.sent_bytes, sent));
        let span_ns = now_ns.saturating_sub(since_ns);
        if span_ns < RATE_LOOK_NS {
            return;
        }
        self.rate_look = Some((now_ns, self.sent_bytes, sent));
        let mbps = self.sent_bytes.saturating_sub(bytes) as f64 * 8.0 / span_ns as f64 * 1e3;
        if mbps <= share * OVER_CHANNEL {
            return;
        }
        self.warned_over_channel = true;
        SyncCounters::add(&self.counters.streams_over_channel, 1);
        let window = sent.since(&before);
        let locations = SyncCounters::get(&self.counters.locations);
        let (n, why) = window.largest(self.config.slots, locations);
        log::warn!(
            "sync: stream {} sent {mbps:.1} Mbit/s over the last {:.1} s, {:.1}x its share of \
             sync.channel_mbps ({share:.1} Mbit/s): the threshold holds back only the updates it \
             sends, and {n} of its {} went {why} (said once; the summary and \
             stateplane_sync_updates_sent_total count them all)",
            self.config.stream,
            span_ns as f64 / 1e9,
            mbps / share,
            window.total()
        );
    }

    /// Commits every write whole that has all its parts; whether any was.
    fn commit_writes(&mut self, program: &mut dyn Running) -> bool {
        let mut any = false;
        loop {
            let started_ns = self.now_ns();
            let committing = &mut ProgramState(program, Some(&mut self.written));
            let Some(done) = self.writes.commit(committing) else {
                break;
            };
            let took = self.now_ns().saturating_sub(started_ns);
            SyncCounters::add(&self.counters.commit_ns, took);
            SyncCounters::add(&self.counters.writes_committed, 1);
            SyncCounters::add(&self.counters.values_written, done.values);
            SyncCounters::add(&self.counters.changes_kept, done.changes_kept);
            SyncCounters::add(&self.counters.entries_refused, done.refused);
            if done.refused > 0 {
                log::warn!(
                    "sync: write {} committed with {} table entries or register values refused \
                     (words missing, fields that do not fit the declaration, a full table, a \
                     table also replicated, whose entries change through its store alone, or a \
                     value wider than its register's cells)",
                    done.id,
                    done.refused
                );
            }
            any = true;
        }
        any
    }

    /// Takes the collector's datagrams (acknowledging each part as it comes) and commits
    /// every write whole, then answers each committed write with what its state refused:
    /// the engine's "committed" is the switch's. Whether any write committed.
    fn exchange(&mut self, program: &mut dyn Running, now_ns: u64) -> bool {
        self.receive(program, now_ns);
        let committed = self.commit_writes(program);
        let mut answers = std::mem::take(&mut self.answers);
        self.writes.take_answers(&mut answers);
        let copies = WriteStage::answer_copies(self.loss_to_collector());
        for answer in answers.drain(..) {
            self.send(&answer, copies);
        }
        self.answers = answers;
        committed
    }

    /// Between two bursts, or on a tick: a whole pass when its pace allows; otherwise the
    /// collector's datagrams taken (on a tick, at least every `RECEIVE_EVERY_NS`, and each
    /// time while a write's parts are arriving) and the writes whole committed, so that a
    /// write does not wait for the passes' pace.
    fn between_bursts(&mut self, program: &mut dyn Running, tick: bool) {
        if !self.resident {
            // Before the first pass, in the worker that runs the program: the pages are
            // supplied to the thread that uses them, and to no copy that never runs.
            program.make_synced_resident();
            self.resident = true;
        }
        let now_ns = self.now_ns();
        if now_ns >= self.next_pass_ns {
            self.pass(program);
        } else if tick || self.writes.holds_parts() || now_ns >= self.next_receive_ns {
            self.next_receive_ns = now_ns + RECEIVE_EVERY_NS;
            if self.exchange(program, now_ns) {
                self.changes_due(now_ns);
            }
        } else {
            return;
        }
        let took = self.now_ns().saturating_sub(now_ns);
        (self.counters.longest_pause_ns).fetch_max(took, Ordering::Relaxed);
    }

    /// One pass: changes in, the collector's messages taken, the writes whole committed,
    /// the sender's messages out.
    fn pass(&mut self, program: &mut dyn Running) {
        let now_ns = self.now_ns();
        let whole = self.take_changes(program, now_ns, take_budget(now_ns, self.open_since_ns));
        let committed = self.exchange(program, now_ns);
        self.next_receive_ns = now_ns + RECEIVE_EVERY_NS;
        let mut out = std::mem::take(&mut self.out);
        let mut reader = EntryReader::new(program);
        if let Some(sender) = &mut self.sender {
            if whole {
                sender.poll(now_ns, |l| reader.read(l), &mut out);
            } else {
                sender.poll_open(now_ns, &mut out);
            }
        }
        self.out = out;
        self.send_out();
        let took = self.now_ns() - now_ns;
        SyncCounters::add(&self.counters.passes, 1);
        SyncCounters::add(&self.counters.pass_ns, took);
        if whole {
            self.open_since_ns = None;
        } else {
            SyncCounters::add(&self.counters.passes_cut, 1);
            self.open_since_ns.get_or_insert(now_ns);
        }
        self.next_pass_ns = next_pass_due(now_ns, took, self.open_since_ns, self.config.max_age_ns);
        if committed {
            self.changes_due(now_ns);
        }
    }

    /// Writes committed: their changes (the slots a table's entries landed in, the values
    /// a register holds now) go out with the next pass, due at once, after the next
    /// burst. Taken with the commit, they would lengthen the worker's pause in forwarding
    /// by the take of every slot the write changed (a third of it for a table of 65,536
    /// connections).
    fn changes_due(&mut self, now_ns: u64) {
        self.next_pass_ns = now_ns;
    }
}

impl StateStage for SyncStage {
    fn after_burst(&mut self, program: &mut dyn Running, _ctx: &Context) {
        self.bursts_unclocked += 1;
        if self.bursts_unclocked < CLOCK_EVERY_BURSTS {
            return;
        }
        self.bursts_unclocked = 0;
        self.between_bursts(program, false);
    }

    fn tick(&mut self, program: &mut dyn Running, _ctx: &Context) {
        // Live ports tick every millisecond under traffic, and when the socket wakes an
        // idle worker (`wake_fd`): the pace holds here too, but what woke it is taken.
        self.between_bursts(program, true);
    }

    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        use std::os::fd::AsRawFd;
        self.socket.as_ref().map(|s| s.as_raw_fd())
    }

    fn reloaded(&mut self, _old: &mut dyn Running, program: &mut dyn Running, _ctx: &Context) {
        // The new instance holds what it kept of the old one's state (`Program::inherit`),
        // tracked afresh: a new epoch tells the collector to start the stream over.
        self.config.epoch = new_epoch();
        self.count_sent();
        self.sender = None;
        self.counted = SentByCause::default();
        self.rate_look = None;
        self.open_since_ns = None;
        self.writes = WriteStage::default();
        self.resident = false;
        self.sender(program);
    }

    fn finish(&mut self, program: &mut dyn Running, _ctx: &Context) {
        let now_ns = self.now_ns();
        self.count_sent();
        self.finishing = true;
        self.take_changes(program, now_ns, usize::MAX);
        let mut out = std::mem::take(&mut self.out);
        let mut reader = EntryReader::new(program);
        if let Some(mut sender) = self.sender.take() {
            // Sent as they are made: a large table's refresh is not held whole.
            let mut flush = |made: &mut Vec<Message>| {
                std::mem::swap(&mut self.out, made);
                self.send_out();
                std::mem::swap(&mut self.out, made);
            };
            sender.finish(now_ns, |l| reader.read(l), &mut out, &mut flush);
            self.sender = Some(sender);
        }
        self.out = out;
        self.send_out();
    }
}

/// Updates sent, by why they went: the threshold holds back only the first kind, so that
/// the others are what can take the channel past the capacity the rate controller keeps
/// to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SentByCause {
    /// A counting value's divergence reached the threshold.
    pub threshold: u64,
    /// Another location took its slot of the read handler's table (which holds `slots` of
    /// the synced state's locations), whatever its divergence.
    pub displaced: u64,
    /// It waited longer than `max_age_ms` (within the channel's room).
    pub timed_out: u64,
    /// Sent at each change: a table's key and action words, and what writes changed.
    pub exact: u64,
    /// The anti-entropy refresh, every location every `refresh_ms`.
    pub refresh: u64,
}

impl SentByCause {
    fn of(sender: &Sender) -> SentByCause {
        let h = sender.handler.counters;
        SentByCause {
            threshold: h.sent_divergent,
            displaced: h.sent_displaced,
            timed_out: h.sent_timed_out,
            exact: h.sent_exact,
            refresh: sender.refreshed_sent,
        }
    }

    fn total(&self) -> u64 {
        self.threshold + self.displaced + self.timed_out + self.exact + self.refresh
    }

    /// What these less `before` are.
    fn since(&self, before: &SentByCause) -> SentByCause {
        SentByCause {
            threshold: self.threshold.saturating_sub(before.threshold),
            displaced: self.displaced.saturating_sub(before.displaced),
            timed_out: self.timed_out.saturating_sub(before.timed_out),
            exact: self.exact.saturating_sub(before.exact),
            refresh: self.refresh.saturating_sub(before.refresh),
        }
    }

    /// The cause that sent the most, as "its name: what lowers it" (a read handler of
    /// `slots` for a stream's `locations`), with how many it sent.
    fn largest(&self, slots: usize, locations: u64) -> (u64, String) {
        [
            (
                self.displaced,
                format!(
                    "displaced: more locations change than the read handler's {slots} slots \
                     hold; more sync.slots (up to {locations}, the synced locations of a \
                     stream) keep more of them until the threshold, and a larger \
                     sync.max_age_ms lets more changes of a location meet in the state first"
                ),
            ),
            (
                self.exact,
                "exact: entries came, went or moved in a synced table, and each word of a slot \
                 goes at its change"
                    .to_string(),
            ),
            (
                self.refresh,
                "by the refresh: a larger sync.refresh_ms sends every location less often"
                    .to_string(),
            ),
            (
                self.timed_out,
                "timed out: a larger sync.max_age_ms sends them less often".to_string(),
            ),
            (
                self.threshold,
                "at the threshold: the collector's reports lower the capacity where the channel \
                 loses"
                    .to_string(),
            ),
        ]
        .into_iter()
        .max_by_key(|(n, _)| *n)
        .unwrap_or_default()
    }
}

/// What a run's sync stages did, for its summary.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct SyncReport {
    pub collector: String,
    /// Each synced name's state id, as the collector and `ctl sync` name the state.
    pub states: std::collections::BTreeMap<String, u16>,
    pub changes: u64,
    pub passes: u64,
    /// Passes that left changes of a table to the next ([`SyncCounters::passes_cut`]).
    pub passes_cut: u64,
    /// Seconds the workers spent in the sync stage's passes; of them, taking the changes
    /// from the state, and handing them to the read handler (the rest: the collector's
    /// datagrams, writes committed, messages made and sent).
    pub pass_seconds: f64,
    pub take_seconds: f64,
    pub handle_seconds: f64,
    /// The threshold the messages of changes carried: the mean over them, and the largest.
    pub mean_threshold: f64,
    pub largest_threshold: u64,
    pub messages: u64,
    pub bytes: u64,
    pub send_errors: u64,
    pub reports: u64,
    pub resent: u64,
    pub refused: u64,
    pub write_parts: u64,
    pub writes_committed: u64,
    pub writes_abandoned: u64,
    pub writes_renumbered: u64,
    pub values_written: u64,
    /// Seconds the workers spent committing writes, and the longest a stage held its
    /// worker in one go (see [`SyncCounters::longest_pause_ns`]).
    pub commit_seconds: f64,
    pub longest_pause_seconds: f64,
    pub changes_kept: u64,
    pub entries_refused: u64,
    /// Updates sent as the run went, by cause, and entries sent as it ended.
    pub sent: SentByCause,
    pub sent_at_end: u64,
    /// The bytes of `bytes` sent as the run ended.
    pub bytes_at_end: u64,
    /// The channel the rate controller keeps the updates within (none with a fixed
    /// threshold), and the rate the messages took on average from the first to the last
    /// as the run went.
    pub channel_mbps: Option<f64>,
    pub mean_mbps: f64,
    /// The read handler's slots, each worker's.
    pub slots: usize,
    /// Streams that said in the log that they went past their share of the channel.
    pub streams_over_channel: u64,
    /// The synced locations of a worker's stream, the most of any.
    pub locations: u64,
}

impl SyncPlan {
    /// The plan for synced state `names`: their state ids number them in the names' order,
    /// from `first` (0, or after the state replicated in snapshots), as the run's programs
    /// track them (`stateplane_programs::with_guarantees`).
    pub fn naming(mut self, mut names: Vec<String>, first: u16) -> SyncPlan {
        names.sort_unstable();
        self.states = names;
        self.first_id = first;
        self
    }

    /// The counters as of now.
    pub fn report(&self) -> SyncReport {
        let c = &*self.counters;
        let get = SyncCounters::get;
        SyncReport {
            collector: self.collector.to_string(),
            states: (self.states.iter().zip(self.first_id..))
                .map(|(name, id)| (name.clone(), id))
                .collect(),
            changes: get(&c.changes),
            passes: get(&c.passes),
            passes_cut: get(&c.passes_cut),
            pass_seconds: get(&c.pass_ns) as f64 / 1e9,
            take_seconds: get(&c.take_ns) as f64 / 1e9,
            handle_seconds: get(&c.handle_ns) as f64 / 1e9,
            mean_threshold: get(&c.threshold_sum) as f64 / get(&c.threshold_messages).max(1) as f64,
            largest_threshold: get(&c.largest_threshold),
            messages: get(&c.messages),
            bytes: get(&c.bytes),
            send_errors: get(&c.send_errors),
            reports: get(&c.reports),
            resent: get(&c.resent),
            refused: get(&c.refused),
            write_parts: get(&c.write_parts),
            writes_committed: get(&c.writes_committed),
            writes_abandoned: get(&c.writes_abandoned),
            writes_renumbered: get(&c.writes_renumbered),
            values_written: get(&c.values_written),
            commit_seconds: get(&c.commit_ns) as f64 / 1e9,
            longest_pause_seconds: get(&c.longest_pause_ns) as f64 / 1e9,
            changes_kept: get(&c.changes_kept),
            entries_refused: get(&c.entries_refused),
            sent: SentByCause {
                threshold: get(&c.sent_at_threshold),
                displaced: get(&c.sent_displaced),
                timed_out: get(&c.sent_timed_out),
                exact: get(&c.sent_exact),
                refresh: get(&c.sent_by_refresh),
            },
            sent_at_end: get(&c.final_entries),
            bytes_at_end: get(&c.final_bytes),
            channel_mbps: self.channel_mbps,
            mean_mbps: {
                let span_ns = get(&c.last_sent_ns).saturating_sub(get(&c.first_sent_ns));
                let bytes = get(&c.bytes).saturating_sub(get(&c.final_bytes));
                // Over less than a millisecond a mean says nothing.
                if span_ns < 1_000_000 {
                    0.0
                } else {
                    bytes as f64 * 8.0 / span_ns as f64 * 1e3
                }
            },
            slots: self.sender.slots,
            streams_over_channel: get(&c.streams_over_channel),
            locations: get(&c.locations),
        }
    }
}

/// How long a stream looks at its rate over, to say whether it went past its share of the
/// channel.
const RATE_LOOK_NS: u64 = 1_000_000_000;

/// Past this share of the channel the summary says the messages went over it (their
/// headers and a message a batch at least are not in the capacity the rate controller
/// keeps the entries to).
const OVER_CHANNEL: f64 = 1.1;

impl SyncReport {
    /// The updates sent by cause, the channel's use, and where the messages went over the
    /// channel, the cause that took them there and what lowers it.
    fn sent_lines(&self) -> String {
        let c = &self.sent;
        let mut s = format!(
            "  updates sent: {} at the threshold, {} displaced, {} timed out, {} exact, {} by the refresh; \
             {} as the run ended (every location once more)\n",
            c.threshold, c.displaced, c.timed_out, c.exact, c.refresh, self.sent_at_end
        );
        let Some(channel) = self.channel_mbps.filter(|_| self.mean_mbps > 0.0) else {
            return s;
        };
        s += &format!(
            "  the messages took {:.1} Mbit/s on average, of a channel of {channel} (sync.channel_mbps)\n",
            self.mean_mbps
        );
        let over = self.mean_mbps / channel;
        if over <= OVER_CHANNEL {
            return s;
        }
        let (n, why) = c.largest(self.slots, self.locations);
        s += &format!(
            "  over the channel ({over:.1}x its rate): the threshold holds back only the updates \
             it sends; {n} of {} went {why}\n",
            c.total()
        );
        s
    }

    pub fn table(&self) -> String {
        let states: Vec<String> = (self.states.iter())
            .map(|(name, id)| format!("{name} {id}"))
            .collect();
        let mut s = format!(
            "sync to {} (state ids: {}):\n  changes {}  messages {} ({} B)  reports {}  passes {} ({:.3} s: \
             {:.3} s taking the changes, {:.3} s in the read handler; the worker paused \
             {:.3} ms at most)  threshold carried: mean {:.1}, largest {}\n",
            self.collector,
            states.join(", "),
            self.changes,
            self.messages,
            self.bytes,
            self.reports,
            self.passes,
            self.pass_seconds,
            self.take_seconds,
            self.handle_seconds,
            self.longest_pause_seconds * 1e3,
            self.mean_threshold,
            self.largest_threshold
        );
        s += &self.sent_lines();
        if self.writes_committed > 0 || self.write_parts > 0 {
            s += &format!(
                "  writes committed {} ({} values, {} with their changes kept; {} parts), in \
                 {:.3} s (the worker forwards nothing while it commits)\n",
                self.writes_committed,
                self.values_written,
                self.changes_kept,
                self.write_parts,
                self.commit_seconds
            );
        }
        if self.passes_cut > 0 {
            s += &format!(
                "  {} passes left a table's changes to the next, over {} words a pass\n",
                self.passes_cut, CHANGES_PER_PASS
            );
        }
        if self.resent > 0 {
            s += &format!(
                "  {} messages the collector lost sent again at its request\n",
                self.resent
            );
        }
        if self.writes_abandoned > 0 {
            s += &format!(
                "  {} writes cancelled by the collector before they committed\n",
                self.writes_abandoned
            );
        }
        if self.writes_renumbered > 0 {
            s += &format!(
                "  {} times writes came numbered anew (a collector that started again) and \
                 were taken up from there\n",
                self.writes_renumbered
            );
        }
        for (n, what) in [
            (
                self.send_errors,
                "sends failed (is the collector listening?)",
            ),
            (self.refused, "datagrams from the collector refused"),
        ] {
            if n > 0 {
                s += &format!("  {n} {what}; the refresh makes the copy whole\n");
            }
        }
        if self.entries_refused > 0 {
            s += &format!(
                "  {} table entries or register values of writes refused (see the log)\n",
                self.entries_refused
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stateplane_runtime::{Burst, Program};
    use stateplane_state::Register;
    use std::time::{Duration, Instant};

    /// A program of one synced register whose take of changes costs `take` of the
    /// worker's time, as a big table's does.
    struct Slow {
        cells: Register<u64>,
        take: Duration,
    }

    impl Program for Slow {
        type Prepared = ();

        fn process(&mut self, _burst: &mut Burst, _ctx: &mut Context) {}

        fn changes(&mut self, out: &mut Vec<Change>, _budget: usize) -> bool {
            std::thread::sleep(self.take);
            self.cells.take_changes(out);
            true
        }

        fn synced(&self) -> Vec<(u16, u32)> {
            vec![(0, self.cells.len() as u32)]
        }

        fn read_synced(&self, _id: u16, index: u32) -> Option<u64> {
            self.cells.read(index as usize).ok()
        }

        fn write_synced(&mut self, _id: u16, index: u32, value: u64) -> Option<u64> {
            let before = self.cells.read(index as usize).ok()?;
            self.cells.write(index as usize, value).ok()?;
            Some(before)
        }
    }

    /// Two states to read: 0 of 3-word entries (10 of them), read in runs and counted; 1 of
    /// 100 single values, read one at a time (the default run). Location `i` of state `s`
    /// holds `1000 * s + i + 1`.
    struct Entries {
        runs: std::cell::Cell<u32>,
    }

    impl Program for Entries {
        type Prepared = ();

        fn process(&mut self, _burst: &mut Burst, _ctx: &mut Context) {}

        fn synced_stride(&self, id: u16) -> u32 {
            if id == 0 { 3 } else { 1 }
        }

        fn read_synced(&self, id: u16, index: u32) -> Option<u64> {
            let length = [30, 100].get(usize::from(id))?;
            (index < *length).then(|| 1000 * u64::from(id) + u64::from(index) + 1)
        }

        fn read_synced_run(&self, id: u16, first: u32, out: &mut [u64]) -> usize {
            if id == 0 {
                self.runs.set(self.runs.get() + 1);
            }
            let values = (first..).map_while(|i| Program::read_synced(self, id, i));
            out.iter_mut().zip(values).map(|(o, v)| *o = v).count()
        }
    }

    /// The refresh's reads, location after location, come from whole entries read a
    /// buffer's worth at a time, and give what one read each would: across states, back
    /// to an earlier location, past a state's end (0).
    #[test]
    fn the_refresh_reads_whole_entries_and_each_location_as_it_is() {
        let program = Entries {
            runs: std::cell::Cell::new(0),
        };
        let running: &dyn Running = &program;
        let mut reader = EntryReader::new(running);
        let at = |state, index| Location { state, index };
        for (state, length) in [(0, 30), (1, 100)] {
            for index in 0..length {
                let want = Program::read_synced(&program, state, index);
                assert_eq!(Some(reader.read(at(state, index))), want);
            }
        }
        assert_eq!(
            program.runs.get(),
            1,
            "state 0's 30 words in one run (of 63 at most)"
        );
        assert_eq!(reader.read(at(0, 4)), 5, "back to state 0");
        assert_eq!(reader.read(at(0, 30)), 0, "past the end");
        assert_eq!(reader.read(at(0, u32::MAX)), 0);
        assert_eq!(reader.read(at(1, 99)), 1100);
        assert_eq!(reader.read(at(7, 0)), 0, "a state not tracked");
    }

    /// The collector's end of a stage's channel, on loopback, its reads waiting `wait`.
    fn collector_socket(wait: Duration) -> UdpSocket {
        let collector = UdpSocket::bind("127.0.0.1:0").unwrap();
        collector.set_read_timeout(Some(wait)).unwrap();
        collector
    }

    /// A stage syncing to `collector` (as switch `switch`, with `max_age_ms`), its plan,
    /// and a program of one synced register of 64 cells whose take costs `take`.
    fn staged(
        collector: &UdpSocket,
        switch: Option<u32>,
        max_age_ms: Option<u64>,
        take: Duration,
    ) -> (SyncPlan, Box<dyn StateStage>, Box<dyn Running>) {
        let plan = SyncSettings {
            collector: collector.local_addr().unwrap().to_string(),
            switch,
            channel_mbps: None,
            threshold: None,
            refresh_ms: None,
            max_age_ms,
            slots: None,
            key_file: None,
        }
        .plan(1)
        .unwrap();
        let stage = plan.factory().unwrap()(0);
        let mut cells = Register::new(64);
        cells.track(0, 0);
        (plan, stage, Box::new(Slow { cells, take }))
    }

    /// Through the stage's own socket: where the collector's reports show the path to it
    /// losing four messages in five, a part new to the switch is acknowledged in eleven
    /// copies, and ends the pass's taking; a copy of it, its entries cut short, is taken
    /// from its header at the next (acknowledged once, not refused); a part numbered 0 is
    /// refused and counted.
    #[test]
    fn write_parts_through_the_socket_are_acknowledged_by_the_paths_loss() {
        use stateplane_sync::Update;
        use stateplane_sync::write::copies_for;
        let collector = collector_socket(Duration::from_millis(200));
        let (plan, mut stage, mut program) = staged(&collector, Some(3), None, Duration::ZERO);
        let ctx = Context::one_worker(0, stateplane_wire::FlowHasher::with_seed(1), 2);
        stage.tick(program.as_mut(), &ctx);
        let mut datagram = vec![0; 65_536];
        let (n, switch_addr) = collector.recv_from(&mut datagram).unwrap();
        let first = Message::decode(&datagram[..n]).unwrap();
        let to_switch = |kind, seq, t_max, entries| Message {
            kind,
            switch: first.switch,
            epoch: first.epoch,
            stream: first.stream,
            seq,
            sent_ns: 1,
            t_max,
            more: false,
            entries,
        };
        let send = |m: &Message, cut: usize| {
            let mut bytes = Vec::new();
            m.encode(&mut bytes);
            bytes.truncate(bytes.len() - cut);
            collector.send_to(&bytes, switch_addr).unwrap();
        };
        send(&to_switch(Kind::Report, 10, 8, Vec::new()), 0);
        let values = (0..2)
            .map(|index| Update {
                location: Location { state: 0, index },
                value: 7,
                threshold: 0,
            })
            .collect();
        let part = to_switch(Kind::Write, 5, 2, values);
        send(&part, 0);
        send(&part, 1);
        send(&to_switch(Kind::Write, 0, 2, part.entries.clone()), 0);
        let refused_before = SyncCounters::get(&plan.counters.refused);
        stage.tick(program.as_mut(), &ctx);
        assert_eq!(
            SyncCounters::get(&plan.counters.write_parts),
            1,
            "a pass ends with the first part that carries values"
        );
        stage.tick(program.as_mut(), &ctx);
        let mut acks = Vec::new();
        while let Ok(n) = collector.recv(&mut datagram) {
            let m = Message::decode(&datagram[..n]).unwrap();
            if m.kind == Kind::WriteAck {
                acks.push(m);
            }
        }
        let copies = copies_for(0.8) as usize;
        assert_eq!(copies, 11);
        assert_eq!(
            acks.len(),
            copies + 1,
            "the new part's copies, and the copy's one"
        );
        assert!(acks.iter().all(|a| a.seq == 5 && a.t_max == 1));
        let taken: Vec<u64> = acks.iter().map(|a| a.entries[0].threshold).collect();
        assert_eq!(taken.last(), Some(&2), "two datagrams of the write taken");
        assert_eq!(SyncCounters::get(&plan.counters.write_parts), 3);
        assert_eq!(
            SyncCounters::get(&plan.counters.refused) - refused_before,
            1,
            "the part numbered 0"
        );
    }

    /// A pass that took every change comes back after 50 times its length, at most
    /// `max_age`; one that left changes, after its length while its batch is younger than
    /// `max_age`, then at once.
    #[test]
    fn passes_that_leave_changes_come_back_sooner_the_longer_their_batch_is_open() {
        let ms = 1_000_000;
        assert_eq!(next_pass_due(100 * ms, ms / 10, None, 10 * ms), 105 * ms);
        assert_eq!(next_pass_due(100 * ms, ms, None, 10 * ms), 110 * ms);
        assert_eq!(
            next_pass_due(100 * ms, 3 * ms, Some(95 * ms), 10 * ms),
            103 * ms
        );
        assert_eq!(
            next_pass_due(100 * ms, 3 * ms, Some(90 * ms), 10 * ms),
            100 * ms
        );
    }

    /// A pass takes `CHANGES_PER_PASS` words, and every change left once its batch has
    /// been open `MAX_OPEN_NS` (a clock that went back leaves the budget as it is).
    #[test]
    fn a_batch_open_past_its_limit_is_ended_by_a_take_of_everything_left() {
        let at = 1_000 * MAX_OPEN_NS;
        assert_eq!(take_budget(at, None), CHANGES_PER_PASS);
        assert_eq!(
            take_budget(at, Some(at - MAX_OPEN_NS + 1)),
            CHANGES_PER_PASS
        );
        assert_eq!(take_budget(at, Some(at - MAX_OPEN_NS)), usize::MAX);
        assert_eq!(take_budget(at, Some(at + 1)), CHANGES_PER_PASS);
    }

    /// A program whose changes wait to be taken, a budget's worth a take, as a table's
    /// marked slots do.
    struct Waiting(std::collections::VecDeque<Change>);

    impl Program for Waiting {
        type Prepared = ();

        fn process(&mut self, _burst: &mut Burst, _ctx: &mut Context) {}

        fn changes(&mut self, out: &mut Vec<Change>, budget: usize) -> bool {
            let n = budget.min(self.0.len());
            out.extend(self.0.drain(..n));
            self.0.is_empty()
        }

        fn synced(&self) -> Vec<(u16, u32)> {
            vec![(0, 1 << 20)]
        }

        fn read_synced(&self, _id: u16, index: u32) -> Option<u64> {
            (index < 1 << 20).then_some(0)
        }
    }

    /// A write's changes of three passes' budget and more go over four passes, the first
    /// three cut short, and their messages make one batch, ended only once the last
    /// change is taken; being a write's, their huge values leave the threshold where the
    /// channel's capacity alone puts it.
    #[test]
    fn a_large_take_goes_over_passes_in_one_batch() {
        let collector = collector_socket(Duration::from_millis(1));
        // Most of a pass's messages, where the kernel allows (loss is no failure here).
        let _ = stateplane_io::udp_socket::set_receive_buffer(&collector, 32 << 20);
        let (plan, mut stage, _) = staged(&collector, None, None, Duration::ZERO);
        let changes = 3 * CHANGES_PER_PASS + 5;
        let mut program: Box<dyn Running> = Box::new(Waiting(
            (0..changes as u32)
                .map(|index| Change {
                    state: 0,
                    index,
                    old: 0,
                    new: u64::MAX / 2,
                    exact: false,
                    by_write: true,
                })
                .collect(),
        ));
        let ctx = Context::one_worker(0, stateplane_wire::FlowHasher::with_seed(1), 2);
        let mut datagram = vec![0; 65_536];
        let mut got = Vec::new();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            stage.tick(program.as_mut(), &ctx);
            while let Ok(n) = collector.recv(&mut datagram) {
                got.push(Message::decode(&datagram[..n]).unwrap());
            }
            // The four passes that take the changes, and one after.
            if SyncCounters::get(&plan.counters.passes) > 4 {
                break;
            }
        }
        // Three, unless a machine slow enough to keep the batch open 100 ms ends it sooner.
        let cut = SyncCounters::get(&plan.counters.passes_cut);
        assert!((1..=3).contains(&cut), "{cut} passes cut short");
        let carries = |m: &Message| (m.entries.iter()).any(|e| e.value == u64::MAX / 2);
        let last_change = (got.iter().filter(|m| carries(m)).map(|m| m.seq)).max();
        let first_end = (got.iter().filter(|m| !m.more).map(|m| m.seq)).min();
        assert!(
            last_change.is_some() && first_end >= last_change,
            "{last_change:?} {first_end:?}"
        );
        let largest = (got.iter().map(|m| m.t_max)).max().unwrap_or(0);
        assert!(largest < 1 << 20, "threshold {largest}");
    }

    /// Bursts (each changing a cell) for `run`: the passes' count and their time.
    fn passes(take: Duration, max_age_ms: u64, run: Duration) -> (u64, Duration, Duration) {
        let collector = UdpSocket::bind("127.0.0.1:0").unwrap();
        let (plan, mut stage, mut program) = staged(&collector, None, Some(max_age_ms), take);
        let ctx = Context::one_worker(0, stateplane_wire::FlowHasher::with_seed(1), 2);
        let start = Instant::now();
        let mut i = 0;
        while start.elapsed() < run {
            program.write_synced(0, i % 64, u64::from(i));
            stage.after_burst(program.as_mut(), &ctx);
            i += 1;
        }
        let report = plan.report();
        let seconds = Duration::from_secs_f64;
        let (spent, taking) = (report.pass_seconds, report.take_seconds);
        (report.passes, seconds(spent), seconds(taking))
    }

    /// Passes are paced by their own length (50 times it from one to the next, about 2% of
    /// the worker) and never further apart than `max_age_ms`: a 2 ms pass comes every
    /// 10 ms with the default, every 100 ms at 100 (the user's freshness before the
    /// share), and a quick pass takes its 2% however often it comes; the time the state's
    /// own take took is told apart. Wide margins: the machine is shared.
    #[test]
    fn passes_keep_to_their_share_and_to_max_age() {
        let run = Duration::from_millis(400);
        let (every_10, spent, taking) = passes(Duration::from_millis(2), 10, run);
        assert!((20..=45).contains(&every_10), "{every_10} passes in 400 ms");
        assert!(
            taking >= every_10 as u32 * Duration::from_millis(2) && taking <= spent,
            "{taking:?} of the passes' {spent:?} taking the changes, 2 ms each"
        );
        let (every_100, ..) = passes(Duration::from_millis(2), 100, run);
        assert!((2..=6).contains(&every_100), "{every_100} passes in 400 ms");
        let (quick, spent, _) = passes(Duration::ZERO, 10, run);
        assert!(quick > 45, "a quick pass comes often: {quick}");
        assert!(
            spent < run / 10,
            "{spent:?} of {run:?} in {quick} quick passes"
        );
    }

    /// A reload of a program whose rule counters are synced (each a register's lane, its
    /// own state): the new instance's counts, which start again with its rules, reach the
    /// collector whole in a new epoch, and nothing of the old instance's stays in the copy.
    #[test]
    fn a_reload_syncs_the_new_instances_rule_counters_in_a_new_epoch() {
        use stateplane_programs::{PortNames, ReplicationMode};
        use stateplane_sync::collector::Collector;
        use stateplane_wire::FlowHasher;

        let ports = PortNames(vec!["in".into(), "out".into()]);
        let settings: toml::Value =
            toml::from_str("default = \"permit\"\nmap = { in = \"out\" }").unwrap();
        let acl = stateplane_programs::build("acl", Some(&settings), &ports).unwrap();
        let synced = ["rule_bytes", "rule_packets"]
            .map(|name| (name.to_string(), vec!["synced".to_string()]));
        let factory = stateplane_programs::with_guarantees(
            acl,
            &synced.into_iter().collect(),
            ReplicationMode::default(),
        )
        .unwrap();
        let socket = collector_socket(Duration::from_millis(20));
        let plan = SyncSettings {
            collector: socket.local_addr().unwrap().to_string(),
            switch: Some(4),
            channel_mbps: None,
            threshold: None,
            refresh_ms: None,
            max_age_ms: None,
            slots: None,
            key_file: None,
        }
        .plan(1)
        .unwrap();
        let stage = plan.factory().unwrap()(0);
        let mut w = stateplane_runtime::Worker::new(factory(0), 0, 1, 2, FlowHasher::with_seed(1))
            .with_state_stages(vec![stage]);

        let packets = |w: &mut stateplane_runtime::Worker, n: usize| {
            w.handle(&mut crate::test_packets::udp_burst(0, 1, n));
        };
        let mut collector = Collector::new(None, None);
        let started = Instant::now();
        let mut datagram = vec![0; 65_536];
        let mut take = |c: &mut Collector| {
            while let Ok((n, from)) = socket.recv_from(&mut datagram) {
                c.on_datagram(started.elapsed().as_nanos() as u64, &datagram[..n], from);
            }
        };
        // The counts of state `id` in the copy, and the stream's epoch.
        let copy = |c: &Collector, id: u16| -> Option<(u64, u32)> {
            let info = c.streams().into_iter().find(|i| i.switch == 4)?;
            let extent = (info.extents.iter()).find(|&&(s, _)| s == id)?.1;
            let readings = c.read(4, 0, id, 0, extent)?;
            Some((readings.iter().map(|r| r.value).sum(), info.epoch))
        };

        packets(&mut w, 10);
        let deadline = Instant::now() + Duration::from_secs(5);
        let (bytes_before, first_epoch) = loop {
            w.tick_stages();
            take(&mut collector);
            if let (Some((10, epoch)), Some((bytes, _))) =
                (copy(&collector, 1), copy(&collector, 0))
            {
                break (bytes, epoch);
            }
            assert!(
                Instant::now() < deadline,
                "the first ten packets never reached the copy"
            );
        };
        assert!(bytes_before > 0);

        w.replace_program(factory(0), || unreachable!("no control plane"));
        packets(&mut w, 5);
        w.finish();
        take(&mut collector);
        let (after, epoch) = copy(&collector, 1).unwrap();
        assert_ne!(epoch, first_epoch, "a reload starts a new epoch");
        assert_eq!(after, 5, "the new instance's packets alone");
        assert_eq!(copy(&collector, 0).unwrap().0, bytes_before / 10 * 5);
        let refused = collector.counters();
        assert_eq!(refused.stale, 0, "{refused:?}");
    }

    /// The updates a stage sends are counted by why they went, those of the run's end
    /// apart: with a read handler of 4 slots for 64 changing cells, most go displaced,
    /// whatever the threshold a channel of 1 kbit/s raises; the stream says once, after
    /// its first second and not again after its second, that it went past its share, and the summary says the messages
    /// went over the channel and why.
    #[test]
    fn updates_are_counted_by_cause_and_a_channel_passed_is_told() {
        let collector = collector_socket(Duration::from_millis(20));
        let plan = SyncSettings {
            collector: collector.local_addr().unwrap().to_string(),
            switch: None,
            channel_mbps: Some(0.001),
            threshold: None,
            refresh_ms: None,
            max_age_ms: Some(1),
            slots: Some(4),
            key_file: None,
        }
        .plan(1)
        .unwrap();
        let mut stage = plan.factory().unwrap()(0);
        let mut cells = Register::new(64);
        cells.track(0, 0);
        let mut program: Box<dyn Running> = Box::new(Slow {
            cells,
            take: Duration::ZERO,
        });
        let ctx = Context::one_worker(0, stateplane_wire::FlowHasher::with_seed(1), 2);
        let start = Instant::now();
        let mut i = 0;
        let mut said_within_a_second = 0;
        while start.elapsed() < Duration::from_millis(2_100) {
            program.write_synced(0, i % 64, u64::from(i));
            stage.after_burst(program.as_mut(), &ctx);
            i += 1;
            if start.elapsed() < Duration::from_millis(950) {
                said_within_a_second = plan.report().streams_over_channel;
            }
        }
        assert_eq!(said_within_a_second, 0, "a stream looks at a second's rate");
        assert_eq!(
            plan.report().streams_over_channel,
            1,
            "and says it once, however many seconds go past it"
        );
        let running = plan.report().sent;
        stage.finish(program.as_mut(), &ctx);
        let report = plan.report();
        assert_eq!(report.sent, running, "the end counted apart");
        assert!(
            report.sent_at_end >= 64,
            "every cell once more: {}",
            report.sent_at_end
        );
        assert!(report.bytes_at_end > 0 && report.bytes_at_end < report.bytes);
        let c = report.sent;
        assert!(
            c.displaced > c.threshold + c.timed_out + c.exact + c.refresh,
            "{c:?}"
        );
        assert!(report.mean_mbps > 0.0011, "{}", report.mean_mbps);
        let table = report.table();
        assert!(
            table.contains("over the channel")
                && table.contains(" went displaced")
                && table.contains("more sync.slots (up to 64, the synced locations"),
            "{table}"
        );
    }

    /// Within the channel, the summary gives its use and no more; past it, the cause that
    /// sent the most, with what lowers it.
    #[test]
    fn the_summary_names_the_largest_cause_past_the_channel() {
        let report = |mean_mbps, sent| SyncReport {
            channel_mbps: Some(100.0),
            mean_mbps,
            sent,
            slots: 65_536,
            ..SyncReport::default()
        };
        let refreshing = SentByCause {
            threshold: 10,
            displaced: 20,
            refresh: 30,
            ..SentByCause::default()
        };
        let within = report(100.0, refreshing).table();
        assert!(
            within.contains("took 100.0 Mbit/s on average, of a channel of 100"),
            "{within}"
        );
        assert!(!within.contains("over the channel"), "{within}");
        let over = report(250.0, refreshing).table();
        assert!(
            over.contains("over the channel (2.5x its rate)")
                && over.contains("30 of 60 went by the refresh: a larger sync.refresh_ms"),
            "{over}"
        );
        let fixed = SyncReport {
            channel_mbps: None,
            ..report(250.0, refreshing)
        };
        assert!(
            !fixed.table().contains("channel"),
            "a fixed threshold keeps to none"
        );
    }
}
