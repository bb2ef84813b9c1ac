#!/usr/bin/env bash
# Where a run's time goes, thread by thread: runs COMMAND under `perf record -F 4000` and
# prints, for each thread, its samples in each 25 ms of the run (100 is a thread busy the
# whole 25 ms), so that a thread waiting, or running alone at the end, shows.
#   scripts/thread-timeline.sh target/release/stateplane flows -i trace.pcap \
#     --ipfix 127.0.0.1:PORT --ipfix-rate 0 --workers 2
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
command -v perf >/dev/null || { echo "error: perf is not installed (linux-perf)" >&2; exit 1; }
data=$(mktemp /tmp/thread-timeline.XXXXXX)
trap 'rm -f "$data"' EXIT
perf record -q -F 4000 -o "$data" -- "$@" >/dev/null 2>&1 \
  || { echo "error: perf record of '$*' failed" >&2; exit 1; }
perf script -i "$data" -F comm,tid,time 2>/dev/null | awk '
  { t = $3 + 0; if (!start) start = t; b = int((t - start) * 40)
    key = $1 "/" $2; n[key, b]++; seen[key] = 1; if (b > last) last = b }
  END { printf "%-22s", "thread \\ 25 ms"; for (i = 0; i <= last; i++) printf " %3d", i; print ""
        for (k in seen) { printf "%-22s", k; for (i = 0; i <= last; i++) printf " %3d", n[k, i] + 0; print "" } }'
