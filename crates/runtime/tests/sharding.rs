//! Sharding and shutdown of the offline pipeline: every packet of a flow reaches the same
//! worker, no packet is lost or duplicated across workers, and a stop drains cleanly; the
//! same for workers that read their own shard of the input ([`OwnShard`]), with or without
//! a reader thread ahead of each ([`ReadAhead`]), and for workers that read a file's chunks
//! in turn and hand each other their flows' packets ([`ChunkShard`]).
#![allow(clippy::unwrap_used)]

use stateplane_gen::{GenConfig, Workload, generate};
use stateplane_runtime::chunked::{ChunkConfig, ChunkShard};
use stateplane_runtime::{
    Burst, ChunkedFile, Context, Counter, FileRecord, MemoryRx, PacketBytes, Program,
    ProgramFactory, RxPacket, RxPort, TxPort, Verdict,
};
use stateplane_runtime::{
    BurstSource, OfflinePorts, OwnShard, ReadAhead, RunHandle, RuntimeConfig, run_offline,
    run_sharded,
};
use stateplane_wire::{FlowHasher, FlowKey};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A file in memory for [`ChunkShard`]: records of an 8-byte timestamp, a 4-byte length
/// and the packet, little-endian, after a 4-byte file header. Every `NOTE_EVERY` packets
/// comes a note (length `NOTE`, no packet), and the timestamps after it are stored less
/// the notes before them, as pcapng's depend on its interface blocks: read with the wrong
/// context (the notes so far), a packet's timestamp comes out wrong.
struct MemFile {
    bytes: Vec<u8>,
}

impl MemFile {
    const HEADER: usize = 12;
    const NOTE: u32 = u32::MAX;
    const NOTE_EVERY: usize = 37;

    fn new(packets: &[(u64, Vec<u8>)]) -> Arc<MemFile> {
        let mut bytes = b"MEM!".to_vec();
        for (i, (ts, data)) in packets.iter().enumerate() {
            let notes = (i / Self::NOTE_EVERY) as u64;
            if i > 0 && i % Self::NOTE_EVERY == 0 {
                bytes.extend_from_slice(&0u64.to_le_bytes());
                bytes.extend_from_slice(&Self::NOTE.to_le_bytes());
            }
            bytes.extend_from_slice(&ts.wrapping_sub(notes).to_le_bytes());
            bytes.extend_from_slice(&(data.len() as u32).to_le_bytes());
            bytes.extend_from_slice(data);
        }
        Arc::new(MemFile { bytes })
    }
}

impl ChunkedFile for MemFile {
    /// The notes so far.
    type Context = u64;

    fn name(&self) -> &str {
        "memory"
    }
    fn first_record(&self) -> (u64, u64) {
        (4, 0)
    }
    fn max_record_len(&self) -> usize {
        Self::HEADER + stateplane_runtime::MAX_FRAME + 1
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<usize> {
        let rest = self.bytes.get(offset as usize..).unwrap_or_default();
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        Ok(n)
    }
    fn record<'a>(
        &self,
        bytes: &'a [u8],
        at_byte: u64,
        at_end: bool,
        notes: &mut u64,
    ) -> std::io::Result<Option<FileRecord<'a>>> {
        let whole = bytes.get(..Self::HEADER).and_then(|h| {
            let len = u32::from_le_bytes(h[8..12].try_into().unwrap());
            if len == Self::NOTE {
                *notes += 1;
                let (packet, len) = (None, Self::HEADER);
                return Some(FileRecord { packet, len });
            }
            let data = bytes.get(Self::HEADER..Self::HEADER + len as usize)?;
            let ts_ns = u64::from_le_bytes(h[..8].try_into().unwrap()).wrapping_add(*notes);
            let packet = Some(RxPacket {
                data,
                orig_len: len,
                ts_ns,
                seen: Default::default(),
            });
            Some(FileRecord {
                packet,
                len: Self::HEADER + data.len(),
            })
        });
        if whole.is_none() && at_end && !bytes.is_empty() {
            return Err(std::io::Error::other(format!(
                "cut short at byte {at_byte}"
            )));
        }
        Ok(whole)
    }
}

/// Chunks small enough that a test's trace spans a few hundred of them, for `workers`
/// workers, in bursts of 32.
fn chunks(workers: usize, hasher: FlowHasher) -> ChunkConfig {
    ChunkConfig {
        workers,
        hasher,
        burst_size: 32,
        chunk_bytes: 4096,
        bytes: PacketBytes::Whole,
    }
}

#[derive(Clone, Default)]
struct Collect(Arc<Mutex<Vec<u64>>>);

impl TxPort for Collect {
    fn name(&self) -> &str {
        "collect"
    }
    fn send(&mut self, data: &[u8], _: u32, ts: u64) -> std::io::Result<()> {
        self.0.lock().unwrap().push(ts ^ data.len() as u64);
        Ok(())
    }
}

/// Records which worker saw each flow (test-only: a lock per burst is fine here), and
/// counts as a conflict too a packet that reaches its worker before one read ahead of it,
/// or with another timestamp than the input's (`ts_by_seq`, where given).
struct Recorder {
    seen: Arc<Mutex<HashMap<FlowKey, usize>>>,
    conflicts: Arc<Mutex<u64>>,
    last_seq: Option<u64>,
    ts_by_seq: Option<Arc<Vec<u64>>>,
}

impl Program for Recorder {
    type Prepared = ();

    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        let mut seen = self.seen.lock().unwrap();
        for d in burst.descs_mut() {
            let out_of_order = self.last_seq.is_some_and(|last| d.seq <= last);
            let mistimed = (self.ts_by_seq.as_ref())
                .is_some_and(|ts| ts.get(d.seq as usize) != Some(&d.ts_ns));
            self.last_seq = Some(d.seq);
            let moved = *seen.entry(d.parsed.key).or_insert(ctx.worker) != ctx.worker;
            if moved || out_of_order || mistimed {
                *self.conflicts.lock().unwrap() += 1;
            }
            d.verdict = Verdict::Forward(1);
        }
    }
}

type Seen = Arc<Mutex<HashMap<FlowKey, usize>>>;

/// A program that records which worker saw each flow, with what it records; it checks the
/// timestamps against `packets`' where given.
fn recorder(packets: Option<&[(u64, Vec<u8>)]>) -> (ProgramFactory, Seen, Arc<Mutex<u64>>) {
    let ts_by_seq = packets.map(|p| Arc::new(p.iter().map(|(ts, _)| *ts).collect::<Vec<_>>()));
    let seen: Seen = Arc::new(Mutex::new(HashMap::new()));
    let conflicts = Arc::new(Mutex::new(0));
    let (s, c) = (seen.clone(), conflicts.clone());
    let factory: ProgramFactory = Arc::new(move |_| {
        Box::new(Recorder {
            seen: s.clone(),
            conflicts: c.clone(),
            last_seq: None,
            ts_by_seq: ts_by_seq.clone(),
        })
    });
    (factory, seen, conflicts)
}

fn trace(packets: u64) -> Vec<(u64, Vec<u8>)> {
    let mut out = Vec::new();
    generate(
        &GenConfig::new(Workload::Internet, packets),
        |ts, f| {
            out.push((ts, f.to_vec()));
            Ok(())
        },
        |_| {},
    )
    .unwrap();
    out
}

fn run(
    packets: &[(u64, Vec<u8>)],
    workers: usize,
    burst: usize,
    stop_early: bool,
) -> (Vec<u64>, u64, u64, Vec<u64>, usize) {
    let (factory, seen, conflicts) = recorder(None);
    let out = Collect::default();
    let ports = OfflinePorts {
        rx: vec![(0, Box::new(MemoryRx::new(packets.to_vec())))],
        tx: vec![None, Some(Box::new(out.clone()))],
        control: None,
    };
    let cfg = RuntimeConfig {
        workers,
        burst_size: burst,
        queue_depth: 2,
        hasher: FlowHasher::with_seed(3),
        taps: Vec::new(),
        state_stages: Vec::new(),
        spread: Default::default(),
    };
    let handle = RunHandle::new(workers);
    if stop_early {
        handle
            .stop
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let report = run_offline(&cfg, ports, &factory, &handle, Vec::new());
    assert!(report.errors.is_empty(), "{:?}", report.errors);
    let sent = out.0.lock().unwrap().clone();
    let per_worker = report
        .per_worker
        .iter()
        .map(|s| s.get(Counter::RxPackets))
        .collect();
    let flows = seen.lock().unwrap().len();
    let conflicts = *conflicts.lock().unwrap();
    (
        sent,
        report.total.get(Counter::TxPackets),
        conflicts,
        per_worker,
        flows,
    )
}

#[test]
fn flows_stay_on_one_worker_and_nothing_is_lost_or_duplicated() {
    let packets = trace(50_000);
    let want: Vec<u64> = packets.iter().map(|(ts, d)| ts ^ d.len() as u64).collect();
    for (workers, burst) in [(1, 64), (2, 32), (4, 7), (3, 256)] {
        let (sent, tx, conflicts, per_worker, flows) = run(&packets, workers, burst, false);
        assert_eq!(
            conflicts, 0,
            "a flow reached two workers ({workers} workers)"
        );
        assert_eq!(tx, 50_000);
        assert_eq!(
            sent, want,
            "output differs from input order or content ({workers} workers, burst {burst})"
        );
        assert_eq!(per_worker.iter().sum::<u64>(), 50_000);
        if workers > 1 {
            assert!(
                per_worker
                    .iter()
                    .all(|&n| n > 50_000 / (workers as u64 * 4)),
                "unbalanced: {per_worker:?}"
            );
        }
        assert!(flows > 2000);
    }
}

#[test]
fn a_stop_drains_every_queue_and_counts_stay_consistent() {
    let packets = trace(5_000);
    let (sent, tx, _, per_worker, _) = run(&packets, 3, 16, true);
    assert_eq!(sent.len() as u64, tx);
    assert_eq!(per_worker.iter().sum::<u64>(), tx);
}

/// Workers that each read the whole input and keep their own shard see every packet
/// exactly once between them, each flow on one worker, in the dispatcher's split; a
/// malformed packet is counted once, not once per worker. A reader thread ahead of each
/// worker changes nothing of that, nor does one reader thread shared by all.
#[test]
fn own_shards_partition_the_input_as_the_dispatcher_does() {
    let mut packets = trace(20_000);
    packets.insert(100, (packets[99].0, vec![0u8; 10])); // too short for Ethernet
    let oversize = vec![0u8; stateplane_runtime::MAX_FRAME + 1];
    packets.insert(200, (packets[199].0, oversize));
    for (workers, read_ahead, shared, chunked) in [
        (1, false, false, false),
        (3, false, false, false),
        (1, true, false, false),
        (3, true, false, false),
        (1, true, true, false),
        (3, true, true, false),
        (1, false, false, true),
        (2, false, false, true),
        (3, false, false, true),
    ] {
        let (factory, _, conflicts) = recorder(Some(&packets));
        let cfg = RuntimeConfig {
            workers,
            burst_size: 32,
            hasher: FlowHasher::with_seed(3),
            ..RuntimeConfig::default()
        };
        let handle = RunHandle::new(workers);
        let port = |packets: &[(u64, Vec<u8>)]| -> Vec<(u16, Box<dyn RxPort>)> {
            let rx = MemoryRx::new(packets.to_vec());
            vec![(0, Box::new(rx))]
        };
        let sources: Vec<Box<dyn BurstSource>> = if chunked {
            let file = MemFile::new(&packets);
            ChunkShard::for_workers(file, 0, chunks(workers, cfg.hasher), &handle)
        } else if shared {
            ReadAhead::spawn_shared(
                port(&packets),
                workers,
                cfg.hasher,
                32,
                PacketBytes::Whole,
                &handle,
            )
            .unwrap()
        } else {
            (0..workers)
                .map(|w| {
                    let shard = Box::new(OwnShard::new(
                        port(&packets),
                        w,
                        workers,
                        cfg.hasher,
                        PacketBytes::Whole,
                        &handle,
                    ));
                    if read_ahead {
                        let ahead = ReadAhead::spawn(shard, cfg.burst_size, format!("r{w}"));
                        Box::new(ahead.unwrap()) as Box<dyn BurstSource>
                    } else {
                        shard as Box<dyn BurstSource>
                    }
                })
                .collect()
        };
        let report = run_sharded(&cfg, sources, 2, &factory, &handle);
        assert!(report.errors.is_empty(), "{:?}", report.errors);
        assert_eq!(
            *conflicts.lock().unwrap(),
            0,
            "a flow reached two workers, or a worker's packets came out of order or \
             with another timestamp"
        );
        // Received: every packet once, the malformed and the oversize one included, each
        // of those counted once whatever the number of workers.
        assert_eq!(report.total.get(Counter::RxPackets), 20_002);
        assert_eq!(report.total.get(Counter::TxPackets), 20_000);
        assert_eq!(report.total.get(Counter::Malformed), 1, "{workers} workers");
        let oversize = usize::from(stateplane_runtime::DropReason::OVERSIZE.0);
        assert_eq!(report.total.drops[oversize], 1, "{workers} workers");
        // The same packets per worker as through the dispatcher.
        let (_, _, _, dispatched, _) = run(&packets[..], workers, 32, false);
        // Each bad packet is counted by the worker that read it (worker 0 when each reads
        // the whole input); the dispatcher counts them before any worker.
        let own: Vec<u64> = (report.per_worker.iter())
            .map(|s| s.get(Counter::RxPackets) - s.get(Counter::Malformed) - s.drops[oversize])
            .collect();
        assert_eq!(own, dispatched, "{workers} workers, chunked {chunked}");
        if chunked {
            assert_eq!(
                handle
                    .input_bytes
                    .load(std::sync::atomic::Ordering::Relaxed),
                MemFile::new(&packets).bytes.len() as u64 - 4,
                "progress counts every byte of records once"
            );
        }
    }
}

/// A reader thread hands out its source's bursts whole and in order, ends when the source
/// does (also when the source ends exactly at a batch's end), and stops promptly when its
/// worker stops early.
#[test]
fn read_ahead_hands_out_the_same_bursts_in_order_and_stops() {
    let hasher = FlowHasher::with_seed(3);
    let handle = RunHandle::new(1);
    let shard = |packets: &[(u64, Vec<u8>)]| {
        let rx = MemoryRx::new(packets.to_vec());
        let port: Box<dyn RxPort> = Box::new(rx);
        Box::new(OwnShard::new(
            vec![(0, port)],
            0,
            1,
            hasher,
            PacketBytes::Whole,
            &handle,
        ))
    };
    let stamps = |source: &mut dyn BurstSource| {
        let mut burst = Burst::with_capacity(32);
        let mut seen = Vec::new();
        while source.fill(&mut burst) {
            seen.push(burst.descs().iter().map(|d| d.ts_ns).collect::<Vec<_>>());
            burst.clear();
        }
        assert!(!source.fill(&mut burst), "an ended source stays ended");
        seen
    };
    // 64 bursts of 32 make one batch: 2,048 packets end exactly at a batch's end.
    let all = trace(5_000);
    for n in [0, 1, 2_047, 2_048, 2_049, 5_000] {
        let packets = &all[..n as usize];
        let direct = stamps(shard(packets).as_mut());
        let mut ahead = ReadAhead::spawn(shard(packets), 32, "r".into()).unwrap();
        assert_eq!(stamps(&mut ahead), direct, "{n} packets");
        assert_eq!(direct.iter().map(Vec::len).sum::<usize>() as u64, n);
        let (_, errors) = ahead.finish();
        assert!(errors.is_empty(), "{errors:?}");
    }
    // A worker that stops after one burst of a long input: dropping the source ends the
    // reader (the test would hang otherwise).
    let mut ahead = ReadAhead::spawn(shard(&trace(50_000)), 32, "r".into()).unwrap();
    assert!(ahead.fill(&mut Burst::with_capacity(32)));
    drop(ahead);
}

/// A shared reader ends when one of its workers stops early: the others' inputs end with
/// it (a stopping run), and nothing waits forever.
#[test]
fn a_shared_reader_ends_when_a_worker_stops() {
    let packets = trace(200_000);
    let handle = RunHandle::new(2);
    let rx = MemoryRx::new(packets);
    let ports: Vec<(u16, Box<dyn RxPort>)> = vec![(0, Box::new(rx))];
    let mut sources = ReadAhead::spawn_shared(
        ports,
        2,
        FlowHasher::with_seed(3),
        32,
        PacketBytes::Whole,
        &handle,
    )
    .unwrap()
    .into_iter();
    let (mut first, mut second) = (sources.next().unwrap(), sources.next().unwrap());
    let mut burst = Burst::with_capacity(32);
    assert!(second.fill(&mut burst) && !burst.is_empty());
    drop(second);
    let mut seen = 0;
    while first.fill(&mut burst) {
        seen += burst.len();
        burst.clear();
    }
    // Run to its end, the input would give the first worker about 100,000 packets. The
    // reader stops at its next batch for the second: however the threads were scheduled,
    // it read at most the second's share of six batches of 64 bursts of 32 (one taken, four
    // queued, one being filled), about as many for the first.
    assert!(seen < 30_000, "the first worker's input went on ({seen})");
    let (_, errors) = first.finish();
    assert!(errors.is_empty(), "{errors:?}");
}

/// Workers reading a file's chunks in turn: an empty file, a file of one chunk for several
/// workers, and a file cut short (its whole records processed, the cut reported once) all
/// end without waiting forever; and a worker that stops ends the others' input.
#[test]
fn chunk_shards_end_at_the_input_end_a_fault_or_a_stop() {
    let hasher = FlowHasher::with_seed(3);
    let drain = |sources: Vec<Box<dyn BurstSource>>| -> (usize, Vec<String>) {
        let threads: Vec<_> = (sources.into_iter())
            .map(|mut source| {
                std::thread::spawn(move || {
                    let mut burst = Burst::with_capacity(32);
                    let mut seen = 0;
                    while source.fill(&mut burst) {
                        seen += burst.len();
                        burst.clear();
                    }
                    assert!(!source.fill(&mut burst), "an ended source stays ended");
                    (seen, source.finish().1)
                })
            })
            .collect();
        (threads.into_iter().map(|t| t.join().unwrap())).fold(
            (0, Vec::new()),
            |(n, mut errors), (seen, e)| {
                errors.extend(e);
                (n + seen, errors)
            },
        )
    };
    let packets = trace(5_000);
    for (n, workers) in [(0, 1), (0, 3), (10, 4), (5_000, 2)] {
        let file = MemFile::new(&packets[..n]);
        let handle = RunHandle::new(workers);
        let sources = ChunkShard::for_workers(file, 0, chunks(workers, hasher), &handle);
        assert_eq!(
            drain(sources),
            (n, Vec::new()),
            "{n} packets, {workers} workers"
        );
    }
    // Cut in the middle of the last record: the others all arrive, and the cut is said.
    let mut cut = MemFile::new(&packets);
    let whole = cut.bytes.len();
    Arc::get_mut(&mut cut).unwrap().bytes.truncate(whole - 5);
    let handle = RunHandle::new(3);
    let (seen, errors) = drain(ChunkShard::for_workers(cut, 0, chunks(3, hasher), &handle));
    assert_eq!(seen, 4_999);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].starts_with("reading memory: cut short at byte"),
        "{errors:?}"
    );
    // A worker that stops early: the other's input ends soon after (it would hang if a
    // worker waited on the stopped one's shares).
    let handle = RunHandle::new(2);
    let file = MemFile::new(&trace(50_000));
    let mut sources = ChunkShard::for_workers(file, 0, chunks(2, hasher), &handle).into_iter();
    let (first, mut second) = (sources.next().unwrap(), sources.next().unwrap());
    let first = std::thread::spawn(move || drain(vec![first]));
    assert!(second.fill(&mut Burst::with_capacity(32)));
    drop(second);
    let (seen, _) = first.join().unwrap();
    assert!(seen < 25_000, "the first worker's input went on ({seen})");
}

/// What each worker's bursts held, packet by packet: (input sequence number, time, bytes
/// held, length on the wire), and the errors the sources met.
type Held = (Vec<Vec<(u64, u64, Vec<u8>, u32)>>, Vec<String>);

/// Runs each source on a thread of its own to the input's end.
fn drain_held(sources: Vec<Box<dyn BurstSource>>) -> Held {
    let threads: Vec<_> = (sources.into_iter())
        .map(|mut source| {
            std::thread::spawn(move || {
                let mut burst = Burst::with_capacity(32);
                let mut held = Vec::new();
                while source.fill(&mut burst) {
                    for (d, data) in burst.iter() {
                        held.push((d.seq, d.ts_ns, data.to_vec(), d.orig_len));
                    }
                    burst.clear();
                }
                (held, source.finish().1)
            })
        })
        .collect();
    let mut out: Held = (Vec::new(), Vec::new());
    for t in threads {
        let (held, errors) = t.join().unwrap();
        out.0.push(held);
        out.1.extend(errors);
    }
    out
}

/// Every reader hands out every packet once, whole or its headers only as asked
/// (`PacketBytes`), in input order per worker, with its time and its length on the wire,
/// to 1 to 4 workers: workers reading chunks, with records of every size against blocks of
/// 4 KiB (records that run on into the next block by every number of bytes, and records
/// longer than one block or several, so that the blocks they cover start no record);
/// workers reading their own shards, with a reader thread ahead of each or not; and one
/// reader thread for all.
#[test]
fn readers_hand_out_every_packet_once_whole_or_its_headers() {
    let hasher = FlowHasher::with_seed(3);
    let mut packets = trace(3_000);
    for (i, (_, data)) in packets.iter_mut().enumerate() {
        // Padding after the IP packet, as Ethernet allows: the parse is the same.
        let pad = match i % 500 {
            7 => 3 * 4096 + 5,
            11 => 4096,
            _ => i % 97,
        };
        data.resize(data.len() + pad, 0xee);
    }
    let file = MemFile::new(&packets);
    let port =
        || -> Vec<(u16, Box<dyn RxPort>)> { vec![(0, Box::new(MemoryRx::new(packets.clone())))] };
    for workers in 1..=4 {
        for bytes in [PacketBytes::Whole, PacketBytes::Headers] {
            let handle = RunHandle::new(workers);
            let own = |w| OwnShard::new(port(), w, workers, hasher, bytes, &handle);
            let layouts: [(&str, Vec<Box<dyn BurstSource>>); 4] = [
                ("chunks", {
                    let config = ChunkConfig {
                        bytes,
                        ..chunks(workers, hasher)
                    };
                    ChunkShard::for_workers(file.clone(), 0, config, &handle)
                }),
                ("own shards", {
                    (0..workers)
                        .map(|w| Box::new(own(w)) as Box<dyn BurstSource>)
                        .collect()
                }),
                ("own shards read ahead", {
                    (0..workers)
                        .map(|w| {
                            let ahead = ReadAhead::spawn(Box::new(own(w)), 32, format!("r{w}"));
                            Box::new(ahead.unwrap()) as Box<dyn BurstSource>
                        })
                        .collect()
                }),
                ("one reader", {
                    ReadAhead::spawn_shared(port(), workers, hasher, 32, bytes, &handle).unwrap()
                }),
            ];
            for (layout, sources) in layouts {
                let case = format!("{layout}, {workers} workers, {bytes:?}");
                let (held, errors) = drain_held(sources);
                assert!(errors.is_empty(), "{case}: {errors:?}");
                for worker in &held {
                    assert!(worker.windows(2).all(|w| w[0].0 < w[1].0), "{case}: order");
                }
                let mut all: Vec<_> = held.iter().flatten().cloned().collect();
                all.sort_by_key(|p| p.0);
                assert_eq!(all.len(), packets.len(), "{case}");
                for (seq, ((ts, data), got)) in packets.iter().zip(&all).enumerate() {
                    assert_eq!((got.0, got.1, got.3), (seq as u64, *ts, data.len() as u32));
                    let mut parsed = stateplane_wire::Parsed::EMPTY;
                    stateplane_wire::parse_in_place(data, 0, &hasher, &mut parsed).unwrap();
                    let kept = match (bytes, usize::from(parsed.payload_offset)) {
                        (PacketBytes::Headers, headers) if headers > 0 => headers,
                        _ => data.len(),
                    };
                    assert_eq!(got.2, data[..kept], "{case}: packet {seq}");
                }
            }
        }
    }
}
