#!/usr/bin/env bash
# A soak: a live switch running `conntrack` (65,536 connections a worker) between two lab
# hosts, under a mix of ordinary traffic and TCP SYN and UDP floods from spoofed sources
# for SECONDS (default 60; the long mode is hours: scripts/soak.sh 14400). Its resident
# memory is sampled every second; the run fails unless memory is flat once the tables have
# filled (at the end no more than 10% or 8 MiB above its level a fifth of the way in) and
# the switch forwarded traffic throughout. Writes target/soak/soak.csv (seconds, RSS in
# KiB, packets received) and target/soak/soak.svg, and prints a table.
#
# Root only (network namespaces); sends only inside the lab it makes (198.18.0.0/15, no
# route out), and removes it at the end.
set -Eeuo pipefail
trap 'echo "FAIL: line $LINENO: \`$BASH_COMMAND\` exited $?" >&2' ERR
cd "$(dirname "$0")/.."
seconds=${1:-60}
[ "$seconds" -ge 10 ] || { echo "give at least 10 seconds" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "error: the soak makes network namespaces: run as root" >&2; exit 1; }
# The build profile: release, or the suite's when scripts/test.sh runs it (Cargo.toml).
profile=${STATEPLANE_PROFILE:-release}
sp=$PWD/target/$profile/stateplane
cargo build --profile "$profile" --quiet
out=$PWD/target/soak
rm -rf "$out"
mkdir -p "$out"
cat >"$out/soak.toml" <<'EOF'
# h1 - s1 - h2, s1 tracking connections (the soak's lab).
name = "soak"

[[host]]
name = "h1"

[[host]]
name = "h2"

[[switch]]
name = "s1"
workers = 1
[switch.program]
name = "conntrack"
[switch.program.conntrack]
capacity = 65536

[[link]]
a = { node = "h1", iface = "eth0", addr = "198.18.0.1/24", mac = "02:00:00:00:01:01" }
b = { node = "s1", iface = "p0" }

[[link]]
a = { node = "s1", iface = "p1" }
b = { node = "h2", iface = "eth0", addr = "198.18.0.2/24", mac = "02:00:00:00:01:02" }
EOF
lab="$out/soak.toml"
senders=()
cleanup() {
  for p in "${senders[@]}"; do kill "$p" 2>/dev/null || true; done
  "$sp" lab down "$lab" >/dev/null 2>&1 || true
}
trap cleanup EXIT
# Traces: flows of every size, and floods of spoofed sources (each packet a new flow).
"$sp" gen internet --packets 200000 --seed 11 -o "$out/internet.pcap" >/dev/null
"$sp" gen synflood --packets 200000 --seed 12 --attack-share 0.9 -o "$out/synflood.pcap" >/dev/null
"$sp" gen udpflood --packets 200000 --seed 13 --attack-share 0.9 -o "$out/udpflood.pcap" >/dev/null
"$sp" lab up "$lab" >/dev/null
pid=$(ip netns pids sp-soak-s1 | while read -r p; do
  [ "$(cat "/proc/$p/comm" 2>/dev/null)" = stateplane ] && echo "$p"
done | head -1)
[ -n "$pid" ] || { echo "FAIL: the switch of the soak's lab is not running" >&2; exit 1; }
for trace in internet synflood udpflood; do
  ip netns exec sp-soak-h1 timeout $((seconds + 10)) "$sp" send "$out/$trace.pcap" -I eth0 \
    --seconds "$seconds" --loops 1000000 --dst-mac 02:00:00:00:01:02 >"$out/send-$trace.log" 2>&1 &
  senders+=($!)
done
rx() {
  ip netns exec sp-soak-s1 python3 -c '
import urllib.request
text = urllib.request.urlopen("http://127.0.0.1:9464/metrics", timeout=2).read().decode()
print(sum(int(float(l.split()[-1])) for l in text.splitlines()
          if l.startswith("stateplane_rx_packets_total{")))' 2>/dev/null || echo 0
}
echo "seconds,rss_kib,rx_packets" >"$out/soak.csv"
for t in $(seq 0 "$seconds"); do
  rss=$(awk '/^VmRSS:/ {print $2}' "/proc/$pid/status" 2>/dev/null || echo "")
  [ -n "$rss" ] || { echo "FAIL: the switch ended during the soak (at $t s); its log is in the lab's state directory" >&2; exit 1; }
  echo "$t,$rss,$(rx)" >>"$out/soak.csv"
  [ $((t % 10)) -ne 0 ] || echo "  $t s: RSS $rss KiB" >&2
  sleep 1
done
for p in "${senders[@]}"; do wait "$p" || true; done
senders=()
python3 - "$out" "$seconds" <<'EOF'
import csv, sys
out, seconds = sys.argv[1], int(sys.argv[2])
rows = [(int(r["seconds"]), int(r["rss_kib"]), int(r["rx_packets"]))
        for r in csv.DictReader(open(f"{out}/soak.csv"))]
warm = rows[len(rows) // 5]
start, end = rows[0], rows[-1]
peak = max(r[1] for r in rows)
print(f"{'':24}{'seconds':>10}{'RSS KiB':>12}{'packets':>14}")
for name, r in (("start", start), ("a fifth of the way in", warm), ("end", end)):
    print(f"{name:24}{r[0]:>10}{r[1]:>12}{r[2]:>14}")
print(f"{'peak RSS KiB':24}{'':>10}{peak:>12}")
# The plot: RSS over time, a plain SVG polyline.
w, h, pad = 640, 320, 50
tmax = max(r[0] for r in rows) or 1
ymax = peak * 1.1
pts = " ".join(f"{pad + r[0] / tmax * (w - 2 * pad):.1f},{h - pad - r[1] / ymax * (h - 2 * pad):.1f}" for r in rows)
svg = f'''<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">
<rect width="{w}" height="{h}" fill="white"/>
<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>
<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>
<text x="{w / 2}" y="{h - 15}" text-anchor="middle">seconds (0 to {tmax})</text>
<text x="10" y="{pad - 10}">RSS of the switch, KiB (0 to {int(ymax)})</text>
<polyline fill="none" stroke="steelblue" stroke-width="2" points="{pts}"/>
</svg>
'''
open(f"{out}/soak.svg", "w").write(svg)
limit = max(warm[1] * 1.10, warm[1] + 8192)
if end[1] > limit:
    sys.exit(f"FAIL: memory grew: {end[1]} KiB at the end against {warm[1]} KiB a fifth of the way in")
if end[2] <= warm[2] or warm[2] <= start[2]:
    sys.exit("FAIL: the switch did not receive traffic throughout the soak")
print(f"memory flat: {end[1]} KiB at the end, {warm[1]} KiB a fifth of the way in; "
      f"{out}/soak.csv and soak.svg")
EOF
