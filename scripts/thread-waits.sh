#!/usr/bin/env bash
# Where a run's threads wait, from the scheduler's switches: runs COMMAND under
# `perf record -e sched:sched_switch -a` and prints, for each thread of COMMAND and of any
# process named in WATCH (e.g. WATCH=nfcapd), how long it was switched out asleep (waiting
# for something: a channel, a lock, I/O) and how long runnable but kept off the CPU by
# other threads (the cores were full).
#   WATCH=nfcapd scripts/thread-waits.sh target/release/stateplane flows -i trace.pcap \
#     --ipfix 127.0.0.1:PORT --ipfix-rate 0 --workers 2
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: [WATCH=NAME] $0 COMMAND [ARGS...]" >&2; exit 2; }
command -v perf >/dev/null || { echo "error: perf is not installed (linux-perf)" >&2; exit 1; }
data=$(mktemp /tmp/thread-waits.XXXXXX)
trap 'rm -f "$data"' EXIT
perf record -q -e sched:sched_switch -a -o "$data" -- "$@" >/dev/null 2>&1 \
  || { echo "error: perf record of '$*' failed" >&2; exit 1; }
count=$(cat <<'PY'
import collections, re, sys
names = (sys.argv[1],) + tuple(n for n in sys.argv[2].split(",") if n)
# A thread switched out at t with state S or D (asleep) or R (preempted) waits until it is
# switched in again.
out, waited = {}, collections.defaultdict(collections.Counter)
switch = re.compile(r"\s*\d+\s+([\d.]+):\s+prev_comm=(\S+) prev_pid=(\d+) .*prev_state=(\S+)"
                    r" ==> next_comm=(\S+) next_pid=(\d+)")
for line in sys.stdin:
    m = switch.match(line)
    if not m:
        continue
    t, prev, state, nxt = float(m[1]), f"{m[2]}/{m[3]}", m[4][0], f"{m[5]}/{m[6]}"
    out[prev] = (t, state)
    if nxt in out:
        t0, s0 = out.pop(nxt)
        waited[nxt]["asleep" if s0 in "SD" else "off-CPU"] += t - t0
print(f"{'thread':<24}{'asleep ms':>10}{'runnable, off-CPU ms':>22}")
for k in sorted(waited):
    if k.startswith(names):
        w = waited[k]
        print(f"{k:<24}{w['asleep'] * 1e3:>10.0f}{w['off-CPU'] * 1e3:>22.0f}")
PY
)
perf script -i "$data" -F tid,time,trace 2>/dev/null \
  | python3 -c "$count" "$(basename "$1" | cut -c1-15)" "${WATCH:-},exporter"
