//! What a switch asks of the store and what the store answers, as values (the memory
//! store takes them as they are; the Redis store carries them as calls of its functions).
//!
//! An ask for a lease and a renewal carry a nonce that their answer repeats: a holder
//! takes a lease to start when it first sent the ask answered, which it can know only if
//! an answer to an earlier ask (duplicated, or late) is told apart.
//!
//! A flow's state at the store has a sequence number (its writes, in order, from 0: none
//! yet) and a fencing epoch (its lease's grants, in order). Every write names both, so the
//! store can refuse a write that is older than the state it holds or comes from a holder
//! whose lease has passed.
//!
//! A flow may have a second name, an alias, by which a packet that cannot name the flow
//! itself finds it (a NAT's answer, named by its external port, finds the connection it
//! answers): a write names the flow's alias with its state, and [`Request::Resolve`] asks
//! the store which flow an alias names. An alias and its flow share a hash tag
//! ([`FlowBytes::tagged`]), so that a Redis Cluster keeps them in one slot.
//!
//! A write and a renewal also say how long the flow's state lives if nothing more is
//! heard of it (`keep_ns`: the entry's idle time left, and a lease more, since the holder
//! tells the store of the packets that restart that time only when it renews): a flow
//! whose state has timed out is granted as a new one, so that a state the switch let
//! expire does not come back from the store.

/// Who holds a lease: a switch instance (a worker of it, when its workers share the store)
/// and its incarnation. A switch that restarts is a new holder, so that writes its former
/// self left on the way are fenced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Holder {
    pub switch: u32,
    pub incarnation: u32,
}

/// A request about one flow's state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request<K, V> {
    /// The flow's lease for `lease_ns`, with its latest state: a flow new to the store
    /// starts with none; one another switch held comes with that switch's last write
    /// (migration).
    Acquire { key: K, lease_ns: u64, nonce: u64 },
    /// The flow's state as of write `seq` (one past the last acknowledged), under the lease
    /// of `epoch`, living `keep_ns` from now ([`KEEP_FOREVER`]: until replaced); renews
    /// the lease for `lease_ns`. `alias`: the flow's other name, which from now on
    /// resolves to `key` (it is the flow's for as long as the flow's state is: an alias
    /// never moves from one live flow to another).
    Write {
        key: K,
        epoch: u64,
        seq: u64,
        value: V,
        lease_ns: u64,
        keep_ns: u64,
        alias: Option<K>,
    },
    /// The lease of `epoch` again, for `lease_ns`, without a write (flows read, not
    /// written); the state lives `keep_ns` from now, and so does `alias`, the flow's
    /// alias if it has one.
    Renew {
        key: K,
        epoch: u64,
        lease_ns: u64,
        nonce: u64,
        keep_ns: u64,
        alias: Option<K>,
    },
    /// Which flow `alias` names (no lease: a packet so named then asks for the lease of
    /// the flow named).
    Resolve { alias: K, nonce: u64 },
}

/// A `keep_ns` for state that never times out: it lives until written again.
pub const KEEP_FOREVER: u64 = u64::MAX;

impl<K: Copy, V> Request<K, V> {
    pub fn key(&self) -> K {
        match self {
            Request::Acquire { key, .. }
            | Request::Write { key, .. }
            | Request::Renew { key, .. }
            | Request::Resolve { alias: key, .. } => *key,
        }
    }
}

/// The store's answer to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply<K, V> {
    /// The lease is the asker's under `epoch` for `lease_ns` from when the store took the
    /// request; the flow's state is `value` as of write `seq` (`None`: never written, or
    /// timed out), which was applied under the lease of `written_epoch` (0: none), so
    /// the holder of that lease knows the write for its own.
    Granted {
        key: K,
        epoch: u64,
        seq: u64,
        value: Option<V>,
        lease_ns: u64,
        nonce: u64,
        written_epoch: u64,
    },
    /// Another holder's lease runs for `remaining_ns` more.
    Held {
        key: K,
        remaining_ns: u64,
        nonce: u64,
    },
    /// Write `seq` is the store's (now, or before: a write sent again is answered again),
    /// and the lease of `epoch` runs for `lease_ns` from when the store took it.
    Written {
        key: K,
        epoch: u64,
        seq: u64,
        lease_ns: u64,
    },
    Renewed {
        key: K,
        epoch: u64,
        lease_ns: u64,
        nonce: u64,
    },
    /// Refused: the lease of `epoch` (the request's) is not the asker's any more: it passed,
    /// or another holder took the flow. Nothing of the request was applied.
    Fenced { key: K, epoch: u64 },
    /// `alias` names the flow `flow` (`None`: no flow was written with it).
    Resolved {
        alias: K,
        flow: Option<K>,
        nonce: u64,
    },
}

impl<K: Copy, V> Reply<K, V> {
    pub fn key(&self) -> K {
        match self {
            Reply::Granted { key, .. }
            | Reply::Held { key, .. }
            | Reply::Written { key, .. }
            | Reply::Renewed { key, .. }
            | Reply::Fenced { key, .. }
            | Reply::Resolved { alias: key, .. } => *key,
        }
    }
}

/// A replicated flow's key as the switch and the store name it: its bytes (at most
/// [`FlowBytes::MAX`]), compared and hashed as bytes, and its hash tag: the leading bytes
/// that place it in a Redis Cluster (all of them, unless made [`FlowBytes::tagged`]).
/// Programs make it from their table's key (`Program::replicated_key`).
///
/// Its hash is taken once, when it is made: the maps of a worker (the replica's flows,
/// the stage's flows of a burst) look a key up several times a packet, and hashing its
/// 47 bytes each time cost more than the rest of a lookup. The hash is keyed with a seed
/// drawn once a process, so that keys sent from outside cannot be made to collide.
#[derive(Clone, Copy)]
pub struct FlowBytes {
    /// Of `len` and `bytes`; first, so that unequal keys differ at the first word.
    hash: u64,
    len: u8,
    /// The hash tag's length (0: the whole key).
    tag: u8,
    /// The key's `len` bytes, then zeros (so that keys hash and compare as whole words).
    bytes: [u8; FlowBytes::MAX],
}

/// Compared a word at a time, inline: maps compare keys at every hit, and a call to
/// compare 47 bytes cost about as much as the rest of a lookup.
impl PartialEq for FlowBytes {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (self.words(), other.words());
        self.hash == other.hash
            && self.len == other.len
            && self.tag == other.tag
            && ((a[0] ^ b[0]) | (a[1] ^ b[1]) | (a[2] ^ b[2]))
                | ((a[3] ^ b[3]) | (a[4] ^ b[4]) | (a[5] ^ b[5]))
                == 0
    }
}

impl Eq for FlowBytes {}

impl std::hash::Hash for FlowBytes {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write_u64(self.hash);
    }
}

/// The eight bytes of `bytes` from `at` (39 at most), as a word.
#[inline(always)]
fn word(bytes: &[u8; FlowBytes::MAX], at: usize) -> u64 {
    (bytes.get(at..).and_then(<[u8]>::first_chunk::<8>)).map_or(0, |w| u64::from_le_bytes(*w))
}

/// Ordered by length, tag, then bytes (not by hash).
impl Ord for FlowBytes {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.len.cmp(&other.len))
            .then(self.tag.cmp(&other.tag))
            .then_with(|| self.bytes.cmp(&other.bytes))
    }
}

impl PartialOrd for FlowBytes {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// The keys' hasher, seeded once a process.
fn key_hasher() -> &'static foldhash::quality::RandomState {
    static HASHER: std::sync::OnceLock<foldhash::quality::RandomState> = std::sync::OnceLock::new();
    HASHER.get_or_init(foldhash::quality::RandomState::default)
}

impl FlowBytes {
    pub const MAX: usize = 47;

    /// `None` if `bytes` is longer than [`FlowBytes::MAX`].
    pub fn new(bytes: &[u8]) -> Option<FlowBytes> {
        use std::hash::{BuildHasher, Hasher};
        let mut key = FlowBytes {
            hash: 0,
            len: u8::try_from(bytes.len()).ok()?,
            tag: 0,
            bytes: [0; Self::MAX],
        };
        key.bytes.get_mut(..bytes.len())?.copy_from_slice(bytes);
        // Three folds of two words each (a byte string's hash took twice the
        // instructions).
        let mut hasher = key_hasher().build_hasher();
        let w = key.words();
        hasher.write_u128(u128::from(w[0]) | u128::from(w[1]) << 64);
        hasher.write_u128(u128::from(w[2]) | u128::from(w[3]) << 64);
        hasher.write_u128(u128::from(w[4]) | u128::from(w[5]) << 64);
        hasher.write_u8(key.len);
        key.hash = hasher.finish();
        Some(key)
    }

    /// A key whose first `tag` bytes are its hash tag: keys that share them share a
    /// Redis Cluster slot (a flow and its alias). `None` if `bytes` is too long or `tag`
    /// is 0 or longer than `bytes`.
    pub fn tagged(bytes: &[u8], tag: usize) -> Option<FlowBytes> {
        let mut key = FlowBytes::new(bytes)?;
        if tag == 0 || tag > bytes.len() {
            return None;
        }
        key.tag = tag as u8;
        Some(key)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// The key's bytes as six words, zeros after them (the last two overlap).
    #[inline(always)]
    fn words(&self) -> [u64; 6] {
        let b = &self.bytes;
        [
            word(b, 0),
            word(b, 8),
            word(b, 16),
            word(b, 24),
            word(b, 32),
            word(b, 39),
        ]
    }

    /// The key's hash (seeded once a process): what maps of keys are placed by.
    pub fn hash_value(&self) -> u64 {
        self.hash
    }

    /// The hash tag: the key's leading bytes that place it.
    pub fn tag(&self) -> &[u8] {
        match self.tag {
            0 => self.as_bytes(),
            tag => &self.bytes[..usize::from(tag)],
        }
    }

    /// The key as one byte string, its tag's length first (how a store keeps a key as a
    /// value: an alias's flow); [`FlowBytes::decode`] reads it back.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.push(self.tag);
        out.extend_from_slice(self.as_bytes());
    }

    pub fn decode(bytes: &[u8]) -> Option<FlowBytes> {
        let (&tag, key) = bytes.split_first()?;
        match tag {
            0 => FlowBytes::new(key),
            tag => FlowBytes::tagged(key, usize::from(tag)),
        }
    }
}

impl std::fmt::Debug for FlowBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for b in self.as_bytes() {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::FlowBytes;

    #[test]
    fn keys_made_apart_from_the_same_bytes_are_one_key_and_order_by_their_bytes() {
        let a = FlowBytes::new(b"flow a").unwrap();
        let again = FlowBytes::decode(&{
            let mut out = Vec::new();
            a.encode(&mut out);
            out
        })
        .unwrap();
        let mut map = crate::FlowMap::default();
        map.insert(a, 1);
        assert_eq!(map.get(&again), Some(&1));
        assert_eq!(again, a);
        // A tag makes another key. Keys order by length, tag, then bytes.
        let tagged = FlowBytes::tagged(b"flow a", 4).unwrap();
        assert_ne!(tagged, a);
        assert_eq!(map.get(&tagged), None);
        let (b, longer) = (
            FlowBytes::new(b"flow b").unwrap(),
            FlowBytes::new(b"flow aa").unwrap(),
        );
        let mut keys = vec![longer, b, tagged, a];
        keys.sort();
        assert_eq!(keys, vec![a, b, tagged, longer]);
    }

    #[test]
    fn keys_compared_as_words_differ_by_length_and_by_every_byte() {
        // The bytes after a key are zeros: a key and the same with a zero byte more are
        // two keys, as are keys of 47 bytes that differ in any one byte (the last two
        // words overlap).
        let short = FlowBytes::new(b"ab").unwrap();
        let padded = FlowBytes::new(b"ab\0").unwrap();
        assert_ne!(short, padded);
        let full = [7u8; FlowBytes::MAX];
        let key = FlowBytes::new(&full).unwrap();
        assert_eq!(key, FlowBytes::new(&full).unwrap());
        for at in 0..FlowBytes::MAX {
            let mut other = full;
            other[at] ^= 0x80;
            let other = FlowBytes::new(&other).unwrap();
            assert_ne!(key, other, "byte {at}");
            assert_ne!(key.hash_value(), other.hash_value(), "byte {at}");
        }
        assert_ne!(key, FlowBytes::new(&full[..46]).unwrap());
        assert!(FlowBytes::new(&[0; FlowBytes::MAX + 1]).is_none());
    }
}
