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
    /// the lease for `lease_ns`.
    Write {
        key: K,
        epoch: u64,
        seq: u64,
        value: V,
        lease_ns: u64,
        keep_ns: u64,
    },
    /// The lease of `epoch` again, for `lease_ns`, without a write (flows read, not
    /// written); the state lives `keep_ns` from now.
    Renew {
        key: K,
        epoch: u64,
        lease_ns: u64,
        nonce: u64,
        keep_ns: u64,
    },
}

/// A `keep_ns` for state that never times out: it lives until written again.
pub const KEEP_FOREVER: u64 = u64::MAX;

impl<K: Copy, V> Request<K, V> {
    pub fn key(&self) -> K {
        match self {
            Request::Acquire { key, .. }
            | Request::Write { key, .. }
            | Request::Renew { key, .. } => *key,
        }
    }
}

/// The store's answer to one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reply<K, V> {
    /// The lease is the asker's under `epoch` for `lease_ns` from when the store took the
    /// request; the flow's state is `value` as of write `seq` (`None`: never written, or
    /// timed out).
    Granted {
        key: K,
        epoch: u64,
        seq: u64,
        value: Option<V>,
        lease_ns: u64,
        nonce: u64,
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
}

impl<K: Copy, V> Reply<K, V> {
    pub fn key(&self) -> K {
        match self {
            Reply::Granted { key, .. }
            | Reply::Held { key, .. }
            | Reply::Written { key, .. }
            | Reply::Renewed { key, .. }
            | Reply::Fenced { key, .. } => *key,
        }
    }
}

/// A replicated flow's key as the switch and the store name it: its bytes (at most
/// [`FlowBytes::MAX`]), compared and hashed as bytes. Programs make it from their table's
/// key (`Program::replicated_key`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FlowBytes {
    len: u8,
    bytes: [u8; FlowBytes::MAX],
}

impl FlowBytes {
    pub const MAX: usize = 47;

    /// `None` if `bytes` is longer than [`FlowBytes::MAX`].
    pub fn new(bytes: &[u8]) -> Option<FlowBytes> {
        let mut key = FlowBytes {
            len: u8::try_from(bytes.len()).ok()?,
            bytes: [0; Self::MAX],
        };
        key.bytes.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(key)
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
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
