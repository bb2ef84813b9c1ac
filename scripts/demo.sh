#!/usr/bin/env bash
# The main job on embedded defaults: build, generate a sample trace, run it through the
# `forward`, `l2` and `pipeline` programs, and print what happened (output files go to ./out/); then,
# as root, switch real traffic live: a lab of two hosts and a stateplane switch in network
# namespaces on this machine, with ping and an iperf3 TCP transfer through the switch.
set -euo pipefail
cd "$(dirname "$0")/.."
live=0
[ "$(id -u)" -eq 0 ] && live=1
if [ $live -eq 1 ]; then
  bash scripts/setup.sh ip:iproute2 ethtool ping:iputils-ping iperf3 sysctl:procps kill:procps
else
  bash scripts/setup.sh
fi
export PATH="$HOME/.cargo/bin:$PATH"
echo "== building stateplane (release; a first build takes a few minutes)"
cargo build --release
sp=target/release/stateplane
mkdir -p out

# What ran, where its files are, and what to try next: the demo's last words.
summary() {
  local made=()
  for f in out/sample.pcap out/forwarded.pcap out/l2-to-clients.pcap out/l2-to-servers.pcap \
    out/pipeline-to-clients.pcap out/pipeline-to-servers.pcap out/chain-out.pcap out/chain-flows.csv \
    out/forward.summary.json out/l2.summary.json out/pipeline.summary.json out/chain.summary.json out/report.html; do
    [ -e "$f" ] && made+=("$f")
  done
  echo
  echo "== done: the sample trace through forward, l2, pipeline and chain$1"
  echo "   its outputs in out/ ($(du -ch "${made[@]}" | tail -1 | cut -f1) in all):"
  for f in "${made[@]}"; do
    printf '     %-30s %s\n' "$f" "$(du -h "$f" | cut -f1)"
  done
  echo "   look at them in one page: open out/report.html in a browser"
  echo "   the commands in README.md and docs/ call it stateplane; put it on your PATH:"
  echo "         export PATH=\"$PWD/target/release:\$PATH\""
  echo "   next: stateplane flows -i out/sample.pcap --csv out/flows.csv   (flow records)"
  echo "         stateplane run conntrack -i out/sample.pcap               (a stateful program)"
  echo "         stateplane bench                                          (Mpps per core, from memory)"
  echo "         docs/cli.md has every command; docs/lab.md the lab"
}
echo "== generating a sample trace (internet workload, 1,000,000 packets, seed 1)"
$sp gen internet --packets 1000000 --seed 1 -o out/sample.pcap
echo
echo "== forward: every packet from port in0 to port out (out/forwarded.pcap)"
$sp run forward --workers 2 -i out/sample.pcap -o out/forwarded.pcap --summary-file out/forward.summary.json
echo
echo "== l2: switching by a static MAC table (examples/l2.toml)"
$sp run --config examples/l2.toml --summary-file out/l2.summary.json
echo
echo "== pipeline: an ACL then a routing table, OpenFlow style, with its microflow cache (examples/pipeline.toml)"
$sp run --config examples/pipeline.toml --summary-file out/pipeline.summary.json
echo
echo "== chain: acl, then nat, then router, with flow records (examples/chain.toml, out/chain-flows.csv)"
$sp run --config examples/chain.toml --summary-file out/chain.summary.json
echo
echo "== report: the runs' summaries and the flow records in one page (out/report.html)"
$sp report out -o out/report.html
echo
if [ $live -eq 0 ]; then
  echo "== live lab: not run, because it creates network namespaces and needs root (run ./scripts/demo.sh as root)"
  summary ""
  exit 0
fi
lab=topologies/line.toml
echo "== live: lab 'line' (h1 - s1 - h2 in network namespaces; s1 runs stateplane forward)"
$sp lab down $lab >/dev/null 2>&1 || true
trap '$sp lab down $lab >/dev/null 2>&1 || true' EXIT
$sp lab up $lab
echo
echo "-- ping h1 -> h2 through s1"
$sp lab exec $lab h1 ping -c 3 -i 0.2 198.18.0.2
echo
echo "-- iperf3 TCP h1 -> h2 through s1, 3 seconds"
$sp lab exec $lab h2 iperf3 -s -1 -D -B 198.18.0.2
sleep 0.3
$sp lab exec $lab h1 timeout 30 iperf3 -c 198.18.0.2 -t 3 | tail -4
echo
echo "-- s1's control API (stateplane ctl, on s1's socket in its run directory): what it declares, its counters"
$sp lab exec $lab s1 $sp ctl describe
# sed reads all of it: `head` would close the pipe early, and under pipefail the writer's
# SIGPIPE would end the demo.
$sp lab exec $lab s1 $sp ctl stats | sed -n 1,4p
echo
echo "-- s1 stops (SIGTERM: drains its queues, reports) and the lab is removed"
pid=$(cat /run/stateplane/lab/line/s1.pid)
kill -TERM "$pid"
for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
sed -n '/stateplane run/,$p' /run/stateplane/lab/line/s1.log
$sp lab down $lab
summary ", then live traffic through a switch in a lab (ping, iperf3, its control API)"
