#!/usr/bin/env bash
# End-to-end flow export from a capture file (in the page cache) to IPFIX on loopback:
# stateplane flows (1 and 2 workers, in each reading layout) side by side with softflowd and
# nfpcapd from Debian, interleaved over ROUNDS rounds on the same file; prints the median
# packets per second, the ratio to softflowd (of the medians, and the median of the rounds'
# own ratios), the CPU time (user + system, every thread) and the peak memory (max RSS) of
# each, and what a second worker gives; writes a CSV and a bar chart (SVG) beside it.
#   PACKETS=5000000 ROUNDS=3 OUT=docs/bench/flow-exporters.csv scripts/compare-flow-exporters.sh
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh softflowd nfcapd:nfdump time:time >/dev/null
export PATH="$HOME/.cargo/bin:$PATH"
packets=${PACKETS:-5000000}
rounds=${ROUNDS:-3}
out=${OUT:-}
bin=$PWD/target/release/stateplane
# Always: a binary left from before a change would run in its place (a no-op when
# it is up to date).
cargo build --release --quiet
work=$(mktemp -d /tmp/stateplane-exporters.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  # nfcapd writes its last file as it exits: wait for it before removing its folder.
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

trace="$work/trace.pcap"
echo "trace: stateplane gen internet --packets $packets --packet-size 64 --ipv6-share 0.2 --seed 1"
"$bin" gen internet --packets "$packets" --packet-size 64 --ipv6-share 0.2 --seed 1 -o "$trace" >/dev/null 2>&1
# The same packets as pcapng (what dumpcap and tshark write), for the pcapng rows.
"$bin" gen internet --packets "$packets" --packet-size 64 --ipv6-share 0.2 --seed 1 -o "$work/trace.pcapng" >/dev/null 2>&1
# Into the page cache, and again before every run: the machines here shed page-cache pages
# of files read earlier even with memory free (fincore showed a quarter of a trace gone
# after other files were written), and a run that reads from the disk measures the disk.
warm() { dd if=trace.pcap of=/dev/null bs=1M status=none; dd if=trace.pcapng of=/dev/null bs=1M status=none; }

port=$((20000 + RANDOM % 20000))
mkdir -p "$work/nf"
nfcapd -w "$work/nf" -p "$port" -b 127.0.0.1 -B 33554432 >"$work/nfcapd.log" 2>&1 &
pids+=($!)
sleep 1

# Name and command, run in $work with relative paths (softflowd 1.1.0 cuts a long -r path
# short); wall time and max RSS come from time(1). Timeouts as close as each allows to
# ours (15 s inactive, 1800 s active); tables large enough for the trace. Nobody paces:
# softflowd and nfpcapd do not, so ours runs with --ipfix-rate 0 here.
cd "$work"
declare -A cmd
cmd[softflowd]="softflowd -r trace.pcap -n 127.0.0.1:$port -v 10 -6 -m 1048576 -d -p sf.pid -c sf.ctl"
cmd[nfpcapd]="nfpcapd -r trace.pcap -w nfp -e 1800,15"
cmd[stateplane-1w]="$bin flows -i trace.pcap --ipfix 127.0.0.1:$port --workers 1 --ipfix-rate 0"
cmd[stateplane-2w]="$bin flows -i trace.pcap --ipfix 127.0.0.1:$port --workers 2 --ipfix-rate 0"
# The defaults (auto) are a reader thread for one worker, and the file's chunks read by
# the workers in turn for two. The other layouts: one worker reading chunks (the one-worker
# end of the chunks' scaling), two workers with one reader thread for both, and workers
# each reading the whole file for themselves with no reader thread (off).
cmd[stateplane-1w-chunks]="${cmd[stateplane-1w]} --read-ahead chunks"
cmd[stateplane-2w-shared]="${cmd[stateplane-2w]} --read-ahead on"
cmd[stateplane-1w-off]="${cmd[stateplane-1w]} --read-ahead off"
cmd[stateplane-2w-off]="${cmd[stateplane-2w]} --read-ahead off"
# The chunks' scaling without a collector on the same two cores: the same IPFIX, written
# to a file instead of sent to nfcapd.
chunks_to_file="$bin flows -i trace.pcap --ipfix-file out.ipfix --read-ahead chunks --workers"
cmd[stateplane-1w-chunks-file]="$chunks_to_file 1"
cmd[stateplane-2w-chunks-file]="$chunks_to_file 2"
# pcapng: the defaults (chunks for two workers, with the interfaces carried from chunk to
# chunk), and one reader thread for both (what two workers did on pcapng before).
cmd[stateplane-1w-pcapng]="${cmd[stateplane-1w]/trace.pcap/trace.pcapng}"
cmd[stateplane-2w-pcapng]="${cmd[stateplane-2w]/trace.pcap/trace.pcapng}"
cmd[stateplane-2w-pcapng-shared]="${cmd[stateplane-2w-pcapng]} --read-ahead on"
# Messages of Ethernet's size (--mtu 1400, what every message was before --mtu auto made
# them as large as loopback carries), and those with UDP segmentation offload
# (--ipfix-gso, off by default: captures on the sending host show the unsegmented sends),
# which joins only messages that small: the defaults and the one-worker end of the chunks.
for n in stateplane-1w stateplane-2w stateplane-1w-chunks; do
  cmd[$n-1400]="${cmd[$n]} --mtu 1400"
  cmd[$n-gso]="${cmd[$n]} --mtu 1400 --ipfix-gso"
done
names=(softflowd nfpcapd stateplane-1w stateplane-2w stateplane-1w-chunks stateplane-2w-shared
  stateplane-1w-off stateplane-2w-off stateplane-1w-chunks-file stateplane-2w-chunks-file
  stateplane-1w-pcapng stateplane-2w-pcapng stateplane-2w-pcapng-shared
  stateplane-1w-1400 stateplane-2w-1400 stateplane-1w-chunks-1400
  stateplane-1w-gso stateplane-2w-gso stateplane-1w-chunks-gso)
declare -A secs mem cpu
for r in $(seq "$rounds"); do
  for n in "${names[@]}"; do
    rm -rf nfp; mkdir -p nfp
    warm
    # shellcheck disable=SC2086
    timeout 600 /usr/bin/time -f "%e %M %U %S" -o time ${cmd[$n]} >"$n.log" 2>&1 \
      || { tail -5 "$n.log" >&2; echo "error: $n failed" >&2; exit 1; }
    read -r s m u k <time
    c=$(python3 -c "print($u + $k)")
    secs[$n]="${secs[$n]:-} $s"; mem[$n]="${mem[$n]:-} $m"; cpu[$n]="${cpu[$n]:-} $c"
    printf "  round %d %-26s %6.2f s  %5.2f s CPU  %7d KiB\n" "$r" "$n" "$s" "$c" "$m"
  done
done

cd - >/dev/null
python3 - "$packets" "$out" "${names[@]}" <<PY
import statistics, sys
packets, out, names = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
secs = {$(for n in "${names[@]}"; do printf '"%s": [%s], ' "$n" "$(echo ${secs[$n]} | tr ' ' ',')"; done)}
mem = {$(for n in "${names[@]}"; do printf '"%s": [%s], ' "$n" "$(echo ${mem[$n]} | tr ' ' ',')"; done)}
cpu = {$(for n in "${names[@]}"; do printf '"%s": [%s], ' "$n" "$(echo ${cpu[$n]} | tr ' ' ',')"; done)}
rows = []
base = packets / statistics.median(secs["softflowd"])
print(f"{'exporter':<27}{'median s':>10}{'Mpps':>8}{'vs softflowd':>14}{'per round':>11}{'CPU s':>8}{'peak MiB':>10}")
for n in names:
    s = statistics.median(secs[n]); pps = packets / s
    per_round = statistics.median(a / b for a, b in zip(secs["softflowd"], secs[n]))
    c = statistics.median(cpu[n])
    m = max(mem[n]) / 1024
    rows.append((n, s, pps / 1e6, pps / base, per_round, c, m))
    print(f"{n:<27}{s:>10.2f}{pps/1e6:>8.2f}{pps/base:>13.1f}x{per_round:>10.1f}x{c:>8.2f}{m:>10.0f}")
def ratio(one, two):
    per_round = statistics.median(a / b for a, b in zip(secs[one], secs[two]))
    return f"{statistics.median(secs[one]) / statistics.median(secs[two]):.2f}x (per round {per_round:.2f}x)"
print("second worker:"
      f" chunks {ratio('stateplane-1w-chunks', 'stateplane-2w')};"
      f" chunks to a file {ratio('stateplane-1w-chunks-file', 'stateplane-2w-chunks-file')};"
      f" off {ratio('stateplane-1w-off', 'stateplane-2w-off')};"
      f" defaults {ratio('stateplane-1w', 'stateplane-2w')};"
      f" pcapng defaults {ratio('stateplane-1w-pcapng', 'stateplane-2w-pcapng')};"
      f" pcapng chunks against one reader for both"
      f" {ratio('stateplane-2w-pcapng-shared', 'stateplane-2w-pcapng')};"
      f" with --mtu 1400: chunks {ratio('stateplane-1w-chunks-1400', 'stateplane-2w-1400')},"
      f" defaults {ratio('stateplane-1w-1400', 'stateplane-2w-1400')};"
      f" with --mtu 1400 --ipfix-gso: chunks {ratio('stateplane-1w-chunks-gso', 'stateplane-2w-gso')},"
      f" defaults {ratio('stateplane-1w-gso', 'stateplane-2w-gso')}")
if out:
    bar, width = 22, 640
    top = max(r[2] for r in rows)
    svg = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{bar * len(rows) + 50}"'
           ' font-family="sans-serif" font-size="12">',
           f'<text x="10" y="18">Flow export, {packets:,} packets to IPFIX on loopback'
           ' (-file: to a file): Mpps, median</text>']
    for i, r in enumerate(rows):
        y, w = 30 + i * bar, (width - 330) * r[2] / top
        svg.append(f'<text x="10" y="{y + 14}">{r[0]}</text>')
        svg.append(f'<rect x="200" y="{y + 2}" width="{w:.1f}" height="{bar - 6}" fill="#4878a8"/>')
        # The -file rows send to no collector: their ratio to softflowd would not compare.
        label = f"{r[2]:.2f}" + ("" if r[0].endswith("-file") else f" ({r[3]:.1f}x softflowd)")
        svg.append(f'<text x="{205 + w:.1f}" y="{y + 14}">{label}</text>')
    svg.append("</svg>")
    with open(out.rsplit(".", 1)[0] + ".svg", "w") as f:
        f.write("\n".join(svg) + "\n")
    with open(out, "w") as f:
        f.write("exporter,median_s,mpps,vs_softflowd,vs_softflowd_per_round,cpu_s,peak_mib,packets\n")
        for r in rows:
            f.write(f"{r[0]},{r[1]:.3f},{r[2]:.3f},{r[3]:.2f},{r[4]:.2f},{r[5]:.2f},{r[6]:.0f},{packets}\n")
PY
