#!/usr/bin/env bash
# What keeps a second worker from doubling the flow export, split by Amdahl's law: for
# traces of the same flows and more and more packets, runs `stateplane flows` reading the
# file's chunks with 1 and with 2 workers (IPFIX to a file, so that no collector shares
# the two cores), interleaved over ROUNDS rounds, and from the medians T1 and T2 works
# out the serial time S = 2 T2 - T1 and the parallel time P = 2 (T1 - T2) of each length
# (T1 = S + P, T2 = S + P/2). A serial part that stays put while P grows is a fixed cost
# of a run (start, final flush, exit), and the ratio T1/T2 tends to 2 with longer traces;
# one that grows with the packets is work that does not scale: a per-packet cost of the
# second worker, or the exporter thread's CPU, which one worker leaves a core for and two
# must share theirs with (its records, and the file's bytes, grow with the trace).
# Prints a table, writes a CSV and an SVG of the ratio against the packets.
#   LENGTHS="2500000 5000000 10000000 20000000" FLOWS=250000 ROUNDS=5 \
#     OUT=docs/bench/scaling-serial.csv scripts/scaling-serial.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh time:time >/dev/null
export PATH="$HOME/.cargo/bin:$PATH"
lengths=(${LENGTHS:-2500000 5000000 10000000 20000000})
flows=${FLOWS:-250000}
rounds=${ROUNDS:-5}
out=${OUT:-}
bin=$PWD/target/release/stateplane
# Always: a binary left from before a change would run in its place (a no-op when
# it is up to date).
cargo build --release --quiet
work=$(mktemp -d /tmp/stateplane-scaling.XXXXXX)
trap 'rm -rf "$work"' EXIT

for n in "${lengths[@]}"; do
  # A trace shorter than FLOWS packets (the run's fixed cost) has a flow a packet.
  f=$((n < flows ? n : flows))
  echo "trace $n: stateplane gen internet --packets $n --flows $f --packet-size 64 --ipv6-share 0.2 --seed 1"
  "$bin" gen internet --packets "$n" --flows "$f" --packet-size 64 --ipv6-share 0.2 --seed 1 \
    -o "$work/t$n.pcap" >"$work/log" 2>&1 || { cat "$work/log" >&2; exit 1; }
done

for r in $(seq "$rounds"); do
  for n in "${lengths[@]}"; do
    for w in 1 2; do
      # Into the page cache before every run (the machines here shed it; see
      # compare-flow-exporters.sh).
      dd if="$work/t$n.pcap" of=/dev/null bs=1M status=none
      timeout 600 /usr/bin/time -f "%e %U %S" -o "$work/time" "$bin" flows -i "$work/t$n.pcap" \
        --ipfix-file "$work/out.ipfix" --read-ahead chunks --workers "$w" >"$work/log" 2>&1 \
        || { tail -5 "$work/log" >&2; echo "error: $n packets, $w workers failed" >&2; exit 1; }
      read -r s u k <"$work/time"
      echo "$n $w $s $u $k" >>"$work/times"
      printf "  round %d  %9d packets  %d worker(s)  %5.2f s\n" "$r" "$n" "$w" "$s"
    done
  done
done

python3 - "$flows" "$out" "$work/times" "${lengths[@]}" <<'PY'
import collections, statistics, sys
flows, out, times, lengths = int(sys.argv[1]), sys.argv[2], sys.argv[3], [int(a) for a in sys.argv[4:]]
secs, cpu = collections.defaultdict(list), collections.defaultdict(list)
for line in open(times):
    n, w, s, u, k = line.split()
    secs[int(n), int(w)].append(float(s))
    cpu[int(n), int(w)].append(float(u) + float(k))
short = sorted({n for (n, w), v in secs.items() if min(v) <= 0})
if short:
    sys.exit(f"error: the runs of {', '.join(map(str, short))} packets took under 10 ms, "
             "below what time(1) measures: give LENGTHS of 1000000 packets or more")
rows = []
print(f"{'packets':>10}{'T1 s':>8}{'T2 s':>8}{'T1/T2':>8}{'per round':>11}{'serial s':>10}{'parallel s':>12}{'CPU1 s':>8}{'CPU2 s':>8}")
for n in lengths:
    t1, t2 = statistics.median(secs[n, 1]), statistics.median(secs[n, 2])
    per_round = statistics.median(a / b for a, b in zip(secs[n, 1], secs[n, 2]))
    serial, parallel = 2 * t2 - t1, 2 * (t1 - t2)
    c1, c2 = statistics.median(cpu[n, 1]), statistics.median(cpu[n, 2])
    rows.append((n, t1, t2, t1 / t2, per_round, serial, parallel, c1, c2))
    print(f"{n:>10}{t1:>8.2f}{t2:>8.2f}{t1/t2:>7.2f}x{per_round:>10.2f}x{serial:>10.3f}{parallel:>12.3f}{c1:>8.2f}{c2:>8.2f}")
if out:
    with open(out, "w") as f:
        f.write("packets,flows,t1_s,t2_s,ratio,ratio_per_round,serial_s,parallel_s,cpu1_s,cpu2_s\n")
        for r in rows:
            f.write(f"{r[0]},{flows},{r[1]:.3f},{r[2]:.3f},{r[3]:.3f},{r[4]:.3f},{r[5]:.3f},{r[6]:.3f},{r[7]:.2f},{r[8]:.2f}\n")
    w, h, left, bottom = 560, 300, 60, 250
    big = max(r[0] for r in rows)
    top = max([2.0] + [r[3] for r in rows])  # 2x, or a ratio above it (caches can give one)
    x = lambda n: left + (w - left - 20) * n / big
    y = lambda v: bottom - (bottom - 40) * v / top
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<text x="10" y="18">Second worker: T1/T2 (chunks, IPFIX to a file), {flows:,} flows, median</text>',
           f'<line x1="{left}" y1="{bottom}" x2="{w - 20}" y2="{bottom}" stroke="black"/>',
           f'<line x1="{left}" y1="{bottom}" x2="{left}" y2="40" stroke="black"/>',
           f'<line x1="{left}" y1="{y(2):.1f}" x2="{w - 20}" y2="{y(2):.1f}" stroke="#aaa" stroke-dasharray="4"/>',
           f'<text x="{left - 30}" y="{y(2) + 4:.1f}">2x</text><text x="{left - 30}" y="{y(1) + 4:.1f}">1x</text>',
           f'<text x="{w / 2 - 40:.0f}" y="{h - 15}">packets (max {big:,})</text>']
    pts = " ".join(f"{x(r[0]):.1f},{y(r[3]):.1f}" for r in rows)
    svg.append(f'<polyline points="{pts}" fill="none" stroke="#4878a8" stroke-width="2"/>')
    for r in rows:
        svg.append(f'<circle cx="{x(r[0]):.1f}" cy="{y(r[3]):.1f}" r="3" fill="#4878a8"/>')
        svg.append(f'<text x="{x(r[0]) + 4:.1f}" y="{y(r[3]) - 6:.1f}">{r[3]:.2f}x</text>')
    svg.append("</svg>")
    with open(out.rsplit(".", 1)[0] + ".svg", "w") as f:
        f.write("\n".join(svg) + "\n")
PY
