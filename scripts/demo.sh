#!/usr/bin/env bash
# The main job on embedded defaults: build, generate a sample trace, run it through the
# `forward` and `l2` programs, and print what happened. Output files go to ./out/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --quiet
sp=target/release/stateplane
mkdir -p out
echo "== generating a sample trace (internet workload, 1,000,000 packets, seed 1)"
$sp gen internet --packets 1000000 --seed 1 -o out/sample.pcap
echo
echo "== forward: every packet from port in0 to port out (out/forwarded.pcap)"
$sp run forward --workers 2 -i out/sample.pcap -o out/forwarded.pcap
echo
echo "== l2: switching by a static MAC table (examples/l2.toml)"
$sp run --config examples/l2.toml
