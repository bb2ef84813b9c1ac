#!/usr/bin/env bash
# Flow export end to end, counted at the collector: stateplane flows (one and two workers,
# pacing by the collector's socket queue; at 28M as to a collector on another host; and
# unpaced) beside softflowd and nfpcapd from Debian, on three traces: realistic sessions
# (frames of 60 to 1,514 bytes, FIN and RST closes, 5% IPv6, VLANs), short (600,000
# packets) and long (5,000,000), and 5,000,000 64-byte packets. Each run sends to a fresh
# `nfcapd -B 33554432` on loopback and lasts until nfcapd has read every datagram; nfdump
# then counts what it wrote. Fails unless every paced stateplane run delivered every record
# it exported and every packet of the trace, with 0 sequence failures and 0 socket drops.
# Prints each run as it ends, then the medians and ratios to softflowd (of the medians,
# and the median of the rounds' own); writes a CSV and a chart (SVG) beside it.
#   ROUNDS=3 OUT=docs/bench/flow-exporters.csv scripts/compare-flow-exporters.sh
# SHORT, LONG and SMALL set the traces' packet counts (0 leaves a trace out).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh softflowd nfcapd:nfdump nfpcapd:nfdump python3 >/dev/null
export PATH="$HOME/.cargo/bin:$PATH"
rounds=${ROUNDS:-3}
out=${OUT:--}
short=${SHORT:-600000}
long=${LONG:-5000000}
small=${SMALL:-5000000}
bin=$PWD/target/release/stateplane
# Always: a binary left from before a change would run in its place (a no-op when it is up
# to date).
cargo build --release --quiet
work=$(mktemp -d /tmp/stateplane-exporters.XXXXXX)
trap 'pkill -f "nfcapd -w $work" 2>/dev/null || true; rm -rf "$work"' EXIT

traces=()
realistic="internet --ipv6-share 0.05 --vlans 4 --seed 1"
if [ "$short" -gt 0 ]; then
  echo "trace realistic-short: stateplane gen $realistic --packets $short"
  "$bin" gen $realistic --packets "$short" -o "$work/short.pcap" >/dev/null 2>&1
  traces+=("realistic-short=$work/short.pcap:$short")
fi
if [ "$long" -gt 0 ]; then
  echo "trace realistic-long: stateplane gen $realistic --packets $long"
  "$bin" gen $realistic --packets "$long" -o "$work/long.pcap" >/dev/null 2>&1
  traces+=("realistic-long=$work/long.pcap:$long")
fi
if [ "$small" -gt 0 ]; then
  echo "trace 64-byte: stateplane gen internet --packets $small --packet-size 64 --ipv6-share 0.2 --seed 1"
  "$bin" gen internet --packets "$small" --packet-size 64 --ipv6-share 0.2 --seed 1 \
    -o "$work/small.pcap" >/dev/null 2>&1
  traces+=("64-byte=$work/small.pcap:$small")
fi
echo "softflowd $(dpkg-query -W -f '${Version}' softflowd), nfdump $(dpkg-query -W -f '${Version}' nfdump), stateplane $(git rev-parse --short HEAD)"
python3 scripts/compare-flow-exporters.py "$bin" "$work" "$rounds" "$out" "${traces[@]}"
