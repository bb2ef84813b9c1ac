//! TCP window tracking: whether a segment's sequence and acknowledgement numbers fall
//! within what its connection's two sides have sent and allowed, as Guido van Rooij's
//! "Real Stateful TCP Packet Filtering in IP Filter" has it, and as pf and Linux's
//! `nf_conntrack_proto_tcp` implement it.
//!
//! Each side of a connection is a [`Peer`]: the highest sequence number it sent, the
//! highest it may send (the other side's acknowledgement plus its window), the largest
//! window it advertised, and whether it acknowledged anything yet. A segment from one side
//! passes when
//!
//! 1. it starts no later than its sender may send (`seq <= sender.max_end`),
//! 2. it ends no earlier than one receiver's window before what its sender has sent
//!    (`end >= sender.end - receiver.max_win`: retransmissions pass, stale ones do not),
//! 3. it acknowledges nothing the receiver has not sent (`ack <= receiver.end`),
//! 4. nor anything more than a window below it (`ack >= receiver.end - MAX_ACK_WINDOW`),
//!
//! and a reset refusing a SYN that got no SYN+ACK acknowledges it (RFC 9293 3.10.7.3: a
//! reset without an acknowledgement is no answer to a SYN). A reset is placed as data is
//! (1 and 2), so a blind one must guess within about two windows, not anywhere in 2^32.
//! It is not also held to start at what its receiver acknowledged, as Linux holds it:
//! a host resets segments that reach a socket it closed with the sequence number they
//! acknowledge, stale ones included (seen in the lab after iperf3's FIN exchange, where
//! Linux's rule refused each reset), so pf's placement is kept. A reset placed so ends
//! its connection only when it starts exactly at the next byte its sender would send or
//! at what its receiver last acknowledged ([`resets`]), as Linux ends one: elsewhere in
//! the window its receiver answers with a challenge ACK and goes on (RFC 5961 3.2), so a
//! blind reset that lands in the window must not end the connection here either. A
//! reset moves neither peer on.
//!
//! Only a segment that passes moves the peers on. This module keeps no time and does no
//! I/O: it is fed one segment at a time, and its tests are plain sequences of segments.
//!
//! A side whose window is unknown (`max_win == 0`: no packet of it seen since the
//! connection was opened, or since its entry was installed from a replica or a migration,
//! which carry no windows) is learnt from its first packet. When that packet is no SYN,
//! the connection was picked up mid-stream, and from then on its segments are not
//! checked (only followed), as Linux marks a connection it picks up liberal: the first
//! segments a switch sees after taking over a connection are often retransmissions from
//! before what the other side already acknowledged, which no window learnt from them
//! could place, and refusing them would stall the very connections a replica keeps.

use stateplane_runtime::PacketDesc;
use stateplane_wire::ParseFlags;
use stateplane_wire::tcp::{self, TcpPacket, flags};

/// The largest window scale (RFC 7323 2.3).
const MAX_SCALE: u8 = 14;
/// A peer's `scale` while its SYN offered no window scale.
const NO_SCALE: u8 = 0xFF;
/// How far below what the receiver has sent an acknowledgement may be (Linux's
/// `MAXACKWINCONST`): at least this, or the sender's largest window if larger.
const MAX_ACK_WINDOW: u32 = 66_000;

/// `a <= b` in sequence space (RFC 9293 3.4: modulo 2^32, within half of it).
fn seq_le(a: u32, b: u32) -> bool {
    b.wrapping_sub(a) as i32 >= 0
}

fn seq_max(a: u32, b: u32) -> u32 {
    if seq_le(a, b) { b } else { a }
}

/// What window tracking reads of one TCP segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub seq: u32,
    pub ack: u32,
    pub window: u16,
    /// Payload bytes (SYN and FIN not counted).
    pub len: u32,
    /// The window scale option, read on SYNs only.
    pub scale: Option<u8>,
}

impl Segment {
    /// The segment of TCP packet `d`, whose frame is `data`; `None` when its header is not
    /// whole in the frame (not TCP, or a later fragment).
    pub fn read(d: &PacketDesc, data: &[u8]) -> Option<Segment> {
        let p = &d.parsed;
        if !p.flags.has(ParseFlags::TCP) {
            return None;
        }
        let header = data.get(usize::from(p.l4_offset)..usize::from(p.payload_offset))?;
        let tcp = TcpPacket::new_checked(header).ok()?;
        // The IP length covers the whole segment, also where the frame was cut short.
        let headers = u32::from(p.payload_offset.saturating_sub(p.l3_offset));
        let scale = if tcp.flags() & flags::SYN != 0 {
            tcp::options(tcp.options())
                .map_while(Result::ok)
                .find(|o| o.kind == tcp::option::WINDOW_SCALE && o.data.len() == 1)
                .map(|o| o.data[0])
        } else {
            None
        };
        Some(Segment {
            seq: tcp.seq(),
            ack: tcp.ack(),
            window: tcp.window(),
            len: u32::from(p.ip_len).saturating_sub(headers),
            scale,
        })
    }
}

/// What window tracking knows of one side of a connection (pf's `pf_state_peer`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, bytemuck::Zeroable)]
pub struct Peer {
    /// One past the highest sequence number this side has sent (SYN and FIN count one).
    end: u32,
    /// The highest sequence number it may send: the other side's acknowledgement plus
    /// window, at its highest.
    max_end: u32,
    /// The largest window it advertised, scaled; 0 while its window is unknown.
    max_win: u32,
    /// It sent an acknowledgement (so the other side's `max_end` is its word).
    acked: bool,
    /// The highest acknowledgement it sent (meaningful once `acked`).
    max_ack: u32,
    /// The shift of its windows (RFC 7323); [`NO_SCALE`] while its SYN offered none and
    /// the other side's answer is not seen.
    scale: u8,
    /// The connection was picked up mid-stream: its segments pass unchecked.
    liberal: bool,
}

impl Peer {
    /// A side nothing is known of yet, as `Peer::default()`: a constant, so that an
    /// entry made from a synced write's fields is written whole where it goes (made from
    /// the default, field by field on the stack, it was read back before its stores had
    /// landed, a stall an entry of a migration's tens of thousands).
    pub const UNKNOWN: Peer = Peer {
        end: 0,
        max_end: 0,
        max_win: 0,
        acked: false,
        max_ack: 0,
        scale: 0,
        liberal: false,
    };

    /// The scaled window of a segment from this side (SYNs' windows are never scaled).
    fn window(&self, seg: &Segment, syn: bool) -> u32 {
        let shift = if syn || self.scale > MAX_SCALE {
            0
        } else {
            self.scale
        };
        u32::from(seg.window) << shift
    }
}

/// Whether the segment `seg` with TCP flags `tcp_flags`, from the connection's originator
/// (`sender` 0) or responder (1), is within the windows of `peers`; if so the peers move
/// on. `answered`: the responder's SYN+ACK was seen.
pub fn check(
    peers: &mut [Peer; 2],
    sender: usize,
    seg: &Segment,
    tcp_flags: u8,
    answered: bool,
) -> bool {
    let syn = tcp_flags & flags::SYN != 0;
    let has_ack = tcp_flags & flags::ACK != 0;
    let rst = tcp_flags & flags::RST != 0;
    let fin = tcp_flags & flags::FIN != 0;
    // A refused segment moves nothing, what was learnt from it included.
    let unlearnt = if peers[sender].max_win == 0 {
        Some(*peers)
    } else {
        None
    };
    let (s, r) = {
        let [a, b] = peers;
        if sender == 0 { (a, b) } else { (b, a) }
    };

    if syn && !has_ack && sender == 0 && !answered {
        // The originator's SYN, first or again (perhaps from a restarted client with a
        // new initial sequence number): it starts its side afresh.
        *s = Peer::default();
    }
    let mut seq = seg.seq;
    let mut end = seq
        .wrapping_add(seg.len)
        .wrapping_add(u32::from(syn))
        .wrapping_add(u32::from(fin));
    if s.max_win == 0 {
        learn(s, r, seg, syn, has_ack, end);
    }
    if syn && has_ack && sender == 1 {
        // The SYN+ACK says whether both sides scale their windows (RFC 7323 2.2).
        let both = s.scale <= MAX_SCALE && r.scale <= MAX_SCALE;
        if !both {
            (s.scale, r.scale) = (0, 0);
        }
    }
    let win = s.window(seg, syn);
    // A segment without an acknowledgement is taken as acknowledging what it may.
    let ack = if has_ack { seg.ack } else { r.end };
    if seg.len == 0 && !syn && !fin && !rst {
        // A bare acknowledgement carries no data to place in the window.
        seq = s.end;
        end = s.end;
    }

    // Refusing a SYN not yet answered, a reset must acknowledge it.
    let refuses_syn = rst && !answered && sender == 1;
    let receiver_win = if r.max_win == 0 { 1 << 30 } else { r.max_win };
    let ack_window = s.max_win.max(MAX_ACK_WINDOW);
    let ok = s.liberal
        || seq_le(seq, s.max_end)
            && seq_le(s.end.wrapping_sub(receiver_win), end)
            && seq_le(ack, r.end)
            && seq_le(r.end.wrapping_sub(ack_window), ack)
            && (!refuses_syn || has_ack);
    if !ok {
        if let Some(unlearnt) = unlearnt {
            *peers = unlearnt;
        }
        return false;
    }
    if rst {
        // Whether it ends the connection is [`resets`]' to say; it carries nothing to
        // move a window by (a blind one within the window must not stretch it).
        return true;
    }

    s.max_win = s.max_win.max(win).max(1);
    s.end = seq_max(s.end, end);
    if has_ack {
        s.max_ack = if s.acked {
            seq_max(s.max_ack, ack)
        } else {
            ack
        };
        s.acked = true;
        // Moves a liberal receiver on past what it was seen sending (a no-op otherwise:
        // an acknowledgement beyond it was refused).
        r.end = seq_max(r.end, ack);
        // Zero windows still take a one-byte probe.
        let allowed = ack.wrapping_add(win.max(1));
        r.max_end = if r.max_win == 0 {
            allowed
        } else {
            seq_max(r.max_end, allowed)
        };
    }
    true
}

/// Whether a reset starting at `seq` from side `sender`, within the windows, ends its
/// connection: it starts at the next byte its sender would send, or at its receiver's
/// highest acknowledgement (a host resetting a segment it got for a closed socket takes
/// that segment's acknowledgement), as Linux's `nf_conntrack_proto_tcp` ends one; or it
/// refuses the SYN (the responder's, before its SYN+ACK: [`check`] holds it to
/// acknowledge the SYN). A side not followed by its windows (unknown, or picked up) has
/// no numbers to hold a reset to: its resets end the connection. Ask before [`check`]
/// learns the sender from this reset.
pub fn resets(peers: &[Peer; 2], sender: usize, seq: u32, answered: bool) -> bool {
    let (s, r) = (&peers[sender], &peers[1 - sender]);
    let refuses_syn = sender == 1 && !answered;
    refuses_syn || s.max_win == 0 || s.liberal || seq == s.end || r.acked && seq == r.max_ack
}

/// Whether a TCP segment starting at `seq`, quoted by an ICMP error as sent by side
/// `sender`, is one that side could have sent: no further on than it may send, nor more
/// than one receiver's window before what it sent (pf checks a quote so). A side not
/// followed by its windows (unknown, or picked up) passes.
pub fn quoted(peers: &[Peer; 2], sender: usize, seq: u32) -> bool {
    let (s, r) = (&peers[sender], &peers[1 - sender]);
    if s.max_win == 0 || r.max_win == 0 || s.liberal {
        return true;
    }
    seq_le(s.end.wrapping_sub(r.max_win), seq) && seq_le(seq, s.max_end)
}

/// Learns side `s` from its first segment seen, ending at `end`; and side `r` from its
/// acknowledgement when `r` is unknown too (a connection picked up mid-stream).
fn learn(s: &mut Peer, r: &mut Peer, seg: &Segment, syn: bool, has_ack: bool, end: u32) {
    s.scale = if syn {
        seg.scale.map_or(NO_SCALE, |v| v.min(MAX_SCALE))
    } else {
        // No SYN from either side seen: picked up (a side answering a SYN seen, with a
        // reset, is not).
        if r.max_win == 0 || r.liberal {
            (s.liberal, r.liberal) = (true, true);
        }
        MAX_SCALE
    };
    let win = s.window(seg, syn).max(1);
    s.end = end;
    s.max_win = win;
    // What the other side allows, if it already said (its acknowledgement and window),
    // else a window beyond this segment.
    s.max_end = if r.acked {
        seq_max(s.max_end, end.wrapping_add(win))
    } else {
        end.wrapping_add(win)
    };
    if r.max_win == 0 && has_ack {
        r.end = seg.ack;
        r.max_end = seg.ack;
        r.scale = MAX_SCALE;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flags::{ACK, FIN, RST, SYN};

    const A: usize = 0;
    const B: usize = 1;
    /// Initial sequence numbers; B's crosses 2^32 early on.
    const ISN_A: u32 = 1_000;
    const ISN_B: u32 = u32::MAX - 100;

    /// The constant an entry from a synced write starts its peers with is the default.
    #[test]
    fn an_unknown_peer_is_the_default_one() {
        assert_eq!(Peer::UNKNOWN, Peer::default());
    }

    fn seg(seq: u32, ack: u32, window: u16, len: u32, scale: Option<u8>) -> Segment {
        Segment {
            seq,
            ack,
            window,
            len,
            scale,
        }
    }

    /// A segment's `(seq, ack, window, len)`.
    type Numbers = (u32, u32, u16, u32);

    /// Whether a segment of these numbers with flags `f` from side `from` of an answered
    /// connection passes.
    fn passes(peers: &mut [Peer; 2], from: usize, numbers: Numbers, f: u8) -> bool {
        check_numbers(peers, from, numbers, f, true)
    }

    /// As [`passes`], before the responder's SYN+ACK was seen.
    fn unanswered(peers: &mut [Peer; 2], from: usize, numbers: Numbers, f: u8) -> bool {
        check_numbers(peers, from, numbers, f, false)
    }

    fn check_numbers(
        peers: &mut [Peer; 2],
        from: usize,
        n: Numbers,
        f: u8,
        answered: bool,
    ) -> bool {
        check(peers, from, &seg(n.0, n.1, n.2, n.3, None), f, answered)
    }

    /// A connection after its handshake, the windows offered with the scales given.
    fn handshake(scale_a: Option<u8>, scale_b: Option<u8>, window: u16) -> [Peer; 2] {
        let mut peers = [Peer::default(); 2];
        assert!(check(
            &mut peers,
            A,
            &seg(ISN_A, 0, window, 0, scale_a),
            SYN,
            false
        ));
        let syn_ack = seg(ISN_B, ISN_A + 1, window, 0, scale_b);
        assert!(check(&mut peers, B, &syn_ack, SYN | ACK, false));
        let ack = seg(ISN_A + 1, ISN_B.wrapping_add(1), window, 0, None);
        assert!(check(&mut peers, A, &ack, ACK, true));
        peers
    }

    /// Windows are scaled once both SYNs offered a scale: 512 << 7 lets 60000 bytes
    /// ahead; with either offer missing, 512 is 512 bytes and they are out of window.
    #[test]
    fn windows_are_scaled_only_when_both_sides_offered_it() {
        let ahead = |peers: &mut [Peer; 2]| {
            // B says it takes a window of 512 (scaled) from its acknowledgement on.
            let update = seg(ISN_B.wrapping_add(1), ISN_A + 1, 512, 0, None);
            assert!(check(peers, B, &update, ACK, true));
            let far = seg(ISN_A + 1 + 60_000, ISN_B.wrapping_add(1), 512, 1_000, None);
            check(peers, A, &far, ACK, true)
        };
        assert!(ahead(&mut handshake(Some(7), Some(7), 512)));
        assert!(!ahead(&mut handshake(Some(7), None, 512)));
        assert!(!ahead(&mut handshake(None, Some(7), 512)));
        // An offer past 14 counts as 14 (RFC 7323 2.3).
        assert!(ahead(&mut handshake(Some(200), Some(200), 512)));
    }

    /// Data flows both ways across B's wrap of 2^32; a segment beyond what its
    /// receiver allowed, an old one a window behind, an acknowledgement of bytes never
    /// sent and one far behind are refused, and a refused segment moves nothing.
    #[test]
    fn segments_outside_the_windows_are_refused_and_change_nothing() {
        let mut peers = handshake(None, None, 65_535);
        let mut a_next = ISN_A + 1;
        let mut b_next = ISN_B.wrapping_add(1);
        for _ in 0..100 {
            assert!(passes(&mut peers, B, (b_next, a_next, 65_535, 1_400), ACK));
            b_next = b_next.wrapping_add(1_400);
            assert!(passes(&mut peers, A, (a_next, b_next, 65_535, 100), ACK));
            a_next += 100;
        }
        assert!(
            seq_le(ISN_B, b_next) && b_next < ISN_B,
            "B's numbers wrapped"
        );
        let before = peers;
        let refused = [
            (
                B,
                seg(b_next.wrapping_add(70_000), a_next, 65_535, 10, None),
                ACK,
            ),
            (
                B,
                seg(b_next.wrapping_sub(140_000), a_next, 65_535, 10, None),
                ACK,
            ),
            (B, seg(b_next, a_next + 1, 65_535, 10, None), ACK),
            (
                B,
                seg(b_next, a_next.wrapping_sub(70_000), 65_535, 10, None),
                ACK,
            ),
            (A, seg(a_next, b_next.wrapping_add(1), 65_535, 0, None), ACK),
            (
                A,
                seg(a_next.wrapping_add(1 << 31), b_next, 65_535, 10, None),
                ACK,
            ),
        ];
        for (i, (from, s, f)) in refused.iter().enumerate() {
            assert!(!check(&mut peers, *from, s, *f, true), "case {i}");
        }
        assert_eq!(peers, before, "refused segments move nothing");
        // A retransmission within the window passes; so does a bare ACK, whatever its
        // sequence number, and a FIN at the end of the data.
        let again = seg(b_next.wrapping_sub(2_800), a_next, 65_535, 1_400, None);
        assert!(check(&mut peers, B, &again, ACK, true));
        assert!(passes(&mut peers, A, (0, b_next, 65_535, 0), ACK));
        assert!(passes(
            &mut peers,
            A,
            (a_next, b_next, 65_535, 0),
            FIN | ACK
        ));
    }

    /// A zero window still takes a one-byte probe; a segment further on waits.
    #[test]
    fn a_zero_window_takes_a_probe() {
        let mut peers = handshake(None, None, 1_000);
        let b = ISN_B.wrapping_add(1);
        let full = ISN_A + 1 + 1_000;
        assert!(passes(&mut peers, A, (ISN_A + 1, b, 1_000, 1_000), ACK));
        assert!(passes(&mut peers, B, (b, full, 0, 0), ACK));
        assert!(passes(&mut peers, A, (full, b, 1_000, 1), ACK));
        assert!(!passes(&mut peers, A, (full + 2, b, 1_000, 1), ACK));
    }

    /// A reset passes only within a window back from what its sender sent and up to what
    /// it may send: a blind one must guess within that, not anywhere in 2^32. One at a
    /// FIN's number after the FIN was acknowledged (a host answering a stale segment for
    /// a socket it closed) passes.
    #[test]
    fn a_reset_must_fall_within_the_windows() {
        let mut peers = handshake(None, None, 65_535);
        let b = ISN_B.wrapping_add(1);
        assert!(passes(&mut peers, A, (ISN_A + 1, b, 65_535, 500), ACK));
        assert!(passes(&mut peers, B, (b, ISN_A + 501, 65_535, 0), ACK));
        let a = ISN_A + 501;
        for (seq, placed) in [
            (a - 1, true),
            (a.wrapping_sub(20_000), true),
            (a.wrapping_sub(70_000), false),
            (a + 70_000, false),
            (a + 100_000, false),
            (a.wrapping_add(1 << 31), false),
            (a + 1_000, true),
            (a, true),
        ] {
            let mut p = peers;
            assert_eq!(passes(&mut p, A, (seq, 0, 0, 0), RST), placed, "{seq}");
        }
        // B sends its FIN, A acknowledges it, and B resets a stale segment of A's with
        // the FIN's own number (as the lab's Linux hosts did).
        let fin = b;
        assert!(passes(&mut peers, B, (fin, a, 65_535, 0), FIN | ACK));
        assert!(passes(&mut peers, A, (a, fin + 1, 65_535, 0), ACK));
        assert!(passes(&mut peers, B, (fin, 0, 0, 0), RST));
    }

    /// A reset within the windows ends its connection only at the next byte its sender
    /// would send or at what its receiver acknowledged; elsewhere it passes, ends nothing
    /// and moves neither peer (RFC 5961's blind reset). A side not yet seen has no number
    /// to hold its reset to.
    #[test]
    fn only_a_reset_at_an_exact_number_ends_the_connection() {
        let mut peers = handshake(None, None, 65_535);
        let b = ISN_B.wrapping_add(1);
        // A sends 500 bytes, of which B acknowledges 300.
        assert!(passes(&mut peers, A, (ISN_A + 1, b, 65_535, 500), ACK));
        assert!(passes(&mut peers, B, (b, ISN_A + 301, 65_535, 0), ACK));
        let next = ISN_A + 501;
        for (seq, ends) in [
            (next, true),
            (ISN_A + 301, true),
            (next - 1, false),
            (next + 1_000, false),
            (ISN_A + 1, false),
        ] {
            assert!(passes(&mut peers.clone(), A, (seq, 0, 0, 0), RST), "{seq}");
            assert_eq!(resets(&peers, A, seq, true), ends, "{seq}");
        }
        assert!(resets(&peers, B, b, true));
        assert!(!resets(&peers, B, b.wrapping_add(10), true));
        let before = peers;
        assert!(passes(
            &mut peers,
            A,
            (next + 30_000, b, 65_535, 0),
            RST | ACK
        ));
        assert_eq!(peers, before, "a reset moves nothing");
        assert!(resets(&[Peer::default(); 2], B, 12_345, true));
        // Refusing the SYN, whatever its number.
        let mut syn_sent = [Peer::default(); 2];
        assert!(unanswered(&mut syn_sent, A, (ISN_A, 0, 1_000, 0), SYN));
        assert!(resets(&syn_sent, B, 12_345, false));
    }

    /// Before the SYN+ACK, the responder's reset counts only if it acknowledges the SYN
    /// (those refused teach nothing of the responder);
    /// a retransmitted SYN with a new initial number starts the originator afresh.
    #[test]
    fn a_refused_syn_and_a_syn_sent_again() {
        let mut peers = [Peer::default(); 2];
        assert!(unanswered(&mut peers, A, (ISN_A, 0, 1_000, 0), SYN));
        let refusal = |ack| seg(0, ack, 0, 0, None);
        let before = peers;
        assert!(!check(
            &mut peers,
            B,
            &refusal(ISN_A.wrapping_sub(100_000)),
            RST | ACK,
            false
        ));
        assert!(!check(&mut peers, B, &refusal(ISN_A + 2), RST | ACK, false));
        assert!(!unanswered(&mut peers, B, (0, ISN_A + 1, 0, 0), RST));
        assert_eq!(peers, before, "nothing learnt from the refused segments");
        assert!(check(&mut peers, B, &refusal(ISN_A + 1), RST | ACK, false));

        let mut peers = [Peer::default(); 2];
        assert!(unanswered(&mut peers, A, (ISN_A, 0, 1_000, 0), SYN));
        assert!(unanswered(&mut peers, A, (7, 0, 1_000, 0), SYN));
        assert!(check(&mut peers, B, &refusal(8), RST | ACK, false));
    }

    /// With no windows known (an entry installed from a replica), the connection is
    /// followed, not checked: a retransmission from long before what the other side
    /// acknowledged, and the acknowledgement of bytes this switch never saw, pass, as
    /// they do after a failover.
    #[test]
    fn a_connection_picked_up_mid_stream_is_followed_unchecked() {
        let mut peers = [Peer::default(); 2];
        let (a, b) = (3_000_000_000u32, 17u32);
        // A retransmission; B already has 100000 bytes more of A's, and says so.
        assert!(passes(&mut peers, A, (a, b, 1_000, 1_400), ACK));
        assert!(passes(&mut peers, B, (b, a + 100_000, 1_000, 0), ACK));
        assert!(passes(&mut peers, A, (a + 100_000, b, 1_000, 1_400), ACK));
        assert!(passes(&mut peers, B, (b, a, 0, 0), RST));

        // The same numbers on a connection whose handshake was seen: refused.
        let mut strict = handshake(None, None, 1_000);
        let (a, b) = (ISN_A + 1, ISN_B.wrapping_add(1));
        assert!(passes(&mut strict, A, (a, b, 1_000, 1_000), ACK));
        assert!(!passes(&mut strict, B, (b, a + 100_000, 1_000, 0), ACK));
    }
}
