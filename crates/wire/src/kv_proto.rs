//! The key-value request protocol of the `kv` workload and the `kv` program (documented in
//! docs/kv-protocol.md).
//!
//! A UDP payload, all integers big-endian:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 2 | magic `0x5350` ("SP") |
//! | 2 | 1 | version, 1 |
//! | 3 | 1 | op: 1 GET, 2 PUT, 3 GET_REPLY (hit), 4 PUT_ACK, 5 GET_MISS |
//! | 4 | 4 | request id |
//! | 8 | 8 | key |
//! | 16 | 2 | value length |
//! | 18 | n | value (PUT, GET_REPLY) |
//!
//! Requests go to UDP port 9000 of the server.

pub const PORT: u16 = 9000;
pub const MAGIC: u16 = 0x5350;
pub const VERSION: u8 = 1;
pub const HEADER_LEN: usize = 18;
/// Longest value a message may carry.
pub const MAX_VALUE_LEN: usize = 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    Get = 1,
    Put = 2,
    GetReply = 3,
    PutAck = 4,
    GetMiss = 5,
}

impl Op {
    pub fn from_u8(v: u8) -> Option<Op> {
        Some(match v {
            1 => Op::Get,
            2 => Op::Put,
            3 => Op::GetReply,
            4 => Op::PutAck,
            5 => Op::GetMiss,
            _ => return None,
        })
    }
}

/// A parsed message, borrowing its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message<'a> {
    pub op: Op,
    pub request_id: u32,
    pub key: u64,
    pub value: &'a [u8],
}

/// Why a payload is not a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvError {
    Truncated,
    BadMagic,
    BadVersion,
    BadOp,
    ValueTooLong,
}

impl<'a> Message<'a> {
    pub fn parse(b: &'a [u8]) -> Result<Self, KvError> {
        if b.len() < HEADER_LEN {
            return Err(KvError::Truncated);
        }
        if u16::from_be_bytes([b[0], b[1]]) != MAGIC {
            return Err(KvError::BadMagic);
        }
        if b[2] != VERSION {
            return Err(KvError::BadVersion);
        }
        let op = Op::from_u8(b[3]).ok_or(KvError::BadOp)?;
        let len = usize::from(u16::from_be_bytes([b[16], b[17]]));
        if len > MAX_VALUE_LEN {
            return Err(KvError::ValueTooLong);
        }
        let value = b
            .get(HEADER_LEN..HEADER_LEN + len)
            .ok_or(KvError::Truncated)?;
        let mut key = [0u8; 8];
        key.copy_from_slice(&b[8..16]);
        Ok(Message {
            op,
            request_id: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            key: u64::from_be_bytes(key),
            value,
        })
    }

    pub fn len(&self) -> usize {
        HEADER_LEN + self.value.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes the message into `out` (cleared first).
    pub fn emit(&self, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&MAGIC.to_be_bytes());
        out.push(VERSION);
        out.push(self.op as u8);
        out.extend_from_slice(&self.request_id.to_be_bytes());
        out.extend_from_slice(&self.key.to_be_bytes());
        out.extend_from_slice(&(self.value.len() as u16).to_be_bytes());
        out.extend_from_slice(self.value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_truncation() {
        let m = Message {
            op: Op::Put,
            request_id: 7,
            key: 0xdead_beef,
            value: b"sixteen bytes!!!",
        };
        let mut buf = Vec::new();
        m.emit(&mut buf);
        assert_eq!(Message::parse(&buf), Ok(m));
        for cut in 0..buf.len() {
            assert_eq!(Message::parse(&buf[..cut]), Err(KvError::Truncated));
        }
        buf[3] = 9;
        assert_eq!(Message::parse(&buf), Err(KvError::BadOp));
    }
}
