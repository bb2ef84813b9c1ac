//! Sizes and rates as users write them, in flags and in config files: numbers with k, M
//! or G (`28M`), or `auto`; and the addresses datagrams are sent to. Each type checks its
//! range and says what it expects; none of them does any I/O.

use stateplane_flows::ipfix::MESSAGE_LEN;
use stateplane_io::live::RingConfig;

/// The largest IPFIX message over UDP: what one packet on the route to the collector
/// carries (`auto`), or a number of bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "NumberOrText")]
pub enum MessageSize {
    Auto,
    Bytes(usize),
}

impl MessageSize {
    /// Where the route's MTU cannot be read: what fits in a 1,500-byte Ethernet frame with
    /// room for a tunnel's headers, as most exporters send.
    pub const FALLBACK: usize = 1400;
}

impl std::str::FromStr for MessageSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(MessageSize::Auto);
        }
        let (lo, hi) = (MESSAGE_LEN.start(), MESSAGE_LEN.end());
        match s.parse::<usize>() {
            Ok(n) if MESSAGE_LEN.contains(&n) => Ok(MessageSize::Bytes(n)),
            _ => Err(format!(
                "'{s}' is neither auto nor a number of bytes from {lo} to {hi}"
            )),
        }
    }
}

impl std::fmt::Display for MessageSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MessageSize::Auto => write!(f, "auto"),
            MessageSize::Bytes(n) => write!(f, "{n}"),
        }
    }
}

/// A pace in bytes per second: a number, with k, M or G for thousands, millions or
/// billions (`28M`); 0 for none.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "NumberOrText")]
pub struct ByteRate(pub u64);

/// A whole number with an optional k, M or G for thousands, millions or billions (`28M`);
/// none if it is not one or does not fit.
fn scaled_number(s: &str) -> Option<u64> {
    let (digits, scale) = match s.as_bytes().last() {
        Some(b'k') => (&s[..s.len() - 1], 1_000),
        Some(b'M') => (&s[..s.len() - 1], 1_000_000),
        Some(b'G') => (&s[..s.len() - 1], 1_000_000_000),
        _ => (s, 1),
    };
    digits.parse::<u64>().ok()?.checked_mul(scale)
}

impl std::str::FromStr for ByteRate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        scaled_number(s).map(ByteRate).ok_or_else(|| {
            format!("'{s}' is not bytes per second: a number, with k, M or G (e.g. 28M), or 0")
        })
    }
}

impl std::fmt::Display for ByteRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = self.0;
        match n {
            0 => write!(f, "0"),
            _ if n.is_multiple_of(1_000_000_000) => write!(f, "{}G", n / 1_000_000_000),
            _ if n.is_multiple_of(1_000_000) => write!(f, "{}M", n / 1_000_000),
            _ if n.is_multiple_of(1_000) => write!(f, "{}k", n / 1_000),
            _ => write!(f, "{n}"),
        }
    }
}

/// How IPFIX over UDP is spaced: `auto`, as fast as a collector on this host reads (by its
/// socket's queue, which the kernel shows) and at [`Pace::REMOTE`] to any other; or a
/// fixed number of bytes per second (0: unpaced).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "NumberOrText")]
pub enum Pace {
    Auto,
    Rate(ByteRate),
}

impl Pace {
    /// `auto`'s rate to a collector on another host, whose queue cannot be seen: what
    /// 20,000 messages of 1,400 bytes a second were, which nfcapd at its default receive
    /// buffer keeps up with while the exporter shares its two cores.
    pub const REMOTE: ByteRate = ByteRate(28_000_000);
}

impl std::str::FromStr for Pace {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "auto" {
            return Ok(Pace::Auto);
        }
        s.parse().map(Pace::Rate).map_err(|_| {
            format!("'{s}' is neither auto nor bytes per second: a number, with k, M or G (e.g. 28M), or 0")
        })
    }
}

impl std::fmt::Display for Pace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pace::Auto => write!(f, "auto"),
            Pace::Rate(rate) => write!(f, "{rate}"),
        }
    }
}

/// A config value given as a number or as text (`mtu = 1400` or `mtu = "auto"`).
#[derive(serde::Deserialize)]
#[serde(untagged)]
enum NumberOrText {
    Number(u64),
    Text(String),
}

impl NumberOrText {
    /// The value parsed as its text would be from a flag (a number as its digits).
    fn parse<T: std::str::FromStr<Err = String>>(self) -> Result<T, String> {
        match self {
            NumberOrText::Number(n) => n.to_string().parse(),
            NumberOrText::Text(t) => t.parse(),
        }
    }
}

/// Config values taken as a number or as text, checked as the flags are.
macro_rules! from_number_or_text {
    ($($t:ty),*) => {$(
        impl TryFrom<NumberOrText> for $t {
            type Error = String;
            fn try_from(v: NumberOrText) -> Result<Self, String> {
                v.parse()
            }
        }
    )*};
}

from_number_or_text!(
    MessageSize,
    ByteRate,
    Pace,
    CaptureBuffer,
    MemoryBudget,
    SpoolSize
);

/// The memory a run may take, in bytes: a number with k, M or G (or T), at least 16M.
/// Tables, sketches and rings sized by the configuration are checked against it before
/// anything is allocated (`stateplane_mem::budget`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "NumberOrText")]
pub struct MemoryBudget(pub u64);

impl MemoryBudget {
    /// Three quarters of this machine's memory.
    pub fn machine_default() -> MemoryBudget {
        MemoryBudget(stateplane_mem::budget::default_limit())
    }
}

impl std::str::FromStr for MemoryBudget {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        bytes_at_least(s, 16_000_000, "16M", "8G").map(MemoryBudget)
    }
}

/// A number of bytes with k, M, G or T, at least `min` (written `min_text`; `example` in
/// the error).
fn bytes_at_least(s: &str, min: u64, min_text: &str, example: &str) -> Result<u64, String> {
    let bytes = match s.strip_suffix('T') {
        Some(tera) => scaled_number(&format!("{tera}G")).and_then(|g| g.checked_mul(1000)),
        None => scaled_number(s),
    };
    bytes.filter(|&n| n >= min).ok_or_else(|| {
        format!("'{s}' is not a number of bytes of at least {min_text} (e.g. {example})")
    })
}

/// The bytes a TCP collector's spool may hold on disk: a number with k, M, G (or T), at
/// least 1M.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "NumberOrText")]
pub struct SpoolSize(pub u64);

impl std::str::FromStr for SpoolSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        bytes_at_least(s, 1_000_000, "1M", "1G").map(SpoolSize)
    }
}

impl std::fmt::Display for SpoolSize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            n if n % 1_000_000_000 == 0 => write!(f, "{}G", n / 1_000_000_000),
            n if n % 1_000_000 == 0 => write!(f, "{}M", n / 1_000_000),
            n => write!(f, "{n}"),
        }
    }
}

/// A passive monitor's capture ring per worker and interface, in bytes: a number with k,
/// M or G, from 1M to what [`RingConfig::MONITOR_BUFFER_MAX`] allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "NumberOrText")]
pub struct CaptureBuffer(pub usize);

impl Default for CaptureBuffer {
    fn default() -> Self {
        CaptureBuffer(RingConfig::MONITOR_BUFFER)
    }
}

impl std::str::FromStr for CaptureBuffer {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let range = 1_000_000..=RingConfig::MONITOR_BUFFER_MAX;
        (scaled_number(s))
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| range.contains(n))
            .map(CaptureBuffer)
            .ok_or_else(|| format!("'{s}' is not a number of bytes from 1M to 1G (e.g. 64M)"))
    }
}

/// Checks a count given by flag or config against its range.
pub fn bounded(name: &str, value: usize, lo: usize, hi: usize) -> crate::SetupResult<usize> {
    if (lo..=hi).contains(&value) {
        Ok(value)
    } else {
        Err(format!("{name}: {value} is outside {lo} to {hi}"))
    }
}

/// An address datagrams are sent to, as `127.0.0.1:7474`: a host and a port of its own,
/// which `field` (a setting or a flag) gives. Port 0 and an unspecified address
/// (`0.0.0.0`, `::`) are none: a sender would send everything nowhere, or wherever the
/// system takes it.
pub fn destination(field: &str, text: &str) -> Result<std::net::SocketAddr, String> {
    (text.parse().ok())
        .filter(|a: &std::net::SocketAddr| a.port() != 0 && !a.ip().is_unspecified())
        .ok_or_else(|| {
            format!(
                "{field}: '{text}' is not an address like 127.0.0.1:7474 (a host and a port of its own: not port 0, nor 0.0.0.0 or ::)"
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A destination is a host and a port of its own; anything else is refused naming the
    /// field and what it takes.
    #[test]
    fn a_destination_has_a_host_and_a_port_of_its_own() {
        for good in ["127.0.0.1:7474", "[::1]:1", "198.18.0.1:65535"] {
            assert_eq!(destination("--to", good), Ok(good.parse().unwrap()));
        }
        for bad in [
            "127.0.0.1:0",
            "0.0.0.0:7474",
            "[::]:7474",
            "localhost:7474",
            "127.0.0.1",
        ] {
            let e = destination("sync.collector", bad).unwrap_err();
            assert!(
                e.starts_with(&format!("sync.collector: '{bad}' is not an address like")),
                "{e}"
            );
        }
    }

    /// Rates, message sizes and capture buffers as the flags and the config give them, and
    /// errors that say what is expected.
    #[test]
    fn rates_and_message_sizes_parse_as_written() {
        for (text, bytes) in [
            ("0", 0),
            ("28M", 28_000_000),
            ("500k", 500_000),
            ("1G", 1_000_000_000),
            ("12345", 12_345),
        ] {
            let rate: ByteRate = text.parse().unwrap();
            assert_eq!(rate, ByteRate(bytes));
            assert_eq!(rate.to_string().parse::<ByteRate>(), Ok(rate), "{text}");
        }
        for bad in ["", "M", "28m", "-1", "1.5M", "99999999999G"] {
            let e = bad.parse::<ByteRate>().unwrap_err();
            assert!(e.contains("bytes per second"), "{bad}: {e}");
        }
        assert_eq!("auto".parse(), Ok(Pace::Auto));
        assert_eq!("28M".parse(), Ok(Pace::Rate(ByteRate(28_000_000))));
        assert_eq!("0".parse(), Ok(Pace::Rate(ByteRate(0))));
        for pace in [Pace::Auto, Pace::Rate(ByteRate(5_000))] {
            assert_eq!(pace.to_string().parse(), Ok(pace));
        }
        for bad in ["", "Auto", "fast", "1.5M"] {
            let e = bad.parse::<Pace>().unwrap_err();
            assert!(
                e.contains("neither auto nor bytes per second"),
                "{bad}: {e}"
            );
        }
        assert_eq!("auto".parse(), Ok(MessageSize::Auto));
        assert_eq!("1400".parse(), Ok(MessageSize::Bytes(1400)));
        for bad in ["511", "65536", "big", ""] {
            let e = bad.parse::<MessageSize>().unwrap_err();
            assert!(e.contains("512 to 65535"), "{bad}: {e}");
        }
        #[derive(serde::Deserialize)]
        struct Keys {
            mtu: MessageSize,
            rate: ByteRate,
        }
        let keys: Keys = toml::from_str("mtu = 1400\nrate = 28000000").unwrap();
        assert_eq!(
            (keys.mtu, keys.rate),
            (MessageSize::Bytes(1400), ByteRate(28_000_000))
        );
        let keys: Keys = toml::from_str("mtu = \"auto\"\nrate = \"28M\"").unwrap();
        assert_eq!(
            (keys.mtu, keys.rate),
            (MessageSize::Auto, ByteRate(28_000_000))
        );
        assert!(toml::from_str::<Keys>("mtu = 100\nrate = 0").is_err());

        assert_eq!("64M".parse(), Ok(CaptureBuffer(64_000_000)));
        assert_eq!("1G".parse(), Ok(CaptureBuffer(1_000_000_000)));
        for bad in ["64x", "500k", "2G", ""] {
            let e = bad.parse::<CaptureBuffer>().unwrap_err();
            assert!(e.contains("from 1M to 1G"), "{bad}: {e}");
        }
        #[derive(Debug, serde::Deserialize)]
        struct Ring {
            buffer: CaptureBuffer,
        }
        for text in ["buffer = \"8M\"", "buffer = 8000000"] {
            let ring: Ring = toml::from_str(text).unwrap();
            assert_eq!(ring.buffer, CaptureBuffer(8_000_000), "{text}");
        }
        assert!(toml::from_str::<Ring>("buffer = 1000").is_err());
        assert!(toml::from_str::<Keys>("mtu = 1400\nrate = \"1.5M\"").is_err());
    }
}
