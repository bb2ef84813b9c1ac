#!/usr/bin/env bash
# What a packet costs conntrack as its table holds more connections: `stateplane bench`
# with forward (the baseline) and conntrack in one run per point, over generated internet
# traces of FLOWS connections (10^3 to 10^6 by default), every point's table of the same
# capacity (2,097,152 a worker) so that only the connections held change. Each run checks
# that every packet was forwarded (a connection refused for a full table would fail it).
# Writes OUT/conntrack-curve.csv and .svg, and prints the table.
#   scripts/conntrack-curve.sh [OUT_DIR]   (FLOWS="1000 10000" PACKETS=4000000 to change)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/conntrack-curve}
flows=${FLOWS:-1000 10000 100000 1000000}
packets=${PACKETS:-4000000}
cargo build --release --quiet
mkdir -p "$out"
csv="$out/conntrack-curve.csv"
echo "program,connections,ns_per_packet" >"$csv"
for f in $flows; do
  echo "  $f connections ..." >&2
  target/release/stateplane bench --programs forward,conntrack --flows "$f" \
    --packets "$packets" --capacity 2097152 --loops 3 --repeat 3 --json >"$out/bench-$f.json"
  python3 - "$out/bench-$f.json" "$f" >>"$csv" <<'PY'
import json, sys
run = json.load(open(sys.argv[1]))
for r in run["results"]:
    print(f'{r["program"]},{sys.argv[2]},{r["ns_per_packet"]:.1f}')
PY
done
python3 - "$csv" "$out" <<'PY'
import csv, json, sys
rows = list(csv.DictReader(open(sys.argv[1])))
first = json.load(open(f"{sys.argv[2]}/bench-{rows[0]['connections']}.json"))
print(f"input: {first['input']} (--flows as below); workers {first['workers']}, "
      f"loops {first['loops']}, median of {first['repeat']}")
ns = {(r["program"], r["connections"]): float(r["ns_per_packet"]) for r in rows}
print(f"{'connections':>12} {'forward ns':>11} {'conntrack ns':>13} {'conntrack - forward':>20}")
for c in dict.fromkeys(r["connections"] for r in rows):
    f, t = ns[("forward", c)], ns[("conntrack", c)]
    print(f"{int(c):>12,} {f:>11.1f} {t:>13.1f} {t - f:>20.1f}")
PY
target/release/stateplane chart --from "$csv" --svg "$out/conntrack-curve.svg" \
  --title "conntrack: ns per packet by connections held" --unit "ns/packet" >/dev/null
echo "wrote $csv and $out/conntrack-curve.svg"
