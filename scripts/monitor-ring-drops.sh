#!/usr/bin/env bash
# How much a passive monitor's capture ring carries while the monitor is off the CPU: in
# a lab of two hosts and a switch (topologies/line.toml), `stateplane flows -I eth0
# --capture-buffer SIZE` watches h2 and is stopped (SIGSTOP) while h1 sends h2 8 MiB over
# TCP, then resumed and interrupted; prints what its ring received and what the kernel
# dropped, for each SIZE (default: 1M and 64M, the default).
# Needs root (network namespaces, AF_PACKET).
#   scripts/monitor-ring-drops.sh [SIZE...]
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "error: run as root (network namespaces, AF_PACKET)" >&2; exit 1; }
bash scripts/setup.sh ip:iproute2 pgrep:procps python3 >/dev/null
bin=target/release/stateplane
# Always: a binary left from before a change would run in its place (a no-op when
# it is up to date).
cargo build --release --quiet
sizes=("$@")
[ ${#sizes[@]} -gt 0 ] || sizes=(1M 64M)
work=$(mktemp -d /tmp/monitor-ring-drops.XXXXXX)
sed 's/^name = "line"/name = "ringdrops"/' topologies/line.toml >"$work/line.toml"
cleanup() { "$bin" lab down "$work/line.toml" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
"$bin" lab up "$work/line.toml" >"$work/lab.log" 2>&1 || { cat "$work/lab.log" >&2; exit 1; }
printf '%-8s %12s %12s %12s\n' size received dropped "dropped %"
for size in "${sizes[@]}"; do
  ip netns exec sp-ringdrops-h2 timeout 60 "$bin" flows -I eth0 --capture-buffer "$size" \
    --summary-json --csv "$work/records.csv" >"$work/summary.json" 2>"$work/monitor.log" &
  monitor=$!
  sleep 1.5
  run=$(pgrep -P "$monitor") || { cat "$work/monitor.log" >&2; exit 1; }
  kill -STOP "$run"
  ip netns exec sp-ringdrops-h2 timeout 30 python3 -c '
import socket
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("198.18.0.2", 5399)); s.listen(1); c, _ = s.accept()
while c.recv(65536): pass' &
  server=$!
  sleep 0.3
  ip netns exec sp-ringdrops-h1 timeout 30 python3 -c '
import socket
c = socket.create_connection(("198.18.0.2", 5399)); c.sendall(bytes(8 << 20)); c.close()'
  wait "$server"
  sleep 0.2
  kill -CONT "$run"
  sleep 0.5
  kill -INT "$run"
  wait "$monitor" || { cat "$work/monitor.log" >&2; exit 1; }
  python3 -c '
import json, sys
c = json.load(open(sys.argv[1]))["port_counters"]["eth0"]
got, lost = c["rx_packets"], c["rx_kernel_drops"]
print(f"{sys.argv[2]:<8} {got:>12} {lost:>12} {100 * lost / max(got + lost, 1):>11.1f}%")' \
    "$work/summary.json" "$size"
done
