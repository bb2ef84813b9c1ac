#!/usr/bin/env bash
# The whole test suite: formatting, lints, every unit, property and integration test
# (tcpdump, tshark, redis-server and Linux's conntrack through iptables are real peers
# here; the lab tests make network namespaces and send real traffic with ping, iperf3 and
# python3 through stateplane switches, so they need root), a soak of a live switch under floods (scripts/soak.sh), a memory check of the
# unsafe blocks under valgrind, and a short run of every fuzz target (scripts/fuzz.sh).
# Fails loudly on the first problem.
set -euo pipefail
cd "$(dirname "$0")/.."

# Each step's time, printed as the next begins and together at the end: what CI's 90
# minutes go to.
timings=()
step_name="set-up (packages)"
step_start=$SECONDS
step() {
  timings+=("$(printf '%6d s  %s' $((SECONDS - step_start)) "$step_name")")
  step_name=$1
  step_start=$SECONDS
  [ -z "$1" ] || echo "== $1"
}

bash scripts/setup.sh tshark nfcapd:nfdump tcpdump promtool:prometheus chromium-headless-shell valgrind ip:iproute2 ethtool ping:iputils-ping iperf3 python3 iptables \
  sysctl:procps kill:procps pgrep:procps setpriv:util-linux getconf:libc-bin redis-server redis-cli:redis-tools b3sum go:golang-go
[ "$(id -u)" -eq 0 ] || { echo "error: the lab tests create network namespaces: run as root" >&2; exit 1; }
export PATH="$HOME/.cargo/bin:$PATH"
# Every step builds with the suite's profile (Cargo.toml: release without link-time
# optimization, which took more than half the time of compiling from nothing), into
# target/suite, so that one build serves them all.
export STATEPLANE_PROFILE=suite
# rustfmt and clippy, the suite's first two steps: added through rustup when missing.
components=()
cargo fmt --version >/dev/null 2>&1 || components+=(rustfmt)
cargo clippy --version >/dev/null 2>&1 || components+=(clippy)
if [ ${#components[@]} -gt 0 ]; then
  command -v rustup >/dev/null || { echo "error: ${components[*]} missing, and no rustup to add them: install them for your Rust toolchain" >&2; exit 1; }
  echo "installing: ${components[*]} (rustup component add)"
  rustup component add "${components[@]}"
fi

step "cargo fmt --check"
cargo fmt --all -- --check
step "cargo clippy -D warnings"
cargo clippy --profile suite --workspace --all-targets --quiet -- -D warnings
step "cargo test (suite profile)"
mkdir -p target
# What the tests make in the temporary folder, they remove (checked after them). The
# workspace includes examples/tollbooth, a program of one's own in a crate of its own:
# formatted, linted and tested with the rest.
scratch="${TMPDIR:-/tmp}"
scratch_of_tests() { ls -d "$scratch"/stateplane-* "$scratch"/tollbooth-* "$scratch"/.tmp* 2>/dev/null | sort || true; }
scratch_before=$(scratch_of_tests)
# As it goes: each crate of the project as it compiles, each test binary as it starts and
# its result; the whole log in target/test.log.
set +e
cargo test --profile suite --workspace 2>&1 | tee target/test.log \
  | grep --line-buffered -E '^ *(Compiling stateplane|Running )|^test result' | sed -u -E 's/^ +//'
rc=${PIPESTATUS[0]}
set -e
grep -E 'FAILED|panicked' target/test.log || true
echo "the slowest test binaries (seconds running, building not counted):"
awk '/^ *Running /{name=$NF; sub(".*/", "", name); sub("-[0-9a-f]+[)]$", "", name)}
  /test result:/{for(i=1;i<NF;i++) if($i=="in"){t=$(i+1); sub("s$","",t); print "  " t, name}}' \
  target/test.log | sort -rn | head -6 || true
if [ $rc -ne 0 ] || ! grep -q 'test result: ok' target/test.log; then
  tail -60 target/test.log >&2
  echo "cargo test failed (exit $rc): the whole log is target/test.log" >&2
  exit 1
fi
left=$(comm -13 <(echo "$scratch_before") <(scratch_of_tests))
if [ -n "$left" ]; then
  echo "error: the tests left these behind in $scratch (each test removes what it makes):" >&2
  echo "$left" >&2
  exit 1
fi
echo "nothing left behind in $scratch"
step "stateplane flows against real collectors (nfcapd/nfdump, tshark)"
bash scripts/test-flows-collectors.sh
step "soak: a live conntrack switch under floods for ${SOAK_SECONDS:-60} s, its memory flat (scripts/soak.sh)"
bash scripts/soak.sh "${SOAK_SECONDS:-60}"
step "valgrind memcheck of the unsafe blocks (huge-page buffer; pages populated ahead; live ports: rings, UMEM, BPF; TCP send queue and abort; sock_diag reads; prefetch in tables and the cache; the counting allocator)"
# A test binary of the suite's build: the first whose path matches PATTERN among those
# `cargo test ARGS --no-run` builds (the run stops here when there is none).
test_binary() {
  local pattern=$1 bin
  shift
  bin=$(cargo test --profile suite "$@" --no-run --message-format=json 2>/dev/null \
    | grep -o "\"executable\":\"[^\"]*$pattern[^\"]*\"" | head -1 | cut -d'"' -f4)
  [ -n "$bin" ] || { echo "could not find the test binary of: cargo test $*" >&2; return 1; }
  echo "$bin"
}
bin=$(test_binary stateplane_io -p stateplane-io --lib)
valgrind --quiet --error-exitcode=1 "$bin" hugemem --test-threads=1 2>&1 | tail -3
valgrind --quiet --error-exitcode=1 "$bin" live:: --test-threads=1 2>&1 | tail -3
valgrind --quiet --error-exitcode=1 "$bin" receive_queue --test-threads=1 2>&1 | tail -3
# The prefetch hint (stateplane-mem's) as the exact table and the microflow cache use it.
bin=$(test_binary stateplane_state -p stateplane-state --lib)
valgrind --quiet --error-exitcode=1 "$bin" burst --test-threads=1 2>&1 | tail -3
bin=$(test_binary stateplane_classifier -p stateplane-classifier --lib)
valgrind --quiet --error-exitcode=1 "$bin" cache:: --test-threads=1 2>&1 | tail -3
# Pages populated ahead of a synced table's writes (stateplane-mem's madvise).
bin=$(test_binary stateplane_mem -p stateplane-mem --lib)
valgrind --quiet --error-exitcode=1 "$bin" populate_keeps --test-threads=1 2>&1 | tail -3
# The counting allocator the memory-budget tests measure structures with.
bin=$(test_binary /counting- -p stateplane-mem --test counting)
valgrind --quiet --error-exitcode=1 "$bin" --test-threads=1 2>&1 | tail -3
step "fuzz: every target ${FUZZ_SECONDS:-10} s under libFuzzer (its corpus and past crashes ran on stable above)"
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  bash scripts/fuzz.sh "${FUZZ_SECONDS:-10}"
else
  echo "NOTE: no nightly toolchain on this machine, so libFuzzer cannot run here; every" \
    "target's corpus and past crashes ran through the same bodies on stable (stateplane-fuzz)"
fi
step ""
echo "== time by step"
printf '%s\n' "${timings[@]}"
passed=$(grep -oE 'test result: ok\. [0-9]+ passed' target/test.log | awk '{s+=$4} END {print s}')
echo "all tests: ${passed} passed, 0 failed"
