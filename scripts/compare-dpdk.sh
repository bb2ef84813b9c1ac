#!/usr/bin/env bash
# Stateplane against DPDK's own tools on one core, in one run, each side's work checked:
#
# * classification: DPDK's ACL library (`dpdk-test-acl`, its default vector code and its
#   scalar code) and Stateplane's classifier (`bench-pipeline`'s `lookup` row, cache off)
#   on the same ACL_RULES (500) ClassBench-like rules and a default, over the keys of the
#   same PACKETS (2,000,000) packets of the `internet` workload. Before any timing, every
#   one of DPDK's verdicts is compared with the rule Stateplane matches for that key
#   (`bench-pipeline --write-classbench` writes both); one difference and the script fails.
# * forwarding: `dpdk-testpmd` replaying REPLAY_PACKETS (200,000; net_pcap holds the trace
#   in its packet buffers) from memory on one port looped back (`io`: packets passed on
#   untouched; `5tswap`: addresses and ports swapped), against Stateplane's `bench
#   --programs forward,conntrack` replaying the same capture (every packet parsed and
#   hashed; the bench fails unless every packet is forwarded).
#
# testpmd's rate is the median of its per-second receive rates over SECONDS_MEASURED (10),
# after a warm-up. Needs root for the huge pages (set to 512 and put back on exit); DPDK's
# tools run with --no-pci, touching no device of the machine. Installs dpdk-dev (which
# has both tools) when missing. Writes OUT (default out/compare-dpdk.csv) and an SVG
# chart beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh dpdk-testpmd:dpdk-dev dpdk-test-acl:dpdk-dev
source scripts/dpdk-env.sh

packets=${PACKETS:-2000000}
replay=${REPLAY_PACKETS:-200000}
acl=${ACL_RULES:-500}
seconds=${SECONDS_MEASURED:-10}
rounds=${ROUNDS:-3}
out=${OUT:-out/compare-dpdk.csv}
mkdir -p "$(dirname "$out")"
dir=$(mktemp -d /tmp/sp-dpdk.XXXXXX)
cleanup() {
  huge_pages_restore
  rm -rf "$dir"
}
trap cleanup EXIT
huge_pages 512
eal=(--no-pci --log-level=lib.eal:error --file-prefix "sp-dpdk-$$")
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) exit 1; print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

echo "== rules and traces"
$sp gen internet --packets "$packets" --packet-size 64 --ipv6-share 0 --seed 1 -o "$dir/trace.pcap" | tail -1
$sp gen internet --packets "$replay" --packet-size 64 --ipv6-share 0 --seed 1 -o "$dir/replay.pcap" | tail -1
$sp bench-pipeline --write-rules "$dir/rules2.txt" --acl-rules "$acl" --fib-prefixes 500
grep '^table=0' "$dir/rules2.txt" | sed 's/goto_table:1/output:1/' > "$dir/acl.txt"
$sp bench-pipeline --trace "$dir/trace.pcap" --rules-file "$dir/acl.txt" --write-classbench "$dir/cb"
keys=$(wc -l < "$dir/cb/trace")

echo "== DPDK ACL: every verdict against Stateplane's"
dpdk-test-acl "${eal[@]}" -l 0 -- --rulesf="$dir/cb/rules" --tracef="$dir/cb/trace" \
  --tracenum="$keys" --iter=1 --verbose=3 | awk '/^ipv4_5tuple:/ { print $6 }' > "$dir/cb/dpdk"
[ "$(wc -l < "$dir/cb/dpdk")" -eq "$keys" ] || { echo "error: dpdk-test-acl gave $(wc -l < "$dir/cb/dpdk") results for $keys keys" >&2; exit 1; }
differ=$(paste -d' ' "$dir/cb/dpdk" "$dir/cb/expected" | awk '$1 != $2' | wc -l)
[ "$differ" -eq 0 ] || { echo "error: $differ of $keys verdicts differ between DPDK's ACL and Stateplane" >&2; exit 1; }
echo "all $keys verdicts agree"

declare -A acl_rate
for alg in default scalar; do
  code=()
  [ "$alg" = scalar ] && code=(--alg=scalar)
  for _ in $(seq "$rounds"); do
    dpdk-test-acl "${eal[@]}" -l 0 -- --rulesf="$dir/cb/rules" --tracef="$dir/cb/trace" \
      --tracenum="$keys" --iter=5 --verbose=1 "${code[@]}" \
      | grep -oE '[0-9.]+ pkt/sec' | awk '{ printf "%.3f\n", $1 / 1e6 }'
  done > "$dir/acl-$alg"
  acl_rate[$alg]=$(median < "$dir/acl-$alg")
  echo "DPDK ACL ($alg code): ${acl_rate[$alg]} M lookups/s (median of $rounds)"
done

echo "== Stateplane's classifier, cache off, same rules and keys"
$sp bench-pipeline --trace "$dir/trace.pcap" --rules-file "$dir/acl.txt" --modes off \
  --update-rates 0 --repeat "$rounds" --csv "$dir/sp-acl.csv" | tail -3
sp_lookups=$(awk -F, '$1 == "lookup" && $3 == "off" { print $7 }' "$dir/sp-acl.csv")
[ -n "$sp_lookups" ] || { echo "error: no lookup row in $dir/sp-acl.csv" >&2; exit 1; }

echo "== testpmd replaying $replay packets from memory, one forwarding core"
declare -A pmd_rate
for mode in io 5tswap; do
  timeout $((seconds + 8)) dpdk-testpmd "${eal[@]}" -l 0,1 \
    --vdev "net_pcap0,rx_pcap=$dir/replay.pcap,infinite_rx=1" -- --forward-mode="$mode" \
    --port-topology=loop --nb-cores=1 --total-num-mbufs=$((replay + 65536)) --stats-period=1 -a \
    > "$dir/testpmd-$mode.out" 2>&1 || true
  # The first samples load the trace and warm up; the last may be cut short.
  pmd_rate[$mode]=$(awk '/Rx-pps:/ { print $2 / 1e6 }' "$dir/testpmd-$mode.out" | tail -n +6 \
    | head -n "$seconds" | median) \
    || { echo "error: testpmd ($mode) reported no rate:" >&2; tail -20 "$dir/testpmd-$mode.out" >&2; exit 1; }
  echo "testpmd $mode: ${pmd_rate[$mode]} Mpps"
done

echo "== Stateplane replaying the same $replay packets, one core"
$sp bench --trace "$dir/replay.pcap" --programs forward,conntrack --repeat "$rounds" \
  --csv "$dir/sp-bench.csv" | tail -3
sp_rate() { awk -F, -v p="$1" '$1 == p { print $5 }' "$dir/sp-bench.csv"; }
forward=$(sp_rate forward)
conntrack=$(sp_rate conntrack)
[ -n "$forward" ] && [ -n "$conntrack" ] || { echo "error: no forward or conntrack row in $dir/sp-bench.csv" >&2; exit 1; }

{
  echo "experiment,system,configuration,rate_millions_per_s"
  echo "classification,dpdk-acl,default (vector) code,${acl_rate[default]}"
  echo "classification,dpdk-acl,scalar code,${acl_rate[scalar]}"
  echo "classification,stateplane,classifier (cache off),$sp_lookups"
  echo "forwarding,dpdk-testpmd,io,${pmd_rate[io]}"
  echo "forwarding,dpdk-testpmd,5tswap,${pmd_rate[5tswap]}"
  echo "forwarding,stateplane,forward,$forward"
  echo "forwarding,stateplane,conntrack,$conntrack"
} > "$out"
echo
echo "== one core each; classification: $((acl + 1)) rules, $keys keys (M lookups/s); forwarding: Mpps"
column -s, -t < "$out"
awk -v s="$sp_lookups" -v d="${acl_rate[default]}" -v c="${acl_rate[scalar]}" -v f="$forward" -v io="${pmd_rate[io]}" \
  'BEGIN { printf "classifier / DPDK ACL: %.2fx (%.2fx of its scalar code); forward / testpmd io: %.2fx\n", s / d, s / c, f / io }'
$sp chart --from "$out" --svg "${out%.csv}.svg" --unit "M/s" \
  --title "Stateplane and DPDK on one core" --subtitle "$((acl + 1)) ACL rules over $keys keys; $replay packets replayed"
echo "(CSV: $out; chart: ${out%.csv}.svg)"
