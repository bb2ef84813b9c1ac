//! How a UDP sink spaces its messages so that a collector's socket buffer is not overrun:
//! at a fixed rate ([`Pacer`]), or, for a collector on this host, by its socket's queue
//! as the kernel shows it ([`QueueWindow`]): as fast as the collector reads.
//!
//! Must never: send, or hold a message back for ever (a collector that stops reading is
//! waited for up to [`STALL`], then sent to regardless, and its drops are reported).

use crate::units::{ByteRate, Pace};
use stateplane_io::receive_queue::{QueueProbe, QueueState, truesize};
use std::net::UdpSocket;
use std::time::{Duration, Instant};

/// How a UDP sink spaces its messages.
pub(super) enum Spacing {
    Rate(Pacer),
    Queue(QueueWindow),
}

/// What a message must wait for before it goes (what the sink holds goes first).
pub(super) enum Wait {
    Sleep(Duration),
    Room(u64),
}

impl Spacing {
    /// The spacing `pace` asks for on `socket` (connected to the collector): `auto` reads
    /// the queue of a collector on this host, and paces at [`Pace::REMOTE`] to any other.
    pub(super) fn new(pace: Pace, socket: &UdpSocket, now: Instant) -> Spacing {
        let probe = match pace {
            // Where the kernel will not show the queue (no sock_diag here), the summary
            // names the fixed rate that applies instead, and the log says why.
            Pace::Auto => QueueProbe::for_peer(socket).unwrap_or_else(|e| {
                log::warn!(
                    "cannot read the collector's socket queue ({e}): pacing at {} bytes/s",
                    Pace::REMOTE
                );
                None
            }),
            Pace::Rate(_) => None,
        };
        match (pace, probe) {
            (_, Some(probe)) => Spacing::Queue(QueueWindow::new(probe)),
            (Pace::Rate(rate), None) => Spacing::Rate(Pacer::new(rate, now)),
            (Pace::Auto, None) => Spacing::Rate(Pacer::new(Pace::REMOTE, now)),
        }
    }

    /// What a message of `len` bytes at `now` must wait for, if anything.
    pub(super) fn before_send(&mut self, now: Instant, len: usize) -> Option<Wait> {
        match self {
            Spacing::Rate(pacer) => pacer.delay(now, len).map(Wait::Sleep),
            Spacing::Queue(window) => window.take(len).map(Wait::Room),
        }
    }

    /// Waits as `before_send` said.
    pub(super) fn wait(&mut self, wait: Wait) {
        match (self, wait) {
            (_, Wait::Sleep(d)) => std::thread::sleep(d),
            (Spacing::Queue(window), Wait::Room(need)) => window.wait_for_room(need),
            (Spacing::Rate(_), Wait::Room(_)) => {}
        }
    }

    /// How it spaces messages, for the sink's name in the summary.
    pub(super) fn describe(&self) -> String {
        match self {
            Spacing::Rate(Pacer { rate: 0, .. }) => "unpaced".into(),
            Spacing::Rate(pacer) => format!("paced at {} bytes/s", ByteRate(pacer.rate)),
            Spacing::Queue(_) => "paced by the collector's socket queue on this host".into(),
        }
    }

    /// What pacing by the collector's queue saw, read once more now.
    pub(super) fn finish(self) -> Option<CollectorQueue> {
        match self {
            Spacing::Queue(mut window) => {
                window.read();
                Some(window.seen)
            }
            Spacing::Rate(_) => None,
        }
    }
}

/// What a sink paced by its collector's socket queue saw of it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CollectorQueue {
    /// The socket's receive buffer, in bytes (as the kernel counts it: twice what the
    /// collector asked for), at the last reading.
    pub capacity: u64,
    /// Datagrams the socket dropped between the first reading and the last (other
    /// senders' included).
    pub drops: u64,
    /// Time spent waiting for room in it.
    pub waited: Duration,
    /// Times it took nothing for [`STALL`] (messages then went without waiting).
    pub stalls: u64,
    /// The first failure to read the queue (messages then went without waiting until a
    /// reading worked again).
    pub error: Option<String>,
}

/// The share of a collector's receive buffer that messages in flight may fill: the rest
/// is room for other senders and for datagrams larger in the queue than [`truesize`]
/// estimates.
const QUEUE_SHARE: (u64, u64) = (3, 4);

/// How often a full queue is read again while waiting for room.
const POLL: Duration = Duration::from_micros(50);

/// How long a collector may take nothing before messages go regardless: a collector that
/// has stopped (suspended, or gone and its port taken over) must not hold the run up for
/// ever. Its drops are then reported.
pub const STALL: Duration = Duration::from_secs(1);

/// Sends while the collector's queue has room: each reading of the queue gives the room
/// left (its share of the buffer less what is queued), which messages use up as they go
/// (each at what it takes in the queue); when it is used up the queue is read again, and
/// while it has no room, read every [`POLL`] until the collector has read enough.
pub(super) struct QueueWindow {
    probe: QueueProbe,
    /// Bytes, as the queue counts them, that may go before it is read again.
    credit: u64,
    /// The collector has not read for [`STALL`]: messages go without waiting until a
    /// reading finds room again.
    stalled: bool,
    first_drops: Option<u64>,
    seen: CollectorQueue,
}

impl QueueWindow {
    fn new(probe: QueueProbe) -> QueueWindow {
        QueueWindow {
            probe,
            credit: 0,
            stalled: false,
            first_drops: None,
            seen: CollectorQueue::default(),
        }
    }

    /// Takes room for a message of `len` bytes from the credit, or says how much room it
    /// needs in the queue.
    fn take(&mut self, len: usize) -> Option<u64> {
        let need = truesize(len);
        match self.credit.checked_sub(need) {
            Some(left) => {
                self.credit = left;
                None
            }
            None => Some(need),
        }
    }

    /// The queue now (`None`: no collector listens there now, or it cannot be read).
    fn read(&mut self) -> Option<QueueState> {
        match self.probe.read() {
            Ok(Some(q)) => {
                let first = *self.first_drops.get_or_insert(q.drops);
                self.seen.drops = q.drops.saturating_sub(first);
                self.seen.capacity = q.capacity;
                Some(q)
            }
            Ok(None) => None,
            Err(e) => {
                let e = format!("reading the collector's socket queue: {e}");
                self.seen.error.get_or_insert(e);
                None
            }
        }
    }

    /// Waits until the queue has room for `need` bytes (or is empty), the collector is
    /// gone, or it has stalled; the credit is then what room is left.
    fn wait_for_room(&mut self, need: u64) {
        let start = Instant::now();
        loop {
            // No collector listens there now: the message goes (the kernel refuses it),
            // and the next one reads again.
            let Some(q) = self.read() else {
                self.credit = 0;
                break;
            };
            let share = q.capacity * QUEUE_SHARE.0 / QUEUE_SHARE.1;
            let room = share.saturating_sub(q.queued);
            if room >= need || q.queued == 0 {
                self.stalled = false;
                self.credit = room.saturating_sub(need);
                break;
            }
            if self.stalled {
                break;
            }
            if start.elapsed() >= STALL {
                self.stalled = true;
                self.seen.stalls += 1;
                break;
            }
            std::thread::sleep(POLL);
        }
        self.seen.waited += start.elapsed();
    }
}

/// Spaces UDP messages so that a collector's socket buffer is not overrun: a token bucket
/// of `BURST_BYTES` refilled at the rate in bytes, so that large messages (64 KiB on
/// loopback) and small ones put the same load on the collector (sleeping per message
/// would cost more than the gap it waits for).
pub(super) struct Pacer {
    /// Bytes per second; 0: unpaced.
    rate: u64,
    /// How long a burst takes at the rate.
    burst: Duration,
    /// Where the next message's slot begins: this runs ahead of now by the time the bytes
    /// sent beyond the rate take at the rate.
    next: Instant,
    /// When the caller's last wait ends: the time is at least this, even if the caller
    /// passes the instant its batch began.
    awake: Instant,
}

/// Small enough that several bursts fit in a collector's default receive buffer (Linux:
/// 208 KiB, where each 1,428-byte datagram takes 2,304), so that a collector kept off the
/// CPU for a few bursts loses nothing: 16 messages of 1,400 bytes. With 64 (and twice
/// that after an idle spell, which the pacer then allowed), nfcapd at its default buffer
/// lost 0.2-2.3% of the records of a two-worker run at the default rate, in every run;
/// with 16, none. A message larger than a burst goes on its own.
const BURST_BYTES: u64 = 16 * 1400;

impl Pacer {
    pub(super) fn new(rate: ByteRate, now: Instant) -> Pacer {
        let mut pacer = Pacer {
            rate: rate.0,
            burst: Duration::ZERO,
            next: now,
            awake: now,
        };
        pacer.burst = pacer.time(BURST_BYTES);
        pacer
    }

    /// How long `bytes` take at the rate (0 unpaced).
    fn time(&self, bytes: u64) -> Duration {
        let nanos = (u128::from(bytes) * 1_000_000_000).checked_div(u128::from(self.rate));
        Duration::from_nanos(nanos.map_or(0, |n| u64::try_from(n).unwrap_or(u64::MAX)))
    }

    /// How long to wait, from `now`, before a message of `len` bytes, if at all (the
    /// message is counted as sent when that wait is over).
    pub(super) fn delay(&mut self, now: Instant, len: usize) -> Option<Duration> {
        if self.rate == 0 {
            return None;
        }
        // Idle time earns nothing (a slot is never in the past), so at most a burst goes
        // at once. The message that would overfill it waits for its slot, and the next
        // burst goes with it then: one sleep per burst, not one per message.
        let now = now.max(self.awake);
        let slot = self.next.max(now);
        let ahead = slot - now;
        let time = self.time(len as u64);
        self.next = slot + time;
        let wait = !ahead.is_zero() && ahead + time > self.burst;
        if wait {
            self.awake = slot;
        }
        wait.then_some(ahead)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On the pacer's own clock: 16 messages of 1,400 bytes go at once, the next waits
    /// until the burst is earned back at the rate and then goes with the next burst, and a
    /// long idle spell earns no more than one burst (each burst must fit a collector's
    /// buffer); messages larger than a burst go one at a time, spaced at the rate.
    #[test]
    fn the_pacer_sends_bursts_of_16_small_messages_at_the_rate() {
        let rate = ByteRate(28_000_000);
        let gap = Duration::from_micros(50); // 1,400 bytes at 28 MB/s
        let start = Instant::now() + Duration::from_secs(1);
        let mut pacer = Pacer::new(rate, start);
        // The messages of `len` bytes that go at `now` without a wait, and the wait of
        // the next one.
        let mut burst = |now, len| {
            let mut free = 0;
            loop {
                match pacer.delay(now, len) {
                    None if free < 100 => free += 1,
                    wait => return (free, wait),
                }
            }
        };
        let (free, wait) = burst(start, 1400);
        assert_eq!(free, 16, "the first burst");
        assert_eq!(wait, Some(gap * 16));
        // The message that waited goes when its wait is over, with the rest of its burst.
        let mut now = start + gap * 16;
        for round in 0..5 {
            let (free, wait) = burst(now, 1400);
            assert_eq!(free + 1, 16, "burst {round} after a wait");
            assert_eq!(wait, Some(gap * 16), "burst {round}");
            now += gap * 16;
        }
        let (free, _) = burst(now + Duration::from_secs(10), 1400);
        assert_eq!(free, 16, "after an idle spell");
        // 64 KiB messages: one at a time, each waiting for the one before it.
        let now = now + Duration::from_secs(20);
        let big_gap = Duration::from_nanos(65_000 * 1_000_000_000 / 28_000_000);
        let (free, wait) = burst(now, 65_000);
        assert_eq!((free, wait), (1, Some(big_gap)));
        let (free, wait) = burst(now + big_gap, 65_000);
        assert_eq!((free, wait), (0, Some(big_gap)));
        // A batch handed over at one instant: each wait counts from the end of the one
        // before it (the caller has slept meanwhile), so ten messages take nine gaps in
        // all. Counting each from the batch's instant made the waits grow by a gap per
        // message: 45 gaps for ten, and 2.9 s for a 600,000-packet trace's 55 messages.
        let later = now + Duration::from_secs(30);
        let mut batch = Pacer::new(rate, later);
        let waited: Duration = (0..10).filter_map(|_| batch.delay(later, 65_000)).sum();
        assert_eq!(waited, big_gap * 9);
        // Unpaced: never a wait.
        let mut unpaced = Pacer::new(ByteRate(0), Instant::now());
        assert!((0..1000).all(|_| unpaced.delay(start, 65_000).is_none()));
    }
}
