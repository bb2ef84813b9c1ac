//! Meters: the single-rate three-colour marker (RFC 2697, srTCM) and the two-rate
//! three-colour marker (RFC 2698, trTCM), colour-blind and colour-aware.
//!
//! Token buckets are kept in byte-nanoseconds (bytes x 10^9) in integers, so a rate in
//! bytes per second times an elapsed time in nanoseconds adds exactly, and results do not
//! depend on rounding: the same packets at the same times always get the same colours.

pub use stateplane_api::MeterConfig;

/// A packet's colour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Colour {
    Green,
    Yellow,
    Red,
}

const SCALE: u128 = 1_000_000_000;

/// One token bucket: `rate` bytes per second up to `depth` bytes.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    rate: u128,
    depth: u128,
    /// Tokens in byte-nanoseconds.
    tokens: u128,
}

impl Bucket {
    fn full(rate_bytes_per_s: u64, depth_bytes: u64) -> Self {
        Bucket {
            rate: u128::from(rate_bytes_per_s),
            depth: u128::from(depth_bytes) * SCALE,
            tokens: u128::from(depth_bytes) * SCALE,
        }
    }

    fn has(&self, bytes: u32) -> bool {
        self.tokens >= u128::from(bytes) * SCALE
    }

    fn take(&mut self, bytes: u32) {
        self.tokens -= u128::from(bytes) * SCALE;
    }
}

/// srTCM (RFC 2697): committed rate CIR, committed burst CBS, excess burst EBS. Tokens
/// at CIR fill the committed bucket; what overflows it fills the excess bucket.
#[derive(Debug, Clone, Copy)]
pub struct SrTcm {
    committed: Bucket,
    excess: Bucket,
    last_ns: u64,
}

impl SrTcm {
    /// Both buckets start full (RFC 2697 section 3), at time `now_ns`.
    pub fn new(cir_bytes_per_s: u64, cbs: u64, ebs: u64, now_ns: u64) -> Self {
        SrTcm {
            committed: Bucket::full(cir_bytes_per_s, cbs),
            excess: Bucket::full(0, ebs),
            last_ns: now_ns,
        }
    }

    fn refill(&mut self, now_ns: u64) {
        let dt = u128::from(now_ns.saturating_sub(self.last_ns));
        self.last_ns = self.last_ns.max(now_ns);
        let mut add = self.committed.rate * dt;
        let room = self.committed.depth - self.committed.tokens;
        let into_committed = add.min(room);
        self.committed.tokens += into_committed;
        add -= into_committed;
        self.excess.tokens = (self.excess.tokens + add).min(self.excess.depth);
    }

    /// Colours a packet of `bytes` arriving at `now_ns`; `pre` is its colour so far in
    /// colour-aware mode, `None` in colour-blind mode.
    pub fn mark(&mut self, bytes: u32, now_ns: u64, pre: Option<Colour>) -> Colour {
        self.refill(now_ns);
        let pre = pre.unwrap_or(Colour::Green);
        if pre == Colour::Green && self.committed.has(bytes) {
            self.committed.take(bytes);
            Colour::Green
        } else if pre != Colour::Red && self.excess.has(bytes) {
            self.excess.take(bytes);
            Colour::Yellow
        } else {
            Colour::Red
        }
    }
}

/// trTCM (RFC 2698): peak rate PIR with burst PBS, committed rate CIR with burst CBS.
#[derive(Debug, Clone, Copy)]
pub struct TrTcm {
    peak: Bucket,
    committed: Bucket,
    last_ns: u64,
}

impl TrTcm {
    /// Both buckets start full (RFC 2698 section 3), at time `now_ns`.
    pub fn new(pir: u64, pbs: u64, cir: u64, cbs: u64, now_ns: u64) -> Self {
        TrTcm {
            peak: Bucket::full(pir, pbs),
            committed: Bucket::full(cir, cbs),
            last_ns: now_ns,
        }
    }

    fn refill(&mut self, now_ns: u64) {
        let dt = u128::from(now_ns.saturating_sub(self.last_ns));
        self.last_ns = self.last_ns.max(now_ns);
        for b in [&mut self.peak, &mut self.committed] {
            b.tokens = (b.tokens + b.rate * dt).min(b.depth);
        }
    }

    /// Colours a packet; `pre` as for [`SrTcm::mark`].
    pub fn mark(&mut self, bytes: u32, now_ns: u64, pre: Option<Colour>) -> Colour {
        self.refill(now_ns);
        let pre = pre.unwrap_or(Colour::Green);
        if pre == Colour::Red || !self.peak.has(bytes) {
            Colour::Red
        } else if pre == Colour::Yellow || !self.committed.has(bytes) {
            self.peak.take(bytes);
            Colour::Yellow
        } else {
            self.peak.take(bytes);
            self.committed.take(bytes);
            Colour::Green
        }
    }
}

/// One meter of a meter array: off, or a marker made from its settings. Zeroed memory is
/// a meter that is off (a table's empty slots are zeroed).
#[derive(Debug, Clone, Copy, Default, bytemuck::Zeroable)]
#[repr(u8)]
pub enum Meter {
    #[default]
    Off,
    Sr(SrTcm, MeterConfig),
    Tr(TrTcm, MeterConfig),
}

impl Meter {
    /// A meter with these settings, its buckets full at `now_ns`.
    pub fn new(config: MeterConfig, now_ns: u64) -> Meter {
        match config {
            MeterConfig::Off => Meter::Off,
            MeterConfig::SrTcm { cir, cbs, ebs } => {
                Meter::Sr(SrTcm::new(cir, cbs, ebs, now_ns), config)
            }
            MeterConfig::TrTcm { cir, cbs, pir, pbs } => {
                Meter::Tr(TrTcm::new(pir, pbs, cir, cbs, now_ns), config)
            }
        }
    }

    #[inline]
    pub fn mark(&mut self, bytes: u32, now_ns: u64, pre: Option<Colour>) -> Colour {
        match self {
            Meter::Off => pre.unwrap_or(Colour::Green),
            Meter::Sr(m, _) => m.mark(bytes, now_ns, pre),
            Meter::Tr(m, _) => m.mark(bytes, now_ns, pre),
        }
    }

    pub fn config(&self) -> MeterConfig {
        match self {
            Meter::Off => MeterConfig::Off,
            Meter::Sr(_, c) | Meter::Tr(_, c) => *c,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Colour::*;
    use super::*;

    const MS: u64 = 1_000_000;

    /// RFC 2697 worked through by hand: CIR 1000 B/s, CBS 1500, EBS 1000; 500-byte packets.
    #[test]
    fn srtcm_colour_blind_follows_rfc_2697() {
        let mut m = SrTcm::new(1000, 1500, 1000, 0);
        // Tc 1500, Te 1000: three greens, two yellows, then red.
        let got: Vec<Colour> = (0..6).map(|_| m.mark(500, 0, None)).collect();
        assert_eq!(got, [Green, Green, Green, Yellow, Yellow, Red]);
        // 500 ms at 1000 B/s: 500 tokens into Tc (which was empty).
        assert_eq!(m.mark(500, 500 * MS, None), Green);
        assert_eq!(m.mark(500, 500 * MS, None), Red);
        // Two seconds: Tc refills to 1500, the other 500 overflow into Te.
        assert_eq!(m.mark(1500, 2500 * MS, None), Green);
        assert_eq!(m.mark(500, 2500 * MS, None), Yellow);
        assert_eq!(m.mark(1, 2500 * MS, None), Red);
    }

    #[test]
    fn srtcm_colour_aware_never_improves_a_colour() {
        let mut m = SrTcm::new(1000, 1500, 1000, 0);
        assert_eq!(m.mark(500, 0, Some(Yellow)), Yellow, "yellow uses Te only");
        assert_eq!(m.mark(500, 0, Some(Red)), Red);
        assert_eq!(m.mark(500, 0, Some(Green)), Green);
        // Te had 1000, 500 used: one more yellow, then red, even with Tc left.
        assert_eq!(m.mark(500, 0, Some(Yellow)), Yellow);
        assert_eq!(m.mark(500, 0, Some(Yellow)), Red);
        assert_eq!(m.mark(500, 0, Some(Green)), Green, "Tc still had 1000");
    }

    /// RFC 2698 by hand: PIR 2000 B/s, PBS 2000; CIR 1000 B/s, CBS 1000.
    #[test]
    fn trtcm_colour_blind_follows_rfc_2698() {
        let mut m = TrTcm::new(2000, 2000, 1000, 1000, 0);
        let got: Vec<Colour> = (0..5).map(|_| m.mark(500, 0, None)).collect();
        // Tp 2000, Tc 1000: green, green (Tc empty), yellow, yellow (Tp empty), red.
        assert_eq!(got, [Green, Green, Yellow, Yellow, Red]);
        // 250 ms: Tp +500, Tc +250.
        assert_eq!(m.mark(300, 250 * MS, None), Yellow, "Tc 250 < 300, Tp 500");
        assert_eq!(m.mark(250, 250 * MS, None), Red, "Tp 200 left");
        assert_eq!(m.mark(200, 250 * MS, None), Green, "Tp 200, Tc 250");
    }

    #[test]
    fn trtcm_colour_aware() {
        let mut m = TrTcm::new(2000, 2000, 1000, 1000, 0);
        assert_eq!(m.mark(500, 0, Some(Red)), Red);
        assert_eq!(m.mark(500, 0, Some(Yellow)), Yellow, "takes from Tp only");
        assert_eq!(
            m.mark(1000, 0, Some(Green)),
            Green,
            "Tc untouched by the yellow"
        );
        assert_eq!(m.mark(500, 0, Some(Green)), Yellow, "Tc now empty");
        assert_eq!(m.mark(100, 0, Some(Green)), Red, "Tp empty");
    }

    /// Over a long run at twice the committed rate, the green share converges on CIR.
    #[test]
    fn long_run_rates_match_the_configuration() {
        let mut m = SrTcm::new(125_000, 3000, 3000, 0); // 1 Mbit/s
        let mut green_bytes = 0u64;
        for i in 0..20_000u64 {
            // 1000-byte packets every 4 ms: 250,000 B/s offered.
            if m.mark(1000, i * 4 * MS, None) == Green {
                green_bytes += 1000;
            }
        }
        let secs = 20_000.0 * 0.004;
        let rate = green_bytes as f64 / secs;
        assert!((rate - 125_000.0).abs() < 125_000.0 * 0.01, "{rate}");
    }
}
