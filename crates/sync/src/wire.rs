//! The sync messages, as docs/SYNC.md lays them out: a 40-byte header, then 24 bytes per
//! entry, every field big-endian, then with a configured [`Key`] a 32-byte MAC (keyed
//! BLAKE3 of everything before it). [`Message::decode`] checks the MAC, every length and
//! every field before it returns anything, so a malformed or spoofed message touches no
//! state; its errors are split by cause, for counting.

use crate::{Location, Update};

pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 40;
pub const ENTRY_LEN: usize = 24;
pub const MAC_LEN: usize = 32;
/// Entries that fit one UDP datagram on a 1,500-byte MTU (1,472 bytes of payload), with a
/// MAC.
pub const MAX_ENTRIES: usize = (1472 - HEADER_LEN - MAC_LEN) / ENTRY_LEN;
/// Entries that fit the largest UDP datagram (65,507 bytes of payload), with a MAC: what
/// a message may carry on a path that takes it whole (loopback's 64 KiB MTU).
pub const MAX_DATAGRAM_ENTRIES: usize = (65_507 - HEADER_LEN - MAC_LEN) / ENTRY_LEN;

/// What a message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Values the read handler sent: each was the data plane's when it was sent.
    Updates = 1,
    /// Values of the anti-entropy refresh: the same, for every location in turn.
    Refresh = 2,
    /// No entries: the stream is alive, and its threshold is the header's.
    Heartbeat = 3,
    /// From the collector to the switch, no entries: `seq` is the stream's last message
    /// the collector has seen, `t_max` the messages of the stream it found missing so far.
    Report = 4,
    /// From the collector to the switch, a part of a write: `seq` is the write's id,
    /// `t_max` the part's index (high 32 bits) and the write's parts (low 32 bits); each
    /// entry's `threshold` is its mode (`write::Mode`).
    Write = 5,
    /// From the switch to the collector: `seq` is the write's id, `t_max` the parts it holds
    /// of it, and the entries a bitmap of them (`index` the word, `value` its bits).
    WriteAck = 6,
}

impl Kind {
    fn from_byte(b: u8) -> Option<Kind> {
        match b {
            1 => Some(Kind::Updates),
            2 => Some(Kind::Refresh),
            3 => Some(Kind::Heartbeat),
            4 => Some(Kind::Report),
            5 => Some(Kind::Write),
            6 => Some(Kind::WriteAck),
            _ => None,
        }
    }
}

/// The flag of a message that more of its batch follow: the messages a worker sends at
/// one instant are applied together, so that the collector's copy is always the data
/// plane's as of one instant.
pub const FLAG_MORE: u8 = 0x01;
/// The flag of a message that ends with a MAC.
pub const FLAG_MAC: u8 = 0x02;

/// The key switches and collector share: every message carries a MAC made with it, and
/// one without, or with a wrong one, is refused.
#[derive(Clone)]
pub struct Key([u8; 32]);

impl Key {
    pub fn new(bytes: [u8; 32]) -> Key {
        Key(bytes)
    }

    /// A key from its 64 hexadecimal digits (as a configuration gives it).
    pub fn from_hex(text: &str) -> Result<Key, String> {
        let text = text.trim();
        if text.len() != 64 || !text.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(format!(
                "a key is 64 hexadecimal digits (32 bytes), not {} characters",
                text.len()
            ));
        }
        let mut bytes = [0; 32];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|e| e.to_string())?;
        }
        Ok(Key(bytes))
    }

    fn mac(&self, bytes: &[u8]) -> blake3::Hash {
        blake3::keyed_hash(&self.0, bytes)
    }
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Key(..)")
    }
}

/// One message of one stream (a worker's) of one switch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub kind: Kind,
    pub switch: u32,
    /// Changes when the switch starts again: its streams start over.
    pub epoch: u32,
    pub stream: u16,
    /// 1 for the stream's first message, one more for each after it.
    pub seq: u64,
    /// The sender's clock when it sent the message.
    pub sent_ns: u64,
    /// The largest threshold in force since the stream's message before this one (since
    /// the stream began, for its first): every location not in this message or a later one
    /// is within `divergence_bound(t_max)` of what the collector holds.
    pub t_max: u64,
    /// More messages of the same batch follow this one (`FLAG_MORE`).
    pub more: bool,
    pub entries: Vec<Update>,
}

/// Why a message was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeError {
    /// Shorter than its header, or than the entries its header counts.
    Truncated {
        need: usize,
        have: usize,
    },
    /// Longer than the entries its header counts.
    Trailing {
        expected: usize,
        have: usize,
    },
    Version(u8),
    Kind(u8),
    /// Flags this version does not know (`FLAG_MORE` and `FLAG_MAC` are the ones).
    Flags(u8),
    /// No MAC where the collector has a key, or one where it has none.
    MissingMac,
    UnexpectedMac,
    /// A MAC that the key did not make: spoofed, or damaged on the way.
    BadMac,
    /// A reserved byte not zero.
    Reserved,
    /// More entries than fit one message, or entries in a heartbeat.
    Count(u16),
}

impl DecodeError {
    /// The reason's name, for counters.
    pub fn reason(&self) -> &'static str {
        match self {
            DecodeError::Truncated { .. } => "truncated",
            DecodeError::Trailing { .. } => "trailing_bytes",
            DecodeError::Version(_) => "bad_version",
            DecodeError::Kind(_) => "unknown_kind",
            DecodeError::Flags(_) => "unknown_flags",
            DecodeError::Reserved => "reserved_not_zero",
            DecodeError::Count(_) => "bad_count",
            DecodeError::MissingMac => "missing_mac",
            DecodeError::UnexpectedMac => "unexpected_mac",
            DecodeError::BadMac => "bad_mac",
        }
    }
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DecodeError::Truncated { need, have } => {
                write!(f, "truncated: {have} bytes where {need} are needed")
            }
            DecodeError::Trailing { expected, have } => {
                write!(f, "{have} bytes where the entries end at {expected}")
            }
            DecodeError::Version(v) => write!(f, "version {v}, where {VERSION} is known"),
            DecodeError::Kind(k) => write!(f, "unknown message kind {k}"),
            DecodeError::Flags(x) => write!(f, "unknown flags {x:#04x}"),
            DecodeError::Reserved => write!(f, "a reserved byte is not zero"),
            DecodeError::Count(n) => write!(f, "{n} entries, which this kind cannot carry"),
            DecodeError::MissingMac => write!(f, "no MAC, and a key is configured"),
            DecodeError::UnexpectedMac => write!(f, "a MAC, and no key is configured"),
            DecodeError::BadMac => write!(f, "a MAC that the configured key did not make"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// A reader that cannot read past its buffer: each read is of a length checked before.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0; N];
        // The caller checked the length of everything it reads.
        if let Some(b) = self.bytes.get(self.at..self.at + N) {
            out.copy_from_slice(b);
        }
        self.at += N;
        out
    }
    fn u8(&mut self) -> u8 {
        self.take::<1>()[0]
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes(self.take())
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes(self.take())
    }
    fn u64(&mut self) -> u64 {
        u64::from_be_bytes(self.take())
    }
}

impl Message {
    /// Appends the message's bytes to `out`, with no MAC.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.encode_with(None, out);
    }

    /// Appends the message's bytes to `out`, ending with a MAC made with `key` if given.
    pub fn encode_with(&self, key: Option<&Key>, out: &mut Vec<u8>) {
        let start = out.len();
        out.reserve(HEADER_LEN + ENTRY_LEN * self.entries.len() + MAC_LEN);
        let mut flags = if self.more { FLAG_MORE } else { 0 };
        if key.is_some() {
            flags |= FLAG_MAC;
        }
        out.extend_from_slice(&[VERSION, self.kind as u8, flags, 0]);
        out.extend_from_slice(&self.switch.to_be_bytes());
        out.extend_from_slice(&self.epoch.to_be_bytes());
        out.extend_from_slice(&self.stream.to_be_bytes());
        out.extend_from_slice(&(self.entries.len() as u16).to_be_bytes());
        out.extend_from_slice(&self.seq.to_be_bytes());
        out.extend_from_slice(&self.sent_ns.to_be_bytes());
        out.extend_from_slice(&self.t_max.to_be_bytes());
        for e in &self.entries {
            out.extend_from_slice(&e.location.state.to_be_bytes());
            out.extend_from_slice(&[0, 0]);
            out.extend_from_slice(&e.location.index.to_be_bytes());
            out.extend_from_slice(&e.value.to_be_bytes());
            out.extend_from_slice(&e.threshold.to_be_bytes());
        }
        if let Some(key) = key {
            let mac = key.mac(&out[start..]);
            out.extend_from_slice(mac.as_bytes());
        }
    }

    /// Reads one message with no MAC, all of `bytes`, or says why not.
    pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
        Message::decode_with(None, bytes)
    }

    /// Reads one message, all of `bytes`, whose MAC `key` must have made (and which must
    /// have none where `key` is `None`), or says why not.
    pub fn decode_with(key: Option<&Key>, bytes: &[u8]) -> Result<Message, DecodeError> {
        let bytes = match (key, bytes.get(2).map(|f| f & FLAG_MAC != 0)) {
            (Some(key), Some(true)) => {
                let Some(body_len) = bytes.len().checked_sub(MAC_LEN) else {
                    return Err(DecodeError::Truncated {
                        need: HEADER_LEN + MAC_LEN,
                        have: bytes.len(),
                    });
                };
                let (body, mac) = bytes.split_at(body_len);
                let mut given = [0; MAC_LEN];
                given.copy_from_slice(mac);
                // blake3::Hash compares in constant time.
                if key.mac(body) != blake3::Hash::from_bytes(given) {
                    return Err(DecodeError::BadMac);
                }
                body
            }
            (Some(_), Some(false)) => return Err(DecodeError::MissingMac),
            (None, Some(true)) => return Err(DecodeError::UnexpectedMac),
            _ => bytes,
        };
        let have = bytes.len();
        if have < HEADER_LEN {
            return Err(DecodeError::Truncated {
                need: HEADER_LEN,
                have,
            });
        }
        let mut r = Reader { bytes, at: 0 };
        let version = r.u8();
        if version != VERSION {
            return Err(DecodeError::Version(version));
        }
        let kind_byte = r.u8();
        let kind = Kind::from_byte(kind_byte).ok_or(DecodeError::Kind(kind_byte))?;
        let flags = r.u8();
        if flags & !(FLAG_MORE | FLAG_MAC) != 0 {
            return Err(DecodeError::Flags(flags));
        }
        if r.u8() != 0 {
            return Err(DecodeError::Reserved);
        }
        let (switch, epoch, stream, count) = (r.u32(), r.u32(), r.u16(), r.u16());
        let (seq, sent_ns, t_max) = (r.u64(), r.u64(), r.u64());
        let n = usize::from(count);
        let entries_allowed = !matches!(kind, Kind::Heartbeat | Kind::Report);
        if n > MAX_DATAGRAM_ENTRIES || (!entries_allowed && n > 0) {
            return Err(DecodeError::Count(count));
        }
        let expected = HEADER_LEN + n * ENTRY_LEN;
        if have < expected {
            return Err(DecodeError::Truncated {
                need: expected,
                have,
            });
        }
        if have > expected {
            return Err(DecodeError::Trailing { expected, have });
        }
        let mut entries = Vec::with_capacity(n);
        for _ in 0..n {
            let state = r.u16();
            if r.u16() != 0 {
                return Err(DecodeError::Reserved);
            }
            let index = r.u32();
            let (value, threshold) = (r.u64(), r.u64());
            entries.push(Update {
                location: Location { state, index },
                value,
                threshold,
            });
        }
        Ok(Message {
            kind,
            switch,
            epoch,
            stream,
            seq,
            sent_ns,
            t_max,
            more: flags & FLAG_MORE != 0,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn message(entries: usize) -> Message {
        Message {
            kind: Kind::Updates,
            switch: 7,
            epoch: 3,
            stream: 1,
            seq: u64::MAX,
            sent_ns: 123,
            t_max: 9,
            more: true,
            entries: (0..entries as u32)
                .map(|i| Update {
                    location: Location {
                        state: u16::MAX,
                        index: u32::MAX - i,
                    },
                    value: u64::MAX - u64::from(i),
                    threshold: 4,
                })
                .collect(),
        }
    }

    #[test]
    fn the_largest_message_round_trips_and_fits_a_datagram() {
        let m = message(MAX_ENTRIES);
        let mut bytes = Vec::new();
        m.encode(&mut bytes);
        assert!(bytes.len() <= 1472);
        assert_eq!(Message::decode(&bytes), Ok(m));
    }

    /// The most entries a message may carry, with a MAC, fit one UDP datagram, and come
    /// back whole; one more is refused.
    #[test]
    fn the_largest_message_fits_a_datagram() {
        let key = Key::new([3; 32]);
        let mut bytes = Vec::new();
        message(MAX_DATAGRAM_ENTRIES).encode_with(Some(&key), &mut bytes);
        assert!(bytes.len() <= 65_507, "{}", bytes.len());
        let back = Message::decode_with(Some(&key), &bytes).unwrap();
        assert_eq!(back.entries.len(), MAX_DATAGRAM_ENTRIES);
        let mut over = Vec::new();
        message(MAX_DATAGRAM_ENTRIES + 1).encode(&mut over);
        assert_eq!(
            Message::decode(&over).map_err(|e| e.reason()),
            Err("bad_count")
        );
    }

    /// Each field's fault is refused with its own reason, and every cut is refused.
    #[test]
    fn malformed_messages_are_refused_by_reason() {
        let mut good = Vec::new();
        message(2).encode(&mut good);
        let with = |at: usize, b: u8| {
            let mut bad = good.clone();
            bad[at] = b;
            Message::decode(&bad).map_err(|e| e.reason())
        };
        assert_eq!(with(0, 2), Err("bad_version"));
        assert_eq!(with(1, 9), Err("unknown_kind"));
        assert_eq!(with(2, 4), Err("unknown_flags"));
        assert_eq!(with(3, 1), Err("reserved_not_zero"));
        assert_eq!(with(HEADER_LEN + 2, 1), Err("reserved_not_zero"));
        assert_eq!(with(15, 3), Err("truncated"));
        assert_eq!(with(15, 1), Err("trailing_bytes"));
        assert_eq!(
            with(14, 1),
            Err("truncated"),
            "258 entries may be, but are not there"
        );
        assert_eq!(
            with(14, 0xff),
            Err("bad_count"),
            "more than MAX_DATAGRAM_ENTRIES"
        );
        assert_eq!(with(1, Kind::Heartbeat as u8), Err("bad_count"));
        for cut in 0..good.len() {
            assert!(Message::decode(&good[..cut]).is_err(), "cut at {cut}");
        }
    }

    /// With a key, a message round-trips; one without a MAC, with another key's, or with
    /// any byte changed is refused, and a keyless collector refuses a MAC.
    #[test]
    fn macs_keep_spoofed_and_damaged_messages_out() {
        let key = Key::from_hex(&"ab".repeat(32)).unwrap();
        let other = Key::new([7; 32]);
        let m = message(MAX_ENTRIES);
        let mut signed = Vec::new();
        m.encode_with(Some(&key), &mut signed);
        assert!(
            signed.len() <= 1472,
            "the largest message with its MAC fits a datagram"
        );
        assert_eq!(Message::decode_with(Some(&key), &signed), Ok(m.clone()));
        let reason = |k: Option<&Key>, b: &[u8]| Message::decode_with(k, b).map_err(|e| e.reason());
        assert_eq!(reason(Some(&other), &signed), Err("bad_mac"));
        assert_eq!(reason(None, &signed), Err("unexpected_mac"));
        let mut plain = Vec::new();
        m.encode(&mut plain);
        assert_eq!(reason(Some(&key), &plain), Err("missing_mac"));
        for at in (0..signed.len()).step_by(7) {
            let mut damaged = signed.clone();
            damaged[at] ^= 0x10;
            assert!(
                Message::decode_with(Some(&key), &damaged).is_err(),
                "byte {at}"
            );
        }
        for cut in 0..signed.len() {
            assert!(
                Message::decode_with(Some(&key), &signed[..cut]).is_err(),
                "cut {cut}"
            );
        }
        assert!(Key::from_hex("abc").is_err());
        assert!(Key::from_hex(&"zz".repeat(32)).is_err());
    }

    proptest! {
        /// Any bytes: decoded or refused, never a panic; what decodes encodes back to them.
        #[test]
        fn any_bytes_decode_or_are_refused(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(m) = Message::decode(&bytes) {
                let mut again = Vec::new();
                m.encode(&mut again);
                prop_assert_eq!(again, bytes);
            }
        }
    }
}
