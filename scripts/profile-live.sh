#!/usr/bin/env bash
# Where a live switch's time goes: in a lab of two hosts and a switch (topologies/line.toml)
# running `forward` over IO (afpacket or afxdp; default afpacket), h1 sends h2 a WORKLOAD
# for 6 s: one TCP transfer with iperf3 (tcp, the default), or a flood of 64-byte UDP
# frames, 1000 flows, by `stateplane send` (flood); meanwhile `perf record -g` samples the
# switch process for 3 s and the whole machine for 1 s. Prints the workload's rate, the
# switch's share in the kernel and in its own code, its top call-graph entries, and the
# machine's time by process. Needs root (network namespaces, AF_PACKET) and perf.
#   scripts/profile-live.sh [afpacket|afxdp] [tcp|flood]
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "error: run as root (network namespaces, AF_PACKET)" >&2; exit 1; }
io=${1:-afpacket}
workload=${2:-tcp}
case "$io" in afpacket|afxdp) ;; *) echo "error: IO is afpacket or afxdp, not '$io'" >&2; exit 1 ;; esac
case "$workload" in tcp|flood) ;; *) echo "error: WORKLOAD is tcp or flood, not '$workload'" >&2; exit 1 ;; esac
bash scripts/setup.sh ip:iproute2 iperf3 perf:linux-perf >/dev/null
bin=target/release/stateplane
# Always: a binary left from before a change would run in its place.
cargo build --release --quiet
work=$(mktemp -d /tmp/profile-live.XXXXXX)
sed -e 's/^name = "line"/name = "liveprof"/' -e "s/^workers = 1$/workers = 1\nio = \"$io\"/" \
  topologies/line.toml >"$work/line.toml"
cleanup() { "$bin" lab down "$work/line.toml" >/dev/null 2>&1 || true; rm -rf "$work"; }
trap cleanup EXIT
"$bin" lab up "$work/line.toml" >"$work/lab.log" 2>&1 || { cat "$work/lab.log" >&2; exit 1; }
pid=$(cat "${STATEPLANE_LAB_DIR:-/run/stateplane/lab}/liveprof/s1.pid")
h2_rx() { ip netns exec sp-liveprof-h2 cat /sys/class/net/eth0/statistics/rx_packets; }
if [ "$workload" = tcp ]; then
  ip netns exec sp-liveprof-h2 iperf3 -s -1 -D -B 198.18.0.2
  sleep 0.3
  ip netns exec sp-liveprof-h1 timeout 30 iperf3 -c 198.18.0.2 -t 6 -J >"$work/out.json" &
else
  "$bin" gen udpflood --packets 100000 --flows 1000 --seed 7 --packet-size 64 \
    -o "$work/flood.pcap" >/dev/null
  rx0=$(h2_rx)
  ip netns exec sp-liveprof-h1 timeout 30 "$bin" send -I eth0 "$work/flood.pcap" \
    --loops 1000000 --seconds 6 --src-mac 02:00:00:00:01:01 --dst-mac 02:00:00:00:01:02 \
    --json >"$work/out.json" &
fi
client=$!
sleep 1
perf record -q -o "$work/switch.data" -g -p "$pid" -- sleep 3 2>/dev/null
perf record -q -o "$work/machine.data" -a -- sleep 1 2>/dev/null
wait "$client"
if [ "$workload" = tcp ]; then
  python3 -c "import json,sys; e=json.load(open(sys.argv[1]))['end']; print(f\"iperf3 over $io: {e['sum_received']['bits_per_second']/1e9:.2f} Gbit/s, {e['sum_sent']['retransmits']} retransmissions\")" "$work/out.json"
else
  sleep 0.1
  echo "flood over $io: $(( $(h2_rx) - rx0 )) packets delivered to h2 in 6 s; the sender's report: $(cat "$work/out.json")"
fi
# Each report whole into a file first: `head` closing the pipe would end the script.
report() { perf report -i "$work/$1.data" --stdio "${@:2}" 2>/dev/null | grep -E '^ +[0-9]' >"$work/$1.txt" || true; }
report switch --no-children --sort dso
echo "the switch process, by where its samples fall:"
head -4 "$work/switch.txt"
report switch --children --sort sym
echo "the switch process, top entries with their callees (children):"
head -30 "$work/switch.txt"
report machine --no-children --sort comm
echo "the whole machine for 1 s, by process:"
head -5 "$work/machine.txt"
