#!/usr/bin/env bash
# Runs every fuzz target (or those named) under libFuzzer for SECONDS each, starting from
# its checked-in corpus (fuzz/corpus/TARGET, read only; what it finds goes to
# target/fuzz-corpus/TARGET), and prints a table of executions and findings per target,
# also written to target/fuzz-stats.csv. A crash fails the run and names the input
# (fuzz/artifacts/TARGET/...): copy it into fuzz/regressions/TARGET/ and it is tested on
# every run of the test suite from then on.
#
#   scripts/fuzz.sh 10              # the test suite's short run
#   scripts/fuzz.sh 3600 ipfix      # the long mode: an hour on one target
#
# Targets run side by side, as many at once as there are cores (FUZZ_JOBS to change it):
# each libFuzzer process takes one core.
#
# Needs a nightly toolchain and cargo-fuzz (installed here when missing).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-10}
shift || true
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked --quiet
targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cargo +nightly fuzz list)
# No sanitizer: the decoders hold no unsafe code (what there is, valgrind checks in the
# test script), and without one a target runs several times faster; debug assertions
# (overflow checks) stay on. No link-time optimization: each target links the whole
# program, and LTO made the build take minutes more for little speed in a fuzz run.
export CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16
cargo +nightly fuzz build --features libfuzzer --sanitizer none
csv=target/fuzz-stats.csv
bins=target/x86_64-unknown-linux-gnu/release
jobs=${FUZZ_JOBS:-$(nproc)}
results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT

# One target's run: its row of the table (and the CSV) in $results/TARGET.
fuzz_one() {
  local t=$1 work="target/fuzz-corpus/$1" log="target/fuzz-$1.log" before runs found crashes
  mkdir -p "$work" "fuzz/artifacts/$t"
  before=$(ls "fuzz/corpus/$t" | wc -l)
  if "$bins/$t" "$work" "fuzz/corpus/$t" -artifact_prefix="fuzz/artifacts/$t/" \
      -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 >"$log" 2>&1; then
    crashes=0
  else
    crashes=1
  fi
  runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | awk '{print $2}' | tail -1)
  found=$(ls "$work" | wc -l)
  echo "$t,$seconds,${runs:-},$before,$found,$crashes" > "$results/$t"
}

for t in "${targets[@]}"; do
  [ -x "$bins/$t" ] || { echo "fuzz target $t was not built ($bins/$t)" >&2; exit 1; }
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  fuzz_one "$t" &
done
wait

# seeds: the checked-in corpus; corpus: what the run's own corpus holds after it.
echo "target,seconds,executions,seeds,corpus,crashes" > "$csv"
printf '%-18s %8s %12s %10s %10s %8s\n' target seconds executions seeds corpus crashes
status=0
for t in "${targets[@]}"; do
  [ -s "$results/$t" ] || { echo "fuzz target $t did not report" >&2; status=1; continue; }
  IFS=, read -r _ _ runs before found crashes < "$results/$t"
  printf '%-18s %8s %12s %10s %10s %8s\n' "$t" "$seconds" "${runs:-?}" "$before" "$found" "$crashes"
  cat "$results/$t" >> "$csv"
  if [ "$crashes" -ne 0 ]; then
    status=1
    echo "fuzz target $t failed: see target/fuzz-$t.log; the input is in fuzz/artifacts/$t/ (copy it into fuzz/regressions/$t/)" >&2
    grep -E 'panicked|ERROR|SUMMARY|Test unit written' "target/fuzz-$t.log" | head -8 >&2 || true
  fi
done
exit $status
