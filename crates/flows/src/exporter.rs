//! The exporter's protocol core: flow records in, the bytes each sink must write out, and
//! when. It is fed the time with every call and reads no clock, opens no socket or file,
//! so it runs the same under the exporter thread's clock and under a test's virtual one.
//! The transports (UDP with its pacing, TCP with its reconnections, files) are shells
//! around it that write what it hands them.
//!
//! Call order: [`ExportCore::start`] once, for what each sink writes first (a CSV header);
//! [`ExportCore::records`] for each batch; [`ExportCore::timeout`] whenever
//! [`ExportCore::poll_timeout`] has come; [`ExportCore::new_stream`] when a sink's
//! transport starts over (a TCP collector connected again: RFC 7011 numbers a new
//! connection's messages from 0, templates first); [`ExportCore::finish`] at the end. Each
//! hands its output to `out` as [`Output`]s, in the order they must be written.

use crate::FlowRecord;
use crate::ipfix::{Dialect, Encoder, Features, TemplateRefresh};
use crate::text_lines as text;
use std::time::{Duration, Instant};

/// How often, at least, what the sinks hold goes out: the partly filled IPFIX messages
/// and the transports' buffered bytes. A live monitor may take minutes to fill a message
/// of 64 KiB, and its records are wanted within a moment of the flows' end; an exporter
/// kept busy flushes no more often than this.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);

/// How a sink's records are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// IPFIX messages of at most `message_len` bytes, templates sent as `refresh` says.
    Ipfix {
        message_len: usize,
        refresh: TemplateRefresh,
    },
    /// NetFlow v9 messages, as IPFIX's (see [`Dialect::Netflow9`]).
    Netflow9 {
        message_len: usize,
        refresh: TemplateRefresh,
    },
    /// CSV, a header line first.
    Csv,
    /// JSON, one object per line.
    Json,
}

/// What a sink's transport must do, in order.
#[derive(Debug, PartialEq, Eq)]
pub enum Output<'a> {
    /// Write these bytes: one IPFIX message, or one or more whole text lines; `records`,
    /// the flow records they carry (0 for templates or a header).
    Write {
        sink: usize,
        bytes: &'a [u8],
        records: u32,
    },
    /// Push out whatever the transport holds (a buffer, UDP datagrams held to send at once).
    Flush { sink: usize },
}

/// One sink's encoder.
enum Writer {
    /// IPFIX or NetFlow v9.
    Ipfix(Box<Encoder>),
    Text {
        csv: bool,
    },
}

/// The core: see the module documentation for the call order.
pub struct ExportCore {
    writers: Vec<Writer>,
    features: Features,
    biflow: bool,
    /// The program's drop reasons, which text records name (`forwarding`).
    drop_names: &'static [&'static str],
    /// The export time, in seconds: follows the records' own clock (capture time offline),
    /// never back.
    export_s: u32,
    /// When the sinks were last flushed; `None` before the first call.
    flushed_at: Option<Instant>,
    /// Records taken so far.
    records: u64,
    /// The text line being written (kept to reuse its allocation).
    line: String,
}

impl ExportCore {
    /// A core for sinks of `formats` (sink `i` is `formats[i]`), exporting `features`,
    /// biflows if `biflow`, as observation domain `domain`.
    pub fn new(formats: &[Format], features: Features, biflow: bool, domain: u32) -> Self {
        let writers = (formats.iter())
            .map(|f| match *f {
                Format::Ipfix {
                    message_len,
                    refresh,
                } => Writer::Ipfix(Box::new(Encoder::new(
                    domain,
                    features,
                    biflow,
                    message_len,
                    refresh,
                ))),
                Format::Netflow9 {
                    message_len,
                    refresh,
                } => Writer::Ipfix(Box::new(Encoder::in_dialect(
                    Dialect::Netflow9,
                    domain,
                    features,
                    biflow,
                    message_len,
                    refresh,
                ))),
                Format::Csv => Writer::Text { csv: true },
                Format::Json => Writer::Text { csv: false },
            })
            .collect();
        ExportCore {
            writers,
            features,
            biflow,
            drop_names: &[],
            export_s: 0,
            flushed_at: None,
            records: 0,
            line: String::new(),
        }
    }

    /// Text records name the program's drop reasons by `names` (`DropReason::name`).
    pub fn with_drop_names(mut self, names: &'static [&'static str]) -> Self {
        self.drop_names = names;
        self
    }

    /// What each sink writes before any record (a CSV's header), at `now`.
    pub fn start(&mut self, now: Instant, out: &mut dyn FnMut(Output)) {
        self.flushed_at = Some(now);
        for (sink, w) in self.writers.iter().enumerate() {
            if let Writer::Text { csv: true } = w {
                let header = text::csv_header(self.features, self.biflow) + "\n";
                out(Output::Write {
                    sink,
                    bytes: header.as_bytes(),
                    records: 0,
                });
            }
        }
    }

    /// Records taken so far.
    pub fn records_taken(&self) -> u64 {
        self.records
    }

    /// Takes a batch of finished records at `now`: each sink's messages or lines go to
    /// `out` (a partly filled IPFIX message waits for more, or for the next flush).
    pub fn records(&mut self, now: Instant, batch: &[FlowRecord], out: &mut dyn FnMut(Output)) {
        self.flushed_at.get_or_insert(now);
        self.records += batch.len() as u64;
        let latest = (batch.iter())
            .map(|r| r.forward.last_ns.max(r.reverse.map_or(0, |x| x.last_ns)))
            .max()
            .unwrap_or(0);
        self.export_s = self.export_s.max((latest / 1_000_000_000) as u32);
        for (sink, w) in self.writers.iter_mut().enumerate() {
            match w {
                Writer::Ipfix(enc) => {
                    enc.encode_counted(batch, self.export_s, &mut |bytes, records| {
                        out(Output::Write {
                            sink,
                            bytes,
                            records,
                        })
                    });
                }
                Writer::Text { csv } => {
                    for r in batch {
                        self.line.clear();
                        if *csv {
                            text::csv_line(
                                r,
                                self.features,
                                self.biflow,
                                self.drop_names,
                                &mut self.line,
                            );
                        } else {
                            text::json_line(
                                r,
                                self.features,
                                self.biflow,
                                self.drop_names,
                                &mut self.line,
                            );
                        }
                        out(Output::Write {
                            sink,
                            bytes: self.line.as_bytes(),
                            records: 1,
                        });
                    }
                }
            }
        }
    }

    /// When [`ExportCore::timeout`] is next due: the next flush.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.flushed_at.map(|at| at + FLUSH_EVERY)
    }

    /// At `now`: if a flush is due, every sink's partly filled message and buffers go out.
    pub fn timeout(&mut self, now: Instant, out: &mut dyn FnMut(Output)) {
        if self.poll_timeout().is_some_and(|due| now >= due) {
            self.flush(out);
            self.flushed_at = Some(now);
        }
    }

    /// Sink `sink`'s transport starts over: its IPFIX stream begins anew (templates
    /// first, sequence numbers from 0).
    pub fn new_stream(&mut self, sink: usize) {
        if let Some(Writer::Ipfix(enc)) = self.writers.get_mut(sink) {
            enc.new_stream();
        }
    }

    /// The end: everything held goes out, and every sink is flushed.
    pub fn finish(&mut self, out: &mut dyn FnMut(Output)) {
        self.flush(out);
    }

    /// Everything held goes out now, due or not, and every sink is flushed.
    pub fn flush(&mut self, out: &mut dyn FnMut(Output)) {
        for (sink, w) in self.writers.iter_mut().enumerate() {
            if let Writer::Ipfix(enc) = w {
                enc.finish_counted(&mut |bytes, records| {
                    out(Output::Write {
                        sink,
                        bytes,
                        records,
                    })
                });
            }
            out(Output::Flush { sink });
        }
    }
}

/// The core on a virtual clock: no socket, no file, no sleep.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow_stats::{FlowStats, Observation};
    use crate::ipfix::Decoder;
    use crate::record::EndReason;
    use stateplane_wire::FlowKey;
    use std::net::Ipv4Addr;

    fn record(i: u32, last_s: u64) -> FlowRecord {
        let o = Observation {
            ts_ns: last_s * 1_000_000_000,
            ip_len: 100,
            ttl: 64,
            tos: 0,
            tcp_flags: 0,
            in_port: 0,
            out_port: 1,
        };
        let key = FlowKey::v4(
            Ipv4Addr::new(198, 18, 0, 1),
            Ipv4Addr::from(0xc612_0000 + i),
            17,
            1000,
            2000,
        );
        FlowRecord {
            key,
            forward: FlowStats::start(&o),
            reverse: None,
            end: EndReason::Idle,
        }
    }

    /// What a test's transports received: per sink, the writes and flushes in order.
    #[derive(Default)]
    struct Wire {
        writes: Vec<Vec<Vec<u8>>>,
        /// The records each write said it carries.
        records: Vec<Vec<u32>>,
        flushes: Vec<u32>,
    }

    impl Wire {
        fn new(sinks: usize) -> Self {
            Wire {
                writes: vec![Vec::new(); sinks],
                records: vec![Vec::new(); sinks],
                flushes: vec![0; sinks],
            }
        }

        fn take(&mut self) -> impl FnMut(Output) + '_ {
            |o| match o {
                Output::Write {
                    sink,
                    bytes,
                    records,
                } => {
                    self.writes[sink].push(bytes.to_vec());
                    self.records[sink].push(records);
                }
                Output::Flush { sink } => self.flushes[sink] += 1,
            }
        }
    }

    const IPFIX: Format = Format::Ipfix {
        message_len: 1400,
        refresh: TemplateRefresh::ONCE,
    };

    /// Records wait in a partly filled message until the flush is due on the core's
    /// clock; then they go out whole, templates first, and every sink is flushed.
    #[test]
    fn a_partly_filled_message_goes_out_when_the_flush_is_due() {
        let t0 = Instant::now();
        let mut core = ExportCore::new(&[IPFIX], Features::DEFAULT, false, 9);
        let mut wire = Wire::new(1);
        core.start(t0, &mut wire.take());
        let batch: Vec<FlowRecord> = (0..3).map(|i| record(i, 1_700_000_000)).collect();
        core.records(t0, &batch, &mut wire.take());
        assert_eq!(core.poll_timeout(), Some(t0 + FLUSH_EVERY));
        core.timeout(t0 + FLUSH_EVERY - Duration::from_nanos(1), &mut wire.take());
        let early = wire.writes[0].len();
        assert_eq!(wire.flushes[0], 0, "not yet due");
        core.timeout(t0 + FLUSH_EVERY, &mut wire.take());
        assert_eq!(wire.flushes[0], 1);
        assert!(
            wire.writes[0].len() > early,
            "the partly filled message went out"
        );
        let mut dec = Decoder::default();
        let mut got = Vec::new();
        for (m, &said) in wire.writes[0].iter().zip(&wire.records[0]) {
            let (h, recs) = dec.decode(m).unwrap_or_else(|e| panic!("{e:?}"));
            assert_eq!(
                recs.len(),
                said as usize,
                "a write carries the records it says"
            );
            assert_eq!(h.domain, 9);
            assert_eq!(
                h.export_s, 1_700_000_000,
                "export time from the records' clock"
            );
            got.extend(recs);
        }
        assert_eq!(got.len(), 3);
        assert_eq!(core.records_taken(), 3);
        assert_eq!(core.poll_timeout(), Some(t0 + 2 * FLUSH_EVERY));
    }

    /// Text sinks: the CSV header first, then one line per record, as they come.
    #[test]
    fn text_sinks_write_a_header_then_a_line_per_record() {
        let t0 = Instant::now();
        let mut core = ExportCore::new(&[Format::Csv, Format::Json], Features::DEFAULT, false, 1);
        let mut wire = Wire::new(2);
        core.start(t0, &mut wire.take());
        core.records(t0, &[record(1, 5), record(2, 6)], &mut wire.take());
        core.finish(&mut wire.take());
        let csv: Vec<String> = (wire.writes[0].iter())
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .collect();
        assert_eq!(csv.len(), 3);
        assert!(
            csv[0].starts_with("src_addr") || csv[0].contains(','),
            "{}",
            csv[0]
        );
        assert!(csv[0].ends_with('\n'));
        assert!(csv[1].contains("198.18.0.1"), "{}", csv[1]);
        assert_eq!(wire.writes[1].len(), 2, "no header for JSON lines");
        assert!(wire.writes[1][0].starts_with(b"{"));
        assert_eq!(wire.flushes, vec![1, 1]);
    }

    /// A transport that starts over gets a new stream: templates again, sequence from 0;
    /// the other sinks' streams go on.
    #[test]
    fn a_new_stream_starts_with_templates_and_sequence_zero() {
        let t0 = Instant::now();
        let mut core = ExportCore::new(&[IPFIX, IPFIX], Features::DEFAULT, false, 1);
        let mut wire = Wire::new(2);
        core.start(t0, &mut wire.take());
        let batch: Vec<FlowRecord> = (0..5).map(|i| record(i, 10)).collect();
        core.records(t0, &batch, &mut wire.take());
        core.finish(&mut wire.take());
        core.new_stream(1);
        wire.writes.iter_mut().for_each(Vec::clear);
        core.records(t0, &batch, &mut wire.take());
        core.finish(&mut wire.take());
        // The sequence number of a sink's first message since the restart (header bytes 8
        // to 12, RFC 7011 3.1).
        let first = |sink: usize| {
            let m = &wire.writes[sink][0];
            u32::from_be_bytes([m[8], m[9], m[10], m[11]])
        };
        assert_eq!(first(0), 5, "sink 0's stream went on");
        assert_eq!(first(1), 0, "sink 1 started over");
        // A decoder that never saw sink 1's first stream reads the new one whole.
        let mut fresh = Decoder::default();
        let got: usize = (wire.writes[1].iter())
            .map(|m| fresh.decode(m).map_or(0, |(_, r)| r.len()))
            .sum();
        assert_eq!(got, 5);
    }
}
