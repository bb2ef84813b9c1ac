#!/usr/bin/env bash
# The same rules and trace through Open vSwitch with its DPDK userspace datapath and through
# Stateplane's `pipeline` program, one core each, in one run; prints both rates and the
# ratio, and writes them as CSV (OUT, default out/compare-ovs.csv).
#
# Rules: an ACL of ACL_RULES (500) ClassBench-like 5-tuple rules in table 0 and a FIB of
# FIB_PREFIXES (500) generated prefixes plus the trace's /24s in table 1, written once as
# rule text both switches read (`stateplane bench-pipeline --write-rules --ovs-compatible`:
# ports exact and only under TCP or UDP, as OVS requires). Trace: PACKETS (200,000; DPDK's
# net_pcap holds the whole trace in its packet buffers, which caps it) 64-byte packets of
# the `internet` workload, replayed from memory over and over: OVS through net_pcap
# (infinite_rx), Stateplane by `bench-pipeline --trace --loops 20` (caches kept warm
# across loops, as OVS's are).
#
# OVS runs in a network namespace of its own (its bridge port is created there), with
# --no-pci so DPDK touches no device of the machine, its PMD thread on core 1; its rate is
# the input port's received packets over SECONDS (10) after a warm-up. Needs root (huge
# pages, the namespace); installs openvswitch-switch-dpdk from Debian when missing, and
# puts everything back (processes, namespace, huge pages) on exit.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" -eq 0 ] || { echo "error: run as root (huge pages for DPDK, a network namespace)" >&2; exit 1; }
vswitchd=/usr/lib/openvswitch-switch-dpdk/ovs-vswitchd-dpdk
if [ ! -x "$vswitchd" ]; then
  echo "installing openvswitch-switch-dpdk"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openvswitch-switch-dpdk >/dev/null
fi
[ -x "$vswitchd" ] || { echo "error: $vswitchd is missing after installing openvswitch-switch-dpdk" >&2; exit 1; }
bash scripts/setup.sh ip:iproute2
source scripts/dpdk-env.sh

packets=${PACKETS:-200000}
acl=${ACL_RULES:-500}
fib=${FIB_PREFIXES:-500}
seconds=${SECONDS_MEASURED:-10}
out=${OUT:-out/compare-ovs.csv}
mkdir -p "$(dirname "$out")"
dir=$(mktemp -d /tmp/sp-ovs.XXXXXX)
ns=sp-ovs-$$

cleanup() {
  for pid in "$dir/ovs-vswitchd.pid" "$dir/ovsdb-server.pid"; do
    [ -f "$pid" ] && kill "$(cat "$pid")" 2>/dev/null || true
  done
  sleep 1
  ip netns del "$ns" 2>/dev/null || true
  huge_pages_restore
  rm -rf "$dir"
}
trap cleanup EXIT

echo "== trace and rules"
$sp gen internet --packets "$packets" --packet-size 64 --ipv6-share 0 --seed 1 -o "$dir/trace.pcap" | tail -1
$sp bench-pipeline --write-rules "$dir/rules.txt" --ovs-compatible --acl-rules "$acl" --fib-prefixes "$fib"
echo "$(wc -l < "$dir/rules.txt") rules in 2 tables"

echo "== Open vSwitch (DPDK userspace datapath, one PMD core)"
huge_pages 512
ip netns add "$ns"
in_ns() { ip netns exec "$ns" env OVS_RUNDIR="$dir" OVS_DBDIR="$dir" OVS_LOGDIR="$dir" "$@"; }
vsctl() { in_ns ovs-vsctl --db="unix:$dir/db.sock" "$@"; }
ovsdb-tool create "$dir/conf.db" /usr/share/openvswitch/vswitch.ovsschema
in_ns ovsdb-server --remote="punix:$dir/db.sock" --pidfile="$dir/ovsdb-server.pid" \
  --detach -vconsole:off --log-file="$dir/ovsdb.log" "$dir/conf.db"
vsctl --no-wait init
vsctl --no-wait set Open_vSwitch . other_config:dpdk-init=true other_config:dpdk-socket-mem=512 \
  other_config:dpdk-lcore-mask=0x1 other_config:pmd-cpu-mask=0x2 other_config:dpdk-extra="--no-pci"
in_ns "$vswitchd" "unix:$dir/db.sock" --pidfile="$dir/ovs-vswitchd.pid" --unixctl="$dir/vswitchd.ctl" --detach \
  -vconsole:off --log-file="$dir/vswitchd.log"
vsctl add-br br0 -- set bridge br0 datapath_type=netdev fail-mode=secure
# Port numbers as the rules name them: outputs 1 and 2; the input, which no rule names, 3.
for p in 1 2; do
  vsctl add-port br0 "out$p" -- set Interface "out$p" type=dpdk \
    options:dpdk-devargs="net_pcap$p,tx_pcap=/dev/null" ofport_request=$p
done
in_ns ovs-ofctl -O OpenFlow13 add-flows br0 "$dir/rules.txt"
vsctl add-port br0 in0 -- set Interface in0 type=dpdk \
  options:dpdk-devargs="net_pcap0,rx_pcap=$dir/trace.pcap,infinite_rx=1" ofport_request=3
stat() { vsctl get Interface "$1" "statistics:$2"; }
# OVS's rate: the input port's received packets over $seconds (its PMD takes packets only
# as fast as it forwards them), after a warm-up that loads the trace and fills the caches.
measure_ovs() {
  sleep 5
  in_ns ovs-appctl -t "$dir/vswitchd.ctl" dpif-netdev/pmd-stats-clear >/dev/null
  local rx0 rx1 t0 t1 tx
  rx0=$(stat in0 rx_packets); t0=$(date +%s.%N)
  sleep "$seconds"
  rx1=$(stat in0 rx_packets); t1=$(date +%s.%N)
  tx=$(( $(stat out1 tx_packets) + $(stat out2 tx_packets) ))
  [ "$rx1" -gt "$rx0" ] || { echo "error: OVS received nothing (see $dir/vswitchd.log)" >&2; tail -20 "$dir/vswitchd.log" >&2; exit 1; }
  ovs_mpps=$(awk -v a="$rx0" -v b="$rx1" -v s="$t0" -v e="$t1" 'BEGIN { printf "%.3f", (b - a) / (e - s) / 1e6 }')
  ovs_fwd=$(awk -v t="$tx" -v r="$rx1" 'BEGIN { printf "%.4f", t / r }')
  echo "OVS: $ovs_mpps Mpps, forwarded share $ovs_fwd; its PMD's cache statistics:"
  in_ns ovs-appctl -t "$dir/vswitchd.ctl" dpif-netdev/pmd-stats-show \
    | grep -E "packets received|hits|lookups|upcall|per packet" || true
}
measure_ovs
ovs_default=$ovs_mpps
echo "-- with its signature match cache (smc-enable=true) as well"
vsctl set Open_vSwitch . other_config:smc-enable=true
measure_ovs
ovs_smc=$ovs_mpps
kill "$(cat "$dir/ovs-vswitchd.pid")" "$(cat "$dir/ovsdb-server.pid")"
rm -f "$dir/ovs-vswitchd.pid" "$dir/ovsdb-server.pid"

echo "== Stateplane (pipeline program, one core, same rules and trace)"
$sp bench-pipeline --trace "$dir/trace.pcap" --rules-file "$dir/rules.txt" --modes action \
  --update-rates 0 --loops 20 --repeat 3 --csv "$dir/sp.csv" | tee "$dir/sp.txt"
sp_off=$(awk -F, '$1 == "speedup" && $3 == "off" { print $7 }' "$dir/sp.csv")
sp_action=$(awk -F, '$1 == "speedup" && $3 == "action" { print $7 }' "$dir/sp.csv")
sp_fwd=$(awk -F, '$1 == "speedup" && $3 == "action" { print $10 }' "$dir/sp.csv")
{
  echo "switch,configuration,mpps,forwarded_share"
  echo "ovs-dpdk,default caches (EMC + megaflow),$ovs_default,$ovs_fwd"
  echo "ovs-dpdk,EMC + SMC + megaflow,$ovs_smc,$ovs_fwd"
  echo "stateplane,pipeline cache=off,$sp_off,$sp_fwd"
  echo "stateplane,pipeline cache=action,$sp_action,$sp_fwd"
} > "$out"
echo
echo "== $packets packets, $(wc -l < "$dir/rules.txt") rules; one core each"
column -s, -t < "$out"
awk -v a="$sp_action" -v o="$ovs_default" -v m="$ovs_smc" \
  'BEGIN { printf "Stateplane (action cache) / OVS-DPDK: %.2fx (%.2fx against OVS with SMC on)\n", a / o, a / m }'
echo "(CSV: $out)"
