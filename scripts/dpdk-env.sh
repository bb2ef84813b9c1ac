# Sourced by the scripts that run DPDK beside Stateplane (compare-ovs.sh, compare-dpdk.sh):
# builds Stateplane (`$sp`), and lends DPDK 2 MiB huge pages, giving back what was there
# before (`huge_pages N`, then `huge_pages_restore` on exit).
[ "$(id -u)" -eq 0 ] || { echo "error: run as root (huge pages for DPDK)" >&2; exit 1; }
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --quiet
sp=$PWD/target/release/stateplane

hugepages=/sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages
pages_before=$(cat $hugepages)
huge_pages() {
  echo "$1" > $hugepages
  mountpoint -q /dev/hugepages || { mkdir -p /dev/hugepages; mount -t hugetlbfs nodev /dev/hugepages; }
}
huge_pages_restore() {
  echo "$pages_before" > $hugepages
}
