#!/usr/bin/env bash
# Instructions per packet of two builds of stateplane, from valgrind's callgrind (repeatable
# where timings are noisy on a shared machine): a base commit, built in a worktree of its
# own, against the checkout. Each case runs twice per build, on N and on 3N packets; the
# setup is the same in both, so the difference divided by 2N is one packet's cost in the
# steady loop. Cases: `bench` (the replay loop) for forward and conntrack; `bench-pipeline`
# (the rule pipeline with and without its cache: instructions per trace packet over all of
# the run's measurements); and `run` over one capture file to another (reader, dispatcher,
# worker, output stage), forward and l2learn; and `run` with a program's per-flow state
# replicated linearizably to the memory store (`replicated PROGRAM`: firewall, nat and
# counter), beside the same program unreplicated (`run PROGRAM`), so that the replication
# stage's cost a packet is the difference. The cases ending in `dc` and `kv` run on
# established flows: the datacenter workload's 1,000 flows (firewall, nat) and the kv
# workload's requests of 1,000 clients to a VIP (lb), replicated with `lease_ms` 60,000 so
# that no lease comes due under valgrind's slowdown: the stage's steady cost a packet on
# flows whose leases it holds. `synced hh` runs hh (one tenant, a sketch of 4 x 4,096) with
# its sketch synced to a `stateplane collector` the script starts on loopback, beside `run
# hh` unsynced, on 64-byte packets, with `refresh_ms` at its most and `max_age_ms` the
# default's 10, so that passes come as a synced run's do (a register takes its changes by
# marks or by comparing every cell after what the passes found). How many come depends on
# valgrind's slowdown, so that the whole run's count moves by tens of instructions a packet
# between runs; with COLLECT (below) the count is the data plane's alone, its marks
# included. The cases ending in `est` run firewall and nat on the datacenter workload's
# PACKETS as established flows (`gen --established-passes`, 2 passes against 4: the
# difference is the later passes', connections open throughout, none opened or closed),
# replicated as `dc`.
# Each run's summary is checked: every packet read is written (forward) or counted.
# Usage: scripts/callgrind-compare.sh BASE_COMMIT [PACKETS]   (default 100000)
#   CASES="replicated firewall dc;run firewall dc" picks cases (`;` between them).
#   COLLECT='*Program>::process' counts the instructions of the functions a pattern
#   names, and of what they call, alone (`synced hh`: the data plane's own, the passes
#   left out, whose count moves with how often a pass comes due under valgrind).
# Writes target/callgrind-compare.csv and target/callgrind-compare.svg; the base build
# stays in target/base-COMMIT.
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: scripts/callgrind-compare.sh BASE_COMMIT [PACKETS]}
packets=${2:-100000}
bash scripts/setup.sh valgrind
export PATH="$HOME/.cargo/bin:$PATH"

work=$(mktemp -d)
cleanup() { git worktree remove --force "$work/base" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

head=$(git rev-parse --short HEAD)
base_short=$(git rev-parse --short "$base")
echo "building $head (checkout) and $base_short (worktree)..." >&2
cargo build --release --quiet -p stateplane
git worktree add --detach --force "$work/base" "$base" >/dev/null 2>&1
# The base's build is kept in target/base-COMMIT, so that a second comparison reuses it.
base_target="$PWD/target/base-$base_short"
(cd "$work/base" && CARGO_TARGET_DIR="$base_target" cargo build --release --quiet -p stateplane) \
  || fail "the base commit did not build"
base_bin="$base_target/release/stateplane"
[ -x "$base_bin" ] || fail "the base commit did not build"
# A copy, so that a build during the run does not change what is measured.
cp target/release/stateplane "$work/stateplane-$head"
new_bin="$work/stateplane-$head"

for n in "$packets" $((3 * packets)); do
  "$new_bin" gen internet --packets "$n" --packet-size 256 --ipv6-share 0.2 --seed 1 \
    -o "$work/trace-$n.pcap" >/dev/null
  "$new_bin" gen datacenter --packets "$n" --flows 1000 --seed 1 -o "$work/dc-$n.pcap" >/dev/null
  "$new_bin" gen kv --packets "$n" --flows 1000 --ipv6-share 0 --seed 1 \
    -o "$work/kv-$n.pcap" >/dev/null
  "$new_bin" gen internet --packets "$n" --packet-size 64 --ipv6-share 0.2 --seed 1 \
    -o "$work/small-$n.pcap" >/dev/null
done
# `est`: the datacenter workload's PACKETS as established flows, 2 passes and 4
# (`gen --established-passes`): the difference is two passes of flows the switch holds,
# connections open throughout.
for passes in 2 4; do
  n=$(( passes == 2 ? packets : 3 * packets ))
  "$new_bin" gen datacenter --packets "$packets" --flows 1000 --seed 1 \
    --established-passes "$passes" --json -o "$work/est-$n.pcap" \
    | python3 -c 'import json, sys; print(json.load(sys.stdin)["packets"])' > "$work/est-packets-$n"
done

# The collector of the synced cases, on a free port of loopback, for the whole run.
collector_port=$(python3 -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$new_bin" collector --listen "127.0.0.1:$collector_port" >"$work/collector.log" 2>&1 &
collector_pid=$!
trap 'kill $collector_pid 2>/dev/null || true; cleanup' EXIT
sleep 0.5
kill -0 $collector_pid 2>/dev/null || fail "the collector did not start: $(cat "$work/collector.log")"

# Callgrind's instruction total of one command.
# With COLLECT set, only what runs inside the functions it names (callgrind's
# --toggle-collect pattern) is counted.
instructions() {
  local file="$work/cg.$RANDOM"
  valgrind --tool=callgrind --callgrind-out-file="$file" \
    ${COLLECT:+"--toggle-collect=$COLLECT"} "$@" >"$work/out.json" 2>/dev/null \
    || fail "$* failed under valgrind"
  awk '/^summary:/ {print $2}' "$file"
}

# Checks that a run's JSON summary wrote every packet it read (forward, and any program on
# `est`'s established flows, third argument `est`) or handled them all.
check_run() {
  python3 - "$work/out.json" "$1" "$2" "${3:-}" <<'PY'
import json, sys
s = json.load(open(sys.argv[1])); n = int(sys.argv[2]); program = sys.argv[3]
c = s["counters"]
assert c["rx_packets"] == n, f"read {c['rx_packets']} of {n}"
if program == "forward" or sys.argv[4] == "est":
    assert c["tx_packets"] == n, f"wrote {c['tx_packets']} of {n}"
r = s.get("replication")
if r:
    assert r["processed"] > 0 and r["dropped"] == 0, f"replication: {r}"
y = s.get("sync")
if y:
    assert y["changes"] > 0 and y["send_errors"] == 0 and y["refused"] == 0, f"sync: {y}"
PY
}

# The configuration of a program that needs one (empty: none), and its replicated state.
program_section() {
  case $1 in
    firewall) printf '[program]\nname = "firewall"\n[program.firewall]\ninside = "p0"\n' ;;
    nat) printf '[program]\nname = "nat"\n[program.nat]\ninside = "p0"\noutside = "p1"\nexternal = "198.18.255.100"\n' ;;
    counter) printf '[program]\nname = "counter"\n[program.counter]\nmap = { p0 = "p1" }\ncapacity = 1048576\n' ;;
    hh) printf '[program]\nname = "hh"\n[program.hh]\ntenants = 1\nwidth = 4096\ndepth = 4\ninterval_ms = 3600000\nmap = { p0 = "p1" }\n' ;;
    lb) printf '[program]\nname = "lb"\n[program.lb]\nclients = "p0"\nservers = "p1"\n[[program.lb.vips]]\naddress = "198.19.0.100"\nport = 9000\nproto = "udp"\nbackends = [{ address = "198.18.200.1" }, { address = "198.18.200.2" }, { address = "198.18.200.3" }, { address = "198.18.200.4" }]\n' ;;
  esac
}
replicated_state() {
  case $1 in firewall | lb) echo connections ;; nat) echo translations ;; counter) echo flows ;; esac
}

# Writes a run's configuration: PROGRAM over TRACE (port p0) to FILE, its state replicated
# to the memory store if a fourth argument is given (with a fifth, its leases that long).
config() {
  { echo "burst = 64"
    program_section "$1"
    printf '[[port]]\nname = "p0"\nrx = "%s"\n[[port]]\nname = "p1"\n' "$2"
    if [ -n "${4:-}" ]; then
      printf '[guarantees]\n%s = ["replicated"]\n' "$(replicated_state "$1")"
    fi
    if [ -n "${5:-}" ]; then
      printf '[replication]\nlease_ms = %s\n' "$5"
    fi
    if [ -n "${6:-}" ]; then
      printf '[guarantees]\nsketch = ["synced"]\n[sync]\ncollector = "127.0.0.1:%s"\n' "$6"
      printf 'refresh_ms = 3600000\n'
    fi
  } > "$3"
}

# Instructions a packet: the two runs' difference over the packets between them.
per_packet() { awk -v a="$1" -v b="$2" -v n="$3" 'BEGIN {printf "%.1f", (b - a) / n}'; }

csv=target/callgrind-compare.csv
echo "case,base_commit,base_instructions_per_packet,commit,instructions_per_packet,ratio" > "$csv"
echo "input: stateplane gen internet --packets $packets and $((3 * packets)) --packet-size 256 --ipv6-share 0.2 --seed 1 (cases ending in dc: gen datacenter --flows 1000 --seed 1; est: gen datacenter --packets $packets --flows 1000 --seed 1 --established-passes 2 and 4; kv: gen kv --flows 1000 --ipv6-share 0 --seed 1; small: gen internet --packet-size 64 --ipv6-share 0.2 --seed 1); 1 worker, burst 64"
printf '%-24s %12s %12s %8s\n' case "$base_short" "$head" ratio
all_cases="bench forward;bench conntrack;bench-pipeline internet;run forward;run l2learn"
all_cases+=";run firewall;replicated firewall;run nat;replicated nat;run counter;replicated counter"
all_cases+=";run firewall dc;replicated firewall dc;run nat dc;replicated nat dc;run lb kv;replicated lb kv"
all_cases+=";run firewall est;replicated firewall est;run nat est;replicated nat est"
all_cases+=";run hh small;synced hh small"
IFS=';' read -r -a cases <<< "${CASES:-$all_cases}"
for case in "${cases[@]}"; do
  set -- $case
  kind=$1 program=$2 trace=${3:-trace} lease=
  [ "$trace" = trace ] || [ "$trace" = small ] || lease=60000
  # The packets each size's trace holds (`est`: as its passes came out).
  counts=("$packets" $((3 * packets)))
  if [ "$trace" = est ]; then
    counts=("$(cat "$work/est-packets-$packets")" "$(cat "$work/est-packets-$((3 * packets))")")
  fi
  row=()
  for bin in "$base_bin" "$new_bin"; do
    totals=()
    for n in "$packets" $((3 * packets)); do
      loops=$(( n / packets ))
      read_n=${counts[$((loops / 3))]}
      if [ "$kind" = bench ]; then
        totals+=("$(instructions "$bin" bench --packets "$packets" --loops "$loops" --repeat 1 \
          --programs "$program" --no-hugepages)")
      elif [ "$kind" = bench-pipeline ]; then
        totals+=("$(instructions "$bin" bench-pipeline --workloads "$program" --packets "$packets" \
          --loops "$loops" --repeat 1 --modes action --update-rates 0 --tables 2 \
          --acl-rules 200 --fib-prefixes 10000)")
      elif [ "$kind" = synced ]; then
        config "$program" "$work/$trace-$n.pcap" "$work/run.toml" "" "" "$collector_port"
        totals+=("$(instructions "$bin" run -c "$work/run.toml" --json)")
        check_run "$read_n" "$program" "$trace" || fail "$case: the run did not handle every packet"
      elif [ "$kind" = replicated ]; then
        config "$program" "$work/$trace-$n.pcap" "$work/run.toml" replicated "$lease"
        totals+=("$(instructions "$bin" run -c "$work/run.toml" --json)")
        check_run "$read_n" "$program" "$trace" || fail "$case: the run did not handle every packet"
      elif [ -n "$(program_section "$program")" ]; then
        config "$program" "$work/$trace-$n.pcap" "$work/run.toml"
        totals+=("$(instructions "$bin" run -c "$work/run.toml" --json)")
        check_run "$read_n" "$program" "$trace" || fail "$case: the run did not handle every packet"
      else
        totals+=("$(instructions "$bin" run "$program" -i "$work/trace-$n.pcap" \
          -o "$work/out.pcap" --workers 1 --hash-seed 1 --json)")
        check_run "$read_n" "$program" "$trace" || fail "$case: the run did not handle every packet"
      fi
    done
    row+=("$(per_packet "${totals[0]}" "${totals[1]}" $(( counts[1] - counts[0] )))")
  done
  ratio=$(awk -v a="${row[0]}" -v b="${row[1]}" 'BEGIN {printf "%.3f", b / a}')
  printf '%-24s %12s %12s %8s\n' "$case" "${row[0]}" "${row[1]}" "$ratio"
  echo "$case,$base_short,${row[0]},$head,${row[1]},$ratio" >> "$csv"
done
python3 - "$csv" target/callgrind-compare.svg <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
w, bar, gap, left = 640, 14, 10, 130
top = 40
h = top + len(rows) * (2 * bar + gap) + 30
peak = max(max(float(r["base_instructions_per_packet"]), float(r["instructions_per_packet"])) for r in rows)
scale = (w - left - 80) / peak
out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
       f'<text x="10" y="20" font-size="14">instructions per packet (callgrind): {rows[0]["base_commit"]} (grey) and {rows[0]["commit"]} (blue)</text>']
y = top
for r in rows:
    out.append(f'<text x="10" y="{y + bar + 4}">{r["case"]}</text>')
    for key, colour in (("base_instructions_per_packet", "#999"), ("instructions_per_packet", "#36c")):
        v = float(r[key])
        out.append(f'<rect x="{left}" y="{y}" width="{v * scale:.1f}" height="{bar - 2}" fill="{colour}"/>')
        out.append(f'<text x="{left + v * scale + 4:.1f}" y="{y + bar - 4}">{v:.0f}</text>')
        y += bar
    y += gap
out.append('</svg>')
open(sys.argv[2], "w").write("\n".join(out))
PY
echo "wrote $csv and target/callgrind-compare.svg"
