//! A worker's side of the sync, whole: its read handler, the rate controller that sets
//! the handler's threshold each window, the timeout monitor, the anti-entropy refresh of
//! every location, and the stream that numbers the messages. Fed the changes of synced
//! state a pass finds ([`Sender::expect_change`], then [`Sender::change`] for each) and
//! polled once a pass ([`Sender::poll`]), it returns the messages to send.

use crate::rate::RateController;
use crate::read_handler::ReadHandler;
use crate::wire::{Kind, MAX_DATAGRAM_ENTRIES, MAX_ENTRIES, Message};
use crate::{Location, Update};

/// What a worker's sync is asked to do.
#[derive(Clone, Debug)]
pub struct SenderConfig {
    pub switch: u32,
    /// Changes when the switch starts again (the collector starts its streams over).
    pub epoch: u32,
    pub stream: u16,
    /// Slots of the read handler's table at most (it has no more than the synced state
    /// has locations, rounded up to a power of two).
    pub slots: usize,
    pub threshold: Threshold,
    /// A location waits unsent at most this long (the timeout monitor).
    pub max_age_ns: u64,
    /// A message at least this often, entries or none, so that the collector sees the
    /// stream alive and a lost message soon.
    pub heartbeat_ns: u64,
    /// Updates wait at most this long to fill a message (0: a message every poll that has
    /// any).
    pub batch_ns: u64,
    /// Every location is sent whole at least this often (anti-entropy), so that the
    /// collector's copy converges exactly after any loss. 0: never.
    pub refresh_ns: u64,
    /// The synced state, announced to the collector in `Layout` messages.
    pub states: Vec<SyncedState>,
}

/// One synced state as a stream announces it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncedState {
    pub id: u16,
    /// Its locations.
    pub length: u32,
    /// The words of one of its entries: 1 for a register's cells, a slot's for a table.
    pub stride: u32,
}

impl SyncedState {
    /// A register's (or sketch's) cells: an entry a word.
    pub fn register(id: u16, length: u32) -> SyncedState {
        SyncedState {
            id,
            length,
            stride: 1,
        }
    }
}

/// A stream announces its layout this often (and in its first poll and at its end), so
/// that a collector that started later, or lost the message, learns it soon.
pub const LAYOUT_EVERY_NS: u64 = 1_000_000_000;

/// How the threshold is set.
#[derive(Clone, Copy, Debug)]
pub enum Threshold {
    /// The same all along (0: every change, the mirroring baseline).
    Fixed(u64),
    /// By the rate controller every window, its capacity lowered while the collector
    /// reports losses and raised back while it reports none (beyond the paper).
    Adaptive(RateController),
}

/// Where the refresh is: the next location to send, and when the next pass starts.
#[derive(Clone, Copy, Debug)]
struct Refresh {
    state: usize,
    index: u32,
    next_pass_ns: u64,
    running: bool,
}

pub struct Sender {
    config: SenderConfig,
    pub handler: ReadHandler,
    next_seq: u64,
    /// The threshold in force, and the largest in force at a change since the last
    /// message (a change held back under `t` leaves the collector at most `t - 1` away;
    /// no change, no divergence).
    threshold: u64,
    t_max: u64,
    window_start_ns: Option<u64>,
    last_sent_ns: Option<u64>,
    /// When the layout is announced next (0: at the first poll).
    next_layout_ns: u64,
    refresh: Refresh,
    /// Updates waiting for the next message, since the poll that first saw them.
    pending: Vec<Update>,
    pending_since_ns: Option<u64>,
    /// Refresh entries waiting for the next refresh message.
    refreshed: Vec<Update>,
    /// What the handler had sent when the window began.
    window_sent: u64,
    /// The window's length, and the capacity the rate controller uses now (the
    /// configured one, less what the collector's reports of loss took off).
    window_ns: u64,
    capacity: u64,
    /// The collector's last report: messages it found missing, and the last it had seen.
    reported_missing: u64,
    reported_seq: u64,
    /// The share of the messages sent between the last two reports that the collector
    /// found missing: what the path to it loses (see [`Sender::loss_to_collector`]).
    loss_to_collector: f64,
    /// `(seq, sent)` of the messages the collector has not reported seeing yet, and the
    /// quickest a message has taken to be reported seen.
    sent_log: std::collections::VecDeque<(u64, u64)>,
    quickest_ns: u64,
    /// Entries a message carries at most (what one datagram on the path holds).
    message_entries: usize,
    /// Messages have gone in a batch that no message has ended yet ([`Sender::poll_open`]).
    batch_open: bool,
    /// The last messages sent, oldest first, at most [`KEPT_MESSAGES`] of them and
    /// [`KEPT_ENTRIES`] entries in all: what a collector's request for lost ones finds.
    kept: std::collections::VecDeque<Message>,
    kept_entries: usize,
    pub feedback: FeedbackCounters,
    /// Entries the anti-entropy refresh has sent (the read handler counts the updates).
    pub refreshed_sent: u64,
}

/// Messages a sender keeps for the collector to ask for again, and their entries at most
/// (about 1.5 MiB): on a quick path the collector asks within a millisecond or two.
pub const KEPT_MESSAGES: usize = 4096;
pub const KEPT_ENTRIES: usize = 1 << 16;

/// The most a sender's kept messages take ([`KEPT_MESSAGES`] and [`KEPT_ENTRIES`]; the
/// queue of them grows to twice its length, a power of two, before the oldest leaves).
pub const KEPT_BYTES_MOST: u64 = (KEPT_ENTRIES * std::mem::size_of::<Update>()
    + 2 * KEPT_MESSAGES * std::mem::size_of::<Message>()) as u64;

/// Messages [`Sender::finish`] makes before it has the first of them sent.
pub const FINISH_FLUSH_MESSAGES: usize = 64;

/// What the collector's reports did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FeedbackCounters {
    pub reports: u64,
    /// Reports of loss, each of which halved the capacity.
    pub lowered: u64,
    /// Reports of a growing queue, each of which took a quarter off.
    pub queueing: u64,
    /// Messages the collector asked for again, sent again, and asked for but no longer
    /// kept.
    pub resent: u64,
    pub not_kept: u64,
}

/// A queue on the way worth reacting to: the last message seen took at least this much
/// longer to be seen than the quickest one (and at least twice as long).
pub const QUEUEING_NS: u64 = 2_000_000;

/// Messages whose sending times are kept for the reports (older ones are forgotten).
const SENT_LOG: usize = 4096;

impl Sender {
    pub fn new(config: SenderConfig) -> Sender {
        // No more slots than locations: laid out one state after another, they would
        // never be used, and the timeout monitor would sweep them all the same.
        let lengths: Vec<(u16, u32)> = config.states.iter().map(|s| (s.id, s.length)).collect();
        let locations: u64 = lengths.iter().map(|&(_, len)| u64::from(len)).sum();
        let slots = config
            .slots
            .min(locations.max(1).next_power_of_two() as usize);
        let mut handler = ReadHandler::new(slots).with_states(&lengths);
        let (window_ns, capacity, threshold) = match config.threshold {
            Threshold::Fixed(t) => (1_000_000, 0, t),
            Threshold::Adaptive(rate) => (rate.window_ns.max(1), rate.capacity, 0),
        };
        handler.set_threshold(threshold);
        Sender {
            handler,
            next_seq: 1,
            threshold,
            t_max: 0,
            window_start_ns: None,
            last_sent_ns: None,
            next_layout_ns: 0,
            refresh: Refresh {
                state: 0,
                index: 0,
                next_pass_ns: config.refresh_ns,
                running: false,
            },
            pending: Vec::new(),
            pending_since_ns: None,
            kept: std::collections::VecDeque::new(),
            kept_entries: 0,
            refreshed: Vec::new(),
            window_sent: 0,
            window_ns,
            capacity,
            reported_missing: 0,
            reported_seq: 0,
            loss_to_collector: 0.0,
            sent_log: std::collections::VecDeque::new(),
            quickest_ns: u64::MAX,
            message_entries: MAX_ENTRIES,
            batch_open: false,
            feedback: FeedbackCounters::default(),
            refreshed_sent: 0,
            config,
        }
    }

    /// The capacity the rate controller uses now (updates a second).
    /// Messages of up to `entries` entries (1 to `MAX_DATAGRAM_ENTRIES`; `MAX_ENTRIES`, what
    /// a 1,500-byte path carries, unless told): fewer, larger messages where the path to
    /// the collector takes them whole, as loopback's does.
    pub fn with_message_entries(mut self, entries: usize) -> Sender {
        self.message_entries = entries.clamp(1, MAX_DATAGRAM_ENTRIES);
        self
    }

    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The share of its messages the path to the collector lost between its last two
    /// reports (since the start, at the first; 0 before it): a switch sends its writes'
    /// acknowledgements and answers in as many copies as that loss asks for
    /// ([`crate::write::WriteStage::ack_copies`], [`crate::write::copies_for`]).
    pub fn loss_to_collector(&self) -> f64 {
        self.loss_to_collector
    }

    /// Takes the collector's report on this stream (a `Kind::Report` message), arrived at
    /// `now_ns`, so that overload at the collector or in the channel loses little and not
    /// for long:
    /// - where more than 1% of the messages sent since its last report went missing, the
    ///   capacity halves;
    /// - where the last message the collector saw took longer to be seen than the quickest
    ///   one did, by more than that again and at least `QUEUEING_NS`, a queue is growing
    ///   on the way (before any loss): the capacity drops by a quarter;
    /// - otherwise it rises back by 1/64 of the configured one a report.
    ///
    /// It stays between 1/64 of the configured capacity and the configured one.
    pub fn on_report(&mut self, now_ns: u64, report: &Message) {
        let c = &self.config;
        let ours = (report.switch, report.epoch, report.stream) == (c.switch, c.epoch, c.stream);
        if report.kind != Kind::Report || !ours || report.seq < self.reported_seq {
            return;
        }
        let missing = report.t_max.saturating_sub(self.reported_missing);
        let sent = report.seq - self.reported_seq;
        (self.reported_missing, self.reported_seq) = (report.t_max, report.seq);
        if sent > 0 {
            self.loss_to_collector = missing.min(sent) as f64 / sent as f64;
        }
        let Threshold::Adaptive(rate) = c.threshold else {
            return;
        };
        self.feedback.reports += 1;
        // How long the last message seen took to be seen (and the report to come back).
        while self
            .sent_log
            .front()
            .is_some_and(|&(seq, _)| seq < report.seq)
        {
            self.sent_log.pop_front();
        }
        let delay = (self.sent_log.front())
            .filter(|&&(seq, _)| seq == report.seq)
            .map(|&(_, sent_ns)| now_ns.saturating_sub(sent_ns));
        if let Some(d) = delay {
            self.quickest_ns = self.quickest_ns.min(d);
        }
        let queueing =
            delay.is_some_and(|d| d > self.quickest_ns + self.quickest_ns.max(QUEUEING_NS));
        let floor = (rate.capacity / 64).max(1);
        if missing * 100 > sent {
            self.capacity = (self.capacity / 2).max(floor);
            self.feedback.lowered += 1;
        } else if queueing {
            self.capacity = (self.capacity - self.capacity / 4).max(floor);
            self.feedback.queueing += 1;
        } else if missing == 0 {
            self.capacity = (self.capacity + floor).min(rate.capacity);
        }
    }

    pub fn threshold(&self) -> u64 {
        self.threshold
    }

    /// A pass is about to bring, at `now_ns`, changes adding up to `total` (the sum of
    /// `|new - old|`): the threshold rises at once if the window's change with them passes
    /// what the channel carries in the time since the window began (a window at least),
    /// so that they are held to it from the first (fed one by one, they would all go at
    /// the threshold before them). Measured over one window instead, the changes of passes
    /// `max_age_ms` apart would raise it as many times too high as windows went by.
    pub fn expect_change(&mut self, now_ns: u64, total: u64) {
        if let Threshold::Adaptive(rate) = self.config.threshold {
            let rate = RateController {
                capacity: self.capacity,
                ..rate
            };
            let since = (self.window_start_ns).map_or(0, |start| now_ns.saturating_sub(start));
            let change = self.handler.change_so_far().saturating_add(total);
            let t = rate.threshold_over(change, since.max(rate.window_ns));
            if t > self.threshold {
                self.set_threshold(t);
            }
        }
    }

    /// Hints that `location` changes next but a few ([`ReadHandler::prefetch`]).
    #[inline]
    pub fn prefetch(&self, location: Location) {
        self.handler.prefetch(location);
    }

    /// `location` changed from `old` to `new` (what a synced state reports of each write).
    #[inline]
    pub fn change(&mut self, now_ns: u64, location: Location, old: u64, new: u64) {
        self.t_max = self.t_max.max(self.threshold);
        self.handler
            .change(now_ns, location, old, new, &mut self.pending);
    }

    /// As [`change`](Self::change), for a location sent at every change whatever the
    /// threshold ([`ReadHandler::change_exact`]).
    #[inline]
    pub fn change_exact(&mut self, location: Location, old: u64, new: u64) {
        self.t_max = self.t_max.max(self.threshold);
        self.handler
            .change_exact(location, old, new, &mut self.pending);
    }

    /// A change a top-down write made (the collector wrote the value, perhaps with the
    /// data plane's changes kept): sent at once, as an exact change is, and costing the
    /// rate controller one update rather than its size, since a write of large values
    /// (a register filled with 2^32 - 1) would otherwise raise the threshold that every
    /// other location of the copy is then bounded by. The read handler's slot takes
    /// `new` as held and sent, so that later changes are measured from it and nothing
    /// sends the value from before the write.
    pub fn change_written(&mut self, now_ns: u64, location: Location, old: u64, new: u64) {
        self.change_exact(location, old, new);
        self.handler.written(now_ns, location, new);
    }

    /// Once a pass: ends the rate window if it is over (the next threshold), sends what
    /// waited too long, goes on with the refresh (reading the state with `read`), and
    /// appends the messages to send to `out`.
    ///
    /// Updates wait to fill a message, up to `batch_ns`; then every update waiting goes, so
    /// that a batch holds every update made before it (what the collector's bound rests
    /// on). A refresh's values go in the batch of the poll that read them, after the
    /// updates made before they were read.
    pub fn poll(&mut self, now_ns: u64, read: impl FnMut(Location) -> u64, out: &mut Vec<Message>) {
        self.poll_batch(now_ns, Some(read), out);
    }

    /// As [`poll`](Self::poll), once a pass whose take was cut short: the state holds
    /// changes the handler has not had yet. Its messages all say that more of their batch
    /// follow, so that the collector applies none of them before the batch's last, which
    /// the first `poll` after every change is taken sends: the batch then holds every
    /// update made before it, as the collector's bound asks. No refresh reads the state
    /// meanwhile: a refreshed value the handler has not had the change of would be taken
    /// for what the collector holds, and the handler would measure that change from the
    /// wrong value. Nor does the rate window end (nor the timeout monitor sweep, which
    /// goes with it) before the batch does.
    pub fn poll_open(&mut self, now_ns: u64, out: &mut Vec<Message>) {
        self.poll_batch(now_ns, None::<fn(Location) -> u64>, out);
    }

    fn poll_batch(
        &mut self,
        now_ns: u64,
        read: Option<impl FnMut(Location) -> u64>,
        out: &mut Vec<Message>,
    ) {
        let open = read.is_none();
        // A batch left open ends now, with a message however few updates wait.
        let closing = self.batch_open && !open;
        let start = *self.window_start_ns.get_or_insert(now_ns);
        let rate = match self.config.threshold {
            Threshold::Adaptive(rate) => Some(RateController {
                capacity: self.capacity,
                ..rate
            }),
            Threshold::Fixed(_) => None,
        };
        let elapsed = now_ns.saturating_sub(start);
        if open {
            // The window goes on until the batch ends: the changes its passes take came
            // over the time since it began (they waited in the state), and measured from
            // each pass's poll instead they would ask as many times too much of the
            // channel as passes went by (`expect_change`).
        } else if elapsed >= self.window_ns {
            let change = self.handler.take_change();
            if let Some(rate) = rate {
                self.set_threshold(rate.threshold_over(change, elapsed));
            }
            // The sweep covers the table once per `max_age_ns`, and sends no more than the
            // channel has room for after the window's other updates: past the channel's
            // capacity, locations wait longer than the timeout (which only makes the copy
            // fresher; the bound does not rest on it).
            let slots = self.handler.slots() as u128;
            let age = u128::from(self.config.max_age_ns.max(1));
            let visit = (slots * u128::from(elapsed)).div_ceil(age).min(slots) as usize;
            let sent = self.handler.counters.sent() - self.window_sent;
            let budget = rate.map_or(u64::MAX, |r| r.carried_in(elapsed).saturating_sub(sent));
            let max_age = self.config.max_age_ns;
            (self.handler).expire(now_ns, max_age, visit, budget, &mut self.pending);
            self.window_start_ns = Some(now_ns);
            self.window_sent = self.handler.counters.sent();
        } else if let Some(rate) = rate {
            // A window whose change so far is already more than the channel carries in a
            // window raises the threshold at once, not at its end (a burst at the start
            // of a run, or after a quiet spell, would fill the channel's queue first).
            let t = rate.threshold(self.handler.change_so_far());
            if t > self.threshold {
                self.set_threshold(t);
            }
        }
        if self.pending.is_empty() {
            self.pending_since_ns = None;
        } else {
            self.pending_since_ns.get_or_insert(now_ns);
        }
        if let Some(mut read) = read {
            self.refresh_some(now_ns, &mut read);
        }
        let first = out.len();
        let layout_due = now_ns >= self.next_layout_ns;
        let waited = (self.pending_since_ns)
            .is_some_and(|since| now_ns.saturating_sub(since) >= self.config.batch_ns);
        // Any message sent moves the collector's copy on to now, so a heartbeat takes the
        // waiting updates with it.
        let quiet = (self.last_sent_ns)
            .is_none_or(|last| now_ns.saturating_sub(last) >= self.config.heartbeat_ns);
        let full = self.pending.len() >= self.message_entries;
        // The layout is a message like any other: the waiting updates go with it.
        if layout_due {
            self.announce_layout(now_ns, out);
        }
        if waited || quiet || full || layout_due || closing || !self.refreshed.is_empty() {
            self.send(now_ns, Kind::Updates, out);
            self.send(now_ns, Kind::Refresh, out);
            self.pending_since_ns = None;
        }
        if (quiet || closing) && out.len() == first {
            self.emit(now_ns, Kind::Heartbeat, Vec::new(), out);
        }
        if open {
            self.leave_batch_open(&mut out[first..]);
        } else {
            self.end_batch(&mut out[first..]);
        }
    }

    /// The messages of a poll that leaves its batch open all say that more follow; the
    /// period, and its `t_max`, go on.
    fn leave_batch_open(&mut self, batch: &mut [Message]) {
        for m in batch.iter_mut() {
            m.more = true;
        }
        for kept in self.kept.iter_mut().rev().take(batch.len()) {
            kept.more = true;
        }
        self.batch_open |= !batch.is_empty();
    }

    /// The messages of one poll end a batch (with those of the polls that left it open
    /// before): all but its last say that more follow, and all carry the period's `t_max`
    /// (the batch's updates may be older than any of its messages). The next period
    /// starts with no change, so with no divergence.
    fn end_batch(&mut self, batch: &mut [Message]) {
        if let Some((_, before_last)) = batch.split_last_mut() {
            self.followed(before_last);
            self.t_max = 0;
            self.batch_open = false;
        }
    }

    /// `messages`, all but the last made, say that more of their batch follow, and so do
    /// their kept copies (the last ones kept but one), which go again as they went.
    fn followed(&mut self, messages: &mut [Message]) {
        for m in messages.iter_mut() {
            m.more = true;
        }
        for kept in self.kept.iter_mut().rev().skip(1).take(messages.len()) {
            kept.more = true;
        }
    }

    /// The worker stops: every update waiting and a whole refresh pass of every location
    /// go now (`read` reads the state), so that the collector's copy, once these messages
    /// arrive, is the data plane's exactly. Every [`FINISH_FLUSH_MESSAGES`] messages made,
    /// `flush` is given `out` to send (and empty) all but the last of them, so that a
    /// large table's refresh (5.8 M locations for `counter`'s default table) is never
    /// held whole in memory.
    pub fn finish(
        &mut self,
        now_ns: u64,
        mut read: impl FnMut(Location) -> u64,
        out: &mut Vec<Message>,
        mut flush: impl FnMut(&mut Vec<Message>),
    ) {
        let mut first = out.len();
        self.announce_layout(now_ns, out);
        self.refresh = Refresh {
            state: 0,
            index: 0,
            next_pass_ns: u64::MAX,
            running: !self.config.states.is_empty(),
        };
        self.send(now_ns, Kind::Updates, out);
        while self.refresh.running {
            self.refresh_some(now_ns, &mut read);
            self.send(now_ns, Kind::Refresh, out);
            if out.len() - first > FINISH_FLUSH_MESSAGES
                && let Some(last) = out.pop()
            {
                // The last made waits: whether more follow it is not known yet.
                self.followed(&mut out[first..]);
                flush(out);
                first = out.len();
                out.push(last);
            }
        }
        if out.len() == first {
            self.emit(now_ns, Kind::Heartbeat, Vec::new(), out);
        }
        self.end_batch(&mut out[first..]);
    }

    /// Sends what the synced states are (`Kind::Layout`), if there are any.
    fn announce_layout(&mut self, now_ns: u64, out: &mut Vec<Message>) {
        self.next_layout_ns = now_ns.saturating_add(LAYOUT_EVERY_NS);
        let states: Vec<Update> = (self.config.states.iter())
            .map(|s| Update {
                location: Location {
                    state: s.id,
                    index: s.length,
                },
                value: u64::from(s.stride),
                threshold: 0,
            })
            .collect();
        for entries in states.chunks(self.message_entries) {
            self.emit(now_ns, Kind::Layout, entries.to_vec(), out);
        }
    }

    fn set_threshold(&mut self, t: u64) {
        self.threshold = t;
        self.handler.set_threshold(t);
    }

    /// Reads the next locations of the refresh pass, at most a message's worth a poll.
    fn refresh_some(&mut self, now_ns: u64, read: &mut impl FnMut(Location) -> u64) {
        let r = &mut self.refresh;
        if !r.running && (self.config.refresh_ns == 0 || self.config.states.is_empty()) {
            return;
        }
        if !r.running {
            if now_ns < r.next_pass_ns {
                return;
            }
            *r = Refresh {
                state: 0,
                index: 0,
                next_pass_ns: now_ns.saturating_add(self.config.refresh_ns),
                running: true,
            };
        }
        while self.refreshed.len() < self.message_entries {
            let Some(&SyncedState {
                id: state,
                length: len,
                ..
            }) = self.config.states.get(r.state)
            else {
                r.running = false;
                return;
            };
            if r.index >= len {
                r.state += 1;
                r.index = 0;
                continue;
            }
            let location = Location {
                state,
                index: r.index,
            };
            let value = read(location);
            self.handler.sent_elsewhere(now_ns, location, value);
            self.refreshed.push(Update {
                location,
                value,
                threshold: 0,
            });
            r.index += 1;
        }
    }

    /// Sends the waiting entries of `kind` in messages of at most `message_entries`.
    fn send(&mut self, now_ns: u64, kind: Kind, out: &mut Vec<Message>) {
        let mut waiting = match kind {
            Kind::Refresh => std::mem::take(&mut self.refreshed),
            _ => std::mem::take(&mut self.pending),
        };
        if kind == Kind::Refresh {
            self.refreshed_sent += waiting.len() as u64;
        }
        for entries in waiting.chunks(self.message_entries) {
            self.emit(now_ns, kind, entries.to_vec(), out);
        }
        // Emptied, not dropped: a pass's updates of a large table come to about a
        // megabyte, which growing afresh each pass maps and unmaps again.
        waiting.clear();
        match kind {
            Kind::Refresh => self.refreshed = waiting,
            _ => self.pending = waiting,
        }
    }

    /// Sends again the messages the collector's `nack` asks for that are still kept.
    pub fn on_nack(&mut self, nack: &Message, out: &mut Vec<Message>) {
        let Some(first) = self.kept.front().map(|m| m.seq) else {
            self.feedback.not_kept += nack.entries.len() as u64;
            return;
        };
        for e in &nack.entries {
            let kept =
                (e.value.checked_sub(first)).and_then(|i| self.kept.get(usize::try_from(i).ok()?));
            match kept {
                Some(m) => {
                    out.push(m.clone());
                    self.feedback.resent += 1;
                }
                None => self.feedback.not_kept += 1,
            }
        }
    }

    fn emit(&mut self, now_ns: u64, kind: Kind, entries: Vec<Update>, out: &mut Vec<Message>) {
        out.push(Message {
            kind,
            switch: self.config.switch,
            epoch: self.config.epoch,
            stream: self.config.stream,
            seq: self.next_seq,
            sent_ns: now_ns,
            t_max: self.t_max,
            more: false,
            entries,
        });
        if let Some(sent) = out.last() {
            self.kept_entries += sent.entries.len();
            self.kept.push_back(sent.clone());
        }
        while self.kept.len() > KEPT_MESSAGES || self.kept_entries > KEPT_ENTRIES {
            let Some(old) = self.kept.pop_front() else {
                break;
            };
            self.kept_entries -= old.entries.len();
        }
        self.sent_log.push_back((self.next_seq, now_ns));
        if self.sent_log.len() > SENT_LOG {
            self.sent_log.pop_front();
        }
        self.next_seq += 1;
        self.last_sent_ns = Some(now_ns);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sender(capacity: u64) -> Sender {
        Sender::new(SenderConfig {
            switch: 1,
            epoch: 1,
            stream: 0,
            slots: 16,
            threshold: Threshold::Adaptive(RateController::new(capacity)),
            max_age_ns: 1_000_000_000,
            heartbeat_ns: 1_000_000,
            batch_ns: 0,
            refresh_ns: 0,
            states: Vec::new(),
        })
    }

    fn report(seq: u64, missing: u64) -> Message {
        Message {
            kind: Kind::Report,
            switch: 1,
            epoch: 1,
            stream: 0,
            seq,
            sent_ns: 0,
            t_max: missing,
            more: false,
            entries: Vec::new(),
        }
    }

    /// Loss halves the capacity, to a floor; no loss raises it back by 1/64 a report, to
    /// the configured one; a report on another stream, or older, changes nothing.
    #[test]
    fn reports_of_loss_lower_the_capacity_and_reports_of_none_raise_it() {
        let mut s = sender(6_400);
        s.on_report(0, &report(100, 10));
        assert_eq!(s.capacity(), 3_200);
        s.on_report(0, &report(200, 10));
        assert_eq!(s.capacity(), 3_300, "no new loss: up by 1/64 of 6,400");
        s.on_report(0, &report(300, 10 + 1));
        assert_eq!(s.capacity(), 3_300, "1 of 100: below the 1% that counts");
        for i in 0..100 {
            s.on_report(0, &report(400 + i * 100, 100 + i * 50));
        }
        assert_eq!(s.capacity(), 100, "never below 1/64");
        for i in 0..100 {
            s.on_report(0, &report(20_000 + i, 5_050));
        }
        assert_eq!(s.capacity(), 6_400, "never above the configured");
        let other = Message {
            stream: 1,
            ..report(30_000, 9_000)
        };
        s.on_report(0, &other);
        s.on_report(0, &report(10, 9_000));
        assert_eq!(s.capacity(), 6_400);
        assert_eq!(s.feedback.reports, 203);
    }

    /// The threshold follows the capacity the reports leave: a window's change that fits
    /// the configured capacity needs a threshold once loss has lowered it.
    #[test]
    fn the_threshold_follows_the_lowered_capacity() {
        let mut s = sender(100_000);
        let mut out = Vec::new();
        let at = |index| Location { state: 0, index };
        for i in 0..100 {
            s.change(0, at(i % 16), 0, 1);
        }
        s.poll(0, |_| 0, &mut out);
        s.poll(1_000_000, |_| 0, &mut out);
        assert_eq!(s.threshold(), 0, "100 changes in 1 ms fit 100,000 a second");
        s.on_report(0, &report(2, 1));
        for i in 0..100 {
            s.change(1_000_000, at(i % 16), 0, 1);
        }
        s.poll(2_000_000, |_| 0, &mut out);
        assert_eq!(s.threshold(), 2, "50 a window now: ceil(100 / 50)");
    }

    /// A message seen later than the quickest by more than `QUEUEING_NS` (and than the
    /// quickest again) shows a queue growing on the way: a quarter off before any loss.
    #[test]
    fn a_growing_delay_lowers_the_capacity_before_any_loss() {
        let mut s = sender(6_400);
        let mut out = Vec::new();
        s.poll(0, |_| 0, &mut out);
        s.on_report(1_000_000, &report(1, 0));
        assert_eq!(s.capacity(), 6_400, "1 ms: the quickest so far");
        s.poll(10_000_000, |_| 0, &mut out);
        s.on_report(12_500_000, &report(2, 0));
        assert_eq!(s.capacity(), 6_400, "2.5 ms: within 2 ms of the quickest");
        s.poll(20_000_000, |_| 0, &mut out);
        s.on_report(23_500_000, &report(3, 0));
        assert_eq!(s.capacity(), 4_800, "3.5 ms: a queue");
        assert_eq!(s.feedback.queueing, 1);
        assert_eq!(out.len(), 3, "a heartbeat a poll");
    }

    /// A window whose change so far already passes what the channel carries in a window
    /// raises the threshold at once; the window's end sets it from the whole change.
    #[test]
    fn a_burst_raises_the_threshold_within_the_window() {
        let mut s = sender(100_000);
        let mut out = Vec::new();
        s.poll(0, |_| 0, &mut out);
        for i in 0..300 {
            s.change(1_000, Location { state: 0, index: i }, 0, 1);
        }
        s.poll(2_000, |_| 0, &mut out);
        assert_eq!(s.threshold(), 3, "300 changes where a window carries 100");
        s.poll(1_000_000, |_| 0, &mut out);
        assert_eq!(s.threshold(), 3, "the window's end: the same change");
        s.poll(2_000_000, |_| 0, &mut out);
        assert_eq!(s.threshold(), 0, "a quiet window");
    }

    /// A fixed threshold stays fixed whatever the collector reports, and a report for a
    /// stream the collector has not seen is none.
    #[test]
    fn a_fixed_threshold_ignores_reports() {
        let mut s = Sender::new(SenderConfig {
            threshold: Threshold::Fixed(8),
            ..sender(1).config
        });
        s.on_report(0, &report(100, 100));
        assert_eq!((s.threshold(), s.feedback.reports), (8, 0));
        assert_eq!(crate::mirror::Mirror::new(None).report(1, 0, 0), None);
    }

    /// Each report says what share of the messages since the one before went missing,
    /// with a fixed threshold too: the loss the write acknowledgements' copies follow.
    #[test]
    fn reports_say_what_the_path_to_the_collector_loses() {
        for threshold in [Threshold::Fixed(8), sender(6_400).config.threshold] {
            let mut s = Sender::new(SenderConfig {
                threshold,
                ..sender(1).config
            });
            assert_eq!(s.loss_to_collector(), 0.0, "no report yet");
            s.on_report(0, &report(100, 80));
            assert_eq!(s.loss_to_collector(), 0.8);
            s.on_report(0, &report(300, 130));
            assert_eq!(s.loss_to_collector(), 0.25, "50 of the 200 since");
            s.on_report(0, &report(200, 500));
            assert_eq!(s.loss_to_collector(), 0.25, "an older report: nothing");
            s.on_report(0, &report(300, 130));
            assert_eq!(s.loss_to_collector(), 0.25, "nothing sent since: as it was");
            s.on_report(0, &report(400, 130));
            assert_eq!(s.loss_to_collector(), 0.0);
        }
    }

    /// At the end, every waiting update and a whole refresh go in one batch: applied, it
    /// leaves the collector every location exactly, whatever the threshold held back.
    #[test]
    fn finishing_leaves_the_collector_every_location_exactly() {
        let mut s = Sender::new(SenderConfig {
            threshold: Threshold::Fixed(1_000),
            states: vec![SyncedState::register(0, 100), SyncedState::register(2, 30)],
            ..sender(1).config
        });
        let value = |l: Location| u64::from(l.state) * 1_000 + u64::from(l.index) * 7;
        let mut out = Vec::new();
        s.poll(0, value, &mut out);
        for i in 0..100 {
            let at = Location { state: 0, index: i };
            s.change(1, at, 0, value(at));
        }
        s.poll(2, value, &mut out);
        s.finish(3, value, &mut out, |_| {});
        let mut mirror = crate::mirror::Mirror::new(None);
        for m in &out {
            mirror.apply(m).unwrap();
        }
        let (last, batch) = out.split_last().unwrap();
        assert!(!last.more && batch.iter().rev().take(2).all(|m| m.more));
        for (state, len) in [(0u16, 100u32), (2, 30)] {
            for index in 0..len {
                let at = Location { state, index };
                let r = mirror.read(1, 0, at).unwrap();
                assert_eq!((r.value, r.bound), (value(at), Some(0)), "{at:?}");
            }
        }
        // With nothing synced, a heartbeat still says the stream ended where it did.
        let mut quiet = sender(1);
        let mut end = Vec::new();
        quiet.finish(0, |_| 0, &mut end, |_| {});
        assert_eq!(end.len(), 1);
        assert_eq!(end[0].kind, Kind::Heartbeat);
    }

    /// A large state's last refresh goes as it is made: `finish` hands over its messages
    /// every [`FINISH_FLUSH_MESSAGES`], never holding more than that many more, and the
    /// messages in the order sent are one batch (each but the last says more follow)
    /// that leaves the collector every location exactly.
    #[test]
    fn finishing_sends_a_large_refresh_as_it_is_made() {
        let locations = 20_000;
        let mut s = Sender::new(SenderConfig {
            states: vec![SyncedState::register(0, locations)],
            ..sender(1).config
        })
        .with_message_entries(10);
        let value = |l: Location| u64::from(l.index) * 3 + 1;
        let (mut sent, mut out, mut most) = (Vec::new(), Vec::new(), 0);
        s.finish(5, value, &mut out, |made: &mut Vec<Message>| {
            most = most.max(made.len());
            sent.append(made);
        });
        assert!(
            sent.len() > 20 * FINISH_FLUSH_MESSAGES,
            "{} sent while made",
            sent.len()
        );
        assert!(most <= FINISH_FLUSH_MESSAGES + 1, "{most} held at once");
        assert!(out.len() <= FINISH_FLUSH_MESSAGES + 1);
        sent.append(&mut out);
        let (last, batch) = sent.split_last().unwrap();
        assert!(!last.more && batch.iter().all(|m| m.more));
        let mut mirror = crate::mirror::Mirror::new(None);
        for m in &sent {
            mirror.apply(m).unwrap();
        }
        for index in 0..locations {
            let at = Location { state: 0, index };
            let r = mirror.read(1, 0, at).unwrap();
            assert_eq!((r.value, r.bound), (value(at), Some(0)), "{at:?}");
        }
    }

    /// Where the path takes larger datagrams, messages carry up to the entries asked for:
    /// 3,000 changes at once go in 3 messages of 1,000, not 52 of 58; and never more than
    /// a datagram holds.
    #[test]
    fn larger_messages_where_the_path_takes_them() {
        let mut s = Sender::new(SenderConfig {
            threshold: Threshold::Fixed(0),
            ..sender(1).config
        })
        .with_message_entries(1000);
        let mut out = Vec::new();
        for i in 0..3000 {
            s.change(0, Location { state: 0, index: i }, 0, 1);
        }
        s.poll(0, |_| 0, &mut out);
        let sizes: Vec<usize> = out.iter().map(|m| m.entries.len()).collect();
        assert_eq!(sizes, [1000, 1000, 1000]);
        let huge = Sender::new(sender(1).config).with_message_entries(usize::MAX);
        assert_eq!(huge.message_entries, MAX_DATAGRAM_ENTRIES);
    }

    /// Many busy locations, far past the channel: what goes out stays within the channel's
    /// capacity, the timeout monitor's flushes included (16,384 locations timed out every
    /// 10 ms alone would be 1.6 M updates a second), and every location still goes out
    /// in turn.
    #[test]
    fn busy_locations_past_the_channel_send_no_more_than_it_carries() {
        const LOCATIONS: u32 = 16_384;
        const CAPACITY: u64 = 100_000;
        let mut s = Sender::new(SenderConfig {
            slots: 65_536,
            max_age_ns: 10_000_000,
            heartbeat_ns: 10_000_000,
            states: vec![SyncedState::register(0, LOCATIONS)],
            ..sender(CAPACITY).config
        });
        let mut values = vec![0u64; LOCATIONS as usize];
        let (mut out, mut sent) = (Vec::new(), std::collections::HashSet::new());
        let mut updates = 0;
        // One second, a pass every 2 ms, every location up by 2 each pass.
        for pass in 1..=500u64 {
            let now = pass * 2_000_000;
            s.expect_change(now, 2 * u64::from(LOCATIONS));
            for (i, v) in values.iter_mut().enumerate() {
                let at = Location {
                    state: 0,
                    index: i as u32,
                };
                s.change(now, at, *v, *v + 2);
                *v += 2;
            }
            s.poll(now, |l| values[l.index as usize], &mut out);
            for m in out.drain(..).filter(|m| m.kind != Kind::Layout) {
                updates += m.entries.len() as u64;
                sent.extend(m.entries.iter().map(|u| u.location.index));
            }
        }
        assert!(
            updates <= CAPACITY + CAPACITY / 10,
            "{updates} updates in a second on a channel of {CAPACITY}"
        );
        assert!(updates > CAPACITY / 2, "the channel is used: {updates}");
        assert_eq!(sent.len(), LOCATIONS as usize, "every location went out");
    }

    /// A stream announces its states first, again every second, and at its end, and the
    /// updates waiting go with each announcement (a message moves the copy on to now).
    #[test]
    fn the_layout_is_announced_with_the_waiting_updates() {
        let table = SyncedState {
            id: 1,
            length: 44,
            stride: 11,
        };
        let mut s = Sender::new(SenderConfig {
            heartbeat_ns: 10 * LAYOUT_EVERY_NS,
            batch_ns: 10 * LAYOUT_EVERY_NS,
            refresh_ns: 0,
            states: vec![SyncedState::register(0, 8), table],
            ..sender(1_000_000).config
        });
        let mut out = Vec::new();
        let layouts = |out: &[Message]| -> Vec<Vec<(u16, u32, u64)>> {
            (out.iter())
                .filter(|m| m.kind == Kind::Layout)
                .map(|m| {
                    (m.entries.iter())
                        .map(|e| (e.location.state, e.location.index, e.value))
                        .collect()
                })
                .collect()
        };
        s.change(1, Location { state: 0, index: 3 }, 0, 5);
        s.poll(1, |_| 0, &mut out);
        assert_eq!(layouts(&out), [vec![(0, 8, 1), (1, 44, 11)]]);
        assert_eq!(out[0].kind, Kind::Layout);
        assert!(
            out.iter()
                .any(|m| m.kind == Kind::Updates && m.entries.len() == 1),
            "the waiting update went with it: {out:?}"
        );
        out.clear();
        s.change(2, Location { state: 0, index: 4 }, 0, 6);
        s.poll(LAYOUT_EVERY_NS - 1, |_| 0, &mut out);
        assert!(out.is_empty(), "nothing due: {out:?}");
        s.poll(LAYOUT_EVERY_NS + 1, |_| 0, &mut out);
        assert_eq!(layouts(&out).len(), 1, "again a second on");
        assert!(out.iter().any(|m| m.kind == Kind::Updates));
        out.clear();
        s.finish(LAYOUT_EVERY_NS + 2, |_| 0, &mut out, |_| {});
        assert_eq!(layouts(&out).len(), 1, "and at the end");
    }

    /// The messages a collector asks for again go again as they were first sent, while
    /// kept; those no longer kept are counted.
    #[test]
    fn lost_messages_are_sent_again_while_kept() {
        let mut s = sender(1_000_000);
        let mut out = Vec::new();
        for i in 0..(KEPT_MESSAGES as u64 + 10) {
            s.change(i, Location { state: 0, index: 1 }, i, i + 1);
            s.poll(i * 10_000_000, |_| 0, &mut out);
        }
        let sent: Vec<Message> = std::mem::take(&mut out);
        let last = sent.last().unwrap().seq;
        let ask = |seqs: &[u64]| Message {
            kind: Kind::Nack,
            entries: (seqs.iter())
                .map(|&seq| Update {
                    location: Location { state: 0, index: 0 },
                    value: seq,
                    threshold: 0,
                })
                .collect(),
            ..sent[0].clone()
        };
        s.on_nack(&ask(&[last - 1, last, 1, last + 1]), &mut out);
        let again: Vec<&Message> = sent.iter().filter(|m| m.seq >= last - 1).collect();
        assert_eq!(out.iter().collect::<Vec<_>>(), again, "the same messages");
        assert_eq!((s.feedback.resent, s.feedback.not_kept), (2, 2));
    }

    /// A pass's changes are measured against what the channel carries in the time they
    /// took to come, not in one window: passes 100 ms apart bringing half the channel's
    /// rate keep the threshold at 0, and twice its rate raise it to 2 at once, as the
    /// window's end then confirms.
    #[test]
    fn a_pass_long_after_the_last_is_measured_over_the_time_since() {
        let mut s = sender(1_000_000);
        let mut out = Vec::new();
        s.poll(0, |_| 0, &mut out);
        s.expect_change(100_000_000, 50_000);
        assert_eq!(s.threshold(), 0, "half the channel's rate over 100 ms");
        s.poll(100_000_000, |_| 0, &mut out);
        s.expect_change(200_000_000, 200_000);
        assert_eq!(s.threshold(), 2, "twice the channel's rate over 100 ms");
    }

    /// A write's changes go at once and barely move the threshold, however large; the
    /// timeout monitor never sends the value from before the write; and a later change
    /// back to that value is sent (the handler measures from what the write sent).
    #[test]
    fn a_writes_changes_go_at_once_without_raising_the_threshold() {
        let mut s = sender(1_000_000);
        let mut out = Vec::new();
        let at = |index| Location { state: 0, index };
        // Location 1 holds 5 in the handler's slot, 300 in another one, 300 not yet sent.
        s.change(0, at(1), 0, 5);
        s.poll(2_000_000, |_| 0, &mut out);
        s.set_threshold(1_000);
        s.change(2_050_000, at(1), 5, 300);
        out.clear();
        s.expect_change(2_100_000, 16);
        for i in 0..16 {
            s.change_written(2_100_000, at(i), 300, u64::from(u32::MAX));
        }
        s.poll(2_200_000, |_| 0, &mut out);
        let sent = |out: &[Message], i, v| {
            (out.iter().flat_map(|m| &m.entries)).any(|e| e.location == at(i) && e.value == v)
        };
        for i in 0..16 {
            assert!(sent(&out, i, u64::from(u32::MAX)), "{i} at once: {out:?}");
        }
        out.clear();
        // Past the timeout: the slot holds the written value, nothing older goes.
        s.poll(4_000_000_000, |_| 0, &mut out);
        assert!(!sent(&out, 1, 300), "{out:?}");
        assert!(s.threshold() <= 1, "t {}", s.threshold());
        out.clear();
        s.change(4_100_000_000, at(1), u64::from(u32::MAX), 5);
        s.poll(4_200_000_000, |_| 0, &mut out);
        assert!(sent(&out, 1, 5), "{out:?}");
    }

    /// The changes of the passes a batch is left open over are measured over the time
    /// since the rate window began, before the batch: they waited in the state that long.
    /// Measured from each pass's poll, the second pass's would set `t` to 400.
    #[test]
    fn a_batch_left_open_is_measured_over_its_whole_window() {
        let mut s = sender(1_000_000);
        let mut out = Vec::new();
        let at = |index| Location { state: 0, index };
        let ms = 1_000_000;
        s.poll(0, |_| 0, &mut out);
        for (part, now) in [(0, 1_000 * ms), (1, 1_002 * ms + ms / 2)] {
            s.expect_change(now, 1_000_000);
            s.change(now, at(2 * part), 0, 500_000);
            s.change(now, at(2 * part + 1), 0, 500_000);
            s.poll_open(now, &mut out);
            assert!(s.threshold() <= 2, "part {part}: t {}", s.threshold());
        }
        s.poll(1_005 * ms, |_| 0, &mut out);
        assert_eq!(
            s.threshold(),
            2,
            "2,000,000 over 1,005 ms of 1,000,000 a second"
        );
    }

    /// Polls of a pass cut short send their updates in messages that all say more follow,
    /// the kept copies too; the next `poll` ends the batch with a message even when
    /// nothing waits (and only then).
    #[test]
    fn a_batch_left_open_is_ended_by_the_next_poll() {
        let mut s = sender(1_000_000).with_message_entries(2);
        let at = |index| Location { state: 0, index };
        let mut out = Vec::new();
        for i in 0..3 {
            s.change_exact(at(i), 0, 7);
        }
        s.poll_open(100, &mut out);
        s.poll_open(200, &mut out);
        assert_eq!(out.len(), 2, "{out:?}");
        assert!(out.iter().all(|m| m.more), "{out:?}");
        let seqs = |out: &[Message]| out.iter().map(|m| m.seq).collect::<Vec<_>>();
        let mut again = Vec::new();
        let nack = Message {
            kind: Kind::Nack,
            entries: (seqs(&out).into_iter())
                .map(|seq| Update {
                    location: at(0),
                    value: seq,
                    threshold: 0,
                })
                .collect(),
            ..report(0, 0)
        };
        s.on_nack(&nack, &mut again);
        assert_eq!(seqs(&again), seqs(&out));
        assert!(again.iter().all(|m| m.more), "kept as they went: {again:?}");
        // Well within the heartbeat's period: only the open batch makes it send.
        s.poll(300, |_| 0, &mut out);
        assert_eq!(out.len(), 3, "{out:?}");
        assert!(out[2].kind == Kind::Heartbeat && !out[2].more, "{out:?}");
        s.poll_open(400, &mut out);
        s.poll(500, |_| 0, &mut out);
        assert_eq!(out.len(), 3, "nothing waits, no batch is open: {out:?}");
    }
}
