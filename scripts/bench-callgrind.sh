#!/usr/bin/env bash
# Instructions per packet of each benchmark program, from valgrind's callgrind (repeatable
# where timings are noisy). Each program runs twice under callgrind, replaying the trace 1
# and 3 times; setup (trace generation, sharding) is the same in both, so the difference
# divided by 2 x packets is the cost of one packet in the steady loop.
# Usage: scripts/bench-callgrind.sh [PACKETS]   (default 200000; writes target/callgrind.csv)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh valgrind
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --quiet
packets=${1:-200000}
sp=target/release/stateplane
out=target/callgrind.csv
echo "program,packets,instructions_per_packet" > "$out"
echo "input: stateplane gen internet --packets $packets --packet-size 64 --ipv6-share 0 --seed 1; 1 worker, burst 64"
printf '%-10s %22s\n' program instructions/packet
programs=(rx forward l2 router conntrack)
for i in "${!programs[@]}"; do
  program=${programs[$i]}
  echo "[$((i + 1))/${#programs[@]}] $program under callgrind, replaying 1 and 3 times" >&2
  total() {
    local file=target/callgrind.$program.$1
    valgrind --tool=callgrind --callgrind-out-file="$file" "$sp" bench --packets "$packets" \
      --loops "$1" --repeat 1 --programs "$program" >/dev/null 2>&1
    awk '/^summary:/ {print $2}' "$file"
  }
  one=$(total 1)
  three=$(total 3)
  per=$(awk -v a="$one" -v b="$three" -v n="$packets" 'BEGIN {printf "%.1f", (b - a) / (2 * n)}')
  printf '%-10s %22s\n' "$program" "$per"
  echo "$program,$packets,$per" >> "$out"
done
