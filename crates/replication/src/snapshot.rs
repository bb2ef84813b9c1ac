//! A worker's side of bounded replication (RedPlane's periodic snapshot replication): its
//! replicated state goes to the store as consistent snapshots, one every period, written
//! while packets go on (no output waits for the store), and the time since the state the
//! store last acknowledged was taken, the staleness, is kept against a bound ε.
//!
//! A worker's snapshots are one value at the store, under one key and one lease: the store
//! fences the writes of a worker that lost it, and a worker that starts (a switch
//! restarted, or a standby given the same switch id) acquires the lease and installs the
//! image the store has before it serves (this is recovery).
//!
//! Call order: [`Snapshots::poll_transmit`] for the requests due, answers to
//! [`Snapshots::handle_reply`] (an [`Installed`] to install), and on the worker's clock:
//! when [`Snapshots::snapshot_due`], begin a snapshot of the state (the lazy snapshot of
//! the state primitives: it reads the state as it was when it began, while packets go on
//! changing it), tell [`Snapshots::began`], read it into an [`ImageWriter`] at the
//! worker's pace, and hand the image to [`Snapshots::read`]; [`Snapshots::staleness`]
//! says how old the store's state is.
//!
//! Invariants: at most one snapshot is read or written at a time (the next waits for the
//! store's acknowledgement of this one: the paper's "additional snapshots must wait"); a
//! snapshot's staleness counts from when it began, so the store holds every change made
//! before `now - staleness`; writes are made only under a lease this side holds on its
//! conservative clock (taken to start when its ask was first sent, to end `margin_ns`
//! early).
//!
//! Must never: do I/O or read a clock; call the state fresh when the store has not
//! acknowledged it; write without a lease.

use crate::protocol::{FlowBytes, Holder, KEEP_FOREVER, Reply, Request};

/// The store's requests and answers, as a worker's snapshots use them.
pub type SnapshotRequest = Request<FlowBytes, Vec<u8>>;
pub type SnapshotReply = Reply<FlowBytes, Vec<u8>>;

#[derive(Clone, Copy, Debug)]
pub struct SnapshotConfig {
    /// A snapshot begins this long after the last began (or as soon as the last is
    /// acknowledged, when that takes longer).
    pub period_ns: u64,
    /// ε: past this staleness, the worker's `on_stale` action.
    pub bound_ns: u64,
    pub lease_ns: u64,
    /// This side takes its lease to end this much before the store's.
    pub margin_ns: u64,
    /// An unanswered request is sent again after this long (doubling, to 16 times it).
    pub retransmit_ns: u64,
}

/// What the worker is to install: the store's latest image (`None`: the store has none,
/// and the state starts afresh).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Installed(pub Option<Vec<u8>>);

/// What the snapshots did, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SnapshotStats {
    /// Snapshots begun, and those the store acknowledged.
    pub begun: u64,
    pub written: u64,
    /// Bytes of the acknowledged images.
    pub bytes: u64,
    pub acquires: u64,
    pub renewals: u64,
    pub retransmits: u64,
    /// Writes refused because the lease was not this worker's any more.
    pub fenced: u64,
    /// Images installed from the store.
    pub installed: u64,
}

/// A request on its way, for retransmission.
#[derive(Clone, Copy, Debug)]
struct Sent {
    first_ns: u64,
    last_ns: u64,
    tries: u32,
}

impl Sent {
    fn new(now_ns: u64) -> Sent {
        Sent {
            first_ns: now_ns,
            last_ns: now_ns,
            tries: 0,
        }
    }

    /// Whether it is time to send again (and then notes it sent).
    fn again(&mut self, now_ns: u64, rto: u64) -> bool {
        let due = now_ns >= self.last_ns + crate::replica::backoff(rto, self.tries);
        if due {
            self.last_ns = now_ns;
            self.tries += 1;
        }
        due
    }
}

/// A lease asked for (`renew`: of the epoch held, else anew), and its nonce.
#[derive(Clone, Copy, Debug)]
struct Ask {
    nonce: u64,
    renew: bool,
    sent: Sent,
}

/// A snapshot's image on its way to the store.
#[derive(Debug)]
struct Writing {
    began_ns: u64,
    seq: u64,
    value: Vec<u8>,
    sent: Option<Sent>,
    /// The epoch of the lease it was last sent under (0: never sent): a grant whose last
    /// write is `seq` applied under it is this write, its answer lost.
    sent_under: u64,
}

pub struct Snapshots {
    key: FlowBytes,
    config: SnapshotConfig,
    /// The lease's epoch and its end on this side's clock, while held.
    lease: Option<(u64, u64)>,
    ask: Option<Ask>,
    /// Another holder has the lease: ask again no earlier than this.
    retry_at_ns: u64,
    nonce: u64,
    /// Writes the store has of this key (its sequence number).
    seq: u64,
    /// Whether an image was installed: the worker serves from then on.
    serving: bool,
    reading_since: Option<u64>,
    writing: Option<Writing>,
    next_ns: u64,
    /// When the state the store has (or that was installed from it) was taken; before
    /// the first, when this side started.
    fresh_ns: u64,
    pub stats: SnapshotStats,
}

impl Snapshots {
    pub fn new(key: FlowBytes, config: SnapshotConfig, now_ns: u64) -> Snapshots {
        Snapshots {
            key,
            config,
            lease: None,
            ask: None,
            retry_at_ns: now_ns,
            nonce: 0,
            seq: 0,
            serving: false,
            reading_since: None,
            writing: None,
            next_ns: now_ns,
            fresh_ns: now_ns,
            stats: SnapshotStats::default(),
        }
    }

    /// The store's key of this worker's snapshots: switch `switch`'s worker `worker`.
    pub fn key_of(switch: u32, worker: usize) -> FlowBytes {
        let mut bytes = b"snapshot/".to_vec();
        bytes.extend_from_slice(&switch.to_be_bytes());
        bytes.extend_from_slice(&(worker as u32).to_be_bytes());
        // 17 bytes: always within FlowBytes::MAX.
        FlowBytes::new(&bytes).unwrap_or_else(|| unreachable!("17 bytes fit"))
    }

    /// Whether the store's image was installed (before it, the worker holds its packets).
    pub fn serving(&self) -> bool {
        self.serving
    }

    fn holds(&self, now_ns: u64) -> Option<u64> {
        self.lease
            .filter(|&(_, until)| now_ns < until)
            .map(|(epoch, _)| epoch)
    }

    /// How long ago the state the store has was taken.
    pub fn staleness(&self, now_ns: u64) -> u64 {
        now_ns.saturating_sub(self.fresh_ns)
    }

    /// Whether the staleness is past the bound ε.
    pub fn stale(&self, now_ns: u64) -> bool {
        self.staleness(now_ns) > self.config.bound_ns
    }

    /// Whether a snapshot is to begin now.
    pub fn snapshot_due(&self, now_ns: u64) -> bool {
        self.serving
            && self.reading_since.is_none()
            && self.writing.is_none()
            && self.holds(now_ns).is_some()
            && now_ns >= self.next_ns
    }

    /// A snapshot of the state began now (read it, then hand it to [`Snapshots::read`]).
    pub fn began(&mut self, now_ns: u64) {
        self.reading_since = Some(now_ns);
        self.next_ns = now_ns + self.config.period_ns;
        self.stats.begun += 1;
    }

    /// Whether a snapshot is being read.
    pub fn reading(&self) -> bool {
        self.reading_since.is_some()
    }

    /// Whether no snapshot is being read or written.
    pub fn idle(&self) -> bool {
        self.reading_since.is_none() && self.writing.is_none()
    }

    /// The next snapshot begins as soon as it can, its period or not (the run ends).
    pub fn hurry(&mut self) {
        self.next_ns = 0;
    }

    /// The snapshot begun last is read: `image` goes to the store.
    pub fn read(&mut self, image: Vec<u8>) {
        if let Some(began_ns) = self.reading_since.take() {
            self.writing = Some(Writing {
                began_ns,
                seq: self.seq + 1,
                value: image,
                sent: None,
                sent_under: 0,
            });
        }
    }

    /// The requests due now, appended to `out`.
    pub fn poll_transmit(&mut self, now_ns: u64, out: &mut Vec<SnapshotRequest>) {
        let rto = self.config.retransmit_ns;
        let lease_ns = self.config.lease_ns;
        // A write on its way is sent again under its lease until the store answers it
        // (written, or fenced): a lease asked for meanwhile could be granted with a state
        // older than that write, which the store may take after the grant.
        let on_its_way = self.writing.as_ref().is_some_and(|w| w.sent.is_some());
        if self.lease.is_some() && self.holds(now_ns).is_none() && !on_its_way {
            // The lease passed unrenewed: it is asked for anew.
            self.lease = None;
            self.ask = self.ask.filter(|a| !a.renew);
        }
        // The lease: asked for while not held (once another's has passed), renewed at half
        // its time when no write renews it.
        if let Some(ask) = &mut self.ask {
            if ask.sent.again(now_ns, rto) {
                self.stats.retransmits += 1;
                let renew = ask.renew;
                let nonce = ask.nonce;
                out.push(self.lease_request(renew, nonce));
            }
        } else if self.lease.is_none() && now_ns >= self.retry_at_ns {
            self.ask_lease(now_ns, false, out);
        } else if let Some((_, until)) = self.lease
            && self.writing.as_ref().is_none_or(|w| w.sent.is_none())
            && until.saturating_sub(now_ns) <= lease_ns / 2
        {
            self.ask_lease(now_ns, true, out);
        }
        let Some(w) = &mut self.writing else {
            return;
        };
        let held = self.lease.filter(|&(_, until)| now_ns < until);
        let Some((epoch, _)) = held.or(self.lease.filter(|_| w.sent.is_some())) else {
            return;
        };
        {
            let send = match &mut w.sent {
                None => {
                    w.sent = Some(Sent::new(now_ns));
                    true
                }
                Some(sent) => {
                    let again = sent.again(now_ns, rto);
                    self.stats.retransmits += u64::from(again);
                    again
                }
            };
            if send {
                w.sent_under = epoch;
                out.push(Request::Write {
                    key: self.key,
                    epoch,
                    seq: w.seq,
                    value: w.value.clone(),
                    lease_ns,
                    keep_ns: KEEP_FOREVER,
                    alias: None,
                });
            }
        }
    }

    fn ask_lease(&mut self, now_ns: u64, renew: bool, out: &mut Vec<SnapshotRequest>) {
        self.nonce += 1;
        self.ask = Some(Ask {
            nonce: self.nonce,
            renew,
            sent: Sent::new(now_ns),
        });
        if renew {
            self.stats.renewals += 1;
        } else {
            self.stats.acquires += 1;
        }
        out.push(self.lease_request(renew, self.nonce));
    }

    fn lease_request(&self, renew: bool, nonce: u64) -> SnapshotRequest {
        match (renew, self.lease) {
            (true, Some((epoch, _))) => Request::Renew {
                key: self.key,
                epoch,
                lease_ns: self.config.lease_ns,
                nonce,
                keep_ns: KEEP_FOREVER,
                alias: None,
            },
            _ => Request::Acquire {
                key: self.key,
                lease_ns: self.config.lease_ns,
                nonce,
            },
        }
    }

    /// An answer from the store: `Some` when the store's image is to be installed (the
    /// first lease, or one granted after another holder wrote).
    pub fn handle_reply(&mut self, now_ns: u64, reply: SnapshotReply) -> Option<Installed> {
        if reply.key() != self.key {
            return None;
        }
        let (asked, margin) = (self.config.lease_ns, self.config.margin_ns);
        let until = move |first_sent_ns, granted_ns| {
            crate::replica::lease_end(first_sent_ns, granted_ns, asked, margin)
        };
        match reply {
            Reply::Granted {
                epoch,
                seq,
                value,
                lease_ns,
                nonce,
                written_epoch,
                ..
            } => {
                let ask = self.ask.filter(|a| a.nonce == nonce && !a.renew)?;
                self.ask = None;
                self.lease = Some((epoch, until(ask.sent.first_ns, lease_ns)));
                // What this side wrote last is the store's still: nothing to install, and
                // a write of a snapshot in flight goes on under the new epoch. The store may
                // have that write too, its answer lost: then it is acknowledged now.
                if self.serving && seq == self.seq {
                    if let Some(w) = &mut self.writing {
                        w.sent = None;
                    }
                    return None;
                }
                // (A fenced sending of it may have followed one the store took.) Known by
                // the epoch it was applied under: another holder's write of the same
                // number, even of the same image, is not this side's.
                if let Some(w) = self.writing.take_if(|w| {
                    self.serving
                        && w.seq == seq
                        && w.sent_under != 0
                        && w.sent_under == written_epoch
                }) {
                    self.acknowledged(&w);
                    return None;
                }
                self.seq = seq;
                // Another holder wrote (or this side starts): its image replaces the state,
                // and a snapshot of the state it replaces is not written.
                self.writing = None;
                self.reading_since = None;
                self.serving = true;
                self.fresh_ns = now_ns;
                self.next_ns = now_ns;
                self.stats.installed += u64::from(value.is_some());
                Some(Installed(value))
            }
            Reply::Held {
                remaining_ns,
                nonce,
                ..
            } => {
                if self.ask.is_some_and(|a| a.nonce == nonce) {
                    self.ask = None;
                    self.lease = None;
                    self.retry_at_ns = now_ns + remaining_ns.min(self.config.lease_ns);
                }
                None
            }
            Reply::Renewed {
                epoch,
                lease_ns,
                nonce,
                ..
            } => {
                if let Some(ask) = self.ask.filter(|a| a.nonce == nonce && a.renew)
                    && self.lease.is_some_and(|(e, _)| e == epoch)
                {
                    self.ask = None;
                    self.lease = Some((epoch, until(ask.sent.first_ns, lease_ns)));
                }
                None
            }
            Reply::Written {
                epoch,
                seq,
                lease_ns,
                ..
            } => {
                let w = self.writing.as_ref().filter(|w| w.seq == seq)?;
                let sent = w.sent?;
                if self.lease.is_some_and(|(e, _)| e == epoch) {
                    self.lease = Some((epoch, until(sent.first_ns, lease_ns)));
                }
                if let Some(w) = self.writing.take() {
                    self.acknowledged(&w);
                }
                None
            }
            Reply::Fenced { epoch, .. } => {
                if self.lease.is_some_and(|(e, _)| e == epoch) {
                    // The lease is not this side's any more: ask again; the write in flight
                    // goes again under the new one, if the store still has this side's
                    // last write then.
                    self.stats.fenced += 1;
                    self.lease = None;
                    self.ask = None;
                    if let Some(w) = &mut self.writing {
                        w.sent = None;
                    }
                }
                None
            }
            Reply::Resolved { .. } => None,
        }
    }

    fn acknowledged(&mut self, w: &Writing) {
        self.seq = w.seq;
        self.fresh_ns = self.fresh_ns.max(w.began_ns);
        self.stats.written += 1;
        self.stats.bytes += w.value.len() as u64;
    }

    /// The holder this side writes as, for the link (the replica's convention: switch and
    /// worker in one id, the incarnation apart).
    pub fn holder(switch: u32, worker: usize, incarnation: u32) -> Holder {
        Holder {
            switch: switch << 8 | (worker as u32 & 0xff),
            incarnation,
        }
    }
}

/// A snapshot's image: each state's words, the runs of zeros skipped.
///
/// ```text
/// image := "SPS1" | states u16 | state × states
/// state := id u16 | cells u32 | runs u32 | run × runs
/// run   := first varint | count varint | width u8 | count × word   (in order of
///          `first`; each word `width` bytes, little-endian: 1, 2, 4 or 8)
/// ```
/// (varints: LEB128.) Written as the snapshot is read, a chunk of a state's words at a
/// time; a run never spans two chunks, so that a chunk unchanged since the last snapshot
/// is written again as it was encoded then ([`ImageWriter::encoded`]).
pub struct ImageWriter {
    out: Vec<u8>,
    states: u16,
    /// The state being written: where its count of runs goes, and that count.
    runs_at: usize,
    runs: u32,
}

const MAGIC: &[u8; 4] = b"SPS1";

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

impl Default for ImageWriter {
    fn default() -> Self {
        ImageWriter {
            out: [&MAGIC[..], &[0, 0]].concat(),
            states: 0,
            runs_at: 0,
            runs: 0,
        }
    }
}

/// A chunk's encoding: its runs' bytes and how many runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chunk {
    pub bytes: Vec<u8>,
    pub runs: u32,
}

impl Chunk {
    /// Encodes the words of cells `first, first + 1, ...`, the zeros skipped a block of
    /// [`ZERO_BLOCK`] at a time (a run keeps the zeros inside its blocks: a sketch under
    /// load is zeros and counts mixed, and skipping each zero on its own costs a
    /// mispredicted branch a word).
    pub fn encode(first: u32, words: &[u64]) -> Chunk {
        let mut chunk = Chunk::default();
        // Block `b`'s words OR-ed: zero if they all are.
        let any = |b: usize| {
            let block = &words[b * ZERO_BLOCK..((b + 1) * ZERO_BLOCK).min(words.len())];
            block.iter().fold(0, |a, &w| a | w)
        };
        let blocks = words.len().div_ceil(ZERO_BLOCK);
        let mut b = 0;
        while b < blocks {
            if any(b) == 0 {
                b += 1;
                continue;
            }
            let start = b;
            let mut widest = 0u64;
            while b < blocks {
                let bits = any(b);
                if bits == 0 {
                    break;
                }
                widest |= bits;
                b += 1;
            }
            let (lo, hi) = (start * ZERO_BLOCK, (b * ZERO_BLOCK).min(words.len()));
            let run = &words[lo..hi];
            varint(&mut chunk.bytes, u64::from(first) + lo as u64);
            varint(&mut chunk.bytes, run.len() as u64);
            // The fewest bytes of 1, 2, 4 or 8 that hold every word of the run.
            let out = &mut chunk.bytes;
            match widest {
                0..=0xff => {
                    out.push(1);
                    out.extend(run.iter().map(|&w| w as u8));
                }
                0x100..=0xffff => {
                    out.push(2);
                    out.extend(run.iter().flat_map(|&w| (w as u16).to_le_bytes()));
                }
                0x1_0000..=0xffff_ffff => {
                    out.push(4);
                    out.extend(run.iter().flat_map(|&w| (w as u32).to_le_bytes()));
                }
                _ => {
                    out.push(8);
                    out.extend(run.iter().flat_map(|&w| w.to_le_bytes()));
                }
            }
            chunk.runs += 1;
        }
        chunk
    }
}

/// Words whose zeros a chunk's encoding skips together.
pub const ZERO_BLOCK: usize = 16;

impl ImageWriter {
    /// Starts state `id` of `cells` words; its chunks follow in order of their cells.
    pub fn state(&mut self, id: u16, cells: u32) {
        self.end_state();
        self.states += 1;
        self.out.extend_from_slice(&id.to_le_bytes());
        self.out.extend_from_slice(&cells.to_le_bytes());
        self.runs_at = self.out.len();
        self.out.extend_from_slice(&0u32.to_le_bytes());
        self.runs = 0;
    }

    /// The state's next chunk, encoded ([`Chunk::encode`]).
    pub fn encoded(&mut self, chunk: &Chunk) {
        self.out.extend_from_slice(&chunk.bytes);
        self.runs += chunk.runs;
    }

    /// Ends the state being written: its count of runs.
    fn end_state(&mut self) {
        if self.runs_at > 0 {
            self.out[self.runs_at..self.runs_at + 4].copy_from_slice(&self.runs.to_le_bytes());
        }
    }

    /// The image (every state begun must be complete).
    pub fn finish(mut self) -> Vec<u8> {
        self.end_state();
        self.out[MAGIC.len()..MAGIC.len() + 2].copy_from_slice(&self.states.to_le_bytes());
        self.out
    }
}

/// Why an image from the store cannot be installed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImageError {
    NotAnImage,
    Truncated,
    /// The image's state `id` has `cells` words, and the run's has `expected` (its
    /// configuration changed: a sketch's width or depth).
    Mismatch {
        id: u16,
        cells: u32,
        expected: u32,
    },
    /// State `id` is not replicated here.
    UnknownState(u16),
    /// A run goes past its state's end, or before the end of the run before it.
    Overrun(u16),
    /// Bytes after the last state.
    Trailing,
}

impl std::fmt::Display for ImageError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ImageError::NotAnImage => write!(f, "the store's value is not a snapshot image"),
            ImageError::Truncated => write!(f, "the image ends early"),
            ImageError::Mismatch {
                id,
                cells,
                expected,
            } => write!(
                f,
                "state {id} has {cells} cells in the image and {expected} here (its \
                 configuration changed since the image was written)"
            ),
            ImageError::UnknownState(id) => write!(f, "state {id} is not replicated here"),
            ImageError::Overrun(id) => write!(f, "state {id}'s runs overlap or go past its end"),
            ImageError::Trailing => write!(f, "bytes follow the image's last state"),
        }
    }
}

/// Reads an image: calls `run(id, first, words)` for each run of non-zero words, after
/// checking every state against `cells_of(id)` (its cells here; `None`: not replicated
/// here) and the whole image's framing, so that nothing is called for an image that is
/// not whole.
pub fn read_image(
    image: &[u8],
    cells_of: impl Fn(u16) -> Option<u32>,
    mut run: impl FnMut(u16, u32, &[u64]),
) -> Result<(), ImageError> {
    let mut runs = Vec::new();
    let mut r = Reader {
        bytes: image.strip_prefix(MAGIC).ok_or(ImageError::NotAnImage)?,
    };
    for _ in 0..u16::from_le_bytes(r.take()?) {
        let id = u16::from_le_bytes(r.take()?);
        let cells = u32::from_le_bytes(r.take()?);
        let expected = cells_of(id).ok_or(ImageError::UnknownState(id))?;
        if cells != expected {
            return Err(ImageError::Mismatch {
                id,
                cells,
                expected,
            });
        }
        // The end of the state's last run: runs come in order, apart.
        let mut end = 0u64;
        for _ in 0..u32::from_le_bytes(r.take()?) {
            let first = r.varint()?;
            let count = r.varint()?;
            if first < end || count == 0 || first.saturating_add(count) > u64::from(cells) {
                return Err(ImageError::Overrun(id));
            }
            let [width] = r.take::<1>()?;
            if !matches!(width, 1 | 2 | 4 | 8) {
                return Err(ImageError::NotAnImage);
            }
            let words = (0..count)
                .map(|_| r.word(usize::from(width)))
                .collect::<Result<Vec<_>, _>>()?;
            runs.push((id, first as u32, words));
            end = first + count;
        }
    }
    if !r.bytes.is_empty() {
        return Err(ImageError::Trailing);
    }
    for (id, first, words) in &runs {
        run(*id, *first, words);
    }
    Ok(())
}

struct Reader<'a> {
    bytes: &'a [u8],
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], ImageError> {
        let (head, rest) = self
            .bytes
            .split_first_chunk::<N>()
            .ok_or(ImageError::Truncated)?;
        self.bytes = rest;
        Ok(*head)
    }

    /// A little-endian word of `width` bytes (at most 8).
    fn word(&mut self, width: usize) -> Result<u64, ImageError> {
        let (head, rest) = self
            .bytes
            .split_at_checked(width)
            .ok_or(ImageError::Truncated)?;
        self.bytes = rest;
        let mut b = [0u8; 8];
        b[..width].copy_from_slice(head);
        Ok(u64::from_le_bytes(b))
    }

    fn varint(&mut self) -> Result<u64, ImageError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let [b] = self.take::<1>()?;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(ImageError::Truncated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{StoreConfig, StoreCore};

    const MS: u64 = 1_000_000;

    fn config() -> SnapshotConfig {
        SnapshotConfig {
            period_ns: 10 * MS,
            bound_ns: 50 * MS,
            lease_ns: 200 * MS,
            margin_ns: 2 * MS,
            retransmit_ns: 5 * MS,
        }
    }

    type Store = StoreCore<FlowBytes, Vec<u8>>;

    fn store() -> Store {
        StoreCore::new(StoreConfig {
            min_lease_ns: 100 * MS,
            max_lease_ns: 60_000 * MS,
            fencing: true,
            ..StoreConfig::default()
        })
    }

    /// Sends what is due at `now` to the store (`lose`: the requests are lost) and hands
    /// its answers back; what was to be installed.
    fn trip(
        s: &mut Snapshots,
        store: &mut Store,
        who: Holder,
        now: u64,
        lose: bool,
    ) -> Vec<Installed> {
        let mut out = Vec::new();
        s.poll_transmit(now, &mut out);
        let mut installed = Vec::new();
        for q in out {
            if lose {
                continue;
            }
            let a = store.handle(now, who, q);
            installed.extend(s.handle_reply(now, a));
        }
        installed
    }

    /// Takes a snapshot at `now` whose image is `image`, as the stage does.
    fn snapshot(s: &mut Snapshots, now: u64, image: &[u8]) {
        assert!(s.snapshot_due(now), "a snapshot is due at {now}");
        s.began(now);
        s.read(image.to_vec());
    }

    const A: Holder = Holder {
        switch: 1 << 8,
        incarnation: 1,
    };
    const B: Holder = Holder {
        switch: 1 << 8,
        incarnation: 2,
    };

    #[test]
    fn snapshots_go_every_period_and_staleness_counts_from_the_last_acknowledged() {
        let mut store = store();
        let key = Snapshots::key_of(1, 0);
        let mut s = Snapshots::new(key, config(), 0);
        assert!(!s.serving());
        assert_eq!(trip(&mut s, &mut store, A, 0, false), [Installed(None)]);
        assert!(s.serving());
        snapshot(&mut s, 0, b"one");
        assert!(!s.snapshot_due(MS), "one at a time");
        trip(&mut s, &mut store, A, MS, false);
        assert_eq!(s.stats.written, 1);
        assert!(!s.snapshot_due(5 * MS), "the next waits for its period");
        // The next is lost on its way twice, and sent again until it is acknowledged.
        snapshot(&mut s, 10 * MS, b"two");
        trip(&mut s, &mut store, A, 10 * MS, true);
        assert_eq!(
            s.staleness(12 * MS),
            12 * MS,
            "the first snapshot began at 0"
        );
        trip(&mut s, &mut store, A, 12 * MS, false);
        assert_eq!(s.stats.retransmits, 0, "not yet");
        trip(&mut s, &mut store, A, 15 * MS, true);
        trip(&mut s, &mut store, A, 25 * MS, false);
        assert_eq!(s.stats.retransmits, 2);
        assert_eq!(s.stats.written, 2);
        assert_eq!(s.staleness(25 * MS), 15 * MS, "the second began at 10 ms");
        assert!(!s.stale(25 * MS));
        assert_eq!(
            store.record(&key).and_then(|r| r.value.clone()),
            Some(b"two".to_vec())
        );
        // The store goes quiet: past the bound, stale.
        snapshot(&mut s, 25 * MS, b"three");
        for t in (25..=70).step_by(5) {
            trip(&mut s, &mut store, A, t * MS, true);
        }
        assert!(s.stale(61 * MS), "51 ms since the second began");
        // Back: the third is acknowledged when next sent (at 100 ms, backing off), and
        // the state is stale still (the third began at 25 ms) until the fourth is.
        trip(&mut s, &mut store, A, 80 * MS, false);
        assert_eq!(s.stats.written, 2);
        trip(&mut s, &mut store, A, 100 * MS, false);
        assert_eq!(s.stats.written, 3);
        assert_eq!(s.staleness(100 * MS), 75 * MS);
        snapshot(&mut s, 100 * MS, b"four");
        trip(&mut s, &mut store, A, 101 * MS, false);
        assert!(!s.stale(101 * MS));
        assert_eq!(s.staleness(101 * MS), MS);
    }

    #[test]
    fn a_restarted_worker_installs_the_last_image_and_fences_its_former_self() {
        let mut store = store();
        let key = Snapshots::key_of(3, 1);
        let mut a = Snapshots::new(key, config(), 0);
        trip(&mut a, &mut store, A, 0, false);
        snapshot(&mut a, 0, b"state at 0");
        trip(&mut a, &mut store, A, 0, false);
        snapshot(&mut a, 10 * MS, b"state at 10");
        // `a` dies with its snapshot on the way; its successor waits for the lease.
        let mut b = Snapshots::new(key, config(), 20 * MS);
        assert!(trip(&mut b, &mut store, B, 20 * MS, false).is_empty());
        assert!(!b.serving(), "a's lease runs");
        assert!(
            trip(&mut b, &mut store, B, 100 * MS, false).is_empty(),
            "not before it ends"
        );
        let got = trip(&mut b, &mut store, B, 200 * MS, false);
        assert_eq!(got, [Installed(Some(b"state at 0".to_vec()))]);
        assert_eq!(b.stats.installed, 1);
        // The write `a` left on the way is fenced.
        let late = Request::Write {
            key,
            epoch: 1,
            seq: 2,
            value: b"state at 10".to_vec(),
            lease_ns: 200 * MS,
            keep_ns: KEEP_FOREVER,
            alias: None,
        };
        assert!(matches!(
            store.handle(201 * MS, A, late),
            Reply::Fenced { .. }
        ));
        snapshot(&mut b, 200 * MS, b"b's");
        trip(&mut b, &mut store, B, 201 * MS, false);
        assert_eq!(
            store.record(&key).and_then(|r| r.value.clone()),
            Some(b"b's".to_vec())
        );
    }

    #[test]
    fn a_lease_lost_is_asked_for_again_and_the_write_goes_on_if_no_one_wrote() {
        let mut store = store();
        let key = Snapshots::key_of(1, 0);
        let mut s = Snapshots::new(key, config(), 0);
        trip(&mut s, &mut store, A, 0, false);
        snapshot(&mut s, 0, b"x");
        trip(&mut s, &mut store, A, 0, false);
        // Everything is lost for longer than the lease: renewals and the next write.
        snapshot(&mut s, 10 * MS, b"y");
        for t in (10..=400).step_by(5) {
            trip(&mut s, &mut store, A, t * MS, true);
        }
        assert!(s.stale(400 * MS));
        assert!(!s.snapshot_due(400 * MS), "no lease: no snapshot");
        // Back: the lease again (the store still has this side's write: nothing to
        // install), then the write, within a retransmission's longest wait.
        let mut t = 405;
        while s.stats.written < 2 && t < 600 {
            assert!(trip(&mut s, &mut store, A, t * MS, false).is_empty());
            t += 5;
        }
        assert!(t <= 490, "written at {t} ms");
        assert_eq!(
            store.record(&key).and_then(|r| r.value.clone()),
            Some(b"y".to_vec())
        );
        assert!(s.stats.acquires >= 2);
        assert!(s.stats.installed == 0, "its own write was never replaced");
        // A write the store took whose answer was lost, then the lease: acknowledged by
        // the grant, not installed over the state that moved on since.
        snapshot(&mut s, t * MS, b"z");
        let mut out = Vec::new();
        s.poll_transmit(t * MS, &mut out);
        for q in out {
            let _ = store.handle(t * MS, A, q);
        }
        let later = t * MS + 500 * MS;
        let mut installed = Vec::new();
        for k in 0..40 {
            installed.extend(trip(&mut s, &mut store, A, later + k * 5 * MS, false));
        }
        assert!(installed.is_empty(), "{installed:?}");
        assert_eq!(s.stats.written, 3);
        assert_eq!(
            store.record(&key).and_then(|r| r.value.clone()),
            Some(b"z".to_vec())
        );
    }

    /// A write fenced while another holder wrote the same number and the same image is
    /// not taken for this side's own: the other's image is installed, and this side's
    /// write is not counted as acknowledged (its staleness is not moved on).
    #[test]
    fn another_holders_write_of_the_same_number_and_image_is_not_taken_for_ours() {
        let mut store = store();
        let key = Snapshots::key_of(1, 0);
        let mut s = Snapshots::new(key, config(), 0);
        trip(&mut s, &mut store, A, 0, false);
        snapshot(&mut s, 0, b"x");
        let mut out = Vec::new();
        s.poll_transmit(0, &mut out);
        assert!(
            matches!(out[..], [Request::Write { seq: 1, .. }]),
            "{out:?}"
        );
        // Lost on the way; the lease passes, and B writes the same number and image.
        let Reply::Granted { epoch, .. } = store.handle(
            200 * MS,
            B,
            Request::Acquire {
                key,
                lease_ns: 100 * MS,
                nonce: 1,
            },
        ) else {
            panic!("B not granted");
        };
        let same = store.handle(
            201 * MS,
            B,
            Request::Write {
                key,
                epoch,
                seq: 1,
                value: b"x".to_vec(),
                lease_ns: 100 * MS,
                keep_ns: KEEP_FOREVER,
                alias: None,
            },
        );
        assert!(matches!(same, Reply::Written { .. }), "{same:?}");
        // A's write, sent again after B's lease, is fenced; A takes the lease again.
        let mut installed = Vec::new();
        for t in (400..600).step_by(5) {
            installed.extend(trip(&mut s, &mut store, A, t * MS, false));
        }
        assert_eq!(installed, [Installed(Some(b"x".to_vec()))]);
        assert_eq!(s.stats.written, 0, "B's write is not A's");
    }

    #[test]
    fn an_image_reads_back_run_by_run_and_a_bad_one_is_refused_whole() {
        let mut w = ImageWriter::default();
        w.state(0, 50);
        let mut words = [0u64; 40];
        (words[20], words[21]) = (5, 6);
        w.encoded(&Chunk::encode(0, &words));
        let mut tail = [0u64; 10];
        tail[1] = 1 << 40;
        w.encoded(&Chunk::encode(40, &tail));
        w.state(2, 3);
        w.encoded(&Chunk::encode(0, &[0, 0, 0]));
        let image = w.finish();
        let cells = |id| match id {
            0 => Some(50),
            2 => Some(3),
            _ => None,
        };
        let mut got = Vec::new();
        read_image(&image, cells, |id, first, words| {
            got.push((id, first, words.to_vec()))
        })
        .unwrap();
        // Blocks of zeros are skipped; a block with a count goes whole.
        assert_eq!(
            got,
            [(0, 16, words[16..32].to_vec()), (0, 40, tail.to_vec())]
        );
        // A state of other cells than here is refused.
        let other = |id| (id == 0).then_some(9);
        assert_eq!(
            read_image(&image, other, |_, _, _| panic!("nothing is installed")),
            Err(ImageError::Mismatch {
                id: 0,
                cells: 50,
                expected: 9
            })
        );
        for cut in 1..image.len() {
            let r = read_image(&image[..cut], cells, |_, _, _| {
                panic!("nothing is installed")
            });
            assert!(r.is_err(), "cut at {cut}");
        }
        assert_eq!(
            read_image(b"nope", cells, |_, _, _| {}),
            Err(ImageError::NotAnImage)
        );
        let mut over = image.clone();
        over[6 + 6] = 200; // the first state's runs
        assert!(read_image(&over, cells, |_, _, _| panic!("nothing is installed")).is_err());
        // Runs out of order, or past the state's end.
        for chunks in [
            [(20, vec![0, 7]), (0, vec![0, 0, 5])],
            [(0, vec![1]), (48, vec![1, 2, 3])],
        ] {
            let mut w = ImageWriter::default();
            w.state(0, 50);
            for (first, words) in chunks {
                w.encoded(&Chunk::encode(first, &words));
            }
            let bad = w.finish();
            assert_eq!(
                read_image(&bad, cells, |_, _, _| panic!("nothing is installed")),
                Err(ImageError::Overrun(0))
            );
        }
    }
}
