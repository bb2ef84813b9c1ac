//! A worker's side of the sync, whole: its read handler, the rate controller that sets
//! the handler's threshold each window, the timeout monitor, the anti-entropy refresh of
//! every location, and the stream that numbers the messages. Fed each change to synced
//! state ([`Sender::change`]) and polled once a burst ([`Sender::poll`]), it returns the
//! messages to send.

use crate::rate::RateController;
use crate::read_handler::ReadHandler;
use crate::wire::{Kind, MAX_ENTRIES, Message};
use crate::{Location, Update};

/// What a worker's sync is asked to do.
#[derive(Clone, Debug)]
pub struct SenderConfig {
    pub switch: u32,
    /// Changes when the switch starts again (the collector starts its streams over).
    pub epoch: u32,
    pub stream: u16,
    /// Slots of the read handler's table.
    pub slots: usize,
    pub rate: RateController,
    /// A location waits unsent at most this long (the timeout monitor).
    pub max_age_ns: u64,
    /// A message at least this often, entries or none, so that the collector sees the
    /// stream alive and a lost message soon.
    pub heartbeat_ns: u64,
    /// Every location is sent whole at least this often (anti-entropy), so that the
    /// collector's copy converges exactly after any loss. 0: never.
    pub refresh_ns: u64,
    /// The synced state: each state's id and length.
    pub states: Vec<(u16, u32)>,
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
    /// The threshold in force, and the largest in force since the last message.
    threshold: u64,
    t_max: u64,
    window_start_ns: Option<u64>,
    last_sent_ns: Option<u64>,
    refresh: Refresh,
    /// Updates waiting for the next message.
    pending: Vec<Update>,
    /// Refresh entries waiting for the next refresh message.
    refreshed: Vec<Update>,
    /// Slots the timeout monitor visits per window: the whole table once per `max_age_ns`.
    expire_visit: usize,
}

impl Sender {
    pub fn new(config: SenderConfig) -> Sender {
        let handler = ReadHandler::new(config.slots);
        let slots = config.slots.max(1).next_power_of_two() as u128;
        let windows_per_age =
            (u128::from(config.max_age_ns) / u128::from(config.rate.window_ns.max(1))).max(1);
        let expire_visit = slots.div_ceil(windows_per_age) as usize;
        Sender {
            handler,
            next_seq: 1,
            threshold: 0,
            t_max: 0,
            window_start_ns: None,
            last_sent_ns: None,
            refresh: Refresh {
                state: 0,
                index: 0,
                next_pass_ns: config.refresh_ns,
                running: false,
            },
            pending: Vec::new(),
            refreshed: Vec::new(),
            expire_visit,
            config,
        }
    }

    pub fn threshold(&self) -> u64 {
        self.threshold
    }

    /// `location` changed from `old` to `new` (what a synced state reports of each write).
    #[inline]
    pub fn change(&mut self, now_ns: u64, location: Location, old: u64, new: u64) {
        self.handler
            .change(now_ns, location, old, new, &mut self.pending);
    }

    /// Once a burst: ends the rate window if it is over (the next threshold), sends what
    /// waited too long, goes on with the refresh (reading the state with `read`), and
    /// appends the messages to send to `out`.
    pub fn poll(
        &mut self,
        now_ns: u64,
        mut read: impl FnMut(Location) -> u64,
        out: &mut Vec<Message>,
    ) {
        let start = *self.window_start_ns.get_or_insert(now_ns);
        if now_ns.saturating_sub(start) >= self.config.rate.window_ns {
            let t = self.config.rate.threshold(self.handler.take_change());
            self.set_threshold(t);
            let visit = self.expire_visit;
            (self.handler).expire(now_ns, self.config.max_age_ns, visit, &mut self.pending);
            self.window_start_ns = Some(now_ns);
        }
        self.refresh_some(now_ns, &mut read);
        let first = out.len();
        self.send(now_ns, Kind::Updates, out);
        self.send(now_ns, Kind::Refresh, out);
        let quiet = self
            .last_sent_ns
            .is_none_or(|last| now_ns.saturating_sub(last) >= self.config.heartbeat_ns);
        if quiet && out.len() == first {
            self.emit(now_ns, Kind::Heartbeat, Vec::new(), out);
        }
        // This poll's messages are one batch: all but its last say that more follow.
        let batch = &mut out[first..];
        if let Some((_, before_last)) = batch.split_last_mut() {
            for m in before_last {
                m.more = true;
            }
        }
    }

    fn set_threshold(&mut self, t: u64) {
        self.threshold = t;
        self.t_max = self.t_max.max(t);
        self.handler.set_threshold(t);
    }

    /// Reads the next locations of the refresh pass, at most a message's worth a poll.
    fn refresh_some(&mut self, now_ns: u64, read: &mut impl FnMut(Location) -> u64) {
        if self.config.refresh_ns == 0 || self.config.states.is_empty() {
            return;
        }
        let r = &mut self.refresh;
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
        while self.refreshed.len() < MAX_ENTRIES {
            let Some(&(state, len)) = self.config.states.get(r.state) else {
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

    /// Sends the waiting entries of `kind` in messages of at most `MAX_ENTRIES`.
    fn send(&mut self, now_ns: u64, kind: Kind, out: &mut Vec<Message>) {
        let waiting = match kind {
            Kind::Refresh => std::mem::take(&mut self.refreshed),
            _ => std::mem::take(&mut self.pending),
        };
        for entries in waiting.chunks(MAX_ENTRIES) {
            self.emit(now_ns, kind, entries.to_vec(), out);
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
        self.next_seq += 1;
        // The threshold in force now goes on into the next message's period.
        self.t_max = self.threshold;
        self.last_sent_ns = Some(now_ns);
    }
}
