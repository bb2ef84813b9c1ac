#!/usr/bin/env bash
# What a run of conntrack holds resident against what its tables are sized for: `stateplane
# run conntrack` over an 11-packet trace at each CAPACITY (default 1,000, 1,250,000 and
# 4,194,304 connections a worker), on 1 and 2 workers, its peak resident set read by GNU
# time, beside the bytes its table claims from the memory budget as the run's summary gives
# them (every copy at full size, which is what the tables held resident before they were
# touched by need).
# Writes OUT/table-memory.csv and .svg, and prints the table.
#   scripts/table-memory.sh [OUT_DIR]   (CAPACITIES="1000 4194304" to change)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-out/table-memory}
capacities=${CAPACITIES:-1000 1250000 4194304}
bash scripts/setup.sh time >/dev/null
cargo build --release --quiet
mkdir -p "$out"
bin=target/release/stateplane
"$bin" gen internet --packets 11 --seed 1 -o "$out/trace.pcap" >/dev/null
csv="$out/table-memory.csv"
echo "workers,capacity,resident_mib" >"$csv"
printf '%9s %8s %13s %13s\n' capacity workers "resident MiB" "claimed MiB"
for c in $capacities; do
  printf '[program]\nname = "conntrack"\n[program.conntrack]\ncapacity = %d\n' "$c" >"$out/run.toml"
  for w in 1 2; do
    /usr/bin/time -f '%M' -o "$out/rss" "$bin" run -c "$out/run.toml" -i "$out/trace.pcap" \
      --workers "$w" --json >"$out/run.json"
    # The packets read, and the table's claim from the summary (every copy, whole).
    read -r rx claimed < <(python3 -c 'import json,sys
s = json.load(open(sys.argv[1]))
table = [x for x in s["memory"]["by_setting"] if x["setting"] == "program.conntrack.capacity"]
print(s["counters"]["rx_packets"], "%.1f" % (table[0]["bytes"] / 2**20))' "$out/run.json")
    [ "$rx" = 11 ] || { echo "error: the run read $rx of 11 packets" >&2; exit 1; }
    rss=$(awk '{printf "%.1f", $1 / 1024}' "$out/rss")
    printf '%9s %8s %13s %13s\n' "$c" "$w" "$rss" "$claimed"
    echo "$w workers,$c,$rss" >>"$csv"
  done
done
"$bin" chart --from "$csv" --svg "$out/table-memory.svg" \
  --title "conntrack over 11 packets: resident memory by table capacity" --unit MiB >/dev/null
echo "wrote $csv and $out/table-memory.svg"
