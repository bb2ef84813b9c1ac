#!/usr/bin/env bash
# Two builds (or any two programs) alternated on the same arguments, ROUNDS times each,
# so that a shared, noisy machine's slow spells fall on both alike: prints each one's
# median wall and CPU time (user + system, from time(1)) and every wall time.
#   cp target/release/stateplane /tmp/sp-before   # ... change, rebuild ...
#   scripts/alternate-builds.sh 9 /tmp/sp-before target/release/stateplane -- \
#     flows -i trace.pcap --ipfix-file out.ipfix --workers 2
set -euo pipefail
usage() { echo "usage: $0 ROUNDS PROGRAM_A PROGRAM_B -- ARGS..." >&2; exit 2; }
[ $# -ge 4 ] && [ "$4" = "--" ] || usage
rounds=$1 progs=("$2" "$3")
shift 4
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || usage
times=$(mktemp -d /tmp/alternate.XXXXXX)
trap 'rm -rf "$times"' EXIT
for r in $(seq "$rounds"); do
  for i in 0 1; do
    /usr/bin/time -o "$times/t" -f "%e %U %S" "${progs[$i]}" "$@" >/dev/null 2>&1 \
      || { echo "error: ${progs[$i]} failed (round $r)" >&2; exit 1; }
    tail -1 "$times/t" >>"$times/$i"
  done
  printf "\r  round %d of %d" "$r" "$rounds" >&2
done
echo >&2
for i in 0 1; do
  python3 - "${progs[$i]}" "$times/$i" <<'PY'
import statistics, sys
rows = [l.split() for l in open(sys.argv[2])]
wall = [float(r[0]) for r in rows]
cpu = [float(r[1]) + float(r[2]) for r in rows]
print(f"{sys.argv[1]}: wall median {statistics.median(wall):.3f} s, CPU median "
      f"{statistics.median(cpu):.3f} s; all {' '.join(f'{w:.2f}' for w in wall)}")
PY
done
